/**
 * SplitMix64 in 32-bit limbs: the producer's kick RNG and the consumer's lane → worker mapping.
 */

import { mulLow64Into } from "./u64.js"

const TWO_32 = 4294967296
/** The 64-bit golden-ratio constant of SplitMix64. */
export const GOLDEN = 0x9e37_79b9_7f4a_7c15n
const GOLDEN_HI = 0x9e3779b9
const GOLDEN_LO = 0x7f4a7c15
const C1_HI = 0xbf58476d
const C1_LO = 0x1ce4e5b9
const C2_HI = 0x94d049bb
const C2_LO = 0x133111eb

/** The SplitMix64 finaliser (no increment) applied in place to `v = [hi, lo]`. */
export const mix64 = (v: Uint32Array): void => {
  let hi = v[0]!
  let lo = v[1]!
  // v ^= v >> 30
  lo = (lo ^ ((lo >>> 30) | (hi << 2))) >>> 0
  hi = (hi ^ (hi >>> 30)) >>> 0
  mulLow64Into(hi, lo, C1_HI, C1_LO, v)
  hi = v[0]!
  lo = v[1]!
  // v ^= v >> 27
  lo = (lo ^ ((lo >>> 27) | (hi << 5))) >>> 0
  hi = (hi ^ (hi >>> 27)) >>> 0
  mulLow64Into(hi, lo, C2_HI, C2_LO, v)
  hi = v[0]!
  lo = v[1]!
  // v ^= v >> 31
  v[1] = lo ^ ((lo >>> 31) | (hi << 1))
  v[0] = hi ^ (hi >>> 31)
}

/**
 * SplitMix64 generator whose state is two u32 halves. `next()` advances the state and returns the
 * low 32 bits of the output; `lastHi` holds the high 32 bits of that output.
 */
export class SplitMix64 {
  private readonly state = new Uint32Array(2)
  private readonly scratch = new Uint32Array(2)
  lastHi = 0

  constructor(seed: bigint) {
    this.reset(seed)
  }

  reset(seed: bigint): void {
    const s = BigInt.asUintN(64, seed)
    this.state[0] = Number(s >> 32n)
    this.state[1] = Number(s & 0xffff_ffffn)
  }

  get stateValue(): bigint {
    return (BigInt(this.state[0]!) << 32n) | BigInt(this.state[1]!)
  }

  next(): number {
    const sum = this.state[1]! + GOLDEN_LO
    this.state[1] = sum
    this.state[0] = this.state[0]! + GOLDEN_HI + (sum >= TWO_32 ? 1 : 0)
    this.scratch[0] = this.state[0]!
    this.scratch[1] = this.state[1]!
    mix64(this.scratch)
    this.lastHi = this.scratch[0]!
    return this.scratch[1]!
  }

  /** Full 64-bit output of the next draw (edge and test use). */
  nextBigInt(): bigint {
    const lo = this.next()
    return (BigInt(this.lastHi) << 32n) | BigInt(lo)
  }
}

/** `lane_rng_seed(seed, lane)`: the first output of SplitMix64 seeded with `seed ^ ((lane+1)·GOLDEN)`. */
export const laneRngSeed = (seed: bigint, lane: number): bigint =>
  new SplitMix64(BigInt.asUintN(64, seed) ^ BigInt.asUintN(64, BigInt(lane + 1) * GOLDEN)).nextBigInt()

/**
 * `sticky_worker(consumer, lane, n)`: the lane-sticky ingestion worker of a consumer lane,
 * `mix64(consumer ^ lane·GOLDEN) mod n`.
 */
export const stickyWorker = (consumer: bigint, lane: number, workers: number): number => {
  const v = BigInt.asUintN(64, BigInt.asUintN(64, consumer) ^ BigInt.asUintN(64, BigInt(lane) * GOLDEN))
  const limbs = new Uint32Array([Number(v >> 32n), Number(v & 0xffff_ffffn)])
  mix64(limbs)
  return Number(((BigInt(limbs[0]!) << 32n) | BigInt(limbs[1]!)) % BigInt(workers))
}
