/**
 * The SUB receive loop takes what is queued on its socket in batches (`RECEIVE_BATCH`): over a
 * real PUB socket on 127.0.0.1, every message still reaches `deliver` once, alone and in order,
 * and a defect while handling one message drops only that one. Waits poll with a bounded
 * deadline.
 */

import { it } from "@effect/vitest"
import { Deferred, Effect } from "effect"
import { describe, expect } from "vitest"
import * as zmq from "zeromq"
import {
  type Delivered,
  type IngestMessage,
  RECEIVE_BATCH,
  subscribe
} from "../../src/transport/ZmqSocket.js"
import { eventually } from "../integration/zmqHelpers.js"

const TOPIC = "batch-test"

/** Frame 1 carries the message's number; the decoder hands it on as the sequence. */
const decode = (frames: Array<Buffer>): IngestMessage => ({
  _tag: "Batch",
  publisherId: 1n,
  sequence: frames[1]!.readUInt32BE(0),
  events: [],
  blocks: 0,
  ignored: 0
})

const frame = (n: number): Buffer => {
  const out = Buffer.alloc(4)
  out.writeUInt32BE(n, 0)
  return out
}

/** A bound PUB socket, closed with the scope. */
const publisher = Effect.acquireRelease(
  Effect.promise(async () => {
    const socket = new zmq.Publisher({ sendHighWaterMark: 100_000, linger: 0 })
    await socket.bind("tcp://127.0.0.1:*")
    return socket
  }),
  (socket) => Effect.sync(() => socket.close())
)

const send = (socket: zmq.Publisher, n: number) =>
  Effect.promise(() => socket.send([TOPIC, frame(n), Buffer.alloc(200, n & 0xff)]))

/** PUB/SUB drops what is sent before the subscription arrives: send probes until one lands. */
const PROBE = 0xffff_ffff
const prime = (socket: zmq.Publisher, seen: ReadonlyArray<number>) =>
  eventually(
    Effect.gen(function* () {
      yield* send(socket, PROBE)
      return seen.includes(PROBE)
    }),
    "the subscription to reach the publisher"
  )

/**
 * A subscription that records each message's sequence and holds the loop on message 0 until
 * `gate` opens, so everything after it queues on the socket; `handle` delivers the others.
 */
const heldSubscription = (pub: zmq.Publisher, handle: (n: number, seen: Array<number>) => Delivered) =>
  Effect.gen(function* () {
    const seen: Array<number> = []
    const gate = yield* Deferred.make<void>()
    let blocked = false
    yield* subscribe({
      endpoint: pub.lastEndpoint!,
      topic: TOPIC,
      decode,
      deliver: (message) => {
        if (message._tag !== "Batch") throw new Error(`unexpected ${message._tag}`)
        const n = message.sequence
        if (n === 0 && !blocked) {
          blocked = true
          seen.push(n)
          return Deferred.await(gate)
        }
        return handle(n, seen)
      }
    })
    return { seen, gate }
  })

/** Every message through an effect; message `poisoned` is a defect. */
const gatedSubscription = (pub: zmq.Publisher, poisoned = -1) =>
  heldSubscription(pub, (n, seen) =>
    Effect.suspend(() => {
      if (n === poisoned) return Effect.die(new Error("handler defect"))
      seen.push(n)
      return Effect.void
    })
  )

/**
 * Most messages handled synchronously (undefined), every fifth through an effect that yields
 * first, and a throw for `thrown`.
 */
const mixedSubscription = (pub: zmq.Publisher, thrown: number) =>
  heldSubscription(pub, (n, seen) => {
    if (n === thrown) throw new Error("synchronous handler defect")
    if (n % 5 !== 0) {
      seen.push(n)
      return undefined
    }
    return Effect.zipRight(
      Effect.yieldNow(),
      Effect.sync(() => void seen.push(n))
    )
  })

/**
 * With the loop held at its first message, sends `total` messages, releases it and expects every
 * one but `dropped` delivered in order, and the subscription still delivering afterwards.
 */
const dropsOnlyOne = (
  pub: zmq.Publisher,
  subscription: { readonly seen: Array<number>; readonly gate: Deferred.Deferred<void> },
  dropped: number,
  total: number
) =>
  Effect.gen(function* () {
    const { seen, gate } = subscription
    yield* prime(pub, seen)
    for (let n = 0; n < total; n++) yield* send(pub, n)
    yield* eventually(
      Effect.sync(() => seen.includes(0)),
      "the first message to hold the loop"
    )
    yield* Deferred.succeed(gate, undefined)
    yield* eventually(
      Effect.sync(() => seen.includes(total - 1)),
      "the messages after the dropped one to be delivered"
    )
    yield* send(pub, total)
    yield* eventually(
      Effect.sync(() => seen.includes(total)),
      "a message sent after the dropped one"
    )
    expect(seen.filter((n) => n !== PROBE)).toEqual(
      Array.from({ length: total + 1 }, (_, n) => n).filter((n) => n !== dropped)
    )
  })

describe("ZeroMQ receive loop", () => {
  it.scopedLive("synchronous and effectful deliveries keep their order; a throw drops its message only", () =>
    Effect.gen(function* () {
      const pub = yield* publisher
      const thrown = RECEIVE_BATCH + 7
      yield* dropsOnlyOne(pub, yield* mixedSubscription(pub, thrown), thrown, 3 * RECEIVE_BATCH + 2)
    })
  )

  it.scopedLive("a backlog taken in batches reaches deliver whole, one message at a time, in order", () =>
    Effect.gen(function* () {
      const pub = yield* publisher
      const { seen, gate } = yield* gatedSubscription(pub)
      yield* prime(pub, seen)
      const total = 4 * RECEIVE_BATCH + 5
      for (let n = 0; n < total; n++) yield* send(pub, n)
      yield* eventually(
        Effect.sync(() => seen.includes(0)),
        "the first message to hold the loop"
      )
      yield* Deferred.succeed(gate, undefined)
      yield* eventually(
        Effect.sync(() => seen.filter((n) => n !== PROBE).length >= total),
        "every message to be delivered"
      )
      expect(seen.filter((n) => n !== PROBE)).toEqual(Array.from({ length: total }, (_, n) => n))
    })
  )

  it.scopedLive("a defect while handling one message of a batch drops that message only", () =>
    Effect.gen(function* () {
      const pub = yield* publisher
      const poisoned = RECEIVE_BATCH + 3
      yield* dropsOnlyOne(pub, yield* gatedSubscription(pub, poisoned), poisoned, 3 * RECEIVE_BATCH)
    })
  )
})
