/**
 * Canonical block addressing (PROTOCOL §3.3): the canonical producer against a Map/Set
 * implementation of the same lineage and ownership semantics, token hashing against hash-wasm's
 * XXH3, and memory per tracked edge with lineage.
 */

import { createXXHash3 } from "hash-wasm"
import { CanonicalCkfState } from "../src/ckf/canonical.js"
import { ckfConfig } from "../src/ckf/config.js"
import type { CkfEvent } from "../src/ckf/events.js"
import { localBlockHashes, nextSequenceHash } from "../src/ckf/tokens.js"
import { hashPairsToBigInts, toBigInt } from "../src/ckf/u64.js"
import { type BenchContext, bestRate, bestRates, HashStream, memoryInUse, record } from "./harness.js"

const BLOCKS_PER_EVENT = 8
/** Events per prompt: the first has no parent, each later one continues the previous. */
const EVENTS_PER_PROMPT = 4

/** Dynamo-format Stored events: random external and tokens hashes, chained per prompt. */
export const canonicalWorkload = (blocks: number, seed: number, workerId = "1"): Array<CkfEvent> => {
  const stream = new HashStream(seed)
  const events: Array<CkfEvent> = []
  let parent: Uint32Array | undefined
  for (let done = 0, n = 0; done < blocks; done += BLOCKS_PER_EVENT, n++) {
    const external = new Uint32Array(2 * BLOCKS_PER_EVENT)
    const local = new Uint32Array(2 * BLOCKS_PER_EVENT)
    for (let i = 0; i < BLOCKS_PER_EVENT; i++) {
      stream.next(external, 2 * i)
      stream.next(local, 2 * i)
    }
    const first = n % EVENTS_PER_PROMPT === 0
    events.push({
      workerId,
      dpRank: 0,
      storageTier: "device",
      data: {
        _tag: "Stored",
        blockHashes: external,
        tokensHashes: local,
        parentHash: first ? undefined : parent
      }
    })
    parent = external.subarray(2 * BLOCKS_PER_EVENT - 2)
  }
  return events
}

/** The same semantics on Maps and Sets: per-member lineage, per-member ownership, refcounts. */
class MapSetCanonical {
  readonly lineage = new Map<string, Map<bigint, bigint>>()
  readonly owned = new Map<string, Set<bigint>>()
  readonly refcounts = new Map<bigint, number>()

  applyEvent(event: CkfEvent): void {
    const data = event.data
    if (data._tag !== "Stored") return
    const member = `${event.workerId}/${event.dpRank}`
    let lineage = this.lineage.get(member)
    if (lineage === undefined) {
      lineage = new Map()
      this.lineage.set(member, lineage)
    }
    let owned = this.owned.get(member)
    if (owned === undefined) {
      owned = new Set()
      this.owned.set(member, owned)
    }
    const external = hashPairsToBigInts(data.blockHashes)
    const local = hashPairsToBigInts(data.tokensHashes!)
    let previous: bigint | undefined
    if (data.parentHash !== undefined) {
      previous = lineage.get(toBigInt(data.parentHash[0]!, data.parentHash[1]!))
      if (previous === undefined) return
    }
    for (let i = 0; i < external.length; i++) {
      const canon: bigint = previous === undefined ? local[i]! : nextSequenceHash(previous, local[i]!)
      previous = canon
      if (!lineage.has(external[i]!)) lineage.set(external[i]!, canon)
      if (owned.has(canon)) continue
      owned.add(canon)
      this.refcounts.set(canon, (this.refcounts.get(canon) ?? 0) + 1)
    }
  }
}

export const benchProducerApplyCanonical = (ctx: BenchContext): void => {
  const expected = ctx.quick ? 65_536 : 262_144
  const config = ckfConfig(expected, { publishEveryNEvents: 16 })
  const blocks = Math.floor(new CanonicalCkfState(config).bucketCount * 4 * 0.8)
  const events = canonicalWorkload(blocks, 777)
  const rounds = ctx.quick ? 3 : 10
  const [ours, baseline] = bestRates(
    rounds,
    [
      () => new CanonicalCkfState(config),
      (state) => {
        for (const event of events) state.applyEvent(event)
        state.flush()
        return events.length * BLOCKS_PER_EVENT
      }
    ],
    [
      () => new MapSetCanonical(),
      (model) => {
        for (const event of events) model.applyEvent(event)
        return events.length * BLOCKS_PER_EVENT
      }
    ]
  )
  record(
    ctx,
    "producer_apply_canonical",
    "blocks/s",
    ours,
    baseline,
    `dynamo-format ${BLOCKS_PER_EVENT}-block events with tokens hashes, chained ${EVENTS_PER_PROMPT} per prompt, to 80% load; baseline: Map/Set lineage + ownership, same chaining`
  )
}

export const benchTokenHashing = async (ctx: BenchContext): Promise<void> => {
  const blockSize = 16
  const tokenCount = (ctx.quick ? 1 << 18 : 1 << 20) * blockSize
  const stream = new HashStream(99)
  const words = new Uint32Array(tokenCount)
  const pair = new Uint32Array(2)
  for (let i = 0; i < tokenCount; i++) {
    stream.next(pair, 0)
    words[i] = pair[1]! & 0x3_ffff
  }
  const bytes = tokenCount * 4
  const rounds = ctx.quick ? 3 : 5
  const ours = bestRate(
    rounds,
    () => undefined,
    () => {
      localBlockHashes(words, blockSize)
      return bytes
    }
  )
  const hasher = await createXXHash3(1337, 0)
  const view = new Uint8Array(words.buffer)
  const baseline = bestRate(
    rounds,
    () => undefined,
    () => {
      for (let at = 0; at < view.length; at += blockSize * 4) {
        hasher.init()
        hasher.update(view.subarray(at, at + blockSize * 4))
        hasher.digest("binary")
      }
      return bytes
    }
  )
  record(
    ctx,
    "token_hashing",
    "MB/s",
    ours / 1e6,
    baseline / 1e6,
    `local hashes of ${blockSize}-token blocks (u32 LE, XXH3-64 seed 1337); baseline: hash-wasm XXH3 per block`
  )
}

/** Heap bytes per edge of the Map/Set model fed every workload, measured in a frame of its own. */
const modelFootprint = (workloads: ReadonlyArray<ReadonlyArray<CkfEvent>>): number => {
  const before = memoryInUse()
  const model = new MapSetCanonical()
  for (const events of workloads) for (const event of events) model.applyEvent(event)
  const after = memoryInUse()
  // Read after the measurement: the model stays reachable through it.
  let edges = 0
  for (const set of model.owned.values()) edges += set.size
  return (after - before) / edges
}

const canonicalStats = (edges: number, workloads: ReadonlyArray<ReadonlyArray<CkfEvent>>) => {
  const state = new CanonicalCkfState(ckfConfig(edges))
  for (const events of workloads) for (const event of events) state.applyEvent(event)
  state.flush()
  return state.stats()
}

/** Bytes per tracked edge: accounted for ours, heap growth for the Map/Set model. */
export const benchMemoryPerEdgeCanonical = (ctx: BenchContext): void => {
  const edges = ctx.quick ? 262_144 : 1_048_576
  const members = 8
  const workloads = Array.from({ length: members }, (_, m) =>
    canonicalWorkload(edges / members, 3000 + m, String(m + 1))
  )
  const baseline = modelFootprint(workloads)
  const stats = canonicalStats(edges, workloads)
  const tracked = stats.aggregation.contributionCount
  const ours = (stats.memory.ownershipBytes + stats.memory.lineageBytes + stats.memory.filterBytes) / tracked
  record(
    ctx,
    "memory_per_edge_canonical",
    "bytes/edge",
    ours,
    baseline,
    `${tracked} edges over ${members} members: owner, edge and lineage tables and the ${stats.memory.filterBytes / 1048576} MiB filter; baseline: the Map/Set lineage + ownership's heap growth; ratio = ours/baseline (lower is better)`
  )
}
