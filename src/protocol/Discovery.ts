/**
 * Discovery records (PROTOCOL.md §2): model cards, runtime configs, KV event sources and the
 * discovery document, and the per-endpoint view of expected sources that the source supervisor
 * reconciles against (relay-service.md §2.7).
 */

import { Either, Schema } from "effect"
import type { DpRank, WorkerId } from "./Events.js"
import { validateExplicitMap } from "./Identity.js"
import { NonEmptyString, U32, U64, WorkerIdJson } from "./Json.js"
import { type EndpointId, EndpointTextJson, endpointPart, WORKER_TYPES } from "./Model.js"

// ---------------------------------------------------------------------------------------------
// Discovery records (§2)

/** A worker type on a model card. */
export const WorkerTypeJson = Schema.Literal(...WORKER_TYPES)

const ExplicitMapJson = Schema.Record({ key: Schema.String, value: Schema.String })

/** A card's explicit identity maps for its indexer domain (semantics and routing scope). */
export const IndexerIdentityJson = Schema.Struct({
  semantics: Schema.optional(ExplicitMapJson),
  routingScope: Schema.optional(ExplicitMapJson)
}).pipe(
  Schema.filter((spec) => {
    for (const field of ["semantics", "routingScope"] as const) {
      const map = spec[field]
      if (map === undefined) continue
      const checked = validateExplicitMap(field, map)
      if (Either.isLeft(checked)) return checked.left.message
    }
    return true
  })
)

/** A LoRA adapter a card declares. */
export const LoraJson = Schema.Struct({ name: Schema.String, maxGpuLoraCount: Schema.optional(U32) })

const nullDefault = { default: () => null } as const

/** `ModelRuntimeConfig`; every field has the reference's default when absent (relay-service §2.2). */
export const RuntimeConfigJson = Schema.Struct({
  dataParallelStartRank: Schema.optionalWith(U32, { default: () => 0 }),
  dataParallelSize: Schema.optionalWith(U32, { default: () => 1 }),
  enableLocalIndexer: Schema.optionalWith(Schema.Boolean, { default: () => true }),
  /** null = the serving endpoint. */
  kvStateEndpoint: Schema.optionalWith(Schema.NullOr(EndpointTextJson), nullDefault),
  enableEagle: Schema.optionalWith(Schema.Boolean, { default: () => false }),
  totalKvBlocks: Schema.optionalWith(Schema.NullOr(U64), nullDefault),
  maxNumBatchedTokens: Schema.optionalWith(Schema.NullOr(U64), nullDefault),
  maxNumSeqs: Schema.optionalWith(Schema.NullOr(U64), nullDefault),
  contextLength: Schema.optionalWith(Schema.NullOr(U32), nullDefault)
})
/** A card's runtime settings (data-parallel ranks, block counts, local indexer). */
export type RuntimeConfig = typeof RuntimeConfigJson.Type

/** The runtime settings of a card that declares none. */
export const DEFAULT_RUNTIME_CONFIG: RuntimeConfig = {
  dataParallelStartRank: 0,
  dataParallelSize: 1,
  enableLocalIndexer: true,
  kvStateEndpoint: null,
  enableEagle: false,
  totalKvBlocks: null,
  maxNumBatchedTokens: null,
  maxNumSeqs: null,
  contextLength: null
}

/**
 * The card fields the relay reads. `name` and `aliases` stay raw strings: an invalid name is a
 * soft error of membership projection (a conflict or a dropped alias), not a malformed card.
 */
export const ModelCardJson = Schema.Struct({
  name: Schema.String,
  sourcePath: Schema.String,
  /** 0 decodes; identity resolution reports it as `ZeroBlockSize`. */
  kvCacheBlockSize: U32,
  aliases: Schema.optionalWith(Schema.Array(Schema.String), { default: () => [] }),
  /** null = legacy. */
  workerType: Schema.optionalWith(Schema.NullOr(WorkerTypeJson), nullDefault),
  lora: Schema.optionalWith(Schema.NullOr(LoraJson), nullDefault),
  indexerIdentity: Schema.optionalWith(Schema.NullOr(IndexerIdentityJson), nullDefault),
  runtimeConfig: Schema.optionalWith(RuntimeConfigJson, { default: () => DEFAULT_RUNTIME_CONFIG })
})
/** A model card as decoded (PROTOCOL §2). */
export type ModelCard = typeof ModelCardJson.Type

/** One model card instance: one per worker per model; `modelSuffix` marks a LoRA adapter card. */
export const ModelCardInstanceJson = Schema.Struct({
  namespace: endpointPart("namespace"),
  component: endpointPart("component"),
  endpoint: endpointPart("endpoint"),
  instanceId: WorkerIdJson,
  modelSuffix: Schema.optionalWith(Schema.NullOr(Schema.String), nullDefault),
  card: ModelCardJson
})
/** One advertised instance of a model card. */
export type ModelCardInstance = typeof ModelCardInstanceJson.Type

/** A Dynamo event-plane source: a ZeroMQ PUB endpoint and its topic. */
export const DynamoZmqTransportJson = Schema.Struct({
  kind: Schema.Literal("dynamo-zmq"),
  endpoint: NonEmptyString,
  topic: Schema.String
})

/** An engine's own KV event publisher, with its optional replay endpoint. */
export const EngineZmqTransportJson = Schema.Struct({
  kind: Schema.Literal("engine-zmq"),
  endpoint: NonEmptyString,
  topic: Schema.String,
  replayEndpoint: Schema.optionalWith(Schema.NullOr(NonEmptyString), nullDefault)
})

/** How a KV event source publishes: `dynamo-zmq` or `engine-zmq`. */
export const KvEventTransportJson = Schema.Union(DynamoZmqTransportJson, EngineZmqTransportJson)
/** A KV event source's transport as decoded. */
export type KvEventTransport = typeof KvEventTransportJson.Type

/** One KV event source advertisement: one per worker rank publisher incarnation. */
export const KvEventSourceJson = Schema.Struct({
  kvStateEndpoint: EndpointTextJson,
  workerId: WorkerIdJson,
  dpRank: U32,
  publisherId: U64,
  transport: KvEventTransportJson,
  /** null = live only (no worker-query recovery). */
  recoveryTarget: Schema.optionalWith(
    Schema.NullOr(Schema.Struct({ endpoint: NonEmptyString })),
    nullDefault
  ),
  /**
   * ◆3 The engine's Prometheus endpoint, read for engine load (§5). Absent or null: no engine
   * load. Any text decodes: a URL the relay cannot read is that source's read error in
   * `/v1/stats`, never a reason to drop its events.
   */
  metricsUrl: Schema.optionalWith(Schema.NullOr(Schema.String), { exact: true })
})
/** One KV event source advertisement as decoded: one worker rank's publisher. */
export type KvEventSource = typeof KvEventSourceJson.Type

/** The file backend's document. */
export const DiscoveryDocumentJson = Schema.Struct({
  version: Schema.Literal(1),
  cards: Schema.Array(ModelCardInstanceJson),
  sources: Schema.Array(KvEventSourceJson)
})
/** The discovery file document as decoded. */
export type DiscoveryDocument = typeof DiscoveryDocumentJson.Type

// ---------------------------------------------------------------------------------------------

/** Key of one (worker, dp rank): `${workerId}/${dpRank}`. */
export type RankKey = string
/** The key of a worker rank in maps: `workerId/dpRank`. */
export const rankKey = (workerId: WorkerId, dpRank: DpRank): RankKey => `${workerId}/${dpRank}`

type KvSourceAmbiguity =
  | { readonly _tag: "Incarnations"; readonly publisherIds: ReadonlyArray<bigint> }
  | { readonly _tag: "ConflictingDescriptor"; readonly publisherId: bigint }
  | { readonly _tag: "EndpointMapping"; readonly endpoints: ReadonlyArray<EndpointId> }

/**
 * What discovery says about a rank's event source: missing, active (with or without recovery), or
 * ambiguous.
 */
export type KvSourceStatus =
  | { readonly _tag: "Missing" }
  | { readonly _tag: "ActiveRecoverable"; readonly source: KvEventSource }
  | { readonly _tag: "ActiveLiveOnly"; readonly source: KvEventSource }
  | { readonly _tag: "Ambiguous"; readonly reason: KvSourceAmbiguity }

/** The rank's source when discovery names exactly one, else undefined. */
export const activeSource = (status: KvSourceStatus): KvEventSource | undefined =>
  status._tag === "ActiveRecoverable" || status._tag === "ActiveLiveOnly" ? status.source : undefined

/**
 * Whether a source can be queried for recovery: a worker-query target for `dynamo-zmq`, or a
 * replay endpoint for `engine-zmq`.
 */
export const isRecoverableSource = (source: KvEventSource): boolean =>
  source.recoveryTarget !== null ||
  (source.transport.kind === "engine-zmq" && source.transport.replayEndpoint !== null)

/**
 * The KV state endpoint a serving endpoint's sources publish under: one, or several (ambiguous).
 */
export type KvStateEndpointResolution =
  | { readonly _tag: "Resolved"; readonly endpoint: EndpointId }
  | { readonly _tag: "Ambiguous"; readonly endpoints: ReadonlyArray<EndpointId> }

/** A worker rank discovery expects events from, with its source's status. */
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
