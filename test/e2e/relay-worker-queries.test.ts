/**
 * End to end (PROTOCOL §5.1 ◆3): worker-level queries of a `kvrelay relay` process over real
 * ZeroMQ and HTTP. Simulated vLLM engines (the current map wire format, written by the msgspec
 * layouts of `test/transport/msgspec.ts`) with their own block-hash seeds and data-parallel ranks
 * store one prompt; one of them offloads its blocks to the CPU (vLLM's offloading connector: no
 * tokens, no parent, `medium: "CPU"`) and then evicts two of them from the GPU. The relay starts
 * after those events, so it reads them through replay (a full history is a rank replacement), and
 * later events arrive live.
 *
 * Every expected answer is written out here from the scenario, and the local hashes of
 * `/query_by_hash` are computed with `kvrelay/client`.
 */

import { Effect, Exit, Scope } from "effect"
import { afterEach, describe, expect, it } from "vitest"
import { localBlockHashes, RelayQueryClient } from "../../src/client/index.js"
import { type EngineZmqPublisher, makeEngineZmqPublisher } from "../../src/simulate/EngineZmqPublisher.js"
import { type PyValue, vllmBatch, vllmRemoved, vllmStored } from "../transport/msgspec.js"
import {
  cardRecord,
  cleanup,
  DiscoveryFile,
  EngineWorker,
  endpointText,
  eventually,
  Relay
} from "./relayProcessHarness.js"

const SERVING = { namespace: "prod", component: "vllm", endpoint: "generate" }
const ENDPOINT = endpointText(SERVING)
const BLOCK = 16

let scope = Effect.runSync(Scope.make())
afterEach(async () => {
  await cleanup()
  await Effect.runPromise(Scope.close(scope, Exit.void))
  scope = Effect.runSync(Scope.make())
})

const run = <A, E>(effect: Effect.Effect<A, E, Scope.Scope>): Promise<A> =>
  Effect.runPromise(Scope.extend(effect, scope))

/** A simulated vLLM rank that names its blocks with its own hash seed (its external hashes). */
class VllmRank {
  private nextHash: bigint
  constructor(
    readonly publisher: EngineZmqPublisher,
    seed: bigint
  ) {
    this.nextHash = seed
  }

  hashes(n: number): Array<bigint> {
    return Array.from({ length: n }, () => {
      this.nextHash += 1n
      return this.nextHash
    })
  }

  async publish(fields: Parameters<typeof vllmBatch>[0]): Promise<void> {
    const payload = vllmBatch(fields, { version: "current", dpRank: BigInt(this.publisher.dpRank) })
    await run(this.publisher.publishPayload(payload))
  }

  /** Stores `tokens` as full GPU blocks named `external`, under `parent`. */
  store(
    external: ReadonlyArray<bigint>,
    tokens: ReadonlyArray<number>,
    parent?: bigint,
    extra: Readonly<Record<string, PyValue>> = {}
  ): Promise<void> {
    return this.publish([
      vllmStored(external, tokens, BLOCK, {
        ...extra,
        ...(parent === undefined ? {} : { parent_block_hash: parent })
      })
    ])
  }

  source() {
    return new EngineWorker(this.publisher).sourceRecord(ENDPOINT)
  }
}

const makeRank = async (workerId: string, dpRank: number, seed: bigint): Promise<VllmRank> =>
  new VllmRank(
    await run(makeEngineZmqPublisher({ workerId, dpRank, format: "vllm", blockSize: BLOCK })),
    seed
  )

/** Tokens of `blocks` full blocks starting at `from` (distinct per prompt), plus `partial` more. */
const tokensOf = (from: number, blocks: number, partial = 0): Array<number> =>
  Array.from({ length: blocks * BLOCK + partial }, (_, i) => from + i)

interface WorkerJson {
  readonly workerId: string
  readonly dpRank: number
  readonly device: number
  readonly host: number
  readonly disk: number
}
interface PoolJson {
  readonly servingEndpoint: string
  readonly kvBlockSize: number
  readonly queryBlocks: number
  readonly frequencies: ReadonlyArray<number>
  readonly workers: ReadonlyArray<WorkerJson>
}

const v1Query = async (relay: Relay, body: Record<string, unknown>) => {
  const answer = await relay.post("/v1/query", JSON.stringify(body))
  if (answer.status !== 200) throw new Error(`/v1/query ${answer.status}: ${answer.text}`)
  return (answer.json as { pools: ReadonlyArray<PoolJson> }).pools
}

/** Polls `/v1/query` until the one pool's answer equals `expected` (ingest is asynchronous). */
const awaitPool = async (
  relay: Relay,
  body: Record<string, unknown>,
  expected: Omit<PoolJson, "servingEndpoint" | "kvBlockSize">
) => {
  let last: unknown
  try {
    return await eventually(
      `/v1/query ${JSON.stringify(body).slice(0, 80)} to answer ${JSON.stringify(expected)}`,
      async () => {
        const pools = await v1Query(relay, body)
        last = pools
        const pool = pools[0]
        return (
          pools.length === 1 &&
          pool !== undefined &&
          JSON.stringify({
            queryBlocks: pool.queryBlocks,
            frequencies: pool.frequencies,
            workers: pool.workers
          }) === JSON.stringify(expected) &&
          pool
        )
      },
      30_000
    )
  } catch (error) {
    throw new Error(`${(error as Error).message}; last answer ${JSON.stringify(last)}`)
  }
}

describe("worker-level queries of a relay process (PROTOCOL §5.1 ◆3)", () => {
  it("answers per worker, rank and tier through /v1/query, /query and /query_by_hash; 404s; cache salts separate prompts", async () => {
    // Worker 8001 has two data-parallel ranks, worker 8002 one; every rank its own hash seed.
    const a0 = await makeRank("8001", 0, 0x1000_0000_0000n)
    const a1 = await makeRank("8001", 1, 0x2000_0000_0000n)
    const b0 = await makeRank("8002", 0, 0x3000_0000_0000n)
    const ranks = [a0, a1, b0]

    // The prompt: 4 full blocks.
    const prompt = tokensOf(1_000, 4)
    const a0Hashes = a0.hashes(4)
    const a1Hashes = a1.hashes(2)
    const b0Hashes = b0.hashes(3)
    await a0.store(a0Hashes, prompt)
    await a1.store(a1Hashes, prompt.slice(0, 2 * BLOCK))
    await b0.store(b0Hashes, prompt.slice(0, 3 * BLOCK))
    // 8002 offloads its three blocks to the CPU, then evicts the last two from the GPU.
    await b0.publish([vllmStored(b0Hashes, [], BLOCK, { medium: "CPU" })])
    await b0.publish([vllmRemoved(b0Hashes.slice(1), { medium: "GPU" })])

    const file = new DiscoveryFile()
    file.write({
      version: 1,
      cards: [
        cardRecord(SERVING, "8001", { kvCacheBlockSize: BLOCK, dataParallelSize: 2 }),
        cardRecord(SERVING, "8002", { kvCacheBlockSize: BLOCK })
      ],
      sources: await Promise.all(ranks.map((r) => r.source()))
    })
    const relay = await Relay.start({ discovery: file })
    await relay.onlyPool()
    // One live batch per rank, of another prompt: the relay then knows where each rank stands.
    for (const [i, rank] of ranks.entries()) await rank.store(rank.hashes(1), tokensOf(50_000 + 1_000 * i, 1))
    // The per-member block counts asserted below include these live blocks.
    for (const [i, rank] of ranks.entries()) {
      const { workerId, dpRank } = rank.publisher
      await eventually(
        `${workerId}/${dpRank}'s live block read`,
        async () => {
          const pools = await v1Query(relay, {
            namespace: "prod",
            model: "llama",
            tokens: tokensOf(50_000 + 1_000 * i, 1)
          })
          return pools[0]?.workers.some(
            (w) => w.workerId === workerId && w.dpRank === dpRank && w.device === 1
          )
        },
        30_000
      )
    }

    // A partial last block never counts: 4 full blocks asked.
    const queried = [...prompt, 7, 7, 7]
    const expected = {
      queryBlocks: 4,
      frequencies: [3, 2, 1, 1],
      workers: [
        { workerId: "8001", dpRank: 0, device: 4, host: 4, disk: 4 },
        { workerId: "8001", dpRank: 1, device: 2, host: 2, disk: 2 },
        { workerId: "8002", dpRank: 0, device: 1, host: 3, disk: 3 }
      ]
    }
    const pool = await awaitPool(relay, { namespace: "prod", model: "llama", tokens: queried }, expected)
    expect(pool.servingEndpoint).toBe(ENDPOINT)
    expect(pool.kvBlockSize).toBe(BLOCK)
    // The alias, and the serving endpoint in place of namespace and model, answer alike.
    expect((await v1Query(relay, { namespace: "prod", model: "chat", tokens: queried }))[0]).toEqual(pool)
    expect((await v1Query(relay, { servingEndpoint: ENDPOINT, tokens: queried }))[0]).toEqual(pool)
    // By local block hashes, as kvrelay/client computes them.
    const local = localBlockHashes(queried, BLOCK)
    expect(
      (await v1Query(relay, { namespace: "prod", model: "llama", localBlockHashes: local.map(String) }))[0]
    ).toEqual(pool)
    // A rank that holds nothing of a prompt is listed with zero depths.
    const other = await v1Query(relay, { namespace: "prod", model: "llama", tokens: tokensOf(900_000, 2) })
    expect(other[0]!.workers).toEqual([
      { workerId: "8001", dpRank: 0, device: 0, host: 0, disk: 0 },
      { workerId: "8001", dpRank: 1, device: 0, host: 0, disk: 0 },
      { workerId: "8002", dpRank: 0, device: 0, host: 0, disk: 0 }
    ])
    expect(other[0]!.frequencies).toEqual([])

    // Dynamo's standalone indexer shape, in tokens.
    const dynamo = {
      scores: { "8001": { "0": 64, "1": 32 }, "8002": { "0": 16 } },
      frequencies: [3, 2, 1, 1],
      instances: {
        "8001": { longest_matched: 64, gpu: 64, dp: { "0": 64, "1": 32 }, cpu: 64, disk: 64 },
        "8002": { longest_matched: 48, gpu: 16, dp: { "0": 16 }, cpu: 48, disk: 48 }
      }
    }
    const byTokens = await relay.post("/query", JSON.stringify({ token_ids: queried, model_name: "llama" }))
    expect(byTokens.status).toBe(200)
    expect(byTokens.json).toEqual(dynamo)
    const withGroup = await relay.post(
      "/query",
      JSON.stringify({ token_ids: queried, model_name: "chat", routing_group: "prod", tenant_id: "default" })
    )
    expect(withGroup.json).toEqual(dynamo)
    // block_hashes as i64 JSON numbers, written as text so that no digit is lost.
    const i64Text = `[${local.map((h) => BigInt.asIntN(64, h).toString()).join(",")}]`
    expect(local.some((h) => h >= 1n << 63n) || local.some((h) => h > 2n ** 53n)).toBe(true)
    const byHash = await relay.post("/query_by_hash", `{"model_name":"llama","block_hashes":${i64Text}}`)
    expect(byHash.status).toBe(200)
    expect(byHash.json).toEqual(dynamo)
    // The same hashes written unsigned (as kvrelay/client returns them) are the same bit patterns.
    const u64Text = `[${local.map(String).join(",")}]`
    const byU64 = await relay.post("/query_by_hash", `{"model_name":"llama","block_hashes":${u64Text}}`)
    expect(byU64.json).toEqual(dynamo)
    const outOfRange = await relay.post(
      "/query_by_hash",
      `{"model_name":"llama","block_hashes":[18446744073709551616]}`
    )
    expect(outOfRange.status).toBe(400)
    expect((outOfRange.json as { error: string }).error).toContain("block_hashes[0]")

    // GET /workers: every rank's event source.
    const workers =
      await relay.json<Array<{ instance_id: number; endpoints: Record<string, string> }>>("/workers")
    expect(workers).toEqual([
      { instance_id: 8001, endpoints: { "0": a0.publisher.endpoint, "1": a1.publisher.endpoint } },
      { instance_id: 8002, endpoints: { "0": b0.publisher.endpoint } }
    ])

    // The same answers through kvrelay/client's HTTP client.
    const client = new RelayQueryClient(relay.url)
    expect((await client.query({ namespace: "prod", model: "llama", tokens: queried })).pools[0]).toEqual(
      pool
    )
    expect((await client.query({ servingEndpoint: ENDPOINT, localBlockHashes: local })).pools[0]).toEqual(
      pool
    )
    expect(await client.dynamoQuery({ modelName: "llama", tokenIds: queried })).toEqual(dynamo)
    expect(await client.dynamoQueryByHash({ modelName: "llama", blockHashes: local })).toEqual(dynamo)
    expect((await client.workers({ modelName: "chat" })).map((w) => w.instance_id)).toEqual([8001n, 8002n])
    await expect(client.query({ namespace: "prod", model: "nope", tokens: [1] })).rejects.toMatchObject({
      status: 404,
      reason: "MODEL_NOT_FOUND"
    })

    // Errors: an unknown model is 404 on both shapes; a bad body 400 naming the field.
    const unknown = await relay.post(
      "/v1/query",
      JSON.stringify({ namespace: "prod", model: "nope", tokens: [1] })
    )
    expect(unknown.status).toBe(404)
    expect((unknown.json as { reason: string }).reason).toBe("MODEL_NOT_FOUND")
    const wrongNamespace = await relay.post(
      "/v1/query",
      JSON.stringify({ namespace: "dev", model: "llama", tokens: [1] })
    )
    expect(wrongNamespace.status).toBe(404)
    const noAdapter = await relay.post(
      "/v1/query",
      JSON.stringify({ namespace: "prod", model: "llama", tokens: [1], loraName: "tenant-a" })
    )
    expect(noAdapter.status).toBe(404)
    expect((noAdapter.json as { reason: string }).reason).toBe("ADAPTER_NOT_FOUND")
    const unknownDynamo = await relay.post("/query", JSON.stringify({ token_ids: [1], model_name: "nope" }))
    expect(unknownDynamo.status).toBe(404)
    expect(typeof (unknownDynamo.json as { error: string }).error).toBe("string")
    const unknownGroup = await relay.post(
      "/query_by_hash",
      JSON.stringify({ block_hashes: [1], model_name: "llama", routing_group: "dev" })
    )
    expect(unknownGroup.status).toBe(404)
    const bad = await relay.post(
      "/v1/query",
      JSON.stringify({ namespace: "prod", model: "llama", tokens: [-1] })
    )
    expect(bad.status).toBe(400)
    expect((bad.json as { message: string }).message).toContain("tokens[0]")
    const extra = await relay.post(
      "/v1/query",
      JSON.stringify({ namespace: "prod", model: "llama", tokens: [1], x: 1 })
    )
    expect(extra.status).toBe(400)
    expect((extra.json as { message: string }).message).toContain('"x"')
    const salted = await relay.post(
      "/query_by_hash",
      JSON.stringify({ block_hashes: [1], model_name: "llama", cache_salt: "s" })
    )
    expect(salted.status).toBe(400)
    expect((salted.json as { error: string }).error).toContain("cache_salt")

    // /v1/stats: device blocks and the host tier per member.
    const stats = await relay.endpointStats(ENDPOINT)
    const members = stats as unknown as {
      aggregation: {
        members: Array<{
          workerId: string
          dpRank: number
          blocks: number
          hostBlocks: number
          diskBlocks: number
        }>
      }
      tiers: { hostEdges: number; diskEdges: number; bytesPerEdge: number }
    }
    expect(members.aggregation.members.find((m) => m.workerId === "8002")).toEqual({
      workerId: "8002",
      dpRank: 0,
      blocks: 2,
      hostBlocks: 3,
      diskBlocks: 0
    })
    expect(members.tiers.hostEdges).toBe(3)
    expect(members.tiers.bytesPerEdge).toBeGreaterThan(0)

    // Cache salts: 8001/0 stores a salted prompt live (vLLM's tagged extra_keys on the first
    // block), then a child batch that names no salt and inherits its parent's.
    const saltedPrompt = tokensOf(200_000, 3)
    const [s1, s2, s3] = a0.hashes(3)
    await a0.store([s1!, s2!], saltedPrompt.slice(0, 2 * BLOCK), undefined, {
      extra_keys: [["dynamo-cache-salt:tenant-1"], null]
    })
    await a0.store([s3!], saltedPrompt.slice(2 * BLOCK), s2)
    const saltedWorkers = (device: number) => ({
      queryBlocks: 3,
      frequencies: Array.from({ length: device }, () => 1),
      workers: [
        { workerId: "8001", dpRank: 0, device, host: device, disk: device },
        { workerId: "8001", dpRank: 1, device: 0, host: 0, disk: 0 },
        { workerId: "8002", dpRank: 0, device: 0, host: 0, disk: 0 }
      ]
    })
    await awaitPool(
      relay,
      { namespace: "prod", model: "llama", tokens: saltedPrompt, cacheSalt: "tenant-1" },
      saltedWorkers(3)
    )
    await awaitPool(relay, { namespace: "prod", model: "llama", tokens: saltedPrompt }, saltedWorkers(0))
    await awaitPool(
      relay,
      { namespace: "prod", model: "llama", tokens: saltedPrompt, cacheSalt: "tenant-2" },
      saltedWorkers(0)
    )
    const saltedDynamo = await relay.post(
      "/query",
      JSON.stringify({ token_ids: saltedPrompt, model_name: "llama", cache_salt: "tenant-1" })
    )
    expect((saltedDynamo.json as { scores: unknown }).scores).toEqual({ "8001": { "0": 48 } })
    const saltedHashes = localBlockHashes(saltedPrompt, BLOCK, { cacheSalt: "tenant-1" })
    const saltedByHash = await relay.post(
      "/query_by_hash",
      `{"model_name":"llama","block_hashes":[${saltedHashes.map((h) => BigInt.asIntN(64, h).toString()).join(",")}]}`
    )
    expect((saltedByHash.json as { scores: unknown }).scores).toEqual({ "8001": { "0": 48 } })

    // The CPU copies go too: 8002 is back to its one device block.
    await b0.publish([vllmRemoved(b0Hashes, { medium: "CPU" })])
    await awaitPool(
      relay,
      { namespace: "prod", model: "llama", tokens: queried },
      {
        ...expected,
        workers: [
          expected.workers[0]!,
          expected.workers[1]!,
          { workerId: "8002", dpRank: 0, device: 1, host: 1, disk: 1 }
        ]
      }
    )
  }, 120_000)
})
