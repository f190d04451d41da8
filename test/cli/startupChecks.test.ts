/**
 * The startup resources of `relay`, `global`, `demo` and `simulate` (PROTOCOL §1 ◆3): every
 * unusable one is reported, one line each naming its flag, not only the first. Real files, real
 * sockets and openssl-made TLS material.
 */

import { chmodSync, mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs"
import * as net from "node:net"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { afterAll, beforeAll, describe, expect, it } from "@effect/vitest"
import { Effect } from "effect"
import {
  demoStartupProblems,
  discoveryDocument,
  globalStartupProblems,
  listenable,
  relayStartupProblems,
  serverTlsFiles,
  simulateStartupProblems,
  tokenFile,
  writableFile
} from "../../src/cli/startupChecks.js"
import { makeTestPki, type TestPki } from "../http/tlsFixtures.js"
import { demoPortsWithOneBusy } from "./busyPorts.js"

let dir: string
let pki: TestPki
const at = (name: string) => join(dir, name)

beforeAll(() => {
  dir = mkdtempSync(join(tmpdir(), "kvrelay-startup-"))
  pki = makeTestPki()
  writeFileSync(at("empty.json"), JSON.stringify({ version: 1, cards: [], sources: [] }))
  writeFileSync(at("invalid.json"), JSON.stringify({ version: 2, cards: [], sources: [] }))
  writeFileSync(at("tokens.txt"), "# a comment\nsecret\n")
  writeFileSync(at("no-tokens.txt"), "# only a comment\n\n")
  writeFileSync(at("not-pem.txt"), "hello\n")
  mkdirSync(at("a-directory"))
}, 60_000)

afterAll(() => {
  rmSync(dir, { recursive: true, force: true })
  pki.remove()
})

/** A port another socket holds for the duration of `use`. */
const withBusyPort = <A>(use: (port: number) => Effect.Effect<A>) =>
  Effect.acquireUseRelease(
    Effect.async<net.Server>((resume) => {
      const server = net.createServer()
      server.listen(0, "127.0.0.1", () => resume(Effect.succeed(server)))
    }),
    (server) => use((server.address() as net.AddressInfo).port),
    (server) =>
      Effect.async<void>((resume) => {
        server.close(() => resume(Effect.void))
      })
  )

describe("startup resources, one check at a time", () => {
  it.effect("a usable discovery document, TLS pair, token file and free address give no problem", () =>
    Effect.gen(function* () {
      expect(
        yield* relayStartupProblems({
          discovery: `file:${at("empty.json")}`,
          http: "127.0.0.1:0",
          tlsCert: pki.path("server.pem"),
          tlsKey: pki.path("server.key"),
          tlsClientCa: pki.path("ca.pem"),
          authTokenFile: at("tokens.txt")
        })
      ).toEqual([])
      // etcd is no startup resource: a relay serves while it connects.
      expect(yield* discoveryDocument("etcd:http://127.0.0.1:9")).toEqual([])
    })
  )

  it.effect("a missing or invalid discovery document names --discovery and the file", () =>
    Effect.gen(function* () {
      const [missing] = yield* discoveryDocument(`file:${at("absent.json")}`)
      expect(missing).toMatch(/^--discovery: file:.*absent\.json: cannot read the initial document: /)
      const [invalid] = yield* discoveryDocument(`file:${at("invalid.json")}`)
      expect(invalid).toMatch(/^--discovery: file:.*invalid\.json: the initial document is invalid: /)
    })
  )

  it.effect("an address in use or not on this host names the flag and the address", () =>
    withBusyPort((port) =>
      Effect.gen(function* () {
        expect(yield* listenable("--http", `127.0.0.1:${port}`)).toEqual([
          `--http: cannot listen on 127.0.0.1:${port}: the address is already in use`
        ])
        // 203.0.113.0/24 is documentation space (RFC 5737): on no interface of this host.
        expect(yield* listenable("--http", "203.0.113.7:8080")).toEqual([
          "--http: cannot listen on 203.0.113.7:8080: the address is not available on this host"
        ])
        expect(yield* listenable("--http", "127.0.0.1:0")).toEqual([])
      })
    )
  )

  it.effect("token files: missing, empty of tokens", () =>
    Effect.gen(function* () {
      expect(yield* tokenFile("--auth-token-file", at("tokens.txt"))).toEqual([])
      const [missing] = yield* tokenFile("--auth-token-file", at("absent.txt"))
      expect(missing).toMatch(/^--auth-token-file: .*absent\.txt/)
      const [empty] = yield* tokenFile("--relay-token-file", at("no-tokens.txt"))
      expect(empty).toMatch(/^--relay-token-file: /)
    })
  )

  it.effect("TLS: a missing certificate and a missing key are both reported, then a mismatched pair", () =>
    Effect.gen(function* () {
      expect(yield* serverTlsFiles({ tlsCert: at("absent.pem"), tlsKey: at("absent.key") })).toEqual([
        `--tls-cert: cannot read ${at("absent.pem")}: no such file`,
        `--tls-key: cannot read ${at("absent.key")}: no such file`
      ])
      expect(
        yield* serverTlsFiles({
          tlsCert: at("not-pem.txt"),
          tlsKey: at("a-directory"),
          tlsClientCa: at("absent-ca.pem")
        })
      ).toEqual([
        `--tls-cert: ${at("not-pem.txt")} holds no PEM certificate`,
        `--tls-client-ca: cannot read ${at("absent-ca.pem")}: no such file`,
        `--tls-key: cannot read ${at("a-directory")}: is a directory`
      ])
      // Each file usable on its own, but the key is another certificate's.
      const [mismatch] = yield* serverTlsFiles({
        tlsCert: pki.path("server.pem"),
        tlsKey: pki.path("client.key")
      })
      expect(mismatch).toMatch(
        /^--tls-key: .*client\.key is not the private key of the certificate in --tls-cert/
      )
    })
  )

  it.effect("a file to write needs an existing, writable directory and must not be a directory", () =>
    Effect.gen(function* () {
      expect(yield* writableFile("--discovery-file", at("new.json"))).toEqual([])
      expect(yield* writableFile("--discovery-file", at("nowhere/new.json"))).toEqual([
        `--discovery-file: cannot write ${at("nowhere/new.json")}: no directory ${at("nowhere")}`
      ])
      expect(yield* writableFile("--discovery-file", at("a-directory"))).toEqual([
        `--discovery-file: cannot write ${at("a-directory")}: it is a directory`
      ])
      expect(yield* writableFile("--discovery-file", at("tokens.txt/x.json"))).toEqual([
        `--discovery-file: cannot write ${at("tokens.txt/x.json")}: ${at("tokens.txt")} is not a directory`
      ])
      if (process.getuid?.() !== 0) {
        const readOnly = at("read-only")
        mkdirSync(readOnly)
        chmodSync(readOnly, 0o555)
        expect(yield* writableFile("--discovery-file", join(readOnly, "x.json"))).toEqual([
          `--discovery-file: cannot write ${join(readOnly, "x.json")}: ${readOnly} is not writable`
        ])
      }
    })
  )
})

describe("startup resources of a command, all at once", () => {
  it.effect("relay: the discovery document, the address, both TLS files and the token file", () =>
    withBusyPort((port) =>
      Effect.gen(function* () {
        const problems = yield* relayStartupProblems({
          discovery: `file:${at("absent.json")}`,
          http: `127.0.0.1:${port}`,
          tlsCert: at("absent.pem"),
          tlsKey: at("absent.key"),
          authTokenFile: at("absent-tokens.txt")
        })
        expect(problems.map((p) => p.split(":", 1)[0])).toEqual([
          "--discovery",
          "--http",
          "--tls-cert",
          "--tls-key",
          "--auth-token-file"
        ])
      })
    )
  )

  it.effect("global: its own TLS and tokens and those towards the relays", () =>
    Effect.gen(function* () {
      const problems = yield* globalStartupProblems({
        http: "203.0.113.7:8090",
        tlsCert: pki.path("server.pem"),
        tlsKey: at("absent.key"),
        authTokenFile: at("no-tokens.txt"),
        relayCa: at("not-pem.txt"),
        relayCert: pki.path("client.pem"),
        relayKey: pki.path("client.key"),
        relayTokenFile: at("absent-tokens.txt")
      })
      expect(problems.map((p) => p.split(":", 1)[0])).toEqual([
        "--http",
        "--tls-key",
        "--auth-token-file",
        "--relay-ca",
        "--relay-token-file"
      ])
    })
  )

  it.effect("demo: each of its three ports", () =>
    Effect.acquireUseRelease(
      Effect.promise(() => demoPortsWithOneBusy(1)),
      ({ base, busyPort }) =>
        Effect.gen(function* () {
          // The busy port is the demo's second (the second relay's).
          expect(yield* demoStartupProblems({ httpPort: base })).toEqual([
            `--http-port: cannot listen on 127.0.0.1:${busyPort}: the address is already in use`
          ])
          expect(yield* demoStartupProblems({ httpPort: 0 })).toEqual([])
        }),
      ({ release }) => Effect.promise(release)
    )
  )

  it.effect("simulate: the discovery file's directory and the bind host", () =>
    Effect.gen(function* () {
      expect(
        yield* simulateStartupProblems({ discoveryFile: at("nowhere/d.json"), bindHost: "203.0.113.7" })
      ).toEqual([
        `--discovery-file: cannot write ${at("nowhere/d.json")}: no directory ${at("nowhere")}`,
        "--bind-host: cannot bind 203.0.113.7: the address is not available on this host"
      ])
      expect(yield* simulateStartupProblems({ discoveryFile: at("d.json"), bindHost: "0.0.0.0" })).toEqual([])
    })
  )
})
