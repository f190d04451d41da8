/**
 * Recovery end to end over real ZeroMQ: simulated Dynamo workers and engines publish on the real
 * wire formats, `EventSubscriberPool` feeds the real `SourceSupervisor`, whose recovery queries go
 * through `WorkerQueryClient` to a `WorkerQueryServer` (or an engine's replay ROUTER, or a
 * scripted peer), and a recording `RecoveryTarget` keeps each rank's device-tier block set.
 * The seed-003 multi-node test runs the seed's pipeline instead: discovery records, the KV source
 * coordinator and the `SourceSubscriber` in front of the supervisor.
 */

import { it } from "@effect/vitest"
import { Deferred, Duration, Effect, FiberSet, SubscriptionRef, TestClock } from "effect"
import { describe, expect } from "vitest"
import * as zmq from "zeromq"
import { hashPairsToBigInts } from "../../src/ckf/u64.js"
import { Discovery, type DiscoverySnapshot, makeStaticDiscovery } from "../../src/discovery/Discovery.js"
import { WATCH_ALL } from "../../src/discovery/DiscoveryConfig.js"
import { makeKvSourceCoordinator } from "../../src/discovery/KvSourceCoordinator.js"
import { projectMembership } from "../../src/discovery/MembershipProjection.js"
import type { ModelCardInstance } from "../../src/protocol/Discovery.js"
import {
  type ExpectedRank,
  isRecoverableSource,
  type KvEventSource,
  type KvSourceMembershipView,
  type KvSourceStatus,
  type RankKey,
  rankKey
} from "../../src/protocol/Discovery.js"
import {
  clearedEvent,
  type DpRank,
  type RouterEvent,
  storedEvent,
  type WorkerId
} from "../../src/protocol/Events.js"
import { EndpointId } from "../../src/protocol/Model.js"
import {
  internalsOf,
  type SourceSlotSnapshot
} from "../../src/recovery/internal/SourceSupervisorInternals.js"
import type { RecoveryResetReason, RecoveryTarget, SourceEpoch } from "../../src/recovery/RecoveryTarget.js"
import * as SourceSupervisor from "../../src/recovery/SourceSupervisor.js"
import * as SourceSupervisorLive from "../../src/recovery/SourceSupervisorLive.js"
import type { WorkerKvQueryResponse } from "../../src/recovery/WorkerQuery.js"
import * as SourceSubscriber from "../../src/relay/SourceSubscriber.js"
import { type DynamoZmqPublisher, makeDynamoZmqPublisher } from "../../src/simulate/DynamoZmqPublisher.js"
import { type EngineZmqPublisher, makeEngineZmqPublisher } from "../../src/simulate/EngineZmqPublisher.js"
import { makeWorkerQueryServer } from "../../src/simulate/WorkerQueryServer.js"
import { encodeDynamoMessage } from "../../src/transport/DynamoZmq.js"
import { type EventSubscriberPool, makeEventSubscriberPool } from "../../src/transport/EventSubscriberPool.js"
import { decodeWorkerQueryRequest, encodeWorkerQueryResponse } from "../../src/transport/msgpack.js"
import { makeWorkerQueryClient } from "../../src/transport/WorkerQueryClient.js"
import { makeZmqEventTransport } from "../../src/transport/ZmqEventTransport.js"
import { acquireSocket, bindSocket, receiveFrames, sendFrames } from "../../src/transport/ZmqSocket.js"
import { card } from "../discovery/fixtures.js"
import { eventually, KV_ENDPOINT } from "./zmqHelpers.js"

const SERVING = new EndpointId({ namespace: "test", component: "backend", endpoint: "generate" })

// ---------------------------------------------------------------------------------------------
// A recording target: each rank's device-tier blocks, and the order of the commands it received

type TargetOp =
  | { readonly op: "admit"; readonly key: RankKey; readonly eventId: number; readonly kind: string }
  | { readonly op: "replace"; readonly key: RankKey; readonly events: number }
  | { readonly op: "reset"; readonly key: RankKey; readonly reason: RecoveryResetReason }
  | { readonly op: "initial"; readonly key: RankKey }

class RecordingTarget implements RecoveryTarget {
  readonly blocks = new Map<RankKey, Set<bigint>>()
  readonly log: Array<TargetOp> = []

  private rank(key: RankKey): Set<bigint> {
    let set = this.blocks.get(key)
    if (set === undefined) {
      set = new Set()
      this.blocks.set(key, set)
    }
    return set
  }

  private apply(event: RouterEvent): void {
    const set = this.rank(rankKey(event.workerId, event.dpRank))
    const data = event.data
    if (data._tag === "Cleared") set.clear()
    else if (event.storageTier === "device") {
      for (const hash of hashPairsToBigInts(data.blockHashes)) {
        if (data._tag === "Stored") set.add(hash)
        else set.delete(hash)
      }
    }
  }

  readonly admitEvent = (_epoch: SourceEpoch, event: RouterEvent) =>
    Effect.sync(() => {
      this.log.push({
        op: "admit",
        key: rankKey(event.workerId, event.dpRank),
        eventId: event.eventId,
        kind: event.data._tag
      })
      this.apply(event)
    })

  readonly replaceRank = (
    _epoch: SourceEpoch,
    workerId: WorkerId,
    dpRank: DpRank,
    events: ReadonlyArray<RouterEvent>
  ) =>
    Effect.sync(() => {
      const key = rankKey(workerId, dpRank)
      this.log.push({ op: "replace", key, events: events.length })
      this.rank(key).clear()
      for (const event of events) this.apply(event)
    })

  readonly completeInitialRecovery = (workerId: WorkerId, dpRank: DpRank) =>
    Effect.sync(() => {
      this.log.push({ op: "initial", key: rankKey(workerId, dpRank) })
    })

  readonly resetRank = (
    _epoch: SourceEpoch,
    workerId: WorkerId,
    dpRank: DpRank,
    reason: RecoveryResetReason
  ) =>
    Effect.sync(() => {
      const key = rankKey(workerId, dpRank)
      this.log.push({ op: "reset", key, reason })
      this.rank(key).clear()
    })

  has(workerId: WorkerId, dpRank: DpRank, block: bigint): boolean {
    return this.blocks.get(rankKey(workerId, dpRank))?.has(block) ?? false
  }
  ranksWithBlocks(): Array<number> {
    return [...this.blocks.entries()]
      .filter(([, set]) => set.size > 0)
      .map(([key]) => Number(key.split("/")[1]))
      .sort((a, b) => a - b)
  }
  sorted(workerId: WorkerId, dpRank: DpRank): Array<bigint> {
    return [...(this.blocks.get(rankKey(workerId, dpRank)) ?? [])].sort((a, b) =>
      a < b ? -1 : a > b ? 1 : 0
    )
  }
}

// ---------------------------------------------------------------------------------------------
// Membership as the discovery coordinator projects it (relay-service.md §2.7): one status per
// expected rank, with a cumulative lifecycle generation bumped on every reset-requiring change.

class MembershipModel {
  private readonly last = new Map<RankKey, { fingerprint: string; everActive: boolean; generation: number }>()

  view(
    expected: ReadonlyArray<{ workerId: WorkerId; dpRank: DpRank }>,
    ads: ReadonlyArray<KvEventSource>
  ): KvSourceMembershipView {
    const ranks = new Map<RankKey, ExpectedRank>()
    for (const { workerId, dpRank } of expected) {
      const key = rankKey(workerId, dpRank)
      const mine = ads.filter((s) => s.workerId === workerId && s.dpRank === dpRank)
      const status: KvSourceStatus =
        mine.length === 0
          ? { _tag: "Missing" }
          : mine.length > 1
            ? {
                _tag: "Ambiguous",
                reason: { _tag: "Incarnations", publisherIds: mine.map((s) => s.publisherId).sort() }
              }
            : isRecoverableSource(mine[0]!)
              ? { _tag: "ActiveRecoverable", source: mine[0]! }
              : { _tag: "ActiveLiveOnly", source: mine[0]! }
      const fingerprint =
        status._tag === "Missing"
          ? "missing"
          : status._tag === "Ambiguous"
            ? `ambiguous:${mine.map((s) => s.publisherId).sort()}`
            : `active:${status.source.publisherId}`
      const previous = this.last.get(key)
      let generation = previous?.generation ?? 0
      const active = status._tag === "ActiveRecoverable" || status._tag === "ActiveLiveOnly"
      if (previous !== undefined && previous.fingerprint !== fingerprint) {
        const firstActivation = previous.fingerprint === "missing" && active && !previous.everActive
        if (!firstActivation) generation++
      }
      this.last.set(key, { fingerprint, everActive: (previous?.everActive ?? false) || active, generation })
      ranks.set(key, { workerId, dpRank, status, lifecycleGeneration: generation, recoveryExpected: true })
    }
    return {
      servingEndpoint: SERVING,
      endpointResolution: { _tag: "Resolved", endpoint: KV_ENDPOINT },
      ranks
    }
  }
}

interface Harness {
  readonly target: RecordingTarget
  readonly supervisor: SourceSupervisor.SourceSupervisor
  readonly pool: EventSubscriberPool
  /** Publishes a membership view built from these advertisements and syncs as the subscriber does. */
  readonly advertise: (ads: ReadonlyArray<KvEventSource>) => Effect.Effect<void>
  readonly slot: (workerId: WorkerId, dpRank: DpRank) => SourceSlotSnapshot | undefined
}

const makeHarness = (options: {
  readonly expected: ReadonlyArray<{ workerId: WorkerId; dpRank: DpRank }>
  readonly recoveryAttemptTimeout?: Duration.DurationInput
  readonly recoveryPermits?: number
}) =>
  Effect.gen(function* () {
    const target = new RecordingTarget()
    const model = new MembershipModel()
    const membership = yield* SubscriptionRef.make(model.view(options.expected, []))
    const supervisor = yield* SourceSupervisorLive.make({
      target,
      transport: makeWorkerQueryClient(),
      membership: SubscriptionRef.get(membership),
      ...(options.recoveryAttemptTimeout === undefined
        ? {}
        : { recoveryAttemptTimeout: options.recoveryAttemptTimeout }),
      ...(options.recoveryPermits === undefined
        ? {}
        : { recoverySemaphore: yield* Effect.makeSemaphore(options.recoveryPermits) })
    })
    // Created after the supervisor, so it closes first: no batch reaches a shut-down supervisor.
    const pool = yield* makeEventSubscriberPool({ handler: supervisor.handleLiveBatch })
    const advertise = (ads: ReadonlyArray<KvEventSource>) =>
      Effect.gen(function* () {
        const view = model.view(options.expected, ads)
        yield* SubscriptionRef.set(membership, view)
        // Subscribe first (subscriber.rs): live events are already arriving when restores start.
        yield* pool.sync(ads)
        const connected = yield* eventually(
          pool.connectedSources.pipe(Effect.map((c) => c.length === ads.length && c)),
          "every advertised source to connect"
        )
        const ready = new Set(
          connected.map((source) =>
            SourceSupervisor.readySourceKey(
              source.publisherId,
              view.ranks.get(rankKey(source.workerId, source.dpRank))!.lifecycleGeneration
            )
          )
        )
        yield* supervisor.syncMembershipWithReadySources(ready)
      })
    return {
      target,
      supervisor,
      pool,
      advertise,
      slot: (workerId, dpRank) => internalsOf(supervisor).slot(workerId, dpRank)
    } satisfies Harness
  })

/** PUB/SUB drops what precedes the subscription: probe until the pool has seen this source. */
const primeDynamo = (pool: EventSubscriberPool, publisher: DynamoZmqPublisher, source: KvEventSource) =>
  Effect.gen(function* () {
    yield* pool.sync([source])
    yield* eventually(
      Effect.gen(function* () {
        yield* publisher.store([0xfeed_0000n + BigInt(yield* publisher.nextEventId)])
        const stats = yield* pool.stats
        return stats.sources.some((s) => s.source.publisherId === source.publisherId && s.messages > 0)
      }),
      "the publisher to reach the subscriber"
    )
  })

const primeEngine = (pool: EventSubscriberPool, engine: EngineZmqPublisher, source: KvEventSource) =>
  Effect.gen(function* () {
    yield* pool.sync([source])
    yield* eventually(
      Effect.gen(function* () {
        yield* engine.store([0xfeed_0000n + BigInt(yield* engine.nextSeq)])
        const stats = yield* pool.stats
        return stats.sources.some((s) => s.source.publisherId === source.publisherId && s.messages > 0)
      }),
      "the engine to reach the subscriber"
    )
  })

const WORKER = "7001"

/** The rank admitted everything its publisher sent so far and has no recovery in flight. */
const caughtUp = (
  h: Harness,
  dpRank: DpRank,
  lastId: Effect.Effect<number>,
  what: string,
  timeoutMs?: number
) =>
  eventually(
    Effect.gen(function* () {
      const last = yield* lastId
      const slot = h.slot(WORKER, dpRank)
      return slot !== undefined && !slot.recoveryInflight && slot.lastAdmittedId === last
    }),
    what,
    timeoutMs
  )

describe("recovery over ZeroMQ with the source supervisor", () => {
  it.scopedLive("a dropped message is recovered through the tree dump and the events paths", () =>
    Effect.gen(function* () {
      const h = yield* makeHarness({ expected: [{ workerId: WORKER, dpRank: 0 }] })
      const server = yield* makeWorkerQueryServer({ workerId: WORKER, dpRanks: [0] })
      const publisher = yield* makeDynamoZmqPublisher({ workerId: WORKER, dpRank: 0, queryServer: server })
      const source = yield* publisher.source(KV_ENDPOINT)
      yield* primeDynamo(h.pool, publisher, source)
      yield* h.advertise([source])
      const lastSent = publisher.nextEventId.pipe(Effect.map((next) => next - 1))
      yield* caughtUp(h, 0, lastSent, "the initial restore")
      const stored: Array<bigint> = h.target.sorted(WORKER, 0)
      for (let i = 1; i <= 5; i++) {
        yield* publisher.store([1000n + BigInt(i)])
        stored.push(1000n + BigInt(i))
      }
      yield* caughtUp(h, 0, lastSent, "live events")

      // A message lost on the wire: the gap resets the rank and restores it from a tree dump. The
      // dump is slow, and meanwhile one more message is lost: the drain finds that hole and asks
      // for the missing range, answered from the ring (Events).
      yield* server.setDumpDelay("300 millis")
      const before = (yield* server.stats).requests
      yield* publisher.dropNext(1)
      yield* publisher.store([2001n])
      yield* publisher.store([2002n])
      yield* eventually(server.stats.pipe(Effect.map((s) => s.requests > before)), "the tree dump request")
      yield* publisher.store([2003n])
      yield* publisher.dropNext(1)
      yield* publisher.store([2004n])
      yield* publisher.store([2005n])
      stored.push(2001n, 2002n, 2003n, 2004n, 2005n)
      yield* caughtUp(h, 0, lastSent, "the gap to be recovered")
      expect(h.target.sorted(WORKER, 0)).toEqual(stored.sort((a, b) => (a < b ? -1 : 1)))
      const stats = yield* server.stats
      expect(stats.responses.TreeDump).toBeGreaterThanOrEqual(2)
      expect(stats.responses.Events).toBeGreaterThanOrEqual(1)
      const resets = h.target.log.filter((op) => op.op === "reset")
      expect(resets.length).toBeGreaterThanOrEqual(1)
    })
  )

  it.scopedLive("a worker restarted with a new publisher id is reset before its new events apply", () =>
    Effect.gen(function* () {
      const h = yield* makeHarness({ expected: [{ workerId: WORKER, dpRank: 0 }] })
      const server = yield* makeWorkerQueryServer({ workerId: WORKER, dpRanks: [0] })
      const publisher = yield* makeDynamoZmqPublisher({ workerId: WORKER, dpRank: 0, queryServer: server })
      const first = yield* publisher.source(KV_ENDPOINT)
      yield* primeDynamo(h.pool, publisher, first)
      yield* h.advertise([first])
      const lastSent = publisher.nextEventId.pipe(Effect.map((next) => next - 1))
      yield* publisher.store([1n])
      yield* publisher.store([2n])
      yield* caughtUp(h, 0, lastSent, "the first incarnation")
      expect(h.target.has(WORKER, 0, 1n) && h.target.has(WORKER, 0, 2n)).toBe(true)

      const oldId = first.publisherId
      const newId = yield* publisher.restart()
      const second = yield* publisher.source(KV_ENDPOINT)
      const logBefore = h.target.log.length
      yield* h.advertise([second])
      yield* eventually(
        Effect.sync(() => h.slot(WORKER, 0)?.active?.source.publisherId === newId),
        "the new incarnation to be bound"
      )
      // A late message of the old incarnation is dropped; the new one's events apply from id 1.
      yield* publisher.sendRaw(
        encodeDynamoMessage({
          topic: "kv-events",
          publisherId: oldId,
          sequence: 99,
          publishedAtMs: 0,
          events: [storedEvent(WORKER, 0, 3, [999n])]
        })
      )
      yield* publisher.store([3n])
      yield* publisher.store([4n])
      yield* caughtUp(h, 0, lastSent, "the new incarnation")
      yield* publisher.store([5n])
      yield* caughtUp(h, 0, lastSent, "a live event of the new incarnation")
      expect(h.target.sorted(WORKER, 0)).toEqual([3n, 4n, 5n])
      // The reset comes first; the new incarnation's state (its restore, then live events) after it.
      const after = h.target.log.slice(logBefore)
      expect(after[0]).toMatchObject({ op: "reset", reason: "Lifecycle" })
      expect(after.findIndex((op) => op.op === "replace" || op.op === "admit")).toBeGreaterThan(0)
      expect(after.at(-1)).toMatchObject({ op: "admit", eventId: 3 })
    })
  )

  it.scoped(
    "a target that never answers times out, retries, releases its permit and ends degraded while other ranks recover",
    () =>
      Effect.gen(function* () {
        // The relay's timers run on the TestClock, moved only when the test has seen what the
        // next step waits for: rank 0's attempt k is on the wire (the silent target counted its
        // request k), then exactly its timeout passes; then exactly its backoff. Socket latency
        // decides nothing, since no timer can fire while a real round trip is under way.
        const attemptTimeout = Duration.seconds(3)
        const h = yield* makeHarness({
          expected: [
            { workerId: WORKER, dpRank: 0 },
            { workerId: WORKER, dpRank: 1 }
          ],
          recoveryAttemptTimeout: attemptTimeout,
          recoveryPermits: 1
        })
        const silent = yield* makeWorkerQueryServer({ workerId: WORKER, dpRanks: [0] })
        yield* silent.setUnresponsive(true)
        const healthy = yield* makeWorkerQueryServer({ workerId: WORKER, dpRanks: [1] })
        const stuck = yield* makeDynamoZmqPublisher({ workerId: WORKER, dpRank: 0, queryServer: silent })
        const fine = yield* makeDynamoZmqPublisher({ workerId: WORKER, dpRank: 1, queryServer: healthy })
        const sources = [yield* stuck.source(KV_ENDPOINT), yield* fine.source(KV_ENDPOINT)]
        yield* primeDynamo(h.pool, stuck, sources[0]!)
        yield* primeDynamo(h.pool, fine, sources[1]!)
        yield* fine.store([77n])

        const requestsSeen = (n: number) =>
          eventually(
            silent.stats.pipe(Effect.map((stats) => stats.requests === n)),
            `rank 0's attempt ${n} to reach its target`,
            20_000
          )
        const jitter = Duration.micros(BigInt(SourceSupervisor.FULL_RESTORE_JITTER_MICROS))
        // Rank 0 first: its initial restore starts after its jitter and takes the single permit.
        yield* h.advertise([sources[0]!])
        yield* TestClock.adjust(jitter)
        yield* requestsSeen(1)
        // Then rank 1, whose restore waits for that permit.
        yield* h.advertise(sources)
        yield* TestClock.adjust(jitter)
        expect(h.slot(WORKER, 1)?.recoveryInflight).toBe(true)
        yield* TestClock.adjust(attemptTimeout)
        // The permit is released before the backoff: rank 1 recovers while rank 0 sleeps, and
        // the clock does not move meanwhile, so rank 0 is exactly at its first backoff.
        yield* caughtUp(h, 1, fine.nextEventId.pipe(Effect.map((n) => n - 1)), "rank 1 to recover", 20_000)
        expect(h.target.has(WORKER, 1, 77n)).toBe(true)
        expect((yield* silent.stats).requests).toBe(1)
        expect(h.slot(WORKER, 0)?.recoveryInflight).toBe(true)

        // Live events of rank 0 are buffered meanwhile and admitted by the degraded ending.
        yield* stuck.store([10n])
        yield* stuck.store([11n])
        for (let attempt = 2; attempt <= SourceSupervisor.RECOVERY_MAX_RETRIES; attempt++) {
          yield* TestClock.adjust(
            Duration.millis(SourceSupervisor.RECOVERY_INITIAL_BACKOFF_MS * 2 ** (attempt - 2))
          )
          yield* requestsSeen(attempt)
          expect(h.slot(WORKER, 0)?.recoveryInflight).toBe(true)
          yield* TestClock.adjust(attemptTimeout)
        }
        // No backoff after the last attempt: the rank ends degraded.
        yield* eventually(
          Effect.sync(() => h.slot(WORKER, 0)?.recoveryInflight === false),
          "rank 0 to end degraded",
          20_000
        )
        const stats = yield* silent.stats
        expect(stats.requests).toBe(SourceSupervisor.RECOVERY_MAX_RETRIES)
        expect(stats.unanswered).toBe(SourceSupervisor.RECOVERY_MAX_RETRIES)
        expect(h.target.has(WORKER, 0, 10n) && h.target.has(WORKER, 0, 11n)).toBe(true)
        yield* stuck.store([12n])
        yield* caughtUp(h, 0, stuck.nextEventId.pipe(Effect.map((n) => n - 1)), "rank 0 live after degrading")
        expect(h.target.has(WORKER, 0, 12n)).toBe(true)
      }),
    60_000
  )

  it.scopedLive(
    "an engine-format publisher with a replay endpoint recovers a gap; an uncovered gap degrades without clearing the rank",
    () =>
      Effect.gen(function* () {
        for (const format of ["vllm", "sglang"] as const) {
          const h = yield* makeHarness({ expected: [{ workerId: WORKER, dpRank: 3 }] })
          const engine = yield* makeEngineZmqPublisher({ workerId: WORKER, dpRank: 3, format })
          const source = yield* engine.source(KV_ENDPOINT)
          expect(isRecoverableSource(source)).toBe(true)
          yield* primeEngine(h.pool, engine, source)
          yield* h.advertise([source])
          // Engine event ids are seq + 1: the last one sent is `nextSeq`.
          const lastId = engine.nextSeq
          yield* caughtUp(h, 3, lastId, `${format}: the initial full-history restore`)
          const probes = h.target.sorted(WORKER, 3)
          expect(probes.length).toBeGreaterThan(0)

          yield* engine.store([1n, 2n, 3n])
          yield* engine.dropNext(1)
          yield* engine.store([4n], { parentHash: 3n })
          yield* engine.store([5n])
          yield* engine.remove([2n])
          yield* caughtUp(h, 3, lastId, `${format}: the gap to be recovered from the replay`)
          expect(h.target.sorted(WORKER, 3)).toEqual(
            [...probes, 1n, 3n, 4n, 5n].sort((a, b) => (a < b ? -1 : 1))
          )
          expect((yield* engine.stats).replays).toBe(2)

          // The replay history no longer covers the gap: the range cannot be answered, so the rank
          // degrades without being cleared: it keeps everything it had and loses only the missing
          // batch (engine gaps ask for the range, they do not pre-clear the rank).
          yield* engine.dropNext(1)
          yield* engine.store([6n])
          yield* engine.forgetBefore(yield* engine.nextSeq)
          yield* engine.store([7n])
          yield* caughtUp(h, 3, lastId, `${format}: the degraded ending`)
          const kept = [...probes, 1n, 3n, 4n, 5n]
          const byValue = (a: bigint, b: bigint) => (a < b ? -1 : 1)
          expect(h.target.sorted(WORKER, 3)).toEqual([...kept, 7n].sort(byValue))
          yield* engine.store([8n])
          yield* caughtUp(h, 3, lastId, `${format}: live events after degrading`)
          expect(h.target.sorted(WORKER, 3)).toEqual([...kept, 7n, 8n].sort(byValue))
        }
      })
  )
})

// ---------------------------------------------------------------------------------------------
// Seed 003, adapted: one publisher socket per rank and a scripted recovery peer over ZeroMQ

/** The seed's ControlledRecoveryEngine: the first query gets an empty dump, the second waits. */
const makeControlledRecoveryEngine = (workerId: WorkerId, dpRank: DpRank) =>
  Effect.gen(function* () {
    const socket = yield* acquireSocket(() => new zmq.Router({ linger: 0 }))
    const endpoint = yield* bindSocket(socket, "tcp://127.0.0.1:*")
    const release = yield* Deferred.make<void>()
    const finished = yield* Deferred.make<void>()
    let calls = 0
    const handlers = yield* FiberSet.make()
    const answer = (frames: Array<Buffer>) =>
      Effect.gen(function* () {
        const decoded = decodeWorkerQueryRequest(frames[2]!)
        expect(decoded.ok && decoded.value.workerId).toBe(workerId)
        expect(decoded.ok && decoded.value.dpRank).toBe(dpRank)
        calls++
        let response: WorkerKvQueryResponse
        if (calls === 1) response = { _tag: "TreeDump", events: [], lastEventId: 0 }
        else {
          yield* Deferred.await(release)
          response = { _tag: "Events", events: [storedEvent(workerId, dpRank, 2, [2n])], lastEventId: 2 }
        }
        yield* sendFrames(
          socket,
          [frames[0]!, Buffer.alloc(0), encodeWorkerQueryResponse(response)],
          endpoint
        ).pipe(Effect.ignore)
        if (calls > 1) yield* Deferred.succeed(finished, undefined)
      })
    yield* receiveFrames(socket, endpoint).pipe(
      Effect.flatMap((frames) => FiberSet.run(handlers, answer(frames))),
      Effect.forever,
      Effect.ignore,
      Effect.forkScoped
    )
    return { endpoint, release, finished, calls: () => calls }
  })

/** A discovery snapshot of the model card and these source advertisements (the memory backend). */
const discoverySnapshot = (
  revision: bigint,
  cards: ReadonlyArray<ModelCardInstance>,
  sources: ReadonlyArray<KvEventSource>
): DiscoverySnapshot => ({
  revision,
  cards,
  sources,
  rejectedSources: [],
  sourceStream: { epoch: 0, bound: true }
})

const isActive = (status: KvSourceStatus | undefined) =>
  status?._tag === "ActiveRecoverable" || status?._tag === "ActiveLiveOnly"

describe("seed 003 over real ZeroMQ sockets", () => {
  // The seed's whole pipeline: a discovery registry holding the model card (8 data-parallel ranks
  // of one logical worker, KV state on another endpoint) and the source advertisements; the KV
  // source coordinator computing the membership view from both; the subscriber (live SUB sockets,
  // the source supervisor, worker queries over DEALER) feeding an indexer; and twelve real PUB
  // publishers: node 0 (ranks 0-3), old node 1 (ranks 4-7, rank 4 recoverable through a ROUTER
  // that holds its second query) and the replacement node 1 (ranks 4-7).
  it.scopedLive("direct_zmq_multi_node_replacement_isolated_by_global_rank", () =>
    Effect.gen(function* () {
      const namespace = "test-direct-zmq-multi-node"
      const serving = new EndpointId({ namespace, component: "frontend", endpoint: "generate" })
      const kvEndpoint = new EndpointId({ namespace, component: "router", endpoint: "kv-state" })
      const logical = "1311768467294899695"
      const key = (dpRank: number) => rankKey(logical, dpRank)
      const modelCard = card({
        endpoint: serving.toString(),
        worker: logical,
        name: "test-model",
        runtime: {
          dataParallelStartRank: 0,
          dataParallelSize: 8,
          enableLocalIndexer: true,
          kvStateEndpoint: kvEndpoint.toString()
        }
      })
      // The runtime-config watch: the configs the membership projection derives from the card.
      const configs = projectMembership([modelCard], { scope: WATCH_ALL }).view.endpoints.get(
        serving.toString()
      )!.runtimeConfigs
      expect([...configs.keys()]).toEqual([logical])

      const delayedRank = 4
      const engine = yield* makeControlledRecoveryEngine(logical, delayedRank)
      const publisherFor = (dpRank: number) => makeDynamoZmqPublisher({ workerId: logical, dpRank })
      const node0 = yield* Effect.all([0, 1, 2, 3].map(publisherFor))
      const oldNode1 = yield* Effect.all([4, 5, 6, 7].map(publisherFor))
      const replacementNode1 = yield* Effect.all([4, 5, 6, 7].map(publisherFor))
      const adOf = (publisher: DynamoZmqPublisher, recoveryTarget: string | undefined) =>
        publisher
          .source(kvEndpoint, { recoverable: false })
          .pipe(
            Effect.map(
              (source): KvEventSource =>
                recoveryTarget === undefined
                  ? source
                  : { ...source, recoveryTarget: { endpoint: recoveryTarget } }
            )
          )
      const node0Ads = yield* Effect.all(node0.map((p) => adOf(p, undefined)))
      const oldAds = yield* Effect.all(
        oldNode1.map((p) => adOf(p, p.dpRank === delayedRank ? engine.endpoint : undefined))
      )
      const replacementAds = yield* Effect.all(replacementNode1.map((p) => adOf(p, undefined)))
      const publisherIds = [...node0Ads, ...oldAds, ...replacementAds].map((ad) => ad.publisherId)
      expect(new Set(publisherIds).size).toBe(12)

      let revision = 1n
      const discovery = yield* makeStaticDiscovery(
        discoverySnapshot(revision, [modelCard], [...node0Ads, ...oldAds])
      )
      const advertise = (ads: ReadonlyArray<KvEventSource>) =>
        Effect.suspend(() => discovery.publish(discoverySnapshot(++revision, [modelCard], [...ads])))
      const coordinator = yield* makeKvSourceCoordinator(serving, configs).pipe(
        Effect.provideService(Discovery, discovery)
      )
      const statusOf = (dpRank: number) =>
        coordinator.current.pipe(Effect.map((view) => view.ranks.get(key(dpRank))?.status))
      const viewShows = (check: (status: (dpRank: number) => KvSourceStatus | undefined) => boolean) =>
        coordinator.current.pipe(Effect.map((view) => check((dpRank) => view.ranks.get(key(dpRank))?.status)))

      const target = new RecordingTarget()
      const subscription = yield* SourceSubscriber.make({
        servingEndpoint: serving,
        target,
        sources: { current: coordinator.current, changes: coordinator.changes },
        recoverySemaphore: yield* Effect.makeSemaphore(16),
        recoveryAttemptTimeout: "30 seconds",
        eventTransport: makeZmqEventTransport()
      })

      const publishBlocks = (publishers: ReadonlyArray<DynamoZmqPublisher>, eventId: number, base: bigint) =>
        Effect.forEach(
          publishers,
          (p) => p.publish([storedEvent(logical, p.dpRank, eventId, [base + BigInt(p.dpRank)])]),
          { discard: true }
        )
      const publishClears = (publishers: ReadonlyArray<DynamoZmqPublisher>, eventId: number) =>
        Effect.forEach(publishers, (p) => p.publish([clearedEvent(logical, p.dpRank, eventId)]), {
          discard: true
        })
      const has = (dpRank: number, block: bigint) => target.has(logical, dpRank, block)
      const ranks = [0, 1, 2, 3, 4, 5, 6, 7]

      yield* eventually(
        viewShows((status) => ranks.every((r) => isActive(status(r)))),
        "all eight logical ranks to become active"
      )
      yield* eventually(
        Effect.gen(function* () {
          yield* publishBlocks(node0, 1, 100n)
          yield* publishBlocks(oldNode1, 1, 100n)
          return ranks.every((r) => has(r, 100n + BigInt(r)))
        }),
        "distinct state for all eight global ranks to be indexed"
      )
      expect(target.ranksWithBlocks()).toEqual(ranks)

      yield* publishClears(oldNode1, 2)
      yield* eventually(
        Effect.sync(
          () =>
            [0, 1, 2, 3].every((r) => has(r, 100n + BigInt(r))) &&
            target.ranksWithBlocks().every((r) => r < 4)
        ),
        "clearing node-1 ranks without disturbing the node-0 rank slice"
      )
      yield* publishBlocks(oldNode1, 3, 150n)
      yield* eventually(
        Effect.sync(() => [4, 5, 6, 7].every((r) => has(r, 150n + BigInt(r)))),
        "node-1 ranks to resume after their rank-local clears"
      )

      const oldRank4 = oldNode1.find((p) => p.dpRank === delayedRank)!
      yield* eventually(
        Effect.gen(function* () {
          yield* oldRank4.publish([storedEvent(logical, delayedRank, 5, [903n])])
          return engine.calls() >= 2
        }),
        "the old node-1 recovery to become in flight"
      )

      // The replacement node advertises the same logical ranks, one at a time: each overlaps.
      const advertised = [...node0Ads, ...oldAds]
      for (const ad of replacementAds) {
        advertised.push(ad)
        yield* advertise(advertised)
        yield* eventually(
          statusOf(ad.dpRank).pipe(Effect.map((status) => status?._tag === "Ambiguous")),
          `rank ${ad.dpRank} to observe the source overlap`
        )
      }
      expect(oldAds.every((old) => replacementAds.every((r) => r.publisherId !== old.publisherId))).toBe(true)
      yield* eventually(
        viewShows(
          (status) =>
            [0, 1, 2, 3].every((r) => isActive(status(r))) &&
            [4, 5, 6, 7].every((r) => status(r)?._tag === "Ambiguous")
        ),
        "node-1 publisher overlap to become rank-local ambiguity"
      )
      yield* eventually(
        Effect.sync(
          () =>
            [0, 1, 2, 3].every((r) => has(r, 100n + BigInt(r))) &&
            target.ranksWithBlocks().every((r) => r < 4)
        ),
        "only the overlapping node-1 rank slice to fail KV closed"
      )
      expect(target.ranksWithBlocks()).toEqual([0, 1, 2, 3])
      expect((yield* coordinator.current).runtimeConfigs.has(logical)).toBe(true)

      // The old node-1 advertisements go away: the replacement slice becomes selectable.
      yield* advertise([...node0Ads, ...replacementAds])
      yield* eventually(
        viewShows((status) => ranks.every((r) => isActive(status(r)))),
        "the replacement node-1 rank slice to become selectable"
      )
      yield* eventually(
        Effect.gen(function* () {
          yield* publishBlocks(replacementNode1, 1, 200n)
          return [4, 5, 6, 7].every((r) => has(r, 200n + BigInt(r)))
        }),
        "replacement node-1 state to be activated after the cold reset"
      )

      yield* Deferred.succeed(engine.release, undefined)
      yield* Deferred.await(engine.finished).pipe(
        Effect.timeoutFail({
          duration: Duration.seconds(5),
          onTimeout: () => new Error("old node-1 recovery did not finish or cancel after release")
        })
      )
      yield* publishBlocks(oldNode1, 4, 400n)
      yield* eventually(
        Effect.gen(function* () {
          yield* publishBlocks(replacementNode1, 2, 300n)
          return [4, 5, 6, 7].every((r) => has(r, 300n + BigInt(r)))
        }),
        "replacement node-1 publishers to keep applying live state"
      )
      for (const r of [0, 1, 2, 3]) expect(has(r, 100n + BigInt(r))).toBe(true)
      for (const r of [4, 5, 6, 7]) {
        expect(has(r, 200n + BigInt(r))).toBe(true)
        expect(has(r, 300n + BigInt(r))).toBe(true)
        expect(has(r, 100n + BigInt(r))).toBe(false)
        expect(has(r, 400n + BigInt(r))).toBe(false)
      }
      expect(has(delayedRank, 2n)).toBe(false)
      expect((yield* coordinator.current).runtimeConfigs.has(logical)).toBe(true)
      yield* subscription.shutdown
      // Not ported: the seed's `kv_event_source_mismatch_workers` gauge, a router metric that
      // kvrelay does not have.
    })
  )
})
