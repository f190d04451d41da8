/**
 * The OpenAPI documents both servers serve at `GET /v1/openapi.json` validate as OpenAPI 3.1
 * (every `$ref` resolves, every schema is a valid JSON Schema), and list every route.
 */

import SwaggerParser from "@apidevtools/swagger-parser"
import { describe, expect, it } from "vitest"
import { globalOpenApi } from "../../src/protocol/GlobalApi.js"
import { relayOpenApi } from "../../src/protocol/RelayApi.js"

describe("OpenAPI documents", () => {
  it("the relay's validates and lists its routes", async () => {
    const doc = relayOpenApi()
    await SwaggerParser.validate(structuredClone(doc) as never)
    expect(Object.keys(doc.paths).sort()).toEqual(
      [
        "/",
        "/healthz",
        "/metrics",
        "/v1/catalog",
        "/v1/catalog/watch",
        "/v1/endpoints/{endpoint}/snapshot",
        "/v1/flush",
        "/v1/health",
        "/v1/load/watch",
        "/v1/openapi.json",
        "/v1/pools/subscribe",
        "/v1/readiness",
        "/v1/readiness/watch",
        "/v1/relay",
        "/v1/stats",
        "/v1/query",
        "/query",
        "/query_by_hash",
        "/workers"
      ].sort()
    )
  })

  it("the global consumer's validates and lists its routes", async () => {
    const doc = globalOpenApi()
    await SwaggerParser.validate(structuredClone(doc) as never)
    expect(Object.keys(doc.paths).sort()).toEqual(
      [
        "/",
        "/healthz",
        "/metrics",
        "/v1/domains",
        "/v1/health",
        "/v1/openapi.json",
        "/v1/overlap",
        "/v1/overlap/batch",
        "/v1/route",
        "/v1/route/batch",
        "/v1/stats"
      ].sort()
    )
  })

  it("a document with a dangling reference is refused (the validator is not a formality)", async () => {
    const doc = structuredClone(relayOpenApi()) as { paths: Record<string, Record<string, unknown>> }
    doc.paths["/v1/relay"] = {
      get: {
        responses: {
          200: {
            description: "x",
            content: { "application/json": { schema: { $ref: "#/components/schemas/Missing" } } }
          }
        }
      }
    }
    await expect(SwaggerParser.validate(doc as never)).rejects.toThrow(/Missing/)
  })
})
