/**
 * The relay's synchronisation primitives. JavaScript runs one fiber at a time, so each is plain
 * state changed in synchronous blocks; every wait goes through an `Effect.async` (or a latch)
 * whose registration re-checks a version, so no wake-up is lost between a check and the wait.
 */

import { Deferred, Effect, Either, Exit, Fiber, FiberId, Option } from "effect"
import { EncodingPermitsClosed } from "../RelayErrors.js"

// ---------------------------------------------------------------------------------------------
// Small synchronization primitives

/** A change counter with waiters; `changedSince` registers and re-checks in one synchronous step. */
export class Notify {
  private version = 0
  private readonly waiters = new Set<() => void>()

  get current(): number {
    return this.version
  }

  notify(): void {
    this.version++
    if (this.waiters.size === 0) return
    const waiters = Array.from(this.waiters)
    this.waiters.clear()
    for (const wake of waiters) wake()
  }

  changedSince(version: number): Effect.Effect<void> {
    return Effect.async<void>((resume) => {
      if (this.version !== version) {
        resume(Effect.void)
        return
      }
      const wake = () => resume(Effect.void)
      this.waiters.add(wake)
      return Effect.sync(() => {
        this.waiters.delete(wake)
      })
    })
  }
}

/** Read side of a generation's cancellation (a child token in the seed: it cannot cancel). */
export interface GenerationSignal {
  readonly isCancelled: boolean
  readonly await: Effect.Effect<void>
}

/** Cancellation of one pool generation; cancelled by withdraw, fence, remove and shutdown. */
export class GenerationToken implements GenerationSignal {
  private cancelled = false
  private readonly done = Deferred.unsafeMake<void>(FiberId.none)

  get isCancelled(): boolean {
    return this.cancelled
  }

  get await(): Effect.Effect<void> {
    return Deferred.await(this.done)
  }

  cancel(): void {
    if (this.cancelled) return
    this.cancelled = true
    Deferred.unsafeDone(this.done, Exit.void)
  }

  get signal(): GenerationSignal {
    const token = this
    return {
      get isCancelled() {
        return token.isCancelled
      },
      await: token.await
    }
  }
}

/** One permit whose ownership can move between fibers (the seed's `OwnedSemaphorePermit`). */
export class OwnedPermit {
  private held = true
  constructor(private readonly pool: OwnedPermits) {}

  /** Idempotent. */
  release(): void {
    if (!this.held) return
    this.held = false
    this.pool.giveBack()
  }
}

/** Counting permits handed out as `OwnedPermit` objects. */
export class OwnedPermits {
  private free: number
  private readonly released = new Notify()

  constructor(readonly total: number) {
    this.free = total
  }

  get available(): number {
    return this.free
  }

  tryAcquire(): OwnedPermit | undefined {
    if (this.free <= 0) return undefined
    this.free--
    return new OwnedPermit(this)
  }

  /** @internal */
  giveBack(): void {
    this.free++
    this.released.notify()
  }

  /**
   * Waits for a permit unless `until` is cancelled first (then `undefined`). The permit is taken
   * synchronously after a wake-up, so run this from an uninterruptible region to be sure the
   * returned permit reaches its owner; the wait itself is interruptible.
   */
  acquireUnless(until: GenerationSignal): Effect.Effect<OwnedPermit | undefined> {
    const attempt: Effect.Effect<OwnedPermit | undefined> = Effect.suspend(() => {
      // Biased: a retired requester stops before taking capacity.
      if (until.isCancelled) return Effect.succeed(undefined)
      const permit = this.tryAcquire()
      if (permit !== undefined) return Effect.succeed(permit)
      const version = this.released.current
      return Effect.interruptible(Effect.raceFirst(this.released.changedSince(version), until.await)).pipe(
        Effect.zipRight(attempt)
      )
    })
    return attempt
  }
}

/**
 * Runs `effect` unless `signal` fires first (then `None`). A result that `effect` produced anyway
 * after losing is handed to `discard`, so nothing it acquired leaks.
 */
export const unlessCancelled = <A, E>(
  effect: Effect.Effect<A, E>,
  signal: GenerationSignal,
  discard: (a: A) => Effect.Effect<void>
): Effect.Effect<Option.Option<Either.Either<A, E>>> =>
  Effect.raceWith(Effect.either(effect), signal.await, {
    onSelfDone: (exit, other) => Effect.zipRight(Fiber.interrupt(other), Effect.map(exit, Option.some)),
    onOtherDone: (_exit, self) =>
      Effect.flatMap(Fiber.interrupt(self), (selfExit) =>
        Exit.isSuccess(selfExit) && Either.isRight(selfExit.value)
          ? Effect.as(discard(selfExit.value.right), Option.none())
          : Effect.succeed(Option.none())
      )
  })

/** The hand-over of a reclaimed permit from the eviction cleanup to the requester. */
export class PermitHandoff {
  private permit: OwnedPermit | undefined = undefined
  private delivered = false
  private abandoned = false
  readonly changed = new Notify()

  deliver(permit: OwnedPermit | undefined): void {
    if (this.delivered) {
      permit?.release()
      return
    }
    this.delivered = true
    if (this.abandoned) permit?.release()
    else this.permit = permit
    this.changed.notify()
  }

  abandon(): void {
    this.abandoned = true
    this.permit?.release()
    this.permit = undefined
  }

  /** Ownership of the delivered permit moves to the caller. */
  take(): OwnedPermit | undefined {
    const permit = this.permit
    this.permit = undefined
    return permit
  }

  get isDelivered(): boolean {
    return this.delivered
  }
}

export const DEFAULT_ENCODING_CONCURRENCY = 2

/** The shared CBI1 encoding semaphore. `close` makes every later acquisition fail (a test hook in the seed). */
export interface EncodingPermits {
  readonly withPermit: <A, E, R>(
    effect: Effect.Effect<A, E, R>
  ) => Effect.Effect<A, E | EncodingPermitsClosed, R>
  /**
   * Takes a permit held until the returned release runs (a snapshot producer holds it across the
   * stream bootstrap). Run from an uninterruptible region; the wait itself is interruptible.
   */
  readonly acquire: Effect.Effect<Effect.Effect<void>, EncodingPermitsClosed>
  readonly close: Effect.Effect<void>
  readonly available: number
  /**
   * Runs `f` (synchronous) under a permit when one is free right now, `None` otherwise. Taking
   * and returning a permit around code that cannot yield is invisible to every other fiber, so
   * this is `withPermit` minus its effects; the caller falls back to `withPermit` on `None`.
   */
  readonly runIfFree: <A>(f: () => A) => Option.Option<A>
}

export const makeEncodingPermits = (permits: number = DEFAULT_ENCODING_CONCURRENCY): EncodingPermits => {
  const semaphore = Effect.unsafeMakeSemaphore(permits)
  let closed = false
  let available = permits
  const take = Effect.suspend(() =>
    closed ? Effect.fail(new EncodingPermitsClosed()) : Effect.interruptible(semaphore.take(1))
  ).pipe(
    Effect.flatMap(() => {
      if (!closed) {
        available--
        return Effect.void
      }
      return Effect.zipRight(semaphore.release(1), Effect.fail(new EncodingPermitsClosed()))
    })
  )
  const release = Effect.suspend(() => {
    available++
    return semaphore.release(1)
  })
  return {
    withPermit: (effect) =>
      Effect.uninterruptibleMask((restore) =>
        Effect.flatMap(take, () => Effect.ensuring(restore(effect), release))
      ),
    acquire: Effect.map(take, () => {
      let held = true
      return Effect.suspend(() => {
        if (!held) return Effect.void
        held = false
        return release
      })
    }),
    close: Effect.sync(() => {
      closed = true
    }),
    get available() {
      return closed ? 0 : available
    },
    runIfFree: (f) => (!closed && available > 0 ? Option.some(f()) : Option.none())
  }
}
