/**
 * Routing decisions' documents (PROTOCOL §7.1 ◆3): the `policy` a `POST /v1/route` body may
 * carry, with its defaults, ranges and the `global` flags that set them per process, and the route
 * answer (`decision`, `candidates` with their cost terms, eligibility and reason). The cost model
 * that fills an answer is `routing/RouteCost.ts`; the routes are declared with the consumer's
 * others in `GlobalApi.ts`.
 */

import { Either, ParseResult, Schema } from "effect"
import { PoolIdJson } from "./Identity.js"
import { U32 } from "./Json.js"
import { EndpointIdJson } from "./Model.js"
import { ErrorBodyJson } from "./RelayApi.js"

// --- Policy ------------------------------------------------------------------------------------

/** A routing decision's knobs: per process by flags, per request by `policy` (PROTOCOL §7.1 ◆3). */
export interface RoutePolicy {
  /** Tokens of prefill saved per matched token (finite, ≥ 0). */
  readonly overlapCredit: number
  /** Tokens of work each queued or running request stands for (integer ≥ 0). */
  readonly requestTokens: number
  /** KV usage at or above which a candidate is overloaded, in (0, 1]. */
  readonly maxKvUsage: number
  /** Waiting requests per observed rank at or above which a candidate is overloaded (> 0). */
  readonly maxWaitingPerRank: number
}

/** PROTOCOL §7.1 defaults. */
export const DEFAULT_ROUTE_POLICY: RoutePolicy = {
  overlapCredit: 1.0,
  requestTokens: 1024,
  maxKvUsage: 0.98,
  maxWaitingPerRank: 16
}

/** The `global` flag of each policy value. */
export const ROUTE_POLICY_FLAGS: Readonly<Record<keyof RoutePolicy, string>> = {
  overlapCredit: "--route-overlap-credit",
  requestTokens: "--route-request-tokens",
  maxKvUsage: "--route-max-kv-usage",
  maxWaitingPerRank: "--route-max-waiting-per-rank"
}

interface PolicyRule {
  /** What a value must be, as the contract says it. */
  readonly rule: string
  readonly accepts: (value: number) => boolean
}

/** The range of each policy value (PROTOCOL §7.1). */
export const ROUTE_POLICY_RULES: Readonly<Record<keyof RoutePolicy, PolicyRule>> = {
  overlapCredit: { rule: "a finite number ≥ 0", accepts: (v) => Number.isFinite(v) && v >= 0 },
  requestTokens: { rule: "an integer ≥ 0", accepts: (v) => Number.isSafeInteger(v) && v >= 0 },
  maxKvUsage: { rule: "in (0, 1]", accepts: (v) => v > 0 && v <= 1 },
  maxWaitingPerRank: { rule: "a finite number > 0", accepts: (v) => Number.isFinite(v) && v > 0 }
}

const POLICY_FIELDS = Object.keys(ROUTE_POLICY_RULES) as ReadonlyArray<keyof RoutePolicy>

/** A value of a request or an argument in a message: short, and never the whole input. */
export const shownValue = (value: unknown): string => {
  if (typeof value === "number") return String(value)
  if (typeof value === "string") return value.length <= 40 ? JSON.stringify(value) : "a long string"
  if (value === null) return "null"
  if (Array.isArray(value)) return "an array"
  if (typeof value === "object") return "an object"
  return typeof value === "boolean" ? String(value) : "a value that is not JSON"
}

const policyField = (field: keyof RoutePolicy) => {
  const { rule, accepts } = ROUTE_POLICY_RULES[field]
  return Schema.Number.annotations({
    message: (issue) => `must be ${rule}, got ${shownValue("actual" in issue ? issue.actual : undefined)}`
  }).pipe(Schema.filter((value) => accepts(value) || `must be ${rule}, got ${shownValue(value)}`))
}

/** The per-request `policy` of `/v1/route`: any of the four values; other fields are refused. */
export const RoutePolicyOverrides = Schema.Struct({
  overlapCredit: Schema.optionalWith(policyField("overlapCredit"), { exact: true }),
  requestTokens: Schema.optionalWith(policyField("requestTokens"), { exact: true }),
  maxKvUsage: Schema.optionalWith(policyField("maxKvUsage"), { exact: true }),
  maxWaitingPerRank: Schema.optionalWith(policyField("maxWaitingPerRank"), { exact: true })
}).annotations({
  message: (issue) =>
    `must be an object with any of ${POLICY_FIELDS.join(", ")}, got ${shownValue("actual" in issue ? issue.actual : undefined)}`
})
export type RoutePolicyOverrides = typeof RoutePolicyOverrides.Type

const decodeOverrides = Schema.decodeUnknownEither(RoutePolicyOverrides, {
  onExcessProperty: "error",
  errors: "all"
})

const pathText = (path: ReadonlyArray<PropertyKey>): string =>
  ["policy", ...path.map((key) => (typeof key === "symbol" ? key.toString() : String(key)))].join(".")

/**
 * The request's `policy` over `defaults` (the process's flags). The error names every field at
 * fault in the contract's words: `policy.maxKvUsage: must be in (0, 1], got 1.5`,
 * `unknown field "policy.foo"`.
 */
export const decodeRoutePolicy = (
  input: unknown,
  defaults: RoutePolicy = DEFAULT_ROUTE_POLICY
): Either.Either<RoutePolicy, string> => {
  if (input === undefined) return Either.right(defaults)
  const decoded = decodeOverrides(input)
  if (Either.isRight(decoded)) {
    const overrides = decoded.right
    return Either.right({
      overlapCredit: overrides.overlapCredit ?? defaults.overlapCredit,
      requestTokens: overrides.requestTokens ?? defaults.requestTokens,
      maxKvUsage: overrides.maxKvUsage ?? defaults.maxKvUsage,
      maxWaitingPerRank: overrides.maxWaitingPerRank ?? defaults.maxWaitingPerRank
    })
  }
  let issues: ReadonlyArray<ParseResult.ArrayFormatterIssue>
  try {
    issues = ParseResult.ArrayFormatter.formatErrorSync(decoded.left)
  } catch {
    // The formatter renders the offending value; one it cannot render still gets an answer.
    return Either.left("policy: invalid value")
  }
  const lines = issues.map((issue) => {
    const at = pathText(issue.path)
    if (issue._tag === "Unexpected") {
      const key = String(issue.path[issue.path.length - 1] ?? "")
      return `unknown field ${JSON.stringify(key.length <= 40 ? at : `policy.${key.slice(0, 39)}…`)}; policy takes ${POLICY_FIELDS.join(", ")}`
    }
    return `${at}: ${issue.message}`
  })
  return Either.left(lines.join("; "))
}

// --- Answers -------------------------------------------------------------------------------

/** Why a candidate is not plainly eligible (PROTOCOL §7.1). */
export const RouteReasonJson = Schema.Literal("NOT_READY", "OVERLOADED", "LOAD_UNKNOWN")
/** Why a candidate is not plainly eligible, as a value. */
export type RouteReason = typeof RouteReasonJson.Type

/** A candidate's cost terms, in tokens; `queueTokens` only with known load. */
export const RouteTermsJson = Schema.Struct({
  uncachedTokens: Schema.Number,
  queueTokens: Schema.optionalWith(Schema.Number, { exact: true }),
  penaltyTokens: Schema.Number
})

/** The load a candidate was priced with: the relay's latest window for its pool. */
export const RouteLoadJson = Schema.Struct({
  runningRequests: Schema.optionalWith(Schema.Number, { exact: true }),
  waitingRequests: Schema.optionalWith(Schema.Number, { exact: true }),
  kvUsage: Schema.optionalWith(Schema.Number, { exact: true }),
  observedRanks: Schema.Number,
  expectedRanks: Schema.Number,
  /** Time since the consumer received the window; absent when none was received. */
  ageMs: Schema.optionalWith(Schema.Number, { exact: true })
})

/** One candidate of a route answer: its eligibility, overlap, cost terms and load (PROTOCOL §7.1 ◆3). */
export const RouteCandidateJson = Schema.Struct({
  relay: Schema.String,
  lane: U32,
  poolId: PoolIdJson,
  servingEndpoint: EndpointIdJson,
  eligible: Schema.Boolean,
  reason: Schema.optionalWith(RouteReasonJson, { exact: true }),
  prefixDepth: U32,
  matchedTokens: Schema.Number,
  promptTokens: Schema.Number,
  cost: Schema.optionalWith(Schema.Number, { exact: true }),
  terms: Schema.optionalWith(RouteTermsJson, { exact: true }),
  load: RouteLoadJson
})

/** The lane a route answer picks (PROTOCOL §7.1 ◆3). */
export const RouteDecisionJson = Schema.Struct({
  relay: Schema.String,
  lane: U32,
  poolId: PoolIdJson,
  servingEndpoint: EndpointIdJson
})

/** `POST /v1/route`'s answer: 200 with a decision; 503 adds `reason: "NO_READY_LANE"` and `message`. */
export const RouteAnswerJson = Schema.Struct({
  decision: Schema.NullOr(RouteDecisionJson),
  candidates: Schema.Array(RouteCandidateJson)
})
/** `POST /v1/route`'s answer as a value. */
export type RouteAnswerDocument = typeof RouteAnswerJson.Type

/** The 503 of `POST /v1/route` when no candidate is eligible. */
export const RouteUnavailableJson = Schema.Struct({
  ...RouteAnswerJson.fields,
  reason: Schema.Literal("NO_READY_LANE"),
  message: Schema.String
})

/** The optional `policy` field of a route body (PROTOCOL §7.1). */
export const RoutePolicyFieldJson = Schema.Struct({
  policy: Schema.optionalWith(RoutePolicyOverrides, { exact: true })
})

/** `POST /v1/route/batch`: 1 to 256 route bodies, each decoded on its own. */
export const MAX_ROUTE_BATCH = 256
/** `POST /v1/route/batch`'s body as the API declares it: `{queries}`, 1 to `MAX_ROUTE_BATCH` route bodies. */
export const RouteBatchJson = Schema.Struct({
  queries: Schema.Array(
    Schema.Unknown.annotations({ description: "a route body, as POST /v1/route takes it" })
  ).pipe(
    Schema.filter(
      (queries) =>
        (queries.length >= 1 && queries.length <= MAX_ROUTE_BATCH) ||
        `queries must hold 1 to ${MAX_ROUTE_BATCH} route bodies, got ${queries.length}`
    )
  )
})

/** `POST /v1/route/batch`'s answer: per query a route answer (empty candidates on error) and its error. */
export const RouteBatchAnswerJson = Schema.Struct({
  results: Schema.Array(RouteAnswerJson),
  errors: Schema.Array(Schema.NullOr(ErrorBodyJson))
})
