/**
 * The relay host over an in-memory discovery: configuration checks, duplicate-pool fencing end
 * to end, departed endpoints, stats, diagnostic snapshots and shutdown.
 *
 * Sources advertise a ZeroMQ endpoint nobody listens on: pools materialize from discovery alone.
 */

import { describe, expect, it } from "@effect/vitest"
import { Effect, Exit, SubscriptionRef, TestClock } from "effect"
import { Discovery, type DiscoverySnapshot, makeStaticDiscovery } from "../../src/discovery/Discovery.js"
import { storedEvent } from "../../src/domain/events.js"
import type { ModelCardInstance } from "../../src/domain/json.js"
import type { KvEventSource } from "../../src/domain/sources.js"
import type { KvEventTransport, LiveBatchHandler } from "../../src/recovery/EventTransport.js"
import { WorkerQueryError, type WorkerQueryTransport } from "../../src/recovery/WorkerQuery.js"
import * as RelayHost from "../../src/relay/RelayHost.js"
import type { KvDcRelayService } from "../../src/relay/RelayService.js"
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
  return { transport, handler: () => handler }
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
        sourcesDegraded: 0
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
