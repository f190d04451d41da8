/**
 * Worker-level queries (PROTOCOL §5.1 ◆3) in process: `CanonicalCkfState.queryWorkers` on a pool
 * of 64 members holding 1024-token prompts that share system-prompt prefixes, on the device, the
 * host and the disk, against a Map/Set implementation of the same query measured in the same run;
 * and the memory of a host or disk edge against a device edge.
 */

import { CanonicalCkfState } from "../src/ckf/canonical.js"
import { ckfConfig } from "../src/ckf/config.js"
import type { CkfEvent, StorageTier } from "../src/ckf/events.js"
import { localBlockHashes, sequenceHashes } from "../src/ckf/tokens.js"
import { hashPairsToBigInts } from "../src/ckf/u64.js"
import type { WorkerQueryResult } from "../src/ckf/workerQuery.js"
import { canonicalWorkload } from "./canonical.js"
import { type BenchContext, bestRate, bestRates, HashStream, record } from "./harness.js"

const BLOCK = 16
const PROMPT_TOKENS = 1024
const PROMPT_BLOCKS = PROMPT_TOKENS / BLOCK
const WORKERS = 32
const RANKS = 2
const FAMILIES = 8
/** Prompts per member on each tier: the device's are held there; the others were offloaded. */
const PROMPTS_PER_TIER = 6
const EVENT_BLOCKS = 16

/** Blocks of family f's shared prefix (a system prompt): 8 to 43 blocks. */
const prefixBlocks = (f: number): number => 8 + 5 * f

interface Member {
  readonly workerId: string
  readonly dpRank: number
  /** Salt of the engine's external hashes (engines hash with their own seeds). */
  readonly salt: number
}

/** A pool of members and the prompts they hold, as events, and the queries to ask of it. */
interface Workload {
  readonly members: ReadonlyArray<Member>
  readonly events: ReadonlyArray<CkfEvent>
  /** Canonical sequence hashes of each query prompt, as pairs (64 blocks). */
  readonly queries: ReadonlyArray<Uint32Array>
  readonly queryTokens: ReadonlyArray<Uint32Array>
  /** The plain model's view: per member, per tier, the canonical hashes held. */
  readonly held: ReadonlyArray<readonly [Set<bigint>, Set<bigint>, Set<bigint>]>
}

const randomTokens = (stream: HashStream, count: number): Uint32Array => {
  const pair = new Uint32Array(2)
  const out = new Uint32Array(count)
  for (let i = 0; i < count; i++) {
    stream.next(pair, 0)
    out[i] = pair[1]! & 0x1_ffff
  }
  return out
}

/** The engine's external hashes of a prompt's canonical hashes: per member, a bijection of them. */
const externalOf = (canon: Uint32Array, member: Member): Uint32Array => {
  const out = new Uint32Array(canon.length)
  for (let i = 0; i < canon.length; i += 2) {
    out[i] = canon[i]! ^ Math.imul(member.salt, 0x9e3779b1)
    out[i + 1] = canon[i + 1]! ^ member.salt
  }
  return out
}

export const buildWorkload = (seed: number): Workload => {
  const stream = new HashStream(seed)
  const families = Array.from({ length: FAMILIES }, (_, f) => randomTokens(stream, prefixBlocks(f) * BLOCK))
  const prompt = (f: number): Uint32Array => {
    const tokens = new Uint32Array(PROMPT_TOKENS)
    tokens.set(families[f]!)
    tokens.set(randomTokens(stream, PROMPT_TOKENS - families[f]!.length), families[f]!.length)
    return tokens
  }
  const members: Array<Member> = []
  for (let w = 0; w < WORKERS; w++)
    for (let r = 0; r < RANKS; r++)
      members.push({ workerId: String(1000 + w), dpRank: r, salt: w * RANKS + r + 1 })
  const events: Array<CkfEvent> = []
  const held = members.map(() => [new Set<bigint>(), new Set<bigint>(), new Set<bigint>()] as const)
  const storedPrompts: Array<Uint32Array> = []
  const stored = (member: Member, tier: StorageTier, data: CkfEvent["data"]) =>
    events.push({ workerId: member.workerId, dpRank: member.dpRank, storageTier: tier, data })
  members.forEach((member, m) => {
    // Each member serves two families; its prompts share their system prompts with other members'.
    const own = [m % FAMILIES, (3 * m + 1) % FAMILIES]
    for (const [t, tier] of [
      [0, "device"],
      [1, "host_pinned"],
      [2, "disk"]
    ] as const) {
      for (let p = 0; p < PROMPTS_PER_TIER; p++) {
        const f = own[p % 2]!
        const tokens = prompt(f)
        storedPrompts.push(tokens)
        const local = localBlockHashes(tokens, BLOCK)
        const canon = sequenceHashes(local)
        const ext = externalOf(canon, member)
        for (let b = 0; b < PROMPT_BLOCKS; b += EVENT_BLOCKS) {
          stored(member, "device", {
            _tag: "Stored",
            blockHashes: ext.slice(2 * b, 2 * (b + EVENT_BLOCKS)),
            tokensHashes: local.slice(2 * b, 2 * (b + EVENT_BLOCKS)),
            parentHash: b === 0 ? undefined : ext.slice(2 * b - 2, 2 * b)
          })
        }
        const blocks = hashPairsToBigInts(canon)
        if (t === 0) {
          for (const c of blocks) held[m]![0].add(c)
          continue
        }
        // Offloaded (as vLLM's connector does: the copy names blocks by external hash only),
        // then the request's own blocks leave the GPU; the system prompt stays, shared.
        stored(member, tier, { _tag: "Stored", blockHashes: ext, resolveThroughLineage: true })
        const shared = prefixBlocks(f)
        stored(member, "device", { _tag: "Removed", blockHashes: ext.slice(2 * shared) })
        for (const c of blocks) held[m]![t].add(c)
        for (const c of blocks.slice(0, shared)) held[m]![0].add(c)
      }
    }
  })
  // Queries: prompts some member holds (on some tier), and new prompts of a family (prefix hits).
  const queryTokens: Array<Uint32Array> = []
  for (let q = 0; q < 256; q++)
    queryTokens.push(q % 4 === 3 ? prompt(q % FAMILIES) : storedPrompts[(q * 37) % storedPrompts.length]!)
  const queries = queryTokens.map((tokens) => sequenceHashes(localBlockHashes(tokens, BLOCK)))
  return { members, events, queries, queryTokens, held }
}

/** The same query over Maps and Sets: per member, per tier, a Set of canonical hashes; refcounts. */
export class MapSetPool {
  readonly members: ReadonlyArray<readonly [Set<bigint>, Set<bigint>, Set<bigint>]>
  readonly refcounts = new Map<bigint, number>()

  constructor(held: Workload["held"]) {
    this.members = held
    for (const [device] of held)
      for (const c of device) this.refcounts.set(c, (this.refcounts.get(c) ?? 0) + 1)
  }

  query(canon: ReadonlyArray<bigint>): WorkerQueryResult {
    const n = canon.length
    const count = this.members.length
    const device = new Array<number>(count)
    const host = new Array<number>(count)
    const disk = new Array<number>(count)
    const dynamoCpu = new Array<number>(count)
    const dynamoDisk = new Array<number>(count)
    let deepest = 0
    for (let j = 0; j < count; j++) {
      const [d, h, k] = this.members[j]!
      let p = 0
      while (p < n && d.has(canon[p]!)) p++
      device[j] = p
      if (p > deepest) deepest = p
      let q = p
      while (q < n && (h.has(canon[q]!) || d.has(canon[q]!))) q++
      host[j] = q
      while (q < n && (k.has(canon[q]!) || h.has(canon[q]!) || d.has(canon[q]!))) q++
      disk[j] = q
      q = p
      while (q < n && h.has(canon[q]!)) q++
      dynamoCpu[j] = q
      while (q < n && k.has(canon[q]!)) q++
      dynamoDisk[j] = q
    }
    const frequencies = new Array<number>(deepest)
    for (let i = 0; i < deepest; i++) frequencies[i] = this.refcounts.get(canon[i]!) ?? 0
    return { queryBlocks: n, members: [], device, host, disk, dynamoCpu, dynamoDisk, frequencies }
  }
}

const sameAnswer = (a: WorkerQueryResult, b: WorkerQueryResult): boolean =>
  (["device", "host", "disk", "dynamoCpu", "dynamoDisk", "frequencies"] as const).every(
    (field) => a[field].length === b[field].length && a[field].every((v, i) => v === b[field][i])
  )

export const benchWorkerQuery = (ctx: BenchContext): void => {
  const workload = buildWorkload(4242)
  // Sized for its device blocks (about 15,000 distinct), as a relay sizes a pool.
  const state = new CanonicalCkfState(ckfConfig(16_384))
  for (const event of workload.events) {
    const outcome = state.applyEvent(event)
    if (outcome.firstError !== undefined || outcome.unanchoredBlocks !== 0)
      throw new Error(`worker_query_1024: the workload did not apply (${outcome.firstError})`)
  }
  state.flush()
  const baseline = new MapSetPool(workload.held)
  const bigQueries = workload.queries.map(hashPairsToBigInts)
  // Both answer the same, and the workload hits every tier.
  let hostHits = 0
  let diskHits = 0
  workload.queries.forEach((q, i) => {
    const ours = state.queryWorkers(q)
    if (!sameAnswer(ours, baseline.query(bigQueries[i]!)))
      throw new Error(`worker_query_1024: the answers differ on query ${i}`)
    for (let j = 0; j < ours.device.length; j++) {
      if (ours.host[j]! > ours.device[j]!) hostHits++
      if (ours.disk[j]! > ours.host[j]!) diskHits++
    }
  })
  if (hostHits === 0 || diskHits === 0) throw new Error("worker_query_1024: no query reached the lower tiers")

  const repeat = ctx.quick ? 20 : 80
  const rounds = ctx.quick ? 3 : 7
  const count = workload.queries.length * repeat
  let sink = 0
  const [ours, plain] = bestRates(
    rounds,
    [
      () => undefined,
      () => {
        for (let r = 0; r < repeat; r++)
          for (const q of workload.queries) sink += state.queryWorkers(q).device[0]!
        return count
      }
    ],
    [
      () => undefined,
      () => {
        for (let r = 0; r < repeat; r++) for (const q of bigQueries) sink += baseline.query(q).device[0]!
        return count
      }
    ]
  )
  const withTokens = bestRate(
    rounds,
    () => undefined,
    () => {
      for (let r = 0; r < repeat / 4; r++)
        for (const tokens of workload.queryTokens)
          sink += state.queryWorkers(sequenceHashes(localBlockHashes(tokens, BLOCK))).device[0]!
      return (repeat / 4) * workload.queryTokens.length
    }
  )
  if (sink < 0) throw new Error("unreachable")
  const stats = state.stats()
  const tiers = state.tierStats()
  const deviceBytes =
    (stats.memory.ownershipBytes + stats.memory.lineageBytes + stats.memory.filterBytes) /
    stats.aggregation.contributionCount
  record(
    ctx,
    "worker_query_1024",
    "queries/s",
    ours,
    plain,
    `${PROMPT_TOKENS}-token prompts (${PROMPT_BLOCKS} blocks) over ${workload.members.length} members sharing ${FAMILIES} system prompts, each holding ${PROMPTS_PER_TIER} prompts per tier (device, host, disk: ${stats.aggregation.contributionCount} device, ${tiers.hostEdges} host, ${tiers.diskEdges} disk edges); cumulative and Dynamo-walk depths and frequencies for every member; baseline: Map/Set per member per tier, the same answers; ${Math.round(withTokens).toLocaleString("en-US")} queries/s with token hashing`
  )
  record(
    ctx,
    "worker_query_pool_tier_memory",
    "bytes/edge",
    tiers.bytesPerEdge,
    deviceBytes,
    `that pool's host and disk tiers (lineage and owner tables) per tier edge; baseline: its device tier (owner, edge and lineage tables and filter) per device edge, whose prefix blocks are shared; ratio = ours/baseline`
  )
  benchTierEdgeMemory(ctx)
}

/**
 * Bytes per host edge against bytes per device edge for the same events (memory_per_edge_canonical's
 * workload: 8 members, unshared blocks), stored on the host tier in one pool and on the device in
 * the other.
 */
const benchTierEdgeMemory = (ctx: BenchContext): void => {
  const edges = ctx.quick ? 262_144 : 1_048_576
  const members = 8
  const workloads = Array.from({ length: members }, (_, m) =>
    canonicalWorkload(edges / members, 3000 + m, String(m + 1))
  )
  const config = ckfConfig(edges)
  const device = new CanonicalCkfState(config)
  const host = new CanonicalCkfState(config)
  for (const events of workloads) {
    for (const event of events) {
      device.applyEvent(event)
      host.applyEvent({ ...event, storageTier: "host_pinned" })
    }
  }
  device.flush()
  const stats = device.stats()
  const deviceBytes =
    (stats.memory.ownershipBytes + stats.memory.lineageBytes + stats.memory.filterBytes) /
    stats.aggregation.contributionCount
  const tiers = host.tierStats()
  record(
    ctx,
    "memory_per_tier_edge",
    "bytes/edge",
    tiers.bytesPerEdge,
    deviceBytes,
    `${tiers.hostEdges} host edges over ${members} members (lineage and owner tables), memory_per_edge_canonical's events on the host tier; baseline: the same events on the device (owner, edge and lineage tables and filter); ratio = ours/baseline (at most 1 is the target)`
  )
}
