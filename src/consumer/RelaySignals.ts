/**
 * What the global consumer follows of each relay besides its catalog and pool streams, for
 * routing decisions (PROTOCOL §7.1 ◆3): the latest load window (`/v1/load/watch`) and the latest
 * readiness (`/v1/readiness/watch`), each with the time the consumer received it.
 *
 * Each watch is followed as a lane's pool stream is: on any fault what it said is dropped (a
 * relay's readiness is unknown until the watch is back, and its load ages out), and it is opened
 * again after a backoff of 500 ms doubling to 30 s with equal jitter, reset once a watch has stood
 * for the reconnect's reset time. The log says so once per change of a watch's state (a WARN when
 * it starts failing or its reason changes, an INFO when it stands again), not once per retry.
 */

import { Duration, Effect, Stream } from "effect"
import type { LoadWindowDocument, ReadinessDocument } from "../protocol/RelayApi.js"
import type { RelayClientError } from "./ConsumerErrors.js"
import { type RelayClient, relayClientErrorText } from "./RelayClient.js"

/** One pool's entry of a relay's load window. */
export type LoadPoolEntry = LoadWindowDocument["pools"][number]

/** A relay's latest load window as the consumer received it. */
export interface ReceivedLoad {
  /** Consumer clock (ms) when the window arrived. */
  readonly receivedAtMs: number
  /** By `ProducerIdentity.key`. */
  readonly pools: ReadonlyMap<string, LoadPoolEntry>
}

/** One entry (a model in a namespace) of a relay's readiness document. */
export type ReadinessEntry = ReadinessDocument["entries"][number]

/** A relay's latest readiness document as the consumer received it. */
export interface ReceivedReadiness {
  readonly receivedAtMs: number
  /** The entries that list each pool as a member, by `PoolId.key`, in document order. */
  readonly byPool: ReadonlyMap<string, ReadonlyArray<ReadinessEntry>>
}

/**
 * A readiness document as routing reads it: indexed by pool once when it arrives, so that a route
 * request looks up its candidates' entries instead of scanning every entry's members.
 */
export const receivedReadiness = (document: ReadinessDocument, receivedAtMs: number): ReceivedReadiness => {
  const byPool = new Map<string, Array<ReadinessEntry>>()
  for (const entry of document.entries) {
    const pools = new Set<string>()
    for (const member of entry.members) if (member.poolId !== undefined) pools.add(member.poolId.key)
    for (const key of pools) {
      const entries = byPool.get(key)
      if (entries === undefined) byPool.set(key, [entry])
      else entries.push(entry)
    }
  }
  return { receivedAtMs, byPool }
}

/** A watch's state: `starting` (nothing received yet), `up` (delivering), `failing` (retrying). */
export type SignalWatchState = "starting" | "up" | "failing"

/** One watch of one relay: its state, its latest error and how often it was opened again. */
export interface SignalWatchStatus {
  readonly state: SignalWatchState
  readonly lastError: string | undefined
  readonly resubscribes: number
}

/** The synchronous view routing reads on its hot path. */
export interface RelaySignalsView {
  readonly load: (relay: string) => ReceivedLoad | undefined
  readonly readiness: (relay: string) => ReceivedReadiness | undefined
  readonly status: (relay: string, watch: "load" | "readiness") => SignalWatchStatus
}

interface WatchState {
  state: SignalWatchState
  lastError: string | undefined
  resubscribes: number
}

/** The store the followers write and routing reads. */
export class RelaySignals implements RelaySignalsView {
  private readonly loads = new Map<string, ReceivedLoad>()
  private readonly readinesses = new Map<string, ReceivedReadiness>()
  private readonly watches = new Map<string, WatchState>()

  load(relay: string): ReceivedLoad | undefined {
    return this.loads.get(relay)
  }

  readiness(relay: string): ReceivedReadiness | undefined {
    return this.readinesses.get(relay)
  }

  status(relay: string, watch: "load" | "readiness"): SignalWatchStatus {
    const state = this.watches.get(`${watch}\0${relay}`)
    return state === undefined
      ? { state: "starting", lastError: undefined, resubscribes: 0 }
      : { state: state.state, lastError: state.lastError, resubscribes: state.resubscribes }
  }

  /** @internal */
  watchState(relay: string, watch: "load" | "readiness"): WatchState {
    const key = `${watch}\0${relay}`
    let state = this.watches.get(key)
    if (state === undefined) {
      state = { state: "starting", lastError: undefined, resubscribes: 0 }
      this.watches.set(key, state)
    }
    return state
  }

  /** @internal */
  setLoad(relay: string, window: LoadWindowDocument, receivedAtMs: number): void {
    const pools = new Map<string, LoadPoolEntry>()
    for (const pool of window.pools) pools.set(pool.producer.key, pool)
    this.loads.set(relay, { receivedAtMs, pools })
  }

  /** @internal */
  setReadiness(relay: string, document: ReadinessDocument, receivedAtMs: number): void {
    this.readinesses.set(relay, receivedReadiness(document, receivedAtMs))
  }

  /** @internal */
  forget(relay: string, watch: "load" | "readiness"): void {
    if (watch === "load") this.loads.delete(relay)
    else this.readinesses.delete(relay)
  }
}

/** What `follow` needs of one relay: its client, the subscriber id and the reconnect backoff. */
export interface FollowOptions {
  readonly relay: string
  readonly client: RelayClient
  readonly subscriberId: string
  /** A watch that stood this long starts the next backoff from its first step. */
  readonly resetAfterMs: number
  /** The wait before attempt `attempt` (0 first): the consumer's reconnect backoff. */
  readonly backoff: (attempt: number) => Effect.Effect<Duration.Duration>
  /** Whether the relay's catalog watch stands now (its epoch is connected). */
  readonly relayConnected: () => boolean
}

/**
 * Follows one watch of one relay forever (until interrupted), writing what it receives into
 * `signals`. Never fails: every fault is a retry.
 */
const followWatch = (
  signals: RelaySignals,
  watch: "load" | "readiness",
  options: FollowOptions
): Effect.Effect<never> =>
  Effect.gen(function* () {
    const { relay, client, subscriberId, resetAfterMs, backoff } = options
    const state = signals.watchState(relay, watch)
    const annotations = { relay, watch }
    let attempt = 0
    let warned = false
    for (;;) {
      const started = yield* Effect.clockWith((clock) => clock.currentTimeMillis)
      const stream: Stream.Stream<void, RelayClientError> =
        watch === "load"
          ? client
              .watchLoad(`${subscriberId}/load`)
              .pipe(
                Stream.mapEffect((window) =>
                  Effect.clockWith((clock) =>
                    Effect.map(clock.currentTimeMillis, (now) => signals.setLoad(relay, window, now))
                  )
                )
              )
          : client
              .watchReadiness(`${subscriberId}/readiness`)
              .pipe(
                Stream.mapEffect((document) =>
                  Effect.clockWith((clock) =>
                    Effect.map(clock.currentTimeMillis, (now) => signals.setReadiness(relay, document, now))
                  )
                )
              )
      const outcome = yield* stream.pipe(
        Stream.tap(() =>
          Effect.suspend(() => {
            if (state.state === "up") return Effect.void
            state.state = "up"
            state.lastError = undefined
            if (!warned) return Effect.void
            warned = false
            return Effect.logInfo(`relay ${watch} watch recovered`).pipe(Effect.annotateLogs(annotations))
          })
        ),
        Stream.runDrain,
        Effect.either
      )
      const why = outcome._tag === "Left" ? relayClientErrorText(outcome.left) : `${watch} watch ended`
      signals.forget(relay, watch)
      const now = yield* Effect.clockWith((clock) => clock.currentTimeMillis)
      if (now - started >= resetAfterMs) attempt = 0
      const delay = yield* backoff(attempt)
      attempt += 1
      state.resubscribes += 1
      state.state = "failing"
      state.lastError = why
      const retry = { ...annotations, error: why, retryInMs: Math.round(Duration.toMillis(delay)) }
      yield* Effect.logDebug(`relay ${watch} watch ended; retrying`).pipe(Effect.annotateLogs(retry))
      yield* Effect.sleep(delay)
      // A relay that is down is logged once by its catalog loop; a watch failing on a relay whose
      // catalog still stands is this relay's own state change, logged once per failing spell. The
      // catalog is asked after the retry delay: the watch and the catalog stream see the relay's
      // sockets close at about the same moment, and the watch may see it first.
      if (!warned && options.relayConnected()) {
        warned = true
        yield* Effect.logWarning(`relay ${watch} watch failing; retrying`).pipe(Effect.annotateLogs(retry))
      }
    }
  }).pipe(Effect.withSpan("RelaySignals.follow", { attributes: { relay: options.relay, watch } }))

/** Follows both watches of one relay until interrupted. */
export const follow = (signals: RelaySignals, options: FollowOptions): Effect.Effect<never> =>
  Effect.raceAll([followWatch(signals, "load", options), followWatch(signals, "readiness", options)])
