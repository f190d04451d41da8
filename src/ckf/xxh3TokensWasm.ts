/**
 * Canonical block addressing at native speed: the local hashes of token blocks and the
 * sequence-hash chain in a small WebAssembly module (`wasm/xxh3Tokens.wat`), with `xxh3.ts` as
 * the fallback where WebAssembly is unavailable and as the oracle.
 *
 * Both hashes need 64×64 → 128-bit products: JavaScript builds each from sixteen 16-bit pieces,
 * wasm from four `i64.mul`. A prompt's tokens or a batch's hashes are copied into the module's
 * memory in pieces of at most `MAX_BLOCKS` blocks, hashed in one call, and copied out; the memory
 * never grows after instantiation. Instantiation is synchronous and the module does no I/O.
 */

import { instantiateWasm } from "./internal/wasm.js"
import { XXH3_TOKENS_WASM_BASE64 } from "./xxh3TokensWasm.generated.js"

interface Xxh3TokensExports {
  readonly memory: { readonly buffer: ArrayBuffer; grow(pages: number): number }
  readonly setSeed: (hi: number, lo: number) => void
  readonly localHashes: (input: number, window: number, stride: number, blocks: number, out: number) => void
  readonly chain: (
    input: number,
    count: number,
    hasParent: number,
    parentHi: number,
    parentLo: number,
    seedHi: number,
    seedLo: number,
    out: number
  ) => void
}

/** Shortest and longest windows of the module's path: 17..128 bytes of u32 tokens. */
export const WASM_MIN_WINDOW = 5
/** Longest window of u32 tokens the module hashes. */
export const WASM_MAX_WINDOW = 32
/** Blocks per call: bounds the window the module's memory must hold. */
const MAX_BLOCKS = 1024
/** Byte offset of the input window; the hashes follow it. */
const INPUT = 1024
const INPUT_WORDS = MAX_BLOCKS * (WASM_MAX_WINDOW + 1)
const OUTPUT = INPUT + 4 * INPUT_WORDS
const MEMORY_BYTES = OUTPUT + 8 * MAX_BLOCKS

const wasm = instantiateWasm<Xxh3TokensExports>(XXH3_TOKENS_WASM_BASE64, MEMORY_BYTES)

/** Whether the WebAssembly path is in use on this host. */
export const xxh3TokensWasmAvailable: boolean = wasm !== undefined

// The memory never grows after instantiation, so one view serves every call.
const memory = wasm === undefined ? new Uint32Array(0) : new Uint32Array(wasm.memory.buffer)
let seedHi = -1
let seedLo = -1

/**
 * Local hashes of `blocks` windows of `window` (5..32) tokens, one every `stride` tokens, from
 * `tokens[from ..]`, seeded with halves, into `out` at pair `at`. False when the module is not
 * available (nothing written). Token ids must be u32 (callers validate).
 */
export const localHashesWasm = (
  tokens: ArrayLike<number>,
  from: number,
  blocks: number,
  window: number,
  stride: number,
  hi: number,
  lo: number,
  out: Uint32Array,
  at: number
): boolean => {
  if (wasm === undefined) return false
  if (hi !== seedHi || lo !== seedLo) {
    wasm.setSeed(hi, lo)
    seedHi = hi
    seedLo = lo
  }
  const base = INPUT >>> 2
  for (let done = 0; done < blocks; done += MAX_BLOCKS) {
    const n = Math.min(MAX_BLOCKS, blocks - done)
    const start = from + done * stride
    const words = (n - 1) * stride + window
    if (tokens instanceof Uint32Array) memory.set(tokens.subarray(start, start + words), base)
    else if (start === 0 && Array.isArray(tokens) && tokens.length <= INPUT_WORDS)
      // `set` from a packed array of numbers is V8's bulk copy, several times a loop's speed; the
      // tokens past the last full block come along and are not read.
      memory.set(tokens, base)
    else for (let i = 0; i < words; i++) memory[base + i] = tokens[start + i]!
    wasm.localHashes(INPUT, window, stride, n, OUTPUT)
    out.set(memory.subarray(OUTPUT >>> 2, (OUTPUT >>> 2) + 2 * n), 2 * (at + done))
  }
  return true
}

/**
 * The sequence-hash chain of `local[from, from + count)` (pairs) into `out` at pair `at`, from
 * the parent's hash (`hasParent`) or from the first local hash, with the chain seed as halves.
 * False when the module is not available (nothing written).
 */
export const chainWasm = (
  local: Uint32Array,
  from: number,
  count: number,
  hasParent: boolean,
  parentHi: number,
  parentLo: number,
  chainSeedHi: number,
  chainSeedLo: number,
  out: Uint32Array,
  at: number
): boolean => {
  if (wasm === undefined) return false
  const base = INPUT >>> 2
  let parent = hasParent
  let pHi = parentHi
  let pLo = parentLo
  for (let done = 0; done < count; done += MAX_BLOCKS) {
    const n = Math.min(MAX_BLOCKS, count - done)
    memory.set(local.subarray(2 * (from + done), 2 * (from + done + n)), base)
    wasm.chain(INPUT, n, parent ? 1 : 0, pHi, pLo, chainSeedHi, chainSeedLo, INPUT)
    out.set(memory.subarray(base, base + 2 * n), 2 * (at + done))
    // The next piece continues from this one's last hash.
    parent = true
    pHi = memory[base + 2 * n - 2]!
    pLo = memory[base + 2 * n - 1]!
  }
  return true
}
