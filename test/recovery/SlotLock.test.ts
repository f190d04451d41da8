/**
 * The source supervisor's slot lock stands for the seed's tokio `Mutex`: one holder at a time,
 * FIFO hand-over, held across awaits, and no interruption (of a waiter or of the holder) may leak
 * it or let a later waiter overtake an earlier one.
 */

import { describe, expect, it } from "@effect/vitest"
import { Deferred, Effect, Exit, Fiber, Random } from "effect"
import { SlotLock } from "../../src/recovery/SlotLock.js"

/** True when the lock can be taken again at once (nobody holds it, nobody queues). */
const isFree = (lock: SlotLock) =>
  Effect.gen(function* () {
    const probe = yield* Effect.fork(lock.withLock(Effect.succeed(true)))
    for (let i = 0; i < 10; i++) yield* Effect.yieldNow()
    const done = yield* Fiber.poll(probe)
    if (done._tag === "None") yield* Fiber.interrupt(probe)
    return done._tag === "Some" && Exit.isSuccess(done.value)
  })

describe("SlotLock", () => {
  it.effect("admits waiters one at a time in the order they asked", () =>
    Effect.gen(function* () {
      const lock = new SlotLock()
      const entered: Array<number> = []
      let inside = 0
      let overlap = false
      const gate = yield* Deferred.make<void>()
      const holder = yield* Effect.fork(lock.withLock(Deferred.await(gate)))
      yield* Effect.yieldNow()
      const waiters = []
      for (let i = 0; i < 5; i++) {
        waiters.push(
          yield* Effect.fork(
            lock.withLock(
              Effect.gen(function* () {
                inside++
                if (inside > 1) overlap = true
                entered.push(i)
                yield* Effect.yieldNow()
                inside--
              })
            )
          )
        )
        yield* Effect.yieldNow()
      }
      expect(entered).toEqual([])
      yield* Deferred.succeed(gate, undefined)
      yield* Fiber.join(holder)
      for (const w of waiters) yield* Fiber.join(w)
      expect(entered).toEqual([0, 1, 2, 3, 4])
      expect(overlap).toBe(false)
      expect(yield* isFree(lock)).toBe(true)
    })
  )

  it.effect("an interrupted waiter never runs and does not hold up the next one", () =>
    Effect.gen(function* () {
      const lock = new SlotLock()
      const entered: Array<string> = []
      const gate = yield* Deferred.make<void>()
      const holder = yield* Effect.fork(lock.withLock(Deferred.await(gate)))
      yield* Effect.yieldNow()
      const first = yield* Effect.fork(lock.withLock(Effect.sync(() => entered.push("first"))))
      yield* Effect.yieldNow()
      const second = yield* Effect.fork(lock.withLock(Effect.sync(() => entered.push("second"))))
      yield* Effect.yieldNow()
      yield* Fiber.interrupt(first)
      yield* Deferred.succeed(gate, undefined)
      yield* Fiber.join(holder)
      yield* Fiber.join(second)
      expect(entered).toEqual(["second"])
      expect(yield* isFree(lock)).toBe(true)
    })
  )

  it.effect("a waiter interrupted just as the lock is handed to it passes the lock on", () =>
    Effect.gen(function* () {
      const lock = new SlotLock()
      const gate = yield* Deferred.make<void>()
      const waiterRef: { fiber?: Fiber.RuntimeFiber<string> } = {}
      // The holder's last act sends the waiter an interrupt; its release then hands the lock to
      // that same waiter before the interrupt is processed.
      const holder = yield* Effect.fork(
        lock.withLock(
          Effect.zipRight(
            Deferred.await(gate),
            Effect.suspend(() => Fiber.interruptFork(waiterRef.fiber!))
          )
        )
      )
      yield* Effect.yieldNow()
      waiterRef.fiber = yield* Effect.fork(lock.withLock(Effect.succeed("ran")))
      yield* Effect.yieldNow()
      const next = yield* Effect.fork(lock.withLock(Effect.succeed("next ran")))
      yield* Effect.yieldNow()
      yield* Deferred.succeed(gate, undefined)
      yield* Fiber.join(holder)
      expect(Exit.isInterrupted(yield* Fiber.await(waiterRef.fiber))).toBe(true)
      expect(yield* Fiber.join(next)).toBe("next ran")
      expect(yield* isFree(lock)).toBe(true)
    })
  )

  it.effect("a holder that fails or is interrupted releases the lock", () =>
    Effect.gen(function* () {
      const lock = new SlotLock()
      const failed = yield* Effect.exit(lock.withLock(Effect.fail("boom")))
      expect(Exit.isFailure(failed)).toBe(true)
      expect(yield* isFree(lock)).toBe(true)
      const started = yield* Deferred.make<void>()
      const holder = yield* Effect.fork(
        lock.withLock(Effect.zipRight(Deferred.succeed(started, undefined), Effect.never))
      )
      yield* Deferred.await(started)
      const waiter = yield* Effect.fork(lock.withLock(Effect.succeed("ran")))
      yield* Effect.yieldNow()
      yield* Fiber.interrupt(holder)
      expect(yield* Fiber.join(waiter)).toBe("ran")
      expect(yield* isFree(lock)).toBe(true)
    })
  )

  it.effect("random interruptions never leak the lock nor let two holders in", () =>
    Effect.gen(function* () {
      for (let round = 0; round < 50; round++) {
        const lock = new SlotLock()
        let inside = 0
        let overlap = false
        const fibers = []
        for (let i = 0; i < 8; i++) {
          fibers.push(
            yield* Effect.fork(
              lock.withLock(
                Effect.suspend(() => {
                  inside++
                  if (inside > 1) overlap = true
                  return Effect.ensuring(
                    Effect.zipRight(Effect.yieldNow(), Effect.yieldNow()),
                    Effect.sync(() => {
                      inside--
                    })
                  )
                })
              )
            )
          )
        }
        // Interrupt a random subset at random points: waiting, just handed the lock, or holding.
        for (const fiber of fibers) {
          const steps = yield* Random.nextIntBetween(0, 4)
          for (let s = 0; s < steps; s++) yield* Effect.yieldNow()
          if (yield* Random.nextBoolean) yield* Fiber.interrupt(fiber)
        }
        for (const fiber of fibers) yield* Fiber.await(fiber)
        expect(overlap).toBe(false)
        expect(yield* isFree(lock)).toBe(true)
      }
    })
  )
})
