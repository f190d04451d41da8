/**
 * Catalog invariants of the pool registry under random command sequences: the revision counts
 * exactly the catalog mutations (upserts, removals of active entries, the shutdown clear), pools
 * are strictly ordered by PoolId, and the catalog shows exactly the active generations — never a
 * withdrawn, fenced or removed one.
 */

import { describe, expect, it } from "@effect/vitest"
import { Effect, Exit, TestContext } from "effect"
import fc from "fast-check"
import { baseRegistration, canonicalModelId, modelAlias, type WorkerRole } from "../../src/protocol/Model.js"
import type { PoolAttachment, PoolRegistry } from "../../src/relay/PoolRegistry.js"
import { registry as makeRegistry, pool, request } from "./registryFixtures.js"

const SEEDS = [1, 3, 5, 7] as const

type Op =
  | { readonly kind: "attach"; readonly seed: number }
  | { readonly kind: "withdraw"; readonly seed: number; readonly fenced: boolean }
  | { readonly kind: "replaceRegistrations"; readonly seed: number; readonly alias: number }
  | { readonly kind: "replaceRoles"; readonly seed: number; readonly roles: ReadonlyArray<WorkerRole> }
  | { readonly kind: "fence"; readonly seed: number; readonly stale: boolean }
  | { readonly kind: "detach"; readonly seed: number }
  | { readonly kind: "shutdown" }

const seedArb = fc.constantFrom(...SEEDS)
const opArb: fc.Arbitrary<Op> = fc.oneof(
  { weight: 5, arbitrary: fc.record({ kind: fc.constant("attach" as const), seed: seedArb }) },
  {
    weight: 2,
    arbitrary: fc.record({ kind: fc.constant("withdraw" as const), seed: seedArb, fenced: fc.boolean() })
  },
  {
    weight: 3,
    arbitrary: fc.record({
      kind: fc.constant("replaceRegistrations" as const),
      seed: seedArb,
      alias: fc.nat({ max: 2 })
    })
  },
  {
    weight: 2,
    arbitrary: fc.record({
      kind: fc.constant("replaceRoles" as const),
      seed: seedArb,
      roles: fc.constantFrom<ReadonlyArray<WorkerRole>>(["aggregated"], ["prefill", "decode"], ["decode"])
    })
  },
  {
    weight: 2,
    arbitrary: fc.record({ kind: fc.constant("fence" as const), seed: seedArb, stale: fc.boolean() })
  },
  { weight: 3, arbitrary: fc.record({ kind: fc.constant("detach" as const), seed: seedArb }) },
  { weight: 1, arbitrary: fc.constant({ kind: "shutdown" as const }) }
)

interface ModelEntry {
  readonly attachment: PoolAttachment
  active: boolean
  alias: number
  roles: ReadonlyArray<WorkerRole>
}

const registrationsFor = (seed: number, alias: number) => [
  baseRegistration(canonicalModelId(`model-${seed}`), [modelAlias(`alias-${alias}`)])
]

const run = (ops: ReadonlyArray<Op>) =>
  Effect.gen(function* () {
    const registry: PoolRegistry = yield* makeRegistry()
    const model = new Map<number, ModelEntry>()
    let mutations = 0n
    let shutDown = false

    const check = Effect.gen(function* () {
      const catalog = yield* registry.catalog
      expect(catalog.revision).toBe(mutations)
      expect(yield* registry.catalogRef).toBe(catalog)
      const ids = catalog.pools.map((d) => d.producer.poolId)
      for (let i = 1; i < ids.length; i++) expect(ids[i - 1]!.compareTo(ids[i]!)).toBeLessThan(0)
      const visible = new Map(catalog.pools.map((d) => [d.producer.poolId.key, d]))
      const active = Array.from(model.entries()).filter(([, entry]) => entry.active)
      expect(visible.size).toBe(active.length)
      for (const [seed, entry] of active) {
        const d = visible.get(pool(seed).key)
        if (d === undefined) throw new Error(`active pool ${seed} is missing from the catalog`)
        expect(d.producer.equals(entry.attachment.identity)).toBe(true)
        expect(d.registrations[0]!.aliases).toEqual([`alias-${entry.alias}`])
        expect(d.poolRoles).toEqual(entry.roles)
      }
    })

    for (const op of ops) {
      switch (op.kind) {
        case "attach": {
          const exit = yield* Effect.exit(
            registry.attach({
              ...request(pool(op.seed), `pool-${op.seed}.router.generate`, `model-${op.seed}`),
              registrations: registrationsFor(op.seed, 0)
            })
          )
          const expectSuccess = !shutDown && !model.has(op.seed)
          expect(Exit.isSuccess(exit)).toBe(expectSuccess)
          if (Exit.isSuccess(exit)) {
            model.set(op.seed, { attachment: exit.value, active: true, alias: 0, roles: ["aggregated"] })
            mutations++
          }
          break
        }
        case "withdraw": {
          const entry = model.get(op.seed)
          if (entry === undefined) break
          const withdrawn = yield* registry.withdraw(
            entry.attachment.poolId,
            entry.attachment.layoutGeneration,
            op.fenced ? "Fenced" : "Graceful"
          )
          expect(withdrawn).toBe(!shutDown)
          if (entry.active) mutations++
          entry.active = false
          break
        }
        case "replaceRegistrations": {
          const entry = model.get(op.seed)
          if (entry === undefined) break
          const exit = yield* Effect.exit(
            registry.replaceRegistrations(entry.attachment, registrationsFor(op.seed, op.alias))
          )
          if (op.alias === entry.alias) {
            expect(Exit.isSuccess(exit)).toBe(true)
          } else {
            expect(Exit.isSuccess(exit)).toBe(entry.active)
            if (entry.active) {
              entry.alias = op.alias
              mutations++
            }
          }
          break
        }
        case "replaceRoles": {
          const entry = model.get(op.seed)
          if (entry === undefined) break
          const unchanged = entry.roles.join() === op.roles.join()
          const exit = yield* Effect.exit(registry.replaceRoles(entry.attachment, op.roles))
          expect(Exit.isSuccess(exit)).toBe(unchanged || entry.active)
          if (!unchanged && entry.active) {
            entry.roles = op.roles
            mutations++
          }
          break
        }
        case "fence": {
          const entry = model.get(op.seed)
          if (entry === undefined) break
          const generation = entry.attachment.layoutGeneration + (op.stale ? 1_000n : 0n)
          const fenced = yield* registry.fenceGeneration(entry.attachment.poolId, generation, "property test")
          expect(fenced).toBe(!op.stale && entry.active)
          if (!op.stale && entry.active) {
            entry.active = false
            mutations++
          }
          break
        }
        case "detach": {
          const entry = model.get(op.seed)
          if (entry === undefined) break
          yield* Effect.exit(registry.detach(entry.attachment))
          if (entry.active) mutations++
          model.delete(op.seed)
          break
        }
        case "shutdown": {
          yield* registry.shutdown
          if (!shutDown) mutations++
          shutDown = true
          // Shutdown fenced every generation and dropped the entries; their owners still retire them.
          for (const entry of model.values()) yield* Effect.exit(registry.detach(entry.attachment))
          model.clear()
          break
        }
      }
      yield* check
    }
    for (const entry of model.values()) yield* Effect.exit(registry.detach(entry.attachment))
  })

describe("PoolRegistry catalog", () => {
  it.effect(
    "random attach/withdraw/replace/fence/shutdown sequences keep revision = catalog mutations, PoolId order and no withdrawn generation",
    () =>
      Effect.promise(() =>
        fc.assert(
          fc.asyncProperty(fc.array(opArb, { minLength: 1, maxLength: 40 }), (ops) =>
            Effect.runPromise(run(ops).pipe(Effect.scoped, Effect.provide(TestContext.TestContext)))
          ),
          { numRuns: 60 }
        )
      ),
    120_000
  )
})
