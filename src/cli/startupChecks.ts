/**
 * Startup resources checked before a command starts (PROTOCOL §1 ◆3): every file a setting names
 * (discovery document, TLS material, token files), every address a server binds, every place the
 * simulator writes. Each check runs on its own and yields its problem lines (`--flag: reason`),
 * so one run reports every unusable resource, not the first. The commands load the same
 * resources again when they start; a resource that breaks in between is still reported there,
 * then alone.
 */

import { constants } from "node:fs"
import { access, readFile, stat } from "node:fs/promises"
import * as net from "node:net"
import { dirname, resolve } from "node:path"
import * as NodeFileSystem from "@effect/platform-node/NodeFileSystem"
import { Effect, Either, Logger, LogLevel } from "effect"
import { parseDiscoveryBackend } from "../discovery/DiscoveryConfig.js"
import { makeFileDiscovery } from "../discovery/FileDiscovery.js"
import { watchTokenFile } from "../http/BearerAuth.js"
import { fileErrorText } from "../http/FlagFile.js"
import { loadClientTls, loadServerTls, type TlsFile } from "../http/Tls.js"
import { bindFailure } from "./runtime.js"
import type { DemoSettings, GlobalSettings, RelaySettings, SimulateSettings } from "./settings.js"
import { splitAddress } from "./settings.js"

/** Problem lines, `--flag: reason`, in the order the checks were given. */
export type Problems = ReadonlyArray<string>

const none: Problems = []

/** Runs every check at once and keeps their order; the checks log nothing. */
export const gather = (checks: ReadonlyArray<Effect.Effect<Problems>>): Effect.Effect<Problems> =>
  Effect.all(checks, { concurrency: "unbounded" }).pipe(
    Effect.map((lists) => lists.flat()),
    Effect.provide(Logger.minimumLogLevel(LogLevel.None))
  )

/** A file that can be read, in the words its loader uses for the same failure. */
export const readableFile = (flag: string, path: string): Effect.Effect<Problems> =>
  Effect.tryPromise(() => readFile(path)).pipe(
    Effect.as(none),
    Effect.catchAll((error) =>
      Effect.succeed([`${flag}: cannot read ${path}: ${fileErrorText(error.error)}`])
    )
  )

/** A file of PEM certificates (a chain or a CA bundle): readable, each certificate parses. */
const certificateFile = (file: TlsFile): Effect.Effect<Problems> =>
  // The CA form of the client loader reads and checks certificates alone, whatever their role.
  loadClientTls({ ca: file }).pipe(
    Effect.as(none),
    Effect.catchAll((error) => Effect.succeed([error.message]))
  )

/**
 * TLS material: each file on its own first (so a missing key and a bad certificate are both
 * reported), then the whole set together (a key that does not match its certificate, an expired
 * certificate) when every file is usable.
 */
const tlsMaterial = (
  certificates: ReadonlyArray<TlsFile>,
  keys: ReadonlyArray<TlsFile>,
  together: Effect.Effect<unknown, { readonly message: string }> | undefined
): Effect.Effect<Problems> =>
  Effect.gen(function* () {
    const alone = yield* gather([
      ...certificates.map(certificateFile),
      ...keys.map((k) => readableFile(k.flag, k.path))
    ])
    if (alone.length > 0 || together === undefined) return alone
    return yield* together.pipe(
      Effect.as(none),
      Effect.catchAll((error) => Effect.succeed([error.message]))
    )
  })

const file = (flag: string, path: string | undefined): ReadonlyArray<TlsFile> =>
  path === undefined ? [] : [{ flag, path }]

/** The server's `--tls-*` files. */
export const serverTlsFiles = (
  settings: Partial<RelaySettings | GlobalSettings>
): Effect.Effect<Problems> => {
  const cert = file("--tls-cert", settings.tlsCert)
  const key = file("--tls-key", settings.tlsKey)
  const clientCa = file("--tls-client-ca", settings.tlsClientCa)
  return tlsMaterial(
    [...cert, ...clientCa],
    key,
    cert[0] === undefined || key[0] === undefined
      ? undefined
      : loadServerTls({ cert: cert[0], key: key[0], clientCa: clientCa[0] })
  )
}

/** The global consumer's `--relay-ca`, `--relay-cert` and `--relay-key`. */
export const relayTlsFiles = (settings: Partial<GlobalSettings>): Effect.Effect<Problems> => {
  const ca = file("--relay-ca", settings.relayCa)
  const cert = file("--relay-cert", settings.relayCert)
  const key = file("--relay-key", settings.relayKey)
  return tlsMaterial(
    [...ca, ...cert],
    key,
    loadClientTls({
      ca: ca[0],
      ...(cert[0] === undefined || key[0] === undefined ? {} : { cert: cert[0], key: key[0] })
    })
  )
}

/** A token file, read as the server reads it (one token per line, at least one). */
export const tokenFile = (flag: string, path: string | undefined): Effect.Effect<Problems> =>
  path === undefined
    ? Effect.succeed(none)
    : Effect.scoped(watchTokenFile(flag, path)).pipe(
        Effect.as(none),
        Effect.catchAll((error) => Effect.succeed([error.message]))
      )

/**
 * An address a server will listen on: bound once and released. A port that another process
 * takes in between is still reported by the server itself when it starts.
 */
export const listenable = (
  flag: string,
  address: string,
  what = `cannot listen on ${address}`
): Effect.Effect<Problems> => {
  const { host, port } = splitAddress(address)
  return Effect.async<Problems>((resume) => {
    const server = net.createServer()
    server.once("error", (error) => resume(Effect.succeed([`${flag}: ${what}: ${bindFailure(error)}`])))
    server.listen({ host, port }, () => server.close(() => resume(Effect.succeed(none))))
    return Effect.sync(() => server.close())
  })
}

/**
 * The relay's `--discovery`: a document file is read and decoded as the relay reads it at
 * startup (etcd that does not answer is no startup problem: the relay serves and retries).
 */
export const discoveryDocument = (discovery: string | undefined): Effect.Effect<Problems> => {
  const backend = discovery === undefined ? undefined : parseDiscoveryBackend(discovery)
  if (backend === undefined || Either.isLeft(backend) || backend.right._tag !== "File")
    return Effect.succeed(none)
  return Effect.scoped(makeFileDiscovery({ path: backend.right.path, watch: false })).pipe(
    Effect.provide(NodeFileSystem.layer),
    Effect.as(none),
    Effect.catchTag("DiscoveryStartupError", (error) =>
      Effect.succeed([`--discovery: ${error.backend}: ${error.reason}`])
    )
  )
}

/**
 * A file this process will write (and replace by renaming a temporary file beside it): its
 * directory must exist and be writable, and the path must not be a directory.
 */
export const writableFile = (flag: string, path: string): Effect.Effect<Problems> =>
  Effect.tryPromise(async () => {
    const target = resolve(path)
    const directory = dirname(target)
    const dir = await stat(directory).catch(() => undefined)
    if (dir === undefined) return [`${flag}: cannot write ${path}: no directory ${directory}`]
    if (!dir.isDirectory()) return [`${flag}: cannot write ${path}: ${directory} is not a directory`]
    const existing = await stat(target).catch(() => undefined)
    if (existing?.isDirectory() === true) return [`${flag}: cannot write ${path}: it is a directory`]
    try {
      await access(directory, constants.W_OK)
    } catch {
      return [`${flag}: cannot write ${path}: ${directory} is not writable`]
    }
    return none
  }).pipe(
    Effect.catchAll((error) =>
      Effect.succeed([`${flag}: cannot write ${path}: ${fileErrorText(error.error)}`])
    )
  )

/** Every resource `kvrelay relay`'s settings name that cannot be used. */
export const relayStartupProblems = (settings: Partial<RelaySettings>): Effect.Effect<Problems> =>
  gather([
    discoveryDocument(settings.discovery),
    settings.http === undefined ? Effect.succeed(none) : listenable("--http", settings.http),
    serverTlsFiles(settings),
    tokenFile("--auth-token-file", settings.authTokenFile)
  ])

/** Every resource `kvrelay global`'s settings name that cannot be used. */
export const globalStartupProblems = (settings: Partial<GlobalSettings>): Effect.Effect<Problems> =>
  gather([
    settings.http === undefined ? Effect.succeed(none) : listenable("--http", settings.http),
    serverTlsFiles(settings),
    tokenFile("--auth-token-file", settings.authTokenFile),
    relayTlsFiles(settings),
    tokenFile("--relay-token-file", settings.relayTokenFile)
  ])

/** The demo's relays take `--http-port` and the next port, its global consumer the one after. */
export const DEMO_PORTS = 3

/** Every port `kvrelay demo` would listen on that cannot be bound. */
export const demoStartupProblems = (settings: Partial<DemoSettings>): Effect.Effect<Problems> =>
  settings.httpPort === undefined || settings.httpPort === 0
    ? Effect.succeed(none)
    : gather(
        Array.from({ length: DEMO_PORTS }, (_, i) =>
          listenable("--http-port", `127.0.0.1:${settings.httpPort! + i}`)
        )
      )

const WILDCARD_HOSTS = ["0.0.0.0", "::", "*"]

/** Every resource `kvrelay simulate`'s settings name that cannot be used. */
export const simulateStartupProblems = (settings: Partial<SimulateSettings>): Effect.Effect<Problems> =>
  gather([
    settings.discoveryFile === undefined
      ? Effect.succeed(none)
      : writableFile("--discovery-file", settings.discoveryFile),
    // The workers' sockets bind this host on ports of the system's choosing.
    settings.bindHost === undefined || WILDCARD_HOSTS.includes(settings.bindHost)
      ? Effect.succeed(none)
      : listenable(
          "--bind-host",
          `${settings.bindHost.includes(":") ? `[${settings.bindHost}]` : settings.bindHost}:0`,
          `cannot bind ${settings.bindHost}`
        )
  ])
