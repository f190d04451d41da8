import { describe, expect, it } from "@effect/vitest"
import { Chunk, Effect, Either, Logger, Stream, TestClock } from "effect"
import {
  Discovery,
  type DiscoverySnapshot,
  makeStaticDiscovery,
  type RejectedSource
} from "../../src/discovery/Discovery.js"
import {
  type CoordinatedSourceView,
  hasActiveSource,
  KvSourceCoordinatorState,
  KvSourceMembership,
  makeKvSourceCoordinator,
  matchesBindingInputs,
  resolvedKvStateEndpoint,
  resolveKvStateEndpoint
} from "../../src/discovery/KvSourceCoordinator.js"
import { LoopFaults, makeLoopFaults, supervisedRestarts } from "../../src/observability/Supervised.js"
import type { KvEventSource, KvSourceStatus } from "../../src/protocol/Discovery.js"
import { DEFAULT_RUNTIME_CONFIG, type RuntimeConfig } from "../../src/protocol/Discovery.js"
import { endpoint, type SourceSpec, source } from "./fixtures.js"

const SERVING = endpoint("ns.worker.generate")
const KV = "ns.worker.kv"

const config = (overrides: Partial<RuntimeConfig> & { kv?: string | null } = {}): RuntimeConfig => {
  const { kv, ...rest } = overrides
  return {
    ...DEFAULT_RUNTIME_CONFIG,
    dataParallelStartRank: 4,
    kvStateEndpoint: kv === undefined ? endpoint(KV) : kv === null ? null : endpoint(kv),
    ...rest
  }
}

const configs = (entries: Record<string, RuntimeConfig>): ReadonlyMap<string, RuntimeConfig> =>
  new Map(Object.entries(entries))

const src = (spec: SourceSpec = {}): KvEventSource => source({ endpoint: KV, worker: 42, rank: 4, ...spec })

let revision = 0n
const snapshot = (
  sources: ReadonlyArray<KvEventSource>,
  extra: { rejected?: ReadonlyArray<RejectedSource>; epoch?: number; bound?: boolean } = {}
): DiscoverySnapshot => ({
  revision: ++revision,
  cards: [],
  sources,
  rejectedSources: extra.rejected ?? [],
  sourceStream: { epoch: extra.epoch ?? 0, bound: extra.bound ?? true }
})

const rank = (view: CoordinatedSourceView, key = "42/4") => {
  const entry = view.ranks.get(key)
  if (entry === undefined) throw new Error(`rank ${key} is not expected`)
  return entry
}

const tagOf = (status: KvSourceStatus): string =>
  status._tag === "Ambiguous" ? `Ambiguous.${status.reason._tag}` : status._tag

/** A coordinator fed snapshots; returns the view after each one. */
const coordinator = (runtime: ReadonlyMap<string, RuntimeConfig> = configs({ "42": config() })) => {
  const state = new KvSourceCoordinatorState(SERVING)
  let current = runtime
  return {
    state,
    setConfigs: (next: ReadonlyMap<string, RuntimeConfig>) => {
      current = next
    },
    apply: (snap: DiscoverySnapshot) => state.reconcile(current, snap).view
  }
}

describe("KV-state endpoint resolution", () => {
  it("an omitted mapping equals an explicit mapping to the serving endpoint; no configs is the serving endpoint", () => {
    expect(
      resolveKvStateEndpoint(SERVING, [config({ kv: null }), config({ kv: "ns.worker.generate" })])
    ).toEqual({
      _tag: "Resolved",
      endpoint: SERVING
    })
    expect(resolveKvStateEndpoint(SERVING, [])).toEqual({ _tag: "Resolved", endpoint: SERVING })
  })

  it("disagreeing configs fail every rank closed with EndpointMapping (endpoints sorted)", () => {
    const c = coordinator(
      configs({ "7": config({ kv: null, dataParallelStartRank: 0 }), "8": config({ kv: "ns.worker.a-kv" }) })
    )
    const view = c.apply(snapshot([src()]))
    expect(view.endpointResolution).toEqual({
      _tag: "Ambiguous",
      endpoints: [endpoint("ns.worker.a-kv"), endpoint("ns.worker.generate")]
    })
    expect(resolvedKvStateEndpoint(view)).toBeUndefined()
    for (const entry of view.ranks.values()) {
      expect(entry.status).toEqual({
        _tag: "Ambiguous",
        reason: {
          _tag: "EndpointMapping",
          endpoints: [endpoint("ns.worker.a-kv"), endpoint("ns.worker.generate")]
        }
      })
    }
    expect(hasActiveSource(view)).toBe(false)
  })

  it("an omitted mapping watches the serving endpoint's sources", () => {
    const c = coordinator(configs({ "42": config({ kv: null }) }))
    const fallback = source({ endpoint: "ns.worker.generate", worker: 42, rank: 4 })
    const view = c.apply(snapshot([fallback, src({ publisher: 7 })]))
    expect(resolvedKvStateEndpoint(view)).toEqual(SERVING)
    expect(rank(view).status).toEqual({ _tag: "ActiveLiveOnly", source: fallback })
  })
})

describe("statuses", () => {
  it("only expected ranks appear: start .. start + size; source-only workers create none", () => {
    const c = coordinator(configs({ "7": config({ dataParallelStartRank: 2, dataParallelSize: 2 }) }))
    const active = source({ endpoint: KV, worker: 7, rank: 2, recovery: "tcp://127.0.0.1:5600" })
    const view = c.apply(snapshot([active, source({ endpoint: KV, worker: 99, rank: 0, publisher: 205 })]))
    expect([...view.ranks.keys()]).toEqual(["7/2", "7/3"])
    expect(rank(view, "7/2").status).toEqual({ _tag: "ActiveRecoverable", source: active })
    expect(rank(view, "7/3").status).toEqual({ _tag: "Missing" })
    expect(hasActiveSource(view)).toBe(true)
  })

  it("recoverable: a dynamo-zmq recovery target or an engine-zmq replay endpoint; otherwise live-only", () => {
    const c = coordinator(configs({ "42": config({ dataParallelSize: 4 }) }))
    const view = c.apply(
      snapshot([
        src({ rank: 4, publisher: 1, recovery: "tcp://127.0.0.1:5600" }),
        src({ rank: 5, publisher: 2 }),
        src({ rank: 6, publisher: 3, kind: "engine-zmq", replay: "tcp://127.0.0.1:5558" }),
        src({ rank: 7, publisher: 4, kind: "engine-zmq" })
      ])
    )
    expect([4, 5, 6, 7].map((r) => rank(view, `42/${r}`).status._tag)).toEqual([
      "ActiveRecoverable",
      "ActiveLiveOnly",
      "ActiveRecoverable",
      "ActiveLiveOnly"
    ])
  })

  it("recoveryExpected is the worker's enableLocalIndexer", () => {
    const c = coordinator(configs({ "42": config(), "43": config({ enableLocalIndexer: false }) }))
    const view = c.apply(snapshot([]))
    expect(rank(view, "42/4").recoveryExpected).toBe(true)
    expect(rank(view, "43/4").recoveryExpected).toBe(false)
  })

  it("overlapping incarnations are ambiguous (ids sorted) until one remains", () => {
    const c = coordinator()
    const old = src({ publisher: 205 })
    const replacement = src({ publisher: 100 })
    expect(tagOf(rank(c.apply(snapshot([old]))).status)).toBe("ActiveLiveOnly")
    expect(rank(c.apply(snapshot([old, replacement]))).status).toEqual({
      _tag: "Ambiguous",
      reason: { _tag: "Incarnations", publisherIds: [100n, 205n] }
    })
    expect(rank(c.apply(snapshot([replacement]))).status).toEqual({
      _tag: "ActiveLiveOnly",
      source: replacement
    })
  })

  it("a publisher that re-advertises a different descriptor fails its rank closed until it is removed", () => {
    const c = coordinator()
    const liveOnly = src({ publisher: 100 })
    const recoverable = src({ publisher: 100, recovery: "tcp://127.0.0.1:5600" })
    const active = c.apply(snapshot([liveOnly]))
    const invalid = c.state.reconcile(configs({ "42": config() }), snapshot([recoverable]))
    expect(rank(invalid.view).status).toEqual({
      _tag: "Ambiguous",
      reason: { _tag: "ConflictingDescriptor", publisherId: 100n }
    })
    expect(invalid.warnings).toEqual([
      "publisher 100 changed its immutable KV source descriptor for worker 42 rank 4"
    ])
    expect(rank(invalid.view).lifecycleGeneration).toBeGreaterThan(rank(active).lifecycleGeneration)
    expect(tagOf(rank(c.apply(snapshot([recoverable]))).status)).toBe("Ambiguous.ConflictingDescriptor")
    expect(rank(c.apply(snapshot([]))).status).toEqual({ _tag: "Missing" })
    expect(rank(c.apply(snapshot([src({ publisher: 300 })]))).status._tag).toBe("ActiveLiveOnly")
  })

  it("a publisher reused for another rank fails the first rank closed", () => {
    const c = coordinator(configs({ "42": config({ dataParallelSize: 2 }) }))
    const view = c.apply(snapshot([src({ rank: 4, publisher: 100 }), src({ rank: 5, publisher: 100 })]))
    expect(tagOf(rank(view, "42/4").status)).toBe("Ambiguous.ConflictingDescriptor")
    expect(rank(view, "42/5").status).toEqual({ _tag: "Missing" })
  })

  it("malformed or mis-attributed metadata invalidates a known publisher; removing that key removes it", () => {
    const c = coordinator()
    const good = src({ publisher: 100 })
    c.apply(snapshot([good]))
    const rejected: RejectedSource = {
      recordKey: `${KV}/42/4/100`,
      kvStateEndpoint: KV,
      publisherId: 100n,
      reason: "invalid JSON",
      value: "{"
    }
    const invalid = c.state.reconcile(configs({ "42": config() }), snapshot([], { rejected: [rejected] }))
    expect(tagOf(rank(invalid.view).status)).toBe("Ambiguous.ConflictingDescriptor")
    expect(invalid.warnings[0]).toContain("invalidated KV source publisher 100")
    expect(rank(c.apply(snapshot([]))).status).toEqual({ _tag: "Missing" })
    // A rejection for an unknown publisher, or for another endpoint, changes nothing.
    const other = {
      ...rejected,
      recordKey: "ns.worker.other/42/4/7",
      kvStateEndpoint: "ns.worker.other",
      publisherId: 7n
    }
    expect(rank(c.apply(snapshot([src({ publisher: 300 })], { rejected: [other] }))).status._tag).toBe(
      "ActiveLiveOnly"
    )
  })

  it("removal is incarnation-exact: removing 100 cannot remove 205", () => {
    const membership = new KvSourceMembership()
    const a = src({ publisher: 100 })
    const b = src({ publisher: 205 })
    expect(membership.add(a)).toEqual(Either.right(true))
    expect(membership.add(a)).toEqual(Either.right(false))
    expect(membership.add(b)).toEqual(Either.right(true))
    expect(membership.remove(a)).toBe(true)
    expect(membership.remove(a)).toBe(false)
    expect(membership.status(`${KV}/42/4`)).toEqual({ _tag: "ActiveLiveOnly", source: b })
    // A stale removal naming 205 under another rank does not touch it either.
    expect(membership.remove(src({ publisher: 205, rank: 5 }))).toBe(false)
    expect(membership.status(`${KV}/42/4`)._tag).toBe("ActiveLiveOnly")
  })
})

describe("lifecycle generations (§2.7)", () => {
  it("first observation of a never-active rank and Missing→Missing do not bump", () => {
    const c = coordinator()
    expect(rank(c.apply(snapshot([]))).lifecycleGeneration).toBe(0)
    expect(rank(c.apply(snapshot([src({ endpoint: "ns.worker.unrelated" })]))).lifecycleGeneration).toBe(0)
  })

  it("Missing→Active on a never-active rank does not bump; on a rank that was active it does", () => {
    const c = coordinator()
    c.apply(snapshot([]))
    const first = rank(c.apply(snapshot([src({ publisher: 100 })])))
    expect(first.lifecycleGeneration).toBe(0)
    const missing = rank(c.apply(snapshot([])))
    expect(missing.status._tag).toBe("Missing")
    expect(missing.lifecycleGeneration).toBe(1)
    expect(rank(c.apply(snapshot([src({ publisher: 205 })]))).lifecycleGeneration).toBe(2)
  })

  it("identical statuses do not bump, whatever else changed in discovery", () => {
    const c = coordinator()
    const a = src({ publisher: 100 })
    const first = c.apply(snapshot([a]))
    const again = c.state.reconcile(
      configs({ "42": config() }),
      snapshot([a, source({ endpoint: "ns.other.kv", publisher: 9 })])
    )
    expect(rank(again.view).lifecycleGeneration).toBe(rank(first).lifecycleGeneration)
    expect(again.changed).toBe(false)
  })

  it("a direct incarnation replacement (Active→Active) bumps", () => {
    const c = coordinator()
    const before = rank(c.apply(snapshot([src({ publisher: 100 })])))
    const after = rank(c.apply(snapshot([src({ publisher: 205, recovery: "tcp://127.0.0.1:5600" })])))
    expect(after.status._tag).toBe("ActiveRecoverable")
    expect(after.lifecycleGeneration).toBe(before.lifecycleGeneration + 1)
  })

  it("a coalesced ambiguity still advances the fence (Active→Ambiguous→Active)", () => {
    const c = coordinator()
    const a = src({ publisher: 100 })
    const b = src({ publisher: 205 })
    const activeA = rank(c.apply(snapshot([a])))
    c.apply(snapshot([a, b]))
    const activeB = rank(c.apply(snapshot([b])))
    expect(activeB.lifecycleGeneration).toBe(activeA.lifecycleGeneration + 2)
  })

  it("Missing→Ambiguous bumps even on a never-active rank", () => {
    const c = coordinator()
    c.apply(snapshot([]))
    expect(rank(c.apply(snapshot([src({ publisher: 1 }), src({ publisher: 2 })]))).lifecycleGeneration).toBe(
      1
    )
  })

  it("a KV-state endpoint remap bumps every expected rank and rebinds to the new endpoint's sources", () => {
    const c = coordinator(
      configs({ "42": config({ kv: "ns.worker.kv-a" }), "43": config({ kv: "ns.worker.kv-a" }) })
    )
    const a = source({ endpoint: "ns.worker.kv-a", worker: 42, rank: 4, publisher: 100 })
    const b = source({
      endpoint: "ns.worker.kv-b",
      worker: 42,
      rank: 4,
      publisher: 205,
      recovery: "tcp://x:1"
    })
    const before = c.apply(snapshot([a, b]))
    expect(rank(before).status).toEqual({ _tag: "ActiveLiveOnly", source: a })
    c.setConfigs(configs({ "42": config({ kv: "ns.worker.kv-b" }), "43": config({ kv: "ns.worker.kv-b" }) }))
    const after = c.apply(snapshot([a, b]))
    expect(resolvedKvStateEndpoint(after)).toEqual(endpoint("ns.worker.kv-b"))
    expect(rank(after).status).toEqual({ _tag: "ActiveRecoverable", source: b })
    expect(rank(after).lifecycleGeneration).toBeGreaterThan(rank(before).lifecycleGeneration)
    // Worker 43 never had a source: Missing→Missing, yet the remap bumps it.
    expect(rank(after, "43/4").lifecycleGeneration).toBe(rank(before, "43/4").lifecycleGeneration + 1)
    expect(after.servingEndpoint).toEqual(SERVING)
  })

  it("a rank that leaves the expected set after being active bumps on leaving and on returning", () => {
    const c = coordinator(configs({ "42": config(), "43": config() }))
    const a = src({ publisher: 100 })
    const before = c.apply(snapshot([a]))
    c.setConfigs(configs({ "43": config() }))
    const gone = c.apply(snapshot([a]))
    expect(gone.ranks.has("42/4")).toBe(false)
    c.setConfigs(configs({ "42": config(), "43": config() }))
    const back = c.apply(snapshot([a]))
    expect(rank(back).status._tag).toBe("ActiveLiveOnly")
    expect(rank(back).lifecycleGeneration).toBe(rank(before).lifecycleGeneration + 2)
    // A rank that was never active leaves and returns without bumps.
    expect(rank(back, "43/4").lifecycleGeneration).toBe(0)
  })

  it("a source stream failure resets the incarnation set: ranks go Missing while unbound, then rebind", () => {
    const c = coordinator()
    const a = src({ publisher: 100 })
    const bound = rank(c.apply(snapshot([a])))
    const unbound = rank(c.apply(snapshot([a], { epoch: 1, bound: false })))
    expect(unbound.status._tag).toBe("Missing")
    expect(unbound.lifecycleGeneration).toBe(bound.lifecycleGeneration + 1)
    const rebound = rank(c.apply(snapshot([a], { epoch: 1, bound: true })))
    expect(rebound.status._tag).toBe("ActiveLiveOnly")
    expect(rebound.lifecycleGeneration).toBe(bound.lifecycleGeneration + 2)
  })

  it("a coalesced stream failure (epoch changed, already rebound) still bumps, and clears conflicts", () => {
    const c = coordinator()
    const a = src({ publisher: 100 })
    c.apply(snapshot([a]))
    const conflicted = rank(c.apply(snapshot([src({ publisher: 100, recovery: "tcp://x:1" })])))
    expect(conflicted.status._tag).toBe("Ambiguous")
    const rebound = rank(c.apply(snapshot([a], { epoch: 1 })))
    expect(rebound.status._tag).toBe("ActiveLiveOnly")
    expect(rebound.lifecycleGeneration).toBeGreaterThan(conflicted.lifecycleGeneration)
  })
})

describe("coordinator views", () => {
  it("record their runtime configs, and unchanged inputs give the same view object", () => {
    const runtime = configs({ "42": config() })
    const c = coordinator(runtime)
    const a = src()
    const first = c.state.reconcile(runtime, snapshot([a]))
    expect(first.changed).toBe(true)
    expect(matchesBindingInputs(first.view, runtime)).toBe(true)
    expect(matchesBindingInputs(first.view, configs({ "42": config({ totalKvBlocks: 5n }) }))).toBe(false)
    const second = c.state.reconcile(runtime, snapshot([a]))
    expect(second.changed).toBe(false)
    expect(second.view).toBe(first.view)
    // New runtime facts without rank changes republish so the host sees matching inputs.
    const richer = configs({ "42": config({ totalKvBlocks: 5n }) })
    const third = c.state.reconcile(richer, snapshot([a]))
    expect(third.changed).toBe(true)
    expect(third.view.ranks).toBe(first.view.ranks)
    expect(matchesBindingInputs(third.view, richer)).toBe(true)
  })

  it.effect("makeKvSourceCoordinator follows discovery snapshots and runtime config updates", () =>
    Effect.gen(function* () {
      const discovery = yield* makeStaticDiscovery(snapshot([]))
      const program = Effect.gen(function* () {
        const coord = yield* makeKvSourceCoordinator(SERVING, configs({ "42": config() }))
        const describe = (view: CoordinatedSourceView) =>
          [...view.ranks.values()].map((r) => `${r.workerId}/${r.dpRank}:${r.status._tag}`).join(",")
        const eventually = (expected: string) =>
          Effect.gen(function* () {
            for (let i = 0; i < 1000; i++) {
              const view = yield* coord.current
              if (describe(view) === expected) return view
              yield* Effect.yieldNow()
            }
            return yield* Effect.die(new Error(`coordinator never showed ${expected}`))
          })
        yield* eventually("42/4:Missing")
        yield* discovery.publish(snapshot([src({ publisher: 100 })]))
        const active = yield* eventually("42/4:ActiveLiveOnly")
        // The same sources in a new snapshot publish no new view.
        yield* discovery.publish(snapshot([src({ publisher: 100 }), source({ endpoint: "ns.other.kv" })]))
        for (let i = 0; i < 50; i++) yield* Effect.yieldNow()
        expect(yield* coord.current).toBe(active)
        yield* coord.setRuntimeConfigs(configs({ "42": config({ dataParallelSize: 2 }) }))
        yield* eventually("42/4:ActiveLiveOnly,42/5:Missing")
        yield* discovery.publish(snapshot([src({ publisher: 100 }), src({ rank: 5, publisher: 101 })]))
        const both = yield* eventually("42/4:ActiveLiveOnly,42/5:ActiveLiveOnly")
        expect(rank(both).lifecycleGeneration).toBe(rank(active).lifecycleGeneration)
        const first = yield* coord.changes.pipe(Stream.take(1), Stream.runCollect)
        expect(Chunk.unsafeHead(first)).toBe(both)
      })
      yield* program.pipe(Effect.provideService(Discovery, discovery), Effect.scoped)
    })
  )

  it.effect(
    "a defect in one reconciliation step restarts the coordinator's loop, which applies the latest snapshot",
    () =>
      Effect.gen(function* () {
        const faults = makeLoopFaults()
        const discovery = yield* makeStaticDiscovery(snapshot([]))
        const restarts = supervisedRestarts("discovery.sources")
        const program = Effect.gen(function* () {
          const coord = yield* makeKvSourceCoordinator(SERVING, configs({ "42": config() }))
          const settle = Effect.yieldNow().pipe(Effect.repeatN(50))
          const state = Effect.map(coord.current, (view) => tagOf(rank(view).status))
          yield* settle
          expect(yield* state).toBe("Missing")
          faults.arm("discovery.sources")
          yield* discovery.publish(snapshot([src({ publisher: 100 })]))
          yield* settle
          // The step that took the snapshot died before reconciling it.
          expect(yield* state).toBe("Missing")
          expect(faults.armed("discovery.sources")).toBe(0)
          yield* TestClock.adjust("100 millis")
          yield* settle
          expect(yield* state).toBe("ActiveLiveOnly")
          expect(supervisedRestarts("discovery.sources")).toBe(restarts + 1)
          // And it keeps following later snapshots.
          yield* discovery.publish(snapshot([]))
          yield* settle
          expect(yield* state).toBe("Missing")
        })
        yield* program.pipe(
          Effect.provideService(Discovery, discovery),
          Effect.provideService(LoopFaults, faults),
          Effect.scoped
        )
      }).pipe(Effect.provide(Logger.remove(Logger.defaultLogger)))
  )
})
