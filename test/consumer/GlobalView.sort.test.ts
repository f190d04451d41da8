import fc from "fast-check"
import { describe, expect, it } from "vitest"
import { type OverlapResult, sortByDepth } from "../../src/consumer/GlobalView.js"

// The view's result order against the stable `Array.prototype.sort` it replaced: deepest first,
// ties in their original (domain, lane) order.

describe("GlobalView result order", () => {
  it("is the stable deepest-first order of Array.prototype.sort", () => {
    fc.assert(
      fc.property(fc.array(fc.nat({ max: 6 }), { maxLength: 40 }), (depths) => {
        // Only the depth and the identity matter to the order; the rest is left out.
        const results = depths.map((prefixDepth, lane) => ({ lane, prefixDepth }) as unknown as OverlapResult)
        const expected = [...results].sort((a, b) => b.prefixDepth - a.prefixDepth)
        const actual = sortByDepth([...results])
        expect(actual.map((r) => r.lane)).toEqual(expected.map((r) => r.lane))
      }),
      { numRuns: 500 }
    )
  })
})
