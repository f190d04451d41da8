/**
 * The relay's worker-level index queries over HTTP (PROTOCOL §5.1 ◆3): `POST /v1/query` and the
 * routes in the shape of Dynamo's standalone KV indexer, `POST /query`, `POST /query_by_hash` and
 * `GET /workers`.
 *
 * A query names a model (or a serving endpoint); the pools that serve it come from the catalog.
 * The prompt is hashed per pool (its block size and hash format; tokens with the adapter's name
 * and the cache salt folded in as Dynamo folds them, `ckf/tokens.ts`), chained into canonical
 * sequence hashes, and each pool's actor answers from one point of its state
 * (`KvDcRelayService.queryWorkers`). The Dynamo routes answer as that indexer's
 * `build_score_response` does (`ckf/workerQuery.ts`, `dynamoScoreResponse`); their errors are its
 * `{error}` bodies.
 */

import type * as HttpServerRequest from "@effect/platform/HttpServerRequest"
import * as HttpServerResponse from "@effect/platform/HttpServerResponse"
import { Effect, Either, Schema, type Scope } from "effect"
import { compareMembers } from "../../ckf/events.js"
import { localBlockHashes, sequenceHashes } from "../../ckf/tokens.js"
import {
  type DynamoScoreResponse,
  type DynamoWorkerEndpoint,
  dynamoScoreResponse,
  dynamoWorkersJson,
  poolWorkersAnswer
} from "../../ckf/workerQuery.js"
import { PoolIdJson } from "../../protocol/Identity.js"
import { type DcPoolDescriptor, EndpointId } from "../../protocol/Model.js"
import {
  type DynamoQueryRequest,
  decodeDynamoQuery,
  decodeDynamoQueryByHash,
  decodeWorkerQuery,
  parseJsonExactIntegers,
  type QueryPrompt,
  type WorkerQueryRequest
} from "../../protocol/RelayQueryApi.js"
import type { EndpointWorkerQuery } from "../KvDcRelay.js"
import {
  HttpFailure,
  invalidRequest,
  JSON_CONTENT_TYPE,
  readBody,
  relayFailure,
  type ServerContext
} from "./internal/ServerContext.js"

// ---------------------------------------------------------------------------------------------
// Pools of a model, and the prompt's addresses in each

const servesModel = (pool: DcPoolDescriptor, model: string): string | undefined => {
  for (const r of pool.registrations) {
    if (r.target._tag !== "Base") continue
    if (r.model === model || (r.aliases as ReadonlyArray<string>).includes(model)) return r.target.baseModel
  }
  return undefined
}

const servesAdapter = (pool: DcPoolDescriptor, base: string, adapter: string): boolean =>
  pool.registrations.some(
    (r) =>
      r.target._tag === "Lora" &&
      r.target.baseModel === base &&
      (r.target.adapter === adapter ||
        r.model === adapter ||
        (r.aliases as ReadonlyArray<string>).includes(adapter))
  )

const pairsOf = (hashes: ReadonlyArray<bigint>): Uint32Array => {
  const out = new Uint32Array(2 * hashes.length)
  for (let i = 0; i < hashes.length; i++) {
    const h = hashes[i]!
    out[2 * i] = Number(h >> 32n)
    out[2 * i + 1] = Number(h & 0xffff_ffffn)
  }
  return out
}

/** The prompt's canonical sequence hashes in `pool` (its block size and hash format). */
const addressesIn = (pool: DcPoolDescriptor, prompt: QueryPrompt): Uint32Array => {
  const local =
    prompt._tag === "Tokens"
      ? localBlockHashes(prompt.tokens, pool.querySemantics.kvBlockSize, {
          loraName: prompt.loraName,
          cacheSalt: prompt.cacheSalt,
          hashFormat: pool.querySemantics.hashFormat
        })
      : pairsOf(prompt.localBlockHashes)
  return sequenceHashes(local)
}

/**
 * Each pool's answer, in catalog order; a pool that retired between the catalog read and its
 * query (its endpoint no longer active) is left out.
 */
const queryPools = (
  ctx: ServerContext,
  pools: ReadonlyArray<DcPoolDescriptor>,
  prompt: QueryPrompt
): Effect.Effect<Array<{ pool: DcPoolDescriptor; answer: EndpointWorkerQuery }>, HttpFailure> =>
  Effect.forEach(pools, (pool) =>
    ctx.relay.queryWorkers(pool.servingEndpoint, addressesIn(pool, prompt)).pipe(
      Effect.map((answer) => [{ pool, answer }]),
      Effect.catchTag("UnknownEndpoint", () => Effect.succeed([])),
      Effect.mapError(relayFailure)
    )
  ).pipe(Effect.map((lists) => lists.flat()))

const catalogPools = (ctx: ServerContext): Effect.Effect<ReadonlyArray<DcPoolDescriptor>> =>
  Effect.map(ctx.relay.catalogRef.get, (catalog) => catalog.pools)

const bodyOf = (ctx: ServerContext, request: HttpServerRequest.HttpServerRequest) =>
  readBody(request, ctx.limits.maxRequestBodyBytes)

// ---------------------------------------------------------------------------------------------
// POST /v1/query

const encodePoolId = Schema.encodeSync(PoolIdJson)

const notFound = (reason: "MODEL_NOT_FOUND" | "ADAPTER_NOT_FOUND" | "POOL_NOT_FOUND", message: string) =>
  new HttpFailure({ status: 404, reason, message })

/** The pools a `/v1/query` asks, or the 404 that says why there are none. */
const poolsOf = (
  pools: ReadonlyArray<DcPoolDescriptor>,
  request: WorkerQueryRequest
): ReadonlyArray<DcPoolDescriptor> | HttpFailure => {
  const target = request.target
  if (target._tag === "Endpoint") {
    const endpoint = EndpointId.parse(target.servingEndpoint)
    if (Either.isLeft(endpoint))
      return invalidRequest(
        `servingEndpoint must be "namespace.component.endpoint": ${endpoint.left.message}`
      )
    const key = endpoint.right.toString()
    const found = pools.filter((pool) => pool.servingEndpoint.toString() === key)
    if (found.length === 0)
      return notFound("POOL_NOT_FOUND", `no pool of this relay serves the endpoint ${JSON.stringify(key)}`)
    return found
  }
  const serving = pools.filter(
    (pool) =>
      pool.servingEndpoint.namespace === target.namespace && servesModel(pool, target.model) !== undefined
  )
  if (serving.length === 0)
    return notFound(
      "MODEL_NOT_FOUND",
      `no pool of this relay serves the model ${JSON.stringify(target.model)} in the namespace ${JSON.stringify(target.namespace)}`
    )
  const prompt = request.prompt
  if (prompt._tag !== "Tokens" || prompt.loraName === undefined) return serving
  const lora = prompt.loraName
  const adapted = serving.filter((pool) => servesAdapter(pool, servesModel(pool, target.model)!, lora))
  if (adapted.length === 0)
    return notFound(
      "ADAPTER_NOT_FOUND",
      `the model ${JSON.stringify(target.model)} has no adapter ${JSON.stringify(lora)} registered on this relay`
    )
  return adapted
}

/** `POST /v1/query` (PROTOCOL §5.1). */
export const workerQuery = (
  ctx: ServerContext,
  request: HttpServerRequest.HttpServerRequest
): Effect.Effect<HttpServerResponse.HttpServerResponse, HttpFailure, Scope.Scope> =>
  Effect.gen(function* () {
    const text = yield* bodyOf(ctx, request)
    let parsed: unknown
    try {
      parsed = parseJsonExactIntegers(text)
    } catch (cause) {
      return yield* Effect.fail(invalidRequest(`the body is not valid JSON: ${String(cause).slice(0, 120)}`))
    }
    const decoded = decodeWorkerQuery(parsed)
    if (typeof decoded === "string") return yield* Effect.fail(invalidRequest(decoded))
    const pools = poolsOf(yield* catalogPools(ctx), decoded)
    if (pools instanceof HttpFailure) return yield* Effect.fail(pools)
    const answers = yield* queryPools(ctx, pools, decoded.prompt)
    const body = {
      pools: answers.map(({ pool, answer }) => ({
        servingEndpoint: pool.servingEndpoint.toString(),
        poolId: encodePoolId(pool.producer.poolId),
        kvBlockSize: pool.querySemantics.kvBlockSize,
        ...poolWorkersAnswer(answer.result)
      }))
    }
    return HttpServerResponse.text(JSON.stringify(body), { contentType: JSON_CONTENT_TYPE })
  }).pipe(Effect.withSpan("RelayHttp.workerQuery"))

// ---------------------------------------------------------------------------------------------
// Dynamo's standalone indexer routes

/** A `{error}` body, as Dynamo's indexer answers its errors. */
const dynamoError = (status: number, error: string): HttpServerResponse.HttpServerResponse =>
  HttpServerResponse.text(JSON.stringify({ error }), { status, contentType: JSON_CONTENT_TYPE })

/**
 * The pools of `model_name` in `routing_group` (the namespace), or a `{error}` response. Without
 * a routing group the model must be served in exactly one namespace.
 */
const dynamoPools = (
  pools: ReadonlyArray<DcPoolDescriptor>,
  modelName: string,
  routingGroup: string | undefined
): ReadonlyArray<DcPoolDescriptor> | HttpServerResponse.HttpServerResponse => {
  const serving = pools.filter(
    (pool) =>
      servesModel(pool, modelName) !== undefined &&
      (routingGroup === undefined || pool.servingEndpoint.namespace === routingGroup)
  )
  if (serving.length === 0)
    return dynamoError(
      404,
      `no indexer for model=${modelName}${routingGroup === undefined ? "" : ` routing_group=${routingGroup}`}`
    )
  if (routingGroup === undefined) {
    const namespaces = [...new Set(serving.map((pool) => pool.servingEndpoint.namespace))].sort()
    if (namespaces.length > 1)
      return dynamoError(
        400,
        `model ${modelName} is served in several routing groups (${namespaces.join(", ")}): give routing_group`
      )
  }
  return serving
}

/**
 * One answer over several pools of the model (a namespace may serve it from more than one
 * endpoint): workers are distinct per pool, so their `scores` and `instances` entries are joined,
 * and `frequencies[i]` adds up each pool's count of members holding block i.
 */
const joinScores = (answers: ReadonlyArray<DynamoScoreResponse>): DynamoScoreResponse => {
  if (answers.length === 1) return answers[0]!
  const scores: Record<string, Record<string, number>> = {}
  const instances: Record<string, DynamoScoreResponse["instances"][string]> = {}
  const frequencies: Array<number> = []
  for (const answer of answers) {
    for (const [worker, ranks] of Object.entries(answer.scores))
      scores[worker] = { ...scores[worker], ...ranks }
    for (const [worker, summary] of Object.entries(answer.instances)) {
      const known = instances[worker]
      instances[worker] =
        known === undefined
          ? summary
          : {
              longest_matched: Math.max(known.longest_matched, summary.longest_matched),
              gpu: Math.max(known.gpu, summary.gpu),
              dp: { ...known.dp, ...summary.dp },
              cpu: Math.max(known.cpu, summary.cpu),
              disk: Math.max(known.disk, summary.disk)
            }
    }
    answer.frequencies.forEach((count, i) => {
      frequencies[i] = (frequencies[i] ?? 0) + count
    })
  }
  return { scores, frequencies, instances }
}

const dynamoQueryWith =
  (decode: (body: unknown) => DynamoQueryRequest | string, route: string) =>
  (
    ctx: ServerContext,
    request: HttpServerRequest.HttpServerRequest
  ): Effect.Effect<HttpServerResponse.HttpServerResponse, HttpFailure, Scope.Scope> =>
    Effect.gen(function* () {
      const text = yield* bodyOf(ctx, request)
      let parsed: unknown
      try {
        parsed = parseJsonExactIntegers(text)
      } catch (cause) {
        return dynamoError(400, `the body is not valid JSON: ${String(cause).slice(0, 120)}`)
      }
      const decoded = decode(parsed)
      if (typeof decoded === "string") return dynamoError(400, decoded)
      const pools = dynamoPools(yield* catalogPools(ctx), decoded.modelName, decoded.routingGroup)
      if (!Array.isArray(pools)) return pools as HttpServerResponse.HttpServerResponse
      const answers = yield* queryPools(ctx, pools as ReadonlyArray<DcPoolDescriptor>, decoded.prompt)
      const joined = joinScores(
        answers.map(({ pool, answer }) => dynamoScoreResponse(answer.result, pool.querySemantics.kvBlockSize))
      )
      return HttpServerResponse.text(JSON.stringify(joined), { contentType: JSON_CONTENT_TYPE })
    }).pipe(
      // Dynamo's routes answer every error as `{error}`, a body over the limit included.
      Effect.catchTag("HttpFailure", (failure) =>
        failure.status === 413 || failure.status === 400
          ? Effect.succeed(
              HttpServerResponse.text(JSON.stringify({ error: failure.message }), {
                status: failure.status,
                contentType: JSON_CONTENT_TYPE,
                headers: failure.headers ?? {}
              })
            )
          : Effect.fail(failure)
      ),
      Effect.withSpan(`RelayHttp.${route}`)
    )

/** `POST /query`: by tokens, with `lora_name` and `cache_salt` folded into the local hashes. */
export const dynamoQuery = dynamoQueryWith(decodeDynamoQuery, "dynamoQuery")

/** `POST /query_by_hash`: by local block hashes (i64). */
export const dynamoQueryByHash = dynamoQueryWith(decodeDynamoQueryByHash, "dynamoQueryByHash")

/** `GET /workers[?model_name=…&routing_group=…]`: each worker's ranks and their event sources. */
export const dynamoWorkers = (
  ctx: ServerContext,
  query: URLSearchParams
): Effect.Effect<HttpServerResponse.HttpServerResponse> =>
  Effect.gen(function* () {
    const model = query.get("model_name") ?? undefined
    const group = query.get("routing_group") ?? undefined
    const pools = (yield* catalogPools(ctx)).filter(
      (pool) =>
        (model === undefined || servesModel(pool, model) !== undefined) &&
        (group === undefined || pool.servingEndpoint.namespace === group)
    )
    const ranks = new Map<string, DynamoWorkerEndpoint>()
    for (const pool of pools)
      for (const rank of yield* ctx.relay.sourceRanks(pool.servingEndpoint))
        ranks.set(`${rank.workerId}/${rank.dpRank}`, {
          workerId: rank.workerId,
          dpRank: rank.dpRank,
          endpoint: rank.transportEndpoint
        })
    const text = dynamoWorkersJson([...ranks.values()].sort(compareMembers))
    return HttpServerResponse.text(text, { contentType: JSON_CONTENT_TYPE })
  }).pipe(Effect.withSpan("RelayHttp.dynamoWorkers"))
