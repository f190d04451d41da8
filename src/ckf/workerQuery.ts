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
import { memberBit, memberGroup, type OwnershipTable } from "./ownership.js"

/** What a query reads of one member: its index in each tier's owner table (-1: it holds nothing there). */
export interface QueryMember extends CkfMemberRef {
  readonly device: number
  readonly host: number
  readonly disk: number
}

/** A worker query's answer, one entry per member in `members`' order (see the module comment). */
export interface WorkerQueryResult {
  /** Full blocks in the query. */
  readonly queryBlocks: number
  readonly members: ReadonlyArray<CkfMemberRef>
  readonly device: ReadonlyArray<number>
  readonly host: ReadonlyArray<number>
  readonly disk: ReadonlyArray<number>
  readonly dynamoCpu: ReadonlyArray<number>
  readonly dynamoDisk: ReadonlyArray<number>
  /** Members holding block i on the device, for i below the deepest device depth. */
  readonly frequencies: ReadonlyArray<number>
}

/**
 * The members a query answers for, laid out for its loops: per position, the member's index in
 * the device's, the host's and the disk tier's owner tables (-1: none). Built once per membership
 * change (`queryPlan`).
 */
export interface QueryPlan {
  /** The members as the answer lists them. */
  readonly refs: ReadonlyArray<CkfMemberRef>
  readonly devices: Int32Array
  readonly hosts: Int32Array
  readonly disks: Int32Array
  /** Whether any member holds something on a lower tier (else the tier pass is skipped). */
  readonly tiered: boolean
  /**
   * The device members as the narrowing keeps them (`OwnershipTable.narrowAt`): the groups of 32
   * device indices holding any, and per group the bits of its members.
   */
  readonly groups: Int32Array
  readonly groupMasks: Uint32Array
  /** Per device index, the member's position in `refs` (-1: not listed). */
  readonly positionOf: Int32Array
}

/** The plan of `members`, listed as `refs` (plain references in the same order) in the answer. */
export const queryPlan = (
  members: ReadonlyArray<QueryMember>,
  refs: ReadonlyArray<CkfMemberRef> = members.map((m) => ({ workerId: m.workerId, dpRank: m.dpRank }))
): QueryPlan => {
  let top = -1
  for (const m of members) top = Math.max(top, m.device)
  const positionOf = new Int32Array(top + 1).fill(-1)
  const masks = new Map<number, number>()
  members.forEach((m, j) => {
    if (m.device < 0) return
    // One position per member: a member listed twice would leave one of its entries unanswered.
    if (positionOf[m.device] !== -1)
      throw new RangeError(`worker query lists ${m.workerId}/${m.dpRank} more than once`)
    positionOf[m.device] = j
    const g = memberGroup(m.device)
    masks.set(g, ((masks.get(g) ?? 0) | memberBit(m.device)) >>> 0)
  })
  const groups = [...masks.keys()].sort((a, b) => a - b)
  return {
    refs,
    devices: Int32Array.from(members, (m) => m.device),
    hosts: Int32Array.from(members, (m) => m.host),
    disks: Int32Array.from(members, (m) => m.disk),
    tiered: members.some((m) => m.host >= 0 || m.disk >= 0),
    groups: Int32Array.from(groups),
    groupMasks: Uint32Array.from(groups, (g) => masks.get(g)!),
    positionOf
  }
}

let slotScratch = new Int32Array(64)
let hostSlotScratch = new Int32Array(64)
let diskSlotScratch = new Int32Array(64)
let hostGroupScratch = new Int32Array(64)
let hostMaskScratch = new Uint32Array(64)
let diskGroupScratch = new Int32Array(64)
let diskMaskScratch = new Uint32Array(64)
let groupScratch = new Int32Array(8)
let maskScratch = new Uint32Array(8)
/** Where the prefetching loads' values go, so that they are not optimised away. */
const touchSink = { value: 0 }
/** How many blocks ahead of its lookup a block's owner-table home is loaded. */
const TOUCH_AHEAD = 8
/** Owner tables up to this many slots (3 MiB of 12-byte slots) are taken to sit in cache. */
const TOUCH_MIN_SLOTS = 1 << 18
/** A block whose owner-table slot has not been looked up yet in this query. */
const UNKNOWN_SLOT = -0x7fff_ffff

/**
 * Runs a worker query over a pool's tables: the device's owner table `owners` and the host's and
 * the disk tier's (`hostOwners`, `diskOwners`); `keys` holds the `n` query blocks' mixed keys
 * (`CkfAddressing.mixBatch` of their canonical sequence hashes) as `[hi, lo]` pairs; the answer
 * lists `plan.refs` in their order.
 *
 * The device depths come from narrowing, never from enumerating the pool per block: the owners
 * of block 0 among the members, then at each later block only the members still matching. The
 * candidates are kept as bitmaps of 32 member indices, as the owner table keeps a block's owners
 * beyond the first: each block costs one owner-table lookup and one probe per group of 32 with
 * candidates left (none once the block's refcount of owners is found), whatever the number of
 * members matching. A member's lower-tier walks start where its device match ended: the block
 * there is looked up once per query in each tier's owner table, so members whose block no member
 * holds on a lower tier cost nothing more, and the others probe only their own edges.
 */
export const runWorkerQuery = (
  owners: OwnershipTable,
  hostOwners: OwnershipTable,
  diskOwners: OwnershipTable,
  keys: Uint32Array,
  n: number,
  plan: QueryPlan
): WorkerQueryResult => {
  const devices = plan.devices
  const count = devices.length
  // Plain arrays: a query's answer is a few short arrays, and typed arrays cost several times
  // more to allocate (their buffer lives off the heap).
  const device = zeros(count)
  if (slotScratch.length < n) {
    const size = Math.max(n, 2 * slotScratch.length)
    slotScratch = new Int32Array(size)
    hostSlotScratch = new Int32Array(size)
    diskSlotScratch = new Int32Array(size)
    hostGroupScratch = new Int32Array(size)
    hostMaskScratch = new Uint32Array(size)
    diskGroupScratch = new Int32Array(size)
    diskMaskScratch = new Uint32Array(size)
  }
  const planGroups = plan.groups
  if (groupScratch.length < planGroups.length) {
    groupScratch = new Int32Array(planGroups.length)
    maskScratch = new Uint32Array(planGroups.length)
  }
  // slots[i]: block i's device owner-table slot (negative when no member holds it), known below
  // `known`.
  const slots = slotScratch
  let known = 0

  // Device: the owners of block 0, then narrowing. In a table too large for the caches, the
  // blocks' owner-table homes are loaded `TOUCH_AHEAD` blocks ahead of their lookup: the loads
  // are independent, so their misses overlap instead of one per block in turn, and few are
  // wasted past where the matches end. A table that fits in cache only pays for the loads.
  let deepest = 0
  let touched = 0
  const touching = owners.slotCapacity > TOUCH_MIN_SLOTS
  const ahead = touching ? Math.min(n, TOUCH_AHEAD) : 0
  for (let i = 0; i < ahead; i++) touched |= owners.touchAt(keys, 2 * i)
  if (n > 0) {
    // Every member holding anything on the device is a candidate for block 0.
    const groups = groupScratch
    const masks = maskScratch
    groups.set(planGroups)
    masks.set(plan.groupMasks)
    let live = planGroups.length
    const positionOf = plan.positionOf
    let i = 0
    for (; i < n && live > 0; i++) {
      if (touching && i + TOUCH_AHEAD < n) touched |= owners.touchAt(keys, 2 * (i + TOUCH_AHEAD))
      const slot = owners.findAt(keys, 2 * i)
      slots[i] = slot
      known = i + 1
      live = owners.narrowAt(slot, keys, 2 * i, groups, masks, live, positionOf, device, i)
    }
    // Candidates left after the last block hold all of it: they end at depth n.
    owners.narrowAt(-1, keys, 0, groups, masks, live, positionOf, device, i)
    for (let j = 0; j < count; j++) if (device[j]! > deepest) deepest = device[j]!
  }
  touchSink.value = touched
  const frequencies = new Array<number>(deepest)
  for (let i = 0; i < deepest; i++) frequencies[i] = owners.countAt(slots[i]!)

  // Nothing below the device: every walk ends where the device's did (one array, read only).
  if (!plan.tiered)
    return {
      queryBlocks: n,
      members: plan.refs,
      device,
      host: device,
      disk: device,
      dynamoCpu: device,
      dynamoDisk: device,
      frequencies
    }
  // Every member's entry is written below.
  const host = new Array<number>(count)
  const disk = new Array<number>(count)
  const dynamoCpu = new Array<number>(count)
  const dynamoDisk = new Array<number>(count)

  // Lower tiers, per member, from where its device match ended. The block there is looked up
  // once per query in each tier's owner table, and its owners once per group of 32 members (most
  // members end at the same few blocks); most members hold it on no lower tier and stop.
  const hostSlots = hostSlotScratch
  const diskSlots = diskSlotScratch
  hostSlots.fill(UNKNOWN_SLOT, 0, n)
  diskSlots.fill(UNKNOWN_SLOT, 0, n)
  hostGroupScratch.fill(-1, 0, n)
  diskGroupScratch.fill(-1, 0, n)
  const hosts = plan.hosts
  const disks = plan.disks
  let walk: TierWalk | undefined
  for (let j = 0; j < count; j++) {
    const d = device[j]!
    const hm = hosts[j]!
    const km = disks[j]!
    let hostAtD = false
    let diskAtD = false
    if (d < n) {
      if (hm >= 0)
        hostAtD = tierHoldsAt(hostOwners, hostSlots, hostGroupScratch, hostMaskScratch, keys, d, hm)
      if (!hostAtD && km >= 0)
        diskAtD = tierHoldsAt(diskOwners, diskSlots, diskGroupScratch, diskMaskScratch, keys, d, km)
    }
    if (!hostAtD && !diskAtD) {
      // Block d is on no lower tier of this member (or d = n): every walk ends where the device's did.
      host[j] = d
      disk[j] = d
      dynamoCpu[j] = d
      dynamoDisk[j] = d
      continue
    }
    walk ??= {
      owners,
      hostOwners,
      diskOwners,
      keys,
      n,
      slots,
      known,
      hostSlots,
      diskSlots,
      host: 0,
      disk: 0,
      dynamoCpu: 0,
      dynamoDisk: 0
    }
    walkLowerTiers(walk, d, devices[j]!, hm, km, hostAtD)
    host[j] = walk.host
    disk[j] = walk.disk
    dynamoCpu[j] = walk.dynamoCpu
    dynamoDisk[j] = walk.dynamoDisk
  }
  return { queryBlocks: n, members: plan.refs, device, host, disk, dynamoCpu, dynamoDisk, frequencies }
}

const zeros = (count: number): Array<number> => new Array<number>(count).fill(0)

/**
 * Whether member `m` (index in `owners`, a lower tier's table) holds block `d`: the block's slot
 * is cached in `slots[d]` and the owners of one group of 32 members in `groups[d]` (the group) and
 * `masks[d]` (its owner bits), so that the members of a group ending at the same block cost one
 * probe together.
 */
const tierHoldsAt = (
  owners: OwnershipTable,
  slots: Int32Array,
  groups: Int32Array,
  masks: Uint32Array,
  keys: Uint32Array,
  d: number,
  m: number
): boolean => {
  let slot = slots[d]!
  if (slot === UNKNOWN_SLOT) {
    slot = owners.findAt(keys, 2 * d)
    slots[d] = slot
  }
  if (slot < 0) return false
  const g = memberGroup(m)
  let mask: number
  if (groups[d] === g) mask = masks[d]!
  else {
    mask = owners.groupOwnersAt(slot, keys, 2 * d, m)
    groups[d] = g
    masks[d] = mask
  }
  return (mask & memberBit(m)) !== 0
}

/** The tables and per-query slot caches of `walkLowerTiers`, and its answers for one member. */
interface TierWalk {
  readonly owners: OwnershipTable
  readonly hostOwners: OwnershipTable
  readonly diskOwners: OwnershipTable
  readonly keys: Uint32Array
  readonly n: number
  readonly slots: Int32Array
  /** Device slots known below this. */
  known: number
  readonly hostSlots: Int32Array
  readonly diskSlots: Int32Array
  host: number
  disk: number
  dynamoCpu: number
  dynamoDisk: number
}

/** Whether member `m` (device index) holds block p on the device. */
const walkOnDevice = (w: TierWalk, p: number, m: number): boolean => {
  if (m < 0) return false
  for (; w.known <= p; w.known++) w.slots[w.known] = w.owners.findAt(w.keys, 2 * w.known)
  return w.owners.ownsKeyAt(w.slots[p]!, w.keys, 2 * p, m)
}

/** Whether member `m` (index in `owners`) holds block p on the tier of `owners` and `slots`. */
const walkOnTier = (
  w: TierWalk,
  owners: OwnershipTable,
  slots: Int32Array,
  p: number,
  m: number
): boolean => {
  if (m < 0) return false
  let slot = slots[p]!
  if (slot === UNKNOWN_SLOT) {
    slot = owners.findAt(w.keys, 2 * p)
    slots[p] = slot
  }
  return owners.ownsKeyAt(slot, w.keys, 2 * p, m)
}

/**
 * The lower-tier walks of a member whose device match ended at block `d`, which it holds on the
 * host (`hostAtD`) or on the disk tier: the cumulative host and disk depths, and Dynamo's walk.
 */
const walkLowerTiers = (
  w: TierWalk,
  d: number,
  m: number,
  hm: number,
  km: number,
  hostAtD: boolean
): void => {
  const n = w.n
  const onHost = (p: number): boolean => walkOnTier(w, w.hostOwners, w.hostSlots, p, hm)
  const onDisk = (p: number): boolean => walkOnTier(w, w.diskOwners, w.diskSlots, p, km)
  // Cumulative: block d is not on the device, later blocks may be.
  let p = d
  if (hostAtD) {
    p++
    while (p < n && (onHost(p) || walkOnDevice(w, p, m))) p++
  }
  w.host = p
  while (p < n && (onDisk(p) || onHost(p) || walkOnDevice(w, p, m))) p++
  w.disk = p
  // Dynamo's walk: the host alone, then the disk tier alone.
  let q = d
  if (hostAtD) {
    q++
    while (q < n && onHost(q)) q++
  }
  w.dynamoCpu = q
  while (q < n && onDisk(q)) q++
  w.dynamoDisk = q
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
  readonly frequencies: ReadonlyArray<number>
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
  return { queryBlocks: result.queryBlocks, frequencies: result.frequencies, workers }
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
  readonly frequencies: ReadonlyArray<number>
  readonly instances: Record<string, DynamoInstanceSummary>
}

const orders = new WeakMap<ReadonlyArray<CkfMemberRef>, Int32Array>()

/**
 * The indices of `members` in (worker id, dp rank) order, sorted once per members array (a pool
 * keeps one array until its membership changes) rather than once per answer.
 */
export const memberOrder = (members: ReadonlyArray<CkfMemberRef>): Int32Array => {
  let order = orders.get(members)
  if (order === undefined) {
    order = Int32Array.from(members.map((_, j) => j).sort((a, b) => compareMembers(members[a]!, members[b]!)))
    orders.set(members, order)
  }
  return order
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
  const order = memberOrder(result.members)
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
  return { scores, frequencies: result.frequencies, instances }
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
