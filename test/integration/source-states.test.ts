/**
 * Source states (PROTOCOL §5 ◆3) over real sockets: the relay host on a discovery file. A source
 * whose endpoint is closed or speaks another protocol is `connecting` (and counted) until a
 * publisher answers there, with no restart; a Dynamo source rejected for a protocol fault is
 * `rejected`, with the fault, until its membership generation advances.
 */

import * as http from "node:http"
import * as net from "node:net"
import { describe, expect, it } from "@effect/vitest"
import { Effect } from "effect"
import type { KvEventSource } from "../../src/protocol/Discovery.js"
import type { KvDcRelayService } from "../../src/relay/KvDcRelay.js"
import { makeDynamoZmqPublisher } from "../../src/simulate/DynamoZmqPublisher.js"
import { makeEngineZmqPublisher } from "../../src/simulate/EngineZmqPublisher.js"
import { makeWorkerQueryServer } from "../../src/simulate/WorkerQueryServer.js"
import { discoveryFile } from "../relay/hostFixtures.js"
import {
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

/** A port nothing listens on (bound once, then closed). */
const closedPort = Effect.promise(
  () =>
    new Promise<number>((resolve) => {
      const server = net.createServer()
      server.listen(0, "127.0.0.1", () => {
        const { port } = server.address() as net.AddressInfo
        server.close(() => resolve(port))
      })
    })
)

/** An HTTP server on its own port: what a mistyped metrics or API port answers. */
const httpServer = Effect.acquireRelease(
  Effect.promise(
    () =>
      new Promise<http.Server>((resolve) => {
        const server = http.createServer((_, res) => res.end("not ZeroMQ"))
        server.listen(0, "127.0.0.1", () => resolve(server))
      })
  ),
  (server) =>
    Effect.promise(
      () =>
        new Promise<void>((resolve) => {
          server.closeAllConnections()
          server.close(() => resolve())
        })
    )
)

const closeServer = (server: http.Server) =>
  Effect.promise(
    () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections()
        server.close(() => resolve())
      })
  )

const engineSource = (dpRank: number, port: number, publisherId: bigint): KvEventSource => ({
  kvStateEndpoint: VLLM,
  workerId: "8101",
  dpRank,
  publisherId,
  transport: { kind: "engine-zmq", endpoint: `tcp://127.0.0.1:${port}`, topic: "", replayEndpoint: null },
  recoveryTarget: null
})

const sourcesOf = (relay: KvDcRelayService, serving = VLLM) =>
  endpointStats(relay, serving).pipe(Effect.map((stats) => stats?.sources ?? []))

describe("source states over real sockets (PROTOCOL §5 ◆3)", () => {
  it.scopedLive(
    "a closed port and an HTTP port are connecting, counted and explained; publishers there make them live with no restart",
    () =>
      Effect.gen(function* () {
        const closed = yield* closedPort
        const web = yield* httpServer
        const webPort = (web.address() as net.AddressInfo).port
        const file = yield* discoveryFile(
          [vllmCard("8101")],
          [engineSource(0, closed, 901n), engineSource(1, webPort, 902n)]
        )
        const relay = yield* startRelay(file)
        yield* poolOf(relay, VLLM, "the vllm pool")

        const connecting = yield* eventually(
          sourcesOf(relay).pipe(
            Effect.map(
              (sources) =>
                sources.length === 2 &&
                sources.every((s) => s.state === "connecting" && s.reason !== undefined) &&
                // Both have failed at least once, so each says why.
                sources.every((s) => s.reason !== "no connection to the publisher yet") &&
                sources
            )
          ),
          "both sources connecting, each with its reason",
          5000
        )
        const reasons = Object.fromEntries(connecting.map((s) => [s.dpRank, s.reason]))
        expect(reasons[0]).toMatch(/ECONNREFUSED/)
        expect(reasons[1]).toMatch(/greeting/)
        const health = yield* relay.health
        expect(health.sources).toEqual({
          expected: 2,
          connecting: 2,
          live: 0,
          recovering: 0,
          degraded: 0,
          rejected: 0
        })

        // The engines start on those very ports; the relay connects on its own retries.
        yield* closeServer(web)
        const rank0 = yield* makeEngineZmqPublisher({
          workerId: "8101",
          dpRank: 0,
          format: "vllm",
          endpoint: `tcp://127.0.0.1:${closed}`,
          replayEndpoint: null,
          publisherId: 901n
        })
        const rank1 = yield* makeEngineZmqPublisher({
          workerId: "8101",
          dpRank: 1,
          format: "sglang",
          endpoint: `tcp://127.0.0.1:${webPort}`,
          replayEndpoint: null,
          publisherId: 902n
        })
        yield* eventually(
          relay.health.pipe(Effect.map((h) => h.sources.live === 2 && h.sources.connecting === 0)),
          "both sources live",
          15_000
        )
        // And they are followed: a block from each is indexed.
        yield* rank0.store(hashes(0x6100_0000_0000n, 2))
        yield* rank1.store(hashes(0x6200_0000_0000n, 3))
        yield* eventually(
          endpointStats(relay, VLLM).pipe(
            Effect.map(
              (stats) => memberBlocks(stats, "8101", 0) === 2 && memberBlocks(stats, "8101", 1) === 3
            )
          ),
          "both ranks' blocks indexed"
        )
      }).pipe(Effect.provide(quiet))
  )

  it.scopedLive(
    "a burst of faulty events fills the actor's fault queue: the source is rejected once, and the relay keeps answering and shuts down",
    () =>
      Effect.gen(function* () {
        const queryServer = yield* makeWorkerQueryServer({ workerId: "8301", dpRanks: [0] })
        const publisher = yield* makeDynamoZmqPublisher({
          workerId: "8301",
          dpRank: 0,
          queryServer,
          blockSize: 512
        })
        const file = yield* discoveryFile([routerCard("8301")], [yield* publisher.source(ROUTER)])
        const relay = yield* startRelay(file)
        yield* poolOf(relay, ROUTER, "the router pool")
        yield* eventually(
          relay.health.pipe(Effect.map((h) => h.sources.live === 1)),
          "the source live",
          15_000
        )
        // Far more faulty events than the actor's 16-fault queue holds, sent faster than its owner
        // handles the first: the actor waits to hand over the 17th.
        for (let i = 0; i < 100; i++)
          yield* publisher.store(hashes(0x7400_0000_0000n + BigInt(i) * 7n, 1), {
            parentHash: 0x7eee_0000_0001n + BigInt(i)
          })
        yield* eventually(
          sourcesOf(relay, ROUTER).pipe(Effect.map((sources) => sources[0]?.state === "rejected")),
          "the source rejected",
          15_000
        )
        // The actor answers: stats go through its mailbox. Bounded, since a frozen actor never would.
        const stats = yield* relay.stats.pipe(Effect.timeout("20 seconds"), Effect.either)
        expect(stats._tag).toBe("Right")
        const shutdown = yield* relay.shutdown.pipe(Effect.timeout("20 seconds"), Effect.either)
        expect(shutdown._tag).toBe("Right")
      }).pipe(Effect.provide(quiet)),
    90_000
  )

  it.scopedLive(
    "a Dynamo source rejected for a protocol fault is rejected, with its reason, until its generation advances",
    () =>
      Effect.gen(function* () {
        const queryServer = yield* makeWorkerQueryServer({ workerId: "8201", dpRanks: [0] })
        const publisher = yield* makeDynamoZmqPublisher({
          workerId: "8201",
          dpRank: 0,
          queryServer,
          blockSize: 512
        })
        const file = yield* discoveryFile([routerCard("8201")], [yield* publisher.source(ROUTER)])
        const relay = yield* startRelay(file)
        yield* poolOf(relay, ROUTER, "the router pool")
        yield* eventually(
          relay.health.pipe(Effect.map((h) => h.sources.live === 1)),
          "the Dynamo source live",
          15_000
        )
        // A block whose parent the rank never stored: a protocol fault for a Dynamo source.
        yield* publisher.store(hashes(0x7100_0000_0000n, 1), { parentHash: 0x7fff_0000_0001n })
        const rejected = yield* eventually(
          sourcesOf(relay, ROUTER).pipe(
            Effect.map((sources) => sources.length === 1 && sources[0]!.state === "rejected" && sources[0]!)
          ),
          "the source rejected",
          15_000
        )
        expect(rejected.reason).toBe("parent block not found")
        expect(rejected.history).toBe("complete")
        expect((yield* relay.health).sources).toMatchObject({ expected: 1, rejected: 1, live: 0 })
        // It stays rejected: a later, valid event does not bring it back.
        yield* publisher.store(hashes(0x7200_0000_0000n, 1))
        const stillRejected = yield* sourcesOf(relay, ROUTER)
        expect(stillRejected.map((s) => s.state)).toEqual(["rejected"])

        // A new incarnation advertised (the membership generation advances) is followed again.
        yield* publisher.restart()
        yield* file.write([routerCard("8201")], [yield* publisher.source(ROUTER)])
        yield* eventually(
          sourcesOf(relay, ROUTER).pipe(
            Effect.map(
              (sources) =>
                sources.length === 1 && sources[0]!.state === "live" && sources[0]!.reason === undefined
            )
          ),
          "the new incarnation live",
          15_000
        )
        const fresh = hashes(0x7300_0000_0000n, 2)
        yield* publisher.store(fresh)
        yield* eventually(
          endpointStats(relay, ROUTER).pipe(Effect.map((stats) => memberBlocks(stats, "8201") === 2)),
          "the new incarnation's blocks"
        )
      }).pipe(Effect.provide(quiet))
  )
})
