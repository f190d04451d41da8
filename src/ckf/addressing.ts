/**
 * CKF addressing: fingerprint and the two candidate buckets of a 64-bit block hash.
 *
 * `mixed = XXH3(LE8(h), seed)`; fingerprint = low 16 bits (0 → 1, since 0 marks an empty slot);
 * bucket A = bits 16.. of `mixed` under the bucket mask; bucket B = A xor delta(fp), where
 * delta(fp) = XXH3(LE2(fp), seed ^ GOLDEN) & mask, and 0 → 1 so that A ≠ B.
 */

import { GOLDEN } from "./splitmix.js"
import { hiOf, loOf } from "./u64.js"
import { Xxh3Seeded, xxh3U64Batch, xxh3U64Invert, xxhOut } from "./xxh3.js"

/** The addressing seed a CKF format uses when none is given. */
export const DEFAULT_SEED = 0x5dee_ce66_d1b5_4a33n
/**
 * What the seed is mixed with for the alternate-bucket hash, so it differs from the primary one.
 */
export const ALTERNATE_BUCKET_DOMAIN = GOLDEN
/** CBI1 and the consumer table never exceed 2^24 buckets. */
export const MAX_BUCKET_COUNT = 1 << 24

/** A block hash ready to address: its fingerprint and both buckets. */
export interface PreparedHash {
  readonly fingerprint: number
  readonly bucketA: number
  readonly bucketB: number
}

const deltaTables = new Map<string, Uint32Array>()

/**
 * Addressing of one format (seed, bucket count). The 65,536 bucket deltas are computed once per
 * format and shared, so `alternate` is a table lookup.
 */
export class CkfAddressing {
  readonly seed: bigint
  readonly bucketCount: number
  readonly mask: number
  private readonly hasher: Xxh3Seeded
  /** The seed's 8-byte-input bitflip. */
  private readonly bitflip: Uint32Array
  private readonly unmixScratch = new Uint32Array(2)
  /** `mixed` of the last `prepareHalves` as [hi, lo]. */
  readonly mixedOut = new Uint32Array(2)
  /** delta(fp) for every fingerprint; entry 0 is unused. */
  readonly delta: Uint32Array
  /** Outputs of the last `prepareHalves` call. */
  fp = 0
  a = 0
  b = 0

  constructor(seed: bigint, bucketCount: number) {
    if (!Number.isInteger(bucketCount) || bucketCount < 2 || bucketCount > MAX_BUCKET_COUNT) {
      throw new RangeError(`bucket count ${bucketCount} must be an integer in 2..=${MAX_BUCKET_COUNT}`)
    }
    if ((bucketCount & (bucketCount - 1)) !== 0) {
      throw new RangeError(`bucket count ${bucketCount} must be a power of two`)
    }
    this.seed = BigInt.asUintN(64, seed)
    this.bucketCount = bucketCount
    this.mask = bucketCount - 1
    this.hasher = new Xxh3Seeded(this.seed)
    this.bitflip = this.hasher.bitflip8
    const key = `${this.seed}:${bucketCount}`
    let table = deltaTables.get(key)
    if (table === undefined) {
      table = new Uint32Array(65536)
      const alt = new Xxh3Seeded(this.seed ^ ALTERNATE_BUCKET_DOMAIN)
      for (let fp = 1; fp < 65536; fp++) {
        alt.hashU16(fp)
        const d = xxhOut.lo & this.mask
        table[fp] = d === 0 ? 1 : d
      }
      if (deltaTables.size >= 32) deltaTables.clear()
      deltaTables.set(key, table)
    }
    this.delta = table
  }

  /** Prepare the hash (hi, lo); results in `this.fp`, `this.a`, `this.b`; `mixed` in `mixedOut`. */
  prepareHalves(hi: number, lo: number): void {
    const out = this.mixedOut
    out[0] = hi
    out[1] = lo
    xxh3U64Batch(this.bitflip, out, 0, 1, out, 0)
    this.prepareMixedAt(out, 0)
  }

  /**
   * `mixed = XXH3(LE8(h), seed)` of `count` hash pairs from `input[inOffset..]` into
   * `out[outOffset..]`, as [hi, lo] pairs: one call hashes a whole event or query.
   */
  mixBatch(input: Uint32Array, inOffset: number, count: number, out: Uint32Array, outOffset: number): void {
    xxh3U64Batch(this.bitflip, input, inOffset, count, out, outOffset)
  }

  /** Fingerprint and buckets of an already mixed hash `[keys[k], keys[k + 1]]` = [hi, lo]. */
  prepareMixedAt(keys: Uint32Array, k: number): void {
    const lo = keys[k + 1]!
    const fp = lo & 0xffff
    const f = fp === 0 ? 1 : fp
    // Bucket counts are ≤ 2^24, so bits 16..39 of `mixed` cover every mask.
    const a = ((lo >>> 16) | (keys[k]! << 16)) & this.mask
    this.fp = f
    this.a = a
    this.b = a ^ this.delta[f]!
  }

  /** The seed's 8-byte-input bitflip as [hi, lo] (for the global consumer's wasm probe). */
  get bitflip8(): Uint32Array {
    return this.bitflip
  }

  /** The block hash of a `mixed` value, in place on `v = [hi, lo]` (XXH3 of 8 bytes is a bijection). */
  unmix(v: Uint32Array): void {
    xxh3U64Invert(this.bitflip, v)
  }

  /** `unmix` of every `[hi, lo]` pair of `pairs`, in place; returns `pairs`. */
  unmixPairs(pairs: Uint32Array): Uint32Array {
    const v = this.unmixScratch
    for (let i = 0; i < pairs.length; i += 2) {
      v[0] = pairs[i]!
      v[1] = pairs[i + 1]!
      xxh3U64Invert(this.bitflip, v)
      pairs[i] = v[0]!
      pairs[i + 1] = v[1]!
    }
    return pairs
  }

  /** The other candidate bucket of a fingerprint stored in `bucket`. */
  alternate(bucket: number, fp: number): number {
    return bucket ^ this.delta[fp]!
  }

  /** XXH3 of the 8-byte little-endian hash as a bigint (test and diagnostic use). */
  mixed(hash: bigint): bigint {
    this.hasher.hashU64(hiOf(hash), loOf(hash))
    return (BigInt(xxhOut.hi) << 32n) | BigInt(xxhOut.lo)
  }

  prepare(hash: bigint): PreparedHash {
    const h = BigInt.asUintN(64, hash)
    this.prepareHalves(hiOf(h), loOf(h))
    return { fingerprint: this.fp, bucketA: this.a, bucketB: this.b }
  }
}

const addressingCache = new Map<string, CkfAddressing>()

/** `prepare(hash, bucketCount)` with the default seed: the public addressing entry point. */
export const prepare = (hash: bigint, bucketCount: number, seed: bigint = DEFAULT_SEED): PreparedHash => {
  const key = `${seed}:${bucketCount}`
  let addressing = addressingCache.get(key)
  if (addressing === undefined) {
    addressing = new CkfAddressing(seed, bucketCount)
    if (addressingCache.size >= 32) addressingCache.clear()
    addressingCache.set(key, addressing)
  }
  return addressing.prepare(hash)
}

/** Bucket delta of a fingerprint (test and diagnostic use). */
export const bucketDelta = (fp: number, bucketCount: number, seed: bigint = DEFAULT_SEED): number => {
  const alt = new Xxh3Seeded(BigInt.asUintN(64, seed) ^ ALTERNATE_BUCKET_DOMAIN)
  alt.hashU16(fp & 0xffff)
  const d = xxhOut.lo & (bucketCount - 1)
  return d === 0 ? 1 : d
}
