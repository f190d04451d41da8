/**
 * The relay HTTP API (PROTOCOL §5) over a real server on 127.0.0.1 and `fetch`: every route and
 * status, the JSON shapes, and the binary pool stream decoded with the frame decoder and CBI1.
 */

import SwaggerParser from "@apidevtools/swagger-parser"
import { describe, expect, it } from "@effect/vitest"
import { Effect, Either, Exit, Logger, LogLevel, Option, Ref, Scope, Stream, SubscriptionRef } from "effect"
import { Cbi1SnapshotAssembler, decodeCbi1 } from "../../../src/ckf/cbi1.js"
import { DcId, PoolId } from "../../../src/ckf/identity.js"
import { WATCH_ALL } from "../../../src/discovery/DiscoveryConfig.js"
import { projectMembership } from "../../../src/discovery/MembershipProjection.js"
import { PUBLISH_DELAY_BOUNDS_SECONDS } from "../../../src/observability/PublishDelay.js"
import { DROP_REASONS, ZMTP_ERROR_REASONS } from "../../../src/protocol/Events.js"
import { decodeJson } from "../../../src/protocol/Json.js"
import {
  FRAME_DELTA,
  FRAME_HEARTBEAT,
  FRAME_SNAPSHOT_CHUNK,
  FRAME_TERMINAL_ERROR,
  POOL_STREAM_CONTENT_TYPE
} from "../../../src/protocol/PoolStream.js"
import {
  CatalogSnapshotJson,
  DiagnosticSnapshotJson,
  ErrorBodyJson,
  HealthJson,
  LoadWindowJson,
  ReadinessJson,
  RelayInfoJson,
  RelayStatsJson,
  relayOpenApi
} from "../../../src/protocol/RelayApi.js"
import * as RelayHttpServer from "../../../src/relay/http/RelayHttpServer.js"
import type * as LoadWindows from "../../../src/relay/LoadWindows.js"
import { LoadWindowLagged, PublicationError } from "../../../src/relay/RelayErrors.js"
import { VERSION } from "../../../src/version.js"
import { card } from "../../discovery/fixtures.js"
import {
  eventually,
  get,
  postJson,
  request,
  type SseClient,
  subscribePool,
  watch
} from "../../http/httpClient.js"
import {
  familyOf,
  namingProblems,
  PROCESS_FAMILIES,
  parseExposition,
  sampleValue
} from "../../observability/exposition.js"
import { runtimeConfig, storedEventN } from "../registryFixtures.js"
import { makeTestRelay, producerJson } from "./relayFixture.js"

const decoded = <A, I>(schema: Parameters<typeof decodeJson<A, I>>[0], json: unknown): A =>
  Either.getOrThrowWith(decodeJson(schema)(json), (e) => new Error(e.message))

const errorBody = (json: unknown) => decoded(ErrorBodyJson, json)

/** A live-clock scoped test (real sockets) with the relay's info logs silenced. */
const live = <A, E>(name: string, body: () => Effect.Effect<A, E, Scope.Scope>, timeout?: number) =>
  it.scopedLive(name, () => body().pipe(Logger.withMinimumLogLevel(LogLevel.Warning)), timeout)

/** A relay with one pool and a server on an ephemeral port. */
const setup = (options: RelayHttpServer.RelayHttpOptions = {}, relayOptions = {}) =>
  Effect.gen(function* () {
    const test = yield* makeTestRelay(relayOptions)
    const attachment = yield* test.attach(1, "prod.backend.generate")
    const server = yield* RelayHttpServer.serve(test.relay, { host: "127.0.0.1", port: 0, ...options })
    return { ...test, attachment, server, base: server.url }
  })

describe("RelayHttpServer: plain routes", () => {
  live("binds an ephemeral port and reports its URL", () =>
    Effect.gen(function* () {
      const { server } = yield* setup()
      expect(server.port).toBeGreaterThan(0)
      expect(server.url).toBe(`http://127.0.0.1:${server.port}`)
    })
  )

  live("GET /v1/openapi.json serves the routes' OpenAPI document, which validates", () =>
    Effect.gen(function* () {
      const { base } = yield* setup()
      const reply = yield* get(base, "/v1/openapi.json")
      expect(reply.status).toBe(200)
      expect(reply.headers.get("content-type")).toBe("application/json")
      // Byte for byte the document as rendered.
      expect(reply.text).toBe(JSON.stringify(relayOpenApi()))
      yield* Effect.promise(() => SwaggerParser.validate(reply.json as never))
      // Every path the document names is a route here: another method gets 405, not 404.
      for (const path of Object.keys((reply.json as { paths: object }).paths)) {
        const probe = yield* request(`${base}${path.replace("{endpoint}", "x.y.z")}`, { method: "DELETE" })
        expect([path, probe.status]).toEqual([path, 405])
      }
    })
  )

  live("GET /healthz answers 200 ok", () =>
    Effect.gen(function* () {
      const { base } = yield* setup()
      const reply = yield* get(base, "/healthz")
      expect(reply.status).toBe(200)
      expect(reply.text).toBe("ok")
    })
  )

  live("GET /v1/health is 200 when healthy and 503 otherwise", () =>
    Effect.gen(function* () {
      const { base, healthRef } = yield* setup()
      const healthy = yield* get(base, "/v1/health")
      expect(healthy.status).toBe(200)
      expect(healthy.json).toEqual({
        healthy: true,
        shuttingDown: false,
        endpointCount: 0,
        activeEndpointCount: 0,
        fencedEndpointCount: 0,
        sourcesRecovering: 0,
        sourcesDegraded: 0,
        sources: { expected: 0, connecting: 0, live: 0, recovering: 0, degraded: 0, rejected: 0 },
        discovery: { state: "live", since: "1970-01-01T00:00:00.000Z" }
      })
      decoded(HealthJson, healthy.json)
      yield* Ref.update(healthRef, (h) => ({
        ...h,
        healthy: false,
        shuttingDown: true,
        fencedEndpointCount: 2
      }))
      const unhealthy = yield* get(base, "/v1/health")
      expect(unhealthy.status).toBe(503)
      expect(unhealthy.json).toMatchObject({ healthy: false, shuttingDown: true, fencedEndpointCount: 2 })
    })
  )

  live("GET /v1/relay carries the protocol version, relay identity as u64 strings and the DC", () =>
    Effect.gen(function* () {
      const { base } = yield* setup()
      const reply = yield* get(base, "/v1/relay")
      expect(reply.status).toBe(200)
      expect(reply.headers.get("content-type")).toContain("application/json")
      expect(reply.json).toEqual({
        protocolVersion: 1,
        relay: { drtInstanceId: "11", relayIncarnation: "7" },
        dcName: "test-dc",
        dcId: "0000000000000003"
      })
      decoded(RelayInfoJson, reply.json)
    })
  )

  live("GET /v1/catalog lists the pools ordered by PoolId with u64s as strings", () =>
    Effect.gen(function* () {
      const { base, attach } = yield* setup()
      yield* attach(0, "prod.backend.other", "mistral")
      const reply = yield* get(base, "/v1/catalog")
      expect(reply.status).toBe(200)
      const body = reply.json as {
        protocolVersion: number
        revision: string
        relay: unknown
        pools: Array<{ producer: { producerIncarnation: string; layoutGeneration: string; format: object } }>
      }
      expect(body.protocolVersion).toBe(1)
      expect(body.revision).toBe("2")
      expect(body.relay).toEqual({ drtInstanceId: "11", relayIncarnation: "7" })
      expect(body.pools).toHaveLength(2)
      const first = body.pools[0]!
      expect(first).toMatchObject({
        servingEndpoint: { namespace: "prod", component: "backend", endpoint: "other" },
        registrations: [
          { model: "mistral", target: { base: { baseModel: "mistral" } }, aliases: ["mistral-alias"] }
        ],
        querySemantics: { kvBlockSize: 64, hashFormat: "dynamo_standard_v1", addressing: "canonical_v1" },
        poolRoles: ["aggregated"]
      })
      expect(first.producer.producerIncarnation).toBe("7")
      expect(first.producer.layoutGeneration).toBe("2")
      expect(first.producer.format).toMatchObject({
        formatVersion: 1,
        fingerprintBits: 16,
        slotsPerBucket: 4
      })
      const catalog = decoded(CatalogSnapshotJson, reply.json)
      expect(catalog.pools[0]!.producer.poolId.compareTo(catalog.pools[1]!.producer.poolId)).toBeLessThan(0)
    })
  )

  live("unknown paths are 404 NOT_FOUND and wrong methods 405 INVALID_REQUEST with Allow", () =>
    Effect.gen(function* () {
      const { base } = yield* setup()
      const missing = yield* get(base, "/v2/catalog")
      expect(missing.status).toBe(404)
      expect(errorBody(missing.json).reason).toBe("NOT_FOUND")
      expect(errorBody(missing.json).message).toContain("/v2/catalog")
      const wrong = yield* postJson(base, "/v1/catalog", {})
      expect(wrong.status).toBe(405)
      expect(wrong.headers.get("allow")).toBe("GET")
      expect(errorBody(wrong.json).reason).toBe("INVALID_REQUEST")
      const getSubscribe = yield* get(base, "/v1/pools/subscribe")
      expect(getSubscribe.status).toBe(405)
      expect(getSubscribe.headers.get("allow")).toBe("POST")
      const getFlush = yield* get(base, "/v1/flush")
      expect(getFlush.status).toBe(405)
    })
  )

  live("GET /v1/stats reports identity and per-endpoint diagnostics", () =>
    Effect.gen(function* () {
      const { base, attachment } = yield* setup()
      yield* attachment.actor.admitEvent(0, storedEventN(1))
      yield* attachment.actor.flush
      const reply = yield* get(base, "/v1/stats")
      expect(reply.status).toBe(200)
      const body = reply.json as { identity: unknown; endpoints: Array<Record<string, unknown>> }
      expect(body.identity).toEqual({
        dcName: "test-dc",
        dcId: "0000000000000003",
        drtInstanceId: "11",
        relayIncarnation: "7"
      })
      expect(body.endpoints).toHaveLength(1)
      const endpoint = body.endpoints[0]!
      expect(endpoint["servingEndpoint"]).toBe("prod.backend.generate")
      expect(endpoint["layoutGeneration"]).toBe("1")
      expect(endpoint["aggregation"]).toMatchObject({
        members: [{ workerId: "1", dpRank: 0, blocks: 1 }],
        uniqueBlockCount: 1
      })
      expect((endpoint["publication"] as { sequence: string }).sequence).toMatch(/^[0-9]+$/)
      expect(endpoint["actor"]).toMatchObject({ mailboxCapacity: expect.any(Number), lastError: null })
      expect(endpoint["ingest"]).toMatchObject({ events: 1, malformed: 0, gaps: 0 })
      decoded(RelayStatsJson, reply.json)
    })
  )

  live("GET /v1/endpoints/{endpoint}/snapshot returns the barrier snapshot as base64 LE words", () =>
    Effect.gen(function* () {
      const { base, attachment } = yield* setup()
      yield* attachment.actor.admitEvent(0, storedEventN(1))
      yield* attachment.actor.admitEvent(0, storedEventN(2))
      yield* attachment.actor.flush
      const reply = yield* get(base, "/v1/endpoints/prod.backend.generate/snapshot")
      expect(reply.status).toBe(200)
      const body = reply.json as Record<string, unknown>
      expect(Object.keys(body).sort()).toEqual(
        ["buckets", "format", "layoutGeneration", "memberCount", "sequence", "uniqueBlockCount"].sort()
      )
      expect(body["layoutGeneration"]).toBe("1")
      expect(body["uniqueBlockCount"]).toBe(2)
      expect(body["memberCount"]).toBe(1)
      const snapshot = decoded(DiagnosticSnapshotJson, reply.json)
      const truth = yield* attachment.actor.snapshot
      expect(snapshot.sequence).toBe(truth.sequence)
      expect(Array.from(snapshot.buckets)).toEqual(Array.from(truth.words))
      // The bytes are the little-endian u64 words: word i = lo | hi << 32.
      const bytes = Buffer.from(body["buckets"] as string, "base64")
      expect(bytes.length).toBe(8 * attachment.identity.format.bucketCount)
      for (let i = 0; i < attachment.identity.format.bucketCount; i++) {
        const word = bytes.readBigUInt64LE(8 * i)
        expect(word).toBe(BigInt(truth.words[2 * i]!) | (BigInt(truth.words[2 * i + 1]!) << 32n))
      }

      const unknown = yield* get(base, "/v1/endpoints/prod.backend.missing/snapshot")
      expect(unknown.status).toBe(404)
      expect(errorBody(unknown.json).reason).toBe("POOL_NOT_FOUND")
      const malformed = yield* get(base, "/v1/endpoints/not-an-endpoint/snapshot")
      expect(malformed.status).toBe(400)
      expect(errorBody(malformed.json).reason).toBe("INVALID_REQUEST")
    })
  )

  live("POST /v1/flush answers 204 once pending tails are published", () =>
    Effect.gen(function* () {
      const { base, attachment } = yield* setup()
      yield* attachment.actor.admitEvent(0, storedEventN(1))
      const reply = yield* request(`${base}/v1/flush`, { method: "POST" })
      expect(reply.status).toBe(204)
      expect(reply.text).toBe("")
      const stats = (yield* attachment.actor.stateStats).stats
      expect(stats.publication.pendingEvents).toBe(0)
    })
  )

  live("GET /v1/readiness serves the topology snapshot", () =>
    Effect.gen(function* () {
      const { base } = yield* setup()
      const reply = yield* get(base, "/v1/readiness")
      expect(reply.status).toBe(200)
      expect(reply.json).toEqual({ revision: "1", entries: [] })
      decoded(ReadinessJson, reply.json)
    })
  )

  live("GET /metrics exposes the kv_dc_relay_* families as Prometheus text", () =>
    Effect.gen(function* () {
      const { base } = yield* setup()
      const reply = yield* get(base, "/metrics")
      expect(reply.status).toBe(200)
      expect(reply.headers.get("content-type")).toContain("text/plain")
      for (const family of [
        "kv_dc_relay_subscribers",
        "kv_dc_relay_subscriber_lagged_total",
        "kv_dc_relay_subscriber_limit_rejected_total",
        "kv_dc_relay_pool_heartbeats_total",
        "kv_dc_relay_load_updates_total",
        "kv_dc_relay_catalog_pool_count",
        "kv_dc_relay_requested_publication_hub_count",
        "kv_dc_relay_initialized_publication_hub_count",
        "kv_dc_relay_ready_publication_hub_count",
        "kv_dc_relay_idle_publication_hub_count",
        "kv_dc_relay_terminal_publication_failures_total",
        "kv_dc_relay_serving_topology_count",
        "kv_dc_relay_degraded_load_coverage_pool_count",
        "kv_dc_relay_catalog_revision",
        "kv_dc_relay_ingest_events_total",
        "kv_dc_relay_ingest_blocks_total",
        "kv_dc_relay_ingest_malformed_total",
        "kv_dc_relay_ingest_gaps_total",
        "kv_dc_relay_ingest_recoveries_total",
        "kv_dc_relay_ingest_dropped_batches_total",
        "kv_dc_relay_actor_mailbox_depth",
        "kv_dc_relay_publication_sequence",
        "kv_dc_relay_publish_delay_seconds"
      ]) {
        expect(reply.text).toContain(`# TYPE ${family} `)
      }
      expect(reply.text).toMatch(/kv_dc_relay_subscribers\{stream="pool"\} \d+/)
      expect(reply.text).toMatch(/kv_dc_relay_serving_topology_count\{state="ready"\} 0/)
      expect(reply.text).toMatch(/kv_dc_relay_catalog_pool_count 1\b/)
      expect(reply.text).toMatch(/kv_dc_relay_ingest_events_total\{endpoint="prod.backend.generate"\} 0/)
    })
  )

  live("GET /metrics parses; counters are *_total counters; process, runtime and build metrics", () =>
    Effect.gen(function* () {
      const { base } = yield* setup()
      const text = (yield* get(base, "/metrics")).text
      const families = parseExposition(text)
      expect(namingProblems(families)).toEqual([])
      for (const [name, type] of PROCESS_FAMILIES) expect(familyOf(families, name)?.type, name).toBe(type)
      expect(sampleValue(families, "kvrelay_build_info", { version: VERSION })).toBe(1)
      for (const name of ["events", "blocks", "malformed", "gaps", "recoveries"]) {
        expect(familyOf(families, `kv_dc_relay_ingest_${name}_total`)?.type).toBe("COUNTER")
        expect(familyOf(families, `kv_dc_relay_ingest_${name}`)).toBeUndefined()
      }
      for (const reason of DROP_REASONS) {
        expect(
          sampleValue(families, "kv_dc_relay_ingest_dropped_batches_total", { reason }),
          reason
        ).toBeTypeOf("number")
      }
      expect(familyOf(families, "kv_dc_relay_zmtp_protocol_errors_total")?.type).toBe("COUNTER")
      for (const reason of ZMTP_ERROR_REASONS) {
        expect(
          sampleValue(families, "kv_dc_relay_zmtp_protocol_errors_total", { reason }),
          reason
        ).toBeTypeOf("number")
      }
      // Only the relay's own Effect metrics: the consumer's are not mixed in.
      expect(families.filter((f) => f.name.startsWith("kvrelay_global_"))).toEqual([])
      // The publish delay is a histogram per endpoint: cumulative buckets up to +Inf = count. The
      // parser folds a histogram's labelled series into one, so the series is read off the text.
      expect(familyOf(families, "kv_dc_relay_publish_delay_seconds")?.type).toBe("HISTOGRAM")
      const series = (suffix: string) =>
        [
          ...text.matchAll(
            new RegExp(
              `^kv_dc_relay_publish_delay_seconds_${suffix}\\{endpoint="prod\\.backend\\.generate"(?:,le="([^"]+)")?\\} (\\S+)$`,
              "gm"
            )
          )
        ].map((m) => ({ le: m[1], value: Number(m[2]) }))
      const buckets = series("bucket")
      expect(buckets.map((b) => b.le)).toEqual([...PUBLISH_DELAY_BOUNDS_SECONDS.map(String), "+Inf"])
      const cumulative = buckets.map((b) => b.value)
      expect(cumulative).toEqual([...cumulative].sort((a, b) => a - b))
      expect(series("count").map((c) => c.value)).toEqual([cumulative.at(-1)])
      expect(series("sum")).toHaveLength(1)
    })
  )
})

describe("RelayHttpServer: pool streams", () => {
  live("streams the snapshot, then contiguous deltas, decodable as CBI1", () =>
    Effect.gen(function* () {
      const { base, attachment } = yield* setup()
      yield* attachment.actor.admitEvent(0, storedEventN(1))
      yield* attachment.actor.flush
      const opened = yield* subscribePool(base, {
        subscriberId: "test",
        expectedProducer: producerJson(attachment)
      })
      if (!("stream" in opened)) return yield* Effect.dieMessage(`subscribe failed: ${opened.error.text}`)
      const stream = opened.stream
      expect(stream.contentType).toBe(POOL_STREAM_CONTENT_TYPE)
      const expected = { format: attachment.identity.format, dcId: attachment.identity.poolId.dcId.value }

      const first = (yield* stream.next())!
      expect(first.kind).toBe(FRAME_SNAPSHOT_CHUNK)
      expect(first.baseSequence).toBe(first.sequence)
      const nowUs = BigInt(Date.now()) * 1000n
      expect(first.sendTsUs > nowUs - 60_000_000n && first.sendTsUs <= nowUs + 1_000_000n).toBe(true)
      const chunk = decodeCbi1(first.payload, expected)
      if (chunk instanceof Error || chunk._tag !== "SnapshotChunk")
        return yield* Effect.dieMessage("not a chunk")
      expect(chunk.epoch).toBe(first.sequence)
      const assembled = new Cbi1SnapshotAssembler(expected).push(chunk)
      if (assembled === undefined || assembled instanceof Error)
        return yield* Effect.dieMessage("no snapshot")
      const truth = yield* attachment.actor.snapshot
      expect(Array.from(assembled.words)).toEqual(Array.from(truth.words))

      let sequence = first.sequence
      for (let i = 2; i <= 4; i++) {
        yield* attachment.actor.admitEvent(0, storedEventN(i))
        yield* attachment.actor.flush
        const delta = (yield* stream.next())!
        expect(delta.kind).toBe(FRAME_DELTA)
        expect(delta.baseSequence).toBe(sequence)
        expect(delta.sequence).toBe(sequence + 1n)
        const frame = decodeCbi1(delta.payload, expected)
        if (frame instanceof Error || frame._tag !== "Delta") return yield* Effect.dieMessage("not a delta")
        expect(frame.baseEpoch).toBe(delta.baseSequence)
        expect(frame.epoch).toBe(delta.sequence)
        sequence = delta.sequence
      }
      yield* stream.abort()
    })
  )

  live("sends a heartbeat after an idle interval once the snapshot is complete", () =>
    Effect.gen(function* () {
      const { base, attachment } = yield* setup({ intervals: { poolHeartbeat: "150 millis" } })
      const started = Date.now()
      const opened = yield* subscribePool(base, {
        subscriberId: "hb",
        expectedProducer: producerJson(attachment)
      })
      if (!("stream" in opened)) return yield* Effect.dieMessage(opened.error.text)
      const snapshot = (yield* opened.stream.next())!
      const heartbeat = (yield* opened.stream.next())!
      expect(Date.now() - started).toBeGreaterThanOrEqual(150)
      expect(heartbeat.kind).toBe(FRAME_HEARTBEAT)
      expect(heartbeat.baseSequence).toBe(snapshot.sequence)
      expect(heartbeat.sequence).toBe(snapshot.sequence)
      expect(heartbeat.payload.length).toBe(0)
      yield* attachment.actor.admitEvent(0, storedEventN(1))
      yield* attachment.actor.flush
      const delta = (yield* opened.stream.next())!
      expect(delta.kind).toBe(FRAME_DELTA)
      const next = (yield* opened.stream.next())!
      expect(next.kind).toBe(FRAME_HEARTBEAT)
      expect(next.sequence).toBe(delta.sequence)
      expect(next.baseSequence).toBe(delta.sequence)
      const metrics = yield* get(base, "/metrics")
      expect(metrics.text).toMatch(/kv_dc_relay_pool_heartbeats_total [1-9]/)
      yield* opened.stream.abort()
    })
  )

  live("a withdrawn generation ends its streams with PUBLICATION_UNAVAILABLE", () =>
    Effect.gen(function* () {
      const { base, attachment, registry } = yield* setup()
      const opened = yield* subscribePool(base, {
        subscriberId: "w",
        expectedProducer: producerJson(attachment)
      })
      if (!("stream" in opened)) return yield* Effect.dieMessage(opened.error.text)
      expect((yield* opened.stream.next())!.kind).toBe(FRAME_SNAPSHOT_CHUNK)
      yield* registry.withdraw(attachment.poolId, attachment.layoutGeneration, "Graceful")
      const rest = yield* opened.stream.rest()
      expect(rest).toHaveLength(1)
      const terminal = rest[0]!
      expect(terminal.kind).toBe(FRAME_TERMINAL_ERROR)
      const body = errorBody(JSON.parse(new TextDecoder().decode(terminal.payload)))
      expect(body.reason).toBe("PUBLICATION_UNAVAILABLE")
      // The pool left the catalog: a new subscription is refused before any stream starts.
      const again = yield* subscribePool(base, {
        subscriberId: "w",
        expectedProducer: producerJson(attachment)
      })
      if (!("error" in again)) return yield* Effect.dieMessage("subscribed to a withdrawn pool")
      expect(again.error.status).toBe(404)
      expect(errorBody(again.error.json).reason).toBe("POOL_NOT_FOUND")
    })
  )

  live("maps pre-stream failures to statuses: 404, 409, 503 and 500", () =>
    Effect.gen(function* () {
      const { base, attachment, attach, source, relay } = yield* setup()
      const producer = producerJson(attachment) as { poolId: object; layoutGeneration: string }
      const other = yield* attach(5, "prod.backend.five")
      const unknownPool = producerJson(other) as { poolId: { routingScope: { digest: string } } }
      unknownPool.poolId.routingScope.digest = "ab".repeat(16)
      const notFound = yield* postJson(base, "/v1/pools/subscribe", {
        subscriberId: "a",
        expectedProducer: unknownPool
      })
      expect(notFound.status).toBe(404)
      expect(errorBody(notFound.json).reason).toBe("POOL_NOT_FOUND")

      const changed = yield* postJson(base, "/v1/pools/subscribe", {
        subscriberId: "a",
        expectedProducer: { ...producer, layoutGeneration: "9" }
      })
      expect(changed.status).toBe(409)
      expect(errorBody(changed.json).reason).toBe("PRODUCER_CHANGED")

      const failing = yield* RelayHttpServer.serve(
        {
          ...relay,
          subscribePool: () => Effect.fail(new PublicationError({ kind: "Internal", message: "boom" })),
          subscribePoolFeed: () => Effect.fail(new PublicationError({ kind: "Internal", message: "boom" }))
        },
        { port: 0 }
      )
      const broken = yield* postJson(failing.url, "/v1/pools/subscribe", {
        subscriberId: "a",
        expectedProducer: producer
      })
      expect(broken.status).toBe(500)
      expect(errorBody(broken.json)).toEqual({ reason: "INTERNAL", message: "boom" })

      yield* source.shutdown
      const unavailable = yield* postJson(base, "/v1/pools/subscribe", {
        subscriberId: "a",
        expectedProducer: producer
      })
      expect(unavailable.status).toBe(503)
      expect(errorBody(unavailable.json).reason).toBe("PUBLICATION_UNAVAILABLE")
    })
  )
})

describe("RelayHttpServer: subscribe request validation", () => {
  const subscribeWith = (base: string, body: unknown) => postJson(base, "/v1/pools/subscribe", body)

  live("malformed JSON, non-objects, unknown and missing fields are 400 naming the problem", () =>
    Effect.gen(function* () {
      const { base, attachment } = yield* setup()
      const producer = producerJson(attachment) as Record<string, unknown>

      const broken = yield* subscribeWith(base, '{"subscriberId": "a",')
      expect(broken.status).toBe(400)
      expect(errorBody(broken.json).reason).toBe("INVALID_REQUEST")
      expect(errorBody(broken.json).message).toMatch(/^invalid JSON: /)

      const empty = yield* subscribeWith(base, "")
      expect(empty.status).toBe(400)
      expect(errorBody(empty.json).message).toMatch(/^invalid JSON/)

      const array = yield* subscribeWith(base, [])
      expect(array.status).toBe(400)

      const extra = yield* subscribeWith(base, {
        subscriberId: "a",
        expectedProducer: producer,
        resume: true
      })
      expect(extra.status).toBe(400)
      expect(errorBody(extra.json).message).toContain('unknown field "resume"')

      const nested = yield* subscribeWith(base, {
        subscriberId: "a",
        expectedProducer: { ...producer, poolId: { ...(producer["poolId"] as object), colour: "red" } }
      })
      expect(nested.status).toBe(400)
      expect(errorBody(nested.json).message).toContain('unknown field "expectedProducer.poolId.colour"')

      const missing = yield* subscribeWith(base, { subscriberId: "a" })
      expect(missing.status).toBe(400)
      expect(errorBody(missing.json).message).toContain('missing field "expectedProducer"')

      const zero = yield* subscribeWith(base, {
        subscriberId: "a",
        expectedProducer: { ...producer, layoutGeneration: "0" }
      })
      expect(zero.status).toBe(400)
      expect(errorBody(zero.json).message).toContain("layoutGeneration")

      const badSeed = yield* subscribeWith(base, {
        subscriberId: "a",
        expectedProducer: { ...producer, format: { ...(producer["format"] as object), seed: "-1" } }
      })
      expect(badSeed.status).toBe(400)
      expect(errorBody(badSeed.json).message).toContain("expectedProducer.format.seed")
    })
  )

  live("subscriberId must be 1..=128 bytes of UTF-8 without control characters", () =>
    Effect.gen(function* () {
      const { base, attachment } = yield* setup()
      const expectedProducer = producerJson(attachment)
      for (const subscriberId of ["", "x".repeat(129), "é".repeat(65), "a\u0001b", "tab\there", 7]) {
        const reply = yield* subscribeWith(base, { subscriberId, expectedProducer })
        expect(reply.status, JSON.stringify(subscriberId)).toBe(400)
        expect(errorBody(reply.json).reason).toBe("INVALID_REQUEST")
        expect(errorBody(reply.json).message).toContain("subscriberId")
      }
      // 128 bytes of multi-byte UTF-8 is the longest valid id; u64s may be given as numbers ≤ 2^53.
      const longest = yield* subscribePool(base, {
        subscriberId: "é".repeat(64),
        expectedProducer: { ...(expectedProducer as object), layoutGeneration: 1 }
      })
      if (!("stream" in longest)) return yield* Effect.dieMessage(longest.error.text)
      expect(longest.stream.status).toBe(200)
      yield* longest.stream.abort()
    })
  )

  live("unsupported format and identity values are 422 UNSUPPORTED_FEATURE; zero values are 400", () =>
    Effect.gen(function* () {
      const { base, attachment } = yield* setup()
      const producer = producerJson(attachment) as {
        poolId: { identityVersion: number; cacheSemantics: object; routingScope: object }
        format: Record<string, unknown>
      }
      const variants: Array<[string, unknown]> = [
        ["format.formatVersion", { ...producer, format: { ...producer.format, formatVersion: 2 } }],
        ["format.fingerprintBits", { ...producer, format: { ...producer.format, fingerprintBits: 8 } }],
        ["format.slotsPerBucket", { ...producer, format: { ...producer.format, slotsPerBucket: 8 } }],
        ["format.bucketCount", { ...producer, format: { ...producer.format, bucketCount: 2 ** 25 } }],
        ["poolId.identityVersion", { ...producer, poolId: { ...producer.poolId, identityVersion: 2 } }],
        [
          "poolId.routingScope.source",
          {
            ...producer,
            poolId: { ...producer.poolId, routingScope: { ...producer.poolId.routingScope, source: "v2" } }
          }
        ]
      ]
      for (const [field, expectedProducer] of variants) {
        const reply = yield* subscribeWith(base, { subscriberId: "a", expectedProducer })
        expect(reply.status, field).toBe(422)
        expect(errorBody(reply.json).reason).toBe("UNSUPPORTED_FEATURE")
        expect(errorBody(reply.json).message).toContain(field)
      }
      const zero = yield* subscribeWith(base, {
        subscriberId: "a",
        expectedProducer: { ...producer, format: { ...producer.format, formatVersion: 0 } }
      })
      expect(zero.status).toBe(400)
      expect(errorBody(zero.json).reason).toBe("INVALID_REQUEST")
    })
  )

  live("oversized bodies are 413 with a BODY_TOO_LARGE body, declared or streamed", () =>
    Effect.gen(function* () {
      // The subscribe body has its own small fixed limit; the flag's limit is the query routes'.
      const { base, attachment } = yield* setup({ limits: { maxControlBodyBytes: 1024 } })
      const padded = { subscriberId: "x".repeat(2_000), expectedProducer: producerJson(attachment) }
      const declared = yield* subscribeWith(base, padded)
      expect(declared.status).toBe(413)
      expect(errorBody(declared.json).reason).toBe("BODY_TOO_LARGE")
      expect(errorBody(declared.json).message).toContain("1024 bytes")

      // Without a content-length (chunked), the limit applies while reading.
      const bytes = new TextEncoder().encode(JSON.stringify(padded))
      const streamed = yield* request(`${base}/v1/pools/subscribe`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: new ReadableStream<Uint8Array>({
          start(controller) {
            for (let i = 0; i < bytes.length; i += 256) controller.enqueue(bytes.subarray(i, i + 256))
            controller.close()
          }
        }),
        duplex: "half"
      } as RequestInit)
      expect(streamed.status).toBe(413)
      expect(errorBody(streamed.json).reason).toBe("BODY_TOO_LARGE")

      // The server still serves after refusing both.
      expect((yield* get(base, "/healthz")).status).toBe(200)
    })
  )
})

/** Sizes the filter at 2^21 buckets: a 16 MiB snapshot in four chunks that no socket buffer absorbs. */
const BIG_FILTER = 4_000_000

describe("RelayHttpServer: stream slots, lag and shutdown", () => {
  const metricValue = (text: string, series: string): number => {
    const line = text.split("\n").find((l) => l.startsWith(`${series} `))
    return line === undefined ? 0 : Number(line.slice(series.length + 1))
  }

  live(
    "the 64-stream limit answers 429; a client that disconnects frees its slot at once",
    () =>
      Effect.gen(function* () {
        const { base, attachment } = yield* setup()
        const body = (i: number) => ({ subscriberId: `s${i}`, expectedProducer: producerJson(attachment) })
        const before = yield* get(base, "/metrics")
        const opened = yield* Effect.forEach(
          Array.from({ length: 64 }, (_, i) => i),
          (i) => subscribePool(base, body(i)),
          { concurrency: 16 }
        )
        const streams = opened.map((o) => {
          if (!("stream" in o)) throw new Error(`subscribe failed: ${o.error.text}`)
          return o.stream
        })
        for (const stream of streams) expect((yield* stream.next())!.kind).toBe(FRAME_SNAPSHOT_CHUNK)
        const during = yield* get(base, "/metrics")
        const gauge = 'kv_dc_relay_subscribers{stream="pool"}'
        expect(metricValue(during.text, gauge) - metricValue(before.text, gauge)).toBe(64)

        const refused = yield* subscribePool(base, body(64))
        if (!("error" in refused)) return yield* Effect.dieMessage("the 65th stream was accepted")
        expect(refused.error.status).toBe(429)
        expect(errorBody(refused.error.json)).toEqual({
          reason: "RESOURCE_LIMIT",
          message: "Relay total pool stream limit 64 reached"
        })
        const rejected = yield* get(base, "/metrics")
        const series = 'kv_dc_relay_subscriber_limit_rejected_total{scope="total",stream="pool"}'
        expect(metricValue(rejected.text, series) - metricValue(before.text, series)).toBe(1)

        yield* streams[17]!.abort()
        const accepted = yield* eventually(
          "a new stream is accepted",
          subscribePool(base, body(65)),
          (result) => "stream" in result,
          5_000
        )
        if (!("stream" in accepted)) return yield* Effect.dieMessage("not accepted")
        expect((yield* accepted.stream.next())!.kind).toBe(FRAME_SNAPSHOT_CHUNK)
        for (const stream of streams) yield* stream.abort()
        yield* accepted.stream.abort()
      }),
    20_000
  )

  live("the publication hub gauges follow the pool's hub: requested, serving, then idle", () =>
    Effect.gen(function* () {
      const { base, attachment } = yield* setup()
      const hubs = (text: string) =>
        Object.fromEntries(
          (["requested", "initialized", "ready", "idle"] as const).map((kind) => [
            kind,
            metricValue(text, `kv_dc_relay_${kind}_publication_hub_count`)
          ])
        )
      // The hub is lazy: a pool nobody subscribed to has none.
      expect(hubs((yield* get(base, "/metrics")).text)).toEqual({
        requested: 0,
        initialized: 0,
        ready: 0,
        idle: 0
      })
      const opened = yield* subscribePool(base, {
        subscriberId: "watcher",
        expectedProducer: producerJson(attachment)
      })
      if (!("stream" in opened)) return yield* Effect.dieMessage(opened.error.text)
      expect((yield* opened.stream.next())!.kind).toBe(FRAME_SNAPSHOT_CHUNK)
      expect(hubs((yield* get(base, "/metrics")).text)).toEqual({
        requested: 1,
        initialized: 1,
        ready: 1,
        idle: 0
      })
      // The last subscriber gone, the hub keeps its mirror (reclaimable under the hub limit).
      yield* opened.stream.abort()
      yield* eventually(
        "the hub counted idle",
        Effect.map(get(base, "/metrics"), (reply) => hubs(reply.text)),
        (counts) => counts.idle === 1
      ).pipe(
        Effect.map((counts) => expect(counts).toEqual({ requested: 1, initialized: 1, ready: 1, idle: 1 }))
      )
    })
  )

  live("a client that stops reading while deltas pile up gets SUBSCRIBER_LAGGED when it reads again", () =>
    Effect.gen(function* () {
      const { base, attachment, registry } = yield* setup({}, { expectedUniqueBlocks: BIG_FILTER })
      const opened = yield* subscribePool(base, {
        subscriberId: "slow",
        expectedProducer: producerJson(attachment)
      })
      if (!("stream" in opened)) return yield* Effect.dieMessage(opened.error.text)
      for (let i = 1; i <= 40; i++) {
        yield* attachment.actor.admitEvent(0, storedEventN(i))
        yield* attachment.actor.flush
      }
      const hub = registry.hubSlot(attachment.poolId)!.hub!
      yield* eventually(
        "the subscriber lagged",
        Effect.sync(() => hub.stats.laggedSubscribers),
        (n) => n === 1
      )

      const frames = yield* opened.stream.rest()
      const kinds = frames.map((frame) => frame.kind)
      expect(kinds.slice(0, 4)).toEqual(Array(4).fill(FRAME_SNAPSHOT_CHUNK))
      expect(kinds.at(-1)).toBe(FRAME_TERMINAL_ERROR)
      // Whatever deltas were already on their way are contiguous from the snapshot.
      let sequence = frames[0]!.sequence
      for (const frame of frames.slice(4, -1)) {
        expect(frame.kind).toBe(FRAME_DELTA)
        expect(frame.baseSequence).toBe(sequence)
        sequence = frame.sequence
      }
      const terminal = errorBody(JSON.parse(new TextDecoder().decode(frames.at(-1)!.payload)))
      expect(terminal.reason).toBe("SUBSCRIBER_LAGGED")
      expect(opened.stream.body.broken).toBeUndefined()
    })
  )

  live(
    "a client that never reads again is disconnected after the write-stall timeout, freeing its slot",
    () =>
      Effect.gen(function* () {
        const { base, attachment } = yield* setup(
          { intervals: { writeStallTimeout: "300 millis" } },
          { expectedUniqueBlocks: BIG_FILTER, maxActiveStreams: 1 }
        )
        const body = { subscriberId: "stuck", expectedProducer: producerJson(attachment) }
        const stuck = yield* subscribePool(base, body)
        if (!("stream" in stuck)) return yield* Effect.dieMessage(stuck.error.text)
        const refused = yield* subscribePool(base, body)
        expect("error" in refused && refused.error.status).toBe(429)
        const next = yield* eventually(
          "the stuck stream's slot is free",
          subscribePool(base, body),
          (result) => "stream" in result,
          5_000
        )
        if (!("stream" in next)) return yield* Effect.dieMessage("not accepted")
        // The stuck connection was cut: reading it now ends abruptly, not with a clean body end.
        const leftovers = yield* stuck.stream.rest(10_000)
        expect(leftovers.every((frame) => frame.kind === FRAME_SNAPSHOT_CHUNK)).toBe(true)
        expect(stuck.stream.body.broken).toBeDefined()
        yield* next.stream.abort()
      })
  )

  live("closing the server ends pool streams with a terminal frame and SSE watches cleanly", () =>
    Effect.gen(function* () {
      const test = yield* makeTestRelay()
      const attachment = yield* test.attach(1, "prod.backend.generate")
      const serverScope = yield* Scope.make()
      const server = yield* RelayHttpServer.serve(test.relay, { port: 0 }).pipe(Scope.extend(serverScope))
      const opened = yield* subscribePool(server.url, {
        subscriberId: "s",
        expectedProducer: producerJson(attachment)
      })
      if (!("stream" in opened)) return yield* Effect.dieMessage(opened.error.text)
      expect((yield* opened.stream.next())!.kind).toBe(FRAME_SNAPSHOT_CHUNK)
      const watched = yield* watch(server.url, "/v1/catalog/watch?subscriber=s")
      if (!("sse" in watched)) return yield* Effect.dieMessage(watched.error.text)
      expect((yield* watched.sse.next())!.event).toBe("catalog")

      yield* Scope.close(serverScope, Exit.void)
      const rest = yield* opened.stream.rest()
      expect(rest.map((frame) => frame.kind)).toEqual([FRAME_TERMINAL_ERROR])
      expect(errorBody(JSON.parse(new TextDecoder().decode(rest[0]!.payload))).reason).toBe(
        "PUBLICATION_UNAVAILABLE"
      )
      expect(yield* watched.sse.next()).toBeUndefined()
      expect(watched.sse.body.broken).toBeUndefined()
    })
  )
})

describe("RelayHttpServer: catalog watch", () => {
  live("sends the catalog now and after every revision change, with heartbeat comments", () =>
    Effect.gen(function* () {
      const { base, attach } = yield* setup({ intervals: { watchHeartbeat: "100 millis" } })
      const watched = yield* watch(base, "/v1/catalog/watch?subscriber=global-1")
      if (!("sse" in watched)) return yield* Effect.dieMessage(watched.error.text)
      expect(watched.sse.body.response.headers.get("content-type")).toContain("text/event-stream")
      const first = (yield* watched.sse.next())!
      expect(first.event).toBe("catalog")
      const initial = decoded(CatalogSnapshotJson, JSON.parse(first.data))
      expect(initial.revision).toBe(1n)
      expect(initial.pools).toHaveLength(1)

      yield* attach(2, "prod.backend.second", "qwen")
      const second = (yield* watched.sse.next())!
      const next = decoded(CatalogSnapshotJson, JSON.parse(second.data))
      expect(next.revision).toBe(2n)
      expect(next.pools).toHaveLength(2)
      expect((JSON.parse(second.data) as { revision: unknown }).revision).toBe("2")

      yield* watched.sse.waitForRaw(": heartbeat\n\n", 2_000)
      yield* watched.sse.abort()
    })
  )

  live("requires a valid subscriber id and answers 429 at the watcher limit", () =>
    Effect.gen(function* () {
      const { base } = yield* setup({ limits: { maxCatalogWatchers: 1 } })
      const missing = yield* watch(base, "/v1/catalog/watch")
      expect("error" in missing && missing.error.status).toBe(400)
      const control = yield* watch(base, "/v1/catalog/watch?subscriber=a%01b")
      expect("error" in control && errorBody(control.error.json).reason).toBe("INVALID_REQUEST")

      const watchers = (text: string) =>
        Number(/kv_dc_relay_subscribers\{stream="catalog"\} (\d+)/.exec(text)![1])
      const before = watchers((yield* get(base, "/metrics")).text)
      const one = yield* watch(base, "/v1/catalog/watch?subscriber=one")
      if (!("sse" in one)) return yield* Effect.dieMessage(one.error.text)
      yield* one.sse.next()
      expect(watchers((yield* get(base, "/metrics")).text) - before).toBe(1)
      const two = yield* watch(base, "/v1/catalog/watch?subscriber=two")
      if (!("error" in two)) return yield* Effect.dieMessage("the second watcher was accepted")
      expect(two.error.status).toBe(429)
      expect(errorBody(two.error.json)).toEqual({
        reason: "RESOURCE_LIMIT",
        message: "Relay catalog stream limit 1 reached"
      })
      yield* one.sse.abort()
      const three = yield* eventually(
        "the watcher slot is free",
        watch(base, "/v1/catalog/watch?subscriber=three"),
        (result) => "sse" in result
      )
      if ("sse" in three) yield* three.sse.abort()
    })
  )
})

describe("RelayHttpServer: readiness watch", () => {
  const nextWhere = (sse: SseClient, what: string, predicate: (json: Record<string, unknown>) => boolean) =>
    Effect.gen(function* () {
      for (let i = 0; i < 50; i++) {
        const message = yield* sse.next()
        if (message === undefined) return yield* Effect.dieMessage(`stream ended before ${what}`)
        expect(message.event).toBe("readiness")
        const json = JSON.parse(message.data) as Record<string, unknown>
        decoded(ReadinessJson, json)
        if (predicate(json)) return json
      }
      return yield* Effect.dieMessage(`no readiness event with ${what}`)
    })

  live("sends the topology now, on every revision, and re-sends it on the interval", () =>
    Effect.gen(function* () {
      const test = yield* makeTestRelay()
      const server = yield* RelayHttpServer.serve(test.relay, {
        port: 0,
        intervals: { readinessResend: "150 millis" }
      })
      const watched = yield* watch(server.url, "/v1/readiness/watch?subscriber=router")
      if (!("sse" in watched)) return yield* Effect.dieMessage(watched.error.text)
      const first = yield* nextWhere(watched.sse, "revision 1", (json) => json["revision"] === "1")
      expect(first["entries"]).toEqual([])

      const view = projectMembership([card({ endpoint: "prod.backend.generate", worker: 1 })], {
        scope: WATCH_ALL
      }).view
      yield* SubscriptionRef.set(test.membershipRef, view)
      const second = yield* nextWhere(watched.sse, "revision 2", (json) => json["revision"] === "2")
      expect(second["entries"]).toEqual([
        {
          namespace: "prod",
          canonicalModelId: "llama",
          state: "READY",
          presentRoles: ["aggregated"],
          missingRoles: [],
          members: [
            {
              endpoint: { namespace: "prod", component: "backend", endpoint: "generate" },
              roles: ["aggregated"]
            }
          ],
          duplicateRoleEndpoints: [],
          legacyFallbackActive: false,
          adapters: []
        }
      ])

      // The pool of exactly this membership links the member to its PoolId.
      const membership = view.endpoints.get("prod.backend.generate")!
      const poolId = new PoolId(membership.domain!.id, new DcId(3n))
      yield* Effect.orDie(
        test.registry.attach({
          poolId,
          endpoint: membership.endpoint,
          registrations: membership.registrations,
          querySemantics: membership.domain!.querySemantics,
          roles: membership.roles,
          servingFacts: { runtimeConfigs: membership.runtimeConfigs }
        })
      )
      const third = yield* nextWhere(watched.sse, "revision 3", (json) => json["revision"] === "3")
      const member = (
        third["entries"] as Array<{ members: Array<{ poolId?: { dcId: string; identityVersion: number } }> }>
      )[0]!.members[0]!
      expect(member.poolId).toMatchObject({ identityVersion: 1, dcId: "0000000000000003" })
      expect(decoded(ReadinessJson, third).entries[0]!.members[0]!.poolId!.equals(poolId)).toBe(true)

      // Nothing changes: the same revision is re-sent.
      const resent = yield* nextWhere(watched.sse, "a re-send", () => true)
      expect(resent).toEqual(third)
      const polled = yield* get(server.url, "/v1/readiness")
      expect(polled.json).toEqual(third)
      yield* watched.sse.abort()
    })
  )

  live("answers 429 at the readiness watcher limit and validates an optional subscriber id", () =>
    Effect.gen(function* () {
      const { base } = yield* setup({ limits: { maxReadinessWatchers: 1 } })
      const bad = yield* watch(base, "/v1/readiness/watch?subscriber=")
      expect("error" in bad && bad.error.status).toBe(400)
      const one = yield* watch(base, "/v1/readiness/watch")
      if (!("sse" in one)) return yield* Effect.dieMessage(one.error.text)
      yield* one.sse.next()
      const two = yield* watch(base, "/v1/readiness/watch")
      expect("error" in two && errorBody(two.error.json).message).toBe(
        "Relay readiness stream limit 1 reached"
      )
      expect("error" in two && two.error.status).toBe(429)
      yield* one.sse.abort()
    })
  )
})

describe("RelayHttpServer: load watch", () => {
  live("sends one complete window per interval with consecutive sequences", () =>
    Effect.gen(function* () {
      const { base, attachment, registry } = yield* setup({
        intervals: { loadWindow: "100 millis" },
        limits: { maxLoadWatchers: 1 }
      })
      yield* Effect.orDie(
        registry.replaceLoadCapacity(
          attachment.poolId,
          attachment.layoutGeneration,
          new Map([["1", runtimeConfig({ totalKvBlocks: 1000n })]])
        )
      )
      yield* registry.observeLoad(attachment.poolId, attachment.layoutGeneration, {
        workerId: "1",
        dpRank: 0,
        kvUsedBlocks: 10n
      })
      const watched = yield* watch(base, "/v1/load/watch?subscriber=scorer")
      if (!("sse" in watched)) return yield* Effect.dieMessage(watched.error.text)
      const windows: Array<Record<string, unknown>> = []
      for (let i = 0; i < 3; i++) {
        const message = (yield* watched.sse.next())!
        expect(message.event).toBe("load")
        const json = JSON.parse(message.data) as Record<string, unknown>
        decoded(LoadWindowJson, json)
        windows.push(json)
      }
      const sequences = windows.map((w) => BigInt(w["windowSequence"] as string))
      expect(sequences[0]! >= 1n).toBe(true)
      expect(sequences[1]).toBe(sequences[0]! + 1n)
      expect(sequences[2]).toBe(sequences[1]! + 1n)
      const last = windows[2]!
      expect(last["windowMs"]).toBe("100")
      expect(Math.abs(Number(last["observedMs"]) - Date.now())).toBeLessThan(60_000)
      expect(last["pools"]).toEqual([
        {
          producer: producerJson(attachment),
          kvUsedBlocks: "10",
          totalKvBlocks: "1000",
          kvObservedRanks: 1,
          kvExpectedRanks: 1,
          // No source reads engine metrics: no engine load, and none of its values (§5 ◆3).
          loadObservedRanks: 0
        }
      ])
      const metrics = yield* get(base, "/metrics")
      expect(metrics.text).toMatch(/kv_dc_relay_load_updates_total [1-9]/)
      expect(metrics.text).toMatch(/kv_dc_relay_degraded_load_coverage_pool_count 0\b/)
      const second = yield* watch(base, "/v1/load/watch")
      if (!("error" in second)) return yield* Effect.dieMessage("the second load watcher was accepted")
      expect(second.error.status).toBe(429)
      expect(errorBody(second.error.json).message).toBe("Relay load stream limit 1 reached")
      yield* watched.sse.abort()
    })
  )

  live("a lagged load watcher gets an error event with SUBSCRIBER_LAGGED and its stream ends", () =>
    Effect.gen(function* () {
      const window: LoadWindows.LoadWindow = {
        windowSequence: 1n,
        observedMs: 5n,
        windowMs: 1000n,
        pools: []
      }
      let delivered = false
      const next = Effect.suspend(() => {
        if (delivered) return Effect.fail(new LoadWindowLagged({ capacity: 16 }))
        delivered = true
        return Effect.succeed(window)
      })
      const loadWindows: LoadWindows.LoadWindows = {
        current: Effect.succeed(Option.some(window)),
        subscribe: Effect.succeed({ next, windows: Stream.repeatEffect(next) }),
        subscriberCount: () => 1
      }
      const { base } = yield* setup({ loadWindows })
      const before = yield* get(base, "/metrics")
      const watched = yield* watch(base, "/v1/load/watch")
      if (!("sse" in watched)) return yield* Effect.dieMessage(watched.error.text)
      const first = (yield* watched.sse.next())!
      expect(first.event).toBe("load")
      expect(JSON.parse(first.data)).toEqual({
        windowSequence: "1",
        observedMs: "5",
        windowMs: "1000",
        pools: []
      })
      const error = (yield* watched.sse.next())!
      expect(error.event).toBe("error")
      expect(errorBody(JSON.parse(error.data)).reason).toBe("SUBSCRIBER_LAGGED")
      expect(yield* watched.sse.next()).toBeUndefined()
      const after = yield* get(base, "/metrics")
      const series = /kv_dc_relay_subscriber_lagged_total\{stream="load"\} (\d+)/
      expect(Number(series.exec(after.text)![1]) - Number(series.exec(before.text)![1])).toBe(1)
    })
  )
})
