/**
 * The subscriber's message queue against a plain model (an array of messages, each an array of
 * byte strings): random frames over shared chunks, takes of random sizes, connections that end
 * mid-message, and enough traffic to compact and grow its records many times. The taken
 * messages, their order, the count and the reading side's pauses must be the model's.
 */

import fc from "fast-check"
import { describe, expect, it } from "vitest"
import { type FlowControl, MessageQueue } from "../../../src/transport/zmtp/internal/MessageQueue.js"

type Op =
  | {
      readonly kind: "chunk"
      readonly messages: ReadonlyArray<ReadonlyArray<number>>
      readonly cutLast: boolean
    }
  | { readonly kind: "take"; readonly max: number }
  | { readonly kind: "end" }

const op: fc.Arbitrary<Op> = fc.oneof(
  {
    weight: 4,
    arbitrary: fc.record({
      kind: fc.constant("chunk" as const),
      // Frame sizes of each message; a chunk holds several messages, as a TCP read does.
      messages: fc.array(fc.array(fc.integer({ min: 0, max: 12 }), { minLength: 1, maxLength: 4 }), {
        minLength: 1,
        maxLength: 40
      }),
      // Whether the chunk's last message continues in the next chunk (its last frame not yet).
      cutLast: fc.boolean()
    })
  },
  {
    weight: 3,
    arbitrary: fc.record({ kind: fc.constant("take" as const), max: fc.integer({ min: 1, max: 64 }) })
  },
  { weight: 1, arbitrary: fc.constant({ kind: "end" as const }) }
)

describe("ZMTP message queue", () => {
  it("gives back exactly the complete messages, in order, across compactions and ended connections", () => {
    fc.assert(
      fc.property(
        fc.array(op, { minLength: 1, maxLength: 300 }),
        fc.integer({ min: 1, max: 200 }),
        (ops, mark) => {
          const queue = new MessageQueue(mark)
          let paused = false
          const reader: FlowControl = {
            pause: () => {
              paused = true
            },
            resume: () => {
              paused = false
            }
          }
          queue.attach(reader)
          const complete: Array<Array<string>> = []
          let partial: Array<string> = []
          let stamp = 0
          for (const o of ops) {
            if (o.kind === "chunk") {
              // One buffer per chunk, every frame a distinct run of bytes in it.
              const frames = o.messages.flatMap((sizes, m) =>
                sizes.map((size, f) => ({
                  bytes: Buffer.from(
                    Array.from({ length: size }, (_, i) => (stamp + m * 7 + f * 3 + i) & 0xff)
                  ),
                  last: f === sizes.length - 1 && !(o.cutLast && m === o.messages.length - 1)
                }))
              )
              stamp++
              const chunk = Buffer.concat([Buffer.from([0xee]), ...frames.map((f) => f.bytes)])
              let at = 1
              for (const f of frames) {
                queue.frame(chunk, at, f.bytes.length, f.last)
                partial.push(f.bytes.toString("hex"))
                if (f.last) {
                  complete.push(partial)
                  partial = []
                }
                at += f.bytes.length
              }
              queue.flush()
              if (complete.length >= mark) expect(paused).toBe(true)
            } else if (o.kind === "take") {
              const into: Array<Array<Buffer>> = []
              const n = queue.take(into, o.max)
              const want = complete.splice(0, o.max)
              expect(n).toBe(want.length)
              expect(into.map((m) => m.map((f) => f.toString("hex")))).toEqual(want)
              if (complete.length <= Math.floor(mark / 2)) expect(paused).toBe(false)
            } else {
              queue.dropPartial()
              partial = []
            }
            expect(queue.size).toBe(complete.length)
          }
          const rest: Array<Array<Buffer>> = []
          queue.take(rest, Number.MAX_SAFE_INTEGER)
          expect(rest.map((m) => m.map((f) => f.toString("hex")))).toEqual(complete)
        }
      ),
      { numRuns: 150 }
    )
  })

  it("keeps a deep backlog across many compactions", () => {
    const queue = new MessageQueue(1_000_000)
    // A chunk per 100 messages; byte j of chunk k is (k + j) & 0xff, so a frame read from the
    // wrong chunk or place shows.
    const chunkOf = (k: number) => Buffer.from(Array.from({ length: 256 }, (_, j) => (k + j) & 0xff))
    let chunk = chunkOf(0)
    let sent = 0
    let taken = 0
    let wrong = 0
    for (let round = 0; round < 40; round++) {
      // 3,000 two-frame messages in, 2,000 out: the backlog grows by 1,000 a round.
      for (let i = 0; i < 3000; i++, sent++) {
        if (sent % 100 === 0) chunk = chunkOf(sent / 100)
        queue.frame(chunk, sent % 100, 1, false)
        queue.frame(chunk, 100 + (sent % 100), 2, true)
      }
      const into: Array<Array<Buffer>> = []
      queue.take(into, 2000)
      for (const [first, second] of into) {
        const k = Math.floor(taken / 100)
        const j = taken % 100
        if (
          first!.length !== 1 ||
          first![0] !== ((k + j) & 0xff) ||
          second!.length !== 2 ||
          second![0] !== ((k + 100 + j) & 0xff) ||
          second![1] !== ((k + 101 + j) & 0xff)
        )
          wrong++
        taken++
      }
    }
    expect(wrong).toBe(0)
    expect(taken).toBe(80_000)
    expect(queue.size).toBe(sent - taken)
  })
})
