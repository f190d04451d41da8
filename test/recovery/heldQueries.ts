/** A worker-query transport whose queries all wait for one release, counting how many overlap. */

import { Deferred, Effect } from "effect"
import type { WorkerKvQueryResponse, WorkerQueryTransport } from "../../src/recovery/WorkerQuery.js"

export interface HeldQueries {
  readonly transport: WorkerQueryTransport
  /** Queries waiting now, and the most that ever waited at once. */
  readonly inFlight: () => number
  readonly peak: () => number
  /** Lets every waiting and later query answer an empty tree dump. */
  readonly release: Effect.Effect<void>
}

export const heldQueries: Effect.Effect<HeldQueries> = Effect.gen(function* () {
  let inFlight = 0
  let peak = 0
  const released = yield* Deferred.make<void>()
  return {
    transport: {
      queryWorker: () =>
        Effect.gen(function* () {
          inFlight++
          peak = Math.max(peak, inFlight)
          yield* Deferred.await(released)
          inFlight--
          return { _tag: "TreeDump", events: [], lastEventId: 0 } satisfies WorkerKvQueryResponse
        })
    },
    inFlight: () => inFlight,
    peak: () => peak,
    release: Deferred.succeed(released, undefined).pipe(Effect.asVoid)
  }
})
