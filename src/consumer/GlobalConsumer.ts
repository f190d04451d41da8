/**
 * The global consumer (`kvrelay global`, PROTOCOL.md §7; relay-service §10; ckf-core §7).
 *
 * Relays are given in order; a relay's position is its lane in every indexer domain (at most
 * 16). Per relay, one connection epoch at a time: learn the relay (`/v1/relay`), watch its
 * catalog, and end the epoch on any watch error, identity change or revision regression. An
 * ended epoch invalidates everything learned from that relay (its catalog is forgotten, so its
 * lanes retire) and the next epoch starts after a backoff of 500 ms doubling to 30 s with equal
 * jitter, reset once an epoch lived 30 s.
 *
 * Per indexer domain: one `GlobalCkfIndexer` and one `GlobalCkfIngestionPool` whose manifest
 * lanes are the relays' pools of that domain (`PoolId = (domain, relay dc id)`). Per laned pool,
 * one supervised lane fiber: assign a fresh lease, subscribe to the pool stream of the producer
 * the catalog names, install the snapshot, submit deltas. Any fault retires that lane only and
 * it subscribes again with the same backoff; a new producer in the catalog replaces the lane's
 * fiber at once.
 *
 * State is owned by plain objects mutated in synchronous sections (one fiber runs at a time);
 * one controller fiber reconciles the domains and lanes with what the relays' catalogs say,
 * woken (coalesced) whenever a relay learns or forgets something.
 */

import type * as HttpClient from "@effect/platform/HttpClient"
import { Context, Duration, Effect, Layer, Random } from "effect"
import { CKF_LANE_COUNT } from "../ckf/config.js"
import type { GlobalCkfIndexer } from "../ckf/global.js"
import type { DcCkfFormatIdentity, IndexerDomainId } from "../ckf/identity.js"
import type { CatalogSnapshot, DcPoolDescriptor, KvQuerySemantics, RelayInfo } from "../protocol/Model.js"
import { utf8Length } from "../protocol/Text.js"
import {
  defaultGlobalCkfIngestionPoolConfig,
  type GlobalCkfIngestionPoolConfig
} from "./GlobalCkfIngestionPool.js"
import type { KnownModelsView } from "./KnownModels.js"
import { make as makeRelayClient, type RelayClient, type RelayClientOptions } from "./RelayClient.js"
import type { RelaySignalsView } from "./RelaySignals.js"

// ---------------------------------------------------------------------------------------------
// Configuration

/** One relay the consumer follows: its name and URL. */
export interface RelaySpec {
  /** The consumer's label of the relay (`--relay NAME=URL`); results name relays by it. */
  readonly name: string
  /** Base URL of the relay's HTTP API, e.g. `http://127.0.0.1:8080`. */
  readonly url: string
}

/** The backoff between connection attempts to a relay. */
export interface ReconnectConfig {
  readonly initial: Duration.DurationInput
  readonly max: Duration.DurationInput
  /** An epoch (or lane attempt) that lived this long starts the next backoff from `initial`. */
  readonly resetAfter: Duration.DurationInput
}

/** The backoff used when none is given. */
export const DEFAULT_RECONNECT: ReconnectConfig = Object.freeze({
  initial: Duration.millis(500),
  max: Duration.seconds(30),
  resetAfter: Duration.seconds(30)
})

/**
 * The ingestion pool of each domain. The seed's 10 ms dirty-to-applied bound assumes dedicated
 * ingestion threads; here the workers share one event loop with HTTP decoding and snapshot
 * installs (a 2^19-bucket install into the transposed table takes milliseconds), so the consumer
 * allows 250 ms before it calls a lane stalled.
 */
export const DEFAULT_CONSUMER_INGESTION: GlobalCkfIngestionPoolConfig = Object.freeze({
  ...defaultGlobalCkfIngestionPoolConfig,
  maxDirtyToAppliedAge: Duration.millis(250)
})

/** The global consumer's relays, lanes and limits. */
export interface GlobalConsumerConfig {
  /** In lane order; 1..=16 relays with distinct names. */
  readonly relays: ReadonlyArray<RelaySpec>
  /** Label sent to the relays (suffixed per stream); default `kvrelay-global-<instance hex>`. */
  readonly subscriberId?: string | undefined
  /** Default: a random 64-bit value from `Random`. */
  readonly consumerInstance?: bigint | undefined
  readonly reconnect?: Partial<ReconnectConfig> | undefined
  readonly ingestion?: Partial<GlobalCkfIngestionPoolConfig> | undefined
  /** Prefix-search verification window (default 2). */
  readonly verificationWindow?: number | undefined
  /** Names no current catalog lists that are still remembered (`KnownModels`, default 4096). */
  readonly retainedNames?: number | undefined
}

/** Subscriber ids are ≤ 128 bytes; the per-stream suffixes take at most 32. */
const MAX_SUBSCRIBER_BASE_BYTES = 96

/** Parses `NAME=URL` (the `--relay` flag). */
export const parseRelaySpec = (text: string): RelaySpec | string => {
  const at = text.indexOf("=")
  if (at <= 0) return `--relay ${JSON.stringify(text)} must be NAME=URL`
  return { name: text.slice(0, at), url: text.slice(at + 1) }
}

/** The problems of a configuration, in words (none: it can start). */
export const validateConfig = (config: GlobalConsumerConfig): ReadonlyArray<string> => {
  const problems: Array<string> = []
  if (config.relays.length === 0) problems.push("--relay: at least one relay is required")
  if (config.relays.length > CKF_LANE_COUNT) {
    problems.push(`--relay: at most ${CKF_LANE_COUNT} relays (one lane each), got ${config.relays.length}`)
  }
  const names = new Set<string>()
  for (const relay of config.relays) {
    if (relay.name.length === 0 || relay.name.trim() !== relay.name || /\p{Cc}/u.test(relay.name)) {
      problems.push(
        `--relay: name ${JSON.stringify(relay.name)} must be non-empty text without surrounding blanks`
      )
    }
    if (names.has(relay.name))
      problems.push(`--relay: name ${JSON.stringify(relay.name)} is given more than once`)
    names.add(relay.name)
    let url: URL | undefined
    try {
      url = new URL(relay.url)
    } catch {
      url = undefined
    }
    if (url === undefined || (url.protocol !== "http:" && url.protocol !== "https:")) {
      problems.push(`--relay: ${relay.name}=${relay.url} is not an http(s) URL`)
    }
  }
  const id = config.subscriberId
  if (id !== undefined) {
    const bytes = utf8Length(id)
    if (bytes === 0 || bytes > MAX_SUBSCRIBER_BASE_BYTES || /\p{Cc}/u.test(id)) {
      problems.push(`subscriberId must be 1..=${MAX_SUBSCRIBER_BASE_BYTES} bytes without control characters`)
    }
  }
  const window = config.verificationWindow
  if (window !== undefined && (!Number.isInteger(window) || window < 1 || window > 8)) {
    problems.push(`verificationWindow must be in 1..=8, got ${window}`)
  }
  return problems
}

/** Drops `undefined` values so that an explicit `undefined` keeps the default. */
export const definedOnly = <A extends object>(partial: A | undefined): Partial<A> => {
  const out: Partial<A> = {}
  if (partial === undefined) return out
  for (const key of Object.keys(partial) as Array<keyof A>) {
    if (partial[key] !== undefined) out[key] = partial[key]
  }
  return out
}

// ---------------------------------------------------------------------------------------------
// Backoff

/** `min(max, initial × 2^attempt)`: the ceiling of the next sleep. */
export const backoffCeiling = (
  attempt: number,
  initial: Duration.DurationInput,
  max: Duration.DurationInput
): Duration.Duration => {
  const initialMs = Duration.toMillis(initial)
  const maxMs = Duration.toMillis(max)
  return Duration.millis(Math.min(maxMs, initialMs * 2 ** Math.min(attempt, 52)))
}

/** Equal jitter: half the ceiling plus a uniform share of the other half (from `Random`). */
export const equalJitter = (ceiling: Duration.DurationInput): Effect.Effect<Duration.Duration> =>
  Effect.map(Random.next, (r) => {
    const half = Duration.toMillis(ceiling) / 2
    return Duration.millis(half + r * half)
  })

// ---------------------------------------------------------------------------------------------
// Connector (how relay clients are made; tests substitute in-memory relays)

interface RelayConnectorService {
  readonly connect: (relay: RelaySpec) => Effect.Effect<RelayClient>
}

/** How the consumer reaches relays (HTTP in the product, in-process in tests). */
export class RelayConnector extends Context.Tag("kvrelay/consumer/RelayConnector")<
  RelayConnector,
  RelayConnectorService
>() {
  /** HTTP clients (`RelayClient.make`) over the given `HttpClient`. */
  static readonly layerHttp = (
    options?: RelayClientOptions
  ): Layer.Layer<RelayConnector, never, HttpClient.HttpClient> =>
    Layer.effect(
      RelayConnector,
      Effect.map(Effect.context<HttpClient.HttpClient>(), (context) => ({
        connect: (relay: RelaySpec) => makeRelayClient(relay.url, options).pipe(Effect.provide(context))
      }))
    )
}

// ---------------------------------------------------------------------------------------------
// Public state

/** What the consumer knows about one relay. */
interface RelayStatus {
  readonly name: string
  readonly url: string
  /** The relay's position: its lane in every domain. */
  readonly lane: number
  readonly info: RelayInfo | undefined
  /** The latest catalog of the current epoch (forgotten when the epoch ends). */
  readonly catalog: CatalogSnapshot | undefined
  /**
   * The newest catalog the relay sent, kept across an ended epoch until the next one's catalog
   * replaces it: a relay that went away keeps its pools as routing candidates (PROTOCOL §7.1).
   */
  readonly lastCatalog: CatalogSnapshot | undefined
  readonly connected: boolean
  readonly epochs: number
  readonly lastError: string | undefined
}

/** One lane of one domain, as queries see it. */
export interface LaneStatus {
  readonly lane: number
  readonly relay: string
  readonly descriptor: DcPoolDescriptor
  readonly ready: boolean
  /** The sequence of the newest state admitted into the lane; defined while ready. */
  readonly installedSequence: bigint | undefined
  readonly faults: number
  /** Faults by kind (`Relay`, `Assign`, `Install`, `Ingestion`, `Closed`, a relay client error's tag, `Defect`). */
  readonly faultsByKind: Readonly<Record<string, number>>
  readonly lastFault: string | undefined
  /** Snapshots installed and deltas admitted since the lane started (a new producer starts a new lane). */
  readonly snapshotsInstalled: number
  readonly deltasApplied: number
  /** Subscriptions after the lane's first one (each follows a fault and its backoff). */
  readonly resubscribes: number
}

/** One indexer domain: its indexer (for queries) and its lanes. */
export interface DomainStatus {
  readonly id: IndexerDomainId
  readonly format: DcCkfFormatIdentity
  readonly querySemantics: KvQuerySemantics
  readonly indexer: GlobalCkfIndexer
  /** By lane; only lanes with a pool in the relay's current catalog. */
  readonly lanes: ReadonlyMap<number, LaneStatus>
}

/** The running global consumer: its identity, its view of the relays' pools and its controls. */
export interface GlobalConsumerService {
  readonly consumerInstance: bigint
  readonly subscriberId: string
  readonly relays: () => ReadonlyArray<RelayStatus>
  /** Live domains ordered by IndexerDomainId. */
  readonly domains: () => ReadonlyArray<DomainStatus>
  /** Pools served by a relay that could not be laned, with the reason (format mismatch, …). */
  readonly problems: () => ReadonlyArray<string>
  /** What the relays' catalogs have registered since the consumer started (PROTOCOL §7 ◆3). */
  readonly known: KnownModelsView
  /** Each relay's latest load window and readiness (PROTOCOL §7.1 ◆3), read by routing. */
  readonly signals: RelaySignalsView
  /** Sets the consumer's gauges from the current state (called before a metrics scrape). */
  readonly refreshGauges: Effect.Effect<void>
}

/** The global consumer service. */
export class GlobalConsumer extends Context.Tag("kvrelay/GlobalConsumer")<
  GlobalConsumer,
  GlobalConsumerService
>() {}
