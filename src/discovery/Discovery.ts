/**
 * The `Discovery` service: the complete current set of discovery records (PROTOCOL.md §2: model
 * card instances and KV event source advertisements) with a revision, as a value that changes.
 *
 * Both backends publish whole record sets, never deltas: the membership projection and the source
 * coordinators diff what they need. A record that did not change keeps its object identity from
 * one snapshot to the next, so consumers can detect unchanged records by reference.
 */

import { Context, Data, Effect, Layer, Stream, SubscriptionRef } from "effect"
import type { ModelCardInstance } from "../domain/json.js"
import type { KvEventSource } from "../domain/sources.js"

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
 * The state of the backend's source stream. A failed stream may have missed changes, so a source
 * coordinator resets its source membership whenever `epoch` changes (§2.7 "a discovery stream
 * error resets membership and rebinds") and treats sources as missing while `bound` is false.
 */
export interface SourceStreamState {
  /** Number of stream failures so far. */
  readonly epoch: number
  /** False between a stream failure and the re-list that rebinds it. */
  readonly bound: boolean
}

export interface DiscoverySnapshot {
  /** Backend revision: the etcd store revision, or a counter of accepted file documents (from 1). */
  readonly revision: bigint
  readonly cards: ReadonlyArray<ModelCardInstance>
  readonly sources: ReadonlyArray<KvEventSource>
  readonly rejectedSources: ReadonlyArray<RejectedSource>
  readonly sourceStream: SourceStreamState
}

export interface DiscoveryShape {
  /** `file:PATH` or `etcd:URL,…`, for logs and health. */
  readonly backend: string
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

export class Discovery extends Context.Tag("kvrelay/Discovery")<Discovery, DiscoveryShape>() {}

/** Startup failures: an unreadable or invalid initial file document, an unreachable etcd. */
export class DiscoveryStartupError extends Data.TaggedError("DiscoveryStartupError")<{
  readonly backend: string
  readonly reason: string
}> {
  override get message(): string {
    return `discovery ${this.backend}: ${this.reason}`
  }
}

export const emptySnapshot = (revision: bigint): DiscoverySnapshot => ({
  revision,
  cards: [],
  sources: [],
  rejectedSources: [],
  sourceStream: { epoch: 0, bound: true }
})

/** Same records by reference and same stream state: nothing a consumer could observe changed. */
export const sameRecords = (a: DiscoverySnapshot, b: DiscoverySnapshot): boolean =>
  sameElements(a.cards, b.cards) &&
  sameElements(a.sources, b.sources) &&
  sameElements(a.rejectedSources, b.rejectedSources) &&
  a.sourceStream.epoch === b.sourceStream.epoch &&
  a.sourceStream.bound === b.sourceStream.bound

const sameElements = <A>(a: ReadonlyArray<A>, b: ReadonlyArray<A>): boolean => {
  if (a === b) return true
  if (a.length !== b.length) return false
  for (let i = 0; i < a.length; i++) if (a[i] !== b[i]) return false
  return true
}

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

/** A discovery service over a fixed record set (tests and the demo's in-memory mode). */
export const makeStaticDiscovery = (snapshot: DiscoverySnapshot) =>
  Effect.gen(function* () {
    const cell = yield* makeSnapshotCell(snapshot)
    const service: DiscoveryShape & { readonly publish: (next: DiscoverySnapshot) => Effect.Effect<void> } = {
      backend: "memory",
      current: cell.current,
      changes: cell.changes,
      close: cell.closed.open,
      publish: cell.publish
    }
    return service
  })

export const staticDiscoveryLayer = (snapshot: DiscoverySnapshot): Layer.Layer<Discovery> =>
  Layer.effect(Discovery, makeStaticDiscovery(snapshot))
