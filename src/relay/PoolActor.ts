/**
 * The endpoint-pool CKF actor: one bounded mailbox, exactly one consumer fiber that owns the
 * pool's `DcCkfState` and `DcCkfPublisher` (seed 002, `kv_dc_relay/actor.rs`).
 *
 * This module is the contract the registry, the publication hub, the host and the recovery target
 * share; keep it stable. The implementation, `make`, is `internal/PoolActorLoop.ts`.
 */

import type { Duration, Effect, Queue, Scope } from "effect"
import type { MemberTierCount, TierStats } from "../ckf/canonical.js"
import type { CkfMemberRef } from "../ckf/events.js"
import type { CkfFailureDisposition } from "../ckf/failure.js"
import type { LaneLease, PoolId, ProducerIdentity } from "../ckf/identity.js"
import type { DcCkfSnapshot } from "../ckf/publisher.js"
import type { DcCkfState, DcCkfStats, MemberCount } from "../ckf/state.js"
import type { WorkerQueryResult } from "../ckf/workerQuery.js"
import type { PublishDelaySnapshot } from "../observability/PublishDelay.js"
import type { DpRank, RouterEvent, WorkerId } from "../protocol/Events.js"
import type { SourceEpoch } from "../recovery/RecoveryTarget.js"
import type { DeltaReceiver } from "./DeltaBroadcast.js"
import type { KvDcRelayError, RelayShuttingDown } from "./RelayErrors.js"

/** Commands a pool actor's mailbox holds by default. */
export const DEFAULT_MAILBOX_CAPACITY = 256
/** Blocks admitted but not yet applied, at most, by default. */
export const DEFAULT_PENDING_BLOCK_PERMITS = 65_536
/** Publications queued for the hub, at most, by default. */
export const DEFAULT_PUBLICATION_CAPACITY = 64
/** Actor faults queued for the endpoint slot, at most, by default. */
export const DEFAULT_FAULT_CAPACITY = 16
/** How long the actor gathers changes before it publishes a delta, by default. */
export const DEFAULT_PUBLICATION_DELAY_MS = 1
/** How long rank restores arriving together are gathered into one rebuild. */
export const RECOVERY_REBUILD_BATCH_WINDOW_MS = 5

/** What a producer generation publishes under. */
export interface StreamScope {
  readonly relayIncarnation: bigint
  readonly layoutGeneration: bigint
  readonly poolId: PoolId
}

/** A pool actor's capacities and delays. */
export interface PoolActorOptions {
  /** Mailbox capacity (default 256). */
  readonly mailboxCapacity?: number
  /** Timer from the first pending event to a publication (default 1 ms), driven by `Clock`. */
  readonly publicationDelay?: Duration.DurationInput
  /** Payload permits in blocks, taken per event before admission (default 65,536). */
  readonly pendingBlockPermits?: number
  /** Bounded buffer of each delta receiver (default 64); a receiver that falls behind is lagged. */
  readonly publicationCapacity?: number
  /** Bounded fault queue (default 16). */
  readonly faultCapacity?: number
}

/**
 * What kind of fault an actor reports: a resource ran out, a source broke the protocol, or the
 * producer's own invariant failed.
 */
export type ActorFaultCategory = "Resource" | "SourceProtocol" | "ProducerInvariant"

/** A typed fault the actor reports to its owner; capacity omissions never become faults. */
export interface ActorFault {
  readonly workerId: WorkerId
  readonly dpRank: DpRank
  readonly sourceEpoch: SourceEpoch
  readonly eventId: number | undefined
  readonly category: ActorFaultCategory
  readonly disposition: CkfFailureDisposition
  readonly message: string
}

/** What subscribing to an actor gives: its snapshot and the deltas after it. */
export interface ActorSubscription {
  readonly snapshot: DcCkfSnapshot
  readonly deltas: DeltaReceiver
}

/** Diagnostic barrier snapshot: the tail is published first, so `sequence` covers it. */
export interface ActorSnapshot {
  readonly identity: ProducerIdentity
  readonly sequence: bigint
  /** Every bucket word as `[lo, hi]` pairs. */
  readonly words: Uint32Array
  readonly stats: DcCkfStats
}

/** An actor's CKF counters and publication position. */
export interface ActorStats {
  readonly stats: DcCkfStats
  /** The publisher's last sequence. */
  readonly sequence: bigint
  readonly members: ReadonlyArray<MemberCount>
  /** Members whose history is partial (PROTOCOL §3.3 ◆3); sorted by (worker id, dp rank). */
  readonly partialMembers: ReadonlyArray<CkfMemberRef>
  /**
   * Blocks per member on each storage tier (PROTOCOL §5.1 ◆3), every member holding something
   * on any tier, sorted; empty for an externally addressed pool.
   */
  readonly tierCounts: ReadonlyArray<MemberTierCount>
  /** Host and disk edges and their memory; undefined for an externally addressed pool. */
  readonly tiers: TierStats | undefined
}

/** A worker-level query (PROTOCOL §5.1 ◆3) as the actor runs it. */
export interface ActorWorkerQuery {
  /** The prompt's canonical sequence hashes as `[hi, lo]` pairs; the first `count` are asked. */
  readonly hashes: Uint32Array
  readonly count: number
  /**
   * Members to list even when they hold nothing (the pool's expected ranks); every member that
   * holds something on any tier is listed too. The answer lists them sorted by (worker id, rank).
   */
  readonly expected?: ReadonlyArray<CkfMemberRef> | undefined
}

interface ActorDiagnostics {
  readonly activeCommand: string | undefined
  readonly shuttingDown: boolean
  readonly lastError: string | undefined
  readonly publications: number
  readonly unchangedPublications: number
  readonly degradedResets: number
  readonly rebuilds: number
  // Additive (not in the seed's struct, same spirit: cheap pull-only counters).
  /** Events handed to `DcCkfState.applyEvent`. */
  readonly appliedEvents: number
  /** Admitted events dropped because their source epoch was superseded. */
  readonly staleEventsDropped: number
  readonly capacityOmissionEvents: number
  readonly unknownRemovalEvents: number
  /** Faults handed to the fault queue. */
  readonly faultsReported: number
  /** Total and worst rebuild time of `replaceRanks`, in `Clock` milliseconds. */
  readonly rebuildTotalMs: number
  readonly rebuildMaxMs: number
  /** From the admission of a delta's oldest event to its publication (see `PublishDelay`). */
  readonly publishDelay: PublishDelaySnapshot
}

/** A rank's whole event history, replacing what the actor holds for it (a recovery). */
export interface RankReplacement {
  readonly sourceEpoch: SourceEpoch
  readonly workerId: WorkerId
  readonly dpRank: DpRank
  /** A tree dump: device-tier Stored events of this rank only. */
  readonly events: ReadonlyArray<RouterEvent>
}

/**
 * The actor that owns one pool generation's CKF state: every change to it goes through its
 * mailbox.
 */
export interface PoolActor {
  readonly identity: ProducerIdentity
  /**
   * Whether the pool is addressed by canonical sequence hashes (PROTOCOL §3.3): its rank
   * replacements then replay their dumps in order, Removed events included.
   */
  readonly canonical: boolean
  /** Returns once the event is queued (payload permits taken first), not once applied. */
  readonly admitEvent: (
    sourceEpoch: SourceEpoch,
    event: RouterEvent
  ) => Effect.Effect<void, RelayShuttingDown>
  /**
   * `admitEvent` of every event, in order, when all of them fit now (permits and mailbox room,
   * nobody waiting for permits, the actor accepting): true once they are queued. Otherwise false
   * with nothing queued, and the caller admits them one by one with `admitEvent`.
   */
  readonly admitEventsNow: (sourceEpoch: SourceEpoch, events: ReadonlyArray<RouterEvent>) => boolean
  /** One transactional rebuild of several ranks; any failure leaves every rank unchanged. */
  readonly replaceRanks: (replacements: ReadonlyArray<RankReplacement>) => Effect.Effect<void, KvDcRelayError>
  readonly replaceRank: (
    sourceEpoch: SourceEpoch,
    workerId: WorkerId,
    dpRank: DpRank,
    events: ReadonlyArray<RouterEvent>
  ) => Effect.Effect<void, KvDcRelayError>
  /**
   * Marks the rank's history partial (its source lost events it stored before now), in order
   * with the rank's admitted events; returns once queued. A superseded epoch is dropped.
   */
  readonly markHistoryPartial: (
    sourceEpoch: SourceEpoch,
    workerId: WorkerId,
    dpRank: DpRank
  ) => Effect.Effect<void, RelayShuttingDown>
  /** Clears the rank; completes once the removal is applied and its batch published. */
  readonly resetRank: (
    sourceEpoch: SourceEpoch,
    workerId: WorkerId,
    dpRank: DpRank,
    degraded: boolean
  ) => Effect.Effect<void, KvDcRelayError>
  /** Publishes the pending tail. */
  readonly flush: Effect.Effect<void, KvDcRelayError>
  readonly snapshot: Effect.Effect<ActorSnapshot, KvDcRelayError>
  readonly stateStats: Effect.Effect<ActorStats, KvDcRelayError>
  /**
   * Block counts per member only: unlike `stateStats` it does not scan the filter (a pass over
   * every bucket holds the consumer, and so every publication, for milliseconds on a large pool).
   */
  readonly memberCounts: Effect.Effect<ReadonlyArray<MemberCount>, KvDcRelayError>
  /**
   * Which member holds how much of a prompt, per storage tier (PROTOCOL §5.1 ◆3): one command of
   * the actor, so the answer reflects one point of its state, between two applied events.
   */
  readonly queryWorkers: (query: ActorWorkerQuery) => Effect.Effect<WorkerQueryResult, KvDcRelayError>
  /**
   * `queryWorkers` answered on the caller's turn, when the actor is at rest: its consumer waits
   * for commands, none is queued and none is under way, so the query would be the next command
   * and see the same state. Otherwise undefined: ask `queryWorkers`, which queues behind the
   * commands admitted before it.
   */
  readonly queryWorkersNow: (query: ActorWorkerQuery) => WorkerQueryResult | undefined
  /** Snapshot after barrier for a new lease plus a receiver that starts exactly after it. */
  readonly subscribe: (lease: LaneLease) => Effect.Effect<ActorSubscription, KvDcRelayError>
  /** Drops the publication lease (idle hub eviction); later batches are covered by the next snapshot. */
  readonly retirePublicationLease: Effect.Effect<void, KvDcRelayError>
  /** Graceful: drains admitted commands, publishes the tail, closes receivers. */
  readonly shutdown: Effect.Effect<void, KvDcRelayError>
  /** Stops without publishing the uncertain tail, closes every receiver; interrupts a blocked fault send. */
  readonly fence: Effect.Effect<void>
  /** Faults in the order they happened (bounded; the actor waits when it is full). */
  readonly faults: Queue.Dequeue<ActorFault>
  readonly mailboxDepth: Effect.Effect<number>
  readonly mailboxCapacity: number
  /** Completes when the consumer fiber has exited. */
  readonly awaitStopped: Effect.Effect<void>
  readonly diagnostics: Effect.Effect<ActorDiagnostics>
  /**
   * Test hook (the seed's `Pause` command): the consumer fiber stops at this command; the returned
   * effect releases it.
   */
  readonly pause: Effect.Effect<Effect.Effect<void>, KvDcRelayError>
}

/**
 * Starts an actor over `state` in the current scope. Closing the scope fences the actor (the
 * uncertain tail is not published) and waits for its fiber.
 */
export type MakePoolActor = (
  state: DcCkfState,
  scope: StreamScope,
  options?: PoolActorOptions
) => Effect.Effect<PoolActor, never, Scope.Scope>
