/**
 * KV event sources per serving endpoint (relay-service.md §2.7): which source incarnation, if
 * any, feeds each (worker, dp rank) the endpoint's runtime configs expect, and a cumulative
 * lifecycle generation per rank that advances on every reset-requiring transition, so a watcher
 * that coalesces views can never miss a fence.
 *
 * `KvSourceMembership` is the pure incarnation set; `LifecycleTracker` derives the generations;
 * `KvSourceCoordinatorState` joins both with discovery snapshots and runtime configs;
 * `makeKvSourceCoordinator` runs one for an endpoint slot over the `Discovery` service.
 */

import { Data, Effect, Either, type Scope, Stream, SubscriptionRef } from "effect"
import { loopStep, supervised } from "../observability/Supervised.js"
import type { RuntimeConfig } from "../protocol/Discovery.js"
import {
  activeSource,
  type ExpectedRank,
  isRecoverableSource,
  type KvEventSource,
  type KvSourceMembershipView,
  type KvSourceStatus,
  type KvStateEndpointResolution,
  type RankKey,
  rankKey
} from "../protocol/Discovery.js"
import type { DpRank, WorkerId } from "../protocol/Events.js"
import { compareEndpointIds, type EndpointId } from "../protocol/Model.js"
import { compareUtf8 } from "../protocol/Text.js"
import { Discovery, type DiscoverySnapshot, type RejectedSource } from "./Discovery.js"
import { recordEquals, sourceLogicalKey, sourceRecordKey } from "./DiscoveryRecords.js"

/** Ranks of one worker beyond this are not expected (the reference rejects such sizes for load). */
const MAX_DATA_PARALLEL_SIZE = 4096
const U32_MAX = 0xffff_ffff

// ---------------------------------------------------------------------------------------------
// Endpoint resolution

const effectiveEndpoint = (serving: EndpointId, config: RuntimeConfig): EndpointId =>
  config.kvStateEndpoint ?? serving

/**
 * `Resolved` when the base runtime configs agree on one effective KV-state endpoint (no configs:
 * the serving endpoint; an omitted mapping equals an explicit mapping to the serving endpoint),
 * otherwise `Ambiguous` with the endpoints sorted.
 */
export const resolveKvStateEndpoint = (
  serving: EndpointId,
  configs: Iterable<RuntimeConfig>
): KvStateEndpointResolution => {
  const endpoints = new Map<string, EndpointId>()
  for (const config of configs) {
    const endpoint = effectiveEndpoint(serving, config)
    endpoints.set(endpoint.toString(), endpoint)
  }
  if (endpoints.size === 0) return { _tag: "Resolved", endpoint: serving }
  if (endpoints.size === 1) return { _tag: "Resolved", endpoint: endpoints.values().next().value! }
  return { _tag: "Ambiguous", endpoints: Array.from(endpoints.values()).sort(compareEndpointIds) }
}

const resolutionEquals = (a: KvStateEndpointResolution, b: KvStateEndpointResolution): boolean =>
  a._tag === "Resolved"
    ? b._tag === "Resolved" && a.endpoint.toString() === b.endpoint.toString()
    : b._tag === "Ambiguous" &&
      a.endpoints.length === b.endpoints.length &&
      a.endpoints.every((endpoint, i) => endpoint.toString() === b.endpoints[i]!.toString())

/** The KV state endpoint of the view's sources, when there is exactly one. */
export const resolvedKvStateEndpoint = (view: KvSourceMembershipView): EndpointId | undefined =>
  view.endpointResolution._tag === "Resolved" ? view.endpointResolution.endpoint : undefined

/** Materialization gate condition 3 (§2.8): at least one expected rank has an active source. */
export const hasActiveSource = (view: KvSourceMembershipView): boolean => {
  for (const rank of view.ranks.values()) if (activeSource(rank.status) !== undefined) return true
  return false
}

const statusEquals = (a: KvSourceStatus, b: KvSourceStatus): boolean => {
  if (a._tag !== b._tag) return false
  switch (a._tag) {
    case "Missing":
      return true
    case "ActiveRecoverable":
    case "ActiveLiveOnly":
      return recordEquals(a.source, (b as typeof a).source)
    case "Ambiguous":
      return recordEquals(a.reason, (b as typeof a).reason)
  }
}

// ---------------------------------------------------------------------------------------------
// Incarnations

class ConflictingIncarnation extends Data.TaggedError("ConflictingIncarnation")<{
  readonly publisherId: bigint
  readonly workerId: WorkerId
  readonly dpRank: DpRank
}> {
  override get message(): string {
    return `publisher ${this.publisherId} changed its immutable KV source descriptor for worker ${this.workerId} rank ${this.dpRank}`
  }
}

interface SourceId {
  readonly logicalKey: string
  readonly source: KvEventSource
}

/**
 * Advertised incarnations per logical source `(kvStateEndpoint, worker, rank)`. Zero is missing,
 * one is active, more are ambiguous; removal is incarnation-exact; a publisher that re-advertises
 * a different descriptor (or is invalidated) fails its logical source closed until that exact
 * incarnation is removed.
 */
export class KvSourceMembership {
  private readonly advertisements = new Map<string, Map<bigint, KvEventSource>>()
  private readonly publishers = new Map<bigint, SourceId>()
  private readonly conflicting = new Map<string, Set<bigint>>()

  /** Right(true) when the set changed; Left when the publisher already advertised something else. */
  add(source: KvEventSource): Either.Either<boolean, ConflictingIncarnation> {
    const logicalKey = sourceLogicalKey(source)
    const existing = this.publishers.get(source.publisherId)
    if (existing !== undefined) {
      if (existing.logicalKey === logicalKey && recordEquals(existing.source, source))
        return Either.right(false)
      this.markConflicting(existing.logicalKey, source.publisherId)
      return Either.left(
        new ConflictingIncarnation({
          publisherId: source.publisherId,
          workerId: existing.source.workerId,
          dpRank: existing.source.dpRank
        })
      )
    }
    this.publishers.set(source.publisherId, { logicalKey, source })
    let incarnations = this.advertisements.get(logicalKey)
    if (incarnations === undefined) {
      incarnations = new Map()
      this.advertisements.set(logicalKey, incarnations)
    }
    incarnations.set(source.publisherId, source)
    return Either.right(true)
  }

  /** Removes exactly this incarnation; a stale removal of another incarnation is a no-op. */
  remove(source: KvEventSource): boolean {
    const logicalKey = sourceLogicalKey(source)
    const registered = this.publishers.get(source.publisherId)
    if (registered === undefined || registered.logicalKey !== logicalKey) return false
    const incarnations = this.advertisements.get(logicalKey)
    if (incarnations === undefined || !incarnations.delete(source.publisherId)) return false
    this.publishers.delete(source.publisherId)
    const conflicting = this.conflicting.get(logicalKey)
    if (conflicting !== undefined) {
      conflicting.delete(source.publisherId)
      if (conflicting.size === 0) this.conflicting.delete(logicalKey)
    }
    if (incarnations.size === 0) this.advertisements.delete(logicalKey)
    return true
  }

  /** Fails the publisher's logical source closed (malformed or mis-attributed metadata). */
  invalidatePublisher(publisherId: bigint): boolean {
    const registered = this.publishers.get(publisherId)
    if (registered === undefined) return false
    this.markConflicting(registered.logicalKey, publisherId)
    return true
  }

  removePublisher(publisherId: bigint): boolean {
    const registered = this.publishers.get(publisherId)
    return registered !== undefined && this.remove(registered.source)
  }

  /** The record key the publisher is registered under. */
  publisherRecordKey(publisherId: bigint): string | undefined {
    const registered = this.publishers.get(publisherId)
    return registered === undefined ? undefined : sourceRecordKey(registered.source)
  }

  status(logicalKey: string): KvSourceStatus {
    const conflicting = this.conflicting.get(logicalKey)
    if (conflicting !== undefined && conflicting.size > 0) {
      // The lowest id only makes the report deterministic; no publisher is selected by value.
      let publisherId: bigint | undefined
      for (const id of conflicting) if (publisherId === undefined || id < publisherId) publisherId = id
      return { _tag: "Ambiguous", reason: { _tag: "ConflictingDescriptor", publisherId: publisherId! } }
    }
    const incarnations = this.advertisements.get(logicalKey)
    if (incarnations === undefined || incarnations.size === 0) return MISSING
    if (incarnations.size > 1) {
      const publisherIds = Array.from(incarnations.keys()).sort((a, b) => (a < b ? -1 : a > b ? 1 : 0))
      return { _tag: "Ambiguous", reason: { _tag: "Incarnations", publisherIds } }
    }
    const source = incarnations.values().next().value!
    return isRecoverableSource(source)
      ? { _tag: "ActiveRecoverable", source }
      : { _tag: "ActiveLiveOnly", source }
  }

  private markConflicting(logicalKey: string, publisherId: bigint): void {
    let set = this.conflicting.get(logicalKey)
    if (set === undefined) {
      set = new Set()
      this.conflicting.set(logicalKey, set)
    }
    set.add(publisherId)
  }
}

const MISSING: KvSourceStatus = { _tag: "Missing" }

// ---------------------------------------------------------------------------------------------
// Expected ranks and lifecycle generations

interface RankStatus {
  readonly workerId: WorkerId
  readonly dpRank: DpRank
  readonly status: KvSourceStatus
  readonly recoveryExpected: boolean
}

/**
 * The ranks the runtime configs expect (`start .. start + size`, u32 ranks only) with their
 * statuses; source-only advertisements never create ranks.
 */
const expectedStatuses = (
  membership: KvSourceMembership,
  resolution: KvStateEndpointResolution,
  configs: ReadonlyMap<WorkerId, RuntimeConfig>
): Map<RankKey, RankStatus> => {
  const out = new Map<RankKey, RankStatus>()
  const mapping: KvSourceStatus | undefined =
    resolution._tag === "Ambiguous"
      ? { _tag: "Ambiguous", reason: { _tag: "EndpointMapping", endpoints: resolution.endpoints } }
      : undefined
  const endpoint = resolution._tag === "Resolved" ? resolution.endpoint.toString() : ""
  for (const [workerId, config] of configs) {
    if (config.dataParallelSize > MAX_DATA_PARALLEL_SIZE) continue
    for (let offset = 0; offset < config.dataParallelSize; offset++) {
      const dpRank = config.dataParallelStartRank + offset
      if (dpRank > U32_MAX) break
      out.set(rankKey(workerId, dpRank), {
        workerId,
        dpRank,
        status: mapping ?? membership.status(`${endpoint}/${workerId}/${dpRank}`),
        recoveryExpected: config.enableLocalIndexer
      })
    }
  }
  return out
}

interface RankLifecycle {
  generation: number
  everActive: boolean
  previous: KvSourceStatus | undefined
}

/**
 * Reset-requiring transitions, cumulative per rank: bump when the KV-state endpoint mapping
 * changed, or when the status changed in any way except Missing→Missing and Missing→Active on a
 * rank that was never active; a rank that leaves the expected set after having been active bumps
 * once, and bumps again when it is observed after that (its history says it was active).
 */
class LifecycleTracker {
  private readonly entries = new Map<RankKey, RankLifecycle>()
  private resolution: KvStateEndpointResolution | undefined

  apply(
    resolution: KvStateEndpointResolution,
    statuses: ReadonlyMap<RankKey, RankStatus>
  ): Map<RankKey, ExpectedRank> {
    const remapped = this.resolution !== undefined && !resolutionEquals(this.resolution, resolution)
    this.resolution = resolution
    const ranks = new Map<RankKey, ExpectedRank>()
    for (const [key, rank] of statuses) {
      let lifecycle = this.entries.get(key)
      if (lifecycle === undefined) {
        lifecycle = { generation: 0, everActive: false, previous: undefined }
        this.entries.set(key, lifecycle)
      }
      if (remapped || requiresReset(lifecycle, rank.status)) lifecycle.generation++
      if (activeSource(rank.status) !== undefined) lifecycle.everActive = true
      lifecycle.previous = rank.status
      ranks.set(key, { ...rank, lifecycleGeneration: lifecycle.generation })
    }
    for (const [key, lifecycle] of this.entries) {
      if (statuses.has(key)) continue
      if (lifecycle.everActive && lifecycle.previous !== undefined) lifecycle.generation++
      lifecycle.previous = undefined
    }
    return ranks
  }
}

const requiresReset = (lifecycle: RankLifecycle, current: KvSourceStatus): boolean => {
  const previous = lifecycle.previous
  if (previous === undefined) return lifecycle.everActive
  if (statusEquals(previous, current)) return false
  if (previous._tag === "Missing") {
    if (current._tag === "Missing") return false
    if (current._tag === "ActiveLiveOnly" || current._tag === "ActiveRecoverable") return lifecycle.everActive
  }
  return true
}

// ---------------------------------------------------------------------------------------------
// Snapshot index

const groupBy = <A>(items: ReadonlyArray<A>, keyOf: (item: A) => string): Map<string, Array<A>> => {
  const groups = new Map<string, Array<A>>()
  for (const item of items) {
    const key = keyOf(item)
    const group = groups.get(key)
    if (group === undefined) groups.set(key, [item])
    else group.push(item)
  }
  return groups
}

// Keyed by the record arrays, which the backends keep from one snapshot to the next while no
// record of that kind changed: all coordinators share one index, built once per change.
const validIndexes = new WeakMap<
  ReadonlyArray<KvEventSource>,
  ReadonlyMap<string, ReadonlyArray<KvEventSource>>
>()
const rejectedIndexes = new WeakMap<
  ReadonlyArray<RejectedSource>,
  ReadonlyMap<string, ReadonlyArray<RejectedSource>>
>()

/** The snapshot's sources by KV-state endpoint text. */
const sourcesByEndpoint = (
  snapshot: DiscoverySnapshot
): ReadonlyMap<string, ReadonlyArray<KvEventSource>> => {
  let index = validIndexes.get(snapshot.sources)
  if (index === undefined) {
    index = groupBy(snapshot.sources, (source) => source.kvStateEndpoint.toString())
    validIndexes.set(snapshot.sources, index)
  }
  return index
}

/** The snapshot's rejected sources by the KV-state endpoint their keys name. */
const rejectedByEndpoint = (
  snapshot: DiscoverySnapshot
): ReadonlyMap<string, ReadonlyArray<RejectedSource>> => {
  let index = rejectedIndexes.get(snapshot.rejectedSources)
  if (index === undefined) {
    index = groupBy(snapshot.rejectedSources, (entry) => entry.kvStateEndpoint)
    rejectedIndexes.set(snapshot.rejectedSources, index)
  }
  return index
}

const EMPTY: ReadonlyArray<never> = []

const sameElements = <A>(a: ReadonlyArray<A>, b: ReadonlyArray<A>): boolean =>
  a === b || (a.length === b.length && a.every((x, i) => x === b[i]))

// ---------------------------------------------------------------------------------------------
// Coordinator state

/** The view of §2.7 plus the inputs it was computed from. */
export interface CoordinatedSourceView extends KvSourceMembershipView {
  /** The runtime configs the expected ranks came from (the seed's `matches_binding_inputs`). */
  readonly runtimeConfigs: ReadonlyMap<WorkerId, RuntimeConfig>
  /** Revision of the discovery snapshot the sources came from. */
  readonly revision: bigint
}

/** Whether `view` was computed from these runtime configs (by reference, else structurally). */
export const matchesBindingInputs = (
  view: CoordinatedSourceView,
  runtimeConfigs: ReadonlyMap<WorkerId, RuntimeConfig>
): boolean => {
  if (view.runtimeConfigs === runtimeConfigs) return true
  if (view.runtimeConfigs.size !== runtimeConfigs.size) return false
  for (const [worker, config] of runtimeConfigs) {
    const other = view.runtimeConfigs.get(worker)
    if (other === undefined || !recordEquals(other, config)) return false
  }
  return true
}

interface SourceReconciliation {
  readonly view: CoordinatedSourceView
  /** False when `view` is the previous view object. */
  readonly changed: boolean
  /** Invalidated publishers and descriptor conflicts seen by this reconciliation. */
  readonly warnings: ReadonlyArray<string>
}

const rankEquals = (a: ExpectedRank, b: ExpectedRank): boolean =>
  a.workerId === b.workerId &&
  a.dpRank === b.dpRank &&
  a.lifecycleGeneration === b.lifecycleGeneration &&
  a.recoveryExpected === b.recoveryExpected &&
  statusEquals(a.status, b.status)

const ranksEqual = (
  a: ReadonlyMap<RankKey, ExpectedRank>,
  b: ReadonlyMap<RankKey, ExpectedRank>
): boolean => {
  if (a.size !== b.size) return false
  for (const [key, rank] of a) {
    const other = b.get(key)
    if (other === undefined || !rankEquals(rank, other)) return false
  }
  return true
}

/**
 * The coordinator of one serving endpoint. Each `reconcile` applies one discovery snapshot and
 * one runtime-config map as one transition. A change of KV-state endpoint resolution or of the
 * source stream epoch resets the incarnation set (the reference's rebind); the reset is passed
 * through the lifecycle tracker before the rebuilt set, so both transitions count.
 */
export class KvSourceCoordinatorState {
  private membership = new KvSourceMembership()
  private readonly lifecycle = new LifecycleTracker()
  private binding: KvStateEndpointResolution | undefined
  private epoch: number | undefined
  private valid = new Map<string, KvEventSource>()
  private rejected = new Map<string, RejectedSource>()
  private last:
    | {
        readonly configs: ReadonlyMap<WorkerId, RuntimeConfig>
        readonly sources: ReadonlyArray<KvEventSource>
        readonly rejected: ReadonlyArray<RejectedSource>
        readonly epoch: number
        readonly bound: boolean
        readonly view: CoordinatedSourceView
      }
    | undefined

  constructor(readonly servingEndpoint: EndpointId) {}

  get view(): CoordinatedSourceView | undefined {
    return this.last?.view
  }

  reconcile(
    configs: ReadonlyMap<WorkerId, RuntimeConfig>,
    snapshot: DiscoverySnapshot
  ): SourceReconciliation {
    const last = this.last
    const resolution =
      last !== undefined && last.configs === configs
        ? last.view.endpointResolution
        : resolveKvStateEndpoint(this.servingEndpoint, configs.values())
    const bound = resolution._tag === "Resolved" ? resolution.endpoint.toString() : undefined
    const sources = bound === undefined ? EMPTY : (sourcesByEndpoint(snapshot).get(bound) ?? EMPTY)
    const rejected = bound === undefined ? EMPTY : (rejectedByEndpoint(snapshot).get(bound) ?? EMPTY)
    const { epoch, bound: streamBound } = snapshot.sourceStream
    if (
      last !== undefined &&
      last.configs === configs &&
      last.epoch === epoch &&
      last.bound === streamBound &&
      sameElements(last.sources, sources) &&
      sameElements(last.rejected, rejected)
    ) {
      return { view: last.view, changed: false, warnings: [] }
    }

    const warnings: Array<string> = []
    if (this.binding !== undefined && !resolutionEquals(this.binding, resolution))
      this.reset(resolution, configs)
    this.binding = resolution
    if (this.epoch !== undefined && this.epoch !== epoch) this.reset(resolution, configs)
    this.epoch = epoch
    if (bound !== undefined && streamBound) this.sync(sources, rejected, warnings)

    const ranks = this.lifecycle.apply(resolution, expectedStatuses(this.membership, resolution, configs))
    const previous = last?.view
    const view: CoordinatedSourceView =
      previous !== undefined &&
      resolutionEquals(previous.endpointResolution, resolution) &&
      ranksEqual(previous.ranks, ranks)
        ? { ...previous, runtimeConfigs: configs, revision: snapshot.revision }
        : {
            servingEndpoint: this.servingEndpoint,
            endpointResolution: resolution,
            ranks,
            runtimeConfigs: configs,
            revision: snapshot.revision
          }
    const changed =
      previous === undefined ||
      view.ranks !== previous.ranks ||
      (previous.runtimeConfigs !== configs && !matchesBindingInputs(previous, configs))
    const published = changed ? view : previous
    this.last = { configs, sources, rejected, epoch, bound: streamBound, view: published }
    return { view: published, changed, warnings }
  }

  /** A fresh incarnation set, observed once as an all-missing view before the rebuilt one. */
  private reset(resolution: KvStateEndpointResolution, configs: ReadonlyMap<WorkerId, RuntimeConfig>): void {
    this.membership = new KvSourceMembership()
    this.valid = new Map()
    this.rejected = new Map()
    this.lifecycle.apply(resolution, expectedStatuses(this.membership, resolution, configs))
  }

  /** Diffs the bound endpoint's records into the incarnation set: removals, invalidations, adds. */
  private sync(
    sources: ReadonlyArray<KvEventSource>,
    rejected: ReadonlyArray<RejectedSource>,
    warnings: Array<string>
  ): void {
    const nextValid = new Map<string, KvEventSource>()
    for (const source of sources) nextValid.set(sourceRecordKey(source), source)
    const nextRejected = new Map<string, RejectedSource>()
    for (const entry of rejected) nextRejected.set(entry.recordKey, entry)

    for (const [key, source] of this.valid) {
      if (!nextValid.has(key) && !nextRejected.has(key)) this.membership.remove(source)
    }
    for (const [key, entry] of this.rejected) {
      if (nextRejected.has(key) || nextValid.has(key) || entry.publisherId === undefined) continue
      // Removing a key whose valid value was overwritten by garbage removes that incarnation.
      if (this.membership.publisherRecordKey(entry.publisherId) === key)
        this.membership.removePublisher(entry.publisherId)
    }
    for (const key of Array.from(nextRejected.keys()).sort(compareUtf8)) {
      const entry = nextRejected.get(key)!
      const previous = this.rejected.get(key)
      if (previous !== undefined && previous.value === entry.value) continue
      if (entry.publisherId !== undefined && this.membership.invalidatePublisher(entry.publisherId)) {
        warnings.push(`invalidated KV source publisher ${entry.publisherId} (${key}): ${entry.reason}`)
      }
    }
    for (const key of Array.from(nextValid.keys()).sort(compareUtf8)) {
      const source = nextValid.get(key)!
      const previous = this.valid.get(key)
      if (previous === source || (previous !== undefined && recordEquals(previous, source))) continue
      const added = this.membership.add(source)
      if (Either.isLeft(added)) warnings.push(added.left.message)
    }
    this.valid = nextValid
    this.rejected = nextRejected
  }
}

// ---------------------------------------------------------------------------------------------
// Effect wrapper

/** Follows the expected ranks of one serving endpoint as discovery changes them. */
export interface KvSourceCoordinator {
  readonly servingEndpoint: EndpointId
  readonly current: Effect.Effect<CoordinatedSourceView>
  /** The current view, then every changed view. */
  readonly changes: Stream.Stream<CoordinatedSourceView>
  /** The endpoint membership's runtime configs changed; recompute against the latest snapshot. */
  readonly setRuntimeConfigs: (configs: ReadonlyMap<WorkerId, RuntimeConfig>) => Effect.Effect<void>
}

/**
 * Starts the coordinator of one serving endpoint: it follows `Discovery` snapshots in a fiber of
 * the current scope and republishes only changed views.
 */
export const makeKvSourceCoordinator = (
  servingEndpoint: EndpointId,
  initialConfigs: ReadonlyMap<WorkerId, RuntimeConfig>
): Effect.Effect<KvSourceCoordinator, never, Discovery | Scope.Scope> =>
  Effect.gen(function* () {
    const discovery = yield* Discovery
    const state = new KvSourceCoordinatorState(servingEndpoint)
    let configs = initialConfigs
    let snapshot = yield* discovery.current
    const first = state.reconcile(configs, snapshot)
    const ref = yield* SubscriptionRef.make(first.view)
    const lock = yield* Effect.makeSemaphore(1)
    const logWarnings = (warnings: ReadonlyArray<string>) =>
      Effect.forEach(warnings, (warning) => Effect.logWarning(warning), { discard: true })
    // Reading the latest inputs inside the lock keeps publication in input order.
    const recompute = lock.withPermits(1)(
      Effect.suspend(() => {
        const result = state.reconcile(configs, snapshot)
        return logWarnings(result.warnings).pipe(
          Effect.zipRight(result.changed ? SubscriptionRef.set(ref, result.view) : Effect.void)
        )
      })
    )
    const annotate = Effect.annotateLogs({
      component: "kv-source-coordinator",
      endpoint: String(servingEndpoint)
    })
    yield* logWarnings(first.warnings).pipe(annotate)
    // Supervised: after a defect it resubscribes, and the latest snapshot comes first.
    yield* discovery.changes.pipe(
      Stream.runForEach((next) =>
        Effect.suspend(() => {
          snapshot = next
          return loopStep("discovery.sources").pipe(Effect.zipRight(recompute))
        })
      ),
      (loop) => supervised("discovery.sources", loop),
      annotate,
      Effect.forkScoped
    )
    return {
      servingEndpoint,
      current: SubscriptionRef.get(ref),
      changes: ref.changes,
      setRuntimeConfigs: (next) =>
        Effect.suspend(() => {
          if (next === configs) return Effect.void
          configs = next
          return recompute.pipe(annotate)
        })
    }
  })
