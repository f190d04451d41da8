/**
 * Real relays for the consumer's integration tests: for each DC name, a `KvDcRelayService` made
 * of the real `PoolRegistry` and `PublicationSource` (pools attached directly, events admitted to
 * their actors), served by the real `RelayHttpServer` on 127.0.0.1. Only discovery is absent.
 */

import { Effect, Either, Exit, Random, Ref, Scope, SubscriptionRef } from "effect"
import { type DcId, type IndexerDomainId, PoolId } from "../../src/ckf/identity.js"
import { type DcMembershipView, emptyMembershipView } from "../../src/discovery/Membership.js"
import { clearedEvent, removedEvent, storedEvent } from "../../src/protocol/Events.js"
import { stableDcId } from "../../src/protocol/Identity.js"
import {
  baseRegistration,
  canonicalModelId,
  DcRelayIdentity,
  EndpointId,
  KvQuerySemantics,
  modelAlias
} from "../../src/protocol/Model.js"
import * as RelayHttpServer from "../../src/relay/http/RelayHttpServer.js"
import { make as makeRegistry } from "../../src/relay/internal/PoolRegistryLive.js"
import type { KvDcRelayService, RelayHealth } from "../../src/relay/KvDcRelay.js"
import type { PoolAttachment, PoolRegistry } from "../../src/relay/PoolRegistry.js"
import type { PublicationHubConfig } from "../../src/relay/PublicationHub.js"
import * as PublicationSource from "../../src/relay/PublicationSource.js"
import { UnknownEndpoint } from "../../src/relay/RelayErrors.js"

export const KV_BLOCK_SIZE = 16

export interface DcRelayOptions {
  /** 0 = ephemeral; a restart passes the previous port. */
  readonly port?: number
  readonly incarnation?: bigint
  readonly expectedUniqueBlocks?: number
  readonly publication?: Partial<PublicationHubConfig>
  readonly intervals?: Partial<RelayHttpServer.RelayHttpIntervals>
  /** HTTPS (and mutual TLS with a client CA). */
  readonly tls?: RelayHttpServer.RelayHttpOptions["tls"]
  /** A token file the server requires bearer tokens from. */
  readonly auth?: RelayHttpServer.RelayHttpOptions["auth"]
}

/** One attached pool and its workers' event streams (dense event ids per worker rank). */
export class RelayPool {
  private readonly nextEventId = new Map<string, number>()

  constructor(readonly attachment: PoolAttachment) {}

  private eventId(worker: string): number {
    const id = (this.nextEventId.get(worker) ?? 0) + 1
    this.nextEventId.set(worker, id)
    return id
  }

  /** One stored event of `hashes` by `worker` (rank 0), published at once. */
  store(worker: string, hashes: ReadonlyArray<bigint>): Effect.Effect<void> {
    return Effect.suspend(() =>
      this.attachment.actor.admitEvent(0, storedEvent(worker, 0, this.eventId(worker), hashes))
    ).pipe(Effect.zipRight(this.attachment.actor.flush), Effect.orDie)
  }

  remove(worker: string, hashes: ReadonlyArray<bigint>): Effect.Effect<void> {
    return Effect.suspend(() =>
      this.attachment.actor.admitEvent(0, removedEvent(worker, 0, this.eventId(worker), hashes))
    ).pipe(Effect.zipRight(this.attachment.actor.flush), Effect.orDie)
  }

  /** The rank clears every block it held. */
  clear(worker: string): Effect.Effect<void> {
    return Effect.suspend(() =>
      this.attachment.actor.admitEvent(0, clearedEvent(worker, 0, this.eventId(worker)))
    ).pipe(Effect.zipRight(this.attachment.actor.flush), Effect.orDie)
  }

  /** The producer's exact words, `[lo, hi]` per bucket. */
  get words(): Effect.Effect<Uint32Array> {
    return Effect.map(Effect.orDie(this.attachment.actor.snapshot), (snapshot) => snapshot.words)
  }
}

export interface DcRelay {
  readonly dcName: string
  readonly dcId: DcId
  readonly url: string
  readonly port: number
  readonly incarnation: bigint
  readonly registry: PoolRegistry
  readonly service: KvDcRelayService
  /** Attaches a pool of `domain` for `endpointText` registering `model` (alias `chat`). */
  readonly attach: (domain: IndexerDomainId, endpointText: string, model?: string) => Effect.Effect<RelayPool>
}

/** A relay for DC `dcName` served on 127.0.0.1 until the scope closes. */
export const startDcRelay = (dcName: string, options: DcRelayOptions = {}) =>
  Effect.gen(function* () {
    const dcId = stableDcId(dcName)
    const incarnation =
      options.incarnation ?? BigInt(yield* Random.nextIntBetween(1, 0x7fff_ffff)) * 0x1_0000_0001n
    const relayIdentity = new DcRelayIdentity({ drtInstanceId: 77n, relayIncarnation: incarnation })
    const registry = yield* makeRegistry({
      relayIdentity,
      actorConfig: {
        expectedUniqueBlocks: options.expectedUniqueBlocks ?? 1024,
        publicationThreshold: 1,
        publicationDelay: "1 millis"
      },
      publication: options.publication
    })
    const source = yield* PublicationSource.make(registry)
    const membershipRef = yield* SubscriptionRef.make<DcMembershipView>(emptyMembershipView)
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
    const service: KvDcRelayService = {
      dcName,
      dcId,
      identity: relayIdentity,
      catalogRef: registry.catalogRef,
      catalogNow: registry.catalogNow,
      publicationHubCounts: registry.publicationHubCounts,
      membershipRef,
      loadRef: registry.loadRef,
      subscribePool: source.subscribePool,
      subscribePoolFeed: source.subscribePoolFeed,
      health: Ref.get(healthRef),
      stats: Effect.succeed({
        identity: { dcName, dcId, drtInstanceId: 77n, relayIncarnation: incarnation },
        endpoints: []
      }),
      diagnosticSnapshot: (endpoint) => Effect.fail(new UnknownEndpoint({ endpoint: endpoint.toString() })),
      queryWorkers: (endpoint) => Effect.fail(new UnknownEndpoint({ endpoint: endpoint.toString() })),
      queryWorkersNow: () => undefined,
      sourceRanks: () => Effect.succeed([]),
      flush: Effect.void,
      shutdown: Effect.zipRight(source.shutdown, registry.shutdown)
    }
    const server = yield* RelayHttpServer.serve(service, {
      host: "127.0.0.1",
      port: options.port ?? 0,
      intervals: { shutdownGrace: "200 millis", ...options.intervals },
      tls: options.tls,
      auth: options.auth
    })
    const attach = (domain: IndexerDomainId, endpointText: string, model = "llama") =>
      Effect.gen(function* () {
        const endpoint = Either.getOrThrow(EndpointId.parse(endpointText))
        const attachment = yield* Effect.orDie(
          registry.attach({
            poolId: new PoolId(domain, dcId),
            endpoint,
            registrations: [baseRegistration(canonicalModelId(model), [modelAlias("chat")])],
            querySemantics: new KvQuerySemantics({
              kvBlockSize: KV_BLOCK_SIZE,
              hashFormat: "dynamo_standard_v1"
            }),
            roles: ["aggregated"]
          })
        )
        return new RelayPool(attachment)
      })
    const relay: DcRelay = {
      dcName,
      dcId,
      url: server.url,
      port: server.port,
      incarnation,
      registry,
      service,
      attach
    }
    return relay
  })

/** A relay in its own scope, so a test can stop it (a crash or restart) while others run. */
export const startStoppableRelay = (dcName: string, options: DcRelayOptions = {}) =>
  Effect.gen(function* () {
    const scope = yield* Scope.make()
    const relay = yield* startDcRelay(dcName, options).pipe(Scope.extend(scope))
    const outer = yield* Effect.scope
    let stopped = false
    const stop = Effect.suspend(() => {
      if (stopped) return Effect.void
      stopped = true
      return Scope.close(scope, Exit.void)
    })
    yield* Scope.addFinalizer(outer, stop)
    return { relay, stop }
  })
