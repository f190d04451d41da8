/**
 * Golden test of `POST /query_by_hash` and `POST /query` (PROTOCOL §5.1 ◆3) against the answer
 * Dynamo's standalone KV indexer gives for the same state.
 *
 * The expected document is built by a line-by-line transcription of Dynamo's code, fed with the
 * tiered match details its indexer finds for the scenario below (written out by hand from the
 * scenario, following its tier walk: the host walk extends from where the device match ended,
 * then the disk walk from where the host walk ended):
 * - `build_score_response` in `lib/kv-router/src/services/indexer/server.rs`, ai-dynamo/dynamo
 *   commit 47022ee4c6f1a997794ed038af8582a5e5df347e;
 * - `build_mooncake_overlap_summaries` in `lib/kv-router/src/services/overlap.rs`, commit
 *   5ea3d18eaab82a2b7d2e8ffae5814aaa05ee67df (called with no expected workers, as
 *   `build_score_response` calls it).
 * Dynamo's maps are hash maps; both documents are compared as parsed JSON objects (key order
 * does not matter), field by field.
 */

import { describe, expect, it } from "@effect/vitest"
import { Effect, Logger, LogLevel, type Scope } from "effect"
import { compareMembers, type StorageTier } from "../../../src/ckf/events.js"
import { localBlockHashes } from "../../../src/ckf/tokens.js"
import { hashPairsToBigInts } from "../../../src/ckf/u64.js"
import { removedEvent, storedEvent } from "../../../src/protocol/Events.js"
import * as RelayHttpServer from "../../../src/relay/http/RelayHttpServer.js"
import { postJson } from "../../http/httpClient.js"
import { makeTestRelay } from "./relayFixture.js"

const live = <A, E>(name: string, body: () => Effect.Effect<A, E, Scope.Scope>, timeout?: number) =>
  it.scopedLive(name, () => body().pipe(Logger.withMinimumLogLevel(LogLevel.Warning)), timeout)

const BLOCK = 64

// ---------------------------------------------------------------------------------------------
// Dynamo's code, transcribed

type WorkerWithDpRank = { readonly worker_id: number; readonly dp_rank: number }
const key = (w: WorkerWithDpRank) => `${w.worker_id}/${w.dp_rank}`

/** `TieredMatchDetails`: the device overlap (scores, frequencies) and each lower tier's hits. */
interface TieredMatchDetails {
  readonly device: { readonly scores: Map<string, number>; readonly frequencies: ReadonlyArray<number> }
  readonly lowerTier: Partial<Record<"HostPinned" | "Disk" | "External", Map<string, number>>>
  readonly workers: Map<string, WorkerWithDpRank>
}

/** `build_mooncake_overlap_summaries(tiered, block_size, [])` (overlap.rs). */
const buildMooncakeOverlapSummaries = (tiered: TieredMatchDetails, blockSize: number) => {
  const host = tiered.lowerTier.HostPinned
  const disk = tiered.lowerTier.Disk
  const external = tiered.lowerTier.External
  const allWorkers = new Set<string>(tiered.device.scores.keys())
  for (const matches of Object.values(tiered.lowerTier)) for (const k of matches!.keys()) allWorkers.add(k)
  const extension = (tier: Map<string, number> | undefined, worker: string) => tier?.get(worker) ?? 0
  const summaries: Record<
    string,
    { longest_matched: number; gpu: number; dp: Record<string, number>; cpu: number; disk: number }
  > = {}
  for (const worker of allWorkers) {
    const w = tiered.workers.get(worker)!
    const gpuBlocks = tiered.device.scores.get(worker) ?? 0
    const cpuBlocks = gpuBlocks + extension(host, worker)
    const diskBlocks = cpuBlocks + extension(disk, worker) + extension(external, worker)
    summaries[String(w.worker_id)] ??= { longest_matched: 0, gpu: 0, dp: {}, cpu: 0, disk: 0 }
    const summary = summaries[String(w.worker_id)]!
    summary.dp[String(w.dp_rank)] = gpuBlocks * blockSize
    summary.gpu = Math.max(summary.gpu, gpuBlocks * blockSize)
    summary.cpu = Math.max(summary.cpu, cpuBlocks * blockSize)
    summary.disk = Math.max(summary.disk, diskBlocks * blockSize)
  }
  for (const summary of Object.values(summaries))
    summary.longest_matched = Math.max(summary.gpu, summary.cpu, summary.disk)
  return summaries
}

/** `build_score_response(tiered, block_size)` (server.rs). */
const buildScoreResponse = (tiered: TieredMatchDetails, blockSize: number) => {
  const scores: Record<string, Record<string, number>> = {}
  for (const [worker, v] of tiered.device.scores) {
    const w = tiered.workers.get(worker)!
    scores[String(w.worker_id)] ??= {}
    const ranks = scores[String(w.worker_id)]!
    ranks[String(w.dp_rank)] = v * blockSize
  }
  return {
    scores,
    frequencies: [...tiered.device.frequencies],
    instances: buildMooncakeOverlapSummaries(tiered, blockSize)
  }
}

// ---------------------------------------------------------------------------------------------
// The scenario

/** Five blocks of one prompt: their local hashes. */
const tokens = Array.from({ length: 5 * BLOCK }, (_, i) => 7_000 + i)
const local = hashPairsToBigInts(localBlockHashes(tokens, BLOCK))

/** External hashes: each member names the prompt's blocks with its own seed. */
const ext = (worker: number, rank: number, block: number): bigint =>
  (BigInt(worker) << 40n) + (BigInt(rank) << 32n) + BigInt(block + 1)

/** A store of blocks `from..to-1` of the prompt by (worker, rank) on `tier`, chained to its previous block. */
const store = (worker: number, rank: number, id: number, from: number, to: number, tier: StorageTier) =>
  storedEvent(
    String(worker),
    rank,
    id,
    Array.from({ length: to - from }, (_, i) => ext(worker, rank, from + i)),
    {
      tokensHashes: local.slice(from, to),
      ...(from === 0 ? {} : { parentHash: ext(worker, rank, from - 1) }),
      storageTier: tier
    }
  )

/**
 * Worker 7 rank 0: blocks 0-1 on the device, block 2 on the host, blocks 3-4 on disk.
 * Worker 7 rank 1: block 0 on the device, block 1 on disk.
 * Worker 9 rank 0: blocks 0-1 on the host only (its device copies were evicted).
 * Worker 11 rank 0: blocks 0-2 on the device, block 4 on the host (block 3 nowhere).
 * Worker 13 rank 0: blocks 0 and 2 on the device, block 1 on the host only: the tiers
 * interleave, so Dynamo's walk (host from block 1, then stop at block 2, which is not on the
 * host) and the cumulative depths of `/v1/query` (block 2 is on the device) differ.
 */
const EVENTS = [
  store(7, 0, 1, 0, 5, "device"),
  store(7, 0, 2, 2, 3, "host_pinned"),
  store(7, 0, 3, 3, 5, "disk"),
  removedEvent("7", 0, 4, [ext(7, 0, 2), ext(7, 0, 3), ext(7, 0, 4)]),
  store(7, 1, 1, 0, 2, "device"),
  store(7, 1, 2, 1, 2, "disk"),
  removedEvent("7", 1, 3, [ext(7, 1, 1)]),
  store(9, 0, 1, 0, 2, "device"),
  store(9, 0, 2, 0, 2, "host_pinned"),
  removedEvent("9", 0, 3, [ext(9, 0, 0), ext(9, 0, 1)]),
  store(11, 0, 1, 0, 5, "device"),
  store(11, 0, 2, 4, 5, "host_pinned"),
  removedEvent("11", 0, 3, [ext(11, 0, 3), ext(11, 0, 4)]),
  store(13, 0, 1, 0, 3, "device"),
  store(13, 0, 2, 1, 2, "host_pinned"),
  removedEvent("13", 0, 3, [ext(13, 0, 1)])
]

const workers = new Map<string, WorkerWithDpRank>(
  [
    { worker_id: 7, dp_rank: 0 },
    { worker_id: 7, dp_rank: 1 },
    { worker_id: 9, dp_rank: 0 },
    { worker_id: 11, dp_rank: 0 },
    { worker_id: 13, dp_rank: 0 }
  ].map((w) => [key(w), w])
)

/**
 * What Dynamo's indexer finds for the five blocks: the device walk's scores (members with at
 * least one block) and per-block frequencies; the host walk from each member's device end (7/0:
 * block 2, one; 9/0: blocks 0-1, two; 11/0: block 3 is not on its host, none; 13/0: block 1, one)
 * and the disk walk from there (7/0: blocks 3-4, two; 7/1: block 1, one). A block's frequency is
 * the number of members holding it on the device (its tree node's workers): block 2 counts 13/0.
 */
const TIERED: TieredMatchDetails = {
  device: {
    scores: new Map([
      ["7/0", 2],
      ["7/1", 1],
      ["11/0", 3],
      ["13/0", 1]
    ]),
    frequencies: [4, 2, 2]
  },
  lowerTier: {
    HostPinned: new Map([
      ["7/0", 1],
      ["9/0", 2],
      ["13/0", 1]
    ]),
    Disk: new Map([
      ["7/0", 2],
      ["7/1", 1]
    ])
  },
  workers
}

describe("/query and /query_by_hash against Dynamo's build_score_response", () => {
  live("answer the document Dynamo's indexer builds for the same tiered matches, field by field", () =>
    Effect.gen(function* () {
      const test = yield* makeTestRelay({ expectedUniqueBlocks: 256 })
      const attachment = yield* test.attach(1, "prod.backend.generate")
      for (const event of EVENTS) yield* attachment.actor.admitEvent(0, event)
      yield* attachment.actor.flush
      const server = yield* RelayHttpServer.serve(test.relay, { host: "127.0.0.1", port: 0 })

      const expected = buildScoreResponse(TIERED, BLOCK)
      const byHash = yield* postJson(
        server.url,
        "/query_by_hash",
        `{"model_name":"llama","block_hashes":[${local.map((h) => BigInt.asIntN(64, h).toString()).join(",")}]}`
      )
      expect(byHash.status).toBe(200)
      const got = byHash.json as typeof expected
      expect(Object.keys(got).sort()).toEqual(["frequencies", "instances", "scores"])
      expect(got.scores).toEqual(expected.scores)
      expect(got.frequencies).toEqual(expected.frequencies)
      expect(Object.keys(got.instances).sort()).toEqual(Object.keys(expected.instances).sort())
      for (const [worker, summary] of Object.entries(expected.instances)) {
        const ours = got.instances[worker]!
        for (const field of ["longest_matched", "gpu", "cpu", "disk", "dp"] as const)
          expect({ worker, field, value: ours[field] }).toEqual({ worker, field, value: summary[field] })
      }
      // The written-out values, so that a transcription error cannot hide in both.
      expect(got).toEqual({
        scores: { "7": { "0": 128, "1": 64 }, "11": { "0": 192 }, "13": { "0": 64 } },
        frequencies: [4, 2, 2],
        instances: {
          "7": { longest_matched: 320, gpu: 128, dp: { "0": 128, "1": 64 }, cpu: 192, disk: 320 },
          "9": { longest_matched: 128, gpu: 0, dp: { "0": 0 }, cpu: 128, disk: 128 },
          "11": { longest_matched: 192, gpu: 192, dp: { "0": 192 }, cpu: 192, disk: 192 },
          "13": { longest_matched: 128, gpu: 64, dp: { "0": 64 }, cpu: 128, disk: 128 }
        }
      })
      // By tokens: the same document.
      const byTokens = yield* postJson(server.url, "/query", { token_ids: tokens, model_name: "llama" })
      expect(byTokens.json).toEqual(expected)
      // A query string takes the request off the fast path to the router: the same bytes.
      for (const [path, body] of [
        ["/query", { token_ids: tokens, model_name: "llama" }],
        ["/v1/query", { namespace: "prod", model: "llama", tokens }],
        ["/v1/query", { namespace: "prod", model: "nope", tokens }],
        ["/query", { token_ids: tokens, model_name: "nope" }]
      ] as const) {
        const fast = yield* postJson(server.url, path, body)
        const routed = yield* postJson(server.url, `${path}?via=router`, body)
        expect({ path, status: routed.status, text: routed.text }).toEqual({
          path,
          status: fast.status,
          text: fast.text
        })
      }

      // /v1/query's cumulative depths for the same state (§5.1), where tiers interleave.
      const v1 = yield* postJson(server.url, "/v1/query", {
        namespace: "prod",
        model: "llama",
        localBlockHashes: local.map(String)
      })
      expect(v1.status).toBe(200)
      const pool = (
        v1.json as { pools: Array<{ workers: unknown; frequencies: unknown; queryBlocks: number }> }
      ).pools[0]!
      expect(pool.queryBlocks).toBe(5)
      expect(pool.frequencies).toEqual([4, 2, 2])
      expect(pool.workers).toEqual([
        { workerId: "11", dpRank: 0, device: 3, host: 3, disk: 3 },
        { workerId: "7", dpRank: 0, device: 2, host: 3, disk: 5 },
        { workerId: "13", dpRank: 0, device: 1, host: 3, disk: 3 },
        { workerId: "7", dpRank: 1, device: 1, host: 1, disk: 2 },
        { workerId: "9", dpRank: 0, device: 0, host: 2, disk: 2 }
      ])
    })
  )

  live("writes worker ids beyond ASCII byte for byte on both paths", () =>
    Effect.gen(function* () {
      const test = yield* makeTestRelay({ expectedUniqueBlocks: 256 })
      const attachment = yield* test.attach(1, "prod.backend.generate")
      // Worker ids come from discovery as strings: any UTF-8 text, quotes included.
      const ids = ["wörker-β", 'w"7', "w\\8", "ワーカー"]
      for (const [k, id] of ids.entries())
        yield* attachment.actor.admitEvent(
          0,
          storedEvent(id, 0, 1, [ext(k + 1, 0, 0), ext(k + 1, 0, 1)], {
            tokensHashes: local.slice(0, 2)
          })
        )
      yield* attachment.actor.flush
      const server = yield* RelayHttpServer.serve(test.relay, { host: "127.0.0.1", port: 0 })
      const body = { namespace: "prod", model: "llama", tokens }
      const fast = yield* postJson(server.url, "/v1/query", body)
      const routed = yield* postJson(server.url, "/v1/query?via=router", body)
      expect(fast.status).toBe(200)
      expect(routed.text).toBe(fast.text)
      const pool = (fast.json as { pools: Array<{ workers: Array<{ workerId: string; device: number }> }> })
        .pools[0]!
      expect(pool.workers.map((w) => [w.workerId, w.device])).toEqual(
        [...ids]
          .sort((a, b) => compareMembers({ workerId: a, dpRank: 0 }, { workerId: b, dpRank: 0 }))
          .map((id) => [id, 2])
      )
    })
  )
})
