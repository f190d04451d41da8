/**
 * XXH3-64 as the CKF uses it (ckf-core.md §1). Where the expected values come from:
 *
 * - The 8-byte vectors (`mixed = XXH3(LE8(h), seed)` for the default seed) and the 2-byte
 *   fingerprint vector (`XXH3(LE2(0x0001), seed XOR golden)`) are the CKF reference vectors of
 *   ckf-core.md §1 ("Test vectors" and "More vectors"; also ckf-vectors.txt). Those notes say
 *   they come from their author's own re-implementation, checked against libxxhash, and are not
 *   upstream test data; so each is also checked here against hash-wasm's XXH3, a WebAssembly
 *   build of the xxHash C sources that shares no code with ours or with those notes.
 * - The lengths up to 2100 bytes are compared with hash-wasm directly, unseeded and seeded.
 * - The batch form is compared with `xxh3Hash`, and its inverse with the input.
 */

import fc from "fast-check"
import { createXXHash3 } from "hash-wasm"
import { describe, expect, it } from "vitest"
import { U64_MAX } from "../../src/ckf/u64.js"
import { Xxh3Seeded, xxh3Hash, xxh3U64Batch, xxh3U64Invert, xxhOut } from "../../src/ckf/xxh3.js"

const DEFAULT_SEED = 0x5deece66d1b54a33n
const GOLDEN = 0x9e3779b97f4a7c15n

/** ckf-core.md §1 "Test vectors": h → XXH3(LE8(h), DEFAULT_SEED). */
const REFERENCE_8_BYTE: ReadonlyArray<readonly [bigint, bigint]> = [
  [0n, 0x85a2ceae045eb49en],
  [1n, 0xea2d49b1fa7fbabfn],
  [11n, 0xb2ceddfe4195d6f8n],
  [0x0123456789abcdefn, 0x34bd6fb39b877d61n],
  [0xffffffffffffffffn, 0xa0dd3e19ca49500an]
]
/** ckf-core.md §1 "More vectors": XXH3(LE2(0x0001), DEFAULT_SEED XOR golden). */
const FINGERPRINT_VECTOR = 0x1238a4fac4ded55bn

const le8 = (v: bigint) => {
  const b = new Uint8Array(8)
  new DataView(b.buffer).setBigUint64(0, BigInt.asUintN(64, v), true)
  return b
}

describe("xxh3", () => {
  it("the reference vectors are XXH3's own: hash-wasm gives them too", async () => {
    const oracleOf = (seed: bigint) => createXXHash3(Number(seed & 0xffff_ffffn), Number(seed >> 32n))
    const check = async (input: Uint8Array, seed: bigint, expected: bigint) => {
      const oracle = await oracleOf(seed)
      oracle.init()
      oracle.update(input)
      expect(BigInt(`0x${oracle.digest("hex")}`)).toBe(expected)
    }
    for (const [h, mixed] of REFERENCE_8_BYTE) await check(le8(h), DEFAULT_SEED, mixed)
    await check(new Uint8Array([1, 0]), DEFAULT_SEED ^ GOLDEN, FINGERPRINT_VECTOR)
  })

  it("matches the reference vectors for 8-byte inputs", () => {
    const seeded = new Xxh3Seeded(DEFAULT_SEED)
    for (const [h, mixed] of REFERENCE_8_BYTE) {
      expect(xxh3Hash(le8(h), DEFAULT_SEED)).toBe(mixed)
      seeded.hashU64(Number(h >> 32n), Number(h & 0xffffffffn))
      expect((BigInt(xxhOut.hi) << 32n) | BigInt(xxhOut.lo)).toBe(mixed)
    }
  })

  it("matches the 2-byte fingerprint vector", () => {
    const seeded = new Xxh3Seeded(DEFAULT_SEED ^ GOLDEN)
    seeded.hashU16(1)
    expect((BigInt(xxhOut.hi) << 32n) | BigInt(xxhOut.lo)).toBe(FINGERPRINT_VECTOR)
    expect(xxh3Hash(new Uint8Array([1, 0]), DEFAULT_SEED ^ GOLDEN)).toBe(FINGERPRINT_VECTOR)
  })

  it("agrees with an independent implementation on every length up to 2100 bytes", async () => {
    const oracle = await createXXHash3(0, 0)
    const seededOracle = await createXXHash3(0x12345678, 0x9abcdef0)
    const bytes = new Uint8Array(2100)
    let x = 0x1234567
    for (let i = 0; i < bytes.length; i++) {
      x = (Math.imul(x, 1103515245) + 12345) >>> 0
      bytes[i] = x >>> 24
    }
    for (let len = 0; len <= 2100; len += len < 300 ? 1 : 37) {
      const slice = bytes.subarray(3, 3 + Math.min(len, bytes.length - 3))
      oracle.init()
      oracle.update(slice)
      expect(xxh3Hash(slice).toString(16)).toBe(BigInt(`0x${oracle.digest("hex")}`).toString(16))
      seededOracle.init()
      seededOracle.update(slice)
      expect(xxh3Hash(slice, 0x9abcdef012345678n).toString(16)).toBe(
        BigInt(`0x${seededOracle.digest("hex")}`).toString(16)
      )
    }
  })

  it("the batch form hashes 8-byte inputs like xxh3Hash, and its inverse gives the input back", () => {
    fc.assert(
      fc.property(
        fc.array(fc.bigInt({ min: 0n, max: U64_MAX }), { minLength: 1, maxLength: 9 }),
        fc.bigInt({ min: 0n, max: U64_MAX }),
        fc.nat({ max: 3 }),
        (values, seed, offset) => {
          const seeded = new Xxh3Seeded(seed)
          // Inputs and outputs at different offsets of one buffer: in-place use must work too.
          const buf = new Uint32Array(2 * (values.length + offset))
          values.forEach((v, i) => {
            buf[2 * (i + offset)] = Number(v >> 32n)
            buf[2 * (i + offset) + 1] = Number(v & 0xffff_ffffn)
          })
          xxh3U64Batch(seeded.bitflip8, buf, 2 * offset, values.length, buf, 0)
          const one = new Uint32Array(2)
          values.forEach((v, i) => {
            const mixed = xxh3Hash(le8(v), seed)
            expect((BigInt(buf[2 * i]!) << 32n) | BigInt(buf[2 * i + 1]!)).toBe(mixed)
            one[0] = buf[2 * i]!
            one[1] = buf[2 * i + 1]!
            xxh3U64Invert(seeded.bitflip8, one)
            expect((BigInt(one[0]!) << 32n) | BigInt(one[1]!)).toBe(v)
          })
        }
      ),
      { numRuns: 500 }
    )
  })
})
