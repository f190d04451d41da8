/**
 * `DcCkfState`: the producer of one DC pool. Exact ownership (which (worker, dp rank) members own
 * which block hashes, and a refcount per hash) drives a packed cuckoo filter of 16-bit
 * fingerprints, four slots per u64 bucket word.
 *
 * Invariants (from the reference):
 * - `refcount[h]` equals the number of members whose set contains `h`.
 * - While `refcount[h] > 0` the filter holds exactly one fingerprint copy attributable to `h`;
 *   distinct hashes with the same representation contribute separate copies.
 * - Only the first owner (0→1) inserts and only the final owner (1→0) removes a fingerprint.
 * - A capacity omission is decided before any exact-state write: the edge and refcount are not
 *   added, nothing is marked dirty, and a later removal of the hash is an unknown no-op.
 * - The dirty window keeps each bucket's first pre-image since the last drain, so batches carry
 *   absolute words in first-touch order and net reversions vanish.
 *
 * Length: the apply path (ownership, bounded-kick mutator, dirty window) is one class over shared
 * typed arrays, measured as `producer_apply` / `producer_apply_canonical`; its private fields and
 * the loops that read them stay together so that V8 keeps them monomorphic and inlined.
 */

import { CkfAddressing } from "./addressing.js"
import { bucketCountFor, type CkfConfig, validateCkfConfig } from "./config.js"
import { CkfBuildError, KvCacheEventError, type KvCacheEventErrorKind } from "./errors.js"
import { type CkfEvent, type CkfMemberRef, compareMembers, memberKey } from "./events.js"
import { DcCkfFormatIdentity } from "./identity.js"
import {
  OWNER_DEGREE_OVERFLOW,
  OWNER_DUPLICATE,
  OWNER_LAST,
  OWNER_UNKNOWN,
  OwnershipTable
} from "./ownership.js"
import { laneRngSeed, SplitMix64 } from "./splitmix.js"
import { hiOf, loOf, toBigInt } from "./u64.js"

if (new Uint8Array(new Uint16Array([1]).buffer)[0] !== 1) {
  throw new Error("kvrelay's CKF core requires a little-endian host (bucket words share typed-array views)")
}

/** One publication batch: absolute bucket images `[bucket, wordLo, wordHi]*` in first-touch order. */
export class DcCkfPublicationBatch {
  constructor(readonly images: Uint32Array) {}
  get imageCount(): number {
    return this.images.length / 3
  }
  bucketAt(i: number): number {
    return this.images[3 * i]!
  }
  wordAt(i: number): bigint {
    return toBigInt(this.images[3 * i + 2]!, this.images[3 * i + 1]!)
  }
}

/** What applying events did: the first refusal, and the counts. */
export interface DcCkfEventOutcome {
  readonly firstError: KvCacheEventErrorKind | undefined
  readonly publication: DcCkfPublicationBatch | undefined
  readonly unknownRemovals: number
  readonly publicationBoundary: boolean
  /** Blocks skipped because their parent's chain is unknown (canonical pools, engine sources). */
  readonly unanchoredBlocks: number
}

const IGNORED_OUTCOME: DcCkfEventOutcome = Object.freeze({
  firstError: undefined,
  publication: undefined,
  unknownRemovals: 0,
  publicationBoundary: false,
  unanchoredBlocks: 0
})

const EMPTY_BOUNDARY_OUTCOME: DcCkfEventOutcome = Object.freeze({
  firstError: undefined,
  publication: undefined,
  unknownRemovals: 0,
  publicationBoundary: true,
  unanchoredBlocks: 0
})

/** Members and blocks of the state. */
export interface DcCkfAggregationStats {
  readonly memberCount: number
  readonly contributionCount: number
  readonly uniqueBlockCount: number
  readonly unknownRemovals: number
  readonly capacityFailures: number
  /** Stored batches whose parent was not in the member's lineage (canonical pools only). */
  readonly parentNotFound: number
  /** Blocks of engine sources skipped because their parent's chain is unknown (canonical pools only). */
  readonly unanchoredBlocks: number
  /**
   * Removals, by a member whose history is partial, of external hashes it never mapped: blocks
   * stored before the relay's history of that member begins (canonical pools only).
   */
  readonly unanchoredRemovals: number
  /** Full scan of nonzero words: diagnostic only. */
  readonly occupiedBucketCount: number
  readonly occupiedSlotCount: number
}

/** Changes waiting to be published. */
export interface DcCkfPublicationStats {
  readonly pendingEvents: number
  readonly physicalTouches: number
  readonly distinctTouchedBuckets: number
  readonly emittedImages: number
  readonly netRevertedBuckets: number
}

/** Table capacities and bytes of the state. */
export interface DcCkfMemoryStats {
  readonly memberSetCapacity: number
  readonly refcountCapacity: number
  readonly filterBytes: number
  readonly dirtyTrackingBytes: number
  readonly insertionScratchCapacity: number
  /** Bytes of every exact-ownership table (member sets and refcounts). */
  readonly ownershipBytes: number
  /** External → canonical lineage of a canonical pool (0 otherwise): entries and bytes. */
  readonly lineageEntries: number
  readonly lineageBytes: number
}

/** The state's counters. */
export interface DcCkfStats {
  readonly aggregation: DcCkfAggregationStats
  readonly publication: DcCkfPublicationStats
  readonly memory: DcCkfMemoryStats
}

/** A rank with the number of blocks it holds. */
export interface MemberCount extends CkfMemberRef {
  readonly count: number
}

/** A rank replacement: the complete set of hashes the member owns after the swap. */
export interface RankReplacement extends CkfMemberRef {
  readonly hashes: Uint32Array
}

// Internal result codes of store/remove; negative codes are errors.
const CHANGED = 1
const UNCHANGED = 0
/** A block's `storeCodes` entry when its member already owned the hash. */
export const STORE_UNCHANGED = UNCHANGED
const E_CAPACITY = -1
const E_ALLOCATION = -2
const E_DEGREE = -3
const E_INVARIANT = -4
/**
 * +1 when the bucket word `[now[i], now[i + 1]]` is occupied and its pre-image `[was[j], was[j + 1]]`
 * empty, -1 the other way, else 0. Words come by array and offset: a u32 argument of a call that
 * is not inlined is boxed.
 */
const occupiedChange = (now: Uint32Array, i: number, was: Uint32Array, j: number): number =>
  ((now[i]! | now[i + 1]!) !== 0 ? 1 : 0) - ((was[j]! | was[j + 1]!) !== 0 ? 1 : 0)

/** `storeFirstOwner` did not apply: take the general path. */
const SLOW_PATH = 2

const errorKindOf = (code: number): KvCacheEventErrorKind => {
  switch (code) {
    case E_CAPACITY:
      return "CapacityExhausted"
    case E_ALLOCATION:
      return "AllocationFailed"
    case E_DEGREE:
      return "OwnershipDegreeOverflow"
    default:
      return "IndexerInvariantViolation"
  }
}

/** u32s per image slab (16 KiB): bounds what one retained batch can keep alive. */
const IMAGE_SLAB_U32 = 4096

/** Hashes mixed per `mixBatch` call when storing a whole replacement set. */
const STORE_CHUNK = 256

const saturating = (value: number): number => Math.min(value, Number.MAX_SAFE_INTEGER)

/** The event kinds of `applyHashes`. */
export const STORED = 0
/** `applyHashes` removes the blocks. */
export const REMOVED = 1
/** `applyHashes` clears the rank. */
export const CLEARED = 2
/** The event kinds of `applyHashes`. */
export type AppliedKind = typeof STORED | typeof REMOVED | typeof CLEARED
const EMPTY_KEYS = new Uint32Array(0)

/** One pool's CKF producer state: fingerprints, ownership and the changes not yet published. */
export class DcCkfState {
  readonly config: CkfConfig
  readonly format: DcCkfFormatIdentity
  readonly addressing: CkfAddressing
  readonly bucketCount: number

  // Filter: bucket b is words32[2b] (low half) and words32[2b + 1] (high half); slot i of bucket b
  // is slots16[4b + i] on little-endian hosts.
  private words32: Uint32Array
  private slots16: Uint16Array
  private readonly rng: SplitMix64
  /** Exact device ownership; the canonical producer's worker query reads it. */
  protected owners: OwnershipTable

  // Mutation log of the current insert/remove: [bucket, beforeLo, beforeHi]*.
  private readonly log: Uint32Array
  private logLen = 0

  // Publication window.
  private dirtyBits: Uint32Array
  private dirtyBuckets: Uint32Array
  private dirtyOriginals: Uint32Array
  private dirtyCount = 0
  private pendingEvents = 0
  /** Slab that batch images are carved from; `slabUsed` u32s of it belong to earlier batches. */
  private slab = new Uint32Array(0)
  private slabUsed = 0

  // Telemetry.
  /**
   * Non-empty buckets as of the last drain: a bucket in the dirty window counts by its pre-image.
   * `stats` adds the window's difference instead of scanning every bucket, a pass that took
   * ~7 ms for a 4 MiB filter on a cold path (once per pool on every `/metrics` scrape).
   */
  private occupiedAtDrain = 0
  private unknownRemovals = 0
  private capacityFailures = 0
  private physicalTouches = 0
  private distinctTouchedBuckets = 0
  private emittedImages = 0
  private netRevertedBuckets = 0

  // Mixed keys of the batch being applied, and of a single hash.
  private keys = new Uint32Array(32)
  private readonly single = new Uint32Array(2)
  /** First error code of the last `removeBatch` (0 = none). */
  private batchError = 0
  /**
   * When set, `storeKeys` writes each block's result code here (CHANGED, UNCHANGED = the member
   * already owned it, or an error code): the canonical producer learns which stores were aliases
   * from the store itself instead of a second lookup per block.
   */
  protected storeCodes: Int32Array | undefined = undefined

  // Cache of the last member looked up on the apply path.
  private lastMemberKeyWorker = ""
  private lastMemberKeyRank = -1
  private lastMember = -1
  /** Keeps the prefetching loads of `applyEvent` observable so they are not optimised away. */
  touchSink = 0

  /** Throws `CkfBuildError` for an invalid configuration or a failed allocation. */
  constructor(config: CkfConfig) {
    const invalid = validateCkfConfig(config)
    if (invalid !== undefined) throw invalid
    const bucketCount = bucketCountFor(config.expectedBlocksPerDc)
    this.config = config
    this.bucketCount = bucketCount
    this.format = new DcCkfFormatIdentity(BigInt.asUintN(64, config.seed), bucketCount)
    this.addressing = new CkfAddressing(config.seed, bucketCount)
    try {
      const buffer = new ArrayBuffer(bucketCount * 8)
      this.words32 = new Uint32Array(buffer)
      this.slots16 = new Uint16Array(buffer)
      this.dirtyBits = new Uint32Array(Math.ceil(bucketCount / 32))
      this.dirtyBuckets = new Uint32Array(64)
      this.dirtyOriginals = new Uint32Array(128)
      this.log = new Uint32Array((config.maxKicks + 1) * 3)
      // Starts small and grows; the expected unique blocks (which the filter's slots also bound)
      // shape its growth steps.
      this.owners = new OwnershipTable(Math.min(config.expectedBlocksPerDc, 4 * bucketCount), 4 * bucketCount)
    } catch (cause) {
      throw new CkfBuildError(
        "AllocationFailed",
        `could not allocate a ${bucketCount}-bucket filter: ${cause}`
      )
    }
    this.rng = new SplitMix64(laneRngSeed(config.seed, 0))
  }

  /**
   * Room for `blocks` unique blocks in the exact-ownership table in one step; it grows by itself
   * as blocks arrive, so this only spares the growth steps. False when the allocation failed.
   */
  reserveBlocks(blocks: number): boolean {
    return this.owners.reserveKeys(Math.min(blocks, 4 * this.bucketCount))
  }

  // -------------------------------------------------------------------------------------------
  // Apply

  /** Apply one event; never throws for bad data, errors are returned in the outcome. */
  applyEvent(event: CkfEvent): DcCkfEventOutcome {
    const data = event.data
    if (data._tag === "Cleared") return this.applyHashes(CLEARED, event.workerId, event.dpRank, EMPTY_KEYS, 0)
    if (event.storageTier !== "device") return IGNORED_OUTCOME
    const hashes = data.blockHashes
    return this.applyHashes(
      data._tag === "Stored" ? STORED : REMOVED,
      event.workerId,
      event.dpRank,
      hashes,
      hashes.length >>> 1
    )
  }

  /**
   * `applyEvent` of a device-tier event given by its kind and the first `count` hash pairs of
   * `hashes`: a subclass that computes the hashes into a scratch buffer (the canonical producer)
   * hands them over without an event object or an array view per event.
   */
  protected applyHashes(
    kind: AppliedKind,
    workerId: string,
    dpRank: number,
    hashes: Uint32Array,
    count: number
  ): DcCkfEventOutcome {
    this.pendingEvents++
    let firstError: KvCacheEventErrorKind | undefined
    let unknown = 0
    if (kind === STORED) {
      const code = this.storeBatch(workerId, dpRank, hashes, count)
      if (code < 0) firstError = errorKindOf(code)
    } else if (kind === REMOVED) {
      unknown = this.removeBatch(workerId, dpRank, hashes, count)
      if (this.batchError < 0) firstError = errorKindOf(this.batchError)
    } else {
      const code = this.removeMemberCode(workerId, dpRank)
      if (code < 0) firstError = errorKindOf(code)
    }
    if (unknown !== 0) this.unknownRemovals = saturating(this.unknownRemovals + unknown)
    const boundary = this.pendingEvents >= this.config.publishEveryNEvents
    const publication = boundary ? this.drainPublication() : undefined
    // The common outcomes are shared immutable values: one allocation less per event.
    if (firstError === undefined && unknown === 0 && publication === undefined) {
      return boundary ? EMPTY_BOUNDARY_OUTCOME : IGNORED_OUTCOME
    }
    return {
      firstError,
      publication,
      unknownRemovals: unknown,
      publicationBoundary: boundary,
      unanchoredBlocks: 0
    }
  }

  /** Scratch for the mixed keys of one batch, as [hi, lo] pairs. */
  private keysFor(count: number): Uint32Array {
    if (this.keys.length < 2 * count) this.keys = new Uint32Array(Math.max(2 * count, 2 * this.keys.length))
    return this.keys
  }

  /**
   * The mixed keys of an event's `count` blocks, with each key's owner-table home loaded: the
   * loads are independent, so their cache misses overlap before the dependent work runs.
   */
  private mixAndTouch(hashes: Uint32Array, count: number): Uint32Array {
    const keys = this.keysFor(count)
    this.addressing.mixBatch(hashes, 0, count, keys, 0)
    const owners = this.owners
    const slots = this.slots16
    const mask = this.addressing.mask
    const delta = this.addressing.delta
    let touched = 0
    for (let i = 0; i < count; i++) {
      touched |= owners.touchAt(keys, 2 * i)
      const lo = keys[2 * i + 1]!
      // Bucket a of `prepareMixedAt`: the filter's first probe, loaded with the owner slot.
      touched |= slots[(((lo >>> 16) | (keys[2 * i]! << 16)) & mask) << 2]!
      // And the fingerprint's bucket delta: the 256 KiB table is pushed out of L2 by the others.
      touched |= delta[lo & 0xffff]!
    }
    this.touchSink = touched
    return keys
  }

  /**
   * Stores of one Stored event: every block is hashed once (its `mixed` keys the owner table and
   * gives the fingerprint and buckets), and its owner-table home is loaded before any block is
   * applied. Returns the first error code, or 0.
   */
  private storeBatch(workerId: string, dpRank: number, hashes: Uint32Array, count: number): number {
    const keys = this.mixAndTouch(hashes, count)
    return this.storeKeys(workerId, dpRank, keys, count, false)
  }

  /**
   * Store transitions of the `count` mixed keys in `keys` for one member, in order; returns the
   * first error code, or 0. Capacity omissions are counted; `abortOnError` stops at the first
   * error (rank replacement) instead of attempting the remaining keys (Stored events).
   */
  private storeKeys(
    workerId: string,
    dpRank: number,
    keys: Uint32Array,
    count: number,
    abortOnError: boolean
  ): number {
    let first = 0
    let m = this.member(workerId, dpRank)
    const codes = this.storeCodes
    for (let i = 0; i < count; i++) {
      let code = m >= 0 ? this.storeFirstOwner(m, keys, 2 * i) : SLOW_PATH
      if (code === SLOW_PATH) {
        code = this.storeKey(workerId, dpRank, keys, 2 * i)
        // The slow path may have registered or released the member.
        m = this.member(workerId, dpRank)
      } else if (code === E_CAPACITY) {
        this.releaseIfEmpty(workerId, dpRank, m)
        m = this.member(workerId, dpRank)
      }
      if (codes !== undefined) codes[i] = code
      if (code < 0) {
        if (code === E_CAPACITY) this.capacityFailures++
        if (first === 0) first = code
        if (abortOnError) break
      }
    }
    return first
  }

  /** Removals of one Removed event; returns the unknown count, the first error in `batchError`. */
  private removeBatch(workerId: string, dpRank: number, hashes: Uint32Array, count: number): number {
    this.batchError = 0
    if (this.member(workerId, dpRank) < 0) return count
    const keys = this.mixAndTouch(hashes, count)
    let unknown = 0
    for (let i = 0; i < count; i++) {
      const code = this.removeKey(workerId, dpRank, keys, 2 * i)
      if (code === UNCHANGED) unknown++
      else if (code < 0 && this.batchError === 0) this.batchError = code
    }
    return unknown
  }

  /** Store transition for one hash; `true` when the member newly owns it. */
  store(workerId: string, dpRank: number, hash: bigint): boolean | KvCacheEventError {
    const h = BigInt.asUintN(64, hash)
    const code = this.storeHalves(workerId, dpRank, hiOf(h), loOf(h))
    if (code === E_CAPACITY) this.capacityFailures++
    return code < 0 ? new KvCacheEventError(errorKindOf(code)) : code === CHANGED
  }

  /** Remove transition for one hash; `false` for an unknown removal (an idempotent no-op). */
  remove(workerId: string, dpRank: number, hash: bigint): boolean | KvCacheEventError {
    const h = BigInt.asUintN(64, hash)
    const code = this.removeHalves(workerId, dpRank, hiOf(h), loOf(h))
    if (code === UNCHANGED) this.unknownRemovals = saturating(this.unknownRemovals + 1)
    return code < 0 ? new KvCacheEventError(errorKindOf(code)) : code === CHANGED
  }

  /** Index of a member in the ownership table, or -1 when it owns nothing (cached per event). */
  private member(workerId: string, dpRank: number): number {
    if (workerId === this.lastMemberKeyWorker && dpRank === this.lastMemberKeyRank) return this.lastMember
    const index = this.owners.memberIndex(memberKey(workerId, dpRank))
    this.lastMemberKeyWorker = workerId
    this.lastMemberKeyRank = dpRank
    this.lastMember = index
    return index
  }

  private ensureMember(workerId: string, dpRank: number): number {
    const index = this.owners.ensureMember(memberKey(workerId, dpRank), workerId, dpRank)
    this.lastMemberKeyWorker = workerId
    this.lastMemberKeyRank = dpRank
    this.lastMember = index
    return index
  }

  /** A member entry exists only while it owns at least one hash; indices are recycled. */
  private releaseIfEmpty(workerId: string, dpRank: number, index: number): void {
    if (this.owners.blocksOf(index) !== 0) return
    this.owners.releaseIfEmpty(memberKey(workerId, dpRank), index)
    this.forgetMemberCache()
  }

  private forgetMemberCache(): void {
    this.lastMemberKeyWorker = ""
    this.lastMemberKeyRank = -1
    this.lastMember = -1
  }

  /** The mixed key of one hash into `single` (edge and test paths; batches use `storeBatch`). */
  private mixSingle(hi: number, lo: number): Uint32Array {
    const single = this.single
    single[0] = hi
    single[1] = lo
    this.addressing.mixBatch(single, 0, 1, single, 0)
    return single
  }

  /** Store transition of one hash given as halves; an internal result code (negative = error). */
  storeHalves(workerId: string, dpRank: number, hi: number, lo: number): number {
    return this.storeKey(workerId, dpRank, this.mixSingle(hi, lo), 0)
  }

  /** Remove transition of one hash given as halves; an internal result code (negative = error). */
  removeHalves(workerId: string, dpRank: number, hi: number, lo: number): number {
    return this.removeKey(workerId, dpRank, this.mixSingle(hi, lo), 0)
  }

  /**
   * The common store of a batch: registered member `m` becomes the first owner of an untracked
   * hash while the owner table and the dirty window have room. It does exactly what `storeKey`
   * does in that case (a capacity omission returns `E_CAPACITY` with no exact-state write; the
   * caller releases an empty member), without the lookups and reservations the case does not
   * need. Anything else returns `SLOW_PATH` with nothing changed.
   */
  private storeFirstOwner(m: number, keys: Uint32Array, k: number): number {
    const owners = this.owners
    const found = owners.findAt(keys, k)
    if (
      found >= 0 ||
      !owners.hasRoomForKey() ||
      this.dirtyCount + this.config.maxKicks + 1 > this.dirtyBuckets.length
    ) {
      return SLOW_PATH
    }
    const addressing = this.addressing
    addressing.prepareMixedAt(keys, k)
    if (!this.insertFingerprint(addressing.fp, addressing.a, addressing.b)) return E_CAPACITY
    owners.insertKeyAt(-1 - found, keys, k, m)
    return CHANGED
  }

  /** Store transition of the hash whose mixed key is `keys[k], keys[k + 1]`. */
  private storeKey(workerId: string, dpRank: number, keys: Uint32Array, k: number): number {
    const owners = this.owners
    const key = owners.key
    key[0] = keys[k]!
    key[1] = keys[k + 1]!
    let slot = owners.find()
    let m = this.member(workerId, dpRank)
    if (slot >= 0 && m >= 0 && owners.ownsAt(slot, m)) return UNCHANGED
    const capacity = owners.slotCapacity
    if (!owners.reserve()) return E_ALLOCATION
    // Growing the table moves entries; look the key up again.
    if (owners.slotCapacity !== capacity) slot = owners.find()
    if (m < 0) {
      m = this.ensureMember(workerId, dpRank)
      if (m < 0) return E_ALLOCATION
    }
    if (slot < 0) {
      if (!this.reserveDirty(this.config.maxKicks + 1)) {
        this.releaseIfEmpty(workerId, dpRank, m)
        return E_ALLOCATION
      }
      const addressing = this.addressing
      addressing.prepareMixedAt(keys, k)
      if (!this.insertFingerprint(addressing.fp, addressing.a, addressing.b)) {
        // A capacity omission leaves no exact-state trace, not even an empty member.
        this.releaseIfEmpty(workerId, dpRank, m)
        return E_CAPACITY
      }
      owners.insertAt(-1 - slot, m)
      return CHANGED
    }
    const added = owners.addOwner(slot, m)
    if (added === OWNER_DUPLICATE) return UNCHANGED
    if (added === OWNER_DEGREE_OVERFLOW) {
      this.releaseIfEmpty(workerId, dpRank, m)
      return E_DEGREE
    }
    return CHANGED
  }

  /** Remove transition of the hash whose mixed key is `keys[k], keys[k + 1]`. */
  private removeKey(workerId: string, dpRank: number, keys: Uint32Array, k: number): number {
    const m = this.member(workerId, dpRank)
    if (m < 0) return UNCHANGED
    const owners = this.owners
    const key = owners.key
    key[0] = keys[k]!
    key[1] = keys[k + 1]!
    const slot = owners.find()
    if (slot < 0) return UNCHANGED
    const removed = owners.removeOwner(slot, m)
    if (removed === OWNER_UNKNOWN) return UNCHANGED
    if (removed === OWNER_LAST) {
      // The final owner removes one fingerprint copy; a missing copy is reported before any
      // exact-state change.
      if (!this.reserveDirty(1)) return E_ALLOCATION
      const addressing = this.addressing
      addressing.prepareMixedAt(keys, k)
      if (!this.removeFingerprint(addressing.fp, addressing.a, addressing.b)) return E_INVARIANT
      owners.deleteLast(slot, m)
    }
    this.releaseIfEmpty(workerId, dpRank, m)
    return CHANGED
  }

  private removeMemberCode(workerId: string, dpRank: number): number {
    const m = this.member(workerId, dpRank)
    if (m < 0) return UNCHANGED
    const keys = this.owners.hashesOf(m)
    for (let i = 0; i < keys.length; i += 2) {
      const code = this.removeKey(workerId, dpRank, keys, i)
      // The first error aborts; earlier removals stay applied and the member keeps the suffix,
      // so the state remains exact and a retry can finish the clear.
      if (code < 0) return code
    }
    return CHANGED
  }

  /** `remove_member`: the semantics of Cleared for one (worker, dp rank). */
  removeMember(workerId: string, dpRank: number): undefined | KvCacheEventError {
    const code = this.removeMemberCode(workerId, dpRank)
    return code < 0 ? new KvCacheEventError(errorKindOf(code)) : undefined
  }

  /** `remove_rank`: clear the member, then drain the window regardless of cadence. */
  removeRank(workerId: string, dpRank: number): DcCkfPublicationBatch | undefined | KvCacheEventError {
    const error = this.removeMember(workerId, dpRank)
    if (error !== undefined) return error
    return this.drainPublication()
  }

  /** `remove_worker`: clear every member of a worker, then drain. */
  removeWorker(workerId: string): DcCkfPublicationBatch | undefined | KvCacheEventError {
    const ranks = this.owners
      .memberIndices()
      .filter((m) => this.owners.workerOf(m) === workerId)
      .map((m) => this.owners.rankOf(m))
    for (const rank of ranks) {
      const error = this.removeMember(workerId, rank)
      if (error !== undefined) return error
    }
    return this.drainPublication()
  }

  // -------------------------------------------------------------------------------------------
  // Mutator

  private logWrite(bucket: number): void {
    const log = this.log
    const n = this.logLen
    log[n] = bucket
    log[n + 1] = this.words32[2 * bucket]!
    log[n + 2] = this.words32[2 * bucket + 1]!
    this.logLen = n + 3
  }

  private firstEmpty(bucket: number): number {
    const s = this.slots16
    const base = bucket << 2
    if (s[base] === 0) return 0
    if (s[base + 1] === 0) return 1
    if (s[base + 2] === 0) return 2
    if (s[base + 3] === 0) return 3
    return -1
  }

  /** The first write of an insert that found an empty slot: reported as a one-entry log. */
  private writeEmpty(bucket: number, slot: number, fp: number): void {
    this.markDirty(bucket, this.words32, 2 * bucket)
    this.slots16[(bucket << 2) + slot] = fp
    this.physicalTouches = saturating(this.physicalTouches + 1)
  }

  /**
   * Insert `fp` into bucket a or b: the first empty slot in a, then in b, else bounded kicks with
   * SplitMix64 and a reverse rollback on failure. The RNG is not rolled back. On success every
   * write has been reported to the dirty window in write order; on failure nothing has.
   */
  private insertFingerprint(fp: number, a: number, b: number): boolean {
    let empty = this.firstEmpty(a)
    if (empty >= 0) {
      this.writeEmpty(a, empty, fp)
      return true
    }
    empty = this.firstEmpty(b)
    if (empty >= 0) {
      this.writeEmpty(b, empty, fp)
      return true
    }
    return this.relocate(fp, a, b)
  }

  /** The bounded kicks of an insert whose buckets are both full; see `insertFingerprint`. */
  private relocate(fp: number, a: number, b: number): boolean {
    let empty: number
    this.logLen = 0
    const slots = this.slots16
    const rng = this.rng
    const delta = this.addressing.delta
    let bucket = (rng.next() & 1) === 0 ? a : b
    let f = fp
    for (let kick = 0; kick < this.config.maxKicks; kick++) {
      const slot = rng.next() & 3
      this.logWrite(bucket)
      const index = (bucket << 2) + slot
      const evicted = slots[index]!
      slots[index] = f
      f = evicted
      bucket ^= delta[f]!
      empty = this.firstEmpty(bucket)
      if (empty >= 0) {
        this.logWrite(bucket)
        slots[(bucket << 2) + empty] = f
        this.commitLog()
        return true
      }
    }
    const log = this.log
    const words = this.words32
    for (let n = this.logLen - 3; n >= 0; n -= 3) {
      const bk = log[n]!
      words[2 * bk] = log[n + 1]!
      words[2 * bk + 1] = log[n + 2]!
    }
    this.logLen = 0
    return false
  }

  /** Zero the first slot holding `fp` in bucket a, then b, and report the write. */
  private removeFingerprint(fp: number, a: number, b: number): boolean {
    const slots = this.slots16
    for (let pass = 0; pass < 2; pass++) {
      const bucket = pass === 0 ? a : b
      const base = bucket << 2
      for (let i = 0; i < 4; i++) {
        if (slots[base + i] === fp) {
          this.markDirty(bucket, this.words32, 2 * bucket)
          slots[base + i] = 0
          this.physicalTouches = saturating(this.physicalTouches + 1)
          return true
        }
      }
    }
    return false
  }

  /** Report the logged writes of a successful relocation to the dirty window, in write order. */
  private commitLog(): void {
    const log = this.log
    for (let n = 0; n < this.logLen; n += 3) this.markDirty(log[n]!, log, n + 1)
    this.physicalTouches = saturating(this.physicalTouches + this.logLen / 3)
    this.logLen = 0
  }

  // -------------------------------------------------------------------------------------------
  // Publication window

  private reserveDirty(additional: number): boolean {
    const needed = this.dirtyCount + additional
    if (needed <= this.dirtyBuckets.length) return true
    try {
      let cap = this.dirtyBuckets.length * 2
      while (cap < needed) cap *= 2
      const buckets = new Uint32Array(cap)
      buckets.set(this.dirtyBuckets.subarray(0, this.dirtyCount))
      const originals = new Uint32Array(cap * 2)
      originals.set(this.dirtyOriginals.subarray(0, this.dirtyCount * 2))
      this.dirtyBuckets = buckets
      this.dirtyOriginals = originals
      return true
    } catch {
      return false
    }
  }

  /**
   * Record `bucket` with the pre-image `[src[at], src[at + 1]]` = [lo, hi] unless it is already in
   * the window (the first pre-image wins). The word comes in by array and offset because a u32
   * argument would be boxed on a call that is not inlined.
   */
  private markDirty(bucket: number, src: Uint32Array, at: number): void {
    const bit = 1 << (bucket & 31)
    const word = bucket >>> 5
    const bits = this.dirtyBits
    if ((bits[word]! & bit) !== 0) return
    bits[word] = bits[word]! | bit
    const n = this.dirtyCount
    this.dirtyBuckets[n] = bucket
    this.dirtyOriginals[2 * n] = src[at]!
    this.dirtyOriginals[2 * n + 1] = src[at + 1]!
    this.dirtyCount = n + 1
  }

  /**
   * Emit the window as absolute images of the buckets whose word differs from the first
   * pre-image, in first-touch order, and reset it. `undefined` when nothing changed.
   */
  drainPublication(): DcCkfPublicationBatch | undefined {
    const dirty = this.dirtyCount
    if (this.pendingEvents === 0 && dirty === 0) return undefined
    const words = this.words32
    const buckets = this.dirtyBuckets
    const originals = this.dirtyOriginals
    const bits = this.dirtyBits
    // Images are written straight into a shared slab and each batch views its own range: one
    // buffer allocation serves many batches.
    let base = this.slabUsed
    if (this.slab.length - base < dirty * 3) {
      this.slab = new Uint32Array(Math.max(IMAGE_SLAB_U32, dirty * 3))
      this.slabUsed = 0
      base = 0
    }
    const out = this.slab
    let k = base
    let occupied = this.occupiedAtDrain
    for (let n = 0; n < dirty; n++) {
      const b = buckets[n]!
      const lo = words[2 * b]!
      const hi = words[2 * b + 1]!
      const wasLo = originals[2 * n]!
      const wasHi = originals[2 * n + 1]!
      if (lo !== wasLo || hi !== wasHi) {
        out[k] = b
        out[k + 1] = lo
        out[k + 2] = hi
        k += 3
        occupied += occupiedChange(words, 2 * b, originals, 2 * n)
      }
      bits[b >>> 5] = 0
    }
    this.occupiedAtDrain = occupied
    const images = (k - base) / 3
    let batch: DcCkfPublicationBatch | undefined
    if (images > 0) {
      batch = new DcCkfPublicationBatch(new Uint32Array(out.buffer, base * 4, k - base))
      this.slabUsed = k
    }
    this.distinctTouchedBuckets = saturating(this.distinctTouchedBuckets + dirty)
    this.emittedImages = saturating(this.emittedImages + images)
    this.netRevertedBuckets = saturating(this.netRevertedBuckets + dirty - images)
    this.dirtyCount = 0
    this.pendingEvents = 0
    return batch
  }

  flush(): DcCkfPublicationBatch | undefined {
    return this.drainPublication()
  }

  hasPendingPublication(): boolean {
    return this.pendingEvents !== 0 || this.dirtyCount !== 0
  }

  pendingEventCount(): number {
    return this.pendingEvents
  }

  /**
   * Copy every bucket word, then drain the window. The caller publishes the returned tail on the
   * old lease before installing the snapshot; the snapshot already contains its effects.
   */
  barrierSnapshot():
    | { readonly tail: DcCkfPublicationBatch | undefined; readonly words: Uint32Array }
    | CkfBuildError {
    let words: Uint32Array
    try {
      words = this.words32.slice()
    } catch (cause) {
      return new CkfBuildError("AllocationFailed", `could not copy the filter for a snapshot: ${cause}`)
    }
    return { tail: this.drainPublication(), words }
  }

  // -------------------------------------------------------------------------------------------
  // Transactional rank replacement

  /**
   * Replace the complete hash sets of some members by an off-side rebuild. Any error (including a
   * capacity omission) leaves this state unchanged. Returns the drained publication of the swap.
   */
  replaceRanks(
    replacements: ReadonlyArray<RankReplacement>
  ): DcCkfPublicationBatch | undefined | KvCacheEventError | CkfBuildError {
    let next: DcCkfState
    try {
      next = new DcCkfState(this.config)
    } catch (error) {
      return error instanceof CkfBuildError ? error : new CkfBuildError("AllocationFailed", String(error))
    }
    const owners = this.owners
    // The rebuild usually holds about as many blocks as now: one allocation instead of the
    // doubling steps, and never more slots than the table it replaces.
    if (!next.reserveBlocks(owners.size)) {
      return new CkfBuildError("AllocationFailed", `could not allocate room for ${owners.size} blocks`)
    }
    const replaced = new Set<number>()
    for (const r of replacements) {
      const m = owners.memberIndex(memberKey(r.workerId, r.dpRank))
      if (m >= 0) replaced.add(m)
    }
    // Retained owners are re-stored in table order: placement may differ from the old layout,
    // but ownership and refcounts are identical (placement is history-dependent anyway). Both
    // states share the seed, so the mixed keys carry over without rehashing.
    const edges = owners.edgeList()
    for (let k = 0; k < edges.length; k += 3) {
      const m = edges[k]!
      if (replaced.has(m)) continue
      const code = next.storeKey(owners.workerOf(m), owners.rankOf(m), edges, k + 1)
      if (code < 0) return new KvCacheEventError(errorKindOf(code))
    }
    for (const replacement of [...replacements].sort(compareMembers)) {
      const code = next.storeAll(replacement.workerId, replacement.dpRank, replacement.hashes)
      if (code < 0) return new KvCacheEventError(errorKindOf(code))
    }
    // Diff against what consumers have: a bucket still pending keeps its old first pre-image;
    // any other bucket that changed is marked with its current (published) word.
    const rebuildTouches = next.physicalTouches
    next.dirtyCount = 0
    next.dirtyBits.fill(0)
    const oldWords = this.words32
    const newWords = next.words32
    if (!next.reserveDirty(this.dirtyCount)) return new KvCacheEventError("AllocationFailed")
    for (let n = 0; n < this.dirtyCount; n++) {
      const b = this.dirtyBuckets[n]!
      const lo = this.dirtyOriginals[2 * n]!
      const hi = this.dirtyOriginals[2 * n + 1]!
      if (newWords[2 * b] !== lo || newWords[2 * b + 1] !== hi) next.markDirty(b, this.dirtyOriginals, 2 * n)
    }
    for (let b = 0; b < this.bucketCount; b++) {
      const lo = oldWords[2 * b]!
      const hi = oldWords[2 * b + 1]!
      if ((this.dirtyBits[b >>> 5]! & (1 << (b & 31))) !== 0) continue
      if (newWords[2 * b] !== lo || newWords[2 * b + 1] !== hi) {
        if (!next.reserveDirty(1)) return new KvCacheEventError("AllocationFailed")
        next.markDirty(b, oldWords, 2 * b)
      }
    }
    next.pendingEvents = 1
    next.unknownRemovals = this.unknownRemovals
    next.capacityFailures = this.capacityFailures
    next.distinctTouchedBuckets = this.distinctTouchedBuckets
    next.emittedImages = this.emittedImages
    next.netRevertedBuckets = this.netRevertedBuckets
    next.physicalTouches = saturating(this.physicalTouches + rebuildTouches)
    this.adopt(next)
    return this.drainPublication()
  }

  /** Store every hash pair of `pairs` for one member, stopping at the first error code. */
  private storeAll(workerId: string, dpRank: number, pairs: Uint32Array): number {
    const total = pairs.length >>> 1
    const keys = this.keysFor(Math.min(total, STORE_CHUNK))
    for (let start = 0; start < total; start += STORE_CHUNK) {
      const count = Math.min(STORE_CHUNK, total - start)
      this.addressing.mixBatch(pairs, 2 * start, count, keys, 0)
      const code = this.storeKeys(workerId, dpRank, keys, count, true)
      if (code < 0) return code
    }
    return CHANGED
  }

  /** `replace_rank`: one member's complete replacement. */
  replaceRank(
    workerId: string,
    dpRank: number,
    hashes: Uint32Array
  ): DcCkfPublicationBatch | undefined | KvCacheEventError | CkfBuildError {
    return this.replaceRanks([{ workerId, dpRank, hashes }])
  }

  private adopt(next: DcCkfState): void {
    // `occupiedAtDrain` stays: `next`'s window holds pre-images of what consumers have, which is
    // what this state's count describes.
    this.words32 = next.words32
    this.slots16 = next.slots16
    this.owners = next.owners
    this.dirtyBits = next.dirtyBits
    this.dirtyBuckets = next.dirtyBuckets
    this.dirtyOriginals = next.dirtyOriginals
    this.dirtyCount = next.dirtyCount
    this.pendingEvents = next.pendingEvents
    this.unknownRemovals = next.unknownRemovals
    this.capacityFailures = next.capacityFailures
    this.physicalTouches = next.physicalTouches
    this.distinctTouchedBuckets = next.distinctTouchedBuckets
    this.emittedImages = next.emittedImages
    this.netRevertedBuckets = next.netRevertedBuckets
    this.rng.reset(next.rng.stateValue)
    this.forgetMemberCache()
  }

  // -------------------------------------------------------------------------------------------
  // Queries

  containsHalves(hi: number, lo: number): boolean {
    const addressing = this.addressing
    addressing.prepareHalves(hi, lo)
    const fp = addressing.fp
    const s = this.slots16
    const a = addressing.a << 2
    const b = addressing.b << 2
    return (
      s[a] === fp ||
      s[a + 1] === fp ||
      s[a + 2] === fp ||
      s[a + 3] === fp ||
      s[b] === fp ||
      s[b + 1] === fp ||
      s[b + 2] === fp ||
      s[b + 3] === fp
    )
  }

  /** Probe the producer's own filter. */
  contains(hash: bigint): boolean {
    const h = BigInt.asUintN(64, hash)
    return this.containsHalves(hiOf(h), loOf(h))
  }

  /** Slot of a hash in the owner table, or negative when untracked. */
  private findHash(hash: bigint): number {
    const h = BigInt.asUintN(64, hash)
    const owners = this.owners
    const key = this.mixSingle(hiOf(h), loOf(h))
    owners.key[0] = key[0]!
    owners.key[1] = key[1]!
    return owners.find()
  }

  /** Exact refcount of a hash (0 when untracked). */
  refcount(hash: bigint): number {
    const slot = this.findHash(hash)
    return slot < 0 ? 0 : this.owners.countAt(slot)
  }

  /** Whether a member owns a hash. */
  owns(workerId: string, dpRank: number, hash: bigint): boolean {
    const m = this.owners.memberIndex(memberKey(workerId, dpRank))
    if (m < 0) return false
    const slot = this.findHash(hash)
    return slot >= 0 && this.owners.ownsAt(slot, m)
  }

  /** One bucket word (diagnostic and test use). */
  wordAt(bucket: number): bigint {
    return toBigInt(this.words32[2 * bucket + 1]!, this.words32[2 * bucket]!)
  }

  /** A copy of every bucket word as `[lo, hi]` pairs (the little-endian wire layout). */
  snapshotWords(): Uint32Array {
    return this.words32.slice()
  }

  memberBlockCount(workerId: string, dpRank: number): number {
    return this.owners.blocksOf(this.owners.memberIndex(memberKey(workerId, dpRank)))
  }

  /** The hashes a member owns, as hash pairs. */
  memberHashes(workerId: string, dpRank: number): Uint32Array {
    const m = this.owners.memberIndex(memberKey(workerId, dpRank))
    if (m < 0) return new Uint32Array(0)
    return this.addressing.unmixPairs(this.owners.hashesOf(m))
  }

  /** Block counts per member, sorted by (worker id, dp rank). */
  memberCounts(): Array<MemberCount> {
    const owners = this.owners
    return owners
      .memberIndices()
      .map((m) => ({ workerId: owners.workerOf(m), dpRank: owners.rankOf(m), count: owners.blocksOf(m) }))
      .sort(compareMembers)
  }

  /** Buckets with at least one fingerprint, the dirty window included. */
  private occupiedBucketCount(): number {
    const words = this.words32
    const buckets = this.dirtyBuckets
    const originals = this.dirtyOriginals
    let occupied = this.occupiedAtDrain
    for (let n = 0; n < this.dirtyCount; n++) {
      const b = buckets[n]!
      occupied += occupiedChange(words, 2 * b, originals, 2 * n)
    }
    return occupied
  }

  stats(): DcCkfStats {
    const owners = this.owners
    return {
      aggregation: {
        memberCount: owners.memberCount,
        contributionCount: owners.contributions,
        uniqueBlockCount: owners.size,
        unknownRemovals: this.unknownRemovals,
        capacityFailures: this.capacityFailures,
        parentNotFound: 0,
        unanchoredBlocks: 0,
        unanchoredRemovals: 0,
        occupiedBucketCount: this.occupiedBucketCount(),
        occupiedSlotCount: owners.size
      },
      publication: {
        pendingEvents: this.pendingEvents,
        physicalTouches: this.physicalTouches,
        distinctTouchedBuckets: this.distinctTouchedBuckets,
        emittedImages: this.emittedImages,
        netRevertedBuckets: this.netRevertedBuckets
      },
      memory: {
        memberSetCapacity: owners.edgeCapacity,
        refcountCapacity: owners.slotCapacity,
        filterBytes: this.bucketCount * 8,
        dirtyTrackingBytes:
          this.dirtyBits.byteLength + this.dirtyBuckets.byteLength + this.dirtyOriginals.byteLength,
        insertionScratchCapacity: this.log.length / 3,
        ownershipBytes: owners.byteSize,
        lineageEntries: 0,
        lineageBytes: 0
      }
    }
  }
}
