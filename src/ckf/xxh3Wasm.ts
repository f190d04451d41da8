/**
 * The CBI1 body checksum (unseeded XXH3-64, low half) at memory speed: inputs past 240 bytes go to
 * a small WebAssembly SIMD module (`wasm/xxh3Long.wat`), shorter ones and hosts without
 * WebAssembly to the TypeScript `xxh3.ts`, which stays the oracle.
 *
 * The long path needs 32×32→64 multiplies; JavaScript has none and splits them into 16-bit
 * halves (~200 MB/s), while wasm SIMD does two per `i64x2.extmul_low_i32x4_u`. Wasm reads only
 * its own memory, so the input is copied in first, in cache-sized pieces (see `hashLongWasm`).
 * Instantiation is synchronous and the module does no I/O.
 */

import { instantiateWasm } from "./internal/wasm.js"
import { xxh3Hash, xxh3Low32 as xxh3Low32Ts } from "./xxh3.js"
import { XXH3_WASM_BASE64 } from "./xxh3Wasm.generated.js"

interface Xxh3WasmExports {
  readonly memory: { readonly buffer: ArrayBuffer; grow(pages: number): number }
  readonly reset: () => void
  readonly blocks: (pointer: number, count: number) => void
  readonly finish: (pointer: number, tail: number, total: number) => number
}

/** Where the module leaves the full 64-bit result. */
const RESULT_OFFSET = 192
/**
 * The input window: `[WINDOW_OFFSET - 64, WINDOW_OFFSET)` holds the bytes before a short last
 * block, `[WINDOW_OFFSET, + WINDOW_BYTES)` a piece of whole blocks or the last block.
 */
const WINDOW_OFFSET = 320
/**
 * Bytes hashed per copy into the module. Small enough that the piece is still in the core's
 * cache when the module reads it; a whole 4 MiB body copied at once goes out to L3 and back.
 */
const WINDOW_BYTES = 65_536
const BLOCK_BYTES = 1024
/** The shortest input the module hashes; XXH3's long path starts above 240 bytes. */
export const XXH3_WASM_MIN_LENGTH = 241

// No SIMD (or no WebAssembly at all): the TypeScript path serves every length.
const wasm = instantiateWasm<Xxh3WasmExports>(XXH3_WASM_BASE64, WINDOW_OFFSET + WINDOW_BYTES)

/** Whether the WebAssembly path is in use on this host. */
export const xxh3WasmAvailable: boolean = wasm !== undefined

// The memory never grows after instantiation, so one view serves every call.
const memoryBytes = wasm === undefined ? new Uint8Array(0) : new Uint8Array(wasm.memory.buffer)

/** The module over `bytes[offset, offset + length)`, `length > 240`: the low half of the hash. */
const hashLongWasm = (
  exports: Xxh3WasmExports,
  bytes: Uint8Array,
  offset: number,
  length: number
): number => {
  const end = offset + length
  // Every block but the one holding the final byte goes through the window in whole blocks.
  const tailStart = offset + Math.floor((length - 1) / BLOCK_BYTES) * BLOCK_BYTES
  exports.reset()
  for (let at = offset; at < tailStart; at += WINDOW_BYTES) {
    const pieceEnd = Math.min(at + WINDOW_BYTES, tailStart)
    memoryBytes.set(bytes.subarray(at, pieceEnd), WINDOW_OFFSET)
    exports.blocks(WINDOW_OFFSET, (pieceEnd - at) / BLOCK_BYTES)
  }
  const before = Math.min(64, tailStart - offset)
  memoryBytes.set(bytes.subarray(tailStart - before, end), WINDOW_OFFSET - before)
  return exports.finish(WINDOW_OFFSET, end - tailStart, length) >>> 0
}

/** Low 32 bits of the unseeded XXH3-64 of a byte range: the CBI1 body checksum. */
export const xxh3Low32Fast = (bytes: Uint8Array, offset = 0, length = bytes.length - offset): number => {
  if (wasm !== undefined && length >= XXH3_WASM_MIN_LENGTH) {
    return hashLongWasm(wasm, bytes, offset, length)
  }
  return xxh3Low32Ts(bytes, offset, length) >>> 0
}

/**
 * The unseeded XXH3-64 of a byte range as a bigint through the same dispatch as
 * `xxh3Low32Fast` (tests compare it against the TypeScript path and an independent library).
 */
export const xxh3HashFast = (bytes: Uint8Array, offset = 0, length = bytes.length - offset): bigint => {
  if (wasm !== undefined && length >= XXH3_WASM_MIN_LENGTH) {
    hashLongWasm(wasm, bytes, offset, length)
    return new DataView(wasm.memory.buffer).getBigUint64(RESULT_OFFSET, true)
  }
  return xxh3Hash(bytes, 0n, offset, length)
}
