/**
 * Windowed pool load (relay-service §4.4 "Load"): once per window the publisher cuts the
 * registry's current load list into a complete window with the next `windowSequence` (from 1),
 * the wall-clock `observedMs` and the configured `windowMs`, and fans it out.
 *
 * A subscriber receives the current window (if one was cut yet), then only newer windows. Each
 * subscriber has a bounded buffer (`load_fanout_capacity`, default 16 windows); a subscriber
 * whose buffer is full when a window is cut is dropped as lagged and must resubscribe. The
 * publisher never waits for a subscriber.
 */

import { Clock, Deferred, Duration, Effect, Option, Queue, type Scope, Stream, SubscriptionRef } from "effect"
import type { EngineLoadAdditions } from "../load/EngineLoadWindow.js"
import { loopStep, supervised } from "../observability/Supervised.js"
import type { PoolLoadSnapshot } from "./PoolLoad.js"
import { LoadWindowLagged, LoadWindowsClosed } from "./RelayErrors.js"

const DEFAULT_LOAD_WINDOW: Duration.Duration = Duration.seconds(1)
const DEFAULT_LOAD_FANOUT_CAPACITY = 16
const MAX_LOAD_FANOUT_CAPACITY = 65_536

/** One load window: every pool's load over the window, with its sequence and time. */
export interface LoadWindow {
  readonly windowSequence: bigint
  /** Wall clock (Unix ms) when the window was cut. */
  readonly observedMs: bigint
  readonly windowMs: bigint
  /** Sorted by PoolId; an empty list is a valid idle window. */
  readonly pools: ReadonlyArray<LoadWindowPool>
}

/** A pool's entry: its KV occupancy and its engines' load (PROTOCOL §5 ◆3; absent = none read). */
export interface LoadWindowPool extends PoolLoadSnapshot {
  readonly engine?: EngineLoadAdditions | undefined
}

type LoadWindowError = LoadWindowLagged | LoadWindowsClosed

interface LoadWindowSubscription {
  /**
   * The next window: the current one first, then every newer one; fails once the subscriber was
   * dropped as lagged or the publisher stopped. Safe to interrupt (nothing is lost).
   */
  readonly next: Effect.Effect<LoadWindow, LoadWindowError>
  /** `next`, repeated. */
  readonly windows: Stream.Stream<LoadWindow, LoadWindowError>
}

/** The relay's load windows: the current one and a subscription to the next ones. */
export interface LoadWindows {
  readonly current: Effect.Effect<Option.Option<LoadWindow>>
  /** Subscribes until the scope closes. */
  readonly subscribe: Effect.Effect<LoadWindowSubscription, LoadWindowsClosed, Scope.Scope>
  readonly subscriberCount: () => number
}

interface LoadWindowsOptions {
  /** Default 1 s; the first window is cut one window after start. */
  readonly window?: Duration.DurationInput | undefined
  /** Windows buffered per subscriber (default 16, at most 65,536). */
  readonly fanoutCapacity?: number | undefined
  /**
   * The engines' load of each pool at the cut's time (PROTOCOL §5 ◆3), in the pools' order. It
   * must not wait on an engine: it reads what the metrics poller left behind.
   */
  readonly engineLoad?:
    | ((
        pools: ReadonlyArray<PoolLoadSnapshot>,
        nowMs: number
      ) => Effect.Effect<ReadonlyArray<EngineLoadAdditions>>)
    | undefined
  /** Called once per window cut (metrics). */
  readonly onWindow?: ((window: LoadWindow) => Effect.Effect<void>) | undefined
}

interface Subscriber {
  readonly queue: Queue.Queue<LoadWindow>
  readonly ended: Deferred.Deferred<never, LoadWindowError>
}

/** Cuts windows from `loadRef` until the current scope closes. */
export const make = (
  loadRef: SubscriptionRef.SubscriptionRef<ReadonlyArray<PoolLoadSnapshot>>,
  options: LoadWindowsOptions = {}
): Effect.Effect<LoadWindows, never, Scope.Scope> =>
  Effect.gen(function* () {
    const window = Duration.decode(options.window ?? DEFAULT_LOAD_WINDOW)
    const windowMs = BigInt(Math.max(1, Math.round(Duration.toMillis(window))))
    const capacity = Math.min(
      MAX_LOAD_FANOUT_CAPACITY,
      Math.max(1, Math.floor(options.fanoutCapacity ?? DEFAULT_LOAD_FANOUT_CAPACITY))
    )
    const subscribers = new Set<Subscriber>()
    let current: Option.Option<LoadWindow> = Option.none()
    let sequence = 0n
    let closed = false

    const drop = (subscriber: Subscriber, error: LoadWindowError) =>
      Effect.zipRight(
        Effect.sync(() => subscribers.delete(subscriber)),
        Deferred.fail(subscriber.ended, error)
      )

    const cut = Effect.gen(function* () {
      const snapshots = yield* SubscriptionRef.get(loadRef)
      const nowMs = yield* Clock.currentTimeMillis
      const observedMs = BigInt(nowMs)
      let pools: ReadonlyArray<LoadWindowPool> = snapshots
      if (options.engineLoad !== undefined) {
        const engine = yield* options.engineLoad(snapshots, nowMs)
        pools = snapshots.map((pool, i) => ({ ...pool, engine: engine[i] }))
      }
      sequence += 1n
      const next: LoadWindow = { windowSequence: sequence, observedMs, windowMs, pools }
      current = Option.some(next)
      for (const subscriber of Array.from(subscribers)) {
        // A dropping queue refuses instead of waiting: a full buffer means the subscriber lagged.
        const accepted = yield* Queue.offer(subscriber.queue, next)
        if (!accepted) yield* drop(subscriber, new LoadWindowLagged({ capacity }))
      }
      if (options.onWindow !== undefined) yield* options.onWindow(next)
    })

    // Supervised: a defect loses at most the window being cut; the next one follows a window later.
    yield* Effect.sleep(window).pipe(
      Effect.zipRight(loopStep("relay.load-windows")),
      Effect.zipRight(cut),
      Effect.forever,
      (loop) => supervised("relay.load-windows", loop),
      Effect.withSpan("LoadWindows.publisher"),
      Effect.forkScoped
    )
    yield* Effect.addFinalizer(() =>
      Effect.gen(function* () {
        closed = true
        for (const subscriber of Array.from(subscribers)) yield* drop(subscriber, new LoadWindowsClosed())
      })
    )

    const subscribe: Effect.Effect<LoadWindowSubscription, LoadWindowsClosed, Scope.Scope> = Effect.gen(
      function* () {
        const queue = yield* Queue.dropping<LoadWindow>(capacity)
        const ended = yield* Deferred.make<never, LoadWindowError>()
        const subscriber: Subscriber = { queue, ended }
        // Registration and the current window happen in one synchronous step, so no window
        // can slip between them or arrive twice.
        const registered = yield* Effect.sync(() => {
          if (closed) return false
          subscribers.add(subscriber)
          if (Option.isSome(current)) queue.unsafeOffer(current.value)
          return true
        })
        if (!registered) return yield* Effect.fail(new LoadWindowsClosed())
        yield* Effect.addFinalizer(() =>
          Effect.zipRight(
            Effect.sync(() => subscribers.delete(subscriber)),
            Queue.shutdown(queue)
          )
        )
        // A drop is reported at once: the windows still queued are stale for a lagged subscriber.
        const next = Effect.flatMap(Deferred.poll(ended), (done) =>
          Option.isSome(done) ? done.value : Effect.raceFirst(Queue.take(queue), Deferred.await(ended))
        )
        return { next, windows: Stream.repeatEffect(next) }
      }
    )

    return {
      current: Effect.sync(() => current),
      subscribe,
      subscriberCount: () => subscribers.size
    }
  })
