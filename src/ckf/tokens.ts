/**
 * Canonical block addressing from tokens (PROTOCOL §3.3), as Dynamo's router hashes prompts:
 *
 * - the LOCAL hash of a block is XXH3-64 of its tokens as u32 little-endian, seeded with 1337,
 *   plus (wrapping) the XXH3-64 of the LoRA adapter's name (seed 0) when there is one, plus
 *   (wrapping) the XXH3-64 of the cache namespace (seed 1) when there is one: Dynamo's
 *   `compute_block_hash_for_seq` (`lib/kv-router/src/protocols.rs`, `block_hash_seed`) takes its
 *   seed from `dynamo_kv_hashing::compute_salt_hash(cache_namespace, lora_name)`
 *   (`lib/kv-hashing/src/salt.rs`), empty strings counting as absent. The namespace is vLLM's
 *   per-request `cache_salt` (the `cacheSalt` option; see `cacheNamespace.ts` for how a stored
 *   block's namespace is read from an engine's event);
 * - only full blocks are hashed: `dynamo_standard_v1` cuts `B`-token blocks, `dynamo_eagle_v1`
 *   hashes each block with the first token of the next one (`B + 1` tokens), so a block is full
 *   only once that token exists;
 * - the canonical SEQUENCE hash chains them: `seq[0] = local[0]` for a block with no parent,
 *   `seq[i] = XXH3-64(LE64(seq[i-1]) ‖ LE64(local[i]), 1337)` (`compute_next_seq_hash`).
 *
 * Plain synchronous code over typed arrays; hashes are `[hi, lo]` u32 pairs like everywhere in
 * the CKF core, with bigint helpers at the edges.
 */

import { toBigInt } from "./u64.js"
import { Xxh3Seeded, xxh3Hash, xxh3Words17to128Into, xxh3WordsInto, xxhOut } from "./xxh3.js"
import { chainWasm, localHashesWasm, WASM_MAX_WINDOW, WASM_MIN_WINDOW } from "./xxh3TokensWasm.js"

/** The seed of a block's tokens hash (Dynamo's `XXH3_SEED`). */
export const TOKENS_HASH_SEED = 1337n
/** The seed of the sequence-hash chain (Dynamo's `CHAIN_XXH3_SEED`, equal to `XXH3_SEED`). */
export const CHAIN_SEED = 1337n
/** The seed a LoRA adapter's name is hashed with before it is added to the tokens-hash seed. */
export const LORA_NAME_HASH_SEED = 0n
/**
 * The seed a cache namespace (cache salt) is hashed with before it is added to the tokens-hash
 * seed: 1, not the adapter's 0, so that a salt equal to an adapter's name salts differently.
 */
export const CACHE_NAMESPACE_HASH_SEED = 1n

/** The block hash formats (Dynamo's standard and EAGLE). */
export type HashFormat = "dynamo_standard_v1" | "dynamo_eagle_v1"

/** What besides the tokens goes into a local block hash (the LoRA adapter). */
export interface LocalHashOptions {
  /** The LoRA adapter's name; absent, null or empty is the base model. */
  readonly loraName?: string | null | undefined
  /**
   * The request's cache salt (vLLM's `cache_salt`, Dynamo's cache namespace); absent, null or
   * empty is unsalted. Blocks stored under a salt are found only by queries with the same salt.
   */
  readonly cacheSalt?: string | null | undefined
  /** Default `dynamo_standard_v1`. */
  readonly hashFormat?: HashFormat | undefined
}

const utf8 = new TextEncoder()
const U64_MASK = (1n << 64n) - 1n

const present = (value: string | null | undefined): value is string =>
  value !== undefined && value !== null && value !== ""

/**
 * The tokens-hash seed of a LoRA adapter and a cache salt: 1337 for the base model unsalted, else
 * `1337 + XXH3-64(loraName, 0) + XXH3-64(cacheSalt, 1)` (mod 2^64), each term only when its
 * string is present and non-empty (Dynamo's `compute_salt_hash`).
 */
export const blockHashSeed = (loraName?: string | null, cacheSalt?: string | null): bigint => {
  let seed = TOKENS_HASH_SEED
  if (present(loraName)) seed += xxh3Hash(utf8.encode(loraName), LORA_NAME_HASH_SEED)
  if (present(cacheSalt)) seed += xxh3Hash(utf8.encode(cacheSalt), CACHE_NAMESPACE_HASH_SEED)
  return seed & U64_MASK
}

/** Tokens per hashed window and block stride of a hash format. */
const windowOf = (blockSize: number, format: HashFormat | undefined): number =>
  format === "dynamo_eagle_v1" ? blockSize + 1 : blockSize

/** How many full blocks `tokenCount` tokens make (a partial last block does not count). */
export const fullBlockCount = (tokenCount: number, blockSize: number, format?: HashFormat): number => {
  if (!Number.isSafeInteger(blockSize) || blockSize <= 0) throw new RangeError(`block size ${blockSize}`)
  const window = windowOf(blockSize, format)
  return tokenCount < window ? 0 : Math.floor((tokenCount - window) / blockSize) + 1
}

let tokenScratch = new Uint32Array(1024)

/** Chains shorter than this stay in TypeScript (see `sequenceHashesInto`). */
const WASM_CHAIN_MIN_BLOCKS = 32

/**
 * Local hashes of the full blocks of `tokens[from, from + count)` into `out` at pair `at`, with
 * the seed as halves; returns the number of blocks. Token ids must be u32 (callers validate).
 */
export const localHashesInto = (
  tokens: ArrayLike<number>,
  from: number,
  count: number,
  blockSize: number,
  format: HashFormat | undefined,
  seedHi: number,
  seedLo: number,
  out: Uint32Array,
  at: number
): number => {
  const blocks = fullBlockCount(count, blockSize, format)
  if (blocks === 0) return 0
  const window = windowOf(blockSize, format)
  if (
    window >= WASM_MIN_WINDOW &&
    window <= WASM_MAX_WINDOW &&
    localHashesWasm(tokens, from, blocks, window, blockSize, seedHi, seedLo, out, at)
  )
    return blocks
  const used = (blocks - 1) * blockSize + window
  // One little-endian copy of the tokens in use; every block is a window into it.
  let words: Uint32Array
  if (tokens instanceof Uint32Array) words = tokens.subarray(from, from + used)
  else {
    if (tokenScratch.length < used) tokenScratch = new Uint32Array(Math.max(used, 2 * tokenScratch.length))
    words = tokenScratch
    for (let i = 0; i < used; i++) words[i] = tokens[from + i]! >>> 0
  }
  if (window >= 5 && window <= 32) {
    for (let b = 0; b < blocks; b++)
      xxh3Words17to128Into(words, b * blockSize, window, seedHi, seedLo, out, at + b)
    return blocks
  }
  for (let b = 0; b < blocks; b++) {
    xxh3WordsInto(words, b * blockSize, window, seedHi, seedLo)
    out[2 * (at + b)] = xxhOut.hi
    out[2 * (at + b) + 1] = xxhOut.lo
  }
  return blocks
}

/** Local block hashes of a prompt's full blocks, as `[hi, lo]` pairs. */
export const localBlockHashes = (
  tokens: ArrayLike<number>,
  blockSize: number,
  options: LocalHashOptions = {}
): Uint32Array => {
  const seed = blockHashSeed(options.loraName, options.cacheSalt)
  const out = new Uint32Array(2 * fullBlockCount(tokens.length, blockSize, options.hashFormat))
  localHashesInto(
    tokens,
    0,
    tokens.length,
    blockSize,
    options.hashFormat,
    Number(seed >> 32n),
    Number(seed & 0xffff_ffffn),
    out,
    0
  )
  return out
}

/** Chain hashers by seed: the canonical one, and the few others tests and old formats use. */
const chainHashers = new Map<bigint, Xxh3Seeded>()
const chainHasherFor = (seed: bigint): Xxh3Seeded => {
  const s = BigInt.asUintN(64, seed)
  let hasher = chainHashers.get(s)
  if (hasher === undefined) {
    hasher = new Xxh3Seeded(s)
    if (chainHashers.size >= 16) chainHashers.clear()
    chainHashers.set(s, hasher)
  }
  return hasher
}
const chainHasher = chainHasherFor(CHAIN_SEED)

/**
 * Canonical sequence hashes of `local[from, from + count)` (pairs) into `out` at pair `at`,
 * chained from the parent's sequence hash, the pair `parent[parentAt]`, or, with `parent`
 * undefined, starting at the first block's local hash.
 */
// The parameters of `Xxh3Seeded.chainInto`, which this passes on as they are (hot path).
export const sequenceHashesInto = (
  local: Uint32Array,
  from: number,
  count: number,
  parent: Uint32Array | undefined,
  parentAt: number,
  out: Uint32Array,
  at: number,
  hasher: Xxh3Seeded = chainHasher
): void => {
  // A stored batch's few blocks chain faster in TypeScript than through the module's copies in
  // and out (measured on 8-block events); a prompt's dozens of blocks faster in wasm.
  if (count >= WASM_CHAIN_MIN_BLOCKS) {
    const hasParent = parent !== undefined
    const parentHi = hasParent ? parent[2 * parentAt]! : 0
    const parentLo = hasParent ? parent[2 * parentAt + 1]! : 0
    if (chainWasm(local, from, count, hasParent, parentHi, parentLo, hasher.seedHi, hasher.seedLo, out, at))
      return
  }
  hasher.chainInto(local, from, count, parent, parentAt, out, at)
}

/** Canonical sequence hashes of a prompt's local block hashes (pairs in, pairs out). */
export const sequenceHashes = (
  local: Uint32Array,
  parent?: bigint,
  seed: bigint = CHAIN_SEED
): Uint32Array => {
  const n = local.length >>> 1
  const out = new Uint32Array(2 * n)
  const p = parent === undefined ? 0n : BigInt.asUintN(64, parent)
  const pair = parent === undefined ? undefined : Uint32Array.of(Number(p >> 32n), Number(p & 0xffff_ffffn))
  sequenceHashesInto(local, 0, n, pair, 0, out, 0, chainHasherFor(seed))
  return out
}

/** `compute_next_seq_hash(parent, local)` on bigints (chain seed 1337 unless given). */
export const nextSequenceHash = (parent: bigint, local: bigint, seed: bigint = CHAIN_SEED): bigint => {
  const p = BigInt.asUintN(64, parent)
  const l = BigInt.asUintN(64, local)
  const hasher = chainHasherFor(seed)
  hasher.hashPair(Number(p >> 32n), Number(p & 0xffff_ffffn), Number(l >> 32n), Number(l & 0xffff_ffffn))
  return toBigInt(xxhOut.hi, xxhOut.lo)
}
