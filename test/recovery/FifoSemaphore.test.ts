/**
 * The FIFO semaphore against a model: permits are granted in arrival order, never more than the
 * permits are held, a waiter that is interrupted leaves no permit behind, and a release resumes
 * only the waiters it grants.
 */

import { describe, expect, it } from "@effect/vitest"
import { Deferred, Effect, Exit, Fiber, Option, TestClock, TestContext } from "effect"
import fc from "fast-check"
import { makeFifoSemaphore } from "../../src/recovery/FifoSemaphore.js"

/** Lets every forked fiber run up to its next wait. */
const settle = Effect.repeatN(Effect.yieldNow(), 10)

describe("FifoSemaphore", () => {
  it.effect("grants waiters in the order they arrived", () =>
    Effect.gen(function* () {
      const semaphore = yield* makeFifoSemaphore(1)
      const order: Array<number> = []
      yield* semaphore.take(1)
      const fibers = []
      for (let i = 0; i < 5; i++) {
        fibers.push(yield* Effect.fork(semaphore.withPermits(1)(Effect.sync(() => order.push(i)))))
        yield* settle
      }
      expect(order).toEqual([])
      yield* semaphore.release(1)
      yield* Fiber.joinAll(fibers)
      expect(order).toEqual([0, 1, 2, 3, 4])
    })
  )

  it.effect("a waiter for two permits is not overtaken by later waiters for one", () =>
    Effect.gen(function* () {
      const semaphore = yield* makeFifoSemaphore(2)
      const order: Array<string> = []
      yield* semaphore.take(2)
      const two = yield* Effect.fork(semaphore.withPermits(2)(Effect.sync(() => order.push("two"))))
      yield* settle
      const one = yield* Effect.fork(semaphore.withPermits(1)(Effect.sync(() => order.push("one"))))
      yield* settle
      yield* semaphore.release(1)
      yield* settle
      expect(order).toEqual([])
      yield* semaphore.release(1)
      yield* Fiber.joinAll([two, one])
      expect(order).toEqual(["two", "one"])
    })
  )

  it.effect("an interrupted waiter lets the ones behind it through and keeps no permit", () =>
    Effect.gen(function* () {
      const semaphore = yield* makeFifoSemaphore(1)
      yield* semaphore.take(1)
      const gone = yield* Effect.fork(semaphore.withPermits(1)(Effect.never))
      yield* settle
      const next = yield* Deferred.make<void>()
      const waiting = yield* Effect.fork(semaphore.withPermits(1)(Deferred.succeed(next, undefined)))
      yield* settle
      yield* Fiber.interrupt(gone)
      yield* semaphore.release(1)
      yield* Deferred.await(next)
      yield* Fiber.join(waiting)
      expect(yield* semaphore.withPermitsIfAvailable(1)(Effect.succeed("free"))).toEqual(Option.some("free"))
    })
  )

  it.effect("withPermitsIfAvailable does not jump the queue", () =>
    Effect.gen(function* () {
      const semaphore = yield* makeFifoSemaphore(2)
      yield* semaphore.take(2)
      const waiter = yield* Effect.fork(semaphore.withPermits(2)(Effect.void))
      yield* settle
      yield* semaphore.release(1)
      // One permit is free, but the waiter ahead needs two.
      expect(yield* semaphore.withPermitsIfAvailable(1)(Effect.succeed(1))).toEqual(Option.none())
      yield* semaphore.release(1)
      yield* Fiber.join(waiter)
    })
  )

  it.effect(
    "random jobs, holds and interruptions: never over the permits, in arrival order, nothing leaked",
    () =>
      Effect.promise(() =>
        fc.assert(
          fc.asyncProperty(
            fc.integer({ min: 1, max: 4 }),
            fc.array(
              fc.record({
                permits: fc.integer({ min: 1, max: 4 }),
                holdMs: fc.integer({ min: 0, max: 30 }),
                interruptAtMs: fc.option(fc.integer({ min: 0, max: 60 }), { nil: undefined })
              }),
              { minLength: 1, maxLength: 40 }
            ),
            (size, jobs) =>
              Effect.runPromise(
                Effect.gen(function* () {
                  const semaphore = yield* makeFifoSemaphore(size)
                  let held = 0
                  let mostHeld = 0
                  const started: Array<number> = []
                  const fibers: Array<Fiber.RuntimeFiber<void>> = []
                  for (const [index, job] of jobs.entries()) {
                    const permits = Math.min(job.permits, size)
                    fibers.push(
                      yield* Effect.fork(
                        semaphore.withPermits(permits)(
                          Effect.acquireUseRelease(
                            Effect.sync(() => {
                              held += permits
                              mostHeld = Math.max(mostHeld, held)
                              started.push(index)
                            }),
                            () => Effect.sleep(`${job.holdMs} millis`),
                            () => Effect.sync(() => (held -= permits))
                          )
                        )
                      )
                    )
                    yield* settle
                  }
                  const interrupters = jobs.flatMap((job, index) =>
                    job.interruptAtMs === undefined
                      ? []
                      : [Effect.delay(Fiber.interrupt(fibers[index]!), `${job.interruptAtMs} millis`)]
                  )
                  const stops = yield* Effect.forkAll(interrupters)
                  const running = Effect.map(Effect.forEach(fibers, Fiber.poll), (polls) =>
                    polls.some(Option.isNone)
                  )
                  while (yield* running) {
                    yield* TestClock.adjust("5 millis")
                    yield* settle
                  }
                  // Interruptions due after every job ended would find nothing to stop.
                  yield* Fiber.interrupt(stops)
                  const exits = yield* Effect.forEach(fibers, Fiber.await)
                  expect(mostHeld).toBeLessThanOrEqual(size)
                  expect(held).toBe(0)
                  // Every job that was not interrupted ran.
                  jobs.forEach((job, index) => {
                    if (job.interruptAtMs === undefined) expect(Exit.isSuccess(exits[index]!)).toBe(true)
                  })
                  // Strictly FIFO: no job started before one that arrived earlier and still waited.
                  expect(started).toEqual([...started].sort((a, b) => a - b))
                  // Nothing leaked: every permit can be taken again at once.
                  expect(yield* semaphore.withPermitsIfAvailable(size)(Effect.succeed(true))).toEqual(
                    Option.some(true)
                  )
                }).pipe(Effect.provide(TestContext.TestContext))
              )
          ),
          { numRuns: 100 }
        )
      ),
    120_000
  )
})
