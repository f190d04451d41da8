import { describe, expect, it } from "@effect/vitest"
import { Effect, Logger } from "effect"
import { Discovery, type DiscoverySnapshot, makeStaticDiscovery } from "../../src/discovery/Discovery.js"
import { WATCH_ALL } from "../../src/discovery/DiscoveryConfig.js"
import type { DcMembershipView } from "../../src/discovery/MembershipProjection.js"
import { makeMembershipWatch } from "../../src/discovery/MembershipWatch.js"
import type { ModelCardInstance } from "../../src/domain/json.js"
import { card } from "./fixtures.js"

let revision = 0n
const snapshot = (cards: ReadonlyArray<ModelCardInstance>): DiscoverySnapshot => ({
  revision: ++revision,
  cards,
  sources: [],
  rejectedSources: [],
  sourceStream: { epoch: 0, bound: true }
})

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
})
