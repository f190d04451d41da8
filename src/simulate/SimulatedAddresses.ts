/**
 * The canonical addresses (PROTOCOL §3.3) of the blocks a simulated worker publishes, as a router
 * would compute them from the same tokens. A real engine knows nothing of these; the simulated
 * ones keep them for the blocks they hold, so that tests can say which filter address a published
 * block must land at without asking the relay that is under test.
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

/** One held block: its address and the tiers (bits of `AddressBook.tierBit`) that hold it. */
interface Held {
  address: bigint
  tiers: number
}

/**
 * External hash → canonical address of the blocks one simulated rank holds now. A block leaves
 * when the last tier holding it removes it, on a clear and on a new incarnation, so the book is
 * as large as the worker's cache and no larger, however long the worker runs. A test that needs
 * the address of a block after it is gone takes it while the block is held.
 */
export class AddressBook {
  private readonly held = new Map<bigint, Held>()
  private readonly tierBits = new Map<string, number>()

  /** Blocks held now (the book's whole size). */
  get size(): number {
    return this.held.size
  }

  private tierBit(tier: string): number {
    let bit = this.tierBits.get(tier)
    if (bit === undefined) {
      // A handful of tiers exist (device, host, disk, external, and engines' medium names).
      if (this.tierBits.size >= 31) throw new RangeError(`more than 31 storage tiers (${tier})`)
      bit = 1 << this.tierBits.size
      this.tierBits.set(tier, bit)
    }
    return bit
  }

  /**
   * Records a stored batch on `tier`: `locals` has one pair per indexed block (fewer than
   * `externals` when the last page is partial), chained from `parent`'s address. A batch whose
   * parent this rank does not hold has no address a router could compute, so nothing is recorded.
   */
  record(externals: Uint32Array, locals: Uint32Array, parent: bigint | undefined, tier: string): void {
    const n = Math.min(externals.length, locals.length) >>> 1
    let parentAddress: bigint | undefined
    if (parent !== undefined) {
      parentAddress = this.held.get(BigInt.asUintN(64, parent))?.address
      if (parentAddress === undefined) return
    }
    const bit = this.tierBit(tier)
    const out = sequenceHashes(locals.subarray(0, 2 * n), parentAddress)
    for (let i = 0; i < n; i++) {
      const key = pairKey(externals[2 * i]!, externals[2 * i + 1]!)
      const address = toBigInt(out[2 * i]!, out[2 * i + 1]!)
      const existing = this.held.get(key)
      if (existing === undefined) this.held.set(key, { address, tiers: bit })
      else {
        // Stored again (on another tier, or under other tokens): the latest store names it.
        existing.address = address
        existing.tiers |= bit
      }
    }
  }

  /** Removes `externals` from `tier`; a block no tier holds any more leaves the book. */
  forget(externals: Uint32Array, tier: string): void {
    const bit = this.tierBits.get(tier)
    if (bit === undefined) return
    for (let i = 0; i + 1 < externals.length; i += 2) {
      const key = pairKey(externals[i]!, externals[i + 1]!)
      const entry = this.held.get(key)
      if (entry === undefined) continue
      entry.tiers &= ~bit
      if (entry.tiers === 0) this.held.delete(key)
    }
  }

  /** Every block leaves (all blocks cleared, or a new incarnation). */
  clear(): void {
    this.held.clear()
  }

  /** The address of a block this rank holds now (throws for any other: a test's mistake). */
  addressOf(external: bigint): bigint {
    const entry = this.held.get(BigInt.asUintN(64, external))
    if (entry === undefined) {
      throw new Error(
        `block ${external} is not held by this simulated worker (never stored, or removed, cleared or restarted since; take its address while it is held)`
      )
    }
    return entry.address
  }
}
