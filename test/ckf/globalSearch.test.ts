import fc from "fast-check"
import { afterEach, beforeEach, describe, expect, it } from "vitest"
import { DEFAULT_SEED, prepare } from "../../src/ckf/addressing.js"
import { GlobalCkfIndexer, GlobalCkfManifest } from "../../src/ckf/global.js"
import {
  CacheSemanticsId,
  DcCkfFormatIdentity,
  DcId,
  IndexerDomainId,
  LaneLease,
  PoolId,
  ProducerIdentity,
  RoutingScopeId
} from "../../src/ckf/identity.js"
import { disableProbeWasm, PROBE_MAX_POSITIONS } from "../../src/ckf/probeWasm.js"
import { newPrefixSearchStats } from "../../src/ckf/search.js"
import { hashPairs } from "../../src/ckf/u64.js"
import { mulberry, referenceLaneDepth } from "./referenceSearch.js"

// The indexer's query paths (the wasm search: addressing, SIMD probe and lock-step lanes in
// ckfProbe.wat; the TypeScript search: lazy per-position hashing, per-lane tests) checked against
// references that share none of them: addressing through the bigint `prepare`, a slot-by-slot
// compare on each lane's own words, and per lane either the linear scan (the first miss) or the
// §8.2 search written plainly. Every test runs on both paths.

const LANES = 16
const DOMAIN = new IndexerDomainId(
  new CacheSemanticsId(new Uint8Array(16).fill(3), "explicit"),
  new RoutingScopeId(new Uint8Array(16).fill(4), "explicit")
)
const CONSUMER = 21n

/** Slot `s` (0..3) of bucket `b` in `[lo, hi]` word pairs: lo holds slots 0 and 1, hi 2 and 3. */
const slotOf = (words: Uint32Array, b: number, s: number): number =>
  (words[2 * b + (s >> 1)]! >>> (16 * (s & 1))) & 0xffff

const setSlot = (words: Uint32Array, b: number, s: number, fp: number): void => {
  const i = 2 * b + (s >> 1)
  const shift = 16 * (s & 1)
  words[i] = ((words[i]! & ~(0xffff << shift)) | (fp << shift)) >>> 0
}

const bucketHolds = (words: Uint32Array, b: number, fp: number): boolean => {
  for (let s = 0; s < 4; s++) if (slotOf(words, b, s) === fp) return true
  return false
}

/** Put `fp` in an empty slot of bucket a or b (either first, at random), else over a random slot. */
const insert = (words: Uint32Array, a: number, b: number, fp: number, random: () => number): void => {
  const order = random() < 0.5 ? [a, b] : [b, a]
  for (const bucket of order) {
    for (let s = 0; s < 4; s++) {
      if (slotOf(words, bucket, s) === 0) {
        setSlot(words, bucket, s, fp)
        return
      }
    }
  }
  setSlot(words, order[0]!, Math.floor(random() * 4), fp)
}

/** Claims `lane` of `indexer` and installs a copy of `words` as its snapshot: the lane is ready. */
const installLane = (
  indexer: GlobalCkfIndexer,
  lane: number,
  pool: PoolId,
  format: DcCkfFormatIdentity,
  words: Uint32Array
): void => {
  const ingestor = indexer.claimLane(lane)
  if (ingestor instanceof Error) throw ingestor
  const identity = new ProducerIdentity(pool, 1n, 1n, format)
  const lease = new LaneLease(CONSUMER, lane, 1n)
  expect(ingestor.assign(identity, lease)).toBeUndefined()
  const outcome = ingestor.installSnapshot({ identity, lease, sequence: 1n, words: words.slice() })
  expect(outcome._tag).toBe("SnapshotInstalled")
}

/** Whether `words` hold the fingerprint of query position `pos` in its bucket a or b. */
const holdsPosition =
  (words: Uint32Array, addresses: ReadonlyArray<ReturnType<typeof prepare>>) =>
  (pos: number): boolean => {
    const p = addresses[pos]!
    return bucketHolds(words, p.bucketA, p.fingerprint) || bucketHolds(words, p.bucketB, p.fingerprint)
  }

interface LaneSpec {
  /** Tracked prefix length, before clamping to the query. */
  readonly depth: number
  /** Positions of the prefix left out (capacity holes). */
  readonly holes: ReadonlyArray<number>
  /** Share of slots filled with random fingerprints first (0: an empty lane but its prefix). */
  readonly fill: number
}

const laneArb: fc.Arbitrary<LaneSpec> = fc.record({
  depth: fc.oneof(
    fc.constantFrom(0, 1, 2, 254, 255, 256, 257, 300),
    fc.nat({ max: 300 }),
    fc.nat({ max: 16 })
  ),
  holes: fc.oneof(
    { weight: 3, arbitrary: fc.constant([]) },
    fc.array(fc.nat({ max: 300 }), { maxLength: 3 })
  ),
  fill: fc.constantFrom(0, 0, 0.05, 0.3, 0.5, 0.9, 1)
})

for (const engine of ["wasm", "typescript"] as const)
  describe(`GlobalCkfIndexer.findPrefixMatches against a linear scan of each lane (${engine} search)`, () => {
    beforeEach(() => disableProbeWasm(engine === "typescript"))
    afterEach(() => disableProbeWasm(false))

    it("agrees with the first miss where a lane's hits are a prefix, and with §8.2 always", () => {
      let prefixClosed = 0
      let overReported = 0
      let deepLanes = 0
      fc.assert(
        fc.property(
          // 2 .. 2048 buckets: from every query block colliding to mostly empty lanes.
          fc.constantFrom(1, 2, 4, 7, 11),
          fc.oneof(fc.constantFrom(0, 1, 2, 255, 256, 257), fc.nat({ max: 300 })),
          fc.integer({ min: 1, max: 8 }),
          fc.array(laneArb, { minLength: LANES, maxLength: LANES }),
          // Lanes left out of the ready mask, and lanes never installed at all.
          fc.integer({ min: 0, max: 0xffff }),
          fc.integer({ min: 0, max: 0xffff }),
          fc.integer({ min: 0, max: 0x7fff_ffff }),
          (bucketLog, n, window, specs, readyBits, installedBits, seed) => {
            const random = mulberry(seed)
            const bucketCount = 1 << bucketLog
            const format = new DcCkfFormatIdentity(DEFAULT_SEED, bucketCount)
            const pools = specs.map((_, lane) => new PoolId(DOMAIN, new DcId(BigInt(500 + lane))))
            const manifest = new GlobalCkfManifest(CONSUMER, DOMAIN, format, pools)
            const indexer = new GlobalCkfIndexer(manifest, { verificationWindow: window })
            expect(indexer.usesWasmSearch).toBe(engine === "wasm")
            const query = Array.from(
              { length: n },
              () => (BigInt(Math.floor(random() * 2 ** 32)) << 32n) | BigInt(Math.floor(random() * 2 ** 32))
            )
            const addresses = query.map((h) => prepare(h, bucketCount))

            let ready = 0
            const laneWords: Array<Uint32Array> = []
            specs.forEach((spec, lane) => {
              const words = new Uint32Array(2 * bucketCount)
              laneWords.push(words)
              if ((installedBits & (1 << lane)) === 0 && lane !== 0) return
              for (let b = 0; b < bucketCount; b++) {
                for (let s = 0; s < 4; s++) {
                  if (random() < spec.fill) setSlot(words, b, s, 1 + Math.floor(random() * 65535))
                }
              }
              const depth = Math.min(spec.depth, n)
              for (let pos = 0; pos < depth; pos++) {
                if (spec.holes.includes(pos)) continue
                const p = addresses[pos]!
                insert(words, p.bucketA, p.bucketB, p.fingerprint, random)
              }
              installLane(indexer, lane, pools[lane]!, format, words)
              if (lane !== 0 && (readyBits & (1 << lane)) === 0) indexer.retireLaneReadiness(lane)
              else ready |= 1 << lane
            })

            // A second query on the same indexer, sharing some positions with the first: nothing
            // of the first query's per-position scratch may leak into it.
            const second = query.map((h) =>
              random() < 0.3 ? (BigInt(Math.floor(random() * 2 ** 32)) << 32n) | 7n : h
            )
            for (const q of [query, second, query]) {
              const qAddresses = q.map((h) => prepare(h, bucketCount))
              const stats = newPrefixSearchStats()
              const result = indexer.findPrefixMatches(hashPairs(q), stats)
              if (result === "Unavailable") throw new Error("lane 0 is always installed and ready")
              expect(result.capturedReadyLanes).toBe(ready)
              expect(result.lanes).toHaveLength(LANES)
              for (let lane = 0; lane < LANES; lane++) {
                const match = result.lanes[lane]
                if ((ready & (1 << lane)) === 0) {
                  expect(match).toBeUndefined()
                  continue
                }
                const words = laneWords[lane]!
                const holds = holdsPosition(words, qAddresses)
                const hits = qAddresses.map((_, pos) => holds(pos))
                let linear = 0
                while (linear < n && hits[linear]) linear++
                const closed = hits.every((hit, pos) => hit === pos < linear)
                const depth = match!.prefixDepth
                expect(match!.physicalLane).toBe(lane)
                expect(match!.poolId.equals(pools[lane]!)).toBe(true)
                // Exactly what the §8.2 search answers over this lane's own words ...
                expect(depth).toBe(referenceLaneDepth(n, window, (pos) => hits[pos]!))
                // ... which is never below the first miss and always a miss or n ...
                expect(depth).toBeGreaterThanOrEqual(linear)
                expect(depth === n || !hits[depth]).toBe(true)
                // ... and is the first miss whenever the lane's hits form a prefix.
                if (closed) {
                  expect(depth).toBe(linear)
                  prefixClosed++
                } else if (depth > linear) {
                  overReported++
                }
                if (depth >= 128) deepLanes++
              }
              // Every position is hashed at most once per query.
              expect(stats.probeCalls).toBeLessThanOrEqual(n)
            }
          }
        ),
        { numRuns: 400 }
      )
      // The runs covered both kinds of lanes and long prefixes.
      expect(prefixClosed).toBeGreaterThan(500)
      expect(overReported).toBeGreaterThan(0)
      expect(deepLanes).toBeGreaterThan(50)
    })

    it("rescans the fallback gap from the last binary predecessor, not from position 0", () => {
      // Lane l tracks 2^k + 1 blocks (k = 2 + l % 7) with holes at the window's left edge and at
      // position 3 (below the predecessor for k >= 3, which the rescan must not reach) or at the
      // predecessor's successor: galloping ends at 2^k, every binary step misses, and the
      // verification misses at its left edge.
      const bucketCount = 2048
      const format = new DcCkfFormatIdentity(DEFAULT_SEED, bucketCount)
      const pools = Array.from(
        { length: LANES },
        (_, lane) => new PoolId(DOMAIN, new DcId(BigInt(900 + lane)))
      )
      for (let window = 2; window <= 8; window++) {
        const random = mulberry(window)
        const indexer = new GlobalCkfIndexer(new GlobalCkfManifest(CONSUMER, DOMAIN, format, pools), {
          verificationWindow: window
        })
        const n = 300
        const query = Array.from(
          { length: n },
          () => (BigInt(Math.floor(random() * 2 ** 32)) << 32n) | BigInt(Math.floor(random() * 2 ** 32))
        )
        const addresses = query.map((h) => prepare(h, bucketCount))
        const laneWords = pools.map((pool, lane) => {
          const k = 2 + (lane % 7)
          const depth = (1 << k) + 1
          const holes = [depth - window, lane < 7 ? 3 : (1 << (k - 1)) + 1]
          const words = new Uint32Array(2 * bucketCount)
          for (let pos = 0; pos < depth; pos++) {
            if (holes.includes(pos)) continue
            insert(
              words,
              addresses[pos]!.bucketA,
              addresses[pos]!.bucketB,
              addresses[pos]!.fingerprint,
              random
            )
          }
          installLane(indexer, lane, pool, format, words)
          return words
        })
        const stats = newPrefixSearchStats()
        const result = indexer.findPrefixMatches(hashPairs(query), stats)
        if (result === "Unavailable") throw new Error("every lane is ready")
        laneWords.forEach((words, lane) => {
          const hit = holdsPosition(words, addresses)
          expect(result.lanes[lane]!.prefixDepth).toBe(referenceLaneDepth(n, window, hit))
        })
        expect(stats.activatedLanes).toBeGreaterThan(0)
      }
    })

    it("answers queries at the wasm search's length limit and one past it (the TypeScript search)", () => {
      const random = mulberry(99)
      const bucketCount = 8192
      const format = new DcCkfFormatIdentity(DEFAULT_SEED, bucketCount)
      const pools = [0, 1, 2, 3].map((lane) => new PoolId(DOMAIN, new DcId(BigInt(800 + lane))))
      const indexer = new GlobalCkfIndexer(new GlobalCkfManifest(CONSUMER, DOMAIN, format, pools))
      const n = PROBE_MAX_POSITIONS + 1
      const query = Array.from(
        { length: n },
        () => (BigInt(Math.floor(random() * 2 ** 32)) << 32n) | BigInt(Math.floor(random() * 2 ** 32))
      )
      const addresses = query.map((h) => prepare(h, bucketCount))
      // Prefixes ending just below, at and past the limit, and one with a hole deep in it.
      const depths = [PROBE_MAX_POSITIONS - 1, PROBE_MAX_POSITIONS, n, 12_000]
      const laneWords = depths.map((depth, lane) => {
        const words = new Uint32Array(2 * bucketCount)
        for (let pos = 0; pos < depth; pos++) {
          if (lane === 3 && pos === 9_000) continue
          insert(words, addresses[pos]!.bucketA, addresses[pos]!.bucketB, addresses[pos]!.fingerprint, random)
        }
        installLane(indexer, lane, pools[lane]!, format, words)
        return words
      })
      const pairs = hashPairs(query)
      for (const length of [PROBE_MAX_POSITIONS, n]) {
        const result = indexer.findPrefixMatches(pairs.subarray(0, 2 * length))
        if (result === "Unavailable") throw new Error("every lane is ready")
        laneWords.forEach((words, lane) => {
          const hit = holdsPosition(words, addresses)
          expect(result.lanes[lane]!.prefixDepth).toBe(referenceLaneDepth(length, 2, hit))
        })
      }
    })

    it("answers an empty query with depth 0 in every ready lane, and no ready lane as Unavailable", () => {
      const format = new DcCkfFormatIdentity(DEFAULT_SEED, 8)
      const pools = [0, 1].map((lane) => new PoolId(DOMAIN, new DcId(BigInt(700 + lane))))
      const indexer = new GlobalCkfIndexer(new GlobalCkfManifest(CONSUMER, DOMAIN, format, pools))
      expect(indexer.findPrefixMatches(new Uint32Array(0))).toBe("Unavailable")
      installLane(indexer, 1, pools[1]!, format, new Uint32Array(16).fill(0xffff_ffff))
      const result = indexer.findPrefixMatches(new Uint32Array(0))
      if (result === "Unavailable") throw new Error("lane 1 is ready")
      expect(result.capturedReadyLanes).toBe(0b10)
      expect(result.lanes[1]?.prefixDepth).toBe(0)
      expect(result.lanes.filter((m) => m !== undefined)).toHaveLength(1)
    })
  })
