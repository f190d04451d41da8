/**
 * XXH3-64 (default 192-byte secret) in 32-bit limb arithmetic.
 *
 * The addressing hot paths use the specialised 2-, 8- and 16-byte forms of `Xxh3Seeded`, whose
 * seed-dependent bitflips are computed once. `xxh3Hash` covers every input length; it serves the
 * CBI1 body checksum (unseeded, up to 4 MiB) and the tests. Results are returned through the
 * shared `xxhOut` holder so that no hot call allocates.
 *
 * Length: every input length of XXH3-64 has its own unrolled path in 32-bit limbs; they are kept
 * together so that they can be read against the reference algorithm section by section.
 */

import { mulLow64Into } from "./u64.js"

const TWO_32 = 4294967296

/** Result holder of the last hash: high and low 32-bit halves of the u64. */
export const xxhOut = { hi: 0, lo: 0 }

// High word of the last limb operation; limb helpers return the low word and leave the high word here.
let mH = 0

/** Full 32×32 → 64-bit product; returns the low word, high word in `mH`. */
// Repeats `mulLow64Into`'s low product (u64.ts) on purpose: the hashers' limb helpers must stay
// small enough to inline on the hashing hot path, and keep their high word in a local.
const mul32 = (a: number, b: number): number => {
  const a0 = a & 0xffff
  const a1 = a >>> 16
  const b0 = b & 0xffff
  const b1 = b >>> 16
  const p00 = a0 * b0
  const p01 = a0 * b1
  const p10 = a1 * b0
  const mid = (p00 >>> 16) + (p01 & 0xffff) + (p10 & 0xffff)
  mH = (a1 * b1 + (p01 >>> 16) + (p10 >>> 16) + (mid >>> 16)) >>> 0
  return ((mid << 16) | (p00 & 0xffff)) >>> 0
}

/** 64×64 → low 64 bits; returns the low word, high word in `mH`. */
const mul64 = (ah: number, al: number, bh: number, bl: number): number => {
  const lo = mul32(al, bl)
  mH = (mH + Math.imul(ah, bl) + Math.imul(al, bh)) >>> 0
  return lo
}

/** Low 64 bits XOR high 64 bits of the 128-bit product; returns the low word, high word in `mH`. */
const mul128Fold = (ah: number, al: number, bh: number, bl: number): number => {
  const ll = mul32(al, bl)
  const llH = mH
  const lh = mul32(al, bh)
  const lhH = mH
  const hl = mul32(ah, bl)
  const hlH = mH
  const hh = mul32(ah, bh)
  const hhH = mH
  const t1 = llH + lh + hl
  const r1 = t1 >>> 0
  const t2 = lhH + hlH + hh + (t1 - r1) / TWO_32
  const r2 = t2 >>> 0
  const r3 = (hhH + (t2 - r2) / TWO_32) >>> 0
  mH = (r1 ^ r3) >>> 0
  return (ll ^ r2) >>> 0
}

const bswap32 = (x: number): number =>
  (((x & 0xff) << 24) | ((x & 0xff00) << 8) | ((x >>> 8) & 0xff00) | (x >>> 24)) >>> 0

// ---------------------------------------------------------------------------------------------
// Secret and constants

const SECRET_HEX =
  "b8fe6c3923a44bbe7c01812cf721ad1cded46de9839097db7240a4a4b7b3671f" +
  "cb79e64eccc0e578825ad07dccff7221b8084674f743248ee03590e6813a264c" +
  "3c2852bb91c300cb88d0658b1b532ea371644897a20df94e3819ef46a9deacd8" +
  "a8fa763fe39c343ff9dcbbc7c70b4f1d8a51e04bcdb45931c89f7ec9d9787364" +
  "eac5ac8334d3ebc3c581a0fffa1363eb170ddd51b7f0da49d316552629d4689e" +
  "2b16be587d47a1fc8ff8b8d17ad031ce45cb3a8f95160428afd7fbcabb4b407e"

const SECRET_SIZE = 192
const SECRET = new Uint8Array(SECRET_SIZE)
for (let i = 0; i < SECRET_SIZE; i++) SECRET[i] = Number.parseInt(SECRET_HEX.slice(2 * i, 2 * i + 2), 16)
const SECRET_VIEW = new DataView(SECRET.buffer)
const s32 = (o: number): number => SECRET_VIEW.getUint32(o, true)

const P32_1 = 0x9e3779b1
const P32_2 = 0x85ebca77
const P32_3 = 0xc2b2ae3d
const P64_1_H = 0x9e3779b1
const P64_1_L = 0x85ebca87
const P64_2_H = 0xc2b2ae3d
const P64_2_L = 0x27d4eb4f
const P64_3_H = 0x165667b1
const P64_3_L = 0x9e3779f9
const P64_4_H = 0x85ebca77
const P64_4_L = 0xc2b2ae63
const P64_5_H = 0x27d4eb2f
const P64_5_L = 0x165667c5
const MX1_H = 0x16566791
const MX1_L = 0x9e3779f9
const MX2_H = 0x9fb21c65
const MX2_L = 0x1e98df25

/** XXH64's avalanche over (hi, lo); result in `xxhOut`. */
const xxh64Avalanche = (hi: number, lo: number): void => {
  lo = (lo ^ (hi >>> 1)) >>> 0
  lo = mul64(hi, lo, P64_2_H, P64_2_L)
  hi = mH
  lo = (lo ^ ((lo >>> 29) | (hi << 3))) >>> 0
  hi = (hi ^ (hi >>> 29)) >>> 0
  lo = mul64(hi, lo, P64_3_H, P64_3_L)
  hi = mH
  xxhOut.hi = hi
  xxhOut.lo = (lo ^ hi) >>> 0
}

/** XXH3's avalanche over (hi, lo); result in `xxhOut`. */
const xxh3Avalanche = (hi: number, lo: number): void => {
  lo = (lo ^ (hi >>> 5)) >>> 0
  lo = mul64(hi, lo, MX1_H, MX1_L)
  hi = mH
  xxhOut.hi = hi
  xxhOut.lo = (lo ^ hi) >>> 0
}

/** rrmxmx finaliser of the 4..8-byte path; result in `xxhOut`. */
const rrmxmx = (hi: number, lo: number, len: number): void => {
  // h ^= rotl(h, 49) ^ rotl(h, 24)
  const r49h = (lo << 17) | (hi >>> 15)
  const r49l = (hi << 17) | (lo >>> 15)
  const r24h = (hi << 24) | (lo >>> 8)
  const r24l = (lo << 24) | (hi >>> 8)
  hi = (hi ^ r49h ^ r24h) >>> 0
  lo = (lo ^ r49l ^ r24l) >>> 0
  lo = mul64(hi, lo, MX2_H, MX2_L)
  hi = mH
  lo = (lo ^ ((hi >>> 3) + len)) >>> 0
  lo = mul64(hi, lo, MX2_H, MX2_L)
  hi = mH
  xxhOut.lo = (lo ^ ((lo >>> 28) | (hi << 4))) >>> 0
  xxhOut.hi = (hi ^ (hi >>> 28)) >>> 0
}

// ---------------------------------------------------------------------------------------------
// Seeded fast paths

// rrmxmx multiplier split for the inlined 32×32 products below.
const MX2_L0 = MX2_L & 0xffff
const MX2_L1 = MX2_L >>> 16

/**
 * XXH3-64 of `count` u64s as 8 little-endian bytes each, for one seed: `input[inOffset + 2i]` and
 * `input[inOffset + 2i + 1]` are the (hi, lo) halves of value i, and its result is written as
 * (hi, lo) to `out[outOffset + 2i]`, `out[outOffset + 2i + 1]`. `bitflip` is the seed's [hi, lo]
 * 4..8-byte bitflip (`Xxh3Seeded.bitflip8`).
 *
 * This is `rrmxmx` written out with locals only, and it takes its values from arrays: the limb
 * helpers above hand their high word back through a module-level variable, and a u32 passed to or
 * returned from a call that is not inlined is boxed, so every non-Smi value crossing either
 * allocated a heap number. The loop keeps a batch (one event's blocks, a query's positions) inside
 * one call.
 */
export const xxh3U64Batch = (
  bitflip: Uint32Array,
  input: Uint32Array,
  inOffset: number,
  count: number,
  out: Uint32Array,
  outOffset: number
): void => {
  const bfHi = bitflip[0]!
  const bfLo = bitflip[1]!
  for (let i = 0; i < count; i++) {
    // input64 = in2 + (in1 << 32) with in1 = LE32(d, 0) = lo and in2 = LE32(d, 4) = hi
    let h = input[inOffset + 2 * i + 1]! ^ bfHi
    let l = input[inOffset + 2 * i]! ^ bfLo
    // h ^= rotl(h, 49) ^ rotl(h, 24)
    const r49h = (l << 17) | (h >>> 15)
    const r49l = (h << 17) | (l >>> 15)
    const r24h = (h << 24) | (l >>> 8)
    const r24l = (l << 24) | (h >>> 8)
    h ^= r49h ^ r24h
    l ^= r49l ^ r24l
    // h *= MX2 (low 64 bits; the 32×32 → 64 product of the low words in 16-bit pieces)
    let a0 = l & 0xffff
    let a1 = l >>> 16
    let p00 = Math.imul(a0, MX2_L0)
    let p01 = Math.imul(a0, MX2_L1)
    let p10 = Math.imul(a1, MX2_L0)
    let mid = (p00 >>> 16) + (p01 & 0xffff) + (p10 & 0xffff)
    h =
      (Math.imul(a1, MX2_L1) +
        (p01 >>> 16) +
        (p10 >>> 16) +
        (mid >>> 16) +
        Math.imul(h, MX2_L) +
        Math.imul(l, MX2_H)) |
      0
    l = (mid << 16) | (p00 & 0xffff)
    // h ^= (h >> 35) + len
    l ^= (h >>> 3) + 8
    // h *= MX2
    a0 = l & 0xffff
    a1 = l >>> 16
    p00 = Math.imul(a0, MX2_L0)
    p01 = Math.imul(a0, MX2_L1)
    p10 = Math.imul(a1, MX2_L0)
    mid = (p00 >>> 16) + (p01 & 0xffff) + (p10 & 0xffff)
    h =
      (Math.imul(a1, MX2_L1) +
        (p01 >>> 16) +
        (p10 >>> 16) +
        (mid >>> 16) +
        Math.imul(h, MX2_L) +
        Math.imul(l, MX2_H)) |
      0
    l = (mid << 16) | (p00 & 0xffff)
    // h ^= h >> 28
    out[outOffset + 2 * i + 1] = l ^ ((l >>> 28) | (h << 4))
    out[outOffset + 2 * i] = h ^ (h >>> 28)
  }
}

// Inverse of the rrmxmx multiplier modulo 2^64.
const MX2_INV_H = 0x02ab9c72
const MX2_INV_L = 0x0d1024ad

/** rotl((h, l), r) for 0 < r < 32 into `out` as [hi, lo]; callers compose larger rotations. */
const rotl64 = (h: number, l: number, r: number, out: Uint32Array): void => {
  if (r >= 32) {
    const t = h
    h = l
    l = t
    r -= 32
  }
  if (r === 0) {
    out[0] = h
    out[1] = l
    return
  }
  out[0] = (h << r) | (l >>> (32 - r))
  out[1] = (l << r) | (h >>> (32 - r))
}

const INV_SCRATCH = new Uint32Array(2)

/** x ^ rotl(x, r1) ^ rotl(x, r2) in place on `v = [hi, lo]`. */
const xorRotations = (v: Uint32Array, r1: number, r2: number): void => {
  const h = v[0]!
  const l = v[1]!
  rotl64(h, l, r1, INV_SCRATCH)
  let nh = h ^ INV_SCRATCH[0]!
  let nl = l ^ INV_SCRATCH[1]!
  rotl64(h, l, r2, INV_SCRATCH)
  nh ^= INV_SCRATCH[0]!
  nl ^= INV_SCRATCH[1]!
  v[0] = nh
  v[1] = nl
}

/**
 * The inverse of `xxh3U64Batch` for one value: XXH3-64 restricted to 8-byte inputs is a bijection
 * of u64 (every rrmxmx step is invertible), so tables keyed by `mixed` can give the block hash
 * back. `v = [hi, lo]` of `mixed` becomes [hi, lo] of the hash. Diagnostic and rebuild use only.
 */
export const xxh3U64Invert = (bitflip: Uint32Array, v: Uint32Array): void => {
  let h = v[0]!
  let l = v[1]!
  // h ^= h >> 28 is undone by h ^ (h >> 28) ^ (h >> 56)
  l = (l ^ ((l >>> 28) | (h << 4)) ^ (h >>> 24)) >>> 0
  h = (h ^ (h >>> 28)) >>> 0
  mulLow64Into(h, l, MX2_INV_H, MX2_INV_L, v)
  h = v[0]!
  // h ^= (h >> 35) + len leaves bits 30.. unchanged, and those are all that h >> 35 reads
  l = (v[1]! ^ ((h >>> 3) + 8)) >>> 0
  mulLow64Into(h, l, MX2_INV_H, MX2_INV_L, v)
  // L = 1 + R^49 + R^24 over GF(2)[R]/(R^64 + 1) has L^64 = 1, so L^-1 = L^63 = L·L^2·L^4·R^56
  xorRotations(v, 49, 24)
  xorRotations(v, 34, 48)
  xorRotations(v, 4, 32)
  rotl64(v[0]!, v[1]!, 56, v)
  // input64 = (lo << 32) | hi, xored with the bitflip
  const inH = (v[0]! ^ bitflip[0]!) >>> 0
  const inL = (v[1]! ^ bitflip[1]!) >>> 0
  v[0] = inL
  v[1] = inH
}

const U64_OUT = new Uint32Array(2)

/**
 * XXH3-64 specialised to one seed for the three input shapes the CKF needs: a 16-bit value as
 * 2 little-endian bytes, a u64 as 8 little-endian bytes, and two u64s as 16 bytes.
 */
export class Xxh3Seeded {
  readonly seedHi: number
  readonly seedLo: number
  private readonly bf2Hi: number
  private readonly bf2Lo: number
  /** The 4..8-byte bitflip as [hi, lo], for `xxh3U64Batch` and `xxh3U64Invert`. */
  readonly bitflip8: Uint32Array
  private readonly bf16aHi: number
  private readonly bf16aLo: number
  private readonly bf16bHi: number
  private readonly bf16bLo: number

  constructor(seed: bigint) {
    const s = BigInt.asUintN(64, seed)
    const seedHi = Number(s >> 32n)
    const seedLo = Number(s & 0xffff_ffffn)
    this.seedHi = seedHi
    this.seedLo = seedLo
    // len 1..3: (LE32(secret,0) ^ LE32(secret,4)) + seed
    let sum = ((s32(0) ^ s32(4)) >>> 0) + seedLo
    this.bf2Lo = sum >>> 0
    this.bf2Hi = (seedHi + (sum >= TWO_32 ? 1 : 0)) >>> 0
    // len 4..8: (LE64(secret,8) ^ LE64(secret,16)) - (seed ^ (bswap32(low32(seed)) << 32))
    const sH = (seedHi ^ bswap32(seedLo)) >>> 0
    const kL = (s32(8) ^ s32(16)) >>> 0
    const kH = (s32(12) ^ s32(20)) >>> 0
    let diff = kL - seedLo
    this.bitflip8 = new Uint32Array([(kH - sH - (diff < 0 ? 1 : 0)) >>> 0, diff >>> 0])
    // len 9..16: bf1 = (LE64(s,24) ^ LE64(s,32)) + seed, bf2 = (LE64(s,40) ^ LE64(s,48)) - seed
    const aL = (s32(24) ^ s32(32)) >>> 0
    const aH = (s32(28) ^ s32(36)) >>> 0
    sum = aL + seedLo
    this.bf16aLo = sum >>> 0
    this.bf16aHi = (aH + seedHi + (sum >= TWO_32 ? 1 : 0)) >>> 0
    const bL = (s32(40) ^ s32(48)) >>> 0
    const bH = (s32(44) ^ s32(52)) >>> 0
    diff = bL - seedLo
    this.bf16bLo = diff >>> 0
    this.bf16bHi = (bH - seedHi - (diff < 0 ? 1 : 0)) >>> 0
  }

  /** XXH3 of `value` (u16) as 2 little-endian bytes; result in `xxhOut`. */
  hashU16(value: number): void {
    const c1 = value & 0xff
    const c2 = (value >>> 8) & 0xff
    // c3 = d[len-1] = d[1] = c2 for len 2
    const combined = ((c1 << 16) | (c2 << 24) | c2 | (2 << 8)) >>> 0
    xxh64Avalanche(this.bf2Hi, (this.bf2Lo ^ combined) >>> 0)
  }

  /** XXH3 of the u64 (hi, lo) as 8 little-endian bytes; result in `xxhOut`. */
  hashU64(hi: number, lo: number): void {
    U64_OUT[0] = hi
    U64_OUT[1] = lo
    xxh3U64Batch(this.bitflip8, U64_OUT, 0, 1, U64_OUT, 0)
    xxhOut.hi = U64_OUT[0]!
    xxhOut.lo = U64_OUT[1]!
  }

  /** XXH3 of LE64(a) ‖ LE64(b) (16 bytes); result in `xxhOut`. */
  hashPair(aHi: number, aLo: number, bHi: number, bLo: number): void {
    const loH = (aHi ^ this.bf16aHi) >>> 0
    const loL = (aLo ^ this.bf16aLo) >>> 0
    const hiH = (bHi ^ this.bf16bHi) >>> 0
    const hiL = (bLo ^ this.bf16bLo) >>> 0
    // acc = 16 + bswap64(lo) + hi + fold64(lo * hi)
    const fL = mul128Fold(loH, loL, hiH, hiL)
    const fH = mH
    const sumL = 16 + bswap32(loH) + hiL + fL
    const aL = sumL >>> 0
    xxh3Avalanche((bswap32(loL) + hiH + fH + (sumL - aL) / TWO_32) >>> 0, aL)
  }

  /**
   * The sequence-hash chain over `local[from, from + count)` (pairs) into `out` at pair `at`:
   * each block's hash is `hashPair(previous, local)`, starting from the pair `parent[parentAt]`,
   * or from the first block's own local hash when `parent` is undefined.
   *
   * `hashPair` written out with locals only: its limb helpers hand the high word back through a
   * module-level variable, which boxes a heap number per product, and chaining a stored batch is
   * the hot path of canonical addressing. The 128-bit product is the same as the word path's,
   * written out again on purpose: as a shared function writing [hi, lo] to a typed array, both
   * ran at half the speed (8-block chains 0.5 → 0.9 µs, CPU time). The parent comes in a typed
   * array for the same reason: as two u32 arguments of this call, which is not inlined, it was
   * boxed into two heap numbers per stored batch.
   */
  // Same parameters as `sequenceHashesInto` (tokens.ts), which calls it: the hot path's signature.
  chainInto(
    local: Uint32Array,
    from: number,
    count: number,
    parent: Uint32Array | undefined,
    parentAt: number,
    out: Uint32Array,
    at: number
  ): void {
    let hi = 0
    let lo = 0
    let i = 0
    if (parent !== undefined) {
      hi = parent[2 * parentAt]!
      lo = parent[2 * parentAt + 1]!
    } else if (count > 0) {
      hi = local[2 * from]!
      lo = local[2 * from + 1]!
      out[2 * at] = hi
      out[2 * at + 1] = lo
      i = 1
    }
    const fold = FOLD
    for (; i < count; i++) {
      const ah = (hi ^ this.bf16aHi) >>> 0
      const al = (lo ^ this.bf16aLo) >>> 0
      const bh = (local[2 * (from + i)]! ^ this.bf16bHi) >>> 0
      const bl = (local[2 * (from + i) + 1]! ^ this.bf16bLo) >>> 0
      // 128-bit product of (ah:al) and (bh:bl) from four 32×32 products in 16-bit halves.
      const al0 = al & 0xffff
      const al1 = al >>> 16
      const ah0 = ah & 0xffff
      const ah1 = ah >>> 16
      const bl0 = bl & 0xffff
      const bl1 = bl >>> 16
      const bh0 = bh & 0xffff
      const bh1 = bh >>> 16
      let p00 = al0 * bl0
      let p01 = al0 * bl1
      let p10 = al1 * bl0
      let mid = (p00 >>> 16) + (p01 & 0xffff) + (p10 & 0xffff)
      const llH = al1 * bl1 + (p01 >>> 16) + (p10 >>> 16) + (mid >>> 16)
      const llL = ((mid << 16) | (p00 & 0xffff)) >>> 0
      p00 = al0 * bh0
      p01 = al0 * bh1
      p10 = al1 * bh0
      mid = (p00 >>> 16) + (p01 & 0xffff) + (p10 & 0xffff)
      const lhH = al1 * bh1 + (p01 >>> 16) + (p10 >>> 16) + (mid >>> 16)
      const lhL = ((mid << 16) | (p00 & 0xffff)) >>> 0
      p00 = ah0 * bl0
      p01 = ah0 * bl1
      p10 = ah1 * bl0
      mid = (p00 >>> 16) + (p01 & 0xffff) + (p10 & 0xffff)
      const hlH = ah1 * bl1 + (p01 >>> 16) + (p10 >>> 16) + (mid >>> 16)
      const hlL = ((mid << 16) | (p00 & 0xffff)) >>> 0
      p00 = ah0 * bh0
      p01 = ah0 * bh1
      p10 = ah1 * bh0
      mid = (p00 >>> 16) + (p01 & 0xffff) + (p10 & 0xffff)
      const hhH = ah1 * bh1 + (p01 >>> 16) + (p10 >>> 16) + (mid >>> 16)
      const hhL = ((mid << 16) | (p00 & 0xffff)) >>> 0
      const t1 = llH + lhL + hlL
      const r1 = t1 >>> 0
      const t2 = lhH + hlH + hhL + (t1 - r1) / TWO_32
      const r2 = t2 >>> 0
      const r3 = (hhH + (t2 - r2) / TWO_32) >>> 0
      const fL = (llL ^ r2) >>> 0
      const fH = (r1 ^ r3) >>> 0
      // acc = 16 + bswap64(a) + b + fold; then XXH3's avalanche.
      const sumL = 16 + bswap32(ah) + bl + fL
      const accL = sumL >>> 0
      const accH = (bswap32(al) + bh + fH + (sumL - accL) / TWO_32) >>> 0
      mulLow64Into(accH, (accL ^ (accH >>> 5)) >>> 0, MX1_H, MX1_L, fold)
      hi = fold[0]!
      lo = (fold[1]! ^ hi) >>> 0
      out[2 * (at + i)] = hi
      out[2 * (at + i) + 1] = lo
    }
  }
}

// ---------------------------------------------------------------------------------------------
// General path (all lengths)

let inView: DataView = SECRET_VIEW
let inBase = 0
const in32 = (o: number): number => inView.getUint32(inBase + o, true)

// Secret in use for the current hash: the default one, or a seed-derived one for long seeded inputs.
let secView: DataView = SECRET_VIEW
const sec32 = (o: number): number => secView.getUint32(o, true)

let accH = 0
let accL = 0
const accAdd = (h: number, l: number): void => {
  const s = accL + l
  accL = s >>> 0
  accH = (accH + h + (s >= TWO_32 ? 1 : 0)) >>> 0
}

/** mix16B(input + io, secret + so, seed): fold of the 128-bit product of the two keyed halves. */
const mix16B = (io: number, so: number, seedHi: number, seedLo: number): void => {
  // (LE64(sec) + seed)
  let s = sec32(so) + seedLo
  const kaL = s >>> 0
  const kaH = (sec32(so + 4) + seedHi + (s >= TWO_32 ? 1 : 0)) >>> 0
  // (LE64(sec + 8) - seed)
  s = sec32(so + 8) - seedLo
  const kbL = s >>> 0
  const kbH = (sec32(so + 12) - seedHi - (s < 0 ? 1 : 0)) >>> 0
  const l = mul128Fold(
    (in32(io + 4) ^ kaH) >>> 0,
    (in32(io) ^ kaL) >>> 0,
    (in32(io + 12) ^ kbH) >>> 0,
    (in32(io + 8) ^ kbL) >>> 0
  )
  accAdd(mH, l)
}

const hashLen0 = (seedHi: number, seedLo: number): void => {
  const kL = (s32(56) ^ s32(64)) >>> 0
  const kH = (s32(60) ^ s32(68)) >>> 0
  xxh64Avalanche((seedHi ^ kH) >>> 0, (seedLo ^ kL) >>> 0)
}

const hashLen1to3 = (bytes: Uint8Array, off: number, len: number, seedHi: number, seedLo: number): void => {
  const c1 = bytes[off]!
  const c2 = bytes[off + (len >>> 1)]!
  const c3 = bytes[off + len - 1]!
  const combined = ((c1 << 16) | (c2 << 24) | c3 | (len << 8)) >>> 0
  const sum = ((s32(0) ^ s32(4)) >>> 0) + seedLo
  const bfL = sum >>> 0
  const bfH = (seedHi + (sum >= TWO_32 ? 1 : 0)) >>> 0
  xxh64Avalanche(bfH, (bfL ^ combined) >>> 0)
}

const hashLen4to8 = (len: number, seedHi: number, seedLo: number): void => {
  const in1 = in32(0)
  const in2 = in32(len - 4)
  const sH = (seedHi ^ bswap32(seedLo)) >>> 0
  const kL = (s32(8) ^ s32(16)) >>> 0
  const kH = (s32(12) ^ s32(20)) >>> 0
  const d = kL - seedLo
  const bfL = d >>> 0
  const bfH = (kH - sH - (d < 0 ? 1 : 0)) >>> 0
  rrmxmx((in1 ^ bfH) >>> 0, (in2 ^ bfL) >>> 0, len)
}

const hashLen9to16 = (len: number, seedHi: number, seedLo: number): void => {
  let s = ((s32(24) ^ s32(32)) >>> 0) + seedLo
  const b1L = s >>> 0
  const b1H = (((s32(28) ^ s32(36)) >>> 0) + seedHi + (s >= TWO_32 ? 1 : 0)) >>> 0
  s = ((s32(40) ^ s32(48)) >>> 0) - seedLo
  const b2L = s >>> 0
  const b2H = (((s32(44) ^ s32(52)) >>> 0) - seedHi - (s < 0 ? 1 : 0)) >>> 0
  const loL = (in32(0) ^ b1L) >>> 0
  const loH = (in32(4) ^ b1H) >>> 0
  const hiL = (in32(len - 8) ^ b2L) >>> 0
  const hiH = (in32(len - 4) ^ b2H) >>> 0
  const fL = mul128Fold(loH, loL, hiH, hiL)
  const fH = mH
  const sumL = len + bswap32(loH) + hiL + fL
  const aL = sumL >>> 0
  const aH = (bswap32(loL) + hiH + fH + (sumL - aL) / TWO_32) >>> 0
  xxh3Avalanche(aH, aL)
}

const hashLen17to128 = (len: number, seedHi: number, seedLo: number): void => {
  accL = mul64(0, len, P64_1_H, P64_1_L)
  accH = mH
  if (len > 32) {
    if (len > 64) {
      if (len > 96) {
        mix16B(48, 96, seedHi, seedLo)
        mix16B(len - 64, 112, seedHi, seedLo)
      }
      mix16B(32, 64, seedHi, seedLo)
      mix16B(len - 48, 80, seedHi, seedLo)
    }
    mix16B(16, 32, seedHi, seedLo)
    mix16B(len - 32, 48, seedHi, seedLo)
  }
  mix16B(0, 0, seedHi, seedLo)
  mix16B(len - 16, 16, seedHi, seedLo)
  xxh3Avalanche(accH, accL)
}

const hashLen129to240 = (len: number, seedHi: number, seedLo: number): void => {
  accL = mul64(0, len, P64_1_H, P64_1_L)
  accH = mH
  const rounds = len >>> 4
  for (let i = 0; i < 8; i++) mix16B(16 * i, 16 * i, seedHi, seedLo)
  xxh3Avalanche(accH, accL)
  accH = xxhOut.hi
  accL = xxhOut.lo
  for (let i = 8; i < rounds; i++) mix16B(16 * i, 16 * (i - 8) + 3, seedHi, seedLo)
  mix16B(len - 16, 136 - 17, seedHi, seedLo)
  xxh3Avalanche(accH, accL)
}

// Eight 64-bit accumulators of the long path as [hi, lo] pairs.
const ACC = new Uint32Array(16)
const STRIPE_LEN = 64
const STRIPES_PER_BLOCK = (SECRET_SIZE - STRIPE_LEN) / 8
const BLOCK_LEN = STRIPE_LEN * STRIPES_PER_BLOCK

const accumulate512 = (io: number, so: number): void => {
  for (let i = 0; i < 8; i++) {
    const dL = in32(io + 8 * i)
    const dH = in32(io + 8 * i + 4)
    const kL = (dL ^ sec32(so + 8 * i)) >>> 0
    const kH = (dH ^ sec32(so + 8 * i + 4)) >>> 0
    // acc[i ^ 1] += data
    const j = (i ^ 1) << 1
    let s = ACC[j + 1]! + dL
    ACC[j + 1] = s
    ACC[j] = ACC[j]! + dH + (s >= TWO_32 ? 1 : 0)
    // acc[i] += lo32(key) * hi32(key)
    const pL = mul32(kL, kH)
    const k = i << 1
    s = ACC[k + 1]! + pL
    ACC[k + 1] = s
    ACC[k] = ACC[k]! + mH + (s >= TWO_32 ? 1 : 0)
  }
}

/**
 * `stripes` consecutive stripes from 32-bit word `w` of an aligned input, with the secret
 * advancing 8 bytes per stripe from word `sw`. The body of the checksum: everything stays in
 * locals and typed arrays (no module-level number writes, which would box), and the 32×32
 * multiply is split into 16-bit halves with `Math.imul`.
 */
const accumulateAligned = (
  input: Uint32Array,
  w: number,
  stripes: number,
  secret: Uint32Array,
  sw: number
): void => {
  const acc = ACC
  for (let s = 0; s < stripes; s++) {
    const iw = w + s * 16
    const kw = sw + s * 2
    for (let i = 0; i < 8; i++) {
      const dL = input[iw + 2 * i]!
      const dH = input[iw + 2 * i + 1]!
      const kL = dL ^ secret[kw + 2 * i]!
      const kH = dH ^ secret[kw + 2 * i + 1]!
      const j = (i ^ 1) << 1
      let sum = acc[j + 1]! + dL
      acc[j + 1] = sum
      acc[j] = acc[j]! + dH + (sum >= TWO_32 ? 1 : 0)
      const a0 = kL & 0xffff
      const a1 = kL >>> 16
      const b0 = kH & 0xffff
      const b1 = kH >>> 16
      const p00 = Math.imul(a0, b0)
      const p01 = Math.imul(a0, b1)
      const p10 = Math.imul(a1, b0)
      const mid = (p00 >>> 16) + (p01 & 0xffff) + (p10 & 0xffff)
      const lo = ((mid << 16) | (p00 & 0xffff)) >>> 0
      const hi = Math.imul(a1, b1) + (p01 >>> 16) + (p10 >>> 16) + (mid >>> 16)
      const k = i << 1
      sum = acc[k + 1]! + lo
      acc[k + 1] = sum
      acc[k] = acc[k]! + hi + (sum >= TWO_32 ? 1 : 0)
    }
  }
}

const scramble = (so: number): void => {
  for (let i = 0; i < 8; i++) {
    const k = i << 1
    let h = ACC[k]!
    let l = ACC[k + 1]!
    // acc ^= acc >> 47; acc ^= secret; acc *= PRIME32_1
    l = (l ^ (h >>> 15)) >>> 0
    h = (h ^ sec32(so + 8 * i + 4)) >>> 0
    l = (l ^ sec32(so + 8 * i)) >>> 0
    const lo = mul32(l, P32_1)
    ACC[k] = mH + Math.imul(h, P32_1)
    ACC[k + 1] = lo
  }
}

// The long path reads the input as 32-bit words when it is 4-byte aligned, else from a copy.
const EMPTY_WORDS = new Uint32Array(0)
let alignedInput: Uint32Array = EMPTY_WORDS
let alignedScratch = new Uint8Array(0)

const hashLong = (len: number): void => {
  ACC[0] = 0
  ACC[1] = P32_3
  ACC[2] = P64_1_H
  ACC[3] = P64_1_L
  ACC[4] = P64_2_H
  ACC[5] = P64_2_L
  ACC[6] = P64_3_H
  ACC[7] = P64_3_L
  ACC[8] = P64_4_H
  ACC[9] = P64_4_L
  ACC[10] = 0
  ACC[11] = P32_2
  ACC[12] = P64_5_H
  ACC[13] = P64_5_L
  ACC[14] = 0
  ACC[15] = P32_1
  const blocks = Math.floor((len - 1) / BLOCK_LEN)
  const input = alignedInput
  const secret = new Uint32Array(secView.buffer, secView.byteOffset, SECRET_SIZE >>> 2)
  for (let n = 0; n < blocks; n++) {
    accumulateAligned(input, (n * BLOCK_LEN) >>> 2, STRIPES_PER_BLOCK, secret, 0)
    scramble(SECRET_SIZE - STRIPE_LEN)
  }
  const stripes = Math.floor((len - 1 - BLOCK_LEN * blocks) / STRIPE_LEN)
  accumulateAligned(input, (blocks * BLOCK_LEN) >>> 2, stripes, secret, 0)
  // The last stripe ends at the input's end with the secret at an odd offset: unaligned reads.
  accumulate512(len - STRIPE_LEN, SECRET_SIZE - STRIPE_LEN - 7)
  // merge: start = len * PRIME64_1, then += mul128_fold64(acc[2i] ^ s, acc[2i+1] ^ s') for i < 4
  accL = mul64(0, len, P64_1_H, P64_1_L)
  accH = mH
  for (let i = 0; i < 4; i++) {
    const so = 11 + 16 * i
    const k = i << 2
    const l = mul128Fold(
      (ACC[k]! ^ sec32(so + 4)) >>> 0,
      (ACC[k + 1]! ^ sec32(so)) >>> 0,
      (ACC[k + 2]! ^ sec32(so + 12)) >>> 0,
      (ACC[k + 3]! ^ sec32(so + 8)) >>> 0
    )
    accAdd(mH, l)
  }
  xxh3Avalanche(accH, accL)
}

const seededSecrets = new Map<bigint, DataView>()
const secretForSeed = (seedHi: number, seedLo: number): DataView => {
  const key = (BigInt(seedHi) << 32n) | BigInt(seedLo)
  let view = seededSecrets.get(key)
  if (view === undefined) {
    view = new DataView(new ArrayBuffer(SECRET_SIZE))
    for (let i = 0; i < SECRET_SIZE; i += 16) {
      let s = s32(i) + seedLo
      view.setUint32(i, s >>> 0, true)
      view.setUint32(i + 4, (s32(i + 4) + seedHi + (s >= TWO_32 ? 1 : 0)) >>> 0, true)
      s = s32(i + 8) - seedLo
      view.setUint32(i + 8, s >>> 0, true)
      view.setUint32(i + 12, (s32(i + 12) - seedHi - (s < 0 ? 1 : 0)) >>> 0, true)
    }
    if (seededSecrets.size > 16) seededSecrets.clear()
    seededSecrets.set(key, view)
  }
  return view
}

// ---------------------------------------------------------------------------------------------
// Word inputs of 17..128 bytes (token blocks): no DataView, the secret as words

/** The default secret as little-endian u32 words (offsets of the 17..128 path are multiples of 4). */
const SECRET32 = new Uint32Array(SECRET_SIZE / 4)
for (let i = 0; i < SECRET32.length; i++) SECRET32[i] = SECRET_VIEW.getUint32(4 * i, true)

/** `mix16B` over words: input words `w[wi..wi+4)`, secret bytes from `so`. */
const mix16W = (w: Uint32Array, wi: number, so: number, seedHi: number, seedLo: number): void => {
  const sw = so >>> 2
  let s = SECRET32[sw]! + seedLo
  const kaL = s >>> 0
  const kaH = (SECRET32[sw + 1]! + seedHi + (s >= TWO_32 ? 1 : 0)) >>> 0
  s = SECRET32[sw + 2]! - seedLo
  const kbL = s >>> 0
  const kbH = (SECRET32[sw + 3]! - seedHi - (s < 0 ? 1 : 0)) >>> 0
  const l = mul128Fold(
    (w[wi + 1]! ^ kaH) >>> 0,
    (w[wi]! ^ kaL) >>> 0,
    (w[wi + 3]! ^ kbH) >>> 0,
    (w[wi + 2]! ^ kbL) >>> 0
  )
  accAdd(mH, l)
}

// ---------------------------------------------------------------------------------------------
// Token blocks: the 17..128-byte path over u32 words, written for the JIT

/**
 * The seeded keys of the 17..128-byte path, `(secret[so] + seed, secret[so + 8] - seed)` as
 * `[aLo, aHi, bLo, bHi]` for so = 0, 16, …, 112, for the last seed used: token hashing asks
 * with one seed (the base model's, or an adapter's) for a whole prompt.
 */
const WORD_KEYS = new Uint32Array(32)
let wordKeysHi = -1
let wordKeysLo = -1

const wordKeysFor = (seedHi: number, seedLo: number): void => {
  if (seedHi === wordKeysHi && seedLo === wordKeysLo) return
  for (let i = 0; i < 8; i++) {
    const sw = 4 * i
    let t = SECRET32[sw]! + seedLo
    WORD_KEYS[sw] = t >>> 0
    WORD_KEYS[sw + 1] = (SECRET32[sw + 1]! + seedHi + (t >= TWO_32 ? 1 : 0)) >>> 0
    t = SECRET32[sw + 2]! - seedLo
    WORD_KEYS[sw + 2] = t >>> 0
    WORD_KEYS[sw + 3] = (SECRET32[sw + 3]! - seedHi - (t < 0 ? 1 : 0)) >>> 0
  }
  wordKeysHi = seedHi
  wordKeysLo = seedLo
}

/** Products of the word path as [hi, lo]: a typed array, so no write boxes a number. */
const FOLD = new Uint32Array(2)

/**
 * XXH3-64 of 17..128 bytes given as `count` (5..32) little-endian u32 words
 * `words[start .. start + count)`, seeded with halves, into `out[2·at]` (hi) and `out[2·at + 1]`
 * (lo).
 */
export const xxh3Words17to128Into = (
  words: Uint32Array,
  start: number,
  count: number,
  seedHi: number,
  seedLo: number,
  out: Uint32Array,
  at: number
): void => {
  wordKeysFor(seedHi, seedLo)
  const len = 4 * count
  const end = start + count
  mulLow64Into(0, len, P64_1_H, P64_1_L, FOLD)
  // The accumulator stays in locals: module-level `let` numbers above 2^30 are boxed on every
  // write, which made the older path allocate per block.
  let accH = FOLD[0]!
  let accL = FOLD[1]!
  // Pairs of 16-byte mixes from both ends inwards: (start + 4i, keys 8i) and (end − 4 − 4i,
  // keys 8i + 4), one pair per started 32 bytes.
  const pairs = (len + 31) >>> 5
  for (let m = 0; m < 2 * pairs; m++) {
    const i = m >>> 1
    const wi = (m & 1) === 0 ? start + 4 * i : end - 4 - 4 * i
    const k = 8 * i + 4 * (m & 1)
    const al = (words[wi]! ^ WORD_KEYS[k]!) >>> 0
    const ah = (words[wi + 1]! ^ WORD_KEYS[k + 1]!) >>> 0
    const bl = (words[wi + 2]! ^ WORD_KEYS[k + 2]!) >>> 0
    const bh = (words[wi + 3]! ^ WORD_KEYS[k + 3]!) >>> 0
    // Hot path, repeated on purpose: the same product as `chainInto`'s, written in place (a shared
    // helper writing [hi, lo] ran at half the speed; see `chainInto`).
    // 128-bit product of (ah:al) and (bh:bl) from four 32×32 products in 16-bit halves.
    const al0 = al & 0xffff
    const al1 = al >>> 16
    const ah0 = ah & 0xffff
    const ah1 = ah >>> 16
    const bl0 = bl & 0xffff
    const bl1 = bl >>> 16
    const bh0 = bh & 0xffff
    const bh1 = bh >>> 16
    let p00 = al0 * bl0
    let p01 = al0 * bl1
    let p10 = al1 * bl0
    let mid = (p00 >>> 16) + (p01 & 0xffff) + (p10 & 0xffff)
    const llH = al1 * bl1 + (p01 >>> 16) + (p10 >>> 16) + (mid >>> 16)
    const llL = ((mid << 16) | (p00 & 0xffff)) >>> 0
    p00 = al0 * bh0
    p01 = al0 * bh1
    p10 = al1 * bh0
    mid = (p00 >>> 16) + (p01 & 0xffff) + (p10 & 0xffff)
    const lhH = al1 * bh1 + (p01 >>> 16) + (p10 >>> 16) + (mid >>> 16)
    const lhL = ((mid << 16) | (p00 & 0xffff)) >>> 0
    p00 = ah0 * bl0
    p01 = ah0 * bl1
    p10 = ah1 * bl0
    mid = (p00 >>> 16) + (p01 & 0xffff) + (p10 & 0xffff)
    const hlH = ah1 * bl1 + (p01 >>> 16) + (p10 >>> 16) + (mid >>> 16)
    const hlL = ((mid << 16) | (p00 & 0xffff)) >>> 0
    p00 = ah0 * bh0
    p01 = ah0 * bh1
    p10 = ah1 * bh0
    mid = (p00 >>> 16) + (p01 & 0xffff) + (p10 & 0xffff)
    const hhH = ah1 * bh1 + (p01 >>> 16) + (p10 >>> 16) + (mid >>> 16)
    const hhL = ((mid << 16) | (p00 & 0xffff)) >>> 0
    // Middle words summed with their carries; fold = low 64 XOR high 64, added to the accumulator.
    const t1 = llH + lhL + hlL
    const r1 = t1 >>> 0
    const t2 = lhH + hlH + hhL + (t1 - r1) / TWO_32
    const r2 = t2 >>> 0
    const r3 = (hhH + (t2 - r2) / TWO_32) >>> 0
    const sum = accL + ((llL ^ r2) >>> 0)
    accL = sum >>> 0
    accH = (accH + ((r1 ^ r3) >>> 0) + (sum - accL) / TWO_32) >>> 0
  }
  // Avalanche: h ^= h >> 37; h *= 0x165667919E3779F9; h ^= h >> 32.
  mulLow64Into(accH, (accL ^ (accH >>> 5)) >>> 0, MX1_H, MX1_L, FOLD)
  const h = FOLD[0]!
  out[2 * at] = h
  out[2 * at + 1] = FOLD[1]! ^ h
}

/**
 * XXH3-64 of the `count` little-endian u32 words `words[start .. start + count)`, seeded with
 * halves; result in `xxhOut`. Inputs of 17..128 bytes (5..32 words: token blocks of 5 to 32
 * tokens) take a word path with no DataView; others go through `xxh3Into`.
 */
export const xxh3WordsInto = (
  words: Uint32Array,
  start: number,
  count: number,
  seedHi: number,
  seedLo: number
): void => {
  const len = 4 * count
  if (len < 17 || len > 128) {
    xxh3Into(new Uint8Array(words.buffer, words.byteOffset + 4 * start, len), 0, len, seedHi, seedLo)
    return
  }
  const wEnd = start + count
  accL = mul64(0, len, P64_1_H, P64_1_L)
  accH = mH
  if (len > 32) {
    if (len > 64) {
      if (len > 96) {
        mix16W(words, start + 12, 96, seedHi, seedLo)
        mix16W(words, wEnd - 16, 112, seedHi, seedLo)
      }
      mix16W(words, start + 8, 64, seedHi, seedLo)
      mix16W(words, wEnd - 12, 80, seedHi, seedLo)
    }
    mix16W(words, start + 4, 32, seedHi, seedLo)
    mix16W(words, wEnd - 8, 48, seedHi, seedLo)
  }
  mix16W(words, start, 0, seedHi, seedLo)
  mix16W(words, wEnd - 4, 16, seedHi, seedLo)
  xxh3Avalanche(accH, accL)
}

/**
 * XXH3-64 of `bytes[offset .. offset + length)` with a seed given as halves; result in `xxhOut`.
 */
export const xxh3Into = (
  bytes: Uint8Array,
  offset = 0,
  length = bytes.length - offset,
  seedHi = 0,
  seedLo = 0
): void => {
  inView = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength)
  inBase = offset
  secView = SECRET_VIEW
  if (length === 0) hashLen0(seedHi, seedLo)
  else if (length <= 3) hashLen1to3(bytes, offset, length, seedHi, seedLo)
  else if (length <= 8) hashLen4to8(length, seedHi, seedLo)
  else if (length <= 16) hashLen9to16(length, seedHi, seedLo)
  else if (length <= 128) hashLen17to128(length, seedHi, seedLo)
  else if (length <= 240) hashLen129to240(length, seedHi, seedLo)
  else {
    if (seedHi !== 0 || seedLo !== 0) secView = secretForSeed(seedHi, seedLo)
    const start = bytes.byteOffset + offset
    if ((start & 3) === 0) alignedInput = new Uint32Array(bytes.buffer, start, length >>> 2)
    else {
      if (alignedScratch.length < length) alignedScratch = new Uint8Array(length)
      alignedScratch.set(bytes.subarray(offset, offset + length))
      alignedInput = new Uint32Array(alignedScratch.buffer, 0, length >>> 2)
    }
    hashLong(length)
    alignedInput = EMPTY_WORDS
  }
  secView = SECRET_VIEW
  inView = SECRET_VIEW
}

/** XXH3-64 of a byte range as a bigint (edge and test convenience). */
export const xxh3Hash = (
  bytes: Uint8Array,
  seed = 0n,
  offset = 0,
  length = bytes.length - offset
): bigint => {
  const s = BigInt.asUintN(64, seed)
  xxh3Into(bytes, offset, length, Number(s >> 32n), Number(s & 0xffff_ffffn))
  return (BigInt(xxhOut.hi) << 32n) | BigInt(xxhOut.lo)
}

/** Low 32 bits of the unseeded XXH3-64 of a byte range: the CBI1 body checksum. */
export const xxh3Low32 = (bytes: Uint8Array, offset = 0, length = bytes.length - offset): number => {
  xxh3Into(bytes, offset, length, 0, 0)
  return xxhOut.lo
}
