import fc from "fast-check"
import { describe, expect, it } from "vitest"
import { clearedEvent, removedEvent, storedEvent } from "../../src/protocol/Events.js"
import { encodeDynamoMessage, frameEnvelope, makeDynamoDecoder } from "../../src/transport/DynamoZmq.js"
import { encodeEnvelope, encodeRouterEvents } from "../../src/transport/msgpack.js"
import type { IngestMessage, MalformedReason } from "../../src/transport/ZmqSocket.js"
import { plain, routerEventArb } from "./fixtures.js"

const TOPIC = "kv-events"
const events = [
  storedEvent(7, 1, 1, [1n, 2n, 2n ** 64n - 1n]),
  removedEvent(7, 1, 2, [1n]),
  clearedEvent(7, 1, 3)
]
const message = (overrides: Partial<Parameters<typeof encodeDynamoMessage>[0]> = {}) =>
  encodeDynamoMessage({
    topic: TOPIC,
    publisherId: 123456789n,
    sequence: 5,
    publishedAtMs: 1,
    events,
    ...overrides
  })

const expectMalformed = (result: IngestMessage, reason: MalformedReason, pattern?: RegExp) => {
  expect(result._tag).toBe("Malformed")
  if (result._tag !== "Malformed") return
  expect(result.reason).toBe(reason)
  if (pattern !== undefined) expect(result.message).toMatch(pattern)
}

describe("Dynamo frame codec", () => {
  it("decodes a message into its publisher's batch", () => {
    const decode = makeDynamoDecoder(TOPIC)
    const result = decode(message())
    expect(result._tag).toBe("Batch")
    if (result._tag !== "Batch") return
    expect(result.publisherId).toBe(123456789n)
    expect(result.sequence).toBe(5)
    expect(result.blocks).toBe(4)
    expect(plain(result.events)).toEqual(plain(events))
  })

  it("round-trips random batches and full-width publisher ids", () => {
    const decode = makeDynamoDecoder(TOPIC)
    fc.assert(
      fc.property(
        fc.array(routerEventArb, { maxLength: 6 }),
        fc.bigInt({ min: 0n, max: 2n ** 64n - 1n }),
        fc.nat(),
        (batch, publisherId, sequence) => {
          const result = decode(message({ events: batch, publisherId, sequence }))
          expect(result._tag === "Batch" && result.publisherId).toBe(publisherId)
          expect(result._tag === "Batch" && plain(result.events)).toEqual(plain(batch))
        }
      ),
      { numRuns: 200 }
    )
  })

  it("counts every malformed shape with its reason", () => {
    const decode = makeDynamoDecoder(TOPIC)
    const good = message()
    expectMalformed(decode(good.slice(0, 3)), "frame-count", /expected 4 frames, got 3/)
    expectMalformed(decode([...good, Buffer.alloc(1)]), "frame-count", /got 5/)
    expectMalformed(decode([]), "frame-count")
    expectMalformed(
      decode([good[0], good[1].subarray(0, 7), good[2], good[3]]),
      "publisher-id-width",
      /7 bytes/
    )
    expectMalformed(decode([good[0], good[1], Buffer.alloc(9), good[3]]), "sequence-width", /9 bytes/)
    expectMalformed(decode([good[0], good[1], good[2], Buffer.from([1, 0, 0])]), "frame-header", /shorter/)
    const version = Buffer.from(good[3])
    version[0] = 2
    expectMalformed(decode([good[0], good[1], good[2], version]), "frame-version", /version 2/)
    expectMalformed(
      decode([good[0], good[1], good[2], good[3].subarray(0, good[3].length - 1)]),
      "frame-length"
    )
    expectMalformed(decode([good[0], good[1], good[2], frameEnvelope(Uint8Array.of(0xc1, 0x00))]), "envelope")
    expectMalformed(decode([good[0], good[1], good[2], frameEnvelope(Uint8Array.of(0x81, 0xa5))]), "envelope")
    const garbagePayload = encodeEnvelope({
      topic: TOPIC,
      publisherId: 9n,
      sequence: 0,
      publishedAtMs: 0,
      payload: Uint8Array.of(0x92, 0x01)
    })
    const payloadResult = decode([good[0], good[1], good[2], frameEnvelope(garbagePayload)])
    expectMalformed(payloadResult, "payload", /undecodable payload/)
    // The envelope was readable: the drop is attributed to its publisher.
    expect(payloadResult._tag === "Malformed" && payloadResult.publisherId).toBe(9n)
    const otherTopic = encodeDynamoMessage({
      topic: "kv-events-other",
      publisherId: 1n,
      sequence: 0,
      publishedAtMs: 0,
      events
    })
    expectMalformed(decode(otherTopic), "topic", /kv-events-other/)
  })

  it("ignores bytes after the declared envelope length, as Dynamo's frame decoder does", () => {
    const good = message()
    const padded = Buffer.concat([good[3], Buffer.from([0xde, 0xad])])
    expect(makeDynamoDecoder(TOPIC)([good[0], good[1], good[2], padded])._tag).toBe("Batch")
  })

  it("decodes payloads written in the older variant-index forms", () => {
    const decode = makeDynamoDecoder(TOPIC)
    for (const variants of ["index-map", "index-array"] as const) {
      const result = decode(
        encodeDynamoMessage(
          { topic: TOPIC, publisherId: 1n, sequence: 0, publishedAtMs: 0, events },
          { variants }
        )
      )
      expect(result._tag === "Batch" && plain(result.events)).toEqual(plain(events))
    }
  })

  it("accepts an empty batch", () => {
    const result = makeDynamoDecoder(TOPIC)(message({ events: [] }))
    expect(result._tag === "Batch" && result.events).toEqual([])
  })

  it("never throws on garbage frames", () => {
    const decode = makeDynamoDecoder(TOPIC)
    const frame = fc.uint8Array({ maxLength: 64 }).map((bytes) => Buffer.from(bytes))
    fc.assert(
      fc.property(fc.array(frame, { maxLength: 6 }), (frames) => {
        expect(["Batch", "Malformed"]).toContain(decode(frames)._tag)
      }),
      { numRuns: 3000 }
    )
    // Well-formed headers around random envelopes reach the envelope and payload decoders.
    fc.assert(
      fc.property(fc.uint8Array({ maxLength: 200 }), fc.boolean(), (bytes, wrap) => {
        const envelope = wrap
          ? encodeEnvelope({ topic: TOPIC, publisherId: 3n, sequence: 0, publishedAtMs: 0, payload: bytes })
          : bytes
        const good = message()
        expect(["Batch", "Malformed"]).toContain(
          decode([good[0], good[1], good[2], frameEnvelope(envelope)])._tag
        )
      }),
      { numRuns: 3000 }
    )
    fc.assert(
      fc.property(
        fc.array(fc.tuple(fc.nat(), fc.integer({ min: 0, max: 255 })), { maxLength: 8 }),
        (flips) => {
          const good = message()
          const frame = Buffer.from(good[3])
          for (const [at, value] of flips) frame[at % frame.length] = value
          expect(["Batch", "Malformed"]).toContain(decode([good[0], good[1], good[2], frame])._tag)
        }
      ),
      { numRuns: 3000 }
    )
  })

  it("keeps the payload codec byte-compatible with the envelope's bin", () => {
    const frames = message()
    const envelopeBytes = frames[3].subarray(5)
    expect(envelopeBytes.includes(Buffer.from(encodeRouterEvents(events)))).toBe(true)
  })
})
