/**
 * End to end (PROTOCOL §1, §2 ◆): `kvrelay relay` over an etcd that is not running yet starts
 * anyway, serves an empty catalog with discovery `connecting`, and follows etcd's records once it
 * starts; killing etcd leaves the catalog and a healthy, `stale` relay. A real etcd (skipped without
 * the binary) and the compiled CLI as a child process; every wait is bounded.
 */

import { Effect, Exit, Scope } from "effect"
import { Etcd3 } from "etcd3"
import { afterEach, describe, expect, it } from "vitest"
import { etcdServerNotStarted, skipEtcd, skipped } from "../integration/etcdHelpers.js"
import {
  type CatalogJson,
  cardRecord,
  cleanup,
  endpointText,
  eventually,
  Relay,
  Workers
} from "./relayProcessHarness.js"

const SERVING = { namespace: "prod", component: "router", endpoint: "generate" }
const ENDPOINT = endpointText(SERVING)
const PREFIX = "/kvrelay/v1"

interface Health {
  readonly healthy: boolean
  readonly endpointCount: number
  readonly discovery: { readonly state: string; readonly since: string }
}

const workers = new Workers()
afterEach(() => cleanup(workers))

const health = async (relay: Relay): Promise<{ status: number; body: Health }> => {
  const response = await relay.fetch("/v1/health")
  return { status: response.status, body: (await response.json()) as Health }
}

describe("kvrelay relay over etcd (real etcd, child process)", () => {
  it.skipIf(skipEtcd)(
    `starts before etcd (connecting), follows it once it runs, and keeps its catalog while it is killed${skipped}`,
    async () => {
      const scope = Effect.runSync(Scope.make())
      try {
        const server = await Effect.runPromise(Scope.extend(etcdServerNotStarted, scope))
        const relay = await Relay.start({ discovery: { spec: `etcd:${server.url}` } })
        const connecting = await health(relay)
        expect(connecting.status).toBe(200)
        expect(connecting.body).toMatchObject({
          healthy: true,
          endpointCount: 0,
          discovery: { state: "connecting" }
        })
        expect(Number.isNaN(Date.parse(connecting.body.discovery.since))).toBe(false)
        expect((await relay.json<CatalogJson>("/v1/catalog")).pools).toEqual([])

        await Effect.runPromise(server.start)
        const worker = await workers.dynamo("7001")
        const source = await worker.sourceRecord(ENDPOINT)
        const client = new Etcd3({ hosts: server.url })
        try {
          await client
            .put(`${PREFIX}/cards/prod/router/generate/7001`)
            .value(JSON.stringify(cardRecord(SERVING, "7001")))
          await client
            .put(`${PREFIX}/sources/${ENDPOINT}/7001/0/${source.publisherId}`)
            .value(JSON.stringify(source))
        } finally {
          client.close()
        }
        const pool = await relay.onlyPool(20_000)
        const live = await eventually(
          "discovery live",
          async () => {
            const h = await health(relay)
            return h.body.discovery.state === "live" && h
          },
          20_000
        )
        expect(live.body.healthy).toBe(true)

        // etcd killed: the pool stays, the relay stays healthy and says discovery is stale.
        await Effect.runPromise(server.stop)
        const stale = await eventually(
          "discovery stale",
          async () => {
            const h = await health(relay)
            return h.body.discovery.state === "stale" && h
          },
          20_000
        )
        expect(stale.status).toBe(200)
        expect(stale.body.healthy).toBe(true)
        expect((await relay.json<CatalogJson>("/v1/catalog")).pools.map((p) => p.producer)).toEqual([
          pool.producer
        ])

        relay.proc.signal("SIGTERM")
        expect(await relay.proc.waitExit(20_000)).toEqual({ code: 0, signal: null })
      } finally {
        await Effect.runPromise(Scope.close(scope, Exit.void))
      }
    },
    90_000
  )
})
