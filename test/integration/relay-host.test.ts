/**
 * The relay host end to end: file discovery (a document the test rewrites), real ZeroMQ
 * publishers on 127.0.0.1 (simulated Dynamo workers with a worker-query server, simulated vLLM
 * engines with a replay endpoint), and the relay's own surfaces: catalog, diagnostic snapshots,
 * pool streams (CBI1 frames decoded and checked against the CKF addressing), stats and flush.
 * Every wait polls with a bounded real deadline.
 */

import { describe, expect, it } from "@effect/vitest"
import { Deferred, Effect, Either, Exit, type Scope, Stream, SubscriptionRef } from "effect"
import { Cbi1Error, Cbi1SnapshotAssembler, decodeCbi1 } from "../../src/ckf/cbi1.js"
import type { DcCkfFormatIdentity, ProducerIdentity } from "../../src/ckf/identity.js"
import type { KvEventSource } from "../../src/protocol/Discovery.js"
import type { EndpointId } from "../../src/protocol/Model.js"
import type { KvDcRelayService } from "../../src/relay/KvDcRelay.js"
import type { PublicationFrame } from "../../src/relay/PublicationSource.js"
import type { PublicationError } from "../../src/relay/RelayErrors.js"
import { type DynamoZmqPublisher, makeDynamoZmqPublisher } from "../../src/simulate/DynamoZmqPublisher.js"
import { makeEngineZmqPublisher } from "../../src/simulate/EngineZmqPublisher.js"
import { makeWorkerQueryServer } from "../../src/simulate/WorkerQueryServer.js"
import { awaitCatalog, discoveryFile } from "../relay/hostFixtures.js"
import {
  addressesBy,
  awaitFilter,
  contains,
  endpointStats,
  hashes,
  memberBlocks,
  poolOf,
  quiet,
  ROUTER,
  routerCard,
  startRelay,
  VLLM,
  vllmCard
} from "./relayHostFixtures.js"
import { eventually } from "./zmqHelpers.js"

/** PROTOCOL §2's verified identity vectors. */
const CACHE_SEMANTICS = "7d31eb9019357572470605f4a8be687e"
const ROUTING_SCOPE = "18270d3ba03effaec8d167ba02c7752d"
const TEST_DC_ID = "49861458b11c53ec"

// ---------------------------------------------------------------------------------------------
// A pool stream decoded into a filter mirror

interface StreamMirror {
  /** The mirror once the snapshot is complete (then kept current by the deltas). */
  readonly words: () => Uint32Array | undefined
  readonly sequence: () => bigint
  /** Completes with the stream's end: Right on a clean end, Left with its error. */
  readonly ended: Deferred.Deferred<Either.Either<void, PublicationError>>
}

const openMirror = (
  relay: KvDcRelayService,
  producer: ProducerIdentity
): Effect.Effect<StreamMirror, PublicationError, Scope.Scope> =>
  Effect.gen(function* () {
    const stream = yield* relay.subscribePool(producer, "relay-host-test")
    const expected = { format: producer.format, dcId: producer.poolId.dcId.value }
    const assembler = new Cbi1SnapshotAssembler(expected)
    let words: Uint32Array | undefined
    let sequence = 0n
    const ended = yield* Deferred.make<Either.Either<void, PublicationError>>()
    const apply = (frame: PublicationFrame) =>
      Effect.sync(() => {
        expect(frame.identity.equals(producer)).toBe(true)
        const decoded = decodeCbi1(frame.payload, expected)
        if (decoded instanceof Cbi1Error) throw decoded
        if (decoded._tag === "SnapshotChunk") {
          expect(frame.kind).toBe("SnapshotChunk")
          const assembled = assembler.push(decoded)
          if (assembled instanceof Cbi1Error) throw assembled
          if (assembled !== undefined) {
            words = assembled.words
            sequence = assembled.epoch
          }
          return
        }
        expect(frame.kind).toBe("Delta")
        expect(words).toBeDefined()
        expect(decoded.baseEpoch).toBe(sequence)
        expect(decoded.epoch).toBe(sequence + 1n)
        const images = decoded.images
        for (let i = 0; i < images.length; i += 3) {
          words![2 * images[i]!] = images[i + 1]!
          words![2 * images[i]! + 1] = images[i + 2]!
        }
        sequence = decoded.epoch
      })
    yield* stream.pipe(
      Stream.runForEach(apply),
      Effect.either,
      Effect.flatMap((result) => Deferred.succeed(ended, result)),
      Effect.forkScoped
    )
    return { words: () => words, sequence: () => sequence, ended }
  })

const mirrorHolds = (mirror: StreamMirror, format: DcCkfFormatIdentity, hashes: ReadonlyArray<bigint>) =>
  Effect.sync(() => {
    const words = mirror.words()
    return words !== undefined && hashes.every((hash) => contains(words, format, hash))
  })

// ---------------------------------------------------------------------------------------------
// Workers

interface DynamoWorker {
  readonly publisher: DynamoZmqPublisher
  readonly source: Effect.Effect<KvEventSource>
}

const dynamoWorker = (workerId: string, kvStateEndpoint: EndpointId) =>
  Effect.gen(function* () {
    const server = yield* makeWorkerQueryServer({ workerId, dpRanks: [0] })
    const publisher = yield* makeDynamoZmqPublisher({ workerId, dpRank: 0, queryServer: server })
    return { publisher, source: publisher.source(kvStateEndpoint) } satisfies DynamoWorker
  }).pipe(Effect.orDie)

describe("relay host over file discovery and ZeroMQ", () => {
  it.scopedLive("catalog identities, visible and removed blocks, pool streams and a recovered gap", () =>
    Effect.gen(function* () {
      const worker = yield* dynamoWorker("7001", ROUTER)
      // Published before the relay exists: only the initial restore (a tree dump) can bring it.
      const early = hashes(0x1111_0000_0000n, 3)
      yield* worker.publisher.store(early)
      const file = yield* discoveryFile([routerCard("7001")], [yield* worker.source])
      const relay = yield* startRelay(file)

      const pool = yield* poolOf(relay, ROUTER, "the router pool")
      const poolId = pool.producer.poolId
      expect(poolId.indexerDomain.cacheSemantics.toString()).toBe(CACHE_SEMANTICS)
      expect(poolId.indexerDomain.routingScope.toString()).toBe(ROUTING_SCOPE)
      expect(poolId.indexerDomain.cacheSemantics.source).toBe("default_derived")
      expect(poolId.dcId.toString()).toBe(TEST_DC_ID)
      expect(relay.dcId.toString()).toBe(TEST_DC_ID)
      expect(pool.producer.producerIncarnation).toBe(relay.identity.relayIncarnation)
      expect(pool.producer.layoutGeneration).toBe(1n)
      expect(pool.querySemantics.kvBlockSize).toBe(512)
      expect(pool.querySemantics.hashFormat).toBe("dynamo_standard_v1")
      expect(pool.registrations.map((r) => [r.model, r.aliases])).toEqual([["llama", ["chat"]]])
      expect(pool.poolRoles).toEqual(["aggregated"])

      // The filter holds canonical addresses (PROTOCOL §3.3): what a router computes from tokens.
      const A = addressesBy(worker.publisher)
      yield* awaitFilter(relay, ROUTER, "the tree-dumped blocks", A(early))
      const live = hashes(0x2222_0000_0000n, 4)
      yield* worker.publisher.store(live)
      yield* awaitFilter(relay, ROUTER, "the live blocks", A([...early, ...live]))

      // A pool stream starts with the snapshot and follows with deltas.
      const mirror = yield* openMirror(relay, pool.producer).pipe(Effect.orDie)
      yield* eventually(
        mirrorHolds(mirror, pool.producer.format, A([...early, ...live])),
        "the stream snapshot"
      )
      const streamed = hashes(0x3333_0000_0000n, 2)
      yield* worker.publisher.store(streamed)
      yield* relay.flush.pipe(Effect.orDie)
      yield* eventually(mirrorHolds(mirror, pool.producer.format, A(streamed)), "the stream delta")

      // Removed blocks leave the filter (and the stream's mirror).
      yield* worker.publisher.remove([live[0]!, live[1]!])
      const kept = [...early, live[2]!, live[3]!, ...streamed]
      const snapshot = yield* awaitFilter(relay, ROUTER, "the removal", A(kept), A([live[0]!, live[1]!]))
      yield* eventually(
        Effect.sync(() => {
          const words = mirror.words()!
          return (
            !contains(words, pool.producer.format, A([live[0]!])[0]!) &&
            mirror.sequence() >= snapshot.sequence
          )
        }),
        "the removal on the stream"
      )

      // A message lost on the wire: the gap is recovered from the worker's query server.
      const lost = hashes(0x4444_0000_0000n, 2)
      const after = hashes(0x5555_0000_0000n, 2)
      yield* worker.publisher.dropNext(1)
      yield* worker.publisher.store(lost)
      yield* worker.publisher.store(after)
      yield* awaitFilter(relay, ROUTER, "the recovered gap", A([...kept, ...lost, ...after]), A([live[0]!]))

      const stats = yield* endpointStats(relay, ROUTER)
      expect(stats?.lifecycle).toBe("active")
      expect(stats?.ingest.gaps).toBeGreaterThanOrEqual(1)
      expect(stats?.ingest.recoveries).toBeGreaterThanOrEqual(2)
      expect(stats?.ingest.malformed).toBe(0)
      // live, streamed, the removal and the message after the gap (the lost one never arrived)
      expect(stats?.ingest.events).toBeGreaterThanOrEqual(4)
      expect(memberBlocks(stats, "7001")).toBe(kept.length + lost.length + after.length)
      expect(yield* relay.health).toEqual({
        healthy: true,
        shuttingDown: false,
        endpointCount: 1,
        activeEndpointCount: 1,
        fencedEndpointCount: 0,
        sourcesRecovering: 0,
        sourcesDegraded: 0,
        sources: { expected: 1, connecting: 0, live: 1, recovering: 0, degraded: 0, rejected: 0 },
        discovery: { state: "live", since: expect.any(Date) }
      })
    }).pipe(Effect.provide(quiet))
  )

  it.scopedLive(
    "an engine with replay: its pool appears, a lost batch is replayed, AllBlocksCleared clears only its rank",
    () =>
      Effect.gen(function* () {
        const rank0 = yield* makeEngineZmqPublisher({ workerId: "8001", dpRank: 0, format: "vllm" })
        const rank1 = yield* makeEngineZmqPublisher({ workerId: "8001", dpRank: 1, format: "vllm" })
        const first0 = hashes(0x6100_0000_0000n, 3)
        yield* rank0.store(first0)
        const file = yield* discoveryFile(
          [vllmCard("8001")],
          [yield* rank0.source(VLLM), yield* rank1.source(VLLM)]
        )
        const relay = yield* startRelay(file)
        const pool = yield* poolOf(relay, VLLM, "the vllm pool")
        expect(pool.querySemantics.kvBlockSize).toBe(16)
        expect(pool.registrations.map((r) => r.model)).toEqual(["mistral"])

        const R0 = addressesBy(rank0)
        const R1 = addressesBy(rank1)
        yield* awaitFilter(relay, VLLM, "the replayed history", R0(first0))
        const first1 = hashes(0x6200_0000_0000n, 3)
        yield* rank1.store(first1)
        yield* awaitFilter(relay, VLLM, "rank 1's blocks", [...R0(first0), ...R1(first1)])

        // A batch lost on the wire is replayed from the engine's replay endpoint.
        const lost = hashes(0x6300_0000_0000n, 2)
        const next = hashes(0x6400_0000_0000n, 2)
        yield* rank0.dropNext(1)
        yield* rank0.store(lost)
        yield* rank0.store(next)
        yield* awaitFilter(relay, VLLM, "the replayed batch", [
          ...R0([...first0, ...lost, ...next]),
          ...R1(first1)
        ])

        yield* rank1.clear
        yield* awaitFilter(relay, VLLM, "rank 1 cleared", R0([...first0, ...lost, ...next]), R1(first1))
        const stats = yield* endpointStats(relay, VLLM)
        expect(memberBlocks(stats, "8001", 0)).toBe(first0.length + lost.length + next.length)
        expect(memberBlocks(stats, "8001", 1) ?? 0).toBe(0)
        expect(stats?.ingest.gaps).toBeGreaterThanOrEqual(1)
      }).pipe(Effect.provide(quiet))
  )

  it.scopedLive(
    "a worker joining through the file appears, Cleared clears only its rank, removing the cards withdraws the pool and ends its streams",
    () =>
      Effect.gen(function* () {
        const a = yield* dynamoWorker("7001", ROUTER)
        const b = yield* dynamoWorker("7002", ROUTER)
        const file = yield* discoveryFile([routerCard("7001")], [yield* a.source])
        const relay = yield* startRelay(file)
        const pool = yield* poolOf(relay, ROUTER, "the router pool")
        const blocksA = hashes(0x7100_0000_0000n, 3)
        yield* a.publisher.store(blocksA)
        const A = addressesBy(a.publisher)
        const B = addressesBy(b.publisher)
        yield* awaitFilter(relay, ROUTER, "worker A's blocks", A(blocksA))

        const blocksB = hashes(0x7200_0000_0000n, 3)
        yield* b.publisher.store(blocksB)
        yield* file.write([routerCard("7001"), routerCard("7002")], [yield* a.source, yield* b.source])
        yield* awaitFilter(relay, ROUTER, "the joining worker's blocks", [...A(blocksA), ...B(blocksB)])
        const joined = yield* endpointStats(relay, ROUTER)
        expect(memberBlocks(joined, "7002")).toBe(blocksB.length)
        // Same generation: a joining worker does not replace the producer.
        expect((yield* SubscriptionRef.get(relay.catalogRef)).pools[0]!.producer.equals(pool.producer)).toBe(
          true
        )

        yield* b.publisher.clear
        yield* awaitFilter(relay, ROUTER, "worker B cleared", A(blocksA), B(blocksB))
        expect(memberBlocks(yield* endpointStats(relay, ROUTER), "7001")).toBe(blocksA.length)

        const mirror = yield* openMirror(relay, pool.producer).pipe(Effect.orDie)
        yield* eventually(mirrorHolds(mirror, pool.producer.format, A(blocksA)), "the stream snapshot")
        yield* file.write([], [])
        yield* awaitCatalog(
          relay.catalogRef,
          "the pool's withdrawal",
          (catalog) => catalog.pools.length === 0
        )
        const ended = yield* Deferred.await(mirror.ended).pipe(Effect.timeout("5 seconds"), Effect.orDie)
        if (Either.isLeft(ended)) expect(ended.left.kind).toBe("Unavailable")
        yield* eventually(
          relay.health.pipe(Effect.map((h) => h.endpointCount === 0)),
          "the slot's retirement"
        )
        const reopened = yield* Effect.exit(openMirror(relay, pool.producer))
        expect(Exit.isFailure(reopened)).toBe(true)
      }).pipe(Effect.provide(quiet))
  )

  it.scopedLive("garbage ZeroMQ frames are counted in stats and do not disturb other sources", () =>
    Effect.gen(function* () {
      const noisy = yield* dynamoWorker("7001", ROUTER)
      const quietWorker = yield* makeEngineZmqPublisher({ workerId: "8001", dpRank: 0, format: "vllm" })
      const file = yield* discoveryFile(
        [routerCard("7001"), vllmCard("8001")],
        [yield* noisy.source, yield* quietWorker.source(VLLM)]
      )
      const relay = yield* startRelay(file)
      yield* poolOf(relay, ROUTER, "the router pool")
      yield* poolOf(relay, VLLM, "the vllm pool")
      const before = hashes(0x8100_0000_0000n, 2)
      yield* noisy.publisher.store(before)
      const N = addressesBy(noisy.publisher)
      yield* awaitFilter(relay, ROUTER, "the first blocks", N(before))

      const garbage: ReadonlyArray<ReadonlyArray<Uint8Array | string>> = [
        ["kv-events", Buffer.from([1, 2, 3])],
        ["kv-events", Buffer.alloc(3), Buffer.alloc(8), Buffer.from([1, 0, 0, 0, 9])],
        ["kv-events", Buffer.alloc(8), Buffer.alloc(8), Buffer.from([7, 0, 0, 0, 0])],
        ["kv-events", Buffer.alloc(8), Buffer.alloc(8), Buffer.from([1, 0, 0, 0, 4, 0xc1, 0xc1, 0xc1, 0xc1])]
      ]
      yield* eventually(
        Effect.gen(function* () {
          for (const frames of garbage) yield* noisy.publisher.sendRaw(frames).pipe(Effect.orDie)
          const stats = yield* endpointStats(relay, ROUTER)
          return (stats?.ingest.malformed ?? 0) >= garbage.length
        }),
        "the garbage to be counted"
      )

      // The noisy source and its neighbour both keep applying.
      const afterNoise = hashes(0x8200_0000_0000n, 2)
      yield* noisy.publisher.store(afterNoise)
      const engineBlocks = hashes(0x8300_0000_0000n, 2)
      yield* quietWorker.store(engineBlocks)
      yield* awaitFilter(relay, ROUTER, "blocks after the garbage", N([...before, ...afterNoise]))
      yield* awaitFilter(relay, VLLM, "the neighbour's blocks", addressesBy(quietWorker)(engineBlocks))
      expect((yield* endpointStats(relay, VLLM))?.ingest.malformed).toBe(0)
      expect((yield* relay.health).healthy).toBe(true)
    }).pipe(Effect.provide(quiet))
  )

  it.scopedLive("shutdown clears the catalog, drains every slot and is idempotent", () =>
    Effect.gen(function* () {
      const worker = yield* dynamoWorker("7001", ROUTER)
      const file = yield* discoveryFile([routerCard("7001")], [yield* worker.source])
      const relay = yield* startRelay(file)
      const pool = yield* poolOf(relay, ROUTER, "the router pool")
      const mirror = yield* openMirror(relay, pool.producer).pipe(Effect.orDie)
      yield* eventually(
        Effect.sync(() => mirror.words() !== undefined),
        "the stream snapshot"
      )
      yield* relay.shutdown
      yield* relay.shutdown
      const catalog = yield* SubscriptionRef.get(relay.catalogRef)
      expect(catalog.pools).toEqual([])
      expect(catalog.revision).toBeGreaterThan(pool.producer.layoutGeneration)
      expect(yield* relay.health).toMatchObject({ healthy: false, shuttingDown: true, endpointCount: 0 })
      yield* Deferred.await(mirror.ended).pipe(Effect.timeout("5 seconds"), Effect.orDie)
      // Nothing is materialized any more: nothing to publish.
      yield* relay.flush
    }).pipe(Effect.provide(quiet))
  )
})
