/**
 * The relay's engine load (PROTOCOL §5 ◆3 "Engine load"): one metrics poller over every expected
 * source rank that advertises a `metricsUrl`, the values each pool's load-window entry gains, and
 * each source's last read for `/v1/stats`.
 *
 * Off the event path: the poller's reads run in fibers of their own (at most 16 at once, each
 * bounded to 1 s), and the window cut and the stats only look up what the reads left behind, so
 * an engine whose metrics hang never delays ingest, publication or a window.
 */

import * as NodeHttpClient from "@effect/platform-node/NodeHttpClient"
import { Effect, Layer, Metric, type Scope } from "effect"
import { type EngineLoadAdditions, engineLoadAdditions } from "../load/EngineLoadWindow.js"
import * as EngineMetrics from "../load/EngineMetrics.js"
import type { PoolLoadSnapshot } from "./PoolLoad.js"

/** The expected sources of one materialized pool generation, by its producer's key. */
export interface PoolSources {
  readonly producerKey: string
  /** `ns.component.endpoint`, the gauges' `endpoint` label. */
  readonly servingEndpoint: string
  readonly sources: ReadonlyArray<{ readonly dpRank: number; readonly metricsUrl: string | undefined }>
}

/** A source's metrics reads as `/v1/stats` shows them (PROTOCOL §5 ◆3). */
export interface SourceMetricsStats {
  readonly url: string
  /** When the last read of the URL ended; undefined before the first. */
  readonly lastReadAt: Date | undefined
  /** When a read last gave this rank its load. */
  readonly lastSuccessAt: Date | undefined
  /** Why the latest read gave the rank no load; undefined once a read succeeds. */
  readonly error: { readonly reason: string; readonly message: string } | undefined
}

/** The relay's engine load: each pool's load-window values and each source's reads (PROTOCOL §5 ◆3). */
export interface EngineLoad {
  /** The engine-load values of each of `pools` at `nowMs`, in the same order. Never waits on a read. */
  readonly additions: (
    pools: ReadonlyArray<PoolLoadSnapshot>,
    nowMs: number
  ) => Effect.Effect<ReadonlyArray<EngineLoadAdditions>>
  /** The reads of a source with `metricsUrl` at `dpRank`; undefined without a URL. */
  readonly sourceStats: (
    metricsUrl: string | undefined,
    dpRank: number
  ) => Effect.Effect<SourceMetricsStats | undefined>
}

/** The metrics poller's read bounds, interval and concurrency. */
export type EngineLoadOptions = EngineMetrics.EngineMetricsPollerOptions

// The pools' engine load as of the latest window, for dashboards; an unknown value is NaN.
const runningGauge = Metric.gauge("kv_dc_relay_engine_running_requests", {
  description: "running requests summed over the pool's observed ranks (NaN when unknown)"
})
const waitingGauge = Metric.gauge("kv_dc_relay_engine_waiting_requests", {
  description: "waiting requests summed over the pool's observed ranks (NaN when unknown)"
})
const kvUsageGauge = Metric.gauge("kv_dc_relay_engine_kv_usage", {
  description: "mean KV cache usage (0-1) of the pool's observed ranks (NaN when unknown)"
})
const observedGauge = Metric.gauge("kv_dc_relay_engine_load_observed_ranks", {
  description: "ranks of the pool whose engine metrics were read in the last 3 s"
})

const recordGauges = (endpoint: string, load: EngineLoadAdditions) =>
  Effect.all(
    [
      Metric.set(Metric.tagged(runningGauge, "endpoint", endpoint), load.runningRequests ?? Number.NaN),
      Metric.set(Metric.tagged(waitingGauge, "endpoint", endpoint), load.waitingRequests ?? Number.NaN),
      Metric.set(Metric.tagged(kvUsageGauge, "endpoint", endpoint), load.kvUsage ?? Number.NaN),
      Metric.set(Metric.tagged(observedGauge, "endpoint", endpoint), load.loadObservedRanks)
    ],
    { discard: true }
  )

/**
 * Starts the poller in the current scope. `pools` lists every materialized pool's expected
 * sources; the poller evaluates it once a tick, and the window cut uses the latest listing.
 */
export const make = (
  pools: Effect.Effect<ReadonlyArray<PoolSources>>,
  options: EngineLoadOptions = {}
): Effect.Effect<EngineLoad, never, Scope.Scope> =>
  Effect.gen(function* () {
    let latest: ReadonlyMap<string, PoolSources> = new Map()
    const sources = Effect.map(pools, (listing) => {
      latest = new Map(listing.map((pool) => [pool.producerKey, pool]))
      const out: Array<EngineMetrics.EngineMetricsSource> = []
      const seen = new Set<string>()
      for (const pool of listing)
        for (const source of pool.sources) {
          if (source.metricsUrl === undefined) continue
          const entry = { metricsUrl: source.metricsUrl, dpRank: source.dpRank }
          const key = EngineMetrics.sourceKey(entry)
          if (seen.has(key)) continue
          seen.add(key)
          out.push(entry)
        }
      return out
    })
    // Built in the relay's scope: the client (its connection pool) lives as long as the poller.
    const client = yield* Layer.build(NodeHttpClient.layerUndici)
    const poller = yield* EngineMetrics.make(sources, options).pipe(Effect.provide(client))

    const additions = (snapshots: ReadonlyArray<PoolLoadSnapshot>, nowMs: number) =>
      Effect.gen(function* () {
        const states = yield* poller.states
        const out: Array<EngineLoadAdditions> = []
        for (const pool of snapshots) {
          const listed = latest.get(pool.producer.key)
          const load = engineLoadAdditions(
            (listed?.sources ?? []).map((source) =>
              source.metricsUrl === undefined
                ? undefined
                : states.get(
                    EngineMetrics.sourceKey({ metricsUrl: source.metricsUrl, dpRank: source.dpRank })
                  )?.lastSuccess
            ),
            nowMs
          )
          if (listed !== undefined) yield* recordGauges(listed.servingEndpoint, load)
          out.push(load)
        }
        return out
      })

    const sourceStats = (metricsUrl: string | undefined, dpRank: number) =>
      metricsUrl === undefined
        ? Effect.succeed(undefined)
        : Effect.map(poller.states, (states): SourceMetricsStats => {
            const state = states.get(EngineMetrics.sourceKey({ metricsUrl, dpRank }))
            return {
              url: metricsUrl,
              lastReadAt: state?.lastAttemptMs === undefined ? undefined : new Date(state.lastAttemptMs),
              lastSuccessAt: state?.lastSuccess === undefined ? undefined : new Date(state.lastSuccess.atMs),
              error:
                state?.lastError === undefined
                  ? undefined
                  : { reason: state.lastError.reason, message: state.lastError.message }
            }
          })

    return { additions, sourceStats }
  })

/** The additions when the relay reads no engine metrics: every pool's load unknown. */
export const noEngineLoad: EngineLoad = {
  additions: (pools) => Effect.succeed(pools.map(() => ({ loadObservedRanks: 0 }))),
  sourceStats: () => Effect.succeed(undefined)
}
