/**
 * The compose file's data path, as processes: a real etcd, `kvrelay simulate` registering its
 * workers there, `kvrelay relay` on etcd discovery and `kvrelay global` over the relay. The
 * simulator's own sample query (token ids of a popular system prompt) must find its prefix in the
 * relay's pool, and stopping the simulator must withdraw the pool (its leases are revoked).
 * Skipped without an etcd binary.
 */

import { describe, expect, it } from "@effect/vitest"
import { Effect } from "effect"
import { eventually, type KvrelayProcess, spawnKvrelay } from "../e2e/relayProcessHarness.js"
import { etcdBinary, etcdServer, skipped } from "../integration/etcdHelpers.js"

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

describe("kvrelay simulate on etcd", () => {
  it.live.skipIf(etcdBinary === undefined)(
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
          "--log-level",
          "warning"
        ])
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
        procs.push(simulate, relay)
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
        // Every worker is a member with blocks: both wire formats arrive.
        yield* Effect.promise(() =>
          eventually(
            "four members with blocks",
            async () => {
              const stats = await json<{
                endpoints: Array<{ aggregation?: { members: Array<{ blocks: number }> } }>
              }>(`${relayUrl}/v1/stats`)
              const members = stats.endpoints[0]?.aggregation?.members ?? []
              return members.length === 4 && members.every((m) => m.blocks > 0)
            },
            60_000
          )
        )
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
