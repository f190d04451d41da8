/**
 * `soak_memory`: the demo's workload as separate processes for N minutes (`--soak-minutes`,
 * default 10), and each part's heap after a forced collection at minute 2 and at the end.
 *
 * The parts are those `kvrelay demo` runs in one process, so that each is measured alone: per
 * DC (`dc-east`, `dc-west`) a `kvrelay simulate` of 4 workers at the demo's rates (a request
 * every 20 ms per worker, 640-block caches) registering in etcd under the DC's prefix, and a
 * `kvrelay relay` following that prefix; and one `kvrelay global` over both relays. Every 2 s
 * the bench reads each relay's stats and asks the global consumer the simulators' sample queries,
 * as the demo's summary does. Each process runs with `--expose-gc` and the bench's heap probe
 * preloaded (`heapProbe.ts`): SIGUSR2 collects and reports `process.memoryUsage()`.
 *
 * Figures: each part's heap used (summed over its processes) at the end against minute 2, as a
 * ratio; the target is ≤ 1.1. It needs an `etcd` binary and runs only when named in `--only`.
 */

import { type ChildProcess, spawn } from "node:child_process"
import { accessSync, constants, existsSync, mkdtempSync, readFileSync, rmSync } from "node:fs"
import { createServer } from "node:net"
import { tmpdir } from "node:os"
import { delimiter, dirname, join } from "node:path"
import { fileURLToPath, pathToFileURL } from "node:url"
import { type BenchContext, record } from "./harness.js"

const DCS = ["dc-east", "dc-west"] as const
const WORKERS_PER_DC = 4
/** The demo's `CACHE_BLOCKS` and `REQUEST_INTERVAL_MS` (20 ms: 50 requests a second). */
const CACHE_BLOCKS = 640
const REQUESTS_PER_SECOND = 50
const FIRST_PROBE_MINUTES = 2
const LOAD_INTERVAL_MS = 2_000
const MIB = 1024 * 1024

const repoRoot = (): string => {
  const here = dirname(fileURLToPath(import.meta.url))
  return here.endsWith(join("dist", "bench")) ? join(here, "..", "..") : join(here, "..")
}

/** The probe next to this module (`dist/bench/heapProbe.js` in a build). */
const probeModule = (): string => {
  const here = dirname(fileURLToPath(import.meta.url))
  const built = join(here, "heapProbe.js")
  if (!existsSync(built)) throw new Error(`soak_memory: no heap probe at ${built} (run npm run build)`)
  return pathToFileURL(built).href
}

const findEtcd = (): string | undefined => {
  for (const candidate of [
    "/usr/bin/etcd",
    ...(process.env.PATH ?? "").split(delimiter).map((d) => join(d, "etcd"))
  ]) {
    try {
      accessSync(candidate, constants.X_OK)
      return candidate
    } catch {
      // not this one
    }
  }
  return undefined
}

const freePort = (): Promise<number> =>
  new Promise((resolve, reject) => {
    const server = createServer()
    server.once("error", reject)
    server.listen(0, "127.0.0.1", () => {
      const address = server.address()
      const port = typeof address === "object" && address !== null ? address.port : 0
      server.close(() => resolve(port))
    })
  })

const sleep = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms))

/** Polls `probe` every 100 ms until it gives a value, failing with `what` after `timeoutMs`. */
const waitFor = async <A>(what: string, probe: () => A | undefined, timeoutMs: number): Promise<A> => {
  const deadline = Date.now() + timeoutMs
  for (;;) {
    const value = probe()
    if (value !== undefined) return value
    if (Date.now() > deadline) throw new Error(`soak_memory: timed out waiting for ${what}`)
    await sleep(100)
  }
}

/** Keeps the last `max` characters of a stream. */
class Tail {
  text = ""
  constructor(private readonly max = 64 * 1024) {}
  add(chunk: Buffer): void {
    this.text += chunk.toString()
    if (this.text.length > this.max) this.text = this.text.slice(this.text.length - this.max)
  }
}

interface HeapProbe {
  readonly probe: number
  readonly collected: boolean
  readonly heapUsed: number
  readonly arrayBuffers: number
  readonly rss: number
}

type PartKind = "relay" | "global" | "simulate"

interface Part {
  readonly name: string
  readonly kind: PartKind
  readonly child: ChildProcess
  readonly stdout: Tail
  readonly stderr: Tail
  readonly probeFile: string
}

const stop = (child: ChildProcess): Promise<void> =>
  new Promise((resolve) => {
    if (child.exitCode !== null || child.signalCode !== null) return resolve()
    const kill = setTimeout(() => child.kill("SIGKILL"), 10_000)
    child.once("exit", () => {
      clearTimeout(kill)
      resolve()
    })
    child.kill("SIGTERM")
  })

export const benchSoakMemory = async (ctx: BenchContext): Promise<void> => {
  const minutes = ctx.soakMinutes ?? 10
  const firstProbeMs = Math.min(FIRST_PROBE_MINUTES, minutes / 2) * 60_000
  const etcdBinary = findEtcd()
  if (etcdBinary === undefined)
    throw new Error("soak_memory needs an etcd binary (/usr/bin/etcd or on PATH; Debian: etcd-server)")
  // KVRELAY_BENCH_SOAK_ENTRY runs another build of the CLI (the same workload on other code).
  const entry = process.env["KVRELAY_BENCH_SOAK_ENTRY"] ?? join(repoRoot(), "bin", "kvrelay.js")
  const probe = probeModule()
  const dir = mkdtempSync(join(tmpdir(), "kvrelay-soak-"))
  const children: Array<ChildProcess> = []
  const killAll = () => {
    for (const child of children) if (child.exitCode === null) child.kill("SIGKILL")
  }
  // An interrupted bench must not leave its processes running.
  process.once("exit", killAll)
  const parts: Array<Part> = []
  let load: NodeJS.Timeout | undefined
  try {
    const clientPort = await freePort()
    const peerPort = await freePort()
    const etcdUrl = `http://127.0.0.1:${clientPort}`
    const peer = `http://127.0.0.1:${peerPort}`
    const etcdErr = new Tail()
    const etcd = spawn(
      etcdBinary,
      [
        "--name=kvrelay-soak",
        `--data-dir=${join(dir, "etcd")}`,
        `--listen-client-urls=${etcdUrl}`,
        `--advertise-client-urls=${etcdUrl}`,
        `--listen-peer-urls=${peer}`,
        `--initial-advertise-peer-urls=${peer}`,
        `--initial-cluster=kvrelay-soak=${peer}`,
        "--log-level=error",
        "--logger=zap"
      ],
      { stdio: ["ignore", "ignore", "pipe"] }
    )
    children.push(etcd)
    etcd.stderr!.on("data", (chunk: Buffer) => etcdErr.add(chunk))
    let etcdHealthy = false
    const etcdDeadline = Date.now() + 20_000
    while (!etcdHealthy) {
      if (etcd.exitCode !== null) throw new Error(`etcd exited with ${etcd.exitCode}: ${etcdErr.text}`)
      if (Date.now() > etcdDeadline) throw new Error(`etcd did not become healthy: ${etcdErr.text}`)
      try {
        const response = await fetch(`${etcdUrl}/health`)
        etcdHealthy = response.ok && (await response.text()).includes("true")
      } catch {
        // not listening yet
      }
      if (!etcdHealthy) await sleep(100)
    }

    const start = (name: string, kind: PartKind, args: ReadonlyArray<string>): Part => {
      const probeFile = join(dir, `${name}.heap.jsonl`)
      const child = spawn(process.execPath, ["--expose-gc", "--import", probe, entry, ...args], {
        env: { ...process.env, KVRELAY_HEAP_PROBE_FILE: probeFile },
        stdio: ["ignore", "pipe", "pipe"]
      })
      children.push(child)
      const part: Part = { name, kind, child, stdout: new Tail(), stderr: new Tail(), probeFile }
      child.stdout!.on("data", (chunk: Buffer) => part.stdout.add(chunk))
      child.stderr!.on("data", (chunk: Buffer) => part.stderr.add(chunk))
      parts.push(part)
      return part
    }
    const alive = () => {
      for (const part of parts) {
        if (part.child.exitCode !== null || part.child.signalCode !== null)
          throw new Error(
            `soak_memory: ${part.name} exited (${part.child.exitCode ?? part.child.signalCode}): ${part.stderr.text}`
          )
      }
    }
    const lineOf = (part: Part, event: string) => {
      alive()
      return part.stdout.text.split("\n").find((line) => line.includes(`"event":"${event}"`))
    }
    const listeningUrl = (part: Part) =>
      waitFor(
        `${part.name} to listen`,
        () => {
          const line = lineOf(part, "listening")
          return line === undefined ? undefined : (JSON.parse(line) as { url: string }).url
        },
        60_000
      )

    const simulators = DCS.map((dc, d) =>
      start(`simulate ${dc}`, "simulate", [
        "simulate",
        "--etcd",
        etcdUrl,
        "--etcd-prefix",
        `/kvrelay-soak/${dc}`,
        "--workers",
        String(WORKERS_PER_DC),
        "--worker-id-base",
        String(7000 + 100 * d),
        "--cache-blocks",
        String(CACHE_BLOCKS),
        "--requests-per-second",
        String(REQUESTS_PER_SECOND),
        "--log-level",
        "warning"
      ])
    )
    const queries = await Promise.all(
      simulators.map((part) =>
        waitFor(
          `${part.name} to start`,
          () => {
            const line = lineOf(part, "simulating")
            return line === undefined ? undefined : (JSON.parse(line) as { query: unknown }).query
          },
          60_000
        )
      )
    )
    const relays = DCS.map((dc) =>
      start(`relay ${dc}`, "relay", [
        "relay",
        "--dc-id",
        dc,
        "--discovery",
        `etcd:${etcdUrl}`,
        "--etcd-prefix",
        `/kvrelay-soak/${dc}`,
        "--http",
        "127.0.0.1:0",
        "--expected-unique-blocks",
        "65536",
        "--publication-delay-ms",
        "5",
        "--log-level",
        "warning"
      ])
    )
    const relayUrls = await Promise.all(relays.map(listeningUrl))
    const global = start("global", "global", [
      "global",
      ...DCS.flatMap((dc, d) => ["--relay", `${dc}=${relayUrls[d]}`]),
      "--http",
      "127.0.0.1:0",
      "--log-level",
      "warning"
    ])
    const globalUrl = await listeningUrl(global)
    const started = Date.now()
    ctx.log(
      `soak_memory: ${minutes} min of ${DCS.length} DCs × ${WORKERS_PER_DC} workers (simulate, relay per DC; one global), heap probed at ${(firstProbeMs / 60_000).toFixed(1)} min and at the end`
    )

    // What the demo's summary does every 2 s: each relay's stats, the global's sample answers.
    let loadErrors = 0
    let overlapAnswers = 0
    const readEvents = async (): Promise<Map<string, number>> => {
      const out = new Map<string, number>()
      await Promise.all(
        relays.map(async (relay, d) => {
          const stats = (await (await fetch(`${relayUrls[d]}/v1/stats`)).json()) as {
            endpoints: ReadonlyArray<{ ingest: { events: number } }>
          }
          out.set(
            relay.name,
            stats.endpoints.reduce((n, e) => n + e.ingest.events, 0)
          )
        })
      )
      return out
    }
    const loadRound = async () => {
      try {
        await readEvents()
        for (const query of queries) {
          const answer = await fetch(`${globalUrl}/v1/overlap`, {
            method: "POST",
            body: JSON.stringify(query)
          })
          await answer.text()
          if (answer.ok) overlapAnswers++
          else loadErrors++
        }
      } catch {
        loadErrors++
      }
    }
    load = setInterval(() => void loadRound(), LOAD_INTERVAL_MS)

    const probeAll = async (): Promise<Map<Part, HeapProbe>> => {
      alive()
      const seen = new Map(parts.map((part) => [part, probesOf(part).length]))
      for (const part of parts) part.child.kill("SIGUSR2")
      const out = new Map<Part, HeapProbe>()
      for (const part of parts) {
        out.set(
          part,
          await waitFor(
            `${part.name}'s heap probe`,
            () => {
              const probes = probesOf(part)
              return probes.length > seen.get(part)! ? probes[probes.length - 1] : undefined
            },
            60_000
          )
        )
      }
      return out
    }
    const eventRate = async (at: Map<string, number>, since: number) => {
      const now = await readEvents()
      const seconds = (Date.now() - since) / 1000
      return [...now]
        .map(([name, n]) => `${name} ${Math.round((n - (at.get(name) ?? 0)) / seconds)}/s`)
        .join(", ")
    }
    const describe = (probes: Map<Part, HeapProbe>) =>
      parts.map((part) => `${part.name} ${(probes.get(part)!.heapUsed / MIB).toFixed(1)}`).join(", ")

    await sleep(Math.max(0, started + firstProbeMs - Date.now()))
    const first = await probeAll()
    const eventsAtFirst = await readEvents()
    const firstAt = Date.now()
    ctx.log(
      `  heap used after GC (MiB) at ${((firstAt - started) / 60_000).toFixed(1)} min: ${describe(first)}`
    )
    for (let minute = Math.floor(firstProbeMs / 60_000) + 1; minute < minutes; minute++) {
      await sleep(Math.max(0, started + minute * 60_000 - Date.now()))
      ctx.log(`  at ${minute} min: ${describe(await probeAll())}`)
    }
    await sleep(Math.max(0, started + minutes * 60_000 - Date.now()))
    const last = await probeAll()
    ctx.log(`  at ${((Date.now() - started) / 60_000).toFixed(1)} min: ${describe(last)}`)
    ctx.log(
      `  relay events since the first probe: ${await eventRate(eventsAtFirst, firstAt)}; ` +
        `global overlap answers ${overlapAnswers}, failed load requests ${loadErrors}`
    )
    if (![...first.values()].every((p) => p.collected))
      ctx.log("  (no forced collection: node without --expose-gc in the measured processes)")
    for (const kind of ["relay", "global", "simulate"] as const) {
      const of = parts.filter((part) => part.kind === kind)
      const sum = (probes: Map<Part, HeapProbe>) => of.reduce((n, part) => n + probes.get(part)!.heapUsed, 0)
      record(
        ctx,
        `soak_memory_${kind}_heap`,
        "MiB",
        sum(last) / MIB,
        sum(first) / MIB,
        `${of.length} process${of.length > 1 ? "es" : ""}, heap used after GC, end against minute ${(firstProbeMs / 60_000).toFixed(1)}; target ratio ≤ 1.1`
      )
    }
  } finally {
    if (load !== undefined) clearInterval(load)
    // Workers first (their leases go), then the global consumer and relays, etcd last.
    const order: ReadonlyArray<PartKind> = ["simulate", "global", "relay"]
    for (const kind of order)
      await Promise.all(parts.filter((p) => p.kind === kind).map((p) => stop(p.child)))
    await Promise.all(children.map(stop))
    process.removeListener("exit", killAll)
    rmSync(dir, { recursive: true, force: true })
  }
}

const probesOf = (part: Part): Array<HeapProbe> => {
  if (!existsSync(part.probeFile)) return []
  return readFileSync(part.probeFile, "utf8")
    .split("\n")
    .filter((line) => line.length > 0)
    .map((line) => JSON.parse(line) as HeapProbe)
}
