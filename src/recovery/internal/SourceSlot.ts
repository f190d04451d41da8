/**
 * One expected (worker, dp rank) as the source supervisor tracks it: its slot (active binding,
 * rank cursor, reset and rejection state), the binding a publisher id resolves to, and the drop
 * counter the live path feeds.
 */

import { MetricLabel } from "effect"
import { counterFamily } from "../../observability/MetricFamilies.js"
import type { RankKey } from "../../protocol/Discovery.js"
import type { DpRank, DropReason, RouterEvent, WorkerId } from "../../protocol/Events.js"
import { RankState } from "../RankState.js"
import { SlotLock } from "../SlotLock.js"
import type { SourceBinding, SourceState } from "../SourceSupervisor.js"
import type { WorkerKvQueryResponse } from "../WorkerQuery.js"

// The key of `RelayMetrics`' drop counter (recovery does not import observability): one series.
const droppedBatches = counterFamily(
  "kv_dc_relay_ingest_dropped_batches_total",
  "KV event messages and batches dropped whole, by reason (domain/ingest.ts DropReason)"
)

const dropLabels = new Map<DropReason, ReadonlyArray<MetricLabel.MetricLabel>>()

/** Synchronous, so that the live path counts a drop without running an effect. */
export const countDrop = (reason: DropReason): void => {
  let labels = dropLabels.get(reason)
  if (labels === undefined) {
    labels = [MetricLabel.make("reason", reason)]
    dropLabels.set(reason, labels)
  }
  droppedBatches.unsafeUpdate(1, labels)
}

export interface MutableBinding extends SourceBinding {
  /** The seed's per-binding `lifetime` token; the supervisor's shutdown is its parent. */
  lifetimeCancelled: boolean
}

export interface RecoveryTask {
  cancelled: boolean
}

export class SourceSlot {
  /** Stands for the seed's async slot mutex (see the module comment). */
  readonly lock = new SlotLock()
  active: MutableBinding | undefined = undefined
  rank = new RankState()
  /**
   * NOTE: The coordinator's cumulative generation is the sole history of reset-relevant
   * membership transitions. Keep it optional so the first observed source does not reset.
   */
  lifecycleGeneration: number | undefined
  /** This flag represents only a failed acknowledged reset, not membership history. */
  resetPending = false
  /** A protocol-faulted incarnation remains ineligible until discovery advances generation. */
  rejectedGeneration: number | undefined = undefined
  /** Which incarnation was rejected, and why, while `rejectedGeneration` holds. */
  rejection: { readonly publisherId: bigint; readonly reason: string } | undefined = undefined
  /**
   * The rank's index lacks history it could not recover (a failed recovery or a live-only gap):
   * it serves what arrived since. Cleared by a successful recovery, a restart or a new binding.
   */
  degraded = false
  /** Why the rank is degraded, while it is. */
  degradedReason: string | undefined = undefined

  constructor(
    readonly key: RankKey,
    readonly workerId: WorkerId,
    readonly dpRank: DpRank,
    lifecycleGeneration: number | undefined
  ) {
    this.lifecycleGeneration = lifecycleGeneration
  }

  generationChanged(generation: number): boolean {
    return this.lifecycleGeneration !== undefined && this.lifecycleGeneration !== generation
  }

  acceptGeneration(generation: number): void {
    this.lifecycleGeneration = generation
    this.resetPending = false
    this.rejectedGeneration = undefined
    this.rejection = undefined
  }

  fenceForReset(): void {
    this.resetPending = true
    this.rank.finishFailedRecovery()
  }

  /** What diagnostics show for the rank's active source (PROTOCOL §3.2). */
  state(): SourceState {
    if (this.resetPending) return "degraded"
    if (this.rank.recoveryInflight) return "recovering"
    return this.degraded ? "degraded" : "live"
  }

  /** Why `state()` is `degraded`, when it is. */
  reason(): string | undefined {
    if (this.resetPending) return "waiting for a rank reset the pool could not complete"
    if (this.rank.recoveryInflight || !this.degraded) return undefined
    return this.degradedReason
  }

  markDegraded(reason: string): void {
    this.degraded = true
    this.degradedReason = reason
  }
}

export interface ActivePublisherBinding {
  readonly binding: MutableBinding
  readonly slot: SourceSlot
}

export const recoveryEventsMatchSource = (
  workerId: WorkerId,
  dpRank: DpRank,
  events: ReadonlyArray<RouterEvent>
): boolean => events.every((event) => event.workerId === workerId && event.dpRank === dpRank)

export const describeResponse = (response: WorkerKvQueryResponse): string => {
  switch (response._tag) {
    case "TooNew":
      return `TooNew(requested ${response.requestedStart}..${response.requestedEnd}, newest ${response.newestAvailable})`
    case "InvalidRange":
      return `InvalidRange(${response.startId}..${response.endId})`
    case "Error":
      return `Error(${response.message})`
    default:
      return response._tag
  }
}
