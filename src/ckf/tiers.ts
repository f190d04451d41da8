/**
 * The host and disk tiers of a canonically addressed pool (PROTOCOL §5.1 ◆3): exact ownership per
 * member of the blocks an engine keeps outside the device (vLLM's CPU offloading, `medium:
 * "CPU"`), kept beside the device tier for worker-level queries. Nothing here feeds the CKF or its
 * publication; only the device tier does.
 *
 * Tiers. `host_pinned` is the host tier; `disk` and `external` are the disk tier (PROTOCOL §5.1
 * counts the external media as disk in its answers, as Dynamo folds them into its `disk` figure).
 * `lowerTierOf` maps a `StorageTier` to its index here.
 *
 * Per tier:
 * - per member a lineage (`LineageTable`), external → canonical hash, holding exactly the external
 *   hashes the tier holds: a removal with a medium finds its block there and removes that tier's
 *   copy only;
 * - one `OwnershipTable` for the pool, as the device's: each canonical hash (by its CKF mixed key,
 *   `CkfAddressing.mixBatch`) once, with its refcount and primary owner, and the other owners as
 *   (key, member) edges. A query looks a block up once and learns whether any member holds it on
 *   the tier before it probes a member. External hashes of one member on one tier that resolve to
 *   the same canonical hash (aliases) own it once, until the last of them goes; a side map counts
 *   the extra aliases, as the device tier's does.
 *
 * The rank's lineage (PROTOCOL §3.3) is the union of the device lineage and these: an external
 * hash stays resolvable while any tier of the rank holds it, which is what a tokens-less store
 * (vLLM's offloading connector sends `token_ids: []` and no parent) and a parent link need. A
 * lookup tries the tier's own lineage, then the device's, then the other tier's.
 *
 * Memory: a tier edge (one member holding one block on one tier) costs a lineage slot (16 bytes,
 *   tables 49–80% full) and its share of the owner table (12 bytes a block, plus an edge slot for
 *   each owner beyond the first): a device edge's cost without the filter's share.
 */

import type { CkfAddressing } from "./addressing.js"
import type { CkfMemberRef, CkfStoredData, StorageTier } from "./events.js"
import { LINEAGE_ADDED, LINEAGE_CONFLICT, LINEAGE_PRESENT, LineageTable } from "./lineage.js"
import { OWNER_DUPLICATE, OWNER_LAST, OwnershipTable } from "./ownership.js"
import { sequenceHashesInto } from "./tokens.js"

/** Index of the host tier in `LowerTiers`. */
export const HOST_TIER = 0
/** Index of the disk tier (disk and external media) in `LowerTiers`. */
export const DISK_TIER = 1
/** Index of a lower tier in `LowerTiers`: `HOST_TIER` or `DISK_TIER`. */
export type LowerTierIndex = typeof HOST_TIER | typeof DISK_TIER

/** The lower tier a storage tier is kept in: host, disk, or -1 for the device. */
export const lowerTierOf = (tier: StorageTier): LowerTierIndex | -1 =>
  tier === "device" ? -1 : tier === "host_pinned" ? HOST_TIER : DISK_TIER

/** What one tier event did; a reused value, read before the next event. */
export interface TierApplyResult {
  /** `ParentBlockNotFound` / `InvalidBlockSequence` when the whole event was rejected. */
  error: "ParentBlockNotFound" | "InvalidBlockSequence" | undefined
  /** Blocks skipped because the lineage could not resolve them or their parent. */
  unanchored: number
  /** External hashes removed that the tier did not hold. */
  unknownRemovals: number
}

/** One tier's tables: the members' lineages and the pool's owner table. */
class TierStore {
  readonly lineage = new LineageTable()
  readonly owners: OwnershipTable
  /** Extra aliases per (lineage member index, mixed key). */
  readonly aliases = new Map<string, number>()

  constructor(expectedKeys: number) {
    this.owners = new OwnershipTable(expectedKeys)
  }

  /** Member `om` (owner-table index) comes to hold the mixed key `keys[k, k + 1]`; false when it held it already (an alias). */
  hold(om: number, keys: Uint32Array, k: number): boolean {
    const owners = this.owners
    const key = owners.key
    key[0] = keys[k]!
    key[1] = keys[k + 1]!
    let slot = owners.find()
    if (slot >= 0 && owners.ownsAt(slot, om)) return false
    const capacity = owners.slotCapacity
    // As the device tier's tables, these grow as blocks arrive; a failed allocation is the
    // process running out of memory, not bad input.
    if (!owners.reserve()) throw new RangeError("could not grow a lower tier's owner table")
    if (owners.slotCapacity !== capacity) slot = owners.find()
    if (slot < 0) {
      owners.insertAt(-1 - slot, om)
      return true
    }
    return owners.addOwner(slot, om) !== OWNER_DUPLICATE
  }

  /** Member `om` gives up the mixed key `keys[k, k + 1]`. */
  release(om: number, keys: Uint32Array, k: number): void {
    const owners = this.owners
    const key = owners.key
    key[0] = keys[k]!
    key[1] = keys[k + 1]!
    const slot = owners.find()
    if (slot < 0) return
    if (owners.removeOwner(slot, om) === OWNER_LAST) owners.deleteLast(slot, om)
  }

  /** Drops member `key`'s entries, whose lineage index is `m`. */
  clear(key: string, m: number): void {
    const owners = this.owners
    const om = owners.memberIndex(key)
    if (om >= 0) {
      const held = owners.hashesOf(om)
      for (let k = 0; k < held.length; k += 2) this.release(om, held, k)
      owners.releaseIfEmpty(key, om)
    }
    if (this.aliases.size > 0) {
      const prefix = `${m}:`
      for (const alias of [...this.aliases.keys()]) if (alias.startsWith(prefix)) this.aliases.delete(alias)
    }
    this.lineage.clearMember(key)
  }
}

const aliasKey = (m: number, keys: Uint32Array, k: number): string => `${m}:${keys[k]}:${keys[k + 1]}`

/** Lineage results that rejected a stored batch. */
const STORE_PARENT_MISSING = -1
const STORE_SEQUENCE_INVALID = -2

/**
 * The host and disk tiers of one pool's members. Plain synchronous code over typed arrays; the
 * producer (`CanonicalCkfState`) owns one, and a rank replacement replays into a fresh one.
 */
export class LowerTiers {
  private readonly stores: readonly [TierStore, TierStore]
  /** Members with any entry on a lower tier, by member key. */
  private readonly members = new Map<string, CkfMemberRef>()
  private canon = new Uint32Array(64)
  private keys = new Uint32Array(64)
  /** External hashes of a tokens-less batch's resolvable blocks. */
  private pending = new Uint32Array(64)
  private added = new Uint8Array(32)
  private readonly scratch = new Uint32Array(2)
  private readonly result: TierApplyResult = { error: undefined, unanchored: 0, unknownRemovals: 0 }

  constructor(
    private readonly addressing: CkfAddressing,
    /** The owner tables' sizing hint (the pool's expected blocks): it shapes their growth steps. */
    expectedKeys = 0
  ) {
    this.stores = [new TierStore(expectedKeys), new TierStore(expectedKeys)]
  }

  /** Whether any member holds anything on a lower tier (device-only pools skip every tier step). */
  get isEmpty(): boolean {
    return this.members.size === 0
  }

  /** Changes whenever a member is registered in or released from a tier's owner table. */
  get version(): number {
    return this.stores[0].owners.membershipVersion + this.stores[1].owners.membershipVersion
  }

  /** Members holding something on a lower tier. */
  memberRefs(): IterableIterator<CkfMemberRef> {
    return this.members.values()
  }

  /** Tier `t`'s owner table (a query reads it). */
  ownersOf(t: LowerTierIndex): OwnershipTable {
    return this.stores[t].owners
  }

  /** Blocks member `key` holds on tier `t`. */
  blocksOf(t: LowerTierIndex, key: string): number {
    const owners = this.stores[t].owners
    return owners.blocksOf(owners.memberIndex(key))
  }

  /** Tier edges (member, block) on tier `t`. */
  edgesOn(t: LowerTierIndex): number {
    return this.stores[t].owners.contributions
  }

  get lineageEntries(): number {
    return this.stores[0].lineage.size + this.stores[1].lineage.size
  }

  get lineageBytes(): number {
    return this.stores[0].lineage.bytes + this.stores[1].lineage.bytes
  }

  /** Bytes of the tiers' owner tables. */
  get ownershipBytes(): number {
    return this.stores[0].owners.byteSize + this.stores[1].owners.byteSize
  }

  /** The mixed keys of the blocks member `key` holds on tier `t`, as pairs. */
  memberKeys(t: LowerTierIndex, key: string): Uint32Array {
    const owners = this.stores[t].owners
    const om = owners.memberIndex(key)
    return om < 0 ? new Uint32Array(0) : owners.hashesOf(om)
  }

  private grow(n: number): void {
    if (this.canon.length < 2 * n) {
      const size = Math.max(2 * n, 2 * this.canon.length)
      this.canon = new Uint32Array(size)
      this.keys = new Uint32Array(size)
      this.pending = new Uint32Array(size)
      this.added = new Uint8Array(size / 2)
    }
  }

  /**
   * Resolves member `key`'s external hash `ext[k, k + 1]` through the rank's lineage (tier `first`
   * first, then `device`, then the other tier), writing the canonical hash to `out[at, at + 1]`;
   * false when no tier holds it.
   */
  resolve(
    device: LineageTable,
    key: string,
    ext: Uint32Array,
    k: number,
    out: Uint32Array,
    at: number,
    first: LowerTierIndex = HOST_TIER
  ): boolean {
    const a = this.stores[first].lineage
    if (a.get(a.memberIndex(key), ext, k, out, at)) return true
    if (device.get(device.memberIndex(key), ext, k, out, at)) return true
    const b = this.stores[1 - first]!.lineage
    return b.get(b.memberIndex(key), ext, k, out, at)
  }

  /** Whether a lower tier's lineage (not the device's) resolves `ext[k, k + 1]` for member `key`. */
  resolveLower(key: string, ext: Uint32Array, k: number, out: Uint32Array, at: number): boolean {
    for (const store of this.stores) {
      if (store.lineage.get(store.lineage.memberIndex(key), ext, k, out, at)) return true
    }
    return false
  }

  private unregisterIfEmpty(key: string): void {
    if (this.stores[0].lineage.memberIndex(key) < 0 && this.stores[1].lineage.memberIndex(key) < 0) {
      this.members.delete(key)
    }
  }

  /**
   * Member `ref` (key `key`, lineage index `m` on `store`) comes to hold the canonical hashes
   * `canon` of the blocks whose `added[i]` is 1 (a new lineage mapping); one it held already is an
   * alias.
   */
  private holdAll(
    store: TierStore,
    key: string,
    ref: CkfMemberRef,
    m: number,
    canon: Uint32Array,
    n: number,
    added: Uint8Array
  ): void {
    if (!this.members.has(key)) this.members.set(key, { workerId: ref.workerId, dpRank: ref.dpRank })
    const keys = this.keys
    this.addressing.mixBatch(canon, 0, n, keys, 0)
    const om = store.owners.ensureMember(key, ref.workerId, ref.dpRank)
    for (let i = 0; i < n; i++) {
      if (added[i] === 0) continue
      if (store.hold(om, keys, 2 * i)) continue
      const alias = aliasKey(m, keys, 2 * i)
      store.aliases.set(alias, (store.aliases.get(alias) ?? 0) + 1)
    }
  }

  /**
   * Applies a Stored event on lower tier `t` for member `ref` (key `key`), resolving through the
   * device lineage `device` where the rank's lineage is needed. The result is reused: read it
   * before the next call.
   *
   * - `data.resolveThroughLineage`: each block is named by its external hash alone and resolved
   *   through the rank's lineage; one no tier holds is skipped (counted in `unanchored`).
   * - Otherwise the blocks chain from their parent (resolved through the rank's lineage) and local
   *   hashes like a device store: an unknown parent skips the event as unanchored when
   *   `data.skipUnanchored`, else rejects it (`ParentBlockNotFound`); an external hash mapped to
   *   another canonical hash on any tier of the rank rejects it (`InvalidBlockSequence`), and
   *   nothing of a rejected event stays.
   */
  applyStored(
    t: LowerTierIndex,
    device: LineageTable,
    key: string,
    ref: CkfMemberRef,
    data: CkfStoredData
  ): TierApplyResult {
    const result = this.result
    result.error = undefined
    result.unanchored = 0
    result.unknownRemovals = 0
    const ext = data.blockHashes
    const n = ext.length >>> 1
    if (n === 0) return result
    this.grow(n)
    const store = this.stores[t]
    const canon = this.canon
    const added = this.added
    if (data.resolveThroughLineage === true) {
      // Compact the resolvable blocks to the front: [ext, canonical] pairs of the ones to store.
      const pending = this.pending
      let count = 0
      const own = store.lineage
      const m0 = own.memberIndex(key)
      for (let i = 0; i < n; i++) {
        // Held on this tier already: nothing to do.
        if (own.get(m0, ext, 2 * i, canon, 2 * count)) continue
        if (!this.resolve(device, key, ext, 2 * i, canon, 2 * count, t)) {
          result.unanchored++
          continue
        }
        pending[2 * count] = ext[2 * i]!
        pending[2 * count + 1] = ext[2 * i + 1]!
        count++
      }
      if (count === 0) return result
      const m = own.ensureMember(key)
      for (let i = 0; i < count; i++) {
        // Distinct external hashes of one event may repeat: the second is present, not added.
        added[i] = own.insertChecked(m, pending, 2 * i, canon, 2 * i) === LINEAGE_ADDED ? 1 : 0
      }
      this.holdAll(store, key, ref, m, canon, count, added)
      return result
    }
    const stored = this.storeChained(t, device, key, data)
    if (stored === STORE_PARENT_MISSING) {
      if (data.skipUnanchored === true) result.unanchored = n
      else result.error = "ParentBlockNotFound"
      return result
    }
    if (stored === STORE_SEQUENCE_INVALID) {
      result.error = "InvalidBlockSequence"
      return result
    }
    if (stored > 0) this.holdAll(store, key, ref, store.lineage.memberIndex(key), canon, n, added)
    return result
  }

  /**
   * Maps a chained Stored batch's external hashes on tier `t` (as the device's `storeLineage`
   * does), writing the canonical hashes to `this.canon` and 1 in `this.added[i]` for each new
   * mapping; a rejection leaves every lineage as it was. Returns the number of new mappings or a
   * rejection code.
   */
  private storeChained(t: LowerTierIndex, device: LineageTable, key: string, data: CkfStoredData): number {
    const ext = data.blockHashes
    const local = data.tokensHashes ?? ext
    const n = ext.length >>> 1
    if (local.length >>> 1 !== n) return STORE_SEQUENCE_INVALID
    const scratch = this.scratch
    const parent = data.parentHash
    if (parent !== undefined && !this.resolve(device, key, parent, 0, scratch, 0, t)) {
      return STORE_PARENT_MISSING
    }
    const canon = this.canon
    const added = this.added
    sequenceHashesInto(local, 0, n, parent === undefined ? undefined : scratch, 0, canon, 0)
    // An external hash the rank maps elsewhere (the device or the other tier) to another canonical
    // hash is the same fault as a conflict within the tier.
    const other = this.stores[1 - t]!.lineage
    const mDevice = device.memberIndex(key)
    const mOther = other.memberIndex(key)
    for (let i = 0; i < n; i++) {
      const hi = canon[2 * i]!
      const lo = canon[2 * i + 1]!
      if (device.get(mDevice, ext, 2 * i, scratch, 0) && (scratch[0] !== hi || scratch[1] !== lo))
        return STORE_SEQUENCE_INVALID
      if (other.get(mOther, ext, 2 * i, scratch, 0) && (scratch[0] !== hi || scratch[1] !== lo))
        return STORE_SEQUENCE_INVALID
    }
    const lineage = this.stores[t].lineage
    const known = lineage.memberIndex(key)
    const m = known >= 0 ? known : lineage.ensureMember(key)
    let count = 0
    for (let i = 0; i < n; i++) {
      const code = lineage.insertChecked(m, ext, 2 * i, canon, 2 * i)
      if (code === LINEAGE_CONFLICT) {
        for (let j = 0; j < i; j++) if (added[j] === 1) lineage.delete(key, m, ext, 2 * j, scratch, 0)
        if (known < 0 && lineage.entriesOf(lineage.memberIndex(key)) === 0) lineage.clearMember(key)
        return STORE_SEQUENCE_INVALID
      }
      added[i] = code === LINEAGE_PRESENT ? 0 : 1
      count += added[i]!
    }
    if (count === 0 && known < 0) lineage.clearMember(key)
    return count
  }

  /**
   * Applies a Removed event on lower tier `t`: each external hash the tier holds is forgotten and
   * its block leaves the member's holdings with its last alias; the others are counted in
   * `unknownRemovals`. The result is reused.
   */
  applyRemoved(t: LowerTierIndex, key: string, ext: Uint32Array): TierApplyResult {
    const result = this.result
    result.error = undefined
    result.unanchored = 0
    result.unknownRemovals = 0
    const n = ext.length >>> 1
    const store = this.stores[t]
    const lineage = store.lineage
    const m = lineage.memberIndex(key)
    if (m < 0) {
      result.unknownRemovals = n
      return result
    }
    this.grow(1)
    const canon = this.canon
    const keys = this.keys
    const owners = store.owners
    const om = owners.memberIndex(key)
    for (let i = 0; i < n; i++) {
      if (!lineage.delete(key, m, ext, 2 * i, canon, 0)) {
        result.unknownRemovals++
        continue
      }
      this.addressing.mixBatch(canon, 0, 1, keys, 0)
      if (store.aliases.size > 0) {
        const alias = aliasKey(m, keys, 0)
        const extra = store.aliases.get(alias)
        if (extra !== undefined) {
          if (extra === 1) store.aliases.delete(alias)
          else store.aliases.set(alias, extra - 1)
          continue
        }
      }
      store.release(om, keys, 0)
      if (lineage.memberIndex(key) !== m) {
        // The member's last entry went, and the lineage released it (its index may be reused).
        owners.releaseIfEmpty(key, om)
        this.unregisterIfEmpty(key)
        result.unknownRemovals += n - i - 1
        break
      }
    }
    return result
  }

  /** Drops member `key` from every lower tier (AllBlocksCleared, a rank reset or replacement). */
  clearMember(key: string): void {
    if (!this.members.has(key)) return
    for (const store of this.stores) {
      const m = store.lineage.memberIndex(key)
      if (m >= 0) store.clear(key, m)
    }
    this.members.delete(key)
  }

  /** Every `[extHi, extLo, canonHi, canonLo]` lineage entry of member `key` on tier `t`. */
  memberLineageEntries(t: LowerTierIndex, key: string): Uint32Array {
    const lineage = this.stores[t].lineage
    return lineage.entries(lineage.memberIndex(key))
  }

  /**
   * Installs member `ref`'s tiers from `from` (a replay of its dump into a fresh `LowerTiers` of
   * the same addressing), replacing what it had here.
   */
  adoptMember(key: string, ref: CkfMemberRef, from: LowerTiers): void {
    this.clearMember(key)
    for (const t of [HOST_TIER, DISK_TIER] as const) {
      const source = from.stores[t]
      const sm = source.lineage.memberIndex(key)
      if (sm < 0) continue
      const entries = source.lineage.entries(sm)
      const store = this.stores[t]
      const m = store.lineage.ensureMember(key)
      for (let k = 0; k < entries.length; k += 4) store.lineage.insert(m, entries, k, entries, k + 2)
      // Every entry's block, the aliases (several external hashes on one canonical hash) once.
      const n = entries.length / 4
      this.grow(n)
      const canon = this.canon
      const added = this.added
      for (let k = 0, c = 0; k < entries.length; k += 4, c += 2) {
        canon[c] = entries[k + 2]!
        canon[c + 1] = entries[k + 3]!
      }
      added.fill(1, 0, n)
      this.holdAll(store, key, ref, m, canon, n, added)
    }
  }
}
