import { expect, it } from "@effect/vitest"
import { Effect, Queue } from "effect"
import { drainFaultsWhile } from "../../src/relay/PendingActorFaults.js"
import type { ActorFault } from "../../src/relay/PoolActor.js"
import { pool } from "./registryFixtures.js"

// Retirement drains faults inside scope finalizers, which run uninterruptibly: the race inside
// `drainFaultsWhile` must still be able to interrupt its losing side there.
it.effect("drainFaultsWhile completes inside an uninterruptible region (scope finalizers)", () =>
  Effect.gen(function* () {
    const faults = yield* Queue.bounded<ActorFault>(4)
    const result = yield* Effect.uninterruptible(drainFaultsWhile(pool(1), faults, Effect.succeed(42)))
    expect(result).toBe(42)
  })
)
