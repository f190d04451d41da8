/**
 * Exact ownership of a pool: which (worker, dp rank) members own which block hashes, with a
 * refcount per hash.
 *
 * The reference keeps a hash set per member plus a refcount map, which stores every key twice.
 * Here each hash is stored once, in the owner table, together with its refcount and one "primary"
 * owner; only the owners beyond the primary (shared prefix blocks) go to a second table keyed by
 * (hash, member). The (member, hash) relation and the refcounts are exactly the reference's; a
 * member's hashes are enumerated by a scan (clears and rank replacements only), member block
 * counts are kept as counters. One table probe per block instead of two halves the cache misses
 * of the apply path and the bytes per ownership edge.
 *
 * Both tables use linear probing with tombstone-free backward-shift deletion. Capacities are not
 * powers of two (slot = ⌊h·capacity / 2^32⌋) so that they can grow by 1.5× and stay between 53%
 * and 80% full.
 */

const MAX_LOAD_NUM = 4
const MAX_LOAD_DEN = 5
const TWO_32 = 4294967296
const MIN_CAPACITY = 16

/** 32-bit mix of a u64 key. */
export const mixKey = (hi: number, lo: number): number => {
  let h = lo ^ Math.imul(hi, 0x9e3779b1)
  h = Math.imul(h ^ (h >>> 16), 0x85ebca6b)
  h = Math.imul(h ^ (h >>> 13), 0xc2b2ae35)
  return (h ^ (h >>> 16)) >>> 0
}

/** 32-bit mix of a (u64, member) key. */
const mixEdge = (h: number, member: number): number => {
  let x = h ^ Math.imul(member, 0x27d4eb2f)
  x = Math.imul(x ^ (x >>> 15), 0x2c1b3c6d)
  x = Math.imul(x ^ (x >>> 12), 0x297a2d39)
  return (x ^ (x >>> 15)) >>> 0
}

const home = (h: number, capacity: number): number =>
  Math.min(capacity - 1, Math.floor((h * capacity) / TWO_32))

const grownCapacity = (needed: number, current: number): number => {
  let cap = current
  while (cap * MAX_LOAD_NUM < needed * MAX_LOAD_DEN) cap = Math.max(MIN_CAPACITY, Math.ceil(cap * 1.5))
  return cap
}

/** True when the entry at j, whose home is `h`, must move into the hole at `hole` (cyclic order). */
const mustShift = (hole: number, j: number, h: number): boolean =>
  hole <= j ? h <= hole || h > j : h <= hole && h > j

// Owner-table slot: [hi, lo, meta]; meta = primary owner index + 1 in bits 8..31 (0 = none) and
// the refcount in bits 0..7 (1..254), 255 meaning "in the overflow map"; meta 0 = empty slot.
const COUNT_MASK = 0xff
const COUNT_OVERFLOW = 0xff
const PRIMARY_SHIFT = 8
/** Member indices fit the 24 bits of the primary-owner field. */
export const MAX_MEMBERS = (1 << 24) - 1

const overflowKey = (hi: number, lo: number): string => `${hi}:${lo}`

/** Results of `addOwner` / `removeOwner`. */
export const OWNER_DUPLICATE = 0
export const OWNER_ADDED = 1
export const OWNER_UNKNOWN = 0
export const OWNER_REMOVED = 1
/** The member was the last owner: the caller removes the fingerprint, then calls `deleteLast`. */
export const OWNER_LAST = 2
export const OWNER_DEGREE_OVERFLOW = -3

export class OwnershipTable {
  private slots: Uint32Array
  private capacity: number
  size = 0
  /** Refcounts above 254, keyed by hash. */
  private readonly overflow = new Map<string, number>()
  private readonly edges = new EdgeTable()

  // Member registry: index ↔ (worker, rank); indices of members that own nothing are recycled.
  private readonly indexByKey = new Map<string, number>()
  private workers: Array<string> = []
  private ranks: Array<number> = []
  private counts: Array<number> = []
  private readonly free: Array<number> = []
  memberCount = 0
  contributions = 0

  constructor() {
    this.capacity = MIN_CAPACITY
    this.slots = new Uint32Array(MIN_CAPACITY * 3)
  }

  get slotCapacity(): number {
    return this.capacity
  }

  get edgeCapacity(): number {
    return this.edges.capacity
  }

  get byteSize(): number {
    return this.slots.byteLength + this.edges.byteSize
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
    return index
  }

  /** Drops a registered member that owns nothing. */
  releaseIfEmpty(key: string, index: number): void {
    if (this.counts[index] !== 0) return
    this.indexByKey.delete(key)
    this.free.push(index)
    this.memberCount--
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
  // Hashes

  /**
   * Loads the hash's home slot without acting on it. Issuing the loads of an event's blocks back
   * to back lets their cache misses overlap before the dependent work runs.
   */
  touch(h: number): number {
    return this.slots[3 * home(h, this.capacity) + 2]!
  }

  /** Slot of the hash, or -1. */
  find(hi: number, lo: number, h: number): number {
    const slots = this.slots
    const cap = this.capacity
    let i = home(h, cap)
    for (;;) {
      const base = 3 * i
      if (slots[base + 2] === 0) return -1
      if (slots[base + 1] === lo && slots[base] === hi) return i
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

  /** Whether member `m` owns the hash at `slot`. */
  ownsAt(slot: number, hi: number, lo: number, h: number, m: number): boolean {
    if (this.slots[3 * slot + 2]! >>> PRIMARY_SHIFT === m + 1) return true
    return this.countAt(slot) > 1 && this.edges.has(hi, lo, h, m)
  }

  /** Room for one more hash and one more edge; false when an allocation failed (nothing changed). */
  reserve(): boolean {
    try {
      if ((this.size + 1) * MAX_LOAD_DEN > this.capacity * MAX_LOAD_NUM) {
        this.rehash(grownCapacity(this.size + 1, this.capacity))
      }
      return this.edges.reserve()
    } catch {
      return false
    }
  }

  /** First owner (0→1) of an absent hash; capacity must have been reserved. */
  insertFirst(hi: number, lo: number, h: number, m: number): void {
    const slots = this.slots
    const cap = this.capacity
    let i = home(h, cap)
    while (slots[3 * i + 2] !== 0) i = i + 1 === cap ? 0 : i + 1
    slots[3 * i] = hi
    slots[3 * i + 1] = lo
    slots[3 * i + 2] = ((m + 1) << PRIMARY_SHIFT) | 1
    this.size++
    this.counts[m]!++
    this.contributions++
  }

  /** Another owner (n→n+1) of the hash at `slot`: duplicate, added, or a refcount overflow. */
  addOwner(slot: number, hi: number, lo: number, h: number, m: number): number {
    const slots = this.slots
    const meta = slots[3 * slot + 2]!
    const primary = meta >>> PRIMARY_SHIFT
    if (primary === m + 1) return OWNER_DUPLICATE
    const count = this.countAt(slot)
    if (count > 1 || primary === 0) {
      if (this.edges.has(hi, lo, h, m)) return OWNER_DUPLICATE
    }
    if (count === 0xffff_ffff) return OWNER_DEGREE_OVERFLOW
    let primaryField = primary
    if (primary === 0) primaryField = m + 1
    else this.edges.insertAbsent(hi, lo, h, m)
    this.setCount(slot, primaryField, count + 1)
    this.counts[m]!++
    this.contributions++
    return OWNER_ADDED
  }

  /**
   * Member `m` gives up the hash: unknown (not an owner), removed (n→n−1), or last (1→0, the
   * caller removes the fingerprint and then calls `deleteLast`).
   */
  removeOwner(slot: number, hi: number, lo: number, h: number, m: number): number {
    const meta = this.slots[3 * slot + 2]!
    const primary = meta >>> PRIMARY_SHIFT
    const count = this.countAt(slot)
    if (primary !== m + 1 && !(count > 1 || primary === 0 ? this.edges.has(hi, lo, h, m) : false))
      return OWNER_UNKNOWN
    if (count === 1) return OWNER_LAST
    if (primary === m + 1) this.setCount(slot, 0, count - 1)
    else {
      this.edges.delete(hi, lo, h, m)
      this.setCount(slot, primary, count - 1)
    }
    this.counts[m]!--
    this.contributions--
    return OWNER_REMOVED
  }

  /** Removes the entry of a hash whose last owner `m` left (after its fingerprint was removed). */
  deleteLast(slot: number, hi: number, lo: number, h: number, m: number): void {
    const primary = this.slots[3 * slot + 2]! >>> PRIMARY_SHIFT
    if (primary !== m + 1) this.edges.delete(hi, lo, h, m)
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
    const cap = this.capacity
    if ((slots[3 * slot + 2]! & COUNT_MASK) === COUNT_OVERFLOW) {
      this.overflow.delete(overflowKey(slots[3 * slot]!, slots[3 * slot + 1]!))
    }
    let i = slot
    let j = slot
    for (;;) {
      j = j + 1 === cap ? 0 : j + 1
      const meta = slots[3 * j + 2]!
      if (meta === 0) break
      const u = slots[3 * j]!
      const l = slots[3 * j + 1]!
      if (mustShift(i, j, home(mixKey(u, l), cap))) {
        slots[3 * i] = u
        slots[3 * i + 1] = l
        slots[3 * i + 2] = meta
        i = j
      }
    }
    slots[3 * i] = 0
    slots[3 * i + 1] = 0
    slots[3 * i + 2] = 0
    this.size--
  }

  /** Appends the hashes member `m` owns as hash pairs (a scan of both tables). */
  hashesOf(m: number): Uint32Array {
    const out = new Uint32Array(this.counts[m]! * 2)
    let k = 0
    const slots = this.slots
    const tag = m + 1
    for (let s = 0; s < slots.length; s += 3) {
      if (slots[s + 2]! >>> PRIMARY_SHIFT === tag) {
        out[k++] = slots[s]!
        out[k++] = slots[s + 1]!
      }
    }
    k = this.edges.collect(m, out, k)
    return k === out.length ? out : out.slice(0, k)
  }

  /** Visits every (member, hi, lo) edge: primary owners first, then the other owners. */
  forEachEdge(visit: (member: number, hi: number, lo: number) => void): void {
    const slots = this.slots
    for (let s = 0; s < slots.length; s += 3) {
      const primary = slots[s + 2]! >>> PRIMARY_SHIFT
      if (primary !== 0) visit(primary - 1, slots[s]!, slots[s + 1]!)
    }
    this.edges.forEach(visit)
  }

  private rehash(capacity: number): void {
    const next = new Uint32Array(capacity * 3)
    const old = this.slots
    for (let s = 0; s < old.length; s += 3) {
      const meta = old[s + 2]!
      if (meta === 0) continue
      const u = old[s]!
      const l = old[s + 1]!
      let i = home(mixKey(u, l), capacity)
      while (next[3 * i + 2] !== 0) i = i + 1 === capacity ? 0 : i + 1
      next[3 * i] = u
      next[3 * i + 1] = l
      next[3 * i + 2] = meta
    }
    this.slots = next
    this.capacity = capacity
  }
}

/**
 * The owners of a hash beyond its primary one: a set of (hash, member) keys. Slot `[hi, lo, tag]`
 * with tag = member index + 1 (0 = empty).
 */
class EdgeTable {
  private slots = new Uint32Array(MIN_CAPACITY * 3)
  capacity = MIN_CAPACITY
  size = 0

  get byteSize(): number {
    return this.slots.byteLength
  }

  has(hi: number, lo: number, h: number, m: number): boolean {
    if (this.size === 0) return false
    const slots = this.slots
    const cap = this.capacity
    const tag = m + 1
    let i = home(mixEdge(h, tag), cap)
    for (;;) {
      const t = slots[3 * i + 2]!
      if (t === 0) return false
      if (t === tag && slots[3 * i + 1] === lo && slots[3 * i] === hi) return true
      i = i + 1 === cap ? 0 : i + 1
    }
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

  insertAbsent(hi: number, lo: number, h: number, m: number): void {
    const slots = this.slots
    const cap = this.capacity
    const tag = m + 1
    let i = home(mixEdge(h, tag), cap)
    while (slots[3 * i + 2] !== 0) i = i + 1 === cap ? 0 : i + 1
    slots[3 * i] = hi
    slots[3 * i + 1] = lo
    slots[3 * i + 2] = tag
    this.size++
  }

  delete(hi: number, lo: number, h: number, m: number): boolean {
    const slots = this.slots
    const cap = this.capacity
    const tag = m + 1
    let i = home(mixEdge(h, tag), cap)
    for (;;) {
      const t = slots[3 * i + 2]!
      if (t === 0) return false
      if (t === tag && slots[3 * i + 1] === lo && slots[3 * i] === hi) break
      i = i + 1 === cap ? 0 : i + 1
    }
    let j = i
    for (;;) {
      j = j + 1 === cap ? 0 : j + 1
      const t = slots[3 * j + 2]!
      if (t === 0) break
      const u = slots[3 * j]!
      const l = slots[3 * j + 1]!
      if (mustShift(i, j, home(mixEdge(mixKey(u, l), t), cap))) {
        slots[3 * i] = u
        slots[3 * i + 1] = l
        slots[3 * i + 2] = t
        i = j
      }
    }
    slots[3 * i] = 0
    slots[3 * i + 1] = 0
    slots[3 * i + 2] = 0
    this.size--
    return true
  }

  collect(m: number, out: Uint32Array, k: number): number {
    const slots = this.slots
    const tag = m + 1
    for (let s = 0; s < slots.length; s += 3) {
      if (slots[s + 2] === tag) {
        out[k++] = slots[s]!
        out[k++] = slots[s + 1]!
      }
    }
    return k
  }

  forEach(visit: (member: number, hi: number, lo: number) => void): void {
    const slots = this.slots
    for (let s = 0; s < slots.length; s += 3) {
      const t = slots[s + 2]!
      if (t !== 0) visit(t - 1, slots[s]!, slots[s + 1]!)
    }
  }

  private rehash(capacity: number): void {
    const next = new Uint32Array(capacity * 3)
    const old = this.slots
    for (let s = 0; s < old.length; s += 3) {
      const t = old[s + 2]!
      if (t === 0) continue
      const u = old[s]!
      const l = old[s + 1]!
      let i = home(mixEdge(mixKey(u, l), t), capacity)
      while (next[3 * i + 2] !== 0) i = i + 1 === capacity ? 0 : i + 1
      next[3 * i] = u
      next[3 * i + 1] = l
      next[3 * i + 2] = t
    }
    this.slots = next
    this.capacity = capacity
  }
}
