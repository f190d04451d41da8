/**
 * Pool actor benchmark: 8-block Stored events (unique hashes, table load ≤ 80%) admitted through
 * `PoolActor.admitEvent` with one subscriber whose receiver is drained, measured to completion
 * (a final flush), against the bare `DcCkfState.applyEvent` + `DcCkfPublisher.publish` loop in the
 * same run. The target: the Effect layer costs at most 2× the core (ratio ≥ 0.5).
 *
 * The canonical round runs the relay's own addressing (PROTOCOL §3.3): the same events with their
 * tokens hashes, each a chain from the root, on a `CanonicalCkfState` through the live path. It is
 * the in-process figure the end-to-end suite compares the relay process with.
 */

import { performance } from "node:perf_hooks"
import { Effect, Fiber } from "effect"
import { CanonicalCkfState } from "../src/ckf/canonical.js"
import { ckfConfig } from "../src/ckf/config.js"
import {
  CacheSemanticsId,
  DcId,
  IndexerDomainId,
  LaneLease,
  PoolId,
  ProducerIdentity,
  RoutingScopeId
} from "../src/ckf/identity.js"
import { type DcCkfDelta, DcCkfPublisher } from "../src/ckf/publisher.js"
import { DcCkfState } from "../src/ckf/state.js"
import type { RouterEvent } from "../src/protocol/Events.js"
import { make } from "../src/relay/internal/PoolActorLoop.js"
import type { StreamScope } from "../src/relay/PoolActor.js"
import { type BenchContext, gc, HashStream, record } from "./harness.js"

const BLOCKS_PER_EVENT = 8
// The cadence of the producer_apply suite: one publication batch per 16 events.
const PUBLISH_EVERY_N_EVENTS = 16

const poolId = new PoolId(
  new IndexerDomainId(
    new CacheSemanticsId(new Uint8Array(16).fill(1), "explicit"),
    new RoutingScopeId(new Uint8Array(16).fill(3), "explicit")
  ),
  new DcId(2n)
)
const streamScope: StreamScope = { relayIncarnation: 1n, layoutGeneration: 1n, poolId }
const lease = new LaneLease(4n, 0, 1n)

/** The events of a run; `canonical` gives each block its tokens hash (the block hash itself), as the e2e workers do. */
const workload = (events: number, seed: number, canonical = false): Array<RouterEvent> => {
  const stream = new HashStream(seed)
  const out: Array<RouterEvent> = []
  for (let e = 0; e < events; e++) {
    const pairs = new Uint32Array(BLOCKS_PER_EVENT * 2)
    for (let i = 0; i < BLOCKS_PER_EVENT; i++) stream.next(pairs, 2 * i)
    out.push({
      workerId: "1",
      dpRank: 0,
      eventId: e + 1,
      storageTier: "device",
      data: {
        _tag: "Stored",
        blockHashes: pairs,
        tokensHashes: canonical ? pairs : undefined,
        parentHash: undefined,
        startPosition: undefined
      }
    })
  }
  return out
}

const newState = (expected: number, canonical: boolean): DcCkfState => {
  const config = ckfConfig(expected, { publishEveryNEvents: PUBLISH_EVERY_N_EVENTS })
  return canonical ? new CanonicalCkfState(config) : new DcCkfState(config)
}

/** Bare core: apply, publish each boundary batch to a subscribed lease, publish the final tail. */
const coreRound = (expected: number, events: ReadonlyArray<RouterEvent>, canonical = false): number => {
  const state = newState(expected, canonical)
  let delivered = 0
  const sink = {
    enqueue: (_: DcCkfDelta): undefined => {
      delivered++
      return undefined
    }
  }
  const publisher = new DcCkfPublisher(new ProducerIdentity(poolId, 1n, 1n, state.format), 0n, sink)
  publisher.snapshotAfterBarrier(state, lease)
  gc()
  const start = performance.now()
  for (const event of events) {
    const batch = state.applyEvent(event).publication
    if (batch !== undefined) publisher.publish(batch)
  }
  const tail = state.flush()
  if (tail !== undefined) publisher.publish(tail)
  const elapsed = performance.now() - start
  if (delivered === 0) throw new Error("core baseline published nothing")
  return (events.length * 1000) / elapsed
}

/**
 * Through the actor: admit every event, drain the subscriber concurrently, flush at the end.
 * `hotPath` admits as the relay's live path does: `admitEventsNow` (no effect), and `admitEvent`
 * only for an event that does not fit at once.
 */
const actorRound = (
  expected: number,
  events: ReadonlyArray<RouterEvent>,
  hotPath = false,
  canonical = false
): Promise<number> =>
  Effect.runPromise(
    Effect.scoped(
      Effect.gen(function* () {
        const state = newState(expected, canonical)
        const actor = yield* make(state, streamScope)
        const { deltas } = yield* actor.subscribe(lease)
        let received = 0
        // A plain loop, not `Effect.forever` (which yields after every delta): each turn of the
        // drainer takes everything buffered, as a publication hub would.
        const drainer = yield* Effect.fork(
          Effect.gen(function* () {
            for (;;) {
              yield* deltas.take
              received++
            }
          }).pipe(Effect.either)
        )
        yield* Effect.sync(gc)
        const start = performance.now()
        if (hotPath) {
          const one: Array<RouterEvent> = [events[0]!]
          for (const event of events) {
            one[0] = event
            if (!actor.admitEventsNow(0, one)) yield* actor.admitEvent(0, event)
          }
        } else for (const event of events) yield* actor.admitEvent(0, event)
        yield* actor.flush
        const elapsed = performance.now() - start
        yield* actor.shutdown
        const end = yield* Fiber.join(drainer)
        if (end._tag !== "Left" || end.left._tag !== "DeltaStreamClosed") {
          throw new Error(`subscriber did not drain to a clean close: ${JSON.stringify(end)}`)
        }
        const expectedDeltas = Math.ceil(events.length / PUBLISH_EVERY_N_EVENTS)
        if (received !== expectedDeltas)
          throw new Error(`subscriber got ${received} of ${expectedDeltas} deltas`)
        return (events.length * 1000) / elapsed
      })
    )
  )

export const benchActor = async (ctx: BenchContext): Promise<void> => {
  const expected = ctx.quick ? 65_536 : 262_144
  const probe = new DcCkfState(ckfConfig(expected))
  // Fill to 80% of the slots: the load ceiling the sizing rule targets.
  const count = Math.floor((probe.bucketCount * 4 * 0.8) / BLOCKS_PER_EVENT)
  const events = workload(count, 4242)
  const canonicalEvents = workload(count, 4343, true)
  const rounds = ctx.quick ? 3 : 7

  // Interleave the two so that machine noise hits both alike; two warm-up rounds each (the
  // fiber runtime's paths take longer than the core's loop to reach their optimized code).
  for (let w = 0; w < 2; w++) {
    coreRound(expected, events)
    await actorRound(expected, events)
    await actorRound(expected, events, true)
    coreRound(expected, canonicalEvents, true)
    await actorRound(expected, canonicalEvents, true, true)
  }
  let core = 0
  let actor = 0
  let hot = 0
  let canonicalCore = 0
  let canonicalHot = 0
  for (let r = 0; r < rounds; r++) {
    core = Math.max(core, coreRound(expected, events))
    actor = Math.max(actor, await actorRound(expected, events))
    hot = Math.max(hot, await actorRound(expected, events, true))
    canonicalCore = Math.max(canonicalCore, coreRound(expected, canonicalEvents, true))
    canonicalHot = Math.max(canonicalHot, await actorRound(expected, canonicalEvents, true, true))
  }
  const note = `${events.length} events of ${BLOCKS_PER_EVENT} blocks, publish every ${PUBLISH_EVERY_N_EVENTS}, 1 drained subscriber`
  record(ctx, "actor_admit_events", "events/s", actor, core, note)
  record(ctx, "actor_admit_blocks", "blocks/s", actor * BLOCKS_PER_EVENT, core * BLOCKS_PER_EVENT)
  record(ctx, "actor_cost_vs_core", "x core", core / actor, null, "issue target ≤ 2")
  record(
    ctx,
    "actor_hot_path_admit_events",
    "events/s",
    hot,
    core,
    `${note}; admitEventsNow, admitEvent only for an event that does not fit (the relay's live path)`
  )
  record(ctx, "actor_hot_path_cost_vs_core", "x core", core / hot, null, "admitEventsNow; issue target ≤ 1.5")
  record(
    ctx,
    "actor_canonical_admit_blocks",
    "blocks/s",
    canonicalHot * BLOCKS_PER_EVENT,
    canonicalCore * BLOCKS_PER_EVENT,
    `the relay's addressing: canonical state, tokens hashes, live path; baseline = its core (${(1e6 / canonicalCore).toFixed(1)} µs per event), the actor ${(1e6 / canonicalHot).toFixed(1)} µs`
  )
}
