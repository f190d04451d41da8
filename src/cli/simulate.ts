/**
 * `kvrelay simulate`: simulated inference workers that register themselves, as real ones do,
 * for a relay to follow (the compose file's data source, and a way to try a relay without GPUs).
 * Half the workers publish the Dynamo event plane format (`dynamo-zmq`, with a worker query
 * server for recovery), half publish as vLLM and SGLang engines (`engine-zmq`, with a replay
 * endpoint). With `--etcd`, each worker registers its model card and source record under its own
 * etcd lease (10 s, kept alive, revoked on exit); with `--discovery-file`, the simulator keeps a
 * file-discovery document of every worker's records, rewritten atomically as workers come and
 * go, and empties it on exit. Either way, stopping the simulator withdraws its pools.
 *
 * The workload is tokens, as a router sees it: requests start from one of a set of popular
 * system prompts and continue with fresh user tokens. Engines send the tokens; Dynamo-format
 * workers send each block's tokens hash. Block hashes on the wire are each worker's own (no two
 * workers agree on them, as real engines do not), so only the relay's canonical addressing
 * (PROTOCOL §3.3) makes the same prompt land at the same place on every worker and in every DC.
 */

import { hostname } from "node:os"
import * as NodeFileSystem from "@effect/platform-node/NodeFileSystem"
import { Duration, Effect, Random, Schedule, type Scope } from "effect"
import { localBlockHashes, nextSequenceHash } from "../ckf/tokens.js"
import { hashPairsToBigInts } from "../ckf/u64.js"
import {
  type DiscoveryFileWriteError,
  type DiscoveryFileWriter,
  makeDiscoveryFileWriter
} from "../discovery/DiscoveryFileWriter.js"
import { type EtcdError, makeEtcdRegistrar } from "../discovery/EtcdDiscovery.js"
import type { KvEventSource } from "../protocol/Discovery.js"
import { type ModelCardInstance, ModelCardInstanceJson } from "../protocol/Discovery.js"
import { decodeJson } from "../protocol/Json.js"
import { EndpointId } from "../protocol/Model.js"
import { makeDynamoZmqPublisher } from "../simulate/DynamoZmqPublisher.js"
import { movingLoad, serveEngineMetrics } from "../simulate/EngineMetricsEndpoint.js"
import { makeEngineZmqPublisher } from "../simulate/EngineZmqPublisher.js"
import { makeWorkerQueryServer } from "../simulate/WorkerQueryServer.js"
import { commandObservability } from "./runtime.js"
import type { SimulateSettings } from "./settings.js"

/** System prompts of the workload; requests favour the first few steeply. */
const SYSTEM_PROMPTS = 32

/** Token ids of system prompt `p`: 6 to 14 blocks of 100000 + 1000·p + i (easy to type in a query). */
const systemPromptTokens = (prompt: number, blockSize: number): Array<number> =>
  Array.from({ length: (6 + (prompt % 5) * 2) * blockSize }, (_, i) => 100_000 + 1000 * prompt + i)

interface Block {
  readonly tokens: ReadonlyArray<number>
  readonly local: bigint
  /** The canonical sequence hash: the block's identity across workers. */
  readonly sequence: bigint
}

/** Full blocks of `tokens`, continuing the chain of `parent` when given. */
const blocksOf = (tokens: ReadonlyArray<number>, blockSize: number, parent?: Block): Array<Block> => {
  const locals = hashPairsToBigInts(localBlockHashes(tokens, blockSize))
  let previous = parent
  return locals.map((local, i) => {
    const block = {
      tokens: tokens.slice(i * blockSize, (i + 1) * blockSize),
      local,
      sequence: previous === undefined ? local : nextSequenceHash(previous.sequence, local)
    }
    previous = block
    return block
  })
}

interface Worker {
  readonly workerId: string
  readonly label: string
  readonly store: (blocks: ReadonlyArray<Block>, parent: Block | undefined) => Effect.Effect<void>
  readonly remove: (blocks: ReadonlyArray<Block>) => Effect.Effect<void>
}

/** `tcp://0.0.0.0:PORT` as the relays reach it: the advertised host, the bound port. */
const advertised = (endpoint: string, host: string): string =>
  endpoint.replace(/^tcp:\/\/[^/]*:(\d+)$/, `tcp://${host}:$1`)

const advertiseSource = (source: KvEventSource, host: string): KvEventSource => ({
  ...source,
  transport:
    source.transport.kind === "engine-zmq"
      ? {
          ...source.transport,
          endpoint: advertised(source.transport.endpoint, host),
          replayEndpoint:
            source.transport.replayEndpoint === null
              ? null
              : advertised(source.transport.replayEndpoint, host)
        }
      : { ...source.transport, endpoint: advertised(source.transport.endpoint, host) },
  recoveryTarget:
    source.recoveryTarget === null ? null : { endpoint: advertised(source.recoveryTarget.endpoint, host) }
})

const decodeCard = decodeJson(ModelCardInstanceJson)

const makeWorker = (
  settings: SimulateSettings,
  registry: WorkerRegistry,
  serving: EndpointId,
  index: number
) =>
  Effect.gen(function* () {
    const workerId = String(settings.workerIdBase + index)
    const bind = `tcp://${settings.bindHost}:*`
    // A wildcard bind address is no address a relay can connect to: advertise the host's name.
    const host =
      settings.advertiseHost ??
      (["0.0.0.0", "::", "*"].includes(settings.bindHost) ? hostname() : settings.bindHost)
    // Each worker names blocks its own way: an external hash derived from the canonical one.
    const salt = BigInt.asUintN(64, 0x5eed_0000n + BigInt(index) * 0x9e37_79b9n)
    const external = (block: Block) => nextSequenceHash(salt, block.sequence, 0n)
    const parentOf = (parent: Block | undefined) =>
      parent === undefined ? {} : { parentHash: external(parent) }
    let worker: Worker
    let source: KvEventSource
    if (index % 2 === 0) {
      const queryServer = yield* makeWorkerQueryServer({ workerId, dpRanks: [0], endpoint: bind })
      const publisher = yield* makeDynamoZmqPublisher({ workerId, dpRank: 0, queryServer, endpoint: bind })
      source = yield* publisher.source(serving)
      worker = {
        workerId,
        label: "dynamo-zmq",
        store: (blocks, parent) =>
          Effect.asVoid(
            publisher.store(blocks.map(external), {
              ...parentOf(parent),
              tokensHashes: blocks.map((b) => b.local)
            })
          ).pipe(Effect.orDie),
        remove: (blocks) => Effect.asVoid(publisher.remove(blocks.map(external))).pipe(Effect.orDie)
      }
    } else {
      const format = index % 4 === 1 ? "vllm" : "sglang"
      const publisher = yield* makeEngineZmqPublisher({
        workerId,
        dpRank: 0,
        format,
        blockSize: settings.blockSize,
        endpoint: bind,
        replayEndpoint: bind
      })
      source = yield* publisher.source(serving)
      worker = {
        workerId,
        label: `engine-zmq (${format})`,
        store: (blocks, parent) =>
          Effect.asVoid(
            publisher.store(blocks.map(external), {
              ...parentOf(parent),
              tokenIds: blocks.flatMap((b) => b.tokens)
            })
          ).pipe(Effect.orDie),
        remove: (blocks) => Effect.asVoid(publisher.remove(blocks.map(external))).pipe(Effect.orDie)
      }
    }
    const card = yield* decodeCard({
      namespace: serving.namespace,
      component: serving.component,
      endpoint: serving.endpoint,
      instanceId: workerId,
      modelSuffix: null,
      card: {
        name: settings.model,
        sourcePath: settings.model,
        kvCacheBlockSize: settings.blockSize,
        aliases: [],
        workerType: "aggregated",
        lora: null,
        indexerIdentity: null,
        runtimeConfig: {
          dataParallelStartRank: 0,
          dataParallelSize: 1,
          enableLocalIndexer: true,
          kvStateEndpoint: null,
          enableEagle: false,
          totalKvBlocks: String(settings.cacheBlocks),
          maxNumBatchedTokens: "8192"
        }
      }
    })
    const metrics = yield* serveWorkerMetrics(settings, index, host)
    const advertisedSource = { ...advertiseSource(source, host), metricsUrl: metrics.url }
    const where = yield* registry.register(workerId, card, advertisedSource)
    yield* Effect.logInfo("simulated worker registered").pipe(
      Effect.annotateLogs({
        worker: workerId,
        format: worker.label,
        endpoint: advertisedSource.transport.endpoint,
        metricsUrl: metrics.url,
        ...where
      })
    )
    return worker
  })

/**
 * A worker's engine metrics endpoint (PROTOCOL §2 `metricsUrl`): vLLM's names for Dynamo-format
 * and vLLM workers, SGLang's for SGLang ones, bound beside its ZeroMQ sockets. Its load moves in
 * a 60 s wave whose phase differs per worker, so relays and routers see load change.
 */
const serveWorkerMetrics = (settings: SimulateSettings, index: number, advertiseHost: string) =>
  Effect.gen(function* () {
    const endpoint = yield* serveEngineMetrics({
      format: index % 4 === 3 ? "sglang" : "vllm",
      model: settings.model,
      host: settings.bindHost,
      advertiseHost
    })
    const phase = (index * 0.37) % 1
    yield* Effect.forkScoped(
      movingLoad(endpoint, {
        phase,
        periodS: 60,
        kvUsage: () => 0.2 + 0.6 * Math.max(0, Math.sin(2 * Math.PI * (Date.now() / 60_000 + phase)))
      })
    )
    return endpoint
  })

/**
 * Where the simulated workers advertise themselves. A registration lasts as long as the calling
 * scope (the worker's life) and says where it went, for the log line.
 */
interface WorkerRegistry {
  readonly register: (
    workerId: string,
    card: ModelCardInstance,
    source: KvEventSource
  ) => Effect.Effect<Record<string, string>, DiscoveryFileWriteError | EtcdError, Scope.Scope>
}

/** Each worker under its own etcd lease, as Dynamo's workers register. */
const etcdRegistry = (endpoints: ReadonlyArray<string>, prefix: string): WorkerRegistry => ({
  register: (_workerId, card, source) =>
    Effect.gen(function* () {
      // etcd may still be starting (compose starts everything at once): wait for it, loudly.
      const registrar = yield* makeEtcdRegistrar({ endpoints, prefix }).pipe(
        Effect.tapError((error) =>
          Effect.logWarning(`cannot register with etcd yet, retrying: ${error.message}`)
        ),
        Effect.retry(Schedule.exponential("200 millis").pipe(Schedule.union(Schedule.spaced("5 seconds"))))
      )
      yield* registrar.registerCard(card)
      yield* registrar.registerSource(source)
      return { lease: registrar.leaseId }
    })
})

/** Every worker's records in one discovery document, kept current by this process. */
const fileRegistry = (writer: DiscoveryFileWriter): WorkerRegistry => ({
  register: (workerId, card, source) =>
    writer
      .advertise(workerId, { cards: [card], sources: [source] })
      .pipe(Effect.as({ discoveryFile: writer.path }))
})

/**
 * One worker's traffic: each request is a popular system prompt plus fresh user tokens; blocks
 * the worker does not hold yet are stored, the least recently used are evicted beyond its cache.
 */
const runWorkload = (
  worker: Worker,
  settings: SimulateSettings,
  systemBlocks: ReadonlyArray<ReadonlyArray<Block>>
) =>
  Effect.gen(function* () {
    const cached = new Map<bigint, Block>()
    const touch = (block: Block) => {
      cached.delete(block.sequence)
      cached.set(block.sequence, block)
    }
    const interval = Duration.millis(Math.max(1, Math.round(1000 / settings.requestsPerSecond)))
    let evicting = false
    for (;;) {
      const prompt = Math.floor((yield* Random.next) ** 3 * SYSTEM_PROMPTS)
      const prefix = systemBlocks[prompt]!
      const userTokens = yield* Effect.forEach(
        Array.from({ length: (yield* Random.nextIntBetween(1, 6)) * settings.blockSize }),
        () => Random.nextIntBetween(1_000_000, 2_000_000)
      )
      const blocks = [...prefix, ...blocksOf(userTokens, settings.blockSize, prefix[prefix.length - 1])]
      let firstNew = blocks.findIndex((b) => !cached.has(b.sequence))
      while (firstNew >= 0 && firstNew < blocks.length) {
        const chunk = blocks.slice(firstNew, firstNew + 16)
        yield* worker.store(chunk, firstNew === 0 ? undefined : blocks[firstNew - 1])
        firstNew += chunk.length
      }
      // Tail first, as vLLM frees a request's blocks: a parent is always used more recently than
      // its children, so eviction takes children first and what a worker holds stays closed under
      // prefixes. A block kept without its parent could not be chained (ParentBlockNotFound).
      for (let i = blocks.length - 1; i >= 0; i--) touch(blocks[i]!)
      if (cached.size > settings.cacheBlocks) {
        const evicted: Array<Block> = []
        for (const b of cached.values()) {
          if (cached.size - evicted.length <= settings.cacheBlocks) break
          evicted.push(b)
        }
        for (const b of evicted) cached.delete(b.sequence)
        for (let i = 0; i < evicted.length; i += 32) yield* worker.remove(evicted.slice(i, i + 32))
        if (!evicting) {
          evicting = true
          // From here on a relay that joins meets removals and children of blocks it never saw.
          yield* Effect.logInfo("simulated worker's cache is full; it evicts from now on").pipe(
            Effect.annotateLogs({ worker: worker.workerId, cacheBlocks: settings.cacheBlocks })
          )
        }
      }
      yield* Effect.sleep(interval)
    }
  })

/**
 * `kvrelay simulate`: simulated workers that register in discovery and publish until interrupted.
 */
export const simulateProgram = (settings: SimulateSettings) =>
  Effect.gen(function* () {
    const serving = new EndpointId({
      namespace: settings.namespace,
      component: "backend",
      endpoint: "generate"
    })
    const systemBlocks = Array.from({ length: SYSTEM_PROMPTS }, (_, p) =>
      blocksOf(systemPromptTokens(p, settings.blockSize), settings.blockSize)
    )
    const registry =
      settings.discoveryFile !== undefined
        ? fileRegistry(
            yield* makeDiscoveryFileWriter(settings.discoveryFile).pipe(Effect.provide(NodeFileSystem.layer))
          )
        : etcdRegistry(settings.etcd ?? [], settings.etcdPrefix)
    const workers: Array<Worker> = []
    for (let i = 0; i < settings.workers; i++) workers.push(yield* makeWorker(settings, registry, serving, i))
    const query = {
      namespace: settings.namespace,
      model: settings.model,
      tokens: systemPromptTokens(0, settings.blockSize).slice(0, 4 * settings.blockSize)
    }
    yield* Effect.sync(() =>
      process.stdout.write(
        `${JSON.stringify({ event: "simulating", workers: workers.length, endpoint: serving.toString(), query })}\n`
      )
    )
    yield* Effect.forEach(workers, (worker) => Effect.forkScoped(runWorkload(worker, settings, systemBlocks)))
    if (settings.durationS !== undefined) yield* Effect.sleep(Duration.seconds(settings.durationS))
    else yield* Effect.never
  }).pipe(Effect.scoped, Effect.provide(commandObservability(settings, "kvrelay-simulate")))
