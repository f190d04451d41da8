import { readFile } from "node:fs/promises"
import fc from "fast-check"
import { createXXHash3 } from "hash-wasm"
import { afterEach, describe, expect, it, vi } from "vitest"
import { buildXxh3Wasm, GENERATED_PATH, renderXxh3WasmModule } from "../../scripts/build-xxh3-wasm.mjs"
import { xxh3Hash, xxh3Low32 } from "../../src/ckf/xxh3.js"
import { XXH3_WASM_BASE64 } from "../../src/ckf/xxh3Wasm.generated.js"
import {
  XXH3_WASM_MIN_LENGTH,
  xxh3HashFast,
  xxh3Low32Fast,
  xxh3WasmAvailable
} from "../../src/ckf/xxh3Wasm.js"

const oracle = await createXXHash3(0, 0)
const oracleHash = (bytes: Uint8Array): bigint => {
  oracle.init()
  oracle.update(bytes)
  return BigInt(`0x${oracle.digest("hex")}`)
}

const pseudoRandomBytes = (length: number, seed: number): Uint8Array => {
  const bytes = new Uint8Array(length)
  let x = seed >>> 0
  for (let i = 0; i < length; i++) {
    x = (Math.imul(x, 1103515245) + 12345) >>> 0
    bytes[i] = x >>> 24
  }
  return bytes
}

// Every short-input branch, then the long path around its stripe (64) and block (1024) edges;
// a last block under 64 bytes makes the final stripe reach back into the block before it.
const lengthArb = fc.oneof(
  fc.constant(0),
  fc.integer({ min: 1, max: 16 }),
  fc.integer({ min: 17, max: 128 }),
  fc.integer({ min: 129, max: 240 }),
  fc.integer({ min: 241, max: 8192 }),
  fc
    .tuple(fc.integer({ min: 4, max: 40 }), fc.integer({ min: -1, max: 1 }))
    .map(([stripes, delta]) => 64 * stripes + delta),
  fc
    .tuple(fc.integer({ min: 1, max: 70 }), fc.constantFrom(-65, -64, -63, -1, 0, 1, 63, 64, 65))
    .map(([blocks, delta]) => 1024 * blocks + delta),
  // Around the edges of the 64 KiB window through which the module's input is copied.
  fc
    .tuple(fc.integer({ min: 1, max: 3 }), fc.constantFrom(-1025, -1024, -1, 0, 1, 63, 64, 1023, 1024, 1025))
    .map(([windows, delta]) => 65_536 * windows + delta)
)

describe("xxh3Wasm", () => {
  afterEach(() => {
    vi.unstubAllGlobals()
    vi.resetModules()
  })

  it("commits exactly the bytes and module text the build script makes from the .wat", async () => {
    const built = await buildXxh3Wasm()
    expect(Buffer.from(XXH3_WASM_BASE64, "base64").equals(Buffer.from(built))).toBe(true)
    expect(await readFile(GENERATED_PATH, "utf8")).toBe(renderXxh3WasmModule(built))
  })

  it("runs on WebAssembly on this host", () => {
    expect(xxh3WasmAvailable).toBe(true)
  })

  it("agrees with the TypeScript XXH3 and hash-wasm on random lengths, bytes and offsets", () => {
    fc.assert(
      fc.property(
        lengthArb,
        fc.integer({ min: 0, max: 15 }),
        fc.integer({ min: 0, max: 0xffffffff }),
        (length, offset, seed) => {
          const buffer = pseudoRandomBytes(offset + length + 7, seed)
          const input = buffer.subarray(offset, offset + length)
          const expected = oracleHash(input)
          expect(xxh3Hash(buffer, 0n, offset, length)).toBe(expected)
          expect(xxh3HashFast(buffer, offset, length)).toBe(expected)
          expect(xxh3Low32Fast(buffer, offset, length)).toBe(Number(expected & 0xffff_ffffn))
          expect(xxh3Low32Fast(input)).toBe(xxh3Low32(input))
        }
      ),
      { numRuns: 400 }
    )
  })

  it("agrees on arbitrary bytes, not only generated streams", () => {
    fc.assert(
      fc.property(fc.uint8Array({ minLength: XXH3_WASM_MIN_LENGTH, maxLength: 3000 }), (bytes) => {
        expect(xxh3HashFast(bytes)).toBe(oracleHash(bytes))
      }),
      { numRuns: 200 }
    )
  })

  it("hashes a whole 4 MiB CBI1 frame body, unaligned, between short inputs", () => {
    const big = pseudoRandomBytes(4_194_368 + 3, 7)
    const small = pseudoRandomBytes(500, 8)
    expect(xxh3HashFast(small)).toBe(oracleHash(small))
    expect(xxh3HashFast(big, 3)).toBe(oracleHash(big.subarray(3)))
    expect(xxh3HashFast(big, 3)).toBe(xxh3Hash(big, 0n, 3))
    expect(xxh3HashFast(small)).toBe(oracleHash(small))
  })

  it("falls back to the TypeScript path where WebAssembly is missing", async () => {
    vi.stubGlobal("WebAssembly", undefined)
    vi.resetModules()
    const fallback = await import("../../src/ckf/xxh3Wasm.js")
    expect(fallback.xxh3WasmAvailable).toBe(false)
    for (const length of [0, 5, 100, 241, 5000]) {
      const bytes = pseudoRandomBytes(length, length)
      expect(fallback.xxh3HashFast(bytes)).toBe(oracleHash(bytes))
      expect(fallback.xxh3Low32Fast(bytes)).toBe(xxh3Low32(bytes))
    }
  })
})
