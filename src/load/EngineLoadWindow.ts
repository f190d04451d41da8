/**
 * A pool's engine load in one load window (PROTOCOL §5 "Engine load"): from the latest reads of
 * the pool's expected ranks at the window's time, the values `/v1/load/watch` adds to the pool's
 * entry. Pure: the caller gives the reads and the time.
 *
 * A rank is observed while its latest successful read is under 3 s old. `runningRequests` and
 * `waitingRequests` are sums and `kvUsage` the mean over the observed ranks; a value that some
 * observed rank did not report is absent, not a sum over the others (a partial sum would count
 * the unknown as zero). With no observed rank the three values are absent and
 * `loadObservedRanks` is 0.
 */

import { isObserved, type RankLoad, type RankRead } from "./EngineMetrics.js"

/** The fields a pool's load-window entry gains; an absent value is left out of the JSON. */
export interface EngineLoadAdditions {
  readonly runningRequests?: number
  readonly waitingRequests?: number
  /** Mean fraction of the observed ranks' KV caches in use, 0–1. */
  readonly kvUsage?: number
  readonly loadObservedRanks: number
}

const sumOf = (loads: ReadonlyArray<RankLoad>, field: keyof RankLoad): number | undefined => {
  let sum = 0
  for (const load of loads) {
    const value = load[field]
    if (value === undefined) return undefined
    sum += value
  }
  return sum
}

/**
 * The additions for a pool whose expected ranks' latest successful reads are `ranks` (one entry
 * per expected rank; `undefined` for a rank without `metricsUrl` or never read) at `nowMs`.
 */
export const engineLoadAdditions = (
  ranks: ReadonlyArray<RankRead | undefined>,
  nowMs: number
): EngineLoadAdditions => {
  const observed: Array<RankLoad> = []
  for (const read of ranks) if (isObserved(read, nowMs)) observed.push(read.load)
  if (observed.length === 0) return { loadObservedRanks: 0 }
  const running = sumOf(observed, "runningRequests")
  const waiting = sumOf(observed, "waitingRequests")
  const kvSum = sumOf(observed, "kvUsage")
  return {
    ...(running === undefined ? {} : { runningRequests: running }),
    ...(waiting === undefined ? {} : { waitingRequests: waiting }),
    ...(kvSum === undefined ? {} : { kvUsage: kvSum / observed.length }),
    loadObservedRanks: observed.length
  }
}
