/**
 * Canonical block addressing (PROTOCOL §3.3): the token hashing against Dynamo's vectors and an
 * independent XXH3, the lineage table against a Map, and the canonical producer against a plain
 * model of lineage and ownership.
 */

import fc from "fast-check"
import { createXXHash3 } from "hash-wasm"
import { describe, expect, it } from "vitest"
import { CanonicalCkfState } from "../../src/ckf/canonical.js"
import { ckfConfig } from "../../src/ckf/config.js"
import type { CkfEvent } from "../../src/ckf/events.js"
import { LineageTable } from "../../src/ckf/lineage.js"
import {
  blockHashSeed,
  fullBlockCount,
  localBlockHashes,
  nextSequenceHash,
  sequenceHashes
} from "../../src/ckf/tokens.js"
import { hashPairs, hashPairsToBigInts } from "../../src/ckf/u64.js"

/** A hash as the pair the lineage API takes. */
const pair = (hi: number, lo: number): Uint32Array => Uint32Array.of(hi, lo)

const range = (from: number, to: number): Array<number> =>
  Array.from({ length: to - from }, (_, i) => from + i)

describe("token hashing", () => {
  it("matches Dynamo's vectors", () => {
    // `lib/tokens/src/lib.rs` tests (HASH_1_4, HASH_5_8, HASH_9_12, SEQ_HASH_5_8, SEQ_HASH_9_12 with
    // the 1337 chain seed) and the KV-events hashing doc ("[1,2,3,4], kv_block_size=4 →
    // 14643705804678351452"); the third-party `dynamo_input_sequence_hashes(1..=12, 4)` agrees.
    const local = localBlockHashes(range(1, 13), 4)
    expect(hashPairsToBigInts(local)).toEqual([
      14643705804678351452n,
      16777012769546811212n,
      483935686894639516n
    ])
    expect(hashPairsToBigInts(sequenceHashes(local))).toEqual([
      14643705804678351452n,
      4945711292740353085n,
      12583592247330656132n
    ])
    // ckf-core.md §8.1: chain(17, 23) with seed 1337.
    expect(nextSequenceHash(17n, 23n)).toBe(0xe7d5_cfb5_8104_f9efn)
  })

  it("cuts full blocks only; Eagle windows take the next block's first token", () => {
    expect(fullBlockCount(15, 4)).toBe(3)
    expect(localBlockHashes(range(1, 16), 4).length).toBe(6)
    // Dynamo's Eagle test: tokens 0..6, block size 2 → the single-window hashes of [0,1,2] and [2,3,4].
    const eagle = localBlockHashes(range(0, 6), 2, { hashFormat: "dynamo_eagle_v1" })
    expect(hashPairsToBigInts(eagle)).toEqual([
      ...hashPairsToBigInts(localBlockHashes([0, 1, 2], 3)),
      ...hashPairsToBigInts(localBlockHashes([2, 3, 4], 3))
    ])
    expect(fullBlockCount(4, 2, "dynamo_eagle_v1")).toBe(1)
    expect(fullBlockCount(5, 2, "dynamo_eagle_v1")).toBe(2)
  })

  it("salts the seed with the LoRA name; an absent or empty name is the base model", () => {
    expect(blockHashSeed(undefined)).toBe(1337n)
    expect(blockHashSeed("")).toBe(1337n)
    const tokens = range(0, 8)
    const base = hashPairsToBigInts(localBlockHashes(tokens, 4))
    const lora = hashPairsToBigInts(localBlockHashes(tokens, 4, { loraName: "adapter-a" }))
    expect(lora).not.toEqual(base)
    expect(hashPairsToBigInts(localBlockHashes(tokens, 4, { loraName: "adapter-a" }))).toEqual(lora)
  })

  it("agrees with hash-wasm's XXH3 on random tokens, block sizes and LoRA names", async () => {
    const samples = fc.sample(
      fc.record({
        tokens: fc.array(fc.integer({ min: 0, max: 0xffff_ffff }), { maxLength: 200 }),
        blockSize: fc.integer({ min: 1, max: 70 }),
        lora: fc.option(fc.string({ minLength: 1, maxLength: 12 }), { nil: undefined })
      }),
      200
    )
    for (const { tokens, blockSize, lora } of samples) {
      const seed = blockHashSeed(lora)
      const hasher = await createXXHash3(Number(seed & 0xffff_ffffn), Number(seed >> 32n))
      const expected: Array<bigint> = []
      for (let b = 0; (b + 1) * blockSize <= tokens.length; b++) {
        hasher.init()
        hasher.update(
          new Uint8Array(Uint32Array.from(tokens.slice(b * blockSize, (b + 1) * blockSize)).buffer)
        )
        expected.push(BigInt(`0x${hasher.digest("hex")}`))
      }
      expect(hashPairsToBigInts(localBlockHashes(tokens, blockSize, { loraName: lora }))).toEqual(expected)
    }
  })

  it("chains sequence hashes as hash-wasm's XXH3 of LE64(parent) ‖ LE64(local), seed 1337", async () => {
    const hasher = await createXXHash3(1337, 0)
    const u64 = fc.bigInt({ min: 0n, max: (1n << 64n) - 1n })
    const samples = fc.sample(
      fc.record({ local: fc.array(u64, { maxLength: 40 }), parent: fc.option(u64) }),
      200
    )
    for (const { local, parent } of samples) {
      const expected: Array<bigint> = []
      let previous = parent ?? undefined
      for (const l of local) {
        if (previous === undefined) previous = l
        else {
          const bytes = new DataView(new ArrayBuffer(16))
          bytes.setBigUint64(0, previous, true)
          bytes.setBigUint64(8, l, true)
          hasher.init()
          hasher.update(new Uint8Array(bytes.buffer))
          previous = BigInt(`0x${hasher.digest("hex")}`)
        }
        expected.push(previous)
      }
      expect(hashPairsToBigInts(sequenceHashes(hashPairs(local), parent ?? undefined))).toEqual(expected)
    }
  })
})

describe("LineageTable", () => {
  it("behaves like a Map of (member, external) → canonical", () => {
    fc.assert(
      fc.property(
        fc.array(
          fc.record({
            op: fc.constantFrom("insert", "delete", "clear"),
            member: fc.integer({ min: 0, max: 3 }),
            ext: fc.integer({ min: 0, max: 40 }),
            canon: fc.integer({ min: 0, max: 1000 })
          }),
          { maxLength: 300 }
        ),
        (ops) => {
          const table = new LineageTable()
          const model = new Map<string, number>()
          const out = new Uint32Array(2)
          for (const { op, member, ext, canon } of ops) {
            const key = `w/${member}`
            const id = `${member}:${ext}`
            if (op === "insert") {
              table.insert(table.ensureMember(key), pair(ext * 7919, ext), 0, pair(canon, 0), 0)
              model.set(id, canon)
            } else if (op === "delete") {
              expect(table.delete(key, table.memberIndex(key), pair(ext * 7919, ext), 0, out, 0)).toBe(
                model.has(id)
              )
              if (model.has(id)) expect(out[0]).toBe(model.get(id))
              model.delete(id)
            } else {
              table.clearMember(key)
              for (const k of [...model.keys()]) if (k.startsWith(`${member}:`)) model.delete(k)
            }
          }
          expect(table.size).toBe(model.size)
          for (let member = 0; member < 4; member++) {
            const m = table.memberIndex(`w/${member}`)
            for (let ext = 0; ext <= 40; ext++) {
              const id = `${member}:${ext}`
              expect(table.get(m, pair(ext * 7919, ext), 0, out, 0)).toBe(model.has(id))
              if (model.has(id)) expect(out[0]).toBe(model.get(id))
            }
          }
        }
      ),
      { numRuns: 200 }
    )
  })
})

// ---------------------------------------------------------------------------------------------
// The canonical producer against a plain model

const stored = (
  workerId: string,
  dpRank: number,
  external: ReadonlyArray<bigint>,
  local: ReadonlyArray<bigint>,
  parent?: bigint,
  skipUnanchored?: boolean
): CkfEvent => ({
  workerId,
  dpRank,
  storageTier: "device",
  data: {
    _tag: "Stored",
    blockHashes: hashPairs(external),
    tokensHashes: hashPairs(local),
    parentHash: parent === undefined ? undefined : hashPairs([parent]),
    ...(skipUnanchored === true ? { skipUnanchored } : {})
  }
})
/** A Stored event as an engine source sends it: an unknown parent skips it as unanchored. */
const engineStored = (
  workerId: string,
  dpRank: number,
  external: ReadonlyArray<bigint>,
  local: ReadonlyArray<bigint>,
  parent?: bigint
): CkfEvent => stored(workerId, dpRank, external, local, parent, true)
const removed = (workerId: string, dpRank: number, external: ReadonlyArray<bigint>): CkfEvent => ({
  workerId,
  dpRank,
  storageTier: "device",
  data: { _tag: "Removed", blockHashes: hashPairs(external) }
})
const cleared = (workerId: string, dpRank: number): CkfEvent => ({
  workerId,
  dpRank,
  storageTier: "device",
  data: { _tag: "Cleared" }
})

/** Map lineage per member, and per member the canonical hashes it owns with their alias counts. */
class Model {
  readonly lineage = new Map<string, Map<bigint, bigint>>()
  parentNotFound = 0

  private of(member: string): Map<bigint, bigint> {
    let map = this.lineage.get(member)
    if (map === undefined) {
      map = new Map()
      this.lineage.set(member, map)
    }
    return map
  }

  store(
    member: string,
    external: ReadonlyArray<bigint>,
    local: ReadonlyArray<bigint>,
    parent?: bigint
  ): boolean {
    const lineage = this.of(member)
    let previous: bigint | undefined
    if (parent !== undefined) {
      previous = lineage.get(parent)
      if (previous === undefined) {
        this.parentNotFound++
        return false
      }
    }
    const canon = local.map((l) => {
      previous = previous === undefined ? l : nextSequenceHash(previous, l)
      return previous
    })
    if (external.some((e, i) => lineage.has(e) && lineage.get(e) !== canon[i])) return false
    if (external.some((e, i) => external.some((f, j) => j < i && f === e && canon[j] !== canon[i])))
      return false
    external.forEach((e, i) => {
      if (!lineage.has(e)) lineage.set(e, canon[i]!)
    })
    return true
  }

  remove(member: string, external: ReadonlyArray<bigint>): void {
    const lineage = this.of(member)
    for (const e of external) lineage.delete(e)
  }

  clear(member: string): void {
    this.lineage.delete(member)
  }

  owned(member: string): Set<bigint> {
    return new Set(this.lineage.get(member)?.values() ?? [])
  }

  refcounts(): Map<bigint, number> {
    const counts = new Map<bigint, number>()
    for (const member of this.lineage.keys())
      for (const c of this.owned(member)) counts.set(c, (counts.get(c) ?? 0) + 1)
    return counts
  }
}

const MEMBERS = [
  ["7001", 0],
  ["7001", 1],
  ["7002", 0]
] as const

describe("CanonicalCkfState", () => {
  it("agrees with a plain model under random stores, removals, clears, unknown parents and replacements", () => {
    const op = fc.oneof(
      {
        weight: 4,
        arbitrary: fc.record({
          kind: fc.constant("store" as const),
          member: fc.nat({ max: 2 }),
          blocks: fc.array(fc.tuple(fc.bigInt({ min: 1n, max: 40n }), fc.bigInt({ min: 1n, max: 4n })), {
            minLength: 1,
            maxLength: 4
          }),
          // No parent, a block the member holds (picked by index), or a hash it never stored.
          parent: fc.oneof(fc.constant("none" as const), fc.nat(), fc.constant("unknown" as const))
        })
      },
      fc.record({
        kind: fc.constant("remove" as const),
        member: fc.nat({ max: 2 }),
        external: fc.array(fc.bigInt({ min: 1n, max: 40n }), { maxLength: 4 })
      }),
      fc.record({ kind: fc.constant("clear" as const), member: fc.nat({ max: 2 }) }),
      fc.record({ kind: fc.constant("replace" as const), member: fc.nat({ max: 2 }), keep: fc.boolean() })
    )
    fc.assert(
      fc.property(fc.array(op, { minLength: 20, maxLength: 60 }), (ops) => {
        const state = new CanonicalCkfState(ckfConfig(4096))
        const model = new Model()
        // What each member stored, in order, so a replacement can replay it as a dump.
        const history = new Map<string, Array<CkfEvent>>()
        for (const o of ops) {
          const [workerId, dpRank] = MEMBERS[o.member]!
          const member = `${workerId}/${dpRank}`
          const log = history.get(member) ?? []
          history.set(member, log)
          if (o.kind === "store") {
            const external = o.blocks.map(([e]) => e)
            const local = o.blocks.map(([, l]) => l)
            const held = [...(model.lineage.get(member)?.keys() ?? [])]
            const parent =
              o.parent === "none"
                ? undefined
                : o.parent === "unknown" || held.length === 0
                  ? 999n
                  : held[o.parent % held.length]
            const event = stored(workerId, dpRank, external, local, parent)
            const accepted = model.store(member, external, local, parent)
            const outcome = state.applyEvent(event)
            expect(outcome.firstError === undefined).toBe(accepted)
            if (accepted) log.push(event)
          } else if (o.kind === "remove") {
            model.remove(member, o.external)
            state.applyEvent(removed(workerId, dpRank, o.external))
            log.push(removed(workerId, dpRank, o.external))
          } else if (o.kind === "clear") {
            model.clear(member)
            state.applyEvent(cleared(workerId, dpRank))
            log.length = 0
          } else {
            // A dump replays what the member has (keep) or nothing (a restarted engine).
            const events = o.keep ? [...log] : []
            if (!o.keep) {
              model.clear(member)
              log.length = 0
            }
            expect(state.replaceRanksFromEvents([{ workerId, dpRank, events }])).not.toBeInstanceOf(Error)
          }
          for (const [w, r] of MEMBERS) {
            const owned = model.owned(`${w}/${r}`)
            expect(state.memberBlockCount(w, r)).toBe(owned.size)
            for (const c of owned) expect(state.owns(w, r, c)).toBe(true)
          }
          for (const [c, count] of model.refcounts()) {
            expect(state.refcount(c)).toBe(count)
            expect(state.contains(c)).toBe(true)
          }
        }
        expect(state.lineageStats().parentNotFound).toBe(model.parentNotFound)
      }),
      { numRuns: 300 }
    )
  })

  it("two engines with different external hash seeds land the same prompt at one address", () => {
    const state = new CanonicalCkfState(ckfConfig(4096))
    const local = hashPairsToBigInts(localBlockHashes(range(100, 132), 16))
    const canon = hashPairsToBigInts(sequenceHashes(hashPairs(local)))
    // vLLM seeds its block hashes randomly per process: the engines' hashes differ.
    state.applyEvent(stored("7001", 0, [0xaaaa_0001n], [local[0]!]))
    state.applyEvent(stored("7001", 0, [0xaaaa_0002n], [local[1]!], 0xaaaa_0001n))
    state.applyEvent(stored("7002", 0, [0xbbbb_0001n, 0xbbbb_0002n], local))
    for (const c of canon) {
      expect(state.refcount(c)).toBe(2)
      expect(state.contains(c)).toBe(true)
    }
    expect(state.canonicalOf("7001", 0, 0xaaaa_0002n)).toBe(canon[1])
    state.applyEvent(removed("7001", 0, [0xaaaa_0002n]))
    expect(state.refcount(canon[1]!)).toBe(1)
    expect(state.contains(canon[1]!)).toBe(true)
    state.applyEvent(removed("7002", 0, [0xbbbb_0002n]))
    expect(state.refcount(canon[1]!)).toBe(0)
    expect(state.contains(canon[1]!)).toBe(false)
    expect(state.refcount(canon[0]!)).toBe(2)
  })

  it("an unknown parent is ParentBlockNotFound and changes nothing; a child before its parent fails a dump", () => {
    const state = new CanonicalCkfState(ckfConfig(4096))
    const outcome = state.applyEvent(stored("7001", 0, [2n], [5n], 1n))
    expect(outcome.firstError).toBe("ParentBlockNotFound")
    expect(state.memberBlockCount("7001", 0)).toBe(0)
    expect(state.lineageStats()).toMatchObject({ parentNotFound: 1, lineageEntries: 0 })
    const dump = state.replaceRanksFromEvents([
      {
        workerId: "7001",
        dpRank: 0,
        events: [stored("7001", 0, [2n], [5n], 1n), stored("7001", 0, [1n], [4n])]
      }
    ])
    expect(dump).toMatchObject({ kind: "ParentBlockNotFound" })
  })

  it("two external hashes of one member with the same canonical hash (aliases) own it until the last goes", () => {
    const state = new CanonicalCkfState(ckfConfig(4096))
    state.applyEvent(stored("7001", 0, [1n], [10n]))
    state.applyEvent(stored("7001", 0, [2n], [10n]))
    expect(state.memberBlockCount("7001", 0)).toBe(1)
    state.applyEvent(removed("7001", 0, [1n]))
    expect(state.owns("7001", 0, 10n)).toBe(true)
    state.applyEvent(removed("7001", 0, [2n]))
    expect(state.owns("7001", 0, 10n)).toBe(false)
    expect(state.contains(10n)).toBe(false)
  })

  it("an external hash re-used for other tokens is InvalidBlockSequence and commits nothing of its batch", () => {
    const state = new CanonicalCkfState(ckfConfig(4096))
    state.applyEvent(stored("7001", 0, [1n], [10n]))
    const outcome = state.applyEvent(stored("7001", 0, [2n, 1n], [11n, 12n]))
    expect(outcome.firstError).toBe("InvalidBlockSequence")
    expect(state.memberBlockCount("7001", 0)).toBe(1)
    expect(state.canonicalOf("7001", 0, 2n)).toBeUndefined()
  })

  it("checks repeats within one batch in linear time: large batches agree with small ones", () => {
    for (const size of [8, 32, 33, 5000]) {
      const external = Array.from({ length: size }, (_, i) => BigInt(1000 + i))
      const local = Array.from({ length: size }, (_, i) => BigInt(50_000 + i))
      // The first block again at the end: its canonical hash differs (other parent), so refused.
      const clash = new CanonicalCkfState(ckfConfig(4 * size))
      const refused = clash.applyEvent(stored("7001", 0, [...external, external[0]!], [...local, local[0]!]))
      expect(refused.firstError, `size ${size}`).toBe("InvalidBlockSequence")
      expect(clash.memberBlockCount("7001", 0)).toBe(0)
      // A batch without repeats is stored whole.
      const fine = new CanonicalCkfState(ckfConfig(4 * size))
      expect(fine.applyEvent(stored("7001", 0, external, local)).firstError, `size ${size}`).toBeUndefined()
      expect(fine.memberBlockCount("7001", 0)).toBe(size)
    }
    // 50,000 blocks in one event: quadratic checking took seconds here.
    const big = 50_000
    const state = new CanonicalCkfState(ckfConfig(2 * big))
    const started = performance.now()
    state.applyEvent(
      stored(
        "7001",
        0,
        Array.from({ length: big }, (_, i) => BigInt(7_000_000 + i)),
        Array.from({ length: big }, (_, i) => BigInt(9_000_000 + i))
      )
    )
    expect(state.memberBlockCount("7001", 0)).toBe(big)
    expect(performance.now() - started).toBeLessThan(10_000)
  })
})

describe("CanonicalCkfState: engine sources with partial history (PROTOCOL §3.3 ◆3)", () => {
  /** The plain model of an engine member: Model's lineage plus unanchored counts and partial members. */
  class EngineModel extends Model {
    unanchored = 0
    unanchoredRemovals = 0
    unknownRemovals = 0
    readonly partial = new Set<string>()

    /** "skipped" when the parent is unknown, else whether Model.store accepted it. */
    storeEngine(
      member: string,
      external: ReadonlyArray<bigint>,
      local: ReadonlyArray<bigint>,
      parent: bigint | undefined
    ): "stored" | "skipped" | "invalid" {
      if (parent !== undefined && !(this.lineage.get(member)?.has(parent) ?? false)) {
        this.unanchored += external.length
        this.partial.add(member)
        return "skipped"
      }
      return this.store(member, external, local, parent) ? "stored" : "invalid"
    }

    removeEngine(member: string, external: ReadonlyArray<bigint>): void {
      const lineage = this.lineage.get(member)
      for (const e of external) {
        if (lineage?.delete(e) === true) continue
        if (this.partial.has(member)) this.unanchoredRemovals++
        else this.unknownRemovals++
      }
    }

    override clear(member: string): void {
      super.clear(member)
      this.partial.delete(member)
    }
  }

  it("agrees with a plain model: unanchored blocks are skipped and counted, history is partial until a clear", () => {
    const op = fc.oneof(
      {
        weight: 4,
        arbitrary: fc.record({
          kind: fc.constant("store" as const),
          member: fc.nat({ max: 2 }),
          blocks: fc.array(fc.tuple(fc.bigInt({ min: 1n, max: 40n }), fc.bigInt({ min: 1n, max: 4n })), {
            minLength: 1,
            maxLength: 4
          }),
          parent: fc.oneof(fc.constant("none" as const), fc.nat(), fc.constant("unknown" as const))
        })
      },
      {
        weight: 2,
        arbitrary: fc.record({
          kind: fc.constant("remove" as const),
          member: fc.nat({ max: 2 }),
          external: fc.array(fc.bigInt({ min: 1n, max: 60n }), { maxLength: 4 })
        })
      },
      fc.record({ kind: fc.constant("clear" as const), member: fc.nat({ max: 2 }) }),
      fc.record({ kind: fc.constant("mark" as const), member: fc.nat({ max: 2 }) }),
      fc.record({ kind: fc.constant("replace" as const), member: fc.nat({ max: 2 }) })
    )
    fc.assert(
      fc.property(fc.array(op, { minLength: 20, maxLength: 60 }), (ops) => {
        const state = new CanonicalCkfState(ckfConfig(4096))
        const model = new EngineModel()
        // What each member was sent since its last clear, in order: a replay of its buffer.
        const history = new Map<string, Array<CkfEvent>>()
        for (const o of ops) {
          const [workerId, dpRank] = MEMBERS[o.member]!
          const member = `${workerId}/${dpRank}`
          const log = history.get(member) ?? []
          history.set(member, log)
          if (o.kind === "store") {
            const external = o.blocks.map(([e]) => e)
            const local = o.blocks.map(([, l]) => l)
            const held = [...(model.lineage.get(member)?.keys() ?? [])]
            const parent =
              o.parent === "none"
                ? undefined
                : o.parent === "unknown" || held.length === 0
                  ? 999n
                  : held[o.parent % held.length]
            const event = engineStored(workerId, dpRank, external, local, parent)
            const expected = model.storeEngine(member, external, local, parent)
            const outcome = state.applyEvent(event)
            expect(outcome.firstError === undefined).toBe(expected !== "invalid")
            expect(outcome.unanchoredBlocks).toBe(expected === "skipped" ? external.length : 0)
            if (expected !== "invalid") log.push(event)
          } else if (o.kind === "remove") {
            model.removeEngine(member, o.external)
            state.applyEvent(removed(workerId, dpRank, o.external))
            log.push(removed(workerId, dpRank, o.external))
          } else if (o.kind === "clear") {
            model.clear(member)
            state.applyEvent(cleared(workerId, dpRank))
            log.length = 0
          } else if (o.kind === "mark") {
            model.partial.add(member)
            state.markPartial(workerId, dpRank)
          } else {
            // The member replaced from a replay of everything it was sent since its last clear: the
            // same blocks are skipped again, and its history is partial exactly when some are.
            model.partial.delete(member)
            const replay = new EngineModel()
            for (const event of log) {
              const data = event.data
              if (data._tag === "Stored") {
                const external = hashPairsToBigInts(data.blockHashes)
                const local = hashPairsToBigInts(data.tokensHashes!)
                const parent =
                  data.parentHash === undefined ? undefined : hashPairsToBigInts(data.parentHash)[0]
                replay.storeEngine(member, external, local, parent)
              } else if (data._tag === "Removed") replay.remove(member, hashPairsToBigInts(data.blockHashes))
            }
            model.unanchored += replay.unanchored
            if (replay.partial.has(member)) model.partial.add(member)
            expect(state.replaceRanksFromEvents([{ workerId, dpRank, events: [...log] }])).not.toBeInstanceOf(
              Error
            )
          }
          for (const [w, r] of MEMBERS) {
            const owned = model.owned(`${w}/${r}`)
            expect(state.memberBlockCount(w, r)).toBe(owned.size)
            for (const c of owned) expect(state.owns(w, r, c)).toBe(true)
          }
          expect(state.partialMembers().map((m) => `${m.workerId}/${m.dpRank}`)).toEqual(
            MEMBERS.map(([w, r]) => `${w}/${r}`).filter((m) => model.partial.has(m))
          )
        }
        const stats = state.stats().aggregation
        expect(stats.unanchoredBlocks).toBe(model.unanchored)
        expect(stats.unanchoredRemovals).toBe(model.unanchoredRemovals)
        expect(stats.unknownRemovals).toBe(model.unknownRemovals)
        expect(stats.parentNotFound).toBe(0)
      }),
      { numRuns: 300 }
    )
  })

  it("a late join: a prompt whose chain is known is exact at once; children of unseen blocks are skipped", () => {
    const state = new CanonicalCkfState(ckfConfig(4096))
    const local = hashPairsToBigInts(localBlockHashes(range(100, 148), 16))
    const canon = hashPairsToBigInts(sequenceHashes(hashPairs(local)))
    // The engine stored 0xa1 before the relay joined; its child and grandchild arrive now.
    const child = state.applyEvent(engineStored("7001", 0, [0xa2n], [local[1]!], 0xa1n))
    expect(child).toMatchObject({ firstError: undefined, unanchoredBlocks: 1 })
    expect(state.applyEvent(engineStored("7001", 0, [0xa3n], [local[2]!], 0xa2n)).unanchoredBlocks).toBe(1)
    expect(state.memberBlockCount("7001", 0)).toBe(0)
    expect(state.partialMembers()).toEqual([{ workerId: "7001", dpRank: 0 }])
    // A removal of the block stored before the join is expected, not an unknown removal.
    expect(state.applyEvent(removed("7001", 0, [0xa1n])).unknownRemovals).toBe(0)
    // A new prompt, stored whole after the join, is at its canonical addresses.
    state.applyEvent(engineStored("7001", 0, [0xb1n, 0xb2n, 0xb3n], local))
    for (const c of canon) expect(state.contains(c)).toBe(true)
    expect(state.stats().aggregation).toMatchObject({
      unanchoredBlocks: 2,
      unanchoredRemovals: 1,
      unknownRemovals: 0
    })
    // A Dynamo source's event (no skipUnanchored) keeps the seed's rule.
    expect(state.applyEvent(stored("7002", 0, [0xc2n], [local[1]!], 0xc1n)).firstError).toBe(
      "ParentBlockNotFound"
    )
    // AllBlocksCleared makes the engine's history complete again.
    state.applyEvent(cleared("7001", 0))
    expect(state.partialMembers()).toEqual([])
  })
})
