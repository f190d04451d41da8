/**
 * The global consumer's HTTP documents (PROTOCOL.md §7): overlap queries and answers, domains,
 * health and stats.
 */

import * as HttpApi from "@effect/platform/HttpApi"
import * as HttpApiEndpoint from "@effect/platform/HttpApiEndpoint"
import * as HttpApiGroup from "@effect/platform/HttpApiGroup"
import * as OpenApi from "@effect/platform/OpenApi"
import { Schema } from "effect"
import {
  CacheSemanticsJson,
  IndexerDomainJson,
  PoolIdJson,
  ProducerIdentityJson,
  RoutingScopeJson,
  shown
} from "./Identity.js"
import { DcIdHex, U32, U64 } from "./Json.js"
import {
  CanonicalModelIdJson,
  EndpointIdJson,
  EndpointTextJson,
  endpointPartProblem,
  QuerySemanticsJson
} from "./Model.js"
import {
  Count,
  ErrorBodyJson,
  errorWith,
  healthzEndpoint,
  metricsEndpoint,
  nullable,
  openApiEndpoint,
  statusPageEndpoint
} from "./RelayApi.js"
import {
  RouteAnswerJson,
  RouteBatchAnswerJson,
  RouteBatchJson,
  RoutePolicyFieldJson,
  RouteUnavailableJson
} from "./RouteApi.js"
import { openApiDocument } from "./Routes.js"

// ---------------------------------------------------------------------------------------------
// Global consumer documents (§7)

const modelNamespaceJson = Schema.String.pipe(
  Schema.filter((value) => endpointPartProblem(value, "namespace")?.message ?? true)
)

/** Local block hashes as a router computed them (u64 decimal strings, or numbers ≤ 2^53). */
export const BlockHashesJson = Schema.Array(U64)

/** The index of the first element of `values` that is not a u32, or -1. */
const firstNonU32 = (values: ReadonlyArray<unknown>): number => {
  for (let i = 0; i < values.length; i++) {
    const v = values[i]
    if (typeof v !== "number" || !Number.isInteger(v) || v < 0 || v > 0xffff_ffff) return i
  }
  return -1
}

/**
 * A prompt's token ids, u32 each. One pass over the array rather than a schema per element:
 * prompts run to many thousands of tokens and this sits on the query path.
 */
export const TokenIdsJson = Schema.declare(
  (input: unknown): input is ReadonlyArray<number> => Array.isArray(input) && firstNonU32(input) < 0,
  {
    identifier: "TokenIds",
    jsonSchema: { type: "array", items: { type: "integer", minimum: 0, maximum: 0xffff_ffff } },
    message: (issue) => {
      const actual = issue.actual
      if (!Array.isArray(actual)) return "tokens must be an array of u32 token ids"
      const at = firstNonU32(actual)
      return `tokens[${at}] is not a u32 token id: ${shown(actual[at])}`
    }
  }
)

/** The adapter whose blocks a token query asks for; absent, null or "" is the base model. */
const LoraNameJson = Schema.optional(Schema.NullOr(Schema.String))

const byModel = { namespace: modelNamespaceJson, model: CanonicalModelIdJson }
const byDomain = { poolDomain: IndexerDomainJson }

/** `POST /v1/overlap` forms (PROTOCOL §7): by model or by pool domain, by tokens or by local hashes. */
export const ModelTokensOverlapJson = Schema.Struct({
  ...byModel,
  tokens: TokenIdsJson,
  loraName: LoraNameJson
})
/** An overlap query by model with the caller's local block hashes. */
export const ModelLocalOverlapJson = Schema.Struct({ ...byModel, localBlockHashes: BlockHashesJson })
/** An overlap query by indexer domain with tokens. */
export const DomainTokensOverlapJson = Schema.Struct({
  ...byDomain,
  tokens: TokenIdsJson,
  loraName: LoraNameJson
})
/** An overlap query by indexer domain with the caller's local block hashes. */
export const DomainLocalOverlapJson = Schema.Struct({ ...byDomain, localBlockHashes: BlockHashesJson })

/** `POST /v1/overlap/batch`: the queries, 1 to 256, each decoded on its own. */
export const MAX_OVERLAP_BATCH = 256
/** The body of `POST /v1/overlap/batch`: up to 256 overlap queries. */
export const OverlapBatchJson = Schema.Struct({
  queries: Schema.Array(
    Schema.Unknown.annotations({ description: "an overlap body, as POST /v1/overlap takes it" })
  ).pipe(
    Schema.filter(
      (queries) =>
        (queries.length >= 1 && queries.length <= MAX_OVERLAP_BATCH) ||
        `queries must hold 1 to ${MAX_OVERLAP_BATCH} overlap bodies, got ${queries.length}`
    )
  )
})

/** One lane's answer to an overlap query. */
export const OverlapResultJson = Schema.Struct({
  relay: Schema.String,
  lane: U32,
  poolId: PoolIdJson,
  servingEndpoint: EndpointIdJson,
  prefixDepth: U32,
  matchedTokens: Schema.Number
})

/** The answer to `POST /v1/overlap`: one result per ready lane. */
export const OverlapResponseJson = Schema.Struct({ results: Schema.Array(OverlapResultJson) })
/** An overlap answer as decoded. */
export type OverlapResponse = typeof OverlapResponseJson.Type

/** The answer to `POST /v1/overlap/batch`: the results of each query, in order. */
export const OverlapBatchResponseJson = Schema.Struct({
  results: Schema.Array(Schema.Array(OverlapResultJson)),
  /** Per query: null, or the error the query would get from `POST /v1/overlap`. */
  errors: Schema.Array(Schema.NullOr(ErrorBodyJson))
})

/** One lane of an indexer domain in `GET /v1/domains`. */
export const DomainLaneJson = Schema.Struct({
  lane: U32,
  relay: Schema.String,
  poolId: PoolIdJson,
  producer: ProducerIdentityJson,
  servingEndpoint: EndpointIdJson,
  ready: Schema.Boolean,
  /** null while the lane is not ready. */
  installedSequence: Schema.NullOr(U64)
})

/** A base model a domain serves (PROTOCOL §7 ◆3): its aliases and the adapters on it. */
export const DomainModelJson = Schema.Struct({
  namespace: Schema.String,
  model: Schema.String,
  aliases: Schema.Array(Schema.String),
  adapters: Schema.Array(Schema.String)
})

/** One entry of `GET /v1/domains`. */
export const DomainViewJson = Schema.Struct({
  cacheSemantics: CacheSemanticsJson,
  routingScope: RoutingScopeJson,
  querySemantics: QuerySemanticsJson,
  models: Schema.Array(DomainModelJson),
  lanes: Schema.Array(DomainLaneJson)
})

/** The answer to `GET /v1/domains`. */
export const DomainsResponseJson = Schema.Array(DomainViewJson)
/** The domains document as decoded. */
export type DomainsResponse = typeof DomainsResponseJson.Type

// ---------------------------------------------------------------------------------------------

// ---------------------------------------------------------------------------------------------
// Global consumer diagnostics (PROTOCOL §7)

/** `GET /v1/health` of `kvrelay global`: 200 when some lane is ready, else 503. */
export const GlobalHealthJson = Schema.Struct({
  healthy: Schema.Boolean,
  relays: Schema.Array(
    Schema.Struct({
      name: Schema.String,
      url: Schema.String,
      connected: Schema.Boolean,
      /** Lanes of this relay's pools across the domains, and how many of them are ready. */
      lanes: U32,
      lanesReady: U32,
      lastError: nullable(Schema.String)
    })
  )
})
/** The global consumer's `GET /v1/health` document as decoded. */
export type GlobalHealth = typeof GlobalHealthJson.Type

/** Latency in milliseconds: lifetime mean and max, quantiles over the most recent queries. */
export const QueryLatencyJson = Schema.Struct({
  meanMs: Schema.Number,
  maxMs: Schema.Number,
  p50Ms: Schema.Number,
  p90Ms: Schema.Number,
  p99Ms: Schema.Number,
  recentSamples: Count
})

/** Queries of one route, by outcome (`ok`, `invalid`, `not_found`, `unavailable`, `error`). */
export const QueryRouteStatsJson = Schema.Struct({
  route: Schema.String,
  count: Count,
  outcomes: Schema.Record({ key: Schema.String, value: Count }),
  latency: QueryLatencyJson
})

/** One lane's counters in the global consumer's `GET /v1/stats`. */
export const GlobalLaneStatsJson = Schema.Struct({
  lane: U32,
  domain: Schema.Struct({ cacheSemantics: CacheSemanticsJson, routingScope: RoutingScopeJson }),
  poolId: PoolIdJson,
  servingEndpoint: EndpointTextJson,
  producerIncarnation: U64,
  layoutGeneration: U64,
  ready: Schema.Boolean,
  installedSequence: nullable(U64),
  snapshotsInstalled: Count,
  deltasApplied: Count,
  resubscribes: Count,
  faults: Schema.Struct({ total: Count, byReason: Schema.Record({ key: Schema.String, value: Count }) }),
  lastFault: nullable(Schema.String)
})

/** One of a relay's watches followed for routing: its state, retries, last error and last document's time. */
export const SignalWatchStatsJson = Schema.Struct({
  state: Schema.Literal("starting", "up", "failing"),
  resubscribes: Count,
  lastError: nullable(Schema.String),
  receivedAt: nullable(Schema.Date)
})

/** `GET /v1/stats` of `kvrelay global`. */
export const GlobalStatsJson = Schema.Struct({
  consumerInstance: U64,
  subscriberId: Schema.String,
  relays: Schema.Array(
    Schema.Struct({
      name: Schema.String,
      url: Schema.String,
      lane: U32,
      connected: Schema.Boolean,
      epochs: Count,
      lastError: nullable(Schema.String),
      dcName: nullable(Schema.String),
      dcId: nullable(DcIdHex),
      catalogRevision: nullable(U64),
      /** ◆3 the relay's load and readiness watches, followed for routing decisions (§7.1). */
      watches: Schema.optional(
        Schema.Struct({ load: SignalWatchStatsJson, readiness: SignalWatchStatsJson })
      ),
      lanes: Schema.Array(GlobalLaneStatsJson)
    })
  ),
  queries: Schema.Array(QueryRouteStatsJson)
})
/** The global consumer's stats document as decoded. */
export type GlobalStats = typeof GlobalStatsJson.Type

// ---------------------------------------------------------------------------------------------
// The routes (§7)

/** `POST /v1/overlap`: by model or by pool domain, by tokens or by local block hashes. */
const OverlapRequestJson = Schema.Union(
  ModelTokensOverlapJson,
  ModelLocalOverlapJson,
  DomainTokensOverlapJson,
  DomainLocalOverlapJson
)

/** `POST /v1/route` (§7.1 ◆3): an overlap body plus an optional `policy`. */
export const RouteRequestJson = Schema.Union(
  Schema.extend(ModelTokensOverlapJson, RoutePolicyFieldJson),
  Schema.extend(ModelLocalOverlapJson, RoutePolicyFieldJson),
  Schema.extend(DomainTokensOverlapJson, RoutePolicyFieldJson),
  Schema.extend(DomainLocalOverlapJson, RoutePolicyFieldJson)
)

/**
 * The global consumer's routes as one declaration (see `RelayHttpApi`): the server routes by it
 * (`consumer/http`) and serves it at `GET /v1/openapi.json`. Every route but `GET /healthz`
 * answers 401 `UNAUTHORIZED` when the consumer requires a bearer token; an unknown path 404
 * `NOT_FOUND`, a known path asked with another method 405 with `Allow`.
 */
export const GlobalHttpApi = HttpApi.make("global")
  .add(
    HttpApiGroup.make("global", { topLevel: true })
      .add(statusPageEndpoint)
      .add(healthzEndpoint)
      .add(metricsEndpoint)
      .add(
        HttpApiEndpoint.get("domains", "/v1/domains")
          .addSuccess(DomainsResponseJson)
          .addError(...errorWith(500))
          .annotate(OpenApi.Summary, "The indexer domains, their models and lanes")
      )
      .add(
        HttpApiEndpoint.post("overlap", "/v1/overlap")
          .setPayload(OverlapRequestJson)
          .addSuccess(OverlapResponseJson)
          .addError(...errorWith(400))
          .addError(...errorWith(404))
          .addError(...errorWith(413))
          .addError(...errorWith(503))
          .annotate(OpenApi.Summary, "The cached prefix depth of a prompt per DC pool")
      )
      .add(
        HttpApiEndpoint.post("overlapBatch", "/v1/overlap/batch")
          .setPayload(OverlapBatchJson)
          .addSuccess(OverlapBatchResponseJson)
          .addError(...errorWith(400))
          .addError(...errorWith(413))
          .annotate(OpenApi.Summary, "Up to 256 overlap queries, each answered or failed on its own")
      )
      .add(
        HttpApiEndpoint.post("route", "/v1/route")
          .setPayload(RouteRequestJson)
          .addSuccess(RouteAnswerJson)
          .addError(...errorWith(400))
          .addError(...errorWith(404))
          .addError(...errorWith(413))
          .addError(RouteUnavailableJson, { status: 503 })
          .annotate(OpenApi.Summary, "Where to send a prompt: the decision and every candidate's cost (§7.1)")
      )
      .add(
        HttpApiEndpoint.post("routeBatch", "/v1/route/batch")
          .setPayload(RouteBatchJson)
          .addSuccess(RouteBatchAnswerJson)
          .addError(...errorWith(400))
          .addError(...errorWith(413))
          .annotate(OpenApi.Summary, "Up to 256 routing decisions, each answered or failed on its own")
      )
      .add(
        HttpApiEndpoint.get("health", "/v1/health")
          .addSuccess(GlobalHealthJson)
          .addError(GlobalHealthJson, { status: 503 })
          .annotate(OpenApi.Summary, "Health; 503 with the same document when unhealthy")
      )
      .add(HttpApiEndpoint.get("stats", "/v1/stats").addSuccess(GlobalStatsJson))
      .add(openApiEndpoint)
  )
  .addError(...errorWith(401))
  .annotate(OpenApi.Title, "kvrelay global")
  .annotate(OpenApi.Version, "1")
  .annotate(OpenApi.Description, "The global consumer's HTTP API (PROTOCOL.md §7).")

/** `GET /v1/openapi.json`: the routes above as an OpenAPI 3.1 document. */
export const globalOpenApi = (): OpenApi.OpenAPISpec => openApiDocument(GlobalHttpApi)
