/**
 * Seed 000 (`kv_dc_relay/host.rs`): coalescing of pool-actor faults while the host is busy
 * (`PendingActorFaults`, `collect_pending_while`). The other seed-000 tests are ported elsewhere.
 */

import { describe, expect, it } from "@effect/vitest"
import { Deferred, Effect, Fiber, Queue, Ref } from "effect"
import {
  type CkfFailureDisposition,
  type CkfFailurePoint,
  failureDisposition
} from "../../src/ckf/failure.js"
import {
  collectPendingWhile,
  MAX_PENDING_SOURCE_FAULTS,
  PendingActorFaults
} from "../../src/relay/PendingActorFaults.js"
import {
  type ActorFault,
  type ActorFaultCategory,
  DEFAULT_FAULT_CAPACITY
} from "../../src/relay/PoolActor.js"

const disposition = (point: CkfFailurePoint): CkfFailureDisposition => failureDisposition(point)

const actorFault = (
  workerId: number,
  dpRank: number,
  sourceEpoch: number,
  eventId: number,
  d: CkfFailureDisposition
): ActorFault => {
  const category: ActorFaultCategory =
    d.action === "ReportResourceFailure"
      ? "Resource"
      : d.action === "RejectSource"
        ? "SourceProtocol"
        : "ProducerInvariant"
  return {
    workerId: String(workerId),
    dpRank,
    sourceEpoch,
    eventId,
    category,
    disposition: d,
    message: `fault ${eventId}`
  }
}

describe("seed 000: pending actor faults", () => {
  it("pending_faults_coalesce_duplicate_and_stronger_source_actions", () => {
    const resource = disposition("PrecommitAllocationFailure")
    const reject = disposition("SourceProtocolFailure")
    const pending = new PendingActorFaults()

    for (let eventId = 0; eventId < 1_000; eventId++) pending.push(actorFault(1, 0, 1, eventId, resource))
    pending.push(actorFault(1, 0, 1, 1_000, reject))
    pending.push(actorFault(1, 0, 1, 1_001, resource))

    expect(pending.size).toBe(1)
    const strongest = pending.popFront()
    expect(strongest?._tag).toBe("Fault")
    if (strongest?._tag !== "Fault") throw new Error("strongest source fault was not retained")
    expect(strongest.fault.disposition.action).toBe("RejectSource")
    expect(pending.popFront()).toBeUndefined()

    pending.push(actorFault(1, 0, 1, 1_002, reject))
    pending.push(actorFault(1, 0, 2, 1_003, resource))
    const newer = pending.popFront()
    if (newer?._tag !== "Fault") throw new Error("newer source epoch was not retained")
    expect(newer.fault.sourceEpoch).toBe(2)
    expect(newer.fault.disposition.action).toBe("ReportResourceFailure")
  })

  it("pending_fault_overflow_fails_safe_with_a_producer_fence", () => {
    const resource = disposition("PrecommitAllocationFailure")
    const pending = new PendingActorFaults()

    for (let workerId = 0; workerId < MAX_PENDING_SOURCE_FAULTS; workerId++) {
      pending.push(actorFault(workerId, 0, 1, workerId, resource))
    }
    expect(pending.size).toBe(MAX_PENDING_SOURCE_FAULTS)

    pending.push(actorFault(MAX_PENDING_SOURCE_FAULTS, 0, 1, MAX_PENDING_SOURCE_FAULTS, resource))
    expect(pending.size).toBe(1)
    const action = pending.popFront()
    expect(action?._tag === "ProducerFence" && action.trigger._tag).toBe("PendingOverflow")
    expect(pending.popFront()).toBeUndefined()
  })

  it("producer_fence_supersedes_varied_pending_source_faults", () => {
    const resource = disposition("PrecommitAllocationFailure")
    const reject = disposition("SourceProtocolFailure")
    const fence = disposition("PrewriteInvariantMismatch")
    const pending = new PendingActorFaults()

    pending.push(actorFault(1, 0, 1, 1, resource))
    pending.push(actorFault(1, 0, 1, 2, resource))
    pending.push(actorFault(2, 0, 1, 3, reject))
    pending.push(actorFault(3, 0, 1, 4, resource))
    pending.push(actorFault(1, 0, 1, 5, fence))
    pending.push(actorFault(4, 0, 1, 6, resource))

    expect(pending.size).toBe(1)
    const action = pending.popFront()
    if (action?._tag !== "ProducerFence" || action.trigger._tag !== "Fault") {
      throw new Error("producer fence did not supersede weaker source faults")
    }
    expect(action.trigger.fault.disposition.action).toBe("FenceAndRebuildProducer")
    expect(pending.popFront()).toBeUndefined()
  })

  it.effect("producer_fence_interrupts_inflight_fault_recovery", () =>
    Effect.gen(function* () {
      const resource = disposition("PrecommitAllocationFailure")
      const fence = disposition("PrewriteInvariantMismatch")
      const faults = yield* Queue.bounded<ActorFault>(DEFAULT_FAULT_CAPACITY)
      const recoveryStarted = yield* Deferred.make<void>()
      const releaseRecovery = yield* Deferred.make<void>()
      const recoveryFinished = yield* Ref.make(false)
      const pending = new PendingActorFaults()

      const collection = yield* Effect.fork(
        collectPendingWhile(
          faults,
          pending,
          Effect.gen(function* () {
            yield* Deferred.succeed(recoveryStarted, undefined)
            yield* Deferred.await(releaseRecovery)
            yield* Ref.set(recoveryFinished, true)
            return "Recovering" as const
          })
        )
      )

      yield* Deferred.await(recoveryStarted)
      for (let eventId = 0; eventId < 100; eventId++) {
        yield* Queue.offer(faults, actorFault(1, 0, 1, eventId, resource))
      }
      yield* Queue.offer(faults, actorFault(1, 0, 1, 100, fence))

      const outcome = yield* Fiber.join(collection)
      expect(outcome._tag).toBe("ProducerFence")
      expect(outcome._tag === "ProducerFence" && outcome.trigger._tag).toBe("Fault")
      expect(pending.size).toBe(0)
      // The recovery was dropped: releasing it now reaches nobody.
      yield* Deferred.succeed(releaseRecovery, undefined)
      yield* Effect.yieldNow()
      expect(yield* Ref.get(recoveryFinished)).toBe(false)
    })
  )
})
