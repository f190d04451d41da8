/**
 * A semaphore that hands released permits to its waiters in arrival order.
 *
 * `Effect.makeSemaphore` resumes every waiter at each release (a waiter takes its permits once it
 * runs, or waits again), so N fibers queued on it cost O(N) wake-ups per release and O(N²) in
 * all: 1,000 fibers through 16 permits took about 4 s, and 4,000 exhausted the heap. A relay
 * that starts under thousands of engine ranks queues one recovery per rank on the recovery
 * permits. Here a release grants the permits to the first waiter whose request fits, and only
 * that waiter is resumed.
 *
 * It is an `Effect.Semaphore`, so it replaces `Effect.makeSemaphore` where one is passed.
 */

import { Effect, type Option } from "effect"

interface Waiter {
  readonly permits: number
  /** Set until the waiter is granted or gives up. */
  resume: ((granted: Effect.Effect<number>) => void) | undefined
  granted: boolean
}

class FifoSemaphore implements Effect.Semaphore {
  private taken = 0
  private readonly waiters: Array<Waiter> = []
  /** Waiters before this index were granted or gave up. */
  private head = 0

  constructor(private permits: number) {}

  private get free(): number {
    return this.permits - this.taken
  }

  private get queued(): boolean {
    return this.head < this.waiters.length
  }

  /** Grants waiters in order while the first one's request fits. */
  private grant(): void {
    while (this.queued) {
      const waiter = this.waiters[this.head]!
      const resume = waiter.resume
      if (resume !== undefined) {
        if (this.free < waiter.permits) break
        this.taken += waiter.permits
        waiter.resume = undefined
        waiter.granted = true
        resume(Effect.succeed(waiter.permits))
      }
      this.head++
    }
    // Drop the settled prefix once it is most of the array (amortized O(1) per waiter).
    if (this.head > 64 && this.head * 2 > this.waiters.length) {
      this.waiters.splice(0, this.head)
      this.head = 0
    }
  }

  readonly take = (permits: number): Effect.Effect<number> =>
    Effect.suspend(() => {
      if (!this.queued && this.free >= permits) {
        this.taken += permits
        return Effect.succeed(permits)
      }
      return Effect.async<number>((resume) => {
        const waiter: Waiter = { permits, resume, granted: false }
        this.waiters.push(waiter)
        return Effect.sync(() => {
          if (waiter.granted) {
            // Interrupted after the grant but before it was delivered: the permits go back.
            waiter.granted = false
            this.taken -= permits
          }
          waiter.resume = undefined
          // A waiter that leaves the head may let the ones behind it through.
          this.grant()
        })
      })
    })

  readonly release = (permits: number): Effect.Effect<number> =>
    Effect.sync(() => {
      this.taken = Math.max(0, this.taken - permits)
      this.grant()
      return this.free
    })

  readonly releaseAll: Effect.Effect<number> = Effect.suspend(() => this.release(this.taken))

  readonly resize = (permits: number): Effect.Effect<void> =>
    Effect.sync(() => {
      this.permits = permits
      this.grant()
    })

  readonly withPermits =
    (permits: number) =>
    <A, E, R>(self: Effect.Effect<A, E, R>): Effect.Effect<A, E, R> =>
      Effect.uninterruptibleMask((restore) =>
        Effect.flatMap(restore(this.take(permits)), (taken) =>
          Effect.ensuring(restore(self), this.release(taken))
        )
      )

  readonly withPermitsIfAvailable =
    (permits: number) =>
    <A, E, R>(self: Effect.Effect<A, E, R>): Effect.Effect<Option.Option<A>, E, R> =>
      Effect.uninterruptibleMask((restore) =>
        Effect.suspend(() => {
          if (this.queued || this.free < permits) return Effect.succeedNone
          this.taken += permits
          return Effect.ensuring(Effect.asSome(restore(self)), this.release(permits))
        })
      )
}

/** A FIFO semaphore with `permits` permits, made outside an effect. */
export const unsafeMakeFifoSemaphore = (permits: number): Effect.Semaphore => new FifoSemaphore(permits)

/** A FIFO semaphore with `permits` permits. */
export const makeFifoSemaphore = (permits: number): Effect.Effect<Effect.Semaphore> =>
  Effect.sync(() => unsafeMakeFifoSemaphore(permits))
