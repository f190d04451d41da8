/**
 * The global CKF ingestion pool's implementation (seed 004, `global_ckf/ingestion.rs`): one fiber
 * per sticky worker with its own bounded FIFO, lane admission with epochs and outstanding-image
 * bounds, and the lag watchdog. The contract is `../GlobalCkfIngestionPool.ts`; the lanes' and
 * workers' state is `IngestionLanes.ts`; the seed's test hooks are `IngestionPoolTestHooks.ts`.
 *
 * Length: `build` is one closure over the pool's routes, lane controls and workers; admission
 * (`submitDelta`, never suspending), the workers' FIFO loops and the watchdog change them in
 * synchronous blocks whose invariants (one epoch per lane, permits matched to outstanding images)
 * are read in one place.
 */

import { Cause, Deferred, Duration, Effect, ExecutionStrategy, Exit, Option, Queue, Scope } from "effect"
import { CKF_LANE_COUNT } from "../../ckf/config.js"
import type { CkfFailureDisposition } from "../../ckf/failure.js"
import {
  type GlobalCkfAssignmentError,
  GlobalCkfBuildError,
  type GlobalCkfIndexer,
  type GlobalCkfIngestOutcome,
  type GlobalCkfLaneIngestor,
  validateAssignment
} from "../../ckf/global.js"
import type { ConsumerDrainMarker, LaneLease, ProducerIdentity } from "../../ckf/identity.js"
import type { DcCkfDelta, DcCkfSnapshot } from "../../ckf/publisher.js"
import { stickyWorker } from "../../ckf/splitmix.js"
import { U64_MAX } from "../../ckf/u64.js"
import {
  AdmissionEpochExhausted,
  AssignmentRejected,
  AwaitingSnapshot,
  ControlTimeout,
  DirtyToAppliedAgeExceeded,
  type GlobalCkfIngestionError,
  type GlobalCkfIngestionPoolBuildError,
  GlobalCkfIngestionPoolClaimError,
  GlobalCkfIngestionPoolConfigError,
  LaneRetired,
  LaneUnassigned,
  OutstandingImageLimit,
  Saturated,
  UnconfiguredLane,
  WorkerFailed
} from "../ConsumerErrors.js"
import {
  GlobalCkfIngestionFault,
  type GlobalCkfIngestionPool,
  type GlobalCkfIngestionPoolConfig,
  ingestionErrorDisposition,
  lagPollInterval,
  WorkerHealth
} from "../GlobalCkfIngestionPool.js"
import {
  type AssignCommand,
  type DeltaCommand,
  type DeltaPermit,
  type DrainCommand,
  type IngestionCommand,
  imageCount,
  type LaneCommand,
  LaneControl,
  laneAnnotations,
  oldestOutstandingAge,
  type PauseGate,
  type ProcessedIngestOutcome,
  RESPONSE_DROPPED,
  ResponseDropped,
  releasePermit,
  resolveConfig,
  type SnapshotCommand,
  type Worker,
  type WorkerLane
} from "./IngestionLanes.js"
import type {
  GlobalCkfIngestionPoolOptions,
  GlobalCkfIngestionPoolTestHooks,
  GlobalCkfIngestionPoolWithTestHooks,
  PauseHandle
} from "./IngestionPoolTestHooks.js"

// ---------------------------------------------------------------------------------------------
// Constructor

/**
 * Starts the pool in the current scope: claims every configured lane of `indexer`, forks one
 * fiber per sticky worker and the lag watchdog. Closing the scope stops the watchdog, retires
 * every lane's admission (fail closed), then stops the workers and gives the lanes back.
 */
export const make = (
  indexer: GlobalCkfIndexer,
  config: Partial<GlobalCkfIngestionPoolConfig> = {}
): Effect.Effect<GlobalCkfIngestionPool, GlobalCkfIngestionPoolBuildError, Scope.Scope> =>
  Effect.map(buildScoped(indexer, config, {}), ({ pool }) => pool)

/** `make` for the seed's tests: the pool with its test hooks. */
export const makeWithTestHooks = (
  indexer: GlobalCkfIndexer,
  config: Partial<GlobalCkfIngestionPoolConfig> = {}
): Effect.Effect<GlobalCkfIngestionPoolWithTestHooks, GlobalCkfIngestionPoolBuildError, Scope.Scope> =>
  Effect.map(buildScoped(indexer, config, { testHooks: true }), ({ pool, testHooks }) => ({
    ...pool,
    testHooks: testHooks!
  }))

const buildScoped = (
  indexer: GlobalCkfIndexer,
  config: Partial<GlobalCkfIngestionPoolConfig>,
  options: GlobalCkfIngestionPoolOptions
) =>
  // A failed construction gives back what it acquired at once (the seed drops its partial
  // workers), instead of holding lane claims until the caller's scope closes.
  Effect.gen(function* () {
    const scope = yield* Scope.fork(yield* Scope.Scope, ExecutionStrategy.sequential)
    return yield* build(indexer, config, options).pipe(
      Scope.extend(scope),
      Effect.onExit((exit) => (Exit.isFailure(exit) ? Scope.close(scope, exit) : Effect.void))
    )
  })

const build = (
  indexer: GlobalCkfIndexer,
  config: Partial<GlobalCkfIngestionPoolConfig>,
  options: GlobalCkfIngestionPoolOptions
): Effect.Effect<
  { readonly pool: GlobalCkfIngestionPool; readonly testHooks: GlobalCkfIngestionPoolTestHooks | undefined },
  GlobalCkfIngestionPoolBuildError,
  Scope.Scope
> =>
  Effect.gen(function* () {
    const resolved = resolveConfig(indexer, config)
    if (resolved instanceof GlobalCkfIngestionPoolConfigError) return yield* Effect.fail(resolved)
    const { workerCount, queueCapacity, controlTimeout, maxOutstandingImages } = resolved
    const maxAgeMs = Duration.toMillis(resolved.maxDirtyToAppliedAge)
    const clock = yield* Effect.clock
    const nowMs = (): number => Number(clock.unsafeCurrentTimeNanos()) / 1e6

    const health = new WorkerHealth(workerCount)
    // Readiness is the authoritative failure signal. Keep notifications bounded and best-effort
    // so an adapter that does not consume diagnostics cannot retain an unbounded stream of
    // repeated faults for an already-retired lane.
    const faults = yield* Queue.dropping<GlobalCkfIngestionFault>(CKF_LANE_COUNT * 2 + workerCount)
    const reportFault = (fault: GlobalCkfIngestionFault): void => {
      // Lane retirement/readiness is authoritative. Repeated notification traffic is deliberately
      // coalesced when the bounded diagnostic channel is full.
      Queue.unsafeOffer(faults, fault)
    }
    let closed = false

    // ---- lanes, routes and workers

    const workers: Array<Worker> = []
    for (let index = 0; index < workerCount; index++) {
      workers.push({
        index,
        queue: yield* Queue.bounded<IngestionCommand>(queueCapacity),
        lanes: new Array<WorkerLane | undefined>(CKF_LANE_COUNT).fill(undefined),
        exited: yield* Deferred.make<void>(),
        running: true
      })
    }
    const routes: Array<LaneControl | undefined> = new Array(CKF_LANE_COUNT).fill(undefined)
    const consumer = indexer.manifest.consumerInstance
    for (let lane = 0; lane < CKF_LANE_COUNT; lane++) {
      if (indexer.manifest.poolId(lane) === undefined) continue
      const worker = stickyWorker(consumer, lane, workerCount)
      const ingestor = yield* Effect.acquireRelease(
        Effect.suspend(() => {
          const claimed = indexer.claimLane(lane)
          return claimed instanceof GlobalCkfBuildError
            ? Effect.fail(new GlobalCkfIngestionPoolClaimError({ lane, error: claimed }))
            : Effect.succeed(claimed)
        }),
        (claimed) => Effect.sync(() => claimed.release())
      )
      const control = new LaneControl(
        lane,
        worker,
        maxOutstandingImages,
        maxAgeMs,
        yield* Effect.makeSemaphore(1)
      )
      workers[worker]!.lanes[lane] = { ingestor, control, observedEpoch: 0n }
      routes[lane] = control
    }

    // ---- admission (synchronous sections only)

    const permanentlyFence = (control: LaneControl): void => {
      indexer.retireLaneReadiness(control.lane)
      control.state = "Retired"
      control.lease = undefined
      control.permanentlyFenced = true
    }

    const retireAdmission = (control: LaneControl): AdmissionEpochExhausted | undefined => {
      if (control.epoch === U64_MAX) {
        permanentlyFence(control)
        return new AdmissionEpochExhausted({ lane: control.lane })
      }
      // NOTE: readiness is cleared inside the same synchronous section that bumps the epoch, so no
      // guarded snapshot activation can interleave. A query that captured the old bit may finish,
      // but no later activation from this epoch can win a race and republish it.
      indexer.retireLaneReadiness(control.lane)
      control.epoch += 1n
      control.state = "Retired"
      control.lease = undefined
      return undefined
    }

    const retireGeneration = (control: LaneControl, epoch: bigint): void => {
      if (control.epoch !== epoch) return
      retireAdmission(control)
    }

    // ---- worker side

    const rejectStale = (command: LaneCommand): void => {
      switch (command._tag) {
        case "Assign":
          // A superseded assignment is semantically stale, not an assignment-validation error.
          // Dropping the reply makes its waiter observe retirement.
          Deferred.unsafeDone(command.response, Exit.fail(RESPONSE_DROPPED))
          return
        case "Snapshot":
          Deferred.unsafeDone(command.response, Exit.fail(new LaneRetired({ lane: command.lane })))
          return
        case "Drain":
          Deferred.unsafeDone(command.response, Exit.fail(new LaneRetired({ lane: command.lane })))
          return
        case "Delta":
          return
      }
    }

    /** The lane's worker state when the command's epoch is current; otherwise rejects it. */
    const admitCommand = (worker: Worker, command: LaneCommand): WorkerLane | undefined => {
      const workerLane = worker.lanes[command.lane]
      if (workerLane === undefined) {
        throw new Error(
          `lane-sticky dispatch sent lane ${command.lane} to worker ${worker.index}, which does not own it`
        )
      }
      const control = workerLane.control
      if (control.permanentlyFenced) {
        workerLane.ingestor.retire()
        rejectStale(command)
        return undefined
      }
      if (workerLane.observedEpoch !== control.epoch) {
        workerLane.ingestor.retire()
        workerLane.observedEpoch = control.epoch
      }
      // The ingestor was retired just above, so a stale command could not write; it is still
      // rejected, as in the seed: its waiter must see LaneRetired, and a superseded assignment
      // applied here would spend the lease's epoch in the ingestor but not at the pool.
      if (command.epoch !== control.epoch) {
        rejectStale(command)
        return undefined
      }
      return workerLane
    }

    /** Retirement can race a command being applied; it must not leave that command's lane live. */
    const recheckAfterApply = (workerLane: WorkerLane, epoch: bigint): void => {
      const control = workerLane.control
      if (control.permanentlyFenced || control.epoch !== epoch) workerLane.ingestor.retire()
    }

    const observeOutcome = (
      control: LaneControl,
      epoch: bigint,
      lease: LaneLease,
      outcome: GlobalCkfIngestOutcome,
      disposition: CkfFailureDisposition | undefined
    ): void => {
      if (outcome._tag !== "LaneDeactivated") return
      if (disposition === undefined) {
        throw new Error(
          `global CKF lane ${control.lane} deactivation (${outcome.fault._tag}) carries no failure disposition`
        )
      }
      switch (disposition.action) {
        case "RetrySnapshot":
          // Snapshot validation failed while the lane was already inactive and before writes.
          // Preserve the current assignment so the same lease can install a corrected image.
          break
        case "DeactivateAndSnapshot":
          retireGeneration(control, epoch)
          break
        default:
          throw new Error(
            `unexpected consumer-lane failure action ${disposition.action} on global CKF lane ${control.lane}`
          )
      }
      reportFault(
        GlobalCkfIngestionFault.LaneDeactivated({
          lane: control.lane,
          lease,
          fault: outcome.fault,
          disposition
        })
      )
    }

    /** The activation guard: only the admission epoch that is still current may publish readiness. */
    const activateIfCurrent = (
      control: LaneControl,
      epoch: bigint,
      lease: LaneLease,
      ingestor: GlobalCkfLaneIngestor,
      sequence: bigint
    ): boolean => {
      if (
        control.permanentlyFenced ||
        control.epoch !== epoch ||
        !lease.equals(control.lease) ||
        control.state !== "AwaitingSnapshot"
      ) {
        return false
      }
      ingestor.activateSnapshot(sequence)
      return true
    }

    const finishSnapshot = (
      workerLane: WorkerLane,
      command: SnapshotCommand,
      outcome: GlobalCkfIngestOutcome
    ): void => {
      const failure = workerLane.ingestor.lastFailureDisposition
      observeOutcome(workerLane.control, command.epoch, command.snapshot.lease, outcome, failure)
      Deferred.unsafeDone(command.response, Exit.succeed({ outcome, failureDisposition: failure }))
      recheckAfterApply(workerLane, command.epoch)
    }

    const processSnapshot = (worker: Worker, command: SnapshotCommand): Effect.Effect<void> =>
      Effect.suspend(() => {
        const workerLane = admitCommand(worker, command)
        if (workerLane === undefined) return Effect.void
        const { control, ingestor } = workerLane
        const pause = control.snapshotActivationPause
        if (pause === undefined) {
          const outcome = ingestor.installSnapshotGuarded(command.snapshot, (owner, sequence) =>
            activateIfCurrent(control, command.epoch, command.snapshot.lease, owner, sequence)
          )
          finishSnapshot(workerLane, command, outcome)
          return Effect.void
        }
        // Test hook: the same guard, run after the worker is held between the bucket writes and the
        // activation check (the seed's `pause_before_snapshot_activation`).
        let pending: bigint | undefined
        const written = ingestor.installSnapshotGuarded(command.snapshot, (_, sequence) => {
          pending = sequence
          return false
        })
        if (pending === undefined) {
          // Like the seed's hook, the pause stays armed until a snapshot reaches activation.
          finishSnapshot(workerLane, command, written)
          return Effect.void
        }
        control.snapshotActivationPause = undefined
        const sequence = pending
        return Deferred.succeed(pause.entered, undefined).pipe(
          Effect.zipRight(Deferred.await(pause.release)),
          Effect.zipRight(
            Effect.sync(() => {
              const activated = activateIfCurrent(
                control,
                command.epoch,
                command.snapshot.lease,
                ingestor,
                sequence
              )
              finishSnapshot(
                workerLane,
                command,
                activated ? { _tag: "SnapshotInstalled", sequence } : written
              )
            })
          )
        )
      })

    const processSync = (worker: Worker, command: AssignCommand | DeltaCommand | DrainCommand): void => {
      switch (command._tag) {
        case "Assign": {
          const workerLane = admitCommand(worker, command)
          if (workerLane === undefined) return
          const error = workerLane.ingestor.assign(command.identity, command.lease)
          Deferred.unsafeDone(command.response, Exit.succeed(error))
          recheckAfterApply(workerLane, command.epoch)
          return
        }
        case "Delta": {
          try {
            const workerLane = admitCommand(worker, command)
            if (workerLane === undefined) return
            const outcome = workerLane.ingestor.applyDelta(command.delta)
            observeOutcome(
              workerLane.control,
              command.epoch,
              command.delta.lease,
              outcome,
              workerLane.ingestor.lastFailureDisposition
            )
            recheckAfterApply(workerLane, command.epoch)
          } finally {
            releasePermit(command.permit)
          }
          return
        }
        case "Drain": {
          const workerLane = admitCommand(worker, command)
          if (workerLane === undefined) return
          const outcome = workerLane.ingestor.completeDrain(command.marker)
          observeOutcome(
            workerLane.control,
            command.epoch,
            command.marker.lease,
            outcome,
            workerLane.ingestor.lastFailureDisposition
          )
          Deferred.unsafeDone(command.response, Exit.succeed(outcome))
          recheckAfterApply(workerLane, command.epoch)
          return
        }
      }
    }

    const retireAllIngestors = (worker: Worker): void => {
      for (const workerLane of worker.lanes) workerLane?.ingestor.retire()
    }

    const dropCommand = (command: IngestionCommand): void => {
      switch (command._tag) {
        case "Delta":
          releasePermit(command.permit)
          return
        case "Assign":
          Deferred.unsafeDone(command.response, Exit.fail(RESPONSE_DROPPED))
          return
        case "Snapshot":
          Deferred.unsafeDone(command.response, Exit.fail(RESPONSE_DROPPED))
          return
        case "Drain":
          Deferred.unsafeDone(command.response, Exit.fail(RESPONSE_DROPPED))
          return
        case "Pause":
        case "Crash":
          return
      }
    }

    const workerLoop = (worker: Worker): Effect.Effect<never> =>
      Effect.gen(function* () {
        for (;;) {
          const command = yield* Queue.take(worker.queue)
          switch (command._tag) {
            case "Pause":
              yield* Deferred.succeed(command.gate.entered, undefined)
              yield* Deferred.await(command.gate.release)
              break
            case "Crash":
              return yield* Effect.dieMessage(`injected global CKF ingestion worker ${worker.index} failure`)
            case "Snapshot":
              yield* processSnapshot(worker, command)
              break
            default:
              yield* Effect.sync(() => processSync(worker, command))
          }
        }
      })

    const onWorkerFailure = (worker: Worker, cause: Cause.Cause<never>): Effect.Effect<void> =>
      Effect.gen(function* () {
        // Retire before publishing the fault so observers cannot see failure with live lanes.
        retireAllIngestors(worker)
        health.recordFailure(worker.index)
        reportFault(GlobalCkfIngestionFault.WorkerFailed({ worker: worker.index }))
        worker.running = false
        Deferred.unsafeDone(worker.exited, Exit.void)
        // The seed's worker is dropped here, which gives its lanes back and drops its queue.
        for (const workerLane of worker.lanes) workerLane?.ingestor.release()
        for (const command of yield* Queue.takeAll(worker.queue)) dropCommand(command)
        yield* Effect.logError("global CKF ingestion worker failed; its lanes were retired", cause).pipe(
          Effect.annotateLogs({ worker: worker.index })
        )
      })

    for (const worker of workers) {
      yield* workerLoop(worker).pipe(
        Effect.catchAllCause((cause) =>
          Cause.isInterruptedOnly(cause) ? Effect.failCause(cause) : onWorkerFailure(worker, cause)
        ),
        Effect.ensuring(
          Effect.sync(() => {
            retireAllIngestors(worker)
            worker.running = false
            Deferred.unsafeDone(worker.exited, Exit.void)
          })
        ),
        Effect.forkScoped
      )
    }

    // Fail closed before the workers stop: a command already in application rechecks its epoch
    // before returning, and queued tail commands become no-ops. Registered after the workers so
    // that it runs before them on scope close.
    yield* Effect.addFinalizer(() =>
      Effect.sync(() => {
        closed = true
        for (const control of routes) if (control !== undefined) retireAdmission(control)
      })
    )

    // ---- lag watchdog

    const fenceExpiredLanes = (now: number): Array<GlobalCkfIngestionFault> => {
      const fenced: Array<GlobalCkfIngestionFault> = []
      for (const control of routes) {
        if (control === undefined || control.state !== "Active") continue
        const age = oldestOutstandingAge(control, now)
        if (age === undefined || age < control.maxDirtyToAppliedAgeMs) continue
        const lease = control.lease
        retireAdmission(control)
        const fault = GlobalCkfIngestionFault.DirtyToAppliedAgeExceeded({ lane: control.lane, lease })
        reportFault(fault)
        fenced.push(fault)
      }
      return fenced
    }

    // NOTE: One fixed ingestion pool and watchdog per consumer is the deliberately simple initial
    // topology. Revisit shared execution before supporting high consumer/domain cardinality; do
    // not complicate lane ordering speculatively.
    const pollInterval = lagPollInterval(resolved.maxDirtyToAppliedAge)
    yield* Effect.sleep(pollInterval).pipe(
      Effect.zipRight(Effect.sync(() => fenceExpiredLanes(nowMs()))),
      Effect.flatMap((fenced) =>
        Effect.forEach(
          fenced,
          (fault) =>
            Effect.logWarning(
              "global CKF lane exceeded its dirty-to-applied age; its lease was retired"
            ).pipe(
              Effect.annotateLogs(
                fault._tag === "DirtyToAppliedAgeExceeded" ? laneAnnotations(fault.lane, fault.lease) : {}
              )
            ),
          { discard: true }
        )
      ),
      Effect.forever,
      Effect.forkScoped
    )

    // ---- pool side

    const routeOf = (lane: number): LaneControl | UnconfiguredLane =>
      (Number.isInteger(lane) && lane >= 0 && lane < CKF_LANE_COUNT ? routes[lane] : undefined) ??
      new UnconfiguredLane({ lane })

    /** Fails like the seed's `ensure_worker`; after close every lane is retired. */
    const unavailable = (control: LaneControl): LaneRetired | WorkerFailed | undefined => {
      if (closed) return new LaneRetired({ lane: control.lane })
      if (health.isFailed(control.worker) || !workers[control.worker]!.running) {
        return new WorkerFailed({ worker: control.worker })
      }
      return undefined
    }

    const retireOnTimeout = (control: LaneControl, epoch: bigint): AdmissionEpochExhausted | undefined =>
      control.epoch === epoch ? retireAdmission(control) : undefined

    const timedOut = (control: LaneControl, epoch: bigint): Effect.Effect<never, GlobalCkfIngestionError> =>
      Effect.suspend((): Effect.Effect<never, GlobalCkfIngestionError> => {
        const exhausted = retireOnTimeout(control, epoch)
        if (exhausted !== undefined) return Effect.fail(exhausted)
        return Effect.logWarning("global CKF control operation timed out; its lease was retired").pipe(
          Effect.annotateLogs({ lane: control.lane, worker: control.worker }),
          Effect.zipRight(Effect.fail(new ControlTimeout({ lane: control.lane })))
        )
      })

    /** A reply that will never come: the worker failed, or the pool closed under the waiter. */
    const dropped = (control: LaneControl): LaneRetired | WorkerFailed =>
      health.isFailed(control.worker)
        ? new WorkerFailed({ worker: control.worker })
        : new LaneRetired({ lane: control.lane })

    const sendControl = (
      control: LaneControl,
      epoch: bigint,
      command: IngestionCommand
    ): Effect.Effect<void, GlobalCkfIngestionError> => {
      const worker = workers[control.worker]!
      return Queue.offer(worker.queue, command).pipe(
        Effect.raceFirst(Deferred.await(worker.exited).pipe(Effect.as(false))),
        Effect.timeoutOption(controlTimeout),
        Effect.flatMap(
          Option.match({
            onNone: () => timedOut(control, epoch),
            onSome: (delivered) => (delivered ? Effect.void : Effect.fail(dropped(control)))
          })
        )
      )
    }

    const awaitResponse = <A, E extends GlobalCkfIngestionError | ResponseDropped>(
      control: LaneControl,
      epoch: bigint,
      response: Deferred.Deferred<A, E>
    ): Effect.Effect<A, GlobalCkfIngestionError> => {
      const worker = workers[control.worker]!
      return Deferred.await(response).pipe(
        Effect.raceFirst(Deferred.await(worker.exited).pipe(Effect.zipRight(Effect.fail(RESPONSE_DROPPED)))),
        Effect.timeoutOption(controlTimeout),
        Effect.catchIf(
          (error): error is ResponseDropped => error instanceof ResponseDropped,
          () => Effect.fail(dropped(control))
        ),
        Effect.flatMap(
          Option.match({
            onNone: () => timedOut(control, epoch),
            onSome: (value) => Effect.succeed(value)
          })
        )
      )
    }

    const beginAssignment = (
      control: LaneControl,
      identity: ProducerIdentity,
      lease: LaneLease
    ): bigint | GlobalCkfIngestionError => {
      const lane = control.lane
      if (control.permanentlyFenced) return new AdmissionEpochExhausted({ lane })
      const invalid = validateAssignment(indexer.manifest, lane, identity, lease, control.lastAssignmentEpoch)
      if (invalid !== undefined) return new AssignmentRejected({ lane, error: invalid })
      if (control.epoch === U64_MAX) {
        permanentlyFence(control)
        return new AdmissionEpochExhausted({ lane })
      }
      // NOTE: a rejected stale/foreign assignment never reaches this point, so it cannot clear
      // the currently valid lane. Once transition begins, readiness is retired before any lease
      // state changes.
      indexer.retireLaneReadiness(lane)
      control.epoch += 1n
      control.state = "Transitioning"
      control.lease = lease
      return control.epoch
    }

    const finishAssignment = (
      control: LaneControl,
      epoch: bigint,
      lease: LaneLease,
      result: GlobalCkfAssignmentError | undefined
    ): GlobalCkfIngestionError | undefined => {
      if (control.epoch !== epoch) return new LaneRetired({ lane: control.lane })
      if (result === undefined) {
        control.state = "AwaitingSnapshot"
        control.lastAssignmentEpoch = lease.assignmentEpoch
        return undefined
      }
      control.state = "Retired"
      control.lease = undefined
      return new AssignmentRejected({ lane: control.lane, error: result })
    }

    const assign = (
      identity: ProducerIdentity,
      lease: LaneLease
    ): Effect.Effect<void, GlobalCkfIngestionError> =>
      Effect.suspend(() => {
        const control = routeOf(lease.physicalLane)
        if (control instanceof UnconfiguredLane) return Effect.fail(control)
        return control.transition.withPermits(1)(
          Effect.gen(function* () {
            const down = unavailable(control)
            if (down !== undefined) return yield* Effect.fail(down)
            const begun = beginAssignment(control, identity, lease)
            if (typeof begun !== "bigint") return yield* Effect.fail(begun)
            const epoch = begun
            const response = yield* Deferred.make<GlobalCkfAssignmentError | undefined, ResponseDropped>()
            yield* sendControl(control, epoch, {
              _tag: "Assign",
              lane: control.lane,
              epoch,
              identity,
              lease,
              response
            })
            const result = yield* awaitResponse(control, epoch, response)
            const failed = finishAssignment(control, epoch, lease, result)
            if (failed !== undefined) return yield* Effect.fail(failed)
            yield* Effect.logDebug("global CKF lane assigned; awaiting snapshot")
          })
        )
      }).pipe(
        Effect.annotateLogs(laneAnnotations(lease.physicalLane, lease)),
        Effect.withSpan("GlobalCkfIngestionPool.assign", {
          attributes: { lane: lease.physicalLane, assignmentEpoch: String(lease.assignmentEpoch) }
        })
      )

    const beginSnapshot = (
      control: LaneControl,
      snapshot: DcCkfSnapshot
    ): bigint | GlobalCkfIngestionError => {
      const lane = control.lane
      switch (control.state) {
        case "AwaitingSnapshot":
        case "Active":
          break
        case "Unassigned":
          return new LaneUnassigned({ lane })
        case "Transitioning":
        case "Retired":
          return new LaneRetired({ lane })
      }
      if (!snapshot.lease.equals(control.lease)) return new LaneRetired({ lane })
      return control.epoch
    }

    const finishSnapshotAdmission = (
      control: LaneControl,
      epoch: bigint,
      processed: ProcessedIngestOutcome
    ): GlobalCkfIngestOutcome | LaneRetired => {
      const outcome = processed.outcome
      if (control.epoch !== epoch) {
        return outcome._tag === "LaneDeactivated" ? outcome : new LaneRetired({ lane: control.lane })
      }
      if (outcome._tag === "SnapshotInstalled") {
        control.state = "Active"
      } else if (outcome._tag === "LaneDeactivated") {
        // An inactive snapshot validates before any bucket write. Keep the assignment in
        // AwaitingSnapshot so the adapter can retry without recovering the producer.
        control.state =
          processed.failureDisposition?.action === "RetrySnapshot" ? "AwaitingSnapshot" : "Retired"
      }
      return outcome
    }

    const installSnapshot = (
      snapshot: DcCkfSnapshot
    ): Effect.Effect<GlobalCkfIngestOutcome, GlobalCkfIngestionError> =>
      Effect.suspend(() => {
        const control = routeOf(snapshot.lease.physicalLane)
        if (control instanceof UnconfiguredLane) return Effect.fail(control)
        return control.transition.withPermits(1)(
          Effect.gen(function* () {
            const down = unavailable(control)
            if (down !== undefined) return yield* Effect.fail(down)
            const begun = beginSnapshot(control, snapshot)
            if (typeof begun !== "bigint") return yield* Effect.fail(begun)
            const epoch = begun
            const response = yield* Deferred.make<ProcessedIngestOutcome, LaneRetired | ResponseDropped>()
            yield* sendControl(control, epoch, {
              _tag: "Snapshot",
              lane: control.lane,
              epoch,
              snapshot,
              response
            })
            const processed = yield* awaitResponse(control, epoch, response)
            const outcome = finishSnapshotAdmission(control, epoch, processed)
            if (outcome instanceof LaneRetired) return yield* Effect.fail(outcome)
            if (outcome._tag === "LaneDeactivated") {
              yield* Effect.logWarning("global CKF snapshot deactivated its lane").pipe(
                Effect.annotateLogs({
                  fault: outcome.fault._tag,
                  action: processed.failureDisposition?.action ?? "none"
                })
              )
            }
            return outcome
          })
        )
      }).pipe(
        Effect.annotateLogs(laneAnnotations(snapshot.lease.physicalLane, snapshot.lease)),
        Effect.annotateLogs("sequence", String(snapshot.sequence)),
        Effect.withSpan("GlobalCkfIngestionPool.installSnapshot", {
          attributes: {
            lane: snapshot.lease.physicalLane,
            assignmentEpoch: String(snapshot.lease.assignmentEpoch),
            sequence: String(snapshot.sequence)
          }
        })
      )

    /** The whole admission of a delta: one synchronous section, ending with a non-blocking offer. */
    const admitDelta = (delta: DcCkfDelta): GlobalCkfIngestionError | undefined => {
      const control = routeOf(delta.lease.physicalLane)
      if (control instanceof UnconfiguredLane) return control
      const down = unavailable(control)
      if (down !== undefined) return down
      const lane = control.lane
      switch (control.state) {
        case "Active":
          break
        case "AwaitingSnapshot":
          return new AwaitingSnapshot({ lane })
        case "Unassigned":
          return new LaneUnassigned({ lane })
        case "Transitioning":
        case "Retired":
          return new LaneRetired({ lane })
      }
      if (!delta.lease.equals(control.lease)) return new LaneRetired({ lane })
      const epoch = control.epoch
      const images = imageCount(delta)
      const submittedAt = nowMs()
      const age = oldestOutstandingAge(control, submittedAt)
      if (age !== undefined && age >= control.maxDirtyToAppliedAgeMs) {
        const lease = control.lease
        retireAdmission(control)
        reportFault(GlobalCkfIngestionFault.DirtyToAppliedAgeExceeded({ lane, lease }))
        return new DirtyToAppliedAgeExceeded({ lane })
      }
      const requested = control.outstandingImages + images
      if (requested > control.maxOutstandingImages) {
        const lease = control.lease
        const limit = control.maxOutstandingImages
        retireAdmission(control)
        reportFault(GlobalCkfIngestionFault.OutstandingImageLimit({ lane, lease, requested, limit }))
        return new OutstandingImageLimit({ lane, requested, limit })
      }
      if (control.nextDeltaId >= Number.MAX_SAFE_INTEGER) {
        permanentlyFence(control)
        return new AdmissionEpochExhausted({ lane })
      }
      const id = ++control.nextDeltaId
      control.outstandingImages = requested
      control.outstanding.push({ id, images, submittedAt })
      const permit: DeltaPermit = { control, id }
      const worker = workers[control.worker]!
      if (Queue.unsafeOffer(worker.queue, { _tag: "Delta", lane, epoch, delta, permit })) return undefined
      // Image permits are lane-attributable, but the physical queue is shared by every lane
      // sticky to this worker. Exact queue-slot fairness would require per-lane subqueues or a
      // scheduler; this failure retires only the submitting lane.
      const lease = control.lease
      const retirement = retireAdmission(control)
      releasePermit(permit)
      if (retirement !== undefined) return retirement
      reportFault(GlobalCkfIngestionFault.Saturated({ lane, lease }))
      return new Saturated({ lane })
    }

    const submitDelta = (delta: DcCkfDelta): Effect.Effect<void, GlobalCkfIngestionError> =>
      Effect.suspend(() => {
        const error = admitDelta(delta)
        if (error === undefined) return Effect.void
        if (ingestionErrorDisposition(error) === undefined) return Effect.fail(error)
        return Effect.logWarning(error.message).pipe(
          Effect.annotateLogs(laneAnnotations(delta.lease.physicalLane, delta.lease)),
          Effect.annotateLogs("sequence", String(delta.sequence)),
          Effect.zipRight(Effect.fail(error))
        )
      })

    const completeDrain = (
      marker: ConsumerDrainMarker
    ): Effect.Effect<GlobalCkfIngestOutcome, GlobalCkfIngestionError> =>
      Effect.suspend(() => {
        const control = routeOf(marker.lease.physicalLane)
        if (control instanceof UnconfiguredLane) return Effect.fail(control)
        return control.transition.withPermits(1)(
          Effect.gen(function* () {
            const down = unavailable(control)
            if (down !== undefined) return yield* Effect.fail(down)
            if (control.state !== "Active" || !marker.lease.equals(control.lease)) {
              return yield* Effect.fail(new LaneRetired({ lane: control.lane }))
            }
            const epoch = control.epoch
            const response = yield* Deferred.make<GlobalCkfIngestOutcome, LaneRetired | ResponseDropped>()
            yield* sendControl(control, epoch, { _tag: "Drain", lane: control.lane, epoch, marker, response })
            const outcome = yield* awaitResponse(control, epoch, response)
            yield* Effect.logDebug("global CKF drain marker processed").pipe(
              Effect.annotateLogs("outcome", outcome._tag)
            )
            return outcome
          })
        )
      }).pipe(
        Effect.annotateLogs(laneAnnotations(marker.lease.physicalLane, marker.lease)),
        Effect.withSpan("GlobalCkfIngestionPool.completeDrain", {
          attributes: {
            lane: marker.lease.physicalLane,
            assignmentEpoch: String(marker.lease.assignmentEpoch),
            expectedSequence: String(marker.expectedSequence)
          }
        })
      )

    // ---- test hooks

    const makeGate = Effect.all({ entered: Deferred.make<void>(), release: Deferred.make<void>() })
    const handleOf = (gate: PauseGate): PauseHandle => ({
      entered: Deferred.await(gate.entered),
      release: Deferred.succeed(gate.release, undefined).pipe(Effect.asVoid)
    })
    const withRoute = <A, E>(
      lane: number,
      f: (control: LaneControl) => Effect.Effect<A, E>
    ): Effect.Effect<A, E | UnconfiguredLane> =>
      Effect.suspend((): Effect.Effect<A, E | UnconfiguredLane> => {
        const control = routeOf(lane)
        return control instanceof UnconfiguredLane ? Effect.fail(control) : f(control)
      })

    const testHooks: GlobalCkfIngestionPoolTestHooks | undefined = options.testHooks
      ? {
          pauseLaneWorker: (lane) =>
            withRoute(lane, (control) =>
              Effect.gen(function* () {
                const gate = yield* makeGate
                yield* Queue.offer(workers[control.worker]!.queue, { _tag: "Pause", gate })
                return handleOf(gate)
              })
            ),
          crashLaneWorker: (lane) =>
            withRoute(lane, (control) => Queue.offer(workers[control.worker]!.queue, { _tag: "Crash" })).pipe(
              Effect.asVoid
            ),
          pauseNextSnapshotActivation: (lane) =>
            withRoute(lane, (control) =>
              makeGate.pipe(
                Effect.map((gate) => {
                  control.snapshotActivationPause = gate
                  return handleOf(gate)
                })
              )
            ),
          retireLane: (lane) =>
            withRoute(lane, (control) =>
              Effect.suspend(() => {
                const exhausted = retireAdmission(control)
                return exhausted === undefined ? Effect.void : Effect.fail(exhausted)
              })
            ),
          exhaustLaneEpoch: (lane) =>
            withRoute(lane, (control) =>
              Effect.sync(() => {
                control.epoch = U64_MAX
              })
            )
        }
      : undefined

    const pool: GlobalCkfIngestionPool = {
      indexer,
      workerCount,
      workerForLane: (lane) =>
        Number.isInteger(lane) && lane >= 0 && lane < CKF_LANE_COUNT ? routes[lane]?.worker : undefined,
      failedWorker: Effect.sync(() => Option.fromNullable(health.failedWorker())),
      isWorkerFailed: (worker) => Effect.sync(() => health.isFailed(worker)),
      faults,
      tryRecvFault: Queue.poll(faults),
      assign,
      installSnapshot,
      submitDelta,
      completeDrain
    }
    return { pool, testHooks }
  })
