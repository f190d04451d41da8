/**
 * How live KV events and recovery queries reach the recovery layer, independent of the wire. The
 * relay host is given one (`src/transport/ZmqEventTransport.ts` over ZeroMQ); tests can give
 * theirs.
 */

import type { Effect, Scope } from "effect"
import type { KvEventSource } from "../protocol/Discovery.js"
import type { MalformedReason, RouterEvent, SkipCounts } from "../protocol/Events.js"
import type { WorkerQueryTransport } from "./WorkerQuery.js"

/**
 * Receives each decoded live batch with the publisher id that routes it. Returns `undefined` when
 * it handled the batch synchronously (the hot path builds no effect), else the effect that
 * completes the handling; the transport runs that before it hands over the source's next batch.
 */
export type LiveBatchHandler = (
  publisherId: bigint,
  events: ReadonlyArray<RouterEvent>
) => Effect.Effect<void> | undefined

type MalformedCounts = Readonly<Record<MalformedReason, number>>

/** Running totals since the subscriptions were made; closed sources still count. */
interface LiveSubscriptionTotals {
  readonly messages: number
  readonly events: number
  readonly blocks: number
  readonly malformedTotal: number
  readonly malformed?: MalformedCounts
  readonly skipped?: SkipCounts
  readonly stale?: number
}

/** Live subscriptions of one KV-state endpoint's sources. */
interface LiveEventSubscriptions {
  /** Opens and closes subscriptions so that exactly these sources are subscribed. */
  readonly sync: (sources: ReadonlyArray<KvEventSource>) => Effect.Effect<void>
  /** Subscribed sources whose connection to the publisher is established. */
  readonly connectedSources: Effect.Effect<ReadonlyArray<KvEventSource>>
  /**
   * Why each subscribed but unconnected source's last connection attempt failed, by
   * `sourceIdentityKey`, where the transport knows. Optional.
   */
  readonly connectionErrors?: Effect.Effect<ReadonlyMap<string, string>>
  readonly totals: Effect.Effect<LiveSubscriptionTotals>
}

/** Facts of the pool whose sources are subscribed, that decoding checks events against. */
interface LiveSubscriptionOptions {
  /** The card's `kvCacheBlockSize`. */
  readonly kvBlockSize?: number | undefined
}

/** How the relay subscribes to KV event sources (ZeroMQ in the product). */
export interface KvEventTransport {
  /** Subscriptions that deliver batches to `handler` in FIFO order per source; closed with the scope. */
  readonly subscribe: (
    handler: LiveBatchHandler,
    options?: LiveSubscriptionOptions
  ) => Effect.Effect<LiveEventSubscriptions, never, Scope.Scope>
  /** Recovery queries (worker query or engine replay). */
  readonly query: WorkerQueryTransport
}
