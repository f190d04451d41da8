import { describe, expect, it } from "@effect/vitest"
import { Cause, Effect, Exit, Fiber, Logger, LogLevel, Metric, Ref, Schedule, TestClock } from "effect"
import {
  InjectedLoopFault,
  LoopFaults,
  loopStep,
  makeLoopFaults,
  supervised,
  supervisedRestarts
} from "../../src/observability/Supervised.js"

const collectLogs = () => {
  const lines: Array<{ readonly message: string; readonly cause: string; readonly level: string }> = []
  const logger = Logger.make(({ message, cause, logLevel }) => {
    lines.push({
      message: Array.isArray(message) ? message.join(" ") : String(message),
      cause: Cause.isEmpty(cause) ? "" : Cause.pretty(cause),
      level: logLevel.label
    })
  })
  return { lines, layer: Logger.replace(Logger.defaultLogger, logger) }
}

const restartMetric = (loop: string) =>
  Metric.value(
    Metric.counter("kvrelay_supervised_restarts_total", {
      description: "restarts of supervised long-lived loops after a defect or failure, by loop",
      incremental: true
    }).pipe(Metric.tagged("loop", loop))
  ).pipe(Effect.map((state) => state.count))

/** Lets forked fibers run up to their next wait on the test clock. */
const settle = Effect.yieldNow().pipe(Effect.repeatN(20))

describe("supervised", () => {
  it.scoped("a defect is logged with its cause, counted, and the loop restarts after 100 ms doubling", () => {
    const logs = collectLogs()
    return Effect.gen(function* () {
      const runs = yield* Ref.make(0)
      const loop = "test.doubling"
      const fiber = yield* supervised(
        loop,
        Ref.updateAndGet(runs, (n) => n + 1).pipe(
          Effect.flatMap((n) => (n <= 3 ? Effect.dieMessage(`boom ${n}`) : Effect.never))
        )
      ).pipe(Effect.provide(logs.layer), Effect.fork)
      yield* settle
      expect(yield* Ref.get(runs)).toBe(1)
      const failure = logs.lines.find(
        (line) => line.message === `supervised loop ${loop} failed; restarting it`
      )
      expect(failure?.level).toBe("ERROR")
      expect(failure?.cause).toContain("boom 1")
      // 100 ms, then 200 ms, then 400 ms between the runs.
      yield* TestClock.adjust("99 millis")
      expect(yield* Ref.get(runs)).toBe(1)
      yield* TestClock.adjust("1 millis")
      yield* settle
      expect(yield* Ref.get(runs)).toBe(2)
      yield* TestClock.adjust("199 millis")
      expect(yield* Ref.get(runs)).toBe(2)
      yield* TestClock.adjust("1 millis")
      yield* settle
      expect(yield* Ref.get(runs)).toBe(3)
      yield* TestClock.adjust("400 millis")
      yield* settle
      expect(yield* Ref.get(runs)).toBe(4)
      expect(supervisedRestarts(loop)).toBe(3)
      expect(yield* restartMetric(loop)).toBe(3)
      expect(logs.lines.filter((line) => line.cause.includes("boom")).map((line) => line.cause)).toHaveLength(
        3
      )
      yield* Fiber.interrupt(fiber)
    })
  })

  it.scoped("the backoff is capped at 5 s and starts over after a run that lasted 30 s", () =>
    Effect.gen(function* () {
      const runs = yield* Ref.make(0)
      /** How long each run lives before it dies. */
      const lifetimes = [0, 0, 0, 0, 0, 0, 0, 0, 30_000, 0]
      const fiber = yield* supervised(
        "test.cap",
        Ref.getAndUpdate(runs, (n) => n + 1).pipe(
          Effect.flatMap((n) =>
            n < lifetimes.length
              ? Effect.sleep(lifetimes[n]!).pipe(Effect.zipRight(Effect.dieMessage("boom")))
              : Effect.never
          )
        )
      ).pipe(Effect.provide(Logger.minimumLogLevel(LogLevel.None)), Effect.fork)
      yield* settle
      // 100, 200, 400, 800, 1600, 3200, then 5000 (capped), 5000.
      for (const delay of [100, 200, 400, 800, 1600, 3200, 5000, 5000]) {
        const before = yield* Ref.get(runs)
        yield* TestClock.adjust(delay - 1)
        yield* settle
        expect(yield* Ref.get(runs)).toBe(before)
        yield* TestClock.adjust(1)
        yield* settle
        expect(yield* Ref.get(runs)).toBe(before + 1)
      }
      // The ninth run lives 30 s: the next restart waits 100 ms again.
      yield* TestClock.adjust(30_000)
      yield* settle
      const before = yield* Ref.get(runs)
      yield* TestClock.adjust(100)
      yield* settle
      expect(yield* Ref.get(runs)).toBe(before + 1)
      yield* Fiber.interrupt(fiber)
    })
  )

  it.scoped("success ends supervision; a typed failure restarts like a defect", () =>
    Effect.gen(function* () {
      const runs = yield* Ref.make(0)
      const fiber = yield* supervised(
        "test.success",
        Ref.updateAndGet(runs, (n) => n + 1).pipe(
          Effect.flatMap((n) => (n === 1 ? Effect.fail("typed") : Effect.void))
        )
      ).pipe(Effect.provide(Logger.minimumLogLevel(LogLevel.None)), Effect.fork)
      yield* TestClock.adjust("100 millis")
      const exit = yield* Fiber.await(fiber)
      expect(Exit.isSuccess(exit)).toBe(true)
      expect(yield* Ref.get(runs)).toBe(2)
      expect(supervisedRestarts("test.success")).toBe(1)
    })
  )

  it.scoped("interruption is not a fault: nothing restarts and nothing is counted", () =>
    Effect.gen(function* () {
      const runs = yield* Ref.make(0)
      const fiber = yield* supervised(
        "test.interrupt",
        Ref.update(runs, (n) => n + 1).pipe(Effect.zipRight(Effect.never))
      ).pipe(Effect.fork)
      yield* settle
      yield* Fiber.interrupt(fiber)
      yield* TestClock.adjust("10 seconds")
      expect(yield* Ref.get(runs)).toBe(1)
      expect(supervisedRestarts("test.interrupt")).toBe(0)
      // A loop that interrupts itself ends too.
      const self = yield* supervised("test.interrupt", Effect.interrupt).pipe(Effect.fork)
      const exit = yield* Fiber.await(self)
      expect(Exit.isInterrupted(exit)).toBe(true)
      expect(supervisedRestarts("test.interrupt")).toBe(0)
    })
  )

  it.scoped("a finite schedule that gives up makes the fiber die loudly", () => {
    const logs = collectLogs()
    return Effect.gen(function* () {
      const fiber = yield* supervised("test.giveup", Effect.dieMessage("always"), {
        schedule: Schedule.recurs(2)
      }).pipe(Effect.provide(logs.layer), Effect.fork)
      const exit = yield* Fiber.await(fiber)
      expect(Exit.isFailure(exit) && Cause.isDie(exit.cause)).toBe(true)
      expect(supervisedRestarts("test.giveup")).toBe(2)
      expect(logs.lines.map((line) => line.message)).toContain(
        "supervised loop test.giveup gave up: its restart schedule ended"
      )
    })
  })

  it.scoped("loopStep dies only when a fault was armed for that loop, once per armed fault", () =>
    Effect.gen(function* () {
      const faults = makeLoopFaults()
      const step = (loop: string) =>
        Effect.exit(loopStep(loop).pipe(Effect.provideService(LoopFaults, faults)))
      expect(Exit.isSuccess(yield* step("a"))).toBe(true)
      faults.arm("a", 2)
      const died = yield* step("a")
      expect(Exit.isFailure(died) && Cause.squash(died.cause)).toBeInstanceOf(InjectedLoopFault)
      expect(Exit.isSuccess(yield* step("b"))).toBe(true)
      expect(Exit.isFailure(yield* step("a"))).toBe(true)
      expect(Exit.isSuccess(yield* step("a"))).toBe(true)
      // Without the reference provided, steps never die.
      expect(Exit.isSuccess(yield* Effect.exit(loopStep("a")))).toBe(true)
    })
  )
})
