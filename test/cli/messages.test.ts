/**
 * Messages a user meets, one per problem and in the user's terms: numbers given as words, config
 * keys spelled as flags, a malformed overlap `poolDomain`, help texts whose defaults must be the
 * defaults, and `kvrelay bench --only` with a suite that does not exist.
 */

import { Either } from "effect"
import { describe, expect, it } from "vitest"
import { suiteNames, unknownSuites } from "../../bench/main.js"
import { type CommandSpec, closestName, keyOf } from "../../src/cli/args.js"
import {
  BenchSettings,
  benchCommand,
  DemoSettings,
  demoCommand,
  GlobalSettings,
  globalCommand,
  loadSettings,
  RelaySettings,
  relayCommand,
  relayDiscoveryConfig,
  SimulateSettings,
  simulateCommand
} from "../../src/cli/settings.js"
import { parseOverlapRequest } from "../../src/consumer/http/GlobalHttpServer.js"
import { CLI_TEST_TIMEOUT_MS, runKvrelay } from "../e2e/relayProcessHarness.js"

const problems = (result: Either.Either<unknown, { problems: ReadonlyArray<string> }>) =>
  Either.isLeft(result) ? result.left.problems : []

const loadRelay = (
  argv: ReadonlyArray<string>,
  options: { env?: Record<string, string>; file?: unknown } = {}
) =>
  loadSettings(relayCommand, RelaySettings, {
    argv,
    env: options.env ?? {},
    readFile: () => JSON.stringify(options.file)
  })

describe("numbers", () => {
  it("a word where a number belongs names the flag, what it takes and what it got", () => {
    const expected = '--publication-threshold: expected a positive integer, got "zero"'
    expect(problems(loadRelay(["--dc-id", "a", "--publication-threshold", "zero"]))).toEqual([expected])
    expect(problems(loadRelay(["--dc-id", "a", "--publication-threshold=zero"]))).toEqual([expected])
    expect(problems(loadRelay(["--dc-id", "a"], { env: { KVRELAY_PUBLICATION_THRESHOLD: "zero" } }))).toEqual(
      [expected]
    )
    expect(
      problems(loadRelay(["--dc-id", "a", "--config", "c.json"], { file: { publicationThreshold: "zero" } }))
    ).toEqual([expected])
  })

  it("numbers out of range read as numbers; other JSON values as JSON", () => {
    expect(problems(loadRelay(["--dc-id", "a", "--expected-unique-blocks", "0"]))).toEqual([
      "--expected-unique-blocks: expected a positive integer, got 0"
    ])
    expect(problems(loadRelay(["--dc-id", "a", "--expected-unique-blocks", "1.5"]))).toEqual([
      "--expected-unique-blocks: expected a positive integer, got 1.5"
    ])
    expect(problems(loadRelay(["--dc-id", "a", "--expected-unique-blocks", ""]))).toEqual([
      '--expected-unique-blocks: expected a positive integer, got ""'
    ])
    expect(
      problems(
        loadRelay(["--dc-id", "a", "--config", "c.json"], {
          file: { publicationDelayMs: true, recoveryAttemptTimeoutMs: [1] }
        })
      )
    ).toEqual([
      "--publication-delay-ms: expected a positive integer, got true",
      "--recovery-attempt-timeout-ms: expected a positive integer, got [1]"
    ])
    // Whatever the spelling of a valid number, it is that number.
    const settings = Either.getOrThrow(
      loadRelay(["--dc-id", "a", "--publication-threshold", " 8 ", "--expected-unique-blocks", "1e3"])
    )
    expect(settings.publicationThreshold).toBe(8)
    expect(settings.expectedUniqueBlocks).toBe(1000)
    const demo = loadSettings(demoCommand, DemoSettings, {
      argv: ["--http-port", "eighty"],
      env: {},
      readFile: () => ""
    })
    expect(problems(demo)).toEqual(['--http-port: expected a port 0..65000, got "eighty"'])
  })
})

describe("config file keys", () => {
  it('a key spelled like its flag ("dc-id") is one problem that names the file and the key it meant', () => {
    expect(problems(loadRelay(["--config", "/etc/kvrelay.json"], { file: { "dc-id": "us-east" } }))).toEqual([
      '--config: unknown setting "dc-id" in /etc/kvrelay.json, did you mean "dcId"?'
    ])
    expect(
      problems(loadRelay(["--config", "c.json"], { file: { dcId: "a", publication_threshold: 4 } }))
    ).toEqual([
      '--config: unknown setting "publication_threshold" in c.json, did you mean "publicationThreshold"?'
    ])
    expect(
      problems(loadRelay(["--config", "c.json"], { file: { dcId: "a", expectedUniqueBlock: 4 } }))
    ).toEqual([
      '--config: unknown setting "expectedUniqueBlock" in c.json, did you mean "expectedUniqueBlocks"?'
    ])
  })

  it("a key like no setting gets no guess, and the other problems are still reported", () => {
    expect(
      problems(loadRelay(["--config", "c.json"], { file: { colour: "blue", publicationThreshold: 0 } }))
    ).toEqual([
      '--config: unknown setting "colour" in c.json',
      "--dc-id: is required",
      "--publication-threshold: expected a positive integer, got 0"
    ])
  })

  it("guesses only close names", () => {
    const known = ["dcId", "http", "otlp", "logLevel"]
    expect(closestName("DC_ID", known)).toBe("dcId")
    expect(closestName("log-level", known)).toBe("logLevel")
    expect(closestName("htp", known)).toBe("http")
    expect(closestName("colour", known)).toBeUndefined()
    expect(closestName("ab", known)).toBeUndefined()
  })
})

describe("overlap poolDomain", () => {
  const domain = {
    cacheSemantics: { digest: "7d31eb9019357572470605f4a8be687e", source: "default_derived" },
    routingScope: { digest: "18270d3ba03effaec8d167ba02c7752d", source: "default_derived" }
  }
  const query = (poolDomain: unknown) =>
    parseOverlapRequest(JSON.stringify({ poolDomain, localBlockHashes: ["1"] }))

  it("a malformed poolDomain is one short line naming the field and the shape it takes", () => {
    expect(query("x")).toBe(
      'poolDomain: expected {cacheSemantics: {digest, source}, routingScope: {digest, source}}, got "x"'
    )
    expect(query({ ...domain, cacheSemantics: "ab" })).toBe(
      'poolDomain.cacheSemantics: expected {digest, source}, got "ab"'
    )
    expect(query({ ...domain, routingScope: { ...domain.routingScope, source: "nope" } })).toBe(
      'poolDomain.routingScope.source: expected "default_derived" or "explicit", got "nope"'
    )
    expect(query({ cacheSemantics: domain.cacheSemantics })).toBe('missing field "poolDomain.routingScope"')
    // No message renders the schema's types or runs on with the whole value.
    for (const message of [query("x"), query({ ...domain, cacheSemantics: "a".repeat(500) })]) {
      expect(message).not.toMatch(/readonly|Expected/)
      expect(String(message).length).toBeLessThan(200)
    }
    expect(typeof query(domain)).toBe("object")
  })
})

/** `(default X)` in a flag's help, if it states one. */
const statedDefault = (help: string): string | undefined => /\(default (.+?)(?=: |\))/.exec(help)?.[1]

describe("help texts", () => {
  const decoded: ReadonlyArray<readonly [CommandSpec, Record<string, unknown>]> = [
    [relayCommand, Either.getOrThrow(loadRelay(["--dc-id", "a"]))],
    [
      globalCommand,
      Either.getOrThrow(
        loadSettings(globalCommand, GlobalSettings, {
          argv: ["--relay", "a=http://a:1"],
          env: {},
          readFile: () => ""
        })
      )
    ],
    [
      demoCommand,
      Either.getOrThrow(loadSettings(demoCommand, DemoSettings, { argv: [], env: {}, readFile: () => "" }))
    ],
    [
      simulateCommand,
      Either.getOrThrow(
        loadSettings(simulateCommand, SimulateSettings, {
          argv: ["--etcd", "http://etcd:2379"],
          env: {},
          readFile: () => ""
        })
      )
    ],
    [
      benchCommand,
      Either.getOrThrow(loadSettings(benchCommand, BenchSettings, { argv: [], env: {}, readFile: () => "" }))
    ]
  ]

  it("every default a help text states is the default the command uses", () => {
    const relayDiscovery = Either.getOrThrow(relayDiscoveryConfig(decoded[0]![1] as RelaySettings))
    let checked = 0
    for (const [spec, settings] of decoded) {
      for (const flag of spec.flags) {
        const stated = statedDefault(flag.help)
        if (stated === undefined) continue
        // The etcd prefix's default is applied where the discovery config is built.
        const actual =
          flag.name === "etcd-prefix" && spec === relayCommand
            ? relayDiscovery.etcdPrefix
            : settings[keyOf(flag.name)]
        expect(String(actual), `kvrelay ${spec.name} --${flag.name}`).toBe(stated)
        checked++
      }
    }
    expect(checked).toBeGreaterThan(15)
  })

  it("kvrelay demo --help states the demo's own log level default, warning", () => {
    const help = demoCommand.flags.find((f) => f.name === "log-level")!.help
    expect(statedDefault(help)).toBe("warning")
    expect(decoded[2]![1]["logLevel"]).toBe("warning")
  })
})

describe("kvrelay bench --only", () => {
  it("knows every suite by its exact name", () => {
    expect(suiteNames).toContain("e2e")
    expect(suiteNames).toContain("pool_actor")
    expect(unknownSuites(["e2e", "pool_actor"])).toEqual([])
    expect(unknownSuites(["nosuch", "e2e", "pool"])).toEqual(["nosuch", "pool"])
  })

  it(
    "an unknown suite exits 2 with one line naming it and listing the suites, and runs nothing",
    async () => {
      const result = await runKvrelay(["bench", "--only", "nosuch,e2e"])
      expect(result.code).toBe(2)
      expect(result.stdout).toBe("")
      const lines = result.stderr.trim().split("\n")
      expect(lines).toEqual([
        `kvrelay bench: --only: unknown suite "nosuch"; the suites are ${suiteNames.join(", ")}`
      ])
    },
    CLI_TEST_TIMEOUT_MS
  )
})
