/**
 * The relay's `kv_dc_relay_*` metrics (relay-service §7) plus per-endpoint ingest and actor
 * gauges, as Effect `Metric`s rendered by `prometheusText`.
 *
 * Metrics other modules already update keep the exact key (name, description, counter options)
 * those modules use, so both refer to one series: `PublicationHub` counts pool-stream lag and the
 * per-pool / initialized-hub limit rejections, `PoolRegistry` counts terminal publication
 * failures. Effect registers a series on its first update; `initializeRelayMetrics` touches
 * every family once so a scrape shows all of them from the start.
 */

import { Effect, Metric } from "effect"
import { MALFORMED_REASONS, type MalformedReason, SKIP_REASONS, type SkipCounts } from "../domain/ingest.js"

export type SubscriberStream = "catalog" | "pool" | "readiness" | "load"
export const SUBSCRIBER_STREAMS: ReadonlyArray<SubscriberStream> = ["catalog", "pool", "readiness", "load"]

/** `per_pool` and `initialized_hub` only exist for `stream="pool"`. */
export type LimitScope = "total" | "per_pool" | "initialized_hub"

export type TopologyStateLabel = "ready" | "unavailable" | "unknown"

const subscribers = Metric.gauge("kv_dc_relay_subscribers", {
  description: "current subscribers per stream type"
})

const subscriberLagged = Metric.counter("kv_dc_relay_subscriber_lagged_total", {
  description: "streams terminated for bounded-queue lag",
  incremental: true
})

const subscriberLimitRejected = Metric.counter("kv_dc_relay_subscriber_limit_rejected_total", {
  description: "subscriptions rejected at a limit",
  incremental: true
})

const poolHeartbeats = Metric.counter("kv_dc_relay_pool_heartbeats_total", {
  description: "heartbeats emitted on pool streams",
  incremental: true
})

const loadUpdates = Metric.counter("kv_dc_relay_load_updates_total", {
  description: "complete load windows emitted",
  incremental: true
})

const catalogPoolCount = Metric.gauge("kv_dc_relay_catalog_pool_count", {
  description: "pools in the catalog"
})

const catalogRevision = Metric.gauge("kv_dc_relay_catalog_revision", {
  description: "current pool catalog revision"
})

const requestedHubs = Metric.gauge("kv_dc_relay_requested_publication_hub_count", {
  description: "pools whose lazy hub was requested"
})
const initializedHubs = Metric.gauge("kv_dc_relay_initialized_publication_hub_count", {
  description: "hubs holding an initialized mirror"
})
const readyHubs = Metric.gauge("kv_dc_relay_ready_publication_hub_count", {
  description: "hubs with a contiguous ready mirror"
})
const idleHubs = Metric.gauge("kv_dc_relay_idle_publication_hub_count", {
  description: "ready hubs with no subscribers"
})

const terminalPublicationFailures = Metric.counter("kv_dc_relay_terminal_publication_failures_total", {
  description: "generations fenced after terminal publication failure",
  incremental: true
})

const servingTopologyCount = Metric.gauge("kv_dc_relay_serving_topology_count", {
  description: "topology entries by state"
})

const degradedLoadCoverage = Metric.gauge("kv_dc_relay_degraded_load_coverage_pool_count", {
  description: "pools with any observed < expected"
})

// Per serving endpoint (`endpoint="ns.component.endpoint"`). The ingest values are cumulative
// totals owned by the endpoint's sources; they are gauges because they are set from snapshots.
const ingestEvents = Metric.gauge("kv_dc_relay_ingest_events", {
  description: "KV events ingested by the endpoint's sources (cumulative)"
})
const ingestBlocks = Metric.gauge("kv_dc_relay_ingest_blocks", {
  description: "KV blocks carried by ingested events (cumulative)"
})
const ingestMalformed = Metric.gauge("kv_dc_relay_ingest_malformed", {
  description: "malformed KV event messages (cumulative)"
})
const ingestGaps = Metric.gauge("kv_dc_relay_ingest_gaps", {
  description: "event-id gaps detected on the endpoint's ranks (cumulative)"
})
const ingestRecoveries = Metric.gauge("kv_dc_relay_ingest_recoveries", {
  description: "recoveries run for the endpoint's ranks (cumulative)"
})
const actorMailboxDepth = Metric.gauge("kv_dc_relay_actor_mailbox_depth", {
  description: "commands queued in the endpoint's pool actor mailbox"
})
const publicationSequence = Metric.gauge("kv_dc_relay_publication_sequence", {
  description: "last publication sequence of the endpoint's pool generation"
})

// Ingest drops, by reason, across every endpoint (PROTOCOL §3.2).
const ingestSkippedEvents = Metric.counter("kv_dc_relay_ingest_skipped_events_total", {
  description: "engine KV events skipped because they are not the worker's device cache, by reason",
  incremental: true
})
const ingestMalformedMessages = Metric.counter("kv_dc_relay_ingest_malformed_messages_total", {
  description: "KV event messages rejected as malformed (nothing of them applied), by reason",
  incremental: true
})
const ingestDroppedBatches = Metric.counter("kv_dc_relay_ingest_dropped_batches_total", {
  description: "well-formed KV event batches dropped, by reason (stale: seq below the last accepted one)",
  incremental: true
})

const recoveries = Metric.counter("kv_dc_relay_recoveries_total", {
  description: "rank recoveries by outcome",
  incremental: true
})

// ---------------------------------------------------------------------------------------------
// Streams (HTTP layer)

export const subscriberOpened = (stream: SubscriberStream): Effect.Effect<void> =>
  Metric.increment(Metric.tagged(subscribers, "stream", stream))

export const subscriberClosed = (stream: SubscriberStream): Effect.Effect<void> =>
  Metric.incrementBy(Metric.tagged(subscribers, "stream", stream), -1)

/** Lag the HTTP layer detected; pool-stream lag inside the hub is counted by the hub. */
export const subscriberLaggedOut = (stream: SubscriberStream): Effect.Effect<void> =>
  Metric.increment(Metric.tagged(subscriberLagged, "stream", stream))

export const limitRejected = (stream: SubscriberStream, scope: LimitScope): Effect.Effect<void> =>
  Metric.increment(Metric.tagged(Metric.tagged(subscriberLimitRejected, "stream", stream), "scope", scope))

export const poolHeartbeatSent: Effect.Effect<void> = Metric.increment(poolHeartbeats)

export const loadWindowEmitted: Effect.Effect<void> = Metric.increment(loadUpdates)

// ---------------------------------------------------------------------------------------------
// Relay state (host, or the HTTP layer on each scrape)

export const setCatalog = (poolCount: number, revision: bigint): Effect.Effect<void> =>
  Effect.zipRight(Metric.set(catalogPoolCount, poolCount), Metric.set(catalogRevision, Number(revision)))

export interface PublicationHubCounts {
  readonly requested: number
  readonly initialized: number
  readonly ready: number
  readonly idle: number
}

export const setPublicationHubCounts = (counts: PublicationHubCounts): Effect.Effect<void> =>
  Effect.all(
    [
      Metric.set(requestedHubs, counts.requested),
      Metric.set(initializedHubs, counts.initialized),
      Metric.set(readyHubs, counts.ready),
      Metric.set(idleHubs, counts.idle)
    ],
    { discard: true }
  )

export const terminalPublicationFailure: Effect.Effect<void> = Metric.increment(terminalPublicationFailures)

export const setServingTopologyCounts = (
  counts: Readonly<Record<TopologyStateLabel, number>>
): Effect.Effect<void> =>
  Effect.all(
    (["ready", "unavailable", "unknown"] as const).map((state) =>
      Metric.set(Metric.tagged(servingTopologyCount, "state", state), counts[state])
    ),
    { discard: true }
  )

export const setDegradedLoadCoverage = (pools: number): Effect.Effect<void> =>
  Metric.set(degradedLoadCoverage, pools)

export interface EndpointGauges {
  readonly events: number
  readonly blocks: number
  readonly malformed: number
  readonly gaps: number
  readonly recoveries: number
  readonly mailboxDepth: number
  readonly publicationSequence: bigint
}

export const ZERO_ENDPOINT_GAUGES: EndpointGauges = {
  events: 0,
  blocks: 0,
  malformed: 0,
  gaps: 0,
  recoveries: 0,
  mailboxDepth: 0,
  publicationSequence: 0n
}

/** `endpoint` is the `ns.component.endpoint` text. */
export const setEndpointGauges = (endpoint: string, gauges: EndpointGauges): Effect.Effect<void> => {
  const at = (metric: Metric.Metric.Gauge<number>) => Metric.tagged(metric, "endpoint", endpoint)
  return Effect.all(
    [
      Metric.set(at(ingestEvents), gauges.events),
      Metric.set(at(ingestBlocks), gauges.blocks),
      Metric.set(at(ingestMalformed), gauges.malformed),
      Metric.set(at(ingestGaps), gauges.gaps),
      Metric.set(at(ingestRecoveries), gauges.recoveries),
      Metric.set(at(actorMailboxDepth), gauges.mailboxDepth),
      Metric.set(at(publicationSequence), Number(gauges.publicationSequence))
    ],
    { discard: true }
  )
}

export const ingestSkipped = (counts: SkipCounts): Effect.Effect<void> =>
  Effect.forEach(
    SKIP_REASONS,
    (reason) =>
      counts[reason] === 0
        ? Effect.void
        : Metric.incrementBy(Metric.tagged(ingestSkippedEvents, "reason", reason), counts[reason]),
    { discard: true }
  )

export const ingestMalformedMessage = (reason: MalformedReason): Effect.Effect<void> =>
  Metric.increment(Metric.tagged(ingestMalformedMessages, "reason", reason))

export const ingestDropped = (reason: "stale"): Effect.Effect<void> =>
  Metric.increment(Metric.tagged(ingestDroppedBatches, "reason", reason))

/** One finished rank recovery; `outcome` e.g. `events`, `tree_dump`, `degraded`, `failed`. */
export const recoveryFinished = (outcome: string): Effect.Effect<void> =>
  Metric.increment(Metric.tagged(recoveries, "outcome", outcome))

/** Registers every family with a zero update, so scrapes list them before anything happened. */
export const initializeRelayMetrics: Effect.Effect<void> = Effect.all(
  [
    ...SUBSCRIBER_STREAMS.map((stream) =>
      Metric.incrementBy(Metric.tagged(subscribers, "stream", stream), 0)
    ),
    ...SUBSCRIBER_STREAMS.map((stream) =>
      Metric.incrementBy(Metric.tagged(subscriberLagged, "stream", stream), 0)
    ),
    ...SUBSCRIBER_STREAMS.map((stream) =>
      Metric.incrementBy(
        Metric.tagged(Metric.tagged(subscriberLimitRejected, "stream", stream), "scope", "total"),
        0
      )
    ),
    ...(["per_pool", "initialized_hub"] as const).map((scope) =>
      Metric.incrementBy(
        Metric.tagged(Metric.tagged(subscriberLimitRejected, "stream", "pool"), "scope", scope),
        0
      )
    ),
    Metric.incrementBy(poolHeartbeats, 0),
    Metric.incrementBy(loadUpdates, 0),
    Metric.incrementBy(terminalPublicationFailures, 0),
    Metric.incrementBy(catalogPoolCount, 0),
    Metric.incrementBy(catalogRevision, 0),
    Metric.incrementBy(requestedHubs, 0),
    Metric.incrementBy(initializedHubs, 0),
    Metric.incrementBy(readyHubs, 0),
    Metric.incrementBy(idleHubs, 0),
    ...(["ready", "unavailable", "unknown"] as const).map((state) =>
      Metric.incrementBy(Metric.tagged(servingTopologyCount, "state", state), 0)
    ),
    Metric.incrementBy(degradedLoadCoverage, 0),
    ...SKIP_REASONS.map((reason) =>
      Metric.incrementBy(Metric.tagged(ingestSkippedEvents, "reason", reason), 0)
    ),
    ...MALFORMED_REASONS.map((reason) =>
      Metric.incrementBy(Metric.tagged(ingestMalformedMessages, "reason", reason), 0)
    ),
    Metric.incrementBy(Metric.tagged(ingestDroppedBatches, "reason", "stale"), 0)
  ],
  { discard: true }
)
