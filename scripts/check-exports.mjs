#!/usr/bin/env node
/**
 * The exports check that `npm test` runs with the import-graph check (`check-imports.mjs` calls
 * it; docs/decisions.md, "Layout").
 *
 * It fails when an exported name of a module of `src/` outside an `internal/` folder has no JSDoc
 * comment (`/** … *\/`) right above its declaration. A name re-exported from another module
 * counts as documented when its declaration there is (or the re-export itself carries one).
 *
 * `node scripts/check-exports.mjs --report` also lists the exported names no other file imports
 * (in `src/`, `test/` or `bench/`; what the package entry points re-export counts as imported),
 * and exits 0 whatever it finds. `--root DIR` reads another checkout.
 */

import { existsSync, readdirSync, readFileSync, statSync } from "node:fs"
import { dirname, join, relative, resolve, sep } from "node:path"
import { fileURLToPath } from "node:url"
import ts from "typescript"

const HERE = resolve(dirname(fileURLToPath(import.meta.url)), "..")

const toPosix = (path) => path.split(sep).join("/")

const walk = (dir) =>
  existsSync(dir)
    ? readdirSync(dir).flatMap((name) => {
        const path = join(dir, name)
        if (statSync(path).isDirectory()) return name === "node_modules" ? [] : walk(path)
        return /\.(ts|mts)$/.test(name) && !/\.d\.ts$/.test(name) ? [path] : []
      })
    : []

const hasModifier = (node, kind) =>
  (ts.canHaveModifiers(node) ? (ts.getModifiers(node) ?? []) : []).some((m) => m.kind === kind)

/** True when a `/** … *\/` comment stands right above `node` (no blank line in between). */
const hasJsDoc = (text, node) => {
  const ranges = ts.getLeadingCommentRanges(text, node.pos) ?? []
  for (let i = ranges.length - 1; i >= 0; i--) {
    const range = ranges[i]
    if (range.kind !== ts.SyntaxKind.MultiLineCommentTrivia || !text.startsWith("/**", range.pos)) continue
    const gap = text.slice(range.end, node.getStart()).replace(/[ \t]*\/\/[^\n]*\n/g, "")
    return !/\n[ \t]*\n/.test(gap)
  }
  return false
}

const bindingNames = (name) =>
  ts.isIdentifier(name)
    ? [name.text]
    : name.elements.flatMap((e) => (ts.isOmittedExpression(e) ? [] : bindingNames(e.name)))

/**
 * A module's exports: `declared` (name → documented) for what it declares itself, `reexports`
 * (`export { a as b } from`, `export * from`) with their targets, and its imports.
 */
const readModule = (path) => {
  const text = readFileSync(path, "utf8")
  const source = ts.createSourceFile(path, text, ts.ScriptTarget.Latest, true)
  const declared = new Map()
  const reexports = []
  const imports = []
  const declare = (name, documented) => declared.set(name, (declared.get(name) ?? false) || documented)
  for (const statement of source.statements) {
    if (ts.isImportDeclaration(statement) && ts.isStringLiteral(statement.moduleSpecifier)) {
      const clause = statement.importClause
      const names = []
      let namespace
      if (clause?.name) names.push("default")
      const bindings = clause?.namedBindings
      if (bindings && ts.isNamespaceImport(bindings)) namespace = bindings.name.text
      if (bindings && ts.isNamedImports(bindings))
        for (const e of bindings.elements) names.push((e.propertyName ?? e.name).text)
      imports.push({ specifier: statement.moduleSpecifier.text, names, namespace })
      continue
    }
    if (ts.isExportDeclaration(statement)) {
      const documented = hasJsDoc(text, statement)
      const specifier =
        statement.moduleSpecifier && ts.isStringLiteral(statement.moduleSpecifier)
          ? statement.moduleSpecifier.text
          : undefined
      const clause = statement.exportClause
      if (clause === undefined) reexports.push({ specifier, all: true, documented })
      else if (ts.isNamedExports(clause))
        for (const e of clause.elements)
          reexports.push({ specifier, local: (e.propertyName ?? e.name).text, name: e.name.text, documented })
      else reexports.push({ specifier, namespace: clause.name.text, documented })
      continue
    }
    if (!hasModifier(statement, ts.SyntaxKind.ExportKeyword)) continue
    const documented = hasJsDoc(text, statement)
    if (ts.isVariableStatement(statement))
      for (const d of statement.declarationList.declarations)
        for (const n of bindingNames(d.name)) declare(n, documented)
    else if (statement.name && ts.isIdentifier(statement.name))
      declare(
        hasModifier(statement, ts.SyntaxKind.DefaultKeyword) ? "default" : statement.name.text,
        documented
      )
  }
  // Dynamic imports: `const { a, b } = await import("./x.js")` uses a and b; any other form all.
  for (const m of text.matchAll(/const\s*\{([^}]*)\}\s*=\s*await\s+import\(\s*["']([^"']+)["']\s*\)/g))
    imports.push({
      specifier: m[2],
      names: m[1]
        .split(",")
        .map((n) => n.trim().split(/\s*:\s*/)[0])
        .filter(Boolean)
    })
  for (const m of text.matchAll(/(?<!await\s)import\(\s*["']([^"']+)["']\s*\)(?:\.(\w+))?/g))
    imports.push(m[2] ? { specifier: m[1], names: [m[2]] } : { specifier: m[1], names: [], all: true })
  return { text, declared, reexports, imports }
}

const resolveSpecifier = (from, specifier) => {
  if (specifier === undefined || !specifier.startsWith(".")) return undefined
  const base = resolve(dirname(from), specifier)
  for (const candidate of [base.replace(/\.js$/, ".ts"), `${base}.ts`, join(base, "index.ts")])
    if (existsSync(candidate) && statSync(candidate).isFile()) return candidate
  return undefined
}

export const analyseExports = (root = HERE) => {
  const src = join(root, "src")
  const srcFiles = walk(src)
  const otherFiles = [...walk(join(root, "test")), ...walk(join(root, "bench"))]
  const modules = new Map()
  for (const path of [...srcFiles, ...otherFiles]) modules.set(path, readModule(path))

  // Documented: a declared name by its JSDoc, a re-exported one also by its declaration's.
  const documented = (path, name, seen = new Set()) => {
    const key = `${path}#${name}`
    if (seen.has(key)) return false
    seen.add(key)
    const module = modules.get(path)
    if (module === undefined) return true // outside src: not ours to document
    if (module.declared.has(name)) return module.declared.get(name)
    for (const r of module.reexports) {
      const target = resolveSpecifier(path, r.specifier)
      if (r.all) {
        if (target && exportedNames(target).has(name)) return r.documented || documented(target, name, seen)
      } else if (r.name === name) {
        if (r.documented) return true
        if (r.namespace !== undefined) return false
        return target ? documented(target, r.local, seen) : (module.declared.get(r.local) ?? false)
      }
    }
    return false
  }
  const exportedCache = new Map()
  const exportedNames = (path, seen = new Set()) => {
    if (exportedCache.has(path)) return exportedCache.get(path)
    if (seen.has(path)) return new Set()
    seen.add(path)
    const module = modules.get(path)
    const names = new Set(module ? module.declared.keys() : [])
    for (const r of module?.reexports ?? []) {
      if (r.all) {
        const target = resolveSpecifier(path, r.specifier)
        if (target) for (const n of exportedNames(target, seen)) names.add(n)
      } else names.add(r.name ?? r.namespace)
    }
    exportedCache.set(path, names)
    return names
  }

  const checked = srcFiles.filter((path) => !toPosix(relative(src, path)).split("/").includes("internal"))
  const missing = []
  for (const path of checked)
    for (const name of exportedNames(path))
      if (!documented(path, name)) missing.push(`${toPosix(relative(root, path))}: ${name}`)

  // Uses: every import of a name, and every re-export, from another file.
  const used = new Map(srcFiles.map((path) => [path, new Set()]))
  const use = (path, name, seen = new Set()) => {
    const key = `${path}#${name}`
    if (seen.has(key)) return
    seen.add(key)
    used.get(path)?.add(name)
    // A name a module re-exports is used in the module it comes from.
    for (const r of modules.get(path)?.reexports ?? []) {
      const target = resolveSpecifier(path, r.specifier)
      if (target === undefined) continue
      if (r.all && exportedNames(target).has(name)) use(target, name, seen)
      else if (r.name === name && r.local !== undefined) use(target, r.local, seen)
      else if (r.name === undefined && r.namespace === name)
        for (const n of exportedNames(target)) use(target, n, seen)
    }
  }
  for (const [path, module] of modules) {
    for (const i of module.imports) {
      const target = resolveSpecifier(path, i.specifier)
      if (target === undefined || !used.has(target)) continue
      for (const n of i.names) use(target, n)
      if (i.all) for (const n of exportedNames(target)) use(target, n)
      if (i.namespace !== undefined) {
        const accessed = new Set(
          [...module.text.matchAll(new RegExp(`\\b${i.namespace}\\.(\\w+)`, "g"))].map((m) => m[1])
        )
        for (const n of exportedNames(target)) if (accessed.has(n)) use(target, n)
      }
    }
  }
  // What the package entry points promise is used whatever imports it.
  for (const entry of ["index.ts", "ckf/index.ts", "client/index.ts"]) {
    const path = join(src, entry)
    if (modules.has(path)) for (const n of exportedNames(path)) use(path, n)
  }
  let total = 0
  const unused = []
  for (const path of srcFiles) {
    const module = modules.get(path)
    for (const name of module.declared.keys()) {
      total++
      if (!used.get(path).has(name)) unused.push({ file: toPosix(relative(root, path)), name })
    }
  }
  return { missing, total, unused }
}

/** What the check fails on: each export outside `internal/` without JSDoc. */
export const docProblems = (result) =>
  result.missing.map((m) => `${m}: exported without a JSDoc comment saying what it is for`)

if (process.argv[1] !== undefined && resolve(process.argv[1]) === fileURLToPath(import.meta.url)) {
  const at = process.argv.indexOf("--root")
  const root = at >= 0 ? resolve(process.argv[at + 1]) : HERE
  const result = analyseExports(root)
  if (process.argv.includes("--report")) {
    console.log(
      `exported names declared in src/: ${result.total}; imported by no other file: ${result.unused.length}`
    )
    for (const u of result.unused) console.log(`  ${u.file}: ${u.name}`)
    console.log(`exports without JSDoc (outside internal/): ${result.missing.length}`)
    for (const m of result.missing) console.log(`  ${m}`)
    process.exit(0)
  }
  const problems = docProblems(result)
  if (problems.length > 0) {
    for (const p of problems) console.error(p)
    console.error(`check-exports: ${problems.length} problems`)
    process.exit(1)
  }
  console.log("check-exports: every export outside internal/ has JSDoc")
}
