/**
 * The relay's event transport over ZeroMQ: SUB subscriptions of `dynamo-zmq` and `engine-zmq`
 * sources and the worker-query / replay client for recovery.
 */

import { Effect } from "effect"
import type { KvEventTransport } from "../recovery/EventTransport.js"
import { makeEventSubscriberPool } from "./EventSubscriberPool.js"
import { makeWorkerQueryClient } from "./WorkerQueryClient.js"

/** The KV event transport over ZeroMQ (both Dynamo and engine sources). */
export const makeZmqEventTransport = (): KvEventTransport => ({
  subscribe: (handler, options = {}) =>
    Effect.map(makeEventSubscriberPool({ handler, kvBlockSize: options.kvBlockSize }), (pool) => ({
      sync: pool.sync,
      connectedSources: pool.connectedSources,
      connectionErrors: pool.connectionErrors,
      totals: Effect.map(pool.stats, (stats) => stats.lifetime)
    })),
  query: makeWorkerQueryClient()
})
