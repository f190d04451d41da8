/**
 * The subscription supervisor of one active pool generation (the seed's `start_target_subscriber`,
 * recovery-events.md §3.7): a `SourceSupervisor` over the generation's recovery target, fed by an
 * `EventSubscriberPool` holding one subscription per active source of the endpoint's KV-state
 * endpoint.
 *
 * Order matters the way it does in `subscriber.rs`: the subscriptions are opened first and the
 * supervisor is synced only afterwards, so live events are already being buffered by the time
 * the initial restores start. Over ZeroMQ a subscription "exists" once its socket completed the
 * handshake, so the supervisor is synced with `syncMembershipWithReadySources`: a source whose
 * socket is not connected yet stays inactive until it is (readiness can only suppress a source,
 * never introduce one). Connection state is polled on `Clock`: from 20 ms, doubling, while some
 * source is still connecting, every 250 ms once all are. A source that was ready and lost its connection is fenced
 * (`fenceTransport`: deactivated and reset, since messages may have been lost) and reactivates,
 * with a fresh restore, once its socket is back.
 *
 * A membership change re-syncs; a change of the resolved KV-state endpoint rebinds (the pool
 * swaps its subscriptions for the new endpoint's sources; the coordinator already bumped every
 * rank's lifecycle, so the supervisor resets them). An ambiguous mapping disables KV handling
 * until the membership changes.
 */

import { Clock, Duration, Effect, ExecutionStrategy, Exit, Scope, Stream } from "effect"
import { loopStep, supervised } from "../observability/Supervised.js"
import {
  activeSource,
  isRecoverableSource,
  type KvEventSource,
  type KvSourceMembershipView,
  type RankKey,
  rankKey,
  sourceIdentityKey
} from "../protocol/Discovery.js"
import type { EndpointId } from "../protocol/Model.js"
import type { KvEventTransport } from "../recovery/EventTransport.js"
import type { RecoveryTarget } from "../recovery/RecoveryTarget.js"
import * as SourceSupervisor from "../recovery/SourceSupervisor.js"
import * as SourceSupervisorLive from "../recovery/SourceSupervisorLive.js"
import type { WorkerQueryTransport } from "../recovery/WorkerQuery.js"
import type { EndpointIngestStats, ExpectedSourceState } from "./KvDcRelay.js"

/** Readiness poll while some source's socket is still connecting. */
const CONNECTING_POLL: Duration.Duration = Duration.millis(20)
/** Readiness poll once every source is connected (detects transport discontinuities). */
const STEADY_POLL: Duration.Duration = Duration.millis(250)
/**
 * How long the first recovery wave waits for a source's socket. A rank still unconnected then is
 * released from the wave (`completeInitialRecovery`), so one unreachable publisher does not hold
 * the other ranks' first rebuild until the wave's deadline; it restores on its own once it connects.
 */
const INITIAL_CONNECT_GRACE: Duration.Duration = Duration.seconds(2)
/** How long a new source's first restore may run before its `recovering` state is logged. */
const RECOVERING_WARN_AFTER: Duration.Duration = Duration.seconds(2)
/** How long a source may stay `connecting` before it is logged (PROTOCOL §5 ◆3). */
const CONNECTING_WARN_AFTER: Duration.Duration = Duration.seconds(5)

/** One expected source rank and its state. */
interface ExpectedSource {
  readonly workerId: string
  readonly dpRank: number
  readonly publisherId: bigint
  /** The source's `transport.endpoint`. */
  readonly transportEndpoint: string
  /** The source's `metricsUrl` (PROTOCOL §2 ◆3), when it has one. */
  readonly metricsUrl: string | undefined
  readonly state: ExpectedSourceState
  /** `Clock` milliseconds since the source is in `state`. */
  readonly since: number
  /** Why it is connecting, degraded or rejected, where known. */
  readonly reason: string | undefined
}

/** The supervisor's health plus every expected source's state. */
interface SourceSubscriberHealth extends SourceSupervisor.SourceSupervisorHealth {
  readonly expected: ReadonlyArray<ExpectedSource>
}

/** The endpoint's source view as the KV source coordinator publishes it. */
interface SourceViewWatch {
  readonly current: Effect.Effect<KvSourceMembershipView>
  /** The current view, then every changed view. */
  readonly changes: Stream.Stream<KvSourceMembershipView>
}

interface SourceSubscriberOptions {
  readonly servingEndpoint: EndpointId
  readonly target: RecoveryTarget
  readonly sources: SourceViewWatch
  /** Relay-wide limit of in-flight worker queries. */
  readonly recoverySemaphore: Effect.Semaphore
  readonly recoveryAttemptTimeout: Duration.DurationInput
  /** Live subscriptions and recovery queries of the endpoint's sources. */
  readonly eventTransport: KvEventTransport
  /** The pool's `kvCacheBlockSize`, checked against every engine `BlockStored` (PROTOCOL §3.2). */
  readonly kvBlockSize?: number | undefined
  readonly connectingPoll?: Duration.DurationInput | undefined
  readonly steadyPoll?: Duration.DurationInput | undefined
  readonly initialConnectGrace?: Duration.DurationInput | undefined
}

/** One serving endpoint's subscriptions to its ranks' event sources, with their supervisor. */
export interface SourceSubscriber {
  readonly supervisor: SourceSupervisor.SourceSupervisor
  readonly health: Effect.Effect<SourceSubscriberHealth>
  /** Cumulative over this generation; frozen at shutdown. */
  readonly ingest: Effect.Effect<EndpointIngestStats>
  /** Closes the subscriptions, then shuts the supervisor down (every rank reset). Idempotent. */
  readonly shutdown: Effect.Effect<void>
}

/** Ingest counters with nothing counted. */
export const emptyIngest: EndpointIngestStats = {
  events: 0,
  blocks: 0,
  malformed: 0,
  gaps: 0,
  recoveries: 0,
  malformedByReason: {},
  skipped: { medium: 0, locality: 0, ownership: 0, group: 0, namespace: 0 },
  stale: 0,
  restarts: 0,
  unanchored: 0
}

const addByReason = <K extends string>(
  a: Readonly<Partial<Record<K, number>>>,
  b: Readonly<Partial<Record<K, number>>>
): Partial<Record<K, number>> => {
  const out: Partial<Record<K, number>> = { ...a }
  for (const key of Object.keys(b) as Array<K>) out[key] = (out[key] ?? 0) + (b[key] ?? 0)
  return out
}

/** The sum of two sets of ingest counters. */
export const addIngest = (a: EndpointIngestStats, b: EndpointIngestStats): EndpointIngestStats => ({
  events: a.events + b.events,
  blocks: a.blocks + b.blocks,
  malformed: a.malformed + b.malformed,
  gaps: a.gaps + b.gaps,
  recoveries: a.recoveries + b.recoveries,
  malformedByReason: addByReason(a.malformedByReason, b.malformedByReason),
  skipped: {
    medium: a.skipped.medium + b.skipped.medium,
    locality: a.skipped.locality + b.skipped.locality,
    ownership: a.skipped.ownership + b.skipped.ownership,
    group: a.skipped.group + b.skipped.group,
    namespace: a.skipped.namespace + b.skipped.namespace
  },
  stale: a.stale + b.stale,
  restarts: a.restarts + b.restarts,
  unanchored: a.unanchored + b.unanchored
})

/** Only the reasons that occurred, so diagnostics list what happened. */
const nonZero = <K extends string>(
  counts: Readonly<Record<K, number>> | undefined
): Partial<Record<K, number>> => {
  const out: Partial<Record<K, number>> = {}
  if (counts === undefined) return out
  for (const key of Object.keys(counts) as Array<K>) if (counts[key] > 0) out[key] = counts[key]
  return out
}

const sameSet = (a: ReadonlySet<string>, b: ReadonlySet<string>): boolean => {
  if (a.size !== b.size) return false
  for (const key of a) if (!b.has(key)) return false
  return true
}

interface DesiredSource {
  readonly source: KvEventSource
  readonly rank: RankKey
  readonly readyKey: string
}

/** Starts the subscriber in the current scope and returns once the first sync ran. */
export const make = (options: SourceSubscriberOptions): Effect.Effect<SourceSubscriber, never, Scope.Scope> =>
  Effect.gen(function* () {
    // Its own scope, so `shutdown` can close it before the caller's scope does.
    const scope = yield* Scope.fork(yield* Effect.scope, ExecutionStrategy.sequential)
    const kvBlockSize = options.kvBlockSize
    const baseQuery = options.eventTransport.query
    const query: WorkerQueryTransport =
      kvBlockSize === undefined
        ? baseQuery
        : { queryWorker: (source, request) => baseQuery.queryWorker(source, request, { kvBlockSize }) }
    const supervisor = yield* SourceSupervisorLive.make({
      target: options.target,
      transport: query,
      membership: options.sources.current,
      recoverySemaphore: options.recoverySemaphore,
      recoveryAttemptTimeout: options.recoveryAttemptTimeout
    }).pipe(Scope.extend(scope))
    // Made after the supervisor, so it closes first: no batch reaches a shut-down supervisor.
    const pool = yield* options.eventTransport
      .subscribe(supervisor.handleLiveBatchNow, { kvBlockSize })
      .pipe(Scope.extend(scope))
    const connectingPoll = Duration.decode(options.connectingPoll ?? CONNECTING_POLL)
    const steadyPoll = Duration.decode(options.steadyPoll ?? STEADY_POLL)
    const lock = yield* Effect.makeSemaphore(1)

    let closed = false
    let bound: string | undefined
    /** The sources the last reconcile expected (the view's active sources under a resolved endpoint). */
    let expectedSources: ReadonlyArray<DesiredSource> = []
    let lastView: KvSourceMembershipView | undefined
    let lastReady: ReadonlySet<string> = new Set()
    /** Publisher → ready key of every source that was active and connected at the last sync. */
    let readyPublishers = new Map<bigint, string>()
    let allConnected = false
    /** Grows while some source stays unconnected, so a dead publisher is not polled hot. */
    let connectingDelay = connectingPoll
    /** Recoverable ranks of the first sync whose socket has not connected yet. */
    let initialWaiting: Map<RankKey, { readonly workerId: string; readonly dpRank: number }> | undefined

    const ingestNow = Effect.gen(function* () {
      const totals = yield* pool.totals
      const counters = yield* supervisor.counters
      return {
        events: totals.events,
        blocks: totals.blocks,
        malformed: totals.malformedTotal,
        gaps: counters.liveGaps,
        recoveries: counters.recoveries,
        malformedByReason: nonZero(totals.malformed),
        skipped: totals.skipped ?? emptyIngest.skipped,
        stale: totals.stale ?? 0,
        restarts: counters.restarts,
        // The pool counts unanchored blocks; the host adds them from the actor's stats.
        unanchored: 0
      } satisfies EndpointIngestStats
    })
    let finalIngest: EndpointIngestStats | undefined

    const reconcile: Effect.Effect<void> = lock.withPermits(1)(
      Effect.gen(function* () {
        if (closed) return
        const view = yield* options.sources.current
        const resolution = view.endpointResolution
        const endpoint = resolution._tag === "Resolved" ? resolution.endpoint.toString() : undefined
        if (endpoint !== bound) {
          if (lastView !== undefined) {
            yield* Effect.logInfo("KV-state endpoint mapping changed; rebinding event subscriptions").pipe(
              Effect.annotateLogs({ from: bound ?? "none", to: endpoint ?? "ambiguous" })
            )
          }
          bound = endpoint
        }
        const desired: Array<DesiredSource> = []
        if (endpoint !== undefined) {
          for (const rank of view.ranks.values()) {
            const source = activeSource(rank.status)
            if (source === undefined) continue
            desired.push({
              source,
              rank: rankKey(rank.workerId, rank.dpRank),
              readyKey: SourceSupervisor.readySourceKey(source.publisherId, rank.lifecycleGeneration)
            })
          }
        }
        // NOTE: subscriptions first, the supervisor sync second: live events must already be
        // buffering when the initial restores start.
        if (view !== lastView) {
          yield* pool.sync(desired.map((d) => d.source))
          connectingDelay = connectingPoll
        }
        if (initialWaiting === undefined) {
          initialWaiting = new Map()
          for (const { source } of desired) {
            if (isRecoverableSource(source)) {
              initialWaiting.set(rankKey(source.workerId, source.dpRank), {
                workerId: source.workerId,
                dpRank: source.dpRank
              })
            }
          }
        }
        expectedSources = desired
        const connected = new Set((yield* pool.connectedSources).map(sourceIdentityKey))
        const ready = new Set<string>()
        const desiredKeys = new Set<string>()
        const readyNow = new Map<bigint, string>()
        for (const { source, rank, readyKey } of desired) {
          desiredKeys.add(readyKey)
          if (!connected.has(sourceIdentityKey(source))) continue
          ready.add(readyKey)
          readyNow.set(source.publisherId, readyKey)
          initialWaiting.delete(rank)
        }
        let fenced = false
        for (const [publisherId, readyKey] of readyPublishers) {
          // Still the same advertised incarnation, but its socket dropped: what it sent meanwhile
          // may be lost, so reset now and restore once it is connected again.
          if (ready.has(readyKey) || !desiredKeys.has(readyKey)) continue
          if (yield* supervisor.fenceTransport(publisherId)) {
            fenced = true
            yield* Effect.logWarning(
              "KV event source lost its connection; rank fenced until it reconnects"
            ).pipe(Effect.annotateLogs({ publisherId: String(publisherId) }))
          }
        }
        readyPublishers = readyNow
        allConnected = ready.size === desired.length
        if (fenced || view !== lastView || !sameSet(ready, lastReady)) {
          yield* supervisor.syncMembershipWithReadySources(ready)
        }
        lastView = view
        lastReady = ready
      })
    )

    const releaseUnconnected = lock.withPermits(1)(
      Effect.gen(function* () {
        const waiting = initialWaiting
        initialWaiting = new Map()
        if (closed || waiting === undefined || waiting.size === 0) return
        yield* Effect.logWarning(
          "KV event sources still unconnected; releasing them from the initial recovery wave"
        ).pipe(Effect.annotateLogs({ ranks: [...waiting.keys()].join(",") }))
        for (const { workerId, dpRank } of waiting.values()) {
          yield* options.target.completeInitialRecovery(workerId, dpRank)
        }
      })
    )

    // Readiness before returning, like `start_target_subscriber`.
    yield* reconcile
    yield* releaseUnconnected.pipe(
      Effect.delay(options.initialConnectGrace ?? INITIAL_CONNECT_GRACE),
      Effect.forkIn(scope)
    )
    // Both loops are supervised: after a defect they reconcile against the current view again.
    yield* options.sources.changes.pipe(
      Stream.runForEach(() => loopStep("relay.source-subscriber").pipe(Effect.zipRight(reconcile))),
      (loop) => supervised("relay.source-subscriber", loop),
      Effect.forkIn(scope)
    )
    /**
     * The state each expected source was last seen in, since when, and whether that was logged.
     * Both `health` and the readiness loop refresh it, so `since` is as fresh as the last look.
     */
    const stateRecords = new Map<string, { state: ExpectedSourceState; since: number; logged: boolean }>()
    const noErrors: ReadonlyMap<string, string> = new Map()

    const expectedNow = (
      health: SourceSupervisor.SourceSupervisorHealth,
      now: number
    ): Effect.Effect<ReadonlyArray<ExpectedSource>> =>
      Effect.gen(function* () {
        const connected = new Set((yield* pool.connectedSources).map(sourceIdentityKey))
        const errors = pool.connectionErrors === undefined ? noErrors : yield* pool.connectionErrors
        const active = new Map<string, SourceSupervisor.SourceStateEntry>()
        for (const entry of health.sources)
          active.set(`${entry.workerId}/${entry.dpRank}/${entry.publisherId}`, entry)
        const rejected = new Map<string, SourceSupervisor.RejectedSourceEntry>()
        for (const entry of health.rejected)
          rejected.set(`${entry.workerId}/${entry.dpRank}/${entry.publisherId}`, entry)
        const out: Array<ExpectedSource> = []
        const seen = new Set<string>()
        for (const { source } of expectedSources) {
          const key = `${source.workerId}/${source.dpRank}/${source.publisherId}`
          seen.add(key)
          let state: ExpectedSourceState
          let reason: string | undefined
          const rejection = rejected.get(key)
          const entry = active.get(key)
          if (rejection !== undefined) {
            state = "rejected"
            reason = rejection.reason
          } else if (entry !== undefined && connected.has(sourceIdentityKey(source))) {
            state = entry.state
            reason = entry.reason
          } else {
            state = "connecting"
            reason = errors.get(sourceIdentityKey(source)) ?? "no connection to the publisher yet"
          }
          let record = stateRecords.get(key)
          if (record === undefined || record.state !== state) {
            record = { state, since: now, logged: false }
            stateRecords.set(key, record)
          }
          out.push({
            workerId: source.workerId,
            dpRank: source.dpRank,
            publisherId: source.publisherId,
            transportEndpoint: source.transport.endpoint,
            metricsUrl: source.metricsUrl ?? undefined,
            state,
            since: record.since,
            reason
          })
        }
        for (const key of stateRecords.keys()) if (!seen.has(key)) stateRecords.delete(key)
        return out
      })

    const health: Effect.Effect<SourceSubscriberHealth> = Effect.gen(function* () {
      const supervisorHealth = yield* supervisor.healthSnapshot
      const now = yield* Clock.currentTimeMillis
      return { ...supervisorHealth, expected: yield* expectedNow(supervisorHealth, now) }
    })

    /**
     * Logs each expected source's state once per change (PROTOCOL §3.2, §5 ◆3): `live` at INFO;
     * `degraded` and `rejected` at WARN at once; `recovering` at WARN at once when a live source
     * starts recovering, and a new source's first restore only once it has lasted
     * `RECOVERING_WARN_AFTER`; `connecting` at WARN once it has lasted `CONNECTING_WARN_AFTER`.
     */
    const previousStates = new Map<string, ExpectedSourceState>()
    const reportStates = Effect.gen(function* () {
      const now = yield* Clock.currentTimeMillis
      const { expected } = yield* health
      const seen = new Set<string>()
      for (const source of expected) {
        const key = `${source.workerId}/${source.dpRank}/${source.publisherId}`
        seen.add(key)
        const record = stateRecords.get(key)
        if (record === undefined || record.logged) continue
        const previous = previousStates.get(key)
        const lasted = now - record.since
        let due: boolean
        switch (source.state) {
          case "live":
          case "degraded":
          case "rejected":
            due = true
            break
          case "recovering":
            due = previous === "live" || lasted >= Duration.toMillis(RECOVERING_WARN_AFTER)
            break
          case "connecting":
            due = lasted >= Duration.toMillis(CONNECTING_WARN_AFTER)
            break
        }
        if (!due) continue
        record.logged = true
        previousStates.set(key, source.state)
        const annotations = {
          workerId: source.workerId,
          dpRank: source.dpRank,
          publisherId: String(source.publisherId),
          transportEndpoint: source.transportEndpoint,
          state: source.state,
          previous: previous ?? "new",
          ...(source.reason === undefined ? {} : { reason: source.reason })
        }
        const message =
          source.state === "connecting"
            ? `KV event source is still connecting after ${Duration.format(Duration.millis(lasted))}`
            : `KV event source is ${source.state}`
        yield* (source.state === "live" ? Effect.logInfo(message) : Effect.logWarning(message)).pipe(
          Effect.annotateLogs(annotations)
        )
      }
      for (const key of previousStates.keys()) if (!seen.has(key)) previousStates.delete(key)
    })
    yield* Effect.suspend(() => {
      if (allConnected) return Effect.sleep(steadyPoll)
      const delay = connectingDelay
      connectingDelay = Duration.min(Duration.times(connectingDelay, 2), steadyPoll)
      return Effect.sleep(delay)
    }).pipe(
      Effect.zipRight(loopStep("relay.source-readiness")),
      Effect.zipRight(reconcile),
      Effect.zipRight(reportStates),
      Effect.forever,
      (loop) => supervised("relay.source-readiness", loop),
      Effect.forkIn(scope)
    )

    const shutdown = yield* Effect.cached(
      Effect.gen(function* () {
        closed = true
        finalIngest = yield* ingestNow
        yield* Scope.close(scope, Exit.void)
      }).pipe(Effect.uninterruptible, Effect.withSpan("SourceSubscriber.shutdown"))
    )

    return {
      supervisor,
      health,
      ingest: Effect.suspend(() => (finalIngest !== undefined ? Effect.succeed(finalIngest) : ingestNow)),
      shutdown
    } satisfies SourceSubscriber
  }).pipe(Effect.annotateLogs({ component: "source-subscriber", endpoint: String(options.servingEndpoint) }))
