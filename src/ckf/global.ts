/**
 * The global consumer: one indexer domain, up to 16 DC lanes (one pool each) in a transposed
 * table, one lane ingestor per claimed lane, and prefix queries across every ready lane.
 *
 * The query path shares only the table, the addressing, the manifest and the ready mask with the
 * ingestors. JavaScript runs one thread per isolate, so the masks are plain numbers, but the
 * ordering discipline of the reference is kept so that the design survives a move to shared
 * memory: readiness is cleared before a lease changes and set only by `activateSnapshot`, and a
 * query reads the ready mask exactly once.
 *
 * Weak-read contract (deliberate): a multi-bucket delta is not atomic to readers and a query may
 * finish against a lane retired after it captured readiness. There is no seqlock, double buffer,
 * reader retry or table-wide lock.
 *
 * Length: the lanes' ingestors and the prefix query share the transposed table and its masks under
 * the ordering discipline above; kept in one module so that discipline is read in one place (the
 * query is measured as `prefix_search_16x64`).
 */

import { CkfAddressing, MAX_BUCKET_COUNT } from "./addressing.js"
import {
  CKF_LANE_COUNT,
  DEFAULT_VERIFICATION_WINDOW,
  FINGERPRINT_BITS,
  FORMAT_VERSION,
  MAX_VERIFICATION_WINDOW,
  SLOTS_PER_BUCKET
} from "./config.js"
import { type CkfFailureDisposition, type CkfFailurePoint, failureDisposition } from "./failure.js"
import type {
  ConsumerDrainMarker,
  ConsumerInstanceId,
  DcCkfFormatIdentity,
  DcId,
  IndexerDomainId,
  LaneLease,
  PoolId,
  ProducerIdentity
} from "./identity.js"
import { CkfProbeWasm, PROBE_MAX_POSITIONS } from "./probeWasm.js"
import type { DcCkfDelta, DcCkfSnapshot } from "./publisher.js"
import type { PrefixSearchConfig, PrefixSearchStats } from "./search.js"
import { nextSequenceHash, sequenceHashes } from "./tokens.js"
import { TransposedCkfTable } from "./transposed.js"
import { U64_MAX } from "./u64.js"

// ---------------------------------------------------------------------------------------------
// Errors, faults and outcomes

/** Why the global CKF could not be built. */
export type GlobalCkfBuildErrorDetail =
  | { readonly kind: "NoConfiguredLanes" }
  | {
      readonly kind: "MixedIndexerDomain"
      readonly lane: number
      readonly expected: IndexerDomainId
      readonly actual: IndexerDomainId
    }
  | { readonly kind: "DuplicatePool"; readonly poolId: PoolId }
  | { readonly kind: "DuplicateDcLane"; readonly dcId: DcId }
  | { readonly kind: "InvalidLane"; readonly lane: number }
  | { readonly kind: "UnconfiguredLane"; readonly lane: number }
  | { readonly kind: "LaneAlreadyClaimed"; readonly lane: number }
  | { readonly kind: "InvalidVerificationWindow"; readonly value: number }
  | { readonly kind: "InvalidFormat"; readonly reason: string }
  | { readonly kind: "AllocationFailed" }

const buildErrorText = (detail: GlobalCkfBuildErrorDetail): string => {
  switch (detail.kind) {
    case "NoConfiguredLanes":
      return "global CKF manifest must configure at least one lane"
    case "MixedIndexerDomain":
      return `lane ${detail.lane} belongs to indexer domain ${detail.actual}, expected ${detail.expected}`
    case "DuplicatePool":
      return `pool ${detail.poolId} is configured on more than one lane`
    case "DuplicateDcLane":
      return `DC ${detail.dcId} is configured on more than one lane`
    case "InvalidLane":
      return `global CKF lane ${detail.lane} is outside 0..${CKF_LANE_COUNT}`
    case "UnconfiguredLane":
      return `global CKF lane ${detail.lane} is not configured`
    case "LaneAlreadyClaimed":
      return `global CKF lane ${detail.lane} already has an ingestion owner`
    case "InvalidVerificationWindow":
      return `verification_window ${detail.value} is outside 1..=${MAX_VERIFICATION_WINDOW}`
    case "InvalidFormat":
      return `unsupported CKF format: ${detail.reason}`
    case "AllocationFailed":
      return "failed to allocate global CKF storage"
  }
}

/** The global CKF could not be built; `detail` says why. */
export class GlobalCkfBuildError extends Error {
  readonly _tag = "GlobalCkfBuildError"
  constructor(readonly detail: GlobalCkfBuildErrorDetail) {
    super(buildErrorText(detail))
    this.name = "GlobalCkfBuildError"
  }
  get kind(): GlobalCkfBuildErrorDetail["kind"] {
    return this.detail.kind
  }
}

/** Why a lane could not be assigned to a producer. */
export type GlobalCkfAssignmentErrorDetail =
  | {
      readonly kind: "WrongConsumerInstance"
      readonly expected: ConsumerInstanceId
      readonly actual: ConsumerInstanceId
    }
  | { readonly kind: "WrongPhysicalLane"; readonly expected: number; readonly actual: number }
  | { readonly kind: "WrongLaneOwner"; readonly lane: number }
  | { readonly kind: "WrongFormat" }
  | { readonly kind: "StaleAssignmentEpoch"; readonly minimumExclusive: bigint; readonly actual: bigint }

const assignmentErrorText = (detail: GlobalCkfAssignmentErrorDetail): string => {
  switch (detail.kind) {
    case "WrongConsumerInstance":
      return `lease targets consumer ${detail.actual}, expected ${detail.expected}`
    case "WrongPhysicalLane":
      return `lease targets lane ${detail.actual}, expected ${detail.expected}`
    case "WrongLaneOwner":
      return `producer identity does not own lane ${detail.lane}`
    case "WrongFormat":
      return "producer CKF format differs from the immutable consumer format"
    case "StaleAssignmentEpoch":
      return `assignment epoch ${detail.actual} must be newer than ${detail.minimumExclusive}`
  }
}

/** A lane could not be assigned; `detail` says why. */
export class GlobalCkfAssignmentError extends Error {
  readonly _tag = "GlobalCkfAssignmentError"
  constructor(readonly detail: GlobalCkfAssignmentErrorDetail) {
    super(assignmentErrorText(detail))
    this.name = "GlobalCkfAssignmentError"
  }
  get kind(): GlobalCkfAssignmentErrorDetail["kind"] {
    return this.detail.kind
  }
}

/** Why a lane refused a snapshot or delta (it must start again from a snapshot). */
export type GlobalCkfLaneFault =
  | { readonly _tag: "WrongIdentity" }
  | { readonly _tag: "InvalidSnapshotBucketCount"; readonly expected: number; readonly actual: number }
  | { readonly _tag: "EmptyDelta" }
  | { readonly _tag: "BaseSequenceMismatch"; readonly expected: bigint; readonly actual: bigint }
  | { readonly _tag: "NonContiguousSequence"; readonly base: bigint; readonly sequence: bigint }
  | { readonly _tag: "SequenceExhausted" }
  | { readonly _tag: "InvalidImageIndex"; readonly bucket: number }
  | { readonly _tag: "DuplicateImageIndex"; readonly bucket: number }
  | {
      readonly _tag: "SnapshotWhileReady"
      readonly installedSequence: bigint
      readonly snapshotSequence: bigint
    }
  | {
      readonly _tag: "TerminalSequenceMismatch"
      readonly expected: bigint
      readonly actual: bigint | undefined
    }

/** What happened to a snapshot or delta handed to a lane. */
export type GlobalCkfIngestOutcome =
  | { readonly _tag: "SnapshotInstalled"; readonly sequence: bigint }
  | { readonly _tag: "DeltaApplied"; readonly sequence: bigint; readonly images: number }
  | { readonly _tag: "IgnoredForeignLease" }
  | { readonly _tag: "IgnoredStaleOrDuplicate"; readonly installedSequence: bigint }
  | { readonly _tag: "DrainAcknowledged"; readonly installedSequence: bigint }
  | { readonly _tag: "AwaitingSnapshot" }
  | { readonly _tag: "LaneDeactivated"; readonly fault: GlobalCkfLaneFault }

const IGNORED_FOREIGN_LEASE: GlobalCkfIngestOutcome = Object.freeze({ _tag: "IgnoredForeignLease" })
const AWAITING_SNAPSHOT: GlobalCkfIngestOutcome = Object.freeze({ _tag: "AwaitingSnapshot" })
const WRONG_IDENTITY: GlobalCkfLaneFault = Object.freeze({ _tag: "WrongIdentity" })
const EMPTY_DELTA: GlobalCkfLaneFault = Object.freeze({ _tag: "EmptyDelta" })
const SEQUENCE_EXHAUSTED: GlobalCkfLaneFault = Object.freeze({ _tag: "SequenceExhausted" })

/** One lane's answer to a query: the pool it holds and the prefix depth found. */
export interface GlobalCkfLaneMatch {
  readonly physicalLane: number
  readonly poolId: PoolId
  readonly prefixDepth: number
}

/** A query's answer over every lane that was ready when it started. */
export interface GlobalCkfQueryResult {
  /** The ready mask the query captured (restricted to configured lanes). */
  readonly capturedReadyLanes: number
  /** 16 entries: a match for every captured lane (even at depth 0), `undefined` elsewhere. */
  readonly lanes: ReadonlyArray<GlobalCkfLaneMatch | undefined>
}

// ---------------------------------------------------------------------------------------------
// Manifest

/** The immutable lane layout of one consumer: which pool of the indexer domain owns each lane. */
export class GlobalCkfManifest {
  readonly configuredLanes: number
  /** What the reference logs as warnings; the core does no logging. */
  readonly warnings: ReadonlyArray<string>
  private readonly pools: ReadonlyArray<PoolId | undefined>

  /** Throws `GlobalCkfBuildError`; `GlobalCkfManifest.make` returns it instead. */
  constructor(
    readonly consumerInstance: ConsumerInstanceId,
    readonly indexerDomain: IndexerDomainId,
    readonly format: DcCkfFormatIdentity,
    lanes: ReadonlyArray<PoolId | undefined>
  ) {
    const pools: Array<PoolId | undefined> = new Array(CKF_LANE_COUNT).fill(undefined)
    const seenPools = new Set<string>()
    const seenDcs = new Set<string>()
    let configured = 0
    for (let lane = 0; lane < lanes.length; lane++) {
      const pool = lanes[lane]
      if (pool === undefined) continue
      if (lane >= CKF_LANE_COUNT) throw new GlobalCkfBuildError({ kind: "InvalidLane", lane })
      if (!pool.indexerDomain.equals(indexerDomain)) {
        throw new GlobalCkfBuildError({
          kind: "MixedIndexerDomain",
          lane,
          expected: indexerDomain,
          actual: pool.indexerDomain
        })
      }
      if (seenPools.has(pool.key)) throw new GlobalCkfBuildError({ kind: "DuplicatePool", poolId: pool })
      if (seenDcs.has(pool.dcId.hex))
        throw new GlobalCkfBuildError({ kind: "DuplicateDcLane", dcId: pool.dcId })
      seenPools.add(pool.key)
      seenDcs.add(pool.dcId.hex)
      pools[lane] = pool
      configured |= 1 << lane
    }
    if (configured === 0) throw new GlobalCkfBuildError({ kind: "NoConfiguredLanes" })
    const warnings: Array<string> = []
    if (seenDcs.size > 1 && indexerDomain.reliesOnDefaults) {
      warnings.push(
        `indexer domain ${indexerDomain} spans ${seenDcs.size} DCs but relies on default-derived identity; ` +
          "configure explicit cache semantics and routing scope so that unrelated deployments cannot alias"
      )
    }
    this.pools = pools
    this.configuredLanes = configured
    this.warnings = warnings
  }

  static make(
    consumerInstance: ConsumerInstanceId,
    indexerDomain: IndexerDomainId,
    format: DcCkfFormatIdentity,
    lanes: ReadonlyArray<PoolId | undefined>
  ): GlobalCkfManifest | GlobalCkfBuildError {
    try {
      return new GlobalCkfManifest(consumerInstance, indexerDomain, format, lanes)
    } catch (error) {
      if (error instanceof GlobalCkfBuildError) return error
      throw error
    }
  }

  poolId(lane: number): PoolId | undefined {
    return this.pools[lane]
  }
}

/** Checks a lease and producer identity against the manifest, in the reference's order. */
export const validateAssignment = (
  manifest: GlobalCkfManifest,
  lane: number,
  identity: ProducerIdentity,
  lease: LaneLease,
  previousAssignmentEpoch: bigint | undefined
): GlobalCkfAssignmentError | undefined => {
  if (lease.consumerInstance !== manifest.consumerInstance) {
    return new GlobalCkfAssignmentError({
      kind: "WrongConsumerInstance",
      expected: manifest.consumerInstance,
      actual: lease.consumerInstance
    })
  }
  if (lease.physicalLane !== lane) {
    return new GlobalCkfAssignmentError({
      kind: "WrongPhysicalLane",
      expected: lane,
      actual: lease.physicalLane
    })
  }
  const owner = manifest.poolId(lane)
  if (owner === undefined || !owner.equals(identity.poolId)) {
    return new GlobalCkfAssignmentError({ kind: "WrongLaneOwner", lane })
  }
  if (!identity.format.equals(manifest.format)) return new GlobalCkfAssignmentError({ kind: "WrongFormat" })
  if (previousAssignmentEpoch !== undefined && lease.assignmentEpoch <= previousAssignmentEpoch) {
    return new GlobalCkfAssignmentError({
      kind: "StaleAssignmentEpoch",
      minimumExclusive: previousAssignmentEpoch,
      actual: lease.assignmentEpoch
    })
  }
  return undefined
}

// ---------------------------------------------------------------------------------------------
// Indexer

/** What the query path and the ingestors share (the reference's `GlobalCkfShared`). */
class GlobalCkfShared {
  readyLanes = 0
  claimedLanes = 0
  constructor(
    readonly manifest: GlobalCkfManifest,
    readonly table: TransposedCkfTable,
    readonly addressing: CkfAddressing,
    readonly verificationWindow: number
  ) {}
}

// Keeps the shared state out of the public surface while letting ingestors reach it.
const sharedOf = new WeakMap<GlobalCkfIndexer, GlobalCkfShared>()

const formatProblem = (format: DcCkfFormatIdentity): string | undefined => {
  if (format.formatVersion !== FORMAT_VERSION) return `format version ${format.formatVersion}`
  if (format.fingerprintBits !== FINGERPRINT_BITS) return `${format.fingerprintBits}-bit fingerprints`
  if (format.slotsPerBucket !== SLOTS_PER_BUCKET) return `${format.slotsPerBucket} slots per bucket`
  const count = format.bucketCount
  if (!Number.isInteger(count) || count < 2 || count > MAX_BUCKET_COUNT || (count & (count - 1)) !== 0) {
    return `bucket count ${count} is not a power of two in 2..=${MAX_BUCKET_COUNT}`
  }
  return undefined
}

const EMPTY_HASHES = new Uint32Array(0)
/** u32s per transposed row (16 lanes × 2 halves) and the SWAR constants of a lane test. */
const ROW_U32 = CKF_LANE_COUNT * 2
const REP16 = 0x0001_0001
const HIGH16 = 0x8000_8000
/** A query of at most this many blocks per lane still hitting position 0 is prepared up front. */
const EAGER_BLOCKS_PER_LANE = 8

const popcount16 = (mask: number): number => {
  let v = mask - ((mask >>> 1) & 0x5555)
  v = (v & 0x3333) + ((v >>> 2) & 0x3333)
  v = (v + (v >>> 4)) & 0x0f0f
  return (v + (v >>> 8)) & 0x1f
}

/**
 * The global consumer's index: up to 16 lanes, one relay pool each, searched together by prefix.
 */
export class GlobalCkfIndexer {
  private readonly shared: GlobalCkfShared
  /** The wasm probe over the table's memory, where the host has WebAssembly SIMD. */
  private readonly probe: CkfProbeWasm | undefined
  // Query scratch, per position of the current query and valid while `stamps[pos]` equals
  // `generation`: the fingerprint repeated in both halves of a u32, and the offsets of its two
  // rows in the table. A position is hashed on its first test only, so a query costs the
  // positions its lanes visit (about 15 of 256 for one lane), not its length.
  private queryHashes: Uint32Array = EMPTY_HASHES
  private generation = 0
  private stamps = new Uint32Array(0)
  private reps = new Uint32Array(0)
  private rowsA = new Uint32Array(0)
  private rowsB = new Uint32Array(0)
  private readonly mixed = new Uint32Array(2)
  private mixedAll = new Uint32Array(0)
  /** Keeps the row loads of `prepareRange` from being optimised away. */
  touchSink = 0
  private readonly depths = new Uint32Array(CKF_LANE_COUNT)
  private readonly resultDepths = new Uint32Array(CKF_LANE_COUNT)
  // Counters of the query in progress (reported through `PrefixSearchStats`).
  private probeCalls = 0
  private laneProbes = 0
  private leftEdgeLanes = 0
  private activatedLanes = 0
  private provenanceSkips = 0

  /**
   * Whether `lane` holds the fingerprint of position `pos` of the current query in bucket a or b
   * (`bit` = 1 << lane; the result is `bit` or 0). Only the asking lane's words are tested: the
   * searches of 16 lanes look at different positions, so a full 16-lane probe per position would
   * mostly test lanes that never ask. A lane's test is cheaper than remembering its outcome, so
   * revisits test again; the hash is what is shared.
   */
  private hitAt(pos: number, lane: number, bit: number): number {
    this.laneProbes++
    if (this.stamps[pos] !== this.generation) this.preparePosition(pos)
    const rep = this.reps[pos]!
    const t = this.shared.table.words
    const i = this.rowsA[pos]! + 2 * lane
    const j = this.rowsB[pos]! + 2 * lane
    // The SWAR zero-half-word test of `TransposedCkfTable.probe`, for one lane.
    const x0 = t[i]! ^ rep
    const x1 = t[i + 1]! ^ rep
    const y0 = t[j]! ^ rep
    const y1 = t[j + 1]! ^ rep
    const z =
      (((x0 - REP16) & ~x0) | ((x1 - REP16) & ~x1) | ((y0 - REP16) & ~y0) | ((y1 - REP16) & ~y1)) & HIGH16
    return z === 0 ? 0 : bit
  }

  /**
   * Hash positions `from..n` of the current query and load their two rows before the lanes search.
   * The loads are independent, so the table's cache misses overlap instead of each search step
   * waiting for its own.
   */
  private prepareRange(from: number, n: number): void {
    const addressing = this.shared.addressing
    if (this.mixedAll.length < 2 * n) this.mixedAll = new Uint32Array(2 * Math.max(n, 64))
    const mixed = this.mixedAll
    addressing.mixBatch(this.queryHashes, 2 * from, n - from, mixed, 0)
    const stamps = this.stamps
    const generation = this.generation
    for (let pos = from; pos < n; pos++) {
      if (stamps[pos] === generation) continue
      addressing.prepareMixedAt(mixed, 2 * (pos - from))
      this.recordPrepared(pos)
    }
    // A separate tight loop, so that many loads are in flight at once; a row spans two cache lines.
    const t = this.shared.table.words
    const rowsA = this.rowsA
    const rowsB = this.rowsB
    let touched = 0
    for (let pos = from; pos < n; pos++) {
      const a = rowsA[pos]!
      const b = rowsB[pos]!
      touched |= t[a]! | t[a + 16]! | t[b]! | t[b + 16]!
    }
    this.touchSink = touched
  }

  /** Hash position `pos` of the current query (fingerprint and both rows) on its first test. */
  private preparePosition(pos: number): void {
    const addressing = this.shared.addressing
    const mixed = this.mixed
    addressing.mixBatch(this.queryHashes, 2 * pos, 1, mixed, 0)
    addressing.prepareMixedAt(mixed, 0)
    this.recordPrepared(pos)
  }

  /** Keeps the addressing's last fingerprint and buckets as position `pos` of this query. */
  private recordPrepared(pos: number): void {
    const addressing = this.shared.addressing
    const fp = addressing.fp
    this.reps[pos] = (fp << 16) | fp
    this.rowsA[pos] = addressing.a * ROW_U32
    this.rowsB[pos] = addressing.b * ROW_U32
    this.stamps[pos] = this.generation
    this.probeCalls++
  }

  /**
   * Prefix depth of one lane that hit position 0: the §8.2 search (galloping, binary search,
   * verification of the `window` positions below the tentative depth, and the fallback rescan of
   * the gap after the last binary predecessor when the first verification miss is the window's
   * left edge). This is exactly the answer `findPrefixDepths` gives the lane: its grouping and
   * lock-step only share probe calls between lanes, and probes have no side effects. (Running
   * the lanes in lock-step here measured slower, and their galloping as one pass per position no
   * faster: the bookkeeping cost what the overlapped cache misses saved.)
   */
  private laneDepth(n: number, window: number, lane: number): number {
    const bit = 1 << lane
    let lower = 0
    let pred = 0
    let upper = n
    for (let pos = 1; pos < n; pos *= 2) {
      if (this.hitAt(pos, lane, bit) === 0) {
        upper = pos
        break
      }
      pred = lower
      lower = pos
    }
    while (upper - lower > 1) {
      const mid = lower + Math.floor((upper - lower) / 2)
      if (this.hitAt(mid, lane, bit) !== 0) {
        pred = lower
        lower = mid
      } else {
        upper = mid
      }
    }
    const start = upper > window ? upper - window : 0
    // The window ends at `lower` = upper - 1, a hit already seen (position 0 or a probed hit):
    // probing it again cannot change the answer, so the scan stops short of it.
    for (let pos = start; pos < upper; pos++) {
      if (pos === lower || this.hitAt(pos, lane, bit) !== 0) continue
      if (pos > start) return pos
      // A miss at the window's left edge: the terminal branch may rest on a false hit (a capacity
      // hole below it or a false positive at it), so rescan the gap after the predecessor of the
      // terminal lower bound.
      this.leftEdgeLanes++
      if (pred >= start) {
        this.provenanceSkips++
        return pos
      }
      if (pred + 1 === start) return start
      this.activatedLanes++
      for (let q = pred + 1; q < start; q++) if (this.hitAt(q, lane, bit) === 0) return q
      return start
    }
    return upper
  }

  /** Throws `GlobalCkfBuildError`; `GlobalCkfIndexer.make` returns it instead. */
  constructor(
    manifest: GlobalCkfManifest,
    search: PrefixSearchConfig = { verificationWindow: DEFAULT_VERIFICATION_WINDOW }
  ) {
    const window = search.verificationWindow
    if (!Number.isInteger(window) || window < 1 || window > MAX_VERIFICATION_WINDOW) {
      throw new GlobalCkfBuildError({ kind: "InvalidVerificationWindow", value: window })
    }
    const problem = formatProblem(manifest.format)
    if (problem !== undefined) throw new GlobalCkfBuildError({ kind: "InvalidFormat", reason: problem })
    const addressing = new CkfAddressing(manifest.format.seed, manifest.format.bucketCount)
    // The table lives in the probe's memory; without one (no SIMD, or that memory could not be
    // had) it is a plain array and queries take the TypeScript probe.
    const probe = CkfProbeWasm.make(addressing)
    let table: TransposedCkfTable
    try {
      table = new TransposedCkfTable(manifest.format.bucketCount, probe?.words)
    } catch {
      throw new GlobalCkfBuildError({ kind: "AllocationFailed" })
    }
    this.probe = probe
    this.shared = new GlobalCkfShared(manifest, table, addressing, window)
    sharedOf.set(this, this.shared)
  }

  static make(
    manifest: GlobalCkfManifest,
    search?: PrefixSearchConfig
  ): GlobalCkfIndexer | GlobalCkfBuildError {
    try {
      return new GlobalCkfIndexer(manifest, search)
    } catch (error) {
      if (error instanceof GlobalCkfBuildError) return error
      throw error
    }
  }

  get manifest(): GlobalCkfManifest {
    return this.shared.manifest
  }

  get verificationWindow(): number {
    return this.shared.verificationWindow
  }

  get bucketCount(): number {
    return this.shared.table.bucketCount
  }

  /** Whether queries of up to `PROBE_MAX_POSITIONS` blocks run on the wasm search. */
  get usesWasmSearch(): boolean {
    return this.probe !== undefined
  }

  readyLanes(): number {
    return this.shared.readyLanes
  }

  claimedLanes(): number {
    return this.shared.claimedLanes
  }

  /**
   * Withdraw one lane's readiness without touching its ingestor (for a transport that is about
   * to discard the lane's queue). A query that already captured the bit may still finish.
   */
  retireLaneReadiness(lane: number): void {
    this.shared.readyLanes &= ~(1 << lane)
  }

  /** The single ingestion owner of a lane; `release()` gives the lane back. */
  claimLane(lane: number): GlobalCkfLaneIngestor | GlobalCkfBuildError {
    try {
      return new GlobalCkfLaneIngestor(this, lane)
    } catch (error) {
      if (error instanceof GlobalCkfBuildError) return error
      throw error
    }
  }

  /** One lane's words as `[lo, hi]` pairs (diagnostic and test use). */
  laneWords(lane: number): Uint32Array {
    return this.shared.table.copyLane(lane)
  }

  /** Raw probe of every lane (no readiness mask): the building block of the linear oracle. */
  probeFor(fp: number, a: number, b: number): number {
    return this.shared.table.probe(fp, a, b)
  }

  wordAt(bucket: number, lane: number): bigint {
    return this.shared.table.wordAt(bucket, lane)
  }

  /**
   * Prefix depth of the query in every ready lane. `hashes` are hash pairs of the block hashes
   * exactly as workers publish them (each already chains its prefix), so they are probed as
   * given, without re-chaining.
   *
   * Every lane gets the `findPrefixDepths` answer. A query of up to `PROBE_MAX_POSITIONS` blocks
   * runs on the wasm search where the host has it (`usesWasmSearch`), a longer one on the
   * TypeScript search below; both give every lane the same answer. In `stats`, `probeCalls`
   * counts the positions hashed and `laneProbes` the (lane, position) tests; the other counters
   * are per lane, as in `findPrefixDepths`.
   */
  findPrefixMatches(hashes: Uint32Array, stats?: PrefixSearchStats): GlobalCkfQueryResult | "Unavailable" {
    const captured = this.prefixDepthsInto(hashes, this.resultDepths, stats)
    if (captured === "Unavailable") return captured
    const manifest = this.shared.manifest
    const depths = this.resultDepths
    const lanes: Array<GlobalCkfLaneMatch | undefined> = new Array(CKF_LANE_COUNT).fill(undefined)
    for (let m = captured; m !== 0; m &= m - 1) {
      const lane = 31 - Math.clz32(m & -m)
      lanes[lane] = { physicalLane: lane, poolId: manifest.poolId(lane)!, prefixDepth: depths[lane]! }
    }
    return { capturedReadyLanes: captured, lanes }
  }

  /**
   * `findPrefixMatches` without its result objects, for callers that build their own: every
   * captured lane's depth into `out[lane]` (16 entries; 0 elsewhere), and the captured ready
   * lanes returned (the pool of a lane is `manifest.poolId(lane)`).
   */
  prefixDepthsInto(hashes: Uint32Array, out: Uint32Array, stats?: PrefixSearchStats): number | "Unavailable" {
    const shared = this.shared
    // The query's only readiness read: a lane retired right after may still be answered under
    // the weak-read contract.
    const captured = shared.readyLanes & shared.manifest.configuredLanes
    if (captured === 0) return "Unavailable"
    const n = hashes.length >>> 1
    const depths = this.depths
    depths.fill(0)
    this.probeCalls = 0
    this.laneProbes = 0
    this.leftEdgeLanes = 0
    this.activatedLanes = 0
    this.provenanceSkips = 0
    const probe = n <= PROBE_MAX_POSITIONS ? this.probe : undefined
    if (n > 0 && probe !== undefined) {
      probe.search(hashes, n, captured, shared.verificationWindow)
      depths.set(probe.depths)
      const counters = probe.counters
      this.probeCalls = counters[0]!
      this.laneProbes = counters[1]!
      this.leftEdgeLanes = counters[2]!
      this.activatedLanes = counters[3]!
      this.provenanceSkips = counters[4]!
    } else if (n > 0) {
      this.reserveQuery(n)
      this.queryHashes = hashes
      try {
        this.search(n, captured, shared.verificationWindow)
      } finally {
        // The caller owns the buffer; the indexer must not keep it alive or read it later.
        this.queryHashes = EMPTY_HASHES
      }
    }
    if (stats !== undefined) {
      stats.probeCalls += this.probeCalls
      stats.laneProbes += this.laneProbes
      stats.leftEdgeLanes += this.leftEdgeLanes
      stats.activatedLanes += this.activatedLanes
      stats.provenanceSkips += this.provenanceSkips
    }
    out.set(depths)
    return captured
  }

  /** Every captured lane's depth into `depths` (zeroed by the caller). */
  private search(n: number, captured: number, window: number): void {
    // A lane that misses position 0 has depth 0; a query no lane holds costs one hash.
    let active = 0
    for (let m = captured; m !== 0; m &= m - 1) {
      const lane = 31 - Math.clz32(m & -m)
      active |= this.hitAt(0, lane, 1 << lane)
    }
    if (active === 0) return
    // Many lanes on a short query visit most of its positions (16 lanes, 64 blocks: 43 of 63),
    // and hashing them in one batch and loading their rows together then beats stalling on each
    // row as a lane first reaches it; a long query's lanes visit few (16 × 256: 77 of 255).
    if (n > 1 && n <= EAGER_BLOCKS_PER_LANE * popcount16(active)) this.prepareRange(1, n)
    for (let m = active; m !== 0; m &= m - 1) {
      const lane = 31 - Math.clz32(m & -m)
      this.depths[lane] = this.laneDepth(n, window, lane)
    }
  }

  private reserveQuery(n: number): void {
    if (n > this.stamps.length) {
      const capacity = Math.max(n, this.stamps.length * 2, 64)
      this.stamps = new Uint32Array(capacity)
      this.reps = new Uint32Array(capacity)
      this.rowsA = new Uint32Array(capacity)
      this.rowsB = new Uint32Array(capacity)
      this.generation = 0
    }
    this.generation = (this.generation + 1) >>> 0
    if (this.generation === 0) {
      this.stamps.fill(0)
      this.generation = 1
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Lane ingestor

interface LaneAssignment {
  readonly identity: ProducerIdentity
  readonly lease: LaneLease
}

/**
 * The worker-local ingestion state of one physical lane. It must be driven by one logically
 * serialized owner; its sequence and lease are never read by queries.
 *
 * States: Unassigned → (assign) → AwaitingSnapshot → (snapshot) → Ready; a fault returns it to
 * assigned-but-not-ready with the lease kept (the pool decides on retirement); `retire` returns
 * it to Unassigned.
 */
export class GlobalCkfLaneIngestor {
  readonly lane: number
  private readonly shared: GlobalCkfShared
  private readonly bit: number
  private assignment: LaneAssignment | undefined = undefined
  private lastAssignmentEpoch: bigint | undefined = undefined
  private installed = 0n
  private ready = false
  private lastFailure: CkfFailureDisposition | undefined = undefined
  private released = false
  // Delta validation: one bit per bucket, plus the bitmap words touched by the current delta so
  // that clearing costs O(images), not O(bucketCount).
  private readonly seen: Uint32Array
  private readonly touched: Uint32Array
  private touchedCount = 0

  /** Claims the lane; throws `GlobalCkfBuildError` (`indexer.claimLane` returns it instead). */
  constructor(indexer: GlobalCkfIndexer, lane: number) {
    const shared = sharedOf.get(indexer)!
    if (!Number.isInteger(lane) || lane < 0 || lane >= CKF_LANE_COUNT) {
      throw new GlobalCkfBuildError({ kind: "InvalidLane", lane })
    }
    if (shared.manifest.poolId(lane) === undefined)
      throw new GlobalCkfBuildError({ kind: "UnconfiguredLane", lane })
    const bit = 1 << lane
    if ((shared.claimedLanes & bit) !== 0) throw new GlobalCkfBuildError({ kind: "LaneAlreadyClaimed", lane })
    shared.claimedLanes |= bit
    try {
      const words = Math.ceil(shared.table.bucketCount / 32)
      this.seen = new Uint32Array(words)
      this.touched = new Uint32Array(words)
    } catch {
      shared.claimedLanes &= ~bit
      throw new GlobalCkfBuildError({ kind: "AllocationFailed" })
    }
    this.shared = shared
    this.lane = lane
    this.bit = bit
  }

  /** The installed sequence, only while the lane is ready. */
  get installedSequence(): bigint | undefined {
    return this.ready ? this.installed : undefined
  }

  get lease(): LaneLease | undefined {
    return this.assignment?.lease
  }

  /** The disposition of the latest current-lane failure; `undefined` after ignored traffic. */
  get lastFailureDisposition(): CkfFailureDisposition | undefined {
    return this.lastFailure
  }

  get isReleased(): boolean {
    return this.released
  }

  assign(identity: ProducerIdentity, lease: LaneLease): GlobalCkfAssignmentError | undefined {
    this.ensureLive()
    this.lastFailure = undefined
    const error = validateAssignment(
      this.shared.manifest,
      this.lane,
      identity,
      lease,
      this.lastAssignmentEpoch
    )
    if (error !== undefined) return error
    // Readiness is withdrawn before the lease changes: a query that captured the old bit may
    // finish, but no later query sees the lane as ready under the new lease.
    this.clearReady()
    this.assignment = { identity, lease }
    this.lastAssignmentEpoch = lease.assignmentEpoch
    this.installed = 0n
    this.clearValidation()
    return undefined
  }

  /** Back to Unassigned. The last epoch is kept, so the same epoch cannot be assigned again. */
  retire(): void {
    this.lastFailure = undefined
    this.clearReady()
    this.assignment = undefined
    this.installed = 0n
    this.clearValidation()
  }

  installSnapshot(snapshot: DcCkfSnapshot): GlobalCkfIngestOutcome {
    return this.installSnapshotGuarded(snapshot, activateAlways)
  }

  /**
   * Install a snapshot and let `activate` decide (and perform, via `activateSnapshot`) the
   * activation, so that a transport can re-check its own admission state at that instant.
   */
  installSnapshotGuarded(
    snapshot: DcCkfSnapshot,
    activate: (ingestor: GlobalCkfLaneIngestor, sequence: bigint) => boolean
  ): GlobalCkfIngestOutcome {
    this.lastFailure = undefined
    const assignment = this.assignment
    if (assignment === undefined || !snapshot.lease.equals(assignment.lease)) return IGNORED_FOREIGN_LEASE
    if (!snapshot.identity.equals(assignment.identity)) return this.deactivateSnapshot(WRONG_IDENTITY)
    if (this.ready && snapshot.sequence <= this.installed) {
      // Stale traffic on the current lease is ignored before its payload is validated, so it
      // cannot retire a newer installed state.
      return { _tag: "IgnoredStaleOrDuplicate", installedSequence: this.installed }
    }
    const expected = this.shared.table.bucketCount
    if (snapshot.words.length !== expected * 2) {
      return this.deactivateSnapshot({
        _tag: "InvalidSnapshotBucketCount",
        expected,
        actual: snapshot.words.length / 2
      })
    }
    if (this.ready) {
      return this.deactivate(
        {
          _tag: "SnapshotWhileReady",
          installedSequence: this.installed,
          snapshotSequence: snapshot.sequence
        },
        "ConsumerGapOrMalformedBeforeWrite"
      )
    }
    this.clearReady()
    this.shared.table.installLane(this.lane, snapshot.words)
    if (!activate(this, snapshot.sequence)) return AWAITING_SNAPSHOT
    return { _tag: "SnapshotInstalled", sequence: snapshot.sequence }
  }

  /** The only place readiness is published: sequence first, then the ready bit. */
  activateSnapshot(sequence: bigint): void {
    this.ensureLive()
    this.installed = sequence
    this.ready = true
    this.shared.readyLanes |= this.bit
  }

  /** Apply one contiguous delta of absolute images; never buffered, not atomic to readers. */
  applyDelta(delta: DcCkfDelta): GlobalCkfIngestOutcome {
    this.lastFailure = undefined
    const assignment = this.assignment
    // Traffic from a superseded lease can never invalidate the current one.
    if (assignment === undefined || !delta.lease.equals(assignment.lease)) return IGNORED_FOREIGN_LEASE
    if (!delta.identity.equals(assignment.identity)) {
      return this.deactivate(WRONG_IDENTITY, "ConsumerGapOrMalformedBeforeWrite")
    }
    if (!this.ready) return AWAITING_SNAPSHOT
    const installed = this.installed
    if (delta.sequence <= installed) return { _tag: "IgnoredStaleOrDuplicate", installedSequence: installed }
    if (delta.baseSequence !== installed) {
      // A gap fails closed until a barrier snapshot is installed.
      return this.deactivate(
        { _tag: "BaseSequenceMismatch", expected: installed, actual: delta.baseSequence },
        "ConsumerGapOrMalformedBeforeWrite"
      )
    }
    if (delta.baseSequence >= U64_MAX)
      return this.deactivate(SEQUENCE_EXHAUSTED, "ConsumerGapOrMalformedBeforeWrite")
    if (delta.sequence !== delta.baseSequence + 1n) {
      return this.deactivate(
        { _tag: "NonContiguousSequence", base: delta.baseSequence, sequence: delta.sequence },
        "ConsumerGapOrMalformedBeforeWrite"
      )
    }
    const images = delta.images
    const invalid = this.validateImages(images)
    if (invalid !== undefined) return this.deactivate(invalid, "ConsumerGapOrMalformedBeforeWrite")
    const table = this.shared.table
    const lane = this.lane
    for (let i = 0; i < images.length; i += 3)
      table.writeWord(images[i]!, lane, images[i + 1]!, images[i + 2]!)
    this.installed = delta.sequence
    return { _tag: "DeltaApplied", sequence: delta.sequence, images: images.length / 3 }
  }

  /** Acknowledge an exact drain only at the expected terminal sequence (catches a lost final delta). */
  completeDrain(marker: ConsumerDrainMarker): GlobalCkfIngestOutcome {
    this.lastFailure = undefined
    const assignment = this.assignment
    if (assignment === undefined || !marker.lease.equals(assignment.lease)) return IGNORED_FOREIGN_LEASE
    if (this.ready && this.installed === marker.expectedSequence) {
      return { _tag: "DrainAcknowledged", installedSequence: this.installed }
    }
    return this.deactivate(
      {
        _tag: "TerminalSequenceMismatch",
        expected: marker.expectedSequence,
        actual: this.ready ? this.installed : undefined
      },
      "ConsumerGapOrMalformedBeforeWrite"
    )
  }

  /** Clear readiness and record the failure; the assignment is kept for the pool to decide. */
  deactivate(fault: GlobalCkfLaneFault, point: CkfFailurePoint): GlobalCkfIngestOutcome {
    this.lastFailure = failureDisposition(point)
    this.clearReady()
    return { _tag: "LaneDeactivated", fault }
  }

  /** Give the lane back (the reference's `Drop`): clears its ready and claimed bits. Idempotent. */
  release(): void {
    if (this.released) return
    this.lastFailure = undefined
    this.clearReady()
    this.assignment = undefined
    this.installed = 0n
    this.clearValidation()
    this.released = true
    this.shared.claimedLanes &= ~this.bit
  }

  private deactivateSnapshot(fault: GlobalCkfLaneFault): GlobalCkfIngestOutcome {
    return this.deactivate(
      fault,
      this.ready ? "ConsumerGapOrMalformedBeforeWrite" : "InactiveSnapshotInstallFailure"
    )
  }

  private clearReady(): void {
    this.ready = false
    // After release the lane may belong to a new ingestor; its bits are no longer ours.
    if (!this.released) this.shared.readyLanes &= ~this.bit
  }

  private ensureLive(): void {
    if (this.released) throw new Error(`global CKF lane ${this.lane} ingestor was released`)
  }

  /** Every image is checked before any is written, so a rejected delta leaves the lane untouched. */
  private validateImages(images: Uint32Array): GlobalCkfLaneFault | undefined {
    if (images.length === 0) return EMPTY_DELTA
    const bucketCount = this.shared.table.bucketCount
    const seen = this.seen
    let fault: GlobalCkfLaneFault | undefined
    for (let i = 0; i < images.length; i += 3) {
      const bucket = images[i]!
      // A trailing partial image has no trustworthy index.
      if (bucket >= bucketCount || i + 2 >= images.length) {
        fault = { _tag: "InvalidImageIndex", bucket }
        break
      }
      const w = bucket >>> 5
      const bit = 1 << (bucket & 31)
      const word = seen[w]!
      if ((word & bit) !== 0) {
        fault = { _tag: "DuplicateImageIndex", bucket }
        break
      }
      if (word === 0) this.touched[this.touchedCount++] = w
      seen[w] = word | bit
    }
    this.clearValidation()
    return fault
  }

  private clearValidation(): void {
    const seen = this.seen
    const touched = this.touched
    for (let i = 0; i < this.touchedCount; i++) seen[touched[i]!] = 0
    this.touchedCount = 0
  }
}

const activateAlways = (ingestor: GlobalCkfLaneIngestor, sequence: bigint): boolean => {
  ingestor.activateSnapshot(sequence)
  return true
}

// ---------------------------------------------------------------------------------------------
// Rolling sequence hashes (for routers that hold local block hashes)

/**
 * `XXH3(LE64(parent) ‖ LE64(child), seed)`. The chain seed differs between Dynamo versions
 * (0 in some `dynamo_tokens` commits, 1337 in the router), so it is always explicit here; the
 * chain itself lives in `tokens.ts`.
 */
export const chainSequenceHash = (parent: bigint, child: bigint, seed: bigint): bigint =>
  nextSequenceHash(parent, child, seed)

/** Rolling sequence hashes of local block hashes (hash pairs in, hash pairs out). */
export const chainSequenceHashes = (local: Uint32Array, seed: bigint): Uint32Array =>
  sequenceHashes(local, undefined, seed)
