#!/usr/bin/env node
/**
 * The import-graph check that `npm test` runs over `src/` (docs/decisions.md, "Layout").
 *
 * It fails on:
 * - a cycle between files (any import, `import type` included: a type cycle is still two modules
 *   that cannot be read one without the other);
 * - a cycle between folders, or an import from a folder to one at its own or a higher layer
 *   (`LAYERS` below, lowest first);
 * - an import of a folder's `internal/` from outside that folder;
 * - a package import (anything not relative) in `ckf/` or `client/`, whose faces promise no
 *   dependencies;
 * - a file over `MAX_LINES` lines without a `Length:` line in its opening comment saying why;
 * - an export without JSDoc (`check-exports.mjs`, which this runs).
 *
 * `node scripts/check-imports.mjs --report` prints the figures (files, lines, long files, cycles,
 * upward imports) and exits 0 whatever it finds.
 */

import { readdirSync, readFileSync, statSync } from "node:fs"
import { dirname, join, relative, resolve, sep } from "node:path"
import { fileURLToPath } from "node:url"
import { analyseExports, docProblems } from "./check-exports.mjs"

const ROOT = resolve(dirname(fileURLToPath(import.meta.url)), "..")
const SRC = join(ROOT, "src")
const MAX_LINES = 800

/**
 * Folders of `src/`, lowest layer first. A folder may import only folders of lower layers; two
 * folders of one layer import nothing of each other. A file directly in `src/` is its own unit.
 */
export const LAYERS = [
  ["ckf", "version.ts"],
  ["client", "protocol"],
  ["observability"],
  ["http", "discovery", "recovery", "load", "routing"],
  ["transport"],
  ["relay", "consumer"],
  ["relay/http", "consumer/http"],
  ["simulate"],
  ["cli"],
  ["index.ts"]
]

/** Paths outside `src/` a folder may import: the CLI's `bench` command loads the benchmarks. */
const OUTSIDE_SRC = { cli: ["../bench/"] }

/** Folders whose files may import no package at all (the public faces `kvrelay/ckf`, `kvrelay/client`). */
const NO_PACKAGES = new Set(["ckf", "client"])

const layerOf = new Map(LAYERS.flatMap((units, layer) => units.map((unit) => [unit, layer])))
const units = [...layerOf.keys()].sort((a, b) => b.length - a.length)

/** The unit of a path relative to `src/` (`relay/internal/x.ts` → `relay`), or the path's top folder. */
const unitOf = (file) => {
  for (const unit of units) if (file === unit || file.startsWith(`${unit}/`)) return unit
  const slash = file.indexOf("/")
  return slash < 0 ? file : file.slice(0, slash)
}

const walk = (dir) =>
  readdirSync(dir).flatMap((name) => {
    const path = join(dir, name)
    if (statSync(path).isDirectory()) return walk(path)
    return /\.ts$/.test(name) && !/\.d\.ts$/.test(name) ? [path] : []
  })

const toPosix = (path) => path.split(sep).join("/")

const IMPORT =
  /(?:^|[\s;])(?:import|export)\s[^'"]*?\sfrom\s*["']([^"']+)["']|(?:^|[\s;])import\s*["']([^"']+)["']|import\(\s*["']([^"']+)["']\s*\)/g

/** Every specifier a file imports (static, side-effect and dynamic), comments stripped first. */
const importsOf = (text) => {
  const code = text.replace(/\/\*[\s\S]*?\*\//g, "").replace(/(^|[^:"'`])\/\/.*$/gm, "$1")
  const found = []
  for (const match of code.matchAll(IMPORT)) found.push(match[1] ?? match[2] ?? match[3])
  return found
}

/** Strongly connected components of more than one node (Tarjan), each sorted. */
const cycles = (graph) => {
  let index = 0
  const stack = []
  const onStack = new Set()
  const indices = new Map()
  const low = new Map()
  const out = []
  const visit = (node) => {
    indices.set(node, index)
    low.set(node, index)
    index++
    stack.push(node)
    onStack.add(node)
    for (const next of graph.get(node) ?? []) {
      if (!indices.has(next)) {
        visit(next)
        low.set(node, Math.min(low.get(node), low.get(next)))
      } else if (onStack.has(next)) low.set(node, Math.min(low.get(node), indices.get(next)))
    }
    if (low.get(node) === indices.get(node)) {
      const component = []
      let member
      do {
        member = stack.pop()
        onStack.delete(member)
        component.push(member)
      } while (member !== node)
      if (component.length > 1) out.push(component.sort())
    }
  }
  for (const node of graph.keys()) if (!indices.has(node)) visit(node)
  return out
}

export const analyse = () => {
  const files = walk(SRC).map((path) => toPosix(relative(SRC, path)))
  const fileGraph = new Map()
  const unitGraph = new Map()
  const problems = []
  const upward = []
  const long = []
  let lines = 0
  for (const file of files) {
    const text = readFileSync(join(SRC, file), "utf8")
    const count = text.split("\n").length - (text.endsWith("\n") ? 1 : 0)
    lines += count
    if (count > MAX_LINES) {
      const header = /^\s*\/\*\*?[\s\S]*?\*\//.exec(text)?.[0] ?? ""
      const explained = /^\s*\*\s*Length:\s*\S/m.test(header)
      long.push({ file, count, explained })
      if (!explained)
        problems.push(
          `${file}: ${count} lines, over ${MAX_LINES}, and no "Length:" line in its header says why`
        )
    }
    const from = unitOf(file)
    const edges = new Set()
    for (const specifier of importsOf(text)) {
      if (!specifier.startsWith(".")) {
        if (NO_PACKAGES.has(from))
          problems.push(`${file}: imports the package "${specifier}" (${from}/ takes none)`)
        continue
      }
      const target = toPosix(relative(SRC, resolve(dirname(join(SRC, file)), specifier))).replace(
        /\.js$/,
        ".ts"
      )
      if (target.startsWith("..")) {
        if ((OUTSIDE_SRC[from] ?? []).some((prefix) => target.startsWith(prefix))) continue
        problems.push(`${file}: imports ${specifier}, outside src/`)
        continue
      }
      if (edges.has(target)) continue
      edges.add(target)
      const to = unitOf(target)
      // `X/internal/…` belongs to the folder X: files of X (and of X/internal) may import it,
      // a subfolder with a layer of its own (relay/http of relay) may not.
      const internalAt = target.lastIndexOf("/internal/")
      if (internalAt >= 0) {
        const owner = target.slice(0, internalAt)
        if (!file.startsWith(`${owner}/`) || unitOf(file) !== unitOf(owner))
          problems.push(`${file}: imports ${target}, internal to ${owner}/`)
      }
      if (to === from) continue
      if (!unitGraph.has(from)) unitGraph.set(from, new Set())
      unitGraph.get(from).add(to)
      const a = layerOf.get(from)
      const b = layerOf.get(to)
      if (a === undefined || b === undefined || b >= a) upward.push(`${file} -> ${target} (${from} -> ${to})`)
    }
    fileGraph.set(file, edges)
  }
  for (const [unit] of unitGraph)
    if (!layerOf.has(unit)) problems.push(`src/${unit}: a folder no layer of scripts/check-imports.mjs names`)
  const fileCycles = cycles(fileGraph)
  const unitCycles = cycles(unitGraph)
  for (const cycle of fileCycles) problems.push(`cycle between files: ${cycle.join(", ")}`)
  for (const cycle of unitCycles) problems.push(`cycle between folders: ${cycle.join(", ")}`)
  for (const edge of upward) problems.push(`import against the layers: ${edge}`)
  return { files: files.length, lines, long, fileCycles, unitCycles, upward, problems }
}

if (process.argv[1] !== undefined && resolve(process.argv[1]) === fileURLToPath(import.meta.url)) {
  const result = analyse()
  if (process.argv.includes("--report")) {
    console.log(`files ${result.files}, lines ${result.lines}`)
    console.log(
      `over ${MAX_LINES} lines: ${result.long.length} (${result.long.filter((l) => !l.explained).length} without a reason)`
    )
    for (const l of result.long) console.log(`  ${l.file} ${l.count}${l.explained ? "" : " (no reason)"}`)
    console.log(`file cycles: ${result.fileCycles.length}`)
    for (const c of result.fileCycles) console.log(`  ${c.join(" ")}`)
    console.log(`folder cycles: ${result.unitCycles.length}`)
    for (const c of result.unitCycles) console.log(`  ${c.join(" ")}`)
    console.log(`imports against the layers: ${result.upward.length}`)
    for (const u of result.upward) console.log(`  ${u}`)
    process.exit(0)
  }
  result.problems.push(...docProblems(analyseExports()))
  if (result.problems.length > 0) {
    for (const problem of result.problems) console.error(problem)
    console.error(`check-imports: ${result.problems.length} problems`)
    process.exit(1)
  }
  console.log(
    `check-imports: ${result.files} files, no cycles, imports follow the layers, exports documented`
  )
}
