/**
 * The frame parser against a reference encoder written from RFC 23 §2.4 (not the code under
 * test): random messages and commands, short and long sizes (long ones also for small frames,
 * which the RFC allows), cut into random chunks, must come out exactly as they went in.
 */

import { createHash } from "node:crypto"
import fc from "fast-check"
import { describe, expect, it } from "vitest"
import { FrameParser, messageHandler } from "../../../src/transport/zmtp/internal/FrameParser.js"
import type { ZmtpFault } from "../../../src/transport/zmtp/ZmtpError.js"

type Item =
  | {
      readonly kind: "message"
      readonly frames: ReadonlyArray<Uint8Array>
      readonly long: ReadonlyArray<boolean>
    }
  | { readonly kind: "command"; readonly body: Uint8Array; readonly long: boolean }

const encodeFrame = (more: boolean, command: boolean, body: Uint8Array, long: boolean): Buffer => {
  const useLong = long || body.length > 255
  const flags = (more ? 1 : 0) | (useLong ? 2 : 0) | (command ? 4 : 0)
  const header = Buffer.alloc(useLong ? 9 : 2)
  header[0] = flags
  if (useLong) header.writeBigUInt64BE(BigInt(body.length), 1)
  else header[1] = body.length
  return Buffer.concat([header, body])
}

const encode = (items: ReadonlyArray<Item>): Buffer =>
  Buffer.concat(
    items.flatMap((item) =>
      item.kind === "command"
        ? [encodeFrame(false, true, item.body, item.long)]
        : item.frames.map((frame, i) => encodeFrame(i < item.frames.length - 1, false, frame, item.long[i]!))
    )
  )

const parseAll = (chunks: ReadonlyArray<Buffer>, maxFrameBytes = 1 << 30) => {
  const out: Array<{ kind: string; frames: Array<Buffer> }> = []
  let fault: ZmtpFault | undefined
  const parser = new FrameParser(
    messageHandler({
      onMessage: (frames) => {
        out.push({ kind: "message", frames })
        return undefined
      },
      onCommand: (body) => {
        out.push({ kind: "command", frames: [body] })
        return undefined
      }
    }),
    maxFrameBytes
  )
  for (const chunk of chunks) fault ??= parser.push(chunk)
  return { out, fault, buffered: parser.bufferedBytes }
}

const body = fc.oneof(
  { weight: 6, arbitrary: fc.uint8Array({ maxLength: 40 }) },
  { weight: 2, arbitrary: fc.uint8Array({ minLength: 250, maxLength: 300 }) },
  {
    weight: 1,
    arbitrary: fc.integer({ min: 60_000, max: 140_000 }).map((n) => new Uint8Array(n).fill(n & 0xff))
  }
)

const item: fc.Arbitrary<Item> = fc.oneof(
  {
    weight: 5,
    arbitrary: fc.array(fc.tuple(body, fc.boolean()), { minLength: 1, maxLength: 5 }).map((frames) => ({
      kind: "message" as const,
      frames: frames.map(([b]) => b),
      long: frames.map(([, l]) => l)
    }))
  },
  {
    weight: 1,
    arbitrary: fc
      .tuple(fc.uint8Array({ maxLength: 30 }), fc.boolean())
      .map(([b, long]) => ({ kind: "command" as const, body: b, long }))
  }
)

/** Cuts `bytes` at the given fractions (sorted, deduplicated), so chunks of every size occur. */
const cut = (bytes: Buffer, points: ReadonlyArray<number>): Array<Buffer> => {
  const at = [...new Set(points.map((p) => Math.floor(p * bytes.length)))].sort((a, b) => a - b)
  const chunks: Array<Buffer> = []
  let from = 0
  for (const p of at) {
    chunks.push(bytes.subarray(from, p))
    from = p
  }
  chunks.push(bytes.subarray(from))
  return chunks
}

/** The items as `kind:hex-digest` lines, so a mismatch prints small and compares fast. */
const summary = (
  list: ReadonlyArray<{ readonly kind: string; readonly frames: ReadonlyArray<Uint8Array> }>
) =>
  list.map(
    (i) =>
      `${i.kind}:${i.frames.map((f) => `${f.length}/${createHash("sha1").update(f).digest("hex")}`).join(",")}`
  )

const expected = (items: ReadonlyArray<Item>) =>
  summary(items.map((i) => (i.kind === "command" ? { kind: "command", frames: [i.body] } : i)))

describe("ZMTP frame parser", () => {
  it("yields what the reference encoder wrote, however the stream is cut", () => {
    fc.assert(
      fc.property(
        fc.array(item, { minLength: 1, maxLength: 30 }),
        fc.array(fc.double({ min: 0, max: 1, noNaN: true }), { maxLength: 40 }),
        (items, points) => {
          const { out, fault, buffered } = parseAll(cut(encode(items), points))
          expect(fault).toBeUndefined()
          expect(buffered).toBe(0)
          expect(summary(out)).toEqual(expected(items))
        }
      ),
      { numRuns: 200 }
    )
  })

  it("one byte at a time", () => {
    fc.assert(
      fc.property(fc.array(item, { minLength: 1, maxLength: 6 }), (items) => {
        const small = items.filter((i) => i.kind === "command" || i.frames.every((f) => f.length < 1000))
        const bytes = encode(small)
        const chunks = Array.from({ length: bytes.length }, (_, i) => bytes.subarray(i, i + 1))
        const { out, fault, buffered } = parseAll(chunks)
        expect(fault).toBeUndefined()
        expect(buffered).toBe(0)
        expect(summary(out)).toEqual(expected(small))
      }),
      { numRuns: 50 }
    )
  })

  it("holds a partial message's bytes only until it completes", () => {
    const bytes = encode([{ kind: "message", frames: [new Uint8Array(5000).fill(7)], long: [false] }])
    const first = parseAll([bytes.subarray(0, 4000)])
    expect(first.out).toEqual([])
    expect(first.buffered).toBe(4000)
  })

  it("refuses reserved flags, a command with MORE or inside a message, and sizes over the limit", () => {
    const faultOf = (bytes: Buffer, max?: number) => parseAll([bytes], max).fault?.reason
    expect(faultOf(Buffer.from([0x08, 0]))).toBe("frame-flags")
    expect(faultOf(Buffer.from([0x05, 0]))).toBe("frame-flags")
    expect(
      faultOf(Buffer.concat([encodeFrame(true, false, new Uint8Array(1), false), Buffer.from([0x04, 0])]))
    ).toBe("frame-flags")
    expect(faultOf(encodeFrame(false, false, new Uint8Array(101), false), 100)).toBe("frame-size")
    expect(faultOf(encodeFrame(false, false, new Uint8Array(101), true).subarray(0, 9), 100)).toBe(
      "frame-size"
    )
    expect(faultOf(encodeFrame(false, false, new Uint8Array(100), true), 100)).toBeUndefined()
  })

  it("stays stopped after a fault, and a handler's fault stops it mid-chunk", () => {
    const seen: Array<string> = []
    const parser = new FrameParser(
      messageHandler({
        onMessage: (frames) => {
          seen.push(frames[0]!.toString())
          return frames[0]!.toString() === "stop" ? { reason: "handshake", message: "stop" } : undefined
        },
        onCommand: () => undefined
      }),
      1000
    )
    const bytes = Buffer.concat(
      ["a", "stop", "b"].map((s) => encodeFrame(false, false, Buffer.from(s), false))
    )
    expect(parser.push(bytes)?.message).toBe("stop")
    expect(parser.push(encodeFrame(false, false, Buffer.from("c"), false))?.message).toBe("stop")
    expect(seen).toEqual(["a", "stop"])
  })
})
