/**
 * The publication source (relay-service §3.4): one pool stream per consumer, bootstrapped from a
 * CBI1 snapshot of the hub's mirror and continued with contiguous CBI1 deltas.
 *
 * Admission validates the expected producer before taking any permit, then takes one of the
 * total pool-stream permits without waiting and waits (cancellably) for a snapshot-encoding
 * permit. The snapshot chunks are pushed through a one-frame hand-over; if the consumer does not
 * take a chunk within `snapshotProgressTimeout`, the producer stops, releases its encoding permit
 * and the stream ends with `SnapshotProgressTimeout` (the generation is not fenced).
 *
 * The stream's resources (stream permit, hub subscriber, encoding permit) are released as soon
 * as the stream ends or its consumer stops, and at the latest when the caller's scope closes.
 * The stream permit goes back earlier still, the moment the stream becomes terminal (lagged,
 * retired, stalled, shut down), whether or not its consumer ever pulls the end: a peer that stops
 * reading must not hold a slot (PROTOCOL §5). Relay shutdown ends every stream silently.
 */

import { Chunk, Deferred, Duration, Effect, Exit, Option, Runtime, Scope, Stream } from "effect"
import { Cbi1Error, encodeCbi1Snapshot } from "../ckf/cbi1.js"
import type { ProducerIdentity } from "../ckf/identity.js"
import {
  DEFAULT_ENCODING_CONCURRENCY,
  type EncodingPermits,
  type GenerationSignal,
  GenerationToken,
  makeEncodingPermits,
  OwnedPermits
} from "./internal/sync.js"
import type { PoolRegistry } from "./PoolRegistry.js"
import type { HubFrame } from "./PublicationHub.js"
import { PublicationError, type PublicationHubError, SubscriberLagged } from "./RelayErrors.js"

const DEFAULT_MAX_POOL_STREAMS = 64
const DEFAULT_SNAPSHOT_PROGRESS_TIMEOUT: Duration.Duration = Duration.seconds(60)

/** The driver-level kind of a hub error (relay-service §3.3). */
const publicationErrorOf = (error: PublicationHubError): PublicationError => {
  switch (error._tag) {
    case "UnknownPool":
      return new PublicationError({ kind: "NotFound", message: error.message })
    case "ProducerMismatch":
      return new PublicationError({ kind: "ProducerMismatch", message: error.message })
    case "PublicationUnavailable":
      return new PublicationError({ kind: "Unavailable", message: error.message })
    case "SubscriberLimit":
    case "InitializedHubLimit":
      return new PublicationError({ kind: "ResourceExhausted", message: error.message })
    case "SubscriberLagged":
      return new PublicationError({ kind: "SubscriberLagged", message: error.message })
    case "InvalidHubPublication":
      return new PublicationError({ kind: "InvalidPublication", message: error.message })
  }
}

type PublicationFrameKind = "SnapshotChunk" | "Delta"

/** One frame of a pool stream before it is written: a snapshot chunk, a delta or a heartbeat. */
export interface PublicationFrame {
  readonly kind: PublicationFrameKind
  readonly identity: ProducerIdentity
  readonly baseSequence: bigint
  readonly sequence: bigint
  /** One CBI1 frame. */
  readonly payload: Uint8Array
}

/**
 * What a pool feed has now: the frames ready (none when nothing is), `"end"` once the relay shut
 * down (the stream ends silently), or the error the stream ended with. An end is final: every
 * later poll returns it again.
 */
type PoolFeedNext = ReadonlyArray<PublicationFrame> | PublicationError | "end"

/**
 * A pool stream as a callback-driven source, for a consumer that moves frames without a fiber per
 * frame (the HTTP pool stream writes them straight to its socket). The same frames in the same
 * order as `subscribePool`'s stream: that stream is this feed, pulled.
 */
export interface PoolFeed {
  /** Takes what is ready; never waits. */
  readonly poll: () => PoolFeedNext
  /**
   * `wake` is called (until replaced; `undefined` removes it) whenever `poll` may have something
   * new. It runs inside the hub's loop or another fiber: it must not throw, and should defer
   * real work (a microtask).
   */
  readonly onReady: (wake: (() => void) | undefined) => void
}

/** Stream limits and snapshot permits of the publication source. */
export interface PublicationSourceOptions {
  /** Pool streams open at once across all pools (default 64). */
  readonly maxActiveStreams?: number | undefined
  /** Snapshot-encoding permits (default 2 of its own). */
  readonly encodingPermits?: EncodingPermits | undefined
  /** How long a snapshot chunk may wait for its consumer (default 60 s). */
  readonly snapshotProgressTimeout?: Duration.DurationInput | undefined
}

/** Opens pool streams over the publication hubs, within the relay's stream limits. */
export interface PublicationSource {
  /**
   * Opens a pool stream. Errors before the first frame (not found, producer changed, limits,
   * unavailable, invalid publication) fail this effect; later ones end the stream. `ended`, when
   * given, completes the moment the stream becomes terminal, with why, before its consumer pulls
   * the end (that is also when its stream permit goes back).
   */
  readonly subscribePool: (
    expected: ProducerIdentity,
    subscriberId: string,
    ended?: Deferred.Deferred<PublicationError>
  ) => Effect.Effect<Stream.Stream<PublicationFrame, PublicationError>, PublicationError, Scope.Scope>
  /**
   * `subscribePool` as a `PoolFeed`: the same admission, errors, `ended` and limits; its
   * resources are released when the caller's scope closes.
   */
  readonly subscribePoolFeed: (
    expected: ProducerIdentity,
    subscriberId: string,
    ended?: Deferred.Deferred<PublicationError>
  ) => Effect.Effect<PoolFeed, PublicationError, Scope.Scope>
  /** Ends every stream silently and rejects new ones as unavailable. */
  readonly shutdown: Effect.Effect<void>
  /** Completes once `shutdown` ran (`wait_for_shutdown` in the seed). */
  readonly awaitShutdown: Effect.Effect<void>
  /** Open pool streams. */
  readonly activeStreams: () => number
}

const END: Effect.Effect<never, Option.Option<never>> = Effect.fail(Option.none())
const NOTHING_YET: ReadonlyArray<PublicationFrame> = []

/** `feed` pulled: each pull takes what is ready, or waits for the feed's next wake-up. */
const feedStream = (feed: PoolFeed): Stream.Stream<PublicationFrame, PublicationError> => {
  const settle = (
    next: PoolFeedNext
  ): Effect.Effect<Chunk.Chunk<PublicationFrame>, Option.Option<PublicationError>> | undefined => {
    if (next === "end") return END
    if (!Array.isArray(next)) return Effect.fail(Option.some(next as PublicationError))
    const frames = next as ReadonlyArray<PublicationFrame>
    return frames.length === 0 ? undefined : Effect.succeed(Chunk.unsafeFromArray(frames))
  }
  const pull = Effect.suspend(
    () =>
      settle(feed.poll()) ??
      Effect.async<Chunk.Chunk<PublicationFrame>, Option.Option<PublicationError>>((resume) => {
        feed.onReady(() => {
          const settled = settle(feed.poll())
          if (settled === undefined) return
          feed.onReady(undefined)
          resume(settled)
        })
        return Effect.sync(() => feed.onReady(undefined))
      })
  )
  return Stream.repeatEffectChunkOption(pull)
}

const invalid = (message: string) => new PublicationError({ kind: "InvalidPublication", message })

const GENERATION_RETIRED = new PublicationError({
  kind: "Unavailable",
  message: "pool generation retired; open a fresh stream"
})
const SHUTTING_DOWN = new PublicationError({ kind: "Unavailable", message: "relay is shutting down" })
// What the hub subscription's `recv` fails with once it was retired.
const SUBSCRIPTION_CLOSED = new PublicationError({
  kind: "Unavailable",
  message: "publication subscription closed; it requires a fresh snapshot"
})

/** A publication source over `registry`, shut down when the current scope closes. */
export const make = (
  registry: PoolRegistry,
  options: PublicationSourceOptions = {}
): Effect.Effect<PublicationSource, never, Scope.Scope> =>
  Effect.gen(function* () {
    const maxActiveStreams = options.maxActiveStreams ?? DEFAULT_MAX_POOL_STREAMS
    const streamPermits = new OwnedPermits(maxActiveStreams)
    const encodingPermits = options.encodingPermits ?? makeEncodingPermits(DEFAULT_ENCODING_CONCURRENCY)
    const progressTimeout = Duration.decode(
      options.snapshotProgressTimeout ?? DEFAULT_SNAPSHOT_PROGRESS_TIMEOUT
    )
    const lifecycle = new GenerationToken()

    const fence = (expected: ProducerIdentity, reason: string) =>
      registry.fenceGeneration(expected.poolId, expected.layoutGeneration, `publication source: ${reason}`)

    /**
     * Admission and bootstrap; every resource lands in `streamScope`. `onTerminal` runs once, as
     * soon as the stream is known to end, with the error it ends with.
     */
    const open = (
      expected: ProducerIdentity,
      generation: GenerationSignal,
      streamScope: Scope.CloseableScope,
      onTerminal: (error: PublicationError) => void
    ): Effect.Effect<PoolFeed, PublicationError> =>
      Effect.uninterruptibleMask((restore) =>
        Effect.gen(function* () {
          // Waiting for an encoding permit is cancellable: the wait is interruptible.
          const releaseEncoding = yield* restore(encodingPermits.acquire).pipe(
            Effect.mapError((error) => new PublicationError({ kind: "Unavailable", message: error.message }))
          )
          yield* Scope.addFinalizer(streamScope, releaseEncoding)
          const subscription = yield* restore(registry.subscribePool(expected)).pipe(
            Scope.extend(streamScope),
            Effect.mapError(publicationErrorOf)
          )
          const snapshot = subscription.snapshot
          if (snapshot === undefined) {
            return yield* Effect.fail(
              new PublicationError({
                kind: "Internal",
                message: "publication subscription lost its snapshot"
              })
            )
          }
          if (!snapshot.identity.equals(expected)) {
            const message = `snapshot identity ${snapshot.identity.key} differs from the expected ${expected.key}`
            yield* fence(expected, message)
            return yield* Effect.fail(invalid(message))
          }
          const chunks = encodeCbi1Snapshot(
            { format: expected.format, dcId: expected.poolId.dcId.value },
            snapshot.sequence,
            snapshot.words
          )
          subscription.releaseSnapshot()
          if (chunks instanceof Cbi1Error) {
            const message = `CBI1 snapshot encoding failed: ${chunks.message}`
            yield* fence(expected, message)
            return yield* Effect.fail(invalid(message))
          }

          // Frames are handed to whoever registered with `onReady`; one wake-up for each chunk
          // handed over, frame queued, or end.
          let wake: (() => void) | undefined
          const notify = (): void => {
            if (wake !== undefined) wake()
          }
          subscription.onReady(notify)

          // The producer side of the one-chunk hand-over: it holds the encoding permit (and the
          // encoded chunks) only until the last chunk was taken or the consumer stalled.
          const handover: Array<Uint8Array> = []
          const room = Effect.unsafeMakeLatch(true)
          let stall: PublicationError | undefined
          const stalled = yield* Deferred.make<never, PublicationError>()
          const produce = Effect.gen(function* () {
            for (const chunk of chunks) {
              const offered = yield* room.await.pipe(Effect.timeoutOption(progressTimeout))
              if (Option.isNone(offered)) {
                yield* Effect.logWarning("KV DC Relay snapshot consumer made no progress; closing its stream")
                stall = new PublicationError({
                  kind: "SnapshotProgressTimeout",
                  message: `snapshot chunk not taken within ${Duration.format(progressTimeout)}; open a fresh stream`
                })
                yield* Deferred.fail(stalled, stall)
                notify()
                return
              }
              handover.push(chunk)
              room.unsafeClose()
              notify()
            }
          }).pipe(Effect.ensuring(releaseEncoding), Effect.interruptible)
          yield* Effect.forkIn(produce, streamScope)

          // A retired generation ends the stream at the next poll, even mid-snapshot: whatever is
          // still queued belongs to a producer the consumer must drop. A relay shutdown ends it
          // silently, and comes first.
          const ended = (): PoolFeedNext | undefined =>
            lifecycle.isCancelled ? "end" : generation.isCancelled ? GENERATION_RETIRED : undefined
          // One watcher per stream reports the first terminal condition at once, a lag or a stall
          // included: those surface only when the consumer polls, and a stuck peer never does.
          // When the generation retires or the relay shuts down it wakes the consumer, which then
          // finds the end (closing the hub subscription wakes it too).
          const terminalCondition: Effect.Effect<PublicationError> = Effect.raceAll([
            Effect.as(generation.await, GENERATION_RETIRED),
            Effect.as(lifecycle.await, SHUTTING_DOWN),
            Effect.map(subscription.closed, (reason) =>
              reason === "Lagged"
                ? publicationErrorOf(new SubscriberLagged({ poolId: expected.poolId }))
                : SUBSCRIPTION_CLOSED
            ),
            Effect.flip(Deferred.await(stalled))
          ])
          yield* Effect.forkIn(
            Effect.gen(function* () {
              onTerminal(yield* terminalCondition)
              yield* Effect.raceFirst(generation.await, lifecycle.await)
              notify()
              yield* subscription.close
            }).pipe(Effect.interruptible),
            streamScope
          )

          const runFork = Runtime.runFork(yield* Effect.runtime<never>())
          const sequence = snapshot.sequence
          let taken = 0
          let current = sequence
          /** A discontinuity found by `poll`: final, like every end. */
          let broken: PublicationError | undefined
          const poll = (): PoolFeedNext => {
            const end = ended()
            if (end !== undefined) return end
            if (broken !== undefined) return broken
            if (taken < chunks.length) {
              // A chunk already handed over goes out before a stall is reported.
              const payload = handover.shift()
              if (payload === undefined) return stall ?? NOTHING_YET
              taken++
              room.unsafeOpen()
              return [
                { kind: "SnapshotChunk", identity: expected, baseSequence: sequence, sequence, payload }
              ]
            }
            // The whole backlog per poll: under a burst the actor publishes many deltas per turn,
            // and a consumer that moved one frame per wake-up would fall behind and be lagged.
            const frames = subscription.pollAll()
            if (!Array.isArray(frames)) return ended() ?? publicationErrorOf(frames as PublicationHubError)
            const queued = frames as ReadonlyArray<HubFrame>
            if (queued.length === 0) return NOTHING_YET
            const out: Array<PublicationFrame> = []
            for (const frame of queued) {
              if (frame.baseSequence !== current || frame.sequence !== current + 1n) {
                const message = `pool stream delta ${frame.baseSequence} -> ${frame.sequence} does not continue sequence ${current}`
                broken = invalid(message)
                // The stream ends now; fencing the generation need not hold up its end.
                runFork(fence(expected, message))
                return broken
              }
              current = frame.sequence
              out.push({
                kind: "Delta",
                identity: expected,
                baseSequence: frame.baseSequence,
                sequence: frame.sequence,
                payload: frame.payload
              })
            }
            return out
          }
          const feed: PoolFeed = {
            poll,
            onReady: (next) => {
              wake = next
            }
          }
          return feed
        })
      )

    /** Admission, then `open`; `release` is how the feed's resources end besides the caller's scope. */
    const admit = <A>(
      expected: ProducerIdentity,
      subscriberId: string,
      ended: Deferred.Deferred<PublicationError> | undefined,
      use: (feed: PoolFeed, release: Effect.Effect<void>) => A
    ): Effect.Effect<A, PublicationError, Scope.Scope> =>
      Effect.gen(function* () {
        if (lifecycle.isCancelled) {
          return yield* Effect.fail(
            new PublicationError({ kind: "Unavailable", message: "relay is shutting down" })
          )
        }
        // Validated before any permit is taken, so a stale consumer never occupies one.
        const generation = yield* registry
          .validateActiveProducer(expected)
          .pipe(Effect.mapError(publicationErrorOf))
        const callerScope = yield* Effect.scope
        return yield* Effect.uninterruptibleMask((restore) =>
          Effect.gen(function* () {
            const permit = streamPermits.tryAcquire()
            if (permit === undefined) {
              return yield* Effect.fail(
                new PublicationError({
                  kind: "ResourceExhausted",
                  message: `Relay total pool stream limit ${maxActiveStreams} reached`
                })
              )
            }
            const streamScope = yield* Scope.make()
            yield* Scope.addFinalizer(
              streamScope,
              Effect.sync(() => permit.release())
            )
            yield* Scope.addFinalizer(callerScope, Scope.close(streamScope, Exit.void))
            const onTerminal = (error: PublicationError): void => {
              permit.release()
              if (ended !== undefined) Deferred.unsafeDone(ended, Exit.succeed(error))
            }
            const feed = yield* restore(open(expected, generation, streamScope, onTerminal)).pipe(
              Effect.onError(() => Scope.close(streamScope, Exit.void))
            )
            return use(feed, Scope.close(streamScope, Exit.void))
          })
        )
      }).pipe(
        Effect.annotateLogs({
          poolId: expected.poolId.toString(),
          layoutGeneration: String(expected.layoutGeneration),
          subscriberId
        }),
        Effect.withSpan("PublicationSource.subscribePool", {
          attributes: {
            "kvrelay.pool": expected.poolId.toString(),
            "kvrelay.layout_generation": String(expected.layoutGeneration),
            "kvrelay.subscriber": subscriberId
          }
        })
      )

    const subscribePool = (
      expected: ProducerIdentity,
      subscriberId: string,
      ended?: Deferred.Deferred<PublicationError>
    ): Effect.Effect<Stream.Stream<PublicationFrame, PublicationError>, PublicationError, Scope.Scope> =>
      // A relay shutdown ends the stream at its next pull (and wakes a waiting one): see `open`.
      // Not `Stream.interruptWhen`, which forks a fiber for every element.
      admit(expected, subscriberId, ended, (feed, release) => feedStream(feed).pipe(Stream.ensuring(release)))

    const subscribePoolFeed = (
      expected: ProducerIdentity,
      subscriberId: string,
      ended?: Deferred.Deferred<PublicationError>
    ): Effect.Effect<PoolFeed, PublicationError, Scope.Scope> =>
      admit(expected, subscriberId, ended, (feed) => feed)

    const shutdown = Effect.sync(() => lifecycle.cancel())
    yield* Effect.addFinalizer(() => shutdown)

    return {
      subscribePool,
      subscribePoolFeed,
      shutdown,
      awaitShutdown: lifecycle.await,
      activeStreams: () => maxActiveStreams - streamPermits.available
    }
  })
