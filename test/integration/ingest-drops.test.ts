/**
 * Every dropped KV event batch is counted by reason on the relay's `/metrics`
 * (`kv_dc_relay_ingest_dropped_batches_total{reason}`): the relay host over file discovery and
 * real ZeroMQ, fed by a simulated vLLM engine and a simulated Dynamo worker, its HTTP API on
 * 127.0.0.1, the exposition read back with a Prometheus parser.
 */

import { describe, expect, it } from "@effect/vitest"
import { Effect } from "effect"
import { DROP_REASONS, type DropReason, storedEvent } from "../../src/protocol/Events.js"
import * as RelayHttpServer from "../../src/relay/http/RelayHttpServer.js"
import type { KvDcRelayService } from "../../src/relay/KvDcRelay.js"
import { makeDynamoZmqPublisher } from "../../src/simulate/DynamoZmqPublisher.js"
import { makeEngineZmqPublisher } from "../../src/simulate/EngineZmqPublisher.js"
import { makeWorkerQueryServer } from "../../src/simulate/WorkerQueryServer.js"
import { u64FrameOf } from "../../src/transport/ZmqSocket.js"
import { familyOf, namingProblems, parseExposition, sampleValue } from "../observability/exposition.js"
import { discoveryFile } from "../relay/hostFixtures.js"
import { vllmBatch, vllmStored } from "../transport/msgspec.js"
import {
  addressesBy,
  awaitFilter,
  hashes,
  poolOf,
  quiet,
  ROUTER,
  routerCard,
  startRelay,
  VLLM,
  vllmCard
} from "./relayHostFixtures.js"
import { eventually } from "./zmqHelpers.js"

const BLOCK = 16
const DROPPED = "kv_dc_relay_ingest_dropped_batches_total"

/** The relay's `/metrics`, parsed, as drop counts by reason. */
const scrapeDrops = (base: string) =>
  Effect.promise(async () => {
    const response = await fetch(`${base}/metrics`)
    const families = parseExposition(await response.text())
    expect(familyOf(families, DROPPED)?.type).toBe("COUNTER")
    expect(namingProblems(families)).toEqual([])
    const counts = {} as Record<DropReason, number>
    for (const reason of DROP_REASONS)
      counts[reason] = sampleValue(families, DROPPED, { reason }) ?? Number.NaN
    return counts
  })

const serveRelay = (relay: KvDcRelayService) =>
  Effect.map(RelayHttpServer.serve(relay, { host: "127.0.0.1", port: 0 }), (server) => server.url).pipe(
    Effect.orDie
  )

/**
 * Waits until `/v1/stats` counts a finished recovery: the relay's first recovery of a rank waits
 * for its SUB to connect, so the engine's later batches then arrive live.
 */
const awaitConnected = (base: string) =>
  eventually(
    Effect.promise(async () => {
      const stats: unknown = await (await fetch(`${base}/v1/stats`)).json()
      const recovered = (value: unknown): boolean =>
        typeof value === "object" &&
        value !== null &&
        Object.entries(value).some(
          ([key, v]) => (key === "recoveries" && typeof v === "number" && v >= 1) || recovered(v)
        )
      return recovered(stats)
    }),
    "the first recovery (after the event source connected)"
  )

/** Waits until `reason` counted `by` more drops than `before`, and returns the counts then. */
const awaitDrops = (base: string, before: Record<DropReason, number>, reason: DropReason, by = 1) =>
  eventually(
    Effect.map(scrapeDrops(base), (now) => now[reason] - before[reason] >= by && now),
    `${by} more ${reason} drop(s) on /metrics`
  )

describe("dropped KV event batches are counted by reason on /metrics", () => {
  it.scopedLive("an engine batch below the last accepted seq is counted stale", () =>
    Effect.gen(function* () {
      const rank0 = yield* makeEngineZmqPublisher({ workerId: "8001", dpRank: 0, format: "vllm" })
      const first = hashes(0x6100_0000_0000n, 2)
      yield* rank0.store(first)
      const file = yield* discoveryFile([vllmCard("8001")], [yield* rank0.source(VLLM)])
      const relay = yield* startRelay(file)
      yield* poolOf(relay, VLLM, "the vllm pool")
      const base = yield* serveRelay(relay)
      // The engine's next batches must arrive live, so that the stale one below is judged
      // against them: a batch published before the relay's SUB has connected is dropped by the PUB
      // (and reaches the relay only through replay). The relay's ZMTP reader connects on the
      // event loop, which the relay's start keeps busy for a while.
      yield* awaitConnected(base)
      const next = hashes(0x6200_0000_0000n, 2)
      yield* rank0.store(next.slice(0, 1))
      yield* rank0.store(next.slice(1))
      yield* awaitFilter(relay, VLLM, "the live blocks", addressesBy(rank0)([...first, ...next]))
      // Batches published before the subscription took effect reach the relay through replay,
      // which the decoder does not see: one more batch now, long after the subscriber's
      // handshake, is decoded live and sets the seq the stale batch falls below.
      const live = hashes(0x6280_0000_0000n, 1)
      yield* rank0.store(live)
      yield* awaitFilter(relay, VLLM, "a live block", addressesBy(rank0)(live))

      const before = yield* scrapeDrops(base)
      for (const reason of DROP_REASONS) expect(before[reason], reason).toBeGreaterThanOrEqual(0)
      const stale = hashes(0x6300_0000_0000n, 1)
      const payload = vllmBatch(
        [
          vllmStored(
            stale,
            Array.from({ length: BLOCK }, (_, i) => i),
            BLOCK
          )
        ],
        {
          version: "current",
          dpRank: 0n
        }
      )
      yield* rank0.sendRaw(["", u64FrameOf(1), payload])
      const after = yield* awaitDrops(base, before, "stale")
      expect(after.stale - before.stale).toBe(1)
      for (const reason of DROP_REASONS.filter((r) => r !== "stale"))
        expect(after[reason], reason).toBe(before[reason])
    }).pipe(Effect.provide(quiet))
  )

  it.scopedLive(
    "Dynamo batches going backwards, naming another worker or from an unknown publisher id are counted",
    () =>
      Effect.gen(function* () {
        const server = yield* makeWorkerQueryServer({ workerId: "7001", dpRanks: [0] })
        const worker = yield* makeDynamoZmqPublisher({ workerId: "7001", dpRank: 0, queryServer: server })
        const early = hashes(0x7100_0000_0000n, 2)
        yield* worker.store(early)
        const file = yield* discoveryFile([routerCard("7001")], [yield* worker.source(ROUTER)])
        const relay = yield* startRelay(file)
        yield* poolOf(relay, ROUTER, "the router pool")
        const base = yield* serveRelay(relay)
        const live = hashes(0x7200_0000_0000n, 2)
        yield* worker.store(live)
        const addresses = addressesBy(worker)
        yield* awaitFilter(relay, ROUTER, "the live blocks", addresses([...early, ...live]))

        let before = yield* scrapeDrops(base)
        // Event id 1 again, after 2: behind the rank's cursor.
        const behind = hashes(0x7300_0000_0000n, 1)
        yield* worker.publish([storedEvent("7001", 0, 1, behind)])
        before = yield* awaitDrops(base, before, "backwards")

        // The advertised publisher, but events of another worker.
        const next = yield* worker.nextEventId
        yield* worker.publish([storedEvent("7999", 0, next, hashes(0x7400_0000_0000n, 1))])
        before = yield* awaitDrops(base, before, "foreign-payload")

        // A new publisher id that discovery does not list: the envelopes match no source.
        yield* worker.restart()
        const unknown = hashes(0x7500_0000_0000n, 2)
        yield* worker.store(unknown)
        const after = yield* awaitDrops(base, before, "unknown-publisher")
        expect(after.stale).toBe(before.stale)
        // The unknown publisher's blocks did not reach the filter.
        yield* awaitFilter(
          relay,
          ROUTER,
          "only the accepted blocks",
          addresses([...early, ...live]),
          addresses(unknown)
        )
      }).pipe(Effect.provide(quiet))
  )
})
