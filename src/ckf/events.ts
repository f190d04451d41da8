/**
 * The mutation events the producer core consumes. The domain's `RouterEvent` is a structural
 * superset (event ids, parent hashes, token hashes); the core reads only what it needs.
 *
 * Block hashes are hash pairs: a `Uint32Array` `[hi0, lo0, hi1, lo1, …]`.
 */

/** Where a worker holds a block: only `device` blocks are indexed. */
export type StorageTier = "device" | "host_pinned" | "disk" | "external"

/**
 * The storage tier of an event's `medium`, as Dynamo's `StorageTier::from_kv_medium`
 * (`lib/kv-router/src/protocols.rs`) maps it (PROTOCOL §5.1 ◆3): absent, null, `"GPU"`,
 * `"DEVICE"` → device; `"CPU"`, `"CPU_PINNED"`, `"CPU_TIER1"` → host; `"CPU_TIER2"`, `"DISK"`,
 * `"NVME"`, `"STORAGE"` → disk; `"EXTERNAL"`, `"NETWORK"`, `"REMOTE"`, `"SHARED"` → external
 * (kept with the disk tier). An empty string counts as absent, as Dynamo's `normalize_medium`
 * (`lib/kv-router/src/zmq_wire/deserialize.rs`) reads it. Any other medium is `undefined`: the
 * event is skipped and counted. The match is exact (case-sensitive), as Dynamo's is.
 */
export const storageTierOfMedium = (medium: string | null | undefined): StorageTier | undefined => {
  if (medium === undefined || medium === null) return "device"
  switch (medium) {
    case "":
    case "GPU":
    case "DEVICE":
      return "device"
    case "CPU":
    case "CPU_PINNED":
    case "CPU_TIER1":
      return "host_pinned"
    case "CPU_TIER2":
    case "DISK":
    case "NVME":
    case "STORAGE":
      return "disk"
    case "EXTERNAL":
    case "NETWORK":
    case "REMOTE":
    case "SHARED":
      return "external"
    default:
      return undefined
  }
}

/** Blocks a rank stored, as hash pairs, with their parent. */
export interface CkfStoredData {
  readonly _tag: "Stored"
  /** The engine's (external) block hashes. */
  readonly blockHashes: Uint32Array
  /** The blocks' local (tokens) hashes; read by canonically addressed pools only. */
  readonly tokensHashes?: Uint32Array | undefined
  /** The external hash of the first block's parent; read by canonically addressed pools only. */
  readonly parentHash?: Uint32Array | undefined
  /**
   * What a canonically addressed pool does when the parent is not in the member's lineage: skip
   * the blocks and count them as unanchored (engine sources, whose history may start after the
   * engine did: PROTOCOL §3.3), instead of rejecting the event as `ParentBlockNotFound`.
   */
  readonly skipUnanchored?: boolean | undefined
  /**
   * The blocks are named by their external hashes alone, with no tokens and no parent (vLLM's
   * offloading connector stores host and disk copies with `token_ids: []`): a canonically
   * addressed pool resolves each one through the member's lineage (any tier that holds it,
   * PROTOCOL §5.1 ◆3) to the canonical hash it was stored under, and skips one that no tier
   * holds as unanchored. `tokensHashes` and `parentHash` are not read. Without the flag, absent
   * `tokensHashes` mean the external hashes are the local ones (a Dynamo worker that sent none).
   */
  readonly resolveThroughLineage?: boolean | undefined
}

/** Blocks a rank removed, as hash pairs. */
export interface CkfRemovedData {
  readonly _tag: "Removed"
  readonly blockHashes: Uint32Array
}

/** A rank dropped every block. */
export interface CkfClearedData {
  readonly _tag: "Cleared"
}

/** What a CKF event says happened. */
export type CkfEventData = CkfStoredData | CkfRemovedData | CkfClearedData

/** A member is one (worker, dp rank); worker ids are canonical decimal u64 strings. */
export interface CkfMemberRef {
  readonly workerId: string
  readonly dpRank: number
}

/** One KV event as the CKF core applies it: a rank, a tier and its data. */
export interface CkfEvent extends CkfMemberRef {
  readonly storageTier: StorageTier
  readonly data: CkfEventData
}

/** Map key of a member. */
export const memberKey = (workerId: string, dpRank: number): string => `${workerId}/${dpRank}`

/** Order members by (worker id numerically, dp rank). */
export const compareMembers = (a: CkfMemberRef, b: CkfMemberRef): number => {
  if (a.workerId !== b.workerId) {
    return a.workerId.length !== b.workerId.length
      ? a.workerId.length - b.workerId.length
      : a.workerId < b.workerId
        ? -1
        : 1
  }
  return a.dpRank - b.dpRank
}
