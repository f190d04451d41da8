/**
 * The global consumer's HTTP API (PROTOCOL §7) over a real server on 127.0.0.1 and `fetch`, with
 * the consumer fed by scripted in-memory relays: routes, JSON shapes, and every error status.
 */

import SwaggerParser from "@apidevtools/swagger-parser"
import * as HttpServer from "@effect/platform/HttpServer"
import { describe, expect, it } from "@effect/vitest"
import { Effect, Layer, Logger, LogLevel, type Scope } from "effect"
import {
  GlobalOverlapClient,
  KvrelayHttpError,
  localBlockHashes,
  sequenceHashes
} from "../../../src/client/index.js"
import { GlobalConsumer } from "../../../src/consumer/GlobalConsumer.js"
import { make as makeConsumer } from "../../../src/consumer/GlobalConsumerLive.js"
import { GlobalView, make as makeView } from "../../../src/consumer/GlobalView.js"
import * as GlobalHttpServer from "../../../src/consumer/http/GlobalHttpServer.js"
import { globalOpenApi } from "../../../src/protocol/GlobalApi.js"
import { eventually } from "../consumerHarness.js"
import { type FakePool, FakeRelay, fakeConnector } from "../fakeRelay.js"

const live = <A, E>(name: string, body: () => Effect.Effect<A, E, Scope.Scope>) =>
  it.scopedLive(name, () => body().pipe(Logger.withMinimumLogLevel(LogLevel.Error)), 15_000)

interface Reply {
  readonly status: number
  readonly headers: Headers
  readonly text: string
  readonly json: unknown
}

const call = (url: string, path: string, init?: RequestInit): Effect.Effect<Reply> =>
  Effect.promise(async () => {
    const response = await fetch(`${url}${path}`, init)
    const text = await response.text()
    let json: unknown
    try {
      json = JSON.parse(text)
    } catch {
      json = undefined
    }
    return { status: response.status, headers: response.headers, text, json }
  })

const post = (url: string, body: unknown, path = "/v1/overlap") =>
  call(url, path, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: typeof body === "string" ? body : JSON.stringify(body)
  })

/** A 3-block prompt (the fake domain's blocks are 16 tokens) and how relays address it. */
const TOKENS = Array.from({ length: 3 * 16 }, (_, i) => 1000 + i)
const LOCAL = localBlockHashes(TOKENS, 16)
const hashes = sequenceHashes(LOCAL)

/** Relay "a" with one pool holding the prompt's first two blocks; optionally never ready. */
const setup = (options: { readonly unreachablePool?: boolean } = {}) =>
  Effect.gen(function* () {
    const a = yield* FakeRelay.make("a", 1n)
    const pool: FakePool = yield* a.addPool({ adapters: ["tenant-a"] })
    yield* pool.store(hashes.slice(0, 2))
    if (options.unreachablePool === true) {
      // Listed in the catalog, but its stream is refused: the lane never becomes ready.
      a.pools.delete(pool.producer.key)
    }
    const consumer = yield* makeConsumer({ relays: [{ name: "a", url: "http://relay-a" }] }).pipe(
      Effect.provide(fakeConnector(new Map([["http://relay-a", a]])))
    )
    const server = yield* Layer.build(
      GlobalHttpServer.layer({ host: "127.0.0.1", port: 0, maxBodyBytes: 4096 }).pipe(
        Layer.provide(
          Layer.mergeAll(
            Layer.succeed(GlobalConsumer, consumer),
            Layer.succeed(GlobalView, makeView(consumer))
          )
        )
      )
    )
    const url = yield* GlobalHttpServer.serverUrl.pipe(Effect.provide(server))
    const address = (yield* HttpServer.HttpServer.pipe(Effect.provide(server))).address
    yield* eventually(
      "the domain is known",
      Effect.sync(
        () => consumer.domains().length === 1 && (options.unreachablePool === true || readyOf(consumer))
      )
    )
    return { url, consumer, pool, address }
  })

const readyOf = (consumer: Effect.Effect.Success<ReturnType<typeof makeConsumer>>) =>
  consumer.domains().some((d) => [...d.lanes.values()].some((l) => l.ready))

const request = (tokens: ReadonlyArray<unknown>) => ({ namespace: "prod", model: "llama", tokens })
const byLocal = (localBlockHashes: ReadonlyArray<unknown>) => ({
  namespace: "prod",
  model: "llama",
  localBlockHashes
})
const BATCH = "/v1/overlap/batch"
const depthOf = (json: unknown): number =>
  (json as { results: Array<{ prefixDepth: number }> }).results[0]!.prefixDepth

describe("GlobalHttpServer", () => {
  live("binds an ephemeral port and serves /healthz and /metrics", () =>
    Effect.gen(function* () {
      const { url, address } = yield* setup()
      expect(address._tag === "TcpAddress" && address.port > 0).toBe(true)
      expect(url).toMatch(/^http:\/\/127\.0\.0\.1:\d+$/)
      const health = yield* call(url, "/healthz")
      expect([health.status, health.text]).toEqual([200, "ok"])
      const metrics = yield* call(url, "/metrics")
      expect(metrics.status).toBe(200)
      expect(metrics.headers.get("content-type")).toMatch(/^text\/plain/)
      expect(metrics.text).toMatch(/^# TYPE kvrelay_global_domains gauge$/m)
      expect(metrics.text).toMatch(/kvrelay_global_lanes\{relay="a",state="ready"\} 1/)
    })
  )

  live("GET /v1/openapi.json serves the routes' OpenAPI document, which validates", () =>
    Effect.gen(function* () {
      const { url } = yield* setup()
      const reply = yield* call(url, "/v1/openapi.json")
      expect(reply.status).toBe(200)
      expect(reply.headers.get("content-type")).toBe("application/json")
      // Byte for byte the document as rendered.
      expect(reply.text).toBe(JSON.stringify(globalOpenApi()))
      yield* Effect.promise(() => SwaggerParser.validate(reply.json as never))
      for (const path of Object.keys((reply.json as { paths: object }).paths)) {
        const probe = yield* call(url, path)
        expect([
          path,
          probe.status === 404 && (probe.json as { reason?: string }).reason === "NOT_FOUND"
        ]).toEqual([path, false])
      }
    })
  )

  live("GET /v1/domains lists lanes with u64 values as decimal text", () =>
    Effect.gen(function* () {
      const { url, pool } = yield* setup()
      const reply = yield* call(url, "/v1/domains")
      expect(reply.status).toBe(200)
      expect(reply.headers.get("content-type")).toBe("application/json")
      expect(reply.json).toEqual([
        {
          cacheSemantics: { digest: "01".repeat(16), source: "explicit" },
          routingScope: { digest: "02".repeat(16), source: "explicit" },
          querySemantics: { kvBlockSize: 16, hashFormat: "dynamo_standard_v1", addressing: "canonical_v1" },
          // PROTOCOL §7 ◆3: one entry per base registration, adapters listed on their base.
          models: [{ namespace: "prod", model: "llama", aliases: ["chat"], adapters: ["tenant-a"] }],
          lanes: [
            {
              lane: 0,
              relay: "a",
              poolId: {
                identityVersion: 1,
                cacheSemantics: { digest: "01".repeat(16), source: "explicit" },
                routingScope: { digest: "02".repeat(16), source: "explicit" },
                dcId: "0000000000000001"
              },
              producer: {
                poolId: expect.any(Object),
                producerIncarnation: "100",
                layoutGeneration: "1",
                format: {
                  formatVersion: 1,
                  seed: String(pool.producer.format.seed),
                  bucketCount: pool.producer.format.bucketCount,
                  fingerprintBits: 16,
                  slotsPerBucket: 4
                }
              },
              servingEndpoint: { namespace: "prod", component: "backend", endpoint: "generate" },
              ready: true,
              installedSequence: String(pool.sequence)
            }
          ]
        }
      ])
    })
  )

  live("POST /v1/overlap answers by tokens and by local hashes, by model and by pool domain", () =>
    Effect.gen(function* () {
      const { url } = yield* setup()
      const byModel = yield* post(url, request(TOKENS))
      expect(byModel.status).toBe(200)
      expect(byModel.json).toEqual({
        results: [
          {
            relay: "a",
            lane: 0,
            poolId: expect.objectContaining({ dcId: "0000000000000001" }),
            servingEndpoint: { namespace: "prod", component: "backend", endpoint: "generate" },
            prefixDepth: 2,
            matchedTokens: 32
          }
        ]
      })
      // A partial last block does not count; an adapter's blocks are addressed apart.
      expect(depthOf((yield* post(url, request(TOKENS.slice(0, 16 + 15)))).json)).toBe(1)
      expect(depthOf((yield* post(url, { ...request(TOKENS), loraName: "tenant-a" })).json)).toBe(0)
      // An adapter no catalog has registered on the model is no silent depth 0 (PROTOCOL §7 ◆3).
      const unknownAdapter = yield* post(url, { ...request(TOKENS), loraName: "tenant-b" })
      expect(unknownAdapter.status).toBe(404)
      expect(unknownAdapter.json).toEqual({
        reason: "ADAPTER_NOT_FOUND",
        message: expect.stringContaining('"tenant-b"')
      })
      expect(depthOf((yield* post(url, { ...request(TOKENS), loraName: null })).json)).toBe(2)
      expect(depthOf((yield* post(url, byLocal(LOCAL.map(String)))).json)).toBe(2)
      // Sequence hashes are no local hashes: probed as such, only the first block (whose
      // sequence hash is its local hash) matches.
      expect(depthOf((yield* post(url, byLocal(hashes.map(String)))).json)).toBe(1)
      const byDomain = yield* post(url, {
        poolDomain: {
          cacheSemantics: { digest: "01".repeat(16), source: "explicit" },
          routingScope: { digest: "02".repeat(16), source: "explicit" }
        },
        tokens: TOKENS.slice(0, 16)
      })
      expect(byDomain.status).toBe(200)
      expect(depthOf(byDomain.json)).toBe(1)
      const empty = yield* post(url, request([]))
      expect(empty.status).toBe(200)
      expect(depthOf(empty.json)).toBe(0)
      expect((yield* post(url, byLocal([2 ** 53, "18446744073709551615"]))).status).toBe(200)
    })
  )

  live("kvrelay/client's GlobalOverlapClient asks /v1/overlap and throws its errors typed", () =>
    Effect.gen(function* () {
      const { url } = yield* setup()
      const client = new GlobalOverlapClient(url)
      const byTokens = yield* Effect.promise(() =>
        client.overlap({ namespace: "prod", model: "llama", tokens: TOKENS })
      )
      expect(byTokens.map((r) => [r.relay, r.prefixDepth, r.matchedTokens])).toEqual([["a", 2, 32]])
      const byHashes = yield* Effect.promise(() =>
        client.overlap({ namespace: "prod", model: "llama", localBlockHashes: LOCAL })
      )
      expect(byHashes.map((r) => r.prefixDepth)).toEqual([2])
      const refused = yield* Effect.promise(() =>
        client.overlap({ namespace: "prod", model: "llama", tokens: TOKENS, loraName: "tenant-b" }).then(
          () => undefined,
          (error: unknown) => error
        )
      )
      expect(refused).toBeInstanceOf(KvrelayHttpError)
      expect(refused).toMatchObject({ status: 404, reason: "ADAPTER_NOT_FOUND" })
    })
  )

  live("POST /v1/overlap/batch answers each query in order; one bad query fails it naming its index", () =>
    Effect.gen(function* () {
      const { url } = yield* setup()
      const reply = yield* post(
        url,
        {
          queries: [
            request(TOKENS),
            byLocal(LOCAL.slice(0, 1).map(String)),
            { ...request(TOKENS), model: "mistral" }
          ]
        },
        BATCH
      )
      expect(reply.status, JSON.stringify(reply.json)).toBe(200)
      const results = (reply.json as { results: Array<Array<{ prefixDepth: number }>> }).results
      expect(results.map((r) => r.map((m) => m.prefixDepth))).toEqual([[2], [1], []])
      // The query that failed has its error at its own index (PROTOCOL §7 ◆3).
      expect((reply.json as { errors: unknown }).errors).toEqual([
        null,
        null,
        { reason: "MODEL_NOT_FOUND", message: expect.stringContaining('"mistral"') }
      ])
      const bad = yield* post(
        url,
        { queries: [request(TOKENS), { ...request(TOKENS), tokens: [1, -1] }] },
        BATCH
      )
      expect(bad.status).toBe(400)
      expect(bad.json).toEqual({
        reason: "INVALID_REQUEST",
        message: expect.stringMatching(/^queries\[1\]: .*tokens\[1\]/)
      })
      const none = yield* post(url, { queries: [] }, BATCH)
      expect(none.status).toBe(400)
      expect(none.json).toMatchObject({ message: expect.stringMatching(/1 to 256/) })
      // 257 queries exceed this server's small body limit; the bound is the parser's.
      const many = (n: number) => JSON.stringify({ queries: Array.from({ length: n }, () => request([])) })
      expect(GlobalHttpServer.parseOverlapBatch(many(257))).toMatch(/1 to 256 overlap bodies, got 257/)
      expect(GlobalHttpServer.parseOverlapBatch(many(256))).toHaveLength(256)
    })
  )

  live("malformed bodies, unknown fields, engine block hashes and bad tokens are 400 INVALID_REQUEST", () =>
    Effect.gen(function* () {
      const { url } = yield* setup()
      const bad: Array<[unknown, RegExp]> = [
        ["{", /invalid JSON/],
        ["[]", /JSON object/],
        [{ namespace: "prod", model: "llama" }, /neither tokens nor localBlockHashes/],
        [{ namespace: "prod", model: "llama", blockHashes: ["1"] }, /blockHashes.*tokens.*localBlockHashes/],
        [{ ...request([1]), localBlockHashes: [] }, /not both/],
        [{ ...request([1]), extra: true }, /unknown field "extra"/],
        [{ ...byLocal([]), loraName: "a" }, /unknown field "loraName"/],
        [request([1, -1]), /tokens\[1\]/],
        [request([2 ** 32]), /tokens\[0\]/],
        [request([1.5]), /tokens\[0\]/],
        [request(["7"]), /tokens\[0\]/],
        [{ namespace: "prod", model: "llama", tokens: "1 2" }, /array of u32/],
        [{ ...request([1]), loraName: 7 }, /loraName/],
        [byLocal(["-1"]), /localBlockHashes\[0\]/],
        [byLocal(["0123"]), /canonical decimal/],
        [byLocal(["18446744073709551616"]), /u64/],
        [byLocal([2 ** 53 + 2]), /2\^53/],
        [byLocal([null]), /localBlockHashes\[0\]/],
        [{ namespace: "", model: "llama", tokens: [] }, /namespace/],
        [{ namespace: "prod", model: " llama", tokens: [] }, /model/],
        [
          { poolDomain: { cacheSemantics: { digest: "zz", source: "explicit" } }, tokens: [] },
          /digest|routingScope/
        ],
        [
          {
            poolDomain: {
              cacheSemantics: { digest: "01".repeat(16), source: "explicit", x: 1 },
              routingScope: { digest: "02".repeat(16), source: "explicit" }
            },
            localBlockHashes: []
          },
          /unknown field "poolDomain.cacheSemantics.x"/
        ]
      ]
      for (const [body, message] of bad) {
        const reply = yield* post(url, body)
        expect(reply.status, JSON.stringify(body)).toBe(400)
        expect(reply.json, JSON.stringify(body)).toEqual({
          reason: "INVALID_REQUEST",
          message: expect.stringMatching(message)
        })
      }
    })
  )

  live("a body over the limit is 413; wrong methods are 405; unknown paths are 404", () =>
    Effect.gen(function* () {
      const { url } = yield* setup()
      const large = yield* post(
        url,
        byLocal(Array.from({ length: 400 }, (_, i) => String(10n ** 18n + BigInt(i))))
      )
      expect(large.status).toBe(413)
      expect(large.json).toEqual({
        reason: "BODY_TOO_LARGE",
        message: expect.stringMatching(/4096 bytes.*--max-request-body-bytes/)
      })
      const wrong = yield* call(url, "/v1/overlap")
      expect(wrong.status).toBe(405)
      expect(wrong.headers.get("allow")).toBe("POST")
      expect((yield* call(url, "/v1/domains", { method: "POST" })).status).toBe(405)
      const missing = yield* call(url, "/v1/nothing")
      expect(missing.status).toBe(404)
      expect(missing.json).toMatchObject({ reason: "NOT_FOUND" })
    })
  )

  live("a model or domain never registered is 404; a known one without a ready lane is 503", () =>
    Effect.gen(function* () {
      const { url } = yield* setup()
      const otherModel = yield* post(url, { namespace: "prod", model: "mistral", tokens: [1] })
      expect(otherModel.status).toBe(404)
      expect(otherModel.json).toMatchObject({ reason: "MODEL_NOT_FOUND" })
      const otherNamespace = yield* post(url, { namespace: "dev", model: "llama", tokens: [1] })
      expect(otherNamespace.status).toBe(404)
      const otherDomain = yield* post(url, {
        poolDomain: {
          cacheSemantics: { digest: "01".repeat(16), source: "default_derived" },
          routingScope: { digest: "02".repeat(16), source: "explicit" }
        },
        tokens: [1]
      })
      expect(otherDomain.status).toBe(404)
      expect(otherDomain.json).toMatchObject({ reason: "POOL_NOT_FOUND" })

      const down = yield* setup({ unreachablePool: true })
      const unavailable = yield* post(down.url, request([1]))
      expect(unavailable.status).toBe(503)
      expect(unavailable.json).toMatchObject({ reason: "NO_READY_LANE" })
    })
  )
})
