/**
 * The canonical addresses (PROTOCOL §3.3) of the blocks a simulated worker publishes, as a router
 * would compute them from the same tokens. A real engine knows nothing of these; the simulated
 * ones keep them so that tests and the demo can say which filter address a published block must
 * land at without asking the relay that is under test.
 */

import { sequenceHashes } from "../ckf/tokens.js"
import { toBigInt } from "../ckf/u64.js"

/**
 * Token ids for blocks published without any: each block's tokens derive from its own hash, so
 * distinct blocks get distinct tokens (and distinct canonical addresses), as on a real engine.
 */
export const defaultTokenIds = (blockHashes: Uint32Array, blockSize: number): Array<number> => {
  const blocks = blockHashes.length >>> 1
  const tokens = new Array<number>(blocks * blockSize)
  for (let b = 0; b < blocks; b++) {
    const hi = blockHashes[2 * b]!
    const lo = blockHashes[2 * b + 1]!
    for (let t = 0; t < blockSize; t++) tokens[b * blockSize + t] = t === 0 ? lo : t === 1 ? hi : t
  }
  return tokens
}

const pairKey = (hi: number, lo: number): bigint => toBigInt(hi, lo)

/** External hash → canonical address, for one simulated rank. */
export class AddressBook {
  private readonly byExternal = new Map<bigint, bigint>()

  /**
   * Records a stored batch: `locals` has one pair per indexed block (fewer than `externals` when
   * the last page is partial), chained from `parent`'s address when the parent is known.
   */
  record(externals: Uint32Array, locals: Uint32Array, parent: bigint | undefined): void {
    const n = Math.min(externals.length, locals.length) >>> 1
    const parentAddress = parent === undefined ? undefined : this.byExternal.get(parent)
    const out = sequenceHashes(locals.subarray(0, 2 * n), parentAddress)
    for (let i = 0; i < n; i++) {
      this.byExternal.set(
        pairKey(externals[2 * i]!, externals[2 * i + 1]!),
        toBigInt(out[2 * i]!, out[2 * i + 1]!)
      )
    }
  }

  /** The address of a block this rank published (throws for one it never did: a test's mistake). */
  addressOf(external: bigint): bigint {
    const address = this.byExternal.get(BigInt.asUintN(64, external))
    if (address === undefined) throw new Error(`block ${external} was never stored by this simulated worker`)
    return address
  }
}
