/**
 * End to end: simulated workers (ZMTP PUB sockets in this process, `zmtpPublisher.ts`) → a
 * `kvrelay relay` child process → one HTTP pool-stream subscriber in this process.
 *
 * - Sustained blocks/s: a fixed burst of 8-block Stored events, timed from the first send until
 *   the subscriber has seen a probe event sent last by every worker (every block applied,
 *   published and on the wire). A warm-up burst on the same relay comes first, so the figure is
 *   not that of a cold JIT. Queues are deep enough that nothing drops.
 * - p99 event → delta-on-the-wire latency at half that rate: probe events are sent every 10 ms
 *   among paced traffic; a probe is seen when a delta carries its fingerprint in bucket a or b.
 * - Both with tracing off and with OTLP export on (to a receiver in this process), alternating
 *   over several rounds (a fresh relay each) and reported as medians, so the cost of tracing is a
 *   same-run ratio; and against the in-process actor figure of the same run.
 */

import { type ChildProcess, spawn } from "node:child_process"
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs"
import { createServer, request } from "node:http"
import type { AddressInfo } from "node:net"
import { tmpdir } from "node:os"
import { dirname, join } from "node:path"
import { monitorEventLoopDelay, performance } from "node:perf_hooks"
import { fileURLToPath } from "node:url"
import { CkfAddressing, DEFAULT_SEED } from "../src/ckf/addressing.js"
import { bucketCountFor } from "../src/ckf/config.js"
import type { RouterEvent } from "../src/protocol/Events.js"
import { encodeDynamoMessage, KV_EVENT_TOPIC } from "../src/transport/DynamoZmq.js"
import { type BenchContext, HashStream, percentile, record } from "./harness.js"
import { ZmtpPublisher } from "./zmtpPublisher.js"

const BLOCKS = 8
const EXPECTED_BLOCKS = 1_048_576

const repoRoot = (): string => {
  const here = dirname(fileURLToPath(import.meta.url))
  return here.endsWith(join("dist", "bench")) ? join(here, "..", "..") : join(here, "..")
}

interface Worker {
  readonly socket: ZmtpPublisher
  readonly endpoint: string
  readonly workerId: string
  readonly publisherId: bigint
  eventId: number
  sequence: number
}

const makeWorkers = async (count: number): Promise<Array<Worker>> => {
  const workers: Array<Worker> = []
  for (let i = 0; i < count; i++) {
    const socket = await ZmtpPublisher.bind()
    workers.push({
      socket,
      endpoint: socket.endpoint,
      workerId: String(9000 + i),
      publisherId: BigInt(1000 + i),
      eventId: 1,
      sequence: 0
    })
  }
  return workers
}

/** Sends one message, waiting only when the relay's socket is backed up: a burst is delivered, not dropped. */
const send = async (worker: Worker, frames: Array<Buffer>): Promise<void> => {
  if (!worker.socket.send(frames)) await worker.socket.drained()
}

const storedFrames = (worker: Worker, hashes: Uint32Array): Array<Buffer> => {
  const event: RouterEvent = {
    workerId: worker.workerId,
    dpRank: 0,
    eventId: worker.eventId++,
    storageTier: "device",
    data: {
      _tag: "Stored",
      blockHashes: hashes,
      tokensHashes: hashes,
      parentHash: undefined,
      startPosition: undefined
    }
  }
  return encodeDynamoMessage({
    topic: KV_EVENT_TOPIC,
    publisherId: worker.publisherId,
    sequence: worker.sequence++,
    publishedAtMs: Date.now(),
    events: [event]
  })
}

const discoveryDocument = (
  workers: ReadonlyArray<Worker>,
  metricsUrl: ((index: number) => string) | undefined = undefined
) => ({
  version: 1,
  cards: workers.map((w) => ({
    namespace: "bench",
    component: "backend",
    endpoint: "generate",
    instanceId: w.workerId,
    modelSuffix: null,
    card: { name: "bench-model", sourcePath: "bench/model", kvCacheBlockSize: 16 }
  })),
  sources: workers.map((w, i) => ({
    kvStateEndpoint: "bench.backend.generate",
    workerId: w.workerId,
    dpRank: 0,
    publisherId: String(w.publisherId),
    transport: { kind: "dynamo-zmq", endpoint: w.endpoint, topic: KV_EVENT_TOPIC },
    recoveryTarget: null,
    ...(metricsUrl === undefined ? {} : { metricsUrl: metricsUrl(i) })
  }))
})

interface Relay {
  readonly child: ChildProcess
  readonly url: string
}

const startRelay = (discoveryPath: string, otlp: string | undefined): Promise<Relay> =>
  new Promise((resolve, reject) => {
    // KVRELAY_BENCH_RELAY_ENTRY runs another build of the CLI (e.g. one bundled from the current
    // sources with esbuild), so the relay can be measured without rebuilding dist/.
    const entry = process.env["KVRELAY_BENCH_RELAY_ENTRY"] ?? join(repoRoot(), "bin", "kvrelay.js")
    const args = [
      entry,
      "relay",
      "--dc-id",
      "bench",
      "--discovery",
      `file:${discoveryPath}`,
      "--http",
      "127.0.0.1:0",
      "--expected-unique-blocks",
      String(EXPECTED_BLOCKS),
      "--log-level",
      "error"
    ]
    if (otlp !== undefined) args.push("--otlp", otlp)
    const nodeArgs =
      process.env["KVRELAY_BENCH_RELAY_NODE_ARGS"]?.split(" ").filter((a) => a.length > 0) ?? []
    const child = spawn(process.execPath, [...nodeArgs, ...args], { stdio: ["ignore", "pipe", "pipe"] })
    let stdout = ""
    let stderr = ""
    const timer = setTimeout(() => reject(new Error(`relay did not start: ${stderr}`)), 20_000)
    child.stderr!.on("data", (chunk: Buffer) => {
      stderr += chunk.toString()
    })
    // An interrupted bench must not leave its relay running.
    const killOnExit = () => child.kill("SIGKILL")
    process.once("exit", killOnExit)
    child.once("exit", () => process.removeListener("exit", killOnExit))
    child.stdout!.on("data", (chunk: Buffer) => {
      stdout += chunk.toString()
      const line = stdout.split("\n").find((l) => l.includes('"listening"'))
      if (line !== undefined) {
        clearTimeout(timer)
        resolve({ child, url: (JSON.parse(line) as { url: string }).url })
      }
    })
    child.on("exit", (code) => reject(new Error(`relay exited with ${code}: ${stderr}`)))
  })

/**
 * CPU time the relay process used so far (every thread), from /proc on Linux; `undefined`
 * elsewhere. Unlike the wall-clock rate it barely moves when other processes share the machine.
 */
const relayCpuMs = (relay: Relay, mainThreadOnly = false): number | undefined => {
  try {
    const pid = relay.child.pid
    // The main thread alone (its task has the process id): without V8's compiler and GC threads
    // and ZeroMQ's I/O thread, which the process figure includes.
    const stat = readFileSync(mainThreadOnly ? `/proc/${pid}/task/${pid}/stat` : `/proc/${pid}/stat`, "utf8")
    // Fields after the parenthesized command name; utime and stime are the 14th and 15th fields.
    const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ")
    return ((Number(fields[11]) + Number(fields[12])) * 1000) / CLOCK_TICKS_PER_SECOND
  } catch {
    return undefined
  }
}
/** One scrape of the relay: its event-loop delay p99/max since the last scrape (prom-client's
 * gauges) as text, and its publish-delay histogram summed over the pools (cumulative counts by
 * upper bound in ms). */
const scrapeRelay = async (
  relay: Relay
): Promise<{ readonly loopLag: string; readonly publishDelay: ReadonlyMap<number, number> }> => {
  try {
    const text = await (await fetch(`${relay.url}/metrics`)).text()
    const gauge = (name: string) => {
      const line = text.split("\n").find((l) => l.startsWith(`${name} `))
      return line === undefined ? "?" : (Number(line.slice(name.length + 1)) * 1000).toFixed(1)
    }
    const publishDelay = new Map<number, number>()
    for (const m of text.matchAll(
      /^kv_dc_relay_publish_delay_seconds_bucket\{[^}]*le="([^"]+)"\} (\S+)$/gm
    )) {
      const le = m[1] === "+Inf" ? Number.POSITIVE_INFINITY : Number(m[1]) * 1000
      publishDelay.set(le, (publishDelay.get(le) ?? 0) + Number(m[2]))
    }
    return {
      loopLag: `${gauge("nodejs_eventloop_lag_p99_seconds")}/${gauge("nodejs_eventloop_lag_max_seconds")} ms`,
      publishDelay
    }
  } catch {
    return { loopLag: "unknown", publishDelay: new Map() }
  }
}

/**
 * The relay's own view of a phase: the upper bounds (ms) of the publish-delay buckets that hold
 * its p50 and p99, from two scrapes' cumulative counts. It covers admission to publication only.
 */
const publishDelayBetween = (
  before: ReadonlyMap<number, number>,
  after: ReadonlyMap<number, number>
): string => {
  const bounds = [...after.keys()].sort((a, b) => a - b)
  const counts = bounds.map((le) => (after.get(le) ?? 0) - (before.get(le) ?? 0))
  const total = counts.at(-1) ?? 0
  if (total <= 0) return "none"
  const quantile = (q: number) => {
    const i = counts.findIndex((c) => c >= q * total)
    const le = bounds[i]!
    return le === Number.POSITIVE_INFINITY ? `>${bounds.at(-2)}` : `≤${le}`
  }
  return `p50 ${quantile(0.5)} / p99 ${quantile(0.99)} ms of ${total} deltas`
}

/** USER_HZ: 100 on every Linux configuration Node supports. */
const CLOCK_TICKS_PER_SECOND = 100

const stopRelay = (relay: Relay): Promise<void> =>
  new Promise((resolve) => {
    if (relay.child.exitCode !== null) return resolve()
    relay.child.once("exit", () => resolve())
    relay.child.kill("SIGTERM")
    setTimeout(() => relay.child.kill("SIGKILL"), 5000).unref()
  })

const getJson = async <A>(url: string): Promise<A> => (await (await fetch(url)).json()) as A

interface CatalogJson {
  readonly pools: ReadonlyArray<{ readonly producer: unknown }>
}
interface StatsJson {
  readonly endpoints: ReadonlyArray<{
    readonly publication: { readonly sequence: string } | null
    readonly aggregation: { readonly members: ReadonlyArray<unknown> } | null
  }>
}

const until = async (what: string, check: () => Promise<boolean>, timeoutMs = 30_000): Promise<void> => {
  const deadline = performance.now() + timeoutMs
  while (!(await check())) {
    if (performance.now() > deadline) throw new Error(`timed out waiting for ${what}`)
    await new Promise((r) => setTimeout(r, 20))
  }
}

/** A pool-stream subscriber decoding frames (PROTOCOL §5) and delta images (CBI1 §6). */
class Subscriber {
  lastSequence = 0n
  deltas = 0
  terminal: string | undefined
  private buffer: Buffer = Buffer.alloc(0)
  private readonly waiters: Array<(images: Uint32Array, at: number, writtenAt: number) => void> = []
  private closeRequest: (() => void) | undefined

  constructor(url: string, producer: unknown) {
    const body = JSON.stringify({ subscriberId: "bench", expectedProducer: producer })
    const req = request(`${url}/v1/pools/subscribe`, {
      method: "POST",
      headers: { "content-type": "application/json" }
    })
    req.on("response", (res) => {
      res.on("data", (chunk: Buffer) => this.push(chunk))
    })
    req.on("error", () => undefined)
    req.end(body)
    this.closeRequest = () => req.destroy()
  }

  /** `at` on this process's `performance.now()`; `writtenAt` the frame's send time (epoch ms). */
  onDelta(listener: (images: Uint32Array, at: number, writtenAt: number) => void): void {
    this.waiters.push(listener)
  }

  close(): void {
    this.closeRequest?.()
  }

  private push(chunk: Buffer): void {
    const at = performance.now()
    this.buffer = this.buffer.length === 0 ? chunk : Buffer.concat([this.buffer, chunk])
    while (this.buffer.length >= 4) {
      const size = this.buffer.readUInt32LE(0)
      if (this.buffer.length < 4 + size) break
      const kind = this.buffer[4]
      const sequence = this.buffer.readBigUInt64LE(13)
      // The relay stamps each frame with its clock (epoch µs) as it writes it.
      const writtenAt = Number(this.buffer.readBigUInt64LE(21)) / 1000
      const payload = this.buffer.subarray(29, 4 + size)
      if (kind === 2) {
        // CBI1 delta body after the 48-byte header: base u64, count u32, count × (bucket u32, word u64).
        const count = payload.readUInt32LE(48 + 8)
        const images = new Uint32Array(count * 3)
        for (let i = 0; i < count; i++) {
          const o = 48 + 12 + 12 * i
          images[3 * i] = payload.readUInt32LE(o)
          images[3 * i + 1] = payload.readUInt32LE(o + 4)
          images[3 * i + 2] = payload.readUInt32LE(o + 8)
        }
        this.deltas++
        this.lastSequence = sequence
        for (const listener of this.waiters) listener(images, at, writtenAt)
      } else if (kind === 1 || kind === 3) {
        this.lastSequence = sequence
      } else if (kind === 4) {
        this.terminal = payload.toString("utf8")
      }
      this.buffer = this.buffer.subarray(4 + size)
    }
  }
}

interface PhaseResult {
  readonly blocksPerSecond: number
  /** Relay CPU time per event of the measured burst, in µs (Linux only). */
  readonly cpuPerEvent: number | undefined
  readonly p50Ms: number
  readonly p99Ms: number
}

/** More sources beside the 4 that send (idle publishers), and engine metrics for every source. */
interface PhaseSetup {
  readonly idleSources?: number | undefined
  readonly metricsUrl?: ((index: number) => string) | undefined
}

const runPhase = async (
  ctx: BenchContext,
  otlp: string | undefined,
  setup: PhaseSetup = {}
): Promise<PhaseResult> => {
  const dir = mkdtempSync(join(tmpdir(), "kvrelay-bench-e2e-"))
  const everyWorker = await makeWorkers(4 + (setup.idleSources ?? 0))
  const workers = everyWorker.slice(0, 4)
  const discoveryPath = join(dir, "discovery.json")
  writeFileSync(discoveryPath, JSON.stringify(discoveryDocument(everyWorker, setup.metricsUrl)))
  const relay = await startRelay(discoveryPath, otlp)
  let subscriber: Subscriber | undefined
  try {
    // The pool appears once the workers' sources are connected; a first event per worker binds
    // its rank (live-only sources apply their first event directly).
    await until(
      "the relay's pool",
      async () => (await getJson<CatalogJson>(`${relay.url}/v1/catalog`)).pools.length > 0
    )
    const catalog = await getJson<CatalogJson>(`${relay.url}/v1/catalog`)
    subscriber = new Subscriber(relay.url, catalog.pools[0]!.producer)
    const stream = new HashStream(otlp === undefined ? 11 : 13)
    const batch = () => {
      const hashes = new Uint32Array(2 * BLOCKS)
      for (let i = 0; i < BLOCKS; i++) stream.next(hashes, 2 * i)
      return hashes
    }
    // A SUB socket may still be joining when the first event goes out (ZeroMQ's slow joiner):
    // send again until every rank is a member.
    let sentAt = Number.NEGATIVE_INFINITY
    await until("every rank in the pool", async () => {
      if (performance.now() - sentAt >= 500) {
        sentAt = performance.now()
        for (const w of workers) await send(w, storedFrames(w, batch()))
      }
      const stats = await getJson<StatsJson>(`${relay.url}/v1/stats`)
      return (stats.endpoints[0]?.aggregation?.members.length ?? 0) === workers.length
    })
    // The first deltas come after the whole snapshot (4 MiB here): a burst that started before
    // the subscriber had read it would queue behind it in the relay and lag the stream.
    // (An event applied before the hub's snapshot is in it, not in a delta: send more meanwhile.)
    sentAt = Number.NEGATIVE_INFINITY
    await until("the snapshot on the wire", async () => {
      if (subscriber!.deltas > 0) return true
      if (performance.now() - sentAt >= 200) {
        sentAt = performance.now()
        await send(workers[0]!, storedFrames(workers[0]!, batch()))
      }
      return false
    })

    // Probes: events whose first block is watched for on the wire (its fingerprint in a delta
    // image of bucket a or b). Each rank's events are applied in order, so a probe sent last by
    // every worker marks the end of a burst without polling the relay (a stats request would
    // itself compete with the ingest being measured).
    const addressing = new CkfAddressing(DEFAULT_SEED, bucketCountFor(EXPECTED_BLOCKS))
    const pending = new Map<number, { fp: number; a: number; b: number; sentAt: number }>()
    const latencies: Array<number> = []
    // Each probe's latency split at the relay's write of the delta that carried it: before (the
    // relay: sockets, decode, actor, hub) and after (the stream, this process's loop). Both
    // processes' clocks are epoch-based on one host, to about a millisecond.
    const epochOrigin = Date.now() - performance.now()
    const toWrite: Array<number> = []
    const fromWrite: Array<number> = []
    subscriber.onDelta((images, at, writtenAt) => {
      if (pending.size === 0) return
      for (let i = 0; i < images.length; i += 3) {
        const bucket = images[i]!
        for (const [id, probe] of pending) {
          if (bucket !== probe.a && bucket !== probe.b) continue
          const lo = images[i + 1]!
          const hi = images[i + 2]!
          const fp = probe.fp
          if ((lo & 0xffff) === fp || lo >>> 16 === fp || (hi & 0xffff) === fp || hi >>> 16 === fp) {
            latencies.push(at - probe.sentAt)
            toWrite.push(writtenAt - (epochOrigin + probe.sentAt))
            fromWrite.push(epochOrigin + at - writtenAt)
            pending.delete(id)
          }
        }
      }
    })
    // A probe's frames are encoded ahead of time; it is watched for from the moment it is sent.
    interface Probe {
      readonly frames: Array<Buffer>
      readonly fp: number
      readonly a: number
      readonly b: number
    }
    const probeFrames = (w: Worker): Probe => {
      const hashes = batch()
      addressing.prepareHalves(hashes[0]!, hashes[1]!)
      return { frames: storedFrames(w, hashes), fp: addressing.fp, a: addressing.a, b: addressing.b }
    }
    let probeId = 0
    const sendProbe = (w: Worker, p: Probe): Promise<void> => {
      pending.set(probeId++, { fp: p.fp, a: p.a, b: p.b, sentAt: performance.now() })
      return send(w, p.frames)
    }
    const probe = (w: Worker): Promise<void> => sendProbe(w, probeFrames(w))

    // A burst: `perWorker` events from every worker as fast as the sockets take them, then one
    // probe per worker; done once every probe is on the wire. Returns blocks/s and the send time.
    const burst = async (
      perWorker: number
    ): Promise<{
      blocksPerSecond: number
      sentIn: number
      cpuPerEvent: number | undefined
      mainCpuPerEvent: number | undefined
      deltas: number
    }> => {
      const frames = workers.map((w) => Array.from({ length: perWorker }, () => storedFrames(w, batch())))
      const cpuBefore = relayCpuMs(relay)
      const mainBefore = relayCpuMs(relay, true)
      const deltasBefore = subscriber!.deltas
      const start = performance.now()
      // The subscriber shares this process: yield to the event loop now and then, or its socket is
      // never read while the publishers send (a real consumer runs elsewhere).
      await Promise.all(
        workers.map(async (w, i) => {
          let n = 0
          for (const f of frames[i]!) {
            await send(w, f)
            if (++n % 32 === 0) await new Promise((r) => setImmediate(r))
          }
          await probe(w)
        })
      )
      const sentIn = performance.now() - start
      await until(
        "the burst on the wire",
        async () => {
          // A lagged stream never shows the probes: say so now rather than at the timeout.
          if (subscriber!.terminal !== undefined)
            throw new Error(`the pool stream ended during the burst: ${subscriber!.terminal}`)
          return pending.size === 0
        },
        120_000
      )
      const events = workers.length * (perWorker + 1)
      const blocksPerSecond = (events * BLOCKS) / ((performance.now() - start) / 1000)
      const cpuAfter = relayCpuMs(relay)
      const mainAfter = relayCpuMs(relay, true)
      const mainCpuPerEvent =
        mainBefore === undefined || mainAfter === undefined
          ? undefined
          : ((mainAfter - mainBefore) * 1000) / events
      const cpuPerEvent =
        cpuBefore === undefined || cpuAfter === undefined
          ? undefined
          : ((cpuAfter - cpuBefore) * 1000) / events
      latencies.length = 0
      toWrite.length = 0
      fromWrite.length = 0
      return {
        blocksPerSecond,
        sentIn,
        cpuPerEvent,
        mainCpuPerEvent,
        deltas: subscriber!.deltas - deltasBefore
      }
    }

    // Warm-up on the same relay: the measured burst then runs optimized code (a fresh relay
    // interprets its hot paths for the first thousands of events), not JIT tiers. One burst was
    // not enough: V8 was still compiling on its helper threads through the measured burst (~35–75
    // TurboFan compiles a second, `--log-code`), ~10 µs of CPU per event that a relay running for
    // hours does not pay. KVRELAY_BENCH_E2E_WARMUPS sets the number of warm-up bursts.
    const warmups = Number(process.env["KVRELAY_BENCH_E2E_WARMUPS"] ?? 6)
    for (let w = 0; w < warmups; w++) await burst(1_000)
    // Peak: a burst well inside the filter's capacity (load ≤ 0.3 at the end, warm-up included).
    const { blocksPerSecond, sentIn, cpuPerEvent, mainCpuPerEvent, deltas } = await burst(
      ctx.quick ? 4_000 : 12_000
    )

    // Latency at half the peak: paced traffic, a probe every 10 ms.
    // KVRELAY_BENCH_E2E_RATE fixes the paced rate (blocks/s), so two builds compare at one load.
    const fixedRate = Number(process.env["KVRELAY_BENCH_E2E_RATE"] ?? Number.NaN)
    const rate = Number.isFinite(fixedRate) && fixedRate > 0 ? fixedRate : blocksPerSecond / 2
    const durationMs = ctx.quick ? 2_000 : 6_000
    const tickMs = 10
    const batchesPerTick = Math.max(1, Math.round((rate * tickMs) / 1000 / BLOCKS))
    // Every paced message is encoded before the clock starts, so the bench process only writes
    // them: encoding them as they went out cost it more CPU per event than the relay spent, on the
    // two cores the relay's latency is measured on. A probe leads every tick: at one per 50 ms a
    // quick run's p99 was the second-largest of 40 samples.
    const ticks = Math.ceil(durationMs / tickMs)
    const paced = Array.from({ length: ticks }, (_, tick) =>
      Array.from({ length: batchesPerTick }, (_, k) => {
        const worker = workers[(tick * batchesPerTick + k) % workers.length]!
        const message: Array<Buffer> | Probe = k === 0 ? probeFrames(worker) : storedFrames(worker, batch())
        return { worker, message }
      })
    )
    // Relay CPU per event at the paced rate too: unlike the burst's, it does not depend on how far
    // the relay falls behind (a relay that lags takes more events per wake-up, each cheaper).
    const pacedCpuBefore = relayCpuMs(relay)
    const pacedMainBefore = relayCpuMs(relay, true)
    let pacedEvents = 0
    // Where a slow probe waited: the event loops of both processes during the paced phase. A
    // scrape resets the relay's loop-delay histogram (prom-client), so the second one covers it.
    const scrapeBefore = await scrapeRelay(relay)
    const benchLoop = monitorEventLoopDelay({ resolution: 1 })
    benchLoop.enable()
    const benchCpuBefore = process.cpuUsage()
    const paceStart = performance.now()
    for (let tick = 0; tick < ticks; tick++) {
      const wait = paceStart + tick * tickMs - performance.now()
      if (wait > 0) await new Promise((r) => setTimeout(r, wait))
      for (const { worker, message } of paced[tick]!) {
        if (Array.isArray(message)) await send(worker, message)
        else await sendProbe(worker, message)
        pacedEvents++
      }
    }
    await until("the last probes", async () => pending.size === 0, 10_000).catch(() => undefined)
    benchLoop.disable()
    const benchCpu = process.cpuUsage(benchCpuBefore)
    const scrapeAfter = await scrapeRelay(relay)
    const relayLoop = scrapeAfter.loopLag
    const pacedCpuAfter = relayCpuMs(relay)
    const pacedMainAfter = relayCpuMs(relay, true)
    const perPacedEvent = (before: number | undefined, after: number | undefined) =>
      before === undefined || after === undefined ? undefined : ((after - before) * 1000) / pacedEvents
    const pacedCpu = perPacedEvent(pacedCpuBefore, pacedCpuAfter)
    const pacedMainCpu = perPacedEvent(pacedMainBefore, pacedMainAfter)
    latencies.sort((a, b) => a - b)
    toWrite.sort((a, b) => a - b)
    fromWrite.sort((a, b) => a - b)
    ctx.log(
      `  e2e ${otlp === undefined ? "tracing off" : "tracing on "}: ${Math.round(blocksPerSecond).toLocaleString("en-US")} blocks/s peak; ` +
        `(publishers done in ${Math.round(sentIn)} ms` +
        `, ${deltas} deltas` +
        (cpuPerEvent === undefined ? "" : `, relay CPU ${Math.round(cpuPerEvent)} µs/event`) +
        (mainCpuPerEvent === undefined ? "" : ` (main thread ${Math.round(mainCpuPerEvent)})`) +
        "); " +
        `at ${Math.round(rate).toLocaleString("en-US")} blocks/s: ${latencies.length} probes, p50 ${percentile(latencies, 50).toFixed(2)} ms, p99 ${percentile(latencies, 99).toFixed(2)} ms, ${pending.size} unseen` +
        (pacedCpu === undefined ? "" : `, relay CPU ${Math.round(pacedCpu)} µs/event`) +
        (pacedMainCpu === undefined ? "" : ` (main thread ${Math.round(pacedMainCpu)})`) +
        `, bench CPU ${Math.round((benchCpu.user + benchCpu.system) / pacedEvents)} µs/event` +
        `; event-loop delay p99/max: relay ${relayLoop}, bench ${(benchLoop.percentile(99) / 1e6).toFixed(1)}/${(benchLoop.max / 1e6).toFixed(1)} ms` +
        `; relay publish delay ${publishDelayBetween(scrapeBefore.publishDelay, scrapeAfter.publishDelay)}` +
        `; probes split at the relay's write, p50/p99: before ${percentile(toWrite, 50).toFixed(1)}/${percentile(toWrite, 99).toFixed(1)} ms, after ${percentile(fromWrite, 50).toFixed(1)}/${percentile(fromWrite, 99).toFixed(1)} ms`
    )
    return {
      blocksPerSecond,
      cpuPerEvent,
      p50Ms: percentile(latencies, 50),
      p99Ms: percentile(latencies, 99)
    }
  } finally {
    subscriber?.close()
    await stopRelay(relay)
    await Promise.all(everyWorker.map((w) => w.socket.close()))
    rmSync(dir, { recursive: true, force: true })
  }
}

/** An OTLP/HTTP receiver that accepts and discards spans (the collector's cost is not ours). */
const startOtlpSink = (): Promise<{
  readonly url: string
  readonly close: () => void
  readonly requests: () => number
  /** Spans received by name, so a span per event or per message would show. */
  readonly spans: () => ReadonlyMap<string, number>
}> =>
  new Promise((resolve) => {
    let requests = 0
    const spans = new Map<string, number>()
    const server = createServer((req, res) => {
      requests++
      const chunks: Array<Buffer> = []
      req.on("data", (chunk: Buffer) => chunks.push(chunk))
      req.on("end", () => {
        try {
          const body = JSON.parse(Buffer.concat(chunks).toString("utf8")) as {
            resourceSpans?: ReadonlyArray<{
              scopeSpans?: ReadonlyArray<{ spans?: ReadonlyArray<{ name: string }> }>
            }>
          }
          for (const resource of body.resourceSpans ?? [])
            for (const scope of resource.scopeSpans ?? [])
              for (const span of scope.spans ?? []) spans.set(span.name, (spans.get(span.name) ?? 0) + 1)
        } catch {
          // Not JSON: counted as a request only.
        }
        res.writeHead(200, { "content-type": "application/json" })
        res.end("{}")
      })
    })
    server.listen(0, "127.0.0.1", () =>
      resolve({
        url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`,
        close: () => server.close(),
        requests: () => requests,
        spans: () => spans
      })
    )
  })

const spanSummary = (spans: ReadonlyMap<string, number>): string => {
  const top = [...spans].sort((a, b) => b[1] - a[1]).slice(0, 4)
  const total = [...spans.values()].reduce((a, b) => a + b, 0)
  return `${total} spans: ${top.map(([name, n]) => `${name} ${n}`).join(", ")}`
}

const median = (values: ReadonlyArray<number>): number => {
  const sorted = [...values].sort((a, b) => a - b)
  const mid = sorted.length >> 1
  return sorted.length % 2 === 1 ? sorted[mid]! : (sorted[mid - 1]! + sorted[mid]!) / 2
}

export const benchEndToEnd = async (ctx: BenchContext): Promise<void> => {
  // Tracing off and on alternate, so a slow spell of the (shared) machine hits both modes alike;
  // each figure is the median of its mode's rounds.
  const rounds = ctx.quick ? 2 : 3
  const off: Array<PhaseResult> = []
  const on: Array<PhaseResult> = []
  const sink = await startOtlpSink()
  // A burst can lag the pool stream (its subscriber queue overflows while the writer waits for
  // the socket): that is reported, and the phase runs again on a fresh relay, at most twice.
  let lagged = 0
  const phase = async (otlp: string | undefined): Promise<PhaseResult> => {
    for (let attempt = 0; ; attempt++) {
      try {
        return await runPhase(ctx, otlp)
      } catch (error) {
        if (attempt >= 2 || !(error instanceof Error) || !error.message.includes("SUBSCRIBER_LAGGED"))
          throw error
        lagged++
        ctx.log(
          `  e2e ${otlp === undefined ? "tracing off" : "tracing on "}: the pool stream lagged; running again`
        )
      }
    }
  }
  try {
    for (let round = 0; round < rounds; round++) {
      off.push(await phase(undefined))
      on.push(await phase(sink.url))
    }
  } finally {
    sink.close()
  }
  const offPeak = median(off.map((r) => r.blocksPerSecond))
  const onPeak = median(on.map((r) => r.blocksPerSecond))
  const offP99 = median(off.map((r) => r.p99Ms))
  const onP99 = median(on.map((r) => r.p99Ms))
  const offP50 = median(off.map((r) => r.p50Ms))
  const cpu = (results: ReadonlyArray<PhaseResult>): string => {
    const known = results.flatMap((r) => (r.cpuPerEvent === undefined ? [] : [r.cpuPerEvent]))
    return known.length === 0 ? "" : `, relay CPU ${Math.round(median(known))} µs/event`
  }
  // The relay addresses its pools canonically (PROTOCOL §3.3), so the in-process actor it is
  // measured against does too; the engine-hash actor is the fallback when only it ran.
  const canonicalActor = ctx.results.find((r) => r.name === "actor_canonical_admit_blocks")
  const actor = canonicalActor ?? ctx.results.find((r) => r.name === "actor_admit_blocks")
  record(
    ctx,
    "e2e_relay_blocks",
    "blocks/s",
    offPeak,
    actor?.value ?? null,
    `workers → relay process → HTTP subscriber, median of ${rounds}${cpu(off)}${lagged === 0 ? "" : `, ${lagged} lagged phases rerun`}; baseline = in-process ${canonicalActor === undefined ? "actor admit (engine-hash addressing)" : "canonical actor, live path"} (same run)`
  )
  const offCpu = off.flatMap((r) => (r.cpuPerEvent === undefined ? [] : [r.cpuPerEvent]))
  if (offCpu.length > 0) {
    // The canonical core's own cost per 8-block event, from the actor suite's baseline (blocks/s).
    const coreUs =
      canonicalActor?.baseline === undefined || canonicalActor.baseline === null
        ? null
        : (BLOCKS * 1e6) / canonicalActor.baseline
    record(
      ctx,
      "e2e_relay_cpu_per_event",
      "µs/event",
      median(offCpu),
      coreUs,
      `relay process CPU (every thread) per ${BLOCKS}-block event in the peak burst, tracing off, median of ${rounds}; baseline = the canonical core alone in process; issue target ≤ 10 µs`
    )
  }
  record(
    ctx,
    "e2e_relay_blocks_tracing_on",
    "blocks/s",
    onPeak,
    offPeak,
    `OTLP export on (${sink.requests()} export requests, ${spanSummary(sink.spans())}), median of ${rounds}${cpu(on)}; target ratio ≥ 0.9`
  )
  record(
    ctx,
    "e2e_event_to_wire_p99",
    "ms",
    offP99,
    offP50,
    `at half of peak, tracing off, median of ${rounds}; baseline = p50`
  )
  record(
    ctx,
    "e2e_event_to_wire_p99_tracing_on",
    "ms",
    onP99,
    offP99,
    `at half of peak, tracing on, median of ${rounds}; baseline = p99 tracing off`
  )
}

/** Fake engines' metrics pages for the e2e relay: one URL per source, vLLM's gauges for rank 0. */
const startMetricsPages = (): Promise<{
  readonly url: (index: number) => string
  readonly reads: () => number
  readonly close: () => void
}> =>
  new Promise((resolve) => {
    let reads = 0
    const page = (index: number) =>
      [
        "# HELP vllm:num_requests_running Number of requests in model execution batches.",
        "# TYPE vllm:num_requests_running gauge",
        `vllm:num_requests_running{engine="0",model_name="bench-model"} ${index % 5}.0`,
        "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.",
        "# TYPE vllm:num_requests_waiting gauge",
        `vllm:num_requests_waiting{engine="0",model_name="bench-model"} ${index % 3}.0`,
        "# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.",
        "# TYPE vllm:kv_cache_usage_perc gauge",
        'vllm:kv_cache_usage_perc{engine="0",model_name="bench-model"} 0.5',
        ""
      ].join("\n")
    const server = createServer((req, res) => {
      reads++
      const index = Number((req.url ?? "").split("/").pop())
      res.writeHead(200, { "content-type": "text/plain; version=0.0.4" })
      res.end(page(Number.isFinite(index) ? index : 0))
    })
    server.listen(0, "127.0.0.1", () => {
      const port = (server.address() as AddressInfo).port
      resolve({
        url: (index) => `http://127.0.0.1:${port}/metrics/${index}`,
        reads: () => reads,
        close: () => server.close()
      })
    })
  })

/**
 * `e2e_relay_blocks_engine_metrics`: the e2e peak with 64 sources (4 sending, 60 idle) whose
 * engine metrics the relay reads every second, against the same 64 sources without `metricsUrl`;
 * alternating rounds, median of each. Reads run beside ingest, so the target is ≥ 0.95×.
 */
export const benchEndToEndEngineMetrics = async (ctx: BenchContext): Promise<void> => {
  const rounds = 3
  const pages = await startMetricsPages()
  const off: Array<number> = []
  const on: Array<number> = []
  const offCpu: Array<number> = []
  const onCpu: Array<number> = []
  try {
    for (let round = 0; round < rounds; round++) {
      const plain = await runPhase(ctx, undefined, { idleSources: 60 })
      const before = pages.reads()
      const read = await runPhase(ctx, undefined, { idleSources: 60, metricsUrl: pages.url })
      off.push(plain.blocksPerSecond)
      on.push(read.blocksPerSecond)
      if (plain.cpuPerEvent !== undefined) offCpu.push(plain.cpuPerEvent)
      if (read.cpuPerEvent !== undefined) onCpu.push(read.cpuPerEvent)
      ctx.log(
        `  round ${round + 1}: metrics off ${Math.round(plain.blocksPerSecond)} blocks/s (${plain.cpuPerEvent?.toFixed(1) ?? "?"} µs relay CPU/event), on ${Math.round(read.blocksPerSecond)} blocks/s (${read.cpuPerEvent?.toFixed(1) ?? "?"} µs) (${pages.reads() - before} metrics reads)`
      )
    }
  } finally {
    pages.close()
  }
  record(
    ctx,
    "e2e_relay_blocks_engine_metrics",
    "blocks/s",
    median(on),
    median(off),
    `64 sources (4 sending, 60 idle) each with a metricsUrl read every second, vs the same sources without; median of ${rounds} alternating rounds; target >= 0.95x; relay CPU per event ${offCpu.length === 0 ? "?" : median(onCpu).toFixed(1)} µs on vs ${offCpu.length === 0 ? "?" : median(offCpu).toFixed(1)} µs off`
  )
}
