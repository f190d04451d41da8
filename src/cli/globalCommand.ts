/**
 * `kvrelay global`: follow the relays given by `--relay NAME=URL` (lane order = flag order) and
 * answer overlap queries over HTTP, until SIGINT/SIGTERM.
 */

import { Effect, Layer } from "effect"
import * as GlobalHttpServer from "../consumer/http/GlobalHttpServer.js"
import * as GlobalProcess from "./globalProcess.js"
import { bindFailure, commandObservability, printListening, StartupProblem } from "./runtime.js"
import { relayConnectionSecurity, serverSecurity } from "./security.js"
import { type GlobalSettings, globalRouting, splitAddress, splitRelayTarget } from "./settings.js"

/** `kvrelay global`: the global consumer and its HTTP server, until interrupted. */
export const globalProgram = (settings: GlobalSettings) => {
  const { host, port } = splitAddress(settings.http)
  return Effect.gen(function* () {
    const url = yield* GlobalHttpServer.serverUrlOf(settings.tlsCert !== undefined)
    yield* Effect.logInfo("global consumer serving").pipe(
      Effect.annotateLogs({ url, relays: settings.relay.join(" ") })
    )
    yield* printListening(url)
    return yield* Effect.never
  }).pipe(
    Effect.provide(
      Layer.unwrapScoped(
        Effect.gen(function* () {
          const relays = settings.relay.map(splitRelayTarget)
          // TLS files and token files are checked before anything connects or listens.
          const server = yield* serverSecurity(settings)
          const { relayTls, bearerToken } = yield* relayConnectionSecurity(
            settings,
            relays.map((r) => r.url)
          )
          return GlobalProcess.layer(
            { relays },
            {
              host,
              port,
              maxBodyBytes: settings.maxRequestBodyBytes,
              routing: globalRouting(settings),
              ...server,
              relayTls,
              client: { bearerToken }
            }
          )
        })
      )
    ),
    Effect.catchTags({
      ServeError: (error) =>
        Effect.fail(
          new StartupProblem({
            flag: "--http",
            reason: `cannot listen on ${settings.http}: ${bindFailure(error.cause)}`,
            status: 2
          })
        ),
      GlobalConsumerConfigError: (error) =>
        Effect.fail(new StartupProblem({ flag: "--relay", reason: error.message, status: 2 }))
    }),
    Effect.provide(commandObservability(settings, "kvrelay-global"))
  )
}
