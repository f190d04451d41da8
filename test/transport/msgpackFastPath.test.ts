/**
 * The decoder's fast paths (exact-shape readers for the envelope, the Stored event and its
 * blocks) against the general readers alone: on random messages, valid and corrupted, both give
 * the same events or the same error text.
 */

import fc from "fast-check"
import { afterEach, describe, expect, it } from "vitest"
import { hashPairs } from "../../src/ckf/u64.js"
import type { RouterEvent } from "../../src/protocol/Events.js"
import { encodeDynamoMessage, makeDynamoDecoder } from "../../src/transport/DynamoZmq.js"
import { decoderFastPathHits, setDecoderFastPaths } from "../../src/transport/internal/msgpack/fastPaths.js"
import { decodeRouterEvents, encodeRouterEvents, fixKey } from "../../src/transport/msgpack.js"
import type { IngestMessage } from "../../src/transport/ZmqSocket.js"
import { hashArb, plain, routerEventArb, u64Arb } from "./fixtures.js"

const TOPIC = "kv-events"

/** Full-width hashes mostly (the shape Dynamo writes), small and edge values sometimes. */
const dynamoHashArb = fc.oneof(
  { arbitrary: fc.bigInt({ min: 2n ** 32n, max: 2n ** 64n - 1n }), weight: 6 },
  hashArb
)

/** A device-tier Stored event as Dynamo sends it, blocks with distinct tokens hashes. */
const dynamoStoredArb: fc.Arbitrary<RouterEvent> = fc
  .record({
    workerId: fc.oneof(
      fc.nat({ max: 100_000 }).map(String),
      u64Arb.map((v) => v.toString())
    ),
    // Every integer width: fixint, u8, u16, u32.
    dpRank: fc.oneof(
      fc.constant(0),
      fc.nat({ max: 300 }),
      fc.nat({ max: 70_000 }),
      fc.nat({ max: 0xffff_ffff })
    ),
    eventId: fc.oneof(fc.nat({ max: 1000 }), fc.integer({ min: 0, max: Number.MAX_SAFE_INTEGER })),
    blocks: fc.array(fc.tuple(dynamoHashArb, dynamoHashArb), { maxLength: 20 }),
    parent: fc.option(dynamoHashArb, { nil: undefined }),
    start: fc.option(fc.oneof(fc.nat({ max: 300 }), fc.nat({ max: 70_000 }), fc.nat({ max: 0xffff_ffff })), {
      nil: undefined
    })
  })
  .map(({ workerId, dpRank, eventId, blocks, parent, start }) => ({
    workerId,
    dpRank,
    eventId,
    storageTier: "device" as const,
    data: {
      _tag: "Stored" as const,
      blockHashes: hashPairs(blocks.map(([block]) => block)),
      tokensHashes: hashPairs(blocks.map(([, tokens]) => tokens)),
      parentHash: parent === undefined ? undefined : hashPairs([parent]),
      startPosition: start
    }
  }))

const batchArb = fc.array(fc.oneof({ arbitrary: dynamoStoredArb, weight: 4 }, routerEventArb), {
  maxLength: 5
})

const messageArb = fc
  .record({ events: batchArb, publisherId: u64Arb, sequence: fc.nat(), topic: fc.constantFrom(TOPIC, "kv") })
  .map(({ events, publisherId, sequence, topic }) =>
    encodeDynamoMessage({ topic, publisherId, sequence, publishedAtMs: 1_700_000_000_000, events })
  )

interface Edits {
  readonly flips: ReadonlyArray<readonly [number, number]>
  readonly cut: number | undefined
}

/** Byte edits of a frame: overwrites at random positions and a truncation point. */
const editsArb: fc.Arbitrary<Edits> = fc.record({
  flips: fc.array(fc.tuple(fc.nat(), fc.integer({ min: 0, max: 255 })), { minLength: 1, maxLength: 4 }),
  cut: fc.option(fc.nat(), { nil: undefined })
})

const edited = (frame: Buffer, edits: Edits): Buffer => {
  const out = Buffer.from(frame)
  // Past the 5-byte frame header, where the envelope and payload readers look.
  for (const [at, value] of edits.flips) out[5 + (at % Math.max(1, out.length - 5))] = value
  return edits.cut === undefined ? out : out.subarray(0, 5 + (edits.cut % Math.max(1, out.length - 5)))
}

/** A decode result in comparable form (hash pairs as bigints). */
const comparable = (result: IngestMessage): unknown =>
  result._tag === "Batch" ? { ...result, events: plain(result.events) } : result

/** Big-endian bytes of the low `width` bytes of `value`. */
const beBytes = (value: bigint, width: number): Array<number> =>
  Array.from({ length: width }, (_, i) =>
    Number((BigInt.asUintN(64, value) >> BigInt(8 * (width - 1 - i))) & 0xffn)
  )

/**
 * One integer field's bytes, in any encoding a peer might write: the smallest unsigned form, a
 * wider or signed form (negative values too), a negative fixint, or a value of another type.
 */
const rawIntArb: fc.Arbitrary<Array<number>> = fc.oneof(
  { arbitrary: u64Arb.map((v) => smallest(v)), weight: 4 },
  fc.bigInt({ min: 0n, max: 300n }).map((v) => smallest(v)),
  fc
    .tuple(
      fc.constantFrom([0xcc, 1], [0xcd, 2], [0xce, 4], [0xcf, 8], [0xd0, 1], [0xd1, 2], [0xd2, 4], [0xd3, 8]),
      fc.oneof(u64Arb, fc.constantFrom(2n ** 32n, 2n ** 53n, 2n ** 53n + 1n, 2n ** 63n, 2n ** 64n - 1n))
    )
    .map(([[tag, width], v]) => [tag!, ...beBytes(v, width!)]),
  fc.integer({ min: 0xe0, max: 0xff }).map((b) => [b]),
  fc.constantFrom([0xc0], [0xc3], [0xa1, 0x61], [0x90], [0xcf, 1, 2]).map((bytes) => [...bytes])
)

const smallest = (v: bigint): Array<number> =>
  v < 0x80n
    ? [Number(v)]
    : v < 0x100n
      ? [0xcc, Number(v)]
      : v < 0x10000n
        ? [0xcd, ...beBytes(v, 2)]
        : v < 2n ** 32n
          ? [0xce, ...beBytes(v, 4)]
          : [0xcf, ...beBytes(v, 8)]

const fullWidthArb = fc.bigInt({ min: 2n ** 32n, max: 2n ** 64n - 1n })

const key = (name: string): Array<number> => [...fixKey(name)]

/** A nil or a raw integer (optional fields). */
const rawOptionalArb = fc.oneof(fc.constant([0xc0]), rawIntArb)

interface RawStored {
  readonly worker: ReadonlyArray<number>
  readonly tier: string
  readonly eventId: ReadonlyArray<number>
  readonly parent: ReadonlyArray<number>
  readonly start: ReadonlyArray<number>
  readonly blocks: ReadonlyArray<{
    readonly block: ReadonlyArray<number>
    readonly tokens: ReadonlyArray<number>
    readonly extra: ReadonlyArray<number>
  }>
  readonly dpRank: ReadonlyArray<number>
}

/** The bytes of a Stored event in Dynamo's field order, each integer field given as raw bytes. */
const rawStored = ({ worker, tier, eventId, parent, start, blocks, dpRank }: RawStored): Array<number> => [
  0x83,
  ...key("worker_id"),
  ...worker,
  ...key("storage_tier"),
  ...key(tier),
  ...key("event"),
  0x83,
  ...key("event_id"),
  ...eventId,
  ...key("data"),
  0x81,
  ...key("stored"),
  0x83,
  ...key("parent_hash"),
  ...parent,
  ...key("start_position"),
  ...start,
  ...key("blocks"),
  ...(blocks.length < 16 ? [0x90 | blocks.length] : [0xdc, 0, blocks.length]),
  ...blocks.flatMap(({ block, tokens, extra }) => [
    0x83,
    ...key("block_hash"),
    ...block,
    ...key("tokens_hash"),
    ...tokens,
    ...key("mm_extra_info"),
    ...extra
  ]),
  ...key("dp_rank"),
  ...dpRank
]

/**
 * A Stored event in Dynamo's field order with every integer field in a raw encoding: both paths
 * must accept the same ones (the exact shape through the fast path) and reject the rest alike.
 */
const rawStoredArb: fc.Arbitrary<Array<number>> = fc
  .record({
    worker: rawIntArb,
    tier: fc.constantFrom("device", "device", "device", "disk", "devicf"),
    eventId: rawIntArb,
    parent: rawOptionalArb,
    start: rawOptionalArb,
    // Mostly blocks in the exact shape (full-width hashes, nil extra info), so that a raw value
    // elsewhere meets the fast path rather than a block that already sent it to the general reader.
    blocks: fc.array(
      fc.oneof(
        {
          arbitrary: fc.tuple(fullWidthArb, fullWidthArb).map(([block, tokens]) => ({
            block: [0xcf, ...beBytes(block, 8)],
            tokens: [0xcf, ...beBytes(tokens, 8)],
            extra: [0xc0]
          })),
          weight: 8
        },
        fc.record({
          block: rawIntArb,
          tokens: rawIntArb,
          extra: fc.constantFrom([0xc0], [0xc0], [0x80], [0x01]).map((bytes) => [...bytes])
        })
      ),
      { maxLength: 18 }
    ),
    dpRank: rawIntArb
  })
  .map(rawStored)

/** Decodes with the fast paths on and with the general readers alone. */
const bothWays = <A>(decode: () => A): { fast: A; general: A } => {
  setDecoderFastPaths(true)
  const fast = decode()
  setDecoderFastPaths(false)
  const general = decode()
  setDecoderFastPaths(true)
  return { fast, general }
}

afterEach(() => setDecoderFastPaths(true))

describe("decoder fast paths", () => {
  it("decode random Dynamo messages to what the general readers decode, and to what was sent", () => {
    const decode = makeDynamoDecoder(TOPIC)
    fc.assert(
      fc.property(messageArb, (frames) => {
        const { fast, general } = bothWays(() => comparable(decode(frames)))
        expect(fast).toEqual(general)
      }),
      { numRuns: 400 }
    )
    fc.assert(
      fc.property(batchArb, (events) => {
        const frames = encodeDynamoMessage({
          topic: TOPIC,
          publisherId: 7n,
          sequence: 1,
          publishedAtMs: 0,
          events
        })
        const result = decode(frames)
        expect(result._tag === "Batch" && plain(result.events)).toEqual(plain(events))
      }),
      { numRuns: 200 }
    )
  })

  it("reject corrupted and truncated messages with the general readers' reason and text", () => {
    const decode = makeDynamoDecoder(TOPIC)
    let rejected = 0
    fc.assert(
      fc.property(messageArb, editsArb, (frames, edits) => {
        const broken = [frames[0], frames[1], frames[2], edited(frames[3], edits)]
        const { fast, general } = bothWays(() => comparable(decode(broken)))
        expect(fast).toEqual(general)
        if ((fast as IngestMessage)._tag === "Malformed") rejected++
      }),
      { numRuns: 1500 }
    )
    // The edits reach the readers: most corrupted messages are rejected, not all decoded.
    expect(rejected).toBeGreaterThan(300)
  })

  it("agree on bare payloads cut anywhere and with bytes overwritten", () => {
    fc.assert(
      fc.property(
        batchArb,
        fc.nat(),
        fc.nat(),
        fc.integer({ min: 0, max: 255 }),
        (events, cut, at, value) => {
          const payload = encodeRouterEvents(events)
          const bytes = Uint8Array.from(payload)
          bytes[at % bytes.length] = value
          for (const input of [bytes, payload.subarray(0, cut % (payload.length + 1))]) {
            const { fast, general } = bothWays(() => {
              const result = decodeRouterEvents(input)
              return result.ok ? { ok: true, events: plain(result.value) } : result
            })
            expect(fast).toEqual(general)
          }
        }
      ),
      { numRuns: 1500 }
    )
  })

  it("agree field by field on Stored events whose integers take every encoding", () => {
    // Cut anywhere, or within the last 10 bytes (the last field's value).
    const cutArb = fc.oneof(fc.nat(), fc.integer({ min: -10, max: -1 }))
    fc.assert(
      fc.property(fc.array(rawStoredArb, { minLength: 1, maxLength: 3 }), cutArb, (events, cut) => {
        const payload = Uint8Array.from([0x90 | events.length, ...events.flat()])
        const cutAt = cut < 0 ? Math.max(0, payload.length + cut) : cut % (payload.length + 1)
        for (const to of [payload.length, cutAt]) {
          const { fast, general } = bothWays(() => {
            const result = decodeRouterEvents(payload, 0, to)
            return result.ok ? { ok: true, events: plain(result.value) } : result
          })
          expect(fast).toEqual(general)
        }
      }),
      { numRuns: 3000 }
    )
  })

  it("take the fast paths for the shape Dynamo writes, and only the general readers when told", () => {
    const events = fc.sample(dynamoStoredArb, { numRuns: 50, seed: 7 }).map((event) => {
      const data = event.data as { blockHashes: Uint32Array; tokensHashes: Uint32Array }
      // Full-width hashes throughout: every block in the exact shape.
      for (const pairs of [data.blockHashes, data.tokensHashes])
        for (let i = 0; i < pairs.length; i += 2) pairs[i] |= 1
      return event
    })
    const frames = encodeDynamoMessage({
      topic: TOPIC,
      publisherId: 2n ** 63n,
      sequence: 3,
      publishedAtMs: 0,
      events
    })
    const decode = makeDynamoDecoder(TOPIC)
    const before = { ...decoderFastPathHits }
    const result = decode(frames)
    expect(result._tag === "Batch" && plain(result.events)).toEqual(plain(events))
    expect(decoderFastPathHits.envelopes - before.envelopes).toBe(1)
    expect(decoderFastPathHits.events - before.events).toBe(events.length)
    setDecoderFastPaths(false)
    const general = decode(frames)
    expect(decoderFastPathHits.envelopes - before.envelopes).toBe(1)
    expect(decoderFastPathHits.events - before.events).toBe(events.length)
    expect(comparable(general)).toEqual(comparable(result))
  })

  it("agree at the edges: event_id around 2^53, a 64-bit dp_rank cut short", () => {
    const u64 = (v: bigint) => [0xcf, ...beBytes(v, 8)]
    const event = (eventId: bigint, dpRank: Array<number>) =>
      rawStored({
        worker: [0x07],
        tier: "device",
        eventId: u64(eventId),
        parent: [0xc0],
        start: [0xc0],
        blocks: [{ block: u64(2n ** 40n), tokens: u64(2n ** 41n), extra: [0xc0] }],
        dpRank
      })
    const decodeBoth = (bytes: Array<number>, cut = 0) => {
      const payload = Uint8Array.from([0x91, ...bytes])
      return bothWays(() => {
        const result = decodeRouterEvents(payload, 0, payload.length - cut)
        return result.ok ? { ok: true, events: plain(result.value) } : result
      })
    }
    const atLimit = decodeBoth(event(2n ** 53n, [0x00]))
    expect(atLimit.fast).toEqual(atLimit.general)
    expect(atLimit.fast).toMatchObject({ ok: true, events: [{ eventId: 2 ** 53 }] })
    for (const over of [2n ** 53n + 1n, 2n ** 53n + 2n ** 32n, 2n ** 64n - 1n]) {
      const { fast, general } = decodeBoth(event(over, [0x00]))
      expect(fast).toEqual(general)
      expect(fast).toEqual({ ok: false, message: `event_id: ${over} exceeds ${2 ** 53}` })
    }
    // The value's last byte is past the end of the range (but still in the buffer).
    const cut = decodeBoth(event(1n, u64(5n)), 1)
    expect(cut.fast).toEqual(cut.general)
    expect(cut.fast).toEqual({ ok: false, message: "dp_rank: truncated (needs 9 more bytes, 8 left)" })
    expect(decodeBoth(event(1n, u64(5n))).fast).toMatchObject({ ok: true, events: [{ dpRank: 5 }] })
  })
})
