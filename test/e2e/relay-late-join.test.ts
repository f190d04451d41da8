/**
 * End to end (PROTOCOL §3.3 ◆3, §5 ◆3): a relay that starts, and one that restarts, under engines
 * that have been running longer than their replay buffer reaches back. The engines are simulated
 * vLLM and SGLang ranks that keep a bounded replay buffer as vLLM's does (`buffer_steps`, here 8
 * batches); the relay is a `kvrelay relay` process on a discovery file.
 *
 * Every count is exact, and every filter check is at the block's canonical address computed here
 * from the tokens the engine sent and its parent's address (the public hashing of
 * `kvrelay/client`), never asked of the relay.
 */

import { Effect, Exit, Scope } from "effect"
import { afterEach, describe, expect, it } from "vitest"
import { localBlockHashes, nextSequenceHash } from "../../src/ckf/tokens.js"
import { hashPairsToBigInts } from "../../src/ckf/u64.js"
import { type EngineZmqPublisher, makeEngineZmqPublisher } from "../../src/simulate/EngineZmqPublisher.js"
import {
  cardRecord,
  cleanup,
  DiscoveryFile,
  diagnosticWords,
  distinguishable,
  EngineWorker,
  endpointText,
  eventually,
  type FormatJson,
  Relay,
  wordsHold
} from "./relayProcessHarness.js"

const SERVING = { namespace: "prod", component: "vllm", endpoint: "generate" }
const ENDPOINT = endpointText(SERVING)
const WORKER = "8001"
const BLOCK = 16
const BUFFER_STEPS = 8

let scope = Effect.runSync(Scope.make())
afterEach(async () => {
  await cleanup()
  await Effect.runPromise(Scope.close(scope, Exit.void))
  scope = Effect.runSync(Scope.make())
})

const run = <A, E>(effect: Effect.Effect<A, E, Scope.Scope>): Promise<A> =>
  Effect.runPromise(Scope.extend(effect, scope))

/** Worker 8001's card: two data-parallel ranks of 16-token blocks. */
const card = cardRecord(SERVING, WORKER, { kvCacheBlockSize: BLOCK, dataParallelSize: 2 })

/** One prompt's blocks: engine hashes, tokens, and canonical addresses chained from its parent. */
interface Blocks {
  readonly external: ReadonlyArray<bigint>
  readonly canonical: ReadonlyArray<bigint>
}

/**
 * A simulated engine rank and what it stored. Block `i` of a prompt gets its own 16 tokens, so
 * every block of the test is distinct; its canonical address chains from the parent's.
 */
class Engine {
  private next = 0
  constructor(readonly publisher: EngineZmqPublisher) {}

  /** Stores `blocks` blocks as one BlockStored, under `parent` (or as a new prompt). */
  async store(blocks: number, parent?: Blocks): Promise<Blocks> {
    const base = this.publisher.dpRank * 1_000_000 + this.next * BLOCK
    const rankTag = BigInt(this.publisher.dpRank + 1) << 48n
    const external = Array.from({ length: blocks }, (_, i) => rankTag + BigInt(this.next + i + 1))
    const tokens = Array.from({ length: blocks * BLOCK }, (_, i) => base + i)
    this.next += blocks
    const local = hashPairsToBigInts(localBlockHashes(tokens, BLOCK))
    let previous = parent?.canonical.at(-1)
    const canonical = local.map((l) => {
      previous = previous === undefined ? l : nextSequenceHash(previous, l)
      return previous
    })
    await run(
      this.publisher.store(
        external,
        parent === undefined
          ? { tokenIds: tokens }
          : { tokenIds: tokens, parentHash: parent.external.at(-1)! }
      )
    )
    return { external, canonical }
  }

  async remove(blocks: Blocks, index: number): Promise<void> {
    await run(this.publisher.remove([blocks.external[index]!]))
  }

  source() {
    return new EngineWorker(this.publisher).sourceRecord(ENDPOINT)
  }
}

const engines = async (): Promise<Array<Engine>> =>
  Promise.all(
    (["vllm", "sglang"] as const).map(
      async (format, dpRank) =>
        new Engine(
          await run(
            makeEngineZmqPublisher({
              workerId: WORKER,
              dpRank,
              format,
              blockSize: BLOCK,
              bufferSteps: BUFFER_STEPS
            })
          )
        )
    )
  )

interface SourceJson {
  readonly workerId: string
  readonly dpRank: number
  readonly state: string
  readonly history: string
}
interface StatsJson {
  readonly aggregation: {
    readonly members: ReadonlyArray<{
      readonly workerId: string
      readonly dpRank: number
      readonly blocks: number
    }>
    readonly unknownRemovals: number
    readonly unanchoredRemovals: number
    readonly parentNotFound: number
  } | null
  readonly ingest: { readonly unanchored: number }
  readonly sources: ReadonlyArray<SourceJson>
}
interface HealthJson {
  readonly sources: Readonly<Record<string, number>>
}

const stats = async (relay: Relay): Promise<StatsJson> => {
  const all = await relay.json<{ endpoints: Array<StatsJson & { servingEndpoint: string }> }>("/v1/stats")
  const found = all.endpoints.find((e) => e.servingEndpoint === ENDPOINT)
  if (found === undefined) throw new Error(`no stats for ${ENDPOINT}`)
  return found
}

const blocksOf = (s: StatsJson): Array<number> =>
  [0, 1].map((rank) => s.aggregation?.members.find((m) => m.dpRank === rank)?.blocks ?? 0)

/**
 * Waits until the relay holds `blocks[rank]` blocks per rank, has skipped `unanchored` in all and,
 * when `removals` is given, has counted that many removals it could not apply. Removals of blocks
 * the relay never indexed change neither count, so without the last bound a wait could end before
 * the removal events are read.
 */
const awaitCounts = (
  relay: Relay,
  what: string,
  blocks: ReadonlyArray<number>,
  unanchored: number,
  removals?: number
) =>
  eventually(
    what,
    async () => {
      const s = await stats(relay)
      const held = blocksOf(s)
      const unapplied = (s.aggregation?.unknownRemovals ?? 0) + (s.aggregation?.unanchoredRemovals ?? 0)
      return (
        held[0] === blocks[0] &&
        held[1] === blocks[1] &&
        s.ingest.unanchored === unanchored &&
        (removals === undefined || unapplied === removals) &&
        s
      )
    },
    30_000
  )

/** Waits until the filter holds every `present` address and none of `absent` that it can tell apart. */
const awaitFilter = (
  relay: Relay,
  what: string,
  present: ReadonlyArray<bigint>,
  absent: ReadonlyArray<bigint>
) =>
  eventually(
    what,
    async () => {
      await relay.post("/v1/flush", "")
      const snapshot = await relay.json<{ format: FormatJson; buckets: string }>(
        `/v1/endpoints/${ENDPOINT}/snapshot`
      )
      const words = diagnosticWords(snapshot.buckets)
      const telling = absent.filter((hash) => distinguishable(snapshot.format, hash, present))
      // A check that cannot fail proves nothing: most absent blocks must be told apart.
      expect(telling.length).toBeGreaterThan(absent.length / 2)
      return (
        present.every((hash) => wordsHold(words, snapshot.format, hash)) &&
        telling.every((hash) => !wordsHold(words, snapshot.format, hash))
      )
    },
    30_000
  )

/** Every expected source live, each with `history`. */
const awaitLive = (relay: Relay, history: string) =>
  eventually(
    "both ranks live, every expected source",
    async () => {
      const health = await relay.json<HealthJson>("/v1/health")
      const s = await stats(relay)
      return (
        health.sources.expected === 2 &&
        health.sources.live === 2 &&
        s.sources.length === 2 &&
        s.sources.every((source) => source.state === "live" && source.history === history) &&
        s
      )
    },
    30_000
  )

const startRelay = (file: DiscoveryFile) => Relay.start({ discovery: file })

describe("a relay that joins late or restarts under running engines (PROTOCOL §3.3 ◆3)", () => {
  it("keeps every rank, indexes what it can chain, counts the rest as unanchored, and shows partial history", async () => {
    const [vllm, sglang] = await engines()
    const ranks = [vllm!, sglang!]

    // Before any relay: a prompt A, then ten one-block prompts; the 8-batch buffers keep F3..F10.
    const a = await Promise.all(ranks.map((e) => e.store(3)))
    const fillers: Array<Array<Blocks>> = [[], []]
    for (let i = 0; i < 10; i++) for (const [r, e] of ranks.entries()) fillers[r]!.push(await e.store(1))
    const kept = fillers.map((f) => f.slice(2))

    const file = new DiscoveryFile()
    file.write({ version: 1, cards: [card], sources: await Promise.all(ranks.map((e) => e.source())) })

    // A relay started after the buffers rolled over keeps both ranks, from what the buffers hold.
    const first = await startRelay(file)
    await awaitLive(first, "partial")
    await awaitCounts(first, "the buffered prompts indexed", [8, 8], 0)

    // After the join: children of A (stored before it) are unanchored, and so are their children;
    // a new prompt and its child are exact at once.
    const c = await Promise.all(ranks.map((e, r) => e.store(2, a[r])))
    const d = await Promise.all(ranks.map((e, r) => e.store(1, c[r])))
    const n = await Promise.all(ranks.map((e) => e.store(3)))
    const n2 = await Promise.all(ranks.map((e, r) => e.store(1, n[r])))
    // The removal of a block stored before the join is expected, not an unknown removal.
    for (const [r, e] of ranks.entries()) await e.remove(a[r]!, 0)
    const joined = await awaitCounts(
      first,
      "the new prompts indexed, the children of A skipped, both removals read",
      [12, 12],
      6,
      2
    )
    expect(joined.aggregation).toMatchObject({ unknownRemovals: 0, unanchoredRemovals: 2, parentNotFound: 0 })
    const addresses = (groups: ReadonlyArray<ReadonlyArray<Blocks | undefined>>) =>
      groups.flatMap((group) => group.flatMap((b) => b?.canonical ?? []))
    await awaitFilter(
      first,
      "the buffered and new prompts in the filter, A and its descendants not",
      addresses([...kept, n, n2]),
      addresses([a, c, d, fillers.map((f) => f[0]), fillers.map((f) => f[1])])
    )
    await awaitLive(first, "partial")

    // SIGTERM, and the engines keep going while no relay listens.
    first.proc.signal("SIGTERM")
    expect(await first.proc.waitExit(30_000)).toEqual({ code: 0, signal: null })
    const m = await Promise.all(ranks.map((e) => e.store(2)))
    const m2 = await Promise.all(ranks.map((e, r) => e.store(1, m[r])))
    const e1 = await Promise.all(ranks.map((e, r) => e.store(1, n2[r])))

    // The restarted relay replays the buffers (C, D, N, N2, the removal, M, M2, E1): C and D are
    // unanchored again; F3..F10 were stored before the buffers reach back, so it cannot know them.
    const second = await startRelay(file)
    await awaitLive(second, "partial")
    await awaitCounts(second, "the buffered prompts indexed after the restart", [8, 8], 6)
    // A child of a block only the first relay knew is unanchored here; a new prompt is exact.
    const g = await Promise.all(ranks.map((e, r) => e.store(1, kept[r]![0])))
    const p = await Promise.all(ranks.map((e) => e.store(2)))
    await awaitCounts(second, "the last prompts", [10, 10], 8)
    await awaitFilter(
      second,
      "after the restart",
      addresses([n, n2, m, m2, e1, p]),
      addresses([a, c, d, g, ...kept])
    )
    const health = await second.json<HealthJson>("/v1/health")
    expect(health.sources).toEqual({
      expected: 2,
      connecting: 0,
      live: 2,
      recovering: 0,
      degraded: 0,
      rejected: 0
    })
    const metrics = await second.metrics()
    expect(metrics).toMatch(/^kv_dc_relay_ingest_skipped_blocks_total\{reason="unanchored"\} 8$/m)
    expect(metrics).toMatch(/^kv_dc_relay_sources\{state="live"\} 2$/m)

    // AllBlocksCleared makes a rank's history complete again.
    await run(vllm!.publisher.clear)
    await eventually(
      "rank 0's history complete after its clear",
      async () => {
        const s = await stats(second)
        const history = Object.fromEntries(s.sources.map((source) => [source.dpRank, source.history]))
        return history[0] === "complete" && history[1] === "partial"
      },
      30_000
    )
    // Each wait above is bounded on its own; a loaded machine may need several of them in full.
  }, 240_000)
})
