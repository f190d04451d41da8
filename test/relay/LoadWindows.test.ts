/**
 * Load windows (relay-service §4.4 "Load") on the TestClock: one complete window per interval
 * with sequences from 1, the current window then only newer ones per subscriber, and a
 * subscriber whose bounded buffer overflows is dropped as lagged.
 */

import { describe, expect, it } from "@effect/vitest"
import { Effect, Exit, Fiber, Option, Scope, SubscriptionRef, TestClock } from "effect"
import { DcCkfFormatIdentity, ProducerIdentity } from "../../src/ckf/identity.js"
import * as LoadWindows from "../../src/relay/LoadWindows.js"
import type { PoolLoadSnapshot } from "../../src/relay/PoolLoad.js"
import { pool } from "./registryFixtures.js"

const snapshot = (seed: number, used: bigint): PoolLoadSnapshot => ({
  producer: new ProducerIdentity(pool(seed), 7n, 1n, new DcCkfFormatIdentity(0x5deece66d1b54a33n, 16)),
  kvUsedBlocks: used,
  totalKvBlocks: 100n,
  kvObservedRanks: 1,
  kvExpectedRanks: 1
})

const settle = Effect.gen(function* () {
  for (let i = 0; i < 20; i++) yield* Effect.yieldNow()
})

describe("LoadWindows", () => {
  it.scoped("cuts one window per interval from the load list, sequences from 1", () =>
    Effect.gen(function* () {
      const loadRef = yield* SubscriptionRef.make<ReadonlyArray<PoolLoadSnapshot>>([])
      const cut: Array<bigint> = []
      const windows = yield* LoadWindows.make(loadRef, {
        window: "1 second",
        onWindow: (window) => Effect.sync(() => cut.push(window.windowSequence))
      })
      yield* TestClock.adjust("999 millis")
      expect(Option.isNone(yield* windows.current)).toBe(true)
      yield* TestClock.adjust("1 millis")
      const first = Option.getOrThrow(yield* windows.current)
      expect(first).toEqual({ windowSequence: 1n, observedMs: 1000n, windowMs: 1000n, pools: [] })

      yield* SubscriptionRef.set(loadRef, [snapshot(1, 5n)])
      yield* TestClock.adjust("1 second")
      const second = Option.getOrThrow(yield* windows.current)
      expect(second.windowSequence).toBe(2n)
      expect(second.observedMs).toBe(2000n)
      expect(second.pools).toEqual([snapshot(1, 5n)])
      expect(cut).toEqual([1n, 2n])
    })
  )

  it.scoped("a subscriber gets the current window, then only newer ones", () =>
    Effect.gen(function* () {
      const loadRef = yield* SubscriptionRef.make<ReadonlyArray<PoolLoadSnapshot>>([])
      const windows = yield* LoadWindows.make(loadRef, { window: "100 millis" })
      yield* TestClock.adjust("200 millis")
      const subscription = yield* windows.subscribe
      expect((yield* subscription.next).windowSequence).toBe(2n)
      const waiting = yield* Effect.fork(subscription.next)
      yield* settle
      expect(Option.isNone(yield* Fiber.poll(waiting))).toBe(true)
      yield* TestClock.adjust("100 millis")
      expect((yield* Fiber.join(waiting)).windowSequence).toBe(3n)
      yield* TestClock.adjust("300 millis")
      const later = [yield* subscription.next, yield* subscription.next, yield* subscription.next]
      expect(later.map((w) => w.windowSequence)).toEqual([4n, 5n, 6n])
    })
  )

  it.scoped("a subscriber before the first window waits for window 1", () =>
    Effect.gen(function* () {
      const loadRef = yield* SubscriptionRef.make<ReadonlyArray<PoolLoadSnapshot>>([])
      const windows = yield* LoadWindows.make(loadRef, { window: "1 second" })
      const subscription = yield* windows.subscribe
      const first = yield* Effect.fork(subscription.next)
      yield* TestClock.adjust("1 second")
      expect((yield* Fiber.join(first)).windowSequence).toBe(1n)
    })
  )

  it.scoped("a subscriber whose buffer is full is dropped as lagged; others keep going", () =>
    Effect.gen(function* () {
      const loadRef = yield* SubscriptionRef.make<ReadonlyArray<PoolLoadSnapshot>>([])
      const windows = yield* LoadWindows.make(loadRef, { window: "100 millis", fanoutCapacity: 2 })
      const slow = yield* windows.subscribe
      const fast = yield* windows.subscribe
      expect(windows.subscriberCount()).toBe(2)
      for (let i = 1; i <= 3; i++) {
        yield* TestClock.adjust("100 millis")
        expect((yield* fast.next).windowSequence).toBe(BigInt(i))
      }
      // The third window found the slow buffer full: the queued windows are stale now.
      const lagged = yield* Effect.flip(slow.next)
      expect(lagged._tag).toBe("LoadWindowLagged")
      expect(lagged.message).toContain("resubscribe")
      expect(windows.subscriberCount()).toBe(1)
      yield* TestClock.adjust("100 millis")
      expect((yield* fast.next).windowSequence).toBe(4n)
      // Resubscribing starts again from the current window.
      const again = yield* windows.subscribe
      expect((yield* again.next).windowSequence).toBe(4n)
    })
  )

  it.scoped("an unsubscribed subscriber is forgotten and the publisher's end closes the rest", () =>
    Effect.gen(function* () {
      const loadRef = yield* SubscriptionRef.make<ReadonlyArray<PoolLoadSnapshot>>([])
      const publisherScope = yield* Scope.make()
      const windows = yield* LoadWindows.make(loadRef, { window: "100 millis" }).pipe(
        Scope.extend(publisherScope)
      )
      const subscriberScope = yield* Scope.make()
      yield* windows.subscribe.pipe(Scope.extend(subscriberScope))
      const remaining = yield* windows.subscribe
      expect(windows.subscriberCount()).toBe(2)
      yield* Scope.close(subscriberScope, Exit.void)
      expect(windows.subscriberCount()).toBe(1)
      const waiting = yield* Effect.fork(remaining.next)
      yield* settle
      yield* Scope.close(publisherScope, Exit.void)
      const closed = yield* Effect.flip(Fiber.join(waiting))
      expect(closed._tag).toBe("LoadWindowsClosed")
      const refused = yield* Effect.flip(windows.subscribe)
      expect(refused._tag).toBe("LoadWindowsClosed")
    })
  )
})
