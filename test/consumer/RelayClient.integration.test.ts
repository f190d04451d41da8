/**
 * The relay client against the real relay HTTP server: relay info, the catalog watch, a pool
 * stream from snapshot to deltas and heartbeats, and the relay's error statuses and terminal
 * frames as typed errors.
 */

import type * as HttpClient from "@effect/platform/HttpClient"
import * as NodeHttpClient from "@effect/platform-node/NodeHttpClient"
import { describe, expect, it } from "@effect/vitest"
import { Chunk, Effect, Fiber, Logger, LogLevel, type Scope, Stream } from "effect"
import { PoolId, ProducerIdentity } from "../../src/ckf/identity.js"
import { make as makeClient, type PoolStreamEvent } from "../../src/consumer/RelayClient.js"
import { blockHashes } from "./consumerHarness.js"
import { domainOf } from "./fakeRelay.js"
import { startDcRelay } from "./realRelay.js"

const live = <A, E>(name: string, body: () => Effect.Effect<A, E, Scope.Scope | HttpClient.HttpClient>) =>
  it.scopedLive(
    name,
    () => body().pipe(Effect.provide(NodeHttpClient.layerUndici), Logger.withMinimumLogLevel(LogLevel.Error)),
    15_000
  )

describe("RelayClient against the relay HTTP server", () => {
  live("learns the relay and watches its catalog revisions", () =>
    Effect.gen(function* () {
      const relay = yield* startDcRelay("north")
      const client = yield* makeClient(relay.url)
      const info = yield* client.relayInfo
      expect(info.dcName).toBe("north")
      expect(info.dcId.equals(relay.dcId)).toBe(true)
      expect(info.relay.relayIncarnation).toBe(relay.incarnation)

      const watch = yield* Stream.toPull(client.watchCatalog("test/catalog"))
      const first = Chunk.toReadonlyArray(yield* watch)
      expect(first[0]!.pools).toEqual([])
      yield* relay.attach(domainOf(1), "prod.backend.generate")
      let latest = first[first.length - 1]!
      while (latest.pools.length === 0) latest = Chunk.toReadonlyArray(yield* watch).at(-1)!
      expect(latest.revision).toBeGreaterThan(first[0]!.revision)
      expect(latest.pools[0]!.producer.poolId.dcId.equals(relay.dcId)).toBe(true)
      const catalog = yield* client.catalog
      expect(catalog.revision).toBe(latest.revision)
    })
  )

  live("streams a snapshot, contiguous deltas and heartbeats of the expected producer", () =>
    Effect.gen(function* () {
      const relay = yield* startDcRelay("north", { intervals: { poolHeartbeat: "100 millis" } })
      const pool = yield* relay.attach(domainOf(1), "prod.backend.generate")
      yield* pool.store("1", blockHashes(1, 8))
      const client = yield* makeClient(relay.url)
      const events: Array<PoolStreamEvent> = []
      const reader = yield* Effect.fork(
        client
          .subscribePool(pool.attachment.identity, "test/pool")
          .pipe(Stream.runForEach((event) => Effect.sync(() => events.push(event))))
      )
      const until = (condition: () => boolean) =>
        Effect.gen(function* () {
          for (let i = 0; i < 500 && !condition(); i++) yield* Effect.sleep("10 millis")
          expect(condition()).toBe(true)
        })
      yield* until(() => events.length > 0)
      yield* pool.store("1", blockHashes(2, 4))
      yield* pool.store("2", blockHashes(3, 4))
      yield* until(() => events.filter((e) => e._tag === "Delta").length >= 2)
      yield* until(() => events.some((e) => e._tag === "Heartbeat"))
      expect(events[0]!._tag).toBe("Snapshot")
      let last = events[0]!._tag === "Snapshot" ? events[0]!.sequence : -1n
      for (const event of events.slice(1)) {
        if (event._tag === "Delta") {
          expect(event.baseSequence).toBe(last)
          last = event.sequence
        } else if (event._tag === "Heartbeat") {
          expect(event.sequence).toBe(last)
        }
      }
      expect(last).toBe((yield* Effect.orDie(pool.attachment.actor.snapshot)).sequence)
      yield* Fiber.interrupt(reader)
    })
  )

  live("maps the relay's refusals and terminal frames to typed errors", () =>
    Effect.gen(function* () {
      const relay = yield* startDcRelay("north")
      const pool = yield* relay.attach(domainOf(1), "prod.backend.generate")
      const client = yield* makeClient(relay.url)
      const current = pool.attachment.identity
      const firstError = (producer: ProducerIdentity, subscriber = "test") =>
        client.subscribePool(producer, subscriber).pipe(Stream.runHead, Effect.flip)

      const stale = new ProducerIdentity(current.poolId, current.producerIncarnation, 99n, current.format)
      expect(yield* firstError(stale)).toMatchObject({
        _tag: "RelayHttpError",
        status: 409,
        reason: "PRODUCER_CHANGED"
      })
      const elsewhere = new ProducerIdentity(
        new PoolId(domainOf(7), current.poolId.dcId),
        current.producerIncarnation,
        current.layoutGeneration,
        current.format
      )
      expect(yield* firstError(elsewhere)).toMatchObject({ status: 404, reason: "POOL_NOT_FOUND" })
      expect(yield* firstError(current, "bad\u0001id")).toMatchObject({
        status: 400,
        reason: "INVALID_REQUEST"
      })

      // A withdrawn generation ends its open streams with a terminal frame.
      const events: Array<PoolStreamEvent> = []
      const open = yield* Effect.fork(
        client.subscribePool(current, "test/withdrawn").pipe(
          Stream.runForEach((event) => Effect.sync(() => events.push(event))),
          Effect.flip
        )
      )
      for (let i = 0; i < 500 && events.length === 0; i++) yield* Effect.sleep("10 millis")
      yield* relay.registry.withdraw(current.poolId, current.layoutGeneration, "Graceful")
      const ended = yield* Fiber.join(open)
      expect(ended).toMatchObject({ _tag: "PoolStreamTerminated", reason: "PUBLICATION_UNAVAILABLE" })

      const unreachable = yield* makeClient("http://127.0.0.1:9", { requestTimeout: "2 seconds" })
      expect(yield* Effect.flip(unreachable.relayInfo)).toMatchObject({ _tag: "RelayTransportError" })
    })
  )
})
