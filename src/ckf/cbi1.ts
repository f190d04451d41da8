/**
 * CBI1 ("Cuckoo Bucket Images v1"): the byte-exact wire payload of snapshots and deltas
 * (relay-service §3.5, ckf-core §6.4).
 *
 * Frames are a 48-byte little-endian header followed by a body whose unseeded XXH3-64 low half
 * is the header checksum. The checksum covers the body only, so the header is trusted through
 * field validation alone: the epoch in particular is not integrity protected on the wire.
 *
 * Word arrays `[lo, hi]*` and image arrays `[bucket, lo, hi]*` already are the wire byte order
 * on a little-endian host, so bodies move with one bulk copy each way. Every function returns a
 * `Cbi1Error` value for bad input and never throws.
 */

import { FINGERPRINT_BITS, FORMAT_VERSION, SLOTS_PER_BUCKET } from "./config.js"
import type { DcCkfFormatIdentity } from "./identity.js"
import { isU64 } from "./u64.js"
import { xxh3Low32Fast } from "./xxh3Wasm.js"

// The bulk copies below reinterpret Uint32Array memory as wire bytes; state.ts makes the same
// assumption, but this module may be loaded without it.
if (new Uint8Array(new Uint16Array([1]).buffer)[0] !== 1) {
  throw new Error("kvrelay's CBI1 codec requires a little-endian host (words are copied as raw bytes)")
}

/** The four bytes every CBI1 frame starts with. */
export const CBI1_MAGIC = "CBI1"
/** The CBI1 wire version this codec reads and writes. */
export const CBI1_WIRE_VERSION = 1
/** The size of a CBI1 header. */
export const CBI1_HEADER_BYTES = 48
/** The header flag of a snapshot chunk. */
export const CBI1_FLAG_SNAPSHOT_CHUNK = 1
/** The header flag of a delta. */
export const CBI1_FLAG_DELTA = 2
/** Buckets per snapshot chunk (the last chunk may hold fewer). */
export const SNAPSHOT_CHUNK_BUCKETS = 524_288
/** The most buckets a CBI1 format may declare. */
export const CBI1_MAX_BUCKET_COUNT = 2 ** 24
/** The largest CBI1 frame: a full snapshot chunk with its header and prefix. */
export const CBI1_MAX_FRAME_BYTES = 4_194_368
/** The most bucket images one delta may carry (it must fit a frame). */
export const CBI1_MAX_DELTA_IMAGES = 349_525

const SNAPSHOT_PREFIX_BYTES = 16
const DELTA_PREFIX_BYTES = 12
const DELTA_IMAGE_BYTES = 12
const WORD_BYTES = 8
const CHECKSUM_OFFSET = 44
const MAGIC_BYTES = [0x43, 0x42, 0x49, 0x31] as const

/** Why bytes are not a CBI1 frame this consumer accepts. */
export type Cbi1ErrorReason =
  | "FrameTooLarge"
  | "DeltaImageCount"
  | "SnapshotChunkWordCount"
  | "BucketIndex"
  | "SnapshotBucketCount"
  | "Truncated"
  | "Magic"
  | "WireVersion"
  | "Flags"
  | "Checksum"
  | "Malformed"
  | "FormatVersion"
  | "FormatFingerprintBits"
  | "FormatSlotsPerBucket"
  | "FormatBucketCount"
  | "FormatMismatch"
  | "DcIdMismatch"
  | "ChunkSequence"
  | "IncompleteCoverage"

/** A CBI1 frame that could not be encoded or decoded; `reason` says why. */
export class Cbi1Error extends Error {
  readonly _tag = "Cbi1Error"
  constructor(
    readonly reason: Cbi1ErrorReason,
    message: string
  ) {
    super(message)
    this.name = "Cbi1Error"
  }
}

/** What the receiver (or sender) of a frame holds as the truth: the pool's format and DC. */
export interface Cbi1Expected {
  readonly format: DcCkfFormatIdentity
  readonly dcId: bigint
}

/** One decoded snapshot chunk: its place in the snapshot and its bucket words. */
export interface Cbi1SnapshotChunk {
  readonly _tag: "SnapshotChunk"
  readonly epoch: bigint
  readonly chunkIndex: number
  readonly chunkCount: number
  readonly bucketOffset: number
  /** `[lo, hi]` pairs of the chunk's buckets, starting at `bucketOffset`. */
  readonly words: Uint32Array
}

/** One decoded delta: its sequences and bucket images. */
export interface Cbi1DeltaFrame {
  readonly _tag: "Delta"
  readonly epoch: bigint
  readonly baseEpoch: bigint
  /** `[bucket, wordLo, wordHi]` triples. */
  readonly images: Uint32Array
}

/** A decoded CBI1 frame. */
export type Cbi1Frame = Cbi1SnapshotChunk | Cbi1DeltaFrame

const hex = (value: bigint): string => `0x${value.toString(16)}`

const causeText = (cause: unknown): string => (cause instanceof Error ? cause.message : String(cause))

const isValidBucketCount = (count: number): boolean =>
  Number.isInteger(count) && count >= 2 && count <= CBI1_MAX_BUCKET_COUNT && (count & (count - 1)) === 0

const snapshotChunkCount = (bucketCount: number): number => Math.ceil(bucketCount / SNAPSHOT_CHUNK_BUCKETS)

/** Reasons an expectation cannot describe any CBI1 frame; the encoder refuses to emit under it. */
const validateExpected = (expected: Cbi1Expected): Cbi1Error | undefined => {
  const format = expected.format
  if (format.formatVersion !== FORMAT_VERSION) {
    return new Cbi1Error(
      "FormatVersion",
      `format version ${format.formatVersion} is not the CBI1 format version ${FORMAT_VERSION}`
    )
  }
  if (format.fingerprintBits !== FINGERPRINT_BITS) {
    return new Cbi1Error(
      "FormatFingerprintBits",
      `fingerprint width ${format.fingerprintBits} is not the CBI1 width ${FINGERPRINT_BITS}`
    )
  }
  if (format.slotsPerBucket !== SLOTS_PER_BUCKET) {
    return new Cbi1Error(
      "FormatSlotsPerBucket",
      `slots per bucket ${format.slotsPerBucket} is not the CBI1 value ${SLOTS_PER_BUCKET}`
    )
  }
  if (!isValidBucketCount(format.bucketCount)) {
    return new Cbi1Error(
      "FormatBucketCount",
      `bucket count ${format.bucketCount} is not a power of two in 2..=${CBI1_MAX_BUCKET_COUNT}`
    )
  }
  if (typeof format.seed !== "bigint" || !isU64(format.seed)) {
    return new Cbi1Error("Malformed", `seed ${String(format.seed)} is not a u64`)
  }
  if (typeof expected.dcId !== "bigint" || !isU64(expected.dcId)) {
    return new Cbi1Error("Malformed", `dc id ${String(expected.dcId)} is not a u64`)
  }
  return undefined
}

const checkU64 = (name: string, value: bigint): Cbi1Error | undefined =>
  typeof value === "bigint" && isU64(value)
    ? undefined
    : new Cbi1Error("Malformed", `${name} ${String(value)} is not a u64`)

/** Writes the header with a zero checksum; `sealFrame` patches it once the body is in place. */
const writeHeader = (view: DataView, flags: number, expected: Cbi1Expected, epoch: bigint): void => {
  for (let i = 0; i < 4; i++) view.setUint8(i, MAGIC_BYTES[i])
  view.setUint16(4, CBI1_WIRE_VERSION, true)
  view.setUint16(6, flags, true)
  view.setUint8(8, FINGERPRINT_BITS)
  view.setUint8(9, SLOTS_PER_BUCKET)
  view.setUint16(10, FORMAT_VERSION, true)
  view.setBigUint64(12, expected.format.seed, true)
  view.setBigUint64(20, BigInt(expected.format.bucketCount), true)
  view.setBigUint64(28, expected.dcId, true)
  view.setBigUint64(36, epoch, true)
  view.setUint32(CHECKSUM_OFFSET, 0, true)
}

const sealFrame = (frame: Uint8Array, view: DataView): Uint8Array => {
  view.setUint32(CHECKSUM_OFFSET, xxh3Low32Fast(frame, CBI1_HEADER_BYTES), true)
  return frame
}

/**
 * One snapshot as `ceil(bucketCount / 524288)` chunk frames, each stamped with `sequence` as its
 * epoch. `words` must hold exactly `2 × bucketCount` halves.
 */
export function encodeCbi1Snapshot(
  expected: Cbi1Expected,
  sequence: bigint,
  words: Uint32Array
): Array<Uint8Array> | Cbi1Error {
  try {
    const invalid = validateExpected(expected) ?? checkU64("sequence", sequence)
    if (invalid !== undefined) return invalid
    const bucketCount = expected.format.bucketCount
    if (!(words instanceof Uint32Array) || words.length !== 2 * bucketCount) {
      const length = words instanceof Uint32Array ? `${words.length / 2} buckets` : "no word array"
      return new Cbi1Error("SnapshotBucketCount", `snapshot has ${length}, format declares ${bucketCount}`)
    }
    const chunkCount = snapshotChunkCount(bucketCount)
    const frames: Array<Uint8Array> = []
    for (let index = 0; index < chunkCount; index++) {
      const offset = index * SNAPSHOT_CHUNK_BUCKETS
      const count = Math.min(SNAPSHOT_CHUNK_BUCKETS, bucketCount - offset)
      const frame = new Uint8Array(CBI1_HEADER_BYTES + SNAPSHOT_PREFIX_BYTES + count * WORD_BYTES)
      const view = new DataView(frame.buffer)
      writeHeader(view, CBI1_FLAG_SNAPSHOT_CHUNK, expected, sequence)
      view.setUint32(48, index, true)
      view.setUint32(52, chunkCount, true)
      view.setBigUint64(56, BigInt(offset), true)
      // Byte 64 is 4-aligned in a fresh buffer, so the body can be a Uint32Array view.
      new Uint32Array(frame.buffer, 64, 2 * count).set(words.subarray(2 * offset, 2 * (offset + count)))
      frames.push(sealFrame(frame, view))
    }
    return frames
  } catch (cause) {
    return new Cbi1Error("Malformed", `CBI1 snapshot encoding failed: ${causeText(cause)}`)
  }
}

/**
 * One delta frame: header epoch `sequence`, body base epoch `baseSequence`, and `images` as
 * `[bucket, wordLo, wordHi]` triples (at most 349,525, every bucket below the bucket count).
 */
export function encodeCbi1Delta(
  expected: Cbi1Expected,
  baseSequence: bigint,
  sequence: bigint,
  images: Uint32Array
): Uint8Array | Cbi1Error {
  try {
    const invalid =
      validateExpected(expected) ?? checkU64("base sequence", baseSequence) ?? checkU64("sequence", sequence)
    if (invalid !== undefined) return invalid
    if (!(images instanceof Uint32Array) || images.length % 3 !== 0) {
      const length = images instanceof Uint32Array ? `${images.length} values` : "no image array"
      return new Cbi1Error("Malformed", `delta images must be [bucket, lo, hi] triples, got ${length}`)
    }
    const count = images.length / 3
    if (count > CBI1_MAX_DELTA_IMAGES) {
      return new Cbi1Error(
        "DeltaImageCount",
        `delta has ${count} images, exceeding the CBI1 maximum ${CBI1_MAX_DELTA_IMAGES}`
      )
    }
    const bucketCount = expected.format.bucketCount
    for (let i = 0; i < images.length; i += 3) {
      if (images[i]! >= bucketCount) {
        return new Cbi1Error(
          "BucketIndex",
          `delta image ${i / 3} names bucket ${images[i]}, outside the ${bucketCount}-bucket lane`
        )
      }
    }
    const frame = new Uint8Array(CBI1_HEADER_BYTES + DELTA_PREFIX_BYTES + count * DELTA_IMAGE_BYTES)
    const view = new DataView(frame.buffer)
    writeHeader(view, CBI1_FLAG_DELTA, expected, sequence)
    view.setBigUint64(48, baseSequence, true)
    view.setUint32(56, count, true)
    // Images start at byte 60, 4-aligned, and a triple is exactly one 12-byte wire image.
    new Uint32Array(frame.buffer, 60, images.length).set(images)
    return sealFrame(frame, view)
  } catch (cause) {
    return new Cbi1Error("Malformed", `CBI1 delta encoding failed: ${causeText(cause)}`)
  }
}

/** An owned copy of `length` bytes, copied bytewise because the source may be unaligned. */
const copyU32 = (bytes: Uint8Array, start: number, length: number): Uint32Array => {
  const out = new Uint32Array(length / 4)
  new Uint8Array(out.buffer).set(bytes.subarray(start, start + length))
  return out
}

const decodeSnapshotChunk = (
  bytes: Uint8Array,
  view: DataView,
  bucketCount: number,
  epoch: bigint
): Cbi1SnapshotChunk | Cbi1Error => {
  const bodyLength = bytes.length - CBI1_HEADER_BYTES
  if (bodyLength < SNAPSHOT_PREFIX_BYTES) {
    return new Cbi1Error(
      "Truncated",
      `snapshot chunk body has ${bodyLength} bytes, shorter than its ${SNAPSHOT_PREFIX_BYTES}-byte prefix`
    )
  }
  const wordBytes = bodyLength - SNAPSHOT_PREFIX_BYTES
  if (wordBytes % WORD_BYTES !== 0) {
    return new Cbi1Error(
      "Malformed",
      `snapshot chunk carries ${wordBytes} word bytes, not a whole number of 8-byte words`
    )
  }
  const wordCount = wordBytes / WORD_BYTES
  if (wordCount > SNAPSHOT_CHUNK_BUCKETS) {
    return new Cbi1Error(
      "SnapshotChunkWordCount",
      `snapshot chunk has ${wordCount} words, exceeding the CBI1 maximum ${SNAPSHOT_CHUNK_BUCKETS}`
    )
  }
  const chunkIndex = view.getUint32(48, true)
  const chunkCount = view.getUint32(52, true)
  const bucketOffset = view.getBigUint64(56, true)
  const expectedChunks = snapshotChunkCount(bucketCount)
  if (chunkCount !== expectedChunks) {
    return new Cbi1Error(
      "SnapshotBucketCount",
      `snapshot chunk declares ${chunkCount} chunks, the ${bucketCount}-bucket format needs ${expectedChunks}`
    )
  }
  if (chunkIndex >= chunkCount) {
    return new Cbi1Error(
      "Malformed",
      `snapshot chunk index ${chunkIndex} is not below chunk count ${chunkCount}`
    )
  }
  const offset = chunkIndex * SNAPSHOT_CHUNK_BUCKETS
  if (bucketOffset !== BigInt(offset)) {
    return new Cbi1Error(
      "Malformed",
      `snapshot chunk ${chunkIndex} has bucket offset ${bucketOffset}, expected ${offset}`
    )
  }
  const expectedWords = Math.min(SNAPSHOT_CHUNK_BUCKETS, bucketCount - offset)
  if (wordCount !== expectedWords) {
    return new Cbi1Error(
      "SnapshotChunkWordCount",
      `snapshot chunk ${chunkIndex} has ${wordCount} words, expected ${expectedWords}`
    )
  }
  return {
    _tag: "SnapshotChunk",
    epoch,
    chunkIndex,
    chunkCount,
    bucketOffset: offset,
    words: copyU32(bytes, CBI1_HEADER_BYTES + SNAPSHOT_PREFIX_BYTES, wordBytes)
  }
}

// Same opening as `decodeSnapshotChunk` (body length against the frame's prefix): the two frame
// kinds check different prefixes and name their own errors, on the consumer's per-frame decode path.
const decodeDelta = (
  bytes: Uint8Array,
  view: DataView,
  bucketCount: number,
  epoch: bigint
): Cbi1DeltaFrame | Cbi1Error => {
  const bodyLength = bytes.length - CBI1_HEADER_BYTES
  if (bodyLength < DELTA_PREFIX_BYTES) {
    return new Cbi1Error(
      "Truncated",
      `delta body has ${bodyLength} bytes, shorter than its ${DELTA_PREFIX_BYTES}-byte prefix`
    )
  }
  const baseEpoch = view.getBigUint64(48, true)
  const count = view.getUint32(56, true)
  if (count > CBI1_MAX_DELTA_IMAGES) {
    return new Cbi1Error(
      "DeltaImageCount",
      `delta declares ${count} images, exceeding the CBI1 maximum ${CBI1_MAX_DELTA_IMAGES}`
    )
  }
  const expectedLength = DELTA_PREFIX_BYTES + count * DELTA_IMAGE_BYTES
  if (bodyLength !== expectedLength) {
    return new Cbi1Error(
      "Malformed",
      `delta body has ${bodyLength} bytes, ${count} images need exactly ${expectedLength}`
    )
  }
  const images = copyU32(bytes, CBI1_HEADER_BYTES + DELTA_PREFIX_BYTES, count * DELTA_IMAGE_BYTES)
  for (let i = 0; i < images.length; i += 3) {
    if (images[i]! >= bucketCount) {
      return new Cbi1Error(
        "BucketIndex",
        `delta image ${i / 3} names bucket ${images[i]}, outside the ${bucketCount}-bucket lane`
      )
    }
  }
  return { _tag: "Delta", epoch, baseEpoch, images }
}

const decodeFrame = (bytes: Uint8Array, expected: Cbi1Expected): Cbi1Frame | Cbi1Error => {
  const length = bytes.length
  if (length < CBI1_HEADER_BYTES) {
    return new Cbi1Error("Truncated", `CBI1 frame has ${length} bytes, shorter than the 48-byte header`)
  }
  if (length > CBI1_MAX_FRAME_BYTES) {
    return new Cbi1Error(
      "FrameTooLarge",
      `CBI1 frame has ${length} bytes, exceeding the maximum ${CBI1_MAX_FRAME_BYTES}`
    )
  }
  for (let i = 0; i < 4; i++) {
    if (bytes[i] !== MAGIC_BYTES[i]) {
      const got = Array.from(bytes.subarray(0, 4), (b) => b.toString(16).padStart(2, "0")).join(" ")
      return new Cbi1Error("Magic", `bad CBI1 magic ${got}, expected 43 42 49 31 ("CBI1")`)
    }
  }
  const view = new DataView(bytes.buffer, bytes.byteOffset, length)
  const wireVersion = view.getUint16(4, true)
  if (wireVersion !== CBI1_WIRE_VERSION) {
    return new Cbi1Error(
      "WireVersion",
      `unsupported CBI1 wire version ${wireVersion}, expected ${CBI1_WIRE_VERSION}`
    )
  }
  const flags = view.getUint16(6, true)
  const fingerprintBits = view.getUint8(8)
  const slotsPerBucket = view.getUint8(9)
  const formatVersion = view.getUint16(10, true)
  const seed = view.getBigUint64(12, true)
  const wireBucketCount = view.getBigUint64(20, true)
  const dcId = view.getBigUint64(28, true)
  const epoch = view.getBigUint64(36, true)
  const checksum = view.getUint32(CHECKSUM_OFFSET, true)
  const actual = xxh3Low32Fast(bytes, CBI1_HEADER_BYTES)
  if (actual !== checksum) {
    return new Cbi1Error(
      "Checksum",
      `CBI1 body checksum mismatch: header says ${hex(BigInt(checksum))}, body hashes to ${hex(BigInt(actual))}`
    )
  }
  if (formatVersion !== FORMAT_VERSION) {
    return new Cbi1Error(
      "FormatVersion",
      `unsupported CKF format version ${formatVersion}, expected ${FORMAT_VERSION}`
    )
  }
  if (fingerprintBits !== FINGERPRINT_BITS) {
    return new Cbi1Error(
      "FormatFingerprintBits",
      `unsupported fingerprint width ${fingerprintBits}, expected ${FINGERPRINT_BITS}`
    )
  }
  if (slotsPerBucket !== SLOTS_PER_BUCKET) {
    return new Cbi1Error(
      "FormatSlotsPerBucket",
      `unsupported slots per bucket ${slotsPerBucket}, expected ${SLOTS_PER_BUCKET}`
    )
  }
  // Bounded before the Number conversion so that huge u64 values cannot round to a valid count.
  const bucketCount = wireBucketCount <= BigInt(CBI1_MAX_BUCKET_COUNT) ? Number(wireBucketCount) : -1
  if (!isValidBucketCount(bucketCount)) {
    return new Cbi1Error(
      "FormatBucketCount",
      `bucket count ${wireBucketCount} is not a power of two in 2..=${CBI1_MAX_BUCKET_COUNT}`
    )
  }
  const format = expected.format
  // Comparing every identity field (not only seed and count) rejects frames for an expectation
  // whose version, width or slots CBI1 cannot carry.
  if (
    seed !== format.seed ||
    bucketCount !== format.bucketCount ||
    format.formatVersion !== formatVersion ||
    format.fingerprintBits !== fingerprintBits ||
    format.slotsPerBucket !== slotsPerBucket
  ) {
    return new Cbi1Error(
      "FormatMismatch",
      `format mismatch: expected ${format.key}, received version ${formatVersion} seed ${hex(seed)} buckets ${bucketCount}`
    )
  }
  if (dcId !== expected.dcId) {
    return new Cbi1Error(
      "DcIdMismatch",
      `CBI1 frame is for dc ${hex(dcId)}, expected dc ${typeof expected.dcId === "bigint" ? hex(expected.dcId) : String(expected.dcId)}`
    )
  }
  if (flags === CBI1_FLAG_SNAPSHOT_CHUNK) return decodeSnapshotChunk(bytes, view, bucketCount, epoch)
  if (flags === CBI1_FLAG_DELTA) return decodeDelta(bytes, view, bucketCount, epoch)
  return new Cbi1Error("Flags", `unknown CBI1 frame flags 0x${flags.toString(16).padStart(4, "0")}`)
}

/**
 * Validates and decodes one frame against the receiver's expectation. The returned arrays are
 * owned copies. Epoch continuity (`epoch = baseEpoch + 1`) is left to the consumer, which reports
 * it as a sequence fault rather than a payload fault.
 */
export function decodeCbi1(bytes: Uint8Array, expected: Cbi1Expected): Cbi1Frame | Cbi1Error {
  try {
    return decodeFrame(bytes, expected)
  } catch (cause) {
    return new Cbi1Error("Malformed", `CBI1 frame could not be decoded: ${causeText(cause)}`)
  }
}

/**
 * Rebuilds one snapshot from its decoded chunks. Any out-of-order, foreign-epoch or
 * foreign-count chunk discards the partial snapshot, so a caller never sees a mix of two
 * snapshots; chunk 0 always starts afresh.
 */
export class Cbi1SnapshotAssembler {
  private epoch = 0n
  private chunkCount = 0
  private nextChunk = 0
  private nextBucket = 0
  private words: Uint32Array | undefined = undefined

  constructor(readonly expected: Cbi1Expected) {}

  reset(): void {
    this.epoch = 0n
    this.chunkCount = 0
    this.nextChunk = 0
    this.nextBucket = 0
    this.words = undefined
  }

  push(
    chunk: Cbi1SnapshotChunk
  ): undefined | { readonly epoch: bigint; readonly words: Uint32Array } | Cbi1Error {
    try {
      return this.absorb(chunk)
    } catch (cause) {
      this.reset()
      return new Cbi1Error("Malformed", `snapshot chunk could not be assembled: ${causeText(cause)}`)
    }
  }

  private fail(message: string): Cbi1Error {
    this.reset()
    return new Cbi1Error("ChunkSequence", message)
  }

  private absorb(
    chunk: Cbi1SnapshotChunk
  ): undefined | { readonly epoch: bigint; readonly words: Uint32Array } | Cbi1Error {
    if (chunk._tag !== "SnapshotChunk")
      return this.fail(`expected a snapshot chunk, got ${String(chunk._tag)}`)
    const { chunkIndex, chunkCount, epoch, bucketOffset, words } = chunk
    if (!Number.isInteger(chunkCount) || chunkCount <= 0 || !Number.isInteger(chunkIndex) || chunkIndex < 0) {
      return this.fail(`snapshot chunk ${chunkIndex} of ${chunkCount} is not a valid position`)
    }
    if (chunkIndex >= chunkCount) {
      return this.fail(`snapshot chunk index ${chunkIndex} is not below chunk count ${chunkCount}`)
    }
    const bucketCount = this.expected.format.bucketCount
    if (chunkIndex === 0) {
      this.reset()
      this.epoch = epoch
      this.chunkCount = chunkCount
      this.words = new Uint32Array(2 * bucketCount)
    }
    const target = this.words
    if (target === undefined || chunkIndex !== this.nextChunk) {
      return this.fail(
        target === undefined
          ? `snapshot chunk ${chunkIndex} arrived with no snapshot in progress (expected chunk 0)`
          : `snapshot chunk ${chunkIndex} arrived, expected chunk ${this.nextChunk}`
      )
    }
    if (chunkCount !== this.chunkCount) {
      return this.fail(
        `snapshot chunk declares ${chunkCount} chunks, the snapshot began with ${this.chunkCount}`
      )
    }
    if (epoch !== this.epoch) {
      return this.fail(
        `snapshot chunk ${chunkIndex} has epoch ${epoch}, the snapshot began at epoch ${this.epoch}`
      )
    }
    if (bucketOffset !== this.nextBucket) {
      return this.fail(
        `snapshot chunk ${chunkIndex} starts at bucket ${bucketOffset}, expected bucket ${this.nextBucket}`
      )
    }
    if (words.length % 2 !== 0 || this.nextBucket + words.length / 2 > bucketCount) {
      return this.fail(
        `snapshot chunk ${chunkIndex} carries ${words.length} word halves from bucket ${bucketOffset}, not whole buckets within the ${bucketCount}-bucket lane`
      )
    }
    target.set(words, 2 * this.nextBucket)
    this.nextBucket += words.length / 2
    this.nextChunk += 1
    if (this.nextChunk !== this.chunkCount) return undefined
    const covered = this.nextBucket
    const snapshotEpoch = this.epoch
    this.reset()
    if (covered !== bucketCount) {
      return new Cbi1Error(
        "IncompleteCoverage",
        `snapshot chunks cover ${covered} of ${bucketCount} buckets at epoch ${snapshotEpoch}`
      )
    }
    return { epoch: snapshotEpoch, words: target }
  }
}
