/**
 * The worker query's answers (PROTOCOL §5.1 ◆3): `/v1/query`'s `workers` and the answer of
 * Dynamo's standalone KV indexer, golden documents derived from Dynamo's source for a fixed
 * scenario.
 */

import fc from "fast-check"
import { describe, expect, it } from "vitest"
import { CanonicalCkfState } from "../../src/ckf/canonical.js"
import { ckfConfig } from "../../src/ckf/config.js"
import type { CkfEvent, StorageTier } from "../../src/ckf/events.js"
import { localBlockHashes, sequenceHashes } from "../../src/ckf/tokens.js"
import { hashPairs, hashPairsToBigInts } from "../../src/ckf/u64.js"
import {
  dynamoScoreResponse,
  dynamoWorkersJson,
  poolWorkersAnswer,
  type WorkerQueryResult
} from "../../src/ckf/workerQuery.js"
import { JsonBytes, writePoolWorkers } from "../../src/relay/http/internal/WorkerQueryJson.js"

const BLOCK = 16
const tokens = Array.from({ length: 6 * BLOCK + 5 }, (_, i) => 1000 + i)
const local = hashPairsToBigInts(localBlockHashes(tokens, BLOCK))
/** An engine's external hash of block i, per worker (engines hash with their own seeds). */
const ext = (worker: number, i: number): bigint => BigInt(worker) * 1_000_000n + BigInt(i) + 1n

const stored = (
  worker: number,
  dpRank: number,
  tier: StorageTier,
  blocks: ReadonlyArray<number>,
  parent?: number
): CkfEvent => ({
  workerId: String(worker),
  dpRank,
  storageTier: tier,
  data: {
    _tag: "Stored",
    blockHashes: hashPairs(blocks.map((i) => ext(worker, i))),
    tokensHashes: hashPairs(blocks.map((i) => local[i]!)),
    parentHash: parent === undefined ? undefined : hashPairs([ext(worker, parent)]),
    skipUnanchored: true
  }
})
/** A host or disk copy as vLLM's offloading connector stores it: external hashes only. */
const copied = (
  worker: number,
  dpRank: number,
  tier: StorageTier,
  blocks: ReadonlyArray<number>
): CkfEvent => ({
  workerId: String(worker),
  dpRank,
  storageTier: tier,
  data: {
    _tag: "Stored",
    blockHashes: hashPairs(blocks.map((i) => ext(worker, i))),
    resolveThroughLineage: true
  }
})
const removed = (
  worker: number,
  dpRank: number,
  tier: StorageTier,
  blocks: ReadonlyArray<number>
): CkfEvent => ({
  workerId: String(worker),
  dpRank,
  storageTier: tier,
  data: { _tag: "Removed", blockHashes: hashPairs(blocks.map((i) => ext(worker, i))) }
})

/**
 * The fixed scenario, six full blocks of one prompt (and a partial seventh):
 * - worker 7 rank 0: blocks 0–1 on the GPU, 2 on the CPU, 3–4 on disk;
 * - worker 7 rank 1: block 0 on the GPU, 1 on disk;
 * - worker 9 rank 3: block 0 on the CPU only;
 * - worker 11 rank 0: block 5 alone on the GPU (0–4 evicted), so it matches nothing;
 * - worker 12 rank 0: blocks 0 and 2 on the GPU, 1 copied to the CPU then evicted from the GPU,
 *   3 on disk: its tiers interleave, so Dynamo's walk and the cumulative depths differ;
 * - worker 20 rank 0: blocks 0–2 on the CPU only (more than 7/1 holds, none on the GPU).
 */
const scenario = (): CanonicalCkfState => {
  const state = new CanonicalCkfState(ckfConfig(4096))
  const events = [
    stored(7, 0, "device", [0, 1]),
    stored(7, 0, "host_pinned", [2], 1),
    stored(7, 0, "disk", [3, 4], 2),
    stored(7, 1, "device", [0]),
    stored(7, 1, "external", [1], 0),
    stored(9, 3, "host_pinned", [0]),
    stored(11, 0, "device", [0, 1, 2, 3, 4, 5]),
    removed(11, 0, "device", [0, 1, 2, 3, 4]),
    stored(12, 0, "device", [0, 1, 2]),
    copied(12, 0, "host_pinned", [1]),
    removed(12, 0, "device", [1]),
    stored(12, 0, "disk", [3], 2),
    stored(20, 0, "host_pinned", [0, 1, 2])
  ]
  for (const event of events) expect(state.applyEvent(event).firstError).toBeUndefined()
  return state
}

const queryHashes = (): Uint32Array => sequenceHashes(localBlockHashes(tokens, BLOCK))

describe("worker query answers (PROTOCOL §5.1 ◆3)", () => {
  it("/v1/query: every member with cumulative depths, in §5.1's order, and the device frequencies", () => {
    const result = scenario().queryWorkers(queryHashes())
    expect(poolWorkersAnswer(result)).toEqual({
      queryBlocks: 6,
      frequencies: [3, 1],
      workers: [
        { workerId: "7", dpRank: 0, device: 2, host: 3, disk: 5 },
        { workerId: "12", dpRank: 0, device: 1, host: 3, disk: 4 },
        { workerId: "7", dpRank: 1, device: 1, host: 1, disk: 2 },
        { workerId: "20", dpRank: 0, device: 0, host: 3, disk: 3 },
        { workerId: "9", dpRank: 3, device: 0, host: 1, disk: 1 },
        { workerId: "11", dpRank: 0, device: 0, host: 0, disk: 0 }
      ]
    })
  })

  it("a member filter lists the pool's expected ranks, those holding nothing included, in its order", () => {
    const members = [
      { workerId: "40", dpRank: 0 },
      { workerId: "7", dpRank: 1 }
    ]
    const result = scenario().queryWorkers(queryHashes(), 6, { members })
    expect(result.members).toEqual(members)
    expect(Array.from(result.device)).toEqual([0, 1])
    expect(Array.from(result.disk)).toEqual([0, 2])
    // Frequencies count the whole pool, up to the listed members' deepest device depth.
    expect(Array.from(result.frequencies)).toEqual([3])
  })

  it("Dynamo's /query answer for the scenario, field by field (golden document)", () => {
    /*
     * Derived from Dynamo's source for the same state:
     * - `build_score_response` (lib/kv-router/src/services/indexer/server.rs): `scores` from the
     *   device overlap's scores, `v * block_size`, keyed by worker id then dp rank as strings;
     *   `frequencies` passed through; `instances` from `build_mooncake_overlap_summaries(tiered,
     *   block_size, [])`.
     * - `query_lower_tiers` (lib/kv-router/src/indexer/lower_tier_indexers.rs) and
     *   `query_match_details` (lib/kv-router/src/indexer/lower_tier.rs): each device-matched
     *   worker continues on the host from its device depth, then on disk from where the host walk
     *   ended; a worker without a continuation starts at the root when it holds block 0 on that
     *   tier. Worker 7/0: device 2, host +1 (block 2), disk +2 (3, 4); 7/1: device 1, host +0,
     *   disk +1 (block 1, external media counted as disk); 9/3: host from the root +1; 12/0:
     *   device 1, host +1 (block 1; block 2 is on the GPU only), disk +0 (block 2 is not on disk);
     *   20/0: host from the root +3.
     * - `build_mooncake_overlap_summaries` (lib/kv-router/src/services/overlap.rs): per worker,
     *   `dp[rank]` = the rank's GPU tokens, `gpu`/`cpu`/`disk` the largest of the ranks'
     *   `gpu_blocks`, `gpu_blocks + host`, `cpu_blocks + disk + external`, all × block size, and
     *   `longest_matched = max(gpu, cpu, disk)`; workers in neither the device scores nor any
     *   lower tier's hits (worker 11) are absent.
     * `frequencies` is PROTOCOL §5.1's: members holding block i on the device, below the deepest
     * device depth.
     */
    const expected = {
      scores: { "7": { "0": 32, "1": 16 }, "12": { "0": 16 } },
      frequencies: [3, 1],
      instances: {
        "7": { longest_matched: 80, gpu: 32, dp: { "0": 32, "1": 16 }, cpu: 48, disk: 80 },
        "9": { longest_matched: 16, gpu: 0, dp: { "3": 0 }, cpu: 16, disk: 16 },
        "12": { longest_matched: 32, gpu: 16, dp: { "0": 16 }, cpu: 32, disk: 32 },
        "20": { longest_matched: 48, gpu: 0, dp: { "0": 0 }, cpu: 48, disk: 48 }
      }
    }
    const answer = JSON.parse(
      JSON.stringify(dynamoScoreResponse(scenario().queryWorkers(queryHashes()), BLOCK))
    )
    expect(Object.keys(answer).sort()).toEqual(["frequencies", "instances", "scores"])
    expect(answer.scores).toEqual(expected.scores)
    expect(answer.frequencies).toEqual(expected.frequencies)
    expect(Object.keys(answer.instances).sort()).toEqual(Object.keys(expected.instances).sort())
    for (const [worker, summary] of Object.entries(expected.instances)) {
      expect(Object.keys(answer.instances[worker]).sort()).toEqual([
        "cpu",
        "disk",
        "dp",
        "gpu",
        "longest_matched"
      ])
      expect(answer.instances[worker]).toEqual(summary)
    }
  })

  it("reproduces Dynamo's own overlap.rs test vector (builds_cumulative_multi_rank_mooncake_summary)", () => {
    // Worker 7: rank 0 device 2, host +1, disk +2; rank 1 device 1, disk +1; block size 16 →
    // dp {0: 32, 1: 16}, gpu 32, cpu 48, disk 80, longest_matched 80.
    const result: WorkerQueryResult = {
      queryBlocks: 5,
      members: [
        { workerId: "7", dpRank: 0 },
        { workerId: "7", dpRank: 1 }
      ],
      device: [2, 1],
      host: [3, 1],
      disk: [5, 2],
      dynamoCpu: [3, 1],
      dynamoDisk: [5, 2],
      frequencies: [2, 1]
    }
    expect(dynamoScoreResponse(result, 16).instances).toEqual({
      "7": { longest_matched: 80, gpu: 32, dp: { "0": 32, "1": 16 }, cpu: 48, disk: 80 }
    })
  })

  it("the same answer from local block hashes as from tokens (query_by_hash)", () => {
    const state = scenario()
    // `/query_by_hash` takes i64 local hashes; as u64 they chain to the same addresses.
    const signed = local.slice(0, 6).map((h) => BigInt.asIntN(64, h))
    const byHash = state.queryWorkers(sequenceHashes(hashPairs(signed)))
    expect(dynamoScoreResponse(byHash, BLOCK)).toEqual(
      dynamoScoreResponse(state.queryWorkers(queryHashes()), BLOCK)
    )
  })

  it("GET /workers lists each worker's ranks with their source endpoints, ids written exactly", () => {
    const json = dynamoWorkersJson([
      { workerId: "18446744073709551615", dpRank: 1, endpoint: "tcp://10.0.0.2:5558" },
      { workerId: "7", dpRank: 1, endpoint: "tcp://10.0.0.1:5558" },
      { workerId: "7", dpRank: 0, endpoint: "tcp://10.0.0.1:5557" }
    ])
    expect(json).toBe(
      '[{"instance_id":7,"endpoints":{"0":"tcp://10.0.0.1:5557","1":"tcp://10.0.0.1:5558"}},' +
        '{"instance_id":18446744073709551615,"endpoints":{"1":"tcp://10.0.0.2:5558"}}]'
    )
    expect(() => dynamoWorkersJson([{ workerId: "07", dpRank: 0, endpoint: "x" }])).toThrow(RangeError)
  })

  it("a member listed twice is refused, naming it", () => {
    const twice = [
      { workerId: "7", dpRank: 0 },
      { workerId: "7", dpRank: 0 }
    ]
    expect(() => scenario().queryWorkers(queryHashes(), 6, { members: twice })).toThrow(
      new RangeError("worker query lists 7/0 more than once")
    )
  })

  it("an empty query and an empty pool answer nothing", () => {
    const empty = new CanonicalCkfState(ckfConfig(4096)).queryWorkers(queryHashes())
    expect(poolWorkersAnswer(empty)).toEqual({ queryBlocks: 6, frequencies: [], workers: [] })
    const none = scenario().queryWorkers(new Uint32Array(0))
    expect(dynamoScoreResponse(none, BLOCK)).toEqual({ scores: {}, frequencies: [], instances: {} })
    expect(poolWorkersAnswer(none).workers.every((w) => w.disk === 0)).toBe(true)
  })
})

describe("worker queries over pools of many members", () => {
  /** Prompts of 8 blocks in three families that share their first blocks (system prompts). */
  const PROMPT_BLOCKS = 8
  const familyTokens = [0, 1, 2].map((f) =>
    Array.from({ length: PROMPT_BLOCKS * BLOCK }, (_, i) => (i < (2 + f) * BLOCK ? 5 + i : 100_000 * f + i))
  )
  const canonOf = familyTokens.map((t) => sequenceHashes(localBlockHashes(t, BLOCK)))
  const localOf = familyTokens.map((t) => localBlockHashes(t, BLOCK))
  /** Member m's external hash of canonical pair i of `canon` (engines hash with their own seeds). */
  const externalOf = (canon: Uint32Array, from: number, to: number, m: number): Uint32Array => {
    const out = canon.slice(2 * from, 2 * to)
    for (let i = 0; i < out.length; i += 2) out[i + 1] = (out[i + 1]! ^ Math.imul(m + 1, 0x9e3779b1)) >>> 0
    return out
  }
  const member = (m: number) => ({ workerId: String(100 + (m >> 1)), dpRank: m & 1 })

  it("agrees with a Set per member when the holders' indices span several groups of 32", () => {
    const holding = fc.record({
      family: fc.nat({ max: 2 }),
      blocks: fc.integer({ min: 1, max: PROMPT_BLOCKS }),
      // Blocks evicted from the middle of the held prefix (a hole ends the member's match).
      holes: fc.array(fc.nat({ max: PROMPT_BLOCKS - 1 }), { maxLength: 2 })
    })
    fc.assert(
      fc.property(
        fc.array(fc.option(holding, { freq: 4 }), { minLength: 33, maxLength: 110 }),
        fc.nat({ max: 2 }),
        (members, queried) => {
          const state = new CanonicalCkfState(ckfConfig(4096))
          const held = members.map(() => new Set<bigint>())
          members.forEach((h, m) => {
            if (h === null) return
            const { workerId, dpRank } = member(m)
            const event = (data: CkfEvent["data"]): void => {
              expect(state.applyEvent({ workerId, dpRank, storageTier: "device", data }).firstError).toBe(
                undefined
              )
            }
            const canon = canonOf[h.family]!
            event({
              _tag: "Stored",
              blockHashes: externalOf(canon, 0, h.blocks, m),
              tokensHashes: localOf[h.family]!.slice(0, 2 * h.blocks)
            })
            for (const c of hashPairsToBigInts(canon.slice(0, 2 * h.blocks))) held[m]!.add(c)
            for (const hole of h.holes) {
              if (hole >= h.blocks) continue
              event({ _tag: "Removed", blockHashes: externalOf(canon, hole, hole + 1, m) })
              held[m]!.delete(hashPairsToBigInts(canon.slice(2 * hole, 2 * hole + 2))[0]!)
            }
          })
          const query = hashPairsToBigInts(canonOf[queried]!)
          const listed = members.map((_, m) => member(m))
          const result = state.queryWorkers(canonOf[queried]!, PROMPT_BLOCKS, { members: listed })
          const depths = held.map((set) => {
            let d = 0
            while (d < query.length && set.has(query[d]!)) d++
            return d
          })
          expect(Array.from(result.device)).toEqual(depths)
          const deepest = Math.max(0, ...depths)
          expect(Array.from(result.frequencies)).toEqual(
            query.slice(0, deepest).map((c) => held.filter((set) => set.has(c)).length)
          )
        }
      ),
      { numRuns: 60 }
    )
  })
})

describe("writePoolWorkers", () => {
  it("writes the bytes JSON.stringify writes for poolWorkersAnswer, whatever the members' order and ids", () => {
    const out = new JsonBytes()
    const id = fc.oneof(
      fc.constantFrom("7", "12", "120", "18446744073709551615"),
      fc.string({ maxLength: 6 })
    )
    fc.assert(
      fc.property(
        fc.uniqueArray(fc.record({ workerId: id, dpRank: fc.nat({ max: 3 }) }), {
          selector: (m) => `${m.workerId}/${m.dpRank}`,
          maxLength: 40
        }),
        // Blocks past the deepest depth: few, or so many that the sort keys do not fit a double.
        fc.oneof(fc.nat({ max: 3 }), fc.constant(5_000_000)),
        fc.array(fc.nat({ max: 6 }), { maxLength: 7 }),
        fc.infiniteStream(fc.nat({ max: 3 })),
        (members, beyond, frequencies, steps) => {
          // Depths that tie often (the order falls to worker id and rank), device ≤ host ≤ disk.
          const device = members.map(() => steps.next().value)
          const host = device.map((d) => d + steps.next().value)
          const disk = host.map((h) => h + steps.next().value)
          const queryBlocks = Math.max(0, ...disk) + beyond
          const result: WorkerQueryResult = {
            queryBlocks,
            members,
            device,
            host,
            disk,
            dynamoCpu: host,
            dynamoDisk: disk,
            frequencies
          }
          // The object's members, between braces, as the bytes a latin1 write sends.
          const written = (): Buffer => {
            out.reset().byte(0x7b)
            writePoolWorkers(out, result)
            out.byte(0x7d)
            return Buffer.from(out.latin1(), "latin1")
          }
          const bytes = written()
          expect(bytes.toString("utf8")).toBe(JSON.stringify(poolWorkersAnswer(result)))
          // Again from the cached openings and order of the same members array.
          expect(written()).toEqual(bytes)
        }
      )
    )
  })
})
