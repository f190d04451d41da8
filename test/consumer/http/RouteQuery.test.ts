/**
 * The routing routes' bodies and answers (PROTOCOL §7.1 ◆3) without a server: a route body is an
 * overlap body plus `policy`, decoded over the process's defaults with errors naming the field;
 * the hand-written answer text decodes with the schema the OpenAPI document declares (so the two
 * cannot drift); the 503 and batch shapes are those of the contract; and a relay's readiness
 * entry is matched to a lane by pool and model.
 */

import { Either, Schema } from "effect"
import { describe, expect, it } from "vitest"
import { CacheSemanticsId, DcId, IndexerDomainId, PoolId, RoutingScopeId } from "../../../src/ckf/identity.js"
import { ModelNotFound } from "../../../src/consumer/ConsumerErrors.js"
import type { LaneStatus } from "../../../src/consumer/GlobalConsumer.js"
import { type GlobalRouteAnswer, readinessOfLane } from "../../../src/consumer/GlobalRoute.js"
import {
  decodeRouteRequest,
  parseRouteBatch,
  routeBatchReply,
  routeReply
} from "../../../src/consumer/http/RouteQuery.js"
import { receivedReadiness } from "../../../src/consumer/RelaySignals.js"
import { EndpointId } from "../../../src/protocol/Model.js"
import type { ReadinessDocument } from "../../../src/protocol/RelayApi.js"
import {
  DEFAULT_ROUTE_POLICY,
  RouteAnswerJson,
  RouteBatchAnswerJson,
  RouteUnavailableJson
} from "../../../src/protocol/RouteApi.js"
import { type RouteCandidateInput, routeDecision } from "../../../src/routing/RouteCost.js"

const domain = new IndexerDomainId(
  new CacheSemanticsId(new Uint8Array(16).fill(1), "explicit"),
  new RoutingScopeId(new Uint8Array(16).fill(2), "explicit")
)
const SERVING = new EndpointId({ namespace: "prod", component: "backend", endpoint: "generate" })
const pool = (dc: number) => new PoolId(domain, new DcId(BigInt(dc)))

const candidate = (
  lane: number,
  depth: number,
  extra: Partial<RouteCandidateInput<PoolId, EndpointId>> = {}
): RouteCandidateInput<PoolId, EndpointId> => ({
  relay: `dc-${lane}`,
  lane,
  poolId: pool(lane + 1),
  servingEndpoint: SERVING,
  ready: true,
  readiness: "READY",
  prefixDepth: depth,
  matchedTokens: depth * 16,
  promptTokens: 8 * 16,
  load: {
    runningRequests: 1,
    waitingRequests: 2,
    kvUsage: 0.25,
    observedRanks: 2,
    expectedRanks: 2,
    ageMs: 40
  },
  ...extra
})

const decodeAnswer = Schema.decodeUnknownEither(RouteAnswerJson, { onExcessProperty: "error" })

const body = { namespace: "prod", model: "llama", tokens: [1, 2, 3] }

describe("route bodies", () => {
  it("an overlap body without policy takes the process's policy; with one, its fields over it", () => {
    const defaults = { ...DEFAULT_ROUTE_POLICY, requestTokens: 500 }
    const plain = decodeRouteRequest(body, defaults)
    expect(typeof plain === "string" ? plain : plain.policy).toEqual(defaults)
    const withPolicy = decodeRouteRequest({ ...body, policy: { maxKvUsage: 0.5 } }, defaults)
    expect(typeof withPolicy === "string" ? withPolicy : withPolicy.policy).toEqual({
      ...defaults,
      maxKvUsage: 0.5
    })
  })

  it("a bad policy or a bad overlap body is a message naming the field", () => {
    expect(decodeRouteRequest({ ...body, policy: { maxKvUsage: 1.5 } }, DEFAULT_ROUTE_POLICY)).toBe(
      "policy.maxKvUsage: must be in (0, 1], got 1.5"
    )
    expect(decodeRouteRequest({ ...body, policy: { foo: 1 } }, DEFAULT_ROUTE_POLICY)).toMatch(
      /^unknown field "policy\.foo"/
    )
    expect(decodeRouteRequest({ ...body, policy: null }, DEFAULT_ROUTE_POLICY)).toMatch(/^policy/)
    expect(decodeRouteRequest({ ...body, tokens: [1, -1] }, DEFAULT_ROUTE_POLICY)).toMatch(
      /tokens\[1\] is not a u32 token id: -1$/
    )
    expect(
      parseRouteBatch(JSON.stringify({ queries: [body, { ...body, policy: 3 }] }), DEFAULT_ROUTE_POLICY)
    ).toMatch(/^queries\[1\]: /)
    expect(parseRouteBatch(JSON.stringify({ queries: [] }), DEFAULT_ROUTE_POLICY)).toBe(
      "queries must hold 1 to 256 route bodies, got 0"
    )
  })
})

describe("route answers", () => {
  it("the answer text decodes with the declared schema, terms and load as computed", () => {
    const answer: GlobalRouteAnswer = routeDecision(
      [
        candidate(0, 8),
        candidate(1, 0, { load: undefined }),
        candidate(2, 0, { ready: false, overlapKnown: false, load: undefined })
      ],
      DEFAULT_ROUTE_POLICY,
      new Map([["dc-0", 10]])
    )
    const reply = routeReply(answer)
    expect(reply.status).toBe(200)
    const parsed = JSON.parse(reply.body)
    expect(Either.isRight(decodeAnswer(parsed))).toBe(true)
    expect(parsed.decision.relay).toBe("dc-0")
    expect(parsed.candidates.map((c: { relay: string }) => c.relay)).toEqual(["dc-0", "dc-1", "dc-2"])
    // dc-0 with known load: 0 uncached + 1024 × 3 / 2 queued + 10 penalty; and it ranks first as
    // the only candidate with known load, cost aside.
    expect(parsed.candidates[0]).toMatchObject({
      cost: 1546,
      terms: { uncachedTokens: 0, queueTokens: 1536, penaltyTokens: 10 },
      load: {
        runningRequests: 1,
        waitingRequests: 2,
        kvUsage: 0.25,
        observedRanks: 2,
        expectedRanks: 2,
        ageMs: 40
      }
    })
    expect(parsed.candidates[1]).toMatchObject({
      reason: "LOAD_UNKNOWN",
      terms: { uncachedTokens: 128, penaltyTokens: 0 }
    })
    expect(parsed.candidates[1].load).toEqual({ observedRanks: 0, expectedRanks: 0 })
    expect(parsed.candidates[2]).toMatchObject({ eligible: false, reason: "NOT_READY" })
    expect(parsed.candidates[2].cost).toBeUndefined()
    expect(parsed.candidates[0].poolId.dcId).toBe("0000000000000001")
    expect(parsed.decision.servingEndpoint).toEqual({
      namespace: "prod",
      component: "backend",
      endpoint: "generate"
    })
  })

  it("no eligible candidate: 503 with the answer, NO_READY_LANE and a message", () => {
    const answer = routeDecision([candidate(0, 2, { ready: false })], DEFAULT_ROUTE_POLICY, new Map())
    const reply = routeReply(answer)
    expect(reply.status).toBe(503)
    const parsed = JSON.parse(reply.body)
    expect(Either.isRight(Schema.decodeUnknownEither(RouteUnavailableJson)(parsed))).toBe(true)
    expect(parsed).toMatchObject({ decision: null, reason: "NO_READY_LANE" })
    expect(parsed.candidates).toHaveLength(1)
  })

  it("a batch: an unknown model answers no candidates with its error, an ineligible query NO_READY_LANE", () => {
    const ok = routeDecision([candidate(0, 8)], DEFAULT_ROUTE_POLICY, new Map())
    const none = routeDecision(
      [candidate(0, 8, { readiness: "UNAVAILABLE" })],
      DEFAULT_ROUTE_POLICY,
      new Map()
    )
    const reply = routeBatchReply([ok, new ModelNotFound({ message: "no relay has registered it" }), none])
    expect(reply.status).toBe(200)
    const parsed = JSON.parse(reply.body)
    expect(Either.isRight(Schema.decodeUnknownEither(RouteBatchAnswerJson)(parsed))).toBe(true)
    expect(parsed.errors).toEqual([
      null,
      { reason: "MODEL_NOT_FOUND", message: "no relay has registered it" },
      { reason: "NO_READY_LANE", message: expect.any(String) }
    ])
    expect(parsed.results[1]).toEqual({ decision: null, candidates: [] })
    expect(parsed.results[2].candidates[0].reason).toBe("NOT_READY")
  })
})

describe("a lane's readiness", () => {
  const lane = {
    lane: 0,
    relay: "dc-a",
    ready: true,
    descriptor: {
      producer: { poolId: pool(1) },
      servingEndpoint: SERVING,
      registrations: [{ model: "llama", aliases: ["chat"], target: { _tag: "Base" } }]
    }
  } as unknown as LaneStatus
  const document = (state: "READY" | "UNAVAILABLE", model = "llama", poolId = pool(1)): ReadinessDocument =>
    ({
      revision: 1n,
      entries: [
        {
          namespace: "prod",
          canonicalModelId: model,
          state,
          members: [{ endpoint: SERVING, roles: [], poolId }]
        }
      ]
    }) as unknown as ReadinessDocument

  const received = (...args: Parameters<typeof document>) => receivedReadiness(document(...args), 0)

  it("is the state of the requested model's entry that lists the pool", () => {
    expect(readinessOfLane(received("READY"), lane, { namespace: "prod", model: "chat", tokens: [] })).toBe(
      "READY"
    )
    expect(
      readinessOfLane(received("UNAVAILABLE"), lane, { namespace: "prod", model: "llama", tokens: [] })
    ).toBe("UNAVAILABLE")
  })

  it("is unknown without a document, for another model's entry or another pool's", () => {
    const request = { namespace: "prod", model: "llama", tokens: [] }
    expect(readinessOfLane(undefined, lane, request)).toBeUndefined()
    expect(readinessOfLane(received("READY", "mistral"), lane, request)).toBeUndefined()
    expect(readinessOfLane(received("READY", "llama", pool(9)), lane, request)).toBeUndefined()
  })
})
