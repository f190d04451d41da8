/**
 * A simulated engine's Prometheus endpoint (what a relay reads for engine load, PROTOCOL §2
 * `metricsUrl`, §5): `GET /metrics` answers the text exposition with the load gauges in vLLM's
 * names (`vllm:num_requests_running`, `vllm:num_requests_waiting`, `vllm:kv_cache_usage_perc`,
 * labelled `engine` and `model_name`, as `vllm/v1/metrics/loggers.py` writes them) or in
 * SGLang's (`sglang:num_running_reqs`, `sglang:num_queue_reqs`, `sglang:token_usage`, labelled
 * as `sglang/srt/metrics/collector.py` writes them for a server without data parallelism: no
 * `dp_rank`). The load is whatever the simulation sets; `movingLoad` makes it move.
 */

import { createServer, type Server } from "node:http"
import type { AddressInfo } from "node:net"
import { Clock, Duration, Effect, type Scope } from "effect"

/** The load a simulated engine reports. */
export interface SimulatedLoad {
  readonly running: number
  readonly waiting: number
  /** Fraction of the KV cache in use, 0–1. */
  readonly kvUsage: number
}

/** Whose gauge names and labels the page uses. */
export type MetricsFormat = "vllm" | "sglang"

/** A running simulated metrics endpoint: its URL and the load it serves. */
export interface EngineMetricsEndpoint {
  /** `http://HOST:PORT/metrics` with the bound port and the given host. */
  readonly url: string
  readonly port: number
  readonly set: (load: SimulatedLoad) => void
  readonly current: () => SimulatedLoad
}

/** A float as Python's `prometheus_client` prints it (`3.0`, `0.25`). */
const pyFloat = (value: number): string => (Number.isInteger(value) ? `${value}.0` : String(value))

const quoted = (text: string): string =>
  text.replace(/\\/g, "\\\\").replace(/"/g, '\\"').replace(/\n/g, "\\n")

/** The exposition text of one rank's load in an engine's names. */
export const engineMetricsPage = (
  format: MetricsFormat,
  model: string,
  load: SimulatedLoad,
  dpRank = 0
): string => {
  const gauge = (name: string, help: string, labels: string, value: number) =>
    `# HELP ${name} ${help}\n# TYPE ${name} gauge\n${name}{${labels}} ${pyFloat(value)}\n`
  if (format === "vllm") {
    const labels = `engine="${dpRank}",model_name="${quoted(model)}"`
    return (
      gauge(
        "vllm:num_requests_running",
        "Number of requests in model execution batches.",
        labels,
        load.running
      ) +
      gauge(
        "vllm:num_requests_waiting",
        "Number of requests waiting to be processed.",
        labels,
        load.waiting
      ) +
      gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", labels, load.kvUsage)
    )
  }
  const labels = `engine_type="unified",model_name="${quoted(model)}",pp_rank="0",tp_rank="0"`
  return (
    gauge("sglang:num_running_reqs", "The number of running requests.", labels, load.running) +
    gauge("sglang:num_queue_reqs", "The number of requests in the waiting queue.", labels, load.waiting) +
    gauge("sglang:token_usage", "The token usage.", labels, load.kvUsage)
  )
}

/**
 * Serves `GET /metrics` on `host` (port 0: any free port) until the scope closes; `advertiseHost`
 * is the host in `url` (default `host`).
 */
export const serveEngineMetrics = (options: {
  readonly format: MetricsFormat
  readonly model: string
  readonly host?: string | undefined
  readonly advertiseHost?: string | undefined
  readonly initial?: SimulatedLoad | undefined
}): Effect.Effect<EngineMetricsEndpoint, never, Scope.Scope> =>
  Effect.acquireRelease(
    Effect.async<{ readonly server: Server; readonly endpoint: EngineMetricsEndpoint }>((resume) => {
      let load: SimulatedLoad = options.initial ?? { running: 0, waiting: 0, kvUsage: 0 }
      const server = createServer((request, response) => {
        if (request.method !== "GET" || (request.url ?? "").split("?")[0] !== "/metrics") {
          response.writeHead(404, { "content-type": "text/plain" })
          response.end("not found")
          return
        }
        response.writeHead(200, { "content-type": "text/plain; version=0.0.4; charset=utf-8" })
        response.end(engineMetricsPage(options.format, options.model, load))
      })
      const host = options.host ?? "127.0.0.1"
      server.listen(0, host, () => {
        const { port } = server.address() as AddressInfo
        const shownHost = options.advertiseHost ?? host
        resume(
          Effect.succeed({
            server,
            endpoint: {
              url: `http://${shownHost.includes(":") ? `[${shownHost}]` : shownHost}:${port}/metrics`,
              port,
              set: (next) => {
                load = next
              },
              current: () => load
            }
          })
        )
      })
    }),
    ({ server }) =>
      Effect.async<void>((resume) => {
        server.closeAllConnections()
        server.close(() => resume(Effect.void))
      })
  ).pipe(Effect.map(({ endpoint }) => endpoint))

/** The wave `movingLoad` follows: its period, phase and crest, and the KV usage to report. */
export interface MovingLoadOptions {
  /** Seconds per full wave (default 40). */
  readonly periodS?: number | undefined
  /** Where in the wave this engine starts, 0–1 of a period. */
  readonly phase: number
  /** Running requests at the wave's crest (default 3). */
  readonly peakRunning?: number | undefined
  /** Waiting requests at the wave's crest (default 2). */
  readonly peakWaiting?: number | undefined
  /** The KV usage to report now (the simulation's own cache fill, say). */
  readonly kvUsage: () => number
}

/**
 * The load of `endpoint` follows a wave once a second until interrupted: busy half the period,
 * idle the other half, so engines with opposite phases take turns being the idle one.
 */
export const movingLoad = (
  endpoint: EngineMetricsEndpoint,
  options: MovingLoadOptions
): Effect.Effect<never> =>
  Effect.gen(function* () {
    const period = (options.periodS ?? 40) * 1000
    const peakRunning = options.peakRunning ?? 3
    const peakWaiting = options.peakWaiting ?? 2
    for (;;) {
      const angle = 2 * Math.PI * ((yield* Clock.currentTimeMillis) / period + options.phase)
      const wave = Math.max(0, Math.sin(angle))
      endpoint.set({
        running: Math.round(peakRunning * wave),
        waiting: Math.round(peakWaiting * wave * wave),
        kvUsage: Math.min(1, Math.max(0, options.kvUsage()))
      })
      yield* Effect.sleep(Duration.seconds(1))
    }
  })
