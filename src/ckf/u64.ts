/**
 * Unsigned 64-bit values as two u32 halves.
 *
 * Hot paths carry a u64 as `(hi, lo)` numbers and batches of them as `Uint32Array` pairs laid out
 * `[hi0, lo0, hi1, lo1, …]` ("hash pairs"). `bigint` only appears at API edges (JSON, logs, tests).
 */

/** 2^64 − 1. */
export const U64_MAX = 0xffff_ffff_ffff_ffffn

/**
 * Low 64 bits of (ah, al) × (bh, bl) into `out` as [hi, lo]: the 32×32 → 64 product of the low
 * words in 16-bit pieces (exact in doubles), the cross terms with `Math.imul`.
 */
export const mulLow64Into = (ah: number, al: number, bh: number, bl: number, out: Uint32Array): void => {
  const a0 = al & 0xffff
  const a1 = al >>> 16
  const b0 = bl & 0xffff
  const b1 = bl >>> 16
  const p00 = a0 * b0
  const p01 = a0 * b1
  const p10 = a1 * b0
  const mid = (p00 >>> 16) + (p01 & 0xffff) + (p10 & 0xffff)
  out[0] = a1 * b1 + (p01 >>> 16) + (p10 >>> 16) + (mid >>> 16) + Math.imul(ah, bl) + Math.imul(al, bh)
  out[1] = (mid << 16) | (p00 & 0xffff)
}
const TWO_32 = 4294967296

/** High 32 bits of a u64 given as bigint. */
export const hiOf = (value: bigint): number => Number((value >> 32n) & 0xffff_ffffn)
/** Low 32 bits of a u64 given as bigint. */
export const loOf = (value: bigint): number => Number(value & 0xffff_ffffn)
/** Recombine halves into a bigint (edge use only). */
export const toBigInt = (hi: number, lo: number): bigint => (BigInt(hi >>> 0) << 32n) | BigInt(lo >>> 0)

/** True when the bigint is a valid u64. */
export const isU64 = (value: bigint): boolean => value >= 0n && value <= U64_MAX

/** Hash pairs from bigints; each value is reduced modulo 2^64 (signed inputs are reinterpreted). */
export const hashPairs = (values: ReadonlyArray<bigint | number>): Uint32Array => {
  const out = new Uint32Array(values.length * 2)
  for (let i = 0; i < values.length; i++) {
    const v = BigInt.asUintN(64, BigInt(values[i]!))
    out[2 * i] = hiOf(v)
    out[2 * i + 1] = loOf(v)
  }
  return out
}

/** Bigints from hash pairs (edge use only). */
export const hashPairsToBigInts = (pairs: Uint32Array): Array<bigint> => {
  const out: Array<bigint> = []
  for (let i = 0; i + 1 < pairs.length; i += 2) out.push(toBigInt(pairs[i]!, pairs[i + 1]!))
  return out
}

/** Lowercase hex, zero padded to 16 digits. */
export const hex16 = (value: bigint): string => value.toString(16).padStart(16, "0")

/**
 * A u64 from two halves as a JavaScript number when it is exactly representable (≤ 2^53), else -1.
 */
export const safeNumberOf = (hi: number, lo: number): number =>
  hi < 0x20_0000 ? hi * TWO_32 + lo : hi === 0x20_0000 && lo === 0 ? hi * TWO_32 : -1

/**
 * Canonical decimal text of a u64 given as halves, without BigInt when the value is ≤ 2^53.
 * Used for worker ids, which are carried as canonical decimal strings.
 */
export const decimalOf = (hi: number, lo: number): string => {
  const n = safeNumberOf(hi, lo)
  return n >= 0 ? String(n) : toBigInt(hi, lo).toString()
}

/**
 * Numeric order of two canonical decimal u64 strings (no leading zeros) without BigInt.
 */
export const compareDecimalU64 = (a: string, b: string): number =>
  a.length !== b.length ? a.length - b.length : a < b ? -1 : a > b ? 1 : 0
