/**
 * Bounded lane-sticky dispatch for indexer-domain-scoped global CKF ingestion (seed 004,
 * `ingestion_pool.rs`).
 *
 * A physical lane has exactly one ingestion-worker owner. Deltas are admitted without waiting,
 * while assignment, snapshot installation and exact-drain markers await the same FIFO. Queue
 * placement preserves lane order only; queries keep reading just the ready mask and the packed
 * buckets owned by `GlobalCkfIndexer`.
 *
 * Concurrency model. JavaScript runs one fiber at a time, so the seed's per-lane admission mutex
 * becomes a rule: every read-modify-write of a lane's admission state is a synchronous block
 * with no `yield*` inside it. The seed's per-lane transition mutex, which serialises the awaited
 * control operations of one lane, is a one-permit semaphore held across the send and the reply.
 * The seed's `published_epoch` atomic mirrors the admission epoch for lock-free worker reads; with
 * one fiber running at a time the admission epoch itself is that value.
 */

import { Context, Data, Duration, type Effect, type Option, type Queue } from "effect"
import { type CkfFailureDisposition, failureDisposition } from "../ckf/failure.js"
import type { GlobalCkfIndexer, GlobalCkfIngestOutcome, GlobalCkfLaneFault } from "../ckf/global.js"
import type { ConsumerDrainMarker, LaneLease, ProducerIdentity } from "../ckf/identity.js"
import type { DcCkfDelta, DcCkfSnapshot } from "../ckf/publisher.js"
import type { GlobalCkfIngestionError } from "./ConsumerErrors.js"

// ---------------------------------------------------------------------------------------------
// Configuration

/** Ingestion workers by default. */
export const DEFAULT_GLOBAL_INGESTION_WORKERS = 4
/** Commands each worker's queue holds by default. */
export const DEFAULT_GLOBAL_INGESTION_QUEUE_CAPACITY = 256
/** How long a lane control operation may take by default. */
export const DEFAULT_GLOBAL_INGESTION_CONTROL_TIMEOUT: Duration.Duration = Duration.seconds(10)
/** How long a lane's oldest unapplied change may wait by default. */
export const DEFAULT_GLOBAL_MAX_DIRTY_TO_APPLIED_AGE: Duration.Duration = Duration.millis(10)

/** The ingestion pool's workers, queues and time limits. */
export interface GlobalCkfIngestionPoolConfig {
  /** Sticky ingestion workers (fibers), each with its own bounded queue. */
  readonly workerCount: number
  /** Capacity of each worker's queue, shared by every lane sticky to that worker. */
  readonly queueCapacity: number
  /** Bound on each of the send and the reply of an awaited control operation. */
  readonly controlTimeout: Duration.DurationInput
  /** `undefined` uses one complete physical lane (the bucket count), the production safety bound. */
  readonly maxOutstandingImagesPerLane: number | undefined
  readonly maxDirtyToAppliedAge: Duration.DurationInput
}

/** The configuration used when none is given. */
export const defaultGlobalCkfIngestionPoolConfig: GlobalCkfIngestionPoolConfig = Object.freeze({
  workerCount: DEFAULT_GLOBAL_INGESTION_WORKERS,
  queueCapacity: DEFAULT_GLOBAL_INGESTION_QUEUE_CAPACITY,
  controlTimeout: DEFAULT_GLOBAL_INGESTION_CONTROL_TIMEOUT,
  maxOutstandingImagesPerLane: undefined,
  maxDirtyToAppliedAge: DEFAULT_GLOBAL_MAX_DIRTY_TO_APPLIED_AGE
})

/** The watchdog's poll period: `clamp(age / 4, 100 µs, 10 ms)`. */
export const lagPollInterval = (maxDirtyToAppliedAge: Duration.DurationInput): Duration.Duration =>
  Duration.clamp(Duration.unsafeDivide(Duration.decode(maxDirtyToAppliedAge), 4), {
    minimum: Duration.micros(100n),
    maximum: Duration.millis(10)
  })

/**
 * Recovery disposition of an ingestion error. Admission and assignment rejections return
 * `undefined`: they made no consumer write, and stale or superseded traffic must not fence the
 * current assignment.
 */
export const ingestionErrorDisposition = (
  error: GlobalCkfIngestionError
): CkfFailureDisposition | undefined => {
  switch (error._tag) {
    case "Saturated":
    case "OutstandingImageLimit":
      return failureDisposition("ConsumerGapOrMalformedBeforeWrite")
    case "DirtyToAppliedAgeExceeded":
    case "ControlTimeout":
    case "WorkerFailed":
      return failureDisposition("ConsumerWorkerFailureMidApply")
    case "UnconfiguredLane":
    case "LaneUnassigned":
    case "LaneRetired":
    case "AwaitingSnapshot":
    case "AssignmentRejected":
    case "AdmissionEpochExhausted":
      return undefined
  }
}

// ---------------------------------------------------------------------------------------------
// Faults

/** A fault that retired a lane's lease, as the consumer is told of it. */
export type GlobalCkfIngestionFault = Data.TaggedEnum<{
  Saturated: { readonly lane: number; readonly lease: LaneLease | undefined }
  OutstandingImageLimit: {
    readonly lane: number
    readonly lease: LaneLease | undefined
    readonly requested: number
    readonly limit: number
  }
  DirtyToAppliedAgeExceeded: { readonly lane: number; readonly lease: LaneLease | undefined }
  LaneDeactivated: {
    readonly lane: number
    readonly lease: LaneLease | undefined
    readonly fault: GlobalCkfLaneFault
    readonly disposition: CkfFailureDisposition
  }
  WorkerFailed: { readonly worker: number }
}>

export const GlobalCkfIngestionFault = Data.taggedEnum<GlobalCkfIngestionFault>()

/** Recovery from the consumer state whose commit is known or uncertain. */
export const ingestionFaultDisposition = (fault: GlobalCkfIngestionFault): CkfFailureDisposition => {
  switch (fault._tag) {
    case "LaneDeactivated":
      return fault.disposition
    case "WorkerFailed":
    case "DirtyToAppliedAgeExceeded":
      return failureDisposition("ConsumerWorkerFailureMidApply")
    case "Saturated":
    case "OutstandingImageLimit":
      return failureDisposition("ConsumerGapOrMalformedBeforeWrite")
  }
}

// ---------------------------------------------------------------------------------------------
// Worker health

/** Which workers have failed; a failure is permanent for the pool's lifetime. */
export class WorkerHealth {
  private readonly failed: Uint8Array

  constructor(workerCount: number) {
    this.failed = new Uint8Array(workerCount)
  }

  recordFailure(worker: number): void {
    this.failed[worker] = 1
  }

  isFailed(worker: number): boolean {
    return this.failed[worker] === 1
  }

  /** The lowest failed worker. */
  failedWorker(): number | undefined {
    const index = this.failed.indexOf(1)
    return index < 0 ? undefined : index
  }
}

export interface GlobalCkfIngestionPool {
  readonly indexer: GlobalCkfIndexer
  readonly workerCount: number
  /** The sticky worker of a configured lane. */
  readonly workerForLane: (lane: number) => number | undefined
  /** The lowest failed worker, if any. */
  readonly failedWorker: Effect.Effect<Option.Option<number>>
  readonly isWorkerFailed: (worker: number) => Effect.Effect<boolean>
  /**
   * Diagnostic faults (bounded; when full, later faults are dropped). Readiness is the
   * authoritative failure signal.
   */
  readonly faults: Queue.Dequeue<GlobalCkfIngestionFault>
  /** The next fault if one is queued (`try_recv_fault`). */
  readonly tryRecvFault: Effect.Effect<Option.Option<GlobalCkfIngestionFault>>
  /** Assign a lease; awaited through the lane's FIFO. */
  readonly assign: (
    identity: ProducerIdentity,
    lease: LaneLease
  ) => Effect.Effect<void, GlobalCkfIngestionError>
  /** Install a snapshot for the current lease; awaited through the lane's FIFO. */
  readonly installSnapshot: (
    snapshot: DcCkfSnapshot
  ) => Effect.Effect<GlobalCkfIngestOutcome, GlobalCkfIngestionError>
  /** Admit one delta without waiting for its application (never suspends). */
  readonly submitDelta: (delta: DcCkfDelta) => Effect.Effect<void, GlobalCkfIngestionError>
  /** Exact drain: queued behind the lane's deltas, awaited. */
  readonly completeDrain: (
    marker: ConsumerDrainMarker
  ) => Effect.Effect<GlobalCkfIngestOutcome, GlobalCkfIngestionError>
}

/** One pool per indexer domain; the tag is for the process-wide default domain. */
export const GlobalCkfIngestionPool = Context.GenericTag<GlobalCkfIngestionPool>(
  "kvrelay/consumer/GlobalCkfIngestionPool"
)
