/**
 * The publication hub against a scripted actor (deltas are pushed by the test), plus the
 * relay-wide limit of 64 initialized hubs through the registry with real actors.
 */

import { describe, expect, it } from "@effect/vitest"
import { Cause, Effect, Either, Exit, Option, Queue, Scope } from "effect"
import { CBI1_HEADER_BYTES, decodeCbi1 } from "../../src/ckf/cbi1.js"
import { ckfConfig } from "../../src/ckf/config.js"
import { type LaneLease, ProducerIdentity } from "../../src/ckf/identity.js"
import type { DcCkfDelta } from "../../src/ckf/publisher.js"
import { DcCkfState } from "../../src/ckf/state.js"
import type { DeltaReceiver, DeltaStreamClosed, DeltaStreamLagged } from "../../src/relay/DeltaBroadcast.js"
import { makeEncodingPermits } from "../../src/relay/internal/sync.js"
import type { ActorFault, ActorSubscription, PoolActor } from "../../src/relay/PoolActor.js"
import {
  DEFAULT_MAX_INITIALIZED_POOL_HUBS,
  FRAME_OVERHEAD_BYTES,
  type HubSubscription,
  makePublicationHubConfig,
  minQueueBytes,
  type PublicationHub,
  type PublicationHubConfig,
  publicationLease,
  startPublicationHub
} from "../../src/relay/PublicationHub.js"
import { drop, registry as makeRegistry, pool, request, waitUntil } from "./registryFixtures.js"

type Pushed = DcCkfDelta | "lagged" | "closed"

/** An actor whose deltas the test pushes; each `subscribe` replaces the receiver. */
const scriptedActor = Effect.gen(function* () {
  const format = new DcCkfState(ckfConfig(32)).format
  const identity = new ProducerIdentity(pool(1), 7n, 1n, format)
  const words = new Uint32Array(2 * format.bucketCount)
  let sequence = 0n
  let queue = yield* Queue.unbounded<Pushed>()
  let lease: LaneLease | undefined
  const counters = { subscriptions: 0, leaseRetirements: 0 }

  const receiverOf = (source: Queue.Queue<Pushed>): DeltaReceiver => ({
    take: Effect.flatMap(
      Queue.take(source),
      (item): Effect.Effect<DcCkfDelta, DeltaStreamLagged | DeltaStreamClosed> =>
        item === "lagged"
          ? Effect.fail({ _tag: "DeltaStreamLagged" as const })
          : item === "closed"
            ? Effect.fail({ _tag: "DeltaStreamClosed" as const })
            : Effect.succeed(item)
    ),
    poll: Effect.succeed(Option.none()),
    close: Effect.void
  })

  const unused = Effect.dieMessage("not used by the publication hub")
  const actor: PoolActor = {
    identity,
    canonical: true,
    subscribe: (next) =>
      Effect.gen(function* () {
        counters.subscriptions++
        lease = next
        queue = yield* Queue.unbounded<Pushed>()
        const subscription: ActorSubscription = {
          snapshot: { identity, lease: next, sequence, words: words.slice() },
          deltas: receiverOf(queue)
        }
        return subscription
      }),
    retirePublicationLease: Effect.sync(() => {
      counters.leaseRetirements++
      lease = undefined
    }),
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

  /** Publishes one delta of absolute images `[bucket, lo, hi]*` and returns it. */
  const emit = (
    images: ReadonlyArray<readonly [number, number, number]>,
    override: Partial<DcCkfDelta> = {}
  ) =>
    Effect.suspend(() => {
      const flat = new Uint32Array(images.flat())
      for (const [bucket, lo, hi] of images) {
        words[2 * bucket] = lo
        words[2 * bucket + 1] = hi
      }
      const delta: DcCkfDelta = {
        identity,
        lease: lease!,
        baseSequence: sequence,
        sequence: sequence + 1n,
        images: flat,
        ...override
      }
      sequence = delta.sequence
      return Effect.as(Queue.offer(queue, delta), delta)
    })

  const push = (item: "lagged" | "closed") => Queue.offer(queue, item)
  return { actor, identity, words, emit, push, counters }
})

const hubConfig = (overrides: Partial<PublicationHubConfig> = {}): PublicationHubConfig => {
  const config = makePublicationHubConfig({ encodingPermits: makeEncodingPermits(2), ...overrides })
  if (config._tag === "Left") throw config.left
  return config.right
}

const startHub = (overrides: Partial<PublicationHubConfig> = {}) =>
  Effect.gen(function* () {
    const script = yield* scriptedActor
    const failures: Array<string> = []
    const hub = yield* startPublicationHub({
      actor: script.actor,
      config: hubConfig(overrides),
      onTerminalFailure: (reason) => Effect.sync(() => void failures.push(reason)),
      scope: yield* Effect.scope
    })
    return { ...script, hub, failures }
  })

const subscribeNow = (hub: PublicationHub): HubSubscription => {
  const subscription = hub.subscribe()
  if (subscription._tag === "Left") throw subscription.left
  return subscription.right
}

describe("PublicationHub", () => {
  it.scoped("a slow subscriber is closed as lagged without slowing the actor or other subscribers", () =>
    Effect.gen(function* () {
      const { hub, emit } = yield* startHub()
      const slow = subscribeNow(hub)
      const fast = subscribeNow(hub)
      slow.releaseSnapshot()
      fast.releaseSnapshot()

      const received: Array<bigint> = []
      for (let i = 1; i <= 20; i++) {
        yield* emit([[i % 16, i, 0]])
        yield* waitUntil(() => hub.stats.sequence === BigInt(i), `delta ${i} is applied`)
        received.push((yield* fast.recv).sequence)
      }

      expect(received).toEqual(Array.from({ length: 20 }, (_, i) => BigInt(i + 1)))
      expect(slow.closeReason).toBe("Lagged")
      expect(slow.queuedFrames).toBe(0)
      expect(hub.stats.laggedSubscribers).toBe(1)
      expect(hub.stats.subscribers).toBe(1)
      const error = yield* Effect.flip(slow.recv)
      expect(error._tag).toBe("SubscriberLagged")
      expect(fast.closeReason).toBe("Active")
    })
  )

  it.scoped("each queued frame costs its payload plus 256 bytes against the byte bound", () =>
    Effect.gen(function* () {
      const maxDeltaImages = 4
      // One 4-image frame fits (48 + 12 + 48 + 256 = 364 bytes); two 1-image frames do not (2 × 328).
      const { hub, emit } = yield* startHub({ maxDeltaImages, queueBytes: minQueueBytes(maxDeltaImages) })
      const subscriber = subscribeNow(hub)
      subscriber.releaseSnapshot()

      yield* emit([[1, 1, 0]])
      yield* waitUntil(() => hub.stats.sequence === 1n, "the first delta is applied")
      const oneImageCost = CBI1_HEADER_BYTES + 12 + 12 + FRAME_OVERHEAD_BYTES
      expect(subscriber.queuedFrames).toBe(1)
      expect(subscriber.queuedBytes).toBe(oneImageCost)

      const frame = yield* subscriber.recv
      expect(frame.payload.length + FRAME_OVERHEAD_BYTES).toBe(oneImageCost)
      expect(subscriber.queuedBytes).toBe(0)

      yield* emit([[2, 2, 0]])
      yield* emit([[3, 3, 0]])
      yield* waitUntil(() => hub.stats.sequence === 3n, "both deltas are applied")
      // The byte reservation fails before the 16-frame bound is anywhere near.
      expect(subscriber.closeReason).toBe("Lagged")
      expect((yield* Effect.flip(subscriber.recv))._tag).toBe("SubscriberLagged")

      const next = subscribeNow(hub)
      next.releaseSnapshot()
      yield* emit([
        [4, 4, 0],
        [5, 5, 0],
        [6, 6, 0],
        [7, 7, 0]
      ])
      yield* waitUntil(() => hub.stats.sequence === 4n, "the full-size delta is applied")
      expect(next.queuedBytes).toBe(minQueueBytes(maxDeltaImages))
      expect(next.closeReason).toBe("Active")
    })
  )

  it.scoped("the frame count bound closes a subscriber at the 17th queued frame", () =>
    Effect.gen(function* () {
      const { hub, emit } = yield* startHub()
      const subscriber = subscribeNow(hub)
      subscriber.releaseSnapshot()
      for (let i = 1; i <= 16; i++) yield* emit([[i % 16, i, 0]])
      yield* waitUntil(() => hub.stats.sequence === 16n, "16 deltas are applied")
      expect(subscriber.queuedFrames).toBe(16)
      expect(subscriber.closeReason).toBe("Active")
      yield* emit([[0, 99, 0]])
      yield* waitUntil(() => hub.stats.sequence === 17n, "the 17th delta is applied")
      expect(subscriber.closeReason).toBe("Lagged")
    })
  )

  it.scoped("the mirror is copied on write while a subscriber holds the previous image", () =>
    Effect.gen(function* () {
      const { hub, emit, words } = yield* startHub()
      const holder = subscribeNow(hub)
      const held = holder.snapshot!.words
      expect(holder.snapshot!.sequence).toBe(0n)

      yield* emit([[3, 0xabcd, 0x1234]])
      yield* waitUntil(() => hub.stats.sequence === 1n, "the delta is applied")
      // The holder bootstraps from an unchanged image and continues with the frame.
      expect(held[6]).toBe(0)
      expect(held[7]).toBe(0)
      const frame = yield* holder.recv
      expect(frame.baseSequence).toBe(0n)
      expect(frame.sequence).toBe(1n)

      const joiner = subscribeNow(hub)
      expect(joiner.snapshot!.sequence).toBe(1n)
      expect(joiner.snapshot!.words).not.toBe(held)
      expect(Array.from(joiner.snapshot!.words)).toEqual(Array.from(words))
      const current = joiner.snapshot!.words

      // Nobody holds an image any more: the next delta updates the mirror in place.
      holder.releaseSnapshot()
      joiner.releaseSnapshot()
      expect(hub.stats.mirrorShared).toBe(false)
      yield* emit([[4, 7, 8]])
      yield* waitUntil(() => hub.stats.sequence === 2n, "the second delta is applied")
      const late = subscribeNow(hub)
      expect(late.snapshot!.words).toBe(current)
      expect(current[8]).toBe(7)
      expect(current[9]).toBe(8)
    })
  )

  it.scoped("frames are CBI1 deltas of the producer's format and DC", () =>
    Effect.gen(function* () {
      const { hub, emit, identity } = yield* startHub()
      const subscriber = subscribeNow(hub)
      subscriber.releaseSnapshot()
      yield* emit([[5, 0x11, 0x22]])
      const frame = yield* subscriber.recv
      const decoded = decodeCbi1(frame.payload, { format: identity.format, dcId: identity.dcId.value })
      expect(decoded).toMatchObject({ _tag: "Delta", baseEpoch: 0n, epoch: 1n })
      if ("images" in decoded) expect(Array.from(decoded.images)).toEqual([5, 0x11, 0x22])
    })
  )

  it.scoped("a lagged actor receiver or an oversized delta resubscribes and retires subscribers", () =>
    Effect.gen(function* () {
      const { hub, emit, push, counters } = yield* startHub({
        maxDeltaImages: 2,
        queueBytes: minQueueBytes(2)
      })
      const first = subscribeNow(hub)
      first.releaseSnapshot()
      expect(counters.subscriptions).toBe(1)

      yield* push("lagged")
      yield* waitUntil(() => counters.subscriptions === 2, "the hub resubscribes")
      expect(first.closeReason).toBe("Retired")
      expect((yield* Effect.flip(first.recv))._tag).toBe("PublicationUnavailable")
      expect(hub.isReady).toBe(true)

      const second = subscribeNow(hub)
      second.releaseSnapshot()
      yield* emit([
        [1, 1, 0],
        [2, 2, 0],
        [3, 3, 0]
      ])
      yield* waitUntil(() => counters.subscriptions === 3, "the oversized delta triggers recovery")
      expect(second.closeReason).toBe("Retired")
      // The recovered mirror is the actor's fresh snapshot, which already covers the big delta.
      expect(hub.stats.sequence).toBe(1n)
      expect(hub.stats.recoveries).toBe(2)
    })
  )

  it.scoped("a sequence gap is a terminal failure reported once", () =>
    Effect.gen(function* () {
      const { hub, emit, failures } = yield* startHub()
      const subscriber = subscribeNow(hub)
      yield* emit([[1, 1, 0]], { baseSequence: 5n, sequence: 6n })
      yield* waitUntil(() => failures.length === 1, "the hub fails")
      expect(failures[0]).toContain("sequence gap")
      expect(hub.isReady).toBe(false)
      expect(subscriber.closeReason).toBe("Retired")
      const refused = hub.subscribe()
      expect(refused._tag === "Left" && refused.left.message).toContain("sequence gap")
    })
  )

  it.scoped("idle eviction retires the actor lease and needs an unshared, subscriber-free mirror", () =>
    Effect.gen(function* () {
      const { hub, counters } = yield* startHub()
      const subscriber = subscribeNow(hub)
      expect(hub.tryBeginIdleEviction()).toBe(false)
      yield* subscriber.close
      expect(hub.tryBeginIdleEviction()).toBe(true)
      expect(Either.isRight(yield* hub.evictIdle)).toBe(true)
      expect(counters.leaseRetirements).toBe(1)
      expect(hub.subscribe()._tag).toBe("Left")
    })
  )

  it.scoped("at most 64 hubs are initialized; an idle one is evicted for a new pool", () =>
    Effect.gen(function* () {
      const registry = yield* makeRegistry()
      const count = DEFAULT_MAX_INITIALIZED_POOL_HUBS + 1
      const attachments = []
      for (let seed = 1; seed <= count; seed++) {
        attachments.push(
          yield* registry.attach(request(pool(seed * 2), `pool-${seed}.router.generate`, "llama"))
        )
      }
      expect(registry.publicationHubCounts()).toEqual({ requested: 0, initialized: 0, ready: 0, idle: 0 })
      const scopes: Array<Scope.CloseableScope> = []
      for (const attachment of attachments.slice(0, DEFAULT_MAX_INITIALIZED_POOL_HUBS)) {
        const scope = yield* Scope.make()
        yield* registry.subscribePool(attachment.identity).pipe(Scope.extend(scope))
        scopes.push(scope)
      }
      expect(registry.availableHubCapacity()).toBe(0)

      const last = attachments[count - 1]!
      const limited = yield* Effect.exit(registry.subscribePool(last.identity).pipe(Effect.scoped))
      expect(Exit.isFailure(limited)).toBe(true)
      if (Exit.isFailure(limited)) {
        expect(Cause.failureOption(limited.cause)).toMatchObject({
          value: { _tag: "InitializedHubLimit", limit: DEFAULT_MAX_INITIALIZED_POOL_HUBS }
        })
      }

      // The refused pool's slot went back to vacant: it holds no hub and is not counted.
      const full = { requested: 64, initialized: 64, ready: 64, idle: 0 }
      expect(registry.publicationHubCounts()).toEqual(full)

      // Subscribers and pending admissions protect hubs; once one is idle it is reclaimed.
      yield* drop(scopes[10]!)
      expect(registry.publicationHubCounts()).toEqual({ ...full, idle: 1 })
      const scope = yield* Scope.make()
      yield* registry.subscribePool(last.identity).pipe(Scope.extend(scope))
      expect(registry.hubSlot(attachments[10]!.poolId)!.phaseName).toBe("vacant")
      expect(registry.hubSlot(last.poolId)!.phaseName).toBe("ready")
      expect(registry.availableHubCapacity()).toBe(0)
      expect(registry.publicationHubCounts()).toEqual(full)
      expect(publicationLease(last.identity).assignmentEpoch).toBe(last.layoutGeneration)
    })
  )
})
