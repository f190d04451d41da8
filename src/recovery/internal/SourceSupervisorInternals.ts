/**
 * The source supervisor's entry points below its public API, for the seed-test ports (the seed's
 * tests call the same private methods): not part of `SourceSupervisor`, and not for production
 * control flow. `internalsOf` finds them for a supervisor that `make` built.
 */

import type { Effect, Either } from "effect"
import type { KvEventSource, KvSourceMembershipView } from "../../protocol/Discovery.js"
import type { DpRank, WorkerId } from "../../protocol/Events.js"
import type { SourceBinding, SourceSupervisor } from "../SourceSupervisor.js"
import type { WorkerKvQueryResponse, WorkerQueryError } from "../WorkerQuery.js"

/** A read-only copy of one slot, for diagnostics and tests. */
export interface SourceSlotSnapshot {
  readonly active: SourceBinding | undefined
  readonly resetPending: boolean
  readonly lifecycleGeneration: number | undefined
  readonly rejectedGeneration: number | undefined
  readonly lastAdmittedId: number | undefined
  readonly recoveryInflight: boolean
  readonly pendingLiveEventCount: number
}

/**
 * Entry points below the public API, used by the seed-test ports (the seed's tests call the same
 * private methods). Not for production control flow.
 */
export interface SourceSupervisorInternals {
  /** Reconcile an explicit view without the membership lock (`reconcile_view`). */
  readonly reconcileView: (view: KvSourceMembershipView) => Effect.Effect<void>
  /** `finish_recovery` with a fresh, uncancelled task token, followed by any hole scheduling. */
  readonly finishRecovery: (
    binding: SourceBinding,
    result: Either.Either<WorkerKvQueryResponse, WorkerQueryError>
  ) => Effect.Effect<void>
  /** `fetch_recovery_response`: the retried, permit-limited query alone. */
  readonly fetchRecoveryResponse: (
    source: KvEventSource,
    startEventId: number | undefined,
    endEventId: number | undefined
  ) => Effect.Effect<WorkerKvQueryResponse, WorkerQueryError>
  readonly publisherBinding: (publisherId: bigint) => SourceBinding | undefined
  readonly slot: (workerId: WorkerId, dpRank: DpRank) => SourceSlotSnapshot | undefined
  readonly slotCount: () => number
  readonly runningRecoveryCount: () => number
}

const registered = new WeakMap<SourceSupervisor, SourceSupervisorInternals>()

/** Called by `make` once for each supervisor it builds. */
export const registerInternals = (
  supervisor: SourceSupervisor,
  internals: SourceSupervisorInternals
): void => {
  registered.set(supervisor, internals)
}

/** The internals of a supervisor `make` built (tests only). */
export const internalsOf = (supervisor: SourceSupervisor): SourceSupervisorInternals => {
  const internals = registered.get(supervisor)
  if (internals === undefined) throw new Error("not a supervisor that SourceSupervisorLive.make built")
  return internals
}
