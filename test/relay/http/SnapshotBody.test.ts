/**
 * The streamed snapshot body: its slices concatenate to exactly the JSON text the schema encodes
 * for the same snapshot, whatever the number of words relative to the slice size.
 */

import { describe, expect, it } from "@effect/vitest"
import { Either } from "effect"
import * as fc from "fast-check"
import { DcCkfFormatIdentity } from "../../../src/ckf/identity.js"
import { encodeJsonText } from "../../../src/protocol/Json.js"
import { DiagnosticSnapshotJson } from "../../../src/protocol/RelayApi.js"
import {
  SNAPSHOT_SLICE_BYTES,
  type SnapshotHead,
  snapshotBody
} from "../../../src/relay/http/internal/SnapshotBody.js"

const encodeWhole = encodeJsonText(DiagnosticSnapshotJson)

// The document does not tie the format's bucket count to the words' length.
const HEAD: SnapshotHead = {
  layoutGeneration: 18_446_744_073_709_551_615n,
  sequence: 42n,
  memberCount: 3,
  uniqueBlockCount: 77,
  format: new DcCkfFormatIdentity(0x9e37_79b9_7f4a_7c15n, 1024)
}

const streamed = (words: Uint32Array): { text: string; pieces: number; byteLength: number } => {
  const body = Either.getOrThrow(snapshotBody(HEAD, words))
  const pieces: Array<Uint8Array> = []
  for (let next = body.next(); next !== undefined; next = body.next()) pieces.push(next)
  expect(body.next()).toBeUndefined()
  const bytes = Buffer.concat(pieces)
  return { text: bytes.toString("utf8"), pieces: pieces.length, byteLength: body.byteLength }
}

const randomWords = (buckets: number, seed: number): Uint32Array => {
  const words = new Uint32Array(2 * buckets)
  let x = seed >>> 0 || 1
  for (let i = 0; i < words.length; i++) {
    x ^= x << 13
    x ^= x >>> 17
    x ^= x << 5
    words[i] = x >>> 0
  }
  return words
}

/** u64 words per slice. */
const SLICE_WORDS = SNAPSHOT_SLICE_BYTES / 8

describe("SnapshotBody", () => {
  it("slices are whole base64 quanta and whole u64 words", () => {
    expect(SNAPSHOT_SLICE_BYTES % 3).toBe(0)
    expect(SNAPSHOT_SLICE_BYTES % 8).toBe(0)
  })

  it.each([1, 2, SLICE_WORDS - 1, SLICE_WORDS, SLICE_WORDS + 1, 3 * SLICE_WORDS + 5])(
    "%i buckets stream to exactly the schema's JSON text",
    (buckets) => {
      const words = randomWords(buckets, buckets)
      const whole = Either.getOrThrow(encodeWhole({ ...HEAD, buckets: words }))
      const { text, pieces, byteLength } = streamed(words)
      expect(text).toBe(whole)
      expect(byteLength).toBe(Buffer.byteLength(whole))
      // Prefix, one piece per slice, closing quote and brace.
      expect(pieces).toBe(2 + Math.ceil((8 * buckets) / SNAPSHOT_SLICE_BYTES))
    }
  )

  it("random filters round-trip through the JSON decoder", () => {
    fc.assert(
      fc.property(fc.integer({ min: 1, max: 2048 }), fc.integer(), (buckets, seed) => {
        const words = randomWords(buckets, seed)
        const { text } = streamed(words)
        const document = JSON.parse(text) as { buckets: string }
        const bytes = Buffer.from(document.buckets, "base64")
        const expected = Buffer.alloc(8 * buckets)
        for (let i = 0; i < words.length; i++) expected.writeUInt32LE(words[i]!, 4 * i)
        expect(bytes.equals(expected)).toBe(true)
      }),
      { numRuns: 50 }
    )
  })
})
