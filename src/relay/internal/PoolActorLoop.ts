/**
 * The pool actor's implementation (seed 002, `kv_dc_relay/actor.rs`): the bounded mailbox, the
 * payload permits, and the one consumer fiber that owns the pool's `DcCkfState` and
 * `DcCkfPublisher` and applies admitted events. The contract is `../PoolActor.ts`; the commands,
 * reply slots and payload permits are `ActorMailbox.ts`.
 *
 * Hot path: `admitEvent` takes payload permits and offers to the mailbox synchronously inside one
 * effect when both have room; the consumer takes commands in batches and applies events without
 * running an effect unless a log or fault follows. Slow paths (backpressure, replies, faults,
 * timer) are ordinary effects. Source epochs follow the seed: a stale epoch is dropped, an epoch
 * that advances without a reset or replacement is a SourceProtocolFailure fault, and reset and
 * replacement reject older epochs and record theirs on success.
 *
 * Length: `make` is one closure over the actor's state, which the apply path reads without an
 * indirection; cutting it up would pass that state around on the hot path.
 */

import { Cause, Chunk, Deferred, Duration, Effect, Exit, FiberHandle, Mailbox, Option, Queue } from "effect"
import { CanonicalCkfState } from "../../ckf/canonical.js"
import { CkfBuildError, eventErrorText, KvCacheEventError } from "../../ckf/errors.js"
import { type CkfMemberRef, compareMembers, memberKey } from "../../ckf/events.js"
import { eventFailurePoint, failureDisposition } from "../../ckf/failure.js"
import { type LaneLease, ProducerIdentity } from "../../ckf/identity.js"
import { DcCkfPublishError, DcCkfPublisher, PublisherSnapshotError } from "../../ckf/publisher.js"
import type { DcCkfPublicationBatch, DcCkfState, MemberCount } from "../../ckf/state.js"
import type { WorkerQueryResult } from "../../ckf/workerQuery.js"
import { PublishDelayHistogram } from "../../observability/PublishDelay.js"
import { type DpRank, eventPayloadWeight, type RouterEvent, type WorkerId } from "../../protocol/Events.js"
import type { SourceEpoch } from "../../recovery/RecoveryTarget.js"
import { type DeltaBroadcastSendError, makeDeltaBroadcast } from "../DeltaBroadcast.js"
import {
  type ActorFault,
  type ActorSnapshot,
  type ActorStats,
  type ActorSubscription,
  type ActorWorkerQuery,
  DEFAULT_FAULT_CAPACITY,
  DEFAULT_MAILBOX_CAPACITY,
  DEFAULT_PENDING_BLOCK_PERMITS,
  DEFAULT_PUBLICATION_CAPACITY,
  DEFAULT_PUBLICATION_DELAY_MS,
  type MakePoolActor,
  type PoolActor,
  type RankReplacement
} from "../PoolActor.js"
import {
  ActorStopped,
  CkfBuildFailed,
  CkfEventFailed,
  InvalidTreeDump,
  type KvDcRelayError,
  PublisherFailed,
  RelayShuttingDown,
  StaleSourceEpoch
} from "../RelayErrors.js"
import {
  COMMAND_KIND,
  COMMANDS_PER_TURN,
  type Command,
  canonicalUnanchored,
  countUnanchored,
  DELTAS_PER_TURN,
  failShuttingDown,
  faultCategory,
  invalidReplacement,
  isPowerOfTwo,
  PayloadPermits,
  positiveInteger,
  type Reply,
  ReplySlot,
  raceInterruptibly,
  replacementHashes,
  TICK
} from "./ActorMailbox.js"

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
    // Consumer fiber: the only code that touches `state`, `publisher` and `sourceEpochs` (a
    // worker query may read `state` on its caller's turn while every command admitted is
    // finished: `queryWorkersNow`).

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
      if (timerArmed && timerDeadline <= now && mailbox.unsafeOffer(TICK)) offered++
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

    /**
     * A worker query, run between two commands: it reads the tables as the events applied so far
     * left them. The members listed are the expected ones and every holder, in (worker id, rank)
     * order; an externally addressed pool (no tiers, no canonical addresses) answers zero depths.
     */
    // The last query's members, reused while the holders and the expected ranks stay the same
    // (the query plan of a members array is cached by the state too).
    let lastHeld: ReadonlyArray<CkfMemberRef> | undefined
    let lastExpected: ReadonlyArray<CkfMemberRef> = []
    let lastMembers: ReadonlyArray<CkfMemberRef> = []
    const sameRanks = (a: ReadonlyArray<CkfMemberRef>, b: ReadonlyArray<CkfMemberRef>): boolean =>
      a === b ||
      (a.length === b.length && a.every((m, i) => m.workerId === b[i]!.workerId && m.dpRank === b[i]!.dpRank))
    const queryWorkers = (query: ActorWorkerQuery): WorkerQueryResult => {
      const held: ReadonlyArray<CkfMemberRef> = state instanceof CanonicalCkfState ? state.heldMembers() : []
      const expected = query.expected ?? []
      let members: ReadonlyArray<CkfMemberRef>
      if (held === lastHeld && sameRanks(expected, lastExpected)) members = lastMembers
      else {
        // Plain references: the holders' entries carry the state's table indices.
        const keys = new Set(held.map((m) => memberKey(m.workerId, m.dpRank)))
        const extra = expected.filter((m) => !keys.has(memberKey(m.workerId, m.dpRank)))
        members = [...held, ...extra]
          .map((m) => ({ workerId: m.workerId, dpRank: m.dpRank }))
          .sort(compareMembers)
      }
      lastHeld = held
      lastExpected = expected
      lastMembers = members
      if (state instanceof CanonicalCkfState)
        return state.queryWorkers(query.hashes, query.count, { members })
      const zeros = new Array<number>(members.length).fill(0)
      return {
        queryBlocks: query.count,
        members,
        device: zeros,
        host: zeros,
        disk: zeros,
        dynamoCpu: zeros,
        dynamoDisk: zeros,
        frequencies: []
      }
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
            partialMembers: state instanceof CanonicalCkfState ? state.partialMembers() : [],
            tierCounts: state instanceof CanonicalCkfState ? state.memberTierCounts() : [],
            tiers: state instanceof CanonicalCkfState ? state.tierStats() : undefined
          })
          return undefined
        case "Query":
          command.reply.succeed(queryWorkers(command.query))
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
    // Commands accepted by the mailbox, and commands the consumer has finished: equal when it has
    // finished every command admitted (`state` is at rest). Both change on the turn of the event
    // itself (an offer, a command's end), never in a fiber's resumption later.
    let offered = 0
    let processed = 0

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
          processed++
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
        if (mailbox.unsafeOffer(command)) {
          offered++
          return Exit.void
        }
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
          accepted
            ? Effect.sync(() => {
                offered++
              })
            : Effect.zipRight(returnPermits, failShuttingDown)
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
      offered++
      for (let i = 1; i < n; i++) {
        event = events[i]!
        weight = weightOf(eventPayloadWeight(event))
        if (mailbox.unsafeOffer({ _tag: "Apply", sourceEpoch, event, weight, admittedAt })) offered++
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
      // One entry per request, each a span around a submit to the mailbox: written out per request
      // so that each keeps its own reply type, which the compiler checks against the message.
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
      queryWorkersNow: (query) => {
        // At rest, the query would be the next command and find `state` as it is now: answering on
        // the caller's turn gives the same answer without the two fiber hand-offs. Anything
        // queued, taken but not finished (a command under way, a pause) or a stopping actor goes
        // through the mailbox, behind it.
        if (offered !== processed || !accepting || fenced) return undefined
        return queryWorkers(query)
      },
      // Queries come at HTTP rates: their span skips the stack trace the others capture.
      queryWorkers: (query) =>
        Effect.withSpan(
          submit<WorkerQueryResult>((reply) => ({ _tag: "Query", query, reply })),
          "PoolActor.queryWorkers",
          { attributes: spanAttributes, captureStackTrace: false }
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
