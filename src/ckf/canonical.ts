/**
 * A canonically addressed producer (PROTOCOL §3.3, Dynamo's newest `cuckoo/dc.rs`): the filter,
 * the exact ownership and the refcounts are keyed by the canonical sequence hash of each block,
 * chained from the blocks' local (tokens) hashes, while each source keeps speaking its engine's
 * external hashes. Per member, a `LineageTable` maps external → canonical: a stored batch's
 * parent resolves through it, and a removal by external hash finds its block.
 *
 * - A Stored event is validated before anything changes: a parent that is not in the member's
 *   lineage is `ParentBlockNotFound` (counted), an external hash already mapped to another
 *   canonical hash is `InvalidBlockSequence`. Then its mappings are committed and its canonical
 *   hashes stored as one batch. A block omitted for capacity keeps its mapping, so a later store
 *   of it re-offers it and a removal of it is an unknown no-op in the filter.
 * - Two external hashes of one member that chain to the same canonical hash (aliases, e.g. the
 *   same tokens under two cache salts) own it once; the member keeps owning it until its last
 *   alias is removed.
 * - Removed resolves each external hash and forgets its mapping; an unmapped one is an unknown
 *   removal. Cleared drops the member's ownership and lineage together.
 * - Partial history (PROTOCOL §3.3 ◆3). An engine source's Stored event (`skipUnanchored`) whose
 *   parent the lineage does not know is no fault: the relay joined after the engine stored the
 *   parent, or could not replay that far. Its blocks (and so, later, their descendants, whose
 *   parents are then unknown too) are skipped and counted as unanchored, and the member's history
 *   is partial until a Cleared or a rank replacement starts it afresh. A partial member's removal
 *   of an external hash it never mapped is expected (a block from before its history) and is
 *   counted apart from unknown removals.
 * - A rank replacement replays its dump in order (Stored, Removed) into a fresh lineage, so a
 *   child before its parent is `ParentBlockNotFound`, and installs the result transactionally.
 *
 * - Storage tiers (PROTOCOL §5.1 ◆3). Host and disk events keep exact per-member ownership in
 *   `LowerTiers` (see `tiers.ts`) beside the device tier; only the device tier feeds the filter
 *   and its publication, so a device-only pool works as before. A removal with a medium removes
 *   that tier's copy only; Cleared clears every tier of the rank. A tokens-less store
 *   (`resolveThroughLineage`) resolves each block through the rank's lineage, which is the union
 *   of the device lineage and the tiers' own: an external hash stays resolvable while any tier of
 *   the rank holds it, and a device store whose parent only a lower tier still holds chains from
 *   it. A block the lineage does not know is skipped as unanchored and the member's history is
 *   partial.
 * - Worker queries (`queryWorkers`, see `workerQuery.ts`): per member, prefix depths on the device
 *   and cumulatively through the host and disk tiers, and per-block device refcounts.
 *
 * Blocks without local hashes (a Dynamo worker that sent none) use their external hash as the
 * local one.
 */

import type { CkfConfig } from "./config.js"
import type { CkfBuildError } from "./errors.js"
import { KvCacheEventError, type KvCacheEventErrorKind } from "./errors.js"
import type { CkfEvent, CkfMemberRef, CkfStoredData } from "./events.js"
import { compareMembers, memberKey } from "./events.js"
import { LINEAGE_ADDED, LINEAGE_CONFLICT, LineageTable } from "./lineage.js"
import {
  type DcCkfEventOutcome,
  type DcCkfPublicationBatch,
  DcCkfState,
  type DcCkfStats,
  type RankReplacement,
  REMOVED,
  STORE_UNCHANGED,
  STORED
} from "./state.js"
import { DISK_TIER, HOST_TIER, type LowerTierIndex, LowerTiers, lowerTierOf } from "./tiers.js"
import { sequenceHashesInto } from "./tokens.js"
import {
  type QueryMember,
  type QueryPlan,
  queryPlan,
  runWorkerQuery,
  type WorkerQueryResult
} from "./workerQuery.js"

/** A rank's replacement as the replay-ordered events of its dump. */
export interface RankReplacementEvents extends CkfMemberRef {
  readonly events: ReadonlyArray<CkfEvent>
}

/** The lineage table's size: entries and bytes. */
export interface CanonicalLineageStats {
  readonly lineageEntries: number
  readonly lineageBytes: number
  /** Stored batches rejected because their parent was not in the member's lineage. */
  readonly parentNotFound: number
  /** Stored batches rejected because an external hash was mapped to another canonical hash. */
  readonly invalidSequences: number
}

const rejected = (kind: KvCacheEventErrorKind): DcCkfEventOutcome => ({
  firstError: kind,
  publication: undefined,
  unknownRemovals: 0,
  publicationBoundary: false,
  unanchoredBlocks: 0
})

const unanchored = (blocks: number): DcCkfEventOutcome => ({
  firstError: undefined,
  publication: undefined,
  unknownRemovals: 0,
  publicationBoundary: false,
  unanchoredBlocks: blocks
})
const PARENT_NOT_FOUND = rejected("ParentBlockNotFound")
const INVALID_SEQUENCE = rejected("InvalidBlockSequence")
/** A lower-tier event that applied cleanly: the filter and its publication are untouched. */
const TIER_APPLIED: DcCkfEventOutcome = Object.freeze({
  firstError: undefined,
  publication: undefined,
  unknownRemovals: 0,
  publicationBoundary: false,
  unanchoredBlocks: 0
})

/** One member's blocks per tier: `blocks` on the device (as `/v1/stats` shows it), host, disk. */
export interface MemberTierCount extends CkfMemberRef {
  readonly blocks: number
  readonly hostBlocks: number
  readonly diskBlocks: number
}

/** Lower-tier totals and memory of a canonical pool. */
export interface TierStats {
  /** (member, block) edges on the host tier and on the disk tier. */
  readonly hostEdges: number
  readonly diskEdges: number
  readonly lineageEntries: number
  readonly lineageBytes: number
  /** Bytes of the tiers' owner tables (blocks, refcounts and their owners). */
  readonly ownershipBytes: number
  /** `(lineageBytes + ownershipBytes) / (hostEdges + diskEdges)`, 0 without edges. */
  readonly bytesPerEdge: number
}

/** Options of `queryWorkers`. */
export interface WorkerQueryOptions {
  /**
   * The members to answer for, in this order (a pool's expected ranks: one holding nothing is
   * listed with zero depths). Default: every member holding something on any tier, sorted by
   * (worker id, dp rank).
   */
  readonly members?: ReadonlyArray<CkfMemberRef> | undefined
}

const aliasKey = (m: number, hi: number, lo: number): string => `${m}:${hi}:${lo}`

/** Where `storeLineage` leaves its touched words, so the loads stay. */
const touchSink = { value: 0 }

/** `storeLineage` rejections; a result ≥ 0 is the number of new mappings. */
const PARENT_MISSING = -1
const SEQUENCE_INVALID = -2

/**
 * Maps one Stored batch's external hashes to their canonical hashes in member `key`'s lineage,
 * writing the canonical hashes to `canon` and 1 in `added[i]` for each new mapping. A rejected
 * batch (`PARENT_MISSING`, `SEQUENCE_INVALID`) leaves the lineage as it was: the mappings added
 * before an external hash was found mapped to another canonical hash (earlier, or earlier in the
 * batch) are taken back. One probe per block both checks and inserts; rejections are rare.
 */
const storeLineage = (
  lineage: LineageTable,
  key: string,
  data: CkfStoredData,
  canon: Uint32Array,
  added: Uint8Array,
  scratch: Uint32Array,
  /** The parent's canonical hash is in `scratch` already (found on a lower tier). */
  parentResolved = false
): number => {
  const ext = data.blockHashes
  const local = data.tokensHashes ?? ext
  const n = ext.length >>> 1
  if (local.length >>> 1 !== n) return SEQUENCE_INVALID
  const known = lineage.memberIndex(key)
  // The blocks' lineage slots are loaded first, so their misses overlap the parent's lookup and
  // the chaining, which do not depend on them.
  if (known >= 0) touchSink.value = lineage.touch(known, ext, n)
  const parent = data.parentHash
  if (parent !== undefined && !parentResolved && !lineage.get(known, parent, 0, scratch, 0))
    return PARENT_MISSING
  sequenceHashesInto(local, 0, n, parent === undefined ? undefined : scratch, 0, canon, 0)
  const m = known >= 0 ? known : lineage.ensureMember(key)
  let count = 0
  for (let i = 0; i < n; i++) {
    const code = lineage.insertChecked(m, ext, 2 * i, canon, 2 * i)
    if (code === LINEAGE_CONFLICT) {
      for (let j = 0; j < i; j++) {
        if (added[j] === 1) lineage.delete(key, m, ext, 2 * j, scratch, 0)
      }
      // A member registered for this batch alone goes again.
      if (known < 0 && lineage.entriesOf(lineage.memberIndex(key)) === 0) lineage.clearMember(key)
      return SEQUENCE_INVALID
    }
    const fresh = code === LINEAGE_ADDED ? 1 : 0
    added[i] = fresh
    count += fresh
  }
  return count
}

/**
 * The producer state addressed by canonical sequence hashes: it keeps each rank's
 * external-to-canonical lineage.
 */
export class CanonicalCkfState extends DcCkfState {
  private lineage: LineageTable
  /** Extra aliases per (lineage member, canonical hash): owned once, kept until the last goes. */
  private aliases = new Map<string, number>()
  /** The host and disk tiers (PROTOCOL §5.1 ◆3): exact ownership, outside the filter. */
  private tiers: LowerTiers
  private canon = new Uint32Array(64)
  private ext = new Uint32Array(64)
  private added = new Uint8Array(32)
  private codes = new Int32Array(32)
  private queryKeys = new Uint32Array(128)
  private lastWorkerId = ""
  private lastDpRank = -1
  private lastKey = ""
  private readonly scratch = new Uint32Array(2)
  private parentNotFound = 0
  private invalidSequences = 0
  private lineageUnknownRemovals = 0
  private unanchoredBlocks = 0
  private unanchoredRemovals = 0
  /** Members whose history is partial, by member key. */
  private readonly partial = new Map<string, CkfMemberRef>()
  /** The members a query reads, rebuilt when a table's membership changes (see `directory`). */
  private queryDirectory: ReadonlyArray<QueryMember> = []
  /** The plan of a query without a member filter: every member of the directory. */
  private queryDirectoryPlan: QueryPlan = queryPlan([])
  private queryDirectoryByKey = new Map<string, QueryMember>()
  private directoryOwners: unknown = undefined
  private directoryOwnersVersion = -1
  private directoryTiersVersion = -1
  /** The plan of the last member filter, while the filter array and the directory stay the same. */
  private filterMembers: ReadonlyArray<CkfMemberRef> | undefined = undefined
  private filterDirectory: ReadonlyArray<QueryMember> | undefined = undefined
  private filterPlan: QueryPlan = queryPlan([])

  constructor(config: CkfConfig) {
    super(config)
    this.lineage = new LineageTable()
    this.tiers = new LowerTiers(this.addressing, config.expectedBlocksPerDc)
  }

  /** The member key of the last event's (worker, rank): consecutive events mostly share it. */
  private keyOf(workerId: string, dpRank: number): string {
    if (workerId !== this.lastWorkerId || dpRank !== this.lastDpRank) {
      this.lastKey = memberKey(workerId, dpRank)
      this.lastWorkerId = workerId
      this.lastDpRank = dpRank
    }
    return this.lastKey
  }

  private addedFor(n: number): Uint8Array {
    if (this.added.length < n) this.added = new Uint8Array(Math.max(n, 2 * this.added.length))
    return this.added
  }

  private codesFor(n: number): Int32Array {
    if (this.codes.length < n) this.codes = new Int32Array(Math.max(n, 2 * this.codes.length))
    return this.codes
  }

  private canonFor(n: number): Uint32Array {
    if (this.canon.length < 2 * n) this.canon = new Uint32Array(Math.max(2 * n, 2 * this.canon.length))
    return this.canon
  }

  override applyEvent(event: CkfEvent): DcCkfEventOutcome {
    const data = event.data
    if (data._tag === "Cleared") {
      this.forgetMember(event.workerId, event.dpRank)
      return super.applyEvent(event)
    }
    if (event.storageTier !== "device") return this.applyLowerTier(event, data)
    const key = this.keyOf(event.workerId, event.dpRank)
    const lineage = this.lineage
    const workerId = event.workerId
    const dpRank = event.dpRank
    if (data._tag === "Stored") {
      let n = data.blockHashes.length >>> 1
      const canon = this.canonFor(n)
      const added = this.addedFor(n)
      let stored: number
      let skipped = 0
      if (data.resolveThroughLineage === true) {
        const resolved = this.resolveDeviceBlocks(key, data.blockHashes, n, canon, added)
        skipped = n - resolved
        n = resolved
        stored = this.resolvedAdded
        if (skipped > 0) {
          this.unanchoredBlocks += skipped
          this.markPartialKey(key, workerId, dpRank)
          if (n === 0) return unanchored(skipped)
        }
      } else {
        stored = storeLineage(lineage, key, data, canon, added, this.scratch)
        // The parent may be held on a lower tier only: the rank's lineage is every tier's.
        if (
          stored === PARENT_MISSING &&
          !this.tiers.isEmpty &&
          this.tiers.resolveLower(key, data.parentHash!, 0, this.scratch, 0)
        ) {
          stored = storeLineage(lineage, key, data, canon, added, this.scratch, true)
        }
      }
      if (stored === PARENT_MISSING) {
        if (data.skipUnanchored === true) {
          this.unanchoredBlocks += n
          this.markPartialKey(key, workerId, dpRank)
          return unanchored(n)
        }
        this.parentNotFound++
        return PARENT_NOT_FOUND
      }
      if (stored === SEQUENCE_INVALID) {
        this.invalidSequences++
        return INVALID_SEQUENCE
      }
      let outcome: DcCkfEventOutcome
      if (stored === 0) outcome = this.applyHashes(STORED, workerId, dpRank, canon, n)
      else {
        // A newly mapped external hash whose canonical hash the member already owned (before or
        // earlier in this batch) is an alias: the store reports it as unchanged.
        const m = lineage.memberIndex(key)
        const codes = this.codesFor(n)
        this.storeCodes = codes
        outcome = this.applyHashes(STORED, workerId, dpRank, canon, n)
        this.storeCodes = undefined
        for (let i = 0; i < n; i++) {
          if (added[i] === 0 || codes[i] !== STORE_UNCHANGED) continue
          const alias = aliasKey(m, canon[2 * i]!, canon[2 * i + 1]!)
          this.aliases.set(alias, (this.aliases.get(alias) ?? 0) + 1)
        }
      }
      return skipped === 0 ? outcome : { ...outcome, unanchoredBlocks: skipped }
    }
    // Removed: resolve through the lineage; what it does not map is an unknown removal.
    const ext = data.blockHashes
    const n = ext.length >>> 1
    const canon = this.canonFor(n)
    const m = lineage.memberIndex(key)
    let resolved = 0
    let unknown = 0
    for (let i = 0; i < n; i++) {
      if (!lineage.delete(key, m, ext, 2 * i, canon, 2 * resolved)) {
        unknown++
        continue
      }
      if (this.aliases.size > 0) {
        const alias = aliasKey(m, canon[2 * resolved]!, canon[2 * resolved + 1]!)
        const extra = this.aliases.get(alias)
        if (extra !== undefined) {
          if (extra === 1) this.aliases.delete(alias)
          else this.aliases.set(alias, extra - 1)
          continue
        }
      }
      resolved++
    }
    const outcome = this.applyHashes(REMOVED, workerId, dpRank, canon, resolved)
    if (unknown === 0) return outcome
    if (this.partial.has(key)) {
      this.unanchoredRemovals += unknown
      return outcome
    }
    this.lineageUnknownRemovals += unknown
    return { ...outcome, unknownRemovals: outcome.unknownRemovals + unknown }
  }

  /** New device mappings made by the last `resolveDeviceBlocks`. */
  private resolvedAdded = 0

  /**
   * A tokens-less device store: each external hash is resolved through the rank's lineage (the
   * device's first: a block mapped already is re-offered, as a repeated store is). The resolvable
   * blocks are compacted to the front of `canon`, mapped in the device lineage (`added[i]` = 1
   * for a new mapping, counted in `resolvedAdded`); returns how many there are.
   */
  private resolveDeviceBlocks(
    key: string,
    ext: Uint32Array,
    n: number,
    canon: Uint32Array,
    added: Uint8Array
  ): number {
    if (this.ext.length < 2 * n) this.ext = new Uint32Array(Math.max(2 * n, 2 * this.ext.length))
    const pending = this.ext
    const lineage = this.lineage
    let count = 0
    for (let i = 0; i < n; i++) {
      if (!this.tiers.resolve(lineage, key, ext, 2 * i, canon, 2 * count)) continue
      pending[2 * count] = ext[2 * i]!
      pending[2 * count + 1] = ext[2 * i + 1]!
      count++
    }
    this.resolvedAdded = 0
    if (count === 0) return 0
    const m = lineage.ensureMember(key)
    for (let i = 0; i < count; i++) {
      const fresh = lineage.insertChecked(m, pending, 2 * i, canon, 2 * i) === LINEAGE_ADDED ? 1 : 0
      added[i] = fresh
      this.resolvedAdded += fresh
    }
    return count
  }

  /** A host or disk event (PROTOCOL §5.1 ◆3): that tier's exact ownership; the filter is untouched. */
  private applyLowerTier(event: CkfEvent, data: CkfEvent["data"]): DcCkfEventOutcome {
    const t = lowerTierOf(event.storageTier) as LowerTierIndex
    const key = this.keyOf(event.workerId, event.dpRank)
    if (data._tag === "Stored") {
      const result = this.tiers.applyStored(t, this.lineage, key, event, data)
      if (result.error === "ParentBlockNotFound") {
        this.parentNotFound++
        return PARENT_NOT_FOUND
      }
      if (result.error === "InvalidBlockSequence") {
        this.invalidSequences++
        return INVALID_SEQUENCE
      }
      if (result.unanchored === 0) return TIER_APPLIED
      this.unanchoredBlocks += result.unanchored
      this.markPartialKey(key, event.workerId, event.dpRank)
      return unanchored(result.unanchored)
    }
    if (data._tag !== "Removed") return TIER_APPLIED
    const unknown = this.tiers.applyRemoved(t, key, data.blockHashes).unknownRemovals
    if (unknown === 0) return TIER_APPLIED
    if (this.partial.has(key)) {
      this.unanchoredRemovals += unknown
      return TIER_APPLIED
    }
    this.lineageUnknownRemovals += unknown
    return { ...TIER_APPLIED, unknownRemovals: unknown }
  }

  private markPartialKey(key: string, workerId: string, dpRank: number): void {
    if (!this.partial.has(key)) this.partial.set(key, { workerId, dpRank })
  }

  /**
   * Marks the member's history partial: its source could not deliver everything it stored before
   * now (a replay that did not reach back far enough, a recovery that failed). Cleared, a rank
   * reset and a rank replacement make it complete again.
   */
  markPartial(workerId: string, dpRank: number): void {
    this.markPartialKey(memberKey(workerId, dpRank), workerId, dpRank)
  }

  /** Blocks skipped as unanchored since the pool started. */
  get unanchoredBlockCount(): number {
    return this.unanchoredBlocks
  }

  /** Members whose history is partial, sorted by (worker id, dp rank). */
  partialMembers(): Array<CkfMemberRef> {
    return [...this.partial.values()].sort(compareMembers)
  }

  /** Forgets the member's lineage on every tier, its lower-tier ownership and its partial mark. */
  private forgetMember(workerId: string, dpRank: number): void {
    const key = memberKey(workerId, dpRank)
    this.partial.delete(key)
    this.tiers.clearMember(key)
    const m = this.lineage.memberIndex(key)
    if (m < 0) return
    if (this.aliases.size > 0) {
      const prefix = `${m}:`
      for (const alias of [...this.aliases.keys()]) if (alias.startsWith(prefix)) this.aliases.delete(alias)
    }
    this.lineage.clearMember(key)
  }

  override removeMember(workerId: string, dpRank: number): undefined | KvCacheEventError {
    const error = super.removeMember(workerId, dpRank)
    if (error === undefined) this.forgetMember(workerId, dpRank)
    return error
  }

  /** `remove_worker`: every rank of the worker, on every tier (a rank may hold only lower-tier blocks). */
  override removeWorker(workerId: string): DcCkfPublicationBatch | undefined | KvCacheEventError {
    const result = super.removeWorker(workerId)
    if (result instanceof Error) return result
    const ranks = [...this.tiers.memberRefs()].filter((ref) => ref.workerId === workerId)
    for (const ref of ranks) this.forgetMember(ref.workerId, ref.dpRank)
    return result
  }

  /**
   * Replace members from their replay-ordered dumps: each dump is replayed (Stored with parents
   * and local hashes, Removed, on every tier) into a fresh lineage and fresh lower tiers, the
   * resulting device sets replace the members' device ownership transactionally, and only then
   * do the new lineages and lower tiers replace the old.
   */
  replaceRanksFromEvents(
    replacements: ReadonlyArray<RankReplacementEvents>
  ): DcCkfPublicationBatch | undefined | KvCacheEventError | CkfBuildError {
    const built: Array<{
      readonly key: string
      readonly entries: Uint32Array
      readonly hashes: RankReplacement
      readonly tiers: LowerTiers
      readonly unanchored: number
    }> = []
    for (const replacement of replacements) {
      const table = new LineageTable()
      const tiers = new LowerTiers(this.addressing, this.config.expectedBlocksPerDc)
      const key = memberKey(replacement.workerId, replacement.dpRank)
      const scratch = new Uint32Array(2)
      let skipped = 0
      for (const event of replacement.events) {
        const data = event.data
        if (data._tag === "Cleared") return new KvCacheEventError("InvalidBlockSequence")
        const t = lowerTierOf(event.storageTier)
        if (t >= 0) {
          if (data._tag === "Removed") {
            tiers.applyRemoved(t as LowerTierIndex, key, data.blockHashes)
            continue
          }
          const result = tiers.applyStored(t as LowerTierIndex, table, key, replacement, data)
          if (result.error === "ParentBlockNotFound") this.parentNotFound++
          if (result.error !== undefined) return new KvCacheEventError(result.error)
          skipped += result.unanchored
          continue
        }
        const n = data.blockHashes.length >>> 1
        if (data._tag === "Removed") {
          // Looked up per event: a member whose last entry goes is released, and a later store
          // registers it again.
          const m = table.memberIndex(key)
          for (let i = 0; i < n; i++) table.delete(key, m, data.blockHashes, 2 * i, scratch, 0)
          continue
        }
        if (data.resolveThroughLineage === true) {
          const canon = new Uint32Array(2)
          for (let i = 0; i < n; i++) {
            if (!tiers.resolve(table, key, data.blockHashes, 2 * i, canon, 0)) {
              skipped++
              continue
            }
            table.insertChecked(table.ensureMember(key), data.blockHashes, 2 * i, canon, 0)
          }
          continue
        }
        const canon = new Uint32Array(2 * n)
        let stored = storeLineage(table, key, data, canon, new Uint8Array(n), scratch)
        if (
          stored === PARENT_MISSING &&
          !tiers.isEmpty &&
          tiers.resolveLower(key, data.parentHash!, 0, scratch, 0)
        )
          stored = storeLineage(table, key, data, canon, new Uint8Array(n), scratch, true)
        if (stored === PARENT_MISSING) {
          if (data.skipUnanchored === true) {
            skipped += n
            continue
          }
          this.parentNotFound++
          return new KvCacheEventError("ParentBlockNotFound")
        }
        if (stored === SEQUENCE_INVALID) return new KvCacheEventError("InvalidBlockSequence")
      }
      const entries = table.entries(table.memberIndex(key))
      const hashes = new Uint32Array(entries.length / 2)
      for (let k = 0, h = 0; k < entries.length; k += 4, h += 2) {
        hashes[h] = entries[k + 2]!
        hashes[h + 1] = entries[k + 3]!
      }
      built.push({
        key,
        entries,
        hashes: { workerId: replacement.workerId, dpRank: replacement.dpRank, hashes },
        tiers,
        unanchored: skipped
      })
    }
    const result = super.replaceRanks(built.map((b) => b.hashes))
    if (result instanceof Error) return result
    for (const { key, entries, hashes, tiers, unanchored: skipped } of built) {
      this.forgetMember(hashes.workerId, hashes.dpRank)
      this.tiers.adoptMember(key, hashes, tiers)
      if (skipped > 0) {
        this.unanchoredBlocks += skipped
        this.markPartialKey(key, hashes.workerId, hashes.dpRank)
      }
      if (entries.length === 0) continue
      const m = this.lineage.ensureMember(key)
      const seen = new Set<string>()
      for (let k = 0; k < entries.length; k += 4) {
        this.lineage.insert(m, entries, k, entries, k + 2)
        // Several external hashes of the dump on one canonical hash: aliases, as on the live path.
        const alias = aliasKey(m, entries[k + 2]!, entries[k + 3]!)
        if (seen.has(alias)) this.aliases.set(alias, (this.aliases.get(alias) ?? 0) + 1)
        else seen.add(alias)
      }
    }
    return result
  }

  /** The canonical hash member `(workerId, dpRank)` stored external `hash` under on the device, if any. */
  canonicalOf(workerId: string, dpRank: number, hash: bigint): bigint | undefined {
    const h = BigInt.asUintN(64, hash)
    const m = this.lineage.memberIndex(memberKey(workerId, dpRank))
    const ext = Uint32Array.of(Number(h >> 32n), Number(h & 0xffff_ffffn))
    if (!this.lineage.get(m, ext, 0, this.scratch, 0)) return undefined
    return (BigInt(this.scratch[0]!) << 32n) | BigInt(this.scratch[1]!)
  }

  /**
   * The canonical hashes member `(workerId, dpRank)` holds on a lower tier (`host_pinned`, or the
   * disk tier for `disk` and `external`), as hash pairs in no particular order.
   */
  memberTierHashes(workerId: string, dpRank: number, tier: "host_pinned" | "disk" | "external"): Uint32Array {
    return this.addressing.unmixPairs(
      this.tiers.memberKeys(lowerTierOf(tier) as LowerTierIndex, memberKey(workerId, dpRank))
    )
  }

  /**
   * Blocks per member on each tier, for every member holding something on any tier, sorted by
   * (worker id, dp rank): `blocks` is the device count (what `/v1/stats` calls `blocks`),
   * `hostBlocks` and `diskBlocks` the lower tiers'.
   */
  memberTierCounts(): Array<MemberTierCount> {
    return this.directory().map((member) => {
      const key = memberKey(member.workerId, member.dpRank)
      return {
        workerId: member.workerId,
        dpRank: member.dpRank,
        blocks: this.owners.blocksOf(member.device),
        hostBlocks: this.tiers.blocksOf(HOST_TIER, key),
        diskBlocks: this.tiers.blocksOf(DISK_TIER, key)
      }
    })
  }

  /**
   * Every member holding something on any tier, sorted by (worker id, dp rank); the same array
   * until a table registers or releases a member.
   */
  heldMembers(): ReadonlyArray<CkfMemberRef> {
    return this.directory()
  }

  tierStats(): TierStats {
    const tiers = this.tiers
    const hostEdges = tiers.edgesOn(HOST_TIER)
    const diskEdges = tiers.edgesOn(DISK_TIER)
    const lineageBytes = tiers.lineageBytes
    const ownershipBytes = tiers.ownershipBytes
    const edges = hostEdges + diskEdges
    return {
      hostEdges,
      diskEdges,
      lineageEntries: tiers.lineageEntries,
      lineageBytes,
      ownershipBytes,
      bytesPerEdge: edges === 0 ? 0 : (lineageBytes + ownershipBytes) / edges
    }
  }

  /**
   * Every member holding something on any tier, sorted, with what a query reads of it: rebuilt
   * only when a table registered or released a member (or a rank replacement swapped the owner
   * table), so a query reads no map.
   */
  private directory(): ReadonlyArray<QueryMember> {
    const owners = this.owners
    if (
      owners === this.directoryOwners &&
      owners.membershipVersion === this.directoryOwnersVersion &&
      this.tiers.version === this.directoryTiersVersion
    )
      return this.queryDirectory
    const refs = new Map<string, CkfMemberRef>()
    for (const m of owners.memberIndices()) {
      const workerId = owners.workerOf(m)
      const dpRank = owners.rankOf(m)
      refs.set(memberKey(workerId, dpRank), { workerId, dpRank })
    }
    for (const ref of this.tiers.memberRefs()) refs.set(memberKey(ref.workerId, ref.dpRank), ref)
    const byKey = new Map<string, QueryMember>()
    const members = [...refs.entries()]
      .map(([key, ref]) => {
        const member: QueryMember = {
          workerId: ref.workerId,
          dpRank: ref.dpRank,
          device: owners.memberIndex(key),
          host: this.tiers.ownersOf(HOST_TIER).memberIndex(key),
          disk: this.tiers.ownersOf(DISK_TIER).memberIndex(key)
        }
        byKey.set(key, member)
        return member
      })
      .sort(compareMembers)
    this.queryDirectory = members
    this.queryDirectoryPlan = queryPlan(members)
    this.queryDirectoryByKey = byKey
    this.directoryOwners = owners
    this.directoryOwnersVersion = owners.membershipVersion
    this.directoryTiersVersion = this.tiers.version
    return members
  }

  /**
   * Which member holds how much of a prompt (PROTOCOL §5.1 ◆3): `hashes` holds the prompt's
   * canonical sequence hashes as `[hi, lo]` pairs (`sequenceHashes(localBlockHashes(tokens, …))`,
   * or `sequenceHashes` of a router's local block hashes), of which the first `count` are asked.
   * Per member: the device depth, the cumulative host and disk depths, Dynamo's tier walk, and
   * per block the device refcount (see `workerQuery.ts`). Reads the tables only; exact for the
   * state at the call.
   */
  queryWorkers(
    hashes: Uint32Array,
    count: number = hashes.length >>> 1,
    options: WorkerQueryOptions = {}
  ): WorkerQueryResult {
    if (!Number.isSafeInteger(count) || count < 0 || 2 * count > hashes.length)
      throw new RangeError(`query of ${count} blocks over ${hashes.length >>> 1} hashes`)
    if (this.queryKeys.length < 2 * count)
      this.queryKeys = new Uint32Array(Math.max(2 * count, 2 * this.queryKeys.length))
    const keys = this.queryKeys
    this.addressing.mixBatch(hashes, 0, count, keys, 0)
    this.directory()
    let plan = this.queryDirectoryPlan
    const filter = options.members
    if (filter !== undefined && filter === this.filterMembers && this.queryDirectory === this.filterDirectory)
      plan = this.filterPlan
    else if (filter !== undefined) {
      const byKey = this.queryDirectoryByKey
      const members = filter.map(
        (ref) =>
          byKey.get(memberKey(ref.workerId, ref.dpRank)) ?? {
            workerId: ref.workerId,
            dpRank: ref.dpRank,
            device: -1,
            host: -1,
            disk: -1
          }
      )
      plan = queryPlan(members, filter)
      this.filterMembers = filter
      this.filterDirectory = this.queryDirectory
      this.filterPlan = plan
    }
    return runWorkerQuery(
      this.owners,
      this.tiers.ownersOf(HOST_TIER),
      this.tiers.ownersOf(DISK_TIER),
      keys,
      count,
      plan
    )
  }

  lineageStats(): CanonicalLineageStats {
    return {
      lineageEntries: this.lineage.size,
      lineageBytes: this.lineage.bytes,
      parentNotFound: this.parentNotFound,
      invalidSequences: this.invalidSequences
    }
  }

  override stats(): DcCkfStats {
    const stats = super.stats()
    return {
      ...stats,
      aggregation: {
        ...stats.aggregation,
        unknownRemovals: stats.aggregation.unknownRemovals + this.lineageUnknownRemovals,
        parentNotFound: this.parentNotFound,
        unanchoredBlocks: this.unanchoredBlocks,
        unanchoredRemovals: this.unanchoredRemovals
      },
      memory: { ...stats.memory, lineageEntries: this.lineage.size, lineageBytes: this.lineage.bytes }
    }
  }
}
