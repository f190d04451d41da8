/**
 * TLS and mutual TLS (PROTOCOL.md §1, §5, §7 ◆) over real sockets, with certificates made by the
 * `openssl` CLI in a temp dir: the material checks of `Tls.ts` name the flag of the file that
 * cannot be used, the relay and global servers speak HTTPS verifiable with the right CA only,
 * and with a client CA a client certificate of that CA is required.
 */

import { writeFileSync } from "node:fs"
import { afterAll, beforeAll, describe, expect, it } from "@effect/vitest"
import { Effect, Either, Layer, Logger, LogLevel, type Scope } from "effect"
import * as GlobalProcess from "../../src/cli/globalProcess.js"
import * as GlobalHttpServer from "../../src/consumer/http/GlobalHttpServer.js"
import { loadClientTls, loadServerTls, type TlsMaterialError } from "../../src/http/Tls.js"
import { startDcRelay } from "../consumer/realRelay.js"
import { httpsFailure, httpsRequest, makeTestPki, type TestPki } from "./tlsFixtures.js"

let pki: TestPki

const VERIFICATION_FAILURES = ["UNABLE_TO_VERIFY_LEAF_SIGNATURE", "SELF_SIGNED_CERT_IN_CHAIN"]

beforeAll(() => {
  pki = makeTestPki()
})

afterAll(() => pki?.remove())

const live = <A, E>(name: string, body: () => Effect.Effect<A, E, Scope.Scope>, timeout = 30_000) =>
  it.scopedLive(name, () => body().pipe(Logger.withMinimumLogLevel(LogLevel.Error)), timeout)

const serverFiles = (clientCa?: string) => ({
  cert: { flag: "--tls-cert", path: pki.path("server.pem") },
  key: { flag: "--tls-key", path: pki.path("server.key") },
  clientCa: clientCa === undefined ? undefined : { flag: "--tls-client-ca", path: pki.path(clientCa) }
})

const failure = <A>(effect: Effect.Effect<A, TlsMaterialError>) =>
  Effect.map(Effect.either(effect), (result) => {
    if (Either.isRight(result)) throw new Error("expected the TLS material to be refused")
    return result.left
  })

describe("TLS material", () => {
  it.effect("a server certificate and key load; a client CA turns on client verification", () =>
    Effect.gen(function* () {
      const plain = yield* loadServerTls(serverFiles())
      expect(plain.cert).toContain("BEGIN CERTIFICATE")
      expect(plain.key).toContain("PRIVATE KEY")
      expect(plain).toMatchObject({ ca: undefined, requestCert: false, rejectUnauthorized: false })
      const mutual = yield* loadServerTls(serverFiles("ca.pem"))
      expect(mutual.ca).toBe(pki.read("ca.pem"))
      expect(mutual).toMatchObject({ requestCert: true, rejectUnauthorized: true })
    })
  )

  it.effect("a file that cannot be used is refused naming its flag and path", () =>
    Effect.gen(function* () {
      writeFileSync(pki.path("garbage.pem"), "not a certificate\n")
      writeFileSync(
        pki.path("broken.pem"),
        "-----BEGIN CERTIFICATE-----\nTUlJQm9nZ3Vz\n-----END CERTIFICATE-----\n"
      )
      const missing = yield* failure(
        loadServerTls({ ...serverFiles(), cert: { flag: "--tls-cert", path: pki.path("nope.pem") } })
      )
      expect(missing.flag).toBe("--tls-cert")
      expect(missing.message).toBe(`--tls-cert: cannot read ${pki.path("nope.pem")}: no such file`)

      const notPem = yield* failure(
        loadServerTls({ ...serverFiles(), cert: { flag: "--tls-cert", path: pki.path("garbage.pem") } })
      )
      expect(notPem.message).toBe(`--tls-cert: ${pki.path("garbage.pem")} holds no PEM certificate`)

      const broken = yield* failure(
        loadServerTls({ ...serverFiles(), cert: { flag: "--tls-cert", path: pki.path("broken.pem") } })
      )
      expect(broken.message).toMatch(/^--tls-cert: .*broken\.pem: certificate 1 is invalid/)

      const notKey = yield* failure(
        loadServerTls({ ...serverFiles(), key: { flag: "--tls-key", path: pki.path("server.pem") } })
      )
      expect(notKey.flag).toBe("--tls-key")
      expect(notKey.message).toMatch(/holds no usable private key/)

      const mismatched = yield* failure(
        loadServerTls({ ...serverFiles(), key: { flag: "--tls-key", path: pki.path("client.key") } })
      )
      expect(mismatched.flag).toBe("--tls-key")
      expect(mismatched.message).toContain("is not the private key of the certificate in --tls-cert")

      const badCa = yield* failure(loadServerTls(serverFiles("garbage.pem")))
      expect(badCa.flag).toBe("--tls-client-ca")

      const relayCa = yield* failure(
        loadClientTls({ ca: { flag: "--relay-ca", path: pki.path("nope.pem") } })
      )
      expect(relayCa.message).toMatch(/^--relay-ca: cannot read .*nope\.pem: no such file$/)
      const relayKey = yield* failure(
        loadClientTls({
          cert: { flag: "--relay-cert", path: pki.path("client.pem") },
          key: { flag: "--relay-key", path: pki.path("other-client.key") }
        })
      )
      expect(relayKey.flag).toBe("--relay-key")
      const client = yield* loadClientTls({
        ca: { flag: "--relay-ca", path: pki.path("ca.pem") },
        cert: { flag: "--relay-cert", path: pki.path("client.pem") },
        key: { flag: "--relay-key", path: pki.path("client.key") }
      })
      expect(client.ca).toBe(pki.read("ca.pem"))
      expect(client.cert).toBe(pki.read("client.pem"))
    })
  )
})

describe("relay HTTP API over TLS", () => {
  live("serves https: verifiable with its CA, refused by a client trusting another CA or the system's", () =>
    Effect.gen(function* () {
      const tls = yield* loadServerTls(serverFiles())
      const relay = yield* startDcRelay("east", { tls })
      expect(relay.url).toMatch(/^https:\/\/127\.0\.0\.1:\d+$/)
      const answer = yield* Effect.promise(() =>
        httpsRequest(`${relay.url}/v1/relay`, { ca: pki.read("ca.pem") })
      )
      expect(answer.status).toBe(200)
      expect(JSON.parse(answer.text)).toMatchObject({ protocolVersion: 1, dcName: "east" })
      // The certificate's DNS name verifies as well as its IP address.
      const byName = yield* Effect.promise(() =>
        httpsRequest(`https://localhost:${relay.port}/healthz`, { ca: pki.read("ca.pem") })
      )
      expect(byName.status).toBe(200)

      const wrongCa = yield* Effect.promise(() =>
        httpsFailure(`${relay.url}/v1/relay`, { ca: pki.read("other-ca.pem") })
      )
      expect((wrongCa as NodeJS.ErrnoException).code).toBe("UNABLE_TO_VERIFY_LEAF_SIGNATURE")
      const systemCas = yield* Effect.promise(() => httpsFailure(`${relay.url}/v1/relay`))
      expect((systemCas as NodeJS.ErrnoException).code).toBe("UNABLE_TO_VERIFY_LEAF_SIGNATURE")
      // Plain HTTP on the TLS port gets no API answer.
      const plain = yield* Effect.promise(() =>
        fetch(`${relay.url.replace("https:", "http:")}/v1/relay`).then(
          (response) => response.status,
          (error: unknown) => error
        )
      )
      expect(plain).not.toBe(200)
    })
  )

  live("with a client CA, a client certificate of that CA is required (mutual TLS)", () =>
    Effect.gen(function* () {
      const tls = yield* loadServerTls(serverFiles("ca.pem"))
      const relay = yield* startDcRelay("east", { tls })
      const ca = pki.read("ca.pem")
      const withCert = yield* Effect.promise(() =>
        httpsRequest(`${relay.url}/v1/relay`, {
          ca,
          cert: pki.read("client.pem"),
          key: pki.read("client.key")
        })
      )
      expect(withCert.status).toBe(200)

      const without = yield* Effect.promise(() => httpsFailure(`${relay.url}/v1/relay`, { ca }))
      expect(without.message).toMatch(/certificate required|socket hang up|ECONNRESET/i)
      const stranger = yield* Effect.promise(() =>
        httpsFailure(`${relay.url}/v1/relay`, {
          ca,
          cert: pki.read("other-client.pem"),
          key: pki.read("other-client.key")
        })
      )
      expect(stranger.message).toMatch(/unknown ca|socket hang up|ECONNRESET/i)

      // Refused handshakes leave the server serving.
      const again = yield* Effect.promise(() =>
        httpsRequest(`${relay.url}/healthz`, {
          ca,
          cert: pki.read("client.pem"),
          key: pki.read("client.key")
        })
      )
      expect(again.status).toBe(200)
    })
  )
})

describe("global HTTP API over TLS", () => {
  live("serves https with mutual TLS and reports an https URL", () =>
    Effect.gen(function* () {
      const tls = yield* loadServerTls(serverFiles("ca.pem"))
      const relay = yield* startDcRelay("east")
      const context = yield* Layer.build(
        GlobalProcess.layer(
          { relays: [{ name: "east", url: relay.url }] },
          { host: "127.0.0.1", port: 0, tls }
        )
      )
      const url = yield* GlobalHttpServer.serverUrlOf(true).pipe(Effect.provide(context))
      expect(url).toMatch(/^https:\/\/127\.0\.0\.1:\d+$/)
      const ca = pki.read("ca.pem")
      const client = { ca, cert: pki.read("client.pem"), key: pki.read("client.key") }
      const healthz = yield* Effect.promise(() => httpsRequest(`${url}/healthz`, client))
      expect(healthz).toMatchObject({ status: 200, text: "ok" })
      const domains = yield* Effect.promise(() => httpsRequest(`${url}/v1/domains`, client))
      expect(domains.status).toBe(200)
      const without = yield* Effect.promise(() => httpsFailure(`${url}/healthz`, { ca }))
      expect(without).toBeInstanceOf(Error)
      const wrongCa = yield* Effect.promise(() =>
        httpsFailure(`${url}/healthz`, { ...client, ca: pki.read("other-ca.pem") })
      )
      // With a client CA the server also sends that CA with its chain, hence a self-signed chain.
      expect(VERIFICATION_FAILURES).toContain((wrongCa as NodeJS.ErrnoException).code)
    })
  )
})
