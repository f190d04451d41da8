/**
 * The endpoint slot over an in-memory discovery and the test clock: start retries, generation
 * replacement after a cancelled or fenced generation, fault dispositions, in-place refreshes
 * (load capacity), load observation, and the lightweight / fenced lifecycles.
 *
 * Sources advertise a ZeroMQ endpoint nobody listens on: the slot materializes from discovery
 * alone (the gate never waits for a socket), and the supervisor keeps the rank inactive.
 */

import { describe, expect, it } from "@effect/vitest"
import {
  Clock,
  Deferred,
  Effect,
  Fiber,
  HashMap,
  Logger,
  Option,
  Queue,
  SubscriptionRef,
  TestClock
} from "effect"
import { CkfBuildError } from "../../src/ckf/errors.js"
import { failureDisposition } from "../../src/ckf/failure.js"
import { DcId } from "../../src/ckf/identity.js"
import { hashPairsToBigInts } from "../../src/ckf/u64.js"
import { Discovery, type DiscoverySnapshot, makeStaticDiscovery } from "../../src/discovery/Discovery.js"
import { WATCH_ALL } from "../../src/discovery/DiscoveryConfig.js"
import type { EndpointMembership } from "../../src/discovery/Membership.js"
import { projectMembership } from "../../src/discovery/MembershipProjection.js"
import type { KvEventSource, ModelCardInstance } from "../../src/protocol/Discovery.js"
import { clearedEvent, removedEvent, storedEvent } from "../../src/protocol/Events.js"
import * as EndpointSlot from "../../src/relay/EndpointSlot.js"
import { make as makePoolActor } from "../../src/relay/internal/PoolActorLoop.js"
import type { ActorFault, MakePoolActor } from "../../src/relay/PoolActor.js"
import { externalCkfBuilder, type PoolRegistryOptions } from "../../src/relay/PoolRegistry.js"
import { foldTreeDump } from "../../src/relay/TreeDump.js"
import { makeZmqEventTransport } from "../../src/transport/ZmqEventTransport.js"
import { card, endpoint, source } from "../discovery/fixtures.js"
import { registry as makeRegistry } from "./registryFixtures.js"

const SERVING = "prod.backend.generate"

const baseCard = (runtime: Record<string, unknown> = {}): ModelCardInstance =>
  card({ endpoint: SERVING, worker: 7001, runtime: { totalKvBlocks: "1000", ...runtime } })

/** A live-only source on a port nobody listens on. */
const deafSource = (): KvEventSource => ({
  ...source({ endpoint: SERVING, worker: 7001, rank: 0, publisher: 100 }),
  transport: { kind: "dynamo-zmq", endpoint: "tcp://127.0.0.1:1", topic: "kv-events" }
})

const snapshot = (
  cards: ReadonlyArray<ModelCardInstance>,
  sources: ReadonlyArray<KvEventSource>
): DiscoverySnapshot => ({
  revision: 1n,
  cards,
  sources,
  rejectedSources: [],
  sourceStream: { epoch: 0, bound: true }
})

const project = (cards: ReadonlyArray<ModelCardInstance>, previous?: ReturnType<typeof projectMembership>) =>
  projectMembership(cards, {
    scope: WATCH_ALL,
    ...(previous === undefined ? {} : { previous: previous.view, nextGeneration: previous.nextGeneration })
  })

/** Waits on real time for work that real promises (sockets, allocations) complete; the test clock stays put. */
const until = (condition: () => boolean, what: string) =>
  Effect.gen(function* () {
    const deadline = Date.now() + 3000
    while (!condition()) {
      if (Date.now() > deadline) return yield* Effect.dieMessage(`timed out waiting until ${what}`)
      yield* Effect.promise(() => new Promise((resolve) => setTimeout(resolve, 1)))
    }
  })

const setup = (
  options: {
    readonly cards?: ReadonlyArray<ModelCardInstance>
    readonly registry?: Partial<PoolRegistryOptions>
  } = {}
) =>
  Effect.gen(function* () {
    const cards = options.cards ?? [baseCard()]
    const discovery = yield* makeStaticDiscovery(snapshot(cards, [deafSource()]))
    const registry = yield* makeRegistry(options.registry)
    const projection = project(cards)
    const metadata = yield* SubscriptionRef.make<EndpointMembership | undefined>(
      projection.view.endpoints.get(SERVING)
    )
    const stop = yield* Deferred.make<void>()
    const status = new EndpointSlot.EndpointSlotStatus(endpoint(SERVING))
    const fiber = yield* EndpointSlot.run({
      endpoint: endpoint(SERVING),
      dcId: new DcId(7n),
      registry,
      membership: metadata,
      stop,
      status,
      rebuildPermit: yield* Effect.makeSemaphore(1),
      recoverySemaphore: yield* Effect.makeSemaphore(16),
      recoveryAttemptTimeout: "1 second",
      eventTransport: makeZmqEventTransport()
    }).pipe(Effect.provideService(Discovery, discovery), Effect.fork)
    const generation = () => status.attachment?.layoutGeneration
    const stopSlot = Effect.zipRight(Deferred.succeed(stop, undefined), Fiber.join(fiber))
    return { registry, metadata, status, projection, generation, refresh: registry.catalog, stopSlot }
  })

/** Real pool actors whose fault queues the test holds (one per generation, in order). */
const injectableFaults = () => {
  const injected: Array<Queue.Queue<ActorFault>> = []
  const makeActor: MakePoolActor = (state, scope, options) =>
    Effect.gen(function* () {
      const actor = yield* makePoolActor(state, scope, options)
      const faults = yield* Queue.bounded<ActorFault>(16)
      injected.push(faults)
      return { ...actor, faults }
    })
  return { injected, makeActor }
}

describe("EndpointSlot", () => {
  it.scoped("a failed start retries after 100 ms, doubling", () =>
    Effect.gen(function* () {
      const attempts: Array<number> = []
      const slot = yield* setup({
        registry: {
          ckfBuilder: (config) =>
            Effect.flatMap(Clock.currentTimeMillis, (now) => {
              attempts.push(now)
              return now < 650
                ? Effect.fail(new CkfBuildError("AllocationFailed", "no memory today"))
                : externalCkfBuilder(config)
            })
        }
      })
      yield* until(() => attempts.length > 0 && slot.status.lifecycle === "fenced", "the first failure")
      const retried = (at: number) => until(() => attempts.includes(at), `the attempt at ${at} ms`)
      yield* TestClock.adjust("99 millis")
      expect(attempts.every((t) => t === 0)).toBe(true)
      yield* TestClock.adjust("1 millis")
      yield* retried(100)
      yield* TestClock.adjust("199 millis")
      expect(attempts.includes(299)).toBe(false)
      yield* TestClock.adjust("1 millis")
      yield* retried(300)
      yield* TestClock.adjust("399 millis")
      expect(slot.status.attachment).toBeUndefined()
      yield* TestClock.adjust("1 millis")
      yield* until(() => slot.status.lifecycle === "active", "the start at 700 ms")
      expect([...new Set(attempts)]).toEqual([0, 100, 300, 700])
      // Every attempt reserved a layout generation; generations are never reused.
      expect(slot.generation()).toBe(BigInt(attempts.length))
      expect((yield* slot.refresh).pools).toHaveLength(1)
      yield* slot.stopSlot
      expect(slot.status.lifecycle).toBe("lightweight")
      expect((yield* slot.refresh).pools).toHaveLength(0)
    })
  )

  it.scoped("a generation cancelled under the slot is fenced and replaced", () =>
    Effect.gen(function* () {
      const slot = yield* setup()
      yield* until(() => slot.status.lifecycle === "active", "generation 1")
      const first = slot.status.attachment!
      expect(yield* slot.registry.fenceGeneration(first.poolId, first.layoutGeneration, "hub failed")).toBe(
        true
      )
      yield* until(() => slot.generation() === 2n && slot.status.lifecycle === "active", "generation 2")
      const catalog = yield* slot.refresh
      expect(catalog.pools.map((d) => d.producer.layoutGeneration)).toEqual([2n])
      expect(yield* slot.registry.poolCount).toBe(1)
      yield* slot.stopSlot
    })
  )

  it.scoped("a producer fence fault replaces the generation; a stale resource fault keeps it", () =>
    Effect.gen(function* () {
      const { injected, makeActor } = injectableFaults()
      const slot = yield* setup({ registry: { makeActor } })
      yield* until(() => slot.status.lifecycle === "active", "generation 1")
      const fault = (point: Parameters<typeof failureDisposition>[0]): ActorFault => {
        const disposition = failureDisposition(point)
        return {
          workerId: "7001",
          dpRank: 0,
          sourceEpoch: 0,
          eventId: 1,
          category: disposition.action === "ReportResourceFailure" ? "Resource" : "ProducerInvariant",
          disposition,
          message: `injected ${point}`
        }
      }

      // The rank is not active in the supervisor (its socket never connects): the fault is stale.
      yield* Queue.offer(injected[0]!, fault("PrecommitAllocationFailure"))
      yield* until(() => Option.getOrElse(injected[0]!.unsafeSize(), () => 0) === 0, "the fault taken")
      yield* Effect.promise(() => new Promise((resolve) => setTimeout(resolve, 20)))
      expect(slot.generation()).toBe(1n)
      expect(slot.status.lifecycle).toBe("active")

      yield* Queue.offer(injected[0]!, fault("PrewriteInvariantMismatch"))
      yield* until(() => slot.generation() === 2n && slot.status.lifecycle === "active", "generation 2")
      expect((yield* slot.refresh).pools.map((d) => d.producer.layoutGeneration)).toEqual([2n])
      yield* slot.stopSlot
    })
  )

  // Effect's `Queue.take` hands an offered item straight to a waiting taker; a taker interrupted
  // before it resumes drops it. A fault offered while a membership change wakes the slot (the
  // same value set again: a wake-up with nothing to refresh) lands `turns` scheduler turns after
  // the set, inside the window for some turn counts. Every one must still reach the slot.
  it.scoped("a fault offered while a membership change wakes the slot is still handled", () => {
    const reported: Array<string> = []
    const logger = Logger.make(({ message, annotations }) => {
      const text = Array.isArray(message) ? message.join(" ") : String(message)
      const error = HashMap.get(annotations, "error")
      if (text.includes("actor failed an admitted mutation") && Option.isSome(error)) {
        reported.push(String(error.value))
      }
    })
    return Effect.gen(function* () {
      const { injected, makeActor } = injectableFaults()
      const slot = yield* setup({ registry: { makeActor } })
      yield* until(() => slot.status.lifecycle === "active", "generation 1")
      const membership = yield* SubscriptionRef.get(slot.metadata)
      const disposition = failureDisposition("PrecommitAllocationFailure")
      for (let turns = 0; turns <= 40; turns++) {
        const message = `injected after ${turns} turns`
        yield* SubscriptionRef.set(slot.metadata, membership)
        for (let i = 0; i < turns; i++) yield* Effect.yieldNow()
        yield* Queue.offer(injected[0]!, {
          workerId: "7001",
          dpRank: 0,
          sourceEpoch: 0,
          eventId: turns,
          category: "Resource",
          disposition,
          message
        })
        yield* until(() => reported.includes(message), `the fault offered after ${turns} turns is handled`)
        // Let the slot settle back into its wait before the next round.
        yield* Effect.yieldNow().pipe(Effect.repeatN(50))
      }
      // The rank is inactive (its socket never connects): every fault was stale; none fenced.
      expect(slot.generation()).toBe(1n)
      yield* slot.stopSlot
    }).pipe(Effect.provide(Logger.replace(Logger.defaultLogger, logger)))
  })

  it.scoped("an actor fault queue shut down under the slot fences and replaces the generation", () =>
    Effect.gen(function* () {
      const { injected, makeActor } = injectableFaults()
      const slot = yield* setup({ registry: { makeActor } })
      yield* until(() => slot.status.lifecycle === "active", "generation 1")
      yield* Queue.shutdown(injected[0]!)
      yield* until(() => slot.generation() === 2n && slot.status.lifecycle === "active", "generation 2")
      expect((yield* slot.refresh).pools.map((d) => d.producer.layoutGeneration)).toEqual([2n])
      yield* slot.stopSlot
    })
  )

  it.scoped("runtime configs refresh the load capacity in place and ranks report their exact blocks", () =>
    Effect.gen(function* () {
      const slot = yield* setup()
      yield* until(() => slot.status.lifecycle === "active", "generation 1")
      const load = () => SubscriptionRef.get(slot.registry.loadRef)
      expect((yield* load()).map((l) => [l.totalKvBlocks, l.kvExpectedRanks])).toEqual([[1000n, 1]])

      const actor = slot.status.attachment!.actor
      yield* actor.admitEvent(0, storedEvent("7001", 0, 1, [11, 12, 13]))
      yield* actor.flush
      yield* TestClock.adjust("1 second")
      const observed = yield* Effect.gen(function* () {
        for (let i = 0; i < 1000; i++) {
          const [entry] = yield* load()
          if (entry?.kvUsedBlocks === 3n) return entry
          yield* Effect.promise(() => new Promise((resolve) => setTimeout(resolve, 1)))
        }
        return yield* Effect.dieMessage("the load observation never arrived")
      })
      expect(observed.kvObservedRanks).toBe(1)

      const next = project([baseCard({ totalKvBlocks: "2000" })], slot.projection)
      yield* SubscriptionRef.set(slot.metadata, next.view.endpoints.get(SERVING))
      yield* until(() => slot.status.membership === next.view.endpoints.get(SERVING), "the new membership")
      const refreshed = yield* Effect.gen(function* () {
        for (let i = 0; i < 1000; i++) {
          const [entry] = yield* load()
          if (entry?.totalKvBlocks === 2000n) return entry
          yield* Effect.promise(() => new Promise((resolve) => setTimeout(resolve, 1)))
        }
        return yield* Effect.dieMessage("the new capacity never arrived")
      })
      expect(refreshed.producer.layoutGeneration).toBe(1n)
      expect(slot.generation()).toBe(1n)
      yield* slot.stopSlot
    })
  )

  it.scoped(
    "a membership that goes away leaves the slot lightweight; one that returns gets a new generation",
    () =>
      Effect.gen(function* () {
        const slot = yield* setup()
        yield* until(() => slot.status.lifecycle === "active", "generation 1")
        yield* SubscriptionRef.set(slot.metadata, undefined)
        yield* until(() => slot.status.lifecycle === "lightweight", "lightweight")
        expect(slot.status.attachment).toBeUndefined()
        expect((yield* slot.refresh).pools).toHaveLength(0)
        yield* SubscriptionRef.set(slot.metadata, slot.projection.view.endpoints.get(SERVING))
        yield* until(() => slot.status.lifecycle === "active" && slot.generation() === 2n, "generation 2")
        yield* slot.stopSlot
      })
  )

  it.scoped("a pool-fencing conflict keeps the slot fenced without a pool", () =>
    Effect.gen(function* () {
      // Two base cards of one worker: a ServingTopology conflict.
      const slot = yield* setup({
        cards: [baseCard(), { ...baseCard(), card: { ...baseCard().card, name: "other" } }]
      })
      yield* until(() => slot.status.lifecycle === "fenced", "fenced")
      expect(slot.status.membership?.conflicts.length).toBeGreaterThan(0)
      expect((yield* slot.refresh).pools).toHaveLength(0)
      yield* slot.stopSlot
    })
  )
})

describe("foldTreeDump", () => {
  it("folds a dump extended with removals into the rank's final blocks", () => {
    const dump = [
      storedEvent("7001", 0, 0, [1, 2, 3]),
      storedEvent("7001", 0, 0, [4]),
      removedEvent("7001", 0, 8, [2, 4]),
      storedEvent("7001", 0, 9, [5]),
      storedEvent("7001", 0, 9, [6], { storageTier: "host_pinned" })
    ]
    const folded = foldTreeDump("7001", 0, dump)
    expect(folded).toHaveLength(1)
    const data = folded[0]!.data
    expect(data._tag).toBe("Stored")
    if (data._tag === "Stored") expect(hashPairsToBigInts(data.blockHashes)).toEqual([1n, 3n, 5n])
  })

  it("passes Stored-only dumps, foreign events and clears through unchanged", () => {
    const stored = [storedEvent("7001", 0, 0, [1])]
    expect(foldTreeDump("7001", 0, stored)).toBe(stored)
    const foreign = [storedEvent("7001", 0, 0, [1]), removedEvent("7002", 0, 1, [1])]
    expect(foldTreeDump("7001", 0, foreign)).toBe(foreign)
    const cleared = [storedEvent("7001", 0, 0, [1]), clearedEvent("7001", 0, 1)]
    expect(foldTreeDump("7001", 0, cleared)).toBe(cleared)
  })
})
