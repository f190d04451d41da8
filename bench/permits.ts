/**
 * `recovery_permits_1000`: 1,000 fibers through 16 permits (the relay's recovery permits when it
 * starts under 1,000 ranks), each holding its permit for one turn of the event loop, through the
 * FIFO semaphore the relay uses and through `Effect.makeSemaphore`; wall time of the whole batch,
 * best of three alternating rounds.
 */

import { Effect } from "effect"
import { makeFifoSemaphore } from "../src/recovery/FifoSemaphore.js"
import { type BenchContext, record } from "./harness.js"

const FIBERS = 1000
const PERMITS = 16

const batch = (semaphore: Effect.Effect<Effect.Semaphore>) =>
  Effect.gen(function* () {
    const permits = yield* semaphore
    const started = performance.now()
    yield* Effect.forEach(
      Array.from({ length: FIBERS }),
      () =>
        permits.withPermits(1)(Effect.promise(() => new Promise<void>((resolve) => setImmediate(resolve)))),
      { concurrency: "unbounded", discard: true }
    )
    return performance.now() - started
  })

export const benchRecoveryPermits = async (ctx: BenchContext): Promise<void> => {
  const rounds = ctx.quick ? 1 : 3
  let fifo = Number.POSITIVE_INFINITY
  let effect = Number.POSITIVE_INFINITY
  for (let round = 0; round < rounds; round++) {
    const ours = () => Effect.runPromise(batch(makeFifoSemaphore(PERMITS)))
    const theirs = () => Effect.runPromise(batch(Effect.makeSemaphore(PERMITS)))
    // Alternating which goes first, so neither always meets the same spell of the machine.
    if (round % 2 === 0) {
      fifo = Math.min(fifo, await ours())
      effect = Math.min(effect, await theirs())
    } else {
      effect = Math.min(effect, await theirs())
      fifo = Math.min(fifo, await ours())
    }
  }
  record(
    ctx,
    "recovery_permits_1000",
    "ms",
    fifo,
    effect,
    `${FIBERS} fibers through ${PERMITS} permits, each held for one event-loop turn; FIFO semaphore vs Effect.makeSemaphore (which resumes every waiter at each release); best of ${rounds} alternating rounds`,
    true
  )
}
