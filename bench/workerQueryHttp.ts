/**
 * `worker_query_http`: `POST /v1/query` (PROTOCOL §5.1 ◆3) of 1024-token prompts against the real
 * relay HTTP server over a pool of 64 members holding prompts on the device, the host and the
 * disk (`worker_query_1024`'s workload, applied through the pool's actor), with autocannon as the
 * load generator in a child process of its own; against a bare `node:http` server in this process
 * that reads and JSON-parses the same bodies and answers a fixed body as long as the real answer.
 * Peak rates, 16 connections, median of alternating rounds.
 */

import type { AddressInfo } from "node:net"
import { Effect, Logger, LogLevel, Random, SubscriptionRef } from "effect"
import { PoolId } from "../src/ckf/identity.js"
import { emptyMembershipView } from "../src/discovery/Membership.js"
import type { RouterEvent } from "../src/protocol/Events.js"
import { stableDcId } from "../src/protocol/Identity.js"
import {
  baseRegistration,
  canonicalModelId,
  DcRelayIdentity,
  EndpointId,
  KvQuerySemantics
} from "../src/protocol/Model.js"
import * as RelayHttpServer from "../src/relay/http/RelayHttpServer.js"
import { make as makeRegistry } from "../src/relay/internal/PoolRegistryLive.js"
import type { KvDcRelayService } from "../src/relay/KvDcRelay.js"
import * as PublicationSource from "../src/relay/PublicationSource.js"
import { UnknownEndpoint } from "../src/relay/RelayErrors.js"
import { DOMAIN } from "./global.js"
import { type BenchContext, record } from "./harness.js"
import { bareServer, checked, measured, median } from "./overlapHttp.js"
import { buildWorkload } from "./workerQuery.js"

const BLOCK = 16
const SERVING = new EndpointId({ namespace: "bench", component: "backend", endpoint: "generate" })

/** A relay service over one pool, its events applied, served on an ephemeral port. */
const startRelay = Effect.gen(function* () {
  const workload = buildWorkload(4242)
  const dcId = stableDcId("bench-dc")
  const relayIdentity = new DcRelayIdentity({
    drtInstanceId: 1n,
    relayIncarnation: BigInt(yield* Random.nextIntBetween(1, 0x7fff_ffff))
  })
  const registry = yield* makeRegistry({
    relayIdentity,
    actorConfig: { expectedUniqueBlocks: 16_384, publicationThreshold: 16, publicationDelay: "1 millis" }
  })
  const source = yield* PublicationSource.make(registry)
  const attachment = yield* Effect.orDie(
    registry.attach({
      poolId: new PoolId(DOMAIN, dcId),
      endpoint: SERVING,
      registrations: [baseRegistration(canonicalModelId("llama"), [])],
      querySemantics: new KvQuerySemantics({ kvBlockSize: BLOCK, hashFormat: "dynamo_standard_v1" }),
      roles: ["aggregated"]
    })
  )
  const expected = workload.members.map((m) => ({ workerId: m.workerId, dpRank: m.dpRank }))
  const service: KvDcRelayService = {
    dcName: "bench-dc",
    dcId,
    identity: relayIdentity,
    catalogRef: registry.catalogRef,
    catalogNow: registry.catalogNow,
    publicationHubCounts: registry.publicationHubCounts,
    membershipRef: yield* SubscriptionRef.make(emptyMembershipView),
    loadRef: registry.loadRef,
    subscribePool: source.subscribePool,
    subscribePoolFeed: source.subscribePoolFeed,
    health: Effect.die("not served by this bench"),
    stats: Effect.die("not served by this bench"),
    diagnosticSnapshot: (endpoint) => Effect.fail(new UnknownEndpoint({ endpoint: endpoint.toString() })),
    queryWorkers: (endpoint, hashes) =>
      endpoint.toString() !== SERVING.toString()
        ? Effect.fail(new UnknownEndpoint({ endpoint: endpoint.toString() }))
        : Effect.map(
            attachment.actor.queryWorkers({ hashes, count: hashes.length >>> 1, expected }),
            (result) => ({ servingEndpoint: endpoint, result })
          ),
    queryWorkersNow: (endpoint, hashes) => {
      if (endpoint.toString() !== SERVING.toString()) return undefined
      const result = attachment.actor.queryWorkersNow({ hashes, count: hashes.length >>> 1, expected })
      return result === undefined ? undefined : { servingEndpoint: endpoint, result }
    },
    sourceRanks: () => Effect.succeed([]),
    flush: Effect.void,
    shutdown: Effect.zipRight(source.shutdown, registry.shutdown)
  }
  const ids = new Map<string, number>()
  for (const event of workload.events) {
    const key = `${event.workerId}/${event.dpRank}`
    const eventId = (ids.get(key) ?? 0) + 1
    ids.set(key, eventId)
    yield* attachment.actor.admitEvent(0, { ...event, eventId } as RouterEvent)
  }
  yield* attachment.actor.flush
  const server = yield* RelayHttpServer.serve(service, {
    host: "127.0.0.1",
    port: 0,
    intervals: { shutdownGrace: "100 millis" }
  })
  return { url: server.url, workload }
})

const program = (ctx: BenchContext) =>
  Effect.gen(function* () {
    const { url, workload } = yield* startRelay
    const bodies = workload.queryTokens
      .slice(0, 64)
      .map((tokens) => JSON.stringify({ namespace: "bench", model: "llama", tokens: Array.from(tokens) }))
    const sample = yield* Effect.promise(() =>
      fetch(`${url}/v1/query`, { method: "POST", body: bodies[0]! }).then(async (r) => ({
        status: r.status,
        text: await r.text()
      }))
    )
    const answer = JSON.parse(sample.text) as { pools?: Array<{ workers: Array<unknown> }> }
    if (sample.status !== 200 || answer.pools?.[0]?.workers.length !== workload.members.length)
      return yield* Effect.dieMessage(`worker query failed: ${sample.status} ${sample.text.slice(0, 300)}`)
    const bare = yield* Effect.acquireRelease(
      Effect.promise(() => bareServer(sample.text)),
      (s) => Effect.promise(() => new Promise<void>((resolve) => s.close(() => resolve())))
    )
    const bareUrl = `http://127.0.0.1:${(bare.address() as AddressInfo).port}`
    ctx.log(`  ${bodies.length} bodies of ~${bodies[0]!.length} B, answers of ${sample.text.length} B`)
    const run = (what: string, target: string, seconds: number) =>
      Effect.promise(() => measured({ url: target, bodies, seconds, path: "/v1/query" })).pipe(
        Effect.map((r) => ({ ...checked(what, r), cpu: r.cpuPerQueryUs }))
      )
    yield* run("warm-up real", url, 1)
    yield* run("warm-up bare", bareUrl, 1)
    const rounds = 3
    const seconds = ctx.quick ? 2 : 4
    const real: Array<number> = []
    const plain: Array<number> = []
    const realCpu: Array<number> = []
    const bareCpu: Array<number> = []
    for (let r = 0; r < rounds; r++) {
      const ours = yield* run("real", url, seconds)
      const base = yield* run("bare", bareUrl, seconds)
      real.push(ours.qps)
      plain.push(base.qps)
      realCpu.push(ours.cpu)
      bareCpu.push(base.cpu)
      ctx.log(
        `  round ${r + 1}: real ${ours.qps.toFixed(0)} q/s (${ours.cpu.toFixed(0)} µs CPU/q, p99 ${ours.p99.toFixed(2)} ms), bare ${base.qps.toFixed(0)} q/s (${base.cpu.toFixed(0)} µs CPU/q)`
      )
    }
    record(
      ctx,
      "worker_query_http",
      "queries/s",
      median(real),
      median(plain),
      `POST /v1/query of 1024-token prompts over ${workload.members.length} members and three tiers, 16 connections, autocannon in a child process, median of ${rounds} alternating rounds of ${seconds} s; vs bare node:http parsing the same bodies and answering ${sample.text.length} B; target >= 0.6x; CPU/q ${median(realCpu).toFixed(0)} µs vs ${median(bareCpu).toFixed(0)} µs`
    )
  })

export const benchWorkerQueryHttp = async (ctx: BenchContext): Promise<void> => {
  await Effect.runPromise(program(ctx).pipe(Effect.scoped, Logger.withMinimumLogLevel(LogLevel.Error)))
}
