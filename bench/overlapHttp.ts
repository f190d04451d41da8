/**
 * `overlap_http`: `POST /v1/overlap` of 64-block token prompts (1024 tokens) against the real
 * global consumer over 16 ready lanes, with autocannon as the load generator in a child process
 * of its own, measured against a bare `node:http` server in this same process that reads and
 * JSON-parses the same bodies and answers a fixed JSON body as long as a real answer.
 *
 * Phases, each as rounds that alternate the two servers (median of each):
 * - peak: 16 connections, one request in flight on each, as fast as the servers answer;
 * - latency at half of the real server's peak: the child sends at evenly spaced times over up to
 *   16 keep-alive connections (`node:http` agent; autocannon's rate limit sends in bursts once a
 *   second), both servers at the same rate, after half a second at that rate that is not timed;
 * - peak while all 16 relays publish deltas to the consumer (the writers of `bench/global.ts`,
 *   paced at 250 events of 8 blocks a second each), against the idle peak of the same rounds.
 *
 * The relays and their writers run in a worker thread (see `startRelaysWorker`); the consumer,
 * its HTTP server and the bare server share this one. The server thread's own CPU time per
 * answered query is reported too, which the machine's other load disturbs less than the rates.
 */

import { spawn } from "node:child_process"
import { createServer, type Server } from "node:http"
import { createRequire } from "node:module"
import type { AddressInfo } from "node:net"
import { monitorEventLoopDelay, PerformanceObserver, performance } from "node:perf_hooks"
import { getHeapStatistics } from "node:v8"
import { isMainThread, parentPort, Worker, workerData } from "node:worker_threads"
import * as NodeHttpClient from "@effect/platform-node/NodeHttpClient"
import { Effect, Fiber, Layer, Logger, LogLevel, Queue } from "effect"
import { GlobalConsumer, RelayConnector } from "../src/consumer/GlobalConsumer.js"
import { make as makeConsumer } from "../src/consumer/GlobalConsumerLive.js"
import { GlobalView, make as makeView } from "../src/consumer/GlobalView.js"
import * as GlobalHttpServer from "../src/consumer/http/GlobalHttpServer.js"
import {
  type BenchRelay,
  INGEST_BLOCKS_PER_EVENT,
  LANES,
  makePrompts,
  readyLanes,
  sequencesOf,
  startRelay,
  stored,
  storePrefixes
} from "./global.js"
import { type BenchContext, gc, HashStream, record, threadCpuSeconds } from "./harness.js"

const CONNECTIONS = 16

/** Seconds a paced run sends before it starts timing (see the child's `paced`). */
const PACED_WARMUP_SECONDS = 0.5

/** What the autocannon child reports of one run. */
interface LoadResult {
  /** 2xx answers per second over the run. */
  readonly qps: number
  readonly ok: number
  readonly non2xx: number
  readonly errors: number
  readonly timeouts: number
  /** Latency of 2xx answers (ms, from autocannon's per-response hrtime, not its 1 ms histogram). */
  readonly p50: number
  readonly p99: number
  readonly elapsedMs: number
}

/**
 * The child: reads `{url, path, bodies, seconds, rate?}` as JSON on stdin, runs autocannon, and
 * prints one JSON `LoadResult` line. Given as source so that it runs the same from `bench/`,
 * `dist/bench/` or a bundle: only autocannon's resolved path is passed in.
 */
const CHILD = `
const autocannon = require(process.argv[1])
let input = ""
process.stdin.setEncoding("utf8")
process.stdin.on("data", (chunk) => { input += chunk })
process.stdin.on("end", () => {
  const cfg = JSON.parse(input)
  const latencies = []
  const options = {
    url: cfg.url,
    connections: cfg.connections,
    pipelining: 1,
    duration: cfg.seconds,
    requests: cfg.bodies.map((body) => ({
      method: "POST",
      path: cfg.path,
      headers: { "content-type": "application/json" },
      body
    }))
  }
  if (cfg.rate !== undefined) return paced(cfg)
  const started = performance.now()
  const instance = autocannon(options, (error, result) => {
    if (error) { process.stderr.write(String(error) + "\\n"); process.exit(1) }
    const elapsedMs = performance.now() - started
    latencies.sort((a, b) => a - b)
    const at = (p) => latencies.length === 0 ? 0 : latencies[Math.min(latencies.length - 1, Math.floor(p / 100 * latencies.length))]
    process.stdout.write(JSON.stringify({
      qps: latencies.length * 1000 / elapsedMs,
      ok: latencies.length,
      non2xx: result.non2xx,
      errors: result.errors,
      timeouts: result.timeouts,
      p50: at(50),
      p99: at(99),
      elapsedMs
    }) + "\\n")
  })
  instance.on("response", (_client, status, _bytes, ms) => { if (status >= 200 && status < 300) latencies.push(ms) })
})
// autocannon's rate limit lets each connection send its quota at the start of every second, so
// its latencies at a rate are those of bursts; this sends at evenly spaced times instead. The
// first warmupSeconds are sent at the same rate but not timed: a fresh child opens its sockets
// and compiles its HTTP path then, and those first ~20 ms were most of a 2 s run's slowest 1%,
// against a bare server as much as against the real one.
function paced(cfg) {
  const http = require("node:http")
  const agent = new http.Agent({ keepAlive: true, maxSockets: cfg.connections })
  const url = new URL(cfg.url)
  const latencies = []
  let non2xx = 0, errors = 0, inFlight = 0, sent = 0
  const interval = 1000 / cfg.rate
  const started = performance.now()
  const timedFrom = started + cfg.warmupSeconds * 1000
  const end = timedFrom + cfg.seconds * 1000
  let next = started
  let finished = false
  const send = () => {
    const body = cfg.bodies[sent++ % cfg.bodies.length]
    const t = performance.now()
    inFlight++
    const request = http.request({ host: url.hostname, port: url.port, path: cfg.path, method: "POST", agent,
      headers: { "content-type": "application/json", "content-length": Buffer.byteLength(body) } }, (response) => {
      response.on("data", () => {})
      response.on("end", () => {
        inFlight--
        if (response.statusCode < 200 || response.statusCode >= 300) non2xx++
        else if (t >= timedFrom) latencies.push(performance.now() - t)
        done()
      })
    })
    request.on("error", () => { inFlight--; errors++; done() })
    request.end(body)
  }
  const done = () => {
    if (finished || inFlight > 0 || next < end) return
    finished = true
    const elapsedMs = performance.now() - timedFrom
    latencies.sort((a, b) => a - b)
    const at = (p) => latencies.length === 0 ? 0 : latencies[Math.min(latencies.length - 1, Math.floor(p / 100 * latencies.length))]
    process.stdout.write(JSON.stringify({ qps: latencies.length * 1000 / elapsedMs, ok: latencies.length, non2xx, errors,
      timeouts: 0, p50: at(50), p99: at(99), elapsedMs }) + "\\n")
    agent.destroy()
  }
  const tick = () => {
    const now = performance.now()
    while (next <= now && next < end) { send(); next += interval }
    if (next < end) setTimeout(tick, Math.max(0, next - performance.now()))
    else done()
  }
  tick()
}
`

const autocannonPath = (): string => createRequire(import.meta.url).resolve("autocannon")

/** One autocannon run in a child process (POSTs to `path`, default `/v1/overlap`). */
const load = (options: {
  readonly url: string
  readonly bodies: ReadonlyArray<string>
  readonly seconds: number
  readonly rate?: number | undefined
  /** Default `/v1/overlap`. */
  readonly path?: string | undefined
}): Promise<LoadResult> =>
  new Promise((resolve, reject) => {
    const child = spawn(process.execPath, ["-e", CHILD, autocannonPath()], {
      stdio: ["pipe", "pipe", "inherit"]
    })
    let out = ""
    child.stdout.setEncoding("utf8")
    child.stdout.on("data", (chunk: string) => {
      out += chunk
    })
    child.on("error", reject)
    // A child that dies at once closes its stdin; its exit status says why.
    child.stdin.on("error", () => {})
    child.on("exit", (code) => {
      if (code !== 0) return reject(new Error(`autocannon child exited with ${code}`))
      try {
        resolve(JSON.parse(out) as LoadResult)
      } catch (cause) {
        reject(new Error(`autocannon child printed no result: ${out.slice(0, 200)} (${String(cause)})`))
      }
    })
    const { url, bodies, seconds, rate } = options
    child.stdin.end(
      JSON.stringify({
        url,
        path: options.path ?? "/v1/overlap",
        bodies,
        seconds,
        rate,
        warmupSeconds: PACED_WARMUP_SECONDS,
        connections: CONNECTIONS
      })
    )
  })

/** A load run and the CPU time this process spent meanwhile, per answered query (µs). */
export const measured = async (
  options: Parameters<typeof load>[0]
): Promise<LoadResult & { readonly cpuPerQueryUs: number }> => {
  // This thread's CPU only: the servers', without the relays' worker (NaN off Linux).
  const before = threadCpuSeconds()
  const result = await load(options)
  const cpuUs = (threadCpuSeconds() - before) * 1e6
  return { ...result, cpuPerQueryUs: result.ok === 0 ? 0 : cpuUs / result.ok }
}

/** What held this process's thread during a run: its event-loop delay and its GC pauses (ms). */
interface Stalls {
  readonly loopP99: number
  readonly loopMax: number
  readonly gcMax: number
  readonly gcMs: number
}

const watchStalls = (): (() => Stalls) => {
  const loop = monitorEventLoopDelay({ resolution: 1 })
  let gcMax = 0
  let gcMs = 0
  const gcs = new PerformanceObserver((list) => {
    for (const entry of list.getEntries()) {
      gcMax = Math.max(gcMax, entry.duration)
      gcMs += entry.duration
    }
  })
  gcs.observe({ entryTypes: ["gc"] })
  loop.enable()
  return () => {
    loop.disable()
    gcs.disconnect()
    return { loopP99: loop.percentile(99) / 1e6, loopMax: loop.max / 1e6, gcMax, gcMs }
  }
}

const stallsText = (s: Stalls): string =>
  `loop delay p99 ${s.loopP99.toFixed(1)} max ${s.loopMax.toFixed(1)} ms, GC ${s.gcMs.toFixed(0)} ms (max ${s.gcMax.toFixed(1)})`

/** The baseline: reads the body, JSON-parses it, answers `answer`. */
export const bareServer = (answer: string): Promise<Server> =>
  new Promise((resolve) => {
    const body = Buffer.from(answer)
    const server = createServer((request, response) => {
      const chunks: Array<Buffer> = []
      request.on("data", (chunk: Buffer) => chunks.push(chunk))
      request.on("end", () => {
        const parsed = JSON.parse(Buffer.concat(chunks).toString("utf8")) as { tokens?: unknown }
        if (!Array.isArray(parsed.tokens)) {
          response.writeHead(400).end()
          return
        }
        response.writeHead(200, { "content-type": "application/json", "content-length": body.length })
        response.end(body)
      })
    })
    server.listen(0, "127.0.0.1", () => resolve(server))
  })

export const median = (values: ReadonlyArray<number>): number => {
  const sorted = [...values].sort((a, b) => a - b)
  const mid = sorted.length >> 1
  return sorted.length % 2 === 1 ? sorted[mid]! : (sorted[mid - 1]! + sorted[mid]!) / 2
}

export const checked = (what: string, result: LoadResult): LoadResult => {
  if (result.non2xx > 0 || result.errors > 0 || result.timeouts > 0 || result.ok === 0)
    throw new Error(
      `${what}: ${result.ok} ok, ${result.non2xx} non-2xx, ${result.errors} errors, ${result.timeouts} timeouts`
    )
  return result
}

/** Events each relay's writer admits per second while ingesting (8 blocks each). */
const INGEST_EVENTS_PER_LANE = 250

/**
 * Relays' writers as in `bench/global.ts`, but paced: each admits up to `INGEST_EVENTS_PER_LANE`
 * 8-block events a second (at most 8 per 5 ms wake) until `stop` is called. Unpaced, the writers
 * would take the relays' whole thread (Effect's scheduler runs runnable fibers on microtasks, so
 * the relays' sockets would wait) and publish at whatever rate that left.
 */
const startIngest = (relays: ReadonlyArray<BenchRelay>) =>
  Effect.gen(function* () {
    let ingesting = true
    const writers = yield* Effect.forEach(relays, (relay, dc) =>
      Effect.fork(
        Effect.gen(function* () {
          const stream = new HashStream(0x1_5eed + dc)
          const started = performance.now()
          let eventId = 0
          while (ingesting) {
            const due = Math.floor(((performance.now() - started) * INGEST_EVENTS_PER_LANE) / 1000)
            // A writer that fell behind does not catch up in one go: a fiber that never sleeps
            // would keep the sockets (and this bench's own child processes) waiting.
            const until = Math.min(due, eventId + 8)
            while (eventId < until && ingesting) {
              const pairs = new Uint32Array(INGEST_BLOCKS_PER_EVENT * 2)
              for (let i = 0; i < INGEST_BLOCKS_PER_EVENT; i++) stream.next(pairs, 2 * i)
              yield* relay.attachment.actor.admitEvent(0, stored(`ingest-${dc}`, ++eventId, pairs))
            }
            yield* Effect.sleep("5 millis")
          }
          return eventId
        })
      )
    )
    return Effect.gen(function* () {
      ingesting = false
      const events = yield* Effect.forEach(writers, Fiber.join)
      for (const relay of relays) yield* Effect.orDie(relay.attachment.actor.flush)
      return events.reduce((a, b) => a + b, 0)
    })
  })

/**
 * The 16 relays, in a worker thread of their own: a deployed global consumer runs in its own
 * process, and its relays elsewhere. In this thread their heaps (16 pools' CKF state and actors)
 * were the server's to collect, and their writers took its event loop while it was measured
 * under ingest. The worker is another V8 isolate, with its own heap and collector, on another
 * thread; the consumer follows its relays over HTTP as before.
 */
const RELAYS_ROLE = "overlap-http-relays"

interface RelaysInit {
  readonly role: typeof RELAYS_ROLE
  readonly promptCount: number
  readonly expected: number
}

type ToRelays = { readonly _tag: "ingest" } | { readonly _tag: "stop" }
type FromRelays =
  | {
      readonly _tag: "ready"
      readonly relays: ReadonlyArray<{ readonly name: string; readonly url: string }>
    }
  | { readonly _tag: "stopped"; readonly events: number }

const PROMPT_SEED = 0xbeef

/** The worker: starts the relays, stores the prompts' prefixes, then ingests on command. */
const runRelays = (init: RelaysInit) =>
  Effect.gen(function* () {
    const port = parentPort!
    const commands = yield* Queue.unbounded<ToRelays>()
    port.on("message", (message: ToRelays) => Queue.unsafeOffer(commands, message))
    const relays: Array<BenchRelay> = []
    for (let dc = 0; dc < LANES; dc++) relays.push(yield* startRelay(`dc-${dc}`, init.expected))
    yield* storePrefixes(relays, makePrompts(init.promptCount, PROMPT_SEED), init.promptCount)
    port.postMessage({
      _tag: "ready",
      relays: relays.map((r) => ({ name: r.name, url: r.url }))
    } satisfies FromRelays)
    for (;;) {
      const command = yield* Queue.take(commands)
      if (command._tag !== "ingest") continue
      const stop = yield* startIngest(relays)
      while ((yield* Queue.take(commands))._tag !== "stop") {}
      port.postMessage({ _tag: "stopped", events: yield* stop } satisfies FromRelays)
    }
  })

const relaysInit = workerData as Partial<RelaysInit> | null
if (!isMainThread && relaysInit?.role === RELAYS_ROLE) {
  await Effect.runPromise(
    runRelays(relaysInit as RelaysInit).pipe(Effect.scoped, Logger.withMinimumLogLevel(LogLevel.Error))
  )
  // Under a bundle this module shares a file with the bench entry: the worker must never go on
  // to run it. It lives on its servers and port until the main thread terminates it.
  await new Promise<never>(() => {})
}

/** The relays' worker, as the main thread drives it. */
interface RelaysWorker {
  readonly relays: ReadonlyArray<{ readonly name: string; readonly url: string }>
  /** Starts the writers; the effect it returns stops them and gives the events they admitted. */
  readonly startIngest: Effect.Effect<Effect.Effect<number>>
}

const startRelaysWorker = (promptCount: number, expected: number) =>
  Effect.gen(function* () {
    const worker = yield* Effect.acquireRelease(
      Effect.sync(
        () =>
          new Worker(new URL(import.meta.url), {
            workerData: { role: RELAYS_ROLE, promptCount, expected } satisfies RelaysInit
          })
      ),
      (w) => Effect.promise(() => w.terminate())
    )
    const replies = yield* Queue.unbounded<FromRelays | Error>()
    worker.on("message", (message: FromRelays) => Queue.unsafeOffer(replies, message))
    worker.on("error", (error) => Queue.unsafeOffer(replies, error))
    worker.on("exit", (code) =>
      Queue.unsafeOffer(replies, new Error(`the relays' worker exited with ${code}`))
    )
    const reply = <T extends FromRelays["_tag"]>(tag: T) =>
      Queue.take(replies).pipe(
        Effect.flatMap((message) =>
          message instanceof Error || message._tag !== tag
            ? Effect.dieMessage(
                `the relays' worker: expected ${tag}, got ${String(message instanceof Error ? message.message : message._tag)}`
              )
            : Effect.succeed(message as Extract<FromRelays, { _tag: T }>)
        )
      )
    const ready = yield* reply("ready")
    const handle: RelaysWorker = {
      relays: ready.relays,
      startIngest: Effect.sync(() => {
        worker.postMessage({ _tag: "ingest" } satisfies ToRelays)
        return Effect.suspend(() => {
          worker.postMessage({ _tag: "stop" } satisfies ToRelays)
          return reply("stopped").pipe(Effect.map((m) => m.events))
        })
      })
    }
    return handle
  })

/**
 * 16 relays (in their worker) holding prefixes of `promptCount` prompts, the consumer following
 * them over HTTP and its HTTP API; returns once all 16 lanes are ready. Also used by profiling
 * drivers.
 */
export const startGlobal = (promptCount: number) =>
  Effect.gen(function* () {
    const expected = 65_536
    const prompts = makePrompts(promptCount, PROMPT_SEED)
    const relayWorker = yield* startRelaysWorker(promptCount, expected)
    const connector = yield* Layer.build(
      RelayConnector.layerHttp().pipe(Layer.provide(NodeHttpClient.layerUndici))
    )
    const consumer = yield* makeConsumer({
      relays: relayWorker.relays
    }).pipe(Effect.provide(connector), Effect.orDie)
    const view = makeView(consumer)
    const server = yield* Layer.build(
      GlobalHttpServer.layer({ host: "127.0.0.1", port: 0 }).pipe(
        Layer.provide(
          Layer.mergeAll(Layer.succeed(GlobalConsumer, consumer), Layer.succeed(GlobalView, view))
        )
      )
    )
    const realUrl = yield* GlobalHttpServer.serverUrl.pipe(Effect.provide(server))
    const setupStart = performance.now()
    while (readyLanes(consumer) < LANES) {
      if (performance.now() - setupStart > 120_000)
        return yield* Effect.dieMessage("lanes did not become ready")
      yield* Effect.sleep("20 millis")
    }

    const bodies = prompts.map((prompt) =>
      JSON.stringify({ namespace: "bench", model: "llama", tokens: Array.from(prompt.tokens) })
    )
    return { relayWorker, consumer, realUrl, bodies }
  })

const program = (ctx: BenchContext) =>
  Effect.gen(function* () {
    const seconds = ctx.quick ? 2 : 5
    const rounds = 3
    const { relayWorker, consumer, realUrl, bodies } = yield* startGlobal(512)
    // The bare server's fixed answer is a real answer, so both send the same bytes back.
    const sample = yield* Effect.promise(() =>
      fetch(`${realUrl}/v1/overlap`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: bodies[0]!
      }).then(async (r) => ({ status: r.status, text: await r.text() }))
    )
    const answer = JSON.parse(sample.text) as { results?: Array<unknown> }
    if (sample.status !== 200 || answer.results?.length !== LANES)
      return yield* Effect.dieMessage(`overlap failed: ${sample.status} ${sample.text.slice(0, 300)}`)
    const bare = yield* Effect.acquireRelease(
      Effect.promise(() => bareServer(sample.text)),
      (s) => Effect.promise(() => new Promise<void>((resolve) => s.close(() => resolve())))
    )
    const bareUrl = `http://127.0.0.1:${(bare.address() as AddressInfo).port}`
    ctx.log(
      `  16 lanes ready; ${bodies.length} bodies of ~${bodies[0]!.length} B, answers of ${sample.text.length} B`
    )

    const run = (what: string, options: Parameters<typeof load>[0]) =>
      Effect.promise(() => measured(options)).pipe(
        Effect.map((r) => ({ ...checked(what, r), cpu: r.cpuPerQueryUs }))
      )
    // Warm both paths (JIT, connection set-up) before anything is kept.
    yield* run("warm-up real", { url: realUrl, bodies, seconds: 1 })
    yield* run("warm-up bare", { url: bareUrl, bodies, seconds: 1 })
    yield* Effect.sync(gc)
    // What this thread's collector starts from (with KVRELAY_BENCH_IN_PROCESS=1, earlier suites
    // leave theirs).
    const heap = getHeapStatistics()
    ctx.log(
      `  server thread's heap after warm-up and a full GC: ${(heap.used_heap_size / 2 ** 20).toFixed(1)} MiB used, ${(heap.external_memory / 2 ** 20).toFixed(1)} MiB external`
    )

    // ---- peak, alternating
    const realPeaks: Array<number> = []
    const barePeaks: Array<number> = []
    const realCpu: Array<number> = []
    const bareCpu: Array<number> = []
    for (let r = 0; r < rounds; r++) {
      const real = yield* run("real peak", { url: realUrl, bodies, seconds })
      const bareRun = yield* run("bare peak", { url: bareUrl, bodies, seconds })
      realPeaks.push(real.qps)
      barePeaks.push(bareRun.qps)
      realCpu.push(real.cpu)
      bareCpu.push(bareRun.cpu)
      ctx.log(
        `  round ${r + 1}: real ${real.qps.toFixed(0)} q/s (${real.cpu.toFixed(0)} µs CPU/q), bare ${bareRun.qps.toFixed(0)} q/s (${bareRun.cpu.toFixed(0)} µs CPU/q)`
      )
    }
    const realPeak = median(realPeaks)
    const barePeak = median(barePeaks)

    // ---- latency at half of the real peak, both servers at that rate
    const rate = Math.max(CONNECTIONS, Math.floor(realPeak / 2))
    const realP50: Array<number> = []
    const realP99: Array<number> = []
    const bareP99: Array<number> = []
    for (let r = 0; r < rounds; r++) {
      const realStalls = watchStalls()
      const real = yield* run("real at half peak", { url: realUrl, bodies, seconds, rate })
      const realHeld = realStalls()
      const bareStalls = watchStalls()
      const bareRun = yield* run("bare at half peak", { url: bareUrl, bodies, seconds, rate })
      const bareHeld = bareStalls()
      realP50.push(real.p50)
      realP99.push(real.p99)
      bareP99.push(bareRun.p99)
      ctx.log(
        `  half peak ${r + 1}: real p50 ${real.p50.toFixed(2)} p99 ${real.p99.toFixed(2)} ms (${stallsText(realHeld)}); bare p50 ${bareRun.p50.toFixed(2)} p99 ${bareRun.p99.toFixed(2)} ms (${stallsText(bareHeld)})`
      )
    }

    // ---- peak while the 16 relays publish, alternating with idle
    const idlePeaks: Array<number> = []
    const ingestPeaks: Array<number> = []
    let published = 0
    let ingestMs = 0
    let events = 0
    for (let r = 0; r < rounds; r++) {
      idlePeaks.push((yield* run("real idle", { url: realUrl, bodies, seconds })).qps)
      const before = sequencesOf(consumer)
      const stop = yield* relayWorker.startIngest
      const started = performance.now()
      ingestPeaks.push((yield* run("real under ingest", { url: realUrl, bodies, seconds })).qps)
      ingestMs += performance.now() - started
      events += yield* stop
      // Let the consumer install what was published before the next idle round.
      const settle = performance.now()
      let last = -1
      while (sequencesOf(consumer) !== last && performance.now() - settle < 30_000) {
        last = sequencesOf(consumer)
        yield* Effect.sleep("100 millis")
      }
      published += sequencesOf(consumer) - before
    }

    const note = `${LANES} lanes, 1024-token prompts, ${CONNECTIONS} connections, autocannon in a child process, median of ${rounds} alternating rounds of ${seconds} s`
    record(
      ctx,
      "overlap_http",
      "queries/s",
      realPeak,
      barePeak,
      `${note}; vs bare node:http parsing the same bodies; target >= 0.6x; CPU/q ${median(realCpu).toFixed(0)} µs vs ${median(bareCpu).toFixed(0)} µs`
    )
    record(
      ctx,
      "overlap_http_p99_half_peak",
      "µs",
      median(realP99) * 1000,
      median(bareP99) * 1000,
      `at ${rate} q/s (half the real peak), both servers; p50 ${(median(realP50) * 1000).toFixed(0)} µs; target <= 5000 µs; lower is better`,
      true
    )
    record(
      ctx,
      "overlap_http_under_ingest",
      "queries/s",
      median(ingestPeaks),
      median(idlePeaks),
      `peak while 16 relays publish (${Math.round((events * 1000) / ingestMs)} events/s of ${INGEST_BLOCKS_PER_EVENT} blocks, ${Math.round((published * 1000) / ingestMs)} deltas/s installed) vs idle; target >= 0.5x`
    )
  })

/**
 * `route_http`: `POST /v1/route` against `POST /v1/overlap` on the same prompts and the same
 * consumer (16 ready lanes whose relays send load windows with engine load every second and a
 * READY readiness), alternating rounds, median of each. The decision adds the readiness and load
 * lookups, the cost model over 16 candidates and a longer answer to the overlap itself.
 */
const routeProgram = (ctx: BenchContext) =>
  Effect.gen(function* () {
    const seconds = ctx.quick ? 2 : 5
    const rounds = 3
    const { consumer, realUrl, bodies } = yield* startGlobal(512)
    // Every lane's load and readiness arrive before anything is timed.
    const settle = performance.now()
    for (;;) {
      const answer = yield* Effect.promise(() =>
        fetch(`${realUrl}/v1/route`, {
          method: "POST",
          headers: { "content-type": "application/json" },
          body: bodies[0]!
        }).then(async (r) => ({
          status: r.status,
          body: (await r.json()) as { candidates?: Array<{ reason?: string }> }
        }))
      )
      const known = answer.body.candidates?.filter((c) => c.reason === undefined).length ?? 0
      if (answer.status === 200 && known === LANES) break
      if (performance.now() - settle > 60_000)
        return yield* Effect.dieMessage(
          `route answers never had ${LANES} candidates with known load: ${answer.status} ${JSON.stringify(answer.body.candidates?.map((c) => c.reason ?? "ok"))}`
        )
      yield* Effect.sleep("100 millis")
    }
    void consumer
    const run = (what: string, path: string) =>
      Effect.promise(() => measured({ url: realUrl, bodies, seconds, path })).pipe(
        Effect.map((r) => ({ ...checked(what, r), cpu: r.cpuPerQueryUs }))
      )
    yield* run("warm-up route", "/v1/route")
    yield* run("warm-up overlap", "/v1/overlap")
    const routes: Array<number> = []
    const overlaps: Array<number> = []
    const routeCpu: Array<number> = []
    const overlapCpu: Array<number> = []
    for (let r = 0; r < rounds; r++) {
      const route = yield* run("route", "/v1/route")
      const overlap = yield* run("overlap", "/v1/overlap")
      routes.push(route.qps)
      overlaps.push(overlap.qps)
      routeCpu.push(route.cpu)
      overlapCpu.push(overlap.cpu)
      ctx.log(
        `  round ${r + 1}: route ${route.qps.toFixed(0)} q/s (${route.cpu.toFixed(0)} µs CPU/q), overlap ${overlap.qps.toFixed(0)} q/s (${overlap.cpu.toFixed(0)} µs CPU/q)`
      )
    }
    record(
      ctx,
      "route_http",
      "queries/s",
      median(routes),
      median(overlaps),
      `${LANES} lanes with live load windows and readiness, 1024-token prompts, ${CONNECTIONS} connections, median of ${rounds} alternating rounds of ${seconds} s; vs /v1/overlap on the same prompts; target >= 0.8x; CPU/q ${median(routeCpu).toFixed(0)} µs vs ${median(overlapCpu).toFixed(0)} µs`
    )
  })

export const benchRouteHttp = async (ctx: BenchContext): Promise<void> => {
  await Effect.runPromise(routeProgram(ctx).pipe(Effect.scoped, Logger.withMinimumLogLevel(LogLevel.Error)))
}

export const benchOverlapHttp = async (ctx: BenchContext): Promise<void> => {
  await Effect.runPromise(program(ctx).pipe(Effect.scoped, Logger.withMinimumLogLevel(LogLevel.Error)))
}
