/**
 * Seed 004 (`ingestion_pool.rs`): every test of the seed, at the pool level, with the seed's
 * fixture. Where the Rust test spins on wall-clock deadlines, these wait on the pool (a fault
 * queue take, fiber yields) or advance the `TestClock`.
 */

import { describe, expect, it } from "@effect/vitest"
import { type Duration, Effect, Fiber, Option, Queue, TestClock } from "effect"
import { ckfConfig } from "../../src/ckf/config.js"
import { GlobalCkfAssignmentError, GlobalCkfIndexer, GlobalCkfManifest } from "../../src/ckf/global.js"
import {
  CacheSemanticsId,
  DcId,
  IndexerDomainId,
  LaneLease,
  PoolId,
  ProducerIdentity,
  RoutingScopeId
} from "../../src/ckf/identity.js"
import type { DcCkfDelta, DcCkfSnapshot } from "../../src/ckf/publisher.js"
import { stickyWorker } from "../../src/ckf/splitmix.js"
import { DcCkfState } from "../../src/ckf/state.js"
import {
  AdmissionEpochExhausted,
  LaneRetired,
  OutstandingImageLimit,
  Saturated,
  WorkerFailed
} from "../../src/consumer/ConsumerErrors.js"
import {
  type GlobalCkfIngestionFault,
  ingestionFaultDisposition,
  WorkerHealth
} from "../../src/consumer/GlobalCkfIngestionPool.js"
import { makeWithTestHooks } from "../../src/consumer/internal/IngestionPoolLive.js"

const digest = (byte: number) => new Uint8Array(16).fill(byte)

/**
 * The seed's `Fixture`: CkfConfig(64), cache semantics [1;16] and routing scope [9;16] (explicit),
 * DC 7 on lane 3, consumer 11, one worker, control timeout 1 s, producer incarnation 13, layout
 * generation 1, lease epoch 1.
 */
const fixture = (
  queueCapacity: number,
  maxOutstandingImagesPerLane: number | undefined = undefined,
  maxDirtyToAppliedAge: Duration.DurationInput = "10 seconds"
) =>
  Effect.gen(function* () {
    const format = new DcCkfState(ckfConfig(64)).format
    const domain = new IndexerDomainId(
      new CacheSemanticsId(digest(1), "explicit"),
      new RoutingScopeId(digest(9), "explicit")
    )
    const poolId = new PoolId(domain, new DcId(7n))
    const consumer = 11n
    const lane = 3
    const lanes: Array<PoolId | undefined> = new Array(16).fill(undefined)
    lanes[lane] = poolId
    const indexer = new GlobalCkfIndexer(new GlobalCkfManifest(consumer, domain, format, lanes))
    const pool = yield* makeWithTestHooks(indexer, {
      workerCount: 1,
      queueCapacity,
      controlTimeout: "1 second",
      maxOutstandingImagesPerLane,
      maxDirtyToAppliedAge
    })
    const identity = new ProducerIdentity(poolId, 13n, 1n, format)
    const lease = new LaneLease(consumer, lane, 1n)
    const bucketCount = format.bucketCount
    const snapshot = (
      sequence: bigint,
      l: LaneLease = lease,
      words: Uint32Array = new Uint32Array(bucketCount * 2)
    ): DcCkfSnapshot => ({ identity, lease: l, sequence, words })
    const assignAndSnapshot = (sequence: bigint) =>
      Effect.gen(function* () {
        yield* pool.assign(identity, lease)
        expect(yield* pool.installSnapshot(snapshot(sequence))).toEqual({
          _tag: "SnapshotInstalled",
          sequence
        })
      })
    return {
      pool,
      hooks: pool.testHooks,
      indexer,
      format,
      identity,
      lease,
      bucketCount,
      lane,
      snapshot,
      assignAndSnapshot
    }
  })

/** `GlobalCkfBucketImage::new(bucket, word)` as the `[bucket, lo, hi]` triples a delta carries. */
const image = (bucket: number, word: number): ReadonlyArray<number> => [bucket, word, 0]

const deltaOf = (
  f: { readonly identity: ProducerIdentity; readonly lease: LaneLease },
  baseSequence: bigint,
  sequence: bigint,
  images: ReadonlyArray<ReadonlyArray<number>>
): DcCkfDelta => ({
  identity: f.identity,
  lease: f.lease,
  baseSequence,
  sequence,
  images: Uint32Array.from(images.flat())
})

/** Lets the other fibers run until `done` holds (the Rust tests' bounded spin loops). */
const eventually = (done: Effect.Effect<boolean>, what: string) =>
  Effect.gen(function* () {
    for (let i = 0; i < 10_000; i++) {
      if (yield* done) return
      yield* Effect.yieldNow()
    }
    throw new Error(`${what} did not happen`)
  })

/** Lets the workers process whatever is queued. */
const settle = Effect.yieldNow().pipe(Effect.repeatN(50))

describe("seed 004 GlobalCkfIngestionPool", () => {
  it.scoped("async_delta_precedes_awaited_drain_on_sticky_lane", () =>
    Effect.gen(function* () {
      const f = yield* fixture(8)
      yield* f.assignAndSnapshot(4n)
      yield* f.pool.submitDelta(deltaOf(f, 4n, 5n, [image(0, 17)]))

      expect(yield* f.pool.completeDrain({ lease: f.lease, expectedSequence: 5n })).toEqual({
        _tag: "DrainAcknowledged",
        installedSequence: 5n
      })
      expect(f.indexer.readyLanes()).toBe(1 << f.lane)
      expect(f.indexer.wordAt(0, f.lane)).toBe(17n)
    })
  )

  it.scoped("current_stream_gap_is_known_unchanged_and_deactivates_only_consumer_lane", () =>
    Effect.gen(function* () {
      const f = yield* fixture(8)
      yield* f.assignAndSnapshot(4n)
      yield* f.pool.submitDelta(deltaOf(f, 5n, 6n, [image(0, 17)]))

      const fault = yield* Queue.take(f.pool.faults)
      expect(fault).toMatchObject({ _tag: "LaneDeactivated", fault: { _tag: "BaseSequenceMismatch" } })
      const disposition = ingestionFaultDisposition(fault)
      expect(disposition.domain).toBe("ConsumerLane")
      expect(disposition.commit).toBe("KnownUnchanged")
      expect(disposition.action).toBe("DeactivateAndSnapshot")
      expect(f.indexer.readyLanes()).toBe(0)
      expect(f.indexer.wordAt(0, f.lane)).toBe(0n)
      // The deactivation retired the lane: traffic on the old lease is refused, not applied.
      const after = yield* Effect.flip(f.pool.submitDelta(deltaOf(f, 4n, 5n, [image(0, 23)])))
      expect(after._tag).toBe("LaneRetired")
      expect(f.indexer.wordAt(0, f.lane)).toBe(0n)
    })
  )

  it.scoped("stale_assignment_cannot_retire_ready_replacement", () =>
    Effect.gen(function* () {
      const f = yield* fixture(8)
      yield* f.assignAndSnapshot(4n)
      const replacement = new LaneLease(f.lease.consumerInstance, f.lane, f.lease.assignmentEpoch + 1n)
      yield* f.pool.assign(f.identity, replacement)
      expect(yield* f.pool.installSnapshot(f.snapshot(10n, replacement))).toEqual({
        _tag: "SnapshotInstalled",
        sequence: 10n
      })

      const error = yield* Effect.flip(f.pool.assign(f.identity, f.lease))
      expect(error._tag).toBe("AssignmentRejected")
      if (error._tag !== "AssignmentRejected") return
      expect(error.error).toBeInstanceOf(GlobalCkfAssignmentError)
      expect(error.error.detail).toEqual({
        kind: "StaleAssignmentEpoch",
        minimumExclusive: replacement.assignmentEpoch,
        actual: f.lease.assignmentEpoch
      })
      expect(f.indexer.readyLanes()).toBe(1 << f.lane)
      expect(yield* f.pool.completeDrain({ lease: replacement, expectedSequence: 10n })).toEqual({
        _tag: "DrainAcknowledged",
        installedSequence: 10n
      })
    })
  )

  it.scoped("foreign_assignment_validation_preserves_ready_lane", () =>
    Effect.gen(function* () {
      const f = yield* fixture(8)
      yield* f.assignAndSnapshot(4n)
      const foreignDomain = new IndexerDomainId(
        new CacheSemanticsId(digest(99), "explicit"),
        f.identity.indexerDomain.routingScope
      )
      const foreignIdentity = new ProducerIdentity(
        new PoolId(foreignDomain, f.identity.dcId),
        f.identity.producerIncarnation,
        f.identity.layoutGeneration,
        f.identity.format
      )
      const foreignLease = new LaneLease(f.lease.consumerInstance, f.lane, f.lease.assignmentEpoch + 1n)

      const error = yield* Effect.flip(f.pool.assign(foreignIdentity, foreignLease))
      expect(error._tag).toBe("AssignmentRejected")
      if (error._tag !== "AssignmentRejected") return
      expect(error.error.kind).toBe("WrongLaneOwner")
      expect(f.indexer.readyLanes()).toBe(1 << f.lane)
      expect(yield* f.pool.completeDrain({ lease: f.lease, expectedSequence: 4n })).toEqual({
        _tag: "DrainAcknowledged",
        installedSequence: 4n
      })
    })
  )

  it.scoped("stale_active_snapshot_is_ignored_without_rollback", () =>
    Effect.gen(function* () {
      const f = yield* fixture(8)
      yield* f.assignAndSnapshot(4n)
      const stale = f.snapshot(3n, f.lease, new Uint32Array(f.bucketCount * 2).fill(0xffff_ffff))

      expect(yield* f.pool.installSnapshot(stale)).toEqual({
        _tag: "IgnoredStaleOrDuplicate",
        installedSequence: 4n
      })
      expect(f.indexer.readyLanes()).toBe(1 << f.lane)
      expect(f.indexer.wordAt(0, f.lane)).toBe(0n)
      expect((yield* f.pool.completeDrain({ lease: f.lease, expectedSequence: 4n }))._tag).toBe(
        "DrainAcknowledged"
      )
    })
  )

  it.scoped("inactive_snapshot_failure_keeps_lease_retryable_without_producer_recovery", () =>
    Effect.gen(function* () {
      const f = yield* fixture(8)
      yield* f.pool.assign(f.identity, f.lease)
      const malformed = f.snapshot(4n, f.lease, new Uint32Array((f.bucketCount - 1) * 2))

      expect(yield* f.pool.installSnapshot(malformed)).toMatchObject({
        _tag: "LaneDeactivated",
        fault: { _tag: "InvalidSnapshotBucketCount" }
      })
      const fault = Option.getOrThrow(yield* f.pool.tryRecvFault)
      const disposition = ingestionFaultDisposition(fault)
      expect(disposition.domain).toBe("ConsumerLane")
      expect(disposition.commit).toBe("KnownUnchanged")
      expect(disposition.action).toBe("RetrySnapshot")

      expect(yield* f.pool.installSnapshot(f.snapshot(4n))).toEqual({
        _tag: "SnapshotInstalled",
        sequence: 4n
      })
      expect(f.indexer.readyLanes()).toBe(1 << f.lane)
    })
  )

  it.scoped("retirement_cannot_race_snapshot_activation_back_to_ready", () =>
    Effect.gen(function* () {
      const f = yield* fixture(8)
      yield* f.pool.assign(f.identity, f.lease)
      const pause = yield* f.hooks.pauseNextSnapshotActivation(f.lane)

      const install = yield* Effect.fork(f.pool.installSnapshot(f.snapshot(4n)))
      yield* pause.entered
      yield* f.hooks.retireLane(f.lane)
      expect(f.indexer.readyLanes()).toBe(0)
      yield* pause.release
      expect(yield* Effect.flip(Fiber.join(install))).toEqual(new LaneRetired({ lane: f.lane }))
      expect(f.indexer.readyLanes()).toBe(0)
    })
  )

  it.scoped("admission_epoch_exhaustion_fences_lane_fail_closed", () =>
    Effect.gen(function* () {
      const f = yield* fixture(8)
      yield* f.assignAndSnapshot(4n)
      yield* f.hooks.exhaustLaneEpoch(f.lane)

      expect(yield* Effect.flip(f.hooks.retireLane(f.lane))).toEqual(
        new AdmissionEpochExhausted({ lane: f.lane })
      )
      expect(f.indexer.readyLanes()).toBe(0)
      const replacement = new LaneLease(f.lease.consumerInstance, f.lane, f.lease.assignmentEpoch + 1n)
      expect(yield* Effect.flip(f.pool.assign(f.identity, replacement))).toEqual(
        new AdmissionEpochExhausted({ lane: f.lane })
      )
    })
  )

  it.scoped("outstanding_image_limit_is_lane_attributable_and_fail_closed", () =>
    Effect.gen(function* () {
      const f = yield* fixture(8, 1, "10 seconds")
      yield* f.assignAndSnapshot(0n)
      const delta = deltaOf(f, 0n, 1n, [image(0, 1), image(1, 2)])

      expect(yield* Effect.flip(f.pool.submitDelta(delta))).toEqual(
        new OutstandingImageLimit({ lane: f.lane, requested: 2, limit: 1 })
      )
      expect(f.indexer.readyLanes()).toBe(0)
      expect(Option.getOrThrow(yield* f.pool.tryRecvFault)).toMatchObject({
        _tag: "OutstandingImageLimit",
        lane: f.lane
      })
    })
  )

  it.scoped("stalled_delta_retires_lane_at_dirty_to_applied_deadline", () =>
    Effect.gen(function* () {
      const f = yield* fixture(8, undefined, "20 millis")
      yield* f.assignAndSnapshot(0n)
      const pause = yield* f.hooks.pauseLaneWorker(f.lane)
      yield* pause.entered
      yield* f.pool.submitDelta(deltaOf(f, 0n, 1n, [image(0, 1)]))

      // The watchdog polls every 5 ms; the delta is not yet too old at 19 ms.
      yield* TestClock.adjust("19 millis")
      expect(f.indexer.readyLanes()).toBe(1 << f.lane)
      yield* TestClock.adjust("1 millis")
      const fault = yield* f.pool.tryRecvFault
      yield* pause.release
      expect(f.indexer.readyLanes()).toBe(0)
      expect(Option.getOrThrow(fault)).toMatchObject({ _tag: "DirtyToAppliedAgeExceeded", lane: f.lane })
    })
  )

  it("worker_health_tracks_each_failed_worker", () => {
    const health = new WorkerHealth(3)
    health.recordFailure(0)
    health.recordFailure(2)
    expect(health.isFailed(0)).toBe(true)
    expect(health.isFailed(1)).toBe(false)
    expect(health.isFailed(2)).toBe(true)
    expect(health.failedWorker()).toBe(0)
  })

  it.scoped("saturation_retires_readiness_and_discards_queued_tail", () =>
    Effect.gen(function* () {
      const f = yield* fixture(1)
      yield* f.assignAndSnapshot(0n)
      const pause = yield* f.hooks.pauseLaneWorker(f.lane)
      yield* pause.entered

      yield* f.pool.submitDelta(deltaOf(f, 0n, 1n, [image(0, 1)]))
      expect(yield* Effect.flip(f.pool.submitDelta(deltaOf(f, 1n, 2n, [image(1, 2)])))).toEqual(
        new Saturated({ lane: f.lane })
      )
      expect(f.indexer.readyLanes()).toBe(0)
      yield* pause.release
      expect(yield* Effect.flip(f.pool.completeDrain({ lease: f.lease, expectedSequence: 1n }))).toEqual(
        new LaneRetired({ lane: f.lane })
      )
      const fault: Option.Option<GlobalCkfIngestionFault> = yield* f.pool.tryRecvFault
      expect(Option.getOrThrow(fault)).toMatchObject({ _tag: "Saturated", lane: f.lane })
      // The queued tail of the retired epoch was discarded, not applied.
      yield* settle
      expect(f.indexer.wordAt(0, f.lane)).toBe(0n)
    })
  )

  it.scoped("worker_failure_is_observable_and_clears_readiness", () =>
    Effect.gen(function* () {
      const f = yield* fixture(4)
      yield* f.assignAndSnapshot(0n)
      const worker = f.pool.workerForLane(f.lane)!
      yield* f.hooks.crashLaneWorker(f.lane)

      yield* eventually(Effect.map(f.pool.failedWorker, Option.isSome), "worker failure")
      expect(yield* f.pool.failedWorker).toEqual(Option.some(worker))
      expect(f.indexer.readyLanes()).toBe(0)
      const fault = yield* Queue.take(f.pool.faults)
      const disposition = ingestionFaultDisposition(fault)
      expect(disposition.domain).toBe("ConsumerLane")
      expect(disposition.commit).toBe("Uncertain")
      expect(disposition.action).toBe("DeactivateAndSnapshot")
      expect(yield* Effect.flip(f.pool.submitDelta(deltaOf(f, 0n, 1n, [image(0, 1)])))).toEqual(
        new WorkerFailed({ worker })
      )
    })
  )

  it.scoped("sticky_assignment_is_stable_for_consumer_and_lane", () =>
    Effect.gen(function* () {
      const f = yield* fixture(4)
      const worker = f.pool.workerForLane(f.lane)
      expect(f.pool.workerForLane(f.lane)).toBe(worker)
      expect(worker).toBe(stickyWorker(f.lease.consumerInstance, f.lane, 1))
    })
  )
})
