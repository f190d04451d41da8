/**
 * What the consumer logs about a relay (PROTOCOL §7 ◆3): a WARN with the relay's name, the error
 * and the next retry delay once per change of the relay's state (unreachable, pool streams
 * failing), never once per retry or per stream, and one INFO when it is back. Scripted relays on
 * the TestClock; the log lines are captured from the consumer's own logger.
 */

import { describe, expect, it } from "@effect/vitest"
import { Effect, HashMap, Logger, LogLevel, TestClock } from "effect"
import { RelayTransportError } from "../../src/consumer/ConsumerErrors.js"
import { make as makeConsumer } from "../../src/consumer/GlobalConsumerLive.js"
import { waitUntil } from "../relay/registryFixtures.js"
import { FakeRelay, fakeConnector } from "./fakeRelay.js"

interface Line {
  readonly level: string
  readonly message: string
  readonly annotations: Readonly<Record<string, unknown>>
}

const settle = Effect.gen(function* () {
  for (let i = 0; i < 500; i++) yield* Effect.yieldNow()
})

/** Advances the TestClock in small steps, letting the fibers run between them. */
const advance = (ms: number) =>
  Effect.gen(function* () {
    for (let t = 0; t < ms; t += 500) {
      yield* TestClock.adjust("500 millis")
      yield* settle
    }
  })

const capture = () => {
  const lines: Array<Line> = []
  const logger = Logger.make<unknown, void>(({ logLevel, message, annotations }) => {
    lines.push({
      level: logLevel.label,
      message: String(Array.isArray(message) ? message[0] : message),
      annotations: Object.fromEntries(HashMap.toEntries(annotations))
    })
  })
  const about = (level: string, message?: string) =>
    lines.filter(
      (line) =>
        line.level === level &&
        line.annotations["relay"] === "a" &&
        (message === undefined || line.message === message)
    )
  return { lines, about, layer: Logger.replace(Logger.defaultLogger, logger) }
}

const started = (relay: FakeRelay) =>
  makeConsumer({ relays: [{ name: "a", url: "http://relay-a" }], consumerInstance: 17n }).pipe(
    Effect.provide(fakeConnector(new Map([["http://relay-a", relay]])))
  )

const readyLanes = (consumer: Effect.Effect.Success<ReturnType<typeof started>>) =>
  consumer.domains().flatMap((domain) => [...domain.lanes.values()].filter((lane) => lane.ready))

describe("the consumer's log lines about a relay", () => {
  it.scoped("failing pool streams: one WARN over many retries, one INFO when they recover", () => {
    const log = capture()
    return Effect.gen(function* () {
      const a = yield* FakeRelay.make("a", 1n)
      const pool = yield* a.addPool()
      const consumer = yield* started(a)
      yield* waitUntil(() => readyLanes(consumer).length === 1, "lane ready")
      expect(log.about("INFO").map((line) => line.message)).toEqual(["relay connected"])

      // The relay stays reachable but refuses the pool's stream: every resubscription fails.
      a.pools.delete(pool.producer.key)
      yield* pool.lag()
      yield* settle
      yield* advance(12_000)
      const lane = consumer.domains()[0]!.lanes.get(0)!
      expect(lane.faults).toBeGreaterThanOrEqual(4)
      const warnings = log.about("WARN")
      expect(warnings.map((line) => line.message)).toEqual(["relay pool streams failing; retrying"])
      expect(warnings[0]!.annotations).toMatchObject({
        // The newest fault: the resubscriptions refused since the stream lagged.
        error: expect.stringMatching(/PRODUCER_CHANGED/),
        retryInMs: expect.any(Number)
      })

      // The stream is served again: the lane installs a snapshot, one INFO.
      a.pools.set(pool.producer.key, pool)
      yield* advance(20_000)
      expect(readyLanes(consumer)).toHaveLength(1)
      expect(log.about("INFO").map((line) => line.message)).toEqual([
        "relay connected",
        "relay pool streams recovered"
      ])
      expect(log.about("WARN")).toHaveLength(1)
    }).pipe(Effect.provide(log.layer))
  })

  it.scoped("a relay going away: one WARN (not one per stream or retry), one INFO when it is back", () => {
    const log = capture()
    return Effect.gen(function* () {
      const a = yield* FakeRelay.make("a", 1n)
      const pool = yield* a.addPool()
      const consumer = yield* started(a)
      yield* waitUntil(() => readyLanes(consumer).length === 1, "lane ready")

      // Its pool stream breaks first; its catalog watch ends a little later; it answers nothing.
      a.infoFailure = new RelayTransportError({ url: "fake", message: "connection refused" })
      yield* pool.breakStreams(new RelayTransportError({ url: "fake", message: "connection reset" }))
      yield* settle
      yield* TestClock.adjust("300 millis")
      yield* settle
      yield* a.endWatch()
      yield* settle
      yield* advance(12_000)
      expect(a.infoCalls).toBeGreaterThanOrEqual(4)
      const warnings = log.about("WARN")
      expect(warnings.map((line) => line.message)).toEqual(["relay unreachable; retrying"])
      expect(warnings[0]!.annotations).toMatchObject({
        error: expect.any(String),
        retryInMs: expect.any(Number)
      })
      expect(log.about("DEBUG", "relay still unreachable; retrying").length).toBeGreaterThanOrEqual(3)

      a.infoFailure = undefined
      yield* advance(20_000)
      expect(readyLanes(consumer)).toHaveLength(1)
      expect(log.about("INFO").map((line) => line.message)).toEqual([
        "relay connected",
        "relay reachable again"
      ])
      expect(log.about("WARN")).toHaveLength(1)
    }).pipe(Effect.provide(log.layer), Logger.withMinimumLogLevel(LogLevel.Debug))
  })

  it.scoped("streams failing on a relay that keeps its catalog watch but stops answering: one WARN", () => {
    const log = capture()
    return Effect.gen(function* () {
      const a = yield* FakeRelay.make("a", 1n)
      const pool = yield* a.addPool()
      const consumer = yield* started(a)
      yield* waitUntil(() => readyLanes(consumer).length === 1, "lane ready")
      a.infoFailure = new RelayTransportError({ url: "fake", message: "timeout" })
      a.pools.delete(pool.producer.key)
      yield* pool.lag()
      yield* settle
      yield* advance(12_000)
      expect(log.about("WARN").map((line) => line.message)).toEqual(["relay pool streams failing; retrying"])
    }).pipe(Effect.provide(log.layer))
  })

  it.scoped("an unreachable relay at start is one WARN with the error and the next delay", () => {
    const log = capture()
    return Effect.gen(function* () {
      const a = yield* FakeRelay.make("a", 1n)
      a.infoFailure = new RelayTransportError({ url: "fake", message: "connection refused" })
      yield* started(a)
      yield* settle
      yield* advance(20_000)
      expect(a.infoCalls).toBeGreaterThanOrEqual(4)
      const warnings = log.about("WARN")
      expect(warnings).toHaveLength(1)
      expect(warnings[0]!.message).toBe("relay unreachable; retrying")
      expect(warnings[0]!.annotations["error"]).toMatch(/connection refused/)
      expect(warnings[0]!.annotations["retryInMs"]).toBeGreaterThanOrEqual(250)
      expect(warnings[0]!.annotations["retryInMs"]).toBeLessThanOrEqual(500)
    }).pipe(Effect.provide(log.layer))
  })
})
