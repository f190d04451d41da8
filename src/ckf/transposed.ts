/**
 * `TransposedCkfTable`: the consumer's storage of 16 CKF lanes in one buffer.
 *
 * Words are bucket-major, lane-minor (`index = bucket * 16 + lane`) so that one probe reads the
 * two 128-byte rows of buckets `a` and `b` and answers for every lane at once. The table is
 * always sized for 16 lanes, whatever number is configured. Each u64 word is stored as its
 * little-endian halves `[lo, hi]` in a `Uint32Array`, the same layout as producer snapshots.
 *
 * Ready-masking is not applied here; the search applies the captured ready mask.
 */

import { CKF_LANE_COUNT } from "./config.js"
import { toBigInt } from "./u64.js"

/** u32 slots per bucket row: 16 lanes × 2 halves. */
const ROW_U32 = CKF_LANE_COUNT * 2
const REP16 = 0x0001_0001
const HIGH16 = 0x8000_8000

/** The global CKF's buckets laid out lane-interleaved, so one probe reads all 16 lanes. */
export class TransposedCkfTable {
  readonly bucketCount: number
  /** Word (bucket, lane) is `[words[2i], words[2i + 1]]` = `[lo, hi]` with `i = bucket * 16 + lane`. */
  readonly words: Uint32Array

  /**
   * Throws `RangeError` when the buffer cannot be allocated. `storage` (zeroed, exactly
   * `bucketCount * 32` u32s) is used instead of a fresh buffer: the wasm probe's memory.
   */
  constructor(bucketCount: number, storage?: Uint32Array) {
    if (!Number.isInteger(bucketCount) || bucketCount < 1) {
      throw new RangeError(`bucket count ${bucketCount} must be a positive integer`)
    }
    if (storage !== undefined && storage.length !== bucketCount * ROW_U32) {
      throw new RangeError(`table storage has ${storage.length} words, expected ${bucketCount * ROW_U32}`)
    }
    this.bucketCount = bucketCount
    this.words = storage ?? new Uint32Array(bucketCount * ROW_U32)
  }

  /**
   * Lanes whose bucket `a` or `b` holds `fp` in any slot, as a u16 mask (bit `lane`).
   *
   * Each u32 half of a word holds two 16-bit slots of the same lane, so the SWAR "has a zero
   * half-word" test on `half ^ (fp * 0x00010001)` is exact per half: a borrow can only start in a
   * half-word that is already zero, and the borrow out of the top half-word is discarded by the
   * 32-bit wrap. `fp` is never 0, so an empty word never matches.
   */
  probe(fp: number, a: number, b: number): number {
    const t = this.words
    const rep = (fp << 16) | fp
    let i = a * ROW_U32
    let j = b * ROW_U32
    let mask = 0
    for (let lane = 0; lane < CKF_LANE_COUNT; lane++) {
      const x0 = t[i]! ^ rep
      const x1 = t[i + 1]! ^ rep
      const y0 = t[j]! ^ rep
      const y1 = t[j + 1]! ^ rep
      if (
        ((((x0 - REP16) & ~x0) | ((x1 - REP16) & ~x1) | ((y0 - REP16) & ~y0) | ((y1 - REP16) & ~y1)) &
          HIGH16) !==
        0
      ) {
        mask |= 1 << lane
      }
      i += 2
      j += 2
    }
    return mask
  }

  /** Store one absolute bucket image; a single word, not atomic across buckets. */
  writeWord(bucket: number, lane: number, lo: number, hi: number): void {
    const i = bucket * ROW_U32 + lane * 2
    this.words[i] = lo
    this.words[i + 1] = hi
  }

  /** Store every bucket of a lane from `[lo, hi]` pairs (the snapshot layout). */
  installLane(lane: number, words: Uint32Array): void {
    if (words.length !== this.bucketCount * 2) {
      throw new RangeError(`lane image has ${words.length / 2} buckets, expected ${this.bucketCount}`)
    }
    const t = this.words
    let i = lane * 2
    for (let bucket = 0; bucket < this.bucketCount; bucket++) {
      t[i] = words[2 * bucket]!
      t[i + 1] = words[2 * bucket + 1]!
      i += ROW_U32
    }
  }

  clearLane(lane: number): void {
    const t = this.words
    let i = lane * 2
    for (let bucket = 0; bucket < this.bucketCount; bucket++) {
      t[i] = 0
      t[i + 1] = 0
      i += ROW_U32
    }
  }

  /** A copy of one lane as `[lo, hi]` pairs, comparable with `DcCkfState.snapshotWords()`. */
  copyLane(lane: number): Uint32Array {
    const out = new Uint32Array(this.bucketCount * 2)
    const t = this.words
    let i = lane * 2
    for (let bucket = 0; bucket < this.bucketCount; bucket++) {
      out[2 * bucket] = t[i]!
      out[2 * bucket + 1] = t[i + 1]!
      i += ROW_U32
    }
    return out
  }

  wordAt(bucket: number, lane: number): bigint {
    const i = bucket * ROW_U32 + lane * 2
    return toBigInt(this.words[i + 1]!, this.words[i]!)
  }
}
