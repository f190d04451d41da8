/**
 * The lazy publication hub of one pool generation (relay-service §3.2, §3.3).
 *
 * A hub holds one actor subscription (the publication lease), a mirror of the producer's bucket
 * words at the last applied sequence, and bounded per-subscriber queues of CBI1 delta frames.
 * Subscribers bootstrap from the mirror image they were handed and continue with the frames
 * queued after it. A subscriber that falls behind is closed as LAGGED; the actor never waits for
 * anyone.
 *
 * `internal/PoolHubSlot.ts` holds the per-generation state machine around a hub (vacant →
 * initializing → ready → evicting / failed / retired) and `HubCoordinator`, which bounds the
 * number of initialized hubs relay-wide, reclaiming idle ones under pressure; `internal/sync.ts`
 * the permits, tokens and wake-ups they share. The hub's errors are in `RelayErrors.ts`.
 *
 * JavaScript runs one fiber at a time: every state transition below is a synchronous block
 * without `yield*`, and every wait goes through an `Effect.async` whose registration re-checks a
 * version, so no wake-up can be lost between a check and the wait.
 */

import {
  Deferred,
  Effect,
  Either,
  Exit,
  Fiber,
  FiberId,
  Metric,
  MetricLabel,
  Option,
  type Scope
} from "effect"
import { CBI1_MAX_DELTA_IMAGES, Cbi1Error, type Cbi1Expected, encodeCbi1Delta } from "../ckf/cbi1.js"
import { LaneLease, type ProducerIdentity } from "../ckf/identity.js"
import type { DcCkfDelta } from "../ckf/publisher.js"
import * as RelayMetrics from "../observability/RelayMetrics.js"
import { InjectedLoopFault, LoopFaults, supervised } from "../observability/Supervised.js"
import type { DeltaReceiver } from "./DeltaBroadcast.js"
import { type EncodingPermits, makeEncodingPermits } from "./internal/sync.js"
import type { ActorSubscription, PoolActor } from "./PoolActor.js"
import {
  HubStartFailed,
  InvalidHubPublication,
  InvalidPublicationHubConfig,
  PublicationUnavailable,
  SubscriberLagged,
  SubscriberLimit
} from "./RelayErrors.js"

// ---------------------------------------------------------------------------------------------
// Defaults

/** The supervised loop name of every hub's consumer fiber (`kvrelay_supervised_restarts_total`). */
export const PUBLICATION_HUB_LOOP = "relay.publication-hub"

const DEFAULT_QUEUE_CAPACITY = 16
const DEFAULT_QUEUE_BYTES = 16 * 1024 * 1024
const DEFAULT_MAX_SUBSCRIBERS = 64
/** Publication hubs holding a mirror at once, by default. */
export const DEFAULT_MAX_INITIALIZED_POOL_HUBS = 64
/** What one queued frame costs a subscriber beyond its payload. */
export const FRAME_OVERHEAD_BYTES = 256
/** The smallest byte bound that still admits one largest delta frame. */
export const minQueueBytes = (maxDeltaImages: number): number =>
  48 + 12 + 12 * maxDeltaImages + FRAME_OVERHEAD_BYTES

/** The lease the hub holds on its actor: lane 0 of the relay incarnation, epoch = layout generation. */
export const publicationLease = (identity: ProducerIdentity): LaneLease =>
  new LaneLease(identity.producerIncarnation, 0, identity.layoutGeneration)

/** The error a stream ends with when its pool generation retired. */
export const generationRetired = (): PublicationUnavailable =>
  new PublicationUnavailable({ reason: "pool generation retired" })

// ---------------------------------------------------------------------------------------------
// Metrics

const subscriberLagged = RelayMetrics.subscriberLagged.pipe(Metric.tagged("stream", "pool"))

const subscriberLimitRejected = RelayMetrics.subscriberLimitRejected.pipe(Metric.tagged("stream", "pool"))

/** Counted inside synchronous state transitions, where no effect may run. */
export const countLimitRejection = (scope: "per_pool" | "initialized_hub"): void =>
  subscriberLimitRejected.unsafeUpdate(1, [MetricLabel.make("scope", scope)])

// ---------------------------------------------------------------------------------------------
// Configuration

/** A publication hub's queues, limits and time-outs. */
export interface PublicationHubConfig {
  /** Frames queued per subscriber (default 16). */
  readonly queueCapacity: number
  /** Bytes queued per subscriber, each frame costing payload + 256 (default 16 MiB). */
  readonly queueBytes: number
  /** Subscribers per pool (default 64). */
  readonly maxSubscribers: number
  /** Larger deltas make the hub resubscribe instead of publishing them (default the CBI1 maximum). */
  readonly maxDeltaImages: number
  /** Shared by every hub of the relay (default 2 permits). */
  readonly encodingPermits: EncodingPermits
  /** Test hook: initialization waits on this before subscribing to the actor. */
  readonly initializationGate?: Effect.Effect<void> | undefined
  /** Test hook: initialization waits on this after the actor handed out its snapshot. */
  readonly postSnapshotGate?: Effect.Effect<void> | undefined
}

/** A hub configuration from defaults and `overrides`, each value checked. */
export const makePublicationHubConfig = (
  overrides: Partial<PublicationHubConfig> = {}
): Either.Either<PublicationHubConfig, InvalidPublicationHubConfig> => {
  const config: PublicationHubConfig = {
    queueCapacity: DEFAULT_QUEUE_CAPACITY,
    queueBytes: DEFAULT_QUEUE_BYTES,
    maxSubscribers: DEFAULT_MAX_SUBSCRIBERS,
    maxDeltaImages: CBI1_MAX_DELTA_IMAGES,
    encodingPermits: overrides.encodingPermits ?? makeEncodingPermits(),
    ...overrides
  }
  const positive = (field: string, value: number) =>
    Number.isSafeInteger(value) && value > 0
      ? undefined
      : new InvalidPublicationHubConfig({ field, detail: `must be a positive integer, got ${value}` })
  const problem =
    positive("queueCapacity", config.queueCapacity) ??
    positive("maxSubscribers", config.maxSubscribers) ??
    positive("maxDeltaImages", config.maxDeltaImages) ??
    (config.maxDeltaImages > CBI1_MAX_DELTA_IMAGES
      ? new InvalidPublicationHubConfig({
          field: "maxDeltaImages",
          detail: `must be at most ${CBI1_MAX_DELTA_IMAGES}, got ${config.maxDeltaImages}`
        })
      : undefined) ??
    (!Number.isSafeInteger(config.queueBytes) || config.queueBytes < minQueueBytes(config.maxDeltaImages)
      ? new InvalidPublicationHubConfig({
          field: "queueBytes",
          detail: `must hold one largest delta frame (${minQueueBytes(config.maxDeltaImages)} bytes), got ${config.queueBytes}`
        })
      : undefined)
  return problem === undefined ? Either.right(config) : Either.left(problem)
}

// ---------------------------------------------------------------------------------------------
// Mirror and subscribers

/** One mirror image; `holders` counts subscribers that were handed it and did not release it yet. */
class MirrorImage {
  holders = 0
  constructor(readonly words: Uint32Array) {}
}

interface HubSnapshot {
  readonly identity: ProducerIdentity
  readonly lease: LaneLease
  readonly sequence: bigint
  /** Every bucket word as `[lo, hi]` pairs; shared with the hub until released, never mutated. */
  readonly words: Uint32Array
}

/** One CBI1 delta frame as queued for a subscriber. */
export interface HubFrame {
  readonly baseSequence: bigint
  readonly sequence: bigint
  readonly payload: Uint8Array
}

type SubscriberCloseReason = "Active" | "Lagged" | "Retired"

/** A subscriber of one hub. One fiber at a time may `recv`. */
export interface HubSubscription {
  readonly id: number
  readonly identity: ProducerIdentity
  /** The mirror at subscription time, until `releaseSnapshot`. */
  readonly snapshot: HubSnapshot | undefined
  readonly releaseSnapshot: () => void
  /** The next frame; LAGGED ⇒ `SubscriberLagged`, any other closure ⇒ `PublicationUnavailable`. */
  readonly recv: Effect.Effect<HubFrame, SubscriberLagged | PublicationUnavailable>
  /**
   * Every queued frame (at least one, waiting for it), in order. A writer that takes the whole
   * backlog per wake-up keeps up with the actor's bursts; one frame per wake-up does not.
   */
  readonly recvAll: Effect.Effect<ReadonlyArray<HubFrame>, SubscriberLagged | PublicationUnavailable>
  /**
   * `recvAll` for a consumer driven by callbacks instead of a fiber: every queued frame (none
   * when nothing is queued), or the closure's error once closed. It never waits.
   */
  readonly pollAll: () => ReadonlyArray<HubFrame> | SubscriberLagged | PublicationUnavailable
  /**
   * Calls `wake` whenever a frame is queued or the subscriber is closed, until replaced
   * (`undefined` removes it). It shares `recv`'s single waiter: use one form or the other. It is
   * called from the hub's loop, so it must not throw and should defer real work.
   */
  readonly onReady: (wake: (() => void) | undefined) => void
  readonly closeReason: SubscriberCloseReason
  /**
   * Completes with the reason once the subscriber is closed, as lagged or retired, by whoever
   * closed it. Its owner learns of a lag here at once, not at its next `recv`, which a peer that
   * stopped reading may never make.
   */
  readonly closed: Effect.Effect<"Lagged" | "Retired">
  readonly queuedFrames: number
  readonly queuedBytes: number
  /** Leaves the hub and releases the snapshot. */
  readonly close: Effect.Effect<void>
}

const NO_FRAMES: ReadonlyArray<HubFrame> = []
const RETIRED_SUBSCRIPTION = new PublicationUnavailable({
  reason: "publication subscription closed; it requires a fresh snapshot"
})

class HubSubscriber implements HubSubscription {
  private readonly frames: Array<HubFrame> = []
  private bytes = 0
  private reason: SubscriberCloseReason = "Active"
  private waiter: (() => void) | undefined = undefined
  private heldImage: MirrorImage | undefined
  private heldSnapshot: HubSnapshot | undefined
  private readonly closedSignal = Deferred.unsafeMake<"Lagged" | "Retired">(FiberId.none)
  readonly closed: Effect.Effect<"Lagged" | "Retired"> = Deferred.await(this.closedSignal)

  constructor(
    readonly id: number,
    private readonly hub: PublicationHub,
    private readonly capacity: number,
    private readonly byteLimit: number,
    image: MirrorImage,
    snapshot: HubSnapshot
  ) {
    image.holders++
    this.heldImage = image
    this.heldSnapshot = snapshot
  }

  get identity(): ProducerIdentity {
    return this.hub.identity
  }

  get snapshot(): HubSnapshot | undefined {
    return this.heldSnapshot
  }

  get closeReason(): SubscriberCloseReason {
    return this.reason
  }

  get queuedFrames(): number {
    return this.frames.length
  }

  get queuedBytes(): number {
    return this.bytes
  }

  readonly releaseSnapshot = (): void => {
    if (this.heldImage === undefined) return
    this.heldImage.holders--
    this.heldImage = undefined
    this.heldSnapshot = undefined
  }

  /** Queues a frame; false when the subscriber is (now) closed. */
  offer(frame: HubFrame): boolean {
    if (this.reason !== "Active") return false
    const cost = frame.payload.length + FRAME_OVERHEAD_BYTES
    // The byte reservation is checked before the message count, as in the seed.
    if (cost > this.byteLimit - this.bytes || this.frames.length >= this.capacity) {
      this.shut("Lagged")
      return false
    }
    this.frames.push(frame)
    this.bytes += cost
    this.wake()
    return true
  }

  /**
   * Queued frames are dropped: a closed subscriber needs a fresh snapshot whatever it still had
   * queued, and a lagging one should not keep up to 16 MiB alive while it catches up. The held
   * snapshot stays until the consumer releases it, because it may still be encoding from it.
   */
  shut(reason: "Lagged" | "Retired"): void {
    if (this.reason !== "Active") return
    this.reason = reason
    this.frames.length = 0
    this.bytes = 0
    this.wake()
    Deferred.unsafeDone(this.closedSignal, Exit.succeed(reason))
  }

  private wake(): void {
    const waiter = this.waiter
    if (waiter !== undefined) waiter()
  }

  readonly recv: Effect.Effect<HubFrame, SubscriberLagged | PublicationUnavailable> = Effect.map(
    Effect.suspend(() => this.receive(1)),
    (frames) => frames[0]!
  )

  readonly recvAll: Effect.Effect<ReadonlyArray<HubFrame>, SubscriberLagged | PublicationUnavailable> =
    Effect.suspend(() => this.receive(Number.POSITIVE_INFINITY))

  readonly pollAll = (): ReadonlyArray<HubFrame> | SubscriberLagged | PublicationUnavailable =>
    this.take(Number.POSITIVE_INFINITY)

  /** Up to `max` queued frames, the closure's error once closed, or none (nothing queued yet). */
  private take(max: number): ReadonlyArray<HubFrame> | SubscriberLagged | PublicationUnavailable {
    if (this.frames.length > 0) {
      const taken = this.frames.length <= max ? this.frames.splice(0) : this.frames.splice(0, max)
      for (const frame of taken) this.bytes -= frame.payload.length + FRAME_OVERHEAD_BYTES
      return taken
    }
    if (this.reason === "Lagged") return new SubscriberLagged({ poolId: this.hub.identity.poolId })
    if (this.reason === "Retired") return RETIRED_SUBSCRIPTION
    return NO_FRAMES
  }

  readonly onReady = (wake: (() => void) | undefined): void => {
    this.waiter = wake
  }

  private receive(
    max: number
  ): Effect.Effect<ReadonlyArray<HubFrame>, SubscriberLagged | PublicationUnavailable> {
    return Effect.async((resume) => {
      const attempt = (): boolean => {
        const next = this.take(max)
        if (next === NO_FRAMES) return false
        resume(
          Array.isArray(next)
            ? Effect.succeed(next)
            : Effect.fail(next as SubscriberLagged | PublicationUnavailable)
        )
        return true
      }
      if (attempt()) return
      const waiter = () => {
        if (attempt()) this.waiter = undefined
      }
      this.waiter = waiter
      return Effect.sync(() => {
        if (this.waiter === waiter) this.waiter = undefined
      })
    })
  }

  readonly close: Effect.Effect<void> = Effect.sync(() => {
    this.shut("Retired")
    this.releaseSnapshot()
    this.hub.detachSubscriber(this.id)
  })
}

// ---------------------------------------------------------------------------------------------
// The hub

/**
 * The relay's publication hubs at one moment (the `kv_dc_relay_*_publication_hub_count` gauges):
 * pools whose hub a subscriber asked for (still starting, serving, being evicted or failed), hubs
 * holding a mirror (serving or being evicted), hubs serving a contiguous mirror, and serving hubs
 * nobody subscribes to (the ones reclaimed first under the initialized-hub limit).
 */
export interface PublicationHubCounts {
  readonly requested: number
  readonly initialized: number
  readonly ready: number
  readonly idle: number
}

interface PublicationHubStats {
  readonly ready: boolean
  readonly lastError: string | undefined
  readonly sequence: bigint
  readonly subscribers: number
  readonly mirrorShared: boolean
  readonly recoveries: number
  readonly publishedFrames: number
  readonly laggedSubscribers: number
}

/**
 * One pool's publication: a mirror of its filter that serves snapshots and fans deltas out to
 * subscribers.
 */
export class PublicationHub {
  private ready = true
  private stopped = false
  private lastError: string | undefined = undefined
  private sequence: bigint
  private image: MirrorImage
  private receiver: DeltaReceiver
  private readonly subscribers = new Map<number, HubSubscriber>()
  private nextSubscriberId = 1
  private loop: Fiber.RuntimeFiber<void> | undefined = undefined
  private readonly expected: Cbi1Expected
  private recoveries = 0
  private publishedFrames = 0
  private laggedSubscribers = 0

  /** Use `startPublicationHub`. */
  constructor(
    readonly actor: PoolActor,
    readonly lease: LaneLease,
    private readonly config: PublicationHubConfig,
    private readonly onTerminalFailure: (reason: string) => Effect.Effect<void>,
    subscription: ActorSubscription
  ) {
    this.sequence = subscription.snapshot.sequence
    this.image = new MirrorImage(subscription.snapshot.words)
    this.receiver = subscription.deltas
    this.expected = { format: actor.identity.format, dcId: actor.identity.dcId.value }
  }

  get identity(): ProducerIdentity {
    return this.actor.identity
  }

  get isReady(): boolean {
    return this.ready
  }

  get stats(): PublicationHubStats {
    return {
      ready: this.ready,
      lastError: this.lastError,
      sequence: this.sequence,
      subscribers: this.subscribers.size,
      mirrorShared: this.image.holders > 0,
      recoveries: this.recoveries,
      publishedFrames: this.publishedFrames,
      laggedSubscribers: this.laggedSubscribers
    }
  }

  /** Hands out the current mirror image and a queue that continues exactly after it. */
  subscribe(): Either.Either<HubSubscription, PublicationUnavailable | SubscriberLimit> {
    if (!this.ready) {
      return Either.left(new PublicationUnavailable({ reason: this.lastError ?? "stopped" }))
    }
    if (this.subscribers.size >= this.config.maxSubscribers) {
      countLimitRejection("per_pool")
      return Either.left(
        new SubscriberLimit({ poolId: this.identity.poolId, limit: this.config.maxSubscribers })
      )
    }
    const id = this.nextSubscriberId++
    const snapshot: HubSnapshot = {
      identity: this.identity,
      lease: this.lease,
      sequence: this.sequence,
      words: this.image.words
    }
    const subscriber = new HubSubscriber(
      id,
      this,
      this.config.queueCapacity,
      this.config.queueBytes,
      this.image,
      snapshot
    )
    this.subscribers.set(id, subscriber)
    return Either.right(subscriber)
  }

  /** @internal */
  detachSubscriber(id: number): void {
    this.subscribers.delete(id)
  }

  /** Claims the hub for idle eviction: only a ready hub without subscribers or a shared image. */
  tryBeginIdleEviction(): boolean {
    if (!this.ready || this.subscribers.size > 0 || this.image.holders > 0) return false
    this.ready = false
    this.lastError = "claimed"
    return true
  }

  /** Stops publishing and closes every subscriber as RETIRED; does not wait for the loop. */
  readonly retire: Effect.Effect<void> = Effect.suspend(() => {
    const wasStopped = this.stopped
    this.stopped = true
    this.ready = false
    this.closeSubscribers("Retired")
    const loop = this.loop
    // A hub that stopped itself (terminal failure) is retired from inside its own loop.
    return wasStopped || loop === undefined ? Effect.void : Fiber.interruptFork(loop)
  })

  /** `retire` and wait for the loop to end; the actor's receiver is closed. */
  readonly shutdown: Effect.Effect<void> = Effect.suspend(() => {
    const loop = this.loop
    return Effect.zipRight(
      this.retire,
      Effect.zipRight(loop === undefined ? Effect.void : Fiber.await(loop), this.receiver.close)
    )
  })

  /** Stops the loop and drops the actor's publication lease; later batches go to the next snapshot. */
  readonly evictIdle: Effect.Effect<Either.Either<void, string>> = Effect.gen(this, function* () {
    this.stopped = true
    this.ready = false
    const loop = this.loop
    if (loop !== undefined) yield* Fiber.interrupt(loop)
    this.closeSubscribers("Retired")
    yield* this.receiver.close
    const retired = yield* Effect.either(this.actor.retirePublicationLease)
    return Either.mapLeft(retired, (error) => `failed to retire the publication lease: ${error.message}`)
  })

  /** @internal started by `startPublicationHub` */
  attachLoop(loop: Fiber.RuntimeFiber<void>): void {
    this.loop = loop
  }

  private closeSubscribers(reason: "Lagged" | "Retired"): void {
    for (const subscriber of this.subscribers.values()) subscriber.shut(reason)
    this.subscribers.clear()
  }

  private validate(delta: DcCkfDelta): InvalidHubPublication | undefined {
    if (!delta.identity.equals(this.identity)) {
      return new InvalidHubPublication({
        reason: "IdentityChanged",
        detail: `publication identity changed from ${this.identity.key} to ${delta.identity.key}`
      })
    }
    if (!delta.lease.equals(this.lease)) {
      return new InvalidHubPublication({
        reason: "LeaseChanged",
        detail: `publication lease changed from ${this.lease} to ${delta.lease}`
      })
    }
    if (delta.baseSequence !== this.sequence || delta.sequence !== this.sequence + 1n) {
      return new InvalidHubPublication({
        reason: "SequenceGap",
        detail: `publication sequence gap: mirror at ${this.sequence}, delta ${delta.baseSequence} -> ${delta.sequence}`
      })
    }
    const bucketCount = this.identity.format.bucketCount
    const images = delta.images
    for (let i = 0; i < images.length; i += 3) {
      if (images[i]! >= bucketCount) {
        return new InvalidHubPublication({
          reason: "BucketOutOfRange",
          detail: `publication bucket ${images[i]} is outside the ${bucketCount}-bucket filter`
        })
      }
    }
    return undefined
  }

  /** Copy-on-write: a subscriber still bootstrapping from the current image keeps it unchanged. */
  private apply(delta: DcCkfDelta): void {
    let image = this.image
    if (image.holders > 0) {
      image = new MirrorImage(image.words.slice())
      this.image = image
    }
    const words = image.words
    const images = delta.images
    for (let i = 0; i < images.length; i += 3) {
      const bucket = images[i]!
      words[2 * bucket] = images[i + 1]!
      words[2 * bucket + 1] = images[i + 2]!
    }
    this.sequence = delta.sequence
  }

  /**
   * Publishes before the new image is installed: a subscriber that joined while this frame was
   * being encoded holds the previous image and needs the frame. Both happen in one synchronous
   * step, so nobody can join in between.
   */
  private publish(delta: DcCkfDelta, payload: Uint8Array): number {
    const frame: HubFrame = { baseSequence: delta.baseSequence, sequence: delta.sequence, payload }
    let lagged = 0
    for (const [id, subscriber] of this.subscribers) {
      if (!subscriber.offer(frame)) {
        this.subscribers.delete(id)
        lagged++
      }
    }
    this.apply(delta)
    this.publishedFrames++
    this.laggedSubscribers += lagged
    return lagged
  }

  private fail(reason: string): Effect.Effect<void> {
    return Effect.suspend(() => {
      if (this.stopped) return Effect.void
      this.stopped = true
      this.ready = false
      this.lastError = reason
      this.closeSubscribers("Retired")
      return Effect.all(
        [
          this.receiver.close,
          Effect.logError("KV DC Relay publication hub failed").pipe(Effect.annotateLogs("reason", reason)),
          // The callback withdraws the generation from the catalog; it must not be cut short.
          Effect.uninterruptible(this.onTerminalFailure(reason))
        ],
        { discard: true }
      )
    })
  }

  /** Resubscribes to the actor and retires every subscriber; false when the hub stopped instead. */
  private recover(reason: string): Effect.Effect<boolean> {
    return Effect.gen(this, function* () {
      yield* Effect.logWarning("KV DC Relay publication hub resubscribing to its actor").pipe(
        Effect.annotateLogs("reason", reason)
      )
      yield* this.receiver.close
      const next = yield* Effect.either(this.actor.subscribe(this.lease))
      if (this.stopped) {
        if (Either.isRight(next)) yield* next.right.deltas.close
        return false
      }
      if (Either.isLeft(next)) {
        yield* this.fail(`publication recovery failed: ${next.left.message}`)
        return false
      }
      const subscription = next.right
      const problem = snapshotProblem(subscription, this.identity, this.lease)
      if (problem !== undefined) {
        yield* subscription.deltas.close
        yield* this.fail(problem)
        return false
      }
      this.receiver = subscription.deltas
      this.image = new MirrorImage(subscription.snapshot.words)
      this.sequence = subscription.snapshot.sequence
      this.recoveries++
      this.closeSubscribers("Retired")
      return true
    })
  }

  /**
   * @internal the hub's single consumer fiber, supervised: after a defect the mirror may be half
   * updated, so the restarted loop first resubscribes to its actor (a fresh snapshot; every
   * subscriber is retired and reconnects), as after lag.
   */
  supervisedRun(): Effect.Effect<void> {
    let runs = 0
    return supervised(
      PUBLICATION_HUB_LOOP,
      Effect.suspend(() =>
        runs++ === 0
          ? this.run()
          : Effect.flatMap(this.recover("the publication loop restarted after a defect"), (recovered) =>
              recovered ? this.run() : Effect.void
            )
      )
    )
  }

  private run(): Effect.Effect<void> {
    return Effect.gen(this, function* () {
      const faults = yield* LoopFaults
      while (!this.stopped) {
        const next = yield* Effect.either(this.receiver.take)
        if (this.stopped) return
        if (faults.take(PUBLICATION_HUB_LOOP))
          return yield* Effect.die(new InjectedLoopFault(PUBLICATION_HUB_LOOP))
        if (Either.isLeft(next)) {
          if (next.left._tag === "DeltaStreamLagged") {
            if (yield* this.recover("the actor publication receiver lagged")) continue
            return
          }
          return yield* this.fail("actor publication stream closed")
        }
        const delta = next.right
        const imageCount = delta.images.length / 3
        if (imageCount > this.config.maxDeltaImages) {
          const reason = `a delta of ${imageCount} images exceeds the ${this.config.maxDeltaImages}-image frame limit`
          if (yield* this.recover(reason)) continue
          return
        }
        const problem = this.validate(delta)
        if (problem !== undefined) return yield* this.fail(problem.message)
        if (this.subscribers.size === 0) {
          this.apply(delta)
          continue
        }
        const encode = () => encodeCbi1Delta(this.expected, delta.baseSequence, delta.sequence, delta.images)
        const permits = this.config.encodingPermits
        const free = permits.runIfFree(encode)
        const encoded = Option.isSome(free)
          ? Either.right(free.value)
          : yield* Effect.either(permits.withPermit(Effect.sync(encode)))
        if (this.stopped) return
        if (Either.isLeft(encoded)) return yield* this.fail(encoded.left.message)
        if (encoded.right instanceof Cbi1Error) {
          return yield* this.fail(`CBI1 delta encoding failed: ${encoded.right.message}`)
        }
        const lagged = this.publish(delta, encoded.right)
        if (lagged > 0) {
          yield* Metric.incrementBy(subscriberLagged, lagged)
          yield* Effect.logWarning("KV DC Relay publication subscribers lagged and were closed").pipe(
            Effect.annotateLogs("lagged", lagged)
          )
        }
      }
    }).pipe(
      Effect.annotateLogs({
        poolId: this.identity.poolId.toString(),
        layoutGeneration: String(this.identity.layoutGeneration)
      })
    )
  }
}

const snapshotProblem = (
  subscription: ActorSubscription,
  identity: ProducerIdentity,
  lease: LaneLease
): string | undefined => {
  if (!subscription.snapshot.identity.equals(identity)) {
    return `publication identity changed from ${identity.key} to ${subscription.snapshot.identity.key}`
  }
  if (!subscription.snapshot.lease.equals(lease)) {
    return `publication lease changed from ${lease} to ${subscription.snapshot.lease}`
  }
  return undefined
}

interface StartPublicationHubOptions {
  readonly actor: PoolActor
  readonly config: PublicationHubConfig
  /** Called (uninterruptibly) once with the reason when the hub fails for good. */
  readonly onTerminalFailure: (reason: string) => Effect.Effect<void>
  /** Where the hub's loop runs: the generation's hub scope. */
  readonly scope: Scope.Scope
}

/** Subscribes to the actor with the publication lease and starts the hub's loop in `scope`. */
export const startPublicationHub = (
  options: StartPublicationHubOptions
): Effect.Effect<PublicationHub, HubStartFailed> => {
  const { actor, config } = options
  const lease = publicationLease(actor.identity)
  return Effect.uninterruptibleMask((restore) =>
    Effect.gen(function* () {
      if (config.initializationGate !== undefined) yield* restore(config.initializationGate)
      const subscription = yield* restore(actor.subscribe(lease)).pipe(
        Effect.mapError(
          (error) => new HubStartFailed({ reason: `actor subscription failed: ${error.message}` })
        )
      )
      return yield* Effect.gen(function* () {
        if (config.postSnapshotGate !== undefined) yield* restore(config.postSnapshotGate)
        const problem = snapshotProblem(subscription, actor.identity, lease)
        if (problem !== undefined) return yield* Effect.fail(new HubStartFailed({ reason: problem }))
        const hub = new PublicationHub(actor, lease, config, options.onTerminalFailure, subscription)
        hub.attachLoop(yield* Effect.forkIn(Effect.interruptible(hub.supervisedRun()), options.scope))
        return hub
      }).pipe(Effect.onExit((exit) => (Exit.isSuccess(exit) ? Effect.void : subscription.deltas.close)))
    })
  ).pipe(
    Effect.withSpan("PublicationHub.initialize", {
      attributes: {
        poolId: actor.identity.poolId.toString(),
        layoutGeneration: String(actor.identity.layoutGeneration)
      }
    })
  )
}
