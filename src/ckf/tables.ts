/**
 * Open-addressing tables keyed by u64 halves, for exact ownership on the apply path.
 *
 * Linear probing over power-of-two capacities, growth by doubling at 80% load, and deletion by
 * backward shift (no tombstones), so long-running churn never degrades probe lengths. Keys are the
 * two u32 halves of the block hash; callers pass the mixed hash `h = mixKey(hi, lo)` so that one
 * mix serves both the refcount table and the member set. Each slot's fields are interleaved in
 * one typed array: the apply path is bound by cache misses, and one probe should cost one line.
 */

const MAX_LOAD_NUM = 4
const MAX_LOAD_DEN = 5

/** 32-bit mix of a u64 key for table addressing. */
export const mixKey = (hi: number, lo: number): number => {
  let h = lo ^ Math.imul(hi, 0x9e3779b1)
  h = Math.imul(h ^ (h >>> 16), 0x85ebca6b)
  h = Math.imul(h ^ (h >>> 13), 0xc2b2ae35)
  return (h ^ (h >>> 16)) >>> 0
}

const capacityFor = (entries: number, minimum: number): number => {
  let cap = minimum
  while (cap * MAX_LOAD_NUM < (entries + 1) * MAX_LOAD_DEN) cap *= 2
  return cap
}

/** True when `home` does not lie cyclically in (hole, j]: the entry at j must move into the hole. */
const mustShift = (hole: number, j: number, home: number): boolean =>
  hole <= j ? home <= hole || home > j : home <= hole && home > j

/**
 * A set of u64 keys. Slot i is `[hi, lo]` at `keys[2i]`. The all-zero key doubles as the
 * empty-slot marker, so it is held in a flag instead of a slot.
 */
export class U64Set {
  private keys: Uint32Array
  private mask: number
  private used = 0
  private hasZero = false

  constructor(initialCapacity = 8) {
    const cap = capacityFor(0, Math.max(4, initialCapacity))
    this.keys = new Uint32Array(cap * 2)
    this.mask = cap - 1
  }

  get size(): number {
    return this.used + (this.hasZero ? 1 : 0)
  }

  get capacity(): number {
    return this.mask + 1
  }

  /** Bytes held by the slot array. */
  get byteSize(): number {
    return this.keys.byteLength
  }

  has(hi: number, lo: number, h: number): boolean {
    if ((hi | lo) === 0) return this.hasZero
    const keys = this.keys
    const mask = this.mask
    let i = h & mask
    for (;;) {
      const u = keys[2 * i]!
      const l = keys[2 * i + 1]!
      if (l === lo && u === hi) return true
      if ((l | u) === 0) return false
      i = (i + 1) & mask
    }
  }

  /**
   * Make room for `additional` more keys. Returns false when the allocation fails; the set is then
   * unchanged.
   */
  reserve(additional: number): boolean {
    const needed = this.used + additional
    if (needed * MAX_LOAD_DEN <= (this.mask + 1) * MAX_LOAD_NUM) return true
    try {
      this.rehash(capacityFor(needed, this.mask + 1))
      return true
    } catch {
      return false
    }
  }

  /** Insert a key known to be absent; capacity must have been reserved. */
  insertAbsent(hi: number, lo: number, h: number): void {
    if ((hi | lo) === 0) {
      this.hasZero = true
      return
    }
    const keys = this.keys
    const mask = this.mask
    let i = h & mask
    while ((keys[2 * i]! | keys[2 * i + 1]!) !== 0) i = (i + 1) & mask
    keys[2 * i] = hi
    keys[2 * i + 1] = lo
    this.used++
  }

  /** Remove a key; returns false when it was absent. */
  delete(hi: number, lo: number, h: number): boolean {
    if ((hi | lo) === 0) {
      const had = this.hasZero
      this.hasZero = false
      return had
    }
    const keys = this.keys
    const mask = this.mask
    let i = h & mask
    for (;;) {
      const u = keys[2 * i]!
      const l = keys[2 * i + 1]!
      if (l === lo && u === hi) break
      if ((l | u) === 0) return false
      i = (i + 1) & mask
    }
    let j = i
    for (;;) {
      j = (j + 1) & mask
      const u = keys[2 * j]!
      const l = keys[2 * j + 1]!
      if ((l | u) === 0) break
      if (mustShift(i, j, mixKey(u, l) & mask)) {
        keys[2 * i] = u
        keys[2 * i + 1] = l
        i = j
      }
    }
    keys[2 * i] = 0
    keys[2 * i + 1] = 0
    this.used--
    return true
  }

  /** Append every key as (hi, lo) pairs to `out` starting at `offset`; returns the new offset. */
  copyTo(out: Uint32Array, offset: number): number {
    if (this.hasZero) {
      out[offset++] = 0
      out[offset++] = 0
    }
    const keys = this.keys
    for (let i = 0; i < keys.length; i += 2) {
      const u = keys[i]!
      const l = keys[i + 1]!
      if ((l | u) !== 0) {
        out[offset++] = u
        out[offset++] = l
      }
    }
    return offset
  }

  /** Every key as hash pairs. */
  toPairs(): Uint32Array {
    const out = new Uint32Array(this.size * 2)
    this.copyTo(out, 0)
    return out
  }

  private rehash(capacity: number): void {
    const next = new Uint32Array(capacity * 2)
    const mask = capacity - 1
    const old = this.keys
    for (let s = 0; s < old.length; s += 2) {
      const u = old[s]!
      const l = old[s + 1]!
      if ((l | u) === 0) continue
      let i = mixKey(u, l) & mask
      while ((next[2 * i]! | next[2 * i + 1]!) !== 0) i = (i + 1) & mask
      next[2 * i] = u
      next[2 * i + 1] = l
    }
    this.keys = next
    this.mask = mask
  }
}

/**
 * Map from u64 key to a positive u32 count. Slot i is `[hi, lo, count]` at `slots[3i]`; a zero
 * count marks an empty slot, so every key (including zero) lives in the table.
 */
export class U64CountTable {
  private slots: Uint32Array
  private mask: number
  size = 0

  constructor(initialCapacity = 16) {
    const cap = capacityFor(0, Math.max(4, initialCapacity))
    this.slots = new Uint32Array(cap * 3)
    this.mask = cap - 1
  }

  get capacity(): number {
    return this.mask + 1
  }

  get byteSize(): number {
    return this.slots.byteLength
  }

  /** Slot of the key, or -1. */
  find(hi: number, lo: number, h: number): number {
    const slots = this.slots
    const mask = this.mask
    let i = h & mask
    for (;;) {
      const base = 3 * i
      if (slots[base + 2] === 0) return -1
      if (slots[base + 1] === lo && slots[base] === hi) return i
      i = (i + 1) & mask
    }
  }

  get(hi: number, lo: number, h: number): number {
    const i = this.find(hi, lo, h)
    return i < 0 ? 0 : this.slots[3 * i + 2]!
  }

  countAt(slot: number): number {
    return this.slots[3 * slot + 2]!
  }

  setCountAt(slot: number, count: number): void {
    this.slots[3 * slot + 2] = count
  }

  reserve(additional: number): boolean {
    const needed = this.size + additional
    if (needed * MAX_LOAD_DEN <= (this.mask + 1) * MAX_LOAD_NUM) return true
    try {
      this.rehash(capacityFor(needed, this.mask + 1))
      return true
    } catch {
      return false
    }
  }

  /** Insert a key known to be absent with a positive count; capacity must have been reserved. */
  insertAbsent(hi: number, lo: number, h: number, count: number): void {
    const slots = this.slots
    const mask = this.mask
    let i = h & mask
    while (slots[3 * i + 2] !== 0) i = (i + 1) & mask
    slots[3 * i] = hi
    slots[3 * i + 1] = lo
    slots[3 * i + 2] = count
    this.size++
  }

  /** Remove the entry at a slot returned by `find` (backward-shift deletion). */
  removeAt(slot: number): void {
    const slots = this.slots
    const mask = this.mask
    let i = slot
    let j = slot
    for (;;) {
      j = (j + 1) & mask
      const c = slots[3 * j + 2]!
      if (c === 0) break
      const u = slots[3 * j]!
      const l = slots[3 * j + 1]!
      if (mustShift(i, j, mixKey(u, l) & mask)) {
        slots[3 * i] = u
        slots[3 * i + 1] = l
        slots[3 * i + 2] = c
        i = j
      }
    }
    slots[3 * i] = 0
    slots[3 * i + 1] = 0
    slots[3 * i + 2] = 0
    this.size--
  }

  /** Visit every (hi, lo, count). */
  forEach(visit: (hi: number, lo: number, count: number) => void): void {
    const slots = this.slots
    for (let s = 0; s < slots.length; s += 3) {
      const c = slots[s + 2]!
      if (c !== 0) visit(slots[s]!, slots[s + 1]!, c)
    }
  }

  private rehash(capacity: number): void {
    const next = new Uint32Array(capacity * 3)
    const mask = capacity - 1
    const old = this.slots
    for (let s = 0; s < old.length; s += 3) {
      const c = old[s + 2]!
      if (c === 0) continue
      const u = old[s]!
      const l = old[s + 1]!
      let i = mixKey(u, l) & mask
      while (next[3 * i + 2] !== 0) i = (i + 1) & mask
      next[3 * i] = u
      next[3 * i + 1] = l
      next[3 * i + 2] = c
    }
    this.slots = next
    this.mask = mask
  }
}
