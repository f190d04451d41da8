/**
 * Per-source lineage of a canonically addressed pool (PROTOCOL §3.3): for each member (a source
 * rank), the engine's external block hash → the canonical sequence hash it was stored under.
 * Parents resolve through it and removals by external hash find their block.
 *
 * One open-addressing table over a typed array per member: four u32 per slot,
 * `[mix(ext), extLo, canonHi, canonLo]`, an all-zero pair marking an empty slot. For each
 * `extLo`, `mix` is a bijection of `extHi`, so the pair identifies the external hash exactly and
 * gives it back (`unmixKey`); only the external hash 0 has the pair (0, 0), and it is kept beside
 * the table. A slot's home is read from its first word, so a move into a grown table and a
 * deletion's backward shift place entries without hashing them again. A table per member needs
 * no member tag in its slots, and a cleared or replaced member's table is dropped whole instead
 * of scanned.
 *
 * Linear probing with tombstone-free backward-shift deletion, at most 80% full (each member grows
 * between 74% and 80%, so that members that fill alike do not grow at once), growing by 1.5×
 * from 16 slots, so a table stays above 49% full. A slot's home is ⌊mix(ext)·capacity / 2^32⌋:
 * monotone in the mix, so moving the entries into a grown table reads the old one and writes the
 * new one front to back instead of at random; past 4,096 slots the move is spread over the
 * inserts that follow (see `MemberLineage`). No bigint and no `Map` on the apply path.
 */

import { MOVE_SLOTS_PER_INSERT, REHASH_AT_ONCE_SLOTS } from "./internal/growth.js"

const WIDTH = 4
const MIN_CAPACITY = 16
/** The fullest a table gets; each member's table grows a little before it (see `growthLoadOf`). */
const MAX_LOAD = 0.8
/** How much earlier than `MAX_LOAD` a member's table may grow: its growth points spread over 6%. */
const GROWTH_LOAD_SPREAD = 0.06

const INV_TWO_32 = 1 / 4294967296

/**
 * The load at which member `m`'s table grows: in [0.74, 0.8], spread by the member index (the
 * fractional parts of (m + 1)·φ). The members of a pool take about the same share of its stores,
 * so at one threshold their tables grew in the same few thousand inserts, and their moves (a few
 * µs an insert each) added up into one stretch of tens of milliseconds. Members that fill alike
 * now reach their thresholds up to 6% of the capacity apart, and a move lasts 1/128 of it.
 */
const growthLoadOf = (m: number): number =>
  MAX_LOAD - GROWTH_LOAD_SPREAD * ((Math.imul(m + 1, 0x9e3779b1) >>> 0) * INV_TWO_32)

/** Results of `insertChecked`. */
/** The mapping was there already; nothing changed. */
export const LINEAGE_PRESENT = 0
/** The mapping was added. */
export const LINEAGE_ADDED = 1
/** The external hash is mapped to another canonical hash already; nothing changed. */
export const LINEAGE_CONFLICT = -1

const MIX_1 = 0x85ebca6b
const MIX_2 = 0x7feb352d
const MIX_3 = 0x846ca68b

/**
 * 32-bit mix of an external hash. For a fixed `lo` it is a bijection of `hi` (a multiply by an
 * odd constant, xors and xorshifts, each invertible), which `unmixKey` inverts.
 */
const mixKey = (hi: number, lo: number): number => {
  let x = lo ^ Math.imul(hi, MIX_1)
  x = Math.imul(x ^ (x >>> 16), MIX_2)
  x = Math.imul(x ^ (x >>> 15), MIX_3)
  return (x ^ (x >>> 16)) >>> 0
}

/** The inverse of an odd u32 modulo 2^32 (Newton's iteration: each step doubles the correct bits). */
const inverseOdd = (a: number): number => {
  let x = a
  for (let i = 0; i < 5; i++) x = Math.imul(x, 2 - Math.imul(a, x))
  return x
}
const MIX_1_INV = inverseOdd(MIX_1)
const MIX_2_INV = inverseOdd(MIX_2)
const MIX_3_INV = inverseOdd(MIX_3)

/** The `hi` whose `mixKey(hi, lo)` is `x`. */
const unmixKey = (x: number, lo: number): number => {
  let y = x ^ (x >>> 16)
  y = Math.imul(y, MIX_3_INV)
  y = y ^ (y >>> 15) ^ (y >>> 30)
  y = Math.imul(y, MIX_2_INV)
  y = y ^ (y >>> 16)
  return Math.imul(y ^ lo, MIX_1_INV) >>> 0
}

/** True when the entry at j, whose home is `h`, must move into the hole at `hole` (cyclic order). */
const mustShift = (hole: number, j: number, h: number): boolean =>
  hole <= j ? h <= hole || h > j : h <= hole && h > j

/** Home slot of a mixed key `x` in a table of `cap` slots (`scale` = cap / 2^32). */
const homeIn = (cap: number, scale: number, x: number): number => Math.min(cap - 1, Math.floor(x * scale))

/** Slot of the pair `(x, lo)` (not both zero) in `slots`, or -1 - the empty slot where it would go. */
const slotIn = (slots: Uint32Array, cap: number, scale: number, x: number, lo: number): number => {
  let i = homeIn(cap, scale, x)
  for (;;) {
    const at = i * WIDTH
    const h = slots[at]!
    const l = slots[at + 1]!
    if (h === x && l === lo) return i
    if (h === 0 && l === 0) return -1 - i
    i = i + 1 === cap ? 0 : i + 1
  }
}

/** Tombstone-free deletion of `slot`: later entries of its probe run move back into the hole. */
const deleteIn = (slots: Uint32Array, cap: number, scale: number, slot: number): void => {
  let hole = slot
  let j = slot
  for (;;) {
    j = j + 1 === cap ? 0 : j + 1
    const at = j * WIDTH
    const h = slots[at]!
    const l = slots[at + 1]!
    if (h === 0 && l === 0) break
    if (!mustShift(hole, j, homeIn(cap, scale, h))) continue
    const to = hole * WIDTH
    slots[to] = h
    slots[to + 1] = l
    slots[to + 2] = slots[at + 2]!
    slots[to + 3] = slots[at + 3]!
    hole = j
  }
  slots.fill(0, hole * WIDTH, hole * WIDTH + WIDTH)
}

/**
 * One member's external → canonical map.
 *
 * A table past `REHASH_AT_ONCE_SLOTS` grows without a pause: the new table takes the inserts,
 * while the old one's entries move over in slot order, `moveSlotsPerInsert` per insert, and
 * lookups and deletions look in both. The move always ends on an empty old slot, so every old
 * entry left lies in a probe run that starts after the cursor: a lookup in the old table never
 * crosses the moved (emptied) region, and a deletion's backward shift never moves an entry into
 * it.
 */
class MemberLineage {
  constructor(
    private readonly moveSlotsPerInsert: number,
    /** The load at which the table grows (`growthLoadOf`). */
    private readonly growthLoad: number
  ) {
    this.growAt = Math.floor(MIN_CAPACITY * growthLoad)
  }

  slots: Uint32Array = new Uint32Array(MIN_CAPACITY * WIDTH)
  capacity = MIN_CAPACITY
  scale = MIN_CAPACITY * INV_TWO_32
  /** The table being moved out of while the table grows; `undefined` otherwise. */
  private old: Uint32Array | undefined = undefined
  private oldCapacity = 0
  private oldScale = 0
  /** Old slots below this are empty (moved); `old[cursor]`, when in range, is empty too. */
  private cursor = 0
  /** Entries in both tables (the zero external hash not included). */
  count = 0
  /** The table grows when an insert would take `count` past this. */
  private growAt: number
  hasZero = false
  zeroHi = 0
  zeroLo = 0

  get size(): number {
    return this.count + (this.hasZero ? 1 : 0)
  }

  /** Bytes of both tables; kept as a field, since the insert path reads it. */
  byteSize = MIN_CAPACITY * WIDTH * 4

  /** True while entries are still moving out of the old table. */
  get moving(): boolean {
    return this.old !== undefined
  }

  /** Slot of the pair `(x, lo)` in the old table, or -1. */
  private oldSlotOf(x: number, lo: number): number {
    const old = this.old
    if (old === undefined) return -1
    // A hash whose old home the move has passed is not in the old table: its probe run would
    // have to cross the empty slot at the cursor. Skipping the probe spares a cache miss.
    if (homeIn(this.oldCapacity, this.oldScale, x) < this.cursor) return -1
    const i = slotIn(old, this.oldCapacity, this.oldScale, x, lo)
    return i >= 0 ? i : -1
  }

  /** Loads the home slots of the `n` pairs of `ext` (see `LineageTable.touch`). */
  touch(ext: Uint32Array, n: number): number {
    const slots = this.slots
    const cap = this.capacity
    const scale = this.scale
    let touched = 0
    for (let i = 0; i < n; i++)
      touched |= slots[homeIn(cap, scale, mixKey(ext[2 * i]!, ext[2 * i + 1]!)) * WIDTH]!
    // While the table grows, a hash not yet in the new table is looked for in the old one too.
    const old = this.old
    if (old !== undefined) {
      for (let i = 0; i < n; i++) {
        const h = homeIn(this.oldCapacity, this.oldScale, mixKey(ext[2 * i]!, ext[2 * i + 1]!))
        if (h >= this.cursor) touched |= old[h * WIDTH]!
      }
    }
    return touched
  }

  /** The canonical hash of the external hash `ext[k, k + 1]` into `out[at, at + 1]`; false if absent. */
  get(ext: Uint32Array, k: number, out: Uint32Array, at: number): boolean {
    const hi = ext[k]!
    const lo = ext[k + 1]!
    if (hi === 0 && lo === 0) {
      if (!this.hasZero) return false
      out[at] = this.zeroHi
      out[at + 1] = this.zeroLo
      return true
    }
    const x = mixKey(hi, lo)
    let slots = this.slots
    let i = slotIn(slots, this.capacity, this.scale, x, lo)
    if (i < 0) {
      i = this.oldSlotOf(x, lo)
      if (i < 0) return false
      slots = this.old!
    }
    out[at] = slots[i * WIDTH + 2]!
    out[at + 1] = slots[i * WIDTH + 3]!
    return true
  }

  /**
   * Maps `ext[k, k + 1]` to `canon[c, c + 1]`: added, present (mapped to that canonical hash) or
   * conflict (mapped to another: replaced with `overwrite`, else left as it was).
   */
  insert(ext: Uint32Array, k: number, canon: Uint32Array, c: number, overwrite: boolean): number {
    const hi = ext[k]!
    const lo = ext[k + 1]!
    const canonHi = canon[c]!
    const canonLo = canon[c + 1]!
    if (hi === 0 && lo === 0) {
      if (this.hasZero) {
        if (this.zeroHi === canonHi && this.zeroLo === canonLo) return LINEAGE_PRESENT
        if (!overwrite) return LINEAGE_CONFLICT
      }
      const fresh = !this.hasZero
      this.hasZero = true
      this.zeroHi = canonHi
      this.zeroLo = canonLo
      return fresh ? LINEAGE_ADDED : LINEAGE_PRESENT
    }
    if (this.old !== undefined) this.move(this.moveSlotsPerInsert)
    const x = mixKey(hi, lo)
    let i = slotIn(this.slots, this.capacity, this.scale, x, lo)
    let slots = this.slots
    if (i < 0 && this.old !== undefined) {
      const o = this.oldSlotOf(x, lo)
      if (o >= 0) {
        i = o
        slots = this.old
      }
    }
    if (i >= 0) {
      if (slots[i * WIDTH + 2] === canonHi && slots[i * WIDTH + 3] === canonLo) return LINEAGE_PRESENT
      if (!overwrite) return LINEAGE_CONFLICT
      slots[i * WIDTH + 2] = canonHi
      slots[i * WIDTH + 3] = canonLo
      return LINEAGE_PRESENT
    }
    if (this.count + 1 > this.growAt) {
      this.grow()
      i = slotIn(this.slots, this.capacity, this.scale, x, lo)
    }
    const at = (-1 - i) * WIDTH
    slots = this.slots
    slots[at] = x
    slots[at + 1] = lo
    slots[at + 2] = canonHi
    slots[at + 3] = canonLo
    this.count++
    return LINEAGE_ADDED
  }

  /** Forgets `ext[k, k + 1]`, writing its canonical hash to `out[at, at + 1]`; false if absent. */
  // Probe loop repeated from `get` on purpose: each of these runs per block on the apply hot path,
  // and a shared probe returning a slot index was not inlined into both (see the note on boxing).
  delete(ext: Uint32Array, k: number, out: Uint32Array, at: number): boolean {
    const hi = ext[k]!
    const lo = ext[k + 1]!
    if (hi === 0 && lo === 0) {
      if (!this.hasZero) return false
      out[at] = this.zeroHi
      out[at + 1] = this.zeroLo
      this.hasZero = false
      return true
    }
    const x = mixKey(hi, lo)
    const i = slotIn(this.slots, this.capacity, this.scale, x, lo)
    if (i >= 0) {
      out[at] = this.slots[i * WIDTH + 2]!
      out[at + 1] = this.slots[i * WIDTH + 3]!
      deleteIn(this.slots, this.capacity, this.scale, i)
    } else {
      const o = this.oldSlotOf(x, lo)
      if (o < 0) return false
      const old = this.old!
      out[at] = old[o * WIDTH + 2]!
      out[at + 1] = old[o * WIDTH + 3]!
      deleteIn(old, this.oldCapacity, this.oldScale, o)
    }
    this.count--
    return true
  }

  entriesInto(out: Uint32Array): void {
    let k = 0
    if (this.hasZero) {
      out[k++] = 0
      out[k++] = 0
      out[k++] = this.zeroHi
      out[k++] = this.zeroLo
    }
    for (const slots of this.old === undefined ? [this.slots] : [this.old, this.slots]) {
      for (let at = 0; at < slots.length; at += WIDTH) {
        const x = slots[at]!
        const lo = slots[at + 1]!
        if (x === 0 && lo === 0) continue
        out[k++] = unmixKey(x, lo)
        out[k++] = lo
        out[k++] = slots[at + 2]!
        out[k++] = slots[at + 3]!
      }
    }
  }

  /** Puts the pair `(x, lo)`, known to be absent, into the current table (which has room). */
  private place(x: number, lo: number, canonHi: number, canonLo: number): void {
    const slots = this.slots
    const cap = this.capacity
    let i = homeIn(cap, this.scale, x)
    while (slots[i * WIDTH] !== 0 || slots[i * WIDTH + 1] !== 0) i = i + 1 === cap ? 0 : i + 1
    const to = i * WIDTH
    slots[to] = x
    slots[to + 1] = lo
    slots[to + 2] = canonHi
    slots[to + 3] = canonLo
  }

  /**
   * Moves at least `budget` old slots' worth of entries to the current table, then on to the
   * next empty old slot, so that no probe run of the old table straddles the cursor.
   */
  private move(budget: number): void {
    const old = this.old!
    const cap = this.oldCapacity
    let cursor = this.cursor
    let at = cursor * WIDTH
    for (let moved = 0; cursor < cap; cursor++, moved++, at += WIDTH) {
      const h = old[at]!
      const l = old[at + 1]!
      if (h === 0 && l === 0) {
        if (moved >= budget) break
        continue
      }
      this.place(h, l, old[at + 2]!, old[at + 3]!)
      old[at] = 0
      old[at + 1] = 0
    }
    this.cursor = cursor
    if (cursor >= cap) {
      this.old = undefined
      this.byteSize = this.slots.byteLength
    }
  }

  private grow(): void {
    // A move still under way ends first (inserts outran it, which the step sizes rule out).
    if (this.old !== undefined) this.move(Number.POSITIVE_INFINITY)
    const old = this.slots
    const oldCapacity = this.capacity
    const capacity = Math.ceil(oldCapacity * 1.5)
    this.slots = new Uint32Array(capacity * WIDTH)
    this.capacity = capacity
    this.growAt = Math.floor(capacity * this.growthLoad)
    this.scale = capacity * INV_TWO_32
    this.old = old
    this.oldCapacity = oldCapacity
    this.oldScale = oldCapacity * INV_TWO_32
    this.cursor = 0
    this.byteSize = this.slots.byteLength + old.byteLength
    this.move(oldCapacity > REHASH_AT_ONCE_SLOTS ? this.moveSlotsPerInsert : Number.POSITIVE_INFINITY)
  }
}

/** External block hash to canonical sequence hash, per rank, for the blocks the rank holds. */
export class LineageTable {
  constructor(
    /** Old slots moved per insert while a member's table grows (tests lower it to stretch the move). */
    private readonly moveSlotsPerInsert = MOVE_SLOTS_PER_INSERT
  ) {}

  /** Member tables by member index; a member without entries has none. */
  private tables: Array<MemberLineage | undefined> = []
  private readonly members = new Map<string, number>()
  private readonly freeMembers: Array<number> = []
  private count = 0
  private slotBytes = 0

  get size(): number {
    return this.count
  }

  /** Bytes held by the members' tables. */
  get bytes(): number {
    return this.slotBytes
  }

  /** The member index of `key`, or -1 when it has no entries. */
  memberIndex(key: string): number {
    return this.members.get(key) ?? -1
  }

  ensureMember(key: string): number {
    const known = this.members.get(key)
    if (known !== undefined) return known
    const m = this.freeMembers.pop() ?? this.tables.length
    const table = new MemberLineage(this.moveSlotsPerInsert, growthLoadOf(m))
    this.tables[m] = table
    this.slotBytes += table.byteSize
    this.members.set(key, m)
    return m
  }

  /** True while member `m`'s table is moving its entries into a grown one (for tests). */
  isMoving(m: number): boolean {
    return m >= 0 && this.tables[m]?.moving === true
  }

  entriesOf(m: number): number {
    return m < 0 ? 0 : (this.tables[m]?.size ?? 0)
  }

  private release(key: string, m: number): void {
    const table = this.tables[m]
    if (table !== undefined) {
      this.count -= table.size
      this.slotBytes -= table.byteSize
    }
    this.tables[m] = undefined
    this.members.delete(key)
    this.freeMembers.push(m)
  }

  /*
   * Hashes come as a pair in a typed array and its word offset, never as u32 arguments: a u32
   * above 2^31 passed to a call that is not inlined is boxed into a heap number, and whether these
   * calls are inlined into the apply path depends on the caller's size.
   */

  /** The canonical hash of member `m`'s external hash `ext[k, k + 1]` into `out[at, at + 1]`; false if absent. */
  get(m: number, ext: Uint32Array, k: number, out: Uint32Array, at: number): boolean {
    if (m < 0) return false
    const table = this.tables[m]
    return table?.get(ext, k, out, at) === true
  }

  /**
   * Loads the home slots of member `m`'s first `n` external hashes in `ext` without acting on
   * them: issued back to back, the loads' cache misses overlap, and the probes that follow hit.
   * Returns a value only so the loads are not optimised away.
   */
  touch(m: number, ext: Uint32Array, n: number): number {
    return this.tables[m]!.touch(ext, n)
  }

  /**
   * Maps member `m`'s external hash `ext[k, k + 1]` to the canonical `canon[c, c + 1]`; true when
   * the external hash was new, false when it was mapped already (its canonical hash is then
   * overwritten).
   */
  insert(m: number, ext: Uint32Array, k: number, canon: Uint32Array, c: number): boolean {
    return this.put(m, ext, k, canon, c, true) === LINEAGE_ADDED
  }

  /**
   * Maps member `m`'s external hash to a canonical one unless it is mapped: `LINEAGE_ADDED`,
   * `LINEAGE_PRESENT` (to this canonical hash) or `LINEAGE_CONFLICT` (to another; unchanged).
   * One probe does the check and the insertion a separate lookup would each do.
   */
  insertChecked(m: number, ext: Uint32Array, k: number, canon: Uint32Array, c: number): number {
    return this.put(m, ext, k, canon, c, false)
  }

  private put(
    m: number,
    ext: Uint32Array,
    k: number,
    canon: Uint32Array,
    c: number,
    overwrite: boolean
  ): number {
    const table = this.tables[m]!
    const before = table.byteSize
    const code = table.insert(ext, k, canon, c, overwrite)
    if (code === LINEAGE_ADDED) this.count++
    this.slotBytes += table.byteSize - before
    return code
  }

  /**
   * Removes member `m`'s external hash `ext[k, k + 1]`, writing its canonical hash to
   * `out[at, at + 1]`; false when it was not mapped. `key` is the member's key, released with its
   * last entry.
   */
  delete(key: string, m: number, ext: Uint32Array, k: number, out: Uint32Array, at: number): boolean {
    if (m < 0) return false
    const table = this.tables[m]
    if (table === undefined || !table.delete(ext, k, out, at)) return false
    this.count--
    if (table.size === 0) this.release(key, m)
    return true
  }

  /** Every `[extHi, extLo, canonHi, canonLo]` entry of member `m`. */
  entries(m: number): Uint32Array {
    const out = new Uint32Array(4 * this.entriesOf(m))
    if (out.length > 0) this.tables[m]!.entriesInto(out)
    return out
  }

  /** Drops every entry of the member `key`. */
  clearMember(key: string): void {
    const m = this.memberIndex(key)
    if (m >= 0) this.release(key, m)
  }
}
