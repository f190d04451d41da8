/** Helpers of the ZeroMQ integration tests: bounded polling and a recording batch handler. */

import { Effect } from "effect"
import { hashPairsToBigInts } from "../../src/ckf/u64.js"
import type { RouterEvent } from "../../src/protocol/Events.js"
import { EndpointId } from "../../src/protocol/Model.js"

const realPause = Effect.promise(() => new Promise<void>((resolve) => setTimeout(resolve, 5)))

/**
 * Polls `check` every few real milliseconds until it yields a value other than undefined/false.
 * The deadline is wall-clock time: these tests wait for real sockets, and some of them run the
 * relay's own timers on a `TestClock` driven faster than real time.
 */
export const eventually = <A, E>(
  check: Effect.Effect<A | undefined | false, E>,
  what: string,
  timeoutMs = 5000
): Effect.Effect<A, E> =>
  Effect.gen(function* () {
    const deadline = Date.now() + timeoutMs
    for (;;) {
      const value = yield* check
      if (value !== undefined && value !== false) return value
      if (Date.now() > deadline) return yield* Effect.die(new Error(`timed out waiting for ${what}`))
      yield* realPause
    }
  })

export interface Recorder {
  readonly handler: (publisherId: bigint, events: ReadonlyArray<RouterEvent>) => Effect.Effect<void>
  readonly batches: (publisherId: bigint) => ReadonlyArray<ReadonlyArray<RouterEvent>>
  readonly events: (publisherId: bigint) => ReadonlyArray<RouterEvent>
  readonly eventIds: (publisherId: bigint) => ReadonlyArray<number>
  /** Per-publisher gate: while set, that publisher's handler call waits for it. */
  readonly block: (publisherId: bigint, gate: Effect.Effect<void>) => void
  readonly unblock: (publisherId: bigint) => void
}

export const makeRecorder = (): Recorder => {
  const received = new Map<bigint, Array<ReadonlyArray<RouterEvent>>>()
  const gates = new Map<bigint, Effect.Effect<void>>()
  return {
    handler: (publisherId, events) =>
      Effect.suspend(() => gates.get(publisherId) ?? Effect.void).pipe(
        Effect.zipRight(
          Effect.sync(() => {
            const list = received.get(publisherId) ?? []
            list.push(events)
            received.set(publisherId, list)
          })
        )
      ),
    batches: (publisherId) => received.get(publisherId) ?? [],
    events: (publisherId) => (received.get(publisherId) ?? []).flat(),
    eventIds: (publisherId) => (received.get(publisherId) ?? []).flat().map((event) => event.eventId),
    block: (publisherId, gate) => {
      gates.set(publisherId, gate)
    },
    unblock: (publisherId) => {
      gates.delete(publisherId)
    }
  }
}

export const KV_ENDPOINT: EndpointId = new EndpointId({
  namespace: "test",
  component: "router",
  endpoint: "kv-state"
})

export const storedBigInts = (events: ReadonlyArray<RouterEvent>): Array<bigint> =>
  events.flatMap((event) => (event.data._tag === "Stored" ? hashPairsToBigInts(event.data.blockHashes) : []))

/** Strictly increasing and contiguous from `first`. */
export const isContiguousFrom = (ids: ReadonlyArray<number>, first: number): boolean =>
  ids.every((id, i) => id === first + i)
