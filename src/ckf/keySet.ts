/**
 * A set of uniformly distributed 64-bit keys: one member's blocks on one storage tier of a
 * canonical pool (see `tiers.ts`), keyed by the CKF's mixed key of each canonical hash
 * (`CkfAddressing.mixBatch`). The mixed key is XXH3 of the hash, a bijection of u64, so the set
 * stays exact and the canonical hash can be recovered (`CkfAddressing.unmix`).
 *
 * Open addressing over a typed array of `[hi, lo]` slots (8 bytes a slot, no member tag: a set per
 * member), an all-zero pair marking an empty slot; the one key (0, 0) is kept beside the table.
 * A slot's home is ⌊hi·capacity / 2^32⌋ (the key is uniform already, so it is not hashed again),
 * which is monotone in `hi`: a move into a grown table reads the old one and writes the new one
 * front to back, and a deletion's backward shift places entries without rehashing them. Linear
 * probing with tombstone-free backward-shift deletion, at most 80% full, growing by 1.5× from 16
 * slots, so a set stays above 53% full. Past 4,096 slots the move into a grown table is spread
 * over the inserts that follow, as the lineage's and the owner table's are (see "Growth without a
 * pause" in docs/decisions.md): lookups and deletions look in both tables meanwhile.
 *
 * Keys come as a pair in a typed array and its word offset, never as u32 arguments: a u32 above
 * 2^31 passed to a call that is not inlined is boxed into a heap number.
 */

import { MOVE_SLOTS_PER_INSERT, REHASH_AT_ONCE_SLOTS } from "./internal/growth.js"

const MIN_CAPACITY = 16
const MAX_LOAD = 0.8
const INV_TWO_32 = 1 / 4294967296

/** Home slot of a key whose high word is `hi`, in a table of `cap` slots (`scale` = cap / 2^32). */
const homeIn = (cap: number, scale: number, hi: number): number => Math.min(cap - 1, Math.floor(hi * scale))

/** True when the entry at j, whose home is `h`, must move into the hole at `hole` (cyclic order). */
const mustShift = (hole: number, j: number, h: number): boolean =>
  hole <= j ? h <= hole || h > j : h <= hole && h > j

/** Slot of the key `(hi, lo)` (not both zero) in `slots`, or -1 - the empty slot where it would go. */
const slotIn = (slots: Uint32Array, cap: number, scale: number, hi: number, lo: number): number => {
  let i = homeIn(cap, scale, hi)
  for (;;) {
    const h = slots[2 * i]!
    const l = slots[2 * i + 1]!
    if (h === hi && l === lo) return i
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
    const h = slots[2 * j]!
    const l = slots[2 * j + 1]!
    if (h === 0 && l === 0) break
    if (!mustShift(hole, j, homeIn(cap, scale, h))) continue
    slots[2 * hole] = h
    slots[2 * hole + 1] = l
    hole = j
  }
  slots[2 * hole] = 0
  slots[2 * hole + 1] = 0
}

export class KeySet {
  constructor(
    /** Old slots moved per insert while the set grows (tests lower it to stretch the move). */
    private readonly moveSlotsPerInsert = MOVE_SLOTS_PER_INSERT
  ) {}

  private slots = new Uint32Array(2 * MIN_CAPACITY)
  private capacity = MIN_CAPACITY
  private scale = MIN_CAPACITY * INV_TWO_32
  /** The set being moved out of while the set grows; `undefined` otherwise. */
  private old: Uint32Array | undefined = undefined
  private oldCapacity = 0
  private oldScale = 0
  /** Old slots below this are empty (moved); `old[cursor]`, when in range, is empty too. */
  private cursor = 0
  /** Keys in both tables, the zero key not included. */
  private count = 0
  private growAt = Math.floor(MIN_CAPACITY * MAX_LOAD)
  private hasZero = false
  /** Bytes of both tables; a field, since the insert path reads it. */
  byteSize = 2 * MIN_CAPACITY * 4

  get size(): number {
    return this.count + (this.hasZero ? 1 : 0)
  }

  /** True while keys are still moving out of the table being grown out of (for tests). */
  get moving(): boolean {
    return this.old !== undefined
  }

  /** Slot of the key in the old table, or -1. */
  private oldSlotOf(hi: number, lo: number): number {
    const old = this.old
    if (old === undefined) return -1
    // A key whose old home the move has passed is not in the old table: its probe run would have
    // to cross the empty slot at the cursor.
    if (homeIn(this.oldCapacity, this.oldScale, hi) < this.cursor) return -1
    const i = slotIn(old, this.oldCapacity, this.oldScale, hi, lo)
    return i >= 0 ? i : -1
  }

  /** Whether the key `keys[k], keys[k + 1]` is in the set. */
  has(keys: Uint32Array, k: number): boolean {
    const hi = keys[k]!
    const lo = keys[k + 1]!
    if (hi === 0 && lo === 0) return this.hasZero
    // The common case inline: the probe run of a set at most 80% full is short.
    const slots = this.slots
    const cap = this.capacity
    let i = homeIn(cap, this.scale, hi)
    for (;;) {
      const h = slots[2 * i]!
      const l = slots[2 * i + 1]!
      if (h === hi && l === lo) return true
      if (h === 0 && l === 0) return this.old !== undefined && this.oldSlotOf(hi, lo) >= 0
      i = i + 1 === cap ? 0 : i + 1
    }
  }

  /** Adds the key; true when it was not in the set. */
  add(keys: Uint32Array, k: number): boolean {
    const hi = keys[k]!
    const lo = keys[k + 1]!
    if (hi === 0 && lo === 0) {
      if (this.hasZero) return false
      this.hasZero = true
      return true
    }
    if (this.old !== undefined) this.move(this.moveSlotsPerInsert)
    let i = slotIn(this.slots, this.capacity, this.scale, hi, lo)
    if (i >= 0 || this.oldSlotOf(hi, lo) >= 0) return false
    if (this.count + 1 > this.growAt) {
      this.grow()
      i = slotIn(this.slots, this.capacity, this.scale, hi, lo)
    }
    const at = 2 * (-1 - i)
    this.slots[at] = hi
    this.slots[at + 1] = lo
    this.count++
    return true
  }

  /** Removes the key; true when it was in the set. */
  delete(keys: Uint32Array, k: number): boolean {
    const hi = keys[k]!
    const lo = keys[k + 1]!
    if (hi === 0 && lo === 0) {
      const had = this.hasZero
      this.hasZero = false
      return had
    }
    const i = slotIn(this.slots, this.capacity, this.scale, hi, lo)
    if (i >= 0) deleteIn(this.slots, this.capacity, this.scale, i)
    else {
      const o = this.oldSlotOf(hi, lo)
      if (o < 0) return false
      deleteIn(this.old!, this.oldCapacity, this.oldScale, o)
    }
    this.count--
    return true
  }

  /** Every key as `[hi, lo]` pairs, in no particular order. */
  keys(): Uint32Array {
    const out = new Uint32Array(2 * this.size)
    let k = 0
    if (this.hasZero) k = 2
    for (const slots of this.old === undefined ? [this.slots] : [this.old, this.slots]) {
      for (let at = 0; at < slots.length; at += 2) {
        const h = slots[at]!
        const l = slots[at + 1]!
        if (h === 0 && l === 0) continue
        out[k++] = h
        out[k++] = l
      }
    }
    return out
  }

  /** Puts the key, known to be absent, into the current table (which has room). */
  private place(hi: number, lo: number): void {
    const slots = this.slots
    const cap = this.capacity
    let i = homeIn(cap, this.scale, hi)
    while (slots[2 * i] !== 0 || slots[2 * i + 1] !== 0) i = i + 1 === cap ? 0 : i + 1
    slots[2 * i] = hi
    slots[2 * i + 1] = lo
  }

  /**
   * Moves at least `budget` old slots' worth of keys to the current table, then on to the next
   * empty old slot, so that no probe run of the old table straddles the cursor.
   */
  private move(budget: number): void {
    const old = this.old!
    const cap = this.oldCapacity
    let cursor = this.cursor
    for (let moved = 0; cursor < cap; cursor++, moved++) {
      const h = old[2 * cursor]!
      const l = old[2 * cursor + 1]!
      if (h === 0 && l === 0) {
        if (moved >= budget) break
        continue
      }
      this.place(h, l)
      old[2 * cursor] = 0
      old[2 * cursor + 1] = 0
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
    this.slots = new Uint32Array(2 * capacity)
    this.capacity = capacity
    this.scale = capacity * INV_TWO_32
    this.growAt = Math.floor(capacity * MAX_LOAD)
    this.old = old
    this.oldCapacity = oldCapacity
    this.oldScale = oldCapacity * INV_TWO_32
    this.cursor = 0
    this.byteSize = this.slots.byteLength + old.byteLength
    this.move(oldCapacity > REHASH_AT_ONCE_SLOTS ? this.moveSlotsPerInsert : Number.POSITIVE_INFINITY)
  }
}
