import fc from "fast-check"
import { createXXHash3 } from "hash-wasm"
import { describe, expect, it } from "vitest"
import {
  CBI1_FLAG_DELTA,
  CBI1_FLAG_SNAPSHOT_CHUNK,
  CBI1_HEADER_BYTES,
  CBI1_MAX_DELTA_IMAGES,
  CBI1_MAX_FRAME_BYTES,
  Cbi1Error,
  type Cbi1ErrorReason,
  type Cbi1Expected,
  type Cbi1Frame,
  Cbi1SnapshotAssembler,
  type Cbi1SnapshotChunk,
  decodeCbi1,
  encodeCbi1Delta,
  encodeCbi1Snapshot,
  SNAPSHOT_CHUNK_BUCKETS
} from "../../src/ckf/cbi1.js"
import { DcCkfFormatIdentity } from "../../src/ckf/identity.js"
import { xxh3Low32 } from "../../src/ckf/xxh3.js"

const SEED = 0x5dee_ce66_d1b5_4a33n
const DC = 0x0123_4567_89ab_cdefn

const expectedFor = (bucketCount: number, dcId: bigint = DC, seed: bigint = SEED): Cbi1Expected => ({
  format: new DcCkfFormatIdentity(seed, bucketCount),
  dcId
})

/** Deterministic pseudo-random u32s (xorshift32), so failures reproduce. */
const randomU32s = (length: number, seed = 0x9e3779b9): Uint32Array => {
  const out = new Uint32Array(length)
  let x = seed >>> 0 || 1
  for (let i = 0; i < length; i++) {
    x ^= x << 13
    x ^= x >>> 17
    x ^= x << 5
    out[i] = x >>> 0
  }
  return out
}

/** Snapshot words with a sprinkling of empty buckets, like a real partially filled table. */
const snapshotWords = (bucketCount: number, seed?: number): Uint32Array => {
  const words = randomU32s(2 * bucketCount, seed)
  for (let b = 0; b < bucketCount; b += 3) {
    words[2 * b] = 0
    words[2 * b + 1] = 0
  }
  return words
}

const randomImages = (count: number, bucketCount: number, seed?: number): Uint32Array => {
  const images = randomU32s(3 * count, seed)
  for (let i = 0; i < images.length; i += 3) images[i] = images[i]! % bucketCount
  return images
}

function ok<T>(value: T | Cbi1Error): T {
  if (value instanceof Cbi1Error) throw new Error(`unexpected ${value.reason}: ${value.message}`)
  return value
}

const expectReason = (value: unknown, reason: Cbi1ErrorReason): Cbi1Error => {
  expect(value).toBeInstanceOf(Cbi1Error)
  const error = value as Cbi1Error
  expect({ reason: error.reason, message: error.message }).toMatchObject({ reason })
  expect(error._tag).toBe("Cbi1Error")
  expect(error.message.length).toBeGreaterThan(0)
  return error
}

const viewOf = (bytes: Uint8Array): DataView => new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength)

/**
 * Typed-array equality by memcmp: vitest's deep equality walks megabyte arrays element by element
 * and would dominate the run time. On a mismatch the first differing index is reported.
 */
const expectSameArray = (
  actual: Uint32Array | Uint8Array | undefined,
  expected: Uint32Array | Uint8Array
) => {
  expect(actual).toBeDefined()
  const a = actual!
  expect(a.constructor).toBe(expected.constructor)
  expect(a.length).toBe(expected.length)
  const same = Buffer.from(a.buffer, a.byteOffset, a.byteLength).equals(
    Buffer.from(expected.buffer, expected.byteOffset, expected.byteLength)
  )
  if (!same) {
    const at = a.findIndex((v, i) => v !== expected[i])
    expect({ at, actual: a[at] }).toEqual({ at, actual: expected[at] })
  }
}

/** Re-computes the body checksum after an edit, so the edit reaches the body validation. */
const reseal = (frame: Uint8Array): Uint8Array => {
  viewOf(frame).setUint32(44, xxh3Low32(frame, CBI1_HEADER_BYTES), true)
  return frame
}

const copyOf = (bytes: Uint8Array): Uint8Array => bytes.slice()

const u64At = (bytes: Uint8Array, at: number): bigint => viewOf(bytes).getBigUint64(at, true)

const SMALL = expectedFor(16)
const smallSnapshot = (): Uint8Array => {
  const frames = ok(encodeCbi1Snapshot(SMALL, 7n, snapshotWords(16)))
  expect(frames).toHaveLength(1)
  return frames[0]!
}
const smallDelta = (count = 3): Uint8Array => ok(encodeCbi1Delta(SMALL, 7n, 8n, randomImages(count, 16)))

const assembleAll = (expected: Cbi1Expected, frames: ReadonlyArray<Uint8Array>) => {
  const assembler = new Cbi1SnapshotAssembler(expected)
  const results: Array<ReturnType<Cbi1SnapshotAssembler["push"]>> = []
  for (const frame of frames) {
    const decoded = ok(decodeCbi1(frame, expected))
    if (decoded._tag !== "SnapshotChunk") throw new Error(`expected a snapshot chunk, got ${decoded._tag}`)
    results.push(assembler.push(decoded))
  }
  return results
}

describe("CBI1 constants", () => {
  it("derive the limits from the chunk size", () => {
    expect(CBI1_MAX_FRAME_BYTES).toBe(CBI1_HEADER_BYTES + 16 + SNAPSHOT_CHUNK_BUCKETS * 8)
    expect(CBI1_MAX_DELTA_IMAGES).toBe(Math.floor((CBI1_MAX_FRAME_BYTES - CBI1_HEADER_BYTES - 12) / 12))
  })
})

describe("CBI1 snapshot round trip", () => {
  for (const bucketCount of [2, 16, 1024, 524_288, 1_048_576]) {
    it(`rebuilds a ${bucketCount}-bucket snapshot exactly`, () => {
      const expected = expectedFor(bucketCount)
      const words = snapshotWords(bucketCount, bucketCount)
      const frames = ok(encodeCbi1Snapshot(expected, 41n, words))
      const chunkCount = Math.ceil(bucketCount / SNAPSHOT_CHUNK_BUCKETS)
      expect(frames).toHaveLength(chunkCount)

      const assembler = new Cbi1SnapshotAssembler(expected)
      let result: ReturnType<Cbi1SnapshotAssembler["push"]>
      frames.forEach((frame, index) => {
        expect(frame.length).toBeLessThanOrEqual(CBI1_MAX_FRAME_BYTES)
        const chunk = ok(decodeCbi1(frame, expected))
        const bucketOffset = index * SNAPSHOT_CHUNK_BUCKETS
        const size = Math.min(SNAPSHOT_CHUNK_BUCKETS, bucketCount - bucketOffset)
        expect(chunk).toMatchObject({
          _tag: "SnapshotChunk",
          epoch: 41n,
          chunkIndex: index,
          chunkCount,
          bucketOffset
        })
        expectSameArray(
          (chunk as Cbi1SnapshotChunk).words,
          words.subarray(2 * bucketOffset, 2 * (bucketOffset + size))
        )
        result = assembler.push(chunk as Cbi1SnapshotChunk)
        if (index < chunkCount - 1) expect(result).toBeUndefined()
      })
      const snapshot = ok(result)
      expect(snapshot?.epoch).toBe(41n)
      expectSameArray(snapshot?.words, words)
    })
  }

  it("decodes into owned arrays, not views of the input", () => {
    const frame = smallSnapshot()
    const chunk = ok(decodeCbi1(frame, SMALL)) as Cbi1SnapshotChunk
    const before = chunk.words.slice()
    expect(chunk.words.buffer).not.toBe(frame.buffer)
    frame.fill(0xff, CBI1_HEADER_BYTES)
    expect(chunk.words).toEqual(before)

    const delta = smallDelta(4)
    const decoded = ok(decodeCbi1(delta, SMALL))
    if (decoded._tag !== "Delta") throw new Error("expected a delta")
    const images = decoded.images.slice()
    expect(decoded.images.buffer).not.toBe(delta.buffer)
    delta.fill(0, CBI1_HEADER_BYTES)
    expect(decoded.images).toEqual(images)
  })

  it("decodes frames at unaligned offsets of a larger buffer", () => {
    const words = snapshotWords(16, 5)
    const frame = ok(encodeCbi1Snapshot(SMALL, 3n, words))[0]!
    const host = new Uint8Array(frame.length + 3)
    host.set(frame, 1)
    const chunk = ok(decodeCbi1(host.subarray(1, 1 + frame.length), SMALL)) as Cbi1SnapshotChunk
    expect(chunk.words).toEqual(words)

    const images = randomImages(5, 16, 9)
    const delta = ok(encodeCbi1Delta(SMALL, 3n, 4n, images))
    const deltaHost = new Uint8Array(delta.length + 3)
    deltaHost.set(delta, 3)
    expect(decodeCbi1(deltaHost.subarray(3, 3 + delta.length), SMALL)).toEqual({
      _tag: "Delta",
      epoch: 4n,
      baseEpoch: 3n,
      images
    })
  })
})

describe("CBI1 delta round trip", () => {
  it("round-trips random images, epochs and base epochs", () => {
    fc.assert(
      fc.property(
        fc.constantFrom(2, 16, 1024, 1 << 20, 1 << 24),
        fc.array(fc.tuple(fc.nat(), fc.nat({ max: 0xffff_ffff }), fc.nat({ max: 0xffff_ffff })), {
          maxLength: 64
        }),
        fc.bigInt({ min: 0n, max: 0xffff_ffff_ffff_ffffn }),
        fc.bigInt({ min: 0n, max: 0xffff_ffff_ffff_ffffn }),
        (bucketCount, triples, base, sequence) => {
          const expected = expectedFor(bucketCount)
          const images = new Uint32Array(triples.flatMap(([b, lo, hi]) => [b % bucketCount, lo, hi]))
          const frame = ok(encodeCbi1Delta(expected, base, sequence, images))
          expect(frame.length).toBe(CBI1_HEADER_BYTES + 12 + 12 * triples.length)
          expect(decodeCbi1(frame, expected)).toEqual({
            _tag: "Delta",
            epoch: sequence,
            baseEpoch: base,
            images
          })
        }
      ),
      { numRuns: 200 }
    )
  })

  it("does not check epoch continuity (the consumer reports that as a sequence fault)", () => {
    const frame = ok(encodeCbi1Delta(SMALL, 10n, 99n, new Uint32Array(0)))
    expect(decodeCbi1(frame, SMALL)).toEqual({
      _tag: "Delta",
      epoch: 99n,
      baseEpoch: 10n,
      images: new Uint32Array(0)
    })
  })

  it("round-trips the largest delta the frame limit allows", () => {
    const expected = expectedFor(1 << 24)
    const images = randomImages(CBI1_MAX_DELTA_IMAGES, 1 << 24, 77)
    const frame = ok(encodeCbi1Delta(expected, 1n, 2n, images))
    expect(frame.length).toBeLessThanOrEqual(CBI1_MAX_FRAME_BYTES)
    const decoded = ok(decodeCbi1(frame, expected))
    expect(decoded._tag).toBe("Delta")
    expectSameArray((decoded as { images: Uint32Array }).images, images)
  })
})

describe("CBI1 byte layout", () => {
  it("writes the 48-byte header exactly as the reference", async () => {
    const expected = expectedFor(1024, 0xfedc_ba98_7654_3210n, 0x1122_3344_5566_7788n)
    const frame = ok(
      encodeCbi1Delta(expected, 0x0aaa_bbbb_cccc_dddn, 0x0aaa_bbbb_cccc_ddden, randomImages(7, 1024))
    )
    const header = new Uint8Array(48)
    const view = new DataView(header.buffer)
    header.set([0x43, 0x42, 0x49, 0x31], 0)
    view.setUint16(4, 1, true)
    view.setUint16(6, CBI1_FLAG_DELTA, true)
    view.setUint8(8, 16)
    view.setUint8(9, 4)
    view.setUint16(10, 1, true)
    view.setBigUint64(12, 0x1122_3344_5566_7788n, true)
    view.setBigUint64(20, 1024n, true)
    view.setBigUint64(28, 0xfedc_ba98_7654_3210n, true)
    view.setBigUint64(36, 0x0aaa_bbbb_cccc_ddden, true)
    expect(Array.from(frame.subarray(0, 44))).toEqual(Array.from(header.subarray(0, 44)))
    expect(new TextDecoder().decode(frame.subarray(0, 4))).toBe("CBI1")

    const checksum = viewOf(frame).getUint32(44, true)
    expect(checksum).toBe(xxh3Low32(frame, 48))
    // An independent XXH3 implementation guards against a shared bug in ours.
    const oracle = await createXXHash3(0, 0)
    oracle.init()
    oracle.update(frame.subarray(48))
    expect(checksum).toBe(Number(BigInt(`0x${oracle.digest("hex")}`) & 0xffff_ffffn))
  })

  it("lays out snapshot chunk bodies as index, count, offset and little-endian words", () => {
    const expected = expectedFor(1 << 20)
    const words = snapshotWords(1 << 20, 3)
    const frames = ok(encodeCbi1Snapshot(expected, 5n, words))
    expect(frames).toHaveLength(2)
    for (const [index, frame] of frames.entries()) {
      const view = viewOf(frame)
      expect(view.getUint16(6, true)).toBe(CBI1_FLAG_SNAPSHOT_CHUNK)
      expect(u64At(frame, 36)).toBe(5n)
      expect(frame.length).toBe(CBI1_MAX_FRAME_BYTES)
      expect(view.getUint32(48, true)).toBe(index)
      expect(view.getUint32(52, true)).toBe(2)
      expect(u64At(frame, 56)).toBe(BigInt(index * SNAPSHOT_CHUNK_BUCKETS))
      for (const bucket of [0, 1, 2, 12_345, SNAPSHOT_CHUNK_BUCKETS - 1]) {
        const global = index * SNAPSHOT_CHUNK_BUCKETS + bucket
        const word = (BigInt(words[2 * global + 1]!) << 32n) | BigInt(words[2 * global]!)
        expect(u64At(frame, 64 + 8 * bucket)).toBe(word)
      }
      expect(view.getUint32(44, true)).toBe(xxh3Low32(frame, 48))
    }
  })

  it("lays out delta bodies as base epoch, count and (bucket u32, word u64) images", () => {
    const images = new Uint32Array([3, 0xdddd_dddd, 0xaaaa_bbbb, 15, 42, 0])
    const frame = ok(encodeCbi1Delta(SMALL, 4n, 5n, images))
    const view = viewOf(frame)
    expect(frame.length).toBe(48 + 12 + 24)
    expect(u64At(frame, 36)).toBe(5n)
    expect(u64At(frame, 48)).toBe(4n)
    expect(view.getUint32(56, true)).toBe(2)
    expect(view.getUint32(60, true)).toBe(3)
    expect(u64At(frame, 64)).toBe(0xaaaa_bbbb_dddd_ddddn)
    expect(view.getUint32(72, true)).toBe(15)
    expect(u64At(frame, 76)).toBe(42n)
  })
})

describe("CBI1 decoder rejects corrupt frames with a typed reason", () => {
  const cases: Array<[string, () => unknown, Cbi1ErrorReason]> = [
    ["an empty frame", () => decodeCbi1(new Uint8Array(0), SMALL), "Truncated"],
    ["a truncated header", () => decodeCbi1(smallSnapshot().subarray(0, 47), SMALL), "Truncated"],
    [
      "a frame over the maximum",
      () => {
        const big = new Uint8Array(CBI1_MAX_FRAME_BYTES + 1)
        big.set(smallDelta(0))
        return decodeCbi1(big, SMALL)
      },
      "FrameTooLarge"
    ],
    [
      "bad magic",
      () => {
        const f = smallSnapshot()
        f[3] = 0x32
        return decodeCbi1(f, SMALL)
      },
      "Magic"
    ],
    [
      "wire version 2",
      () => {
        const f = smallSnapshot()
        viewOf(f).setUint16(4, 2, true)
        return decodeCbi1(f, SMALL)
      },
      "WireVersion"
    ],
    [
      "a flipped checksum byte",
      () => {
        const f = smallSnapshot()
        f[45]! ^= 0x10
        return decodeCbi1(f, SMALL)
      },
      "Checksum"
    ],
    [
      "a flipped body byte",
      () => {
        const f = smallDelta()
        f[f.length - 1]! ^= 1
        return decodeCbi1(f, SMALL)
      },
      "Checksum"
    ],
    [
      "a truncated body without a new checksum",
      () => decodeCbi1(smallSnapshot().subarray(0, 60), SMALL),
      "Checksum"
    ],
    [
      "format version 2",
      () => {
        const f = smallSnapshot()
        viewOf(f).setUint16(10, 2, true)
        return decodeCbi1(f, SMALL)
      },
      "FormatVersion"
    ],
    [
      "fingerprint bits 8",
      () => {
        const f = smallSnapshot()
        f[8] = 8
        return decodeCbi1(f, SMALL)
      },
      "FormatFingerprintBits"
    ],
    [
      "slots per bucket 2",
      () => {
        const f = smallSnapshot()
        f[9] = 2
        return decodeCbi1(f, SMALL)
      },
      "FormatSlotsPerBucket"
    ],
    [
      "a bucket count that is not a power of two",
      () => {
        const f = smallDelta()
        viewOf(f).setBigUint64(20, 24n, true)
        return decodeCbi1(f, SMALL)
      },
      "FormatBucketCount"
    ],
    [
      "a bucket count above 2^24",
      () => {
        const f = smallDelta()
        viewOf(f).setBigUint64(20, 1n << 25n, true)
        return decodeCbi1(f, SMALL)
      },
      "FormatBucketCount"
    ],
    [
      "a bucket count whose low 32 bits are valid",
      () => {
        const f = smallDelta()
        viewOf(f).setBigUint64(20, (1n << 32n) | 16n, true)
        return decodeCbi1(f, SMALL)
      },
      "FormatBucketCount"
    ],
    [
      "a bucket count other than expected",
      () => decodeCbi1(smallSnapshot(), expectedFor(32)),
      "FormatMismatch"
    ],
    [
      "a seed other than expected",
      () => decodeCbi1(smallSnapshot(), expectedFor(16, DC, SEED ^ 1n)),
      "FormatMismatch"
    ],
    [
      "an expectation CBI1 cannot carry",
      () => decodeCbi1(smallSnapshot(), { format: new DcCkfFormatIdentity(SEED, 16, 1, 8), dcId: DC }),
      "FormatMismatch"
    ],
    ["a dc id other than expected", () => decodeCbi1(smallDelta(), expectedFor(16, DC + 1n)), "DcIdMismatch"],
    [
      "flags 3",
      () => {
        const f = smallSnapshot()
        viewOf(f).setUint16(6, 3, true)
        return decodeCbi1(f, SMALL)
      },
      "Flags"
    ],
    [
      "flags 0",
      () => {
        const f = smallDelta()
        viewOf(f).setUint16(6, 0, true)
        return decodeCbi1(f, SMALL)
      },
      "Flags"
    ],
    [
      "a snapshot body shorter than its prefix",
      () => decodeCbi1(reseal(copyOf(smallSnapshot().subarray(0, 48 + 10))), SMALL),
      "Truncated"
    ],
    [
      "a delta body shorter than its prefix",
      () => decodeCbi1(reseal(copyOf(smallDelta().subarray(0, 48 + 8))), SMALL),
      "Truncated"
    ],
    [
      "a snapshot body cut inside a word",
      () => {
        const f = smallSnapshot()
        return decodeCbi1(reseal(copyOf(f.subarray(0, f.length - 3))), SMALL)
      },
      "Malformed"
    ],
    [
      "a snapshot body missing whole words",
      () => {
        const f = smallSnapshot()
        return decodeCbi1(reseal(copyOf(f.subarray(0, f.length - 8))), SMALL)
      },
      "SnapshotChunkWordCount"
    ],
    [
      "a snapshot body with extra words",
      () => {
        const f = smallSnapshot()
        const longer = new Uint8Array(f.length + 16)
        longer.set(f)
        return decodeCbi1(reseal(longer), SMALL)
      },
      "SnapshotChunkWordCount"
    ],
    [
      "a snapshot chunk count that does not match the bucket count",
      () => {
        const f = smallSnapshot()
        viewOf(f).setUint32(52, 2, true)
        return decodeCbi1(reseal(f), SMALL)
      },
      "SnapshotBucketCount"
    ],
    [
      "a snapshot chunk index beyond the chunk count",
      () => {
        const f = smallSnapshot()
        // The offset agrees with the index, so only the index bound can reject the chunk.
        viewOf(f).setUint32(48, 1, true)
        viewOf(f).setBigUint64(56, BigInt(SNAPSHOT_CHUNK_BUCKETS), true)
        return decodeCbi1(reseal(f), SMALL)
      },
      "Malformed"
    ],
    [
      "a snapshot bucket offset that does not match the chunk index",
      () => {
        const f = smallSnapshot()
        viewOf(f).setBigUint64(56, 8n, true)
        return decodeCbi1(reseal(f), SMALL)
      },
      "Malformed"
    ],
    [
      "a delta body longer than its image count",
      () => {
        const f = smallDelta(2)
        const longer = new Uint8Array(f.length + 12)
        longer.set(f)
        return decodeCbi1(reseal(longer), SMALL)
      },
      "Malformed"
    ],
    [
      "a delta image count larger than its body",
      () => {
        const f = smallDelta(2)
        viewOf(f).setUint32(56, 3, true)
        return decodeCbi1(reseal(f), SMALL)
      },
      "Malformed"
    ],
    [
      "a delta body cut inside an image",
      () => {
        const f = smallDelta(2)
        return decodeCbi1(reseal(copyOf(f.subarray(0, f.length - 5))), SMALL)
      },
      "Malformed"
    ],
    [
      "a delta image count above the maximum",
      () => {
        const f = smallDelta(2)
        viewOf(f).setUint32(56, CBI1_MAX_DELTA_IMAGES + 1, true)
        return decodeCbi1(reseal(f), SMALL)
      },
      "DeltaImageCount"
    ],
    [
      "a delta bucket out of range",
      () => {
        const f = smallDelta(3)
        viewOf(f).setUint32(60 + 12, 16, true)
        return decodeCbi1(reseal(f), SMALL)
      },
      "BucketIndex"
    ],
    [
      "input that is not a byte array",
      () => decodeCbi1(undefined as unknown as Uint8Array, SMALL),
      "Malformed"
    ],
    [
      "an array-like that is not a typed array",
      () => decodeCbi1({ length: 64, 0: 0x43, 1: 0x42, 2: 0x49, 3: 0x31 } as unknown as Uint8Array, SMALL),
      "Malformed"
    ]
  ]
  for (const [name, run, reason] of cases) {
    it(`${name} → ${reason}`, () => {
      let result: unknown
      expect(() => {
        result = run()
      }).not.toThrow()
      expectReason(result, reason)
    })
  }

  it("rejects every single-bit flip of the checksum field", () => {
    const frame = smallDelta(5)
    for (let bit = 0; bit < 32; bit++) {
      const f = frame.slice()
      f[44 + (bit >> 3)]! ^= 1 << (bit & 7)
      expectReason(decodeCbi1(f, SMALL), "Checksum")
    }
  })

  it("checks the header in the reference order", () => {
    const f = smallSnapshot()
    const view = viewOf(f)
    view.setUint16(4, 9, true)
    f[44]! ^= 1
    f[8] = 8
    expectReason(decodeCbi1(f, expectedFor(16, 0n)), "WireVersion")
    view.setUint16(4, 1, true)
    expectReason(decodeCbi1(f, expectedFor(16, 0n)), "Checksum")
    f[44]! ^= 1
    viewOf(f).setUint16(6, 7, true)
    expectReason(decodeCbi1(f, expectedFor(16, 0n)), "FormatFingerprintBits")
    f[8] = 16
    expectReason(decodeCbi1(f, expectedFor(16, 0n)), "DcIdMismatch")
    expectReason(decodeCbi1(f, SMALL), "Flags")
  })

  it("names the offending values in its messages", () => {
    const f = smallDelta()
    viewOf(f).setUint16(4, 3, true)
    expect(expectReason(decodeCbi1(f, SMALL), "WireVersion").message).toContain("3")
    const big = decodeCbi1(new Uint8Array(CBI1_MAX_FRAME_BYTES + 5), SMALL)
    expect(expectReason(big, "FrameTooLarge").message).toContain(String(CBI1_MAX_FRAME_BYTES + 5))
    const dc = decodeCbi1(smallDelta(), expectedFor(16, 0xabcn))
    expect(expectReason(dc, "DcIdMismatch").message).toContain("expected dc 0xabc")
    expect((dc as Cbi1Error).message).toContain(`dc 0x${DC.toString(16)}`)
  })
})

describe("CBI1 encoder rejects invalid input without throwing", () => {
  const cases: Array<[string, () => unknown, Cbi1ErrorReason]> = [
    [
      "too few snapshot words",
      () => encodeCbi1Snapshot(SMALL, 1n, new Uint32Array(30)),
      "SnapshotBucketCount"
    ],
    [
      "too many snapshot words",
      () => encodeCbi1Snapshot(SMALL, 1n, new Uint32Array(34)),
      "SnapshotBucketCount"
    ],
    [
      "a word array of the wrong type",
      () => encodeCbi1Snapshot(SMALL, 1n, [1, 2] as unknown as Uint32Array),
      "SnapshotBucketCount"
    ],
    ["a negative sequence", () => encodeCbi1Snapshot(SMALL, -1n, new Uint32Array(32)), "Malformed"],
    ["a sequence above u64", () => encodeCbi1Delta(SMALL, 0n, 1n << 64n, new Uint32Array(0)), "Malformed"],
    [
      "a dc id above u64",
      () => encodeCbi1Delta(expectedFor(16, 1n << 64n), 0n, 1n, new Uint32Array(0)),
      "Malformed"
    ],
    [
      "a bucket count that is not a power of two",
      () => encodeCbi1Snapshot(expectedFor(24), 1n, new Uint32Array(48)),
      "FormatBucketCount"
    ],
    [
      "a bucket count above 2^24",
      () => encodeCbi1Delta(expectedFor(2 ** 25), 0n, 1n, new Uint32Array(0)),
      "FormatBucketCount"
    ],
    [
      "fingerprint bits 8",
      () =>
        encodeCbi1Delta(
          { format: new DcCkfFormatIdentity(SEED, 16, 1, 8), dcId: DC },
          0n,
          1n,
          new Uint32Array(0)
        ),
      "FormatFingerprintBits"
    ],
    ["images that are not triples", () => encodeCbi1Delta(SMALL, 0n, 1n, new Uint32Array(4)), "Malformed"],
    [
      "too many images",
      () => encodeCbi1Delta(SMALL, 0n, 1n, new Uint32Array(3 * (CBI1_MAX_DELTA_IMAGES + 1))),
      "DeltaImageCount"
    ],
    [
      "a bucket out of range",
      () => encodeCbi1Delta(SMALL, 0n, 1n, new Uint32Array([1, 0, 0, 16, 5, 5])),
      "BucketIndex"
    ]
  ]
  for (const [name, run, reason] of cases) {
    it(`${name} → ${reason}`, () => {
      let result: unknown
      expect(() => {
        result = run()
      }).not.toThrow()
      expectReason(result, reason)
    })
  }
})

describe("CBI1 snapshot assembly", () => {
  const FOUR = expectedFor(4 * SNAPSHOT_CHUNK_BUCKETS)
  const fourWords = snapshotWords(4 * SNAPSHOT_CHUNK_BUCKETS, 11)
  const chunk = (index: number, overrides: Partial<Cbi1SnapshotChunk> = {}): Cbi1SnapshotChunk => ({
    _tag: "SnapshotChunk",
    epoch: 9n,
    chunkIndex: index,
    chunkCount: 4,
    bucketOffset: index * SNAPSHOT_CHUNK_BUCKETS,
    words: fourWords.subarray(2 * index * SNAPSHOT_CHUNK_BUCKETS, 2 * (index + 1) * SNAPSHOT_CHUNK_BUCKETS),
    ...overrides
  })

  /** After a fault the assembler must hold nothing: continuing the old snapshot fails too. */
  const expectFault = (
    assembler: Cbi1SnapshotAssembler,
    result: unknown,
    reason: Cbi1ErrorReason,
    next: number
  ) => {
    expectReason(result, reason)
    expect(result).not.toHaveProperty("words")
    if (next > 0) expectReason(assembler.push(chunk(next)), "ChunkSequence")
  }

  const completes = (assembler: Cbi1SnapshotAssembler, chunks: ReadonlyArray<Cbi1SnapshotChunk>) => {
    const results = chunks.map((c) => assembler.push(c))
    expect(results.slice(0, -1)).toEqual(chunks.slice(0, -1).map(() => undefined))
    return ok(results.at(-1))
  }

  it("assembles chunks pushed in order", () => {
    const snapshot = completes(
      new Cbi1SnapshotAssembler(FOUR),
      [0, 1, 2, 3].map((i) => chunk(i))
    )
    expect(snapshot?.epoch).toBe(9n)
    expectSameArray(snapshot?.words, fourWords)
    expect(snapshot?.words.buffer).not.toBe(fourWords.buffer)
  })

  it("rejects a first chunk other than 0", () => {
    const assembler = new Cbi1SnapshotAssembler(FOUR)
    expectFault(assembler, assembler.push(chunk(1)), "ChunkSequence", 2)
  })

  it("rejects a skipped chunk and keeps no partial snapshot", () => {
    const assembler = new Cbi1SnapshotAssembler(FOUR)
    expect(assembler.push(chunk(0))).toBeUndefined()
    expect(assembler.push(chunk(1))).toBeUndefined()
    expectFault(assembler, assembler.push(chunk(3)), "ChunkSequence", 2)
  })

  it("rejects a repeated chunk", () => {
    const assembler = new Cbi1SnapshotAssembler(FOUR)
    expect(assembler.push(chunk(0))).toBeUndefined()
    expect(assembler.push(chunk(1))).toBeUndefined()
    expectFault(assembler, assembler.push(chunk(1)), "ChunkSequence", 2)
  })

  it("rejects a chunk from a different epoch", () => {
    const assembler = new Cbi1SnapshotAssembler(FOUR)
    expect(assembler.push(chunk(0))).toBeUndefined()
    expectFault(assembler, assembler.push(chunk(1, { epoch: 10n })), "ChunkSequence", 2)
  })

  it("rejects a chunk with a different chunk count", () => {
    const assembler = new Cbi1SnapshotAssembler(FOUR)
    expect(assembler.push(chunk(0))).toBeUndefined()
    expectFault(assembler, assembler.push(chunk(1, { chunkCount: 5 })), "ChunkSequence", 2)
  })

  it("rejects a chunk at the wrong bucket offset", () => {
    const assembler = new Cbi1SnapshotAssembler(FOUR)
    expect(assembler.push(chunk(0))).toBeUndefined()
    expectFault(assembler, assembler.push(chunk(1, { bucketOffset: 0 })), "ChunkSequence", 2)
  })

  it("rejects a chunk reaching past the lane", () => {
    const assembler = new Cbi1SnapshotAssembler(expectedFor(16))
    const tooLong = new Uint32Array(34)
    const result = assembler.push({ ...chunk(0, { chunkCount: 1, words: tooLong }) })
    expectFault(assembler, result, "ChunkSequence", 0)
  })

  it("reports incomplete coverage when the last chunk leaves buckets uncovered", () => {
    const assembler = new Cbi1SnapshotAssembler(FOUR)
    const chunks = [0, 1, 2, 3].map((i) => chunk(i))
    chunks[3] = chunk(3, { words: fourWords.subarray(0, 2 * 1000) })
    const results = chunks.map((c) => assembler.push(c))
    expect(results.slice(0, 3)).toEqual([undefined, undefined, undefined])
    expectFault(assembler, results[3], "IncompleteCoverage", 1)

    const short = new Cbi1SnapshotAssembler(FOUR)
    expect(short.push(chunk(0, { chunkCount: 2 }))).toBeUndefined()
    expectFault(short, short.push(chunk(1, { chunkCount: 2 })), "IncompleteCoverage", 1)
  })

  it("restarts on a new chunk 0 and after reset()", () => {
    const assembler = new Cbi1SnapshotAssembler(FOUR)
    expect(assembler.push(chunk(0, { epoch: 1n }))).toBeUndefined()
    expect(assembler.push(chunk(1, { epoch: 1n }))).toBeUndefined()
    const snapshot = completes(
      assembler,
      [0, 1, 2, 3].map((i) => chunk(i, { epoch: 2n }))
    )
    expect(snapshot?.epoch).toBe(2n)
    expectSameArray(snapshot?.words, fourWords)

    expect(assembler.push(chunk(0))).toBeUndefined()
    assembler.reset()
    expectReason(assembler.push(chunk(1)), "ChunkSequence")
  })

  it("rejects a chunk pushed after the snapshot completed", () => {
    const expected = expectedFor(1 << 20)
    const frames = ok(encodeCbi1Snapshot(expected, 3n, snapshotWords(1 << 20)))
    const results = assembleAll(expected, [...frames, frames[1]!])
    expect(ok(results[1])?.epoch).toBe(3n)
    expectReason(results[2], "ChunkSequence")
  })

  it("rejects a non-chunk frame", () => {
    const assembler = new Cbi1SnapshotAssembler(SMALL)
    const delta = ok(decodeCbi1(smallDelta(), SMALL))
    expectReason(assembler.push(delta as unknown as Cbi1SnapshotChunk), "ChunkSequence")
  })
})

describe("CBI1 decoder under random corruption", () => {
  const base = (frame: Uint8Array): Cbi1Frame => ok(decodeCbi1(frame, SMALL))
  const reencode = (frame: Cbi1Frame): Uint8Array =>
    frame._tag === "Delta"
      ? ok(encodeCbi1Delta(SMALL, frame.baseEpoch, frame.epoch, frame.images))
      : ok(encodeCbi1Snapshot(SMALL, frame.epoch, frame.words))[0]!
  const snapshotFrame = ok(encodeCbi1Snapshot(SMALL, 21n, snapshotWords(16, 1)))[0]!
  const deltaFrame = ok(encodeCbi1Delta(SMALL, 20n, 21n, randomImages(6, 16, 2)))
  const mutation = fc.record({
    edits: fc.array(fc.tuple(fc.nat(), fc.nat({ max: 255 })), { minLength: 1, maxLength: 6 }),
    cut: fc.option(fc.nat(), { nil: undefined }),
    resealed: fc.boolean()
  })

  for (const [name, frame] of [
    ["snapshot chunk", snapshotFrame],
    ["delta", deltaFrame]
  ] as const) {
    it(`never throws on a mutated ${name} and accepts only canonical frames`, () => {
      const original = base(frame)
      fc.assert(
        fc.property(mutation, ({ edits, cut, resealed }) => {
          let bytes = frame.slice()
          for (const [at, value] of edits) bytes[at % bytes.length] = value
          if (cut !== undefined) bytes = bytes.slice(0, cut % (bytes.length + 1))
          // Re-sealing lets mutations get past the checksum and exercise the body validation.
          if (resealed && bytes.length >= CBI1_HEADER_BYTES) reseal(bytes)
          let result: Cbi1Frame | Cbi1Error | undefined
          expect(() => {
            result = decodeCbi1(bytes, SMALL)
          }).not.toThrow()
          expect(result).toBeDefined()
          if (result instanceof Cbi1Error || result === undefined) return
          // Whatever is accepted is exactly what the encoder would write for the decoded frame.
          expect(reencode(result)).toEqual(bytes)
          // Without a new checksum the body cannot change; the checksum does not cover the header
          // epoch, so that alone may differ.
          if (!resealed) expect(result).toEqual({ ...original, epoch: u64At(bytes, 36) })
        }),
        { numRuns: 2000 }
      )
    })
  }

  it("never throws on arbitrary bytes behind a valid magic", () => {
    fc.assert(
      fc.property(fc.uint8Array({ maxLength: 400 }), fc.boolean(), (tail, sealed) => {
        const bytes = new Uint8Array(tail.length + 4)
        bytes.set([0x43, 0x42, 0x49, 0x31])
        bytes.set(tail, 4)
        if (sealed && bytes.length >= CBI1_HEADER_BYTES) reseal(bytes)
        let result: unknown
        expect(() => {
          result = decodeCbi1(bytes, SMALL)
        }).not.toThrow()
        expect(result instanceof Cbi1Error || (result as Cbi1Frame)._tag !== undefined).toBe(true)
      }),
      { numRuns: 1000 }
    )
  })
})
