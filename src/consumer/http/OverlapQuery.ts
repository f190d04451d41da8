/**
 * The overlap routes of the global consumer (`POST /v1/overlap`, `POST /v1/overlap/batch`,
 * PROTOCOL §7): their bodies decoded, their answers and errors rendered, and a fast path that
 * serves them straight from the `node:http` request event.
 *
 * Why a fast path: through @effect/platform's router each query cost a fiber, the router and
 * middleware, a body stream, a Schema encode of the answer and a span even with tracing off,
 * about 15x what parsing the body and computing the answer cost (docs/decisions.md, "Overlap
 * over HTTP"). The fast path takes only what it can answer alike: `POST` to exactly these two
 * paths, with a token accepted when the server requires one. Everything else (other methods,
 * query strings, refused tokens, every other route) goes to the router, which stays the general
 * path. Both paths render every reply with the same functions below, record the same query
 * statistics, and open the same server span when a tracer is installed.
 */

import type { IncomingMessage, ServerResponse } from "node:http"
import * as Headers from "@effect/platform/Headers"
import * as HttpTraceContext from "@effect/platform/HttpTraceContext"
import { Context, Effect, Either, Exit, FiberRef, Option, Runtime, type Tracer } from "effect"
import { authorizationProblem, type TokenFile } from "../../http/BearerAuth.js"
import {
  bodyTooLargeMessage,
  boundedMessage,
  describeValue,
  invalidJsonMessage,
  quoted
} from "../../http/ErrorText.js"
import { collectBody, readFailureMessage } from "../../http/RequestBody.js"
import {
  DomainLocalOverlapJson,
  DomainTokensOverlapJson,
  MAX_OVERLAP_BATCH,
  ModelLocalOverlapJson,
  ModelTokensOverlapJson,
  OverlapBatchResponseJson,
  OverlapResponseJson,
  OverlapResultJson
} from "../../protocol/GlobalApi.js"
import { decodeJson, encodeJson, MAX_JSON_DEPTH, nestedDeeperThan } from "../../protocol/Json.js"
import type { ErrorReason } from "../../protocol/RelayApi.js"
import type { OverlapError } from "../ConsumerErrors.js"
import type { GlobalViewService, OverlapRequest, OverlapResult } from "../GlobalView.js"
import type { QueryStats } from "./GlobalDiagnostics.js"

// ---------------------------------------------------------------------------------------------
// Bodies

const decodeModelTokens = decodeJson(ModelTokensOverlapJson, "contract")
const decodeModelLocal = decodeJson(ModelLocalOverlapJson, "contract")
const decodeDomainTokens = decodeJson(DomainTokensOverlapJson, "contract")
const decodeDomainLocal = decodeJson(DomainLocalOverlapJson, "contract")

const QUERY_FORMS =
  "{namespace, model, tokens, loraName?} or {namespace, model, localBlockHashes} (poolDomain in place of namespace and model)"

/** A JSON object (not null, not an array). */
export const isPlainObject = (value: unknown): value is Record<string, unknown> =>
  typeof value === "object" && value !== null && !Array.isArray(value)

const FIELDS = {
  modelTokens: new Set(["namespace", "model", "tokens", "loraName"]),
  modelLocal: new Set(["namespace", "model", "localBlockHashes"]),
  domainTokens: new Set(["poolDomain", "tokens", "loraName"]),
  domainLocal: new Set(["poolDomain", "localBlockHashes"])
} as const

/** The first field of `body` its form does not have, in the contract's words, or undefined. */
const unknownField = (
  body: Record<string, unknown>,
  byDomain: boolean,
  byTokens: boolean
): string | undefined => {
  const allowed = byDomain
    ? byTokens
      ? FIELDS.domainTokens
      : FIELDS.domainLocal
    : byTokens
      ? FIELDS.modelTokens
      : FIELDS.modelLocal
  for (const key in body) {
    if (allowed.has(key)) continue
    const hint =
      key === "loraName"
        ? ": loraName goes with tokens only (local block hashes are already salted by the adapter)"
        : byDomain && (key === "namespace" || key === "model")
          ? ": poolDomain takes the place of namespace and model"
          : ""
    return `unknown field ${quoted(key)}${hint}`
  }
  return undefined
}

/**
 * One overlap body, already parsed from JSON: by model or by `poolDomain` (its presence
 * decides), by `tokens` or by `localBlockHashes`. The engines' own block hashes are no query
 * form: filters are addressed canonically (PROTOCOL §3.3), so they would never match. Every
 * message names the field at fault in the contract's words and never repeats the body.
 */
export const decodeOverlapRequest = (parsed: unknown): OverlapRequest | string => {
  if (!isPlainObject(parsed)) return `expected a JSON object ${QUERY_FORMS}, got ${describeValue(parsed)}`
  if ("blockHashes" in parsed) {
    return `blockHashes (engine block hashes) is not a query form: relays address blocks by canonical hashes of their tokens; give ${QUERY_FORMS}`
  }
  const byTokens = "tokens" in parsed
  if (byTokens === "localBlockHashes" in parsed) {
    return byTokens
      ? "give tokens or localBlockHashes, not both"
      : `the query has neither tokens nor localBlockHashes; give ${QUERY_FORMS}`
  }
  const byDomain = "poolDomain" in parsed
  const unknown = unknownField(parsed, byDomain, byTokens)
  if (unknown !== undefined) return unknown
  if (!byTokens && !Array.isArray(parsed.localBlockHashes)) {
    return `localBlockHashes must be an array of u64 local block hashes (decimal strings, or numbers up to 2^53), got ${describeValue(parsed.localBlockHashes)}`
  }
  if (byTokens && !Array.isArray(parsed.tokens)) {
    return `tokens must be an array of u32 token ids, got ${describeValue(parsed.tokens)}`
  }
  const decoded = byDomain
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

/** A body's JSON, or why it is none (never quoting the body). */
export const parseJson = (text: string): { readonly value: unknown } | string => {
  try {
    return { value: JSON.parse(text) }
  } catch (cause) {
    return invalidJsonMessage(cause)
  }
}

/** `decodeOverlapRequest` of a body's text. */
export const parseOverlapRequest = (text: string): OverlapRequest | string => {
  const parsed = parseJson(text)
  return typeof parsed === "string" ? parsed : decodeOverlapRequest(parsed.value)
}

/**
 * `{queries: [body…]}` of 1 to `max` bodies of `kind` (`overlap`, `route`): every body decoded by
 * `decode`, or the first bad one named by its index. The batch routes of both kinds share it.
 */
export const parseQueryBatch = <R>(
  text: string,
  kind: string,
  max: number,
  decode: (body: unknown) => R | string
): ReadonlyArray<R> | string => {
  const form = `{queries: [${kind} body, …]} with 1 to ${max} bodies`
  const parsed = parseJson(text)
  if (typeof parsed === "string") return parsed
  const body = parsed.value
  if (!isPlainObject(body)) return `expected a JSON object ${form}, got ${describeValue(body)}`
  // Effect's decoder and its messages recurse: refuse absurd nesting before anything is decoded.
  if (nestedDeeperThan(body, MAX_JSON_DEPTH))
    return `the value is nested deeper than ${MAX_JSON_DEPTH} levels`
  for (const key in body) if (key !== "queries") return `unknown field ${quoted(key)}; the body is ${form}`
  if (!("queries" in body)) return `missing field "queries": the body is ${form}`
  const queries = body.queries
  if (!Array.isArray(queries)) {
    return `queries must be an array of 1 to ${max} ${kind} bodies, got ${describeValue(queries)}`
  }
  if (queries.length < 1 || queries.length > max) {
    return `queries must hold 1 to ${max} ${kind} bodies, got ${queries.length}`
  }
  const requests: Array<R> = []
  for (let i = 0; i < queries.length; i++) {
    const request = decode(queries[i])
    if (typeof request === "string") return `queries[${i}]: ${request}`
    requests.push(request)
  }
  return requests
}

/** `{queries: [overlap body…]}`: every body decoded, or the first bad one named by its index. */
export const parseOverlapBatch = (text: string): ReadonlyArray<OverlapRequest> | string =>
  parseQueryBatch(text, "overlap", MAX_OVERLAP_BATCH, decodeOverlapRequest)

// ---------------------------------------------------------------------------------------------
// Replies

/** A reply's status and JSON text; both paths send it as `application/json`. */
export interface Reply {
  readonly status: number
  readonly body: string
}

/** A JSON error reply `{reason, message}` with `status`. */
export const errorReply = (status: number, reason: ErrorReason, message: string): Reply => ({
  status,
  body: JSON.stringify({ reason, message: boundedMessage(message) })
})

/** The status and reason of a view's error (PROTOCOL §7 ◆3). */
export const overlapErrorBody = (
  error: OverlapError
): { readonly status: number; readonly reason: ErrorReason } => {
  switch (error._tag) {
    case "ModelNotFound":
      return { status: 404, reason: "MODEL_NOT_FOUND" }
    case "AdapterNotFound":
      return { status: 404, reason: "ADAPTER_NOT_FOUND" }
    case "NoMatchingDomain":
      return { status: 404, reason: "POOL_NOT_FOUND" }
    case "NoReadyLane":
      return { status: 503, reason: "NO_READY_LANE" }
  }
}

const encodeResponse = encodeJson(OverlapResponseJson)
const encodeBatchResponse = encodeJson(OverlapBatchResponseJson)
const encodeResult = encodeJson(OverlapResultJson)

/**
 * A result's JSON up to its two numbers, `{"relay":…,"servingEndpoint":{…}`, encoded by the
 * schema once per lane: relay, lane, pool and endpoint change only when a lane is replaced, and
 * encoding the pool's digests through the schema was most of an answer's cost.
 */
interface LanePrefix {
  readonly relay: string
  readonly lane: number
  readonly servingEndpoint: OverlapResult["servingEndpoint"]
  readonly text: string
}

const prefixes = new WeakMap<OverlapResult["poolId"], LanePrefix>()

const isU32 = (n: number): boolean => Number.isInteger(n) && n >= 0 && n <= 0xffff_ffff

/** The JSON of one result as the schema would render it, or undefined to leave it to the schema. */
const resultJson = (result: OverlapResult): string | undefined => {
  // Numbers the schema would reject or JSON would render as null take the general encoder.
  if (!isU32(result.prefixDepth) || !Number.isFinite(result.matchedTokens)) return undefined
  let prefix = prefixes.get(result.poolId)
  if (
    prefix === undefined ||
    prefix.relay !== result.relay ||
    prefix.lane !== result.lane ||
    prefix.servingEndpoint !== result.servingEndpoint
  ) {
    const encoded = encodeResult(result)
    if (Either.isLeft(encoded)) return undefined
    const { relay, lane, poolId, servingEndpoint } = encoded.right
    const text = JSON.stringify({ relay, lane, poolId, servingEndpoint })
    prefix = {
      relay: result.relay,
      lane: result.lane,
      servingEndpoint: result.servingEndpoint,
      text: text.slice(0, -1)
    }
    prefixes.set(result.poolId, prefix)
  }
  return `${prefix.text},"prefixDepth":${result.prefixDepth},"matchedTokens":${result.matchedTokens}}`
}

/** `[result,…]` as JSON text, or undefined when any result must take the schema. */
const resultsJson = (results: ReadonlyArray<OverlapResult>): string | undefined => {
  let text = "["
  for (let i = 0; i < results.length; i++) {
    const one = resultJson(results[i]!)
    if (one === undefined) return undefined
    text += i === 0 ? one : `,${one}`
  }
  return `${text}]`
}

const isError = (answer: ReadonlyArray<OverlapResult> | OverlapError): answer is OverlapError =>
  !Array.isArray(answer)

/** The `/v1/overlap` reply to a view's answer. */
export const overlapReply = (answer: ReadonlyArray<OverlapResult> | OverlapError): Reply => {
  if (isError(answer)) {
    const { status, reason } = overlapErrorBody(answer)
    return errorReply(status, reason, answer.message)
  }
  const results = answer as ReadonlyArray<OverlapResult>
  const fast = resultsJson(results)
  if (fast !== undefined) return { status: 200, body: `{"results":${fast}}` }
  const json = encodeResponse({ results })
  return Either.isRight(json)
    ? { status: 200, body: JSON.stringify(json.right) }
    : errorReply(500, "INTERNAL", `overlap answer could not be encoded: ${json.left.message}`)
}

/** A query's entry in a batch's `errors`: null, or its error body. */
const errorEntry = (answer: ReadonlyArray<OverlapResult> | OverlapError) => {
  if (!isError(answer)) return null
  return { reason: overlapErrorBody(answer).reason, message: boundedMessage(answer.message) }
}

/**
 * The `/v1/overlap/batch` reply (PROTOCOL §7 ◆3): `results` holds one list per query, `[]` for a
 * query that got an error, and `errors` that error at the same index (null for the others).
 */
export const batchReply = (answers: ReadonlyArray<ReadonlyArray<OverlapResult> | OverlapError>): Reply => {
  let fast: string | undefined = `{"results":[`
  let errors = `],"errors":[`
  for (let i = 0; i < answers.length && fast !== undefined; i++) {
    const answer = answers[i]!
    const one = isError(answer) ? "[]" : resultsJson(answer)
    fast = one === undefined ? undefined : i === 0 ? fast + one : `${fast},${one}`
    const error = errorEntry(answer)
    const entry = error === null ? "null" : JSON.stringify(error)
    errors = i === 0 ? errors + entry : `${errors},${entry}`
  }
  if (fast !== undefined) return { status: 200, body: `${fast}${errors}]}` }
  const json = encodeBatchResponse({
    results: answers.map((answer) => (isError(answer) ? [] : answer)),
    errors: answers.map(errorEntry)
  })
  return Either.isRight(json)
    ? { status: 200, body: JSON.stringify(json.right) }
    : errorReply(500, "INTERNAL", `overlap answers could not be encoded: ${json.left.message}`)
}

/** The view's answers to a batch's queries, errors included. */
export const batchAnswers = (
  view: GlobalViewService,
  requests: ReadonlyArray<OverlapRequest>
): ReadonlyArray<ReadonlyArray<OverlapResult> | OverlapError> =>
  requests.map((request) => view.overlapNow(request))

/** 413 `BODY_TOO_LARGE` of the query routes, whose limit is `--max-request-body-bytes`. */
const tooLarge = (limit: number): Reply => errorReply(413, "BODY_TOO_LARGE", bodyTooLargeMessage(limit))

// ---------------------------------------------------------------------------------------------
// The fast path

const OVERLAP_ROUTE = "/v1/overlap"
const BATCH_ROUTE = "/v1/overlap/batch"

/** The server span's name on either path. */
export const spanName = (method: string, route: string): string => `GlobalHttpServer ${method} ${route}`

interface FastPathOptions {
  readonly view: GlobalViewService
  readonly queries: QueryStats
  readonly maxBodyBytes: number
  readonly auth: TokenFile | undefined
  /** More `POST` routes served alike (the routing routes): path → the reply to a complete body. */
  readonly extraRoutes?: ReadonlyMap<string, (text: string) => Reply> | undefined
}

/** The tracer Effect runs with when none is installed: its spans go nowhere. */
const defaultTracer = Effect.runSync(Effect.tracer)

/**
 * A `request` listener for the overlap routes: returns false, having touched nothing, for a
 * request it leaves to the general path. Built in the server's runtime, whose tracer it uses.
 */
export const makeFastPath = (
  options: FastPathOptions
): Effect.Effect<(request: IncomingMessage, response: ServerResponse) => boolean> =>
  Effect.gen(function* () {
    const runtime = yield* Effect.runtime<never>()
    const tracer = yield* Effect.tracer
    const clock = yield* Effect.clock
    const parent = yield* Effect.currentSpan.pipe(Effect.option)
    const traced = tracer !== defaultTracer && (yield* FiberRef.get(FiberRef.currentTracerEnabled))
    const redactedNames = yield* FiberRef.get(Headers.currentRedactedNames)
    const runSync = Runtime.runSync(runtime)
    const runFork = Runtime.runFork(runtime)
    const { view, queries, maxBodyBytes, auth } = options
    const extraRoutes = options.extraRoutes ?? new Map<string, (text: string) => Reply>()

    const authorized = (request: IncomingMessage): boolean => {
      if (auth === undefined) return true
      const set = runSync(auth.tokens.get)
      return authorizationProblem(set, request.headers.authorization) === undefined
    }

    /** The reply to a complete body, and the span attributes it adds. */
    const answer = (route: string, text: string, span: Tracer.Span | undefined): Reply => {
      const extra = extraRoutes.get(route)
      if (extra !== undefined) return extra(text)
      if (route === OVERLAP_ROUTE) {
        const request = parseOverlapRequest(text)
        if (typeof request === "string") return errorReply(400, "INVALID_REQUEST", request)
        // With a tracer the view's own span is wanted under the server span, as on the general path.
        const result =
          span === undefined
            ? view.overlapNow(request)
            : runSync(Effect.merge(view.overlap(request)).pipe(Effect.withParentSpan(span)))
        return overlapReply(result)
      }
      const requests = parseOverlapBatch(text)
      if (typeof requests === "string") return errorReply(400, "INVALID_REQUEST", requests)
      span?.attribute("overlap.queries", requests.length)
      return batchReply(batchAnswers(view, requests))
    }

    const send = (
      response: ServerResponse,
      route: string,
      reply: Reply,
      started: number,
      spans: { readonly server: Tracer.Span; readonly span: Tracer.Span } | undefined
    ): void => {
      queries.record(route, reply.status, performance.now() - started)
      const length = Buffer.byteLength(reply.body)
      if (spans !== undefined) {
        const now = clock.unsafeCurrentTimeNanos()
        spans.span.attribute("http.response.status_code", reply.status)
        spans.span.end(now, Exit.void)
        spans.server.attribute("http.response.status_code", reply.status)
        spans.server.attribute("http.response.header.content-type", "application/json")
        spans.server.attribute("http.response.header.content-length", String(length))
        spans.server.end(now, Exit.void)
      }
      if (response.writableEnded || response.destroyed) return
      response.writeHead(reply.status, { "content-type": "application/json", "content-length": length })
      response.end(reply.body)
    }

    /**
     * The spans the general path opens: @effect/platform's `http.server POST` (its tracer
     * middleware: the parent from `traceparent`/`b3` headers, URL and redacted headers), and
     * under it the route's own.
     */
    const openSpans = (request: IncomingMessage, route: string) => {
      const headers = Headers.fromInput(request.headers)
      const external = HttpTraceContext.fromHeaders(headers)
      const now = clock.unsafeCurrentTimeNanos()
      const server = tracer.span(
        "http.server POST",
        Option.isSome(external) ? external : parent,
        Context.empty(),
        [],
        now,
        "server",
        { kind: "server", captureStackTrace: false, parent: Option.getOrUndefined(external) }
      )
      server.attribute("http.request.method", "POST")
      const host = headers.host ?? "localhost"
      const protocol = headers["x-forwarded-proto"] === "https" ? "https" : "http"
      try {
        const url = new URL(request.url ?? "/", `${protocol}://${host}`)
        if (url.username !== "" || url.password !== "") {
          url.username = "REDACTED"
          url.password = "REDACTED"
        }
        server.attribute("url.full", url.toString())
        server.attribute("url.path", url.pathname)
        if (url.search.length > 1) server.attribute("url.query", url.search.slice(1))
        server.attribute("url.scheme", url.protocol.slice(0, -1))
      } catch {
        // As the platform: a request whose URL does not parse has no url.* attributes.
      }
      if (headers["user-agent"] !== undefined) server.attribute("user_agent.original", headers["user-agent"])
      const redacted = Headers.redact(headers, redactedNames)
      for (const name in redacted) server.attribute(`http.request.header.${name}`, String(redacted[name]))
      if (request.socket.remoteAddress !== undefined)
        server.attribute("client.address", request.socket.remoteAddress)
      // The router names the matched route on the platform's span.
      server.attribute("http.route", route)
      const span = tracer.span(
        spanName("POST", route),
        Option.some(server),
        Context.empty(),
        [],
        now,
        "server",
        {
          kind: "server",
          attributes: { "http.request.method": "POST", "http.route": route }
        }
      )
      span.attribute("http.request.method", "POST")
      span.attribute("http.route", route)
      return { server, span }
    }

    return (request, response) => {
      const url = request.url ?? ""
      const route = url === OVERLAP_ROUTE || url === BATCH_ROUTE || extraRoutes.has(url) ? url : undefined
      if (route === undefined || request.method !== "POST" || !authorized(request)) return false
      const started = performance.now()
      const spans = traced ? openSpans(request, route) : undefined
      const span = spans?.span
      collectBody(request, maxBodyBytes, (outcome) => {
        if (outcome._tag === "TooLarge") {
          // The rest of the body is not kept (Node discards it): the connection is not reused.
          response.shouldKeepAlive = false
          send(response, route, tooLarge(maxBodyBytes), started, spans)
          return
        }
        if (outcome._tag === "Failed") {
          send(
            response,
            route,
            errorReply(400, "INVALID_REQUEST", readFailureMessage(outcome.cause)),
            started,
            spans
          )
          return
        }
        let reply: Reply
        try {
          reply = answer(route, outcome.bytes.toString("utf8"), span)
        } catch (cause) {
          // A defect must cost this request only, never the process or its listener.
          runFork(Effect.logError("overlap query failed", cause).pipe(Effect.annotateLogs({ route })))
          reply = errorReply(
            500,
            "INTERNAL",
            `the query failed: ${cause instanceof Error ? cause.message : String(cause)}`
          )
        }
        send(response, route, reply, started, spans)
      })
      return true
    }
  })
