/**
 * The relay client's stream validation against bytes made by the project's own encoders: CBI1
 * snapshots and deltas inside pool frames, terminal error frames, and the SSE catalog watch.
 */

import { Either } from "effect"
import fc from "fast-check"
import { describe, expect, it } from "vitest"
import { DEFAULT_SEED } from "../../src/ckf/addressing.js"
import { encodeCbi1Delta, encodeCbi1Snapshot, SNAPSHOT_CHUNK_BUCKETS } from "../../src/ckf/cbi1.js"
import {
  CacheSemanticsId,
  DcCkfFormatIdentity,
  DcId,
  IndexerDomainId,
  PoolId,
  ProducerIdentity,
  RoutingScopeId
} from "../../src/ckf/identity.js"
import {
  CatalogWatchEnded,
  PoolStreamFault,
  PoolStreamTerminated
} from "../../src/consumer/ConsumerErrors.js"
import { CatalogWatchReader, type PoolStreamEvent, PoolStreamReader } from "../../src/consumer/RelayClient.js"
import { encodeJsonText } from "../../src/protocol/Json.js"
import { type CatalogSnapshot, DcRelayIdentity } from "../../src/protocol/Model.js"
import {
  encodePoolFrame,
  FRAME_DELTA,
  FRAME_HEARTBEAT,
  FRAME_SNAPSHOT_CHUNK,
  FRAME_TERMINAL_ERROR,
  type PoolFrameKind
} from "../../src/protocol/PoolStream.js"
import { CatalogSnapshotJson } from "../../src/protocol/RelayApi.js"
import { sseEvent, sseHeartbeat } from "../../src/protocol/Sse.js"

const domain = new IndexerDomainId(
  new CacheSemanticsId(new Uint8Array(16).fill(1), "explicit"),
  new RoutingScopeId(new Uint8Array(16).fill(2), "explicit")
)

const producer = (bucketCount = 64, dc = 3n, seed = DEFAULT_SEED): ProducerIdentity =>
  new ProducerIdentity(new PoolId(domain, new DcId(dc)), 7n, 1n, new DcCkfFormatIdentity(seed, bucketCount))

const expectedOf = (p: ProducerIdentity) => ({ format: p.format, dcId: p.poolId.dcId.value })

const frame = (kind: PoolFrameKind, base: bigint, sequence: bigint, payload: Uint8Array): Uint8Array =>
  encodePoolFrame({ kind, baseSequence: base, sequence, sendTsUs: 1n, payload })

const randomWords = (buckets: number, seed: number): Uint32Array => {
  const words = new Uint32Array(2 * buckets)
  let x = seed | 1
  for (let i = 0; i < words.length; i++) {
    x ^= x << 13
    x ^= x >>> 17
    x ^= x << 5
    words[i] = i % 3 === 0 ? 0 : x >>> 0
  }
  return words
}

const snapshotFrames = (p: ProducerIdentity, sequence: bigint, words: Uint32Array): Array<Uint8Array> => {
  const chunks = encodeCbi1Snapshot(expectedOf(p), sequence, words)
  if (!Array.isArray(chunks)) throw chunks
  return chunks.map((chunk) => frame(FRAME_SNAPSHOT_CHUNK, sequence, sequence, chunk))
}

const deltaFrame = (p: ProducerIdentity, base: bigint, sequence: bigint, images: Uint32Array): Uint8Array => {
  const payload = encodeCbi1Delta(expectedOf(p), base, sequence, images)
  if (!(payload instanceof Uint8Array)) throw payload
  return frame(FRAME_DELTA, base, sequence, payload)
}

const terminalFrame = (sequence: bigint, reason: string, message: string): Uint8Array =>
  frame(
    FRAME_TERMINAL_ERROR,
    sequence,
    sequence,
    new TextEncoder().encode(JSON.stringify({ reason, message }))
  )

const events = (reader: PoolStreamReader, bytes: Uint8Array): Array<PoolStreamEvent> => {
  const out = reader.push(bytes)
  if (!Array.isArray(out)) throw out
  return out
}

const failure = (reader: PoolStreamReader, bytes: Uint8Array): PoolStreamFault | PoolStreamTerminated => {
  const out = reader.push(bytes)
  if (Array.isArray(out)) throw new Error(`expected a failure, got ${out.length} events`)
  return out
}

describe("PoolStreamReader", () => {
  it("assembles a snapshot, then yields contiguous deltas and heartbeats, for any split of the bytes", () => {
    const p = producer()
    const words = randomWords(64, 5)
    const images = new Uint32Array([3, 0xdead, 0xbeef, 9, 1, 2])
    const wire = Buffer.concat([
      ...snapshotFrames(p, 10n, words),
      deltaFrame(p, 10n, 11n, images),
      frame(FRAME_HEARTBEAT, 11n, 11n, new Uint8Array()),
      deltaFrame(p, 11n, 12n, new Uint32Array([63, 1, 1]))
    ])
    fc.assert(
      fc.property(fc.array(fc.integer({ min: 1, max: 200 }), { minLength: 1, maxLength: 20 }), (cuts) => {
        const reader = new PoolStreamReader(p)
        const out: Array<PoolStreamEvent> = []
        let offset = 0
        for (let i = 0; offset < wire.length; i++) {
          const size = cuts[i % cuts.length]!
          out.push(...events(reader, wire.subarray(offset, offset + size)))
          offset += size
        }
        expect(out.map((e) => e._tag)).toEqual(["Snapshot", "Delta", "Heartbeat", "Delta"])
        const snapshot = out[0] as Extract<PoolStreamEvent, { _tag: "Snapshot" }>
        expect(snapshot.sequence).toBe(10n)
        expect([...snapshot.words]).toEqual([...words])
        const delta = out[1] as Extract<PoolStreamEvent, { _tag: "Delta" }>
        expect([delta.baseSequence, delta.sequence]).toEqual([10n, 11n])
        expect([...delta.images]).toEqual([...images])
        expect(reader.lastSequence).toBe(12n)
      })
    )
  })

  it("assembles a multi-chunk snapshot only after its last chunk", () => {
    const p = producer(2 * SNAPSHOT_CHUNK_BUCKETS)
    const words = randomWords(2 * SNAPSHOT_CHUNK_BUCKETS, 9)
    const [first, second] = snapshotFrames(p, 4n, words)
    const reader = new PoolStreamReader(p)
    expect(events(reader, first!)).toEqual([])
    const done = events(reader, second!)
    expect(done).toHaveLength(1)
    expect(done[0]!._tag).toBe("Snapshot")
  })

  it("turns a terminal frame into PoolStreamTerminated with its reason", () => {
    const p = producer()
    const reader = new PoolStreamReader(p)
    events(reader, Buffer.concat(snapshotFrames(p, 1n, randomWords(64, 1))))
    const ended = failure(
      reader,
      terminalFrame(1n, "SUBSCRIBER_LAGGED", "lagged by 16 frames; subscribe again")
    )
    expect(ended).toBeInstanceOf(PoolStreamTerminated)
    expect(ended).toMatchObject({ reason: "SUBSCRIBER_LAGGED" })
    // Nothing is accepted after the end.
    expect(failure(reader, frame(FRAME_HEARTBEAT, 1n, 1n, new Uint8Array()))).toBeInstanceOf(PoolStreamFault)
  })

  it("keeps unknown terminal reasons typed and rejects malformed terminal payloads", () => {
    const reader = new PoolStreamReader(producer())
    expect(failure(reader, terminalFrame(0n, "SNAPSHOT_PROGRESS_TIMEOUT", "slow"))).toMatchObject({
      _tag: "PoolStreamTerminated",
      reason: "SNAPSHOT_PROGRESS_TIMEOUT"
    })
    const bad = new PoolStreamReader(producer())
    expect(failure(bad, frame(FRAME_TERMINAL_ERROR, 0n, 0n, new TextEncoder().encode("{")))).toMatchObject({
      _tag: "PoolStreamFault",
      kind: "FrameDecode"
    })
  })

  it("rejects frames of another producer: wrong DC id or wrong format", () => {
    const p = producer()
    const otherDc = new PoolStreamReader(p)
    const foreign = snapshotFrames(producer(64, 4n), 1n, randomWords(64, 2))[0]!
    expect(failure(otherDc, foreign)).toMatchObject({
      kind: "Cbi1",
      message: expect.stringMatching(/DcIdMismatch/)
    })

    const otherSeed = new PoolStreamReader(p)
    const reseeded = snapshotFrames(producer(64, 3n, 99n), 1n, randomWords(64, 2))[0]!
    expect(failure(otherSeed, reseeded)).toMatchObject({
      kind: "Cbi1",
      message: expect.stringMatching(/FormatMismatch/)
    })

    const otherSize = new PoolStreamReader(p)
    const resized = snapshotFrames(producer(128), 1n, randomWords(128, 2))[0]!
    expect(failure(otherSize, resized)).toMatchObject({ kind: "Cbi1" })
  })

  it("rejects sequences that are not a snapshot followed by contiguous deltas", () => {
    const p = producer()
    const snapshot = Buffer.concat(snapshotFrames(p, 5n, randomWords(64, 3)))
    const image = new Uint32Array([1, 1, 1])
    const cases: Array<[string, Uint8Array, string]> = [
      ["delta before snapshot", deltaFrame(p, 5n, 6n, image), "Order"],
      ["heartbeat before snapshot", frame(FRAME_HEARTBEAT, 0n, 0n, new Uint8Array()), "Order"],
      ["gap", Buffer.concat([snapshot, deltaFrame(p, 6n, 7n, image)]), "Sequence"],
      ["skip", Buffer.concat([snapshot, deltaFrame(p, 5n, 7n, image)]), "Sequence"],
      [
        "heartbeat off sequence",
        Buffer.concat([snapshot, frame(FRAME_HEARTBEAT, 4n, 4n, new Uint8Array())]),
        "Heartbeat"
      ],
      [
        "heartbeat with payload",
        Buffer.concat([snapshot, frame(FRAME_HEARTBEAT, 5n, 5n, new Uint8Array(1))]),
        "Heartbeat"
      ],
      ["chunk after snapshot", Buffer.concat([snapshot, snapshot]), "Order"]
    ]
    for (const [name, bytes, kind] of cases) {
      const reader = new PoolStreamReader(p)
      expect(failure(reader, bytes), name).toMatchObject({ _tag: "PoolStreamFault", kind })
    }
  })

  it("rejects a frame whose envelope sequence disagrees with its CBI1 epoch", () => {
    const p = producer()
    const chunk = encodeCbi1Snapshot(expectedOf(p), 8n, randomWords(64, 4))
    if (!Array.isArray(chunk)) throw chunk
    expect(failure(new PoolStreamReader(p), frame(FRAME_SNAPSHOT_CHUNK, 9n, 9n, chunk[0]!))).toMatchObject({
      kind: "Sequence"
    })
    expect(failure(new PoolStreamReader(p), frame(FRAME_SNAPSHOT_CHUNK, 8n, 9n, chunk[0]!))).toMatchObject({
      kind: "Sequence"
    })
    const reader = new PoolStreamReader(p)
    events(reader, Buffer.concat(snapshotFrames(p, 8n, randomWords(64, 4))))
    const payload = encodeCbi1Delta(expectedOf(p), 20n, 21n, new Uint32Array([1, 2, 3]))
    if (!(payload instanceof Uint8Array)) throw payload
    expect(failure(reader, frame(FRAME_DELTA, 8n, 9n, payload))).toMatchObject({ kind: "Sequence" })
  })

  it("reports a corrupted payload and a broken frame layer", () => {
    const p = producer()
    const bytes = snapshotFrames(p, 1n, randomWords(64, 6))[0]!
    bytes[bytes.length - 1] ^= 0xff
    expect(failure(new PoolStreamReader(p), bytes)).toMatchObject({
      kind: "Cbi1",
      message: expect.stringMatching(/Checksum/)
    })
    const junk = new Uint8Array(8)
    new DataView(junk.buffer).setUint32(0, 2, true)
    expect(failure(new PoolStreamReader(p), junk)).toMatchObject({ kind: "FrameDecode" })
  })

  it("calls the end of the body a fault", () => {
    const p = producer()
    const reader = new PoolStreamReader(p)
    const bytes = snapshotFrames(p, 1n, randomWords(64, 7))[0]!
    events(reader, bytes.subarray(0, 10))
    expect(reader.finish()).toMatchObject({
      kind: "Closed",
      message: expect.stringMatching(/incomplete frame/)
    })
  })
})

describe("CatalogWatchReader", () => {
  const relay = new DcRelayIdentity({ drtInstanceId: 1n, relayIncarnation: 2n })
  const catalogText = (revision: bigint): string => {
    const catalog: CatalogSnapshot = { relay, revision, pools: [] }
    return Either.getOrThrow(encodeJsonText(CatalogSnapshotJson)(catalog))
  }

  it("decodes catalog events and ignores heartbeat comments", () => {
    const reader = new CatalogWatchReader()
    const wire = Buffer.concat([
      sseEvent("catalog", catalogText(1n)),
      sseHeartbeat,
      sseEvent("catalog", catalogText(2n))
    ])
    const out = reader.push(wire)
    if (!Array.isArray(out)) throw out
    expect(out.map((c) => c.revision)).toEqual([1n, 2n])
    expect(out[0]!.relay.relayIncarnation).toBe(2n)
  })

  it("ends the watch on an unknown event or a malformed catalog", () => {
    expect(new CatalogWatchReader().push(sseEvent("readiness", "{}"))).toBeInstanceOf(CatalogWatchEnded)
    const extra = JSON.stringify({ ...JSON.parse(catalogText(1n)), surprise: 1 })
    const malformed = new CatalogWatchReader().push(sseEvent("catalog", extra))
    expect(malformed).toBeInstanceOf(CatalogWatchEnded)
    expect((malformed as CatalogWatchEnded).message).toMatch(/surprise/)
  })
})
