/**
 * The TLS and token settings of `kvrelay relay` and `kvrelay global` (PROTOCOL.md §1 ◆): flag,
 * `KVRELAY_*` and config-file forms, the settings that only work together, and the help texts.
 */

import { Either } from "effect"
import { describe, expect, it } from "vitest"
import { commandHelp } from "../../src/cli/args.js"
import {
  GlobalSettings,
  globalCommand,
  loadSettings,
  RelaySettings,
  relayCommand
} from "../../src/cli/settings.js"

const sources = (
  argv: Array<string>,
  env: Record<string, string> = {},
  files: Record<string, string> = {}
) => ({
  argv,
  env,
  readFile: (path: string) => {
    const text = files[path]
    if (text === undefined) throw new Error("no such file")
    return text
  }
})

const relay = (argv: Array<string>, env?: Record<string, string>, files?: Record<string, string>) =>
  loadSettings(relayCommand, RelaySettings, sources(["--dc-id", "dc", ...argv], env, files))
const global = (argv: Array<string>, env?: Record<string, string>, files?: Record<string, string>) =>
  loadSettings(
    globalCommand,
    GlobalSettings,
    sources(["--relay", "a=https://relay-a:8443", ...argv], env, files)
  )

const problems = (result: Either.Either<unknown, { problems: ReadonlyArray<string> }>) =>
  Either.isLeft(result) ? result.left.problems : []

describe("TLS and token settings", () => {
  it("each comes from its flag, its KVRELAY_ variable or the config file", () => {
    const files = { "/c.json": JSON.stringify({ tlsCert: "/file/cert.pem", tlsKey: "/file/key.pem" }) }
    const settings = Either.getOrThrow(
      relay(
        ["--config", "/c.json", "--tls-client-ca", "/flag/ca.pem"],
        { KVRELAY_AUTH_TOKEN_FILE: "/env/tokens", KVRELAY_TLS_KEY: "/env/key.pem" },
        files
      )
    )
    expect(settings).toMatchObject({
      tlsCert: "/file/cert.pem",
      tlsKey: "/env/key.pem",
      tlsClientCa: "/flag/ca.pem",
      authTokenFile: "/env/tokens"
    })
    const consumer = Either.getOrThrow(
      global(["--relay-cert", "/c.pem", "--relay-key", "/k.pem"], {
        KVRELAY_RELAY_CA: "/ca.pem",
        KVRELAY_RELAY_TOKEN_FILE: "/t"
      })
    )
    expect(consumer).toMatchObject({
      relayCa: "/ca.pem",
      relayCert: "/c.pem",
      relayKey: "/k.pem",
      relayTokenFile: "/t"
    })
    const plain = Either.getOrThrow(relay([]))
    expect([plain.tlsCert, plain.tlsKey, plain.tlsClientCa, plain.authTokenFile]).toEqual([
      undefined,
      undefined,
      undefined,
      undefined
    ])
  })

  it("a certificate without its key, a key without its certificate, a client CA without TLS are errors", () => {
    expect(problems(relay(["--tls-cert", "c"]))).toEqual(["--tls-key: is required with --tls-cert"])
    expect(problems(relay(["--tls-key", "k"]))).toEqual(["--tls-cert: is required with --tls-key"])
    expect(problems(relay(["--tls-client-ca", "ca"]))).toEqual([
      "--tls-cert: is required with --tls-client-ca"
    ])
    expect(problems(relay(["--tls-key", "k", "--tls-client-ca", "ca"]))).toEqual([
      "--tls-cert: is required with --tls-key and --tls-client-ca"
    ])
    expect(problems(global(["--relay-cert", "c", "--tls-key", "k"]))).toEqual([
      "--tls-cert: is required with --tls-key",
      "--relay-key: is required with --relay-cert"
    ])
    expect(problems(global([], { KVRELAY_RELAY_KEY: "k" }))).toEqual([
      "--relay-cert: is required with --relay-key"
    ])
    // A CA alone is fine for the consumer (server verification without a client certificate).
    expect(Either.isRight(global(["--relay-ca", "ca"]))).toBe(true)
    expect(problems(relay(["--tls-cert", ""]))).toEqual(["--tls-cert: must not be empty"])
    // The relay has no --relay-* flags.
    expect(problems(relay(["--relay-ca", "ca"]))[0]).toMatch(/^--relay-ca: unknown flag/)
  })

  it("the help texts list the flags with their environment variables", () => {
    const relayHelp = commandHelp(relayCommand)
    for (const flag of ["tls-cert", "tls-key", "tls-client-ca", "auth-token-file"]) {
      expect(relayHelp).toContain(`--${flag} FILE`)
      expect(relayHelp).toContain(`KVRELAY_${flag.replace(/-/g, "_").toUpperCase()}`)
    }
    const globalHelp = commandHelp(globalCommand)
    for (const flag of [
      "tls-cert",
      "tls-key",
      "tls-client-ca",
      "auth-token-file",
      "relay-ca",
      "relay-cert",
      "relay-key",
      "relay-token-file"
    ]) {
      expect(globalHelp).toContain(`--${flag} FILE`)
    }
  })
})
