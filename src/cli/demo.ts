/**
 * `kvrelay demo` (and `npm start`): two data centers on 127.0.0.1, each with its own relay,
 * file-discovery document and simulated workers (half `dynamo-zmq` with a worker query server,
 * half `engine-zmq` — vLLM and SGLang encodings — with a replay endpoint) publishing a
 * prefix-sharing workload over real ZeroMQ; a global consumer follows both relays over HTTP. A
 * live summary shows pools, event rates, tracked blocks, publication sequences and recoveries,
 * and, for a few sample prompts, the prefix each DC holds. Ctrl-C stops everything cleanly.
 * With `--drop-every N` each worker loses one message on the wire after every N requests, so the
 * relays have gaps to recover; the summary then counts those drops and says the gaps are theirs.
 */

import { mkdtempSync, renameSync, rmSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import * as NodeFileSystem from "@effect/platform-node/NodeFileSystem"
import { Clock, Context, Duration, Effect, Either, Fiber, Layer, Random, Ref, Schedule } from "effect"
import { chainSequenceHash } from "../ckf/global.js"
import { localBlockHashes, sequenceHashes } from "../ckf/tokens.js"
import { hashPairsToBigInts } from "../ckf/u64.js"
import { RelayQueryClient } from "../client/http.js"
import { GlobalConsumer } from "../consumer/GlobalConsumer.js"
import { routeOf } from "../consumer/GlobalRoute.js"
import { GlobalView } from "../consumer/GlobalView.js"
import * as GlobalHttpServer from "../consumer/http/GlobalHttpServer.js"
import { Discovery } from "../discovery/Discovery.js"
import { makeFileDiscovery } from "../discovery/FileDiscovery.js"
import type { KvEventSource } from "../protocol/Discovery.js"
import { KvEventSourceJson } from "../protocol/Discovery.js"
import { encodeJson } from "../protocol/Json.js"
import { EndpointId } from "../protocol/Model.js"
import { DEFAULT_ROUTE_POLICY } from "../protocol/RouteApi.js"
import * as RelayHttpServer from "../relay/http/RelayHttpServer.js"
import type { KvDcRelayService } from "../relay/KvDcRelay.js"
import * as RelayHost from "../relay/RelayHost.js"
import { makeDynamoZmqPublisher } from "../simulate/DynamoZmqPublisher.js"
import { movingLoad, serveEngineMetrics } from "../simulate/EngineMetricsEndpoint.js"
import { makeEngineZmqPublisher } from "../simulate/EngineZmqPublisher.js"
import { makeWorkerQueryServer } from "../simulate/WorkerQueryServer.js"
import { makeZmqEventTransport } from "../transport/ZmqEventTransport.js"
import type { ZmqError } from "../transport/ZmqSocket.js"
import * as GlobalProcess from "./globalProcess.js"
import { commandObservability } from "./runtime.js"
import type { DemoSettings } from "./settings.js"

const NAMESPACE = "demo"
const MODEL = "llama-3-8b"
const SOURCE_PATH = "meta/llama-3-8b"
const BLOCK_SIZE = 16
const SERVING = new EndpointId({ namespace: NAMESPACE, component: "backend", endpoint: "generate" })
const DCS = ["dc-east", "dc-west"] as const
/** System prompts every request starts from; each DC favours a different half. */
const SYSTEM_PROMPTS = 64
/** Per worker: about a third of one DC's system prompts fit, so popularity decides what stays. */
const CACHE_BLOCKS = 640
const REQUEST_INTERVAL_MS = 20

/**
 * A simulated worker's publishing side, whatever its wire format. A block is given by its
 * tokens; what the worker calls it on the wire is its own business (`externalOf`).
 */
interface SimulatedWorker {
  readonly label: string
  readonly store: (blocks: ReadonlyArray<PromptBlock>, parent: PromptBlock | undefined) => Effect.Effect<void>
  readonly remove: (blocks: ReadonlyArray<PromptBlock>) => Effect.Effect<void>
  readonly dropNext: Effect.Effect<void>
  /** Messages this worker has dropped on purpose so far. */
  readonly dropped: Effect.Effect<number>
  readonly source: Effect.Effect<KvEventSource>
  /** vLLM workers: copy blocks to the CPU tier, and drop those copies (PROTOCOL §5.1 ◆3). */
  readonly hostTier?: HostTier | undefined
}

/** A worker's CPU tier, as vLLM's offloading connector publishes it. */
interface HostTier {
  readonly offload: (blocks: ReadonlyArray<PromptBlock>) => Effect.Effect<void>
  readonly drop: (blocks: ReadonlyArray<PromptBlock>) => Effect.Effect<void>
}

/** Blocks a vLLM worker keeps in CPU memory after the GPU evicted them. */
const HOST_BLOCKS = 320

/**
 * vLLM with CPU offloading: blocks the GPU evicts are first copied to the CPU (a tokens-less
 * `medium: "CPU"` store, resolved by the relay through the rank's lineage), and the CPU keeps the
 * most recent `HOST_BLOCKS` of them. A block stored again on the GPU keeps its CPU copy.
 */
const offloadEvicted = (
  host: HostTier,
  copies: Map<bigint, PromptBlock>,
  evicted: ReadonlyArray<PromptBlock>
): Effect.Effect<void> =>
  Effect.gen(function* () {
    const fresh = evicted.filter((b) => !copies.has(b.sequence))
    for (let i = 0; i < fresh.length; i += 32) yield* host.offload(fresh.slice(i, i + 32))
    for (const b of evicted) {
      copies.delete(b.sequence)
      copies.set(b.sequence, b)
    }
    if (copies.size <= HOST_BLOCKS) return
    const dropped: Array<PromptBlock> = []
    for (const b of copies.values()) {
      if (copies.size - dropped.length <= HOST_BLOCKS) break
      dropped.push(b)
    }
    for (const b of dropped) copies.delete(b.sequence)
    for (let i = 0; i < dropped.length; i += 32) yield* host.drop(dropped.slice(i, i + 32))
  })
/** What a simulated publisher of either kind offers the demo's workload. */
interface DemoPublisher {
  readonly remove: (hashes: ReadonlyArray<bigint>) => Effect.Effect<unknown, ZmqError>
  readonly dropNext: (count?: number) => Effect.Effect<void>
  readonly stats: Effect.Effect<{ readonly dropped: number }>
  readonly source: (kvStateEndpoint: EndpointId) => Effect.Effect<KvEventSource>
}

/** A demo worker over `publisher`, storing with `store` (each kind sends what its engine sends). */
const simulatedWorker = (
  label: string,
  publisher: DemoPublisher,
  external: (blocks: ReadonlyArray<PromptBlock>) => ReadonlyArray<bigint>,
  store: (
    blocks: ReadonlyArray<PromptBlock>,
    parent: PromptBlock | undefined
  ) => Effect.Effect<unknown, ZmqError>
): SimulatedWorker => ({
  label,
  store: (blocks, parent) => Effect.asVoid(store(blocks, parent)).pipe(Effect.orDie),
  remove: (blocks) => Effect.asVoid(publisher.remove(external(blocks))).pipe(Effect.orDie),
  dropNext: publisher.dropNext(1),
  dropped: Effect.map(publisher.stats, (s) => s.dropped),
  source: publisher.source(SERVING)
})

/** One full block of a prompt: its tokens, local hash and canonical sequence hash. */
interface PromptBlock {
  readonly tokens: ReadonlyArray<number>
  readonly local: bigint
  readonly sequence: bigint
}

/** Cut `tokens` into blocks and address them as every relay does (PROTOCOL §3.3). */
const blocksOf = (tokens: ReadonlyArray<number>): Array<PromptBlock> => extend([], tokens)

/** Continue a prompt's blocks with more tokens (the chain goes on from its last block). */
const extend = (prefix: ReadonlyArray<PromptBlock>, tokens: ReadonlyArray<number>): Array<PromptBlock> => {
  const local = localBlockHashes(tokens, BLOCK_SIZE)
  const sequences = hashPairsToBigInts(sequenceHashes(local, prefix[prefix.length - 1]?.sequence))
  return hashPairsToBigInts(local).map((l, i) => ({
    tokens: tokens.slice(i * BLOCK_SIZE, (i + 1) * BLOCK_SIZE),
    local: l,
    sequence: sequences[i]!
  }))
}

/**
 * Engines name blocks their own way (vLLM seeds its block hash at random per process): each
 * simulated worker derives a block's external hash from its canonical one with a seed of its own,
 * so no two workers agree on external hashes, as real ones do not.
 */
const externalOf = (workerSeed: bigint, block: PromptBlock): bigint =>
  chainSequenceHash(workerSeed, block.sequence, 0n)

/** System prompt `p`: 6 to 14 blocks of token ids 100000 + 1000·p + i (easy to type in a query). */
const systemPromptTokens = (prompt: number): Array<number> =>
  Array.from({ length: (6 + (prompt % 5) * 2) * BLOCK_SIZE }, (_, i) => 100_000 + 1000 * prompt + i)
const SYSTEM_BLOCKS = Array.from({ length: SYSTEM_PROMPTS }, (_, p) => blocksOf(systemPromptTokens(p)))

/** A user's own tokens, never shared: ids above every system prompt's. */
const randomTokens = (count: number) =>
  Effect.forEach(Array.from({ length: count }), () => Random.nextIntBetween(1_000_000, 2_000_000))

const card = (workerId: string, rank: number) => ({
  namespace: SERVING.namespace,
  component: SERVING.component,
  endpoint: SERVING.endpoint,
  instanceId: workerId,
  modelSuffix: null,
  card: {
    name: MODEL,
    sourcePath: SOURCE_PATH,
    kvCacheBlockSize: BLOCK_SIZE,
    aliases: ["llama"],
    workerType: "aggregated",
    lora: null,
    indexerIdentity: null,
    runtimeConfig: {
      dataParallelStartRank: rank,
      dataParallelSize: 1,
      enableLocalIndexer: true,
      kvStateEndpoint: null,
      enableEagle: false,
      totalKvBlocks: String(CACHE_BLOCKS),
      maxNumBatchedTokens: "8192"
    }
  }
})

const makeWorker = (
  dc: number,
  index: number
): Effect.Effect<SimulatedWorker, unknown, import("effect").Scope.Scope> =>
  Effect.gen(function* () {
    const workerId = String(7000 + dc * 100 + index)
    const seed = BigInt.asUintN(64, 0x5eed_0000n * BigInt(dc + 1) + BigInt(index) * 0x9e37_79b9n)
    const external = (blocks: ReadonlyArray<PromptBlock>) => blocks.map((b) => externalOf(seed, b))
    const parentOf = (parent: PromptBlock | undefined) =>
      parent === undefined ? {} : { parentHash: externalOf(seed, parent) }
    if (index % 2 === 0) {
      const queryServer = yield* makeWorkerQueryServer({ workerId, dpRanks: [0] })
      const publisher = yield* makeDynamoZmqPublisher({ workerId, dpRank: 0, queryServer })
      // A Dynamo worker sends each block's tokens hash beside its own block hash.
      return simulatedWorker(`worker ${workerId} (dynamo-zmq)`, publisher, external, (blocks, parent) =>
        publisher.store(external(blocks), { ...parentOf(parent), tokensHashes: blocks.map((b) => b.local) })
      )
    }
    const format = index % 4 === 1 ? "vllm" : "sglang"
    const publisher = yield* makeEngineZmqPublisher({ workerId, dpRank: 0, format, blockSize: BLOCK_SIZE })
    // An engine sends the tokens themselves; the relay hashes them.
    return {
      ...simulatedWorker(
        `worker ${workerId} (engine-zmq, ${format})`,
        publisher,
        external,
        (blocks, parent) =>
          publisher.store(external(blocks), {
            ...parentOf(parent),
            tokenIds: blocks.flatMap((b) => b.tokens)
          })
      ),
      hostTier:
        format === "vllm"
          ? {
              offload: (blocks) => Effect.asVoid(publisher.offload(external(blocks))).pipe(Effect.orDie),
              drop: (blocks) => Effect.asVoid(publisher.remove(external(blocks), "CPU")).pipe(Effect.orDie)
            }
          : undefined
    } satisfies SimulatedWorker
  })

/**
 * One worker's traffic: each request is a popular system prompt plus a fresh user suffix; blocks
 * the worker does not hold yet are stored, the least recently used are evicted beyond its cache
 * size, and, with `dropEvery`, one message is lost on the wire after every that many requests so
 * the relay has a gap to recover.
 */
const runWorkload = (worker: SimulatedWorker, dc: number, dropEvery: number | undefined) =>
  Effect.gen(function* () {
    const cached = new Map<bigint, PromptBlock>()
    const hostCopies = new Map<bigint, PromptBlock>()
    const touch = (block: PromptBlock) => {
      cached.delete(block.sequence)
      cached.set(block.sequence, block)
    }
    let requests = 0
    for (;;) {
      // Each DC favours its own half of the system prompts with a steep popularity curve; one
      // request in a hundred crosses over.
      const own = (yield* Random.nextIntBetween(0, 100)) !== 0
      const half = SYSTEM_PROMPTS / 2
      const skew = Math.floor((yield* Random.next) ** 3 * half)
      const prompt = (own ? dc : 1 - dc) * half + skew
      const prefix = SYSTEM_BLOCKS[prompt]!
      const suffix = extend(prefix, yield* randomTokens((yield* Random.nextIntBetween(2, 10)) * BLOCK_SIZE))
      const blocks = [...prefix, ...suffix]
      let firstNew = blocks.findIndex((b) => !cached.has(b.sequence))
      if (firstNew >= 0) {
        while (firstNew < blocks.length) {
          const chunk = blocks.slice(firstNew, firstNew + 16)
          yield* worker.store(chunk, firstNew === 0 ? undefined : blocks[firstNew - 1])
          firstNew += chunk.length
        }
      }
      // Tail first, so that a prefix is always more recent than what follows it and eviction
      // takes children before their parents, as vLLM frees a request's blocks: what a worker
      // holds stays prefix-closed, and its tree dumps have every parent.
      for (let i = blocks.length - 1; i >= 0; i--) touch(blocks[i]!)
      if (cached.size > CACHE_BLOCKS) {
        const evicted: Array<PromptBlock> = []
        for (const b of cached.values()) {
          if (cached.size - evicted.length <= CACHE_BLOCKS) break
          evicted.push(b)
        }
        for (const b of evicted) cached.delete(b.sequence)
        if (worker.hostTier !== undefined) yield* offloadEvicted(worker.hostTier, hostCopies, evicted)
        for (let i = 0; i < evicted.length; i += 32) yield* worker.remove(evicted.slice(i, i + 32))
      }
      requests++
      if (dropEvery !== undefined && requests % dropEvery === 0) yield* worker.dropNext
      yield* Effect.sleep(Duration.millis(REQUEST_INTERVAL_MS))
    }
  })

interface DcRuntime {
  readonly name: string
  readonly url: string
  readonly relay: KvDcRelayService
  readonly workers: ReadonlyArray<SimulatedWorker>
}

const startDc = (dc: number, dir: string, settings: DemoSettings) =>
  Effect.gen(function* () {
    const name = DCS[dc]!
    const workers = yield* Effect.forEach(
      Array.from({ length: settings.workers }, (_, i) => i),
      (i) => makeWorker(dc, i)
    )
    const metrics = yield* Effect.forEach(workers, (_, i) => startWorkerMetrics(dc, i))
    const sources = yield* Effect.forEach(workers, (w, i) =>
      Effect.map(w.source, (source) => ({ ...source, metricsUrl: metrics[i]!.url }))
    )
    const path = join(dir, `${name}-discovery.json`)
    const encodeSource = encodeJson(KvEventSourceJson)
    const document = {
      version: 1,
      cards: sources.map((s) => card(s.workerId, s.dpRank)),
      sources: sources.map((s) => Either.getOrThrow(encodeSource(s)))
    }
    writeFileSync(`${path}.tmp`, JSON.stringify(document, null, 2))
    renameSync(`${path}.tmp`, path)
    const discovery = yield* makeFileDiscovery({ path }).pipe(Effect.provide(NodeFileSystem.layer))
    const relay = yield* RelayHost.make({
      dcName: name,
      drtInstanceId: BigInt(dc + 1),
      eventTransport: makeZmqEventTransport(),
      expectedUniqueBlocks: 65_536,
      publicationDelayMs: 5
    }).pipe(Effect.provideService(Discovery, discovery))
    const address = yield* RelayHttpServer.serve(relay, {
      host: "127.0.0.1",
      port: settings.httpPort === 0 ? 0 : settings.httpPort + dc
    })
    return { name, url: address.url, relay, workers, path } satisfies DcRuntime & { readonly path: string }
  })

/**
 * A worker's metrics endpoint (vLLM's names for Dynamo-format and vLLM workers, SGLang's for
 * SGLang ones) whose load moves in a wave: the DCs' waves are half a period apart, so each DC
 * takes its turn being the idle one and the route decisions of the summary change with them.
 */
const startWorkerMetrics = (dc: number, index: number) =>
  Effect.gen(function* () {
    const endpoint = yield* serveEngineMetrics({
      format: index % 4 === 3 ? "sglang" : "vllm",
      model: MODEL
    })
    const phase = dc / DCS.length
    yield* Effect.forkScoped(
      movingLoad(endpoint, {
        phase,
        periodS: LOAD_PERIOD_S,
        kvUsage: () =>
          0.3 + 0.5 * Math.max(0, Math.sin(2 * Math.PI * (Date.now() / (LOAD_PERIOD_S * 1000) + phase)))
      })
    )
    return endpoint
  })

/** Seconds per wave of the simulated engines' load. */
const LOAD_PERIOD_S = 40

/** The summary's routing lines: per sample, the decision and each DC's cost and load (PROTOCOL §7.1). */
const routeLines = (routed: ReadonlyArray<Sample>) =>
  Effect.gen(function* () {
    const consumer = yield* GlobalConsumer
    const now = yield* Clock.currentTimeMillis
    const lines: Array<string> = []
    for (const sample of routed) {
      const answer = routeOf(
        consumer,
        { namespace: NAMESPACE, model: MODEL, tokens: sample.tokens },
        DEFAULT_ROUTE_POLICY,
        new Map(),
        now
      )
      if (!("candidates" in answer)) {
        lines.push(`    route ${sample.label.padEnd(30)} ${answer.message}`)
        continue
      }
      const terms = answer.candidates
        .map((c) => {
          const load =
            c.load.runningRequests === undefined
              ? "load unknown"
              : `${c.load.runningRequests}+${c.load.waitingRequests ?? "?"} requests on ${c.load.observedRanks}/${c.load.expectedRanks} ranks`
          return `${c.relay} ${c.cost === undefined ? "-" : `cost ${fmt(c.cost)}`}${c.reason === undefined ? "" : ` ${c.reason}`} (${load})`
        })
        .join("; ")
      lines.push(`    route ${sample.label.padEnd(30)} → ${answer.decision?.relay ?? "none"}   ${terms}`)
    }
    return lines
  })

interface Sample {
  readonly label: string
  readonly tokens: ReadonlyArray<number>
}

/** The first `blocks` blocks of system prompt `p`, and 3 tokens of the next (which never count). */
const sampleTokens = (prompt: number, blocks: number): Array<number> =>
  systemPromptTokens(prompt).slice(0, blocks * BLOCK_SIZE + 3)

const samples: ReadonlyArray<Sample> = [
  { label: "a popular dc-east prompt", tokens: sampleTokens(2, 6) },
  { label: "a popular dc-west prompt", tokens: sampleTokens(SYSTEM_PROMPTS / 2 + 2, 6) },
  { label: "a rare dc-east prompt", tokens: sampleTokens(SYSTEM_PROMPTS / 2 - 1, 6) },
  { label: "a prompt nobody has seen", tokens: Array.from({ length: 4 * BLOCK_SIZE }, (_, i) => 7 + i) }
]

/** The query a user can paste: the first 4 blocks of the most popular dc-east prompt. */
const pasteableQuery = (globalUrl: string): string =>
  `curl -s ${globalUrl}/v1/overlap -d '${JSON.stringify({
    namespace: NAMESPACE,
    model: MODEL,
    tokens: sampleTokens(0, 4)
  })}'`

/** The worker-level query a user can paste: which worker of dc-east holds that prompt, per tier. */
export const pasteableWorkerQuery = (relayUrl: string): string =>
  `curl -s ${relayUrl}/v1/query -d '${JSON.stringify({
    namespace: NAMESPACE,
    model: MODEL,
    tokens: sampleTokens(0, 4)
  })}'`

/**
 * The summary's worker-level line (PROTOCOL §5.1 ◆3): for the first sample prompt, each DC's
 * workers that hold some of it, with their device, host and disk depths, through the relay's
 * `POST /v1/query`.
 */
const workerQueryLines = (dcs: ReadonlyArray<DcRuntime>): Effect.Effect<Array<string>> =>
  Effect.forEach(dcs, (dc) =>
    Effect.tryPromise(() =>
      new RelayQueryClient(dc.url).query({ namespace: NAMESPACE, model: MODEL, tokens: samples[0]!.tokens })
    ).pipe(
      Effect.map((answer) => {
        const holders = answer.pools
          .flatMap((pool) => pool.workers)
          .filter((w) => w.disk > 0)
          .map((w) => `${w.workerId}/${w.dpRank} device ${w.device} host ${w.host} disk ${w.disk}`)
        return `    ${`${dc.name} workers`.padEnd(36)} ${holders.length === 0 ? "none yet" : holders.join("   ")}`
      }),
      Effect.catchAll((error) => Effect.succeed(`    ${dc.name} worker query failed: ${String(error)}`))
    )
  )

const fmt = (n: number): string => Math.round(n).toLocaleString("en-US")

/** The summary's line on the deliberate drops, when they are on. */
const dropsLine = (dcs: ReadonlyArray<DcRuntime>, dropEvery: number | undefined) =>
  dropEvery === undefined
    ? Effect.succeed(undefined)
    : Effect.map(
        Effect.forEach(
          dcs.flatMap((dc) => dc.workers),
          (w) => w.dropped
        ),
        (counts) =>
          `  dropped on purpose: ${fmt(counts.reduce((a, b) => a + b, 0))} messages (--drop-every ${dropEvery}, ` +
          `one per worker every ${dropEvery} requests): the gaps above are these, expected, each recovered ` +
          "(recoveries also count each source's first restore)"
      )

const summary = (
  dcs: ReadonlyArray<DcRuntime>,
  globalUrl: string,
  previous: Ref.Ref<Map<string, number>>,
  started: number,
  dropEvery: number | undefined
) =>
  Effect.gen(function* () {
    const view = yield* GlobalView
    const lines: Array<string> = []
    const elapsed = Math.round((Date.now() - started) / 1000)
    lines.push(
      `kvrelay demo: ${dcs.length} DCs × ${dcs[0]!.workers.length} workers, ${elapsed}s — Ctrl-C to stop`
    )
    const last = yield* Ref.get(previous)
    const next = new Map<string, number>()
    for (const dc of dcs) {
      const stats = yield* Effect.either(dc.relay.stats)
      if (Either.isLeft(stats)) {
        lines.push(`  ${dc.name.padEnd(8)} ${dc.url}  stats unavailable: ${stats.left.message}`)
        continue
      }
      const endpoints = stats.right.endpoints
      const active = endpoints.filter((e) => e.lifecycle === "active").length
      let events = 0
      let blocks = 0
      let sequence = 0n
      let recoveries = 0
      let gaps = 0
      let malformed = 0
      let members = 0
      let hostBlocks = 0
      for (const e of endpoints) {
        for (const m of e.aggregation?.members ?? []) hostBlocks += m.hostBlocks
        events += e.ingest.events
        recoveries += e.ingest.recoveries
        gaps += e.ingest.gaps
        malformed += e.ingest.malformed
        blocks += e.aggregation?.uniqueBlockCount ?? 0
        members += e.aggregation?.members.length ?? 0
        if (e.publication !== undefined && e.publication.sequence > sequence)
          sequence = e.publication.sequence
      }
      const rate = (events - (last.get(dc.name) ?? events)) / 2
      next.set(dc.name, events)
      lines.push(
        `  ${dc.name.padEnd(8)} ${dc.url}  pools ${active}  ranks ${members}/${dc.workers.length}  ` +
          `events ${fmt(rate)}/s  blocks ${fmt(blocks)}  publication seq ${sequence}  gaps ${gaps}  recoveries ${recoveries}  malformed ${malformed}  CPU-tier blocks ${fmt(hostBlocks)}`
      )
    }
    yield* Ref.set(previous, next)
    const drops = yield* dropsLine(dcs, dropEvery)
    if (drops !== undefined) lines.push(drops)
    const domains = yield* view.domains
    const ready = domains.reduce((n, d) => n + d.lanes.filter((l) => l.ready).length, 0)
    const lanes = domains.reduce((n, d) => n + d.lanes.length, 0)
    lines.push(`  global   ${globalUrl}  domains ${domains.length}  lanes ready ${ready}/${lanes}`)
    for (const sample of samples) {
      const result = yield* Effect.either(
        view.overlap({ namespace: NAMESPACE, model: MODEL, tokens: sample.tokens })
      )
      const answer = Either.isLeft(result)
        ? result.left.message
        : dcs
            .map((dc) => {
              const match = result.right.find((r) => r.relay === dc.name)
              return `${dc.name} ${match === undefined ? "-" : `${match.prefixDepth}/${Math.floor(sample.tokens.length / BLOCK_SIZE)} blocks (${match.matchedTokens} tokens)`}`
            })
            .join("   ")
      lines.push(`    ${sample.label.padEnd(36)} ${answer}`)
    }
    lines.push(`  which worker holds ${samples[0]!.label} (POST /v1/query, blocks per tier):`)
    lines.push(...(yield* workerQueryLines(dcs)))
    lines.push(...(yield* routeLines(samples.slice(0, 2))))
    const text = `${lines.join("\n")}\n`
    yield* Effect.sync(() => {
      // On a terminal, redraw in place; otherwise append (logs and CI output stay readable).
      if (process.stdout.isTTY === true) process.stdout.write(`\x1b[H\x1b[2J${text}`)
      else process.stdout.write(`${text}\n`)
    })
  })

/**
 * `kvrelay demo`: two relays, a global consumer and simulated workers in one process, with a
 * summary every two seconds.
 */
export const demoProgram = (settings: DemoSettings) =>
  Effect.gen(function* () {
    const dir = yield* Effect.acquireRelease(
      Effect.sync(() => mkdtempSync(join(tmpdir(), "kvrelay-demo-"))),
      (dir) => Effect.sync(() => rmSync(dir, { recursive: true, force: true }))
    )
    const dcs = yield* Effect.forEach([0, 1], (dc) => startDc(dc, dir, settings))
    const globalPort = settings.httpPort === 0 ? 0 : settings.httpPort + DCS.length
    const globalContext = yield* Layer.build(
      GlobalProcess.layer(
        { relays: dcs.map((dc) => ({ name: dc.name, url: dc.url })) },
        { host: "127.0.0.1", port: globalPort }
      )
    )
    const globalUrl = yield* GlobalHttpServer.serverUrl.pipe(Effect.provide(globalContext))
    yield* Effect.sync(() => {
      process.stdout.write(`kvrelay demo: discovery documents in ${dir}\n`)
      for (const dc of dcs) process.stdout.write(`  relay ${dc.name}: ${dc.url} (${dc.path})\n`)
      process.stdout.write(
        `  global consumer: ${globalUrl}  (POST /v1/overlap, POST /v1/route, GET /v1/domains)\n`
      )
      process.stdout.write(
        `  each worker serves engine metrics whose load moves in a ${LOAD_PERIOD_S}s wave, the DCs in turn: watch the route decisions follow it\n`
      )
      process.stdout.write(
        `  a query that hits once the workers have warmed up (a few seconds; 4 blocks of ${BLOCK_SIZE} tokens and 3 that do not count):\n    ${pasteableQuery(globalUrl)}\n`
      )
      process.stdout.write(
        `  which worker of ${dcs[0]!.name} holds it, on which tier (the relay's worker-level query):\n    ${pasteableWorkerQuery(dcs[0]!.url)}\n`
      )
      process.stdout.write(
        settings.dropEvery === undefined
          ? "  no message is dropped on purpose (--drop-every N makes each worker lose one every N requests, to watch recovery)\n\n"
          : `  each worker drops one message every ${settings.dropEvery} requests on purpose (--drop-every): expect gaps, recoveries and "recovering" WARN lines\n\n`
      )
    })
    const workloads = yield* Effect.forEach(dcs, (dc, d) =>
      Effect.forEach(dc.workers, (worker) => Effect.forkScoped(runWorkload(worker, d, settings.dropEvery)))
    )
    const previous = yield* Ref.make(new Map<string, number>())
    const started = Date.now()
    yield* Effect.forkScoped(
      summary(dcs, globalUrl, previous, started, settings.dropEvery).pipe(
        Effect.provideService(GlobalView, Context.get(globalContext, GlobalView)),
        Effect.provideService(GlobalConsumer, Context.get(globalContext, GlobalConsumer)),
        Effect.repeat(Schedule.spaced("2 seconds")),
        Effect.delay("2 seconds")
      )
    )
    if (settings.durationS !== undefined) yield* Effect.sleep(Duration.seconds(settings.durationS))
    else yield* Effect.never
    yield* Effect.sync(() =>
      process.stdout.write(
        "kvrelay demo: stopping the simulated workers, then the global consumer and the relays\n"
      )
    )
    yield* Effect.forEach(workloads.flat(), Fiber.interrupt)
  }).pipe(Effect.scoped, Effect.provide(commandObservability(settings, "kvrelay-demo")))
