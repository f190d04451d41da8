import { describe, expect, it } from "@effect/vitest"
import { Deferred, Effect, Fiber, Option, TestClock } from "effect"
import * as FiberFailures from "../../src/observability/FiberFailures.js"
import * as Prometheus from "../../src/observability/Prometheus.js"
import { parseExposition, sampleValue } from "./exposition.js"

/** Runs `body` with every fiber it forks supervised by a fresh counter. */
const supervised = <A, E, R>(
  body: (counter: FiberFailures.FiberFailureCounter) => Effect.Effect<A, E, R>
) => {
  const counter = new FiberFailures.FiberFailureCounter()
  return body(counter).pipe(Effect.provide(FiberFailures.layer(counter)))
}

describe("effect_fiber_failures_total", () => {
  it.effect("interrupted fibers are not failures", () =>
    supervised((counter) =>
      Effect.gen(function* () {
        const started = yield* Deferred.make<void>()
        const idle = yield* Effect.fork(Effect.zipRight(Deferred.succeed(started, undefined), Effect.never))
        yield* Deferred.await(started)
        yield* Fiber.interrupt(idle)
        // A timeout interrupts its effect; a race interrupts its loser.
        const timedOut = yield* Effect.fork(Effect.timeoutOption(Effect.never, "1 second"))
        yield* TestClock.adjust("1 second")
        expect(Option.isNone(yield* Fiber.join(timedOut))).toBe(true)
        yield* Effect.race(Effect.never, Effect.succeed(1))
        // A scope closing interrupts what it owns.
        yield* Effect.scoped(Effect.forkScoped(Effect.never))
        expect(counter.current()).toBe(0)
      })
    )
  )

  it.effect("a typed failure and a defect are", () =>
    supervised((counter) =>
      Effect.gen(function* () {
        const failed = yield* Effect.fork(Effect.fail("boom"))
        yield* Fiber.await(failed)
        const died = yield* Effect.fork(Effect.die(new Error("defect")))
        yield* Fiber.await(died)
        expect(counter.current()).toBe(2)
        const interrupted = yield* Effect.fork(Effect.never)
        yield* Fiber.interrupt(interrupted)
        expect(counter.current()).toBe(2)
      })
    )
  )

  it.scoped("the exposition reads the counter at each scrape", () =>
    supervised((counter) =>
      Effect.gen(function* () {
        const exposition = yield* Prometheus.make({ effectMetricPrefixes: [], fiberFailures: counter })
        const scrape = Effect.map(exposition.text, (text) =>
          sampleValue(parseExposition(text), "effect_fiber_failures_total")
        )
        expect(yield* scrape).toBe(0)
        const interrupted = yield* Effect.fork(Effect.never)
        yield* Fiber.interrupt(interrupted)
        expect(yield* scrape).toBe(0)
        yield* Fiber.await(yield* Effect.fork(Effect.fail("boom")))
        expect(yield* scrape).toBe(1)
      })
    )
  )
})
