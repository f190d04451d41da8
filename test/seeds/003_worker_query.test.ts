/**
 * Ports of the seed-003 tests (`kv_router/indexer/worker_query.rs`, 21 tests) against
 * `SourceSupervisor`, with a recording `RecoveryTarget`, an in-memory indexer target and scripted
 * `WorkerQueryTransport`s written here (the seed's RecordingTarget, BlockingTarget, MockTransport,
 * SelectiveTimeoutTransport, OrderedCancellationTransport, ControlledRecoveryEngine). Virtual time
 * (`TestClock`) drives the jitter, the attempt timeout and the retry backoff.
 */

import { describe, expect, it } from "@effect/vitest"
import { Deferred, type Duration, Effect, Either, Fiber, Option, SubscriptionRef, TestClock } from "effect"
import { hashPairsToBigInts } from "../../src/ckf/u64.js"
import {
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
import { internalsOf } from "../../src/recovery/internal/SourceSupervisorInternals.js"
import {
  type RecoveryResetReason,
  type RecoveryTarget,
  RecoveryTargetError,
  type SourceEpoch
} from "../../src/recovery/RecoveryTarget.js"
import * as SourceSupervisor from "../../src/recovery/SourceSupervisor.js"
import * as SourceSupervisorLive from "../../src/recovery/SourceSupervisorLive.js"
import {
  type WorkerKvQueryRequest,
  type WorkerKvQueryResponse,
  WorkerQueryError,
  type WorkerQueryTransport
} from "../../src/recovery/WorkerQuery.js"

// ---------------------------------------------------------------------------------------------
// Fixtures

const SERVING = new EndpointId({ namespace: "test", component: "router", endpoint: "generate" })
const KV_ENDPOINT = new EndpointId({ namespace: "test", component: "router", endpoint: "kv" })

interface Rank {
  readonly workerId: WorkerId
  readonly dpRank: DpRank
}
const rank = (workerId: number, dpRank: number): Rank => ({ workerId: String(workerId), dpRank })
const WORKER = rank(42, 4)

const sourceFor = (worker: Rank, publisherId: bigint, recoveryTarget: string | null): KvEventSource => ({
  kvStateEndpoint: KV_ENDPOINT,
  workerId: worker.workerId,
  dpRank: worker.dpRank,
  publisherId,
  transport: {
    kind: "dynamo-zmq",
    endpoint: `tcp://127.0.0.1:${5000 + Number(publisherId % 1000n)}`,
    topic: "kv-events"
  },
  recoveryTarget: recoveryTarget === null ? null : { endpoint: recoveryTarget }
})
/** The seed's `source(endpoint, publisher_id)`: worker 42 rank 4 with its own recovery target. */
const source = (publisherId: bigint): KvEventSource =>
  sourceFor(WORKER, publisherId, `tcp://127.0.0.1:9000/query-${publisherId}`)

const recoverable = (src: KvEventSource): KvSourceStatus => ({ _tag: "ActiveRecoverable", source: src })
const liveOnly = (src: KvEventSource): KvSourceStatus => ({ _tag: "ActiveLiveOnly", source: src })

const store = (eventId: number): RouterEvent =>
  storedEvent(WORKER.workerId, WORKER.dpRank, eventId, [eventId])
const storeFor = (worker: Rank, eventId: number): RouterEvent =>
  storedEvent(worker.workerId, worker.dpRank, eventId, [eventId])
const storeBlockFor = (worker: Rank, eventId: number, block: number): RouterEvent =>
  storedEvent(worker.workerId, worker.dpRank, eventId, [block])
const clearFor = (worker: Rank, eventId: number): RouterEvent =>
  clearedEvent(worker.workerId, worker.dpRank, eventId)

const membershipView = (
  sources: ReadonlyArray<readonly [Rank, KvSourceStatus, number]>
): KvSourceMembershipView => ({
  servingEndpoint: SERVING,
  endpointResolution: { _tag: "Resolved", endpoint: KV_ENDPOINT },
  ranks: new Map(
    sources.map(([worker, status, lifecycleGeneration]) => [
      rankKey(worker.workerId, worker.dpRank),
      {
        workerId: worker.workerId,
        dpRank: worker.dpRank,
        status,
        lifecycleGeneration,
        recoveryExpected: false
      }
    ])
  )
})
const EMPTY_VIEW = membershipView([])

const readySource = (src: KvEventSource, lifecycleGeneration: number): string =>
  SourceSupervisor.readySourceKey(src.publisherId, lifecycleGeneration)

// ---------------------------------------------------------------------------------------------
// Targets

type TargetCall =
  | readonly ["Admit", SourceEpoch, number]
  | readonly ["Replace", SourceEpoch]
  | readonly ["Reset", SourceEpoch, RecoveryResetReason]

const recordingTarget = () => {
  const calls: Array<TargetCall> = []
  const target: RecoveryTarget = {
    admitEvent: (epoch, event) => Effect.sync(() => void calls.push(["Admit", epoch, event.eventId])),
    replaceRank: (epoch) => Effect.sync(() => void calls.push(["Replace", epoch])),
    resetRank: (epoch, _workerId, _dpRank, reason) =>
      Effect.sync(() => void calls.push(["Reset", epoch, reason])),
    completeInitialRecovery: () => Effect.void
  }
  return { calls, target }
}

const stopped = () => new RecoveryTargetError({ reason: "Stopped", message: "KV indexer stopped" })

/**
 * The seed's real `KvIndexer` behind `IndexerRecoveryTarget`, reduced to what the tests observe:
 * the blocks each rank owns. After `shutdown` every command fails, as a closed event queue does.
 */
class FakeIndexer implements RecoveryTarget {
  private readonly ranks = new Map<RankKey, Set<bigint>>()
  private stoppedFlag = false

  shutdown(): void {
    this.stoppedFlag = true
  }

  private apply(event: RouterEvent): void {
    const key = rankKey(event.workerId, event.dpRank)
    const data = event.data
    if (data._tag === "Cleared") {
      this.ranks.delete(key)
      return
    }
    let blocks = this.ranks.get(key)
    if (blocks === undefined) {
      blocks = new Set()
      this.ranks.set(key, blocks)
    }
    for (const hash of hashPairsToBigInts(data.blockHashes)) {
      if (data._tag === "Stored") blocks.add(hash)
      else blocks.delete(hash)
    }
  }

  readonly admitEvent = (_epoch: SourceEpoch, event: RouterEvent) =>
    Effect.suspend(() => (this.stoppedFlag ? Effect.fail(stopped()) : Effect.sync(() => this.apply(event))))

  readonly replaceRank = (
    _epoch: SourceEpoch,
    workerId: WorkerId,
    dpRank: DpRank,
    events: ReadonlyArray<RouterEvent>
  ) =>
    Effect.suspend(() => {
      if (this.stoppedFlag) return Effect.fail(stopped())
      this.ranks.delete(rankKey(workerId, dpRank))
      for (const event of events) this.apply(event)
      return Effect.void
    })

  readonly resetRank = (_epoch: SourceEpoch, workerId: WorkerId, dpRank: DpRank) =>
    Effect.suspend(() =>
      this.stoppedFlag
        ? Effect.fail(stopped())
        : Effect.sync(() => void this.ranks.delete(rankKey(workerId, dpRank)))
    )

  readonly completeInitialRecovery = () => Effect.void

  blockCount(): number {
    let count = 0
    for (const blocks of this.ranks.values()) count += blocks.size
    return count
  }

  isEmpty(): boolean {
    return this.blockCount() === 0
  }

  containsBlock(block: number): boolean {
    for (const blocks of this.ranks.values()) if (blocks.has(BigInt(block))) return true
    return false
  }

  containsRankBlock(worker: Rank, block: number): boolean {
    return this.ranks.get(rankKey(worker.workerId, worker.dpRank))?.has(BigInt(block)) ?? false
  }

  /** Ranks that own at least one block. */
  indexedRanks(): Array<number> {
    return [...this.ranks.entries()]
      .filter(([, blocks]) => blocks.size > 0)
      .map(([key]) => Number(key.split("/")[1]))
      .sort((a, b) => a - b)
  }
}

// ---------------------------------------------------------------------------------------------
// Transports

/** Pops scripted responses; when `release` is given every query first waits for it. */
const mockTransport = (
  responses: Array<WorkerKvQueryResponse> = [],
  release?: Deferred.Deferred<void>
): WorkerQueryTransport => ({
  queryWorker: () =>
    Effect.gen(function* () {
      if (release !== undefined) yield* Deferred.await(release)
      const response = responses.pop()
      if (response === undefined)
        return yield* new WorkerQueryError({ message: "missing mock recovery response" })
      return response
    })
})

/** Polls `deferred`, advancing virtual time by `step` until it completes. */
const awaitAdvancing = <A, E>(
  deferred: Deferred.Deferred<A, E>,
  step: Duration.DurationInput = "1 millis",
  maxSteps = 10_000
) =>
  Effect.gen(function* () {
    for (let i = 0; i < maxSteps; i++) {
      const done = yield* Deferred.poll(deferred)
      if (Option.isSome(done)) return yield* done.value
      yield* TestClock.adjust(step)
    }
    return yield* Effect.dieMessage("deferred did not complete while advancing the test clock")
  })

const makeSupervisor = (
  target: RecoveryTarget,
  view: KvSourceMembershipView,
  transport: WorkerQueryTransport,
  options: {
    readonly recoverySemaphore?: Effect.Semaphore
    readonly recoveryAttemptTimeout?: Duration.DurationInput
  } = {}
) =>
  Effect.gen(function* () {
    const membership = yield* SubscriptionRef.make(view)
    const supervisor = yield* SourceSupervisorLive.make({ target, transport, membership, ...options })
    return { supervisor, membership }
  })

const slotOf = (supervisor: SourceSupervisor.SourceSupervisor, worker: Rank) => {
  const slot = internalsOf(supervisor).slot(worker.workerId, worker.dpRank)
  if (slot === undefined) throw new Error(`no slot for ${worker.workerId}/${worker.dpRank}`)
  return slot
}

const bindingOf = (supervisor: SourceSupervisor.SourceSupervisor, publisherId: bigint) => {
  const binding = internalsOf(supervisor).publisherBinding(publisherId)
  if (binding === undefined) throw new Error(`publisher ${publisherId} is not active`)
  return binding
}

// ---------------------------------------------------------------------------------------------

describe("seed 003: worker_query.rs", () => {
  it.scoped("direct_transport_gate_requires_the_exact_source_generation", () =>
    Effect.gen(function* () {
      const src = sourceFor(WORKER, 100n, null)
      const view = membershipView([[WORKER, liveOnly(src), 7]])
      const { supervisor } = yield* makeSupervisor(recordingTarget().target, view, mockTransport())

      yield* supervisor.syncMembershipWithReadySources(new Set())
      expect(internalsOf(supervisor).publisherBinding(src.publisherId)).toBeUndefined()

      yield* supervisor.syncMembershipWithReadySources(new Set([readySource(src, 6)]))
      expect(internalsOf(supervisor).publisherBinding(src.publisherId)).toBeUndefined()

      yield* supervisor.syncMembershipWithReadySources(new Set([readySource(src, 7)]))
      expect(internalsOf(supervisor).publisherBinding(src.publisherId)).toBeDefined()
    })
  )

  it.scoped("transport_fence_resets_before_same_generation_reactivation", () =>
    Effect.gen(function* () {
      const src = sourceFor(WORKER, 100n, null)
      const view = membershipView([[WORKER, liveOnly(src), 7]])
      const { calls, target } = recordingTarget()
      const { supervisor } = yield* makeSupervisor(target, view, mockTransport())
      const ready = new Set([readySource(src, 7)])
      yield* supervisor.syncMembershipWithReadySources(ready)
      yield* supervisor.handleLiveBatch(100n, [store(1)])
      calls.length = 0

      expect(yield* supervisor.fenceTransport(100n)).toBe(true)
      expect(internalsOf(supervisor).publisherBinding(100n)).toBeUndefined()
      yield* supervisor.handleLiveBatch(100n, [store(2)])
      expect(calls).toEqual([["Reset", 7, "Lifecycle"]])

      yield* supervisor.syncMembershipWithReadySources(ready)
      expect(internalsOf(supervisor).publisherBinding(100n)).toBeDefined()
      yield* supervisor.handleLiveBatch(100n, [store(3)])
      expect(calls).toEqual([
        ["Reset", 7, "Lifecycle"],
        ["Admit", 7, 3]
      ])
    })
  )

  it.scoped("independent_source_handlers_enter_worker_query_concurrently_and_keep_fifo", () =>
    Effect.gen(function* () {
      const workerA = rank(42, 4)
      const workerB = rank(43, 4)
      const sourceA = sourceFor(workerA, 100n, null)
      const sourceB = sourceFor(workerB, 200n, null)
      const view = membershipView([
        [workerA, liveOnly(sourceA), 1],
        [workerB, liveOnly(sourceB), 1]
      ])
      // BlockingTarget: admission of worker A's event 1 blocks until released.
      const blockedStarted = yield* Deferred.make<void>()
      const blockedRelease = yield* Deferred.make<void>()
      const otherAdmitted = yield* Deferred.make<void>()
      const calls: Array<readonly [WorkerId, number]> = []
      const target: RecoveryTarget = {
        admitEvent: (_epoch, event) =>
          Effect.gen(function* () {
            if (event.workerId === workerA.workerId && event.eventId === 1) {
              yield* Deferred.succeed(blockedStarted, undefined)
              yield* Deferred.await(blockedRelease)
            }
            calls.push([event.workerId, event.eventId])
            if (event.workerId !== workerA.workerId) yield* Deferred.succeed(otherAdmitted, undefined)
          }),
        replaceRank: () => Effect.void,
        resetRank: () => Effect.void,
        completeInitialRecovery: () => Effect.void
      }
      const { supervisor } = yield* makeSupervisor(target, view, mockTransport())
      yield* supervisor.syncMembershipWithReadySources(
        new Set([readySource(sourceA, 1), readySource(sourceB, 1)])
      )

      const taskA = yield* Effect.fork(
        supervisor.handleLiveBatch(100n, [storeFor(workerA, 1), storeFor(workerA, 2)])
      )
      // source A should block inside admission
      yield* Deferred.await(blockedStarted)

      const taskB = yield* Effect.fork(
        supervisor.handleLiveBatch(200n, [storeFor(workerB, 1), storeFor(workerB, 2)])
      )
      // source B should enter admission while source A is blocked
      yield* Deferred.await(otherAdmitted)

      yield* Deferred.succeed(blockedRelease, undefined)
      yield* Fiber.join(taskA)
      yield* Fiber.join(taskB)
      const idsOf = (worker: Rank) =>
        calls.filter(([id]) => id === worker.workerId).map(([, eventId]) => eventId)
      expect(idsOf(workerA)).toEqual([1, 2])
      expect(idsOf(workerB)).toEqual([1, 2])
    })
  )

  it.scoped("exact_removal_and_stale_recovery_are_fenced_by_publisher", () =>
    Effect.gen(function* () {
      const indexer = new FakeIndexer()
      const release = yield* Deferred.make<void>()
      const transport = mockTransport([{ _tag: "TreeDump", events: [store(100)], lastEventId: 100 }], release)
      const old = source(100n)
      const replacement = sourceFor(WORKER, 205n, null)
      const initial = membershipView([[WORKER, recoverable(old), 0]])
      const { supervisor } = yield* makeSupervisor(indexer, initial, transport)

      yield* internalsOf(supervisor).reconcileView(initial)
      const oldBinding = bindingOf(supervisor, 100n)
      yield* internalsOf(supervisor).reconcileView(
        membershipView([
          [WORKER, { _tag: "Ambiguous", reason: { _tag: "Incarnations", publisherIds: [100n, 205n] } }, 1]
        ])
      )
      expect(internalsOf(supervisor).publisherBinding(100n)).toBeUndefined()
      expect(internalsOf(supervisor).publisherBinding(205n)).toBeUndefined()

      yield* internalsOf(supervisor).reconcileView(membershipView([[WORKER, liveOnly(replacement), 2]]))
      expect(internalsOf(supervisor).publisherBinding(100n)).toBeUndefined()
      expect(internalsOf(supervisor).publisherBinding(205n)).toBeDefined()

      yield* internalsOf(supervisor).finishRecovery(
        oldBinding,
        Either.right({ _tag: "TreeDump", events: [store(100)], lastEventId: 100 })
      )
      yield* Deferred.succeed(release, undefined)
      yield* supervisor.handleLiveBatch(100n, [store(101)])
      yield* supervisor.handleLiveBatch(205n, [storeFor(WORKER, 1)])
      yield* supervisor.handleLiveBatch(100n, [clearFor(WORKER, 102)])
      expect(indexer.containsBlock(100)).toBe(false)
      expect(indexer.containsBlock(101)).toBe(false)
      expect(indexer.containsRankBlock(WORKER, 1)).toBe(true)
    })
  )

  it.scoped("coalesced_overlap_resets_even_when_the_same_publisher_remains", () =>
    Effect.gen(function* () {
      const src = sourceFor(WORKER, 100n, null)
      const initial = membershipView([[WORKER, liveOnly(src), 0]])
      const indexer = new FakeIndexer()
      const { supervisor } = yield* makeSupervisor(indexer, initial, mockTransport())

      yield* internalsOf(supervisor).reconcileView(initial)
      yield* supervisor.handleLiveBatch(100n, [storeFor(WORKER, 1)])
      expect(indexer.containsBlock(1)).toBe(true)

      // The watch may coalesce A -> ambiguous(A, B) -> A. The cumulative lifecycle generation
      // still requires the consumer to fence and cold-reset A.
      yield* internalsOf(supervisor).reconcileView(membershipView([[WORKER, liveOnly(src), 2]]))
      expect(indexer.isEmpty()).toBe(true)
      expect(internalsOf(supervisor).publisherBinding(100n)).toBeDefined()
    })
  )

  it.scoped("removed_rank_tombstone_forces_reset_before_new_generation_reappears", () =>
    Effect.gen(function* () {
      const initial = membershipView([[WORKER, liveOnly(sourceFor(WORKER, 100n, null)), 3]])
      const { calls, target } = recordingTarget()
      const { supervisor } = yield* makeSupervisor(target, initial, mockTransport())

      yield* internalsOf(supervisor).reconcileView(initial)
      calls.length = 0
      yield* internalsOf(supervisor).reconcileView(EMPTY_VIEW)
      expect(calls).toEqual([["Reset", 3, "Lifecycle"]])

      calls.length = 0
      yield* internalsOf(supervisor).reconcileView(
        membershipView([[WORKER, liveOnly(sourceFor(WORKER, 205n, null)), 4]])
      )
      expect(calls).toEqual([["Reset", 4, "Lifecycle"]])
      expect(internalsOf(supervisor).publisherBinding(205n)).toBeDefined()
    })
  )

  it.scoped("timed_out_recovery_releases_shared_permit_before_backoff", () =>
    Effect.gen(function* () {
      // SelectiveTimeoutTransport: worker 1 never answers; every other worker answers at once.
      const slowStarted = yield* Deferred.make<void>()
      const transport: WorkerQueryTransport = {
        queryWorker: (_source, request) =>
          request.workerId === "1"
            ? Deferred.succeed(slowStarted, undefined).pipe(Effect.zipRight(Effect.never))
            : Effect.succeed({ _tag: "TreeDumpFailed", lastEventId: 0, message: "test" })
      }
      const { supervisor } = yield* makeSupervisor(recordingTarget().target, EMPTY_VIEW, transport, {
        recoverySemaphore: yield* Effect.makeSemaphore(1),
        recoveryAttemptTimeout: "20 millis"
      })
      const slowSource = sourceFor(rank(1, 0), 1n, "tcp://127.0.0.1:9000/query-1")
      const healthySource = sourceFor(rank(2, 0), 2n, "tcp://127.0.0.1:9000/query-2")
      const slow = yield* Effect.fork(
        internalsOf(supervisor).fetchRecoveryResponse(slowSource, undefined, undefined)
      )
      yield* Deferred.await(slowStarted)

      const healthy = yield* Effect.fork(
        internalsOf(supervisor)
          .fetchRecoveryResponse(healthySource, undefined, undefined)
          .pipe(
            Effect.timeoutFail({
              duration: "100 millis",
              onTimeout: () => "healthy recovery remained blocked behind another target's retry backoff"
            })
          )
      )
      yield* TestClock.adjust("100 millis")
      const response = yield* Fiber.join(healthy)
      expect(response._tag).toBe("TreeDumpFailed")
      yield* Fiber.interrupt(slow)
    })
  )

  it.scoped("stale_target_fault_does_not_reset_or_fence_the_replacement_epoch", () =>
    Effect.gen(function* () {
      const view = membershipView([[WORKER, liveOnly(sourceFor(WORKER, 205n, null)), 3]])
      const { calls, target } = recordingTarget()
      const { supervisor } = yield* makeSupervisor(target, view, mockTransport())
      yield* internalsOf(supervisor).reconcileView(view)

      expect(yield* supervisor.handleTargetFault(WORKER.workerId, WORKER.dpRank, 2, true)).toBe("Stale")
      expect(calls).toEqual([])
      expect(internalsOf(supervisor).publisherBinding(205n)).toBeDefined()
    })
  )

  it.scoped("rejected_source_stays_ineligible_until_generation_advances", () =>
    Effect.gen(function* () {
      const src = sourceFor(WORKER, 205n, null)
      const view = membershipView([[WORKER, liveOnly(src), 3]])
      const { supervisor } = yield* makeSupervisor(recordingTarget().target, view, mockTransport())
      yield* internalsOf(supervisor).reconcileView(view)

      expect(yield* supervisor.rejectSource(WORKER.workerId, WORKER.dpRank, 3)).toBe("Fenced")
      expect(internalsOf(supervisor).publisherBinding(205n)).toBeUndefined()
      yield* internalsOf(supervisor).reconcileView(view)
      expect(internalsOf(supervisor).publisherBinding(205n)).toBeUndefined()

      yield* internalsOf(supervisor).reconcileView(membershipView([[WORKER, liveOnly(src), 4]]))
      expect(internalsOf(supervisor).publisherBinding(205n)).toBeDefined()
    })
  )

  it.scoped("live_admission_carries_the_source_lifecycle_epoch", () =>
    Effect.gen(function* () {
      const view = membershipView([[WORKER, liveOnly(sourceFor(WORKER, 205n, null)), 7]])
      const { calls, target } = recordingTarget()
      const { supervisor } = yield* makeSupervisor(target, view, mockTransport())
      yield* internalsOf(supervisor).reconcileView(view)

      yield* supervisor.handleLiveBatch(205n, [storeFor(WORKER, 1)])
      expect(calls).toEqual([["Admit", 7, 1]])
    })
  )

  it.scoped("failed_reset_retains_generation_fence_and_slot", () =>
    Effect.gen(function* () {
      const initial = membershipView([[WORKER, liveOnly(sourceFor(WORKER, 100n, null)), 0]])
      const indexer = new FakeIndexer()
      const { supervisor } = yield* makeSupervisor(indexer, initial, mockTransport())
      yield* internalsOf(supervisor).reconcileView(initial)

      indexer.shutdown()
      const replacement = membershipView([[WORKER, liveOnly(sourceFor(WORKER, 205n, null)), 1]])
      yield* internalsOf(supervisor).reconcileView(replacement)
      yield* internalsOf(supervisor).reconcileView(replacement)

      const slot = slotOf(supervisor, WORKER)
      expect(slot.active).toBeUndefined()
      expect(slot.resetPending).toBe(true)
      expect(slot.lifecycleGeneration).toBe(0)
      expect(internalsOf(supervisor).publisherBinding(205n)).toBeUndefined()

      yield* internalsOf(supervisor).reconcileView(EMPTY_VIEW)
      expect(internalsOf(supervisor).slot(WORKER.workerId, WORKER.dpRank)).toBeDefined()
      expect(slotOf(supervisor, WORKER).resetPending).toBe(true)
    })
  )

  it.scoped("live_clear_enqueue_failure_does_not_advance_cursor_and_fences_rank", () =>
    Effect.gen(function* () {
      const view = membershipView([[WORKER, liveOnly(sourceFor(WORKER, 100n, null)), 0]])
      const indexer = new FakeIndexer()
      const { supervisor } = yield* makeSupervisor(indexer, view, mockTransport())
      yield* internalsOf(supervisor).reconcileView(view)
      indexer.shutdown()

      yield* supervisor.handleLiveBatch(100n, [clearFor(WORKER, 1)])

      const slot = slotOf(supervisor, WORKER)
      expect(slot.lastAdmittedId).toBeUndefined()
      expect(slot.resetPending).toBe(true)
    })
  )

  it.scoped("replacement_joins_old_recovery_before_rebinding", () =>
    Effect.gen(function* () {
      const sharedTarget = "tcp://127.0.0.1:9000/query-100"
      const initial = membershipView([[WORKER, recoverable(sourceFor(WORKER, 100n, sharedTarget)), 0]])
      // OrderedCancellationTransport: the query never answers and records when it is dropped.
      const queryStarted = yield* Deferred.make<void>()
      let queryDropped = false
      const transport: WorkerQueryTransport = {
        queryWorker: () =>
          Deferred.succeed(queryStarted, undefined).pipe(
            Effect.zipRight(Effect.never),
            Effect.ensuring(Effect.sync(() => (queryDropped = true)))
          )
      }
      const { supervisor } = yield* makeSupervisor(new FakeIndexer(), initial, transport)
      yield* internalsOf(supervisor).reconcileView(initial)
      yield* awaitAdvancing(queryStarted)

      const replacement = membershipView([[WORKER, recoverable(sourceFor(WORKER, 205n, sharedTarget)), 1]])
      yield* internalsOf(supervisor).reconcileView(replacement)
      expect(queryDropped).toBe(true)
      expect(internalsOf(supervisor).publisherBinding(205n)).toBeDefined()
    })
  )

  it.scoped("foreign_clear_recovery_fences_rank_without_live_event_salvage", () =>
    Effect.gen(function* () {
      const view = membershipView([[WORKER, recoverable(source(100n)), 0]])
      const indexer = new FakeIndexer()
      const transport = mockTransport([], yield* Deferred.make<void>())
      const { supervisor } = yield* makeSupervisor(indexer, view, transport)
      yield* internalsOf(supervisor).reconcileView(view)
      yield* supervisor.handleLiveBatch(100n, [store(1)])
      const binding = bindingOf(supervisor, 100n)

      yield* internalsOf(supervisor).finishRecovery(
        binding,
        Either.right({ _tag: "Events", events: [clearFor(rank(99, 4), 2)], lastEventId: 2 })
      )

      expect(indexer.containsBlock(1)).toBe(false)
      const slot = slotOf(supervisor, WORKER)
      expect(slot.recoveryInflight).toBe(false)
      expect(slot.resetPending).toBe(true)
    })
  )

  it.scoped("clear_tree_dump_reset_failure_keeps_rank_fenced", () =>
    Effect.gen(function* () {
      const view = membershipView([[WORKER, recoverable(source(100n)), 0]])
      const indexer = new FakeIndexer()
      const transport = mockTransport([], yield* Deferred.make<void>())
      const { supervisor } = yield* makeSupervisor(indexer, view, transport)
      yield* internalsOf(supervisor).reconcileView(view)
      yield* supervisor.handleLiveBatch(100n, [store(1)])
      const binding = bindingOf(supervisor, 100n)
      indexer.shutdown()

      yield* internalsOf(supervisor).finishRecovery(
        binding,
        Either.right({ _tag: "TreeDump", events: [clearFor(WORKER, 2)], lastEventId: 2 })
      )

      const slot = slotOf(supervisor, WORKER)
      expect(slot.recoveryInflight).toBe(false)
      expect(slot.lastAdmittedId).toBeUndefined()
      expect(slot.resetPending).toBe(true)
    })
  )

  it.scoped("explicit_dump_failure_resets_with_reason_then_drains_newer_events_once", () =>
    Effect.gen(function* () {
      const view = membershipView([[WORKER, recoverable(source(100n)), 0]])
      const transport = mockTransport([], yield* Deferred.make<void>())
      const { calls, target } = recordingTarget()
      const { supervisor } = yield* makeSupervisor(target, view, transport)
      yield* internalsOf(supervisor).reconcileView(view)
      yield* supervisor.handleLiveBatch(100n, [store(2)])
      const binding = bindingOf(supervisor, 100n)

      yield* internalsOf(supervisor).finishRecovery(
        binding,
        Either.right({ _tag: "TreeDumpFailed", lastEventId: 1, message: "snapshot unavailable" })
      )

      expect(calls).toEqual([
        ["Reset", 0, "TreeDumpFailed"],
        ["Admit", 0, 2]
      ])
      const slot = slotOf(supervisor, WORKER)
      expect(slot.lastAdmittedId).toBe(2)
      expect(slot.recoveryInflight).toBe(false)
      expect(slot.resetPending).toBe(false)
      yield* supervisor.shutdown
    })
  )

  it.scoped("gap_recovery_resets_before_full_snapshot_and_ordered_live_drain", () =>
    Effect.gen(function* () {
      const view = membershipView([[WORKER, recoverable(source(100n)), 0]])
      const indexer = new FakeIndexer()
      const transport = mockTransport([], yield* Deferred.make<void>())
      const { supervisor } = yield* makeSupervisor(indexer, view, transport)
      yield* internalsOf(supervisor).reconcileView(view)
      const binding = bindingOf(supervisor, 100n)

      yield* supervisor.handleLiveBatch(100n, [store(1)])
      yield* internalsOf(supervisor).finishRecovery(
        binding,
        Either.right({ _tag: "TreeDump", events: [store(1)], lastEventId: 1 })
      )
      expect(indexer.containsBlock(1)).toBe(true)

      yield* supervisor.handleLiveBatch(100n, [store(3)])
      yield* supervisor.handleLiveBatch(100n, [store(4)])
      expect(slotOf(supervisor, WORKER).lastAdmittedId).toBe(1)
      expect(indexer.isEmpty()).toBe(true)

      yield* internalsOf(supervisor).finishRecovery(
        binding,
        Either.right({ _tag: "TreeDump", events: [store(1), store(2)], lastEventId: 2 })
      )

      for (let block = 1; block <= 4; block++) expect(indexer.containsBlock(block)).toBe(true)
      const slot = slotOf(supervisor, WORKER)
      expect(slot.lastAdmittedId).toBe(4)
      expect(slot.recoveryInflight).toBe(false)
      yield* supervisor.shutdown
    })
  )

  it.scoped("foreign_event_rejects_the_entire_envelope_before_index_mutation", () =>
    Effect.gen(function* () {
      const view = membershipView([[WORKER, liveOnly(sourceFor(WORKER, 100n, null)), 0]])
      const indexer = new FakeIndexer()
      const { supervisor } = yield* makeSupervisor(indexer, view, mockTransport())
      yield* internalsOf(supervisor).reconcileView(view)

      const foreign = storeFor(rank(99, 4), 2)
      yield* supervisor.handleLiveBatch(100n, [storeFor(WORKER, 1), foreign])

      expect(indexer.isEmpty()).toBe(true)
    })
  )

  it.scoped("live_clear_only_removes_the_emitting_rank", () =>
    Effect.gen(function* () {
      const indexer = new FakeIndexer()
      const rank4 = rank(42, 4)
      const rank5 = rank(42, 5)
      const view = membershipView([
        [rank4, liveOnly(sourceFor(rank4, 100n, null)), 0],
        [rank5, liveOnly(sourceFor(rank5, 205n, null)), 0]
      ])
      const { supervisor } = yield* makeSupervisor(indexer, view, mockTransport())
      yield* internalsOf(supervisor).reconcileView(view)

      yield* supervisor.handleLiveBatch(100n, [storeFor(rank4, 1)])
      yield* supervisor.handleLiveBatch(205n, [storeFor(rank5, 1)])
      expect(indexer.blockCount()).toBe(2)

      yield* supervisor.handleLiveBatch(100n, [clearFor(rank4, 2)])
      expect(indexer.containsRankBlock(rank4, 1)).toBe(false)
      expect(indexer.containsRankBlock(rank5, 1)).toBe(true)
    })
  )

  it.scoped("recovered_clear_only_removes_the_recovered_rank", () =>
    Effect.gen(function* () {
      const indexer = new FakeIndexer()
      const rank4 = rank(42, 4)
      const rank5 = rank(42, 5)
      const view = membershipView([
        [rank4, liveOnly(sourceFor(rank4, 100n, null)), 0],
        [rank5, liveOnly(sourceFor(rank5, 205n, null)), 0]
      ])
      const { supervisor } = yield* makeSupervisor(indexer, view, mockTransport())
      yield* internalsOf(supervisor).reconcileView(view)
      yield* supervisor.handleLiveBatch(100n, [storeFor(rank4, 1)])
      yield* supervisor.handleLiveBatch(205n, [storeFor(rank5, 1)])

      const binding = bindingOf(supervisor, 100n)
      yield* internalsOf(supervisor).finishRecovery(
        binding,
        Either.right({ _tag: "Events", events: [clearFor(rank4, 2)], lastEventId: 2 })
      )

      expect(indexer.containsRankBlock(rank4, 1)).toBe(false)
      expect(indexer.containsRankBlock(rank5, 1)).toBe(true)
    })
  )

  // The seed builds four distributed runtimes, real discovery and ZeroMQ publishers. This port
  // keeps its supervisor-level script (membership generations as the coordinator computes them,
  // batches routed by publisher id, the delayed recovery of global rank 4); the same name in
  // test/integration/zmq-recovery.test.ts runs the seed's whole pipeline over twelve real PUB
  // sockets, discovery and the KV source coordinator (the seed's router mismatch gauge has no
  // kvrelay counterpart).
  it.scoped(
    "direct_zmq_multi_node_replacement_isolated_by_global_rank (supervisor level; sockets and discovery in test/integration/zmq-recovery.test.ts)",
    () =>
      Effect.gen(function* () {
        const logicalWorker = 7001
        const globalRank = (dpRank: number) => rank(logicalWorker, dpRank)
        const delayedRank = globalRank(4)
        const node0 = [0, 1, 2, 3].map((r) => sourceFor(globalRank(r), 1000n + BigInt(r), null))
        const oldNode1 = [4, 5, 6, 7].map((r) =>
          sourceFor(
            globalRank(r),
            2000n + BigInt(r),
            r === 4 ? "tcp://127.0.0.1:9000/controlled-kv-recovery" : null
          )
        )
        const replacementNode1 = [4, 5, 6, 7].map((r) => sourceFor(globalRank(r), 3000n + BigInt(r), null))
        const active = (src: KvEventSource) =>
          src.recoveryTarget === null ? liveOnly(src) : recoverable(src)

        // ControlledRecoveryEngine: the first query answers an empty dump, later ones wait.
        let engineCalls = 0
        const delayedStarted = yield* Deferred.make<void>()
        const delayedRelease = yield* Deferred.make<void>()
        const delayedFinished = yield* Deferred.make<void>()
        const requests: Array<WorkerKvQueryRequest> = []
        const transport: WorkerQueryTransport = {
          queryWorker: (_source, request) =>
            Effect.suspend(() => {
              requests.push(request)
              engineCalls += 1
              if (engineCalls === 1) {
                return Effect.succeed<WorkerKvQueryResponse>({ _tag: "TreeDump", events: [], lastEventId: 0 })
              }
              return Deferred.succeed(delayedStarted, undefined).pipe(
                Effect.zipRight(Deferred.await(delayedRelease)),
                Effect.as<WorkerKvQueryResponse>({
                  _tag: "Events",
                  events: [storeFor(delayedRank, 2)],
                  lastEventId: 2
                }),
                Effect.ensuring(Deferred.succeed(delayedFinished, undefined))
              )
            })
        }

        const indexer = new FakeIndexer()
        const generations = new Map<number, number>([0, 1, 2, 3, 4, 5, 6, 7].map((r) => [r, 0]))
        const viewWith = (node1: (index: number) => KvSourceStatus) =>
          membershipView([
            ...node0.map((src, r) => [globalRank(r), active(src), generations.get(r)!] as const),
            ...oldNode1.map((_, i) => [globalRank(4 + i), node1(i), generations.get(4 + i)!] as const)
          ])
        const { supervisor, membership } = yield* makeSupervisor(
          indexer,
          viewWith((i) => active(oldNode1[i]!)),
          transport
        )
        yield* supervisor.syncMembership
        // The initial restore of the recoverable rank (full restores wait up to 3 ms of jitter).
        yield* TestClock.adjust("3 millis")
        expect(engineCalls).toBe(1)
        expect(slotOf(supervisor, delayedRank).recoveryInflight).toBe(false)

        const publish = (sources: ReadonlyArray<KvEventSource>, event: (worker: Rank) => RouterEvent) =>
          Effect.forEach(
            sources,
            (src) => supervisor.handleLiveBatch(src.publisherId, [event(globalRank(src.dpRank))]),
            {
              discard: true
            }
          )
        const blocks = (eventId: number, base: number) => (worker: Rank) =>
          storeBlockFor(worker, eventId, base + worker.dpRank)

        yield* publish(node0, blocks(1, 100))
        yield* publish(oldNode1, blocks(1, 100))
        for (let r = 0; r < 8; r++) expect(indexer.containsRankBlock(globalRank(r), 100 + r)).toBe(true)
        expect(indexer.indexedRanks()).toEqual([0, 1, 2, 3, 4, 5, 6, 7])

        // Clearing the node-1 ranks must not disturb the surviving node-0 rank slice.
        yield* publish(oldNode1, (worker) => clearFor(worker, 2))
        for (let r = 0; r < 4; r++) expect(indexer.containsRankBlock(globalRank(r), 100 + r)).toBe(true)
        expect(indexer.indexedRanks()).toEqual([0, 1, 2, 3])
        // Node-1 ranks resume after their rank-local clears.
        yield* publish(oldNode1, blocks(3, 150))
        for (let r = 4; r < 8; r++) expect(indexer.containsRankBlock(globalRank(r), 150 + r)).toBe(true)

        // A gap on the recoverable rank: reset, then a full restore that stays in flight.
        yield* supervisor.handleLiveBatch(oldNode1[0]!.publisherId, [storeBlockFor(delayedRank, 5, 903)])
        yield* awaitAdvancing(delayedStarted)
        expect(engineCalls).toBe(2)
        expect(
          requests.every((request) => request.workerId === delayedRank.workerId && request.dpRank === 4)
        ).toBe(true)
        expect(indexer.containsRankBlock(delayedRank, 154)).toBe(false)

        // The replacement node-1 publishers overlap the old ones: rank-local ambiguity.
        for (let r = 4; r < 8; r++) generations.set(r, generations.get(r)! + 1)
        yield* SubscriptionRef.set(
          membership,
          viewWith((i) => ({
            _tag: "Ambiguous",
            reason: {
              _tag: "Incarnations",
              publisherIds: [oldNode1[i]!.publisherId, replacementNode1[i]!.publisherId]
            }
          }))
        )
        yield* supervisor.syncMembership
        // Only the overlapping node-1 rank slice fails KV closed.
        for (let r = 0; r < 4; r++) expect(indexer.containsRankBlock(globalRank(r), 100 + r)).toBe(true)
        expect(indexer.indexedRanks()).toEqual([0, 1, 2, 3])
        // The delayed recovery was cancelled with its binding.
        expect(Option.isSome(yield* Deferred.poll(delayedFinished))).toBe(true)

        // The old node-1 sources are withdrawn: the replacement slice becomes selectable.
        for (let r = 4; r < 8; r++) generations.set(r, generations.get(r)! + 1)
        yield* SubscriptionRef.set(
          membership,
          viewWith((i) => active(replacementNode1[i]!))
        )
        yield* supervisor.syncMembership
        yield* publish(replacementNode1, blocks(1, 200))
        for (let r = 4; r < 8; r++) expect(indexer.containsRankBlock(globalRank(r), 200 + r)).toBe(true)

        yield* Deferred.succeed(delayedRelease, undefined)
        yield* TestClock.adjust("1 second")
        // Old publishers no longer route anywhere; the replacements keep applying live state.
        yield* publish(oldNode1, blocks(4, 400))
        yield* publish(replacementNode1, blocks(2, 300))

        for (let r = 0; r < 4; r++) expect(indexer.containsRankBlock(globalRank(r), 100 + r)).toBe(true)
        for (let r = 4; r < 8; r++) {
          const worker = globalRank(r)
          expect(indexer.containsRankBlock(worker, 200 + r)).toBe(true)
          expect(indexer.containsRankBlock(worker, 300 + r)).toBe(true)
          expect(indexer.containsRankBlock(worker, 100 + r)).toBe(false)
          expect(indexer.containsRankBlock(worker, 400 + r)).toBe(false)
        }
        expect(indexer.containsRankBlock(delayedRank, 2)).toBe(false)
        expect(engineCalls).toBe(2)

        yield* supervisor.shutdown
        expect(indexer.isEmpty()).toBe(true)
        expect(internalsOf(supervisor).slotCount()).toBe(0)
      })
  )
})
