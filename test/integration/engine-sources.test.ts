/**
 * Engine sources end to end (PROTOCOL §3.2): the relay host over file discovery and real
 * ZeroMQ, fed by simulated vLLM engines whose payloads come from the test suite's msgspec
 * encoders. Each test ends by checking the pool is exact: every rank's block count in the
 * actor, and every expected block in (and every dropped one out of) the published filter.
 *
 * A dropped block is checked at the canonical address it would have had (PROTOCOL §3.3),
 * computed here from the tokens and parent the test sent; each dropped block gets tokens of its
 * own, so that each check stands for one block.
 */

import { describe, expect, it } from "@effect/vitest"
import { Effect, Option } from "effect"
import { localBlockHashes, sequenceHashes } from "../../src/ckf/tokens.js"
import { hashPairsToBigInts } from "../../src/ckf/u64.js"
import type { KvDcRelayService } from "../../src/relay/KvDcRelay.js"
import { canonicalCkfBuilder } from "../../src/relay/PoolRegistry.js"
import { type EngineZmqPublisher, makeEngineZmqPublisher } from "../../src/simulate/EngineZmqPublisher.js"
import { u64FrameOf } from "../../src/transport/ZmqSocket.js"
import { discoveryFile } from "../relay/hostFixtures.js"
import { vllmBatch, vllmRemoved, vllmStored } from "../transport/msgspec.js"
import {
  addressesBy,
  awaitFilter,
  endpointStats,
  hashes,
  memberBlocks,
  poolOf,
  quiet,
  startRelay,
  VLLM,
  vllmCard
} from "./relayHostFixtures.js"
import { eventually } from "./zmqHelpers.js"

const WORKER = "8001"
/** A replay attempt bound far beyond any test's length (ten minutes). */
const SILENT_ATTEMPT_MS = 600_000
const BLOCK = 16
/** Token ids `first`, `first + 1`, … for `blocks` full blocks. */
const tokens = (blocks: number, first = 0): Array<number> =>
  Array.from({ length: blocks * BLOCK }, (_, i) => first + i)

/**
 * The canonical addresses of the blocks `tokens` makes (PROTOCOL §3.3), chained from the
 * address `parent`, as a router computes them: the project's public hashing, not the relay's.
 */
const canonical = (
  blockTokens: ReadonlyArray<number>,
  options: { readonly parent?: bigint; readonly blockSize?: number } = {}
): Array<bigint> =>
  hashPairsToBigInts(
    sequenceHashes(localBlockHashes(blockTokens, options.blockSize ?? BLOCK), options.parent)
  )

const engine = (dpRank: number, options: Partial<Parameters<typeof makeEngineZmqPublisher>[0]> = {}) =>
  makeEngineZmqPublisher({ workerId: WORKER, dpRank, format: "vllm", ...options })

/** A relay over one file document listing `engines` as the ranks of the vLLM pool. */
const relayOver = (
  engines: ReadonlyArray<EngineZmqPublisher>,
  recoveryAttemptTimeoutMs = 2000,
  registry?: Parameters<typeof startRelay>[2]
) =>
  Effect.gen(function* () {
    const sources = yield* Effect.forEach(engines, (e) => e.source(VLLM))
    const file = yield* discoveryFile([vllmCard(WORKER)], sources)
    const relay = yield* startRelay(file, recoveryAttemptTimeoutMs, registry)
    yield* poolOf(relay, VLLM, "the vllm pool")
    enginesOf.set(relay, engines)
    return relay
  })

/** Each relay's simulated engines, which know the canonical address of every block they hold. */
const enginesOf = new WeakMap<KvDcRelayService, ReadonlyArray<EngineZmqPublisher>>()
/** Per engine, the addresses it gave while it held the blocks (a restart forgets them there). */
const lookups = new WeakMap<EngineZmqPublisher, (hashes: ReadonlyArray<bigint>) => Array<bigint>>()

/**
 * Where the blocks rank `dpRank` stored through `store` sit in the filter (PROTOCOL §3.3). A
 * hash the engine did not store that way (sent raw, or never looked up while held) throws.
 */
const addressesAt = (
  relay: KvDcRelayService,
  dpRank: number,
  hashes: ReadonlyArray<bigint>
): Array<bigint> => {
  const engine = enginesOf.get(relay)?.find((e) => e.dpRank === dpRank)
  if (engine === undefined) throw new Error(`no engine of rank ${dpRank} behind this relay`)
  let lookup = lookups.get(engine)
  if (lookup === undefined) {
    lookup = addressesBy(engine)
    lookups.set(engine, lookup)
  }
  return lookup(hashes)
}

/**
 * The pool is exact: each rank holds exactly its blocks (stored through `store`), and the filter
 * shows them and none of the `absent` addresses.
 */
const awaitExact = (
  relay: KvDcRelayService,
  what: string,
  ranks: ReadonlyArray<ReadonlyArray<bigint>>,
  absent: ReadonlyArray<bigint> = []
) =>
  Effect.gen(function* () {
    const present = ranks.flatMap((blocks, rank) => addressesAt(relay, rank, blocks))
    yield* awaitFilter(relay, VLLM, what, present, absent)
    yield* eventually(
      endpointStats(relay, VLLM).pipe(
        Effect.map((stats) =>
          ranks.every((blocks, rank) => (memberBlocks(stats, WORKER, rank) ?? 0) === blocks.length)
        )
      ),
      `${what}: exact member counts`
    )
  })

const ingestOf = (relay: KvDcRelayService) =>
  endpointStats(relay, VLLM).pipe(Effect.map((stats) => stats!.ingest))

describe("engine sources over ZeroMQ", () => {
  for (const framing of ["seq", "topic"] as const) {
    it.scopedLive(
      `a replay ROUTER replying ${framing === "topic" ? "[empty, topic, seq, payload] (current vLLM)" : "[empty, seq, payload]"} serves the initial sync and a dropped batch`,
      () =>
        Effect.gen(function* () {
          const rank0 = yield* engine(0, { replayFraming: framing, topic: "kv@8001" })
          const first = hashes(0x5100_0000_0000n, 3)
          yield* rank0.store(first)
          const relay = yield* relayOver([rank0])
          yield* awaitExact(relay, "the initial sync through replay", [first])
          const lost = hashes(0x5200_0000_0000n, 2)
          const next = hashes(0x5300_0000_0000n, 2)
          yield* rank0.dropNext(1)
          yield* rank0.store(lost)
          yield* rank0.store(next)
          yield* awaitExact(relay, "the dropped batch, replayed", [[...first, ...lost, ...next]])
          const stats = yield* endpointStats(relay, VLLM)
          expect(stats!.ingest.gaps).toBeGreaterThanOrEqual(1)
          expect((yield* rank0.stats).replays).toBeGreaterThanOrEqual(2)
          expect(stats!.recovery.sources.map((s) => s.state)).toEqual(["live"])
          expect(stats!.recovery.sourcesDegraded).toBe(0)
        }).pipe(Effect.provide(quiet))
    )
  }

  it.scopedLive(
    "REMOTE, CPU and cache-owner events leave the device view unchanged and count by reason",
    () =>
      Effect.gen(function* () {
        const rank0 = yield* engine(0)
        const device = hashes(0x5400_0000_0000n, 3)
        yield* rank0.store(device)
        const relay = yield* relayOver([rank0])
        yield* awaitExact(relay, "the device blocks", [device])
        const foreign = hashes(0x5500_0000_0000n, 3)
        const foreignTokens = [tokens(1, 1000), tokens(1, 2000), tokens(1, 3000)]
        yield* rank0.publishPayload(
          vllmBatch(
            [
              vllmStored([foreign[0]!], foreignTokens[0]!, BLOCK, { locality: "REMOTE", medium: "GPU" }),
              vllmStored([foreign[1]!], foreignTokens[1]!, BLOCK, { medium: "CPU" }),
              vllmStored([foreign[2]!], foreignTokens[2]!, BLOCK, { ownership: "lmcache" }),
              vllmRemoved([device[0]!], { locality: "REMOTE" }),
              vllmRemoved([device[1]!], { medium: "CPU" }),
              vllmRemoved([device[2]!], { ownership: "lmcache" })
            ],
            { version: "current", dpRank: 0n }
          )
        )
        const after = hashes(0x5600_0000_0000n, 1)
        yield* rank0.store(after)
        yield* awaitExact(
          relay,
          "device blocks only",
          [[...device, ...after]],
          foreignTokens.flatMap((t) => canonical(t))
        )
        const ingest = yield* ingestOf(relay)
        expect(ingest.skipped).toEqual({ medium: 0, locality: 2, ownership: 2, group: 0, namespace: 0 })
        expect(ingest.malformed).toBe(0)
        expect(ingest.gaps).toBe(0)
      }).pipe(Effect.provide(quiet))
  )

  it.scopedLive("an engine restarted under the same publisher id (seq 0 again) ends exact", () =>
    Effect.gen(function* () {
      const rank0 = yield* engine(0)
      const before = hashes(0x5700_0000_0000n, 4)
      yield* rank0.store(before.slice(0, 2))
      yield* rank0.store(before.slice(2))
      const relay = yield* relayOver([rank0])
      yield* awaitExact(relay, "the first incarnation", [before])
      yield* rank0.restart(yield* rank0.publisherId)
      const after = hashes(0x5800_0000_0000n, 2)
      yield* rank0.store(after)
      const gone = addressesAt(relay, 0, before)
      yield* awaitExact(relay, "the restarted engine's blocks only", [after], gone)
      const more = hashes(0x5900_0000_0000n, 1)
      yield* rank0.store(more)
      yield* awaitExact(relay, "live traffic after the restart", [[...after, ...more]], gone)
      expect((yield* ingestOf(relay)).restarts).toBe(1)
    }).pipe(Effect.provide(quiet))
  )

  it.scopedLive("a wild seq is malformed and does not wedge the source; a stale one is counted", () =>
    Effect.gen(function* () {
      const rank0 = yield* engine(0)
      const first = hashes(0x5a00_0000_0000n, 2)
      yield* rank0.store(first)
      const relay = yield* relayOver([rank0])
      yield* awaitExact(relay, "the first blocks", [first])
      const wild = hashes(0x5b00_0000_0000n, 1)
      const wildTokens = tokens(1, 5000)
      const payload = vllmBatch([vllmStored(wild, wildTokens, BLOCK)], { version: "current", dpRank: 0n })
      yield* rank0.sendRaw(["", u64FrameOf(2 ** 53 - 2), payload])
      yield* rank0.sendRaw(["", u64FrameOf(0x7fff_ffff_ffff), payload])
      const next = hashes(0x5c00_0000_0000n, 2)
      yield* rank0.store(next)
      yield* awaitExact(relay, "traffic after the wild seqs", [[...first, ...next]], canonical(wildTokens))
      // A lower seq again: dropped, counted, and nothing else changes.
      yield* rank0.sendRaw(["", u64FrameOf(1), payload])
      yield* eventually(
        ingestOf(relay).pipe(Effect.map((i) => i.stale === 1)),
        "the stale batch to be counted"
      )
      const last = hashes(0x5d00_0000_0000n, 1)
      yield* rank0.store(last)
      yield* awaitExact(
        relay,
        "traffic after the stale batch",
        [[...first, ...next, ...last]],
        canonical(wildTokens)
      )
      const ingest = yield* ingestOf(relay)
      expect(ingest.malformedByReason).toEqual({ "sequence-jump": 2 })
      expect(ingest.gaps).toBe(0)
    }).pipe(Effect.provide(quiet))
  )

  it.scopedLive("a partial last page is not indexed", () =>
    Effect.gen(function* () {
      const rank0 = yield* engine(0)
      const relay = yield* relayOver([rank0])
      yield* awaitExact(relay, "an empty pool", [[]])
      const blocks = hashes(0x5e00_0000_0000n, 3)
      const partial = [1, 2, 3]
      yield* rank0.publishPayload(
        vllmBatch([vllmStored(blocks, tokens(2).concat(partial), BLOCK)], {
          version: "current",
          dpRank: 0n
        })
      )
      const full = canonical(tokens(2))
      // Where the partial page would be if its tokens were hashed as a block of their own.
      const page = canonical(partial, { parent: full[1]!, blockSize: partial.length })
      expect(page).toHaveLength(1)
      yield* awaitFilter(relay, VLLM, "the two full blocks and not the partial page", full, page)
      yield* eventually(
        endpointStats(relay, VLLM).pipe(Effect.map((stats) => memberBlocks(stats, WORKER, 0) === 2)),
        "two indexed blocks"
      )
    }).pipe(Effect.provide(quiet))
  )

  it.scopedLive("each malformed shape is rejected with its reason; the sibling rank stays exact", () =>
    Effect.gen(function* () {
      const rank0 = yield* engine(0)
      const rank1 = yield* engine(1)
      const relay = yield* relayOver([rank0, rank1])
      const own = hashes(0x6000_0000_0000n, 2)
      const sibling: Array<bigint> = []
      yield* rank0.store(own)
      yield* awaitExact(relay, "rank 0's blocks", [own, []])
      const bad = hashes(0x6100_0000_0000n, 4)
      // Tokens of each malformed message's own, and where its block would be if it were indexed.
      const sizeText = tokens(1, 10_000)
      const size8 = tokens(1, 20_000).slice(0, 8)
      const lora = tokens(1, 30_000)
      const badHash = tokens(1, 40_000)
      const wouldBe = [
        ...canonical(sizeText),
        ...canonical(size8, { blockSize: 8 }),
        ...canonical(lora),
        ...canonical(badHash)
      ]
      const shapes: ReadonlyArray<readonly [string, Uint8Array]> = [
        [
          "block-size",
          vllmBatch([vllmStored([bad[0]!], sizeText, BLOCK, { block_size: "16" })], { version: "current" })
        ],
        ["block-size", vllmBatch([vllmStored([bad[0]!], size8, 8)], { version: "current" })],
        [
          // One token that is no u32: no full block whatever a lenient reader made of it.
          "token-ids",
          vllmBatch([vllmStored([bad[1]!], tokens(1), BLOCK, { token_ids: ["x"] })], { version: "current" })
        ],
        ["lora", vllmBatch([vllmStored([bad[1]!], lora, BLOCK, { lora_id: "7" })], { version: "current" })],
        [
          "hash",
          vllmBatch([vllmStored([bad[2]!], badHash, BLOCK, { block_hashes: [new Uint8Array(0)] })], {
            version: "current"
          })
        ],
        // Three tokens for four blocks: not one full block to index.
        ["token-count", vllmBatch([vllmStored(bad, tokens(1).slice(0, 3), BLOCK)], { version: "current" })]
      ]
      for (const [index, [_, payload]] of shapes.entries()) {
        // Sent at the engine's next seq, so the relay sees a malformed message, not a gap.
        yield* rank0.sendRaw(["", u64FrameOf(yield* rank0.nextSeq), payload])
        const blocks = hashes(0x6200_0000_0000n + BigInt(index) * 0x100n, 1)
        sibling.push(...blocks)
        yield* rank1.store(blocks)
      }
      yield* awaitExact(relay, "both ranks after the malformed messages", [own, sibling], wouldBe)
      // Each rank has its own subscription: rank 0's last message may still be on its way.
      const ingest = yield* eventually(
        ingestOf(relay).pipe(Effect.map((i) => i.malformed === shapes.length && i)),
        "every malformed message to be counted"
      )
      expect(ingest.malformedByReason).toEqual({
        "block-size": 2,
        "token-ids": 1,
        lora: 1,
        hash: 1,
        "token-count": 1
      })
      expect(ingest.gaps).toBe(0)
    }).pipe(Effect.provide(quiet))
  )

  it.scopedLive(
    "a replay endpoint that never answers holds back neither a sibling's blocks nor shutdown, and shows as recovering",
    () =>
      Effect.gen(function* () {
        const silent = yield* engine(0, { silentReplay: true })
        const healthy = yield* engine(1)
        const history = hashes(0x6300_0000_0000n, 2)
        yield* healthy.store(history)
        yield* silent.store(hashes(0x6400_0000_0000n, 1))
        // Rank 0's replay attempt outlasts the test: whatever waits for it never finishes here.
        const relay = yield* relayOver([silent, healthy], SILENT_ATTEMPT_MS)
        yield* awaitFilter(relay, VLLM, "the healthy rank's history", addressesAt(relay, 1, history))
        const live = hashes(0x6500_0000_0000n, 2)
        yield* healthy.store(live)
        yield* awaitFilter(
          relay,
          VLLM,
          "the healthy rank's live blocks",
          addressesAt(relay, 1, [...history, ...live])
        )
        // Still inside rank 0's first attempt: the sibling's live blocks did not wait for it.
        expect((yield* silent.stats).replays).toBe(1)
        const health = yield* relay.health
        expect(health).toMatchObject({ healthy: true, sourcesRecovering: 1, sourcesDegraded: 0 })
        const stats = yield* endpointStats(relay, VLLM)
        expect(stats!.recovery.sources.map((s) => [s.dpRank, s.state])).toEqual([
          [0, "recovering"],
          [1, "live"]
        ])
        // Shutdown interrupts the attempt rather than waiting out its ten minutes (disconnected,
        // so that a shutdown stuck behind it fails here rather than holding the bound).
        const stopped = yield* relay.shutdown.pipe(
          Effect.disconnect,
          Effect.timeout("20 seconds"),
          Effect.option
        )
        expect(Option.isSome(stopped), "shutdown waited for the unanswered replay").toBe(true)
      }).pipe(Effect.provide(quiet)),
    30_000
  )

  it.scopedLive(
    "canonically addressed: engines with different block-hash seeds store one prompt at one address; a replayed gap converges",
    () =>
      Effect.gen(function* () {
        const a = yield* engine(0)
        const b = yield* engine(1)
        const relay = yield* relayOver([a, b], 2000, { ckfBuilder: canonicalCkfBuilder })
        yield* awaitExact(relay, "an empty pool", [[], []])
        const prompt = Array.from({ length: 4 * BLOCK + 5 }, (_, i) => 1000 + i)
        const addresses = hashPairsToBigInts(
          sequenceHashes(localBlockHashes(prompt.slice(0, 4 * BLOCK), BLOCK))
        )
        // vLLM seeds its block hashes per process: the two engines name the same blocks differently.
        const externalA = hashes(0x7100_0000_0000n, 4)
        const externalB = hashes(0x7200_0000_0000n, 4)
        yield* a.store(externalA.slice(0, 2), { tokenIds: prompt.slice(0, 2 * BLOCK) })
        yield* a.store(externalA.slice(2), {
          tokenIds: prompt.slice(2 * BLOCK, 4 * BLOCK),
          parentHash: externalA[1]!
        })
        yield* b.store(externalB, { tokenIds: prompt.slice(0, 4 * BLOCK) })
        yield* awaitFilter(relay, VLLM, "the canonical addresses", addresses, [...externalA, ...externalB])
        const both = yield* eventually(
          endpointStats(relay, VLLM).pipe(
            Effect.map((s) => s?.aggregation?.contributionCount === 8 && s.aggregation)
          ),
          "both engines' ownership"
        )
        expect(both.uniqueBlockCount).toBe(4)
        // Removing from one keeps the block; from both drops it.
        yield* a.remove([externalA[3]!])
        yield* awaitFilter(relay, VLLM, "the block b still holds", addresses)
        yield* b.remove([externalB[3]!])
        yield* awaitFilter(relay, VLLM, "the block neither holds", addresses.slice(0, 3), addresses.slice(3))
        // A batch lost on the wire comes back through replay, chained from its parent's lineage.
        const more = Array.from({ length: BLOCK }, (_, i) => 5000 + i)
        const next = hashPairsToBigInts(
          sequenceHashes(localBlockHashes([...prompt.slice(0, 3 * BLOCK), ...more], BLOCK))
        )[3]!
        yield* a.dropNext(1)
        yield* a.store([0x7300_0000_0000n], { tokenIds: more, parentHash: externalA[2]! })
        yield* a.store([0x7300_0000_0001n], {
          tokenIds: more.map((t) => t + 1),
          parentHash: 0x7300_0000_0000n
        })
        yield* awaitFilter(relay, VLLM, "the replayed child at its canonical address", [
          ...addresses.slice(0, 3),
          next
        ])
        expect((yield* ingestOf(relay)).gaps).toBeGreaterThanOrEqual(1)
      }).pipe(Effect.provide(quiet))
  )
})
