/**
 * What the relay's streaming responses share: a body pulled one element at a time under a
 * write-stall watchdog, a small handoff between a forwarder fiber and the writer that never loses
 * an element to a timeout, and the watch loop with its heartbeat or re-send schedule.
 */

import type * as HttpServerRequest from "@effect/platform/HttpServerRequest"
import * as HttpServerResponse from "@effect/platform/HttpServerResponse"
import * as NodeHttpServerRequest from "@effect/platform-node/NodeHttpServerRequest"
import { Chunk, Clock, Deferred, Duration, Effect, Option, type Scope, Stream, Take } from "effect"
import { type ServerContext, SSE_HEADERS } from "./ServerContext.js"

// ---------------------------------------------------------------------------------------------
// Streaming machinery

/** `Some(a)` unless the server began shutting down first. */
export const unlessShutdown = <A, E>(
  ctx: ServerContext,
  effect: Effect.Effect<A, E>
): Effect.Effect<Option.Option<A>, E> =>
  Effect.raceFirst(Effect.map(effect, Option.some), Effect.as(Deferred.await(ctx.shutdown), Option.none<A>()))

/** Ends the underlying connection at once (the request fiber is then interrupted as a client abort). */
const abortConnection = (request: HttpServerRequest.HttpServerRequest): Effect.Effect<void> =>
  Effect.sync(() => {
    NodeHttpServerRequest.toServerResponse(request).destroy()
  })

/**
 * A response body pulled one element per `step` (`None` ends it), guarded by the write-stall
 * watchdog: the platform writer pulls again as soon as the socket accepted the previous element,
 * so an element that stays "emitted but not followed by a pull" is stuck in a full socket.
 */
export const guardedBody = (
  ctx: ServerContext,
  request: HttpServerRequest.HttpServerRequest,
  what: string,
  step: Effect.Effect<Option.Option<Uint8Array>>
): Effect.Effect<Stream.Stream<Uint8Array>, never, Scope.Scope> =>
  Effect.gen(function* () {
    const stallMs = Duration.toMillis(ctx.writeStallTimeout)
    let emittedAt: number | undefined
    const guarded = Effect.gen(function* () {
      emittedAt = undefined
      const next = yield* step
      if (Option.isSome(next)) emittedAt = yield* Clock.currentTimeMillis
      return next
    })
    yield* Effect.gen(function* () {
      const period = Duration.millis(Math.max(5, Math.min(1_000, stallMs / 4)))
      for (;;) {
        yield* Effect.sleep(period)
        const now = yield* Clock.currentTimeMillis
        if (emittedAt !== undefined && now - emittedAt >= stallMs) {
          yield* Effect.logWarning(`KV DC Relay ${what} client stopped reading; closing its connection`)
          yield* abortConnection(request)
          return
        }
      }
    }).pipe(Effect.forkScoped)
    return Stream.repeatEffectOption(
      Effect.flatMap(guarded, (next) =>
        Option.isSome(next) ? Effect.succeed(next.value) : Effect.fail(Option.none())
      )
    )
  })

/**
 * A small buffer between a forwarder fiber and the response writer. Waiting for an element never
 * consumes one, so a heartbeat timeout or the shutdown race cannot lose an element (a `Queue.take`
 * interrupted just after an offer completed it would). `sliding` keeps the newest elements
 * instead of making the forwarder wait.
 */
export class Handoff<A> {
  private readonly items: Array<A> = []
  private readonly nonEmpty = Effect.unsafeMakeLatch(false)
  private readonly notFull = Effect.unsafeMakeLatch(true)
  /** The waiting `next` (one reader per handoff); resolving it deregisters it. */
  private waiter: ((outcome: HandoffWait<A>) => void) | undefined = undefined
  /** When the waiting `next` began, if it asked for a heartbeat (Clock milliseconds). */
  private heartbeatFrom: number | undefined = undefined
  private closed = false

  constructor(
    private readonly capacity: number,
    private readonly sliding: boolean
  ) {}

  readonly offer = (item: A): Effect.Effect<void> =>
    Effect.suspend(() => {
      if (this.items.length >= this.capacity && !this.sliding)
        return Effect.zipRight(this.notFull.await, this.offer(item))
      if (this.items.length >= this.capacity) this.items.shift()
      this.items.push(item)
      this.nonEmpty.unsafeOpen()
      if (this.items.length >= this.capacity) this.notFull.unsafeClose()
      const waiter = this.waiter
      if (waiter !== undefined) waiter({ _tag: "Item", item: Option.getOrThrow(this.poll()) })
      return Effect.void
    })

  /** Ends the waiting `next` and every later one with `Closed` (server shutdown). */
  close(): void {
    this.closed = true
    this.waiter?.(HANDOFF_CLOSED)
  }

  /** Ends the waiting `next` with `Heartbeat` if it asked for one and has waited `ms` by `now`. */
  heartbeatDue(now: number, ms: number): number | undefined {
    const from = this.heartbeatFrom
    if (from === undefined) return undefined
    const left = from + ms - now
    if (left > 0) return left
    this.waiter?.(HANDOFF_HEARTBEAT)
    return undefined
  }

  /**
   * The next element, `Closed` once `close` ran, or `Heartbeat` when `heartbeatFrom` is given and
   * the caller's heartbeat driver finds the wait long enough. Unlike `take`, waiting costs no
   * fiber: it is a callback that `offer`, `close` and the driver resolve, once.
   */
  next(heartbeatFrom: number | undefined): Effect.Effect<HandoffWait<A>> {
    return Effect.async<HandoffWait<A>>((resume) => {
      const ready = this.poll()
      if (Option.isSome(ready)) return resume(Effect.succeed({ _tag: "Item", item: ready.value }))
      if (this.closed) return resume(Effect.succeed(HANDOFF_CLOSED))
      const waiter = (outcome: HandoffWait<A>) => {
        this.waiter = undefined
        this.heartbeatFrom = undefined
        resume(Effect.succeed(outcome))
      }
      this.waiter = waiter
      this.heartbeatFrom = heartbeatFrom
      return Effect.sync(() => {
        if (this.waiter !== waiter) return
        this.waiter = undefined
        this.heartbeatFrom = undefined
      })
    })
  }

  private poll(): Option.Option<A> {
    if (this.items.length === 0) return Option.none()
    const item = this.items.shift()!
    if (this.items.length === 0) this.nonEmpty.unsafeClose()
    this.notFull.unsafeOpen()
    return Option.some(item)
  }

  /** The next element; `None` when `wait` ran out first (`undefined` waits without limit). */
  take(wait: Duration.Duration | undefined): Effect.Effect<Option.Option<A>> {
    return Effect.suspend(() => {
      const ready = this.poll()
      if (Option.isSome(ready)) return Effect.succeed(ready)
      const available =
        wait === undefined ? this.nonEmpty.await : this.nonEmpty.await.pipe(Effect.timeout(wait))
      return Effect.matchEffect(available, {
        onFailure: () => Effect.succeed(Option.none()),
        onSuccess: () => this.take(wait)
      })
    })
  }
}

type HandoffWait<A> =
  | { readonly _tag: "Item"; readonly item: A }
  | { readonly _tag: "Heartbeat" }
  | { readonly _tag: "Closed" }

const HANDOFF_HEARTBEAT = { _tag: "Heartbeat" } as const

const HANDOFF_CLOSED = { _tag: "Closed" } as const

/** Runs `stream` into `handoff` as `Take`s (its end and failure included) in a scoped fiber. */
export const forward = <A, E>(
  stream: Stream.Stream<A, E>,
  handoff: Handoff<Take.Take<A, E>>
): Effect.Effect<void, never, Scope.Scope> =>
  stream.pipe(
    // Whole chunks: a backlog the source delivers at once goes out in one write.
    Stream.runForEachChunk((chunk) => handoff.offer(Take.chunk(chunk))),
    Effect.matchCauseEffect({
      onSuccess: () => handoff.offer(Take.end),
      onFailure: (cause) => handoff.offer(Take.failCause(cause))
    }),
    Effect.interruptible,
    Effect.forkScoped,
    Effect.asVoid
  )

/**
 * A watch over a sliding handoff of values: each new value is sent, and `onTick` runs
 * on a fixed schedule of `interval` from the start (a heartbeat or a re-send).
 */
export const watchStep = <A>(
  ctx: ServerContext,
  values: Handoff<Take.Take<A>>,
  interval: Duration.Duration,
  onValue: (value: A) => Effect.Effect<Uint8Array>,
  onTick: Effect.Effect<Uint8Array>
): Effect.Effect<Effect.Effect<Option.Option<Uint8Array>>> =>
  Effect.gen(function* () {
    const intervalMs = Math.max(1, Duration.toMillis(interval))
    let nextTick = (yield* Clock.currentTimeMillis) + intervalMs
    let done = false
    const tick = Effect.gen(function* () {
      const now = yield* Clock.currentTimeMillis
      nextTick = Math.max(nextTick + intervalMs, now + 1)
      return Option.some(yield* onTick)
    })
    return Effect.gen(function* () {
      if (done) return Option.none()
      for (;;) {
        const wait = nextTick - (yield* Clock.currentTimeMillis)
        if (wait <= 0) return yield* tick
        const got = yield* unlessShutdown(ctx, values.take(Duration.millis(wait)))
        if (Option.isNone(got)) {
          done = true
          return Option.none()
        }
        if (Option.isNone(got.value)) return yield* tick
        const latest = Take.match(got.value.value, {
          onEnd: () => undefined,
          onFailure: () => undefined,
          onSuccess: (chunk) => Chunk.last(chunk)
        })
        if (latest === undefined) {
          done = true
          return Option.none()
        }
        if (Option.isSome(latest)) return Option.some(yield* onValue(latest.value))
      }
    })
  })

export const sseResponse = (body: Stream.Stream<Uint8Array>) =>
  HttpServerResponse.stream(body, { contentType: "text/event-stream", headers: SSE_HEADERS })
