/**
 * The delta fan-out of one pool actor: the replacement of the seed's tokio `broadcast` channel
 * behind `DeltaReceiver`.
 *
 * - The sender never blocks and never waits for a receiver: the actor must not stall behind a slow
 *   consumer.
 * - Each receiver has its own bounded buffer. A receiver whose buffer would overflow is marked
 *   lagged, its buffer is dropped and it receives nothing more. Its `take` fails
 *   `DeltaStreamLagged` immediately, even though older deltas were buffered: after a gap the
 *   stream is useless to an exact consumer (it must install a fresh snapshot), so handing out the
 *   stale prefix would only delay that recovery and keep the memory alive longer.
 * - Closing the sender gracefully (actor shutdown) lets every receiver drain what it already has,
 *   then fail `DeltaStreamClosed`. Closing it for a fence discards buffered deltas at once: a
 *   fenced producer's tail is uncertain and must not be applied.
 * - Unlike tokio's `Sender::send`, a delta sent while no receiver is attached is delivered to
 *   nobody rather than refused (docs/decisions.md): with no subscriber there is no stream to break,
 *   and the next subscriber starts from a snapshot. A lagged receiver stays attached until its
 *   owner closes it (tokio counts a receiver until it is dropped).
 *
 * Waiting `take`s are woken, not handed a delta: the woken fiber pulls from the buffer itself, so
 * interrupting a `take` can never lose a delta.
 */

import { Effect, Option } from "effect"
import type { DcCkfDelta, DcCkfDeltaSink } from "../ckf/publisher.js"

const DEFAULT_DELTA_RECEIVER_CAPACITY = 64

type DeltaBroadcastCloseMode = "drain" | "discard"

/** This receiver fell behind the bounded delta buffer; it was closed and needs a fresh snapshot. */
export interface DeltaStreamLagged {
  readonly _tag: "DeltaStreamLagged"
}
/** The actor stopped (shutdown or fence) or the receiver was closed. */
export interface DeltaStreamClosed {
  readonly _tag: "DeltaStreamClosed"
}

/** Deltas for one subscriber: starts exactly after the snapshot it was created with. */
export interface DeltaReceiver {
  /** The next delta, waiting for one. */
  readonly take: Effect.Effect<DcCkfDelta, DeltaStreamLagged | DeltaStreamClosed>
  /** The next delta if one is queued (`try_recv`). */
  readonly poll: Effect.Effect<Option.Option<DcCkfDelta>, DeltaStreamLagged | DeltaStreamClosed>
  /** Stop receiving; frees the receiver's buffer. */
  readonly close: Effect.Effect<void>
}

/** Why an enqueue was refused: the publisher fences the lease (`DeliveryUncertain`). */
export type DeltaBroadcastSendError = "no delta receivers attached"

interface DeltaBroadcast {
  /** The publisher's sink. Synchronous and non-blocking. */
  readonly sink: DcCkfDeltaSink<DeltaBroadcastSendError>
  /** A receiver that gets every delta sent after this call (synchronous, for the actor's barrier). */
  readonly subscribe: () => DeltaReceiver
  /** Stop sending; `drain` lets receivers consume what they buffered, `discard` drops it. */
  readonly close: (mode: DeltaBroadcastCloseMode) => void
  /** Receivers attached (not yet closed by their owner or by the sender). */
  readonly receiverCount: () => number
  readonly isClosed: () => boolean
}

const LAGGED: DeltaStreamLagged = Object.freeze({ _tag: "DeltaStreamLagged" })
const CLOSED: DeltaStreamClosed = Object.freeze({ _tag: "DeltaStreamClosed" })
const failLagged = Effect.fail(LAGGED)
const failClosed = Effect.fail(CLOSED)

type ReceiverStatus = "open" | "lagged" | "closed"

class Receiver implements DeltaReceiver {
  // Ring buffer of `capacity` slots.
  private readonly ring: Array<DcCkfDelta | undefined>
  private head = 0
  private count = 0
  status: ReceiverStatus = "open"
  /** Still counted by the sender (tokio: until the receiver is dropped). */
  attached = true
  private waiters: Array<() => void> = []

  readonly take: Effect.Effect<DcCkfDelta, DeltaStreamLagged | DeltaStreamClosed>
  readonly poll: Effect.Effect<Option.Option<DcCkfDelta>, DeltaStreamLagged | DeltaStreamClosed>
  readonly close: Effect.Effect<void>

  constructor(
    private readonly capacity: number,
    private readonly owner: Broadcast
  ) {
    this.ring = new Array(capacity)
    const take: Effect.Effect<DcCkfDelta, DeltaStreamLagged | DeltaStreamClosed> = Effect.suspend(() => {
      if (this.count > 0) return Effect.succeed(this.shift())
      if (this.status === "lagged") return failLagged
      if (this.status === "closed") return failClosed
      return Effect.async<DcCkfDelta, DeltaStreamLagged | DeltaStreamClosed>((resume) => {
        const waiter = () => resume(take)
        this.waiters.push(waiter)
        return Effect.sync(() => {
          const i = this.waiters.indexOf(waiter)
          if (i >= 0) this.waiters.splice(i, 1)
        })
      })
    })
    this.take = take
    this.poll = Effect.suspend(
      (): Effect.Effect<Option.Option<DcCkfDelta>, DeltaStreamLagged | DeltaStreamClosed> => {
        if (this.count > 0) return Effect.succeed(Option.some(this.shift()))
        if (this.status === "lagged") return failLagged
        if (this.status === "closed") return failClosed
        return Effect.succeed(Option.none())
      }
    )
    this.close = Effect.sync(() => {
      this.owner.detach(this)
      this.finish("closed", true)
    })
  }

  private shift(): DcCkfDelta {
    const delta = this.ring[this.head]!
    this.ring[this.head] = undefined
    this.head = (this.head + 1) % this.capacity
    this.count--
    return delta
  }

  /** Called by the sender; returns false when this receiver just lagged out. */
  push(delta: DcCkfDelta): boolean {
    if (this.count === this.capacity) {
      this.finish("lagged", true)
      return false
    }
    this.ring[(this.head + this.count) % this.capacity] = delta
    this.count++
    this.wake()
    return true
  }

  /** Terminal transition; `dropBuffer` discards what was buffered. A lagged receiver stays lagged. */
  finish(status: "lagged" | "closed", dropBuffer: boolean): void {
    if (this.status === "open" || status === "lagged") this.status = status
    if (dropBuffer) {
      this.ring.fill(undefined)
      this.head = 0
      this.count = 0
    }
    this.wake()
  }

  private wake(): void {
    if (this.waiters.length === 0) return
    const waiters = this.waiters
    this.waiters = []
    for (const waiter of waiters) waiter()
  }
}

class Broadcast implements DeltaBroadcast {
  private readonly receivers = new Set<Receiver>()
  private attachedCount = 0
  private closed = false
  readonly sink: DcCkfDeltaSink<DeltaBroadcastSendError>

  constructor(private readonly capacity: number) {
    this.sink = {
      enqueue: (delta) => {
        // With no receiver attached, nobody holds state that this delta could leave uncertain:
        // the next subscriber starts from a barrier snapshot that already contains it. Refusing
        // (tokio's behaviour) would fence the publisher, and every later barrier command (a rank
        // reset while the hub resubscribes, or during retirement) would then fail for nothing.
        if (this.attachedCount === 0) return undefined
        for (const receiver of this.receivers) {
          if (!receiver.push(delta)) this.receivers.delete(receiver)
        }
        return undefined
      }
    }
  }

  readonly subscribe = (): DeltaReceiver => {
    const receiver = new Receiver(this.capacity, this)
    if (this.closed) {
      receiver.attached = false
      receiver.finish("closed", true)
      return receiver
    }
    this.receivers.add(receiver)
    this.attachedCount++
    return receiver
  }

  readonly close = (mode: DeltaBroadcastCloseMode): void => {
    if (this.closed) return
    this.closed = true
    for (const receiver of this.receivers) receiver.finish("closed", mode === "discard")
    this.receivers.clear()
    this.attachedCount = 0
  }

  readonly receiverCount = (): number => this.attachedCount

  readonly isClosed = (): boolean => this.closed

  detach(receiver: Receiver): void {
    this.receivers.delete(receiver)
    if (receiver.attached) {
      receiver.attached = false
      if (!this.closed) this.attachedCount--
    }
  }
}

/** A delta fan-out whose receivers each hold up to `capacity` deltas. */
export const makeDeltaBroadcast = (capacity: number = DEFAULT_DELTA_RECEIVER_CAPACITY): DeltaBroadcast => {
  if (!Number.isInteger(capacity) || capacity <= 0) {
    throw new RangeError(`delta receiver capacity must be a positive integer, got ${capacity}`)
  }
  return new Broadcast(capacity)
}
