/**
 * Waiting on a pool actor's fault queue beside another effect without ever losing a fault. Two
 * readers need it: `PendingActorFaults` (collecting faults while a recovery runs) and
 * `EndpointSlot` (its loop's next input: a fault, or a stop / wake / pool cancel).
 *
 * Effect's `Queue.take` is not cancel-safe the way tokio's `recv` is: an offer hands its item to
 * a waiting taker's Deferred at once, and a taker interrupted before it resumes drops that item.
 * A fault offered in the same scheduler turn that the other effect ended was lost that way when
 * the two were raced. So no take here is ever raced: the waiter parks in `Queue.take` itself,
 * and the other effect's end wakes it by offering a wake-up to the same queue.
 *
 * The wake-up is an `ActorFault` with the capacity-omission disposition, on which no reader acts
 * (`PendingActorFaults.push` drops it), so the queue keeps its element type; the waiter removes
 * its own wake-up before it returns. Another reader of the same queue that meets a wake-up (a
 * retirement drain running beside a collector) hands it back to its waiter (`handBackWake`).
 */

import { Effect, Exit, Fiber, Option, Queue } from "effect"
import { failureDisposition } from "../../ckf/failure.js"
import type { ActorFault } from "../PoolActor.js"

const WAKE_DISPOSITION = failureDisposition("BoundedRelocationFailure")

/** Every wake-up object, with the waiter that offered it. */
const wakeOwners = new WeakMap<ActorFault, FaultWaiter>()

type WakeableFaults = Queue.Dequeue<ActorFault> & Queue.Enqueue<unknown>

class FaultWaiter {
  /** In `Queue.take`, or about to enter it: the end of the other effect must wake it. */
  private parked = false
  /** The wake-up is in the queue (or on its way to a taker) and not yet taken back. */
  private wakeQueued = false
  /** The other effect ended. */
  private done = false
  private shutDown = false
  private readonly wake: ActorFault

  constructor(private readonly faults: WakeableFaults) {
    this.wake = {
      workerId: "",
      dpRank: 0,
      sourceEpoch: 0,
      eventId: undefined,
      category: "Resource",
      disposition: WAKE_DISPOSITION,
      message: "wake-up of a pending-fault collector (never a fault)"
    }
    wakeOwners.set(this.wake, this)
  }

  /** Runs in the other effect's fiber as it ends (success, failure or interruption). */
  finished(): void {
    this.done = true
    if (this.parked) this.offerWake()
  }

  /** Another reader took this waiter's wake-up. */
  handBack(): void {
    this.wakeQueued = false
    if (this.parked) this.offerWake()
  }

  /** The last `next` returned `undefined` because the queue was shut down, not because the other effect ended. */
  get queueShutDown(): boolean {
    return this.shutDown
  }

  private offerWake(): void {
    // A full queue needs no wake-up: the parked take returns one of its faults, and the
    // waiter sees `done` before it parks again.
    this.wakeQueued = Queue.unsafeOffer(this.faults, this.wake)
  }

  /** The next fault, or `undefined` once the other effect ended or the queue was shut down. */
  next(): Effect.Effect<ActorFault | undefined> {
    return Effect.gen(this, function* () {
      for (;;) {
        if (this.done) return undefined
        this.parked = true
        const taken = yield* Effect.exit(Queue.take(this.faults)).pipe(
          Effect.ensuring(
            Effect.sync(() => {
              this.parked = false
            })
          )
        )
        // A take on a shut-down queue interrupts itself: nothing more will arrive.
        if (Exit.isFailure(taken)) {
          this.shutDown = true
          return undefined
        }
        const item = taken.value
        const owner = wakeOwners.get(item)
        if (owner === undefined) return item
        if (owner === this) this.wakeQueued = false
        else owner.handBack()
      }
    })
  }

  /**
   * Takes back a wake-up still in the queue. The faults queued ahead of it go to `keep`; the
   * ones behind it stay queued, as they would have without the wake-up.
   */
  close(keep: (fault: ActorFault) => void): Effect.Effect<void> {
    return Effect.gen(this, function* () {
      this.parked = false
      // Our wake-up, if queued, is among the items queued now; a handed-back one goes to the back.
      let budget = queuedNow(this.faults)
      while (this.wakeQueued && budget-- > 0) {
        const polled = yield* Queue.poll(this.faults)
        if (Option.isNone(polled)) break
        const owner = wakeOwners.get(polled.value)
        if (owner === undefined) keep(polled.value)
        else if (owner === this) this.wakeQueued = false
        else owner.handBack()
      }
      // Not found: another reader holds it and hands it back to a waiter that no longer waits.
      this.wakeQueued = false
    })
  }
}

/** Items queued now; 0 once the queue is shut down (its `size` and `poll` would interrupt). */
export const queuedNow = (faults: Queue.Dequeue<ActorFault>): number =>
  Math.max(
    0,
    Option.getOrElse(faults.unsafeSize(), () => 0)
  )

/** `undefined` for a queue nobody can offer to (no such queue exists; the caller then just waits). */
export const makeWaiter = (faults: Queue.Dequeue<ActorFault>): FaultWaiter | undefined =>
  Queue.isEnqueue(faults) ? new FaultWaiter(faults) : undefined

/** For a reader that is not a waiter: true when `item` is a wake-up (now handed back to its waiter). */
export const handBackWake = (item: ActorFault): boolean => {
  const owner = wakeOwners.get(item)
  if (owner === undefined) return false
  owner.handBack()
  return true
}

type FaultRace<A> =
  | { readonly _tag: "Fault"; readonly fault: ActorFault }
  | { readonly _tag: "Done"; readonly value: A }
  | { readonly _tag: "ShutDown" }

const SHUT_DOWN: FaultRace<never> = { _tag: "ShutDown" }

/**
 * The first of the next fault and `effect`'s end, taking a fault off the queue only when it is the
 * one returned. A fault wins a tie and `effect` is then interrupted, its result dropped: use it
 * only for inputs the caller reads again (level-triggered). Faults the waiter finds queued ahead
 * of its wake-up when `effect` wins go to `keep`. A shut-down queue interrupts `effect`.
 */
export const raceNextFault = <A, E, R>(
  faults: Queue.Dequeue<ActorFault>,
  effect: Effect.Effect<A, E, R>,
  keep: (fault: ActorFault) => void
): Effect.Effect<FaultRace<A>, E, R> =>
  Effect.gen(function* () {
    const waiter = makeWaiter(faults)
    if (waiter === undefined) return { _tag: "Done", value: yield* effect } as const
    // The loser of a race is interrupted, so it must be interruptible even if the caller is not.
    const fiber = yield* Effect.fork(
      Effect.ensuring(
        Effect.interruptible(effect),
        Effect.sync(() => waiter.finished())
      )
    )
    const wait = Effect.gen(function* () {
      const fault = yield* waiter.next()
      if (fault === undefined) {
        yield* waiter.close(keep)
        if (waiter.queueShutDown) {
          yield* Fiber.interrupt(fiber)
          return SHUT_DOWN
        }
        return { _tag: "Done", value: yield* Fiber.join(fiber) } as const
      }
      yield* Fiber.interrupt(fiber)
      yield* waiter.close(keep)
      return { _tag: "Fault", fault } as const
    })
    return yield* wait.pipe(
      Effect.onInterrupt(() => Effect.zipRight(Fiber.interrupt(fiber), waiter.close(keep)))
    )
  })
