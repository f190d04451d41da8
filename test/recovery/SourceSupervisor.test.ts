/**
 * SourceSupervisor behaviour beyond the seed-003 ports (test/seeds/003_worker_query.test.ts):
 * the retry schedule on virtual time, the degraded paths, hole follow-ups, cancellation, commit
 * groups of engine batches, target faults, health and scope-close shutdown.
 */

import { describe, expect, it } from "@effect/vitest"
import { Clock, Deferred, Effect, Exit, Fiber, Option, SubscriptionRef, TestClock, Tracer } from "effect"
import {
  type KvEventSource,
  type KvSourceMembershipView,
  type KvSourceStatus,
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
import { internalsOf } from "../../src/recovery/internal/SourceSupervisorInternals.js"
import {
  type RecoveryResetReason,
  type RecoveryTarget,
  RecoveryTargetError,
  type SourceEpoch
} from "../../src/recovery/RecoveryTarget.js"
import type * as SourceSupervisor from "../../src/recovery/SourceSupervisor.js"
import * as SourceSupervisorLive from "../../src/recovery/SourceSupervisorLive.js"
import {
  type WorkerKvQueryRequest,
  type WorkerKvQueryResponse,
  WorkerQueryError,
  type WorkerQueryTransport
} from "../../src/recovery/WorkerQuery.js"
import { heldQueries } from "./heldQueries.js"

const SERVING = new EndpointId({ namespace: "test", component: "router", endpoint: "generate" })
const KV_ENDPOINT = new EndpointId({ namespace: "test", component: "router", endpoint: "kv" })

interface Rank {
  readonly workerId: WorkerId
  readonly dpRank: DpRank
}
const rank = (workerId: number, dpRank: number): Rank => ({ workerId: String(workerId), dpRank })
const WORKER = rank(42, 4)

const sourceFor = (worker: Rank, publisherId: bigint, recoverable: boolean): KvEventSource => ({
  kvStateEndpoint: KV_ENDPOINT,
  workerId: worker.workerId,
  dpRank: worker.dpRank,
  publisherId,
  transport: { kind: "dynamo-zmq", endpoint: "tcp://127.0.0.1:5557", topic: "kv-events" },
  recoveryTarget: recoverable ? { endpoint: `tcp://127.0.0.1:9000/query-${publisherId}` } : null
})
const statusOf = (src: KvEventSource): KvSourceStatus =>
  src.recoveryTarget === null
    ? { _tag: "ActiveLiveOnly", source: src }
    : { _tag: "ActiveRecoverable", source: src }

const view = (sources: ReadonlyArray<readonly [KvEventSource, number]>): KvSourceMembershipView => ({
  servingEndpoint: SERVING,
  endpointResolution: { _tag: "Resolved", endpoint: KV_ENDPOINT },
  ranks: new Map(
    sources.map(([src, lifecycleGeneration]) => [
      rankKey(src.workerId, src.dpRank),
      {
        workerId: src.workerId,
        dpRank: src.dpRank,
        status: statusOf(src),
        lifecycleGeneration,
        recoveryExpected: src.recoveryTarget !== null
      }
    ])
  )
})

const store = (eventId: number, block: number = eventId, worker: Rank = WORKER): RouterEvent =>
  storedEvent(worker.workerId, worker.dpRank, eventId, [block])

type Call =
  | readonly ["Admit", SourceEpoch, number]
  | readonly ["Replace", SourceEpoch, ReadonlyArray<number>]
  | readonly ["Reset", SourceEpoch, RecoveryResetReason]
  | readonly ["Initial", WorkerId, DpRank]

const recordingTarget = (options: { readonly failAdmit?: (event: RouterEvent) => boolean } = {}) => {
  const calls: Array<Call> = []
  const target: RecoveryTarget = {
    admitEvent: (epoch, event) =>
      options.failAdmit?.(event) === true
        ? Effect.fail(new RecoveryTargetError({ reason: "Stopped", message: "queue closed" }))
        : Effect.sync(() => void calls.push(["Admit", epoch, event.eventId])),
    replaceRank: (epoch, _w, _r, events) =>
      Effect.sync(() => void calls.push(["Replace", epoch, events.map((event) => event.eventId)])),
    resetRank: (epoch, _w, _r, reason) => Effect.sync(() => void calls.push(["Reset", epoch, reason])),
    completeInitialRecovery: (workerId, dpRank) =>
      Effect.sync(() => void calls.push(["Initial", workerId, dpRank]))
  }
  const admitted = () => calls.flatMap((call) => (call[0] === "Admit" ? [call[2]] : []))
  return { calls, target, admitted }
}

/** Answers each query with the next scripted step; records requests with their virtual time. */
const scriptedTransport = (
  script: ReadonlyArray<
    (request: WorkerKvQueryRequest) => Effect.Effect<WorkerKvQueryResponse, WorkerQueryError>
  >
) => {
  const requests: Array<{ readonly at: number; readonly request: WorkerKvQueryRequest }> = []
  const transport: WorkerQueryTransport = {
    queryWorker: (_source, request) =>
      Effect.gen(function* () {
        const at = yield* Clock.currentTimeMillis
        requests.push({ at, request })
        const step = script[Math.min(requests.length - 1, script.length - 1)]
        if (step === undefined) return yield* new WorkerQueryError({ message: "no script" })
        return yield* step(request)
      })
  }
  return { requests, transport }
}

const fail =
  (message = "connection refused") =>
  () =>
    Effect.fail(new WorkerQueryError({ message }))
const respond = (response: WorkerKvQueryResponse) => () => Effect.succeed(response)

const setup = (
  target: RecoveryTarget,
  transport: WorkerQueryTransport,
  initial: KvSourceMembershipView,
  options: { readonly recoverySemaphore?: Effect.Semaphore } = {}
) =>
  Effect.gen(function* () {
    const membership = yield* SubscriptionRef.make(initial)
    const supervisor = yield* SourceSupervisorLive.make({ target, transport, membership, ...options })
    yield* supervisor.syncMembership
    return { supervisor, membership }
  })

const slotOf = (supervisor: SourceSupervisor.SourceSupervisor, worker: Rank = WORKER) => {
  const slot = internalsOf(supervisor).slot(worker.workerId, worker.dpRank)
  if (slot === undefined) throw new Error("no slot")
  return slot
}

describe("SourceSupervisor recovery queries", () => {
  it.scoped("retries 8 attempts with 200 ms × 2^k backoff and releases the permit before each sleep", () =>
    Effect.gen(function* () {
      const semaphore = yield* Effect.makeSemaphore(1)
      const { requests, transport } = scriptedTransport([
        fail(),
        respond({ _tag: "Error", message: "worker busy" }),
        fail()
      ])
      const { supervisor } = yield* setup(recordingTarget().target, transport, view([]), {
        recoverySemaphore: semaphore
      })
      const fetch = yield* Effect.fork(
        internalsOf(supervisor).fetchRecoveryResponse(sourceFor(WORKER, 1n, true), 5, undefined)
      )
      yield* TestClock.adjust("100 millis")
      expect(requests.length).toBe(1)
      // In the first backoff the shared permit is free.
      expect(Option.isSome(yield* semaphore.withPermitsIfAvailable(1)(Effect.void))).toBe(true)
      yield* TestClock.adjust("30 seconds")
      const result = yield* Effect.either(Fiber.join(fetch))
      expect(result._tag).toBe("Left")
      expect(requests.map((entry) => entry.at)).toEqual([0, 200, 600, 1400, 3000, 6200, 12600, 25400])
      expect(requests.every((entry) => entry.request.startEventId === 5)).toBe(true)
      expect(requests[0]!.request.supportsTreeDumpFailed).toBe(true)
    })
  )

  it.scoped("an attempt that outlives the attempt timeout is retried", () =>
    Effect.gen(function* () {
      const { requests, transport } = scriptedTransport([
        () => Effect.never,
        respond({ _tag: "TreeDump", events: [], lastEventId: 0 })
      ])
      const membership = yield* SubscriptionRef.make(view([]))
      const supervisor = yield* SourceSupervisorLive.make({
        target: recordingTarget().target,
        transport,
        membership,
        recoveryAttemptTimeout: "1 second"
      })
      const fetch = yield* Effect.fork(
        internalsOf(supervisor).fetchRecoveryResponse(sourceFor(WORKER, 1n, true), undefined, undefined)
      )
      yield* TestClock.adjust("1200 millis")
      expect((yield* Fiber.join(fetch))._tag).toBe("TreeDump")
      expect(requests.map((entry) => entry.at)).toEqual([0, 1200])
    })
  )

  it.scoped("exhausted retries admit the buffered live events in id order and accept the gaps", () =>
    Effect.gen(function* () {
      const { calls, target, admitted } = recordingTarget()
      const { requests, transport } = scriptedTransport([fail()])
      const src = sourceFor(WORKER, 100n, true)
      const { supervisor } = yield* setup(target, transport, view([[src, 0]]))
      for (const id of [3, 1, 2, 2, 5]) yield* supervisor.handleLiveBatch(100n, [store(id)])
      expect(admitted()).toEqual([])
      yield* TestClock.adjust("30 seconds")
      expect(requests.length).toBe(8)
      expect(admitted()).toEqual([1, 2, 3, 5])
      expect(calls.at(-1)).toEqual(["Initial", "42", 4])
      const slot = slotOf(supervisor)
      expect(slot.lastAdmittedId).toBe(5)
      expect(slot.recoveryInflight).toBe(false)
      expect(slot.resetPending).toBe(false)
    })
  )

  it.scoped("TooNew and InvalidRange are not retried and take the degraded path", () =>
    Effect.gen(function* () {
      for (const response of [
        { _tag: "TooNew", requestedStart: undefined, requestedEnd: undefined, newestAvailable: 0 },
        { _tag: "InvalidRange", startId: 4, endId: 2 }
      ] as const) {
        yield* Effect.scoped(
          Effect.gen(function* () {
            const { target, admitted } = recordingTarget()
            const { requests, transport } = scriptedTransport([respond(response)])
            const { supervisor } = yield* setup(target, transport, view([[sourceFor(WORKER, 100n, true), 0]]))
            yield* supervisor.handleLiveBatch(100n, [store(7)])
            yield* TestClock.adjust("3 millis")
            expect(requests.length).toBe(1)
            expect(admitted()).toEqual([7])
            expect(slotOf(supervisor).lastAdmittedId).toBe(7)
            expect(slotOf(supervisor).recoveryInflight).toBe(false)
          })
        )
      }
    })
  )
})

/** Delegates to the current tracer and keeps every span it starts. */
const recordingTracer = Effect.map(Effect.tracer, (native) => {
  const spans: Array<Tracer.Span> = []
  const tracer = Tracer.make({
    span: (...args) => {
      const span = native.span(...args)
      spans.push(span)
      return span
    },
    context: native.context
  })
  return { spans, tracer }
})

describe("SourceSupervisor spans", () => {
  it.scoped("each query attempt is a span with its attempt number and outcome", () =>
    Effect.gen(function* () {
      const { spans, tracer } = yield* recordingTracer
      const { transport } = scriptedTransport([
        fail(),
        () => Effect.never,
        respond({ _tag: "Error", message: "busy" }),
        respond({ _tag: "TreeDump", events: [], lastEventId: 0 })
      ])
      const membership = yield* SubscriptionRef.make(view([]))
      const supervisor = yield* SourceSupervisorLive.make({
        target: recordingTarget().target,
        transport,
        membership,
        recoveryAttemptTimeout: "1 second"
      })
      const fetch = yield* Effect.fork(
        internalsOf(supervisor)
          .fetchRecoveryResponse(sourceFor(WORKER, 1n, true), undefined, undefined)
          .pipe(Effect.withTracer(tracer))
      )
      yield* TestClock.adjust("10 seconds")
      expect((yield* Fiber.join(fetch))._tag).toBe("TreeDump")
      const attempts = spans.filter((span) => span.name === "kvrelay.recovery.attempt")
      expect(
        attempts.map((span) => [
          span.attributes.get("kvrelay.recovery.attempt"),
          span.attributes.get("kvrelay.recovery.outcome")
        ])
      ).toEqual([
        [1, "TransportError"],
        [2, "Timeout"],
        [3, "Error"],
        [4, "TreeDump"]
      ])
    })
  )

  it.scoped("reconcile and reset commands are spans", () =>
    Effect.gen(function* () {
      const { spans, tracer } = yield* recordingTracer
      const src = sourceFor(WORKER, 7n, false)
      const { supervisor, membership } = yield* setup(
        recordingTarget().target,
        scriptedTransport([]).transport,
        view([[src, 1]])
      )
      yield* SubscriptionRef.set(membership, view([[src, 2]]))
      yield* supervisor.syncMembership.pipe(Effect.withTracer(tracer))
      expect(spans.map((span) => span.name)).toEqual([
        "kvrelay.recovery.reconcile",
        "kvrelay.recovery.reset_rank"
      ])
      const reset = spans[1]!
      expect(reset.attributes.get("kvrelay.reset_reason")).toBe("Lifecycle")
      expect(reset.attributes.get("kvrelay.source_epoch")).toBe(2)
    })
  )
})

describe("SourceSupervisor recovery completion", () => {
  it.scoped("a full restore replaces the rank, drains the tail and completes the initial recovery once", () =>
    Effect.gen(function* () {
      const { calls, target } = recordingTarget()
      const { requests, transport } = scriptedTransport([
        respond({ _tag: "TreeDump", events: [store(0, 10), store(1, 11)], lastEventId: 2 })
      ])
      const { supervisor } = yield* setup(target, transport, view([[sourceFor(WORKER, 100n, true), 5]]))
      for (const id of [2, 4, 3]) yield* supervisor.handleLiveBatch(100n, [store(id)])
      yield* TestClock.adjust("3 millis")
      expect(requests.length).toBe(1)
      expect(requests[0]!.request.startEventId).toBeUndefined()
      expect(calls).toEqual([
        ["Replace", 5, [0, 1]],
        ["Admit", 5, 3],
        ["Admit", 5, 4],
        ["Initial", "42", 4]
      ])
      expect(slotOf(supervisor).lastAdmittedId).toBe(4)
      expect(slotOf(supervisor).recoveryInflight).toBe(false)
    })
  )

  it.scoped("a hole in the drained tail schedules an incremental recovery from the first missing id", () =>
    Effect.gen(function* () {
      const { calls, target } = recordingTarget()
      const { requests, transport } = scriptedTransport([
        respond({ _tag: "TreeDump", events: [store(1)], lastEventId: 1 }),
        respond({ _tag: "Events", events: [store(3), store(4)], lastEventId: 4 })
      ])
      const { supervisor } = yield* setup(target, transport, view([[sourceFor(WORKER, 100n, true), 0]]))
      for (const id of [2, 4]) yield* supervisor.handleLiveBatch(100n, [store(id)])
      yield* TestClock.adjust("3 millis")
      // The follow-up has no jitter.
      yield* Effect.yieldNow()
      yield* TestClock.adjust("0 millis")
      expect(requests.map((entry) => entry.request.startEventId)).toEqual([undefined, 3])
      expect(calls).toEqual([
        ["Replace", 0, [1]],
        ["Admit", 0, 2],
        ["Initial", "42", 4],
        ["Admit", 0, 3],
        ["Admit", 0, 4]
      ])
      const slot = slotOf(supervisor)
      expect(slot.lastAdmittedId).toBe(4)
      expect(slot.recoveryInflight).toBe(false)
      expect(slot.pendingLiveEventCount).toBe(0)
    })
  )

  it.scoped("a cancelled recovery never finishes, even when its response arrives", () =>
    Effect.gen(function* () {
      const { calls, target } = recordingTarget()
      const started = yield* Deferred.make<void>()
      const release = yield* Deferred.make<void>()
      const { transport } = scriptedTransport([
        () =>
          Deferred.succeed(started, undefined).pipe(
            Effect.zipRight(Deferred.await(release)),
            Effect.as<WorkerKvQueryResponse>({ _tag: "TreeDump", events: [store(0)], lastEventId: 9 })
          )
      ])
      const { supervisor } = yield* setup(target, transport, view([[sourceFor(WORKER, 100n, true), 0]]))
      yield* TestClock.adjust("3 millis")
      yield* Deferred.await(started)
      // A rank clear supersedes the initial restore.
      yield* supervisor.handleLiveBatch(100n, [clearedEvent("42", 4, 1)])
      yield* Deferred.succeed(release, undefined)
      yield* TestClock.adjust("1 second")
      expect(calls).toEqual([["Admit", 0, 1]])
      expect(internalsOf(supervisor).runningRecoveryCount()).toBe(0)
      expect(slotOf(supervisor).lastAdmittedId).toBe(1)
    })
  )

  it.scoped("a corrupt tree dump resets and fences the rank without replaying buffered events", () =>
    Effect.gen(function* () {
      const { calls, target } = recordingTarget()
      const { transport } = scriptedTransport([
        respond({ _tag: "TreeDump", events: [store(0, 1, rank(42, 5))], lastEventId: 3 })
      ])
      const { supervisor } = yield* setup(target, transport, view([[sourceFor(WORKER, 100n, true), 2]]))
      yield* supervisor.handleLiveBatch(100n, [store(4)])
      yield* TestClock.adjust("3 millis")
      expect(calls).toEqual([
        ["Reset", 2, "Lifecycle"],
        ["Initial", "42", 4]
      ])
      const slot = slotOf(supervisor)
      expect(slot.resetPending).toBe(true)
      expect(slot.recoveryInflight).toBe(false)
      // Fenced: live batches are ignored until a reconcile resets the rank.
      yield* supervisor.handleLiveBatch(100n, [store(5)])
      expect(calls.length).toBe(2)
    })
  )

  it.scoped("a failed admission of the recovered tail keeps the old cursor and fences the rank", () =>
    Effect.gen(function* () {
      const { target, admitted } = recordingTarget({ failAdmit: (event) => event.eventId === 3 })
      const { transport } = scriptedTransport([respond({ _tag: "TreeDump", events: [], lastEventId: 1 })])
      const { supervisor } = yield* setup(target, transport, view([[sourceFor(WORKER, 100n, true), 0]]))
      for (const id of [2, 3]) yield* supervisor.handleLiveBatch(100n, [store(id)])
      yield* TestClock.adjust("3 millis")
      expect(admitted()).toEqual([2])
      const slot = slotOf(supervisor)
      expect(slot.lastAdmittedId).toBeUndefined()
      expect(slot.resetPending).toBe(true)
      expect(slot.recoveryInflight).toBe(false)
    })
  )
})

describe("SourceSupervisor live batches", () => {
  it.scoped("an engine batch is one commit group: admitted whole, the cursor advances once", () =>
    Effect.gen(function* () {
      const { calls, target, admitted } = recordingTarget()
      const { supervisor } = yield* setup(
        target,
        scriptedTransport([]).transport,
        view([[sourceFor(WORKER, 7n, false), 1]])
      )
      const batch = (id: number, size: number) =>
        Array.from({ length: size }, (_, j) => store(id, id * 10 + j))

      yield* supervisor.handleLiveBatch(7n, batch(5, 3))
      expect(admitted()).toEqual([5, 5, 5])
      expect(slotOf(supervisor).lastAdmittedId).toBe(5)
      yield* supervisor.handleLiveBatch(7n, [...batch(6, 2), ...batch(7, 1)])
      yield* supervisor.handleLiveBatch(7n, batch(6, 2))
      expect(admitted()).toEqual([5, 5, 5, 6, 6, 7])
      expect(slotOf(supervisor).lastAdmittedId).toBe(7)

      // A live-only gap: reset, then the whole group.
      yield* supervisor.handleLiveBatch(7n, batch(9, 2))
      expect(calls.slice(-3)).toEqual([
        ["Reset", 1, "Lifecycle"],
        ["Admit", 1, 9],
        ["Admit", 1, 9]
      ])
      expect(slotOf(supervisor).lastAdmittedId).toBe(9)
    })
  )

  it.scoped("a group that fails half-way is not committed and fences the rank", () =>
    Effect.gen(function* () {
      let admittedOfFive = 0
      const { target } = recordingTarget({
        failAdmit: (event) => event.eventId === 5 && ++admittedOfFive === 2
      })
      const { supervisor } = yield* setup(
        target,
        scriptedTransport([]).transport,
        view([[sourceFor(WORKER, 7n, false), 1]])
      )
      yield* supervisor.handleLiveBatch(7n, [store(4)])
      yield* supervisor.handleLiveBatch(7n, [store(5, 50), store(5, 51), store(5, 52)])
      const slot = slotOf(supervisor)
      expect(slot.lastAdmittedId).toBe(4)
      expect(slot.resetPending).toBe(true)
    })
  )

  it.scoped("a batch from an unknown publisher or with a foreign rank changes nothing", () =>
    Effect.gen(function* () {
      const { calls, target } = recordingTarget()
      const { supervisor } = yield* setup(
        target,
        scriptedTransport([]).transport,
        view([[sourceFor(WORKER, 7n, false), 1]])
      )
      yield* supervisor.handleLiveBatch(8n, [store(1)])
      yield* supervisor.handleLiveBatch(7n, [store(1), store(2, 2, rank(42, 5))])
      expect(calls).toEqual([])
      expect(slotOf(supervisor).lastAdmittedId).toBeUndefined()
    })
  )
})

/**
 * A recording target with the live hot path: `admitEventsNow` takes a batch when it holds at most
 * `room.events` events (recorded like `admitEvent`, counted in `now`), else refuses it whole.
 */
const hotPathTarget = (
  room = { events: Number.POSITIVE_INFINITY },
  gate?: Deferred.Deferred<void>,
  failAdmit?: (event: RouterEvent) => boolean
) => {
  const recording = recordingTarget(failAdmit === undefined ? {} : { failAdmit })
  const counts = { now: 0 }
  const target: RecoveryTarget = {
    ...recording.target,
    admitEvent: (epoch, event) =>
      gate === undefined
        ? recording.target.admitEvent(epoch, event)
        : Effect.zipRight(Deferred.await(gate), recording.target.admitEvent(epoch, event)),
    admitEventsNow: (epoch, events) => {
      if (events.length > room.events) return false
      counts.now++
      for (const event of events) recording.calls.push(["Admit", epoch, event.eventId])
      return true
    }
  }
  return { ...recording, target, counts }
}

/** Lets forked fibers run until they wait (no clock involved). */
const settle = Effect.repeatN(Effect.yieldNow(), 20)

describe("SourceSupervisor live hot path (admitEventsNow)", () => {
  const batches: ReadonlyArray<ReadonlyArray<RouterEvent>> = [
    [store(1)],
    [store(2)],
    [store(3, 30), store(3, 31), store(3, 32)],
    // A live-only gap: reset, then the event.
    [store(5)],
    [store(6)],
    // A duplicate, then a batch of two commit groups (the cursor ends on the second).
    [store(6)],
    [store(7), store(8)],
    [store(9)],
    [clearedEvent("42", 4, 10)],
    [store(11)]
  ]

  it.scoped("gives the outcome of the locked path, and takes only plain in-order groups", () =>
    Effect.gen(function* () {
      const run = (target: RecoveryTarget) =>
        Effect.gen(function* () {
          const { supervisor } = yield* setup(
            target,
            scriptedTransport([]).transport,
            view([[sourceFor(WORKER, 7n, false), 1]])
          )
          for (const batch of batches) yield* supervisor.handleLiveBatch(7n, batch)
          return slotOf(supervisor)
        })
      const locked = recordingTarget()
      const lockedSlot = yield* run(locked.target)
      const hot = hotPathTarget()
      const hotSlot = yield* run(hot.target)
      expect(hot.calls).toEqual(locked.calls)
      expect(hotSlot).toEqual(lockedSlot)
      expect(hotSlot.lastAdmittedId).toBe(11)
      // 1, 2, the group of 3, 6, 9 and 11; the gap, the duplicate, two groups and the clear are not.
      expect(hot.counts.now).toBe(6)
    })
  )

  it.scoped("a batch the target cannot take at once is admitted by the locked path, in order", () =>
    Effect.gen(function* () {
      const gate = yield* Deferred.make<void>()
      const room = { events: 1 }
      const { target, admitted, counts } = hotPathTarget(room, gate)
      const { supervisor } = yield* setup(
        target,
        scriptedTransport([]).transport,
        view([[sourceFor(WORKER, 7n, false), 1]])
      )
      yield* supervisor.handleLiveBatch(7n, [store(1)])
      // Two events, room for one: refused whole, then admitted one by one (waiting at the gate).
      const second = yield* Effect.fork(supervisor.handleLiveBatch(7n, [store(2, 20), store(2, 21)]))
      yield* settle
      expect(admitted()).toEqual([1])
      expect(slotOf(supervisor).lastAdmittedId).toBe(1)
      // The next batch waits for the slot behind it.
      const third = yield* Effect.fork(supervisor.handleLiveBatch(7n, [store(3)]))
      yield* settle
      expect(admitted()).toEqual([1])
      yield* Deferred.succeed(gate, undefined)
      yield* Fiber.join(second)
      yield* Fiber.join(third)
      expect(admitted()).toEqual([1, 2, 2, 3])
      expect(slotOf(supervisor).lastAdmittedId).toBe(3)
      expect(counts.now).toBe(1)
    })
  )

  it.scoped("a rank fenced pending its reset takes nothing more from the live path", () =>
    Effect.gen(function* () {
      let admittedOfFive = 0
      // Room for one event at a time: the group of 3 goes through admitEvent, which fails half-way.
      const { admitted, counts, target } = hotPathTarget({ events: 1 }, undefined, (event) => {
        return event.eventId === 5 && ++admittedOfFive === 2
      })
      const { supervisor } = yield* setup(
        target,
        scriptedTransport([]).transport,
        view([[sourceFor(WORKER, 7n, false), 1]])
      )
      yield* supervisor.handleLiveBatch(7n, [store(4)])
      yield* supervisor.handleLiveBatch(7n, [store(5, 50), store(5, 51), store(5, 52)])
      expect(slotOf(supervisor).resetPending).toBe(true)
      yield* supervisor.handleLiveBatch(7n, [store(5)])
      yield* supervisor.handleLiveBatch(7n, [store(6)])
      expect(admitted()).toEqual([4, 5])
      expect(counts.now).toBe(1)
      expect(slotOf(supervisor).lastAdmittedId).toBe(4)
    })
  )

  it.scoped("a live batch waits while a reset holds its slot, then applies after it", () =>
    Effect.gen(function* () {
      const resetGate = yield* Deferred.make<void>()
      const hot = hotPathTarget()
      const target: RecoveryTarget = {
        ...hot.target,
        resetRank: (epoch, workerId, dpRank, reason) =>
          Effect.zipRight(hot.target.resetRank(epoch, workerId, dpRank, reason), Deferred.await(resetGate))
      }
      const { supervisor } = yield* setup(
        target,
        scriptedTransport([]).transport,
        view([[sourceFor(WORKER, 7n, false), 1]])
      )
      yield* supervisor.handleLiveBatch(7n, [store(1)])
      // A live-only rank's target fault: reset under the slot lock, then a fresh cursor.
      const fault = yield* Effect.fork(supervisor.handleTargetFault("42", 4))
      yield* settle
      expect(hot.calls).toEqual([
        ["Admit", 1, 1],
        ["Reset", 1, "TargetFault"]
      ])
      const live = yield* Effect.fork(supervisor.handleLiveBatch(7n, [store(2)]))
      yield* settle
      expect(hot.admitted()).toEqual([1])
      yield* Deferred.succeed(resetGate, undefined)
      expect(yield* Fiber.join(fault)).toBe("ResetLiveOnly")
      yield* Fiber.join(live)
      expect(hot.calls.slice(-1)).toEqual([["Admit", 1, 2]])
      expect(slotOf(supervisor).lastAdmittedId).toBe(2)
    })
  )
})

describe("SourceSupervisor faults, health and shutdown", () => {
  it.scoped("handleTargetFault restores a recoverable rank and resets a live-only one", () =>
    Effect.gen(function* () {
      const { calls, target } = recordingTarget()
      const { requests, transport } = scriptedTransport([
        respond({ _tag: "TreeDump", events: [], lastEventId: 0 }),
        respond({ _tag: "TreeDump", events: [store(0)], lastEventId: 4 })
      ])
      const other = rank(43, 0)
      const { supervisor } = yield* setup(
        target,
        transport,
        view([
          [sourceFor(WORKER, 100n, true), 3],
          [sourceFor(other, 200n, false), 6]
        ])
      )
      yield* TestClock.adjust("3 millis")
      expect(requests.length).toBe(1)
      calls.length = 0

      expect(yield* supervisor.handleTargetFault("42", 4, 2)).toBe("Stale")
      expect(yield* supervisor.handleTargetFault("42", 9)).toBe("Stale")
      expect(yield* supervisor.handleTargetFault("42", 4, 3)).toBe("Recovering")
      expect(slotOf(supervisor).recoveryInflight).toBe(true)
      yield* supervisor.handleLiveBatch(100n, [store(5)])
      yield* TestClock.adjust("3 millis")
      expect(requests.length).toBe(2)
      expect(calls).toEqual([
        ["Replace", 3, [0]],
        ["Admit", 3, 5],
        ["Initial", "42", 4]
      ])

      expect(yield* supervisor.handleTargetFault("43", 0, 6)).toBe("ResetLiveOnly")
      expect(calls.at(-1)).toEqual(["Reset", 6, "TargetFault"])
      expect(yield* supervisor.handleTargetFault("43", 0, 6, true)).toBe("Fenced")
    })
  )

  it.scoped("healthSnapshot counts workers, ranks, recovering ranks, buffered events and endpoints", () =>
    Effect.gen(function* () {
      const { target } = recordingTarget()
      const { transport } = scriptedTransport([() => Effect.never])
      const { supervisor } = yield* setup(
        target,
        transport,
        view([
          [sourceFor(rank(42, 0), 1n, true), 0],
          [sourceFor(rank(42, 1), 2n, false), 0],
          [sourceFor(rank(43, 0), 3n, false), 0]
        ])
      )
      yield* supervisor.handleLiveBatch(1n, [store(1, 1, rank(42, 0))])
      yield* supervisor.handleLiveBatch(1n, [store(2, 2, rank(42, 0))])
      expect(yield* supervisor.healthSnapshot).toEqual({
        workerCount: 2,
        rankCount: 3,
        recoveringRankCount: 1,
        sourcesRecovering: 1,
        sourcesDegraded: 0,
        sources: [
          { workerId: "42", dpRank: 0, publisherId: 1n, state: "recovering" },
          { workerId: "42", dpRank: 1, publisherId: 2n, state: "live" },
          { workerId: "43", dpRank: 0, publisherId: 3n, state: "live" }
        ],
        rejected: [],
        pendingLiveEventCount: 2,
        discoveredEndpointCount: 1
      })
    })
  )

  it.scoped("a protocol fault of an older source epoch does not reject the replacement epoch", () =>
    Effect.gen(function* () {
      const { calls, target } = recordingTarget()
      const { transport } = scriptedTransport([
        () => Effect.succeed({ _tag: "TreeDump", events: [], lastEventId: 0 })
      ])
      const worker = rank(42, 0)
      const { supervisor, membership } = yield* setup(
        target,
        transport,
        view([[sourceFor(worker, 1n, true), 4]])
      )
      yield* TestClock.adjust("5 millis")
      // The rank's source is replaced (generation 5): faults of generation 4 are stale.
      yield* SubscriptionRef.set(membership, view([[sourceFor(worker, 2n, true), 5]]))
      yield* supervisor.syncMembership
      yield* TestClock.adjust("5 millis")
      calls.length = 0
      expect(yield* supervisor.rejectSource("42", 0, 4)).toBe("Stale")
      expect(calls).toEqual([])
      expect(internalsOf(supervisor).publisherBinding(2n)?.epoch).toBe(5)
      expect(internalsOf(supervisor).slot("42", 0)?.rejectedGeneration).toBeUndefined()
      // The current epoch's fault does reject it.
      expect(yield* supervisor.rejectSource("42", 0, 5)).toBe("Fenced")
      expect(internalsOf(supervisor).publisherBinding(2n)).toBeUndefined()
    })
  )

  it.scoped("the default recovery semaphore admits 16 queries at once; the 17th waits for a permit", () =>
    Effect.gen(function* () {
      const { target } = recordingTarget()
      const held = yield* heldQueries
      const transport = held.transport
      const ranks = Array.from(
        { length: 17 },
        (_, i) => [sourceFor(rank(100 + i, 0), BigInt(i + 1), true), 1] as const
      )
      // No `recoverySemaphore` given: the supervisor's own default (the seed's 16 permits).
      yield* setup(target, transport, view(ranks))
      yield* TestClock.adjust("10 millis")
      expect(held.inFlight()).toBe(16)
      yield* held.release
      yield* TestClock.adjust("10 millis")
      expect(held.peak()).toBe(16)
      expect(held.inFlight()).toBe(0)
    })
  )

  it.effect("shutdown interrupts a recovery that holds its slot, so it cannot wait on it", () =>
    Effect.gen(function* () {
      const { calls, target } = recordingTarget()
      // The rebuild of a replacement never completes: its recovery holds the rank's slot lock.
      const stuck: RecoveryTarget = { ...target, replaceRank: () => Effect.never }
      const { transport } = scriptedTransport([
        () => Effect.succeed({ _tag: "TreeDump", events: [store(1, 1, rank(42, 0))], lastEventId: 1 })
      ])
      const exit = yield* Effect.scoped(
        Effect.gen(function* () {
          const { supervisor } = yield* setup(stuck, transport, view([[sourceFor(rank(42, 0), 1n, true), 4]]))
          yield* TestClock.adjust("5 millis")
          expect(yield* supervisor.healthSnapshot).toMatchObject({ sourcesRecovering: 1 })
          return yield* supervisor.shutdown.pipe(Effect.timeout("1 second"), Effect.fork)
        })
      ).pipe(Effect.flatMap((fiber) => Effect.zipRight(TestClock.adjust("2 seconds"), Fiber.await(fiber))))
      expect(Exit.isSuccess(exit)).toBe(true)
      expect(calls).toEqual([["Reset", 4, "Lifecycle"]])
    })
  )

  it.scoped(
    "an engine source that counts from seq 0 again is reset and restored; a live-only one reset and followed",
    () =>
      Effect.gen(function* () {
        const { calls, target } = recordingTarget()
        const engineSource = (worker: Rank, publisherId: bigint, replay: boolean): KvEventSource => ({
          kvStateEndpoint: KV_ENDPOINT,
          workerId: worker.workerId,
          dpRank: worker.dpRank,
          publisherId,
          transport: {
            kind: "engine-zmq",
            endpoint: "tcp://127.0.0.1:5557",
            topic: "",
            replayEndpoint: replay ? "tcp://127.0.0.1:5558" : null
          },
          recoveryTarget: null
        })
        const { transport, requests } = scriptedTransport([
          () => Effect.succeed({ _tag: "TreeDump", events: [], lastEventId: 0 }),
          () => Effect.succeed({ _tag: "TreeDump", events: [store(1, 9, rank(42, 0))], lastEventId: 1 })
        ])
        const { supervisor } = yield* setup(
          target,
          transport,
          view([
            [engineSource(rank(42, 0), 1n, true), 4],
            [engineSource(rank(42, 1), 2n, false), 5]
          ])
        )
        yield* TestClock.adjust("5 millis")
        for (const id of [1, 2, 3]) {
          yield* supervisor.handleLiveBatch(1n, [store(id, id, rank(42, 0))])
          yield* supervisor.handleLiveBatch(2n, [store(id, id, rank(42, 1))])
        }
        calls.length = 0
        // Both engines restarted: seq 0 (event id 1) again.
        yield* supervisor.handleLiveBatch(1n, [store(1, 9, rank(42, 0))])
        yield* supervisor.handleLiveBatch(2n, [store(1, 9, rank(42, 1))])
        yield* TestClock.adjust("5 millis")
        expect(requests.map((r) => r.request.startEventId)).toEqual([undefined, undefined])
        expect(calls).toEqual([
          ["Reset", 4, "Lifecycle"],
          ["Reset", 5, "Lifecycle"],
          ["Admit", 5, 1],
          ["Replace", 4, [1]],
          ["Initial", "42", 0]
        ])
        expect(yield* supervisor.counters).toMatchObject({ restarts: 2 })
        // Id 2 of the new incarnations follows on both.
        yield* supervisor.handleLiveBatch(1n, [store(2, 10, rank(42, 0))])
        yield* supervisor.handleLiveBatch(2n, [store(2, 10, rank(42, 1))])
        expect(calls.slice(-2)).toEqual([
          ["Admit", 4, 2],
          ["Admit", 5, 2]
        ])
        expect((yield* supervisor.healthSnapshot).sources.map((s) => s.state)).toEqual(["live", "live"])
      })
  )

  it.effect("closing the scope cancels recoveries and resets every active rank", () =>
    Effect.gen(function* () {
      const { calls, target } = recordingTarget()
      let dropped = false
      const { transport } = scriptedTransport([
        () => Effect.never.pipe(Effect.ensuring(Effect.sync(() => (dropped = true))))
      ])
      yield* Effect.scoped(
        Effect.gen(function* () {
          yield* setup(
            target,
            transport,
            view([
              [sourceFor(rank(42, 0), 1n, true), 4],
              [sourceFor(rank(42, 1), 2n, false), 5]
            ])
          )
          yield* TestClock.adjust("3 millis")
        })
      )
      expect(dropped).toBe(true)
      expect(calls).toEqual([
        ["Reset", 4, "Lifecycle"],
        ["Reset", 5, "Lifecycle"]
      ])
    })
  )
})
