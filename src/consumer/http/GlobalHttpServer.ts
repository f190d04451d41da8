/**
 * The global consumer's HTTP API (PROTOCOL.md §7): `GET /healthz`, `GET /metrics`,
 * `GET /v1/domains`, `POST /v1/overlap` and `POST /v1/overlap/batch`; `GET /metrics`,
 * `GET /v1/health` and `GET /v1/stats` are `GlobalDiagnostics`.
 *
 * Every JSON input is decoded with unknown fields rejected; u64 values go out as decimal strings.
 * Errors are `{reason, message}` (PROTOCOL §7 ◆3): 400 `INVALID_REQUEST` for a malformed body,
 * 413 `BODY_TOO_LARGE` beyond `--max-request-body-bytes`, 404 `MODEL_NOT_FOUND` /
 * `ADAPTER_NOT_FOUND` for names no relay has registered since the consumer started (404
 * `POOL_NOT_FOUND` for such a pool domain), 503 `NO_READY_LANE` when what was asked is known but
 * no lane of it is ready, 404 `NOT_FOUND` for an unknown route and 405 (with `Allow`) for a known
 * route asked with another method.
 */

import { createServer, type IncomingMessage, type ServerResponse } from "node:http"
import { createServer as createHttpsServer } from "node:https"
import * as HttpIncomingMessage from "@effect/platform/HttpIncomingMessage"
import * as HttpRouter from "@effect/platform/HttpRouter"
import * as HttpServer from "@effect/platform/HttpServer"
import type * as HttpServerError from "@effect/platform/HttpServerError"
import * as HttpServerRequest from "@effect/platform/HttpServerRequest"
import * as HttpServerResponse from "@effect/platform/HttpServerResponse"
import * as NodeHttpServer from "@effect/platform-node/NodeHttpServer"
import { Data, Effect, Either, Layer, Option } from "effect"
import * as BearerAuth from "../../http/BearerAuth.js"
import {
  bodyTooLargeMessage,
  boundedMessage,
  DEFAULT_MAX_REQUEST_BODY_BYTES,
  methodNotAllowedMessage,
  noRouteMessage
} from "../../http/ErrorText.js"
import { readFailureMessage } from "../../http/RequestBody.js"
import { statusPageResponse } from "../../http/StatusPage.js"
import type { ServerTlsOptions } from "../../http/Tls.js"
import { DomainsResponseJson, GlobalHttpApi, globalOpenApi } from "../../protocol/GlobalApi.js"
import { encodeJson } from "../../protocol/Json.js"
import type { ErrorReason } from "../../protocol/RelayApi.js"
import { type RouteName, routesOf } from "../../protocol/Routes.js"
import { GlobalConsumer } from "../GlobalConsumer.js"
import * as GlobalRoute from "../GlobalRoute.js"
import { GlobalView } from "../GlobalView.js"
import * as GlobalDiagnostics from "./GlobalDiagnostics.js"
import * as GlobalStatusPage from "./GlobalStatusPage.js"
import * as OverlapQuery from "./OverlapQuery.js"
import * as RouteQuery from "./RouteQuery.js"

const DEFAULT_GLOBAL_HTTP_HOST = "127.0.0.1"
const DEFAULT_GLOBAL_HTTP_PORT = 8090
/**
 * The query routes' body limit (`--max-request-body-bytes`, PROTOCOL §7 ◆3): 16 MiB, so that
 * 256 queries of 2,048 tokens (about 3.6 MB) fit in one batch.
 */
const DEFAULT_MAX_BODY_BYTES = DEFAULT_MAX_REQUEST_BODY_BYTES

/** The global consumer's HTTP server settings. */
export interface GlobalHttpServerOptions {
  readonly host?: string | undefined
  /** 0 binds an ephemeral port (tests); read it back from `HttpServer.HttpServer`. */
  readonly port?: number | undefined
  readonly maxBodyBytes?: number | undefined
  /** Serve HTTPS with this material (`Tls.loadServerTls`); mutual TLS when it has a client CA. */
  readonly tls?: ServerTlsOptions | undefined
  /** Require a bearer token of this file on every route but `GET /healthz`. */
  readonly auth?: BearerAuth.TokenFile | undefined
  /**
   * Serve the overlap routes from the `node:http` request event (default true); false sends
   * them through the router too (tests compare the two).
   */
  readonly fastPath?: boolean | undefined
  /** The routing routes' policy defaults and relay penalties (`global`'s flags, PROTOCOL §7.1). */
  readonly routing?: GlobalRoute.RoutingSettings | undefined
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
): HttpServerResponse.HttpServerResponse => jsonResponse(status, { reason, message: boundedMessage(message) })

class RequestRejected extends Data.TaggedError("RequestRejected")<{
  readonly status: number
  readonly reason: ErrorReason
  readonly message: string
}> {}

const rejected = (error: RequestRejected) => errorResponse(error.status, error.reason, error.message)

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
    const tooLarge = () =>
      new RequestRejected({ status: 413, reason: "BODY_TOO_LARGE", message: bodyTooLargeMessage(limit) })
    const declared = request.headers["content-length"]
    if (declared !== undefined && Number(declared) > limit) return yield* Effect.fail(tooLarge())
    return yield* request.text.pipe(
      HttpIncomingMessage.withMaxBodySize(Option.some(limit)),
      Effect.mapError((error) =>
        exceedsLimit(error)
          ? tooLarge()
          : new RequestRejected({
              status: 400,
              reason: "INVALID_REQUEST",
              message: readFailureMessage(error)
            })
      )
    )
  })

const encodeDomains = encodeJson(DomainsResponseJson)

export { parseOverlapBatch, parseOverlapRequest } from "./OverlapQuery.js"

// ---------------------------------------------------------------------------------------------
// Handlers

const methodNotAllowed = (allowed: string) =>
  Effect.map(HttpServerRequest.HttpServerRequest, (request) => {
    const queryAt = request.url.indexOf("?")
    const route = queryAt < 0 ? request.url : request.url.slice(0, queryAt)
    return HttpServerResponse.setHeader(
      errorResponse(405, "INVALID_REQUEST", methodNotAllowedMessage(request.method, route, allowed)),
      "allow",
      allowed
    )
  })

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
      models: domain.models,
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

const replyResponse = (reply: OverlapQuery.Reply): HttpServerResponse.HttpServerResponse =>
  HttpServerResponse.text(reply.body, { status: reply.status, contentType: JSON_TYPE })

const overlap = (maxBodyBytes: number) =>
  Effect.gen(function* () {
    const view = yield* GlobalView
    const text = yield* readBody(maxBodyBytes)
    const request = OverlapQuery.parseOverlapRequest(text)
    if (typeof request === "string") return errorResponse(400, "INVALID_REQUEST", request)
    return replyResponse(OverlapQuery.overlapReply(yield* Effect.merge(view.overlap(request))))
  }).pipe(Effect.catchTag("RequestRejected", (error) => Effect.succeed(rejected(error))))

/**
 * Each query answered as `/v1/overlap` would; a query that no domain (or no ready lane)
 * answers gets an empty list rather than failing its neighbours.
 */
const overlapBatch = (maxBodyBytes: number) =>
  Effect.gen(function* () {
    const view = yield* GlobalView
    const text = yield* readBody(maxBodyBytes)
    const requests = OverlapQuery.parseOverlapBatch(text)
    if (typeof requests === "string") return errorResponse(400, "INVALID_REQUEST", requests)
    const results = OverlapQuery.batchAnswers(view, requests)
    yield* Effect.annotateCurrentSpan("overlap.queries", requests.length)
    return replyResponse(OverlapQuery.batchReply(results))
  }).pipe(Effect.catchTag("RequestRejected", (error) => Effect.succeed(rejected(error))))

/** `POST /v1/route` and `/v1/route/batch` (PROTOCOL §7.1 ◆3). */
const routeHandler = (maxBodyBytes: number, routing: GlobalRoute.GlobalRoutingService, route: string) =>
  Effect.gen(function* () {
    const text = yield* readBody(maxBodyBytes)
    return replyResponse(RouteQuery.answerRoute(routing, route, text))
  }).pipe(Effect.catchTag("RequestRejected", (error) => Effect.succeed(rejected(error))))

const traced =
  (route: string) =>
  <E, R>(
    handler: Effect.Effect<HttpServerResponse.HttpServerResponse, E, R>
  ): Effect.Effect<HttpServerResponse.HttpServerResponse, E, R | HttpServerRequest.HttpServerRequest> =>
    Effect.flatMap(HttpServerRequest.HttpServerRequest, (request) =>
      handler.pipe(
        Effect.tap((response) => Effect.annotateCurrentSpan("http.response.status_code", response.status)),
        Effect.withSpan(OverlapQuery.spanName(request.method, route), {
          kind: "server",
          attributes: { "http.request.method": request.method, "http.route": route }
        })
      )
    )

type Method = "GET" | "POST"

/** The routes whose requests `GlobalDiagnostics` times and counts. */
const QUERY_ROUTES: ReadonlySet<string> = new Set(["overlap", "overlapBatch", "route", "routeBatch"])

/** `GET /v1/openapi.json`, rendered once. */
let openApiText: string | undefined
const openApi = Effect.sync(() => {
  openApiText ??= JSON.stringify(globalOpenApi())
  return HttpServerResponse.text(openApiText, { contentType: JSON_TYPE })
})

/** The API as a router, one route per endpoint `GlobalHttpApi` declares; needs the consumer and its view. */
const makeRouter = (options: GlobalHttpServerOptions, routing: GlobalRoute.GlobalRoutingService) => {
  const maxBodyBytes = options.maxBodyBytes ?? DEFAULT_MAX_BODY_BYTES
  type Handler = Effect.Effect<
    HttpServerResponse.HttpServerResponse,
    never,
    GlobalView | GlobalConsumer | GlobalDiagnostics.GlobalDiagnostics | HttpServerRequest.HttpServerRequest
  >
  const handlers: { readonly [Name in RouteName<typeof GlobalHttpApi>]: Handler } = {
    statusPage: Effect.sync(() => statusPageResponse(GlobalStatusPage.GLOBAL_STATUS_PAGE)),
    healthz,
    metrics,
    domains,
    overlap: overlap(maxBodyBytes),
    overlapBatch: overlapBatch(maxBodyBytes),
    route: routeHandler(maxBodyBytes, routing, RouteQuery.ROUTE_ROUTE),
    routeBatch: routeHandler(maxBodyBytes, routing, RouteQuery.ROUTE_BATCH_ROUTE),
    health: GlobalDiagnostics.health,
    stats: GlobalDiagnostics.stats,
    openApi
  }
  return routesOf(GlobalHttpApi)
    .reduce(
      (router, route) =>
        HttpRouter.all(
          router,
          route.path as HttpRouter.PathInput,
          traced(route.template)(
            // The query routes' latency and outcome counts include their 405s.
            QUERY_ROUTES.has(route.name)
              ? GlobalDiagnostics.timedQuery(route.template)(
                  only(route.method as Method, handlers[route.name])
                )
              : only(route.method as Method, handlers[route.name])
          )
        ),
      HttpRouter.empty as HttpRouter.HttpRouter<never, Effect.Effect.Context<Handler>>
    )
    .pipe(
      Effect.catchTag("RouteNotFound", (error) =>
        Effect.succeed(
          errorResponse(404, "NOT_FOUND", noRouteMessage(error.request.method, error.request.url))
        )
      )
    )
}

/**
 * The API on a Node HTTP server bound to `host:port` (default 127.0.0.1:8090). The layer also
 * provides the `HttpServer` so that callers can read the bound address (`serverUrl`).
 *
 * The server's `request` listener offers each request to the overlap fast path
 * (`OverlapQuery.makeFastPath`) first and hands the router whatever it leaves.
 */
export const layer = (
  options: GlobalHttpServerOptions = {}
): Layer.Layer<HttpServer.HttpServer, HttpServerError.ServeError, GlobalView | GlobalConsumer> =>
  Layer.scoped(
    HttpServer.HttpServer,
    Effect.gen(function* () {
      const node = options.tls === undefined ? createServer() : createHttpsServer(options.tls)
      const server = yield* NodeHttpServer.make(() => node, {
        host: options.host ?? DEFAULT_GLOBAL_HTTP_HOST,
        port: options.port ?? DEFAULT_GLOBAL_HTTP_PORT
      })
      // One routing service for both paths, over the process's routing settings.
      const routing = yield* GlobalRoute.make(yield* GlobalConsumer, options.routing)
      const general = yield* NodeHttpServer.makeHandler(
        BearerAuth.guard(options.auth)(makeRouter(options, routing))
      )
      const fast =
        options.fastPath === false
          ? undefined
          : yield* OverlapQuery.makeFastPath({
              view: yield* GlobalView,
              queries: (yield* GlobalDiagnostics.GlobalDiagnostics).queries,
              maxBodyBytes: options.maxBodyBytes ?? DEFAULT_MAX_BODY_BYTES,
              auth: options.auth,
              extraRoutes: routeFastPaths(routing)
            })
      const listener =
        fast === undefined
          ? general
          : (request: IncomingMessage, response: ServerResponse) => {
              if (!fast(request, response)) general(request, response)
            }
      node.on("request", listener)
      yield* Effect.addFinalizer(() => Effect.sync(() => node.off("request", listener)))
      return server
    })
  ).pipe(Layer.provideMerge(NodeHttpServer.layerContext), Layer.provide(GlobalDiagnostics.layer))

/** The routing routes as fast-path handlers. */
const routeFastPaths = (routing: GlobalRoute.GlobalRoutingService) =>
  new Map<string, (text: string) => OverlapQuery.Reply>([
    [RouteQuery.ROUTE_ROUTE, (text) => RouteQuery.answerRoute(routing, RouteQuery.ROUTE_ROUTE, text)],
    [
      RouteQuery.ROUTE_BATCH_ROUTE,
      (text) => RouteQuery.answerRoute(routing, RouteQuery.ROUTE_BATCH_ROUTE, text)
    ]
  ])

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
