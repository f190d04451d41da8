/**
 * The endpoint-pool CKF actor: one bounded mailbox, exactly one consumer fiber that owns the
 * pool's `DcCkfState` and `DcCkfPublisher` (seed 002, `kv_dc_relay/actor.rs`).
 *
 * CONTRACT (shared by the registry, the publication hub, the host and the recovery target; keep
 * these types stable — the implementation below them may change freely).
 */

import {
  Cause,
  Chunk,
  Deferred,
  Duration,
  Effect,
  Exit,
  FiberHandle,
  FiberId,
  Mailbox,
  Metric,
  MetricLabel,
  Option,
  Queue,
  type Scope
} from "effect"
import { CanonicalCkfState } from "../ckf/canonical.js"
import { CkfBuildError, eventErrorText, KvCacheEventError } from "../ckf/errors.js"
import { type CkfMemberRef, memberKey } from "../ckf/events.js"
import { type CkfFailureDisposition, eventFailurePoint, failureDisposition } from "../ckf/failure.js"
import { type LaneLease, type PoolId, ProducerIdentity } from "../ckf/identity.js"
import {
  DcCkfPublishError,
  DcCkfPublisher,
  type DcCkfSnapshot,
  PublisherSnapshotError
} from "../ckf/publisher.js"
import type { DcCkfPublicationBatch, DcCkfState, DcCkfStats, MemberCount } from "../ckf/state.js"
import { PublishDelayHistogram, type PublishDelaySnapshot } from "../observability/PublishDelay.js"
import { type DpRank, eventPayloadWeight, type RouterEvent, type WorkerId } from "../protocol/Events.js"
import type { SourceEpoch } from "../recovery/RecoveryTarget.js"
import { type DeltaBroadcastSendError, type DeltaReceiver, makeDeltaBroadcast } from "./DeltaBroadcast.js"
import {
  ActorStopped,
  CkfBuildFailed,
  CkfEventFailed,
  InvalidTreeDump,
  type KvDcRelayError,
  PublisherFailed,
  RelayShuttingDown,
  StaleSourceEpoch
} from "./RelayErrors.js"

export const DEFAULT_MAILBOX_CAPACITY = 256
export const DEFAULT_PENDING_BLOCK_PERMITS = 65_536
export const DEFAULT_PUBLICATION_CAPACITY = 64
export const DEFAULT_FAULT_CAPACITY = 16
export const DEFAULT_PUBLICATION_DELAY_MS = 1
export const RECOVERY_REBUILD_BATCH_WINDOW_MS = 5

/** What a producer generation publishes under. */
export interface StreamScope {
  readonly relayIncarnation: bigint
  readonly layoutGeneration: bigint
  readonly poolId: PoolId
}

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

export interface ActorStats {
  readonly stats: DcCkfStats
  /** The publisher's last sequence. */
  readonly sequence: bigint
  readonly members: ReadonlyArray<MemberCount>
  /** Members whose history is partial (PROTOCOL §3.3 ◆3); sorted by (worker id, dp rank). */
  readonly partialMembers: ReadonlyArray<CkfMemberRef>
}

export interface ActorDiagnostics {
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

export interface RankReplacement {
  readonly sourceEpoch: SourceEpoch
  readonly workerId: WorkerId
  readonly dpRank: DpRank
  /** A tree dump: device-tier Stored events of this rank only. */
  readonly events: ReadonlyArray<RouterEvent>
}

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

// ---------------------------------------------------------------------------------------------
// Implementation
//
// Hot path: `admitEvent` takes payload permits and offers to the mailbox synchronously inside one
// effect when both have room; the consumer takes commands in batches and applies events without
// running an effect unless a log or fault follows. Slow paths (backpressure, replies, faults,
// timer) are ordinary effects. Source epochs follow the seed: a stale epoch is dropped, an epoch
// that advances without a reset or replacement is a SourceProtocolFailure fault, and reset and
// replacement reject older epochs and record theirs on success.

/**
 * A turn of the consumer fiber ends (it yields) after 256 commands or 32 published deltas,
 * whichever comes first. Delta receivers, admitters and other actors share the one JavaScript
 * thread: the delta bound keeps a receiver that drains once per turn well inside its 64-delta
 * buffer whatever the pool's cadence, and the command bound keeps the actor from monopolizing the
 * thread, much like tokio's cooperative budget. 256 is one default mailbox: a turn drains what a
 * blocked admitter queued (about 0.4 ms of 8-block events), where 64 made the admitter and the
 * consumer switch four times as often (actor_cost_vs_core 1.96–2.17 against 1.74–1.83 now).
 */
const COMMANDS_PER_TURN = 256
const DELTAS_PER_TURN = 32

type Reply<A> = ReplySlot<A>

type Command =
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
  | { readonly _tag: "RetireLease"; readonly reply: Reply<void> }
  | { readonly _tag: "Shutdown"; readonly reply: Reply<void> }
  | { readonly _tag: "Pause"; readonly entered: Reply<void>; readonly release: Deferred.Deferred<void> }
  /** The publication timer's deadline passed while the consumer was waiting for a command. */
  | { readonly _tag: "Tick" }

const COMMAND_KIND: Record<Command["_tag"], string> = {
  Apply: "apply_event",
  ReplaceRanks: "replace_ranks",
  MarkPartial: "mark_history_partial",
  ResetRank: "reset_rank",
  Flush: "flush",
  Snapshot: "snapshot",
  Subscribe: "subscribe",
  Stats: "stats",
  Members: "member_counts",
  RetireLease: "retire_publication_lease",
  Shutdown: "shutdown",
  Pause: "test_pause",
  Tick: "publication_timer"
}

const TICK: Command = { _tag: "Tick" }

/**
 * A reply the submitter awaits. Every slot not completed by the consumer is failed with
 * `ActorStopped` when the actor stops (the seed's dropped oneshot sender), so a command discarded
 * from the mailbox by a fence never leaves its submitter waiting.
 */
class ReplySlot<A> {
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
 * try-acquire (a take plus a release costs about as much as applying an 8-block event). Like
 * tokio's semaphore this one is FIFO-fair, so a large replacement is not starved by a stream of
 * small admissions: once anyone waits, `tryAcquire` fails for everyone behind it.
 */
class PayloadPermits {
  private available: number
  private readonly waiters: Array<{ readonly n: number; granted: boolean; readonly wake: () => void }> = []

  constructor(capacity: number) {
    this.available = capacity
  }

  tryAcquire(n: number): boolean {
    if (this.waiters.length !== 0 || this.available < n) return false
    this.available -= n
    return true
  }

  /** Waits in FIFO order; permits granted to a fiber interrupted before it resumed are returned. */
  acquire(n: number): Effect.Effect<void> {
    return Effect.suspend(() => {
      if (this.tryAcquire(n)) return Effect.void
      const waiter = { n, granted: false, wake: (): void => undefined }
      return Effect.async<void>((resume) => {
        waiter.wake = () => resume(Effect.void)
        this.waiters.push(waiter)
        return Effect.sync(() => {
          const i = this.waiters.indexOf(waiter)
          if (i >= 0) this.waiters.splice(i, 1)
          // The head may have been what blocked smaller requests behind it.
          this.pump()
        })
      }).pipe(Effect.onInterrupt(() => Effect.sync(() => waiter.granted && this.release(n))))
    })
  }

  release(n: number): void {
    this.available += n
    this.pump()
  }

  /** After the actor stopped: every current and future request succeeds at once. */
  open(): void {
    this.available = Number.POSITIVE_INFINITY
    this.pump()
  }

  private pump(): void {
    while (this.waiters.length !== 0 && this.available >= this.waiters[0]!.n) {
      const waiter = this.waiters.shift()!
      this.available -= waiter.n
      waiter.granted = true
      waiter.wake()
    }
  }
}

const failShuttingDown = Effect.fail(new RelayShuttingDown())

/**
 * `Effect.raceFirst` whose loser can always be interrupted. The consumer fiber inherits the
 * uninterruptible region the registry attaches pools in, and a race in such a fiber waits for
 * its loser's interruption forever: a full fault queue then froze the actor for good (every
 * later command, stats and shutdown included), as soon as a source sent 17 faulty events in a
 * row faster than the owner took them.
 */
const raceInterruptibly = <A, E, B, E2>(
  left: Effect.Effect<A, E>,
  right: Effect.Effect<B, E2>
): Effect.Effect<A | B, E | E2> => Effect.raceFirst(Effect.interruptible(left), Effect.interruptible(right))

// The key `RelayMetrics` registers at zero (the actor does not import observability): one series.
const skippedBlocks = Metric.counter("kv_dc_relay_ingest_skipped_blocks_total", {
  description: "KV blocks of engine events not indexed, by reason (unanchored: parent chain unknown)",
  incremental: true
})
const UNANCHORED_LABELS = [MetricLabel.make("reason", "unanchored")]
/** Synchronous, so that the apply path counts without running an effect. */
const countUnanchored = (blocks: number): void => {
  skippedBlocks.unsafeUpdate(blocks, UNANCHORED_LABELS)
}

const canonicalUnanchored = (state: DcCkfState): number =>
  state instanceof CanonicalCkfState ? state.unanchoredBlockCount : 0

const isPowerOfTwo = (n: number): boolean =>
  n > 0 && (n <= 0x4000_0000 ? (n & (n - 1)) === 0 : Number.isInteger(Math.log2(n)))

const faultCategory = (disposition: CkfFailureDisposition): ActorFaultCategory => {
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

const positiveInteger = (name: string, value: number): number => {
  if (!Number.isSafeInteger(value) || value <= 0) {
    throw new RangeError(`PoolActor option ${name} must be a positive integer, got ${value}`)
  }
  return value
}

/** A replacement batch naming one rank twice, or holding another rank's events. */
const invalidReplacement = (replacements: ReadonlyArray<RankReplacement>): InvalidTreeDump | undefined => {
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
const replacementHashes = (
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

export const make: MakePoolActor = (state, streamScope, options = {}) =>
  Effect.gen(function* () {
    const mailboxCapacity = positiveInteger(
      "mailboxCapacity",
      options.mailboxCapacity ?? DEFAULT_MAILBOX_CAPACITY
    )
    const permitCapacity = positiveInteger(
      "pendingBlockPermits",
      options.pendingBlockPermits ?? DEFAULT_PENDING_BLOCK_PERMITS
    )
    const faultCapacity = positiveInteger("faultCapacity", options.faultCapacity ?? DEFAULT_FAULT_CAPACITY)
    const publicationDelayMs = Duration.toMillis(
      Duration.decode(options.publicationDelay ?? Duration.millis(DEFAULT_PUBLICATION_DELAY_MS))
    )
    const identity = new ProducerIdentity(
      streamScope.poolId,
      streamScope.relayIncarnation,
      streamScope.layoutGeneration,
      state.format
    )
    const poolLabel = String(streamScope.poolId)
    const spanAttributes = {
      "kvrelay.pool": poolLabel,
      "kvrelay.layout_generation": String(streamScope.layoutGeneration)
    }

    // An Effect `Mailbox` rather than `Queue.bounded`: its buffer is a plain array (taking a batch
    // costs a tenth of `Queue.takeUpTo`, which rebuilds a Chunk element by element), a waiting
    // take is woken rather than handed an item (interrupting it loses nothing), and `end` is
    // tokio's `Receiver::close` (no new sends, buffered commands still drain).
    const mailbox = yield* Mailbox.make<Command>({ capacity: mailboxCapacity })
    const faults = yield* Queue.bounded<ActorFault>(faultCapacity)
    const permits = new PayloadPermits(permitCapacity)
    const broadcast = makeDeltaBroadcast(options.publicationCapacity ?? DEFAULT_PUBLICATION_CAPACITY)
    const publisher = new DcCkfPublisher<DeltaBroadcastSendError>(identity, 0n, broadcast.sink)
    const fenceSignal = yield* Deferred.make<void>()
    const stopped = yield* Deferred.make<void>()
    const sleepers = yield* FiberHandle.make<void, never>()
    const clock = yield* Effect.clock
    const outstanding = new Set<ReplySlot<unknown>>()

    // Shared between the handle and the consumer fiber; every access is a synchronous read or
    // write, so no interleaving can split one.
    let accepting = true
    let fenced = false
    const diag = {
      activeCommand: undefined as string | undefined,
      shuttingDown: false,
      lastError: undefined as string | undefined,
      publications: 0,
      unchangedPublications: 0,
      degradedResets: 0,
      rebuilds: 0,
      appliedEvents: 0,
      staleEventsDropped: 0,
      capacityOmissionEvents: 0,
      unknownRemovalEvents: 0,
      faultsReported: 0,
      rebuildTotalMs: 0,
      rebuildMaxMs: 0
    }
    const recordError = (message: string): void => {
      diag.lastError = message
    }

    // -----------------------------------------------------------------------------------------
    // Consumer fiber: the only code that touches `state`, `publisher` and `sourceEpochs`.

    // The discovery epoch each (worker, rank) was last admitted, reset or replaced under. Slots
    // are mutated in place, so the last one looked up can be reused without building its key.
    const sourceEpochs = new Map<string, { epoch: SourceEpoch | undefined }>()
    let lastEpochWorker = ""
    let lastEpochRank = -1
    let lastEpochSlot: { epoch: SourceEpoch | undefined } = { epoch: undefined }
    const epochSlot = (workerId: WorkerId, dpRank: DpRank): { epoch: SourceEpoch | undefined } => {
      if (workerId === lastEpochWorker && dpRank === lastEpochRank) return lastEpochSlot
      const key = memberKey(workerId, dpRank)
      let slot = sourceEpochs.get(key)
      if (slot === undefined) {
        slot = { epoch: undefined }
        sourceEpochs.set(key, slot)
      }
      lastEpochWorker = workerId
      lastEpochRank = dpRank
      lastEpochSlot = slot
      return slot
    }
    let timerArmed = false
    let timerDeadline = 0
    let sleeperDeadline = -1
    let discardTail = false
    let shutdownReply: Reply<void> | undefined

    let deltasThisTurn = 0
    // Admission time of the oldest event in the state's pending publication window; -1 when the
    // window holds none. A publication closes it, and so does the consumer loop after any command
    // that left nothing pending (an unchanged boundary, a snapshot's barrier, a rebuild).
    let windowSince = -1
    const publishDelay = new PublishDelayHistogram()
    const publishBatch = (batch: DcCkfPublicationBatch): PublisherFailed | undefined => {
      const outcome = publisher.publish(batch)
      if (outcome instanceof DcCkfPublishError) return new PublisherFailed({ reason: outcome.message })
      if (outcome._tag === "Published") {
        diag.publications++
        deltasThisTurn++
        if (windowSince >= 0) publishDelay.observe(clock.unsafeCurrentTimeMillis() - windowSince)
      } else {
        diag.unchangedPublications++
      }
      windowSince = -1
      return undefined
    }

    const publishPending = (): PublisherFailed | undefined => {
      const batch = state.flush()
      return batch === undefined ? undefined : publishBatch(batch)
    }

    const firePublicationTimer = (): void => {
      timerArmed = false
      if (state.hasPendingPublication()) {
        const error = publishPending()
        if (error !== undefined) recordError(error.message)
      }
    }

    // One sleeper fiber for the actor's life, rather than one forked (and the previous one
    // interrupted) per publication: a fork and an interrupt cost more than publishing a delta.
    // The consumer hands it the deadline to sleep to (`sleeperTarget`) and wakes it when it is
    // parked. It sleeps until that absolute deadline (a TestClock adjusted before the sleep began
    // still fires it), or on to a later one set meanwhile, and then wakes a waiting consumer. A
    // full mailbox drops the tick: the consumer is busy then and checks the deadline itself
    // before it waits again.
    let sleeperTarget: number | undefined
    let wakeSleeper: (() => void) | undefined
    const sleeperParked = Effect.async<void>((resume) => {
      if (sleeperTarget !== undefined) return resume(Effect.void)
      wakeSleeper = () => {
        wakeSleeper = undefined
        resume(Effect.void)
      }
      return Effect.sync(() => {
        wakeSleeper = undefined
      })
    })
    const sleeperTurn = Effect.suspend(() => {
      const target = sleeperTarget
      if (target === undefined) return sleeperParked
      const now = clock.unsafeCurrentTimeMillis()
      if (target > now) return Effect.sleep(target - now)
      sleeperTarget = undefined
      if (timerArmed && timerDeadline <= now) mailbox.unsafeOffer(TICK)
      return Effect.void
    })
    const armSleeper = (deadline: number): void => {
      sleeperTarget = deadline
      wakeSleeper?.()
    }

    /** Hands a fault to the owner; false when a fence interrupted the (blocked) send. */
    const sendFault = (fault: ActorFault): Effect.Effect<boolean> =>
      Effect.suspend(() => {
        if (fenced) return Effect.succeed(false)
        diag.faultsReported++
        if (Queue.unsafeOffer(faults, fault)) return Effect.succeed(true)
        // Biased as the seed's select: the fence wins over a send that could complete too.
        return raceInterruptibly(
          Deferred.await(fenceSignal).pipe(Effect.as(false)),
          Queue.offer(faults, fault).pipe(Effect.as(true))
        )
      })

    const staleEpoch = (workerId: WorkerId, dpRank: DpRank, received: SourceEpoch) => {
      const current = epochSlot(workerId, dpRank).epoch
      return current !== undefined && received < current
        ? new StaleSourceEpoch({ workerId, dpRank, current, received })
        : undefined
    }

    let capacityOmissionEvents = 0
    let unknownRemovalEvents = 0

    const CONTINUE = Effect.succeed(true)

    /**
     * Applies one admitted event synchronously. Returns `undefined` when nothing is left to do, or
     * the rare follow-up (logs, a fault send) whose result is false when the consumer must stop.
     */
    const apply = (
      sourceEpoch: SourceEpoch,
      event: RouterEvent,
      admittedAt: number
    ): Effect.Effect<boolean> | undefined => {
      const { workerId, dpRank, eventId } = event
      const slot = epochSlot(workerId, dpRank)
      const current = slot.epoch
      if (current !== undefined && sourceEpoch < current) {
        diag.staleEventsDropped++
        return Effect.logDebug("Dropping an admitted KV mutation from a superseded source epoch").pipe(
          Effect.annotateLogs({ workerId, dpRank, eventId, sourceEpoch, currentEpoch: current }),
          Effect.as(true)
        )
      }
      if (current !== undefined && sourceEpoch > current) {
        const disposition = failureDisposition("SourceProtocolFailure")
        const message = `source epoch advanced from ${current} to ${sourceEpoch} without a reset or replacement barrier`
        recordError(message)
        return sendFault({
          workerId,
          dpRank,
          sourceEpoch,
          eventId,
          category: faultCategory(disposition),
          disposition,
          message
        })
      }
      if (current === undefined) slot.epoch = sourceEpoch
      // NOTE: Subscriber-free Relay operation is transitional or diagnostic, not an optimized
      // steady-state mode. Keep one publication path until an unsubscribed deployment is
      // measured; a useful Relay is expected to have a consumer.
      const outcome = state.applyEvent(event)
      diag.appliedEvents++
      if (outcome.unanchoredBlocks !== 0) countUnanchored(outcome.unanchoredBlocks)
      if (windowSince < 0) windowSince = admittedAt
      let followUp: Effect.Effect<void> | undefined
      if (outcome.unknownRemovals !== 0) {
        unknownRemovalEvents++
        diag.unknownRemovalEvents = unknownRemovalEvents
        const annotations = {
          workerId,
          dpRank,
          eventId,
          unknownRemovals: outcome.unknownRemovals,
          unknownRemovalEvents
        }
        if (unknownRemovalEvents === 1) {
          followUp = Effect.logWarning("Ignoring KV DC Relay removals not owned by this worker/rank").pipe(
            Effect.annotateLogs(annotations)
          )
        } else if (isPowerOfTwo(unknownRemovalEvents)) {
          followUp = Effect.logDebug("KV DC Relay continues after repeated unknown removals").pipe(
            Effect.annotateLogs(annotations)
          )
        }
      }
      if (outcome.publication !== undefined) {
        const error = publishBatch(outcome.publication)
        if (error !== undefined) recordError(error.message)
      } else if (outcome.publicationBoundary) {
        diag.unchangedPublications++
      }
      if (outcome.publicationBoundary) {
        timerArmed = false
      } else if (state.pendingEventCount() === 1 && !timerArmed) {
        timerArmed = true
        timerDeadline = clock.unsafeCurrentTimeMillis() + publicationDelayMs
      }
      const kind = outcome.firstError
      if (kind === undefined) return followUp === undefined ? undefined : Effect.zipRight(followUp, CONTINUE)
      const disposition = failureDisposition(eventFailurePoint(kind))
      if (disposition.action === "ContinueCapacityOmission") {
        // NOTE: A bounded relocation miss is a pre-commit lossy-index omission. Do not turn it
        // into a lifecycle fault: the affected block is unchanged, successful sibling blocks
        // remain committed, a later Store may retry, and an omitted hash's Remove remains a
        // safe no-op.
        capacityOmissionEvents++
        diag.capacityOmissionEvents = capacityOmissionEvents
        let omissionLog: Effect.Effect<void> | undefined
        if (capacityOmissionEvents === 1) {
          omissionLog = Effect.logWarning(
            "KV DC Relay omitted a capacity-exhausted mutation; service continues"
          ).pipe(Effect.annotateLogs({ workerId, dpRank, eventId, capacityOmissionEvents }))
        } else if (isPowerOfTwo(capacityOmissionEvents)) {
          omissionLog = Effect.logDebug("KV DC Relay continues after repeated capacity omissions").pipe(
            Effect.annotateLogs({ workerId, dpRank, eventId, capacityOmissionEvents })
          )
        }
        if (omissionLog !== undefined)
          followUp = followUp === undefined ? omissionLog : Effect.zipRight(followUp, omissionLog)
        return followUp === undefined ? undefined : Effect.zipRight(followUp, CONTINUE)
      }
      const message = eventErrorText(kind)
      recordError(message)
      const send = sendFault({
        workerId,
        dpRank,
        sourceEpoch,
        eventId,
        category: faultCategory(disposition),
        disposition,
        message
      })
      return followUp === undefined ? send : Effect.zipRight(followUp, send)
    }

    const replaceRanks = (replacements: ReadonlyArray<RankReplacement>): KvDcRelayError | undefined => {
      for (const replacement of replacements) {
        const stale = staleEpoch(replacement.workerId, replacement.dpRank, replacement.sourceEpoch)
        if (stale !== undefined) return stale
      }
      const started = clock.unsafeCurrentTimeMillis()
      const unanchoredBefore = canonicalUnanchored(state)
      const result = rebuild(replacements)
      const unanchoredNow = canonicalUnanchored(state)
      if (unanchoredNow > unanchoredBefore) countUnanchored(unanchoredNow - unanchoredBefore)
      if (result === undefined) {
        for (const r of replacements) epochSlot(r.workerId, r.dpRank).epoch = r.sourceEpoch
      }
      const elapsed = clock.unsafeCurrentTimeMillis() - started
      diag.rebuilds++
      diag.rebuildTotalMs += elapsed
      diag.rebuildMaxMs = Math.max(diag.rebuildMaxMs, elapsed)
      return result
    }

    // The whole batch is built off-side. A pre-swap failure leaves every prior rank unchanged;
    // the strong responses all observe the same atomic result.
    const rebuild = (replacements: ReadonlyArray<RankReplacement>): KvDcRelayError | undefined => {
      let publication: ReturnType<DcCkfState["replaceRanks"]>
      if (state instanceof CanonicalCkfState) {
        const invalid = invalidReplacement(replacements)
        if (invalid !== undefined) return invalid
        publication = state.replaceRanksFromEvents(replacements)
      } else {
        const hashes = replacementHashes(replacements)
        if (hashes instanceof InvalidTreeDump) return hashes
        publication = state.replaceRanks(hashes)
      }
      if (publication instanceof KvCacheEventError) return new CkfEventFailed({ kind: publication.kind })
      if (publication instanceof CkfBuildError) return new CkfBuildFailed({ cause: publication })
      if (publication === undefined) {
        diag.unchangedPublications++
        return undefined
      }
      return publishBatch(publication)
    }

    const resetRank = (
      sourceEpoch: SourceEpoch,
      workerId: WorkerId,
      dpRank: DpRank,
      degraded: boolean
    ): Effect.Effect<KvDcRelayError | undefined> =>
      Effect.gen(function* () {
        const stale = staleEpoch(workerId, dpRank, sourceEpoch)
        if (stale !== undefined) return stale
        let removal = state.removeRank(workerId, dpRank)
        if (removal instanceof KvCacheEventError) {
          // Clear may have committed earlier hashes while remaining exact. Retry the still-tracked
          // suffix once; the strong acknowledgement reports failure if progress cannot complete.
          yield* Effect.logWarning("Retrying the remaining tracked hashes after a partial rank reset").pipe(
            Effect.annotateLogs({ workerId, dpRank, sourceEpoch, error: removal.message })
          )
          removal = state.removeRank(workerId, dpRank)
        }
        if (removal instanceof KvCacheEventError) return new CkfEventFailed({ kind: removal.kind })
        if (degraded) diag.degradedResets++
        if (removal === undefined) {
          diag.unchangedPublications++
        } else {
          const error = publishBatch(removal)
          if (error !== undefined) return error
        }
        epochSlot(workerId, dpRank).epoch = sourceEpoch
        return undefined
      })

    const diagnosticSnapshot = (): ActorSnapshot | KvDcRelayError => {
      const barrier = state.barrierSnapshot()
      if (barrier instanceof CkfBuildError) return new CkfBuildFailed({ cause: barrier })
      if (barrier.tail !== undefined) {
        const error = publishBatch(barrier.tail)
        if (error !== undefined) return error
      }
      return { identity, sequence: publisher.lastSequence, words: barrier.words, stats: state.stats() }
    }

    const subscribe = (lease: LaneLease): ActorSubscription | KvDcRelayError => {
      const snapshot = publisher.snapshotAfterBarrier(state, lease)
      if (snapshot instanceof PublisherSnapshotError) return new PublisherFailed({ reason: snapshot.message })
      // The actor cannot process a continuation mutation until this command returns. Subscribe
      // after any old-lease tail so the new receiver starts exactly after snapshot sequence N.
      return { snapshot, deltas: broadcast.subscribe() }
    }

    /** Processes one command; false when the consumer must stop (a fence interrupted it). */
    const process = (command: Command): Effect.Effect<boolean> | undefined => {
      switch (command._tag) {
        case "Apply":
          return apply(command.sourceEpoch, command.event, command.admittedAt)
        case "ReplaceRanks":
          command.reply.complete(replaceRanks(command.replacements), undefined)
          return undefined
        case "MarkPartial": {
          const current = epochSlot(command.workerId, command.dpRank).epoch
          if (state instanceof CanonicalCkfState && (current === undefined || command.sourceEpoch >= current))
            state.markPartial(command.workerId, command.dpRank)
          return undefined
        }
        case "ResetRank":
          return Effect.map(
            resetRank(command.sourceEpoch, command.workerId, command.dpRank, command.degraded),
            (error) => {
              command.reply.complete(error, undefined)
              return true
            }
          )
        case "Flush":
          command.reply.complete(publishPending(), undefined)
          return undefined
        case "Snapshot": {
          const result = diagnosticSnapshot()
          if ("_tag" in result) command.reply.fail(result)
          else command.reply.succeed(result)
          return undefined
        }
        case "Subscribe": {
          const result = subscribe(command.lease)
          if ("_tag" in result) command.reply.fail(result)
          else command.reply.succeed(result)
          return undefined
        }
        case "Stats":
          command.reply.succeed({
            stats: state.stats(),
            sequence: publisher.lastSequence,
            members: state.memberCounts(),
            partialMembers: state instanceof CanonicalCkfState ? state.partialMembers() : []
          })
          return undefined
        case "Members":
          command.reply.succeed(state.memberCounts())
          return undefined
        case "RetireLease":
          publisher.retireLease()
          command.reply.succeed(undefined)
          return undefined
        case "Shutdown":
          if (shutdownReply !== undefined) {
            command.reply.fail(new RelayShuttingDown())
          } else {
            accepting = false
            diag.shuttingDown = true
            shutdownReply = command.reply
            // tokio's `Receiver::close`: later sends fail, buffered commands still drain.
            mailbox.unsafeDone(Exit.void)
          }
          return undefined
        case "Pause":
          command.entered.succeed(undefined)
          // The seed waits for the release only; a fence also ends the pause here so that
          // closing a test's scope cannot hang on a forgotten release.
          return Effect.as(
            raceInterruptibly(Deferred.await(command.release), Deferred.await(fenceSignal)),
            true
          )
        case "Tick":
          if (timerArmed && timerDeadline <= clock.unsafeCurrentTimeMillis()) firePublicationTimer()
          return undefined
      }
    }

    // Commands taken from the mailbox but not processed yet (the rest of the current batch).
    let inFlight = 0

    const consume = Effect.gen(function* () {
      let commandsThisTurn = 0
      let released = 0
      for (;;) {
        if (fenced) {
          discardTail = true
          return
        }
        const size = mailbox.unsafeSize()
        // Ended by a graceful shutdown and drained.
        if (Option.isNone(size)) return
        const queued = size.value
        if (queued === 0) {
          // About to wait: return the processed commands' permits and start a fresh turn.
          if (released !== 0) {
            permits.release(released)
            released = 0
          }
          commandsThisTurn = 0
          deltasThisTurn = 0
          if (timerArmed) {
            if (timerDeadline <= clock.unsafeCurrentTimeMillis()) {
              firePublicationTimer()
              continue
            }
            if (sleeperDeadline !== timerDeadline) {
              sleeperDeadline = timerDeadline
              armSleeper(timerDeadline)
            }
          }
        }
        // One mailbox operation per batch amortizes its cost. With nothing queued this waits, then
        // takes everything that arrived (`takeN(1)` would take one command and come back for the
        // rest of an admitter's burst); a batch larger than a turn still yields at the bound below.
        const [chunk, done] = yield* queued === 0
          ? mailbox.takeAll
          : mailbox.takeN(Math.min(queued, COMMANDS_PER_TURN))
        const batch = Chunk.toReadonlyArray(chunk)
        for (let i = 0; i < batch.length; i++) {
          // Biased as the seed's select: a fence is seen before the next command.
          if (fenced) {
            inFlight = 0
            discardTail = true
            return
          }
          const command = batch[i]!
          inFlight = batch.length - i - 1
          diag.activeCommand = COMMAND_KIND[command._tag]
          const followUp = process(command)
          if (followUp !== undefined && !(yield* followUp)) {
            inFlight = 0
            discardTail = fenced
            return
          }
          if (
            (command._tag === "Apply" || command._tag === "ReplaceRanks") &&
            command.permitsReturned !== true
          ) {
            // Held until processed, as the seed's permit dropped with the command.
            released += command.weight
          }
          if (!state.hasPendingPublication()) {
            timerArmed = false
            // Whatever drained the window (a snapshot's barrier, a rebuild) closed it.
            windowSince = -1
          }
          diag.activeCommand = undefined
          if (++commandsThisTurn >= COMMANDS_PER_TURN || deltasThisTurn >= DELTAS_PER_TURN) {
            // Within a turn the mailbox comes before the timer (the seed's biased select); at a
            // turn's end an expired timer fires even though commands keep arriving, so a busy
            // mailbox cannot hold a sparse tail back indefinitely.
            if (timerArmed && timerDeadline <= clock.unsafeCurrentTimeMillis()) firePublicationTimer()
            permits.release(released)
            released = 0
            commandsThisTurn = 0
            deltasThisTurn = 0
            yield* Effect.yieldNow()
          }
        }
        inFlight = 0
        if (done) return
      }
    })

    const finish = (exit: Exit.Exit<void>) =>
      Effect.gen(function* () {
        accepting = false
        if (fenced) discardTail = true
        // An interrupted or failed consumer leaves an uncertain tail, like a fence.
        if (Exit.isFailure(exit)) {
          discardTail = true
          if (!Cause.isInterruptedOnly(exit.cause)) {
            yield* Effect.logError("KV DC Relay actor failed").pipe(
              Effect.annotateLogs({ cause: Cause.pretty(exit.cause) })
            )
          }
        }
        if (!discardTail) {
          const error = publishPending()
          if (error !== undefined) recordError(error.message)
        }
        publisher.retireLease()
        broadcast.close(discardTail ? "discard" : "drain")
        // Blocked admissions fail with RelayShuttingDown; discarded commands' replies are failed
        // below, and nobody waits for payload permits any more.
        yield* mailbox.shutdown
        permits.open()
        yield* FiberHandle.clear(sleepers)
        timerArmed = false
        shutdownReply?.succeed(undefined)
        for (const slot of [...outstanding]) slot.fail(new ActorStopped())
        diag.activeCommand = undefined
        yield* Deferred.succeed(stopped, undefined)
      })

    yield* FiberHandle.run(sleepers, Effect.interruptible(Effect.forever(sleeperTurn)))
    yield* consume.pipe(
      Effect.onExit(finish),
      Effect.annotateLogs({ pool: poolLabel, layoutGeneration: String(streamScope.layoutGeneration) }),
      Effect.forkScoped
    )

    // -----------------------------------------------------------------------------------------
    // Handle

    /**
     * Payload permits first (the seed's semaphore), then the mailbox; the permits travel with the
     * command. Called while the admission effect runs (each run builds its own command); the
     * common case completes synchronously.
     */
    const enqueueNow = (command: Command, weight: number): Effect.Effect<void, RelayShuttingDown> => {
      if (!accepting) return failShuttingDown
      if (weight === 0 || permits.tryAcquire(weight)) {
        if (mailbox.unsafeOffer(command)) return Exit.void
        return Effect.uninterruptibleMask((restore) => offerSlow(command, weight, restore))
      }
      return Effect.uninterruptibleMask((restore) =>
        Effect.zipRight(restore(permits.acquire(weight)), offerSlow(command, weight, restore))
      )
    }

    /** Waits for mailbox capacity; a closed mailbox is the seed's closed-channel send error. */
    const offerSlow = (
      command: Command,
      weight: number,
      restore: <A, E, R>(effect: Effect.Effect<A, E, R>) => Effect.Effect<A, E, R>
    ): Effect.Effect<void, RelayShuttingDown> => {
      const returnPermits = Effect.sync(() => {
        if (weight === 0) return
        // An interrupted offer may still have been accepted: the flag keeps the consumer from
        // returning the same permits a second time.
        if (command._tag === "Apply" || command._tag === "ReplaceRanks") command.permitsReturned = true
        permits.release(weight)
      })
      return Effect.suspend(() => (accepting ? restore(mailbox.offer(command)) : Effect.succeed(false))).pipe(
        Effect.onInterrupt(() => returnPermits),
        Effect.flatMap((accepted) =>
          accepted ? Effect.void : Effect.zipRight(returnPermits, failShuttingDown)
        )
      )
    }

    const submit = <A>(
      makeCommand: (reply: Reply<A>) => Command,
      weight = 0
    ): Effect.Effect<A, KvDcRelayError> =>
      Effect.suspend(() => {
        if (!accepting) return failShuttingDown
        const reply = new ReplySlot<A>(outstanding as Set<ReplySlot<unknown>>)
        return Effect.zipRight(
          enqueueNow(makeCommand(reply), weight).pipe(
            Effect.tapError(() => Effect.sync(() => reply.fail(new RelayShuttingDown())))
          ),
          Deferred.await(reply.deferred)
        )
      })

    const weightOf = (blocks: number): number => Math.max(1, Math.min(blocks, permitCapacity))

    const span = <A, E>(name: string, effect: Effect.Effect<A, E>): Effect.Effect<A, E> =>
      Effect.withSpan(effect, `PoolActor.${name}`, { attributes: spanAttributes })

    const admitEventsNow = (sourceEpoch: SourceEpoch, events: ReadonlyArray<RouterEvent>): boolean => {
      const n = events.length
      if (!accepting || n === 0) return n === 0
      const size = mailbox.unsafeSize()
      if (Option.isNone(size) || mailboxCapacity - size.value < n) return false
      let total = 0
      for (let i = 0; i < n; i++) total += weightOf(eventPayloadWeight(events[i]!))
      // One acquisition for all: it succeeds exactly when one per event in turn would.
      if (!permits.tryAcquire(total)) return false
      let event = events[0]!
      let weight = weightOf(eventPayloadWeight(event))
      const admittedAt = clock.unsafeCurrentTimeMillis()
      // Refused only by a mailbox that is closing; with the first one queued, the rest fit.
      if (!mailbox.unsafeOffer({ _tag: "Apply", sourceEpoch, event, weight, admittedAt })) {
        permits.release(total)
        return false
      }
      for (let i = 1; i < n; i++) {
        event = events[i]!
        weight = weightOf(eventPayloadWeight(event))
        mailbox.unsafeOffer({ _tag: "Apply", sourceEpoch, event, weight, admittedAt })
      }
      return true
    }

    const actor: PoolActor = {
      identity,
      admitEvent: (sourceEpoch, event) =>
        Effect.suspend(() => {
          const weight = weightOf(eventPayloadWeight(event))
          return enqueueNow(
            { _tag: "Apply", sourceEpoch, event, weight, admittedAt: clock.unsafeCurrentTimeMillis() },
            weight
          )
        }),
      admitEventsNow,
      replaceRanks: (replacements) =>
        span(
          "replaceRanks",
          Effect.suspend(() => {
            let blocks = 0
            for (const r of replacements) for (const e of r.events) blocks += eventPayloadWeight(e)
            const weight = weightOf(blocks)
            return submit<void>((reply) => ({ _tag: "ReplaceRanks", replacements, weight, reply }), weight)
          })
        ),
      replaceRank: (sourceEpoch, workerId, dpRank, events) =>
        actor.replaceRanks([{ sourceEpoch, workerId, dpRank, events }]),
      markHistoryPartial: (sourceEpoch, workerId, dpRank) =>
        enqueueNow({ _tag: "MarkPartial", sourceEpoch, workerId, dpRank }, 0),
      resetRank: (sourceEpoch, workerId, dpRank, degraded) =>
        span(
          "resetRank",
          submit<void>((reply) => ({ _tag: "ResetRank", sourceEpoch, workerId, dpRank, degraded, reply }))
        ),
      flush: span(
        "flush",
        submit<void>((reply) => ({ _tag: "Flush", reply }))
      ),
      snapshot: span(
        "snapshot",
        submit<ActorSnapshot>((reply) => ({ _tag: "Snapshot", reply }))
      ),
      stateStats: span(
        "stateStats",
        submit<ActorStats>((reply) => ({ _tag: "Stats", reply }))
      ),
      subscribe: (lease) =>
        span(
          "subscribe",
          submit<ActorSubscription>((reply) => ({ _tag: "Subscribe", lease, reply }))
        ),
      memberCounts: span(
        "memberCounts",
        submit<ReadonlyArray<MemberCount>>((reply) => ({ _tag: "Members", reply }))
      ),
      retirePublicationLease: span(
        "retirePublicationLease",
        submit<void>((reply) => ({ _tag: "RetireLease", reply }))
      ),
      shutdown: span(
        "shutdown",
        submit<void>((reply) => ({ _tag: "Shutdown", reply }))
      ),
      fence: span(
        "fence",
        Effect.suspend(() => {
          accepting = false
          fenced = true
          Deferred.unsafeDone(fenceSignal, Exit.void)
          // Drops the queued commands (their replies fail with ActorStopped) and wakes a
          // consumer waiting for one.
          return Effect.zipRight(mailbox.shutdown, Deferred.await(stopped))
        })
      ),
      faults,
      mailboxDepth: Effect.sync(() =>
        Option.match(mailbox.unsafeSize(), {
          onNone: () => 0,
          // Commands of the consumer's current batch still count: they are not processed yet.
          onSome: (size) => Math.min(size + inFlight, mailboxCapacity)
        })
      ),
      mailboxCapacity,
      canonical: state instanceof CanonicalCkfState,
      awaitStopped: Deferred.await(stopped),
      diagnostics: Effect.sync(() => ({ ...diag, publishDelay: publishDelay.snapshot() })),
      pause: Effect.gen(function* () {
        const release = yield* Deferred.make<void>()
        yield* submit<void>((entered) => ({ _tag: "Pause", entered, release }))
        return Deferred.succeed(release, undefined).pipe(Effect.asVoid)
      })
    }

    // Closing the scope fences: registered after the fork, so it runs before the fiber is
    // interrupted and the consumer exits through its own path.
    yield* Effect.addFinalizer(() => actor.fence)
    return actor
  })
