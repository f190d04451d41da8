/**
 * The worker query (recovery) protocol as the source supervisor sees it, independent of the wire:
 * `src/transport` implements `WorkerQueryTransport` over ZeroMQ (the Dynamo worker-query
 * DEALER/ROUTER exchange for `dynamo-zmq` sources, the engine replay ROUTER for `engine-zmq`).
 */

import { Data, type Effect } from "effect"
import type { KvEventSource } from "../protocol/Discovery.js"
import type { DpRank, RouterEvent, WorkerId } from "../protocol/Events.js"

/** A worker query for a rank's events from an id on (recovery-events §6). */
export interface WorkerKvQueryRequest {
  readonly workerId: WorkerId
  readonly dpRank: DpRank
  /** Inclusive start; undefined asks for a full tree dump. */
  readonly startEventId: number | undefined
  /** Inclusive end; used for validation only, replies run to the current tail. */
  readonly endEventId: number | undefined
  readonly supportsTreeDumpFailed: boolean
}

/** A worker's answer: its events, a tree dump, or why it has neither. */
export type WorkerKvQueryResponse =
  | {
      readonly _tag: "Events"
      readonly events: ReadonlyArray<RouterEvent>
      readonly lastEventId: number
      /** An engine replay that could not reach back to the requested start (see `historyPartial`). */
      readonly historyPartial?: boolean
    }
  | {
      readonly _tag: "TreeDump"
      readonly events: ReadonlyArray<RouterEvent>
      readonly lastEventId: number
      /**
       * Set by an engine replay whose buffer no longer reaches back to seq 0 (PROTOCOL §3.3 ◆3):
       * the events are what it still holds, in order; the rank's history is partial. A Dynamo
       * worker's dump is always complete.
       */
      readonly historyPartial?: boolean
    }
  | { readonly _tag: "TreeDumpFailed"; readonly lastEventId: number; readonly message: string }
  | {
      readonly _tag: "TooNew"
      readonly requestedStart: number | undefined
      readonly requestedEnd: number | undefined
      readonly newestAvailable: number
    }
  | { readonly _tag: "InvalidRange"; readonly startId: number; readonly endId: number }
  /** A failure serialized as text by the worker; callers retry it like a transport error. */
  | { readonly _tag: "Error"; readonly message: string }

/** The query could not be delivered or answered (send failure, timeout, undecodable reply). */
export class WorkerQueryError extends Data.TaggedError("WorkerQueryError")<{ readonly message: string }> {}

/** What a query's answer is checked against: the facts of the pool the source serves. */
export interface WorkerQueryContext {
  /** The card's `kvCacheBlockSize`; replayed engine events of another block size are malformed. */
  readonly kvBlockSize?: number | undefined
}

/** How the supervisor sends worker queries. */
export interface WorkerQueryTransport {
  readonly queryWorker: (
    source: KvEventSource,
    request: WorkerKvQueryRequest,
    context?: WorkerQueryContext
  ) => Effect.Effect<WorkerKvQueryResponse, WorkerQueryError>
}
