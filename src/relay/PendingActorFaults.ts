/**
 * Coalescing of a pool actor's faults while its owner is busy recovering (seed 000,
 * `PendingActorFaults`, `collect_pending_while`; seed 001, `drain_faults_while`).
 *
 * The owner handles one fault at a time; faults arriving meanwhile are coalesced per source:
 * - per (worker, rank) only one fault is kept: a newer source epoch wins, and within an epoch the
 *   stronger action wins (`RejectSource` over `ReportResourceFailure`);
 * - more than 16 distinct pending sources cannot be tracked safely: the next new source installs
 *   one producer fence (`PendingOverflow`) instead;
 * - a producer-invariant fault installs a producer fence that supersedes everything pending, and
 *   once a fence is pending every later fault is moot (the generation is rebuilt);
 * - capacity omissions are never faults.
 */

import { Effect, Fiber, Option, Queue } from "effect"
import type { CkfFailureAction } from "../ckf/failure.js"
import type { PoolId } from "../ckf/identity.js"
import { handBackWake, makeWaiter, queuedNow } from "./internal/FaultWaiter.js"
import type { ActorFault } from "./PoolActor.js"
import { DEFAULT_FAULT_CAPACITY } from "./PoolActor.js"

/** Source faults held while a supervisor call runs, at most. */
export const MAX_PENDING_SOURCE_FAULTS = DEFAULT_FAULT_CAPACITY

type ProducerFenceTrigger =
  | { readonly _tag: "Fault"; readonly fault: ActorFault }
  | { readonly _tag: "PendingOverflow"; readonly fault: ActorFault }

/** What a pending fault asks of the endpoint slot: handle one fault, or fence the producer. */
export type PendingActorAction =
  | { readonly _tag: "Fault"; readonly fault: ActorFault }
  | { readonly _tag: "ProducerFence"; readonly trigger: ProducerFenceTrigger }

const sourceKey = (fault: ActorFault): string => `${fault.workerId}/${fault.dpRank}`

/** Only `RejectSource` replaces a pending `ReportResourceFailure` of the same epoch. */
const isStrongerSourceFault = (candidate: CkfFailureAction, current: CkfFailureAction): boolean =>
  current === "ReportResourceFailure" && candidate === "RejectSource"

/** Actor faults that arrived while the endpoint slot was busy, kept in order for it to handle. */
export class PendingActorFaults {
  private producerFence: ProducerFenceTrigger | undefined = undefined
  // Insertion order is the order sources first faulted: `Map` iteration keeps it.
  private readonly sourceFaults = new Map<string, ActorFault>()

  push(fault: ActorFault): void {
    if (this.producerFence !== undefined) return
    switch (fault.disposition.action) {
      case "ContinueCapacityOmission":
        return
      case "ReportResourceFailure":
      case "RejectSource":
        this.pushSourceFault(fault)
        return
      case "FenceAndRebuildProducer":
        this.installProducerFence({ _tag: "Fault", fault })
        return
      case "DeactivateAndSnapshot":
      case "RetrySnapshot":
        // The seed treats these as unreachable (a consumer-lane disposition cannot come from a
        // relay actor). Fencing the producer is the fail-safe reading of an impossible fault.
        this.installProducerFence({ _tag: "Fault", fault })
        return
    }
  }

  private pushSourceFault(fault: ActorFault): void {
    const key = sourceKey(fault)
    const current = this.sourceFaults.get(key)
    if (current !== undefined) {
      if (
        fault.sourceEpoch > current.sourceEpoch ||
        (fault.sourceEpoch === current.sourceEpoch &&
          isStrongerSourceFault(fault.disposition.action, current.disposition.action))
      ) {
        // Replacing keeps the source's original position in the queue.
        this.sourceFaults.set(key, fault)
      }
      return
    }
    if (this.sourceFaults.size >= MAX_PENDING_SOURCE_FAULTS) {
      this.installProducerFence({ _tag: "PendingOverflow", fault })
      return
    }
    this.sourceFaults.set(key, fault)
  }

  private installProducerFence(trigger: ProducerFenceTrigger): void {
    this.sourceFaults.clear()
    this.producerFence = trigger
  }

  /** The next action: a pending producer fence first, then source faults in first-fault order. */
  popFront(): PendingActorAction | undefined {
    const trigger = this.producerFence
    if (trigger !== undefined) {
      this.producerFence = undefined
      return { _tag: "ProducerFence", trigger }
    }
    for (const [key, fault] of this.sourceFaults) {
      this.sourceFaults.delete(key)
      return { _tag: "Fault", fault }
    }
    return undefined
  }

  takeProducerFence(): ProducerFenceTrigger | undefined {
    const trigger = this.producerFence
    this.producerFence = undefined
    return trigger
  }

  hasProducerFence(): boolean {
    return this.producerFence !== undefined
  }

  clear(): void {
    this.producerFence = undefined
    this.sourceFaults.clear()
  }

  /** Pending actions: a producer fence counts as one. */
  get size(): number {
    return (this.producerFence === undefined ? 0 : 1) + this.sourceFaults.size
  }
}

// ---------------------------------------------------------------------------------------------
// Waiting for a fault or for the guarded effect, without ever losing a fault (internal/FaultWaiter)

/** Moves every fault already queued into `pending` without waiting (the seed's `drain_ready`). */
export const drainReadyFaults = (
  faults: Queue.Dequeue<ActorFault>,
  pending: PendingActorFaults
): Effect.Effect<void> =>
  Effect.gen(function* () {
    // Bounded by what is queued now, so a wake-up handed back to the queue is not polled again.
    let budget = queuedNow(faults)
    while (!pending.hasProducerFence() && budget-- > 0) {
      const fault = yield* Queue.poll(faults)
      if (Option.isNone(fault)) return
      if (!handBackWake(fault.value)) pending.push(fault.value)
    }
  })

type FaultCollection<A> =
  | { readonly _tag: "Completed"; readonly value: A }
  /** The effect was interrupted; the caller must retire the producer generation. */
  | { readonly _tag: "ProducerFence"; readonly trigger: ProducerFenceTrigger }

/**
 * Runs `effect` while collecting faults into `pending` (seed `collect_pending_while`). A fault that
 * installs a producer fence interrupts the effect (the source-local recovery is abandoned) and
 * returns `ProducerFence`; otherwise the effect's result is returned once it completes. Faults
 * still queued then stay queued (the caller's `drainReadyFaults` takes them).
 */
export const collectPendingWhile = <A, E, R>(
  faults: Queue.Dequeue<ActorFault>,
  pending: PendingActorFaults,
  effect: Effect.Effect<A, E, R>
): Effect.Effect<FaultCollection<A>, E, R> =>
  Effect.gen(function* () {
    const waiter = makeWaiter(faults)
    if (waiter === undefined) return { _tag: "Completed", value: yield* effect } as const
    const keep = (fault: ActorFault) => pending.push(fault)
    const fiber = yield* Effect.fork(
      Effect.ensuring(
        effect,
        Effect.sync(() => waiter.finished())
      )
    )
    const collect = Effect.gen(function* () {
      for (;;) {
        const fault = yield* waiter.next()
        if (fault === undefined) {
          yield* waiter.close(keep)
          const value = yield* Fiber.join(fiber)
          return { _tag: "Completed", value } as const
        }
        pending.push(fault)
        if (pending.hasProducerFence()) {
          yield* Fiber.interrupt(fiber)
          // With the fence pending, whatever `close` moves is moot (`push` ignores it).
          yield* waiter.close(keep)
          const trigger = pending.takeProducerFence()!
          return { _tag: "ProducerFence", trigger } as const
        }
      }
    })
    return yield* collect.pipe(
      Effect.onInterrupt(() => Effect.zipRight(Fiber.interrupt(fiber), waiter.close(keep)))
    )
  })

/**
 * Runs `effect` while logging and dropping the actor's faults (seed `drain_faults_while`): used
 * while a pool generation retires, so a full fault queue cannot block the actor's teardown.
 */
export const drainFaultsWhile = <A, E, R>(
  poolId: PoolId,
  faults: Queue.Dequeue<ActorFault>,
  effect: Effect.Effect<A, E, R>
): Effect.Effect<A, E, R> =>
  Effect.gen(function* () {
    const waiter = makeWaiter(faults)
    if (waiter === undefined) return yield* effect
    const logFault = (fault: ActorFault) =>
      Effect.logDebug("Draining KV DC Relay actor fault while retiring its pool").pipe(
        Effect.annotateLogs({
          poolId: String(poolId),
          workerId: fault.workerId,
          dpRank: fault.dpRank,
          category: fault.category,
          error: fault.message
        })
      )
    const closeAndLog = Effect.suspend(() => {
      const left: Array<ActorFault> = []
      return waiter
        .close((fault) => left.push(fault))
        .pipe(Effect.zipRight(Effect.forEach(left, logFault, { discard: true })))
    })
    const fiber = yield* Effect.fork(
      Effect.ensuring(
        effect,
        Effect.sync(() => waiter.finished())
      )
    )
    const drain = Effect.gen(function* () {
      for (let fault = yield* waiter.next(); fault !== undefined; fault = yield* waiter.next()) {
        yield* logFault(fault)
      }
      yield* closeAndLog
      return yield* Fiber.join(fiber)
    })
    return yield* drain.pipe(Effect.onInterrupt(() => Effect.zipRight(Fiber.interrupt(fiber), closeAndLog)))
  })

const faultLogFields = (fault: ActorFault) => ({
  workerId: fault.workerId,
  dpRank: fault.dpRank,
  sourceEpoch: fault.sourceEpoch,
  eventId: fault.eventId ?? "none",
  category: fault.category,
  action: fault.disposition.action,
  error: fault.message
})

/** Logs an actor fault with its rank and disposition. */
export const reportActorFault = (fault: ActorFault) =>
  Effect.logError("KV DC Relay actor failed an admitted mutation").pipe(
    Effect.annotateLogs(faultLogFields(fault))
  )

/** Logs why the producer generation is being fenced. */
export const reportProducerFenceTrigger = (trigger: ProducerFenceTrigger) =>
  trigger._tag === "Fault"
    ? reportActorFault(trigger.fault)
    : Effect.logError("KV DC Relay pending source faults exceeded their bound; fencing producer").pipe(
        Effect.annotateLogs(faultLogFields(trigger.fault))
      )
