/**
 * `route_cost`: the §7.1 decision over 16 candidate lanes in process (what `/v1/route` adds to an
 * overlap query), against ordering the same 16 overlap results by depth, which `/v1/overlap`
 * already does. Candidates vary per decision (load, readiness, staleness, penalties), so the
 * overload and unknown-load paths are all taken.
 *
 * `engine_metrics_parse`: one engine's metrics page read per rank, a typical vLLM page (8 ranks,
 * ~100 kB) and a 5 MB one, against `parse-prometheus-text-format` parsing the whole page, which is
 * what reading it without the line selection would cost.
 */

import { performance } from "node:perf_hooks"
import parsePrometheusTextFormat from "parse-prometheus-text-format"
import { parseEngineMetrics } from "../src/load/EngineMetrics.js"
import { DEFAULT_ROUTE_POLICY } from "../src/protocol/RouteApi.js"
import { type CandidateLoad, type RouteCandidateInput, routeDecision } from "../src/routing/RouteCost.js"
import { type BenchContext, bestRates, record } from "./harness.js"

const LANES = 16
const BLOCK = 16
const VARIANTS = 256

const candidatesFor = (seed: number): ReadonlyArray<RouteCandidateInput<string>> => {
  const out: Array<RouteCandidateInput<string>> = []
  let x = seed * 2654435761
  const next = (n: number) => {
    x = (x ^ (x << 13)) >>> 0
    x = (x ^ (x >>> 17)) >>> 0
    x = (x ^ (x << 5)) >>> 0
    return x % n
  }
  for (let lane = 0; lane < LANES; lane++) {
    const depth = next(65)
    const load: CandidateLoad | undefined =
      next(10) === 0
        ? undefined
        : {
            runningRequests: next(64),
            waitingRequests: next(24),
            kvUsage: next(100) / 100,
            observedRanks: 1 + next(8),
            expectedRanks: 8,
            ageMs: next(4000)
          }
    out.push({
      relay: `dc-${lane}`,
      lane,
      poolId: `pool-${lane}`,
      servingEndpoint: "prod.backend.generate",
      ready: next(16) !== 0,
      readiness: "READY",
      prefixDepth: depth,
      matchedTokens: depth * BLOCK,
      promptTokens: 64 * BLOCK,
      load
    })
  }
  return out
}

interface Overlap {
  readonly relay: string
  readonly lane: number
  readonly prefixDepth: number
  readonly matchedTokens: number
}

export const benchRouteCost = (ctx: BenchContext): void => {
  const variants = Array.from({ length: VARIANTS }, (_, i) => candidatesFor(i + 1))
  const overlaps: Array<ReadonlyArray<Overlap>> = variants.map((candidates) =>
    candidates.map(({ relay, lane, prefixDepth, matchedTokens }) => ({
      relay,
      lane,
      prefixDepth,
      matchedTokens
    }))
  )
  const penalties = new Map([
    ["dc-3", 512],
    ["dc-7", 2048]
  ])
  const decisions = ctx.quick ? 20_000 : 200_000
  let sink = 0
  const [decide, sort] = bestRates(
    ctx.quick ? 3 : 7,
    [
      () => variants,
      (vs) => {
        for (let i = 0; i < decisions; i++) {
          const answer = routeDecision(vs[i % VARIANTS]!, DEFAULT_ROUTE_POLICY, penalties)
          sink += answer.candidates.length
        }
        return decisions
      }
    ],
    [
      () => overlaps,
      (os) => {
        for (let i = 0; i < decisions; i++) {
          const ordered = os[i % VARIANTS]!.map((o) => ({ ...o })).sort(
            (a, b) => b.prefixDepth - a.prefixDepth
          )
          sink += ordered.length
        }
        return decisions
      }
    ]
  )
  if (sink < 0) ctx.log("unreachable")
  record(ctx, "route_decision_16_lanes", "decisions/s", decide, sort, "vs ordering the 16 overlap results")
  record(ctx, "route_decision_16_lanes_cost", "ns", 1e9 / decide, null, "per decision")
}

const vllmPage = (ranks: number, histograms: number): string => {
  const parts: Array<string> = []
  const labels = (rank: number) => `engine="${rank}",model_name="meta-llama/Llama-3.1-8B-Instruct"`
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
  for (let h = 0; h < histograms; h++) {
    const name = `vllm:request_latency_${h}_seconds`
    parts.push(`# HELP ${name} Histogram of a latency in seconds.\n# TYPE ${name} histogram\n`)
    for (let rank = 0; rank < ranks; rank++) {
      for (const [i, le] of buckets.entries())
        parts.push(`${name}_bucket{${labels(rank)},le="${le}"} ${i + h}.0\n`)
      parts.push(`${name}_count{${labels(rank)}} ${h + 11}.0\n${name}_sum{${labels(rank)}} ${h * 0.5}\n`)
    }
  }
  for (const [name, value] of [
    ["vllm:num_requests_running", 3],
    ["vllm:num_requests_waiting", 1],
    ["vllm:kv_cache_usage_perc", 0.25]
  ] as const) {
    parts.push(`# HELP ${name} x\n# TYPE ${name} gauge\n`)
    for (let rank = 0; rank < ranks; rank++) parts.push(`${name}{${labels(rank)}} ${value}\n`)
  }
  return parts.join("")
}

const timeParse = (text: string, rounds: number, parse: (text: string) => unknown): number => {
  let best = Number.POSITIVE_INFINITY
  for (let r = 0; r < rounds; r++) {
    const start = performance.now()
    parse(text)
    best = Math.min(best, performance.now() - start)
  }
  return best
}

export const benchEngineMetricsParse = (ctx: BenchContext): void => {
  const ours = (text: string) => parseEngineMetrics(text)
  const whole = (text: string) => parsePrometheusTextFormat(`${text}\n`)
  const typical = vllmPage(8, 10)
  const rounds = ctx.quick ? 20 : 100
  const typicalOurs = timeParse(typical, rounds, ours)
  const typicalWhole = timeParse(typical, rounds, whole)
  record(
    ctx,
    "engine_metrics_parse_typical",
    "ms",
    typicalOurs,
    typicalWhole,
    `${Math.round(typical.length / 1024)} kB page, 8 ranks; vs parsing all of it (lower is better)`,
    true
  )
  let big = vllmPage(8, 10)
  for (let h = 10; big.length < 5 * 1024 * 1024; h *= 2) big = vllmPage(8, h)
  const bigRounds = ctx.quick ? 3 : 10
  const bigOurs = timeParse(big, bigRounds, ours)
  const bigWhole = timeParse(big, bigRounds, whole)
  record(
    ctx,
    "engine_metrics_parse_5mb",
    "ms",
    bigOurs,
    bigWhole,
    `${(big.length / 1024 / 1024).toFixed(1)} MB page; vs parsing all of it (lower is better)`,
    true
  )
}
