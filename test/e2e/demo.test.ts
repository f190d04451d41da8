/**
 * End to end: `kvrelay demo` (what `npm start` runs) as a newcomer sees it. By default no message
 * is dropped on purpose, so the relays report no gaps; `--drop-every N` makes each worker lose
 * one message every N requests, and the summary then counts those drops and says the gaps are
 * theirs.
 */

import { afterAll, describe, expect, it } from "vitest"
import { CLI_EXIT_BOUND_MS, CLI_TEST_TIMEOUT_MS, cleanup, runKvrelay } from "./relayProcessHarness.js"

afterAll(() => cleanup())

/** The DC lines (`dc-east …  gaps N …`) and the drops line of the last summary printed. */
const lastSummary = (stdout: string) => {
  const blocks = stdout.split(/^(?=kvrelay demo: \d+ DCs)/m).filter((b) => b.startsWith("kvrelay demo: "))
  const last = blocks.at(-1) ?? ""
  const dcs = [...last.matchAll(/^ {2}(dc-\w+) .* gaps (\d+) {2}recoveries (\d+)/gm)].map((m) => ({
    dc: m[1]!,
    gaps: Number(m[2]),
    recoveries: Number(m[3])
  }))
  const dropped = /^ {2}dropped on purpose: ([\d,]+) messages/m.exec(last)?.[1]
  return {
    summaries: blocks.length,
    dcs,
    dropped: dropped === undefined ? undefined : Number(dropped.replace(/,/g, ""))
  }
}

describe.concurrent("kvrelay demo", { timeout: CLI_TEST_TIMEOUT_MS }, () => {
  it("drops nothing on purpose by default: no gaps, and it says how to turn drops on", async () => {
    // Long enough for a few hundred requests per worker: the demo used to drop one message at
    // each worker's 250th request, unasked.
    const result = await runKvrelay(["demo", "--workers", "2", "--duration-s", "14"], {
      timeoutMs: CLI_EXIT_BOUND_MS
    })
    expect(result.code, result.stderr).toBe(0)
    expect(result.stdout).toContain("no message is dropped on purpose (--drop-every N")
    const summary = lastSummary(result.stdout)
    expect(summary.summaries, result.stdout).toBeGreaterThan(0)
    expect(summary.dcs.map((d) => d.dc)).toEqual(["dc-east", "dc-west"])
    for (const dc of summary.dcs) expect(dc.gaps, result.stdout).toBe(0)
    expect(summary.dropped).toBeUndefined()
    // The worker-level query (PROTOCOL §5.1 ◆3) hits: a dc-east worker holds the popular prompt.
    expect(result.stdout).toContain(`/v1/query -d '{"namespace":"demo"`)
    expect(result.stdout, result.stdout).toMatch(/^ {4}dc-east workers +\d+\/0 device \d+ host [1-9]/m)
    expect(result.stderr).not.toMatch(/message="KV event source is recovering"[^\n]*previous=live/)
  })

  it("--drop-every N drops on purpose, and the summary counts the drops and explains the gaps", async () => {
    const result = await runKvrelay(["demo", "--workers", "2", "--duration-s", "7", "--drop-every", "5"], {
      timeoutMs: CLI_EXIT_BOUND_MS
    })
    expect(result.code, result.stderr).toBe(0)
    expect(result.stdout).toContain(
      "each worker drops one message every 5 requests on purpose (--drop-every)"
    )
    const summary = lastSummary(result.stdout)
    expect(summary.dropped, result.stdout).toBeGreaterThan(0)
    expect(result.stdout).toMatch(/the gaps above are these, expected, each recovered/)
    // Every gap a relay saw is a message dropped on purpose (a worker's drop may not have been
    // followed by the message that reveals it yet).
    const gaps = summary.dcs.reduce((n, d) => n + d.gaps, 0)
    expect(gaps, result.stdout).toBeGreaterThan(0)
    expect(gaps).toBeLessThanOrEqual(summary.dropped!)
  })
})
