/**
 * What the global consumer has seen registered in its relays' catalogs since it started
 * (PROTOCOL §7 ◆3), so that an overlap query can tell a name nobody ever served (404
 * `MODEL_NOT_FOUND`, `ADAPTER_NOT_FOUND`) from one whose relay is down right now (503
 * `NO_READY_LANE`). A relay's catalog is forgotten when its connection ends; this memory is not.
 *
 * Bounded: everything in a catalog the consumer holds now is always kept (the catalogs bound
 * it), and of the names no current catalog lists any more at most `retained` are kept, the ones
 * gone longest dropped first. A dropped name answers `MODEL_NOT_FOUND` again.
 */

import type { CatalogSnapshot } from "../protocol/Model.js"

/** Names no current catalog lists that are still remembered (docs/decisions.md). */
const DEFAULT_RETAINED_NAMES = 4096

/** The query side: read by `GlobalView` on every query that needs it. */
export interface KnownModelsView {
  /**
   * The base models a model name or alias resolves to in `namespace` (an adapter's served
   * name resolves to the base it adapts), or undefined when no catalog has registered it.
   */
  readonly bases: (namespace: string, name: string) => ReadonlySet<string> | undefined
  /** Whether an adapter registration `{lora: {baseModel, adapter}}` in `namespace` has been seen. */
  readonly hasAdapter: (namespace: string, baseModel: string, adapter: string) => boolean
  /** Whether a pool of the indexer domain (by `IndexerDomainId.key`) has been seen. */
  readonly hasDomain: (domainKey: string) => boolean
  /** Whether an adapter of that name has been registered on a pool of the domain. */
  readonly hasDomainAdapter: (domainKey: string, adapter: string) => boolean
}

type Entry =
  | { readonly kind: "name"; readonly bases: Set<string> }
  | { readonly kind: "adapter" }
  | { readonly kind: "domain"; readonly adapters: Set<string> }

// NUL cannot occur in a namespace, a model id or a digest: it separates key parts safely.
const nameKey = (namespace: string, name: string) => `n\0${namespace}\0${name}`
const adapterKey = (namespace: string, base: string, adapter: string) =>
  `a\0${namespace}\0${base}\0${adapter}`
const domainKey = (key: string) => `d\0${key}`

/**
 * The models every relay's catalog listed lately, to tell an unknown model from one that is only
 * gone for now.
 */
export class KnownModels implements KnownModelsView {
  /** In the order last listed by a catalog: the front holds what has been gone longest. */
  private readonly entries = new Map<string, Entry>()

  constructor(private readonly retained: number = DEFAULT_RETAINED_NAMES) {}

  /** How many names, adapters and domains are remembered (for tests and diagnostics). */
  get size(): number {
    return this.entries.size
  }

  /**
   * Notes every registration of the catalogs held now (call it whenever one changes), then drops
   * the longest-gone entries beyond `retained`.
   */
  remember(catalogs: Iterable<CatalogSnapshot>): void {
    const current = new Map<string, Entry>()
    const take = <E extends Entry>(key: string, make: () => E): E => {
      let entry = current.get(key) as E | undefined
      if (entry === undefined) {
        entry = (this.entries.get(key) as E | undefined) ?? make()
        current.set(key, entry)
      }
      return entry
    }
    for (const catalog of catalogs) {
      for (const pool of catalog.pools) {
        const namespace = pool.servingEndpoint.namespace
        const domain = take(domainKey(pool.producer.poolId.indexerDomain.key), () => ({
          kind: "domain" as const,
          adapters: new Set<string>()
        }))
        for (const registration of pool.registrations) {
          const base = registration.target.baseModel
          for (const name of [registration.model, ...registration.aliases]) {
            take(nameKey(namespace, name), () => ({
              kind: "name" as const,
              bases: new Set<string>()
            })).bases.add(base)
          }
          if (registration.target._tag === "Lora") {
            const adapter = registration.target.adapter
            take(adapterKey(namespace, base, adapter), () => ({ kind: "adapter" as const }))
            domain.adapters.add(adapter)
          }
        }
      }
    }
    // Listed now: moved to the back, so that the front holds what has been gone longest.
    for (const [key, entry] of current) {
      this.entries.delete(key)
      this.entries.set(key, entry)
    }
    const bound = current.size + this.retained
    if (this.entries.size <= bound) return
    for (const key of this.entries.keys()) {
      if (this.entries.size <= bound) break
      // Everything listed now sits behind the forgotten entries: this never drops one of them.
      if (current.has(key)) break
      this.entries.delete(key)
    }
  }

  bases(namespace: string, name: string): ReadonlySet<string> | undefined {
    const entry = this.entries.get(nameKey(namespace, name))
    return entry?.kind === "name" ? entry.bases : undefined
  }

  hasAdapter(namespace: string, baseModel: string, adapter: string): boolean {
    return this.entries.has(adapterKey(namespace, baseModel, adapter))
  }

  hasDomain(key: string): boolean {
    return this.entries.has(domainKey(key))
  }

  hasDomainAdapter(key: string, adapter: string): boolean {
    const entry = this.entries.get(domainKey(key))
    return entry?.kind === "domain" && entry.adapters.has(adapter)
  }
}
