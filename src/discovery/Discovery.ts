/**
 * The `Discovery` service: the complete current set of discovery records (PROTOCOL.md §2: model
 * card instances and KV event source advertisements) with a revision, as a value that changes.
 *
 * Both backends publish whole record sets, never deltas: the membership projection and the source
 * coordinators diff what they need. A record that did not change keeps its object identity from
 * one snapshot to the next, so consumers can detect unchanged records by reference.
 */

import { Clock, Context, Data, Effect, Ref, Stream, SubscriptionRef } from "effect"
import type { KvEventSource, ModelCardInstance } from "../protocol/Discovery.js"

/**
 * A source advertisement whose key could be read but whose value is malformed or disagrees with
 * its key. It is no source; it only invalidates its publisher for the endpoint named by the key
 * (relay-service §2.7: "malformed or mis-attributed metadata invalidates that publisher").
 */
export interface RejectedSource {
  /** `{kvStateEndpoint}/{workerId}/{dpRank}/{publisherId}` as the key spelled it. */
  readonly recordKey: string
  /** The KV-state endpoint named by the key (dotted text). */
  readonly kvStateEndpoint: string
  /** The publisher named by the key, when it is a u64. */
  readonly publisherId: bigint | undefined
  readonly reason: string
  /** The raw value, so a changed rejection is told from a repeated one. */
  readonly value: string
}

/**
 * The state of the backend's source stream. A source coordinator resets its source membership
 * whenever `epoch` changes (relay-service §2.7 "a discovery stream error resets membership and
 * rebinds") and treats sources as missing while `bound` is false. Neither built-in backend moves
 * it since PROTOCOL revision 2: an outage keeps the last membership in force, and the listing
 * that rebinds the stream is diffed against it like any other change.
 */
export interface SourceStreamState {
  /** Number of stream failures so far. */
  readonly epoch: number
  /** False between a stream failure and the re-list that rebinds it. */
  readonly bound: boolean
}

/** Every card and source discovery knows at one revision. */
export interface DiscoverySnapshot {
  /** Backend revision: the etcd store revision, or a counter of accepted file documents (from 1). */
  readonly revision: bigint
  readonly cards: ReadonlyArray<ModelCardInstance>
  readonly sources: ReadonlyArray<KvEventSource>
  readonly rejectedSources: ReadonlyArray<RejectedSource>
  readonly sourceStream: SourceStreamState
}

/**
 * How current the records are (PROTOCOL §2, `/v1/health` `discovery.state`): `live` while the
 * backend follows its source, `stale` while it cannot (the last records stay in force),
 * `connecting` before the first successful read.
 */
export type DiscoveryStateName = "live" | "stale" | "connecting"

/** Whether discovery is connected, and since when. */
export interface DiscoveryStatus {
  readonly state: DiscoveryStateName
  /** When the state last changed (the backend's start for the first state). */
  readonly since: Date
}

/** What a discovery backend offers: its snapshots, its status and its name. */
export interface DiscoveryShape {
  /** `file:PATH` or `etcd:URL,…`, for logs and health. */
  readonly backend: string
  /** The backend's current state. */
  readonly status: Effect.Effect<DiscoveryStatus>
  /** The latest snapshot. */
  readonly current: Effect.Effect<DiscoverySnapshot>
  /**
   * The latest snapshot, then every later one (a slow reader may see them coalesced only if it
   * buffers with a sliding strategy; snapshots are complete, so skipping is always safe). Ends
   * when the service closes.
   */
  readonly changes: Stream.Stream<DiscoverySnapshot>
  /** Stops watching and releases the backend; idempotent. Scope close does the same. */
  readonly close: Effect.Effect<void>
}

/** The discovery service (file or etcd). */
export class Discovery extends Context.Tag("kvrelay/Discovery")<Discovery, DiscoveryShape>() {}

/**
 * Startup failures: an unreadable or invalid initial file document. (An etcd that cannot be
 * reached at start is not one: the backend starts `connecting` and keeps retrying.)
 */
export class DiscoveryStartupError extends Data.TaggedError("DiscoveryStartupError")<{
  readonly backend: string
  readonly reason: string
}> {
  override get message(): string {
    return `discovery ${this.backend}: ${this.reason}`
  }
}

/** A snapshot with nothing in it at `revision`. */
export const emptySnapshot = (revision: bigint): DiscoverySnapshot => ({
  revision,
  cards: [],
  sources: [],
  rejectedSources: [],
  sourceStream: { epoch: 0, bound: true }
})

/**
 * The publishing half shared by the backends: a `SubscriptionRef` whose `changes` end on close.
 * Publishing is serialized by the ref, so readers see snapshots in publication order.
 */
export const makeSnapshotCell = (initial: DiscoverySnapshot) =>
  Effect.gen(function* () {
    const ref = yield* SubscriptionRef.make(initial)
    const closed = yield* Effect.makeLatch(false)
    return {
      ref,
      closed,
      publish: (next: DiscoverySnapshot) => SubscriptionRef.set(ref, next),
      changes: ref.changes.pipe(Stream.interruptWhen(closed.await)),
      current: SubscriptionRef.get(ref)
    }
  })

/** The backend's state; `set` moves `since` only when the state changes and says whether it did. */
export const makeStatusCell = (initial: DiscoveryStateName) =>
  Effect.gen(function* () {
    const ref = yield* Ref.make<DiscoveryStatus>({
      state: initial,
      since: new Date(yield* Clock.currentTimeMillis)
    })
    return {
      get: Ref.get(ref),
      set: (state: DiscoveryStateName): Effect.Effect<boolean> =>
        Effect.flatMap(Clock.currentTimeMillis, (now) =>
          Ref.modify(ref, (current) =>
            current.state === state ? [false, current] : [true, { state, since: new Date(now) }]
          )
        )
    }
  })

/** A discovery service over a fixed record set (tests and the demo's in-memory mode). */
export const makeStaticDiscovery = (snapshot: DiscoverySnapshot) =>
  Effect.gen(function* () {
    const cell = yield* makeSnapshotCell(snapshot)
    const status = yield* makeStatusCell("live")
    const service: DiscoveryShape & { readonly publish: (next: DiscoverySnapshot) => Effect.Effect<void> } = {
      backend: "memory",
      status: status.get,
      current: cell.current,
      changes: cell.changes,
      close: cell.closed.open,
      publish: cell.publish
    }
    return service
  })
