/**
 * End to end with real OS processes (PROTOCOL.md §1 ◆): `kvrelay relay` and `kvrelay global`
 * with TLS, mutual TLS and bearer tokens, certificates made by the `openssl` CLI at test time.
 * Settings that only work together are configuration errors naming the flags; a TLS or token
 * file that cannot be used fails startup with status 2 and one line naming its flag; a relay
 * serving HTTPS to clients with a certificate and a token is followed by a global consumer
 * holding the CA, a client certificate and the token, whose lanes become ready.
 */

import { writeFileSync } from "node:fs"
import { join } from "node:path"
import { Either, Schema, type Scope } from "effect"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { CatalogSnapshotJson } from "../../src/protocol/RelayApi.js"
import { httpsRequest, makeTestPki, type TestPki } from "../http/tlsFixtures.js"
import {
  closeScope,
  discoveryOf,
  dynamoWorker,
  eventually,
  MODEL,
  makeScope,
  SERVING,
  startKvrelay,
  stopAll,
  stopKvrelay,
  writeDiscovery
} from "./globalProcessesHarness.js"
import { CLI_TEST_TIMEOUT_MS, type CliResult, cleanup, runKvrelay } from "./relayProcessHarness.js"

const decodeCatalog = Schema.decodeUnknownEither(CatalogSnapshotJson)

let pki: TestPki
let scope: Scope.CloseableScope | undefined

beforeAll(async () => {
  pki = makeTestPki()
  scope = await makeScope()
})

afterAll(async () => {
  await stopAll()
  await cleanup()
  if (scope !== undefined) await closeScope(scope)
  pki?.remove()
})

const emptyDiscovery = (): string => {
  const path = join(pki.dir, `discovery-empty-${Math.random().toString(36).slice(2)}.json`)
  writeDiscovery(path, { cards: [], sources: [] })
  return path
}

const expectOneProblem = (result: CliResult, line: RegExp) => {
  expect(result.code, result.stderr).toBe(2)
  expect(result.stdout).not.toContain('"listening"')
  const lines = result.stderr.trim().split("\n")
  expect(lines, result.stderr).toHaveLength(1)
  expect(lines[0]).toMatch(line)
}

describe.concurrent("TLS and token settings that cannot be used", () => {
  it(
    "settings that only work together name the missing flag (flag, environment or config file)",
    async () => {
      // Every file given exists and every address is free: the missing partner is the one problem.
      const relay = [
        "relay",
        "--dc-id",
        "dc",
        "--discovery",
        `file:${emptyDiscovery()}`,
        "--http",
        "127.0.0.1:0"
      ]
      const global = ["global", "--relay", "a=https://127.0.0.1:1", "--http", "127.0.0.1:0"]
      const [certOnly, keyAndCa, caFromEnv, relayCert, relayKeyFromFile] = await Promise.all([
        runKvrelay([...relay, "--tls-cert", pki.path("server.pem")]),
        runKvrelay([...relay, "--tls-key", pki.path("server.key"), "--tls-client-ca", pki.path("ca.pem")]),
        runKvrelay(relay, { env: { KVRELAY_TLS_CLIENT_CA: pki.path("ca.pem") } }),
        runKvrelay([...global, "--relay-cert", pki.path("client.pem")]),
        (() => {
          const config = join(pki.dir, "global-config.json")
          writeFileSync(
            config,
            JSON.stringify({
              relay: ["a=https://127.0.0.1:1"],
              relayKey: pki.path("client.key"),
              http: "127.0.0.1:0"
            })
          )
          return runKvrelay(["global", "--config", config])
        })()
      ])
      expectOneProblem(certOnly, /^kvrelay relay: --tls-key: is required with --tls-cert$/)
      expectOneProblem(
        keyAndCa,
        /^kvrelay relay: --tls-cert: is required with --tls-key and --tls-client-ca$/
      )
      expectOneProblem(caFromEnv, /^kvrelay relay: --tls-cert: is required with --tls-client-ca$/)
      expectOneProblem(relayCert, /^kvrelay global: --relay-key: is required with --relay-cert$/)
      expectOneProblem(relayKeyFromFile, /^kvrelay global: --relay-cert: is required with --relay-key$/)
    },
    CLI_TEST_TIMEOUT_MS
  )

  it(
    "a TLS or token file that cannot be used fails startup with status 2, naming its flag",
    async () => {
      const missing = join(pki.dir, "absent.pem")
      writeFileSync(pki.path("not-pem.txt"), "hello\n")
      const quiet = ["--log-level", "error", "--http", "127.0.0.1:0"]
      const relayBase = ["relay", "--dc-id", "dc", "--discovery", `file:${emptyDiscovery()}`, ...quiet]
      const globalBase = ["global", "--relay", "a=https://127.0.0.1:1", ...quiet]
      const [noCert, noTokens, badRelayCa, wrongKey, badClientCa] = await Promise.all([
        runKvrelay([...relayBase, "--tls-cert", missing, "--tls-key", pki.path("server.key")]),
        runKvrelay([...relayBase, "--auth-token-file", join(pki.dir, "absent-tokens.txt")]),
        runKvrelay([...globalBase, "--relay-ca", pki.path("not-pem.txt")]),
        runKvrelay([
          ...globalBase,
          "--tls-cert",
          pki.path("server.pem"),
          "--tls-key",
          pki.path("client.key")
        ]),
        runKvrelay([
          ...relayBase,
          "--tls-cert",
          pki.path("server.pem"),
          "--tls-key",
          pki.path("server.key"),
          "--tls-client-ca",
          pki.path("not-pem.txt")
        ])
      ])
      expectOneProblem(noCert, /^kvrelay relay: --tls-cert: cannot read .*absent\.pem: no such file$/)
      expectOneProblem(
        noTokens,
        /^kvrelay relay: --auth-token-file: cannot read .*absent-tokens\.txt: no such file$/
      )
      expectOneProblem(badRelayCa, /^kvrelay global: --relay-ca: .*not-pem\.txt holds no PEM certificate$/)
      expectOneProblem(
        wrongKey,
        /^kvrelay global: --tls-key: .*client\.key is not the private key of the certificate/
      )
      expectOneProblem(
        badClientCa,
        /^kvrelay relay: --tls-client-ca: .*not-pem\.txt holds no PEM certificate$/
      )
    },
    CLI_TEST_TIMEOUT_MS
  )
})

describe("a global consumer following an https relay with mutual TLS and a bearer token", () => {
  it("prints https readiness lines, refuses requests without the token and reaches ready lanes", async () => {
    const worker = await dynamoWorker(scope!, "3001")
    const discovery = join(pki.dir, "discovery-tls.json")
    writeDiscovery(discovery, await discoveryOf([worker]))
    writeFileSync(pki.path("relay-tokens.txt"), "# global consumers\nrelay-token-1\n")
    writeFileSync(pki.path("global-relay-token.txt"), "relay-token-1\n")
    writeFileSync(pki.path("global-tokens.txt"), "router-token\n")
    const relay = await startKvrelay("relay tls", [
      "relay",
      "--dc-id",
      "dc-tls",
      "--discovery",
      `file:${discovery}`,
      "--http",
      "127.0.0.1:0",
      "--tls-cert",
      pki.path("server.pem"),
      "--tls-key",
      pki.path("server.key"),
      "--tls-client-ca",
      pki.path("ca.pem"),
      "--auth-token-file",
      pki.path("relay-tokens.txt")
    ])
    expect(relay.url).toMatch(/^https:\/\/127\.0\.0\.1:\d+$/)
    const global = await startKvrelay("global tls", [
      "global",
      "--relay",
      `dc-tls=${relay.url}`,
      "--http",
      "127.0.0.1:0",
      "--tls-cert",
      pki.path("server.pem"),
      "--tls-key",
      pki.path("server.key"),
      "--auth-token-file",
      pki.path("global-tokens.txt"),
      "--relay-ca",
      pki.path("ca.pem"),
      "--relay-cert",
      pki.path("client.pem"),
      "--relay-key",
      pki.path("client.key"),
      "--relay-token-file",
      pki.path("global-relay-token.txt")
    ])
    expect(global.url).toMatch(/^https:\/\/127\.0\.0\.1:\d+$/)
    const ca = pki.read("ca.pem")
    const client = { ca, cert: pki.read("client.pem"), key: pki.read("client.key") }

    // The relay: a client certificate and the token, except for /healthz.
    expect((await httpsRequest(`${relay.url}/healthz`, client)).status).toBe(200)
    const noToken = await httpsRequest(`${relay.url}/v1/catalog`, client)
    expect(noToken.status).toBe(401)
    expect(JSON.parse(noToken.text)).toMatchObject({ reason: "UNAUTHORIZED" })
    // With both, the catalog itself: a valid document listing the worker's pool.
    const catalog = await eventually(
      "the https relay's catalog to list the worker's pool",
      async () => {
        const answer = await httpsRequest(`${relay.url}/v1/catalog`, {
          ...client,
          headers: { authorization: "Bearer relay-token-1" }
        })
        if (answer.status !== 200)
          throw new Error(`GET /v1/catalog answered ${answer.status}: ${answer.text}`)
        return Either.getOrThrow(decodeCatalog(JSON.parse(answer.text)))
      },
      (found) => found.pools.length > 0,
      30_000
    )
    expect(
      catalog.pools.map((pool) => [
        pool.servingEndpoint.toString(),
        pool.registrations.map((registration) => registration.model)
      ])
    ).toEqual([[`${SERVING.namespace}.${SERVING.component}.${SERVING.endpoint}`, [MODEL]]])

    // The global consumer: TLS without client certificates, its own token.
    expect((await httpsRequest(`${global.url}/healthz`, { ca })).status).toBe(200)
    expect((await httpsRequest(`${global.url}/v1/domains`, { ca })).status).toBe(401)
    const lanes = await eventually(
      "the global consumer's lane on the https relay is ready",
      async () => {
        const answer = await httpsRequest(`${global.url}/v1/domains`, {
          ca,
          headers: { authorization: "Bearer router-token" }
        })
        if (answer.status !== 200)
          throw new Error(`GET /v1/domains answered ${answer.status}: ${answer.text}`)
        const domains = JSON.parse(answer.text) as ReadonlyArray<{
          lanes: ReadonlyArray<{ relay: string; ready: boolean }>
        }>
        return domains.flatMap((d) => d.lanes)
      },
      (found) => found.some((lane) => lane.relay === "dc-tls" && lane.ready),
      30_000
    )
    expect(lanes.filter((lane) => lane.ready).map((lane) => lane.relay)).toEqual(["dc-tls"])

    expect((await stopKvrelay(global)).code).toBe(0)
    expect((await stopKvrelay(relay)).code).toBe(0)
  }, 90_000)
})
