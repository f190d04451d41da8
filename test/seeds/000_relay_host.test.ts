/**
 * Seed 000 (`kv_dc_relay/host.rs`): the host tests. The pending-fault tests are in
 * `000_fault_coalescing.test.ts`, the registry retirement tests in `000_registry_retirement.test.ts`.
 *
 * The seed's catalog-transition tests run a process-local Dynamo runtime; here the slot reads a
 * file-discovery document and the sources are real ZeroMQ publishers on 127.0.0.1. The
 * assertions are the seed's.
 */

import * as NodeFileSystem from "@effect/platform-node/NodeFileSystem"
import { describe, expect, it } from "@effect/vitest"
import { Deferred, Effect, Exit, Fiber, FiberSet, SubscriptionRef } from "effect"
import { CacheSemanticsId, DcId, IndexerDomainId, PoolId, RoutingScopeId } from "../../src/ckf/identity.js"
import { Discovery, emptySnapshot, makeStaticDiscovery } from "../../src/discovery/Discovery.js"
import { WATCH_ALL } from "../../src/discovery/DiscoveryConfig.js"
import { makeFileDiscovery } from "../../src/discovery/FileDiscovery.js"
import {
  type DcMembershipView,
  type EndpointMembership,
  emptyMembershipView,
  isMaterializable
} from "../../src/discovery/Membership.js"
import { projectMembership } from "../../src/discovery/MembershipProjection.js"
import type { KvEventSource, ModelCardInstance } from "../../src/protocol/Discovery.js"
import type { ResolvedIndexerDomain } from "../../src/protocol/Identity.js"
import {
  baseRegistration,
  canonicalModelId,
  type DcPoolDescriptor,
  KvQuerySemantics
} from "../../src/protocol/Model.js"
import * as EndpointSlot from "../../src/relay/EndpointSlot.js"
import type { DcPoolCatalog } from "../../src/relay/PoolCatalog.js"
import * as RelayHost from "../../src/relay/RelayHost.js"
import { makeDynamoZmqPublisher } from "../../src/simulate/DynamoZmqPublisher.js"
import { makeZmqEventTransport } from "../../src/transport/ZmqEventTransport.js"
import { card } from "../discovery/fixtures.js"
import { awaitCatalog, discoveryFile } from "../relay/hostFixtures.js"
import { endpoint, registry as makeRegistry } from "../relay/registryFixtures.js"

const digest = (byte: number) => new Uint8Array(16).fill(byte & 0xff)

/** `domain(seed, artifact)`: explicit cache semantics [seed; 16], routing scope [seed + 1; 16]. */
const domain = (seed: number): ResolvedIndexerDomain => ({
  id: new IndexerDomainId(
    new CacheSemanticsId(digest(seed), "explicit"),
    new RoutingScopeId(digest(seed + 1), "explicit")
  ),
  querySemantics: new KvQuerySemantics({ kvBlockSize: 64, hashFormat: "dynamo_standard_v1" })
})

/** The seed's `membership(endpoint, domain)`: one `llama` registration, no workers, no conflicts. */
const membership = (text: string, resolved: ResolvedIndexerDomain): EndpointMembership => {
  const id = endpoint(text)
  return {
    endpoint: id,
    key: id.toString(),
    generation: 1,
    domain: resolved,
    namespace: id.namespace,
    registrations: [baseRegistration(canonicalModelId("llama"))],
    models: ["llama"],
    aliases: [],
    roles: [],
    runtimeConfigs: new Map(),
    workerTopology: new Map(),
    adapters: new Map(),
    conflicts: []
  }
}

const models = (descriptor: DcPoolDescriptor) => descriptor.registrations.map((r) => r.model as string)

/** No catalog may show `model` under `producer` (a new model under the old producer). */
const showsModelUnder = (catalog: DcPoolCatalog, descriptor: DcPoolDescriptor, model: string) =>
  catalog.pools.some((d) => d.producer.equals(descriptor.producer) && models(d).includes(model))

const WORKER = "7001"
const SERVING = "relay-test.backend.generate"

/** The seed's `projected_membership_with_metadata`: one worker's base card, projected. */
const projectedCard = (options: {
  readonly model: string
  readonly artifact: string
  readonly kvStateEndpoint: string
  readonly aliases?: ReadonlyArray<string>
  readonly contextLength?: number
}): ModelCardInstance =>
  card({
    endpoint: SERVING,
    worker: WORKER,
    name: options.model,
    sourcePath: options.artifact,
    blockSize: 64,
    aliases: options.aliases ?? [],
    runtime: {
      dataParallelStartRank: 0,
      dataParallelSize: 1,
      enableLocalIndexer: true,
      kvStateEndpoint: options.kvStateEndpoint,
      ...(options.contextLength === undefined ? {} : { contextLength: options.contextLength })
    }
  })

/** Projects `cards` after `previous`, so generations advance as the watch loop assigns them. */
const project = (
  cards: ReadonlyArray<ModelCardInstance>,
  previous?: ReturnType<typeof projectMembership>
) => {
  const projection = projectMembership(cards, {
    scope: WATCH_ALL,
    ...(previous === undefined ? {} : { previous: previous.view, nextGeneration: previous.nextGeneration })
  })
  return { projection, membership: projection.view.endpoints.get(SERVING)! }
}

/** A live-only Dynamo publisher of worker 7001 rank 0 advertised under `kvStateEndpoint`. */
const liveSource = (kvStateEndpoint: string) =>
  Effect.gen(function* () {
    const publisher = yield* makeDynamoZmqPublisher({ workerId: WORKER, dpRank: 0 })
    return yield* publisher.source(endpoint(kvStateEndpoint), { recoverable: false })
  })

/** `run_endpoint_slot` over a file-discovery document with these sources. */
const startSlot = (sources: ReadonlyArray<KvEventSource>, initial: EndpointMembership) =>
  Effect.gen(function* () {
    const file = yield* discoveryFile([], sources)
    const discovery = yield* makeFileDiscovery({ path: file.path })
    const registry = yield* makeRegistry()
    const metadata = yield* SubscriptionRef.make<EndpointMembership | undefined>(initial)
    const stop = yield* Deferred.make<void>()
    const status = new EndpointSlot.EndpointSlotStatus(endpoint(SERVING))
    const slot = yield* EndpointSlot.run({
      endpoint: endpoint(SERVING),
      dcId: new DcId(7n),
      registry,
      membership: metadata,
      stop,
      status,
      rebuildPermit: yield* Effect.makeSemaphore(1),
      recoverySemaphore: yield* Effect.makeSemaphore(1),
      recoveryAttemptTimeout: "1 second",
      eventTransport: makeZmqEventTransport()
    }).pipe(Effect.provideService(Discovery, discovery), Effect.fork)
    /** `slot_cancel.cancel()` and the bounded join of the slot task. */
    const shutdown = Effect.gen(function* () {
      yield* Deferred.succeed(stop, undefined)
      const exit = yield* Fiber.await(slot).pipe(Effect.timeout("5 seconds"), Effect.orDie)
      expect(Exit.isSuccess(exit)).toBe(true)
      expect(status.lifecycle).toBe("lightweight")
    })
    return { registry, metadata, status, shutdown }
  }).pipe(Effect.provide(NodeFileSystem.layer))

describe("seed 000: relay host", () => {
  it.scoped("departed_endpoint_slots_are_reaped_instead_of_parked", () =>
    Effect.gen(function* () {
      const slotId = endpoint("prod.backend.generate")
      const stop = yield* Deferred.make<void>()
      // The seed's task: `while metadata_rx.changed().await.is_ok() {}` (ends once the sender goes).
      const task = yield* Effect.fork(Deferred.await(stop))
      const slots = new Map<string, RelayHost.EndpointSlotTask>([
        [
          slotId.toString(),
          {
            endpoint: slotId,
            metadata: yield* SubscriptionRef.make<EndpointMembership | undefined>(undefined),
            stop,
            status: new EndpointSlot.EndpointSlotStatus(slotId),
            fiber: task
          }
        ]
      ])
      const retiredSlots = yield* FiberSet.make<RelayHost.RetiredEndpointSlot>()

      const reapers = yield* RelayHost.retireDepartedEndpointSlots(emptyMembershipView, slots, retiredSlots)

      expect(slots.size).toBe(0)
      expect(reapers).toHaveLength(1)
      const [retiredSlot, result] = yield* Fiber.join(reapers[0]!)
      expect(retiredSlot).toEqual(slotId)
      expect(Exit.isSuccess(result)).toBe(true)
      // Reaped: nothing is left parked in the set.
      yield* FiberSet.awaitEmpty(retiredSlots)
      expect(yield* FiberSet.size(retiredSlots)).toBe(0)
    })
  )

  it.scoped("repeated_relay_start_separates_drt_identity_from_relay_incarnation", () =>
    Effect.gen(function* () {
      const discovery = yield* makeStaticDiscovery(emptySnapshot(1n))
      const config: RelayHost.RelayHostConfig = {
        dcName: "test-dc",
        drtInstanceId: 4242n,
        eventTransport: makeZmqEventTransport()
      }
      const start = Effect.gen(function* () {
        const relay = yield* RelayHost.start(config)
        const identity = (yield* SubscriptionRef.get(relay.catalogRef)).relay
        yield* relay.shutdown
        return identity
      }).pipe(Effect.scoped, Effect.provideService(Discovery, discovery))

      const first = yield* start
      const second = yield* start

      expect(first.drtInstanceId).toBe(second.drtInstanceId)
      expect(first.relayIncarnation).not.toBe(second.relayIncarnation)
      expect(first.relayIncarnation >= 0n && first.relayIncarnation < 1n << 63n).toBe(true)
    })
  )

  it("duplicate_pool_owners_are_all_fenced_and_make_health_unhealthy", () => {
    const shared = domain(1)
    const first = membership("prod.backend.fast", shared)
    const second = membership("prod.backend.slow", shared)
    const view: DcMembershipView = {
      endpoints: new Map([
        [first.key, first],
        [second.key, second]
      ])
    }

    const fenced = RelayHost.rejectDuplicateLivePools(view, new DcId(7n))
    expect(fenced.endpoints.size).toBe(2)
    for (const m of fenced.endpoints.values()) {
      expect(isMaterializable(m)).toBe(false)
      expect(EndpointSlot.inactiveSlotLifecycle(m)).toBe("fenced")
    }

    const statuses = [...fenced.endpoints.values()].map((m) => {
      const status = new EndpointSlot.EndpointSlotStatus(m.endpoint)
      status.lifecycle = EndpointSlot.inactiveSlotLifecycle(m)
      status.membership = m
      return status
    })
    const health = RelayHost.relayHealth(statuses, false)
    expect(health.healthy).toBe(false)
    expect(health.fencedEndpointCount).toBe(2)
    expect(health.activeEndpointCount).toBe(0)
  })

  it.scoped("binding_change_never_publishes_new_model_with_old_producer", () =>
    Effect.gen(function* () {
      const registry = yield* makeRegistry()
      const oldDomain = domain(1)
      const newDomain = domain(3)
      const oldBinding: EndpointSlot.ActorBinding = {
        domain: oldDomain,
        kvStateEndpoint: endpoint("prod.backend.old-kv")
      }
      const desiredBinding: EndpointSlot.ActorBinding = {
        domain: newDomain,
        kvStateEndpoint: endpoint("prod.backend.new-kv")
      }
      const attach = (resolved: ResolvedIndexerDomain, model: string) =>
        registry.attach({
          poolId: new PoolId(resolved.id, new DcId(7n)),
          endpoint: endpoint("prod.backend.generate"),
          registrations: [baseRegistration(canonicalModelId(model))],
          querySemantics: resolved.querySemantics,
          roles: ["aggregated"]
        })
      const oldAttachment = yield* attach(oldDomain, "llama")
      const oldCatalog = yield* registry.catalog
      expect(oldCatalog.revision).toBe(1n)
      const oldProducer = oldCatalog.pools[0]!
      const newRegistrations = [baseRegistration(canonicalModelId("llama-v2"))]

      expect(
        yield* EndpointSlot.refreshPoolRegistrations(
          registry,
          oldAttachment,
          oldBinding,
          desiredBinding,
          false,
          newRegistrations
        )
      ).toBe("Skipped")
      // `!catalog_rx.has_changed()`: no new revision.
      expect((yield* registry.catalog).revision).toBe(oldCatalog.revision)
      expect(models(oldCatalog.pools[0]!)).toEqual(["llama"])

      yield* registry.detach(oldAttachment)
      const withdrawnCatalog = yield* registry.catalog
      expect(withdrawnCatalog.pools).toEqual([])

      const newAttachment = yield* registry.attach({
        poolId: new PoolId(desiredBinding.domain.id, new DcId(7n)),
        endpoint: endpoint("prod.backend.generate"),
        registrations: newRegistrations,
        querySemantics: desiredBinding.domain.querySemantics,
        roles: ["aggregated"]
      })
      const newCatalog = yield* registry.catalog
      expect(newCatalog.pools[0]!.producer.equals(oldProducer.producer)).toBe(false)
      expect(models(newCatalog.pools[0]!)).toEqual(["llama-v2"])

      for (const catalog of [oldCatalog, withdrawnCatalog, newCatalog]) {
        expect(showsModelUnder(catalog, oldProducer, "llama-v2")).toBe(false)
      }
      yield* registry.detach(newAttachment)
    })
  )

  it.scoped("mdc_binding_transition_never_publishes_new_model_with_old_producer", () =>
    Effect.gen(function* () {
      const oldKv = "relay-test.backend.kv-old"
      const newKv = "relay-test.backend.kv-new"
      const oldSource = yield* liveSource(oldKv)
      const newSource = yield* liveSource(newKv)
      const before = project([
        projectedCard({ model: "llama", artifact: "meta/llama", kvStateEndpoint: oldKv })
      ])
      const after = project(
        [projectedCard({ model: "llama-v2", artifact: "meta/llama-v2", kvStateEndpoint: newKv })],
        before.projection
      )
      const slot = yield* startSlot([oldSource, newSource], before.membership)

      const oldCatalog = yield* awaitCatalog(slot.registry.catalogRef, "the llama pool", (catalog) =>
        catalog.pools.some((d) => d.registrations[0]!.model === "llama")
      )
      const oldProducer = oldCatalog.pools[0]!

      yield* SubscriptionRef.set(slot.metadata, after.membership)
      const newCatalog = yield* awaitCatalog(
        slot.registry.catalogRef,
        "the replacement llama-v2 generation",
        (catalog) => catalog.pools.some((d) => d.registrations[0]!.model === "llama-v2"),
        { each: (catalog) => expect(showsModelUnder(catalog, oldProducer, "llama-v2")).toBe(false) }
      )
      expect(newCatalog.pools[0]!.producer.equals(oldProducer.producer)).toBe(false)

      yield* slot.shutdown
    })
  )

  it.scoped("alias_and_context_change_refreshes_the_active_pool_catalog", () =>
    Effect.gen(function* () {
      const kv = "relay-test.backend.kv"
      const source = yield* liveSource(kv)
      const before = project([
        projectedCard({
          model: "llama",
          artifact: "meta/llama",
          kvStateEndpoint: kv,
          aliases: ["old-alias"],
          contextLength: 4096
        })
      ])
      const after = project(
        [
          projectedCard({
            model: "llama",
            artifact: "meta/llama",
            kvStateEndpoint: kv,
            aliases: ["new-alias"],
            contextLength: 8192
          })
        ],
        before.projection
      )
      expect(after.membership.generation).not.toBe(before.membership.generation)
      const slot = yield* startSlot([source], before.membership)

      const aliases = (d: DcPoolDescriptor) => d.registrations[0]!.aliases as ReadonlyArray<string>
      const oldCatalog = yield* awaitCatalog(slot.registry.catalogRef, "the old alias", (catalog) =>
        catalog.pools.some((d) => aliases(d).includes("old-alias"))
      )
      const producer = oldCatalog.pools[0]!.producer

      yield* SubscriptionRef.set(slot.metadata, after.membership)
      const newCatalog = yield* awaitCatalog(slot.registry.catalogRef, "the new alias", (catalog) =>
        catalog.pools.some((d) => d.producer.equals(producer) && aliases(d).includes("new-alias"))
      )
      expect(
        newCatalog.pools.every((d) => d.registrations.every((r) => !r.aliases.includes("old-alias" as never)))
      ).toBe(true)

      yield* slot.shutdown
    })
  )
})
