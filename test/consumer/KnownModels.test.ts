/**
 * The consumer's memory of what its relays' catalogs registered since it started (PROTOCOL §7
 * ◆3): names and aliases resolve to their base models, adapters are known on their base and
 * their domain, a catalog forgetting a model does not make it unknown, and what no catalog lists
 * any more is bounded, the longest gone dropped first.
 */

import { describe, expect, it } from "@effect/vitest"
import { Effect, SubscriptionRef } from "effect"
import { KnownModels } from "../../src/consumer/KnownModels.js"
import { domainOf, FakeRelay } from "./fakeRelay.js"

const catalogOf = (relay: FakeRelay) => SubscriptionRef.get(relay.catalogRef)

describe("KnownModels", () => {
  it.effect("resolves models, aliases and adapter names to their bases, and keeps them once gone", () =>
    Effect.gen(function* () {
      const a = yield* FakeRelay.make("a", 1n)
      const pool = yield* a.addPool({ domain: domainOf(1), model: "llama", adapters: ["tenant-a"] })
      const known = new KnownModels()
      known.remember([yield* catalogOf(a)])
      expect(known.bases("prod", "llama")).toEqual(new Set(["llama"]))
      expect(known.bases("prod", "chat")).toEqual(new Set(["llama"]))
      expect(known.bases("prod", "llama-tenant-a")).toEqual(new Set(["llama"]))
      expect(known.bases("dev", "llama")).toBeUndefined()
      expect(known.bases("prod", "mistral")).toBeUndefined()
      expect(known.hasAdapter("prod", "llama", "tenant-a")).toBe(true)
      expect(known.hasAdapter("prod", "llama", "tenant-b")).toBe(false)
      expect(known.hasAdapter("dev", "llama", "tenant-a")).toBe(false)
      expect(known.hasDomain(domainOf(1).key)).toBe(true)
      expect(known.hasDomain(domainOf(5).key)).toBe(false)
      expect(known.hasDomainAdapter(domainOf(1).key, "tenant-a")).toBe(true)
      expect(known.hasDomainAdapter(domainOf(1).key, "tenant-b")).toBe(false)

      // The relay's catalog loses the pool (or the relay goes away): still known.
      yield* a.removePool(pool)
      known.remember([yield* catalogOf(a)])
      known.remember([])
      expect(known.bases("prod", "llama")).toEqual(new Set(["llama"]))
      expect(known.hasAdapter("prod", "llama", "tenant-a")).toBe(true)
      expect(known.hasDomain(domainOf(1).key)).toBe(true)
    })
  )

  it.effect("keeps what catalogs list now, and at most `retained` of what they no longer list", () =>
    Effect.gen(function* () {
      const a = yield* FakeRelay.make("a", 1n)
      const known = new KnownModels(3)
      // Ten models, one after another, each alone in the catalog (model, alias "chat", domain).
      for (let i = 0; i < 10; i++) {
        const pool = yield* a.addPool({ domain: domainOf(2 * i), model: `m${i}` })
        known.remember([yield* catalogOf(a)])
        yield* a.removePool(pool)
      }
      const current = yield* a.addPool({ domain: domainOf(40), model: "now" })
      known.remember([yield* catalogOf(a)])
      // Listed now: the model, its alias and its domain; plus the 3 gone most recently.
      expect(known.size).toBe(3 + 3)
      expect(known.bases("prod", "now")).toEqual(new Set(["now"]))
      expect(known.bases("prod", "chat")).toEqual(
        new Set(["now", "m9", "m8", "m7", "m6", "m5", "m4", "m3", "m2", "m1", "m0"])
      )
      expect(known.hasDomain(domainOf(40).key)).toBe(true)
      // Gone most recently: m9, its domain, then m8 (each pool's domain is noted before its names).
      expect(known.bases("prod", "m9")).toEqual(new Set(["m9"]))
      expect(known.hasDomain(domainOf(18).key)).toBe(true)
      expect(known.bases("prod", "m8")).toEqual(new Set(["m8"]))
      expect(known.hasDomain(domainOf(16).key)).toBe(false)
      expect(known.bases("prod", "m7")).toBeUndefined()
      expect(known.bases("prod", "m0")).toBeUndefined()
      // Many more listed at once than `retained`: nothing listed is ever dropped.
      const wide = yield* FakeRelay.make("b", 2n)
      for (let i = 0; i < 8; i++) yield* wide.addPool({ domain: domainOf(100 + 2 * i), model: `w${i}` })
      known.remember([yield* catalogOf(a), yield* catalogOf(wide)])
      for (let i = 0; i < 8; i++) expect(known.bases("prod", `w${i}`)).toEqual(new Set([`w${i}`]))
      expect(known.bases("prod", "now")).toBeDefined()
      expect(current.producer).toBeDefined()
    })
  )
})
