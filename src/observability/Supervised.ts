/**
 * Supervision of the loops that must run for the life of the process (discovery watches, source
 * subscribers, publication hubs, catalog and load projections, the consumer's relay clients).
 *
 * `supervised(loop, effect)` runs `effect`; a defect or failure is logged with its cause, counted
 * in `kvrelay_supervised_restarts_total{loop}`, and the effect starts again after a backoff
 * (100 ms doubling to 5 s, reset once a run lasted 30 s). Success ends supervision (a loop that
 * returns is done, e.g. its input stream ended at shutdown), and so does interruption.
 *
 * Tests inject a defect into one step of a named loop through the `LoopFaults` reference: a loop
 * calls `loopStep(name)` (or `faults.take(name)` on a hot path) once per step, which does nothing
 * unless a test armed a fault for that name.
 */

import { Cause, Clock, Context, Duration, Effect, Exit, Metric, Option, Schedule } from "effect"
import { counterFamily } from "./MetricFamilies.js"

const restartsTotal = counterFamily(
  "kvrelay_supervised_restarts_total",
  "restarts of supervised long-lived loops after a defect or failure, by loop"
)

/** Restarts per loop name since the process started (also in the metric), for scrapes and tests. */
const restartCounts = new Map<string, number>()

/** Restarts of `loop` so far. */
export const supervisedRestarts = (loop: string): number => restartCounts.get(loop) ?? 0

/** Default backoff between restarts: 100 ms doubling to 5 s (the §2 rebind backoff). */
const DEFAULT_RESTART_SCHEDULE: Schedule.Schedule<unknown> = Schedule.exponential("100 millis", 2).pipe(
  Schedule.union(Schedule.spaced("5 seconds"))
)

/** A run that lasted this long was healthy: the next restart starts the backoff over. */
const DEFAULT_RESTART_RESET_AFTER: Duration.Duration = Duration.seconds(30)

interface SupervisedOptions {
  /** Delays between restarts; when it ends, supervision gives up and the fiber dies loudly. */
  readonly schedule?: Schedule.Schedule<unknown, Cause.Cause<unknown>> | undefined
  readonly resetAfter?: Duration.DurationInput | undefined
}

/**
 * Runs `effect` under supervision (see the module comment). The returned effect only ends when
 * `effect` succeeds, when it is interrupted, or (with a finite schedule) by dying once the
 * schedule gave up.
 */
export const supervised = <E, R>(
  loop: string,
  effect: Effect.Effect<unknown, E, R>,
  options: SupervisedOptions = {}
): Effect.Effect<void, never, R> =>
  Effect.gen(function* () {
    const driver = yield* Schedule.driver(options.schedule ?? DEFAULT_RESTART_SCHEDULE)
    const resetAfterMs = Duration.toMillis(Duration.decode(options.resetAfter ?? DEFAULT_RESTART_RESET_AFTER))
    let restarts = 0
    for (;;) {
      const started = yield* Clock.currentTimeMillis
      const exit = yield* Effect.exit(effect)
      if (Exit.isSuccess(exit)) return
      const cause = exit.cause
      // Interruption is the owner stopping the loop, not a fault.
      if (Cause.isInterruptedOnly(cause)) return yield* Effect.failCause(cause as Cause.Cause<never>)
      if ((yield* Clock.currentTimeMillis) - started >= resetAfterMs) yield* driver.reset
      yield* Effect.logError(`supervised loop ${loop} failed; restarting it`, cause).pipe(
        Effect.annotateLogs({ loop, restarts })
      )
      // Sleeps for the schedule's delay; None when the schedule gave up.
      const delay = yield* driver.next(cause).pipe(Effect.option)
      if (Option.isNone(delay)) {
        yield* Effect.logError(`supervised loop ${loop} gave up: its restart schedule ended`).pipe(
          Effect.annotateLogs({ loop, restarts })
        )
        return yield* Effect.die(new Error(`supervised loop ${loop} gave up after ${restarts} restarts`))
      }
      restarts++
      restartCounts.set(loop, (restartCounts.get(loop) ?? 0) + 1)
      yield* Metric.increment(Metric.tagged(restartsTotal, "loop", loop))
    }
  })

// ---------------------------------------------------------------------------------------------
// Fault injection (tests)

/** The defect an armed loop step dies with. */
export class InjectedLoopFault extends Error {
  constructor(readonly loop: string) {
    super(`injected defect in loop ${loop}`)
    this.name = "InjectedLoopFault"
  }
}

interface LoopFaultsShape {
  /** True when the current step of `loop` must die (consumes one armed fault). */
  readonly take: (loop: string) => boolean
}

const noFaults: LoopFaultsShape = { take: () => false }

/** Which loop steps die; by default none. Read once per loop start on hot paths. */
export class LoopFaults extends Context.Reference<LoopFaults>()("kvrelay/LoopFaults", {
  defaultValue: () => noFaults
}) {}

/** One step of `loop`: dies with `InjectedLoopFault` when a test armed a fault for it. */
export const loopStep = (loop: string): Effect.Effect<void> =>
  Effect.flatMap(LoopFaults, (faults) =>
    faults.take(loop) ? Effect.die(new InjectedLoopFault(loop)) : Effect.void
  )

/** A test's fault plan: `arm(loop, n)` makes the next `n` steps of `loop` die. */
export const makeLoopFaults = (): LoopFaultsShape & {
  readonly arm: (loop: string, count?: number) => void
  readonly armed: (loop: string) => number
} => {
  const pending = new Map<string, number>()
  return {
    take: (loop) => {
      const left = pending.get(loop) ?? 0
      if (left === 0) return false
      pending.set(loop, left - 1)
      return true
    },
    arm: (loop, count = 1) => {
      pending.set(loop, (pending.get(loop) ?? 0) + count)
    },
    armed: (loop) => pending.get(loop) ?? 0
  }
}
