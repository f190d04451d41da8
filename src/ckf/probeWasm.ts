/**
 * The global consumer's prefix search on WebAssembly (`wasm/ckfProbe.wat`): the transposed table
 * lives in the module's memory; a query's hashes are copied in and one call returns every lane's
 * §8.2 depth. Per position the module addresses the block hash (XXH3 of 8 bytes, fingerprint,
 * buckets) and answers all 16 lanes at once with SIMD (`i16x8.eq` over the two 128-byte rows,
 * narrowed to one bit per lane); the lanes' searches run in lock-step so that the rows of the
 * positions one phase needs are loaded together. `global.ts` keeps its TypeScript search for
 * hosts without WebAssembly SIMD and for queries longer than `PROBE_MAX_POSITIONS`.
 *
 * One instance per indexer: the memory holds that indexer's table, so it is grown once, to the
 * table's full size, and never again (a growth would detach every view of it).
 */

import { ALTERNATE_BUCKET_DOMAIN, type CkfAddressing } from "./addressing.js"
import { CKF_PROBE_WASM_BASE64 } from "./ckfProbeWasm.generated.js"
import { CKF_LANE_COUNT } from "./config.js"
import { instantiateWasm } from "./internal/wasm.js"

interface CkfProbeExports {
  readonly memory: { readonly buffer: ArrayBuffer; grow(pages: number): number }
  readonly init: (
    bitflipHi: number,
    bitflipLo: number,
    mask: number,
    bitflip2Hi: number,
    bitflip2Lo: number
  ) => void
  readonly probeAt: (pos: number) => number
  readonly search: (n: number, captured: number, window: number) => number
}

/** Longest query the module's scratch holds. */
export const PROBE_MAX_POSITIONS = 16_384
/** LE32(secret, 0) ^ LE32(secret, 4) of XXH3's default secret. */
const SECRET_0_XOR_4 = BigInt((0x396c_feb8 ^ 0xbe4b_a423) >>> 0)
// Byte offsets of ckfProbe.wat's memory layout.
const INPUT = 66_560
const DEPTHS = 197_824
const COUNTERS = 197_888
const TABLE = 262_144
/** u32s per transposed row. */
const ROW_U32 = CKF_LANE_COUNT * 2

/** Lets tests run the TypeScript path on a host that has WebAssembly. */
let disabled = false

/** Test hook: while set, new indexers use the TypeScript search. */
export const disableProbeWasm = (value: boolean): void => {
  disabled = value
}

/** The prefix probe compiled to WebAssembly SIMD, over a transposed table in its memory. */
export class CkfProbeWasm {
  /** The table's words (`TransposedCkfTable.words`), a view of the module's memory. */
  readonly words: Uint32Array
  /** Every lane's depth after `search` (0 outside the captured lanes that hit position 0). */
  readonly depths: Uint32Array
  /**
   * The last search's counters: positions probed, lane tests, left-edge lanes, activated lanes,
   * provenance skips (the `PrefixSearchStats` of `GlobalCkfIndexer.findPrefixMatches`).
   */
  readonly counters: Uint32Array
  private readonly input: Uint32Array
  private readonly exports: CkfProbeExports

  private constructor(exports: CkfProbeExports, bucketCount: number) {
    const buffer = exports.memory.buffer
    this.exports = exports
    this.words = new Uint32Array(buffer, TABLE, bucketCount * ROW_U32)
    this.depths = new Uint32Array(buffer, DEPTHS, CKF_LANE_COUNT)
    this.counters = new Uint32Array(buffer, COUNTERS, 5)
    this.input = new Uint32Array(buffer, INPUT, 2 * PROBE_MAX_POSITIONS)
  }

  /**
   * A module for the table of `addressing`'s format, or `undefined` where WebAssembly SIMD is
   * unavailable or the memory cannot be had.
   */
  static make(addressing: CkfAddressing): CkfProbeWasm | undefined {
    if (disabled) return undefined
    const bucketCount = addressing.bucketCount
    const exports = instantiateWasm<CkfProbeExports>(CKF_PROBE_WASM_BASE64, TABLE + bucketCount * ROW_U32 * 4)
    if (exports === undefined) return undefined
    const bitflip = addressing.bitflip8
    // XXH3's 1..3-byte bitflip of the alternate-bucket seed: (LE32(secret, 0) ^ LE32(secret, 4)) + seed.
    const bitflip2 = BigInt.asUintN(64, SECRET_0_XOR_4 + (addressing.seed ^ ALTERNATE_BUCKET_DOMAIN))
    exports.init(
      bitflip[0]!,
      bitflip[1]!,
      addressing.mask,
      Number(bitflip2 >> 32n),
      Number(bitflip2 & 0xffff_ffffn)
    )
    return new CkfProbeWasm(exports, bucketCount)
  }

  /**
   * Every lane of `captured`'s depth (into `depths`) for the first `n` hash pairs of `hashes`
   * (`1 ≤ n ≤ PROBE_MAX_POSITIONS`) under verification window `window`; returns the lanes that
   * hit position 0.
   */
  search(hashes: Uint32Array, n: number, captured: number, window: number): number {
    this.input.set(2 * n === hashes.length ? hashes : hashes.subarray(0, 2 * n))
    return this.exports.search(n, captured, window)
  }

  /** The lanes' hit mask of the block hash `[hi, lo]` (the wasm counterpart of `probe`; tests). */
  probeHash(hi: number, lo: number): number {
    this.input[0] = hi
    this.input[1] = lo
    return this.exports.probeAt(0)
  }
}
