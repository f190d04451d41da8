/**
 * Simulated workers run for days (`kvrelay demo`, `kvrelay simulate`): what they keep about
 * blocks must follow what they hold now, not everything they ever stored. Each worker here is
 * driven through many store/evict cycles over real PUB sockets, and its address book, worker
 * query ledger and ring, and replay buffer are counted against its cache afterwards.
 */

import { describe, expect, it } from "@effect/vitest"
import { Effect } from "effect"
import { CanonicalCkfState } from "../../src/ckf/canonical.js"
import { ckfConfig } from "../../src/ckf/config.js"
import type { StorageTier } from "../../src/ckf/events.js"
import { localBlockHashes, sequenceHashes } from "../../src/ckf/tokens.js"
import { hashPairs, hashPairsToBigInts } from "../../src/ckf/u64.js"
import { type RouterEvent, removedEvent, storedEvent } from "../../src/protocol/Events.js"
import { makeDynamoZmqPublisher } from "../../src/simulate/DynamoZmqPublisher.js"
import { makeEngineZmqPublisher } from "../../src/simulate/EngineZmqPublisher.js"
import { defaultTokenIds } from "../../src/simulate/SimulatedAddresses.js"
import { BlockLedger, makeWorkerQueryServer, WORKER_RING_SIZE } from "../../src/simulate/WorkerQueryServer.js"

const BLOCK_SIZE = 16
const CACHE_BLOCKS = 1_000
const STORED_BLOCKS = 200_000
/** Blocks per request: a root batch and a child batch chained from its last block. */
const REQUEST_BLOCKS = 16
const EVICT_BATCH = 32
const REPLAY_BUFFER = 500

/** Distinct block hashes over the u64 range, one per stored block. */
const hashOf = (n: number): bigint => BigInt.asUintN(64, 0x1234_5678n + BigInt(n) * 0x9e37_79b9_7f4a_7c15n)

/** The canonical addresses of `externals` stored with their default tokens, chained from `parent`. */
const expectedAddresses = (externals: ReadonlyArray<bigint>, parent?: bigint): Array<bigint> =>
  hashPairsToBigInts(
    sequenceHashes(localBlockHashes(defaultTokenIds(hashPairs(externals), BLOCK_SIZE), BLOCK_SIZE), parent)
  )

interface Driven {
  readonly store: (hashes: ReadonlyArray<bigint>, parentHash?: bigint) => Effect.Effect<unknown, unknown>
  readonly remove: (hashes: ReadonlyArray<bigint>) => Effect.Effect<unknown, unknown>
}

/**
 * Stores `STORED_BLOCKS` blocks as requests of two chained batches and evicts the oldest beyond
 * `CACHE_BLOCKS`, as the demo's workers do; returns the blocks held at the end, oldest first.
 */
const cycle = (worker: Driven) =>
  Effect.gen(function* () {
    const held: Array<bigint> = []
    let oldest = 0
    for (let next = 0; next < STORED_BLOCKS; next += REQUEST_BLOCKS) {
      const request = Array.from({ length: REQUEST_BLOCKS }, (_, i) => hashOf(next + i))
      const half = REQUEST_BLOCKS / 2
      yield* worker.store(request.slice(0, half))
      yield* worker.store(request.slice(half), request[half - 1]!)
      held.push(...request)
      while (held.length - oldest > CACHE_BLOCKS) {
        const evicted = held.slice(oldest, Math.min(oldest + EVICT_BATCH, held.length - CACHE_BLOCKS))
        oldest += evicted.length
        yield* worker.remove(evicted)
      }
      // Drop the evicted prefix now and then, so the test's own list stays small as well.
      if (oldest > 10 * CACHE_BLOCKS) {
        held.splice(0, oldest)
        oldest = 0
      }
    }
    return held.slice(oldest)
  })

describe("simulated workers over many evict/store cycles", () => {
  it.scoped(
    `a Dynamo-format worker keeps addresses and ledger entries for the ${CACHE_BLOCKS} blocks it holds, not the ${STORED_BLOCKS.toLocaleString("en-US")} it stored`,
    () =>
      Effect.gen(function* () {
        const server = yield* makeWorkerQueryServer({ workerId: "7001", dpRanks: [0] })
        const worker = yield* makeDynamoZmqPublisher({ workerId: "7001", dpRank: 0, queryServer: server })
        const held = yield* cycle({
          store: (hashes, parentHash) => worker.store(hashes, parentHash === undefined ? {} : { parentHash }),
          remove: (hashes) => worker.remove(hashes)
        })
        expect(held.length).toBe(CACHE_BLOCKS)
        expect(yield* worker.nextEventId).toBeGreaterThan(STORED_BLOCKS / REQUEST_BLOCKS)
        expect(worker.addressCount()).toBe(held.length)
        expect(server.ledger(0)!.size).toBe(held.length)
        expect(server.ringLength(0)).toBeLessThanOrEqual(WORKER_RING_SIZE)

        // A child batch chained from a held parent still gets its canonical address.
        const lastRequest = held.slice(-REQUEST_BLOCKS)
        const rootAddresses = expectedAddresses(lastRequest.slice(0, REQUEST_BLOCKS / 2))
        expect(lastRequest.map(worker.addressOf)).toEqual([
          ...rootAddresses,
          ...expectedAddresses(lastRequest.slice(REQUEST_BLOCKS / 2), rootAddresses.at(-1))
        ])
        // An evicted block has none any more.
        expect(() => worker.addressOf(hashOf(0))).toThrow(/not held/)

        yield* worker.clear
        expect(worker.addressCount()).toBe(0)
        expect(server.ledger(0)!.size).toBe(0)
        yield* worker.store(held.slice(0, 4))
        yield* worker.restart()
        expect(worker.addressCount()).toBe(0)
        expect(server.ledger(0)!.size).toBe(0)
      }),
    120_000
  )

  for (const format of ["vllm", "sglang"] as const) {
    it.scoped(
      `a ${format} engine keeps addresses for the blocks it holds and at most its replay buffer of batches`,
      () =>
        Effect.gen(function* () {
          const engine = yield* makeEngineZmqPublisher({
            workerId: "8001",
            dpRank: 0,
            format,
            blockSize: BLOCK_SIZE,
            bufferSteps: REPLAY_BUFFER
          })
          const held = yield* cycle({
            store: (hashes, parentHash) =>
              engine.store(hashes, parentHash === undefined ? {} : { parentHash }),
            remove: (hashes) => engine.remove(hashes)
          })
          expect(held.length).toBe(CACHE_BLOCKS)
          expect(yield* engine.nextSeq).toBeGreaterThan(STORED_BLOCKS / REQUEST_BLOCKS)
          expect(engine.addressCount()).toBe(held.length)
          expect(engine.bufferedBatches()).toBe(REPLAY_BUFFER)

          const lastRequest = held.slice(-REQUEST_BLOCKS)
          const rootAddresses = expectedAddresses(lastRequest.slice(0, REQUEST_BLOCKS / 2))
          expect(lastRequest.map(engine.addressOf)).toEqual([
            ...rootAddresses,
            ...expectedAddresses(lastRequest.slice(REQUEST_BLOCKS / 2), rootAddresses.at(-1))
          ])
          expect(() => engine.addressOf(hashOf(0))).toThrow(/not held/)

          // A block held on the host tier as well keeps its address until the device lets it go.
          const both = held.at(-1)!
          const address = engine.addressOf(both)
          yield* engine.store([both], { storageTier: "host_pinned", parentHash: held.at(-2)! })
          yield* engine.remove([both])
          expect(engine.addressOf(both)).toBe(address)
          yield* engine.remove([both], "CPU_PINNED")
          expect(() => engine.addressOf(both)).toThrow(/not held/)

          yield* engine.clear
          expect(engine.addressCount()).toBe(0)
          yield* engine.store(held.slice(0, 4))
          expect(engine.addressCount()).toBe(4)
          yield* engine.restart()
          expect(engine.addressCount()).toBe(0)
          expect(engine.bufferedBatches()).toBe(0)
        }),
      120_000
    )
  }
})

describe("a simulated Dynamo worker's tree dump keeps the lower tiers (PROTOCOL §5.1 ◆3)", () => {
  it("a rank replaced from the dump answers worker queries as the rank that stored the events", () => {
    const prompt = Array.from({ length: 6 * BLOCK_SIZE }, (_, i) => 500 + i)
    const local = localBlockHashes(prompt, BLOCK_SIZE)
    const localBig = hashPairsToBigInts(local)
    const ext = (i: number) => 0x7000n + BigInt(i)
    const stored = (eventId: number, from: number, to: number, tier: StorageTier): RouterEvent =>
      storedEvent(
        "9",
        0,
        eventId,
        Array.from({ length: to - from }, (_, i) => ext(from + i)),
        {
          tokensHashes: localBig.slice(from, to),
          ...(from === 0 ? {} : { parentHash: ext(from - 1) }),
          storageTier: tier
        }
      )
    // Six blocks on the device; blocks 3-5 offloaded to the host, 5 to disk, then 3-5 evicted
    // from the device; an orphan host block whose parent the rank never held is left out.
    const events: Array<RouterEvent> = [
      stored(1, 0, 6, "device"),
      stored(2, 3, 6, "host_pinned"),
      stored(3, 5, 6, "disk"),
      removedEvent("9", 0, 4, [ext(3), ext(4), ext(5)]),
      storedEvent("9", 0, 5, [0x9999n], {
        tokensHashes: [1n],
        parentHash: 0x8888n,
        storageTier: "host_pinned"
      })
    ]
    const ledger = new BlockLedger()
    const live = new CanonicalCkfState(ckfConfig(256))
    for (const event of events) {
      ledger.apply(event)
      if (event.eventId !== 5) live.applyEvent(event)
    }
    expect(ledger.size).toBe(3)
    expect(ledger.lowerSize("host_pinned")).toBe(4)
    const dump = ledger.dump("9", 0)
    expect(dump.map((e) => e.storageTier)).toEqual(["device", "host_pinned", "disk"])
    const replaced = new CanonicalCkfState(ckfConfig(256))
    expect(replaced.replaceRanksFromEvents([{ workerId: "9", dpRank: 0, events: dump }])).not.toBeInstanceOf(
      Error
    )
    const addresses = sequenceHashes(local)
    const answer = (state: CanonicalCkfState) => {
      const r = state.queryWorkers(addresses)
      return [Array.from(r.device), Array.from(r.host), Array.from(r.disk), Array.from(r.frequencies)]
    }
    expect(answer(replaced)).toEqual([[3], [6], [6], [1, 1, 1]])
    expect(answer(replaced)).toEqual(answer(live))
    expect(replaced.memberTierCounts()).toEqual([
      { workerId: "9", dpRank: 0, blocks: 3, hostBlocks: 3, diskBlocks: 1 }
    ])
  })
})
