import { describe, expect, it } from "@effect/vitest"
import { Deferred, Effect, Fiber, HashMap, Logger, LogLevel, Option, Queue, TestClock } from "effect"
import fc from "fast-check"
import { type CkfFailurePoint, failureDisposition } from "../../src/ckf/failure.js"
import { CacheSemanticsId, DcId, IndexerDomainId, PoolId, RoutingScopeId } from "../../src/ckf/identity.js"
import {
  collectPendingWhile,
  drainFaultsWhile,
  drainReadyFaults,
  MAX_PENDING_SOURCE_FAULTS,
  type PendingActorAction,
  PendingActorFaults
} from "../../src/relay/PendingActorFaults.js"
import type { ActorFault } from "../../src/relay/PoolActor.js"

type Kind = "Resource" | "Reject" | "Fence" | "Omission"

const POINT: Record<Kind, CkfFailurePoint> = {
  Resource: "PrecommitAllocationFailure",
  Reject: "SourceProtocolFailure",
  Fence: "PrewriteInvariantMismatch",
  Omission: "BoundedRelocationFailure"
}

interface Spec {
  readonly worker: number
  readonly rank: number
  readonly epoch: number
  readonly kind: Kind
}

let nextEventId = 0
const fault = (spec: Spec): ActorFault => {
  const disposition = failureDisposition(POINT[spec.kind])
  return {
    workerId: String(spec.worker),
    dpRank: spec.rank,
    sourceEpoch: spec.epoch,
    eventId: nextEventId++,
    category:
      spec.kind === "Resource" ? "Resource" : spec.kind === "Reject" ? "SourceProtocol" : "ProducerInvariant",
    disposition,
    message: `${spec.kind} ${spec.worker}/${spec.rank}@${spec.epoch}`
  }
}

const spec = (kinds: ReadonlyArray<Kind>, workers: number): fc.Arbitrary<Spec> =>
  fc.record({
    worker: fc.integer({ min: 0, max: workers - 1 }),
    rank: fc.integer({ min: 0, max: 1 }),
    epoch: fc.integer({ min: 0, max: 3 }),
    kind: fc.constantFrom(...kinds)
  })

const drain = (pending: PendingActorFaults): Array<PendingActorAction> => {
  const out: Array<PendingActorAction> = []
  for (let a = pending.popFront(); a !== undefined; a = pending.popFront()) out.push(a)
  return out
}

/** The plain reference: one entry per source in first-fault order; newer epoch, then Reject over Resource. */
const model = (specs: ReadonlyArray<Spec>) => {
  const order: Array<string> = []
  const kept = new Map<string, Spec>()
  let overflowAt: number | undefined
  let fenceAt: number | undefined
  specs.forEach((s, i) => {
    if (overflowAt !== undefined || fenceAt !== undefined) return
    if (s.kind === "Omission") return
    if (s.kind === "Fence") {
      fenceAt = i
      return
    }
    const key = `${s.worker}/${s.rank}`
    const current = kept.get(key)
    if (current === undefined) {
      if (kept.size >= MAX_PENDING_SOURCE_FAULTS) {
        overflowAt = i
        return
      }
      order.push(key)
      kept.set(key, s)
    } else if (
      s.epoch > current.epoch ||
      (s.epoch === current.epoch && current.kind === "Resource" && s.kind === "Reject")
    ) {
      kept.set(key, s)
    }
  })
  return { order, kept, overflowAt, fenceAt }
}

describe("PendingActorFaults boundary (seed: MAX_PENDING_SOURCE_FAULTS = 16)", () => {
  it("keeps the 16th distinct pending source fault and fences on the 17th", () => {
    const pending = new PendingActorFaults()
    for (let worker = 0; worker < 16; worker++)
      pending.push(fault({ worker, rank: 0, epoch: 1, kind: "Resource" }))
    expect(pending.size).toBe(16)
    expect(pending.hasProducerFence()).toBe(false)
    pending.push(fault({ worker: 16, rank: 0, epoch: 1, kind: "Resource" }))
    expect(pending.hasProducerFence()).toBe(true)
    const action = pending.popFront()
    expect(action?._tag === "ProducerFence" && action.trigger._tag).toBe("PendingOverflow")
  })
})

describe("PendingActorFaults properties", () => {
  it("the strongest action per source wins, in first-fault order", () => {
    fc.assert(
      fc.property(fc.array(spec(["Resource", "Reject", "Omission"], 6), { maxLength: 200 }), (specs) => {
        const pending = new PendingActorFaults()
        for (const s of specs) pending.push(fault(s))
        const expected = model(specs)
        expect(expected.overflowAt).toBeUndefined()
        const actions = drain(pending)
        expect(
          actions.map((a) => (a._tag === "Fault" ? `${a.fault.workerId}/${a.fault.dpRank}` : "fence"))
        ).toEqual(expected.order)
        for (const action of actions) {
          if (action._tag !== "Fault") throw new Error("unexpected producer fence")
          const want = expected.kept.get(`${action.fault.workerId}/${action.fault.dpRank}`)!
          expect(action.fault.sourceEpoch).toBe(want.epoch)
          expect(action.fault.disposition.action).toBe(failureDisposition(POINT[want.kind]).action)
        }
      })
    )
  })

  it("overflow always yields exactly one producer fence and nothing else", () => {
    fc.assert(
      fc.property(
        fc.array(spec(["Resource", "Reject", "Omission"], 40), { minLength: 1, maxLength: 300 }),
        fc.array(spec(["Resource", "Reject"], 40), { maxLength: 50 }),
        (prefix, suffix) => {
          // Guarantee more than 16 distinct sources somewhere in the sequence.
          const distinct = Array.from({ length: MAX_PENDING_SOURCE_FAULTS + 1 }, (_, i) => ({
            worker: 100 + i,
            rank: 0,
            epoch: 0,
            kind: "Resource" as const
          }))
          const specs = [...prefix, ...distinct, ...suffix]
          const pending = new PendingActorFaults()
          for (const s of specs) pending.push(fault(s))
          const expected = model(specs)
          expect(expected.overflowAt).toBeDefined()
          const actions = drain(pending)
          expect(actions).toHaveLength(1)
          const action = actions[0]!
          expect(action._tag === "ProducerFence" && action.trigger._tag).toBe("PendingOverflow")
          if (action._tag === "ProducerFence") {
            const trigger = specs[expected.overflowAt!]!
            expect(action.trigger.fault.workerId).toBe(String(trigger.worker))
          }
        }
      )
    )
  })

  it("a producer fence supersedes any mix of pending faults", () => {
    fc.assert(
      fc.property(
        fc.array(spec(["Resource", "Reject", "Omission", "Fence"], 24), { maxLength: 200 }),
        spec(["Fence"], 24),
        fc.array(spec(["Resource", "Reject", "Omission", "Fence"], 24), { maxLength: 50 }),
        (before, fenceSpec, after) => {
          const specs = [...before, fenceSpec, ...after]
          const pending = new PendingActorFaults()
          for (const s of specs) pending.push(fault(s))
          const expected = model(specs)
          const actions = drain(pending)
          expect(actions).toHaveLength(1)
          const action = actions[0]!
          if (action._tag !== "ProducerFence") throw new Error("expected a producer fence")
          if (expected.overflowAt !== undefined) {
            expect(action.trigger._tag).toBe("PendingOverflow")
          } else {
            expect(action.trigger._tag).toBe("Fault")
            expect(action.trigger.fault.disposition.action).toBe("FenceAndRebuildProducer")
            expect(action.trigger.fault.message).toBe(fault(specs[expected.fenceAt!]!).message)
          }
          expect(pending.size).toBe(0)
        }
      )
    )
  })
})

describe("fault collection helpers", () => {
  const poolId = new PoolId(
    new IndexerDomainId(
      new CacheSemanticsId(new Uint8Array(16).fill(1), "explicit"),
      new RoutingScopeId(new Uint8Array(16).fill(3), "explicit")
    ),
    new DcId(2n)
  )

  it.effect("collectPendingWhile completes and keeps source faults pending", () =>
    Effect.gen(function* () {
      const faults = yield* Queue.bounded<ActorFault>(16)
      const pending = new PendingActorFaults()
      const collection = yield* Effect.fork(
        collectPendingWhile(faults, pending, Effect.as(Effect.sleep("10 millis"), 42))
      )
      yield* Queue.offer(faults, fault({ worker: 1, rank: 0, epoch: 1, kind: "Resource" }))
      yield* Queue.offer(faults, fault({ worker: 2, rank: 0, epoch: 1, kind: "Reject" }))
      yield* Effect.yieldNow()
      yield* TestClock.adjust("10 millis")
      const outcome = yield* Fiber.join(collection)
      expect(outcome).toEqual({ _tag: "Completed", value: 42 })
      yield* drainReadyFaults(faults, pending)
      expect(pending.size).toBe(2)
    })
  )

  it.effect("drainFaultsWhile drops faults so a blocked sender can finish", () =>
    Effect.gen(function* () {
      const faults = yield* Queue.bounded<ActorFault>(1)
      // The "teardown" needs more fault slots than the queue has: it only completes if drained.
      const teardown = Effect.forEach(
        Array.from({ length: 5 }, (_, i) => fault({ worker: i, rank: 0, epoch: 0, kind: "Resource" })),
        (f) => Queue.offer(faults, f),
        { discard: true }
      ).pipe(Effect.as("retired"))
      const result = yield* drainFaultsWhile(poolId, faults, teardown)
      expect(result).toBe("retired")
    })
  )

  // Effect hands an offered item straight to a waiting taker; interrupting that taker before it
  // resumes drops the item. The guarded effect ends here, and `turns` scheduler turns later (still
  // before the collector runs again, for some of them) a fault is offered: a collector that
  // raced a take against the effect lost it. Every turn count must keep the fault.
  const sameTurnFault = (turns: number) =>
    Effect.gen(function* () {
      const faults = yield* Queue.bounded<ActorFault>(16)
      const done = yield* Deferred.make<number>()
      const late = fault({ worker: 1, rank: 0, epoch: 1, kind: "Resource" })
      const finish = Effect.gen(function* () {
        yield* Deferred.succeed(done, turns)
        for (let i = 0; i < turns; i++) yield* Effect.yieldNow()
        yield* Queue.offer(faults, late)
      })
      return { faults, done, late, finish }
    })

  /** Joins `fiber` once it is done, failing instead of hanging if a few hundred turns do not end it. */
  const joinSoon = <A, E>(fiber: Fiber.Fiber<A, E>, what: string) =>
    Effect.gen(function* () {
      for (let i = 0; i < 500; i++) {
        const exit = yield* Fiber.poll(fiber)
        if (Option.isSome(exit)) return yield* exit.value
        yield* Effect.yieldNow()
      }
      return yield* Effect.dieMessage(`${what} did not finish`)
    })

  /** What the queue still holds, without waiting. */
  const queued = (faults: Queue.Queue<ActorFault>) =>
    Queue.takeAll(faults).pipe(Effect.map((chunk) => [...chunk]))

  it.effect("collectPendingWhile keeps a fault offered in the same turn the guarded effect ends", () =>
    Effect.gen(function* () {
      for (let turns = 0; turns <= 30; turns++) {
        const { faults, done, late, finish } = yield* sameTurnFault(turns)
        const pending = new PendingActorFaults()
        const collection = yield* Effect.fork(collectPendingWhile(faults, pending, Deferred.await(done)))
        yield* Effect.yieldNow().pipe(Effect.repeatN(5))
        yield* Effect.fork(finish)
        expect(yield* joinSoon(collection, `collection (${turns} turns)`)).toEqual({
          _tag: "Completed",
          value: turns
        })
        yield* Effect.yieldNow().pipe(Effect.repeatN(50))
        // Either collected or still queued for the owner, and the queue holds nothing else.
        const left = yield* queued(faults)
        const collected = drain(pending).map((a) => (a._tag === "Fault" ? a.fault : undefined))
        expect({ turns, faults: [...collected, ...left] }).toEqual({ turns, faults: [late] })
      }
    })
  )

  it.effect("drainFaultsWhile logs a fault offered in the same turn the guarded effect ends", () =>
    Effect.gen(function* () {
      const logged: Array<string> = []
      const logger = Logger.make(({ annotations }) => {
        const error = HashMap.get(annotations, "error")
        if (Option.isSome(error)) logged.push(String(error.value))
      })
      for (let turns = 0; turns <= 30; turns++) {
        const { faults, done, late, finish } = yield* sameTurnFault(turns)
        logged.length = 0
        const drained = yield* Effect.fork(
          drainFaultsWhile(poolId, faults, Deferred.await(done)).pipe(
            Effect.provide(Logger.replace(Logger.defaultLogger, logger)),
            Logger.withMinimumLogLevel(LogLevel.Debug)
          )
        )
        yield* Effect.yieldNow().pipe(Effect.repeatN(5))
        yield* Effect.fork(finish)
        expect(yield* joinSoon(drained, `drain (${turns} turns)`)).toBe(turns)
        yield* Effect.yieldNow().pipe(Effect.repeatN(50))
        const left = (yield* queued(faults)).map((f) => f.message)
        expect({ turns, faults: [...logged, ...left] }).toEqual({ turns, faults: [late.message] })
      }
    })
  )

  it.effect("two readers of one queue: a wake-up taken by the other goes back to its collector", () =>
    Effect.gen(function* () {
      const faults = yield* Queue.bounded<ActorFault>(16)
      const pending = new PendingActorFaults()
      const retireDone = yield* Deferred.make<string>()
      const recoveryDone = yield* Deferred.make<string>()
      // The retirement drain parks first, so it is first in line for whatever is offered next.
      const retiring = yield* Effect.fork(drainFaultsWhile(poolId, faults, Deferred.await(retireDone)))
      yield* Effect.yieldNow().pipe(Effect.repeatN(5))
      const collecting = yield* Effect.fork(
        collectPendingWhile(faults, pending, Deferred.await(recoveryDone))
      )
      yield* Effect.yieldNow().pipe(Effect.repeatN(5))
      yield* Deferred.succeed(recoveryDone, "recovered")
      expect(yield* joinSoon(collecting, "the collection")).toEqual({ _tag: "Completed", value: "recovered" })
      // The drain still follows the queue: a real fault reaches it, not a stale wake-up.
      const real = fault({ worker: 2, rank: 0, epoch: 1, kind: "Resource" })
      yield* Queue.offer(faults, real)
      yield* Effect.yieldNow().pipe(Effect.repeatN(20))
      yield* Deferred.succeed(retireDone, "retired")
      expect(yield* joinSoon(retiring, "the drain")).toBe("retired")
      expect(yield* queued(faults)).toEqual([])
      expect(pending.size).toBe(0)
    })
  )
})
