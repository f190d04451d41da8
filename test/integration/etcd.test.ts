/**
 * The etcd backend against a real etcd server started by the test on free loopback ports with a
 * temporary data directory. Without an etcd binary the tests report themselves skipped.
 */

import { describe, expect, it } from "@effect/vitest"
import { Effect, Either, Exit, Logger, Scope } from "effect"
import { Etcd3 } from "etcd3"
import type { DiscoveryShape, DiscoverySnapshot, DiscoveryStateName } from "../../src/discovery/Discovery.js"
import {
  cardKey,
  makeEtcdDiscovery,
  makeEtcdRegistrar,
  sourceKey
} from "../../src/discovery/EtcdDiscovery.js"
import { LoopFaults, makeLoopFaults, supervisedRestarts } from "../../src/observability/Supervised.js"
import { ModelCardInstanceJson } from "../../src/protocol/Discovery.js"
import { encodeJsonText } from "../../src/protocol/Json.js"
import { card, rawSource, source } from "../discovery/fixtures.js"
import { etcdServer, etcdServerNotStarted, skipEtcd, skipped } from "./etcdHelpers.js"

const PREFIX = "/kvrelay-test/v1"

/** Real servers keep their own time: poll the snapshot with a bounded real deadline. */
const waitFor = (
  discovery: DiscoveryShape,
  what: string,
  done: (snapshot: DiscoverySnapshot) => boolean,
  deadlineMs = 8000
) =>
  Effect.gen(function* () {
    const until = Date.now() + deadlineMs
    while (Date.now() < until) {
      const snapshot = yield* discovery.current
      if (done(snapshot)) return snapshot
      yield* Effect.sleep("20 millis")
    }
    const last = yield* discovery.current
    return yield* Effect.die(
      new Error(
        `etcd discovery never showed ${what} within ${deadlineMs} ms (last: ${last.cards.length} cards, ${last.sources.length} sources, stream ${JSON.stringify(last.sourceStream)})`
      )
    )
  })

const waitForStatus = (discovery: DiscoveryShape, state: DiscoveryStateName, deadlineMs = 8000) =>
  Effect.gen(function* () {
    const until = Date.now() + deadlineMs
    while (Date.now() < until) {
      const status = yield* discovery.status
      if (status.state === state) return status
      yield* Effect.sleep("20 millis")
    }
    const last = yield* discovery.status
    return yield* Effect.die(
      new Error(`etcd discovery never became ${state} within ${deadlineMs} ms (last: ${last.state})`)
    )
  })

const rawClient = (url: string) =>
  Effect.acquireRelease(
    Effect.sync(() => new Etcd3({ hosts: url })),
    (client) => Effect.sync(() => client.close())
  )

const llama = card({ endpoint: "prod.backend.generate", worker: 7001, aliases: ["chat"] })
const llamaSource = source({
  endpoint: "prod.backend.generate",
  worker: 7001,
  rank: 0,
  publisher: "123456789"
})

describe("etcd discovery (real etcd)", () => {
  it.live.skipIf(skipEtcd)(
    `registered records appear, and disappear when the lease is revoked${skipped}`,
    () =>
      Effect.gen(function* () {
        const server = yield* etcdServer
        const discovery = yield* makeEtcdDiscovery({ endpoints: [server.url], prefix: PREFIX })
        expect((yield* discovery.current).cards).toEqual([])
        const registrarScope = yield* Scope.make()
        const registrar = yield* makeEtcdRegistrar({
          endpoints: [server.url],
          prefix: PREFIX,
          ttlSeconds: 10
        }).pipe(Scope.extend(registrarScope))
        yield* registrar.registerCard(llama).pipe(Scope.extend(registrarScope))
        yield* registrar.registerSource(llamaSource).pipe(Scope.extend(registrarScope))
        const seen = yield* waitFor(
          discovery,
          "the card and the source",
          (s) => s.cards.length === 1 && s.sources.length === 1
        )
        expect(seen.cards[0]).toEqual(llama)
        expect(seen.sources[0]).toEqual(llamaSource)
        expect(seen.sourceStream).toEqual({ epoch: 0, bound: true })
        yield* Scope.close(registrarScope, Exit.void)
        yield* waitFor(
          discovery,
          "no records after revocation",
          (s) => s.cards.length === 0 && s.sources.length === 0
        )
      }).pipe(Effect.scoped)
  )

  it.live.skipIf(skipEtcd)(`records of an expired lease disappear${skipped}`, () =>
    Effect.gen(function* () {
      const server = yield* etcdServer
      const discovery = yield* makeEtcdDiscovery({ endpoints: [server.url], prefix: PREFIX })
      const registrar = yield* makeEtcdRegistrar({ endpoints: [server.url], prefix: PREFIX, ttlSeconds: 1 })
      yield* registrar.registerCard(llama)
      yield* waitFor(discovery, "the card", (s) => s.cards.length === 1)
      // No more keep-alives: etcd expires the lease after its (minimum) TTL, about 2 s.
      yield* registrar.releaseLease
      const started = Date.now()
      yield* waitFor(discovery, "the card expiring", (s) => s.cards.length === 0, 6000)
      expect(Date.now() - started).toBeGreaterThan(500)
    }).pipe(Effect.scoped)
  )

  it.live.skipIf(skipEtcd)(
    `invalid values and keys that disagree with their values are ignored${skipped}`,
    () =>
      Effect.gen(function* () {
        const server = yield* etcdServer
        const client = yield* rawClient(server.url)
        const cardText = Either.getOrThrow(encodeJsonText(ModelCardInstanceJson)(llama))
        yield* Effect.promise(() => client.put(cardKey(PREFIX, llama)).value(cardText).exec())
        // A card stored under another worker's key, a card that is not JSON, a stray key.
        yield* Effect.promise(() =>
          client.put(`${PREFIX}/cards/prod/backend/generate/9`).value(cardText).exec()
        )
        yield* Effect.promise(() => client.put(`${PREFIX}/cards/prod/backend/generate/10`).value("{").exec())
        yield* Effect.promise(() => client.put(`${PREFIX}/other`).value("x").exec())
        const discovery = yield* makeEtcdDiscovery({ endpoints: [server.url], prefix: PREFIX })
        expect((yield* discovery.current).cards).toEqual([llama])
        // A source with an unknown field and a source whose key names another publisher.
        const badSource = JSON.stringify({ ...rawSource({ worker: 7001, publisher: 5 }), extra: 1 })
        yield* Effect.promise(() =>
          client.put(`${PREFIX}/sources/prod.backend.generate/7001/0/5`).value(badSource).exec()
        )
        const misKeyed = JSON.stringify(rawSource({ worker: 7001, publisher: 6 }))
        yield* Effect.promise(() =>
          client.put(`${PREFIX}/sources/prod.backend.generate/7001/0/7`).value(misKeyed).exec()
        )
        const good = JSON.stringify(rawSource({ worker: 7001, publisher: 8 }))
        yield* Effect.promise(() =>
          client.put(`${PREFIX}/sources/prod.backend.generate/7001/0/8`).value(good).exec()
        )
        const snapshot = yield* waitFor(
          discovery,
          "one valid source",
          (s) => s.sources.length === 1 && s.rejectedSources.length === 2
        )
        expect(snapshot.sources.map((s) => s.publisherId)).toEqual([8n])
        expect(snapshot.rejectedSources.map((r) => [r.recordKey, r.publisherId, r.reason])).toEqual([
          ["prod.backend.generate/7001/0/5", 5n, 'unknown field "extra"'],
          [
            "prod.backend.generate/7001/0/7",
            7n,
            `its value belongs at ${PREFIX}/sources/prod.backend.generate/7001/0/6`
          ]
        ])
        expect(snapshot.cards).toEqual([llama])
        expect(sourceKey(PREFIX, snapshot.sources[0]!)).toBe(
          `${PREFIX}/sources/prod.backend.generate/7001/0/8`
        )
      }).pipe(Effect.scoped)
  )

  it.live.skipIf(skipEtcd)(
    `while etcd is away the last records stay in force (stale); after the restart changes are followed${skipped}`,
    () =>
      Effect.gen(function* () {
        const server = yield* etcdServer
        const discovery = yield* makeEtcdDiscovery({
          endpoints: [server.url],
          prefix: PREFIX,
          backoffInitial: "50 millis",
          backoffMax: "500 millis",
          callTimeout: "2 seconds"
        })
        const registrar = yield* makeEtcdRegistrar({
          endpoints: [server.url],
          prefix: PREFIX,
          ttlSeconds: 30
        })
        const cardScope = yield* Scope.make()
        yield* registrar.registerCard(llama).pipe(Scope.extend(cardScope))
        yield* registrar.registerSource(llamaSource)
        const before = yield* waitFor(discovery, "the card and source", (s) => s.sources.length === 1)
        const live = yield* discovery.status
        expect(live.state).toBe("live")

        yield* server.stop
        const stale = yield* waitForStatus(discovery, "stale")
        expect(stale.since.getTime()).toBeGreaterThanOrEqual(live.since.getTime())
        // Nothing was withdrawn for the outage: the very same records, the same stream state.
        const during = yield* discovery.current
        expect(during.cards).toBe(before.cards)
        expect(during.sources).toBe(before.sources)
        expect(during.sourceStream).toEqual({ epoch: 0, bound: true })
        yield* server.start
        yield* waitForStatus(discovery, "live", 15_000)

        // Changes after the restart: the card withdrawn, a new source added.
        const second = source({ endpoint: "prod.backend.generate", worker: 7002, rank: 0, publisher: "42" })
        yield* registrar.registerSource(second)
        yield* Scope.close(cardScope, Exit.void)
        const converged = yield* waitFor(
          discovery,
          "the new state after the restart",
          (s) => s.cards.length === 0 && s.sources.length === 2,
          15_000
        )
        expect(converged.sources.map((s) => s.publisherId).sort((a, b) => (a < b ? -1 : 1))).toEqual([
          42n,
          123456789n
        ])
        expect(converged.sourceStream).toEqual({ epoch: 0, bound: true })
        // The rebound watch delivers later changes too.
        yield* registrar.registerCard(llama)
        yield* waitFor(discovery, "a change after the rebind", (s) => s.cards.length === 1)
      }).pipe(Effect.scoped)
  )

  it.live.skipIf(skipEtcd)(
    `an etcd not running at start: connecting with no records, then its records once it starts${skipped}`,
    () =>
      Effect.gen(function* () {
        const server = yield* etcdServerNotStarted
        const discovery = yield* makeEtcdDiscovery({
          endpoints: [server.url],
          prefix: PREFIX,
          backoffInitial: "50 millis",
          backoffMax: "500 millis",
          callTimeout: "2 seconds"
        })
        const initial = yield* discovery.current
        expect(initial.cards).toEqual([])
        expect(initial.sources).toEqual([])
        const connecting = yield* discovery.status
        expect(connecting.state).toBe("connecting")
        yield* server.start
        const client = yield* rawClient(server.url)
        const cardText = Either.getOrThrow(encodeJsonText(ModelCardInstanceJson)(llama))
        yield* Effect.promise(() => client.put(cardKey(PREFIX, llama)).value(cardText).exec())
        yield* waitFor(discovery, "the card once etcd runs", (s) => s.cards.length === 1, 15_000)
        const live = yield* waitForStatus(discovery, "live")
        expect(live.since.getTime()).toBeGreaterThanOrEqual(connecting.since.getTime())
      }).pipe(Effect.scoped)
  )

  it.live.skipIf(skipEtcd)(
    `a value nested 100,000 deep is logged once and skipped; the watch keeps working, and a defect restarts it${skipped}`,
    () =>
      Effect.gen(function* () {
        const logs: Array<string> = []
        const logger = Logger.make(({ message }) => {
          logs.push(Array.isArray(message) ? message.map(String).join(" ") : String(message))
        })
        const server = yield* etcdServer
        const client = yield* rawClient(server.url)
        const deep = `${"[".repeat(100_000)}${"]".repeat(100_000)}`
        const cardText = Either.getOrThrow(encodeJsonText(ModelCardInstanceJson)(llama))
        yield* Effect.promise(() => client.put(`${PREFIX}/cards/prod/backend/generate/66`).value(deep).exec())
        const faults = makeLoopFaults()
        const discovery = yield* makeEtcdDiscovery({
          endpoints: [server.url],
          prefix: PREFIX,
          backoffInitial: "50 millis"
        }).pipe(
          Effect.provide(Logger.replace(Logger.defaultLogger, logger)),
          Effect.provideService(LoopFaults, faults)
        )
        expect((yield* discovery.current).cards).toEqual([])
        // Through the watch too: a deep source value, then a good card after it.
        yield* Effect.promise(() =>
          client.put(`${PREFIX}/sources/prod.backend.generate/7001/0/5`).value(deep).exec()
        )
        yield* Effect.promise(() => client.put(cardKey(PREFIX, llama)).value(cardText).exec())
        const snapshot = yield* waitFor(
          discovery,
          "the good card after the deep values",
          (s) => s.cards.length === 1 && s.rejectedSources.length === 1
        )
        expect(snapshot.cards).toEqual([llama])
        expect(snapshot.rejectedSources[0]?.reason).toBe("the value is nested deeper than 64 levels")
        // A defect in the watch loop's next step: the supervisor restarts it, and the fresh
        // session's listing (which re-reads both deep values) finds the card the dead step lost.
        const restarts = supervisedRestarts("discovery.etcd")
        faults.arm("discovery.etcd")
        const other = card({ endpoint: "prod.backend.generate", worker: 7002 })
        const otherText = Either.getOrThrow(encodeJsonText(ModelCardInstanceJson)(other))
        yield* Effect.promise(() => client.put(cardKey(PREFIX, other)).value(otherText).exec())
        yield* waitFor(discovery, "the card put while the loop died", (s) => s.cards.length === 2)
        expect(supervisedRestarts("discovery.etcd")).toBe(restarts + 1)
        expect(logs.some((line) => line.includes("supervised loop discovery.etcd failed"))).toBe(true)
        // The restarted watch follows changes: a third deep value, then a third card.
        yield* Effect.promise(() => client.put(`${PREFIX}/cards/prod/backend/generate/67`).value(deep).exec())
        const third = card({ endpoint: "prod.backend.generate", worker: 7003 })
        const thirdText = Either.getOrThrow(encodeJsonText(ModelCardInstanceJson)(third))
        yield* Effect.promise(() => client.put(cardKey(PREFIX, third)).value(thirdText).exec())
        yield* waitFor(discovery, "the third card", (s) => s.cards.length === 3)
        // Each deep value was reported exactly once, in a short line, across the re-list.
        const deepLines = logs.filter((line) => line.includes("nested deeper than 64 levels"))
        expect(deepLines).toHaveLength(3)
        for (const line of deepLines) expect(line.length).toBeLessThan(200)
        expect((yield* discovery.status).state).toBe("live")
      }).pipe(Effect.scoped)
  )
})
