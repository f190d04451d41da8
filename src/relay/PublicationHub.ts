/**
 * The lazy publication hub of one pool generation (relay-service §3.2, §3.3).
 *
 * A hub holds one actor subscription (the publication lease), a mirror of the producer's bucket
 * words at the last applied sequence, and bounded per-subscriber queues of CBI1 delta frames.
 * Subscribers bootstrap from the mirror image they were handed and continue with the frames
 * queued after it. A subscriber that falls behind is closed as LAGGED; the actor never waits for
 * anyone.
 *
 * `PoolHubSlot` is the per-generation state machine around a hub (vacant → initializing → ready
 * → evicting / failed / retired), and `HubCoordinator` bounds the number of initialized hubs
 * relay-wide, reclaiming idle ones under pressure.
 *
 * JavaScript runs one fiber at a time: every state transition below is a synchronous block
 * without `yield*`, and every wait goes through an `Effect.async` whose registration re-checks a
 * version, so no wake-up can be lost between a check and the wait.
 */

import {
  Data,
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
import { LaneLease, type PoolId, type ProducerIdentity } from "../ckf/identity.js"
import type { DcCkfDelta } from "../ckf/publisher.js"
import { InjectedLoopFault, LoopFaults, supervised } from "../observability/Supervised.js"
import type { DeltaReceiver } from "./DeltaBroadcast.js"
import type { ActorSubscription, PoolActor } from "./PoolActor.js"

// ---------------------------------------------------------------------------------------------
// Defaults

/** The supervised loop name of every hub's consumer fiber (`kvrelay_supervised_restarts_total`). */
export const PUBLICATION_HUB_LOOP = "relay.publication-hub"

export const DEFAULT_QUEUE_CAPACITY = 16
export const DEFAULT_QUEUE_BYTES = 16 * 1024 * 1024
export const DEFAULT_MAX_SUBSCRIBERS = 64
export const DEFAULT_ENCODING_CONCURRENCY = 2
export const DEFAULT_MAX_INITIALIZED_POOL_HUBS = 64
/** What one queued frame costs a subscriber beyond its payload. */
export const FRAME_OVERHEAD_BYTES = 256
/** The smallest byte bound that still admits one largest delta frame. */
export const minQueueBytes = (maxDeltaImages: number): number =>
  48 + 12 + 12 * maxDeltaImages + FRAME_OVERHEAD_BYTES

/** The lease the hub holds on its actor: lane 0 of the relay incarnation, epoch = layout generation. */
export const publicationLease = (identity: ProducerIdentity): LaneLease =>
  new LaneLease(identity.producerIncarnation, 0, identity.layoutGeneration)

// ---------------------------------------------------------------------------------------------
// Errors

export class UnknownPool extends Data.TaggedError("UnknownPool")<{ readonly poolId: PoolId }> {
  override get message(): string {
    return `unknown or inactive pool ${this.poolId}`
  }
}

export class ProducerMismatch extends Data.TaggedError("ProducerMismatch")<{ readonly poolId: PoolId }> {
  override get message(): string {
    return `pool ${this.poolId} is published by a different producer generation`
  }
}

export class PublicationUnavailable extends Data.TaggedError("PublicationUnavailable")<{
  readonly reason: string
}> {
  override get message(): string {
    return this.reason
  }
}

export class SubscriberLimit extends Data.TaggedError("SubscriberLimit")<{
  readonly poolId: PoolId
  readonly limit: number
}> {
  override get message(): string {
    return `pool ${this.poolId} already has ${this.limit} publication subscribers`
  }
}

export class InitializedHubLimit extends Data.TaggedError("InitializedHubLimit")<{ readonly limit: number }> {
  override get message(): string {
    return `all ${this.limit} initialized publication hubs are in use`
  }
}

export class SubscriberLagged extends Data.TaggedError("SubscriberLagged")<{ readonly poolId: PoolId }> {
  override get message(): string {
    return `publication subscriber of pool ${this.poolId} lagged; it requires a fresh snapshot`
  }
}

export type InvalidHubPublicationReason =
  | "IdentityChanged"
  | "LeaseChanged"
  | "SequenceGap"
  | "BucketOutOfRange"

export class InvalidHubPublication extends Data.TaggedError("InvalidHubPublication")<{
  readonly reason: InvalidHubPublicationReason
  readonly detail: string
}> {
  override get message(): string {
    return this.detail
  }
}

export type PublicationHubError =
  | UnknownPool
  | ProducerMismatch
  | PublicationUnavailable
  | SubscriberLimit
  | InitializedHubLimit
  | SubscriberLagged
  | InvalidHubPublication

export class HubStartFailed extends Data.TaggedError("HubStartFailed")<{ readonly reason: string }> {
  override get message(): string {
    return this.reason
  }
}

export class EncodingPermitsClosed extends Data.TaggedError("EncodingPermitsClosed")<{}> {
  override get message(): string {
    return "publication encoding permits are closed"
  }
}

const generationRetired = (): PublicationUnavailable =>
  new PublicationUnavailable({ reason: "pool generation retired" })

// ---------------------------------------------------------------------------------------------
// Metrics

const subscriberLagged = Metric.counter("kv_dc_relay_subscriber_lagged_total", {
  description: "streams terminated for bounded-queue lag",
  incremental: true
}).pipe(Metric.tagged("stream", "pool"))

const subscriberLimitRejected = Metric.counter("kv_dc_relay_subscriber_limit_rejected_total", {
  description: "subscriptions rejected at a limit",
  incremental: true
}).pipe(Metric.tagged("stream", "pool"))

/** Counted inside synchronous state transitions, where no effect may run. */
const countLimitRejection = (scope: "per_pool" | "initialized_hub"): void =>
  subscriberLimitRejected.unsafeUpdate(1, [MetricLabel.make("scope", scope)])

// ---------------------------------------------------------------------------------------------
// Small synchronization primitives

/** A change counter with waiters; `changedSince` registers and re-checks in one synchronous step. */
class Notify {
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

/**
 * Runs `effect` unless `signal` fires first (then `None`). A result that `effect` produced anyway
 * after losing is handed to `discard`, so nothing it acquired leaks.
 */
const unlessCancelled = <A, E>(
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

// ---------------------------------------------------------------------------------------------
// Configuration

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

export class InvalidPublicationHubConfig extends Data.TaggedError("InvalidPublicationHubConfig")<{
  readonly field: string
  readonly detail: string
}> {
  override get message(): string {
    return `publication hub ${this.field} ${this.detail}`
  }
}

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

export interface HubSnapshot {
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

export type SubscriberCloseReason = "Active" | "Lagged" | "Retired"

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

export interface PublicationHubStats {
  readonly ready: boolean
  readonly lastError: string | undefined
  readonly sequence: bigint
  readonly subscribers: number
  readonly mirrorShared: boolean
  readonly recoveries: number
  readonly publishedFrames: number
  readonly laggedSubscribers: number
}

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

export interface StartPublicationHubOptions {
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

// ---------------------------------------------------------------------------------------------
// The per-generation slot

export type HubPhaseName = "vacant" | "initializing" | "ready" | "evicting" | "failed" | "retired"

type HubPhase =
  | { readonly _tag: "Vacant" }
  | { readonly _tag: "Initializing" }
  | { readonly _tag: "Ready"; readonly hub: PublicationHub; readonly permit: OwnedPermit }
  | { readonly _tag: "Evicting" }
  | { readonly _tag: "Failed"; readonly reason: string }
  | { readonly _tag: "Retired" }

const VACANT: HubPhase = { _tag: "Vacant" }
const INITIALIZING: HubPhase = { _tag: "Initializing" }
const EVICTING: HubPhase = { _tag: "Evicting" }
const RETIRED: HubPhase = { _tag: "Retired" }

/** Held for the duration of one subscribe call; a pending admission protects a hub from eviction. */
export interface HubAdmission {
  readonly release: () => void
}

/** What a hub start needs from its generation. */
export interface HubStartContext {
  readonly coordinator: HubCoordinator
  readonly actor: PoolActor
  readonly generation: GenerationSignal
  /** Fences the generation (catalog withdrawal); called at most once per failure. */
  readonly terminalFailure: (reason: string) => Effect.Effect<void>
  /** The generation's hub scope: initialization and the hub's loop run in it. */
  readonly scope: Scope.Scope
}

interface ClaimedIdleHub {
  readonly hub: PublicationHub
  readonly permit: OwnedPermit
}

export class PoolHubSlot {
  private phase: HubPhase = VACANT
  private pendingAdmissions = 0
  private retirementRequested = false
  private readonly changed = new Notify()

  /** Test hook (`PoolHubSlot::phase` in the seed). */
  get phaseName(): HubPhaseName {
    return this.phase._tag.toLowerCase() as HubPhaseName
  }

  get pending(): number {
    return this.pendingAdmissions
  }

  /** The initialized hub, if any (diagnostics). */
  get hub(): PublicationHub | undefined {
    return this.phase._tag === "Ready" ? this.phase.hub : undefined
  }

  beginAdmission(): Either.Either<HubAdmission, PublicationUnavailable> {
    if (this.retirementRequested || this.phase._tag === "Retired") return Either.left(generationRetired())
    this.pendingAdmissions++
    let held = true
    return Either.right({
      release: () => {
        if (!held) return
        held = false
        this.pendingAdmissions--
      }
    })
  }

  /** The ready hub, starting it (once per caller) when the slot is vacant. */
  getOrStart(context: HubStartContext): Effect.Effect<PublicationHub, PublicationHubError> {
    let attempted = false
    const waitThen = (version: number): Effect.Effect<PublicationHub, PublicationHubError> =>
      Effect.interruptible(
        Effect.raceFirst(this.changed.changedSince(version), context.generation.await)
      ).pipe(
        Effect.zipRight(
          Effect.suspend(() => (context.generation.isCancelled ? Effect.fail(generationRetired()) : step))
        )
      )
    const step: Effect.Effect<PublicationHub, PublicationHubError> = Effect.suspend(() => {
      const version = this.changed.current
      const phase = this.phase
      switch (phase._tag) {
        case "Ready":
          return Effect.succeed(phase.hub)
        case "Failed":
          return Effect.fail(new PublicationUnavailable({ reason: phase.reason }))
        case "Retired":
          return Effect.fail(generationRetired())
        case "Initializing":
        case "Evicting":
          return waitThen(version)
        case "Vacant": {
          if (attempted) return Effect.fail(new InitializedHubLimit({ limit: context.coordinator.limit }))
          attempted = true
          // Capacity taken here must reach the initialization fiber, so the transition and the
          // fork are one uninterruptible step (the fiber inherits that and opts into interruption).
          return Effect.uninterruptible(
            Effect.suspend(() => {
              const permit = context.coordinator.capacity.tryAcquire()
              this.phase = INITIALIZING
              return Effect.forkIn(this.initialize(context, permit), context.scope)
            })
          ).pipe(Effect.zipRight(waitThen(version)))
        }
      }
    })
    return step
  }

  /** Runs uninterruptibly except for its waits; always leaves `Initializing`. */
  private initialize(context: HubStartContext, initialPermit: OwnedPermit | undefined): Effect.Effect<void> {
    let permit = initialPermit
    const cancel = context.generation
    const lease = publicationLease(context.actor.identity)
    const retireLease = context.actor.retirePublicationLease.pipe(
      Effect.catchAll((error) =>
        Effect.logDebug("KV DC Relay actor stopped before its cancelled publication lease retired").pipe(
          Effect.annotateLogs("error", error.message)
        )
      )
    )
    const settle = (phase: HubPhase): void => {
      this.phase = phase
      this.changed.notify()
    }
    const body = Effect.gen(this, function* () {
      if (permit === undefined) {
        const reclaimed = yield* Effect.either(context.coordinator.reclaim(this, cancel))
        if (Either.isLeft(reclaimed)) {
          const error = reclaimed.left
          if (error._tag === "InitializedHubLimit") {
            if (this.phase._tag === "Initializing") {
              settle(this.retirementRequested || cancel.isCancelled ? RETIRED : VACANT)
            } else {
              this.changed.notify()
            }
            return
          }
          if (cancel.isCancelled) return settle(RETIRED)
          const reason = `failed to reserve publication hub capacity: ${error.message}`
          this.phase = { _tag: "Failed", reason }
          yield* context.terminalFailure(reason)
          this.changed.notify()
          return
        }
        permit = reclaimed.right
      }
      const started = yield* Effect.interruptible(
        unlessCancelled(
          startPublicationHub({
            actor: context.actor,
            config: context.coordinator.config,
            onTerminalFailure: context.terminalFailure,
            scope: context.scope
          }),
          cancel,
          (hub) => hub.shutdown
        )
      )
      if (Option.isNone(started) || cancel.isCancelled) {
        if (Option.isSome(started) && Either.isRight(started.value)) yield* started.value.right.shutdown
        yield* retireLease
        return settle(RETIRED)
      }
      const result = started.value
      if (Either.isRight(result)) {
        const hub = result.right
        if (this.retirementRequested || cancel.isCancelled) {
          this.phase = RETIRED
          yield* hub.shutdown
          yield* retireLease
        } else {
          this.phase = { _tag: "Ready", hub, permit }
          permit = undefined
        }
        this.changed.notify()
        return
      }
      const reason = `failed to initialize publication hub: ${result.left.message}`
      if (this.retirementRequested || cancel.isCancelled) return settle(RETIRED)
      this.phase = { _tag: "Failed", reason }
      yield* context.terminalFailure(reason)
      this.changed.notify()
    })
    return body.pipe(
      Effect.onExit((exit) =>
        Effect.sync(() => {
          // Capacity that did not move into `Ready` goes back, whatever happened.
          permit?.release()
          permit = undefined
          if (Exit.isFailure(exit) && this.phase._tag === "Initializing") settle(RETIRED)
        })
      ),
      Effect.annotateLogs({
        poolId: context.actor.identity.poolId.toString(),
        layoutGeneration: String(lease.assignmentEpoch)
      })
    )
  }

  /** Retires the slot and shuts its hub down, waiting out an initialization or eviction in flight. */
  shutdown(): Effect.Effect<void> {
    return Effect.suspend(() => {
      const version = this.changed.current
      this.retirementRequested = true
      const phase = this.phase
      switch (phase._tag) {
        case "Ready":
          this.phase = RETIRED
          return phase.hub.shutdown.pipe(
            Effect.ensuring(
              Effect.sync(() => {
                phase.permit.release()
                this.changed.notify()
              })
            )
          )
        case "Initializing":
        case "Evicting":
          return Effect.zipRight(this.changed.changedSince(version), this.shutdown())
        default:
          this.phase = RETIRED
          return Effect.void
      }
    })
  }

  /** Synchronous retirement (fence): a ready hub stops and closes its subscribers but keeps its slot until shutdown. */
  retire(): Effect.Effect<void> {
    return Effect.suspend(() => {
      this.retirementRequested = true
      const phase = this.phase
      if (phase._tag === "Ready") return phase.hub.retire
      if (phase._tag === "Vacant" || phase._tag === "Failed") this.phase = RETIRED
      return Effect.void
    })
  }

  /** @internal Claims a ready, idle, unshared hub for eviction (Ready → Evicting). */
  tryClaimIdle(generation: GenerationSignal): ClaimedIdleHub | undefined {
    if (generation.isCancelled) return undefined
    if (this.retirementRequested || this.pendingAdmissions !== 0) return undefined
    const phase = this.phase
    if (phase._tag !== "Ready") return undefined
    if (!phase.hub.tryBeginIdleEviction()) return undefined
    this.phase = EVICTING
    return { hub: phase.hub, permit: phase.permit }
  }

  /** @internal Evicting → Vacant, or Retired when the generation retired meanwhile. */
  finishEviction(isRetired: boolean): void {
    if (this.phase._tag === "Evicting") {
      this.phase = isRetired || this.retirementRequested ? RETIRED : VACANT
    }
    this.changed.notify()
  }
}

// ---------------------------------------------------------------------------------------------
// Relay-wide capacity of initialized hubs

/** A hub that may be evicted to make room: another active generation's slot. */
export interface EvictionCandidate {
  readonly identity: ProducerIdentity
  readonly generation: GenerationSignal
  readonly slot: PoolHubSlot
}

export interface HubCoordinatorOptions {
  /** At most this many hubs hold an initialized mirror (default 64). */
  readonly maxInitializedHubs: number
  readonly config: PublicationHubConfig
  /** Where eviction cleanup runs: it outlives the requesting admission (the registry's scope). */
  readonly scope: Scope.Scope
  /** Active generations other than `target`, in the registry's order. */
  readonly candidates: (target: PoolHubSlot) => ReadonlyArray<EvictionCandidate>
  /** Fences a generation whose idle eviction failed (unless it already retired). */
  readonly fence: (identity: ProducerIdentity, reason: string) => Effect.Effect<void>
  /** Test hook: eviction cleanup waits on this after claiming its victim. */
  readonly evictionGate?: Effect.Effect<void> | undefined
}

/** The hand-over of a reclaimed permit from the eviction cleanup to the requester. */
class PermitHandoff {
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

export class HubCoordinator {
  readonly capacity: OwnedPermits
  /** Serializes pressure requests: one victim per request. */
  readonly pressure = new OwnedPermits(1)
  readonly config: PublicationHubConfig

  constructor(private readonly options: HubCoordinatorOptions) {
    this.capacity = new OwnedPermits(options.maxInitializedHubs)
    this.config = options.config
  }

  get limit(): number {
    return this.options.maxInitializedHubs
  }

  /**
   * Capacity for `target` under pressure: a permit freed meanwhile, or the permit of one idle hub
   * of another active generation, evicted by a cleanup fiber that outlives this request. Run from
   * an uninterruptible region (the initialization fiber); waits are interruptible.
   */
  reclaim(
    target: PoolHubSlot,
    targetCancel: GenerationSignal
  ): Effect.Effect<OwnedPermit, PublicationHubError> {
    return Effect.gen(this, function* () {
      const pressure = yield* this.pressure.acquireUnless(targetCancel)
      if (pressure === undefined) {
        return yield* Effect.fail(
          new PublicationUnavailable({
            reason: "pool generation retired while waiting for publication hub capacity"
          })
        )
      }
      const freed = this.capacity.tryAcquire()
      if (freed !== undefined) {
        pressure.release()
        return freed
      }
      for (const candidate of this.options.candidates(target)) {
        if (candidate.slot === target) continue
        const victim = candidate.slot.tryClaimIdle(candidate.generation)
        if (victim === undefined) continue
        const handoff = new PermitHandoff()
        // Cleanup outlives the requesting admission so cancellation cannot strand the victim in
        // Evicting or leak its permit.
        yield* Effect.forkIn(this.evict(victim, candidate, pressure, handoff), this.options.scope)
        return yield* this.awaitHandoff(handoff, targetCancel)
      }
      pressure.release()
      countLimitRejection("initialized_hub")
      return yield* Effect.fail(new InitializedHubLimit({ limit: this.limit }))
    })
  }

  private awaitHandoff(
    handoff: PermitHandoff,
    targetCancel: GenerationSignal
  ): Effect.Effect<OwnedPermit, PublicationHubError> {
    const step: Effect.Effect<OwnedPermit, PublicationHubError> = Effect.suspend(() => {
      // Biased: a retired requester gives the reclaimed permit back rather than take it.
      if (targetCancel.isCancelled) {
        handoff.abandon()
        return Effect.fail(
          new PublicationUnavailable({
            reason: "pool generation retired while reclaiming publication hub capacity"
          })
        )
      }
      if (handoff.isDelivered) {
        const permit = handoff.take()
        return permit === undefined
          ? Effect.fail(new InitializedHubLimit({ limit: this.limit }))
          : Effect.succeed(permit)
      }
      const version = handoff.changed.current
      return Effect.interruptible(
        Effect.raceFirst(handoff.changed.changedSince(version), targetCancel.await)
      ).pipe(Effect.zipRight(step))
    })
    return step.pipe(Effect.onInterrupt(() => Effect.sync(() => handoff.abandon())))
  }

  /** The cleanup fiber: holds the pressure permit until the victim's capacity is handed over. */
  private evict(
    victim: ClaimedIdleHub,
    candidate: EvictionCandidate,
    pressure: OwnedPermit,
    handoff: PermitHandoff
  ): Effect.Effect<void> {
    let finished = false
    const fenceIfActive = (reason: string): Effect.Effect<void> =>
      candidate.generation.isCancelled
        ? Effect.void
        : this.options.fence(candidate.identity, `idle publication hub eviction failed: ${reason}`)
    const body = Effect.gen(this, function* () {
      const gate = this.options.evictionGate
      if (gate !== undefined) yield* Effect.interruptible(gate)
      const result = yield* Effect.interruptible(victim.hub.evictIdle)
      if (Either.isLeft(result)) {
        yield* Effect.logDebug("Idle KV DC Relay publication hub eviction failed").pipe(
          Effect.annotateLogs("error", result.left)
        )
        yield* fenceIfActive(result.left)
      }
      candidate.slot.finishEviction(candidate.generation.isCancelled)
      finished = true
      handoff.deliver(victim.permit)
    })
    return body.pipe(
      Effect.onExit(() =>
        finished
          ? Effect.void
          : // Abandoned cleanup: the victim must not stay Evicting nor keep its capacity.
            Effect.zipRight(
              fenceIfActive("cleanup task was abandoned"),
              Effect.sync(() => {
                candidate.slot.finishEviction(true)
                victim.permit.release()
                handoff.deliver(undefined)
              })
            )
      ),
      Effect.ensuring(Effect.sync(() => pressure.release())),
      Effect.withSpan("PublicationHub.evictIdle", {
        attributes: {
          poolId: candidate.identity.poolId.toString(),
          layoutGeneration: String(candidate.identity.layoutGeneration)
        }
      })
    )
  }
}
