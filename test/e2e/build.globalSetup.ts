/**
 * Vitest global setup: the end-to-end tests run the compiled CLI (`bin/kvrelay.js` →
 * `dist/src/cli/main.js`), so compile once per test run when any source is newer than the last
 * build. Up to date, this is one directory walk.
 */

import { execFileSync } from "node:child_process"
import { readdirSync, statSync } from "node:fs"
import { createRequire } from "node:module"
import { join } from "node:path"
import { fileURLToPath } from "node:url"

const ROOT = fileURLToPath(new URL("../..", import.meta.url))
const BUILT = join(ROOT, "dist", "src", "cli", "main.js")

const newestMtime = (dir: string): number => {
  let newest = 0
  for (const entry of readdirSync(dir, { withFileTypes: true })) {
    const path = join(dir, entry.name)
    if (entry.isDirectory()) newest = Math.max(newest, newestMtime(path))
    else if (entry.name.endsWith(".ts")) newest = Math.max(newest, statSync(path).mtimeMs)
  }
  return newest
}

const builtAt = (): number => statSync(BUILT, { throwIfNoEntry: false })?.mtimeMs ?? 0

export default function setup(): void {
  const before = builtAt()
  const sources = Math.max(newestMtime(join(ROOT, "src")), newestMtime(join(ROOT, "bench")))
  if (before >= sources) return
  const tsc = createRequire(import.meta.url).resolve("typescript/bin/tsc")
  try {
    execFileSync(process.execPath, [tsc, "-p", "tsconfig.build.json"], { cwd: ROOT, stdio: "pipe" })
  } catch (error) {
    // tsc still emits when a file has type errors (the typecheck step reports those); only a
    // build that produced nothing is fatal here.
    if (builtAt() <= before) throw error
    process.stderr.write(`build.globalSetup: tsc reported errors, dist/ was still rebuilt\n`)
  }
}
