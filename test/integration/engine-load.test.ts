/**
 * Engine load in the relay (PROTOCOL §2 `metricsUrl`, §5 ◆3 "Engine load") over real sockets: a
 * relay host on a discovery file, engine ZeroMQ publishers, and fake engines serving metrics
 * pages in vLLM's names over HTTP. Load windows carry the pool's running and waiting sums, the
 * mean KV usage and the observed ranks; `/v1/stats` shows each source's last read and error; and
 * engines whose metrics hang never delay a sibling source's blocks.
 */

import { describe, expect, it } from "@effect/vitest"
import { Effect, Option } from "effect"
import type { KvEventSource } from "../../src/protocol/Discovery.js"
import type { KvDcRelayService, SourceStats } from "../../src/relay/KvDcRelay.js"
import * as LoadWindows from "../../src/relay/LoadWindows.js"
import { makeEngineZmqPublisher } from "../../src/simulate/EngineZmqPublisher.js"
import { fakeEngine, vllmPage } from "../load/engineFixtures.js"
import { discoveryFile } from "../relay/hostFixtures.js"
import {
  endpointStats,
  hashes,
  memberBlocks,
  poolOf,
  quiet,
  startRelay,
  VLLM,
  vllmCard
} from "./relayHostFixtures.js"
import { eventually } from "./zmqHelpers.js"

const engineSource = (
  workerId: string,
  dpRank: number,
  endpoint: string,
  publisherId: bigint,
  metricsUrl: string | undefined
): KvEventSource => ({
  kvStateEndpoint: VLLM,
  workerId,
  dpRank,
  publisherId,
  transport: { kind: "engine-zmq", endpoint, topic: "", replayEndpoint: null },
  recoveryTarget: null,
  ...(metricsUrl === undefined ? {} : { metricsUrl })
})

/** Load windows cut every 200 ms over the relay's pools and engine load. */
const windowsOf = (relay: KvDcRelayService) =>
  LoadWindows.make(relay.loadRef, { window: "200 millis", engineLoad: relay.engineLoad?.additions })

const latestPool = (windows: LoadWindows.LoadWindows) =>
  Effect.map(windows.current, (current) => Option.getOrUndefined(current)?.pools[0])

const sourcesOf = (relay: KvDcRelayService) =>
  endpointStats(relay, VLLM).pipe(Effect.map((stats): ReadonlyArray<SourceStats> => stats?.sources ?? []))

describe("engine load in the relay (PROTOCOL §5 ◆3)", () => {
  it.scopedLive(
    "two ranks behind one vLLM metrics URL: sums, mean usage and observed ranks in the window; a hanging engine becomes unknown, not zero",
    () =>
      Effect.gen(function* () {
        const engine = yield* fakeEngine({
          kind: "page",
          text: vllmPage({ 0: { running: 3, waiting: 1, kv: 0.25 }, 1: { running: 5, waiting: 4, kv: 0.75 } })
        })
        const rank0 = yield* makeEngineZmqPublisher({ workerId: "8401", dpRank: 0, format: "vllm" })
        const rank1 = yield* makeEngineZmqPublisher({ workerId: "8401", dpRank: 1, format: "vllm" })
        const file = yield* discoveryFile(
          [vllmCard("8401")],
          [
            engineSource("8401", 0, rank0.endpoint, yield* rank0.publisherId, engine.url),
            engineSource("8401", 1, rank1.endpoint, yield* rank1.publisherId, engine.url)
          ]
        )
        const relay = yield* startRelay(file)
        yield* poolOf(relay, VLLM, "the vllm pool")
        const windows = yield* windowsOf(relay)

        const known = yield* eventually(
          latestPool(windows).pipe(
            Effect.map((pool) => pool?.engine?.loadObservedRanks === 2 && pool.engine)
          ),
          "both ranks observed",
          10_000
        )
        expect(known).toEqual({ runningRequests: 8, waitingRequests: 5, kvUsage: 0.5, loadObservedRanks: 2 })
        const stats = yield* sourcesOf(relay)
        expect(stats.map((s) => s.metrics?.url)).toEqual([engine.url, engine.url])
        expect(
          stats.every((s) => s.metrics?.lastSuccessAt !== undefined && s.metrics.error === undefined)
        ).toBe(true)

        // Load that moves is followed.
        engine.behave({
          kind: "page",
          text: vllmPage({ 0: { running: 0, waiting: 0, kv: 0.1 }, 1: { running: 1, waiting: 0, kv: 0.3 } })
        })
        yield* eventually(
          latestPool(windows).pipe(Effect.map((pool) => pool?.engine?.runningRequests === 1)),
          "the new load in a window",
          10_000
        )

        // An engine that stops answering: its ranks drop out 3 s after their last read, and the
        // three values go with them (absent, never zero).
        engine.behave({ kind: "hang" })
        const unknown = yield* eventually(
          latestPool(windows).pipe(
            Effect.map((pool) => pool?.engine?.loadObservedRanks === 0 && pool.engine)
          ),
          "no rank observed",
          15_000
        )
        expect(unknown).toEqual({ loadObservedRanks: 0 })
        const failed = yield* eventually(
          sourcesOf(relay).pipe(
            Effect.map((sources) => sources.every((s) => s.metrics?.error?.reason === "timeout") && sources)
          ),
          "each source's read error in the stats",
          10_000
        )
        expect(failed).toHaveLength(2)
        expect(failed[0]!.metrics!.lastSuccessAt).toBeInstanceOf(Date)
      }).pipe(Effect.provide(quiet)),
    60_000
  )

  it.scopedLive("a source without metricsUrl has no engine load and no metrics in the stats", () =>
    Effect.gen(function* () {
      const rank0 = yield* makeEngineZmqPublisher({ workerId: "8402", dpRank: 0, format: "vllm" })
      const file = yield* discoveryFile(
        [vllmCard("8402")],
        [engineSource("8402", 0, rank0.endpoint, yield* rank0.publisherId, undefined)]
      )
      const relay = yield* startRelay(file)
      yield* poolOf(relay, VLLM, "the vllm pool")
      const windows = yield* windowsOf(relay)
      const pool = yield* eventually(latestPool(windows), "a window with the pool", 10_000)
      expect(pool.engine).toEqual({ loadObservedRanks: 0 })
      const [source] = yield* eventually(
        sourcesOf(relay).pipe(Effect.map((s) => s.length === 1 && s)),
        "the source in the stats"
      )
      expect(source!.metrics).toBeUndefined()
    }).pipe(Effect.provide(quiet))
  )

  it.scopedLive(
    "ingest is not delayed while every metrics endpoint hangs: a sibling source's blocks are indexed within 1 s",
    () =>
      Effect.gen(function* () {
        // Both ranks' engines accept the metrics request and never answer: each read holds a
        // connection and a permit until its 1 s timeout, tick after tick.
        const hanging = yield* Effect.forEach([0, 1], () => fakeEngine({ kind: "hang" }))
        const rank0 = yield* makeEngineZmqPublisher({ workerId: "8403", dpRank: 0, format: "vllm" })
        const rank1 = yield* makeEngineZmqPublisher({ workerId: "8403", dpRank: 1, format: "vllm" })
        const file = yield* discoveryFile(
          [vllmCard("8403")],
          [
            engineSource("8403", 0, rank0.endpoint, yield* rank0.publisherId, hanging[0]!.url),
            engineSource("8403", 1, rank1.endpoint, yield* rank1.publisherId, hanging[1]!.url)
          ]
        )
        const relay = yield* startRelay(file)
        yield* poolOf(relay, VLLM, "the vllm pool")
        yield* eventually(
          relay.health.pipe(Effect.map((h) => h.sources.live === 2)),
          "both sources live",
          15_000
        )
        // Every engine is being read (and hanging) before the blocks are sent.
        yield* eventually(
          Effect.sync(() => hanging[0]!.requests() >= 1 && hanging[1]!.requests() >= 1),
          "reads outstanding on the hanging engines",
          10_000
        )
        // Eight stores, each timed from its send until the stats show it: at least six must be
        // visible within 1 s (one or two slow passes on a loaded machine are noise; ingest held
        // behind the reads, which hang for 1 s at a time, would miss most of them).
        const timings: Array<number> = []
        for (let i = 0; i < 8; i++) {
          const before = yield* endpointStats(relay, VLLM).pipe(
            Effect.map((s) => memberBlocks(s, "8403", 1) ?? 0)
          )
          const started = performance.now()
          yield* rank1.store(hashes(0x6400_0000_0000n + BigInt(i) * 0x100n, 2))
          yield* eventually(
            endpointStats(relay, VLLM).pipe(Effect.map((s) => memberBlocks(s, "8403", 1) === before + 2)),
            "the sibling's blocks indexed",
            10_000
          )
          timings.push(performance.now() - started)
          yield* Effect.sleep(`${100 + 37 * i} millis`)
        }
        expect(
          timings.filter((ms) => ms < 1000).length,
          `ms from store to visible: ${timings.map(Math.round).join(", ")}`
        ).toBeGreaterThanOrEqual(6)
        // The reads really are stuck: the sources report timeouts, not successes.
        yield* eventually(
          sourcesOf(relay).pipe(
            Effect.map((sources) => sources.every((s) => s.metrics?.error?.reason === "timeout"))
          ),
          "timeouts in the stats",
          10_000
        )
      }).pipe(Effect.provide(quiet)),
    60_000
  )
})
