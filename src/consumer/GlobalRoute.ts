/**
 * Routing decisions of the global consumer (PROTOCOL §7.1 ◆3): the candidates of a query are the
 * lanes of the pools that serve it, ready or not, each with its overlap (for a lane the query
 * could probe), its pool's readiness from the relay's readiness stream and its pool's entry of
 * the relay's latest load window; `routing/RouteCost.ts` prices and ranks them.
 *
 * Synchronous, like `overlapNow`: a route answer is a probe of the filters plus a few map
 * lookups, and the HTTP fast path serves it from the request event.
 */

import { Effect } from "effect"
import type { PoolId } from "../ckf/identity.js"
import { fullBlockCount } from "../ckf/tokens.js"
import type { DcPoolDescriptor, EndpointId } from "../protocol/Model.js"

import { DEFAULT_ROUTE_POLICY, type RoutePolicy } from "../protocol/RouteApi.js"
import {
  type CandidateLoad,
  type PoolReadinessState,
  type RouteAnswer,
  type RouteCandidateInput,
  routeDecision
} from "../routing/RouteCost.js"
import type { OverlapError } from "./ConsumerErrors.js"
import type { GlobalConsumerService, LaneStatus } from "./GlobalConsumer.js"
import { hashCount, type LaneProbe, type OverlapRequest, probeLanesOf, registersModel } from "./GlobalView.js"
import type { ReceivedReadiness, RelaySignalsView } from "./RelaySignals.js"

/** A route answer over the consumer's pool ids and serving endpoints (PROTOCOL §7.1 ◆3). */
export type GlobalRouteAnswer = RouteAnswer<PoolId, EndpointId>

/** The process's routing settings: the policy flags and `--relay-penalty` values. */
export interface RoutingSettings {
  readonly policy: RoutePolicy
  /** Tokens by relay name; a relay not listed has none. */
  readonly penalties: ReadonlyMap<string, number>
}

/** The contract's default policy and no relay penalties. */
export const DEFAULT_ROUTING: RoutingSettings = { policy: DEFAULT_ROUTE_POLICY, penalties: new Map() }

/** Per pool descriptor, the canonical models each requested name resolves to (descriptors are immutable). */
const modelsByName = new WeakMap<object, Map<string, ReadonlySet<string>>>()

/** Which registrations of a lane's pool the request names: their canonical models. */
const canonicalModels = (lane: LaneStatus, request: OverlapRequest): ReadonlySet<string> | undefined => {
  if ("poolDomain" in request) return undefined
  let byName = modelsByName.get(lane.descriptor)
  if (byName === undefined) {
    byName = new Map()
    modelsByName.set(lane.descriptor, byName)
  }
  const cached = byName.get(request.model)
  if (cached !== undefined) return cached
  const models = resolveModels(lane, request.model)
  if (byName.size < 64) byName.set(request.model, models)
  return models
}

const resolveModels = (lane: LaneStatus, model: string): ReadonlySet<string> => {
  const models = new Set<string>()
  for (const registration of lane.descriptor.registrations) {
    if (registration.model === model || registration.aliases.some((alias) => alias === model)) {
      models.add(registration.target._tag === "Lora" ? registration.target.baseModel : registration.model)
    }
  }
  return models
}

/**
 * The pool's serving-topology state in the relay's readiness: that of the entry of the requested
 * model (any entry, by pool domain) that lists the pool as a member; READY if any such entry is.
 * Undefined when the relay's readiness is unknown or no entry lists the pool.
 */
export const readinessOfLane = (
  received: ReceivedReadiness | undefined,
  lane: LaneStatus,
  request: OverlapRequest
): PoolReadinessState | undefined => {
  const entries = received?.byPool.get(lane.descriptor.producer.poolId.key)
  if (entries === undefined) return undefined
  const namespace = lane.descriptor.servingEndpoint.namespace
  const models = canonicalModels(lane, request)
  let found: PoolReadinessState | undefined
  for (const entry of entries) {
    if (entry.namespace !== namespace) continue
    if (models !== undefined && !models.has(entry.canonicalModelId)) continue
    if (entry.state === "READY") return "READY"
    found ??= entry.state
  }
  return found
}

/** The candidate's load: its pool's entry of the relay's latest window, aged by the consumer's clock. */
const loadOfLane = (
  signals: RelaySignalsView,
  lane: LaneStatus,
  nowMs: number
): CandidateLoad | undefined => {
  const received = signals.load(lane.relay)
  const entry = received?.pools.get(lane.descriptor.producer.key)
  if (received === undefined || entry === undefined) return undefined
  return {
    runningRequests: entry.runningRequests,
    waitingRequests: entry.waitingRequests,
    kvUsage: entry.kvUsage,
    observedRanks: entry.loadObservedRanks,
    expectedRanks: entry.kvExpectedRanks,
    ageMs: Math.max(0, nowMs - received.receivedAtMs)
  }
}

const candidateOf = (
  signals: RelaySignalsView,
  probe: LaneProbe,
  request: OverlapRequest,
  nowMs: number
): RouteCandidateInput<PoolId, EndpointId> => {
  const { lane, prefixDepth, kvBlockSize, queryBlocks } = probe
  const depth = prefixDepth ?? 0
  return {
    relay: lane.relay,
    lane: lane.lane,
    poolId: lane.descriptor.producer.poolId,
    servingEndpoint: lane.descriptor.servingEndpoint,
    ready: lane.ready && prefixDepth !== undefined,
    readiness: readinessOfLane(signals.readiness(lane.relay), lane, request),
    prefixDepth: depth,
    matchedTokens: depth * kvBlockSize,
    promptTokens: queryBlocks * kvBlockSize,
    overlapKnown: prefixDepth !== undefined,
    load: loadOfLane(signals, lane, nowMs)
  }
}

const poolServes = (pool: DcPoolDescriptor, request: OverlapRequest): boolean => {
  if ("poolDomain" in request) return pool.producer.poolId.indexerDomain.equals(request.poolDomain)
  return pool.servingEndpoint.namespace === request.namespace && registersModel(pool, request.model)
}

/** Full blocks of the query in a pool's semantics, without hashing it. */
const queryBlocksOf = (pool: DcPoolDescriptor, request: OverlapRequest): number => {
  if ("tokens" in request) {
    const semantics = pool.querySemantics
    return fullBlockCount(request.tokens.length, semantics.kvBlockSize, semantics.hashFormat)
  }
  return hashCount("localBlockHashes" in request ? request.localBlockHashes : request.sequenceHashes)
}

/**
 * The pools of relays that went away (their epoch ended, no catalog since) as `NOT_READY`
 * candidates: a relay that went away stays a candidate until its catalog withdraws the pool
 * (PROTOCOL §7.1), which only a catalog of its next epoch can say.
 */
const awayCandidates = (
  consumer: GlobalConsumerService,
  request: OverlapRequest,
  candidates: Array<RouteCandidateInput<PoolId, EndpointId>>
): void => {
  for (const relay of consumer.relays()) {
    if (relay.catalog !== undefined || relay.lastCatalog === undefined) continue
    for (const pool of relay.lastCatalog.pools) {
      if (!poolServes(pool, request)) continue
      const poolKey = pool.producer.poolId.key
      if (candidates.some((c) => c.relay === relay.name && c.poolId.key === poolKey)) continue
      candidates.push({
        relay: relay.name,
        lane: relay.lane,
        poolId: pool.producer.poolId,
        servingEndpoint: pool.servingEndpoint,
        ready: false,
        readiness: undefined,
        prefixDepth: 0,
        matchedTokens: 0,
        promptTokens: queryBlocksOf(pool, request) * pool.querySemantics.kvBlockSize,
        overlapKnown: false,
        load: undefined
      })
    }
  }
}

/** The route answer for `request` (PROTOCOL §7.1), or why the query names nothing known. */
export const routeOf = (
  consumer: GlobalConsumerService,
  request: OverlapRequest,
  policy: RoutePolicy,
  penalties: ReadonlyMap<string, number>,
  nowMs: number
): GlobalRouteAnswer | OverlapError => {
  const probes = probeLanesOf(consumer, request)
  if (!Array.isArray(probes)) return probes as OverlapError

  const signals = consumer.signals
  const candidates: Array<RouteCandidateInput<PoolId, EndpointId>> = (probes as ReadonlyArray<LaneProbe>).map(
    (probe) => candidateOf(signals, probe, request, nowMs)
  )
  awayCandidates(consumer, request, candidates)
  return routeDecision(candidates, policy, penalties)
}

/** Routing decisions over the global consumer's lanes and relay signals (PROTOCOL §7.1 ◆3). */
export interface GlobalRoutingService {
  readonly settings: RoutingSettings
  /** Under the process's settings, or `policy` (already decoded over them) for this request. */
  readonly routeNow: (request: OverlapRequest, policy?: RoutePolicy) => GlobalRouteAnswer | OverlapError
}

/** The routing service over `consumer`, ageing load windows by the Effect clock. */
export const make = (consumer: GlobalConsumerService, settings: RoutingSettings = DEFAULT_ROUTING) =>
  Effect.map(
    Effect.clock,
    (clock): GlobalRoutingService => ({
      settings,
      routeNow: (request, policy) =>
        routeOf(
          consumer,
          request,
          policy ?? settings.policy,
          settings.penalties,
          clock.unsafeCurrentTimeMillis()
        )
    })
  )
