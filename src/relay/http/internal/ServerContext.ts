/**
 * One relay HTTP server's shared state (limits, watcher slots, the shutdown signal), its failure
 * type and the `{reason, message}` responses, and reading a bounded request body.
 */

import type * as HttpServerRequest from "@effect/platform/HttpServerRequest"
import * as HttpServerResponse from "@effect/platform/HttpServerResponse"
import * as NodeHttpServerRequest from "@effect/platform-node/NodeHttpServerRequest"
import { Data, type Deferred, type Duration, Effect, Either, type Schema, type Scope } from "effect"
import { bodyTooLargeMessage, boundedMessage, invalidJsonMessage } from "../../../http/ErrorText.js"
import { collectBody, readFailureMessage } from "../../../http/RequestBody.js"
import type * as Prometheus from "../../../observability/Prometheus.js"
import * as RelayMetrics from "../../../observability/RelayMetrics.js"
import { decodeJson, encodeJsonText } from "../../../protocol/Json.js"
import { ErrorBodyJson, type ErrorReason, SubscriberIdJson } from "../../../protocol/RelayApi.js"
import type { KvDcRelayService } from "../../KvDcRelay.js"
import type * as LoadWindows from "../../LoadWindows.js"
import type { KvDcRelayError, PublicationError } from "../../RelayErrors.js"
import type * as Topology from "../../Topology.js"
import type { RelayHttpLimits } from "../RelayHttpOptions.js"
import type { InProgressLimit } from "./SnapshotBody.js"

// ---------------------------------------------------------------------------------------------
// Errors and responses

export class HttpFailure extends Data.TaggedError("HttpFailure")<{
  readonly status: number
  readonly reason: ErrorReason
  readonly message: string
  readonly headers?: Readonly<Record<string, string>> | undefined
}> {}

export const invalidRequest = (message: string) =>
  new HttpFailure({ status: 400, reason: "INVALID_REQUEST", message })

export const internal = (message: string) => new HttpFailure({ status: 500, reason: "INTERNAL", message })

/** 413 for a body over `limit` (naming the flag, and the route when given); the connection closes. */
export const bodyTooLarge = (limit: number, route?: string) =>
  new HttpFailure({
    status: 413,
    reason: "BODY_TOO_LARGE",
    message: bodyTooLargeMessage(limit, route),
    headers: { connection: "close" }
  })

export const JSON_CONTENT_TYPE = "application/json"

export const SSE_HEADERS = { "cache-control": "no-cache", "x-accel-buffering": "no" } as const

const encodeErrorBody = encodeJsonText(ErrorBodyJson)

export const errorBodyText = (reason: ErrorReason, message: string): string =>
  Either.getOrElse(encodeErrorBody({ reason, message: boundedMessage(message) }), () =>
    JSON.stringify({ reason: "INTERNAL", message: "error body could not be encoded" })
  )

export const failureResponse = (failure: HttpFailure): HttpServerResponse.HttpServerResponse =>
  HttpServerResponse.text(errorBodyText(failure.reason, failure.message), {
    status: failure.status,
    contentType: JSON_CONTENT_TYPE,
    headers: failure.headers
  })

/** A JSON response through `schema`; an encoding failure is a 500. */
export const jsonResponder = <A, I>(schema: Schema.Schema<A, I, never>) => {
  const encode = encodeJsonText(schema)
  return (value: A, status = 200): Effect.Effect<HttpServerResponse.HttpServerResponse, HttpFailure> =>
    Either.match(encode(value), {
      onLeft: (error) => Effect.fail(internal(`response could not be encoded: ${error.message}`)),
      onRight: (text) =>
        Effect.succeed(HttpServerResponse.text(text, { status, contentType: JSON_CONTENT_TYPE }))
    })
}

// ---------------------------------------------------------------------------------------------
// Request bodies

/** Strict UTF-8: a request body that is not valid UTF-8 is refused, not patched. */
export const utf8 = new TextDecoder("utf-8", { fatal: true })

/**
 * The request body, at most `limit` bytes: the query routes' `maxRequestBodyBytes`, or a control
 * route's fixed limit (`route` names it in the 413). An oversized body is not read further (Node
 * discards the rest) and the connection is closed after the 413, so the limit bounds memory, not
 * I/O.
 */
export const readBody = (
  request: HttpServerRequest.HttpServerRequest,
  limit: number,
  route?: string
): Effect.Effect<string, HttpFailure> =>
  Effect.suspend(() => {
    const tooLarge = bodyTooLarge(limit, route)
    const incoming = NodeHttpServerRequest.toIncomingMessage(request)
    return Effect.async<Uint8Array, HttpFailure>((resume) => {
      const stop = collectBody(incoming, limit, (outcome) =>
        resume(
          outcome._tag === "Read"
            ? Effect.succeed(outcome.bytes)
            : Effect.fail(
                outcome._tag === "TooLarge" ? tooLarge : invalidRequest(readFailureMessage(outcome.cause))
              )
        )
      )
      return Effect.sync(stop)
    }).pipe(
      Effect.flatMap((bytes) =>
        Effect.try({
          try: () => utf8.decode(bytes),
          catch: () => invalidRequest("request body is not valid UTF-8")
        })
      )
    )
  })

export const parseJsonBody = (text: string): Effect.Effect<unknown, HttpFailure> =>
  Effect.try({
    try: (): unknown => JSON.parse(text),
    catch: (cause) => invalidRequest(invalidJsonMessage(cause))
  })

const decodeSubscriberId = decodeJson(SubscriberIdJson, "contract")

// ---------------------------------------------------------------------------------------------
// Context of one server

export class WatchLimit {
  used = 0
  constructor(
    readonly stream: RelayMetrics.SubscriberStream,
    readonly label: string,
    readonly max: number
  ) {}
}

export interface ServerContext {
  readonly relay: KvDcRelayService
  readonly topology: Topology.TopologyPublisher
  readonly loadWindows: LoadWindows.LoadWindows
  readonly limits: RelayHttpLimits
  readonly poolHeartbeat: Duration.Duration
  readonly readinessResend: Duration.Duration
  readonly watchHeartbeat: Duration.Duration
  readonly writeStallTimeout: Duration.Duration
  readonly catalogWatchers: WatchLimit
  readonly readinessWatchers: WatchLimit
  readonly loadWatchers: WatchLimit
  /** Snapshot responses being written (at most 2). */
  readonly snapshots: InProgressLimit
  /** The server's scope: work that must outlive a request (a terminal frame's delivery). */
  readonly scope: Scope.Scope
  /** Completed when the server begins to shut down. */
  readonly shutdown: Deferred.Deferred<void>
  /** The `/metrics` registry; its per-endpoint collect callbacks read `endpointSamples`. */
  readonly exposition: Prometheus.PrometheusExposition
  /** The endpoints of the latest scrape's stats (kept when a scrape could not get them). */
  endpointSamples: ReadonlyArray<RelayMetrics.EndpointSample>
  /** Requests whose response is not completely written yet (streams included). */
  inFlight: number
}

/** Takes a watcher slot for the rest of the request, or fails with 429. */
export const acquireWatch = (limit: WatchLimit): Effect.Effect<void, HttpFailure, Scope.Scope> =>
  Effect.uninterruptible(
    Effect.gen(function* () {
      if (limit.used >= limit.max) {
        yield* RelayMetrics.limitRejected(limit.stream, "total")
        return yield* Effect.fail(
          new HttpFailure({
            status: 429,
            reason: "RESOURCE_LIMIT",
            message: `Relay ${limit.label} limit ${limit.max} reached`
          })
        )
      }
      limit.used++
      yield* RelayMetrics.subscriberOpened(limit.stream)
      yield* Effect.addFinalizer(() =>
        Effect.zipRight(
          Effect.sync(() => {
            limit.used--
          }),
          RelayMetrics.subscriberClosed(limit.stream)
        )
      )
    })
  )

/** `?subscriber=ID`; required for the catalog watch, optional (but validated) elsewhere. */
export const subscriberParam = (
  query: URLSearchParams,
  required: boolean
): Effect.Effect<string | undefined, HttpFailure> => {
  const value = query.get("subscriber")
  if (value === null) {
    return required
      ? Effect.fail(invalidRequest("missing query parameter subscriber"))
      : Effect.succeed(undefined)
  }
  return Either.match(decodeSubscriberId(value), {
    onLeft: (error) => Effect.fail(invalidRequest(`subscriber: ${error.message}`)),
    onRight: (id) => Effect.succeed(id)
  })
}

export const relayFailure = (error: KvDcRelayError): HttpFailure =>
  error._tag === "RelayShuttingDown"
    ? new HttpFailure({ status: 503, reason: "PUBLICATION_UNAVAILABLE", message: error.message })
    : error._tag === "UnknownEndpoint"
      ? new HttpFailure({ status: 404, reason: "POOL_NOT_FOUND", message: error.message })
      : internal(error.message)

// ---------------------------------------------------------------------------------------------
// Pool-stream error mapping

/**
 * Before the stream starts only the statuses of PROTOCOL §5 are used. A producer found invalid
 * while opening has just been fenced (withdrawn), so it is reported as unavailable.
 */
export const preStreamFailure = (error: PublicationError): HttpFailure => {
  switch (error.kind) {
    case "NotFound":
      return new HttpFailure({ status: 404, reason: "POOL_NOT_FOUND", message: error.message })
    case "ProducerMismatch":
      return new HttpFailure({ status: 409, reason: "PRODUCER_CHANGED", message: error.message })
    case "ResourceExhausted":
    case "SubscriberLagged":
      return new HttpFailure({ status: 429, reason: "RESOURCE_LIMIT", message: error.message })
    case "Unavailable":
    case "SnapshotProgressTimeout":
      return new HttpFailure({ status: 503, reason: "PUBLICATION_UNAVAILABLE", message: error.message })
    case "InvalidPublication":
      return new HttpFailure({
        status: 503,
        reason: "PUBLICATION_UNAVAILABLE",
        message: `invalid publication: ${error.message}`
      })
    case "Internal":
      return internal(error.message)
  }
}

// The publication source reports its own total limit with this text; hub limits are counted by
// the hub itself (`per_pool`, `initialized_hub`).
export const TOTAL_POOL_STREAM_LIMIT = "Relay total pool stream limit"
