/**
 * KV event sources as discovery advertises them, and the per-endpoint membership view the
 * source supervisor reconciles against (relay-service.md §2.7).
 */

import type { DpRank, WorkerId } from "./events.js"
import type { KvEventSource } from "./json.js"
import type { EndpointId } from "./model.js"

export type { KvEventSource, KvEventTransport } from "./json.js"

/** Key of one (worker, dp rank): `${workerId}/${dpRank}`. */
export type RankKey = string
export const rankKey = (workerId: WorkerId, dpRank: DpRank): RankKey => `${workerId}/${dpRank}`

export type KvSourceAmbiguity =
  | { readonly _tag: "Incarnations"; readonly publisherIds: ReadonlyArray<bigint> }
  | { readonly _tag: "ConflictingDescriptor"; readonly publisherId: bigint }
  | { readonly _tag: "EndpointMapping"; readonly endpoints: ReadonlyArray<EndpointId> }

export type KvSourceStatus =
  | { readonly _tag: "Missing" }
  | { readonly _tag: "ActiveRecoverable"; readonly source: KvEventSource }
  | { readonly _tag: "ActiveLiveOnly"; readonly source: KvEventSource }
  | { readonly _tag: "Ambiguous"; readonly reason: KvSourceAmbiguity }

export const activeSource = (status: KvSourceStatus): KvEventSource | undefined =>
  status._tag === "ActiveRecoverable" || status._tag === "ActiveLiveOnly" ? status.source : undefined

/**
 * Whether a source can be queried for recovery: a worker-query target for `dynamo-zmq`, or a
 * replay endpoint for `engine-zmq`.
 */
export const isRecoverableSource = (source: KvEventSource): boolean =>
  source.recoveryTarget !== null ||
  (source.transport.kind === "engine-zmq" && source.transport.replayEndpoint !== null)

export type KvStateEndpointResolution =
  | { readonly _tag: "Resolved"; readonly endpoint: EndpointId }
  | { readonly _tag: "Ambiguous"; readonly endpoints: ReadonlyArray<EndpointId> }

export interface ExpectedRank {
  readonly workerId: WorkerId
  readonly dpRank: DpRank
  readonly status: KvSourceStatus
  /** Cumulative lifecycle generation: bumps whenever the rank needs a reset before its next source. */
  readonly lifecycleGeneration: number
  /** The worker runs a local indexer (`enableLocalIndexer`), so recovery is expected to be possible. */
  readonly recoveryExpected: boolean
}

/** The KV-source view of one serving endpoint: only ranks its runtime configs expect appear. */
export interface KvSourceMembershipView {
  readonly servingEndpoint: EndpointId
  readonly endpointResolution: KvStateEndpointResolution
  readonly ranks: ReadonlyMap<RankKey, ExpectedRank>
}

/** Identity of one source incarnation and its transport (a change of any part is a new source). */
export const sourceIdentityKey = (source: KvEventSource): string => {
  const t = source.transport
  const replay = t.kind === "engine-zmq" ? (t.replayEndpoint ?? "") : ""
  return `${source.workerId}/${source.dpRank}@${source.publisherId}|${t.kind}|${t.endpoint}|${t.topic}|${replay}`
}
