import { readFile } from "node:fs/promises"
import fc from "fast-check"
import { createXXHash3 } from "hash-wasm"
import { afterEach, describe, expect, it, vi } from "vitest"
import { buildWasm, renderWasmModule, WASM_MODULES } from "../../scripts/build-xxh3-wasm.mjs"
import { Xxh3Seeded, xxh3Words17to128Into } from "../../src/ckf/xxh3.js"
import { XXH3_TOKENS_WASM_BASE64 } from "../../src/ckf/xxh3TokensWasm.generated.js"
import { chainWasm, localHashesWasm, xxh3TokensWasmAvailable } from "../../src/ckf/xxh3TokensWasm.js"

const u32 = fc.integer({ min: 0, max: 0xffff_ffff })

/** XXH3-64 of the little-endian words by hash-wasm, as [hi, lo]. */
const oracleWords = async (words: Uint32Array, seedHi: number, seedLo: number): Promise<[number, number]> => {
  const hasher = await createXXHash3(seedLo, seedHi)
  hasher.init()
  hasher.update(new Uint8Array(words.buffer, words.byteOffset, words.byteLength))
  const hex = hasher.digest("hex")
  return [Number.parseInt(hex.slice(0, 8), 16), Number.parseInt(hex.slice(8), 16)]
}

describe("xxh3TokensWasm", () => {
  afterEach(() => {
    vi.unstubAllGlobals()
    vi.resetModules()
  })

  it("commits exactly the bytes and module text the build script makes from the .wat", async () => {
    const built = await buildWasm("xxh3Tokens")
    expect(Buffer.from(XXH3_TOKENS_WASM_BASE64, "base64").equals(Buffer.from(built))).toBe(true)
    expect(await readFile(WASM_MODULES.xxh3Tokens.generatedPath, "utf8")).toBe(
      renderWasmModule("xxh3Tokens", built)
    )
  })

  it("runs on WebAssembly on this host", () => {
    expect(xxh3TokensWasmAvailable).toBe(true)
  })

  it("hashes token windows as hash-wasm and the TypeScript word path do", async () => {
    const samples = fc.sample(
      fc.record({
        window: fc.integer({ min: 5, max: 32 }),
        extra: fc.integer({ min: 0, max: 1 }),
        blocks: fc.integer({ min: 1, max: 12 }),
        seedHi: u32,
        seedLo: u32,
        from: fc.integer({ min: 0, max: 5 }),
        words: fc.array(u32, { minLength: 12 * 33 + 5, maxLength: 12 * 33 + 5 }),
        asArray: fc.boolean()
      }),
      150
    )
    for (const { window, extra, blocks, seedHi, seedLo, from, words, asArray } of samples) {
      // stride = window (standard) or window - 1 (Eagle: each block reads the next one's first token)
      const stride = window - extra
      const input = Uint32Array.from(words)
      const out = new Uint32Array(2 * blocks)
      expect(
        localHashesWasm(asArray ? words : input, from, blocks, window, stride, seedHi, seedLo, out, 0)
      ).toBe(true)
      const ts = new Uint32Array(2 * blocks)
      for (let b = 0; b < blocks; b++) {
        xxh3Words17to128Into(input, from + b * stride, window, seedHi, seedLo, ts, b)
        const at = from + b * stride
        expect([out[2 * b], out[2 * b + 1]]).toEqual(
          await oracleWords(input.subarray(at, at + window), seedHi, seedLo)
        )
      }
      expect(out).toEqual(ts)
    }
  })

  it("hashes prompts longer than one piece of the module's window", () => {
    const blocks = 2500
    const tokens = Array.from({ length: blocks * 16 + 7 }, (_, i) => (i * 7919) % 150_000)
    const out = new Uint32Array(2 * blocks)
    localHashesWasm(tokens, 0, blocks, 16, 16, 0, 1337, out, 0)
    const ts = new Uint32Array(2 * blocks)
    const words = Uint32Array.from(tokens)
    for (let b = 0; b < blocks; b++) xxh3Words17to128Into(words, 16 * b, 16, 0, 1337, ts, b)
    expect(out).toEqual(ts)
  })

  it("chains sequence hashes as the TypeScript chain does, across pieces and parents", () => {
    fc.assert(
      fc.property(
        fc.integer({ min: 0, max: 2100 }),
        fc.boolean(),
        u32,
        u32,
        fc.bigInt({ min: 0n, max: (1n << 64n) - 1n }),
        fc.integer({ min: 0, max: 3 }),
        (count, hasParent, parentHi, parentLo, seed, at) => {
          const local = new Uint32Array(2 * count)
          for (let i = 0; i < local.length; i++) local[i] = Math.imul(i + 1, 0x9e37_79b1) ^ parentLo
          const hasher = new Xxh3Seeded(seed)
          const out = new Uint32Array(2 * (count + at))
          expect(
            chainWasm(local, 0, count, hasParent, parentHi, parentLo, hasher.seedHi, hasher.seedLo, out, at)
          ).toBe(true)
          const ts = new Uint32Array(2 * (count + at))
          hasher.chainInto(
            local,
            0,
            count,
            hasParent ? Uint32Array.of(parentHi, parentLo) : undefined,
            0,
            ts,
            at
          )
          expect(out).toEqual(ts)
        }
      ),
      { numRuns: 60 }
    )
  })

  it("leaves the TypeScript path to serve token hashing where WebAssembly is missing", async () => {
    const prompt = Array.from({ length: 16 * 40 }, (_, i) => i)
    // hash-wasm needs WebAssembly too: the expected hashes come first.
    const expected: Array<number> = []
    for (let b = 0; b < 40; b++)
      expected.push(...(await oracleWords(Uint32Array.from(prompt.slice(16 * b, 16 * b + 16)), 0, 1337)))
    const hasher = new Xxh3Seeded(1337n)
    const chainedTs = new Uint32Array(80)
    hasher.chainInto(Uint32Array.from(expected), 0, 40, undefined, 0, chainedTs, 0)
    vi.stubGlobal("WebAssembly", undefined)
    vi.resetModules()
    const wasm = await import("../../src/ckf/xxh3TokensWasm.js")
    expect(wasm.xxh3TokensWasmAvailable).toBe(false)
    const tokens = await import("../../src/ckf/tokens.js")
    const local = tokens.localBlockHashes(prompt, 16)
    expect(Array.from(local)).toEqual(expected)
    expect(tokens.sequenceHashes(local)).toEqual(chainedTs)
  })
})
