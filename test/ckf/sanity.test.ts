import { expect, it } from "vitest"
import { bucketDelta, prepare } from "../../src/ckf/addressing.js"
import { bucketCountFor, ckfConfig } from "../../src/ckf/config.js"
import { laneRngSeed, SplitMix64, stickyWorker } from "../../src/ckf/splitmix.js"
import { DcCkfState } from "../../src/ckf/state.js"
import { hashPairs } from "../../src/ckf/u64.js"

it("sanity", () => {
  expect(laneRngSeed(0x5deece66d1b54a33n, 0)).toBe(0xc050d0a84124db84n)
  const r = new SplitMix64(0xc050d0a84124db84n)
  expect([r.nextBigInt(), r.nextBigInt(), r.nextBigInt()]).toEqual([
    0x8d0956e040739722n,
    0x116c72c2242d8178n,
    0x5ecb896fe0120182n
  ])
  expect(stickyWorker(17n, 3, 4)).toBe(2)
  expect(stickyWorker(11n, 3, 1)).toBe(0)
  expect(Array.from({ length: 16 }, (_, l) => stickyWorker(0xc0decafen, l, 4))).toEqual([
    3, 2, 1, 1, 0, 3, 3, 1, 1, 2, 2, 1, 1, 1, 2, 3
  ])
  expect(prepare(0n, 16)).toEqual({ fingerprint: 0xb49e, bucketA: 14, bucketB: 15 })
  expect(prepare(0xffffffffffffffffn, 524288)).toEqual({
    fingerprint: 0x500a,
    bucketA: 117321,
    bucketB: 453072
  })
  expect(bucketDelta(1, 16)).toBe(11)
  expect(bucketDelta(0xffff, 524288)).toBe(158862)
  for (const [e, n] of [
    [1, 2],
    [2, 2],
    [3, 2],
    [6, 2],
    [7, 4],
    [32, 16],
    [64, 32],
    [128, 64],
    [4096, 2048],
    [1048576, 524288]
  ])
    expect(bucketCountFor(e)).toBe(n)
  const s = new DcCkfState(ckfConfig(32))
  s.applyEvent({
    workerId: "1",
    dpRank: 0,
    storageTier: "device",
    data: { _tag: "Stored", blockHashes: hashPairs([1n, 2n, 3n]) }
  })
  const nz = []
  for (let b = 0; b < 16; b++) if (s.wordAt(b) !== 0n) nz.push([b, s.wordAt(b).toString(16)])
  expect(nz).toEqual([
    [4, "c24a"],
    [5, "8dc"],
    [15, "babf"]
  ])
  const t = new DcCkfState(ckfConfig(1))
  const hs = Array.from({ length: 32 }, (_, i) => BigInt(i + 1))
  const out = t.applyEvent({
    workerId: "1",
    dpRank: 0,
    storageTier: "device",
    data: { _tag: "Stored", blockHashes: hashPairs(hs) }
  })
  expect(t.stats().aggregation.uniqueBlockCount).toBe(8)
  expect(t.stats().aggregation.capacityFailures).toBe(24)
  expect(out.firstError).toBe("CapacityExhausted")
  expect(t.wordAt(0).toString(16)).toBe("62dcd73d63a2c24a")
  expect(t.wordAt(1).toString(16)).toBe("75706fc208dcbabf")
})
