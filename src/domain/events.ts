/**
 * KV cache events as the relay carries them: one `RouterEvent` per ordered mutation of one
 * (worker, dp rank). Block hashes stay in hash pairs (`Uint32Array` `[hi, lo]*`) from the wire
 * decoder to the CKF core, so the apply path never allocates a BigInt per block.
 */

import type { CkfEvent, StorageTier } from "../ckf/events.js"
import { hashPairs } from "../ckf/u64.js"

export type { StorageTier } from "../ckf/events.js"

/** A worker id: the canonical decimal text of a u64 (no sign, no leading zeros). */
export type WorkerId = string
/** A data-parallel rank (u32). */
export type DpRank = number

export interface StoredData {
  readonly _tag: "Stored"
  /** The engine's chained block hashes, in chain order. */
  readonly blockHashes: Uint32Array
  /** Dynamo's per-block token hashes (same length as `blockHashes`), when the source sent them. */
  readonly tokensHashes: Uint32Array | undefined
  /** Hash pair of the block preceding the first stored block; undefined at the root. */
  readonly parentHash: Uint32Array | undefined
  readonly startPosition: number | undefined
  /** Engine sources: an unknown parent skips the blocks as unanchored (`CkfStoredData`). */
  readonly skipUnanchored?: boolean | undefined
}

export interface RemovedData {
  readonly _tag: "Removed"
  readonly blockHashes: Uint32Array
}

export interface ClearedData {
  readonly _tag: "Cleared"
}

export type KvCacheEventData = StoredData | RemovedData | ClearedData

export interface RouterEvent extends CkfEvent {
  readonly workerId: WorkerId
  readonly dpRank: DpRank
  /**
   * Dense per-(worker, rank) stream position. Carried as a number: ids are counters from 0/1 and
   * the decoders reject values above 2^53 rather than lose precision.
   */
  readonly eventId: number
  readonly storageTier: StorageTier
  readonly data: KvCacheEventData
}

/** Number of blocks an event carries: the weight of its payload permits. */
export const eventPayloadWeight = (event: RouterEvent): number => {
  const data = event.data
  return data._tag === "Cleared" ? 1 : Math.max(1, data.blockHashes.length >>> 1)
}

const workerText = (worker: WorkerId | bigint | number): WorkerId =>
  typeof worker === "string" ? worker : BigInt.asUintN(64, BigInt(worker)).toString()

/** Convenience constructor of a device-tier Stored event (tests, demos, tree dumps). */
export const storedEvent = (
  worker: WorkerId | bigint | number,
  dpRank: DpRank,
  eventId: number,
  hashes: ReadonlyArray<bigint | number>,
  options: {
    readonly parentHash?: bigint
    readonly tokensHashes?: ReadonlyArray<bigint | number>
    readonly storageTier?: StorageTier
  } = {}
): RouterEvent => ({
  workerId: workerText(worker),
  dpRank,
  eventId,
  storageTier: options.storageTier ?? "device",
  data: {
    _tag: "Stored",
    blockHashes: hashPairs(hashes),
    tokensHashes: hashPairs(options.tokensHashes ?? hashes),
    parentHash: options.parentHash === undefined ? undefined : hashPairs([options.parentHash]),
    startPosition: undefined
  }
})

export const removedEvent = (
  worker: WorkerId | bigint | number,
  dpRank: DpRank,
  eventId: number,
  hashes: ReadonlyArray<bigint | number>,
  storageTier: StorageTier = "device"
): RouterEvent => ({
  workerId: workerText(worker),
  dpRank,
  eventId,
  storageTier,
  data: { _tag: "Removed", blockHashes: hashPairs(hashes) }
})

export const clearedEvent = (
  worker: WorkerId | bigint | number,
  dpRank: DpRank,
  eventId: number
): RouterEvent => ({
  workerId: workerText(worker),
  dpRank,
  eventId,
  storageTier: "device",
  data: { _tag: "Cleared" }
})
