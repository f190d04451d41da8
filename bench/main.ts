/**
 * `kvrelay bench` / `npm run bench`: every suite, printed as ratios against baselines measured in
 * the same run, and written to bench/results.json (`--json` also prints the JSON to stdout).
 */

import { mkdirSync, writeFileSync } from "node:fs"
import { dirname, join } from "node:path"
import { fileURLToPath } from "node:url"
import { benchActor } from "./actor.js"
import { benchMemoryPerEdgeCanonical, benchProducerApplyCanonical, benchTokenHashing } from "./canonical.js"
import {
  benchCbi1,
  benchDeltaApply,
  benchMemoryPerEdge,
  benchMixedChurn,
  benchPrefixSearch,
  benchProducerApply,
  benchReplaceRanks
} from "./ckf.js"
import { benchEndToEnd } from "./e2e.js"
import { benchGlobal } from "./global.js"
import type { BenchContext, BenchEntry } from "./harness.js"
import { benchHubFanout } from "./hub.js"
import { benchMembershipChurn } from "./membership.js"
import { benchOverlapHttp } from "./overlapHttp.js"
import { benchWorkerIngest } from "./workerIngest.js"
import { benchZmqIngest } from "./zmq.js"

export interface BenchOptions {
  readonly quick: boolean
  readonly json: boolean
  readonly only?: ReadonlyArray<string>
  readonly output?: string
}

type Suite = readonly [string, (ctx: BenchContext) => void | Promise<void>]

const suites: ReadonlyArray<Suite> = [
  ["producer_apply", benchProducerApply],
  ["producer_apply_canonical", benchProducerApplyCanonical],
  ["token_hashing", benchTokenHashing],
  ["memory_canonical", benchMemoryPerEdgeCanonical],
  ["mixed_churn", benchMixedChurn],
  ["replace_ranks", benchReplaceRanks],
  ["memory", benchMemoryPerEdge],
  ["prefix_search", benchPrefixSearch],
  ["cbi1", benchCbi1],
  ["delta_apply", benchDeltaApply],
  ["pool_actor", benchActor],
  ["hub_fanout", benchHubFanout],
  ["zmq_ingest", benchZmqIngest],
  ["worker_ingest", benchWorkerIngest],
  ["membership", benchMembershipChurn],
  ["global", benchGlobal],
  ["overlap_http", benchOverlapHttp],
  ["e2e", benchEndToEnd]
]

/** The suite names `--only` takes, in run order. */
export const suiteNames: ReadonlyArray<string> = suites.map(([name]) => name)

/** The names of `only` that are no suite (each must be one of `suiteNames` exactly). */
export const unknownSuites = (only: ReadonlyArray<string>): ReadonlyArray<string> =>
  only.filter((name) => !suiteNames.includes(name))

/** Repository root: bench/ compiles to dist/bench/, so the root is two levels up from there. */
const repoRoot = (): string => {
  const here = dirname(fileURLToPath(import.meta.url))
  return here.endsWith(join("dist", "bench")) ? join(here, "..", "..") : join(here, "..")
}

export const runBenchmarks = async (options: BenchOptions): Promise<ReadonlyArray<BenchEntry>> => {
  const only = options.only ?? []
  const unknown = unknownSuites(only)
  // Callers check first (the CLI exits 2 naming them); running nothing and succeeding would hide a typo.
  if (unknown.length > 0)
    throw new Error(`unknown bench suites ${unknown.join(", ")}; suites: ${suiteNames.join(", ")}`)
  const results: Array<BenchEntry> = []
  const log = (line: string) => (options.json ? process.stderr : process.stdout).write(`${line}\n`)
  const ctx: BenchContext = { quick: options.quick, results, log }
  log(
    `kvrelay bench${options.quick ? " --quick" : ""} (node ${process.version}, ${new Date().toISOString()})`
  )
  for (const [name, run] of suites) {
    if (only.length > 0 && !only.includes(name)) continue
    await run(ctx)
  }
  const output = options.output ?? join(repoRoot(), "bench", "results.json")
  mkdirSync(dirname(output), { recursive: true })
  writeFileSync(output, `${JSON.stringify(results, null, 2)}\n`)
  if (options.json) process.stdout.write(`${JSON.stringify(results, null, 2)}\n`)
  else log(`results written to ${output}`)
  return results
}
