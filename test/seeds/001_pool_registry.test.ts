/**
 * Seed 001 (`kv_dc_relay/pool_registry.rs`): all 36 tests. The seed's gated CKF builder, eviction
 * gate and hub gates are options of `PoolRegistry.make`; dropping a Rust subscription or stream is
 * closing the scope it was opened in. Where the Rust tests spin on `yield_now` under a wall-clock
 * deadline, these poll on fiber yields with a bounded count; where they sleep, the TestClock moves.
 */

import { describe, expect, it } from "@effect/vitest"
import { Cause, Deferred, Effect, Exit, Fiber, Option, Schema, Scope, Stream, TestClock } from "effect"
import type { ProducerIdentity } from "../../src/ckf/identity.js"
import {
  baseRegistration,
  canonicalModelId,
  type DcPoolDescriptor,
  KvQuerySemantics,
  ModelTarget,
  modelAlias,
  withTarget
} from "../../src/protocol/Model.js"
import { CatalogSnapshotJson } from "../../src/protocol/RelayApi.js"
import { makeEncodingPermits } from "../../src/relay/internal/sync.js"
import { drainFaultsWhile } from "../../src/relay/PendingActorFaults.js"
import type { DcPoolCatalog } from "../../src/relay/PoolCatalog.js"
import { hasDegradedCoverage } from "../../src/relay/PoolLoad.js"
import type { PoolAttachment, PoolRegistry, PoolRetirementMode } from "../../src/relay/PoolRegistry.js"
import * as PublicationSource from "../../src/relay/PublicationSource.js"
import {
  config,
  drop,
  endpoint,
  gatedBuilder,
  registry as makeRegistry,
  pool,
  querySemantics,
  registration,
  relayIdentity,
  request,
  runtimeConfig,
  storedEventN,
  waitUntil
} from "../relay/registryFixtures.js"

const descriptor = (catalog: DcPoolCatalog, seed: number): DcPoolDescriptor => {
  const found = catalog.pools.find((d) => d.producer.poolId.equals(pool(seed)))
  if (found === undefined) throw new Error(`pool ${seed} is not in the catalog`)
  return found
}

/** The seed's `retire` helper: withdraw, drain faults while the actor stops or fences, remove. */
const retire = (registry: PoolRegistry, attachment: PoolAttachment, mode: PoolRetirementMode) =>
  Effect.gen(function* () {
    const { poolId, layoutGeneration, actor } = attachment
    expect(yield* registry.withdraw(poolId, layoutGeneration, mode)).toBe(true)
    yield* drainFaultsWhile(poolId, attachment.faults, mode === "Graceful" ? actor.shutdown : actor.fence)
    expect(yield* registry.remove(poolId, layoutGeneration)).toBe(true)
  })

const failureOf = <A, E>(exit: Exit.Exit<A, E>): E => {
  if (Exit.isSuccess(exit)) throw new Error("expected a failure, got a success")
  const failure = Cause.failureOption(exit.cause)
  if (Option.isNone(failure)) throw new Error(`expected a typed failure, got ${Cause.pretty(exit.cause)}`)
  return failure.value
}

/** `subscribe(&registry, producer)` in a scope of its own, which stands for the Rust value's drop. */
const subscribe = (registry: PoolRegistry, producer: ProducerIdentity) =>
  Effect.gen(function* () {
    const scope = yield* Scope.make()
    const exit = yield* Effect.exit(registry.subscribePool(producer).pipe(Scope.extend(scope)))
    if (Exit.isFailure(exit)) yield* drop(scope)
    return { exit, scope }
  })

const subscribeOk = (registry: PoolRegistry, producer: ProducerIdentity) =>
  Effect.flatMap(subscribe(registry, producer), ({ exit, scope }) =>
    Exit.isSuccess(exit)
      ? Effect.succeed({ subscription: exit.value, scope })
      : Effect.dieMessage(`subscription failed: ${Cause.pretty(exit.cause)}`)
  )

const subscribeError = (registry: PoolRegistry, producer: ProducerIdentity) =>
  Effect.map(subscribe(registry, producer), ({ exit }) => failureOf(exit))

const hubPhase = (registry: PoolRegistry, seed: number) => {
  const slot = registry.hubSlot(pool(seed))
  if (slot === undefined) throw new Error(`pool ${seed} must be attached`)
  return slot
}

describe("seed 001: pool registry", () => {
  it.scoped("one_model_binds_to_independent_pools", () =>
    Effect.gen(function* () {
      const registry = yield* makeRegistry()
      const first = yield* registry.attach(request(pool(1), "fast.router.generate", "llama"))
      const second = yield* registry.attach(request(pool(2), "slow.router.generate", "llama"))

      expect(yield* registry.poolCount).toBe(2)
      const catalog = yield* registry.catalog
      expect(catalog.relay.drtInstanceId).toBe(11n)
      expect(catalog.relay.relayIncarnation).toBe(7n)
      expect(catalog.pools.length).toBe(2)
      expect(descriptor(catalog, 1).servingEndpoint).toEqual(endpoint("fast.router.generate"))
      expect(catalog.pools.every((d) => d.registrations[0]!.model === "llama")).toBe(true)

      yield* registry.detach(first)
      yield* registry.detach(second)
    })
  )

  it.scoped("default_registry_materializes_publication_images_eagerly", () =>
    Effect.gen(function* () {
      const registry = yield* makeRegistry()
      const attachment = yield* registry.attach(request(pool(1), "fast.router.generate", "llama"))

      yield* attachment.actor.admitEvent(0, storedEventN(1))
      yield* attachment.actor.flush
      const stats = yield* attachment.actor.stateStats
      expect(stats.stats.publication.emittedImages).toBeGreaterThan(0)

      yield* registry.detach(attachment)
    })
  )

  it.scoped("burst_attach_defers_catalog_materialization_until_observed", () =>
    Effect.gen(function* () {
      const registry = yield* makeRegistry()
      const attachments: Array<PoolAttachment> = []
      for (let seed = 1; seed <= 32; seed++) {
        attachments.push(
          yield* registry.attach(request(pool(seed), `pool-${seed}.router.generate`, `model-${seed}`))
        )
      }

      const watched = yield* registry.catalogRef
      expect(watched.revision).toBe(32n)
      expect(watched.isMaterialized).toBe(false)

      const catalog = yield* registry.catalog
      const poolIds = catalog.pools.map((d) => d.producer.poolId)
      expect(catalog.isMaterialized).toBe(true)
      expect(poolIds.every((id, i) => i === 0 || poolIds[i - 1]!.compareTo(id) < 0)).toBe(true)
      const serialized = yield* Schema.encode(CatalogSnapshotJson)(catalog)
      expect(serialized.relay).toEqual({ drtInstanceId: "11", relayIncarnation: "7" })
      expect("processIncarnation" in serialized).toBe(false)
      expect(serialized.revision).toBe("32")
      expect(serialized.pools.length).toBe(32)

      yield* registry.shutdown
      expect(catalog.pools.length).toBe(attachments.length)
      expect((yield* registry.catalog).pools.length).toBe(0)
    })
  )

  it.scoped("catalog_publishes_and_preserves_generation_query_semantics", () =>
    Effect.gen(function* () {
      const registry = yield* makeRegistry()
      const expected = new KvQuerySemantics({ kvBlockSize: 128, hashFormat: "dynamo_eagle_v1" })
      const attachment = yield* registry.attach({
        ...request(pool(1), "fast.router.generate", "llama"),
        querySemantics: expected
      })
      const producer = attachment.identity

      const initial = descriptor(yield* registry.catalog, 1)
      expect(initial.producer.equals(producer)).toBe(true)
      expect(initial.querySemantics).toEqual(expected)

      yield* registry.replaceRegistrations(attachment, [
        baseRegistration(canonicalModelId("llama"), [modelAlias("chat")])
      ])
      const updated = descriptor(yield* registry.catalog, 1)
      expect(updated.producer.equals(producer)).toBe(true)
      expect(updated.querySemantics).toEqual(expected)

      yield* registry.detach(attachment)
    })
  )

  it.scoped("registration_updates_remain_pool_local", () =>
    Effect.gen(function* () {
      const registry = yield* makeRegistry()
      const first = yield* registry.attach(request(pool(1), "fast.router.generate", "llama"))
      const second = yield* registry.attach(request(pool(2), "slow.router.generate", "mistral"))

      yield* registry.replaceRegistrations(first, [
        baseRegistration(canonicalModelId("llama"), [modelAlias("mistral-alias")])
      ])
      let catalog = yield* registry.catalog
      expect(catalog.pools.every((d) => d.registrations[0]!.aliases[0] === "mistral-alias")).toBe(true)

      yield* registry.replaceRegistrations(second, [
        baseRegistration(canonicalModelId("mistral"), [modelAlias("llama-alias")])
      ])
      catalog = yield* registry.catalog
      expect(descriptor(catalog, 1).registrations[0]!.aliases).toEqual(["mistral-alias"])
      expect(descriptor(catalog, 2).registrations[0]!.aliases).toEqual(["llama-alias"])

      yield* registry.detach(first)
      yield* registry.detach(second)
    })
  )

  it.scoped("one_pool_cannot_be_owned_by_two_endpoints", () =>
    Effect.gen(function* () {
      const registry = yield* makeRegistry()
      const attachment = yield* registry.attach(request(pool(1), "first.router.generate", "llama"))

      const error = yield* Effect.flip(registry.attach(request(pool(1), "second.router.generate", "llama")))
      expect(error.message).toContain("already owned")

      yield* registry.detach(attachment)
    })
  )

  it.scoped("endpoint_reassignment_waits_for_prior_pool_removal", () =>
    Effect.gen(function* () {
      const registry = yield* makeRegistry()
      const endpointText = "fast.router.generate"
      const first = yield* registry.attach(request(pool(1), endpointText, "llama"))

      expect(yield* registry.withdraw(first.poolId, first.layoutGeneration, "Graceful")).toBe(true)
      expect((yield* registry.catalog).pools.length).toBe(0)

      const error = yield* Effect.flip(registry.attach(request(pool(2), endpointText, "llama")))
      expect(error.message).toContain("already assigned")
      expect((yield* registry.catalog).pools.length).toBe(0)

      yield* registry.detach(first)
      const second = yield* registry.attach(request(pool(2), endpointText, "llama"))
      const catalog = yield* registry.catalog
      expect(catalog.pools.length).toBe(1)
      expect(catalog.pools[0]!.producer.poolId.equals(pool(2))).toBe(true)
      expect(catalog.pools[0]!.servingEndpoint).toEqual(endpoint(endpointText))

      yield* registry.detach(second)
    })
  )

  it.scoped("cancelled_allocation_rolls_back_and_allows_reattach", () =>
    Effect.gen(function* () {
      const gate = yield* gatedBuilder
      const registry = yield* makeRegistry({ ckfBuilder: gate.builder })
      const attach = yield* Effect.fork(registry.attach(request(pool(1), "first.router.generate", "llama")))

      yield* Deferred.await(gate.started)
      const aborted = yield* Fiber.interrupt(attach)
      expect(Exit.isInterrupted(aborted)).toBe(true)
      expect(yield* registry.reservationCount).toBe(0)

      yield* Deferred.succeed(gate.release, undefined)
      yield* Deferred.await(gate.finished)
      const attachment = yield* registry.attach(request(pool(1), "second.router.generate", "llama"))
      yield* registry.detach(attachment)
    })
  )

  it.scoped("shutdown_during_allocation_never_publishes_the_pool", () =>
    Effect.gen(function* () {
      const gate = yield* gatedBuilder
      const registry = yield* makeRegistry({ ckfBuilder: gate.builder })
      const attach = yield* Effect.fork(registry.attach(request(pool(1), "first.router.generate", "llama")))

      yield* Deferred.await(gate.started)
      yield* registry.shutdown
      expect(yield* registry.reservationCount).toBe(0)
      expect((yield* registry.catalog).pools.length).toBe(0)

      yield* Deferred.succeed(gate.release, undefined)
      yield* Deferred.await(gate.finished)
      const error = failureOf(yield* Fiber.await(attach))
      expect(error.message).toContain("retired before commit")
      expect(yield* registry.poolCount).toBe(0)
      expect((yield* registry.catalog).pools.length).toBe(0)
    })
  )

  // The seed's property (the allocation runs off the executor) does not carry over: a CKF is
  // allocated synchronously on the event loop (docs/decisions.md, "CKF allocation runs on the
  // event loop, in one piece"). What the registry controls is that a build in progress, here held
  // on its gate, holds neither other fibers nor the registry's other work.
  it.scoped(
    "ckf_allocation_does_not_block_the_async_executor: while one attach waits on its CKF build, timers fire and another pool attaches",
    () =>
      Effect.gen(function* () {
        const gate = yield* gatedBuilder
        const registry = yield* makeRegistry({ ckfBuilder: gate.builder })
        const attach = yield* Effect.fork(registry.attach(request(pool(1), "first.router.generate", "llama")))

        yield* Deferred.await(gate.started)
        // A 1 ms timer fires while the allocation is still held on its gate.
        const sleeper = yield* Effect.fork(Effect.sleep("1 millis"))
        yield* TestClock.adjust("1 millis")
        expect(Exit.isSuccess(yield* Fiber.await(sleeper))).toBe(true)

        // Another pool's attach (its build is not gated) completes and is published meanwhile.
        let second: PoolAttachment | undefined
        yield* Effect.fork(
          registry.attach(request(pool(2), "second.router.generate", "mistral")).pipe(
            Effect.tap((attachment) =>
              Effect.sync(() => {
                second = attachment
              })
            )
          )
        )
        yield* waitUntil(() => second !== undefined, "another pool's attach during the held build")
        expect((yield* registry.catalog).pools.map((d) => d.producer.poolId.equals(pool(2)))).toEqual([true])
        expect(Option.isNone(yield* Fiber.poll(attach))).toBe(true)

        yield* Deferred.succeed(gate.release, undefined)
        yield* Deferred.await(gate.finished)
        const attachment = yield* Fiber.join(attach)
        expect((yield* registry.catalog).pools.length).toBe(2)
        yield* registry.detach(attachment)
        yield* registry.detach(second!)
      })
  )

  it.scoped("failed_actor_build_rolls_back_the_pool_reservation", () =>
    Effect.gen(function* () {
      const registry = yield* makeRegistry({ actorConfig: { ...config(), expectedUniqueBlocks: 0 } })

      const firstError = yield* Effect.flip(
        registry.attach(request(pool(1), "first.router.generate", "llama"))
      )
      const secondError = yield* Effect.flip(
        registry.attach(request(pool(1), "second.router.generate", "llama"))
      )

      expect(firstError.message).toContain("greater than zero")
      expect(secondError.message).toContain("greater than zero")
      expect(yield* registry.poolCount).toBe(0)
      expect((yield* registry.catalog).revision).toBe(0n)
    })
  )

  it.scoped("reattaching_a_pool_allocates_a_new_layout_generation", () =>
    Effect.gen(function* () {
      const registry = yield* makeRegistry()
      const first = yield* registry.attach(request(pool(1), "fast.router.generate", "llama"))
      const firstGeneration = first.layoutGeneration
      yield* registry.detach(first)

      const replacement = yield* registry.attach(request(pool(1), "fast.router.generate", "llama"))
      expect(replacement.layoutGeneration > firstGeneration).toBe(true)

      yield* registry.detach(replacement)
    })
  )

  it.scoped("relay_incarnation_fences_an_identical_pool_layout", () =>
    Effect.gen(function* () {
      const firstRegistry = yield* makeRegistry({ relayIdentity: relayIdentity(7n) })
      const secondRegistry = yield* makeRegistry({ relayIdentity: relayIdentity(8n) })
      const first = yield* firstRegistry.attach(request(pool(1), "fast.router.generate", "llama"))
      const second = yield* secondRegistry.attach(request(pool(1), "fast.router.generate", "llama"))

      expect(first.identity.equals(second.identity)).toBe(false)
      expect(first.layoutGeneration).toBe(second.layoutGeneration)

      yield* firstRegistry.detach(first)
      yield* secondRegistry.detach(second)
    })
  )

  it.scoped("withdraw_removes_catalog_before_actor_retirement", () =>
    Effect.gen(function* () {
      const registry = yield* makeRegistry()
      const attachment = yield* registry.attach(request(pool(1), "fast.router.generate", "llama"))

      expect(yield* registry.withdraw(attachment.poolId, attachment.layoutGeneration, "Graceful")).toBe(true)
      expect((yield* registry.catalog).pools.length).toBe(0)
      yield* attachment.actor.stateStats

      yield* registry.detach(attachment)
    })
  )

  it.scoped("adapter_registration_changes_without_replacing_pool_generation", () =>
    Effect.gen(function* () {
      const registry = yield* makeRegistry()
      const attachment = yield* registry.attach(request(pool(1), "fast.router.generate", "llama"))
      const generation = attachment.layoutGeneration
      const base = canonicalModelId("llama")
      const adapter = canonicalModelId("tenant-a")
      yield* registry.replaceRegistrations(attachment, [
        baseRegistration(base),
        withTarget(adapter, ModelTarget.Lora({ baseModel: base, adapter }), [])
      ])

      expect(attachment.layoutGeneration).toBe(generation)
      expect(descriptor(yield* registry.catalog, 1).registrations.some((r) => r.model === adapter)).toBe(true)
      yield* registry.detach(attachment)
    })
  )

  it.scoped("declared_role_change_updates_catalog_without_replacing_generation", () =>
    Effect.gen(function* () {
      const registry = yield* makeRegistry()
      const attachment = yield* registry.attach(request(pool(1), "fast.router.generate", "llama"))
      const producer = attachment.identity

      yield* registry.replaceRoles(attachment, ["decode"])
      const catalog = yield* registry.catalog
      expect(descriptor(catalog, 1).producer.equals(producer)).toBe(true)
      expect(descriptor(catalog, 1).poolRoles).toEqual(["decode"])

      expect(Exit.isFailure(yield* Effect.exit(registry.replaceRoles(attachment, [])))).toBe(true)
      expect(descriptor(yield* registry.catalog, 1).poolRoles).toEqual(["decode"])
      yield* registry.detach(attachment)
    })
  )

  it.scoped("one_lora_target_binds_to_independent_pools", () =>
    Effect.gen(function* () {
      const registry = yield* makeRegistry()
      const base = canonicalModelId("llama")
      const adapter = canonicalModelId("tenant-a")
      const registrations = () => [
        baseRegistration(base),
        withTarget(adapter, ModelTarget.Lora({ baseModel: base, adapter }), [])
      ]
      const first = yield* registry.attach({
        ...request(pool(1), "fast.router.generate", "llama"),
        registrations: registrations()
      })
      const second = yield* registry.attach({
        ...request(pool(2), "slow.router.generate", "llama"),
        registrations: registrations()
      })

      const catalog = yield* registry.catalog
      expect(catalog.pools.length).toBe(2)
      const lora = ModelTarget.Lora({ baseModel: base, adapter })
      expect(
        catalog.pools.every((d) =>
          d.registrations.some(
            (r) =>
              r.target._tag === "Lora" &&
              r.target.adapter === lora.adapter &&
              r.target.baseModel === lora.baseModel
          )
        )
      ).toBe(true)

      yield* registry.detach(first)
      yield* registry.detach(second)
    })
  )

  it.scoped("fencing_withdraws_pool_from_catalog", () =>
    Effect.gen(function* () {
      const registry = yield* makeRegistry()
      const attachment = yield* registry.attach(request(pool(1), "fast.router.generate", "llama"))
      yield* retire(registry, attachment, "Fenced")
      expect((yield* registry.catalogRef).pools.length).toBe(0)
    })
  )

  it.scoped("fencing_withdraws_only_the_target_pool_descriptor", () =>
    Effect.gen(function* () {
      const registry = yield* makeRegistry()
      const withAlias = yield* registry.attach(request(pool(1), "fast.router.generate", "llama"))
      const withoutAlias = yield* registry.attach({
        ...request(pool(2), "slow.router.generate", "llama"),
        registrations: [baseRegistration(canonicalModelId("llama"))]
      })

      let catalog = yield* registry.catalog
      expect(descriptor(catalog, 1).registrations[0]!.aliases.length).toBe(1)
      expect(descriptor(catalog, 2).registrations[0]!.aliases.length).toBe(0)
      yield* retire(registry, withAlias, "Fenced")
      catalog = yield* registry.catalog
      expect(catalog.pools.length).toBe(1)
      expect(catalog.pools[0]!.producer.poolId.equals(pool(2))).toBe(true)
      expect(catalog.pools[0]!.registrations[0]!.aliases.length).toBe(0)

      yield* registry.detach(withoutAlias)
    })
  )

  it.scoped("publication_hub_is_lazy_and_shared_by_concurrent_subscribers", () =>
    Effect.gen(function* () {
      const registry = yield* makeRegistry()
      const attachment = yield* registry.attach(request(pool(1), "fast.router.generate", "llama"))
      const producer = attachment.identity
      const hub = hubPhase(registry, 1)
      expect(hub.phaseName).toBe("vacant")

      const tasks = yield* Effect.forEach(Array.from({ length: 8 }), () =>
        Effect.fork(subscribeOk(registry, producer))
      )
      const subscriptions = yield* Effect.forEach(tasks, Fiber.join)
      for (const { subscription } of subscriptions) {
        expect(subscription.snapshot!.identity.equals(producer)).toBe(true)
      }
      expect(hub.phaseName).toBe("ready")

      yield* Effect.forEach(subscriptions, ({ scope }) => drop(scope))
      yield* registry.detach(attachment)
      expect(hub.phaseName).toBe("retired")
    })
  )

  it.scoped("initialized_hub_limit_protects_active_hubs_and_reclaims_idle_hubs", () =>
    Effect.gen(function* () {
      const registry = yield* makeRegistry({ maxInitializedPoolHubs: 1 })
      const first = yield* registry.attach(request(pool(1), "fast.router.generate", "llama"))
      const second = yield* registry.attach(request(pool(2), "slow.router.generate", "llama"))
      const firstHub = hubPhase(registry, 1)
      const secondHub = hubPhase(registry, 2)

      const firstSubscription = yield* subscribeOk(registry, first.identity)
      const error = yield* subscribeError(registry, second.identity)
      expect(error).toMatchObject({ _tag: "InitializedHubLimit", limit: 1 })

      yield* drop(firstSubscription.scope)
      const secondSubscription = yield* subscribeOk(registry, second.identity)
      expect(firstHub.phaseName).toBe("vacant")
      expect(secondHub.phaseName).toBe("ready")
      const catalog = yield* registry.catalog
      expect(catalog.pools.length).toBe(2)
      expect(catalog.pools.some((d) => d.producer.poolId.equals(first.poolId))).toBe(true)
      expect(catalog.pools.some((d) => d.producer.poolId.equals(second.poolId))).toBe(true)

      yield* drop(secondSubscription.scope)
      const reopenedFirst = yield* subscribeOk(registry, first.identity)
      expect(firstHub.phaseName).toBe("ready")
      expect(secondHub.phaseName).toBe("vacant")

      yield* drop(reopenedFirst.scope)
      yield* registry.detach(first)
      yield* registry.detach(second)
    })
  )

  it.scoped("pending_admission_prevents_idle_hub_eviction", () =>
    Effect.gen(function* () {
      const registry = yield* makeRegistry({ maxInitializedPoolHubs: 1 })
      const first = yield* registry.attach(request(pool(1), "fast.router.generate", "llama"))
      const second = yield* registry.attach(request(pool(2), "slow.router.generate", "llama"))
      const firstHub = hubPhase(registry, 1)

      const firstSubscription = yield* subscribeOk(registry, first.identity)
      yield* drop(firstSubscription.scope)
      const pendingAdmission = yield* firstHub.beginAdmission()

      const error = yield* subscribeError(registry, second.identity)
      expect(error).toMatchObject({ _tag: "InitializedHubLimit", limit: 1 })
      expect(firstHub.phaseName).toBe("ready")

      pendingAdmission.release()
      const secondSubscription = yield* subscribeOk(registry, second.identity)
      expect(firstHub.phaseName).toBe("vacant")

      yield* drop(secondSubscription.scope)
      yield* registry.detach(first)
      yield* registry.detach(second)
    })
  )

  it.scoped("concurrent_pressure_claims_one_idle_victim", () =>
    Effect.gen(function* () {
      const evictionGate = yield* Deferred.make<void>()
      const registry = yield* makeRegistry({
        maxInitializedPoolHubs: 1,
        evictionGate: Deferred.await(evictionGate)
      })
      const first = yield* registry.attach(request(pool(1), "first.router.generate", "llama"))
      const second = yield* registry.attach(request(pool(2), "second.router.generate", "llama"))
      const third = yield* registry.attach(request(pool(3), "third.router.generate", "llama"))
      const firstHub = hubPhase(registry, 1)

      const subscription = yield* subscribeOk(registry, first.identity)
      yield* drop(subscription.scope)
      const secondSubscribe = yield* Effect.fork(subscribeOk(registry, second.identity))
      yield* waitUntil(
        () => firstHub.phaseName === "evicting",
        "the first pressure request claims the idle hub"
      )

      const thirdSubscribe = yield* Effect.fork(subscribeError(registry, third.identity))
      yield* Deferred.succeed(evictionGate, undefined)

      const secondSubscription = yield* Fiber.join(secondSubscribe)
      const thirdError = yield* Fiber.join(thirdSubscribe)
      expect(thirdError).toMatchObject({ _tag: "InitializedHubLimit", limit: 1 })
      expect(firstHub.phaseName).toBe("vacant")
      expect(registry.availableHubCapacity()).toBe(0)

      yield* drop(secondSubscription.scope)
      yield* registry.detach(first)
      yield* registry.detach(second)
      yield* registry.detach(third)
      expect(registry.availableHubCapacity()).toBe(1)
    })
  )

  it.scoped("generation_retirement_wins_idle_eviction_race", () =>
    Effect.gen(function* () {
      const evictionGate = yield* Deferred.make<void>()
      const registry = yield* makeRegistry({
        maxInitializedPoolHubs: 1,
        evictionGate: Deferred.await(evictionGate)
      })
      const first = yield* registry.attach(request(pool(1), "first.router.generate", "llama"))
      const second = yield* registry.attach(request(pool(2), "second.router.generate", "llama"))
      const firstHub = hubPhase(registry, 1)

      const subscription = yield* subscribeOk(registry, first.identity)
      yield* drop(subscription.scope)
      const secondSubscribe = yield* Effect.fork(subscribeOk(registry, second.identity))
      yield* waitUntil(() => firstHub.phaseName === "evicting", "the pressure request claims the idle hub")

      expect(
        yield* registry.fenceGeneration(
          first.poolId,
          first.layoutGeneration,
          "test retirement during idle eviction"
        )
      ).toBe(true)
      yield* Deferred.succeed(evictionGate, undefined)

      const secondSubscription = yield* Fiber.join(secondSubscribe)
      yield* waitUntil(() => firstHub.phaseName === "retired", "the retired generation leaves the idle cache")

      yield* drop(secondSubscription.scope)
      yield* registry.detach(first)
      yield* registry.detach(second)
      expect(registry.availableHubCapacity()).toBe(1)
    })
  )

  it.scoped("requester_retirement_does_not_abandon_claimed_idle_eviction", () =>
    Effect.gen(function* () {
      const evictionGate = yield* Deferred.make<void>()
      const registry = yield* makeRegistry({
        maxInitializedPoolHubs: 1,
        evictionGate: Deferred.await(evictionGate)
      })
      const first = yield* registry.attach(request(pool(1), "first.router.generate", "llama"))
      const second = yield* registry.attach(request(pool(2), "second.router.generate", "llama"))
      const third = yield* registry.attach(request(pool(3), "third.router.generate", "llama"))
      const firstHub = hubPhase(registry, 1)
      const secondHub = hubPhase(registry, 2)

      const subscription = yield* subscribeOk(registry, first.identity)
      yield* drop(subscription.scope)
      const secondSubscribe = yield* Effect.fork(subscribeError(registry, second.identity))
      yield* waitUntil(() => firstHub.phaseName === "evicting", "the pressure request claims the idle hub")

      expect(
        yield* registry.fenceGeneration(
          second.poolId,
          second.layoutGeneration,
          "test requester retirement during idle eviction"
        )
      ).toBe(true)
      const secondError = yield* Fiber.join(secondSubscribe)
      expect(secondError._tag).toBe("PublicationUnavailable")
      yield* waitUntil(() => secondHub.phaseName === "retired", "the requester slot finishes retirement")
      expect(firstHub.phaseName).toBe("evicting")

      yield* Deferred.succeed(evictionGate, undefined)
      yield* waitUntil(
        () => firstHub.phaseName === "vacant" && registry.availableHubCapacity() === 1,
        "the detached cleanup releases the idle victim and its capacity"
      )

      const thirdSubscription = yield* subscribeOk(registry, third.identity)
      expect(registry.availableHubCapacity()).toBe(0)

      yield* drop(thirdSubscription.scope)
      yield* registry.detach(first)
      yield* registry.detach(second)
      yield* registry.detach(third)
      expect(registry.availableHubCapacity()).toBe(1)
    })
  )

  it.scoped("terminal_hub_failure_withdraws_catalog_and_load_visibility", () =>
    Effect.gen(function* () {
      const encodingPermits = makeEncodingPermits(1)
      const registry = yield* makeRegistry({ publication: { encodingPermits } })
      const attachment = yield* registry.attach(request(pool(1), "fast.router.generate", "llama"))
      const { subscription } = yield* subscribeOk(registry, attachment.identity)
      expect((yield* registry.catalog).pools.length).toBe(1)
      expect((yield* registry.loadSnapshots).length).toBe(1)

      yield* encodingPermits.close
      yield* attachment.actor.admitEvent(0, storedEventN(1))
      yield* attachment.actor.flush
      yield* waitUntil(
        () => attachment.poolCancel.isCancelled,
        "the terminal publication failure withdraws the generation"
      )
      expect((yield* registry.catalog).pools.length).toBe(0)
      expect((yield* registry.loadSnapshots).length).toBe(0)
      expect(Exit.isFailure(yield* Effect.exit(subscription.recv))).toBe(true)

      yield* registry.detach(attachment)
    })
  )

  it.scoped("stale_generation_cannot_fence_or_initialize_replacement_hub", () =>
    Effect.gen(function* () {
      const registry = yield* makeRegistry()
      const first = yield* registry.attach(request(pool(1), "fast.router.generate", "llama"))
      const staleGeneration = first.layoutGeneration
      const staleProducer = first.identity
      yield* registry.detach(first)

      const replacement = yield* registry.attach(request(pool(1), "fast.router.generate", "llama"))
      const currentProducer = replacement.identity
      const currentHub = hubPhase(registry, 1)
      expect(staleProducer.equals(currentProducer)).toBe(false)

      expect(
        yield* registry.fenceGeneration(replacement.poolId, staleGeneration, "stale terminal callback")
      ).toBe(false)
      expect(replacement.poolCancel.isCancelled).toBe(false)
      expect((yield* registry.catalog).pools.length).toBe(1)

      const mismatch = yield* Effect.flip(registry.validateActiveProducer(staleProducer))
      expect(mismatch._tag).toBe("ProducerMismatch")
      expect(mismatch.poolId.equals(replacement.poolId)).toBe(true)
      const currentGeneration = yield* registry.validateActiveProducer(currentProducer)
      expect(currentGeneration.isCancelled).toBe(false)

      const error = yield* subscribeError(registry, staleProducer)
      expect(error._tag).toBe("ProducerMismatch")
      expect(error._tag === "ProducerMismatch" && error.poolId.equals(replacement.poolId)).toBe(true)
      expect(currentHub.phaseName).toBe("vacant")

      const { subscription, scope } = yield* subscribeOk(registry, currentProducer)
      expect(subscription.snapshot!.identity.equals(currentProducer)).toBe(true)
      expect(currentHub.phaseName).toBe("ready")
      yield* drop(scope)
      yield* registry.detach(replacement)
      expect(currentGeneration.isCancelled).toBe(true)
    })
  )

  it.scoped("publication_source_streams_snapshot_before_concurrent_delta", () =>
    Effect.gen(function* () {
      const registry = yield* makeRegistry()
      const attachment = yield* registry.attach(request(pool(1), "fast.router.generate", "llama"))
      const producer = attachment.identity
      const source = yield* PublicationSource.make(registry, {
        maxActiveStreams: 2,
        encodingPermits: makeEncodingPermits(2),
        snapshotProgressTimeout: "1 second"
      })
      const streamScope = yield* Scope.make()
      const stream = yield* source.subscribePool(producer, "test").pipe(Scope.extend(streamScope))

      // The hand-over race: a delta published before the snapshot is consumed must still follow it.
      yield* attachment.actor.admitEvent(0, storedEventN(1))
      yield* attachment.actor.flush

      const [snapshot, delta] = Array.from(yield* Stream.runCollect(Stream.take(stream, 2)))
      expect(snapshot!.kind).toBe("SnapshotChunk")
      expect(snapshot!.identity.equals(producer)).toBe(true)
      expect(snapshot!.baseSequence).toBe(snapshot!.sequence)
      expect(delta!.kind).toBe("Delta")
      expect(delta!.identity.equals(producer)).toBe(true)
      expect(delta!.baseSequence).toBe(snapshot!.sequence)
      expect(delta!.sequence).toBe(snapshot!.sequence + 1n)

      yield* source.shutdown
      yield* source.awaitShutdown
      yield* drop(streamScope)
      yield* registry.detach(attachment)
    })
  )

  it.scoped("publication_source_limit_and_retirement_are_generation_safe", () =>
    Effect.gen(function* () {
      const registry = yield* makeRegistry()
      const first = yield* registry.attach(request(pool(1), "fast.router.generate", "llama"))
      const staleProducer = first.identity
      const source = yield* PublicationSource.make(registry, {
        maxActiveStreams: 1,
        encodingPermits: makeEncodingPermits(2),
        snapshotProgressTimeout: "1 second"
      })
      const staleScope = yield* Scope.make()
      const staleStream = yield* source.subscribePool(staleProducer, "stale").pipe(Scope.extend(staleScope))

      const limited = yield* Effect.flip(source.subscribePool(staleProducer, "second").pipe(Effect.scoped))
      expect(limited.kind).toBe("ResourceExhausted")

      yield* registry.detach(first)
      const pull = yield* Stream.toPull(staleStream).pipe(Scope.extend(staleScope))
      const retired = yield* Effect.flip(pull)
      expect(Option.isSome(retired)).toBe(true)
      expect(["Unavailable", "ResourceExhausted"]).toContain(Option.getOrThrow(retired).kind)
      yield* drop(staleScope)

      const replacement = yield* registry.attach(request(pool(1), "fast.router.generate", "llama"))
      const currentProducer = replacement.identity
      expect(staleProducer.equals(currentProducer)).toBe(false)
      const staleError = yield* Effect.flip(source.subscribePool(staleProducer, "stale").pipe(Effect.scoped))
      expect(staleError.kind).toBe("ProducerMismatch")
      const currentScope = yield* Scope.make()
      yield* source.subscribePool(currentProducer, "current").pipe(Scope.extend(currentScope))

      yield* source.shutdown
      yield* source.awaitShutdown
      yield* drop(currentScope)
      yield* registry.detach(replacement)
    })
  )

  it.scoped("retirement_cancels_in_flight_hub_initialization", () =>
    Effect.gen(function* () {
      const initializationGate = yield* Deferred.make<void>()
      const registry = yield* makeRegistry({
        publication: { initializationGate: Deferred.await(initializationGate) }
      })
      const attachment = yield* registry.attach(request(pool(1), "fast.router.generate", "llama"))
      const producer = attachment.identity
      const hub = hubPhase(registry, 1)
      const subscriber = yield* Effect.fork(subscribe(registry, producer))

      yield* waitUntil(() => hub.phaseName === "initializing", "hub initialization starts")
      yield* registry.detach(attachment)

      expect(Exit.isFailure((yield* Fiber.join(subscriber)).exit)).toBe(true)
      expect(hub.phaseName).toBe("retired")
      expect(yield* registry.poolCount).toBe(0)
      expect((yield* registry.catalog).pools.length).toBe(0)
    })
  )

  it.scoped("cancellation_after_actor_snapshot_retires_the_publication_lease", () =>
    Effect.gen(function* () {
      const postSnapshotGate = yield* Deferred.make<void>()
      const registry = yield* makeRegistry({
        publication: { postSnapshotGate: Deferred.await(postSnapshotGate) }
      })
      const attachment = yield* registry.attach(request(pool(1), "fast.router.generate", "llama"))
      const producer = attachment.identity
      const hub = hubPhase(registry, 1)
      const subscriber = yield* Effect.fork(subscribe(registry, producer))

      yield* waitUntil(() => hub.phaseName === "initializing", "hub initialization starts")

      let eventId = 1
      for (;;) {
        yield* attachment.actor.admitEvent(0, storedEventN(eventId))
        yield* attachment.actor.flush
        if ((yield* attachment.actor.stateStats).sequence > 0n) break
        eventId++
        if (eventId > 1_000)
          return yield* Effect.dieMessage("the actor publication lease never became active")
        yield* Effect.yieldNow()
      }

      attachment.poolCancel.cancel()
      expect(Exit.isFailure((yield* Fiber.join(subscriber)).exit)).toBe(true)
      yield* waitUntil(() => hub.phaseName === "retired", "the cancelled hub initialization retires")

      const sequenceBefore = (yield* attachment.actor.stateStats).sequence
      yield* attachment.actor.admitEvent(0, storedEventN(eventId + 1))
      yield* attachment.actor.flush
      const sequenceAfter = (yield* attachment.actor.stateStats).sequence
      expect(sequenceAfter).toBe(sequenceBefore)

      yield* registry.detach(attachment)
    })
  )

  it.scoped("local_only_pool_publishes_no_serving_facts", () =>
    Effect.gen(function* () {
      const registry = yield* makeRegistry()
      const attachment = yield* registry.attach({
        ...request(pool(1), "fast.router.generate", "llama"),
        servingFacts: undefined
      })

      expect((yield* registry.catalog).pools.length).toBe(1)
      expect((yield* registry.loadSnapshots).length).toBe(0)
      expect(
        yield* registry.replaceLoadCapacity(attachment.poolId, attachment.layoutGeneration, new Map())
      ).toBe(false)
      expect(
        yield* registry.observeLoad(attachment.poolId, attachment.layoutGeneration, {
          workerId: "0",
          dpRank: 0
        })
      ).toBe(false)

      yield* attachment.actor.stateStats
      yield* registry.detach(attachment)
    })
  )

  it.scoped("invalid_load_capacity_does_not_block_pool_attach", () =>
    Effect.gen(function* () {
      const registry = yield* makeRegistry()
      const attachment = yield* registry.attach({
        ...request(pool(1), "fast.router.generate", "llama"),
        servingFacts: {
          runtimeConfigs: new Map([["1", runtimeConfig({ dataParallelSize: 0, totalKvBlocks: 100n })]])
        }
      })

      expect((yield* registry.catalog).pools.length).toBe(1)
      const snapshots = yield* registry.loadSnapshots
      expect(snapshots.length).toBe(1)
      expect(snapshots[0]!.kvUsedBlocks).toBeUndefined()
      expect(snapshots[0]!.totalKvBlocks).toBeUndefined()
      expect(snapshots[0]!.kvExpectedRanks).toBe(0)
      expect(hasDegradedCoverage(snapshots[0]!)).toBe(true)

      yield* registry.detach(attachment)
    })
  )

  it.scoped("scheduler_only_load_is_accepted_without_changing_snapshot", () =>
    Effect.gen(function* () {
      const registry = yield* makeRegistry()
      const attachment = yield* registry.attach({
        ...request(pool(1), "fast.router.generate", "llama"),
        servingFacts: { runtimeConfigs: new Map([["1", runtimeConfig({ totalKvBlocks: 100n })]]) }
      })
      const before = yield* registry.loadSnapshots
      const watched = yield* registry.loadRef

      expect(
        yield* registry.observeLoad(attachment.poolId, attachment.layoutGeneration, {
          workerId: "1",
          dpRank: 0,
          activeDecodeBlocks: 30n,
          activePrefillTokens: 512n
        })
      ).toBe(true)

      expect(yield* registry.loadSnapshots).toEqual(before)
      // `has_changed() == false`: the watched value is the very same list.
      expect(yield* registry.loadRef).toBe(watched)
      yield* registry.detach(attachment)
    })
  )

  it.scoped("invalid_capacity_refresh_withdraws_authoritative_load_snapshot", () =>
    Effect.gen(function* () {
      const registry = yield* makeRegistry()
      const attachment = yield* registry.attach({
        ...request(pool(1), "fast.router.generate", "llama"),
        servingFacts: { runtimeConfigs: new Map([["1", runtimeConfig({ totalKvBlocks: 100n })]]) }
      })
      expect(
        yield* registry.observeLoad(attachment.poolId, attachment.layoutGeneration, {
          workerId: "1",
          dpRank: 0,
          kvUsedBlocks: 40n
        })
      ).toBe(true)
      expect(hasDegradedCoverage((yield* registry.loadSnapshots)[0]!)).toBe(false)
      const watched = yield* registry.loadRef

      const error = yield* Effect.flip(
        registry.replaceLoadCapacity(
          attachment.poolId,
          attachment.layoutGeneration,
          new Map([["1", runtimeConfig({ dataParallelSize: 0, totalKvBlocks: 100n })]])
        )
      )
      expect(error.message).toContain("zero data_parallel_size")
      const snapshots = yield* registry.loadRef
      expect(snapshots).not.toBe(watched)

      expect(snapshots.length).toBe(1)
      expect(snapshots[0]!.kvUsedBlocks).toBeUndefined()
      expect(snapshots[0]!.totalKvBlocks).toBeUndefined()
      expect(snapshots[0]!.kvExpectedRanks).toBe(0)
      expect(hasDegradedCoverage(snapshots[0]!)).toBe(true)
      expect((yield* registry.catalog).pools.length).toBe(1)

      yield* registry.detach(attachment)
    })
  )

  it.scoped("load_is_generation_scoped_and_withdrawn_with_the_pool", () =>
    Effect.gen(function* () {
      const registry = yield* makeRegistry()
      const attachment = yield* registry.attach({
        poolId: pool(1),
        endpoint: endpoint("fast.router.generate"),
        registrations: [registration("llama")],
        querySemantics: querySemantics(),
        roles: ["aggregated"],
        servingFacts: {
          runtimeConfigs: new Map([
            ["1", runtimeConfig({ totalKvBlocks: 100n, maxNumBatchedTokens: 2_048n })]
          ])
        }
      })
      const oldGeneration = attachment.layoutGeneration
      const oldProducer = attachment.identity

      const initialLoad = yield* registry.loadSnapshots
      expect(initialLoad.length).toBe(1)
      expect(initialLoad[0]!.kvExpectedRanks).toBe(1)
      expect(initialLoad[0]!.kvObservedRanks).toBe(0)
      expect(initialLoad[0]!.kvUsedBlocks).toBeUndefined()
      expect(initialLoad[0]!.totalKvBlocks).toBe(100n)
      expect(hasDegradedCoverage(initialLoad[0]!)).toBe(true)

      expect(
        yield* registry.observeLoad(pool(1), oldGeneration, {
          workerId: "1",
          dpRank: 0,
          kvUsedBlocks: 40n,
          activeDecodeBlocks: 30n,
          activePrefillTokens: 512n
        })
      ).toBe(true)
      const observed = (yield* registry.loadSnapshots)[0]!
      expect(observed.kvUsedBlocks).toBe(40n)
      expect(observed.totalKvBlocks).toBe(100n)
      expect(hasDegradedCoverage(observed)).toBe(false)

      expect(yield* registry.withdraw(pool(1), oldGeneration, "Graceful")).toBe(true)
      expect((yield* registry.loadSnapshots).length).toBe(0)
      expect(
        yield* registry.observeLoad(pool(1), oldGeneration, { workerId: "1", dpRank: 0, kvUsedBlocks: 99n })
      ).toBe(false)
      yield* registry.detach(attachment)

      const replacement = yield* registry.attach(request(pool(1), "fast.router.generate", "llama"))
      expect(replacement.layoutGeneration).not.toBe(oldGeneration)
      expect(replacement.identity.equals(oldProducer)).toBe(false)
      expect(
        yield* registry.replaceLoadCapacity(
          pool(1),
          oldGeneration,
          new Map([["1", runtimeConfig({ totalKvBlocks: 999n })]])
        )
      ).toBe(false)
      expect((yield* registry.loadSnapshots)[0]!.kvExpectedRanks).toBe(0)
      yield* registry.detach(replacement)
    })
  )
})
