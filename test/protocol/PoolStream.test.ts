import fc from "fast-check"
import { describe, expect, it } from "vitest"
import {
  encodePoolFrame,
  FRAME_DELTA,
  FRAME_HEARTBEAT,
  type PoolFrame,
  PoolFrameDecodeError,
  PoolFrameDecoder
} from "../../src/protocol/PoolStream.js"
import { SseParser, sseEvent, sseHeartbeat } from "../../src/protocol/Sse.js"

const frameArb: fc.Arbitrary<PoolFrame> = fc.record({
  kind: fc.constantFrom(1, 2, 3, 4) as fc.Arbitrary<1 | 2 | 3 | 4>,
  baseSequence: fc.bigInt({ min: 0n, max: (1n << 64n) - 1n }),
  sequence: fc.bigInt({ min: 0n, max: (1n << 64n) - 1n }),
  sendTsUs: fc.bigInt({ min: 0n, max: (1n << 64n) - 1n }),
  payload: fc.uint8Array({ maxLength: 300 })
})

describe("pool stream frames", () => {
  it("lays out the fixed fields little-endian", () => {
    const bytes = encodePoolFrame({
      kind: FRAME_DELTA,
      baseSequence: 7n,
      sequence: 8n,
      sendTsUs: 9n,
      payload: new Uint8Array([1, 2])
    })
    const view = new DataView(bytes.buffer)
    expect(view.getUint32(0, true)).toBe(25 + 2)
    expect(bytes[4]).toBe(2)
    expect(view.getBigUint64(5, true)).toBe(7n)
    expect(view.getBigUint64(13, true)).toBe(8n)
    expect(view.getBigUint64(21, true)).toBe(9n)
    expect([...bytes.subarray(29)]).toEqual([1, 2])
  })

  it("decodes any split of a frame sequence", () => {
    fc.assert(
      fc.property(
        fc.array(frameArb, { maxLength: 8 }),
        fc.array(fc.integer({ min: 1, max: 64 }), { minLength: 1 }),
        (frames, cuts) => {
          const wire = Buffer.concat(frames.map(encodePoolFrame))
          const decoder = new PoolFrameDecoder()
          const out: Array<PoolFrame> = []
          let offset = 0
          for (let i = 0; offset < wire.length; i++) {
            const size = cuts[i % cuts.length]!
            out.push(...decoder.push(wire.subarray(offset, offset + size)))
            offset += size
          }
          expect(decoder.pending).toBe(0)
          expect(out).toEqual(frames)
        }
      )
    )
  })

  it("rejects lengths below the fixed fields and unknown kinds", () => {
    const short = new Uint8Array(8)
    new DataView(short.buffer).setUint32(0, 3, true)
    expect(() => new PoolFrameDecoder().push(short)).toThrow(PoolFrameDecodeError)
    const bad = encodePoolFrame({
      kind: FRAME_HEARTBEAT,
      baseSequence: 0n,
      sequence: 0n,
      sendTsUs: 0n,
      payload: new Uint8Array()
    })
    bad[4] = 9
    expect(() => new PoolFrameDecoder().push(bad)).toThrow(/unknown pool frame kind 9/)
  })
})

describe("server-sent events", () => {
  it("parses events split anywhere and drops heartbeats", () => {
    const wire = Buffer.concat([
      sseEvent("catalog", '{"revision":"1"}'),
      sseHeartbeat,
      sseEvent("catalog", '{"revision":"2"}')
    ])
    for (let cut = 1; cut < wire.length; cut++) {
      const parser = new SseParser()
      const messages = [...parser.push(wire.subarray(0, cut)), ...parser.push(wire.subarray(cut))]
      expect(messages).toEqual([
        { event: "catalog", data: '{"revision":"1"}' },
        { event: "catalog", data: '{"revision":"2"}' }
      ])
    }
  })
})
