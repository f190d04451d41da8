/**
 * The package's version, read from its package.json: the source and the compiled file sit at
 * different depths below it (src/ and dist/src/), so look upwards for it.
 */

import { existsSync, readFileSync } from "node:fs"
import { dirname, join } from "node:path"
import { fileURLToPath } from "node:url"

const findVersion = (): string => {
  let dir = dirname(fileURLToPath(import.meta.url))
  for (;;) {
    const candidate = join(dir, "package.json")
    if (existsSync(candidate)) {
      const manifest = JSON.parse(readFileSync(candidate, "utf8")) as { name?: unknown; version?: unknown }
      if (manifest.name === "kvrelay" && typeof manifest.version === "string") return manifest.version
    }
    const parent = dirname(dir)
    if (parent === dir) return "unknown"
    dir = parent
  }
}

/** `kvrelay --version`, and the version label of build-info style outputs. */
export const VERSION: string = findVersion()
