/**
 * The relay host over an in-memory discovery: configuration checks, duplicate-pool fencing end
 * to end, departed endpoints, stats, diagnostic snapshots and shutdown.
 *
 * Sources advertise a ZeroMQ endpoint nobody listens on: pools materialize from discovery alone.
 */

import { describe, expect, it } from "@effect/vitest"
import { Effect, Exit, SubscriptionRef, TestClock } from "effect"
import { CacheSemanticsId, DcId, IndexerDomainId, RoutingScopeId } from "../../src/ckf/identity.js"
import { Discovery, type DiscoverySnapshot, makeStaticDiscovery } from "../../src/discovery/Discovery.js"
import {
  type ConflictScope,
  type DcMembershipView,
  type EndpointMembership,
  isMaterializable,
  makeConflict
} from "../../src/discovery/Membership.js"
import type { KvEventSource, ModelCardInstance } from "../../src/protocol/Discovery.js"
import { type RouterEvent, storedEvent } from "../../src/protocol/Events.js"
import type { ResolvedIndexerDomain } from "../../src/protocol/Identity.js"
import { baseRegistration, canonicalModelId, KvQuerySemantics } from "../../src/protocol/Model.js"
import type { KvEventTransport, LiveBatchHandler } from "../../src/recovery/EventTransport.js"
import { WorkerQueryError, type WorkerQueryTransport } from "../../src/recovery/WorkerQuery.js"
import { inactiveSlotLifecycle } from "../../src/relay/EndpointSlot.js"
import type { KvDcRelayService } from "../../src/relay/KvDcRelay.js"
import * as RelayHost from "../../src/relay/RelayHost.js"
import { makeZmqEventTransport } from "../../src/transport/ZmqEventTransport.js"
import { card, endpoint, source } from "../discovery/fixtures.js"
import { heldQueries } from "../recovery/heldQueries.js"

const snapshot = (
  revision: bigint,
  cards: ReadonlyArray<ModelCardInstance>,
  sources: ReadonlyArray<KvEventSource>
): DiscoverySnapshot => ({
  revision,
  cards,
  sources,
  rejectedSources: [],
  sourceStream: { epoch: 0, bound: true }
})

const deafSource = (serving: string, worker: number): KvEventSource => ({
  ...source({ endpoint: serving, worker, rank: 0, publisher: worker }),
  transport: { kind: "dynamo-zmq", endpoint: "tcp://127.0.0.1:1", topic: "kv-events" }
})

/** Explicit identity maps, so two endpoints resolve to one PoolId. */
const explicitCard = (serving: string, worker: number, name: string): ModelCardInstance =>
  card({
    endpoint: serving,
    worker,
    name,
    indexerIdentity: { semantics: { model: "shared" }, routingScope: { fleet: "shared" } }
  })

const until = <A>(check: Effect.Effect<A | undefined | false>, what: string) =>
  Effect.gen(function* () {
    const deadline = Date.now() + 3000
    for (;;) {
      const value = yield* check
      if (value !== undefined && value !== false) return value
      if (Date.now() > deadline) return yield* Effect.dieMessage(`timed out waiting until ${what}`)
      yield* Effect.promise(() => new Promise((resolve) => setTimeout(resolve, 1)))
    }
  })

const startHost = (initial: DiscoverySnapshot, config: Partial<RelayHost.RelayHostConfig> = {}) =>
  Effect.gen(function* () {
    const discovery = yield* makeStaticDiscovery(initial)
    const relay = yield* RelayHost.make({
      dcName: "test-dc",
      drtInstanceId: 5n,
      eventTransport: makeZmqEventTransport(),
      expectedUniqueBlocks: 1024,
      ...config
    }).pipe(Effect.provideService(Discovery, discovery))
    return { discovery, relay }
  })

const catalogOf = (relay: KvDcRelayService) => SubscriptionRef.get(relay.catalogRef)

/**
 * An in-memory event transport: every synced source counts as connected at once, and the test
 * hands batches straight to the supervisor's handler.
 */
const inMemoryTransport = (query: WorkerQueryTransport) => {
  let handler: LiveBatchHandler | undefined
  let synced: ReadonlyArray<KvEventSource> = []
  const transport: KvEventTransport = {
    subscribe: (h) =>
      Effect.sync(() => {
        handler = h
        return {
          sync: (sources) =>
            Effect.sync(() => {
              synced = sources
            }),
          connectedSources: Effect.sync(() => synced),
          totals: Effect.succeed({ messages: 0, events: 0, blocks: 0, malformedTotal: 0 })
        }
      }),
    query
  }
  // The handler returns undefined when it handled the batch synchronously.
  const deliver = (publisherId: bigint, events: ReadonlyArray<RouterEvent>) =>
    Effect.suspend(() => handler!(publisherId, events) ?? Effect.void)
  return { transport, handler: () => (handler === undefined ? undefined : deliver) }
}

describe("RelayHost", () => {
  it.scoped("invalid settings are all reported, each naming its setting", () =>
    Effect.gen(function* () {
      const discovery = yield* makeStaticDiscovery(snapshot(1n, [], []))
      const exit = yield* Effect.exit(
        RelayHost.make({
          dcName: " test-dc",
          drtInstanceId: 1n,
          eventTransport: makeZmqEventTransport(),
          publicationThreshold: 0,
          publicationDelayMs: 0,
          recoveryAttemptTimeoutMs: 0,
          expectedUniqueBlocks: -1
        }).pipe(Effect.provideService(Discovery, discovery))
      )
      expect(Exit.isFailure(exit)).toBe(true)
      const problems = RelayHost.validateRelayConfig({
        dcName: " test-dc",
        drtInstanceId: 1n,
        publicationThreshold: 0,
        publicationDelayMs: 0,
        recoveryAttemptTimeoutMs: 0,
        expectedUniqueBlocks: -1
      })
      expect(problems.map((p) => p.setting)).toEqual([
        "dcId",
        "publicationThreshold",
        "publicationDelayMs",
        "recoveryAttemptTimeoutMs",
        "expectedUniqueBlocks"
      ])
      expect(problems[0]!.message).toBe("KV DC Relay dc_id must not contain leading or trailing whitespace")
      expect(RelayHost.validateRelayConfig({ dcName: "", drtInstanceId: 1n })[0]!.message).toBe(
        "KV DC Relay dc_id must not be empty"
      )
      expect(RelayHost.validateRelayConfig({ dcName: "test-dc", drtInstanceId: 1n })).toEqual([])
    })
  )

  it.scoped("endpoints resolving to one pool are all fenced until one leaves", () =>
    Effect.gen(function* () {
      const fast = "prod.backend.fast"
      const slow = "prod.backend.slow"
      const { discovery, relay } = yield* startHost(
        snapshot(
          1n,
          [explicitCard(fast, 1, "llama-fast"), explicitCard(slow, 2, "llama-slow")],
          [deafSource(fast, 1), deafSource(slow, 2)]
        )
      )
      const health = yield* until(
        relay.health.pipe(Effect.map((h) => h.fencedEndpointCount === 2 && h)),
        "both endpoints fenced"
      )
      expect(health).toMatchObject({ healthy: false, endpointCount: 2, activeEndpointCount: 0 })
      expect((yield* catalogOf(relay)).pools).toEqual([])
      const memberships = (yield* SubscriptionRef.get(relay.membershipRef)).endpoints
      for (const key of [fast, slow]) {
        expect(
          memberships
            .get(key)!
            .conflicts.map((c) => c.reason)
            .join()
        ).toMatch(/is claimed by multiple serving endpoints/)
      }

      yield* discovery.publish(snapshot(2n, [explicitCard(fast, 1, "llama-fast")], [deafSource(fast, 1)]))
      const recovered = yield* until(
        relay.health.pipe(Effect.map((h) => h.activeEndpointCount === 1 && h)),
        "the remaining endpoint active"
      )
      expect(recovered).toEqual({
        healthy: true,
        shuttingDown: false,
        endpointCount: 1,
        activeEndpointCount: 1,
        fencedEndpointCount: 0,
        sourcesRecovering: 0,
        sourcesDegraded: 0,
        // Nothing listens on the deaf source's endpoint: it is expected, and connecting.
        sources: { expected: 1, connecting: 1, live: 0, recovering: 0, degraded: 0, rejected: 0 },
        discovery: { state: "live", since: expect.any(Date) }
      })
      const catalog = yield* catalogOf(relay)
      expect(catalog.pools.map((d) => d.servingEndpoint.toString())).toEqual([fast])
    })
  )

  it.scoped("stats, diagnostic snapshots and flush follow the active generation", () =>
    Effect.gen(function* () {
      const serving = "prod.backend.generate"
      const { relay } = yield* startHost(
        snapshot(1n, [card({ endpoint: serving, worker: 1 })], [deafSource(serving, 1)])
      )
      yield* until(relay.health.pipe(Effect.map((h) => h.activeEndpointCount === 1)), "the pool")
      const stats = yield* relay.stats
      expect(stats.identity).toEqual({
        dcName: "test-dc",
        dcId: relay.dcId,
        drtInstanceId: 5n,
        relayIncarnation: relay.identity.relayIncarnation
      })
      const [entry] = stats.endpoints
      expect(entry).toMatchObject({
        lifecycle: "active",
        layoutGeneration: 1n,
        models: ["llama"],
        roles: ["aggregated"],
        membershipConflicts: [],
        ingest: { events: 0, blocks: 0, malformed: 0, gaps: 0, recoveries: 0 }
      })
      expect(entry!.aggregation?.uniqueBlockCount).toBe(0)
      expect(entry!.actor?.mailboxCapacity).toBeGreaterThan(0)
      expect(entry!.recovery.rankCount).toBe(1)

      const snap = yield* relay.diagnosticSnapshot(endpoint(serving))
      expect(snap.layoutGeneration).toBe(1n)
      expect(snap.words.length).toBe(2 * snap.producer.format.bucketCount)
      expect(snap.producer.equals((yield* catalogOf(relay)).pools[0]!.producer)).toBe(true)
      const missing = yield* Effect.exit(relay.diagnosticSnapshot(endpoint("prod.backend.other")))
      expect(Exit.isFailure(missing) && JSON.stringify(missing.cause)).toContain("UnknownEndpoint")

      yield* relay.flush
      const before = yield* relay.diagnosticSnapshot(endpoint(serving))
      yield* relay.stats.pipe(Effect.asVoid)
      expect(before.sequence).toBe(snap.sequence)
    })
  )

  it.scoped("a departed endpoint's slot withdraws its pool and leaves the status table", () =>
    Effect.gen(function* () {
      const serving = "prod.backend.generate"
      const { discovery, relay } = yield* startHost(
        snapshot(1n, [card({ endpoint: serving, worker: 1 })], [deafSource(serving, 1)])
      )
      yield* until(relay.health.pipe(Effect.map((h) => h.activeEndpointCount === 1)), "the pool")
      yield* discovery.publish(snapshot(2n, [], []))
      yield* until(
        relay.health.pipe(Effect.map((h) => h.endpointCount === 0)),
        "the slot to leave the status table"
      )
      expect((yield* catalogOf(relay)).pools).toEqual([])
      yield* relay.shutdown
      expect((yield* relay.health).shuttingDown).toBe(true)
      expect((yield* SubscriptionRef.get(relay.membershipRef)).endpoints.size).toBe(0)
    })
  )

  it.scoped(
    "with the default publication threshold the 16th event of a pool publishes, the 15th does not",
    () =>
      Effect.gen(function* () {
        const memory = inMemoryTransport({
          queryWorker: () => Effect.fail(new WorkerQueryError({ message: "no recovery here" }))
        })
        const transport = memory.transport
        const live = source({ endpoint: "prod.backend.generate", worker: 7, rank: 0, publisher: 70 })
        // The delay timer never fires on the test clock: only the threshold can publish.
        const { relay } = yield* startHost(
          snapshot(1n, [card({ endpoint: "prod.backend.generate", worker: 7 })], [live]),
          {
            eventTransport: transport,
            publicationDelayMs: 3_600_000
          }
        )
        const publication = relay.stats.pipe(
          Effect.orDie,
          Effect.map((stats) => stats.endpoints[0]?.publication)
        )
        yield* until(
          Effect.map(publication, (p) => p !== undefined && memory.handler() !== undefined),
          "the pool and its subscription"
        )
        const handler = memory.handler()!
        for (let id = 1; id <= 15; id++) yield* handler(70n, [storedEvent("7", 0, id, [1000 + id])])
        yield* until(
          Effect.map(publication, (p) => p?.pendingEvents === 15),
          "15 pending events"
        )
        expect((yield* publication)!.emittedImages).toBe(0)
        yield* handler(70n, [storedEvent("7", 0, 16, [1016])])
        // The 16th event is the boundary: the window drains into one publication batch.
        const after = yield* until(
          Effect.map(publication, (p) => p !== undefined && p.pendingEvents === 0 && p),
          "the threshold's publication"
        )
        expect(after.emittedImages).toBeGreaterThan(0)
      })
  )

  it.scoped("the relay admits 16 recovery queries at once across its pools; the 17th waits", () =>
    Effect.gen(function* () {
      const held = yield* heldQueries
      const memory = inMemoryTransport(held.transport)
      const workers = Array.from({ length: 17 }, (_, i) => i + 1)
      const cards = workers.map((worker) => card({ endpoint: "prod.backend.generate", worker }))
      const sources = workers.map((worker) =>
        source({
          endpoint: "prod.backend.generate",
          worker,
          rank: 0,
          publisher: 100 + worker,
          recovery: "tcp://127.0.0.1:1"
        })
      )
      yield* startHost(snapshot(1n, cards, sources), { eventTransport: memory.transport })
      yield* until(
        Effect.gen(function* () {
          yield* TestClock.adjust("5 millis")
          return held.inFlight() === 16
        }),
        "16 recovery queries in flight"
      )
      yield* TestClock.adjust("100 millis")
      expect(held.inFlight()).toBe(16)
      yield* held.release
      yield* until(
        Effect.gen(function* () {
          yield* TestClock.adjust("5 millis")
          return held.inFlight() === 0
        }),
        "every query answered"
      )
      expect(held.peak()).toBe(16)
    })
  )
})

// ---------------------------------------------------------------------------------------------
// Duplicate-pool fencing: the seed's claimant rule (`reject_duplicate_live_pools` skips any
// membership with a conflict and needs only a domain)

const digest = (byte: number) => new Uint8Array(16).fill(byte)

/** The seed's `domain(seed)`: explicit cache semantics [seed; 16], routing scope [seed + 1; 16]. */
const domainOf = (seed: number): ResolvedIndexerDomain => ({
  id: new IndexerDomainId(
    new CacheSemanticsId(digest(seed), "explicit"),
    new RoutingScopeId(digest(seed + 1), "explicit")
  ),
  querySemantics: new KvQuerySemantics({ kvBlockSize: 64, hashFormat: "dynamo_standard_v1" })
})

/** The seed's `membership(endpoint, domain)`: one `llama` registration, no conflicts. */
const memberOf = (
  text: string,
  domain: ResolvedIndexerDomain | null,
  options: { readonly registrations?: boolean; readonly conflict?: ConflictScope } = {}
): EndpointMembership => {
  const id = endpoint(text)
  const registered = options.registrations ?? true
  return {
    endpoint: id,
    key: id.toString(),
    generation: 1,
    domain,
    namespace: id.namespace,
    registrations: registered ? [baseRegistration(canonicalModelId("llama"))] : [],
    models: registered ? ["llama"] : [],
    aliases: [],
    roles: [],
    runtimeConfigs: new Map(),
    workerTopology: new Map(),
    adapters: new Map(),
    conflicts:
      options.conflict === undefined
        ? []
        : [makeConflict(options.conflict, { _tag: "Endpoint", endpoint: id }, "an earlier conflict")]
  }
}

const viewOf = (...members: ReadonlyArray<EndpointMembership>): DcMembershipView => ({
  endpoints: new Map(members.map((m) => [m.key, m]))
})

const DC = new DcId(7n)

const isDuplicateFenced = (membership: EndpointMembership | undefined) =>
  membership !== undefined &&
  membership.conflicts.length === 1 &&
  membership.conflicts[0]!.scope === "PoolMaterialization" &&
  /^pool .* is claimed by multiple serving endpoints$/.test(membership.conflicts[0]!.reason) &&
  !isMaterializable(membership) &&
  inactiveSlotLifecycle(membership) === "fenced"

describe("duplicate-pool fencing (seed claimant rule)", () => {
  it("a membership that already carries a conflict of any scope claims no pool", () => {
    for (const scope of ["ServingBinding", "PoolMaterialization", "ServingTopology"] as const) {
      const clean = memberOf("prod.backend.fast", domainOf(1))
      const conflicted = memberOf("prod.backend.slow", domainOf(1), { conflict: scope })
      const view = viewOf(clean, conflicted)
      const collisions: Array<ReadonlyArray<string>> = []
      const result = RelayHost.rejectDuplicateLivePools(view, DC, (_, endpoints) =>
        collisions.push(endpoints)
      )
      // Nothing collides: the same view comes back and the clean endpoint is not fenced.
      expect(result).toBe(view)
      expect(collisions).toEqual([])
    }
    // A ServingBinding conflict still materializes; the seed does not count it as a claimant anyway.
    expect(isMaterializable(memberOf("prod.backend.slow", domainOf(1), { conflict: "ServingBinding" }))).toBe(
      true
    )
  })

  it("a domain is all a claimant needs: memberships without registrations collide too", () => {
    const bare = memberOf("prod.backend.bare", domainOf(1), { registrations: false })
    const alsoBare = memberOf("prod.backend.empty", domainOf(1), { registrations: false })
    const both = RelayHost.rejectDuplicateLivePools(viewOf(bare, alsoBare), DC)
    expect(isDuplicateFenced(both.endpoints.get(bare.key))).toBe(true)
    expect(isDuplicateFenced(both.endpoints.get(alsoBare.key))).toBe(true)

    const clean = memberOf("prod.backend.fast", domainOf(1))
    const mixed = RelayHost.rejectDuplicateLivePools(viewOf(clean, bare), DC)
    expect(isDuplicateFenced(mixed.endpoints.get(clean.key))).toBe(true)
    expect(isDuplicateFenced(mixed.endpoints.get(bare.key))).toBe(true)
  })

  it("a membership without a domain claims nothing", () => {
    const view = viewOf(memberOf("prod.backend.fast", domainOf(1)), memberOf("prod.backend.slow", null))
    expect(RelayHost.rejectDuplicateLivePools(view, DC)).toBe(view)
  })

  it("every claimant of a shared pool is fenced and named in UTF-8 order; other pools are untouched", () => {
    const members = [
      memberOf("prod.backend.zeta", domainOf(1)),
      memberOf("prod.backend.alpha", domainOf(1)),
      memberOf("prod.backend.mid", domainOf(1)),
      memberOf("prod.backend.other", domainOf(3)),
      memberOf("prod.backend.late", domainOf(1), { conflict: "ServingBinding" })
    ]
    const collisions: Array<ReadonlyArray<string>> = []
    const result = RelayHost.rejectDuplicateLivePools(viewOf(...members), DC, (poolId, endpoints) => {
      expect(poolId.dcId.value).toBe(7n)
      collisions.push(endpoints)
    })
    expect(collisions).toEqual([["prod.backend.alpha", "prod.backend.mid", "prod.backend.zeta"]])
    for (const key of collisions[0]!) expect(isDuplicateFenced(result.endpoints.get(key))).toBe(true)
    expect(result.endpoints.get("prod.backend.other")).toBe(members[3])
    // The already-conflicted endpoint keeps exactly what it had.
    expect(result.endpoints.get("prod.backend.late")).toBe(members[4])
  })

  it.scoped("over discovery: an endpoint with a ServingBinding conflict does not fence its sibling", () =>
    Effect.gen(function* () {
      const fast = "prod.backend.fast"
      const slow = "prod.backend.slow"
      // The slow worker also publishes an adapter card without LoRA metadata: a ServingBinding
      // conflict on that card, while its base card still materializes the shared pool.
      const orphanAdapter = card({
        endpoint: slow,
        worker: 2,
        name: "tenant-a",
        suffix: "tenant-a",
        indexerIdentity: { semantics: { model: "shared" }, routingScope: { fleet: "shared" } }
      })
      const { relay } = yield* startHost(
        snapshot(
          1n,
          [explicitCard(fast, 1, "llama-fast"), explicitCard(slow, 2, "llama-slow"), orphanAdapter],
          [deafSource(fast, 1), deafSource(slow, 2)]
        )
      )
      const catalog = yield* until(
        catalogOf(relay).pipe(Effect.map((c) => c.pools.length === 1 && c)),
        "one endpoint to own the shared pool"
      )
      const memberships = (yield* SubscriptionRef.get(relay.membershipRef)).endpoints
      expect(memberships.get(slow)!.conflicts.map((c) => c.scope)).toEqual(["ServingBinding"])
      expect(memberships.get(fast)!.conflicts).toEqual([])
      // The registry keeps the pool with one owner: the other endpoint's attach is refused.
      expect([fast, slow]).toContain(catalog.pools[0]!.servingEndpoint.toString())
      yield* until(
        relay.health.pipe(Effect.map((h) => h.activeEndpointCount === 1 && h.endpointCount === 2)),
        "exactly one active endpoint"
      )
    })
  )
})
