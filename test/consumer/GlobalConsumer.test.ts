/**
 * The global consumer's state machine against scripted relays, on the TestClock: epochs and
 * their backoff, lanes per domain, fault → retire → resubscribe, producer changes, incarnation
 * changes, format mismatches, and the overlap answers of the view.
 */

import { describe, expect, it } from "@effect/vitest"
import { Duration, Effect, Exit, Scope, SubscriptionRef, TestClock } from "effect"
import {
  ModelNotFound,
  NoMatchingDomain,
  NoReadyLane,
  RelayTransportError
} from "../../src/consumer/ConsumerErrors.js"
import {
  backoffCeiling,
  equalJitter,
  type GlobalConsumerService,
  parseRelaySpec,
  validateConfig
} from "../../src/consumer/GlobalConsumer.js"
import { make as makeConsumer } from "../../src/consumer/GlobalConsumerLive.js"
import { make as makeView, type OverlapResult } from "../../src/consumer/GlobalView.js"
import { DcRelayIdentity } from "../../src/protocol/Model.js"
import { waitUntil } from "../relay/registryFixtures.js"
import { domainOf, FakeRelay, fakeConnector } from "./fakeRelay.js"

const hashes = (from: number, count: number): Array<bigint> =>
  Array.from({ length: count }, (_, i) => 0x1000_0000_0000n + BigInt(from + i) * 0x9e37_79b9n)

const settle = Effect.gen(function* () {
  for (let i = 0; i < 500; i++) yield* Effect.yieldNow()
})

/** Starts a consumer over fake relays named a, b, … in lane order. */
const start = (relays: ReadonlyArray<FakeRelay>) =>
  Effect.gen(function* () {
    const byUrl = new Map(relays.map((relay, i) => [`http://relay-${i}`, relay]))
    const consumer = yield* makeConsumer({
      relays: relays.map((relay, i) => ({ name: relay.dcName, url: `http://relay-${i}` })),
      consumerInstance: 17n
    }).pipe(Effect.provide(fakeConnector(byUrl)))
    return { consumer, view: makeView(consumer) }
  })

const lanesOf = (consumer: GlobalConsumerService) =>
  consumer
    .domains()
    .flatMap((domain) => [...domain.lanes.values()].map((lane) => ({ ...lane, domain: domain.id })))

const readyLanes = (consumer: GlobalConsumerService) =>
  lanesOf(consumer)
    .filter((lane) => lane.ready)
    .map((lane) => lane.relay)

const depths = (answer: ReadonlyArray<OverlapResult> | unknown): Record<string, number> => {
  if (!Array.isArray(answer)) throw answer
  return Object.fromEntries((answer as ReadonlyArray<OverlapResult>).map((r) => [r.relay, r.prefixDepth]))
}

describe("GlobalConsumer configuration", () => {
  it("parses --relay NAME=URL and validates the relay list", () => {
    expect(parseRelaySpec("east=http://10.0.0.1:8080")).toEqual({ name: "east", url: "http://10.0.0.1:8080" })
    expect(parseRelaySpec("nourl")).toMatch(/NAME=URL/)
    expect(validateConfig({ relays: [] })).toHaveLength(1)
    expect(
      validateConfig({
        relays: [
          { name: "a", url: "http://x" },
          { name: "a", url: "ftp://y" }
        ]
      })
    ).toHaveLength(2)
    const many = Array.from({ length: 17 }, (_, i) => ({ name: `r${i}`, url: `http://r${i}` }))
    expect(validateConfig({ relays: many })).toEqual([expect.stringMatching(/at most 16/)])
  })

  it("backs off 500 ms doubling to 30 s with equal jitter", () =>
    Effect.runPromise(
      Effect.gen(function* () {
        expect(Duration.toMillis(backoffCeiling(0, "500 millis", "30 seconds"))).toBe(500)
        expect(Duration.toMillis(backoffCeiling(3, "500 millis", "30 seconds"))).toBe(4000)
        expect(Duration.toMillis(backoffCeiling(10, "500 millis", "30 seconds"))).toBe(30_000)
        for (let i = 0; i < 100; i++) {
          const sleep = Duration.toMillis(yield* equalJitter(backoffCeiling(2, "500 millis", "30 seconds")))
          expect(sleep).toBeGreaterThanOrEqual(1000)
          expect(sleep).toBeLessThanOrEqual(2000)
        }
      })
    ))
})

describe("GlobalConsumer", () => {
  it.scoped("retries an unreachable relay on the TestClock with the epoch backoff", () =>
    Effect.gen(function* () {
      const relay = yield* FakeRelay.make("a", 1n)
      relay.infoFailure = new RelayTransportError({ url: "fake", message: "refused" })
      const { consumer } = yield* start([relay])
      yield* settle
      expect(relay.infoCalls).toBe(1)
      // Sleeps are in [250, 500] ms, then [500, 1000] ms, then [1, 2] s after each attempt, so
      // the attempts fall at t1 ∈ [250, 500], t2 ∈ [750, 1500], t3 ∈ [1750, 3500].
      const at = (ms: number) =>
        Effect.gen(function* () {
          yield* TestClock.setTime(ms)
          yield* settle
          return relay.infoCalls
        })
      expect(yield* at(249)).toBe(1)
      expect(yield* at(500)).toBe(2)
      expect(yield* at(749)).toBe(2)
      expect(yield* at(1500)).toBe(3)
      expect(yield* at(1749)).toBe(3)
      expect(yield* at(3500)).toBe(4)
      expect(consumer.relays()[0]!.lastError).toMatch(/refused/)

      relay.infoFailure = undefined
      yield* TestClock.adjust("8 seconds")
      yield* settle
      expect(consumer.relays()[0]!.connected).toBe(true)
      expect(consumer.relays()[0]!.info?.dcName).toBe("a")
    })
  )

  it.scoped("lanes every relay's pool of a domain and answers prefix depths per DC", () =>
    Effect.gen(function* () {
      const a = yield* FakeRelay.make("a", 1n)
      const b = yield* FakeRelay.make("b", 2n)
      const poolA = yield* a.addPool()
      const poolB = yield* b.addPool()
      const { consumer, view } = yield* start([a, b])
      yield* waitUntil(() => readyLanes(consumer).length === 2, "both lanes ready")
      const prompt = hashes(0, 12)
      yield* poolA.store(prompt.slice(0, 8))
      yield* poolB.store(prompt.slice(0, 3))
      yield* settle
      const byModel = view.overlapNow({ namespace: "prod", model: "llama", sequenceHashes: prompt })
      expect(depths(byModel)).toEqual({ a: 8, b: 3 })
      if (!Array.isArray(byModel)) throw byModel
      expect(byModel.map((r) => r.relay)).toEqual(["a", "b"])
      expect(byModel[0]).toMatchObject({ lane: 0, matchedTokens: 8 * 16 })
      expect(byModel[0]!.servingEndpoint.toString()).toBe("prod.backend.generate")
      // Aliases match, other namespaces or models do not.
      expect(depths(view.overlapNow({ namespace: "prod", model: "chat", sequenceHashes: prompt }))).toEqual({
        a: 8,
        b: 3
      })
      expect(view.overlapNow({ namespace: "dev", model: "llama", sequenceHashes: prompt })).toBeInstanceOf(
        ModelNotFound
      )
      expect(view.overlapNow({ namespace: "prod", model: "other", sequenceHashes: prompt })).toBeInstanceOf(
        ModelNotFound
      )
      expect(depths(view.overlapNow({ poolDomain: domainOf(1), sequenceHashes: prompt }))).toEqual({
        a: 8,
        b: 3
      })
      expect(view.overlapNow({ poolDomain: domainOf(5), sequenceHashes: prompt })).toBeInstanceOf(
        NoMatchingDomain
      )
      // Removal lowers the depth.
      yield* poolA.remove([prompt[4]!])
      yield* settle
      expect(depths(view.overlapNow({ namespace: "prod", model: "llama", sequenceHashes: prompt }))).toEqual({
        a: 4,
        b: 3
      })
      const domains = view.domainsNow()
      expect(domains).toHaveLength(1)
      expect(domains[0]!.lanes.map((l) => [l.lane, l.relay, l.ready])).toEqual([
        [0, "a", true],
        [1, "b", true]
      ])
      expect(domains[0]!.lanes[0]!.installedSequence).toBe(poolA.sequence)
    })
  )

  it.scoped("a lagged lane retires alone and comes back from a fresh snapshot after the backoff", () =>
    Effect.gen(function* () {
      const a = yield* FakeRelay.make("a", 1n)
      const b = yield* FakeRelay.make("b", 2n)
      const poolA = yield* a.addPool()
      const poolB = yield* b.addPool()
      const { consumer, view } = yield* start([a, b])
      yield* waitUntil(() => readyLanes(consumer).length === 2, "both lanes ready")
      const prompt = hashes(100, 6)
      yield* poolA.store(prompt)
      yield* poolB.store(prompt.slice(0, 2))
      yield* settle

      yield* poolA.lag()
      yield* settle
      expect(readyLanes(consumer)).toEqual(["b"])
      expect(depths(view.overlapNow({ namespace: "prod", model: "llama", sequenceHashes: prompt }))).toEqual({
        b: 2
      })
      const lane = lanesOf(consumer).find((l) => l.relay === "a")!
      expect(lane.faults).toBe(1)
      expect(lane.lastFault).toMatch(/SUBSCRIBER_LAGGED/)
      // The producer moved on while the lane was down; the new snapshot carries it.
      yield* poolA.store(hashes(200, 3))
      yield* TestClock.adjust("500 millis")
      yield* waitUntil(() => readyLanes(consumer).length === 2, "lane a ready again")
      expect(poolA.subscriptions).toBe(2)
      expect(depths(view.overlapNow({ namespace: "prod", model: "llama", sequenceHashes: prompt }))).toEqual({
        a: 6,
        b: 2
      })
      expect(lanesOf(consumer).find((l) => l.relay === "a")!.installedSequence).toBe(poolA.sequence)
    })
  )

  it.scoped("all lanes down: 503-style NoReadyLane, not NoMatchingDomain", () =>
    Effect.gen(function* () {
      const a = yield* FakeRelay.make("a", 1n)
      const poolA = yield* a.addPool()
      const { consumer, view } = yield* start([a])
      yield* waitUntil(() => readyLanes(consumer).length === 1, "lane ready")
      yield* poolA.lag()
      yield* settle
      expect(
        view.overlapNow({ namespace: "prod", model: "llama", sequenceHashes: hashes(0, 2) })
      ).toBeInstanceOf(NoReadyLane)
    })
  )

  it.scoped("a new producer in the catalog replaces the lane's subscription", () =>
    Effect.gen(function* () {
      const a = yield* FakeRelay.make("a", 1n)
      const first = yield* a.addPool()
      const { consumer, view } = yield* start([a])
      yield* waitUntil(() => readyLanes(consumer).length === 1, "lane ready")
      const prompt = hashes(0, 4)
      yield* first.store(prompt)
      yield* settle
      expect(depths(view.overlapNow({ namespace: "prod", model: "llama", sequenceHashes: prompt }))).toEqual({
        a: 4
      })

      const second = yield* a.addPool({ layoutGeneration: 2n })
      yield* second.store(prompt.slice(0, 1))
      yield* waitUntil(
        () => lanesOf(consumer).some((l) => l.ready && l.descriptor.producer.equals(second.producer)),
        "lane on the new producer"
      )
      expect(first.subscribers.size).toBe(0)
      expect(depths(view.overlapNow({ namespace: "prod", model: "llama", sequenceHashes: prompt }))).toEqual({
        a: 1
      })
    })
  )

  it.scoped(
    "a relay restart (new incarnation) invalidates what was learned from it, then converges again",
    () =>
      Effect.gen(function* () {
        const a = yield* FakeRelay.make("a", 1n, 100n)
        const b = yield* FakeRelay.make("b", 2n)
        const poolA = yield* a.addPool()
        yield* b.addPool()
        const { consumer, view } = yield* start([a, b])
        yield* waitUntil(() => readyLanes(consumer).length === 2, "both lanes ready")
        yield* poolA.store(hashes(0, 3))
        yield* settle

        yield* a.restart(200n)
        yield* settle
        expect(consumer.relays()[0]!.catalog).toBeUndefined()
        expect(consumer.relays()[0]!.connected).toBe(false)
        expect(lanesOf(consumer).map((l) => l.relay)).toEqual(["b"])

        const again = yield* a.addPool()
        yield* again.store(hashes(0, 2))
        yield* TestClock.adjust("500 millis")
        yield* waitUntil(() => readyLanes(consumer).length === 2, "relay a re-learned")
        expect(consumer.relays()[0]!.info?.relay.relayIncarnation).toBe(200n)
        expect(again.producer.producerIncarnation).toBe(200n)
        expect(
          depths(view.overlapNow({ namespace: "prod", model: "llama", sequenceHashes: hashes(0, 3) }))
        ).toEqual({
          a: 2,
          b: 0
        })
      })
  )

  it.scoped("a catalog carrying another relay identity ends the epoch", () =>
    Effect.gen(function* () {
      const a = yield* FakeRelay.make("a", 1n, 100n)
      yield* a.addPool()
      const { consumer } = yield* start([a])
      yield* waitUntil(() => readyLanes(consumer).length === 1, "lane ready")
      // The watch stays open but starts describing another incarnation.
      yield* SubscriptionRef.set(a.catalogRef, {
        relay: new DcRelayIdentity({ drtInstanceId: 1n, relayIncarnation: 999n }),
        revision: 50n,
        pools: []
      })
      yield* settle
      expect(lanesOf(consumer)).toEqual([])
      expect(consumer.relays()[0]!.lastError).toMatch(/identity changed/)
    })
  )

  it.scoped("a catalog revision going backwards ends the epoch", () =>
    Effect.gen(function* () {
      const a = yield* FakeRelay.make("a", 1n, 100n)
      yield* a.addPool()
      yield* a.publishCatalog
      const { consumer } = yield* start([a])
      yield* waitUntil(() => readyLanes(consumer).length === 1, "lane ready")
      yield* SubscriptionRef.set(a.catalogRef, { relay: a.info.relay, revision: 1n, pools: [] })
      yield* settle
      expect(consumer.relays()[0]!.lastError).toMatch(/went back/)
    })
  )

  it.scoped("a relay serving the domain in another format is reported and not laned", () =>
    Effect.gen(function* () {
      const a = yield* FakeRelay.make("a", 1n)
      const b = yield* FakeRelay.make("b", 2n)
      yield* a.addPool({ expectedBlocks: 256 })
      yield* b.addPool({ expectedBlocks: 4096 })
      const { consumer } = yield* start([a, b])
      yield* waitUntil(() => readyLanes(consumer).length === 1, "lane a ready")
      yield* settle
      expect(readyLanes(consumer)).toEqual(["a"])
      expect(consumer.problems()).toEqual([expect.stringMatching(/relay b serves domain .* not laned/)])
    })
  )

  it.scoped("domains are separate indexers; a pool leaving the catalog retires its lane", () =>
    Effect.gen(function* () {
      const a = yield* FakeRelay.make("a", 1n)
      const llama = yield* a.addPool({ domain: domainOf(1), model: "llama" })
      const mistral = yield* a.addPool({ domain: domainOf(3), model: "mistral" })
      const { consumer, view } = yield* start([a])
      yield* waitUntil(() => readyLanes(consumer).length === 2, "two domains ready")
      expect(consumer.domains()).toHaveLength(2)
      yield* mistral.store(hashes(0, 2))
      yield* settle
      expect(
        depths(view.overlapNow({ namespace: "prod", model: "mistral", sequenceHashes: hashes(0, 2) }))
      ).toEqual({
        a: 2
      })
      expect(
        depths(view.overlapNow({ namespace: "prod", model: "llama", sequenceHashes: hashes(0, 2) }))
      ).toEqual({ a: 0 })
      yield* a.removePool(mistral)
      yield* settle
      expect(consumer.domains()).toHaveLength(1)
      // Registered since the consumer started, so no typo: no lane of it is ready (PROTOCOL §7 ◆3).
      expect(
        view.overlapNow({ namespace: "prod", model: "mistral", sequenceHashes: hashes(0, 2) })
      ).toBeInstanceOf(NoReadyLane)
      expect(llama.subscribers.size).toBe(1)
    })
  )

  it.scoped("closing the consumer's scope stops every stream", () =>
    Effect.gen(function* () {
      const a = yield* FakeRelay.make("a", 1n)
      const pool = yield* a.addPool()
      const scope = yield* Scope.make()
      const { consumer } = yield* start([a]).pipe(Scope.extend(scope))
      yield* waitUntil(() => readyLanes(consumer).length === 1, "lane ready")
      expect(pool.subscribers.size).toBe(1)
      yield* Scope.close(scope, Exit.void)
      yield* settle
      expect(pool.subscribers.size).toBe(0)
    })
  )
})
