/**
 * Open-addressing tables keyed by u64 halves, for exact ownership on the apply path.
 *
 * Linear probing over power-of-two capacities, growth by doubling at 80% load, and deletion by
 * backward shift (no tombstones), so long-running churn never degrades probe lengths. Keys are the
 * two u32 halves of the block hash; callers pass the mixed hash `h = mixKey(hi, lo)` so that one
 * mix serves both the refcount table and the member set.
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

/**
 * A set of u64 keys. The all-zero key doubles as the empty-slot marker, so it is held in a flag
 * instead of a slot.
 */
export class U64Set {
  private khi: Uint32Array
  private klo: Uint32Array
  private mask: number
  private used = 0
  private hasZero = false

  constructor(initialCapacity = 8) {
    const cap = capacityFor(0, Math.max(4, initialCapacity))
    this.khi = new Uint32Array(cap)
    this.klo = new Uint32Array(cap)
    this.mask = cap - 1
  }

  get size(): number {
    return this.used + (this.hasZero ? 1 : 0)
  }

  get capacity(): number {
    return this.mask + 1
  }

  /** Bytes held by the slot arrays. */
  get byteSize(): number {
    return (this.mask + 1) * 8
  }

  has(hi: number, lo: number, h: number): boolean {
    if ((hi | lo) === 0) return this.hasZero
    const khi = this.khi
    const klo = this.klo
    const mask = this.mask
    let i = h & mask
    for (;;) {
      const l = klo[i]!
      const u = khi[i]!
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
    const khi = this.khi
    const klo = this.klo
    const mask = this.mask
    let i = h & mask
    while ((klo[i]! | khi[i]!) !== 0) i = (i + 1) & mask
    khi[i] = hi
    klo[i] = lo
    this.used++
  }

  /** Remove a key; returns false when it was absent. */
  delete(hi: number, lo: number, h: number): boolean {
    if ((hi | lo) === 0) {
      const had = this.hasZero
      this.hasZero = false
      return had
    }
    const khi = this.khi
    const klo = this.klo
    const mask = this.mask
    let i = h & mask
    for (;;) {
      const l = klo[i]!
      const u = khi[i]!
      if (l === lo && u === hi) break
      if ((l | u) === 0) return false
      i = (i + 1) & mask
    }
    // Backward shift: pull later members of the probe run into the hole when their home slot
    // does not lie cyclically in (hole, j].
    let j = i
    for (;;) {
      j = (j + 1) & mask
      const l = klo[j]!
      const u = khi[j]!
      if ((l | u) === 0) break
      const home = mixKey(u, l) & mask
      const stays = i <= j ? home > i && home <= j : home > i || home <= j
      if (!stays) {
        khi[i] = u
        klo[i] = l
        i = j
      }
    }
    khi[i] = 0
    klo[i] = 0
    this.used--
    return true
  }

  /** Append every key as (hi, lo) pairs to `out` starting at `offset`; returns the new offset. */
  copyTo(out: Uint32Array, offset: number): number {
    if (this.hasZero) {
      out[offset++] = 0
      out[offset++] = 0
    }
    const khi = this.khi
    const klo = this.klo
    for (let i = 0; i <= this.mask; i++) {
      const l = klo[i]!
      const u = khi[i]!
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
    const nhi = new Uint32Array(capacity)
    const nlo = new Uint32Array(capacity)
    const mask = capacity - 1
    const ohi = this.khi
    const olo = this.klo
    for (let s = 0; s < ohi.length; s++) {
      const l = olo[s]!
      const u = ohi[s]!
      if ((l | u) === 0) continue
      let i = mixKey(u, l) & mask
      while ((nlo[i]! | nhi[i]!) !== 0) i = (i + 1) & mask
      nhi[i] = u
      nlo[i] = l
    }
    this.khi = nhi
    this.klo = nlo
    this.mask = mask
  }
}

/**
 * Map from u64 key to a positive u32 count. A zero count marks an empty slot, so every key
 * (including zero) lives in the table.
 */
export class U64CountTable {
  private khi: Uint32Array
  private klo: Uint32Array
  /** Counts by slot; exposed for in-place updates after `find`. */
  counts: Uint32Array
  private mask: number
  size = 0

  constructor(initialCapacity = 16) {
    const cap = capacityFor(0, Math.max(4, initialCapacity))
    this.khi = new Uint32Array(cap)
    this.klo = new Uint32Array(cap)
    this.counts = new Uint32Array(cap)
    this.mask = cap - 1
  }

  get capacity(): number {
    return this.mask + 1
  }

  get byteSize(): number {
    return (this.mask + 1) * 12
  }

  /** Slot of the key, or -1. */
  find(hi: number, lo: number, h: number): number {
    const khi = this.khi
    const klo = this.klo
    const counts = this.counts
    const mask = this.mask
    let i = h & mask
    for (;;) {
      if (counts[i] === 0) return -1
      if (klo[i] === lo && khi[i] === hi) return i
      i = (i + 1) & mask
    }
  }

  get(hi: number, lo: number, h: number): number {
    const i = this.find(hi, lo, h)
    return i < 0 ? 0 : this.counts[i]!
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
    const counts = this.counts
    const mask = this.mask
    let i = h & mask
    while (counts[i] !== 0) i = (i + 1) & mask
    this.khi[i] = hi
    this.klo[i] = lo
    counts[i] = count
    this.size++
  }

  /** Remove the entry at a slot returned by `find` (backward-shift deletion). */
  removeAt(slot: number): void {
    const khi = this.khi
    const klo = this.klo
    const counts = this.counts
    const mask = this.mask
    let i = slot
    let j = slot
    for (;;) {
      j = (j + 1) & mask
      const c = counts[j]!
      if (c === 0) break
      const u = khi[j]!
      const l = klo[j]!
      const home = mixKey(u, l) & mask
      const stays = i <= j ? home > i && home <= j : home > i || home <= j
      if (!stays) {
        khi[i] = u
        klo[i] = l
        counts[i] = c
        i = j
      }
    }
    counts[i] = 0
    khi[i] = 0
    klo[i] = 0
    this.size--
  }

  /** Visit every (hi, lo, count). */
  forEach(visit: (hi: number, lo: number, count: number) => void): void {
    for (let i = 0; i <= this.mask; i++) {
      const c = this.counts[i]!
      if (c !== 0) visit(this.khi[i]!, this.klo[i]!, c)
    }
  }

  private rehash(capacity: number): void {
    const nhi = new Uint32Array(capacity)
    const nlo = new Uint32Array(capacity)
    const ncounts = new Uint32Array(capacity)
    const mask = capacity - 1
    for (let s = 0; s <= this.mask; s++) {
      const c = this.counts[s]!
      if (c === 0) continue
      const u = this.khi[s]!
      const l = this.klo[s]!
      let i = mixKey(u, l) & mask
      while (ncounts[i] !== 0) i = (i + 1) & mask
      nhi[i] = u
      nlo[i] = l
      ncounts[i] = c
    }
    this.khi = nhi
    this.klo = nlo
    this.counts = ncounts
    this.mask = mask
  }
}
