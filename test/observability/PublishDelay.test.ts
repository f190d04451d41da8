import { describe, expect, it } from "@effect/vitest"
import fc from "fast-check"
import { PUBLISH_DELAY_BOUNDS_SECONDS, PublishDelayHistogram } from "../../src/observability/PublishDelay.js"

describe("PublishDelayHistogram", () => {
  it("puts each delay in the first bucket whose upper bound holds it (bounds inclusive)", () => {
    const h = new PublishDelayHistogram()
    for (const ms of [0, 1, 2, 3, 5, 10, 11, 5_000, 5_001, 60_000]) h.observe(ms)
    const { counts, count, sumSeconds } = h.snapshot()
    // ≤1: 0, 1 | ≤2: 2 | ≤5: 3, 5 | ≤10: 10 | ≤20: 11 | ≤5 s: 5,000 | +Inf: 5,001, 60,000
    expect(counts).toEqual([2, 1, 2, 1, 1, 0, 0, 0, 0, 0, 0, 1, 2])
    expect(count).toBe(10)
    expect(sumSeconds).toBeCloseTo(70.033, 9)
  })

  it("agrees with a direct search of the bounds for any delays", () => {
    fc.assert(
      fc.property(fc.array(fc.integer({ min: -5, max: 10_000 }), { maxLength: 200 }), (delays) => {
        const h = new PublishDelayHistogram()
        const want = new Array(PUBLISH_DELAY_BOUNDS_SECONDS.length + 1).fill(0)
        for (const ms of delays) {
          h.observe(ms)
          const i = PUBLISH_DELAY_BOUNDS_SECONDS.findIndex((s) => Math.max(0, ms) <= s * 1000)
          want[i < 0 ? want.length - 1 : i]++
        }
        const got = h.snapshot()
        expect(got.counts).toEqual(want)
        expect(got.count).toBe(delays.length)
        expect(got.sumSeconds).toBeCloseTo(delays.reduce((a, ms) => a + Math.max(0, ms), 0) / 1000, 6)
      })
    )
  })
})
