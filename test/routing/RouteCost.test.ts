/**
 * The §7.1 cost model: one table test per rule, a property test of the whole ranking against a
 * plain reading of PROTOCOL §7.1 written out again below, the `policy` schema's errors in the
 * contract's words, and the `--relay-penalty NAME=TOKENS` flag.
 */

import { describe, expect, it } from "@effect/vitest"
import { Either, Option, Schema } from "effect"
import * as fc from "fast-check"
import { DEFAULT_ROUTE_POLICY, decodeRoutePolicy, type RoutePolicy } from "../../src/protocol/RouteApi.js"
import {
  type CandidateLoad,
  type PoolReadinessState,
  parseRelayPenalty,
  parseRoutePolicyFlag,
  RelayPenaltyFlag,
  type RouteCandidate,
  type RouteCandidateInput,
  relayPenalties,
  routeDecision
} from "../../src/routing/RouteCost.js"

const BLOCK = 16

/** A ready candidate of `lane` on relay `dc-<lane>` with `promptBlocks` of prompt and `depth` matched. */
const candidate = (
  lane: number,
  depth: number,
  load: CandidateLoad | undefined,
  extra: Partial<RouteCandidateInput<string>> = {}
): RouteCandidateInput<string> => ({
  relay: `dc-${lane}`,
  lane,
  poolId: `pool-${lane}`,
  servingEndpoint: "prod.backend.generate",
  ready: true,
  readiness: "READY",
  prefixDepth: depth,
  matchedTokens: depth * BLOCK,
  promptTokens: 64 * BLOCK,
  load,
  ...extra
})

const window = (
  runningRequests: number,
  waitingRequests: number,
  kvUsage = 0.5,
  observedRanks = 1
): CandidateLoad => ({
  runningRequests,
  waitingRequests,
  kvUsage,
  observedRanks,
  expectedRanks: observedRanks,
  ageMs: 500
})

const order = (candidates: ReadonlyArray<RouteCandidate<string>>) => candidates.map((c) => c.lane)
const byLane = (candidates: ReadonlyArray<RouteCandidate<string>>, lane: number) =>
  candidates.find((c) => c.lane === lane)!

describe("cost and terms", () => {
  it("prices uncached prefill, queue and penalty for a candidate with known load", () => {
    const answer = routeDecision(
      [candidate(0, 40, window(3, 1, 0.5, 2))],
      DEFAULT_ROUTE_POLICY,
      new Map([["dc-0", 100]])
    )
    expect(answer.decision).toStrictEqual({
      relay: "dc-0",
      lane: 0,
      poolId: "pool-0",
      servingEndpoint: "prod.backend.generate"
    })
    expect(answer.candidates).toStrictEqual([
      {
        relay: "dc-0",
        lane: 0,
        poolId: "pool-0",
        servingEndpoint: "prod.backend.generate",
        eligible: true,
        prefixDepth: 40,
        matchedTokens: 640,
        promptTokens: 1024,
        // 1024 − 1.0 × 640 + 1024 × (3 + 1) / 2 + 100
        cost: 384 + 2048 + 100,
        terms: { uncachedTokens: 384, queueTokens: 2048, penaltyTokens: 100 },
        load: {
          runningRequests: 3,
          waitingRequests: 1,
          kvUsage: 0.5,
          observedRanks: 2,
          expectedRanks: 2,
          ageMs: 500
        }
      }
    ])
  })

  it("with equal loads the DC that holds the prompt wins", () => {
    const answer = routeDecision([candidate(0, 0, window(2, 0)), candidate(1, 64, window(2, 0))])
    expect(answer.decision?.relay).toBe("dc-1")
    expect(order(answer.candidates)).toEqual([1, 0])
  })

  it("an idle DC with nothing cached wins over a cached DC whose queue costs more than the credit", () => {
    // Cached: 0 uncached + 1024 × 2 queued; idle: 1024 uncached + 0.
    const answer = routeDecision([candidate(0, 64, window(1, 1)), candidate(1, 0, window(0, 0))])
    expect(answer.decision?.relay).toBe("dc-1")
    expect(byLane(answer.candidates, 0).cost).toBe(2048)
    expect(byLane(answer.candidates, 1).cost).toBe(1024)
  })

  it("a penalty moves the decision", () => {
    const candidates = [candidate(0, 32, window(0, 0)), candidate(1, 30, window(0, 0))]
    expect(routeDecision(candidates).decision?.relay).toBe("dc-0")
    expect(routeDecision(candidates, DEFAULT_ROUTE_POLICY, { "dc-0": 64 }).decision?.relay).toBe("dc-1")
  })

  it("the policy's credit and request tokens weigh the terms", () => {
    const policy: RoutePolicy = { ...DEFAULT_ROUTE_POLICY, overlapCredit: 0.5, requestTokens: 100 }
    const [only] = routeDecision([candidate(0, 32, window(2, 2, 0.5, 4))], policy).candidates
    expect(only!.terms).toStrictEqual({ uncachedTokens: 1024 - 256, queueTokens: 100, penaltyTokens: 0 })
    expect(only!.cost).toBe(868)
  })

  it("a candidate whose overlap could not be probed has no cost nor terms", () => {
    const [only] = routeDecision([
      candidate(0, 0, window(0, 0), { ready: false, overlapKnown: false })
    ]).candidates
    expect(only).not.toHaveProperty("cost")
    expect(only).not.toHaveProperty("terms")
    expect(only!.reason).toBe("NOT_READY")
  })
})

describe("readiness", () => {
  it.each<[string, Partial<RouteCandidateInput<string>>]>([
    ["a lane that is not ready", { ready: false }],
    ["a pool that is UNAVAILABLE", { readiness: "UNAVAILABLE" }],
    ["a pool whose readiness is UNKNOWN", { readiness: "UNKNOWN" }],
    ["a pool without readiness seen", { readiness: undefined }]
  ])("%s is NOT_READY, ineligible and last", (_, extra) => {
    const answer = routeDecision([candidate(0, 64, window(0, 0), extra), candidate(1, 0, window(5, 5))])
    expect(answer.decision?.lane).toBe(1)
    expect(order(answer.candidates)).toEqual([1, 0])
    expect(byLane(answer.candidates, 0)).toMatchObject({ eligible: false, reason: "NOT_READY", cost: 0 })
  })

  it("no eligible candidate: decision null, every candidate still answered", () => {
    const answer = routeDecision([
      candidate(0, 1, window(0, 0), { ready: false }),
      candidate(1, 2, undefined, { readiness: "UNAVAILABLE" })
    ])
    expect(answer.decision).toBeNull()
    expect(answer.candidates.map((c) => [c.lane, c.eligible, c.reason])).toEqual([
      [1, false, "NOT_READY"],
      [0, false, "NOT_READY"]
    ])
  })
})

describe("overload", () => {
  it("kvUsage at maxKvUsage is overloaded: ineligible, with its cost", () => {
    const answer = routeDecision([candidate(0, 64, window(0, 0, 0.98)), candidate(1, 0, window(0, 0, 0.97))])
    expect(answer.decision?.lane).toBe(1)
    expect(byLane(answer.candidates, 0)).toMatchObject({ eligible: false, reason: "OVERLOADED", cost: 0 })
    expect(byLane(answer.candidates, 1)).not.toHaveProperty("reason")
  })

  it("waiting per observed rank reaching maxWaitingPerRank is overloaded", () => {
    const policy = { ...DEFAULT_ROUTE_POLICY, maxWaitingPerRank: 4 }
    const at = routeDecision(
      [candidate(0, 64, window(0, 8, 0.1, 2)), candidate(1, 0, window(0, 7, 0.1, 2))],
      policy
    )
    expect(byLane(at.candidates, 0)).toMatchObject({ eligible: false, reason: "OVERLOADED" })
    expect(byLane(at.candidates, 1)).toMatchObject({ eligible: true })
    expect(at.decision?.lane).toBe(1)
  })

  it("when every ready candidate with known load is overloaded, they stay eligible and keep the reason", () => {
    const answer = routeDecision([
      candidate(0, 0, window(0, 0, 0.99)),
      candidate(1, 64, window(0, 0, 0.99)),
      // Not ready, not overloaded: does not count.
      candidate(2, 64, window(0, 0, 0.1), { ready: false }),
      // Unknown load: eligible, after the known ones.
      candidate(3, 64, undefined)
    ])
    expect(answer.decision?.lane).toBe(1)
    expect(answer.candidates.map((c) => [c.lane, c.eligible, c.reason])).toEqual([
      [1, true, "OVERLOADED"],
      [0, true, "OVERLOADED"],
      [3, true, "LOAD_UNKNOWN"],
      [2, false, "NOT_READY"]
    ])
  })

  it("a missing kvUsage does not make a candidate overloaded, nor its load unknown", () => {
    const load = { runningRequests: 1, waitingRequests: 0, observedRanks: 1, expectedRanks: 1, ageMs: 0 }
    const [only] = routeDecision([candidate(0, 0, load)]).candidates
    expect(only).toMatchObject({
      eligible: true,
      terms: { uncachedTokens: 1024, queueTokens: 1024, penaltyTokens: 0 }
    })
    expect(only).not.toHaveProperty("reason")
  })
})

describe("unknown load", () => {
  it.each<[string, CandidateLoad | undefined]>([
    ["no window", undefined],
    ["a window 3 s old", { ...window(0, 0), ageMs: 3000 }],
    ["no observed rank", { observedRanks: 0, expectedRanks: 2, ageMs: 10 }],
    ["no running count", { waitingRequests: 0, observedRanks: 1, expectedRanks: 1, ageMs: 10 }]
  ])("%s: eligible, LOAD_UNKNOWN, no queue term, after every candidate with known load", (_, load) => {
    // The unknown one is far cheaper on what is known, and still comes second.
    const answer = routeDecision([candidate(0, 64, load), candidate(1, 0, window(10, 10))])
    expect(order(answer.candidates)).toEqual([1, 0])
    expect(answer.decision?.lane).toBe(1)
    const unknown = byLane(answer.candidates, 0)
    expect(unknown).toMatchObject({ eligible: true, reason: "LOAD_UNKNOWN", cost: 0 })
    expect(unknown.terms).toStrictEqual({ uncachedTokens: 0, penaltyTokens: 0 })
  })

  it("reports the window as received, and none when there is none", () => {
    const answer = routeDecision([
      candidate(0, 0, undefined),
      candidate(1, 0, {
        runningRequests: 2,
        waitingRequests: 1,
        observedRanks: 1,
        expectedRanks: 4,
        ageMs: 4000
      })
    ])
    expect(byLane(answer.candidates, 0).load).toStrictEqual({ observedRanks: 0, expectedRanks: 0 })
    expect(byLane(answer.candidates, 1).load).toStrictEqual({
      runningRequests: 2,
      waitingRequests: 1,
      observedRanks: 1,
      expectedRanks: 4,
      ageMs: 4000
    })
  })
})

describe("ties", () => {
  it("equal cost goes to the larger matchedTokens, then to the lower lane", () => {
    // Lane 2: 1024 − 512 + 1024 = 1536; lane 0 and lane 1: 1024 − 0 + 512 = 1536 each (half a request).
    const answer = routeDecision([
      candidate(1, 0, window(1, 0, 0.1, 2)),
      candidate(0, 0, window(1, 0, 0.1, 2)),
      candidate(2, 32, window(1, 0, 0.1, 1))
    ])
    expect(answer.candidates.map((c) => c.cost)).toEqual([1536, 1536, 1536])
    expect(order(answer.candidates)).toEqual([2, 0, 1])
  })
})

// --- §7.1 once more, as plainly as it reads, for the property test --------------------------

interface Expected {
  readonly key: string
  readonly eligible: boolean
  readonly reason: string | undefined
  readonly cost: number | undefined
  readonly queueTokens: number | undefined
}

const reference = (
  candidates: ReadonlyArray<RouteCandidateInput<string>>,
  policy: RoutePolicy,
  penalties: Readonly<Record<string, number>>
): { decision: string | null; eligibleInOrder: Array<string>; byKey: Map<string, Expected> } => {
  const keyOf = (c: RouteCandidateInput<string>) => `${c.relay}/${c.lane}`
  const isReady = (c: RouteCandidateInput<string>) => c.ready && c.readiness === "READY"
  const loadIsKnown = (c: RouteCandidateInput<string>) =>
    c.load !== undefined &&
    c.load.ageMs < 3000 &&
    c.load.observedRanks >= 1 &&
    c.load.runningRequests !== undefined &&
    c.load.waitingRequests !== undefined
  const isOverloaded = (c: RouteCandidateInput<string>) => {
    if (!loadIsKnown(c)) return false
    const load = c.load!
    if (load.kvUsage !== undefined && load.kvUsage >= policy.maxKvUsage) return true
    return load.waitingRequests! / load.observedRanks >= policy.maxWaitingPerRank
  }
  const readyWithKnownLoad = candidates.filter((c) => isReady(c) && loadIsKnown(c))
  const everyOneOverloaded = readyWithKnownLoad.length > 0 && readyWithKnownLoad.every(isOverloaded)

  const byKey = new Map<string, Expected>()
  const eligibleKnown: Array<[RouteCandidateInput<string>, number]> = []
  const eligibleUnknown: Array<[RouteCandidateInput<string>, number]> = []
  for (const c of candidates) {
    const uncached = c.promptTokens - policy.overlapCredit * c.matchedTokens
    const queue = loadIsKnown(c)
      ? (policy.requestTokens * (c.load!.runningRequests! + c.load!.waitingRequests!)) / c.load!.observedRanks
      : undefined
    const cost = uncached + (queue ?? 0) + (penalties[c.relay] ?? 0)
    let eligible: boolean
    let reason: string | undefined
    if (!isReady(c)) {
      eligible = false
      reason = "NOT_READY"
    } else if (isOverloaded(c)) {
      eligible = everyOneOverloaded
      reason = "OVERLOADED"
    } else if (!loadIsKnown(c)) {
      eligible = true
      reason = "LOAD_UNKNOWN"
    } else {
      eligible = true
      reason = undefined
    }
    byKey.set(keyOf(c), { key: keyOf(c), eligible, reason, cost, queueTokens: queue })
    if (eligible) (loadIsKnown(c) ? eligibleKnown : eligibleUnknown).push([c, cost])
  }
  const best = (a: [RouteCandidateInput<string>, number], b: [RouteCandidateInput<string>, number]) => {
    if (a[1] !== b[1]) return a[1] < b[1] ? -1 : 1
    if (a[0].matchedTokens !== b[0].matchedTokens) return a[0].matchedTokens > b[0].matchedTokens ? -1 : 1
    return a[0].lane - b[0].lane
  }
  const eligibleInOrder = [...eligibleKnown.sort(best), ...eligibleUnknown.sort(best)].map(([c]) => keyOf(c))
  return { decision: eligibleInOrder[0] ?? null, eligibleInOrder, byKey }
}

const arbitraryLoad: fc.Arbitrary<CandidateLoad | undefined> = fc.option(
  fc
    .record({
      runningRequests: fc.option(fc.integer({ min: 0, max: 40 }), { nil: undefined, freq: 8 }),
      waitingRequests: fc.option(fc.integer({ min: 0, max: 40 }), { nil: undefined, freq: 8 }),
      kvUsage: fc.option(fc.constantFrom(0, 0.25, 0.5, 0.75, 0.98, 1), { nil: undefined, freq: 6 }),
      observedRanks: fc.constantFrom(0, 1, 2, 4),
      extraRanks: fc.constantFrom(0, 1, 2),
      ageMs: fc.constantFrom(0, 1000, 2999, 3000, 10_000)
    })
    .map(({ extraRanks, ...load }) => ({ ...load, expectedRanks: load.observedRanks + extraRanks })),
  { nil: undefined, freq: 5 }
)

const arbitraryCandidates: fc.Arbitrary<ReadonlyArray<RouteCandidateInput<string>>> = fc
  .uniqueArray(fc.integer({ min: 0, max: 15 }), { minLength: 1, maxLength: 16 })
  .chain((lanes) =>
    fc.tuple(
      ...lanes.map((lane) =>
        fc
          .record({
            relay: fc.constantFrom("dc-a", "dc-b", "dc-c"),
            ready: fc.oneof(
              { arbitrary: fc.constant(true), weight: 5 },
              { arbitrary: fc.constant(false), weight: 1 }
            ),
            readiness: fc.oneof(
              { arbitrary: fc.constant<PoolReadinessState | undefined>("READY"), weight: 6 },
              {
                arbitrary: fc.constantFrom<PoolReadinessState | undefined>(
                  "UNAVAILABLE",
                  "UNKNOWN",
                  undefined
                ),
                weight: 1
              }
            ),
            promptBlocks: fc.integer({ min: 0, max: 8 }),
            depthShare: fc.integer({ min: 0, max: 8 }),
            load: arbitraryLoad
          })
          .map(({ relay, ready, readiness, promptBlocks, depthShare, load }): RouteCandidateInput<string> => {
            const depth = Math.min(promptBlocks, depthShare)
            return {
              relay,
              lane,
              poolId: `pool-${lane}`,
              servingEndpoint: "prod.backend.generate",
              ready,
              readiness,
              prefixDepth: depth,
              matchedTokens: depth * BLOCK,
              promptTokens: promptBlocks * BLOCK,
              load
            }
          })
      )
    )
  )

// Values whose arithmetic is exact in binary, so ties are ties for both implementations.
const arbitraryPolicy: fc.Arbitrary<RoutePolicy> = fc.record({
  overlapCredit: fc.constantFrom(0, 0.5, 1, 2),
  requestTokens: fc.constantFrom(0, 16, 1024),
  maxKvUsage: fc.constantFrom(0.5, 0.75, 0.98, 1),
  maxWaitingPerRank: fc.constantFrom(0.5, 1, 4, 16)
})

const arbitraryPenalties = fc.record(
  { "dc-a": fc.constantFrom(0, 64, 1024), "dc-b": fc.constantFrom(0, 64, 1024) },
  { requiredKeys: [] }
)

describe("the ranking rules against a plain reading of §7.1 (property)", () => {
  it("same decision, eligibility, reasons, costs, queue terms and order of the eligible", () => {
    fc.assert(
      fc.property(
        arbitraryCandidates,
        arbitraryPolicy,
        arbitraryPenalties,
        (candidates, policy, penalties) => {
          const answer = routeDecision(candidates, policy, penalties)
          const want = reference(candidates, policy, penalties)
          const keyOf = (c: { relay: string; lane: number }) => `${c.relay}/${c.lane}`

          expect(answer.decision === null ? null : keyOf(answer.decision)).toBe(want.decision)
          expect(answer.candidates).toHaveLength(candidates.length)
          const eligible = answer.candidates.filter((c) => c.eligible)
          expect(eligible.map(keyOf)).toEqual(want.eligibleInOrder)
          // Ineligible ones last.
          expect(answer.candidates.slice(0, eligible.length).every((c) => c.eligible)).toBe(true)
          for (const c of answer.candidates) {
            const expected = want.byKey.get(keyOf(c))!
            expect(c.eligible).toBe(expected.eligible)
            expect(c.reason).toBe(expected.reason)
            expect(c.cost).toBe(expected.cost)
            expect(c.terms?.queueTokens).toBe(expected.queueTokens)
            expect(c.terms!.uncachedTokens + (c.terms!.queueTokens ?? 0) + c.terms!.penaltyTokens).toBe(
              c.cost
            )
          }
        }
      ),
      { numRuns: 2000 }
    )
  })
})

// --- Policy and flags ---------------------------------------------------------------------------

const policyError = (input: unknown) => Either.getLeft(decodeRoutePolicy(input))

describe("policy", () => {
  it("defaults to the flags' values, and overrides any of the four", () => {
    expect(decodeRoutePolicy(undefined)).toStrictEqual(Either.right(DEFAULT_ROUTE_POLICY))
    expect(decodeRoutePolicy({})).toStrictEqual(Either.right(DEFAULT_ROUTE_POLICY))
    const flags: RoutePolicy = {
      overlapCredit: 0.8,
      requestTokens: 512,
      maxKvUsage: 0.9,
      maxWaitingPerRank: 8
    }
    expect(decodeRoutePolicy({ maxKvUsage: 1, requestTokens: 0 }, flags)).toStrictEqual(
      Either.right({ overlapCredit: 0.8, requestTokens: 0, maxKvUsage: 1, maxWaitingPerRank: 8 })
    )
  })

  it.each<[unknown, string]>([
    [{ maxKvUsage: 1.5 }, "policy.maxKvUsage: must be in (0, 1], got 1.5"],
    [{ maxKvUsage: 0 }, "policy.maxKvUsage: must be in (0, 1], got 0"],
    [{ overlapCredit: -0.5 }, "policy.overlapCredit: must be a finite number ≥ 0, got -0.5"],
    [{ requestTokens: 10.5 }, "policy.requestTokens: must be an integer ≥ 0, got 10.5"],
    [{ requestTokens: -1 }, "policy.requestTokens: must be an integer ≥ 0, got -1"],
    [{ maxWaitingPerRank: 0 }, "policy.maxWaitingPerRank: must be a finite number > 0, got 0"],
    [{ overlapCredit: "1.0" }, 'policy.overlapCredit: must be a finite number ≥ 0, got "1.0"'],
    [{ maxKvUsage: null }, "policy.maxKvUsage: must be in (0, 1], got null"],
    [
      { maxKvUsage: 0.9, creditScale: 2 },
      'unknown field "policy.creditScale"; policy takes overlapCredit, requestTokens, maxKvUsage, maxWaitingPerRank'
    ],
    [
      [],
      "policy: must be an object with any of overlapCredit, requestTokens, maxKvUsage, maxWaitingPerRank, got an array"
    ],
    [
      7,
      "policy: must be an object with any of overlapCredit, requestTokens, maxKvUsage, maxWaitingPerRank, got 7"
    ]
  ])("%j → %s", (input, message) => {
    expect(policyError(input)).toStrictEqual(Option.some(message))
  })

  it("names every field at fault at once", () => {
    expect(policyError({ maxKvUsage: 2, maxWaitingPerRank: -1 })).toStrictEqual(
      Option.some(
        "policy.maxKvUsage: must be in (0, 1], got 2; policy.maxWaitingPerRank: must be a finite number > 0, got -1"
      )
    )
  })

  it("reads each policy flag's value, or names the flag and the rule", () => {
    expect(parseRoutePolicyFlag("maxKvUsage", "0.9")).toStrictEqual(Either.right(0.9))
    expect(parseRoutePolicyFlag("requestTokens", "2048")).toStrictEqual(Either.right(2048))
    expect(parseRoutePolicyFlag("maxKvUsage", "1.5")).toStrictEqual(
      Either.left('--route-max-kv-usage: must be in (0, 1], got "1.5"')
    )
    expect(parseRoutePolicyFlag("overlapCredit", "")).toStrictEqual(
      Either.left('--route-overlap-credit: must be a finite number ≥ 0, got ""')
    )
    expect(parseRoutePolicyFlag("maxWaitingPerRank", "lots")).toStrictEqual(
      Either.left('--route-max-waiting-per-rank: must be a finite number > 0, got "lots"')
    )
    expect(parseRoutePolicyFlag("requestTokens", "1e3")).toStrictEqual(Either.right(1000))
  })
})

describe("--relay-penalty NAME=TOKENS", () => {
  it("reads a relay name and a number of tokens", () => {
    expect(parseRelayPenalty("eu-west=2000")).toStrictEqual(Either.right({ relay: "eu-west", tokens: 2000 }))
    expect(parseRelayPenalty("a=b=1.5")).toStrictEqual(Either.right({ relay: "a=b", tokens: 1.5 }))
    expect(Schema.decodeUnknownSync(RelayPenaltyFlag)("us=0")).toStrictEqual({ relay: "us", tokens: 0 })
  })

  it.each<[string, string]>([
    ["eu-west", '--relay-penalty "eu-west": expected NAME=TOKENS'],
    ["=100", '--relay-penalty "=100": expected NAME=TOKENS'],
    ["eu-west=", '--relay-penalty "eu-west=": TOKENS must be a finite number ≥ 0, got ""'],
    ["eu-west=-5", '--relay-penalty "eu-west=-5": TOKENS must be a finite number ≥ 0, got "-5"'],
    ["eu-west=lots", '--relay-penalty "eu-west=lots": TOKENS must be a finite number ≥ 0, got "lots"'],
    [" eu=1", '--relay-penalty " eu=1": the relay name must be text without surrounding blanks']
  ])("%s → %s", (text, message) => {
    expect(parseRelayPenalty(text)).toStrictEqual(Either.left(message))
  })

  it("names every problem: forms, relays no --relay names, relays given twice", () => {
    expect(relayPenalties(["us=10", "eu=20"], ["us", "eu"])).toStrictEqual(
      Either.right(
        new Map([
          ["us", 10],
          ["eu", 20]
        ])
      )
    )
    expect(relayPenalties(["us=10", "ap=5", "us=20", "eu"], ["us", "eu"])).toStrictEqual(
      Either.left([
        '--relay-penalty "ap=5": no --relay is named "ap"',
        '--relay-penalty: relay "us" is given more than once',
        '--relay-penalty "eu": expected NAME=TOKENS'
      ])
    )
  })
})
