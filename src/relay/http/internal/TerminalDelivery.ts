/**
 * PROTOCOL §5 ◆: a stream that became terminal gives its slot back at once, and its connection
 * then has a bounded time to take the end (the terminal frame and the end of the body).
 *
 * The slot is released by whoever detected the end (the publication source, for pool streams);
 * this module only bounds what the connection may keep afterwards. A response counts as taken
 * once Node handed its last byte to the kernel (`finish`): beyond that the socket holds nothing
 * of the relay's but kernel buffers, and the server's keep-alive timeout closes it.
 */

import type * as Http from "node:http"
import { Duration, Effect, Metric, Option } from "effect"
import { counterFamily } from "../../../observability/MetricFamilies.js"

/** How long a connection may take to accept a terminal frame (PROTOCOL §5). */
const TERMINAL_DELIVERY_TIMEOUT: Duration.Duration = Duration.seconds(5)

const connectionsCut = counterFamily(
  "kv_dc_relay_stream_connections_cut_total",
  "stream connections destroyed because the client did not take the stream's end in time"
)

/** Completes once `response` was completely handed to the kernel or its connection closed. */
const finished = (response: Http.ServerResponse): Effect.Effect<void> =>
  Effect.async<void>((resume) => {
    if (response.writableFinished || response.destroyed) {
      resume(Effect.void)
      return
    }
    const done = () => resume(Effect.void)
    response.once("finish", done)
    response.once("close", done)
    return Effect.sync(() => {
      response.off("finish", done)
      response.off("close", done)
    })
  })

/**
 * Waits up to `timeout` (on the Clock) for `response` to finish, and destroys its connection when
 * it does not. Run it in a scope that outlives the request: the platform closes the request scope
 * when the body was handed to Node, not when Node could write it out.
 */
export const deliverOrCut = (
  response: Http.ServerResponse,
  /** The `stream` label (`pool`). */
  stream: string,
  timeout: Duration.Duration = TERMINAL_DELIVERY_TIMEOUT
): Effect.Effect<void> =>
  Effect.gen(function* () {
    const taken = yield* Effect.timeoutOption(finished(response), timeout)
    if (Option.isSome(taken)) return
    yield* Effect.logWarning(
      `KV DC Relay ${stream} stream client did not take the end of its stream within ${Duration.format(timeout)}; closing its connection`
    )
    yield* Metric.increment(Metric.tagged(connectionsCut, "stream", stream))
    response.destroy()
  })
