import { describe, expect, it } from "@effect/vitest"
import { Effect, Fiber, Option } from "effect"
import { DcCkfFormatIdentity, LaneLease } from "../../src/ckf/identity.js"
import type { DcCkfDelta } from "../../src/ckf/publisher.js"
import { makeDeltaBroadcast } from "../../src/relay/DeltaBroadcast.js"

const delta = (sequence: number): DcCkfDelta => ({
  identity: { format: new DcCkfFormatIdentity(1n, 16) } as unknown as DcCkfDelta["identity"],
  lease: new LaneLease(1n, 0, 1n),
  baseSequence: BigInt(sequence - 1),
  sequence: BigInt(sequence),
  images: new Uint32Array(0)
})

describe("DeltaBroadcast", () => {
  it.effect("delivers to nobody, without failing, while no receiver is attached", () =>
    Effect.gen(function* () {
      const broadcast = makeDeltaBroadcast(4)
      expect(broadcast.sink.enqueue(delta(1))).toBeUndefined()
      const receiver = broadcast.subscribe()
      expect(broadcast.sink.enqueue(delta(2))).toBeUndefined()
      // A receiver starts with what is sent after it subscribed.
      expect((yield* receiver.take).sequence).toBe(2n)
    })
  )

  it.effect("delivers to every receiver subscribed before the send", () =>
    Effect.gen(function* () {
      const broadcast = makeDeltaBroadcast(4)
      const early = broadcast.subscribe()
      broadcast.sink.enqueue(delta(1))
      const late = broadcast.subscribe()
      broadcast.sink.enqueue(delta(2))
      expect((yield* early.take).sequence).toBe(1n)
      expect((yield* early.take).sequence).toBe(2n)
      expect((yield* late.take).sequence).toBe(2n)
      expect(Option.isNone(yield* late.poll)).toBe(true)
    })
  )

  it.effect("wakes a waiting take", () =>
    Effect.gen(function* () {
      const broadcast = makeDeltaBroadcast(4)
      const receiver = broadcast.subscribe()
      const waiting = yield* Effect.fork(receiver.take)
      yield* Effect.yieldNow()
      broadcast.sink.enqueue(delta(1))
      expect((yield* Fiber.join(waiting)).sequence).toBe(1n)
    })
  )

  it.effect("an interrupted take loses no delta", () =>
    Effect.gen(function* () {
      const broadcast = makeDeltaBroadcast(4)
      const receiver = broadcast.subscribe()
      const waiting = yield* Effect.fork(receiver.take)
      yield* Effect.yieldNow()
      broadcast.sink.enqueue(delta(1))
      yield* Fiber.interrupt(waiting)
      expect((yield* receiver.take).sequence).toBe(1n)
    })
  )

  it.effect("an overflowing receiver is lagged at once and stays attached; others continue", () =>
    Effect.gen(function* () {
      const broadcast = makeDeltaBroadcast(2)
      const slow = broadcast.subscribe()
      const fast = broadcast.subscribe()
      for (let s = 1; s <= 3; s++) {
        broadcast.sink.enqueue(delta(s))
        if (s < 3) yield* fast.take
      }
      expect((yield* Effect.flip(slow.take))._tag).toBe("DeltaStreamLagged")
      expect((yield* Effect.flip(slow.poll))._tag).toBe("DeltaStreamLagged")
      expect((yield* fast.take).sequence).toBe(3n)
      expect(broadcast.receiverCount()).toBe(2)
      yield* slow.close
      expect(broadcast.receiverCount()).toBe(1)
    })
  )

  it.effect("a drain close hands out buffered deltas before Closed", () =>
    Effect.gen(function* () {
      const broadcast = makeDeltaBroadcast(4)
      const receiver = broadcast.subscribe()
      broadcast.sink.enqueue(delta(1))
      broadcast.close("drain")
      expect((yield* receiver.take).sequence).toBe(1n)
      expect((yield* Effect.flip(receiver.take))._tag).toBe("DeltaStreamClosed")
      expect((yield* Effect.flip(broadcast.subscribe().take))._tag).toBe("DeltaStreamClosed")
    })
  )

  it.effect("a discard close fails pending and buffered takes at once", () =>
    Effect.gen(function* () {
      const broadcast = makeDeltaBroadcast(4)
      const buffered = broadcast.subscribe()
      const idle = broadcast.subscribe()
      broadcast.sink.enqueue(delta(1))
      yield* idle.take
      const waiting = yield* Effect.fork(Effect.flip(idle.take))
      yield* Effect.yieldNow()
      broadcast.close("discard")
      expect((yield* Fiber.join(waiting))._tag).toBe("DeltaStreamClosed")
      expect((yield* Effect.flip(buffered.take))._tag).toBe("DeltaStreamClosed")
      expect(broadcast.receiverCount()).toBe(0)
    })
  )
})
