/**
 * A JSON request body of any size or nesting is answered with a 4xx and a short message, never a
 * 500, and the server keeps serving (PROTOCOL §2 ◆, the HTTP half). Real servers on 127.0.0.1: a
 * relay host over file discovery with its HTTP API, and a global consumer following it.
 */

import { describe, expect, it } from "@effect/vitest"
import { Effect, Logger, LogLevel } from "effect"
import * as RelayHttpServer from "../../src/relay/http/RelayHttpServer.js"
import { startConsumer } from "../consumer/consumerHarness.js"
import { startDcRelay } from "../consumer/realRelay.js"
import { startRelay } from "../integration/relayHostFixtures.js"
import { discoveryFile } from "../relay/hostFixtures.js"

/** 100,000 nested arrays: 200,000 bytes. */
const DEEP = `${"[".repeat(100_000)}${"]".repeat(100_000)}`
/** Nested objects under a field, within the relay's default 64 KiB limit. */
const deepObject = (depth: number) => `${'{"a":'.repeat(depth)}1${"}".repeat(depth)}`

const post = (url: string, body: string) =>
  Effect.promise(async () => {
    const response = await fetch(url, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body
    })
    const text = await response.text()
    return { status: response.status, json: JSON.parse(text) as { reason: string; message: string } }
  })

const healthz = (base: string) => Effect.promise(async () => (await fetch(`${base}/healthz`)).status)

const quiet = Logger.minimumLogLevel(LogLevel.Error)

describe("deeply nested and oversized JSON bodies", () => {
  it.scopedLive("relay POST /v1/pools/subscribe: 400 for any nesting within the limit, 413 beyond it", () =>
    Effect.gen(function* () {
      const relay = yield* startRelay(yield* discoveryFile())
      const small = yield* RelayHttpServer.serve(relay, { host: "127.0.0.1", port: 0 }).pipe(Effect.orDie)
      const large = yield* RelayHttpServer.serve(relay, {
        host: "127.0.0.1",
        port: 0,
        limits: { maxControlBodyBytes: 1024 * 1024 }
      }).pipe(Effect.orDie)
      const subscribe = (base: string, body: string) => post(`${base}/v1/pools/subscribe`, body)

      // The default 64 KiB limit refuses the 200,000-byte body before parsing it.
      const refused = yield* subscribe(small.url, DEEP)
      expect(refused.status).toBe(413)
      expect(refused.json.reason).toBe("BODY_TOO_LARGE")
      // With room for it, it is parsed and rejected for its depth.
      const deep = yield* subscribe(large.url, DEEP)
      expect(deep).toEqual({
        status: 400,
        json: { reason: "INVALID_REQUEST", message: "the value is nested deeper than 64 levels" }
      })
      // Nesting inside a field of an otherwise well-formed request, within the default limit.
      const nested = yield* subscribe(
        small.url,
        `{"subscriberId":"deep","expectedProducer":${deepObject(10_000)}}`
      )
      expect(nested.status).toBe(400)
      expect(nested.json.reason).toBe("INVALID_REQUEST")
      expect(nested.json.message).toBe("the value is nested deeper than 64 levels")
      // 64 levels is still an ordinary invalid request, not a depth error.
      const shallow = yield* subscribe(
        small.url,
        `{"subscriberId":"deep","expectedProducer":${deepObject(63)}}`
      )
      expect(shallow.status).toBe(400)
      expect(shallow.json.message).not.toContain("nested deeper")
      expect(yield* healthz(small.url)).toBe(200)
      expect(yield* healthz(large.url)).toBe(200)
    }).pipe(Effect.provide(quiet))
  )

  it.scopedLive("global POST /v1/overlap and /v1/overlap/batch: 400 for any nesting", () =>
    Effect.gen(function* () {
      const east = yield* startDcRelay("east")
      const { url } = yield* startConsumer([{ name: "east", url: east.url }])
      for (const path of ["/v1/overlap", "/v1/overlap/batch"]) {
        // A top-level array is no request: refused with a short message, whatever its depth.
        const deep = yield* post(`${url}${path}`, DEEP)
        expect({ path, status: deep.status, reason: deep.json.reason }).toEqual({
          path,
          status: 400,
          reason: "INVALID_REQUEST"
        })
        expect(deep.json.message.length).toBeLessThan(200)
      }
      const batch = yield* post(`${url}/v1/overlap/batch`, `{"queries":${DEEP}}`)
      expect(batch.status).toBe(400)
      expect(batch.json.message).toContain("nested deeper than 64 levels")
      const model = yield* post(
        `${url}/v1/overlap`,
        `{"namespace":"prod","model":"llama","tokens":${DEEP.slice(0, 20_000)}${DEEP.slice(-20_000)}}`
      )
      expect(model.status).toBe(400)
      expect(model.json.message).toContain("nested deeper than 64 levels")
      const domain = yield* post(`${url}/v1/overlap`, `{"poolDomain":${deepObject(10_000)},"tokens":[]}`)
      expect(domain.status).toBe(400)
      expect(domain.json.message).toContain("nested deeper than 64 levels")
      expect(yield* healthz(url)).toBe(200)
    }).pipe(Effect.provide(quiet))
  )
})
