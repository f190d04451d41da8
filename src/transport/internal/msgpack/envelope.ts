/**
 * The Dynamo `EventEnvelope` codec (PROTOCOL.md §3.1), with a fast path for the exact bytes
 * rmp-serde writes.
 */

import { fastPaths } from "./fastPaths.js"
import { be16, be32, fail, i32, type MsgpackReader, typeName } from "./reader.js"
import { fastHi, fastLo, fastUnsigned, KEY, scratch, u64HalvesOfBigInt } from "./routerEvents.js"
import { fixKey, K, MsgpackWriter } from "./writer.js"

// ---------------------------------------------------------------------------------------------
// EventEnvelope

export interface EventEnvelope {
  readonly topic: string
  readonly publisherId: bigint
  readonly sequence: number
  readonly publishedAtMs: number
  readonly payload: Uint8Array
}

/** A decoded envelope pointing into its buffer: the payload is `payloadBuffer[payloadStart, payloadEnd)`. */
export interface EnvelopeView {
  readonly topicStart: number
  readonly topicLength: number
  readonly publisherHi: number
  readonly publisherLo: number
  readonly payloadBuffer: Uint8Array
  readonly payloadStart: number
  readonly payloadEnd: number
}

const ENVELOPE_KEYS = K("topic", "publisher_id", "sequence", "published_at", "payload")

// Fast-path key matchers, one per key and written out on purpose: decode hot path, the same form
// as routerEvents.ts's (see transport/msgpack.ts).
const ENV_TOPIC = Uint8Array.of(0x85, ...fixKey("topic"))
const ENV_TOPIC_0 = i32(ENV_TOPIC, 0)
const ENV_TOPIC_3 = i32(ENV_TOPIC, 3)
const atEnvTopic = (b: Uint8Array, p: number): boolean =>
  ((i32(b, p) ^ ENV_TOPIC_0) | (i32(b, p + 3) ^ ENV_TOPIC_3)) === 0
const ENV_PUBLISHER = Uint8Array.of(...fixKey("publisher_id"))
const ENV_PUBLISHER_0 = i32(ENV_PUBLISHER, 0)
const ENV_PUBLISHER_4 = i32(ENV_PUBLISHER, 4)
const ENV_PUBLISHER_8 = i32(ENV_PUBLISHER, 8)
const ENV_PUBLISHER_9 = i32(ENV_PUBLISHER, 9)
const atEnvPublisher = (b: Uint8Array, p: number): boolean =>
  ((i32(b, p) ^ ENV_PUBLISHER_0) |
    (i32(b, p + 4) ^ ENV_PUBLISHER_4) |
    (i32(b, p + 8) ^ ENV_PUBLISHER_8) |
    (i32(b, p + 9) ^ ENV_PUBLISHER_9)) ===
  0
const ENV_SEQUENCE = Uint8Array.of(...fixKey("sequence"))
const ENV_SEQUENCE_0 = i32(ENV_SEQUENCE, 0)
const ENV_SEQUENCE_4 = i32(ENV_SEQUENCE, 4)
const ENV_SEQUENCE_5 = i32(ENV_SEQUENCE, 5)
const atEnvSequence = (b: Uint8Array, p: number): boolean =>
  ((i32(b, p) ^ ENV_SEQUENCE_0) | (i32(b, p + 4) ^ ENV_SEQUENCE_4) | (i32(b, p + 5) ^ ENV_SEQUENCE_5)) === 0
const ENV_PUBLISHED = Uint8Array.of(...fixKey("published_at"))
const ENV_PUBLISHED_0 = i32(ENV_PUBLISHED, 0)
const ENV_PUBLISHED_4 = i32(ENV_PUBLISHED, 4)
const ENV_PUBLISHED_8 = i32(ENV_PUBLISHED, 8)
const ENV_PUBLISHED_9 = i32(ENV_PUBLISHED, 9)
const atEnvPublished = (b: Uint8Array, p: number): boolean =>
  ((i32(b, p) ^ ENV_PUBLISHED_0) |
    (i32(b, p + 4) ^ ENV_PUBLISHED_4) |
    (i32(b, p + 8) ^ ENV_PUBLISHED_8) |
    (i32(b, p + 9) ^ ENV_PUBLISHED_9)) ===
  0
const ENV_PAYLOAD = Uint8Array.of(...fixKey("payload"))
const ENV_PAYLOAD_0 = i32(ENV_PAYLOAD, 0)
const ENV_PAYLOAD_4 = i32(ENV_PAYLOAD, 4)
const atEnvPayload = (b: Uint8Array, p: number): boolean =>
  ((i32(b, p) ^ ENV_PAYLOAD_0) | (i32(b, p + 4) ^ ENV_PAYLOAD_4)) === 0

/**
 * An envelope exactly as Dynamo writes it, `{topic, publisher_id, sequence, published_at,
 * payload: bin}` with a fixstr or str8 topic: its view, or undefined (nothing consumed).
 */
const readEnvelopeFast = (r: MsgpackReader): EnvelopeView | undefined => {
  const b = r.buf
  const end = r.end
  let p = r.pos
  if (p + ENV_TOPIC.length + 2 > end || !atEnvTopic(b, p)) return undefined
  p += ENV_TOPIC.length
  const header = b[p]!
  let topicLength: number
  if ((header & 0xe0) === 0xa0) {
    topicLength = header & 0x1f
    p += 1
  } else if (header === 0xd9) {
    topicLength = b[p + 1]!
    p += 2
  } else return undefined
  const topicStart = p
  p += topicLength
  // The keys after the topic, their integers at their widest and a bin32 header.
  if (
    p +
      ENV_PUBLISHER.length +
      9 +
      ENV_SEQUENCE.length +
      9 +
      ENV_PUBLISHED.length +
      9 +
      ENV_PAYLOAD.length +
      5 >
      end ||
    !atEnvPublisher(b, p)
  )
    return undefined
  p = fastUnsigned(b, p + ENV_PUBLISHER.length, end)
  if (p < 0 || !atEnvSequence(b, p)) return undefined
  const publisherHi = fastHi
  const publisherLo = fastLo
  p = fastUnsigned(b, p + ENV_SEQUENCE.length, end)
  if (p < 0 || !atEnvPublished(b, p)) return undefined
  p = fastUnsigned(b, p + ENV_PUBLISHED.length, end)
  if (p < 0 || !atEnvPayload(b, p)) return undefined
  p += ENV_PAYLOAD.length
  const bin = b[p]!
  let length: number
  if (bin === 0xc4) {
    length = b[p + 1]!
    p += 2
  } else if (bin === 0xc5) {
    length = be16(b, p + 1)
    p += 3
  } else if (bin === 0xc6) {
    length = be32(b, p + 1)
    p += 5
  } else return undefined
  if (p + length > end) return undefined
  r.pos = p + length
  fastPaths.hits.envelopes++
  return {
    topicStart,
    topicLength,
    publisherHi,
    publisherLo,
    payloadBuffer: b,
    payloadStart: p,
    payloadEnd: p + length
  }
}

/** Reads an `EventEnvelope` map (or its positional form); throws `MsgpackDecodeError`. */
export const readEnvelope = (r: MsgpackReader): EnvelopeView => {
  if (fastPaths.enabled) {
    const view = readEnvelopeFast(r)
    if (view !== undefined) return view
  }
  return readEnvelopeGeneral(r)
}

const readEnvelopeGeneral = (r: MsgpackReader): EnvelopeView => {
  let topicStart = -1
  let topicLength = 0
  let sawPublisher = false
  let payloadBuffer: Uint8Array | undefined
  let payloadStart = 0
  let payloadEnd = 0
  const readTopic = (): void => {
    const n = r.tryStrHeader()
    if (n < 0) fail(`envelope topic: expected a string, got ${typeName(r.peek("envelope topic"))}`)
    topicStart = r.pos
    topicLength = n
    r.pos += n
  }
  const readPayload = (): void => {
    const n = r.tryBinHeader()
    if (n >= 0) {
      payloadBuffer = r.buf
      payloadStart = r.pos
      payloadEnd = r.pos + n
      r.pos += n
      return
    }
    // A Vec<u8> without serde_bytes is an array of byte values: it has to be copied out.
    payloadBuffer = r.bin("envelope payload")
    payloadStart = 0
    payloadEnd = payloadBuffer.length
  }
  const entries = r.tryMap()
  if (entries >= 0) {
    for (let e = 0; e < entries; e++) {
      switch (r.key(ENVELOPE_KEYS)) {
        case 0:
          readTopic()
          break
        case 1:
          r.u64(scratch, 0, "envelope publisher_id")
          sawPublisher = true
          break
        case 4:
          readPayload()
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
  } else {
    const len = r.array("envelope")
    if (len < 5) fail("envelope: expected {topic, publisher_id, sequence, published_at, payload}")
    readTopic()
    r.u64(scratch, 0, "envelope publisher_id")
    sawPublisher = true
    r.skip()
    r.skip()
    readPayload()
    for (let e = 5; e < len; e++) r.skip()
  }
  if (topicStart < 0) fail("envelope: missing topic")
  if (!sawPublisher) fail("envelope: missing publisher_id")
  if (payloadBuffer === undefined) return fail("envelope: missing payload")
  return {
    topicStart,
    topicLength,
    publisherHi: scratch[0]!,
    publisherLo: scratch[1]!,
    payloadBuffer,
    payloadStart,
    payloadEnd
  }
}

/** Writes an `EventEnvelope` as rmp-serde `to_vec_named` does. */
export const writeEnvelope = (w: MsgpackWriter, envelope: EventEnvelope): void => {
  const [hi, lo] = u64HalvesOfBigInt(envelope.publisherId)
  w.map(5)
    .raw(KEY.topic)
    .str(envelope.topic)
    .raw(KEY.publisher_id)
    .u64(hi, lo)
    .raw(KEY.sequence)
    .int(envelope.sequence)
    .raw(KEY.published_at)
    .int(envelope.publishedAtMs)
    .raw(KEY.payload)
    .bin(envelope.payload)
}

export const encodeEnvelope = (envelope: EventEnvelope): Uint8Array => {
  const w = new MsgpackWriter(64 + envelope.payload.length)
  writeEnvelope(w, envelope)
  return w.finish()
}
