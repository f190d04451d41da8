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
 */

import { CkfAddressing } from "./addressing.js"
import { bucketCountFor, type CkfConfig, validateCkfConfig } from "./config.js"
import { CkfBuildError, KvCacheEventError, type KvCacheEventErrorKind } from "./errors.js"
import { type CkfEvent, type CkfMemberRef, compareMembers, memberKey } from "./events.js"
import { DcCkfFormatIdentity } from "./identity.js"
import {
  mixKey,
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

export interface DcCkfEventOutcome {
  readonly firstError: KvCacheEventErrorKind | undefined
  readonly publication: DcCkfPublicationBatch | undefined
  readonly unknownRemovals: number
  readonly publicationBoundary: boolean
}

const IGNORED_OUTCOME: DcCkfEventOutcome = Object.freeze({
  firstError: undefined,
  publication: undefined,
  unknownRemovals: 0,
  publicationBoundary: false
})

export interface DcCkfAggregationStats {
  readonly memberCount: number
  readonly contributionCount: number
  readonly uniqueBlockCount: number
  readonly unknownRemovals: number
  readonly capacityFailures: number
  /** Full scan of nonzero words: diagnostic only. */
  readonly occupiedBucketCount: number
  readonly occupiedSlotCount: number
}

export interface DcCkfPublicationStats {
  readonly pendingEvents: number
  readonly physicalTouches: number
  readonly distinctTouchedBuckets: number
  readonly emittedImages: number
  readonly netRevertedBuckets: number
}

export interface DcCkfMemoryStats {
  readonly memberSetCapacity: number
  readonly refcountCapacity: number
  readonly filterBytes: number
  readonly dirtyTrackingBytes: number
  readonly insertionScratchCapacity: number
  /** Bytes of every exact-ownership table (member sets and refcounts). */
  readonly ownershipBytes: number
}

export interface DcCkfStats {
  readonly aggregation: DcCkfAggregationStats
  readonly publication: DcCkfPublicationStats
  readonly memory: DcCkfMemoryStats
}

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
const E_CAPACITY = -1
const E_ALLOCATION = -2
const E_DEGREE = -3
const E_INVARIANT = -4

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

const saturating = (value: number): number => Math.min(value, Number.MAX_SAFE_INTEGER)

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
  private owners = new OwnershipTable()

  // Mutation log of the current insert/remove: [bucket, beforeLo, beforeHi]*.
  private readonly log: Uint32Array
  private logLen = 0

  // Publication window.
  private dirtyBits: Uint32Array
  private dirtyBuckets: Uint32Array
  private dirtyOriginals: Uint32Array
  private dirtyCount = 0
  private pendingEvents = 0

  // Telemetry.
  private unknownRemovals = 0
  private capacityFailures = 0
  private physicalTouches = 0
  private distinctTouchedBuckets = 0
  private emittedImages = 0
  private netRevertedBuckets = 0

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
    } catch (cause) {
      throw new CkfBuildError(
        "AllocationFailed",
        `could not allocate a ${bucketCount}-bucket filter: ${cause}`
      )
    }
    this.rng = new SplitMix64(laneRngSeed(config.seed, 0))
  }

  // -------------------------------------------------------------------------------------------
  // Apply

  /** Apply one event; never throws for bad data, errors are returned in the outcome. */
  applyEvent(event: CkfEvent): DcCkfEventOutcome {
    const data = event.data
    if (event.storageTier !== "device" && data._tag !== "Cleared") return IGNORED_OUTCOME
    this.pendingEvents++
    let firstError: KvCacheEventErrorKind | undefined
    let unknown = 0
    switch (data._tag) {
      case "Stored": {
        const hashes = data.blockHashes
        let touched = 0
        for (let i = 0; i + 1 < hashes.length; i += 2)
          touched |= this.owners.touch(mixKey(hashes[i]!, hashes[i + 1]!))
        this.touchSink = touched
        for (let i = 0; i + 1 < hashes.length; i += 2) {
          const code = this.storeHalves(event.workerId, event.dpRank, hashes[i]!, hashes[i + 1]!)
          if (code < 0) {
            if (code === E_CAPACITY) this.capacityFailures++
            if (firstError === undefined) firstError = errorKindOf(code)
          }
        }
        break
      }
      case "Removed": {
        const hashes = data.blockHashes
        for (let i = 0; i + 1 < hashes.length; i += 2) {
          const code = this.removeHalves(event.workerId, event.dpRank, hashes[i]!, hashes[i + 1]!)
          if (code === UNCHANGED) unknown++
          else if (code < 0 && firstError === undefined) firstError = errorKindOf(code)
        }
        break
      }
      case "Cleared": {
        const code = this.removeMemberCode(event.workerId, event.dpRank)
        if (code < 0) firstError = errorKindOf(code)
        break
      }
    }
    this.unknownRemovals = saturating(this.unknownRemovals + unknown)
    const boundary = this.pendingEvents >= this.config.publishEveryNEvents
    return {
      firstError,
      publication: boundary ? this.drainPublication() : undefined,
      unknownRemovals: unknown,
      publicationBoundary: boundary
    }
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

  storeHalves(workerId: string, dpRank: number, hi: number, lo: number): number {
    const h = mixKey(hi, lo)
    const owners = this.owners
    let slot = owners.find(hi, lo, h)
    let m = this.member(workerId, dpRank)
    if (slot >= 0 && m >= 0 && owners.ownsAt(slot, hi, lo, h, m)) return UNCHANGED
    const capacity = owners.slotCapacity
    if (!owners.reserve()) return E_ALLOCATION
    // Growing the table moves entries; look the hash up again.
    if (slot >= 0 && owners.slotCapacity !== capacity) slot = owners.find(hi, lo, h)
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
      addressing.prepareHalves(hi, lo)
      if (!this.insertFingerprint(addressing.fp, addressing.a, addressing.b)) {
        // A capacity omission leaves no exact-state trace, not even an empty member.
        this.releaseIfEmpty(workerId, dpRank, m)
        return E_CAPACITY
      }
      this.commitLog()
      owners.insertFirst(hi, lo, h, m)
      return CHANGED
    }
    const added = owners.addOwner(slot, hi, lo, h, m)
    if (added === OWNER_DUPLICATE) return UNCHANGED
    if (added === OWNER_DEGREE_OVERFLOW) {
      this.releaseIfEmpty(workerId, dpRank, m)
      return E_DEGREE
    }
    return CHANGED
  }

  removeHalves(workerId: string, dpRank: number, hi: number, lo: number): number {
    const m = this.member(workerId, dpRank)
    if (m < 0) return UNCHANGED
    const h = mixKey(hi, lo)
    const owners = this.owners
    const slot = owners.find(hi, lo, h)
    if (slot < 0) return UNCHANGED
    const removed = owners.removeOwner(slot, hi, lo, h, m)
    if (removed === OWNER_UNKNOWN) return UNCHANGED
    if (removed === OWNER_LAST) {
      // The final owner removes one fingerprint copy; a missing copy is reported before any
      // exact-state change.
      if (!this.reserveDirty(1)) return E_ALLOCATION
      const addressing = this.addressing
      addressing.prepareHalves(hi, lo)
      if (!this.removeFingerprint(addressing.fp, addressing.a, addressing.b)) return E_INVARIANT
      this.commitLog()
      owners.deleteLast(slot, hi, lo, h, m)
    }
    this.releaseIfEmpty(workerId, dpRank, m)
    return CHANGED
  }

  private removeMemberCode(workerId: string, dpRank: number): number {
    const m = this.member(workerId, dpRank)
    if (m < 0) return UNCHANGED
    const hashes = this.owners.hashesOf(m)
    for (let i = 0; i < hashes.length; i += 2) {
      const code = this.removeHalves(workerId, dpRank, hashes[i]!, hashes[i + 1]!)
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

  /**
   * Insert `fp` into bucket a or b: the first empty slot in a, then in b, else bounded kicks with
   * SplitMix64 and a reverse rollback on failure. The RNG is not rolled back.
   */
  private insertFingerprint(fp: number, a: number, b: number): boolean {
    this.logLen = 0
    const slots = this.slots16
    let empty = this.firstEmpty(a)
    if (empty >= 0) {
      this.logWrite(a)
      slots[(a << 2) + empty] = fp
      return true
    }
    empty = this.firstEmpty(b)
    if (empty >= 0) {
      this.logWrite(b)
      slots[(b << 2) + empty] = fp
      return true
    }
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

  /** Zero the first slot holding `fp` in bucket a, then b. */
  private removeFingerprint(fp: number, a: number, b: number): boolean {
    this.logLen = 0
    const slots = this.slots16
    for (let pass = 0; pass < 2; pass++) {
      const bucket = pass === 0 ? a : b
      const base = bucket << 2
      for (let i = 0; i < 4; i++) {
        if (slots[base + i] === fp) {
          this.logWrite(bucket)
          slots[base + i] = 0
          return true
        }
      }
    }
    return false
  }

  /** Report the logged writes of a successful mutation to the dirty window, in write order. */
  private commitLog(): void {
    const log = this.log
    for (let n = 0; n < this.logLen; n += 3) this.markDirty(log[n]!, log[n + 1]!, log[n + 2]!)
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

  private markDirty(bucket: number, lo: number, hi: number): void {
    const bit = 1 << (bucket & 31)
    const word = bucket >>> 5
    const bits = this.dirtyBits
    if ((bits[word]! & bit) !== 0) return
    bits[word] = bits[word]! | bit
    const n = this.dirtyCount
    this.dirtyBuckets[n] = bucket
    this.dirtyOriginals[2 * n] = lo
    this.dirtyOriginals[2 * n + 1] = hi
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
    let images = 0
    for (let n = 0; n < dirty; n++) {
      const b = buckets[n]!
      if (words[2 * b] !== originals[2 * n] || words[2 * b + 1] !== originals[2 * n + 1]) images++
    }
    let batch: DcCkfPublicationBatch | undefined
    if (images > 0) {
      const out = new Uint32Array(images * 3)
      let k = 0
      for (let n = 0; n < dirty; n++) {
        const b = buckets[n]!
        const lo = words[2 * b]!
        const hi = words[2 * b + 1]!
        if (lo !== originals[2 * n] || hi !== originals[2 * n + 1]) {
          out[k] = b
          out[k + 1] = lo
          out[k + 2] = hi
          k += 3
        }
      }
      batch = new DcCkfPublicationBatch(out)
    }
    for (let n = 0; n < dirty; n++) {
      const b = buckets[n]!
      bits[b >>> 5] = 0
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
    const replaced = new Set(replacements.map((r) => memberKey(r.workerId, r.dpRank)))
    // Retained owners are re-stored in table order: placement may differ from the old layout,
    // but ownership and refcounts are identical (placement is history-dependent anyway).
    let failure = 0
    const owners = this.owners
    owners.forEachEdge((m, hi, lo) => {
      if (failure < 0) return
      const workerId = owners.workerOf(m)
      const dpRank = owners.rankOf(m)
      if (replaced.has(memberKey(workerId, dpRank))) return
      const code = next.storeHalves(workerId, dpRank, hi, lo)
      if (code < 0) failure = code
    })
    if (failure < 0) return new KvCacheEventError(errorKindOf(failure))
    for (const replacement of [...replacements].sort(compareMembers)) {
      const pairs = replacement.hashes
      for (let i = 0; i + 1 < pairs.length; i += 2) {
        const code = next.storeHalves(replacement.workerId, replacement.dpRank, pairs[i]!, pairs[i + 1]!)
        if (code < 0) return new KvCacheEventError(errorKindOf(code))
      }
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
      if (newWords[2 * b] !== lo || newWords[2 * b + 1] !== hi) next.markDirty(b, lo, hi)
    }
    for (let b = 0; b < this.bucketCount; b++) {
      const lo = oldWords[2 * b]!
      const hi = oldWords[2 * b + 1]!
      if ((this.dirtyBits[b >>> 5]! & (1 << (b & 31))) !== 0) continue
      if (newWords[2 * b] !== lo || newWords[2 * b + 1] !== hi) {
        if (!next.reserveDirty(1)) return new KvCacheEventError("AllocationFailed")
        next.markDirty(b, lo, hi)
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

  /** `replace_rank`: one member's complete replacement. */
  replaceRank(
    workerId: string,
    dpRank: number,
    hashes: Uint32Array
  ): DcCkfPublicationBatch | undefined | KvCacheEventError | CkfBuildError {
    return this.replaceRanks([{ workerId, dpRank, hashes }])
  }

  private adopt(next: DcCkfState): void {
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

  /** Exact refcount of a hash (0 when untracked). */
  refcount(hash: bigint): number {
    const h = BigInt.asUintN(64, hash)
    const hi = hiOf(h)
    const lo = loOf(h)
    const slot = this.owners.find(hi, lo, mixKey(hi, lo))
    return slot < 0 ? 0 : this.owners.countAt(slot)
  }

  /** Whether a member owns a hash. */
  owns(workerId: string, dpRank: number, hash: bigint): boolean {
    const m = this.owners.memberIndex(memberKey(workerId, dpRank))
    if (m < 0) return false
    const v = BigInt.asUintN(64, hash)
    const hi = hiOf(v)
    const lo = loOf(v)
    const h = mixKey(hi, lo)
    const slot = this.owners.find(hi, lo, h)
    return slot >= 0 && this.owners.ownsAt(slot, hi, lo, h, m)
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
    return m < 0 ? new Uint32Array(0) : this.owners.hashesOf(m)
  }

  /** Block counts per member, sorted by (worker id, dp rank). */
  memberCounts(): Array<MemberCount> {
    const owners = this.owners
    return owners
      .memberIndices()
      .map((m) => ({ workerId: owners.workerOf(m), dpRank: owners.rankOf(m), count: owners.blocksOf(m) }))
      .sort(compareMembers)
  }

  stats(): DcCkfStats {
    const owners = this.owners
    let occupied = 0
    const words = this.words32
    for (let b = 0; b < this.bucketCount; b++) if ((words[2 * b]! | words[2 * b + 1]!) !== 0) occupied++
    return {
      aggregation: {
        memberCount: owners.memberCount,
        contributionCount: owners.contributions,
        uniqueBlockCount: owners.size,
        unknownRemovals: this.unknownRemovals,
        capacityFailures: this.capacityFailures,
        occupiedBucketCount: occupied,
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
        ownershipBytes: owners.byteSize
      }
    }
  }
}
