/**
 * CKF core benchmarks: producer apply, mixed churn, rank replacement and memory per ownership
 * edge, each against the Map/Set baseline (and the bloom-filters CuckooFilter for the filter part).
 */

import { ckfConfig } from "../src/ckf/config.js"
import type { CkfEvent } from "../src/ckf/events.js"
import { DcCkfState } from "../src/ckf/state.js"
import { toBigInt } from "../src/ckf/u64.js"
import { MapSetOwnership } from "./baseline.js"
import { type BenchContext, HashStream, memoryInUse, record } from "./harness.js"

const BLOCKS_PER_EVENT = 8

interface Workload {
  readonly events: Array<CkfEvent>
  readonly bigints: Array<Array<bigint>>
  readonly strings: Array<string>
  readonly blocks: number
}

/** Stored events of 8 unique hashes from one member, in both representations. */
const storedWorkload = (blocks: number, seed: number, workerId = "1"): Workload => {
  const stream = new HashStream(seed)
  const events: Array<CkfEvent> = []
  const bigints: Array<Array<bigint>> = []
  const strings: Array<string> = []
  for (let done = 0; done < blocks; done += BLOCKS_PER_EVENT) {
    const pairs = new Uint32Array(BLOCKS_PER_EVENT * 2)
    const values: Array<bigint> = []
    for (let i = 0; i < BLOCKS_PER_EVENT; i++) {
      stream.next(pairs, 2 * i)
      const v = toBigInt(pairs[2 * i]!, pairs[2 * i + 1]!)
      values.push(v)
      strings.push(v.toString(16))
    }
    events.push({ workerId, dpRank: 0, storageTier: "device", data: { _tag: "Stored", blockHashes: pairs } })
    bigints.push(values)
  }
  return { events, bigints, strings, blocks: events.length * BLOCKS_PER_EVENT }
}

/** Best blocks/s over `rounds` fresh runs; setup is outside the timed region. */
const bestRate = <S>(rounds: number, setup: () => S, run: (s: S) => number): number => {
  let best = 0
  for (let r = 0; r < rounds; r++) {
    const s = setup()
    const start = performance.now()
    const ops = run(s)
    const elapsed = performance.now() - start
    best = Math.max(best, (ops * 1000) / elapsed)
  }
  return best
}

export const benchProducerApply = async (ctx: BenchContext): Promise<void> => {
  const expected = ctx.quick ? 65_536 : 262_144
  const probe = new DcCkfState(ckfConfig(expected))
  // Fill to 80% of the slots: the load ceiling the sizing rule targets.
  const blocks = Math.floor(probe.bucketCount * 4 * 0.8)
  const workload = storedWorkload(blocks, 12345)
  const rounds = ctx.quick ? 3 : 5
  const config = ckfConfig(expected, { publishEveryNEvents: 16 })

  const ours = bestRate(
    rounds,
    () => new DcCkfState(config),
    (state) => {
      for (const event of workload.events) state.applyEvent(event)
      state.flush()
      return workload.blocks
    }
  )
  const baseline = bestRate(
    rounds,
    () => new MapSetOwnership(),
    (model) => {
      for (const values of workload.bigints) for (const v of values) model.store("1/0", v)
      return workload.blocks
    }
  )
  // bloom-filters is CommonJS and a dev dependency: load it lazily.
  const { CuckooFilter } = (await import("bloom-filters")).default
  const filterOnly = bestRate(
    rounds,
    () => new CuckooFilter(Math.ceil(blocks / 4 / 0.8), 2, 4, 500),
    (filter) => {
      for (const s of workload.strings) filter.add(s)
      return workload.blocks
    }
  )
  const check = new DcCkfState(config)
  for (const event of workload.events) check.applyEvent(event)
  const omissions = check.stats().aggregation.capacityFailures
  record(
    ctx,
    "producer_apply",
    "blocks/s",
    ours,
    baseline,
    `Map/Set exact ownership; ${blocks} blocks to 80% load, ${omissions} capacity omissions`
  )
  record(
    ctx,
    "producer_apply_vs_bloom_filters",
    "blocks/s",
    ours,
    filterOnly,
    "bloom-filters CuckooFilter insert only"
  )
}

export const benchMixedChurn = (ctx: BenchContext): void => {
  const expected = ctx.quick ? 65_536 : 262_144
  const probe = new DcCkfState(ckfConfig(expected))
  const resident = Math.floor(probe.bucketCount * 4 * 0.5)
  const churn = ctx.quick ? 200_000 : 1_000_000
  const workload = storedWorkload(resident + churn, 777)
  const events = workload.events
  const residentEvents = Math.floor(resident / BLOCKS_PER_EVENT)
  const removals: Array<CkfEvent> = events.map((e) => ({
    ...e,
    data: { _tag: "Removed", blockHashes: (e.data as { blockHashes: Uint32Array }).blockHashes }
  }))
  const config = ckfConfig(expected, { publishEveryNEvents: 16 })
  const ours = bestRate(
    ctx.quick ? 2 : 3,
    () => {
      const state = new DcCkfState(config)
      for (let i = 0; i < residentEvents; i++) state.applyEvent(events[i]!)
      state.flush()
      return state
    },
    (state) => {
      // Steady 50% load: each new event is matched by the removal of the oldest resident one.
      for (let i = residentEvents; i < events.length; i++) {
        state.applyEvent(events[i]!)
        state.applyEvent(removals[i - residentEvents]!)
      }
      state.flush()
      return (events.length - residentEvents) * BLOCKS_PER_EVENT * 2
    }
  )
  const baseline = bestRate(
    ctx.quick ? 2 : 3,
    () => {
      const model = new MapSetOwnership()
      for (let i = 0; i < residentEvents; i++) for (const v of workload.bigints[i]!) model.store("1/0", v)
      return model
    },
    (model) => {
      for (let i = residentEvents; i < events.length; i++) {
        for (const v of workload.bigints[i]!) model.store("1/0", v)
        for (const v of workload.bigints[i - residentEvents]!) model.remove("1/0", v)
      }
      return (events.length - residentEvents) * BLOCKS_PER_EVENT * 2
    }
  )
  record(ctx, "mixed_churn_50pct", "blocks/s", ours, baseline, "store+remove at steady 50% load vs Map/Set")
}

export const benchReplaceRanks = (ctx: BenchContext): void => {
  const blocks = 100_000
  const config = ckfConfig(262_144, { publishEveryNEvents: 16 })
  const before = storedWorkload(blocks, 99, "1")
  const after = storedWorkload(blocks, 100, "1")
  const replacement = new Uint32Array(after.blocks * 2)
  after.events.forEach((e, i) => {
    replacement.set((e.data as { blockHashes: Uint32Array }).blockHashes, i * BLOCKS_PER_EVENT * 2)
  })
  const afterValues = after.bigints.flat()
  const rounds = ctx.quick ? 2 : 4
  const ours = bestRate(
    rounds,
    () => {
      const state = new DcCkfState(config)
      for (const e of before.events) state.applyEvent(e)
      state.flush()
      return state
    },
    (state) => {
      const result = state.replaceRank("1", 0, replacement)
      if (result instanceof Error) throw result
      return blocks
    }
  )
  const baseline = bestRate(
    rounds,
    () => {
      const model = new MapSetOwnership()
      for (const values of before.bigints) for (const v of values) model.store("1/0", v)
      return model
    },
    (model) => {
      model.replace("1/0", afterValues)
      return blocks
    }
  )
  record(
    ctx,
    "replace_ranks_100k",
    "blocks/s",
    ours,
    baseline,
    "transactional off-side rebuild vs Map/Set in-place replace"
  )
}

export const benchMemoryPerEdge = (ctx: BenchContext): void => {
  const edges = ctx.quick ? 262_144 : 1_048_576
  const members = 8
  const perMember = edges / members
  const workloads = Array.from({ length: members }, (_, m) =>
    storedWorkload(perMember, 1000 + m, String(m + 1))
  )

  const baseBefore = memoryInUse()
  let model: MapSetOwnership | undefined = new MapSetOwnership()
  for (let m = 0; m < members; m++) {
    // The baseline owns its keys, as it would after decoding them from the wire.
    for (const e of workloads[m]!.events) {
      const pairs = (e.data as { blockHashes: Uint32Array }).blockHashes
      for (let i = 0; i < pairs.length; i += 2) model.store(`${m + 1}/0`, toBigInt(pairs[i]!, pairs[i + 1]!))
    }
  }
  const baselineBytes = memoryInUse() - baseBefore
  const baselineEdges = [...model.members.values()].reduce((n, s) => n + s.size, 0)
  model = undefined

  const oursBefore = memoryInUse()
  let state: DcCkfState | undefined = new DcCkfState(ckfConfig(edges))
  for (const w of workloads) for (const e of w.events) state.applyEvent(e)
  state.flush()
  const oursBytes = memoryInUse() - oursBefore
  const stats = state.stats()
  const ourEdges = stats.aggregation.contributionCount
  state = undefined
  const ours = oursBytes / ourEdges
  const base = baselineBytes / baselineEdges
  record(
    ctx,
    "memory_per_edge",
    "bytes/edge",
    ours,
    base,
    `${ourEdges} edges incl. the ${stats.memory.filterBytes / 1048576} MiB filter; ratio = ours/baseline (lower is better)`,
    false
  )
}
