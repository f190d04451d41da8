/**
 * Permits handed out in arrival order: `FifoPermits` (synchronous try, an effect to wait) and
 * the `Effect.Semaphore` built on it.
 *
 * `Effect.makeSemaphore` resumes every waiter at each release (a waiter takes its permits once it
 * runs, or waits again), so N fibers queued on it cost O(N) wake-ups per release and O(N²) in
 * all: 1,000 fibers through 16 permits took about 4 s, and 4,000 exhausted the heap. A relay
 * that starts under thousands of engine ranks queues one recovery per rank on the recovery
 * permits. Here a release grants the permits to the first waiter whose request fits, and only
 * that waiter is resumed. Like tokio's semaphore it is FIFO-fair: once anyone waits,
 * `tryAcquire` fails for everyone behind it, so a large request is not starved by small ones.
 */

import { Effect, type Option } from "effect"

interface Waiter {
  readonly n: number
  /** Set until the waiter is granted or gives up. */
  wake: (() => void) | undefined
  granted: boolean
}

/** Counting permits, granted in arrival order. */
export class FifoPermits {
  private available: number
  private readonly waiters: Array<Waiter> = []
  /** Waiters before this index were granted or gave up. */
  private head = 0

  constructor(capacity: number) {
    this.available = capacity
  }

  /** Permits free now. */
  get free(): number {
    return this.available
  }

  /** Takes `n` permits now, unless someone waits or too few are free. */
  tryAcquire(n: number): boolean {
    if (this.head !== this.waiters.length || this.available < n) return false
    this.available -= n
    return true
  }

  /** Waits in arrival order; permits granted to a fiber interrupted before it resumed are returned. */
  acquire(n: number): Effect.Effect<void> {
    return Effect.suspend(() => {
      if (this.tryAcquire(n)) return Effect.void
      const waiter: Waiter = { n, wake: undefined, granted: false }
      return Effect.async<void>((resume) => {
        waiter.wake = () => resume(Effect.void)
        this.waiters.push(waiter)
        return Effect.sync(() => {
          waiter.wake = undefined
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

  /** Every current and future request succeeds at once (the payload permits of a stopped actor). */
  open(): void {
    this.available = Number.POSITIVE_INFINITY
    this.pump()
  }

  private pump(): void {
    while (this.head < this.waiters.length) {
      const waiter = this.waiters[this.head]!
      const wake = waiter.wake
      if (wake !== undefined) {
        if (this.available < waiter.n) break
        this.available -= waiter.n
        waiter.wake = undefined
        waiter.granted = true
        wake()
      }
      this.head++
    }
    // Drop the settled prefix once it is most of the array (amortized O(1) per waiter).
    if (this.head > 64 && this.head * 2 > this.waiters.length) {
      this.waiters.splice(0, this.head)
      this.head = 0
    }
  }
}

/** `FifoPermits` as an `Effect.Semaphore`, so it replaces `Effect.makeSemaphore` where one is passed. */
class FifoSemaphore implements Effect.Semaphore {
  private readonly pool: FifoPermits

  constructor(private permits: number) {
    this.pool = new FifoPermits(permits)
  }

  readonly take = (permits: number): Effect.Effect<number> => Effect.as(this.pool.acquire(permits), permits)

  readonly release = (permits: number): Effect.Effect<number> =>
    Effect.sync(() => {
      this.pool.release(permits)
      return this.pool.free
    })

  readonly releaseAll: Effect.Effect<number> = Effect.suspend(() =>
    this.release(this.permits - this.pool.free)
  )

  readonly resize = (permits: number): Effect.Effect<void> =>
    Effect.sync(() => {
      const change = permits - this.permits
      this.permits = permits
      this.pool.release(change)
    })

  readonly withPermits =
    (permits: number) =>
    <A, E, R>(self: Effect.Effect<A, E, R>): Effect.Effect<A, E, R> =>
      Effect.uninterruptibleMask((restore) =>
        Effect.zipRight(
          restore(this.pool.acquire(permits)),
          Effect.ensuring(
            restore(self),
            Effect.sync(() => this.pool.release(permits))
          )
        )
      )

  readonly withPermitsIfAvailable =
    (permits: number) =>
    <A, E, R>(self: Effect.Effect<A, E, R>): Effect.Effect<Option.Option<A>, E, R> =>
      Effect.uninterruptibleMask((restore) =>
        Effect.suspend(() =>
          this.pool.tryAcquire(permits)
            ? Effect.ensuring(
                Effect.asSome(restore(self)),
                Effect.sync(() => this.pool.release(permits))
              )
            : Effect.succeedNone
        )
      )
}

/** A FIFO semaphore with `permits` permits. */
export const makeFifoSemaphore = (permits: number): Effect.Effect<Effect.Semaphore> =>
  Effect.sync(() => new FifoSemaphore(permits))
