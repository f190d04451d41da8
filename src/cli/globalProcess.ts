/**
 * The `kvrelay global` process as one layer: the consumer, its view and its HTTP API, with relay
 * clients over undici. The command (`globalCommand.ts`), the demo and the process tests run it.
 */

import type * as HttpServer from "@effect/platform/HttpServer"
import type * as HttpServerError from "@effect/platform/HttpServerError"
import { Layer } from "effect"
import type { GlobalConsumerConfigError } from "../consumer/ConsumerErrors.js"
import { type GlobalConsumer, type GlobalConsumerConfig, RelayConnector } from "../consumer/GlobalConsumer.js"
import { layer as globalConsumerLayer } from "../consumer/GlobalConsumerLive.js"
import { type GlobalView, layer as globalViewLayer } from "../consumer/GlobalView.js"
import * as GlobalHttpServer from "../consumer/http/GlobalHttpServer.js"
import type { RelayClientOptions } from "../consumer/RelayClient.js"
import { type ClientTlsOptions, httpClientLayer } from "../http/Tls.js"

/**
 * The whole `kvrelay global` process as one layer: the consumer (relay clients over undici), its
 * view and this API. `serverUrl` gives the bound address for the readiness line.
 */
export const layer = (
  consumer: GlobalConsumerConfig,
  options: GlobalHttpServer.GlobalHttpServerOptions & {
    readonly client?: RelayClientOptions | undefined
    /** CA and client certificate for `https://` relays (`Tls.loadClientTls`). */
    readonly relayTls?: ClientTlsOptions | undefined
  } = {}
): Layer.Layer<
  HttpServer.HttpServer | GlobalView | GlobalConsumer,
  HttpServerError.ServeError | GlobalConsumerConfigError
> =>
  GlobalHttpServer.layer(options).pipe(
    Layer.provideMerge(globalViewLayer),
    Layer.provideMerge(globalConsumerLayer(consumer)),
    Layer.provide(RelayConnector.layerHttp(options.client)),
    Layer.provide(httpClientLayer(options.relayTls))
  )
