/**
 * The settings of each `kvrelay` command: flag specs (with their `KVRELAY_*` variables) and the
 * Schema each merged settings record is decoded with.
 */

import { Either, ParseResult, Schema } from "effect"
import type { RoutingSettings } from "../consumer/GlobalRoute.js"
import {
  type DiscoveryConfig,
  makeDiscoveryConfig,
  parseDiscoveryBackend,
  validateEtcdPrefix
} from "../discovery/DiscoveryConfig.js"
import { DEFAULT_ROUTE_POLICY, type RoutePolicy } from "../protocol/RouteApi.js"
import { parseRoutePolicyFlag, relayPenalties } from "../routing/RouteCost.js"
import {
  BooleanFlag,
  type CommandSpec,
  closestName,
  decodeSettings,
  environmentValues,
  flagOf,
  HttpAddress,
  intFrom,
  keyOf,
  LogLevel,
  NonBlank,
  PositiveInt,
  parseFlagsGathering,
  type RawValue,
  StringList,
  Url,
  UsageError
} from "./args.js"

const common = {
  config: {
    name: "config",
    help: "JSON file with any of these settings (camelCase keys)",
    placeholder: "FILE"
  },
  otlp: {
    name: "otlp",
    help: "OTLP/HTTP endpoint for traces (else OTEL_EXPORTER_OTLP_ENDPOINT)",
    placeholder: "URL"
  },
  logLevel: {
    name: "log-level",
    help: "trace | debug | info | warning | error | fatal | none (default info)",
    placeholder: "LEVEL"
  },
  tlsCert: {
    name: "tls-cert",
    help: "serve HTTPS with this PEM certificate chain (needs --tls-key)",
    placeholder: "FILE"
  },
  tlsKey: { name: "tls-key", help: "PEM private key of --tls-cert", placeholder: "FILE" },
  tlsClientCa: {
    name: "tls-client-ca",
    help: "require client certificates signed by this PEM CA (mutual TLS; needs --tls-cert)",
    placeholder: "FILE"
  },
  authTokenFile: {
    name: "auth-token-file",
    help: "require Authorization: Bearer with a token of this file (one per line; re-read on change)",
    placeholder: "FILE"
  }
} as const

const serverTlsFlags = [common.tlsCert, common.tlsKey, common.tlsClientCa, common.authTokenFile]

/** `kvrelay relay`: its flags and help. */
export const relayCommand: CommandSpec = {
  name: "relay",
  summary: "run the DC relay: discover endpoints, follow KV events, publish pool filters over HTTP",
  flags: [
    common.config,
    {
      name: "dc-id",
      help: "this data center's name (required; its DcId is derived from it)",
      placeholder: "NAME"
    },
    {
      name: "discovery",
      help: "file:PATH or etcd:URL[,URL…] (default file:kvrelay-discovery.json)",
      placeholder: "BACKEND"
    },
    { name: "etcd-prefix", help: "etcd key prefix (default /kvrelay/v1)", placeholder: "PREFIX" },
    {
      name: "namespace",
      help: "watch only these namespaces (default: all)",
      repeatable: true,
      placeholder: "NS"
    },
    {
      name: "endpoint-prefix",
      help: "watch only endpoints under these prefixes (ns[.component[.endpoint]])",
      repeatable: true,
      placeholder: "PREFIX"
    },
    { name: "http", help: "HTTP listen address (default 127.0.0.1:8080)", placeholder: "HOST:PORT" },
    { name: "expected-unique-blocks", help: "filter sizing per pool (default 1048576)", placeholder: "N" },
    { name: "publication-threshold", help: "events per publication batch (default 16)", placeholder: "N" },
    {
      name: "publication-delay-ms",
      help: "latest publication of a pending tail (default 1)",
      placeholder: "N"
    },
    {
      name: "recovery-attempt-timeout-ms",
      help: "bound of one worker query attempt (default 30000)",
      placeholder: "N"
    },
    { name: "max-pool-streams", help: "pool streams open at once (default 64)", placeholder: "N" },
    { name: "max-subscribers-per-pool", help: "subscribers of one pool (default 64)", placeholder: "N" },
    {
      name: "max-initialized-pool-hubs",
      help: "publication hubs with a mirror (default 64)",
      placeholder: "N"
    },
    { name: "max-catalog-watchers", help: "catalog watch streams (default 64)", placeholder: "N" },
    { name: "max-readiness-watchers", help: "readiness watch streams (default 64)", placeholder: "N" },
    { name: "max-load-watchers", help: "load watch streams (default 64)", placeholder: "N" },
    {
      name: "max-request-body-bytes",
      help: "largest body of the query routes, in bytes (default 16777216); 413 BODY_TOO_LARGE beyond",
      placeholder: "N"
    },
    ...serverTlsFlags,
    common.otlp,
    common.logLevel
  ]
}

/** `kvrelay global`: its flags and help. */
export const globalCommand: CommandSpec = {
  name: "global",
  summary: "run the global consumer: follow up to 16 DC relays and answer overlap queries",
  flags: [
    common.config,
    { name: "http", help: "HTTP listen address (default 127.0.0.1:8090)", placeholder: "HOST:PORT" },
    {
      name: "relay",
      help: "a DC relay, NAME=URL (lane order = flag order)",
      repeatable: true,
      placeholder: "NAME=URL"
    },
    {
      name: "max-request-body-bytes",
      help: "largest body of the overlap routes, in bytes (default 16777216); 413 BODY_TOO_LARGE beyond",
      placeholder: "N"
    },
    {
      name: "relay-penalty",
      help: "tokens added to the cost of routing to that relay's DC, for distance or egress; 0 when not given",
      repeatable: true,
      placeholder: "NAME=TOKENS"
    },
    {
      name: "route-overlap-credit",
      help: "prefill tokens a cached token saves in routing decisions, finite and >= 0 (default 1)",
      placeholder: "X"
    },
    {
      name: "route-request-tokens",
      help: "tokens of work each running or waiting request stands for, an integer >= 0 (default 1024)",
      placeholder: "N"
    },
    {
      name: "route-max-kv-usage",
      help: "KV usage at which a DC is overloaded for routing, in (0, 1] (default 0.98)",
      placeholder: "X"
    },
    {
      name: "route-max-waiting-per-rank",
      help: "waiting requests per rank at which a DC is overloaded for routing, > 0 (default 16)",
      placeholder: "N"
    },
    ...serverTlsFlags,
    {
      name: "relay-ca",
      help: "trust only this PEM CA for https:// relays (default: the system's CAs)",
      placeholder: "FILE"
    },
    {
      name: "relay-cert",
      help: "PEM client certificate presented to https:// relays (needs --relay-key)",
      placeholder: "FILE"
    },
    { name: "relay-key", help: "PEM private key of --relay-cert", placeholder: "FILE" },
    {
      name: "relay-token-file",
      help: "bearer token sent to relays: the file's first token (re-read on change)",
      placeholder: "FILE"
    },
    common.otlp,
    common.logLevel
  ]
}

/** `kvrelay demo`: its flags and help. */
export const demoCommand: CommandSpec = {
  name: "demo",
  summary: "relays, a global consumer and simulated workers on 127.0.0.1, with a live summary",
  flags: [
    { name: "workers", help: "simulated workers per DC (default 4)", placeholder: "N" },
    {
      name: "http-port",
      help: "first relay's HTTP port; the next ports follow (default 0: any free port)",
      placeholder: "PORT"
    },
    {
      name: "duration-s",
      help: "stop after this many seconds (default: run until Ctrl-C)",
      placeholder: "N"
    },
    {
      name: "drop-every",
      help: "each worker loses one message on the wire every N requests, so the relays show gap recovery (default: never)",
      placeholder: "N"
    },
    common.otlp,
    { ...common.logLevel, help: "trace | debug | info | warning | error | fatal | none (default warning)" }
  ]
}

/** `kvrelay simulate`: its flags and help. */
export const simulateCommand: CommandSpec = {
  name: "simulate",
  summary: "simulated vLLM, SGLang and Dynamo-format workers that register in etcd or a discovery file",
  flags: [
    {
      name: "etcd",
      help: "etcd client URLs the workers register with under leases (this or --discovery-file)",
      placeholder: "URL[,URL…]"
    },
    { name: "etcd-prefix", help: "etcd key prefix (default /kvrelay/v1)", placeholder: "PREFIX" },
    {
      name: "discovery-file",
      help: "write the workers' records to this discovery document, for a relay on --discovery file:PATH (this or --etcd; emptied on exit)",
      placeholder: "PATH"
    },
    {
      name: "namespace",
      help: "namespace of the serving endpoint NS.backend.generate (default demo)",
      placeholder: "NS"
    },
    { name: "model", help: "model name on the workers' cards (default llama-3-8b)", placeholder: "NAME" },
    { name: "block-size", help: "tokens per KV block (default 16)", placeholder: "N" },
    {
      name: "workers",
      help: "simulated workers, half dynamo-zmq, half engine-zmq (default 4)",
      placeholder: "N"
    },
    {
      name: "worker-id-base",
      help: "the first worker's id; the others follow (default 7000)",
      placeholder: "N"
    },
    {
      name: "bind-host",
      help: "address the workers' ZeroMQ sockets bind (default 127.0.0.1); 0.0.0.0 in a container",
      placeholder: "HOST"
    },
    {
      name: "advertise-host",
      help: "host the relays connect to, written in the source records (default: --bind-host, or this host's name for 0.0.0.0)",
      placeholder: "HOST"
    },
    { name: "requests-per-second", help: "requests per worker per second (default 20)", placeholder: "N" },
    {
      name: "cache-blocks",
      help: "KV blocks each worker holds before it evicts the least recently used (default 2048)",
      placeholder: "N"
    },
    {
      name: "duration-s",
      help: "stop after this many seconds (default: run until stopped)",
      placeholder: "N"
    },
    common.otlp,
    common.logLevel
  ]
}

/** `kvrelay bench`: its flags and help. */
export const benchCommand: CommandSpec = {
  name: "bench",
  summary: "run the benchmarks; every figure is printed as a ratio against a same-run baseline",
  flags: [
    { name: "quick", boolean: true, help: "a short run" },
    { name: "json", boolean: true, help: "also print the results as JSON on stdout" },
    {
      name: "only",
      help: "comma-separated suite names to run (an unknown name lists them)",
      placeholder: "NAMES"
    },
    {
      name: "soak-minutes",
      help: "minutes of the soak_memory suite, which runs only when --only names it (default 10)",
      placeholder: "N"
    }
  ]
}

// ---------------------------------------------------------------------------------------------
// Schemas

const withDefault = <A, I>(schema: Schema.Schema<A, I, never>, value: () => A) =>
  Schema.optionalWith(schema, { default: value })

// Whether the file exists and holds usable material is a startup check (Tls.ts, BearerAuth.ts).
const FilePath = Schema.String.pipe(Schema.filter((s) => s.length > 0 || "must not be empty"))

const serverTlsFields = {
  tlsCert: Schema.optional(FilePath),
  tlsKey: Schema.optional(FilePath),
  tlsClientCa: Schema.optional(FilePath),
  authTokenFile: Schema.optional(FilePath)
}

/**
 * Settings that only work together: each `[needed, by]` reports the `needed` setting, once, with
 * every setting given that needs it (`--tls-cert: is required with --tls-key`).
 */
const requiredTogether =
  (pairs: ReadonlyArray<readonly [needed: string, by: string]>) =>
  (settings: Readonly<Record<string, unknown>>): ReadonlyArray<Schema.FilterIssue> => {
    const missing = new Map<string, Array<string>>()
    for (const [needed, by] of pairs) {
      if (settings[by] === undefined || settings[needed] !== undefined) continue
      missing.set(needed, [...(missing.get(needed) ?? []), flagOf(by)])
    }
    return [...missing].map(([needed, by]) => ({
      path: [needed],
      message: `is required with ${by.join(" and ")}`
    }))
  }

const SERVER_TLS_PAIRS = [
  ["tlsKey", "tlsCert"],
  ["tlsCert", "tlsKey"],
  ["tlsCert", "tlsClientCa"]
] as const

// Checked here as well as in makeDiscoveryConfig so that a bad backend or prefix is reported with
// every other invalid setting, not only once the rest decodes.
const DiscoveryBackendText = Schema.String.pipe(
  Schema.filter((text) =>
    Either.match(parseDiscoveryBackend(text), { onLeft: (p) => p.message, onRight: () => true })
  )
)
const EtcdPrefixText = Schema.String.pipe(Schema.filter((text) => validateEtcdPrefix(text)?.message ?? true))

/** The settings of `kvrelay relay`, from flags and `KVRELAY_*` variables, with their defaults. */
export const RelaySettings = Schema.Struct({
  dcId: NonBlank,
  discovery: withDefault(DiscoveryBackendText, () => "file:kvrelay-discovery.json"),
  etcdPrefix: Schema.optional(EtcdPrefixText),
  namespace: Schema.optional(StringList),
  endpointPrefix: Schema.optional(StringList),
  http: withDefault(HttpAddress, () => "127.0.0.1:8080"),
  expectedUniqueBlocks: withDefault(PositiveInt, () => 1_048_576),
  publicationThreshold: withDefault(PositiveInt, () => 16),
  publicationDelayMs: withDefault(PositiveInt, () => 1),
  recoveryAttemptTimeoutMs: withDefault(PositiveInt, () => 30_000),
  maxPoolStreams: withDefault(PositiveInt, () => 64),
  maxSubscribersPerPool: withDefault(PositiveInt, () => 64),
  maxInitializedPoolHubs: withDefault(PositiveInt, () => 64),
  maxCatalogWatchers: withDefault(PositiveInt, () => 64),
  maxReadinessWatchers: withDefault(PositiveInt, () => 64),
  maxLoadWatchers: withDefault(PositiveInt, () => 64),
  // PROTOCOL §7 ◆3: 256 queries of 2,048 tokens fit (ErrorText.DEFAULT_MAX_REQUEST_BODY_BYTES).
  maxRequestBodyBytes: withDefault(PositiveInt, () => 16_777_216),
  ...serverTlsFields,
  otlp: Schema.optional(Url),
  logLevel: withDefault(LogLevel, () => "info" as const)
}).pipe(Schema.filter(requiredTogether(SERVER_TLS_PAIRS)))
export type RelaySettings = typeof RelaySettings.Type

const RelayTarget = Schema.String.pipe(
  Schema.filter((s) => {
    const eq = s.indexOf("=")
    if (eq <= 0) return `expected NAME=URL, got ${JSON.stringify(s)}`
    try {
      const url = new URL(s.slice(eq + 1))
      return (
        url.protocol === "http:" ||
        url.protocol === "https:" ||
        `expected an http(s) URL in ${JSON.stringify(s)}`
      )
    } catch {
      return `expected NAME=URL with a valid URL, got ${JSON.stringify(s)}`
    }
  })
)

/** A policy flag of `global` (`--route-max-kv-usage 0.9`): its range is the policy's (PROTOCOL §7.1). */
const policyFlag = (field: keyof RoutePolicy) =>
  Schema.transformOrFail(Schema.Union(Schema.String, Schema.Number), Schema.Number, {
    strict: true,
    decode: (input, _, ast) =>
      Either.match(parseRoutePolicyFlag(field, String(input)), {
        // The settings' problems are prefixed with the flag already.
        onLeft: (message) =>
          ParseResult.fail(new ParseResult.Type(ast, input, message.replace(/^--[\w-]+: /, ""))),
        onRight: (value) => ParseResult.succeed(value)
      }),
    encode: (value) => ParseResult.succeed(value)
  })

/** Every `--relay-penalty` problem: a value not NAME=TOKENS, a name no `--relay` gives, a repeat. */
const penaltyProblems = (settings: {
  readonly relay: ReadonlyArray<string>
  readonly relayPenalty?: ReadonlyArray<string> | undefined
}): ReadonlyArray<Schema.FilterIssue> =>
  // Without valid relays the names cannot be checked; --relay's own problem is reported.
  !Array.isArray(settings.relay)
    ? []
    : Either.match(
        relayPenalties(
          settings.relayPenalty ?? [],
          settings.relay.map((r) => r.slice(0, r.indexOf("=")))
        ),
        {
          // One line for the flag, naming every bad value (the settings report one problem per flag).
          onLeft: (problems) => [
            {
              path: ["relayPenalty"],
              message: problems.map((message) => message.replace(/^--relay-penalty:? ?/, "")).join("; ")
            }
          ],
          onRight: () => []
        }
      )

/** The settings of `kvrelay global`, from flags and `KVRELAY_*` variables, with their defaults. */
export const GlobalSettings = Schema.Struct({
  http: withDefault(HttpAddress, () => "127.0.0.1:8090"),
  relay: Schema.Union(
    Schema.Array(RelayTarget),
    Schema.transform(Schema.String, Schema.Array(RelayTarget), {
      strict: true,
      decode: (s) => s.split(",").map((v) => v.trim()),
      encode: (a) => a.join(",")
    })
  ).pipe(
    Schema.filter((relays) => relays.length > 0 || "at least one --relay NAME=URL is required"),
    Schema.filter((relays) => relays.length <= 16 || `at most 16 relays (DC lanes), got ${relays.length}`),
    Schema.filter((relays) => {
      const names = relays.map((r) => r.slice(0, r.indexOf("=")))
      const duplicate = names.find((n, i) => names.indexOf(n) !== i)
      return duplicate === undefined || `relay name ${JSON.stringify(duplicate)} is given twice`
    })
  ),
  // PROTOCOL §7 ◆3: 256 queries of 2,048 tokens fit (ErrorText.DEFAULT_MAX_REQUEST_BODY_BYTES).
  maxRequestBodyBytes: withDefault(PositiveInt, () => 16_777_216),
  ...serverTlsFields,
  relayCa: Schema.optional(FilePath),
  relayCert: Schema.optional(FilePath),
  relayKey: Schema.optional(FilePath),
  relayTokenFile: Schema.optional(FilePath),
  relayPenalty: Schema.optional(StringList),
  routeOverlapCredit: withDefault(policyFlag("overlapCredit"), () => DEFAULT_ROUTE_POLICY.overlapCredit),
  routeRequestTokens: withDefault(policyFlag("requestTokens"), () => DEFAULT_ROUTE_POLICY.requestTokens),
  routeMaxKvUsage: withDefault(policyFlag("maxKvUsage"), () => DEFAULT_ROUTE_POLICY.maxKvUsage),
  routeMaxWaitingPerRank: withDefault(
    policyFlag("maxWaitingPerRank"),
    () => DEFAULT_ROUTE_POLICY.maxWaitingPerRank
  ),
  otlp: Schema.optional(Url),
  logLevel: withDefault(LogLevel, () => "info" as const)
}).pipe(
  Schema.filter(
    requiredTogether([...SERVER_TLS_PAIRS, ["relayKey", "relayCert"], ["relayCert", "relayKey"]])
  ),
  Schema.filter(penaltyProblems)
)

/** The routing settings of `global` (PROTOCOL §7.1): policy defaults and relay penalties. */
export const globalRouting = (settings: GlobalSettings): RoutingSettings => ({
  policy: {
    overlapCredit: settings.routeOverlapCredit,
    requestTokens: settings.routeRequestTokens,
    maxKvUsage: settings.routeMaxKvUsage,
    maxWaitingPerRank: settings.routeMaxWaitingPerRank
  },
  penalties: Either.getOrElse(
    relayPenalties(
      settings.relayPenalty ?? [],
      settings.relay.map((r) => r.slice(0, r.indexOf("=")))
    ),
    () => new Map<string, number>()
  )
})
export type GlobalSettings = typeof GlobalSettings.Type

/** The settings of `kvrelay demo`. */
export const DemoSettings = Schema.Struct({
  workers: withDefault(PositiveInt, () => 4),
  // The demo takes this port and the next two (a relay per DC, then the global consumer).
  httpPort: withDefault(intFrom("a port 0..65000", 0, 65_000), () => 0),
  durationS: Schema.optional(PositiveInt),
  dropEvery: Schema.optional(PositiveInt),
  otlp: Schema.optional(Url),
  logLevel: withDefault(LogLevel, () => "warning" as const)
})
export type DemoSettings = typeof DemoSettings.Type

/** The settings of `kvrelay bench`. */
export const BenchSettings = Schema.Struct({
  quick: withDefault(BooleanFlag, () => false),
  json: withDefault(BooleanFlag, () => false),
  only: Schema.optional(StringList),
  soakMinutes: withDefault(PositiveInt, () => 10)
})
export type BenchSettings = typeof BenchSettings.Type

/** `--etcd` or `--discovery-file`: exactly one says where the simulated workers register. */
const oneRegistry = (settings: {
  readonly etcd?: unknown
  readonly discoveryFile?: unknown
}): ReadonlyArray<Schema.FilterIssue> => {
  if (settings.etcd === undefined && settings.discoveryFile === undefined)
    return [{ path: ["etcd"], message: "is required, or --discovery-file PATH instead" }]
  if (settings.etcd !== undefined && settings.discoveryFile !== undefined)
    return [
      { path: ["discoveryFile"], message: "cannot be given with --etcd: the workers register in one place" }
    ]
  return []
}

/** The settings of `kvrelay simulate`. */
export const SimulateSettings = Schema.Struct({
  etcd: Schema.optional(
    StringList.pipe(
      Schema.filter((urls) => urls.length > 0 || "at least one etcd URL is required"),
      Schema.filter((urls) => {
        const bad = urls.find((u) => {
          try {
            return !["http:", "https:"].includes(new URL(u).protocol)
          } catch {
            return true
          }
        })
        return bad === undefined || `expected http(s) URLs, got ${JSON.stringify(bad)}`
      })
    )
  ),
  etcdPrefix: withDefault(EtcdPrefixText, () => "/kvrelay/v1"),
  discoveryFile: Schema.optional(FilePath),
  namespace: withDefault(NonBlank, () => "demo"),
  model: withDefault(NonBlank, () => "llama-3-8b"),
  blockSize: withDefault(PositiveInt, () => 16),
  workers: withDefault(PositiveInt, () => 4),
  workerIdBase: withDefault(PositiveInt, () => 7000),
  bindHost: withDefault(NonBlank, () => "127.0.0.1"),
  advertiseHost: Schema.optional(NonBlank),
  requestsPerSecond: withDefault(PositiveInt, () => 20),
  cacheBlocks: withDefault(PositiveInt, () => 2048),
  durationS: Schema.optional(PositiveInt),
  otlp: Schema.optional(Url),
  logLevel: withDefault(LogLevel, () => "info" as const)
}).pipe(Schema.filter(oneRegistry))
export type SimulateSettings = typeof SimulateSettings.Type

// ---------------------------------------------------------------------------------------------
// Loading

interface SettingsSources {
  readonly argv: ReadonlyArray<string>
  readonly env: Readonly<Record<string, string | undefined>>
  /** Reads a `--config` file; errors are reported against `--config`. */
  readonly readFile: (path: string) => string
}

/** What the flags, the environment and a `--config` file say, merged but not yet decoded. */
interface SettingsInput {
  /** Flag over environment over file, by camelCase key; flags that did not parse are left out. */
  readonly merged: Readonly<Record<string, unknown>>
  /** Problems found before decoding: flags that do not parse, an unusable or unknown-keyed file. */
  readonly problems: ReadonlyArray<string>
  /** Decoding problems the ones above already explain, not reported a second time. */
  readonly explained: ReadonlySet<string>
  /** The `--config` file could not be used, so a setting it may hold reads as missing. */
  readonly configUnusable: boolean
}

/**
 * Merges flags, `KVRELAY_*` variables and the `--config` file. Nothing stops at the first
 * problem: whatever parsed is merged, so decoding still reports every other setting.
 */
export const readSettingsInput = (spec: CommandSpec, sources: SettingsSources): SettingsInput => {
  const flags = parseFlagsGathering(spec, sources.argv)
  const problems = [...flags.problems]
  const env = environmentValues(spec, sources.env)
  const configPath = (flags.values["config"] ?? sources.env["KVRELAY_CONFIG"]) as string | undefined
  let file: Record<string, unknown> = {}
  let configUnusable = false
  if (configPath !== undefined) {
    const read = readConfigFile(configPath, sources.readFile)
    if (typeof read === "string") {
      problems.push(read)
      configUnusable = true
    } else file = read
  }
  // Flags and variables are known by construction; only the file can name an unknown setting.
  // It is reported once, with the key it most likely meant, and that key is then not also
  // "required" (a file saying "dc-id" gets one line, not two).
  const known = spec.flags.filter((f) => f.name !== "config").map((f) => keyOf(f.name))
  const explained = new Set<string>()
  for (const key of Object.keys(file)) {
    if (known.includes(key)) continue
    const guess = closestName(key, known)
    if (guess !== undefined) explained.add(`${flagOf(guess)}: is required`)
    problems.push(
      `--config: unknown setting ${JSON.stringify(key)} in ${configPath}${guess === undefined ? "" : `, did you mean ${JSON.stringify(guess)}?`}`
    )
    delete file[key]
  }
  const { config: _ignored, ...flagValues } = flags.values
  return {
    merged: { ...file, ...env, ...(flagValues as Record<string, RawValue>) },
    problems,
    explained,
    configUnusable
  }
}

/** The `--config` file's object, or the problem line that says why it cannot be used. */
const readConfigFile = (
  path: string,
  readFile: SettingsSources["readFile"]
): Record<string, unknown> | string => {
  let text: string
  try {
    text = readFile(path)
  } catch (error) {
    return `--config: cannot read ${path}: ${(error as Error).message}`
  }
  try {
    const parsed: unknown = JSON.parse(text)
    if (parsed === null || typeof parsed !== "object" || Array.isArray(parsed)) {
      return `--config: ${path} must hold a JSON object`
    }
    return parsed as Record<string, unknown>
  } catch (error) {
    return `--config: ${path} is not valid JSON: ${(error as Error).message}`
  }
}

/** Decodes merged settings; the problems of `input` come first, then every decoding problem. */
export const decodeSettingsInput = <A, I>(
  schema: Schema.Schema<A, I, never>,
  input: SettingsInput
): Either.Either<A, UsageError> => {
  const decoded = decodeSettings(schema, { ...input.merged })
  if (input.problems.length === 0) return decoded
  const rest = Either.isLeft(decoded)
    ? decoded.left.problems.filter(
        // An unreadable config file may hold what reads as missing: its line says so already.
        (p) => !input.explained.has(p) && !(input.configUnusable && p.endsWith(": is required"))
      )
    : []
  return Either.left(new UsageError([...input.problems, ...rest]))
}

/**
 * Flags over environment over the `--config` file over defaults, decoded with `schema`. Every
 * problem names its flag, and every problem is reported, not only the first.
 */
export const loadSettings = <A, I>(
  spec: CommandSpec,
  schema: Schema.Schema<A, I, never>,
  sources: SettingsSources
): Either.Either<A, UsageError> => decodeSettingsInput(schema, readSettingsInput(spec, sources))

const DISCOVERY_FLAGS: Record<string, string> = {
  discovery: "--discovery",
  etcdPrefix: "--etcd-prefix",
  namespaces: "--namespace",
  endpointPrefixes: "--endpoint-prefix",
  watchAll: "--namespace"
}

/** The discovery part of the relay settings, with its problems named by flag. */
export const relayDiscoveryConfig = (settings: RelaySettings): Either.Either<DiscoveryConfig, UsageError> =>
  Either.mapLeft(
    makeDiscoveryConfig({
      discovery: settings.discovery,
      etcdPrefix: settings.etcdPrefix,
      namespaces: settings.namespace,
      endpointPrefixes: settings.endpointPrefix
    }),
    (error) =>
      new UsageError(
        error.problems.map((p) => {
          // List settings name an element (`namespaces[1]`): the flag is given once per element.
          const [, base = p.setting, index] = /^(\w+)(?:\[(\d+)\])?$/.exec(p.setting) ?? []
          const flag = DISCOVERY_FLAGS[base] ?? p.setting
          return index === undefined
            ? `${flag}: ${p.message}`
            : `${flag}: value ${Number(index) + 1}: ${p.message}`
        })
      )
  )

/** `HOST:PORT` split for the HTTP servers. */
export const splitAddress = (address: string): { readonly host: string; readonly port: number } => {
  const colon = address.lastIndexOf(":")
  const host = address.slice(0, colon).replace(/^\[(.*)\]$/, "$1")
  return { host, port: Number(address.slice(colon + 1)) }
}

/** `NAME=URL` split. */
export const splitRelayTarget = (target: string): { readonly name: string; readonly url: string } => {
  const eq = target.indexOf("=")
  return { name: target.slice(0, eq), url: target.slice(eq + 1).replace(/\/+$/, "") }
}
