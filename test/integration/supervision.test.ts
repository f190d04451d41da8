/**
 * Every long-lived loop of the relay restarts after a defect (a `LoopFaults` plan makes one step
 * of the named loop die once): the defect is counted in `kvrelay_supervised_restarts_total`, and
 * what the loop serves comes back. Real parts: file discovery, simulated Dynamo workers over real
 * ZeroMQ with their worker-query servers, the relay host and its HTTP API. Waits poll with bounded
 * real deadlines.
 */

import { describe, expect, it } from "@effect/vitest"
import { Effect, Either, Logger, LogLevel, Stream, SubscriptionRef } from "effect"
import { LoopFaults, makeLoopFaults, supervisedRestarts } from "../../src/observability/Supervised.js"
import type { ModelCardInstance } from "../../src/protocol/Discovery.js"
import type { EndpointId } from "../../src/protocol/Model.js"
import * as RelayHttpServer from "../../src/relay/http/RelayHttpServer.js"
import type { KvDcRelayService } from "../../src/relay/KvDcRelay.js"
import { PUBLICATION_HUB_LOOP } from "../../src/relay/PublicationHub.js"
import { makeDynamoZmqPublisher } from "../../src/simulate/DynamoZmqPublisher.js"
import { makeWorkerQueryServer } from "../../src/simulate/WorkerQueryServer.js"
import { RECEIVE_LOOP } from "../../src/transport/ZmqSocket.js"
import { card, endpoint } from "../discovery/fixtures.js"
import { awaitCatalog, discoveryFile } from "../relay/hostFixtures.js"
import {
  addressesBy,
  awaitFilter,
  hashes,
  poolOf,
  ROUTER,
  routerCard,
  startRelay
} from "./relayHostFixtures.js"
import { eventually } from "./zmqHelpers.js"

const OTHER = endpoint("prod.other.generate")
const otherCard = (worker: string): ModelCardInstance =>
  card({ endpoint: OTHER.toString(), worker, name: "mistral", sourcePath: "mistral/7b", blockSize: 512 })

const dynamoWorker = (workerId: string, kvStateEndpoint: EndpointId) =>
  Effect.gen(function* () {
    const server = yield* makeWorkerQueryServer({ workerId, dpRanks: [0] })
    const publisher = yield* makeDynamoZmqPublisher({ workerId, dpRank: 0, queryServer: server })
    return { publisher, source: yield* publisher.source(kvStateEndpoint), addresses: addressesBy(publisher) }
  }).pipe(Effect.orDie)

/** Expected log lines are errors; keep the run's output to what is unexpected. */
const silent = Logger.minimumLogLevel(LogLevel.None)

/** A relay over a file with one router worker whose first blocks are visible. */
const setup = Effect.gen(function* () {
  const faults = makeLoopFaults()
  const worker = yield* dynamoWorker("7001", ROUTER)
  const file = yield* discoveryFile([routerCard("7001")], [worker.source])
  const relay = yield* startRelay(file).pipe(Effect.provideService(LoopFaults, faults))
  const first = hashes(0x1000_0000_0000n, 3)
  yield* worker.publisher.store(first)
  yield* awaitFilter(relay, ROUTER, "the first blocks", worker.addresses(first))
  return { faults, worker, file, relay, first }
})

/** Waits until `loop` restarted `count` more times than `before`. */
const restarted = (loop: string, before: number, count = 1) =>
  eventually(
    Effect.sync(() => supervisedRestarts(loop) >= before + count),
    `a restart of ${loop}`,
    10_000
  ).pipe(Effect.tap(() => Effect.sync(() => expect(supervisedRestarts(loop)).toBe(before + count))))

describe("supervised relay loops (real ZeroMQ, file discovery)", () => {
  it.scopedLive(
    "relay.membership: a defect applying a view restarts it and the new endpoint materializes",
    () =>
      Effect.gen(function* () {
        const { faults, worker, file, relay } = yield* setup
        const other = yield* dynamoWorker("8001", OTHER)
        const before = supervisedRestarts("relay.membership")
        faults.arm("relay.membership")
        yield* file.write([routerCard("7001"), otherCard("8001")], [worker.source, other.source])
        yield* restarted("relay.membership", before)
        yield* poolOf(relay, OTHER, "the other endpoint's pool")
        const blocks = hashes(0x2000_0000_0000n, 2)
        yield* other.publisher.store(blocks)
        yield* awaitFilter(relay, OTHER, "the other endpoint's blocks", other.addresses(blocks))
      }).pipe(Effect.provide(silent))
  )

  it.scopedLive(
    "relay.endpoint-slot: a slot that dies drains its generation and attaches a new one with the worker's blocks",
    () =>
      Effect.gen(function* () {
        const { faults, worker, file, relay, first } = yield* setup
        const pool = yield* poolOf(relay, ROUTER, "the router pool")
        const before = supervisedRestarts("relay.endpoint-slot")
        faults.arm("relay.endpoint-slot")
        // Any change wakes the slot: a new alias.
        const aliased = card({ ...routerSpec, aliases: ["chat", "assistant"] })
        yield* file.write([aliased], [worker.source])
        yield* restarted("relay.endpoint-slot", before)
        const next = yield* awaitCatalog(relay.catalogRef, "a new generation", (catalog) =>
          catalog.pools.some((p) => p.producer.layoutGeneration > pool.producer.layoutGeneration)
        )
        expect(next.pools).toHaveLength(1)
        // The new generation restored the worker's blocks from its tree dump, and follows it.
        const later = hashes(0x3000_0000_0000n, 2)
        yield* worker.publisher.store(later)
        yield* awaitFilter(
          relay,
          ROUTER,
          "the blocks after the restart",
          worker.addresses([...first, ...later])
        )
        expect((yield* relay.health).healthy).toBe(true)
      }).pipe(Effect.provide(silent))
  )

  it.scopedLive(
    "relay.source-readiness: the readiness poll restarts, and a source added later activates once connected",
    () =>
      Effect.gen(function* () {
        const { faults, worker, file, relay, first } = yield* setup
        const before = supervisedRestarts("relay.source-readiness")
        faults.arm("relay.source-readiness")
        yield* restarted("relay.source-readiness", before)
        // Only the poll sees a new socket connect (the source change itself finds it connecting).
        const second = yield* dynamoWorker("7003", ROUTER)
        yield* file.write([routerCard("7001"), routerCard("7003")], [worker.source, second.source])
        const later = hashes(0x4000_0000_0000n, 2)
        yield* second.publisher.store(later)
        yield* awaitFilter(relay, ROUTER, "the new source's blocks", [
          ...worker.addresses(first),
          ...second.addresses(later)
        ])
      }).pipe(Effect.provide(silent))
  )

  it.scopedLive(
    "relay.source-subscriber: a defect on a source change restarts it and the new source is followed",
    () =>
      Effect.gen(function* () {
        const { faults, worker, file, relay, first } = yield* setup
        const second = yield* dynamoWorker("7002", ROUTER)
        const before = supervisedRestarts("relay.source-subscriber")
        faults.arm("relay.source-subscriber")
        yield* file.write([routerCard("7001"), routerCard("7002")], [worker.source, second.source])
        yield* restarted("relay.source-subscriber", before)
        const blocks = hashes(0x5000_0000_0000n, 2)
        yield* second.publisher.store(blocks)
        yield* awaitFilter(relay, ROUTER, "both workers' blocks", [
          ...worker.addresses(first),
          ...second.addresses(blocks)
        ])
      }).pipe(Effect.provide(silent))
  )

  it.scopedLive(
    "transport.zmq-receive: a receive loop that dies reopens its socket; the lost message is recovered",
    () =>
      Effect.gen(function* () {
        const { faults, worker, relay, first } = yield* setup
        const before = supervisedRestarts(RECEIVE_LOOP)
        faults.arm(RECEIVE_LOOP)
        const lost = hashes(0x6000_0000_0000n, 2)
        yield* worker.publisher.store(lost)
        yield* restarted(RECEIVE_LOOP, before)
        // A later event shows the gap (or the dropped connection fences the rank) and recovery
        // brings the lost blocks back. Events published before the new socket connects are
        // lost as well, so publish until one arrives.
        let next = 0x6100_0000_0000n
        yield* eventually(
          Effect.suspend(() => {
            next += 0x1_0000_0001n
            return worker.publisher.store([next])
          }).pipe(Effect.zipRight(filterHas(relay, worker.addresses([...first, ...lost])))),
          "the lost blocks after the reopened subscription",
          15_000
        )
      }).pipe(Effect.provide(silent))
  )

  it.scopedLive(
    "relay.publication-hub: the hub resubscribes to its actor, retires its streams, and new streams follow the pool",
    () =>
      Effect.gen(function* () {
        const { faults, worker, relay } = yield* setup
        const pool = yield* poolOf(relay, ROUTER, "the router pool")
        // The lazy hub starts in the fiber of its first subscriber: give that fiber the plan.
        const frames = yield* relay
          .subscribePool(pool.producer, "supervision-test")
          .pipe(Effect.provideService(LoopFaults, faults))
        const ended = yield* frames.pipe(Stream.runDrain, Effect.either, Effect.fork)
        const before = supervisedRestarts(PUBLICATION_HUB_LOOP)
        faults.arm(PUBLICATION_HUB_LOOP)
        yield* worker.publisher.store(hashes(0x7000_0000_0000n, 2))
        yield* restarted(PUBLICATION_HUB_LOOP, before)
        // The open stream was retired; the generation stays.
        const end = yield* ended.await.pipe(Effect.map((exit) => exit._tag === "Success" && exit.value))
        expect(end && Either.isLeft(end)).toBe(true)
        const catalog = yield* SubscriptionRef.get(relay.catalogRef)
        expect(catalog.pools.map((p) => p.producer)).toEqual([pool.producer])
        // A new stream gets a snapshot, then the deltas of later blocks.
        const again = yield* relay.subscribePool(pool.producer, "supervision-test-2")
        const seen = yield* again.pipe(
          Stream.filter((frame) => frame.kind === "Delta"),
          Stream.take(1),
          Stream.runCollect,
          Effect.fork
        )
        yield* worker.publisher.store(hashes(0x7100_0000_0000n, 2))
        const deltas = yield* seen.await
        expect(deltas._tag).toBe("Success")
      }).pipe(Effect.provide(silent))
  )

  it.scopedLive("relay.topology and relay.load-windows: readiness and load keep flowing over HTTP", () =>
    Effect.gen(function* () {
      const { faults, worker, file, relay } = yield* setup
      const server = yield* RelayHttpServer.serve(relay, { host: "127.0.0.1", port: 0 }).pipe(
        Effect.provideService(LoopFaults, faults),
        Effect.orDie
      )
      const readiness = () =>
        Effect.promise(async () => {
          const response = await fetch(`${server.url}/v1/readiness`)
          return (await response.json()) as { readonly entries: ReadonlyArray<{ readonly state: string }> }
        })
      const topologyBefore = supervisedRestarts("relay.topology")
      faults.arm("relay.topology")
      // A catalog or membership change runs a topology step: the other endpoint appears.
      const other = yield* dynamoWorker("8002", OTHER)
      yield* file.write([routerCard("7001"), otherCard("8002")], [worker.source, other.source])
      yield* restarted("relay.topology", topologyBefore)
      yield* eventually(
        readiness().pipe(Effect.map((r) => r.entries.filter((e) => e.state === "READY").length === 2)),
        "both models READY in /v1/readiness",
        10_000
      )

      const loadBefore = supervisedRestarts("relay.load-windows")
      faults.arm("relay.load-windows")
      yield* restarted("relay.load-windows", loadBefore)
      const window = yield* Effect.promise(async () => {
        const response = await fetch(`${server.url}/v1/load/watch`)
        const reader = response.body!.getReader()
        const decoder = new TextDecoder()
        let text = ""
        // The current window at once, then one the restarted loop cut.
        while (text.split("event: load").length < 3) {
          const chunk = await reader.read()
          if (chunk.done) break
          text += decoder.decode(chunk.value)
        }
        await reader.cancel()
        return text
      })
      // The restarts are on /metrics, as a counter per loop.
      const metrics = yield* Effect.promise(async () => (await fetch(`${server.url}/metrics`)).text())
      expect(metrics).toMatch(/^# TYPE kvrelay_supervised_restarts_total counter$/m)
      for (const loop of ["relay.topology", "relay.load-windows"]) {
        const sample = metrics.match(
          new RegExp(`^kvrelay_supervised_restarts_total\\{loop="${loop}"\\} (\\d+)$`, "m")
        )
        expect(Number(sample?.[1])).toBe(supervisedRestarts(loop))
      }
      const sequences = [...window.matchAll(/"windowSequence":"(\d+)"/g)].map((m) => BigInt(m[1]!))
      expect(sequences.length).toBeGreaterThanOrEqual(2)
      expect(sequences[1]! > sequences[0]!).toBe(true)
    }).pipe(Effect.provide(silent))
  )
})

const routerSpec = {
  endpoint: ROUTER.toString(),
  worker: "7001",
  name: "llama",
  sourcePath: "meta/llama",
  blockSize: 512,
  runtime: { totalKvBlocks: "1000" }
}

const filterHas = (relay: KvDcRelayService, addresses: ReadonlyArray<bigint>) =>
  awaitFilter(relay, ROUTER, "the blocks", addresses).pipe(
    Effect.timeout("1 second"),
    Effect.option,
    Effect.map((found) => found._tag === "Some")
  )
