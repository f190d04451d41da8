import fc from "fast-check"
import { Packr } from "msgpackr"
import { describe, expect, it } from "vitest"
import { localBlockHashes } from "../../src/ckf/tokens.js"
import { hashPairs, hashPairsToBigInts } from "../../src/ckf/u64.js"
import type { RouterEvent } from "../../src/protocol/Events.js"
import {
  type EngineEvent,
  type EngineFormat,
  encodeEngineBatch,
  SGLANG_FORMAT,
  VLLM_FORMAT
} from "../../src/simulate/EngineBatchEncoder.js"
import { decodeEngineBatch, makeEngineDecoder } from "../../src/transport/EngineZmq.js"
import { u64FrameOf } from "../../src/transport/ZmqSocket.js"
import { hashArb, plain } from "./fixtures.js"

const packr = new Packr({ useRecords: false, mapsAsObjects: false })
const pack = (value: unknown): Uint8Array => packr.pack(value)

const WORKER = "7001"
const decode = (payload: Uint8Array, rank = 0, eventId = 11) => {
  const result = decodeEngineBatch(payload, WORKER, rank, eventId)
  if (!result.ok) throw new Error(`expected a decodable batch: ${result.message}`)
  return result.value
}
const hashesOf = (event: RouterEvent | undefined): Array<bigint> =>
  event === undefined || event.data._tag === "Cleared" ? [] : hashPairsToBigInts(event.data.blockHashes)

const stored = (hashes: Array<bigint | number | Uint8Array>, extra: Record<string, unknown> = {}) => ({
  type: "BlockStored",
  block_hashes: hashes,
  parent_block_hash: null,
  token_ids: [1, 2, 3, 4],
  block_size: 4,
  lora_id: null,
  medium: "GPU",
  lora_name: null,
  ...extra
})

describe("engine batch decoding", () => {
  it("round-trips the simulated vLLM and SGLang encodings (and the map batch, byte hashes)", () => {
    const formats: Array<EngineFormat> = [
      VLLM_FORMAT,
      SGLANG_FORMAT,
      { ...VLLM_FORMAT, batch: "map" },
      { ...SGLANG_FORMAT, batch: "map" },
      { ...VLLM_FORMAT, hashes: "bytes" }
    ]
    fc.assert(
      fc.property(
        fc.constantFrom(...formats),
        fc.array(fc.array(hashArb, { maxLength: 6 }), { minLength: 1, maxLength: 4 }),
        fc.option(hashArb, { nil: undefined }),
        fc.nat({ max: 7 }),
        (format, batches, parent, dpRank) => {
          const events: Array<EngineEvent> = batches.map((hashes, i) =>
            i % 2 === 0
              ? {
                  type: "BlockStored",
                  blockHashes: hashPairs(hashes),
                  parentBlockHash: parent === undefined ? undefined : hashPairs([parent]),
                  tokenIds: Array.from({ length: 2 * hashes.length }, (_, t) => t),
                  blockSize: 2,
                  medium: format.medium ? "GPU" : null
                }
              : { type: "BlockRemoved", blockHashes: hashPairs(hashes), medium: null }
          )
          events.push({ type: "AllBlocksCleared" })
          const batch = decode(encodeEngineBatch({ ts: 1.5, events, dpRank }, format), dpRank, 42)
          expect(batch.ignored).toBe(0)
          expect(
            batch.events.map((e) => [e.workerId, e.dpRank, e.eventId, e.storageTier, e.data._tag])
          ).toEqual(
            events.map((e) => [
              WORKER,
              dpRank,
              42,
              "device",
              e.type === "BlockStored" ? "Stored" : e.type === "BlockRemoved" ? "Removed" : "Cleared"
            ])
          )
          batches.forEach((hashes, i) => {
            expect(hashesOf(batch.events[i])).toEqual(hashes)
          })
          const first = batch.events[0]!
          if (first.data._tag === "Stored")
            expect(first.data.parentHash && hashPairsToBigInts(first.data.parentHash)[0]).toEqual(parent)
        }
      ),
      { numRuns: 300 }
    )
  })

  it("reads 2- and 3-element batches and ignores unknown trailing batch fields", () => {
    const events = [["BlockStored", [5], null, [1], 1, null]]
    const two = decode(pack([1.0, events]), 4)
    expect(two.dpRank).toBe(4)
    expect(two.events.map((e) => e.dpRank)).toEqual([4])
    const three = decode(pack([1.0, events, 2]), 4)
    expect(three.dpRank).toBe(2)
    expect(three.events.map((e) => e.dpRank)).toEqual([2])
    const nilRank = decode(pack([1.0, events, null]), 4)
    expect(nilRank.dpRank).toBe(4)
    const trailing = decode(pack([1.0, events, 1, 99, { epoch: 3 }, ["reconciliation"]]), 0)
    expect(trailing.dpRank).toBe(1)
    expect(hashesOf(trailing.events[0])).toEqual([5n])
  })

  it("reads map batches with data_parallel_rank or attn_dp_rank and unknown keys", () => {
    const events = [{ type: "BlockRemoved", block_hashes: [6], medium: "GPU" }]
    expect(
      decode(
        pack(
          new Map<string, unknown>([
            ["ts", 1],
            ["events", events],
            ["data_parallel_rank", 3]
          ])
        )
      ).dpRank
    ).toBe(3)
    expect(decode(pack({ events, attn_dp_rank: 5, ts: 2.5, publisher_epoch: 9 })).dpRank).toBe(5)
    expect(decode(pack({ ts: 2.5, events }), 6).dpRank).toBe(6)
    expect(decodeEngineBatch(pack({ ts: 1 }), WORKER, 0, 1).ok).toBe(false)
  })

  it("reads tagged arrays with trailing fields and tagged maps with unknown keys in any order", () => {
    const batch = decode(
      pack([
        0,
        [
          [
            "BlockStored",
            [1, 2],
            9,
            [1, 2, 3, 4],
            2,
            7,
            "GPU",
            "lora",
            [null],
            0,
            "full_attention",
            null,
            "LOCAL",
            null,
            "session",
            "future",
            1
          ],
          {
            block_hashes: [3],
            something_new: { a: 1 },
            type: "BlockStored",
            token_ids: [5, 6],
            parent_block_hash: 2,
            block_size: 2,
            medium: null
          },
          ["BlockRemoved", [4], "GPU", 0, "LOCAL", null, "future"],
          { type: "BlockRemoved", block_hashes: [5], group_idx: 0, later: [] },
          ["AllBlocksCleared", "future"],
          { type: "AllBlocksCleared", future: 1 }
        ],
        0
      ])
    )
    expect(batch.events.map((e) => [e.data._tag, hashesOf(e)])).toEqual([
      ["Stored", [1n, 2n]],
      ["Stored", [3n]],
      ["Removed", [4n]],
      ["Removed", [5n]],
      ["Cleared", []],
      ["Cleared", []]
    ])
    const parent = batch.events[1]!.data
    expect(parent._tag === "Stored" && parent.parentHash && hashPairsToBigInts(parent.parentHash)).toEqual([
      2n
    ])
  })

  it("reads signed, unsigned and byte-string hashes as u64", () => {
    const digest = new Uint8Array(32).fill(0x11)
    digest.set([0x80, 0, 0, 0, 0, 0, 0, 0x2a], 24)
    const batch = decode(
      pack([
        0,
        [
          ["BlockStored", [-1n, -2, 2n ** 63n + 5n, 2n ** 64n - 1n], -5, Array(16).fill(1), 4, null],
          {
            type: "BlockStored",
            block_hashes: [digest, Uint8Array.of(0, 0, 0, 0, 0, 0, 1, 2)],
            parent_block_hash: Uint8Array.of(0, 0, 0, 0, 0, 0, 0, 9),
            token_ids: [1, 2, 3, 4, 5, 6, 7, 8],
            block_size: 4
          }
        ]
      ])
    )
    expect(hashesOf(batch.events[0])).toEqual([
      2n ** 64n - 1n,
      2n ** 64n - 2n,
      2n ** 63n + 5n,
      2n ** 64n - 1n
    ])
    expect(hashesOf(batch.events[1])).toEqual([0x8000_0000_0000_002an, 0x0102n])
    const parent = batch.events[1]!.data
    expect(parent._tag === "Stored" && parent.parentHash && hashPairsToBigInts(parent.parentHash)).toEqual([
      9n
    ])
    const reasonOf = (hashes: ReadonlyArray<unknown>) => {
      const result = decodeEngineBatch(pack([0, [["BlockStored", hashes, null, [1], 1, null]]]), WORKER, 0, 1)
      return result.ok ? "ok" : result.reason
    }
    expect(reasonOf([1.5])).toBe("hash")
    expect(reasonOf(["7"])).toBe("hash")
    // A byte-string hash needs its low 8 bytes: shorter ones (a 0-byte one was hash 0) are malformed.
    expect(reasonOf([Uint8Array.of(1, 2)])).toBe("hash")
    expect(reasonOf([new Uint8Array(0)])).toBe("hash")
    expect(reasonOf([new Uint8Array(8)])).toBe("ok")
  })

  it("maps media to storage tiers as Dynamo does and skips an unknown medium", () => {
    const media: Array<[string | null | undefined, string | undefined]> = [
      [undefined, "device"],
      [null, "device"],
      ["", "device"],
      ["GPU", "device"],
      ["DEVICE", "device"],
      ["CPU", "host_pinned"],
      ["CPU_PINNED", "host_pinned"],
      ["CPU_TIER1", "host_pinned"],
      ["CPU_TIER2", "disk"],
      ["DISK", "disk"],
      ["NVME", "disk"],
      ["STORAGE", "disk"],
      ["EXTERNAL", "external"],
      ["NETWORK", "external"],
      ["REMOTE", "external"],
      ["SHARED", "external"],
      ["gpu", undefined],
      ["cpu", undefined],
      ["TAPE", undefined]
    ]
    for (const [medium, tier] of media) {
      const event =
        medium === undefined
          ? ["BlockStored", [1], null, [1, 2, 3, 4], 4, null]
          : ["BlockStored", [1], null, [1, 2, 3, 4], 4, null, medium]
      const removal = medium === undefined ? ["BlockRemoved", [1]] : ["BlockRemoved", [1], medium]
      const batch = decode(pack([0, [event, removal], 0]))
      if (tier === undefined) {
        expect(batch.ignored).toBe(2)
        expect(batch.skipped).toEqual({ medium: 2, locality: 0, ownership: 0, group: 0, namespace: 0 })
      } else {
        expect(batch.ignored).toBe(0)
        expect(batch.events.map((e) => [e.storageTier, e.data._tag])).toEqual([
          [tier, "Stored"],
          [tier, "Removed"]
        ])
      }
    }
  })

  it("reads a tokens-less host store (vLLM's offloading connector) as blocks resolved through the lineage", () => {
    const batch = decode(
      pack([
        0,
        [{ ...stored([5, 6]), token_ids: [], block_size: 16, medium: "CPU", parent_block_hash: null }],
        0
      ])
    )
    const event = batch.events[0]!
    expect(event.storageTier).toBe("host_pinned")
    expect(event.data._tag === "Stored" && event.data.resolveThroughLineage).toBe(true)
    expect(event.data._tag === "Stored" && event.data.tokensHashes).toBe(undefined)
    expect(hashesOf(event)).toEqual([5n, 6n])
    // A device store without tokens stays malformed (§3.2).
    expect(decodeEngineBatch(pack([0, [{ ...stored([5]), token_ids: [] }], 0]), WORKER, 0, 1).ok).toBe(false)
  })

  it("folds a cache salt into local hashes: SGLang's cache_salt, vLLM's tagged extra_keys, inherited by children", () => {
    const tokens = [1, 2, 3, 4]
    const local = (event: RouterEvent | undefined): Array<bigint> =>
      event?.data._tag === "Stored" ? hashPairsToBigInts(event.data.tokensHashes!) : []
    const salted = localBlockHashes(tokens, 4, { cacheSalt: "user-1" })
    const plainHashes = localBlockHashes(tokens, 4)
    const fromMap = decode(pack([0, [stored([1], { token_ids: tokens, cache_salt: "user-1" })], 0]))
    expect(local(fromMap.events[0])).toEqual(hashPairsToBigInts(salted))
    const fromExtraKeys = decode(
      pack([0, [stored([1], { token_ids: tokens, extra_keys: [["dynamo-cache-salt:user-1"]] })], 0])
    )
    expect(local(fromExtraKeys.events[0])).toEqual(hashPairsToBigInts(salted))
    // Untagged strings are never a namespace.
    const untagged = decode(pack([0, [stored([1], { token_ids: tokens, extra_keys: [["user-1"]] })], 0]))
    expect(local(untagged.events[0])).toEqual(hashPairsToBigInts(plainHashes))
    // A child batch names no salt: the source's decoder gives it its parent's.
    const decoder = makeEngineDecoder({ workerId: WORKER, dpRank: 0, publisherId: 9n, topic: "" })
    const frames = (seq: number, event: unknown) => [
      new Uint8Array(0),
      u64FrameOf(seq),
      pack([0, [event], 0])
    ]
    decoder(frames(0, stored([1], { token_ids: tokens, extra_keys: [["dynamo-cache-salt:user-1"]] })))
    const child = decoder(frames(1, stored([2], { token_ids: tokens, parent_block_hash: 1 })))
    expect(child._tag).toBe("Batch")
    if (child._tag === "Batch") expect(local(child.events[0])).toEqual(hashPairsToBigInts(salted))
    const orphan = decoder(frames(2, stored([3], { token_ids: tokens, parent_block_hash: 99 })))
    if (orphan._tag === "Batch") expect(local(orphan.events[0])).toEqual(hashPairsToBigInts(plainHashes))
  })

  it("skips non-main KV groups and unknown event types", () => {
    const batch = decode(
      pack([
        0,
        [
          stored([1], { group_idx: 1 }),
          stored([2], { group_idx: 0, kv_cache_spec_kind: "sliding_window" }),
          stored([3], { kv_cache_spec_kind: "mla_attention" }),
          { type: "BlockRemoved", block_hashes: [4], medium: "GPU", group_idx: 2 },
          { type: "BlockUpdated", block_hashes: [5] },
          ["SomethingElse", 1, 2]
        ],
        0
      ])
    )
    expect(batch.ignored).toBe(5)
    expect(batch.skipped).toEqual({ medium: 0, locality: 0, ownership: 0, group: 3, namespace: 0 })
    expect(batch.events.map(hashesOf)).toEqual([[3n]])
  })

  it("keeps the id stream dense: a batch with nothing to apply yields one empty Removed", () => {
    for (const payload of [pack([0, [], 0]), pack([0, [stored([1], { medium: "TAPE" })]])]) {
      const batch = decode(payload, 0, 77)
      expect(batch.events).toHaveLength(1)
      expect(batch.events[0]!.eventId).toBe(77)
      expect(batch.events[0]!.data).toEqual({ _tag: "Removed", blockHashes: new Uint32Array(0) })
    }
  })

  it("rejects malformed batches", () => {
    const bad = [
      pack("x"),
      pack([0]),
      pack([0, "events"]),
      pack([0, [[]]]),
      pack([0, [[5, 1]]]),
      pack([0, [{ block_hashes: [1] }]]),
      pack([0, [{ type: 5 }]]),
      pack([0, [["BlockStored", [1]]]]),
      pack([0, [["BlockRemoved"]]]),
      pack([0, [{ type: "BlockStored" }]]),
      pack([0, [], -1]),
      pack([0, [], 2 ** 32])
    ]
    for (const payload of bad) expect(decodeEngineBatch(payload, WORKER, 0, 1).ok).toBe(false)
  })

  it("never throws on random or mutated payloads", () => {
    fc.assert(
      fc.property(fc.uint8Array({ maxLength: 200 }), (bytes) => {
        decodeEngineBatch(bytes, WORKER, 0, 1)
      }),
      { numRuns: 3000 }
    )
    const valid = encodeEngineBatch(
      {
        ts: 1,
        events: [
          {
            type: "BlockStored",
            blockHashes: hashPairs([1n, 2n ** 64n - 1n]),
            parentBlockHash: undefined,
            tokenIds: [1],
            blockSize: 1,
            medium: "GPU"
          },
          { type: "BlockRemoved", blockHashes: hashPairs([3n]), medium: "CPU" }
        ],
        dpRank: 1
      },
      VLLM_FORMAT
    )
    fc.assert(
      fc.property(
        fc.array(fc.tuple(fc.nat(), fc.integer({ min: 0, max: 255 })), { maxLength: 6 }),
        (flips) => {
          const bytes = Uint8Array.from(valid)
          for (const [at, value] of flips) bytes[at % bytes.length] = value
          decodeEngineBatch(bytes, WORKER, 0, 1)
        }
      ),
      { numRuns: 3000 }
    )
  })
})

describe("engine frame codec", () => {
  const source = { workerId: WORKER, dpRank: 0, publisherId: 99n, topic: "" }
  const payload = pack([0, [["BlockStored", [1, 2], null, [1, 2, 3, 4], 2, null]], 0])

  it("gives every event of batch seq the id seq + 1 and routes by the advertised publisher id", () => {
    const result = makeEngineDecoder(source)([Buffer.alloc(0), u64FrameOf(41), Buffer.from(payload)])
    expect(result._tag).toBe("Batch")
    if (result._tag !== "Batch") return
    expect(result.publisherId).toBe(99n)
    expect(result.sequence).toBe(41)
    expect(result.events.map((e) => e.eventId)).toEqual([42])
    expect(plain(result.events)[0]).toMatchObject({ workerId: WORKER, dpRank: 0, storageTier: "device" })
    expect(result.blocks).toBe(2)
  })

  it("counts every malformed shape with its reason", () => {
    // A fresh decoder per message: each shape is judged on its own, not against a previous seq.
    const reason = (frames: Array<Uint8Array>) => {
      const result = makeEngineDecoder({ ...source, topic: "kv" })(frames)
      return result._tag === "Malformed" ? result.reason : "ok"
    }
    const p = Buffer.from(payload)
    expect(reason([Buffer.from("kv"), u64FrameOf(1), p])).toBe("ok")
    expect(reason([Buffer.from("kv"), u64FrameOf(1)])).toBe("frame-count")
    expect(reason([Buffer.from("kv"), u64FrameOf(1), p, p])).toBe("frame-count")
    expect(reason([Buffer.from("kx"), u64FrameOf(1), p])).toBe("topic")
    expect(reason([Buffer.from("k"), u64FrameOf(1), p])).toBe("topic")
    // A prefix subscription delivers longer topics: they are the source's messages.
    expect(reason([Buffer.from("kv-longer"), u64FrameOf(1), p])).toBe("ok")
    expect(reason([Buffer.from("kv"), Buffer.alloc(4), p])).toBe("sequence-width")
    expect(reason([Buffer.from("kv"), Buffer.alloc(8, 0xff), p])).toBe("sequence-range")
    expect(reason([Buffer.from("kv"), u64FrameOf(1), Buffer.from([0xc1])])).toBe("payload")
  })

  it("never throws on garbage frames", () => {
    const decodeFrames = makeEngineDecoder(source)
    fc.assert(
      fc.property(fc.array(fc.uint8Array({ maxLength: 40 }), { maxLength: 5 }), (frames) => {
        expect(["Batch", "Malformed", "Stale"]).toContain(decodeFrames(frames)._tag)
      }),
      { numRuns: 3000 }
    )
  })
})
