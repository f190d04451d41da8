/**
 * Cache salts (PROTOCOL §5.1 ◆3): folded into local hashes as Dynamo folds its cache namespace,
 * checked against hash-wasm's XXH3; a stored block's namespace read from an engine's event the
 * way Dynamo's ZMQ normalizer reads it, and inherited by a batch from its parent.
 */

import fc from "fast-check"
import { createXXHash3 } from "hash-wasm"
import { describe, expect, it } from "vitest"
import {
  AMBIGUOUS_CACHE_NAMESPACE,
  CacheNamespaces,
  cacheNamespaceOfExtraKeys,
  storedEventCacheNamespace
} from "../../src/ckf/cacheNamespace.js"
import { blockHashSeed, localBlockHashes } from "../../src/ckf/tokens.js"
import { hashPairs, hashPairsToBigInts } from "../../src/ckf/u64.js"

const U64 = (1n << 64n) - 1n
const utf8 = new TextEncoder()

/** hash-wasm's XXH3-64 of `bytes` with a 64-bit seed. */
const xxh3 = async (bytes: Uint8Array, seed: bigint): Promise<bigint> => {
  const hasher = await createXXHash3(Number(seed & 0xffff_ffffn), Number(seed >> 32n))
  hasher.init()
  hasher.update(bytes)
  return BigInt(`0x${hasher.digest("hex")}`)
}

describe("cache salt in local hashes", () => {
  it("seeds as Dynamo's compute_salt_hash: 1337 + XXH3(lora, 0) + XXH3(salt, 1), empty strings absent", async () => {
    // lib/kv-hashing/src/salt.rs (`compute_salt_hash`), the seed lib/kv-router/src/protocols.rs's
    // `block_hash_seed` gives `compute_block_hash_for_seq`.
    expect(blockHashSeed(undefined, undefined)).toBe(1337n)
    expect(blockHashSeed("", "")).toBe(1337n)
    expect(blockHashSeed(null, null)).toBe(1337n)
    expect(blockHashSeed(undefined, "tenant-a")).toBe(
      (1337n + (await xxh3(utf8.encode("tenant-a"), 1n))) & U64
    )
    expect(blockHashSeed("adapter-a", "tenant-a")).toBe(
      (1337n + (await xxh3(utf8.encode("adapter-a"), 0n)) + (await xxh3(utf8.encode("tenant-a"), 1n))) & U64
    )
    // A salt equal to an adapter's name salts differently from the adapter (seed 1 against 0).
    expect(blockHashSeed(undefined, "x")).not.toBe(blockHashSeed("x", undefined))
  })

  it("agrees with hash-wasm's XXH3 on random tokens, LoRA names and salts", async () => {
    const samples = fc.sample(
      fc.record({
        tokens: fc.array(fc.integer({ min: 0, max: 0xffff_ffff }), { maxLength: 120 }),
        blockSize: fc.integer({ min: 1, max: 40 }),
        lora: fc.option(fc.string({ maxLength: 10 }), { nil: undefined }),
        salt: fc.option(fc.string({ maxLength: 20 }), { nil: undefined })
      }),
      150
    )
    for (const { tokens, blockSize, lora, salt } of samples) {
      let seed = 1337n
      if (lora !== undefined && lora !== "") seed += await xxh3(utf8.encode(lora), 0n)
      if (salt !== undefined && salt !== "") seed += await xxh3(utf8.encode(salt), 1n)
      seed &= U64
      const expected: Array<bigint> = []
      for (let b = 0; (b + 1) * blockSize <= tokens.length; b++) {
        const words = Uint32Array.from(tokens.slice(b * blockSize, (b + 1) * blockSize))
        expected.push(await xxh3(new Uint8Array(words.buffer), seed))
      }
      const got = localBlockHashes(tokens, blockSize, { loraName: lora, cacheSalt: salt })
      expect(hashPairsToBigInts(got)).toEqual(expected)
    }
  })

  it("separates prompts: the same tokens under two salts, or salted and not, hash apart from block 0", () => {
    const tokens = Array.from({ length: 64 }, (_, i) => i)
    const plain = hashPairsToBigInts(localBlockHashes(tokens, 16))
    const a = hashPairsToBigInts(localBlockHashes(tokens, 16, { cacheSalt: "a" }))
    const b = hashPairsToBigInts(localBlockHashes(tokens, 16, { cacheSalt: "b" }))
    for (let i = 0; i < plain.length; i++) {
      expect(a[i]).not.toBe(plain[i])
      expect(a[i]).not.toBe(b[i])
    }
    expect(hashPairsToBigInts(localBlockHashes(tokens, 16, { cacheSalt: "" }))).toEqual(plain)
  })
})

describe("a stored block's cache namespace", () => {
  const tagged = (namespace: string) => `dynamo-cache-salt:${namespace}`
  const hex = "0123456789abcdef00112233445566778899aabbccddeefffedcba9876543210"

  it("reads vLLM's extra_keys as Dynamo's extra_keys_to_cache_namespace does", () => {
    // Cases of lib/kv-router/src/zmq_wire/extra_keys.rs's and zmq_wire/tests.rs's tests.
    expect(cacheNamespaceOfExtraKeys([[tagged("tenant-a")]])).toBe("tenant-a")
    expect(cacheNamespaceOfExtraKeys([["adapter-a", hex, tagged("tenant-a")]], "adapter-a")).toBe("tenant-a")
    expect(cacheNamespaceOfExtraKeys([[tagged(hex)]])).toBe(hex)
    // A namespace equal to the LoRA name: the first key equal to the name is the adapter's.
    expect(cacheNamespaceOfExtraKeys([["adapter-a", tagged("adapter-a")]], "adapter-a")).toBe("adapter-a")
    // Even a LoRA name that looks tagged is the adapter's key, not the namespace (once).
    expect(cacheNamespaceOfExtraKeys([[tagged("x"), tagged("y")]], tagged("x"))).toBe("y")
    expect(cacheNamespaceOfExtraKeys([[tagged("x"), tagged("x")]], tagged("x"))).toBe("x")
    // Untagged strings, byte strings, `[id, offset]` pairs and an empty tag are no namespace.
    expect(cacheNamespaceOfExtraKeys([["tenant-a"]])).toBeUndefined()
    expect(cacheNamespaceOfExtraKeys([[utf8.encode("prompt-embed")]])).toBeUndefined()
    expect(cacheNamespaceOfExtraKeys([[[tagged("x"), 3]]])).toBeUndefined()
    expect(cacheNamespaceOfExtraKeys([[tagged("")]])).toBeUndefined()
    // Only the first block carries vLLM's cache salt.
    expect(cacheNamespaceOfExtraKeys([null, [tagged("tenant-a")]])).toBeUndefined()
    expect(cacheNamespaceOfExtraKeys([])).toBeUndefined()
    expect(cacheNamespaceOfExtraKeys(null)).toBeUndefined()
  })

  it("prefers a map-encoded event's cache_salt (SGLang) to extra_keys, an empty one meaning none", () => {
    expect(storedEventCacheNamespace({ cacheSalt: "tenant-a" })).toBe("tenant-a")
    expect(storedEventCacheNamespace({ cacheSalt: "s", extraKeys: [[tagged("t")]] })).toBe("s")
    expect(storedEventCacheNamespace({ cacheSalt: null, extraKeys: [[tagged("t")]] })).toBe("t")
    expect(storedEventCacheNamespace({ cacheSalt: "", extraKeys: [[tagged("t")]] })).toBeUndefined()
    expect(storedEventCacheNamespace({ extraKeys: [[tagged("t")]], loraName: null })).toBe("t")
    expect(storedEventCacheNamespace({})).toBeUndefined()
  })

  it("inherits a parent's namespace as Dynamo's ZmqEventNormalizer does", () => {
    const ns = new CacheNamespaces()
    const h = (...values: Array<number>) => hashPairs(values.map(BigInt))
    // test_normalizer_propagates_cache_namespace_from_parent / shares_cache_namespace_across_blocks.
    expect(ns.stored("7/0", h(1, 2), undefined, "tenant-a")).toBe("tenant-a")
    expect(ns.stored("7/0", h(3), h(2), undefined)).toBe("tenant-a")
    // Another rank's blocks are its own.
    expect(ns.stored("7/1", h(4), h(2), undefined)).toBeUndefined()
    // test_normalizer_treats_empty_namespace_as_absent.
    expect(ns.stored("7/0", h(5), h(3), "")).toBe("tenant-a")
    // test_normalizer_rejects_ambiguous_parent_cache_namespace.
    expect(ns.stored("7/0", h(10), undefined, "tenant-a")).toBe("tenant-a")
    expect(ns.stored("7/0", h(10), undefined, "tenant-b")).toBe("tenant-b")
    expect(ns.stored("7/0", h(11), h(10), undefined)).toBe(AMBIGUOUS_CACHE_NAMESPACE)
    // Stored again without a namespace, a salted block becomes ambiguous too.
    expect(ns.stored("7/0", h(1), undefined, undefined)).toBeUndefined()
    expect(ns.stored("7/0", h(12), h(1), undefined)).toBe(AMBIGUOUS_CACHE_NAMESPACE)
    // A parent unknown here (an unsalted one, or one from before the relay joined) is unsalted.
    expect(ns.stored("7/0", h(13), h(999), undefined)).toBeUndefined()
    // A removal forgets a block (not an ambiguous one); a clear forgets the member.
    ns.removed("7/0", h(2, 10))
    expect(ns.stored("7/0", h(14), h(2), undefined)).toBeUndefined()
    expect(ns.stored("7/0", h(15), h(10), undefined)).toBe(AMBIGUOUS_CACHE_NAMESPACE)
    ns.cleared("7/0")
    expect(ns.stored("7/0", h(16), h(3), undefined)).toBeUndefined()
    expect(ns.stored("7/0", h(17), h(10), undefined)).toBeUndefined()
    expect(ns.size).toBe(0)
  })

  it("agrees with a plain model of the normalizer's map, and keeps no namespace nobody holds", () => {
    type State = string | typeof AMBIGUOUS_CACHE_NAMESPACE
    const op = fc.record({
      kind: fc.constantFrom("stored", "stored", "stored", "removed", "cleared"),
      member: fc.constantFrom("1/0", "1/1"),
      blocks: fc.array(fc.integer({ min: 1, max: 12 }), { minLength: 1, maxLength: 3 }),
      parent: fc.option(fc.integer({ min: 1, max: 12 }), { nil: undefined }),
      namespace: fc.option(fc.constantFrom("", "a", "b"), { nil: undefined })
    })
    fc.assert(
      fc.property(fc.array(op, { maxLength: 60 }), (ops) => {
        const ns = new CacheNamespaces()
        const model = new Map<string, State>()
        for (const o of ops) {
          const blocks = hashPairs(o.blocks.map(BigInt))
          const key = (b: number) => `${o.member}:${b}`
          if (o.kind === "removed") {
            ns.removed(o.member, blocks)
            for (const b of o.blocks)
              if (model.get(key(b)) !== AMBIGUOUS_CACHE_NAMESPACE) model.delete(key(b))
            continue
          }
          if (o.kind === "cleared") {
            ns.cleared(o.member)
            for (const k of [...model.keys()]) if (k.startsWith(`${o.member}:`)) model.delete(k)
            continue
          }
          const own = o.namespace === "" ? undefined : o.namespace
          const inherited = own === undefined && o.parent !== undefined ? model.get(key(o.parent)) : undefined
          const expected = own ?? inherited
          const got = ns.stored(
            o.member,
            blocks,
            o.parent === undefined ? undefined : hashPairs([BigInt(o.parent)]),
            o.namespace
          )
          expect(got).toBe(expected)
          if (expected === AMBIGUOUS_CACHE_NAMESPACE) continue
          for (const b of o.blocks) {
            const was = model.get(key(b))
            if (expected === undefined) {
              if (was !== undefined) model.set(key(b), AMBIGUOUS_CACHE_NAMESPACE)
            } else if (was === undefined) model.set(key(b), expected)
            else if (was !== expected) model.set(key(b), AMBIGUOUS_CACHE_NAMESPACE)
          }
        }
        expect(ns.size).toBe(model.size)
        const names = new Set([...model.values()].filter((v) => v !== AMBIGUOUS_CACHE_NAMESPACE))
        expect(ns.namespaceCount).toBe(names.size)
      }),
      { numRuns: 300 }
    )
  })
})
