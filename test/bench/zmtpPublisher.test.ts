/**
 * The end-to-end bench's ZMTP publisher (`bench/zmtpPublisher.ts`) stands in for an engine's
 * pyzmq PUB, so it is checked against libzmq's own SUB (zeromq.js, the oracle) and against the
 * relay's subscriber: subscription prefixes, multipart order, long frames, and no delivery to a
 * peer before its subscription.
 */

import { it } from "@effect/vitest"
import { Effect } from "effect"
import { describe, expect } from "vitest"
import * as zmq from "zeromq"
import { encodeMessage, ZmtpPublisher } from "../../bench/zmtpPublisher.js"
import { collect, eventually, withoutProbes } from "../transport/zmtp/zmtpFixtures.js"

const publisherIn = Effect.acquireRelease(
  Effect.promise(() => ZmtpPublisher.bind()),
  (pub) => Effect.promise(() => pub.close())
)

const libzmqSubscriber = (endpoint: string, topic: string) =>
  Effect.acquireRelease(
    Effect.sync(() => {
      const sub = new zmq.Subscriber({ linger: 0 })
      sub.connect(endpoint)
      sub.subscribe(topic)
      const received: Array<Array<string>> = []
      void (async () => {
        try {
          for await (const frames of sub) received.push(frames.map((f) => f.toString("latin1")))
        } catch {
          // Closed with the scope.
        }
      })()
      return { sub, received }
    }),
    ({ sub }) => Effect.sync(() => sub.close())
  )

const long = "x".repeat(70_000)

describe("bench ZMTP publisher", () => {
  it("encodes frames with MORE on all but the last and the long form above 255 bytes", () => {
    const bytes = encodeMessage([Buffer.from("ab"), Buffer.alloc(256, 7)])
    expect([...bytes.subarray(0, 4)]).toEqual([0x01, 2, 0x61, 0x62])
    // flags LONG, then the 8-byte big-endian size 256.
    expect([...bytes.subarray(4, 13)]).toEqual([0x02, 0, 0, 0, 0, 0, 0, 1, 0])
    expect(bytes.length).toBe(4 + 9 + 256)
  })

  it.scopedLive("libzmq's SUB receives the subscribed prefix, whole and in order", () =>
    Effect.gen(function* () {
      const pub = yield* publisherIn
      const { received } = yield* libzmqSubscriber(pub.endpoint, "kv")
      yield* eventually(
        Effect.sync(() => pub.subscribers === 1),
        "the subscription to reach the publisher",
        20_000
      )
      const sent = [
        ["other", "1"],
        ["kv-a", "2", "", long],
        ["k", "3"],
        ["kv", "4"]
      ]
      for (const message of sent) pub.send(message.map((f) => Buffer.from(f, "latin1")))
      yield* eventually(
        Effect.sync(() => received.length >= 2),
        "the matching messages",
        20_000
      )
      expect(received).toEqual([
        ["kv-a", "2", "", long],
        ["kv", "4"]
      ])
      // The publisher filters too (libzmq's SUB would drop a stray message unseen).
      expect(pub.written).toBe(2)
      expect(pub.faults).toEqual([])
    })
  )

  it.scopedLive("delivers nothing before the subscription, and thousands in order after", () =>
    Effect.gen(function* () {
      const pub = yield* publisherIn
      expect(pub.send([Buffer.from("kv"), Buffer.from("early")])).toBe(true)
      const sub = yield* collect(pub.endpoint, "kv")
      yield* eventually(
        Effect.sync(() => pub.subscribers === 1),
        "the relay subscriber's subscription",
        20_000
      )
      const total = 5_000
      for (let n = 0; n < total; n++) {
        if (!pub.send([Buffer.from("kv"), Buffer.from(String(n))])) yield* Effect.promise(() => pub.drained())
      }
      yield* eventually(
        Effect.sync(() => withoutProbes(sub.messages).length >= total),
        "every message",
        20_000
      )
      const bodies = withoutProbes(sub.messages).map((frames) => frames[1]!.toString())
      expect(bodies).toEqual(Array.from({ length: total }, (_, n) => String(n)))
      expect(sub.connection).toEqual([true])
    })
  )
})
