import fc from "fast-check"
import { describe, expect, it } from "vitest"
import { bucketDelta, prepare } from "../../src/ckf/addressing.js"
import { bucketCountFor, ckfConfig } from "../../src/ckf/config.js"
import { KvCacheEventError } from "../../src/ckf/errors.js"
import type { CkfEvent, StorageTier } from "../../src/ckf/events.js"
import { eventFailurePoint, failureDisposition } from "../../src/ckf/failure.js"
import { laneRngSeed, SplitMix64, stickyWorker } from "../../src/ckf/splitmix.js"
import { type DcCkfPublicationBatch, DcCkfState } from "../../src/ckf/state.js"
import { hashPairs } from "../../src/ckf/u64.js"

const stored = (
  workerId: string,
  dpRank: number,
  hashes: Array<bigint | number>,
  tier: StorageTier = "device"
): CkfEvent => ({
  workerId,
  dpRank,
  storageTier: tier,
  data: { _tag: "Stored", blockHashes: hashPairs(hashes) }
})
const removed = (
  workerId: string,
  dpRank: number,
  hashes: Array<bigint | number>,
  tier: StorageTier = "device"
): CkfEvent => ({
  workerId,
  dpRank,
  storageTier: tier,
  data: { _tag: "Removed", blockHashes: hashPairs(hashes) }
})
const cleared = (workerId: string, dpRank: number, tier: StorageTier = "device"): CkfEvent => ({
  workerId,
  dpRank,
  storageTier: tier,
  data: { _tag: "Cleared" }
})

/** A consumer's view: the snapshot words plus every published image applied in order. */
const applyBatch = (words: Uint32Array, batch: DcCkfPublicationBatch | undefined): void => {
  if (batch === undefined) return
  const images = batch.images
  for (let i = 0; i < images.length; i += 3) {
    words[2 * images[i]!] = images[i + 1]!
    words[2 * images[i]! + 1] = images[i + 2]!
  }
}

describe("reference vectors", () => {
  it("sizes tables by the reference rule", () => {
    const table: Array<[number, number]> = [
      [1, 2],
      [2, 2],
      [3, 2],
      [6, 2],
      [7, 4],
      [32, 16],
      [64, 32],
      [128, 64],
      [4096, 2048],
      [1048576, 524288]
    ]
    for (const [expected, buckets] of table) expect(bucketCountFor(expected)).toBe(buckets)
    expect(() => bucketCountFor(0)).toThrow(/greater than zero/)
    expect(() => bucketCountFor(2 ** 40)).toThrow(/CBI1 limit/)
  })

  it("addresses the reference hashes", () => {
    expect(prepare(0n, 16)).toEqual({ fingerprint: 0xb49e, bucketA: 14, bucketB: 15 })
    expect(prepare(1n, 16)).toEqual({ fingerprint: 0xbabf, bucketA: 15, bucketB: 13 })
    expect(prepare(11n, 16)).toEqual({ fingerprint: 0xd6f8, bucketA: 5, bucketB: 6 })
    expect(prepare(0x0123456789abcdefn, 16)).toEqual({ fingerprint: 0x7d61, bucketA: 7, bucketB: 5 })
    expect(prepare(0xffffffffffffffffn, 16)).toEqual({ fingerprint: 0x500a, bucketA: 9, bucketB: 0 })
    expect(prepare(0n, 524288)).toEqual({ fingerprint: 0xb49e, bucketA: 394334, bucketB: 337982 })
    expect(prepare(1n, 524288)).toEqual({ fingerprint: 0xbabf, bucketA: 129663, bucketB: 522653 })
    expect(prepare(11n, 524288)).toEqual({ fingerprint: 0xd6f8, bucketA: 410005, bucketB: 65990 })
    expect(prepare(0x0123456789abcdefn, 524288)).toEqual({
      fingerprint: 0x7d61,
      bucketA: 236423,
      bucketB: 195253
    })
    expect(prepare(0xffffffffffffffffn, 524288)).toEqual({
      fingerprint: 0x500a,
      bucketA: 117321,
      bucketB: 453072
    })
    expect(bucketDelta(1, 16)).toBe(11)
    expect(bucketDelta(0xffff, 524288)).toBe(158862)
    // Two buckets: the delta is always 1.
    for (let fp = 1; fp < 4096; fp++) expect(bucketDelta(fp, 2)).toBe(1)
  })

  it("reproduces the SplitMix64 and sticky-worker vectors", () => {
    expect(laneRngSeed(0x5deece66d1b54a33n, 0)).toBe(0xc050d0a84124db84n)
    const rng = new SplitMix64(0xc050d0a84124db84n)
    expect([rng.nextBigInt(), rng.nextBigInt(), rng.nextBigInt()]).toEqual([
      0x8d0956e040739722n,
      0x116c72c2242d8178n,
      0x5ecb896fe0120182n
    ])
    expect(stickyWorker(17n, 3, 4)).toBe(2)
    expect(stickyWorker(11n, 3, 1)).toBe(0)
    expect(Array.from({ length: 16 }, (_, lane) => stickyWorker(0xc0decafen, lane, 4))).toEqual([
      3, 2, 1, 1, 0, 3, 3, 1, 1, 2, 2, 1, 1, 1, 2, 3
    ])
  })

  it("lays out hashes 1, 2, 3 in 16 buckets exactly as the reference model", () => {
    const state = new DcCkfState(ckfConfig(32))
    state.applyEvent(stored("1", 0, [1, 2, 3]))
    const nonzero: Array<[number, string]> = []
    for (let b = 0; b < 16; b++) if (state.wordAt(b) !== 0n) nonzero.push([b, state.wordAt(b).toString(16)])
    expect(nonzero).toEqual([
      [4, "c24a"],
      [5, "8dc"],
      [15, "babf"]
    ])
  })

  it("admits 8 of 32 hashes into 2 buckets with kicks and rollback", () => {
    const state = new DcCkfState(ckfConfig(1))
    const outcome = state.applyEvent(
      stored(
        "1",
        0,
        Array.from({ length: 32 }, (_, i) => i + 1)
      )
    )
    expect(outcome.firstError).toBe("CapacityExhausted")
    const aggregation = state.stats().aggregation
    expect(aggregation.uniqueBlockCount).toBe(8)
    expect(aggregation.capacityFailures).toBe(24)
    expect(state.wordAt(0)).toBe(0x62dcd73d63a2c24an)
    expect(state.wordAt(1)).toBe(0x75706fc208dcbabfn)
  })
})

describe("DcCkfState transitions", () => {
  it("inserts on 0→1 only and removes on 1→0 only", () => {
    const state = new DcCkfState(ckfConfig(64))
    state.applyEvent(stored("1", 0, [7]))
    const afterFirst = state.snapshotWords()
    state.applyEvent(stored("2", 0, [7]))
    expect(state.snapshotWords()).toEqual(afterFirst)
    expect(state.refcount(7n)).toBe(2)
    state.applyEvent(removed("1", 0, [7]))
    expect(state.snapshotWords()).toEqual(afterFirst)
    expect(state.refcount(7n)).toBe(1)
    expect(state.contains(7n)).toBe(true)
    state.applyEvent(removed("2", 0, [7]))
    expect(state.refcount(7n)).toBe(0)
    expect(state.contains(7n)).toBe(false)
    expect(state.stats().aggregation.occupiedBucketCount).toBe(0)
  })

  it("takes the last kick of the bound: with max_kicks 1, an insert that needs one relocation succeeds", () => {
    const config = ckfConfig(32, { maxKicks: 1 })
    const state = new DcCkfState(config)
    const n = state.bucketCount
    const at = (h: bigint) => prepare(h, n, config.seed)
    let next = 1n
    const search = (accept: (p: ReturnType<typeof at>) => boolean): bigint => {
      for (; ; next++) if (accept(at(next))) return next++
    }
    const target = search((p) => p.bucketA !== p.bucketB)
    const { bucketA: a, bucketB: b } = at(target)
    // Four fingerprints fill each of the target's buckets; every one of them could move to an
    // empty bucket elsewhere, so a single kick makes room.
    const fillers = [a, a, a, a, b, b, b, b].map((home) =>
      search((p) => p.bucketA === home && p.bucketB !== a && p.bucketB !== b)
    )
    for (const h of fillers) expect(state.store("1", 0, h)).toBe(true)
    expect(state.store("2", 0, target)).toBe(true)
    expect(state.stats().aggregation.capacityFailures).toBe(0)
    for (const h of [...fillers, target]) expect(state.contains(h)).toBe(true)
  })

  it("a remaining owner still owns a hash after its primary owner left", () => {
    const state = new DcCkfState(ckfConfig(64))
    state.applyEvent(stored("1", 0, [7, 8]))
    state.applyEvent(stored("2", 0, [7]))
    state.applyEvent({ workerId: "1", dpRank: 0, storageTier: "device", data: { _tag: "Cleared" } })
    expect(state.refcount(7n)).toBe(1)
    expect(state.owns("2", 0, 7n)).toBe(true)
    expect(state.owns("1", 0, 7n)).toBe(false)
    expect(state.store("2", 0, 7n)).toBe(false)
    expect(state.remove("2", 0, 7n)).toBe(true)
    expect(state.contains(7n)).toBe(false)
  })

  it("treats a duplicate store as a silent no-op and an unknown removal as a counted no-op", () => {
    const state = new DcCkfState(ckfConfig(64))
    expect(state.store("1", 0, 5n)).toBe(true)
    expect(state.store("1", 0, 5n)).toBe(false)
    const outcome = state.applyEvent(removed("1", 0, [5, 6]))
    expect(outcome.unknownRemovals).toBe(1)
    // A removal by a non-owner never deletes by fingerprint.
    state.applyEvent(stored("1", 0, [9]))
    expect(state.applyEvent(removed("3", 0, [9])).unknownRemovals).toBe(1)
    expect(state.contains(9n)).toBe(true)
    expect(state.stats().aggregation.unknownRemovals).toBe(2)
  })

  it("ignores non-device tiers without counting a pending event, but clears on any tier", () => {
    const state = new DcCkfState(ckfConfig(64, { publishEveryNEvents: 16 }))
    const outcome = state.applyEvent(stored("1", 0, [1], "host_pinned"))
    expect(outcome.publicationBoundary).toBe(false)
    expect(state.pendingEventCount()).toBe(0)
    expect(state.contains(1n)).toBe(false)
    state.applyEvent(stored("1", 0, [1]))
    state.applyEvent(cleared("1", 0, "disk"))
    expect(state.pendingEventCount()).toBe(2)
    expect(state.memberBlockCount("1", 0)).toBe(0)
  })

  it("clears only the emitting (worker, dp rank)", () => {
    const state = new DcCkfState(ckfConfig(64))
    state.applyEvent(stored("1", 0, [1, 2]))
    state.applyEvent(stored("1", 1, [2, 3]))
    state.applyEvent(stored("2", 0, [1]))
    state.applyEvent(cleared("1", 0))
    expect(state.memberCounts()).toEqual([
      { workerId: "1", dpRank: 1, count: 2 },
      { workerId: "2", dpRank: 0, count: 1 }
    ])
    expect(state.refcount(1n)).toBe(1)
    expect(state.refcount(2n)).toBe(1)
    for (const h of [1n, 2n, 3n]) expect(state.contains(h)).toBe(true)
  })

  it("suppresses a net reversion inside one window", () => {
    const state = new DcCkfState(ckfConfig(64, { publishEveryNEvents: 2 }))
    expect(state.applyEvent(stored("1", 0, [7])).publication).toBeUndefined()
    const outcome = state.applyEvent(removed("1", 0, [7]))
    expect(outcome.publicationBoundary).toBe(true)
    expect(outcome.publication).toBeUndefined()
    const stats = state.stats().publication
    expect(stats.netRevertedBuckets).toBe(1)
    expect(stats.emittedImages).toBe(0)
    expect(state.hasPendingPublication()).toBe(false)
  })

  it("publishes at publish_every_n_events boundaries and on flush", () => {
    const state = new DcCkfState(ckfConfig(64, { publishEveryNEvents: 3 }))
    expect(state.applyEvent(stored("1", 0, [1])).publicationBoundary).toBe(false)
    expect(state.applyEvent(stored("1", 0, [2])).publicationBoundary).toBe(false)
    const third = state.applyEvent(stored("1", 0, [3]))
    expect(third.publicationBoundary).toBe(true)
    expect(third.publication?.imageCount).toBeGreaterThan(0)
    state.applyEvent(stored("1", 0, [4]))
    expect(state.flush()?.imageCount).toBe(1)
    expect(state.flush()).toBeUndefined()
  })

  it("emits absolute images in first-touch order with unique buckets", () => {
    const state = new DcCkfState(ckfConfig(64, { publishEveryNEvents: 1000 }))
    const hashes = Array.from({ length: 40 }, (_, i) => BigInt(i * 7919 + 3))
    state.applyEvent(stored("1", 0, hashes))
    state.applyEvent(removed("1", 0, hashes.slice(0, 10)))
    const batch = state.flush()!
    const seen = new Set<number>()
    for (let i = 0; i < batch.imageCount; i++) {
      expect(seen.has(batch.bucketAt(i))).toBe(false)
      seen.add(batch.bucketAt(i))
      expect(batch.wordAt(i)).toBe(state.wordAt(batch.bucketAt(i)))
    }
  })

  it("returns the barrier tail separately from a snapshot that already contains it", () => {
    const state = new DcCkfState(ckfConfig(64, { publishEveryNEvents: 16 }))
    state.applyEvent(stored("1", 0, [1, 2, 3]))
    const barrier = state.barrierSnapshot()
    if (!("words" in barrier)) throw barrier
    expect(barrier.tail?.imageCount).toBeGreaterThan(0)
    expect(barrier.words).toEqual(state.snapshotWords())
    expect(state.hasPendingPublication()).toBe(false)
  })

  it("remove_rank drains regardless of cadence", () => {
    const state = new DcCkfState(ckfConfig(64, { publishEveryNEvents: 100 }))
    state.applyEvent(stored("4", 2, [10, 11]))
    state.flush()
    const batch = state.removeRank("4", 2)
    expect(batch).toBeDefined()
    expect(state.memberBlockCount("4", 2)).toBe(0)
    expect(state.stats().aggregation.uniqueBlockCount).toBe(0)
  })

  it("replace_ranks fails transactionally on capacity exhaustion (E=1, 100 hashes)", () => {
    const state = new DcCkfState(ckfConfig(1))
    state.applyEvent(stored("1", 0, [1]))
    const before = state.snapshotWords()
    const result = state.replaceRank("2", 0, hashPairs(Array.from({ length: 100 }, (_, i) => i + 100)))
    expect(result).toBeInstanceOf(KvCacheEventError)
    expect((result as KvCacheEventError).kind).toBe("CapacityExhausted")
    expect(state.snapshotWords()).toEqual(before)
    expect(state.memberCounts()).toEqual([{ workerId: "1", dpRank: 0, count: 1 }])
  })

  it("replacing one of two owners of a shared hash changes nothing physically", () => {
    const state = new DcCkfState(ckfConfig(64))
    state.applyEvent(stored("1", 0, [7]))
    state.applyEvent(stored("2", 0, [7]))
    const before = state.snapshotWords()
    expect(state.replaceRank("1", 0, hashPairs([7]))).toBeUndefined()
    expect(state.snapshotWords()).toEqual(before)
  })

  it("reports dispositions that keep commit domains distinct", () => {
    expect(failureDisposition(eventFailurePoint("CapacityExhausted"))).toMatchObject({
      action: "ContinueCapacityOmission",
      domain: "ProducerCore",
      commit: "KnownUnchanged",
      recoveryDomain: undefined
    })
    expect(failureDisposition(eventFailurePoint("AllocationFailed")).action).toBe("ReportResourceFailure")
    expect(failureDisposition(eventFailurePoint("OwnershipDegreeOverflow")).action).toBe("RejectSource")
    expect(failureDisposition(eventFailurePoint("IndexerInvariantViolation"))).toMatchObject({
      action: "FenceAndRebuildProducer",
      recoveryDomain: "ProducerCore"
    })
    expect(failureDisposition("ConsumerWorkerFailureMidApply").commit).toBe("Uncertain")
    expect(failureDisposition("InactiveSnapshotInstallFailure").action).toBe("RetrySnapshot")
  })

  it("rejects invalid configurations in the reference order", () => {
    expect(() => new DcCkfState(ckfConfig(0, { maxKicks: 0 }))).toThrow(/expected_blocks_per_dc/)
    expect(() => new DcCkfState(ckfConfig(1, { maxKicks: 4097, verificationWindow: 0 }))).toThrow(/max_kicks/)
    expect(() => new DcCkfState(ckfConfig(1, { verificationWindow: 9 }))).toThrow(/verification_window/)
    expect(() => new DcCkfState(ckfConfig(1, { publishEveryNEvents: 0 }))).toThrow(/publish_every_n_events/)
  })
})

// ------------------------------------------------------------------------------------------------
// Model-based properties

type Op =
  | { readonly kind: "store"; readonly member: number; readonly hashes: ReadonlyArray<number> }
  | { readonly kind: "remove"; readonly member: number; readonly hashes: ReadonlyArray<number> }
  | { readonly kind: "clear"; readonly member: number }
  | { readonly kind: "replace"; readonly member: number; readonly hashes: ReadonlyArray<number> }

const MEMBERS: ReadonlyArray<[string, number]> = [
  ["1", 0],
  ["1", 1],
  ["2", 0],
  ["18446744073709551615", 3]
]

// Hashes from a small pool so that members share hashes and removals hit tracked ones; the
// pool mixes tiny values (0, 1) with full-width ones.
const hashArb = fc.oneof(
  fc.integer({ min: 0, max: 40 }).map((n) => BigInt(n)),
  fc.integer({ min: 0, max: 40 }).map((n) => (BigInt(n) << 40n) ^ 0xfedcba9876543210n)
)
const hashesArb = fc.array(hashArb, { minLength: 0, maxLength: 6 })
const memberArb = fc.integer({ min: 0, max: MEMBERS.length - 1 })
const indicesArb = fc.array(fc.integer({ min: 0, max: 81 }), { minLength: 0, maxLength: 6 })
const opArb: fc.Arbitrary<Op> = fc.oneof(
  {
    weight: 5,
    arbitrary: fc.record({ kind: fc.constant("store" as const), member: memberArb, hashes: indicesArb })
  },
  {
    weight: 3,
    arbitrary: fc.record({ kind: fc.constant("remove" as const), member: memberArb, hashes: indicesArb })
  },
  { weight: 1, arbitrary: fc.record({ kind: fc.constant("clear" as const), member: memberArb }) },
  {
    weight: 1,
    arbitrary: fc.record({ kind: fc.constant("replace" as const), member: memberArb, hashes: indicesArb })
  }
)

// Ops carry indices into a hash table so that shrinking stays readable.
const HASH_TABLE: Array<bigint> = []
for (let n = 0; n <= 40; n++) HASH_TABLE.push(BigInt(n), (BigInt(n) << 40n) ^ 0xfedcba9876543210n)

const nonEmptyBuckets = (words: Uint32Array): number => {
  let n = 0
  for (let b = 0; b < words.length; b += 2) if ((words[b]! | words[b + 1]!) !== 0) n++
  return n
}

describe("DcCkfState against a Map/Set model", () => {
  it("keeps refcounts exact, tracked hashes present, and consumer words identical", () => {
    fc.assert(
      fc.property(
        fc.array(opArb, { minLength: 1, maxLength: 60 }),
        fc.constantFrom(8, 64, 256),
        fc.integer({ min: 1, max: 4 }),
        (ops, expected, cadence) => {
          const state = new DcCkfState(ckfConfig(expected, { publishEveryNEvents: cadence }))
          const model = new Map<string, Set<bigint>>()
          const consumer = state.snapshotWords()
          for (const op of ops) {
            const [workerId, dpRank] = MEMBERS[op.member]!
            const key = `${workerId}/${dpRank}`
            const owned = model.get(key) ?? new Set<bigint>()
            switch (op.kind) {
              case "store": {
                for (const index of op.hashes) {
                  const hash = HASH_TABLE[index]!
                  const result = state.store(workerId, dpRank, hash)
                  if (result === true) owned.add(hash)
                  else if (result instanceof KvCacheEventError) expect(result.kind).toBe("CapacityExhausted")
                  else expect(owned.has(hash)).toBe(true)
                }
                break
              }
              case "remove": {
                for (const index of op.hashes) {
                  const hash = HASH_TABLE[index]!
                  expect(state.remove(workerId, dpRank, hash)).toBe(owned.delete(hash))
                }
                break
              }
              case "clear": {
                expect(state.removeMember(workerId, dpRank)).toBeUndefined()
                owned.clear()
                break
              }
              case "replace": {
                const hashes = op.hashes.map((i) => HASH_TABLE[i]!)
                const result = state.replaceRank(workerId, dpRank, hashPairs(hashes))
                if (result instanceof Error) {
                  expect((result as KvCacheEventError).kind).toBe("CapacityExhausted")
                } else {
                  owned.clear()
                  for (const h of hashes) owned.add(h)
                  applyBatch(consumer, result)
                }
                break
              }
            }
            if (owned.size === 0) model.delete(key)
            else model.set(key, owned)
            // The count of non-empty buckets is kept, not scanned: it must agree with a scan
            // both while the dirty window is pending and after the drain.
            expect(state.stats().aggregation.occupiedBucketCount).toBe(nonEmptyBuckets(state.snapshotWords()))
            if (op.kind !== "replace") applyBatch(consumer, state.drainPublication())
            expect(state.stats().aggregation.occupiedBucketCount).toBe(nonEmptyBuckets(state.snapshotWords()))
          }
          // Exact ownership equals the model.
          const refcounts = new Map<bigint, number>()
          for (const set of model.values()) for (const h of set) refcounts.set(h, (refcounts.get(h) ?? 0) + 1)
          const stats = state.stats().aggregation
          expect(stats.uniqueBlockCount).toBe(refcounts.size)
          expect(stats.memberCount).toBe(model.size)
          for (const [h, count] of refcounts) {
            expect(state.refcount(h)).toBe(count)
            // No false negatives for a tracked hash.
            expect(state.contains(h)).toBe(true)
          }
          for (const [workerId, dpRank] of MEMBERS) {
            const set = model.get(`${workerId}/${dpRank}`)
            expect(state.memberBlockCount(workerId, dpRank)).toBe(set?.size ?? 0)
          }
          // The filter holds exactly one fingerprint per tracked hash.
          let occupied = 0
          const words = state.snapshotWords()
          const slots = new Uint16Array(words.buffer)
          for (const s of slots) if (s !== 0) occupied++
          expect(occupied).toBe(refcounts.size)
          // A consumer fed the published images holds the producer's words.
          expect(consumer).toEqual(words)
        }
      ),
      { numRuns: 1500 }
    )
  })

  it("replace_ranks equals a rebuild of the same membership", () => {
    fc.assert(
      fc.property(
        fc.array(opArb, { minLength: 1, maxLength: 40 }),
        hashesArb,
        memberArb,
        (ops, replacement, member) => {
          const state = new DcCkfState(ckfConfig(256, { publishEveryNEvents: 1000 }))
          for (const op of ops) {
            const [workerId, dpRank] = MEMBERS[op.member]!
            if (op.kind === "store")
              state.applyEvent(
                stored(
                  workerId,
                  dpRank,
                  op.hashes.map((i) => HASH_TABLE[i]!)
                )
              )
            if (op.kind === "remove")
              state.applyEvent(
                removed(
                  workerId,
                  dpRank,
                  op.hashes.map((i) => HASH_TABLE[i]!)
                )
              )
            if (op.kind === "clear") state.applyEvent(cleared(workerId, dpRank))
          }
          state.flush()
          const consumer = state.snapshotWords()
          // A pending change still in the window must be merged into the replacement's batch.
          state.applyEvent(stored("9", 9, [123456789n]))
          const [workerId, dpRank] = MEMBERS[member]!
          const result = state.replaceRank(workerId, dpRank, hashPairs(replacement))
          expect(result).not.toBeInstanceOf(Error)
          applyBatch(consumer, result as DcCkfPublicationBatch | undefined)
          expect(consumer).toEqual(state.snapshotWords())

          // The same membership stored from scratch: same exact state, same member counts.
          const rebuilt = new DcCkfState(ckfConfig(256))
          for (const m of state.memberCounts()) {
            const pairs = state.memberHashes(m.workerId, m.dpRank)
            for (let i = 0; i < pairs.length; i += 2)
              rebuilt.storeHalves(m.workerId, m.dpRank, pairs[i]!, pairs[i + 1]!)
          }
          expect(rebuilt.memberCounts()).toEqual(state.memberCounts())
          expect(state.memberBlockCount(workerId, dpRank)).toBe(new Set(replacement).size)
          for (const h of replacement) {
            expect(state.owns(workerId, dpRank, h)).toBe(true)
            expect(state.contains(h)).toBe(true)
          }
          expect(state.stats().aggregation.uniqueBlockCount).toBe(
            rebuilt.stats().aggregation.uniqueBlockCount
          )
        }
      ),
      { numRuns: 500 }
    )
  })

  it("counts capacity omissions before any exact-state write", () => {
    fc.assert(
      fc.property(
        fc.uniqueArray(fc.bigInt({ min: 0n, max: (1n << 64n) - 1n }), { minLength: 10, maxLength: 80 }),
        (hashes) => {
          const state = new DcCkfState(ckfConfig(1, { maxKicks: 4 }))
          let omitted = 0
          for (const h of hashes) {
            const result = state.store("1", 0, h)
            if (result instanceof KvCacheEventError) {
              omitted++
              expect(state.owns("1", 0, h)).toBe(false)
              expect(state.refcount(h)).toBe(0)
              // A later removal of an omitted hash is an unknown no-op.
              expect(state.remove("1", 0, h)).toBe(false)
            } else {
              expect(state.contains(h)).toBe(true)
            }
          }
          expect(state.stats().aggregation.capacityFailures).toBe(omitted)
          expect(state.stats().aggregation.uniqueBlockCount).toBe(hashes.length - omitted)
          expect(state.stats().aggregation.uniqueBlockCount).toBeLessThanOrEqual(8)
        }
      ),
      { numRuns: 300 }
    )
  })
})
