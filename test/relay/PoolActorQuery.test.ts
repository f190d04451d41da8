/**
 * The pool actor's worker query (PROTOCOL §5.1 ◆3): one command of the actor, so an answer
 * reflects one point of its state, between two applied events, however queries and events
 * interleave in its mailbox.
 */

import { describe, expect, it } from "@effect/vitest"
import { Effect, Fiber } from "effect"
import { CanonicalCkfState } from "../../src/ckf/canonical.js"
import { ckfConfig } from "../../src/ckf/config.js"
import { CacheSemanticsId, DcId, IndexerDomainId, PoolId, RoutingScopeId } from "../../src/ckf/identity.js"
import { sequenceHashes } from "../../src/ckf/tokens.js"
import { hashPairs } from "../../src/ckf/u64.js"
import type { RouterEvent } from "../../src/protocol/Events.js"
import { make } from "../../src/relay/internal/PoolActorLoop.js"
import type { StreamScope } from "../../src/relay/PoolActor.js"

const streamScope: StreamScope = {
  relayIncarnation: 1n,
  layoutGeneration: 1n,
  poolId: new PoolId(
    new IndexerDomainId(
      new CacheSemanticsId(new Uint8Array(16).fill(1), "explicit"),
      new RoutingScopeId(new Uint8Array(16).fill(3), "explicit")
    ),
    new DcId(2n)
  )
}

/** A 40-block prompt's local hashes and canonical addresses. */
const BLOCKS = 40
const local = Array.from({ length: BLOCKS }, (_, i) => 0x1234_5678_0000n + BigInt(i) * 7919n)
const addresses = sequenceHashes(hashPairs(local))

/**
 * Step i (1-based): block i-1 of the prompt on worker 1's device, on worker 2's device and on
 * worker 2's host, each chained to its parent. A step's three events are queued at once, so a
 * query sees all three or none of them.
 */
const eventsOf = (i: number): Array<RouterEvent> => {
  const b = i - 1
  const ext = (worker: number) => BigInt(worker) * 1_000_000n + BigInt(b) + 1n
  const stored = (worker: string, tier: "device" | "host_pinned", id: number): RouterEvent => ({
    workerId: worker,
    dpRank: 0,
    eventId: id,
    storageTier: tier,
    data: {
      _tag: "Stored",
      blockHashes: hashPairs([ext(Number(worker))]),
      tokensHashes: hashPairs([local[b]!]),
      parentHash: b === 0 ? undefined : hashPairs([ext(Number(worker)) - 1n]),
      startPosition: undefined
    }
  })
  return [stored("1", "device", i), stored("2", "device", 2 * i - 1), stored("2", "host_pinned", 2 * i)]
}

describe("PoolActor worker queries", () => {
  it.scoped("a query sees exactly the events admitted before it, each answer one point of the state", () =>
    Effect.gen(function* () {
      const actor = yield* make(new CanonicalCkfState(ckfConfig(1024)), streamScope)
      const expected = [
        { workerId: "1", dpRank: 0 },
        { workerId: "2", dpRank: 0 },
        { workerId: "3", dpRank: 0 }
      ]
      const query = actor.queryWorkers({ hashes: addresses, count: BLOCKS, expected })
      // Admitted, then asked: the answer is the state after exactly those events.
      for (let i = 1; i <= 12; i++) {
        expect(actor.admitEventsNow(0, eventsOf(i))).toBe(true)
        const answer = yield* query
        expect(answer.members).toEqual(expected)
        expect(Array.from(answer.device)).toEqual([i, i, 0])
        expect(Array.from(answer.host)).toEqual([i, i, 0])
        expect(Array.from(answer.frequencies)).toEqual(Array.from({ length: i }, () => 2))
      }
      // Many queries in flight while events keep coming: each answer is some prefix of the
      // events, whole (worker 1 and 2 agree), and later queries never see less.
      const fibers: Array<
        Fiber.RuntimeFiber<{ readonly depth: number; readonly consistent: boolean }, unknown>
      > = []
      for (let i = 13; i <= BLOCKS; i++) {
        fibers.push(
          yield* Effect.fork(
            Effect.map(query, (a) => ({
              depth: a.device[0]!,
              consistent:
                a.device[1] === a.device[0] &&
                a.host[1] === a.device[0] &&
                a.frequencies.length === a.device[0] &&
                a.frequencies.every((f) => f === 2)
            }))
          )
        )
        expect(actor.admitEventsNow(0, eventsOf(i))).toBe(true)
        yield* Effect.yieldNow()
      }
      const answers = yield* Effect.forEach(fibers, Fiber.join)
      for (const [k, answer] of answers.entries()) {
        expect(answer.consistent).toBe(true)
        expect(answer.depth).toBeGreaterThanOrEqual(12 + k)
        if (k > 0) expect(answer.depth).toBeGreaterThanOrEqual(answers[k - 1]!.depth)
      }
      expect(Array.from((yield* query).device)).toEqual([BLOCKS, BLOCKS, 0])
    })
  )

  it.scoped("answers on the caller's turn only at rest, and then as the queued query would", () =>
    Effect.gen(function* () {
      const actor = yield* make(new CanonicalCkfState(ckfConfig(1024)), streamScope)
      const ask = { hashes: addresses, count: BLOCKS }
      for (let i = 1; i <= 6; i++) {
        expect(actor.admitEventsNow(0, eventsOf(i))).toBe(true)
        // Events queued: the query must wait behind them.
        expect(actor.queryWorkersNow(ask)).toBeUndefined()
        const queued = yield* actor.queryWorkers(ask)
        // Drained: the actor waits with nothing queued, and both ways agree.
        yield* actor.flush
        const now = actor.queryWorkersNow(ask)
        expect(now).toBeDefined()
        expect(Array.from(now!.device)).toEqual([i, i])
        expect(now).toEqual(queued)
      }
      // A command under way (a pause) is not rest either.
      const release = yield* actor.pause
      expect(actor.queryWorkersNow(ask)).toBeUndefined()
      yield* release
      yield* actor.flush
      expect(actor.queryWorkersNow(ask)).toBeDefined()
      // Nor is a stopped actor: the mailbox says why.
      yield* actor.shutdown
      expect(actor.queryWorkersNow(ask)).toBeUndefined()
    })
  )
})
