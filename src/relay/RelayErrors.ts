/**
 * Errors of the relay's producer side (pool actors, registry, host). One tagged class per kind
 * of the seed's `KvDcRelayError`, so callers can `catchTag` the kinds they handle.
 */

import { Data } from "effect"
import type { CkfBuildError, KvCacheEventErrorKind } from "../ckf/errors.js"
import type { PoolId } from "../ckf/identity.js"
import type { ConfigProblem } from "../discovery/DiscoveryConfig.js"
import type { DpRank, WorkerId } from "../protocol/Events.js"

/** A command arrived after the relay began shutting down. */
export class RelayShuttingDown extends Data.TaggedError("RelayShuttingDown")<{}> {
  override get message(): string {
    return "KV DC Relay is shutting down"
  }
}

/** A pool actor stopped before it completed a command it had accepted. */
export class ActorStopped extends Data.TaggedError("ActorStopped")<{}> {
  override get message(): string {
    return "KV DC Relay actor stopped before completing an accepted command"
  }
}

/** A serving endpoint the relay does not know, or no longer serves. */
export class UnknownEndpoint extends Data.TaggedError("UnknownEndpoint")<{ readonly endpoint: string }> {
  override get message(): string {
    return `unknown or inactive serving endpoint ${this.endpoint}`
  }
}

/**
 * A rank's input carried a source epoch older than the rank's current one (a replaced
 * subscription).
 */
export class StaleSourceEpoch extends Data.TaggedError("StaleSourceEpoch")<{
  readonly workerId: WorkerId
  readonly dpRank: DpRank
  readonly current: number
  readonly received: number
}> {
  override get message(): string {
    return `stale source epoch for worker ${this.workerId} rank ${this.dpRank}: current ${this.current}, received ${this.received}`
  }
}

/** A worker's tree dump (the recovery answer) could not be applied for a rank. */
export class InvalidTreeDump extends Data.TaggedError("InvalidTreeDump")<{
  readonly workerId: WorkerId
  readonly dpRank: DpRank
  readonly reason: string
}> {
  override get message(): string {
    return `invalid tree dump for worker ${this.workerId} rank ${this.dpRank}: ${this.reason}`
  }
}

/** The pool's cuckoo filter could not be built (its format or allocation was refused). */
export class CkfBuildFailed extends Data.TaggedError("CkfBuildFailed")<{ readonly cause: CkfBuildError }> {
  override get message(): string {
    return this.cause.message
  }
}

/** The CKF core refused a KV event; `kind` says why. */
export class CkfEventFailed extends Data.TaggedError("CkfEventFailed")<{
  readonly kind: KvCacheEventErrorKind
}> {
  override get message(): string {
    return `KV cache event failed: ${this.kind}`
  }
}

/** The pool's publisher lost its publication state and needs a replacement snapshot. */
export class PublisherFailed extends Data.TaggedError("PublisherFailed")<{ readonly reason: string }> {
  override get message(): string {
    return `KV DC Relay publisher requires a replacement snapshot: ${this.reason}`
  }
}

/** What the relay service's commands fail with (`KvDcRelayService`). */
export type KvDcRelayError =
  | RelayShuttingDown
  | ActorStopped
  | UnknownEndpoint
  | StaleSourceEpoch
  | InvalidTreeDump
  | CkfBuildFailed
  | CkfEventFailed
  | PublisherFailed

// ---------------------------------------------------------------------------------------------
// Errors

/** A pool the publication hub does not know, or no longer publishes. */
export class UnknownPool extends Data.TaggedError("UnknownPool")<{ readonly poolId: PoolId }> {
  override get message(): string {
    return `unknown or inactive pool ${this.poolId}`
  }
}

/** A subscriber expected another producer generation than the one publishing the pool. */
export class ProducerMismatch extends Data.TaggedError("ProducerMismatch")<{ readonly poolId: PoolId }> {
  override get message(): string {
    return `pool ${this.poolId} is published by a different producer generation`
  }
}

/** The pool's publication cannot be served now (not ready, or shutting down). */
export class PublicationUnavailable extends Data.TaggedError("PublicationUnavailable")<{
  readonly reason: string
}> {
  override get message(): string {
    return this.reason
  }
}

/** A pool already has as many stream subscribers as its limit allows. */
export class SubscriberLimit extends Data.TaggedError("SubscriberLimit")<{
  readonly poolId: PoolId
  readonly limit: number
}> {
  override get message(): string {
    return `pool ${this.poolId} already has ${this.limit} publication subscribers`
  }
}

/** Every publication hub that may hold a mirror is in use. */
export class InitializedHubLimit extends Data.TaggedError("InitializedHubLimit")<{ readonly limit: number }> {
  override get message(): string {
    return `all ${this.limit} initialized publication hubs are in use`
  }
}

/** A pool-stream subscriber fell behind its bounded queue; it must start again from a snapshot. */
export class SubscriberLagged extends Data.TaggedError("SubscriberLagged")<{ readonly poolId: PoolId }> {
  override get message(): string {
    return `publication subscriber of pool ${this.poolId} lagged; it requires a fresh snapshot`
  }
}

type InvalidHubPublicationReason = "IdentityChanged" | "LeaseChanged" | "SequenceGap" | "BucketOutOfRange"

/** A publication handed to the hub broke its contract (sequence, epoch or format). */
export class InvalidHubPublication extends Data.TaggedError("InvalidHubPublication")<{
  readonly reason: InvalidHubPublicationReason
  readonly detail: string
}> {
  override get message(): string {
    return this.detail
  }
}

/** What opening or reading a pool's publication fails with. */
export type PublicationHubError =
  | UnknownPool
  | ProducerMismatch
  | PublicationUnavailable
  | SubscriberLimit
  | InitializedHubLimit
  | SubscriberLagged
  | InvalidHubPublication

/** A publication hub could not start its mirror of the pool. */
export class HubStartFailed extends Data.TaggedError("HubStartFailed")<{ readonly reason: string }> {
  override get message(): string {
    return this.reason
  }
}

/** The snapshot-encoding permits were closed (shutdown) while a snapshot waited for one. */
export class EncodingPermitsClosed extends Data.TaggedError("EncodingPermitsClosed")<{}> {
  override get message(): string {
    return "publication encoding permits are closed"
  }
}

/** A publication hub setting out of range; `field` names it. */
export class InvalidPublicationHubConfig extends Data.TaggedError("InvalidPublicationHubConfig")<{
  readonly field: string
  readonly detail: string
}> {
  override get message(): string {
    return `publication hub ${this.field} ${this.detail}`
  }
}

// ---------------------------------------------------------------------------------------------
// Errors

/** Why a serving endpoint could not attach to its pool. */
export type PoolAttachProblem =
  | "NoRegistrations"
  | "ShuttingDown"
  | "PoolOwned"
  | "EndpointAssigned"
  | "GenerationSpaceExhausted"
  | "ReservationRetired"

/** A serving endpoint could not attach to its pool; `reason` says why. */
export class PoolAttachError extends Data.TaggedError("PoolAttachError")<{
  readonly reason: PoolAttachProblem
  readonly poolId: PoolId
  readonly detail: string
}> {
  override get message(): string {
    return this.detail
  }
}

/** A command named a pool layout generation that is no longer the active one. */
export class PoolGenerationInactive extends Data.TaggedError("PoolGenerationInactive")<{
  readonly poolId: PoolId
  readonly layoutGeneration: bigint
  readonly attached: boolean
}> {
  override get message(): string {
    return this.attached
      ? `pool ${this.poolId} generation ${this.layoutGeneration} is no longer active`
      : `pool ${this.poolId} is not attached`
  }
}

/** The kinds of pool-stream failure, as the HTTP layer maps them to statuses and reasons. */
export type PublicationErrorKind =
  | "NotFound"
  | "ProducerMismatch"
  | "Unavailable"
  | "ResourceExhausted"
  | "SubscriberLagged"
  | "SnapshotProgressTimeout"
  | "InvalidPublication"
  | "Internal"

/** Why a pool stream could not open or ended (the form the HTTP layer answers with). */
export class PublicationError extends Data.TaggedError("PublicationError")<{
  readonly kind: PublicationErrorKind
  readonly message: string
}> {}

/** A load-window subscriber let its queue fill; it must subscribe again. */
export class LoadWindowLagged extends Data.TaggedError("LoadWindowLagged")<{ readonly capacity: number }> {
  override get message(): string {
    return `load subscriber lagged: ${this.capacity} complete windows were already queued; resubscribe`
  }
}

/** The load-window publisher stopped (relay shutdown). */
export class LoadWindowsClosed extends Data.TaggedError("LoadWindowsClosed")<{}> {
  override get message(): string {
    return "load window publisher stopped"
  }
}

/** The relay's settings were refused; every problem is listed. */
export class InvalidRelayConfig extends Data.TaggedError("InvalidRelayConfig")<{
  readonly problems: ReadonlyArray<ConfigProblem>
}> {
  override get message(): string {
    return this.problems.map((p) => `${p.setting}: ${p.message}`).join("\n")
  }
}
