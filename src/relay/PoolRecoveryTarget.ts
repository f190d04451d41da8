/**
 * `KvDcRelayRecoveryTarget`: the source supervisor's `RecoveryTarget` over one pool actor, with
 * the seed's rank-replacement batcher (seed 002, `KvDcRelayRecoveryTarget`).
 *
 * Rank replacements are transactional pool rebuilds, so they are batched:
 * - the initial recovery wave of the expected ranks becomes ONE rebuild, once every expected rank
 *   delivered its replacement or reported `completeInitialRecovery`, or when the initial deadline
 *   (started by the first initial replacement) expires;
 * - later replacements wait for a quiet window (sleep 5 ms, repeat while the pending count
 *   changed) and then rebuild together;
 * - rebuilds of all pools share a permit semaphore given by the caller;
 * - every replacement of a batch observes the batch's single result.
 */

import { Deferred, Duration, Effect, Exit, FiberId, FiberSet, type Scope } from "effect"
import { type CkfMemberRef, memberKey } from "../ckf/events.js"
import type { DpRank, RouterEvent, WorkerId } from "../protocol/Events.js"
import { type RecoveryTarget, RecoveryTargetError, type SourceEpoch } from "../recovery/RecoveryTarget.js"
import { type PoolActor, type RankReplacement, RECOVERY_REBUILD_BATCH_WINDOW_MS } from "./PoolActor.js"
import type { KvDcRelayError } from "./RelayErrors.js"

import { foldTreeDump } from "./TreeDump.js"

interface KvDcRelayRecoveryTarget extends RecoveryTarget {
  readonly actor: PoolActor
}

interface RecoveryTargetOptions {
  /** Shared by every pool's rebuilds (the seed's `rebuild_permit`). */
  readonly rebuildPermit: Effect.Semaphore
  /** Ranks whose first restore joins one initial rebuild; empty means no initial wave. */
  readonly expected: Iterable<CkfMemberRef>
  /** How long the initial wave waits for its stragglers, from the first initial replacement. */
  readonly initialDeadline: Duration.DurationInput
}

const reasonOf = (error: KvDcRelayError): RecoveryTargetError["reason"] => {
  switch (error._tag) {
    case "RelayShuttingDown":
      return "ShuttingDown"
    case "ActorStopped":
      return "Stopped"
    case "StaleSourceEpoch":
      return "StaleSourceEpoch"
    case "InvalidTreeDump":
      return "InvalidTreeDump"
    default:
      return "Rejected"
  }
}

/** The relay's error as the supervisor's recovery target error. */
export const toRecoveryTargetError = (error: KvDcRelayError): RecoveryTargetError =>
  new RecoveryTargetError({ reason: reasonOf(error), message: error.message })

const coordinatorStopped = () =>
  new RecoveryTargetError({ reason: "Stopped", message: "rank replacement batch coordinator stopped" })

interface PendingReplacement {
  readonly replacement: RankReplacement
  readonly reply: Deferred.Deferred<void, RecoveryTargetError>
}

const isSubset = (subset: ReadonlySet<string>, superset: ReadonlySet<string>): boolean => {
  for (const member of subset) if (!superset.has(member)) return false
  return true
}

/** Builds the target in the current scope; closing it fails every waiting replacement with `Stopped`. */
export const make = (
  actor: PoolActor,
  options: RecoveryTargetOptions
): Effect.Effect<KvDcRelayRecoveryTarget, never, Scope.Scope> =>
  Effect.gen(function* () {
    const tasks = yield* FiberSet.make<void, never>()
    const initialDeadline = Duration.decode(options.initialDeadline)
    const batchWindow = Duration.millis(RECOVERY_REBUILD_BATCH_WINDOW_MS)
    const expected = new Set<string>()
    for (const member of options.expected) expected.add(memberKey(member.workerId, member.dpRank))

    // The seed's batch state behind a mutex; here every read-modify-write is one synchronous block.
    const batch = {
      pending: [] as Array<PendingReplacement>,
      flushScheduled: false,
      initialTimerScheduled: false,
      initialExpected: expected.size === 0 ? undefined : (expected as Set<string> | undefined),
      initialCompleted: new Set<string>(),
      closed: false
    }

    const settle = (
      pending: ReadonlyArray<PendingReplacement>,
      exit: Exit.Exit<void, RecoveryTargetError>
    ) => {
      for (const p of pending) Deferred.unsafeDone(p.reply, exit)
    }

    const rebuild = (pending: ReadonlyArray<PendingReplacement>) =>
      options.rebuildPermit
        .withPermits(1)(actor.replaceRanks(pending.map((p) => p.replacement)))
        .pipe(
          Effect.mapError(toRecoveryTargetError),
          Effect.exit,
          Effect.tap((exit) =>
            Effect.logDebug("KV DC Relay rank replacement batch rebuilt").pipe(
              Effect.annotateLogs({ ranks: pending.length, ok: Exit.isSuccess(exit) })
            )
          ),
          Effect.withSpan("KvDcRelayRecoveryTarget.rebuildBatch", { attributes: { ranks: pending.length } })
        )

    const flushReplacementBatch = (waitForQuiet: boolean): Effect.Effect<void> =>
      Effect.gen(function* () {
        if (waitForQuiet) {
          let observed = 0
          for (;;) {
            yield* Effect.sleep(batchWindow)
            const current = batch.pending.length
            if (current === observed) break
            observed = current
          }
        }
        const pending = batch.pending
        batch.pending = []
        batch.flushScheduled = false
        if (pending.length === 0) return
        yield* Effect.uninterruptibleMask((restore) =>
          restore(rebuild(pending)).pipe(
            Effect.onExit((exit) =>
              Effect.sync(() =>
                settle(pending, Exit.isSuccess(exit) ? exit.value : Exit.fail(coordinatorStopped()))
              )
            )
          )
        )
      })

    const expireInitialRecoveryBatch = Effect.gen(function* () {
      yield* Effect.sleep(initialDeadline)
      const initialOpen = batch.initialExpected !== undefined
      batch.initialExpected = undefined
      if (initialOpen) batch.initialCompleted.clear()
      if (!initialOpen || batch.pending.length === 0 || batch.flushScheduled) return
      batch.flushScheduled = true
      yield* Effect.logDebug(
        "KV DC Relay initial recovery wave expired; rebuilding the ranks that arrived"
      ).pipe(Effect.annotateLogs({ ranks: batch.pending.length }))
      yield* flushReplacementBatch(false)
    })

    yield* Effect.addFinalizer(() =>
      Effect.sync(() => {
        batch.closed = true
        const pending = batch.pending
        batch.pending = []
        settle(pending, Exit.fail(coordinatorStopped()))
      })
    )

    const markInitialComplete = (member: string): boolean => {
      const expectedNow = batch.initialExpected
      if (expectedNow === undefined || !expectedNow.has(member)) return false
      batch.initialCompleted.add(member)
      if (!isSubset(expectedNow, batch.initialCompleted)) return false
      batch.initialExpected = undefined
      batch.initialCompleted.clear()
      if (batch.pending.length === 0 || batch.flushScheduled) return false
      batch.flushScheduled = true
      return true
    }

    const replaceRank = (
      sourceEpoch: SourceEpoch,
      workerId: WorkerId,
      dpRank: DpRank,
      events: ReadonlyArray<RouterEvent>
    ): Effect.Effect<void, RecoveryTargetError> =>
      Effect.suspend(() => {
        if (batch.closed) return Effect.fail(coordinatorStopped())
        const reply = Deferred.unsafeMake<void, RecoveryTargetError>(FiberId.none)
        const member = memberKey(workerId, dpRank)
        batch.pending.push({
          // An externally addressed pool takes Stored events only: fold a dump's Removed tail.
          replacement: {
            sourceEpoch,
            workerId,
            dpRank,
            events: actor.canonical ? events : foldTreeDump(workerId, dpRank, events)
          },
          reply
        })
        const initial = batch.initialExpected?.has(member) ?? false
        if (initial) batch.initialCompleted.add(member)
        const initialComplete =
          initial &&
          batch.initialExpected !== undefined &&
          isSubset(batch.initialExpected, batch.initialCompleted)
        if (initialComplete) {
          batch.initialExpected = undefined
          batch.initialCompleted.clear()
        }
        const initialWaveOpen = batch.initialExpected !== undefined
        let scheduleDeadline = false
        if (initial && !initialComplete && !batch.initialTimerScheduled) {
          batch.initialTimerScheduled = true
          scheduleDeadline = true
        }
        let scheduleFlush = false
        let waitForQuiet = false
        if (!batch.flushScheduled && !initialWaveOpen) {
          batch.flushScheduled = true
          scheduleFlush = true
          waitForQuiet = !initial
        }
        return Effect.gen(function* () {
          if (scheduleFlush) yield* FiberSet.run(tasks, flushReplacementBatch(waitForQuiet))
          if (scheduleDeadline) yield* FiberSet.run(tasks, expireInitialRecoveryBatch)
          yield* Deferred.await(reply)
        })
      }).pipe(
        Effect.withSpan("KvDcRelayRecoveryTarget.replaceRank", {
          attributes: { workerId, dpRank, sourceEpoch }
        })
      )

    const target: KvDcRelayRecoveryTarget = {
      actor,
      admitEvent: (sourceEpoch, event) =>
        actor.admitEvent(sourceEpoch, event).pipe(Effect.mapError(toRecoveryTargetError)),
      admitEventsNow: actor.admitEventsNow,
      replaceRank,
      completeInitialRecovery: (workerId, dpRank) =>
        Effect.suspend(() =>
          markInitialComplete(memberKey(workerId, dpRank))
            ? FiberSet.run(tasks, flushReplacementBatch(false)).pipe(Effect.asVoid)
            : Effect.void
        ),
      markHistoryPartial: (sourceEpoch, workerId, dpRank) =>
        actor.markHistoryPartial(sourceEpoch, workerId, dpRank).pipe(Effect.mapError(toRecoveryTargetError)),
      resetRank: (sourceEpoch, workerId, dpRank, reason) =>
        actor
          .resetRank(sourceEpoch, workerId, dpRank, reason === "TreeDumpFailed")
          .pipe(
            Effect.mapError(toRecoveryTargetError),
            Effect.withSpan("KvDcRelayRecoveryTarget.resetRank", { attributes: { workerId, dpRank, reason } })
          )
    }
    return target
  })
