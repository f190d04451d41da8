/** Small deterministic PRNG, so that fast-check shrinks one seed instead of every generated value. */
export const mulberry = (seed: number) => {
  let a = seed >>> 0
  return (): number => {
    a = (a + 0x6d2b79f5) >>> 0
    let t = a
    t = Math.imul(t ^ (t >>> 15), t | 1)
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61)
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296
  }
}

/**
 * The algorithm of ckf-core.md §8.2 for one lane, written plainly: no grouping, no lock-step, no
 * scratch. The real search must give every lane exactly this answer whatever the other lanes do.
 */
export const referenceLaneDepth = (n: number, window: number, hit: (pos: number) => boolean): number => {
  if (n === 0 || !hit(0)) return 0
  let lower = 0
  let pred = 0
  let upper = n
  for (let pos = 1; pos < n; pos *= 2) {
    if (!hit(pos)) {
      upper = pos
      break
    }
    pred = lower
    lower = pos
  }
  while (upper - lower > 1) {
    const mid = lower + Math.floor((upper - lower) / 2)
    if (hit(mid)) {
      pred = lower
      lower = mid
    } else {
      upper = mid
    }
  }
  const start = Math.max(0, upper - window)
  for (let pos = start; pos < upper; pos++) {
    if (hit(pos)) continue
    if (pos > start || pred >= start) return pos
    for (let q = pred + 1; q < start; q++) if (!hit(q)) return q
    return start
  }
  return upper
}
