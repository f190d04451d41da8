/**
 * The reconnect schedule on a `TestClock`: refused attempts (a real port nothing listens on)
 * wait 100 ms, then twice as long each time, capped at 1 s; the handshake timer runs on the
 * clock too. The refusals themselves are real, so waits for them poll with a real deadline.
 */

import { it } from "@effect/vitest"
import { Chunk, Effect, TestClock } from "effect"
import { describe, expect } from "vitest"
import { collect, eventually, freePort, tcpServer } from "./zmtpFixtures.js"

/**
 * Waits until a sleep is due `ms` from now. (The list also keeps the wake-up times of sleeps
 * that were interrupted, such as an ended attempt's handshake timer.)
 */
const sleepingFor = (ms: number) =>
  eventually(
    Effect.gen(function* () {
      const now = yield* TestClock.currentTimeMillis
      return Chunk.toReadonlyArray(yield* TestClock.sleeps()).includes(now + ms)
    }),
    `a ${ms} ms reconnect wait`
  )

describe("ZMTP reconnect schedule", () => {
  it.scoped("refused attempts back off from 100 ms, doubling, capped at 1 s", () =>
    Effect.gen(function* () {
      const port = yield* freePort
      const sub = yield* collect(`tcp://127.0.0.1:${port}`, "", { drain: false })
      const delays = [100, 200, 400, 800, 1000, 1000]
      for (const [n, ms] of delays.entries()) {
        yield* sleepingFor(ms)
        expect(sub.subscriber.stats().attempts).toBe(n + 1)
        yield* TestClock.adjust(ms - 1)
        expect(sub.subscriber.stats().attempts).toBe(n + 1)
        yield* TestClock.adjust(1)
        yield* eventually(
          Effect.sync(() => sub.subscriber.stats().attempts === n + 2),
          `attempt ${n + 2}`
        )
      }
    })
  )

  it.scoped("a peer that never greets is dropped after the 30 s handshake interval, then retried", () =>
    Effect.gen(function* () {
      const silent = yield* tcpServer(() => {})
      const sub = yield* collect(silent.endpoint, "", { drain: false })
      yield* eventually(
        Effect.sync(() => silent.connections() === 1),
        "the connection"
      )
      yield* TestClock.adjust("29999 millis")
      expect(sub.subscriber.stats().protocolErrors["handshake-timeout"]).toBe(0)
      yield* TestClock.adjust("1 millis")
      yield* sleepingFor(100)
      expect(sub.subscriber.stats().protocolErrors["handshake-timeout"]).toBe(1)
      yield* TestClock.adjust("100 millis")
      yield* eventually(
        Effect.sync(() => silent.connections() === 2),
        "the reconnect"
      )
    })
  )
})
