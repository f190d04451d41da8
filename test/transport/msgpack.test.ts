import fc from "fast-check"
import { Packr, Unpackr } from "msgpackr"
import { describe, expect, it } from "vitest"
import { hashPairs, hashPairsToBigInts } from "../../src/ckf/u64.js"
import { clearedEvent, type RouterEvent, removedEvent, storedEvent } from "../../src/protocol/Events.js"
import type { WorkerKvQueryResponse } from "../../src/recovery/WorkerQuery.js"
import { readEnvelope } from "../../src/transport/internal/msgpack/envelope.js"
import {
  decodeRouterEvents,
  decodeWorkerQueryRequest,
  decodeWorkerQueryResponse,
  encodeEnvelope,
  encodeRouterEvents,
  encodeWorkerQueryRequest,
  encodeWorkerQueryResponse,
  MsgpackReader,
  MsgpackWriter
} from "../../src/transport/msgpack.js"
import { plain, routerEventArb } from "./fixtures.js"

const packr = new Packr({ useRecords: false, mapsAsObjects: false })
const pack = (value: unknown): Uint8Array => packr.pack(value)
const oracle = new Unpackr({ useRecords: false, int64AsType: "bigint", mapsAsObjects: true })
const unpack = (bytes: Uint8Array): unknown => oracle.unpack(bytes)

/** rmp-serde `to_vec_named` shape of one event, hashes as bigints (signed when `signed`). */
const namedShape = (event: RouterEvent, signed = false): Record<string, unknown> => {
  const h = (v: bigint) => (signed ? BigInt.asIntN(64, v) : v)
  const data = event.data
  const dataShape =
    data._tag === "Cleared"
      ? "cleared"
      : data._tag === "Removed"
        ? { removed: { block_hashes: hashPairsToBigInts(data.blockHashes).map(h) } }
        : {
            stored: {
              parent_hash: data.parentHash === undefined ? null : h(hashPairsToBigInts(data.parentHash)[0]!),
              start_position: data.startPosition ?? null,
              blocks: hashPairsToBigInts(data.blockHashes).map((block, i) => ({
                block_hash: h(block),
                tokens_hash: h(hashPairsToBigInts(data.tokensHashes!)[i]!),
                mm_extra_info: null
              }))
            }
          }
  return {
    worker_id: BigInt(event.workerId),
    storage_tier: event.storageTier,
    // msgpackr writes numbers above 2^32 as float64; a bigint keeps them integers as rmp-serde does.
    event: { event_id: BigInt(event.eventId), data: dataShape, dp_rank: event.dpRank }
  }
}

const decodeOk = (bytes: Uint8Array): Array<RouterEvent> => {
  const result = decodeRouterEvents(bytes)
  if (!result.ok) throw new Error(`expected a decodable payload: ${result.message}`)
  return result.value
}

const decodeError = (bytes: Uint8Array): string => {
  const result = decodeRouterEvents(bytes)
  if (result.ok) throw new Error("expected a decode failure")
  return result.message
}

describe("RouterEvent payload", () => {
  it("round-trips random batches in every variant form", () => {
    fc.assert(
      fc.property(
        fc.array(routerEventArb, { maxLength: 8 }),
        fc.constantFrom("named" as const, "index-map" as const, "index-array" as const),
        (events, variants) => {
          expect(plain(decodeOk(encodeRouterEvents(events, { variants })))).toEqual(plain(events))
        }
      ),
      { numRuns: 300 }
    )
  })

  it("decodes what an independent encoder (msgpackr) writes, signed hashes reinterpreted as u64", () => {
    fc.assert(
      fc.property(fc.array(routerEventArb, { maxLength: 6 }), fc.boolean(), (events, signed) => {
        const bytes = pack(events.map((event) => namedShape(event, signed)))
        expect(plain(decodeOk(bytes))).toEqual(plain(events))
      }),
      { numRuns: 300 }
    )
  })

  it("writes what an independent decoder (msgpackr) reads as the rmp-serde named shape", () => {
    fc.assert(
      fc.property(fc.array(routerEventArb, { maxLength: 6 }), (events) => {
        const decoded = unpack(encodeRouterEvents(events)) as Array<Record<string, unknown>>
        const normalize = (value: unknown): unknown =>
          typeof value === "bigint"
            ? value
            : typeof value === "number"
              ? BigInt(value)
              : Array.isArray(value)
                ? value.map(normalize)
                : value !== null && typeof value === "object"
                  ? Object.fromEntries(Object.entries(value).map(([k, v]) => [k, normalize(v)]))
                  : value
        expect(normalize(decoded)).toEqual(normalize(events.map((event) => namedShape(event))))
      }),
      { numRuns: 200 }
    )
  })

  it("reads hashes of every integer width and sign", () => {
    const cases: Array<[bigint, bigint]> = [
      [0n, 0n],
      [127n, 127n],
      [-1n, 2n ** 64n - 1n],
      [-32n, 2n ** 64n - 32n],
      [-33n, 2n ** 64n - 33n],
      [-200n, 2n ** 64n - 200n],
      [-40_000n, 2n ** 64n - 40_000n],
      [-3_000_000_000n, 2n ** 64n - 3_000_000_000n],
      [200n, 200n],
      [60_000n, 60_000n],
      [4_000_000_000n, 4_000_000_000n],
      [2n ** 63n + 7n, 2n ** 63n + 7n],
      [-(2n ** 63n), 2n ** 63n]
    ]
    for (const [wire, expected] of cases) {
      // msgpackr writes a bigint as 64 bits; a number of 32 bits or less takes its smallest width
      // (int8, int16, …); beyond that it writes a float, so those stay bigints.
      const value = wire >= -(2n ** 31n) && wire < 2n ** 32n ? Number(wire) : wire
      const bytes = pack([
        {
          worker_id: 7,
          storage_tier: "device",
          event: { event_id: 1, data: { removed: { block_hashes: [value] } }, dp_rank: 0 }
        }
      ])
      const [event] = decodeOk(bytes)
      expect(hashPairsToBigInts((event!.data as { blockHashes: Uint32Array }).blockHashes)).toEqual([
        expected
      ])
    }
  })

  it("accepts the positional (to_vec) struct forms and older tier encodings", () => {
    const bytes = pack([
      [7, "device", [1, new Map([["stored", [null, 3, [[11, 12, null]]]]]), 2]],
      [7, 0, [2, new Map([[1, [[13, -1]]]]), 2]],
      [7, new Map([["disk", null]]), [3, [0, [[5, [[14, 15]]]]], 2]],
      [7, [1, []], [4, [2, []], 2]],
      [7, "device", [5, 2, 2]],
      [7, [6, new Map([[2, null]])]]
    ])
    const events = decodeOk(bytes)
    expect(plain(events)).toEqual(
      plain([
        {
          ...storedEvent(7, 2, 1, [11n], { tokensHashes: [12n] }),
          data: { ...(storedEvent(7, 2, 1, [11n], { tokensHashes: [12n] }).data as object), startPosition: 3 }
        } as RouterEvent,
        removedEvent(7, 2, 2, [13n, 2n ** 64n - 1n]),
        { ...storedEvent(7, 2, 3, [14n], { tokensHashes: [15n], parentHash: 5n }), storageTier: "disk" },
        { ...clearedEvent(7, 2, 4), storageTier: "host_pinned" },
        clearedEvent(7, 2, 5),
        clearedEvent(7, 0, 6)
      ])
    )
  })

  it("accepts a single RouterEvent map (older sinks) and tolerates unknown keys", () => {
    const single = pack({
      worker_id: 9,
      residency_domain: "worker",
      storage_tier: "device",
      event: {
        event_id: 4,
        data: {
          stored: {
            parent_hash: null,
            blocks: [{ block_hash: 1, tokens_hash: 2, mm_extra_info: { mm_objects: [] }, extra: [1, [2]] }],
            shared_cache_eligible: true
          }
        },
        dp_rank: 1,
        future: { a: [1, 2, 3] }
      },
      state_source: 77
    })
    expect(plain(decodeOk(single))).toEqual(plain([storedEvent(9, 1, 4, [1n], { tokensHashes: [2n] })]))
  })

  it("rejects values it cannot represent exactly, naming the field", () => {
    const base = (event: Record<string, unknown>) =>
      pack([
        {
          worker_id: 1,
          storage_tier: "device",
          event: { event_id: 1, data: "cleared", dp_rank: 0, ...event }
        }
      ])
    expect(decodeError(base({ event_id: 2n ** 53n + 1n }))).toMatch(/event_id/)
    expect(decodeError(base({ event_id: -1 }))).toMatch(/event_id/)
    expect(decodeError(base({ dp_rank: 2 ** 32 }))).toMatch(/dp_rank/)
    expect(decodeError(base({ data: "stored" }))).toMatch(/data/)
    expect(decodeError(base({ data: { stored: {}, removed: {} } }))).toMatch(/data/)
    expect(decodeError(base({ data: { exploded: {} } }))).toMatch(/unknown variant/)
    expect(decodeError(base({ data: { removed: { block_hashes: ["ab"] } } }))).toMatch(/block_hashes/)
    expect(
      decodeError(base({ data: { stored: { parent_hash: null, blocks: [{ block_hash: 1 }] } } }))
    ).toMatch(/tokens_hash/)
    expect(decodeError(pack([{ worker_id: 1, storage_tier: "gpu", event: {} }]))).toMatch(/storage_tier/)
    expect(decodeError(pack([{ storage_tier: "device", event: { event_id: 1, data: "cleared" } }]))).toMatch(
      /worker_id/
    )
    expect(decodeError(pack([{ worker_id: 1, event: { data: "cleared" } }]))).toMatch(/event_id/)
    expect(decodeError(pack("not a batch"))).toMatch(/payload/)
  })

  it("rejects truncated input and absurd lengths without allocating them", () => {
    const bytes = encodeRouterEvents([storedEvent(1, 0, 1, [1n, 2n, 3n])])
    for (let cut = 0; cut < bytes.length; cut++)
      expect(decodeRouterEvents(bytes.subarray(0, cut)).ok).toBe(false)
    expect(decodeError(Uint8Array.of(0xdd, 0xff, 0xff, 0xff, 0xff))).toMatch(/exceeds/)
    expect(decodeError(Uint8Array.of(0x91, 0x81, 0xa1, 0x78, 0xdd, 0x7f, 0xff, 0xff, 0xff))).toMatch(/exceed/)
  })

  it("writes and reads every header form of str, bin, array and map as msgpackr does", () => {
    // The boundaries of the fix, 8-, 16- and 32-bit forms.
    const lengths = [0, 15, 16, 31, 32, 255, 256, 65_535, 65_536]
    for (const n of lengths) {
      const text = "x".repeat(n)
      const bytes = new Uint8Array(n).fill(7)
      const list = new Array<null>(n).fill(null)
      const entries = Array.from({ length: n }, (_, i) => [i, null] as const)
      const w = new MsgpackWriter()
      w.str(text).bin(bytes).array(n)
      for (let i = 0; i < n; i++) w.nil()
      w.map(n)
      for (const [k] of entries) w.int(k).nil()
      const written = w.finish()
      // Byte for byte what an independent encoder writes for the same values.
      const expected = new Uint8Array([
        ...pack(text),
        ...pack(bytes),
        ...pack(list),
        ...packr.pack(new Map(entries))
      ])
      expect(Buffer.from(written).equals(Buffer.from(expected))).toBe(true)

      const r = new MsgpackReader(written)
      expect(r.string("str")).toBe(text)
      const binLength = r.tryBinHeader()
      expect(binLength).toBe(n)
      r.pos += n
      expect(r.tryArray()).toBe(n)
      for (let i = 0; i < n; i++) expect(r.nil()).toBe(true)
      expect(r.tryMap()).toBe(n)
      for (let i = 0; i < n; i++) {
        expect(r.uint("key")).toBe(i)
        expect(r.nil()).toBe(true)
      }
      expect(r.remaining).toBe(0)
    }
    // A header whose length bytes are cut off is not that type (nothing consumed).
    for (const bytes of [[0xd9], [0xda, 0x01], [0xc5, 0x00], [0xdc, 0x00], [0xdf, 0x00, 0x00, 0x00]]) {
      const r = new MsgpackReader(Uint8Array.from(bytes))
      expect([r.tryStrHeader(), r.tryBinHeader(), r.tryArray(), r.tryMap()]).toEqual([-1, -1, -1, -1])
      expect(r.pos).toBe(0)
    }
  })

  it("skips deeply nested unknown values without recursion", () => {
    const depth = 200_000
    const w = new MsgpackWriter()
    w.array(1).map(4).str("worker_id").int(1).str("storage_tier").str("device")
    w.str("event").map(2).str("event_id").int(1).str("data").str("cleared")
    w.str("deep")
    for (let i = 0; i < depth; i++) w.array(1)
    w.nil()
    expect(plain(decodeOk(w.finish()))).toEqual(plain([clearedEvent(1, 0, 1)]))
  })

  it("never throws on random bytes", () => {
    fc.assert(
      fc.property(fc.uint8Array({ maxLength: 256 }), (bytes) => {
        const result = decodeRouterEvents(bytes)
        expect(typeof result.ok).toBe("boolean")
      }),
      { numRuns: 3000 }
    )
  })

  it("never throws on mutated valid payloads", () => {
    fc.assert(
      fc.property(
        fc.array(routerEventArb, { minLength: 1, maxLength: 4 }),
        fc.array(fc.tuple(fc.nat(), fc.integer({ min: 0, max: 255 })), { minLength: 1, maxLength: 6 }),
        (events, flips) => {
          const bytes = encodeRouterEvents(events)
          for (const [at, value] of flips) bytes[at % bytes.length] = value
          const result = decodeRouterEvents(bytes)
          if (result.ok)
            for (const event of result.value) expect(Number.isSafeInteger(event.eventId)).toBe(true)
        }
      ),
      { numRuns: 2000 }
    )
  })
})

describe("MsgpackWriter", () => {
  it("writes integers in their smallest encoding, as msgpackr reads them", () => {
    fc.assert(
      fc.property(fc.bigInt({ min: -(2n ** 63n), max: 2n ** 63n - 1n }), (value) => {
        const pairs = hashPairs([value])
        const signed = new MsgpackWriter().i64(pairs[0]!, pairs[1]!).finish()
        expect(BigInt(unpack(signed) as bigint | number)).toBe(value)
        const unsigned = new MsgpackWriter().u64(pairs[0]!, pairs[1]!).finish()
        expect(BigInt(unpack(unsigned) as bigint | number)).toBe(BigInt.asUintN(64, value))
        const reference = pack(value >= -(2n ** 31n) && value < 2n ** 32n ? Number(value) : value)
        if (value >= -(2n ** 31n) && value < 2n ** 32n)
          expect(Buffer.from(signed)).toEqual(Buffer.from(reference))
      }),
      { numRuns: 1000 }
    )
  })
})

describe("EventEnvelope", () => {
  it("round-trips and reads as the rmp-serde named map", () => {
    const payload = encodeRouterEvents([storedEvent(3, 0, 1, [5n])])
    const bytes = encodeEnvelope({
      topic: "kv-events",
      publisherId: 2n ** 53n - 1n,
      sequence: 42,
      publishedAtMs: 1_700_000_000_000,
      payload
    })
    const view = readEnvelope(new MsgpackReader(bytes))
    expect(Buffer.from(bytes.subarray(view.topicStart, view.topicStart + view.topicLength)).toString()).toBe(
      "kv-events"
    )
    expect((BigInt(view.publisherHi) << 32n) | BigInt(view.publisherLo)).toBe(2n ** 53n - 1n)
    expect(view.payloadBuffer.subarray(view.payloadStart, view.payloadEnd)).toEqual(payload)
    const decoded = unpack(bytes) as Record<string, unknown>
    expect(Object.keys(decoded)).toEqual(["topic", "publisher_id", "sequence", "published_at", "payload"])
    expect(decoded.sequence).toBe(42)
  })

  it("accepts a payload written as an array of byte values", () => {
    const payload = encodeRouterEvents([clearedEvent(3, 0, 9)])
    const bytes = pack({
      topic: "t",
      publisher_id: 5,
      sequence: 0,
      published_at: 0,
      payload: Array.from(payload)
    })
    const view = readEnvelope(new MsgpackReader(bytes))
    expect(view.payloadBuffer.subarray(view.payloadStart, view.payloadEnd)).toEqual(payload)
  })
})

describe("worker query maps", () => {
  it("round-trips requests as snake_case maps", () => {
    fc.assert(
      fc.property(
        fc.oneof(fc.nat({ max: 1000 }).map(String), fc.bigInt({ min: 0n, max: 2n ** 64n - 1n }).map(String)),
        fc.nat({ max: 0xffff_ffff }),
        fc.option(fc.nat(), { nil: undefined }),
        fc.option(fc.nat(), { nil: undefined }),
        (workerId, dpRank, startEventId, endEventId) => {
          const request = { workerId, dpRank, startEventId, endEventId, supportsTreeDumpFailed: true }
          const bytes = encodeWorkerQueryRequest(request)
          const decoded = decodeWorkerQueryRequest(bytes)
          expect(decoded.ok && decoded.value).toEqual({ ...request, kind: undefined })
          const raw = unpack(bytes) as Record<string, unknown>
          expect(Object.keys(raw)).toEqual([
            "worker_id",
            "dp_rank",
            "start_event_id",
            "end_event_id",
            "supports_tree_dump_failed"
          ])
          expect(BigInt(raw.worker_id as bigint | number)).toBe(BigInt(workerId))
          const start = raw.start_event_id as bigint | number | null
          expect(start === null ? undefined : Number(start)).toEqual(startEventId)
        }
      )
    )
  })

  it("defaults the capability flag to false for older clients and reads a kind", () => {
    const old = decodeWorkerQueryRequest(
      pack({ worker_id: 1, dp_rank: 0, start_event_id: null, end_event_id: null })
    )
    expect(old.ok && old.value.supportsTreeDumpFailed).toBe(false)
    const status = decodeWorkerQueryRequest(pack({ worker_id: 1, kind: { status: { expected: 1 } } }))
    expect(status.ok && status.value.kind).toBe("status")
    expect(decodeWorkerQueryRequest(pack({ dp_rank: 0 })).ok).toBe(false)
  })

  it("round-trips every response variant", () => {
    const responses: Array<WorkerKvQueryResponse> = [
      { _tag: "Events", events: [storedEvent(1, 0, 5, [9n]), clearedEvent(1, 0, 6)], lastEventId: 6 },
      { _tag: "TreeDump", events: [storedEvent(1, 0, 0, [9n, 10n])], lastEventId: 12 },
      { _tag: "TreeDump", events: [], lastEventId: 0 },
      { _tag: "TreeDumpFailed", lastEventId: 3, message: "tier exploded" },
      { _tag: "TooNew", requestedStart: 10, requestedEnd: undefined, newestAvailable: 4 },
      { _tag: "InvalidRange", startId: 9, endId: 2 },
      { _tag: "Error", message: "worker query mismatch" }
    ]
    for (const response of responses) {
      const decoded = decodeWorkerQueryResponse(encodeWorkerQueryResponse(response))
      expect(decoded.ok).toBe(true)
      if (!decoded.ok) continue
      if ("events" in response && "events" in decoded.value) {
        expect(plain(decoded.value.events)).toEqual(plain(response.events))
        expect({ ...decoded.value, events: [] }).toEqual({ ...response, events: [] })
      } else expect(decoded.value).toEqual(response)
    }
    const raw = unpack(
      encodeWorkerQueryResponse({ _tag: "TooNew", requestedStart: 10, requestedEnd: 12, newestAvailable: 4 })
    )
    expect(raw).toEqual({ TooNew: { requested_start: 10, requested_end: 12, newest_available: 4 } })
  })

  it("reads foreign encodings: extra keys, the v1 bare Events list; rejects what it cannot use", () => {
    const dump = decodeWorkerQueryResponse(
      pack({ TreeDump: { events: [], last_event_id: 7, reset_scope: "All" } })
    )
    expect(dump.ok && dump.value).toEqual({ _tag: "TreeDump", events: [], lastEventId: 7 })
    const v1 = decodeWorkerQueryResponse(
      pack({
        Events: [
          { worker_id: 1, storage_tier: "device", event: { event_id: 4, data: "cleared", dp_rank: 0 } }
        ]
      })
    )
    expect(v1.ok && v1.value._tag === "Events" && v1.value.lastEventId).toBe(4)
    expect(decodeWorkerQueryResponse(pack({ TreeDump: [] })).ok).toBe(false)
    expect(decodeWorkerQueryResponse(pack({ Status: {} })).ok).toBe(false)
    expect(decodeWorkerQueryResponse(pack({ Events: { events: [] } })).ok).toBe(false)
    expect(decodeWorkerQueryResponse(pack({ Error: "x", Events: [] })).ok).toBe(false)
  })

  it("never throws on random bytes", () => {
    fc.assert(
      fc.property(fc.uint8Array({ maxLength: 128 }), (bytes) => {
        decodeWorkerQueryResponse(bytes)
        decodeWorkerQueryRequest(bytes)
      }),
      { numRuns: 2000 }
    )
  })
})
