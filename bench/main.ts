/**
 * `kvrelay bench` / `npm run bench`: every suite, printed as ratios against baselines measured in
 * the same run, and written to bench/results.json (`--json` also prints the JSON to stdout).
 */

import { spawn } from "node:child_process"
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
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
import { benchEndToEnd, benchEndToEndEngineMetrics } from "./e2e.js"
import { benchEnginePoll } from "./enginePoll.js"
import { benchGlobal } from "./global.js"
import type { BenchContext, BenchEntry } from "./harness.js"
import { benchHubFanout } from "./hub.js"
import { benchMembershipChurn } from "./membership.js"
import { benchOverlapHttp, benchRouteHttp } from "./overlapHttp.js"
import { benchRecoveryPermits } from "./permits.js"
import { benchEngineMetricsParse, benchRouteCost } from "./routeCost.js"
import { benchSoakMemory } from "./soak.js"
import { benchWorkerIngest } from "./workerIngest.js"
import { benchWorkerQuery } from "./workerQuery.js"
import { benchWorkerQueryHttp } from "./workerQueryHttp.js"
import { benchZmqIngest } from "./zmq.js"

export interface BenchOptions {
  readonly quick: boolean
  readonly json: boolean
  readonly only?: ReadonlyArray<string>
  readonly output?: string
  /** Minutes of the `soak_memory` run (default 10). */
  readonly soakMinutes?: number
}

/** A suite's name and body; `named` suites run only when `--only` names them (long soaks). */
type Suite = readonly [string, (ctx: BenchContext) => void | Promise<void>, "named"?]

const suites: ReadonlyArray<Suite> = [
  ["producer_apply", benchProducerApply],
  ["producer_apply_canonical", benchProducerApplyCanonical],
  ["token_hashing", benchTokenHashing],
  ["memory_canonical", benchMemoryPerEdgeCanonical],
  ["worker_query_1024", benchWorkerQuery],
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
  ["recovery_permits", benchRecoveryPermits],
  ["global", benchGlobal],
  ["overlap_http", benchOverlapHttp],
  ["worker_query_http", benchWorkerQueryHttp],
  ["route_http", benchRouteHttp],
  ["route_cost", benchRouteCost],
  ["engine_metrics_parse", benchEngineMetricsParse],
  ["engine_metrics_poll", benchEnginePoll],
  ["e2e", benchEndToEnd],
  ["e2e_engine_metrics", benchEndToEndEngineMetrics],
  ["soak_memory", benchSoakMemory, "named"]
]

/** The suite names `--only` takes, in run order (`soak_memory` runs only when named). */
export const suiteNames: ReadonlyArray<string> = suites.map(([name]) => name)

/** The names of `only` that are no suite (each must be one of `suiteNames` exactly). */
export const unknownSuites = (only: ReadonlyArray<string>): ReadonlyArray<string> =>
  only.filter((name) => !suiteNames.includes(name))

/** Repository root: bench/ compiles to dist/bench/, so the root is two levels up from there. */
const repoRoot = (): string => {
  const here = dirname(fileURLToPath(import.meta.url))
  return here.endsWith(join("dist", "bench")) ? join(here, "..", "..") : join(here, "..")
}

/*
 * Each suite runs in a child process of its own: the same program and arguments, told by these
 * variables which suite to run and where the results so far are (a suite may read an earlier
 * one's figure: e2e compares with pool_actor's). In one process, a suite inherited the heap the
 * earlier ones left and paid its collections: in a whole `--full` run, overlap_http's rounds
 * spent 237–254 ms in GC against 53–107 ms when it ran alone.
 */
const CHILD_SUITE = "KVRELAY_BENCH_CHILD_SUITE"
const CHILD_RESULTS = "KVRELAY_BENCH_CHILD_RESULTS"
/** `1` runs every suite in this one process instead (to profile or debug a whole run). */
const IN_PROCESS = "KVRELAY_BENCH_IN_PROCESS"

const suiteNamed = (name: string): Suite => {
  const suite = suites.find(([n]) => n === name)
  if (suite === undefined) throw new Error(`${CHILD_SUITE}: no bench suite ${JSON.stringify(name)}`)
  return suite
}

/** Runs `name` in a child process, which reads and rewrites `resultsFile`; resolves with its results. */
const runInChild = (name: string, resultsFile: string): Promise<Array<BenchEntry>> =>
  new Promise((resolve, reject) => {
    const child = spawn(process.execPath, [...process.execArgv, ...process.argv.slice(1)], {
      env: { ...process.env, [CHILD_SUITE]: name, [CHILD_RESULTS]: resultsFile },
      stdio: "inherit"
    })
    child.once("error", reject)
    child.once("exit", (code, signal) => {
      if (code === 0) resolve(JSON.parse(readFileSync(resultsFile, "utf8")) as Array<BenchEntry>)
      else reject(new Error(`bench suite ${name} failed in its process (${signal ?? `exit code ${code}`})`))
    })
  })

/** The child's side of `runInChild`: one suite, its figures appended to the file's. */
const runChild = async (name: string, resultsFile: string, ctx: Omit<BenchContext, "results">) => {
  const results = JSON.parse(readFileSync(resultsFile, "utf8")) as Array<BenchEntry>
  await suiteNamed(name)[1]({ ...ctx, results })
  writeFileSync(resultsFile, JSON.stringify(results))
  return results
}

export const runBenchmarks = async (options: BenchOptions): Promise<ReadonlyArray<BenchEntry>> => {
  const only = options.only ?? []
  const unknown = unknownSuites(only)
  // Callers check first (the CLI exits 2 naming them); running nothing and succeeding would hide a typo.
  if (unknown.length > 0)
    throw new Error(`unknown bench suites ${unknown.join(", ")}; suites: ${suiteNames.join(", ")}`)
  const log = (line: string) => (options.json ? process.stderr : process.stdout).write(`${line}\n`)
  const childSuite = process.env[CHILD_SUITE]
  const childResults = process.env[CHILD_RESULTS]
  if (childSuite !== undefined && childResults !== undefined)
    return runChild(childSuite, childResults, { quick: options.quick, soakMinutes: options.soakMinutes, log })
  const results: Array<BenchEntry> = []
  const ctx: BenchContext = { quick: options.quick, soakMinutes: options.soakMinutes, results, log }
  const inProcess = process.env[IN_PROCESS] === "1"
  log(
    `kvrelay bench${options.quick ? " --quick" : ""} (node ${process.version}, ${new Date().toISOString()}` +
      `${inProcess ? ", every suite in this process" : ", a process per suite"})`
  )
  const scratch = inProcess ? undefined : mkdtempSync(join(tmpdir(), "kvrelay-bench-"))
  try {
    for (const [name, run, named] of suites) {
      if (only.length > 0 ? !only.includes(name) : named === "named") continue
      if (scratch === undefined) {
        await run(ctx)
        continue
      }
      const file = join(scratch, "results.json")
      writeFileSync(file, JSON.stringify(results))
      results.splice(0, results.length, ...(await runInChild(name, file)))
    }
  } finally {
    if (scratch !== undefined) rmSync(scratch, { recursive: true, force: true })
  }
  const output = options.output ?? join(repoRoot(), "bench", "results.json")
  mkdirSync(dirname(output), { recursive: true })
  writeFileSync(output, `${JSON.stringify(results, null, 2)}\n`)
  if (options.json) process.stdout.write(`${JSON.stringify(results, null, 2)}\n`)
  else log(`results written to ${output}`)
  return results
}
