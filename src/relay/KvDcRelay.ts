/**
 * The relay as the rest of the process sees it: what the HTTP API serves and what the CLI starts.
 *
 * CONTRACT between the relay host (`RelayHost.ts`, which implements it) and the HTTP layer
 * (`src/relay/http/RelayHttpServer.ts`, which serves it). Keep these types stable; extend
 * additively.
 */

import { Context, type Effect, type SubscriptionRef } from "effect"
import type { MemberTierCount, TierStats } from "../ckf/canonical.js"
import type { DcId, ProducerIdentity } from "../ckf/identity.js"
import type { WorkerQueryResult } from "../ckf/workerQuery.js"
import type { DiscoveryStatus } from "../discovery/Discovery.js"
import type { DcMembershipView } from "../discovery/Membership.js"
import type { PublishDelaySnapshot } from "../observability/PublishDelay.js"
import type { DpRank, MalformedReason, SkipCounts, WorkerId } from "../protocol/Events.js"
import type { DcRelayIdentity, EndpointId } from "../protocol/Model.js"
import type * as SourceSupervisor from "../recovery/SourceSupervisor.js"
import type { SourceStateEntry } from "../recovery/SourceSupervisor.js"
import type { EngineLoad, SourceMetricsStats } from "./EngineLoad.js"
import type { DcPoolCatalog } from "./PoolCatalog.js"
import type { PoolLoadSnapshot } from "./PoolLoad.js"
import type { PublicationHubCounts } from "./PublicationHub.js"
import type { PublicationSource } from "./PublicationSource.js"
import type { KvDcRelayError } from "./RelayErrors.js"

/**
 * The state of an expected source rank (an advertised source of the pool), PROTOCOL §5 ◆3:
 * `connecting` until its connection to the publisher completed the ZMTP handshake (the endpoint
 * may be wrong, closed or not speaking ZMTP), then the supervisor's `live`, `recovering` or
 * `degraded`, or `rejected` after a protocol fault until its membership generation advances.
 */
export type ExpectedSourceState = "connecting" | SourceSupervisor.SourceState | "rejected"

/** Where a serving endpoint's slot is in its life, as `GET /v1/stats` reports it. */
export type SlotLifecycle = "discovered" | "starting" | "active" | "draining" | "fenced" | "lightweight"

/** Expected source ranks by state, summed over the relay's endpoints (PROTOCOL §5 ◆3). */
export interface SourceCounts {
  readonly expected: number
  readonly connecting: number
  readonly live: number
  readonly recovering: number
  readonly degraded: number
  readonly rejected: number
}

/** One expected source rank in `/v1/stats` (PROTOCOL §5 ◆3). */
export interface SourceStats {
  readonly workerId: WorkerId
  readonly dpRank: DpRank
  readonly publisherId: bigint
  readonly transportEndpoint: string
  readonly state: ExpectedSourceState
  /** Since when the source is in `state` (by the relay's `Clock`). */
  readonly since: Date
  /** `partial` from the moment the relay knows it missed stored events of the rank (§3.3). */
  readonly history: "complete" | "partial"
  readonly reason: string | undefined
  /** The source's engine-metrics reads (PROTOCOL §5 ◆3); undefined without `metricsUrl`. */
  readonly metrics: SourceMetricsStats | undefined
}

/** The relay's `GET /v1/health` answer before encoding. */
export interface RelayHealth {
  readonly healthy: boolean
  readonly shuttingDown: boolean
  readonly endpointCount: number
  readonly activeEndpointCount: number
  readonly fencedEndpointCount: number
  /** Active KV event sources with a restore or gap recovery outstanding (PROTOCOL §3.2). */
  readonly sourcesRecovering: number
  /** Active sources serving without history they could not recover, or fenced pending a reset. */
  readonly sourcesDegraded: number
  /** Every expected source rank by state. */
  readonly sources: SourceCounts
  /** The discovery backend's state; `stale` and `connecting` leave the relay healthy (PROTOCOL §2). */
  readonly discovery: DiscoveryStatus
}

/** An endpoint's ownership aggregation in `/v1/stats` (PROTOCOL §5): members, blocks and event faults. */
export interface EndpointAggregationStats {
  /** `blocks` is the device count; `hostBlocks`, `diskBlocks` the lower tiers' (PROTOCOL §5.1 ◆3). */
  readonly members: ReadonlyArray<{
    readonly workerId: WorkerId
    readonly dpRank: DpRank
    readonly blocks: number
    readonly hostBlocks: number
    readonly diskBlocks: number
  }>
  readonly contributionCount: number
  readonly uniqueBlockCount: number
  readonly unknownRemovals: number
  readonly capacityFailures: number
  readonly parentNotFound: number
  /** Removals of blocks stored before a partial member's history began (not unknown removals). */
  readonly unanchoredRemovals: number
  readonly occupiedBucketCount: number
  readonly occupiedSlotCount: number
}

interface EndpointPublicationStats {
  readonly sequence: bigint
  readonly pendingEvents: number
  readonly emittedImages: number
  readonly publicationCount: number
  readonly unchangedPublicationCount: number
  readonly physicalTouches: number
  readonly distinctTouchedBuckets: number
  readonly netRevertedBuckets: number
}

interface EndpointRecoveryStats {
  readonly degradedResets: number
  readonly rebuildCount: number
  readonly rebuildTotalMs: number
  readonly rebuildMaxMs: number
  readonly workerCount: number
  readonly rankCount: number
  readonly recoveringRankCount: number
  readonly pendingLiveEventCount: number
  readonly sourcesRecovering: number
  readonly sourcesDegraded: number
  /** Every active source of the endpoint and its state. */
  readonly sources: ReadonlyArray<SourceStateEntry>
}

/** The host and disk tiers' edges and memory (PROTOCOL §5.1 ◆3). */
export type EndpointTierStats = TierStats

/** Memory held by an endpoint's state. */
export interface EndpointMemoryStats {
  readonly filterBytes: number
  readonly dirtyTrackingBytes: number
  readonly ownershipBytes: number
  readonly lineageEntries: number
  readonly lineageBytes: number
  readonly memberSetCapacity: number
  readonly refcountCapacity: number
  readonly insertionScratchCapacity: number
}

interface EndpointActorStats {
  readonly mailboxDepth: number
  readonly mailboxCapacity: number
  readonly activeCommand: string | undefined
  readonly shuttingDown: boolean
  readonly lastError: string | undefined
  /** `/metrics` only (`kv_dc_relay_publish_delay_seconds`); not part of `/v1/stats`. */
  readonly publishDelay: PublishDelaySnapshot
}

/** Ingest counters of the endpoint's event sources (ZeroMQ messages and recoveries). */
export interface EndpointIngestStats {
  readonly events: number
  readonly blocks: number
  readonly malformed: number
  readonly gaps: number
  readonly recoveries: number
  /** Malformed messages by reason (only reasons that occurred). */
  readonly malformedByReason: Readonly<Partial<Record<MalformedReason, number>>>
  /** Engine events skipped by reason (not the worker's device cache). */
  readonly skipped: SkipCounts
  /** Batches dropped because their seq was below the last accepted one. */
  readonly stale: number
  /** Publishers that counted from seq 0 again (engine restarts under one publisher id). */
  readonly restarts: number
  /** Blocks skipped because their parent chain is unknown (PROTOCOL §3.3 ◆3); 0 without a pool. */
  readonly unanchored: number
}

/** One serving endpoint's counters, as `GET /v1/stats` reports them. */
export interface EndpointStats {
  readonly servingEndpoint: EndpointId
  readonly lifecycle: SlotLifecycle
  readonly layoutGeneration: bigint
  readonly membershipConflicts: ReadonlyArray<string>
  readonly models: ReadonlyArray<string>
  readonly aliases: ReadonlyArray<string>
  readonly roles: ReadonlyArray<string>
  /** Present while the endpoint has a live pool generation. */
  readonly aggregation: EndpointAggregationStats | undefined
  readonly publication: EndpointPublicationStats | undefined
  readonly memory: EndpointMemoryStats | undefined
  /** Present while the endpoint has a canonically addressed pool generation. */
  readonly tiers: EndpointTierStats | undefined
  readonly recovery: EndpointRecoveryStats
  readonly actor: EndpointActorStats | undefined
  readonly ingest: EndpointIngestStats
  /** Every expected source rank of the endpoint. */
  readonly sources: ReadonlyArray<SourceStats>
}

/** The relay's `GET /v1/stats` answer before encoding. */
export interface RelayStats {
  readonly identity: {
    readonly dcName: string
    readonly dcId: DcId
    readonly drtInstanceId: bigint
    readonly relayIncarnation: bigint
  }
  /** Sorted by serving endpoint. */
  readonly endpoints: ReadonlyArray<EndpointStats>
}

/** `GET /v1/endpoints/{endpoint}/snapshot`: a diagnostic barrier snapshot of one pool. */
export interface DiagnosticSnapshot {
  readonly servingEndpoint: EndpointId
  readonly layoutGeneration: bigint
  readonly sequence: bigint
  readonly memberCount: number
  readonly uniqueBlockCount: number
  readonly producer: ProducerIdentity
  /** Every bucket word as `[lo, hi]` pairs (the little-endian wire layout). */
  readonly words: Uint32Array
}

/** A worker query's answer for one serving endpoint's pool (PROTOCOL §5.1 ◆3). */
export interface EndpointWorkerQuery {
  readonly servingEndpoint: EndpointId
  readonly result: WorkerQueryResult
}

/** One expected source rank of a serving endpoint, as `GET /workers` lists it. */
export interface EndpointSourceRank {
  readonly workerId: WorkerId
  readonly dpRank: DpRank
  readonly transportEndpoint: string
}

/** One member's blocks per tier, as `/v1/stats` shows them (PROTOCOL §5.1 ◆3). */
export type { MemberTierCount }

/** The running relay: catalog, membership, load, pool streams, health, stats and shutdown. */
export interface KvDcRelayService {
  readonly dcName: string
  readonly dcId: DcId
  readonly identity: DcRelayIdentity
  /** The pool catalog; revisions only grow within one relay incarnation. */
  readonly catalogRef: SubscriptionRef.SubscriptionRef<DcPoolCatalog>
  /** What `catalogRef` holds, read on the caller's turn (no fiber). */
  readonly catalogNow: () => DcPoolCatalog
  /** The publication hubs now (`kv_dc_relay_*_publication_hub_count`), read on the caller's turn. */
  readonly publicationHubCounts: () => PublicationHubCounts
  /** Serving-endpoint memberships (the topology projection's input). */
  readonly membershipRef: SubscriptionRef.SubscriptionRef<DcMembershipView>
  /** Per-pool load, sorted by PoolId; windows are cut from it once per second. */
  readonly loadRef: SubscriptionRef.SubscriptionRef<ReadonlyArray<PoolLoadSnapshot>>
  /** Engine load read from the sources' `metricsUrl`s (PROTOCOL §5 ◆3); absent: none read. */
  readonly engineLoad?: EngineLoad | undefined
  /**
   * A pool stream: every snapshot chunk, then contiguous deltas. Fails before the stream starts
   * (NotFound, ProducerMismatch, ResourceExhausted, Unavailable) or as the stream's error.
   * `ended` completes as soon as the stream is terminal, before its end is pulled
   * (`PublicationSource.subscribePool`).
   */
  readonly subscribePool: PublicationSource["subscribePool"]
  /**
   * `subscribePool` as a callback-driven `PoolFeed` (`PublicationSource.subscribePoolFeed`): the
   * HTTP pool stream's form, which moves frames without a fiber per frame.
   */
  readonly subscribePoolFeed: PublicationSource["subscribePoolFeed"]
  readonly health: Effect.Effect<RelayHealth>
  readonly stats: Effect.Effect<RelayStats, KvDcRelayError>
  readonly diagnosticSnapshot: (endpoint: EndpointId) => Effect.Effect<DiagnosticSnapshot, KvDcRelayError>
  /**
   * Which member of the endpoint's pool holds how much of a prompt, per tier (PROTOCOL §5.1 ◆3):
   * `hashes` are the prompt's canonical sequence hashes (`[hi, lo]` pairs). Every expected rank is
   * listed, zero depths included, with every member that holds something.
   */
  readonly queryWorkers: (
    endpoint: EndpointId,
    hashes: Uint32Array
  ) => Effect.Effect<EndpointWorkerQuery, KvDcRelayError>
  /**
   * `queryWorkers` answered on the caller's turn when that gives the same answer (the pool's actor
   * at rest, `PoolActor.queryWorkersNow`), else undefined: the caller then asks `queryWorkers`,
   * which also reports an endpoint without a pool.
   */
  readonly queryWorkersNow: (endpoint: EndpointId, hashes: Uint32Array) => EndpointWorkerQuery | undefined
  /** The endpoint's expected source ranks and their transport endpoints (`GET /workers`). */
  readonly sourceRanks: (endpoint: EndpointId) => Effect.Effect<ReadonlyArray<EndpointSourceRank>>
  /** Completes once every materialized endpoint has published its pending tail. */
  readonly flush: Effect.Effect<void, KvDcRelayError>
  /** Clears the catalog, drains every endpoint, closes discovery; idempotent. */
  readonly shutdown: Effect.Effect<void>
}

/** The relay service (the seed's `KvDcRelay`). */
export class KvDcRelay extends Context.Tag("kvrelay/KvDcRelay")<KvDcRelay, KvDcRelayService>() {}
