/**
 * End to end over real sockets: two real relays (registry, publication source, relay HTTP server)
 * for DCs "east" and "west", the global consumer subscribed to both over HTTP, and its own HTTP
 * API queried with `fetch`.
 */

import { describe, expect, it } from "@effect/vitest"
import { Effect, Logger, LogLevel, type Scope } from "effect"
import { CkfAddressing } from "../../src/ckf/addressing.js"
import { hiOf, loOf } from "../../src/ckf/u64.js"
import { blockHashes, converged, depthsOf, eventually, startConsumer } from "./consumerHarness.js"
import { domainOf } from "./fakeRelay.js"
import { KV_BLOCK_SIZE, startDcRelay, startStoppableRelay } from "./realRelay.js"

const live = <A, E>(name: string, body: () => Effect.Effect<A, E, Scope.Scope>, timeout = 20_000) =>
  it.scopedLive(name, () => body().pipe(Logger.withMinimumLogLevel(LogLevel.Error)), timeout)

const DOMAIN = domainOf(1)

const postOverlap = (url: string, body: unknown) =>
  Effect.promise(async () => {
    const response = await fetch(`${url}/v1/overlap`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify(body)
    })
    return { status: response.status, json: (await response.json()) as Record<string, unknown> }
  })

const getJson = (url: string, path: string) =>
  Effect.promise(async () => {
    const response = await fetch(`${url}${path}`)
    const text = await response.text()
    return { status: response.status, text, contentType: response.headers.get("content-type") }
  })

const decimal = (hashes: ReadonlyArray<bigint>) => hashes.map(String)

describe("global consumer against real relays", () => {
  live(
    "answers the prefix depth per DC for shared, single-DC and unknown prompts; a cleared rank drops it",
    () =>
      Effect.gen(function* () {
        const east = yield* startDcRelay("east")
        const west = yield* startDcRelay("west")
        const eastPool = yield* east.attach(DOMAIN, "prod.backend.generate")
        const westPool = yield* west.attach(DOMAIN, "prod.backend.generate")
        const shared = blockHashes(1, 24)
        const eastOnly = blockHashes(2, 10)
        const nowhere = blockHashes(3, 8)
        yield* eastPool.store("1", shared)
        yield* westPool.store("7", shared)

        const { consumer, view, url } = yield* startConsumer([
          { name: "east", url: east.url },
          { name: "west", url: west.url }
        ])
        // Published after the snapshot: arrives as a delta over the stream.
        yield* eastPool.store("2", eastOnly)
        yield* eventually(
          "both lanes converge",
          Effect.zipWith(
            converged(consumer, "east", eastPool),
            converged(consumer, "west", westPool),
            (a, b) => a && b
          )
        )

        const ask = (blocks: ReadonlyArray<bigint>) =>
          depthsOf(view.overlapNow({ namespace: "prod", model: "llama", localBlockHashes: blocks }))
        expect(ask(shared)).toEqual({ east: 24, west: 24 })
        expect(ask([...shared.slice(0, 9), ...nowhere])).toEqual({ east: 9, west: 9 })
        expect(ask(eastOnly)).toEqual({ east: 10, west: 0 })
        expect(ask(nowhere)).toEqual({ east: 0, west: 0 })

        // The same through the HTTP API, with u64 text and JSON numbers mixed.
        const answer = yield* postOverlap(url, {
          namespace: "prod",
          model: "chat",
          localBlockHashes: [...decimal(eastOnly.slice(0, 4)), 12345, ...decimal(eastOnly.slice(4))]
        })
        expect(answer.status).toBe(200)
        const results = answer.json.results as Array<Record<string, unknown>>
        expect(results.map((r) => [r.relay, r.lane, r.prefixDepth, r.matchedTokens])).toEqual([
          ["east", 0, 4, 4 * KV_BLOCK_SIZE],
          ["west", 1, 0, 0]
        ])
        expect(results[0]!.servingEndpoint).toEqual({
          namespace: "prod",
          component: "backend",
          endpoint: "generate"
        })
        expect(results[0]!.poolId).toMatchObject({ identityVersion: 1, dcId: east.dcId.hex })
        const byDomain = yield* postOverlap(url, {
          poolDomain: { cacheSemantics: results[0]!.poolId, routingScope: undefined },
          localBlockHashes: []
        })
        expect(byDomain.status).toBe(400)
        const poolId = results[0]!.poolId as Record<string, unknown>
        const domainAnswer = yield* postOverlap(url, {
          poolDomain: { cacheSemantics: poolId.cacheSemantics, routingScope: poolId.routingScope },
          localBlockHashes: decimal(shared)
        })
        expect(domainAnswer.status).toBe(200)
        expect(
          (domainAnswer.json.results as Array<Record<string, unknown>>).map((r) => r.prefixDepth)
        ).toEqual([24, 24])

        const domains = yield* getJson(url, "/v1/domains")
        expect(domains.status).toBe(200)
        const listed = JSON.parse(domains.text) as Array<Record<string, unknown>>
        expect(listed).toHaveLength(1)
        expect(listed[0]!.querySemantics).toEqual({
          kvBlockSize: KV_BLOCK_SIZE,
          hashFormat: "dynamo_standard_v1",
          addressing: "canonical_v1"
        })
        const lanes = listed[0]!.lanes as Array<Record<string, unknown>>
        expect(lanes.map((l) => [l.lane, l.relay, l.ready])).toEqual([
          [0, "east", true],
          [1, "west", true]
        ])
        expect(typeof lanes[0]!.installedSequence).toBe("string")
        expect((lanes[0]!.producer as Record<string, unknown>).producerIncarnation).toBe(
          String(east.incarnation)
        )

        // East's rank 1 clears: the shared prompt is gone from east only.
        yield* eastPool.clear("1")
        yield* eventually("east converges after the clear", converged(consumer, "east", eastPool))
        expect(ask(shared)).toEqual({ east: 0, west: 24 })
        expect(ask(eastOnly)).toEqual({ east: 10, west: 0 })
        const ordered = view.overlapNow({ namespace: "prod", model: "llama", localBlockHashes: shared })
        if (!Array.isArray(ordered)) throw ordered
        expect(ordered.map((r) => r.relay)).toEqual(["west", "east"])

        const metrics = yield* getJson(url, "/metrics")
        expect(metrics.status).toBe(200)
        expect(metrics.text).toMatch(/kvrelay_global_lanes\{relay="east",state="ready"\} 1/)
        expect(metrics.text).toMatch(/kvrelay_global_snapshots_installed_total\{relay="west"\} \d+/)
        const health = yield* getJson(url, "/healthz")
        expect([health.status, health.text]).toEqual([200, "ok"])
      })
  )

  live("converges again after a relay restarts with a new incarnation on the same port", () =>
    Effect.gen(function* () {
      const first = yield* startStoppableRelay("east", { incarnation: 1001n })
      const west = yield* startDcRelay("west")
      const eastPool = yield* first.relay.attach(DOMAIN, "prod.backend.generate")
      const westPool = yield* west.attach(DOMAIN, "prod.backend.generate")
      const prompt = blockHashes(11, 16)
      yield* eastPool.store("1", prompt)
      yield* westPool.store("1", prompt.slice(0, 5))
      const { consumer, view } = yield* startConsumer([
        { name: "east", url: first.relay.url },
        { name: "west", url: west.url }
      ])
      yield* eventually(
        "both lanes converge",
        Effect.zipWith(
          converged(consumer, "east", eastPool),
          converged(consumer, "west", westPool),
          (a, b) => a && b
        )
      )
      const ask = () =>
        depthsOf(view.overlapNow({ namespace: "prod", model: "llama", localBlockHashes: prompt }))
      expect(ask()).toEqual({ east: 16, west: 5 })

      yield* first.stop
      yield* eventually(
        "east's lane is retired",
        Effect.sync(() =>
          consumer.domains().every((d) => ![...d.lanes.values()].some((l) => l.relay === "east"))
        )
      )
      expect(ask()).toEqual({ west: 5 })

      const second = yield* startDcRelay("east", { port: first.relay.port, incarnation: 2002n })
      const again = yield* second.attach(DOMAIN, "prod.backend.generate")
      yield* again.store("1", prompt.slice(0, 12))
      yield* eventually("east converges on the new incarnation", converged(consumer, "east", again), 15_000)
      expect(consumer.relays()[0]!.info?.relay.relayIncarnation).toBe(2002n)
      expect(ask()).toEqual({ east: 12, west: 5 })
    })
  )

  live("a lagging lane is retired alone and recovers from a fresh snapshot", () =>
    Effect.gen(function* () {
      // One queued frame per subscriber: a burst of deltas lags the stream.
      const east = yield* startDcRelay("east", { publication: { queueCapacity: 1 } })
      const west = yield* startDcRelay("west")
      const eastPool = yield* east.attach(DOMAIN, "prod.backend.generate")
      const westPool = yield* west.attach(DOMAIN, "prod.backend.generate")
      const { consumer, view } = yield* startConsumer([
        { name: "east", url: east.url },
        { name: "west", url: west.url }
      ])
      yield* eventually(
        "both lanes ready",
        Effect.zipWith(
          converged(consumer, "east", eastPool),
          converged(consumer, "west", westPool),
          (a, b) => a && b
        )
      )
      const laneOf = (relay: string) =>
        consumer
          .domains()
          .flatMap((d) => [...d.lanes.values()])
          .find((l) => l.relay === relay)
      const burst = blockHashes(21, 400)
      for (let round = 0; round < 10 && (laneOf("east")?.faults ?? 0) === 0; round++) {
        yield* Effect.forEach(
          Array.from({ length: 40 }, (_, i) => burst.slice(i * 10, i * 10 + 10)),
          (blocks) => eastPool.store(`${round + 10}`, blocks),
          // Concurrent: the actor publishes the burst's deltas in one turn, so the one-frame
          // queue overflows however fast the stream's writer is.
          { discard: true, concurrency: "unbounded" }
        )
        yield* Effect.sleep("50 millis")
      }
      expect(laneOf("east")!.lastFault).toMatch(/SUBSCRIBER_LAGGED/)
      expect(laneOf("west")!.faults).toBe(0)
      expect(laneOf("west")!.ready).toBe(true)
      yield* eventually("east recovers and converges", converged(consumer, "east", eastPool))
      expect(
        depthsOf(view.overlapNow({ namespace: "prod", model: "llama", localBlockHashes: burst.slice(0, 10) }))
      ).toEqual({
        east: 10,
        west: 0
      })
    })
  )

  live(
    "accuracy at ~50% load: no under-reports, over-reports at the fill's false-positive rate",
    () =>
      Effect.gen(function* () {
        // 4,096 expected blocks size each filter at 2,048 buckets (8,192 slots); 4,096 stored
        // blocks per DC fill it to about one half.
        const east = yield* startDcRelay("east", { expectedUniqueBlocks: 4096 })
        const west = yield* startDcRelay("west", { expectedUniqueBlocks: 4096 })
        const eastPool = yield* east.attach(DOMAIN, "prod.backend.generate")
        const westPool = yield* west.attach(DOMAIN, "prod.backend.generate")
        const CHAIN = 32
        const chains = Array.from({ length: 192 }, (_, i) => blockHashes(1000 + i, CHAIN))
        const inEast = (c: number) => c < 128
        const inWest = (c: number) => c >= 64
        for (let c = 0; c < chains.length; c++) {
          if (inEast(c)) yield* eastPool.store(`${c % 8}`, chains[c]!)
          if (inWest(c)) yield* westPool.store(`${c % 8}`, chains[c]!)
        }
        const { consumer, view } = yield* startConsumer([
          { name: "east", url: east.url },
          { name: "west", url: west.url }
        ])
        yield* eventually(
          "both lanes converge",
          Effect.zipWith(
            converged(consumer, "east", eastPool),
            converged(consumer, "west", westPool),
            (a, b) => a && b
          )
        )

        // Raw false-positive rate of never-stored hashes, per probe and lane.
        const domain = consumer.domains()[0]!
        const indexer = domain.indexer
        const addressing = new CkfAddressing(domain.format.seed, domain.format.bucketCount)
        const probes = blockHashes(99_999, 400_000)
        let falseHits = 0
        for (const hash of probes) {
          addressing.prepareHalves(hiOf(hash), loOf(hash))
          const mask = indexer.probeFor(addressing.fp, addressing.a, addressing.b)
          falseHits += (mask & 1) + ((mask >> 1) & 1)
        }
        const occupied = (lane: number): number => {
          const words = new Uint16Array(indexer.laneWords(lane).buffer)
          let n = 0
          for (const slot of words) if (slot !== 0) n++
          return n / words.length
        }
        const load = (occupied(0) + occupied(1)) / 2
        const expectedRate = (8 * load) / 65536
        const measuredRate = falseHits / (2 * probes.length)

        // Prompts: a prefix of a stored chain, then never-stored blocks.
        const QUERIES = 4000
        let under = 0
        let over = 0
        let exact = 0
        for (let q = 0; q < QUERIES; q++) {
          const c = (q * 7919) % chains.length
          const k = q % (CHAIN + 1)
          const prompt = [...chains[c]!.slice(0, k), ...blockHashes(500_000 + q, 64 - k)]
          const answer = view.overlapNow({ namespace: "prod", model: "llama", localBlockHashes: prompt })
          if (!Array.isArray(answer)) throw answer
          for (const result of answer) {
            const truth = (result.relay === "east" ? inEast(c) : inWest(c)) ? k : 0
            if (result.prefixDepth < truth) under++
            else if (result.prefixDepth > truth) over++
            else exact++
          }
        }
        const overRate = over / (2 * QUERIES)
        console.info(
          `accuracy: load ${load.toFixed(3)}, false-positive rate per probe ${measuredRate.toExponential(2)} ` +
            `(expected ≈ ${expectedRate.toExponential(2)}); ${2 * QUERIES} query-lanes: ${exact} exact, ` +
            `${under} under, ${over} over (${overRate.toExponential(2)} per query-lane)`
        )
        expect(load).toBeGreaterThan(0.4)
        expect(load).toBeLessThan(0.6)
        expect(under).toBe(0)
        expect(measuredRate).toBeLessThan(3 * expectedRate)
        // A prompt over-reports only if a probe past its true depth is a false positive; each
        // search probes a handful of such positions.
        expect(overRate).toBeLessThan(20 * expectedRate + 5 / (2 * QUERIES))
      }),
    30_000
  )
})
