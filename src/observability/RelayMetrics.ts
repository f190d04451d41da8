/**
 * The relay's `kv_dc_relay_*` metrics (relay-service §7): Effect `Metric`s that the exposition
 * (`Prometheus.make`) reads at scrape time, plus per-endpoint ingest counters and actor gauges
 * that `registerEndpointMetrics` reads from the relay's stats through collect callbacks.
 *
 * Families other modules update are declared here once and imported there: `PublicationHub`
 * counts pool-stream lag and the per-pool / initialized-hub limit rejections, `PoolRegistry`
 * counts terminal publication failures. Effect registers a series on its first update; `initializeRelayMetrics` touches
 * every family once so a scrape shows all of them from the start.
 */

import { Effect, Metric } from "effect"
import { Counter, Gauge, type Metric as PromMetric, type Registry } from "prom-client"
import {
  DROP_REASONS,
  type DropReason,
  MALFORMED_REASONS,
  type MalformedReason,
  SKIP_REASONS,
  type SkipCounts,
  ZMTP_ERROR_REASONS,
  type ZmtpErrorReason
} from "../protocol/Events.js"
import { counterFamily, gaugeFamily } from "./MetricFamilies.js"
import { PUBLISH_DELAY_BOUNDS_SECONDS, type PublishDelaySnapshot } from "./PublishDelay.js"

/** The relay's stream kinds, as the `stream` label of the subscriber metrics. */
export type SubscriberStream = "catalog" | "pool" | "readiness" | "load"
const SUBSCRIBER_STREAMS: ReadonlyArray<SubscriberStream> = ["catalog", "pool", "readiness", "load"]

/** `per_pool` and `initialized_hub` only exist for `stream="pool"`. */
type LimitScope = "total" | "per_pool" | "initialized_hub"

type TopologyStateLabel = "ready" | "unavailable" | "unknown"

const subscribers = gaugeFamily("kv_dc_relay_subscribers", "current subscribers per stream type")

/** Streams terminated for lag, by `stream` (the pool streams' hub counts its own). */
export const subscriberLagged = counterFamily(
  "kv_dc_relay_subscriber_lagged_total",
  "streams terminated for bounded-queue lag"
)

/** Subscriptions rejected at a limit, by `stream` and `scope`. */
export const subscriberLimitRejected = counterFamily(
  "kv_dc_relay_subscriber_limit_rejected_total",
  "subscriptions rejected at a limit"
)

const poolHeartbeats = counterFamily(
  "kv_dc_relay_pool_heartbeats_total",
  "heartbeats emitted on pool streams"
)

const loadUpdates = counterFamily("kv_dc_relay_load_updates_total", "complete load windows emitted")

const catalogPoolCount = gaugeFamily("kv_dc_relay_catalog_pool_count", "pools in the catalog")

const catalogRevision = gaugeFamily("kv_dc_relay_catalog_revision", "current pool catalog revision")

const requestedHubs = gaugeFamily(
  "kv_dc_relay_requested_publication_hub_count",
  "pools whose lazy hub was requested"
)
const initializedHubs = gaugeFamily(
  "kv_dc_relay_initialized_publication_hub_count",
  "hubs holding an initialized mirror"
)
const readyHubs = gaugeFamily(
  "kv_dc_relay_ready_publication_hub_count",
  "hubs with a contiguous ready mirror"
)
const idleHubs = gaugeFamily("kv_dc_relay_idle_publication_hub_count", "ready hubs with no subscribers")

/** Generations fenced after a terminal publication failure (counted by the pool registry). */
export const terminalPublicationFailures = counterFamily(
  "kv_dc_relay_terminal_publication_failures_total",
  "generations fenced after terminal publication failure"
)

const servingTopologyCount = gaugeFamily("kv_dc_relay_serving_topology_count", "topology entries by state")

const degradedLoadCoverage = gaugeFamily(
  "kv_dc_relay_degraded_load_coverage_pool_count",
  "pools with any observed < expected"
)

// Ingest drops, by reason, across every endpoint (PROTOCOL §3.2).
const ingestSkippedEvents = counterFamily(
  "kv_dc_relay_ingest_skipped_events_total",
  "engine KV events skipped because they are not the worker's device cache, by reason"
)
const ingestMalformedMessages = counterFamily(
  "kv_dc_relay_ingest_malformed_messages_total",
  "KV event messages rejected as malformed (nothing of them applied), by reason"
)
// The supervisor counts its drops under the same key (SourceSupervisor.ts).
const ingestDroppedBatches = counterFamily(
  "kv_dc_relay_ingest_dropped_batches_total",
  "KV event messages and batches dropped whole, by reason (domain/ingest.ts DropReason)"
)

// The pool actor counts unanchored blocks under the same key (PoolActor.ts).
const ingestSkippedBlocks = counterFamily(
  "kv_dc_relay_ingest_skipped_blocks_total",
  "KV blocks of engine events not indexed, by reason (unanchored: parent chain unknown)"
)
const SKIPPED_BLOCK_REASONS: ReadonlyArray<string> = ["unanchored"]

const sourcesByState = gaugeFamily(
  "kv_dc_relay_sources",
  "expected KV event source ranks by state (connecting, live, recovering, degraded, rejected)"
)
const SOURCE_STATES = ["connecting", "live", "recovering", "degraded", "rejected"] as const
type SourceStateLabel = (typeof SOURCE_STATES)[number]

// ---------------------------------------------------------------------------------------------
// Streams (HTTP layer)

/** Counts a subscriber of `stream` in. */
export const subscriberOpened = (stream: SubscriberStream): Effect.Effect<void> =>
  Metric.increment(Metric.tagged(subscribers, "stream", stream))

/** Counts a subscriber of `stream` out. */
export const subscriberClosed = (stream: SubscriberStream): Effect.Effect<void> =>
  Metric.incrementBy(Metric.tagged(subscribers, "stream", stream), -1)

/** Lag the HTTP layer detected; pool-stream lag inside the hub is counted by the hub. */
export const subscriberLaggedOut = (stream: SubscriberStream): Effect.Effect<void> =>
  Metric.increment(Metric.tagged(subscriberLagged, "stream", stream))

/** Counts a subscription refused at a limit of `scope`. */
export const limitRejected = (stream: SubscriberStream, scope: LimitScope): Effect.Effect<void> =>
  Metric.increment(Metric.tagged(Metric.tagged(subscriberLimitRejected, "stream", stream), "scope", scope))

/** Counts a heartbeat sent on a pool stream. */
export const poolHeartbeatSent: Effect.Effect<void> = Metric.increment(poolHeartbeats)

/** Counts a complete load window sent. */
export const loadWindowEmitted: Effect.Effect<void> = Metric.increment(loadUpdates)

// ---------------------------------------------------------------------------------------------
// Relay state (host, or the HTTP layer on each scrape)

/** Sets the catalog's pool count and revision. */
export const setCatalog = (poolCount: number, revision: bigint): Effect.Effect<void> =>
  Effect.zipRight(Metric.set(catalogPoolCount, poolCount), Metric.set(catalogRevision, Number(revision)))

/** Sets the publication hub gauges (the relay's `PublicationHubCounts`). */
export const setPublicationHubCounts = (counts: {
  readonly requested: number
  readonly initialized: number
  readonly ready: number
  readonly idle: number
}): Effect.Effect<void> =>
  Effect.all(
    [
      Metric.set(requestedHubs, counts.requested),
      Metric.set(initializedHubs, counts.initialized),
      Metric.set(readyHubs, counts.ready),
      Metric.set(idleHubs, counts.idle)
    ],
    { discard: true }
  )

/** Sets the readiness entries by state. */
export const setServingTopologyCounts = (
  counts: Readonly<Record<TopologyStateLabel, number>>
): Effect.Effect<void> =>
  Effect.all(
    (["ready", "unavailable", "unknown"] as const).map((state) =>
      Metric.set(Metric.tagged(servingTopologyCount, "state", state), counts[state])
    ),
    { discard: true }
  )

/** Sets the expected source ranks by state. */
export const setSourceCounts = (counts: Readonly<Record<SourceStateLabel, number>>): Effect.Effect<void> =>
  Effect.forEach(
    SOURCE_STATES,
    (state) => Metric.set(Metric.tagged(sourcesByState, "state", state), counts[state]),
    {
      discard: true
    }
  )

/** Sets how many pools have a load window with fewer ranks observed than expected. */
export const setDegradedLoadCoverage = (pools: number): Effect.Effect<void> =>
  Metric.set(degradedLoadCoverage, pools)

/** Adds the events skipped by an endpoint, by reason. */
export const ingestSkipped = (counts: SkipCounts): Effect.Effect<void> =>
  Effect.forEach(
    SKIP_REASONS,
    (reason) =>
      counts[reason] === 0
        ? Effect.void
        : Metric.incrementBy(Metric.tagged(ingestSkippedEvents, "reason", reason), counts[reason]),
    { discard: true }
  )

/** Counts a KV event message refused as malformed. */
export const ingestMalformedMessage = (reason: MalformedReason): Effect.Effect<void> =>
  Metric.increment(Metric.tagged(ingestMalformedMessages, "reason", reason))

/** Counts a message or batch dropped whole. */
export const ingestDropped = (reason: DropReason): Effect.Effect<void> =>
  Metric.increment(Metric.tagged(ingestDroppedBatches, "reason", reason))

/** `kv_dc_relay_zmtp_protocol_errors_total{reason}`, on the relay's `/metrics`. */
export const zmtpProtocolErrorsTotal = counterFamily(
  "kv_dc_relay_zmtp_protocol_errors_total",
  "ZMTP connections of event subscribers closed for a protocol error, by reason"
)

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
    ...DROP_REASONS.map((reason) =>
      Metric.incrementBy(Metric.tagged(ingestDroppedBatches, "reason", reason), 0)
    ),
    ...SKIPPED_BLOCK_REASONS.map((reason) =>
      Metric.incrementBy(Metric.tagged(ingestSkippedBlocks, "reason", reason), 0)
    ),
    ...SOURCE_STATES.map((state) => Metric.incrementBy(Metric.tagged(sourcesByState, "state", state), 0)),
    ...ZMTP_ERROR_REASONS.map((reason) =>
      Metric.incrementBy(Metric.tagged(zmtpProtocolErrorsTotal, "reason", reason), 0)
    )
  ],
  { discard: true }
)

/** One ZMTP connection closed for a protocol error. */
export const zmtpProtocolError = (reason: ZmtpErrorReason): Effect.Effect<void> =>
  Metric.increment(Metric.tagged(zmtpProtocolErrorsTotal, "reason", reason))

// ---------------------------------------------------------------------------------------------
// Per serving endpoint, from the relay's stats at scrape time

/** One endpoint's values in the relay's stats; `endpoint` is the `ns.component.endpoint` text. */
export interface EndpointSample {
  readonly endpoint: string
  /** Cumulative counts of the endpoint's sources (they restart with a new pool generation). */
  readonly events: number
  readonly blocks: number
  readonly malformed: number
  readonly gaps: number
  readonly recoveries: number
  readonly mailboxDepth: number
  readonly publicationSequence: bigint
  readonly publishDelay: PublishDelaySnapshot
}

type SampleField = Exclude<keyof EndpointSample, "endpoint" | "publishDelay">

const ENDPOINT_COUNTERS: ReadonlyArray<readonly [string, string, SampleField]> = [
  ["kv_dc_relay_ingest_events_total", "KV events ingested by the endpoint's sources", "events"],
  ["kv_dc_relay_ingest_blocks_total", "KV blocks carried by ingested events", "blocks"],
  [
    "kv_dc_relay_ingest_malformed_total",
    "malformed KV event messages of the endpoint's sources",
    "malformed"
  ],
  ["kv_dc_relay_ingest_gaps_total", "event-id gaps detected on the endpoint's ranks", "gaps"],
  ["kv_dc_relay_ingest_recoveries_total", "recoveries run for the endpoint's ranks", "recoveries"]
]

const ENDPOINT_GAUGES: ReadonlyArray<readonly [string, string, SampleField]> = [
  ["kv_dc_relay_actor_mailbox_depth", "commands queued in the endpoint's pool actor mailbox", "mailboxDepth"],
  [
    "kv_dc_relay_publication_sequence",
    "last publication sequence of the endpoint's pool generation",
    "publicationSequence"
  ]
]

/**
 * Registers the per-endpoint families; each collect callback copies `samples()` (the stats the
 * scrape fetched), so an endpoint that is gone has no series.
 */
export const registerEndpointMetrics = (
  registry: Registry,
  samples: () => ReadonlyArray<EndpointSample>
): void => {
  for (const [name, help, field] of ENDPOINT_COUNTERS) {
    new Counter({
      name,
      help,
      labelNames: ["endpoint"],
      registers: [registry],
      collect(this: Counter<"endpoint">) {
        this.reset()
        for (const sample of samples()) this.inc({ endpoint: sample.endpoint }, Number(sample[field]))
      }
    })
  }
  for (const [name, help, field] of ENDPOINT_GAUGES) {
    new Gauge({
      name,
      help,
      labelNames: ["endpoint"],
      registers: [registry],
      collect(this: Gauge<"endpoint">) {
        this.reset()
        for (const sample of samples()) this.set({ endpoint: sample.endpoint }, Number(sample[field]))
      }
    })
  }
  registry.registerMetric(publishDelayFamily(samples) as unknown as PromMetric)
}

const PUBLISH_DELAY_NAME = "kv_dc_relay_publish_delay_seconds"

/**
 * `kv_dc_relay_publish_delay_seconds{endpoint}`: each actor keeps its own bucket counts (see
 * `relay/PublishDelay`), so the family renders them as they are instead of observing into a
 * prom-client `Histogram`. prom-client formats any registered object with a `get()`; the
 * buckets are cumulative, as Prometheus reads them.
 */
const publishDelayFamily = (samples: () => ReadonlyArray<EndpointSample>) => {
  const help = "from the admission of the oldest event a pool delta carries to its publication"
  return {
    name: PUBLISH_DELAY_NAME,
    help,
    type: "histogram",
    aggregator: "sum",
    reset: () => undefined,
    get: () => {
      const values: Array<{ metricName: string; labels: Record<string, string | number>; value: number }> = []
      for (const sample of samples()) {
        const { counts, sumSeconds, count } = sample.publishDelay
        let cumulative = 0
        for (let i = 0; i < counts.length; i++) {
          cumulative += counts[i]!
          const le =
            i < PUBLISH_DELAY_BOUNDS_SECONDS.length ? String(PUBLISH_DELAY_BOUNDS_SECONDS[i]) : "+Inf"
          values.push({
            metricName: `${PUBLISH_DELAY_NAME}_bucket`,
            labels: { endpoint: sample.endpoint, le },
            value: cumulative
          })
        }
        values.push({
          metricName: `${PUBLISH_DELAY_NAME}_sum`,
          labels: { endpoint: sample.endpoint },
          value: sumSeconds
        })
        values.push({
          metricName: `${PUBLISH_DELAY_NAME}_count`,
          labels: { endpoint: sample.endpoint },
          value: count
        })
      }
      return { name: PUBLISH_DELAY_NAME, help, type: "histogram", aggregator: "sum", values }
    }
  }
}
