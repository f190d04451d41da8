/**
 * KV cache events as the relay carries them: one `RouterEvent` per ordered mutation of one
 * (worker, dp rank). Block hashes stay in hash pairs (`Uint32Array` `[hi, lo]*`) from the wire
 * decoder to the CKF core, so the apply path never allocates a BigInt per block.
 *
 * Also why input is dropped or skipped, shared by the transports that detect it and the
 * diagnostics that count it (`/v1/stats`, `kv_dc_relay_ingest_*_total{reason}`).
 */

import type { CkfEvent, StorageTier } from "../ckf/events.js"
import { hashPairs } from "../ckf/u64.js"

/** A worker id: the canonical decimal text of a u64 (no sign, no leading zeros). */
export type WorkerId = string
/** A data-parallel rank (u32). */
export type DpRank = number

/** A Stored event's data: the blocks stored, their tokens hashes and their parent. */
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
  /** A tokens-less host or disk copy named by external hashes alone (`CkfStoredData`). */
  readonly resolveThroughLineage?: boolean | undefined
}

/** A Removed event's data: the blocks removed. */
export interface RemovedData {
  readonly _tag: "Removed"
  readonly blockHashes: Uint32Array
}

/** A Cleared event's data: every block of the rank is gone. */
export interface ClearedData {
  readonly _tag: "Cleared"
}

/** What a KV cache event says happened. */
export type KvCacheEventData = StoredData | RemovedData | ClearedData

/** One KV cache event of a worker rank, as the relay ingests it (PROTOCOL §3.1). */
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

/** A Removed event of `worker`'s rank (tests and simulators). */
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

/** A Cleared event of `worker`'s rank (tests and simulators). */
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

/** Why a message was dropped; counted per source (or per subscription when unattributable). */
export type MalformedReason =
  | "frame-count"
  | "publisher-id-width"
  | "sequence-width"
  | "sequence-range"
  | "frame-header"
  | "frame-version"
  | "frame-length"
  | "envelope"
  | "payload"
  | "topic"
  | "sequence-jump"
  | "hash"
  | "block-size"
  | "token-ids"
  | "token-count"
  | "lora"
  | "field-type"

/** Every reason a message is refused as malformed, in the order metrics list them. */
export const MALFORMED_REASONS: ReadonlyArray<MalformedReason> = [
  "frame-count",
  "publisher-id-width",
  "sequence-width",
  "sequence-range",
  "frame-header",
  "frame-version",
  "frame-length",
  "envelope",
  "payload",
  "topic",
  "sequence-jump",
  "hash",
  "block-size",
  "token-ids",
  "token-count",
  "lora",
  "field-type"
]

/** Why an engine event was skipped on purpose (PROTOCOL §3.2): it is not this worker's device cache. */
export type SkipReason = "medium" | "locality" | "ownership" | "group" | "namespace"
/** Every reason an event is skipped, in the order metrics list them. */
export const SKIP_REASONS: ReadonlyArray<SkipReason> = [
  "medium",
  "locality",
  "ownership",
  "group",
  "namespace"
]
/** Events skipped so far, by reason. */
export type SkipCounts = Readonly<Record<SkipReason, number>>

/**
 * Why a message or batch was dropped whole (`kv_dc_relay_ingest_dropped_batches_total{reason}`):
 * - `stale`: an engine seq below the source's last accepted one (not a restart at 0);
 * - `malformed`: rejected by the decoder (`kv_dc_relay_ingest_malformed_messages_total` says why);
 * - `unknown-publisher`: its publisher id is bound to no active source (a Dynamo envelope from a
 *   publisher discovery does not list, or a source that was just retired);
 * - `foreign-payload`: its events name another worker or rank than the source advertises;
 * - `backwards`: a commit group whose event id is at or below the rank's last admitted one;
 * - `fenced`: it reached a rank that waits for a reset, or a binding that was replaced;
 * - `handler-failed`: the relay failed while handling it (logged with the cause).
 */
export type DropReason =
  | "stale"
  | "malformed"
  | "unknown-publisher"
  | "foreign-payload"
  | "backwards"
  | "fenced"
  | "handler-failed"

/** Every reason a message or batch is dropped whole, in the order metrics list them. */
export const DROP_REASONS: ReadonlyArray<DropReason> = [
  "stale",
  "malformed",
  "unknown-publisher",
  "foreign-payload",
  "backwards",
  "fenced",
  "handler-failed"
]

/** Why a ZMTP connection to an event publisher was closed (`kv_dc_relay_zmtp_protocol_errors_total{reason}`). */
export type ZmtpErrorReason =
  /** The peer's first 10 bytes are not a ZMTP signature (not a ZeroMQ socket). */
  | "greeting-signature"
  /** A ZMTP major version below 3 (libzmq before 4.0). */
  | "greeting-version"
  /** A security mechanism other than NULL (CURVE, PLAIN, GSSAPI or unknown). */
  | "mechanism"
  /** A READY command that does not parse, or a message or unknown command before it. */
  | "handshake"
  /** The peer's `Socket-Type` is not PUB or XPUB. */
  | "socket-type"
  /** The peer sent an ERROR command. */
  | "peer-error"
  /** No READY within the handshake interval. */
  | "handshake-timeout"
  /** Reserved frame flag bits set, or a command frame with MORE or inside a multipart message. */
  | "frame-flags"
  /** A frame above the subscriber's frame limit. */
  | "frame-size"
  /** A command frame whose body does not hold its own name. */
  | "command"

/** Every reason a ZMTP connection is refused, in the order metrics list them. */
export const ZMTP_ERROR_REASONS: ReadonlyArray<ZmtpErrorReason> = [
  "greeting-signature",
  "greeting-version",
  "mechanism",
  "handshake",
  "socket-type",
  "peer-error",
  "handshake-timeout",
  "frame-flags",
  "frame-size",
  "command"
]
