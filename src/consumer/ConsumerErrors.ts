/**
 * The global consumer's errors: those of the ingestion pool (building it, admitting into a lane),
 * of the relay client (transport, status, protocol, pool-stream and catalog-watch ends), of the
 * view's overlap answers, and of the consumer's configuration.
 */

import { Data } from "effect"
import type { GlobalCkfAssignmentError, GlobalCkfBuildError } from "../ckf/global.js"

// ---------------------------------------------------------------------------------------------
// Build errors

/** Which ingestion pool setting was refused. */
export type GlobalCkfIngestionPoolConfigErrorKind =
  | "InvalidWorkerCount"
  | "InvalidQueueCapacity"
  | "InvalidControlTimeout"
  | "InvalidOutstandingImageBound"
  | "InvalidDirtyToAppliedAge"

const configErrorText: Record<GlobalCkfIngestionPoolConfigErrorKind, string> = {
  InvalidWorkerCount: "global CKF ingestion worker count must be greater than zero",
  InvalidQueueCapacity: "global CKF ingestion queue capacity must be greater than zero",
  InvalidControlTimeout: "global CKF ingestion control timeout must be greater than zero",
  InvalidOutstandingImageBound: "global CKF outstanding-image bound must be greater than zero",
  InvalidDirtyToAppliedAge: "global CKF dirty-to-applied age bound must be greater than zero"
}

/** A configuration value is zero (or not a usable count or duration). */
export class GlobalCkfIngestionPoolConfigError extends Data.TaggedError("GlobalCkfIngestionPoolConfigError")<{
  readonly kind: GlobalCkfIngestionPoolConfigErrorKind
  readonly value: unknown
}> {
  override get message(): string {
    return `${configErrorText[this.kind]} (got ${String(this.value)})`
  }
}

/** The indexer refused a lane claim (e.g. another ingestion owner already holds the lane). */
export class GlobalCkfIngestionPoolClaimError extends Data.TaggedError("GlobalCkfIngestionPoolClaimError")<{
  readonly lane: number
  readonly error: GlobalCkfBuildError
}> {
  override get message(): string {
    return this.error.message
  }
}

/** What building an ingestion pool fails with: a setting refused or a lane already claimed. */
export type GlobalCkfIngestionPoolBuildError =
  | GlobalCkfIngestionPoolConfigError
  | GlobalCkfIngestionPoolClaimError

// ---------------------------------------------------------------------------------------------
// Ingestion errors

/** A command named a lane the global CKF was not built with. */
export class UnconfiguredLane extends Data.TaggedError("UnconfiguredLane")<{ readonly lane: number }> {
  override get message(): string {
    return `global CKF lane ${this.lane} is not configured`
  }
}

/** A lane has no current assignment (no relay pool feeds it). */
export class LaneUnassigned extends Data.TaggedError("LaneUnassigned")<{ readonly lane: number }> {
  override get message(): string {
    return `global CKF lane ${this.lane} has no current assignment`
  }
}

/** A lane's lease was retired; it needs a new lease and a snapshot. */
export class LaneRetired extends Data.TaggedError("LaneRetired")<{ readonly lane: number }> {
  override get message(): string {
    return `global CKF lane ${this.lane} is retired and requires a new lease and snapshot`
  }
}

/** A lane got a delta before the snapshot it must start from. */
export class AwaitingSnapshot extends Data.TaggedError("AwaitingSnapshot")<{ readonly lane: number }> {
  override get message(): string {
    return `global CKF lane ${this.lane} is awaiting a snapshot`
  }
}

/** A lane's ingestion queue filled up; its lease was retired. */
export class Saturated extends Data.TaggedError("Saturated")<{ readonly lane: number }> {
  override get message(): string {
    return `global CKF lane ${this.lane} ingestion queue saturated; its lease was retired`
  }
}

/** A lane asked for more bucket images in flight than its limit allows. */
export class OutstandingImageLimit extends Data.TaggedError("OutstandingImageLimit")<{
  readonly lane: number
  readonly requested: number
  readonly limit: number
}> {
  override get message(): string {
    return (
      `global CKF lane ${this.lane} exceeded its outstanding-image bound ` +
      `(${this.requested} requested, ${this.limit} allowed); its lease was retired`
    )
  }
}

/** A lane's oldest unapplied change waited longer than allowed; its lease was retired. */
export class DirtyToAppliedAgeExceeded extends Data.TaggedError("DirtyToAppliedAgeExceeded")<{
  readonly lane: number
}> {
  override get message(): string {
    return `global CKF lane ${this.lane} exceeded its dirty-to-applied age; its lease was retired`
  }
}

/** A lane's control operation did not finish in time; its lease was retired. */
export class ControlTimeout extends Data.TaggedError("ControlTimeout")<{ readonly lane: number }> {
  override get message(): string {
    return `global CKF lane ${this.lane} control operation timed out; its lease was retired`
  }
}

/** An ingestion worker fiber failed. */
export class WorkerFailed extends Data.TaggedError("WorkerFailed")<{ readonly worker: number }> {
  override get message(): string {
    return `global CKF ingestion worker ${this.worker} failed`
  }
}

/** The seed's `Assignment(GlobalCkfAssignmentError)`: the lease or identity was refused. */
export class AssignmentRejected extends Data.TaggedError("AssignmentRejected")<{
  readonly lane: number
  readonly error: GlobalCkfAssignmentError
}> {
  override get message(): string {
    return `global CKF assignment failed: ${this.error.message}`
  }
}

/** A lane used up its admission epochs and must be rebuilt. */
export class AdmissionEpochExhausted extends Data.TaggedError("AdmissionEpochExhausted")<{
  readonly lane: number
}> {
  override get message(): string {
    return `global CKF lane admission epoch exhausted for lane ${this.lane}`
  }
}

/** What the ingestion pool's lane commands fail with. */
export type GlobalCkfIngestionError =
  | UnconfiguredLane
  | LaneUnassigned
  | LaneRetired
  | AwaitingSnapshot
  | Saturated
  | OutstandingImageLimit
  | DirtyToAppliedAgeExceeded
  | ControlTimeout
  | WorkerFailed
  | AssignmentRejected
  | AdmissionEpochExhausted

// ---------------------------------------------------------------------------------------------
// Errors

/** The request never produced a response (connection refused, reset, timeout). */
export class RelayTransportError extends Data.TaggedError("RelayTransportError")<{
  readonly url: string
  readonly message: string
}> {}

/**
 * The relay answered with an error status. `reason` is the relay's `{reason}` when the body was
 * an error document (one of PROTOCOL §5's reasons; kept as text so a newer relay's reason is not
 * mistaken for a malformed answer).
 */
export class RelayHttpError extends Data.TaggedError("RelayHttpError")<{
  readonly url: string
  readonly status: number
  readonly reason: string | undefined
  readonly message: string
}> {}

/** A response that does not follow the protocol (content type, JSON shape, SSE event). */
export class RelayProtocolError extends Data.TaggedError("RelayProtocolError")<{
  readonly url: string
  readonly message: string
}> {}

/** A pool stream ended with a terminal error frame (kind 4), e.g. `SUBSCRIBER_LAGGED`. */
export class PoolStreamTerminated extends Data.TaggedError("PoolStreamTerminated")<{
  readonly reason: string
  readonly message: string
}> {}

/** The kinds of pool-stream fault a lane can meet. */
export type PoolStreamFaultKind =
  /** The frame layer itself is broken (length or kind). */
  | "FrameDecode"
  /** A CBI1 payload was rejected: checksum, format or DC of another producer, chunk order. */
  | "Cbi1"
  /** Sequences that are not a snapshot followed by contiguous deltas. */
  | "Sequence"
  /** A frame kind where the protocol does not allow it. */
  | "Order"
  /** A heartbeat that does not restate the last sequence or carries a payload. */
  | "Heartbeat"
  /** The body ended without a terminal frame. */
  | "Closed"
  /** No bytes for longer than the idle timeout (heartbeats come every 10 s). */
  | "IdleTimeout"

/** The stream broke the protocol; the lane must be retired and subscribed again. */
export class PoolStreamFault extends Data.TaggedError("PoolStreamFault")<{
  readonly kind: PoolStreamFaultKind
  readonly message: string
}> {}

/** A relay's load or readiness watch (PROTOCOL §5, followed for §7.1) ended or sent what it may not. */
export class SignalWatchEnded extends Data.TaggedError("SignalWatchEnded")<{
  readonly watch: "load" | "readiness"
  readonly message: string
}> {}

/** The catalog watch ended or broke the protocol; the relay's connection epoch ends. */
export class CatalogWatchEnded extends Data.TaggedError("CatalogWatchEnded")<{
  readonly message: string
}> {}

/** What the relay client's calls fail with: transport, HTTP status, protocol or stream faults. */
export type RelayClientError =
  | RelayTransportError
  | RelayHttpError
  | RelayProtocolError
  | SignalWatchEnded
  | PoolStreamTerminated
  | PoolStreamFault
  | CatalogWatchEnded

/** No relay's catalog has registered the model (or alias) in the namespace since the consumer started. */
export class ModelNotFound extends Data.TaggedError("ModelNotFound")<{ readonly message: string }> {}

/** The model (or pool domain) is known, but no adapter registration of `loraName` on it has been seen. */
export class AdapterNotFound extends Data.TaggedError("AdapterNotFound")<{ readonly message: string }> {}

/** No relay's catalog has listed a pool of the pool domain since the consumer started. */
export class NoMatchingDomain extends Data.TaggedError("NoMatchingDomain")<{ readonly message: string }> {}

/** The model or pool domain is known, but no lane of it is ready now (relay down, lane resubscribing). */
export class NoReadyLane extends Data.TaggedError("NoReadyLane")<{ readonly message: string }> {}

/**
 * Why an overlap query found no answer to give: no such model or adapter, no domain, no ready
 * lane.
 */
export type OverlapError = ModelNotFound | AdapterNotFound | NoMatchingDomain | NoReadyLane

/** The global consumer's settings were refused; every problem is listed. */
export class GlobalConsumerConfigError extends Data.TaggedError("GlobalConsumerConfigError")<{
  readonly problems: ReadonlyArray<string>
}> {
  override get message(): string {
    return this.problems.join("; ")
  }
}
