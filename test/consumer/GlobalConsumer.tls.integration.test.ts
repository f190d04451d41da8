/**
 * The global consumer against relays that require TLS, a client certificate and a bearer token
 * (PROTOCOL.md §7 ◆), over real sockets: real relays (registry, publication source, relay HTTP
 * server over HTTPS) and the production consumer composition (`layerGlobal`) with the CA, the
 * client certificate and the token of `--relay-token-file`, re-read when the file changes.
 */

import { writeFileSync } from "node:fs"
import { afterAll, beforeAll, describe, expect, it } from "@effect/vitest"
import { Context, Effect, Layer, Logger, LogLevel, type Scope, Stream } from "effect"
import * as GlobalProcess from "../../src/cli/globalProcess.js"
import { GlobalConsumer } from "../../src/consumer/GlobalConsumer.js"
import { type TokenFile, watchTokenFile } from "../../src/http/BearerAuth.js"
import { type ClientTlsOptions, loadClientTls, loadServerTls } from "../../src/http/Tls.js"
import { makeTestPki, type TestPki } from "../http/tlsFixtures.js"
import { blockHashes, converged, eventually } from "./consumerHarness.js"
import { domainOf } from "./fakeRelay.js"
import { startDcRelay } from "./realRelay.js"

let pki: TestPki
beforeAll(() => {
  pki = makeTestPki()
})
afterAll(() => pki?.remove())

const live = <A, E>(name: string, body: () => Effect.Effect<A, E, Scope.Scope>, timeout = 40_000) =>
  it.scopedLive(name, () => body().pipe(Logger.withMinimumLogLevel(LogLevel.Error)), timeout)

const DOMAIN = domainOf(1)

/** The relay's mutual-TLS server material and a token file holding `token`. */
const secureRelay = (dcName: string, token: string) =>
  Effect.gen(function* () {
    const tls = yield* loadServerTls({
      cert: { flag: "--tls-cert", path: pki.path("server.pem") },
      key: { flag: "--tls-key", path: pki.path("server.key") },
      clientCa: { flag: "--tls-client-ca", path: pki.path("ca.pem") }
    })
    const tokenPath = pki.path(`${dcName}-relay-tokens.txt`)
    writeFileSync(tokenPath, `# routers and global consumers\n${token}\n`)
    const auth = yield* watchTokenFile("--auth-token-file", tokenPath)
    const relay = yield* startDcRelay(dcName, { tls, auth })
    return { relay, auth, tokenPath }
  })

const consumerTls = (): Effect.Effect<ClientTlsOptions, unknown> =>
  loadClientTls({
    ca: { flag: "--relay-ca", path: pki.path("ca.pem") },
    cert: { flag: "--relay-cert", path: pki.path("client.pem") },
    key: { flag: "--relay-key", path: pki.path("client.key") }
  })

const startSecureConsumer = (relays: ReadonlyArray<{ name: string; url: string }>, tokens: TokenFile) =>
  Effect.gen(function* () {
    const context = yield* Layer.build(
      GlobalProcess.layer(
        { relays },
        {
          host: "127.0.0.1",
          port: 0,
          relayTls: yield* consumerTls(),
          client: { bearerToken: tokens.first }
        }
      )
    )
    return Context.get(context, GlobalConsumer)
  })

const revisionReached = (tokens: TokenFile, revision: number) =>
  tokens.tokens.changes.pipe(
    Stream.filter((set) => set.revision >= revision),
    Stream.runHead,
    Effect.timeout("15 seconds"),
    Effect.orDie
  )

describe("global consumer against https relays with bearer tokens", () => {
  live("presents the CA, its client certificate and the token; the lanes become ready and converge", () =>
    Effect.gen(function* () {
      const east = yield* secureRelay("east", "east-relay-token")
      const pool = yield* east.relay.attach(DOMAIN, "prod.backend.generate")
      yield* pool.store("1", blockHashes(1, 24))
      const clientTokens = pki.path("global-relay-token.txt")
      writeFileSync(clientTokens, "east-relay-token\n")
      const tokens = yield* watchTokenFile("--relay-token-file", clientTokens)
      const consumer = yield* startSecureConsumer([{ name: "east", url: east.relay.url }], tokens)

      yield* eventually(
        "the https lane is ready and holds the producer's words",
        converged(consumer, "east", pool),
        20_000
      )
      // Deltas keep flowing over the authenticated stream.
      yield* pool.store("2", blockHashes(2, 10))
      yield* eventually("the delta arrived", converged(consumer, "east", pool), 20_000)
      const status = consumer.relays()[0]!
      expect(status.connected).toBe(true)
      expect(status.url).toMatch(/^https:/)
    })
  )

  live("a wrong token is refused with 401 and the consumer retries; fixing the token file recovers", () =>
    Effect.gen(function* () {
      const east = yield* secureRelay("east", "the-right-token")
      const pool = yield* east.relay.attach(DOMAIN, "prod.backend.generate")
      yield* pool.store("1", blockHashes(3, 12))
      const clientTokens = pki.path("global-wrong-token.txt")
      writeFileSync(clientTokens, "a-wrong-token\n")
      const tokens = yield* watchTokenFile("--relay-token-file", clientTokens)
      const consumer = yield* startSecureConsumer([{ name: "east", url: east.relay.url }], tokens)

      yield* eventually(
        "the relay's 401 is the consumer's last error",
        Effect.sync(() => /401 UNAUTHORIZED/.test(consumer.relays()[0]!.lastError ?? "")),
        20_000
      )
      expect(consumer.relays()[0]!.connected).toBe(false)
      expect(yield* converged(consumer, "east", pool)).toBe(false)

      // The token file is re-read; the next reconnection (500 ms backoff at first) presents it.
      writeFileSync(clientTokens, "the-right-token\n")
      yield* revisionReached(tokens, 2)
      yield* eventually("the lane is ready with the new token", converged(consumer, "east", pool), 30_000)
    })
  )
})
