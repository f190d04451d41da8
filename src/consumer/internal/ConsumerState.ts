/**
 * The global consumer's state per relay, per indexer domain and per lane, with the log
 * annotations and texts its loops share.
 */

import { Data, type Deferred, Duration, type Fiber, type Scope } from "effect"
import type { GlobalCkfIndexer } from "../../ckf/global.js"
import type { DcCkfFormatIdentity, DcId, IndexerDomainId, LaneLease } from "../../ckf/identity.js"
import type { CatalogSnapshot, DcPoolDescriptor, KvQuerySemantics, RelayInfo } from "../../protocol/Model.js"
import { poolDescriptorEquals } from "../../protocol/Model.js"
import type { GlobalCkfIngestionError } from "../ConsumerErrors.js"
import type { GlobalCkfIngestionFault, GlobalCkfIngestionPool } from "../GlobalCkfIngestionPool.js"
import type { RelaySpec } from "../GlobalConsumer.js"
import type { RelayClient } from "../RelayClient.js"

// ---------------------------------------------------------------------------------------------
// Internal state

/**
 * What the log last said about a relay (PROTOCOL §7 ◆3): a WARN once when it becomes
 * unreachable or its pool streams start failing, an INFO once when it is back; every retry in
 * between is logged at DEBUG only.
 */
type RelayHealth = "starting" | "up" | "unreachable" | "streams"

/**
 * A lane fault is called a failing stream only after this long, and only if the relay still
 * answers: a relay that went away breaks its pool streams and its catalog watch at once, and
 * that is one event (unreachable), whichever socket noticed first.
 */
export const STREAM_FAULT_SETTLE = Duration.seconds(1)

export const STREAM_FAULT_PROBE_TIMEOUT = Duration.seconds(2)

/** Why a lane attempt ended. */
export class LaneFault extends Data.TaggedError("LaneFault")<{
  readonly kind: string
  readonly message: string
}> {}

/** A relay's connection epoch ended (catalog watch closed, relay restarted); the next one starts over. */
export class EpochEnded extends Data.TaggedError("EpochEnded")<{ readonly message: string }> {}

export interface RelayState {
  readonly spec: RelaySpec
  readonly index: number
  client: RelayClient | undefined
  info: RelayInfo | undefined
  /** The dc id last learned; kept across epochs so the lane layout of the domains is stable. */
  knownDcId: DcId | undefined
  catalog: CatalogSnapshot | undefined
  /** The last epoch's catalog while the relay is away: its pools stay routing candidates (§7.1). */
  lastCatalog: CatalogSnapshot | undefined
  connected: boolean
  epochs: number
  lastError: string | undefined
  /** The first attempt to learn the relay finished (either way). */
  attempted: boolean
  health: RelayHealth
  /** Lanes whose stream failed and that have not installed a snapshot since. */
  readonly failingLanes: Set<LaneState>
  /** A pending check whether failing lanes mean failing streams (`STREAM_FAULT_SETTLE`). */
  streamCheck: boolean
}

/** Also the public `LaneStatus` (queries read these objects directly; they must not write). */
export interface LaneState {
  readonly lane: number
  /** The relay's name. */
  readonly relay: string
  readonly source: RelayState
  descriptor: DcPoolDescriptor
  ready: boolean
  installedSequence: bigint | undefined
  lease: LaneLease | undefined
  /** Completed (failed) by the domain's fault dispatcher for the current lease. */
  signal: Deferred.Deferred<never, LaneFault> | undefined
  fiber: Fiber.RuntimeFiber<never, never> | undefined
  faults: number
  readonly faultsByKind: Record<string, number>
  lastFault: string | undefined
  snapshotsInstalled: number
  deltasApplied: number
  resubscribes: number
  /** When the lane subscribes again after its last fault (clock ms). */
  retryAt: number
}

/** Also the public `DomainStatus`. */
export interface DomainState {
  readonly key: string
  readonly id: IndexerDomainId
  readonly format: DcCkfFormatIdentity
  readonly querySemantics: KvQuerySemantics
  readonly indexer: GlobalCkfIndexer
  readonly pool: GlobalCkfIngestionPool
  readonly scope: Scope.CloseableScope
  /** Relay index → dc id the manifest was built with. */
  readonly layout: string
  readonly lanes: Map<number, LaneState>
  broken: boolean
}

export interface DesiredEntry {
  readonly relay: RelayState
  readonly descriptor: DcPoolDescriptor
}

export const relayAnnotations = (relay: RelayState) => ({ relay: relay.spec.name, relayLane: relay.index })

export const laneAnnotations = (domain: DomainState, lane: LaneState) => ({
  relay: lane.relay,
  lane: lane.lane,
  domain: domain.id.toString(),
  producer: lane.descriptor.producer.key
})

export const sameCatalogContent = (a: CatalogSnapshot, b: CatalogSnapshot): boolean =>
  a.pools.length === b.pools.length && a.pools.every((pool, i) => poolDescriptorEquals(pool, b.pools[i]!))

export const ingestionText = (error: GlobalCkfIngestionError): string => `${error._tag}: ${error.message}`

export const faultText = (fault: GlobalCkfIngestionFault): string => {
  switch (fault._tag) {
    case "LaneDeactivated":
      return `lane deactivated (${fault.fault._tag})`
    case "OutstandingImageLimit":
      return `outstanding-image limit (${fault.requested} > ${fault.limit})`
    case "WorkerFailed":
      return `ingestion worker ${fault.worker} failed`
    default:
      return fault._tag
  }
}
