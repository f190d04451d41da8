/**
 * Prefix search over 16 lanes at once: for every lane, the index of its first missing position.
 *
 * `probe(pos)` answers one position for every lane as a u16 mask. The search gallops (1, 2, 4, …),
 * binary-searches every lane in rounds with lanes proposing the same midpoint sharing one probe,
 * verifies the `W` positions below each tentative depth in ascending lock-step, and, when a lane
 * misses at the left edge of its window, rescans the gap its last binary step discarded.
 *
 * Guarantees (probe answers fixed for the duration of the call):
 * - every lane's depth is `n` or a position where that lane missed, so it is never below the
 *   linear oracle (the first miss);
 * - when a lane's hits form a prefix `[0, d)`, its depth is exactly `d`;
 * - a lane's depth depends only on its own answers; grouping only shares probe calls.
 * Capacity holes and false positives make evidence non-monotone; a lane can then over-report,
 * and the work stays bounded by `n` and `W` with no retry.
 */

import { CKF_LANE_COUNT } from "./config.js"
import { lowestBit, popcount } from "./internal/bits.js"

/** How deep a prefix search verifies. */
export interface PrefixSearchConfig {
  /** Positions verified below each tentative depth (1..=MAX_VERIFICATION_WINDOW). */
  readonly verificationWindow: number
}

/** Counters for tests and metrics; `findPrefixDepths` adds to them. */
export interface PrefixSearchStats {
  /** Lanes whose first verification miss was the left edge of their window. */
  leftEdgeLanes: number
  /** Left-edge lanes whose discarded gap was non-empty and was rescanned. */
  activatedLanes: number
  /** Calls of the probe callback. */
  probeCalls: number
  /** Sum over probe calls of the lanes whose state the answer advanced. */
  laneProbes: number
  /** Left-edge lanes skipped because their last binary predecessor already lies in the window. */
  provenanceSkips: number
}

/** Search counters at zero. */
export const newPrefixSearchStats = (): PrefixSearchStats => ({
  leftEdgeLanes: 0,
  activatedLanes: 0,
  probeCalls: 0,
  laneProbes: 0,
  provenanceSkips: 0
})

const LANE_MASK = (1 << CKF_LANE_COUNT) - 1
const U32_MAX = 0xffff_ffff

/** Per-lane search state; one instance is reused across calls so that a query allocates nothing. */
class SearchScratch {
  readonly lower = new Float64Array(CKF_LANE_COUNT)
  readonly lowerPred = new Float64Array(CKF_LANE_COUNT)
  readonly upper = new Float64Array(CKF_LANE_COUNT)
  readonly depth = new Float64Array(CKF_LANE_COUNT)
  readonly windowStart = new Float64Array(CKF_LANE_COUNT)
  /** Lock-step scan cursors; after a miss, the miss position. */
  readonly from = new Float64Array(CKF_LANE_COUNT)
  /** Lock-step scan ends (exclusive). */
  readonly to = new Float64Array(CKF_LANE_COUNT)
  readonly groupPos = new Float64Array(CKF_LANE_COUNT)
  readonly groupLanes = new Int32Array(CKF_LANE_COUNT)
  probeCalls = 0
  laneProbes = 0
}

// A probe callback that itself searches gets a fresh scratch instead of corrupting the caller's.
let idleScratch: SearchScratch | undefined = new SearchScratch()

/**
 * Scan `[from[l], to[l])` for every lane of `lanes` in lock-step, always probing the smallest
 * pending position, so lanes at the same position share one probe and each lane sees its
 * positions in ascending order. Returns the lanes that missed; their miss position is left in
 * `from[l]`.
 */
const scanLockStep = (s: SearchScratch, lanes: number, probe: (pos: number) => number): number => {
  const from = s.from
  const to = s.to
  let scanning = 0
  for (let m = lanes; m !== 0; m &= m - 1) {
    const l = lowestBit(m)
    if (from[l]! < to[l]!) scanning |= 1 << l
  }
  let missed = 0
  while (scanning !== 0) {
    let pos = Number.POSITIVE_INFINITY
    let participants = 0
    for (let m = scanning; m !== 0; m &= m - 1) {
      const l = lowestBit(m)
      const at = from[l]!
      if (at < pos) {
        pos = at
        participants = 1 << l
      } else if (at === pos) {
        participants |= 1 << l
      }
    }
    const hits = probe(pos)
    s.probeCalls++
    s.laneProbes += popcount(participants)
    const misses = participants & ~hits
    missed |= misses
    scanning &= ~misses
    for (let m = participants & hits; m !== 0; m &= m - 1) {
      const l = lowestBit(m)
      const next = from[l]! + 1
      from[l] = next
      if (next >= to[l]!) scanning &= ~(1 << l)
    }
  }
  return missed
}

/**
 * Prefix depth of every lane (16 entries; 0 for lanes outside `initialMask`).
 *
 * `probe` is called once per distinct position group: once per galloping step, once per distinct
 * midpoint of a binary round, and once per position of the verification and fallback scans (a
 * later phase may ask again for a position an earlier phase probed). Its answer must not depend
 * on which lanes asked. Depths
 * saturate at u32::MAX. `out` (length ≥ 16) is overwritten and returned; `stats` is added to.
 */
export const findPrefixDepths = (
  n: number,
  initialMask: number,
  verificationWindow: number,
  probe: (pos: number) => number,
  out: Uint32Array = new Uint32Array(CKF_LANE_COUNT),
  stats?: PrefixSearchStats
): Uint32Array => {
  out.fill(0, 0, CKF_LANE_COUNT)
  if (n <= 0) return out
  const s = idleScratch ?? new SearchScratch()
  idleScratch = undefined
  try {
    s.probeCalls = 1
    s.laneProbes = popcount(initialMask & LANE_MASK)
    // A lane that misses position 0 has depth 0.
    const active = initialMask & LANE_MASK & probe(0)
    let leftEdge = 0
    let activated = 0
    let skips = 0
    if (active !== 0) {
      const { lower, lowerPred, upper, depth, windowStart, from, to, groupPos, groupLanes } = s
      for (let m = active; m !== 0; m &= m - 1) {
        const l = lowestBit(m)
        lower[l] = 0
        lowerPred[l] = 0
        upper[l] = n
      }

      // Galloping: a lane samples until its first miss, which becomes its upper bound.
      let sampling = active
      for (let pos = 1; pos < n && sampling !== 0; pos *= 2) {
        const hits = probe(pos)
        s.probeCalls++
        s.laneProbes += popcount(sampling)
        for (let m = sampling & hits; m !== 0; m &= m - 1) {
          const l = lowestBit(m)
          lowerPred[l] = lower[l]!
          lower[l] = pos
        }
        for (let m = sampling & ~hits; m !== 0; m &= m - 1) upper[lowestBit(m)] = pos
        sampling &= hits
      }

      // Binary rounds: every open lane proposes its midpoint; identical midpoints share a probe.
      // A lane sits in exactly one group per round, so updating it cannot move another group.
      for (;;) {
        let groups = 0
        for (let m = active; m !== 0; m &= m - 1) {
          const l = lowestBit(m)
          const lo = lower[l]!
          const span = upper[l]! - lo
          if (span <= 1) continue
          const mid = lo + Math.floor(span / 2)
          let g = 0
          while (g < groups && groupPos[g] !== mid) g++
          if (g === groups) {
            groupPos[g] = mid
            groupLanes[g] = 0
            groups++
          }
          groupLanes[g] = groupLanes[g]! | (1 << l)
        }
        if (groups === 0) break
        for (let g = 0; g < groups; g++) {
          const mid = groupPos[g]!
          const lanes = groupLanes[g]!
          const hits = probe(mid)
          s.probeCalls++
          s.laneProbes += popcount(lanes)
          for (let m = lanes; m !== 0; m &= m - 1) {
            const l = lowestBit(m)
            if ((hits & (1 << l)) !== 0) {
              lowerPred[l] = lower[l]!
              lower[l] = mid
            } else {
              upper[l] = mid
            }
          }
        }
      }

      // Verification of [upper - W, upper), ascending: the first miss becomes the depth.
      for (let m = active; m !== 0; m &= m - 1) {
        const l = lowestBit(m)
        const u = upper[l]!
        const start = u > verificationWindow ? u - verificationWindow : 0
        depth[l] = u
        windowStart[l] = start
        from[l] = start
        to[l] = u
      }
      const verifyMisses = scanLockStep(s, active, probe)
      let fallback = 0
      for (let m = verifyMisses; m !== 0; m &= m - 1) {
        const l = lowestBit(m)
        depth[l] = from[l]!
        if (from[l] === windowStart[l]) fallback |= 1 << l
      }
      leftEdge = popcount(fallback)

      // Fallback: a miss at the window's left edge means the terminal branch may rest on a false
      // hit (a capacity hole below it or a false positive at it), so rescan the gap between the
      // predecessor of the terminal lower bound and the window.
      let scan = 0
      for (let m = fallback; m !== 0; m &= m - 1) {
        const l = lowestBit(m)
        const end = windowStart[l]!
        const pred = lowerPred[l]!
        if (pred >= end) {
          skips++
          continue
        }
        if (pred + 1 === end) continue
        from[l] = pred + 1
        to[l] = end
        scan |= 1 << l
      }
      activated = popcount(scan)
      const fallbackMisses = scan === 0 ? 0 : scanLockStep(s, scan, probe)
      for (let m = fallbackMisses; m !== 0; m &= m - 1) {
        const l = lowestBit(m)
        depth[l] = from[l]!
      }

      for (let m = active; m !== 0; m &= m - 1) {
        const l = lowestBit(m)
        out[l] = Math.min(depth[l]!, U32_MAX)
      }
    }
    if (stats !== undefined) {
      stats.probeCalls += s.probeCalls
      stats.laneProbes += s.laneProbes
      stats.leftEdgeLanes += leftEdge
      stats.activatedLanes += activated
      stats.provenanceSkips += skips
    }
    return out
  } finally {
    idleScratch = s
  }
}

/**
 * The linear oracle: a lane stays alive while every probe hits; its depth is its first miss.
 */
export const linearPrefixDepths = (
  n: number,
  initialMask: number,
  probe: (pos: number) => number
): Uint32Array => {
  const out = new Uint32Array(CKF_LANE_COUNT)
  let alive = initialMask & LANE_MASK
  for (let pos = 0; pos < n && alive !== 0; pos++) {
    alive &= probe(pos)
    const depth = Math.min(pos + 1, U32_MAX)
    for (let m = alive; m !== 0; m &= m - 1) out[lowestBit(m)] = depth
  }
  return out
}
