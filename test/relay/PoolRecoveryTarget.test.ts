import { describe, expect, it } from "@effect/vitest"
import { type Duration, Effect, Exit, Fiber, Option, Scope, TestClock } from "effect"
import { ckfConfig } from "../../src/ckf/config.js"
import type { CkfMemberRef } from "../../src/ckf/events.js"
import { CacheSemanticsId, DcId, IndexerDomainId, PoolId, RoutingScopeId } from "../../src/ckf/identity.js"
import { DcCkfState } from "../../src/ckf/state.js"
import { clearedEvent, storedEvent } from "../../src/protocol/Events.js"
import { make as makeActor } from "../../src/relay/internal/PoolActorLoop.js"
import type { StreamScope } from "../../src/relay/PoolActor.js"
import { make as makeTarget, toRecoveryTargetError } from "../../src/relay/PoolRecoveryTarget.js"
import { RelayShuttingDown } from "../../src/relay/RelayErrors.js"

const streamScope: StreamScope = {
  relayIncarnation: 1n,
  layoutGeneration: 1n,
  poolId: new PoolId(
    new IndexerDomainId(
      new CacheSemanticsId(new Uint8Array(16).fill(1), "explicit"),
      new RoutingScopeId(new Uint8Array(16).fill(3), "explicit")
    ),
    new DcId(2n)
  )
}

const member = (workerId: number): CkfMemberRef => ({ workerId: String(workerId), dpRank: 0 })
const dump = (m: CkfMemberRef, hashes: ReadonlyArray<number>) => [
  storedEvent(m.workerId, m.dpRank, 0, hashes)
]

/** Lets forked fibers make progress without advancing the clock. */
const settle = Effect.forEach(Array.from({ length: 50 }), () => Effect.yieldNow(), { discard: true })

const setup = (
  expected: ReadonlyArray<CkfMemberRef>,
  initialDeadline: Duration.DurationInput = "100 millis",
  permits = 1
) =>
  Effect.gen(function* () {
    const actor = yield* makeActor(new DcCkfState(ckfConfig(64)), streamScope)
    const rebuildPermit = yield* Effect.makeSemaphore(permits)
    const target = yield* makeTarget(actor, { rebuildPermit, expected, initialDeadline })
    return { actor, target, rebuildPermit }
  })

const pendingAfter = <A, E>(fiber: Fiber.Fiber<A, E>) =>
  Effect.map(Effect.zipRight(settle, Fiber.poll(fiber)), Option.isNone)

describe("KvDcRelayRecoveryTarget batcher", () => {
  it.scoped("joins the initial wave into one rebuild once every expected rank reported", () =>
    Effect.gen(function* () {
      const [a, b, c] = [member(1), member(2), member(3)]
      const { actor, target } = yield* setup([a, b, c])

      const first = yield* Effect.fork(target.replaceRank(1, a.workerId, a.dpRank, dump(a, [1, 2])))
      const second = yield* Effect.fork(target.replaceRank(1, b.workerId, b.dpRank, dump(b, [3])))
      expect(yield* pendingAfter(first)).toBe(true)
      expect(yield* pendingAfter(second)).toBe(true)
      // A rank that restored without a replacement (degraded or empty) closes the wave too.
      yield* target.completeInitialRecovery(c.workerId, c.dpRank)
      yield* Fiber.join(first)
      yield* Fiber.join(second)

      const { stats, members } = yield* actor.stateStats
      expect(stats.aggregation.uniqueBlockCount).toBe(3)
      expect(members.length).toBe(2)
      expect((yield* actor.diagnostics).rebuilds).toBe(1)
    })
  )

  it.scoped("rebuilds the ranks that arrived when the initial deadline expires", () =>
    Effect.gen(function* () {
      const [a, b] = [member(1), member(2)]
      const { actor, target } = yield* setup([a, b], "100 millis")

      const first = yield* Effect.fork(target.replaceRank(1, a.workerId, a.dpRank, dump(a, [1])))
      yield* settle
      yield* TestClock.adjust("99 millis")
      expect(yield* pendingAfter(first)).toBe(true)
      yield* TestClock.adjust("1 millis")
      yield* Fiber.join(first)
      expect((yield* actor.diagnostics).rebuilds).toBe(1)

      // The wave is closed: the straggler is an ordinary replacement behind the quiet window.
      const late = yield* Effect.fork(target.replaceRank(1, b.workerId, b.dpRank, dump(b, [2])))
      expect(yield* pendingAfter(late)).toBe(true)
      yield* TestClock.adjust("5 millis")
      expect(yield* pendingAfter(late)).toBe(true)
      yield* TestClock.adjust("5 millis")
      yield* Fiber.join(late)
      expect((yield* actor.diagnostics).rebuilds).toBe(2)
      expect((yield* actor.stateStats).members.length).toBe(2)
    })
  )

  it.scoped("batches later replacements over a 5 ms quiet window", () =>
    Effect.gen(function* () {
      const [a, b, c] = [member(1), member(2), member(3)]
      const { actor, target } = yield* setup([])

      const first = yield* Effect.fork(target.replaceRank(1, a.workerId, a.dpRank, dump(a, [1])))
      yield* settle
      yield* TestClock.adjust("3 millis")
      const second = yield* Effect.fork(target.replaceRank(1, b.workerId, b.dpRank, dump(b, [2])))
      yield* settle
      // t = 5: the count changed since the window opened (0 → 2), so the batch waits again.
      yield* TestClock.adjust("2 millis")
      yield* TestClock.adjust("2 millis")
      const third = yield* Effect.fork(target.replaceRank(1, c.workerId, c.dpRank, dump(c, [3])))
      yield* settle
      // t = 10: 2 → 3 changed again; t = 15: quiet.
      yield* TestClock.adjust("3 millis")
      expect(yield* pendingAfter(first)).toBe(true)
      yield* TestClock.adjust("4 millis")
      expect(yield* pendingAfter(first)).toBe(true)
      yield* TestClock.adjust("1 millis")
      yield* Fiber.join(first)
      yield* Fiber.join(second)
      yield* Fiber.join(third)
      expect((yield* actor.diagnostics).rebuilds).toBe(1)
      expect((yield* actor.stateStats).members.length).toBe(3)
    })
  )

  it.scoped("every replacement of a batch observes the same failure, and nothing changes", () =>
    Effect.gen(function* () {
      const [a, b] = [member(1), member(2)]
      const { actor, target } = yield* setup([a, b])
      yield* actor.admitEvent(0, storedEvent(a.workerId, 0, 1, [9]))

      const good = yield* Effect.fork(Effect.exit(target.replaceRank(1, a.workerId, a.dpRank, dump(a, [1]))))
      // A tree dump may only contain Stored events.
      const bad = yield* Effect.exit(
        target.replaceRank(1, b.workerId, b.dpRank, [clearedEvent(b.workerId, 0, 1)])
      )
      const goodExit = yield* Fiber.join(good)

      expect(Exit.isFailure(bad)).toBe(true)
      expect(goodExit).toEqual(bad)
      const error = Exit.isFailure(bad) ? Option.getOrThrow(Exit.causeOption(bad)) : undefined
      expect(JSON.stringify(error)).toContain("InvalidTreeDump")
      yield* actor.flush
      const { members } = yield* actor.stateStats
      expect(members.map((m) => m.workerId)).toEqual([a.workerId])
      expect((yield* actor.diagnostics).rebuilds).toBe(1)
    })
  )

  it.scoped("rebuilds wait for the shared rebuild permit", () =>
    Effect.gen(function* () {
      const a = member(1)
      const { target, rebuildPermit } = yield* setup([a])
      yield* rebuildPermit.take(1)
      const replacement = yield* Effect.fork(target.replaceRank(1, a.workerId, a.dpRank, dump(a, [1])))
      expect(yield* pendingAfter(replacement)).toBe(true)
      yield* rebuildPermit.release(1)
      yield* Fiber.join(replacement)
    })
  )

  it.scoped("maps relay errors to recovery target reasons", () =>
    Effect.gen(function* () {
      const a = member(1)
      const { actor, target } = yield* setup([])
      yield* target.resetRank(2, a.workerId, a.dpRank, "Lifecycle")
      const stale = yield* Effect.flip(target.resetRank(1, a.workerId, a.dpRank, "TreeDumpFailed"))
      expect(stale.reason).toBe("StaleSourceEpoch")
      const staleReplace = yield* Effect.flip(
        target.replaceRank(1, a.workerId, a.dpRank, dump(a, [1])).pipe(
          Effect.fork,
          Effect.tap(() => TestClock.adjust("10 millis")),
          Effect.flatMap(Fiber.join)
        )
      )
      expect(staleReplace.reason).toBe("StaleSourceEpoch")
      yield* actor.shutdown
      const closed = yield* Effect.flip(target.admitEvent(2, storedEvent(a.workerId, 0, 1, [1])))
      expect(closed.reason).toBe("ShuttingDown")
      expect(toRecoveryTargetError(new RelayShuttingDown()).reason).toBe("ShuttingDown")
    })
  )

  it.effect("closing the target's scope fails waiting replacements with Stopped", () =>
    Effect.gen(function* () {
      const a = member(1)
      const b = member(2)
      const scope = yield* Scope.make()
      const { target } = yield* Scope.extend(setup([a, b]), scope)
      const waiting = yield* Effect.fork(target.replaceRank(1, a.workerId, a.dpRank, dump(a, [1])))
      yield* settle
      yield* Scope.close(scope, Exit.void)
      const error = yield* Effect.flip(Fiber.join(waiting))
      expect(error.reason).toBe("Stopped")
      const after = yield* Effect.flip(target.replaceRank(1, b.workerId, b.dpRank, dump(b, [2])))
      expect(after.reason).toBe("Stopped")
    })
  )
})
