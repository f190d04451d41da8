/**
 * The source supervisor: the seed's `WorkerQueryClient` (seed 003, `worker_query.rs`) in Effect.
 *
 * It coordinates KV recovery for the sources advertised under one exact KV-state endpoint. The
 * discovery advertisement is the sole authority for the relationship between a logical rank, its
 * event publisher incarnation and its optional recovery target; the membership view only says which
 * logical ranks are currently expected (recovery-events.md §3).
 *
 * Concurrency model. JavaScript runs one fiber at a time, so shared maps are mutated in synchronous
 * steps. Each (worker, dp rank) slot has a 1-permit semaphore standing for the seed's async slot
 * mutex: it is held across target admissions, resets and the join of a cancelled recovery, and it
 * serialises everything that touches the slot's `RankState`. Different ranks never share a lock, so
 * one blocked rank does not stall another (seed test
 * `independent_source_handlers_enter_worker_query_concurrently_and_keep_fifo`).
 *
 * Recovery runs as one fiber per rank in a `FiberMap`; cancelling a recovery marks its task
 * cancelled and interrupts and joins its fiber, so a cancelled recovery never reaches
 * `finishRecovery`.
 */

import { Duration, type Effect } from "effect"
import type { KvEventSource, KvSourceMembershipView, RankKey } from "../protocol/Discovery.js"
import type { DpRank, RouterEvent, WorkerId } from "../protocol/Events.js"
import type { RecoveryTarget, SourceEpoch } from "./RecoveryTarget.js"
import type { WorkerQueryTransport } from "./WorkerQuery.js"

/** Worker query attempts of one recovery before the rank is degraded. */
export const RECOVERY_MAX_RETRIES = 8
/** The first wait between recovery attempts; it doubles after each. */
export const RECOVERY_INITIAL_BACKOFF_MS = 200
/** Recoveries that run at once across a supervisor's ranks. */
export const RECOVERY_CONCURRENCY_LIMIT = 16
/** How long one worker query attempt may take, by default. */
export const DEFAULT_RECOVERY_ATTEMPT_TIMEOUT: Duration.Duration = Duration.seconds(30)
/** Full restores wait a uniform 0–3000 µs first, so a membership wave does not query in lockstep. */
export const FULL_RESTORE_JITTER_MICROS = 3000

/** What the supervisor did about a recovery target's fault. */
export type TargetFaultDisposition = "Recovering" | "ResetLiveOnly" | "Fenced" | "Stale"

/**
 * Key of a preconnected source incarnation for `syncMembershipWithReadySources`: transport
 * readiness is per publisher incarnation AND lifecycle generation, so a socket connected for an
 * older generation cannot activate a newer one.
 */
export const readySourceKey = (publisherId: bigint, lifecycleGeneration: number): string =>
  `${publisherId}@${lifecycleGeneration}`

/** One activation of a source in a slot. Identity matters: a replaced binding is a different object. */
export interface SourceBinding {
  readonly source: KvEventSource
  readonly key: RankKey
  readonly workerId: WorkerId
  readonly dpRank: DpRank
  readonly epoch: SourceEpoch
  readonly recoverable: boolean
  /** Gaps ask for the missing range instead of clearing the rank (engine replay sources). */
  readonly incrementalGaps: boolean
  /** Ids counting from 1 again mean a publisher restart (engine sources, seq 0 again). */
  readonly restartsAtFirstId: boolean
}

/**
 * `recovering`: a restore or gap recovery is outstanding and live events are buffered;
 * `degraded`: the index serves live events without history it could not recover (or the rank
 * is fenced pending a reset); `live`: in order and complete since the last restore.
 */
export type SourceState = "live" | "recovering" | "degraded"

/** A supervisor's workers and ranks, by state, for health and stats. */
export interface SourceSupervisorHealth {
  readonly workerCount: number
  readonly rankCount: number
  readonly recoveringRankCount: number
  /** Active sources by state (PROTOCOL §3.2 `sourcesRecovering`, `sourcesDegraded`). */
  readonly sourcesRecovering: number
  readonly sourcesDegraded: number
  readonly sources: ReadonlyArray<SourceStateEntry>
  /** Rejected source incarnations (PROTOCOL §5 ◆3 `rejected`); not counted in `sources`. */
  readonly rejected: ReadonlyArray<RejectedSourceEntry>
  readonly pendingLiveEventCount: number
  readonly discoveredEndpointCount: number
}

/** One active source and its state, for diagnostics. */
export interface SourceStateEntry {
  readonly workerId: WorkerId
  readonly dpRank: DpRank
  readonly publisherId: bigint
  readonly state: SourceState
  /** Why the source is `degraded`, when it is. */
  readonly reason?: string | undefined
}

/** A source incarnation rejected after a protocol fault, until its membership generation advances. */
export interface RejectedSourceEntry {
  readonly workerId: WorkerId
  readonly dpRank: DpRank
  readonly publisherId: bigint
  readonly reason: string
}

/** Cumulative counters since the supervisor started (additive; for ingest diagnostics). */
export interface SourceSupervisorCounters {
  /** Live sequence gaps observed (a recovery or a degraded reset followed). */
  readonly liveGaps: number
  /** Recovery queries launched (initial restores, gap recoveries and follow-ups). */
  readonly recoveries: number
  /** Publishers seen counting from their first id again (engine restarts under one publisher id). */
  readonly restarts: number
}

/** Follows one pool's expected ranks: their sources, gaps and recoveries. */
export interface SourceSupervisor {
  /**
   * Apply the latest membership snapshot. Re-reading after taking the membership lock prevents a
   * delayed reconciler from applying an older value after a newer one.
   */
  readonly syncMembership: Effect.Effect<KvSourceMembershipView>
  /**
   * Apply membership only for source incarnations whose direct transport is preconnected
   * (`readySourceKey`). Readiness can only suppress an otherwise active source, never introduce one.
   */
  readonly syncMembershipWithReadySources: (
    readySources: ReadonlySet<string>
  ) => Effect.Effect<KvSourceMembershipView>
  /** One event envelope, routed by its publisher id with a single lookup. */
  readonly handleLiveBatch: (publisherId: bigint, events: ReadonlyArray<RouterEvent>) => Effect.Effect<void>
  /**
   * `handleLiveBatch` for the transport's hot path: `undefined` when the batch was handled
   * synchronously, else the effect that completes it (to be run before the source's next batch).
   */
  readonly handleLiveBatchNow: (
    publisherId: bigint,
    events: ReadonlyArray<RouterEvent>
  ) => Effect.Effect<void> | undefined
  /**
   * Fence one active publisher after a direct transport discontinuity. Unlike a protocol rejection,
   * the same generation may reactivate once a replacement socket is preconnected; the reset barrier
   * makes any already-enqueued old event visible before that.
   */
  readonly fenceTransport: (publisherId: bigint) => Effect.Effect<boolean>
  /**
   * An asynchronous target failure for a rank. `sourceEpoch` (when given) must match the active
   * binding, otherwise the fault is `Stale`; `barrierFailed` reports `Fenced` without acting.
   */
  readonly handleTargetFault: (
    workerId: WorkerId,
    dpRank: DpRank,
    sourceEpoch?: SourceEpoch,
    barrierFailed?: boolean
  ) => Effect.Effect<TargetFaultDisposition>
  /**
   * A protocol-faulted source: deactivate and reset; ineligible until its generation advances.
   * `reason` says what the fault was, for diagnostics.
   */
  readonly rejectSource: (
    workerId: WorkerId,
    dpRank: DpRank,
    sourceEpoch: SourceEpoch,
    reason?: string
  ) => Effect.Effect<TargetFaultDisposition>
  readonly healthSnapshot: Effect.Effect<SourceSupervisorHealth>
  readonly counters: Effect.Effect<SourceSupervisorCounters>
  /** Cancel every recovery and deactivate (reset) every rank. Idempotent; the scope's close runs it. */
  readonly shutdown: Effect.Effect<void>
}

/** What a supervisor recovers into and through, and its limits. */
export interface SourceSupervisorOptions {
  readonly target: RecoveryTarget
  readonly transport: WorkerQueryTransport
  /** The latest membership view; a `SubscriptionRef` is such an effect. */
  readonly membership: Effect.Effect<KvSourceMembershipView>
  /** Limits in-flight worker queries; the host shares one relay-wide (default: a new 16-permit one). */
  readonly recoverySemaphore?: Effect.Semaphore
  /** Bound of each query attempt (default 30 s). */
  readonly recoveryAttemptTimeout?: Duration.DurationInput
}
