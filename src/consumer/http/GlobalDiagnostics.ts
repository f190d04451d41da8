/**
 * Diagnostics of `kvrelay global` (PROTOCOL §7): `GET /metrics`, `GET /v1/health` and
 * `GET /v1/stats`, and the query statistics of the overlap routes they report.
 *
 * One `GlobalDiagnostics` per server: its Prometheus registry (process metrics, build info,
 * fiber failures, the consumer's `kvrelay_global_*` Effect metrics, query counts and a query
 * latency histogram) and its `QueryStats`.
 */

import * as HttpServerResponse from "@effect/platform/HttpServerResponse"
import { Context, Effect, Either, Layer } from "effect"
import { Counter, Histogram, type Registry } from "prom-client"
import * as Prometheus from "../../observability/Prometheus.js"
import { GlobalHealthJson, GlobalStatsJson } from "../../protocol/GlobalApi.js"
import { encodeJson } from "../../protocol/Json.js"
import { GlobalConsumer, type GlobalConsumerService } from "../GlobalConsumer.js"

// ---------------------------------------------------------------------------------------------
// Query statistics

type QueryOutcome = "ok" | "invalid" | "not_found" | "unavailable" | "error"
const QUERY_OUTCOMES: ReadonlyArray<QueryOutcome> = ["ok", "invalid", "not_found", "unavailable", "error"]

/** What an HTTP status says about a query. */
const outcomeOf = (status: number): QueryOutcome =>
  status < 400
    ? "ok"
    : status === 404
      ? "not_found"
      : status === 503
        ? "unavailable"
        : status < 500
          ? "invalid"
          : "error"

/** Quantiles are taken over this many most recent queries of a route. */
const RECENT_QUERY_WINDOW = 1024

/** Seconds; from 50 µs (a cached probe) to 2.5 s (a batch against a stalled event loop). */
const LATENCY_BUCKETS = [
  0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1, 2.5
]

class RouteStats {
  count = 0
  readonly outcomes: Record<QueryOutcome, number> = {
    ok: 0,
    invalid: 0,
    not_found: 0,
    unavailable: 0,
    error: 0
  }
  totalMs = 0
  maxMs = 0
  /** A ring of the latest latencies (ms); `next` is where the next one goes. */
  readonly recent = new Float64Array(RECENT_QUERY_WINDOW)
  next = 0

  constructor(readonly route: string) {}

  record(outcome: QueryOutcome, ms: number): void {
    this.count++
    this.outcomes[outcome]++
    this.totalMs += ms
    if (ms > this.maxMs) this.maxMs = ms
    this.recent[this.next % RECENT_QUERY_WINDOW] = ms
    this.next++
  }
}

/** Nearest-rank quantile of sorted values. */
const quantile = (sorted: Float64Array, q: number): number =>
  sorted.length === 0 ? 0 : sorted[Math.min(sorted.length - 1, Math.ceil(q * sorted.length) - 1)]!

interface RouteStatsSnapshot {
  readonly route: string
  readonly count: number
  readonly outcomes: Readonly<Record<QueryOutcome, number>>
  readonly latency: {
    readonly meanMs: number
    readonly maxMs: number
    readonly p50Ms: number
    readonly p90Ms: number
    readonly p99Ms: number
    readonly recentSamples: number
  }
}

/** Counts and latencies of the query routes, also exposed on the registry it is given. */
export class QueryStats {
  private readonly routes = new Map<string, RouteStats>()
  private readonly histogram: Histogram<"route">

  constructor(registry: Registry, routes: ReadonlyArray<string>) {
    for (const route of routes) this.routes.set(route, new RouteStats(route))
    const stats = this
    new Counter({
      name: "kvrelay_global_queries_total",
      help: "overlap and route queries answered over HTTP, by route and outcome",
      labelNames: ["route", "outcome"],
      registers: [registry],
      collect(this: Counter<"route" | "outcome">) {
        this.reset()
        for (const route of stats.routes.values()) {
          for (const outcome of QUERY_OUTCOMES)
            this.inc({ route: route.route, outcome }, route.outcomes[outcome])
        }
      }
    })
    this.histogram = new Histogram({
      name: "kvrelay_global_query_duration_seconds",
      help: "overlap and route query latency over HTTP (request read to response built), by route",
      labelNames: ["route"],
      buckets: LATENCY_BUCKETS,
      registers: [registry]
    })
  }

  record(route: string, status: number, ms: number): void {
    let stats = this.routes.get(route)
    if (stats === undefined) {
      stats = new RouteStats(route)
      this.routes.set(route, stats)
    }
    stats.record(outcomeOf(status), ms)
    this.histogram.observe({ route }, ms / 1000)
  }

  snapshot(): ReadonlyArray<RouteStatsSnapshot> {
    return [...this.routes.values()].map((stats) => {
      const size = Math.min(stats.next, RECENT_QUERY_WINDOW)
      const sorted = stats.recent.slice(0, size).sort()
      return {
        route: stats.route,
        count: stats.count,
        outcomes: { ...stats.outcomes },
        latency: {
          meanMs: stats.count === 0 ? 0 : stats.totalMs / stats.count,
          maxMs: stats.maxMs,
          p50Ms: quantile(sorted, 0.5),
          p90Ms: quantile(sorted, 0.9),
          p99Ms: quantile(sorted, 0.99),
          recentSamples: size
        }
      }
    })
  }
}

// ---------------------------------------------------------------------------------------------
// The service

/** The query routes, listed (with zero counts) before their first query. */
const QUERY_ROUTES: ReadonlyArray<string> = [
  "/v1/overlap",
  "/v1/overlap/batch",
  "/v1/route",
  "/v1/route/batch"
]

interface GlobalDiagnosticsService {
  readonly exposition: Prometheus.PrometheusExposition
  readonly queries: QueryStats
}

/**
 * What the global consumer's diagnostic routes read: its Prometheus exposition and query counters.
 */
export class GlobalDiagnostics extends Context.Tag("kvrelay/GlobalDiagnostics")<
  GlobalDiagnostics,
  GlobalDiagnosticsService
>() {}

/** A registry over the `kvrelay_global_*` Effect metrics and fresh query statistics. */
export const layer: Layer.Layer<GlobalDiagnostics> = Layer.scoped(
  GlobalDiagnostics,
  Effect.gen(function* () {
    const exposition = yield* Prometheus.make({
      effectMetricPrefixes: ["kvrelay_global_", "kvrelay_supervised_"]
    })
    return { exposition, queries: new QueryStats(exposition.registry, QUERY_ROUTES) }
  })
)

/** Times `handler` and records its status under `route`. */
export const timedQuery =
  (route: string) =>
  <E, R>(
    handler: Effect.Effect<HttpServerResponse.HttpServerResponse, E, R>
  ): Effect.Effect<HttpServerResponse.HttpServerResponse, E, R | GlobalDiagnostics> =>
    Effect.flatMap(GlobalDiagnostics, ({ queries }) =>
      Effect.suspend(() => {
        const started = performance.now()
        return Effect.tap(handler, (response) =>
          Effect.sync(() => queries.record(route, response.status, performance.now() - started))
        )
      })
    )

// ---------------------------------------------------------------------------------------------
// Handlers

const JSON_TYPE = "application/json"

const json = (status: number, body: unknown): HttpServerResponse.HttpServerResponse =>
  HttpServerResponse.text(JSON.stringify(body), { status, contentType: JSON_TYPE })

const internal = (message: string): HttpServerResponse.HttpServerResponse =>
  json(500, { reason: "INTERNAL", message })

/** `GET /metrics` of the global consumer. */
export const metrics: Effect.Effect<
  HttpServerResponse.HttpServerResponse,
  never,
  GlobalConsumer | GlobalDiagnostics
> = Effect.gen(function* () {
  const consumer = yield* GlobalConsumer
  const { exposition } = yield* GlobalDiagnostics
  yield* consumer.refreshGauges
  return yield* exposition.text.pipe(
    Effect.map((text) => HttpServerResponse.text(text, { contentType: exposition.contentType })),
    Effect.catchTag("MetricsRenderError", (error) =>
      Effect.succeed(internal(`metrics could not be rendered: ${error.message}`))
    )
  )
})

const encodeHealth = encodeJson(GlobalHealthJson)
const encodeStats = encodeJson(GlobalStatsJson)

/** Lanes of each relay (by lane index) across the consumer's domains, and the ready ones. */
/** A relay's load or readiness watch as `/v1/stats` shows it (PROTOCOL §7.1: followed for routing). */
const watchStats = (consumer: GlobalConsumerService, relay: string, watch: "load" | "readiness") => {
  const status = consumer.signals.status(relay, watch)
  const received = watch === "load" ? consumer.signals.load(relay) : consumer.signals.readiness(relay)
  return {
    state: status.state,
    resubscribes: status.resubscribes,
    lastError: status.lastError,
    receivedAt: received === undefined ? undefined : new Date(received.receivedAtMs)
  }
}

const laneCounts = (consumer: GlobalConsumerService): Map<number, { lanes: number; ready: number }> => {
  const counts = new Map<number, { lanes: number; ready: number }>()
  for (const domain of consumer.domains()) {
    for (const lane of domain.lanes.values()) {
      const entry = counts.get(lane.lane) ?? { lanes: 0, ready: 0 }
      entry.lanes++
      if (lane.ready) entry.ready++
      counts.set(lane.lane, entry)
    }
  }
  return counts
}

/** `GET /v1/health` of the global consumer. */
export const health: Effect.Effect<HttpServerResponse.HttpServerResponse, never, GlobalConsumer> = Effect.map(
  GlobalConsumer,
  (consumer) => {
    const counts = laneCounts(consumer)
    const relays = consumer.relays().map((relay) => {
      const count = counts.get(relay.lane) ?? { lanes: 0, ready: 0 }
      return {
        name: relay.name,
        url: relay.url,
        connected: relay.connected,
        lanes: count.lanes,
        lanesReady: count.ready,
        lastError: relay.lastError
      }
    })
    const healthy = relays.some((relay) => relay.lanesReady > 0)
    const body = encodeHealth({ healthy, relays })
    return Either.isRight(body)
      ? json(healthy ? 200 : 503, body.right)
      : internal(`health could not be encoded: ${body.left.message}`)
  }
)

/** `GET /v1/stats` of the global consumer. */
export const stats: Effect.Effect<
  HttpServerResponse.HttpServerResponse,
  never,
  GlobalConsumer | GlobalDiagnostics
> = Effect.gen(function* () {
  const consumer = yield* GlobalConsumer
  const { queries } = yield* GlobalDiagnostics
  const domains = consumer.domains()
  const relays = consumer.relays().map((relay) => ({
    name: relay.name,
    url: relay.url,
    lane: relay.lane,
    connected: relay.connected,
    epochs: relay.epochs,
    lastError: relay.lastError,
    dcName: relay.info?.dcName,
    dcId: relay.info?.dcId,
    catalogRevision: relay.catalog?.revision,
    watches: {
      load: watchStats(consumer, relay.name, "load"),
      readiness: watchStats(consumer, relay.name, "readiness")
    },
    lanes: domains.flatMap((domain) => {
      const lane = domain.lanes.get(relay.lane)
      if (lane === undefined) return []
      const producer = lane.descriptor.producer
      return [
        {
          lane: lane.lane,
          domain: { cacheSemantics: domain.id.cacheSemantics, routingScope: domain.id.routingScope },
          poolId: producer.poolId,
          servingEndpoint: lane.descriptor.servingEndpoint,
          producerIncarnation: producer.producerIncarnation,
          layoutGeneration: producer.layoutGeneration,
          ready: lane.ready,
          installedSequence: lane.installedSequence,
          snapshotsInstalled: lane.snapshotsInstalled,
          deltasApplied: lane.deltasApplied,
          resubscribes: lane.resubscribes,
          faults: { total: lane.faults, byReason: { ...lane.faultsByKind } },
          lastFault: lane.lastFault
        }
      ]
    })
  }))
  const body = encodeStats({
    consumerInstance: consumer.consumerInstance,
    subscriberId: consumer.subscriberId,
    relays,
    queries: queries.snapshot()
  })
  return Either.isRight(body)
    ? json(200, body.right)
    : internal(`stats could not be encoded: ${body.left.message}`)
})
