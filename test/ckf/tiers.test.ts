/**
 * Storage tiers and worker queries of the canonical producer (PROTOCOL §5.1 ◆3) against a plain
 * model: per member, per tier, a lineage Map (external → canonical) and a Set of canonical
 * hashes; queries walk the Sets.
 */

import fc from "fast-check"
import { describe, expect, it } from "vitest"
import { CanonicalCkfState } from "../../src/ckf/canonical.js"
import { ckfConfig } from "../../src/ckf/config.js"
import type { CkfEvent, CkfMemberRef, StorageTier } from "../../src/ckf/events.js"
import { storageTierOfMedium } from "../../src/ckf/events.js"
import { nextSequenceHash } from "../../src/ckf/tokens.js"
import { hashPairs, hashPairsToBigInts } from "../../src/ckf/u64.js"
import { dynamoScoreResponse, poolWorkersAnswer, type WorkerQueryResult } from "../../src/ckf/workerQuery.js"

const U64 = (1n << 64n) - 1n
const TIERS = ["device", "host", "disk"] as const
const tierIndex = (tier: StorageTier): number => (tier === "device" ? 0 : tier === "host_pinned" ? 1 : 2)

const MEMBERS: ReadonlyArray<CkfMemberRef> = [
  { workerId: "7", dpRank: 0 },
  { workerId: "7", dpRank: 1 },
  { workerId: "12", dpRank: 0 },
  { workerId: "300", dpRank: 2 }
]
const keyOf = (m: CkfMemberRef): string => `${m.workerId}/${m.dpRank}`

/** An engine's external hash of a block: per member a different (injective) function of the address. */
const externalOf = (member: number, canon: bigint): bigint =>
  (canon * 0x9e37_79b9_7f4a_7c15n + BigInt(member) * 7919n + 1n) & U64
const UNKNOWN = 999n

/** Canonical sequence hashes of a path of local hashes (`seq[0] = local[0]`, then chained). */
const chain = (parent: bigint | undefined, local: ReadonlyArray<bigint>): Array<bigint> => {
  const out: Array<bigint> = []
  let previous = parent
  for (const l of local) {
    previous = previous === undefined ? l : nextSequenceHash(previous, l)
    out.push(previous)
  }
  return out
}

class MemberModel {
  /** Per tier: external → canonical, and canonical → how many external hashes hold it. */
  readonly lineage = TIERS.map(() => new Map<bigint, bigint>())
  readonly held = TIERS.map(() => new Map<bigint, number>())

  resolve(ext: bigint): bigint | undefined {
    for (const lineage of this.lineage) {
      const canon = lineage.get(ext)
      if (canon !== undefined) return canon
    }
    return undefined
  }

  add(t: number, ext: bigint, canon: bigint): void {
    if (this.lineage[t]!.has(ext)) return
    this.lineage[t]!.set(ext, canon)
    this.held[t]!.set(canon, (this.held[t]!.get(canon) ?? 0) + 1)
  }

  remove(t: number, ext: bigint): boolean {
    const canon = this.lineage[t]!.get(ext)
    if (canon === undefined) return false
    this.lineage[t]!.delete(ext)
    const count = this.held[t]!.get(canon)! - 1
    if (count === 0) this.held[t]!.delete(canon)
    else this.held[t]!.set(canon, count)
    return true
  }

  holds(t: number, canon: bigint): boolean {
    return this.held[t]!.has(canon)
  }

  get empty(): boolean {
    return this.lineage.every((l) => l.size === 0)
  }
}

/** The pool as plain Maps and Sets: the semantics PROTOCOL §5.1 and §3.3 describe. */
class PoolModel {
  members = MEMBERS.map(() => new MemberModel())
  readonly partial = new Set<number>()
  unanchored = 0
  unknownRemovals = 0
  unanchoredRemovals = 0

  /** A store with tokens: chained from its parent (resolved on any tier), as an engine source. */
  storeChained(
    m: number,
    t: number,
    external: ReadonlyArray<bigint>,
    canon: ReadonlyArray<bigint>,
    parent?: bigint
  ): number {
    const member = this.members[m]!
    if (parent !== undefined && member.resolve(parent) === undefined) {
      this.unanchored += external.length
      this.partial.add(m)
      return external.length
    }
    external.forEach((e, i) => {
      member.add(t, e, canon[i]!)
    })
    return 0
  }

  /** A tokens-less store: each block resolved through the member's lineage, on any tier. */
  storeByLineage(m: number, t: number, external: ReadonlyArray<bigint>): number {
    const member = this.members[m]!
    let skipped = 0
    for (const e of external) {
      const canon = member.lineage[t]!.get(e) ?? member.resolve(e)
      if (canon === undefined) skipped++
      else member.add(t, e, canon)
    }
    if (skipped > 0) {
      this.unanchored += skipped
      this.partial.add(m)
    }
    return skipped
  }

  remove(m: number, t: number, external: ReadonlyArray<bigint>): void {
    for (const e of external) {
      if (this.members[m]!.remove(t, e)) continue
      if (this.partial.has(m)) this.unanchoredRemovals++
      else this.unknownRemovals++
    }
  }

  clear(m: number): void {
    this.members[m] = new MemberModel()
    this.partial.delete(m)
  }

  /** Which members hold something on any tier, in (worker id, dp rank) order (MEMBERS is sorted). */
  listed(): Array<number> {
    return MEMBERS.map((_, m) => m).filter((m) => !this.members[m]!.empty)
  }

  /** The query answer for `canon` over `members`, as the module comment of workerQuery.ts defines it. */
  query(canon: ReadonlyArray<bigint>, members: ReadonlyArray<number>) {
    const n = canon.length
    const walk = (from: number, ok: (c: bigint) => boolean): number => {
      let p = from
      while (p < n && ok(canon[p]!)) p++
      return p
    }
    const rows = members.map((m) => {
      const member = this.members[m] ?? new MemberModel()
      const device = walk(0, (c) => member.holds(0, c))
      const host = walk(0, (c) => member.holds(0, c) || member.holds(1, c))
      const disk = walk(0, (c) => member.holds(0, c) || member.holds(1, c) || member.holds(2, c))
      const dynamoCpu = walk(device, (c) => member.holds(1, c))
      const dynamoDisk = walk(dynamoCpu, (c) => member.holds(2, c))
      return { device, host, disk, dynamoCpu, dynamoDisk }
    })
    // Frequencies count every member of the pool, up to the deepest device depth of those listed.
    const deepest = Math.max(0, ...rows.map((row) => row.device))
    const frequencies = canon
      .slice(0, deepest)
      .map((c) => this.members.filter((member) => member.holds(0, c)).length)
    return { rows, frequencies }
  }
}

const tierOf = (t: number, external: boolean): StorageTier =>
  t === 0 ? "device" : t === 1 ? "host_pinned" : external ? "external" : "disk"

const storedEvent = (
  m: number,
  tier: StorageTier,
  external: ReadonlyArray<bigint>,
  local: ReadonlyArray<bigint> | undefined,
  parent: bigint | undefined
): CkfEvent => ({
  ...MEMBERS[m]!,
  storageTier: tier,
  data:
    local === undefined
      ? { _tag: "Stored", blockHashes: hashPairs(external), resolveThroughLineage: true }
      : {
          _tag: "Stored",
          blockHashes: hashPairs(external),
          tokensHashes: hashPairs(local),
          parentHash: parent === undefined ? undefined : hashPairs([parent]),
          skipUnanchored: true
        }
})
const removedEvent = (m: number, tier: StorageTier, external: ReadonlyArray<bigint>): CkfEvent => ({
  ...MEMBERS[m]!,
  storageTier: tier,
  data: { _tag: "Removed", blockHashes: hashPairs(external) }
})
const clearedEvent = (m: number): CkfEvent => ({
  ...MEMBERS[m]!,
  storageTier: "device",
  data: { _tag: "Cleared" }
})

const rowsOf = (result: WorkerQueryResult) =>
  result.members.map((_, j) => ({
    device: result.device[j]!,
    host: result.host[j]!,
    disk: result.disk[j]!,
    dynamoCpu: result.dynamoCpu[j]!,
    dynamoDisk: result.dynamoDisk[j]!
  }))

/**
 * Dynamo's standalone indexer's answer, reimplemented from its structures: the device scores of
 * the members that matched; per lower tier, in the order host → disk, each member continues from
 * where it stopped (a member with no continuation starts at the root when it holds block 0 on
 * that tier), and its hits join `hits` even when zero (`query_lower_tiers`, `query_match_details`);
 * then `build_mooncake_overlap_summaries` and `build_score_response` as written in Rust.
 */
const dynamoFromModel = (model: PoolModel, canon: ReadonlyArray<bigint>, blockSize: number) => {
  const scores = new Map<number, number>()
  for (const m of MEMBERS.keys()) {
    let d = 0
    while (d < canon.length && model.members[m]!.holds(0, canon[d]!)) d++
    if (d > 0) scores.set(m, d)
  }
  let continuations = new Map<number, number>(scores)
  const hitsByTier: Array<Map<number, number>> = []
  for (const t of [1, 2]) {
    for (const m of MEMBERS.keys())
      if (!continuations.has(m) && canon.length > 0 && model.members[m]!.holds(t, canon[0]!))
        continuations.set(m, 0)
    const hits = new Map<number, number>()
    const next = new Map<number, number>()
    for (const [m, start] of continuations) {
      let p = start
      while (p < canon.length && model.members[m]!.holds(t, canon[p]!)) p++
      hits.set(m, p - start)
      next.set(m, p)
    }
    hitsByTier.push(hits)
    continuations = next
  }
  const all = new Set<number>([...scores.keys(), ...hitsByTier.flatMap((h) => [...h.keys()])])
  const instances: Record<
    string,
    { longest_matched: number; gpu: number; dp: Record<string, number>; cpu: number; disk: number }
  > = {}
  for (const m of all) {
    const gpuBlocks = scores.get(m) ?? 0
    const cpuBlocks = gpuBlocks + (hitsByTier[0]!.get(m) ?? 0)
    const diskBlocks = cpuBlocks + (hitsByTier[1]!.get(m) ?? 0)
    const { workerId, dpRank } = MEMBERS[m]!
    const summary = instances[workerId] ?? { longest_matched: 0, gpu: 0, dp: {}, cpu: 0, disk: 0 }
    instances[workerId] = summary
    summary.dp[String(dpRank)] = gpuBlocks * blockSize
    summary.gpu = Math.max(summary.gpu, gpuBlocks * blockSize)
    summary.cpu = Math.max(summary.cpu, cpuBlocks * blockSize)
    summary.disk = Math.max(summary.disk, diskBlocks * blockSize)
  }
  for (const summary of Object.values(instances))
    summary.longest_matched = Math.max(summary.gpu, summary.cpu, summary.disk)
  const scoreMap: Record<string, Record<string, number>> = {}
  for (const [m, d] of scores) {
    const { workerId, dpRank } = MEMBERS[m]!
    scoreMap[workerId] = { ...(scoreMap[workerId] ?? {}), [String(dpRank)]: d * blockSize }
  }
  return { scores: scoreMap, instances }
}

describe("storage tiers and worker queries (PROTOCOL §5.1 ◆3)", () => {
  const pick = fc.oneof(
    { weight: 3, arbitrary: fc.record({ from: fc.constant("own" as const), i: fc.nat() }) },
    { weight: 2, arbitrary: fc.record({ from: fc.constant("any" as const), i: fc.nat() }) },
    { weight: 1, arbitrary: fc.record({ from: fc.constant("unknown" as const), i: fc.nat() }) }
  )
  const op = fc.oneof(
    {
      weight: 5,
      arbitrary: fc.record({
        kind: fc.constant("store" as const),
        member: fc.nat({ max: 3 }),
        tier: fc.nat({ max: 2 }),
        external: fc.boolean(),
        // A second external naming of the same blocks (an alias, as two engines' hashes would be).
        alias: fc.boolean(),
        // Short paths over a small alphabet, so that members share prefixes.
        local: fc.array(fc.bigInt({ min: 1n, max: 2n }), { minLength: 1, maxLength: 3 }),
        // Mostly a block the member holds (by index), so chains grow deep; else a root, or unknown.
        parent: fc.oneof(
          { weight: 4, arbitrary: fc.nat() },
          { weight: 2, arbitrary: fc.constant("root" as const) },
          { weight: 1, arbitrary: fc.constant("unknown" as const) }
        )
      })
    },
    {
      weight: 3,
      arbitrary: fc.record({
        kind: fc.constant("storeByLineage" as const),
        member: fc.nat({ max: 3 }),
        tier: fc.nat({ max: 2 }),
        external: fc.boolean(),
        alias: fc.boolean(),
        // Blocks this member holds on some tier, blocks any member holds (maybe unknown to this
        // one), or a hash nobody stored.
        picks: fc.array(pick, { minLength: 1, maxLength: 4 })
      })
    },
    {
      weight: 3,
      arbitrary: fc.record({
        kind: fc.constant("remove" as const),
        member: fc.nat({ max: 3 }),
        tier: fc.nat({ max: 2 }),
        external: fc.boolean(),
        alias: fc.boolean(),
        picks: fc.array(pick, { minLength: 1, maxLength: 3 })
      })
    },
    fc.record({ kind: fc.constant("clear" as const), member: fc.nat({ max: 3 }) }),
    fc.record({ kind: fc.constant("replace" as const), member: fc.nat({ max: 3 }) }),
    {
      weight: 3,
      arbitrary: fc.record({
        kind: fc.constant("query" as const),
        // A path some member holds (picked by index), extended by a few random blocks; or random.
        from: fc.oneof({ weight: 5, arbitrary: fc.nat() }, { weight: 1, arbitrary: fc.constant(-1) }),
        extra: fc.array(fc.bigInt({ min: 1n, max: 2n }), { maxLength: 3 }),
        filtered: fc.boolean()
      })
    }
  )

  it("agrees with a plain model: stores with and without tokens, removals by tier, clears, replacements, late joins", () => {
    fc.assert(
      fc.property(fc.array(op, { minLength: 20, maxLength: 70 }), (ops) => {
        const state = new CanonicalCkfState(ckfConfig(4096))
        const model = new PoolModel()
        /** The local path of every canonical hash seen, to build queries and find blocks. */
        const pathOf = new Map<bigint, Array<bigint>>()
        /** Each member's events since its last clear: the replay a replacement gets. */
        const logs = MEMBERS.map(() => [] as Array<CkfEvent>)
        /** Blocks held now on some tier, by member `m` or by anyone. */
        const heldNow = (m?: number): Array<bigint> => {
          const held = new Set<bigint>()
          model.members.forEach((member, i) => {
            if (m === undefined || m === i)
              for (const tier of member.held) for (const c of tier.keys()) held.add(c)
          })
          return [...held]
        }
        const picked = (
          m: number,
          alias: boolean,
          p: { from: "own" | "any" | "unknown"; i: number }
        ): bigint => {
          const pool = p.from === "unknown" ? [] : heldNow(p.from === "own" ? m : undefined)
          return pool.length === 0
            ? UNKNOWN + BigInt(m)
            : externalOf(alias ? m + 10 : m, pool[p.i % pool.length]!)
        }

        const apply = (m: number, event: CkfEvent) => {
          logs[m]!.push(event)
          return state.applyEvent(event)
        }

        for (const o of ops) {
          if (o.kind === "store") {
            const member = model.members[o.member]!
            const known = [...new Set(member.lineage.flatMap((l) => [...l.values()]))]
            let parentCanon: bigint | undefined
            let parentExt: bigint | undefined
            if (o.parent === "unknown" || (o.parent !== "root" && known.length === 0)) parentExt = UNKNOWN
            else if (o.parent !== "root") {
              const pc = known[o.parent % known.length]!
              parentCanon = pc
              parentExt = [externalOf(o.member, pc), externalOf(o.member + 10, pc)].find(
                (e) => member.resolve(e) !== undefined
              )
            }
            const canon = chain(parentCanon, o.local)
            const prefix = parentCanon === undefined ? [] : (pathOf.get(parentCanon) ?? [])
            canon.forEach((c, i) => {
              pathOf.set(c, [...prefix, ...o.local.slice(0, i + 1)])
            })
            const external = canon.map((c) => externalOf(o.alias ? o.member + 10 : o.member, c))
            const skipped = model.storeChained(o.member, o.tier, external, canon, parentExt)
            const outcome = apply(
              o.member,
              storedEvent(o.member, tierOf(o.tier, o.external), external, o.local, parentExt)
            )
            expect(outcome.firstError).toBeUndefined()
            expect(outcome.unanchoredBlocks).toBe(skipped)
          } else if (o.kind === "storeByLineage") {
            const external = o.picks.map((p) => picked(o.member, o.alias, p))
            const skipped = model.storeByLineage(o.member, o.tier, external)
            const outcome = apply(
              o.member,
              storedEvent(o.member, tierOf(o.tier, o.external), external, undefined, undefined)
            )
            expect(outcome.firstError).toBeUndefined()
            expect(outcome.unanchoredBlocks).toBe(skipped)
          } else if (o.kind === "remove") {
            const external = o.picks.map((p) => picked(o.member, o.alias, p))
            model.remove(o.member, o.tier, external)
            apply(o.member, removedEvent(o.member, tierOf(o.tier, o.external), external))
          } else if (o.kind === "clear") {
            model.clear(o.member)
            state.applyEvent(clearedEvent(o.member))
            logs[o.member]!.length = 0
          } else if (o.kind === "replace") {
            // The member replaced from a replay of everything it was sent since its last clear: the
            // same blocks are skipped again, and its history is partial exactly when some are.
            const replay = new PoolModel()
            for (const event of logs[o.member]!) {
              const data = event.data
              const t = tierIndex(event.storageTier)
              if (data._tag === "Removed") {
                for (const e of hashPairsToBigInts(data.blockHashes)) replay.members[o.member]!.remove(t, e)
              } else if (data._tag === "Stored" && data.resolveThroughLineage === true) {
                replay.storeByLineage(o.member, t, hashPairsToBigInts(data.blockHashes))
              } else if (data._tag === "Stored") {
                const external = hashPairsToBigInts(data.blockHashes)
                const parent =
                  data.parentHash === undefined ? undefined : hashPairsToBigInts(data.parentHash)[0]
                const parentCanon =
                  parent === undefined ? undefined : replay.members[o.member]!.resolve(parent)
                const canon = chain(parentCanon, hashPairsToBigInts(data.tokensHashes!))
                replay.storeChained(o.member, t, external, canon, parent)
              }
            }
            model.members[o.member] = replay.members[o.member]!
            model.partial.delete(o.member)
            if (replay.partial.has(o.member)) model.partial.add(o.member)
            model.unanchored += replay.unanchored
            const result = state.replaceRanksFromEvents([
              { ...MEMBERS[o.member]!, events: [...logs[o.member]!] }
            ])
            expect(result).not.toBeInstanceOf(Error)
          } else {
            const all = heldNow()
            const base = o.from < 0 || all.length === 0 ? [] : pathOf.get(all[o.from % all.length]!)!
            const canon = chain(undefined, [...base, ...o.extra])
            const members = o.filtered ? [3, 0, 9] : model.listed()
            const refs = members.map((m) => MEMBERS[m] ?? { workerId: "99", dpRank: 0 })
            const result = state.queryWorkers(
              hashPairs(canon),
              canon.length,
              o.filtered ? { members: refs } : {}
            )
            const expected = model.query(canon, members)
            expect(result.members).toEqual(refs)
            expect(result.queryBlocks).toBe(canon.length)
            expect(rowsOf(result)).toEqual(expected.rows)
            expect(Array.from(result.frequencies)).toEqual(expected.frequencies)
            for (const row of rowsOf(result)) {
              expect(row.device).toBeLessThanOrEqual(row.host)
              expect(row.host).toBeLessThanOrEqual(row.disk)
            }
            // /v1/query lists the members by device, host, disk depth descending, then worker id, rank.
            const ranked = expected.rows
              .map((row, i) => ({ ...refs[i]!, device: row.device, host: row.host, disk: row.disk }))
              .sort(
                (a, b) =>
                  b.device - a.device ||
                  b.host - a.host ||
                  b.disk - a.disk ||
                  Number(BigInt(a.workerId) - BigInt(b.workerId)) ||
                  a.dpRank - b.dpRank
              )
            expect(poolWorkersAnswer(result).workers).toEqual(ranked)
            if (!o.filtered) {
              const dynamo = dynamoScoreResponse(result, 16)
              const reference = dynamoFromModel(model, canon, 16)
              expect(dynamo.scores).toEqual(reference.scores)
              expect(dynamo.instances).toEqual(reference.instances)
              expect(dynamo.frequencies).toEqual(expected.frequencies)
            }
          }

          // After every step: block counts per tier, device ownership, the partial members.
          expect(state.memberTierCounts()).toEqual(
            model.listed().map((m) => ({
              ...MEMBERS[m]!,
              blocks: model.members[m]!.held[0]!.size,
              hostBlocks: model.members[m]!.held[1]!.size,
              diskBlocks: model.members[m]!.held[2]!.size
            }))
          )
          MEMBERS.forEach((ref, m) => {
            for (const c of model.members[m]!.held[0]!.keys())
              expect(state.owns(ref.workerId, ref.dpRank, c)).toBe(true)
            const host = hashPairsToBigInts(state.memberTierHashes(ref.workerId, ref.dpRank, "host_pinned"))
            expect(new Set(host)).toEqual(new Set(model.members[m]!.held[1]!.keys()))
            const disk = hashPairsToBigInts(state.memberTierHashes(ref.workerId, ref.dpRank, "disk"))
            expect(new Set(disk)).toEqual(new Set(model.members[m]!.held[2]!.keys()))
          })
          expect(state.partialMembers().map(keyOf)).toEqual(
            MEMBERS.filter((_, m) => model.partial.has(m)).map(keyOf)
          )
        }
        const stats = state.stats().aggregation
        expect(stats.unanchoredBlocks).toBe(model.unanchored)
        expect(stats.unanchoredRemovals).toBe(model.unanchoredRemovals)
        expect(stats.unknownRemovals).toBe(model.unknownRemovals)
        const tiers = state.tierStats()
        expect(tiers.hostEdges).toBe(model.members.reduce((s, member) => s + member.held[1]!.size, 0))
        expect(tiers.diskEdges).toBe(model.members.reduce((s, member) => s + member.held[2]!.size, 0))
      }),
      { numRuns: 300 }
    )
  })

  it("maps media as Dynamo's StorageTier::from_kv_medium does; other media are skipped", () => {
    for (const medium of [undefined, null, "", "GPU", "DEVICE"])
      expect(storageTierOfMedium(medium)).toBe("device")
    for (const medium of ["CPU", "CPU_PINNED", "CPU_TIER1"])
      expect(storageTierOfMedium(medium)).toBe("host_pinned")
    for (const medium of ["CPU_TIER2", "DISK", "NVME", "STORAGE"])
      expect(storageTierOfMedium(medium)).toBe("disk")
    for (const medium of ["EXTERNAL", "NETWORK", "REMOTE", "SHARED"])
      expect(storageTierOfMedium(medium)).toBe("external")
    for (const medium of ["gpu", "cpu", "TAPE", "LOCAL"]) expect(storageTierOfMedium(medium)).toBeUndefined()
  })

  it("vLLM's offloading: a tokens-less CPU copy resolves through the device lineage and outlives the device copy", () => {
    const state = new CanonicalCkfState(ckfConfig(4096))
    const local = [11n, 12n, 13n]
    const canon = chain(undefined, local)
    const external = [101n, 102n, 103n]
    state.applyEvent(storedEvent(0, "device", external, local, undefined))
    // The CPU copies name their blocks by external hash only (`token_ids: []`, no parent).
    expect(
      state.applyEvent(storedEvent(0, "host_pinned", external.slice(0, 2), undefined, undefined))
        .unanchoredBlocks
    ).toBe(0)
    // The GPU evicts everything: the lineage keeps the external hashes the host still holds.
    state.applyEvent(removedEvent(0, "device", external))
    expect(state.memberBlockCount("7", 0)).toBe(0)
    expect(state.memberTierCounts()).toEqual([
      { workerId: "7", dpRank: 0, blocks: 0, hostBlocks: 2, diskBlocks: 0 }
    ])
    let result = state.queryWorkers(hashPairs(canon))
    expect(poolWorkersAnswer(result).workers).toEqual([
      { workerId: "7", dpRank: 0, device: 0, host: 2, disk: 2 }
    ])
    // The request comes back: the GPU reloads block 0 and computes block 1's child again from its parent,
    // which only the host still holds.
    state.applyEvent(storedEvent(0, "device", [101n], [11n], undefined))
    expect(state.applyEvent(storedEvent(0, "device", [103n], [13n], 102n)).firstError).toBeUndefined()
    result = state.queryWorkers(hashPairs(canon))
    expect(poolWorkersAnswer(result).workers).toEqual([
      { workerId: "7", dpRank: 0, device: 1, host: 3, disk: 3 }
    ])
    expect(Array.from(result.dynamoCpu)).toEqual([2])
    // A removal with a medium removes that tier's copy only; Cleared clears every tier.
    state.applyEvent(removedEvent(0, "host_pinned", [101n]))
    expect(state.memberTierCounts()[0]).toEqual({
      workerId: "7",
      dpRank: 0,
      blocks: 2,
      hostBlocks: 1,
      diskBlocks: 0
    })
    state.applyEvent(clearedEvent(0))
    expect(state.memberTierCounts()).toEqual([])
    expect(state.tierStats()).toMatchObject({ hostEdges: 0, diskEdges: 0, lineageEntries: 0 })
  })

  it("two external hashes of one member on one tier naming one block (aliases) hold it until the last goes", () => {
    const state = new CanonicalCkfState(ckfConfig(4096))
    const [c0] = chain(undefined, [21n])
    // Two engines' names of one block (as two cache salts would give before salts were folded in).
    state.applyEvent(storedEvent(2, "disk", [71n], [21n], undefined))
    state.applyEvent(storedEvent(2, "disk", [72n], [21n], undefined))
    expect(state.memberTierCounts()).toEqual([
      { workerId: "12", dpRank: 0, blocks: 0, hostBlocks: 0, diskBlocks: 1 }
    ])
    state.applyEvent(removedEvent(2, "disk", [71n]))
    expect(hashPairsToBigInts(state.memberTierHashes("12", 0, "disk"))).toEqual([c0])
    state.applyEvent(removedEvent(2, "external", [72n]))
    expect(state.memberTierCounts()).toEqual([])
    expect(state.tierStats()).toMatchObject({ diskEdges: 0, lineageEntries: 0 })
  })

  it("an external hash the rank maps to another block, on any tier, rejects the whole tier store", () => {
    const state = new CanonicalCkfState(ckfConfig(4096))
    state.applyEvent(storedEvent(0, "device", [5n], [31n], undefined))
    // The host names other tokens with the device's external hash 5: InvalidBlockSequence, nothing kept.
    const outcome = state.applyEvent(storedEvent(0, "host_pinned", [6n, 5n], [32n, 33n], undefined))
    expect(outcome.firstError).toBe("InvalidBlockSequence")
    expect(state.memberTierCounts()).toEqual([
      { workerId: "7", dpRank: 0, blocks: 1, hostBlocks: 0, diskBlocks: 0 }
    ])
    // Within one tier as well, and a dynamo source's unknown parent is ParentBlockNotFound.
    state.applyEvent(storedEvent(0, "disk", [8n], [34n], undefined))
    expect(state.applyEvent(storedEvent(0, "disk", [8n], [35n], undefined)).firstError).toBe(
      "InvalidBlockSequence"
    )
    const orphan: CkfEvent = {
      ...MEMBERS[0]!,
      storageTier: "disk",
      data: {
        _tag: "Stored",
        blockHashes: hashPairs([9n]),
        tokensHashes: hashPairs([36n]),
        parentHash: hashPairs([77n])
      }
    }
    expect(state.applyEvent(orphan).firstError).toBe("ParentBlockNotFound")
    expect(state.lineageStats()).toMatchObject({ parentNotFound: 1, invalidSequences: 2 })
    expect(state.memberTierCounts()[0]).toMatchObject({ hostBlocks: 0, diskBlocks: 1 })
  })

  it("a rank reset and a removed worker clear every tier, ranks holding only lower-tier blocks included", () => {
    const state = new CanonicalCkfState(ckfConfig(4096))
    state.applyEvent(storedEvent(0, "device", [1n], [41n], undefined))
    state.applyEvent(storedEvent(0, "host_pinned", [2n], [42n], undefined))
    state.applyEvent(storedEvent(1, "disk", [3n], [43n], undefined))
    state.applyEvent(storedEvent(2, "host_pinned", [4n], [44n], undefined))
    expect(state.removeWorker("7")).not.toBeInstanceOf(Error)
    expect(state.memberTierCounts().map(keyOf)).toEqual(["12/0"])
    expect(state.removeRank("12", 0)).not.toBeInstanceOf(Error)
    expect(state.memberTierCounts()).toEqual([])
    expect(state.tierStats()).toMatchObject({ hostEdges: 0, diskEdges: 0, lineageEntries: 0 })
  })

  it("a tokens-less copy of a block no tier holds is unanchored and makes the history partial", () => {
    const state = new CanonicalCkfState(ckfConfig(4096))
    const outcome = state.applyEvent(storedEvent(1, "disk", [5n, 6n], undefined, undefined))
    expect(outcome.firstError).toBeUndefined()
    expect(outcome.unanchoredBlocks).toBe(2)
    expect(state.partialMembers()).toEqual([MEMBERS[1]])
    expect(state.memberTierCounts()).toEqual([])
  })

  it("leaves the filter and its publication to the device tier", () => {
    const state = new CanonicalCkfState(ckfConfig(4096, { publishEveryNEvents: 1 }))
    const outcome = state.applyEvent(storedEvent(0, "host_pinned", [1n, 2n], [1n, 2n], undefined))
    expect(outcome.publication).toBeUndefined()
    expect(outcome.publicationBoundary).toBe(false)
    expect(state.hasPendingPublication()).toBe(false)
    const [c0] = chain(undefined, [1n])
    expect(state.contains(c0!)).toBe(false)
    expect(state.stats().aggregation.uniqueBlockCount).toBe(0)
  })
})
