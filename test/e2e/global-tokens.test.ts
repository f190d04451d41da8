/**
 * Token queries end to end (PROTOCOL §3.3, §7): two `kvrelay relay` processes and one `kvrelay
 * global`, fed by vLLM-format engines that name their blocks with hashes of their own (vLLM seeds
 * its block hash at random per process), so no two engines agree on a block's hash. A router
 * holds only the prompt's tokens; the answer must still be the exact depth per DC.
 */

import type { Scope } from "effect"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { chainSequenceHash } from "../../src/ckf/global.js"
import {
  closeScope,
  discoveryOf,
  eventually,
  KV_BLOCK_SIZE,
  type KvrelayProcess,
  lanesWhen,
  MODEL,
  makeScope,
  makeTempDir,
  memberBlocks,
  NAMESPACE,
  type OverlapResult,
  request,
  startGlobal,
  startRelay,
  stopAll,
  type TempDir,
  type TokenEngine,
  tokenEngine,
  warmUp,
  writeDiscovery
} from "./globalProcessesHarness.js"

/** A prompt of `blocks` full blocks: token ids no other prompt uses. */
const prompt = (id: number, blocks: number): Array<number> =>
  Array.from({ length: blocks * KV_BLOCK_SIZE }, (_, i) => 50_000 * id + i)

const blockTokens = (tokens: ReadonlyArray<number>, from: number, to: number) =>
  tokens.slice(from * KV_BLOCK_SIZE, to * KV_BLOCK_SIZE)

/** An engine's own name for block `index` of prompt `id`: a hash under the engine's seed. */
const engineHash = (seed: bigint, id: number, index: number, lora = 0): bigint =>
  chainSequenceHash(seed, BigInt(id * 1_000_000 + lora * 1000 + index), 0n)

const engineHashes = (seed: bigint, id: number, from: number, to: number, lora = 0) =>
  Array.from({ length: to - from }, (_, i) => engineHash(seed, id, from + i, lora))

let scope: Scope.CloseableScope | undefined
let dir: TempDir | undefined
let global: KvrelayProcess
let relayA: KvrelayProcess
let relayB: KvrelayProcess
let e1: TokenEngine
let e2: TokenEngine
let e3: TokenEngine
const SEED_1 = 0x1111n
const SEED_2 = 0x2222n
const SEED_3 = 0x3333n

beforeAll(async () => {
  scope = await makeScope()
  dir = makeTempDir()
  e1 = await tokenEngine(scope, "3001")
  e2 = await tokenEngine(scope, "3002")
  e3 = await tokenEngine(scope, "4001")
  const pathA = `${dir.path}/dc-a.json`
  const pathB = `${dir.path}/dc-b.json`
  // Every worker also serves the adapter tenant-a, so queries may name it (PROTOCOL §7 ◆3).
  writeDiscovery(pathA, await discoveryOf([e1, e2], ["tenant-a"]))
  writeDiscovery(pathB, await discoveryOf([e3], ["tenant-a"]))
  ;[relayA, relayB] = await Promise.all([startRelay("dc-a", pathA), startRelay("dc-b", pathB)])
  global = await startGlobal([
    ["dc-a", relayA.url],
    ["dc-b", relayB.url]
  ])
  await Promise.all([warmUp(relayA.url, [e1, e2]), warmUp(relayB.url, [e3])])
  await lanesWhen(
    global.url,
    "both lanes ready",
    (lanes) => lanes["dc-a"]?.ready === true && lanes["dc-b"]?.ready === true
  )
}, 60_000)

afterAll(async () => {
  await stopAll()
  if (scope !== undefined) await closeScope(scope)
  dir?.remove()
})

type Depths = Record<string, number>

const ask = async (body: Record<string, unknown>): Promise<ReadonlyArray<OverlapResult>> => {
  const answer = await request(`${global.url}/v1/overlap`, {
    method: "POST",
    body: JSON.stringify({ namespace: NAMESPACE, model: MODEL, ...body })
  })
  if (answer.status !== 200) throw new Error(`POST /v1/overlap answered ${answer.status}: ${answer.text}`)
  return (answer.body as { results: ReadonlyArray<OverlapResult> }).results
}

const depthsOf = (results: ReadonlyArray<OverlapResult>): Depths =>
  Object.fromEntries(results.map((r) => [r.relay, r.prefixDepth]))

/** Waits until a token query answers `expected` (depth per relay). */
const converge = (what: string, body: Record<string, unknown>, expected: Depths) =>
  eventually(
    `${what}: ${JSON.stringify(expected)}`,
    async () => depthsOf(await ask(body)),
    (actual) =>
      JSON.stringify(actual, Object.keys(actual).sort()) ===
      JSON.stringify(expected, Object.keys(expected).sort())
  )

describe("token queries across two relays of vLLM engines with their own block hashes", () => {
  const A = prompt(1, 8)

  it("answers the exact depth per DC from tokens alone; a partial last block does not count", async () => {
    await e1.storeTokens(engineHashes(SEED_1, 1, 0, 4), blockTokens(A, 0, 4))
    await e1.storeTokens(engineHashes(SEED_1, 1, 4, 8), blockTokens(A, 4, 8), {
      parent: engineHash(SEED_1, 1, 3)
    })
    await e3.storeTokens(engineHashes(SEED_3, 1, 0, 5), blockTokens(A, 0, 5))

    const query = { tokens: [...A, ...prompt(9, 1).slice(0, KV_BLOCK_SIZE - 1)] }
    await converge("prompt A", query, { "dc-a": 8, "dc-b": 5 })
    const results = await ask(query)
    expect(results.map((r) => [r.relay, r.prefixDepth, r.matchedTokens])).toEqual([
      ["dc-a", 8, 8 * KV_BLOCK_SIZE],
      ["dc-b", 5, 5 * KV_BLOCK_SIZE]
    ])
    // Fewer tokens than a block: nothing to match.
    expect(depthsOf(await ask({ tokens: A.slice(0, KV_BLOCK_SIZE - 1) }))).toEqual({ "dc-a": 0, "dc-b": 0 })
    // A prefix that diverges after three blocks matches three.
    const diverged = [...blockTokens(A, 0, 3), ...prompt(8, 2)]
    expect(depthsOf(await ask({ tokens: diverged }))).toEqual({ "dc-a": 3, "dc-b": 3 })
  })

  it("two engines with different hashes store one block: removing it from one keeps it, from both drops it", async () => {
    // e2 stores the same prompt under hashes of its own: the same canonical addresses.
    const before = await memberBlocks(relayA.url)
    await e2.storeTokens(engineHashes(SEED_2, 1, 0, 8), blockTokens(A, 0, 8))
    await eventually(
      "e2's blocks counted",
      () => memberBlocks(relayA.url),
      (blocks) => blocks["3002"] === (before["3002"] ?? 0) + 8
    )
    await e1.remove([engineHash(SEED_1, 1, 7)])
    await eventually(
      "e1's removal counted",
      () => memberBlocks(relayA.url),
      (blocks) => blocks["3001"] === (before["3001"] ?? 0) - 1
    )
    expect(depthsOf(await ask({ tokens: A }))).toMatchObject({ "dc-a": 8 })
    await e2.remove([engineHash(SEED_2, 1, 7)])
    await converge("block 7 gone from both", { tokens: A }, { "dc-a": 7, "dc-b": 5 })
  })

  it("keeps LoRA blocks apart from the base model's, as Dynamo salts them", async () => {
    const B = prompt(2, 6)
    await e1.storeTokens(engineHashes(SEED_1, 2, 0, 6, 1), B, { loraName: "tenant-a" })
    await e3.storeTokens(engineHashes(SEED_3, 2, 0, 3), blockTokens(B, 0, 3))
    await converge("B under tenant-a", { tokens: B, loraName: "tenant-a" }, { "dc-a": 6, "dc-b": 0 })
    await converge("B on the base model", { tokens: B }, { "dc-a": 0, "dc-b": 3 })
    // An adapter no relay has registered is no silent depth 0 (PROTOCOL §7 ◆3).
    const unknown = await request(`${global.url}/v1/overlap`, {
      method: "POST",
      body: JSON.stringify({ namespace: NAMESPACE, model: MODEL, tokens: B, loraName: "tenant-b" })
    })
    expect(unknown.status, unknown.text).toBe(404)
    expect(unknown.body).toMatchObject({ reason: "ADAPTER_NOT_FOUND" })
  })

  it("converges after a lost batch is replayed from the engine's replay endpoint", async () => {
    const C = prompt(3, 6)
    await e3.dropNext()
    await e3.storeTokens(engineHashes(SEED_3, 3, 0, 4), blockTokens(C, 0, 4))
    await e3.storeTokens(engineHashes(SEED_3, 3, 4, 6), blockTokens(C, 4, 6), {
      parent: engineHash(SEED_3, 3, 3)
    })
    await converge("C after the replay", { tokens: C }, { "dc-a": 0, "dc-b": 6 })
    const stats = await request(`${relayB.url}/v1/stats`)
    const ingest = (stats.body as { endpoints: ReadonlyArray<{ ingest: { gaps: number } }> }).endpoints[0]!
      .ingest
    expect(ingest.gaps).toBeGreaterThanOrEqual(1)
  })
})
