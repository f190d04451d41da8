/**
 * Global consumer: overlap queries of 64-block prompts over 16 ready DC lanes, through the HTTP
 * API (`POST /v1/overlap`, 16 in flight and one at a time) and through the in-process
 * `GlobalView`, then the view again while all 16 relays publish deltas. Query figures are against
 * the bare `GlobalCkfIndexer.findPrefixMatches` on the same table in the same run; the ingestion
 * figure is the consumer's installed deltas against what the relays published (1.00 = keeps up).
 *
 * Everything is real and in one process (one thread): 16 relays (registry, publication source,
 * relay HTTP server on 127.0.0.1), the consumer subscribed to all of them over HTTP, its HTTP
 * server, and `fetch` as the HTTP client, so the HTTP figures include the client's own cost and
 * the under-ingest query rate is the share of the thread the queries get next to the relays.
 */

import { performance } from "node:perf_hooks"
import * as NodeHttpClient from "@effect/platform-node/NodeHttpClient"
import { Effect, Fiber, Layer, Logger, LogLevel, Random, SubscriptionRef } from "effect"
import { ckfConfig } from "../src/ckf/config.js"
import { CacheSemanticsId, IndexerDomainId, PoolId, RoutingScopeId } from "../src/ckf/identity.js"
import { DcCkfState } from "../src/ckf/state.js"
import { localBlockHashes, sequenceHashes } from "../src/ckf/tokens.js"
import { GlobalConsumer, type GlobalConsumerService, RelayConnector } from "../src/consumer/GlobalConsumer.js"
import { make as makeConsumer } from "../src/consumer/GlobalConsumerLive.js"
import { GlobalView, make as makeView, type OverlapResult } from "../src/consumer/GlobalView.js"
import * as GlobalHttpServer from "../src/consumer/http/GlobalHttpServer.js"
import { emptyMembershipView } from "../src/discovery/Membership.js"
import type { RouterEvent } from "../src/protocol/Events.js"
import { stableDcId } from "../src/protocol/Identity.js"
import {
  baseRegistration,
  canonicalModelId,
  DcRelayIdentity,
  EndpointId,
  KvQuerySemantics
} from "../src/protocol/Model.js"
import type { EngineLoad } from "../src/relay/EngineLoad.js"
import * as RelayHttpServer from "../src/relay/http/RelayHttpServer.js"
import { make as makeRegistry } from "../src/relay/internal/PoolRegistryLive.js"
import type { KvDcRelayService } from "../src/relay/KvDcRelay.js"
import * as LoadWindows from "../src/relay/LoadWindows.js"
import type { PoolLoadSnapshot } from "../src/relay/PoolLoad.js"
import type { PoolAttachment } from "../src/relay/PoolRegistry.js"
import * as PublicationSource from "../src/relay/PublicationSource.js"
import { UnknownEndpoint } from "../src/relay/RelayErrors.js"
import type { TopologyPublisher, TopologySnapshot } from "../src/relay/Topology.js"
import { type BenchContext, gc, HashStream, percentile, record } from "./harness.js"

export const LANES = 16
export const PROMPT_BLOCKS = 64
/** The pools' kvBlockSize: a 64-block prompt is 1024 tokens. */
export const BLOCK_TOKENS = 16
export const INGEST_BLOCKS_PER_EVENT = 8

export const DOMAIN = new IndexerDomainId(
  new CacheSemanticsId(new Uint8Array(16).fill(0x21), "explicit"),
  new RoutingScopeId(new Uint8Array(16).fill(0x42), "explicit")
)

export interface BenchRelay {
  readonly name: string
  readonly url: string
  readonly attachment: PoolAttachment
}

/** One DC: the real registry, publication source and relay HTTP server, one attached pool. */
/**
 * Engine load as a relay with metrics endpoints would report it: one observed rank per pool, a
 * load that depends on the relay, so that routing decisions have every term to price.
 */
const benchEngineLoad = (seed: bigint): EngineLoad => ({
  additions: (pools) =>
    Effect.succeed(
      pools.map(() => ({
        runningRequests: Number(seed % 5n),
        waitingRequests: Number(seed % 3n),
        kvUsage: 0.5,
        loadObservedRanks: 1
      }))
    ),
  sourceStats: () => Effect.succeed(undefined)
})

/** A readiness of one READY entry listing the bench pool (the bench relays have no membership). */
const readyTopology = (poolId: PoolId) =>
  Effect.gen(function* () {
    const snapshot: TopologySnapshot = {
      revision: 1n,
      entries: [
        {
          namespace: "bench",
          canonicalModelId: canonicalModelId("llama"),
          state: "READY",
          presentRoles: ["aggregated"],
          missingRoles: [],
          members: [
            {
              endpoint: new EndpointId({ namespace: "bench", component: "backend", endpoint: "generate" }),
              roles: ["aggregated"],
              poolId
            }
          ],
          duplicateRoleEndpoints: [],
          legacyFallbackActive: false,
          adapters: []
        }
      ]
    }
    const ref = yield* SubscriptionRef.make(snapshot)
    return { ref, current: SubscriptionRef.get(ref) } satisfies TopologyPublisher
  })

export const startRelay = (name: string, expectedUniqueBlocks: number) =>
  Effect.gen(function* () {
    const dcId = stableDcId(name)
    const relayIdentity = new DcRelayIdentity({
      drtInstanceId: 1n,
      relayIncarnation: BigInt(yield* Random.nextIntBetween(1, 0x7fff_ffff))
    })
    const registry = yield* makeRegistry({
      relayIdentity,
      actorConfig: { expectedUniqueBlocks, publicationThreshold: 16, publicationDelay: "1 millis" }
    })
    const source = yield* PublicationSource.make(registry)
    const service: KvDcRelayService = {
      dcName: name,
      dcId,
      identity: relayIdentity,
      catalogRef: registry.catalogRef,
      catalogNow: registry.catalogNow,
      publicationHubCounts: registry.publicationHubCounts,
      membershipRef: yield* SubscriptionRef.make(emptyMembershipView),
      loadRef: registry.loadRef,
      subscribePool: source.subscribePool,
      subscribePoolFeed: source.subscribePoolFeed,
      health: Effect.succeed({
        healthy: true,
        shuttingDown: false,
        endpointCount: 1,
        activeEndpointCount: 1,
        fencedEndpointCount: 0,
        sourcesRecovering: 0,
        sourcesDegraded: 0,
        sources: { expected: 0, connecting: 0, live: 0, recovering: 0, degraded: 0, rejected: 0 },
        discovery: { state: "live", since: new Date(0) }
      }),
      stats: Effect.succeed({
        identity: { dcName: name, dcId, drtInstanceId: 1n, relayIncarnation: relayIdentity.relayIncarnation },
        endpoints: []
      }),
      diagnosticSnapshot: (endpoint) => Effect.fail(new UnknownEndpoint({ endpoint: endpoint.toString() })),
      queryWorkers: (endpoint) => Effect.fail(new UnknownEndpoint({ endpoint: endpoint.toString() })),
      queryWorkersNow: () => undefined,
      sourceRanks: () => Effect.succeed([]),
      flush: Effect.void,
      shutdown: Effect.zipRight(source.shutdown, registry.shutdown)
    }
    const poolId = new PoolId(DOMAIN, dcId)
    // The bench pool's load window: no KV occupancy reports, engine load as metrics would give it.
    const loadRef = yield* SubscriptionRef.make<ReadonlyArray<PoolLoadSnapshot>>([])
    const server = yield* RelayHttpServer.serve(service, {
      host: "127.0.0.1",
      port: 0,
      intervals: { shutdownGrace: "100 millis" },
      topology: yield* readyTopology(poolId),
      loadWindows: yield* LoadWindows.make(loadRef, { engineLoad: benchEngineLoad(dcId.value).additions })
    })
    const attachment = yield* Effect.orDie(
      registry.attach({
        poolId,
        endpoint: new EndpointId({ namespace: "bench", component: "backend", endpoint: "generate" }),
        registrations: [baseRegistration(canonicalModelId("llama"), [])],
        querySemantics: new KvQuerySemantics({ kvBlockSize: BLOCK_TOKENS, hashFormat: "dynamo_standard_v1" }),
        roles: ["aggregated"]
      })
    )
    yield* SubscriptionRef.set(loadRef, [
      {
        producer: attachment.identity,
        kvUsedBlocks: undefined,
        totalKvBlocks: undefined,
        kvObservedRanks: 0,
        kvExpectedRanks: 1
      }
    ])
    const relay: BenchRelay = { name, url: server.url, attachment }
    return relay
  })

export const stored = (
  worker: string,
  eventId: number,
  pairs: Uint32Array,
  locals?: Uint32Array
): RouterEvent => ({
  workerId: worker,
  dpRank: 0,
  eventId,
  storageTier: "device",
  data: {
    _tag: "Stored",
    blockHashes: pairs,
    tokensHashes: locals,
    parentHash: undefined,
    startPosition: undefined
  }
})

/** A prompt: its tokens, the blocks' local hashes, their canonical addresses, and engine hashes. */
export interface Prompt {
  readonly tokens: Uint32Array
  readonly local: Uint32Array
  readonly sequence: Uint32Array
  readonly external: Uint32Array
}

/** Prompts of 64 blocks of 16 tokens; DC `d` holds a deterministic prefix (often none) of each. */
export const makePrompts = (count: number, seed: number): Array<Prompt> => {
  const stream = new HashStream(seed)
  const prompts: Array<Prompt> = []
  const pair = new Uint32Array(2)
  for (let p = 0; p < count; p++) {
    const tokens = new Uint32Array(PROMPT_BLOCKS * BLOCK_TOKENS)
    for (let i = 0; i < tokens.length; i++) {
      stream.next(pair, 0)
      tokens[i] = pair[1]! % 150_000
    }
    const local = localBlockHashes(tokens, BLOCK_TOKENS)
    const external = new Uint32Array(PROMPT_BLOCKS * 2)
    for (let i = 0; i < PROMPT_BLOCKS; i++) stream.next(external, 2 * i)
    prompts.push({ tokens, local, sequence: sequenceHashes(local), external })
  }
  return prompts
}

export const heldPrefix = (prompt: number, dc: number): number => {
  let x = Math.imul(prompt + 1, 0x9e37_79b1) ^ Math.imul(dc + 7, 0x85eb_ca6b)
  x ^= x >>> 15
  x = Math.imul(x, 0xc2b2_ae35)
  x ^= x >>> 13
  // Half the DCs hold nothing of a prompt; the others a prefix of 1..64 blocks.
  return (x & 1) === 0 ? 0 : 1 + ((x >>> 1) % PROMPT_BLOCKS)
}

export const sequencesOf = (consumer: GlobalConsumerService): number => {
  let total = 0
  for (const domain of consumer.domains()) {
    for (const lane of domain.lanes.values()) total += Number(lane.installedSequence ?? 0n)
  }
  return total
}

export const faultsOf = (consumer: GlobalConsumerService): number => {
  let total = 0
  for (const domain of consumer.domains()) for (const lane of domain.lanes.values()) total += lane.faults
  return total
}

export const readyLanes = (consumer: GlobalConsumerService): number =>
  consumer.domains().reduce((n, d) => n + [...d.lanes.values()].filter((l) => l.ready).length, 0)

/** Latencies (ms) of `n` calls, and calls per second over the whole loop. */
const timed = (
  n: number,
  call: (i: number) => void
): { readonly qps: number; readonly p50: number; readonly p99: number } => {
  const latencies = new Float64Array(n)
  const start = performance.now()
  for (let i = 0; i < n; i++) {
    const t = performance.now()
    call(i)
    latencies[i] = performance.now() - t
  }
  const elapsed = performance.now() - start
  latencies.sort()
  return { qps: (n * 1000) / elapsed, p50: percentile(latencies, 50), p99: percentile(latencies, 99) }
}

const program = (ctx: BenchContext) =>
  Effect.gen(function* () {
    const expected = ctx.quick ? 65_536 : 1_048_576
    const promptCount = ctx.quick ? 512 : 4096
    const prompts = makePrompts(promptCount, 0xbeef)
    const bucketCount = new DcCkfState(ckfConfig(expected)).bucketCount

    // ---- 16 relays, each holding its prefixes of the prompts
    const relays: Array<BenchRelay> = []
    for (let dc = 0; dc < LANES; dc++) relays.push(yield* startRelay(`dc-${dc}`, expected))
    const storedBlocks = yield* storePrefixes(relays, prompts, promptCount)

    // ---- the consumer over HTTP, and its own HTTP API
    const connector = yield* Layer.build(
      RelayConnector.layerHttp().pipe(Layer.provide(NodeHttpClient.layerUndici))
    )
    const setupStart = performance.now()
    const consumer = yield* makeConsumer({ relays: relays.map((r) => ({ name: r.name, url: r.url })) }).pipe(
      Effect.provide(connector),
      Effect.orDie
    )
    const view = makeView(consumer)
    const server = yield* Layer.build(
      GlobalHttpServer.layer({ host: "127.0.0.1", port: 0, maxBodyBytes: 1 << 20 }).pipe(
        Layer.provide(
          Layer.mergeAll(Layer.succeed(GlobalConsumer, consumer), Layer.succeed(GlobalView, view))
        )
      )
    )
    const url = yield* GlobalHttpServer.serverUrl.pipe(Effect.provide(server))
    while (readyLanes(consumer) < LANES) {
      if (performance.now() - setupStart > 120_000)
        return yield* Effect.dieMessage("lanes did not become ready")
      yield* Effect.sleep("20 millis")
    }
    const readyMs = performance.now() - setupStart
    const domain = consumer.domains()[0]!
    const indexer = domain.indexer
    ctx.log(
      `  16 lanes ready in ${readyMs.toFixed(0)} ms (${bucketCount} buckets per lane, ${storedBlocks} blocks over 16 DCs)`
    )

    // ---- queries: bare indexer, view, HTTP
    const queries = ctx.quick ? 10_000 : 50_000
    const pick = (i: number) => prompts[(i * 7919) % promptCount]!
    let sink = 0
    const bareRound = () =>
      timed(queries, (i) => {
        const r = indexer.findPrefixMatches(pick(i).sequence)
        if (r !== "Unavailable") sink += r.lanes[0]?.prefixDepth ?? 0
      })
    const viewRound = () =>
      timed(queries, (i) => {
        const r = view.overlapNow({ namespace: "bench", model: "llama", sequenceHashes: pick(i).sequence })
        if (Array.isArray(r)) sink += r.length
      })
    const tokensRound = () =>
      timed(queries, (i) => {
        const r = view.overlapNow({ namespace: "bench", model: "llama", tokens: pick(i).tokens })
        if (Array.isArray(r)) sink += r.length
      })
    // Interleaved rounds, best of each: machine noise and JIT warm-up hit both alike.
    yield* Effect.sync(gc)
    let bare = bareRound()
    let inProcess = viewRound()
    let byTokens = tokensRound()
    for (let r = 0; r < 3; r++) {
      const b = bareRound()
      if (b.qps > bare.qps) bare = b
      const v = viewRound()
      if (v.qps > inProcess.qps) inProcess = v
      const t = tokensRound()
      if (t.qps > byTokens.qps) byTokens = t
      yield* Effect.yieldNow()
    }
    for (const [form, answer] of [
      [
        "sequence hashes",
        view.overlapNow({ namespace: "bench", model: "llama", sequenceHashes: pick(0).sequence })
      ],
      ["tokens", view.overlapNow({ namespace: "bench", model: "llama", tokens: pick(0).tokens })]
    ] as const) {
      if (!Array.isArray(answer) || answer.length !== LANES)
        return yield* Effect.dieMessage(`view by ${form} did not answer 16 lanes`)
      for (const match of answer as ReadonlyArray<OverlapResult>) {
        const dc = Number(match.relay.slice(3))
        if (match.prefixDepth < heldPrefix((0 * 7919) % promptCount, dc))
          return yield* Effect.dieMessage(`view by ${form} under-reports ${match.relay}`)
      }
    }

    const bodies = prompts.map((prompt) =>
      JSON.stringify({ namespace: "bench", model: "llama", tokens: Array.from(prompt.tokens) })
    )
    const httpQueries = ctx.quick ? 2_000 : 10_000
    const concurrency = 16
    const http = yield* Effect.promise(async () => {
      const latencies: Array<number> = []
      let next = 0
      const worker = async () => {
        for (;;) {
          const i = next++
          if (i >= httpQueries) return
          const t = performance.now()
          const response = await fetch(`${url}/v1/overlap`, {
            method: "POST",
            headers: { "content-type": "application/json" },
            body: bodies[(i * 7919) % promptCount]!
          })
          const text = await response.text()
          const json = JSON.parse(text) as { results?: Array<unknown> }
          if (response.status !== 200 || json.results?.length !== LANES)
            throw new Error(`overlap failed: ${response.status} ${text.slice(0, 300)}`)
          latencies.push(performance.now() - t)
        }
      }
      // Warm the connection pool and the handlers first.
      next = httpQueries - Math.min(200, httpQueries)
      await Promise.all(Array.from({ length: concurrency }, worker))
      next = 0
      latencies.length = 0
      const start = performance.now()
      await Promise.all(Array.from({ length: concurrency }, worker))
      const elapsed = performance.now() - start
      latencies.sort((a, b) => a - b)
      return {
        qps: (httpQueries * 1000) / elapsed,
        p50: percentile(latencies, 50),
        p99: percentile(latencies, 99)
      }
    })

    // One request at a time: the latency of a lone query, without queueing behind 15 others.
    const serial = yield* Effect.promise(async () => {
      const latencies: Array<number> = []
      const n = ctx.quick ? 300 : 1000
      for (let i = 0; i < n; i++) {
        const t = performance.now()
        const response = await fetch(`${url}/v1/overlap`, {
          method: "POST",
          headers: { "content-type": "application/json" },
          body: bodies[(i * 7919) % promptCount]!
        })
        await response.arrayBuffer()
        latencies.push(performance.now() - t)
      }
      latencies.sort((a, b) => a - b)
      return { p50: percentile(latencies, 50), p99: percentile(latencies, 99) }
    })

    // ---- ingestion on all 16 lanes while the view answers queries
    const ingestMs = ctx.quick ? 1_000 : 3_000
    const publicationsBefore = yield* Effect.forEach(relays, (r) => r.attachment.actor.diagnostics)
    const sequencesBefore = sequencesOf(consumer)
    const faultsBefore = faultsOf(consumer)
    let ingesting = true
    const writers = yield* Effect.forEach(relays, (relay, dc) =>
      Effect.fork(
        Effect.gen(function* () {
          const stream = new HashStream(0x5eed + dc)
          let eventId = 1
          while (ingesting) {
            const pairs = new Uint32Array(INGEST_BLOCKS_PER_EVENT * 2)
            for (let i = 0; i < INGEST_BLOCKS_PER_EVENT; i++) stream.next(pairs, 2 * i)
            yield* relay.attachment.actor.admitEvent(0, stored("ingest", eventId++, pairs))
            // Writers share the one thread with the relays, the consumer and the queries.
            if (eventId % 64 === 0)
              yield* Effect.promise(() => new Promise<void>((resolve) => setImmediate(resolve)))
          }
          return eventId - 1
        })
      )
    )
    const underLoad: Array<number> = []
    const loadStart = performance.now()
    let loadQueries = 0
    while (performance.now() - loadStart < ingestMs) {
      for (let i = 0; i < 200; i++) {
        const t = performance.now()
        const r = view.overlapNow({
          namespace: "bench",
          model: "llama",
          sequenceHashes: pick(loadQueries++).sequence
        })
        underLoad.push(performance.now() - t)
        if (Array.isArray(r)) sink += r.length
      }
      // Give the sockets, the relays and the ingestion workers their turn.
      yield* Effect.promise(() => new Promise<void>((resolve) => setImmediate(resolve)))
    }
    const loadElapsed = performance.now() - loadStart
    ingesting = false
    const events = yield* Effect.forEach(writers, Fiber.join)
    for (const relay of relays) yield* Effect.orDie(relay.attachment.actor.flush)
    const publicationsAfter = yield* Effect.forEach(relays, (r) => r.attachment.actor.diagnostics)
    const published = publicationsAfter.reduce(
      (n, d, i) => n + d.publications - publicationsBefore[i]!.publications,
      0
    )
    const catchUpStart = performance.now()
    // Caught up: every lane installed as many deltas as its relay published (or re-snapshotted).
    while (sequencesOf(consumer) - sequencesBefore < published && performance.now() - catchUpStart < 30_000) {
      yield* Effect.sleep("5 millis")
    }
    const applied = sequencesOf(consumer) - sequencesBefore
    const catchUpMs = performance.now() - catchUpStart
    const faults = faultsOf(consumer) - faultsBefore
    underLoad.sort((a, b) => a - b)
    const loadQps = (loadQueries * 1000) / loadElapsed
    const totalEvents = events.reduce((a, b) => a + b, 0)
    if (sink === -1) ctx.log("unreachable")

    const note = `${LANES} lanes × ${bucketCount} buckets, ${PROMPT_BLOCKS}-block prompts`
    record(ctx, "global_query_bare_indexer", "queries/s", bare.qps, null, note)
    record(ctx, "global_query_bare_p99", "µs", bare.p99 * 1000, null)
    record(ctx, "global_query_view", "queries/s", inProcess.qps, bare.qps, "GlobalView.overlapNow vs bare")
    record(ctx, "global_query_view_p99", "µs", inProcess.p99 * 1000, bare.p99 * 1000, "lower is better", true)
    record(
      ctx,
      "overlap_tokens_1024",
      "queries/s",
      byTokens.qps,
      inProcess.qps,
      `GlobalView.overlapNow by tokens (${PROMPT_BLOCKS * BLOCK_TOKENS}-token prompts: hash, chain, probe) vs by precomputed sequence hashes; target >= 50k q/s; p99 ${(byTokens.p99 * 1000).toFixed(0)} µs`
    )
    record(
      ctx,
      "global_query_http",
      "queries/s",
      http.qps,
      bare.qps,
      `POST /v1/overlap by tokens, ${concurrency} in flight, fetch client`
    )
    record(
      ctx,
      "global_query_http_p99",
      "µs",
      http.p99 * 1000,
      bare.p99 * 1000,
      `p50 ${(http.p50 * 1000).toFixed(0)} µs`,
      true
    )
    record(
      ctx,
      "global_query_http_serial_p50",
      "µs",
      serial.p50 * 1000,
      bare.p50 * 1000,
      `1 in flight, p99 ${(serial.p99 * 1000).toFixed(0)} µs; lower is better`,
      true
    )
    record(ctx, "global_query_under_ingest", "queries/s", loadQps, bare.qps, `view, while 16 relays publish`)
    record(
      ctx,
      "global_query_under_ingest_p99",
      "µs",
      percentile(underLoad, 99) * 1000,
      bare.p99 * 1000,
      "lower is better",
      true
    )
    record(
      ctx,
      "global_ingest_deltas",
      "deltas/s",
      (applied * 1000) / (loadElapsed + catchUpMs),
      (published * 1000) / loadElapsed,
      `${applied}/${published} relay deltas installed (${totalEvents} events of ${INGEST_BLOCKS_PER_EVENT} blocks), catch-up ${catchUpMs.toFixed(0)} ms, ${faults} lane faults`
    )
  })

/**
 * Each of the relays stores its held prefix (`heldPrefix`) of the first `promptCount` prompts,
 * spread over 8 workers; returns the blocks stored.
 */
export const storePrefixes = (
  relays: ReadonlyArray<BenchRelay>,
  prompts: ReturnType<typeof makePrompts>,
  promptCount: number
) =>
  Effect.gen(function* () {
    let storedBlocks = 0
    for (let dc = 0; dc < relays.length; dc++) {
      const actor = relays[dc]!.attachment.actor
      const eventIds = new Array<number>(8).fill(0)
      for (let p = 0; p < promptCount; p++) {
        const held = heldPrefix(p, dc)
        if (held === 0) continue
        const worker = p % 8
        eventIds[worker] = eventIds[worker]! + 1
        const prompt = prompts[p]!
        yield* actor.admitEvent(
          0,
          stored(
            `${worker}`,
            eventIds[worker]!,
            prompt.external.subarray(0, 2 * held),
            prompt.local.subarray(0, 2 * held)
          )
        )
        storedBlocks += held
      }
      yield* Effect.orDie(actor.flush)
    }
    return storedBlocks
  })

export const benchGlobal = async (ctx: BenchContext): Promise<void> => {
  await Effect.runPromise(program(ctx).pipe(Effect.scoped, Logger.withMinimumLogLevel(LogLevel.Error)))
}
