/**
 * The poller over real HTTP (fake engines on 127.0.0.1) with ticks on the TestClock: a URL
 * shared by several ranks is read once per tick and split by rank; a hanging engine and a dead
 * one never hold the other reads back (checked by what has happened, not by how long it took);
 * a URL whose read is still running is not read again; the sources follow their input; the
 * last success and the last error are kept per source.
 */

import { createServer, type ServerResponse } from "node:http"
import type { AddressInfo } from "node:net"
import * as HttpClient from "@effect/platform/HttpClient"
import * as NodeHttpClient from "@effect/platform-node/NodeHttpClient"
import { describe, expect, it } from "@effect/vitest"
import { Effect, HashMap, Layer, Logger, LogLevel, Option, Stream, SubscriptionRef, TestClock } from "effect"
import { engineLoadAdditions } from "../../src/load/EngineLoadWindow.js"
import {
  type EngineMetricsSource,
  isObserved,
  make,
  type SourceReadState,
  sourceKey
} from "../../src/load/EngineMetrics.js"
import { deadUrl, fakeEngine, sglangPage, vllmPage } from "./engineFixtures.js"

type States = ReadonlyMap<string, SourceReadState>

/** Waits (on events, not on time) until the poller's states satisfy `done`. */
const until = (changes: Stream.Stream<States>, done: (states: States) => boolean) =>
  changes.pipe(Stream.filter(done), Stream.runHead, Effect.map(Option.getOrThrow))

const stateOf = (states: States, source: EngineMetricsSource) => states.get(sourceKey(source))

describe("EngineMetrics poller", () => {
  it.scoped("reads a URL shared by several ranks once per tick and gives each rank its own series", () =>
    Effect.gen(function* () {
      const engine = yield* fakeEngine({
        kind: "page",
        text: vllmPage({ 0: { running: 3, waiting: 1, kv: 0.25 }, 1: { running: 5, waiting: 2, kv: 0.75 } })
      })
      const rank0 = { metricsUrl: engine.url, dpRank: 0 }
      const rank1 = { metricsUrl: engine.url, dpRank: 1 }
      const poller = yield* make(Effect.succeed([rank0, rank1]))
      const states = yield* until(poller.changes, (s) => s.get(sourceKey(rank1))?.lastSuccess !== undefined)
      expect(engine.requests()).toBe(1)
      expect(stateOf(states, rank0)).toStrictEqual({
        metricsUrl: engine.url,
        dpRank: 0,
        lastSuccess: { atMs: 0, load: { runningRequests: 3, waitingRequests: 1, kvUsage: 0.25 } },
        lastAttemptMs: 0
      })
      expect(stateOf(states, rank1)?.lastSuccess?.load).toStrictEqual({
        runningRequests: 5,
        waitingRequests: 2,
        kvUsage: 0.75
      })

      // The next tick, one second later, reads it once more.
      yield* TestClock.adjust("1 second")
      yield* until(poller.changes, (s) => s.get(sourceKey(rank0))?.lastSuccess?.atMs === 1000)
      expect(engine.requests()).toBe(2)
    }).pipe(Effect.provide(NodeHttpClient.layerUndici))
  )

  it.scoped("a hanging engine and a dead one do not hold back the other reads", () =>
    Effect.gen(function* () {
      const good = yield* fakeEngine({
        kind: "page",
        text: sglangPage([{ running: 1, waiting: 0, kv: 0.1 }])
      })
      const hanging = yield* fakeEngine({ kind: "hang" })
      const dead = { metricsUrl: yield* deadUrl, dpRank: 0 }
      const goodSource = { metricsUrl: good.url, dpRank: 0 }
      const hangingSource = { metricsUrl: hanging.url, dpRank: 0 }
      // The hanging and the dead URL are listed first, and reads may run two at a time only.
      const poller = yield* make(Effect.succeed([hangingSource, dead, goodSource]), {
        concurrency: 2,
        interval: "100 millis"
      })

      // Tick 0: the good page is read while the hanging read is still open.
      let states = yield* until(
        poller.changes,
        (s) => s.get(sourceKey(goodSource))?.lastSuccess !== undefined
      )
      expect(stateOf(states, hangingSource)?.lastAttemptMs).toBeUndefined()
      states = yield* until(poller.changes, (s) => s.get(sourceKey(dead))?.lastError !== undefined)
      expect(stateOf(states, dead)?.lastError?.reason).toBe("unreachable")
      expect(stateOf(states, dead)?.lastSuccess).toBeUndefined()

      // Four more ticks: the good engine is read at each; the hanging one is not read again
      // while its first read is open.
      for (const at of [100, 200, 300, 400]) {
        yield* TestClock.adjust("100 millis")
        yield* until(poller.changes, (s) => s.get(sourceKey(goodSource))?.lastSuccess?.atMs === at)
      }
      expect(good.requests()).toBe(5)
      expect(hanging.requests()).toBe(1)
      expect(stateOf(yield* poller.states, hangingSource)?.lastAttemptMs).toBeUndefined()

      // At 1 s its read times out: an error for that source only, and it is read again.
      yield* TestClock.adjust("600 millis")
      states = yield* until(poller.changes, (s) => s.get(sourceKey(hangingSource))?.lastError !== undefined)
      expect(stateOf(states, hangingSource)?.lastError).toStrictEqual({
        atMs: 1000,
        reason: "timeout",
        message: "no whole page within 1s"
      })
      yield* TestClock.adjust("100 millis")
      yield* until(poller.changes, (s) => s.get(sourceKey(goodSource))?.lastSuccess?.atMs === 1100)
      expect(hanging.requests()).toBe(2)
    }).pipe(Effect.provide(NodeHttpClient.layerUndici))
  )

  it.scoped("keeps the last success while reads fail, and the rank stops being observed 3 s after it", () =>
    Effect.gen(function* () {
      const engine = yield* fakeEngine({
        kind: "page",
        text: vllmPage({ 0: { running: 4, waiting: 2, kv: 0.5 } })
      })
      const source = { metricsUrl: engine.url, dpRank: 0 }
      const poller = yield* make(Effect.succeed([source]))
      yield* until(poller.changes, (s) => s.get(sourceKey(source))?.lastSuccess !== undefined)

      engine.behave({ kind: "status", status: 500 })
      yield* TestClock.adjust("1 second")
      const states = yield* until(poller.changes, (s) => s.get(sourceKey(source))?.lastError !== undefined)
      expect(stateOf(states, source)).toStrictEqual({
        metricsUrl: engine.url,
        dpRank: 0,
        lastSuccess: { atMs: 0, load: { runningRequests: 4, waitingRequests: 2, kvUsage: 0.5 } },
        lastAttemptMs: 1000,
        lastError: { atMs: 1000, reason: "http-status", message: "HTTP 500" }
      })

      yield* TestClock.adjust("1999 millis")
      const latest = yield* poller.latest(source)
      expect(isObserved(latest, 2999)).toBe(true)
      expect(engineLoadAdditions([latest], 2999)).toStrictEqual({
        runningRequests: 4,
        waitingRequests: 2,
        kvUsage: 0.5,
        loadObservedRanks: 1
      })
      expect(isObserved(latest, 3000)).toBe(false)
      expect(engineLoadAdditions([latest], 3000)).toStrictEqual({ loadObservedRanks: 0 })

      // Back to serving: the error is cleared with the next success.
      engine.behave({ kind: "page", text: vllmPage({ 0: { running: 1, waiting: 0, kv: 0.25 } }) })
      yield* TestClock.adjust("1 millis")
      const back = yield* until(poller.changes, (s) => s.get(sourceKey(source))?.lastSuccess?.atMs === 3000)
      expect(stateOf(back, source)).toStrictEqual({
        metricsUrl: engine.url,
        dpRank: 0,
        lastSuccess: { atMs: 3000, load: { runningRequests: 1, waitingRequests: 0, kvUsage: 0.25 } },
        lastAttemptMs: 3000
      })
    }).pipe(Effect.provide(NodeHttpClient.layerUndici))
  )

  it.scoped("logs a source's change of condition once, not every failed read", () => {
    const lines: Array<string> = []
    const collect = Logger.make(({ logLevel, message, annotations }) => {
      const text = Array.isArray(message) ? message.join(" ") : String(message)
      lines.push(
        `${logLevel.label} ${text} ${HashMap.get(annotations, "reason").pipe(Option.getOrElse(() => "-"))}`
      )
    })
    return Effect.gen(function* () {
      const engine = yield* fakeEngine({ kind: "status", status: 503 })
      const source = { metricsUrl: engine.url, dpRank: 0 }
      const poller = yield* make(Effect.succeed([source]))
      yield* until(poller.changes, (s) => s.get(sourceKey(source))?.lastAttemptMs === 0)
      yield* TestClock.adjust("1 second")
      yield* until(poller.changes, (s) => s.get(sourceKey(source))?.lastAttemptMs === 1000)
      engine.behave({ kind: "page", text: vllmPage({ 0: { running: 1, waiting: 0, kv: 0.5 } }) })
      yield* TestClock.adjust("1 second")
      yield* until(poller.changes, (s) => s.get(sourceKey(source))?.lastSuccess?.atMs === 2000)
      expect(lines).toEqual([
        "WARN engine metrics unreadable; the rank's load is unknown once its last read is 3 s old http-status",
        "INFO engine metrics readable again -"
      ])
    }).pipe(
      Effect.provide(NodeHttpClient.layerUndici),
      Effect.provide(Logger.replace(Logger.defaultLogger, collect)),
      Logger.withMinimumLogLevel(LogLevel.Info)
    )
  })

  it.scoped("a page that cannot be split is an error for each rank, never a zero load", () =>
    Effect.gen(function* () {
      // An SGLang page without dp_rank read by two ranks: whose load is it?
      const engine = yield* fakeEngine({
        kind: "page",
        text: sglangPage([{ running: 1, waiting: 1, kv: 0.5 }])
      })
      const garbage = yield* fakeEngine({ kind: "page", text: "<html>\n" })
      const a = { metricsUrl: engine.url, dpRank: 0 }
      const b = { metricsUrl: engine.url, dpRank: 1 }
      const c = { metricsUrl: garbage.url, dpRank: 0 }
      const poller = yield* make(Effect.succeed([a, b, c]))
      const states = yield* until(poller.changes, (s) =>
        [a, b, c].every((source) => s.get(sourceKey(source))?.lastError !== undefined)
      )
      for (const source of [a, b]) {
        expect(stateOf(states, source)?.lastSuccess).toBeUndefined()
        expect(stateOf(states, source)?.lastError).toStrictEqual({
          atMs: 0,
          reason: "no-load",
          message: "the page has no rank label (vLLM engine, SGLang dp_rank) and 2 ranks read this URL"
        })
      }
      expect(stateOf(states, c)?.lastError).toStrictEqual({
        atMs: 0,
        reason: "parse",
        message: '"<html>" is not a metric name'
      })
      expect(engineLoadAdditions([undefined, undefined], 0)).toStrictEqual({ loadObservedRanks: 0 })
    }).pipe(Effect.provide(NodeHttpClient.layerUndici))
  )

  it.scoped("follows its sources: a new URL is read at the next tick, a source that left is forgotten", () =>
    Effect.gen(function* () {
      const first = yield* fakeEngine({
        kind: "page",
        text: vllmPage({ 0: { running: 1, waiting: 0, kv: 0.1 } })
      })
      const second = yield* fakeEngine({
        kind: "page",
        text: vllmPage({ 2: { running: 2, waiting: 0, kv: 0.2 } })
      })
      const a = { metricsUrl: first.url, dpRank: 0 }
      const b = { metricsUrl: second.url, dpRank: 2 }
      const sources = yield* SubscriptionRef.make<ReadonlyArray<EngineMetricsSource>>([a])
      // As the relay would have it: the service from its layer, built in the test's scope.
      const poller = yield* make(SubscriptionRef.get(sources))
      yield* until(poller.changes, (s) => s.get(sourceKey(a))?.lastSuccess !== undefined)

      yield* SubscriptionRef.set(sources, [b])
      yield* TestClock.adjust("1 second")
      const states = yield* until(poller.changes, (s) => s.get(sourceKey(b))?.lastSuccess !== undefined)
      expect(Array.from(states.keys())).toEqual([sourceKey(b)])
      expect(stateOf(states, b)?.lastSuccess).toStrictEqual({
        atMs: 1000,
        load: { runningRequests: 2, waitingRequests: 0, kvUsage: 0.2 }
      })
      expect(first.requests()).toBe(1)
    }).pipe(Effect.provide(NodeHttpClient.layerUndici))
  )

  it.scoped(
    "many URLs: at most `concurrency` reads are open at once, and each URL is read once a tick",
    () => {
      // Counted where the reads start: every reader has sent its request before the first arrives.
      let open = 0
      let mostOpen = 0
      const countingClient = Layer.effect(
        HttpClient.HttpClient,
        Effect.map(HttpClient.HttpClient, (client) =>
          HttpClient.transform(client, (response) =>
            Effect.acquireUseRelease(
              Effect.sync(() => {
                open++
                mostOpen = Math.max(mostOpen, open)
              }),
              () => response,
              () => Effect.sync(() => open--)
            )
          )
        )
      ).pipe(Layer.provide(NodeHttpClient.layerUndici))
      return Effect.gen(function* () {
        // Answers are held until the test lets them go, one at a time, so reads pile up.
        const held: Array<ServerResponse> = []
        let arrived = 0
        let onArrival = () => {}
        const server = createServer((_request, response) => {
          arrived++
          held.push(response)
          onArrival()
        })
        yield* Effect.acquireRelease(
          Effect.async<void>((resume) => {
            server.listen(0, "127.0.0.1", () => resume(Effect.void))
          }),
          () =>
            Effect.sync(() => server.closeAllConnections()).pipe(
              Effect.zipRight(Effect.sync(() => server.close()))
            )
        )
        const { port } = server.address() as AddressInfo
        const sources = Array.from({ length: 30 }, (_, i) => ({
          metricsUrl: `http://127.0.0.1:${port}/metrics/${i}`,
          dpRank: 0
        }))
        const page = vllmPage({ 0: { running: 1, waiting: 0, kv: 0.5 } })
        const arrivals = (count: number) =>
          Effect.async<void>((resume) => {
            onArrival = () => {
              if (arrived >= count) resume(Effect.void)
            }
            onArrival()
          })
        const poller = yield* make(Effect.succeed(sources), { concurrency: 3 })
        for (let answered = 0; answered < sources.length; answered++) {
          yield* arrivals(Math.min(sources.length, answered + 3))
          held.shift()!.end(page)
        }
        yield* until(poller.changes, (s) => sources.every((source) => s.get(sourceKey(source))?.lastSuccess))
        expect(mostOpen).toBe(3)
        expect(arrived).toBe(30)
      }).pipe(Effect.provide(countingClient))
    }
  )
})
