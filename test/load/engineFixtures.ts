/**
 * Metrics pages as vLLM and SGLang serve them (`prometheus_client`'s text exposition 0.0.4), in
 * their real names and labels, and fake engines serving them over real HTTP on 127.0.0.1.
 *
 * vLLM (`vllm/v1/metrics/loggers.py`): every series labelled `model_name` and `engine` (the
 * engine core's data-parallel rank). SGLang (`sglang/srt/metrics/collector.py` and the
 * scheduler's `init_metrics`): `model_name`, `engine_type`, `tp_rank`, `pp_rank`, `moe_ep_rank`,
 * `dp_rank` only with data parallelism, and `priority` with priority scheduling (the total under
 * `priority=""`, the breakdown under `priority="<n>"`).
 */

import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http"
import type { AddressInfo } from "node:net"
import { Effect, type Scope } from "effect"

/** A value as `prometheus_client` writes it: floats always (`3.0`), `NaN`, `+Inf`; a string is written as is. */
export const pyFloat = (value: number | string): string => {
  if (typeof value === "string") return value
  if (Number.isNaN(value)) return "NaN"
  if (value === Infinity) return "+Inf"
  if (value === -Infinity) return "-Inf"
  return Number.isInteger(value) ? `${value}.0` : String(value)
}

export interface RankValues {
  readonly running?: number | string
  readonly waiting?: number | string
  readonly kv?: number | string
}

const MODEL = "meta-llama/Llama-3.1-8B-Instruct"

const histogram = (name: string, help: string, labelsOf: ReadonlyArray<string>, seed: number): string => {
  const buckets = [
    "0.001",
    "0.005",
    "0.01",
    "0.02",
    "0.04",
    "0.06",
    "0.08",
    "0.1",
    "0.25",
    "0.5",
    "1.0",
    "+Inf"
  ]
  const lines = [`# HELP ${name} ${help}`, `# TYPE ${name} histogram`]
  for (const labels of labelsOf) {
    for (const [i, le] of buckets.entries())
      lines.push(`${name}_bucket{${labels},le="${le}"} ${pyFloat(seed + i)}`)
    lines.push(`${name}_count{${labels}} ${pyFloat(seed + buckets.length - 1)}`)
    lines.push(`${name}_sum{${labels}} ${pyFloat(seed * 0.5)}`)
  }
  return `${lines.join("\n")}\n`
}

export interface VllmPageOptions {
  /** Write the pre-0.10 `vllm:gpu_cache_usage_perc` in place of `vllm:kv_cache_usage_perc`. */
  readonly legacyKvName?: boolean
  /** Write both kv names (vLLM 0.9): the legacy one with this value per rank. */
  readonly legacyKvAlso?: (rank: number) => number
  /** Histogram families written before the gauges (page bulk). */
  readonly histograms?: number
}

/** A vLLM page with one `engine` label value per rank of `ranks`. */
export const vllmPage = (
  ranks: Readonly<Record<number, RankValues>>,
  options: VllmPageOptions = {}
): string => {
  const engines = Object.keys(ranks).map(Number)
  const labels = (rank: number) => `engine="${rank}",model_name="${MODEL}"`
  const parts: Array<string> = [
    "# HELP python_gc_objects_collected_total Objects collected during gc\n",
    "# TYPE python_gc_objects_collected_total counter\n",
    'python_gc_objects_collected_total{generation="0"} 12345.0\n'
  ]
  for (let h = 0; h < (options.histograms ?? 1); h++) {
    parts.push(
      histogram(
        h === 0 ? "vllm:time_to_first_token_seconds" : `vllm:time_to_first_token_seconds_${h}`,
        "Histogram of time to first token in seconds.",
        engines.map(labels),
        h
      )
    )
  }
  const gauge = (
    name: string,
    help: string,
    pick: (v: RankValues, rank: number) => number | string | undefined
  ) => {
    const series = engines
      .map((rank) => [rank, pick(ranks[rank]!, rank)] as const)
      .filter((entry): entry is readonly [number, number | string] => entry[1] !== undefined)
    if (series.length === 0) return
    parts.push(`# HELP ${name} ${help}\n# TYPE ${name} gauge\n`)
    for (const [rank, value] of series) parts.push(`${name}{${labels(rank)}} ${pyFloat(value)}\n`)
  }
  gauge("vllm:num_requests_running", "Number of requests in model execution batches.", (v) => v.running)
  gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.", (v) => v.waiting)
  if (options.legacyKvName === true || options.legacyKvAlso !== undefined) {
    gauge(
      "vllm:gpu_cache_usage_perc",
      "GPU KV-cache usage. 1 means 100 percent usage.DEPRECATED: Use vllm:kv_cache_usage_perc instead.",
      (v, rank) => (options.legacyKvAlso !== undefined ? options.legacyKvAlso(rank) : v.kv)
    )
  }
  if (options.legacyKvName !== true) {
    gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", (v) => v.kv)
  }
  parts.push(
    "# HELP vllm:prompt_tokens_total Number of prefill tokens processed.\n# TYPE vllm:prompt_tokens_total counter\n"
  )
  for (const rank of engines) parts.push(`vllm:prompt_tokens_total{${labels(rank)}} 123456.0\n`)
  return parts.join("")
}

export interface SglangSeries extends RankValues {
  /** The `dp_rank` label; absent without data parallelism. */
  readonly dpRank?: number
  readonly tpRank?: number
  /** Per-priority breakdown written besides the total (priority scheduling). */
  readonly byPriority?: Readonly<Record<number, RankValues>>
  /** Write the breakdown before the total. */
  readonly breakdownFirst?: boolean
}

/** An SGLang page with one scheduler series per entry of `series`. */
export const sglangPage = (series: ReadonlyArray<SglangSeries>): string => {
  const labels = (s: SglangSeries, priority?: string) =>
    [
      ...(s.dpRank === undefined ? [] : [`dp_rank="${s.dpRank}"`]),
      `engine_type="unified"`,
      `model_name="${MODEL}"`,
      `moe_ep_rank="0"`,
      `pp_rank="0"`,
      ...(priority === undefined ? [] : [`priority="${priority}"`]),
      `tp_rank="${s.tpRank ?? 0}"`
    ].join(",")
  const withPriority = series.some((s) => s.byPriority !== undefined)
  const parts: Array<string> = []
  const gauge = (
    name: string,
    help: string,
    pick: (v: RankValues) => number | string | undefined,
    split: boolean
  ) => {
    parts.push(`# HELP ${name} ${help}\n# TYPE ${name} gauge\n`)
    for (const s of series) {
      const value = pick(s)
      const total =
        value === undefined
          ? []
          : [`${name}{${labels(s, withPriority ? "" : undefined)}} ${pyFloat(value)}\n`]
      const breakdown: Array<string> = []
      for (const [priority, values] of split ? Object.entries(s.byPriority ?? {}) : []) {
        const part = pick(values)
        if (part !== undefined) breakdown.push(`${name}{${labels(s, priority)}} ${pyFloat(part)}\n`)
      }
      parts.push(...(s.breakdownFirst === true ? [...breakdown, ...total] : [...total, ...breakdown]))
    }
  }
  gauge("sglang:num_running_reqs", "The number of running requests.", (v) => v.running, true)
  gauge("sglang:num_used_tokens", "The number of used tokens.", () => 4096, false)
  gauge(
    "sglang:num_running_reqs_offline_batch",
    "The number of running low-priority offline batch requests(label is 'batch').",
    () => 0,
    false
  )
  gauge("sglang:token_usage", "The token usage.", (v) => v.kv, false)
  gauge("sglang:gen_throughput", "The generation throughput (token/s).", () => 86.5, false)
  gauge("sglang:num_queue_reqs", "The number of requests in the waiting queue.", (v) => v.waiting, true)
  gauge("sglang:cache_hit_rate", "The prefix cache hit rate.", () => 0.0075, false)
  parts.push(
    histogram(
      "sglang:time_to_first_token_seconds",
      "Histogram of time to first token in seconds.",
      series.map((s) => labels(s, withPriority ? "" : undefined)),
      3
    )
  )
  return parts.join("")
}

/** A vLLM page of at least `bytes` (histograms first, the load gauges at the very end). */
export const bigVllmPage = (
  bytes: number,
  ranks: Readonly<Record<number, RankValues>>,
  options: Omit<VllmPageOptions, "histograms"> = {}
): string => {
  const one = vllmPage(ranks, { ...options, histograms: 1 }).length
  const perHistogram = vllmPage(ranks, { ...options, histograms: 2 }).length - one
  return vllmPage(ranks, { ...options, histograms: 1 + Math.ceil(Math.max(0, bytes - one) / perHistogram) })
}

/** How a fake engine answers `GET /metrics`. */
export type EngineBehaviour =
  | { readonly kind: "page"; readonly text: string }
  | { readonly kind: "status"; readonly status: number }
  /** Accepts the request and never answers. */
  | { readonly kind: "hang" }
  /** Sends the headers and the first bytes, then nothing more. */
  | { readonly kind: "stall"; readonly first: string }
  /** Declares no length and streams `bytes` of page in 64 kB chunks. */
  | { readonly kind: "chunked"; readonly bytes: number }
  /** Closes the connection without answering. */
  | { readonly kind: "reset" }

export interface FakeEngine {
  readonly url: string
  /** Requests received so far. */
  readonly requests: () => number
  readonly behave: (behaviour: EngineBehaviour) => void
}

const answer = (behaviour: EngineBehaviour, request: IncomingMessage, response: ServerResponse) => {
  switch (behaviour.kind) {
    case "page":
      response.writeHead(200, { "content-type": "text/plain; version=0.0.4; charset=utf-8" })
      response.end(behaviour.text)
      return
    case "status":
      response.writeHead(behaviour.status, { "content-type": "text/plain" })
      response.end("Internal Server Error")
      return
    case "hang":
      return
    case "stall":
      response.writeHead(200, { "content-type": "text/plain; version=0.0.4" })
      response.write(behaviour.first)
      return
    case "chunked": {
      response.writeHead(200, { "content-type": "text/plain; version=0.0.4" })
      const line = `${"#".repeat(63)}\n`
      const chunk = line.repeat(1024)
      let sent = 0
      const pump = () => {
        while (sent < behaviour.bytes) {
          sent += chunk.length
          if (!response.write(chunk)) return void response.once("drain", pump)
        }
        response.end()
      }
      pump()
      return
    }
    case "reset":
      request.socket.destroy()
      return
  }
}

/** A fake engine on 127.0.0.1, closed (every connection dropped) with the scope. */
export const fakeEngine = (initial: EngineBehaviour): Effect.Effect<FakeEngine, never, Scope.Scope> =>
  Effect.acquireRelease(
    Effect.async<{ server: Server; engine: FakeEngine }>((resume) => {
      let behaviour = initial
      let requests = 0
      const server = createServer((request, response) => {
        requests++
        answer(behaviour, request, response)
      })
      server.listen(0, "127.0.0.1", () => {
        const { port } = server.address() as AddressInfo
        resume(
          Effect.succeed({
            server,
            engine: {
              url: `http://127.0.0.1:${port}/metrics`,
              requests: () => requests,
              behave: (next) => {
                behaviour = next
              }
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
  ).pipe(Effect.map(({ engine }) => engine))

/** A URL on 127.0.0.1 where nothing listens (a port that was bound, then released). */
export const deadUrl: Effect.Effect<string> = Effect.async<string>((resume) => {
  const server = createServer()
  server.listen(0, "127.0.0.1", () => {
    const { port } = server.address() as AddressInfo
    server.close(() => resume(Effect.succeed(`http://127.0.0.1:${port}/metrics`)))
  })
})
