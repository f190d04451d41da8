/**
 * The body of `GET /v1/endpoints/{ns.component.endpoint}/snapshot` (PROTOCOL §5 ◆), written in
 * slices rather than built as one string.
 *
 * The document is `{layoutGeneration, sequence, memberCount, uniqueBlockCount, format, buckets}`
 * with `buckets` the base64 of the little-endian u64 words, last. Everything before the base64 is
 * encoded by the same schema as `DiagnosticSnapshotJson` (with an empty `buckets`), so the
 * streamed text equals `encodeJsonText(DiagnosticSnapshotJson)` of the same snapshot byte for byte.
 * The words are cut into slices whose byte length is a multiple of 3: base64 of such slices
 * carries no padding, so the slices' base64 concatenates to the base64 of the whole. Node's
 * native base64 encodes a slice in well under a millisecond; building the whole document through
 * the schema took ~0.6 s and ~177 MB per request at the default filter size.
 */

import * as os from "node:os"
import { Effect, Either, Schema } from "effect"
import { encodeJsonText, JsonEncodeError } from "../../../protocol/Json.js"
import { type DiagnosticSnapshotDocument, DiagnosticSnapshotJson } from "../../../protocol/RelayApi.js"

/** Bytes of words per slice: a multiple of 3 (whole base64 quanta) and of 8 (whole u64 words). */
export const SNAPSHOT_SLICE_BYTES = 3 * 64 * 1024

/** Snapshot responses being written at once (PROTOCOL §5); more get 429 `RESOURCE_LIMIT`. */
export const MAX_SNAPSHOTS_IN_PROGRESS = 2

const SnapshotHeadJson = Schema.Struct({ ...DiagnosticSnapshotJson.fields, buckets: Schema.Literal("") })
const encodeHead = encodeJsonText(SnapshotHeadJson)
/** How the head document ends: `buckets` is the last field, so the base64 goes right before `"}`. */
const HEAD_TAIL = '"buckets":""}'
const BODY_END = Buffer.from('"}', "latin1")

const LITTLE_ENDIAN_HOST = os.endianness() === "LE"

export type SnapshotHead = Omit<DiagnosticSnapshotDocument, "buckets">

/** A snapshot body handed out slice by slice. */
interface SnapshotBody {
  /** Bytes of the whole body (for `content-length`). */
  readonly byteLength: number
  /** The next piece of the body, `undefined` once everything was handed out. */
  readonly next: () => Uint8Array | undefined
}

/** `words[byteStart / 4 …]` as little-endian bytes; a view of the words on little-endian hosts. */
const littleEndianBytes = (words: Uint32Array, byteStart: number, byteEnd: number): Buffer => {
  if (LITTLE_ENDIAN_HOST) return Buffer.from(words.buffer, words.byteOffset + byteStart, byteEnd - byteStart)
  const out = Buffer.allocUnsafe(byteEnd - byteStart)
  for (let at = byteStart; at < byteEnd; at += 4) out.writeUInt32LE(words[at / 4]!, at - byteStart)
  return out
}

/**
 * The body for `head` and `words` (`[lo, hi]` pairs). `words` must stay unchanged until the last
 * slice was taken: the caller hands in its own barrier copy.
 */
export const snapshotBody = (
  head: SnapshotHead,
  words: Uint32Array
): Either.Either<SnapshotBody, JsonEncodeError> =>
  Either.flatMap(encodeHead({ ...head, buckets: "" }), (text) => {
    if (!text.endsWith(HEAD_TAIL)) {
      return Either.left(new JsonEncodeError({ message: "snapshot document does not end with its buckets" }))
    }
    const prefix = Buffer.from(text.slice(0, text.length - 2), "utf8")
    const totalBytes = words.byteLength
    let offset = 0
    let stage: "prefix" | "words" | "end" | "done" = "prefix"
    return Either.right({
      byteLength: prefix.length + 4 * Math.ceil(totalBytes / 3) + BODY_END.length,
      next: () => {
        switch (stage) {
          case "prefix":
            stage = totalBytes === 0 ? "end" : "words"
            return prefix
          case "words": {
            const end = Math.min(totalBytes, offset + SNAPSHOT_SLICE_BYTES)
            const slice = littleEndianBytes(words, offset, end).toString("base64")
            offset = end
            if (offset === totalBytes) stage = "end"
            return Buffer.from(slice, "latin1")
          }
          case "end":
            stage = "done"
            return BODY_END
          case "done":
            return undefined
        }
      }
    })
  })

/**
 * Resumes once the event loop has run its pending I/O (one `setImmediate` turn). Effect's own
 * yield only reschedules on microtasks, which would keep sockets and timers waiting.
 */
export const yieldToEventLoop: Effect.Effect<void> = Effect.async<void>((resume) => {
  const handle = setImmediate(() => resume(Effect.void))
  return Effect.sync(() => clearImmediate(handle))
})

/** Counts responses in progress against `max`. */
export class InProgressLimit {
  private used = 0
  constructor(readonly max: number) {}

  get inProgress(): number {
    return this.used
  }

  /** Takes a place when one is free. */
  tryAcquire(): boolean {
    if (this.used >= this.max) return false
    this.used++
    return true
  }

  release(): void {
    this.used = Math.max(0, this.used - 1)
  }
}
