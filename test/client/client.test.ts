/** `kvrelay/client`: what a TypeScript router imports to hash prompts as the relays address them. */

import { readFileSync } from "node:fs"
import { dirname, resolve } from "node:path"
import { fileURLToPath } from "node:url"
import { describe, expect, it } from "vitest"
import { hashPairsToBigInts } from "../../src/ckf/u64.js"
import {
  blockHashSeed,
  localBlockHashes,
  localBlockHashPairs,
  sequenceHashes,
  sequenceHashPairs,
  TOKENS_HASH_SEED
} from "../../src/client/index.js"

describe("kvrelay/client", () => {
  it("hashes tokens into Dynamo's local and sequence hashes", () => {
    const tokens = Array.from({ length: 14 }, (_, i) => i + 1)
    // Dynamo `lib/tokens` vectors (block size 4, seeds 1337); tokens 13 and 14 are a partial block.
    const local = localBlockHashes(tokens, 4)
    expect(local).toEqual([14643705804678351452n, 16777012769546811212n, 483935686894639516n])
    expect(sequenceHashes(local)).toEqual([
      14643705804678351452n,
      4945711292740353085n,
      12583592247330656132n
    ])
    expect(hashPairsToBigInts(sequenceHashPairs(localBlockHashPairs(tokens, 4)))).toEqual(
      sequenceHashes(local)
    )
  })

  it("folds a cache salt into the local hashes as the relay does for blocks stored under it", () => {
    const tokens = Array.from({ length: 8 }, (_, i) => i + 1)
    const plain = localBlockHashes(tokens, 4)
    const salted = localBlockHashes(tokens, 4, { cacheSalt: "tenant-a" })
    expect(salted).not.toEqual(plain)
    expect(localBlockHashes(tokens, 4, { cacheSalt: "" })).toEqual(plain)
    // The seed of both blocks: 1337 + XXH3-64("tenant-a", seed 1) (mod 2^64).
    expect(blockHashSeed(undefined, "tenant-a")).not.toBe(TOKENS_HASH_SEED)
    expect(hashPairsToBigInts(localBlockHashPairs(tokens, 4, { cacheSalt: "tenant-a" }))).toEqual(salted)
  })

  it("imports nothing outside the CKF core (no Effect, no I/O), transitively", () => {
    const seen = new Set<string>()
    const visit = (file: string): void => {
      if (seen.has(file)) return
      seen.add(file)
      const text = readFileSync(file, "utf8")
      for (const [, spec] of text.matchAll(/^(?:import|export|\})[^\n]* from "([^"]+)"/gm)) {
        expect([file, spec!.startsWith(".")]).toEqual([file, true])
        visit(resolve(dirname(file), spec!.replace(/\.js$/, ".ts")))
      }
    }
    visit(fileURLToPath(new URL("../../src/client/index.ts", import.meta.url)))
    for (const file of seen) expect(file).toMatch(/src\/(client|ckf)\//)
  })
})
