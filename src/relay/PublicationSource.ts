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

import { Chunk, Data, Deferred, Duration, Effect, Exit, Option, Queue, Scope, Stream } from "effect"
import { Cbi1Error, encodeCbi1Snapshot } from "../ckf/cbi1.js"
import type { ProducerIdentity } from "../ckf/identity.js"
import type { PoolRegistry } from "./PoolRegistry.js"
import {
  DEFAULT_ENCODING_CONCURRENCY,
  type EncodingPermits,
  type GenerationSignal,
  GenerationToken,
  makeEncodingPermits,
  OwnedPermits,
  type PublicationHubError,
  SubscriberLagged
} from "./PublicationHub.js"

export const DEFAULT_MAX_POOL_STREAMS = 64
export const DEFAULT_SNAPSHOT_PROGRESS_TIMEOUT: Duration.Duration = Duration.seconds(60)

export type PublicationErrorKind =
  | "NotFound"
  | "ProducerMismatch"
  | "Unavailable"
  | "ResourceExhausted"
  | "SubscriberLagged"
  | "SnapshotProgressTimeout"
  | "InvalidPublication"
  | "Internal"

export class PublicationError extends Data.TaggedError("PublicationError")<{
  readonly kind: PublicationErrorKind
  readonly message: string
}> {}

/** The driver-level kind of a hub error (relay-service §3.3). */
export const publicationErrorOf = (error: PublicationHubError): PublicationError => {
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

export type PublicationFrameKind = "SnapshotChunk" | "Delta"

export interface PublicationFrame {
  readonly kind: PublicationFrameKind
  readonly identity: ProducerIdentity
  readonly baseSequence: bigint
  readonly sequence: bigint
  /** One CBI1 frame. */
  readonly payload: Uint8Array
}

export interface PublicationSourceOptions {
  /** Pool streams open at once across all pools (default 64). */
  readonly maxActiveStreams?: number | undefined
  /** Snapshot-encoding permits (default 2 of its own). */
  readonly encodingPermits?: EncodingPermits | undefined
  /** How long a snapshot chunk may wait for its consumer (default 60 s). */
  readonly snapshotProgressTimeout?: Duration.DurationInput | undefined
}

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
  /** Ends every stream silently and rejects new ones as unavailable. */
  readonly shutdown: Effect.Effect<void>
  /** Completes once `shutdown` ran (`wait_for_shutdown` in the seed). */
  readonly awaitShutdown: Effect.Effect<void>
  /** Open pool streams. */
  readonly activeStreams: () => number
}

const END: Effect.Effect<never, Option.Option<never>> = Effect.fail(Option.none())

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
    ): Effect.Effect<Stream.Stream<PublicationFrame, PublicationError>, PublicationError> =>
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

          // The producer side of the one-chunk hand-over: it holds the encoding permit (and the
          // encoded chunks) only until the last chunk was taken or the consumer stalled.
          const handover = yield* Queue.bounded<Uint8Array>(1)
          const stalled = yield* Deferred.make<never, PublicationError>()
          const produce = Effect.gen(function* () {
            for (const chunk of chunks) {
              const offered = yield* Queue.offer(handover, chunk).pipe(Effect.timeoutOption(progressTimeout))
              if (Option.isNone(offered)) {
                yield* Effect.logWarning("KV DC Relay snapshot consumer made no progress; closing its stream")
                yield* Deferred.fail(
                  stalled,
                  new PublicationError({
                    kind: "SnapshotProgressTimeout",
                    message: `snapshot chunk not taken within ${Duration.format(progressTimeout)}; open a fresh stream`
                  })
                )
                return
              }
            }
          }).pipe(Effect.ensuring(releaseEncoding), Effect.interruptible)
          yield* Effect.forkIn(produce, streamScope)

          // A retired generation ends the stream at the next pull, even mid-snapshot: whatever is
          // still queued belongs to a producer the consumer must drop. A relay shutdown ends it
          // silently, and comes first.
          const retired = Effect.fail(Option.some(GENERATION_RETIRED))
          const ended = (): Effect.Effect<never, Option.Option<PublicationError>> | undefined =>
            lifecycle.isCancelled ? END : generation.isCancelled ? retired : undefined
          // One watcher per stream wakes a waiting pull when either ends, instead of a race per
          // pull (a race forks two fibers: it cost more than moving the delta it waited for).
          // Closing the hub subscription wakes a delta pull; `stop` wakes a snapshot pull.
          // The same watcher reports the first terminal condition at once, a lag or a stall
          // included: those surface only when the consumer pulls, and a stuck peer never does.
          const stop = yield* Deferred.make<void>()
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
              yield* Deferred.succeed(stop, undefined)
              yield* subscription.close
            }).pipe(Effect.interruptible),
            streamScope
          )
          const unlessEnded = <A>(
            effect: Effect.Effect<A, PublicationError>
          ): Effect.Effect<A, Option.Option<PublicationError>> =>
            Effect.suspend(() => {
              const end = ended()
              if (end !== undefined) return end
              return Effect.interruptible(
                Effect.raceFirst(
                  Effect.mapBoth(effect, { onFailure: Option.some, onSuccess: Option.some }),
                  Effect.as(Deferred.await(stop), Option.none<A>())
                )
              ).pipe(Effect.flatMap((a) => (Option.isSome(a) ? Effect.succeed(a.value) : (ended() ?? END))))
            })

          const sequence = snapshot.sequence
          let taken = 0
          const nextChunk: Effect.Effect<PublicationFrame, Option.Option<PublicationError>> = Effect.suspend(
            () => {
              if (taken === chunks.length) return Effect.fail(Option.none())
              // A chunk already handed over goes out before a stall is reported.
              return unlessEnded(
                Queue.poll(handover).pipe(
                  Effect.flatMap((ready) =>
                    Option.isSome(ready)
                      ? Effect.succeed(ready.value)
                      : Effect.interruptible(Effect.raceFirst(Queue.take(handover), Deferred.await(stalled)))
                  )
                )
              ).pipe(
                Effect.map((payload): PublicationFrame => {
                  taken++
                  return {
                    kind: "SnapshotChunk",
                    identity: expected,
                    baseSequence: sequence,
                    sequence,
                    payload
                  }
                })
              )
            }
          )

          let current = sequence
          // The whole backlog per wake-up: under a burst the actor publishes many deltas per turn,
          // and a consumer that moved one frame per wake-up would fall behind and be lagged. A
          // waiting pull is woken by the watcher above when the stream ends (its subscription is
          // closed): what decides is then the end, not the closed subscription.
          const nextDeltas: Effect.Effect<
            Chunk.Chunk<PublicationFrame>,
            Option.Option<PublicationError>
          > = Effect.suspend(() => {
            const end = ended()
            if (end !== undefined) return end
            return Effect.matchEffect(Effect.interruptible(subscription.recvAll), {
              onFailure: (error) => ended() ?? Effect.fail(Option.some(publicationErrorOf(error))),
              onSuccess: (frames) => {
                const out: Array<PublicationFrame> = []
                for (const frame of frames) {
                  if (frame.baseSequence !== current || frame.sequence !== current + 1n) {
                    const message = `pool stream delta ${frame.baseSequence} -> ${frame.sequence} does not continue sequence ${current}`
                    return Effect.zipRight(
                      fence(expected, message),
                      Effect.fail(Option.some(invalid(message)))
                    )
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
                return Effect.succeed(Chunk.unsafeFromArray(out))
              }
            })
          })

          return Stream.concat(
            Stream.repeatEffectOption(nextChunk),
            Stream.repeatEffectChunkOption(nextDeltas)
          )
        })
      )

    const subscribePool = (
      expected: ProducerIdentity,
      subscriberId: string,
      ended?: Deferred.Deferred<PublicationError>
    ): Effect.Effect<Stream.Stream<PublicationFrame, PublicationError>, PublicationError, Scope.Scope> =>
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
            const stream = yield* restore(open(expected, generation, streamScope, onTerminal)).pipe(
              Effect.onError(() => Scope.close(streamScope, Exit.void))
            )
            // A relay shutdown ends the stream at its next pull (and wakes a waiting one): see
            // `open`. Not `Stream.interruptWhen`, which forks a fiber for every element.
            return stream.pipe(Stream.ensuring(Scope.close(streamScope, Exit.void)))
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

    const shutdown = Effect.sync(() => lifecycle.cancel())
    yield* Effect.addFinalizer(() => shutdown)

    return {
      subscribePool,
      shutdown,
      awaitShutdown: lifecycle.await,
      activeStreams: () => maxActiveStreams - streamPermits.available
    }
  })
