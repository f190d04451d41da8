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
import { sequenceHashesInto } from "./tokens.js"

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
  scratch: Uint32Array
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
  if (parent !== undefined && !lineage.get(known, parent, 0, scratch, 0)) return PARENT_MISSING
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
  private canon = new Uint32Array(64)
  private added = new Uint8Array(32)
  private codes = new Int32Array(32)
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

  constructor(config: CkfConfig) {
    super(config)
    this.lineage = new LineageTable()
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
    if (event.storageTier !== "device" && data._tag !== "Cleared") return super.applyEvent(event)
    if (data._tag === "Cleared") {
      this.forgetMember(event.workerId, event.dpRank)
      return super.applyEvent(event)
    }
    const key = this.keyOf(event.workerId, event.dpRank)
    const lineage = this.lineage
    const workerId = event.workerId
    const dpRank = event.dpRank
    if (data._tag === "Stored") {
      const n = data.blockHashes.length >>> 1
      const canon = this.canonFor(n)
      const added = this.addedFor(n)
      const stored = storeLineage(lineage, key, data, canon, added, this.scratch)
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
      if (stored === 0) return this.applyHashes(STORED, workerId, dpRank, canon, n)
      // A newly mapped external hash whose canonical hash the member already owned (before or
      // earlier in this batch) is an alias: the store reports it as unchanged.
      const m = lineage.memberIndex(key)
      const codes = this.codesFor(n)
      this.storeCodes = codes
      const outcome = this.applyHashes(STORED, workerId, dpRank, canon, n)
      this.storeCodes = undefined
      for (let i = 0; i < n; i++) {
        if (added[i] === 0 || codes[i] !== STORE_UNCHANGED) continue
        const alias = aliasKey(m, canon[2 * i]!, canon[2 * i + 1]!)
        this.aliases.set(alias, (this.aliases.get(alias) ?? 0) + 1)
      }
      return outcome
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

  private forgetMember(workerId: string, dpRank: number): void {
    const key = memberKey(workerId, dpRank)
    this.partial.delete(key)
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

  /**
   * Replace members from their replay-ordered dumps: each dump is replayed (Stored with parents
   * and local hashes, Removed) into a fresh lineage, the resulting canonical sets replace the
   * members' ownership transactionally, and only then do the new lineages replace the old.
   */
  replaceRanksFromEvents(
    replacements: ReadonlyArray<RankReplacementEvents>
  ): DcCkfPublicationBatch | undefined | KvCacheEventError | CkfBuildError {
    const built: Array<{
      readonly key: string
      readonly entries: Uint32Array
      readonly hashes: RankReplacement
      readonly unanchored: number
    }> = []
    for (const replacement of replacements) {
      const table = new LineageTable()
      const key = memberKey(replacement.workerId, replacement.dpRank)
      const scratch = new Uint32Array(2)
      let skipped = 0
      for (const event of replacement.events) {
        if (event.storageTier !== "device") continue
        const data = event.data
        if (data._tag === "Cleared") return new KvCacheEventError("InvalidBlockSequence")
        const n = data.blockHashes.length >>> 1
        if (data._tag === "Removed") {
          // Looked up per event: a member whose last entry goes is released, and a later store
          // registers it again.
          const m = table.memberIndex(key)
          for (let i = 0; i < n; i++) table.delete(key, m, data.blockHashes, 2 * i, scratch, 0)
          continue
        }
        const canon = new Uint32Array(2 * n)
        const stored = storeLineage(table, key, data, canon, new Uint8Array(n), scratch)
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
        unanchored: skipped
      })
    }
    const result = super.replaceRanks(built.map((b) => b.hashes))
    if (result instanceof Error) return result
    for (const { key, entries, hashes, unanchored: skipped } of built) {
      this.forgetMember(hashes.workerId, hashes.dpRank)
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

  /** The canonical hash member `(workerId, dpRank)` stored external `hash` under, if any. */
  canonicalOf(workerId: string, dpRank: number, hash: bigint): bigint | undefined {
    const h = BigInt.asUintN(64, hash)
    const m = this.lineage.memberIndex(memberKey(workerId, dpRank))
    const ext = Uint32Array.of(Number(h >> 32n), Number(h & 0xffff_ffffn))
    if (!this.lineage.get(m, ext, 0, this.scratch, 0)) return undefined
    return (BigInt(this.scratch[0]!) << 32n) | BigInt(this.scratch[1]!)
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
