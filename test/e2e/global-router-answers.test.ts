/**
 * Answers a router can act on (PROTOCOL §7 ◆3), end to end with real OS processes: one
 * `kvrelay relay` whose workers serve the model `llama` (alias `chat`) and its LoRA adapter
 * `tenant-a`, and two `kvrelay global` processes following it (one with the default body limit,
 * one with a small `--max-request-body-bytes`), asked with plain `fetch`.
 *
 * - `/v1/domains` lists the domain's models with their aliases and adapters.
 * - A model never registered is 404 `MODEL_NOT_FOUND`, an adapter never registered 404
 *   `ADAPTER_NOT_FOUND`; a batch carries such errors at their queries' indices.
 * - Error bodies are short and in the contract's words, whatever the body was; an unknown route
 *   is 404 `NOT_FOUND` and a wrong method 405 with `Allow`, on both servers.
 * - The largest batch PROTOCOL describes (256 queries of 2,048 tokens) is answered; a body over
 *   a small configured limit is 413 `BODY_TOO_LARGE` naming the flag.
 * - Last, the relay is SIGKILLed: its model answers 503 `NO_READY_LANE` (no longer 404), the
 *   consumer logs one WARN for the relay however many times it retries, and one INFO once a new
 *   relay process on the same port is back.
 */

import type { Scope } from "effect"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import {
  ALIAS,
  closeScope,
  depths,
  discoveryOf,
  domains,
  dynamoWorker,
  eventually,
  type KvrelayProcess,
  lanesWhen,
  MODEL,
  makeScope,
  makeTempDir,
  NAMESPACE,
  promptBlocks,
  promptTokens,
  request,
  type SimWorker,
  startGlobal,
  startRelay,
  stopAll,
  type TempDir,
  warmUp,
  writeDiscovery
} from "./globalProcessesHarness.js"

const ADAPTER = "tenant-a"
const P1 = promptBlocks(31, 8)
/** A small limit for the second consumer: one ordinary query fits, a long prompt does not. */
const SMALL_LIMIT = 2048

let scope: Scope.CloseableScope | undefined
let dir: TempDir | undefined
let discoveryPath: string
let relay: KvrelayProcess
let global: KvrelayProcess
let small: KvrelayProcess
let worker: SimWorker

beforeAll(async () => {
  scope = await makeScope()
  dir = makeTempDir()
  worker = await dynamoWorker(scope, "5001")
  discoveryPath = `${dir.path}/dc-a.json`
  writeDiscovery(discoveryPath, await discoveryOf([worker], [ADAPTER]))
  relay = await startRelay("dc-a", discoveryPath)
  ;[global, small] = await Promise.all([
    startGlobal([["dc-a", relay.url]]),
    startGlobal([["dc-a", relay.url]], ["--max-request-body-bytes", String(SMALL_LIMIT)])
  ])
  await warmUp(relay.url, [worker])
  await worker.store(P1)
  for (const consumer of [global, small]) {
    await lanesWhen(consumer.url, "the dc-a lane ready", (lanes) => lanes["dc-a"]?.ready === true, 20_000)
    // A lane can be ready before P1 reaches it; the answers below expect P1 held.
    await eventually(
      "P1 held in dc-a",
      () => depths(consumer.url, P1),
      (d) => d["dc-a"] === 8,
      20_000
    )
  }
}, 90_000)

afterAll(async () => {
  await stopAll()
  if (scope !== undefined) await closeScope(scope)
  dir?.remove()
})

interface ErrorBody {
  readonly reason: string
  readonly message: string
}

const post = (url: string, body: string, timeoutMs = 30_000) =>
  fetch(url, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body,
    signal: AbortSignal.timeout(timeoutMs)
  }).then(async (response) => ({ status: response.status, text: await response.text() }))

const overlapBody = (extra: Record<string, unknown> = {}) =>
  JSON.stringify({ namespace: NAMESPACE, model: MODEL, tokens: promptTokens(P1), ...extra })

/** An error body in the contract's words: short, no schema sentences, no echo of `sent`. */
const expectContractError = (text: string, sent: string, reason: string): ErrorBody => {
  expect(text.length, text).toBeLessThan(1024)
  const body = JSON.parse(text) as ErrorBody
  expect(Object.keys(body).sort()).toEqual(["message", "reason"])
  expect(body.reason).toBe(reason)
  expect(body.message.length).toBeLessThanOrEqual(300)
  expect(body.message).not.toMatch(/Expected |ReadonlyArray|actual |readonly /)
  if (sent.length > 64) expect(body.message).not.toContain(sent.slice(0, 64))
  return body
}

/** Log lines of `proc` at `level` whose message is `message` and that name relay dc-a. */
const logLines = (proc: KvrelayProcess, level: string, message?: string): Array<string> =>
  proc
    .log()
    .split("\n")
    .filter(
      (line) =>
        line.includes(`level=${level}`) &&
        /\brelay=dc-a\b/.test(line) &&
        (message === undefined || line.includes(`message="${message}"`))
    )

describe("global answers a router can act on (PROTOCOL §7 ◆3)", () => {
  it("lists each domain's models with their aliases and adapters", async () => {
    const [domain] = await domains(global.url)
    expect((domain as unknown as { models: unknown }).models).toEqual([
      { namespace: NAMESPACE, model: MODEL, aliases: [ALIAS], adapters: [ADAPTER] }
    ])
  })

  it("tells a model or adapter never registered from a known one, alone and in a batch", async () => {
    const known = await post(`${global.url}/v1/overlap`, overlapBody())
    expect(known.status, known.text).toBe(200)
    const unknownModel = await post(`${global.url}/v1/overlap`, overlapBody({ model: "mistral" }))
    expect(unknownModel.status).toBe(404)
    expect(expectContractError(unknownModel.text, "", "MODEL_NOT_FOUND").message).toContain('"mistral"')
    const otherNamespace = await post(`${global.url}/v1/overlap`, overlapBody({ namespace: "staging" }))
    expect(otherNamespace.status).toBe(404)
    expectContractError(otherNamespace.text, "", "MODEL_NOT_FOUND")
    const unknownAdapter = await post(`${global.url}/v1/overlap`, overlapBody({ loraName: "tenant-b" }))
    expect(unknownAdapter.status).toBe(404)
    expect(expectContractError(unknownAdapter.text, "", "ADAPTER_NOT_FOUND").message).toContain('"tenant-b"')
    const adapter = await post(`${global.url}/v1/overlap`, overlapBody({ loraName: ADAPTER }))
    expect(adapter.status, adapter.text).toBe(200)
    // By alias and by the adapter's served name, the model is known too.
    expect((await post(`${global.url}/v1/overlap`, overlapBody({ model: ALIAS }))).status).toBe(200)

    const query = (extra: Record<string, unknown>) => ({
      namespace: NAMESPACE,
      model: MODEL,
      tokens: promptTokens(P1),
      ...extra
    })
    const batch = await post(
      `${global.url}/v1/overlap/batch`,
      JSON.stringify({
        queries: [
          query({}),
          query({ model: "mistral" }),
          query({ loraName: ADAPTER }),
          query({ loraName: "x" })
        ]
      })
    )
    expect(batch.status, batch.text).toBe(200)
    const answer = JSON.parse(batch.text) as {
      results: Array<Array<{ relay: string; prefixDepth: number }>>
      errors: Array<ErrorBody | null>
    }
    expect(answer.results.map((list) => list.map((r) => [r.relay, r.prefixDepth]))).toEqual([
      [["dc-a", 8]],
      [],
      [["dc-a", 0]],
      []
    ])
    expect(answer.errors).toEqual([
      null,
      { reason: "MODEL_NOT_FOUND", message: expect.stringContaining('"mistral"') },
      null,
      { reason: "ADAPTER_NOT_FOUND", message: expect.stringContaining('"x"') }
    ])
    // A malformed query still fails the whole batch, naming its index.
    const malformed = await post(
      `${global.url}/v1/overlap/batch`,
      JSON.stringify({ queries: [query({}), query({ tokens: [1, -1] })] })
    )
    expect(malformed.status).toBe(400)
    expect(expectContractError(malformed.text, "", "INVALID_REQUEST").message).toMatch(
      /^queries\[1\]: .*tokens\[1\]/
    )
  })

  it("words every refused body briefly in the contract's terms, never echoing it", async () => {
    const garbage = "not json at all; ".repeat(6_000) // ~100 KB
    for (const path of ["/v1/overlap", "/v1/overlap/batch"]) {
      const reply = await post(`${global.url}${path}`, garbage)
      expect(reply.status).toBe(400)
      // Not even the few characters V8's own message would quote.
      expect(expectContractError(reply.text, garbage, "INVALID_REQUEST").message).not.toContain("not json")
    }
    // A bare array where the batch object belongs (~100 KB): named as such, not repeated.
    const bareArray = JSON.stringify(Array.from({ length: 12_000 }, (_, i) => i))
    const bare = await post(`${global.url}/v1/overlap/batch`, bareArray)
    expect(bare.status).toBe(400)
    expect(expectContractError(bare.text, bareArray, "INVALID_REQUEST").message).toMatch(
      /JSON object \{queries: \[overlap body, …\]\}.*got an array/
    )
    const notArray = await post(`${global.url}/v1/overlap/batch`, '{"queries":{}}')
    expect(notArray.status).toBe(400)
    expect(expectContractError(notArray.text, "", "INVALID_REQUEST").message).toBe(
      "queries must be an array of 1 to 256 overlap bodies, got an object"
    )
    // A long value in a field is described, not repeated.
    const longModel = overlapBody({ model: 7, namespace: "x".repeat(5_000) })
    const field = await post(`${global.url}/v1/overlap`, longModel)
    expect(field.status).toBe(400)
    expectContractError(field.text, "x".repeat(100), "INVALID_REQUEST")
    const tokens = await post(`${global.url}/v1/overlap`, overlapBody({ tokens: { a: 1 } }))
    expect(expectContractError(tokens.text, "", "INVALID_REQUEST").message).toBe(
      "tokens must be an array of u32 token ids, got an object"
    )
  })

  it("answers 256 queries of 2,048 tokens in one batch, and names the flag beyond a small limit", async () => {
    const queries = Array.from({ length: 256 }, (_, q) => ({
      namespace: NAMESPACE,
      model: MODEL,
      tokens: Array.from({ length: 2048 }, (_, i) => 100_000 + ((q * 2048 + i) % 900_000))
    }))
    const body = JSON.stringify({ queries })
    expect(body.length).toBeGreaterThan(3_500_000)
    const reply = await post(`${global.url}/v1/overlap/batch`, body, 60_000)
    expect(reply.status, reply.text.slice(0, 300)).toBe(200)
    const answer = JSON.parse(reply.text) as { results: Array<Array<unknown>>; errors: Array<unknown> }
    expect(answer.results).toHaveLength(256)
    expect(answer.errors).toEqual(Array.from({ length: 256 }, () => null))
    expect(answer.results.every((list) => list.length === 1)).toBe(true)

    // The consumer started with --max-request-body-bytes 2048: an ordinary query fits, a longer one not.
    const fits = await post(`${small.url}/v1/overlap`, overlapBody())
    expect(fits.status, fits.text).toBe(200)
    const tooLong = JSON.stringify({ namespace: NAMESPACE, model: MODEL, tokens: queries[0]!.tokens })
    for (const path of ["/v1/overlap", "/v1/overlap/batch"]) {
      const refused = await post(`${small.url}${path}`, tooLong)
      expect(refused.status).toBe(413)
      const error = expectContractError(refused.text, tooLong, "BODY_TOO_LARGE")
      expect(error.message).toContain(`${SMALL_LIMIT} bytes`)
      expect(error.message).toContain("--max-request-body-bytes")
    }
  })

  it("answers an unknown route 404 NOT_FOUND and a wrong method 405 with Allow, on both servers", async () => {
    for (const [base, known, allow] of [
      [global.url, "/v1/domains", "GET"],
      [global.url, "/v1/overlap", "POST"],
      [relay.url, "/v1/catalog", "GET"],
      [relay.url, "/v1/pools/subscribe", "POST"]
    ] as const) {
      const missing = await request(`${base}/v1/no-such-route`)
      expect(missing.status, base).toBe(404)
      expectContractError(missing.text, "", "NOT_FOUND")
      const wrong = await fetch(`${base}${known}`, {
        method: allow === "GET" ? "DELETE" : "GET",
        signal: AbortSignal.timeout(5_000)
      })
      expect(wrong.status, `${base}${known}`).toBe(405)
      expect(wrong.headers.get("allow")).toBe(allow)
      expectContractError(await wrong.text(), "", "INVALID_REQUEST")
    }
  })

  it("answers 503 NO_READY_LANE while the relay is down, warns once, and says once when it is back", async () => {
    const epochs = async () => {
      const stats = await request(`${global.url}/v1/stats`)
      return (stats.body as { relays: Array<{ epochs: number }> }).relays[0]!.epochs
    }
    expect(logLines(global, "WARN")).toEqual([])
    const port = relay.port
    relay.child.kill("SIGKILL")
    await relay.exited

    const down = await eventually(
      "the model answered 503 after the relay died",
      () => post(`${global.url}/v1/overlap`, overlapBody()),
      (reply) => reply.status === 503
    )
    expect(expectContractError(down.text, "", "NO_READY_LANE").message).toContain(`"${MODEL}"`)
    // Still known by alias and adapter; a model never registered stays a 404.
    expect((await post(`${global.url}/v1/overlap`, overlapBody({ model: ALIAS }))).status).toBe(503)
    expect((await post(`${global.url}/v1/overlap`, overlapBody({ loraName: ADAPTER }))).status).toBe(503)
    expect((await post(`${global.url}/v1/overlap`, overlapBody({ model: "mistral" }))).status).toBe(404)

    // Several reconnection attempts later, still one WARN line for the relay.
    const before = await epochs()
    await eventually("three more reconnection attempts", epochs, (n) => n >= before + 3, 20_000)
    const warnings = logLines(global, "WARN")
    expect(warnings, global.logTail()).toHaveLength(1)
    expect(warnings[0]).toContain('message="relay unreachable; retrying"')
    expect(warnings[0]).toMatch(/\berror=/)
    expect(warnings[0]).toMatch(/\bretryInMs=\d+/)

    // A new relay process on the same address: one INFO line, and answers again.
    relay = await startRelay("dc-a", discoveryPath, port)
    await eventually(
      "the model answered again",
      () => post(`${global.url}/v1/overlap`, overlapBody()),
      (reply) => reply.status === 200,
      30_000
    )
    expect(logLines(global, "INFO", "relay reachable again")).toHaveLength(1)
    expect(logLines(global, "WARN")).toHaveLength(1)
  })
})
