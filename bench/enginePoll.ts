/**
 * `engine_metrics_poll_1000`: the relay's engine-metrics poller (`load/EngineMetrics.make`, its
 * default 16 readers and 1 s interval) over 1,000 source ranks, each on a metrics URL of its own,
 * against a bare client: 16 workers that `fetch` and read the same URLs once a second and do
 * nothing else. The pages are served by a child process, so this process's CPU (all threads) is
 * the client's alone. Reported: CPU per read, and how many of the 1,000 URLs each side read per
 * second (all of them when it keeps up).
 */

import { spawn } from "node:child_process"
import * as NodeHttpClient from "@effect/platform-node/NodeHttpClient"
import { Effect, Exit, Layer, Scope } from "effect"
import * as EngineMetrics from "../src/load/EngineMetrics.js"
import { type BenchContext, record } from "./harness.js"
import { median } from "./overlapHttp.js"

const SOURCES = 1000
const READERS = 16

/** The page server: `/metrics/N` is rank 0's vLLM page; `/count` says how many pages it served. */
const SERVER = `
const http = require("node:http")
let served = 0
const page = (i) => [
  "# TYPE vllm:num_requests_running gauge",
  'vllm:num_requests_running{engine="0",model_name="bench-model"} ' + (i % 5) + ".0",
  "# TYPE vllm:num_requests_waiting gauge",
  'vllm:num_requests_waiting{engine="0",model_name="bench-model"} ' + (i % 3) + ".0",
  "# TYPE vllm:kv_cache_usage_perc gauge",
  'vllm:kv_cache_usage_perc{engine="0",model_name="bench-model"} 0.5',
  ""
].join("\\n")
const server = http.createServer((req, res) => {
  if (req.url === "/count") return res.end(String(served))
  served++
  const body = page(Number(req.url.split("/").pop()) || 0)
  res.writeHead(200, { "content-type": "text/plain; version=0.0.4", "content-length": Buffer.byteLength(body) })
  res.end(body)
})
server.keepAliveTimeout = 60000
server.listen(0, "127.0.0.1", () => process.stdout.write(String(server.address().port) + "\\n"))
process.stdin.on("end", () => process.exit(0))
process.stdin.resume()
`

interface PageServer {
  readonly url: (index: number) => string
  readonly served: () => Promise<number>
  readonly close: () => void
}

const startPageServer = (): Promise<PageServer> =>
  new Promise((resolve, reject) => {
    const child = spawn(process.execPath, ["-e", SERVER], { stdio: ["pipe", "pipe", "inherit"] })
    child.on("error", reject)
    child.stdout.setEncoding("utf8")
    child.stdout.once("data", (line: string) => {
      const base = `http://127.0.0.1:${Number.parseInt(line, 10)}`
      resolve({
        url: (index) => `${base}/metrics/${index}`,
        served: async () => Number(await (await fetch(`${base}/count`)).text()),
        close: () => child.stdin.end()
      })
    })
  })

const pause = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms))

interface Measured {
  readonly cpuPerReadUs: number
  readonly readsPerSecond: number
}

/** CPU per read and reads per second over `seconds`, after `warmSeconds` of running. */
const measure = async (server: PageServer, warmSeconds: number, seconds: number): Promise<Measured> => {
  await pause(warmSeconds * 1000)
  const servedBefore = await server.served()
  const cpuBefore = process.cpuUsage()
  const started = performance.now()
  await pause(seconds * 1000)
  const cpu = process.cpuUsage(cpuBefore)
  const elapsed = (performance.now() - started) / 1000
  const reads = (await server.served()) - servedBefore
  return { cpuPerReadUs: (cpu.user + cpu.system) / Math.max(1, reads), readsPerSecond: reads / elapsed }
}

/** The relay's poller over every URL, for the length of `measure`. */
const pollerRound = async (server: PageServer, warm: number, seconds: number): Promise<Measured> => {
  const sources = Array.from({ length: SOURCES }, (_, i) => ({ metricsUrl: server.url(i), dpRank: 0 }))
  const scope = Effect.runSync(Scope.make())
  try {
    const client = await Effect.runPromise(Layer.buildWithScope(NodeHttpClient.layerUndici, scope))
    await Effect.runPromise(
      EngineMetrics.make(Effect.succeed(sources), { concurrency: READERS }).pipe(
        Effect.provide(client),
        Scope.extend(scope)
      )
    )
    return await measure(server, warm, seconds)
  } finally {
    await Effect.runPromise(Scope.close(scope, Exit.void))
  }
}

/** A bare client: every second each URL not being read is queued; at most 16 reads at once. */
const bareRound = async (server: PageServer, warm: number, seconds: number): Promise<Measured> => {
  const due: Array<number> = []
  const inFlight = new Set<number>()
  let active = 0
  const pump = (): void => {
    while (active < READERS && due.length > 0) {
      const index = due.shift()!
      active++
      fetch(server.url(index), { signal: AbortSignal.timeout(1000) })
        .then((response) => response.text())
        .catch(() => "")
        .finally(() => {
          active--
          inFlight.delete(index)
          pump()
        })
    }
  }
  const tick = setInterval(() => {
    for (let i = 0; i < SOURCES; i++) {
      if (inFlight.has(i)) continue
      inFlight.add(i)
      due.push(i)
    }
    pump()
  }, 1000)
  try {
    return await measure(server, warm, seconds)
  } finally {
    clearInterval(tick)
    due.length = 0
    while (active > 0) await pause(10)
  }
}

export const benchEnginePoll = async (ctx: BenchContext): Promise<void> => {
  const rounds = ctx.quick ? 1 : 3
  const [warm, seconds] = ctx.quick ? [2, 3] : [2, 5]
  const server = await startPageServer()
  const poller: Array<Measured> = []
  const bare: Array<Measured> = []
  try {
    for (let round = 0; round < rounds; round++) {
      // Alternating which goes first, so neither always meets the same spell of the machine.
      let ours: Measured
      let theirs: Measured
      if (round % 2 === 0) {
        ours = await pollerRound(server, warm, seconds)
        theirs = await bareRound(server, warm, seconds)
      } else {
        theirs = await bareRound(server, warm, seconds)
        ours = await pollerRound(server, warm, seconds)
      }
      poller.push(ours)
      bare.push(theirs)
      ctx.log(
        `  round ${round + 1}: poller ${ours.cpuPerReadUs.toFixed(0)} µs CPU/read, ${ours.readsPerSecond.toFixed(0)} reads/s; bare client ${theirs.cpuPerReadUs.toFixed(0)} µs, ${theirs.readsPerSecond.toFixed(0)} reads/s`
      )
    }
  } finally {
    server.close()
  }
  const cpu = median(poller.map((m) => m.cpuPerReadUs))
  record(
    ctx,
    "engine_metrics_poll_1000",
    "µs CPU/read",
    cpu,
    median(bare.map((m) => m.cpuPerReadUs)),
    `${SOURCES} sources on their own URLs, ${READERS} readers, read every second; the poller read ${median(poller.map((m) => m.readsPerSecond)).toFixed(0)} of them per second (bare client ${median(bare.map((m) => m.readsPerSecond)).toFixed(0)}); ratio = bare CPU per read / the poller's; median of ${rounds} alternating rounds`,
    true
  )
}
