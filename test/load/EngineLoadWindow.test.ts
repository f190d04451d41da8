/**
 * A pool's engine load in a load window (PROTOCOL §5): sums and the mean over the ranks observed
 * at the window's time (a latest successful read under 3 s old); with none, only
 * `loadObservedRanks: 0`, the three values absent (not null, not zero).
 */

import { describe, expect, it } from "@effect/vitest"
import { engineLoadAdditions } from "../../src/load/EngineLoadWindow.js"
import type { RankRead } from "../../src/load/EngineMetrics.js"

const read = (atMs: number, runningRequests: number, waitingRequests: number, kvUsage: number): RankRead => ({
  atMs,
  load: { runningRequests, waitingRequests, kvUsage }
})

describe("engineLoadAdditions", () => {
  it("sums running and waiting and averages the usage over the observed ranks", () => {
    expect(engineLoadAdditions([read(1000, 3, 1, 0.25), read(1500, 5, 4, 0.75)], 2000)).toStrictEqual({
      runningRequests: 8,
      waitingRequests: 5,
      kvUsage: 0.5,
      loadObservedRanks: 2
    })
  })

  it("counts a rank while its latest read is under 3 s old, and no longer at 3 s", () => {
    const ranks = [read(0, 3, 1, 0.2), read(1000, 1, 1, 0.6)]
    expect(engineLoadAdditions(ranks, 2999)).toStrictEqual({
      runningRequests: 4,
      waitingRequests: 2,
      kvUsage: 0.4,
      loadObservedRanks: 2
    })
    expect(engineLoadAdditions(ranks, 3000)).toStrictEqual({
      runningRequests: 1,
      waitingRequests: 1,
      kvUsage: 0.6,
      loadObservedRanks: 1
    })
  })

  it("with no observed rank: loadObservedRanks 0 and the three values absent", () => {
    for (const ranks of [[], [undefined, undefined], [read(0, 9, 9, 0.9)]]) {
      const additions = engineLoadAdditions(ranks, 5000)
      expect(additions).toStrictEqual({ loadObservedRanks: 0 })
      expect(Object.keys(additions)).toEqual(["loadObservedRanks"])
    }
  })

  it("ranks without metrics (undefined) are expected but not observed", () => {
    expect(engineLoadAdditions([undefined, read(100, 2, 0, 0.5), undefined], 200)).toStrictEqual({
      runningRequests: 2,
      waitingRequests: 0,
      kvUsage: 0.5,
      loadObservedRanks: 1
    })
  })

  it("a value some observed rank did not report is absent, not a sum over the others", () => {
    const partial: RankRead = { atMs: 100, load: { runningRequests: 4 } }
    expect(engineLoadAdditions([read(100, 3, 1, 0.5), partial], 200)).toStrictEqual({
      runningRequests: 7,
      loadObservedRanks: 2
    })
  })

  it("zero load is a value like any other", () => {
    expect(engineLoadAdditions([read(100, 0, 0, 0)], 200)).toStrictEqual({
      runningRequests: 0,
      waitingRequests: 0,
      kvUsage: 0,
      loadObservedRanks: 1
    })
  })
})
