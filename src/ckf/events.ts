/**
 * The mutation events the producer core consumes. The domain's `RouterEvent` is a structural
 * superset (event ids, parent hashes, token hashes); the core reads only what it needs.
 *
 * Block hashes are hash pairs: a `Uint32Array` `[hi0, lo0, hi1, lo1, …]`.
 */

/** Where a worker holds a block: only `device` blocks are indexed. */
export type StorageTier = "device" | "host_pinned" | "disk" | "external"

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
