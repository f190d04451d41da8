/**
 * Peers that are not ZeroMQ, are the wrong kind of socket, or break ZMTP on purpose: each is a
 * typed protocol error counted by reason, the connection is closed and retried, and nothing
 * reaches the consumer or throws. The fake peers are plain TCP servers writing ZMTP bytes built
 * here, independently of the code under test.
 */

import type * as net from "node:net"
import { it } from "@effect/vitest"
import { Effect } from "effect"
import { describe, expect } from "vitest"
import * as zmq from "zeromq"
import type { ZmtpErrorReason } from "../../../src/protocol/Events.js"
import type { ZmtpSubscriberOptions } from "../../../src/transport/zmtp/ZmtpSubscriber.js"
import { bound, collect, eventually, tcpServer } from "./zmtpFixtures.js"

/** A ZMTP 3.0 greeting; `major` and `mechanism` as a misbehaving peer chooses. */
const greeting = (options: { readonly major?: number; readonly mechanism?: string } = {}): Buffer => {
  const out = Buffer.alloc(64)
  out[0] = 0xff
  out[9] = 0x7f
  out[10] = options.major ?? 3
  out[11] = 0
  out.write(options.mechanism ?? "NULL", 12, "latin1")
  return out
}

/** One frame: flags, then a 1-byte size or (LONG) an 8-byte one, then the body. */
const frame = (flags: number, body: Buffer, longSize?: bigint): Buffer => {
  if (longSize === undefined && body.length < 256)
    return Buffer.concat([Buffer.from([flags, body.length]), body])
  const header = Buffer.alloc(9)
  header[0] = flags | 0x02
  header.writeBigUInt64BE(longSize ?? BigInt(body.length), 1)
  return Buffer.concat([header, body])
}

const command = (name: string, data: Buffer = Buffer.alloc(0)) =>
  frame(0x04, Buffer.concat([Buffer.from([name.length]), Buffer.from(name, "latin1"), data]))

const ready = (socketType: string) => {
  const key = Buffer.from("Socket-Type", "latin1")
  const value = Buffer.from(socketType, "latin1")
  const length = Buffer.alloc(4)
  length.writeUInt32BE(value.length)
  return command("READY", Buffer.concat([Buffer.from([key.length]), key, length, value]))
}

/** A fake PUB writing `bytes` once connected; what the subscriber writes back is recorded. */
const fakePeer = (bytes: Buffer) =>
  Effect.gen(function* () {
    const received: Array<Buffer> = []
    const server = yield* tcpServer((socket: net.Socket) => {
      socket.on("data", (chunk) => received.push(chunk))
      socket.write(bytes)
    })
    return { ...server, received: () => Buffer.concat(received) }
  })

/**
 * Waits for two connections failing with `reason` (so it reconnected after the first); with
 * `afterHandshake` each failure follows a completed handshake.
 */
const failsTwiceWith = (
  endpoint: string,
  reason: ZmtpErrorReason,
  options: Partial<ZmtpSubscriberOptions> = {},
  afterHandshake = false
) =>
  Effect.gen(function* () {
    const sub = yield* collect(endpoint, "", { reconnectIntervalMax: "200 millis", ...options })
    yield* eventually(
      Effect.sync(() => sub.subscriber.stats().protocolErrors[reason] >= 2),
      `two ${reason} errors`
    )
    const stats = sub.subscriber.stats()
    const others = Object.entries(stats.protocolErrors).filter(([key, n]) => key !== reason && n > 0)
    expect(others).toEqual([])
    expect(sub.messages).toEqual([])
    if (afterHandshake) {
      expect(stats.connects).toBeGreaterThanOrEqual(2)
      expect(sub.connection.slice(0, 4)).toEqual([true, false, true, false])
    } else {
      expect(stats.connects).toBe(0)
      expect(sub.connection).toEqual([])
    }
    return sub
  })

describe("ZMTP subscriber and bad peers", () => {
  it.scopedLive("a peer that is not ZeroMQ (an HTTP reply) is rejected on its first byte and retried", () =>
    Effect.gen(function* () {
      const peer = yield* fakePeer(Buffer.from("HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n"))
      yield* failsTwiceWith(peer.endpoint, "greeting-signature")
      expect(peer.connections()).toBeGreaterThanOrEqual(2)
      // Our greeting went out: signature, 3.0, NULL.
      const sent = peer.received()
      expect([sent[0], sent[9], sent[10], sent[11]]).toEqual([0xff, 0x7f, 3, 0])
      expect(sent.toString("latin1", 12, 16)).toBe("NULL")
    })
  )

  it.scopedLive("a libzmq ROUTER is the wrong socket type", () =>
    Effect.gen(function* () {
      const router = yield* bound(() => new zmq.Router())
      yield* failsTwiceWith(router.lastEndpoint!, "socket-type")
    })
  )

  it.scopedLive("a libzmq SUB is the wrong socket type", () =>
    Effect.gen(function* () {
      const sub = yield* bound(() => new zmq.Subscriber())
      yield* failsTwiceWith(sub.lastEndpoint!, "socket-type")
    })
  )

  it.scopedLive("a mechanism other than NULL", () =>
    Effect.gen(function* () {
      const peer = yield* fakePeer(greeting({ mechanism: "CURVE" }))
      yield* failsTwiceWith(peer.endpoint, "mechanism")
    })
  )

  it.scopedLive("ZMTP 2.0", () =>
    Effect.gen(function* () {
      const peer = yield* fakePeer(greeting({ major: 1 }))
      yield* failsTwiceWith(peer.endpoint, "greeting-version")
    })
  )

  it.scopedLive("a frame above the limit is refused from its size alone", () =>
    Effect.gen(function* () {
      const peer = yield* fakePeer(
        Buffer.concat([greeting(), ready("PUB"), frame(0, Buffer.from("hdr"), 2n * 1024n * 1024n)])
      )
      const sub = yield* failsTwiceWith(peer.endpoint, "frame-size", { maxFrameBytes: 1024 * 1024 }, true)
      expect(sub.subscriber.stats().bufferedBytes).toBe(0)
    })
  )

  it.scopedLive("a frame whose 8-byte size is above 2^32", () =>
    Effect.gen(function* () {
      const peer = yield* fakePeer(
        Buffer.concat([greeting(), ready("PUB"), frame(0, Buffer.alloc(0), 1n << 40n)])
      )
      yield* failsTwiceWith(peer.endpoint, "frame-size", {}, true)
    })
  )

  it.scopedLive("reserved flag bits", () =>
    Effect.gen(function* () {
      const peer = yield* fakePeer(Buffer.concat([greeting(), ready("PUB"), frame(0x20, Buffer.from("x"))]))
      yield* failsTwiceWith(peer.endpoint, "frame-flags", {}, true)
    })
  )

  it.scopedLive("a message before READY", () =>
    Effect.gen(function* () {
      const peer = yield* fakePeer(Buffer.concat([greeting(), frame(0, Buffer.from("early"))]))
      yield* failsTwiceWith(peer.endpoint, "handshake")
    })
  )

  it.scopedLive("a READY without a Socket-Type", () =>
    Effect.gen(function* () {
      const peer = yield* fakePeer(Buffer.concat([greeting(), command("READY")]))
      yield* failsTwiceWith(peer.endpoint, "handshake")
    })
  )

  it.scopedLive("an ERROR command from the peer", () =>
    Effect.gen(function* () {
      const reason = Buffer.from("go away")
      const peer = yield* fakePeer(
        Buffer.concat([greeting(), command("ERROR", Buffer.concat([Buffer.from([reason.length]), reason]))])
      )
      yield* failsTwiceWith(peer.endpoint, "peer-error")
    })
  )

  it.scopedLive("a peer that accepts and says nothing times out the handshake", () =>
    Effect.gen(function* () {
      const peer = yield* fakePeer(Buffer.alloc(0))
      yield* failsTwiceWith(peer.endpoint, "handshake-timeout", { handshakeTimeout: "100 millis" })
    })
  )

  it.scopedLive("a message cut off by its connection's end is dropped, not joined to the next one", () =>
    Effect.gen(function* () {
      // The first connection ends after two frames of a three-frame message; the second sends a
      // filtered-out multipart message, then a whole one.
      const server = yield* tcpServer((socket: net.Socket) => {
        socket.on("error", () => {})
        socket.on("data", () => {})
        if (firstSent) {
          socket.write(
            Buffer.concat([
              greeting(),
              ready("PUB"),
              frame(0x01, Buffer.from("other")),
              frame(0, Buffer.from("skipped")),
              frame(0x01, Buffer.from("topic")),
              frame(0, Buffer.from("whole"))
            ])
          )
          return
        }
        firstSent = true
        socket.end(
          Buffer.concat([
            greeting(),
            ready("PUB"),
            frame(0x01, Buffer.from("topic")),
            frame(0x01, Buffer.from("cut"))
          ])
        )
      })
      let firstSent = false
      const sub = yield* collect(server.endpoint, "top")
      yield* eventually(
        Effect.sync(() => sub.messages.length === 1),
        "the whole message"
      )
      expect(sub.messages.map((frames) => frames.map(String))).toEqual([["topic", "whole"]])
      expect(server.connections()).toBe(2)
      expect(sub.subscriber.stats().queued).toBe(0)
    })
  )

  it.scopedLive("answers PING with PONG and its context, ignores unknown commands, then delivers", () =>
    Effect.gen(function* () {
      const ttl = Buffer.from([0x00, 0x64])
      const peer = yield* fakePeer(
        Buffer.concat([
          greeting(),
          ready("XPUB"),
          command("PING", Buffer.concat([ttl, Buffer.from("ctx-1")])),
          command("HELLO", Buffer.from("?")),
          frame(0x01, Buffer.from("topic")),
          frame(0, Buffer.from("body"))
        ])
      )
      const sub = yield* collect(peer.endpoint, "top")
      yield* eventually(
        Effect.sync(() => sub.messages.length === 1),
        "the message after the PING"
      )
      expect(sub.messages.map((frames) => frames.map(String))).toEqual([["topic", "body"]])
      const pong = command("PONG", Buffer.from("ctx-1"))
      const subscription = frame(0, Buffer.from("\u0001top", "latin1"))
      yield* eventually(
        Effect.sync(() => peer.received().includes(pong)),
        "the PONG"
      )
      // After the greeting: our READY (a SUB), the subscription, the PONG.
      const sent = peer.received()
      expect(sent.subarray(64).equals(Buffer.concat([ready("SUB"), subscription, pong]))).toBe(true)
      expect(sub.connection).toEqual([true])
    })
  )
})
