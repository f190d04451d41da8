import { readFile } from "node:fs/promises"
import fc from "fast-check"
import { describe, expect, it } from "vitest"
import { buildWasm, renderWasmModule, WASM_MODULES } from "../../scripts/build-xxh3-wasm.mjs"
import { CkfAddressing, DEFAULT_SEED } from "../../src/ckf/addressing.js"
import { CKF_PROBE_WASM_BASE64 } from "../../src/ckf/ckfProbeWasm.generated.js"
import { CkfProbeWasm } from "../../src/ckf/probeWasm.js"
import { TransposedCkfTable } from "../../src/ckf/transposed.js"
import { mulberry } from "./referenceSearch.js"

// The wasm probe (addressing of a block hash and the 16 lanes' hit bits) against the TypeScript
// addressing and `TransposedCkfTable.probe` over the same words. The search built on it is
// checked against the plain §8.2 reference in globalSearch.test.ts.

describe("the global consumer's wasm probe (ckfProbe.wat)", () => {
  it("commits exactly the bytes and module text the build script makes from the .wat", async () => {
    const built = await buildWasm("ckfProbe")
    expect(Buffer.from(CKF_PROBE_WASM_BASE64, "base64").equals(Buffer.from(built))).toBe(true)
    expect(await readFile(WASM_MODULES.ckfProbe.generatedPath, "utf8")).toBe(
      renderWasmModule("ckfProbe", built)
    )
  })

  it("runs on WebAssembly SIMD on this host", () => {
    expect(CkfProbeWasm.make(new CkfAddressing(DEFAULT_SEED, 16))).toBeDefined()
  })

  it("answers every lane as the TypeScript addressing and probe do", () => {
    fc.assert(
      fc.property(
        fc.integer({ min: 1, max: 12 }),
        fc.bigInt({ min: 0n, max: (1n << 64n) - 1n }),
        fc.constantFrom(0, 0.1, 0.5, 1),
        fc.integer({ min: 0, max: 0x7fff_ffff }),
        (bucketLog, seed, fill, prng) => {
          const random = mulberry(prng)
          const bucketCount = 1 << bucketLog
          const addressing = new CkfAddressing(seed, bucketCount)
          const probe = CkfProbeWasm.make(addressing)
          if (probe === undefined) throw new Error("no wasm probe")
          const table = new TransposedCkfTable(bucketCount, probe.words)
          const slots = new Uint16Array(probe.words.buffer, probe.words.byteOffset, probe.words.length * 2)
          for (let i = 0; i < slots.length; i++) if (random() < fill) slots[i] = Math.floor(random() * 65536)
          const mixed = new Uint32Array(2)
          for (let k = 0; k < 64; k++) {
            mixed[0] = Math.floor(random() * 2 ** 32)
            // Every eighth hash has fingerprint bits 0, which address as fingerprint 1.
            mixed[1] = k % 8 === 0 ? Math.floor(random() * 65536) << 16 : Math.floor(random() * 2 ** 32)
            addressing.unmix(mixed)
            const hi = mixed[0]!
            const lo = mixed[1]!
            addressing.prepareHalves(hi, lo)
            const { fp, a, b } = addressing
            if (k % 8 === 0) expect(fp).toBe(1)
            // Plant the fingerprint in some lanes' bucket a or b (any slot), so hits are common.
            for (let lane = 0; lane < 16; lane++) {
              if (random() < 0.3)
                slots[((random() < 0.5 ? a : b) * 16 + lane) * 4 + Math.floor(random() * 4)] = fp
            }
            expect(probe.probeHash(hi, lo)).toBe(table.probe(fp, a, b))
          }
        }
      ),
      { numRuns: 200 }
    )
  })
})
