/**
 * `raceNextFault`: the first of a fault and another effect's end, consuming a fault only when it
 * is returned. Effect hands an offered item straight to a waiting taker, so a race that
 * interrupts a take loses the item; these tests sweep a fault offered 0-30 turns after the other
 * effect ends and check that it is returned, kept or still queued, exactly once.
 */

import { describe, expect, it } from "@effect/vitest"
import { Deferred, Effect, Fiber, Option, Queue } from "effect"
import { failureDisposition } from "../../src/ckf/failure.js"
import { raceNextFault } from "../../src/relay/internal/FaultWaiter.js"
import type { ActorFault } from "../../src/relay/PoolActor.js"

const fault = (eventId: number): ActorFault => ({
  workerId: "1",
  dpRank: 0,
  sourceEpoch: 1,
  eventId,
  category: "Resource",
  disposition: failureDisposition("PrecommitAllocationFailure"),
  message: `fault ${eventId}`
})

/** Joins `fiber` once it is done, failing instead of hanging if a few hundred turns do not end it. */
const joinSoon = <A, E>(fiber: Fiber.Fiber<A, E>, what: string) =>
  Effect.gen(function* () {
    for (let i = 0; i < 500; i++) {
      const exit = yield* Fiber.poll(fiber)
      if (Option.isSome(exit)) return yield* exit.value
      yield* Effect.yieldNow()
    }
    return yield* Effect.dieMessage(`${what} did not finish`)
  })

const queued = (faults: Queue.Queue<ActorFault>) =>
  Queue.takeAll(faults).pipe(Effect.map((chunk) => [...chunk]))

/** A race of a fresh fault queue against an effect that never ends, settled a few turns in. */
const raceAgainstNever = Effect.gen(function* () {
  const faults = yield* Queue.bounded<ActorFault>(16)
  const interrupted = yield* Deferred.make<void>()
  const never = Effect.never.pipe(Effect.onInterrupt(() => Deferred.succeed(interrupted, undefined)))
  const race = yield* Effect.fork(raceNextFault(faults, never, () => undefined))
  yield* Effect.yieldNow().pipe(Effect.repeatN(5))
  return { faults, interrupted, race }
})

describe("raceNextFault", () => {
  it.effect("a fault offered as the other effect ends is returned, kept or still queued, once", () =>
    Effect.gen(function* () {
      const outcomes = new Set<string>()
      for (let turns = 0; turns <= 30; turns++) {
        const faults = yield* Queue.bounded<ActorFault>(16)
        const done = yield* Deferred.make<number>()
        const late = fault(turns)
        const kept: Array<ActorFault> = []
        const race = yield* Effect.fork(raceNextFault(faults, Deferred.await(done), (f) => kept.push(f)))
        yield* Effect.yieldNow().pipe(Effect.repeatN(5))
        yield* Effect.fork(
          Effect.gen(function* () {
            yield* Deferred.succeed(done, turns)
            for (let i = 0; i < turns; i++) yield* Effect.yieldNow()
            yield* Queue.offer(faults, late)
          })
        )
        const raced = yield* joinSoon(race, `the race (${turns} turns)`)
        yield* Effect.yieldNow().pipe(Effect.repeatN(50))
        outcomes.add(raced._tag)
        const returned = raced._tag === "Fault" ? [raced.fault] : []
        if (raced._tag === "Done") expect(raced.value).toBe(turns)
        // No wake-up left behind either: the queue holds the fault or nothing.
        expect({ turns, faults: [...returned, ...kept, ...(yield* queued(faults))] }).toEqual({
          turns,
          faults: [late]
        })
      }
      // The sweep covers both sides of the tie.
      expect([...outcomes].sort()).toEqual(["Done", "Fault"])
    })
  )

  it.effect("a fault wins over an effect that never ends, and the effect is interrupted", () =>
    Effect.gen(function* () {
      const { faults, interrupted, race } = yield* raceAgainstNever
      yield* Queue.offer(faults, fault(1))
      expect(yield* joinSoon(race, "the race")).toEqual({ _tag: "Fault", fault: fault(1) })
      expect(yield* Deferred.isDone(interrupted)).toBe(true)
      expect(yield* queued(faults)).toEqual([])
    })
  )

  it.effect("a fault offered as the other effect is released wins, and its wake-up is taken back", () =>
    Effect.gen(function* () {
      const faults = yield* Queue.bounded<ActorFault>(16)
      const done = yield* Deferred.make<string>()
      const race = yield* Effect.fork(raceNextFault(faults, Deferred.await(done), () => undefined))
      yield* Effect.yieldNow().pipe(Effect.repeatN(5))
      // In one turn: the effect is released, then the fault goes to the parked take; the effect's
      // fiber runs first and, the waiter still parked, queues a wake-up behind the fault.
      yield* Effect.zipRight(Deferred.succeed(done, "done"), Queue.offer(faults, fault(2)))
      expect(yield* joinSoon(race, "the race")).toEqual({ _tag: "Fault", fault: fault(2) })
      yield* Effect.yieldNow().pipe(Effect.repeatN(20))
      expect(yield* queued(faults)).toEqual([])
    })
  )

  it.effect("a queue shut down under the waiter ends the race as ShutDown and interrupts the effect", () =>
    Effect.gen(function* () {
      const { faults, interrupted, race } = yield* raceAgainstNever
      yield* Queue.shutdown(faults)
      expect(yield* joinSoon(race, "the race")).toEqual({ _tag: "ShutDown" })
      expect(yield* Deferred.isDone(interrupted)).toBe(true)
    })
  )

  it.effect("interrupting the race interrupts the effect and leaves the queue as it was", () =>
    Effect.gen(function* () {
      const { faults, interrupted, race } = yield* raceAgainstNever
      yield* Fiber.interrupt(race)
      expect(yield* Deferred.isDone(interrupted)).toBe(true)
      yield* Queue.offer(faults, fault(3))
      expect(yield* queued(faults)).toEqual([fault(3)])
    })
  )
})
