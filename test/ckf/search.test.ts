import fc from "fast-check"
import { describe, expect, it } from "vitest"
import { MAX_VERIFICATION_WINDOW } from "../../src/ckf/config.js"
import {
  findPrefixDepths,
  linearPrefixDepths,
  newPrefixSearchStats,
  type PrefixSearchStats
} from "../../src/ckf/search.js"
import { mulberry, referenceLaneDepth } from "./referenceSearch.js"

const LANES = 16

/** A probe table: `columns[lane][pos]` is 1 when the lane hits the position. */
type Columns = ReadonlyArray<Uint8Array>

const probeOf =
  (columns: Columns, n: number, calls?: Array<number>) =>
  (pos: number): number => {
    calls?.push(pos)
    if (!Number.isInteger(pos) || pos < 0 || pos >= n) throw new Error(`probe outside 0..${n}: ${pos}`)
    let mask = 0
    for (let lane = 0; lane < LANES; lane++) if (columns[lane]?.[pos] === 1) mask |= 1 << lane
    return mask
  }

const prefixColumns = (n: number, depths: ReadonlyArray<number>): Columns =>
  depths.map((d) => {
    const column = new Uint8Array(n)
    column.fill(1, 0, Math.min(d, n))
    return column
  })

/**
 * Prefix-shaped evidence damaged by capacity holes (misses inside the prefix), false positives
 * (isolated hits after it) and false-positive runs (which can outlast the verification window).
 */
const noisyColumns = (
  n: number,
  seed: number,
  holeRate: number,
  fpRate: number,
  runRate: number
): Columns => {
  const random = mulberry(seed)
  const columns: Array<Uint8Array> = []
  for (let lane = 0; lane < LANES; lane++) {
    const column = new Uint8Array(n)
    const depth = Math.floor(random() * (n + 1))
    for (let pos = 0; pos < n; pos++) {
      if (pos < depth) column[pos] = random() < holeRate ? 0 : 1
      else if (random() < fpRate) column[pos] = 1
      else if (random() < runRate) {
        const run = 1 + Math.floor(random() * 12)
        for (let k = 0; k < run && pos + k < n; k++) column[pos + k] = 1
        pos += run
      }
    }
    columns.push(column)
  }
  return columns
}

const hitOf = (columns: Columns, lane: number) => (pos: number) => columns[lane]?.[pos] === 1

const windowArb = fc.integer({ min: 1, max: MAX_VERIFICATION_WINDOW })
const maskArb = fc.integer({ min: 0, max: 0xffff })

describe("findPrefixDepths", () => {
  it("returns zeros for an empty sequence, an empty mask or a miss at position 0", () => {
    const all = (_pos: number) => 0xffff
    expect(Array.from(findPrefixDepths(0, 0xffff, 2, all))).toEqual(new Array(16).fill(0))
    expect(Array.from(findPrefixDepths(10, 0, 2, all))).toEqual(new Array(16).fill(0))
    const calls: Array<number> = []
    const none = (pos: number) => {
      calls.push(pos)
      return pos === 0 ? 0 : 0xffff
    }
    expect(Array.from(findPrefixDepths(10, 0xffff, 2, none))).toEqual(new Array(16).fill(0))
    expect(calls).toEqual([0])
  })

  it("ignores lanes outside the initial mask and bits above 16", () => {
    const depths = findPrefixDepths(8, 0x1_0005, 2, () => 0x7_ffff)
    expect(Array.from(depths)).toEqual([8, 0, 8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0])
  })

  it("overwrites and returns the caller's output buffer", () => {
    const out = new Uint32Array(16).fill(99)
    const result = findPrefixDepths(4, 0b10, 2, () => 0b11, out)
    expect(result).toBe(out)
    expect(Array.from(out)).toEqual([0, 4, ...new Array(14).fill(0)])
  })

  it("saturates depths at u32::MAX", () => {
    const n = 2 ** 32 + 5
    const depths = findPrefixDepths(n, 0xffff, 2, () => 0xffff)
    expect(Array.from(depths)).toEqual(new Array(16).fill(0xffff_ffff))
  })

  it("equals the linear oracle exactly when every lane's hits form a prefix", () => {
    fc.assert(
      fc.property(
        fc.integer({ min: 0, max: 300 }),
        fc.array(fc.integer({ min: 0, max: 400 }), { minLength: LANES, maxLength: LANES }),
        maskArb,
        windowArb,
        (n, rawDepths, mask, window) => {
          const depths = rawDepths.map((d) => Math.min(d, n))
          const columns = prefixColumns(n, depths)
          const probe = probeOf(columns, n)
          const found = findPrefixDepths(n, mask, window, probe)
          const oracle = linearPrefixDepths(n, mask, probe)
          expect(Array.from(found)).toEqual(Array.from(oracle))
          for (let lane = 0; lane < LANES; lane++) {
            expect(found[lane]).toBe((mask >> lane) & 1 ? depths[lane] : 0)
          }
        }
      ),
      { numRuns: 4000 }
    )
  })

  it("with holes and false positives: a miss position or n, never below the oracle, per-lane §8.2", () => {
    fc.assert(
      fc.property(
        fc.integer({ min: 1, max: 260 }),
        fc.integer({ min: 0, max: 0x7fff_ffff }),
        fc.constantFrom(0, 0.01, 0.05, 0.2),
        fc.constantFrom(0, 0.01, 0.1, 0.5),
        fc.constantFrom(0, 0.02, 0.1),
        maskArb,
        windowArb,
        (n, seed, holeRate, fpRate, runRate, mask, window) => {
          const columns = noisyColumns(n, seed, holeRate, fpRate, runRate)
          const calls: Array<number> = []
          const probe = probeOf(columns, n, calls)
          const stats = newPrefixSearchStats()
          const found = findPrefixDepths(n, mask, window, probe, undefined, stats)
          expect(stats.probeCalls).toBe(calls.length)
          const oracle = linearPrefixDepths(n, mask, probeOf(columns, n))
          for (let lane = 0; lane < LANES; lane++) {
            const depth = found[lane]!
            if (((mask >> lane) & 1) === 0) {
              expect(depth).toBe(0)
              continue
            }
            // The depth is where this lane actually missed (or n): never below the first miss.
            expect(depth === n || columns[lane]![depth] === 0).toBe(true)
            expect(depth).toBeGreaterThanOrEqual(oracle[lane]!)
            // Grouping and lock-step only share probes: each lane gets the plain §8.2 answer.
            expect(depth).toBe(referenceLaneDepth(n, window, hitOf(columns, lane)))
          }
        }
      ),
      { numRuns: 4000 }
    )
  })

  it("answers each lane from its own column only (same result as a single-lane search)", () => {
    fc.assert(
      fc.property(
        fc.integer({ min: 1, max: 200 }),
        fc.integer({ min: 0, max: 0x7fff_ffff }),
        maskArb,
        windowArb,
        (n, seed, mask, window) => {
          const columns = noisyColumns(n, seed, 0.05, 0.1, 0.05)
          const probe = probeOf(columns, n)
          const together = Array.from(findPrefixDepths(n, mask, window, probe))
          for (let lane = 0; lane < LANES; lane++) {
            const alone = findPrefixDepths(n, mask & (1 << lane), window, probe)
            expect(alone[lane]).toBe(together[lane])
          }
        }
      ),
      { numRuns: 1000 }
    )
  })

  it("shares one probe call per position group: 16 identical lanes cost what one lane costs", () => {
    fc.assert(
      fc.property(
        fc.integer({ min: 1, max: 300 }),
        fc.integer({ min: 0, max: 0x7fff_ffff }),
        windowArb,
        (n, seed, window) => {
          const column = noisyColumns(n, seed, 0.05, 0.1, 0.05)[0]!
          const columns = new Array(LANES).fill(column)
          const one = newPrefixSearchStats()
          const all = newPrefixSearchStats()
          const a = findPrefixDepths(n, 0b1, window, probeOf(columns, n), undefined, one)
          const b = findPrefixDepths(n, 0xffff, window, probeOf(columns, n), undefined, all)
          expect(Array.from(b)).toEqual(new Array(16).fill(a[0]))
          expect(all.probeCalls).toBe(one.probeCalls)
          expect(all.laneProbes).toBe(16 * one.laneProbes)
          expect(all.leftEdgeLanes).toBe(16 * one.leftEdgeLanes)
          expect(all.activatedLanes).toBe(16 * one.activatedLanes)
          expect(all.provenanceSkips).toBe(16 * one.provenanceSkips)
        }
      ),
      { numRuns: 1000 }
    )
  })

  it("stays within its structural probe bound", () => {
    fc.assert(
      fc.property(
        fc.integer({ min: 1, max: 400 }),
        fc.integer({ min: 0, max: 0x7fff_ffff }),
        maskArb,
        windowArb,
        (n, seed, mask, window) => {
          const columns = noisyColumns(n, seed, 0.1, 0.2, 0.1)
          const calls: Array<number> = []
          findPrefixDepths(n, mask, window, probeOf(columns, n, calls))
          const log = Math.ceil(Math.log2(n)) + 1
          // position 0, galloping, ≤ 16 groups per binary round, verification, fallback gaps
          expect(calls.length).toBeLessThanOrEqual(1 + log + 16 * log + 16 * window + n)
        }
      ),
      { numRuns: 1000 }
    )
  })

  it("the fallback rescans the gap when the terminal branch rests on a false positive", () => {
    // Lane 0 truly matches 0..4; a false positive at 8 misleads galloping; verification misses at
    // the window's left edge (7) and the fallback scans 5..6 from the predecessor (4) on.
    const n = 64
    const column = new Uint8Array(n)
    column.fill(1, 0, 5)
    column[8] = 1
    const calls: Array<number> = []
    const stats: PrefixSearchStats = newPrefixSearchStats()
    const depths = findPrefixDepths(n, 0b1, 2, probeOf([column], n, calls), undefined, stats)
    expect(depths[0]).toBe(5)
    expect(calls).toEqual([0, 1, 2, 4, 8, 16, 12, 10, 9, 7, 5])
    expect(stats).toEqual({
      leftEdgeLanes: 1,
      activatedLanes: 1,
      probeCalls: 11,
      laneProbes: 11,
      provenanceSkips: 0
    })
  })

  it("can over-report past a hole when false positives sit on the galloping path", () => {
    // The first miss is 3, but 4 and 8 are false positives: the search settles on 5, a real miss
    // above the oracle. This is the documented bound, not an exact answer.
    const n = 64
    const column = new Uint8Array(n)
    column.fill(1, 0, 3)
    column[4] = 1
    column[8] = 1
    const depths = findPrefixDepths(n, 0b1, 2, probeOf([column], n))
    expect(depths[0]).toBe(5)
    expect(linearPrefixDepths(n, 0b1, probeOf([column], n))[0]).toBe(3)
  })

  it("counts a provenance skip when the last binary predecessor lies inside the window", () => {
    // n = 23, W = 5, only position 18 misses: binary search ends at lower 22 (predecessor 21),
    // verification misses at the left edge 18, and the gap after 21 is empty.
    const n = 23
    const column = new Uint8Array(n).fill(1)
    column[18] = 0
    const stats = newPrefixSearchStats()
    const depths = findPrefixDepths(n, 0b1, 5, probeOf([column], n), undefined, stats)
    expect(depths[0]).toBe(18)
    expect(stats.leftEdgeLanes).toBe(1)
    expect(stats.provenanceSkips).toBe(1)
    expect(stats.activatedLanes).toBe(0)
  })

  it("adds to the caller's stats across calls", () => {
    const stats = newPrefixSearchStats()
    findPrefixDepths(4, 0b11, 2, () => 0b11, undefined, stats)
    const first = stats.probeCalls
    findPrefixDepths(4, 0b11, 2, () => 0b11, undefined, stats)
    expect(stats.probeCalls).toBe(2 * first)
    expect(stats.laneProbes).toBe(4 * first)
  })

  it("survives a probe callback that itself searches", () => {
    const inner = (pos: number): number => {
      findPrefixDepths(16, 0xffff, 2, (p) => (p < 3 ? 0xffff : 0))
      return pos < 7 ? 0xffff : 0
    }
    expect(Array.from(findPrefixDepths(32, 0xffff, 2, inner))).toEqual(new Array(16).fill(7))
  })
})

describe("linearPrefixDepths", () => {
  it("keeps a lane alive while every probe hits", () => {
    const columns = [
      Uint8Array.from([1, 1, 0, 1]),
      Uint8Array.from([1, 1, 1, 1]),
      Uint8Array.from([0, 1, 1, 1])
    ]
    while (columns.length < LANES) columns.push(new Uint8Array(4))
    const depths = linearPrefixDepths(4, 0b111, probeOf(columns, 4))
    expect(Array.from(depths.subarray(0, 3))).toEqual([2, 4, 0])
  })
})
