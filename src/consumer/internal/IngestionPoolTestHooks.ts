/**
 * The ingestion pool's test hooks, which the seed's tests use (its `Pause` and `Crash` commands,
 * a paused snapshot activation, a forced retirement or epoch): not part of the pool's type, and
 * present only on a pool built by `makeWithTestHooks`.
 */

import type { Effect } from "effect"
import type { AdmissionEpochExhausted, UnconfiguredLane } from "../ConsumerErrors.js"
import type { GlobalCkfIngestionPool } from "../GlobalCkfIngestionPool.js"

/** A worker held at a test pause point: `entered` completes once it is there, `release` frees it. */
export interface PauseHandle {
  readonly entered: Effect.Effect<void>
  readonly release: Effect.Effect<void>
}

/** Hooks the seed's tests use. */
export interface GlobalCkfIngestionPoolTestHooks {
  /** The seed's `Pause` command: the lane's worker stops at this point of its FIFO. */
  readonly pauseLaneWorker: (lane: number) => Effect.Effect<PauseHandle, UnconfiguredLane>
  /** The seed's `Crash` command: the lane's worker dies with a defect when it reaches it. */
  readonly crashLaneWorker: (lane: number) => Effect.Effect<void, UnconfiguredLane>
  /** The next snapshot of the lane stops after its bucket writes, before the activation check. */
  readonly pauseNextSnapshotActivation: (lane: number) => Effect.Effect<PauseHandle, UnconfiguredLane>
  /** Retire the lane's admission exactly as saturation or a timeout would. */
  readonly retireLane: (lane: number) => Effect.Effect<void, UnconfiguredLane | AdmissionEpochExhausted>
  /** Force the lane's admission epoch to u64::MAX. */
  readonly exhaustLaneEpoch: (lane: number) => Effect.Effect<void, UnconfiguredLane>
}

/** How a pool is built: with the test hooks or without (production). */
export interface GlobalCkfIngestionPoolOptions {
  readonly testHooks?: boolean
}

/** A pool with its test hooks beside it. */
export interface GlobalCkfIngestionPoolWithTestHooks extends GlobalCkfIngestionPool {
  readonly testHooks: GlobalCkfIngestionPoolTestHooks
}
