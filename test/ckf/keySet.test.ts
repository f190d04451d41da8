/** The lower tiers' per-member key set against a plain `Set`, through growth and gradual moves. */

import fc from "fast-check"
import { describe, expect, it } from "vitest"
import { KeySet } from "../../src/ckf/keySet.js"

const pair = new Uint32Array(2)
const at = (hi: number, lo: number): Uint32Array => {
  pair[0] = hi
  pair[1] = lo
  return pair
}

describe("KeySet", () => {
  it("behaves like a Set of u64 keys, the zero key included, while it grows and moves", () => {
    fc.assert(
      fc.property(
        fc.array(
          fc.record({
            op: fc.constantFrom("add", "add", "add", "delete"),
            // A few hundred distinct keys (some sharing a high word, so their homes collide), and 0.
            hi: fc.oneof(fc.constant(0), fc.integer({ min: 0, max: 0xffff_ffff })),
            lo: fc.integer({ min: 0, max: 300 })
          }),
          { maxLength: 2000 }
        ),
        fc.integer({ min: 1, max: 64 }),
        (ops, movePerInsert) => {
          const set = new KeySet(movePerInsert)
          const model = new Set<string>()
          for (const { op, hi, lo } of ops) {
            const id = `${hi}:${lo}`
            if (op === "add") expect(set.add(at(hi, lo), 0)).toBe(!model.has(id))
            else expect(set.delete(at(hi, lo), 0)).toBe(model.has(id))
            if (op === "add") model.add(id)
            else model.delete(id)
            expect(set.has(at(hi, lo), 0)).toBe(model.has(id))
          }
          expect(set.size).toBe(model.size)
          const keys = set.keys()
          const listed = new Set<string>()
          for (let k = 0; k < keys.length; k += 2) listed.add(`${keys[k]}:${keys[k + 1]}`)
          expect(listed).toEqual(model)
          for (const id of model) {
            const [hi, lo] = id.split(":").map(Number)
            expect(set.has(at(hi!, lo!), 0)).toBe(true)
          }
        }
      ),
      { numRuns: 150 }
    )
  })

  it("moves a large set into its grown table gradually, answering from both meanwhile", () => {
    const set = new KeySet(8)
    const keys: Array<[number, number]> = []
    for (let i = 0; i < 20_000; i++) keys.push([Math.imul(i + 1, 0x9e3779b1) >>> 0 || 1, i])
    let sawMoving = false
    for (const [hi, lo] of keys) {
      set.add(at(hi, lo), 0)
      if (set.moving) {
        sawMoving = true
        // Everything added so far is found, wherever it is.
        expect(set.has(at(keys[0]![0], keys[0]![1]), 0)).toBe(true)
      }
    }
    expect(sawMoving).toBe(true)
    for (const [hi, lo] of keys) expect(set.has(at(hi, lo), 0)).toBe(true)
    // 8 bytes a slot, at least 53% full once grown (and the move done).
    while (set.moving) set.add(at(1, keys.length), 0)
    expect(set.byteSize / set.size).toBeLessThanOrEqual(8 / 0.53)
    for (const [hi, lo] of keys.slice(0, 10_000)) expect(set.delete(at(hi, lo), 0)).toBe(true)
    expect(set.size).toBe(10_001)
    for (const [hi, lo] of keys.slice(0, 10_000)) expect(set.has(at(hi, lo), 0)).toBe(false)
    for (const [hi, lo] of keys.slice(10_000)) expect(set.has(at(hi, lo), 0)).toBe(true)
  })
})
