/**
 * One subscription per active KV event source, kept in step with discovery by `sync`.
 *
 * - `dynamo-zmq` sources that share a publisher endpoint and topic share one SUB socket; its
 *   batches are routed by the envelope's publisher id.
 * - every `engine-zmq` source has its own SUB (its decoding depends on the source identity) and
 *   its batches are routed under the advertised publisher id.
 *
 * Each publisher id gets a lane: a bounded queue and one fiber calling the handler, so batches of
 * one source are handled in arrival order and a slow source never delays another. A full lane
 * makes its socket's receive loop wait (as Dynamo's bounded channels do); ZeroMQ's high-water
 * mark then drops at the publisher, which the recovery layer sees as a gap. Batches whose
 * publisher id matches no active source still reach the handler (it drops them, as the seed's
 * `handle_live_batch` does) through the subscription's shared fallback lane.
 *
 * Malformed messages are counted per source by reason (per subscription when the publisher
 * cannot be told) and dropped; they never affect another source or stop a subscription.
 */

import { Cause, Effect, ExecutionStrategy, Exit, Fiber, Queue, Schedule, Scope } from "effect"
import * as RelayMetrics from "../observability/RelayMetrics.js"
import { supervised } from "../observability/Supervised.js"
import { type KvEventSource, sourceIdentityKey } from "../protocol/Discovery.js"
import type { RouterEvent } from "../protocol/Events.js"
import { subscribeDynamo } from "./DynamoZmq.js"
import { subscribeEngine } from "./EngineZmq.js"
import {
  type Delivered,
  type IngestMessage,
  MALFORMED_REASONS,
  type MalformedReason,
  RECEIVE_LOOP,
  type ReceiveLoop,
  SKIP_REASONS,
  type SkipCounts,
  type SkipReason,
  type ZmqError
} from "./ZmqSocket.js"

/** Handles one batch; `undefined` when it was handled synchronously, else the effect that completes it. */
type BatchHandler = (publisherId: bigint, events: ReadonlyArray<RouterEvent>) => Delivered

interface EventSubscriberPoolOptions {
  readonly handler: BatchHandler
  /** Batches queued per publisher lane before its socket waits (default 1024). */
  readonly laneCapacity?: number
  /** The pool's `kvCacheBlockSize`: engine `BlockStored` events of another block size are malformed. */
  readonly kvBlockSize?: number | undefined
}

type MalformedCounts = Readonly<Record<MalformedReason, number>>

interface SourceIngestStats {
  readonly key: string
  readonly source: KvEventSource
  readonly connected: boolean
  readonly messages: number
  readonly events: number
  readonly blocks: number
  /** Engine events not applied on purpose (skipped ones and unknown types). */
  readonly ignored: number
  /** Engine events skipped by reason (not the worker's device cache, PROTOCOL §3.2). */
  readonly skipped: SkipCounts
  /** Batches dropped because their seq was below the last accepted one. */
  readonly stale: number
  readonly malformed: MalformedCounts
  readonly malformedTotal: number
}

interface SubscriptionIngestStats {
  readonly key: string
  readonly endpoint: string
  readonly connected: boolean
  readonly sources: number
  /** Batches whose publisher id matched no active source of this subscription. */
  readonly unroutedMessages: number
  /** Malformed messages that could not be attributed to one of the subscription's sources. */
  readonly unattributedMalformed: MalformedCounts
}

interface EventSubscriberPoolStats {
  readonly sources: ReadonlyArray<SourceIngestStats>
  readonly subscriptions: ReadonlyArray<SubscriptionIngestStats>
  readonly totals: {
    readonly messages: number
    readonly events: number
    readonly blocks: number
    readonly malformed: MalformedCounts
    readonly malformedTotal: number
  }
  /**
   * Like `totals`, but since the pool was made: sources and subscriptions that were closed since
   * still count (additive; cumulative ingest diagnostics).
   */
  readonly lifetime: LifetimeIngest
}

/** Cumulative counts of a pool since it was made, closed sources and subscriptions included. */
interface LifetimeIngest {
  readonly messages: number
  readonly events: number
  readonly blocks: number
  readonly malformedTotal: number
  readonly malformed: MalformedCounts
  readonly skipped: SkipCounts
  readonly stale: number
}

/** The relay's subscriptions to KV event sources, opened and closed to match discovery. */
export interface EventSubscriberPool {
  /** Opens and closes subscriptions so that exactly these sources are subscribed. */
  readonly sync: (sources: ReadonlyArray<KvEventSource>) => Effect.Effect<void>
  /** Active sources whose socket has completed its handshake with the publisher. */
  readonly connectedSources: Effect.Effect<ReadonlyArray<KvEventSource>>
  readonly isConnected: (source: KvEventSource) => Effect.Effect<boolean>
  /** Why each unconnected source's last attempt failed, by source identity key. */
  readonly connectionErrors: Effect.Effect<ReadonlyMap<string, string>>
  readonly stats: Effect.Effect<EventSubscriberPoolStats>
}

/** Identity of one source incarnation and its transport. */
const sourceKey = sourceIdentityKey

const subscriptionKey = (source: KvEventSource): string => {
  const t = source.transport
  return t.kind === "dynamo-zmq"
    ? `dynamo|${t.endpoint}|${t.topic}`
    : `engine|${t.endpoint}|${t.topic}|${source.workerId}|${source.dpRank}|${source.publisherId}`
}

const zeroCounts = (): Record<MalformedReason, number> => {
  const out = {} as Record<MalformedReason, number>
  for (const reason of MALFORMED_REASONS) out[reason] = 0
  return out
}

const zeroSkips = (): Record<SkipReason, number> => ({
  medium: 0,
  locality: 0,
  ownership: 0,
  group: 0,
  namespace: 0
})

const sumCounts = (counts: MalformedCounts): number => {
  let total = 0
  for (const reason of MALFORMED_REASONS) total += counts[reason]
  return total
}

interface SourceEntry {
  readonly key: string
  readonly source: KvEventSource
  readonly subscription: Subscription
  messages: number
  events: number
  blocks: number
  ignored: number
  readonly skipped: Record<SkipReason, number>
  stale: number
  readonly malformed: Record<MalformedReason, number>
}

interface Lane {
  readonly queue: Queue.Queue<readonly [bigint, ReadonlyArray<RouterEvent>]>
  fiber: Fiber.RuntimeFiber<never, never> | undefined
  /** Sources routed through this lane (two incarnations may share a publisher id only transiently). */
  readonly sources: Set<SourceEntry>
  /** Batches offered to the lane and not yet handled (queued or in the handler). */
  pending: number
}

interface Subscription {
  readonly key: string
  readonly endpoint: string
  readonly scope: Scope.CloseableScope
  connected: boolean
  /** Why the last connection attempt failed or ended, until a handshake succeeds. */
  lastError: string | undefined
  readonly sources: Map<string, SourceEntry>
  readonly lanes: Map<bigint, Lane>
  fallback: Lane | undefined
  unroutedMessages: number
  readonly unattributed: Record<MalformedReason, number>
  /** Reasons already logged at warning level (later ones are logged at debug). */
  readonly warned: Set<string>
}

/** Subscription (re)open backoff: 100 ms doubling to 5 s (subscriber.rs). */
const reopenSchedule = Schedule.exponential("100 millis", 2).pipe(
  Schedule.either(Schedule.spaced("5 seconds"))
)

/** An event subscriber pool for the scope's life. */
export const makeEventSubscriberPool = (
  options: EventSubscriberPoolOptions
): Effect.Effect<EventSubscriberPool, never, Scope.Scope> =>
  Effect.gen(function* () {
    const poolScope = yield* Effect.scope
    const laneCapacity = options.laneCapacity ?? 1024
    const handler = options.handler
    const subscriptions = new Map<string, Subscription>()
    const sources = new Map<string, SourceEntry>()
    const syncLock = yield* Effect.makeSemaphore(1)
    // Counts of closed sources and subscriptions, so `lifetime` never goes backwards.
    const retired = {
      messages: 0,
      events: 0,
      blocks: 0,
      malformed: zeroCounts(),
      skipped: zeroSkips(),
      stale: 0
    }
    const retireMalformed = (counts: MalformedCounts): void => {
      for (const reason of MALFORMED_REASONS) retired.malformed[reason] += counts[reason]
    }

    const handlerFailed = (
      subscription: Subscription,
      publisherId: bigint,
      cause: Cause.Cause<unknown>
    ): Effect.Effect<void> =>
      Effect.logError("KV event batch handler failed; the batch is dropped").pipe(
        Effect.zipRight(RelayMetrics.ingestDropped("handler-failed")),
        Effect.annotateLogs({
          endpoint: subscription.endpoint,
          publisherId: String(publisherId),
          cause: String(cause)
        })
      )

    /** Runs the handler; whether it fails synchronously or in its effect, only the batch is dropped. */
    const handle = (
      subscription: Subscription,
      publisherId: bigint,
      events: ReadonlyArray<RouterEvent>
    ): Delivered => {
      let rest: Delivered
      try {
        rest = handler(publisherId, events)
      } catch (defect) {
        return handlerFailed(subscription, publisherId, Cause.die(defect))
      }
      return rest === undefined
        ? undefined
        : Effect.catchAllCause(rest, (cause) => handlerFailed(subscription, publisherId, cause))
    }

    const makeLane = (subscription: Subscription): Effect.Effect<Lane> =>
      Effect.gen(function* () {
        const queue = yield* Queue.bounded<readonly [bigint, ReadonlyArray<RouterEvent>]>(laneCapacity)
        const lane: Lane = { queue, fiber: undefined, sources: new Set<SourceEntry>(), pending: 0 }
        lane.fiber = yield* Queue.take(queue).pipe(
          Effect.flatMap(([publisherId, events]) =>
            Effect.suspend(() => handle(subscription, publisherId, events) ?? Effect.void).pipe(
              Effect.ensuring(
                Effect.sync(() => {
                  lane.pending--
                })
              )
            )
          ),
          Effect.forever,
          Effect.forkIn(subscription.scope)
        )
        return lane
      })

    /**
     * Hands a batch to its lane. A subscription with a single lane and nothing pending calls the
     * handler inline, saving the queue hop: only its receive loop feeds the lane, so nothing can
     * be overtaken, and waiting there stalls no other source.
     */
    const enqueue = (
      subscription: Subscription,
      lane: Lane,
      publisherId: bigint,
      events: ReadonlyArray<RouterEvent>
    ): Delivered => {
      if (lane.pending === 0 && lane !== subscription.fallback && subscription.lanes.size === 1)
        return handle(subscription, publisherId, events)
      lane.pending++
      return Queue.offer(lane.queue, [publisherId, events])
    }

    const closeLane = (lane: Lane): Effect.Effect<void> =>
      (lane.fiber === undefined ? Effect.void : Fiber.interrupt(lane.fiber)).pipe(
        Effect.zipRight(Queue.shutdown(lane.queue))
      )

    /** The source a message claims to come from, when its publisher id routes to one. */
    const entryOf = (
      subscription: Subscription,
      publisherId: bigint | undefined
    ): SourceEntry | undefined => {
      const lane = publisherId === undefined ? undefined : subscription.lanes.get(publisherId)
      return lane === undefined ? undefined : lane.sources.values().next().value
    }

    /** The first drop of each kind on a subscription is a warning, later ones debug lines. */
    const logDrop = (subscription: Subscription, kind: string, message: string) => {
      const first = !subscription.warned.has(kind)
      if (first) subscription.warned.add(kind)
      return first ? Effect.logWarning(message) : Effect.logDebug(message)
    }

    const deliver =
      (subscription: Subscription) =>
      (message: IngestMessage): Delivered => {
        if (message._tag === "Malformed") {
          const entry = entryOf(subscription, message.publisherId)
          if (entry !== undefined) entry.malformed[message.reason]++
          else subscription.unattributed[message.reason]++
          return logDrop(subscription, message.reason, "dropping a malformed KV event message").pipe(
            Effect.zipRight(RelayMetrics.ingestMalformedMessage(message.reason)),
            Effect.zipRight(RelayMetrics.ingestDropped("malformed")),
            Effect.annotateLogs({
              endpoint: subscription.endpoint,
              reason: message.reason,
              detail: message.message,
              publisherId: message.publisherId === undefined ? "unknown" : String(message.publisherId)
            })
          )
        }
        if (message._tag === "Stale") {
          const entry = entryOf(subscription, message.publisherId)
          if (entry !== undefined) entry.stale++
          return logDrop(
            subscription,
            "stale",
            "dropping a KV event batch whose seq is below the last accepted one"
          ).pipe(
            Effect.zipRight(RelayMetrics.ingestDropped("stale")),
            Effect.annotateLogs({
              endpoint: subscription.endpoint,
              reason: "stale",
              seq: message.sequence,
              publisherId: String(message.publisherId)
            })
          )
        }
        const lane = subscription.lanes.get(message.publisherId)
        if (lane === undefined) {
          subscription.unroutedMessages++
          const fallback = subscription.fallback
          return fallback === undefined
            ? undefined
            : enqueue(subscription, fallback, message.publisherId, message.events)
        }
        const skipped = message.skipped
        for (const entry of lane.sources) {
          entry.messages++
          entry.events += message.events.length
          entry.blocks += message.blocks
          entry.ignored += message.ignored
          if (skipped !== undefined && message.ignored > 0)
            for (const reason of SKIP_REASONS) entry.skipped[reason] += skipped[reason]
          break
        }
        if (skipped === undefined || message.ignored === 0)
          return enqueue(subscription, lane, message.publisherId, message.events)
        return Effect.zipRight(
          RelayMetrics.ingestSkipped(skipped),
          Effect.suspend(
            () => enqueue(subscription, lane, message.publisherId, message.events) ?? Effect.void
          )
        )
      }

    const openSubscription = (first: KvEventSource): Effect.Effect<Subscription> =>
      Effect.gen(function* () {
        const scope = yield* Scope.fork(poolScope, ExecutionStrategy.sequential)
        const transport = first.transport
        const subscription: Subscription = {
          key: subscriptionKey(first),
          endpoint: transport.endpoint,
          scope,
          connected: false,
          lastError: undefined,
          sources: new Map(),
          lanes: new Map(),
          fallback: undefined,
          unroutedMessages: 0,
          unattributed: zeroCounts(),
          warned: new Set()
        }
        const onConnection = (connected: boolean) => {
          subscription.connected = connected
          if (connected) subscription.lastError = undefined
        }
        const onConnectionError = (error: string) => {
          subscription.lastError = error
        }
        const open: Effect.Effect<ReceiveLoop, ZmqError, Scope.Scope> =
          transport.kind === "dynamo-zmq"
            ? subscribeDynamo({
                endpoint: transport.endpoint,
                topic: transport.topic,
                deliver: deliver(subscription),
                onConnection,
                onConnectionError
              })
            : subscribeEngine({
                endpoint: transport.endpoint,
                source: {
                  workerId: first.workerId,
                  dpRank: first.dpRank,
                  publisherId: first.publisherId,
                  topic: transport.topic
                },
                decode: { kvBlockSize: options.kvBlockSize },
                deliver: deliver(subscription),
                onConnection,
                onConnectionError
              })
        // Each attempt owns a child scope, so a failed attempt releases its socket at once. An
        // attempt lasts as long as its receive loop: a receive error reopens the subscription
        // with backoff, and a defect restarts it under supervision.
        const attempt = Effect.gen(function* () {
          const attemptScope = yield* Scope.fork(scope, ExecutionStrategy.sequential)
          return yield* Effect.gen(function* () {
            const loop = yield* open.pipe(
              Scope.extend(attemptScope),
              Effect.withSpan("EventSubscriberPool.subscribe", {
                attributes: { endpoint: transport.endpoint, topic: transport.topic, kind: transport.kind }
              })
            )
            return yield* loop.done
          }).pipe(Effect.onError(() => Scope.close(attemptScope, Exit.void)))
        })
        yield* attempt.pipe(
          Effect.tapError((error) =>
            Effect.logWarning("KV event subscription failed; retrying").pipe(
              Effect.annotateLogs({
                endpoint: error.endpoint,
                operation: error.operation,
                error: error.message
              })
            )
          ),
          Effect.retry(reopenSchedule),
          (loop) => supervised(RECEIVE_LOOP, loop),
          Effect.forkIn(scope)
        )
        if (transport.kind === "dynamo-zmq") subscription.fallback = yield* makeLane(subscription)
        yield* Effect.logInfo("KV event subscription opened").pipe(
          Effect.annotateLogs({ endpoint: transport.endpoint, topic: transport.topic, kind: transport.kind })
        )
        return subscription
      })

    const closeSubscription = (subscription: Subscription): Effect.Effect<void> =>
      Scope.close(subscription.scope, Exit.void).pipe(
        Effect.zipRight(
          Effect.logInfo("KV event subscription closed").pipe(
            Effect.annotateLogs({ endpoint: subscription.endpoint })
          )
        ),
        Effect.withSpan("EventSubscriberPool.unsubscribe", {
          attributes: { endpoint: subscription.endpoint }
        })
      )

    const addSource = (source: KvEventSource, key: string): Effect.Effect<void> =>
      Effect.gen(function* () {
        const subKey = subscriptionKey(source)
        let subscription = subscriptions.get(subKey)
        if (subscription === undefined) {
          subscription = yield* openSubscription(source)
          subscriptions.set(subKey, subscription)
        }
        const entry: SourceEntry = {
          key,
          source,
          subscription,
          messages: 0,
          events: 0,
          blocks: 0,
          ignored: 0,
          skipped: zeroSkips(),
          stale: 0,
          malformed: zeroCounts()
        }
        let lane = subscription.lanes.get(source.publisherId)
        if (lane === undefined) {
          lane = yield* makeLane(subscription)
          subscription.lanes.set(source.publisherId, lane)
        }
        lane.sources.add(entry)
        subscription.sources.set(key, entry)
        sources.set(key, entry)
      })

    const removeSource = (entry: SourceEntry): Effect.Effect<void> =>
      Effect.gen(function* () {
        sources.delete(entry.key)
        retired.messages += entry.messages
        retired.events += entry.events
        retired.blocks += entry.blocks
        retireMalformed(entry.malformed)
        for (const reason of SKIP_REASONS) retired.skipped[reason] += entry.skipped[reason]
        retired.stale += entry.stale
        const subscription = entry.subscription
        subscription.sources.delete(entry.key)
        const lane = subscription.lanes.get(entry.source.publisherId)
        if (lane !== undefined) {
          lane.sources.delete(entry)
          if (lane.sources.size === 0) {
            subscription.lanes.delete(entry.source.publisherId)
            yield* closeLane(lane)
          }
        }
        if (subscription.sources.size === 0) {
          subscriptions.delete(subscription.key)
          retireMalformed(subscription.unattributed)
          yield* closeSubscription(subscription)
        }
      })

    const sync = (desired: ReadonlyArray<KvEventSource>): Effect.Effect<void> =>
      Effect.gen(function* () {
        const wanted = new Map<string, KvEventSource>()
        for (const source of desired) wanted.set(sourceKey(source), source)
        // Add before removing: a socket shared by an outgoing and an incoming incarnation stays open,
        // so the new incarnation's first messages are not lost to a reconnect.
        for (const [key, source] of wanted) if (!sources.has(key)) yield* addSource(source, key)
        for (const entry of [...sources.values()]) if (!wanted.has(entry.key)) yield* removeSource(entry)
      }).pipe(
        syncLock.withPermits(1),
        Effect.withSpan("EventSubscriberPool.sync", { attributes: { sources: desired.length } })
      )

    const stats = Effect.sync((): EventSubscriberPoolStats => {
      const sourceStats: Array<SourceIngestStats> = []
      const totals = { messages: 0, events: 0, blocks: 0, malformed: zeroCounts() }
      const skippedNow = zeroSkips()
      let staleNow = 0
      for (const entry of sources.values()) {
        const malformed = { ...entry.malformed }
        sourceStats.push({
          key: entry.key,
          source: entry.source,
          connected: entry.subscription.connected,
          messages: entry.messages,
          events: entry.events,
          blocks: entry.blocks,
          ignored: entry.ignored,
          skipped: { ...entry.skipped },
          stale: entry.stale,
          malformed,
          malformedTotal: sumCounts(malformed)
        })
        for (const reason of SKIP_REASONS) skippedNow[reason] += entry.skipped[reason]
        staleNow += entry.stale
        totals.messages += entry.messages
        totals.events += entry.events
        totals.blocks += entry.blocks
        for (const reason of MALFORMED_REASONS) totals.malformed[reason] += entry.malformed[reason]
      }
      const subscriptionStats: Array<SubscriptionIngestStats> = []
      for (const subscription of subscriptions.values()) {
        const unattributed = { ...subscription.unattributed }
        for (const reason of MALFORMED_REASONS) totals.malformed[reason] += unattributed[reason]
        subscriptionStats.push({
          key: subscription.key,
          endpoint: subscription.endpoint,
          connected: subscription.connected,
          sources: subscription.sources.size,
          unroutedMessages: subscription.unroutedMessages,
          unattributedMalformed: unattributed
        })
      }
      const malformedTotal = sumCounts(totals.malformed)
      const lifetimeMalformed = zeroCounts()
      for (const reason of MALFORMED_REASONS)
        lifetimeMalformed[reason] = retired.malformed[reason] + totals.malformed[reason]
      const lifetimeSkipped = zeroSkips()
      for (const reason of SKIP_REASONS)
        lifetimeSkipped[reason] = retired.skipped[reason] + skippedNow[reason]
      return {
        sources: sourceStats,
        subscriptions: subscriptionStats,
        totals: { ...totals, malformedTotal },
        lifetime: {
          messages: retired.messages + totals.messages,
          events: retired.events + totals.events,
          blocks: retired.blocks + totals.blocks,
          malformedTotal: sumCounts(lifetimeMalformed),
          malformed: lifetimeMalformed,
          skipped: lifetimeSkipped,
          stale: retired.stale + staleNow
        }
      }
    })

    yield* Effect.addFinalizer(() =>
      Effect.sync(() => {
        subscriptions.clear()
        sources.clear()
      })
    )

    return {
      sync,
      connectedSources: Effect.sync(() =>
        [...sources.values()].filter((entry) => entry.subscription.connected).map((entry) => entry.source)
      ),
      isConnected: (source) =>
        Effect.sync(() => sources.get(sourceKey(source))?.subscription.connected ?? false),
      connectionErrors: Effect.sync(() => {
        const errors = new Map<string, string>()
        for (const entry of sources.values()) {
          const error = entry.subscription.lastError
          if (!entry.subscription.connected && error !== undefined) errors.set(entry.key, error)
        }
        return errors
      }),
      stats
    } satisfies EventSubscriberPool
  })
