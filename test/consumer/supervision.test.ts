/**
 * The global consumer's long-lived loops restart after a defect (a `LoopFaults` plan makes one
 * step die once): a relay client's epoch loop and the domain reconciler. Real relays (registry,
 * publication source, relay HTTP server) over real sockets; waits poll with bounded deadlines.
 */

import { describe, expect, it } from "@effect/vitest"
import { Effect, Logger, LogLevel } from "effect"
import { LoopFaults, makeLoopFaults, supervisedRestarts } from "../../src/observability/Supervised.js"
import { blockHashes, converged, depthsOf, eventually, startConsumer } from "./consumerHarness.js"
import { domainOf } from "./fakeRelay.js"
import { startDcRelay } from "./realRelay.js"

const silent = Logger.minimumLogLevel(LogLevel.None)

const setup = Effect.gen(function* () {
  const faults = makeLoopFaults()
  const east = yield* startDcRelay("east")
  const pool = yield* east.attach(domainOf(1), "prod.backend.generate")
  const blocks = blockHashes(1, 12)
  yield* pool.store("1", blocks)
  const { consumer, view } = yield* startConsumer([{ name: "east", url: east.url }]).pipe(
    Effect.provideService(LoopFaults, faults)
  )
  yield* eventually("the lane converges", converged(consumer, "east", pool))
  return { faults, east, pool, blocks, consumer, view }
})

describe("supervised global consumer loops", () => {
  it.scopedLive(
    "consumer.relay: a defect in the catalog watch invalidates the relay, the loop restarts and the lanes come back",
    () =>
      Effect.gen(function* () {
        const { faults, east, pool, blocks, consumer, view } = yield* setup
        const before = supervisedRestarts("consumer.relay")
        faults.arm("consumer.relay")
        // A new pool publishes a catalog revision: the step taking it dies.
        const other = yield* east.attach(domainOf(3), "prod.other.generate", "mistral")
        const otherBlocks = blockHashes(2, 6)
        yield* other.store("5", otherBlocks)
        yield* eventually(
          "the relay loop restarted",
          Effect.sync(() => supervisedRestarts("consumer.relay") === before + 1)
        )
        yield* eventually(
          "both lanes converge after the restart",
          Effect.zipWith(
            converged(consumer, "east", pool),
            converged(consumer, "east", other),
            (a, b) => a && b
          ),
          15_000
        )
        expect(
          depthsOf(view.overlapNow({ namespace: "prod", model: "llama", localBlockHashes: blocks }))
        ).toEqual({ east: 12 })
        expect(consumer.relays()[0]?.connected).toBe(true)
        expect(supervisedRestarts("consumer.relay")).toBe(before + 1)
      }).pipe(Effect.provide(silent)),
    30_000
  )

  it.scopedLive(
    "consumer.reconcile: a defect reconciling restarts the reconciler, which lanes the new pool at once",
    () =>
      Effect.gen(function* () {
        const { faults, east, consumer } = yield* setup
        const before = supervisedRestarts("consumer.reconcile")
        faults.arm("consumer.reconcile")
        const other = yield* east.attach(domainOf(5), "prod.third.generate", "qwen")
        yield* other.store("9", blockHashes(4, 5))
        yield* eventually(
          "the reconciler restarted",
          Effect.sync(() => supervisedRestarts("consumer.reconcile") === before + 1)
        )
        yield* eventually("the new pool's lane converges", converged(consumer, "east", other), 15_000)
      }).pipe(Effect.provide(silent)),
    30_000
  )
})
