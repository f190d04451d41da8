/**
 * The routing routes of the global consumer (`POST /v1/route`, `POST /v1/route/batch`, PROTOCOL
 * §7.1 ◆3): their bodies (an overlap body plus an optional `policy`) decoded, their answers and
 * errors rendered. Both the router and the overlap fast path serve them with these functions.
 *
 * Answers are written as JSON text by hand, with each pool's `poolId` and `servingEndpoint`
 * encoded by the schema once per pool: a route answer carries every candidate, and encoding the
 * pools' digests through the schema per query would cost more than the decision.
 */

import { Either } from "effect"
import type { PoolId } from "../../ckf/identity.js"
import { boundedMessage } from "../../http/ErrorText.js"
import { PoolIdJson } from "../../protocol/Identity.js"
import { encodeJson, MAX_JSON_DEPTH, nestedDeeperThan } from "../../protocol/Json.js"
import { type EndpointId, EndpointIdJson } from "../../protocol/Model.js"
import { decodeRoutePolicy, MAX_ROUTE_BATCH, type RoutePolicy } from "../../protocol/RouteApi.js"
import type { RouteCandidate } from "../../routing/RouteCost.js"
import type { OverlapError } from "../ConsumerErrors.js"
import type { GlobalRouteAnswer, GlobalRoutingService } from "../GlobalRoute.js"
import type { OverlapRequest } from "../GlobalView.js"
import {
  decodeOverlapRequest,
  errorReply,
  isPlainObject,
  overlapErrorBody,
  parseJson,
  parseQueryBatch,
  type Reply
} from "./OverlapQuery.js"

/** The route of one routing decision (PROTOCOL §7.1 ◆3). */
export const ROUTE_ROUTE = "/v1/route"
/** The route of a batch of routing decisions (PROTOCOL §7.1 ◆3). */
export const ROUTE_BATCH_ROUTE = "/v1/route/batch"

/** A decoded route body: the overlap request and the policy it is decided under. */
export interface RouteRequest {
  readonly request: OverlapRequest
  readonly policy: RoutePolicy
}

/** One route body, parsed from JSON: an overlap body, and a `policy` over the process's `defaults`. */
export const decodeRouteRequest = (parsed: unknown, defaults: RoutePolicy): RouteRequest | string => {
  if (!isPlainObject(parsed) || !("policy" in parsed)) {
    const request = decodeOverlapRequest(parsed)
    return typeof request === "string" ? request : { request, policy: defaults }
  }
  const { policy: policyInput, ...overlapBody } = parsed
  const request = decodeOverlapRequest(overlapBody)
  if (typeof request === "string") return request
  const policy = decodeRoutePolicy(policyInput, defaults)
  return Either.isLeft(policy) ? policy.left : { request, policy: policy.right }
}

/** A `POST /v1/route` body from its JSON text: the request, or a message naming what is wrong. */
export const parseRouteRequest = (text: string, defaults: RoutePolicy): RouteRequest | string => {
  const parsed = parseJson(text)
  if (typeof parsed === "string") return parsed
  // Only a policy goes through Effect's recursive decoder here; tokens are checked in one pass.
  const value = parsed.value
  if (isPlainObject(value) && isPlainObject(value.policy) && nestedDeeperThan(value.policy, MAX_JSON_DEPTH))
    return `the value is nested deeper than ${MAX_JSON_DEPTH} levels`
  return decodeRouteRequest(value, defaults)
}

/** `{queries: [route body…]}`: every body decoded, or the first bad one named by its index. */
export const parseRouteBatch = (text: string, defaults: RoutePolicy): ReadonlyArray<RouteRequest> | string =>
  parseQueryBatch(text, "route", MAX_ROUTE_BATCH, (body) => decodeRouteRequest(body, defaults))

// ---------------------------------------------------------------------------------------------
// Answers as JSON text

const encodePoolId = encodeJson(PoolIdJson)
const encodeEndpoint = encodeJson(EndpointIdJson)

/**
 * `{"relay":…,"lane":…,"poolId":{…},"servingEndpoint":{…}` of a lane's pool, without the closing
 * brace: encoded once per pool, relay, lane and endpoint (they change only when a lane is replaced).
 */
interface LanePrefix {
  readonly relay: string
  readonly lane: number
  readonly endpoint: EndpointId
  readonly text: string
}

const lanePrefixes = new WeakMap<PoolId, LanePrefix>()

const lanePrefix = (relay: string, lane: number, poolId: PoolId, endpoint: EndpointId): string => {
  const cached = lanePrefixes.get(poolId)
  if (cached !== undefined && cached.relay === relay && cached.lane === lane && cached.endpoint === endpoint)
    return cached.text
  const pool = encodePoolId(poolId)
  const serving = encodeEndpoint(endpoint)
  if (Either.isLeft(pool) || Either.isLeft(serving)) {
    throw new Error(`pool ${poolId.toString()} could not be encoded`)
  }
  const text = `{"relay":${JSON.stringify(relay)},"lane":${lane},"poolId":${JSON.stringify(pool.right)},"servingEndpoint":${JSON.stringify(serving.right)}`
  lanePrefixes.set(poolId, { relay, lane, endpoint, text })
  return text
}

/** A number as JSON; the cost model gives finite numbers, anything else would be a defect shown as null. */
const num = (value: number): string | number => (Number.isFinite(value) ? value : "null")

const candidateText = (c: RouteCandidate<PoolId, EndpointId>): string => {
  let text = `${lanePrefix(c.relay, c.lane, c.poolId, c.servingEndpoint)},"eligible":${c.eligible}`
  if (c.reason !== undefined) text += `,"reason":"${c.reason}"`
  text += `,"prefixDepth":${c.prefixDepth},"matchedTokens":${num(c.matchedTokens)},"promptTokens":${num(c.promptTokens)}`
  if (c.cost !== undefined) text += `,"cost":${num(c.cost)}`
  const terms = c.terms
  if (terms !== undefined) {
    text += `,"terms":{"uncachedTokens":${num(terms.uncachedTokens)}`
    if (terms.queueTokens !== undefined) text += `,"queueTokens":${num(terms.queueTokens)}`
    text += `,"penaltyTokens":${num(terms.penaltyTokens)}}`
  }
  // Each present value is followed by a comma; the two counts, always there, close the object.
  const load = c.load
  text += `,"load":{`
  if (load.runningRequests !== undefined) text += `"runningRequests":${num(load.runningRequests)},`
  if (load.waitingRequests !== undefined) text += `"waitingRequests":${num(load.waitingRequests)},`
  if (load.kvUsage !== undefined) text += `"kvUsage":${num(load.kvUsage)},`
  text += `"observedRanks":${num(load.observedRanks)},"expectedRanks":${num(load.expectedRanks)}`
  if (load.ageMs !== undefined) text += `,"ageMs":${num(load.ageMs)}`
  return `${text}}}`
}

/** `{decision, candidates}` as JSON text, without the closing brace (the 503 adds fields). */
const answerBody = (answer: GlobalRouteAnswer): string => {
  const d = answer.decision
  let text = `{"decision":${d === null ? "null" : `${lanePrefix(d.relay, d.lane, d.poolId, d.servingEndpoint)}}`},"candidates":[`
  for (let i = 0; i < answer.candidates.length; i++)
    text += (i === 0 ? "" : ",") + candidateText(answer.candidates[i]!)
  return `${text}]`
}

const NO_ELIGIBLE =
  "no candidate is eligible: every lane of the pools serving the query is not ready (its relay is down, its lanes are resubscribing or its pool is not READY)"

const isError = (answer: GlobalRouteAnswer | OverlapError): answer is OverlapError => "_tag" in answer

/** The `/v1/route` reply (PROTOCOL §7.1): 200 with a decision, 503 `NO_READY_LANE` with the answer when none. */
export const routeReply = (answer: GlobalRouteAnswer | OverlapError): Reply => {
  if (isError(answer)) {
    const { status, reason } = overlapErrorBody(answer)
    return errorReply(status, reason, answer.message)
  }
  const body = answerBody(answer)
  return answer.decision === null
    ? {
        status: 503,
        body: `${body},"reason":"NO_READY_LANE","message":${JSON.stringify(NO_ELIGIBLE)}}`
      }
    : { status: 200, body: `${body}}` }
}

/**
 * The `/v1/route/batch` reply: per query its route answer in `results` (no decision and no
 * candidates for a query that named nothing known), and in `errors` null or the error
 * `/v1/route` would have answered (`NO_READY_LANE` included).
 */
export const routeBatchReply = (answers: ReadonlyArray<GlobalRouteAnswer | OverlapError>): Reply => {
  let results = `{"results":[`
  let errors = `],"errors":[`
  for (let i = 0; i < answers.length; i++) {
    const answer = answers[i]!
    const sep = i === 0 ? "" : ","
    if (isError(answer)) {
      results += `${sep}{"decision":null,"candidates":[]}`
      const { reason } = overlapErrorBody(answer)
      errors += `${sep}${JSON.stringify({ reason, message: boundedMessage(answer.message) })}`
    } else {
      results += `${sep}${answerBody(answer)}}`
      errors +=
        answer.decision === null
          ? `${sep}${JSON.stringify({ reason: "NO_READY_LANE", message: NO_ELIGIBLE })}`
          : `${sep}null`
    }
  }
  return { status: 200, body: `${results}${errors}]}` }
}

/** The reply to a complete body of either route. */
export const answerRoute = (routing: GlobalRoutingService, route: string, text: string): Reply => {
  if (route === ROUTE_ROUTE) {
    const parsed = parseRouteRequest(text, routing.settings.policy)
    if (typeof parsed === "string") return errorReply(400, "INVALID_REQUEST", parsed)
    return routeReply(routing.routeNow(parsed.request, parsed.policy))
  }
  const parsed = parseRouteBatch(text, routing.settings.policy)
  if (typeof parsed === "string") return errorReply(400, "INVALID_REQUEST", parsed)
  return routeBatchReply(parsed.map((query) => routing.routeNow(query.request, query.policy)))
}
