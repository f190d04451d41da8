/**
 * Errors of the relay's producer side (pool actors, registry, host). One tagged class per kind
 * of the seed's `KvDcRelayError`, so callers can `catchTag` the kinds they handle.
 */

import { Data } from "effect"
import type { CkfBuildError, KvCacheEventErrorKind } from "../ckf/errors.js"
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
