/**
 * The README and docs/ point only into the repository, and every file they point to is there: a
 * newcomer following a link or copying a path finds it.
 */

import { existsSync, readdirSync, readFileSync } from "node:fs"
import { dirname, join } from "node:path"
import { describe, expect, it } from "vitest"

const root = join(import.meta.dirname, "..", "..")
const pages = ["README.md", ...readdirSync(join(root, "docs")).map((f) => join("docs", f))].filter((f) =>
  f.endsWith(".md")
)

describe("documentation links", () => {
  it("covers the pages a newcomer needs", () => {
    for (const page of [
      "docs/protocol.md",
      "docs/operations.md",
      "docs/troubleshooting.md",
      "docs/engines.md"
    ])
      expect(pages).toContain(page)
  })

  for (const page of pages) {
    it(`${page} links only to files in the repository, and they exist`, () => {
      const text = readFileSync(join(root, page), "utf8")
      expect(text, "no path outside the repository").not.toMatch(/\.\.\/shared|\/work\//)
      for (const [, target] of text.matchAll(/\]\(([^)#\s]+)(?:#[^)]*)?\)/g)) {
        expect(target!, `${page} links to ${target}`).not.toMatch(/^https?:/)
        expect(existsSync(join(root, dirname(page), target!)), `${page} → ${target}`).toBe(true)
      }
      // Paths written as code: `examples/…`, `otel/…`, `docs/…`, `src/…`, `test/…`.
      for (const [, path] of text.matchAll(/`((?:examples|otel|docs|src|test)\/[\w./-]+\.[a-z]+)`/g))
        expect(existsSync(join(root, path!)), `${page} names ${path}`).toBe(true)
    })
  }
})
