/**
 * A real `KvDcRelayService` for the HTTP tests: the real pool registry and publication source,
 * pools attached directly through the registry, events admitted straight to their actors. Only
 * discovery is replaced (the test sets `membershipRef`), and health is a settable value.
 */

import { Effect, Either, Ref, SubscriptionRef } from "effect"
import { DcId } from "../../../src/ckf/identity.js"
import { type DcMembershipView, emptyMembershipView } from "../../../src/discovery/Membership.js"
import { ProducerIdentityJson } from "../../../src/protocol/Identity.js"
import { encodeJson } from "../../../src/protocol/Json.js"
import { compareEndpointIds, type EndpointId } from "../../../src/protocol/Model.js"
import type { EndpointStats, KvDcRelayService, RelayHealth } from "../../../src/relay/KvDcRelay.js"
import type { PoolAttachment, PoolRegistryOptions } from "../../../src/relay/PoolRegistry.js"
import * as PublicationSource from "../../../src/relay/PublicationSource.js"
import { UnknownEndpoint } from "../../../src/relay/RelayErrors.js"
import { emptyIngest } from "../../../src/relay/SourceSubscriber.js"
import { config, registry as makeRegistry, pool, request } from "../registryFixtures.js"

export interface TestRelayOptions {
  readonly expectedUniqueBlocks?: number
  readonly maxActiveStreams?: number
  readonly registry?: Partial<PoolRegistryOptions>
}

export const DC_NAME = "test-dc"

export const makeTestRelay = (options: TestRelayOptions = {}) =>
  Effect.gen(function* () {
    const registry = yield* makeRegistry({
      actorConfig: { ...config(), expectedUniqueBlocks: options.expectedUniqueBlocks ?? 32 },
      ...options.registry
    })
    const source = yield* PublicationSource.make(registry, { maxActiveStreams: options.maxActiveStreams })
    const membershipRef = yield* SubscriptionRef.make<DcMembershipView>(emptyMembershipView)
    const attachments = new Map<string, PoolAttachment>()
    const healthRef = yield* Ref.make<RelayHealth>({
      healthy: true,
      shuttingDown: false,
      endpointCount: 0,
      activeEndpointCount: 0,
      fencedEndpointCount: 0,
      sourcesRecovering: 0,
      sourcesDegraded: 0,
      sources: { expected: 0, connecting: 0, live: 0, recovering: 0, degraded: 0, rejected: 0 },
      discovery: { state: "live", since: new Date(0) }
    })

    const attachmentOf = (endpoint: EndpointId) => attachments.get(endpoint.toString())

    const endpointStats = (key: string, attachment: PoolAttachment): Effect.Effect<EndpointStats> =>
      Effect.gen(function* () {
        const state = yield* Effect.orDie(attachment.actor.stateStats)
        const diagnostics = yield* attachment.actor.diagnostics
        const depth = yield* attachment.actor.mailboxDepth
        const descriptor = (yield* registry.catalog).descriptor(attachment.poolId)
        return {
          servingEndpoint: descriptor!.servingEndpoint,
          lifecycle: "active",
          layoutGeneration: attachment.layoutGeneration,
          membershipConflicts: [],
          models: attachment.registrations.map((r) => r.model as string),
          aliases: attachment.registrations.flatMap((r) => r.aliases as ReadonlyArray<string>),
          roles: [...attachment.roles],
          aggregation: {
            members: state.members.map((m) => ({
              workerId: m.workerId,
              dpRank: m.dpRank,
              blocks: m.count,
              hostBlocks: 0,
              diskBlocks: 0
            })),
            contributionCount: state.stats.aggregation.contributionCount,
            uniqueBlockCount: state.stats.aggregation.uniqueBlockCount,
            unknownRemovals: state.stats.aggregation.unknownRemovals,
            capacityFailures: state.stats.aggregation.capacityFailures,
            parentNotFound: state.stats.aggregation.parentNotFound,
            unanchoredRemovals: state.stats.aggregation.unanchoredRemovals,
            occupiedBucketCount: state.stats.aggregation.occupiedBucketCount,
            occupiedSlotCount: state.stats.aggregation.occupiedSlotCount
          },
          publication: {
            sequence: state.sequence,
            pendingEvents: state.stats.publication.pendingEvents,
            emittedImages: state.stats.publication.emittedImages,
            publicationCount: diagnostics.publications,
            unchangedPublicationCount: diagnostics.unchangedPublications,
            physicalTouches: state.stats.publication.physicalTouches,
            distinctTouchedBuckets: state.stats.publication.distinctTouchedBuckets,
            netRevertedBuckets: state.stats.publication.netRevertedBuckets
          },
          memory: state.stats.memory,
          tiers: state.tiers,
          recovery: {
            degradedResets: diagnostics.degradedResets,
            rebuildCount: diagnostics.rebuilds,
            rebuildTotalMs: diagnostics.rebuildTotalMs,
            rebuildMaxMs: diagnostics.rebuildMaxMs,
            workerCount: 0,
            rankCount: 0,
            recoveringRankCount: 0,
            pendingLiveEventCount: 0,
            sourcesRecovering: 0,
            sourcesDegraded: 0,
            sources: []
          },
          actor: {
            mailboxDepth: depth,
            mailboxCapacity: attachment.actor.mailboxCapacity,
            activeCommand: diagnostics.activeCommand,
            shuttingDown: diagnostics.shuttingDown,
            lastError: diagnostics.lastError,
            publishDelay: diagnostics.publishDelay
          },
          ingest: { ...emptyIngest, events: diagnostics.appliedEvents },
          sources: []
        } satisfies EndpointStats
      }).pipe(Effect.annotateLogs("endpoint", key))

    const relay: KvDcRelayService = {
      dcName: DC_NAME,
      dcId: new DcId(3n),
      identity: registry.relayIdentity,
      catalogRef: registry.catalogRef,
      catalogNow: registry.catalogNow,
      publicationHubCounts: registry.publicationHubCounts,
      membershipRef,
      loadRef: registry.loadRef,
      subscribePool: source.subscribePool,
      subscribePoolFeed: source.subscribePoolFeed,
      health: Ref.get(healthRef),
      stats: Effect.gen(function* () {
        const endpoints: Array<EndpointStats> = []
        for (const [key, attachment] of attachments) endpoints.push(yield* endpointStats(key, attachment))
        endpoints.sort((a, b) => compareEndpointIds(a.servingEndpoint, b.servingEndpoint))
        return {
          identity: {
            dcName: DC_NAME,
            dcId: new DcId(3n),
            drtInstanceId: registry.relayIdentity.drtInstanceId,
            relayIncarnation: registry.relayIdentity.relayIncarnation
          },
          endpoints
        }
      }),
      queryWorkers: (endpoint, hashes) =>
        Effect.gen(function* () {
          const attachment = attachmentOf(endpoint)
          if (attachment === undefined)
            return yield* Effect.fail(new UnknownEndpoint({ endpoint: endpoint.toString() }))
          const result = yield* attachment.actor.queryWorkers({ hashes, count: hashes.length >>> 1 })
          return { servingEndpoint: endpoint, result }
        }),
      queryWorkersNow: (endpoint, hashes) => {
        const result = attachmentOf(endpoint)?.actor.queryWorkersNow({ hashes, count: hashes.length >>> 1 })
        return result === undefined ? undefined : { servingEndpoint: endpoint, result }
      },
      sourceRanks: () => Effect.succeed([]),
      diagnosticSnapshot: (endpoint) =>
        Effect.gen(function* () {
          const attachment = attachmentOf(endpoint)
          if (attachment === undefined)
            return yield* Effect.fail(new UnknownEndpoint({ endpoint: endpoint.toString() }))
          const snapshot = yield* attachment.actor.snapshot
          return {
            servingEndpoint: endpoint,
            layoutGeneration: attachment.layoutGeneration,
            sequence: snapshot.sequence,
            memberCount: snapshot.stats.aggregation.memberCount,
            uniqueBlockCount: snapshot.stats.aggregation.uniqueBlockCount,
            producer: snapshot.identity,
            words: snapshot.words
          }
        }),
      flush: Effect.gen(function* () {
        for (const attachment of attachments.values()) yield* attachment.actor.flush
      }),
      shutdown: Effect.zipRight(source.shutdown, registry.shutdown)
    }

    /** Attaches `pool(seed)` for `endpointText` serving `model`. */
    const attach = (seed: number, endpointText: string, model = "llama") =>
      Effect.gen(function* () {
        const attachment = yield* Effect.orDie(registry.attach(request(pool(seed), endpointText, model)))
        attachments.set(endpointText, attachment)
        return attachment
      })

    return { relay, registry, source, membershipRef, healthRef, attachments, attach }
  })

export type TestRelay = Effect.Effect.Success<ReturnType<typeof makeTestRelay>>

const encodeProducer = encodeJson(ProducerIdentityJson)
export const producerJson = (attachment: PoolAttachment): unknown =>
  Either.getOrThrow(encodeProducer(attachment.identity))
