/**
 * `kvrelay/client`: block addressing for TypeScript routers, with no Effect and no I/O
 * (PROTOCOL §3.3, §7). A router that hashes a prompt's tokens itself asks the global consumer
 * with `localBlockHashes`, or probes an in-process view with the sequence hashes.
 *
 * ```ts
 * import { localBlockHashes, sequenceHashes } from "kvrelay/client"
 * const local = localBlockHashes(tokens, 64, { loraName: "tenant-a" })   // one per full block
 * const addresses = sequenceHashes(local)                                  // what the CKF holds
 * ```
 */

import {
  blockHashSeed,
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

/** The hashing pieces a router needs to hash exactly as the relay does: seeds, full-block counts, one chaining step. */
export {
  blockHashSeed,
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
