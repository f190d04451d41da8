/**
 * Publication hub fan-out: 1,000-image deltas through one hub to 64 draining subscribers, against
 * the bare CBI1 delta encoder over the same deltas in the same run.
 *
 * The hub encodes each delta once, applies it to its mirror and queues the shared frame on every
 * subscriber; the subscribers are fibers that drain their queues. Deltas are offered in windows
 * of 8 (half the per-subscriber frame bound) and the next window waits until every subscriber has
 * taken the previous one, so the default bounds hold and nobody is closed as lagged.
 */

import { performance } from "node:perf_hooks"
import { Deferred, Effect, Fiber, Option, Queue } from "effect"
import { DEFAULT_SEED } from "../src/ckf/addressing.js"
import { encodeCbi1Delta } from "../src/ckf/cbi1.js"
import {
  CacheSemanticsId,
  DcCkfFormatIdentity,
  DcId,
  IndexerDomainId,
  type LaneLease,
  PoolId,
  ProducerIdentity,
  RoutingScopeId
} from "../src/ckf/identity.js"
import type { DcCkfDelta } from "../src/ckf/publisher.js"
import type { DeltaReceiver } from "../src/relay/DeltaBroadcast.js"
import { makeEncodingPermits } from "../src/relay/internal/sync.js"
import type { ActorFault, PoolActor } from "../src/relay/PoolActor.js"
import {
  makePublicationHubConfig,
  publicationLease,
  startPublicationHub
} from "../src/relay/PublicationHub.js"
import { type BenchContext, HashStream, record } from "./harness.js"

const SUBSCRIBERS = 64
const IMAGES_PER_DELTA = 1_000
const WINDOW = 8
const BUCKET_COUNT = 524_288

const identity = (): ProducerIdentity =>
  new ProducerIdentity(
    new PoolId(
      new IndexerDomainId(
        new CacheSemanticsId(new Uint8Array(16).fill(1), "explicit"),
        new RoutingScopeId(new Uint8Array(16).fill(2), "explicit")
      ),
      new DcId(3n)
    ),
    7n,
    1n,
    new DcCkfFormatIdentity(DEFAULT_SEED, BUCKET_COUNT)
  )

/** `count` contiguous deltas of 1,000 absolute images each, starting after sequence 0. */
const makeDeltas = (producer: ProducerIdentity, lease: LaneLease, count: number): Array<DcCkfDelta> => {
  const stream = new HashStream(17)
  const pair = new Uint32Array(2)
  const deltas: Array<DcCkfDelta> = []
  for (let d = 0; d < count; d++) {
    const images = new Uint32Array(3 * IMAGES_PER_DELTA)
    for (let i = 0; i < IMAGES_PER_DELTA; i++) {
      stream.next(pair, 0)
      images[3 * i] = pair[0]! & (BUCKET_COUNT - 1)
      images[3 * i + 1] = pair[1]!
      images[3 * i + 2] = pair[0]! ^ pair[1]!
    }
    deltas.push({ identity: producer, lease, baseSequence: BigInt(d), sequence: BigInt(d + 1), images })
  }
  return deltas
}

/** An actor that only serves the hub: one subscription whose deltas the benchmark pushes. */
const scriptedActor = (producer: ProducerIdentity, queue: Queue.Queue<DcCkfDelta>) =>
  Effect.gen(function* () {
    const unused = Effect.dieMessage("not used by the publication hub")
    const deltas: DeltaReceiver = {
      take: Queue.take(queue),
      poll: Effect.succeed(Option.none()),
      close: Effect.void
    }
    const actor: PoolActor = {
      identity: producer,
      canonical: true,
      subscribe: (lease) =>
        Effect.succeed({
          snapshot: { identity: producer, lease, sequence: 0n, words: new Uint32Array(2 * BUCKET_COUNT) },
          deltas
        }),
      retirePublicationLease: Effect.void,
      admitEvent: () => unused,
      admitEventsNow: () => false,
      replaceRanks: () => unused,
      replaceRank: () => unused,
      resetRank: () => unused,
      markHistoryPartial: () => unused,
      flush: unused,
      snapshot: unused,
      stateStats: unused,
      memberCounts: unused,
      queryWorkers: () => unused,
      queryWorkersNow: () => undefined,
      shutdown: unused,
      fence: unused,
      faults: yield* Queue.bounded<ActorFault>(1),
      mailboxDepth: Effect.succeed(0),
      mailboxCapacity: 1,
      awaitStopped: Effect.void,
      diagnostics: unused,
      pause: unused
    }
    return actor
  })

/** Seconds to deliver every delta to every subscriber through a fresh hub. */
const runFanout = (deltas: ReadonlyArray<DcCkfDelta>) =>
  Effect.gen(function* () {
    const producer = deltas[0]!.identity
    const queue = yield* Queue.unbounded<DcCkfDelta>()
    const actor = yield* scriptedActor(producer, queue)
    const config = makePublicationHubConfig({ encodingPermits: makeEncodingPermits(2) })
    if (config._tag === "Left") return yield* Effect.die(config.left)
    const hub = yield* startPublicationHub({
      actor,
      config: config.right,
      onTerminalFailure: (reason) => Effect.die(new Error(`hub failed: ${reason}`)),
      scope: yield* Effect.scope
    })
    // The consumer that completes a window wakes the producer: no polling in the timed region.
    let windowEnd = 0
    let pending = SUBSCRIBERS
    let windowDone = yield* Deferred.make<void>()
    const consumers: Array<Fiber.RuntimeFiber<never, unknown>> = []
    for (let s = 0; s < SUBSCRIBERS; s++) {
      const subscription = hub.subscribe()
      if (subscription._tag === "Left") return yield* Effect.die(subscription.left)
      subscription.right.releaseSnapshot()
      const recv = subscription.right.recv
      consumers.push(
        yield* Effect.fork(
          Effect.forever(
            Effect.flatMap(recv, (frame) => {
              if (Number(frame.sequence) !== windowEnd || --pending > 0) return Effect.void
              return Deferred.succeed(windowDone, undefined)
            })
          )
        )
      )
    }
    const start = performance.now()
    for (let next = 0; next < deltas.length; next += WINDOW) {
      windowEnd = Math.min(deltas.length, next + WINDOW)
      pending = SUBSCRIBERS
      windowDone = yield* Deferred.make<void>()
      yield* Queue.offerAll(queue, deltas.slice(next, windowEnd))
      yield* Deferred.await(windowDone)
      if (hub.stats.laggedSubscribers > 0) return yield* Effect.dieMessage("a subscriber lagged")
    }
    const seconds = (performance.now() - start) / 1000
    for (const consumer of consumers) yield* Fiber.interrupt(consumer)
    return seconds
  }).pipe(Effect.scoped)

export const benchHubFanout = async (ctx: BenchContext): Promise<void> => {
  const producer = identity()
  const lease = publicationLease(producer)
  const count = ctx.quick ? 256 : 2_048
  const deltas = makeDeltas(producer, lease, count)
  const expected = { format: producer.format, dcId: producer.dcId.value }
  const rounds = ctx.quick ? 2 : 4

  let bestEncode = Number.POSITIVE_INFINITY
  let bestFanout = Number.POSITIVE_INFINITY
  // Interleaved rounds so both sides see the same machine state; one warm-up of each first.
  for (let round = -1; round < rounds; round++) {
    const start = performance.now()
    let bytes = 0
    for (const delta of deltas) {
      const frame = encodeCbi1Delta(expected, delta.baseSequence, delta.sequence, delta.images)
      if (!(frame instanceof Uint8Array)) throw frame
      bytes += frame.length
    }
    const encodeSeconds = (performance.now() - start) / 1000
    if (bytes === 0) throw new Error("nothing encoded")
    const fanoutSeconds = await Effect.runPromise(runFanout(deltas))
    if (round >= 0) {
      bestEncode = Math.min(bestEncode, encodeSeconds)
      bestFanout = Math.min(bestFanout, fanoutSeconds)
    }
  }

  const encodeRate = count / bestEncode
  const fanoutRate = count / bestFanout
  record(
    ctx,
    "hub_fanout_deltas",
    "deltas/s",
    fanoutRate,
    encodeRate,
    `${IMAGES_PER_DELTA}-image deltas to ${SUBSCRIBERS} subscribers vs bare encodeCbi1Delta`
  )
  record(
    ctx,
    "hub_fanout_frames",
    "frames/s",
    fanoutRate * SUBSCRIBERS,
    encodeRate,
    "frames delivered (deltas × subscribers) vs frames encoded by the bare encoder"
  )
}
