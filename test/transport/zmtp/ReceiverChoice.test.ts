/**
 * Which reader a subscription gets: `tcp://` endpoints the ZMTP subscriber (a peer that is not
 * ZeroMQ shows up in its protocol-error counter), anything else zeromq.js (an `ipc://` PUB is
 * followed as before). Both hand `deliver` the same frames.
 */

import * as os from "node:os"
import * as path from "node:path"
import { it } from "@effect/vitest"
import { Effect, Metric } from "effect"
import { describe, expect } from "vitest"
import * as zmq from "zeromq"
import { zmtpProtocolErrorsTotal } from "../../../src/observability/RelayMetrics.js"
import { type IngestMessage, subscribe } from "../../../src/transport/ZmqSocket.js"
import { bound, eventually, tcpServer } from "./zmtpFixtures.js"

/** Frame 1 is the message's number, handed on as its sequence. */
const decode = (frames: Array<Buffer>): IngestMessage => ({
  _tag: "Batch",
  publisherId: BigInt(frames.length),
  sequence: Number(frames[1]!.toString()),
  events: [],
  blocks: 0,
  ignored: 0
})

const follow = (endpoint: string) =>
  Effect.gen(function* () {
    const seen: Array<IngestMessage> = []
    const connected: Array<boolean> = []
    yield* subscribe({
      endpoint,
      topic: "t",
      decode,
      deliver: (message) => {
        seen.push(message)
        return undefined
      },
      onConnection: (up) => connected.push(up)
    })
    return { seen, connected }
  })

const delivers = (pub: zmq.Publisher, seen: ReadonlyArray<IngestMessage>) =>
  eventually(
    Effect.gen(function* () {
      yield* Effect.promise(() => pub.send(["t", "7", "x"]))
      return seen.length > 0
    }),
    "a delivered message"
  ).pipe(
    Effect.tap(() => {
      const first = seen[0]!
      expect(first._tag === "Batch" && [first.publisherId, first.sequence]).toEqual([3n, 7])
    })
  )

const protocolErrors = Metric.tagged(zmtpProtocolErrorsTotal, "reason", "greeting-signature")

describe("the receiver a subscription uses", () => {
  it.scopedLive("tcp:// goes through the ZMTP subscriber", () =>
    Effect.gen(function* () {
      const pub = yield* bound(() => new zmq.Publisher())
      const { seen, connected } = yield* follow(pub.lastEndpoint!)
      yield* delivers(pub, seen)
      expect(connected).toEqual([true])
      const before = (yield* Metric.value(protocolErrors)).count
      const garbage = yield* tcpServer((socket) => socket.end("not zeromq\n"))
      yield* follow(garbage.endpoint)
      yield* eventually(
        Effect.map(Metric.value(protocolErrors), (state) => state.count > before),
        "a ZMTP protocol error"
      )
    })
  )

  it.scopedLive("ipc:// stays on zeromq.js", () =>
    Effect.gen(function* () {
      const file = path.join(os.tmpdir(), `kvrelay-zmtp-${process.pid}-${Date.now()}.ipc`)
      const pub = yield* bound(() => new zmq.Publisher(), `ipc://${file}`)
      const { seen, connected } = yield* follow(`ipc://${file}`)
      yield* delivers(pub, seen)
      yield* eventually(
        Effect.sync(() => connected.includes(true)),
        "the socket monitor's handshake"
      )
    })
  )
})
