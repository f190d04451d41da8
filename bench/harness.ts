/**
 * Benchmark harness: every figure is measured next to its baseline in the same run and reported
 * as a ratio, because absolute numbers on shared machines are noise.
 */

import { readFileSync } from "node:fs"
import { performance } from "node:perf_hooks"

export interface BenchEntry {
  readonly name: string
  readonly unit: string
  readonly value: number
  readonly baseline: number | null
  readonly ratio: number | null
}

export interface BenchContext {
  readonly quick: boolean
  readonly results: Array<BenchEntry>
  /** Minutes of the `soak_memory` run (`--soak-minutes`; 10 when absent). */
  readonly soakMinutes?: number
  log(line: string): void
}

/**
 * Run `round` (which returns the number of operations it performed) repeatedly for at least
 * `minMs`, after one warm-up round, and return operations per second of the best round. The best
 * round is the least disturbed by other load on the machine.
 */
export const throughput = (round: () => number, minMs: number, rounds = 5): number => {
  round()
  let best = 0
  const deadline = performance.now() + minMs
  for (let r = 0; r < rounds || performance.now() < deadline; r++) {
    const start = performance.now()
    const ops = round()
    const elapsed = performance.now() - start
    if (elapsed > 0) best = Math.max(best, (ops * 1000) / elapsed)
    if (r > 50) break
  }
  return best
}

/** Time one call in milliseconds (best of `rounds`). */
export const timeOnce = (fn: () => void, rounds = 3): number => {
  let best = Number.POSITIVE_INFINITY
  for (let r = 0; r < rounds; r++) {
    const start = performance.now()
    fn()
    best = Math.min(best, performance.now() - start)
  }
  return best
}

export const gc = (): void => {
  const collect = (globalThis as { gc?: () => void }).gc
  if (collect !== undefined) {
    collect()
    collect()
  }
}

/** Heap plus array-buffer bytes in use, after a full collection when `--expose-gc` is on. */
export const memoryInUse = (): number => {
  gc()
  const usage = process.memoryUsage()
  return usage.heapUsed + usage.arrayBuffers
}

/** A workload of `bestRates`: setup (untimed), then a run that returns the operations it did. */
export type RateRun<S> = readonly [setup: () => S, run: (s: S) => number]

/** Ops/s of one fresh run; setup is outside the timed region. */
const rateOf = <S>(setup: () => S, run: (s: S) => number): number => {
  const s = setup()
  const start = performance.now()
  const ops = run(s)
  return (ops * 1000) / (performance.now() - start)
}

/**
 * Best ops/s of `a` and of `b` over `rounds` fresh runs each, alternating which goes first. Run
 * one after the other, the two sampled different spells of a shared machine, and their ratio
 * moved with the machine as much as with the code. No collection is forced between runs: after
 * the Map/Set baselines, a forced full GC left its sweeping to V8's background threads, and the
 * run timed next lost more than half its rate to them on two cores.
 */
export const bestRates = <A, B>(rounds: number, a: RateRun<A>, b: RateRun<B>): [number, number] => {
  let bestA = 0
  let bestB = 0
  for (let r = 0; r < rounds; r++) {
    if (r % 2 === 0) {
      bestA = Math.max(bestA, rateOf(...a))
      bestB = Math.max(bestB, rateOf(...b))
    } else {
      bestB = Math.max(bestB, rateOf(...b))
      bestA = Math.max(bestA, rateOf(...a))
    }
  }
  return [bestA, bestB]
}

/** Best ops/s over `rounds` fresh runs; setup is outside the timed region. */
export const bestRate = <S>(rounds: number, setup: () => S, run: (s: S) => number): number => {
  let best = 0
  for (let r = 0; r < rounds; r++) best = Math.max(best, rateOf(setup, run))
  return best
}

export const record = (
  ctx: BenchContext,
  name: string,
  unit: string,
  value: number,
  baseline: number | null,
  note?: string,
  invert = false
): BenchEntry => {
  const ratio = baseline === null || baseline === 0 ? null : invert ? baseline / value : value / baseline
  // The JSON entries carry exactly {name, unit, value, baseline, ratio}; the note is for the console.
  const entry: BenchEntry = { name, unit, value, baseline, ratio }
  ctx.results.push(entry)
  const fmt = (v: number) => (Math.abs(v) >= 1000 ? Math.round(v).toLocaleString("en-US") : v.toPrecision(4))
  ctx.log(
    `${name.padEnd(34)} ${fmt(value).padStart(14)} ${unit.padEnd(12)}` +
      (baseline === null
        ? ""
        : ` baseline ${fmt(baseline).padStart(14)}  ratio ${ratio === null ? "-" : `${ratio.toFixed(2)}x`}`) +
      (note === undefined ? "" : `  (${note})`)
  )
  return entry
}

/** Deterministic 64-bit-ish hash stream for workloads (xorshift over two u32 halves). */
export class HashStream {
  private a: number
  private b: number
  constructor(seed: number) {
    this.a = seed | 1
    this.b = (seed * 0x9e3779b1) | 1
  }
  /** Next hash as (hi, lo) written into `out` at `offset`. */
  next(out: Uint32Array, offset: number): void {
    let a = this.a
    let b = this.b
    a ^= a << 13
    a ^= a >>> 17
    a ^= a << 5
    b ^= b << 7
    b ^= b >>> 9
    b ^= b << 8
    this.a = a
    this.b = b
    out[offset] = a >>> 0
    out[offset + 1] = b >>> 0
  }
}

export const percentile = (sorted: ArrayLike<number>, p: number): number =>
  sorted.length === 0 ? 0 : sorted[Math.min(sorted.length - 1, Math.floor((p / 100) * sorted.length))]!

/**
 * CPU seconds of the calling thread (Linux `/proc/thread-self/stat`, 10 ms ticks; NaN elsewhere):
 * what one thread's work costs, apart from the zmq I/O threads and the process's other threads.
 */
export const threadCpuSeconds = (): number => {
  try {
    const stat = readFileSync("/proc/thread-self/stat", "utf8")
    const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ")
    // Fields 14 and 15 of stat(5) (utime, stime) are at 11 and 12 after the command name.
    return (Number(fields[11]) + Number(fields[12])) / 100
  } catch {
    return Number.NaN
  }
}
