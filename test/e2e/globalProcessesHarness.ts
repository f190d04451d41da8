/**
 * Harness of the global-consumer end-to-end tests (issue 7): real `kvrelay relay` and
 * `kvrelay global` OS processes, simulated workers on real ZeroMQ in the test process, discovery
 * documents in a temporary directory, and plain `fetch` against the processes' HTTP APIs
 * (PROTOCOL.md §1, §2, §5, §7). Nothing here uses the project's HTTP clients: the processes are
 * observed only through their external contracts.
 *
 * The processes run the compiled CLI (`bin/kvrelay.js` → `dist/`): vitest's global setup
 * (`test/e2e/build.globalSetup.ts`) builds `dist/` when it is stale.
 */

import { type ChildProcess, spawn } from "node:child_process"
import { mkdtempSync, renameSync, rmSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { fileURLToPath } from "node:url"
import { Effect, Exit, Scope } from "effect"
import { chainSequenceHash } from "../../src/ckf/global.js"
import { localBlockHashes } from "../../src/ckf/tokens.js"
import { hashPairs, hashPairsToBigInts } from "../../src/ckf/u64.js"
import { makeDynamoZmqPublisher } from "../../src/simulate/DynamoZmqPublisher.js"
import { type EngineZmqPublisher, makeEngineZmqPublisher } from "../../src/simulate/EngineZmqPublisher.js"
import { defaultTokenIds } from "../../src/simulate/SimulatedAddresses.js"
import { makeWorkerQueryServer } from "../../src/simulate/WorkerQueryServer.js"

export const REPO = fileURLToPath(new URL("../..", import.meta.url))
const BIN = join(REPO, "bin", "kvrelay.js")

const sleep = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms))

// ---------------------------------------------------------------------------------------------
// Processes

export interface ExitStatus {
  readonly code: number | null
  readonly signal: NodeJS.Signals | null
}

export interface KvrelayProcess {
  readonly label: string
  readonly child: ChildProcess
  readonly url: string
  readonly port: number
  /** Resolves when the process has exited. */
  readonly exited: Promise<ExitStatus>
  /** The last lines of stderr (logs), for failure messages. */
  readonly logTail: () => string
  /** Everything the process wrote to stderr so far (its logs), up to `LOG_KEPT_CHARS`. */
  readonly log: () => string
}

const live = new Set<KvrelayProcess>()
const LOG_TAIL_LINES = 80
/** The processes of these tests log little; a runaway log is cut rather than held. */
const LOG_KEPT_CHARS = 8 * 1024 * 1024

/** The environment without `KVRELAY_*` / `OTEL_*` settings of the machine running the tests. */
const cleanEnv = (): NodeJS.ProcessEnv => {
  const env: NodeJS.ProcessEnv = {}
  for (const [key, value] of Object.entries(process.env)) {
    if (!key.startsWith("KVRELAY_") && !key.startsWith("OTEL_")) env[key] = value
  }
  return env
}

/**
 * Spawns `node bin/kvrelay.js ARGS…` and resolves once it printed its `listening` line (PROTOCOL
 * §1); a process that exits or stays silent for `timeoutMs` is killed and the promise rejects.
 */
export const startKvrelay = (
  label: string,
  args: ReadonlyArray<string>,
  timeoutMs = 20_000
): Promise<KvrelayProcess> =>
  new Promise((resolve, reject) => {
    const child = spawn(process.execPath, [BIN, ...args], {
      cwd: REPO,
      env: cleanEnv(),
      stdio: ["ignore", "pipe", "pipe"]
    })
    const tail: Array<string> = []
    let partial = ""
    let all = ""
    child.stderr!.setEncoding("utf8")
    child.stderr!.on("data", (chunk: string) => {
      if (all.length < LOG_KEPT_CHARS) all += chunk
      const lines = (partial + chunk).split("\n")
      partial = lines.pop()!
      tail.push(...lines)
      if (tail.length > LOG_TAIL_LINES) tail.splice(0, tail.length - LOG_TAIL_LINES)
    })
    const logTail = () => [...tail, partial].join("\n")
    const log = () => all
    const exited = new Promise<ExitStatus>((done) => {
      child.once("exit", (code, signal) => done({ code, signal }))
    })
    // Tracked at once, so that stopAll() reaches a process that never got to listen.
    const pending: KvrelayProcess = { label, child, url: "", port: 0, exited, logTail, log }
    live.add(pending)
    void exited.then(() => live.delete(pending))
    let settled = false
    const fail = (why: string) => {
      if (settled) return
      settled = true
      clearTimeout(timer)
      child.kill("SIGKILL")
      reject(new Error(`${label}: ${why}\n--- stderr tail ---\n${logTail()}`))
    }
    const timer = setTimeout(() => fail(`no listening line within ${timeoutMs} ms`), timeoutMs)
    void exited.then((status) =>
      fail(`exited before listening (code ${status.code}, signal ${status.signal})`)
    )
    let stdout = ""
    child.stdout!.setEncoding("utf8")
    child.stdout!.on("data", (chunk: string) => {
      if (settled) return
      stdout += chunk
      for (;;) {
        const newline = stdout.indexOf("\n")
        if (newline < 0) break
        const line = stdout.slice(0, newline)
        stdout = stdout.slice(newline + 1)
        let parsed: unknown
        try {
          parsed = JSON.parse(line)
        } catch {
          continue
        }
        const record = parsed as { event?: unknown; url?: unknown }
        if (record.event === "listening" && typeof record.url === "string") {
          settled = true
          clearTimeout(timer)
          const url = record.url
          const proc: KvrelayProcess = { ...pending, url, port: Number(new URL(url).port) }
          live.delete(pending)
          live.add(proc)
          void exited.then(() => live.delete(proc))
          resolve(proc)
          return
        }
      }
    })
  })

/**
 * Sends `signal` (resuming a stopped process first) and waits for the exit; after `timeoutMs`
 * the process is SIGKILLed and the promise rejects. Returns the exit status and how long it took.
 */
export const stopKvrelay = async (
  proc: KvrelayProcess,
  signal: NodeJS.Signals = "SIGTERM",
  timeoutMs = 10_000
): Promise<ExitStatus & { readonly ms: number }> => {
  const started = Date.now()
  if (proc.child.exitCode === null && proc.child.signalCode === null) {
    proc.child.kill("SIGCONT")
    proc.child.kill(signal)
  }
  let timer: NodeJS.Timeout | undefined
  const timeout = new Promise<"timeout">((resolve) => {
    timer = setTimeout(() => resolve("timeout"), timeoutMs)
  })
  const status = await Promise.race([proc.exited, timeout])
  clearTimeout(timer)
  if (status === "timeout") {
    proc.child.kill("SIGKILL")
    await proc.exited
    throw new Error(`${proc.label} did not exit within ${timeoutMs} ms of ${signal}\n${proc.logTail()}`)
  }
  return { ...status, ms: Date.now() - started }
}

/** Stops every process of this file still running (SIGTERM, SIGKILL after 5 s); never throws. */
export const stopAll = async (): Promise<void> => {
  await Promise.all(
    [...live].map((proc) =>
      stopKvrelay(proc, "SIGTERM", 5_000).catch(() => {
        // killed by the timeout path
      })
    )
  )
}

// ---------------------------------------------------------------------------------------------
// Temporary directory and discovery documents

export interface TempDir {
  readonly path: string
  readonly remove: () => void
}

export const makeTempDir = (): TempDir => {
  const path = mkdtempSync(join(tmpdir(), "kvrelay-e2e-global-"))
  return { path, remove: () => rmSync(path, { recursive: true, force: true }) }
}

/** Writes a file discovery document atomically (the relay watches and re-reads it). */
export const writeDiscovery = (
  path: string,
  document: { readonly cards: ReadonlyArray<unknown>; readonly sources: ReadonlyArray<unknown> }
): void => {
  writeFileSync(`${path}.tmp`, JSON.stringify({ version: 1, ...document }, null, 2))
  renameSync(`${path}.tmp`, path)
}

// ---------------------------------------------------------------------------------------------
// Simulated workers (real wire formats, in this process)

export const NAMESPACE = "prod"
export const MODEL = "llama"
export const ALIAS = "chat"
export const KV_BLOCK_SIZE = 64
export const SERVING = { namespace: NAMESPACE, component: "backend", endpoint: "generate" } as const
const KV_STATE_ENDPOINT = `${SERVING.namespace}.${SERVING.component}.${SERVING.endpoint}`

/** One worker rank publishing KV events, with its discovery records as raw JSON (PROTOCOL §2). */
export interface SimWorker {
  readonly workerId: string
  /** One Stored event (batch) of consecutive chained blocks; `parent` is the block before them. */
  readonly store: (hashes: ReadonlyArray<bigint>, parent?: bigint) => Promise<void>
  readonly remove: (hashes: ReadonlyArray<bigint>) => Promise<void>
  /** `Cleared` (Dynamo) / `AllBlocksCleared` (engines). */
  readonly clear: () => Promise<void>
  readonly card: () => Record<string, unknown>
  readonly source: () => Promise<Record<string, unknown>>
}

const cardJson = (workerId: string): Record<string, unknown> => ({
  ...SERVING,
  instanceId: workerId,
  modelSuffix: null,
  card: {
    name: MODEL,
    sourcePath: "meta/llama",
    kvCacheBlockSize: KV_BLOCK_SIZE,
    aliases: [ALIAS],
    workerType: "aggregated",
    lora: null,
    indexerIdentity: null,
    runtimeConfig: {
      dataParallelStartRank: 0,
      dataParallelSize: 1,
      enableLocalIndexer: true,
      kvStateEndpoint: null,
      enableEagle: false,
      totalKvBlocks: "100000",
      maxNumBatchedTokens: "8192"
    }
  }
})

/**
 * A LoRA adapter's card on `workerId` (PROTOCOL §2): joined to the worker's base card by its
 * `instanceId`, served as `<model>-<adapter>`, so the relay registers `{lora: {baseModel, adapter}}`.
 */
export const adapterCardJson = (workerId: string, adapter: string): Record<string, unknown> => {
  const base = cardJson(workerId)
  const card = base.card as Record<string, unknown>
  return {
    ...base,
    modelSuffix: adapter,
    card: { ...card, name: `${MODEL}-${adapter}`, aliases: [], lora: { name: adapter, maxGpuLoraCount: 4 } }
  }
}

const inScope = <A, E>(scope: Scope.Scope, effect: Effect.Effect<A, E, Scope.Scope>): Promise<A> =>
  Effect.runPromise(Scope.extend(effect, scope))

const go = <A, E>(effect: Effect.Effect<A, E>): Promise<void> => Effect.runPromise(Effect.asVoid(effect))

/** A Dynamo worker rank: event-plane PUB plus a worker-query ROUTER (a recoverable source). */
export const dynamoWorker = async (scope: Scope.Scope, workerId: string): Promise<SimWorker> => {
  const queryServer = await inScope(scope, makeWorkerQueryServer({ workerId, dpRanks: [0] }))
  const publisher = await inScope(
    scope,
    makeDynamoZmqPublisher({ workerId, dpRank: 0, queryServer, blockSize: KV_BLOCK_SIZE })
  )
  return {
    workerId,
    store: (hashes, parent) =>
      go(publisher.store(hashes, parent === undefined ? {} : { parentHash: parent })),
    remove: (hashes) => go(publisher.remove(hashes)),
    clear: () => go(publisher.clear),
    card: () => cardJson(workerId),
    source: async () => ({
      kvStateEndpoint: KV_STATE_ENDPOINT,
      workerId,
      dpRank: 0,
      publisherId: String(await Effect.runPromise(publisher.publisherId)),
      transport: { kind: "dynamo-zmq", endpoint: publisher.endpoint, topic: publisher.topic },
      recoveryTarget: { endpoint: queryServer.endpoint }
    })
  }
}

/** A vLLM (tagged maps, unsigned hashes) or SGLang (tagged arrays, signed hashes) engine rank. */
export const engineWorker = async (
  scope: Scope.Scope,
  workerId: string,
  format: "vllm" | "sglang"
): Promise<SimWorker> => {
  const publisher = await inScope(
    scope,
    makeEngineZmqPublisher({ workerId, dpRank: 0, format, blockSize: KV_BLOCK_SIZE })
  )
  return engineWorkerOf(publisher, workerId)
}

const engineWorkerOf = async (publisher: EngineZmqPublisher, workerId: string): Promise<SimWorker> => ({
  workerId,
  store: (hashes, parent) => go(publisher.store(hashes, parent === undefined ? {} : { parentHash: parent })),
  remove: (hashes) => go(publisher.remove(hashes)),
  clear: () => go(publisher.clear),
  card: () => cardJson(workerId),
  source: async () => ({
    kvStateEndpoint: KV_STATE_ENDPOINT,
    workerId,
    dpRank: 0,
    publisherId: String(await Effect.runPromise(publisher.publisherId)),
    transport: {
      kind: "engine-zmq",
      endpoint: publisher.endpoint,
      topic: publisher.topic,
      replayEndpoint: publisher.replayEndpoint
    },
    recoveryTarget: null
  })
})

/** A vLLM engine whose blocks are given by their tokens, named on the wire by hashes of its own. */
export interface TokenEngine extends SimWorker {
  /** One BlockStored of `tokenIds` (full blocks of `KV_BLOCK_SIZE`), named `hashes`. */
  readonly storeTokens: (
    hashes: ReadonlyArray<bigint>,
    tokenIds: ReadonlyArray<number>,
    options?: { readonly parent?: bigint; readonly loraName?: string }
  ) => Promise<void>
  /** The next batch is kept for replay but not sent: the relay sees a gap. */
  readonly dropNext: () => Promise<void>
}

export const tokenEngine = async (scope: Scope.Scope, workerId: string): Promise<TokenEngine> => {
  const publisher = await inScope(
    scope,
    makeEngineZmqPublisher({ workerId, dpRank: 0, format: "vllm", blockSize: KV_BLOCK_SIZE })
  )
  const worker = await engineWorkerOf(publisher, workerId)
  return {
    ...worker,
    storeTokens: (hashes, tokenIds, options = {}) =>
      go(
        publisher.store(hashes, {
          tokenIds,
          ...(options.parent === undefined ? {} : { parentHash: options.parent }),
          ...(options.loraName === undefined ? {} : { loraName: options.loraName })
        })
      ),
    dropNext: () => go(publisher.dropNext(1))
  }
}

export const makeScope = (): Promise<Scope.CloseableScope> => Effect.runPromise(Scope.make())

export const closeScope = (scope: Scope.CloseableScope): Promise<void> =>
  Effect.runPromise(Scope.close(scope, Exit.void))

/** The discovery document of a DC's workers, each also serving the LoRA `adapters` given. */
export const discoveryOf = async (
  workers: ReadonlyArray<SimWorker>,
  adapters: ReadonlyArray<string> = []
) => ({
  cards: workers.flatMap((w) => [
    w.card(),
    ...adapters.map((adapter) => adapterCardJson(w.workerId, adapter))
  ]),
  sources: await Promise.all(workers.map((w) => w.source()))
})

// ---------------------------------------------------------------------------------------------
// Prompts

/** Block hashes as workers publish them: block i chains block i−1 (PROTOCOL §7). */
export const promptBlocks = (prompt: number, length: number): Array<bigint> => {
  const out: Array<bigint> = []
  for (let i = 0; i < length; i++) {
    // Locals above 2^63: the SGLang encoding sends them as negative int64s.
    const local = 0xf00d_0000_0000_0000n + (BigInt(prompt) << 20n) + BigInt(i)
    out.push(i === 0 ? local : chainSequenceHash(out[i - 1]!, local, 0n))
  }
  return out
}

// ---------------------------------------------------------------------------------------------
// HTTP (plain fetch) and polling

export interface HttpAnswer {
  readonly status: number
  readonly body: unknown
  readonly text: string
}

export const request = async (
  url: string,
  init: { readonly method?: string; readonly body?: string } = {}
): Promise<HttpAnswer> => {
  const response = await fetch(url, {
    method: init.method ?? "GET",
    ...(init.body === undefined ? {} : { body: init.body, headers: { "content-type": "application/json" } }),
    // Generous: a relay churning large deltas on a busy machine may take seconds to answer.
    signal: AbortSignal.timeout(15_000)
  })
  const text = await response.text()
  let body: unknown
  try {
    body = JSON.parse(text)
  } catch {
    body = undefined
  }
  return { status: response.status, body, text }
}

export interface OverlapResult {
  readonly relay: string
  readonly lane: number
  readonly poolId: unknown
  readonly servingEndpoint: unknown
  readonly prefixDepth: number
  readonly matchedTokens: number
}

export interface DomainLane {
  readonly lane: number
  readonly relay: string
  readonly poolId: { readonly dcId: string; readonly [key: string]: unknown }
  readonly producer: { readonly producerIncarnation: string; readonly [key: string]: unknown }
  readonly servingEndpoint: unknown
  readonly ready: boolean
  readonly installedSequence: string | null
}

export interface DomainEntry {
  readonly cacheSemantics: unknown
  readonly routingScope: unknown
  readonly querySemantics: { readonly kvBlockSize: number; readonly hashFormat: string }
  readonly lanes: ReadonlyArray<DomainLane>
}

/**
 * The prompt whose blocks the simulated workers store as `hashes`: they derive a block's tokens
 * from its hash (see `defaultTokenIds`), so this is what a router holding that prompt sends.
 */
export const promptTokens = (hashes: ReadonlyArray<bigint>): Array<number> =>
  defaultTokenIds(hashPairs(hashes), KV_BLOCK_SIZE)

/** `POST /v1/overlap` by model and tokens, for the prompt the workers store as `hashes`. */
export const overlap = (
  globalUrl: string,
  hashes: ReadonlyArray<bigint>,
  model = MODEL,
  namespace = NAMESPACE
): Promise<HttpAnswer> =>
  request(`${globalUrl}/v1/overlap`, {
    method: "POST",
    body: JSON.stringify({ namespace, model, tokens: promptTokens(hashes) })
  })

/** Depth per relay for the prompt the workers store as `hashes`, asked by its local block hashes. */
export const depthsByLocal = async (
  globalUrl: string,
  hashes: ReadonlyArray<bigint>
): Promise<Record<string, number>> => {
  const local = hashPairsToBigInts(localBlockHashes(promptTokens(hashes), KV_BLOCK_SIZE))
  const answer = await request(`${globalUrl}/v1/overlap`, {
    method: "POST",
    body: JSON.stringify({ namespace: NAMESPACE, model: MODEL, localBlockHashes: local.map(String) })
  })
  if (answer.status !== 200) throw new Error(`POST /v1/overlap answered ${answer.status}: ${answer.text}`)
  const out: Record<string, number> = {}
  for (const result of (answer.body as { results: ReadonlyArray<OverlapResult> }).results) {
    out[result.relay] = result.prefixDepth
  }
  return out
}

export const domains = async (globalUrl: string): Promise<ReadonlyArray<DomainEntry>> => {
  const answer = await request(`${globalUrl}/v1/domains`)
  if (answer.status !== 200) throw new Error(`GET /v1/domains answered ${answer.status}: ${answer.text}`)
  return answer.body as ReadonlyArray<DomainEntry>
}

/** Depth per relay name of a successful overlap answer (throws on anything else). */
export const depths = async (
  globalUrl: string,
  hashes: ReadonlyArray<bigint>
): Promise<Record<string, number>> => {
  const answer = await overlap(globalUrl, hashes)
  if (answer.status !== 200) throw new Error(`POST /v1/overlap answered ${answer.status}: ${answer.text}`)
  const out: Record<string, number> = {}
  for (const result of (answer.body as { results: ReadonlyArray<OverlapResult> }).results) {
    out[result.relay] = result.prefixDepth
  }
  return out
}

/**
 * Calls `probe` until `accept` holds for its value, or throws after `timeoutMs` with the last
 * value or error. A bounded deadline, never a fixed sleep: the consumer converges asynchronously.
 */
export const eventually = async <A>(
  what: string,
  probe: () => Promise<A>,
  accept: (value: A) => boolean,
  timeoutMs = 20_000,
  intervalMs = 25
): Promise<A> => {
  const deadline = Date.now() + timeoutMs
  let last = "nothing yet"
  for (;;) {
    try {
      const value = await probe()
      if (accept(value)) return value
      last = JSON.stringify(value)
    } catch (error) {
      last = error instanceof Error ? error.message : String(error)
    }
    if (Date.now() > deadline)
      throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}; last: ${last}`)
    await sleep(intervalMs)
  }
}

/** The lanes of every domain by relay name. */
export const lanesByRelay = async (globalUrl: string): Promise<Record<string, DomainLane>> => {
  const lanes: Record<string, DomainLane> = {}
  for (const domain of await domains(globalUrl)) for (const lane of domain.lanes) lanes[lane.relay] = lane
  return lanes
}

/** The lanes by relay name once `accept` holds for them. */
export const lanesWhen = (
  globalUrl: string,
  what: string,
  accept: (lanes: Record<string, DomainLane>) => boolean,
  timeoutMs = 20_000
): Promise<Record<string, DomainLane>> => eventually(what, () => lanesByRelay(globalUrl), accept, timeoutMs)

/** Block counts by worker id from the relay's `GET /v1/stats`. */
export const memberBlocks = async (relayUrl: string): Promise<Record<string, number>> => {
  const answer = await request(`${relayUrl}/v1/stats`)
  if (answer.status !== 200) throw new Error(`GET /v1/stats answered ${answer.status}`)
  const stats = answer.body as {
    endpoints: ReadonlyArray<{
      aggregation: { members: ReadonlyArray<{ workerId: string; blocks: number }> } | null
    }>
  }
  const out: Record<string, number> = {}
  for (const endpoint of stats.endpoints)
    for (const member of endpoint.aggregation?.members ?? []) out[member.workerId] = member.blocks
  return out
}

/** The first pool of the relay's `GET /v1/catalog` (the tests serve one endpoint per DC). */
export const catalogProducer = async (relayUrl: string): Promise<DomainLane["producer"]> => {
  const answer = await request(`${relayUrl}/v1/catalog`)
  if (answer.status !== 200) throw new Error(`GET /v1/catalog answered ${answer.status}`)
  const pools = (answer.body as { pools: ReadonlyArray<{ producer: DomainLane["producer"] }> }).pools
  if (pools.length !== 1) throw new Error(`expected one pool in the catalog, got ${pools.length}`)
  return pools[0]!.producer
}

export const metrics = async (url: string): Promise<string> => {
  const answer = await request(`${url}/metrics`)
  if (answer.status !== 200) throw new Error(`GET /metrics answered ${answer.status}`)
  return answer.text
}

/** The sum of the Prometheus samples of `name` whose labels include `labels` (0 when absent). */
export const metricValue = (
  text: string,
  name: string,
  labels: Readonly<Record<string, string>> = {}
): number => {
  let total = 0
  for (const line of text.split("\n")) {
    const match = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{([^}]*)\})?\s+(\S+)/.exec(line)
    if (match === null || match[1] !== name) continue
    const present: Record<string, string> = {}
    for (const pair of (match[3] ?? "").matchAll(/([a-zA-Z_][a-zA-Z0-9_]*)="([^"]*)"/g)) {
      present[pair[1]!] = pair[2]!
    }
    if (Object.entries(labels).every(([key, value]) => present[key] === value)) total += Number(match[4])
  }
  return total
}

// ---------------------------------------------------------------------------------------------
// The processes of a two-DC deployment

/** `kvrelay relay --dc-id DC --discovery file:PATH --http 127.0.0.1:PORT …` (port 0 = any free port). */
export const startRelay = (dcId: string, discoveryPath: string, port = 0): Promise<KvrelayProcess> =>
  startKvrelay(`relay ${dcId}`, [
    "relay",
    "--dc-id",
    dcId,
    "--discovery",
    `file:${discoveryPath}`,
    "--http",
    `127.0.0.1:${port}`,
    "--publication-delay-ms",
    "1",
    "--expected-unique-blocks",
    "65536"
  ])

/** `kvrelay global --relay NAME=URL … --http 127.0.0.1:0 …extra` (lane order = argument order). */
export const startGlobal = (
  relays: ReadonlyArray<readonly [string, string]>,
  extra: ReadonlyArray<string> = []
): Promise<KvrelayProcess> =>
  startKvrelay("global", [
    "global",
    ...relays.flatMap(([name, url]) => ["--relay", `${name}=${url}`]),
    "--http",
    "127.0.0.1:0",
    ...extra
  ])

let warmUpCounter = 0n

/**
 * Makes sure the relay hears each worker live before a test relies on single events: a ZeroMQ
 * SUB only receives what is published after its subscription arrived, and an event lost that way
 * is noticed only when a later one shows the gap. Each worker stores a fresh block nobody queries
 * until the relay's `GET /v1/stats` shows the worker's block count grow; a lost attempt is
 * followed by another, whose gap makes the relay recover the lost one.
 */
export const warmUp = async (relayUrl: string, workers: ReadonlyArray<SimWorker>): Promise<void> => {
  for (const worker of workers) {
    const before = (await memberBlocks(relayUrl))[worker.workerId] ?? 0
    const deadline = Date.now() + 15_000
    let heard = false
    while (!heard) {
      if (Date.now() > deadline) throw new Error(`relay ${relayUrl} never heard worker ${worker.workerId}`)
      warmUpCounter += 1n
      await worker.store([0x7a7a_0000_0000_0000n + warmUpCounter])
      const until = Date.now() + 1_000
      while (!heard && Date.now() < until) {
        heard = ((await memberBlocks(relayUrl))[worker.workerId] ?? 0) > before
        if (!heard) await sleep(20)
      }
    }
  }
}
