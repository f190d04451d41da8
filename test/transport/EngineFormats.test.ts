/**
 * The relay's engine decoders against payloads laid out by the test suite's msgspec encoders
 * (`./msgspec.ts`, on msgpackr): vLLM before and since v0.24 with every optional field, SGLang
 * with negative int64 hashes and its attention DP rank, and the Dynamo envelope in its current
 * field order. Then every malformed shape of PROTOCOL §3.2, each with its reason.
 */

import { createHash } from "node:crypto"
import fc from "fast-check"
import { describe, expect, it } from "vitest"
import { localBlockHashes } from "../../src/ckf/tokens.js"
import { hashPairsToBigInts } from "../../src/ckf/u64.js"
import type { RouterEvent } from "../../src/protocol/Events.js"
import { frameEnvelope, makeDynamoDecoder } from "../../src/transport/DynamoZmq.js"
import { decodeEngineBatch, makeEngineDecoder } from "../../src/transport/EngineZmq.js"
import { u64Frame, u64FrameOf } from "../../src/transport/ZmqSocket.js"
import {
  dynamoEnvelope,
  type PyValue,
  pack,
  sglangBatch,
  sglangHash,
  structValue,
  type VllmEvent,
  vllmBatch,
  vllmRemoved,
  vllmStored
} from "./msgspec.js"

const WORKER = "7001"
const U64 = 2n ** 64n
const asU64 = (value: bigint): bigint => (value < 0n ? value + U64 : value)
const tokens = (n: number, from = 1): Array<number> => Array.from({ length: n }, (_, i) => from + i)

const decoded = (payload: Uint8Array, options: { kvBlockSize?: number; dpRank?: number } = {}) => {
  const result = decodeEngineBatch(payload, WORKER, options.dpRank ?? 0, 5, {
    kvBlockSize: options.kvBlockSize
  })
  if (!result.ok) throw new Error(`expected a decodable batch: ${result.reason}: ${result.message}`)
  return result.value
}
const reasonOf = (payload: Uint8Array, kvBlockSize?: number): string => {
  const result = decodeEngineBatch(payload, WORKER, 0, 5, { kvBlockSize })
  return result.ok ? "ok" : result.reason
}
const view = (events: ReadonlyArray<RouterEvent>) =>
  events.map((event) => [
    event.data._tag,
    event.data._tag === "Cleared" ? [] : hashPairsToBigInts(event.data.blockHashes),
    event.data._tag === "Stored" && event.data.parentHash !== undefined
      ? hashPairsToBigInts(event.data.parentHash)[0]
      : null
  ])

describe("msgspec layouts (the encoders themselves)", () => {
  it("drops trailing defaults in arrays and default keys in maps, keeps required nils", () => {
    const spec = {
      tag: "BlockRemoved",
      fields: [{ name: "block_hashes" }, { name: "medium" }, { name: "group_idx", default: null }],
      omitDefaults: true
    }
    expect(structValue({ ...spec, arrayLike: true }, { block_hashes: [1n], medium: null })).toEqual([
      "BlockRemoved",
      [1],
      null
    ])
    expect(
      structValue({ ...spec, arrayLike: true }, { block_hashes: [1n], medium: null, group_idx: 2n })
    ).toEqual(["BlockRemoved", [1], null, 2])
    expect([
      ...(
        structValue({ ...spec, arrayLike: false }, { block_hashes: [1n], medium: null }) as Map<
          string,
          unknown
        >
      ).keys()
    ]).toEqual(["type", "block_hashes", "medium"])
  })
})

describe("vLLM", () => {
  it("current map events with every optional field decode to the device blocks, in order", () => {
    const events: Array<VllmEvent> = [
      vllmStored([2n ** 64n - 7n, 3n], tokens(32), 16, {
        parent_block_hash: 99n,
        lora_id: 4n,
        lora_name: "tenant-a",
        extra_keys: [null, ["mm", "abc"]],
        group_idx: 0n,
        kv_cache_spec_kind: "full_attention",
        kv_cache_spec_sliding_window: 128n,
        locality: "LOCAL",
        session_id: "s-1"
      }),
      vllmRemoved([3n], { group_idx: 0n, locality: "LOCAL" }),
      { type: "AllBlocksCleared" },
      vllmStored([11n], tokens(16), 16)
    ]
    const batch = decoded(vllmBatch(events, { version: "current", dpRank: 0n }), { kvBlockSize: 16 })
    expect(view(batch.events)).toEqual([
      ["Stored", [2n ** 64n - 7n, 3n], 99n],
      ["Removed", [3n], null],
      ["Cleared", [], null],
      ["Stored", [11n], null]
    ])
    expect(batch.events.every((e) => e.eventId === 5 && e.storageTier === "device")).toBe(true)
    expect(batch.ignored).toBe(0)
    // The relay computes each block's local hash from its tokens and the LoRA name (PROTOCOL §3.3).
    const first = batch.events[0]!.data
    const last = batch.events[3]!.data
    expect(first._tag === "Stored" && hashPairsToBigInts(first.tokensHashes!)).toEqual(
      hashPairsToBigInts(localBlockHashes(tokens(32), 16, { loraName: "tenant-a" }))
    )
    expect(last._tag === "Stored" && hashPairsToBigInts(last.tokensHashes!)).toEqual(
      hashPairsToBigInts(localBlockHashes(tokens(16), 16))
    )
  })

  it("old array events (trailing default medium dropped) and a batch whose None rank was dropped", () => {
    const payload = vllmBatch(
      [
        vllmStored([1n, 2n], tokens(8), 4, { medium: null }),
        vllmStored([5n], tokens(4), 4, { parent_block_hash: 2n }),
        vllmRemoved([1n], { medium: null })
      ],
      { version: "old", dpRank: null }
    )
    const batch = decoded(payload, { kvBlockSize: 4, dpRank: 3 })
    expect(view(batch.events)).toEqual([
      ["Stored", [1n, 2n], null],
      ["Stored", [5n], 2n],
      ["Removed", [1n], null]
    ])
    expect(batch.dpRank).toBe(3)
  })

  it("REMOTE and cache-owner events are skipped and counted by reason; LOCAL, GPU and CPU are not", () => {
    const batch = decoded(
      vllmBatch(
        [
          vllmStored([1n], tokens(4), 4, { locality: "REMOTE" }),
          vllmStored([2n], tokens(4), 4, { medium: "CPU" }),
          vllmStored([3n], tokens(4), 4, { ownership: "lmcache-l2" }),
          vllmStored([4n], tokens(4), 4, { group_idx: 1n }),
          vllmStored([5n], tokens(4), 4, { kv_cache_spec_kind: "sliding_window" }),
          vllmRemoved([6n], { medium: "STORAGE", locality: "REMOTE" }),
          vllmRemoved([7n], { ownership: "tier-2" }),
          vllmStored([8n], tokens(4), 4, { locality: "LOCAL" }),
          // vLLM's offloading connector: a CPU copy named by hash alone (no tokens), not malformed.
          vllmStored([9n], [], 0, { medium: "CPU" })
        ],
        { version: "current", dpRank: 0n }
      ),
      { kvBlockSize: 4 }
    )
    expect(view(batch.events)).toEqual([
      ["Stored", [2n], null],
      ["Stored", [8n], null],
      ["Stored", [9n], null]
    ])
    expect(batch.events.map((e) => e.storageTier)).toEqual(["host_pinned", "device", "host_pinned"])
    expect(
      batch.events.map((e) => e.data._tag === "Stored" && e.data.resolveThroughLineage === true)
    ).toEqual([false, false, true])
    // STORAGE is the disk tier now: that removal is skipped for its locality.
    expect(batch.skipped).toEqual({ medium: 0, locality: 2, ownership: 2, group: 2, namespace: 0 })
  })

  it("a partial last page is not indexed", () => {
    const batch = decoded(vllmBatch([vllmStored([1n, 2n, 3n], tokens(40), 16)], { version: "current" }), {
      kvBlockSize: 16
    })
    expect(view(batch.events)).toEqual([["Stored", [1n, 2n], null]])
    const data = batch.events[0]!.data
    expect(data._tag === "Stored" && hashPairsToBigInts(data.tokensHashes!)).toEqual(
      hashPairsToBigInts(localBlockHashes(tokens(32), 16))
    )
  })

  it("byte-string hashes (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0) fold to their low 8 bytes", () => {
    const digest = createHash("sha256").update("block").digest()
    const low = BigInt(`0x${digest.subarray(24).toString("hex")}`)
    const batch = decoded(
      vllmBatch([vllmStored([1n], tokens(4), 4, { block_hashes: [digest], parent_block_hash: digest })], {
        version: "current"
      })
    )
    expect(view(batch.events)).toEqual([["Stored", [low], low]])
  })
})

describe("SGLang", () => {
  const digest = (text: string) => createHash("sha256").update(text).digest("hex")

  it("negative int64 page hashes become u64, one event per page, attn_dp_rank routes the rank", () => {
    const hashes = ["a", "b", "c"].map((t) => sglangHash(digest(t)))
    expect(hashes.some((h) => h < 0n) || hashes.some((h) => h >= 0n)).toBe(true)
    for (const version of ["0.4", "current"] as const) {
      const payload = sglangBatch(
        [
          { hash: hashes[0]!, parent: null, tokens: tokens(4) },
          { hash: hashes[1]!, parent: hashes[0]!, tokens: tokens(4, 5) },
          { hash: hashes[2]!, parent: hashes[1]!, tokens: tokens(4, 9), cacheSalt: "tenant-salt" },
          { removed: hashes[0]! }
        ],
        { version, attnDpRank: 3n }
      )
      const batch = decoded(payload, { kvBlockSize: 4, dpRank: 0 })
      expect(batch.dpRank).toBe(3)
      expect(batch.events.every((e) => e.dpRank === 3)).toBe(true)
      expect(view(batch.events)).toEqual([
        ["Stored", [asU64(hashes[0]!)], null],
        ["Stored", [asU64(hashes[1]!)], asU64(hashes[0]!)],
        ["Stored", [asU64(hashes[2]!)], asU64(hashes[1]!)],
        ["Removed", [asU64(hashes[0]!)], null]
      ])
    }
  })

  it("a negative hash that needs all 64 bits round-trips", () => {
    const hash = -(2n ** 63n)
    const batch = decoded(
      sglangBatch([{ hash, parent: -1n, tokens: tokens(2) }], { version: "current", attnDpRank: null })
    )
    expect(view(batch.events)).toEqual([["Stored", [2n ** 63n], U64 - 1n]])
  })

  it("host- and disk-tier pages are kept on their tiers", () => {
    const batch = decoded(
      sglangBatch(
        [
          { hash: 5n, parent: null, tokens: tokens(2), medium: "CPU_PINNED" },
          { removed: 5n, medium: "DISK" }
        ],
        {
          version: "current",
          attnDpRank: 0n
        }
      )
    )
    expect(batch.skipped.medium).toBe(0)
    expect(batch.events.map((e) => [e.storageTier, e.data._tag])).toEqual([
      ["host_pinned", "Stored"],
      ["disk", "Removed"]
    ])
  })
})

describe("Dynamo event plane", () => {
  it("an envelope in EventEnvelope's field order carries RouterEvents to their publisher", () => {
    const payload = pack([
      new Map<string, unknown>([
        ["worker_id", 7001],
        ["storage_tier", "device"],
        [
          "event",
          new Map<string, unknown>([
            ["event_id", 12],
            [
              "data",
              new Map([
                [
                  "stored",
                  new Map<string, unknown>([
                    ["parent_hash", null],
                    ["start_position", null],
                    [
                      "blocks",
                      [
                        new Map<string, unknown>([
                          ["block_hash", 2n ** 64n - 3n],
                          ["tokens_hash", 77],
                          ["mm_extra_info", null]
                        ])
                      ]
                    ]
                  ])
                ]
              ])
            ],
            ["dp_rank", 0]
          ])
        ]
      ])
    ])
    const envelope = dynamoEnvelope({
      topic: "kv-events",
      publisherId: 2n ** 60n + 1n,
      sequence: 4n,
      publishedAt: 1_790_000_000_000n,
      payload
    })
    const message = makeDynamoDecoder("kv-events")([
      Buffer.from("kv-events"),
      u64Frame(0x1000_0000, 1),
      u64FrameOf(4),
      frameEnvelope(envelope)
    ])
    expect(message._tag).toBe("Batch")
    if (message._tag !== "Batch") return
    expect(message.publisherId).toBe(2n ** 60n + 1n)
    expect(view(message.events)).toEqual([["Stored", [2n ** 64n - 3n], null]])
    expect(message.events[0]!.eventId).toBe(12)
  })
})

describe("malformed engine messages (PROTOCOL §3.2)", () => {
  const storedWith = (fields: Readonly<Record<string, PyValue>>) =>
    vllmBatch([vllmStored([1n], tokens(4), 4, fields)], { version: "current" })

  it("names the reason of every malformed shape", () => {
    const cases: Array<[string, Uint8Array, string]> = [
      ["block_size a string", storedWith({ block_size: "4" }), "block-size"],
      ["block_size 0", storedWith({ block_size: 0n, token_ids: [] }), "block-size"],
      ["block_size negative", storedWith({ block_size: -4n }), "block-size"],
      [
        "block_size other than the card's",
        storedWith({ block_size: 8n, token_ids: tokens(8).map(BigInt) }),
        "block-size"
      ],
      ["a negative token id", storedWith({ token_ids: [1n, 2n, 3n, -1n] }), "token-ids"],
      ["a token id of 2^32", storedWith({ token_ids: [1n, 2n, 3n, 2n ** 32n] }), "token-ids"],
      ["a float token id", storedWith({ token_ids: [1n, 2n, 3n, 4.5] }), "token-ids"],
      ["token_ids not an array", storedWith({ token_ids: "1234" }), "token-ids"],
      ["a string lora_id", storedWith({ lora_id: "4" }), "lora"],
      ["an integer lora_name", storedWith({ lora_name: 7n }), "lora"],
      ["a 0-byte hash", storedWith({ block_hashes: [new Uint8Array(0)] }), "hash"],
      ["a 7-byte hash", storedWith({ block_hashes: [new Uint8Array(7)] }), "hash"],
      ["a string hash", storedWith({ block_hashes: ["1"] }), "hash"],
      ["a float parent", storedWith({ parent_block_hash: 1.5 }), "hash"],
      [
        "4 hashes with 3 tokens",
        storedWith({ block_hashes: [1n, 2n, 3n, 4n], token_ids: [1n, 2n, 3n] }),
        "token-count"
      ],
      ["more tokens than hashes × B", storedWith({ token_ids: tokens(5).map(BigInt) }), "token-count"],
      ["a numeric medium", storedWith({ medium: 1n }), "field-type"],
      ["a list locality", storedWith({ locality: ["LOCAL"] }), "field-type"],
      ["a string group_idx", storedWith({ group_idx: "0" }), "field-type"]
    ]
    for (const [what, payload, reason] of cases) expect([what, reasonOf(payload, 4)]).toEqual([what, reason])
    expect(reasonOf(storedWith({}), 4)).toBe("ok")
  })

  it("nothing of a malformed message is applied, whatever else it holds", () => {
    const payload = vllmBatch(
      [vllmStored([1n], tokens(4), 4), vllmRemoved([2n]), vllmStored([3n], tokens(4), 4, { lora_id: "x" })],
      { version: "current" }
    )
    const message = makeEngineDecoder(
      { workerId: WORKER, dpRank: 0, publisherId: 1n, topic: "" },
      { kvBlockSize: 4 }
    )([Buffer.alloc(0), u64FrameOf(0), Buffer.from(payload)])
    expect(message).toMatchObject({ _tag: "Malformed", reason: "lora" })
  })

  it("implausible sequences: a wild jump is malformed, a lower seq stale, seq 0 a restart", () => {
    const decode = makeEngineDecoder(
      { workerId: WORKER, dpRank: 0, publisherId: 1n, topic: "" },
      { kvBlockSize: 4 }
    )
    const payload = Buffer.from(vllmBatch([vllmStored([1n], tokens(4), 4)], { version: "current" }))
    const at = (seq: number) => {
      const message = decode([Buffer.alloc(0), u64FrameOf(seq), payload])
      return message._tag === "Malformed" ? message.reason : message._tag
    }
    expect(at(5)).toBe("Batch")
    expect(at(2 ** 53 - 2)).toBe("sequence-jump")
    expect(at(5 + 2 ** 32 + 1)).toBe("sequence-jump")
    expect(at(6)).toBe("Batch")
    expect(at(3)).toBe("Stale")
    expect(at(6)).toBe("Stale")
    expect(at(0)).toBe("Batch")
    expect(at(1)).toBe("Batch")
    expect(at(2 ** 32 + 1)).toBe("Batch")
    expect(decode([Buffer.alloc(0), Buffer.alloc(8, 0xff), payload])).toMatchObject({
      reason: "sequence-range"
    })
  })

  it("random vLLM events decode to what a plain model of §3.2 expects", () => {
    const eventArb = fc.record({
      hashes: fc.array(fc.bigInt({ min: 0n, max: U64 - 1n }), { minLength: 1, maxLength: 4 }),
      partial: fc.boolean(),
      medium: fc.constantFrom<PyValue>(null, "GPU", "CPU", "STORAGE", "TAPE"),
      locality: fc.constantFrom<PyValue | undefined>(undefined, null, "LOCAL", "REMOTE"),
      ownership: fc.constantFrom<PyValue | undefined>(undefined, null, "tier-2"),
      group: fc.constantFrom<bigint | undefined>(undefined, 0n, 1n),
      removed: fc.boolean()
    })
    fc.assert(
      fc.property(fc.array(eventArb, { maxLength: 8 }), fc.constantFrom(1, 4, 16), (specs, size) => {
        const events: Array<VllmEvent> = []
        const expected: Array<[string, Array<bigint>, string]> = []
        const skipped = { medium: 0, locality: 0, ownership: 0, group: 0, namespace: 0 }
        for (const spec of specs) {
          const optional: Record<string, PyValue> = { medium: spec.medium }
          if (spec.locality !== undefined) optional.locality = spec.locality
          if (spec.ownership !== undefined) optional.ownership = spec.ownership
          if (spec.group !== undefined) optional.group_idx = spec.group
          const count = spec.hashes.length * size - (spec.partial && size > 1 ? 1 : 0)
          events.push(
            spec.removed
              ? vllmRemoved(spec.hashes, optional)
              : vllmStored(spec.hashes, tokens(count), size, optional)
          )
          const reason =
            spec.medium === "TAPE"
              ? "medium"
              : spec.locality !== undefined && spec.locality !== null && spec.locality !== "LOCAL"
                ? "locality"
                : spec.ownership !== undefined && spec.ownership !== null
                  ? "ownership"
                  : spec.group === 1n
                    ? "group"
                    : undefined
          const tier = spec.medium === "CPU" ? "host_pinned" : spec.medium === "STORAGE" ? "disk" : "device"
          if (reason !== undefined) skipped[reason]++
          else if (spec.removed) expected.push(["Removed", spec.hashes, tier])
          else
            expected.push(["Stored", spec.partial && size > 1 ? spec.hashes.slice(0, -1) : spec.hashes, tier])
        }
        const batch = decoded(vllmBatch(events, { version: "current", dpRank: 0n }), { kvBlockSize: size })
        expect(batch.skipped).toEqual(skipped)
        const got = batch.events
          .filter(
            (e) => !(e.data._tag === "Removed" && e.data.blockHashes.length === 0 && expected.length === 0)
          )
          .map((e) => [
            e.data._tag,
            e.data._tag === "Cleared" ? [] : hashPairsToBigInts(e.data.blockHashes),
            e.storageTier
          ])
        expect(got).toEqual(expected)
      }),
      { numRuns: 300 }
    )
  })
})
