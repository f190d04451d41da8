/**
 * One metrics page read per rank (PROTOCOL §5 "Engine load"), in each engine's real names and
 * labels: several ranks behind one page, the engines' label for the rank, missing gauges, NaN
 * and infinities (unknown, never zero), a 5 MB page, and pages that are no exposition at all
 * (a typed error naming what was wrong, never a throw).
 */

import { describe, expect, it } from "@effect/vitest"
import { Either, Option } from "effect"
import * as fc from "fast-check"
import {
  type EngineMetricsPage,
  loadForRank,
  parseEngineMetrics,
  type RankLoad
} from "../../src/load/EngineMetrics.js"
import { bigVllmPage, type RankValues, sglangPage, vllmPage } from "./engineFixtures.js"

const parsed = (text: string): EngineMetricsPage => {
  const result = parseEngineMetrics(text, "http://engine/metrics")
  if (Either.isLeft(result))
    throw new Error(`expected a page, got ${result.left.reason}: ${result.left.message}`)
  return result.right
}

const parseError = (text: string): string => {
  const result = parseEngineMetrics(text, "http://engine/metrics")
  if (Either.isRight(result))
    throw new Error(`expected a parse error, got ${JSON.stringify([...result.right.ranks])}`)
  expect(result.left._tag).toBe("EngineMetricsError")
  expect(result.left.reason).toBe("parse")
  expect(result.left.url).toBe("http://engine/metrics")
  return result.left.message
}

const ranksOf = (page: EngineMetricsPage): Record<number, RankLoad> => Object.fromEntries(page.ranks)

describe("vLLM pages", () => {
  it("splits a page shared by several data-parallel ranks by the engine label", () => {
    const page = parsed(
      vllmPage({
        0: { running: 3, waiting: 1, kv: 0.25 },
        1: { running: 7, waiting: 0, kv: 0.5 },
        3: { running: 0, waiting: 12, kv: 0.875 }
      })
    )
    expect(page.engines).toEqual(["vllm"])
    expect(page.unlabelled).toBeUndefined()
    expect(ranksOf(page)).toStrictEqual({
      0: { runningRequests: 3, waitingRequests: 1, kvUsage: 0.25 },
      1: { runningRequests: 7, waitingRequests: 0, kvUsage: 0.5 },
      3: { runningRequests: 0, waitingRequests: 12, kvUsage: 0.875 }
    })
  })

  it("reads the pre-0.10 vllm:gpu_cache_usage_perc, and prefers vllm:kv_cache_usage_perc when both are served", () => {
    expect(
      ranksOf(parsed(vllmPage({ 0: { running: 1, waiting: 2, kv: 0.4 } }, { legacyKvName: true })))
    ).toStrictEqual({
      0: { runningRequests: 1, waitingRequests: 2, kvUsage: 0.4 }
    })
    const both = parsed(vllmPage({ 0: { running: 1, waiting: 2, kv: 0.4 } }, { legacyKvAlso: () => 0.9 }))
    expect(both.ranks.get(0)?.kvUsage).toBe(0.4)
  })

  it("leaves a missing gauge, NaN, an infinity or an out-of-range value absent, never zero", () => {
    const page = parsed(
      vllmPage({
        0: { running: 2 },
        1: { running: "NaN", waiting: "+Inf", kv: 0.5 },
        2: { running: -1, waiting: 4, kv: 1.5 },
        3: { waiting: "-Inf", kv: "NaN" }
      })
    )
    expect(ranksOf(page)).toStrictEqual({
      0: { runningRequests: 2 },
      1: { kvUsage: 0.5 },
      2: { waitingRequests: 4 },
      3: {}
    })
    expect(Either.getLeft(loadForRank(page, 3, 4))).toEqual(
      Option.some("the page gives no usable value (NaN, infinite or out of range) for rank 3")
    )
  })

  it("reads a 5 MB page whole: the gauges at its very end, after 5 MB of histograms", () => {
    const text = bigVllmPage(5 * 1024 * 1024, {
      0: { running: 5, waiting: 6, kv: 0.125 },
      1: { running: 9, waiting: 2, kv: 0.75 }
    })
    expect(text.length).toBeGreaterThanOrEqual(5 * 1024 * 1024)
    expect(text.lastIndexOf("vllm:num_requests_running")).toBeGreaterThan(5 * 1024 * 1024 - 4096)
    expect(ranksOf(parsed(text))).toStrictEqual({
      0: { runningRequests: 5, waitingRequests: 6, kvUsage: 0.125 },
      1: { runningRequests: 9, waitingRequests: 2, kvUsage: 0.75 }
    })
  })

  it("past the page's head, a gauge's name in another family's help text is no line of that gauge", () => {
    // vLLM 0.9's help of vllm:gpu_cache_usage_perc says "Use vllm:kv_cache_usage_perc instead."
    const text = bigVllmPage(
      1024 * 1024,
      { 0: { running: 2, waiting: 1, kv: 0.5 } },
      { legacyKvAlso: () => 0.5 }
    )
    expect(text.indexOf("Use vllm:kv_cache_usage_perc instead")).toBeGreaterThan(1024 * 1024 - 4096)
    expect(ranksOf(parsed(text))).toStrictEqual({
      0: { runningRequests: 2, waitingRequests: 1, kvUsage: 0.5 }
    })
  })

  it("gives every rank exactly the values its series carry (property)", () => {
    const value = fc.oneof(
      fc.constant(undefined),
      fc.constant(Number.NaN),
      fc.constant(Infinity),
      fc.integer({ min: -3, max: 5000 }),
      fc.double({ min: -1, max: 2, noNaN: true })
    )
    const ranks = fc.dictionary(
      fc.integer({ min: 0, max: 63 }).map(String),
      fc.record({ running: value, waiting: value, kv: value }),
      { minKeys: 1, maxKeys: 8 }
    )
    fc.assert(
      fc.property(ranks, (byRank) => {
        const values = Object.fromEntries(
          Object.entries(byRank).map(([rank, v]) => [
            Number(rank),
            Object.fromEntries(Object.entries(v).filter(([, x]) => x !== undefined)) as RankValues
          ])
        )
        const expected = (v: number | string | undefined, fraction: boolean) =>
          // The page writes −0 as 0.0.
          typeof v === "number" && Number.isFinite(v) && v >= 0 && (!fraction || v <= 1) ? v + 0 : undefined
        const want = Object.fromEntries(
          Object.entries(values).map(([rank, v]) => {
            const load: Record<string, number> = {}
            const r = expected(v.running, false)
            const w = expected(v.waiting, false)
            const k = expected(v.kv, true)
            if (r !== undefined) load["runningRequests"] = r
            if (w !== undefined) load["waitingRequests"] = w
            if (k !== undefined) load["kvUsage"] = k
            return [rank, load]
          })
        )
        const page = parsed(vllmPage(values))
        // A rank whose every value is missing has no series at all, so no entry either.
        const present = Object.fromEntries(
          Object.entries(want).filter(([rank]) => Object.keys(values[Number(rank)]!).length > 0)
        )
        expect(ranksOf(page)).toStrictEqual(present)
      }),
      { numRuns: 200 }
    )
  })
})

describe("SGLang pages", () => {
  it("splits a data-parallel server's page by dp_rank", () => {
    const page = parsed(
      sglangPage([
        { dpRank: 0, running: 4, waiting: 0, kv: 0.31 },
        { dpRank: 1, running: 2, waiting: 5, kv: 0.62 }
      ])
    )
    expect(page.engines).toEqual(["sglang"])
    expect(ranksOf(page)).toStrictEqual({
      0: { runningRequests: 4, waitingRequests: 0, kvUsage: 0.31 },
      1: { runningRequests: 2, waitingRequests: 5, kvUsage: 0.62 }
    })
  })

  it("gives a page without dp_rank to the URL's only rank, whatever its dpRank, and to no rank when ranks share it", () => {
    const page = parsed(sglangPage([{ running: 1, waiting: 3, kv: 0.5 }]))
    expect(page.ranks.size).toBe(0)
    expect(page.unlabelled).toStrictEqual({ runningRequests: 1, waitingRequests: 3, kvUsage: 0.5 })
    expect(loadForRank(page, 0, 1)).toStrictEqual(
      Either.right({ runningRequests: 1, waitingRequests: 3, kvUsage: 0.5 })
    )
    expect(loadForRank(page, 5, 1)).toStrictEqual(
      Either.right({ runningRequests: 1, waitingRequests: 3, kvUsage: 0.5 })
    )
    expect(loadForRank(page, 0, 2)).toStrictEqual(
      Either.left("the page has no rank label (vLLM engine, SGLang dp_rank) and 2 ranks read this URL")
    )
  })

  // The format promises no order of series, so the breakdown may come first.
  it.each([false, true])(
    'reads the totals under priority="" and skips the per-priority breakdown (breakdown first: %s)',
    (breakdownFirst) => {
      const page = parsed(
        sglangPage([
          {
            dpRank: 0,
            running: 6,
            waiting: 9,
            kv: 0.4,
            byPriority: { 0: { running: 2, waiting: 4 }, 10: { running: 4, waiting: 5 } },
            breakdownFirst
          }
        ])
      )
      expect(ranksOf(page)).toStrictEqual({ 0: { runningRequests: 6, waitingRequests: 9, kvUsage: 0.4 } })
    }
  )

  it("reads one scheduler when every TP rank reports the same data-parallel rank: the lowest tp_rank", () => {
    const page = parsed(
      sglangPage([
        { dpRank: 0, tpRank: 1, running: 99, waiting: 99, kv: 0.99 },
        { dpRank: 0, tpRank: 0, running: 3, waiting: 1, kv: 0.3 }
      ])
    )
    expect(ranksOf(page)).toStrictEqual({ 0: { runningRequests: 3, waitingRequests: 1, kvUsage: 0.3 } })
  })
})

describe("ranks a page does not describe", () => {
  const page = parsed(
    vllmPage({ 0: { running: 1, waiting: 1, kv: 0.1 }, 1: { running: 2, waiting: 2, kv: 0.2 } })
  )

  it("a rank the page has no series for is unknown, naming the ranks it has", () => {
    expect(loadForRank(page, 1, 2)).toStrictEqual(
      Either.right({ runningRequests: 2, waitingRequests: 2, kvUsage: 0.2 })
    )
    expect(loadForRank(page, 2, 3)).toStrictEqual(
      Either.left("the page has no series for rank 2 (its ranks: 0, 1)")
    )
  })

  it("a page without either engine's load gauges has no rank, and says which names it lacks", () => {
    const other = parsed("# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total 12.5\n")
    expect(other.engines).toEqual([])
    expect(other.ranks.size).toBe(0)
    expect(Either.getLeft(loadForRank(other, 0, 1))).toEqual(
      Option.some(
        "the page has none of vllm:num_requests_running, sglang:num_running_reqs, vllm:num_requests_waiting, sglang:num_queue_reqs, vllm:kv_cache_usage_perc, vllm:gpu_cache_usage_perc, sglang:token_usage"
      )
    )
  })

  it("a series whose rank label is no rank number is skipped and counted", () => {
    const odd = parsed(
      'vllm:num_requests_running{engine="abc",model_name="m"} 3.0\nvllm:num_requests_running{engine="1",model_name="m"} 4.0\n'
    )
    expect(ranksOf(odd)).toStrictEqual({ 1: { runningRequests: 4 } })
    expect(odd.ignoredSeries).toBe(1)
  })
})

describe("pages that are no exposition", () => {
  it("an HTML error page", () => {
    expect(parseError("<!DOCTYPE html>\n<html><body><h1>502 Bad Gateway</h1></body></html>\n")).toBe(
      '"<!DOCTYPE" is not a metric name'
    )
  })

  it("a JSON document", () => {
    expect(parseError('{"error":"metrics are disabled"}')).toBe(
      'a line the exposition format does not allow: "{\\"error\\":\\"metrics are disabled\\"}"'
    )
  })

  it("binary noise", () => {
    expect(parseError("\u0000\u0001\u0002\u00ff\u00fe binary")).toBe(
      '"\\u0000\\u0001\\u0002ÿþ" is not a metric name'
    )
  })

  it("a sample line the format does not allow", () => {
    expect(parseError("vllm:num_requests_running{engine=0} 3.0\n")).toBe(
      'a line the exposition format does not allow: "vllm:num_requests_running{engine=0} 3.0"'
    )
  })

  it("a value that is no number", () => {
    expect(parseError('vllm:num_requests_running{engine="0"} three\n')).toBe(
      '"three" is not a sample value (in vllm:num_requests_running)'
    )
  })

  it("a bad load gauge far down a large page is found too", () => {
    const text = `${bigVllmPage(256 * 1024, { 0: { running: 1 } })}vllm:kv_cache_usage_perc{engine="0"} 0,5\n`
    expect(parseError(text)).toBe('"0,5" is not a sample value (in vllm:kv_cache_usage_perc)')
  })

  it("an empty page is an exposition without load: no ranks, no error", () => {
    const page = parsed("")
    expect(page.ranks.size).toBe(0)
    expect(page.unlabelled).toBeUndefined()
  })
})
