import { describe, expect, it } from "@effect/vitest"
import { ConfigProvider, Effect, Either } from "effect"
import {
  decodeDiscoveryConfig,
  discoveryConfig,
  parseDiscoveryBackend,
  validateEtcdPrefix
} from "../../src/discovery/DiscoveryConfig.js"

const problemsOf = (input: unknown): ReadonlyArray<string> =>
  Either.match(decodeDiscoveryConfig(input), {
    onLeft: (error) => error.problems.map((p) => `${p.setting}: ${p.message}`),
    onRight: () => []
  })

describe("DiscoveryConfig", () => {
  it("parses file: and etcd: backends", () => {
    expect(parseDiscoveryBackend("file:/etc/kvrelay/discovery.json")).toEqual(
      Either.right({ _tag: "File", path: "/etc/kvrelay/discovery.json" })
    )
    expect(parseDiscoveryBackend("etcd:http://10.0.0.1:2379,https://10.0.0.2:2379")).toEqual(
      Either.right({ _tag: "Etcd", endpoints: ["http://10.0.0.1:2379", "https://10.0.0.2:2379"] })
    )
    expect(Either.isLeft(parseDiscoveryBackend("file:"))).toBe(true)
    expect(parseDiscoveryBackend("zk:x")).toEqual(
      Either.left({ setting: "discovery", message: 'expected "file:PATH" or "etcd:URL[,URL…]", got "zk:x"' })
    )
    expect(parseDiscoveryBackend("etcd:10.0.0.1:2379")).toEqual(
      Either.left({
        setting: "discovery",
        message: 'etcd endpoint "10.0.0.1:2379" is not a URL (http://host:port)'
      })
    )
    expect(Either.isLeft(parseDiscoveryBackend("etcd:http://h:1/path"))).toBe(true)
    expect(Either.isLeft(parseDiscoveryBackend("etcd:ftp://h:1"))).toBe(true)
  })

  it("defaults: watch everything and the /kvrelay/v1 prefix", () => {
    expect(decodeDiscoveryConfig({ discovery: "file:d.json" })).toEqual(
      Either.right({
        namespaces: [],
        endpointPrefixes: [],
        watchAll: true,
        backend: { _tag: "File", path: "d.json" },
        etcdPrefix: "/kvrelay/v1"
      })
    )
    const scoped = Either.getOrThrow(
      decodeDiscoveryConfig({ discovery: "file:d.json", namespaces: ["prod"] })
    )
    expect(scoped.watchAll).toBe(false)
  })

  it("reports every problem naming its setting", () => {
    expect(
      problemsOf({
        discovery: "nope",
        etcdPrefix: "kvrelay/",
        namespaces: ["prod", "prod"],
        endpointPrefixes: ["staging.backend"]
      })
    ).toEqual([
      'discovery: expected "file:PATH" or "etcd:URL[,URL…]", got "nope"',
      'etcdPrefix: must start with "/", got "kvrelay/"',
      'namespaces[1]: "prod" is listed more than once',
      'endpointPrefixes[0]: "staging.backend" is outside the configured namespaces ["prod","prod"]'
    ])
    expect(problemsOf({ discovery: "file:x", watchAll: false })).toEqual([
      "namespaces: at least one discovery namespace is required unless watchAll is true"
    ])
    expect(problemsOf({ discovery: "file:x", colour: "red" })).toEqual(['colour: unknown field "colour"'])
    expect(problemsOf({})).toEqual(['discovery: missing field "discovery"'])
    expect(validateEtcdPrefix("/a/")?.message).toBe('must not end with "/", got "/a/"')
    expect(validateEtcdPrefix("/a//b")?.message).toBe('must not contain empty segments, got "/a//b"')
  })

  it.effect("reads KVRELAY_* settings from a ConfigProvider", () =>
    Effect.gen(function* () {
      const config = yield* discoveryConfig.pipe(
        Effect.withConfigProvider(
          ConfigProvider.fromMap(
            new Map([
              ["KVRELAY_DISCOVERY", "etcd:http://127.0.0.1:2379"],
              ["KVRELAY_NAMESPACES", "prod,staging"],
              ["KVRELAY_ENDPOINT_PREFIXES", "prod.backend"]
            ]),
            { pathDelim: "_" }
          )
        )
      )
      expect(config).toEqual({
        namespaces: ["prod", "staging"],
        endpointPrefixes: ["prod.backend"],
        watchAll: false,
        backend: { _tag: "Etcd", endpoints: ["http://127.0.0.1:2379"] },
        etcdPrefix: "/kvrelay/v1"
      })
      const invalid = yield* discoveryConfig.pipe(
        Effect.withConfigProvider(
          ConfigProvider.fromMap(new Map([["KVRELAY_DISCOVERY", "zk:x"]]), { pathDelim: "_" })
        ),
        Effect.flip
      )
      expect(String(invalid)).toContain("KVRELAY")
      expect(String(invalid)).toContain("DISCOVERY")
      expect(String(invalid)).toContain('expected "file:PATH" or "etcd:URL[,URL…]", got "zk:x"')
    })
  )
})
