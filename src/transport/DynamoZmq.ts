/**
 * The Dynamo event plane over ZeroMQ (PROTOCOL.md §3 `dynamo-zmq`, recovery-events.md §6.1):
 * 4 frames `[topic, publisher_id u64 BE, sequence u64 BE, frame]`,
 * `frame = [0x01][u32 BE length][EventEnvelope]`, the envelope's `payload` a `Vec<RouterEvent>`.
 *
 * Every message that does not match is dropped with a reason (never thrown): wrong frame count,
 * id or sequence frames not 8 bytes wide, a short header, another version, a truncated length,
 * an undecodable envelope or payload, or an envelope topic other than the subscribed one.
 */

import type { Effect, Scope } from "effect"
import type { RouterEvent } from "../protocol/Events.js"
import { readEnvelope, writeEnvelope } from "./internal/msgpack/envelope.js"
import { readRouterEvents } from "./internal/msgpack/routerEvents.js"
import { encodeRouterEvents, MsgpackReader, MsgpackWriter, type RouterEventEncodeOptions } from "./msgpack.js"
import {
  blockCount,
  type Delivered,
  type IngestMessage,
  type MalformedReason,
  type ReceiveLoop,
  subscribe,
  u64Frame,
  u64FrameOf,
  type ZmqError
} from "./ZmqSocket.js"

const DYNAMO_FRAME_VERSION = 0x01
const DYNAMO_FRAME_HEADER_BYTES = 5
/** The topic Dynamo publishes KV events under (`KV_EVENT_SUBJECT`). */
export const KV_EVENT_TOPIC = "kv-events"

interface DynamoMessage {
  readonly topic: string
  readonly publisherId: bigint
  readonly sequence: number
  readonly publishedAtMs: number
  readonly events: ReadonlyArray<RouterEvent>
}

/** The 4 frames of one message, exactly as Dynamo's ZMQ transport sends them. */
export const encodeDynamoMessage = (
  message: DynamoMessage,
  options?: RouterEventEncodeOptions
): [Buffer, Buffer, Buffer, Buffer] => {
  const payload = encodeRouterEvents(message.events, options)
  const w = new MsgpackWriter(payload.length + 96)
  const header = w.reserve(DYNAMO_FRAME_HEADER_BYTES)
  writeEnvelope(w, {
    topic: message.topic,
    publisherId: message.publisherId,
    sequence: message.sequence,
    publishedAtMs: message.publishedAtMs,
    payload
  })
  w.setUint8At(header, DYNAMO_FRAME_VERSION)
  w.setUint32At(header + 1, w.pos - DYNAMO_FRAME_HEADER_BYTES)
  const id = BigInt.asUintN(64, message.publisherId)
  const frame = w.finish()
  return [
    Buffer.from(message.topic, "utf8"),
    u64Frame(Number(id >> 32n), Number(id & 0xffff_ffffn)),
    u64FrameOf(message.sequence),
    Buffer.from(frame.buffer, frame.byteOffset, frame.byteLength)
  ]
}

/** Wraps an already encoded envelope in the 5-byte frame header. */
export const frameEnvelope = (envelope: Uint8Array): Buffer => {
  const out = Buffer.allocUnsafe(DYNAMO_FRAME_HEADER_BYTES + envelope.length)
  out[0] = DYNAMO_FRAME_VERSION
  out.writeUInt32BE(envelope.length, 1)
  out.set(envelope, DYNAMO_FRAME_HEADER_BYTES)
  return out
}

/**
 * Decodes one message for a subscriber of `topic`. Stateful only in a tiny publisher-id memo
 * (a BigInt per message is avoided while the same publisher keeps sending), so keep one decoder
 * per subscription.
 */
export const makeDynamoDecoder = (topic: string): ((frames: ReadonlyArray<Uint8Array>) => IngestMessage) => {
  const topicBytes = Buffer.from(topic, "utf8")
  let lastHi = -1
  let lastLo = -1
  let lastId = 0n
  const idOf = (hi: number, lo: number): bigint => {
    if (hi !== lastHi || lo !== lastLo) {
      lastId = (BigInt(hi) << 32n) | BigInt(lo)
      lastHi = hi
      lastLo = lo
    }
    return lastId
  }
  const malformed = (reason: MalformedReason, message: string, publisherId?: bigint): IngestMessage => ({
    _tag: "Malformed",
    reason,
    message,
    publisherId
  })
  return (frames) => {
    if (frames.length !== 4) return malformed("frame-count", `expected 4 frames, got ${frames.length}`)
    const idFrame = frames[1]!
    if (idFrame.length !== 8)
      return malformed("publisher-id-width", `publisher id frame is ${idFrame.length} bytes, expected 8`)
    const claimed = idOf(
      ((idFrame[0]! << 24) | (idFrame[1]! << 16) | (idFrame[2]! << 8) | idFrame[3]!) >>> 0,
      ((idFrame[4]! << 24) | (idFrame[5]! << 16) | (idFrame[6]! << 8) | idFrame[7]!) >>> 0
    )
    const seqFrame = frames[2]!
    if (seqFrame.length !== 8)
      return malformed("sequence-width", `sequence frame is ${seqFrame.length} bytes, expected 8`, claimed)
    const frame = frames[3]!
    if (frame.length < DYNAMO_FRAME_HEADER_BYTES)
      return malformed(
        "frame-header",
        `frame is ${frame.length} bytes, shorter than its 5-byte header`,
        claimed
      )
    if (frame[0] !== DYNAMO_FRAME_VERSION)
      return malformed(
        "frame-version",
        `frame version ${frame[0]}, expected ${DYNAMO_FRAME_VERSION}`,
        claimed
      )
    const length = ((frame[1]! << 24) | (frame[2]! << 16) | (frame[3]! << 8) | frame[4]!) >>> 0
    if (DYNAMO_FRAME_HEADER_BYTES + length > frame.length)
      return malformed(
        "frame-length",
        `frame declares ${length} envelope bytes, only ${frame.length - DYNAMO_FRAME_HEADER_BYTES} present`,
        claimed
      )
    let reader = new MsgpackReader(frame, DYNAMO_FRAME_HEADER_BYTES, DYNAMO_FRAME_HEADER_BYTES + length)
    let envelope: ReturnType<typeof readEnvelope>
    try {
      envelope = readEnvelope(reader)
    } catch (error) {
      return malformed("envelope", `undecodable envelope: ${(error as Error).message}`, claimed)
    }
    const publisherId = idOf(envelope.publisherHi, envelope.publisherLo)
    if (!topicMatches(frame, envelope.topicStart, envelope.topicLength, topicBytes))
      return malformed(
        "topic",
        `envelope topic ${JSON.stringify(Buffer.from(frame.subarray(envelope.topicStart, envelope.topicStart + envelope.topicLength)).toString("utf8"))} is not ${JSON.stringify(topic)}`,
        publisherId
      )
    reader = new MsgpackReader(envelope.payloadBuffer, envelope.payloadStart, envelope.payloadEnd)
    let events: Array<RouterEvent>
    try {
      events = readRouterEvents(reader)
    } catch (error) {
      return malformed("payload", `undecodable payload: ${(error as Error).message}`, publisherId)
    }
    // Byte arithmetic, not a DataView: constructing one costs more than the rest of this frame's checks.
    const seqHi = ((seqFrame[0]! << 24) | (seqFrame[1]! << 16) | (seqFrame[2]! << 8) | seqFrame[3]!) >>> 0
    const sequence =
      seqHi < 0x20_0000
        ? seqHi * 4294967296 +
          (((seqFrame[4]! << 24) | (seqFrame[5]! << 16) | (seqFrame[6]! << 8) | seqFrame[7]!) >>> 0)
        : -1
    return { _tag: "Batch", publisherId, sequence, events, blocks: blockCount(events), ignored: 0 }
  }
}

const topicMatches = (buf: Uint8Array, start: number, length: number, topic: Uint8Array): boolean => {
  if (length !== topic.length) return false
  for (let i = 0; i < length; i++) if (buf[start + i] !== topic[i]) return false
  return true
}

interface DynamoSubscriptionOptions {
  readonly endpoint: string
  readonly topic: string
  /** Every decoded or malformed message, in arrival order. */
  readonly deliver: (message: IngestMessage) => Delivered
  readonly onConnection?: (connected: boolean) => void
  readonly onConnectionError?: (error: string) => void
}

/** A SUB on one Dynamo publisher endpoint; batches carry the envelope's publisher id. */
export const subscribeDynamo = (
  options: DynamoSubscriptionOptions
): Effect.Effect<ReceiveLoop, ZmqError, Scope.Scope> =>
  subscribe({
    endpoint: options.endpoint,
    topic: options.topic,
    decode: makeDynamoDecoder(options.topic),
    deliver: options.deliver,
    ...(options.onConnection === undefined ? {} : { onConnection: options.onConnection }),
    ...(options.onConnectionError === undefined ? {} : { onConnectionError: options.onConnectionError })
  })
