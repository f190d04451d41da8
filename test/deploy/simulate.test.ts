/**
 * `kvrelay simulate --discovery-file` and a relay on `file:` discovery, as processes: the
 * simulator keeps a valid document of its workers, the relay indexes their blocks, and stopping
 * the simulator empties the document so the relay withdraws the pool.
 *
 * The compose file's data path, as processes: a real etcd, `kvrelay simulate` registering its
 * workers there, `kvrelay relay` on etcd discovery and `kvrelay global` over the relay. The
 * simulator starts first with a small cache, so by the time the relay arrives the workers have
 * evicted blocks and the relay must rebuild them from replays and tree dumps: every rank ends up
 * live, with blocks, and no block lacks its parent. The simulator's own sample query (token ids
 * of a popular system prompt) must find its prefix, and stopping the simulator must withdraw the
 * pool (its leases are revoked). Skipped without an etcd binary.
 */

import { readdirSync, readFileSync } from "node:fs"
import { join } from "node:path"
import { describe, expect, it } from "@effect/vitest"
import { Effect, Either } from "effect"
import { decodeDiscoveryDocument } from "../../src/discovery/FileDiscovery.js"
import {
  cleanup,
  eventually,
  type KvrelayProcess,
  spawnKvrelay,
  tempDir
} from "../e2e/relayProcessHarness.js"
import { etcdServer, skipEtcd, skipped } from "../integration/etcdHelpers.js"

const PREFIX = "/kvrelay/dc-a"

/** The URL of a server's `{"event":"listening"}` line. */
const listening = (proc: KvrelayProcess) =>
  eventually(
    "the listening line",
    () => {
      const line = proc.stdout.split("\n").find((l) => l.includes('"listening"'))
      if (proc.exit !== undefined) throw new Error(`exited ${JSON.stringify(proc.exit)}: ${proc.stderr}`)
      return line === undefined ? undefined : (JSON.parse(line) as { url: string }).url
    },
    60_000
  )

const json = async <A>(url: string, body?: unknown): Promise<A> => {
  const response = await fetch(url, body === undefined ? {} : { method: "POST", body: JSON.stringify(body) })
  return (await response.json()) as A
}

interface Stats {
  endpoints: Array<{
    aggregation?: { members: Array<{ blocks: number }>; parentNotFound?: number }
    recovery?: { sources: Array<{ state: string }> }
  }>
}

describe("kvrelay simulate on a discovery file", () => {
  it.live(
    "the simulator writes a document of its workers, a relay on file: indexes their blocks; SIGTERM empties it",
    () =>
      Effect.gen(function* () {
        const procs: Array<KvrelayProcess> = []
        yield* Effect.addFinalizer(() =>
          Effect.promise(() => Promise.all(procs.map((p) => p.kill()))).pipe(
            Effect.zipRight(Effect.sync(cleanup))
          )
        )
        const dir = tempDir()
        const path = join(dir, "discovery.json")
        const simulate = spawnKvrelay([
          "simulate",
          "--discovery-file",
          path,
          "--workers",
          "4",
          "--cache-blocks",
          "256",
          "--log-level",
          "warning"
        ])
        procs.push(simulate)
        yield* Effect.promise(() =>
          eventually(
            "the simulator running",
            () => {
              if (simulate.exit !== undefined)
                throw new Error(`exited ${JSON.stringify(simulate.exit)}: ${simulate.stderr}`)
              return simulate.stdout.includes('"simulating"')
            },
            60_000
          )
        )
        // Once every worker is up, the document holds each one's card and source, as the file
        // backend decodes it, and no temporary file is left beside it.
        const document = Either.getOrThrow(decodeDiscoveryDocument(readFileSync(path, "utf8")))
        expect(document.cards.map((c) => c.instanceId).sort()).toEqual(["7000", "7001", "7002", "7003"])
        expect(document.sources.map((s) => s.transport.kind).sort()).toEqual([
          "dynamo-zmq",
          "dynamo-zmq",
          "engine-zmq",
          "engine-zmq"
        ])
        expect(readdirSync(dir)).toEqual(["discovery.json"])

        const relay = spawnKvrelay([
          "relay",
          "--dc-id",
          "dc-file",
          "--discovery",
          `file:${path}`,
          "--http",
          "127.0.0.1:0",
          "--log-level",
          "error"
        ])
        procs.push(relay)
        const relayUrl = yield* Effect.promise(() => listening(relay))
        const endpoint = yield* Effect.promise(() =>
          eventually(
            "four members with blocks",
            async () => {
              const found = (await json<Stats>(`${relayUrl}/v1/stats`)).endpoints[0]
              const members = found?.aggregation?.members ?? []
              return members.length === 4 && members.every((m) => m.blocks > 0) ? found : undefined
            },
            60_000
          )
        )
        expect(endpoint.aggregation?.parentNotFound ?? 0, relay.stderr).toBe(0)

        simulate.signal("SIGTERM")
        expect(yield* Effect.promise(() => simulate.waitExit(60_000)), simulate.stderr).toEqual({
          code: 0,
          signal: null
        })
        const emptied = Either.getOrThrow(decodeDiscoveryDocument(readFileSync(path, "utf8")))
        expect([emptied.cards.length, emptied.sources.length]).toEqual([0, 0])
        yield* Effect.promise(() =>
          eventually(
            "the pool withdrawn",
            async () => (await json<{ pools: Array<unknown> }>(`${relayUrl}/v1/catalog`)).pools.length === 0,
            30_000
          )
        )
      }).pipe(Effect.scoped),
    180_000
  )
})

describe("kvrelay simulate on etcd", () => {
  it.live.skipIf(skipEtcd)(
    `workers register, a relay follows them, the global answers their token query; SIGTERM withdraws them${skipped}`,
    () =>
      Effect.gen(function* () {
        const etcd = yield* etcdServer
        const procs: Array<KvrelayProcess> = []
        yield* Effect.addFinalizer(() => Effect.promise(() => Promise.all(procs.map((p) => p.kill()))))
        const simulate = spawnKvrelay([
          "simulate",
          "--etcd",
          etcd.url,
          "--etcd-prefix",
          PREFIX,
          "--workers",
          "4",
          "--cache-blocks",
          "48",
          "--requests-per-second",
          "50",
          "--log-level",
          "info"
        ])
        procs.push(simulate)
        // The relay starts once every worker has filled its 48 blocks and evicts, so it meets
        // workers whose first blocks are long gone.
        yield* Effect.promise(() =>
          eventually(
            "every simulated worker evicting",
            () => simulate.stderr.match(/message="simulated worker's cache is full/g)?.length === 4,
            60_000
          )
        )
        const relay = spawnKvrelay([
          "relay",
          "--dc-id",
          "dc-a",
          "--discovery",
          `etcd:${etcd.url}`,
          "--etcd-prefix",
          PREFIX,
          "--http",
          "127.0.0.1:0",
          "--log-level",
          "error"
        ])
        procs.push(relay)
        const relayUrl = yield* Effect.promise(() => listening(relay))
        const global = spawnKvrelay([
          "global",
          "--relay",
          `dc-a=${relayUrl}`,
          "--http",
          "127.0.0.1:0",
          "--log-level",
          "error"
        ])
        procs.push(global)
        const globalUrl = yield* Effect.promise(() => listening(global))

        const query = yield* Effect.promise(() =>
          eventually(
            "the simulator's sample query",
            () => {
              const line = simulate.stdout.split("\n").find((l) => l.includes('"simulating"'))
              return line === undefined
                ? undefined
                : (JSON.parse(line) as { query: { tokens: Array<number> } }).query
            },
            60_000
          )
        )
        // Every worker is a live member with blocks: both wire formats arrive and recover.
        const settled = yield* Effect.promise(() =>
          eventually(
            "four live members with blocks",
            async () => {
              const endpoint = (await json<Stats>(`${relayUrl}/v1/stats`)).endpoints[0]
              const members = endpoint?.aggregation?.members ?? []
              const sources = endpoint?.recovery?.sources ?? []
              const live =
                members.length === 4 &&
                members.every((m) => m.blocks > 0) &&
                sources.length === 4 &&
                sources.every((s) => s.state === "live")
              return live ? endpoint : undefined
            },
            60_000
          )
        )
        expect(settled.aggregation?.parentNotFound ?? 0, relay.stderr).toBe(0)
        expect(relay.stderr).not.toMatch(/level=ERROR/)
        // The sample query is 4 full blocks of the most popular system prompt.
        const depth = yield* Effect.promise(() =>
          eventually(
            "the sample query's prefix",
            async () => {
              const answer = await json<{ results?: Array<{ prefixDepth: number }> }>(
                `${globalUrl}/v1/overlap`,
                query
              )
              return answer.results?.[0]?.prefixDepth === 4 ? 4 : undefined
            },
            60_000
          )
        )
        expect(depth).toBe(4)

        // The Grafana dashboard plots series these processes really export. Lane faults have no
        // series until a lane faults; compose.test.ts checks that family in the source.
        const exported = new Set<string>()
        for (const url of [relayUrl, globalUrl]) {
          const text = yield* Effect.promise(() => fetch(`${url}/metrics`).then((r) => r.text()))
          for (const line of text.split("\n"))
            if (line !== "" && !line.startsWith("#")) exported.add(line.split(/[{ ]/, 1)[0]!)
        }
        const dashboard = readFileSync(
          join(import.meta.dirname, "../../otel/grafana/dashboards/kvrelay.json"),
          "utf8"
        )
        const plotted = new Set(
          [...dashboard.matchAll(/\b((?:kv_dc_relay|kvrelay|nodejs|process)_[a-z0-9_]+)/g)].map((m) => m[1]!)
        )
        plotted.delete("kvrelay_global_lane_faults_total")
        expect(plotted.size).toBeGreaterThan(15)
        for (const name of plotted) expect(exported.has(name), `${name} is on /metrics`).toBe(true)

        simulate.signal("SIGTERM")
        const exit = yield* Effect.promise(() => simulate.waitExit(60_000))
        expect(exit, simulate.stderr).toEqual({ code: 0, signal: null })
        yield* Effect.promise(() =>
          eventually(
            "the pool withdrawn",
            async () => (await json<{ pools: Array<unknown> }>(`${relayUrl}/v1/catalog`)).pools.length === 0,
            30_000
          )
        )
      }).pipe(Effect.scoped),
    240_000
  )
})
