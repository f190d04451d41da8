/**
 * The relay's HTTP API (PROTOCOL.md §5), served with `NodeHttpServer`.
 *
 * The routes are those `RelayHttpApi` declares (`protocol/RelayApi.ts`), one handler each, matched
 * by a small table rather than `HttpRouter` because the contract fixes the error bodies of unknown
 * paths (404 `NOT_FOUND`) and wrong methods (405 with `Allow`), which the router does not
 * distinguish. Every error body's message is bounded and worded by `ErrorText`. Settings are in
 * `RelayHttpOptions.ts`; the server's shared state and body reading in `internal/ServerContext.ts`.
 *
 * Streaming responses (the pool stream and the three SSE watches) share three mechanisms
 * (`internal/Streams.ts`):
 * - each waits for the socket to drain before it takes more, so a client that stops reading
 *   stops the taking and the relay-side bounds apply (the hub's 16 frames / 16 MiB per pool
 *   subscriber, the 16-window load buffer): the SSE watches are pulled element by element by the
 *   platform's writer, the pool stream is written by `internal/PoolStreamWriter` straight from
 *   its feed's wake-ups (no fiber per delta);
 * - a write-stall watchdog ends the connection when an element stays unwritten for
 *   `writeStallTimeout`: a client that never reads again cannot hold its stream slot forever;
 * - server shutdown ends every stream (a pool stream with a terminal frame first).
 * A client that disconnects interrupts its request fiber at once, which closes the request
 * scope and frees its stream or watcher slot. A pool stream that becomes terminal (lagged,
 * retired) frees its slot at that moment, before its writer gets to the terminal frame, and its
 * connection is cut if it has not taken that end 5 s later (PROTOCOL §5 ◆, `TerminalDelivery`).
 * The diagnostic snapshot is streamed too (`SnapshotBody`), at most 2 at once.
 *
 * Length: one short handler per declared route (nineteen) and the server's life cycle; what they
 * share lives in `internal/` and the worker queries in `WorkerQueries.ts`.
 */

import * as Http from "node:http"
import * as Https from "node:https"
import type { ServeError } from "@effect/platform/HttpServerError"
import * as HttpServerRequest from "@effect/platform/HttpServerRequest"
import * as HttpServerResponse from "@effect/platform/HttpServerResponse"
import * as NodeHttpServer from "@effect/platform-node/NodeHttpServer"
import * as NodeHttpServerRequest from "@effect/platform-node/NodeHttpServerRequest"
import {
  Cause,
  Clock,
  Deferred,
  Duration,
  Effect,
  Either,
  Option,
  Schema,
  type Scope,
  Stream,
  SubscriptionRef,
  type Take
} from "effect"
import { SNAPSHOT_CHUNK_BUCKETS } from "../../ckf/cbi1.js"
import type { ProducerIdentity } from "../../ckf/identity.js"
import * as BearerAuth from "../../http/BearerAuth.js"
import { methodNotAllowedMessage, noRouteMessage } from "../../http/ErrorText.js"
import { statusPageResponse } from "../../http/StatusPage.js"
import type { EngineLoadAdditions } from "../../load/EngineLoadWindow.js"
import * as Prometheus from "../../observability/Prometheus.js"
import { EMPTY_PUBLISH_DELAY } from "../../observability/PublishDelay.js"
import * as RelayMetrics from "../../observability/RelayMetrics.js"
import { decodeJson, encodeJsonText } from "../../protocol/Json.js"
import { EndpointId } from "../../protocol/Model.js"
import { POOL_STREAM_CONTENT_TYPE } from "../../protocol/PoolStream.js"
import {
  CatalogSnapshotJson,
  type ErrorReason,
  HealthJson,
  type LoadWindowDocument,
  LoadWindowJson,
  ReadinessJson,
  RelayHttpApi,
  RelayInfoJson,
  RelayStatsJson,
  relayOpenApi,
  SubscribeRequestJson,
  SubscriberIdJson,
  unsupportedProducerFeature
} from "../../protocol/RelayApi.js"
import { type RouteName, routesOf } from "../../protocol/Routes.js"
import { sseEvent, sseHeartbeat } from "../../protocol/Sse.js"
import type { KvDcRelayService } from "../KvDcRelay.js"
import * as LoadWindows from "../LoadWindows.js"
import { hasDegradedCoverage } from "../PoolLoad.js"
import type { PublicationError } from "../RelayErrors.js"
import * as Topology from "../Topology.js"
import * as PoolStreamWriter from "./internal/PoolStreamWriter.js"
import {
  acquireWatch,
  errorBodyText,
  failureResponse,
  HttpFailure,
  internal,
  invalidRequest,
  JSON_CONTENT_TYPE,
  jsonResponder,
  parseJsonBody,
  preStreamFailure,
  readBody,
  relayFailure,
  type ServerContext,
  subscriberParam,
  TOTAL_POOL_STREAM_LIMIT,
  WatchLimit
} from "./internal/ServerContext.js"
import {
  InProgressLimit,
  MAX_SNAPSHOTS_IN_PROGRESS,
  snapshotBody,
  yieldToEventLoop
} from "./internal/SnapshotBody.js"
import { forward, guardedBody, Handoff, sseResponse, unlessShutdown, watchStep } from "./internal/Streams.js"
import * as TerminalDelivery from "./internal/TerminalDelivery.js"
import {
  DEFAULT_RELAY_HTTP_HOST,
  DEFAULT_RELAY_HTTP_INTERVALS,
  DEFAULT_RELAY_HTTP_LIMITS,
  DEFAULT_RELAY_HTTP_PORT,
  type RelayHttpAddress,
  type RelayHttpIntervals,
  type RelayHttpLimits,
  type RelayHttpOptions
} from "./RelayHttpOptions.js"
import * as RelayStatusPage from "./RelayStatusPage.js"
import * as WorkerQueries from "./WorkerQueries.js"

export type {
  RelayHttpAddress,
  RelayHttpIntervals,
  RelayHttpLimits,
  RelayHttpOptions
} from "./RelayHttpOptions.js"

/** Bytes a response buffers before its writer waits for the socket (one full CBI1 chunk frame). */
const RESPONSE_HIGH_WATER_MARK = 4 * 1024 * 1024 + 4096

// ---------------------------------------------------------------------------------------------
// Responses

const respondHealth = jsonResponder(HealthJson)
const respondRelayInfo = jsonResponder(RelayInfoJson)
const respondCatalog = jsonResponder(CatalogSnapshotJson)
const respondReadiness = jsonResponder(ReadinessJson)
const respondStats = jsonResponder(RelayStatsJson)

const encodeCatalogText = encodeJsonText(CatalogSnapshotJson)
const encodeReadinessText = encodeJsonText(ReadinessJson)
const encodeLoadWindowText = encodeJsonText(LoadWindowJson)

/**
 * The request's own fields first (unknown fields, `subscriberId`), so those are reported before
 * anything about the producer key, as the reference validates a subscribe request.
 */
const decodeSubscribeEnvelope = decodeJson(
  Schema.Struct({
    subscriberId: SubscriberIdJson,
    expectedProducer: Schema.Record({ key: Schema.String, value: Schema.Unknown })
  }),
  "contract"
)
const decodeSubscribeRequest = decodeJson(SubscribeRequestJson, "contract")

// ---------------------------------------------------------------------------------------------
// Route handlers

type Handler = (
  ctx: ServerContext,
  request: HttpServerRequest.HttpServerRequest,
  query: URLSearchParams,
  params: ReadonlyArray<string>
) => Effect.Effect<HttpServerResponse.HttpServerResponse, HttpFailure, Scope.Scope>

const healthz: Handler = () => Effect.succeed(HttpServerResponse.text("ok", { contentType: "text/plain" }))

const health: Handler = (ctx) =>
  Effect.flatMap(ctx.relay.health, (state) => respondHealth(state, state.healthy ? 200 : 503))

const relayInfo: Handler = (ctx) =>
  respondRelayInfo({ relay: ctx.relay.identity, dcName: ctx.relay.dcName, dcId: ctx.relay.dcId })

const catalog: Handler = (ctx) =>
  Effect.flatMap(SubscriptionRef.get(ctx.relay.catalogRef), (c) => respondCatalog(c))

/**
 * A watch's values: the source's changes of revision, sliding, so that a watcher that falls
 * behind skips to the newest one (coalescing is allowed).
 */
const newestRevisions = <A extends { readonly revision: unknown }>(
  changes: Stream.Stream<A>
): Effect.Effect<Handoff<Take.Take<A>>, never, Scope.Scope> =>
  Effect.gen(function* () {
    const values = new Handoff<Take.Take<A>>(1, true)
    yield* forward(
      Stream.changesWith(changes, (a, b) => a.revision === b.revision),
      values
    )
    return values
  })

/** The response of a watch whose body `step` writes, logged as opened for `subscriber`. */
const openWatch = (
  ctx: ServerContext,
  request: HttpServerRequest.HttpServerRequest,
  label: string,
  subscriber: string | undefined,
  step: Parameters<typeof guardedBody>[3]
) =>
  Effect.gen(function* () {
    yield* Effect.logDebug(`KV DC Relay ${label} opened`).pipe(
      Effect.annotateLogs("subscriber", subscriber ?? "")
    )
    return sseResponse(yield* guardedBody(ctx, request, label, step))
  })

const catalogWatch: Handler = (ctx, request, query) =>
  Effect.gen(function* () {
    const subscriber = yield* subscriberParam(query, true)
    yield* acquireWatch(ctx.catalogWatchers)
    yield* Effect.annotateCurrentSpan("kvrelay.subscriber", subscriber ?? "")
    const values = yield* newestRevisions(ctx.relay.catalogRef.changes)
    const step = yield* watchStep(
      ctx,
      values,
      ctx.watchHeartbeat,
      (snapshot) =>
        Either.match(encodeCatalogText(snapshot), {
          onLeft: (error) => Effect.dieMessage(`catalog could not be encoded: ${error.message}`),
          onRight: (json) => Effect.succeed(sseEvent("catalog", json))
        }),
      Effect.succeed(sseHeartbeat)
    )
    return yield* openWatch(ctx, request, "catalog watch", subscriber, step)
  })

const readinessText = (snapshot: Topology.TopologySnapshot): Effect.Effect<Uint8Array> =>
  Either.match(encodeReadinessText(snapshot), {
    onLeft: (error) => Effect.dieMessage(`readiness could not be encoded: ${error.message}`),
    onRight: (json) => Effect.succeed(sseEvent("readiness", json))
  })

const readiness: Handler = (ctx) =>
  Effect.flatMap(ctx.topology.current, (snapshot) => respondReadiness(snapshot))

const readinessWatch: Handler = (ctx, request, query) =>
  Effect.gen(function* () {
    const subscriber = yield* subscriberParam(query, false)
    yield* acquireWatch(ctx.readinessWatchers)
    const values = yield* newestRevisions(ctx.topology.ref.changes)
    // The re-send carries the current snapshot with its unchanged revision.
    const step = yield* watchStep(
      ctx,
      values,
      ctx.readinessResend,
      readinessText,
      Effect.flatMap(ctx.topology.current, readinessText)
    )
    return yield* openWatch(ctx, request, "readiness watch", subscriber, step)
  })

const loadWindowDocument = (window: LoadWindows.LoadWindow): LoadWindowDocument => ({
  windowSequence: window.windowSequence,
  observedMs: window.observedMs,
  windowMs: window.windowMs,
  pools: window.pools.map((pool) => ({
    producer: pool.producer,
    // Unknown sums go out as 0; observed < expected ranks tell the consumer not to trust them.
    kvUsedBlocks: pool.kvUsedBlocks ?? 0n,
    totalKvBlocks: pool.totalKvBlocks ?? 0n,
    kvObservedRanks: pool.kvObservedRanks,
    kvExpectedRanks: pool.kvExpectedRanks,
    // Engine load: a value no observed rank gave stays out of the JSON, never 0 (PROTOCOL §5 ◆3).
    ...engineFields(pool.engine)
  }))
})

const engineFields = (engine: EngineLoadAdditions | undefined) => {
  if (engine === undefined) return { loadObservedRanks: 0 }
  const fields: {
    runningRequests?: number
    waitingRequests?: number
    kvUsage?: number
    loadObservedRanks: number
  } = { loadObservedRanks: engine.loadObservedRanks }
  if (engine.runningRequests !== undefined) fields.runningRequests = engine.runningRequests
  if (engine.waitingRequests !== undefined) fields.waitingRequests = engine.waitingRequests
  if (engine.kvUsage !== undefined) fields.kvUsage = engine.kvUsage
  return fields
}

const loadWatch: Handler = (ctx, request, query) =>
  Effect.gen(function* () {
    const subscriber = yield* subscriberParam(query, false)
    yield* acquireWatch(ctx.loadWatchers)
    const subscription = yield* ctx.loadWindows.subscribe.pipe(
      Effect.mapError(
        (error) => new HttpFailure({ status: 503, reason: "PUBLICATION_UNAVAILABLE", message: error.message })
      )
    )
    let done = false
    const terminal = (reason: ErrorReason, message: string) => {
      done = true
      // SSE has no terminal frame; an `error` event carries the reason before the stream ends.
      return Option.some(sseEvent("error", errorBodyText(reason, message)))
    }
    const step: Effect.Effect<Option.Option<Uint8Array>> = Effect.gen(function* () {
      if (done) return Option.none()
      const next = yield* unlessShutdown(ctx, Effect.either(subscription.next))
      if (Option.isNone(next)) {
        done = true
        return Option.none()
      }
      const result = next.value
      if (Either.isLeft(result)) {
        if (result.left._tag === "LoadWindowLagged") {
          yield* RelayMetrics.subscriberLaggedOut("load")
          yield* Effect.logWarning("KV DC Relay load watcher lagged; ending its stream").pipe(
            Effect.annotateLogs("subscriber", subscriber ?? "")
          )
          return terminal("SUBSCRIBER_LAGGED", result.left.message)
        }
        return terminal("PUBLICATION_UNAVAILABLE", result.left.message)
      }
      return yield* Either.match(encodeLoadWindowText(loadWindowDocument(result.right)), {
        onLeft: (error) => Effect.dieMessage(`load window could not be encoded: ${error.message}`),
        onRight: (json) => Effect.succeed(Option.some(sseEvent("load", json)))
      })
    })
    return sseResponse(yield* guardedBody(ctx, request, "load watch", step))
  })

const decodeSubscribe = (
  body: unknown
): Effect.Effect<{ subscriberId: string; expected: ProducerIdentity }, HttpFailure> =>
  Effect.gen(function* () {
    const envelope = decodeSubscribeEnvelope(body)
    if (Either.isLeft(envelope)) return yield* Effect.fail(invalidRequest(envelope.left.message))
    const unsupported = unsupportedProducerFeature(envelope.right.expectedProducer)
    if (unsupported !== undefined) {
      return yield* Effect.fail(
        new HttpFailure({
          status: 422,
          reason: "UNSUPPORTED_FEATURE",
          message: `expectedProducer: ${unsupported}`
        })
      )
    }
    const request = decodeSubscribeRequest(body)
    if (Either.isLeft(request)) return yield* Effect.fail(invalidRequest(request.left.message))
    return { subscriberId: request.right.subscriberId, expected: request.right.expectedProducer }
  })

const poolSubscribe: Handler = (ctx, request) =>
  Effect.gen(function* () {
    const body = yield* parseJsonBody(
      yield* readBody(request, ctx.limits.maxControlBodyBytes, "POST /v1/pools/subscribe")
    )
    const { subscriberId, expected } = yield* decodeSubscribe(body)
    yield* Effect.annotateCurrentSpan({
      "kvrelay.subscriber": subscriberId,
      "kvrelay.pool": expected.poolId.toString(),
      "kvrelay.layout_generation": String(expected.layoutGeneration)
    })
    // Completes the moment the stream is terminal (lagged, retired, stalled), which for a client
    // that stopped reading is long before the writer reaches the terminal frame.
    const ended = yield* Deferred.make<PublicationError>()
    const feed = yield* ctx.relay.subscribePoolFeed(expected, subscriberId, ended).pipe(
      Effect.tapError((error) =>
        error.kind === "ResourceExhausted" && error.message.startsWith(TOTAL_POOL_STREAM_LIMIT)
          ? RelayMetrics.limitRejected("pool", "total")
          : Effect.void
      ),
      Effect.mapError(preStreamFailure)
    )
    // The subscriber leaves the gauge when its stream is terminal or its request ends, once.
    let counted = false
    const uncount = Effect.suspend(() => {
      if (!counted) return Effect.void
      counted = false
      return RelayMetrics.subscriberClosed("pool")
    })
    yield* Effect.acquireRelease(
      Effect.zipRight(
        RelayMetrics.subscriberOpened("pool"),
        Effect.sync(() => {
          counted = true
        })
      ),
      () => uncount
    )
    // The publication source gave the stream slot back when `ended` completed; the connection
    // then has 5 s to take the end of the stream. That wait outlives the request scope, which
    // closes once the last frame was handed to Node, not once Node could send it.
    const response = NodeHttpServerRequest.toServerResponse(request)
    yield* Deferred.await(ended).pipe(
      Effect.zipRight(uncount),
      Effect.zipRight(Effect.forkIn(TerminalDelivery.deliverOrCut(response, "pool"), ctx.scope)),
      Effect.interruptible,
      Effect.forkScoped
    )
    const log = (message: string) =>
      Effect.annotateLogs(Effect.logInfo(message), {
        subscriberId,
        poolId: expected.poolId.toString(),
        layoutGeneration: String(expected.layoutGeneration)
      })
    yield* log("KV DC Relay pool stream opened")

    // The body is written straight to the response from the feed's wake-ups (`PoolStreamWriter`);
    // the platform only writes the head, runs the writer, and ends the response after it.
    const written = PoolStreamWriter.writeBody({
      response,
      feed,
      snapshotChunks: Math.ceil(expected.format.bucketCount / SNAPSHOT_CHUNK_BUCKETS),
      heartbeat: ctx.poolHeartbeat,
      writeStallTimeout: ctx.writeStallTimeout,
      shutdown: ctx.shutdown,
      onHeartbeat: RelayMetrics.poolHeartbeatSent,
      errorBody: errorBodyText
    }).pipe(
      Effect.flatMap((end) =>
        Effect.zipRight(
          end.defect === undefined
            ? Effect.void
            : Effect.logError("KV DC Relay pool stream failed", Cause.die(end.defect)),
          log("KV DC Relay pool stream ended").pipe(
            Effect.annotateLogs({ reason: end.reason, message: end.message })
          )
        )
      )
    )
    return HttpServerResponse.stream(Stream.execute(written), {
      contentType: POOL_STREAM_CONTENT_TYPE,
      headers: { "cache-control": "no-store" }
    })
  })

const stats: Handler = (ctx) =>
  Effect.flatMap(Effect.mapError(ctx.relay.stats, relayFailure), (value) => respondStats(value))

/** A snapshot place for the rest of the request (until its body was handed to Node), or 429. */
const admitSnapshot = (limit: InProgressLimit): Effect.Effect<void, HttpFailure, Scope.Scope> =>
  Effect.uninterruptible(
    Effect.suspend(() => {
      if (!limit.tryAcquire()) {
        return Effect.fail(
          new HttpFailure({
            status: 429,
            reason: "RESOURCE_LIMIT",
            message: `Relay snapshot limit ${limit.max} reached; retry once a snapshot in progress is done`
          })
        )
      }
      return Effect.addFinalizer(() => Effect.sync(() => limit.release()))
    })
  )

/**
 * The barrier snapshot, streamed (PROTOCOL §5 ◆): the actor's barrier hands out its own copy of
 * the words, and the body is base64-encoded a slice at a time, one event-loop turn per slice.
 */
const endpointSnapshot: Handler = (ctx, request, _query, params) =>
  Effect.gen(function* () {
    let text: string
    try {
      text = decodeURIComponent(params[0]!)
    } catch {
      return yield* Effect.fail(invalidRequest("endpoint path segment is not valid percent-encoding"))
    }
    const endpoint = EndpointId.parse(text)
    if (Either.isLeft(endpoint)) return yield* Effect.fail(invalidRequest(endpoint.left.message))
    // Admitted before the barrier: at most two copies of the words exist because of this route.
    yield* admitSnapshot(ctx.snapshots)
    const snapshot = yield* Effect.mapError(ctx.relay.diagnosticSnapshot(endpoint.right), relayFailure)
    const body = snapshotBody(
      {
        layoutGeneration: snapshot.layoutGeneration,
        sequence: snapshot.sequence,
        memberCount: snapshot.memberCount,
        uniqueBlockCount: snapshot.uniqueBlockCount,
        format: snapshot.producer.format
      },
      snapshot.words
    )
    if (Either.isLeft(body)) {
      return yield* Effect.fail(internal(`response could not be encoded: ${body.left.message}`))
    }
    let first = true
    const step: Effect.Effect<Option.Option<Uint8Array>> = Effect.suspend(() => {
      const slice = () => Effect.sync(() => Option.fromNullable(body.right.next()))
      if (first) {
        first = false
        return slice()
      }
      return Effect.zipRight(yieldToEventLoop, slice())
    })
    return HttpServerResponse.stream(yield* guardedBody(ctx, request, "snapshot", step), {
      contentType: JSON_CONTENT_TYPE,
      contentLength: body.right.byteLength
    })
  })

const flush: Handler = (ctx) =>
  Effect.as(Effect.mapError(ctx.relay.flush, relayFailure), HttpServerResponse.empty({ status: 204 }))

/** Gauges that mirror relay state are refreshed from it on each scrape. */
const refreshGauges = (ctx: ServerContext): Effect.Effect<void> =>
  Effect.gen(function* () {
    yield* RelayMetrics.initializeRelayMetrics
    const catalogNow = yield* SubscriptionRef.get(ctx.relay.catalogRef)
    yield* RelayMetrics.setCatalog(catalogNow.size, catalogNow.revision)
    yield* RelayMetrics.setPublicationHubCounts(ctx.relay.publicationHubCounts())
    const topology = yield* ctx.topology.current
    const counts = { ready: 0, unavailable: 0, unknown: 0 }
    for (const entry of topology.entries) {
      if (entry.state === "READY") counts.ready++
      else if (entry.state === "UNAVAILABLE") counts.unavailable++
      else counts.unknown++
    }
    yield* RelayMetrics.setServingTopologyCounts(counts)
    const load = yield* SubscriptionRef.get(ctx.relay.loadRef)
    yield* RelayMetrics.setDegradedLoadCoverage(load.filter(hasDegradedCoverage).length)
    yield* RelayMetrics.setSourceCounts((yield* ctx.relay.health).sources)
    // Stats go through the actors; a busy relay must not stall the scrape.
    const relayStats = yield* ctx.relay.stats.pipe(Effect.timeoutOption("2 seconds"), Effect.option)
    if (Option.isNone(relayStats) || Option.isNone(relayStats.value)) return
    ctx.endpointSamples = relayStats.value.value.endpoints.map((endpoint) => ({
      endpoint: endpoint.servingEndpoint.toString(),
      events: endpoint.ingest.events,
      blocks: endpoint.ingest.blocks,
      malformed: endpoint.ingest.malformed,
      gaps: endpoint.ingest.gaps,
      recoveries: endpoint.ingest.recoveries,
      mailboxDepth: endpoint.actor?.mailboxDepth ?? 0,
      publicationSequence: endpoint.publication?.sequence ?? 0n,
      publishDelay: endpoint.actor?.publishDelay ?? EMPTY_PUBLISH_DELAY
    }))
  })

const metrics: Handler = (ctx) =>
  Effect.zipRight(
    refreshGauges(ctx),
    ctx.exposition.text.pipe(
      Effect.map((text) => HttpServerResponse.text(text, { contentType: ctx.exposition.contentType })),
      Effect.mapError((error) => internal(`metrics could not be rendered: ${error.message}`))
    )
  )

// ---------------------------------------------------------------------------------------------
// Routing

type Method = "GET" | "POST"

interface RouteEntry {
  readonly template: string
  readonly match: (path: string) => ReadonlyArray<string> | undefined
  readonly methods: Partial<Record<Method, Handler>>
}

/** `GET /v1/openapi.json`, rendered once. */
let openApiText: string | undefined
const openApi: Handler = () =>
  Effect.sync(() => {
    openApiText ??= JSON.stringify(relayOpenApi())
    return HttpServerResponse.text(openApiText, { contentType: JSON_CONTENT_TYPE })
  })

/** The handler of each route `RelayHttpApi` declares. */
const HANDLERS: { readonly [Name in RouteName<typeof RelayHttpApi>]: Handler } = {
  statusPage: () => Effect.sync(() => statusPageResponse(RelayStatusPage.RELAY_STATUS_PAGE)),
  healthz,
  health,
  relayInfo,
  catalog,
  catalogWatch,
  poolSubscribe,
  readiness,
  readinessWatch,
  loadWatch,
  stats,
  endpointSnapshot,
  flush,
  workerQuery: (ctx, request) => WorkerQueries.workerQuery(ctx, request),
  dynamoQuery: (ctx, request) => WorkerQueries.dynamoQuery(ctx, request),
  dynamoQueryByHash: (ctx, request) => WorkerQueries.dynamoQueryByHash(ctx, request),
  dynamoWorkers: (ctx, _request, query) => WorkerQueries.dynamoWorkers(ctx, query),
  metrics,
  openApi
}

/** The routes by path, in the order `RelayHttpApi` declares them. */
const ROUTES: ReadonlyArray<RouteEntry> = routesOf(RelayHttpApi).reduce<Array<RouteEntry>>((table, route) => {
  const handler = HANDLERS[route.name]
  const known = table.find((entry) => entry.template === route.template)
  if (known === undefined)
    table.push({ template: route.template, match: route.match, methods: { [route.method]: handler } })
  else (known.methods as Record<string, Handler>)[route.method] = handler
  return table
}, [])

const dispatch = (
  ctx: ServerContext
): Effect.Effect<
  HttpServerResponse.HttpServerResponse,
  never,
  HttpServerRequest.HttpServerRequest | Scope.Scope
> =>
  Effect.gen(function* () {
    const request = yield* HttpServerRequest.HttpServerRequest
    // The request scope closes once the response is written, so this counts whole responses.
    yield* Effect.acquireRelease(
      Effect.sync(() => {
        ctx.inFlight++
      }),
      () =>
        Effect.sync(() => {
          ctx.inFlight--
        })
    )
    const method = request.method
    const queryAt = request.url.indexOf("?")
    const path = queryAt < 0 ? request.url : request.url.slice(0, queryAt)
    const query = new URLSearchParams(queryAt < 0 ? "" : request.url.slice(queryAt + 1))
    let route: RouteEntry | undefined
    let params: ReadonlyArray<string> = []
    for (const candidate of ROUTES) {
      const matched = candidate.match(path)
      if (matched !== undefined) {
        route = candidate
        params = matched
        break
      }
    }
    const template = route?.template ?? "unmatched"
    const handled: Effect.Effect<HttpServerResponse.HttpServerResponse, HttpFailure, Scope.Scope> =
      Effect.suspend(() => {
        if (route === undefined) {
          return Effect.fail(
            new HttpFailure({ status: 404, reason: "NOT_FOUND", message: noRouteMessage(method, path) })
          )
        }
        const handler = route.methods[method as Method]
        if (handler === undefined) {
          const allowed = Object.keys(route.methods).join(", ")
          return Effect.fail(
            new HttpFailure({
              status: 405,
              reason: "INVALID_REQUEST",
              message: methodNotAllowedMessage(method, route.template, allowed),
              headers: { allow: allowed }
            })
          )
        }
        // The platform runs apps uninterruptibly; fibers forked here would inherit that and
        // could never be interrupted when the request scope closes.
        return Effect.interruptible(handler(ctx, request, query, params))
      })
    return yield* handled.pipe(
      Effect.catchTag("HttpFailure", (failure) => Effect.succeed(failureResponse(failure))),
      Effect.catchAllCause((cause) =>
        Effect.zipRight(
          Effect.logError("KV DC Relay HTTP handler failed", cause),
          Effect.succeed(failureResponse(internal("internal error")))
        )
      ),
      Effect.tap((response) =>
        Effect.zipRight(
          Effect.annotateCurrentSpan("http.response.status_code", response.status),
          (response.status >= 500 ? Effect.logWarning : Effect.logDebug)("KV DC Relay HTTP request").pipe(
            Effect.annotateLogs({ method, path, status: response.status })
          )
        )
      ),
      Effect.withSpan(`HTTP ${method} ${template}`, {
        kind: "server",
        attributes: { "http.request.method": method, "http.route": template, "url.path": path }
      })
    )
  })

// ---------------------------------------------------------------------------------------------
// Construction

interface RelayHttpApp {
  /** The HTTP app; run it with a per-request scope (as every platform server does). */
  readonly app: Effect.Effect<
    HttpServerResponse.HttpServerResponse,
    never,
    HttpServerRequest.HttpServerRequest | Scope.Scope
  >
  /** Ends every open stream (pool streams with a terminal frame) and refuses nothing else. */
  readonly beginShutdown: Effect.Effect<void>
  /** Requests whose response is not completely written yet. */
  readonly inFlight: () => number
}

const durationOf = (input: Duration.DurationInput): Duration.Duration => Duration.decode(input)

/** The app over `relay`; topology and load publishers (unless given) live in the current scope. */
const makeApp = (
  relay: KvDcRelayService,
  options: RelayHttpOptions = {}
): Effect.Effect<RelayHttpApp, never, Scope.Scope> =>
  Effect.gen(function* () {
    const limits: RelayHttpLimits = { ...DEFAULT_RELAY_HTTP_LIMITS, ...options.limits }
    const intervals: RelayHttpIntervals = { ...DEFAULT_RELAY_HTTP_INTERVALS, ...options.intervals }
    yield* RelayMetrics.initializeRelayMetrics
    const topology =
      options.topology ??
      (yield* Topology.make({ membershipRef: relay.membershipRef, catalogRef: relay.catalogRef }))
    const loadWindows =
      options.loadWindows ??
      (yield* LoadWindows.make(relay.loadRef, {
        window: intervals.loadWindow,
        fanoutCapacity: options.loadFanoutCapacity,
        engineLoad: relay.engineLoad?.additions,
        onWindow: () => RelayMetrics.loadWindowEmitted
      }))
    const exposition = yield* Prometheus.make({
      effectMetricPrefixes: ["kv_dc_relay_", "kvrelay_supervised_"]
    })
    const shutdown = yield* Deferred.make<void>()
    const ctx: ServerContext = {
      relay,
      topology,
      loadWindows,
      limits,
      poolHeartbeat: durationOf(intervals.poolHeartbeat),
      readinessResend: durationOf(intervals.readinessResend),
      watchHeartbeat: durationOf(intervals.watchHeartbeat),
      writeStallTimeout: durationOf(intervals.writeStallTimeout),
      catalogWatchers: new WatchLimit("catalog", "catalog stream", limits.maxCatalogWatchers),
      readinessWatchers: new WatchLimit("readiness", "readiness stream", limits.maxReadinessWatchers),
      loadWatchers: new WatchLimit("load", "load stream", limits.maxLoadWatchers),
      snapshots: new InProgressLimit(MAX_SNAPSHOTS_IN_PROGRESS),
      scope: yield* Effect.scope,
      shutdown,
      exposition,
      endpointSamples: [],
      inFlight: 0
    }
    RelayMetrics.registerEndpointMetrics(exposition.registry, () => ctx.endpointSamples)
    return {
      app: dispatch(ctx),
      beginShutdown: Deferred.succeed(shutdown, undefined),
      inFlight: () => ctx.inFlight
    }
  })

const urlHost = (host: string): string => (host.includes(":") ? `[${host}]` : host)

/**
 * Serves `relay` until the current scope closes and returns the bound address (the actual port
 * when port 0 was asked). Closing the scope stops accepting, ends every stream, waits up to
 * `shutdownGrace` for responses to finish, then closes the remaining connections.
 */
export const serve = (
  relay: KvDcRelayService,
  options: RelayHttpOptions = {}
): Effect.Effect<RelayHttpAddress, ServeError, Scope.Scope> =>
  Effect.gen(function* () {
    const { app, beginShutdown, inFlight } = yield* makeApp(relay, options)
    // A response may buffer one full snapshot chunk before the writer waits for `drain`: waiting
    // needs an event-loop turn, and a delta burst arriving meanwhile would overflow the
    // subscriber's 16-frame queue and lag a client that is reading perfectly well.
    const nodeServer: Http.Server =
      options.tls === undefined
        ? Http.createServer({ highWaterMark: RESPONSE_HIGH_WATER_MARK })
        : Https.createServer({ ...options.tls, highWaterMark: RESPONSE_HIGH_WATER_MARK })
    const server = yield* NodeHttpServer.make(() => nodeServer, {
      host: options.host ?? DEFAULT_RELAY_HTTP_HOST,
      port: options.port ?? DEFAULT_RELAY_HTTP_PORT
    })
    // The worker-query routes are offered to their fast path first (`WorkerQueries`); the router
    // takes every request it leaves.
    const general = yield* NodeHttpServer.makeHandler(BearerAuth.guard(options.auth)(app))
    const fast = yield* WorkerQueries.makeFastPath(relay, {
      maxBodyBytes: options.limits?.maxRequestBodyBytes ?? DEFAULT_RELAY_HTTP_LIMITS.maxRequestBodyBytes,
      auth: options.auth
    })
    const listener = (request: Http.IncomingMessage, response: Http.ServerResponse) => {
      if (!fast.handle(request, response)) general(request, response)
    }
    nodeServer.on("request", listener)
    yield* Effect.addFinalizer(() => Effect.sync(() => nodeServer.off("request", listener)))
    const pending = () => inFlight() + fast.inFlight()
    const grace = durationOf(options.intervals?.shutdownGrace ?? DEFAULT_RELAY_HTTP_INTERVALS.shutdownGrace)
    yield* Effect.addFinalizer(() =>
      Effect.gen(function* () {
        nodeServer.close()
        yield* beginShutdown
        // Streams end at the shutdown signal; short requests finish on their own. What is left
        // afterwards are idle keep-alive connections (or responses stuck past the grace).
        const deadline = (yield* Clock.currentTimeMillis) + Duration.toMillis(grace)
        while (pending() > 0 && (yield* Clock.currentTimeMillis) < deadline) yield* Effect.sleep("10 millis")
        if (pending() > 0) {
          yield* Effect.logWarning(
            "KV DC Relay HTTP responses still open after the shutdown grace; closing them"
          ).pipe(Effect.annotateLogs("responses", pending()))
        }
        nodeServer.closeAllConnections()
      })
    )
    const address = server.address
    const host = address._tag === "TcpAddress" ? address.hostname : (options.host ?? DEFAULT_RELAY_HTTP_HOST)
    const port = address._tag === "TcpAddress" ? address.port : 0
    const scheme = options.tls === undefined ? "http" : "https"
    const bound: RelayHttpAddress = { host, port, url: `${scheme}://${urlHost(host)}:${port}` }
    yield* Effect.logInfo("KV DC Relay HTTP API listening").pipe(Effect.annotateLogs("url", bound.url))
    return bound
  })
