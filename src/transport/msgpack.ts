/**
 * msgpack for the Dynamo event plane and the worker-query protocol (PROTOCOL.md §3–§4,
 * recovery-events.md §6.1): a cursor reader and a growable writer over `Uint8Array`, the
 * `Vec<RouterEvent>` payload codec, the `EventEnvelope` codec and the worker-query maps. The
 * machinery is in `internal/msgpack/`; this module is what the rest of kvrelay uses of it.
 *
 * Block hashes are read straight into hash pairs (`[hi, lo]` in a `Uint32Array`): a generic
 * decoder would materialise one BigInt per hash (msgpackr with `int64AsType: "bigint"`), which
 * the benchmark in `bench/zmq.ts` shows to be several times slower than this reader.
 *
 * Decoders throw `MsgpackDecodeError` internally; the exported `decode*` functions never throw
 * anything else and callers convert the failure into a counted, dropped message.
 */

export { type EventEnvelope, encodeEnvelope } from "./internal/msgpack/envelope.js"
export { MsgpackDecodeError, MsgpackReader } from "./internal/msgpack/reader.js"
export {
  decodeRouterEvents,
  encodeRouterEvents,
  type RouterEventEncodeOptions
} from "./internal/msgpack/routerEvents.js"
export {
  decodeWorkerQueryRequest,
  decodeWorkerQueryResponse,
  encodeWorkerQueryRequest,
  encodeWorkerQueryResponse
} from "./internal/msgpack/workerQuery.js"
export { fixKey, MsgpackWriter } from "./internal/msgpack/writer.js"
