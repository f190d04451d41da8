/**
 * The relay HTTP edge under hostile clients (PROTOCOL §5 ◆), over real sockets: streamed
 * snapshots that keep the event loop free and are limited to 2 at once, and pool-stream slots
 * that a client which stops reading cannot hold.
 *
 * The non-reading clients are raw `net` sockets that send their request and never read, so the
 * kernel buffers fill and the server's writer waits on them, as with a stuck peer.
 */

import * as DiagnosticsChannel from "node:diagnostics_channel"
import * as Http from "node:http"
import * as Net from "node:net"
import { describe, expect, it } from "@effect/vitest"
import { Effect, Either, Fiber, Logger, LogLevel, type Scope } from "effect"
import { removedEvent, storedEvent } from "../../../src/protocol/Events.js"
import { encodeJsonText } from "../../../src/protocol/Json.js"
import { FRAME_SNAPSHOT_CHUNK } from "../../../src/protocol/PoolStream.js"
import { DiagnosticSnapshotJson } from "../../../src/protocol/RelayApi.js"
import { SNAPSHOT_SLICE_BYTES } from "../../../src/relay/http/internal/SnapshotBody.js"
import * as RelayHttpServer from "../../../src/relay/http/RelayHttpServer.js"
import { eventually, get, subscribePool } from "../../http/httpClient.js"
import { makeTestRelay, producerJson } from "./relayFixture.js"

const live = <A, E>(name: string, body: () => Effect.Effect<A, E, Scope.Scope>, timeout?: number) =>
  it.scopedLive(name, () => body().pipe(Logger.withMinimumLogLevel(LogLevel.Error)), timeout)

const ENDPOINT = "prod.backend.generate"
const SNAPSHOT_PATH = `/v1/endpoints/${ENDPOINT}/snapshot`

/** Distinct hashes spread over the u64 range. */
const hashes = (base: bigint, count: number): Array<bigint> =>
  Array.from(
    { length: count },
    (_, i) => (base + BigInt(i) * 0x9e37_79b9_7f4a_7c15n) & 0xffff_ffff_ffff_ffffn
  )

/** A client that sends one request and never reads (until `drain` is called). */
class RawClient {
  private readonly chunks: Array<Buffer> = []
  closed = false

  constructor(readonly socket: Net.Socket) {
    socket.on("close", () => {
      this.closed = true
    })
    // A reset while nobody reads is expected; it must not become an unhandled error.
    socket.on("error", () => {})
  }

  /** Reads everything from now on; completes when the connection is closed. */
  drain(timeoutMs: number): Effect.Effect<Buffer> {
    return Effect.promise(
      () =>
        new Promise<Buffer>((resolve, reject) => {
          const timer = setTimeout(
            () => reject(new Error(`connection not closed within ${timeoutMs} ms`)),
            timeoutMs
          )
          const done = () => {
            clearTimeout(timer)
            resolve(Buffer.concat(this.chunks))
          }
          if (this.closed) return done()
          this.socket.on("data", (chunk: Buffer) => this.chunks.push(chunk))
          this.socket.once("close", done)
        })
    )
  }
}

/** Connects, writes `request`, and never reads; the socket is destroyed with the scope. */
const rawRequest = (port: number, request: string): Effect.Effect<RawClient, never, Scope.Scope> =>
  Effect.acquireRelease(
    Effect.promise(
      () =>
        new Promise<RawClient>((resolve, reject) => {
          const socket = Net.connect({ host: "127.0.0.1", port }, () => {
            socket.off("error", reject)
            socket.write(request)
            resolve(new RawClient(socket))
          })
          socket.once("error", reject)
        })
    ),
    (client) => Effect.sync(() => client.socket.destroy())
  )

const rawSubscribe = (port: number, body: unknown) => {
  const json = JSON.stringify(body)
  return rawRequest(
    port,
    `POST /v1/pools/subscribe HTTP/1.1\r\nhost: 127.0.0.1:${port}\r\ncontent-type: application/json\r\n` +
      `content-length: ${Buffer.byteLength(json)}\r\n\r\n${json}`
  )
}

const rawSnapshot = (port: number) =>
  rawRequest(port, `GET ${SNAPSHOT_PATH} HTTP/1.1\r\nhost: 127.0.0.1:${port}\r\n\r\n`)

const metricValue = (text: string, series: string): number => {
  const line = text.split("\n").find((l) => l.startsWith(`${series} `))
  return line === undefined ? 0 : Number(line.slice(series.length + 1))
}
const CUT_SERIES = 'kv_dc_relay_stream_connections_cut_total{stream="pool"}'

interface SnapshotReply {
  readonly status: number
  readonly body: Buffer
}

/** `GET` the snapshot with `node:http`: the client shares the test's event loop and CPU with the server, so it should be cheap. */
const fetchSnapshot = (base: string, keepBody = true): Effect.Effect<SnapshotReply> =>
  Effect.promise(
    () =>
      new Promise<SnapshotReply>((resolve, reject) => {
        Http.get(`${base}${SNAPSHOT_PATH}`, { agent: false }, (response) => {
          const chunks: Array<Buffer> = []
          const ok = response.statusCode === 200
          response.on("data", (chunk: Buffer) => {
            if (keepBody || !ok) chunks.push(chunk)
          })
          response.on("end", () => resolve({ status: response.statusCode ?? 0, body: Buffer.concat(chunks) }))
          response.on("error", reject)
        }).on("error", reject)
      })
  )

/** The words a snapshot body carries, as little-endian bytes, and its other fields. */
const parseSnapshot = (body: Buffer) => {
  const json = JSON.parse(body.toString("utf8")) as Record<string, unknown>
  return { json, bytes: Buffer.from(json["buckets"] as string, "base64") }
}

const wordBytes = (words: Uint32Array): Buffer => {
  const bytes = Buffer.alloc(4 * words.length)
  for (let i = 0; i < words.length; i++) bytes.writeUInt32LE(words[i]!, 4 * i)
  return bytes
}

/**
 * Counts, for every connection the server accepts while it runs, the event-loop turns in which
 * the server wrote to it: a `setImmediate` chain samples each server-side socket's `bytesWritten`
 * (which counts what is queued as well as what was sent) once a turn. The server-side sockets
 * come from Node's `net.server.socket` diagnostics channel.
 */
const writeTurns = Effect.acquireRelease(
  Effect.sync(() => {
    const written = new Map<Net.Socket, { bytes: number; turns: number }>()
    const onSocket = (message: unknown) => {
      written.set((message as { socket: Net.Socket }).socket, { bytes: 0, turns: 0 })
    }
    DiagnosticsChannel.subscribe("net.server.socket", onSocket)
    let handle: NodeJS.Immediate | undefined
    const sample = () => {
      for (const [socket, seen] of written) {
        if (socket.bytesWritten > seen.bytes) {
          seen.bytes = socket.bytesWritten
          seen.turns++
        }
      }
      handle = setImmediate(sample)
    }
    handle = setImmediate(sample)
    return {
      /** Bytes and write turns of each connection that took at least `minBytes`. */
      connections: (minBytes: number) => [...written.values()].filter((seen) => seen.bytes >= minBytes),
      stop: () => {
        if (handle !== undefined) clearImmediate(handle)
        DiagnosticsChannel.unsubscribe("net.server.socket", onSocket)
      }
    }
  }),
  (sampler) => Effect.sync(() => sampler.stop())
)

describe("RelayHttpServer edge: diagnostic snapshots", () => {
  live(
    "10 concurrent snapshots of a default-size pool: 2 admitted and 8 get 429, each body written a slice per event-loop turn while /healthz answers; bodies agree with the filter",
    () =>
      Effect.gen(function* () {
        // `--expected-unique-blocks 1048576`: 2^19 buckets, 4 MiB of words.
        const test = yield* makeTestRelay({ expectedUniqueBlocks: 1_048_576 })
        const attachment = yield* test.attach(1, ENDPOINT)
        for (let i = 0; i < 20; i++) {
          yield* attachment.actor.admitEvent(0, storedEvent("1", 0, i + 1, hashes(BigInt(i) << 40n, 1_000)))
        }
        yield* attachment.actor.flush
        const truth = yield* attachment.actor.snapshot
        expect(truth.words.length).toBe(2 * 524_288)
        expect(truth.stats.aggregation.uniqueBlockCount).toBeGreaterThan(10_000)
        const truthBytes = wordBytes(truth.words)
        const slices = Math.ceil(truth.words.byteLength / SNAPSHOT_SLICE_BYTES)
        expect(slices).toBe(22)
        const sampler = yield* writeTurns
        const server = yield* RelayHttpServer.serve(test.relay, { host: "127.0.0.1", port: 0 })
        const base = server.url

        // The non-streamed document the body must equal, encoded the way the route used to.
        const whole = Either.getOrThrow(
          encodeJsonText(DiagnosticSnapshotJson)({
            layoutGeneration: attachment.layoutGeneration,
            sequence: truth.sequence,
            memberCount: truth.stats.aggregation.memberCount,
            uniqueBlockCount: truth.stats.aggregation.uniqueBlockCount,
            format: truth.identity.format,
            buckets: truth.words
          })
        )

        // /healthz back to back while the rounds run: answered in between, never refused.
        let inRounds = false
        let answeredInRounds = 0
        let polling = true
        const poller = yield* Effect.fork(
          Effect.gen(function* () {
            while (polling) {
              const reply = yield* get(base, "/healthz")
              expect(reply.status).toBe(200)
              if (inRounds) answeredInRounds++
            }
          })
        )

        const ROUNDS = 4
        const replies: Array<Array<SnapshotReply>> = []
        inRounds = true
        for (let round = 0; round < ROUNDS; round++) {
          // Bodies beyond the first rounds are checked for their status only, to bound memory.
          const keep = round < 2
          replies.push(
            yield* Effect.all(
              Array.from({ length: 10 }, () => fetchSnapshot(base, keep)),
              { concurrency: "unbounded" }
            )
          )
        }
        inRounds = false
        polling = false
        yield* Fiber.join(poller)
        expect(answeredInRounds).toBeGreaterThanOrEqual(1)

        for (const round of replies) {
          const ok = round.filter((reply) => reply.status === 200)
          const limited = round.filter((reply) => reply.status === 429)
          // The first two of a round are admitted; the rest arrive while those are in progress
          // (an admitted body takes at least half as many event-loop turns as it has slices).
          expect([ok.length, limited.length]).toEqual([2, 8])
          for (const reply of limited) {
            const json = JSON.parse(reply.body.toString("utf8")) as Record<string, unknown>
            expect(json["reason"]).toBe("RESOURCE_LIMIT")
            expect(json["message"]).toMatch(/snapshot limit 2/)
          }
        }

        // Each admitted body went out in slices with the event loop free between them: at most
        // two slices a turn (one in the check phase after the yield, one more when Effect's
        // scheduler resumes the fiber from a timer), so at least half as many turns as slices.
        const bodies = sampler.connections(truthBytes.length)
        expect(bodies.length).toBe(2 * ROUNDS)
        for (const body of bodies) expect(body.turns).toBeGreaterThanOrEqual(Math.ceil(slices / 2))

        const first = replies[0]!.find((reply) => reply.status === 200)!
        expect(first.body.toString("utf8")).toBe(whole)
        for (const reply of replies.flat().filter((r) => r.status === 200 && r.body.length > 0)) {
          const { json, bytes } = parseSnapshot(reply.body)
          expect(json["sequence"]).toBe(String(truth.sequence))
          expect(json["uniqueBlockCount"]).toBe(truth.stats.aggregation.uniqueBlockCount)
          expect(bytes.equals(truthBytes)).toBe(true)
        }
      }),
    60_000
  )

  live(
    "with 2 snapshots held by clients that do not read, a 3rd gets 429 RESOURCE_LIMIT until one of them goes",
    () =>
      Effect.gen(function* () {
        // 2^21 buckets: a 22 MB body that no socket buffer absorbs, so a non-reader stays in progress.
        const test = yield* makeTestRelay({ expectedUniqueBlocks: 4_000_000 })
        const attachment = yield* test.attach(1, ENDPOINT)
        yield* attachment.actor.admitEvent(0, storedEvent("1", 0, 1, hashes(7n, 10_000)))
        yield* attachment.actor.flush
        const server = yield* RelayHttpServer.serve(test.relay, { host: "127.0.0.1", port: 0 })
        const held = [yield* rawSnapshot(server.port), yield* rawSnapshot(server.port)]

        const refused = yield* eventually(
          "a third snapshot is refused",
          fetchSnapshot(server.url),
          (reply) => reply.status === 429,
          10_000
        )
        expect(JSON.parse(refused.body.toString("utf8"))).toEqual({
          reason: "RESOURCE_LIMIT",
          message: "Relay snapshot limit 2 reached; retry once a snapshot in progress is done"
        })
        expect((yield* fetchSnapshot(server.url)).status).toBe(429)
        expect((yield* get(server.url, "/healthz")).status).toBe(200)

        held[0]!.socket.destroy()
        const admitted = yield* eventually(
          "a snapshot is admitted once a holder left",
          fetchSnapshot(server.url),
          (reply) => reply.status === 200,
          10_000
        )
        const truth = yield* attachment.actor.snapshot
        expect(parseSnapshot(admitted.body).bytes.equals(wordBytes(truth.words))).toBe(true)
      }),
    60_000
  )
})

describe("RelayHttpServer edge: pool-stream slots", () => {
  live(
    "64 subscribers that never read lag out and give their slots back at once; their connections are cut ~5 s later",
    () =>
      Effect.gen(function* () {
        // 2^20 buckets: an 8 MiB snapshot in two chunks. Loopback kernel buffers take up to ~4 MB
        // of it and the response buffers one chunk (4 MiB), so a non-reader's writer is stuck from
        // the snapshot on, and its hub queue fills with the deltas that follow.
        const test = yield* makeTestRelay({ expectedUniqueBlocks: 2_000_000 })
        const attachment = yield* test.attach(1, ENDPOINT)
        const server = yield* RelayHttpServer.serve(test.relay, { host: "127.0.0.1", port: 0 })
        const body = (i: number) => ({
          subscriberId: `stuck-${i}`,
          expectedProducer: producerJson(attachment)
        })
        const cutBefore = metricValue((yield* get(server.url, "/metrics")).text, CUT_SERIES)

        const clients: Array<RawClient> = []
        for (let i = 0; i < 64; i++) clients.push(yield* rawSubscribe(server.port, body(i)))
        yield* eventually(
          "64 streams are open",
          Effect.sync(() => test.source.activeStreams()),
          (n) => n === 64,
          10_000
        )
        const hub = test.registry.hubSlot(attachment.poolId)!.hub!
        yield* eventually(
          "64 hub subscribers",
          Effect.sync(() => hub.stats.subscribers),
          (n) => n === 64,
          10_000
        )

        const batch = hashes(11n, 2_048)
        let eventId = 0
        for (let round = 0; round < 400 && hub.stats.laggedSubscribers < 64; round++) {
          eventId++
          const event =
            eventId % 2 === 1 ? storedEvent("1", 0, eventId, batch) : removedEvent("1", 0, eventId, batch)
          yield* attachment.actor.admitEvent(0, event)
          yield* attachment.actor.flush
        }
        expect(hub.stats.laggedSubscribers).toBe(64)
        // Their streams are terminal; nothing waits on the peers for the slots.
        yield* eventually(
          "every lagged stream gave its slot back",
          Effect.sync(() => test.source.activeStreams()),
          (n) => n === 0,
          10_000
        )
        expect(clients.every((client) => !client.closed)).toBe(true)

        const next = yield* eventually(
          "a 65th subscriber is admitted",
          subscribePool(server.url, body(64)),
          (result) => "stream" in result,
          10_000
        )
        if (!("stream" in next)) return yield* Effect.dieMessage("not admitted")
        expect((yield* next.stream.next())!.kind).toBe(FRAME_SNAPSHOT_CHUNK)
        yield* next.stream.abort()
        // All of that happened before any connection was cut: the slots did not wait for the cuts.
        expect(metricValue((yield* get(server.url, "/metrics")).text, CUT_SERIES) - cutBefore).toBe(0)

        // None took its terminal frame: each connection is destroyed 5 s after its stream ended.
        yield* eventually(
          "the non-readers' connections are cut",
          Effect.map(get(server.url, "/metrics"), (reply) => metricValue(reply.text, CUT_SERIES) - cutBefore),
          (cut) => cut >= 64,
          15_000
        )
        // Reading now gets what was buffered, then the end of a cut connection: no terminal frame.
        for (const client of clients) {
          const received = yield* client.drain(10_000)
          expect(received.subarray(0, 15).toString("latin1")).toBe("HTTP/1.1 200 OK")
          expect(received.includes("SUBSCRIBER_LAGGED")).toBe(false)
        }
      }),
    120_000
  )
})
