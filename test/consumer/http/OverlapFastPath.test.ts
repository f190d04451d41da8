/**
 * The overlap fast path against the general path: two real servers over one consumer, one with
 * `fastPath: false`, given the same requests (answers, every error, refused tokens, routes the
 * fast path leaves alone) must send the same status, content type and bytes, and count the same
 * queries. Also: the hand-rendered answer JSON against the schema's, and the server span with a
 * tracer installed.
 */

import { mkdtempSync, rmSync, writeFileSync } from "node:fs"
import { request as httpRequest } from "node:http"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { describe, expect, it } from "@effect/vitest"
import { Effect, Either, Layer, Logger, LogLevel, type Scope, Tracer } from "effect"
import * as fc from "fast-check"
import { localBlockHashes, sequenceHashes } from "../../../src/client/index.js"
import {
  AdapterNotFound,
  ModelNotFound,
  NoMatchingDomain,
  NoReadyLane,
  type OverlapError
} from "../../../src/consumer/ConsumerErrors.js"
import { GlobalConsumer } from "../../../src/consumer/GlobalConsumer.js"
import { make as makeConsumer } from "../../../src/consumer/GlobalConsumerLive.js"
import { GlobalView, make as makeView, type OverlapResult } from "../../../src/consumer/GlobalView.js"
import * as GlobalHttpServer from "../../../src/consumer/http/GlobalHttpServer.js"
import { batchReply, overlapReply } from "../../../src/consumer/http/OverlapQuery.js"
import { type TokenFile, watchTokenFile } from "../../../src/http/BearerAuth.js"
import { OverlapBatchResponseJson, OverlapResponseJson } from "../../../src/protocol/GlobalApi.js"
import { encodeJson } from "../../../src/protocol/Json.js"
import { eventually } from "../consumerHarness.js"
import { domainOf, FakeRelay, fakeConnector } from "../fakeRelay.js"

const live = <A, E>(name: string, body: () => Effect.Effect<A, E, Scope.Scope>) =>
  it.scopedLive(name, () => body().pipe(Logger.withMinimumLogLevel(LogLevel.Error)), 20_000)

const TOKENS = Array.from({ length: 3 * 16 }, (_, i) => 1000 + i)
const LOCAL = localBlockHashes(TOKENS, 16)
const hashes = sequenceHashes(LOCAL)

interface Sent {
  readonly method?: string
  readonly path?: string
  readonly headers?: Record<string, string>
  /** A string, or a value to JSON-encode; `chunked` sends it without a content-length. */
  readonly body?: unknown
  readonly chunked?: boolean
}

interface Got {
  readonly status: number
  readonly contentType: string | undefined
  readonly allow: string | undefined
  readonly authenticate: string | undefined
  readonly text: string
}

/** One request over `node:http` (so that chunked bodies and exact headers are under control). */
const send = (url: string, sent: Sent): Effect.Effect<Got> =>
  Effect.async<Got>((resume) => {
    const target = new URL(sent.path ?? "/v1/overlap", url)
    const body =
      sent.body === undefined
        ? undefined
        : typeof sent.body === "string"
          ? sent.body
          : JSON.stringify(sent.body)
    const headers: Record<string, string> = { "content-type": "application/json", ...sent.headers }
    if (body !== undefined && sent.chunked !== true)
      headers["content-length"] = String(Buffer.byteLength(body))
    const request = httpRequest(
      target,
      { method: sent.method ?? (body === undefined ? "GET" : "POST"), headers, agent: false },
      (response) => {
        let text = ""
        response.setEncoding("utf8")
        response.on("data", (chunk: string) => {
          text += chunk
        })
        response.on("end", () =>
          resume(
            Effect.succeed({
              status: response.statusCode ?? 0,
              contentType: response.headers["content-type"],
              allow: response.headers.allow as string | undefined,
              authenticate: response.headers["www-authenticate"],
              text
            })
          )
        )
      }
    )
    request.on("error", (error) =>
      resume(
        Effect.succeed({
          status: -1,
          contentType: undefined,
          allow: undefined,
          authenticate: undefined,
          text: error.message
        })
      )
    )
    if (body !== undefined && sent.chunked === true) {
      // Two writes: the body arrives in more than one chunk.
      const half = Math.floor(body.length / 2)
      request.write(body.slice(0, half))
      request.end(body.slice(half))
    } else request.end(body)
  })

/** Relays "a" (two blocks of the prompt) and "b" (one), and a fast and a general server over them. */
const setup = (options: { readonly auth?: boolean; readonly tracer?: Tracer.Tracer } = {}) =>
  Effect.gen(function* () {
    const a = yield* FakeRelay.make("a", 1n)
    const b = yield* FakeRelay.make("b", 2n)
    yield* (yield* a.addPool()).store(hashes.slice(0, 2))
    yield* (yield* b.addPool()).store(hashes.slice(0, 1))
    const consumer = yield* makeConsumer({
      relays: [
        { name: "a", url: "http://relay-a" },
        { name: "b", url: "http://relay-b" }
      ]
    }).pipe(
      Effect.provide(
        fakeConnector(
          new Map([
            ["http://relay-a", a],
            ["http://relay-b", b]
          ])
        )
      )
    )
    let auth: TokenFile | undefined
    if (options.auth === true) {
      const dir = mkdtempSync(join(tmpdir(), "kvrelay-fast-"))
      yield* Effect.addFinalizer(() => Effect.sync(() => rmSync(dir, { recursive: true, force: true })))
      writeFileSync(join(dir, "tokens"), "good-token\n")
      auth = yield* Effect.orDie(watchTokenFile("--auth-token-file", join(dir, "tokens")))
    }
    const services = Layer.mergeAll(
      Layer.succeed(GlobalConsumer, consumer),
      Layer.succeed(GlobalView, makeView(consumer))
    )
    const serverUrl = (fastPath: boolean) =>
      Effect.gen(function* () {
        const built = Layer.build(
          GlobalHttpServer.layer({ host: "127.0.0.1", port: 0, maxBodyBytes: 4096, auth, fastPath }).pipe(
            Layer.provide(services)
          )
        )
        const server = yield* options.tracer === undefined ? built : Effect.withTracer(built, options.tracer)
        return yield* GlobalHttpServer.serverUrl.pipe(Effect.provide(server))
      })
    const fast = yield* serverUrl(true)
    const general = yield* serverUrl(false)
    yield* eventually(
      "both lanes are ready",
      Effect.sync(() =>
        consumer.domains().some((d) => [...d.lanes.values()].filter((l) => l.ready).length === 2)
      )
    )
    return { fast, general }
  })

const byTokens = (tokens: unknown, extra: Record<string, unknown> = {}) => ({
  namespace: "prod",
  model: "llama",
  tokens,
  ...extra
})
const POOL_DOMAIN = {
  cacheSemantics: { digest: "01".repeat(16), source: "explicit" },
  routingScope: { digest: "02".repeat(16), source: "explicit" }
}
const deep = (levels: number): string => `${"[".repeat(levels)}${"]".repeat(levels)}`

/** 413 while reading: no content-length. */
const OVER_LIMIT_CHUNKED: Sent = { body: byTokens(Array.from({ length: 2000 }, (_, i) => i)), chunked: true }

/** Requests both paths must answer alike; the comments name what each exercises. */
const CASES: ReadonlyArray<Sent> = [
  { body: byTokens(TOKENS) }, // two lanes answer, deepest first
  { body: byTokens(TOKENS.slice(0, 20)) }, // a partial last block
  { body: byTokens([]) },
  { body: byTokens(TOKENS, { loraName: null }) },
  { body: byTokens(TOKENS, { loraName: "" }) },
  { body: byTokens(TOKENS, { loraName: "adapter-1" }) },
  { body: byTokens(TOKENS), chunked: true },
  { body: { namespace: "prod", model: "chat", tokens: TOKENS } }, // an alias
  { body: { namespace: "prod", model: "llama", localBlockHashes: LOCAL.map(String) } },
  { body: { namespace: "prod", model: "llama", localBlockHashes: LOCAL.map((h) => Number(h & 0xfffffn)) } },
  { body: { poolDomain: POOL_DOMAIN, tokens: TOKENS } },
  { body: { poolDomain: POOL_DOMAIN, localBlockHashes: LOCAL.map(String) } },
  // errors
  { body: "{" },
  { body: "" },
  { body: "null" },
  { body: "[]" },
  { body: "42" },
  { body: deep(100) },
  { body: `{"namespace":"prod","model":"llama","tokens":${deep(80)}}` },
  { body: byTokens(TOKENS, { extra: 1 }) },
  { body: byTokens([1, -1]) },
  { body: byTokens([1, 1.5]) },
  { body: byTokens([1, "2"]) },
  { body: byTokens([2 ** 32]) },
  { body: byTokens("1 2 3") },
  { body: byTokens(TOKENS, { loraName: 7 }) },
  { body: { namespace: "prod", model: "llama", tokens: TOKENS, localBlockHashes: [] } },
  { body: { namespace: "prod", model: "llama" } },
  { body: { namespace: "prod", model: "llama", blockHashes: ["1"] } },
  { body: { namespace: "prod", model: "llama", localBlockHashes: ["-1"] } },
  { body: { namespace: "", model: "llama", tokens: [1] } },
  { body: { namespace: "prod", model: "", tokens: [1] } },
  { body: { model: "llama", tokens: [1] } },
  { body: { namespace: "prod", model: "mistral", tokens: [1] } }, // 404
  { body: { namespace: "dev", model: "llama", tokens: [1] } }, // 404
  { body: byTokens(TOKENS, { loraName: "no-such-adapter" }) }, // 404 ADAPTER_NOT_FOUND
  {
    body: {
      poolDomain: { ...POOL_DOMAIN, routingScope: { digest: "03".repeat(16), source: "explicit" } },
      tokens: [1]
    }
  },
  { body: { poolDomain: { cacheSemantics: "x" }, tokens: [1] } },
  { body: byTokens(Array.from({ length: 2000 }, (_, i) => i)) }, // 413 by content-length
  OVER_LIMIT_CHUNKED,
  // batches
  { path: "/v1/overlap/batch", body: { queries: [byTokens(TOKENS), byTokens(TOKENS.slice(0, 16))] } },
  {
    path: "/v1/overlap/batch",
    body: { queries: [byTokens(TOKENS), { namespace: "prod", model: "mistral", tokens: [1] }] }
  },
  { path: "/v1/overlap/batch", body: { queries: [] } },
  { path: "/v1/overlap/batch", body: { queries: [byTokens(TOKENS), byTokens([-1])] } },
  { path: "/v1/overlap/batch", body: { queries: Array.from({ length: 257 }, () => ({})) } },
  { path: "/v1/overlap/batch", body: { queries: [byTokens(TOKENS)], more: true } },
  { path: "/v1/overlap/batch", body: "[" },
  { path: "/v1/overlap/batch", body: [byTokens(TOKENS)] },
  { path: "/v1/overlap/batch", body: { queries: {} } },
  {
    path: "/v1/overlap/batch",
    body: { queries: [byTokens(TOKENS, { loraName: "no-such-adapter" }), byTokens(TOKENS)] }
  },
  // left to the general path on both servers
  { method: "GET" },
  { method: "PUT", body: byTokens(TOKENS) },
  { path: "/v1/overlap?x=1", body: byTokens(TOKENS) },
  { path: "/v1/overlap/", body: byTokens(TOKENS) },
  { path: "/v1/overlap/batch", method: "GET" }
]

const withToken = (sent: Sent, token: string): Sent => ({
  ...sent,
  headers: { ...sent.headers, authorization: `Bearer ${token}` }
})

const queryCounts = (url: string) =>
  Effect.map(send(url, { path: "/v1/stats" }), (got) => {
    const stats = JSON.parse(got.text) as {
      queries: Array<{ route: string; count: number; outcomes: Record<string, number> }>
    }
    return stats.queries.map(({ route, count, outcomes }) => ({ route, count, outcomes }))
  })

const TRACE_ID = "0af7651916cd43dd8448eb211c80319c"

describe("overlap fast path", () => {
  live("answers every request as the general path does, byte for byte", () =>
    Effect.gen(function* () {
      const { fast, general } = yield* setup()
      const sample = yield* send(fast, CASES[0]!)
      expect(sample).toEqual(yield* send(general, CASES[0]!))
      expect(sample.status).toBe(200)
      expect((JSON.parse(sample.text) as { results: Array<unknown> }).results).toHaveLength(2)
      for (const sent of CASES) {
        const [a, b] = [yield* send(fast, sent), yield* send(general, sent)]
        if (sent === OVER_LIMIT_CHUNKED) {
          // The one difference: the platform's body reader destroys the request stream at the
          // limit, so the general path hangs up where the fast path answers 413 as §7 says.
          expect(a.status).toBe(413)
          expect(a.text).toBe(
            '{"reason":"BODY_TOO_LARGE","message":"the request body exceeds the limit of 4096 bytes set by --max-request-body-bytes"}'
          )
          expect([413, -1]).toContain(b.status)
          continue
        }
        expect({ sent, got: a }).toEqual({ sent, got: b })
      }
      // The same queries were counted under the same routes and outcomes.
      expect(yield* queryCounts(fast)).toEqual(yield* queryCounts(general))
      const counts = yield* queryCounts(fast)
      expect(counts.find((c) => c.route === "/v1/overlap")!.count).toBeGreaterThan(30)
    })
  )

  live("with a token file: refused tokens get the same 401s, accepted ones the same answers", () =>
    Effect.gen(function* () {
      const { fast, general } = yield* setup({ auth: true })
      const sents: ReadonlyArray<Sent> = [
        ...CASES.slice(0, 14).map((sent) => withToken(sent, "good-token")),
        CASES[0]!,
        withToken(CASES[0]!, "bad-token"),
        { ...CASES[0]!, headers: { authorization: "Basic Zm9vOmJhcg==" } },
        { ...CASES[0]!, path: "/v1/overlap/batch" },
        withToken(CASES.find((sent) => sent.path === "/v1/overlap/batch")!, "good-token")
      ]
      for (const sent of sents) {
        const [a, b] = [yield* send(fast, sent), yield* send(general, sent)]
        expect({ sent, got: a }).toEqual({ sent, got: b })
      }
      expect((yield* send(fast, CASES[0]!)).status).toBe(401)
      expect((yield* send(fast, withToken(CASES[0]!, "good-token"))).status).toBe(200)
    })
  )

  live("records the server span and the view's span under it when a tracer is installed", () =>
    Effect.gen(function* () {
      const spans: Array<Tracer.Span> = []
      const native = yield* Effect.tracer
      const tracer = Tracer.make({
        span: (...args) => {
          const span = native.span(...args)
          spans.push(span)
          return span
        },
        context: native.context
      })
      const { fast, general } = yield* setup({ tracer })
      // Both servers' spans name their own port.
      const summary = (): Array<{ name: string; ended: boolean }> =>
        JSON.parse(
          JSON.stringify(
            spans.map((span) => ({
              name: span.name,
              kind: span.kind,
              ended: span.status._tag === "Ended",
              inCallersTrace: span.traceId === TRACE_ID,
              parent:
                span.parent._tag === "Some" && span.parent.value._tag === "Span"
                  ? span.parent.value.name
                  : null,
              attributes: Object.fromEntries(
                [...span.attributes].filter(([key]) => key !== "code.stacktrace")
              )
            }))
          ).replace(/127\.0\.0\.1:\d+/g, "127.0.0.1:PORT")
        )
      for (const [sent, status] of [
        [CASES[0]!, 200],
        [{ path: "/v1/overlap/batch", body: { queries: [byTokens(TOKENS)] } }, 200],
        [CASES[12]!, 400],
        // A caller's trace context is the parent, as the platform's middleware takes it.
        [{ ...CASES[0]!, headers: { traceparent: `00-${TRACE_ID}-b7ad6b7169203331-01` } }, 200]
      ] as const) {
        spans.length = 0
        expect((yield* send(general, sent)).status).toBe(status)
        yield* eventually(
          "the general span ended",
          Effect.sync(() => summary().every((s) => s.ended))
        )
        const expected = summary()
        spans.length = 0
        expect((yield* send(fast, sent)).status).toBe(status)
        expect(summary()).toEqual(expected)
        const names = expected.map((s) => s.name)
        expect(names).toContain("http.server POST")
        expect(names.some((name) => /^GlobalHttpServer POST \/v1\/overlap/.test(name))).toBe(true)
      }
    })
  )
})

describe("overlap answers rendered without the schema", () => {
  const encodeResponse = encodeJson(OverlapResponseJson)
  const encodeBatch = encodeJson(OverlapBatchResponseJson)
  const reference = (results: ReadonlyArray<OverlapResult>) => {
    const json = encodeResponse({ results })
    return Either.isRight(json) ? { status: 200, body: JSON.stringify(json.right) } : { status: 500 }
  }

  it.effect("match the schema's JSON for any depths and token counts, and fall back to it when invalid", () =>
    Effect.gen(function* () {
      const a = yield* FakeRelay.make("a", 1n)
      const b = yield* FakeRelay.make("b", 2n)
      const pools = [yield* a.addPool(), yield* b.addPool({ domain: domainOf(5), namespace: "dev" })]
      const number = fc.oneof(
        fc.nat(),
        fc.integer({ min: 0, max: 0xffff_ffff }),
        fc.constantFrom(-1, 1.5, 2 ** 32, Number.NaN, Number.POSITIVE_INFINITY, 1e21, -0)
      )
      const result = fc.record({
        pool: fc.constantFrom(...pools),
        relay: fc.constantFrom("a", "b", 'quote"d', "ünï"),
        lane: fc.constantFrom(0, 1, 15),
        prefixDepth: number,
        matchedTokens: number
      })
      // A batch's queries may also have failed (PROTOCOL §7 ◆3): [] and the error at their index.
      const failure = fc.constantFrom<OverlapError>(
        new ModelNotFound({ message: 'no relay has registered model "x"' }),
        new AdapterNotFound({ message: 'no relay has registered adapter "ä\u0000"' }),
        new NoMatchingDomain({ message: "no relay has listed a pool" }),
        new NoReadyLane({ message: "no lane is ready" })
      )
      const errorBody = (error: OverlapError) => ({
        reason: {
          ModelNotFound: "MODEL_NOT_FOUND",
          AdapterNotFound: "ADAPTER_NOT_FOUND",
          NoMatchingDomain: "POOL_NOT_FOUND",
          NoReadyLane: "NO_READY_LANE"
        }[error._tag] as "MODEL_NOT_FOUND",
        message: error.message
      })
      fc.assert(
        fc.property(
          fc.array(fc.array(result, { maxLength: 6 }), { minLength: 1, maxLength: 4 }),
          fc.array(fc.option(failure, { nil: undefined }), { minLength: 4, maxLength: 4 }),
          (answers, failures) => {
            const results = answers.map((list) =>
              list.map(
                (r): OverlapResult => ({
                  relay: r.relay,
                  lane: r.lane,
                  poolId: r.pool.producer.poolId,
                  servingEndpoint: r.pool.descriptor.servingEndpoint,
                  prefixDepth: r.prefixDepth,
                  matchedTokens: r.matchedTokens
                })
              )
            )
            const one = overlapReply(results[0]!)
            const expected = reference(results[0]!)
            expect(one.status).toBe(expected.status)
            if (expected.status === 200) expect(one.body).toBe(expected.body)
            const mixed = results.map((list, i) => failures[i] ?? list)
            const batch = batchReply(mixed)
            const json = encodeBatch({
              results: results.map((list, i) => (failures[i] === undefined ? list : [])),
              errors: results.map((_, i) => (failures[i] === undefined ? null : errorBody(failures[i]!)))
            })
            if (Either.isRight(json)) expect(batch).toEqual({ status: 200, body: JSON.stringify(json.right) })
            else expect(batch.status).toBe(500)
          }
        ),
        { numRuns: 300 }
      )
    })
  )
})
