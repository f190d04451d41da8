import { Either } from "effect"
import { describe, expect, it } from "vitest"
import {
  GlobalSettings,
  globalCommand,
  loadSettings,
  RelaySettings,
  relayCommand,
  relayDiscoveryConfig
} from "../../src/cli/settings.js"

const load = (argv: Array<string>, env: Record<string, string> = {}, files: Record<string, string> = {}) =>
  loadSettings(relayCommand, RelaySettings, {
    argv,
    env,
    readFile: (path) => {
      const text = files[path]
      if (text === undefined) throw new Error("no such file")
      return text
    }
  })

const problems = (
  result: Either.Either<unknown, { problems: ReadonlyArray<string> }>
): ReadonlyArray<string> => (Either.isLeft(result) ? result.left.problems : [])

describe("relay settings", () => {
  it("applies the defaults of PROTOCOL §1", () => {
    const settings = Either.getOrThrow(load(["--dc-id", "us-east"]))
    expect(settings).toMatchObject({
      dcId: "us-east",
      http: "127.0.0.1:8080",
      expectedUniqueBlocks: 1_048_576,
      publicationThreshold: 16,
      publicationDelayMs: 1,
      recoveryAttemptTimeoutMs: 30_000,
      logLevel: "info"
    })
    const discovery = Either.getOrThrow(relayDiscoveryConfig(settings))
    expect(discovery.etcdPrefix).toBe("/kvrelay/v1")
  })

  it("prefers flags over environment over the config file", () => {
    const files = {
      "/c.json": JSON.stringify({ dcId: "from-file", publicationThreshold: 4, http: "0.0.0.0:1" })
    }
    const env = { KVRELAY_PUBLICATION_THRESHOLD: "8", KVRELAY_DC_ID: "from-env" }
    const settings = Either.getOrThrow(load(["--config", "/c.json", "--dc-id=from-flag"], env, files))
    expect(settings.dcId).toBe("from-flag")
    expect(settings.publicationThreshold).toBe(8)
    expect(settings.http).toBe("0.0.0.0:1")
  })

  it("reports every invalid setting by its flag", () => {
    const result = load([
      "--dc-id",
      " padded",
      "--publication-threshold",
      "0",
      "--http",
      "nowhere",
      "--bogus=1"
    ])
    // An unknown flag does not hide the others (PROTOCOL §1 ◆3): every problem, one line each.
    expect(problems(result)).toEqual([
      "--bogus: unknown flag for kvrelay relay",
      "--dc-id: must not have leading or trailing whitespace",
      '--http: expected HOST:PORT, got "nowhere"',
      "--publication-threshold: expected a positive integer, got 0"
    ])
    expect(problems(load([]))).toEqual(["--dc-id: is required"])
    // An unknown flag's value is not reported again as a stray argument.
    expect(problems(load(["--dc-id", "a", "--colour", "blue", "stray"]))).toEqual([
      "--colour: unknown flag for kvrelay relay",
      'unexpected argument "stray" (kvrelay relay takes only --flags)'
    ])
  })

  it("checks across settings run even when another setting is invalid", () => {
    expect(problems(load(["--dc-id", " a", "--tls-cert", "c.pem"]))).toEqual([
      "--dc-id: must not have leading or trailing whitespace",
      "--tls-key: is required with --tls-cert"
    ])
    // A setting that is itself invalid is not also reported as missing.
    expect(problems(load(["--dc-id", " a", "--tls-key", "k.pem", "--tls-cert", ""]))).toEqual([
      "--dc-id: must not have leading or trailing whitespace",
      "--tls-cert: must not be empty"
    ])
  })

  it("an unreadable config file is reported with the other problems, and what it may hold is not 'required'", () => {
    expect(problems(load(["--config", "/missing.json", "--publication-threshold", "0", "--nope"]))).toEqual([
      "--nope: unknown flag for kvrelay relay",
      "--config: cannot read /missing.json: no such file",
      "--publication-threshold: expected a positive integer, got 0"
    ])
  })

  it("names unknown config-file keys and bad discovery backends", () => {
    const files = { "/c.json": JSON.stringify({ dcId: "a", colour: "blue" }) }
    expect(problems(load(["--config", "/c.json"], {}, files))).toEqual([
      '--config: unknown setting "colour" in /c.json'
    ])
    expect(problems(load(["--config", "/missing.json"]))[0]).toMatch(/^--config: cannot read \/missing.json/)
    // The backend is checked with the other settings, so its problem is not hidden by theirs.
    expect(problems(load(["--dc-id", " a", "--discovery", "zookeeper:x"]))).toEqual([
      "--dc-id: must not have leading or trailing whitespace",
      '--discovery: expected "file:PATH" or "etcd:URL[,URL…]", got "zookeeper:x"'
    ])
    expect(problems(load(["--dc-id", "a", "--etcd-prefix", "/kv/"]))).toEqual([
      '--etcd-prefix: must not end with "/", got "/kv/"'
    ])
    // Scope problems span several settings and still come from makeDiscoveryConfig.
    const settings = Either.getOrThrow(load(["--dc-id", "a", "--namespace", "p", "--namespace", "p"]))
    expect(problems(relayDiscoveryConfig(settings))).toEqual([
      '--namespace: value 2: "p" is listed more than once'
    ])
  })
})

describe("global settings", () => {
  const loadGlobal = (argv: Array<string>) =>
    loadSettings(globalCommand, GlobalSettings, { argv, env: {}, readFile: () => "" })

  it("keeps relays in flag order and rejects duplicates and malformed targets", () => {
    const settings = Either.getOrThrow(loadGlobal(["--relay", "us=http://a:1", "--relay", "eu=http://b:2"]))
    expect(settings.relay).toEqual(["us=http://a:1", "eu=http://b:2"])
    expect(settings.http).toBe("127.0.0.1:8090")
    expect(problems(loadGlobal(["--relay", "us=http://a:1", "--relay", "us=http://b:2"]))).toEqual([
      '--relay: relay name "us" is given twice'
    ])
    expect(problems(loadGlobal(["--relay", "nourl"]))[0]).toMatch(/^--relay: expected NAME=URL/)
    expect(problems(loadGlobal([]))).toEqual(["--relay: is required"])
  })
})

describe("--max-request-body-bytes (PROTOCOL §7 ◆3)", () => {
  const files = {
    "/relay.json": JSON.stringify({ dcId: "a", maxRequestBodyBytes: 4096 }),
    "/global.json": JSON.stringify({ relay: ["a=http://a:1"], maxRequestBodyBytes: 4096 })
  }
  const readFile = (path: string) => files[path as keyof typeof files] ?? ""
  const relay = (argv: Array<string>, env: Record<string, string> = {}) =>
    loadSettings(relayCommand, RelaySettings, { argv, env, readFile })
  const global = (argv: Array<string>, env: Record<string, string> = {}) =>
    loadSettings(globalCommand, GlobalSettings, { argv, env, readFile })

  it("defaults to 16 MiB on both servers, and is a flag, a variable and a file key on each", () => {
    expect(Either.getOrThrow(relay(["--dc-id", "a"])).maxRequestBodyBytes).toBe(16_777_216)
    expect(Either.getOrThrow(global(["--relay", "a=http://a:1"])).maxRequestBodyBytes).toBe(16_777_216)
    const limitOf = (
      result: Either.Either<{ readonly maxRequestBodyBytes: number }, { problems: ReadonlyArray<string> }>
    ) => Either.getOrThrow(result).maxRequestBodyBytes
    const loads: Array<
      (
        argv: Array<string>,
        env?: Record<string, string>
      ) => Either.Either<{ readonly maxRequestBodyBytes: number }, { problems: ReadonlyArray<string> }>
    > = [
      (argv, env) => relay(["--dc-id", "a", ...argv], env),
      (argv, env) => global(["--relay", "a=http://a:1", ...argv], env)
    ]
    for (const load of loads) {
      expect(limitOf(load(["--max-request-body-bytes", "1000"]))).toBe(1000)
      expect(limitOf(load([], { KVRELAY_MAX_REQUEST_BODY_BYTES: "2000" }))).toBe(2000)
      expect(problems(load(["--max-request-body-bytes", "0"]))).toEqual([
        "--max-request-body-bytes: expected a positive integer, got 0"
      ])
    }
    expect(Either.getOrThrow(relay(["--config", "/relay.json"])).maxRequestBodyBytes).toBe(4096)
    expect(Either.getOrThrow(global(["--config", "/global.json"])).maxRequestBodyBytes).toBe(4096)
  })
})
