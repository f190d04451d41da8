/**
 * How live KV events and recovery queries reach the recovery layer, independent of the wire. The
 * relay host is given one (`src/transport/ZmqEventTransport.ts` over ZeroMQ); tests can give
 * theirs.
 */

import type { Effect, Scope } from "effect"
import type { RouterEvent } from "../domain/events.js"
import type { KvEventSource } from "../domain/sources.js"
import type { WorkerQueryTransport } from "./WorkerQuery.js"

/** Receives each decoded live batch with the publisher id that routes it. */
export type LiveBatchHandler = (
  publisherId: bigint,
  events: ReadonlyArray<RouterEvent>
) => Effect.Effect<void>

/** Running totals since the subscriptions were made; closed sources still count. */
export interface LiveSubscriptionTotals {
  readonly messages: number
  readonly events: number
  readonly blocks: number
  readonly malformedTotal: number
}

/** Live subscriptions of one KV-state endpoint's sources. */
export interface LiveEventSubscriptions {
  /** Opens and closes subscriptions so that exactly these sources are subscribed. */
  readonly sync: (sources: ReadonlyArray<KvEventSource>) => Effect.Effect<void>
  /** Subscribed sources whose connection to the publisher is established. */
  readonly connectedSources: Effect.Effect<ReadonlyArray<KvEventSource>>
  readonly totals: Effect.Effect<LiveSubscriptionTotals>
}

export interface KvEventTransport {
  /** Subscriptions that deliver batches to `handler` in FIFO order per source; closed with the scope. */
  readonly subscribe: (handler: LiveBatchHandler) => Effect.Effect<LiveEventSubscriptions, never, Scope.Scope>
  /** Recovery queries (worker query or engine replay). */
  readonly query: WorkerQueryTransport
}
