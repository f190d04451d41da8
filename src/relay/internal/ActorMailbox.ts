/**
 * The pool actor's commands and what carries them: the command union, one-shot reply slots, the
 * payload permits that bound queued event weight, and the small helpers of the consumer loop.
 */

import { Deferred, Effect, Exit, FiberId, MetricLabel } from "effect"
import { CanonicalCkfState } from "../../ckf/canonical.js"
import { memberKey } from "../../ckf/events.js"
import type { CkfFailureDisposition } from "../../ckf/failure.js"
import type { LaneLease } from "../../ckf/identity.js"
import type { DcCkfState, MemberCount } from "../../ckf/state.js"
import type { WorkerQueryResult } from "../../ckf/workerQuery.js"
import { counterFamily } from "../../observability/MetricFamilies.js"
import type { DpRank, RouterEvent, WorkerId } from "../../protocol/Events.js"
import type { SourceEpoch } from "../../recovery/RecoveryTarget.js"
import type {
  ActorFaultCategory,
  ActorSnapshot,
  ActorStats,
  ActorSubscription,
  ActorWorkerQuery,
  RankReplacement
} from "../PoolActor.js"
import { InvalidTreeDump, type KvDcRelayError, RelayShuttingDown } from "../RelayErrors.js"

/**
 * A turn of the consumer fiber ends (it yields) after 256 commands or 32 published deltas,
 * whichever comes first. Delta receivers, admitters and other actors share the one JavaScript
 * thread: the delta bound keeps a receiver that drains once per turn well inside its 64-delta
 * buffer whatever the pool's cadence, and the command bound keeps the actor from monopolizing the
 * thread, much like tokio's cooperative budget. 256 is one default mailbox: a turn drains what a
 * blocked admitter queued (about 0.4 ms of 8-block events), where 64 made the admitter and the
 * consumer switch four times as often (actor_cost_vs_core 1.96–2.17 against 1.74–1.83 now).
 */
export const COMMANDS_PER_TURN = 256

export const DELTAS_PER_TURN = 32

export type Reply<A> = ReplySlot<A>

export type Command =
  | {
      readonly _tag: "Apply"
      readonly sourceEpoch: SourceEpoch
      readonly event: RouterEvent
      readonly weight: number
      /** `Clock` milliseconds at admission (the publish-delay histogram's start). */
      readonly admittedAt: number
      /** Set when the submitter returned the permits itself (its offer was interrupted). */
      permitsReturned?: boolean
    }
  | {
      readonly _tag: "ReplaceRanks"
      readonly replacements: ReadonlyArray<RankReplacement>
      readonly weight: number
      readonly reply: Reply<void>
      permitsReturned?: boolean
    }
  | {
      readonly _tag: "MarkPartial"
      readonly sourceEpoch: SourceEpoch
      readonly workerId: WorkerId
      readonly dpRank: DpRank
    }
  | {
      readonly _tag: "ResetRank"
      readonly sourceEpoch: SourceEpoch
      readonly workerId: WorkerId
      readonly dpRank: DpRank
      readonly degraded: boolean
      readonly reply: Reply<void>
    }
  | { readonly _tag: "Flush"; readonly reply: Reply<void> }
  | { readonly _tag: "Snapshot"; readonly reply: Reply<ActorSnapshot> }
  | { readonly _tag: "Subscribe"; readonly lease: LaneLease; readonly reply: Reply<ActorSubscription> }
  | { readonly _tag: "Stats"; readonly reply: Reply<ActorStats> }
  | { readonly _tag: "Members"; readonly reply: Reply<ReadonlyArray<MemberCount>> }
  | { readonly _tag: "Query"; readonly query: ActorWorkerQuery; readonly reply: Reply<WorkerQueryResult> }
  | { readonly _tag: "RetireLease"; readonly reply: Reply<void> }
  | { readonly _tag: "Shutdown"; readonly reply: Reply<void> }
  | { readonly _tag: "Pause"; readonly entered: Reply<void>; readonly release: Deferred.Deferred<void> }
  /** The publication timer's deadline passed while the consumer was waiting for a command. */
  | { readonly _tag: "Tick" }

export const COMMAND_KIND: Record<Command["_tag"], string> = {
  Apply: "apply_event",
  ReplaceRanks: "replace_ranks",
  MarkPartial: "mark_history_partial",
  ResetRank: "reset_rank",
  Flush: "flush",
  Snapshot: "snapshot",
  Subscribe: "subscribe",
  Stats: "stats",
  Members: "member_counts",
  Query: "query_workers",
  RetireLease: "retire_publication_lease",
  Shutdown: "shutdown",
  Pause: "test_pause",
  Tick: "publication_timer"
}

export const TICK: Command = { _tag: "Tick" }

/**
 * A reply the submitter awaits. Every slot not completed by the consumer is failed with
 * `ActorStopped` when the actor stops (the seed's dropped oneshot sender), so a command discarded
 * from the mailbox by a fence never leaves its submitter waiting.
 */
export class ReplySlot<A> {
  readonly deferred = Deferred.unsafeMake<A, KvDcRelayError>(FiberId.none)
  constructor(private readonly outstanding: Set<ReplySlot<unknown>>) {
    outstanding.add(this as ReplySlot<unknown>)
  }
  succeed(value: A): void {
    this.outstanding.delete(this as ReplySlot<unknown>)
    Deferred.unsafeDone(this.deferred, Exit.succeed(value))
  }
  fail(error: KvDcRelayError): void {
    this.outstanding.delete(this as ReplySlot<unknown>)
    Deferred.unsafeDone(this.deferred, Exit.fail(error))
  }
  complete(error: KvDcRelayError | undefined, value: A): void {
    if (error === undefined) this.succeed(value)
    else this.fail(error)
  }
}

/**
 * Payload permits in blocks (the seed's `Semaphore` of 65,536 block permits), taken before a
 * command enters the mailbox and returned once the consumer has processed it.
 *
 * Not `Effect.makeSemaphore`: admission is the hot path, and Effect's semaphore has no synchronous
 * try-acquire (a take plus a release costs about as much as applying an 8-block event). FIFO-fair,
 * so a large replacement is not starved by a stream of small admissions.
 */
export { FifoPermits as PayloadPermits } from "../../recovery/FifoSemaphore.js"

export const failShuttingDown = Effect.fail(new RelayShuttingDown())

/**
 * `Effect.raceFirst` whose loser can always be interrupted. The consumer fiber inherits the
 * uninterruptible region the registry attaches pools in, and a race in such a fiber waits for
 * its loser's interruption forever: a full fault queue then froze the actor for good (every
 * later command, stats and shutdown included), as soon as a source sent 17 faulty events in a
 * row faster than the owner took them.
 */
export const raceInterruptibly = <A, E, B, E2>(
  left: Effect.Effect<A, E>,
  right: Effect.Effect<B, E2>
): Effect.Effect<A | B, E | E2> => Effect.raceFirst(Effect.interruptible(left), Effect.interruptible(right))

// The key `RelayMetrics` registers at zero (the actor does not import observability): one series.
const skippedBlocks = counterFamily(
  "kv_dc_relay_ingest_skipped_blocks_total",
  "KV blocks of engine events not indexed, by reason (unanchored: parent chain unknown)"
)

const UNANCHORED_LABELS = [MetricLabel.make("reason", "unanchored")]

/** Synchronous, so that the apply path counts without running an effect. */
export const countUnanchored = (blocks: number): void => {
  skippedBlocks.unsafeUpdate(blocks, UNANCHORED_LABELS)
}

export const canonicalUnanchored = (state: DcCkfState): number =>
  state instanceof CanonicalCkfState ? state.unanchoredBlockCount : 0

export const isPowerOfTwo = (n: number): boolean =>
  n > 0 && (n <= 0x4000_0000 ? (n & (n - 1)) === 0 : Number.isInteger(Math.log2(n)))

export const faultCategory = (disposition: CkfFailureDisposition): ActorFaultCategory => {
  switch (disposition.action) {
    case "ReportResourceFailure":
      return "Resource"
    case "RejectSource":
      return "SourceProtocol"
    default:
      // FenceAndRebuildProducer (and ContinueCapacityOmission, which never becomes a fault). The
      // consumer-lane actions cannot come from `eventFailurePoint`; fencing is the safe reading.
      return "ProducerInvariant"
  }
}

export const positiveInteger = (name: string, value: number): number => {
  if (!Number.isSafeInteger(value) || value <= 0) {
    throw new RangeError(`PoolActor option ${name} must be a positive integer, got ${value}`)
  }
  return value
}

/** A replacement batch naming one rank twice, or holding another rank's events. */
export const invalidReplacement = (
  replacements: ReadonlyArray<RankReplacement>
): InvalidTreeDump | undefined => {
  const seen = new Set<string>()
  for (const { workerId, dpRank, events } of replacements) {
    const key = memberKey(workerId, dpRank)
    if (seen.has(key)) {
      return new InvalidTreeDump({
        workerId,
        dpRank,
        reason: "replacement batch contains the same rank more than once"
      })
    }
    seen.add(key)
    if (events.some((event) => event.workerId !== workerId || event.dpRank !== dpRank)) {
      return new InvalidTreeDump({
        workerId,
        dpRank,
        reason: "event identity does not match replacement rank"
      })
    }
  }
  return undefined
}

/** Validates a replacement batch and gathers each rank's device-tier hash pairs. */
export const replacementHashes = (
  replacements: ReadonlyArray<RankReplacement>
): Array<{ workerId: WorkerId; dpRank: DpRank; hashes: Uint32Array }> | InvalidTreeDump => {
  const invalid = invalidReplacement(replacements)
  if (invalid !== undefined) return invalid
  const out: Array<{ workerId: WorkerId; dpRank: DpRank; hashes: Uint32Array }> = []
  for (const replacement of replacements) {
    const { workerId, dpRank } = replacement
    let length = 0
    for (const event of replacement.events) {
      if (event.storageTier !== "device") continue
      if (event.data._tag !== "Stored") {
        return new InvalidTreeDump({ workerId, dpRank, reason: "tree dump contains a non-Stored event" })
      }
      length += event.data.blockHashes.length
    }
    // Duplicate hashes need no set: a member's repeated store is a no-op in the rebuild.
    const hashes = new Uint32Array(length)
    let offset = 0
    for (const event of replacement.events) {
      if (event.storageTier !== "device" || event.data._tag !== "Stored") continue
      hashes.set(event.data.blockHashes, offset)
      offset += event.data.blockHashes.length
    }
    out.push({ workerId, dpRank, hashes })
  }
  return out
}
