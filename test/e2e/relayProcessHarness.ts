/**
 * The outside view of a `kvrelay` process for the end-to-end tests: the compiled CLI run as a
 * child process, a discovery file in a temporary directory, simulated workers on the real
 * ZeroMQ wire formats, and an HTTP client written against PROTOCOL.md §5 (pool-stream frames are
 * decoded here by hand; CBI1 payloads with the CKF codec).
 *
 * Every child process, worker socket and temporary directory is tracked, so `cleanup()` in an
 * `afterEach` / `afterAll` releases them even when a test fails. Every wait has a wall-clock
 * deadline; nothing sleeps for a fixed time.
 */

import { type ChildProcess, spawn } from "node:child_process"
import { mkdtempSync, renameSync, rmSync, writeFileSync } from "node:fs"
import * as http from "node:http"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { fileURLToPath } from "node:url"
import { Effect, Exit, Scope } from "effect"
import { prepare } from "../../src/ckf/addressing.js"
import { Cbi1SnapshotAssembler, decodeCbi1 } from "../../src/ckf/cbi1.js"
import { DcCkfFormatIdentity } from "../../src/ckf/identity.js"
import { type DynamoZmqPublisher, makeDynamoZmqPublisher } from "../../src/simulate/DynamoZmqPublisher.js"
import { type EngineZmqPublisher, makeEngineZmqPublisher } from "../../src/simulate/EngineZmqPublisher.js"
import { makeWorkerQueryServer, type WorkerQueryServer } from "../../src/simulate/WorkerQueryServer.js"

export const ROOT = fileURLToPath(new URL("../..", import.meta.url))
export const BIN = join(ROOT, "bin", "kvrelay.js")

// ---------------------------------------------------------------------------------------------
// Waiting

const pause = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms))

/** Thrown by a check to stop waiting at once (the thing waited for can no longer happen). */
export class GiveUp extends Error {}

/** Polls `check` until it returns something other than undefined/false; fails after `timeoutMs`. */
export const eventually = async <A>(
  what: string,
  check: () => A | undefined | false | Promise<A | undefined | false>,
  timeoutMs = 20_000,
  everyMs = 20
): Promise<A> => {
  const deadline = Date.now() + timeoutMs
  let lastError: unknown
  for (;;) {
    try {
      const value = await check()
      if (value !== undefined && value !== false) return value
      lastError = undefined
    } catch (error) {
      if (error instanceof GiveUp) throw error
      lastError = error
    }
    if (Date.now() > deadline) {
      const cause = lastError instanceof Error ? `: ${lastError.message}` : ""
      throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}${cause}`)
    }
    await pause(everyMs)
  }
}

// ---------------------------------------------------------------------------------------------
// Child processes

export interface ExitStatus {
  readonly code: number | null
  readonly signal: NodeJS.Signals | null
}

const children = new Set<KvrelayProcess>()

/** One `node bin/kvrelay.js …` child; stdout and stderr are collected as text. */
export class KvrelayProcess {
  stdout = ""
  stderr = ""
  exit: ExitStatus | undefined = undefined
  readonly exited: Promise<ExitStatus>

  constructor(readonly child: ChildProcess) {
    child.stdout!.setEncoding("utf8").on("data", (chunk: string) => {
      this.stdout += chunk
    })
    child.stderr!.setEncoding("utf8").on("data", (chunk: string) => {
      this.stderr += chunk
    })
    this.exited = new Promise((resolve) => {
      child.on("close", (code, signal) => {
        this.exit = { code, signal }
        children.delete(this)
        resolve(this.exit)
      })
    })
  }

  get pid(): number {
    return this.child.pid!
  }

  signal(signal: NodeJS.Signals): void {
    if (this.exit === undefined) this.child.kill(signal)
  }

  /** Waits for the exit; SIGKILLs the process (and fails) if it has not exited in time. */
  async waitExit(timeoutMs: number): Promise<ExitStatus> {
    let timer: NodeJS.Timeout | undefined
    const timeout = new Promise<"timeout">((resolve) => {
      timer = setTimeout(() => resolve("timeout"), timeoutMs)
    })
    const result = await Promise.race([this.exited, timeout])
    clearTimeout(timer)
    if (result === "timeout") {
      this.signal("SIGKILL")
      await this.exited
      throw new Error(`kvrelay (pid ${this.pid}) did not exit within ${timeoutMs} ms\n${this.stderr}`)
    }
    return result
  }

  /** Ends the process now (SIGKILL) and waits for it. */
  async kill(): Promise<void> {
    this.signal("SIGKILL")
    await this.exited
  }
}

export interface RunOptions {
  readonly env?: Readonly<Record<string, string>>
  /** Execute `bin/kvrelay.js` itself (its shebang), as npm's bin link does, instead of `node bin/…`. */
  readonly asBin?: boolean
}

/** Environment of a child: the parent's without any `KVRELAY_*` or OTEL variable, plus `env`. */
const childEnv = (env: Readonly<Record<string, string>> = {}): NodeJS.ProcessEnv => {
  const out: NodeJS.ProcessEnv = {}
  for (const [key, value] of Object.entries(process.env)) {
    if (key.startsWith("KVRELAY_") || key.startsWith("OTEL_")) continue
    out[key] = value
  }
  return { ...out, ...env }
}

export const spawnKvrelay = (args: ReadonlyArray<string>, options: RunOptions = {}): KvrelayProcess => {
  const [file, argv] = options.asBin === true ? [BIN, args] : [process.execPath, [BIN, ...args]]
  const child = spawn(file, argv, {
    cwd: ROOT,
    env: childEnv(options.env),
    stdio: ["ignore", "pipe", "pipe"]
  })
  const proc = new KvrelayProcess(child)
  children.add(proc)
  return proc
}

export interface CliResult {
  readonly code: number | null
  readonly signal: NodeJS.Signals | null
  readonly stdout: string
  readonly stderr: string
}

/**
 * How long a command that ends by itself may take. It is only a bound on waiting for the exit
 * event, never a delay: a healthy run exits in well under a second, but a relay's startup loads
 * Effect, ZeroMQ and OpenTelemetry, and several children start at once: on a machine at load
 * 7–12 that can take many seconds, so the bound is generous. Tests that use it take
 * `CLI_TEST_TIMEOUT_MS`.
 */
export const CLI_EXIT_BOUND_MS = 120_000
/** A vitest timeout for tests that wait on `runKvrelay`, above its exit bound. */
export const CLI_TEST_TIMEOUT_MS = CLI_EXIT_BOUND_MS + 30_000

/** Runs a command that is expected to end by itself (help, usage errors, startup failures). */
export const runKvrelay = async (
  args: ReadonlyArray<string>,
  options: RunOptions & { readonly timeoutMs?: number } = {}
): Promise<CliResult> => {
  const proc = spawnKvrelay(args, options)
  const exit = await proc.waitExit(options.timeoutMs ?? CLI_EXIT_BOUND_MS)
  return { ...exit, stdout: proc.stdout, stderr: proc.stderr }
}

// ---------------------------------------------------------------------------------------------
// Temporary directories and the discovery file

const directories = new Set<string>()

export const tempDir = (): string => {
  const dir = mkdtempSync(join(tmpdir(), "kvrelay-e2e-"))
  directories.add(dir)
  return dir
}

/** PROTOCOL §2 file backend document, written atomically (a rename in its directory). */
export class DiscoveryFile {
  readonly path: string
  private writes = 0

  constructor(readonly dir: string = tempDir()) {
    this.path = join(dir, "discovery.json")
  }

  get spec(): string {
    return `file:${this.path}`
  }

  write(document: unknown): void {
    const text = typeof document === "string" ? document : JSON.stringify(document, null, 2)
    const staging = join(this.dir, `.discovery.${this.writes++}.tmp`)
    writeFileSync(staging, text)
    renameSync(staging, this.path)
  }
}

export interface EndpointParts {
  readonly namespace: string
  readonly component: string
  readonly endpoint: string
}

export const endpointText = (e: EndpointParts): string => `${e.namespace}.${e.component}.${e.endpoint}`

/**
 * A model card instance record (PROTOCOL §2): model `llama` from `meta/llama`, 512-token blocks,
 * alias `chat`, an aggregated worker with one rank whose KV state is its serving endpoint.
 */
export const cardRecord = (
  serving: EndpointParts,
  instanceId: string,
  options: { readonly kvCacheBlockSize?: number; readonly dataParallelSize?: number } = {}
) => ({
  namespace: serving.namespace,
  component: serving.component,
  endpoint: serving.endpoint,
  instanceId,
  modelSuffix: null,
  card: {
    name: "llama",
    sourcePath: "meta/llama",
    kvCacheBlockSize: options.kvCacheBlockSize ?? 512,
    aliases: ["chat"],
    workerType: "aggregated",
    lora: null,
    indexerIdentity: null,
    runtimeConfig: {
      dataParallelStartRank: 0,
      dataParallelSize: options.dataParallelSize ?? 1,
      enableLocalIndexer: true,
      kvStateEndpoint: null,
      enableEagle: false,
      totalKvBlocks: "1000",
      maxNumBatchedTokens: "8192"
    }
  }
})

// ---------------------------------------------------------------------------------------------
// Simulated workers (the project's publishers speak the real wire formats)

const run = <A, E>(effect: Effect.Effect<A, E>): Promise<A> => Effect.runPromise(effect)

/**
 * External hash → canonical address (PROTOCOL §3.3) of every block a simulated worker stored,
 * as a router computes it from the worker's tokens. The simulated workers derive a block's
 * tokens from its hash, so two workers storing the same hashes under the same parents store
 * the same blocks, as two real engines storing one prompt do.
 */
const storedAddresses = new Map<bigint, bigint>()

const remember = (
  publisher: { readonly addressOf: (hash: bigint) => bigint },
  hashes: ReadonlyArray<bigint>
) => {
  for (const hash of hashes) storedAddresses.set(hash, publisher.addressOf(hash))
}

/** Where the block a worker stored as `hash` sits in a filter (a never-stored hash: itself). */
export const addressOf = (hash: bigint): bigint => storedAddresses.get(hash) ?? hash

export class DynamoWorker {
  constructor(
    readonly publisher: DynamoZmqPublisher,
    readonly queryServer: WorkerQueryServer
  ) {}

  get workerId(): string {
    return this.publisher.workerId
  }

  async store(hashes: ReadonlyArray<bigint>): Promise<unknown> {
    const event = await run(this.publisher.store(hashes))
    remember(this.publisher, hashes)
    return event
  }

  remove(hashes: ReadonlyArray<bigint>): Promise<unknown> {
    return run(this.publisher.remove(hashes))
  }

  dropNext(count = 1): Promise<void> {
    return run(this.publisher.dropNext(count))
  }

  sendRaw(frames: ReadonlyArray<Uint8Array | string>): Promise<void> {
    return run(this.publisher.sendRaw(frames))
  }

  publisherId(): Promise<bigint> {
    return run(this.publisher.publisherId)
  }

  /** Worker-query requests the query server received. */
  queryRequests(): Promise<number> {
    return run(Effect.map(this.queryServer.stats, (s) => s.requests))
  }

  /** PROTOCOL §2 source advertisement of the current incarnation. */
  async sourceRecord(kvStateEndpoint: string) {
    const publisherId = await run(this.publisher.publisherId)
    return {
      kvStateEndpoint,
      workerId: this.publisher.workerId,
      dpRank: this.publisher.dpRank,
      publisherId: publisherId.toString(),
      transport: { kind: "dynamo-zmq", endpoint: this.publisher.endpoint, topic: this.publisher.topic },
      recoveryTarget: { endpoint: this.queryServer.endpoint }
    }
  }
}

export class EngineWorker {
  constructor(readonly publisher: EngineZmqPublisher) {}

  get workerId(): string {
    return this.publisher.workerId
  }

  async store(hashes: ReadonlyArray<bigint>): Promise<number> {
    const seq = await run(this.publisher.store(hashes))
    remember(this.publisher, hashes)
    return seq
  }

  remove(hashes: ReadonlyArray<bigint>): Promise<number> {
    return run(this.publisher.remove(hashes))
  }

  clear(): Promise<number> {
    return run(this.publisher.clear)
  }

  dropNext(count = 1): Promise<void> {
    return run(this.publisher.dropNext(count))
  }

  sendRaw(frames: ReadonlyArray<Uint8Array | string>): Promise<void> {
    return run(this.publisher.sendRaw(frames))
  }

  replays(): Promise<number> {
    return run(Effect.map(this.publisher.stats, (s) => s.replays))
  }

  async sourceRecord(kvStateEndpoint: string) {
    const publisherId = await run(this.publisher.publisherId)
    return {
      kvStateEndpoint,
      workerId: this.publisher.workerId,
      dpRank: this.publisher.dpRank,
      publisherId: publisherId.toString(),
      transport: {
        kind: "engine-zmq",
        endpoint: this.publisher.endpoint,
        topic: this.publisher.topic,
        replayEndpoint: this.publisher.replayEndpoint
      },
      recoveryTarget: null
    }
  }
}

/** Worker sockets live in one scope, closed by `close()`. */
export class Workers {
  private scope = Effect.runSync(Scope.make())

  /** A Dynamo worker rank 0 with its worker query server. */
  dynamo(workerId: string): Promise<DynamoWorker> {
    return run(
      Effect.gen(function* () {
        const queryServer = yield* makeWorkerQueryServer({ workerId, dpRanks: [0] })
        const publisher = yield* makeDynamoZmqPublisher({ workerId, dpRank: 0, queryServer, blockSize: 512 })
        return new DynamoWorker(publisher, queryServer)
      }).pipe(Scope.extend(this.scope))
    )
  }

  /** A vLLM engine rank 0 (512-token blocks) with its replay endpoint (which may never answer). */
  engine(workerId: string, options: { readonly silentReplay?: boolean } = {}): Promise<EngineWorker> {
    return run(
      Effect.map(
        makeEngineZmqPublisher({ workerId, dpRank: 0, format: "vllm", blockSize: 512, ...options }),
        (publisher) => new EngineWorker(publisher)
      ).pipe(Scope.extend(this.scope))
    )
  }

  async close(): Promise<void> {
    const scope = this.scope
    this.scope = Effect.runSync(Scope.make())
    await run(Scope.close(scope, Exit.void))
  }
}

// ---------------------------------------------------------------------------------------------
// A relay process

export interface RelayOptions {
  readonly dcId?: string
  /** A discovery file, or any other `--discovery` value (`etcd:URL`). */
  readonly discovery: Pick<DiscoveryFile, "spec">
  /** Default 4096 (a 2048-bucket filter: one small snapshot chunk). */
  readonly expectedUniqueBlocks?: number
}

/** A `kvrelay relay` child that printed its readiness line. */
export class Relay {
  constructor(
    readonly proc: KvrelayProcess,
    readonly url: string
  ) {}

  static async start(options: RelayOptions): Promise<Relay> {
    const proc = spawnKvrelay([
      "relay",
      "--dc-id",
      options.dcId ?? "test-dc",
      "--discovery",
      options.discovery.spec,
      "--http",
      "127.0.0.1:0",
      "--expected-unique-blocks",
      String(options.expectedUniqueBlocks ?? 4096)
    ])
    const line = await eventually(
      "the relay's listening line",
      () => {
        if (proc.exit !== undefined) {
          throw new GiveUp(`kvrelay relay exited early (${JSON.stringify(proc.exit)}):\n${proc.stderr}`)
        }
        // Complete lines only: the last element is whatever follows the last newline.
        return proc.stdout
          .split("\n")
          .slice(0, -1)
          .find((l) => l.includes('"listening"'))
      },
      20_000
    ).catch(async (error: unknown) => {
      await proc.kill()
      throw error
    })
    const ready = JSON.parse(line) as { event: string; url: string }
    return new Relay(proc, ready.url)
  }

  fetch(path: string, init?: RequestInit): Promise<Response> {
    return fetch(`${this.url}${path}`, init)
  }

  async json<A>(path: string): Promise<A> {
    const response = await this.fetch(path)
    if (response.status !== 200) throw new Error(`GET ${path}: ${response.status} ${await response.text()}`)
    return (await response.json()) as A
  }

  async post(path: string, body: string): Promise<{ status: number; text: string; json: unknown }> {
    const response = await this.fetch(path, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body
    })
    const text = await response.text()
    let json: unknown
    try {
      json = JSON.parse(text)
    } catch {
      json = undefined
    }
    return { status: response.status, text, json }
  }

  /** The one pool of the catalog (waits for it). */
  onlyPool(timeoutMs = 15_000): Promise<PoolDescriptorJson> {
    return eventually(
      "one pool in the catalog",
      async () => {
        const catalog = await this.json<CatalogJson>("/v1/catalog")
        return catalog.pools.length === 1 ? catalog.pools[0] : undefined
      },
      timeoutMs
    )
  }

  /** The `/v1/stats` entry of a serving endpoint. */
  async endpointStats(endpoint: string): Promise<EndpointStatsJson> {
    const stats = await this.json<{ endpoints: Array<EndpointStatsJson> }>("/v1/stats")
    const found = stats.endpoints.find((e) => e.servingEndpoint === endpoint)
    if (found === undefined) throw new Error(`no stats for ${endpoint}`)
    return found
  }

  /** Prometheus text of `/metrics`. */
  async metrics(): Promise<string> {
    const response = await this.fetch("/metrics")
    return response.text()
  }

  /** Opens `GET /v1/catalog/watch`. */
  watchCatalog(subscriber: string): Promise<SseReader> {
    return SseReader.open(`${this.url}/v1/catalog/watch?subscriber=${encodeURIComponent(subscriber)}`)
  }
}

// ---------------------------------------------------------------------------------------------
// JSON shapes read by the tests (PROTOCOL §5)

export interface FormatJson {
  formatVersion: number
  seed: string
  bucketCount: number
  fingerprintBits: number
  slotsPerBucket: number
}

export interface ProducerJson {
  poolId: {
    identityVersion: number
    cacheSemantics: { digest: string; source: string }
    routingScope: { digest: string; source: string }
    dcId: string
  }
  producerIncarnation: string
  layoutGeneration: string
  format: FormatJson
}

export interface PoolDescriptorJson {
  producer: ProducerJson
  servingEndpoint: EndpointParts
  registrations: Array<unknown>
  querySemantics: { kvBlockSize: number; hashFormat: string }
  poolRoles: Array<string>
}

export interface EndpointStatsJson {
  servingEndpoint: string
  lifecycle: string
  layoutGeneration: string
  aggregation: {
    members: Array<{ workerId: string; dpRank: number; blocks: number }>
    uniqueBlockCount: number
  } | null
  publication: { sequence: string; pendingEvents: number } | null
  recovery: { workerCount: number; rankCount: number }
  ingest: { events: number; blocks: number; malformed: number; gaps: number; recoveries: number }
}

export interface CatalogJson {
  protocolVersion: number
  relay: { drtInstanceId: string; relayIncarnation: string }
  revision: string
  pools: Array<PoolDescriptorJson>
}

// ---------------------------------------------------------------------------------------------
// The pool stream (PROTOCOL §5), decoded by hand

export const FRAME_SNAPSHOT = 1
export const FRAME_DELTA = 2
export const FRAME_HEARTBEAT = 3
export const FRAME_TERMINAL = 4

export interface StreamFrame {
  readonly kind: number
  readonly base: bigint
  readonly sequence: bigint
  readonly sendTsUs: bigint
  readonly payload: Uint8Array
}

const FIXED = 1 + 8 + 8 + 8

/**
 * One `POST /v1/pools/subscribe` response read with `node:http` (so that a paused reader exerts
 * real TCP back-pressure). The frames are checked against the contract as they arrive: every
 * violation is recorded in `violations`. The filter is rebuilt from the snapshot and the deltas.
 */
export class PoolStream {
  readonly frames: Array<StreamFrame> = []
  readonly violations: Array<string> = []
  /** Words `[lo, hi]` per bucket once the snapshot is complete. */
  words: Uint32Array | undefined = undefined
  /** The sequence the rebuilt filter is at. */
  sequence: bigint | undefined = undefined
  snapshotChunks = 0
  deltas = 0
  terminal: { reason: string; message: string } | undefined = undefined
  ended = false
  error: Error | undefined = undefined
  bytes = 0
  private buffer: Buffer = Buffer.alloc(0)
  private readonly assembler: Cbi1SnapshotAssembler
  private readonly format: DcCkfFormatIdentity
  private readonly dcId: bigint

  private constructor(
    readonly producer: ProducerJson,
    readonly request: http.ClientRequest,
    readonly response: http.IncomingMessage
  ) {
    this.format = new DcCkfFormatIdentity(
      BigInt(producer.format.seed),
      producer.format.bucketCount,
      producer.format.formatVersion,
      producer.format.fingerprintBits,
      producer.format.slotsPerBucket
    )
    this.dcId = BigInt(`0x${producer.poolId.dcId}`)
    this.assembler = new Cbi1SnapshotAssembler({ format: this.format, dcId: this.dcId })
    response.on("data", (chunk: Buffer) => this.onData(chunk))
    response.on("end", () => {
      if (this.buffer.length > 0) this.violations.push(`${this.buffer.length} trailing bytes at the end`)
      this.ended = true
    })
    response.on("error", (error) => {
      this.error = error
      this.ended = true
    })
    response.on("close", () => {
      this.ended = true
    })
  }

  /** Opens a stream; a non-200 answer is returned as `{status, json}`. */
  static open(
    url: string,
    subscriberId: string,
    producer: ProducerJson
  ): Promise<PoolStream | { status: number; json: unknown }> {
    const body = JSON.stringify({ subscriberId, expectedProducer: producer })
    return new Promise((resolve, reject) => {
      const request = http.request(`${url}/v1/pools/subscribe`, {
        method: "POST",
        headers: { "content-type": "application/json", "content-length": Buffer.byteLength(body) },
        agent: false
      })
      request.on("error", reject)
      request.on("response", (response) => {
        if (response.statusCode !== 200) {
          let text = ""
          response.setEncoding("utf8")
          response.on("data", (chunk: string) => {
            text += chunk
          })
          response.on("end", () => resolve({ status: response.statusCode ?? 0, json: JSON.parse(text) }))
          return
        }
        const stream = new PoolStream(producer, request, response)
        const type = response.headers["content-type"]
        if (type !== "application/vnd.kvrelay.pool-stream.v1") stream.violations.push(`content-type ${type}`)
        streams.add(stream)
        resolve(stream)
      })
      request.end(body)
    })
  }

  /** Opens a stream that must succeed. */
  static async subscribe(url: string, subscriberId: string, producer: ProducerJson): Promise<PoolStream> {
    const stream = await PoolStream.open(url, subscriberId, producer)
    if (!(stream instanceof PoolStream)) {
      throw new Error(`subscribe failed: ${stream.status} ${JSON.stringify(stream.json)}`)
    }
    return stream
  }

  pause(): void {
    this.response.pause()
  }

  resume(): void {
    this.response.resume()
  }

  close(): void {
    this.request.destroy()
    this.response.destroy()
    streams.delete(this)
  }

  private onData(chunk: Buffer): void {
    this.bytes += chunk.length
    this.buffer = this.buffer.length === 0 ? chunk : Buffer.concat([this.buffer, chunk])
    while (this.buffer.length >= 4) {
      const length = this.buffer.readUInt32LE(0)
      if (length < FIXED) {
        this.violations.push(`frame length ${length} is shorter than its fixed fields`)
        this.buffer = Buffer.alloc(0)
        this.close()
        return
      }
      if (this.buffer.length < 4 + length) break
      const frame: StreamFrame = {
        kind: this.buffer.readUInt8(4),
        base: this.buffer.readBigUInt64LE(5),
        sequence: this.buffer.readBigUInt64LE(13),
        sendTsUs: this.buffer.readBigUInt64LE(21),
        payload: new Uint8Array(this.buffer.subarray(4 + FIXED, 4 + length))
      }
      this.buffer = this.buffer.subarray(4 + length)
      this.frames.push(frame)
      this.apply(frame)
    }
  }

  private apply(frame: StreamFrame): void {
    const at = `frame ${this.frames.length - 1} (kind ${frame.kind}, ${frame.base}→${frame.sequence})`
    if (this.terminal !== undefined) this.violations.push(`${at} after the terminal frame`)
    const nowUs = BigInt(Date.now()) * 1000n
    if (frame.sendTsUs > nowUs + 5_000_000n || frame.sendTsUs < nowUs - 600_000_000n) {
      this.violations.push(`${at}: send_ts_us ${frame.sendTsUs} is not the wall clock`)
    }
    switch (frame.kind) {
      case FRAME_SNAPSHOT: {
        if (this.words !== undefined) this.violations.push(`${at}: a snapshot chunk after the snapshot`)
        if (frame.base !== frame.sequence) this.violations.push(`${at}: snapshot base ≠ sequence`)
        const decoded = decodeCbi1(frame.payload, { format: this.format, dcId: this.dcId })
        if (decoded instanceof Error || decoded._tag !== "SnapshotChunk") {
          this.violations.push(`${at}: not a CBI1 snapshot chunk: ${String(decoded)}`)
          return
        }
        if (decoded.epoch !== frame.sequence) this.violations.push(`${at}: CBI1 epoch ${decoded.epoch}`)
        this.snapshotChunks++
        const done = this.assembler.push(decoded)
        if (done instanceof Error) this.violations.push(`${at}: ${done.message}`)
        else if (done !== undefined) {
          this.words = done.words
          this.sequence = done.epoch
        }
        return
      }
      case FRAME_DELTA: {
        if (this.words === undefined || this.sequence === undefined) {
          this.violations.push(`${at}: a delta before the snapshot completed`)
          return
        }
        if (frame.base !== this.sequence)
          this.violations.push(`${at}: base is not the last sequence ${this.sequence}`)
        if (frame.sequence !== frame.base + 1n) this.violations.push(`${at}: sequence ≠ base + 1`)
        const decoded = decodeCbi1(frame.payload, { format: this.format, dcId: this.dcId })
        if (decoded instanceof Error || decoded._tag !== "Delta") {
          this.violations.push(`${at}: not a CBI1 delta: ${String(decoded)}`)
          return
        }
        if (decoded.baseEpoch !== frame.base || decoded.epoch !== frame.sequence) {
          this.violations.push(`${at}: CBI1 epochs ${decoded.baseEpoch}→${decoded.epoch}`)
        }
        const images = decoded.images
        for (let i = 0; i + 2 < images.length; i += 3) {
          const bucket = images[i]!
          this.words[2 * bucket] = images[i + 1]!
          this.words[2 * bucket + 1] = images[i + 2]!
        }
        this.sequence = frame.sequence
        this.deltas++
        return
      }
      case FRAME_HEARTBEAT: {
        if (frame.base !== frame.sequence || frame.sequence !== this.sequence) {
          this.violations.push(`${at}: heartbeat not at the last sequence ${this.sequence}`)
        }
        if (frame.payload.length !== 0) this.violations.push(`${at}: heartbeat with a payload`)
        return
      }
      case FRAME_TERMINAL: {
        try {
          this.terminal = JSON.parse(Buffer.from(frame.payload).toString("utf8"))
        } catch {
          this.violations.push(`${at}: terminal payload is not JSON`)
          this.terminal = { reason: "?", message: "?" }
        }
        return
      }
      default:
        this.violations.push(`${at}: unknown kind`)
    }
  }

  /** Whether the rebuilt filter holds `hash`'s fingerprint in bucket a or b. */
  holds(hash: bigint): boolean {
    if (this.words === undefined) return false
    return wordsHold(this.words, this.producer.format, addressOf(hash))
  }

  /** Waits until `check` holds on this stream. */
  until(what: string, check: (stream: this) => boolean, timeoutMs = 20_000): Promise<true> {
    return eventually(
      what,
      () => {
        if (check(this)) return true
        if (this.ended) throw new GiveUp(`the stream ended (${JSON.stringify(this.terminal)})`)
        return undefined
      },
      timeoutMs,
      10
    ).catch((error: Error) => {
      const detail = `sequence ${this.sequence}, ${this.frames.length} frames, terminal ${JSON.stringify(this.terminal)}`
      throw new Error(`${error.message} [${detail}]`)
    })
  }

  /** Waits until the filter holds all of `present` and none of `absent`. */
  async contains(present: ReadonlyArray<bigint>, absent: ReadonlyArray<bigint> = [], timeoutMs = 20_000) {
    await this.until(
      `${present.length} hashes present, ${absent.length} absent`,
      (s) => present.every((h) => s.holds(h)) && absent.every((h) => !s.holds(h)),
      timeoutMs
    )
  }

  /** Waits for the end of the stream (with or without a terminal frame). */
  ends(timeoutMs = 20_000): Promise<true> {
    return eventually("the end of the pool stream", () => this.ended, timeoutMs, 10)
  }
}

const streams = new Set<PoolStream>()

/** Slots `[lo & 0xffff, lo >>> 16, hi & 0xffff, hi >>> 16]` of a bucket. */
const bucketHolds = (words: Uint32Array, bucket: number, fp: number): boolean => {
  const lo = words[2 * bucket]!
  const hi = words[2 * bucket + 1]!
  return (lo & 0xffff) === fp || lo >>> 16 === fp || (hi & 0xffff) === fp || hi >>> 16 === fp
}

export const wordsHold = (words: Uint32Array, format: FormatJson, hash: bigint): boolean => {
  const { fingerprint, bucketA, bucketB } = prepare(hash, format.bucketCount, BigInt(format.seed))
  return bucketHolds(words, bucketA, fingerprint) || bucketHolds(words, bucketB, fingerprint)
}

/**
 * Whether `hash` can be told absent from the filter while `others` are present: no other hash
 * shares its fingerprint and one of its buckets (a false positive by construction).
 */
export const distinguishable = (format: FormatJson, hash: bigint, others: ReadonlyArray<bigint>): boolean => {
  const p = prepare(hash, format.bucketCount, BigInt(format.seed))
  return others.every((other) => {
    if (other === hash) return false
    const q = prepare(other, format.bucketCount, BigInt(format.seed))
    if (q.fingerprint !== p.fingerprint) return true
    return ![q.bucketA, q.bucketB].some((b) => b === p.bucketA || b === p.bucketB)
  })
}

/** Decodes the base64 little-endian u64 words of the diagnostic snapshot into `[lo, hi]` pairs. */
export const diagnosticWords = (base64: string): Uint32Array => {
  const bytes = Buffer.from(base64, "base64")
  const out = new Uint32Array(bytes.length / 4)
  for (let i = 0; i < out.length; i++) out[i] = bytes.readUInt32LE(4 * i)
  return out
}

// ---------------------------------------------------------------------------------------------
// Server-Sent Events (catalog watch)

export interface SseEvent {
  readonly event: string
  readonly data: string
}

const sseReaders = new Set<SseReader>()

/** Reads an SSE response into `events` until it ends or `close()` is called. */
export class SseReader {
  readonly events: Array<SseEvent> = []
  ended = false
  private text = ""

  private constructor(
    readonly status: number,
    private readonly controller: AbortController,
    body: ReadableStream<Uint8Array>
  ) {
    const reader = body.getReader()
    const decoder = new TextDecoder()
    const pump = async () => {
      try {
        for (;;) {
          const next = await reader.read()
          if (next.done) break
          this.text += decoder.decode(next.value, { stream: true })
          this.parse()
        }
      } catch {
        // aborted or reset: the end of the stream either way
      }
      this.ended = true
    }
    void pump()
  }

  static async open(url: string): Promise<SseReader> {
    const controller = new AbortController()
    const response = await fetch(url, { signal: controller.signal })
    const reader = new SseReader(response.status, controller, response.body!)
    sseReaders.add(reader)
    return reader
  }

  private parse(): void {
    for (;;) {
      const end = this.text.indexOf("\n\n")
      if (end < 0) return
      const block = this.text.slice(0, end)
      this.text = this.text.slice(end + 2)
      let event = "message"
      const data: Array<string> = []
      for (const line of block.split("\n")) {
        if (line.startsWith("event:")) event = line.slice(6).trim()
        else if (line.startsWith("data:")) data.push(line.slice(5).trimStart())
      }
      if (data.length > 0) this.events.push({ event, data: data.join("\n") })
    }
  }

  /** Parsed `data` of every event named `name`. */
  documents<A>(name: string): Array<A> {
    return this.events.filter((e) => e.event === name).map((e) => JSON.parse(e.data) as A)
  }

  close(): void {
    this.controller.abort()
    sseReaders.delete(this)
  }
}

// ---------------------------------------------------------------------------------------------
// Hashes

let hashCounter = 0

/** `n` distinct u64 block hashes spread over the full range (some above 2^63). */
export const freshHashes = (n: number): Array<bigint> => {
  const out: Array<bigint> = []
  for (let i = 0; i < n; i++) {
    hashCounter++
    out.push(BigInt.asUintN(64, BigInt(hashCounter) * 0x9e37_79b9_7f4a_7c15n + 0x1234_5678n))
  }
  return out
}

// ---------------------------------------------------------------------------------------------
// Cleanup

/** Closes every stream, kills every child, closes worker sockets and removes temp directories. */
export const cleanup = async (workers?: Workers): Promise<void> => {
  for (const stream of streams) stream.close()
  for (const reader of sseReaders) reader.close()
  await Promise.all([...children].map((child) => child.kill()))
  if (workers !== undefined) await workers.close()
  for (const dir of directories) rmSync(dir, { recursive: true, force: true })
  directories.clear()
}

/** Lets the event loop run I/O: a publishing loop of resolved promises would starve the readers. */
export const yieldToIo = (): Promise<void> => new Promise((resolve) => setImmediate(resolve))

/**
 * Stores single probe blocks until one shows up in `stream`: from then on the relay's
 * subscription to that worker is live (a ZeroMQ SUB misses what was sent before it connected; a
 * later probe makes that a gap the relay recovers). Returns every probe stored.
 */
export const warmUp = async (
  stream: PoolStream,
  store: (hashes: ReadonlyArray<bigint>) => Promise<unknown>
): Promise<Array<bigint>> => {
  const probes: Array<bigint> = []
  for (let attempt = 1; ; attempt++) {
    const probe = freshHashes(1)
    probes.push(...probe)
    await store(probe)
    try {
      await stream.contains(probe, [], 4_000)
      return probes
    } catch (error) {
      if (attempt === 8) throw error
    }
  }
}
