/**
 * The ZeroMQ transport over real sockets on 127.0.0.1: subscriber pool routing and isolation,
 * malformed-frame accounting, the worker-query client against the worker-query server, and the
 * engine replay protocol. Every wait polls with a bounded deadline.
 */

import { it } from "@effect/vitest"
import { Deferred, Effect, Either, Fiber } from "effect"
import { describe, expect } from "vitest"
import { hashPairsToBigInts } from "../../src/ckf/u64.js"
import type { KvEventSource } from "../../src/protocol/Discovery.js"
import type { RouterEvent } from "../../src/protocol/Events.js"
import type { WorkerKvQueryRequest } from "../../src/recovery/WorkerQuery.js"
import { type DynamoZmqPublisher, makeDynamoZmqPublisher } from "../../src/simulate/DynamoZmqPublisher.js"
import { makeEngineZmqPublisher } from "../../src/simulate/EngineZmqPublisher.js"
import { makeWorkerQueryServer } from "../../src/simulate/WorkerQueryServer.js"
import { encodeDynamoMessage, frameEnvelope } from "../../src/transport/DynamoZmq.js"
import { makeEventSubscriberPool } from "../../src/transport/EventSubscriberPool.js"
import { encodeEnvelope } from "../../src/transport/msgpack.js"
import { makeWorkerQueryClient } from "../../src/transport/WorkerQueryClient.js"
import { MALFORMED_REASONS, u64FrameOf } from "../../src/transport/ZmqSocket.js"
import {
  eventually,
  isContiguousFrom,
  KV_ENDPOINT,
  makeRecorder,
  type Recorder,
  storedBigInts
} from "./zmqHelpers.js"

const WORKER = "7001"

/** PUB/SUB drops what is sent before the subscription arrives: publish probes until one lands. */
const prime = (publisher: DynamoZmqPublisher, recorder: Recorder) =>
  Effect.gen(function* () {
    const id = yield* publisher.publisherId
    yield* eventually(
      Effect.gen(function* () {
        yield* publisher.store([0xfeedn])
        return recorder.events(id).length > 0
      }),
      `publisher ${id} to reach the subscriber`
    )
    // Drain the probes still in flight before the test counts anything.
    const sent = (yield* publisher.nextEventId) - 1
    yield* eventually(
      Effect.sync(() => recorder.events(id).at(-1)?.eventId === sent),
      "probes to drain"
    )
    // What arrived, not what was sent: PUB/SUB drops the probes sent before the subscription
    // reached the publisher (on a busy machine, the first one or more).
    return recorder.events(id).length
  })

/** Contiguous from the first event that arrived (probes before the subscription are dropped). */
const contiguous = (ids: ReadonlyArray<number>): boolean => ids.length > 0 && isContiguousFrom(ids, ids[0]!)

const request = (overrides: Partial<WorkerKvQueryRequest> = {}): WorkerKvQueryRequest => ({
  workerId: WORKER,
  dpRank: 0,
  startEventId: undefined,
  endEventId: undefined,
  supportsTreeDumpFailed: true,
  ...overrides
})

describe("EventSubscriberPool over ZeroMQ", () => {
  it.scopedLive("live events of several ranks keep FIFO per rank and never block each other", () =>
    Effect.gen(function* () {
      const recorder = makeRecorder()
      const pool = yield* makeEventSubscriberPool({ handler: recorder.handler })
      const publishers = yield* Effect.all(
        [0, 1, 2].map((dpRank) => makeDynamoZmqPublisher({ workerId: WORKER, dpRank }))
      )
      const sources = yield* Effect.all(publishers.map((p) => p.source(KV_ENDPOINT)))
      yield* pool.sync(sources)
      yield* eventually(
        pool.connectedSources.pipe(Effect.map((connected) => connected.length === 3)),
        "all three sources to connect"
      )
      const primed = yield* Effect.all(publishers.map((p) => prime(p, recorder)))
      const ids = yield* Effect.all(publishers.map((p) => p.publisherId))

      // Rank 1's handler stalls; ranks 0 and 2 must keep flowing.
      const gate = yield* Deferred.make<void>()
      recorder.block(ids[1]!, Deferred.await(gate))
      const perRank = 200
      for (let i = 0; i < perRank; i++) {
        for (const publisher of publishers) yield* publisher.store([BigInt(publisher.dpRank * 1_000_000 + i)])
      }
      for (const r of [0, 2]) {
        yield* eventually(
          Effect.sync(() => recorder.eventIds(ids[r]!).length === primed[r]! + perRank),
          `rank ${r} to receive every event while rank 1 is stalled`
        )
      }
      expect(recorder.eventIds(ids[1]!).length).toBeLessThanOrEqual(primed[1]! + 1)
      yield* Deferred.succeed(gate, undefined)
      recorder.unblock(ids[1]!)
      yield* eventually(
        Effect.sync(() => recorder.eventIds(ids[1]!).length === primed[1]! + perRank),
        "rank 1 to catch up after its handler resumes"
      )
      for (let r = 0; r < 3; r++) {
        const received = recorder.events(ids[r]!)
        expect(contiguous(received.map((e) => e.eventId))).toBe(true)
        expect(storedBigInts(received.slice(primed[r]!))).toEqual(
          Array.from({ length: perRank }, (_, i) => BigInt(r * 1_000_000 + i))
        )
        expect(received.every((e) => e.workerId === WORKER && e.dpRank === r)).toBe(true)
      }
      const stats = yield* pool.stats
      expect(stats.sources.map((s) => s.messages).sort()).toEqual(primed.map((p) => p + perRank).sort())
      expect(stats.totals.malformedTotal).toBe(0)
    })
  )

  it.scopedLive("publishers sharing one endpoint get one socket and separate lanes", () =>
    Effect.gen(function* () {
      const recorder = makeRecorder()
      const pool = yield* makeEventSubscriberPool({ handler: recorder.handler })
      const carrier = yield* makeDynamoZmqPublisher({ workerId: WORKER, dpRank: 0 })
      const sourceA = yield* carrier.source(KV_ENDPOINT)
      const sourceB: KvEventSource = { ...sourceA, dpRank: 1, publisherId: sourceA.publisherId + 1n }
      yield* pool.sync([sourceA, sourceB])
      expect((yield* pool.stats).subscriptions).toHaveLength(1)
      yield* eventually(pool.isConnected(sourceB), "the shared socket to connect")
      yield* prime(carrier, recorder)
      const gate = yield* Deferred.make<void>()
      recorder.block(sourceA.publisherId, Deferred.await(gate))
      const send = (publisherId: bigint, dpRank: number, eventId: number) =>
        carrier.sendRaw(
          encodeDynamoMessage({
            topic: "kv-events",
            publisherId,
            sequence: eventId,
            publishedAtMs: 0,
            events: [{ workerId: WORKER, dpRank, eventId, storageTier: "device", data: { _tag: "Cleared" } }]
          })
        )
      for (let i = 1; i <= 50; i++) {
        yield* send(sourceA.publisherId, 0, 1000 + i)
        yield* send(sourceB.publisherId, 1, i)
      }
      yield* eventually(
        Effect.sync(() => recorder.eventIds(sourceB.publisherId).length === 50),
        "publisher B to be handled while A is stalled"
      )
      yield* Deferred.succeed(gate, undefined)
      recorder.unblock(sourceA.publisherId)
      yield* eventually(
        Effect.sync(() => recorder.eventIds(sourceA.publisherId).filter((id) => id > 1000).length === 50),
        "publisher A to resume"
      )
      expect(recorder.eventIds(sourceB.publisherId)).toEqual(Array.from({ length: 50 }, (_, i) => i + 1))
      // An unknown publisher on the socket still reaches the handler (which decides), counted as unrouted.
      yield* send(424242n, 3, 1)
      yield* eventually(
        Effect.sync(() => recorder.eventIds(424242n).length === 1),
        "the unrouted batch"
      )
      expect((yield* pool.stats).subscriptions[0]!.unroutedMessages).toBe(1)

      // Removing one source keeps the socket; removing both closes it.
      yield* pool.sync([sourceB])
      expect((yield* pool.stats).subscriptions).toHaveLength(1)
      yield* pool.sync([])
      const after = yield* pool.stats
      expect(after.subscriptions).toHaveLength(0)
      expect(after.sources).toHaveLength(0)
    })
  )

  it.scopedLive("garbage frames are dropped and counted while good traffic flows", () =>
    Effect.gen(function* () {
      const recorder = makeRecorder()
      const pool = yield* makeEventSubscriberPool({ handler: recorder.handler })
      const publisher = yield* makeDynamoZmqPublisher({ workerId: WORKER, dpRank: 0 })
      const source = yield* publisher.source(KV_ENDPOINT)
      yield* pool.sync([source])
      yield* eventually(pool.isConnected(source), "the source to connect")
      const primed = yield* prime(publisher, recorder)
      const id = source.publisherId
      const good = encodeDynamoMessage({
        topic: "kv-events",
        publisherId: id,
        sequence: 0,
        publishedAtMs: 0,
        events: []
      })
      const garbage: ReadonlyArray<ReadonlyArray<Uint8Array | string>> = [
        ["kv-events", good[1], good[2]],
        ["kv-events", good[1], good[2], good[3], "extra"],
        ["kv-events", Buffer.alloc(3), good[2], good[3]],
        ["kv-events", good[1], Buffer.alloc(4), good[3]],
        ["kv-events", good[1], good[2], Buffer.from([1, 0])],
        ["kv-events", good[1], good[2], Buffer.concat([Buffer.from([9]), good[3].subarray(1)])],
        ["kv-events", good[1], good[2], good[3].subarray(0, 12)],
        ["kv-events", good[1], good[2], frameEnvelope(Uint8Array.of(0xc1))],
        [
          "kv-events",
          good[1],
          good[2],
          frameEnvelope(
            encodeEnvelope({
              topic: "kv-events",
              publisherId: id,
              sequence: 1,
              publishedAtMs: 0,
              payload: Uint8Array.of(0x91, 0xc3)
            })
          )
        ],
        [
          "kv-events",
          ...encodeDynamoMessage({
            topic: "kv-events-x",
            publisherId: id,
            sequence: 0,
            publishedAtMs: 0,
            events: []
          }).slice(1)
        ]
      ]
      const rounds = 5
      for (let round = 0; round < rounds; round++) {
        for (const frames of garbage) {
          yield* publisher.store([BigInt(round)])
          yield* publisher.sendRaw(frames)
        }
      }
      const expectedEvents = primed + rounds * garbage.length
      yield* eventually(
        Effect.sync(() => recorder.eventIds(id).length === expectedEvents),
        "every good event to arrive between the garbage"
      )
      const ids = recorder.eventIds(id)
      expect(contiguous(ids)).toBe(true)
      const stats = yield* eventually(
        pool.stats.pipe(Effect.map((s) => s.totals.malformedTotal === rounds * garbage.length && s)),
        "every malformed message to be counted"
      )
      expect(stats.totals.malformed).toEqual({
        ...Object.fromEntries(MALFORMED_REASONS.map((reason) => [reason, 0])),
        "frame-count": 2 * rounds,
        "publisher-id-width": rounds,
        "sequence-width": rounds,
        "sequence-range": 0,
        "frame-header": rounds,
        "frame-version": rounds,
        "frame-length": rounds,
        envelope: rounds,
        payload: rounds,
        topic: rounds
      })
      // What carried a readable publisher id is charged to the source; the rest to the socket.
      expect(stats.sources[0]!.malformedTotal).toBe(7 * rounds)
      expect(stats.subscriptions[0]!.unattributedMalformed["frame-count"]).toBe(2 * rounds)
      expect(stats.sources[0]!.messages).toBe(expectedEvents)
    })
  )

  it.scopedLive("engine sources: vLLM and SGLang batches arrive with ids seq + 1, garbage counted", () =>
    Effect.gen(function* () {
      const recorder = makeRecorder()
      const pool = yield* makeEventSubscriberPool({ handler: recorder.handler })
      const vllm = yield* makeEngineZmqPublisher({ workerId: WORKER, dpRank: 0, format: "vllm" })
      const sglang = yield* makeEngineZmqPublisher({
        workerId: WORKER,
        dpRank: 1,
        format: "sglang",
        topic: "kv"
      })
      const sources = [yield* vllm.source(KV_ENDPOINT), yield* sglang.source(KV_ENDPOINT)]
      yield* pool.sync(sources)
      yield* eventually(
        pool.connectedSources.pipe(Effect.map((c) => c.length === 2)),
        "engine sources to connect"
      )
      for (const [engine, source] of [
        [vllm, sources[0]!],
        [sglang, sources[1]!]
      ] as const) {
        yield* eventually(
          Effect.gen(function* () {
            yield* engine.store([1n])
            return recorder.events(source.publisherId).length > 0
          }),
          "the engine to reach the subscriber"
        )
        const sent = yield* engine.nextSeq
        yield* eventually(
          Effect.sync(() => recorder.events(source.publisherId).at(-1)?.eventId === sent),
          "engine probes to drain"
        )
      }
      const base = [
        recorder.events(sources[0]!.publisherId).length,
        recorder.events(sources[1]!.publisherId).length
      ]
      for (let i = 0; i < 20; i++) {
        yield* vllm.store([2n ** 64n - BigInt(i) - 1n, BigInt(i)], {
          storageTier: i % 2 === 0 ? "device" : "host_pinned"
        })
        yield* sglang.store([2n ** 63n + BigInt(i)])
        yield* sglang.sendRaw(["kv", u64FrameOf(1)])
        yield* vllm.sendRaw(["", Buffer.alloc(3), Buffer.alloc(1)])
      }
      yield* eventually(
        Effect.sync(
          () =>
            recorder.events(sources[0]!.publisherId).length === base[0]! + 20 &&
            recorder.events(sources[1]!.publisherId).length === base[1]! + 20
        ),
        "every engine batch"
      )
      const vllmEvents = recorder.events(sources[0]!.publisherId)
      expect(contiguous(vllmEvents.map((e) => e.eventId))).toBe(true)
      // Host-tier events are kept on their tier (PROTOCOL §5.1 ◆3).
      expect(vllmEvents.slice(base[0]!).map((e) => [e.storageTier, e.data._tag])).toEqual(
        Array.from({ length: 20 }, (_, i) => [i % 2 === 0 ? "device" : "host_pinned", "Stored"])
      )
      expect(storedBigInts(vllmEvents.slice(-2))).toEqual([2n ** 64n - 19n, 18n, 2n ** 64n - 20n, 19n])
      const sglangEvents = recorder.events(sources[1]!.publisherId)
      expect(sglangEvents.every((e) => e.dpRank === 1)).toBe(true)
      expect(storedBigInts(sglangEvents.slice(-1))).toEqual([2n ** 63n + 19n])
      const stats = yield* eventually(
        pool.stats.pipe(Effect.map((s) => s.totals.malformedTotal === 40 && s)),
        "engine garbage to be counted"
      )
      expect(stats.totals.malformed["frame-count"]).toBe(20)
      expect(stats.totals.malformed["sequence-width"]).toBe(20)
      expect(stats.sources.find((s) => s.source.publisherId === sources[0]!.publisherId)!.skipped).toEqual({
        medium: 0,
        locality: 0,
        ownership: 0,
        group: 0,
        namespace: 0
      })
      expect(stats.lifetime.skipped.medium).toBe(0)
    })
  )

  it.scopedLive("a restarted publisher with a new id is routed once its new source is synced", () =>
    Effect.gen(function* () {
      const recorder = makeRecorder()
      const pool = yield* makeEventSubscriberPool({ handler: recorder.handler })
      const publisher = yield* makeDynamoZmqPublisher({ workerId: WORKER, dpRank: 0 })
      const first = yield* publisher.source(KV_ENDPOINT)
      yield* pool.sync([first])
      yield* eventually(pool.isConnected(first), "the first incarnation to connect")
      yield* prime(publisher, recorder)
      const newId = yield* publisher.restart()
      const second = yield* publisher.source(KV_ENDPOINT)
      yield* pool.sync([second])
      yield* eventually(
        Effect.gen(function* () {
          yield* publisher.store([5n])
          return recorder.events(newId).length > 0
        }),
        "the new incarnation's events"
      )
      const stats = yield* pool.stats
      expect(stats.sources.map((s) => s.source.publisherId)).toEqual([newId])
      expect(recorder.events(newId)[0]!.eventId).toBe(1)
    })
  )
})

describe("worker query client against the worker query server", () => {
  it.scopedLive("answers Events, TreeDump, TooNew, InvalidRange, TreeDumpFailed and mismatch errors", () =>
    Effect.gen(function* () {
      const server = yield* makeWorkerQueryServer({ workerId: WORKER, dpRanks: [0, 1] })
      const publisher = yield* makeDynamoZmqPublisher({ workerId: WORKER, dpRank: 0, queryServer: server })
      const source = yield* publisher.source(KV_ENDPOINT)
      expect(source.recoveryTarget).toEqual({ endpoint: server.endpoint })
      const client = makeWorkerQueryClient()
      const query = (overrides: Partial<WorkerKvQueryRequest>) =>
        client.queryWorker(source, request(overrides))

      for (let i = 1; i <= 10; i++) yield* publisher.store([BigInt(i), BigInt(100 + i)])
      yield* publisher.remove([3n, 103n])

      const events = yield* query({ startEventId: 5 })
      expect(events._tag).toBe("Events")
      if (events._tag === "Events") {
        expect(events.events.map((e) => e.eventId)).toEqual([5, 6, 7, 8, 9, 10, 11])
        expect(events.lastEventId).toBe(11)
      }
      const dump = yield* query({})
      expect(dump._tag).toBe("TreeDump")
      if (dump._tag === "TreeDump") {
        expect(dump.lastEventId).toBe(11)
        expect(dump.events.map((e) => e.eventId)).toEqual(dump.events.map((_, i) => i))
        expect(storedBigInts(dump.events).sort((a, b) => Number(a - b))).toEqual(
          [1n, 2n, 4n, 5n, 6n, 7n, 8n, 9n, 10n, 101n, 102n, 104n, 105n, 106n, 107n, 108n, 109n, 110n].sort(
            (a, b) => Number(a - b)
          )
        )
        expect(dump.events.every((e) => e.storageTier === "device" && e.dpRank === 0)).toBe(true)
      }
      expect(yield* query({ startEventId: 50 })).toEqual({
        _tag: "TooNew",
        requestedStart: 50,
        requestedEnd: 11,
        newestAvailable: 11
      })
      expect(yield* query({ startEventId: 5, endEventId: 3 })).toEqual({
        _tag: "InvalidRange",
        startId: 5,
        endId: 3
      })

      yield* server.setTreeDumpFailure("tier exploded")
      expect(yield* query({})).toEqual({ _tag: "TreeDumpFailed", lastEventId: 11, message: "tier exploded" })
      expect(yield* query({ supportsTreeDumpFailed: false })).toEqual({
        _tag: "Error",
        message: "worker tree dump failed: tier exploded"
      })
      yield* server.setTreeDumpFailure(undefined)

      const foreignWorker = yield* query({ workerId: "9999" })
      expect(foreignWorker._tag === "Error" && foreignWorker.message).toMatch(/mismatch/)
      const foreignRank = yield* query({ dpRank: 7 })
      expect(foreignRank._tag === "Error" && foreignRank.message).toMatch(/rank 7/)
      // Rank 1 is served but has published nothing: an empty dump with watermark 0.
      expect(yield* query({ dpRank: 1 })).toEqual({ _tag: "TreeDump", events: [], lastEventId: 0 })

      // A clear inside the span: the reply starts at the latest clear.
      yield* publisher.store([7777n])
      yield* publisher.clear
      yield* publisher.store([8888n])
      const afterClear = yield* query({ startEventId: 2 })
      expect(afterClear._tag === "Events" && afterClear.events.map((e) => e.data._tag)).toEqual([
        "Cleared",
        "Stored"
      ])
      const dumpAfterClear = yield* query({})
      expect(dumpAfterClear._tag === "TreeDump" && storedBigInts(dumpAfterClear.events)).toEqual([8888n])
    })
  )

  it.scopedLive(
    "a start older than the ring is answered with a tree dump; dumps are cached and single-flight",
    () =>
      Effect.gen(function* () {
        const server = yield* makeWorkerQueryServer({ workerId: WORKER, dpRanks: [0], bufferSize: 8 })
        const publisher = yield* makeDynamoZmqPublisher({ workerId: WORKER, dpRank: 0, queryServer: server })
        const source = yield* publisher.source(KV_ENDPOINT)
        const client = makeWorkerQueryClient()
        for (let i = 1; i <= 20; i++) yield* publisher.store([BigInt(i)])
        const old = yield* client.queryWorker(source, request({ startEventId: 3 }))
        expect(old._tag === "TreeDump" && old.lastEventId).toBe(20)
        expect(old._tag === "TreeDump" && storedBigInts(old.events).length).toBe(20)

        yield* publisher.store([21n])
        const extended = yield* client.queryWorker(source, request())
        expect(extended._tag === "TreeDump" && extended.lastEventId).toBe(21)
        expect((yield* server.stats).dumpExtensions).toBe(1)

        yield* publisher.clear
        yield* server.setDumpDelay("150 millis")
        const [a, b] = yield* Effect.all(
          [client.queryWorker(source, request()), client.queryWorker(source, request())],
          {
            concurrency: 2
          }
        )
        expect(a).toEqual(b)
        const stats = yield* server.stats
        expect(stats.dumpsBuilt).toBe(2)
        expect(stats.dumpCacheHits).toBeGreaterThanOrEqual(1)
      })
  )

  it.scopedLive("an interrupted query leaves no stale reply for the next one", () =>
    Effect.gen(function* () {
      const server = yield* makeWorkerQueryServer({ workerId: WORKER, dpRanks: [0] })
      const publisher = yield* makeDynamoZmqPublisher({ workerId: WORKER, dpRank: 0, queryServer: server })
      const source = yield* publisher.source(KV_ENDPOINT)
      const client = makeWorkerQueryClient()
      for (let i = 1; i <= 5; i++) yield* publisher.store([BigInt(i)])
      yield* server.setDumpDelay("300 millis")
      const timedOut = yield* client
        .queryWorker(source, request())
        .pipe(Effect.timeout("50 millis"), Effect.either)
      expect(Either.isLeft(timedOut)).toBe(true)
      // The late TreeDump goes to a closed socket; this query must get its own Events.
      const events = yield* client.queryWorker(source, request({ startEventId: 4 }))
      expect(events._tag === "Events" && events.events.map((e) => e.eventId)).toEqual([4, 5])

      yield* server.setUnresponsive(true)
      const silent = yield* client
        .queryWorker(source, request({ startEventId: 1 }))
        .pipe(Effect.timeout("100 millis"), Effect.either)
      expect(Either.isLeft(silent)).toBe(true)
      yield* server.setUnresponsive(false)
      const again = yield* client.queryWorker(source, request({ startEventId: 5 }))
      expect(again._tag === "Events" && again.events.map((e) => e.eventId)).toEqual([5])
      expect((yield* server.stats).unanswered).toBe(1)

      // An unreachable target only ever times out; the socket goes with the interrupted query.
      const nowhere: KvEventSource = { ...source, recoveryTarget: { endpoint: "tcp://127.0.0.1:1" } }
      const unreachable = yield* client
        .queryWorker(nowhere, request())
        .pipe(Effect.timeout("50 millis"), Effect.either)
      expect(Either.isLeft(unreachable)).toBe(true)
      const bad: KvEventSource = { ...source, recoveryTarget: { endpoint: "not-an-endpoint" } }
      const badResult = yield* client.queryWorker(bad, request()).pipe(Effect.either)
      expect(Either.isLeft(badResult) && badResult.left.message).toMatch(/not-an-endpoint/)
      const liveOnly: KvEventSource = { ...source, recoveryTarget: null }
      const none = yield* client.queryWorker(liveOnly, request()).pipe(Effect.either)
      expect(Either.isLeft(none) && none.left.message).toMatch(
        /neither a recovery target nor a replay endpoint/
      )
    })
  )
})

/** The device blocks a rank holds after `events` in order (a Cleared empties it). */
const heldAfter = (events: ReadonlyArray<RouterEvent>): Set<bigint> => {
  const held = new Set<bigint>()
  for (const event of events) {
    const data = event.data
    if (data._tag === "Cleared") held.clear()
    else if (data._tag === "Stored") for (const h of hashPairsToBigInts(data.blockHashes)) held.add(h)
    else for (const h of hashPairsToBigInts(data.blockHashes)) held.delete(h)
  }
  return held
}

describe("engine replay path", () => {
  it.scopedLive(
    "full history is answered as a tree dump of the replayed events; an incremental range with events",
    () =>
      Effect.gen(function* () {
        for (const format of ["vllm", "sglang"] as const) {
          const engine = yield* makeEngineZmqPublisher({ workerId: WORKER, dpRank: 2, format })
          const source = yield* engine.source(KV_ENDPOINT)
          const client = makeWorkerQueryClient()
          yield* engine.store([1n, 2n, 3n])
          yield* engine.store([4n], { parentHash: 3n })
          yield* engine.remove([2n])
          yield* engine.store([9n], { storageTier: "host_pinned" })
          yield* engine.store([2n ** 64n - 5n])
          const full = yield* client.queryWorker(source, request({ dpRank: 2 }))
          expect(full._tag).toBe("TreeDump")
          if (full._tag === "TreeDump") {
            expect(full.lastEventId).toBe(5)
            expect(full.historyPartial).toBeUndefined()
            // The replayed events in order, ids seq + 1: the rank is replaced by replaying them.
            expect(full.events.map((e) => e.eventId)).toEqual([1, 2, 3, 4, 5])
            // The host-tier store is kept, on its tier (PROTOCOL §5.1 ◆3): a replacement keeps it too.
            expect(full.events.map((e) => [e.storageTier, e.data._tag])).toEqual([
              ["device", "Stored"],
              ["device", "Stored"],
              ["device", "Removed"],
              ["host_pinned", "Stored"],
              ["device", "Stored"]
            ])
            expect(full.events.every((e) => e.dpRank === 2 && e.workerId === WORKER)).toBe(true)
            expect([...heldAfter(full.events.filter((e) => e.storageTier === "device"))].sort()).toEqual(
              [1n, 3n, 4n, 2n ** 64n - 5n].sort()
            )
            // Block 4 keeps its parent, so the rank can chain it.
            const second = full.events[1]!.data
            expect(second._tag === "Stored" && hashPairsToBigInts(second.parentHash!)).toEqual([3n])
          }
          const range = yield* client.queryWorker(source, request({ dpRank: 2, startEventId: 3 }))
          expect(range._tag).toBe("Events")
          if (range._tag === "Events") {
            expect(range.events.map((e) => e.eventId)).toEqual([3, 4, 5])
            // Event 4 was a host-tier store, kept on its tier.
            expect(range.events.map((e) => [e.storageTier, e.data._tag])).toEqual([
              ["device", "Removed"],
              ["host_pinned", "Stored"],
              ["device", "Stored"]
            ])
            expect(range.lastEventId).toBe(5)
            expect(range.historyPartial).toBeUndefined()
          }
          expect(yield* client.queryWorker(source, request({ dpRank: 2, startEventId: 6 }))).toEqual({
            _tag: "TooNew",
            requestedStart: 6,
            requestedEnd: undefined,
            newestAvailable: 0
          })
          expect(
            yield* client.queryWorker(source, request({ dpRank: 2, startEventId: 4, endEventId: 2 }))
          ).toEqual({
            _tag: "InvalidRange",
            startId: 4,
            endId: 2
          })
          expect((yield* engine.stats).replays).toBe(3)
        }
      })
  )

  it.scopedLive(
    "a buffer that no longer reaches back answers what it holds, flagged partial; a clear in it makes a dump complete",
    () =>
      Effect.gen(function* () {
        const engine = yield* makeEngineZmqPublisher({ workerId: WORKER, dpRank: 0, format: "vllm" })
        const source = yield* engine.source(KV_ENDPOINT)
        const client = makeWorkerQueryClient()
        expect(yield* client.queryWorker(source, request())).toEqual({
          _tag: "TreeDump",
          events: [],
          lastEventId: 0
        })
        for (let i = 0; i < 6; i++) yield* engine.store([BigInt(i)])
        yield* engine.forgetBefore(2)
        const dump = yield* client.queryWorker(source, request())
        expect(dump._tag === "TreeDump" && dump.historyPartial).toBe(true)
        expect(dump._tag === "TreeDump" && dump.events.map((e) => e.eventId)).toEqual([3, 4, 5, 6])
        expect(dump._tag === "TreeDump" && dump.lastEventId).toBe(6)
        const gap = yield* client.queryWorker(source, request({ startEventId: 2 }))
        expect(gap._tag === "Events" && gap.historyPartial).toBe(true)
        expect(gap._tag === "Events" && gap.events.map((e) => e.eventId)).toEqual([3, 4, 5, 6])
        const covered = yield* client.queryWorker(source, request({ startEventId: 3 }))
        expect(covered._tag === "Events" && covered.events.map((e) => e.eventId)).toEqual([3, 4, 5, 6])
        expect(covered._tag === "Events" && covered.historyPartial).toBeUndefined()
        // A clear after the forgotten batches: everything the rank holds is known again.
        yield* engine.clear
        yield* engine.store([7n])
        const afterClear = yield* client.queryWorker(source, request())
        expect(afterClear._tag === "TreeDump" && afterClear.historyPartial).toBeUndefined()
        expect(afterClear._tag === "TreeDump" && afterClear.events.map((e) => e.eventId)).toEqual([8])
        expect(afterClear._tag === "TreeDump" && storedBigInts(afterClear.events)).toEqual([7n])
      })
  )

  it.scopedLive("a replay endpoint that never answers is interrupted cleanly by the caller's timeout", () =>
    Effect.gen(function* () {
      const engine = yield* makeEngineZmqPublisher({ workerId: WORKER, dpRank: 0, format: "vllm" })
      const source = yield* engine.source(KV_ENDPOINT)
      const dead: KvEventSource = {
        ...source,
        transport: {
          kind: "engine-zmq",
          endpoint: source.transport.endpoint,
          topic: "",
          replayEndpoint: "tcp://127.0.0.1:1"
        }
      }
      const client = makeWorkerQueryClient()
      const fiber = yield* client
        .queryWorker(dead, request())
        .pipe(Effect.timeout("80 millis"), Effect.either, Effect.fork)
      const result = yield* Fiber.join(fiber)
      expect(Either.isLeft(result)).toBe(true)
      yield* engine.store([1n])
      const live = yield* client.queryWorker(source, request())
      expect(live._tag === "TreeDump" && storedBigInts(live.events)).toEqual([1n])
    })
  )
})
