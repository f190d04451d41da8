import { describe, expect, it } from "@effect/vitest"
import { Effect, Logger, Stream, TestClock } from "effect"
import {
  Discovery,
  type DiscoveryShape,
  type DiscoverySnapshot,
  makeStaticDiscovery
} from "../../src/discovery/Discovery.js"
import { WATCH_ALL } from "../../src/discovery/DiscoveryConfig.js"
import type { DcMembershipView } from "../../src/discovery/Membership.js"
import { makeMembershipWatch } from "../../src/discovery/MembershipWatch.js"
import { LoopFaults, makeLoopFaults, supervisedRestarts } from "../../src/observability/Supervised.js"
import type { ModelCardInstance } from "../../src/protocol/Discovery.js"
import { card } from "./fixtures.js"

let revision = 0n
const snapshot = (cards: ReadonlyArray<ModelCardInstance>): DiscoverySnapshot => ({
  revision: ++revision,
  cards,
  sources: [],
  rejectedSources: [],
  sourceStream: { epoch: 0, bound: true }
})

/** Lets forked fibers run up to their next wait on the test clock. */
const settle = Effect.yieldNow().pipe(Effect.repeatN(50))

describe("MembershipWatch", () => {
  it.effect(
    "projects discovery snapshots and publishes only changed views; soft errors are logged once",
    () => {
      const lines: Array<string> = []
      const logger = Logger.make(({ message }) => {
        lines.push(Array.isArray(message) ? message.join(" ") : String(message))
      })
      return Effect.gen(function* () {
        const base = card({ worker: 1 })
        const orphan = card({ worker: 2, suffix: "t", name: "t", lora: { name: "t" } })
        const discovery = yield* makeStaticDiscovery(snapshot([base, orphan]))
        const program = Effect.gen(function* () {
          const watch = yield* makeMembershipWatch(WATCH_ALL)
          const eventually = (done: (view: DcMembershipView) => boolean) =>
            Effect.gen(function* () {
              for (let i = 0; i < 1000; i++) {
                const view = yield* watch.current
                if (done(view)) return view
                yield* Effect.yieldNow()
              }
              return yield* Effect.die(new Error("membership watch never reached the expected view"))
            })
          const first = yield* watch.current
          expect(first.endpoints.get("prod.backend.generate")?.generation).toBe(1)
          yield* discovery.publish(snapshot([base, orphan]))
          for (let i = 0; i < 50; i++) yield* Effect.yieldNow()
          expect(yield* watch.current).toBe(first)
          yield* discovery.publish(
            snapshot([base, orphan, card({ endpoint: "prod.backend.other", worker: 3 })])
          )
          const second = yield* eventually((view) => view.endpoints.size === 2)
          expect(second.endpoints.get("prod.backend.generate")).toBe(
            first.endpoints.get("prod.backend.generate")
          )
          expect(second.endpoints.get("prod.backend.other")?.generation).toBe(2)
          expect(lines.filter((line) => line.includes("without a backing base model card"))).toHaveLength(1)
        })
        yield* program.pipe(Effect.provideService(Discovery, discovery), Effect.scoped)
      }).pipe(Effect.provide(Logger.replace(Logger.defaultLogger, logger)))
    }
  )

  it.effect("a discovery change stream that dies with a defect is resubscribed and followed again", () =>
    Effect.gen(function* () {
      const base = yield* makeStaticDiscovery(snapshot([card({ worker: 1 })]))
      let subscriptions = 0
      // The first subscription delivers the current snapshot, then dies.
      const dying: DiscoveryShape = {
        ...base,
        changes: Stream.suspend(() =>
          subscriptions++ === 0
            ? base.changes.pipe(Stream.take(1), Stream.concat(Stream.dieMessage("discovery stream defect")))
            : base.changes
        )
      }
      const restarts = supervisedRestarts("discovery.membership")
      const program = Effect.gen(function* () {
        const watch = yield* makeMembershipWatch(WATCH_ALL)
        yield* settle
        expect(subscriptions).toBe(1)
        yield* TestClock.adjust("100 millis")
        yield* settle
        expect(subscriptions).toBe(2)
        expect(supervisedRestarts("discovery.membership")).toBe(restarts + 1)
        yield* base.publish(
          snapshot([card({ worker: 1 }), card({ endpoint: "prod.backend.other", worker: 3 })])
        )
        yield* settle
        expect((yield* watch.current).endpoints.size).toBe(2)
      })
      yield* program.pipe(Effect.provideService(Discovery, dying), Effect.scoped)
    }).pipe(Effect.provide(Logger.remove(Logger.defaultLogger)))
  )

  it.effect("a defect in one projection step restarts the loop, which projects the latest snapshot", () =>
    Effect.gen(function* () {
      const faults = makeLoopFaults()
      const discovery = yield* makeStaticDiscovery(snapshot([card({ worker: 1 })]))
      const restarts = supervisedRestarts("discovery.membership")
      const program = Effect.gen(function* () {
        const watch = yield* makeMembershipWatch(WATCH_ALL)
        yield* settle
        faults.arm("discovery.membership")
        yield* discovery.publish(
          snapshot([card({ worker: 1 }), card({ endpoint: "prod.backend.other", worker: 3 })])
        )
        yield* settle
        // The step that took this snapshot died before projecting it.
        expect((yield* watch.current).endpoints.size).toBe(1)
        expect(faults.armed("discovery.membership")).toBe(0)
        yield* TestClock.adjust("100 millis")
        yield* settle
        expect((yield* watch.current).endpoints.size).toBe(2)
        expect(supervisedRestarts("discovery.membership")).toBe(restarts + 1)
      })
      yield* program.pipe(
        Effect.provideService(Discovery, discovery),
        Effect.provideService(LoopFaults, faults),
        Effect.scoped
      )
    }).pipe(Effect.provide(Logger.remove(Logger.defaultLogger)))
  )
})
