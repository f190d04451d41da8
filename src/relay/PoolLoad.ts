/**
 * Pool load: per-rank KV capacity from the endpoint's runtime configs, the latest occupancy each
 * rank reported, and the aggregate the relay publishes per pool (relay-service §5).
 *
 * The published aggregate carries KV occupancy only (the newest `KvPoolLoadEntry` and
 * `/v1/load/watch`: used blocks, total blocks, observed and expected ranks). Scheduler reports
 * (`activeDecodeBlocks`, `activePrefillTokens`) are advisory: a known rank's report without
 * `kvUsedBlocks` is accepted and changes nothing (seed 001,
 * `scheduler_only_load_is_accepted_without_changing_snapshot`).
 *
 * An aggregate is authoritative only when every rank with known capacity reported; incomplete
 * coverage shows as observed < expected, and unknown values are absent, never zero.
 */

import { Data, Either } from "effect"
import type { ProducerIdentity } from "../ckf/identity.js"
import type { RuntimeConfig } from "../protocol/Discovery.js"
import type { DpRank, WorkerId } from "../protocol/Events.js"

/** Data-parallel ranks one worker may declare. */
const MAX_DATA_PARALLEL_RANKS = 4096

const U32_MAX = 0xffff_ffff
const U64_MAX = (1n << 64n) - 1n

/** `ActiveLoad` on the `kv_metrics` subject (relay-service §5.1). */
export interface ActiveLoad {
  readonly workerId: WorkerId
  readonly dpRank: DpRank
  readonly activeDecodeBlocks?: bigint | undefined
  readonly activePrefillTokens?: bigint | undefined
  readonly kvUsedBlocks?: bigint | undefined
}

type LoadObservationOutcome = "UnknownRank" | "IgnoredAdvisory" | "Updated"

type LoadCapacityProblem = "ZeroDataParallelSize" | "TooManyRanks" | "RankRangeOverflow"

const loadCapacityMessages: Record<
  LoadCapacityProblem,
  (e: {
    readonly workerId: WorkerId
    readonly dataParallelStartRank: number
    readonly dataParallelSize: number
  }) => string
> = {
  ZeroDataParallelSize: (e) => `worker ${e.workerId} has zero data_parallel_size`,
  TooManyRanks: (e) =>
    `worker ${e.workerId} declares ${e.dataParallelSize} data-parallel ranks, above the supported ${MAX_DATA_PARALLEL_RANKS}`,
  RankRangeOverflow: (e) =>
    `worker ${e.workerId} rank range overflow: start ${e.dataParallelStartRank} + size ${e.dataParallelSize}`
}

/** A pool's load capacity could not be set; `reason` says why. */
export class LoadCapacityError extends Data.TaggedError("LoadCapacityError")<{
  readonly reason: LoadCapacityProblem
  readonly workerId: WorkerId
  readonly dataParallelStartRank: number
  readonly dataParallelSize: number
}> {
  override get message(): string {
    return loadCapacityMessages[this.reason](this)
  }
}

/** The aggregate published per pool generation. */
export interface PoolLoadSnapshot {
  readonly producer: ProducerIdentity
  /** Sum over the observed ranks with known capacity; absent when none reported. */
  readonly kvUsedBlocks: bigint | undefined
  /** Sum of the known capacities; absent when no rank has a known capacity. */
  readonly totalKvBlocks: bigint | undefined
  readonly kvObservedRanks: number
  /** Ranks with a known, non-zero `totalKvBlocks`. */
  readonly kvExpectedRanks: number
}

/** True unless every rank with known capacity reported and at least one such rank exists. */
export const hasDegradedCoverage = (snapshot: PoolLoadSnapshot): boolean =>
  snapshot.kvExpectedRanks === 0 || snapshot.kvObservedRanks < snapshot.kvExpectedRanks

/** True when two pools' load snapshots are the same. */
export const loadSnapshotEquals = (a: PoolLoadSnapshot, b: PoolLoadSnapshot): boolean =>
  a.producer.equals(b.producer) &&
  a.kvUsedBlocks === b.kvUsedBlocks &&
  a.totalKvBlocks === b.totalKvBlocks &&
  a.kvObservedRanks === b.kvObservedRanks &&
  a.kvExpectedRanks === b.kvExpectedRanks

interface RankCapacity {
  /** Undefined when unknown; a declared 0 is unknown too (vLLM Ray DP publishes 0). */
  readonly totalKvBlocks: bigint | undefined
  readonly maxNumBatchedTokens: bigint | undefined
}

const rankKey = (workerId: WorkerId, dpRank: DpRank): string => `${workerId}/${dpRank}`

const saturatingAdd = (a: bigint, b: bigint): bigint => {
  const sum = a + b
  return sum > U64_MAX ? U64_MAX : sum
}

const capacityEquals = (a: RankCapacity, b: RankCapacity): boolean =>
  a.totalKvBlocks === b.totalKvBlocks && a.maxNumBatchedTokens === b.maxNumBatchedTokens

const capacitiesFrom = (
  configs: ReadonlyMap<WorkerId, RuntimeConfig>
): Either.Either<Map<string, RankCapacity>, LoadCapacityError> => {
  const capacities = new Map<string, RankCapacity>()
  // Workers in id order so the first reported error does not depend on map insertion order.
  const workers = Array.from(configs.keys()).sort(
    (a, b) => a.length - b.length || (a < b ? -1 : a > b ? 1 : 0)
  )
  for (const workerId of workers) {
    const config = configs.get(workerId)!
    const start = config.dataParallelStartRank
    const size = config.dataParallelSize
    const fields = { workerId, dataParallelStartRank: start, dataParallelSize: size }
    if (size === 0) return Either.left(new LoadCapacityError({ reason: "ZeroDataParallelSize", ...fields }))
    if (size > MAX_DATA_PARALLEL_RANKS)
      return Either.left(new LoadCapacityError({ reason: "TooManyRanks", ...fields }))
    if (start + size > U32_MAX)
      return Either.left(new LoadCapacityError({ reason: "RankRangeOverflow", ...fields }))
    const capacity: RankCapacity = {
      totalKvBlocks:
        config.totalKvBlocks === null || config.totalKvBlocks === 0n ? undefined : config.totalKvBlocks,
      maxNumBatchedTokens: config.maxNumBatchedTokens ?? undefined
    }
    for (let rank = start; rank < start + size; rank++) capacities.set(rankKey(workerId, rank), capacity)
  }
  return Either.right(capacities)
}

/** Load of one pool generation. Mutated only by the registry, synchronously. */
export class PoolLoadState {
  private constructor(
    private capacities: Map<string, RankCapacity>,
    private readonly observations: Map<string, bigint>
  ) {}

  /** A state with no declared ranks: its snapshot is degraded until capacity is known. */
  static empty(): PoolLoadState {
    return new PoolLoadState(new Map(), new Map())
  }

  static fromRuntimeConfigs(
    configs: ReadonlyMap<WorkerId, RuntimeConfig>
  ): Either.Either<PoolLoadState, LoadCapacityError> {
    return Either.map(capacitiesFrom(configs), (capacities) => new PoolLoadState(capacities, new Map()))
  }

  get declaredRanks(): number {
    return this.capacities.size
  }

  observe(load: ActiveLoad): LoadObservationOutcome {
    const key = rankKey(load.workerId, load.dpRank)
    if (!this.capacities.has(key)) return "UnknownRank"
    if (load.kvUsedBlocks === undefined) return "IgnoredAdvisory"
    this.observations.set(key, load.kvUsedBlocks)
    return "Updated"
  }

  /**
   * Recomputes capacity; on change, observations of vanished ranks are dropped. An invalid config
   * invalidates the state before the error is returned, so a previous complete aggregate cannot
   * stay authoritative while the caller retries.
   */
  replaceCapacity(configs: ReadonlyMap<WorkerId, RuntimeConfig>): Either.Either<boolean, LoadCapacityError> {
    const next = capacitiesFrom(configs)
    if (Either.isLeft(next)) {
      this.capacities = new Map()
      this.observations.clear()
      return Either.left(next.left)
    }
    const capacities = next.right
    let changed = capacities.size !== this.capacities.size
    if (!changed) {
      for (const [key, capacity] of capacities) {
        const previous = this.capacities.get(key)
        if (previous === undefined || !capacityEquals(previous, capacity)) {
          changed = true
          break
        }
      }
    }
    if (!changed) return Either.right(false)
    this.capacities = capacities
    for (const key of Array.from(this.observations.keys())) {
      if (!capacities.has(key)) this.observations.delete(key)
    }
    return Either.right(true)
  }

  /** On source disconnect; true when something was dropped. */
  clearObservations(): boolean {
    const had = this.observations.size > 0
    this.observations.clear()
    return had
  }

  snapshot(producer: ProducerIdentity): PoolLoadSnapshot {
    let expected = 0
    let observed = 0
    let total = 0n
    let used = 0n
    for (const [key, capacity] of this.capacities) {
      if (capacity.totalKvBlocks === undefined) continue
      expected++
      total = saturatingAdd(total, capacity.totalKvBlocks)
      const value = this.observations.get(key)
      if (value !== undefined) {
        observed++
        used = saturatingAdd(used, value)
      }
    }
    return {
      producer,
      kvUsedBlocks: observed > 0 ? used : undefined,
      totalKvBlocks: expected > 0 ? total : undefined,
      kvObservedRanks: observed,
      kvExpectedRanks: expected
    }
  }
}
