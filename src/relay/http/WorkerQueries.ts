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
 * `{error}` bodies. The routes are served twice, with the same bytes: through the server's router
 * (the general path) and, while no tracer is installed, straight from the `node:http` request
 * event (`makeFastPath`), which asks each pool on the request's own turn while its actor is at
 * rest (`KvDcRelayService.queryWorkersNow`: the answer the queued query would get).
 */

import type { IncomingMessage, ServerResponse } from "node:http"
import type * as HttpServerRequest from "@effect/platform/HttpServerRequest"
import * as HttpServerResponse from "@effect/platform/HttpServerResponse"
import { Effect, Either, Exit, FiberRef, Runtime, Schema, type Scope } from "effect"
import { compareMembers } from "../../ckf/events.js"
import { localBlockHashes, sequenceHashes } from "../../ckf/tokens.js"
import {
  type DynamoScoreResponse,
  type DynamoWorkerEndpoint,
  dynamoScoreResponse,
  dynamoWorkersJson
} from "../../ckf/workerQuery.js"
import * as BearerAuth from "../../http/BearerAuth.js"
import { collectBody, readFailureMessage } from "../../http/RequestBody.js"
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
import type { EndpointWorkerQuery, KvDcRelayService } from "../KvDcRelay.js"
import {
  bodyTooLarge,
  errorBodyText,
  HttpFailure,
  internal,
  invalidRequest,
  JSON_CONTENT_TYPE,
  readBody,
  relayFailure,
  type ServerContext,
  utf8
} from "./internal/ServerContext.js"
import { JsonBytes, writePoolWorkers } from "./internal/WorkerQueryJson.js"

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

/** A pool's answer to a query. */
interface PoolAnswer {
  readonly pool: DcPoolDescriptor
  readonly answer: EndpointWorkerQuery
}

/**
 * Each pool's answer, in catalog order; a pool that retired between the catalog read and its
 * query (its endpoint no longer active) is left out.
 */
const queryPools = (relay: KvDcRelayService, plan: Plan): Effect.Effect<Array<PoolAnswer>, HttpFailure> =>
  Effect.forEach(addressesOf(plan), (hashes, k) => {
    const pool = plan.pools[k]!
    return relay.queryWorkers(pool.servingEndpoint, hashes).pipe(
      Effect.map((answer) => [{ pool, answer }]),
      Effect.catchTag("UnknownEndpoint", () => Effect.succeed([])),
      Effect.mapError(relayFailure)
    )
  }).pipe(Effect.map((lists) => lists.flat()))

/**
 * Each pool's answer on the caller's turn (`KvDcRelayService.queryWorkersNow`: every pool's actor
 * at rest), or undefined when one of them must be asked through its mailbox.
 */
const queryPoolsNow = (relay: KvDcRelayService, plan: Plan): Array<PoolAnswer> | undefined => {
  const addresses = addressesOf(plan)
  const answers: Array<PoolAnswer> = []
  for (let k = 0; k < addresses.length; k++) {
    const pool = plan.pools[k]!
    const answer = relay.queryWorkersNow(pool.servingEndpoint, addresses[k]!)
    if (answer === undefined) return undefined
    answers.push({ pool, answer })
  }
  return answers
}

const catalogPools = (relay: KvDcRelayService): Effect.Effect<ReadonlyArray<DcPoolDescriptor>> =>
  Effect.map(relay.catalogRef.get, (catalog) => catalog.pools)

// ---------------------------------------------------------------------------------------------
// Replies: the same bytes from the general path and the fast path

/** A complete answer: status, JSON body, extra headers. */
interface Reply {
  readonly status: number
  readonly body: string
  /**
   * The body holds its UTF-8 bytes one per character (`JsonBytes.latin1`): its length is its
   * byte length, and it is written with the latin1 encoding.
   */
  readonly latin1?: boolean
  readonly headers?: Readonly<Record<string, string>> | undefined
}

const errorReply = (failure: HttpFailure): Reply => ({
  status: failure.status,
  body: errorBodyText(failure.reason, failure.message),
  headers: failure.headers
})

/** A `{error}` body, as Dynamo's indexer answers its errors (every status, 413 included). */
const dynamoErrorReply = (
  status: number,
  error: string,
  headers?: Readonly<Record<string, string>>
): Reply => ({
  status,
  body: JSON.stringify({ error }),
  headers
})

/** What a body asks: the pools and the prompt, or the reply that ends it. */
interface Plan {
  readonly pools: ReadonlyArray<DcPoolDescriptor>
  readonly prompt: QueryPrompt
  /** The prompt's addresses in each pool, once computed (`addressesOf`). */
  addresses?: ReadonlyArray<Uint32Array>
}

/** The prompt's canonical sequence hashes in each of the plan's pools, hashed once per plan. */
const addressesOf = (plan: Plan): ReadonlyArray<Uint32Array> =>
  (plan.addresses ??= plan.pools.map((pool) => addressesIn(pool, plan.prompt)))

/**
 * The body's JSON; `exact` keeps integers beyond 2^53 exact (Dynamo's i64 `block_hashes`).
 * `/v1/query` needs no such care: its u64 hashes are decimal strings or numbers up to 2^53, and a
 * larger number is refused either way.
 */
const parsedBody = (text: string, exact: boolean): { readonly value: unknown } | string => {
  try {
    return { value: exact ? parseJsonExactIntegers(text) : JSON.parse(text) }
  } catch (cause) {
    return `the body is not valid JSON: ${String(cause).slice(0, 120)}`
  }
}

// ---------------------------------------------------------------------------------------------
// POST /v1/query

const encodePoolIdDocument = Schema.encodeSync(PoolIdJson)
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

const planWorkerQuery = (pools: ReadonlyArray<DcPoolDescriptor>, text: string): Plan | Reply => {
  const parsed = parsedBody(text, false)
  if (typeof parsed === "string") return errorReply(invalidRequest(parsed))
  const decoded = decodeWorkerQuery(parsed.value)
  if (typeof decoded === "string") return errorReply(invalidRequest(decoded))
  const found = poolsOf(pools, decoded)
  if (found instanceof HttpFailure) return errorReply(found)
  return { pools: found, prompt: decoded.prompt }
}

/** A pool's `servingEndpoint`, `poolId` and `kvBlockSize` members, encoded once per descriptor. */
const poolOpenings = new WeakMap<DcPoolDescriptor, Uint8Array>()
const poolOpening = (pool: DcPoolDescriptor): Uint8Array => {
  let opening = poolOpenings.get(pool)
  if (opening === undefined) {
    opening = encoder.encode(
      `{"servingEndpoint":${JSON.stringify(pool.servingEndpoint.toString())},"poolId":${JSON.stringify(encodePoolIdDocument(pool.producer.poolId))},"kvBlockSize":${pool.querySemantics.kvBlockSize},`
    )
    poolOpenings.set(pool, opening)
  }
  return opening
}

const encoder = new TextEncoder()
const POOLS_OPEN = encoder.encode('{"pools":[')
const answerBytes = new JsonBytes()

/**
 * `/v1/query`'s answer: `{"pools": [{servingEndpoint, poolId, kvBlockSize, queryBlocks,
 * frequencies, workers}]}`, written as bytes (`WorkerQueryJson`).
 */
const workerQueryReply = (answers: ReadonlyArray<PoolAnswer>): Reply => {
  const out = answerBytes.reset()
  out.bytes(POOLS_OPEN)
  for (let k = 0; k < answers.length; k++) {
    const { pool, answer } = answers[k]!
    if (k > 0) out.byte(0x2c)
    out.bytes(poolOpening(pool))
    writePoolWorkers(out, answer.result)
    out.byte(0x7d)
  }
  out.byte(0x5d)
  out.byte(0x7d)
  return { status: 200, body: out.latin1(), latin1: true }
}

// ---------------------------------------------------------------------------------------------
// Dynamo's standalone indexer routes

/**
 * The pools of `model_name` in `routing_group` (the namespace), or a `{error}` reply. Without a
 * routing group the model must be served in exactly one namespace.
 */
const dynamoPools = (
  pools: ReadonlyArray<DcPoolDescriptor>,
  modelName: string,
  routingGroup: string | undefined
): ReadonlyArray<DcPoolDescriptor> | Reply => {
  const serving = pools.filter(
    (pool) =>
      servesModel(pool, modelName) !== undefined &&
      (routingGroup === undefined || pool.servingEndpoint.namespace === routingGroup)
  )
  if (serving.length === 0)
    return dynamoErrorReply(
      404,
      `no indexer for model=${modelName}${routingGroup === undefined ? "" : ` routing_group=${routingGroup}`}`
    )
  if (routingGroup === undefined) {
    const namespaces = [...new Set(serving.map((pool) => pool.servingEndpoint.namespace))].sort()
    if (namespaces.length > 1)
      return dynamoErrorReply(
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

const planDynamo =
  (decode: (body: unknown) => DynamoQueryRequest | string) =>
  (pools: ReadonlyArray<DcPoolDescriptor>, text: string): Plan | Reply => {
    const parsed = parsedBody(text, true)
    if (typeof parsed === "string") return dynamoErrorReply(400, parsed)
    const decoded = decode(parsed.value)
    if (typeof decoded === "string") return dynamoErrorReply(400, decoded)
    const found = dynamoPools(pools, decoded.modelName, decoded.routingGroup)
    if (!Array.isArray(found)) return found as Reply
    return { pools: found as ReadonlyArray<DcPoolDescriptor>, prompt: decoded.prompt }
  }

const dynamoQueryReply = (answers: ReadonlyArray<PoolAnswer>): Reply => ({
  status: 200,
  body: JSON.stringify(
    joinScores(
      answers.map(({ pool, answer }) => dynamoScoreResponse(answer.result, pool.querySemantics.kvBlockSize))
    )
  )
})

/** A failure in the words of Dynamo's indexer: a `{error}` body. */
const dynamoFailureReply = (failure: HttpFailure): Reply =>
  dynamoErrorReply(failure.status, failure.message, failure.headers)

/** The three query routes: how a body is planned, how answers and failures are worded. */
const QUERY_ROUTES = {
  "/v1/query": { name: "workerQuery", plan: planWorkerQuery, reply: workerQueryReply, failure: errorReply },
  "/query": {
    name: "dynamoQuery",
    plan: planDynamo(decodeDynamoQuery),
    reply: dynamoQueryReply,
    failure: dynamoFailureReply
  },
  "/query_by_hash": {
    name: "dynamoQueryByHash",
    plan: planDynamo(decodeDynamoQueryByHash),
    reply: dynamoQueryReply,
    failure: dynamoFailureReply
  }
} as const
type QueryRoute = (typeof QUERY_ROUTES)[keyof typeof QUERY_ROUTES]

const isPlan = (value: Plan | Reply): value is Plan => "pools" in value

/** A planned query's answer through the pools' mailboxes. */
const runQuery = (relay: KvDcRelayService, route: QueryRoute, plan: Plan): Effect.Effect<Reply> =>
  queryPools(relay, plan).pipe(
    Effect.map(route.reply),
    Effect.catchAll((failure) => Effect.succeed(route.failure(failure)))
  )

/** A route's answer to a complete body (the general path, and the fast path when an actor is busy). */
const answerBody = (relay: KvDcRelayService, route: QueryRoute, text: string): Effect.Effect<Reply> =>
  Effect.flatMap(catalogPools(relay), (pools) => {
    const plan = route.plan(pools, text)
    return isPlan(plan) ? runQuery(relay, route, plan) : Effect.succeed(plan)
  })

// ---------------------------------------------------------------------------------------------
// The general path (the server's router)

const handlerOf =
  (route: QueryRoute) =>
  (
    ctx: ServerContext,
    request: HttpServerRequest.HttpServerRequest
  ): Effect.Effect<HttpServerResponse.HttpServerResponse, HttpFailure, Scope.Scope> =>
    readBody(request, ctx.limits.maxRequestBodyBytes).pipe(
      Effect.matchEffect({
        onFailure: (failure) => Effect.succeed(route.failure(failure)),
        onSuccess: (text) => answerBody(ctx.relay, route, text)
      }),
      Effect.map((reply) => {
        const options = { status: reply.status, contentType: JSON_CONTENT_TYPE, headers: reply.headers ?? {} }
        return reply.latin1 === true
          ? HttpServerResponse.uint8Array(Buffer.from(reply.body, "latin1"), options)
          : HttpServerResponse.text(reply.body, options)
      }),
      Effect.withSpan(`RelayHttp.${route.name}`)
    )

/** `POST /v1/query` (PROTOCOL §5.1). */
export const workerQuery = handlerOf(QUERY_ROUTES["/v1/query"])

/** `POST /query`: by tokens, with `lora_name` and `cache_salt` folded into the local hashes. */
export const dynamoQuery = handlerOf(QUERY_ROUTES["/query"])

/** `POST /query_by_hash`: by local block hashes (i64). */
export const dynamoQueryByHash = handlerOf(QUERY_ROUTES["/query_by_hash"])

/** `GET /workers[?model_name=…&routing_group=…]`: each worker's ranks and their event sources. */
export const dynamoWorkers = (
  ctx: ServerContext,
  query: URLSearchParams
): Effect.Effect<HttpServerResponse.HttpServerResponse> =>
  Effect.gen(function* () {
    const model = query.get("model_name") ?? undefined
    const group = query.get("routing_group") ?? undefined
    const pools = (yield* catalogPools(ctx.relay)).filter(
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

// ---------------------------------------------------------------------------------------------
// The fast path

const INTERNAL = internal("internal error")

/** The tracer Effect runs with when none is installed: its spans go nowhere. */
const defaultTracer = Effect.runSync(Effect.tracer)

/** The query routes' `request` listener ahead of the router (`makeFastPath`). */
export interface WorkerQueryFastPath {
  /** Takes a request (true) or leaves it, untouched, to the general path (false). */
  readonly handle: (request: IncomingMessage, response: ServerResponse) => boolean
  /** Requests taken whose answer is not written yet. */
  readonly inFlight: () => number
}

/**
 * A `request` listener for the three query routes, as the global consumer's overlap routes have
 * one (decisions: "Overlap over HTTP"): through the platform's router a query cost a fiber, the
 * router and middleware and a body stream several times over what reading it and asking the
 * actor cost. It takes only `POST` to exactly these paths, with a token accepted when one is
 * required, and only while no tracer is installed (with one, the general path opens the request's
 * spans); it answers with the same bytes as the general path (`answerBody`).
 */
export const makeFastPath = (
  relay: KvDcRelayService,
  options: { readonly maxBodyBytes: number; readonly auth: BearerAuth.TokenFile | undefined }
): Effect.Effect<WorkerQueryFastPath> =>
  Effect.gen(function* () {
    const runtime = yield* Effect.runtime<never>()
    const tracer = yield* Effect.tracer
    const traced = tracer !== defaultTracer && (yield* FiberRef.get(FiberRef.currentTracerEnabled))
    const runSync = Runtime.runSync(runtime)
    const runFork = Runtime.runFork(runtime)
    const auth = options.auth
    const limit = options.maxBodyBytes
    let inFlight = 0

    const authorized = (request: IncomingMessage): boolean => {
      if (auth === undefined) return true
      return (
        BearerAuth.authorizationProblem(runSync(auth.tokens.get), request.headers.authorization) === undefined
      )
    }

    const send = (response: ServerResponse, reply: Reply): void => {
      inFlight--
      if (response.writableEnded || response.destroyed) return
      response.writeHead(reply.status, {
        ...reply.headers,
        "content-type": JSON_CONTENT_TYPE,
        "content-length": reply.latin1 === true ? reply.body.length : Buffer.byteLength(reply.body)
      })
      // Status line, headers and body go out as one string in one write.
      response.end(reply.body, reply.latin1 === true ? "latin1" : "utf8")
    }

    const tooLarge = (route: QueryRoute): Reply => route.failure(bodyTooLarge(limit))

    /**
     * Answers a complete body: on this turn when every pool's actor is at rest (as in the bench
     * and whenever ingest leaves a gap), else through the mailboxes, from the same plan.
     */
    const answer = (route: QueryRoute, text: string, response: ServerResponse): void => {
      let reply: Reply | undefined
      let plan: Plan | undefined
      try {
        const planned = route.plan(relay.catalogNow().pools, text)
        if (isPlan(planned)) {
          plan = planned
          const answers = queryPoolsNow(relay, planned)
          if (answers !== undefined) reply = route.reply(answers)
        } else reply = planned
      } catch (cause) {
        // A defect: logged and answered as the general path answers one, never thrown into the
        // request event.
        runFork(
          Effect.logError("KV DC Relay worker query failed").pipe(
            Effect.annotateLogs({ route: route.name, cause: String(cause) })
          )
        )
        reply = route.failure(INTERNAL)
      }
      if (reply !== undefined || plan === undefined) {
        send(response, reply ?? route.failure(INTERNAL))
        return
      }
      const fiber = runFork(runQuery(relay, route, plan))
      fiber.addObserver((exit) => send(response, Exit.isSuccess(exit) ? exit.value : route.failure(INTERNAL)))
    }

    const handle = (request: IncomingMessage, response: ServerResponse): boolean => {
      const route = QUERY_ROUTES[request.url as keyof typeof QUERY_ROUTES] as QueryRoute | undefined
      if (traced || route === undefined || request.method !== "POST" || !authorized(request)) return false
      inFlight++
      collectBody(request, limit, (outcome) => {
        if (outcome._tag === "TooLarge") return send(response, tooLarge(route))
        if (outcome._tag === "Failed")
          return send(response, route.failure(invalidRequest(readFailureMessage(outcome.cause))))
        let text: string
        try {
          text = utf8.decode(outcome.bytes)
        } catch {
          send(response, route.failure(invalidRequest("request body is not valid UTF-8")))
          return
        }
        answer(route, text, response)
      })
      return true
    }
    return { handle, inFlight: () => inFlight }
  })
