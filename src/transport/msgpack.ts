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
 *
 * The decoders repeat themselves on purpose, and each repeat says so where it stands: every
 * fast-path key has its own constants and matcher (compared as whole 32-bit words), and every
 * general reader spells out its key switch, skips included. They run once or more per message on
 * the ingest hot path: a shared matcher taking the key as an argument, or a switch shared through
 * callbacks, would add a call and a memory read per key there. Change them only with `kvrelay bench --only zmq_ingest`.
 */

/** The Dynamo event envelope and its encoder (simulators and tests; the relay decodes it inside the transport). */
export { type EventEnvelope, encodeEnvelope } from "./internal/msgpack/envelope.js"
/** The cursor reader, and the error its decoders throw for bytes that are not what they expect. */
export { MsgpackDecodeError, MsgpackReader } from "./internal/msgpack/reader.js"
/** The `Vec<RouterEvent>` payload codec, with the older encodings tests can ask for. */
export {
  decodeRouterEvents,
  encodeRouterEvents,
  type RouterEventEncodeOptions
} from "./internal/msgpack/routerEvents.js"
/** The worker-query request and response codecs (recovery-events §6.1). */
export {
  decodeWorkerQueryRequest,
  decodeWorkerQueryResponse,
  encodeWorkerQueryRequest,
  encodeWorkerQueryResponse
} from "./internal/msgpack/workerQuery.js"
/** The growable writer, and the bytes of a fixstr map key. */
export { fixKey, MsgpackWriter } from "./internal/msgpack/writer.js"
