/**
 * The worker-query maps (PROTOCOL.md §4): snake_case maps, externally tagged responses.
 */

import { decimalOf } from "../../../ckf/u64.js"
import type { RouterEvent, WorkerId } from "../../../protocol/Events.js"
import type { WorkerKvQueryRequest, WorkerKvQueryResponse } from "../../../recovery/WorkerQuery.js"
import { fail, MsgpackReader } from "./reader.js"
import {
  type DecodeResult,
  guardDecode,
  readRouterEvents,
  scratch,
  u64HalvesOfDecimal,
  writeRouterEvent
} from "./routerEvents.js"
import { fixKey, K, MsgpackWriter } from "./writer.js"

// ---------------------------------------------------------------------------------------------
// Worker query (PROTOCOL.md §4): snake_case maps, externally tagged responses

const REQUEST_KEYS = K(
  "worker_id",
  "dp_rank",
  "start_event_id",
  "end_event_id",
  "supports_tree_dump_failed",
  "kind"
)

/** A decoded request; `kind` is the v4 query kind when one was sent (`recovery` is the only one served). */
export interface DecodedWorkerQueryRequest extends WorkerKvQueryRequest {
  readonly kind: string | undefined
}

const readOptionalId = (r: MsgpackReader, what: string): number | undefined =>
  r.nil() ? undefined : r.uint(what)

/** Throws `MsgpackDecodeError`. */
export const readWorkerQueryRequest = (r: MsgpackReader): DecodedWorkerQueryRequest => {
  let workerId: WorkerId | undefined
  let dpRank = 0
  let startEventId: number | undefined
  let endEventId: number | undefined
  let supportsTreeDumpFailed = false
  let kind: string | undefined
  const entries = r.map("worker query request")
  for (let e = 0; e < entries; e++) {
    switch (r.key(REQUEST_KEYS)) {
      case 0:
        r.u64(scratch, 0, "worker_id")
        workerId = decimalOf(scratch[0]!, scratch[1]!)
        break
      case 1:
        dpRank = r.uint("dp_rank", 0xffff_ffff)
        break
      case 2:
        startEventId = readOptionalId(r, "start_event_id")
        break
      case 3:
        endEventId = readOptionalId(r, "end_event_id")
        break
      case 4:
        supportsTreeDumpFailed = r.nil() ? false : r.bool("supports_tree_dump_failed")
        break
      case 5: {
        // A unit variant is a string; a struct variant a single-entry map keyed by its name.
        const entries = r.tryMap()
        kind = r.string("kind")
        if (entries === 1) r.skip()
        else if (entries > 1) fail("kind: expected a single-entry variant map")
        break
      }
      // A key that is not a string: skip it and its value. Each decoder's switch spells this out:
      // the switches stay flat on the decode path (see transport/msgpack.ts).
      case -2:
        r.skip()
        r.skip()
        break
      default:
        r.skip()
    }
  }
  if (workerId === undefined) return fail("worker query request: missing worker_id")
  return { workerId, dpRank, startEventId, endEventId, supportsTreeDumpFailed, kind }
}

export const decodeWorkerQueryRequest = (bytes: Uint8Array): DecodeResult<DecodedWorkerQueryRequest> =>
  guardDecode(() => readWorkerQueryRequest(new MsgpackReader(bytes)))

const REQUEST_KEY = {
  worker_id: fixKey("worker_id"),
  dp_rank: fixKey("dp_rank"),
  start_event_id: fixKey("start_event_id"),
  end_event_id: fixKey("end_event_id"),
  supports_tree_dump_failed: fixKey("supports_tree_dump_failed")
}

const writeOptionalId = (w: MsgpackWriter, id: number | undefined): MsgpackWriter =>
  id === undefined ? w.nil() : w.int(id)

export const encodeWorkerQueryRequest = (request: WorkerKvQueryRequest): Uint8Array => {
  const [hi, lo] = u64HalvesOfDecimal(request.workerId)
  const w = new MsgpackWriter(96)
  w.map(5).raw(REQUEST_KEY.worker_id).u64(hi, lo).raw(REQUEST_KEY.dp_rank).int(request.dpRank)
  writeOptionalId(w.raw(REQUEST_KEY.start_event_id), request.startEventId)
  writeOptionalId(w.raw(REQUEST_KEY.end_event_id), request.endEventId)
  w.raw(REQUEST_KEY.supports_tree_dump_failed).bool(request.supportsTreeDumpFailed)
  return w.finish()
}

const RESPONSE_TAGS = K("Events", "TreeDump", "TreeDumpFailed", "TooNew", "InvalidRange", "Error")
const EVENTS_KEYS = K("events", "last_event_id")
const DUMP_FAILED_KEYS = K("last_event_id", "message")
const TOO_NEW_KEYS = K("requested_start", "requested_end", "newest_available")
const INVALID_RANGE_KEYS = K("start_id", "end_id")

const readEventsBody = (r: MsgpackReader, tag: "Events" | "TreeDump"): WorkerKvQueryResponse => {
  const entries = r.tryMap()
  if (entries < 0) {
    // v1: a bare list. Only `Events` can be used without a watermark (its last id is one).
    if (tag === "TreeDump") fail("TreeDump: a bare list (v1) carries no last_event_id")
    const events = readRouterEvents(r)
    return {
      _tag: "Events",
      events,
      lastEventId: events.length === 0 ? 0 : events[events.length - 1]!.eventId
    }
  }
  let events: Array<RouterEvent> | undefined
  let lastEventId = -1
  for (let e = 0; e < entries; e++) {
    switch (r.key(EVENTS_KEYS)) {
      case 0:
        events = readRouterEvents(r)
        break
      case 1:
        lastEventId = r.uint("last_event_id")
        break
      // A key that is not a string: skip it and its value. Each decoder's switch spells this out:
      // the switches stay flat on the decode path (see transport/msgpack.ts).
      case -2:
        r.skip()
        r.skip()
        break
      default:
        r.skip()
    }
  }
  if (events === undefined) return fail(`${tag}: missing events`)
  if (lastEventId < 0) return fail(`${tag}: missing last_event_id`)
  return { _tag: tag, events, lastEventId }
}

/** Throws `MsgpackDecodeError`. */
export const readWorkerQueryResponse = (r: MsgpackReader): WorkerKvQueryResponse => {
  const entries = r.map("worker query response")
  if (entries !== 1) fail(`worker query response: expected one variant, got ${entries} entries`)
  const tag = r.key(RESPONSE_TAGS)
  switch (tag) {
    case 0:
      return readEventsBody(r, "Events")
    case 1:
      return readEventsBody(r, "TreeDump")
    case 2: {
      let lastEventId = -1
      let message = ""
      const n = r.map("TreeDumpFailed")
      for (let e = 0; e < n; e++) {
        const k = r.key(DUMP_FAILED_KEYS)
        if (k === 0) lastEventId = r.uint("last_event_id")
        else if (k === 1) message = r.string("message")
        else {
          if (k === -2) r.skip()
          r.skip()
        }
      }
      if (lastEventId < 0) return fail("TreeDumpFailed: missing last_event_id")
      return { _tag: "TreeDumpFailed", lastEventId, message }
    }
    case 3: {
      let requestedStart: number | undefined
      let requestedEnd: number | undefined
      let newestAvailable = -1
      const n = r.map("TooNew")
      for (let e = 0; e < n; e++) {
        const k = r.key(TOO_NEW_KEYS)
        if (k === 0) requestedStart = readOptionalId(r, "requested_start")
        else if (k === 1) requestedEnd = readOptionalId(r, "requested_end")
        else if (k === 2) newestAvailable = r.uint("newest_available")
        else {
          if (k === -2) r.skip()
          r.skip()
        }
      }
      if (newestAvailable < 0) return fail("TooNew: missing newest_available")
      return { _tag: "TooNew", requestedStart, requestedEnd, newestAvailable }
    }
    case 4: {
      let startId = -1
      let endId = -1
      const n = r.map("InvalidRange")
      for (let e = 0; e < n; e++) {
        const k = r.key(INVALID_RANGE_KEYS)
        if (k === 0) startId = r.uint("start_id")
        else if (k === 1) endId = r.uint("end_id")
        else {
          if (k === -2) r.skip()
          r.skip()
        }
      }
      if (startId < 0 || endId < 0) return fail("InvalidRange: missing start_id or end_id")
      return { _tag: "InvalidRange", startId, endId }
    }
    case 5:
      return { _tag: "Error", message: r.string("Error") }
    case -1:
      return fail(`worker query response: unknown variant ${JSON.stringify(r.lastKey())}`)
    default:
      return fail("worker query response: the variant tag is not a string")
  }
}

export const decodeWorkerQueryResponse = (bytes: Uint8Array): DecodeResult<WorkerKvQueryResponse> =>
  guardDecode(() => readWorkerQueryResponse(new MsgpackReader(bytes)))

const RESPONSE_KEY = {
  Events: fixKey("Events"),
  TreeDump: fixKey("TreeDump"),
  TreeDumpFailed: fixKey("TreeDumpFailed"),
  TooNew: fixKey("TooNew"),
  InvalidRange: fixKey("InvalidRange"),
  Error: fixKey("Error"),
  events: fixKey("events"),
  last_event_id: fixKey("last_event_id"),
  message: fixKey("message"),
  requested_start: fixKey("requested_start"),
  requested_end: fixKey("requested_end"),
  newest_available: fixKey("newest_available"),
  start_id: fixKey("start_id"),
  end_id: fixKey("end_id")
}

export const encodeWorkerQueryResponse = (response: WorkerKvQueryResponse): Uint8Array => {
  const w = new MsgpackWriter(128)
  w.map(1)
  switch (response._tag) {
    case "Events":
    case "TreeDump":
      w.raw(RESPONSE_KEY[response._tag]).map(2).raw(RESPONSE_KEY.events).array(response.events.length)
      for (const event of response.events) writeRouterEvent(w, event)
      w.raw(RESPONSE_KEY.last_event_id).int(response.lastEventId)
      break
    case "TreeDumpFailed":
      w.raw(RESPONSE_KEY.TreeDumpFailed)
        .map(2)
        .raw(RESPONSE_KEY.last_event_id)
        .int(response.lastEventId)
        .raw(RESPONSE_KEY.message)
        .str(response.message)
      break
    case "TooNew":
      w.raw(RESPONSE_KEY.TooNew).map(3)
      writeOptionalId(w.raw(RESPONSE_KEY.requested_start), response.requestedStart)
      writeOptionalId(w.raw(RESPONSE_KEY.requested_end), response.requestedEnd)
      w.raw(RESPONSE_KEY.newest_available).int(response.newestAvailable)
      break
    case "InvalidRange":
      w.raw(RESPONSE_KEY.InvalidRange)
        .map(2)
        .raw(RESPONSE_KEY.start_id)
        .int(response.startId)
        .raw(RESPONSE_KEY.end_id)
        .int(response.endId)
      break
    case "Error":
      w.raw(RESPONSE_KEY.Error).str(response.message)
      break
  }
  return w.finish()
}
