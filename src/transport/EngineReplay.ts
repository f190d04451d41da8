/**
 * Replay of an engine's buffered KV event batches (PROTOCOL.md §3.2, recovery-events.md B.4): a
 * DEALER sends `[empty, start seq u64 BE]` to the engine's ROUTER and receives
 * `[empty, seq, payload]` (or, from current vLLM, `[empty, topic, seq, payload]`) per buffered
 * batch with `seq ≥ start`, then the end marker with seq -1 and an empty payload.
 */

import { Effect } from "effect"
import * as zmq from "zeromq"
import { CacheNamespaces } from "../ckf/cacheNamespace.js"
import type { DpRank, WorkerId } from "../protocol/Events.js"
import { decodeEngineBatch, type EngineBatch } from "./EngineZmq.js"
import { acquireSocket, connectSocket, receiveFrames, sendFrames, u64FrameOf, ZmqError } from "./ZmqSocket.js"

const END_SEQ = Buffer.alloc(8, 0xff)

// ---------------------------------------------------------------------------------------------
// Replay client

/**
 * The sequence and payload frames of one replay reply, by frame count (PROTOCOL §3.2): SGLang and
 * vLLM before mid-2026 send `[empty, seq, payload]`; current vLLM adds its topic,
 * `[empty, topic, seq, payload]`, on every reply and on the end marker. A string says what was wrong.
 */
const replayReplyFrames = (
  frames: ReadonlyArray<Buffer>
): { readonly seqFrame: Buffer; readonly payload: Buffer } | string => {
  if (frames.length !== 3 && frames.length !== 4)
    return `unexpected replay message of ${frames.length} frames (expected [empty, seq, payload] or [empty, topic, seq, payload])`
  if (frames[0]!.length !== 0)
    return `replay message does not start with an empty delimiter frame (${frames[0]!.length} bytes)`
  const seqFrame = frames[frames.length - 2]!
  if (seqFrame.length !== 8) return `replay sequence frame is ${seqFrame.length} bytes, expected 8`
  return { seqFrame, payload: frames[frames.length - 1]! }
}

/** One batch an engine's replay endpoint sent back. */
export interface ReplayedBatch {
  readonly seq: number
  /** undefined when the batch could not be decoded (the replay then has a hole there). */
  readonly batch: EngineBatch | undefined
  readonly error: string | undefined
}

interface ReplayOptions {
  readonly replayEndpoint: string
  readonly startSeq: number
  readonly workerId: WorkerId
  readonly dpRank: DpRank
  /** The card's `kvCacheBlockSize` (see `EngineDecodeOptions`). */
  readonly kvBlockSize?: number | undefined
  /** Refuse replays longer than this many batches (default 1,000,000). */
  readonly maxBatches?: number
}

/**
 * Replays an engine's buffered batches from `startSeq` on a fresh DEALER. The socket lives only
 * as long as this effect: an interrupted replay closes it, so no reply can leak into another.
 */
export const replayEngine = (options: ReplayOptions): Effect.Effect<ReadonlyArray<ReplayedBatch>, ZmqError> =>
  Effect.scoped(
    Effect.gen(function* () {
      const endpoint = options.replayEndpoint
      // An engine's replay ROUTER drops what it cannot queue for a slow reader (libzmq's ROUTER
      // at its send high-water mark, 1000 messages by default), the end marker included, and a
      // replay is up to its whole buffer (vLLM: 10,000 batches) sent at once. An unbounded
      // receive queue lets this side's I/O thread take every reply off TCP as it arrives, so the
      // engine's queue for us never fills however busy the relay is.
      const socket = yield* acquireSocket(() => new zmq.Dealer({ linger: 0, receiveHighWaterMark: 0 }))
      yield* connectSocket(socket, endpoint)
      yield* sendFrames(socket, [Buffer.alloc(0), u64FrameOf(options.startSeq)], endpoint)
      const max = options.maxBatches ?? 1_000_000
      const out: Array<ReplayedBatch> = []
      // The replayed batches come in order, so a batch inherits its salted parent's namespace
      // when the parent is replayed too (a parent older than the replay cannot be known).
      const namespaces = new CacheNamespaces()
      for (;;) {
        const frames = yield* receiveFrames(socket, endpoint)
        const reply = replayReplyFrames(frames)
        if (typeof reply === "string")
          return yield* new ZmqError({ operation: "replay", endpoint, message: reply })
        if (reply.seqFrame.equals(END_SEQ)) return out
        const view = new DataView(reply.seqFrame.buffer, reply.seqFrame.byteOffset, 8)
        const hi = view.getUint32(0)
        if (hi >= 0x20_0000)
          return yield* new ZmqError({
            operation: "replay",
            endpoint,
            message: "replayed sequence above 2^53 - 1"
          })
        const seq = hi * 4294967296 + view.getUint32(4)
        const decoded = decodeEngineBatch(reply.payload, options.workerId, options.dpRank, seq + 1, {
          kvBlockSize: options.kvBlockSize,
          namespaces
        })
        out.push(
          decoded.ok
            ? { seq, batch: decoded.value, error: undefined }
            : { seq, batch: undefined, error: decoded.message }
        )
        if (out.length > max)
          return yield* new ZmqError({
            operation: "replay",
            endpoint,
            message: `replay exceeds ${max} batches`
          })
      }
    })
  ).pipe(
    Effect.withSpan("EngineZmq.replay", {
      attributes: { endpoint: options.replayEndpoint, startSeq: options.startSeq }
    })
  )

/** The replay end marker's sequence frame (`-1` as a signed 8-byte big-endian value). */
export const REPLAY_END_SEQ: Buffer = END_SEQ
