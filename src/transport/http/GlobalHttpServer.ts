/**
 * The global consumer's HTTP API (PROTOCOL.md §7): `GET /healthz`, `GET /metrics`,
 * `GET /v1/domains`, `POST /v1/overlap` and `POST /v1/overlap/batch`; `GET /metrics`,
 * `GET /v1/health` and `GET /v1/stats` are `GlobalDiagnostics`.
 *
 * Every JSON input is decoded through `effect/Schema` with unknown fields rejected; u64 values go
 * out as decimal strings. Errors are `{reason, message}`: 400 `INVALID_REQUEST` for a malformed
 * body (413 when it exceeds the size limit), 404 `POOL_NOT_FOUND` when no domain matches, 503
 * `PUBLICATION_UNAVAILABLE` when the matching domains have no ready lane.
 */

import { createServer } from "node:http"
import { createServer as createHttpsServer } from "node:https"
import {
  HttpIncomingMessage,
  HttpRouter,
  HttpServer,
  type HttpServerError,
  HttpServerRequest,
  HttpServerResponse
} from "@effect/platform"
import { NodeHttpServer } from "@effect/platform-node"
import { Data, Effect, Either, Layer, Option } from "effect"
import {
  type GlobalConsumer,
  type GlobalConsumerConfig,
  type GlobalConsumerConfigError,
  layer as globalConsumerLayer,
  RelayConnector
} from "../../consumer/GlobalConsumer.js"
import { GlobalView, layer as globalViewLayer, type OverlapRequest } from "../../consumer/GlobalView.js"
import type { RelayClientOptions } from "../../consumer/RelayClient.js"
import {
  DomainLocalOverlapJson,
  DomainsResponseJson,
  DomainTokensOverlapJson,
  decodeJson,
  decodeJsonText,
  type ErrorReason,
  encodeJson,
  ModelLocalOverlapJson,
  ModelTokensOverlapJson,
  OverlapBatchJson,
  OverlapBatchResponseJson,
  OverlapResponseJson
} from "../../domain/json.js"
import * as BearerAuth from "./BearerAuth.js"
import * as GlobalDiagnostics from "./GlobalDiagnostics.js"
import * as GlobalStatusPage from "./GlobalStatusPage.js"
import { type ClientTlsOptions, httpClientLayer, type ServerTlsOptions } from "./Tls.js"

export const DEFAULT_GLOBAL_HTTP_HOST = "127.0.0.1"
export const DEFAULT_GLOBAL_HTTP_PORT = 8090
/** A 64-block prompt is about 1.5 KiB; 1 MiB admits prompts of ~45,000 blocks. */
export const DEFAULT_MAX_BODY_BYTES = 1024 * 1024

export interface GlobalHttpServerOptions {
  readonly host?: string | undefined
  /** 0 binds an ephemeral port (tests); read it back from `HttpServer.HttpServer`. */
  readonly port?: number | undefined
  readonly maxBodyBytes?: number | undefined
  /** Serve HTTPS with this material (`Tls.loadServerTls`); mutual TLS when it has a client CA. */
  readonly tls?: ServerTlsOptions | undefined
  /** Require a bearer token of this file on every route but `GET /healthz`. */
  readonly auth?: BearerAuth.TokenFile | undefined
}

// ---------------------------------------------------------------------------------------------
// Responses

const JSON_TYPE = "application/json"

const jsonResponse = (status: number, body: unknown): HttpServerResponse.HttpServerResponse =>
  HttpServerResponse.text(JSON.stringify(body), { status, contentType: JSON_TYPE })

const errorResponse = (
  status: number,
  reason: ErrorReason,
  message: string
): HttpServerResponse.HttpServerResponse => jsonResponse(status, { reason, message })

class RequestRejected extends Data.TaggedError("RequestRejected")<{
  readonly status: number
  readonly message: string
}> {}

const rejected = (error: RequestRejected) => errorResponse(error.status, "INVALID_REQUEST", error.message)

// ---------------------------------------------------------------------------------------------
// Body

const exceedsLimit = (error: { readonly cause?: unknown }): boolean =>
  error.cause instanceof Error && /maxBytes/.test(error.cause.message)

/**
 * The body as text, refusing more than `limit` bytes: at once from `content-length`, otherwise
 * while reading (the platform's body reader stops at the limit).
 */
const readBody = (
  limit: number
): Effect.Effect<string, RequestRejected, HttpServerRequest.HttpServerRequest> =>
  Effect.gen(function* () {
    const request = yield* HttpServerRequest.HttpServerRequest
    const tooLarge = new RequestRejected({ status: 413, message: `request body exceeds ${limit} bytes` })
    const declared = request.headers["content-length"]
    if (declared !== undefined && Number(declared) > limit) return yield* Effect.fail(tooLarge)
    return yield* request.text.pipe(
      HttpIncomingMessage.withMaxBodySize(Option.some(limit)),
      Effect.mapError((error) =>
        exceedsLimit(error)
          ? tooLarge
          : new RequestRejected({ status: 400, message: `request body could not be read: ${error.message}` })
      )
    )
  })

const decodeModelTokens = decodeJson(ModelTokensOverlapJson)
const decodeModelLocal = decodeJson(ModelLocalOverlapJson)
const decodeDomainTokens = decodeJson(DomainTokensOverlapJson)
const decodeDomainLocal = decodeJson(DomainLocalOverlapJson)
const decodeBatch = decodeJsonText(OverlapBatchJson)
const encodeOverlap = encodeJson(OverlapResponseJson)
const encodeBatch = encodeJson(OverlapBatchResponseJson)
const encodeDomains = encodeJson(DomainsResponseJson)

const QUERY_FORMS =
  "{namespace, model, tokens, loraName?} or {namespace, model, localBlockHashes} (poolDomain in place of namespace and model)"

/**
 * One overlap body, already parsed from JSON: by model or by `poolDomain` (its presence
 * decides), by `tokens` or by `localBlockHashes`. The engines' own block hashes are no query
 * form: filters are addressed canonically (PROTOCOL §3.3), so they would never match.
 */
export const decodeOverlapRequest = (parsed: unknown): OverlapRequest | string => {
  if (typeof parsed !== "object" || parsed === null || Array.isArray(parsed)) {
    return `expected a JSON object ${QUERY_FORMS}`
  }
  if ("blockHashes" in parsed) {
    return `blockHashes (engine block hashes) is not a query form: relays address blocks by canonical hashes of their tokens; give ${QUERY_FORMS}`
  }
  const byTokens = "tokens" in parsed
  if (byTokens === "localBlockHashes" in parsed) {
    return byTokens
      ? "give tokens or localBlockHashes, not both"
      : `the query has neither tokens nor localBlockHashes; give ${QUERY_FORMS}`
  }
  const decoded =
    "poolDomain" in parsed
      ? byTokens
        ? decodeDomainTokens(parsed)
        : decodeDomainLocal(parsed)
      : byTokens
        ? decodeModelTokens(parsed)
        : decodeModelLocal(parsed)
  return Either.match(decoded as Either.Either<OverlapRequest, { readonly message: string }>, {
    onLeft: (error) => error.message,
    onRight: (request) => request
  })
}

/** `decodeOverlapRequest` of a body's text. */
export const parseOverlapRequest = (text: string): OverlapRequest | string => {
  let parsed: unknown
  try {
    parsed = JSON.parse(text)
  } catch (cause) {
    return `invalid JSON: ${cause instanceof Error ? cause.message : String(cause)}`
  }
  return decodeOverlapRequest(parsed)
}

/** `{queries: [body…]}`: every body decoded, or the first bad one named by its index. */
export const parseOverlapBatch = (text: string): ReadonlyArray<OverlapRequest> | string => {
  const batch = decodeBatch(text)
  if (Either.isLeft(batch)) return batch.left.message
  const requests: Array<OverlapRequest> = []
  for (let i = 0; i < batch.right.queries.length; i++) {
    const request = decodeOverlapRequest(batch.right.queries[i])
    if (typeof request === "string") return `queries[${i}]: ${request}`
    requests.push(request)
  }
  return requests
}

// ---------------------------------------------------------------------------------------------
// Handlers

const methodNotAllowed = (allowed: string) =>
  Effect.map(HttpServerRequest.HttpServerRequest, (request) =>
    HttpServerResponse.setHeader(
      errorResponse(405, "INVALID_REQUEST", `${request.method} is not allowed here; use ${allowed}`),
      "allow",
      allowed
    )
  )

/** One handler per path; other methods answer 405. */
const only = <E, R>(
  method: "GET" | "POST",
  handler: Effect.Effect<HttpServerResponse.HttpServerResponse, E, R>
): Effect.Effect<HttpServerResponse.HttpServerResponse, E, R | HttpServerRequest.HttpServerRequest> =>
  Effect.flatMap(
    HttpServerRequest.HttpServerRequest,
    (
      request
    ): Effect.Effect<HttpServerResponse.HttpServerResponse, E, R | HttpServerRequest.HttpServerRequest> =>
      request.method === method ? handler : methodNotAllowed(method)
  )

const healthz = Effect.succeed(HttpServerResponse.text("ok", { contentType: "text/plain; charset=utf-8" }))

const metrics = GlobalDiagnostics.metrics

const domains = Effect.gen(function* () {
  const view = yield* GlobalView
  const list = yield* view.domains
  const json = encodeDomains(
    list.map((domain) => ({
      cacheSemantics: domain.id.cacheSemantics,
      routingScope: domain.id.routingScope,
      querySemantics: domain.querySemantics,
      lanes: domain.lanes.map((lane) => ({
        lane: lane.lane,
        relay: lane.relay,
        poolId: lane.poolId,
        producer: lane.producer,
        servingEndpoint: lane.servingEndpoint,
        ready: lane.ready,
        installedSequence: lane.installedSequence ?? null
      }))
    }))
  )
  return Either.isRight(json)
    ? jsonResponse(200, json.right)
    : errorResponse(500, "INTERNAL", `domains could not be encoded: ${json.left.message}`)
})

const overlap = (maxBodyBytes: number) =>
  Effect.gen(function* () {
    const view = yield* GlobalView
    const text = yield* readBody(maxBodyBytes)
    const request = parseOverlapRequest(text)
    if (typeof request === "string") return errorResponse(400, "INVALID_REQUEST", request)
    const answer = yield* Effect.either(view.overlap(request))
    if (Either.isLeft(answer)) {
      const error = answer.left
      return error._tag === "NoMatchingDomain"
        ? errorResponse(404, "POOL_NOT_FOUND", error.message)
        : errorResponse(503, "PUBLICATION_UNAVAILABLE", error.message)
    }
    const json = encodeOverlap({ results: answer.right })
    return Either.isRight(json)
      ? jsonResponse(200, json.right)
      : errorResponse(500, "INTERNAL", `overlap answer could not be encoded: ${json.left.message}`)
  }).pipe(Effect.catchTag("RequestRejected", (error) => Effect.succeed(rejected(error))))

/**
 * Each query answered as `/v1/overlap` would; a query that no domain (or no ready lane)
 * answers gets an empty list rather than failing its neighbours.
 */
const overlapBatch = (maxBodyBytes: number) =>
  Effect.gen(function* () {
    const view = yield* GlobalView
    const text = yield* readBody(maxBodyBytes)
    const requests = parseOverlapBatch(text)
    if (typeof requests === "string") return errorResponse(400, "INVALID_REQUEST", requests)
    const results = requests.map((request) => {
      const answer = view.overlapNow(request)
      return Array.isArray(answer) ? answer : []
    })
    yield* Effect.annotateCurrentSpan("overlap.queries", requests.length)
    const json = encodeBatch({ results })
    return Either.isRight(json)
      ? jsonResponse(200, json.right)
      : errorResponse(500, "INTERNAL", `overlap answers could not be encoded: ${json.left.message}`)
  }).pipe(Effect.catchTag("RequestRejected", (error) => Effect.succeed(rejected(error))))

const traced =
  (route: string) =>
  <E, R>(
    handler: Effect.Effect<HttpServerResponse.HttpServerResponse, E, R>
  ): Effect.Effect<HttpServerResponse.HttpServerResponse, E, R | HttpServerRequest.HttpServerRequest> =>
    Effect.flatMap(HttpServerRequest.HttpServerRequest, (request) =>
      handler.pipe(
        Effect.tap((response) => Effect.annotateCurrentSpan("http.response.status_code", response.status)),
        Effect.withSpan(`GlobalHttpServer ${request.method} ${route}`, {
          kind: "server",
          attributes: { "http.request.method": request.method, "http.route": route }
        })
      )
    )

/** The API as a router; needs the consumer and its view. */
export const makeRouter = (options: GlobalHttpServerOptions = {}) => {
  const maxBodyBytes = options.maxBodyBytes ?? DEFAULT_MAX_BODY_BYTES
  return HttpRouter.empty.pipe(
    HttpRouter.all("/", traced("/")(only("GET", Effect.sync(GlobalStatusPage.response)))),
    HttpRouter.all("/healthz", traced("/healthz")(only("GET", healthz))),
    HttpRouter.all("/metrics", traced("/metrics")(only("GET", metrics))),
    HttpRouter.all("/v1/domains", traced("/v1/domains")(only("GET", domains))),
    HttpRouter.all(
      "/v1/overlap",
      traced("/v1/overlap")(GlobalDiagnostics.timedQuery("/v1/overlap")(only("POST", overlap(maxBodyBytes))))
    ),
    HttpRouter.all(
      "/v1/overlap/batch",
      traced("/v1/overlap/batch")(
        GlobalDiagnostics.timedQuery("/v1/overlap/batch")(only("POST", overlapBatch(maxBodyBytes)))
      )
    ),
    HttpRouter.all("/v1/health", traced("/v1/health")(only("GET", GlobalDiagnostics.health))),
    HttpRouter.all("/v1/stats", traced("/v1/stats")(only("GET", GlobalDiagnostics.stats))),
    Effect.catchTag("RouteNotFound", (error) =>
      Effect.succeed(
        errorResponse(404, "INVALID_REQUEST", `no route for ${error.request.method} ${error.request.url}`)
      )
    )
  )
}

/** Serves the API on an existing `HttpServer`. */
export const serve = (
  options: GlobalHttpServerOptions = {}
): Layer.Layer<never, never, HttpServer.HttpServer | GlobalView | GlobalConsumer> =>
  HttpServer.serve(BearerAuth.guard(options.auth)(makeRouter(options))).pipe(
    Layer.provide(GlobalDiagnostics.layer)
  )

/**
 * The API on a Node HTTP server bound to `host:port` (default 127.0.0.1:8090). The layer also
 * provides the `HttpServer` so that callers can read the bound address (`serverUrl`).
 */
export const layer = (
  options: GlobalHttpServerOptions = {}
): Layer.Layer<HttpServer.HttpServer, HttpServerError.ServeError, GlobalView | GlobalConsumer> =>
  serve(options).pipe(
    Layer.provideMerge(
      NodeHttpServer.layer(
        () => (options.tls === undefined ? createServer() : createHttpsServer(options.tls)),
        {
          host: options.host ?? DEFAULT_GLOBAL_HTTP_HOST,
          port: options.port ?? DEFAULT_GLOBAL_HTTP_PORT
        }
      )
    )
  )

/**
 * The whole `kvrelay global` process as one layer: the consumer (relay clients over undici), its
 * view and this API. `serverUrl` gives the bound address for the readiness line.
 */
export const layerGlobal = (
  consumer: GlobalConsumerConfig,
  options: GlobalHttpServerOptions & {
    readonly client?: RelayClientOptions | undefined
    /** CA and client certificate for `https://` relays (`Tls.loadClientTls`). */
    readonly relayTls?: ClientTlsOptions | undefined
  } = {}
): Layer.Layer<
  HttpServer.HttpServer | GlobalView | GlobalConsumer,
  HttpServerError.ServeError | GlobalConsumerConfigError
> =>
  layer(options).pipe(
    Layer.provideMerge(globalViewLayer),
    Layer.provideMerge(globalConsumerLayer(consumer)),
    Layer.provide(RelayConnector.layerHttp(options.client)),
    Layer.provide(httpClientLayer(options.relayTls))
  )

/** `http://host:port` of the bound server (`serverUrlOf(true)`: `https://`). */
export const serverUrl: Effect.Effect<string, never, HttpServer.HttpServer> = Effect.suspend(() =>
  serverUrlOf(false)
)

/** The bound server's URL with the scheme its TLS setting gives. */
export const serverUrlOf = (secure: boolean): Effect.Effect<string, never, HttpServer.HttpServer> =>
  Effect.map(HttpServer.HttpServer, (server) =>
    server.address._tag === "TcpAddress"
      ? `${secure ? "https" : "http"}://${server.address.hostname.includes(":") ? `[${server.address.hostname}]` : server.address.hostname}:${server.address.port}`
      : `unix:${server.address.path}`
  )
