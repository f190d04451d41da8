/**
 * Seed 000 (`kv_dc_relay/host.rs`): the two host tests about pool retirement through the
 * registry. The host's `withdraw_drain_and_remove_pool` is the registry's `retireWith` (the
 * generation scope's finalizer runs withdraw → drain faults during the teardown → remove), and
 * `target_fault_retirement_mode(Fenced)` is the `"Fenced"` retirement mode.
 */

import { describe, expect, it } from "@effect/vitest"
import { Deferred, Effect, Fiber } from "effect"
import { CacheSemanticsId, DcId, IndexerDomainId, PoolId, RoutingScopeId } from "../../src/ckf/identity.js"
import { baseRegistration, canonicalModelId } from "../../src/protocol/Model.js"
import { targetFaultRetirementMode } from "../../src/relay/EndpointSlot.js"
import { drainFaultsWhile } from "../../src/relay/PendingActorFaults.js"
import type { PoolAttachRequest } from "../../src/relay/PoolRegistry.js"
import { endpoint, registry as makeRegistry, querySemantics } from "../relay/registryFixtures.js"

const digest = (byte: number) => new Uint8Array(16).fill(byte)

/** `domain(1, "meta/llama")` in DC 7 (the seed's host fixture). */
const attachRequest = (): PoolAttachRequest => ({
  poolId: new PoolId(
    new IndexerDomainId(
      new CacheSemanticsId(digest(1), "explicit"),
      new RoutingScopeId(digest(2), "explicit")
    ),
    new DcId(7n)
  ),
  endpoint: endpoint("prod.backend.generate"),
  registrations: [baseRegistration(canonicalModelId("llama"))],
  querySemantics: querySemantics(),
  roles: ["aggregated"],
  servingFacts: { runtimeConfigs: new Map() }
})

describe("seed 000: registry retirement", () => {
  it.scoped("pool_is_withdrawn_before_recovery_teardown_completes", () =>
    Effect.gen(function* () {
      const registry = yield* makeRegistry()
      const attachment = yield* registry.attach(attachRequest())
      const teardownStarted = yield* Deferred.make<void>()
      const releaseTeardown = yield* Deferred.make<void>()
      const retirement = yield* Effect.fork(
        registry.retireWith(
          attachment,
          "Graceful",
          Effect.gen(function* () {
            yield* Deferred.succeed(teardownStarted, undefined)
            yield* Deferred.await(releaseTeardown)
            yield* attachment.actor.shutdown
          })
        )
      )

      yield* Deferred.await(teardownStarted)
      expect((yield* registry.catalog).pools.length).toBe(0)
      expect(yield* registry.poolCount).toBe(1)

      yield* Deferred.succeed(releaseTeardown, undefined)
      yield* Fiber.join(retirement)
      expect(yield* registry.poolCount).toBe(0)
    })
  )

  it("target_fault_retirement_mode fences the generation for a fenced rank only", () => {
    expect(targetFaultRetirementMode("Fenced")).toBe("Fenced")
    for (const disposition of ["Recovering", "ResetLiveOnly", "Stale"] as const)
      expect(targetFaultRetirementMode(disposition)).toBeUndefined()
  })

  it.scoped("fenced_target_disposition_withdraws_the_pool_generation", () =>
    Effect.gen(function* () {
      const registry = yield* makeRegistry()
      const attachment = yield* registry.attach(attachRequest())
      const mode = targetFaultRetirementMode("Fenced")!
      expect(mode).toBe("Fenced")
      expect(yield* registry.withdraw(attachment.poolId, attachment.layoutGeneration, mode)).toBe(true)
      expect((yield* registry.catalog).pools.length).toBe(0)

      yield* drainFaultsWhile(attachment.poolId, attachment.faults, attachment.actor.fence)
      expect(yield* registry.remove(attachment.poolId, attachment.layoutGeneration)).toBe(true)
    })
  )
})
