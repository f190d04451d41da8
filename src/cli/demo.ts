/**
 * `kvrelay demo` (and `npm start`): two data centers on 127.0.0.1, each with its own relay,
 * file-discovery document and simulated workers (half `dynamo-zmq` with a worker query server,
 * half `engine-zmq` — vLLM and SGLang encodings — with a replay endpoint) publishing a
 * prefix-sharing workload over real ZeroMQ; a global consumer follows both relays over HTTP. A
 * live summary shows pools, event rates, tracked blocks, publication sequences and recoveries,
 * and, for a few sample prompts, the prefix each DC holds. Ctrl-C stops everything cleanly.
 */

import { mkdtempSync, renameSync, rmSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { NodeFileSystem } from "@effect/platform-node"
import { Context, Duration, Effect, Either, Fiber, Layer, Random, Ref, Schedule } from "effect"
import { chainSequenceHash } from "../ckf/global.js"
import { U64_MAX } from "../ckf/u64.js"
import { GlobalView } from "../consumer/GlobalView.js"
import { Discovery } from "../discovery/Discovery.js"
import { makeFileDiscovery } from "../discovery/FileDiscovery.js"
import { encodeJson, KvEventSourceJson } from "../domain/json.js"
import { EndpointId } from "../domain/model.js"
import type { KvEventSource } from "../domain/sources.js"
import * as RelayHost from "../relay/RelayHost.js"
import type { KvDcRelayService } from "../relay/RelayService.js"
import { makeDynamoZmqPublisher } from "../transport/DynamoZmqPublisher.js"
import { makeEngineZmqPublisher } from "../transport/EngineZmqPublisher.js"
import * as GlobalHttpServer from "../transport/http/GlobalHttpServer.js"
import * as RelayHttpServer from "../transport/http/RelayHttpServer.js"
import { makeWorkerQueryServer } from "../transport/WorkerQueryServer.js"
import { makeZmqEventTransport } from "../transport/ZmqEventTransport.js"
import { observabilityLayer } from "./runtime.js"
import type { DemoSettings } from "./settings.js"

const NAMESPACE = "demo"
const MODEL = "llama-3-8b"
const SOURCE_PATH = "meta/llama-3-8b"
const BLOCK_SIZE = 64
const SERVING = new EndpointId({ namespace: NAMESPACE, component: "backend", endpoint: "generate" })
const DCS = ["dc-east", "dc-west"] as const
/** System prompts every request starts from; each DC favours a different half. */
const SYSTEM_PROMPTS = 64
/** Per worker: about a third of one DC's system prompts fit, so popularity decides what stays. */
const CACHE_BLOCKS = 640
const REQUEST_INTERVAL_MS = 20

/** A simulated worker's publishing side, whatever its wire format. */
interface SimulatedWorker {
  readonly label: string
  readonly store: (hashes: ReadonlyArray<bigint>, parent: bigint | undefined) => Effect.Effect<void>
  readonly remove: (hashes: ReadonlyArray<bigint>) => Effect.Effect<void>
  readonly dropNext: Effect.Effect<void>
  readonly source: Effect.Effect<KvEventSource>
}

// Block hashes chain their prefix (PROTOCOL §7): block i = chain(block i−1, local i).
const chain = (locals: ReadonlyArray<bigint>): Array<bigint> => {
  const out: Array<bigint> = []
  for (const local of locals)
    out.push(out.length === 0 ? local : chainSequenceHash(out[out.length - 1]!, local, 0n))
  return out
}
const systemPromptLocals = (prompt: number): Array<bigint> =>
  Array.from({ length: 24 + (prompt % 5) * 8 }, (_, i) =>
    BigInt.asUintN(64, 0x5eed_0000_0000n + BigInt(prompt) * 4096n + BigInt(i))
  )
const SYSTEM_CHAINS = Array.from({ length: SYSTEM_PROMPTS }, (_, p) => chain(systemPromptLocals(p)))

const randomU64 = Effect.map(
  Effect.all([Random.nextIntBetween(0, 0x7fff_ffff), Random.nextIntBetween(0, 0x7fff_ffff)]),
  ([a, b]) => BigInt.asUintN(64, (BigInt(a) << 33n) ^ BigInt(b) ^ 0x9e37_79b9_7f4a_7c15n)
)

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
    if (index % 2 === 0) {
      const queryServer = yield* makeWorkerQueryServer({ workerId, dpRanks: [0] })
      const publisher = yield* makeDynamoZmqPublisher({ workerId, dpRank: 0, queryServer })
      return {
        label: `worker ${workerId} (dynamo-zmq)`,
        store: (hashes, parent) =>
          Effect.asVoid(publisher.store(hashes, parent === undefined ? {} : { parentHash: parent })).pipe(
            Effect.orDie
          ),
        remove: (hashes) => Effect.asVoid(publisher.remove(hashes)).pipe(Effect.orDie),
        dropNext: publisher.dropNext(1),
        source: publisher.source(SERVING)
      } satisfies SimulatedWorker
    }
    const format = index % 4 === 1 ? "vllm" : "sglang"
    const publisher = yield* makeEngineZmqPublisher({ workerId, dpRank: 0, format, blockSize: BLOCK_SIZE })
    return {
      label: `worker ${workerId} (engine-zmq, ${format})`,
      store: (hashes, parent) =>
        Effect.asVoid(publisher.store(hashes, parent === undefined ? {} : { parentHash: parent })).pipe(
          Effect.orDie
        ),
      remove: (hashes) => Effect.asVoid(publisher.remove(hashes)).pipe(Effect.orDie),
      dropNext: publisher.dropNext(1),
      source: publisher.source(SERVING)
    } satisfies SimulatedWorker
  })

/**
 * One worker's traffic: each request is a popular system prompt plus a fresh user suffix; blocks
 * the worker does not hold yet are stored, the least recently used are evicted beyond its cache
 * size, and now and then one message is lost on the wire so the relay has a gap to recover.
 */
const runWorkload = (worker: SimulatedWorker, dc: number) =>
  Effect.gen(function* () {
    const cached = new Map<bigint, true>()
    const touch = (hash: bigint) => {
      cached.delete(hash)
      cached.set(hash, true)
    }
    let requests = 0
    for (;;) {
      // Each DC favours its own half of the system prompts with a steep popularity curve; one
      // request in a hundred crosses over.
      const own = (yield* Random.nextIntBetween(0, 100)) !== 0
      const half = SYSTEM_PROMPTS / 2
      const skew = Math.floor((yield* Random.next) ** 3 * half)
      const prompt = (own ? dc : 1 - dc) * half + skew
      const prefix = SYSTEM_CHAINS[prompt]!
      const suffixLength = yield* Random.nextIntBetween(2, 10)
      const suffix: Array<bigint> = []
      let last = prefix[prefix.length - 1]!
      for (let i = 0; i < suffixLength; i++) {
        last = chainSequenceHash(last, yield* randomU64, 0n)
        suffix.push(last)
      }
      const blocks = [...prefix, ...suffix]
      let firstNew = blocks.findIndex((h) => !cached.has(h))
      for (const h of blocks) if (cached.has(h)) touch(h)
      if (firstNew >= 0) {
        while (firstNew < blocks.length) {
          const chunk = blocks.slice(firstNew, firstNew + 16)
          yield* worker.store(chunk, firstNew === 0 ? undefined : blocks[firstNew - 1])
          for (const h of chunk) touch(h)
          firstNew += chunk.length
        }
      }
      if (cached.size > CACHE_BLOCKS) {
        const evicted: Array<bigint> = []
        for (const h of cached.keys()) {
          if (cached.size - evicted.length <= CACHE_BLOCKS) break
          evicted.push(h)
        }
        for (const h of evicted) cached.delete(h)
        for (let i = 0; i < evicted.length; i += 32) yield* worker.remove(evicted.slice(i, i + 32))
      }
      requests++
      if (requests % 500 === 250) yield* worker.dropNext
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
    const sources = yield* Effect.forEach(workers, (w) => w.source)
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

interface Sample {
  readonly label: string
  readonly hashes: ReadonlyArray<bigint>
}

const samples: ReadonlyArray<Sample> = [
  { label: "a popular dc-east prompt", hashes: SYSTEM_CHAINS[2]! },
  { label: "a popular dc-west prompt", hashes: SYSTEM_CHAINS[SYSTEM_PROMPTS / 2 + 2]! },
  { label: "a rare dc-east prompt", hashes: SYSTEM_CHAINS[SYSTEM_PROMPTS / 2 - 1]! },
  {
    label: "a prompt nobody has seen",
    hashes: chain([U64_MAX - 1n, U64_MAX - 2n, U64_MAX - 3n, U64_MAX - 4n])
  }
]

const fmt = (n: number): string => Math.round(n).toLocaleString("en-US")

const summary = (
  dcs: ReadonlyArray<DcRuntime>,
  globalUrl: string,
  previous: Ref.Ref<Map<string, number>>,
  started: number
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
      for (const e of endpoints) {
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
          `events ${fmt(rate)}/s  blocks ${fmt(blocks)}  publication seq ${sequence}  gaps ${gaps}  recoveries ${recoveries}  malformed ${malformed}`
      )
    }
    yield* Ref.set(previous, next)
    const domains = yield* view.domains
    const ready = domains.reduce((n, d) => n + d.lanes.filter((l) => l.ready).length, 0)
    const lanes = domains.reduce((n, d) => n + d.lanes.length, 0)
    lines.push(`  global   ${globalUrl}  domains ${domains.length}  lanes ready ${ready}/${lanes}`)
    for (const sample of samples) {
      const result = yield* Effect.either(
        view.overlap({ namespace: NAMESPACE, model: MODEL, blockHashes: sample.hashes })
      )
      const answer = Either.isLeft(result)
        ? result.left.message
        : dcs
            .map((dc) => {
              const match = result.right.find((r) => r.relay === dc.name)
              return `${dc.name} ${match === undefined ? "-" : `${match.prefixDepth}/${sample.hashes.length} blocks (${match.matchedTokens} tokens)`}`
            })
            .join("   ")
      lines.push(`    ${sample.label.padEnd(36)} ${answer}`)
    }
    const text = `${lines.join("\n")}\n`
    yield* Effect.sync(() => {
      // On a terminal, redraw in place; otherwise append (logs and CI output stay readable).
      if (process.stdout.isTTY === true) process.stdout.write(`\x1b[H\x1b[2J${text}`)
      else process.stdout.write(`${text}\n`)
    })
  })

export const demoProgram = (settings: DemoSettings) =>
  Effect.gen(function* () {
    const dir = yield* Effect.acquireRelease(
      Effect.sync(() => mkdtempSync(join(tmpdir(), "kvrelay-demo-"))),
      (dir) => Effect.sync(() => rmSync(dir, { recursive: true, force: true }))
    )
    const dcs = yield* Effect.forEach([0, 1], (dc) => startDc(dc, dir, settings))
    const globalPort = settings.httpPort === 0 ? 0 : settings.httpPort + DCS.length
    const globalContext = yield* Layer.build(
      GlobalHttpServer.layerGlobal(
        { relays: dcs.map((dc) => ({ name: dc.name, url: dc.url })) },
        { host: "127.0.0.1", port: globalPort }
      )
    )
    const globalUrl = yield* GlobalHttpServer.serverUrl.pipe(Effect.provide(globalContext))
    yield* Effect.sync(() => {
      process.stdout.write(`kvrelay demo: discovery documents in ${dir}\n`)
      for (const dc of dcs) process.stdout.write(`  relay ${dc.name}: ${dc.url} (${dc.path})\n`)
      process.stdout.write(`  global consumer: ${globalUrl}  (POST /v1/overlap, GET /v1/domains)\n\n`)
    })
    const workloads = yield* Effect.forEach(dcs, (dc, d) =>
      Effect.forEach(dc.workers, (worker) => Effect.forkScoped(runWorkload(worker, d)))
    )
    const previous = yield* Ref.make(new Map<string, number>())
    const started = Date.now()
    yield* Effect.forkScoped(
      summary(dcs, globalUrl, previous, started).pipe(
        Effect.provideService(GlobalView, Context.get(globalContext, GlobalView)),
        Effect.repeat(Schedule.spaced("2 seconds")),
        Effect.delay("2 seconds")
      )
    )
    if (settings.durationS !== undefined) yield* Effect.sleep(Duration.seconds(settings.durationS))
    else yield* Effect.never
    yield* Effect.forEach(workloads.flat(), Fiber.interrupt)
    yield* Effect.sync(() => process.stdout.write("kvrelay demo: stopping\n"))
  }).pipe(
    Effect.scoped,
    Effect.provide(
      observabilityLayer({
        logLevel: settings.logLevel,
        otlp: settings.otlp,
        env: process.env,
        defaultServiceName: "kvrelay-demo"
      })
    )
  )
