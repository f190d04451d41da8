import { createServer, type IncomingMessage } from "node:http"
import type { AddressInfo } from "node:net"
import { Effect, Layer } from "effect"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { tracesUrl, tracingLayer } from "../../src/observability/Tracing.js"

// A real OTLP/HTTP receiver (JSON encoding) that records what the exporter sends.
interface OtlpSpan {
  readonly name: string
  readonly traceId: string
  readonly spanId: string
  readonly parentSpanId?: string
  readonly attributes?: ReadonlyArray<{ key: string; value: Record<string, unknown> }>
}
const received: Array<{
  path: string
  contentType: string | undefined
  resource: unknown
  spans: Array<OtlpSpan>
}> = []
const readBody = (req: IncomingMessage): Promise<string> =>
  new Promise((resolve) => {
    let body = ""
    req.setEncoding("utf8")
    req.on("data", (chunk: string) => {
      body += chunk
    })
    req.on("end", () => resolve(body))
  })
const server = createServer(async (req, res) => {
  const body = await readBody(req)
  const payload = JSON.parse(body) as {
    resourceSpans: Array<{ resource: unknown; scopeSpans: Array<{ spans: Array<OtlpSpan> }> }>
  }
  for (const rs of payload.resourceSpans) {
    received.push({
      path: req.url ?? "",
      contentType: req.headers["content-type"],
      resource: rs.resource,
      spans: rs.scopeSpans.flatMap((s) => s.spans)
    })
  }
  res.writeHead(200, { "content-type": "application/json" })
  res.end("{}")
})
let endpoint = ""
beforeAll(async () => {
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve))
  endpoint = `http://127.0.0.1:${(server.address() as AddressInfo).port}`
})
afterAll(() => new Promise<void>((resolve) => server.close(() => resolve())))

const attribute = (span: OtlpSpan, key: string): unknown => {
  const value = span.attributes?.find((a) => a.key === key)?.value
  return value === undefined ? undefined : Object.values(value)[0]
}

describe("OTLP tracing", () => {
  it("exports nested spans with their parent links and attributes to the receiver", async () => {
    const program = Effect.gen(function* () {
      yield* Effect.void.pipe(
        Effect.withSpan("kvrelay.test.child", {
          attributes: { "kvrelay.attempt": 3, "kvrelay.outcome": "Events" }
        })
      )
    }).pipe(Effect.withSpan("kvrelay.test.parent", { attributes: { "kvrelay.pool": "p1" } }))
    // Closing the layer's scope flushes the exporter.
    await Effect.runPromise(
      program.pipe(Effect.provide(tracingLayer({ endpoint, serviceName: "kvrelay-test" })), Effect.scoped)
    )
    const spans = received.flatMap((r) => r.spans)
    const parent = spans.find((s) => s.name === "kvrelay.test.parent")
    const child = spans.find((s) => s.name === "kvrelay.test.child")
    expect(parent).toBeDefined()
    expect(child).toBeDefined()
    expect(child!.traceId).toBe(parent!.traceId)
    expect(child!.parentSpanId).toBe(parent!.spanId)
    expect(attribute(parent!, "kvrelay.pool")).toBe("p1")
    expect(String(attribute(child!, "kvrelay.attempt"))).toBe("3")
    expect(attribute(child!, "kvrelay.outcome")).toBe("Events")
    expect(received[0]!.path).toBe("/v1/traces")
    expect(received[0]!.contentType).toContain("application/json")
    expect(JSON.stringify(received[0]!.resource)).toContain("kvrelay-test")
  })

  it("is a no-op without an endpoint", async () => {
    const before = received.length
    await Effect.runPromise(
      Effect.void.pipe(
        Effect.withSpan("kvrelay.test.silent"),
        Effect.provide(tracingLayer({ endpoint: undefined, serviceName: "x" })),
        Effect.scoped
      )
    )
    expect(received.length).toBe(before)
    expect(tracesUrl("http://c:4318/")).toBe("http://c:4318/v1/traces")
    expect(tracesUrl("http://c:4318/v1/traces")).toBe("http://c:4318/v1/traces")
    expect(Layer.isLayer(tracingLayer({ endpoint: "", serviceName: "x" }))).toBe(true)
  })
})
