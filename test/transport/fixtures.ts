/** Shared generators and helpers of the transport tests. */

import fc from "fast-check"
import type { StorageTier } from "../../src/ckf/events.js"
import { hashPairs, hashPairsToBigInts } from "../../src/ckf/u64.js"
import type { KvCacheEventData, RouterEvent } from "../../src/protocol/Events.js"

export const TIERS: ReadonlyArray<StorageTier> = ["device", "host_pinned", "disk", "external"]

export const u64Arb = fc.bigInt({ min: 0n, max: 0xffff_ffff_ffff_ffffn })
/** Mostly full-width u64s, with small values and edges mixed in. */
export const hashArb = fc.oneof(
  u64Arb,
  fc.bigInt({ min: 0n, max: 300n }),
  fc.constantFrom(0n, 0x7fn, 0x80n, 0xffn, 0xffff_ffffn, 0x1_0000_0000n, 2n ** 63n, 2n ** 64n - 1n)
)

const workerIdArb = fc.oneof(
  fc.nat({ max: 100_000 }).map(String),
  u64Arb.map((v) => v.toString())
)

const dataArb: fc.Arbitrary<KvCacheEventData> = fc.oneof(
  fc
    .record({
      hashes: fc.array(hashArb, { maxLength: 12 }),
      parent: fc.option(hashArb, { nil: undefined }),
      start: fc.option(fc.nat({ max: 0xffff_ffff }), { nil: undefined })
    })
    .map(({ hashes, parent, start }) => ({
      _tag: "Stored" as const,
      blockHashes: hashPairs(hashes),
      tokensHashes: hashPairs(hashes.map((h) => h ^ 0x5555n)),
      parentHash: parent === undefined ? undefined : hashPairs([parent]),
      startPosition: start
    })),
  fc
    .array(hashArb, { maxLength: 12 })
    .map((hashes) => ({ _tag: "Removed" as const, blockHashes: hashPairs(hashes) })),
  fc.constant({ _tag: "Cleared" as const })
)

export const routerEventArb: fc.Arbitrary<RouterEvent> = fc.record({
  workerId: workerIdArb,
  dpRank: fc.nat({ max: 0xffff_ffff }),
  eventId: fc.oneof(fc.nat({ max: 1000 }), fc.integer({ min: 0, max: Number.MAX_SAFE_INTEGER })),
  storageTier: fc.constantFrom(...TIERS),
  data: dataArb
})

/** A plain, comparable view of events (hash pairs as bigints). */
export const plain = (events: ReadonlyArray<RouterEvent>): Array<unknown> =>
  events.map((event) => {
    const data = event.data
    return {
      workerId: event.workerId,
      dpRank: event.dpRank,
      eventId: event.eventId,
      storageTier: event.storageTier,
      data:
        data._tag === "Cleared"
          ? { _tag: "Cleared" }
          : data._tag === "Removed"
            ? { _tag: "Removed", blockHashes: hashPairsToBigInts(data.blockHashes) }
            : {
                _tag: "Stored",
                blockHashes: hashPairsToBigInts(data.blockHashes),
                tokensHashes:
                  data.tokensHashes === undefined ? undefined : hashPairsToBigInts(data.tokensHashes),
                parentHash:
                  data.parentHash === undefined ? undefined : hashPairsToBigInts(data.parentHash)[0],
                startPosition: data.startPosition
              }
    }
  })

/** Block hashes of every Stored event, as bigints. */
export const storedHashes = (events: ReadonlyArray<RouterEvent>): Array<bigint> =>
  events.flatMap((event) => (event.data._tag === "Stored" ? hashPairsToBigInts(event.data.blockHashes) : []))
