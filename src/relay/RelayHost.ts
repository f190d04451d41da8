/**
 * The DC-wide relay host (seed 000, `KvDcRelay::start` and `run_host_supervisor`): it follows the
 * membership view, keeps one `EndpointSlot` fiber per serving endpoint, and serves the
 * `KvDcRelayService` contract (catalog, membership, load, pool streams, health, stats,
 * diagnostic snapshots, flush, shutdown).
 *
 * - Validation names the setting: dc id non-empty without surrounding whitespace; positive
 *   publication threshold, publication delay and recovery attempt timeout; positive expected
 *   unique blocks; a valid discovery scope.
 * - Every start draws a fresh 63-bit relay incarnation (Effect `Random`), separate from the DRT
 *   instance id the caller gives: it fences the producer generations of different lifetimes.
 * - Slots live in a `FiberMap` keyed by slot incarnation, so a departing slot can finish
 *   retiring while a fresh slot of a returning endpoint starts. A departed slot is told to stop
 *   (it withdraws and drains its generation, as the seed's dropped metadata sender does), leaves
 *   the status table at once, and is reaped by a monitor fiber once it ended: never parked.
 * - Endpoints whose live memberships resolve to one PoolId are all fenced with a
 *   PoolMaterialization conflict (`reject_duplicate_live_pools`); fenced slots make the relay
 *   unhealthy.
 * - `shutdown` (idempotent; the scope's close runs it): stop following membership, drain every
 *   slot (each withdraws its pool before its actor drains), clear the catalog, end the pool
 *   streams, publish an empty membership, close discovery.
 */

import {
  Deferred,
  Duration,
  Effect,
  Either,
  Exit,
  Fiber,
  FiberMap,
  FiberSet,
  Layer,
  Random,
  type Scope,
  Stream,
  SubscriptionRef
} from "effect"
import { compareMembers, memberKey } from "../ckf/events.js"
import { type DcId, PoolId } from "../ckf/identity.js"
import { Discovery, type DiscoveryStatus } from "../discovery/Discovery.js"
import {
  type ConfigProblem,
  type DiscoveryScope,
  validateDiscoveryScope,
  WATCH_ALL
} from "../discovery/DiscoveryConfig.js"
import {
  type DcMembershipView,
  type EndpointMembership,
  emptyMembershipView,
  makeConflict
} from "../discovery/Membership.js"
import { membershipEquals } from "../discovery/MembershipProjection.js"
import { makeMembershipWatch } from "../discovery/MembershipWatch.js"
import { loopStep, supervised } from "../observability/Supervised.js"
import { deriveStableDcId } from "../protocol/Identity.js"
import { DcRelayIdentity, type EndpointId } from "../protocol/Model.js"
import { compareUtf8 } from "../protocol/Text.js"
import type { KvEventTransport } from "../recovery/EventTransport.js"
import { makeFifoSemaphore } from "../recovery/FifoSemaphore.js"
import { RECOVERY_CONCURRENCY_LIMIT } from "../recovery/SourceSupervisor.js"
import * as EndpointSlot from "./EndpointSlot.js"
import * as EngineLoad from "./EngineLoad.js"
import * as HostWorkerQueries from "./internal/HostWorkerQueries.js"
import * as PoolRegistryLive from "./internal/PoolRegistryLive.js"
import type { ExpectedSourceState } from "./KvDcRelay.js"
import {
  type DiagnosticSnapshot,
  type EndpointAggregationStats,
  type EndpointStats,
  KvDcRelay,
  type KvDcRelayService,
  type RelayHealth,
  type RelayStats,
  type SourceCounts
} from "./KvDcRelay.js"
import type { ActorStats } from "./PoolActor.js"
import type * as PoolRegistry from "./PoolRegistry.js"
import * as PublicationSource from "./PublicationSource.js"
import {
  ActorStopped,
  InvalidRelayConfig,
  type KvDcRelayError,
  RelayShuttingDown,
  UnknownEndpoint
} from "./RelayErrors.js"

/** Unique blocks a pool's CKF is sized for by default (`--expected-unique-blocks`). */
export const DEFAULT_EXPECTED_UNIQUE_BLOCKS = 1_048_576
/** Changed buckets that make the actor publish a delta at once, by default. */
export const DEFAULT_PUBLICATION_THRESHOLD = 16
const DEFAULT_PUBLICATION_DELAY_MS = 1
const DEFAULT_RECOVERY_ATTEMPT_TIMEOUT_MS = 30_000
/** Worker queries in flight relay-wide (the seed's `DEFAULT_RECOVERY_FETCH_CONCURRENCY`). */
const DEFAULT_RECOVERY_FETCH_CONCURRENCY = RECOVERY_CONCURRENCY_LIMIT

// ---------------------------------------------------------------------------------------------
// Configuration

/** Everything `kvrelay relay` configures about the relay itself (not its HTTP server). */
export interface RelayHostConfig {
  /** `--dc-id`: the DC's name; its `stableDcId` is every pool's DC dimension. */
  readonly dcName: string
  /** The backing runtime's instance id; may stay the same across restarts. */
  readonly drtInstanceId: bigint
  /** Which endpoints to supervise (default: every namespace). */
  readonly scope?: DiscoveryScope | undefined
  readonly expectedUniqueBlocks?: number | undefined
  readonly publicationThreshold?: number | undefined
  readonly publicationDelayMs?: number | undefined
  readonly recoveryAttemptTimeoutMs?: number | undefined
  /** Pool-stream limits (defaults per PROTOCOL §5). */
  readonly publicationSource?: PublicationSource.PublicationSourceOptions | undefined
  /** Test hooks and hub settings of the registry. */
  readonly registry?:
    | Omit<Partial<PoolRegistry.PoolRegistryOptions>, "relayIdentity" | "actorConfig">
    | undefined
  /**
   * Live KV event subscriptions and recovery queries (ZeroMQ in production:
   * `makeZmqEventTransport()` from src/transport). Injected: the host composes transports, it
   * does not depend on one.
   */
  readonly eventTransport: KvEventTransport
  /** How often each rank's load is observed (default 1 s). */
  readonly loadObservationInterval?: Duration.DurationInput | undefined
  /**
   * Engine load from the sources' `metricsUrl`s (PROTOCOL §5 ◆3): the poller's settings (read
   * every 1 s, 1 s each, 16 at once by default), or false to read none.
   */
  readonly engineMetrics?: EngineLoad.EngineLoadOptions | false | undefined
}

const positiveInteger = (
  problems: Array<ConfigProblem>,
  setting: string,
  value: number | undefined,
  what: string
): void => {
  if (value === undefined) return
  if (!Number.isSafeInteger(value) || value <= 0) {
    problems.push({ setting, message: `KV DC Relay ${what} must be a positive integer, got ${value}` })
  }
}

/** Every problem of the configuration, each naming its setting (`KvDcRelay::start`'s checks). */
export const validateRelayConfig = (
  config: Omit<RelayHostConfig, "eventTransport">
): ReadonlyArray<ConfigProblem> => {
  const problems: Array<ConfigProblem> = []
  if (config.dcName.length === 0) {
    problems.push({ setting: "dcId", message: "KV DC Relay dc_id must not be empty" })
  } else if (Either.isLeft(deriveStableDcId(config.dcName))) {
    problems.push({
      setting: "dcId",
      message: "KV DC Relay dc_id must not contain leading or trailing whitespace"
    })
  }
  positiveInteger(problems, "publicationThreshold", config.publicationThreshold, "publication_threshold")
  positiveInteger(problems, "publicationDelayMs", config.publicationDelayMs, "publication_delay_ms")
  positiveInteger(
    problems,
    "recoveryAttemptTimeoutMs",
    config.recoveryAttemptTimeoutMs,
    "recovery_attempt_timeout_ms"
  )
  positiveInteger(problems, "expectedUniqueBlocks", config.expectedUniqueBlocks, "expected_unique_blocks")
  problems.push(...validateDiscoveryScope(config.scope ?? WATCH_ALL))
  return problems
}

/** A random 63-bit relay incarnation (the seed masks a random u64 with `i64::MAX`). */
const newRelayIncarnation: Effect.Effect<bigint> = Effect.gen(function* () {
  const hi = yield* Random.nextIntBetween(0, 0x8000_0000)
  const lo = yield* Random.nextIntBetween(0, 0x1_0000_0000)
  return (BigInt(hi) << 32n) | BigInt(lo)
})

// ---------------------------------------------------------------------------------------------
// Host pieces (exported for the seed-test ports)

/**
 * `reject_duplicate_live_pools`: endpoints whose memberships resolve to the same PoolId are all
 * fenced (a PoolMaterialization conflict each), never merged and never first-wins. As in the
 * seed, a claimant is a membership with a domain and no conflict of any scope; registrations
 * are not asked for. Returns `view` itself when nothing collides.
 */
export const rejectDuplicateLivePools = (
  view: DcMembershipView,
  dcId: DcId,
  onCollision?: (poolId: PoolId, endpoints: ReadonlyArray<string>) => void
): DcMembershipView => {
  const owners = new Map<string, { readonly poolId: PoolId; readonly endpoints: Array<string> }>()
  for (const [key, membership] of view.endpoints) {
    // The seed's rule, not `isMaterializable`: a membership that already carries a conflict
    // (even a ServingBinding one, which still materializes) claims nothing, and one without
    // registrations still claims its domain's pool.
    if (membership.conflicts.length > 0 || membership.domain === null) continue
    const poolId = new PoolId(membership.domain.id, dcId)
    const entry = owners.get(poolId.key)
    if (entry === undefined) owners.set(poolId.key, { poolId, endpoints: [key] })
    else entry.endpoints.push(key)
  }
  let endpoints: Map<string, EndpointMembership> | undefined
  for (const { poolId, endpoints: claimants } of owners.values()) {
    if (claimants.length < 2) continue
    claimants.sort(compareUtf8)
    onCollision?.(poolId, claimants)
    endpoints ??= new Map(view.endpoints)
    for (const key of claimants) {
      const membership = endpoints.get(key)!
      const conflict = makeConflict(
        "PoolMaterialization",
        { _tag: "Endpoint", endpoint: membership.endpoint },
        `pool ${poolId} is claimed by multiple serving endpoints`
      )
      // A claimant had no conflict, so this one is its only conflict.
      endpoints.set(key, { ...membership, conflicts: [conflict] })
    }
  }
  return endpoints === undefined ? view : { endpoints }
}

/** Discovery that has been live since the epoch: the seed's health has no discovery state. */
const ALWAYS_LIVE: DiscoveryStatus = { state: "live", since: new Date(0) }

/**
 * `KvDcRelay::health` over the slots' statuses. Discovery is reported, not judged: a stale or
 * connecting backend leaves the relay healthy (PROTOCOL §2), since the last membership serves.
 */
const NO_SOURCES: SourceCounts = {
  expected: 0,
  connecting: 0,
  live: 0,
  recovering: 0,
  degraded: 0,
  rejected: 0
}

/** Counts expected sources by state. */
const countSources = (
  sources: Iterable<{ readonly state: ExpectedSourceState }>,
  into: { -readonly [K in keyof SourceCounts]: SourceCounts[K] } = { ...NO_SOURCES }
): SourceCounts => {
  for (const source of sources) {
    into.expected++
    into[source.state]++
  }
  return into
}

/** The relay's health from its endpoints' slot states and discovery's status. */
export const relayHealth = (
  statuses: Iterable<EndpointSlot.EndpointSlotStatus>,
  shuttingDown: boolean,
  sources: SourceCounts = NO_SOURCES,
  discovery: DiscoveryStatus = ALWAYS_LIVE
): RelayHealth => {
  let endpointCount = 0
  let activeEndpointCount = 0
  let fencedEndpointCount = 0
  for (const status of statuses) {
    endpointCount++
    if (status.lifecycle === "active") activeEndpointCount++
    else if (status.lifecycle === "fenced") fencedEndpointCount++
  }
  return {
    healthy: !shuttingDown && fencedEndpointCount === 0,
    shuttingDown,
    endpointCount,
    activeEndpointCount,
    fencedEndpointCount,
    sourcesRecovering: sources.recovering,
    sourcesDegraded: sources.degraded,
    sources,
    discovery
  }
}

/** One running slot (the seed's `EndpointSlotTask`). */
export interface EndpointSlotTask {
  readonly endpoint: EndpointId
  readonly metadata: SubscriptionRef.SubscriptionRef<EndpointMembership | undefined>
  /** Completing it is the seed's dropped metadata sender: the slot drains and ends. */
  readonly stop: Deferred.Deferred<void>
  readonly status: EndpointSlot.EndpointSlotStatus
  readonly fiber: Fiber.Fiber<void>
}

/** What a reaper reports once a retired slot's fiber ended. */
export type RetiredEndpointSlot = readonly [EndpointId, Exit.Exit<void>]

const reportEndpointSlotExit = (endpoint: EndpointId, exit: Exit.Exit<void>): Effect.Effect<void> =>
  Exit.isSuccess(exit) || Exit.isInterrupted(exit)
    ? Effect.void
    : Effect.logWarning("KV DC Relay endpoint slot failed").pipe(
        Effect.annotateLogs({ endpoint: endpoint.toString(), cause: String(exit.cause) })
      )

/**
 * `retire_departed_endpoint_slots`: every slot whose endpoint left `view` leaves `slots`, is told
 * to stop, and gets a reaper in `retired` that ends (and leaves the set) with the slot.
 */
export const retireDepartedEndpointSlots = (
  view: DcMembershipView,
  slots: Map<string, EndpointSlotTask>,
  retired: FiberSet.FiberSet<RetiredEndpointSlot>
): Effect.Effect<ReadonlyArray<Fiber.RuntimeFiber<RetiredEndpointSlot>>> =>
  Effect.gen(function* () {
    const reapers: Array<Fiber.RuntimeFiber<RetiredEndpointSlot>> = []
    for (const [key, slot] of [...slots]) {
      if (view.endpoints.has(key)) continue
      slots.delete(key)
      yield* Deferred.succeed(slot.stop, undefined)
      const reaper = yield* FiberSet.run(
        retired,
        Fiber.await(slot.fiber).pipe(
          Effect.tap((exit) => reportEndpointSlotExit(slot.endpoint, exit)),
          Effect.map((exit): RetiredEndpointSlot => [slot.endpoint, exit])
        )
      )
      reapers.push(reaper)
    }
    return reapers
  })

const sameMetadata = (current: EndpointMembership | undefined, next: EndpointMembership): boolean =>
  current === next ||
  (current !== undefined && current.generation === next.generation && membershipEquals(current, next))

// ---------------------------------------------------------------------------------------------
// The host

/** `KvDcRelay.start`: validates, then starts the host in the current scope. */
export const make = (
  config: RelayHostConfig
): Effect.Effect<KvDcRelayService, InvalidRelayConfig, Discovery | Scope.Scope> =>
  Effect.gen(function* () {
    const problems = validateRelayConfig(config)
    if (problems.length > 0) return yield* new InvalidRelayConfig({ problems })
    const discovery = yield* Discovery
    const dcName = config.dcName
    const dcId = Either.getOrThrow(deriveStableDcId(dcName))
    const identity = new DcRelayIdentity({
      drtInstanceId: config.drtInstanceId,
      relayIncarnation: yield* newRelayIncarnation
    })
    const recoveryAttemptTimeout = Duration.millis(
      config.recoveryAttemptTimeoutMs ?? DEFAULT_RECOVERY_ATTEMPT_TIMEOUT_MS
    )
    const eventTransport = config.eventTransport

    const registry = yield* PoolRegistryLive.make({
      ...config.registry,
      relayIdentity: identity,
      actorConfig: {
        expectedUniqueBlocks: config.expectedUniqueBlocks ?? DEFAULT_EXPECTED_UNIQUE_BLOCKS,
        publicationThreshold: config.publicationThreshold ?? DEFAULT_PUBLICATION_THRESHOLD,
        publicationDelay: Duration.millis(config.publicationDelayMs ?? DEFAULT_PUBLICATION_DELAY_MS)
      }
    })
    const publication = yield* PublicationSource.make(registry, config.publicationSource)
    // FIFO: a relay starting under thousands of ranks queues a recovery per rank on it.
    const recoverySemaphore = yield* makeFifoSemaphore(DEFAULT_RECOVERY_FETCH_CONCURRENCY)
    const membershipWatch = yield* makeMembershipWatch(config.scope ?? WATCH_ALL)
    const membershipRef = yield* SubscriptionRef.make<DcMembershipView>(emptyMembershipView)
    const slotFibers = yield* FiberMap.make<string>()
    const reapers = yield* FiberSet.make<RetiredEndpointSlot>()
    const monitors = yield* FiberSet.make<void>()

    const slots = new Map<string, EndpointSlotTask>()

    // Every materialized generation's expected sources, for the engine-metrics poller's ticks.
    const poolSources = Effect.suspend(() =>
      Effect.forEach(
        Array.from(slots.values(), (slot) => slot.status),
        (status) => {
          const attachment = status.attachment
          const subscriber = status.subscriber
          if (attachment === undefined || subscriber === undefined) return Effect.succeed([])
          return Effect.map(subscriber.health, (health) => [
            {
              producerKey: attachment.identity.key,
              servingEndpoint: status.endpoint.toString(),
              sources: health.expected
            }
          ])
        }
      )
    ).pipe(Effect.map((lists) => lists.flat()))
    const engineLoad =
      config.engineMetrics === false
        ? EngineLoad.noEngineLoad
        : yield* EngineLoad.make(poolSources, config.engineMetrics ?? {})
    /** Current and retiring slots: shutdown drains both. */
    const running = new Set<EndpointSlotTask>()
    let slotIncarnation = 0
    let shuttingDown = false

    const startSlot = (membership: EndpointMembership) =>
      Effect.gen(function* () {
        const endpoint = membership.endpoint
        const metadata = yield* SubscriptionRef.make<EndpointMembership | undefined>(membership)
        const stop = yield* Deferred.make<void>()
        const status = new EndpointSlot.EndpointSlotStatus(endpoint)
        // Supervised: a slot that dies of a defect has drained its generation (`run` ensures it)
        // and starts over from its current membership, attaching a new generation.
        const fiber = yield* FiberMap.run(
          slotFibers,
          `${membership.key}#${++slotIncarnation}`,
          supervised(
            "relay.endpoint-slot",
            EndpointSlot.run({
              endpoint,
              dcId,
              registry,
              membership: metadata,
              stop,
              status,
              // The seed gives every slot its own rebuild permit.
              rebuildPermit: yield* Effect.makeSemaphore(1),
              recoverySemaphore,
              recoveryAttemptTimeout,
              eventTransport,
              loadObservationInterval: config.loadObservationInterval
            })
          ).pipe(Effect.provideService(Discovery, discovery))
        )
        const task: EndpointSlotTask = { endpoint, metadata, stop, status, fiber }
        running.add(task)
        yield* FiberSet.run(
          monitors,
          Fiber.await(fiber).pipe(
            Effect.flatMap((exit) =>
              Effect.sync(() => running.delete(task)).pipe(
                // A current slot that failed is logged here; retired ones by their reaper.
                Effect.zipRight(
                  slots.get(membership.key) === task ? reportEndpointSlotExit(endpoint, exit) : Effect.void
                )
              )
            )
          )
        )
        return task
      })

    const applyView = (raw: DcMembershipView) =>
      Effect.gen(function* () {
        if (shuttingDown) return
        const collisions: Array<readonly [PoolId, ReadonlyArray<string>]> = []
        const view = rejectDuplicateLivePools(raw, dcId, (poolId, endpoints) => {
          collisions.push([poolId, endpoints])
        })
        for (const [poolId, endpoints] of collisions) {
          yield* Effect.logError(
            "multiple live serving endpoints resolve to one CKF pool; fencing all colliding endpoints"
          ).pipe(Effect.annotateLogs({ poolId: poolId.toString(), endpoints: endpoints.join(",") }))
        }
        for (const [key, membership] of view.endpoints) {
          let slot = slots.get(key)
          if (slot === undefined) {
            slot = yield* startSlot(membership)
            slots.set(key, slot)
          } else if (!sameMetadata(yield* SubscriptionRef.get(slot.metadata), membership)) {
            yield* SubscriptionRef.set(slot.metadata, membership)
          }
        }
        yield* retireDepartedEndpointSlots(view, slots, reapers)
        // Published after the slots heard of it: the topology never sees a membership first.
        yield* SubscriptionRef.set(membershipRef, view)
      }).pipe(Effect.withSpan("KvDcRelay.applyMembership", { attributes: { endpoints: raw.endpoints.size } }))

    // Supervised: after a defect the current view comes first, and applying it again is idempotent.
    const supervisor = yield* membershipWatch.changes.pipe(
      Stream.runForEach((view) => loopStep("relay.membership").pipe(Effect.zipRight(applyView(view)))),
      (loop) => supervised("relay.membership", loop),
      Effect.forkScoped
    )

    const shutdown = yield* Effect.cached(
      Effect.gen(function* () {
        shuttingDown = true
        yield* Fiber.interrupt(supervisor)
        const tasks = [...running]
        slots.clear()
        for (const task of tasks) yield* Deferred.succeed(task.stop, undefined)
        yield* Effect.forEach(tasks, (task) => Fiber.await(task.fiber), {
          concurrency: "unbounded",
          discard: true
        })
        yield* FiberSet.awaitEmpty(reapers)
        yield* registry.shutdown
        yield* publication.shutdown
        yield* SubscriptionRef.set(membershipRef, emptyMembershipView)
        yield* discovery.close
        yield* Effect.logInfo("KV DC Relay host shut down").pipe(Effect.annotateLogs("slots", tasks.length))
      }).pipe(Effect.uninterruptible, Effect.withSpan("KvDcRelay.shutdown"))
    )
    // Added last, so it runs first when the scope closes: slots drain while everything they use
    // is still open.
    yield* Effect.addFinalizer(() => shutdown)

    const statusOf = (endpoint: EndpointId) =>
      Effect.suspend(() => {
        const slot = slots.get(endpoint.toString())
        const attachment = slot?.status.attachment
        return slot === undefined || attachment === undefined
          ? Effect.fail(new UnknownEndpoint({ endpoint: endpoint.toString() }))
          : Effect.succeed({ status: slot.status, attachment })
      })

    const endpointStats = (status: EndpointSlot.EndpointSlotStatus): Effect.Effect<EndpointStats> =>
      Effect.gen(function* () {
        const membership = status.membership
        const attachment = status.attachment
        const subscriber = status.subscriber
        const actor = attachment?.actor
        // A generation may retire between reading the status and asking its actor: it then
        // reports no pool, like a slot that has none.
        const actorStats =
          actor === undefined
            ? undefined
            : yield* Effect.option(actor.stateStats).pipe(Effect.map(optionValue))
        const diagnostics = actor === undefined ? undefined : yield* actor.diagnostics
        const mailboxDepth = actor === undefined ? 0 : yield* actor.mailboxDepth
        const health = subscriber === undefined ? undefined : yield* subscriber.health
        const stats = actorStats?.stats
        const ingest = { ...(yield* status.ingest), unanchored: stats?.aggregation.unanchoredBlocks ?? 0 }
        const partial = new Set(
          (actorStats?.partialMembers ?? []).map((m) => memberKey(m.workerId, m.dpRank))
        )
        return {
          servingEndpoint: status.endpoint,
          lifecycle: status.lifecycle,
          layoutGeneration: status.layoutGeneration,
          membershipConflicts: membership?.conflicts.map((c) => c.text) ?? [],
          models: membership?.models ?? [],
          aliases: membership?.aliases ?? [],
          roles: membership?.roles ?? [],
          aggregation:
            actorStats === undefined || stats === undefined
              ? undefined
              : {
                  members: membersWithTiers(actorStats),
                  contributionCount: stats.aggregation.contributionCount,
                  uniqueBlockCount: stats.aggregation.uniqueBlockCount,
                  unknownRemovals: stats.aggregation.unknownRemovals,
                  capacityFailures: stats.aggregation.capacityFailures,
                  parentNotFound: stats.aggregation.parentNotFound,
                  unanchoredRemovals: stats.aggregation.unanchoredRemovals,
                  occupiedBucketCount: stats.aggregation.occupiedBucketCount,
                  occupiedSlotCount: stats.aggregation.occupiedSlotCount
                },
          publication:
            actorStats === undefined || stats === undefined
              ? undefined
              : {
                  sequence: actorStats.sequence,
                  pendingEvents: stats.publication.pendingEvents,
                  emittedImages: stats.publication.emittedImages,
                  publicationCount: diagnostics?.publications ?? 0,
                  unchangedPublicationCount: diagnostics?.unchangedPublications ?? 0,
                  physicalTouches: stats.publication.physicalTouches,
                  distinctTouchedBuckets: stats.publication.distinctTouchedBuckets,
                  netRevertedBuckets: stats.publication.netRevertedBuckets
                },
          memory: stats === undefined ? undefined : { ...stats.memory },
          tiers: actorStats?.tiers,
          recovery: {
            degradedResets: diagnostics?.degradedResets ?? 0,
            rebuildCount: diagnostics?.rebuilds ?? 0,
            rebuildTotalMs: diagnostics?.rebuildTotalMs ?? 0,
            rebuildMaxMs: diagnostics?.rebuildMaxMs ?? 0,
            workerCount: health?.workerCount ?? 0,
            rankCount: health?.rankCount ?? 0,
            recoveringRankCount: health?.recoveringRankCount ?? 0,
            pendingLiveEventCount: health?.pendingLiveEventCount ?? 0,
            sourcesRecovering: health?.sourcesRecovering ?? 0,
            sourcesDegraded: health?.sourcesDegraded ?? 0,
            sources: health?.sources ?? []
          },
          actor:
            actor === undefined || diagnostics === undefined
              ? undefined
              : {
                  mailboxDepth,
                  mailboxCapacity: actor.mailboxCapacity,
                  activeCommand: diagnostics.activeCommand,
                  shuttingDown: diagnostics.shuttingDown,
                  lastError: diagnostics.lastError,
                  publishDelay: diagnostics.publishDelay
                },
          ingest,
          sources: yield* Effect.forEach(health?.expected ?? [], (source) =>
            Effect.map(engineLoad.sourceStats(source.metricsUrl, source.dpRank), (metrics) => ({
              workerId: source.workerId,
              dpRank: source.dpRank,
              publisherId: source.publisherId,
              transportEndpoint: source.transportEndpoint,
              state: source.state,
              since: new Date(source.since),
              history: partial.has(memberKey(source.workerId, source.dpRank))
                ? ("partial" as const)
                : ("complete" as const),
              reason: source.reason,
              metrics
            }))
          )
        } satisfies EndpointStats
      })

    const stats: Effect.Effect<RelayStats, KvDcRelayError> = Effect.gen(function* () {
      const statuses = [...slots.values()].map((slot) => slot.status)
      const endpoints = yield* Effect.forEach(statuses, endpointStats)
      endpoints.sort((a, b) => compareUtf8(a.servingEndpoint.toString(), b.servingEndpoint.toString()))
      return {
        identity: {
          dcName,
          dcId,
          drtInstanceId: identity.drtInstanceId,
          relayIncarnation: identity.relayIncarnation
        },
        endpoints
      } satisfies RelayStats
    })

    const diagnosticSnapshot = (endpoint: EndpointId): Effect.Effect<DiagnosticSnapshot, KvDcRelayError> =>
      Effect.gen(function* () {
        const { attachment } = yield* statusOf(endpoint)
        const snapshot = yield* attachment.actor.snapshot
        return {
          servingEndpoint: endpoint,
          layoutGeneration: attachment.layoutGeneration,
          sequence: snapshot.sequence,
          memberCount: snapshot.stats.aggregation.memberCount,
          uniqueBlockCount: snapshot.stats.aggregation.uniqueBlockCount,
          producer: snapshot.identity,
          words: snapshot.words
        } satisfies DiagnosticSnapshot
      }).pipe(
        Effect.withSpan("KvDcRelay.diagnosticSnapshot", { attributes: { endpoint: endpoint.toString() } })
      )

    const { queryWorkers, queryWorkersNow, sourceRanks } = yield* HostWorkerQueries.make(
      (endpoint) => slots.get(endpoint.toString())?.status
    )

    const flush: Effect.Effect<void, KvDcRelayError> = Effect.suspend(() => {
      // As in the seed, a relay without materialized endpoints (shut down included) has nothing to publish.
      const targets = [...slots.values()].flatMap((slot) => {
        const attachment = slot.status.attachment
        return attachment === undefined ? [] : [{ status: slot.status, attachment }]
      })
      return Effect.forEach(
        targets,
        ({ status, attachment }) =>
          attachment.actor.flush.pipe(
            // A generation that retired meanwhile has nothing left to publish.
            Effect.catchIf(
              (error) =>
                (error instanceof ActorStopped || error instanceof RelayShuttingDown) &&
                status.attachment !== attachment,
              () => Effect.void
            )
          ),
        { discard: true }
      )
    }).pipe(Effect.withSpan("KvDcRelay.flush"))

    const service: KvDcRelayService = {
      dcName,
      dcId,
      identity,
      catalogRef: registry.catalogRef,
      catalogNow: registry.catalogNow,
      publicationHubCounts: registry.publicationHubCounts,
      membershipRef,
      loadRef: registry.loadRef,
      engineLoad,
      subscribePool: publication.subscribePool,
      subscribePoolFeed: publication.subscribePoolFeed,
      health: Effect.gen(function* () {
        const statuses = [...slots.values()].map((slot) => slot.status)
        const sources = { ...NO_SOURCES }
        for (const status of statuses) {
          const subscriber = status.subscriber
          if (subscriber === undefined) continue
          countSources((yield* subscriber.health).expected, sources)
        }
        return relayHealth(statuses, shuttingDown, sources, yield* discovery.status)
      }),
      stats,
      diagnosticSnapshot,
      queryWorkers,
      queryWorkersNow,
      sourceRanks,
      flush,
      shutdown
    }
    yield* Effect.logInfo("KV DC Relay host started").pipe(
      Effect.annotateLogs({
        dcName,
        dcId: dcId.toString(),
        drtInstanceId: String(identity.drtInstanceId),
        relayIncarnation: String(identity.relayIncarnation),
        discovery: discovery.backend
      })
    )
    return service
  }).pipe(Effect.annotateLogs({ component: "relay-host" }))

/**
 * `/v1/stats` members: the device counts (`blocks`), with each member's host and disk blocks; a
 * member holding blocks on a lower tier only is listed too, with `blocks: 0` (PROTOCOL §5.1 ◆3).
 */
const membersWithTiers = (stats: ActorStats): EndpointAggregationStats["members"] => {
  const tiers = new Map(stats.tierCounts.map((m) => [memberKey(m.workerId, m.dpRank), m]))
  const out = stats.members.map((m) => {
    const tier = tiers.get(memberKey(m.workerId, m.dpRank))
    tiers.delete(memberKey(m.workerId, m.dpRank))
    return {
      workerId: m.workerId,
      dpRank: m.dpRank,
      blocks: m.count,
      hostBlocks: tier?.hostBlocks ?? 0,
      diskBlocks: tier?.diskBlocks ?? 0
    }
  })
  if (tiers.size === 0) return out
  for (const m of tiers.values())
    out.push({
      workerId: m.workerId,
      dpRank: m.dpRank,
      blocks: 0,
      hostBlocks: m.hostBlocks,
      diskBlocks: m.diskBlocks
    })
  return out.sort(compareMembers)
}

const optionValue = <A>(option: { readonly _tag: "Some"; readonly value: A } | { readonly _tag: "None" }) =>
  option._tag === "Some" ? option.value : undefined

/** `KvDcRelay::start`. */
export const start = make

/** The relay service, built from `config` over the `Discovery` in context. */
export const layer = (config: RelayHostConfig): Layer.Layer<KvDcRelay, InvalidRelayConfig, Discovery> =>
  Layer.scoped(KvDcRelay, make(config))
