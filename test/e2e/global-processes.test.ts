/**
 * Issue 7, end to end with real OS processes: two `kvrelay relay` processes (dc-a, dc-b), each
 * with its own discovery document and simulated workers (Dynamo event plane with worker query,
 * vLLM and SGLang engine events) in this process, and one `kvrelay global` following both. The
 * global consumer is queried with plain `fetch` (PROTOCOL.md §7).
 *
 * Workers: dc-a = 1001 (dynamo-zmq) + 1002 (engine-zmq, vLLM); dc-b = 2001 (dynamo-zmq) + 2002
 * (engine-zmq, SGLang). Prompts: P1 (16 blocks) is held fully by 1001 and its first 10 blocks by
 * 2001; P2 (12 blocks) by 1002 up to half; P3 (8 blocks) fully by 2002; nobody holds P4.
 */

import type { Scope } from "effect"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { localBlockHashes } from "../../src/ckf/tokens.js"
import { hashPairsToBigInts } from "../../src/ckf/u64.js"
import {
  ALIAS,
  closeScope,
  type DomainEntry,
  depths,
  depthsByLocal,
  discoveryOf,
  domains,
  dynamoWorker,
  engineWorker,
  eventually,
  KV_BLOCK_SIZE,
  type KvrelayProcess,
  lanesWhen,
  MODEL,
  makeScope,
  makeTempDir,
  metrics,
  metricValue,
  NAMESPACE,
  type OverlapResult,
  overlap,
  promptBlocks,
  promptTokens,
  request,
  SERVING,
  type SimWorker,
  startGlobal,
  startRelay,
  stopAll,
  stopKvrelay,
  type TempDir,
  warmUp,
  writeDiscovery
} from "./globalProcessesHarness.js"

const P1 = promptBlocks(1, 16)
const P2 = promptBlocks(2, 12)
const P3 = promptBlocks(3, 8)
const P4 = promptBlocks(4, 8)
/** Stored by the malformed-requests test alone. */
const P5 = promptBlocks(5, 2)

let scope: Scope.CloseableScope | undefined
let dir: TempDir | undefined
let relayA: KvrelayProcess
let relayB: KvrelayProcess
let global: KvrelayProcess
let a1: SimWorker
let a2: SimWorker
let b1: SimWorker
let b2: SimWorker

beforeAll(async () => {
  scope = await makeScope()
  dir = makeTempDir()
  a1 = await dynamoWorker(scope, "1001")
  a2 = await engineWorker(scope, "1002", "vllm")
  b1 = await dynamoWorker(scope, "2001")
  b2 = await engineWorker(scope, "2002", "sglang")
  const pathA = `${dir.path}/dc-a.json`
  const pathB = `${dir.path}/dc-b.json`
  writeDiscovery(pathA, await discoveryOf([a1, a2]))
  writeDiscovery(pathB, await discoveryOf([b1, b2]))
  ;[relayA, relayB] = await Promise.all([startRelay("dc-a", pathA), startRelay("dc-b", pathB)])
  global = await startGlobal([
    ["dc-a", relayA.url],
    ["dc-b", relayB.url]
  ])
  await Promise.all([warmUp(relayA.url, [a1, a2]), warmUp(relayB.url, [b1, b2])])
  await lanesWhen(
    global.url,
    "both lanes ready",
    (lanes) => lanes["dc-a"]?.ready === true && lanes["dc-b"]?.ready === true
  )
}, 120_000)

afterAll(async () => {
  await stopAll()
  if (scope !== undefined) await closeScope(scope)
  dir?.remove()
})

type Depths = Record<string, number>

const sameDepths = (expected: Depths) => (actual: Depths) =>
  JSON.stringify(actual) === JSON.stringify(expected)

/** Waits until the consumer answers `expected` (depth per relay) for `hashes`. */
const converge = (what: string, hashes: ReadonlyArray<bigint>, expected: Depths) =>
  eventually(`${what}: ${JSON.stringify(expected)}`, () => depths(global.url, hashes), sameDepths(expected))

describe("global consumer over two relay processes", () => {
  it("answers the prefix each DC holds for prompts shared by both DCs, by one, and by none", async () => {
    await a1.store(P1.slice(0, 8))
    await a1.store(P1.slice(8), P1[7])
    await a2.store(P2.slice(0, 6))
    await b1.store(P1.slice(0, 10))
    await b2.store(P3.slice(0, 4))
    await b2.store(P3.slice(4), P3[3])

    await converge("P1", P1, { "dc-a": 16, "dc-b": 10 })
    await converge("P2", P2, { "dc-a": 6, "dc-b": 0 })
    await converge("P3", P3, { "dc-b": 8, "dc-a": 0 })
    await converge("P4", P4, { "dc-a": 0, "dc-b": 0 })

    const catalogs = await Promise.all([relayA, relayB].map((relay) => request(`${relay.url}/v1/catalog`)))
    const [poolA, poolB] = catalogs.map((catalog) => {
      expect(catalog.status).toBe(200)
      const pools = (catalog.body as { pools: ReadonlyArray<{ producer: { poolId: unknown } }> }).pools
      expect(pools).toHaveLength(1)
      return pools[0]!.producer
    })

    // Full answers: deepest first, matchedTokens = depth × block size, one entry per ready lane.
    const results = async (hashes: ReadonlyArray<bigint>) => {
      const answer = await overlap(global.url, hashes)
      expect(answer.status).toBe(200)
      return (answer.body as { results: ReadonlyArray<OverlapResult> }).results
    }
    const entry = (relay: "dc-a" | "dc-b", prefixDepth: number) => ({
      relay,
      lane: relay === "dc-a" ? 0 : 1,
      poolId: relay === "dc-a" ? poolA!.poolId : poolB!.poolId,
      servingEndpoint: SERVING,
      prefixDepth,
      matchedTokens: prefixDepth * KV_BLOCK_SIZE
    })
    expect(await results(P1)).toEqual([entry("dc-a", 16), entry("dc-b", 10)])
    expect(await results(P2)).toEqual([entry("dc-a", 6), entry("dc-b", 0)])
    expect(await results(P3)).toEqual([entry("dc-b", 8), entry("dc-a", 0)])
    // Equal depths keep lane order.
    expect(await results(P4)).toEqual([entry("dc-a", 0), entry("dc-b", 0)])
    // A longer prompt that starts with a held prefix, and a prefix of a held prompt.
    expect(await results([...P1.slice(0, 12), ...P4])).toEqual([entry("dc-a", 12), entry("dc-b", 10)])
    expect(await results(P1.slice(0, 3))).toEqual([entry("dc-a", 3), entry("dc-b", 3)])
    // An empty prompt matches nothing anywhere.
    expect(await results([])).toEqual([entry("dc-a", 0), entry("dc-b", 0)])

    // The alias on the cards names the same pools.
    const byAlias = await overlap(global.url, P1, ALIAS)
    expect(byAlias.status).toBe(200)
    expect(byAlias.body).toEqual((await overlap(global.url, P1)).body)

    // GET /v1/domains: one domain, both lanes ready, in --relay order, with the relays' pools.
    const list = await domains(global.url)
    expect(list).toHaveLength(1)
    const domain: DomainEntry = list[0]!
    expect(domain.querySemantics).toEqual({
      kvBlockSize: KV_BLOCK_SIZE,
      hashFormat: "dynamo_standard_v1",
      addressing: "canonical_v1"
    })
    expect(domain.lanes.map((lane) => [lane.lane, lane.relay, lane.ready])).toEqual([
      [0, "dc-a", true],
      [1, "dc-b", true]
    ])
    expect(domain.lanes[0]!.producer).toEqual(poolA)
    expect(domain.lanes[1]!.producer).toEqual(poolB)
    expect(domain.lanes[0]!.poolId).toEqual(poolA!.poolId)
    expect(domain.lanes[1]!.poolId).toEqual(poolB!.poolId)
    for (const lane of domain.lanes) {
      expect(lane.servingEndpoint).toEqual(SERVING)
      expect(lane.installedSequence).toMatch(/^(0|[1-9][0-9]*)$/)
      expect({
        cacheSemantics: lane.poolId["cacheSemantics"],
        routingScope: lane.poolId["routingScope"]
      }).toEqual({
        cacheSemantics: domain.cacheSemantics,
        routingScope: domain.routingScope
      })
    }
    // Each pool id carries its relay's dc id.
    const infos = await Promise.all([relayA, relayB].map((relay) => request(`${relay.url}/v1/relay`)))
    expect(domain.lanes.map((lane) => lane.poolId.dcId)).toEqual(
      infos.map((info) => (info.body as { dcId: string }).dcId)
    )
    expect(domain.lanes[0]!.poolId.dcId).not.toBe(domain.lanes[1]!.poolId.dcId)

    // The same question by pool domain.
    const byDomain = await request(`${global.url}/v1/overlap`, {
      method: "POST",
      body: JSON.stringify({
        poolDomain: { cacheSemantics: domain.cacheSemantics, routingScope: domain.routingScope },
        tokens: promptTokens(P1)
      })
    })
    expect(byDomain.status).toBe(200)
    expect((byDomain.body as { results: unknown }).results).toEqual([entry("dc-a", 16), entry("dc-b", 10)])
  })

  it("drops a DC's depth to 0 when its worker clears, while the other DC's stays", async () => {
    // SGLang AllBlocksCleared at dc-b: P3 is gone there; 2001 still holds P1's first 10 blocks.
    await b2.clear()
    await converge("P3 after 2002 cleared", P3, { "dc-a": 0, "dc-b": 0 })
    await converge("P1 after 2002 cleared", P1, { "dc-a": 16, "dc-b": 10 })

    // Dynamo Cleared at dc-a: P1 is gone there but stays at dc-b; 1002 still holds P2's half.
    await a1.clear()
    await converge("P1 after 1001 cleared", P1, { "dc-b": 10, "dc-a": 0 })
    await converge("P2 after 1001 cleared", P2, { "dc-a": 6, "dc-b": 0 })
    const answer = await overlap(global.url, P1)
    expect((answer.body as { results: ReadonlyArray<OverlapResult> }).results.map((r) => r.relay)).toEqual([
      "dc-b",
      "dc-a"
    ])

    // A cleared worker stores again.
    await b2.store(P3)
    await converge("P3 stored again", P3, { "dc-b": 8, "dc-a": 0 })
  })

  it("rejects malformed overlap requests and unknown models", async () => {
    const post = (body: string) => request(`${global.url}/v1/overlap`, { method: "POST", body })
    const valid = { namespace: NAMESPACE, model: MODEL, tokens: promptTokens(P1) }
    const byLocal = { namespace: NAMESPACE, model: MODEL, localBlockHashes: P1.map(String) }
    const expectRejected = async (body: string, status: number, reason: string, mentions?: string) => {
      const answer = await post(body)
      expect(answer.status, `${body} → ${answer.text}`).toBe(status)
      const error = answer.body as { reason: string; message: string }
      expect(error.reason).toBe(reason)
      expect(typeof error.message).toBe("string")
      if (mentions !== undefined) expect(error.message).toContain(mentions)
    }

    await expectRejected('{"namespace": "prod", "model": ', 400, "INVALID_REQUEST")
    await expectRejected("", 400, "INVALID_REQUEST")
    await expectRejected("[1, 2]", 400, "INVALID_REQUEST")
    await expectRejected(JSON.stringify({ ...valid, extra: true }), 400, "INVALID_REQUEST", "extra")
    await expectRejected(
      JSON.stringify({ namespace: NAMESPACE, model: MODEL }),
      400,
      "INVALID_REQUEST",
      "localBlockHashes"
    )
    // The engines' own block hashes are no query form (PROTOCOL §7): the answer names the two that are.
    const engineHashes = await post(
      JSON.stringify({ namespace: NAMESPACE, model: MODEL, blockHashes: P1.map(String) })
    )
    expect(engineHashes.status).toBe(400)
    expect((engineHashes.body as { message: string }).message).toMatch(/tokens.*localBlockHashes/)
    await expectRejected(JSON.stringify({ ...byLocal, localBlockHashes: "1" }), 400, "INVALID_REQUEST")
    for (const bad of [-1, 2 ** 32, 1.5, "7", null, [1]]) {
      await expectRejected(
        JSON.stringify({ ...valid, tokens: [1, bad] }),
        400,
        "INVALID_REQUEST",
        "tokens[1]"
      )
    }
    for (const bad of [
      "-1",
      "18446744073709551616",
      "99999999999999999999999",
      "abc",
      "",
      "1.5",
      "0x10",
      -1,
      1.5,
      2 ** 53 + 2,
      null,
      true,
      [1]
    ]) {
      await expectRejected(
        JSON.stringify({ ...byLocal, localBlockHashes: [P1[0]!.toString(), bad] }),
        400,
        "INVALID_REQUEST"
      )
    }
    await expectRejected(JSON.stringify({ ...valid, model: "mistral" }), 404, "MODEL_NOT_FOUND")
    await expectRejected(JSON.stringify({ ...valid, namespace: "staging" }), 404, "MODEL_NOT_FOUND")

    // The boundaries of u64 are accepted, as strings and as JSON numbers up to 2^53, and read as
    // the hashes they are: no DC holds a prompt starting with them, and after the first block of
    // a prompt dc-a holds (asked by its local hash) they end the match at one block.
    const boundaries = ["18446744073709551615", "0", 2 ** 53, 42]
    const answered = (answer: { body: unknown }) =>
      Object.fromEntries(
        (answer.body as { results: ReadonlyArray<OverlapResult> }).results.map((r) => [
          r.relay,
          [r.prefixDepth, r.matchedTokens]
        ])
      )
    const edges = await post(JSON.stringify({ ...byLocal, localBlockHashes: boundaries }))
    expect(edges.status, edges.text).toBe(200)
    expect(answered(edges)).toEqual({ "dc-a": [0, 0], "dc-b": [0, 0] })
    await a1.store(P5)
    await eventually("P5 at dc-a", () => depthsByLocal(global.url, P5), sameDepths({ "dc-a": 2, "dc-b": 0 }))
    const firstLocal = hashPairsToBigInts(localBlockHashes(promptTokens(P5), KV_BLOCK_SIZE))[0]!
    const afterFirst = await post(
      JSON.stringify({ ...byLocal, localBlockHashes: [firstLocal.toString(), ...boundaries] })
    )
    expect(afterFirst.status, afterFirst.text).toBe(200)
    expect(answered(afterFirst)).toEqual({ "dc-a": [1, KV_BLOCK_SIZE], "dc-b": [0, 0] })
    const wrongMethod = await request(`${global.url}/v1/overlap`)
    expect(wrongMethod.status).toBe(405)
    const health = await request(`${global.url}/healthz`)
    expect([health.status, health.text]).toEqual([200, "ok"])
  })

  it("exits 0 promptly on SIGTERM and closes its pool streams", async () => {
    const poolStreams = async (relay: KvrelayProcess) =>
      metricValue(await metrics(relay.url), "kv_dc_relay_subscribers", { stream: "pool" })
    expect(await poolStreams(relayA)).toBe(1)
    expect(await poolStreams(relayB)).toBe(1)
    const stopped = await stopKvrelay(global, "SIGTERM")
    expect(stopped).toMatchObject({ code: 0, signal: null })
    expect(stopped.ms).toBeLessThan(3_000)
    for (const relay of [relayA, relayB]) {
      await eventually(
        `${relay.label} pool streams closed`,
        () => poolStreams(relay),
        (n) => n === 0
      )
    }
  })
})
