import fc from "fast-check"
import { describe, expect, it } from "vitest"
import { CkfAddressing } from "../../src/ckf/addressing.js"
import { ckfConfig } from "../../src/ckf/config.js"
import {
  chainSequenceHash,
  chainSequenceHashes,
  GlobalCkfAssignmentError,
  GlobalCkfBuildError,
  GlobalCkfIndexer,
  type GlobalCkfIngestOutcome,
  type GlobalCkfLaneIngestor,
  GlobalCkfManifest,
  type GlobalCkfQueryResult,
  validateAssignment
} from "../../src/ckf/global.js"
import {
  CacheSemanticsId,
  DcCkfFormatIdentity,
  DcId,
  IndexerDomainId,
  LaneLease,
  PoolId,
  ProducerIdentity,
  RoutingScopeId
} from "../../src/ckf/identity.js"
import { type DcCkfDelta, DcCkfPublisher, type DcCkfSnapshot } from "../../src/ckf/publisher.js"
import { findPrefixDepths, newPrefixSearchStats } from "../../src/ckf/search.js"
import { DcCkfState } from "../../src/ckf/state.js"
import { TransposedCkfTable } from "../../src/ckf/transposed.js"
import { hashPairs, U64_MAX } from "../../src/ckf/u64.js"

// ---------------------------------------------------------------------------------------------
// Fixtures

const cacheSemantics = (byte: number, source: "explicit" | "default_derived" = "explicit") =>
  new CacheSemanticsId(new Uint8Array(16).fill(byte), source)
const routingScope = (byte: number, source: "explicit" | "default_derived" = "explicit") =>
  new RoutingScopeId(new Uint8Array(16).fill(byte), source)
const DOMAIN = new IndexerDomainId(cacheSemantics(1), routingScope(9))
const poolOf = (dc: bigint, domain: IndexerDomainId = DOMAIN) => new PoolId(domain, new DcId(dc))

const CONSUMER = 11n
const LANE = 3
const OTHER_LANE = 5

const lanesWith = (entries: ReadonlyArray<readonly [number, PoolId]>): Array<PoolId | undefined> => {
  const lanes: Array<PoolId | undefined> = new Array(16).fill(undefined)
  for (const [lane, pool] of entries) lanes[lane] = pool
  return lanes
}

const expectBuildError = (value: unknown): GlobalCkfBuildError => {
  expect(value).toBeInstanceOf(GlobalCkfBuildError)
  return value as GlobalCkfBuildError
}

const ingestorOf = (value: GlobalCkfLaneIngestor | GlobalCkfBuildError): GlobalCkfLaneIngestor => {
  if (value instanceof GlobalCkfBuildError) throw value
  return value
}

/**
 * The seed-004 fixture at the ingestor level: CkfConfig(64), cache semantics [1;16] and routing
 * scope [9;16] (explicit), DC 7 on lane 3, consumer 11, producer incarnation 13, layout 1, lease
 * epoch 1. A second pool (DC 8) on lane 5 shows that faults stay on their lane.
 */
const fixture = () => {
  const format = new DcCkfState(ckfConfig(64)).format
  const pool = poolOf(7n)
  const otherPool = poolOf(8n)
  const manifest = new GlobalCkfManifest(
    CONSUMER,
    DOMAIN,
    format,
    lanesWith([
      [LANE, pool],
      [OTHER_LANE, otherPool]
    ])
  )
  const indexer = new GlobalCkfIndexer(manifest)
  const ingestor = ingestorOf(indexer.claimLane(LANE))
  const other = ingestorOf(indexer.claimLane(OTHER_LANE))
  const identity = new ProducerIdentity(pool, 13n, 1n, format)
  const otherIdentity = new ProducerIdentity(otherPool, 13n, 1n, format)
  const lease = new LaneLease(CONSUMER, LANE, 1n)
  const otherLease = new LaneLease(CONSUMER, OTHER_LANE, 1n)
  const bucketCount = format.bucketCount
  const snapshot = (
    sequence: bigint,
    words: Uint32Array = new Uint32Array(bucketCount * 2),
    l = lease
  ): DcCkfSnapshot => ({
    identity,
    lease: l,
    sequence,
    words
  })
  const delta = (
    baseSequence: bigint,
    sequence: bigint,
    images: ReadonlyArray<number>,
    l = lease,
    id = identity
  ): DcCkfDelta => ({ identity: id, lease: l, baseSequence, sequence, images: Uint32Array.from(images) })
  const assignAndSnapshot = (sequence: bigint) => {
    expect(ingestor.assign(identity, lease)).toBeUndefined()
    expect(ingestor.installSnapshot(snapshot(sequence))).toEqual({ _tag: "SnapshotInstalled", sequence })
  }
  const readyOther = () => {
    expect(other.assign(otherIdentity, otherLease)).toBeUndefined()
    expect(
      other.installSnapshot({
        identity: otherIdentity,
        lease: otherLease,
        sequence: 1n,
        words: new Uint32Array(bucketCount * 2)
      })
    ).toEqual({ _tag: "SnapshotInstalled", sequence: 1n })
  }
  return {
    format,
    pool,
    manifest,
    indexer,
    ingestor,
    other,
    identity,
    lease,
    bucketCount,
    snapshot,
    delta,
    assignAndSnapshot,
    readyOther
  }
}

const laneBit = (lane: number) => 1 << lane

// ---------------------------------------------------------------------------------------------

describe("TransposedCkfTable", () => {
  const naiveProbe = (table: TransposedCkfTable, fp: number, a: number, b: number): number => {
    let mask = 0
    for (let lane = 0; lane < 16; lane++) {
      for (const bucket of [a, b]) {
        const word = table.wordAt(bucket, lane)
        for (let slot = 0; slot < 4; slot++) {
          if (Number((word >> BigInt(16 * slot)) & 0xffffn) === fp) mask |= 1 << lane
        }
      }
    }
    return mask
  }

  it("SWAR probe equals a naive slot compare on borrow-prone slot values", () => {
    // Every 4-slot word over an alphabet of values around fp, its sign bit and the extremes,
    // where a wrong borrow or sign handling would show.
    const table = new TransposedCkfTable(2)
    for (const fp of [1, 2, 0x7fff, 0x8000, 0x8001, 0xfffe, 0xffff, 0x1234]) {
      const alphabet = [0, 1, fp - 1, fp, (fp + 1) & 0xffff, fp ^ 0x8000, 0xffff, 0x8000]
      for (let code = 0; code < 8 ** 4; code++) {
        const s = [code & 7, (code >> 3) & 7, (code >> 6) & 7, (code >> 9) & 7].map((i) => alphabet[i]!)
        const lo = (s[0]! | (s[1]! << 16)) >>> 0
        const hi = (s[2]! | (s[3]! << 16)) >>> 0
        const lane = code & 15
        table.clearLane(lane)
        table.writeWord(code & 1, lane, lo, hi)
        const expected = naiveProbe(table, fp, 0, 1)
        expect(table.probe(fp, 0, 1)).toBe(expected)
        expect(expected !== 0).toBe(s.includes(fp))
        table.clearLane(lane)
      }
    }
  })

  it("SWAR probe equals a naive slot compare on random tables", () => {
    fc.assert(
      fc.property(
        fc.array(fc.integer({ min: 0, max: 0xffff_ffff }), { minLength: 4 * 16 * 2, maxLength: 4 * 16 * 2 }),
        fc.array(fc.integer({ min: 0, max: 3 }), { minLength: 4, maxLength: 4 }),
        fc.integer({ min: 0, max: 3 }),
        fc.integer({ min: 0, max: 3 }),
        fc.integer({ min: 1, max: 0xffff }),
        (raw, plant, a, b, fpRaw) => {
          const table = new TransposedCkfTable(4)
          table.words.set(raw)
          // Plant the fingerprint in some slots so that hits are common.
          const fp = fpRaw
          for (let k = 0; k < plant.length; k++) {
            const lane = (k * 5 + plant[k]!) & 15
            const bucket = plant[k]!
            const half = bucket * 32 + lane * 2 + (k & 1)
            table.words[half] =
              k & 2 ? (table.words[half]! & 0xffff) | (fp << 16) : (table.words[half]! & 0xffff_0000) | fp
          }
          expect(table.probe(fp, a, b)).toBe(naiveProbe(table, fp, a, b))
        }
      ),
      { numRuns: 2000 }
    )
  })

  it("writes, installs, copies and clears one lane without touching the others", () => {
    const table = new TransposedCkfTable(8)
    const words = new Uint32Array(16)
    for (let i = 0; i < 16; i++) words[i] = 0x1000 + i
    table.installLane(4, words)
    table.writeWord(2, 5, 0xdead, 0xbeef)
    expect(Array.from(table.copyLane(4))).toEqual(Array.from(words))
    expect(table.wordAt(3, 4)).toBe((0x1007n << 32n) | 0x1006n)
    expect(table.wordAt(2, 5)).toBe(0xbeef0000deadn)
    table.clearLane(4)
    expect(Array.from(table.copyLane(4))).toEqual(new Array(16).fill(0))
    expect(table.wordAt(2, 5)).toBe(0xbeef0000deadn)
    expect(() => table.installLane(1, new Uint32Array(14))).toThrow(RangeError)
  })
})

describe("chainSequenceHash", () => {
  it("matches the reference vectors for both chain seeds", () => {
    expect(chainSequenceHash(17n, 23n, 0n)).toBe(0x8d5f7d49632a12d3n)
    expect(chainSequenceHash(17n, 23n, 1337n)).toBe(0xe7d5cfb58104f9efn)
  })

  it("chains local block hashes: seq[0] = local[0], seq[i] = chain(seq[i-1], local[i])", () => {
    fc.assert(
      fc.property(
        fc.array(fc.bigInt({ min: 0n, max: U64_MAX }), { maxLength: 12 }),
        fc.bigInt(),
        (local, seed) => {
          const chained = chainSequenceHashes(hashPairs(local), seed)
          const expected: Array<bigint> = []
          for (let i = 0; i < local.length; i++) {
            expected.push(i === 0 ? local[0]! : chainSequenceHash(expected[i - 1]!, local[i]!, seed))
          }
          expect(Array.from(chained)).toEqual(Array.from(hashPairs(expected)))
        }
      ),
      { numRuns: 300 }
    )
  })
})

describe("GlobalCkfManifest", () => {
  const format = new DcCkfFormatIdentity(0x5deece66d1b54a33n, 32)

  it("records the configured lanes and their pools", () => {
    const manifest = new GlobalCkfManifest(
      CONSUMER,
      DOMAIN,
      format,
      lanesWith([
        [0, poolOf(1n)],
        [15, poolOf(2n)]
      ])
    )
    expect(manifest.configuredLanes).toBe(0x8001)
    expect(manifest.poolId(15)!.equals(poolOf(2n))).toBe(true)
    expect(manifest.poolId(1)).toBeUndefined()
    expect(manifest.warnings).toEqual([])
  })

  it("rejects a manifest without lanes", () => {
    expect(expectBuildError(GlobalCkfManifest.make(CONSUMER, DOMAIN, format, [])).detail).toEqual({
      kind: "NoConfiguredLanes"
    })
    expect(() => new GlobalCkfManifest(CONSUMER, DOMAIN, format, new Array(16).fill(undefined))).toThrow(
      GlobalCkfBuildError
    )
  })

  it("rejects a pool of another indexer domain, naming the lane", () => {
    const foreign = new IndexerDomainId(cacheSemantics(99), routingScope(9))
    const error = expectBuildError(
      GlobalCkfManifest.make(
        CONSUMER,
        DOMAIN,
        format,
        lanesWith([
          [0, poolOf(1n)],
          [4, poolOf(2n, foreign)]
        ])
      )
    )
    expect(error.kind).toBe("MixedIndexerDomain")
    expect(error.detail).toMatchObject({ kind: "MixedIndexerDomain", lane: 4 })
  })

  it("rejects a pool configured twice", () => {
    const error = expectBuildError(
      GlobalCkfManifest.make(
        CONSUMER,
        DOMAIN,
        format,
        lanesWith([
          [1, poolOf(5n)],
          [2, poolOf(5n)]
        ])
      )
    )
    expect(error.kind).toBe("DuplicatePool")
    // A duplicate DC within one domain is always a duplicate pool first: PoolId is (domain, dc),
    // so DuplicateDcLane is a defensive check only.
  })

  it("rejects a configured entry beyond lane 15", () => {
    const lanes: Array<PoolId | undefined> = new Array(17).fill(undefined)
    lanes[16] = poolOf(1n)
    expect(expectBuildError(GlobalCkfManifest.make(CONSUMER, DOMAIN, format, lanes)).detail).toEqual({
      kind: "InvalidLane",
      lane: 16
    })
  })

  it("warns (without failing) when several DCs share a default-derived domain", () => {
    const defaulted = new IndexerDomainId(cacheSemantics(1, "default_derived"), routingScope(9))
    const two = new GlobalCkfManifest(
      CONSUMER,
      defaulted,
      format,
      lanesWith([
        [0, poolOf(1n, defaulted)],
        [1, poolOf(2n, defaulted)]
      ])
    )
    expect(two.warnings).toHaveLength(1)
    const one = new GlobalCkfManifest(CONSUMER, defaulted, format, lanesWith([[0, poolOf(1n, defaulted)]]))
    expect(one.warnings).toEqual([])
  })
})

describe("GlobalCkfIndexer construction and lane claims", () => {
  it("validates the verification window and the format", () => {
    const { manifest } = fixture()
    for (const value of [0, 9, 2.5]) {
      expect(expectBuildError(GlobalCkfIndexer.make(manifest, { verificationWindow: value })).detail).toEqual(
        {
          kind: "InvalidVerificationWindow",
          value
        }
      )
    }
    expect(GlobalCkfIndexer.make(manifest, { verificationWindow: 8 })).toBeInstanceOf(GlobalCkfIndexer)
    const odd = new GlobalCkfManifest(
      CONSUMER,
      DOMAIN,
      new DcCkfFormatIdentity(1n, 24),
      lanesWith([[0, poolOf(1n)]])
    )
    expect(expectBuildError(GlobalCkfIndexer.make(odd)).kind).toBe("InvalidFormat")
  })

  it("claims each configured lane once and gives it back on release", () => {
    const { indexer, ingestor, identity, lease, assignAndSnapshot } = fixture()
    expect(indexer.claimedLanes()).toBe(laneBit(LANE) | laneBit(OTHER_LANE))
    expect(expectBuildError(indexer.claimLane(16)).detail).toEqual({ kind: "InvalidLane", lane: 16 })
    expect(expectBuildError(indexer.claimLane(-1)).kind).toBe("InvalidLane")
    expect(expectBuildError(indexer.claimLane(0)).detail).toEqual({ kind: "UnconfiguredLane", lane: 0 })
    expect(expectBuildError(indexer.claimLane(LANE)).detail).toEqual({
      kind: "LaneAlreadyClaimed",
      lane: LANE
    })

    assignAndSnapshot(4n)
    expect(indexer.readyLanes()).toBe(laneBit(LANE))
    ingestor.release()
    expect(indexer.readyLanes()).toBe(0)
    expect(indexer.claimedLanes()).toBe(laneBit(OTHER_LANE))
    expect(ingestor.isReleased).toBe(true)

    const next = ingestorOf(indexer.claimLane(LANE))
    expect(next.assign(identity, lease)).toBeUndefined()
    // A second release of the old owner must not free the new owner's claim or readiness.
    ingestor.release()
    expect(indexer.claimedLanes()).toBe(laneBit(LANE) | laneBit(OTHER_LANE))
    expect(() => ingestor.assign(identity, lease)).toThrow(/released/)
    expect(ingestor.installSnapshot({ identity, lease, sequence: 1n, words: new Uint32Array(64) })).toEqual({
      _tag: "IgnoredForeignLease"
    })
  })
})

describe("validateAssignment", () => {
  it("checks consumer, lane, owner, format and epoch in that order", () => {
    const { manifest, identity, format } = fixture()
    const check = (lease: LaneLease, id = identity, previous?: bigint) =>
      validateAssignment(manifest, LANE, id, lease, previous)?.detail
    expect(check(new LaneLease(CONSUMER, LANE, 1n))).toBeUndefined()
    expect(check(new LaneLease(12n, OTHER_LANE, 1n))).toEqual({
      kind: "WrongConsumerInstance",
      expected: CONSUMER,
      actual: 12n
    })
    expect(check(new LaneLease(CONSUMER, OTHER_LANE, 1n))).toEqual({
      kind: "WrongPhysicalLane",
      expected: LANE,
      actual: OTHER_LANE
    })
    const otherOwner = new ProducerIdentity(poolOf(8n), 13n, 1n, format)
    expect(check(new LaneLease(CONSUMER, LANE, 1n), otherOwner)).toEqual({
      kind: "WrongLaneOwner",
      lane: LANE
    })
    const otherFormat = new ProducerIdentity(
      identity.poolId,
      13n,
      1n,
      new DcCkfFormatIdentity(format.seed ^ 1n, 32)
    )
    expect(check(new LaneLease(CONSUMER, LANE, 1n), otherFormat)).toEqual({ kind: "WrongFormat" })
    expect(check(new LaneLease(CONSUMER, LANE, 3n), identity, 3n)).toEqual({
      kind: "StaleAssignmentEpoch",
      minimumExclusive: 3n,
      actual: 3n
    })
    expect(check(new LaneLease(CONSUMER, LANE, 4n), identity, 3n)).toBeUndefined()
    expect(
      validateAssignment(manifest, LANE, identity, new LaneLease(12n, LANE, 1n), undefined)
    ).toBeInstanceOf(GlobalCkfAssignmentError)
  })
})

// ---------------------------------------------------------------------------------------------

describe("lane ingestor state machine", () => {
  it("moves Unassigned → AwaitingSnapshot → Ready and applies contiguous deltas", () => {
    const { ingestor, indexer, identity, lease, snapshot, delta } = fixture()
    expect(ingestor.lane).toBe(LANE)
    expect(ingestor.lease).toBeUndefined()
    expect(ingestor.applyDelta(delta(0n, 1n, [0, 1, 2]))).toEqual({ _tag: "IgnoredForeignLease" })
    expect(ingestor.assign(identity, lease)).toBeUndefined()
    expect(ingestor.lease).toBe(lease)
    expect(ingestor.installedSequence).toBeUndefined()
    expect(ingestor.applyDelta(delta(4n, 5n, [0, 1, 2]))).toEqual({ _tag: "AwaitingSnapshot" })
    expect(indexer.readyLanes()).toBe(0)

    expect(ingestor.installSnapshot(snapshot(4n))).toEqual({ _tag: "SnapshotInstalled", sequence: 4n })
    expect(indexer.readyLanes()).toBe(laneBit(LANE))
    expect(ingestor.installedSequence).toBe(4n)
    expect(ingestor.applyDelta(delta(4n, 5n, [0, 0x11, 0x22, 7, 0x33, 0]))).toEqual({
      _tag: "DeltaApplied",
      sequence: 5n,
      images: 2
    })
    expect(indexer.wordAt(0, LANE)).toBe(0x22_0000_0011n)
    expect(indexer.wordAt(7, LANE)).toBe(0x33n)
    expect(ingestor.applyDelta(delta(4n, 5n, [0, 9, 9]))).toEqual({
      _tag: "IgnoredStaleOrDuplicate",
      installedSequence: 5n
    })
    expect(ingestor.lastFailureDisposition).toBeUndefined()
    expect(ingestor.completeDrain({ lease, expectedSequence: 5n })).toEqual({
      _tag: "DrainAcknowledged",
      installedSequence: 5n
    })
  })

  it("ignores traffic of a foreign or superseded lease without touching readiness", () => {
    const { ingestor, indexer, lease, snapshot, delta, assignAndSnapshot } = fixture()
    assignAndSnapshot(4n)
    const foreign = new LaneLease(CONSUMER, LANE, 9n)
    expect(ingestor.applyDelta(delta(5n, 6n, [0, 1, 1], foreign))).toEqual({ _tag: "IgnoredForeignLease" })
    expect(ingestor.installSnapshot(snapshot(9n, undefined, foreign))).toEqual({
      _tag: "IgnoredForeignLease"
    })
    expect(ingestor.completeDrain({ lease: foreign, expectedSequence: 0n })).toEqual({
      _tag: "IgnoredForeignLease"
    })
    expect(ingestor.lastFailureDisposition).toBeUndefined()
    expect(indexer.readyLanes()).toBe(laneBit(LANE))
    expect(ingestor.lease).toBe(lease)
  })

  it("retire returns to Unassigned but keeps the epoch, so the same lease is stale", () => {
    const { ingestor, indexer, identity, lease, assignAndSnapshot } = fixture()
    assignAndSnapshot(4n)
    ingestor.retire()
    expect(indexer.readyLanes()).toBe(0)
    expect(ingestor.lease).toBeUndefined()
    expect(ingestor.assign(identity, lease)?.detail).toEqual({
      kind: "StaleAssignmentEpoch",
      minimumExclusive: 1n,
      actual: 1n
    })
    expect(ingestor.assign(identity, new LaneLease(CONSUMER, LANE, 2n))).toBeUndefined()
  })

  it("a failed assignment leaves a ready lane ready under its old lease", () => {
    const { ingestor, indexer, identity, lease, format, assignAndSnapshot } = fixture()
    assignAndSnapshot(4n)
    const foreignDomain = new IndexerDomainId(cacheSemantics(99), routingScope(9))
    const foreign = new ProducerIdentity(new PoolId(foreignDomain, new DcId(7n)), 13n, 1n, format)
    expect(ingestor.assign(foreign, new LaneLease(CONSUMER, LANE, 2n))?.kind).toBe("WrongLaneOwner")
    expect(ingestor.assign(identity, new LaneLease(CONSUMER, LANE, 0n))?.kind).toBe("StaleAssignmentEpoch")
    expect(indexer.readyLanes()).toBe(laneBit(LANE))
    expect(ingestor.lease).toBe(lease)
    expect(ingestor.completeDrain({ lease, expectedSequence: 4n })._tag).toBe("DrainAcknowledged")
  })

  it("a new assignment clears readiness before the lease changes", () => {
    const { ingestor, indexer, identity, assignAndSnapshot } = fixture()
    assignAndSnapshot(4n)
    const next = new LaneLease(CONSUMER, LANE, 2n)
    expect(ingestor.assign(identity, next)).toBeUndefined()
    expect(indexer.readyLanes()).toBe(0)
    expect(ingestor.lease).toBe(next)
    expect(ingestor.installedSequence).toBeUndefined()
  })

  it("a guarded install that declines activation stays awaiting a snapshot", () => {
    const { ingestor, indexer, identity, lease, snapshot } = fixture()
    ingestor.assign(identity, lease)
    const seen: Array<bigint> = []
    const outcome = ingestor.installSnapshotGuarded(snapshot(4n), (_, sequence) => {
      seen.push(sequence)
      return false
    })
    expect(outcome).toEqual({ _tag: "AwaitingSnapshot" })
    expect(seen).toEqual([4n])
    expect(indexer.readyLanes()).toBe(0)
    expect(
      ingestor.installSnapshotGuarded(snapshot(4n), (self, sequence) => {
        self.activateSnapshot(sequence)
        return true
      })
    ).toEqual({ _tag: "SnapshotInstalled", sequence: 4n })
    expect(indexer.readyLanes()).toBe(laneBit(LANE))
  })

  it("validates all images before writing and clears its scratch after every delta", () => {
    const { ingestor, indexer, bucketCount, delta, snapshot, assignAndSnapshot } = fixture()
    assignAndSnapshot(4n)
    // Every bucket once, then a duplicate: rejected, nothing written.
    const all: Array<number> = []
    for (let b = 0; b < bucketCount; b++) all.push(b, b + 1, 0)
    const outcome = ingestor.applyDelta(delta(4n, 5n, [...all, 3, 0, 0]))
    expect(outcome).toEqual({ _tag: "LaneDeactivated", fault: { _tag: "DuplicateImageIndex", bucket: 3 } })
    expect(Array.from(indexer.laneWords(LANE))).toEqual(new Array(bucketCount * 2).fill(0))
    // After recovery the same buckets are accepted again: the validation bitmap was cleared.
    expect(ingestor.installSnapshot(snapshot(5n))._tag).toBe("SnapshotInstalled")
    expect(ingestor.applyDelta(delta(5n, 6n, all))).toEqual({
      _tag: "DeltaApplied",
      sequence: 6n,
      images: bucketCount
    })
    expect(ingestor.applyDelta(delta(6n, 7n, all.slice(0, 30)))._tag).toBe("DeltaApplied")
    expect(indexer.wordAt(bucketCount - 1, LANE)).toBe(BigInt(bucketCount))
  })
})

describe("lane faults deactivate only their lane", () => {
  interface FaultCase {
    readonly name: string
    readonly run: (f: ReturnType<typeof fixture>) => GlobalCkfIngestOutcome
    readonly fault: unknown
    readonly point: string
    /** Whether the lane was ready (installed at 4) before the fault. */
    readonly ready?: boolean
  }

  const cases: ReadonlyArray<FaultCase> = [
    {
      name: "base sequence mismatch (a gap)",
      run: (f) => f.ingestor.applyDelta(f.delta(5n, 6n, [0, 17, 0])),
      fault: { _tag: "BaseSequenceMismatch", expected: 4n, actual: 5n },
      point: "ConsumerGapOrMalformedBeforeWrite"
    },
    {
      name: "non-contiguous sequence",
      run: (f) => f.ingestor.applyDelta(f.delta(4n, 6n, [0, 17, 0])),
      fault: { _tag: "NonContiguousSequence", base: 4n, sequence: 6n },
      point: "ConsumerGapOrMalformedBeforeWrite"
    },
    {
      name: "duplicate image",
      run: (f) => f.ingestor.applyDelta(f.delta(4n, 5n, [1, 5, 5, 2, 6, 6, 1, 7, 7])),
      fault: { _tag: "DuplicateImageIndex", bucket: 1 },
      point: "ConsumerGapOrMalformedBeforeWrite"
    },
    {
      name: "out-of-range image",
      run: (f) => f.ingestor.applyDelta(f.delta(4n, 5n, [0, 5, 5, f.bucketCount, 6, 6])),
      fault: { _tag: "InvalidImageIndex", bucket: 32 },
      point: "ConsumerGapOrMalformedBeforeWrite"
    },
    {
      name: "trailing partial image",
      run: (f) => f.ingestor.applyDelta(f.delta(4n, 5n, [0, 5, 5, 1, 6])),
      fault: { _tag: "InvalidImageIndex", bucket: 1 },
      point: "ConsumerGapOrMalformedBeforeWrite"
    },
    {
      name: "empty delta",
      run: (f) => f.ingestor.applyDelta(f.delta(4n, 5n, [])),
      fault: { _tag: "EmptyDelta" },
      point: "ConsumerGapOrMalformedBeforeWrite"
    },
    {
      name: "wrong identity on a delta",
      run: (f) =>
        f.ingestor.applyDelta(
          f.delta(4n, 5n, [0, 1, 1], f.lease, new ProducerIdentity(f.pool, 14n, 1n, f.format))
        ),
      fault: { _tag: "WrongIdentity" },
      point: "ConsumerGapOrMalformedBeforeWrite"
    },
    {
      name: "wrong identity on a snapshot while ready",
      run: (f) =>
        f.ingestor.installSnapshot({
          ...f.snapshot(9n),
          identity: new ProducerIdentity(f.pool, 13n, 2n, f.format)
        }),
      fault: { _tag: "WrongIdentity" },
      point: "ConsumerGapOrMalformedBeforeWrite"
    },
    {
      name: "wrong identity on a snapshot while awaiting one",
      ready: false,
      run: (f) =>
        f.ingestor.installSnapshot({
          ...f.snapshot(9n),
          identity: new ProducerIdentity(f.pool, 13n, 2n, f.format)
        }),
      fault: { _tag: "WrongIdentity" },
      point: "InactiveSnapshotInstallFailure"
    },
    {
      name: "invalid snapshot bucket count while ready",
      run: (f) => f.ingestor.installSnapshot(f.snapshot(9n, new Uint32Array(2 * f.bucketCount + 2))),
      fault: { _tag: "InvalidSnapshotBucketCount", expected: 32, actual: 33 },
      point: "ConsumerGapOrMalformedBeforeWrite"
    },
    {
      name: "snapshot while ready",
      run: (f) => f.ingestor.installSnapshot(f.snapshot(5n, new Uint32Array(2 * f.bucketCount).fill(0xffff))),
      fault: { _tag: "SnapshotWhileReady", installedSequence: 4n, snapshotSequence: 5n },
      point: "ConsumerGapOrMalformedBeforeWrite"
    },
    {
      name: "terminal sequence mismatch (a lost final delta)",
      run: (f) => f.ingestor.completeDrain({ lease: f.lease, expectedSequence: 5n }),
      fault: { _tag: "TerminalSequenceMismatch", expected: 5n, actual: 4n },
      point: "ConsumerGapOrMalformedBeforeWrite"
    },
    {
      name: "terminal sequence mismatch while not ready",
      ready: false,
      run: (f) => f.ingestor.completeDrain({ lease: f.lease, expectedSequence: 0n }),
      fault: { _tag: "TerminalSequenceMismatch", expected: 0n, actual: undefined },
      point: "ConsumerGapOrMalformedBeforeWrite"
    }
  ]

  for (const c of cases) {
    it(c.name, () => {
      const f = fixture()
      f.readyOther()
      if (c.ready === false) expect(f.ingestor.assign(f.identity, f.lease)).toBeUndefined()
      else f.assignAndSnapshot(4n)
      const before = f.indexer.laneWords(LANE)
      const outcome = c.run(f)
      expect(outcome).toEqual({ _tag: "LaneDeactivated", fault: c.fault })
      expect(f.ingestor.lastFailureDisposition?.point).toBe(c.point)
      expect(f.ingestor.lastFailureDisposition?.domain).toBe("ConsumerLane")
      expect(f.ingestor.lastFailureDisposition?.commit).toBe("KnownUnchanged")
      // Only this lane lost readiness; nothing was written; the lease is kept for the pool.
      expect(f.indexer.readyLanes()).toBe(laneBit(OTHER_LANE))
      expect(f.ingestor.installedSequence).toBeUndefined()
      expect(f.ingestor.lease).toBe(f.lease)
      expect(Array.from(f.indexer.laneWords(LANE))).toEqual(Array.from(before))
      const query = f.indexer.findPrefixMatches(hashPairs([1n, 2n])) as GlobalCkfQueryResult
      expect(query.capturedReadyLanes).toBe(laneBit(OTHER_LANE))
      expect(query.lanes[LANE]).toBeUndefined()
      // A new snapshot on the same lease recovers the lane.
      expect(f.ingestor.installSnapshot(f.snapshot(10n))).toEqual({
        _tag: "SnapshotInstalled",
        sequence: 10n
      })
      expect(f.ingestor.lastFailureDisposition).toBeUndefined()
      expect(f.indexer.readyLanes()).toBe(laneBit(LANE) | laneBit(OTHER_LANE))
    })
  }

  it("sequence exhaustion is caught even though no u64 sequence can reach it", () => {
    // With base = u64::MAX every valid u64 sequence is stale; only an out-of-range sequence gets
    // past that check, and it must still fail closed.
    const f = fixture()
    f.ingestor.assign(f.identity, f.lease)
    expect(f.ingestor.installSnapshot(f.snapshot(U64_MAX))._tag).toBe("SnapshotInstalled")
    expect(f.ingestor.applyDelta(f.delta(U64_MAX - 1n, U64_MAX, [0, 1, 1]))._tag).toBe(
      "IgnoredStaleOrDuplicate"
    )
    expect(f.ingestor.applyDelta(f.delta(U64_MAX, U64_MAX + 1n, [0, 1, 1]))).toEqual({
      _tag: "LaneDeactivated",
      fault: { _tag: "SequenceExhausted" }
    })
    expect(f.indexer.readyLanes()).toBe(0)
  })

  it("a stale assignment epoch is rejected without touching a ready lane", () => {
    const f = fixture()
    f.assignAndSnapshot(4n)
    const error = f.ingestor.assign(f.identity, f.lease)
    expect(error).toBeInstanceOf(GlobalCkfAssignmentError)
    expect(error?.detail).toEqual({ kind: "StaleAssignmentEpoch", minimumExclusive: 1n, actual: 1n })
    expect(f.indexer.readyLanes()).toBe(laneBit(LANE))
    expect(f.ingestor.installedSequence).toBe(4n)
  })
})

describe("seed 004 ingestor behaviours", () => {
  it("stale_active_snapshot_is_ignored_without_rollback", () => {
    const f = fixture()
    f.assignAndSnapshot(4n)
    const stale = f.snapshot(3n, new Uint32Array(f.bucketCount * 2).fill(0xffff_ffff))
    expect(f.ingestor.installSnapshot(stale)).toEqual({
      _tag: "IgnoredStaleOrDuplicate",
      installedSequence: 4n
    })
    expect(f.indexer.readyLanes()).toBe(laneBit(LANE))
    expect(f.ingestor.lastFailureDisposition).toBeUndefined()
    // No rollback: the stale payload was never written.
    expect(Array.from(f.indexer.laneWords(LANE))).toEqual(new Array(f.bucketCount * 2).fill(0))
    // A malformed stale snapshot is ignored before its payload is validated.
    expect(f.ingestor.installSnapshot(f.snapshot(4n, new Uint32Array(2)))._tag).toBe(
      "IgnoredStaleOrDuplicate"
    )
    expect(f.ingestor.completeDrain({ lease: f.lease, expectedSequence: 4n })._tag).toBe("DrainAcknowledged")
  })

  it("current_stream_gap_is_known_unchanged_and_deactivates_only_consumer_lane", () => {
    const f = fixture()
    f.readyOther()
    f.assignAndSnapshot(4n)
    const outcome = f.ingestor.applyDelta(f.delta(5n, 6n, [0, 17, 0]))
    expect(outcome).toMatchObject({ _tag: "LaneDeactivated", fault: { _tag: "BaseSequenceMismatch" } })
    const disposition = f.ingestor.lastFailureDisposition!
    expect(disposition.domain).toBe("ConsumerLane")
    expect(disposition.commit).toBe("KnownUnchanged")
    expect(disposition.action).toBe("DeactivateAndSnapshot")
    expect(f.indexer.readyLanes() & laneBit(LANE)).toBe(0)
    expect(f.indexer.readyLanes()).toBe(laneBit(OTHER_LANE))
    expect(f.indexer.wordAt(0, LANE)).toBe(0n)
  })

  it("inactive_snapshot_failure_keeps_lease_retryable_without_producer_recovery", () => {
    const f = fixture()
    expect(f.ingestor.assign(f.identity, f.lease)).toBeUndefined()
    const malformed = f.snapshot(4n, new Uint32Array((f.bucketCount - 1) * 2))
    expect(f.ingestor.installSnapshot(malformed)).toEqual({
      _tag: "LaneDeactivated",
      fault: { _tag: "InvalidSnapshotBucketCount", expected: f.bucketCount, actual: f.bucketCount - 1 }
    })
    const disposition = f.ingestor.lastFailureDisposition!
    expect(disposition.domain).toBe("ConsumerLane")
    expect(disposition.commit).toBe("KnownUnchanged")
    expect(disposition.action).toBe("RetrySnapshot")
    expect(disposition.recoveryDomain).toBe("ConsumerLane")
    expect(f.ingestor.lease).toBe(f.lease)

    expect(f.ingestor.installSnapshot(f.snapshot(4n))).toEqual({ _tag: "SnapshotInstalled", sequence: 4n })
    expect(f.indexer.readyLanes()).toBe(laneBit(LANE))
  })
})

// ---------------------------------------------------------------------------------------------

describe("findPrefixMatches", () => {
  it("is unavailable until a lane is ready", () => {
    const f = fixture()
    expect(f.indexer.findPrefixMatches(hashPairs([1n]))).toBe("Unavailable")
    f.ingestor.assign(f.identity, f.lease)
    expect(f.indexer.findPrefixMatches(hashPairs([1n]))).toBe("Unavailable")
    f.ingestor.installSnapshot(f.snapshot(1n))
    expect(f.indexer.findPrefixMatches(hashPairs([1n]))).not.toBe("Unavailable")
    f.indexer.retireLaneReadiness(LANE)
    expect(f.indexer.findPrefixMatches(hashPairs([1n]))).toBe("Unavailable")
  })

  it("reports every captured lane, even at depth 0 and for an empty query", () => {
    const f = fixture()
    f.readyOther()
    f.assignAndSnapshot(4n)
    for (const hashes of [new Uint32Array(0), hashPairs([123n, 456n])]) {
      const result = f.indexer.findPrefixMatches(hashes) as GlobalCkfQueryResult
      expect(result.capturedReadyLanes).toBe(laneBit(LANE) | laneBit(OTHER_LANE))
      expect(result.lanes).toHaveLength(16)
      expect(result.lanes.filter((m) => m !== undefined)).toHaveLength(2)
      expect(result.lanes[LANE]).toEqual({ physicalLane: LANE, poolId: f.pool, prefixDepth: 0 })
      expect(result.lanes[OTHER_LANE]?.prefixDepth).toBe(0)
    }
  })

  it("probes the block hashes exactly as given, without chaining them", () => {
    const state = new DcCkfState(ckfConfig(64))
    const f = fixture()
    const raw = [0x1111n, 0x2222n, 0x3333n, 0x4444n]
    state.applyEvent({
      workerId: "1",
      dpRank: 0,
      storageTier: "device",
      data: { _tag: "Stored", blockHashes: hashPairs(raw) }
    })
    f.ingestor.assign(f.identity, f.lease)
    f.ingestor.installSnapshot(f.snapshot(1n, state.snapshotWords()))
    const stats = newPrefixSearchStats()
    const direct = f.indexer.findPrefixMatches(hashPairs(raw), stats) as GlobalCkfQueryResult
    expect(direct.lanes[LANE]?.prefixDepth).toBe(4)
    expect(stats.probeCalls).toBeGreaterThan(0)
    const chained = f.indexer.findPrefixMatches(
      chainSequenceHashes(hashPairs(raw), 0n)
    ) as GlobalCkfQueryResult
    expect(chained.lanes[LANE]?.prefixDepth).toBe(1)
  })
})

// ---------------------------------------------------------------------------------------------
// End to end against the real producer and publisher

type Op =
  | {
      readonly kind: "store"
      readonly dc: number
      readonly member: number
      readonly hashes: ReadonlyArray<number>
    }
  | {
      readonly kind: "remove"
      readonly dc: number
      readonly member: number
      readonly hashes: ReadonlyArray<number>
    }
  | { readonly kind: "clear"; readonly dc: number; readonly member: number }
  | { readonly kind: "deliver"; readonly dc: number }
  | { readonly kind: "resnapshot"; readonly dc: number }

const DCS = 3
const MEMBERS = 4
const UNIVERSE = 120

/** A scattered u64 for a small key, so that hashes of nearby keys share nothing. */
const hashOf = (key: number, dc: number): bigint =>
  BigInt.asUintN(64, (BigInt(key + 1) * 0x9e3779b97f4a7c15n) ^ (BigInt(dc % 2) << 63n))

const opArb: fc.Arbitrary<Op> = fc.oneof(
  {
    weight: 5,
    arbitrary: fc.record({
      kind: fc.constant("store" as const),
      dc: fc.nat({ max: DCS - 1 }),
      member: fc.nat({ max: MEMBERS - 1 }),
      hashes: fc.array(fc.nat({ max: UNIVERSE - 1 }), { minLength: 1, maxLength: 12, size: "max" })
    })
  },
  {
    weight: 3,
    arbitrary: fc.record({
      kind: fc.constant("remove" as const),
      dc: fc.nat({ max: DCS - 1 }),
      member: fc.nat({ max: MEMBERS - 1 }),
      hashes: fc.array(fc.nat({ max: UNIVERSE - 1 }), { minLength: 1, maxLength: 12, size: "max" })
    })
  },
  {
    weight: 1,
    arbitrary: fc.record({
      kind: fc.constant("clear" as const),
      dc: fc.nat({ max: DCS - 1 }),
      member: fc.nat({ max: MEMBERS - 1 })
    })
  },
  {
    weight: 2,
    arbitrary: fc.record({ kind: fc.constant("deliver" as const), dc: fc.nat({ max: DCS - 1 }) })
  },
  {
    weight: 1,
    arbitrary: fc.record({ kind: fc.constant("resnapshot" as const), dc: fc.nat({ max: DCS - 1 }) })
  }
)

describe("end to end with DcCkfState and DcCkfPublisher", () => {
  it("snapshot plus deltas reproduce every producer's words; tracked hashes match at full depth", () => {
    fc.assert(
      fc.property(
        fc.array(opArb, { minLength: 10, maxLength: 120, size: "max" }),
        fc.integer({ min: 1, max: 3 }),
        fc.constantFrom(16, 64, 512),
        (ops, publishEvery, expected) => {
          const config = ckfConfig(expected, { publishEveryNEvents: publishEvery })
          const format = new DcCkfState(config).format
          const physical = [0, 6, 15]
          const pools = physical.map((_, dc) => poolOf(BigInt(100 + dc)))
          const manifest = new GlobalCkfManifest(
            CONSUMER,
            DOMAIN,
            format,
            lanesWith(physical.map((lane, dc) => [lane, pools[dc]!] as const))
          )
          const indexer = new GlobalCkfIndexer(manifest)
          const dcs = physical.map((lane, dc) => {
            const state = new DcCkfState(config)
            const identity = new ProducerIdentity(pools[dc]!, 1n, 1n, format)
            const queue: Array<DcCkfDelta> = []
            const publisher = new DcCkfPublisher(identity, 0n, {
              enqueue: (delta: DcCkfDelta) => {
                queue.push(delta)
                return undefined
              }
            })
            const ingestor = ingestorOf(indexer.claimLane(lane))
            return { lane, state, identity, queue, publisher, ingestor, epoch: 0n }
          })
          type Dc = (typeof dcs)[number]

          const deliver = (dc: Dc) => {
            for (const delta of dc.queue.splice(0)) {
              const outcome = dc.ingestor.applyDelta(delta)
              if (delta.lease.equals(dc.ingestor.lease)) {
                expect(outcome).toEqual({
                  _tag: "DeltaApplied",
                  sequence: delta.sequence,
                  images: delta.images.length / 3
                })
              } else {
                expect(outcome).toEqual({ _tag: "IgnoredForeignLease" })
              }
            }
          }
          const resnapshot = (dc: Dc) => {
            dc.epoch += 1n
            const lease = new LaneLease(CONSUMER, dc.lane, dc.epoch)
            expect(dc.ingestor.assign(dc.identity, lease)).toBeUndefined()
            const snapshot = dc.publisher.snapshotAfterBarrier(dc.state, lease)
            if (snapshot instanceof Error) throw snapshot
            // The old lease's tail (and anything undelivered) is ignored: the snapshot covers it.
            deliver(dc)
            expect(dc.ingestor.installSnapshot(snapshot)).toEqual({
              _tag: "SnapshotInstalled",
              sequence: snapshot.sequence
            })
            expect(Array.from(indexer.laneWords(dc.lane))).toEqual(Array.from(dc.state.snapshotWords()))
          }
          const publish = (dc: Dc, batch: ReturnType<DcCkfState["flush"]>) => {
            if (batch === undefined) return
            const outcome = dc.publisher.publish(batch)
            if (outcome instanceof Error) throw outcome
          }

          for (const dc of dcs) resnapshot(dc)
          for (const op of ops) {
            const dc = dcs[op.dc]!
            const member = "member" in op ? op.member : 0
            const workerId = String(member >> 1)
            const dpRank = member & 1
            switch (op.kind) {
              case "store":
              case "remove": {
                const blockHashes = hashPairs(op.hashes.map((k) => hashOf(k, op.dc)))
                const outcome = dc.state.applyEvent({
                  workerId,
                  dpRank,
                  storageTier: "device",
                  data: { _tag: op.kind === "store" ? "Stored" : "Removed", blockHashes }
                })
                publish(dc, outcome.publication)
                break
              }
              case "clear":
                publish(
                  dc,
                  dc.state.applyEvent({ workerId, dpRank, storageTier: "device", data: { _tag: "Cleared" } })
                    .publication
                )
                break
              case "deliver":
                deliver(dc)
                break
              case "resnapshot":
                resnapshot(dc)
                break
            }
          }

          for (const dc of dcs) {
            publish(dc, dc.state.flush())
            deliver(dc)
            expect(Array.from(indexer.laneWords(dc.lane))).toEqual(Array.from(dc.state.snapshotWords()))
            const marker = dc.publisher.exactDrainMarker()!
            expect(dc.ingestor.completeDrain(marker)).toEqual({
              _tag: "DrainAcknowledged",
              installedSequence: marker.expectedSequence
            })
          }
          expect(indexer.readyLanes()).toBe(physical.reduce((m, lane) => m | laneBit(lane), 0))

          for (const [i, dc] of dcs.entries()) {
            const tracked: Array<bigint> = []
            for (let k = 0; k < UNIVERSE; k++) {
              const h = hashOf(k, i)
              if (dc.state.refcount(h) > 0) tracked.push(h)
            }
            if (tracked.length === 0) continue
            // No false negatives: a query of every tracked hash matches to its full length.
            const all = indexer.findPrefixMatches(hashPairs(tracked)) as GlobalCkfQueryResult
            expect(all.lanes[dc.lane]).toEqual({
              physicalLane: dc.lane,
              poolId: pools[i],
              prefixDepth: tracked.length
            })
            for (const h of tracked) {
              const one = indexer.findPrefixMatches(hashPairs([h])) as GlobalCkfQueryResult
              expect(one.lanes[dc.lane]?.prefixDepth).toBe(1)
            }
          }
        }
      ),
      { numRuns: 300 }
    )
  })
})

describe("GlobalCkfIndexer prefix search", () => {
  // The indexer runs its own per-lane search (sharing probes through a per-query memo) rather than
  // calling `findPrefixDepths`; every lane must still get exactly the `findPrefixDepths` answer,
  // including where capacity holes and false positives send the verification window's rescan.
  it("gives every lane exactly the findPrefixDepths answer over the same table", () => {
    const stats = newPrefixSearchStats()
    fc.assert(
      fc.property(
        fc.array(
          fc.record({
            depth: fc.nat({ max: 48 }),
            holes: fc.array(fc.nat({ max: 47 }), { maxLength: 4 }),
            // Holes just below the depth put misses inside and at the edge of the verification window.
            nearHoles: fc.array(fc.nat({ max: 9 }), { maxLength: 3 }),
            noise: fc.array(fc.nat({ max: 200 }), { maxLength: 40 })
          }),
          { minLength: 16, maxLength: 16 }
        ),
        fc.array(fc.bigInt({ min: 0n, max: U64_MAX }), { minLength: 0, maxLength: 48 }),
        fc.integer({ min: 1, max: 6 }),
        fc.constantFrom(8, 32, 128),
        fc.integer({ min: 0, max: 0xffff }),
        fc.boolean(),
        (lanesSpec, prefix, window, expected, readyBits, long) => {
          // Long queries (over 256 blocks) take the lazy, position-by-position preparation.
          const query = long ? [...prefix, ...Array.from({ length: 260 }, (_, i) => hashOf(i, 99))] : prefix
          const config = ckfConfig(expected)
          const format = new DcCkfState(config).format
          const pools = lanesSpec.map((_, lane) => poolOf(BigInt(200 + lane)))
          const manifest = new GlobalCkfManifest(
            CONSUMER,
            DOMAIN,
            format,
            lanesWith(pools.map((pool, lane) => [lane, pool] as const))
          )
          const indexer = new GlobalCkfIndexer(manifest, { verificationWindow: window })
          const reference = new TransposedCkfTable(format.bucketCount)
          lanesSpec.forEach((spec, lane) => {
            // Only some lanes become ready: the rest must stay out of the answer.
            if (lane > 0 && (readyBits & (1 << lane)) === 0) return
            const state = new DcCkfState(config)
            const holes = [...spec.holes, ...spec.nearHoles.map((k) => spec.depth - 1 - k)]
            const stored = query.slice(0, spec.depth).filter((_, i) => !holes.includes(i))
            const noise = spec.noise.map((k) => hashOf(k, lane))
            for (const hash of [...stored, ...noise]) state.store("w", 0, hash)
            const identity = new ProducerIdentity(pools[lane]!, 1n, 1n, format)
            const publisher = new DcCkfPublisher(identity, 0n, { enqueue: () => undefined })
            const ingestor = ingestorOf(indexer.claimLane(lane))
            const lease = new LaneLease(CONSUMER, lane, 1n)
            expect(ingestor.assign(identity, lease)).toBeUndefined()
            const snapshot = publisher.snapshotAfterBarrier(state, lease)
            if (snapshot instanceof Error) throw snapshot
            expect(ingestor.installSnapshot(snapshot)._tag).toBe("SnapshotInstalled")
            reference.installLane(lane, state.snapshotWords())
          })
          const hashes = hashPairs(query)
          const result = indexer.findPrefixMatches(hashes, stats)
          if (result === "Unavailable") throw new Error("lane 0 is always ready")
          const addressing = new CkfAddressing(format.seed, format.bucketCount)
          const probe = (pos: number): number => {
            addressing.prepareHalves(hashes[2 * pos]!, hashes[2 * pos + 1]!)
            return reference.probe(addressing.fp, addressing.a, addressing.b)
          }
          const want = findPrefixDepths(query.length, result.capturedReadyLanes, window, probe)
          for (let lane = 0; lane < 16; lane++) {
            const match = result.lanes[lane]
            if ((result.capturedReadyLanes & (1 << lane)) === 0) expect(match).toBeUndefined()
            else expect(match?.prefixDepth).toBe(want[lane])
          }
        }
      ),
      { numRuns: 600 }
    )
    // The runs reached the rare branches: a left-edge miss, its rescan and its provenance skip.
    expect(stats.activatedLanes).toBeGreaterThan(0)
    expect(stats.provenanceSkips).toBeGreaterThan(0)
  })
})
