/**
 * The ZMTP subscriber against real libzmq publishers (zeromq.js `Publisher` / `XPublisher` on
 * 127.0.0.1) and against plain TCP peers that are not ZeroMQ or break the protocol. Waits poll
 * with bounded deadlines.
 */

import { it } from "@effect/vitest"
import { Effect } from "effect"
import { describe, expect } from "vitest"
import * as zmq from "zeromq"
import { parseTcpEndpoint } from "../../../src/transport/zmtp/Endpoint.js"
import { makeZmtpSubscriber } from "../../../src/transport/zmtp/ZmtpSubscriber.js"
import {
  bound,
  collect,
  eventually,
  freePort,
  prime,
  publisher,
  sendAll,
  withoutProbes
} from "./zmtpFixtures.js"

const text = (messages: ReadonlyArray<Array<Buffer>>) =>
  messages.map((frames) => frames.map((f) => f.toString()))

describe("ZMTP subscriber against libzmq", () => {
  it.scopedLive("receives only the subscribed prefix", () =>
    Effect.gen(function* () {
      const pub = yield* publisher()
      const sub = yield* collect(pub.lastEndpoint!, "kv")
      yield* prime(pub, sub, "kv")
      yield* sendAll(pub, [
        ["other", "1"],
        ["kv-a", "2"],
        ["k", "3"],
        ["kv", "4"],
        ["xkv", "5"],
        ["kv@w3", "6"]
      ])
      yield* eventually(
        Effect.sync(() => withoutProbes(sub.messages).length >= 3),
        "the matching messages"
      )
      yield* sendAll(pub, [["kv", "end"]])
      yield* eventually(
        Effect.sync(() => withoutProbes(sub.messages).length >= 4),
        "the last message"
      )
      expect(text(withoutProbes(sub.messages))).toEqual([
        ["kv-a", "2"],
        ["kv", "4"],
        ["kv@w3", "6"],
        ["kv", "end"]
      ])
      expect(sub.connection).toEqual([true])
    })
  )

  it.scopedLive("multipart messages arrive whole and in order, many to a TCP chunk", () =>
    Effect.gen(function* () {
      const pub = yield* publisher()
      const sub = yield* collect(pub.lastEndpoint!, "")
      yield* prime(pub, sub, "")
      const total = 20_000
      const sent = Array.from({ length: total }, (_, n) => {
        const seq = Buffer.alloc(8)
        seq.writeUInt32BE(n, 4)
        // 0 to 4 frames after the topic, one of them empty now and then.
        return [
          "t",
          seq,
          ...Array.from({ length: n % 5 }, (_, k) => Buffer.alloc((n * 7 + k) % 40, n & 0xff))
        ]
      })
      yield* sendAll(pub, sent)
      yield* eventually(
        Effect.sync(() => withoutProbes(sub.messages).length >= total),
        "every message",
        20_000
      )
      const got = withoutProbes(sub.messages)
      expect(got.length).toBe(total)
      for (let n = 0; n < total; n++) {
        const frames = got[n]!
        expect(frames.length).toBe(sent[n]!.length)
        expect(frames[1]!.readUInt32BE(4)).toBe(n)
        for (let k = 2; k < frames.length; k++) expect(frames[k]!.equals(sent[n]![k] as Buffer)).toBe(true)
      }
    })
  )

  it.scopedLive("large frames: long sizes and frames split across many chunks", () =>
    Effect.gen(function* () {
      const pub = yield* publisher()
      const sub = yield* collect(pub.lastEndpoint!, "big")
      yield* prime(pub, sub, "big")
      const sizes = [255, 256, 300, 65_535, 70_000, 3 * 1024 * 1024 + 17]
      const bodies = sizes.map((size, i) => {
        const body = Buffer.allocUnsafe(size)
        for (let k = 0; k < size; k++) body[k] = (k * 31 + i) & 0xff
        return body
      })
      yield* sendAll(
        pub,
        bodies.map((body) => ["big", body, "tail"])
      )
      yield* eventually(
        Effect.sync(() => withoutProbes(sub.messages).length >= sizes.length),
        "every large message"
      )
      const got = withoutProbes(sub.messages)
      expect(got.map((frames) => frames[1]!.length)).toEqual(sizes)
      got.forEach((frames, i) => {
        expect(frames[1]!.equals(bodies[i]!)).toBe(true)
        expect(frames[2]!.toString()).toBe("tail")
      })
    })
  )

  it.scopedLive("an XPUB sees the subscription as libzmq's own SUB would send it", () =>
    Effect.gen(function* () {
      const xpub = yield* bound(() => new zmq.XPublisher())
      const sub = yield* collect(xpub.lastEndpoint!, "kv-events")
      const [subscription] = yield* Effect.promise(() => xpub.receive())
      expect([...subscription!]).toEqual([1, ...Buffer.from("kv-events")])
      yield* sendAll(xpub, [
        ["kv-events", "a"],
        ["nope", "b"],
        ["kv-events-2", "c"]
      ])
      yield* eventually(
        Effect.sync(() => sub.messages.length >= 2),
        "the XPUB's messages"
      )
      expect(text(sub.messages)).toEqual([
        ["kv-events", "a"],
        ["kv-events-2", "c"]
      ])
    })
  )

  it.scopedLive("connects by host name", () =>
    Effect.gen(function* () {
      const pub = yield* publisher()
      const port = pub.lastEndpoint!.split(":").pop()
      const sub = yield* collect(`tcp://localhost:${port}`, "h")
      yield* prime(pub, sub, "h")
      expect(sub.connection).toEqual([true])
    })
  )

  it.scopedLive("connects to a publisher that binds after the subscriber started", () =>
    Effect.gen(function* () {
      const port = yield* freePort
      const endpoint = `tcp://127.0.0.1:${port}`
      const sub = yield* collect(endpoint, "late")
      yield* eventually(
        Effect.sync(() => sub.subscriber.stats().attempts >= 3),
        "attempts to be refused and retried"
      )
      expect(sub.connection).toEqual([])
      const pub = yield* publisher(endpoint)
      yield* eventually(
        Effect.sync(() => sub.connection.includes(true)),
        "the handshake"
      )
      yield* prime(pub, sub, "late")
      yield* sendAll(pub, [["late", "x"]])
      yield* eventually(
        Effect.sync(() => withoutProbes(sub.messages).length === 1),
        "the message"
      )
      expect(sub.subscriber.stats().connects).toBe(1)
    })
  )

  it.scopedLive("follows a publisher restarted on the same port", () =>
    Effect.gen(function* () {
      const port = yield* freePort
      const endpoint = `tcp://127.0.0.1:${port}`
      const first = new zmq.Publisher({ linger: 0 })
      yield* Effect.promise(() => first.bind(endpoint))
      const sub = yield* collect(endpoint, "r")
      yield* prime(first, sub, "r")
      yield* sendAll(first, [["r", "before"]])
      yield* eventually(
        Effect.sync(() => withoutProbes(sub.messages).length === 1),
        "the first publisher's message"
      )
      first.close()
      yield* eventually(
        Effect.sync(() => sub.connection.length === 2),
        "the disconnect"
      )
      const second = yield* publisher(endpoint)
      yield* eventually(
        Effect.sync(() => sub.connection.length === 3),
        "the reconnect"
      )
      yield* prime(second, sub, "r")
      yield* sendAll(second, [["r", "after"]])
      yield* eventually(
        Effect.sync(() => withoutProbes(sub.messages).length === 2),
        "the second publisher's message"
      )
      expect(text(withoutProbes(sub.messages))).toEqual([
        ["r", "before"],
        ["r", "after"]
      ])
      expect(sub.connection).toEqual([true, false, true])
      const stats = sub.subscriber.stats()
      expect([stats.connects, stats.disconnects]).toEqual([2, 1])
    })
  )

  it.scopedLive("a consumer that is behind: reading pauses at the high-water mark, then resumes", () =>
    Effect.gen(function* () {
      const hwm = 1000
      const pub = yield* bound(() => new zmq.Publisher({ sendHighWaterMark: 1000 }))
      const sub = yield* collect(pub.lastEndpoint!, "", { highWaterMark: hwm, drain: false })
      yield* eventually(
        Effect.sync(() => sub.connection.includes(true)),
        "the handshake"
      )
      // Nothing drains: send 20 MB, far more than the mark, the TCP buffers and the publisher's
      // own HWM hold together; the publisher drops the rest, as it would for a libzmq SUB.
      const payload = Buffer.alloc(1000, 1)
      const total = 20_000
      let sent = 0
      const publish = Effect.promise(async () => {
        for (; sent < total; sent++) await pub.send(["", payload])
      })
      yield* eventually(
        Effect.gen(function* () {
          if (sent < total) yield* publish
          return sub.subscriber.stats().paused
        }),
        "reading to pause"
      )
      yield* publish
      const atMark = sub.subscriber.stats()
      // A chunk read before the pause takes effect adds at most a chunk's worth of messages.
      expect(atMark.queued).toBeGreaterThanOrEqual(hwm)
      expect(atMark.queued).toBeLessThan(hwm + 200)
      expect(atMark.bufferedBytes).toBeLessThan(64 * 1024 + 1000)
      // Draining resumes reading: more than the mark arrives, and then a last message.
      const received: Array<Array<Buffer>> = []
      yield* sub.subscriber.receiveBatch(received, 32).pipe(Effect.forever, Effect.forkScoped)
      yield* eventually(
        Effect.sync(() => received.length > hwm + 200 && !sub.subscriber.stats().paused),
        "reading to resume"
      )
      yield* eventually(
        Effect.gen(function* () {
          yield* sendAll(pub, [["last", "x"]])
          return received.some((frames) => frames[0]!.toString() === "last")
        }),
        "a message sent after the backlog",
        20_000
      )
      expect(received.length).toBeLessThan(total + 1000)
      expect(sub.connection).toEqual([true])
    })
  )

  it.scopedLive(
    "a connection callback that throws neither closes the connection nor stops the subscriber",
    () =>
      Effect.gen(function* () {
        const pub = yield* publisher()
        const subscriber = yield* makeZmtpSubscriber({
          endpoint: pub.lastEndpoint!,
          address: parseTcpEndpoint(pub.lastEndpoint!)!,
          topic: "",
          highWaterMark: 1000,
          onConnection: () => {
            throw new Error("callback bug")
          }
        })
        const messages: Array<Array<Buffer>> = []
        yield* subscriber.receiveBatch(messages, 32).pipe(Effect.forever, Effect.forkScoped)
        yield* eventually(
          Effect.gen(function* () {
            yield* sendAll(pub, [["m"]])
            return messages.length > 0
          }),
          "a message"
        )
        const stats = subscriber.stats()
        expect([stats.connects, stats.disconnects]).toEqual([1, 0])
      })
  )
})
