/**
 * The CBI1 body checksum (unseeded XXH3-64, low half) at memory speed: inputs past 240 bytes go to
 * a small WebAssembly SIMD module (`wasm/xxh3Long.wat`), shorter ones and hosts without
 * WebAssembly to the TypeScript `xxh3.ts`, which stays the oracle.
 *
 * The long path needs 32×32→64 multiplies; JavaScript has none and splits them into 16-bit
 * halves (~200 MB/s), while wasm SIMD does two per `i64x2.extmul_low_i32x4_u`. Wasm reads only
 * its own memory, so the input is copied in first, in cache-sized pieces (see `hashLong`).
 * Instantiation is synchronous and the module does no I/O.
 */

import { xxh3Hash, xxh3Low32 as xxh3Low32Ts } from "./xxh3.js"
import { XXH3_WASM_BASE64 } from "./xxh3Wasm.generated.js"

/** The part of the WebAssembly JS API used here: the project's lib (ES2022, no DOM) lacks it. */
interface WasmApi {
  readonly Module: new (bytes: Uint8Array) => object
  readonly Instance: new (module: object, imports: object) => { readonly exports: object }
}

interface Xxh3WasmExports {
  readonly memory: { readonly buffer: ArrayBuffer; grow(pages: number): number }
  readonly hashLong: (pointer: number, length: number) => number
}

/** Where the module reads its input (below it: the secret and the result slot). */
const INPUT_OFFSET = 256
/** Where the module leaves the full 64-bit result. */
const RESULT_OFFSET = 192
/** The shortest input the module hashes; XXH3's long path starts above 240 bytes. */
export const XXH3_WASM_MIN_LENGTH = 241
const PAGE_BYTES = 65_536

const decodeBase64 = (text: string): Uint8Array => Uint8Array.from(atob(text), (c) => c.charCodeAt(0))

const instantiate = (): Xxh3WasmExports | undefined => {
  try {
    const api = (globalThis as unknown as { readonly WebAssembly?: WasmApi }).WebAssembly
    if (typeof api !== "object") return undefined
    const module = new api.Module(decodeBase64(XXH3_WASM_BASE64))
    // The .wat fixes the exports' shapes, which the JS API cannot know.
    return new api.Instance(module, {}).exports as Xxh3WasmExports
  } catch {
    // No SIMD (or no WebAssembly at all): the TypeScript path serves every length.
    return undefined
  }
}

const wasm = instantiate()

/** Whether the WebAssembly path is in use on this host. */
export const xxh3WasmAvailable: boolean = wasm !== undefined

let memoryBytes = wasm === undefined ? new Uint8Array(0) : new Uint8Array(wasm.memory.buffer)

/** Grows the module's memory to hold `length` input bytes; false where the host refuses. */
const reserve = (exports: Xxh3WasmExports, length: number): boolean => {
  const needed = INPUT_OFFSET + length
  if (memoryBytes.byteLength < needed) {
    try {
      exports.memory.grow(Math.ceil((needed - exports.memory.buffer.byteLength) / PAGE_BYTES))
    } catch {
      return false
    }
  }
  // A grow detaches the old buffer, so the view is refreshed whenever the buffer changed.
  if (memoryBytes.buffer !== exports.memory.buffer) memoryBytes = new Uint8Array(exports.memory.buffer)
  return true
}

/**
 * Runs the module over `bytes[offset, offset + length)`, `length > 240`; the low half of the
 * hash, or undefined where memory cannot grow.
 */
const hashLongWasm = (
  exports: Xxh3WasmExports,
  bytes: Uint8Array,
  offset: number,
  length: number
): number | undefined => {
  if (!reserve(exports, length)) return undefined
  memoryBytes.set(bytes.subarray(offset, offset + length), INPUT_OFFSET)
  return exports.hashLong(INPUT_OFFSET, length) >>> 0
}

/** Low 32 bits of the unseeded XXH3-64 of a byte range: the CBI1 body checksum. */
export const xxh3Low32Fast = (bytes: Uint8Array, offset = 0, length = bytes.length - offset): number => {
  if (wasm !== undefined && length >= XXH3_WASM_MIN_LENGTH) {
    const low = hashLongWasm(wasm, bytes, offset, length)
    if (low !== undefined) return low
  }
  return xxh3Low32Ts(bytes, offset, length) >>> 0
}

/**
 * The unseeded XXH3-64 of a byte range as a bigint through the same dispatch as
 * `xxh3Low32Fast` (tests compare it against the TypeScript path and an independent library).
 */
export const xxh3HashFast = (bytes: Uint8Array, offset = 0, length = bytes.length - offset): bigint => {
  if (
    wasm !== undefined &&
    length >= XXH3_WASM_MIN_LENGTH &&
    hashLongWasm(wasm, bytes, offset, length) !== undefined
  ) {
    return new DataView(wasm.memory.buffer).getBigUint64(RESULT_OFFSET, true)
  }
  return xxh3Hash(bytes, 0n, offset, length)
}
