/**
 * The subscription supervisor of one pool generation against a recording target: subscriptions
 * before the supervisor's sync, readiness gating, a transport discontinuity, the release of an
 * unconnected rank from the first recovery wave, and an endpoint rebind.
 */

import { describe, expect, it } from "@effect/vitest"
import { Effect, Exit, Scope, SubscriptionRef, TestClock } from "effect"
import {
  type ExpectedRank,
  isRecoverableSource,
  type KvEventSource,
  type KvSourceMembershipView,
  rankKey
} from "../../src/protocol/Discovery.js"
import type { DpRank, RouterEvent, WorkerId } from "../../src/protocol/Events.js"
import { internalsOf } from "../../src/recovery/internal/SourceSupervisorInternals.js"
import type { RecoveryResetReason, RecoveryTarget, SourceEpoch } from "../../src/recovery/RecoveryTarget.js"
import * as SourceSubscriber from "../../src/relay/SourceSubscriber.js"
import { makeDynamoZmqPublisher } from "../../src/simulate/DynamoZmqPublisher.js"
import { makeZmqEventTransport } from "../../src/transport/ZmqEventTransport.js"
import { endpoint, source } from "../discovery/fixtures.js"
import { eventually } from "../integration/zmqHelpers.js"

const SERVING = endpoint("prod.backend.generate")

type Call =
  | { readonly op: "admit"; readonly eventId: number }
  | { readonly op: "replace"; readonly key: string }
  | { readonly op: "initial"; readonly key: string }
  | { readonly op: "reset"; readonly key: string; readonly reason: RecoveryResetReason }

const recordingTarget = () => {
  const calls: Array<Call> = []
  const target: RecoveryTarget = {
    admitEvent: (_epoch: SourceEpoch, event: RouterEvent) =>
      Effect.sync(() => {
        calls.push({ op: "admit", eventId: event.eventId })
      }),
    replaceRank: (_epoch: SourceEpoch, workerId: WorkerId, dpRank: DpRank) =>
      Effect.sync(() => {
        calls.push({ op: "replace", key: rankKey(workerId, dpRank) })
      }),
    completeInitialRecovery: (workerId: WorkerId, dpRank: DpRank) =>
      Effect.sync(() => {
        calls.push({ op: "initial", key: rankKey(workerId, dpRank) })
      }),
    resetRank: (_epoch: SourceEpoch, workerId: WorkerId, dpRank: DpRank, reason: RecoveryResetReason) =>
      Effect.sync(() => {
        calls.push({ op: "reset", key: rankKey(workerId, dpRank), reason })
      })
  }
  return { calls, target }
}

const view = (
  kvStateEndpoint: string,
  sources: ReadonlyArray<KvEventSource>,
  lifecycleGeneration = 0
): KvSourceMembershipView => {
  const ranks = new Map<string, ExpectedRank>()
  for (const s of sources) {
    ranks.set(rankKey(s.workerId, s.dpRank), {
      workerId: s.workerId,
      dpRank: s.dpRank,
      status: isRecoverableSource(s)
        ? { _tag: "ActiveRecoverable", source: s }
        : { _tag: "ActiveLiveOnly", source: s },
      lifecycleGeneration,
      recoveryExpected: true
    })
  }
  return {
    servingEndpoint: SERVING,
    endpointResolution: { _tag: "Resolved", endpoint: endpoint(kvStateEndpoint) },
    ranks
  }
}

const start = (initial: KvSourceMembershipView, target: RecoveryTarget) =>
  Effect.gen(function* () {
    const ref = yield* SubscriptionRef.make(initial)
    const subscriber = yield* SourceSubscriber.make({
      servingEndpoint: SERVING,
      target,
      sources: { current: SubscriptionRef.get(ref), changes: ref.changes },
      recoverySemaphore: yield* Effect.makeSemaphore(16),
      recoveryAttemptTimeout: "1 second",
      eventTransport: makeZmqEventTransport()
    })
    return { ref, subscriber }
  })

describe("SourceSubscriber", () => {
  it.scoped("an unconnected recoverable rank is released from the first wave after the grace", () =>
    Effect.gen(function* () {
      const { calls, target } = recordingTarget()
      const deaf: KvEventSource = {
        ...source({
          endpoint: "prod.backend.kv",
          worker: 1,
          rank: 0,
          publisher: 5,
          recovery: "tcp://127.0.0.1:1"
        }),
        transport: { kind: "dynamo-zmq", endpoint: "tcp://127.0.0.1:1", topic: "kv-events" }
      }
      const { subscriber } = yield* start(view("prod.backend.kv", [deaf]), target)
      // Not connected: the supervisor keeps the rank inactive (no recovery, no admission).
      expect(internalsOf(subscriber.supervisor).publisherBinding(5n)).toBeUndefined()
      yield* TestClock.adjust("1999 millis")
      expect(calls.filter((c) => c.op === "initial")).toEqual([])
      yield* TestClock.adjust("1 millis")
      yield* Effect.yieldNow()
      expect(calls.filter((c) => c.op === "initial")).toEqual([{ op: "initial", key: "1/0" }])
    })
  )

  it.scopedLive("a source activates once its socket connects and is fenced when the connection drops", () =>
    Effect.gen(function* () {
      const { calls, target } = recordingTarget()
      const publisherScope = yield* Scope.make()
      const publisher = yield* makeDynamoZmqPublisher({ workerId: "1", dpRank: 0 }).pipe(
        Scope.extend(publisherScope),
        Effect.orDie
      )
      const live = yield* publisher.source(endpoint("prod.backend.kv"), { recoverable: false })
      const { subscriber } = yield* start(view("prod.backend.kv", [live]), target)
      const publisherId = yield* publisher.publisherId
      yield* eventually(
        Effect.sync(() => internalsOf(subscriber.supervisor).publisherBinding(publisherId) !== undefined),
        "the source to activate"
      )
      yield* eventually(
        Effect.gen(function* () {
          yield* publisher.store([1n]).pipe(Effect.orDie)
          return calls.some((c) => c.op === "admit")
        }),
        "a live event to be admitted"
      )
      expect((yield* subscriber.ingest).events).toBeGreaterThan(0)

      yield* Scope.close(publisherScope, Exit.void)
      yield* eventually(
        Effect.sync(() => calls.some((c) => c.op === "reset" && c.reason === "Lifecycle")),
        "the transport fence",
        5000
      )
      expect(internalsOf(subscriber.supervisor).publisherBinding(publisherId)).toBeUndefined()
    })
  )

  it.scopedLive("an endpoint mapping change rebinds the subscriptions to the new endpoint's sources", () =>
    Effect.gen(function* () {
      const { target } = recordingTarget()
      const first = yield* makeDynamoZmqPublisher({ workerId: "1", dpRank: 0 }).pipe(Effect.orDie)
      const second = yield* makeDynamoZmqPublisher({ workerId: "1", dpRank: 0 }).pipe(Effect.orDie)
      const oldSource = yield* first.source(endpoint("prod.backend.kv-old"), { recoverable: false })
      const newSource = yield* second.source(endpoint("prod.backend.kv-new"), { recoverable: false })
      const { ref, subscriber } = yield* start(view("prod.backend.kv-old", [oldSource]), target)
      yield* eventually(
        Effect.sync(
          () => internalsOf(subscriber.supervisor).publisherBinding(oldSource.publisherId) !== undefined
        ),
        "the old source"
      )
      // The coordinator bumps the rank's lifecycle when the mapping changes.
      yield* SubscriptionRef.set(ref, view("prod.backend.kv-new", [newSource], 1))
      yield* eventually(
        Effect.sync(
          () =>
            internalsOf(subscriber.supervisor).publisherBinding(newSource.publisherId) !== undefined &&
            internalsOf(subscriber.supervisor).publisherBinding(oldSource.publisherId) === undefined
        ),
        "the rebind"
      )
      yield* subscriber.shutdown
      yield* subscriber.shutdown
      expect(internalsOf(subscriber.supervisor).publisherBinding(newSource.publisherId)).toBeUndefined()
    })
  )
})
