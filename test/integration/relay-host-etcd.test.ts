/**
 * The relay host over the etcd backend, against a real etcd server started by the test (skipped
 * without an etcd binary): workers register their card and source under a lease; revocation and
 * expiry move the catalog, an etcd outage does not (PROTOCOL §2), and an etcd that starts after
 * the relay is picked up. Every wait polls with a bounded real deadline.
 */

import { describe, expect, it } from "@effect/vitest"
import { Effect, Exit, Layer, Logger, LogLevel, Scope, SubscriptionRef } from "effect"
import { Discovery } from "../../src/discovery/Discovery.js"
import { makeEtcdDiscovery, makeEtcdRegistrar } from "../../src/discovery/EtcdDiscovery.js"
import type { ModelCardInstance } from "../../src/protocol/Discovery.js"
import type { EndpointId } from "../../src/protocol/Model.js"
import * as RelayHttpServer from "../../src/relay/http/RelayHttpServer.js"
import type { KvDcRelayService } from "../../src/relay/KvDcRelay.js"
import * as RelayHost from "../../src/relay/RelayHost.js"
import { makeDynamoZmqPublisher } from "../../src/simulate/DynamoZmqPublisher.js"
import { makeWorkerQueryServer } from "../../src/simulate/WorkerQueryServer.js"
import { makeZmqEventTransport } from "../../src/transport/ZmqEventTransport.js"
import { card, endpoint } from "../discovery/fixtures.js"
import { awaitCatalog } from "../relay/hostFixtures.js"
import { etcdServer, etcdServerNotStarted, skipEtcd, skipped } from "./etcdHelpers.js"
import { eventually } from "./zmqHelpers.js"

const PREFIX = "/kvrelay-host-test/v1"
const SERVING = endpoint("prod.backend.generate")

const SERVING_2 = endpoint("prod.mistral.generate")

const llama: ModelCardInstance = card({ endpoint: SERVING.toString(), worker: 7001, aliases: ["chat"] })
const mistral: ModelCardInstance = card({
  endpoint: SERVING_2.toString(),
  worker: 7002,
  name: "mistral",
  sourcePath: "mistral/7b"
})

const quiet = Logger.minimumLogLevel(LogLevel.Warning)

/** A relay over etcd; discovery rebinds fast so the restart test stays short. */
const startRelay = (url: string) =>
  Effect.gen(function* () {
    const discovery = yield* makeEtcdDiscovery({
      endpoints: [url],
      prefix: PREFIX,
      backoffInitial: "50 millis",
      backoffMax: "500 millis",
      callTimeout: "2 seconds"
    })
    return yield* RelayHost.make({
      dcName: "test-dc",
      drtInstanceId: 9n,
      expectedUniqueBlocks: 1024,
      eventTransport: makeZmqEventTransport()
    }).pipe(Effect.provideService(Discovery, discovery))
  }).pipe(Effect.orDie)

const makeWorker = (workerId: string, serving: EndpointId) =>
  Effect.gen(function* () {
    const server = yield* makeWorkerQueryServer({ workerId, dpRanks: [0] })
    const publisher = yield* makeDynamoZmqPublisher({ workerId, dpRank: 0, queryServer: server })
    return { publisher, source: yield* publisher.source(serving) }
  }).pipe(Effect.orDie)

const worker = makeWorker("7001", SERVING)
const worker2 = makeWorker("7002", SERVING_2)

/** The relay's own HTTP API on a free port. */
const serveHttp = (relay: KvDcRelayService) =>
  Effect.map(RelayHttpServer.serve(relay, { host: "127.0.0.1", port: 0 }), (server) => server.url).pipe(
    Effect.orDie
  )

interface HealthBody {
  readonly healthy: boolean
  readonly activeEndpointCount: number
  readonly discovery: { readonly state: string; readonly since: string }
}

/** `GET /v1/health` over HTTP. */
const health = (url: string) =>
  Effect.promise(async () => {
    const response = await fetch(`${url}/v1/health`)
    return { status: response.status, body: (await response.json()) as HealthBody }
  })

const collectLogs = () => {
  const lines: Array<string> = []
  const logger = Logger.make(({ message }) => {
    lines.push(Array.isArray(message) ? message.join(" ") : String(message))
  })
  // Debug, so the discovery's quiet "rebind failed again" lines are seen.
  return {
    lines,
    layer: Layer.merge(Logger.replace(Logger.defaultLogger, logger), Logger.minimumLogLevel(LogLevel.Debug))
  }
}

const hasPool = (relay: KvDcRelayService, what: string, timeoutMs = 8000) =>
  awaitCatalog(relay.catalogRef, what, (catalog) => catalog.pools.length === 1, { timeoutMs }).pipe(
    Effect.map((catalog) => catalog.pools[0]!)
  )

const noPool = (relay: KvDcRelayService, what: string, timeoutMs = 8000) =>
  awaitCatalog(relay.catalogRef, what, (catalog) => catalog.pools.length === 0, { timeoutMs })

describe("relay host over etcd (real etcd)", () => {
  it.live.skipIf(skipEtcd)(
    `a leased registration materializes the pool; revocation and expiry withdraw it${skipped}`,
    () =>
      Effect.gen(function* () {
        const server = yield* etcdServer
        const relay = yield* startRelay(server.url)
        const { publisher, source } = yield* worker

        // Revocation: the worker's registrar scope closes (a clean shutdown).
        const registrarScope = yield* Scope.make()
        const registrar = yield* makeEtcdRegistrar({ endpoints: [server.url], prefix: PREFIX }).pipe(
          Scope.extend(registrarScope),
          Effect.orDie
        )
        yield* registrar.registerCard(llama).pipe(Scope.extend(registrarScope), Effect.orDie)
        yield* registrar.registerSource(source).pipe(Scope.extend(registrarScope), Effect.orDie)
        const pool = yield* hasPool(relay, "the registered pool")
        expect(pool.servingEndpoint.toString()).toBe(SERVING.toString())
        expect(pool.registrations.map((r) => r.model)).toEqual(["llama"])
        yield* publisher.store([0xabc0_0001n, 0xabc0_0002n])
        yield* eventually(
          relay.flush.pipe(
            Effect.zipRight(relay.stats),
            Effect.map((stats) => stats.endpoints[0]?.aggregation?.uniqueBlockCount === 2),
            Effect.orElseSucceed(() => false)
          ),
          "the worker's blocks"
        )
        yield* Scope.close(registrarScope, Exit.void)
        yield* noPool(relay, "the withdrawal after revocation")

        // Expiry: the worker stops keeping its lease alive (a crash).
        const crashed = yield* makeEtcdRegistrar({
          endpoints: [server.url],
          prefix: PREFIX,
          ttlSeconds: 1
        }).pipe(Effect.orDie)
        yield* crashed.registerCard(llama).pipe(Effect.orDie)
        yield* crashed.registerSource(source).pipe(Effect.orDie)
        const again = yield* hasPool(relay, "the re-registered pool")
        expect(again.producer.layoutGeneration).toBeGreaterThan(pool.producer.layoutGeneration)
        yield* crashed.releaseLease
        yield* noPool(relay, "the withdrawal after the lease expired")
        expect((yield* relay.health).endpointCount).toBe(0)
      }).pipe(Effect.scoped, Effect.provide(quiet))
  )

  it.live.skipIf(skipEtcd)(
    `etcd killed for a while: the catalog stays (discovery stale, healthy); after the restart changes are followed${skipped}`,
    () =>
      Effect.gen(function* () {
        const logs = collectLogs()
        const server = yield* etcdServer
        const relay = yield* startRelay(server.url).pipe(Effect.provide(logs.layer))
        const url = yield* serveHttp(relay)
        const { source } = yield* worker
        const registrar = yield* makeEtcdRegistrar({
          endpoints: [server.url],
          prefix: PREFIX,
          ttlSeconds: 30
        }).pipe(Effect.orDie)
        yield* registrar.registerCard(llama).pipe(Effect.orDie)
        yield* registrar.registerSource(source).pipe(Effect.orDie)
        const before = yield* hasPool(relay, "the registered pool")
        const catalogBefore = yield* SubscriptionRef.get(relay.catalogRef)
        expect((yield* health(url)).body.discovery.state).toBe("live")

        yield* server.stop
        const stale = yield* eventually(
          health(url).pipe(Effect.map((h) => h.body.discovery.state === "stale" && h)),
          "discovery stale in /v1/health",
          15_000
        )
        expect(stale.status).toBe(200)
        expect(stale.body.healthy).toBe(true)
        expect(Number.isNaN(Date.parse(stale.body.discovery.since))).toBe(false)
        // Held down until the relay has failed to rebind a few times: the catalog never moved.
        yield* eventually(
          Effect.sync(() => logs.lines.filter((line) => line.includes("rebind failed again")).length >= 3),
          "three failed rebinds",
          15_000
        )
        expect(yield* SubscriptionRef.get(relay.catalogRef)).toEqual(catalogBefore)
        expect((yield* health(url)).body).toMatchObject({
          healthy: true,
          activeEndpointCount: 1,
          discovery: { state: "stale", since: stale.body.discovery.since }
        })

        yield* server.start
        yield* eventually(
          health(url).pipe(Effect.map((h) => h.body.discovery.state === "live")),
          "discovery live again",
          15_000
        )
        // Same records after the restart: the very same pool, not a new generation.
        const after = yield* SubscriptionRef.get(relay.catalogRef)
        expect(after.pools.map((p) => p.producer)).toEqual([before.producer])

        // A second endpoint added, then the first one's card removed: both followed.
        const second = yield* worker2
        const cardScope = yield* Scope.make()
        yield* registrar.registerCard(mistral).pipe(Scope.extend(cardScope), Effect.orDie)
        yield* registrar.registerSource(second.source).pipe(Effect.orDie)
        yield* awaitCatalog(relay.catalogRef, "the added pool", (c) => c.pools.length === 2, {
          timeoutMs: 15_000
        })
        yield* Scope.close(cardScope, Exit.void)
        const last = yield* awaitCatalog(relay.catalogRef, "the removed pool", (c) => c.pools.length === 1, {
          timeoutMs: 15_000
        })
        expect(last.pools[0]?.producer).toEqual(before.producer)
        expect((yield* health(url)).body).toMatchObject({ healthy: true, discovery: { state: "live" } })
      }).pipe(Effect.scoped, Effect.provide(quiet))
  )

  it.live.skipIf(skipEtcd)(
    `a relay started before etcd serves an empty catalog (connecting), then its pool once etcd starts${skipped}`,
    () =>
      Effect.gen(function* () {
        const server = yield* etcdServerNotStarted
        const relay = yield* startRelay(server.url)
        const url = yield* serveHttp(relay)
        const connecting = yield* health(url)
        expect(connecting.status).toBe(200)
        expect(connecting.body).toMatchObject({
          healthy: true,
          endpointCount: 0,
          discovery: { state: "connecting" }
        })
        expect((yield* SubscriptionRef.get(relay.catalogRef)).pools).toEqual([])

        yield* server.start
        const { source } = yield* worker
        const registrar = yield* makeEtcdRegistrar({ endpoints: [server.url], prefix: PREFIX }).pipe(
          Effect.orDie
        )
        yield* registrar.registerCard(llama).pipe(Effect.orDie)
        yield* registrar.registerSource(source).pipe(Effect.orDie)
        yield* hasPool(relay, "the pool once etcd runs", 15_000)
        const live = yield* health(url)
        expect(live.body).toMatchObject({ healthy: true, discovery: { state: "live" } })
        expect(Date.parse(live.body.discovery.since)).toBeGreaterThanOrEqual(
          Date.parse(connecting.body.discovery.since)
        )
      }).pipe(Effect.scoped, Effect.provide(quiet))
  )
})
