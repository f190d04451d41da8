/**
 * The TLS and bearer-token settings of `kvrelay relay` and `kvrelay global` (PROTOCOL.md §1 ◆),
 * turned into server and client options at startup. A file that cannot be used is a
 * `StartupProblem` naming its flag (exit 2), reported before the server listens.
 */

import { Effect, type Scope } from "effect"
import { type TokenFile, watchTokenFile } from "../http/BearerAuth.js"
import {
  type ClientTlsOptions,
  loadClientTls,
  loadServerTls,
  type ServerTlsOptions,
  type TlsFile
} from "../http/Tls.js"
import { StartupProblem } from "./runtime.js"

interface ServerSecuritySettings {
  readonly tlsCert?: string | undefined
  readonly tlsKey?: string | undefined
  readonly tlsClientCa?: string | undefined
  readonly authTokenFile?: string | undefined
}

interface ServerSecurity {
  readonly tls: ServerTlsOptions | undefined
  readonly auth: TokenFile | undefined
}

const problem = (error: { readonly flag: string; readonly reason: string }) =>
  new StartupProblem({ flag: error.flag, reason: error.reason, status: 2 })

const file = (flag: string, path: string | undefined): TlsFile | undefined =>
  path === undefined ? undefined : { flag, path }

/**
 * The server's TLS material and token file; the token file is watched until the scope closes.
 * The settings schema already required `--tls-cert` and `--tls-key` together.
 */
export const serverSecurity = (
  settings: ServerSecuritySettings
): Effect.Effect<ServerSecurity, StartupProblem, Scope.Scope> =>
  Effect.gen(function* () {
    const tls =
      settings.tlsCert === undefined || settings.tlsKey === undefined
        ? undefined
        : yield* loadServerTls({
            cert: { flag: "--tls-cert", path: settings.tlsCert },
            key: { flag: "--tls-key", path: settings.tlsKey },
            clientCa: file("--tls-client-ca", settings.tlsClientCa)
          }).pipe(Effect.mapError(problem))
    const auth =
      settings.authTokenFile === undefined
        ? undefined
        : yield* watchTokenFile("--auth-token-file", settings.authTokenFile).pipe(Effect.mapError(problem))
    return { tls, auth }
  })

interface RelayConnectionSettings {
  readonly relayCa?: string | undefined
  readonly relayCert?: string | undefined
  readonly relayKey?: string | undefined
  readonly relayTokenFile?: string | undefined
}

interface RelayConnectionSecurity {
  readonly relayTls: ClientTlsOptions | undefined
  /** The first token of `--relay-token-file` as it stands at each request. */
  readonly bearerToken: Effect.Effect<string> | undefined
}

/** The global consumer's TLS material and token towards relays. */
export const relayConnectionSecurity = (
  settings: RelayConnectionSettings,
  relayUrls: ReadonlyArray<string>
): Effect.Effect<RelayConnectionSecurity, StartupProblem, Scope.Scope> =>
  Effect.gen(function* () {
    const relayTls =
      settings.relayCa === undefined && settings.relayCert === undefined
        ? undefined
        : yield* loadClientTls({
            ca: file("--relay-ca", settings.relayCa),
            cert: file("--relay-cert", settings.relayCert),
            key: file("--relay-key", settings.relayKey)
          }).pipe(Effect.mapError(problem))
    if (settings.relayTokenFile === undefined) return { relayTls, bearerToken: undefined }
    const tokens = yield* watchTokenFile("--relay-token-file", settings.relayTokenFile).pipe(
      Effect.mapError(problem)
    )
    for (const url of relayUrls) {
      if (url.startsWith("http:")) {
        yield* Effect.logWarning("the relay token is sent to a relay over plain HTTP").pipe(
          Effect.annotateLogs("relay", url)
        )
      }
    }
    return { relayTls, bearerToken: tokens.first }
  })
