/**
 * A heap probe for the `soak_memory` bench, preloaded into the processes it measures with
 * `node --expose-gc --import <this file>`; no `kvrelay` command loads it on its own. With
 * `KVRELAY_HEAP_PROBE_FILE` set, each SIGUSR2 runs two full collections and appends one JSON
 * line to that file: the process id, a sequence number and `process.memoryUsage()` after them.
 * Without the variable it does nothing, so the signal keeps its default meaning.
 */

import { appendFileSync } from "node:fs"

const file = process.env["KVRELAY_HEAP_PROBE_FILE"]
if (file !== undefined && file !== "") {
  let probes = 0
  process.on("SIGUSR2", () => {
    const collect = (globalThis as { gc?: () => void }).gc
    collect?.()
    collect?.()
    const usage = process.memoryUsage()
    probes++
    appendFileSync(
      file,
      `${JSON.stringify({
        pid: process.pid,
        probe: probes,
        collected: collect !== undefined,
        heapUsed: usage.heapUsed,
        heapTotal: usage.heapTotal,
        arrayBuffers: usage.arrayBuffers,
        external: usage.external,
        rss: usage.rss
      })}\n`
    )
  })
}
