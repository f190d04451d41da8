import { Effect } from "effect"

/**
 * The seed's async slot mutex (tokio's `Mutex`: FIFO, held across awaits).
 *
 * Not `Effect.makeSemaphore(1)`: every live batch takes its slot's lock, and Effect's semaphore
 * always goes through an async registration (its uncontended take plus release costs several
 * times a whole admission). Here an uncontended acquisition is a synchronous flag flip; a release
 * hands the lock straight to the first waiter, so nobody can barge in between.
 */
export class SlotLock {
  private held = false
  private readonly waiters: Array<() => void> = []
  private readonly unlock = Effect.sync(() => this.release())

  /**
   * Nobody holds or waits for the lock. Synchronous code may then act as if it held it, since
   * nothing can interleave with it, as long as it neither yields nor leaves work for later.
   */
  get free(): boolean {
    return !this.held
  }

  /** Runs `effect` holding the lock; interruption while waiting or holding never leaks it. */
  withLock<A, E, R>(effect: Effect.Effect<A, E, R>): Effect.Effect<A, E, R> {
    return Effect.uninterruptibleMask((restore) => {
      if (!this.held) {
        this.held = true
        return Effect.ensuring(restore(effect), this.unlock)
      }
      // The wait is interruptible, as the semaphore's take was.
      return Effect.zipRight(restore(this.acquireSlow()), Effect.ensuring(restore(effect), this.unlock))
    })
  }

  private acquireSlow(): Effect.Effect<void> {
    return Effect.suspend(() => {
      // Released meanwhile (waiters are woken by hand-over only, so none can be waiting).
      if (!this.held) {
        this.held = true
        return Effect.void
      }
      const waiter = { granted: false, wake: (): void => undefined }
      return Effect.async<void>((resume) => {
        waiter.wake = () => {
          waiter.granted = true
          resume(Effect.void)
        }
        this.waiters.push(waiter.wake)
        return Effect.sync(() => {
          const i = this.waiters.indexOf(waiter.wake)
          if (i >= 0) this.waiters.splice(i, 1)
        })
        // Handed the lock but interrupted before resuming: pass it on.
      }).pipe(Effect.onInterrupt(() => Effect.sync(() => waiter.granted && this.release())))
    })
  }

  private release(): void {
    const next = this.waiters.shift()
    if (next === undefined) this.held = false
    else next()
  }
}
