/**
 * The global consumer's diagnostics (PROTOCOL §7) against real relays over real sockets:
 * `/v1/health` before and after a lane is ready and when the relay goes away, `/v1/stats` per
 * relay and lane (sequence, deltas, resubscribes, faults by reason) and for queries, and
 * `/metrics` read back with a Prometheus parser.
 */

import { describe, expect, it } from "@effect/vitest"
import { Effect, Either, Logger, LogLevel, type Scope } from "effect"
import { GlobalHealthJson, GlobalStatsJson } from "../../src/protocol/GlobalApi.js"
import { decodeJson } from "../../src/protocol/Json.js"
import { VERSION } from "../../src/version.js"
import {
  familyOf,
  namingProblems,
  PROCESS_FAMILIES,
  parseExposition,
  sampleValue
} from "../observability/exposition.js"
import { blockHashes, converged, eventually, startConsumer } from "./consumerHarness.js"
import { domainOf } from "./fakeRelay.js"
import { startDcRelay, startStoppableRelay } from "./realRelay.js"

const live = <A, E>(name: string, body: () => Effect.Effect<A, E, Scope.Scope>, timeout = 30_000) =>
  it.scopedLive(name, () => body().pipe(Logger.withMinimumLogLevel(LogLevel.Error)), timeout)

const DOMAIN = domainOf(1)

interface Reply {
  readonly status: number
  readonly text: string
  readonly json: unknown
}

const call = (url: string, path: string, init?: RequestInit): Effect.Effect<Reply> =>
  Effect.promise(async () => {
    const response = await fetch(`${url}${path}`, init)
    const text = await response.text()
    let json: unknown
    try {
      json = JSON.parse(text)
    } catch {
      json = undefined
    }
    return { status: response.status, text, json }
  })

const postOverlap = (url: string, body: unknown) =>
  call(url, "/v1/overlap", {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify(body)
  })

const decodedHealth = (json: unknown) =>
  Either.getOrThrowWith(decodeJson(GlobalHealthJson)(json), (e) => new Error(e.message))
const decodedStats = (json: unknown) =>
  Either.getOrThrowWith(decodeJson(GlobalStatsJson)(json), (e) => new Error(e.message))

describe("global consumer diagnostics against real relays", () => {
  live("GET /v1/health is 503 until a lane is ready, 200 then, and 503 again when the relay goes", () =>
    Effect.gen(function* () {
      const { relay: east, stop } = yield* startStoppableRelay("east")
      const { consumer, url } = yield* startConsumer([{ name: "east", url: east.url }])
      yield* eventually(
        "the relay's catalog is followed",
        Effect.sync(() => consumer.relays()[0]!.connected)
      )
      const before = yield* call(url, "/v1/health")
      expect(before.status).toBe(503)
      expect(before.json).toEqual({
        healthy: false,
        relays: [{ name: "east", url: east.url, connected: true, lanes: 0, lanesReady: 0, lastError: null }]
      })
      decodedHealth(before.json)

      const pool = yield* east.attach(DOMAIN, "prod.backend.generate")
      yield* pool.store("1", blockHashes(1, 8))
      yield* eventually("the lane is ready", converged(consumer, "east", pool))
      const ready = yield* call(url, "/v1/health")
      expect(ready.status).toBe(200)
      expect(ready.json).toEqual({
        healthy: true,
        relays: [{ name: "east", url: east.url, connected: true, lanes: 1, lanesReady: 1, lastError: null }]
      })

      yield* stop
      yield* eventually(
        "the relay is seen gone",
        Effect.map(call(url, "/v1/health"), (reply) => reply.status === 503)
      )
      const gone = decodedHealth((yield* call(url, "/v1/health")).json)
      expect(gone.healthy).toBe(false)
      expect(gone.relays[0]).toMatchObject({ name: "east", connected: false, lanesReady: 0 })
      expect(gone.relays[0]!.lastError).toEqual(expect.any(String))
    })
  )

  live("GET /v1/stats reports each relay's lanes: sequence, deltas, resubscribes and faults by reason", () =>
    Effect.gen(function* () {
      // One queued frame per subscriber: a burst of deltas lags the stream, a lane fault.
      const east = yield* startDcRelay("east", { publication: { queueCapacity: 1 } })
      const west = yield* startDcRelay("west")
      const eastPool = yield* east.attach(DOMAIN, "prod.backend.generate")
      const westPool = yield* west.attach(DOMAIN, "prod.backend.generate")
      yield* eastPool.store("1", blockHashes(1, 8))
      const { consumer, url } = yield* startConsumer([
        { name: "east", url: east.url },
        { name: "west", url: west.url }
      ])
      yield* eventually(
        "both lanes ready",
        Effect.zipWith(
          converged(consumer, "east", eastPool),
          converged(consumer, "west", westPool),
          (a, b) => a && b
        )
      )
      // After the snapshot: deltas.
      yield* westPool.store("7", blockHashes(2, 4))
      yield* westPool.store("7", blockHashes(3, 4))
      yield* eventually("west converges on its deltas", converged(consumer, "west", westPool))

      const laneOf = (relay: string) =>
        consumer
          .domains()
          .flatMap((d) => [...d.lanes.values()])
          .find((l) => l.relay === relay)
      const burst = blockHashes(21, 400)
      for (let round = 0; round < 10 && (laneOf("east")?.faults ?? 0) === 0; round++) {
        yield* Effect.forEach(
          Array.from({ length: 40 }, (_, i) => burst.slice(i * 10, i * 10 + 10)),
          (blocks) => eastPool.store(`${round + 10}`, blocks),
          { discard: true, concurrency: "unbounded" }
        )
        yield* Effect.sleep("50 millis")
      }
      yield* eventually("east recovers", converged(consumer, "east", eastPool))

      const reply = yield* call(url, "/v1/stats")
      expect(reply.status).toBe(200)
      const stats = decodedStats(reply.json)
      expect(stats.consumerInstance).toBe(consumer.consumerInstance)
      expect(stats.relays.map((r) => [r.name, r.lane, r.connected, r.dcName])).toEqual([
        ["east", 0, true, "east"],
        ["west", 1, true, "west"]
      ])
      const [eastStats, westStats] = stats.relays
      expect(eastStats!.dcId?.hex).toBe(east.dcId.hex)
      expect(typeof eastStats!.catalogRevision).toBe("bigint")
      expect(eastStats!.lastError).toBeUndefined()

      const westLane = westStats!.lanes[0]!
      expect(westStats!.lanes).toHaveLength(1)
      expect(westLane).toMatchObject({
        lane: 1,
        ready: true,
        snapshotsInstalled: 1,
        resubscribes: 0,
        faults: { total: 0, byReason: {} }
      })
      expect(westLane.deltasApplied).toBeGreaterThanOrEqual(1)
      expect(westLane.installedSequence).toBe(laneOf("west")!.installedSequence)
      expect(westLane.servingEndpoint.toString()).toBe("prod.backend.generate")
      expect(westLane.poolId.dcId.hex).toBe(west.dcId.hex)
      expect(westLane.domain.cacheSemantics.equals(DOMAIN.cacheSemantics)).toBe(true)
      // JSON carries u64s as decimal text.
      const westJson = (reply.json as { relays: Array<{ lanes: Array<Record<string, unknown>> }> }).relays[1]!
        .lanes[0]!
      expect(westJson.installedSequence).toBe(String(westLane.installedSequence))
      expect(westJson.producerIncarnation).toBe(String(westLane.producerIncarnation))

      const eastLane = eastStats!.lanes[0]!
      expect(eastLane.faults.total).toBeGreaterThanOrEqual(1)
      const reasons = Object.entries(eastLane.faults.byReason)
      expect(reasons.reduce((sum, [, n]) => sum + n, 0)).toBe(eastLane.faults.total)
      expect(eastLane.lastFault).toMatch(/SUBSCRIBER_LAGGED/)
      expect(eastLane.resubscribes).toBeGreaterThanOrEqual(1)
      expect(eastLane.snapshotsInstalled).toBeGreaterThanOrEqual(2)
      expect(eastLane.ready).toBe(true)
    })
  )

  live("GET /v1/stats and /metrics count queries by route and outcome, with latency", () =>
    Effect.gen(function* () {
      const east = yield* startDcRelay("east")
      const pool = yield* east.attach(DOMAIN, "prod.backend.generate")
      const prompt = blockHashes(5, 6)
      yield* pool.store("1", prompt)
      const { consumer, url } = yield* startConsumer([{ name: "east", url: east.url }])
      yield* eventually("the lane is ready", converged(consumer, "east", pool))

      const empty = yield* call(url, "/v1/stats")
      // Every query route is listed before its first query (the status page's table too).
      expect(decodedStats(empty.json).queries.map((q) => q.route)).toEqual([
        "/v1/overlap",
        "/v1/overlap/batch",
        "/v1/route",
        "/v1/route/batch"
      ])
      const idle = decodedStats(empty.json).queries.find((q) => q.route === "/v1/overlap")!
      expect(idle).toEqual({
        route: "/v1/overlap",
        count: 0,
        outcomes: { ok: 0, invalid: 0, not_found: 0, unavailable: 0, error: 0 },
        latency: { meanMs: 0, maxMs: 0, p50Ms: 0, p90Ms: 0, p99Ms: 0, recentSamples: 0 }
      })

      expect((yield* postOverlap(url, {})).status).toBe(400)
      const answered = yield* postOverlap(url, {
        namespace: "prod",
        model: "llama",
        localBlockHashes: prompt.map(String)
      })
      expect(answered.status).toBe(200)
      expect(
        (yield* postOverlap(url, { namespace: "prod", model: "nothing", localBlockHashes: [] })).status
      ).toBe(404)

      const stats = decodedStats((yield* call(url, "/v1/stats")).json)
      const overlap = stats.queries.find((q) => q.route === "/v1/overlap")!
      expect(overlap.count).toBe(3)
      expect(overlap.outcomes).toEqual({ ok: 1, invalid: 1, not_found: 1, unavailable: 0, error: 0 })
      expect(overlap.latency.recentSamples).toBe(3)
      expect(overlap.latency.maxMs).toBeGreaterThan(0)
      expect(overlap.latency.p50Ms).toBeGreaterThan(0)
      expect(overlap.latency.p50Ms).toBeLessThanOrEqual(overlap.latency.p99Ms)
      expect(overlap.latency.p99Ms).toBeLessThanOrEqual(overlap.latency.maxMs)
      expect(stats.queries.find((q) => q.route === "/v1/overlap/batch")!.count).toBe(0)

      const text = (yield* call(url, "/metrics")).text
      const families = parseExposition(text)
      expect(namingProblems(families)).toEqual([])
      for (const [name, type] of PROCESS_FAMILIES) expect(familyOf(families, name)?.type, name).toBe(type)
      expect(sampleValue(families, "kvrelay_build_info", { version: VERSION })).toBe(1)
      const route = { route: "/v1/overlap" }
      expect(sampleValue(families, "kvrelay_global_queries_total", { ...route, outcome: "ok" })).toBe(1)
      expect(sampleValue(families, "kvrelay_global_queries_total", { ...route, outcome: "invalid" })).toBe(1)
      const latency = familyOf(families, "kvrelay_global_query_duration_seconds")
      expect(latency?.type).toBe("HISTOGRAM")
      // The parser keeps a labelled histogram's buckets only; its count is read from the text.
      expect(text).toMatch(/^kvrelay_global_query_duration_seconds_count\{route="\/v1\/overlap"\} 3$/m)
      expect(familyOf(families, "kvrelay_global_lanes")?.type).toBe("GAUGE")
      expect(familyOf(families, "kvrelay_global_snapshots_installed_total")?.type).toBe("COUNTER")
      expect(sampleValue(families, "kvrelay_global_lanes", { relay: "east", state: "ready" })).toBe(1)
      // Only the consumer's own Effect metrics: the relays' are not mixed in.
      expect(families.filter((f) => f.name.startsWith("kv_dc_relay_"))).toEqual([])
    })
  )
})
