/**
 * Exact ownership of a pool: which (worker, dp rank) members own which block hashes, with a
 * refcount per hash.
 *
 * The reference keeps a hash set per member plus a refcount map, which stores every key twice.
 * Here each hash is stored once, in the owner table, together with its refcount and one "primary"
 * owner; only the owners beyond the primary (shared prefix blocks) go to a second table, as one
 * bitmap per (hash, group of 32 member indices): members registered together share groups, so a
 * block shared by many members costs a few entries, and a worker query tests a group's owners
 * with one probe. The (member, hash) relation and the refcounts are exactly the reference's; a
 * member's hashes are enumerated by a scan (clears and rank replacements only), member block
 * counts are kept as counters. One table probe per block instead of two halves the cache misses
 * of the apply path and the bytes per ownership edge.
 *
 * Keys are the CKF's `mixed = XXH3(LE8(h), seed)` rather than `h`: the producer computes `mixed`
 * for its fingerprint and buckets anyway, it is uniformly distributed whatever the block hashes
 * look like, and XXH3 of 8 bytes is a bijection of u64, so the relation stays exact and the block
 * hash can be recovered (`CkfAddressing.unmix`). The slot index then comes straight from the
 * key's high word: no second hash per block, and none when rehashing or shifting on delete.
 *
 * Both tables use linear probing with tombstone-free backward-shift deletion, at most 80% full,
 * and start at 16 slots: an idle pool holds a few hundred bytes of them, not megabytes. The owner
 * table doubles as hashes arrive, except that the step that would pass the pool's sizing hint
 * stops at the hint, so a pool filled to its hint ends exactly as big as if it had been sized for
 * it; the edge table grows by 1.5× and stays above 53% full. Capacities are therefore not powers
 * of two (slot = ⌊h·capacity / 2^32⌋). That slot order is monotone in h, so a rehash reads and
 * writes the tables front to back. Past 4,096 slots the owner table's entries move into the grown
 * table gradually, a few per insert, instead of in one pause (see `old`).
 *
 * The key under operation is passed in `key` ([hi, lo]) rather than as arguments: a u32 argument
 * of a call that is not inlined is boxed into a heap number.
 *
 * Length: both tables and the worker query's narrowing loops share the slot layout and its
 * private fields; splitting them would expose that layout or cost a call per probed slot.
 */

import { lowestBit, popcount } from "./internal/bits.js"
import { MOVE_SLOTS_PER_INSERT, REHASH_AT_ONCE_SLOTS } from "./internal/growth.js"

const MAX_LOAD_NUM = 4
const MAX_LOAD_DEN = 5
const INV_TWO_32 = 1 / 4294967296
const MIN_CAPACITY = 16

/** Slot of a uniformly distributed u32 in a table of `capacity` (`scale` = capacity / 2^32). */
const home = (h: number, scale: number, capacity: number): number =>
  Math.min(capacity - 1, Math.floor(h * scale))

/** 32-bit mix of a (mixed hash, member) edge key. */
const mixEdge = (hi: number, lo: number, tag: number): number => {
  let x = lo ^ Math.imul(hi, 0x9e3779b1) ^ Math.imul(tag, 0x27d4eb2f)
  x = Math.imul(x ^ (x >>> 15), 0x2c1b3c6d)
  x = Math.imul(x ^ (x >>> 12), 0x297a2d39)
  return (x ^ (x >>> 15)) >>> 0
}

// Edge-table slot: [hi, lo, tag, mask] with tag = group + 1 (0 = empty slot), where a member's
// group is its index's high bits (`m >>> GROUP_SHIFT`) and `mask` has a bit per member of the
// group owning the key (`1 << (m & GROUP_MASK)`); an entry whose mask empties is deleted.
const GROUP_SHIFT = 5
const GROUP_MASK = 31
const EDGE_WIDTH = 4

/** Member `m`'s group of 32 indices, whose owners of a key one bitmap holds. */
export const memberGroup = (m: number): number => m >>> GROUP_SHIFT

/** Member `m`'s bit in its group's bitmaps (`OwnershipTable.groupOwnersAt`). */
export const memberBit = (m: number): number => 1 << (m & GROUP_MASK)

/** Slots that hold `keys` at the maximum load. */
const slotsFor = (keys: number): number =>
  Math.max(MIN_CAPACITY, Math.ceil((keys * MAX_LOAD_DEN) / MAX_LOAD_NUM))

const grownCapacity = (needed: number, current: number): number => {
  let cap = current
  while (cap * MAX_LOAD_NUM < needed * MAX_LOAD_DEN) cap = Math.max(MIN_CAPACITY, Math.ceil(cap * 1.5))
  return cap
}

/** True when the entry at j, whose home is `h`, must move into the hole at `hole` (cyclic order). */
const mustShift = (hole: number, j: number, h: number): boolean =>
  hole <= j ? h <= hole || h > j : h <= hole && h > j

/**
 * Tombstone-free deletion of slot `i` from a linear-probing table (tag word 0 = empty): later
 * entries of the probe run move back into the hole. Both tables share the scheme and differ in
 * their slots and an entry's home: the owner table's slots are `[hi, lo, meta]` and an entry's
 * home is its key's high word; the edge table's are `[hi, lo, tag, mask]` (`EDGE_WIDTH`) and the
 * home is the mix of the key and the tag.
 */
const deleteSlot = (slots: Uint32Array, cap: number, scale: number, slot: number, edges: boolean): void => {
  const width = edges ? EDGE_WIDTH : 3
  let i = slot
  let j = slot
  for (;;) {
    j = j + 1 === cap ? 0 : j + 1
    const meta = slots[width * j + 2]!
    if (meta === 0) break
    const u = slots[width * j]!
    const l = slots[width * j + 1]!
    if (mustShift(i, j, home(edges ? mixEdge(u, l, meta) : u, scale, cap))) {
      slots[width * i] = u
      slots[width * i + 1] = l
      slots[width * i + 2] = meta
      if (edges) slots[width * i + 3] = slots[width * j + 3]!
      i = j
    }
  }
  slots[width * i] = 0
  slots[width * i + 1] = 0
  slots[width * i + 2] = 0
  if (edges) slots[width * i + 3] = 0
}

// Owner-table slot: [hi, lo, meta] of the mixed key; meta = primary owner index + 1 in bits 8..31
// (0 = none) and the refcount in bits 0..7 (1..254), 255 meaning "in the overflow map"; meta 0 =
// empty slot.
const COUNT_MASK = 0xff
const COUNT_OVERFLOW = 0xff
const PRIMARY_SHIFT = 8
/** Member indices fit the 24 bits of the primary-owner field. */
export const MAX_MEMBERS = (1 << 24) - 1

const overflowKey = (hi: number, lo: number): string => `${hi}:${lo}`

/** Results of `addOwner` / `removeOwner`. */
export const OWNER_DUPLICATE = 0
/** The member became an owner of the block. */
export const OWNER_ADDED = 1
/** The member did not own the block; nothing changed. */
export const OWNER_UNKNOWN = 0
/** The member stopped owning the block; others still own it. */
export const OWNER_REMOVED = 1
/** The member was the last owner: the caller removes the fingerprint, then calls `deleteLast`. */
export const OWNER_LAST = 2
/** The block has as many owners as a count can hold; nothing changed. */
export const OWNER_DEGREE_OVERFLOW = -3

/** Which members own each block, so that a fingerprint leaves only with its last owner. */
export class OwnershipTable {
  /** The key under operation: [hi, lo] of the mixed hash. */
  readonly key = new Uint32Array(2)
  private slots: Uint32Array
  private capacity: number
  private scale: number
  /**
   * While the table grows past `REHASH_AT_ONCE_SLOTS`: the old table, whose entries move to
   * `slots` in slot order, `moveSlotsPerInsert` per insert, and at once when `find` meets one.
   * Slots below `cursor` are empty (moved), and so is `old[cursor]`: every probe run left in the
   * old table starts after the cursor, so a lookup there never crosses the moved region and a
   * deletion's backward shift never moves an entry into it. Slots handed out by `find` are
   * always slots of `slots`.
   */
  private old: Uint32Array | undefined = undefined
  private oldCapacity = 0
  private oldScale = 0
  private cursor = 0
  /**
   * The table doubles, but never past room for `maxKeys` (the filter's slot count bounds the
   * distinct hashes).
   */
  private readonly maxCapacity: number
  /** Slots for the pool's sizing hint: where doubling pauses (see `nextCapacity`). */
  private readonly hintCapacity: number
  size = 0
  /** Refcounts above 254, keyed by hash. */
  private readonly overflow = new Map<string, number>()
  private readonly edges = new EdgeTable(this.key)

  // Member registry: index ↔ (worker, rank); indices of members that own nothing are recycled.
  private readonly indexByKey = new Map<string, number>()
  private workers: Array<string> = []
  private ranks: Array<number> = []
  private counts: Array<number> = []
  private readonly free: Array<number> = []
  memberCount = 0
  contributions = 0
  /** Bumped whenever a member is registered or released (member indices change then). */
  membershipVersion = 0

  /**
   * The table starts at 16 slots and grows as hashes arrive: memory follows use, and a pool
   * sized for a million blocks costs its filter, not 15 MiB of empty slots, until it fills.
   * `expectedKeys` (the sizing hint) only shapes the growth steps; `reserveKeys` pre-sizes.
   */
  constructor(
    expectedKeys = 0,
    maxKeys = Number.MAX_SAFE_INTEGER,
    /** Old slots moved per insert while the table grows (tests lower it to stretch the move). */
    private readonly moveSlotsPerInsert = MOVE_SLOTS_PER_INSERT
  ) {
    this.capacity = MIN_CAPACITY
    this.scale = MIN_CAPACITY * INV_TWO_32
    this.slots = new Uint32Array(MIN_CAPACITY * 3)
    this.maxCapacity = slotsFor(maxKeys)
    this.hintCapacity = Math.min(slotsFor(expectedKeys), this.maxCapacity)
  }

  get slotCapacity(): number {
    return this.capacity
  }

  get edgeCapacity(): number {
    return this.edges.capacity
  }

  get byteSize(): number {
    return this.slots.byteLength + (this.old === undefined ? 0 : this.old.byteLength) + this.edges.byteSize
  }

  /** True while entries are still moving out of the table being grown out of (for tests). */
  get moving(): boolean {
    return this.old !== undefined
  }

  // ---------------------------------------------------------------------------------------------
  // Members

  /** Index of a member, or -1 when it owns nothing. */
  memberIndex(key: string): number {
    return this.indexByKey.get(key) ?? -1
  }

  /** Index of a member, registering it (owning nothing yet) when needed; -1 when full. */
  ensureMember(key: string, workerId: string, dpRank: number): number {
    const known = this.indexByKey.get(key)
    if (known !== undefined) return known
    let index = this.free.pop()
    if (index === undefined) {
      if (this.workers.length >= MAX_MEMBERS) return -1
      index = this.workers.length
      this.workers.push(workerId)
      this.ranks.push(dpRank)
      this.counts.push(0)
    } else {
      this.workers[index] = workerId
      this.ranks[index] = dpRank
      this.counts[index] = 0
    }
    this.indexByKey.set(key, index)
    this.memberCount++
    this.membershipVersion++
    return index
  }

  /** Drops a registered member that owns nothing. */
  releaseIfEmpty(key: string, index: number): void {
    if (this.counts[index] !== 0) return
    this.indexByKey.delete(key)
    this.free.push(index)
    this.memberCount--
    this.membershipVersion++
  }

  blocksOf(index: number): number {
    return index < 0 ? 0 : this.counts[index]!
  }

  workerOf(index: number): string {
    return this.workers[index]!
  }

  rankOf(index: number): number {
    return this.ranks[index]!
  }

  /** Every registered member index. */
  memberIndices(): Array<number> {
    return [...this.indexByKey.values()]
  }

  // ---------------------------------------------------------------------------------------------
  // Hashes (the key is `this.key`)

  /**
   * Loads the home slot of the key `keys[k], keys[k + 1]` without acting on it. Issuing the loads
   * of an event's blocks back to back lets their cache misses overlap before the dependent work
   * runs.
   */
  touchAt(keys: Uint32Array, k: number): number {
    const touched = this.slots[3 * home(keys[k]!, this.scale, this.capacity) + 2]!
    // While the table grows, a key not yet in the new table is looked for in the old one too.
    const old = this.old
    if (old === undefined) return touched
    const h = home(keys[k]!, this.oldScale, this.oldCapacity)
    return h < this.cursor ? touched : touched | old[3 * h + 2]!
  }

  /** Slot of the key, or `-1 - i` where `i` is the empty slot an insertion would take. */
  find(): number {
    return this.findAt(this.key, 0)
  }

  /** `find` for the key `keys[k], keys[k + 1]`. */
  findAt(keys: Uint32Array, k: number): number {
    const slots = this.slots
    const cap = this.capacity
    const hi = keys[k]!
    const lo = keys[k + 1]!
    let i = home(hi, this.scale, cap)
    for (;;) {
      const base = 3 * i
      if (slots[base + 2] === 0) return this.old === undefined ? -1 - i : this.findOld(hi, lo, i)
      if (slots[base + 1] === lo && slots[base] === hi) return i
      i = i + 1 === cap ? 0 : i + 1
    }
  }

  /**
   * `find` of a key absent from `slots` while the table grows: a key still in the old table moves
   * into `empty` (where it would be inserted) and its slot there is returned.
   */
  private findOld(hi: number, lo: number, empty: number): number {
    const old = this.old!
    const cap = this.oldCapacity
    let i = home(hi, this.oldScale, cap)
    // A key whose old home the move has passed is not in the old table: its probe run would have
    // to cross the empty slot at the cursor.
    if (i < this.cursor) return -1 - empty
    for (;;) {
      const base = 3 * i
      const meta = old[base + 2]!
      if (meta === 0) return -1 - empty
      if (old[base + 1] === lo && old[base] === hi) {
        const slots = this.slots
        slots[3 * empty] = hi
        slots[3 * empty + 1] = lo
        slots[3 * empty + 2] = meta
        deleteSlot(old, cap, this.oldScale, i, false)
        return empty
      }
      i = i + 1 === cap ? 0 : i + 1
    }
  }

  /** Refcount at a slot returned by `find`. */
  countAt(slot: number): number {
    const meta = this.slots[3 * slot + 2]!
    const count = meta & COUNT_MASK
    return count === COUNT_OVERFLOW
      ? this.overflow.get(overflowKey(this.slots[3 * slot]!, this.slots[3 * slot + 1]!))!
      : count
  }

  /** Whether member `m` owns the key at `slot`. */
  ownsAt(slot: number, m: number): boolean {
    return this.ownsKeyAt(slot, this.key, 0, m)
  }

  /**
   * Narrows a worker query's live candidates to the owners of the key `keys[k], keys[k + 1]` at
   * `slot` (or to none when `slot` is negative). Candidates are kept a group of 32 member indices
   * at a time: `groups[0, live)` are the groups with candidates left and `masks` their candidate
   * bits (member `32·g + b`); the owners stay (in place) and the number of groups with candidates
   * left is returned; each member dropped gets `depth[positionOf[m]] = i`. One probe per group,
   * and none once the key's refcount of owners is found.
   */
  narrowAt(
    slot: number,
    keys: Uint32Array,
    k: number,
    groups: Int32Array,
    masks: Uint32Array,
    live: number,
    positionOf: Int32Array,
    depth: Array<number>,
    i: number
  ): number {
    // A block nobody holds: no owners, so every candidate left ends at this block.
    if (slot < 0) return this.edges.narrowGroups(0, 0, false, groups, masks, live, positionOf, depth, i)
    const key = this.key
    key[0] = keys[k]!
    key[1] = keys[k + 1]!
    const primary = this.slots[3 * slot + 2]! >>> PRIMARY_SHIFT
    const owning = this.countAt(slot)
    return this.edges.narrowGroups(
      primary,
      owning,
      primary === 0 || owning > 1,
      groups,
      masks,
      live,
      positionOf,
      depth,
      i
    )
  }

  /**
   * The owners of the key `keys[k], keys[k + 1]` at `slot` among the members of `m`'s group of
   * 32 indices, as `memberBit` bits (0 when `slot` is negative): one probe answers for every
   * member of the group.
   */
  groupOwnersAt(slot: number, keys: Uint32Array, k: number, m: number): number {
    if (slot < 0) return 0
    const meta = this.slots[3 * slot + 2]!
    const primary = meta >>> PRIMARY_SHIFT
    const g = m >>> GROUP_SHIFT
    let owners = primary !== 0 && (primary - 1) >>> GROUP_SHIFT === g ? memberBit(primary - 1) : 0
    // One owner, the primary: no edges (a count of 255 or more is in the overflow map: > 1).
    if (primary === 0 || (meta & COUNT_MASK) !== 1) owners |= this.edges.groupMaskAt(keys, k, g + 1)
    return owners >>> 0
  }

  /**
   * Whether member `m` (-1: none) owns the key `keys[k], keys[k + 1]` at `slot` (negative: nobody
   * does): the primary owner and a sole owner are read from the slot, other owners probed.
   */
  ownsKeyAt(slot: number, keys: Uint32Array, k: number, m: number): boolean {
    if (slot < 0 || m < 0) return false
    const meta = this.slots[3 * slot + 2]!
    const primary = meta >>> PRIMARY_SHIFT
    if (primary === m + 1) return true
    // One owner, the primary: no edges (a count of 255 or more is in the overflow map: > 1).
    if (primary !== 0 && (meta & COUNT_MASK) === 1) return false
    return this.edges.hasAt(keys, k, m)
  }

  /**
   * Room for one more hash and one more edge; false when an allocation failed (nothing changed).
   * Slots returned by `find` before a call that changed `slotCapacity` are stale.
   */
  reserve(): boolean {
    try {
      if ((this.size + 1) * MAX_LOAD_DEN > this.capacity * MAX_LOAD_NUM) {
        this.grow(this.nextCapacity(this.size + 1))
      }
      return this.edges.reserve()
    } catch {
      return false
    }
  }

  /**
   * Room for `keys` hashes in one step (a rank rebuild that knows its size skips the doubling
   * steps); false when the allocation failed (nothing changed). Never shrinks.
   */
  reserveKeys(keys: number): boolean {
    const needed = slotsFor(keys)
    if (needed <= this.capacity) return true
    try {
      this.grow(needed, true)
      return true
    } catch {
      return false
    }
  }

  /**
   * The next capacity of a table that needs room for `keys`: double, but stop at the sizing hint
   * when passing it (a pool filled to its hint then holds exactly the slots a pre-sized table
   * would, at most 80% full), and never past room for every filter slot unless `keys` needs it.
   * Doubling keeps the copying amortised: n inserts re-place fewer than 2n entries in all.
   *
   * A doubling that would leave the hint less than 1.25× away goes to the hint at once: the short
   * step after it would re-place the most entries of any (838,860 at the default hint's
   * 1,310,720 slots, half of a 1M fill's copying) to gain a quarter more room.
   */
  private nextCapacity(keys: number): number {
    const cap = this.capacity
    const hint = this.hintCapacity
    let next = 2 * cap
    if (cap < hint && (next > hint || 4 * hint <= 10 * cap)) next = hint
    return Math.max(Math.min(next, this.maxCapacity), slotsFor(keys))
  }

  /** Whether one more key fits without growing (then `reserve` would not rehash). */
  hasRoomForKey(): boolean {
    return (this.size + 1) * MAX_LOAD_DEN <= this.capacity * MAX_LOAD_NUM
  }

  /** First owner (0→1) of the absent key; `find` returned `-1 - empty` and capacity was reserved. */
  insertAt(empty: number, m: number): void {
    this.insertKeyAt(empty, this.key, 0, m)
  }

  /** `insertAt` for the key `keys[k], keys[k + 1]`. */
  insertKeyAt(empty: number, keys: Uint32Array, k: number, m: number): void {
    const slots = this.slots
    const base = 3 * empty
    slots[base] = keys[k]!
    slots[base + 1] = keys[k + 1]!
    slots[base + 2] = ((m + 1) << PRIMARY_SHIFT) | 1
    this.size++
    this.counts[m]!++
    this.contributions++
    // After the write: a move only fills empty slots, so slots handed out stay valid.
    if (this.old !== undefined) this.move(this.moveSlotsPerInsert)
  }

  /** Another owner (n→n+1) of the key at `slot`: duplicate, added, or a refcount overflow. */
  addOwner(slot: number, m: number): number {
    const slots = this.slots
    const meta = slots[3 * slot + 2]!
    const primary = meta >>> PRIMARY_SHIFT
    if (primary === m + 1) return OWNER_DUPLICATE
    const count = this.countAt(slot)
    let primaryField = primary
    if (primary === 0) {
      // The primary owner left: `m` takes its place unless an edge already holds it.
      if (this.edges.has(m)) return OWNER_DUPLICATE
      if (count === 0xffff_ffff) return OWNER_DEGREE_OVERFLOW
      primaryField = m + 1
    } else {
      if (count === 0xffff_ffff)
        return count > 1 && this.edges.has(m) ? OWNER_DUPLICATE : OWNER_DEGREE_OVERFLOW
      // `add` is the membership test: one probe of the edge table, not two.
      if (!this.edges.add(m)) return OWNER_DUPLICATE
    }
    this.setCount(slot, primaryField, count + 1)
    this.counts[m]!++
    this.contributions++
    return OWNER_ADDED
  }

  /**
   * Member `m` gives up the key: unknown (not an owner), removed (n→n−1), or last (1→0, the
   * caller removes the fingerprint and then calls `deleteLast`).
   */
  removeOwner(slot: number, m: number): number {
    const meta = this.slots[3 * slot + 2]!
    const primary = meta >>> PRIMARY_SHIFT
    const count = this.countAt(slot)
    if (primary === m + 1) {
      if (count === 1) return OWNER_LAST
      this.setCount(slot, 0, count - 1)
    } else {
      // A sole primary owner that is not `m` leaves no edge to look at.
      if (count === 1 && primary !== 0) return OWNER_UNKNOWN
      if (count === 1) return this.edges.has(m) ? OWNER_LAST : OWNER_UNKNOWN
      // `delete` is the membership test: one probe of the edge table, not two.
      if (!this.edges.delete(m)) return OWNER_UNKNOWN
      this.setCount(slot, primary, count - 1)
    }
    this.counts[m]!--
    this.contributions--
    return OWNER_REMOVED
  }

  /** Removes the entry of a key whose last owner `m` left (after its fingerprint was removed). */
  deleteLast(slot: number, m: number): void {
    const primary = this.slots[3 * slot + 2]! >>> PRIMARY_SHIFT
    if (primary !== m + 1) this.edges.delete(m)
    this.deleteAt(slot)
    this.counts[m]!--
    this.contributions--
  }

  private setCount(slot: number, primaryField: number, count: number): void {
    const slots = this.slots
    const hi = slots[3 * slot]!
    const lo = slots[3 * slot + 1]!
    const wasOverflow = (slots[3 * slot + 2]! & COUNT_MASK) === COUNT_OVERFLOW
    if (count >= COUNT_OVERFLOW) {
      this.overflow.set(overflowKey(hi, lo), count)
      slots[3 * slot + 2] = (primaryField << PRIMARY_SHIFT) | COUNT_OVERFLOW
    } else {
      if (wasOverflow) this.overflow.delete(overflowKey(hi, lo))
      slots[3 * slot + 2] = (primaryField << PRIMARY_SHIFT) | count
    }
  }

  private deleteAt(slot: number): void {
    const slots = this.slots
    if ((slots[3 * slot + 2]! & COUNT_MASK) === COUNT_OVERFLOW) {
      this.overflow.delete(overflowKey(slots[3 * slot]!, slots[3 * slot + 1]!))
    }
    deleteSlot(slots, this.capacity, this.scale, slot, false)
    this.size--
  }

  /** The keys member `m` owns as [hi, lo] pairs of mixed hashes (a scan of both tables). */
  hashesOf(m: number): Uint32Array {
    const out = new Uint32Array(this.counts[m]! * 2)
    let k = 0
    const tag = m + 1
    for (const slots of this.tables()) {
      for (let s = 0; s < slots.length; s += 3) {
        if (slots[s + 2]! >>> PRIMARY_SHIFT === tag) {
          out[k++] = slots[s]!
          out[k++] = slots[s + 1]!
        }
      }
    }
    k = this.edges.collect(m, out, k)
    return k === out.length ? out : out.slice(0, k)
  }

  /**
   * Every (member, key) edge as [member, hi, lo] triples: primary owners first, then the other
   * owners.
   */
  edgeList(): Uint32Array {
    const out = new Uint32Array(this.contributions * 3)
    let k = 0
    for (const slots of this.tables()) {
      for (let s = 0; s < slots.length; s += 3) {
        const primary = slots[s + 2]! >>> PRIMARY_SHIFT
        if (primary !== 0) {
          out[k] = primary - 1
          out[k + 1] = slots[s]!
          out[k + 2] = slots[s + 1]!
          k += 3
        }
      }
    }
    k = this.edges.collectAll(out, k)
    return k === out.length ? out : out.slice(0, k)
  }

  /** The tables holding entries: the old one too while the table grows. */
  private tables(): ReadonlyArray<Uint32Array> {
    return this.old === undefined ? [this.slots] : [this.old, this.slots]
  }

  /**
   * Grows to `capacity`: a small table (or `atOnce`) in one pass, a larger one by moving its
   * entries gradually (see `old`). A move still under way ends first.
   */
  private grow(capacity: number, atOnce = false): void {
    if (this.old !== undefined) this.move(Number.POSITIVE_INFINITY)
    const next = new Uint32Array(capacity * 3)
    this.old = this.slots
    this.oldCapacity = this.capacity
    this.oldScale = this.scale
    this.cursor = 0
    this.slots = next
    this.capacity = capacity
    this.scale = capacity * INV_TWO_32
    this.move(
      atOnce || this.oldCapacity <= REHASH_AT_ONCE_SLOTS ? Number.POSITIVE_INFINITY : this.moveSlotsPerInsert
    )
  }

  /**
   * Moves at least `budget` old slots' worth of entries into `slots`, then on to the next empty
   * old slot, so that no probe run of the old table straddles the cursor.
   */
  private move(budget: number): void {
    const old = this.old!
    const cap = this.oldCapacity
    const slots = this.slots
    const capacity = this.capacity
    const scale = this.scale
    let cursor = this.cursor
    for (let moved = 0; cursor < cap; cursor++, moved++) {
      const base = 3 * cursor
      const meta = old[base + 2]!
      if (meta === 0) {
        if (moved >= budget) break
        continue
      }
      const u = old[base]!
      let i = home(u, scale, capacity)
      while (slots[3 * i + 2] !== 0) i = i + 1 === capacity ? 0 : i + 1
      slots[3 * i] = u
      slots[3 * i + 1] = old[base + 1]!
      slots[3 * i + 2] = meta
      old[base] = 0
      old[base + 1] = 0
      old[base + 2] = 0
    }
    this.cursor = cursor
    if (cursor >= cap) this.old = undefined
  }
}

/** The edge-table slot index in `slots` of an edge's 4-word entry. */
const edgeHome = (hi: number, lo: number, tag: number, scale: number, cap: number): number =>
  home(mixEdge(hi, lo, tag), scale, cap)

/**
 * The owners of a key beyond its primary one, as bitmaps: one entry per (key, group of 32 member
 * indices) holding the group's owners of the key as a bitmask. Members registered together share
 * a group, so a block held by many members of a pool costs a few entries rather than one per
 * owner, and a worker query narrows its candidates a group at a time (`narrowGroups`): one probe
 * per block for up to 32 candidates instead of one per candidate. Operations act on the owner
 * table's `key`.
 */
class EdgeTable {
  private slots = new Uint32Array(MIN_CAPACITY * EDGE_WIDTH)
  capacity = MIN_CAPACITY
  private scale = MIN_CAPACITY * INV_TWO_32
  /** Entries (groups with at least one owner of their key), not edges. */
  size = 0

  constructor(private readonly key: Uint32Array) {}

  get byteSize(): number {
    return this.slots.byteLength
  }

  /** Whether (the key `keys[k], keys[k + 1]`, member `m`) is an edge. */
  hasAt(keys: Uint32Array, k: number, m: number): boolean {
    return (this.groupMaskAt(keys, k, (m >>> GROUP_SHIFT) + 1) & memberBit(m)) !== 0
  }

  /** The edges of the key `keys[k], keys[k + 1]` in the group of tag `tag` (group + 1), as bits. */
  groupMaskAt(keys: Uint32Array, k: number, tag: number): number {
    if (this.size === 0) return 0
    const slots = this.slots
    const cap = this.capacity
    const hi = keys[k]!
    const lo = keys[k + 1]!
    let i = edgeHome(hi, lo, tag, this.scale, cap)
    for (;;) {
      const base = EDGE_WIDTH * i
      const t = slots[base + 2]!
      if (t === 0) return 0
      if (t === tag && slots[base + 1] === lo && slots[base] === hi) return slots[base + 3]!
      i = i + 1 === cap ? 0 : i + 1
    }
  }

  has(m: number): boolean {
    return this.hasAt(this.key, 0, m)
  }

  /**
   * `OwnershipTable.narrowAt`'s loop over the key in `key`, a group at a time: `groups[0, live)`
   * are the groups with candidates left and `masks` their candidates; each keeps the members that
   * own the key (the primary owner, `primary` = member index + 1, or an edge), in place, and the
   * number of groups with candidates left is returned. A member dropped gets
   * `depth[positionOf[m]] = i`. Once the key's `owning` owners are all found (counted over the
   * groups' whole masks, candidates or not), the remaining groups are dropped without a probe.
   */
  narrowGroups(
    primary: number,
    owning: number,
    edges: boolean,
    groups: Int32Array,
    masks: Uint32Array,
    live: number,
    positionOf: Int32Array,
    depth: Array<number>,
    i: number
  ): number {
    const slots = this.slots
    const cap = this.capacity
    const scale = this.scale
    const hi = this.key[0]!
    const lo = this.key[1]!
    const base = lo ^ Math.imul(hi, 0x9e3779b1)
    const probe = edges && this.size > 0
    const primaryGroup = primary === 0 ? -1 : (primary - 1) >>> GROUP_SHIFT
    const primaryBit = primary === 0 ? 0 : 1 << ((primary - 1) & GROUP_MASK)
    let found = 0
    let kept = 0
    for (let a = 0; a < live; a++) {
      const g = groups[a]!
      const candidates = masks[a]!
      let owners = g === primaryGroup ? primaryBit : 0
      if (probe && found < owning) {
        const tag = g + 1
        let x = base ^ Math.imul(tag, 0x27d4eb2f)
        x = Math.imul(x ^ (x >>> 15), 0x2c1b3c6d)
        x = Math.imul(x ^ (x >>> 12), 0x297a2d39)
        let s = home((x ^ (x >>> 15)) >>> 0, scale, cap)
        for (;;) {
          const at = EDGE_WIDTH * s
          const t = slots[at + 2]!
          if (t === 0) break
          if (t === tag && slots[at + 1] === lo && slots[at] === hi) {
            owners |= slots[at + 3]!
            break
          }
          s = s + 1 === cap ? 0 : s + 1
        }
      }
      if (owners !== 0 && a + 1 < live) found += popcount(owners)
      settleMask(g << GROUP_SHIFT, (candidates & ~owners) >>> 0, positionOf, depth, i)
      const keep = (candidates & owners) >>> 0
      if (keep !== 0) {
        groups[kept] = g
        masks[kept] = keep
        kept++
      }
    }
    return kept
  }

  reserve(): boolean {
    if ((this.size + 1) * MAX_LOAD_DEN > this.capacity * MAX_LOAD_NUM) {
      try {
        this.rehash(grownCapacity(this.size + 1, this.capacity))
      } catch {
        return false
      }
    }
    return true
  }

  /** Adds member `m` as an edge of the key (a bit of its group's entry, made when absent); false if it was one. */
  add(m: number): boolean {
    const slots = this.slots
    const cap = this.capacity
    const tag = (m >>> GROUP_SHIFT) + 1
    const hi = this.key[0]!
    const lo = this.key[1]!
    let i = edgeHome(hi, lo, tag, this.scale, cap)
    for (;;) {
      const base = EDGE_WIDTH * i
      const t = slots[base + 2]!
      if (t === 0) {
        slots[base] = hi
        slots[base + 1] = lo
        slots[base + 2] = tag
        slots[base + 3] = 1 << (m & GROUP_MASK)
        this.size++
        return true
      }
      if (t === tag && slots[base + 1] === lo && slots[base] === hi) {
        const mask = slots[base + 3]!
        const bit = 1 << (m & GROUP_MASK)
        if ((mask & bit) !== 0) return false
        slots[base + 3] = mask | bit
        return true
      }
      i = i + 1 === cap ? 0 : i + 1
    }
  }

  delete(m: number): boolean {
    const slots = this.slots
    const cap = this.capacity
    const scale = this.scale
    const tag = (m >>> GROUP_SHIFT) + 1
    const bit = 1 << (m & GROUP_MASK)
    const hi = this.key[0]!
    const lo = this.key[1]!
    let i = edgeHome(hi, lo, tag, scale, cap)
    for (;;) {
      const base = EDGE_WIDTH * i
      const t = slots[base + 2]!
      if (t === 0) return false
      if (t === tag && slots[base + 1] === lo && slots[base] === hi) {
        const mask = slots[base + 3]!
        if ((mask & bit) === 0) return false
        const left = (mask & ~bit) >>> 0
        if (left !== 0) {
          slots[base + 3] = left
          return true
        }
        deleteSlot(slots, cap, scale, i, true)
        this.size--
        return true
      }
      i = i + 1 === cap ? 0 : i + 1
    }
  }

  collect(m: number, out: Uint32Array, k: number): number {
    const slots = this.slots
    const tag = (m >>> GROUP_SHIFT) + 1
    const bit = 1 << (m & GROUP_MASK)
    for (let s = 0; s < slots.length; s += EDGE_WIDTH) {
      if (slots[s + 2] === tag && (slots[s + 3]! & bit) !== 0) {
        out[k++] = slots[s]!
        out[k++] = slots[s + 1]!
      }
    }
    return k
  }

  /** Appends every edge as [member, hi, lo] triples. */
  collectAll(out: Uint32Array, k: number): number {
    const slots = this.slots
    for (let s = 0; s < slots.length; s += EDGE_WIDTH) {
      const t = slots[s + 2]!
      if (t === 0) continue
      const first = (t - 1) << GROUP_SHIFT
      let mask = slots[s + 3]!
      while (mask !== 0) {
        const low = mask & -mask
        out[k] = first | (31 - Math.clz32(low))
        out[k + 1] = slots[s]!
        out[k + 2] = slots[s + 1]!
        k += 3
        mask = (mask ^ low) >>> 0
      }
    }
    return k
  }

  private rehash(capacity: number): void {
    const next = new Uint32Array(capacity * EDGE_WIDTH)
    const old = this.slots
    const scale = capacity * INV_TWO_32
    for (let s = 0; s < old.length; s += EDGE_WIDTH) {
      const t = old[s + 2]!
      if (t === 0) continue
      const u = old[s]!
      const l = old[s + 1]!
      let i = edgeHome(u, l, t, scale, capacity)
      while (next[EDGE_WIDTH * i + 2] !== 0) i = i + 1 === capacity ? 0 : i + 1
      next.set(old.subarray(s, s + EDGE_WIDTH), EDGE_WIDTH * i)
    }
    this.slots = next
    this.capacity = capacity
    this.scale = scale
  }
}

/** `depth[positionOf[first + b]] = i` for each bit b of `mask` (one group's members). */
const settleMask = (
  first: number,
  mask: number,
  positionOf: Int32Array,
  depth: Array<number>,
  i: number
): void => {
  for (let m = mask; m !== 0; m = (m ^ (m & -m)) >>> 0) depth[positionOf[first | lowestBit(m)]!] = i
}
