/**
 * Worker-level index queries (PROTOCOL §5.1 ◆3): which member (worker, dp rank) of a pool holds
 * how much of a prompt, on which storage tier, and the answers built from it in the two shapes the
 * relay serves: `/v1/query`'s `pools[]` entries and Dynamo's standalone KV indexer's `/query` and
 * `/query_by_hash` answer. Plain synchronous TypeScript: the query reads the producer's tables
 * (`CanonicalCkfState.queryWorkers` runs it inside the pool's actor, so it sees one consistent
 * state), and the builders are pure functions of its result.
 *
 * Depths are in blocks, from the start of the prompt:
 * - `device[m]`: the longest prefix whose every block member m holds on the device;
 * - `host[m]` ≥ `device[m]`: the longest prefix whose every block it holds on the device or the
 *   host; `disk[m]` ≥ `host[m]`: on any of the three (cumulative, §5.1);
 * - `dynamoCpu[m]`, `dynamoDisk[m]`: Dynamo's walk (`query_lower_tiers` in Dynamo's
 *   `lib/kv-router/src/indexer/lower_tier_indexers.rs`, `query_match_details` in
 *   `lower_tier.rs`): from where the device match ended, the blocks held on the host one after
 *   another (the device no longer counts), then from there the blocks held on the disk tier. It
 *   differs from the cumulative depths only when tiers interleave (a block on the device after
 *   one only on the host). Dynamo walks its disk and external tiers one after the other; both
 *   are the disk tier here (§5.1), so a run that alternates disk and external blocks counts whole.
 * - `frequencies[i]`: the number of members holding block i on the device (its exact refcount),
 *   for i below the deepest device depth of the members listed. A member filter narrows the
 *   members listed (and so how far the frequencies go), not what they count: the whole pool.
 */

import type { CkfMemberRef } from "./events.js"
import { compareMembers } from "./events.js"
import type { KeySet } from "./keySet.js"
import type { OwnershipTable } from "./ownership.js"

/** What a query reads of one member: its device owner index and its lower-tier key sets. */
export interface QueryMember extends CkfMemberRef {
  /** Index in the owner table, or -1 when it holds nothing on the device. */
  readonly device: number
  readonly host: KeySet | undefined
  readonly disk: KeySet | undefined
}

/** A worker query's answer, one entry per member in `members`' order (see the module comment). */
export interface WorkerQueryResult {
  /** Full blocks in the query. */
  readonly queryBlocks: number
  readonly members: ReadonlyArray<CkfMemberRef>
  readonly device: Uint32Array
  readonly host: Uint32Array
  readonly disk: Uint32Array
  readonly dynamoCpu: Uint32Array
  readonly dynamoDisk: Uint32Array
  /** Members holding block i on the device, for i below the deepest device depth. */
  readonly frequencies: Uint32Array
}

let slotScratch = new Int32Array(64)
let activeScratch = new Int32Array(64)

/**
 * Runs a worker query over a pool's tables: `keys` holds the `n` query blocks' mixed keys
 * (`CkfAddressing.mixBatch` of their canonical sequence hashes) as `[hi, lo]` pairs; the answer
 * lists `members` in their order.
 *
 * The device depths come from narrowing, never from enumerating the pool per block: the owners
 * of block 0 among the members (found by probing each member once, and no more once the block's
 * refcount of owners are found), then at each later block only the members still matching are
 * probed, again no more than the block's refcount. The work is the sum of the device depths plus
 * one probe per member. A member's lower-tier walks start where its device match ended and probe
 * its own key sets (and the device, for the cumulative depths); a member with nothing on a lower
 * tier costs nothing more.
 */
export const runWorkerQuery = (
  owners: OwnershipTable,
  keys: Uint32Array,
  n: number,
  members: ReadonlyArray<QueryMember>,
  /** The members as the answer lists them (plain references, in `members`' order). */
  refs: ReadonlyArray<CkfMemberRef> = members
): WorkerQueryResult => {
  const count = members.length
  const device = new Uint32Array(count)
  const host = new Uint32Array(count)
  const disk = new Uint32Array(count)
  const dynamoCpu = new Uint32Array(count)
  const dynamoDisk = new Uint32Array(count)
  if (slotScratch.length < n) slotScratch = new Int32Array(Math.max(n, 2 * slotScratch.length))
  if (activeScratch.length < count) activeScratch = new Int32Array(Math.max(count, 2 * activeScratch.length))
  // slots[i]: block i's owner-table slot (negative when no member holds it), computed up to `known`.
  const slots = slotScratch
  let known = 0
  const slotAt = (i: number): number => {
    while (known <= i) {
      slots[known] = owners.findAt(keys, 2 * known)
      known++
    }
    return slots[i]!
  }
  const key = owners.key
  const ownsAt = (i: number, m: number): boolean => {
    const slot = slotAt(i)
    if (slot < 0) return false
    key[0] = keys[2 * i]!
    key[1] = keys[2 * i + 1]!
    return owners.ownsAt(slot, m)
  }

  // Device: the owners of block 0, then narrowing.
  const active = activeScratch
  let live = 0
  let deepest = 0
  if (n > 0) {
    const slot = slotAt(0)
    if (slot >= 0) {
      key[0] = keys[0]!
      key[1] = keys[1]!
      const owning = owners.countAt(slot)
      for (let j = 0, found = 0; j < count && found < owning; j++) {
        const m = members[j]!.device
        if (m >= 0 && owners.ownsAt(slot, m)) {
          active[live++] = j
          found++
        }
      }
    }
    let i = 1
    for (; i < n && live > 0; i++) {
      const next = slotAt(i)
      if (next < 0) break
      key[0] = keys[2 * i]!
      key[1] = keys[2 * i + 1]!
      const owning = owners.countAt(next)
      let kept = 0
      for (let a = 0; a < live; a++) {
        const j = active[a]!
        if (kept < owning && owners.ownsAt(next, members[j]!.device)) active[kept++] = j
        else device[j] = i
      }
      live = kept
    }
    for (let a = 0; a < live; a++) device[active[a]!] = i
    if (live > 0) deepest = i
  }
  for (let j = 0; j < count; j++) if (device[j]! > deepest) deepest = device[j]!
  const frequencies = new Uint32Array(deepest)
  for (let i = 0; i < deepest; i++) frequencies[i] = owners.countAt(slots[i]!)

  // Lower tiers, per member, from where its device match ended.
  for (let j = 0; j < count; j++) {
    const member = members[j]!
    const d = device[j]!
    const h = member.host
    const k = member.disk
    if (h === undefined && k === undefined) {
      host[j] = d
      disk[j] = d
      dynamoCpu[j] = d
      dynamoDisk[j] = d
      continue
    }
    const m = member.device
    // Cumulative: block d is not on the device (or d = n), later blocks may be.
    let p = d
    while (p < n && (h?.has(keys, 2 * p) === true || (p > d && m >= 0 && ownsAt(p, m)))) p++
    host[j] = p
    while (
      p < n &&
      (k?.has(keys, 2 * p) === true || h?.has(keys, 2 * p) === true || (m >= 0 && ownsAt(p, m)))
    )
      p++
    disk[j] = p
    // Dynamo's walk: the host alone, then the disk tier alone.
    let q = d
    if (h !== undefined) while (q < n && h.has(keys, 2 * q)) q++
    dynamoCpu[j] = q
    if (k !== undefined) while (q < n && k.has(keys, 2 * q)) q++
    dynamoDisk[j] = q
  }
  return { queryBlocks: n, members: refs, device, host, disk, dynamoCpu, dynamoDisk, frequencies }
}

// -----------------------------------------------------------------------------------------------
// Answers

/** One member's cumulative depths in `/v1/query`'s `workers` (blocks). */
export interface WorkerDepths {
  readonly workerId: string
  readonly dpRank: number
  readonly device: number
  readonly host: number
  readonly disk: number
}

/** `/v1/query`'s per-pool fields that come from the query (PROTOCOL §5.1). */
export interface PoolWorkersAnswer {
  readonly queryBlocks: number
  readonly frequencies: Array<number>
  readonly workers: Array<WorkerDepths>
}

/** §5.1's order of `workers`: `device`, then `host`, then `disk` descending, then worker id, dp rank. */
export const compareWorkerDepths = (a: WorkerDepths, b: WorkerDepths): number =>
  b.device - a.device || b.host - a.host || b.disk - a.disk || compareMembers(a, b)

/**
 * `/v1/query`'s `queryBlocks`, `frequencies` and `workers` for one pool: every member of the
 * result, zero depths included, in §5.1's order. The caller adds `servingEndpoint`, `poolId` and
 * `kvBlockSize` (and passes the pool's expected members to the query, so that members holding
 * nothing are listed too).
 */
export const poolWorkersAnswer = (result: WorkerQueryResult): PoolWorkersAnswer => {
  const workers: Array<WorkerDepths> = result.members.map((member, j) => ({
    workerId: member.workerId,
    dpRank: member.dpRank,
    device: result.device[j]!,
    host: result.host[j]!,
    disk: result.disk[j]!
  }))
  workers.sort(compareWorkerDepths)
  return { queryBlocks: result.queryBlocks, frequencies: Array.from(result.frequencies), workers }
}

/** Dynamo's `MooncakeOverlapSummary` (`lib/kv-router/src/services/overlap.rs`), in tokens. */
export interface DynamoInstanceSummary {
  readonly longest_matched: number
  readonly gpu: number
  readonly dp: Record<string, number>
  readonly cpu: number
  readonly disk: number
}

/** Dynamo's standalone indexer's `/query` and `/query_by_hash` answer (`ScoreResponse`). */
export interface DynamoScoreResponse {
  readonly scores: Record<string, Record<string, number>>
  readonly frequencies: Array<number>
  readonly instances: Record<string, DynamoInstanceSummary>
}

/**
 * The answer Dynamo's standalone KV indexer gives for the same state (`build_score_response` in
 * `lib/kv-router/src/services/indexer/server.rs`, `build_mooncake_overlap_summaries` in
 * `lib/kv-router/src/services/overlap.rs`), in tokens (blocks × `blockSize`):
 * - `scores[worker][rank]`: the device depth of every member that matched at least one block on
 *   the device (the device overlap's scores; members with none are left out);
 * - `frequencies`: as in `/v1/query`;
 * - `instances[worker]`, for every worker with a member that matched anything on any tier:
 *   `dp[rank]` the device depth of each such member (0 when only its lower tiers matched), `gpu`,
 *   `cpu` and `disk` the largest over its members of the device depth and of Dynamo's walk
 *   through the host (`device + host extension`) and then the disk tier (`+ disk extension`), and
 *   `longest_matched` the largest of the three.
 * Keys are decimal worker ids and dp ranks. The objects are built in (worker id, dp rank) order;
 * Dynamo's come from hash maps, in no order, so a reader compares them as maps.
 */
export const dynamoScoreResponse = (result: WorkerQueryResult, blockSize: number): DynamoScoreResponse => {
  const order = result.members
    .map((_, j) => j)
    .sort((a, b) => compareMembers(result.members[a]!, result.members[b]!))
  const scores: Record<string, Record<string, number>> = {}
  const instances: Record<
    string,
    { longest_matched: number; gpu: number; dp: Record<string, number>; cpu: number; disk: number }
  > = {}
  for (const j of order) {
    const { workerId, dpRank } = result.members[j]!
    const gpu = result.device[j]! * blockSize
    const cpu = result.dynamoCpu[j]! * blockSize
    const disk = result.dynamoDisk[j]! * blockSize
    if (gpu > 0) {
      const ranks = scores[workerId] ?? {}
      ranks[String(dpRank)] = gpu
      scores[workerId] = ranks
    }
    if (disk === 0) continue
    const summary = instances[workerId] ?? { longest_matched: 0, gpu: 0, dp: {}, cpu: 0, disk: 0 }
    instances[workerId] = summary
    summary.dp[String(dpRank)] = gpu
    summary.gpu = Math.max(summary.gpu, gpu)
    summary.cpu = Math.max(summary.cpu, cpu)
    summary.disk = Math.max(summary.disk, disk)
    summary.longest_matched = Math.max(summary.gpu, summary.cpu, summary.disk)
  }
  return { scores, frequencies: Array.from(result.frequencies), instances }
}

/** One rank's source as `GET /workers` lists it. */
export interface DynamoWorkerEndpoint extends CkfMemberRef {
  /** The transport endpoint of the rank's event source (`tcp://host:port`). */
  readonly endpoint: string
}

/**
 * `GET /workers` in the shape of Dynamo's standalone indexer (`WorkerInfo` in its
 * `lib/kv-router/src/bin/kv_indexer/server.rs`): `[{instance_id, endpoints: {"<dpRank>":
 * endpoint}}]`, one entry per worker in worker-id order. Returned as JSON text: `instance_id` is a
 * JSON number over the whole u64 range, written exactly rather than through a double.
 */
export const dynamoWorkersJson = (ranks: ReadonlyArray<DynamoWorkerEndpoint>): string => {
  const sorted = [...ranks].sort(compareMembers)
  const parts: Array<string> = []
  for (let i = 0; i < sorted.length; ) {
    const workerId = sorted[i]!.workerId
    if (!/^(0|[1-9][0-9]*)$/.test(workerId)) throw new RangeError(`worker id ${JSON.stringify(workerId)}`)
    const endpoints: Record<string, string> = {}
    for (; i < sorted.length && sorted[i]!.workerId === workerId; i++)
      endpoints[String(sorted[i]!.dpRank)] = sorted[i]!.endpoint
    parts.push(`{"instance_id":${workerId},"endpoints":${JSON.stringify(endpoints)}}`)
  }
  return `[${parts.join(",")}]`
}
