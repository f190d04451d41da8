/**
 * Routing decisions (PROTOCOL §7.1 ◆3): every candidate lane of a model's pools priced as the
 * prefill work its cache does not cover, the queue it would wait in and the relay's penalty, with
 * the readiness, overload and unknown-load rules; and the `policy` that sets the model's knobs.
 * Pure: the caller gives the overlaps, the readiness and the latest load windows.
 *
 * For an eligible candidate with known load (a window newer than 3 s with at least one observed
 * rank):
 *
 *     uncachedTokens = promptTokens − overlapCredit × matchedTokens
 *     queueTokens    = requestTokens × (runningRequests + waitingRequests) / observedRanks
 *     penaltyTokens  = the relay's --relay-penalty (0 by default)
 *     cost           = uncachedTokens + queueTokens + penaltyTokens
 *
 * A candidate whose lane is not ready or whose pool is not READY is ineligible (`NOT_READY`); one
 * whose `kvUsage ≥ maxKvUsage` or whose waiting requests per observed rank reach
 * `maxWaitingPerRank` is ineligible (`OVERLOADED`) unless every ready candidate with known load is
 * overloaded, in which case those stay eligible and keep the reason. A candidate with unknown
 * load is eligible (`LOAD_UNKNOWN`) without a queue term and ranks after every candidate with
 * known load. Least cost wins; ties go to the larger `matchedTokens`, then the lower lane.
 */

import { Either, ParseResult, Schema } from "effect"
import {
  DEFAULT_ROUTE_POLICY,
  ROUTE_POLICY_FLAGS,
  ROUTE_POLICY_RULES,
  type RoutePolicy,
  type RouteReason,
  shownValue as shown
} from "../protocol/RouteApi.js"

// --- Flags ---------------------------------------------------------------------------------

/** One policy flag's value (`--route-max-kv-usage 0.9`): the number, or why not. */
export const parseRoutePolicyFlag = (
  field: keyof RoutePolicy,
  text: string
): Either.Either<number, string> => {
  const { rule, accepts } = ROUTE_POLICY_RULES[field]
  const trimmed = text.trim()
  const value = /^[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?$/.test(trimmed) ? Number(trimmed) : Number.NaN
  return accepts(value) && trimmed.length > 0
    ? Either.right(value)
    : Either.left(`${ROUTE_POLICY_FLAGS[field]}: must be ${rule}, got ${shown(text)}`)
}

// --- Relay penalties --------------------------------------------------------------------------

/** One `--relay-penalty NAME=TOKENS` value: a relay's distance or egress, in tokens. */
export interface RelayPenalty {
  readonly relay: string
  readonly tokens: number
}

const TOKENS_TEXT = /^(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?$/

/** One `--relay-penalty NAME=TOKENS` value (TOKENS a finite number ≥ 0). */
export const parseRelayPenalty = (text: string): Either.Either<RelayPenalty, string> => {
  const at = text.lastIndexOf("=")
  if (at <= 0) return Either.left(`--relay-penalty ${shown(text)}: expected NAME=TOKENS`)
  const relay = text.slice(0, at)
  const tokensText = text.slice(at + 1)
  if (relay.trim() !== relay || /\p{Cc}/u.test(relay)) {
    return Either.left(
      `--relay-penalty ${shown(text)}: the relay name must be text without surrounding blanks`
    )
  }
  const tokens = TOKENS_TEXT.test(tokensText) ? Number(tokensText) : Number.NaN
  if (!Number.isFinite(tokens)) {
    return Either.left(
      `--relay-penalty ${shown(text)}: TOKENS must be a finite number ≥ 0, got ${shown(tokensText)}`
    )
  }
  return Either.right({ relay, tokens })
}

/** The `--relay-penalty NAME=TOKENS` flag value as a schema (for the settings' decoding). */
export const RelayPenaltyFlag = Schema.transformOrFail(
  Schema.String,
  Schema.Struct({ relay: Schema.String, tokens: Schema.Number }),
  {
    strict: true,
    decode: (text, _, ast) =>
      Either.match(parseRelayPenalty(text), {
        onLeft: (message) => ParseResult.fail(new ParseResult.Type(ast, text, message)),
        onRight: (penalty) => ParseResult.succeed(penalty)
      }),
    encode: (penalty) => ParseResult.succeed(`${penalty.relay}=${penalty.tokens}`)
  }
)

/**
 * Every `--relay-penalty` value as a map by relay, or every problem (one line each): a value not
 * of the form, a relay no `--relay` names, a relay given twice.
 */
export const relayPenalties = (
  texts: ReadonlyArray<string>,
  relayNames: ReadonlyArray<string>
): Either.Either<ReadonlyMap<string, number>, ReadonlyArray<string>> => {
  const problems: Array<string> = []
  const penalties = new Map<string, number>()
  const known = new Set(relayNames)
  for (const text of texts) {
    const parsed = parseRelayPenalty(text)
    if (Either.isLeft(parsed)) {
      problems.push(parsed.left)
      continue
    }
    const { relay, tokens } = parsed.right
    if (!known.has(relay)) {
      problems.push(`--relay-penalty ${shown(text)}: no --relay is named ${JSON.stringify(relay)}`)
    } else if (penalties.has(relay)) {
      problems.push(`--relay-penalty: relay ${JSON.stringify(relay)} is given more than once`)
    } else {
      penalties.set(relay, tokens)
    }
  }
  return problems.length === 0 ? Either.right(penalties) : Either.left(problems)
}

// --- The cost model ---------------------------------------------------------------------------

/** Why a candidate is not plainly eligible (PROTOCOL §7.1 ◆3). */
export type { RouteReason }
/** A pool's serving-topology state in a relay's readiness (PROTOCOL §5). */
export type PoolReadinessState = "READY" | "UNAVAILABLE" | "UNKNOWN"

/** A window is current while younger than this (PROTOCOL §7.1). */
export const LOAD_FRESH_MS = 3000

/** The relay's latest load-window entry for the candidate's pool, as the consumer received it. */
export interface CandidateLoad {
  readonly runningRequests?: number | undefined
  readonly waitingRequests?: number | undefined
  readonly kvUsage?: number | undefined
  /** The window's `loadObservedRanks`. */
  readonly observedRanks: number
  /** The window's `kvExpectedRanks`. */
  readonly expectedRanks: number
  /** Time since the consumer received the window. */
  readonly ageMs: number
}

/** What the caller knows of one candidate lane: its readiness, overlap and load. */
export interface RouteCandidateInput<P = unknown, E = string> {
  readonly relay: string
  readonly lane: number
  readonly poolId: P
  readonly servingEndpoint: E
  /** The lane is installed and current. */
  readonly ready: boolean
  /** The pool's serving-topology state from the relay's readiness stream; undefined = none seen. */
  readonly readiness: PoolReadinessState | undefined
  readonly prefixDepth: number
  readonly matchedTokens: number
  /** Full blocks of the prompt, in tokens. */
  readonly promptTokens: number
  /** False when the lane could not be probed: the candidate then has no cost nor terms. */
  readonly overlapKnown?: boolean | undefined
  /** Undefined when no window with the pool was received. */
  readonly load?: CandidateLoad | undefined
}

/** A candidate's cost terms, in tokens; `queueTokens` only with known load. */
export interface RouteTerms {
  readonly uncachedTokens: number
  readonly queueTokens?: number
  readonly penaltyTokens: number
}

/** The load a candidate was priced with, as the answer shows it. */
export interface RouteLoad {
  readonly runningRequests?: number
  readonly waitingRequests?: number
  readonly kvUsage?: number
  readonly observedRanks: number
  readonly expectedRanks: number
  readonly ageMs?: number
}

/** One priced candidate of a route answer (PROTOCOL §7.1 ◆3). */
export interface RouteCandidate<P = unknown, E = string> {
  readonly relay: string
  readonly lane: number
  readonly poolId: P
  readonly servingEndpoint: E
  readonly eligible: boolean
  readonly reason?: RouteReason
  readonly prefixDepth: number
  readonly matchedTokens: number
  readonly promptTokens: number
  readonly cost?: number
  readonly terms?: RouteTerms
  readonly load: RouteLoad
}

/** The lane a route answer picks. */
export interface RouteDecision<P = unknown, E = string> {
  readonly relay: string
  readonly lane: number
  readonly poolId: P
  readonly servingEndpoint: E
}

/** A routing decision and every candidate (PROTOCOL §7.1 ◆3). */
export interface RouteAnswer<P = unknown, E = string> {
  /** Null when no candidate is eligible (the route answers 503 `NO_READY_LANE`). */
  readonly decision: RouteDecision<P, E> | null
  /** In decision order, ineligible ones last. */
  readonly candidates: ReadonlyArray<RouteCandidate<P, E>>
}

/** Penalties by relay name; a relay not listed has none. */
export type RelayPenalties = ReadonlyMap<string, number> | Readonly<Record<string, number>>

const penaltyOf = (penalties: RelayPenalties, relay: string): number => {
  const value =
    penalties instanceof Map
      ? penalties.get(relay)
      : Object.hasOwn(penalties, relay)
        ? (penalties as Readonly<Record<string, number>>)[relay]
        : undefined
  return value ?? 0
}

/** Running and waiting of a current window with an observed rank; undefined when load is unknown. */
const knownLoad = (load: CandidateLoad | undefined): { running: number; waiting: number } | undefined => {
  if (load === undefined || !(load.ageMs < LOAD_FRESH_MS) || !(load.observedRanks >= 1)) return undefined
  if (load.runningRequests === undefined || load.waitingRequests === undefined) return undefined
  return { running: load.runningRequests, waiting: load.waitingRequests }
}

interface Scored<P, E> {
  readonly candidate: RouteCandidate<P, E>
  readonly known: boolean
}

type Mutable<T> = { -readonly [K in keyof T]: T[K] }

// Built by assignment in key order: conditional spreads cost V8 a slow path on every call.
const loadView = (load: CandidateLoad | undefined): RouteLoad => {
  if (load === undefined) return { observedRanks: 0, expectedRanks: 0 }
  const view = {} as Mutable<RouteLoad>
  if (load.runningRequests !== undefined) view.runningRequests = load.runningRequests
  if (load.waitingRequests !== undefined) view.waitingRequests = load.waitingRequests
  if (load.kvUsage !== undefined) view.kvUsage = load.kvUsage
  view.observedRanks = load.observedRanks
  view.expectedRanks = load.expectedRanks
  view.ageMs = load.ageMs
  return view
}

const textOrder = (a: string, b: string): number => (a < b ? -1 : a > b ? 1 : 0)

const REASON_ORDER: Readonly<Record<RouteReason, number>> = { LOAD_UNKNOWN: 0, OVERLOADED: 0, NOT_READY: 1 }

/** Decision order (see the module comment); ineligible: overloaded before not ready, then by the same keys. */
const compare = <P, E>(a: Scored<P, E>, b: Scored<P, E>): number => {
  const ca = a.candidate
  const cb = b.candidate
  const group = (s: Scored<P, E>) => (s.candidate.eligible ? (s.known ? 0 : 1) : 2)
  return (
    group(a) - group(b) ||
    (ca.eligible ? 0 : REASON_ORDER[ca.reason ?? "NOT_READY"] - REASON_ORDER[cb.reason ?? "NOT_READY"]) ||
    (ca.cost ?? Number.POSITIVE_INFINITY) - (cb.cost ?? Number.POSITIVE_INFINITY) ||
    cb.matchedTokens - ca.matchedTokens ||
    ca.lane - cb.lane ||
    (ca.relay < cb.relay ? -1 : ca.relay > cb.relay ? 1 : 0) ||
    textOrder(String(ca.servingEndpoint), String(cb.servingEndpoint))
  )
}

/**
 * The route answer for `candidates` under `policy` and the relays' `penalties` (PROTOCOL §7.1).
 * Every candidate is answered, ready or not; `decision` is the first of `candidates` when it is
 * eligible, else null.
 */
export const routeDecision = <P, E = string>(
  candidates: ReadonlyArray<RouteCandidateInput<P, E>>,
  policy: RoutePolicy = DEFAULT_ROUTE_POLICY,
  penalties: RelayPenalties = new Map()
): RouteAnswer<P, E> => {
  const facts = candidates.map((input) => {
    const notReady = !input.ready || input.readiness !== "READY"
    const known = knownLoad(input.load)
    const overloaded =
      known !== undefined &&
      ((input.load!.kvUsage !== undefined && input.load!.kvUsage >= policy.maxKvUsage) ||
        known.waiting / input.load!.observedRanks >= policy.maxWaitingPerRank)
    return { input, notReady, known, overloaded }
  })
  const readyKnown = facts.filter((f) => !f.notReady && f.known !== undefined)
  const everyKnownOverloaded = readyKnown.length > 0 && readyKnown.every((f) => f.overloaded)

  const scored = facts.map(({ input, notReady, known, overloaded }): Scored<P, E> => {
    const reason: RouteReason | undefined = notReady
      ? "NOT_READY"
      : overloaded
        ? "OVERLOADED"
        : known === undefined
          ? "LOAD_UNKNOWN"
          : undefined
    const eligible = !notReady && (!overloaded || everyKnownOverloaded)
    let cost: number | undefined
    let terms: RouteTerms | undefined
    if (input.overlapKnown !== false) {
      const uncachedTokens = input.promptTokens - policy.overlapCredit * input.matchedTokens
      const penaltyTokens = penaltyOf(penalties, input.relay)
      const queueTokens =
        known === undefined
          ? undefined
          : (policy.requestTokens * (known.running + known.waiting)) / input.load!.observedRanks
      cost = uncachedTokens + (queueTokens ?? 0) + penaltyTokens
      terms =
        queueTokens === undefined
          ? { uncachedTokens, penaltyTokens }
          : { uncachedTokens, queueTokens, penaltyTokens }
    }
    const candidate = {
      relay: input.relay,
      lane: input.lane,
      poolId: input.poolId,
      servingEndpoint: input.servingEndpoint,
      eligible
    } as Mutable<RouteCandidate<P, E>>
    if (reason !== undefined) candidate.reason = reason
    candidate.prefixDepth = input.prefixDepth
    candidate.matchedTokens = input.matchedTokens
    candidate.promptTokens = input.promptTokens
    if (cost !== undefined) {
      candidate.cost = cost
      candidate.terms = terms!
    }
    candidate.load = loadView(input.load)
    return { candidate, known: known !== undefined }
  })
  scored.sort(compare)
  const ordered = scored.map((s) => s.candidate)
  const first = ordered[0]
  return {
    decision: first?.eligible
      ? {
          relay: first.relay,
          lane: first.lane,
          poolId: first.poolId,
          servingEndpoint: first.servingEndpoint
        }
      : null,
    candidates: ordered
  }
}
