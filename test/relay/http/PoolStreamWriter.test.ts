/**
 * The pool stream's body written straight to the socket (`internal/PoolStreamWriter`): a slow
 * reader gets every frame in order, a backlog goes out as one write, a client that stopped
 * reading is cut after the stall timeout (on the TestClock), and an abort releases the
 * subscription. Real relay, real sockets throughout.
 */

import * as Http from "node:http"
import type { AddressInfo } from "node:net"
import { describe, expect, it } from "@effect/vitest"
import { Deferred, Duration, Effect, Exit, Fiber, Logger, LogLevel, type Scope, TestClock } from "effect"
import { Cbi1SnapshotAssembler, decodeCbi1 } from "../../../src/ckf/cbi1.js"
import {
  FRAME_DELTA,
  FRAME_HEARTBEAT,
  FRAME_SNAPSHOT_CHUNK,
  type PoolFrame
} from "../../../src/protocol/PoolStream.js"
import * as PoolStreamWriter from "../../../src/relay/http/internal/PoolStreamWriter.js"
import * as RelayHttpServer from "../../../src/relay/http/RelayHttpServer.js"
import type { PoolAttachment } from "../../../src/relay/PoolRegistry.js"
import { eventually, get, subscribePool } from "../../http/httpClient.js"
import { storedEventN } from "../registryFixtures.js"
import { makeTestRelay, producerJson, type TestRelayOptions } from "./relayFixture.js"

const live = <A, E>(name: string, body: () => Effect.Effect<A, E, Scope.Scope>, timeout?: number) =>
  it.scopedLive(name, () => body().pipe(Logger.withMinimumLogLevel(LogLevel.Warning)), timeout)

/** Four snapshot chunks of ~4 MiB each: more than a response buffers before it waits for drain. */
const BIG_FILTER = 4_000_000

const setup = (options: RelayHttpServer.RelayHttpOptions = {}, relayOptions: TestRelayOptions = {}) =>
  Effect.gen(function* () {
    const test = yield* makeTestRelay(relayOptions)
    const attachment = yield* test.attach(1, "prod.backend.generate")
    const server = yield* RelayHttpServer.serve(test.relay, { host: "127.0.0.1", port: 0, ...options })
    const hub = () => test.registry.hubSlot(attachment.poolId)!.hub!
    return { ...test, attachment, server, base: server.url, hub }
  })

const publish = (attachment: PoolAttachment, from: number, count: number) =>
  Effect.gen(function* () {
    for (let i = from; i < from + count; i++) {
      yield* attachment.actor.admitEvent(0, storedEventN(i))
      yield* attachment.actor.flush
    }
  })

const gaugeValue = (text: string): number => {
  const series = 'kv_dc_relay_subscribers{stream="pool"}'
  const line = text.split("\n").find((l) => l.startsWith(`${series} `))
  return line === undefined ? 0 : Number(line.slice(series.length + 1))
}

/** Deltas continue the snapshot's sequence one by one. */
const expectContiguous = (snapshotSequence: bigint, deltas: ReadonlyArray<PoolFrame>) => {
  let sequence = snapshotSequence
  for (const delta of deltas) {
    expect(delta.kind).toBe(FRAME_DELTA)
    expect(delta.baseSequence).toBe(sequence)
    expect(delta.sequence).toBe(sequence + 1n)
    sequence = delta.sequence
  }
}

describe("PoolStreamWriter over a real relay", () => {
  live(
    "a client that reads slowly gets every snapshot chunk and every delta, in order",
    () =>
      Effect.gen(function* () {
        const { base, attachment, hub } = yield* setup({}, { expectedUniqueBlocks: BIG_FILTER })
        const opened = yield* subscribePool(base, {
          subscriberId: "slow-reader",
          expectedProducer: producerJson(attachment)
        })
        if (!("stream" in opened)) return yield* Effect.dieMessage(opened.error.text)
        // Published while nothing was read: the writer waits for drain, the deltas in the hub.
        yield* publish(attachment, 1, 12)
        yield* eventually(
          "the deltas were published",
          Effect.sync(() => hub().stats.publishedFrames),
          (n) => n >= 12
        )
        const frames: Array<PoolFrame> = []
        while (frames.length < 4 + 12) {
          const frame = yield* opened.stream.next(10_000)
          if (frame === undefined) return yield* Effect.dieMessage(`ended after ${frames.length} frames`)
          frames.push(frame)
          // A reader that takes its time: every frame costs it a few milliseconds.
          yield* Effect.sleep("5 millis")
        }
        expect(frames.slice(0, 4).map((f) => f.kind)).toEqual(Array(4).fill(FRAME_SNAPSHOT_CHUNK))
        const expected = { format: attachment.identity.format, dcId: attachment.identity.poolId.dcId.value }
        const assembler = new Cbi1SnapshotAssembler(expected)
        let assembled: ReturnType<typeof assembler.push>
        for (const chunk of frames.slice(0, 4)) {
          const decoded = decodeCbi1(chunk.payload, expected)
          if (decoded instanceof Error || decoded._tag !== "SnapshotChunk")
            return yield* Effect.dieMessage("not a chunk")
          assembled = assembler.push(decoded)
        }
        if (assembled === undefined || assembled instanceof Error)
          return yield* Effect.dieMessage("no snapshot")
        expect(assembled.words.length).toBeGreaterThan(0)
        expectContiguous(frames[0]!.sequence, frames.slice(4))
        // And the stream goes on live afterwards.
        yield* publish(attachment, 13, 1)
        const after = (yield* opened.stream.next())!
        expectContiguous(frames.at(-1)!.sequence, [after])
        expect(hub().stats.laggedSubscribers).toBe(0)
        yield* opened.stream.abort()
      }),
    30_000
  )

  live("heartbeats start after a snapshot whose last chunk had to wait for drain", () =>
    Effect.gen(function* () {
      const { base, attachment } = yield* setup(
        { intervals: { poolHeartbeat: "150 millis" } },
        { expectedUniqueBlocks: BIG_FILTER }
      )
      const opened = yield* subscribePool(base, {
        subscriberId: "hb-after-drain",
        expectedProducer: producerJson(attachment)
      })
      if (!("stream" in opened)) return yield* Effect.dieMessage(opened.error.text)
      const chunks: Array<PoolFrame> = []
      while (chunks.length < 4) chunks.push((yield* opened.stream.next(10_000))!)
      expect(chunks.map((f) => f.kind)).toEqual(Array(4).fill(FRAME_SNAPSHOT_CHUNK))
      const heartbeat = (yield* opened.stream.next(5_000))!
      expect(heartbeat.kind).toBe(FRAME_HEARTBEAT)
      expect(heartbeat.sequence).toBe(chunks[0]!.sequence)
      yield* opened.stream.abort()
    })
  )

  live("a backlog that waited for the socket goes out as one write (one send timestamp)", () =>
    Effect.gen(function* () {
      const { base, attachment, hub } = yield* setup({}, { expectedUniqueBlocks: BIG_FILTER })
      const opened = yield* subscribePool(base, {
        subscriberId: "backlog",
        expectedProducer: producerJson(attachment)
      })
      if (!("stream" in opened)) return yield* Effect.dieMessage(opened.error.text)
      yield* publish(attachment, 1, 6)
      yield* eventually(
        "the deltas were published",
        Effect.sync(() => hub().stats.publishedFrames),
        (n) => n >= 6
      )
      const frames: Array<PoolFrame> = []
      while (frames.length < 4 + 6) frames.push((yield* opened.stream.next(10_000))!)
      const deltas = frames.slice(4)
      expectContiguous(frames[0]!.sequence, deltas)
      expect(new Set(deltas.map((d) => d.sendTsUs)).size).toBe(1)
      yield* opened.stream.abort()
    })
  )

  live("a client that aborts mid-stream releases its hub subscription, stream slot and gauge once", () =>
    Effect.gen(function* () {
      const { base, attachment, hub, source } = yield* setup()
      const before = gaugeValue((yield* get(base, "/metrics")).text)
      const opened = yield* subscribePool(base, {
        subscriberId: "leaver",
        expectedProducer: producerJson(attachment)
      })
      if (!("stream" in opened)) return yield* Effect.dieMessage(opened.error.text)
      const snapshot = (yield* opened.stream.next())!
      expect(snapshot.kind).toBe(FRAME_SNAPSHOT_CHUNK)
      yield* publish(attachment, 1, 2)
      expectContiguous(snapshot.sequence, [(yield* opened.stream.next())!, (yield* opened.stream.next())!])
      expect(hub().stats.subscribers).toBe(1)
      expect(source.activeStreams()).toBe(1)
      expect(gaugeValue((yield* get(base, "/metrics")).text)).toBe(before + 1)

      yield* opened.stream.abort()
      yield* eventually(
        "the hub subscription is released",
        Effect.sync(() => hub().stats.subscribers + source.activeStreams()),
        (n) => n === 0
      )
      yield* eventually(
        "the gauge is back",
        Effect.map(get(base, "/metrics"), (reply) => gaugeValue(reply.text)),
        (n) => n === before
      )
      // Deltas after the abort go nowhere and break nothing; the gauge does not go below.
      yield* publish(attachment, 3, 2)
      expect(gaugeValue((yield* get(base, "/metrics")).text)).toBe(before)
    })
  )
})

/** A real `node:http` server whose first request's response is handed out, head written. */
const rawServer = Effect.acquireRelease(
  Effect.async<{ server: Http.Server; port: number }>((resume) => {
    const server = Http.createServer()
    server.listen(0, "127.0.0.1", () =>
      resume(Effect.succeed({ server, port: (server.address() as AddressInfo).port }))
    )
  }),
  ({ server }) =>
    Effect.sync(() => {
      server.closeAllConnections()
      server.close()
    })
)

/** Polls `condition` on real time (the test runs on the TestClock), up to `ms`. */
const realEventually = (what: string, condition: () => boolean, ms = 10_000) =>
  Effect.promise(
    () =>
      new Promise<void>((resolve, reject) => {
        const deadline = Date.now() + ms
        const check = () => {
          if (condition()) return resolve()
          if (Date.now() > deadline) return reject(new Error(`timed out waiting until ${what}`))
          setTimeout(check, 5)
        }
        check()
      })
  )

describe("PoolStreamWriter on the TestClock", () => {
  it.scoped(
    "a client that stopped reading is cut once the writer waited writeStallTimeout for drain, not before",
    () =>
      Effect.gen(function* () {
        const test = yield* makeTestRelay({ expectedUniqueBlocks: BIG_FILTER })
        const attachment = yield* test.attach(1, "prod.backend.generate")
        const feed = yield* test.source.subscribePoolFeed(attachment.identity, "stuck")
        const { server, port } = yield* rawServer
        const responded = yield* Deferred.make<Http.ServerResponse>()
        server.on("request", (_request: Http.IncomingMessage, response: Http.ServerResponse) => {
          response.writeHead(200, { "content-type": "application/octet-stream" })
          Deferred.unsafeDone(responded, Exit.succeed(response))
        })
        // The client takes the head and then never reads again.
        const client = Http.request({ host: "127.0.0.1", port, method: "POST", path: "/" }, (incoming) => {
          incoming.pause()
          incoming.socket.pause()
        })
        client.on("error", () => {})
        client.end()
        yield* Effect.addFinalizer(() => Effect.sync(() => client.destroy()))
        const response = yield* Deferred.await(responded)
        const shutdown = yield* Deferred.make<void>()
        const writing = yield* PoolStreamWriter.writeBody({
          response,
          feed,
          snapshotChunks: 4,
          heartbeat: Duration.seconds(10),
          writeStallTimeout: Duration.seconds(1),
          shutdown,
          onHeartbeat: Effect.void,
          errorBody: (reason, message) => JSON.stringify({ reason, message })
        }).pipe(Effect.fork)
        yield* realEventually("the writer waits for drain", () => response.writableNeedDrain)

        yield* TestClock.adjust("999 millis")
        // Whatever the adjustment woke has run by then (this proves an absence: it must wait).
        yield* Effect.promise(() => new Promise((resolve) => setTimeout(resolve, 100)))
        expect(response.destroyed).toBe(false)
        yield* TestClock.adjust("1 millis")
        yield* realEventually("the connection is cut", () => response.destroyed)
        yield* Fiber.interrupt(writing)
      }).pipe(Logger.withMinimumLogLevel(LogLevel.Error)),
    30_000
  )
})
