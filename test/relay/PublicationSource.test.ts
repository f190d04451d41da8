/**
 * Pool streams of the publication source beyond the seed tests: snapshot progress timeout on the
 * TestClock, lag termination through the stream, and slot release as soon as a consumer stops.
 */

import { describe, expect, it } from "@effect/vitest"
import { Deferred, Effect, Option, Scope, Stream, TestClock } from "effect"
import { makeEncodingPermits } from "../../src/relay/internal/sync.js"
import * as PublicationSource from "../../src/relay/PublicationSource.js"
import type { PublicationError } from "../../src/relay/RelayErrors.js"
import { config, registry as makeRegistry, pool, request, storedEventN } from "./registryFixtures.js"

describe("PublicationSource", () => {
  it.scoped(
    "a snapshot consumer that stalls gets SnapshotProgressTimeout and frees its encoding permit",
    () =>
      Effect.gen(function* () {
        // 2,000,000 expected blocks size the filter at 2^20 buckets: two snapshot chunks.
        const registry = yield* makeRegistry({
          actorConfig: { ...config(), expectedUniqueBlocks: 2_000_000 }
        })
        const attachment = yield* registry.attach(request(pool(1), "fast.router.generate", "llama"))
        const encodingPermits = makeEncodingPermits(2)
        const source = yield* PublicationSource.make(registry, {
          encodingPermits,
          snapshotProgressTimeout: "60 seconds"
        })
        const stream = yield* source.subscribePool(attachment.identity, "stalled")
        const pull = yield* Stream.toPull(stream)
        expect(encodingPermits.available).toBe(1)

        for (let i = 0; i < 10; i++) yield* Effect.yieldNow()
        yield* TestClock.adjust("61 seconds")
        for (let i = 0; i < 10; i++) yield* Effect.yieldNow()
        expect(encodingPermits.available).toBe(2)

        // The chunk already handed over still goes out; then the stall ends the stream.
        const first = yield* pull
        expect(Array.from(first)[0]!.kind).toBe("SnapshotChunk")
        const stalled = yield* Effect.flip(pull)
        expect(Option.getOrThrow(stalled).kind).toBe("SnapshotProgressTimeout")
        // A stall is the consumer's problem: the generation stays published.
        expect((yield* registry.catalog).pools.length).toBe(1)
      })
  )

  it.scoped("a stream that does not keep up ends with SubscriberLagged after its snapshot", () =>
    Effect.gen(function* () {
      const registry = yield* makeRegistry()
      const attachment = yield* registry.attach(request(pool(1), "fast.router.generate", "llama"))
      const source = yield* PublicationSource.make(registry)
      const stream = yield* source.subscribePool(attachment.identity, "slow")
      for (let i = 1; i <= 17; i++) {
        yield* attachment.actor.admitEvent(0, storedEventN(i))
        yield* attachment.actor.flush
      }
      const hub = registry.hubSlot(attachment.poolId)!.hub!
      for (let i = 0; i < 1_000 && hub.stats.laggedSubscribers === 0; i++) yield* Effect.yieldNow()
      expect(hub.stats.laggedSubscribers).toBe(1)

      const pull = yield* Stream.toPull(stream)
      expect(Array.from(yield* pull)[0]!.kind).toBe("SnapshotChunk")
      const lagged = yield* Effect.flip(pull)
      expect(Option.getOrThrow(lagged).kind).toBe("SubscriberLagged")
      expect((yield* registry.catalog).pools.length).toBe(1)
    })
  )

  it.scoped("a consumer that stops frees its stream and subscriber slots at once", () =>
    Effect.gen(function* () {
      const registry = yield* makeRegistry()
      const attachment = yield* registry.attach(request(pool(1), "fast.router.generate", "llama"))
      const source = yield* PublicationSource.make(registry, { maxActiveStreams: 1 })
      const callerScope = yield* Scope.make()
      const stream = yield* source.subscribePool(attachment.identity, "brief").pipe(Scope.extend(callerScope))
      expect(source.activeStreams()).toBe(1)
      const hub = registry.hubSlot(attachment.poolId)!.hub!
      expect(hub.stats.subscribers).toBe(1)

      const frames = yield* Stream.runCollect(Stream.take(stream, 1))
      expect(Array.from(frames)[0]!.kind).toBe("SnapshotChunk")
      // The caller's scope is still open; the finished stream already gave everything back.
      expect(source.activeStreams()).toBe(0)
      expect(hub.stats.subscribers).toBe(0)
      yield* source.subscribePool(attachment.identity, "next")
    })
  )

  it.scoped(
    "a lagged stream gives its stream permit back and reports its end before its consumer pulls",
    () =>
      Effect.gen(function* () {
        const registry = yield* makeRegistry()
        const attachment = yield* registry.attach(request(pool(1), "fast.router.generate", "llama"))
        const source = yield* PublicationSource.make(registry, { maxActiveStreams: 1 })
        const ended = yield* Deferred.make<PublicationError>()
        const stream = yield* source.subscribePool(attachment.identity, "stuck", ended)
        expect(source.activeStreams()).toBe(1)
        const refused = yield* Effect.flip(source.subscribePool(attachment.identity, "refused"))
        expect(refused.kind).toBe("ResourceExhausted")

        // Nobody pulls `stream`: its hub queue overflows on the 17th delta.
        for (let i = 1; i <= 17; i++) {
          yield* attachment.actor.admitEvent(0, storedEventN(i))
          yield* attachment.actor.flush
        }
        expect((yield* Deferred.await(ended)).kind).toBe("SubscriberLagged")
        expect(source.activeStreams()).toBe(0)
        yield* source.subscribePool(attachment.identity, "next")

        // The stream itself still ends the way it did: its snapshot, then the lag.
        const pull = yield* Stream.toPull(stream)
        expect(Array.from(yield* pull)[0]!.kind).toBe("SnapshotChunk")
        expect(Option.getOrThrow(yield* Effect.flip(pull)).kind).toBe("SubscriberLagged")
      })
  )

  it.scoped(
    "a retired generation frees its streams' permits and reports PUBLICATION_UNAVAILABLE at once",
    () =>
      Effect.gen(function* () {
        const registry = yield* makeRegistry()
        const attachment = yield* registry.attach(request(pool(1), "fast.router.generate", "llama"))
        const source = yield* PublicationSource.make(registry)
        const ended = yield* Deferred.make<PublicationError>()
        yield* source.subscribePool(attachment.identity, "withdrawn", ended)
        expect(source.activeStreams()).toBe(1)
        yield* registry.fenceGeneration(attachment.poolId, attachment.layoutGeneration, "test fence")
        expect(yield* Deferred.await(ended)).toMatchObject({
          kind: "Unavailable",
          message: "pool generation retired; open a fresh stream"
        })
        expect(source.activeStreams()).toBe(0)
      })
  )

  it.scoped("a stalled snapshot reports SnapshotProgressTimeout on `ended` and frees its permit", () =>
    Effect.gen(function* () {
      const registry = yield* makeRegistry({
        actorConfig: { ...config(), expectedUniqueBlocks: 2_000_000 }
      })
      const attachment = yield* registry.attach(request(pool(1), "fast.router.generate", "llama"))
      const source = yield* PublicationSource.make(registry, { snapshotProgressTimeout: "60 seconds" })
      const ended = yield* Deferred.make<PublicationError>()
      yield* source.subscribePool(attachment.identity, "stalled", ended)
      for (let i = 0; i < 10; i++) yield* Effect.yieldNow()
      expect(yield* Deferred.isDone(ended)).toBe(false)
      yield* TestClock.adjust("61 seconds")
      expect((yield* Deferred.await(ended)).kind).toBe("SnapshotProgressTimeout")
      expect(source.activeStreams()).toBe(0)
    })
  )

  it.scoped("relay shutdown ends streams silently and rejects new ones", () =>
    Effect.gen(function* () {
      const registry = yield* makeRegistry()
      const attachment = yield* registry.attach(request(pool(1), "fast.router.generate", "llama"))
      const source = yield* PublicationSource.make(registry)
      const stream = yield* source.subscribePool(attachment.identity, "shutdown")
      const collected = yield* Effect.fork(Stream.runCollect(stream))
      yield* source.shutdown
      const frames = Array.from(yield* collected.await.pipe(Effect.flatten))
      expect(frames.every((frame) => frame.kind === "SnapshotChunk")).toBe(true)
      const refused = yield* Effect.flip(source.subscribePool(attachment.identity, "late"))
      expect(refused.kind).toBe("Unavailable")
    })
  )
})
