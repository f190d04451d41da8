/**
 * Seed 002 (`kv_dc_relay/actor.rs`): the endpoint-pool CKF actor, its handle and the rank-recovery
 * target. Where the seed uses `tokio::time::timeout` to show that something does NOT finish, the
 * port forks it, advances the TestClock and checks with `Fiber.poll` that it is still pending.
 */

import { describe, expect, it } from "@effect/vitest"
import { Effect, Exit, Fiber, Option, Queue, TestClock } from "effect"
import { type CkfConfig, ckfConfig } from "../../src/ckf/config.js"
import type { CkfMemberRef } from "../../src/ckf/events.js"
import { eventFailurePoint, failureDisposition } from "../../src/ckf/failure.js"
import {
  CacheSemanticsId,
  DcId,
  IndexerDomainId,
  LaneLease,
  PoolId,
  RoutingScopeId
} from "../../src/ckf/identity.js"
import { DcCkfState } from "../../src/ckf/state.js"
import { type RouterEvent, storedEvent } from "../../src/protocol/Events.js"
import { make } from "../../src/relay/internal/PoolActorLoop.js"
import {
  type ActorFault,
  DEFAULT_FAULT_CAPACITY,
  DEFAULT_MAILBOX_CAPACITY,
  type PoolActorOptions,
  type StreamScope
} from "../../src/relay/PoolActor.js"
import * as PoolRecoveryTarget from "../../src/relay/PoolRecoveryTarget.js"

const scope = (): StreamScope => ({
  relayIncarnation: 1n,
  layoutGeneration: 1n,
  poolId: new PoolId(
    new IndexerDomainId(
      new CacheSemanticsId(new Uint8Array(16).fill(1), "explicit"),
      new RoutingScopeId(new Uint8Array(16).fill(3), "explicit")
    ),
    new DcId(2n)
  )
})

const lease = (epoch: number) => new LaneLease(4n, 0, BigInt(epoch))

const member = (workerId: number, dpRank: number): CkfMemberRef => ({ workerId: String(workerId), dpRank })

const stored = (worker: CkfMemberRef, eventId: number, hashes: ReadonlyArray<number>): RouterEvent =>
  storedEvent(worker.workerId, worker.dpRank, eventId, hashes)

const spawn = (config: CkfConfig, options: PoolActorOptions = {}) =>
  make(new DcCkfState(config), scope(), options)

/** The seed's `timeout(20 ms, faults.recv()).is_err()`: no fault arrives within 20 ms. */
const expectNoFaultWithin20ms = (faults: Queue.Dequeue<ActorFault>) =>
  Effect.gen(function* () {
    const recv = yield* Effect.fork(Queue.take(faults))
    yield* TestClock.adjust("20 millis")
    yield* Effect.yieldNow()
    expect(Option.isNone(yield* Fiber.poll(recv))).toBe(true)
    yield* Fiber.interrupt(recv)
    expect(yield* Queue.size(faults)).toBe(0)
  })

describe("seed 002: pool actor", () => {
  it.scoped("diagnostic_feature_exposes_rich_actor_and_snapshot_state", () =>
    Effect.gen(function* () {
      const worker = member(1, 0)
      const actor = yield* spawn(ckfConfig(32))

      yield* actor.admitEvent(0, stored(worker, 1, [1, 2]))
      yield* actor.flush
      const snapshot = yield* actor.snapshot

      expect(snapshot.stats.aggregation.uniqueBlockCount).toBe(2)
      expect(snapshot.words.length / 2).toBe(snapshot.identity.format.bucketCount)
      expect(actor.mailboxCapacity).toBe(DEFAULT_MAILBOX_CAPACITY)
      const diagnostics = yield* actor.diagnostics
      expect(diagnostics.unchangedPublications).toBeGreaterThan(0)
      expect(diagnostics.appliedEvents).toBe(1)
    })
  )

  it.scoped("admission_completes_before_a_paused_actor_applies_the_event", () =>
    Effect.gen(function* () {
      const worker = member(1, 0)
      const actor = yield* spawn(ckfConfig(32), { mailboxCapacity: 4 })
      const release = yield* actor.pause

      // Queue admission must not await the CKF mutation: the actor is paused.
      yield* actor.admitEvent(0, stored(worker, 1, [1]))
      expect(yield* actor.mailboxDepth).toBe(1)

      yield* release
      yield* actor.flush
      const { stats } = yield* actor.stateStats
      expect(stats.aggregation.uniqueBlockCount).toBe(1)
    })
  )

  it.scoped("bounded_mailbox_backpressures_before_admission_without_dropping_commands", () =>
    Effect.gen(function* () {
      const worker = member(1, 0)
      const actor = yield* spawn(ckfConfig(32), { mailboxCapacity: 1 })
      const release = yield* actor.pause
      yield* actor.admitEvent(0, stored(worker, 1, [1]))

      const second = yield* Effect.fork(actor.admitEvent(0, stored(worker, 2, [2])))
      yield* TestClock.adjust("20 millis")
      yield* Effect.yieldNow()
      expect(Option.isNone(yield* Fiber.poll(second))).toBe(true)

      yield* release
      yield* Fiber.join(second)
      yield* actor.flush
      const { stats } = yield* actor.stateStats
      expect(stats.aggregation.uniqueBlockCount).toBe(2)
    })
  )

  it.scoped("subscriber_gets_snapshot_then_one_atomic_replacement_delta", () =>
    Effect.gen(function* () {
      const worker = member(1, 0)
      const actor = yield* spawn(ckfConfig(32))
      yield* actor.admitEvent(0, stored(worker, 1, [1, 2]))
      yield* actor.flush
      const subscription = yield* actor.subscribe(lease(1))
      const baseSequence = subscription.snapshot.sequence

      yield* actor.replaceRank(0, worker.workerId, worker.dpRank, [stored(worker, 0, [3, 4])])
      const delta = yield* subscription.deltas.take
      expect(delta.baseSequence).toBe(baseSequence)
      expect(delta.sequence).toBe(baseSequence + 1n)
    })
  )

  it.scoped("initial_rank_recoveries_share_one_transactional_pool_rebuild", () =>
    Effect.gen(function* () {
      const first = member(1, 0)
      const second = member(2, 0)
      const actor = yield* spawn(ckfConfig(32))
      const target = yield* PoolRecoveryTarget.make(actor, {
        rebuildPermit: yield* Effect.makeSemaphore(1),
        expected: [first, second],
        initialDeadline: "100 millis"
      })

      const firstReplacement = yield* Effect.fork(
        target.replaceRank(1, first.workerId, first.dpRank, [stored(first, 0, [1, 2])])
      )
      yield* TestClock.adjust("20 millis")
      yield* Effect.yieldNow()
      // The first cold-start rank must wait for the recovery wave.
      expect(Option.isNone(yield* Fiber.poll(firstReplacement))).toBe(true)

      yield* target.replaceRank(1, second.workerId, second.dpRank, [stored(second, 0, [3])])
      yield* Fiber.join(firstReplacement)

      const { stats, members } = yield* actor.stateStats
      expect(stats.aggregation.uniqueBlockCount).toBe(3)
      expect(members.length).toBe(2)
      expect((yield* actor.diagnostics).rebuilds).toBe(1)
    })
  )

  it.scoped("shutdown_drains_admitted_events_and_rejects_new_admission", () =>
    Effect.gen(function* () {
      const worker = member(1, 0)
      const actor = yield* spawn(ckfConfig(32), { mailboxCapacity: 4 })
      const release = yield* actor.pause
      yield* actor.admitEvent(0, stored(worker, 1, [1]))
      const subscription = yield* Effect.fork(actor.shutdown)
      yield* release

      yield* Fiber.join(subscription)
      const error = yield* Effect.flip(actor.admitEvent(0, stored(worker, 2, [2])))
      expect(error._tag).toBe("RelayShuttingDown")
      expect((yield* actor.diagnostics).appliedEvents).toBe(1)
    })
  )

  it.scoped("producer_fence_retires_stream_without_publishing_uncertain_tail", () =>
    Effect.gen(function* () {
      const worker = member(1, 0)
      const actor = yield* spawn(ckfConfig(32, { publishEveryNEvents: 16 }), {
        publicationDelay: "10 seconds"
      })
      const subscription = yield* actor.subscribe(lease(1))
      yield* actor.admitEvent(0, stored(worker, 1, [1]))

      yield* actor.fence
      const closed = yield* Effect.flip(subscription.deltas.take)
      expect(closed._tag).toBe("DeltaStreamClosed")
      const error = yield* Effect.flip(actor.admitEvent(0, stored(worker, 2, [2])))
      expect(error._tag).toBe("RelayShuttingDown")
    })
  )

  it.scoped("producer_fence_interrupts_a_full_fault_channel", () =>
    Effect.gen(function* () {
      const worker = member(1, 0)
      const actor = yield* spawn(ckfConfig(32))
      yield* actor.admitEvent(0, stored(worker, 1, [1]))
      yield* actor.flush

      for (let eventId = 2; eventId <= DEFAULT_FAULT_CAPACITY + 2; eventId++) {
        yield* actor.admitEvent(1, stored(worker, eventId, [eventId]))
      }
      // The actor must block after filling the fault channel.
      let spins = 0
      while (
        (yield* Queue.size(actor.faults)) !== DEFAULT_FAULT_CAPACITY ||
        (yield* actor.mailboxDepth) !== 0
      ) {
        expect(++spins).toBeLessThan(10_000)
        yield* Effect.yieldNow()
      }
      expect((yield* actor.diagnostics).activeCommand).toBe("apply_event")

      // The fence must interrupt the blocked fault send.
      yield* actor.fence
      yield* actor.awaitStopped
    })
  )

  it.scoped("cadence_advances_on_duplicate_events_without_acknowledging_mutation", () =>
    Effect.gen(function* () {
      const worker = member(1, 0)
      const actor = yield* spawn(ckfConfig(32, { publishEveryNEvents: 16 }))
      const subscription = yield* actor.subscribe(lease(1))

      for (let eventId = 1; eventId <= 15; eventId++) {
        yield* actor.admitEvent(0, stored(worker, eventId, [7]))
      }
      const before = yield* actor.stateStats
      expect(before.sequence).toBe(0n)
      expect(before.stats.publication.pendingEvents).toBe(15)
      expect(Option.isNone(yield* subscription.deltas.poll)).toBe(true)

      yield* actor.admitEvent(0, stored(worker, 16, [7]))
      const delta = yield* subscription.deltas.take
      expect(delta.baseSequence).toBe(0n)
      expect(delta.sequence).toBe(1n)
      const after = yield* actor.stateStats
      expect(after.stats.publication.pendingEvents).toBe(0)
      expect(after.stats.aggregation.uniqueBlockCount).toBe(1)
    })
  )

  it.scoped("publication_timer_emits_a_sparse_tail_without_flush", () =>
    Effect.gen(function* () {
      const worker = member(1, 0)
      const actor = yield* spawn(ckfConfig(32, { publishEveryNEvents: 16 }), { publicationDelay: "1 millis" })
      const subscription = yield* actor.subscribe(lease(1))

      yield* actor.admitEvent(0, stored(worker, 1, [7]))
      const recv = yield* Effect.fork(subscription.deltas.take)
      // The seed allows 100 ms for the 1 ms timer; advance in 1 ms steps until it published.
      for (let ms = 0; ms < 100 && Option.isNone(yield* Fiber.poll(recv)); ms++) {
        yield* TestClock.adjust("1 millis")
        yield* Effect.yieldNow()
      }
      const delta = yield* Fiber.join(recv)

      expect([delta.baseSequence, delta.sequence]).toEqual([0n, 1n])
      expect((yield* actor.stateStats).sequence).toBe(1n)
    })
  )

  it.scoped("replacement_subscription_starts_after_the_old_lease_tail", () =>
    Effect.gen(function* () {
      const worker = member(1, 0)
      const actor = yield* spawn(ckfConfig(32, { publishEveryNEvents: 16 }), {
        publicationDelay: "10 seconds"
      })
      const old = yield* actor.subscribe(lease(1))
      yield* actor.admitEvent(0, stored(worker, 1, [7]))

      const replacement = yield* actor.subscribe(lease(2))
      const oldTail = yield* old.deltas.take
      expect(oldTail.lease.equals(lease(1))).toBe(true)
      expect(replacement.snapshot.sequence).toBe(oldTail.sequence)
      expect(Option.isNone(yield* replacement.deltas.poll)).toBe(true)

      yield* actor.admitEvent(0, stored(worker, 2, [8]))
      yield* actor.flush
      const continuation = yield* replacement.deltas.take
      expect(continuation.lease.equals(lease(2))).toBe(true)
      expect(continuation.baseSequence).toBe(replacement.snapshot.sequence)
      expect(continuation.sequence).toBe(replacement.snapshot.sequence + 1n)
    })
  )

  it.scoped("capacity_omission_is_observable_without_a_lifecycle_fault", () =>
    Effect.gen(function* () {
      const worker = member(1, 0)
      const actor = yield* spawn(ckfConfig(1, { maxKicks: 1 }))
      const hashes = Array.from({ length: 32 }, (_, i) => i + 1)

      yield* actor.admitEvent(0, stored(worker, 1, hashes))
      const { stats } = yield* actor.stateStats
      expect(stats.aggregation.uniqueBlockCount).toBeGreaterThan(0)
      expect(stats.aggregation.capacityFailures).toBeGreaterThan(0)

      // A pre-commit capacity omission must not enter lifecycle fault handling.
      yield* expectNoFaultWithin20ms(actor.faults)

      yield* actor.admitEvent(0, stored(worker, 2, [1]))
      yield* actor.flush
      // Later work must remain live without delayed capacity lifecycle faults.
      yield* expectNoFaultWithin20ms(actor.faults)
      expect((yield* actor.diagnostics).capacityOmissionEvents).toBe(1)
    })
  )

  it.scoped("failed_replacement_returns_barrier_error_without_replaying_or_faulting", () =>
    Effect.gen(function* () {
      const worker = member(1, 0)
      const foreign = member(2, 0)
      const actor = yield* spawn(ckfConfig(32))

      const exit = yield* Effect.exit(
        actor.replaceRank(0, worker.workerId, worker.dpRank, [stored(foreign, 1, [1])])
      )
      expect(Exit.isFailure(exit)).toBe(true)
      // A replacement build failure before swap leaves the old generation unchanged.
      yield* expectNoFaultWithin20ms(actor.faults)
    })
  )

  it("event_failures_keep_commit_domains_distinct", () => {
    const capacity = failureDisposition(eventFailurePoint("CapacityExhausted"))
    expect(capacity.action).toBe("ContinueCapacityOmission")
    expect(capacity.domain).toBe("ProducerCore")
    expect(capacity.commit).toBe("KnownUnchanged")
    expect(capacity.recoveryDomain).toBeUndefined()

    const allocation = failureDisposition(eventFailurePoint("AllocationFailed"))
    expect(allocation.action).toBe("ReportResourceFailure")
    expect(allocation.commit).toBe("KnownUnchanged")

    const source = failureDisposition(eventFailurePoint("OwnershipDegreeOverflow"))
    expect(source.action).toBe("RejectSource")
    expect(source.commit).toBe("KnownUnchanged")

    const invariant = failureDisposition(eventFailurePoint("IndexerInvariantViolation"))
    expect(invariant.action).toBe("FenceAndRebuildProducer")
    expect(invariant.commit).toBe("KnownUnchanged")
    expect(invariant.recoveryDomain).toBe("ProducerCore")
  })

  it.scoped("stale_source_epoch_cannot_mutate_or_fault_a_replacement_rank", () =>
    Effect.gen(function* () {
      const worker = member(1, 0)
      const actor = yield* spawn(ckfConfig(32))

      yield* actor.admitEvent(1, stored(worker, 1, [1]))
      yield* actor.resetRank(2, worker.workerId, worker.dpRank, false)

      yield* actor.admitEvent(1, stored(worker, 2, [2]))
      yield* actor.flush
      const { stats } = yield* actor.stateStats
      expect(stats.aggregation.uniqueBlockCount).toBe(0)

      const staleReset = yield* Effect.flip(actor.resetRank(1, worker.workerId, worker.dpRank, false))
      expect(staleReset).toMatchObject({ _tag: "StaleSourceEpoch", current: 2, received: 1 })
      const staleReplace = yield* Effect.flip(
        actor.replaceRank(1, worker.workerId, worker.dpRank, [stored(worker, 3, [3])])
      )
      expect(staleReplace).toMatchObject({ _tag: "StaleSourceEpoch", current: 2, received: 1 })
      // Stale traffic must not fault the replacement epoch.
      yield* expectNoFaultWithin20ms(actor.faults)
      expect((yield* actor.diagnostics).staleEventsDropped).toBe(1)
    })
  )
})
