/**
 * Where recovered and live KV events go: the contract between the source supervisor (which
 * orders, buffers and recovers each rank's stream) and a pool actor (which applies them).
 *
 * Every operation completes on queue admission or, for the barriers, once the effect is visible:
 * - `admitEvent` completes once the destination queue accepted the event;
 * - `replaceRank` resets the rank and admits every dumped event, as one barrier;
 * - `resetRank` returns only once the removal is visible.
 */

import { Data, type Effect } from "effect"
import type { DpRank, RouterEvent, WorkerId } from "../protocol/Events.js"

/**
 * The discovery lifecycle generation a command was issued under. A target drops mutations from a
 * superseded epoch, so a source that was reset cannot be mutated by its previous incarnation.
 */
export type SourceEpoch = number

/** Why a rank was reset before its recovery. */
export type RecoveryResetReason = "Lifecycle" | "TreeDumpFailed" | "TargetFault"

/** A target refused or could not complete a command; `reason` classifies it for the caller. */
export class RecoveryTargetError extends Data.TaggedError("RecoveryTargetError")<{
  readonly reason: "ShuttingDown" | "Stopped" | "StaleSourceEpoch" | "InvalidTreeDump" | "Rejected"
  readonly message: string
}> {}

/** What a supervisor applies events and recoveries to (the pool actor in the relay). */
export interface RecoveryTarget {
  readonly admitEvent: (
    sourceEpoch: SourceEpoch,
    event: RouterEvent
  ) => Effect.Effect<void, RecoveryTargetError>
  /**
   * The live hot path: admits every event in order synchronously and returns true when all fit
   * at once; returns false, having admitted none, when any would wait or fail (the caller then
   * uses `admitEvent`). Optional: without it every admission goes through `admitEvent`.
   */
  readonly admitEventsNow?: (sourceEpoch: SourceEpoch, events: ReadonlyArray<RouterEvent>) => boolean
  readonly replaceRank: (
    sourceEpoch: SourceEpoch,
    workerId: WorkerId,
    dpRank: DpRank,
    events: ReadonlyArray<RouterEvent>
  ) => Effect.Effect<void, RecoveryTargetError>
  /**
   * The rank's history is partial from here: its source could not deliver events it stored
   * before now (PROTOCOL §3.3 ◆3). Ordered with `admitEvent`; completes once queued. Optional: a
   * target without it keeps no history state.
   */
  readonly markHistoryPartial?: (
    sourceEpoch: SourceEpoch,
    workerId: WorkerId,
    dpRank: DpRank
  ) => Effect.Effect<void, RecoveryTargetError>
  /** The initial restore of a rank finished (successfully or degraded); lets targets batch the first wave. */
  readonly completeInitialRecovery: (workerId: WorkerId, dpRank: DpRank) => Effect.Effect<void>
  readonly resetRank: (
    sourceEpoch: SourceEpoch,
    workerId: WorkerId,
    dpRank: DpRank,
    reason: RecoveryResetReason
  ) => Effect.Effect<void, RecoveryTargetError>
}
