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

import { Effect, Exit, Fiber, Option, Queue } from "effect"
import type { CkfFailureAction } from "../ckf/failure.js"
import type { PoolId } from "../ckf/identity.js"
import type { ActorFault } from "./PoolActor.js"
import { DEFAULT_FAULT_CAPACITY } from "./PoolActor.js"

export const MAX_PENDING_SOURCE_FAULTS = DEFAULT_FAULT_CAPACITY

export type ProducerFenceTrigger =
  | { readonly _tag: "Fault"; readonly fault: ActorFault }
  | { readonly _tag: "PendingOverflow"; readonly fault: ActorFault }

export type PendingActorAction =
  | { readonly _tag: "Fault"; readonly fault: ActorFault }
  | { readonly _tag: "ProducerFence"; readonly trigger: ProducerFenceTrigger }

const sourceKey = (fault: ActorFault): string => `${fault.workerId}/${fault.dpRank}`

/** Only `RejectSource` replaces a pending `ReportResourceFailure` of the same epoch. */
const isStrongerSourceFault = (candidate: CkfFailureAction, current: CkfFailureAction): boolean =>
  current === "ReportResourceFailure" && candidate === "RejectSource"

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

/** Moves every fault already queued into `pending` without waiting (the seed's `drain_ready`). */
export const drainReadyFaults = (
  faults: Queue.Dequeue<ActorFault>,
  pending: PendingActorFaults
): Effect.Effect<void> =>
  Effect.gen(function* () {
    while (!pending.hasProducerFence()) {
      const fault = yield* Queue.poll(faults)
      if (Option.isNone(fault)) return
      pending.push(fault.value)
    }
  })

export type FaultCollection<A> =
  | { readonly _tag: "Completed"; readonly value: A }
  /** The effect was interrupted; the caller must retire the producer generation. */
  | { readonly _tag: "ProducerFence"; readonly trigger: ProducerFenceTrigger }

type NextFault =
  | { readonly _tag: "Fault"; readonly fault: ActorFault }
  | { readonly _tag: "Done"; readonly late: ActorFault | undefined }

/**
 * Waits for one fault or for `fiber` to finish, whichever comes first. A fault that reached the
 * taker in the same instant the fiber finished is kept when the interrupted take reports it.
 *
 * Residual window: Effect may interrupt a take whose item was handed over but not yet resumed;
 * that fault is then lost (tokio's `recv` is cancel-safe). It needs a fault and the effect's
 * completion in the same scheduler tick, and affects only the fault raced against completion.
 */
const nextFaultOrDone = <A, E>(
  faults: Queue.Dequeue<ActorFault>,
  fiber: Fiber.Fiber<A, E>
): Effect.Effect<NextFault> =>
  // Both racers are made interruptible explicitly: retirement runs this inside scope finalizers,
  // which are uninterruptible, and the losing racer must still be interruptible there.
  Effect.raceWith(Effect.interruptible(Fiber.await(fiber)), Effect.interruptible(Queue.take(faults)), {
    onSelfDone: (_, take): Effect.Effect<NextFault> =>
      Effect.map(Fiber.interrupt(take), (exit) => ({
        _tag: "Done",
        late: Exit.isSuccess(exit) ? exit.value : undefined
      })),
    onOtherDone: (exit, waiter): Effect.Effect<NextFault> =>
      Effect.zipRight(
        Fiber.interrupt(waiter),
        Exit.isSuccess(exit)
          ? Effect.succeed<NextFault>({ _tag: "Fault", fault: exit.value })
          : // `take` only fails when the queue is shut down: nothing more will arrive.
            Effect.as(Fiber.await(fiber), { _tag: "Done", late: undefined } as NextFault)
      )
  })

/**
 * Runs `effect` while collecting faults into `pending` (seed `collect_pending_while`). A fault that
 * installs a producer fence interrupts the effect (the source-local recovery is abandoned) and
 * returns `ProducerFence`; otherwise the effect's result is returned once it completes.
 */
export const collectPendingWhile = <A, E, R>(
  faults: Queue.Dequeue<ActorFault>,
  pending: PendingActorFaults,
  effect: Effect.Effect<A, E, R>
): Effect.Effect<FaultCollection<A>, E, R> =>
  Effect.gen(function* () {
    const fiber = yield* Effect.fork(effect)
    for (;;) {
      const next = yield* nextFaultOrDone(faults, fiber).pipe(
        Effect.onInterrupt(() => Fiber.interrupt(fiber))
      )
      if (next._tag === "Done") {
        if (next.late !== undefined) pending.push(next.late)
        const value = yield* Fiber.join(fiber)
        return { _tag: "Completed", value } as const
      }
      pending.push(next.fault)
      const trigger = pending.takeProducerFence()
      if (trigger !== undefined) {
        yield* Fiber.interrupt(fiber)
        return { _tag: "ProducerFence", trigger } as const
      }
    }
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
    const fiber = yield* Effect.fork(effect)
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
    for (;;) {
      const next = yield* nextFaultOrDone(faults, fiber).pipe(
        Effect.onInterrupt(() => Fiber.interrupt(fiber))
      )
      if (next._tag === "Done") {
        if (next.late !== undefined) yield* logFault(next.late)
        return yield* Fiber.join(fiber)
      }
      yield* logFault(next.fault)
    }
  })
