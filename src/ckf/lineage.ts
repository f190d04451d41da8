/**
 * Per-source lineage of a canonically addressed pool (PROTOCOL §3.3): for each member (a source
 * rank), the engine's external block hash → the canonical sequence hash it was stored under.
 * Parents resolve through it and removals by external hash find their block.
 *
 * One open-addressing table over typed arrays for every member, keyed by (member, external):
 * five u32 per slot, `[extHi, extLo, member + 1, canonHi, canonLo]` (member 0 = empty), linear
 * probing, tombstone-free backward-shift deletion, at most 80% full, doubling as it grows. No
 * bigint and no `Map` on the apply path; a member's entries are enumerated by a scan, which only
 * clears and rank replacements need.
 */

const WIDTH = 5
const MIN_CAPACITY = 16
const MAX_LOAD_NUM = 4
const MAX_LOAD_DEN = 5

/** 32-bit mix of an (external hash, member) key. */
const mixKey = (hi: number, lo: number, tag: number): number => {
  let x = lo ^ Math.imul(hi, 0x85ebca6b) ^ Math.imul(tag, 0xc2b2ae35)
  x = Math.imul(x ^ (x >>> 16), 0x7feb352d)
  x = Math.imul(x ^ (x >>> 15), 0x846ca68b)
  return (x ^ (x >>> 16)) >>> 0
}

export class LineageTable {
  private slots: Uint32Array
  private capacity: number
  private mask: number
  private count = 0
  /** Entries per member index. */
  private perMember = new Uint32Array(16)
  private readonly members = new Map<string, number>()
  private readonly freeMembers: Array<number> = []
  private nextMember = 0

  constructor(expectedEntries = 0) {
    let capacity = MIN_CAPACITY
    while (capacity * MAX_LOAD_NUM < expectedEntries * MAX_LOAD_DEN) capacity *= 2
    this.capacity = capacity
    this.mask = capacity - 1
    this.slots = new Uint32Array(capacity * WIDTH)
  }

  get size(): number {
    return this.count
  }

  /** Bytes held by the table's arrays. */
  get bytes(): number {
    return this.slots.byteLength + this.perMember.byteLength
  }

  /** The member index of `key`, or -1 when it has no entries. */
  memberIndex(key: string): number {
    return this.members.get(key) ?? -1
  }

  ensureMember(key: string): number {
    const known = this.members.get(key)
    if (known !== undefined) return known
    const m = this.freeMembers.pop() ?? this.nextMember++
    if (m >= this.perMember.length) {
      const grown = new Uint32Array(2 * this.perMember.length)
      grown.set(this.perMember)
      this.perMember = grown
    }
    this.perMember[m] = 0
    this.members.set(key, m)
    return m
  }

  entriesOf(m: number): number {
    return m < 0 ? 0 : this.perMember[m]!
  }

  private releaseIfEmpty(key: string, m: number): void {
    if (this.perMember[m] !== 0) return
    this.members.delete(key)
    this.freeMembers.push(m)
  }

  private slotOf(m: number, hi: number, lo: number): number {
    const tag = m + 1
    const slots = this.slots
    let i = mixKey(hi, lo, tag) & this.mask
    for (;;) {
      const at = i * WIDTH
      const t = slots[at + 2]!
      if (t === 0) return -1 - i
      if (t === tag && slots[at] === hi && slots[at + 1] === lo) return i
      i = (i + 1) & this.mask
    }
  }

  /** The canonical hash of member `m`'s external `(hi, lo)` into `out[at, at + 1]`; false if absent. */
  get(m: number, hi: number, lo: number, out: Uint32Array, at: number): boolean {
    if (m < 0) return false
    const i = this.slotOf(m, hi, lo)
    if (i < 0) return false
    out[at] = this.slots[i * WIDTH + 3]!
    out[at + 1] = this.slots[i * WIDTH + 4]!
    return true
  }

  /** Maps member `m`'s external hash to a canonical one (the caller checked it was absent). */
  insert(m: number, hi: number, lo: number, canonHi: number, canonLo: number): void {
    if ((this.count + 1) * MAX_LOAD_DEN > this.capacity * MAX_LOAD_NUM) this.grow()
    const i = this.slotOf(m, hi, lo)
    if (i >= 0) {
      this.slots[i * WIDTH + 3] = canonHi
      this.slots[i * WIDTH + 4] = canonLo
      return
    }
    const at = (-1 - i) * WIDTH
    const slots = this.slots
    slots[at] = hi
    slots[at + 1] = lo
    slots[at + 2] = m + 1
    slots[at + 3] = canonHi
    slots[at + 4] = canonLo
    this.count++
    this.perMember[m]!++
  }

  /**
   * Removes member `m`'s external hash, writing its canonical hash to `out[at, at + 1]`;
   * false when it was not mapped. `key` is the member's key, released with its last entry.
   */
  delete(key: string, m: number, hi: number, lo: number, out: Uint32Array, at: number): boolean {
    if (m < 0) return false
    const i = this.slotOf(m, hi, lo)
    if (i < 0) return false
    out[at] = this.slots[i * WIDTH + 3]!
    out[at + 1] = this.slots[i * WIDTH + 4]!
    this.deleteSlot(i)
    this.perMember[m]!--
    this.releaseIfEmpty(key, m)
    return true
  }

  /** Every `[extHi, extLo, canonHi, canonLo]` entry of member `m`, in table order. */
  entries(m: number): Uint32Array {
    const out = new Uint32Array(4 * this.entriesOf(m))
    if (out.length === 0) return out
    const slots = this.slots
    const tag = m + 1
    let k = 0
    for (let at = 0; at < slots.length; at += WIDTH) {
      if (slots[at + 2] !== tag) continue
      out[k++] = slots[at]!
      out[k++] = slots[at + 1]!
      out[k++] = slots[at + 3]!
      out[k++] = slots[at + 4]!
    }
    return out
  }

  /** Drops every entry of the member `key`. */
  clearMember(key: string): void {
    const m = this.memberIndex(key)
    if (m < 0) return
    const entries = this.entries(m)
    const scratch = new Uint32Array(2)
    for (let k = 0; k < entries.length; k += 4) this.delete(key, m, entries[k]!, entries[k + 1]!, scratch, 0)
  }

  private deleteSlot(slot: number): void {
    const slots = this.slots
    const mask = this.mask
    let hole = slot
    let j = slot
    for (;;) {
      j = (j + 1) & mask
      const at = j * WIDTH
      const tag = slots[at + 2]!
      if (tag === 0) break
      const home = mixKey(slots[at]!, slots[at + 1]!, tag) & mask
      // Move j back into the hole unless its home lies cyclically in (hole, j].
      const stays = hole <= j ? home > hole && home <= j : home > hole || home <= j
      if (stays) continue
      slots.copyWithin(hole * WIDTH, at, at + WIDTH)
      hole = j
    }
    slots.fill(0, hole * WIDTH, hole * WIDTH + WIDTH)
    this.count--
  }

  private grow(): void {
    const old = this.slots
    this.capacity *= 2
    this.mask = this.capacity - 1
    this.slots = new Uint32Array(this.capacity * WIDTH)
    const slots = this.slots
    for (let at = 0; at < old.length; at += WIDTH) {
      const tag = old[at + 2]!
      if (tag === 0) continue
      let i = mixKey(old[at]!, old[at + 1]!, tag) & this.mask
      while (slots[i * WIDTH + 2] !== 0) i = (i + 1) & this.mask
      slots.set(old.subarray(at, at + WIDTH), i * WIDTH)
    }
  }
}
