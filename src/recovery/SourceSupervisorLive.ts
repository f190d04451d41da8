/**
 * The source supervisor's implementation (seed 003, `kv_dc_relay/source_supervisor.rs`): one
 * slot per expected (worker, dp rank) with its cursor, bindings by publisher id for the live
 * path, and recoveries by worker query under a relay-wide permit limit. The contract is
 * `SourceSupervisor.ts`; a slot's state is `internal/SourceSlot.ts`; the test-only entry points
 * are `internal/SourceSupervisorInternals.ts`.
 *
 * Length: `make` is one closure over the supervisor's slots, publisher bindings and running
 * recoveries; the live path, recovery and reconciliation each change them in synchronous blocks
 * whose invariants (one active binding per rank, one recovery per slot) are read in one place.
 */

import {
  Duration,
  Effect,
  Either,
  Equal,
  FiberMap,
  FiberSet,
  Option,
  Random,
  Schedule,
  type Scope
} from "effect"
import {
  activeSource,
  isRecoverableSource,
  type KvEventSource,
  type KvSourceMembershipView,
  type KvSourceStatus,
  type RankKey,
  rankKey
} from "../protocol/Discovery.js"
import type { DpRank, RouterEvent, WorkerId } from "../protocol/Events.js"
import { makeFifoSemaphore } from "./FifoSemaphore.js"
import {
  type ActivePublisherBinding,
  countDrop,
  describeResponse,
  type MutableBinding,
  type RecoveryTask,
  recoveryEventsMatchSource,
  SourceSlot
} from "./internal/SourceSlot.js"
import {
  registerInternals,
  type SourceSlotSnapshot,
  type SourceSupervisorInternals
} from "./internal/SourceSupervisorInternals.js"
import { type CommitGroup, commitGroups, type LiveEventAction, RankState } from "./RankState.js"
import type { RecoveryResetReason, RecoveryTargetError, SourceEpoch } from "./RecoveryTarget.js"
import {
  DEFAULT_RECOVERY_ATTEMPT_TIMEOUT,
  FULL_RESTORE_JITTER_MICROS,
  RECOVERY_CONCURRENCY_LIMIT,
  RECOVERY_INITIAL_BACKOFF_MS,
  RECOVERY_MAX_RETRIES,
  type RejectedSourceEntry,
  readySourceKey,
  type SourceStateEntry,
  type SourceSupervisor,
  type SourceSupervisorCounters,
  type SourceSupervisorHealth,
  type SourceSupervisorOptions,
  type TargetFaultDisposition
} from "./SourceSupervisor.js"
import { type WorkerKvQueryRequest, type WorkerKvQueryResponse, WorkerQueryError } from "./WorkerQuery.js"

const CONTINUE = Effect.succeed(true)

/** Span attribute of a recovery attempt: the response tag, `Timeout` or `TransportError`. */
const OUTCOME = "kvrelay.recovery.outcome"

/** 200 ms × 2^k after failed attempt k, no sleep after the last of the 8 attempts. */
const recoveryRetrySchedule = Schedule.exponential(Duration.millis(RECOVERY_INITIAL_BACKOFF_MS), 2).pipe(
  Schedule.intersect(Schedule.recurs(RECOVERY_MAX_RETRIES - 1))
)

/** A source supervisor in the current scope. */
export const make = (options: SourceSupervisorOptions): Effect.Effect<SourceSupervisor, never, Scope.Scope> =>
  Effect.gen(function* () {
    const { target, transport } = options
    const recoverySemaphore =
      options.recoverySemaphore ?? (yield* makeFifoSemaphore(RECOVERY_CONCURRENCY_LIMIT))
    const attemptTimeout = Duration.decode(options.recoveryAttemptTimeout ?? DEFAULT_RECOVERY_ATTEMPT_TIMEOUT)
    const membershipSync = yield* Effect.makeSemaphore(1)
    const recoveries = yield* FiberMap.make<RankKey>()
    // Recovery fibers are roots owned by the FiberMap (not children of whichever fiber launched
    // them, which may be a short-lived batch handler), on the runtime captured here.
    const runRecovery = yield* FiberMap.runtime(recoveries)<never>()
    const helpers = yield* FiberSet.make()
    const runHelper = yield* FiberSet.runtime(helpers)<never>()

    const slots = new Map<RankKey, SourceSlot>()
    const generationTombstones = new Map<RankKey, number>()
    /** Immutable publisher binding and rank slot lookup performed once per event envelope. */
    const publisherBindings = new Map<bigint, ActivePublisherBinding>()
    const recoveryTasks = new Map<RankKey, RecoveryTask>()
    /** The seed's root cancellation token: every binding lifetime is its child. */
    let shuttingDown = false
    const counters = { liveGaps: 0, recoveries: 0, restarts: 0 }

    const lifetimeCancelled = (binding: MutableBinding): boolean => shuttingDown || binding.lifetimeCancelled
    const taskCancelled = (task: RecoveryTask, binding: MutableBinding): boolean =>
      task.cancelled || lifetimeCancelled(binding)

    const rankLogs = (workerId: WorkerId, dpRank: DpRank) => Effect.annotateLogs({ workerId, dpRank })

    // -------------------------------------------------------------------------------------------
    // Target commands

    const admitEvents = (
      epoch: SourceEpoch,
      events: Iterable<RouterEvent>
    ): Effect.Effect<void, RecoveryTargetError> =>
      Effect.forEach(events, (event) => target.admitEvent(epoch, event), { discard: true })

    const resetRank = (slot: SourceSlot, epoch: SourceEpoch, reason: RecoveryResetReason) =>
      // NOTE: This completion barrier is intentional. Rank reset is an infallible lane operation
      // whose removal must be visible before activation or clearing reset_pending.
      target.resetRank(epoch, slot.workerId, slot.dpRank, reason).pipe(
        Effect.withSpan("kvrelay.recovery.reset_rank", {
          attributes: {
            "kvrelay.worker_id": slot.workerId,
            "kvrelay.dp_rank": slot.dpRank,
            "kvrelay.source_epoch": epoch,
            "kvrelay.reset_reason": reason
          }
        })
      )

    const logPartialReplay = (lastEventId: number) =>
      Effect.logInfo(
        "Engine replay does not reach back to the rank's first event; indexing what it holds (history partial)"
      ).pipe(Effect.annotateLogs({ lastEventId }))

    /** The rank's history is partial from here (PROTOCOL §3.3 ◆3); a target without history state ignores it. */
    const markHistoryPartial = (slot: SourceSlot, epoch: SourceEpoch): Effect.Effect<void> =>
      target.markHistoryPartial === undefined
        ? Effect.void
        : target
            .markHistoryPartial(epoch, slot.workerId, slot.dpRank)
            .pipe(
              Effect.catchAll((error) =>
                Effect.logDebug("Could not mark a rank's history partial").pipe(
                  Effect.annotateLogs({ error: error.message })
                )
              )
            )

    const resetRankOrFence = (
      slot: SourceSlot,
      epoch: SourceEpoch,
      reason: RecoveryResetReason = "Lifecycle"
    ): Effect.Effect<void, RecoveryTargetError> =>
      resetRank(slot, epoch, reason).pipe(Effect.tapError(() => Effect.sync(() => slot.fenceForReset())))

    // -------------------------------------------------------------------------------------------
    // Recovery tasks

    const cancelRecovery = (key: RankKey): Effect.Effect<void> =>
      Effect.suspend(() => {
        const task = recoveryTasks.get(key)
        if (task !== undefined) {
          recoveryTasks.delete(key)
          task.cancelled = true
        }
        const fiber = FiberMap.unsafeGet(recoveries, key)
        if (Option.isNone(fiber)) return Effect.void
        // A recovery never cancels itself today; joining oneself would deadlock, so guard anyway.
        return Effect.fiberIdWith((self) =>
          Equal.equals(fiber.value.id(), self) ? Effect.void : FiberMap.remove(recoveries, key)
        )
      })

    const fetchRecoveryResponse = (
      source: KvEventSource,
      startEventId: number | undefined,
      endEventId: number | undefined
    ): Effect.Effect<WorkerKvQueryResponse, WorkerQueryError> =>
      Effect.suspend(() => {
        const request: WorkerKvQueryRequest = {
          workerId: source.workerId,
          dpRank: source.dpRank,
          startEventId,
          endEventId,
          supportsTreeDumpFailed: true
        }
        let attempt = 0
        const once = Effect.suspend(() => {
          attempt += 1
          const query = transport.queryWorker(source, request).pipe(
            Effect.tapError(() => Effect.annotateCurrentSpan(OUTCOME, "TransportError")),
            Effect.timeoutOption(attemptTimeout),
            Effect.flatMap(
              Option.match({
                onNone: () =>
                  Effect.annotateCurrentSpan(OUTCOME, "Timeout").pipe(
                    Effect.zipRight(
                      Effect.fail(
                        new WorkerQueryError({
                          message: `KV recovery attempt timed out after ${Duration.format(attemptTimeout)}`
                        })
                      )
                    )
                  ),
                onSome: (response) =>
                  Effect.annotateCurrentSpan(OUTCOME, response._tag).pipe(
                    // An `Error` response is a failure serialized by the worker: retried like a
                    // transport error (recovery-events.md §5).
                    Effect.zipRight(
                      response._tag === "Error"
                        ? Effect.fail(
                            new WorkerQueryError({ message: `worker query failed: ${response.message}` })
                          )
                        : Effect.succeed(response)
                    )
                  )
              })
            )
          )
          // Limit only the in-flight query. The shared permit is deliberately released before the
          // retry backoff so unresponsive targets cannot starve unrelated pools.
          return recoverySemaphore
            .withPermits(1)(query)
            .pipe(
              Effect.withSpan("kvrelay.recovery.attempt", {
                attributes: {
                  "kvrelay.worker_id": source.workerId,
                  "kvrelay.dp_rank": source.dpRank,
                  "kvrelay.publisher_id": source.publisherId.toString(),
                  "kvrelay.recovery.attempt": attempt,
                  "kvrelay.recovery.start_event_id": startEventId ?? "full"
                }
              })
            )
        })
        return Effect.retry(once, recoveryRetrySchedule)
      })

    const launchRecovery = (
      key: RankKey,
      binding: MutableBinding,
      startEventId: number | undefined,
      endEventId: number | undefined
    ): void => {
      const task: RecoveryTask = { cancelled: false }
      counters.recoveries++
      recoveryTasks.set(key, task)
      runRecovery(key, recoveryProgram(key, binding, task, startEventId, endEventId))
    }

    const spawnRecovery = (
      key: RankKey,
      binding: MutableBinding,
      startEventId: number | undefined,
      endEventId: number | undefined
    ): Effect.Effect<void> =>
      Effect.gen(function* () {
        if (!binding.recoverable) return
        yield* cancelRecovery(key)
        if (lifetimeCancelled(binding)) return
        launchRecovery(key, binding, startEventId, endEventId)
      })

    const recoveryProgram = (
      key: RankKey,
      binding: MutableBinding,
      task: RecoveryTask,
      startEventId: number | undefined,
      endEventId: number | undefined
    ): Effect.Effect<void> => {
      const initialRecovery = startEventId === undefined
      return Effect.gen(function* () {
        if (initialRecovery) {
          const jitter = yield* Random.nextIntBetween(0, FULL_RESTORE_JITTER_MICROS)
          yield* Effect.sleep(Duration.micros(BigInt(jitter)))
        }
        const result = yield* Effect.either(fetchRecoveryResponse(binding.source, startEventId, endEventId))
        // Cancellation wins over a completed query.
        if (taskCancelled(task, binding)) return
        const next = yield* finishRecovery(key, binding, task, result)
        if (initialRecovery) yield* target.completeInitialRecovery(binding.workerId, binding.dpRank)
        // Scheduled last so the helper's join of this fiber cannot cut `completeInitialRecovery` short.
        if (next !== undefined) scheduleRecoveryAfterCurrent(key, binding, next, task)
      }).pipe(
        Effect.catchAllCause((cause) => Effect.logError("KV recovery task failed", cause)),
        rankLogs(binding.workerId, binding.dpRank),
        Effect.annotateLogs({ publisherId: binding.source.publisherId.toString() })
      )
    }

    /**
     * The drain found a hole: replace the current recovery by an incremental one from `start`.
     * Runs in its own fiber because it joins the recovery that asked for it.
     */
    const scheduleRecoveryAfterCurrent = (
      key: RankKey,
      binding: MutableBinding,
      startEventId: number,
      origin: RecoveryTask | undefined
    ): void => {
      if (!binding.recoverable) return
      runHelper(
        Effect.gen(function* () {
          const slot = slots.get(key)
          if (slot === undefined) return
          yield* slot.lock.withLock(
            Effect.gen(function* () {
              if (lifetimeCancelled(binding) || !slot.rank.recoveryInflight || slot.active !== binding) return
              // Another recovery (a clear, a target fault) superseded the one that found the hole.
              if (origin !== undefined && recoveryTasks.get(key) !== origin) return
              yield* cancelRecovery(key)
              if (lifetimeCancelled(binding)) return
              launchRecovery(key, binding, startEventId, undefined)
            })
          )
        })
      )
    }

    // -------------------------------------------------------------------------------------------
    // Completing a recovery (recovery-events.md §3.4)

    /**
     * Admits the buffered live events around history that could not be recovered. `degraded`:
     * the recovery failed (the source is then `degraded`); otherwise an engine's bounded replay
     * buffer simply did not reach back (a normal state: the source stays live, its history partial).
     */
    const finishDegradedLocked = (
      slot: SourceSlot,
      epoch: SourceEpoch,
      degradedReason: string | undefined
    ): Effect.Effect<void> =>
      Effect.gen(function* () {
        yield* markHistoryPartial(slot, epoch)
        const pending = slot.rank.takeFailedRecoveryDegraded()
        const lastEventId = pending.length === 0 ? undefined : pending[pending.length - 1]!.eventId
        if (pending.length > 0) {
          const admitted = yield* Effect.either(admitEvents(epoch, pending))
          if (Either.isLeft(admitted)) {
            slot.fenceForReset()
            yield* Effect.logError(
              "KV indexer rejected degraded live events; rank remains fenced",
              admitted.left
            )
            return
          }
        }
        slot.rank.commitFailedRecoveryDegraded(lastEventId)
        if (degradedReason !== undefined) slot.markDegraded(degradedReason)
      })

    const fenceCorruptRecoveryLocked = (slot: SourceSlot, epoch: SourceEpoch): Effect.Effect<void> =>
      Effect.gen(function* () {
        // NOTE: A foreign/corrupt response is not a recoverable transport failure. Do not replay
        // buffered live events around untrusted history; clear the rank and keep KV handling
        // fenced while ordinary serving continues.
        const reset = yield* Effect.either(resetRankOrFence(slot, epoch))
        if (Either.isLeft(reset)) {
          yield* Effect.logError("Failed to reset rank after corrupt recovery response", reset.left)
        }
        slot.fenceForReset()
      })

    /** Returns the start of a follow-up recovery when the drain found a hole. */
    const finishRecovery = (
      key: RankKey,
      binding: MutableBinding,
      task: RecoveryTask,
      result: Either.Either<WorkerKvQueryResponse, WorkerQueryError>
    ): Effect.Effect<number | undefined> =>
      Effect.suspend(() => {
        if (taskCancelled(task, binding)) return Effect.succeed(undefined)
        const slot = slots.get(key)
        if (slot === undefined) return Effect.succeed(undefined)
        return slot.lock.withLock(finishRecoveryLocked(slot, binding, task, result))
      })

    const finishRecoveryLocked = (
      slot: SourceSlot,
      binding: MutableBinding,
      task: RecoveryTask,
      result: Either.Either<WorkerKvQueryResponse, WorkerQueryError>
    ): Effect.Effect<number | undefined> =>
      Effect.gen(function* () {
        if (taskCancelled(task, binding) || slot.active !== binding) return undefined
        const epoch = binding.epoch
        if (Either.isLeft(result)) {
          yield* Effect.logWarning("KV recovery failed; continuing with degraded live events", result.left)
          yield* finishDegradedLocked(slot, epoch, `recovery failed: ${result.left.message}`)
          return undefined
        }
        const response = result.right
        let recoveredEvents: ReadonlyArray<RouterEvent>
        let recoveredCursor: number
        switch (response._tag) {
          case "Events": {
            if (!recoveryEventsMatchSource(slot.workerId, slot.dpRank, response.events)) {
              yield* Effect.logError("Discarding recovery events for another logical source")
              yield* fenceCorruptRecoveryLocked(slot, epoch)
              return undefined
            }
            if (response.historyPartial === true) {
              yield* logPartialReplay(response.lastEventId)
              yield* markHistoryPartial(slot, epoch)
            }
            recoveredEvents = response.events
            recoveredCursor = Math.max(slot.rank.lastAdmittedId() ?? 0, response.lastEventId)
            break
          }
          case "TreeDump": {
            if (!recoveryEventsMatchSource(slot.workerId, slot.dpRank, response.events)) {
              yield* Effect.logError("Discarding recovery tree dump for another logical source")
              yield* fenceCorruptRecoveryLocked(slot, epoch)
              return undefined
            }
            const replaced = yield* Effect.either(
              target.replaceRank(epoch, slot.workerId, slot.dpRank, response.events)
            )
            if (Either.isLeft(replaced)) {
              slot.fenceForReset()
              yield* Effect.logError(
                "Failed to transactionally replace rank from recovery tree dump; rank remains fenced",
                replaced.left
              )
              return undefined
            }
            // After the replacement, which starts the rank's history afresh.
            if (response.historyPartial === true) {
              yield* logPartialReplay(response.lastEventId)
              yield* markHistoryPartial(slot, epoch)
            }
            recoveredEvents = []
            recoveredCursor = response.lastEventId
            break
          }
          case "TreeDumpFailed": {
            yield* Effect.logWarning("Worker tree dump failed; applying explicit degraded rank reset").pipe(
              Effect.annotateLogs({ lastEventId: response.lastEventId, reason: response.message })
            )
            const reset = yield* Effect.either(resetRankOrFence(slot, epoch, "TreeDumpFailed"))
            if (Either.isLeft(reset)) {
              yield* Effect.logError(
                "Failed degraded rank reset; recovery cursor remains unchanged",
                reset.left
              )
              return undefined
            }
            recoveredEvents = []
            recoveredCursor = response.lastEventId
            break
          }
          default: {
            // An engine's replay buffer that no longer holds the range is its normal state
            // (PROTOCOL §3.3 ◆3): the rank follows on from the live events, its history partial.
            if (binding.incrementalGaps) {
              yield* Effect.logInfo(
                "Engine replay buffer does not reach back; following on from live events"
              ).pipe(Effect.annotateLogs({ response: describeResponse(response) }))
              yield* finishDegradedLocked(slot, epoch, undefined)
              return undefined
            }
            yield* Effect.logWarning("KV recovery returned no applicable state").pipe(
              Effect.annotateLogs({ response: describeResponse(response) })
            )
            yield* finishDegradedLocked(
              slot,
              epoch,
              `recovery returned no applicable state: ${describeResponse(response)}`
            )
            return undefined
          }
        }

        // See RankState.cursor for the admission-based cursor contract. Planning against a clone
        // preserves the old cursor and buffer until the complete recovery group is admitted.
        const rankAfterAdmission = slot.rank.clone()
        rankAfterAdmission.beginSuccessfulRecoveryDrain(recoveredCursor)
        const plan = rankAfterAdmission.planPendingDrain()
        const admitted = yield* Effect.either(admitEvents(epoch, [...recoveredEvents, ...plan.events]))
        if (Either.isLeft(admitted)) {
          slot.fenceForReset()
          yield* Effect.logError("KV indexer rejected a recovery event; rank remains fenced", admitted.left)
          return undefined
        }
        rankAfterAdmission.commitPendingDrain(plan.cursor, plan.nextRecoveryStart)
        slot.rank = rankAfterAdmission
        if (plan.nextRecoveryStart === undefined) slot.degraded = false
        return plan.nextRecoveryStart
      }).pipe(rankLogs(slot.workerId, slot.dpRank))

    // -------------------------------------------------------------------------------------------
    // Membership (recovery-events.md §3.6)

    /** Removes the active binding, cancels its lifetime and joins its recovery. Slot lock held. */
    const deactivateLocked = (slot: SourceSlot): Effect.Effect<boolean> =>
      Effect.suspend(() => {
        const binding = slot.active
        if (binding === undefined) return Effect.succeed(false)
        slot.active = undefined
        const publisherId = binding.source.publisherId
        if (publisherBindings.get(publisherId)?.binding === binding) publisherBindings.delete(publisherId)
        binding.lifetimeCancelled = true
        return Effect.as(cancelRecovery(slot.key), true)
      })

    const removeUnexpectedKey = (key: RankKey): Effect.Effect<void> =>
      Effect.suspend(() => {
        const slot = slots.get(key)
        if (slot === undefined) return Effect.void
        return slot.lock
          .withLock(
            Effect.gen(function* () {
              const hadActive = yield* deactivateLocked(slot)
              const epoch = slot.lifecycleGeneration ?? 0
              if (slot.resetPending || hadActive) {
                const reset = yield* Effect.either(resetRankOrFence(slot, epoch))
                if (Either.isLeft(reset)) {
                  yield* Effect.logError(
                    "Failed to clear KV state for a worker removed from serving membership; retaining reset-pending slot",
                    reset.left
                  )
                  return false
                }
              }
              if (slot.lifecycleGeneration !== undefined) {
                // Preserve reset-relevant history after the active slot is removed. A later source
                // incarnation must compare against this tombstone before it can admit events.
                generationTombstones.set(key, slot.lifecycleGeneration)
              }
              return true
            }).pipe(rankLogs(slot.workerId, slot.dpRank))
          )
          .pipe(
            Effect.flatMap((removable) =>
              Effect.sync(() => {
                if (removable && slots.get(key) === slot) slots.delete(key)
              })
            )
          )
      })

    const reconcileKey = (
      key: RankKey,
      workerId: WorkerId,
      dpRank: DpRank,
      status: KvSourceStatus,
      lifecycleGeneration: number
    ): Effect.Effect<void> =>
      Effect.suspend(() => {
        const previousGeneration = generationTombstones.get(key)
        generationTombstones.delete(key)
        let slot = slots.get(key)
        if (slot === undefined) {
          slot = new SourceSlot(key, workerId, dpRank, previousGeneration)
          slots.set(key, slot)
        }
        const locked = slot
        return locked.lock.withLock(
          Effect.gen(function* () {
            const selected = activeSource(status)
            const generationChanged = locked.generationChanged(lifecycleGeneration)
            if (locked.rejectedGeneration === lifecycleGeneration) return
            if (
              locked.active !== undefined &&
              selected !== undefined &&
              locked.active.source.publisherId === selected.publisherId &&
              !generationChanged &&
              !locked.resetPending
            ) {
              return
            }

            yield* deactivateLocked(locked)
            if (locked.resetPending || generationChanged) {
              const reset = yield* Effect.either(resetRankOrFence(locked, lifecycleGeneration))
              if (Either.isLeft(reset)) {
                yield* selected === undefined
                  ? Effect.logError(
                      "Failed to clear inactive KV source state; reset remains pending",
                      reset.left
                    )
                  : Effect.logError(
                      "KV source activation remains disabled because cold reset failed",
                      reset.left
                    ).pipe(Effect.annotateLogs({ publisherId: selected.publisherId.toString() }))
                return
              }
            }
            locked.acceptGeneration(lifecycleGeneration)
            if (selected === undefined) {
              locked.rank = new RankState()
              return
            }
            const binding: MutableBinding = {
              source: selected,
              key,
              workerId: selected.workerId,
              dpRank: selected.dpRank,
              epoch: lifecycleGeneration,
              recoverable: isRecoverableSource(selected),
              incrementalGaps: selected.transport.kind === "engine-zmq",
              restartsAtFirstId: selected.transport.kind === "engine-zmq",
              lifetimeCancelled: false
            }
            locked.rank.activate(binding.recoverable)
            locked.degraded = false
            locked.active = binding
            publisherBindings.set(selected.publisherId, { binding, slot: locked })
            if (binding.recoverable) {
              yield* spawnRecovery(key, binding, undefined, undefined)
            } else {
              yield* Effect.logWarning(
                "KV source is live-only; serving and best-effort KV routing continue without recovery"
              ).pipe(
                Effect.annotateLogs({
                  kvStateEndpoint: selected.kvStateEndpoint.toString(),
                  publisherId: selected.publisherId.toString()
                })
              )
            }
          }).pipe(rankLogs(workerId, dpRank))
        )
      })

    const reconcileView = (view: KvSourceMembershipView): Effect.Effect<void> =>
      Effect.gen(function* () {
        // After shutdown nothing may be re-activated: shutdown already reset every rank.
        if (shuttingDown) return
        for (const key of [...slots.keys()]) {
          if (!view.ranks.has(key)) yield* removeUnexpectedKey(key)
        }
        for (const [key, expected] of view.ranks) {
          yield* reconcileKey(
            key,
            expected.workerId,
            expected.dpRank,
            expected.status,
            expected.lifecycleGeneration
          )
        }
      }).pipe(
        Effect.withSpan("kvrelay.recovery.reconcile", {
          attributes: {
            "kvrelay.serving_endpoint": view.servingEndpoint.toString(),
            "kvrelay.expected_rank_count": view.ranks.size
          }
        })
      )

    const syncMembership: Effect.Effect<KvSourceMembershipView> = membershipSync.withPermits(1)(
      Effect.gen(function* () {
        const view = yield* options.membership
        yield* reconcileView(view)
        return view
      })
    )

    const syncMembershipWithReadySources = (
      readySources: ReadonlySet<string>
    ): Effect.Effect<KvSourceMembershipView> =>
      membershipSync.withPermits(1)(
        Effect.gen(function* () {
          const view = yield* options.membership
          const ranks = new Map(view.ranks)
          for (const [key, expected] of view.ranks) {
            const source = activeSource(expected.status)
            if (source === undefined) continue
            if (!readySources.has(readySourceKey(source.publisherId, expected.lifecycleGeneration))) {
              ranks.set(key, { ...expected, status: { _tag: "Missing" } })
            }
          }
          yield* reconcileView({ ...view, ranks })
          return view
        })
      )

    // -------------------------------------------------------------------------------------------
    // Faults and fences

    const handleTargetFault = (
      workerId: WorkerId,
      dpRank: DpRank,
      sourceEpoch?: SourceEpoch,
      barrierFailed = false
    ): Effect.Effect<TargetFaultDisposition> =>
      Effect.suspend(() => {
        const key = rankKey(workerId, dpRank)
        const slot = slots.get(key)
        if (slot === undefined) return Effect.succeed<TargetFaultDisposition>("Stale")
        return slot.lock
          .withLock(
            Effect.gen(function* () {
              const binding = slot.active
              if (binding === undefined) return { disposition: "Stale" as const }
              if (sourceEpoch !== undefined && binding.epoch !== sourceEpoch)
                return { disposition: "Stale" as const }
              if (barrierFailed || slot.resetPending) return { disposition: "Fenced" as const }
              if (binding.recoverable) {
                slot.rank.recoveryInflight = true
                return { disposition: "Recovering" as const, binding }
              }
              const reset = yield* Effect.either(resetRankOrFence(slot, binding.epoch, "TargetFault"))
              if (Either.isLeft(reset)) {
                yield* Effect.logError(
                  "Failed to reset live-only rank after asynchronous target failure",
                  reset.left
                )
                return { disposition: "Fenced" as const }
              }
              slot.rank.activate(false)
              return { disposition: "ResetLiveOnly" as const }
            }).pipe(rankLogs(workerId, dpRank))
          )
          .pipe(
            Effect.flatMap((outcome) =>
              outcome.disposition === "Recovering"
                ? Effect.as(spawnRecovery(key, outcome.binding, undefined, undefined), outcome.disposition)
                : Effect.succeed(outcome.disposition)
            )
          )
      })

    const rejectSource = (
      workerId: WorkerId,
      dpRank: DpRank,
      sourceEpoch: SourceEpoch,
      reason = "protocol fault"
    ): Effect.Effect<TargetFaultDisposition> =>
      Effect.suspend(() => {
        const slot = slots.get(rankKey(workerId, dpRank))
        if (slot === undefined) return Effect.succeed<TargetFaultDisposition>("Stale")
        return slot.lock.withLock(
          Effect.gen(function* () {
            const binding = slot.active
            if (binding === undefined || binding.epoch !== sourceEpoch) return "Stale" as const
            yield* deactivateLocked(slot)
            const reset = yield* Effect.either(resetRankOrFence(slot, sourceEpoch, "TargetFault"))
            if (Either.isLeft(reset)) {
              yield* Effect.logError("Failed to clear a protocol-faulted KV source", reset.left)
            }
            slot.rank = new RankState()
            slot.rejectedGeneration = sourceEpoch
            slot.rejection = { publisherId: binding.source.publisherId, reason }
            return "Fenced" as const
          }).pipe(rankLogs(workerId, dpRank))
        )
      })

    const fenceTransport = (publisherId: bigint): Effect.Effect<boolean> =>
      membershipSync.withPermits(1)(
        Effect.suspend(() => {
          const active = publisherBindings.get(publisherId)
          if (active === undefined) return Effect.succeed(false)
          const { binding, slot } = active
          return slot.lock.withLock(
            Effect.gen(function* () {
              if (slot.active !== binding) return false
              yield* deactivateLocked(slot)
              const reset = yield* Effect.either(resetRankOrFence(slot, binding.epoch, "Lifecycle"))
              if (Either.isLeft(reset)) {
                yield* Effect.logError(
                  "Failed to reset KV state after direct-ZMQ transport discontinuity",
                  reset.left
                ).pipe(Effect.annotateLogs({ publisherId: publisherId.toString() }))
              }
              slot.rank = new RankState()
              return true
            }).pipe(rankLogs(slot.workerId, slot.dpRank))
          )
        })
      )

    // -------------------------------------------------------------------------------------------
    // Live batches (recovery-events.md §3.2)

    /**
     * A live-only engine source whose first batch is not seq 0: the engine ran before the relay
     * heard it, so the rank's history is partial from the start (PROTOCOL §3.3 ◆3).
     */
    const joinsLate = (slot: SourceSlot, binding: MutableBinding, firstEventId: number): boolean =>
      !binding.recoverable && binding.restartsAtFirstId && slot.rank.cursor === undefined && firstEventId > 1

    const admitEventsNow = target.admitEventsNow

    /**
     * A live batch: `undefined` when it was handled synchronously, else the effect that handles
     * it. The hot path is a batch that is one commit group the rank applies (`appliesLive`), on a
     * slot nobody holds, whose events the target admits at once: that is exactly what the locked
     * path below would do, without an effect. Anything else, including a target that would make
     * the admission wait, takes the locked path from the start (the hot path changed nothing).
     */
    const handleLiveBatchNow = (
      publisherId: bigint,
      events: ReadonlyArray<RouterEvent>
    ): Effect.Effect<void> | undefined => {
      const active = publisherBindings.get(publisherId)
      if (active === undefined) {
        countDrop("unknown-publisher")
        return Effect.logDebug("Dropping KV event batch from an inactive or ambiguous source").pipe(
          Effect.annotateLogs({ publisherId: publisherId.toString() })
        )
      }
      const { binding, slot } = active
      const expected = binding.source
      const first = events[0]
      let foreign: RouterEvent | undefined
      let oneGroup = true
      let hasClear = false
      for (let i = 0; i < events.length; i++) {
        const event = events[i]!
        if (event.workerId !== expected.workerId || event.dpRank !== expected.dpRank) {
          foreign = event
          break
        }
        if (event.eventId !== first!.eventId) oneGroup = false
        if (event.data._tag === "Cleared") hasClear = true
      }
      if (foreign !== undefined) {
        countDrop("foreign-payload")
        return Effect.logError(
          "Dropping KV event batch whose payload disagrees with its source advertisement"
        ).pipe(
          Effect.annotateLogs({
            publisherId: publisherId.toString(),
            expectedWorkerId: expected.workerId,
            expectedDpRank: expected.dpRank,
            eventWorkerId: foreign.workerId,
            eventDpRank: foreign.dpRank
          })
        )
      }
      if (first === undefined) return undefined
      if (
        oneGroup &&
        !joinsLate(slot, binding, first.eventId) &&
        admitEventsNow !== undefined &&
        slot.lock.free &&
        slot.active === binding &&
        !slot.resetPending &&
        slot.rank.appliesLive(first.eventId, hasClear, binding.recoverable) &&
        admitEventsNow(binding.epoch, events)
      ) {
        slot.rank.commitLiveAdmission(first.eventId)
        return undefined
      }
      return slot.lock.withLock(handleLiveBatchLocked(slot, binding, commitGroups(events)))
    }

    const handleLiveBatch = (publisherId: bigint, events: ReadonlyArray<RouterEvent>): Effect.Effect<void> =>
      Effect.suspend(() => handleLiveBatchNow(publisherId, events) ?? Effect.void)

    const admitGroupOrFence = (
      slot: SourceSlot,
      epoch: SourceEpoch,
      group: CommitGroup,
      message: string
    ): Effect.Effect<boolean> =>
      Effect.matchEffect(
        // A live group is almost always one event: skip `forEach`'s iteration machinery then.
        group.events.length === 1
          ? target.admitEvent(epoch, group.events[0]!)
          : admitEvents(epoch, group.events),
        {
          onSuccess: () => CONTINUE,
          onFailure: (error) =>
            Effect.sync(() => slot.fenceForReset()).pipe(
              Effect.zipRight(
                Effect.logError(message, error).pipe(
                  Effect.annotateLogs({ eventId: group.eventId }),
                  rankLogs(slot.workerId, slot.dpRank)
                )
              ),
              Effect.as(false)
            )
        }
      )

    /**
     * Per live batch, under the slot lock. The common actions (ignore, apply) run without a
     * generator or log annotations: those cost more than the admission itself, and the apply path
     * logs only when it fails (that log is annotated with the rank on its own). The rare actions
     * run `liveGroupActionLocked`, annotated as a whole.
     */
    const handleLiveBatchLocked = (
      slot: SourceSlot,
      binding: MutableBinding,
      groups: ReadonlyArray<CommitGroup>
    ): Effect.Effect<void> =>
      Effect.suspend(() => {
        if (slot.active === binding && !slot.resetPending) {
          if (groups.length > 0 && joinsLate(slot, binding, groups[0]!.eventId))
            return Effect.zipRight(
              markHistoryPartial(slot, binding.epoch),
              liveGroupsFrom(slot, binding, groups, 0)
            )
          return liveGroupsFrom(slot, binding, groups, 0)
        }
        countDrop("fenced")
        return Effect.void
      })

    /** Handles `groups` from `start` on, in order; stops at the first action that says so. */
    const liveGroupsFrom = (
      slot: SourceSlot,
      binding: MutableBinding,
      groups: ReadonlyArray<CommitGroup>,
      start: number
    ): Effect.Effect<void> => {
      for (let i = start; i < groups.length; i++) {
        const action = slot.rank.observeLiveGroup(
          groups[i]!,
          binding.recoverable,
          binding.incrementalGaps,
          binding.restartsAtFirstId
        )
        if (action._tag === "Ignore") {
          // Ignored at or below the cursor: a duplicate or a group going backwards. Above it, the
          // group was buffered for a recovery in flight.
          const cursor = slot.rank.cursor
          if (cursor !== undefined && groups[i]!.eventId <= cursor) countDrop("backwards")
          continue
        }
        // After a restart the same group is observed again by the fresh rank state.
        const next = action._tag === "Restart" ? i : i + 1
        if (action._tag === "Apply") {
          return Effect.flatMap(
            admitGroupOrFence(
              slot,
              binding.epoch,
              action.group,
              "KV event queue rejected a live event; rank remains fenced pending reset"
            ),
            (admitted) => {
              if (!admitted) return Effect.void
              slot.rank.commitLiveAdmission(action.eventId)
              return next === groups.length ? Effect.void : liveGroupsFrom(slot, binding, groups, next)
            }
          )
        }
        return Effect.flatMap(
          liveGroupActionLocked(slot, binding, action).pipe(rankLogs(slot.workerId, slot.dpRank)),
          (proceed) =>
            proceed && next < groups.length ? liveGroupsFrom(slot, binding, groups, next) : Effect.void
        )
      }
      return Effect.void
    }

    /** A clear, recovery or degraded reset of one live group; false when the batch must stop. */
    const liveGroupActionLocked = (
      slot: SourceSlot,
      binding: MutableBinding,
      action: Exclude<LiveEventAction, { readonly _tag: "Ignore" | "Apply" }>
    ): Effect.Effect<boolean> =>
      Effect.gen(function* () {
        const key = slot.key
        const epoch = binding.epoch
        switch (action._tag) {
          case "Clear": {
            // NOTE: A clear is ordered only in this publisher's rank stream. It may supersede this
            // rank's gap recovery, but it has no causal cutoff for sibling ranks and must never
            // scan, lock, cancel, or mutate their slots.
            yield* cancelRecovery(key)
            slot.rank.discardRecoveryBeforeClear()
            const admitted = yield* admitGroupOrFence(
              slot,
              epoch,
              action.group,
              "KV event queue rejected a rank clear; rank remains fenced pending reset"
            )
            if (!admitted) return false
            slot.rank.commitLiveAdmission(action.eventId)
            return true
          }
          case "Recover": {
            // An initial restore has neither a reset nor a start: only a gap has one of them.
            if (action.reset || action.startEventId !== undefined) counters.liveGaps++
            if (action.reset) {
              yield* cancelRecovery(key)
              const reset = yield* Effect.either(resetRankOrFence(slot, epoch))
              if (Either.isLeft(reset)) {
                yield* Effect.logError(
                  "Failed to clear KV state before gap recovery; rank remains fenced",
                  reset.left
                )
                return false
              }
            }
            yield* spawnRecovery(key, binding, action.startEventId, action.endEventId)
            return true
          }
          case "ResetDegraded": {
            counters.liveGaps++
            yield* cancelRecovery(key)
            const reset = yield* Effect.either(resetRankOrFence(slot, epoch))
            if (Either.isLeft(reset)) {
              yield* Effect.logError(
                "Failed to clear KV state after an event sequence gap; rank remains fenced",
                reset.left
              )
              return false
            }
            yield* markHistoryPartial(slot, epoch)
            const admitted = yield* admitGroupOrFence(
              slot,
              epoch,
              action.group,
              "KV indexer rejected degraded gap event; rank remains fenced"
            )
            if (!admitted) return false
            slot.rank.commitLiveAdmission(action.group.eventId)
            slot.markDegraded("event gap on a source without recovery: the rank was reset")
            return true
          }
          case "Restart": {
            counters.restarts++
            yield* Effect.logWarning(
              "KV event publisher counts from seq 0 again (an engine restart); resetting and resynchronising the rank"
            ).pipe(Effect.annotateLogs({ publisherId: binding.source.publisherId.toString() }))
            yield* cancelRecovery(key)
            const reset = yield* Effect.either(resetRankOrFence(slot, epoch))
            if (Either.isLeft(reset)) {
              yield* Effect.logError(
                "Failed to clear KV state after a publisher restart; rank remains fenced",
                reset.left
              )
              return false
            }
            // Everything the old incarnation sent is gone with it: the new one's history starts here.
            slot.rank = new RankState()
            slot.degraded = false
            return true
          }
        }
      })

    // -------------------------------------------------------------------------------------------
    // Health and shutdown

    // Reads without the slot locks: every slot mutation is a synchronous step or installs a whole
    // RankState at once, so a snapshot never sees half an update.
    const healthSnapshot = Effect.sync((): SourceSupervisorHealth => {
      const workers = new Set<WorkerId>()
      const endpoints = new Set<string>()
      let recoveringRankCount = 0
      let pendingLiveEventCount = 0
      let sourcesRecovering = 0
      let sourcesDegraded = 0
      const sources: Array<SourceStateEntry> = []
      const rejected: Array<RejectedSourceEntry> = []
      for (const slot of slots.values()) {
        if (slot.rejection !== undefined && slot.rejectedGeneration === slot.lifecycleGeneration) {
          rejected.push({
            workerId: slot.workerId,
            dpRank: slot.dpRank,
            publisherId: slot.rejection.publisherId,
            reason: slot.rejection.reason
          })
        }
        if (slot.rank.recoveryInflight) recoveringRankCount += 1
        pendingLiveEventCount += slot.rank.pendingLiveEventCount()
        const active = slot.active
        if (active !== undefined) {
          workers.add(active.source.workerId)
          endpoints.add(active.source.kvStateEndpoint.toString())
          const state = slot.state()
          if (state === "recovering") sourcesRecovering++
          else if (state === "degraded") sourcesDegraded++
          sources.push({
            workerId: slot.workerId,
            dpRank: slot.dpRank,
            publisherId: active.source.publisherId,
            state,
            reason: slot.reason()
          })
        }
      }
      return {
        workerCount: workers.size,
        rankCount: slots.size,
        recoveringRankCount,
        sourcesRecovering,
        sourcesDegraded,
        sources,
        rejected,
        pendingLiveEventCount,
        discoveredEndpointCount: endpoints.size
      }
    })

    const shutdown = yield* Effect.cached(
      Effect.suspend(() => {
        shuttingDown = true
        // The seed cancels its root token first and every recovery observes it at once. Here a
        // recovery waiting on a replay endpoint that never answers (or on its rebuild batch) may
        // hold its slot's lock, so interrupt them all before taking the locks to reset the ranks.
        for (const task of recoveryTasks.values()) task.cancelled = true
        recoveryTasks.clear()
        return FiberMap.clear(recoveries).pipe(
          Effect.zipRight(Effect.forEach([...slots.keys()], removeUnexpectedKey, { discard: true }))
        )
      }).pipe(Effect.withSpan("kvrelay.recovery.shutdown"))
    )
    // Added last so it runs before the FiberMap and FiberSet close: ranks are reset while their
    // recoveries are still joined one by one, as in the seed.
    yield* Effect.addFinalizer(() => shutdown)

    const snapshotOf = (slot: SourceSlot): SourceSlotSnapshot => ({
      active: slot.active,
      resetPending: slot.resetPending,
      lifecycleGeneration: slot.lifecycleGeneration,
      rejectedGeneration: slot.rejectedGeneration,
      lastAdmittedId: slot.rank.lastAdmittedId(),
      recoveryInflight: slot.rank.recoveryInflight,
      pendingLiveEventCount: slot.rank.pendingLiveEventCount()
    })

    const internals: SourceSupervisorInternals = {
      reconcileView,
      finishRecovery: (binding, result) =>
        Effect.suspend(() => {
          // Every binding handed out is the supervisor's own MutableBinding object.
          const mutable = binding as MutableBinding
          return finishRecovery(binding.key, mutable, { cancelled: false }, result).pipe(
            Effect.flatMap((next) =>
              Effect.sync(() => {
                if (next !== undefined) scheduleRecoveryAfterCurrent(binding.key, mutable, next, undefined)
              })
            )
          )
        }),
      fetchRecoveryResponse,
      publisherBinding: (publisherId) => publisherBindings.get(publisherId)?.binding,
      slot: (workerId, dpRank) => {
        const slot = slots.get(rankKey(workerId, dpRank))
        return slot === undefined ? undefined : snapshotOf(slot)
      },
      slotCount: () => slots.size,
      runningRecoveryCount: () => {
        let count = 0
        for (const _ of recoveries) count += 1
        return count
      }
    }

    const supervisor: SourceSupervisor = {
      syncMembership,
      syncMembershipWithReadySources,
      handleLiveBatch,
      handleLiveBatchNow,
      fenceTransport,
      handleTargetFault,
      rejectSource,
      healthSnapshot,
      counters: Effect.sync((): SourceSupervisorCounters => ({ ...counters })),
      shutdown
    }
    registerInternals(supervisor, internals)
    return supervisor
  })
