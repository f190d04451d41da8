/**
 * The relay's pool catalog (PROTOCOL.md §5 `GET /v1/catalog`): the active pools ordered by
 * PoolId, under a revision that moves on every change.
 */

import { HashMap } from "effect"
import type { PoolId } from "../ckf/identity.js"
import type { CatalogSnapshot, DcPoolDescriptor, DcRelayIdentity } from "../protocol/Model.js"

// ---------------------------------------------------------------------------------------------
// Catalog

const comparePools = (a: DcPoolDescriptor, b: DcPoolDescriptor): number =>
  a.producer.poolId.compareTo(b.producer.poolId)

/**
 * An immutable catalog revision. The ordered pool list is computed on first access and cached
 * ("materialized"); every mutation yields a new value without that cache.
 */
export class DcPoolCatalog implements CatalogSnapshot {
  private ordered: ReadonlyArray<DcPoolDescriptor> | undefined = undefined

  constructor(
    readonly relay: DcRelayIdentity,
    readonly revision: bigint,
    private readonly entries: HashMap.HashMap<string, DcPoolDescriptor>
  ) {}

  static empty(relay: DcRelayIdentity): DcPoolCatalog {
    return new DcPoolCatalog(relay, 0n, HashMap.empty())
  }

  /** Descriptors ordered by PoolId. */
  get pools(): ReadonlyArray<DcPoolDescriptor> {
    if (this.ordered === undefined) {
      this.ordered = Object.freeze(Array.from(HashMap.values(this.entries)).sort(comparePools))
    }
    return this.ordered
  }

  get isMaterialized(): boolean {
    return this.ordered !== undefined
  }

  get size(): number {
    return HashMap.size(this.entries)
  }

  descriptor(poolId: PoolId): DcPoolDescriptor | undefined {
    const found = HashMap.get(this.entries, poolId.key)
    return found._tag === "Some" ? found.value : undefined
  }

  upsert(revision: bigint, descriptor: DcPoolDescriptor): DcPoolCatalog {
    return new DcPoolCatalog(
      this.relay,
      revision,
      HashMap.set(this.entries, descriptor.producer.poolId.key, descriptor)
    )
  }

  remove(revision: bigint, poolId: PoolId): DcPoolCatalog {
    return new DcPoolCatalog(this.relay, revision, HashMap.remove(this.entries, poolId.key))
  }

  clear(revision: bigint): DcPoolCatalog {
    return new DcPoolCatalog(this.relay, revision, HashMap.empty())
  }
}
