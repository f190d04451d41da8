/**
 * `kvrelay/client`: block addressing for TypeScript routers, with no Effect and no I/O
 * (PROTOCOL §3.3, §7). A router that hashes a prompt's tokens itself asks the global consumer
 * with `localBlockHashes`, or probes an in-process view with the sequence hashes.
 *
 * ```ts
 * import { localBlockHashes, sequenceHashes } from "kvrelay/client"
 * const local = localBlockHashes(tokens, 64, { loraName: "tenant-a" })   // one per full block
 * const addresses = sequenceHashes(local)                                  // what the CKF holds
 * // A request with vLLM's `cache_salt` finds only blocks stored under the same salt:
 * const salted = localBlockHashes(tokens, 64, { cacheSalt: "user-42" })
 * ```
 *
 * `cacheSalt` is folded into the hash seed as Dynamo's `compute_block_hash_for_seq` folds its
 * cache namespace: `seed = 1337 + XXH3-64(loraName, 0) + XXH3-64(cacheSalt, 1)` (mod 2^64, each
 * term only for a non-empty string); the relay reads a stored block's salt from the engine's event
 * the same way (`cache_salt`, or vLLM's `extra_keys` tagged `dynamo-cache-salt:`). These are the
 * local hashes `/query_by_hash` and `/v1/query`'s `localBlockHashes` take (PROTOCOL §5.1).
 */

import {
  blockHashSeed,
  CACHE_NAMESPACE_HASH_SEED,
  CHAIN_SEED,
  fullBlockCount,
  type HashFormat,
  type LocalHashOptions,
  localBlockHashes as localPairs,
  nextSequenceHash,
  sequenceHashes as sequencePairs,
  TOKENS_HASH_SEED
} from "../ckf/tokens.js"
import { hashPairs, hashPairsToBigInts } from "../ckf/u64.js"

export type {
  DynamoInstanceSummary,
  DynamoScoreResponse,
  PoolWorkersAnswer,
  WorkerDepths
} from "../ckf/workerQuery.js"
export * from "./http.js"
/** The hashing pieces a router needs to hash exactly as the relay does: seeds, full-block counts, one chaining step. */
export {
  blockHashSeed,
  CACHE_NAMESPACE_HASH_SEED,
  CHAIN_SEED,
  fullBlockCount,
  type HashFormat,
  type LocalHashOptions,
  nextSequenceHash,
  TOKENS_HASH_SEED
}

/** Local block hashes of a prompt's full blocks (a partial last block has none). */
export const localBlockHashes = (
  tokens: ArrayLike<number>,
  blockSize: number,
  options: LocalHashOptions = {}
): Array<bigint> => hashPairsToBigInts(localPairs(tokens, blockSize, options))

/** Canonical sequence hashes of local block hashes: the addresses a relay's filter holds. */
export const sequenceHashes = (local: ReadonlyArray<bigint>): Array<bigint> =>
  hashPairsToBigInts(sequencePairs(hashPairs(local)))

/** The same, on `[hi, lo]` u32 pairs, for hot paths. */
export { localPairs as localBlockHashPairs, sequencePairs as sequenceHashPairs }
