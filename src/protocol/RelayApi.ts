/**
 * The relay's HTTP documents (PROTOCOL.md §5): catalog, relay info, health, the pool-stream
 * subscribe request, error bodies, readiness, load windows, stats and the diagnostic snapshot.
 */

import * as HttpApi from "@effect/platform/HttpApi"
import * as HttpApiEndpoint from "@effect/platform/HttpApiEndpoint"
import * as HttpApiGroup from "@effect/platform/HttpApiGroup"
import * as HttpApiSchema from "@effect/platform/HttpApiSchema"
import * as OpenApi from "@effect/platform/OpenApi"
import { Either, ParseResult, Schema } from "effect"
import { DcId, ProducerIdentity } from "../ckf/identity.js"
import {
  CkfFormatJson,
  IdentitySourceJson,
  MAX_BUCKET_COUNT,
  POOL_IDENTITY_VERSION,
  PoolIdJson,
  ProducerIdentityJson,
  validateDcName
} from "./Identity.js"
import { DcIdHex, failType, U32, U64, WorkerIdJson } from "./Json.js"
import {
  CanonicalModelIdJson,
  type CatalogSnapshot,
  type DcPoolDescriptor,
  DcRelayIdentity,
  EndpointId,
  EndpointIdJson,
  EndpointTextJson,
  KvQuerySemantics,
  makePoolDescriptor,
  QuerySemanticsJson,
  RegistrationJson,
  type RelayInfo,
  WORKER_TYPES,
  WorkerRoleJson
} from "./Model.js"
import { POOL_STREAM_CONTENT_TYPE } from "./PoolStream.js"
import {
  dynamoQueryByHashEndpoint,
  dynamoQueryEndpoint,
  dynamoWorkersEndpoint,
  MemberTierBlocksFields,
  TierStatsJson,
  workerQueryEndpoint
} from "./RelayQueryApi.js"
import { openApiDocument } from "./Routes.js"
import { utf8Length } from "./Text.js"

// ---------------------------------------------------------------------------------------------
// Relay documents (§5)

const isPoolDescriptor = (u: unknown): u is DcPoolDescriptor =>
  typeof u === "object" &&
  u !== null &&
  "producer" in u &&
  u.producer instanceof ProducerIdentity &&
  "servingEndpoint" in u &&
  u.servingEndpoint instanceof EndpointId &&
  "querySemantics" in u &&
  u.querySemantics instanceof KvQuerySemantics &&
  "registrations" in u &&
  Array.isArray(u.registrations) &&
  "poolRoles" in u &&
  Array.isArray(u.poolRoles)

/** A pool descriptor in the catalog document (PROTOCOL §5). */
export const PoolDescriptorJson = Schema.transformOrFail(
  Schema.Struct({
    producer: ProducerIdentityJson,
    servingEndpoint: EndpointIdJson,
    registrations: Schema.Array(RegistrationJson),
    querySemantics: QuerySemanticsJson,
    poolRoles: Schema.Array(WorkerRoleJson)
  }),
  Schema.declare(isPoolDescriptor, { identifier: "DcPoolDescriptor" }),
  {
    strict: true,
    decode: (fields, _, ast, input) =>
      Either.match(makePoolDescriptor(fields), {
        onLeft: (error) => failType(ast, input, error.message),
        onRight: ParseResult.succeed
      }),
    encode: (descriptor) => ParseResult.succeed(descriptor)
  }
)

/** The relay's identity in JSON (`drtInstanceId`, `relayIncarnation`). */
export const RelayIdentityJson = Schema.transform(
  Schema.Struct({ drtInstanceId: U64, relayIncarnation: U64 }),
  Schema.instanceOf(DcRelayIdentity),
  {
    strict: true,
    decode: (fields) => new DcRelayIdentity(fields),
    encode: (identity) => ({
      drtInstanceId: identity.drtInstanceId,
      relayIncarnation: identity.relayIncarnation
    })
  }
).annotations({ identifier: "DcRelayIdentity" })

/** The protocol version every relay document carries. */
export const PROTOCOL_VERSION = 1 as const

const isCatalogSnapshot = (u: unknown): u is CatalogSnapshot =>
  typeof u === "object" &&
  u !== null &&
  "relay" in u &&
  u.relay instanceof DcRelayIdentity &&
  "revision" in u &&
  typeof u.revision === "bigint" &&
  "pools" in u &&
  Array.isArray(u.pools)

/** `GET /v1/catalog`; the catalog is a map by PoolId, so a repeated pool is an error. */
export const CatalogSnapshotJson = Schema.transformOrFail(
  Schema.Struct({
    protocolVersion: Schema.Literal(PROTOCOL_VERSION),
    relay: RelayIdentityJson,
    revision: U64,
    pools: Schema.Array(PoolDescriptorJson)
  }),
  Schema.declare(isCatalogSnapshot, { identifier: "CatalogSnapshot" }),
  {
    strict: true,
    decode: ({ relay, revision, pools }, _, ast, input) => {
      const seen = new Set<string>()
      for (const pool of pools) {
        const key = pool.producer.poolId.key
        if (seen.has(key))
          return failType(ast, input, `pools lists pool ${pool.producer.poolId} more than once`)
        seen.add(key)
      }
      return ParseResult.succeed({ relay, revision, pools })
    },
    encode: (catalog) =>
      ParseResult.succeed({
        protocolVersion: PROTOCOL_VERSION,
        relay: catalog.relay,
        revision: catalog.revision,
        pools: catalog.pools
      })
  }
)

const DcNameJson = Schema.String.pipe(
  Schema.filter((value) =>
    Either.match(validateDcName(value), { onLeft: (e) => e.message, onRight: () => true })
  )
)

const isRelayInfo = (u: unknown): u is RelayInfo =>
  typeof u === "object" &&
  u !== null &&
  "relay" in u &&
  u.relay instanceof DcRelayIdentity &&
  "dcName" in u &&
  typeof u.dcName === "string" &&
  "dcId" in u &&
  u.dcId instanceof DcId

/** `GET /v1/relay`. */
export const RelayInfoJson = Schema.transform(
  Schema.Struct({
    protocolVersion: Schema.Literal(PROTOCOL_VERSION),
    relay: RelayIdentityJson,
    dcName: DcNameJson,
    dcId: DcIdHex
  }),
  Schema.declare(isRelayInfo, { identifier: "RelayInfo" }),
  {
    strict: true,
    decode: ({ relay, dcName, dcId }) => ({ relay, dcName, dcId }),
    encode: (info) => ({
      protocolVersion: PROTOCOL_VERSION,
      relay: info.relay,
      dcName: info.dcName,
      dcId: info.dcId
    })
  }
)

/** The `reason`s an error body may carry (PROTOCOL §7). */
export const ERROR_REASONS = [
  "INVALID_REQUEST",
  "POOL_NOT_FOUND",
  "PRODUCER_CHANGED",
  "UNSUPPORTED_FEATURE",
  "RESOURCE_LIMIT",
  "PUBLICATION_UNAVAILABLE",
  "INTERNAL",
  "SUBSCRIBER_LAGGED",
  // PROTOCOL §7 ◆3, on both servers: an unknown route, and a body over the server's limit.
  "NOT_FOUND",
  "BODY_TOO_LARGE",
  // Global overlap answers (PROTOCOL §7 ◆3): a typo, an adapter never registered, an outage.
  "MODEL_NOT_FOUND",
  "ADAPTER_NOT_FOUND",
  "NO_READY_LANE",
  // A token file is configured and the request carries no accepted bearer token (PROTOCOL §1 ◆).
  "UNAUTHORIZED",
  // Terminal pool-stream frames only (relay-service §4.1); never an HTTP status body.
  "INVALID_PUBLICATION",
  "SNAPSHOT_PROGRESS_TIMEOUT"
] as const
/** One of `ERROR_REASONS`. */
export type ErrorReason = (typeof ERROR_REASONS)[number]

/** Body of an HTTP error and payload of a terminal stream frame. */
export const ErrorBodyJson = Schema.Struct({
  reason: Schema.Literal(...ERROR_REASONS),
  message: Schema.String
}).annotations({ identifier: "ErrorBody" })
/** An error response body: `{reason, message}`. */
export type ErrorBody = typeof ErrorBodyJson.Type

/** `discovery` of `GET /v1/health`: the backend's state and when it last changed (ISO-8601, UTC). */
export const DiscoveryStatusJson = Schema.Struct({
  state: Schema.Literal("live", "stale", "connecting"),
  since: Schema.Date
})

/** `GET /v1/health`. */
export const HealthJson = Schema.Struct({
  healthy: Schema.Boolean,
  shuttingDown: Schema.Boolean,
  endpointCount: U32,
  activeEndpointCount: U32,
  fencedEndpointCount: U32,
  sourcesRecovering: U32,
  sourcesDegraded: U32,
  sources: Schema.Struct({
    expected: U32,
    connecting: U32,
    live: U32,
    recovering: U32,
    degraded: U32,
    rejected: U32
  }),
  discovery: DiscoveryStatusJson
})
/** The relay's `GET /v1/health` document. */
export type Health = typeof HealthJson.Type

/** 1..=128 bytes of UTF-8 without control characters. */
export const SubscriberIdJson = Schema.String.pipe(
  Schema.filter((value) => {
    const bytes = utf8Length(value)
    if (bytes === 0 || bytes > 128) return `subscriberId must be 1..=128 bytes of UTF-8, got ${bytes}`
    return (
      !/\p{Cc}/u.test(value) || `subscriberId ${JSON.stringify(value)} must not contain control characters`
    )
  })
).annotations({ identifier: "SubscriberId" })

/** Body of `POST /v1/pools/subscribe`. */
export const SubscribeRequestJson = Schema.Struct({
  subscriberId: SubscriberIdJson,
  expectedProducer: ProducerIdentityJson
})
/** The body of a pool-stream subscription. */
export type SubscribeRequest = typeof SubscribeRequestJson.Type

// ---------------------------------------------------------------------------------------------

// ---------------------------------------------------------------------------------------------
// Relay HTTP documents (§5): unsupported producer keys, readiness, load, stats, snapshots

const isJsonObject = (u: unknown): u is Readonly<Record<string, unknown>> =>
  typeof u === "object" && u !== null && !Array.isArray(u)

const KNOWN_IDENTITY_SOURCES: ReadonlyArray<unknown> = IdentitySourceJson.literals

/**
 * Why a raw `ProducerIdentity` names a feature this relay does not implement (relay-service
 * §4.6 `is_unsupported`): a non-zero unknown identity or format version, fingerprint width or
 * slot count, an unknown identity source, or a bucket count above the CBI1 maximum. Zero and
 * ill-typed values are malformed, not unsupported; `undefined` when nothing is unsupported.
 */
export const unsupportedProducerFeature = (input: unknown): string | undefined => {
  if (!isJsonObject(input)) return undefined
  const unsupported = (path: string, value: unknown, expected: string) =>
    `${path} ${JSON.stringify(value)} is not supported by this relay (expected ${expected})`
  const poolId = input["poolId"]
  if (isJsonObject(poolId)) {
    const version = poolId["identityVersion"]
    if (typeof version === "number" && version !== 0 && version !== POOL_IDENTITY_VERSION)
      return unsupported("poolId.identityVersion", version, String(POOL_IDENTITY_VERSION))
    for (const field of ["cacheSemantics", "routingScope"] as const) {
      const digest = poolId[field]
      const source = isJsonObject(digest) ? digest["source"] : undefined
      if (typeof source === "string" && source !== "" && !KNOWN_IDENTITY_SOURCES.includes(source))
        return unsupported(`poolId.${field}.source`, source, '"default_derived" or "explicit"')
    }
  }
  const format = input["format"]
  if (isJsonObject(format)) {
    const fixed = [
      ["formatVersion", 1],
      ["fingerprintBits", 16],
      ["slotsPerBucket", 4]
    ] as const
    for (const [field, expected] of fixed) {
      const value = format[field]
      if (typeof value === "number" && value !== 0 && value !== expected)
        return unsupported(`format.${field}`, value, String(expected))
    }
    const buckets = format["bucketCount"]
    if (typeof buckets === "number" && Number.isInteger(buckets) && buckets > MAX_BUCKET_COUNT)
      return unsupported("format.bucketCount", buckets, `at most ${MAX_BUCKET_COUNT}`)
  }
  return undefined
}

/** `UNKNOWN` is a valid state: the relay has no authoritative availability for the group yet. */
export const READINESS_STATES = ["READY", "UNAVAILABLE", "UNKNOWN"] as const
/** A readiness state in JSON. */
export const ReadinessStateJson = Schema.Literal(...READINESS_STATES)

/** A role a worker card can declare (no `legacy`): the evaluator's present and missing roles. */
export const WorkerTypeRoleJson = Schema.Literal(...WORKER_TYPES)

/** One serving endpoint of a readiness entry, with its roles. */
export const TopologyMemberJson = Schema.Struct({
  endpoint: EndpointIdJson,
  roles: Schema.Array(WorkerRoleJson),
  /** Present only when the endpoint's pool generation matches its current membership. */
  poolId: Schema.optional(PoolIdJson)
})

/** The readiness of one LoRA adapter of a readiness entry. */
export const AdapterReadinessJson = Schema.Struct({
  canonicalModelId: CanonicalModelIdJson,
  state: ReadinessStateJson,
  missingRoles: Schema.Array(WorkerTypeRoleJson)
})

/** One readiness entry: a model in a namespace, its state and members. */
export const TopologyEntryJson = Schema.Struct({
  namespace: Schema.String,
  canonicalModelId: CanonicalModelIdJson,
  state: ReadinessStateJson,
  presentRoles: Schema.Array(WorkerTypeRoleJson),
  missingRoles: Schema.Array(WorkerTypeRoleJson),
  members: Schema.Array(TopologyMemberJson),
  /** Only `prefill` / `decode` (relay-service §11: consumers reject any other role here). */
  duplicateRoleEndpoints: Schema.Array(Schema.Literal("prefill", "decode")),
  legacyFallbackActive: Schema.Boolean,
  adapters: Schema.Array(AdapterReadinessJson)
})
/** A readiness entry as decoded. */
export type TopologyEntryDocument = typeof TopologyEntryJson.Type

/** `GET /v1/readiness` and every `event: readiness` of `/v1/readiness/watch`. */
export const ReadinessJson = Schema.Struct({
  revision: U64,
  entries: Schema.Array(TopologyEntryJson)
})
/** The relay's readiness document as decoded. */
export type ReadinessDocument = typeof ReadinessJson.Type

/** One pool of a load window; unknown sums are sent as 0 (observed < expected marks them). */
export const LoadPoolJson = Schema.Struct({
  producer: ProducerIdentityJson,
  kvUsedBlocks: U64,
  totalKvBlocks: U64,
  kvObservedRanks: U32,
  kvExpectedRanks: U32,
  // ◆3 engine load (§5): sums and the mean over the observed ranks, absent when unknown.
  runningRequests: Schema.optionalWith(Schema.Number, { exact: true }),
  waitingRequests: Schema.optionalWith(Schema.Number, { exact: true }),
  kvUsage: Schema.optionalWith(Schema.Number, { exact: true }),
  /** A window from a relay before revision 3 has none: no rank observed. */
  loadObservedRanks: Schema.optionalWith(U32, { default: () => 0 })
})

/** Every `event: load` of `/v1/load/watch`. */
export const LoadWindowJson = Schema.Struct({
  windowSequence: U64,
  observedMs: U64,
  windowMs: U64,
  pools: Schema.Array(LoadPoolJson)
})
/** One load window as decoded. */
export type LoadWindowDocument = typeof LoadWindowJson.Type

/** `undefined` in the domain value, `null` in JSON. */
export const nullable = <A, I>(schema: Schema.Schema<A, I, never>) =>
  Schema.transform(Schema.NullOr(schema), Schema.UndefinedOr(Schema.typeSchema(schema)), {
    strict: true,
    decode: (value) => value ?? undefined,
    encode: (value) => value ?? null
  })

/** A count in a stats document (a JSON number). */
export const Count = Schema.Number

/** The lifecycle states of a serving endpoint's slot, as `GET /v1/stats` reports them. */
export const SLOT_LIFECYCLES = [
  "discovered",
  "starting",
  "active",
  "draining",
  "fenced",
  "lightweight"
] as const

/** A source's last engine-metrics read and its error (PROTOCOL §5 ◆3); a time absent: none yet. */
export const SourceMetricsJson = Schema.Struct({
  url: Schema.String,
  lastReadAt: Schema.optional(Schema.Date),
  lastSuccessAt: Schema.optional(Schema.Date),
  error: Schema.optional(Schema.Struct({ reason: Schema.String, message: Schema.String }))
})

/** One serving endpoint's counters in `GET /v1/stats`. */
export const EndpointStatsJson = Schema.Struct({
  servingEndpoint: EndpointTextJson,
  lifecycle: Schema.Literal(...SLOT_LIFECYCLES),
  layoutGeneration: U64,
  membershipConflicts: Schema.Array(Schema.String),
  models: Schema.Array(Schema.String),
  aliases: Schema.Array(Schema.String),
  roles: Schema.Array(Schema.String),
  aggregation: nullable(
    Schema.Struct({
      members: Schema.Array(
        Schema.Struct({ workerId: WorkerIdJson, dpRank: U32, blocks: Count, ...MemberTierBlocksFields })
      ),
      contributionCount: Count,
      uniqueBlockCount: Count,
      unknownRemovals: Count,
      capacityFailures: Count,
      parentNotFound: Count,
      unanchoredRemovals: Count,
      occupiedBucketCount: Count,
      occupiedSlotCount: Count
    })
  ),
  publication: nullable(
    Schema.Struct({
      sequence: U64,
      pendingEvents: Count,
      emittedImages: Count,
      publicationCount: Count,
      unchangedPublicationCount: Count,
      physicalTouches: Count,
      distinctTouchedBuckets: Count,
      netRevertedBuckets: Count
    })
  ),
  memory: nullable(
    Schema.Struct({
      filterBytes: Count,
      dirtyTrackingBytes: Count,
      ownershipBytes: Count,
      lineageEntries: Count,
      lineageBytes: Count,
      memberSetCapacity: Count,
      refcountCapacity: Count,
      insertionScratchCapacity: Count
    })
  ),
  tiers: nullable(TierStatsJson),
  recovery: Schema.Struct({
    degradedResets: Count,
    rebuildCount: Count,
    rebuildTotalMs: Count,
    rebuildMaxMs: Count,
    workerCount: Count,
    rankCount: Count,
    recoveringRankCount: Count,
    pendingLiveEventCount: Count,
    sourcesRecovering: Count,
    sourcesDegraded: Count,
    sources: Schema.Array(
      Schema.Struct({
        workerId: Schema.String,
        dpRank: Count,
        publisherId: U64,
        state: Schema.Literal("live", "recovering", "degraded")
      })
    )
  }),
  actor: nullable(
    Schema.Struct({
      mailboxDepth: Count,
      mailboxCapacity: Count,
      activeCommand: nullable(Schema.String),
      shuttingDown: Schema.Boolean,
      lastError: nullable(Schema.String)
    })
  ),
  ingest: Schema.Struct({
    events: Count,
    blocks: Count,
    malformed: Count,
    gaps: Count,
    recoveries: Count,
    malformedByReason: Schema.Record({ key: Schema.String, value: Count }),
    skipped: Schema.Struct({ medium: Count, locality: Count, ownership: Count, group: Count }),
    stale: Count,
    restarts: Count,
    unanchored: Count
  }),
  sources: Schema.Array(
    Schema.Struct({
      workerId: WorkerIdJson,
      dpRank: U32,
      publisherId: U64,
      transportEndpoint: Schema.String,
      state: Schema.Literal("connecting", "live", "recovering", "degraded", "rejected"),
      since: Schema.Date,
      history: Schema.Literal("complete", "partial"),
      reason: Schema.optional(Schema.String),
      /** ◆3 the source's engine-metrics reads (§5); absent without `metricsUrl`. */
      metrics: Schema.optional(SourceMetricsJson)
    })
  )
})

/** `GET /v1/stats`. */
export const RelayStatsJson = Schema.Struct({
  identity: Schema.Struct({
    dcName: Schema.String,
    dcId: DcIdHex,
    drtInstanceId: U64,
    relayIncarnation: U64
  }),
  endpoints: Schema.Array(EndpointStatsJson)
})

/** `[lo, hi]` u32 pairs ↔ base64 of the little-endian u64 words. */
export const BucketWordsBase64 = Schema.transformOrFail(
  Schema.Uint8ArrayFromBase64,
  Schema.declare((u): u is Uint32Array => u instanceof Uint32Array, { identifier: "Uint32Array" }),
  {
    strict: true,
    decode: (bytes, _, ast) => {
      if (bytes.length % 8 !== 0)
        return failType(ast, bytes, `buckets must be whole u64 words, got ${bytes.length} bytes`)
      const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength)
      const words = new Uint32Array(bytes.length / 4)
      for (let i = 0; i < words.length; i++) words[i] = view.getUint32(4 * i, true)
      return ParseResult.succeed(words)
    },
    encode: (words) => {
      const bytes = new Uint8Array(words.length * 4)
      const view = new DataView(bytes.buffer)
      for (let i = 0; i < words.length; i++) view.setUint32(4 * i, words[i]!, true)
      return ParseResult.succeed(bytes)
    }
  }
).annotations({ identifier: "BucketWords" })

/** `GET /v1/endpoints/{ns.component.endpoint}/snapshot`. */
export const DiagnosticSnapshotJson = Schema.Struct({
  layoutGeneration: U64,
  sequence: U64,
  memberCount: Count,
  uniqueBlockCount: Count,
  format: CkfFormatJson,
  buckets: BucketWordsBase64
})
/** The diagnostic snapshot document as decoded. */
export type DiagnosticSnapshotDocument = typeof DiagnosticSnapshotJson.Type

// ---------------------------------------------------------------------------------------------

// ---------------------------------------------------------------------------------------------
// The routes (§5)

/** The `{reason, message}` body of an error sent with `status`, for an endpoint's `addError`. */
export const errorWith = (status: number) => [ErrorBodyJson, { status }] as const

/** `GET /`: the status page, on both servers. */
export const statusPageEndpoint = HttpApiEndpoint.get("statusPage", "/")
  .addSuccess(HttpApiSchema.Text({ contentType: "text/html" }))
  .annotate(OpenApi.Summary, "The status page (HTML)")

/** `GET /healthz`, on both servers: the one route no bearer token guards. */
export const healthzEndpoint = HttpApiEndpoint.get("healthz", "/healthz")
  .addSuccess(HttpApiSchema.Text({ contentType: "text/plain" }))
  .annotate(OpenApi.Summary, "Liveness: `ok` while the process serves")

/** `GET /metrics`, on both servers. */
export const metricsEndpoint = HttpApiEndpoint.get("metrics", "/metrics")
  .addSuccess(HttpApiSchema.Text({ contentType: "text/plain" }))
  .addError(...errorWith(500))
  .annotate(OpenApi.Summary, "Prometheus exposition")

/** `GET /v1/openapi.json`, on both servers: the server's routes as an OpenAPI 3.1 document. */
export const openApiEndpoint = HttpApiEndpoint.get("openApi", "/v1/openapi.json")
  .addSuccess(Schema.Unknown)
  .annotate(OpenApi.Summary, "This document")

/** Server-sent events (`text/event-stream`); the events' data are the documents named per route. */
const SseBody = HttpApiSchema.Text({ contentType: "text/event-stream" })

/** `?subscriber=ID`: who asks (logged with the stream); required by the catalog watch only. */
const subscriberParam = Schema.Struct({ subscriber: SubscriberIdJson })
const optionalSubscriberParam = Schema.Struct({ subscriber: Schema.optional(SubscriberIdJson) })

/**
 * The relay's routes as one declaration: method, path, the documents each takes and answers, and
 * the statuses of its `{reason, message}` errors. The server routes by it (`relay/http`), and
 * `GET /v1/openapi.json` serves it as an OpenAPI document. Every route but `GET /healthz` answers
 * 401 `UNAUTHORIZED` when the relay requires a bearer token. An unknown path answers 404
 * `NOT_FOUND`, a known path asked with another method 405 with `Allow`.
 */
export const RelayHttpApi = HttpApi.make("relay")
  .add(
    HttpApiGroup.make("relay", { topLevel: true })
      .add(statusPageEndpoint)
      .add(healthzEndpoint)
      .add(
        HttpApiEndpoint.get("health", "/v1/health")
          .addSuccess(HealthJson)
          .addError(HealthJson, { status: 503 })
          .annotate(OpenApi.Summary, "Health; 503 with the same document when unhealthy")
      )
      .add(HttpApiEndpoint.get("relayInfo", "/v1/relay").addSuccess(RelayInfoJson))
      .add(HttpApiEndpoint.get("catalog", "/v1/catalog").addSuccess(CatalogSnapshotJson))
      .add(
        HttpApiEndpoint.get("catalogWatch", "/v1/catalog/watch")
          .setUrlParams(subscriberParam)
          .addSuccess(SseBody)
          .addError(...errorWith(400))
          .addError(...errorWith(429))
          .annotate(OpenApi.Summary, "`catalog` events (a catalog document each) and `: heartbeat` comments")
      )
      .add(
        HttpApiEndpoint.post("poolSubscribe", "/v1/pools/subscribe")
          .setPayload(SubscribeRequestJson)
          .addSuccess(HttpApiSchema.Uint8Array({ contentType: POOL_STREAM_CONTENT_TYPE }))
          .addError(...errorWith(400))
          .addError(...errorWith(404))
          .addError(...errorWith(409))
          .addError(...errorWith(413))
          .addError(...errorWith(422))
          .addError(...errorWith(429))
          .addError(...errorWith(503))
          .annotate(OpenApi.Summary, "A pool stream: CBI1 snapshot chunks, then deltas (PROTOCOL §5, §6)")
      )
      .add(HttpApiEndpoint.get("readiness", "/v1/readiness").addSuccess(ReadinessJson))
      .add(
        HttpApiEndpoint.get("readinessWatch", "/v1/readiness/watch")
          .setUrlParams(optionalSubscriberParam)
          .addSuccess(SseBody)
          .addError(...errorWith(400))
          .addError(...errorWith(429))
          .annotate(OpenApi.Summary, "`readiness` events (a readiness document each)")
      )
      .add(
        HttpApiEndpoint.get("loadWatch", "/v1/load/watch")
          .setUrlParams(optionalSubscriberParam)
          .addSuccess(SseBody)
          .addError(...errorWith(400))
          .addError(...errorWith(429))
          .addError(...errorWith(503))
          .annotate(
            OpenApi.Summary,
            "`load` events (a load window each); an `error` event ends a lagged stream"
          )
      )
      .add(
        HttpApiEndpoint.get("stats", "/v1/stats")
          .addSuccess(RelayStatsJson)
          .addError(...errorWith(500))
      )
      .add(
        HttpApiEndpoint.get("endpointSnapshot", "/v1/endpoints/:endpoint/snapshot")
          .setPath(Schema.Struct({ endpoint: Schema.String }))
          .addSuccess(DiagnosticSnapshotJson)
          .addError(...errorWith(400))
          .addError(...errorWith(404))
          .addError(...errorWith(429))
          .addError(...errorWith(503))
          .annotate(OpenApi.Summary, "A serving endpoint's filter words at a barrier (diagnostics)")
      )
      .add(
        HttpApiEndpoint.post("flush", "/v1/flush")
          .addSuccess(HttpApiSchema.NoContent)
          .addError(...errorWith(404))
          .addError(...errorWith(503))
          .annotate(OpenApi.Summary, "Publish every pool's pending changes now")
      )
      .add(workerQueryEndpoint)
      .add(dynamoQueryEndpoint)
      .add(dynamoQueryByHashEndpoint)
      .add(dynamoWorkersEndpoint)
      .add(metricsEndpoint)
      .add(
        HttpApiEndpoint.get("openApi", "/v1/openapi.json")
          .addSuccess(Schema.Unknown)

          .annotate(OpenApi.Summary, "This document")
      )
  )
  .addError(...errorWith(401))
  .annotate(OpenApi.Title, "kvrelay relay")
  .annotate(OpenApi.Version, "1")
  .annotate(OpenApi.Description, "The relay's HTTP API (PROTOCOL.md §5).")

/** `GET /v1/openapi.json`: the routes above as an OpenAPI 3.1 document. */
export const relayOpenApi = (): OpenApi.OpenAPISpec => openApiDocument(RelayHttpApi)
