/**
 * Errors of the relay's producer side (pool actors, registry, host). One tagged class per kind
 * of the seed's `KvDcRelayError`, so callers can `catchTag` the kinds they handle.
 */

import { Data } from "effect"
import type { CkfBuildError, KvCacheEventErrorKind } from "../ckf/errors.js"
import type { PoolId } from "../ckf/identity.js"
import type { ConfigProblem } from "../discovery/DiscoveryConfig.js"
import type { DpRank, WorkerId } from "../protocol/Events.js"

export class RelayShuttingDown extends Data.TaggedError("RelayShuttingDown")<{}> {
  override get message(): string {
    return "KV DC Relay is shutting down"
  }
}

export class ActorStopped extends Data.TaggedError("ActorStopped")<{}> {
  override get message(): string {
    return "KV DC Relay actor stopped before completing an accepted command"
  }
}

export class UnknownEndpoint extends Data.TaggedError("UnknownEndpoint")<{ readonly endpoint: string }> {
  override get message(): string {
    return `unknown or inactive serving endpoint ${this.endpoint}`
  }
}

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

export class InvalidTreeDump extends Data.TaggedError("InvalidTreeDump")<{
  readonly workerId: WorkerId
  readonly dpRank: DpRank
  readonly reason: string
}> {
  override get message(): string {
    return `invalid tree dump for worker ${this.workerId} rank ${this.dpRank}: ${this.reason}`
  }
}

export class CkfBuildFailed extends Data.TaggedError("CkfBuildFailed")<{ readonly cause: CkfBuildError }> {
  override get message(): string {
    return this.cause.message
  }
}

export class CkfEventFailed extends Data.TaggedError("CkfEventFailed")<{
  readonly kind: KvCacheEventErrorKind
}> {
  override get message(): string {
    return `KV cache event failed: ${this.kind}`
  }
}

export class PublisherFailed extends Data.TaggedError("PublisherFailed")<{ readonly reason: string }> {
  override get message(): string {
    return `KV DC Relay publisher requires a replacement snapshot: ${this.reason}`
  }
}

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

export class UnknownPool extends Data.TaggedError("UnknownPool")<{ readonly poolId: PoolId }> {
  override get message(): string {
    return `unknown or inactive pool ${this.poolId}`
  }
}

export class ProducerMismatch extends Data.TaggedError("ProducerMismatch")<{ readonly poolId: PoolId }> {
  override get message(): string {
    return `pool ${this.poolId} is published by a different producer generation`
  }
}

export class PublicationUnavailable extends Data.TaggedError("PublicationUnavailable")<{
  readonly reason: string
}> {
  override get message(): string {
    return this.reason
  }
}

export class SubscriberLimit extends Data.TaggedError("SubscriberLimit")<{
  readonly poolId: PoolId
  readonly limit: number
}> {
  override get message(): string {
    return `pool ${this.poolId} already has ${this.limit} publication subscribers`
  }
}

export class InitializedHubLimit extends Data.TaggedError("InitializedHubLimit")<{ readonly limit: number }> {
  override get message(): string {
    return `all ${this.limit} initialized publication hubs are in use`
  }
}

export class SubscriberLagged extends Data.TaggedError("SubscriberLagged")<{ readonly poolId: PoolId }> {
  override get message(): string {
    return `publication subscriber of pool ${this.poolId} lagged; it requires a fresh snapshot`
  }
}

type InvalidHubPublicationReason = "IdentityChanged" | "LeaseChanged" | "SequenceGap" | "BucketOutOfRange"

export class InvalidHubPublication extends Data.TaggedError("InvalidHubPublication")<{
  readonly reason: InvalidHubPublicationReason
  readonly detail: string
}> {
  override get message(): string {
    return this.detail
  }
}

export type PublicationHubError =
  | UnknownPool
  | ProducerMismatch
  | PublicationUnavailable
  | SubscriberLimit
  | InitializedHubLimit
  | SubscriberLagged
  | InvalidHubPublication

export class HubStartFailed extends Data.TaggedError("HubStartFailed")<{ readonly reason: string }> {
  override get message(): string {
    return this.reason
  }
}

export class EncodingPermitsClosed extends Data.TaggedError("EncodingPermitsClosed")<{}> {
  override get message(): string {
    return "publication encoding permits are closed"
  }
}

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

export type PoolAttachProblem =
  | "NoRegistrations"
  | "ShuttingDown"
  | "PoolOwned"
  | "EndpointAssigned"
  | "GenerationSpaceExhausted"
  | "ReservationRetired"

export class PoolAttachError extends Data.TaggedError("PoolAttachError")<{
  readonly reason: PoolAttachProblem
  readonly poolId: PoolId
  readonly detail: string
}> {
  override get message(): string {
    return this.detail
  }
}

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

export type PublicationErrorKind =
  | "NotFound"
  | "ProducerMismatch"
  | "Unavailable"
  | "ResourceExhausted"
  | "SubscriberLagged"
  | "SnapshotProgressTimeout"
  | "InvalidPublication"
  | "Internal"

export class PublicationError extends Data.TaggedError("PublicationError")<{
  readonly kind: PublicationErrorKind
  readonly message: string
}> {}

export class LoadWindowLagged extends Data.TaggedError("LoadWindowLagged")<{ readonly capacity: number }> {
  override get message(): string {
    return `load subscriber lagged: ${this.capacity} complete windows were already queued; resubscribe`
  }
}

export class LoadWindowsClosed extends Data.TaggedError("LoadWindowsClosed")<{}> {
  override get message(): string {
    return "load window publisher stopped"
  }
}

export class InvalidRelayConfig extends Data.TaggedError("InvalidRelayConfig")<{
  readonly problems: ReadonlyArray<ConfigProblem>
}> {
  override get message(): string {
    return this.problems.map((p) => `${p.setting}: ${p.message}`).join("\n")
  }
}
