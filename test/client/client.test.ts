/** `kvrelay/client`: what a TypeScript router imports to hash prompts as the relays address them. */

import { readFileSync } from "node:fs"
import { dirname, resolve } from "node:path"
import { fileURLToPath } from "node:url"
import { describe, expect, it } from "vitest"
import { hashPairsToBigInts } from "../../src/ckf/u64.js"
import {
  localBlockHashes,
  localBlockHashPairs,
  sequenceHashes,
  sequenceHashPairs
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
