/**
 * The straightforward implementation the CKF core is measured against: the same exact-ownership
 * semantics (per-member sets, refcounts, first-owner/last-owner transitions) over
 * `Map<bigint, number>` and `Set<bigint>`, with no filter at all. It consumes the same events as
 * the core (hash pairs from the wire decoder) and turns each hash into the bigint its maps need.
 */

import type { CkfEvent } from "../src/ckf/events.js"
import { toBigInt } from "../src/ckf/u64.js"

export class MapSetOwnership {
  readonly refcounts = new Map<bigint, number>()
  readonly members = new Map<string, Set<bigint>>()
  firstOwnerInserts = 0
  lastOwnerRemovals = 0

  store(member: string, hash: bigint): boolean {
    let set = this.members.get(member)
    if (set === undefined) {
      set = new Set()
      this.members.set(member, set)
    }
    if (set.has(hash)) return false
    set.add(hash)
    const current = this.refcounts.get(hash) ?? 0
    if (current === 0) this.firstOwnerInserts++
    this.refcounts.set(hash, current + 1)
    return true
  }

  remove(member: string, hash: bigint): boolean {
    const set = this.members.get(member)
    if (set === undefined || !set.delete(hash)) return false
    const current = this.refcounts.get(hash)!
    if (current === 1) {
      this.refcounts.delete(hash)
      this.lastOwnerRemovals++
    } else this.refcounts.set(hash, current - 1)
    if (set.size === 0) this.members.delete(member)
    return true
  }

  applyEvent(event: CkfEvent): void {
    if (event.storageTier !== "device" && event.data._tag !== "Cleared") return
    const member = `${event.workerId}/${event.dpRank}`
    const data = event.data
    if (data._tag === "Cleared") {
      const set = this.members.get(member)
      if (set !== undefined) for (const h of [...set]) this.remove(member, h)
      return
    }
    const pairs = data.blockHashes
    for (let i = 0; i < pairs.length; i += 2) {
      const hash = toBigInt(pairs[i]!, pairs[i + 1]!)
      if (data._tag === "Stored") this.store(member, hash)
      else this.remove(member, hash)
    }
  }

  replacePairs(member: string, pairs: Uint32Array): void {
    const hashes: Array<bigint> = []
    for (let i = 0; i < pairs.length; i += 2) hashes.push(toBigInt(pairs[i]!, pairs[i + 1]!))
    this.replace(member, hashes)
  }

  replace(member: string, hashes: ReadonlyArray<bigint>): void {
    const set = this.members.get(member)
    if (set !== undefined) for (const h of [...set]) this.remove(member, h)
    for (const h of hashes) this.store(member, h)
  }
}
