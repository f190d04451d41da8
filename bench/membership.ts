/**
 * Discovery churn: 1,000 serving endpoints × 8 workers. Measures the time from one discovery
 * change to the new membership view and KV source views on the incremental path (the
 * `MembershipProjector` rebuilds only changed endpoints; every endpoint's source coordinator sees
 * the new snapshot and takes its unchanged fast path unless its inputs changed), against a full
 * re-projection of the same views in the same run (`projectMembership` plus fresh coordinators).
 */

import { performance } from "node:perf_hooks"
import { Either } from "effect"
import type { DiscoverySnapshot } from "../src/discovery/Discovery.js"
import { WATCH_ALL } from "../src/discovery/DiscoveryConfig.js"
import { KvSourceCoordinatorState } from "../src/discovery/KvSourceCoordinator.js"
import type { DcMembershipView } from "../src/discovery/Membership.js"
import { MembershipProjector, projectMembership } from "../src/discovery/MembershipProjection.js"
import type { KvEventSource } from "../src/protocol/Discovery.js"
import {
  KvEventSourceJson,
  type ModelCardInstance,
  ModelCardInstanceJson
} from "../src/protocol/Discovery.js"
import { decodeJson } from "../src/protocol/Json.js"
import { type BenchContext, percentile, record } from "./harness.js"

const WORKERS = 8
const decodeCard = decodeJson(ModelCardInstanceJson)
const decodeSource = decodeJson(KvEventSourceJson)

const makeCard = (endpoint: number, worker: number, totalKvBlocks: number): ModelCardInstance =>
  Either.getOrThrowWith(
    decodeCard({
      namespace: "prod",
      component: `pool${endpoint}`,
      endpoint: "generate",
      instanceId: String(endpoint * WORKERS + worker + 1),
      modelSuffix: null,
      card: {
        name: `model-${endpoint}`,
        sourcePath: `org/model-${endpoint}`,
        kvCacheBlockSize: 64,
        aliases: [`alias-${endpoint}`],
        workerType: "aggregated",
        runtimeConfig: { dataParallelSize: 1, totalKvBlocks: String(totalKvBlocks) }
      }
    }),
    (e) => new Error(e.message)
  )

const makeSource = (endpoint: number, worker: number, publisher: number): KvEventSource =>
  Either.getOrThrowWith(
    decodeSource({
      kvStateEndpoint: `prod.pool${endpoint}.generate`,
      workerId: String(endpoint * WORKERS + worker + 1),
      dpRank: 0,
      publisherId: String(publisher),
      transport: {
        kind: "dynamo-zmq",
        endpoint: `tcp://10.0.${endpoint % 250}.${worker}:5557`,
        topic: "kv-events"
      },
      recoveryTarget: { endpoint: `tcp://10.0.${endpoint % 250}.${worker}:5600` }
    }),
    (e) => new Error(e.message)
  )

const snapshotOf = (
  revision: number,
  cards: ReadonlyArray<ModelCardInstance>,
  sources: ReadonlyArray<KvEventSource>
): DiscoverySnapshot => ({
  revision: BigInt(revision),
  cards,
  sources,
  rejectedSources: [],
  sourceStream: { epoch: 0, bound: true }
})

/** Source views of every endpoint from scratch: what a full re-projection has to redo. */
const fullSourceViews = (view: DcMembershipView, snapshot: DiscoverySnapshot): number => {
  let ranks = 0
  for (const membership of view.endpoints.values()) {
    const state = new KvSourceCoordinatorState(membership.endpoint)
    ranks += state.reconcile(membership.runtimeConfigs, snapshot).view.ranks.size
  }
  return ranks
}

const median = (sorted: ReadonlyArray<number>): number => percentile(sorted, 50)

export const benchMembershipChurn = async (ctx: BenchContext): Promise<void> => {
  const endpoints = ctx.quick ? 250 : 1000
  const changes = ctx.quick ? 40 : 200
  const fullRounds = ctx.quick ? 3 : 10
  const cards: Array<ModelCardInstance> = []
  const sources: Array<KvEventSource> = []
  for (let e = 0; e < endpoints; e++) {
    for (let w = 0; w < WORKERS; w++) {
      cards.push(makeCard(e, w, 1000))
      sources.push(makeSource(e, w, e * WORKERS + w + 1_000_000))
    }
  }
  let revision = 1
  let snapshot = snapshotOf(revision, cards, sources)

  // Prime the incremental path: the projector and one coordinator per endpoint.
  const projector = new MembershipProjector(WATCH_ALL)
  const primeStart = performance.now()
  const primed = projector.apply(cards)
  const coordinators = new Map<string, KvSourceCoordinatorState>()
  for (const membership of primed.view.endpoints.values()) {
    const state = new KvSourceCoordinatorState(membership.endpoint)
    state.reconcile(membership.runtimeConfigs, snapshot)
    coordinators.set(membership.key, state)
  }
  const primeMs = performance.now() - primeStart

  const incrementalStep = (next: DiscoverySnapshot): number => {
    const update = projector.apply(next.cards)
    let changedViews = 0
    for (const [key, state] of coordinators) {
      const membership = update.view.endpoints.get(key)!
      if (state.reconcile(membership.runtimeConfigs, next).changed) changedViews++
    }
    return update.changed.length + changedViews
  }

  // 1. Card churn: one worker's runtime config changes per discovery change.
  const cardTimes: Array<number> = []
  const current = [...cards]
  for (let i = 0; i < changes; i++) {
    const e = (i * 7919) % endpoints
    const w = i % WORKERS
    current[e * WORKERS + w] = makeCard(e, w, 1000 + i + 1)
    const next = snapshotOf(++revision, [...current], sources)
    const start = performance.now()
    const touched = incrementalStep(next)
    cardTimes.push(performance.now() - start)
    if (touched !== 2)
      throw new Error(`expected one membership and one source view to change, got ${touched}`)
    snapshot = next
  }

  // 2. Source churn: one rank's publisher incarnation is replaced per discovery change.
  const sourceTimes: Array<number> = []
  const currentSources = [...sources]
  for (let i = 0; i < changes; i++) {
    const e = (i * 104729) % endpoints
    const w = (i * 3) % WORKERS
    currentSources[e * WORKERS + w] = makeSource(e, w, 2_000_000 + i)
    const next = snapshotOf(++revision, snapshot.cards, [...currentSources])
    const start = performance.now()
    const touched = incrementalStep(next)
    sourceTimes.push(performance.now() - start)
    if (touched !== 1) throw new Error(`expected one source view to change, got ${touched}`)
    snapshot = next
  }

  // 3. A discovery change that changes nothing (re-list, unrelated key): detection cost only.
  const unchangedTimes: Array<number> = []
  for (let i = 0; i < changes; i++) {
    const next = snapshotOf(++revision, [...snapshot.cards], [...snapshot.sources])
    const start = performance.now()
    const touched = incrementalStep(next)
    unchangedTimes.push(performance.now() - start)
    if (touched !== 0) throw new Error(`expected no change, got ${touched}`)
    snapshot = next
  }

  // Baseline: the same views re-projected from scratch after a change.
  const fullTimes: Array<number> = []
  const projectionOnly: Array<number> = []
  let previous = projector.view
  let nextGeneration = 1_000_000
  for (let i = 0; i < fullRounds; i++) {
    const start = performance.now()
    const projected = projectMembership(snapshot.cards, { scope: WATCH_ALL, previous, nextGeneration })
    const projectedAt = performance.now()
    const ranks = fullSourceViews(projected.view, snapshot)
    fullTimes.push(performance.now() - start)
    projectionOnly.push(projectedAt - start)
    if (ranks !== endpoints * WORKERS) throw new Error(`expected ${endpoints * WORKERS} ranks, got ${ranks}`)
    previous = projected.view
    nextGeneration = projected.nextGeneration
  }

  for (const list of [cardTimes, sourceTimes, unchangedTimes, fullTimes, projectionOnly])
    list.sort((a, b) => a - b)
  const full = median(fullTimes)
  const scale = `${endpoints}x${WORKERS}`
  ctx.log(`membership churn: ${endpoints} endpoints x ${WORKERS} workers, ${changes} changes per kind`)
  record(ctx, "membership_initial_projection", "ms", primeMs, null, `${scale}, projector + coordinators`)
  record(
    ctx,
    "membership_full_reprojection",
    "ms",
    full,
    null,
    `${scale}, projection ${median(projectionOnly).toFixed(1)} ms + source views`
  )
  record(
    ctx,
    "membership_card_change",
    "ms",
    median(cardTimes),
    full,
    `p99 ${percentile(cardTimes, 99).toFixed(3)} ms; vs full`,
    true
  )
  record(
    ctx,
    "membership_source_change",
    "ms",
    median(sourceTimes),
    full,
    `p99 ${percentile(sourceTimes, 99).toFixed(3)} ms; vs full`,
    true
  )
  record(
    ctx,
    "membership_unchanged_detect",
    "ms",
    median(unchangedTimes),
    full,
    `p99 ${percentile(unchangedTimes, 99).toFixed(3)} ms; vs full`,
    true
  )
}
