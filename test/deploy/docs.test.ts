/**
 * The README, docs/ and examples/README.md as a newcomer follows them. Every file they link to or
 * name is in the repository, and every shell command they show works as written:
 *
 * - each one is checked for what it needs: a `kvrelay` command's settings decode and the files
 *   it names exist and load as the servers load them; an npm script exists (and its `--`
 *   arguments decode); an engine's `--kv-events-config` agrees with `examples/engines/`; a
 *   compose service exists;
 * - what can run here runs: the file-discovery walkthrough (`kvrelay simulate`, `relay`,
 *   `global` and its query, with /tmp paths and the ports moved into a sandbox), every `curl` of
 *   the docs against those servers, the TLS recipe's `openssl` lines (whose files the servers must
 *   then accept), and the etcd registration scripts against a real etcd.
 *
 * A command no rule knows fails the test, so a new kind of command gets a check with it. Docker,
 * npm's installs and the engines cannot run here; for those the files they name must exist.
 */

import { type ChildProcess, execFile, spawn } from "node:child_process"
import { existsSync, mkdtempSync, readdirSync, readFileSync, rmSync } from "node:fs"
import * as net from "node:net"
import { tmpdir } from "node:os"
import { dirname, isAbsolute, join } from "node:path"
import { Effect, Either, type Schema } from "effect"
import { afterAll, describe, expect, it } from "vitest"
import { parse as parseYaml } from "yaml"
import { unknownSuites } from "../../bench/main.js"
import { type CommandSpec, keyOf } from "../../src/cli/args.js"
import {
  BenchSettings,
  benchCommand,
  DemoSettings,
  demoCommand,
  GlobalSettings,
  globalCommand,
  loadSettings,
  RelaySettings,
  relayCommand,
  SimulateSettings,
  simulateCommand
} from "../../src/cli/settings.js"
import {
  discoveryDocument,
  relayTlsFiles,
  serverTlsFiles,
  tokenFile,
  writableFile
} from "../../src/cli/startupChecks.js"
import { BIN, eventually, GiveUp } from "../e2e/relayProcessHarness.js"
import { etcdBinary, etcdServer, skipped } from "../integration/etcdHelpers.js"

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

  for (const page of [...pages, "examples/README.md"]) {
    it(`${page} links only to files in the repository, and they exist`, () => {
      const text = readFileSync(join(root, page), "utf8")
      expect(text, "no path outside the repository").not.toMatch(/\.\.\/shared|\/work\//)
      for (const [, target] of text.matchAll(/\]\(([^)#\s]+)(?:#[^)]*)?\)/g)) {
        expect(target!, `${page} links to ${target}`).not.toMatch(/^https?:/)
        expect(existsSync(join(root, dirname(page), target!)), `${page} → ${target}`).toBe(true)
      }
      // Paths written as code: `examples/…`, `otel/…`, `docs/…`, `src/…`, `test/…`; in
      // examples/README.md also the table's paths relative to examples/.
      for (const [, path] of text.matchAll(/`((?:examples|otel|docs|src|test)\/[\w./-]+\.[a-z]+)`/g))
        expect(existsSync(join(root, path!)), `${page} names ${path}`).toBe(true)
      if (page === "examples/README.md")
        for (const [, path] of text.matchAll(/^\| `([\w./-]+\.[a-z]+)` /gm))
          expect(existsSync(join(root, "examples", path!)), `${page} lists ${path}`).toBe(true)
    })
  }
})

// ---------------------------------------------------------------------------------------------
// The commands the pages show

/** Pages whose commands a user runs (docs/decisions.md records choices; its snippets are not steps). */
const commandPages = [
  "README.md",
  "docs/operations.md",
  "docs/protocol.md",
  "docs/troubleshooting.md",
  "docs/engines.md",
  "examples/README.md"
]

interface DocCommand {
  readonly page: string
  readonly line: number
  /** One command line: continuations joined, the trailing comment removed. */
  readonly text: string
  /** Shown in a fenced block (run or checked in full) or inline in prose (a mention). */
  readonly fenced: boolean
  /** Index of its fenced block within the page (commands of one block share a directory). */
  readonly block: number
}

const FENCE = /^(\s*)```(\w*)\s*$/

const extractCommands = (page: string): Array<DocCommand> => {
  const lines = readFileSync(join(root, page), "utf8").split("\n")
  const out: Array<DocCommand> = []
  let fence: string | undefined
  let block = -1
  let pending: { text: string; line: number } | undefined
  for (const [i, raw] of lines.entries()) {
    const open = FENCE.exec(raw)
    if (open !== null) {
      if (fence === undefined) {
        fence = open[2] ?? ""
        block++
      } else fence = undefined
      continue
    }
    if (fence === "sh" || fence === "bash") {
      const line = stripComment(raw.trim())
      if (line === "" && pending === undefined) continue
      const joined = pending === undefined ? line : `${pending.text} ${line}`
      const start = pending?.line ?? i + 1
      if (joined.endsWith("\\")) pending = { text: joined.slice(0, -1).trim(), line: start }
      else {
        pending = undefined
        out.push({ page, line: start, text: joined, fenced: true, block })
      }
      continue
    }
    if (fence === "ini") {
      const exec = /^ExecStart=(.+)$/.exec(raw.trim())
      if (exec !== null) out.push({ page, line: i + 1, text: exec[1]!, fenced: true, block })
      continue
    }
    if (fence !== undefined) continue
    for (const [, span] of raw.matchAll(
      /`((?:kvrelay|npm|curl|docker|node bin\/kvrelay\.js) [^`]*|kvrelay)`/g
    ))
      out.push({ page, line: i + 1, text: span!, fenced: false, block: -1 })
  }
  return out
}

/** The line without a `# comment` (a `#` after whitespace, outside quotes). */
const stripComment = (line: string): string => {
  let quote: string | undefined
  for (let i = 0; i < line.length; i++) {
    const c = line[i]!
    if (quote !== undefined) {
      if (c === quote) quote = undefined
    } else if (c === "'" || c === '"') quote = c
    else if (c === "#" && (i === 0 || /\s/.test(line[i - 1]!))) return line.slice(0, i).trim()
  }
  return line.trim()
}

type Token = string | { readonly op: string }

/** Shell words: quotes and backslashes as sh reads them; `|`, `&&`, `&`, `;`, `>` as operators. */
const shellWords = (text: string): Array<Token> => {
  const out: Array<Token> = []
  let word: string | undefined
  const flush = () => {
    if (word !== undefined) out.push(word)
    word = undefined
  }
  for (let i = 0; i < text.length; i++) {
    const c = text[i]!
    if (c === "'") {
      const end = text.indexOf("'", i + 1)
      word = (word ?? "") + text.slice(i + 1, end)
      i = end
    } else if (c === '"') {
      let j = i + 1
      let value = ""
      while (j < text.length && text[j] !== '"') {
        if (text[j] === "\\" && j + 1 < text.length) j++
        value += text[j]
        j++
      }
      word = (word ?? "") + value
      i = j
    } else if (c === "\\" && i + 1 < text.length) {
      word = (word ?? "") + text[++i]
    } else if (/\s/.test(c)) flush()
    else if (c === "|" || c === ";" || c === ">" || c === "&") {
      flush()
      const op = text.slice(i, i + 2) === "&&" || text.slice(i, i + 2) === "||" ? text.slice(i, i + 2) : c
      i += op.length - 1
      out.push({ op })
    } else if (c === "<" && /^<[a-z-]+>/.test(text.slice(i))) {
      // A placeholder of the prose (`kvrelay <command> --help`), not a redirection.
      const end = text.indexOf(">", i)
      word = (word ?? "") + text.slice(i, end + 1)
      i = end
    } else if (c === "<" && text[i + 1] === "(") {
      // Process substitution: one word up to its closing parenthesis.
      const end = text.indexOf(")", i)
      word = (word ?? "") + text.slice(i, end + 1)
      i = end
    } else word = (word ?? "") + c
  }
  flush()
  return out
}

interface Stage {
  readonly env: Record<string, string>
  readonly argv: ReadonlyArray<string>
}

/** The simple commands of a line (split at `|`, `&&`, `;`), redirections dropped. */
const stagesOf = (text: string): Array<Stage> => {
  const stages: Array<Stage> = []
  let env: Record<string, string> = {}
  let argv: Array<string> = []
  let redirect = false
  const end = () => {
    if (argv.length > 0) stages.push({ env, argv })
    env = {}
    argv = []
  }
  for (const token of shellWords(text)) {
    if (typeof token !== "string") {
      if (token.op === ">") redirect = true
      else end()
      continue
    }
    if (redirect) {
      redirect = false
      continue
    }
    const assignment = /^([A-Z_][A-Z0-9_]*)=(.*)$/.exec(token)
    if (argv.length === 0 && assignment !== null) env[assignment[1]!] = assignment[2]!
    else argv.push(token)
  }
  end()
  return stages
}

const commands = commandPages.flatMap(extractCommands)
const where = (c: DocCommand) => `${c.page}:${c.line} \`${c.text}\``

// ---------------------------------------------------------------------------------------------
// Static checks, per kind of command

const settingsOf: Record<string, readonly [CommandSpec, Schema.Schema<unknown, unknown, never>]> = {
  relay: [relayCommand, RelaySettings as unknown as Schema.Schema<unknown, unknown, never>],
  global: [globalCommand, GlobalSettings as unknown as Schema.Schema<unknown, unknown, never>],
  demo: [demoCommand, DemoSettings as unknown as Schema.Schema<unknown, unknown, never>],
  simulate: [simulateCommand, SimulateSettings as unknown as Schema.Schema<unknown, unknown, never>],
  bench: [benchCommand, BenchSettings as unknown as Schema.Schema<unknown, unknown, never>]
}

const LONG_RUNNING = ["relay", "global", "demo", "simulate"]

/** `kvrelay`, `node bin/kvrelay.js` or an installed path to the bin: the arguments after it. */
const kvrelayArgs = (argv: ReadonlyArray<string>): ReadonlyArray<string> | undefined => {
  if (argv[0] === "kvrelay" || argv[0]?.endsWith("/.bin/kvrelay")) return argv.slice(1)
  if (argv[0] === "node" && argv[1] === "bin/kvrelay.js") return argv.slice(2)
  return undefined
}

/** A placeholder the docs write for "your value here". */
const isPlaceholder = (word: string) => word === "…" || /^<[\w-]+>$/.test(word) || word === "CMD"

/** An absolute path of a deployment (the operator's /etc, /opt): not one this test can look at. */
const deploymentPath = (path: string) => isAbsolute(path) && !path.startsWith("/tmp/")

const packageJson = JSON.parse(readFileSync(join(root, "package.json"), "utf8")) as {
  scripts: Record<string, string>
}

/** Files the docs' own commands make (`openssl … -out relay.pem`, `echo … > tokens.txt`). */
const recipeOutputs = new Set(
  commands.flatMap((c) => {
    const words = shellWords(c.text)
    return words.flatMap((w, i) => {
      const previous = words[i - 1]
      const made =
        (typeof previous === "string" && ["-out", "-keyout"].includes(previous)) ||
        (typeof previous !== "string" && previous?.op === ">")
      return made && typeof w === "string" ? [w] : []
    })
  })
)

/** Checks a `kvrelay …` command; `dir` is where relative paths of its block live. */
const checkKvrelay = async (
  command: DocCommand,
  args: ReadonlyArray<string>,
  env: Record<string, string>,
  dir: string
) => {
  const [name, ...rest] = args.filter((a) => !isPlaceholder(a))
  if (name === undefined || name === "--help" || name === "--version") return
  if (args[0] !== undefined && isPlaceholder(args[0])) return
  const entry = settingsOf[name]
  expect(entry, `${where(command)}: kvrelay has no command ${name}`).toBeDefined()
  const [spec, schema] = entry!
  const flags = new Set(spec.flags.map((f) => `--${f.name}`))
  for (const arg of rest) {
    if (!arg.startsWith("--")) continue
    const flag = arg.split("=", 1)[0]!
    if (flag !== "--help")
      expect(flags.has(flag), `${where(command)}: kvrelay ${name} has no ${flag}`).toBe(true)
  }
  // A mention in prose names flags without their values; a command in a block must decode.
  if (!command.fenced) return
  const resolve = (path: string) => (isAbsolute(path) ? path : join(dir, path))
  const settings = loadSettings(spec, schema, {
    argv: rest,
    env,
    readFile: (path) => {
      // A deployment's config file (/etc/kvrelay/relay.json) stands for the command's example.
      if (deploymentPath(path)) return readFileSync(join(root, "examples", `${name}-config.json`), "utf8")
      return readFileSync(resolve(path), "utf8")
    }
  })
  expect(Either.isLeft(settings) ? settings.left.problems : [], where(command)).toEqual([])
  const values = Either.getOrThrow(settings) as Record<string, unknown>
  // Only what the line gives: a default (`file:kvrelay-discovery.json`) is not the line's file.
  const given = new Set([
    ...rest.filter((a) => a.startsWith("--")).map((a) => keyOf(a.slice(2).split("=", 1)[0]!)),
    ...Object.keys(env)
      .filter((k) => k.startsWith("KVRELAY_"))
      .map((k) => keyOf(k.slice("KVRELAY_".length).toLowerCase().replace(/_/g, "-")))
  ])
  if (name === "bench") {
    expect(unknownSuites((values["only"] as ReadonlyArray<string>) ?? []), where(command)).toEqual([])
    return
  }
  // The files it names load as the command loads them; deployment paths are the operator's.
  const local = (key: string) => {
    const value = given.has(key) ? (values[key] as string | undefined) : undefined
    const path = key === "discovery" ? value?.replace(/^file:/, "") : value
    if (path === undefined || deploymentPath(path) || path.startsWith("/tmp/")) return undefined
    // Files a recipe of the docs makes are checked where the recipe ran (the TLS test below).
    return dir === root && recipeOutputs.has(path) ? undefined : resolve(path)
  }
  const problems = await Effect.runPromise(
    Effect.all(
      [
        serverTlsFiles({
          tlsCert: local("tlsCert"),
          tlsKey: local("tlsKey"),
          tlsClientCa: local("tlsClientCa")
        }),
        tokenFile("--auth-token-file", local("authTokenFile")),
        relayTlsFiles({
          relayCa: local("relayCa"),
          relayCert: local("relayCert"),
          relayKey: local("relayKey")
        }),
        tokenFile("--relay-token-file", local("relayTokenFile")),
        typeof values["discovery"] === "string" && values["discovery"].startsWith("file:")
          ? discoveryDocument(local("discovery") === undefined ? undefined : `file:${local("discovery")}`)
          : Effect.succeed([]),
        given.has("discoveryFile") && typeof values["discoveryFile"] === "string"
          ? writableFile(
              "--discovery-file",
              (values["discoveryFile"] as string).replace(/^\/tmp\//, `${tmpdir()}/`)
            )
          : Effect.succeed([])
      ],
      { concurrency: "unbounded" }
    )
  )
  expect(problems.flat(), where(command)).toEqual([])
}

const checkNpm = async (command: DocCommand, argv: ReadonlyArray<string>) => {
  const [, sub, ...rest] = argv
  if (sub === "ci" || sub === "exec" || (sub === "install" && rest[0] === "-g")) return
  const script = sub === "run" ? rest[0] : sub
  expect(packageJson.scripts[script!], `${where(command)}: package.json has a script ${script}`).toBeDefined()
  const dashDash = argv.indexOf("--")
  if (dashDash < 0) return
  // `npm start -- …` and `npm run bench -- …` pass their arguments to kvrelay.
  const target = script === "start" ? "demo" : script === "bench" ? "bench" : undefined
  expect(target, `${where(command)}: arguments after -- of a script that takes none`).toBeDefined()
  const args = [target!, ...argv.slice(dashDash + 1)]
  await checkKvrelay({ ...command, fenced: true }, args, {}, root)
}

const compose = parseYaml(readFileSync(join(root, "docker-compose.yml"), "utf8")) as {
  services: Record<string, unknown>
}

const checkDocker = (command: DocCommand, argv: ReadonlyArray<string>) => {
  expect(argv[1], where(command)).toBe("compose")
  expect(existsSync(join(root, "docker-compose.yml"))).toBe(true)
  if (argv[2] === "logs")
    expect(compose.services[argv[3]!], `${where(command)}: a compose service`).toBeDefined()
  else expect(["up", "down", "ps"], where(command)).toContain(argv[2])
}

/** vLLM's and SGLang's `--kv-events-config`: the example file, or JSON that agrees with it. */
const checkEngine = (command: DocCommand, argv: ReadonlyArray<string>) => {
  const engine = argv[0] === "vllm" ? "vllm" : "sglang"
  const value = argv[argv.indexOf("--kv-events-config") + 1]!
  const example = JSON.parse(
    readFileSync(join(root, "examples", "engines", `${engine}-kv-events.json`), "utf8")
  )
  const cat = /^\$\(cat ([\w./-]+)\)$/.exec(value)
  if (cat !== null) {
    expect(cat[1], where(command)).toBe(`examples/engines/${engine}-kv-events.json`)
    return
  }
  const inline = JSON.parse(value) as Record<string, unknown>
  for (const [key, v] of Object.entries(inline)) expect(v, `${where(command)}: ${key}`).toEqual(example[key])
  // The block size the docs give the engine is the examples' cards' block size.
  const size = argv[argv.indexOf(engine === "vllm" ? "--block-size" : "--page-size") + 1]
  const card = JSON.parse(readFileSync(join(root, "examples", "engines", `${engine}-card.json`), "utf8"))
  expect(Number(size), where(command)).toBe(card.card.kvCacheBlockSize)
}

/** What each command is, by its first word; undefined for a command no rule knows. */
const kindOf = (stage: Stage): string | undefined => {
  const [first, second] = stage.argv
  if (kvrelayArgs(stage.argv) !== undefined) return "kvrelay"
  if (first === "npm") return "npm"
  if (first === "docker") return "docker"
  if (first === "curl") return "curl"
  if (first === "vllm" || (first === "python" && second === "-m")) return "engine"
  if (first === "openssl" || first === "echo") return "shell"
  if (first === "grep" || first === "jq" || first === "tee") return "shell"
  if (first === "node" && second === "examples/etcd-register.mjs") return "etcd-register"
  if (first === "examples/etcd-register.sh") return "etcd-register"
  return undefined
}

describe("documented commands", () => {
  it("every page shows commands, and each is one this test knows how to check", () => {
    expect(commands.filter((c) => c.fenced).length).toBeGreaterThan(25)
    const unknown = commands.flatMap((c) =>
      stagesOf(c.text)
        .filter((s) => kindOf(s) === undefined)
        .map((s) => `${where(c)}: ${s.argv[0]}`)
    )
    expect(unknown).toEqual([])
  })

  it("examples/README.md and operations §5 register records that exist (no card.json)", () => {
    const registrations = commands.filter((c) => c.text.includes("etcd-register"))
    expect(registrations.length).toBeGreaterThanOrEqual(4)
    for (const command of registrations)
      for (const word of stagesOf(command.text).flatMap((s) => s.argv))
        if (word.endsWith(".json"))
          expect(existsSync(join(root, word)), `${where(command)}: ${word}`).toBe(true)
  })

  for (const command of commands) {
    const stages = stagesOf(command.text)
    const kinds = stages.map(kindOf)
    if (!kinds.some((k) => k === "kvrelay" || k === "npm" || k === "docker" || k === "engine")) continue
    it(`${command.page}:${command.line} ${command.text.slice(0, 90)}`, async () => {
      for (const stage of stages) {
        const kind = kindOf(stage)
        if (kind === "kvrelay") await checkKvrelay(command, kvrelayArgs(stage.argv)!, stage.env, root)
        else if (kind === "npm") await checkNpm(command, stage.argv)
        else if (kind === "docker") checkDocker(command, stage.argv)
        else if (kind === "engine") checkEngine(command, stage.argv)
      }
    })
  }
})

// ---------------------------------------------------------------------------------------------
// Running what can run here

const sandbox = mkdtempSync(join(tmpdir(), "kvrelay-docs-"))
const started: Array<ChildProcess> = []

afterAll(async () => {
  await Promise.all(
    started.map(
      (child) =>
        new Promise<void>((resolve) => {
          if (child.exitCode !== null || child.signalCode !== null) return resolve()
          child.once("close", () => resolve())
          // The command runs under its own shell, in a process group of its own (a pipeline).
          try {
            process.kill(-child.pid!, "SIGTERM")
          } catch {
            resolve()
          }
        })
    )
  )
  rmSync(sandbox, { recursive: true, force: true })
})

const freePort = (): Promise<number> =>
  new Promise((resolve) => {
    const server = net.createServer()
    server.listen(0, "127.0.0.1", () => {
      const { port } = server.address() as net.AddressInfo
      server.close(() => resolve(port))
    })
  })

/** The documented addresses and paths, moved where this run may use them. */
interface Moves {
  readonly relay: number
  readonly global: number
}

const moved = (text: string, moves: Moves): string =>
  text
    .replace(/\/tmp\//g, `${sandbox}/`)
    .replace(/\b(?:127\.0\.0\.1|localhost|relay):8080\b/g, `127.0.0.1:${moves.relay}`)
    .replace(/\b(?:127\.0\.0\.1|localhost|global):8090\b/g, `127.0.0.1:${moves.global}`)
    .replace(/^node bin\/kvrelay\.js /, `${JSON.stringify(process.execPath)} ${JSON.stringify(BIN)} `)
    .replace(/^kvrelay /, `${JSON.stringify(process.execPath)} ${JSON.stringify(BIN)} `)

const bash = (script: string, cwd: string, timeoutMs = 60_000) =>
  new Promise<{ code: number | null; stdout: string; stderr: string }>((resolve) => {
    execFile("bash", ["-o", "pipefail", "-c", script], { cwd, timeout: timeoutMs }, (error, stdout, stderr) =>
      resolve({ code: error === null ? 0 : typeof error.code === "number" ? error.code : 1, stdout, stderr })
    )
  })

/** Hosts and paths of a line that only this machine can be: the line can run here. */
const runsHere = (text: string) =>
  !text.includes("…") &&
  !/\/etc\/|\/opt\//.test(text) &&
  [...text.matchAll(/\b(?:https?:\/\/)?([a-z][\w.-]*|\d+\.\d+\.\d+\.\d+):\d{2,5}\b/g)].every((m) =>
    ["localhost", "127.0.0.1", "relay", "global"].includes(m[1]!)
  )

describe("documented commands that run here", () => {
  it("the file-discovery walkthrough runs as written, and every documented curl answers from its servers", async () => {
    const moves: Moves = { relay: await freePort(), global: await freePort() }
    const launches = commands.filter((c) => {
      const args = kvrelayArgs(stagesOf(c.text)[0]?.argv ?? [])
      return c.fenced && args !== undefined && LONG_RUNNING.includes(args[0]!) && runsHere(c.text)
    })
    // The simulator, the relay on its document and the global consumer over the relay.
    expect(launches.map((c) => kvrelayArgs(stagesOf(c.text)[0]!.argv)![0])).toEqual([
      "simulate",
      "relay",
      "global"
    ])
    for (const command of launches) {
      const child = spawn("bash", ["-c", moved(command.text, moves)], {
        cwd: root,
        detached: true,
        stdio: ["ignore", "pipe", "pipe"]
      })
      started.push(child)
      let stdout = ""
      let stderr = ""
      child.stdout!.setEncoding("utf8").on("data", (chunk: string) => {
        stdout += chunk
      })
      child.stderr!.setEncoding("utf8").on("data", (chunk: string) => {
        stderr += chunk
      })
      // As the page says: each one is up (its first stdout line) before the next starts.
      await eventually(
        `${where(command)} to start`,
        () => {
          if (child.exitCode !== null) throw new GiveUp(`exited ${child.exitCode}: ${stderr}`)
          return /"event":"(listening|simulating)"/.test(stdout)
        },
        60_000
      )
    }

    const curls = commands.filter((c) => stagesOf(c.text).some((s) => s.argv[0] === "curl"))
    expect(curls.length).toBeGreaterThan(5)
    const reasonOf = async (answer: Response) => {
      try {
        return ((await answer.json()) as { reason?: string }).reason
      } catch {
        return undefined
      }
    }
    const bogus = async (url: URL, method: string) => {
      const answer = await fetch(new URL("/v1/no-such-route", url), {
        method,
        ...(method === "POST" ? { body: "{}" } : {})
      })
      return { status: answer.status, reason: await reasonOf(answer) }
    }
    for (const command of curls) {
      const stages = stagesOf(moved(command.text, moves))
      const curl = stages.find((s) => s.argv[0] === "curl")!
      const url = new URL(
        (curl.argv.find((a, i) => i > 0 && !a.startsWith("-") && curl.argv[i - 1] !== "-d") ?? "").replace(
          /^(?!https?:)/,
          "http://"
        )
      )
      const dataAt = curl.argv.indexOf("-d")
      const method = dataAt >= 0 ? "POST" : "GET"
      // The route exists: it does not answer as a route nobody serves does.
      const unknown = await bogus(url, method)
      const answer = await fetch(url, { method, ...(method === "POST" ? { body: "{}" } : {}) })
      const reason = await reasonOf(answer)
      expect(
        answer.status === unknown.status && reason === unknown.reason,
        `${where(command)}: ${method} ${url.pathname} is no route`
      ).toBe(false)
      if (!runsHere(command.text)) continue
      // Runnable as written: it answers JSON, and a literal body is one the server accepts.
      const expectsPrefix = command.text.includes("grep simulating")
      const body = await eventually(
        `${where(command)} to answer`,
        async () => {
          const run = await bash(moved(command.text, moves), root)
          expect(run.code, `${where(command)}: ${run.stderr}`).toBe(0)
          const parsed = JSON.parse(run.stdout) as {
            reason?: string
            results?: Array<{ prefixDepth: number }>
          }
          // The walkthrough promises prefix depth 4 for the simulator's sample query.
          return !expectsPrefix || parsed.results?.[0]?.prefixDepth === 4 ? parsed : undefined
        },
        60_000,
        500
      )
      if (dataAt >= 0 && curl.argv[dataAt + 1] !== "@-")
        expect(body.reason, where(command)).not.toBe("INVALID_REQUEST")
    }
  }, 240_000)

  it("the TLS recipe's openssl lines make files the relay and the global consumer accept", async () => {
    const recipe = commands.filter((c) => c.fenced && c.text.startsWith("openssl"))
    expect(recipe.length).toBeGreaterThanOrEqual(3)
    const page = recipe[0]!.page
    const dir = mkdtempSync(join(sandbox, "tls-"))
    const blocks = new Set(recipe.map((c) => c.block))
    const steps = commands.filter(
      (c) => c.page === page && c.fenced && [...blocks, Math.max(...blocks) + 1].includes(c.block)
    )
    for (const step of steps) {
      const kvrelay = kvrelayArgs(stagesOf(step.text)[0]!.argv)
      if (kvrelay !== undefined) {
        // The servers' own checks on the files the recipe made (their addresses are not bound).
        await checkKvrelay(step, kvrelay, stagesOf(step.text)[0]!.env, dir)
        continue
      }
      const run = await bash(step.text, dir)
      expect(run.code, `${where(step)}: ${run.stderr}`).toBe(0)
    }
    for (const file of ["ca.pem", "relay.pem", "relay.key", "tokens.txt"])
      expect(existsSync(join(dir, file))).toBe(true)
    expect(steps.some((s) => s.text.includes("--tls-cert relay.pem"))).toBe(true)
  }, 120_000)

  it.skipIf(etcdBinary === undefined)(
    `the etcd registration commands register their records and revoke them on SIGTERM${skipped}`,
    async () => {
      const registrations = commands.filter((c) => c.fenced && c.text.includes("etcd-register"))
      expect(registrations.length).toBeGreaterThanOrEqual(4)
      await Effect.runPromise(
        Effect.scoped(
          Effect.gen(function* () {
            const etcd = yield* etcdServer
            for (const command of registrations) {
              // The documented etcd address, whatever its host, is the test's etcd.
              const script = command.text.replace(/http:\/\/[\w.-]+:2379/g, etcd.url)
              yield* Effect.promise(() => runRegistration(command, script))
            }
          })
        )
      )
    },
    180_000
  )
})

/** Runs a registration script until it says `registered`, then SIGTERMs it: it must exit 0. */
const runRegistration = (command: DocCommand, script: string) =>
  new Promise<void>((resolve, reject) => {
    // `exec env`: the script itself gets the signal, not a shell around it.
    const child = spawn("bash", ["-c", `exec env ${script}`], {
      cwd: root,
      stdio: ["ignore", "pipe", "pipe"]
    })
    let output = ""
    const timer = setTimeout(() => {
      child.kill("SIGKILL")
      reject(new Error(`${where(command)}: no "registered" line: ${output}`))
    }, 60_000)
    const collect = (chunk: Buffer) => {
      output += chunk.toString("utf8")
      if (/registered/.test(output) && child.exitCode === null) child.kill("SIGTERM")
    }
    child.stdout!.on("data", collect)
    child.stderr!.on("data", collect)
    child.on("close", (code) => {
      clearTimeout(timer)
      if (/registered/.test(output) && code === 0) resolve()
      else reject(new Error(`${where(command)}: exited ${code}: ${output}`))
    })
  })
