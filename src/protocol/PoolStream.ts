/**
 * The binary frame stream of `POST /v1/pools/subscribe` (PROTOCOL.md §5):
 *
 * ```
 * u32 LE  length of everything after this field
 * u8      kind: 1 snapshot chunk, 2 delta, 3 heartbeat, 4 terminal error
 * u64 LE  base_sequence
 * u64 LE  sequence
 * u64 LE  send_ts_us (wall clock)
 * …       payload: CBI1 bytes (1, 2); empty (3); UTF-8 JSON {reason, message} (4)
 * ```
 */

import { CBI1_MAX_FRAME_BYTES } from "../ckf/cbi1.js"

/** The content type of a pool stream (PROTOCOL §6). */
export const POOL_STREAM_CONTENT_TYPE = "application/vnd.kvrelay.pool-stream.v1"

/** The kind byte of a pool-stream frame. */
export type PoolFrameKind = 1 | 2 | 3 | 4
/** A frame carrying one CBI1 snapshot chunk. */
export const FRAME_SNAPSHOT_CHUNK: PoolFrameKind = 1
/** A frame carrying one CBI1 delta. */
export const FRAME_DELTA: PoolFrameKind = 2
/** A frame that only says the stream is alive. */
export const FRAME_HEARTBEAT: PoolFrameKind = 3
/** The last frame of a stream that ended on an error, carrying the error body. */
export const FRAME_TERMINAL_ERROR: PoolFrameKind = 4

/** Bytes after the length field before the payload: kind + three u64. */
export const POOL_FRAME_FIXED_BYTES = 1 + 8 + 8 + 8
/** The largest frame a receiver must accept: a full CBI1 chunk plus the fixed fields. */
const MAX_POOL_FRAME_BYTES = POOL_FRAME_FIXED_BYTES + CBI1_MAX_FRAME_BYTES

/** One pool-stream frame: its kind, sequences, send time and payload. */
export interface PoolFrame {
  readonly kind: PoolFrameKind
  readonly baseSequence: bigint
  readonly sequence: bigint
  readonly sendTsUs: bigint
  readonly payload: Uint8Array
}

/**
 * Writes one frame at `out[at…]` (`view` over `out`) and returns the offset after it, so that a
 * backlog can be framed into one buffer.
 */
export const writePoolFrameAt = (
  out: Uint8Array,
  view: DataView,
  at: number,
  kind: PoolFrameKind,
  baseSequence: bigint,
  sequence: bigint,
  sendTsUs: bigint,
  payload: Uint8Array
): number => {
  view.setUint32(at, POOL_FRAME_FIXED_BYTES + payload.length, true)
  view.setUint8(at + 4, kind)
  view.setBigUint64(at + 5, baseSequence, true)
  view.setBigUint64(at + 13, sequence, true)
  view.setBigUint64(at + 21, sendTsUs, true)
  out.set(payload, at + 4 + POOL_FRAME_FIXED_BYTES)
  return at + 4 + POOL_FRAME_FIXED_BYTES + payload.length
}

/** The frame's bytes, length prefix included. */
export const encodePoolFrame = (frame: PoolFrame): Uint8Array => {
  const out = new Uint8Array(4 + POOL_FRAME_FIXED_BYTES + frame.payload.length)
  writePoolFrameAt(
    out,
    new DataView(out.buffer),
    0,
    frame.kind,
    frame.baseSequence,
    frame.sequence,
    frame.sendTsUs,
    frame.payload
  )
  return out
}

/** Bytes that are not a pool-stream frame; the message says what was wrong. */
export class PoolFrameDecodeError extends Error {
  readonly _tag = "PoolFrameDecodeError"
}

/**
 * Incremental decoder for a byte stream of pool frames: push chunks as they arrive, take every
 * complete frame. A malformed length or kind fails the stream (the receiver must reconnect).
 */
export class PoolFrameDecoder {
  private buffer = new Uint8Array(0)
  private length = 0

  push(chunk: Uint8Array): Array<PoolFrame> {
    if (this.length + chunk.length > this.buffer.length) {
      const next = new Uint8Array(Math.max(this.length + chunk.length, this.buffer.length * 2, 64 * 1024))
      next.set(this.buffer.subarray(0, this.length))
      this.buffer = next
    }
    this.buffer.set(chunk, this.length)
    this.length += chunk.length
    const frames: Array<PoolFrame> = []
    let offset = 0
    const view = new DataView(this.buffer.buffer, this.buffer.byteOffset, this.length)
    while (this.length - offset >= 4) {
      const size = view.getUint32(offset, true)
      if (size < POOL_FRAME_FIXED_BYTES || size > MAX_POOL_FRAME_BYTES) {
        throw new PoolFrameDecodeError(
          `pool frame length ${size} is outside ${POOL_FRAME_FIXED_BYTES}..=${MAX_POOL_FRAME_BYTES}`
        )
      }
      if (this.length - offset - 4 < size) break
      const kind = view.getUint8(offset + 4)
      if (kind < 1 || kind > 4) throw new PoolFrameDecodeError(`unknown pool frame kind ${kind}`)
      frames.push({
        kind: kind as PoolFrameKind,
        baseSequence: view.getBigUint64(offset + 5, true),
        sequence: view.getBigUint64(offset + 13, true),
        sendTsUs: view.getBigUint64(offset + 21, true),
        payload: this.buffer.slice(offset + 4 + POOL_FRAME_FIXED_BYTES, offset + 4 + size)
      })
      offset += 4 + size
    }
    if (offset > 0) {
      this.buffer.copyWithin(0, offset, this.length)
      this.length -= offset
    }
    return frames
  }

  /** Bytes of an incomplete frame still buffered. */
  get pending(): number {
    return this.length
  }
}
