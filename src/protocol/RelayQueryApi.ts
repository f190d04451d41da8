/**
 * The relay's worker-level index queries (PROTOCOL §5.1 ◆3): the request bodies of
 * `POST /v1/query` and of the routes in the shape of Dynamo's standalone KV indexer (`POST /query`,
 * `POST /query_by_hash`, `GET /workers`), how each is read, the answers' documents, and the route
 * declarations `RelayHttpApi` adds.
 *
 * The bodies are read by hand rather than by a schema: the messages must name the field at fault
 * in the contract's words, token arrays run to many thousands of entries, and `block_hashes` are
 * JSON numbers over the whole i64 range that a double cannot hold (`parseJsonExactIntegers`).
 * Dynamo's request fields follow its `lib/kv-router/src/services/indexer/server.rs`
 * (`QueryRequest`, `QueryByHashRequest`, `WorkersQuery`), including the `tenant_id` it accepts and
 * ignores.
 */

import * as HttpApiEndpoint from "@effect/platform/HttpApiEndpoint"
import * as OpenApi from "@effect/platform/OpenApi"
import { Schema } from "effect"
import { PoolIdJson } from "./Identity.js"

// ---------------------------------------------------------------------------------------------
// Reading JSON with exact integers

const isDigit = (c: number): boolean => c >= 0x30 && c <= 0x39
const LONG_DIGITS = /[0-9]{16}/

/**
 * `JSON.parse`, except that an integer literal of more than 15 digits becomes its decimal text (a
 * string), so that a 64-bit hash given as a JSON number is read exactly rather than rounded to a
 * double. Throws as `JSON.parse` does.
 */
export const parseJsonExactIntegers = (text: string): unknown => {
  // Token arrays never hold 16 digits in a row: most bodies go straight to JSON.parse.
  if (!LONG_DIGITS.test(text)) return JSON.parse(text)
  let out: Array<string> | undefined
  let last = 0
  const n = text.length
  for (let i = 0; i < n; i++) {
    const c = text.charCodeAt(i)
    if (c === 0x22) {
      // Skip the string, escapes included.
      for (i++; i < n; i++) {
        const d = text.charCodeAt(i)
        if (d === 0x5c) i++
        else if (d === 0x22) break
      }
      continue
    }
    if (c !== 0x2d && !isDigit(c)) continue
    const start = i
    if (c === 0x2d) i++
    let digits = 0
    while (i < n && isDigit(text.charCodeAt(i))) {
      i++
      digits++
    }
    const next = i < n ? text.charCodeAt(i) : 0
    const integer = next !== 0x2e && next !== 0x65 && next !== 0x45
    if (!integer) {
      // The rest of a fraction or an exponent: leave it to JSON.parse.
      while (i < n && /[0-9eE+\-.]/.test(text[i]!)) i++
    } else if (digits > 15) {
      out ??= []
      out.push(text.slice(last, start), `"${text.slice(start, i)}"`)
      last = i
    }
    i--
  }
  if (out === undefined) return JSON.parse(text)
  out.push(text.slice(last))
  return JSON.parse(out.join(""))
}

// ---------------------------------------------------------------------------------------------
// Field readers: each returns the value or a message naming the field.

const isObject = (value: unknown): value is Record<string, unknown> =>
  typeof value === "object" && value !== null && !Array.isArray(value)

const shown = (value: unknown): string => {
  if (value === null) return "null"
  if (Array.isArray(value)) return "an array"
  if (typeof value === "object") return "an object"
  if (typeof value === "string")
    return value.length > 40 ? `a string of ${value.length} characters` : JSON.stringify(value)
  return String(value)
}

const U64_MAX = (1n << 64n) - 1n
const I64_MIN = -(1n << 63n)
const DECIMAL = /^-?(0|[1-9][0-9]*)$/

/** Token ids (u32 each), or a message naming the first bad one. */
const readTokens = (value: unknown, field: string): ReadonlyArray<number> | string => {
  if (!Array.isArray(value)) return `${field} must be an array of u32 token ids, got ${shown(value)}`
  for (let i = 0; i < value.length; i++) {
    const v = value[i]
    if (typeof v !== "number" || !Number.isInteger(v) || v < 0 || v > 0xffff_ffff)
      return `${field}[${i}] is not a u32 token id: ${shown(v)}`
  }
  return value as ReadonlyArray<number>
}

/** u64 hashes: decimal strings, or numbers up to 2^53 (the contract's convention). */
const readU64s = (value: unknown, field: string): ReadonlyArray<bigint> | string => {
  if (!Array.isArray(value))
    return `${field} must be an array of u64 local block hashes (decimal strings, or numbers up to 2^53), got ${shown(value)}`
  const out: Array<bigint> = new Array(value.length)
  for (let i = 0; i < value.length; i++) {
    const v = value[i]
    let parsed: bigint | undefined
    if (typeof v === "number" && Number.isSafeInteger(v) && v >= 0) parsed = BigInt(v)
    else if (typeof v === "string" && DECIMAL.test(v) && !v.startsWith("-")) {
      const big = BigInt(v)
      if (big <= U64_MAX) parsed = big
    }
    if (parsed === undefined)
      return `${field}[${i}] is not a u64 (a decimal string, or a number up to 2^53): ${shown(v)}`
    out[i] = parsed
  }
  return out
}

/**
 * Dynamo's `block_hashes: Vec<i64>`: integers over the i64 range, read exactly, as u64 bit
 * patterns. An integer in [2^63, 2^64) is the same bit pattern written unsigned (a router that
 * kept the u64 `kvrelay/client` returns): accepted too, since it cannot mean anything else.
 */
const readI64s = (value: unknown, field: string): ReadonlyArray<bigint> | string => {
  if (!Array.isArray(value)) return `${field} must be an array of i64 local block hashes, got ${shown(value)}`
  const out: Array<bigint> = new Array(value.length)
  for (let i = 0; i < value.length; i++) {
    const v = value[i]
    let parsed: bigint | undefined
    if (typeof v === "number" && Number.isSafeInteger(v)) parsed = BigInt(v)
    else if (typeof v === "string" && DECIMAL.test(v)) {
      const big = BigInt(v)
      if (big >= I64_MIN && big <= U64_MAX) parsed = big
    }
    if (parsed === undefined)
      return `${field}[${i}] is not a 64-bit integer (i64, or u64 written unsigned): ${shown(v)}`
    out[i] = BigInt.asUintN(64, parsed)
  }
  return out
}

/** An optional string: absent and null are undefined. */
const readOptionalString = (
  body: Record<string, unknown>,
  field: string
): string | undefined | { error: string } => {
  const v = body[field]
  if (v === undefined || v === null) return undefined
  if (typeof v !== "string") return { error: `${field} must be a string or null, got ${shown(v)}` }
  return v
}

const readRequiredString = (body: Record<string, unknown>, field: string): string | { error: string } => {
  const v = body[field]
  if (v === undefined) return { error: `${field} is required` }
  if (typeof v !== "string" || v.length === 0)
    return { error: `${field} must be a non-empty string, got ${shown(v)}` }
  return v
}

const unknownField = (
  body: Record<string, unknown>,
  allowed: ReadonlySet<string>,
  hint = ""
): string | undefined => {
  for (const key in body)
    if (!allowed.has(key))
      return `unknown field ${JSON.stringify(key.length > 64 ? `${key.slice(0, 64)}…` : key)}${hint}`
  return undefined
}

// ---------------------------------------------------------------------------------------------
// POST /v1/query

/** Which pools a `/v1/query` asks: those serving a model in a namespace, or one serving endpoint. */
export type QueryTarget =
  | { readonly _tag: "Model"; readonly namespace: string; readonly model: string }
  | { readonly _tag: "Endpoint"; readonly servingEndpoint: string }

/** The prompt: its tokens (hashed per pool with the adapter and salt), or a router's local hashes. */
export type QueryPrompt =
  | {
      readonly _tag: "Tokens"
      readonly tokens: ReadonlyArray<number>
      readonly loraName: string | undefined
      readonly cacheSalt: string | undefined
    }
  | { readonly _tag: "LocalHashes"; readonly localBlockHashes: ReadonlyArray<bigint> }

/** A decoded `POST /v1/query` body (PROTOCOL §5.1 ◆3). */
export interface WorkerQueryRequest {
  readonly target: QueryTarget
  readonly prompt: QueryPrompt
}

/** The body forms of `/v1/query`, as error messages and the route's description name them. */
export const WORKER_QUERY_FORMS =
  "{namespace, model, tokens, loraName?, cacheSalt?} or {namespace, model, localBlockHashes} (servingEndpoint in place of namespace and model)"

const V1_FIELDS = new Set([
  "namespace",
  "model",
  "servingEndpoint",
  "tokens",
  "localBlockHashes",
  "loraName",
  "cacheSalt"
])

/** A `/v1/query` body, parsed from JSON: the request, or a message naming what is wrong. */
export const decodeWorkerQuery = (body: unknown): WorkerQueryRequest | string => {
  if (!isObject(body)) return `expected a JSON object ${WORKER_QUERY_FORMS}, got ${shown(body)}`
  const unknown = unknownField(body, V1_FIELDS)
  if (unknown !== undefined) return unknown
  const byTokens = "tokens" in body
  if (byTokens === "localBlockHashes" in body)
    return byTokens
      ? "give tokens or localBlockHashes, not both"
      : `the query has neither tokens nor localBlockHashes; give ${WORKER_QUERY_FORMS}`
  let target: QueryTarget
  if ("servingEndpoint" in body) {
    if ("namespace" in body || "model" in body)
      return "servingEndpoint takes the place of namespace and model: give one or the other"
    const endpoint = readRequiredString(body, "servingEndpoint")
    if (typeof endpoint !== "string") return endpoint.error
    target = { _tag: "Endpoint", servingEndpoint: endpoint }
  } else {
    const namespace = readRequiredString(body, "namespace")
    if (typeof namespace !== "string") return namespace.error
    const model = readRequiredString(body, "model")
    if (typeof model !== "string") return model.error
    target = { _tag: "Model", namespace, model }
  }
  if (!byTokens) {
    if ("loraName" in body || "cacheSalt" in body)
      return `${"loraName" in body ? "loraName" : "cacheSalt"} goes with tokens only (local block hashes are already salted)`
    const hashes = readU64s(body.localBlockHashes, "localBlockHashes")
    if (typeof hashes === "string") return hashes
    return { target, prompt: { _tag: "LocalHashes", localBlockHashes: hashes } }
  }
  const tokens = readTokens(body.tokens, "tokens")
  if (typeof tokens === "string") return tokens
  const loraName = readOptionalString(body, "loraName")
  if (typeof loraName === "object") return loraName.error
  const cacheSalt = readOptionalString(body, "cacheSalt")
  if (typeof cacheSalt === "object") return cacheSalt.error
  return {
    target,
    prompt: {
      _tag: "Tokens",
      tokens,
      loraName: loraName === "" ? undefined : loraName,
      cacheSalt: cacheSalt === "" ? undefined : cacheSalt
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Dynamo's standalone indexer routes

/** A decoded `POST /query` or `POST /query_by_hash` body (PROTOCOL §5.1 ◆3). */
export interface DynamoQueryRequest {
  readonly modelName: string
  /** The namespace; undefined when left out (one namespace must then serve the model). */
  readonly routingGroup: string | undefined
  readonly prompt: QueryPrompt
}

const DYNAMO_QUERY_FIELDS = new Set([
  "token_ids",
  "model_name",
  "routing_group",
  "tenant_id",
  "lora_name",
  "cache_salt"
])
const DYNAMO_HASH_FIELDS = new Set(["block_hashes", "model_name", "routing_group", "tenant_id", "cache_salt"])

const dynamoCommon = (
  body: Record<string, unknown>
): { readonly modelName: string; readonly routingGroup: string | undefined } | string => {
  const modelName = readRequiredString(body, "model_name")
  if (typeof modelName !== "string") return modelName.error
  const routingGroup = readOptionalString(body, "routing_group")
  if (typeof routingGroup === "object") return routingGroup.error
  const tenant = readOptionalString(body, "tenant_id")
  if (typeof tenant === "object") return tenant.error
  return { modelName, routingGroup }
}

/** `POST /query` `{token_ids, model_name, routing_group?, tenant_id?, lora_name?, cache_salt?}`. */
export const decodeDynamoQuery = (body: unknown): DynamoQueryRequest | string => {
  if (!isObject(body))
    return `expected a JSON object {token_ids, model_name, routing_group?, lora_name?, cache_salt?}, got ${shown(body)}`
  const unknown = unknownField(body, DYNAMO_QUERY_FIELDS)
  if (unknown !== undefined) return unknown
  if (!("token_ids" in body)) return "token_ids is required"
  const tokens = readTokens(body.token_ids, "token_ids")
  if (typeof tokens === "string") return tokens
  const common = dynamoCommon(body)
  if (typeof common === "string") return common
  const loraName = readOptionalString(body, "lora_name")
  if (typeof loraName === "object") return loraName.error
  const cacheSalt = readOptionalString(body, "cache_salt")
  if (typeof cacheSalt === "object") return cacheSalt.error
  return {
    ...common,
    prompt: {
      _tag: "Tokens",
      tokens,
      loraName: loraName === "" ? undefined : loraName,
      cacheSalt: cacheSalt === "" ? undefined : cacheSalt
    }
  }
}

/**
 * `POST /query_by_hash` `{block_hashes, model_name, routing_group?, tenant_id?}`: `block_hashes`
 * are local block hashes as i64 JSON numbers (read with `parseJsonExactIntegers`). A `cache_salt`
 * is refused, as Dynamo refuses it: the hashes must already carry the salt.
 */
export const decodeDynamoQueryByHash = (body: unknown): DynamoQueryRequest | string => {
  if (!isObject(body))
    return `expected a JSON object {block_hashes, model_name, routing_group?}, got ${shown(body)}`
  const unknown = unknownField(body, DYNAMO_HASH_FIELDS)
  if (unknown !== undefined) return unknown
  if (body.cache_salt !== undefined && body.cache_salt !== null)
    return "cache_salt is not accepted by /query_by_hash: block_hashes must already include the intended cache salt"
  if (!("block_hashes" in body)) return "block_hashes is required"
  const hashes = readI64s(body.block_hashes, "block_hashes")
  if (typeof hashes === "string") return hashes
  const common = dynamoCommon(body)
  if (typeof common === "string") return common
  return { ...common, prompt: { _tag: "LocalHashes", localBlockHashes: hashes } }
}

// ---------------------------------------------------------------------------------------------
// Answers

/** One member's cumulative depths (blocks) in `/v1/query`. */
export const WorkerDepthsJson = Schema.Struct({
  workerId: Schema.String,
  dpRank: Schema.Number,
  device: Schema.Number,
  host: Schema.Number,
  disk: Schema.Number
})

/** One pool's answer in `/v1/query`. */
export const PoolWorkersJson = Schema.Struct({
  servingEndpoint: Schema.String,
  poolId: PoolIdJson,
  kvBlockSize: Schema.Number,
  queryBlocks: Schema.Number,
  frequencies: Schema.Array(Schema.Number),
  workers: Schema.Array(WorkerDepthsJson)
}).annotations({ identifier: "PoolWorkers" })

/** `POST /v1/query`'s answer. */
export const WorkerQueryResponseJson = Schema.Struct({ pools: Schema.Array(PoolWorkersJson) }).annotations({
  identifier: "WorkerQueryResponse"
})
/** `POST /v1/query`'s answer as a value. */
export type WorkerQueryResponseDocument = typeof WorkerQueryResponseJson.Type

/** Dynamo's per-instance tier summary (Mooncake RFC #1403), in tokens. */
const DynamoInstanceJson = Schema.Struct({
  longest_matched: Schema.Number,
  gpu: Schema.Number,
  dp: Schema.Record({ key: Schema.String, value: Schema.Number }),
  cpu: Schema.Number,
  disk: Schema.Number
})

/** `POST /query` and `POST /query_by_hash`: Dynamo's `ScoreResponse`. */
export const DynamoScoreResponseJson = Schema.Struct({
  scores: Schema.Record({
    key: Schema.String,
    value: Schema.Record({ key: Schema.String, value: Schema.Number })
  }),
  frequencies: Schema.Array(Schema.Number),
  instances: Schema.Record({ key: Schema.String, value: DynamoInstanceJson })
}).annotations({ identifier: "DynamoScoreResponse" })

/** `GET /workers`: `instance_id` is a JSON number over the whole u64 range, written exactly. */
export const DynamoWorkersJson = Schema.Array(
  Schema.Struct({
    instance_id: Schema.Number,
    endpoints: Schema.Record({ key: Schema.String, value: Schema.String })
  })
).annotations({ identifier: "DynamoWorkers" })

/** Dynamo's error body. */
export const DynamoErrorJson = Schema.Struct({ error: Schema.String }).annotations({
  identifier: "DynamoError"
})

/** The `{reason, message}` error body of `/v1/query` (`ErrorBody` of `RelayApi`). */
const QueryErrorJson = Schema.Struct({ reason: Schema.String, message: Schema.String }).annotations({
  identifier: "QueryError"
})

// ---------------------------------------------------------------------------------------------
// /v1/stats additions (PROTOCOL §5.1 ◆3)

const Count = Schema.Number.pipe(Schema.int(), Schema.nonNegative())

/** A member's lower-tier blocks beside its device `blocks`. */
export const MemberTierBlocksFields = { hostBlocks: Count, diskBlocks: Count }

/** An endpoint's host and disk tiers: their (member, block) edges and what they cost. */
export const TierStatsJson = Schema.Struct({
  hostEdges: Count,
  diskEdges: Count,
  lineageEntries: Count,
  lineageBytes: Count,
  ownershipBytes: Count,
  /** Bytes of the tiers' tables per host or disk edge; 0 without edges. */
  bytesPerEdge: Schema.Number
}).annotations({ identifier: "TierStats" })

// ---------------------------------------------------------------------------------------------
// Routes

const V1QueryBody = Schema.Unknown.annotations({
  description: `${WORKER_QUERY_FORMS}; localBlockHashes are u64 (decimal strings, or numbers up to 2^53)`
})

/** `POST /v1/query` (PROTOCOL §5.1 ◆3). */
export const workerQueryEndpoint = HttpApiEndpoint.post("workerQuery", "/v1/query")
  .setPayload(V1QueryBody)
  .addSuccess(WorkerQueryResponseJson)
  .addError(QueryErrorJson, { status: 400 })
  .addError(QueryErrorJson, { status: 404 })
  .addError(QueryErrorJson, { status: 413 })
  .annotate(
    OpenApi.Summary,
    "Which worker and dp rank holds how much of a prompt, per storage tier (PROTOCOL §5.1)"
  )

/** `POST /query`, Dynamo's standalone indexer's query by tokens (PROTOCOL §5.1 ◆3). */
export const dynamoQueryEndpoint = HttpApiEndpoint.post("dynamoQuery", "/query")
  .setPayload(
    Schema.Unknown.annotations({
      description: "{token_ids, model_name, routing_group?, lora_name?, cache_salt?}"
    })
  )
  .addSuccess(DynamoScoreResponseJson)
  .addError(DynamoErrorJson, { status: 400 })
  .addError(DynamoErrorJson, { status: 404 })
  .annotate(OpenApi.Summary, "Dynamo standalone indexer's query by tokens")

/** `POST /query_by_hash`, its query by local block hashes (PROTOCOL §5.1 ◆3). */
export const dynamoQueryByHashEndpoint = HttpApiEndpoint.post("dynamoQueryByHash", "/query_by_hash")
  .setPayload(
    Schema.Unknown.annotations({
      description: "{block_hashes: [i64 local block hashes], model_name, routing_group?}"
    })
  )
  .addSuccess(DynamoScoreResponseJson)
  .addError(DynamoErrorJson, { status: 400 })
  .addError(DynamoErrorJson, { status: 404 })
  .annotate(OpenApi.Summary, "Dynamo standalone indexer's query by local block hashes")

/** `GET /workers`, its worker list (PROTOCOL §5.1 ◆3). */
export const dynamoWorkersEndpoint = HttpApiEndpoint.get("dynamoWorkers", "/workers")
  .setUrlParams(
    Schema.Struct({
      model_name: Schema.optional(Schema.String),
      routing_group: Schema.optional(Schema.String)
    })
  )
  .addSuccess(DynamoWorkersJson)
  .annotate(OpenApi.Summary, "Dynamo standalone indexer's worker list: each rank's event source endpoint")
