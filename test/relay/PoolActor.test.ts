import { describe, expect, it } from "@effect/vitest"
import { Effect, Exit, Fiber, Option, Queue, Scope, TestClock } from "effect"
import { type CkfConfig, ckfConfig } from "../../src/ckf/config.js"
import {
  CacheSemanticsId,
  DcId,
  IndexerDomainId,
  LaneLease,
  PoolId,
  RoutingScopeId
} from "../../src/ckf/identity.js"
import { DcCkfState } from "../../src/ckf/state.js"
import { storedEvent } from "../../src/protocol/Events.js"
import { make } from "../../src/relay/internal/PoolActorLoop.js"
import type { PoolActorOptions, StreamScope } from "../../src/relay/PoolActor.js"

const streamScope: StreamScope = {
  relayIncarnation: 1n,
  layoutGeneration: 1n,
  poolId: new PoolId(
    new IndexerDomainId(
      new CacheSemanticsId(new Uint8Array(16).fill(1), "explicit"),
      new RoutingScopeId(new Uint8Array(16).fill(3), "explicit")
    ),
    new DcId(2n)
  )
}
const lease = (epoch: number) => new LaneLease(4n, 0, BigInt(epoch))
const stored = (eventId: number, hashes: ReadonlyArray<number>) => storedEvent("1", 0, eventId, hashes)
const spawn = (config: CkfConfig, options: PoolActorOptions = {}) =>
  make(new DcCkfState(config), streamScope, options)
const settle = Effect.forEach(Array.from({ length: 50 }), () => Effect.yieldNow(), { discard: true })

describe("PoolActor", () => {
  it.scoped("graceful shutdown publishes the tail, then receivers drain and close", () =>
    Effect.gen(function* () {
      const actor = yield* spawn(ckfConfig(32, { publishEveryNEvents: 16 }), {
        publicationDelay: "10 seconds"
      })
      const subscription = yield* actor.subscribe(lease(1))
      yield* actor.admitEvent(0, stored(1, [1]))
      yield* actor.admitEvent(0, stored(2, [2]))
      yield* actor.shutdown

      const tail = yield* subscription.deltas.take
      expect([tail.baseSequence, tail.sequence]).toEqual([0n, 1n])
      expect((yield* Effect.flip(subscription.deltas.take))._tag).toBe("DeltaStreamClosed")
      const diagnostics = yield* actor.diagnostics
      expect(diagnostics.shuttingDown).toBe(true)
      expect(diagnostics.appliedEvents).toBe(2)
      expect((yield* Effect.flip(actor.shutdown))._tag).toBe("RelayShuttingDown")
    })
  )

  it.scoped("a fence discards deltas a receiver had not taken yet", () =>
    Effect.gen(function* () {
      const actor = yield* spawn(ckfConfig(32))
      const subscription = yield* actor.subscribe(lease(1))
      yield* actor.admitEvent(0, stored(1, [1]))
      yield* actor.flush
      expect(Option.isSome(yield* subscription.deltas.poll)).toBe(true)
      yield* actor.admitEvent(0, stored(2, [2]))
      yield* actor.flush
      yield* actor.fence
      expect((yield* Effect.flip(subscription.deltas.take))._tag).toBe("DeltaStreamClosed")
    })
  )

  it.effect("closing the scope fences the actor", () =>
    Effect.gen(function* () {
      const scope = yield* Scope.make()
      const actor = yield* Scope.extend(spawn(ckfConfig(32, { publishEveryNEvents: 16 })), scope)
      const subscription = yield* Scope.extend(actor.subscribe(lease(1)), scope)
      yield* actor.admitEvent(0, stored(1, [1]))
      yield* Scope.close(scope, Exit.void)
      yield* actor.awaitStopped
      expect((yield* Effect.flip(subscription.deltas.take))._tag).toBe("DeltaStreamClosed")
      expect((yield* Effect.flip(actor.admitEvent(0, stored(2, [2]))))._tag).toBe("RelayShuttingDown")
      expect((yield* Effect.flip(actor.flush))._tag).toBe("RelayShuttingDown")
    })
  )

  it.scoped("a fence fails blocked admissions and stops queued commands", () =>
    Effect.gen(function* () {
      const actor = yield* spawn(ckfConfig(32), { mailboxCapacity: 1 })
      const release = yield* actor.pause
      const queuedFlush = yield* Effect.fork(actor.flush)
      yield* settle
      const blocked = yield* Effect.fork(actor.admitEvent(0, stored(1, [1])))
      yield* settle
      expect(Option.isNone(yield* Fiber.poll(blocked))).toBe(true)

      yield* actor.fence
      expect((yield* Effect.flip(Fiber.join(blocked)))._tag).toBe("RelayShuttingDown")
      expect((yield* Effect.flip(Fiber.join(queuedFlush)))._tag).toBe("ActorStopped")
      yield* release
    })
  )

  it.scoped("payload permits bound admitted blocks before the mailbox does", () =>
    Effect.gen(function* () {
      const actor = yield* spawn(ckfConfig(32), { pendingBlockPermits: 4 })
      const release = yield* actor.pause
      yield* actor.admitEvent(0, stored(1, [1, 2, 3, 4]))
      const second = yield* Effect.fork(actor.admitEvent(0, stored(2, [5])))
      yield* settle
      expect(Option.isNone(yield* Fiber.poll(second))).toBe(true)
      expect(yield* actor.mailboxDepth).toBe(1)

      yield* release
      yield* Fiber.join(second)
      yield* actor.flush
      expect((yield* actor.stateStats).stats.aggregation.uniqueBlockCount).toBe(5)
    })
  )

  it.scoped("admitEventsNow queues all of a batch or none of it", () =>
    Effect.gen(function* () {
      const actor = yield* spawn(ckfConfig(64), { mailboxCapacity: 3, pendingBlockPermits: 6 })
      const release = yield* actor.pause
      // The consumer holds at the pause: what is admitted now stays queued.
      yield* settle
      expect(actor.admitEventsNow(0, [stored(1, [1]), stored(2, [2])])).toBe(true)
      expect(yield* actor.mailboxDepth).toBe(2)
      // One slot left: a batch of two is refused whole.
      expect(actor.admitEventsNow(0, [stored(3, [3]), stored(4, [4])])).toBe(false)
      expect(yield* actor.mailboxDepth).toBe(2)
      // Room for one event, but not for its 5 blocks (2 of 6 permits taken): refused, nothing held.
      expect(actor.admitEventsNow(0, [stored(3, [3, 4, 5, 6, 7])])).toBe(false)
      expect(yield* actor.mailboxDepth).toBe(2)
      expect(actor.admitEventsNow(0, [stored(3, [3, 4, 5, 6])])).toBe(true)
      yield* release
      yield* actor.flush
      const diagnostics = yield* actor.diagnostics
      expect(diagnostics.appliedEvents).toBe(3)
      expect((yield* actor.stateStats).stats.aggregation.uniqueBlockCount).toBe(6)
      // Every permit came back: a batch of the whole 6 fits again.
      expect(actor.admitEventsNow(0, [stored(4, [11, 12, 13]), stored(5, [14, 15, 16])])).toBe(true)
      yield* actor.flush
      expect((yield* actor.stateStats).stats.aggregation.uniqueBlockCount).toBe(12)
    })
  )

  it.scoped("admitEventsNow never overtakes an admission waiting for permits, nor a stopped actor", () =>
    Effect.gen(function* () {
      const actor = yield* spawn(ckfConfig(64), { pendingBlockPermits: 4 })
      const release = yield* actor.pause
      yield* actor.admitEvent(0, stored(1, [1, 2, 3]))
      const waiting = yield* Effect.fork(actor.admitEvent(0, stored(2, [4, 5])))
      yield* settle
      expect(Option.isNone(yield* Fiber.poll(waiting))).toBe(true)
      // One permit is free, but the waiter comes first (FIFO, as the seed's semaphore).
      expect(actor.admitEventsNow(0, [stored(3, [6])])).toBe(false)
      yield* release
      yield* Fiber.join(waiting)
      yield* actor.flush
      expect((yield* actor.diagnostics).appliedEvents).toBe(2)
      yield* actor.shutdown
      expect(actor.admitEventsNow(0, [stored(3, [6])])).toBe(false)
      expect(actor.admitEventsNow(0, [])).toBe(true)
    })
  )

  it.scoped("a receiver that falls behind is lagged without blocking the actor", () =>
    Effect.gen(function* () {
      const actor = yield* spawn(ckfConfig(32), { publicationCapacity: 2 })
      const slow = yield* actor.subscribe(lease(1))
      for (let id = 1; id <= 3; id++) yield* actor.admitEvent(0, stored(id, [id]))
      yield* actor.flush
      expect((yield* Effect.flip(slow.deltas.take))._tag).toBe("DeltaStreamLagged")

      // A new subscription recovers with a snapshot covering everything.
      const fresh = yield* actor.subscribe(lease(2))
      expect(fresh.snapshot.sequence).toBe(3n)
      yield* slow.deltas.close
      yield* actor.admitEvent(0, stored(4, [4]))
      const next = yield* fresh.deltas.take
      expect([next.baseSequence, next.sequence]).toEqual([3n, 4n])
    })
  )

  it.scoped("the publication timer is disarmed at a boundary", () =>
    Effect.gen(function* () {
      const actor = yield* spawn(ckfConfig(32, { publishEveryNEvents: 2 }), { publicationDelay: "5 millis" })
      const subscription = yield* actor.subscribe(lease(1))
      yield* actor.admitEvent(0, stored(1, [1]))
      yield* actor.admitEvent(0, stored(2, [2]))
      const boundary = yield* subscription.deltas.take
      expect(boundary.sequence).toBe(1n)
      yield* TestClock.adjust("20 millis")
      yield* settle
      expect(Option.isNone(yield* subscription.deltas.poll)).toBe(true)

      // A sparse tail afterwards still goes out on the timer.
      yield* actor.admitEvent(0, stored(3, [3]))
      yield* actor.stateStats
      yield* settle
      yield* TestClock.adjust("5 millis")
      const tail = yield* subscription.deltas.take
      expect(tail.sequence).toBe(2n)
    })
  )

  it.scoped("the publish delay runs from a delta's oldest admitted event to its publication", () =>
    Effect.gen(function* () {
      const actor = yield* spawn(ckfConfig(32, { publishEveryNEvents: 2 }), { publicationDelay: "50 millis" })
      const subscription = yield* actor.subscribe(lease(1))
      const delay = () => Effect.map(actor.diagnostics, (d) => d.publishDelay)
      // Bucket indices by upper bound: 0 ≤ 1 ms, 1 ≤ 2, 2 ≤ 5, 3 ≤ 10, 4 ≤ 20, 5 ≤ 50, 6 ≤ 100, …
      const bucket = (counts: ReadonlyArray<number>) => counts.flatMap((n, i) => Array(n).fill(i))

      // Two events queued 3 ms apart behind a paused actor, published at the boundary 7 ms after
      // the first arrived.
      const release = yield* actor.pause
      yield* actor.admitEvent(0, stored(1, [1]))
      yield* TestClock.adjust("3 millis")
      yield* actor.admitEvent(0, stored(2, [2]))
      yield* TestClock.adjust("4 millis")
      yield* release
      yield* subscription.deltas.take
      let d = yield* delay()
      expect(d.count).toBe(1)
      expect(d.sumSeconds).toBeCloseTo(0.007, 9)
      expect(bucket(d.counts)).toEqual([3])

      // A lone event goes out on the timer, 50 ms later.
      yield* actor.admitEvent(0, stored(3, [3]))
      yield* settle
      yield* TestClock.adjust("50 millis")
      yield* subscription.deltas.take
      d = yield* delay()
      expect(d.count).toBe(2)
      expect(d.sumSeconds).toBeCloseTo(0.057, 9)
      expect(bucket(d.counts)).toEqual([3, 5])

      // A diagnostic snapshot publishes the pending tail at once, and closes its window: the next
      // delta's delay starts at its own event, not at the one the snapshot carried.
      yield* actor.admitEvent(0, stored(4, [4]))
      yield* settle
      yield* TestClock.adjust("30 millis")
      yield* actor.snapshot
      yield* subscription.deltas.take
      yield* TestClock.adjust("100 millis")
      yield* actor.admitEvent(0, stored(5, [5]))
      yield* settle
      yield* TestClock.adjust("2 millis")
      yield* actor.flush
      yield* subscription.deltas.take
      d = yield* delay()
      expect(d.count).toBe(4)
      expect(bucket(d.counts)).toEqual([1, 3, 5, 5])
      expect(d.sumSeconds).toBeCloseTo(0.007 + 0.05 + 0.03 + 0.002, 9)

      // A new subscription's barrier drains the window too (its tail goes out on the old lease).
      yield* actor.admitEvent(0, stored(6, [6]))
      yield* settle
      yield* TestClock.adjust("30 millis")
      yield* actor.subscribe(lease(2))
      yield* TestClock.adjust("100 millis")
      yield* actor.admitEvent(0, stored(7, [7]))
      yield* settle
      yield* TestClock.adjust("1 millis")
      yield* actor.flush
      d = yield* delay()
      expect(d.count).toBe(5)
      expect(d.sumSeconds).toBeCloseTo(0.089 + 0.001, 9)
    })
  )

  it.scoped("an expired timer fires at a turn's end even while commands keep coming", () =>
    Effect.gen(function* () {
      const actor = yield* spawn(ckfConfig(65_536, { publishEveryNEvents: 1_000_000 }), {
        publicationDelay: "1 millis"
      })
      const subscription = yield* actor.subscribe(lease(1))
      yield* actor.admitEvent(0, stored(1, [1]))
      const release = yield* actor.pause
      for (let id = 2; id <= 101; id++) yield* actor.admitEvent(0, stored(id, [id]))
      // The deadline passes while the actor is paused; its tick queues behind the 100 events.
      yield* TestClock.adjust("1 millis")
      yield* settle
      // After the release, events keep coming: several mailboxes' worth, a backlog of many turns.
      const last = 1_500
      const admitter = yield* Effect.fork(
        Effect.forEach(
          Array.from({ length: last - 101 }, (_, i) => 102 + i),
          (id) => actor.admitEvent(0, stored(id, [id])),
          { discard: true }
        )
      )
      yield* release
      // Each event dirties about one bucket of the large filter, so the first delta's images count
      // the events applied when it was published: at a turn's end, long before the backlog's.
      const first = yield* subscription.deltas.take
      expect(first.sequence).toBe(1n)
      const images = first.images.length / 3
      expect(images).toBeGreaterThanOrEqual(90)
      expect(images).toBeLessThan(600)
      yield* Fiber.join(admitter)
      yield* actor.flush
      expect((yield* actor.stateStats).stats.aggregation.uniqueBlockCount).toBe(last)
    })
  )

  it.scoped("reports an epoch advanced without a barrier as a source-protocol fault", () =>
    Effect.gen(function* () {
      const actor = yield* spawn(ckfConfig(32))
      yield* actor.admitEvent(3, stored(1, [1]))
      yield* actor.admitEvent(4, stored(2, [2]))
      const fault = yield* Queue.take(actor.faults)
      expect(fault).toMatchObject({
        workerId: "1",
        dpRank: 0,
        sourceEpoch: 4,
        eventId: 2,
        category: "SourceProtocol",
        message: "source epoch advanced from 3 to 4 without a reset or replacement barrier"
      })
      expect(fault.disposition.action).toBe("RejectSource")
      // The event was not applied; a replacement at the new epoch is accepted.
      yield* actor.replaceRank(4, "1", 0, [stored(0, [7])])
      yield* actor.admitEvent(4, stored(3, [8]))
      yield* actor.flush
      expect((yield* actor.stateStats).stats.aggregation.uniqueBlockCount).toBe(2)
    })
  )
})
