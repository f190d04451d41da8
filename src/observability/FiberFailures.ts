/**
 * `effect_fiber_failures_total`: fibers that ended with a real failure (a typed error or a
 * defect). Effect's own runtime metric (`effect_fiber_failures`, under the `RuntimeMetrics`
 * flag) counts every `Failure` exit, and an interrupted fiber exits with a `Failure` whose
 * cause is `Interrupt`; a relay interrupts fibers all the time (request scopes, races,
 * timeouts, lane and subscription shutdowns), which would bury the failures that matter.
 */

import { Cause, Effect, Exit, type Fiber, type Layer, Supervisor } from "effect"

/** Counts fiber ends whose cause is not interruption only; installed with `layer`. */
export class FiberFailureCounter extends Supervisor.AbstractSupervisor<number> {
  private count = 0

  readonly value: Effect.Effect<number> = Effect.sync(() => this.count)

  /** The count now, for collect callbacks that run outside Effect. */
  current(): number {
    return this.count
  }

  override onEnd<A, E>(exit: Exit.Exit<A, E>, _fiber: Fiber.RuntimeFiber<A, E>): void {
    if (Exit.isFailure(exit) && !Cause.isInterruptedOnly(exit.cause)) this.count++
  }
}

/** The process's counter: the commands install it around everything they run. */
export const processFiberFailures: FiberFailureCounter = new FiberFailureCounter()

/** Supervises every fiber forked under this layer with `counter`. */
export const layer = (counter: FiberFailureCounter = processFiberFailures): Layer.Layer<never> =>
  Supervisor.addSupervisor(counter)
