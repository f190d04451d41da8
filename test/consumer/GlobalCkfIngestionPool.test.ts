import { describe, expect, it } from "@effect/vitest"
import { Duration, Effect, Exit, Fiber, Option, Queue, Scope, TestClock, TestContext } from "effect"
import fc from "fast-check"
import { ckfConfig } from "../../src/ckf/config.js"
import { failureDisposition } from "../../src/ckf/failure.js"
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
import { type DcCkfDelta, DcCkfPublisher } from "../../src/ckf/publisher.js"
import { stickyWorker } from "../../src/ckf/splitmix.js"
import { DcCkfState } from "../../src/ckf/state.js"
import { hashPairs } from "../../src/ckf/u64.js"
import {
  AdmissionEpochExhausted,
  AssignmentRejected,
  AwaitingSnapshot,
  ControlTimeout,
  DirtyToAppliedAgeExceeded,
  GlobalCkfIngestionPoolConfigError,
  LaneRetired,
  LaneUnassigned,
  OutstandingImageLimit,
  Saturated,
  UnconfiguredLane,
  WorkerFailed
} from "../../src/consumer/ConsumerErrors.js"
import {
  DEFAULT_GLOBAL_INGESTION_CONTROL_TIMEOUT,
  DEFAULT_GLOBAL_INGESTION_QUEUE_CAPACITY,
  DEFAULT_GLOBAL_INGESTION_WORKERS,
  DEFAULT_GLOBAL_MAX_DIRTY_TO_APPLIED_AGE,
  defaultGlobalCkfIngestionPoolConfig,
  GlobalCkfIngestionFault,
  type GlobalCkfIngestionPoolConfig,
  ingestionErrorDisposition,
  ingestionFaultDisposition,
  lagPollInterval
} from "../../src/consumer/GlobalCkfIngestionPool.js"
import { make, makeWithTestHooks } from "../../src/consumer/internal/IngestionPoolLive.js"

// ---------------------------------------------------------------------------------------------
// Fixtures

const DOMAIN = new IndexerDomainId(
  new CacheSemanticsId(new Uint8Array(16).fill(1), "explicit"),
  new RoutingScopeId(new Uint8Array(16).fill(9), "explicit")
)
const CONFIG = ckfConfig(64)
const FORMAT = new DcCkfState(CONFIG).format

const indexerWith = (consumer: bigint, physicalLanes: ReadonlyArray<number>) => {
  const lanes: Array<PoolId | undefined> = new Array(16).fill(undefined)
  const pools = physicalLanes.map((lane, i) => {
    const pool = new PoolId(DOMAIN, new DcId(BigInt(100 + i)))
    lanes[lane] = pool
    return pool
  })
  return { indexer: new GlobalCkfIndexer(new GlobalCkfManifest(consumer, DOMAIN, FORMAT, lanes)), pools }
}

/** One lane (3) of consumer 11 with a single worker, as in seed 004, plus the helpers tests need. */
const singleLane = (config: Partial<GlobalCkfIngestionPoolConfig> = {}) =>
  Effect.gen(function* () {
    const lane = 3
    const { indexer, pools } = indexerWith(11n, [lane])
    const pool = yield* makeWithTestHooks(indexer, {
      workerCount: 1,
      queueCapacity: 8,
      controlTimeout: "1 second",
      ...config
    })
    const identity = new ProducerIdentity(pools[0]!, 13n, 1n, FORMAT)
    const lease = new LaneLease(11n, lane, 1n)
    const zeros = () => new Uint32Array(FORMAT.bucketCount * 2)
    const activate = (sequence: bigint, l: LaneLease = lease) =>
      Effect.gen(function* () {
        yield* pool.assign(identity, l)
        expect(yield* pool.installSnapshot({ identity, lease: l, sequence, words: zeros() })).toEqual({
          _tag: "SnapshotInstalled",
          sequence
        })
      })
    const delta = (base: bigint, bucket: number, word: number, l: LaneLease = lease): DcCkfDelta => ({
      identity,
      lease: l,
      baseSequence: base,
      sequence: base + 1n,
      images: Uint32Array.of(bucket, word, 0)
    })
    return { pool, hooks: pool.testHooks, indexer, lane, identity, lease, zeros, activate, delta }
  })

const settle = Effect.yieldNow().pipe(Effect.repeatN(50))

// ---------------------------------------------------------------------------------------------

describe("GlobalCkfIngestionPool configuration", () => {
  it("has the seed's defaults and poll interval", () => {
    expect(DEFAULT_GLOBAL_INGESTION_WORKERS).toBe(4)
    expect(DEFAULT_GLOBAL_INGESTION_QUEUE_CAPACITY).toBe(256)
    expect(Duration.toMillis(DEFAULT_GLOBAL_INGESTION_CONTROL_TIMEOUT)).toBe(10_000)
    expect(Duration.toMillis(DEFAULT_GLOBAL_MAX_DIRTY_TO_APPLIED_AGE)).toBe(10)
    expect(defaultGlobalCkfIngestionPoolConfig.maxOutstandingImagesPerLane).toBeUndefined()
    expect(Duration.toMillis(lagPollInterval("10 millis"))).toBe(2.5)
    expect(Duration.toMillis(lagPollInterval("200 micros"))).toBe(0.1)
    expect(Duration.toMillis(lagPollInterval("1 second"))).toBe(10)
    expect(Duration.toMillis(lagPollInterval(Duration.infinity))).toBe(10)
  })

  it.scoped("rejects zero values in the seed's order, naming the setting and the value", () =>
    Effect.gen(function* () {
      const { indexer } = indexerWith(11n, [3])
      const cases: ReadonlyArray<readonly [Partial<GlobalCkfIngestionPoolConfig>, string]> = [
        [{ workerCount: 0, queueCapacity: 0 }, "InvalidWorkerCount"],
        [{ workerCount: 1.5 }, "InvalidWorkerCount"],
        [{ queueCapacity: 0, controlTimeout: 0 }, "InvalidQueueCapacity"],
        [{ controlTimeout: 0, maxOutstandingImagesPerLane: 0 }, "InvalidControlTimeout"],
        [{ maxOutstandingImagesPerLane: 0, maxDirtyToAppliedAge: 0 }, "InvalidOutstandingImageBound"],
        [{ maxDirtyToAppliedAge: Duration.zero }, "InvalidDirtyToAppliedAge"]
      ]
      for (const [config, kind] of cases) {
        const error = yield* Effect.flip(make(indexer, config))
        expect(error).toBeInstanceOf(GlobalCkfIngestionPoolConfigError)
        expect(error._tag === "GlobalCkfIngestionPoolConfigError" && error.kind).toBe(kind)
      }
      const error = yield* Effect.flip(make(indexer, { queueCapacity: 0 }))
      expect(error.message).toBe("global CKF ingestion queue capacity must be greater than zero (got 0)")
      // Nothing was claimed by the failed constructions.
      expect(indexer.claimedLanes()).toBe(0)
    })
  )

  it.scoped("a lane already claimed elsewhere fails construction and gives back the lanes it took", () =>
    Effect.gen(function* () {
      const { indexer } = indexerWith(11n, [1, 9])
      const held = indexer.claimLane(9)
      const error = yield* Effect.flip(make(indexer))
      expect(error._tag).toBe("GlobalCkfIngestionPoolClaimError")
      expect(error.message).toBe("global CKF lane 9 already has an ingestion owner")
      expect(indexer.claimedLanes()).toBe(1 << 9)
      if (!(held instanceof Error)) held.release()
    })
  )
})

describe("GlobalCkfIngestionPool routing", () => {
  it.scoped("maps lanes with stickyWorker (reference vector: consumer 17, lane 3, 4 workers → 2)", () =>
    Effect.gen(function* () {
      const lanes = [0, 3, 6, 11, 15]
      const { indexer } = indexerWith(17n, lanes)
      const pool = yield* make(indexer, { workerCount: 4 })
      expect(pool.workerForLane(3)).toBe(2)
      for (const lane of lanes) expect(pool.workerForLane(lane)).toBe(stickyWorker(17n, lane, 4))
      expect(pool.workerForLane(5)).toBeUndefined()
      expect(pool.workerForLane(16)).toBeUndefined()
      expect(pool.workerCount).toBe(4)
    })
  )

  it.scoped("rejects traffic for unconfigured, unassigned and snapshot-less lanes without writing", () =>
    Effect.gen(function* () {
      const f = yield* singleLane()
      const foreignLane = new LaneLease(11n, 4, 1n)
      expect(yield* Effect.flip(f.pool.assign(f.identity, foreignLane))).toEqual(
        new UnconfiguredLane({ lane: 4 })
      )
      expect(yield* Effect.flip(f.pool.submitDelta(f.delta(0n, 0, 1, new LaneLease(11n, 99, 1n))))).toEqual(
        new UnconfiguredLane({ lane: 99 })
      )
      expect(
        yield* Effect.flip(
          f.pool.installSnapshot({ identity: f.identity, lease: f.lease, sequence: 1n, words: f.zeros() })
        )
      ).toEqual(new LaneUnassigned({ lane: f.lane }))
      expect(yield* Effect.flip(f.pool.submitDelta(f.delta(0n, 0, 1)))).toEqual(
        new LaneUnassigned({ lane: f.lane })
      )
      yield* f.pool.assign(f.identity, f.lease)
      expect(yield* Effect.flip(f.pool.submitDelta(f.delta(0n, 0, 1)))).toEqual(
        new AwaitingSnapshot({ lane: f.lane })
      )
      expect(yield* Effect.flip(f.pool.completeDrain({ lease: f.lease, expectedSequence: 0n }))).toEqual(
        new LaneRetired({ lane: f.lane })
      )
      // None of these is a consumer write, so none of them asks for recovery.
      expect(yield* f.pool.tryRecvFault).toEqual(Option.none())
    })
  )

  it.scoped("a refused assignment at the worker is not reached: validation happens at admission", () =>
    Effect.gen(function* () {
      const f = yield* singleLane()
      const wrongConsumer = new LaneLease(12n, f.lane, 1n)
      const error = yield* Effect.flip(f.pool.assign(f.identity, wrongConsumer))
      expect(error).toBeInstanceOf(AssignmentRejected)
      expect(error._tag === "AssignmentRejected" && error.error).toBeInstanceOf(GlobalCkfAssignmentError)
      expect(error.message).toBe("global CKF assignment failed: lease targets consumer 12, expected 11")
      // The lane stays usable with a valid lease.
      yield* f.activate(1n)
    })
  )
})

describe("GlobalCkfIngestionPool failure handling", () => {
  it("classifies every error and fault as in ckf-core §7.6", () => {
    const gap = failureDisposition("ConsumerGapOrMalformedBeforeWrite")
    const uncertain = failureDisposition("ConsumerWorkerFailureMidApply")
    expect(ingestionErrorDisposition(new Saturated({ lane: 1 }))).toBe(gap)
    expect(ingestionErrorDisposition(new OutstandingImageLimit({ lane: 1, requested: 3, limit: 2 }))).toBe(
      gap
    )
    expect(ingestionErrorDisposition(new DirtyToAppliedAgeExceeded({ lane: 1 }))).toBe(uncertain)
    expect(ingestionErrorDisposition(new ControlTimeout({ lane: 1 }))).toBe(uncertain)
    expect(ingestionErrorDisposition(new WorkerFailed({ worker: 0 }))).toBe(uncertain)
    for (const error of [
      new UnconfiguredLane({ lane: 1 }),
      new LaneUnassigned({ lane: 1 }),
      new LaneRetired({ lane: 1 }),
      new AwaitingSnapshot({ lane: 1 }),
      new AssignmentRejected({ lane: 1, error: new GlobalCkfAssignmentError({ kind: "WrongFormat" }) }),
      new AdmissionEpochExhausted({ lane: 1 })
    ]) {
      expect(ingestionErrorDisposition(error)).toBeUndefined()
    }
    const lease = new LaneLease(1n, 1, 1n)
    expect(ingestionFaultDisposition(GlobalCkfIngestionFault.Saturated({ lane: 1, lease }))).toBe(gap)
    expect(
      ingestionFaultDisposition(
        GlobalCkfIngestionFault.OutstandingImageLimit({ lane: 1, lease, requested: 2, limit: 1 })
      )
    ).toBe(gap)
    expect(
      ingestionFaultDisposition(GlobalCkfIngestionFault.DirtyToAppliedAgeExceeded({ lane: 1, lease }))
    ).toBe(uncertain)
    expect(ingestionFaultDisposition(GlobalCkfIngestionFault.WorkerFailed({ worker: 0 }))).toBe(uncertain)
    const retry = failureDisposition("InactiveSnapshotInstallFailure")
    expect(
      ingestionFaultDisposition(
        GlobalCkfIngestionFault.LaneDeactivated({
          lane: 1,
          lease,
          fault: { _tag: "WrongIdentity" },
          disposition: retry
        })
      )
    ).toBe(retry)
    expect(new OutstandingImageLimit({ lane: 2, requested: 5, limit: 4 }).message).toBe(
      "global CKF lane 2 exceeded its outstanding-image bound (5 requested, 4 allowed); its lease was retired"
    )
  })

  it.scoped("a control operation that gets no reply times out on the Clock and retires only its lane", () =>
    Effect.gen(function* () {
      const f = yield* singleLane()
      yield* f.activate(1n)
      const pause = yield* f.hooks.pauseLaneWorker(f.lane)
      yield* pause.entered
      const drain = yield* Effect.fork(f.pool.completeDrain({ lease: f.lease, expectedSequence: 1n }))
      yield* TestClock.adjust("999 millis")
      expect(f.indexer.readyLanes()).toBe(1 << f.lane)
      yield* TestClock.adjust("1 millis")
      const error = yield* Effect.flip(Fiber.join(drain))
      expect(error).toEqual(new ControlTimeout({ lane: f.lane }))
      expect(ingestionErrorDisposition(error)?.commit).toBe("Uncertain")
      expect(f.indexer.readyLanes()).toBe(0)
      // The queued marker belongs to the retired epoch: it is rejected, not acknowledged.
      yield* pause.release
      yield* settle
      expect(yield* Effect.flip(f.pool.submitDelta(f.delta(1n, 0, 1)))).toEqual(
        new LaneRetired({ lane: f.lane })
      )
    })
  )

  it.scoped("a full queue makes a control send wait, bounded by the control timeout", () =>
    Effect.gen(function* () {
      const f = yield* singleLane({ queueCapacity: 1, maxDirtyToAppliedAge: "10 seconds" })
      yield* f.activate(1n)
      const pause = yield* f.hooks.pauseLaneWorker(f.lane)
      yield* pause.entered
      yield* f.pool.submitDelta(f.delta(1n, 0, 5))
      const drain = yield* Effect.fork(f.pool.completeDrain({ lease: f.lease, expectedSequence: 2n }))
      yield* TestClock.adjust("500 millis")
      yield* pause.release
      // Once the worker runs, the send gets its slot and the marker sees the delta first.
      expect(yield* Fiber.join(drain)).toEqual({ _tag: "DrainAcknowledged", installedSequence: 2n })
      expect(f.indexer.wordAt(0, f.lane)).toBe(5n)
    })
  )

  it.scoped("the age bound is also enforced at admission, between watchdog polls", () =>
    Effect.gen(function* () {
      const f = yield* singleLane({ maxDirtyToAppliedAge: "20 millis" })
      yield* f.activate(0n)
      const pause = yield* f.hooks.pauseLaneWorker(f.lane)
      yield* pause.entered
      yield* TestClock.adjust("1 millis")
      yield* f.pool.submitDelta(f.delta(0n, 0, 1))
      // Polls at 5, 10, 15 and 20 ms see ages below 20 ms; at 22 ms the oldest delta is 21 ms old.
      yield* TestClock.adjust("21 millis")
      expect(f.indexer.readyLanes()).toBe(1 << f.lane)
      expect(yield* Effect.flip(f.pool.submitDelta(f.delta(1n, 1, 1)))).toEqual(
        new DirtyToAppliedAgeExceeded({ lane: f.lane })
      )
      expect(f.indexer.readyLanes()).toBe(0)
      expect(Option.getOrThrow(yield* f.pool.tryRecvFault)).toEqual(
        GlobalCkfIngestionFault.DirtyToAppliedAgeExceeded({ lane: f.lane, lease: f.lease })
      )
      yield* pause.release
    })
  )

  it.scoped("applied deltas release their images, so the bound limits only what is outstanding", () =>
    Effect.gen(function* () {
      const f = yield* singleLane({ maxOutstandingImagesPerLane: 2 })
      yield* f.activate(0n)
      for (let i = 0; i < 10; i++) {
        yield* f.pool.submitDelta(f.delta(BigInt(i), i % 4, i + 1))
        yield* settle
      }
      expect(yield* f.pool.completeDrain({ lease: f.lease, expectedSequence: 10n })).toEqual({
        _tag: "DrainAcknowledged",
        installedSequence: 10n
      })
      expect(f.indexer.readyLanes()).toBe(1 << f.lane)
    })
  )

  it.scoped("a stale-epoch delta is rejected and retires the worker's ingestor", () =>
    Effect.gen(function* () {
      const f = yield* singleLane()
      yield* f.activate(0n)
      const pause = yield* f.hooks.pauseLaneWorker(f.lane)
      yield* pause.entered
      yield* f.pool.submitDelta(f.delta(0n, 0, 9))
      yield* f.hooks.retireLane(f.lane)
      yield* pause.release
      yield* settle
      expect(f.indexer.wordAt(0, f.lane)).toBe(0n)
      // The same lease cannot come back: its epoch is spent at the pool and at the ingestor.
      const error = yield* Effect.flip(f.pool.assign(f.identity, f.lease))
      expect(error._tag === "AssignmentRejected" && error.error.kind).toBe("StaleAssignmentEpoch")
      yield* f.activate(4n, new LaneLease(11n, f.lane, 2n))
    })
  )

  // The worker's epoch check (seed: `if epoch != current_epoch { command.reject_stale(lane) }`):
  // the worker has already retired its ingestor by the time it meets these commands, so what the
  // check adds is their answer (LaneRetired) and keeping a superseded lease out of the ingestor.
  it.scoped("a drain queued before its lane retired fails LaneRetired instead of being answered", () =>
    Effect.gen(function* () {
      const f = yield* singleLane()
      yield* f.activate(1n)
      const pause = yield* f.hooks.pauseLaneWorker(f.lane)
      yield* pause.entered
      const drain = yield* Effect.fork(f.pool.completeDrain({ lease: f.lease, expectedSequence: 1n }))
      yield* settle
      yield* f.hooks.retireLane(f.lane)
      yield* pause.release
      expect(yield* Effect.flip(Fiber.join(drain))).toEqual(new LaneRetired({ lane: f.lane }))
    })
  )

  it.scoped(
    "an assignment that timed out in the queue leaves no trace: the same lease can be assigned again",
    () =>
      Effect.gen(function* () {
        const f = yield* singleLane({ maxDirtyToAppliedAge: "10 seconds" })
        const pause = yield* f.hooks.pauseLaneWorker(f.lane)
        yield* pause.entered
        const assign = yield* Effect.fork(f.pool.assign(f.identity, f.lease))
        yield* TestClock.adjust("1 second")
        expect(yield* Effect.flip(Fiber.join(assign))).toEqual(new ControlTimeout({ lane: f.lane }))
        // The worker now reaches the stale assignment; it must not spend the lease's epoch.
        yield* pause.release
        yield* settle
        yield* f.activate(2n)
        expect(f.indexer.readyLanes()).toBe(1 << f.lane)
      })
  )

  it.scoped("a worker failure fails the control operations queued behind it with WorkerFailed", () =>
    Effect.gen(function* () {
      const f = yield* singleLane()
      yield* f.activate(0n)
      const pause = yield* f.hooks.pauseLaneWorker(f.lane)
      yield* pause.entered
      yield* f.hooks.crashLaneWorker(f.lane)
      yield* f.pool.submitDelta(f.delta(0n, 0, 1))
      const drain = yield* Effect.fork(f.pool.completeDrain({ lease: f.lease, expectedSequence: 1n }))
      yield* settle
      yield* pause.release
      expect(yield* Effect.flip(Fiber.join(drain))).toEqual(new WorkerFailed({ worker: 0 }))
      expect(f.indexer.readyLanes()).toBe(0)
      expect(f.indexer.wordAt(0, f.lane)).toBe(0n)
      // The failed worker's lanes were given back, like the seed's dropped worker.
      expect(f.indexer.claimedLanes()).toBe(0)
      expect(yield* Effect.flip(f.pool.assign(f.identity, new LaneLease(11n, f.lane, 2n)))).toEqual(
        new WorkerFailed({ worker: 0 })
      )
      expect(Option.getOrThrow(yield* f.pool.tryRecvFault)).toEqual(
        GlobalCkfIngestionFault.WorkerFailed({ worker: 0 })
      )
    })
  )

  it.scoped("the fault channel is bounded and drops what does not fit", () =>
    Effect.gen(function* () {
      const f = yield* singleLane({ maxOutstandingImagesPerLane: 1 })
      for (let epoch = 1n; epoch <= 40n; epoch++) {
        const lease = new LaneLease(11n, f.lane, epoch)
        yield* f.activate(0n, lease)
        const twoImages: DcCkfDelta = {
          ...f.delta(0n, 0, 1, lease),
          images: Uint32Array.of(0, 1, 0, 1, 2, 0)
        }
        expect((yield* Effect.flip(f.pool.submitDelta(twoImages)))._tag).toBe("OutstandingImageLimit")
      }
      expect(yield* Queue.size(f.pool.faults)).toBe(16 * 2 + 1)
    })
  )

  it.effect("closing the scope retires every lane, stops the workers and gives the lanes back", () =>
    Effect.gen(function* () {
      const scope = yield* Scope.make()
      const f = yield* singleLane().pipe(Scope.extend(scope))
      yield* f.activate(0n)
      expect(f.indexer.readyLanes()).toBe(1 << f.lane)
      expect(f.indexer.claimedLanes()).toBe(1 << f.lane)
      yield* Scope.close(scope, Exit.void)
      expect(f.indexer.readyLanes()).toBe(0)
      expect(f.indexer.claimedLanes()).toBe(0)
      expect(yield* Effect.flip(f.pool.submitDelta(f.delta(0n, 0, 1)))).toEqual(
        new LaneRetired({ lane: f.lane })
      )
      expect(yield* Effect.flip(f.pool.assign(f.identity, new LaneLease(11n, f.lane, 2n)))).toEqual(
        new LaneRetired({ lane: f.lane })
      )
    })
  )
})

// ---------------------------------------------------------------------------------------------
// Property: random interleavings across lanes

type Op =
  | {
      readonly kind: "event"
      readonly lane: number
      readonly store: boolean
      readonly member: number
      readonly keys: ReadonlyArray<number>
    }
  | { readonly kind: "submit"; readonly lane: number; readonly count: number }
  | { readonly kind: "run"; readonly yields: number }
  | { readonly kind: "retire"; readonly lane: number }
  | { readonly kind: "resubscribe"; readonly lane: number }
  | { readonly kind: "drain"; readonly lane: number }

const LANES = [0, 6, 15] as const
const laneArb = fc.nat({ max: LANES.length - 1 })

const opArb: fc.Arbitrary<Op> = fc.oneof(
  {
    weight: 6,
    arbitrary: fc.record({
      kind: fc.constant("event" as const),
      lane: laneArb,
      store: fc.boolean(),
      member: fc.nat({ max: 1 }),
      keys: fc.array(fc.nat({ max: 40 }), { minLength: 1, maxLength: 6 })
    })
  },
  {
    weight: 4,
    arbitrary: fc.record({
      kind: fc.constant("submit" as const),
      lane: laneArb,
      count: fc.integer({ min: 1, max: 4 })
    })
  },
  {
    weight: 3,
    arbitrary: fc.record({ kind: fc.constant("run" as const), yields: fc.integer({ min: 1, max: 4 }) })
  },
  { weight: 1, arbitrary: fc.record({ kind: fc.constant("retire" as const), lane: laneArb }) },
  { weight: 1, arbitrary: fc.record({ kind: fc.constant("resubscribe" as const), lane: laneArb }) },
  { weight: 1, arbitrary: fc.record({ kind: fc.constant("drain" as const), lane: laneArb }) }
)

const RETIRING = new Set(["Saturated", "OutstandingImageLimit"])

const runInterleaving = (
  consumer: bigint,
  workerCount: number,
  queueCapacity: number,
  maxOutstandingImagesPerLane: number | undefined,
  ops: ReadonlyArray<Op>
) =>
  Effect.gen(function* () {
    const { indexer, pools } = indexerWith(consumer, LANES)
    const pool = yield* makeWithTestHooks(indexer, {
      workerCount,
      queueCapacity,
      maxOutstandingImagesPerLane
    })
    const hooks = pool.testHooks
    const lanes = LANES.map((physical, i) => {
      const state = new DcCkfState(CONFIG)
      const identity = new ProducerIdentity(pools[i]!, 1n, 1n, FORMAT)
      const pending: Array<DcCkfDelta> = []
      const publisher = new DcCkfPublisher(identity, 0n, {
        enqueue: (delta: DcCkfDelta) => {
          pending.push(delta)
          return undefined
        }
      })
      return {
        physical,
        state,
        identity,
        pending,
        publisher,
        epoch: 0n,
        lease: undefined as LaneLease | undefined,
        active: false,
        /** The lane's words when the pool retired it; they must not change until the next assignment. */
        frozen: undefined as Array<number> | undefined
      }
    })
    type Lane = (typeof lanes)[number]
    const words = (lane: Lane) => Array.from(indexer.laneWords(lane.physical))
    const freeze = (lane: Lane) => {
      lane.active = false
      lane.frozen ??= words(lane)
    }
    const checkFrozen = () => {
      for (const lane of lanes) if (lane.frozen !== undefined) expect(words(lane)).toEqual(lane.frozen)
    }

    const resubscribe = (lane: Lane) =>
      Effect.gen(function* () {
        lane.epoch += 1n
        const lease = new LaneLease(consumer, lane.physical, lane.epoch)
        lane.frozen = undefined
        yield* pool.assign(lane.identity, lease)
        const snapshot = lane.publisher.snapshotAfterBarrier(lane.state, lease)
        if (snapshot instanceof Error) throw snapshot
        expect(yield* pool.installSnapshot(snapshot)).toEqual({
          _tag: "SnapshotInstalled",
          sequence: snapshot.sequence
        })
        lane.lease = lease
        lane.active = true
        expect(words(lane)).toEqual(Array.from(lane.state.snapshotWords()))
      })

    /** Submits the next pending delta; returns whether the lane was retired by it. */
    const submitNext = (lane: Lane) =>
      Effect.gen(function* () {
        const delta = lane.pending.shift()
        if (delta === undefined) return false
        const current = lane.active && delta.lease.equals(lane.lease)
        const result = yield* Effect.either(pool.submitDelta(delta))
        if (result._tag === "Right") {
          expect(current).toBe(true)
          return false
        }
        const error = result.left
        if (current && RETIRING.has(error._tag)) {
          freeze(lane)
          return true
        }
        // Superseded or retired traffic is refused without touching the current assignment.
        expect(error).toEqual(new LaneRetired({ lane: lane.physical }))
        return false
      })

    for (const lane of lanes) yield* resubscribe(lane)
    for (const op of ops) {
      switch (op.kind) {
        case "event": {
          const lane = lanes[op.lane]!
          const outcome = lane.state.applyEvent({
            workerId: String(op.member),
            dpRank: 0,
            storageTier: "device",
            data: {
              _tag: op.store ? "Stored" : "Removed",
              blockHashes: hashPairs(
                op.keys.map((k) => BigInt.asUintN(64, BigInt(k + 1) * 0x9e3779b97f4a7c15n))
              )
            }
          })
          if (outcome.publication !== undefined) {
            const published = lane.publisher.publish(outcome.publication)
            if (published instanceof Error) throw published
          }
          break
        }
        case "submit": {
          const lane = lanes[op.lane]!
          for (let i = 0; i < op.count; i++) yield* submitNext(lane)
          break
        }
        case "run":
          yield* Effect.yieldNow().pipe(Effect.repeatN(op.yields * 5))
          checkFrozen()
          break
        case "retire": {
          const lane = lanes[op.lane]!
          yield* hooks.retireLane(lane.physical)
          freeze(lane)
          break
        }
        case "resubscribe":
          yield* resubscribe(lanes[op.lane]!)
          break
        case "drain": {
          const lane = lanes[op.lane]!
          const marker = lane.publisher.exactDrainMarker()!
          if (!lane.active) {
            expect(yield* Effect.flip(pool.completeDrain(marker))).toEqual(
              new LaneRetired({ lane: lane.physical })
            )
          } else if (lane.pending.every((delta) => !delta.lease.equals(lane.lease))) {
            // Every current delta was admitted: the marker queues behind them and sees them all.
            expect(yield* pool.completeDrain(marker)).toEqual({
              _tag: "DrainAcknowledged",
              installedSequence: marker.expectedSequence
            })
            expect(words(lane)).toEqual(Array.from(lane.state.snapshotWords()))
          }
          break
        }
      }
    }

    // Converge: every lane ends with exactly the producer's words.
    yield* settle
    checkFrozen()
    for (const lane of lanes) {
      const batch = lane.state.flush()
      if (batch !== undefined && lane.publisher.publish(batch) instanceof Error)
        throw new Error("publish failed")
      if (!lane.active) yield* resubscribe(lane)
      while (lane.pending.length > 0) {
        if (yield* submitNext(lane)) {
          yield* settle
          checkFrozen()
          yield* resubscribe(lane)
        }
        yield* settle
      }
      const marker = lane.publisher.exactDrainMarker()!
      expect(yield* pool.completeDrain(marker)).toEqual({
        _tag: "DrainAcknowledged",
        installedSequence: marker.expectedSequence
      })
      expect(words(lane)).toEqual(Array.from(lane.state.snapshotWords()))
    }
    expect(indexer.readyLanes()).toBe(LANES.reduce<number>((mask, lane) => mask | (1 << lane), 0))
    expect(yield* pool.failedWorker).toEqual(Option.none())
  })

describe("GlobalCkfIngestionPool property", () => {
  it.effect(
    "interleavings never apply a stale-epoch delta and converge to the producers' words",
    () =>
      Effect.promise(() =>
        fc.assert(
          fc.asyncProperty(
            fc.bigInt({ min: 0n, max: (1n << 64n) - 1n }),
            fc.integer({ min: 1, max: 3 }),
            fc.integer({ min: 1, max: 6 }),
            fc.option(fc.integer({ min: 4, max: 24 }), { nil: undefined }),
            fc.array(opArb, { minLength: 5, maxLength: 80 }),
            (consumer, workers, capacity, bound, ops) =>
              Effect.runPromise(
                runInterleaving(consumer, workers, capacity, bound, ops).pipe(
                  Effect.scoped,
                  Effect.provide(TestContext.TestContext)
                )
              )
          ),
          { numRuns: 100 }
        )
      ),
    60_000
  )
})
