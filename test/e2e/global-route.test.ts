/**
 * Routing decisions end to end (PROTOCOL §2 `metricsUrl`, §5 engine load, §7.1), with real OS
 * processes: two `kvrelay relay` processes (east, west), each with one vLLM-format engine rank
 * in this process whose source advertises a metrics endpoint served by a fake engine (vLLM's
 * names over HTTP), and `kvrelay global` following both, queried with plain `fetch`.
 *
 * The prompt is cached in east only. With equal loads east wins; an idle west beats east once
 * east's queue costs more than its cache saves; `maxWaitingPerRank` and `maxKvUsage` make east
 * ineligible; a relay penalty moves the decision; east whose metrics stop ranks after west; and
 * east's relay SIGKILLed is `NOT_READY` until it is back.
 */

import { Effect, Scope } from "effect"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { type FakeEngine, fakeEngine, type RankValues, vllmPage } from "../load/engineFixtures.js"
import {
  closeScope,
  engineWorker,
  eventually,
  type HttpAnswer,
  type KvrelayProcess,
  MODEL,
  makeScope,
  makeTempDir,
  NAMESPACE,
  promptBlocks,
  promptTokens,
  request,
  type SimWorker,
  startGlobal,
  startRelay,
  stopAll,
  stopKvrelay,
  type TempDir,
  warmUp,
  writeDiscovery
} from "./globalProcessesHarness.js"

interface Candidate {
  readonly relay: string
  readonly lane: number
  readonly eligible: boolean
  readonly reason?: string
  readonly prefixDepth: number
  readonly matchedTokens: number
  readonly promptTokens: number
  readonly cost?: number
  readonly terms?: {
    readonly uncachedTokens: number
    readonly queueTokens?: number
    readonly penaltyTokens: number
  }
  readonly load: {
    readonly runningRequests?: number
    readonly waitingRequests?: number
    readonly kvUsage?: number
    readonly observedRanks: number
    readonly expectedRanks: number
    readonly ageMs?: number
  }
}

interface RouteAnswer {
  readonly decision: { readonly relay: string; readonly lane: number } | null
  readonly candidates: ReadonlyArray<Candidate>
  readonly reason?: string
}

const PROMPT = promptBlocks(33, 8)
const PROMPT_TOKENS = 8 * 64

let dir: TempDir
let scope: Scope.CloseableScope
let east: KvrelayProcess
let west: KvrelayProcess
let global: KvrelayProcess
let eastEngine: FakeEngine
let westEngine: FakeEngine
let eastWorker: SimWorker
let westWorker: SimWorker

const inScope = <A>(effect: Effect.Effect<A, never, Scope.Scope>): Promise<A> =>
  Effect.runPromise(Scope.extend(effect, scope))

const setLoad = (engine: FakeEngine, values: RankValues) =>
  engine.behave({ kind: "page", text: vllmPage({ 0: values }) })

const route = (globalUrl: string, body: Record<string, unknown> = {}): Promise<HttpAnswer> =>
  request(`${globalUrl}/v1/route`, {
    method: "POST",
    body: JSON.stringify({ namespace: NAMESPACE, model: MODEL, tokens: promptTokens(PROMPT), ...body })
  })

const answerOf = (answer: HttpAnswer): RouteAnswer => answer.body as RouteAnswer

const byRelay = (answer: RouteAnswer): Record<string, Candidate> =>
  Object.fromEntries(answer.candidates.map((c) => [c.relay, c]))

/** The route answer once `accept` holds (loads and readiness arrive once a second). */
const routeWhen = (
  what: string,
  accept: (answer: RouteAnswer, status: number) => boolean,
  globalUrl = global.url,
  body: Record<string, unknown> = {}
): Promise<RouteAnswer> =>
  eventually(
    what,
    async () => {
      const answer = await route(globalUrl, body)
      return { status: answer.status, body: answerOf(answer) }
    },
    ({ status, body }) => body !== undefined && Array.isArray(body.candidates) && accept(body, status),
    30_000,
    100
  ).then(({ body }) => body)

const IDLE: RankValues = { running: 0, waiting: 0, kv: 0.1 }

describe("routing decisions end to end (PROTOCOL §7.1 ◆3)", () => {
  beforeAll(async () => {
    dir = makeTempDir()
    scope = await makeScope()
    eastEngine = await inScope(fakeEngine({ kind: "page", text: vllmPage({ 0: IDLE }) }))
    westEngine = await inScope(fakeEngine({ kind: "page", text: vllmPage({ 0: IDLE }) }))
    eastWorker = await engineWorker(scope, "7101", "vllm")
    westWorker = await engineWorker(scope, "7201", "vllm")
    const withMetrics = async (worker: SimWorker, engine: FakeEngine) => ({
      cards: [worker.card()],
      sources: [{ ...(await worker.source()), metricsUrl: engine.url }]
    })
    writeDiscovery(`${dir.path}/east.json`, await withMetrics(eastWorker, eastEngine))
    writeDiscovery(`${dir.path}/west.json`, await withMetrics(westWorker, westEngine))
    east = await startRelay("east", `${dir.path}/east.json`)
    west = await startRelay("west", `${dir.path}/west.json`)
    global = await startGlobal([
      ["east", east.url],
      ["west", west.url]
    ])
    await warmUp(east.url, [eastWorker])
    await warmUp(west.url, [westWorker])
    await eastWorker.store(PROMPT)
  }, 120_000)

  afterAll(async () => {
    await stopAll()
    await closeScope(scope)
    dir.remove()
  })

  it("with equal loads the DC that holds the prompt wins, and every candidate shows its terms and load", async () => {
    setLoad(eastEngine, IDLE)
    setLoad(westEngine, IDLE)
    // With nothing cached both DCs cost the same and the first lane wins the tie, so east's
    // decision alone does not show the prompt arrived: wait for its depth too.
    const answer = await routeWhen(
      "east decided on the prompt it holds, with both loads known",
      (a, status) =>
        status === 200 &&
        a.decision?.relay === "east" &&
        a.candidates.length === 2 &&
        a.candidates.some((c) => c.relay === "east" && c.prefixDepth === 8) &&
        a.candidates.every((c) => c.load.observedRanks === 1 && c.reason === undefined)
    )
    const candidates = byRelay(answer)
    expect(answer.candidates.map((c) => c.relay)).toEqual(["east", "west"])
    expect(candidates["east"]).toMatchObject({
      eligible: true,
      prefixDepth: 8,
      matchedTokens: PROMPT_TOKENS,
      promptTokens: PROMPT_TOKENS,
      cost: 0,
      terms: { uncachedTokens: 0, queueTokens: 0, penaltyTokens: 0 },
      load: { runningRequests: 0, waitingRequests: 0, kvUsage: 0.1, observedRanks: 1, expectedRanks: 1 }
    })
    expect(candidates["west"]).toMatchObject({
      eligible: true,
      prefixDepth: 0,
      cost: PROMPT_TOKENS,
      terms: { uncachedTokens: PROMPT_TOKENS, queueTokens: 0, penaltyTokens: 0 }
    })
    expect(candidates["east"]!.load.ageMs).toBeGreaterThanOrEqual(0)
    // The consumer's stats show each relay's load and readiness watches standing.
    const stats = (await request(`${global.url}/v1/stats`)).body as {
      relays: ReadonlyArray<{
        name: string
        watches: Record<string, { state: string; receivedAt: string | null }>
      }>
    }
    for (const relay of stats.relays) {
      expect(relay.watches["load"]!.state, relay.name).toBe("up")
      expect(relay.watches["readiness"]!.state, relay.name).toBe("up")
      expect(relay.watches["load"]!.receivedAt).not.toBeNull()
    }
  }, 60_000)

  it("an idle DC with nothing cached wins over the cached DC whose queue costs more than its cache saves", async () => {
    // East: 2 requests on its one rank = 2048 queue tokens, more than the 512 its cache saves.
    setLoad(eastEngine, { running: 1, waiting: 1, kv: 0.3 })
    setLoad(westEngine, IDLE)
    const answer = await routeWhen("west decided", (a) => a.decision?.relay === "west")
    const candidates = byRelay(answer)
    expect(candidates["east"]).toMatchObject({
      eligible: true,
      cost: 2048,
      terms: { uncachedTokens: 0, queueTokens: 2048, penaltyTokens: 0 }
    })
    expect(candidates["west"]).toMatchObject({ eligible: true, cost: PROMPT_TOKENS })
    // A policy that prices a request lower puts the cache first again (a per-request override).
    const cheap = answerOf(await route(global.url, { policy: { requestTokens: 100 } }))
    expect(cheap.decision?.relay).toBe("east")
    expect(byRelay(cheap)["east"]!.terms?.queueTokens).toBe(200)
  }, 60_000)

  it("maxWaitingPerRank and maxKvUsage make a DC ineligible (OVERLOADED)", async () => {
    setLoad(eastEngine, { running: 0, waiting: 16, kv: 0.3 })
    setLoad(westEngine, IDLE)
    const waiting = await routeWhen(
      "east overloaded by its queue",
      (a) => byRelay(a)["east"]?.reason === "OVERLOADED"
    )
    expect(waiting.decision?.relay).toBe("west")
    expect(byRelay(waiting)["east"]).toMatchObject({ eligible: false, reason: "OVERLOADED" })
    expect(waiting.candidates.map((c) => c.relay)).toEqual(["west", "east"])
    // A higher threshold in the request's policy makes it eligible again.
    const relaxed = answerOf(await route(global.url, { policy: { maxWaitingPerRank: 17, requestTokens: 1 } }))
    expect(byRelay(relaxed)["east"]!.eligible).toBe(true)

    setLoad(eastEngine, { running: 0, waiting: 0, kv: 0.99 })
    const full = await routeWhen(
      "east overloaded by its KV usage",
      (a) => byRelay(a)["east"]?.reason === "OVERLOADED" && byRelay(a)["east"]?.load.kvUsage === 0.99
    )
    expect(full.decision?.relay).toBe("west")
    expect(byRelay(full)["east"]!.eligible).toBe(false)
    const looser = answerOf(await route(global.url, { policy: { maxKvUsage: 1 } }))
    expect(looser.decision?.relay).toBe("east")
  }, 60_000)

  it("a relay penalty moves the decision", async () => {
    setLoad(eastEngine, IDLE)
    setLoad(westEngine, IDLE)
    await routeWhen(
      "east decided again",
      (a) => a.decision?.relay === "east" && a.candidates.every((c) => c.reason === undefined)
    )
    const penalized = await startGlobal(
      [
        ["east", east.url],
        ["west", west.url]
      ],
      ["--relay-penalty", `east=${PROMPT_TOKENS + 1}`]
    )
    try {
      const answer = await routeWhen(
        "west decided under east's penalty, with east's lane ready beside it",
        // Both candidates must be there: a fresh consumer decides for west before east's lane
        // is ready, and east would then be missing from the candidates, not penalized among them.
        (a) =>
          a.decision?.relay === "west" &&
          a.candidates.length === 2 &&
          a.candidates.every((c) => c.eligible && c.load.observedRanks === 1),
        penalized.url
      )
      expect(byRelay(answer)["east"]!.terms).toEqual({
        uncachedTokens: 0,
        queueTokens: 0,
        penaltyTokens: PROMPT_TOKENS + 1
      })
    } finally {
      await stopKvrelay(penalized)
    }
  }, 90_000)

  it("a DC whose metrics stop is LOAD_UNKNOWN and ranks after the DCs with known load", async () => {
    setLoad(westEngine, IDLE)
    eastEngine.behave({ kind: "hang" })
    const answer = await routeWhen(
      "east's load unknown",
      (a) => byRelay(a)["east"]?.reason === "LOAD_UNKNOWN",
      global.url
    )
    expect(answer.decision?.relay).toBe("west")
    expect(answer.candidates.map((c) => c.relay)).toEqual(["west", "east"])
    const eastCandidate = byRelay(answer)["east"]!
    expect(eastCandidate.eligible).toBe(true)
    expect(eastCandidate.load.observedRanks).toBe(0)
    expect(eastCandidate.load.runningRequests).toBeUndefined()
    expect(eastCandidate.terms).toEqual({ uncachedTokens: 0, penaltyTokens: 0 })
    setLoad(eastEngine, IDLE)
    await routeWhen("east known again", (a) => a.decision?.relay === "east")
  }, 60_000)

  it("a relay SIGKILLed drops out as NOT_READY and comes back", async () => {
    const port = east.port
    await stopKvrelay(east, "SIGKILL")
    const down = await routeWhen("east not ready", (a) => byRelay(a)["east"]?.reason === "NOT_READY")
    expect(down.decision?.relay).toBe("west")
    expect(byRelay(down)["east"]!.eligible).toBe(false)
    expect(down.candidates.map((c) => c.relay)).toEqual(["west", "east"])
    east = await startRelay("east", `${dir.path}/east.json`, port)
    await warmUp(east.url, [eastWorker])
    await eastWorker.store(PROMPT)
    await routeWhen(
      "east back and decided",
      (a) => a.decision?.relay === "east" && byRelay(a)["east"]?.reason === undefined
    )
  }, 120_000)

  it("route/batch answers each query; a bad policy is 400 naming the field", async () => {
    const batch = await request(`${global.url}/v1/route/batch`, {
      method: "POST",
      body: JSON.stringify({
        queries: [
          { namespace: NAMESPACE, model: MODEL, tokens: promptTokens(PROMPT) },
          { namespace: NAMESPACE, model: "no-such-model", tokens: [1, 2, 3] }
        ]
      })
    })
    expect(batch.status).toBe(200)
    const body = batch.body as { results: Array<RouteAnswer>; errors: Array<{ reason: string } | null> }
    expect(body.results).toHaveLength(2)
    expect(body.results[0]!.candidates).toHaveLength(2)
    expect(body.errors[0]).toBeNull()
    expect(body.errors[1]?.reason).toBe("MODEL_NOT_FOUND")
    expect(body.results[1]).toEqual({ decision: null, candidates: [] })

    const bad = await route(global.url, { policy: { maxKvUsage: 1.5, foo: 1 } })
    expect(bad.status).toBe(400)
    const error = bad.body as { reason: string; message: string }
    expect(error.reason).toBe("INVALID_REQUEST")
    expect(error.message).toContain("policy.maxKvUsage")
    expect(error.message).toContain("policy.foo")
  }, 30_000)
})
