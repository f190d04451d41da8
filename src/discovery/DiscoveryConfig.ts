/**
 * Discovery settings: which endpoints one relay supervises (relay-service.md §2.1
 * `KvDcRelayDiscoveryConfig`), which backend carries the records (PROTOCOL.md §1–§2) and the etcd
 * key prefix. Every problem names the setting it came from, so the CLI can print one line per
 * problem.
 */

import { Config, ConfigError, Data, Either, Schema } from "effect"
import { formatParseError } from "../protocol/Json.js"
import type { EndpointId } from "../protocol/Model.js"
import { hasSurroundingWhitespace } from "../protocol/Text.js"

/** The etcd prefix used when none is given. */
export const DEFAULT_ETCD_PREFIX = "/kvrelay/v1"

/** Which endpoints one relay watches. */
export interface DiscoveryScope {
  readonly namespaces: ReadonlyArray<string>
  readonly endpointPrefixes: ReadonlyArray<string>
  readonly watchAll: boolean
}

type DiscoveryBackend =
  | { readonly _tag: "File"; readonly path: string }
  | { readonly _tag: "Etcd"; readonly endpoints: ReadonlyArray<string> }

/** Where discovery reads from and what it keeps (namespaces, prefix). */
export interface DiscoveryConfig extends DiscoveryScope {
  readonly backend: DiscoveryBackend
  /** Key prefix of the etcd backend: starts with "/", no trailing "/". */
  readonly etcdPrefix: string
}

/** A discovery setting that was refused, and why. */
export interface ConfigProblem {
  /** The setting as the configuration file spells it (`discovery`, `etcdPrefix`, `namespaces`, …). */
  readonly setting: string
  readonly message: string
}

class InvalidDiscoveryConfig extends Data.TaggedError("InvalidDiscoveryConfig")<{
  readonly problems: ReadonlyArray<ConfigProblem>
}> {
  override get message(): string {
    return this.problems.map((p) => `${p.setting}: ${p.message}`).join("\n")
  }
}

const problem = (setting: string, message: string): ConfigProblem => ({ setting, message })

// ---------------------------------------------------------------------------------------------
// Scope (§2.1)

/**
 * `KvDcRelayDiscoveryConfig::validate`: `watchAll` or at least one namespace (not both); names
 * non-empty, without surrounding whitespace, unique; outside `watchAll` every endpoint prefix must
 * lie inside a configured namespace.
 */
export const validateDiscoveryScope = (scope: DiscoveryScope): ReadonlyArray<ConfigProblem> => {
  const problems: Array<ConfigProblem> = []
  if (!scope.watchAll && scope.namespaces.length === 0) {
    problems.push(
      problem("namespaces", "at least one discovery namespace is required unless watchAll is true")
    )
  }
  if (scope.watchAll && scope.namespaces.length > 0) {
    problems.push(problem("watchAll", "watchAll cannot be combined with explicit discovery namespaces"))
  }
  const checkNames = (setting: string, names: ReadonlyArray<string>) => {
    const seen = new Set<string>()
    names.forEach((name, i) => {
      const at = `${setting}[${i}]`
      if (name.trim().length === 0) problems.push(problem(at, "must not be empty"))
      else if (hasSurroundingWhitespace(name))
        problems.push(problem(at, `${JSON.stringify(name)} must not have surrounding whitespace`))
      else if (seen.has(name)) problems.push(problem(at, `${JSON.stringify(name)} is listed more than once`))
      seen.add(name)
    })
  }
  checkNames("namespaces", scope.namespaces)
  checkNames("endpointPrefixes", scope.endpointPrefixes)
  if (!scope.watchAll) {
    scope.endpointPrefixes.forEach((prefix, i) => {
      const inside = scope.namespaces.some(
        (namespace) => prefix === namespace || prefix.startsWith(`${namespace}.`)
      )
      if (!inside && prefix.trim().length > 0) {
        problems.push(
          problem(
            `endpointPrefixes[${i}]`,
            `${JSON.stringify(prefix)} is outside the configured namespaces ${JSON.stringify(scope.namespaces)}`
          )
        )
      }
    })
  }
  return problems
}

/**
 * The §2.1 prefix rule: a prefix's dot-separated parts are compared in order with (namespace,
 * component, endpoint); fewer parts match when all given parts are equal; a fourth part never
 * matches.
 */
export const endpointMatchesPrefix = (endpoint: EndpointId, prefix: string): boolean => {
  const parts = prefix.split(".")
  if (parts.length > 3) return false
  const actual = [endpoint.namespace, endpoint.component, endpoint.endpoint]
  for (let i = 0; i < parts.length; i++) if (parts[i] !== actual[i]) return false
  return true
}

/**
 * Whether the relay supervises `endpoint`. The Rust relay asks discovery one query per namespace;
 * both kvrelay backends hold every namespace, so the namespace part of the query is applied here.
 */
export const scopeMatches = (scope: DiscoveryScope, endpoint: EndpointId): boolean =>
  (scope.watchAll || scope.namespaces.includes(endpoint.namespace)) &&
  (scope.endpointPrefixes.length === 0 ||
    scope.endpointPrefixes.some((prefix) => endpointMatchesPrefix(endpoint, prefix)))

/** A scope that sees every endpoint (tests, benches, the demo). */
export const WATCH_ALL: DiscoveryScope = { namespaces: [], endpointPrefixes: [], watchAll: true }

// ---------------------------------------------------------------------------------------------
// Backend and prefix

const BACKEND_SHAPE = `expected "file:PATH" or "etcd:URL[,URL…]"`

/** `file:PATH` or `etcd:URL[,URL…]` (each URL `http(s)://host:port`). */
export const parseDiscoveryBackend = (
  text: string,
  setting = "discovery"
): Either.Either<DiscoveryBackend, ConfigProblem> => {
  if (text.startsWith("file:")) {
    const path = text.slice("file:".length)
    if (path.length === 0)
      return Either.left(problem(setting, `file: needs a path, got ${JSON.stringify(text)}`))
    return Either.right({ _tag: "File", path })
  }
  if (text.startsWith("etcd:")) {
    const urls = text.slice("etcd:".length).split(",")
    for (const url of urls) {
      let parsed: URL
      try {
        parsed = new URL(url)
      } catch {
        return Either.left(
          problem(setting, `etcd endpoint ${JSON.stringify(url)} is not a URL (http://host:port)`)
        )
      }
      if ((parsed.protocol !== "http:" && parsed.protocol !== "https:") || parsed.host.length === 0) {
        return Either.left(
          problem(
            setting,
            `etcd endpoint ${JSON.stringify(url)} must be http://host:port or https://host:port`
          )
        )
      }
      if (parsed.pathname !== "/" && parsed.pathname !== "") {
        return Either.left(problem(setting, `etcd endpoint ${JSON.stringify(url)} must not have a path`))
      }
    }
    return Either.right({ _tag: "Etcd", endpoints: urls })
  }
  return Either.left(problem(setting, `${BACKEND_SHAPE}, got ${JSON.stringify(text)}`))
}

/** Why the prefix cannot be used, or undefined. */
export const validateEtcdPrefix = (prefix: string, setting = "etcdPrefix"): ConfigProblem | undefined => {
  if (!prefix.startsWith("/")) return problem(setting, `must start with "/", got ${JSON.stringify(prefix)}`)
  if (prefix.length > 1 && prefix.endsWith("/"))
    return problem(setting, `must not end with "/", got ${JSON.stringify(prefix)}`)
  if (prefix === "/") return problem(setting, `must name a key prefix below "/", got "/"`)
  if (prefix.includes("//"))
    return problem(setting, `must not contain empty segments, got ${JSON.stringify(prefix)}`)
  if (/\s/.test(prefix)) return problem(setting, `must not contain whitespace, got ${JSON.stringify(prefix)}`)
  return undefined
}

// ---------------------------------------------------------------------------------------------
// Decoding

/** The configuration-file form of the discovery settings; unknown fields are rejected. */
const DiscoveryConfigJson = Schema.Struct({
  discovery: Schema.String,
  etcdPrefix: Schema.optional(Schema.String),
  namespaces: Schema.optional(Schema.Array(Schema.String)),
  endpointPrefixes: Schema.optional(Schema.Array(Schema.String)),
  /**
   * Defaults to true when no namespace is given: PROTOCOL §1 gives the relay no namespace flag (our
   * `--namespace` is an addition), so watching every namespace is the contract's default.
   */
  watchAll: Schema.optional(Schema.Boolean)
})
type DiscoveryConfigInput = typeof DiscoveryConfigJson.Encoded

/** Checks the settings together and reports every problem, each naming its setting. */
export const makeDiscoveryConfig = (
  input: DiscoveryConfigInput
): Either.Either<DiscoveryConfig, InvalidDiscoveryConfig> => {
  const problems: Array<ConfigProblem> = []
  const namespaces = input.namespaces ?? []
  const endpointPrefixes = input.endpointPrefixes ?? []
  const watchAll = input.watchAll ?? namespaces.length === 0
  const backend = parseDiscoveryBackend(input.discovery)
  if (Either.isLeft(backend)) problems.push(backend.left)
  const etcdPrefix = input.etcdPrefix ?? DEFAULT_ETCD_PREFIX
  const prefixProblem = validateEtcdPrefix(etcdPrefix)
  if (prefixProblem !== undefined) problems.push(prefixProblem)
  problems.push(...validateDiscoveryScope({ namespaces, endpointPrefixes, watchAll }))
  if (problems.length > 0 || Either.isLeft(backend))
    return Either.left(new InvalidDiscoveryConfig({ problems }))
  return Either.right({ namespaces, endpointPrefixes, watchAll, backend: backend.right, etcdPrefix })
}

const decodeInput = Schema.decodeUnknownEither(DiscoveryConfigJson, { onExcessProperty: "error" })

/** Decodes a parsed configuration object (e.g. the discovery part of `--config FILE`). */
export const decodeDiscoveryConfig = (
  input: unknown
): Either.Either<DiscoveryConfig, InvalidDiscoveryConfig> =>
  Either.flatMap(
    Either.mapLeft(decodeInput(input), (error) => {
      // `formatParseError` puts the field first: `missing field "discovery"`, `namespaces[0]: …`.
      const lines = formatParseError(error).split("; ")
      return new InvalidDiscoveryConfig({
        problems: lines.map((line) => {
          const quoted = /field "([^"]+)"/.exec(line)
          const setting = quoted?.[1] ?? line.split(":")[0] ?? "discovery"
          return problem(setting.split(/[.[]/)[0] ?? setting, line)
        })
      })
    }),
    makeDiscoveryConfig
  )

const listSetting = (name: string) =>
  Config.array(Config.string(), name).pipe(Config.withDefault([] as ReadonlyArray<string>))

/**
 * The discovery settings from a `ConfigProvider` (environment: `KVRELAY_DISCOVERY`,
 * `KVRELAY_ETCD_PREFIX`, `KVRELAY_NAMESPACES`, `KVRELAY_ENDPOINT_PREFIXES`, `KVRELAY_WATCH_ALL`;
 * lists are comma separated). A problem fails with `ConfigError.InvalidData` at the setting's path.
 */
export const discoveryConfig: Config.Config<DiscoveryConfig> = Config.nested(
  Config.all({
    discovery: Config.string("DISCOVERY"),
    etcdPrefix: Config.string("ETCD_PREFIX").pipe(Config.withDefault(DEFAULT_ETCD_PREFIX)),
    namespaces: listSetting("NAMESPACES"),
    endpointPrefixes: listSetting("ENDPOINT_PREFIXES"),
    watchAll: Config.option(Config.boolean("WATCH_ALL"))
  }).pipe(
    Config.mapOrFail((raw) =>
      Either.mapLeft(
        makeDiscoveryConfig({
          discovery: raw.discovery,
          etcdPrefix: raw.etcdPrefix,
          namespaces: raw.namespaces,
          endpointPrefixes: raw.endpointPrefixes,
          ...(raw.watchAll._tag === "Some" ? { watchAll: raw.watchAll.value } : {})
        }),
        (error) =>
          error.problems
            .map((p) => ConfigError.InvalidData([settingEnvName(p.setting)], p.message))
            .reduce((left, right) => ConfigError.And(left, right))
      )
    )
  ),
  "KVRELAY"
)

const ENV_NAMES: Record<string, string> = {
  discovery: "DISCOVERY",
  etcdPrefix: "ETCD_PREFIX",
  namespaces: "NAMESPACES",
  endpointPrefixes: "ENDPOINT_PREFIXES",
  watchAll: "WATCH_ALL"
}

const settingEnvName = (setting: string): string => {
  const base = setting.split("[")[0] ?? setting
  return ENV_NAMES[base] ?? setting
}
