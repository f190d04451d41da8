/**
 * The ingestion pool's per-lane and per-worker state: admission state, outstanding deltas and
 * their permits, pause gates, the commands a worker's FIFO carries, and the resolved settings.
 */

import { type Deferred, Duration, type Effect, Option, type Queue } from "effect"
import type { CkfFailureDisposition } from "../../ckf/failure.js"
import type {
  GlobalCkfAssignmentError,
  GlobalCkfIndexer,
  GlobalCkfIngestOutcome,
  GlobalCkfLaneIngestor
} from "../../ckf/global.js"
import type { ConsumerDrainMarker, LaneLease, ProducerIdentity } from "../../ckf/identity.js"
import type { DcCkfDelta, DcCkfSnapshot } from "../../ckf/publisher.js"
import {
  GlobalCkfIngestionPoolConfigError,
  type GlobalCkfIngestionPoolConfigErrorKind,
  type LaneRetired
} from "../ConsumerErrors.js"
import {
  defaultGlobalCkfIngestionPoolConfig,
  type GlobalCkfIngestionPoolConfig
} from "../GlobalCkfIngestionPool.js"

// ---------------------------------------------------------------------------------------------
// Internal state

type LaneAdmissionState = "Unassigned" | "Transitioning" | "AwaitingSnapshot" | "Active" | "Retired"

interface OutstandingDelta {
  readonly id: number
  readonly images: number
  /** Clock milliseconds (fractional). */
  readonly submittedAt: number
}

export interface PauseGate {
  readonly entered: Deferred.Deferred<void>
  readonly release: Deferred.Deferred<void>
}

export class LaneControl {
  epoch = 0n
  permanentlyFenced = false
  state: LaneAdmissionState = "Unassigned"
  lease: LaneLease | undefined = undefined
  lastAssignmentEpoch: bigint | undefined = undefined
  nextDeltaId = 0
  outstandingImages = 0
  /** Admission order; the worker completes them in the same order on the normal path. */
  readonly outstanding: Array<OutstandingDelta> = []
  snapshotActivationPause: PauseGate | undefined = undefined

  constructor(
    readonly lane: number,
    readonly worker: number,
    readonly maxOutstandingImages: number,
    readonly maxDirtyToAppliedAgeMs: number,
    readonly transition: Effect.Semaphore
  ) {}
}

/** The delta's share of its lane's outstanding-image and age accounting, released exactly once. */
export interface DeltaPermit {
  readonly control: LaneControl
  readonly id: number
}

// Internal marker: the worker dropped the reply (the seed's disconnected oneshot).
export class ResponseDropped {
  readonly _tag = "ResponseDropped"
}

export const RESPONSE_DROPPED = new ResponseDropped()

export interface ProcessedIngestOutcome {
  readonly outcome: GlobalCkfIngestOutcome
  readonly failureDisposition: CkfFailureDisposition | undefined
}

export type AssignCommand = {
  readonly _tag: "Assign"
  readonly lane: number
  readonly epoch: bigint
  readonly identity: ProducerIdentity
  readonly lease: LaneLease
  readonly response: Deferred.Deferred<GlobalCkfAssignmentError | undefined, ResponseDropped>
}

export type SnapshotCommand = {
  readonly _tag: "Snapshot"
  readonly lane: number
  readonly epoch: bigint
  readonly snapshot: DcCkfSnapshot
  readonly response: Deferred.Deferred<ProcessedIngestOutcome, LaneRetired | ResponseDropped>
}

export type DeltaCommand = {
  readonly _tag: "Delta"
  readonly lane: number
  readonly epoch: bigint
  readonly delta: DcCkfDelta
  readonly permit: DeltaPermit
}

export type DrainCommand = {
  readonly _tag: "Drain"
  readonly lane: number
  readonly epoch: bigint
  readonly marker: ConsumerDrainMarker
  readonly response: Deferred.Deferred<GlobalCkfIngestOutcome, LaneRetired | ResponseDropped>
}

export type LaneCommand = AssignCommand | SnapshotCommand | DeltaCommand | DrainCommand

export type IngestionCommand =
  | LaneCommand
  | { readonly _tag: "Pause"; readonly gate: PauseGate }
  | { readonly _tag: "Crash" }

export interface WorkerLane {
  readonly ingestor: GlobalCkfLaneIngestor
  readonly control: LaneControl
  observedEpoch: bigint
}

export interface Worker {
  readonly index: number
  readonly queue: Queue.Queue<IngestionCommand>
  readonly lanes: Array<WorkerLane | undefined>
  /** Completed when the worker fiber is gone (failure or pool close): the seed's dropped receiver. */
  readonly exited: Deferred.Deferred<void>
  running: boolean
}

interface ResolvedConfig {
  readonly workerCount: number
  readonly queueCapacity: number
  readonly controlTimeout: Duration.Duration
  readonly maxOutstandingImages: number
  readonly maxDirtyToAppliedAge: Duration.Duration
}

const isPositiveCount = (value: unknown): value is number =>
  typeof value === "number" && Number.isSafeInteger(value) && value > 0

const positiveDuration = (value: unknown): Duration.Duration | undefined => {
  const decoded = Duration.decodeUnknown(value)
  if (Option.isNone(decoded) || Duration.isZero(decoded.value)) return undefined
  return decoded.value
}

export const resolveConfig = (
  indexer: GlobalCkfIndexer,
  input: Partial<GlobalCkfIngestionPoolConfig>
): ResolvedConfig | GlobalCkfIngestionPoolConfigError => {
  const config = { ...defaultGlobalCkfIngestionPoolConfig, ...input }
  const invalid = (kind: GlobalCkfIngestionPoolConfigErrorKind, value: unknown) =>
    new GlobalCkfIngestionPoolConfigError({ kind, value })
  // Validation order of the seed: workers, queue, control timeout, image bound, age.
  if (!isPositiveCount(config.workerCount)) return invalid("InvalidWorkerCount", config.workerCount)
  if (!isPositiveCount(config.queueCapacity)) return invalid("InvalidQueueCapacity", config.queueCapacity)
  const controlTimeout = positiveDuration(config.controlTimeout)
  if (controlTimeout === undefined) return invalid("InvalidControlTimeout", config.controlTimeout)
  const bound = config.maxOutstandingImagesPerLane
  if (bound !== undefined && !isPositiveCount(bound)) return invalid("InvalidOutstandingImageBound", bound)
  const maxDirtyToAppliedAge = positiveDuration(config.maxDirtyToAppliedAge)
  if (maxDirtyToAppliedAge === undefined)
    return invalid("InvalidDirtyToAppliedAge", config.maxDirtyToAppliedAge)
  return {
    workerCount: config.workerCount,
    queueCapacity: config.queueCapacity,
    controlTimeout,
    maxOutstandingImages: bound ?? indexer.manifest.format.bucketCount,
    maxDirtyToAppliedAge
  }
}

export const imageCount = (delta: DcCkfDelta): number => Math.ceil(delta.images.length / 3)

export const releasePermit = (permit: DeltaPermit): void => {
  const control = permit.control
  const queue = control.outstanding
  let released: OutstandingDelta | undefined
  if (queue.length > 0 && queue[0]!.id === permit.id) {
    released = queue.shift()
  } else if (queue.length > 0 && queue[queue.length - 1]!.id === permit.id) {
    // A failed offer drops the just-admitted delta before older queued work.
    released = queue.pop()
  } else {
    // Exceptional worker teardown need not preserve permit-release order. Keep that cold path
    // correct without making ordinary FIFO completion scan the backlog.
    const position = queue.findIndex((delta) => delta.id === permit.id)
    if (position >= 0) released = queue.splice(position, 1)[0]
  }
  if (released === undefined) return
  const remaining = control.outstandingImages - released.images
  if (remaining < 0) throw new Error(`global CKF lane ${control.lane} delta permit accounting underflowed`)
  control.outstandingImages = remaining
}

export const oldestOutstandingAge = (control: LaneControl, now: number): number | undefined => {
  const oldest = control.outstanding[0]
  return oldest === undefined ? undefined : Math.max(0, now - oldest.submittedAt)
}

export const laneAnnotations = (lane: number, lease: LaneLease | undefined) => ({
  lane,
  assignmentEpoch: lease === undefined ? "none" : String(lease.assignmentEpoch)
})
