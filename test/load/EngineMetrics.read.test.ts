/**
 * One engine's page read over real HTTP (fake engines on 127.0.0.1 speaking the engines' text
 * exposition): each way a read fails is an `EngineMetricsError` with its reason, and the 1 s
 * bound runs on the TestClock.
 */

import * as NodeHttpClient from "@effect/platform-node/NodeHttpClient"
import { describe, expect, it } from "@effect/vitest"
import { Effect, Either, Fiber, Option, TestClock } from "effect"
import { type EngineMetricsError, readEngineMetrics } from "../../src/load/EngineMetrics.js"
import { bigVllmPage, deadUrl, fakeEngine, sglangPage, vllmPage } from "./engineFixtures.js"

const settle = Effect.gen(function* () {
  for (let i = 0; i < 20; i++) yield* Effect.yieldNow()
})

const failure = <A, R>(effect: Effect.Effect<A, EngineMetricsError, R>) =>
  Effect.flatMap(Effect.either(effect), (result) =>
    Either.isLeft(result) ? Effect.succeed(result.left) : Effect.dieMessage("expected the read to fail")
  )

describe("readEngineMetrics", () => {
  it.scoped("reads a vLLM page shared by two ranks and an SGLang page", () =>
    Effect.gen(function* () {
      const vllm = yield* fakeEngine({
        kind: "page",
        text: vllmPage({ 0: { running: 3, waiting: 1, kv: 0.25 }, 1: { running: 0, waiting: 0, kv: 0 } })
      })
      const sglang = yield* fakeEngine({
        kind: "page",
        text: sglangPage([{ running: 2, waiting: 7, kv: 0.5 }])
      })
      const a = yield* readEngineMetrics(vllm.url)
      expect(Object.fromEntries(a.ranks)).toStrictEqual({
        0: { runningRequests: 3, waitingRequests: 1, kvUsage: 0.25 },
        1: { runningRequests: 0, waitingRequests: 0, kvUsage: 0 }
      })
      const b = yield* readEngineMetrics(sglang.url)
      expect(b.unlabelled).toStrictEqual({ runningRequests: 2, waitingRequests: 7, kvUsage: 0.5 })
      expect(vllm.requests()).toBe(1)
    }).pipe(Effect.provide(NodeHttpClient.layerUndici))
  )

  it.scoped("reads a 5 MB page within the default body limit", () =>
    Effect.gen(function* () {
      const engine = yield* fakeEngine({
        kind: "page",
        text: bigVllmPage(5 * 1024 * 1024, { 0: { running: 8, waiting: 3, kv: 0.5 } })
      })
      const page = yield* readEngineMetrics(engine.url)
      expect(page.ranks.get(0)).toStrictEqual({ runningRequests: 8, waitingRequests: 3, kvUsage: 0.5 })
    }).pipe(Effect.provide(NodeHttpClient.layerUndici))
  )

  it.scoped("an engine that never answers times out at exactly 1 s", () =>
    Effect.gen(function* () {
      const engine = yield* fakeEngine({ kind: "hang" })
      const read = yield* Effect.fork(readEngineMetrics(engine.url))
      yield* settle
      yield* TestClock.adjust("999 millis")
      yield* settle
      expect(Option.isNone(yield* Fiber.poll(read))).toBe(true)
      yield* TestClock.adjust("1 millis")
      const error = yield* failure(Fiber.join(read))
      expect(error.reason).toBe("timeout")
      expect(error.message).toBe("no whole page within 1s")
      expect(error.url).toBe(engine.url)
    }).pipe(Effect.provide(NodeHttpClient.layerUndici))
  )

  it.scoped("a page that stops halfway times out too (the bound covers the body)", () =>
    Effect.gen(function* () {
      const engine = yield* fakeEngine({ kind: "stall", first: "# HELP vllm:num_requests_running x\n" })
      const read = yield* Effect.fork(readEngineMetrics(engine.url, { timeout: "250 millis" }))
      yield* settle
      yield* TestClock.adjust("250 millis")
      expect((yield* failure(Fiber.join(read))).reason).toBe("timeout")
    }).pipe(Effect.provide(NodeHttpClient.layerUndici))
  )

  it.scoped("nothing listening, a closed connection, an HTTP error and a URL that is none", () =>
    Effect.gen(function* () {
      const dead = yield* failure(readEngineMetrics(yield* deadUrl))
      expect(dead.reason).toBe("unreachable")
      expect(dead.message).toContain("ECONNREFUSED")

      const reset = yield* fakeEngine({ kind: "reset" })
      expect((yield* failure(readEngineMetrics(reset.url))).reason).toBe("unreachable")

      const status = yield* fakeEngine({ kind: "status", status: 503 })
      const http = yield* failure(readEngineMetrics(status.url))
      expect(http.reason).toBe("http-status")
      expect(http.status).toBe(503)
      expect(http.message).toBe("HTTP 503")

      const invalid = yield* failure(readEngineMetrics("ftp://10.0.0.5/metrics"))
      expect(invalid.reason).toBe("invalid-url")
      expect(invalid.message).toBe('"ftp://10.0.0.5/metrics" is not an http(s) URL')
    }).pipe(Effect.provide(NodeHttpClient.layerUndici))
  )

  it.scoped("a page over the limit is refused: declared, or streamed without a length", () =>
    Effect.gen(function* () {
      const declared = yield* fakeEngine({
        kind: "page",
        text: vllmPage({ 0: { running: 1 } }, { histograms: 20 })
      })
      const big = yield* failure(readEngineMetrics(declared.url, { maxBodyBytes: 4096 }))
      expect(big.reason).toBe("too-large")
      expect(big.message).toBe("the page exceeds 4096 bytes")

      const streamed = yield* fakeEngine({ kind: "chunked", bytes: 64 * 1024 * 1024 })
      const endless = yield* failure(readEngineMetrics(streamed.url, { maxBodyBytes: 1024 * 1024 }))
      expect(endless.reason).toBe("too-large")
    }).pipe(Effect.provide(NodeHttpClient.layerUndici))
  )

  it.scoped("a page that is no exposition is a parse error naming what was wrong", () =>
    Effect.gen(function* () {
      const engine = yield* fakeEngine({
        kind: "page",
        text: "<!DOCTYPE html>\n<html><body>Not Found</body></html>\n"
      })
      const error = yield* failure(readEngineMetrics(engine.url))
      expect(error.reason).toBe("parse")
      expect(error.message).toBe('"<!DOCTYPE" is not a metric name')
    }).pipe(Effect.provide(NodeHttpClient.layerUndici))
  )
})
