/**
 * The relay host over the etcd backend, against a real etcd server started by the test (skipped
 * without an etcd binary): workers register their card and source under a lease; revocation,
 * expiry and an etcd restart move the catalog. Every wait polls with a bounded real deadline.
 */

import { describe, expect, it } from "@effect/vitest"
import { Effect, Exit, Logger, LogLevel, Scope, SubscriptionRef } from "effect"
import { Discovery } from "../../src/discovery/Discovery.js"
import { makeEtcdDiscovery, makeEtcdRegistrar } from "../../src/discovery/EtcdDiscovery.js"
import type { ModelCardInstance } from "../../src/domain/json.js"
import * as RelayHost from "../../src/relay/RelayHost.js"
import type { KvDcRelayService } from "../../src/relay/RelayService.js"
import { makeDynamoZmqPublisher } from "../../src/transport/DynamoZmqPublisher.js"
import { makeWorkerQueryServer } from "../../src/transport/WorkerQueryServer.js"
import { makeZmqEventTransport } from "../../src/transport/ZmqEventTransport.js"
import { card, endpoint } from "../discovery/fixtures.js"
import { awaitCatalog } from "../relay/hostFixtures.js"
import { etcdBinary, etcdServer, skipped } from "./etcdHelpers.js"
import { eventually } from "./zmqHelpers.js"

const PREFIX = "/kvrelay-host-test/v1"
const SERVING = endpoint("prod.backend.generate")

const llama: ModelCardInstance = card({ endpoint: SERVING.toString(), worker: 7001, aliases: ["chat"] })

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

const worker = Effect.gen(function* () {
  const server = yield* makeWorkerQueryServer({ workerId: "7001", dpRanks: [0] })
  const publisher = yield* makeDynamoZmqPublisher({ workerId: "7001", dpRank: 0, queryServer: server })
  return { publisher, source: yield* publisher.source(SERVING) }
}).pipe(Effect.orDie)

const hasPool = (relay: KvDcRelayService, what: string, timeoutMs = 8000) =>
  awaitCatalog(relay.catalogRef, what, (catalog) => catalog.pools.length === 1, { timeoutMs }).pipe(
    Effect.map((catalog) => catalog.pools[0]!)
  )

const noPool = (relay: KvDcRelayService, what: string, timeoutMs = 8000) =>
  awaitCatalog(relay.catalogRef, what, (catalog) => catalog.pools.length === 0, { timeoutMs })

describe("relay host over etcd (real etcd)", () => {
  it.live.skipIf(etcdBinary === undefined)(
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

  it.live.skipIf(etcdBinary === undefined)(
    `after an etcd restart the relay rebinds and converges to its pool${skipped}`,
    () =>
      Effect.gen(function* () {
        const server = yield* etcdServer
        const relay = yield* startRelay(server.url)
        const { source } = yield* worker
        const registrar = yield* makeEtcdRegistrar({
          endpoints: [server.url],
          prefix: PREFIX,
          ttlSeconds: 30
        }).pipe(Effect.orDie)
        yield* registrar.registerCard(llama).pipe(Effect.orDie)
        yield* registrar.registerSource(source).pipe(Effect.orDie)
        const before = yield* hasPool(relay, "the registered pool")

        yield* server.stop
        // The source stream failed: its sources are unknown until the re-list, so the pool goes.
        yield* noPool(relay, "the withdrawal while etcd is away")
        yield* server.start
        const after = yield* hasPool(relay, "the pool after the rebind", 10_000)
        expect(after.producer.layoutGeneration).toBeGreaterThan(before.producer.layoutGeneration)
        expect(after.producer.poolId.equals(before.producer.poolId)).toBe(true)
        const catalog = yield* SubscriptionRef.get(relay.catalogRef)
        expect(catalog.revision).toBeGreaterThan(2n)
        expect((yield* relay.health).healthy).toBe(true)
      }).pipe(Effect.scoped, Effect.provide(quiet))
  )
})
