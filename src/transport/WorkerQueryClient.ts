/**
 * `WorkerQueryTransport` over ZeroMQ, for both source kinds:
 *
 * - `dynamo-zmq` with a `recoveryTarget`: a DEALER to the target's ROUTER sends
 *   `[empty, request]` and takes the single `[empty, response]` (PROTOCOL.md §4).
 * - `engine-zmq` with a `replayEndpoint`: the engine replay protocol (§3, recovery-events B.4).
 *   A full restore replays from seq 0 and answers a `TreeDump` of the replayed events in order
 *   (ids seq + 1), with `lastEventId = last seq + 1`, for the rank to be replaced from. An
 *   incremental request for event id N replays from seq N − 1 and answers `Events`.
 *   Engines keep a bounded replay buffer, so history that cannot be covered is normal
 *   (PROTOCOL §3.3 ◆3): the answer then carries the contiguous run of decodable batches that ends
 *   at the newest one, flagged `historyPartial` (a replay that starts later than asked, skips a
 *   seq, or holds an undecodable batch). A full restore's events start after the run's last
 *   Cleared, if it has one: the rank's history is then complete from there. Nothing at or after
 *   an incremental request's seq is `TooNew{requestedStart, requestedEnd, newestAvailable: 0}`
 *   (the replay endpoint cannot say what its newest seq is).
 *
 * Every query uses its own DEALER, acquired in a Scope: the caller's attempt timeout interrupts
 * the query, the Scope closes the socket with linger 0, and a late reply can never be taken by
 * the next query. Queries to one target therefore never share a reply stream.
 */

import { Effect } from "effect"
import * as zmq from "zeromq"
import type { KvEventSource } from "../protocol/Discovery.js"
import type { RouterEvent } from "../protocol/Events.js"
import {
  type WorkerKvQueryRequest,
  type WorkerKvQueryResponse,
  type WorkerQueryContext,
  WorkerQueryError,
  type WorkerQueryTransport
} from "../recovery/WorkerQuery.js"
import { type ReplayedBatch, replayEngine } from "./EngineReplay.js"
import { decodeWorkerQueryResponse, encodeWorkerQueryRequest } from "./msgpack.js"
import { acquireSocket, connectSocket, receiveFrames, sendFrames, type ZmqError } from "./ZmqSocket.js"

interface WorkerQueryClientOptions {
  /** Refuse engine replays longer than this many batches (default 1,000,000). */
  readonly maxReplayBatches?: number
}

const toQueryError = (error: ZmqError): WorkerQueryError =>
  new WorkerQueryError({ message: `${error.operation} ${error.endpoint}: ${error.message}` })

/** One request/response exchange with a Dynamo worker-query ROUTER, on a socket of its own. */
const queryDynamoWorker = (
  endpoint: string,
  request: WorkerKvQueryRequest
): Effect.Effect<WorkerKvQueryResponse, WorkerQueryError> =>
  Effect.scoped(
    Effect.gen(function* () {
      const socket = yield* acquireSocket(() => new zmq.Dealer({ linger: 0 }))
      yield* connectSocket(socket, endpoint)
      yield* sendFrames(socket, [Buffer.alloc(0), encodeWorkerQueryRequest(request)], endpoint)
      const frames = yield* receiveFrames(socket, endpoint)
      const body =
        frames.length === 2 && frames[0]!.length === 0
          ? frames[1]!
          : frames.length === 1
            ? frames[0]!
            : undefined
      if (body === undefined) {
        return yield* new WorkerQueryError({
          message: `worker query reply from ${endpoint} has ${frames.length} frames, expected [empty, response]`
        })
      }
      const decoded = decodeWorkerQueryResponse(body)
      if (!decoded.ok)
        return yield* new WorkerQueryError({
          message: `undecodable worker query reply from ${endpoint}: ${decoded.message}`
        })
      return decoded.value
    })
  ).pipe(Effect.catchTag("ZmqError", (error) => Effect.fail(toQueryError(error))))

/**
 * Where the contiguous run of decodable batches that ends at the newest one starts: every batch
 * from that index on is decodable and one seq after the one before it.
 */
const coveredSuffixStart = (batches: ReadonlyArray<ReplayedBatch>): number => {
  let k = batches.length
  while (k > 0) {
    const batch = batches[k - 1]!
    if (batch.batch === undefined) break
    if (k < batches.length && batches[k]!.seq !== batch.seq + 1) break
    k--
  }
  return k
}

/** The events of `batches[from..]` in order; a full restore keeps only those after the last Cleared. */
const replayedEvents = (
  batches: ReadonlyArray<ReplayedBatch>,
  from: number,
  afterLastClear: boolean
): { readonly events: Array<RouterEvent>; readonly cleared: boolean } => {
  const events: Array<RouterEvent> = []
  let cleared = false
  for (let i = from; i < batches.length; i++) {
    for (const event of batches[i]!.batch!.events) {
      if (afterLastClear && event.data._tag === "Cleared") {
        // Everything before a clear is gone from the rank: its history starts over here.
        events.length = 0
        cleared = true
        continue
      }
      events.push(event)
    }
  }
  return { events, cleared }
}

const foreignRank = (
  batches: ReadonlyArray<ReplayedBatch>,
  request: WorkerKvQueryRequest
): WorkerKvQueryResponse | undefined => {
  const foreign = batches.find((b) => b.batch !== undefined && b.batch.dpRank !== request.dpRank)
  return foreign === undefined
    ? undefined
    : {
        _tag: "Error",
        message: `replayed batch ${foreign.seq} belongs to dp rank ${foreign.batch!.dpRank}, not ${request.dpRank}`
      }
}

/** Answers a worker query from an engine replay endpoint (see the module comment). */
const queryEngineReplay = (
  replayEndpoint: string,
  request: WorkerKvQueryRequest,
  options: WorkerQueryClientOptions = {},
  context: WorkerQueryContext = {}
): Effect.Effect<WorkerKvQueryResponse, WorkerQueryError> =>
  Effect.gen(function* () {
    const start = request.startEventId
    const end = request.endEventId
    if (start !== undefined && end !== undefined && end < start)
      return { _tag: "InvalidRange", startId: start, endId: end } satisfies WorkerKvQueryResponse
    // Event id N is batch seq N - 1; id 0 is never published, so it is covered by seq 0.
    const startSeq = start === undefined ? 0 : Math.max(0, start - 1)
    const batches = yield* replayEngine({
      replayEndpoint,
      startSeq,
      workerId: request.workerId,
      dpRank: request.dpRank,
      kvBlockSize: context.kvBlockSize,
      ...(options.maxReplayBatches === undefined ? {} : { maxBatches: options.maxReplayBatches })
    }).pipe(Effect.mapError(toQueryError))

    if (batches.length === 0) {
      if (start === undefined)
        return { _tag: "TreeDump", events: [], lastEventId: 0 } satisfies WorkerKvQueryResponse
      return {
        _tag: "TooNew",
        requestedStart: start,
        requestedEnd: end,
        newestAvailable: 0
      } satisfies WorkerKvQueryResponse
    }
    const foreign = foreignRank(batches, request)
    if (foreign !== undefined) return foreign
    const lastEventId = batches[batches.length - 1]!.seq + 1
    const from = coveredSuffixStart(batches)
    const reachesStart = from === 0 && batches[0]!.seq === startSeq
    if (start === undefined) {
      const { events, cleared } = replayedEvents(batches, from, true)
      return {
        _tag: "TreeDump",
        events,
        lastEventId,
        ...(reachesStart || cleared ? {} : { historyPartial: true })
      } satisfies WorkerKvQueryResponse
    }
    const { events } = replayedEvents(batches, from, false)
    return {
      _tag: "Events",
      events,
      lastEventId,
      ...(reachesStart ? {} : { historyPartial: true })
    } satisfies WorkerKvQueryResponse
  })

/** Where a source's recovery queries go. */
type QueryRoute =
  | { readonly _tag: "EngineReplay"; readonly endpoint: string }
  | { readonly _tag: "WorkerQuery"; readonly endpoint: string }

/** Engine sources use their replay endpoint; any other source its advertised recovery target. */
const queryRoute = (source: KvEventSource): QueryRoute | undefined => {
  if (source.transport.kind === "engine-zmq" && source.transport.replayEndpoint !== null)
    return { _tag: "EngineReplay", endpoint: source.transport.replayEndpoint }
  if (source.recoveryTarget !== null) return { _tag: "WorkerQuery", endpoint: source.recoveryTarget.endpoint }
  return undefined
}

/** The relay's worker-query transport over ZeroMQ. The caller bounds each attempt with its timeout. */
export const makeWorkerQueryClient = (options: WorkerQueryClientOptions = {}): WorkerQueryTransport => ({
  queryWorker: (source, request, context) => {
    const route = queryRoute(source)
    const attributes = {
      workerId: request.workerId,
      dpRank: request.dpRank,
      startEventId: request.startEventId ?? "dump",
      route: route?._tag ?? "none",
      endpoint: route?.endpoint ?? ""
    }
    if (route === undefined) {
      return Effect.fail(
        new WorkerQueryError({
          message: `source ${source.workerId}/${source.dpRank} (publisher ${source.publisherId}) has neither a recovery target nor a replay endpoint`
        })
      )
    }
    const query =
      route._tag === "WorkerQuery"
        ? queryDynamoWorker(route.endpoint, request)
        : queryEngineReplay(route.endpoint, request, options, context)
    return query.pipe(
      Effect.tap((response) =>
        Effect.logDebug("worker query answered").pipe(
          Effect.annotateLogs({ ...attributes, response: response._tag })
        )
      ),
      Effect.withSpan("WorkerQueryClient.queryWorker", { attributes })
    )
  }
})
