/**
 * `kvrelay relay | global | demo | simulate | bench`. Invalid settings exit with status 2 and one
 * line per problem on stderr, each naming its flag; SIGINT/SIGTERM stop the long-running commands
 * cleanly (exit 0).
 */

import { readFileSync } from "node:fs"
import { Either } from "effect"
import { VERSION } from "../version.js"
import { type CommandSpec, commandHelp, UsageError } from "./args.js"
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
  relayDiscoveryConfig,
  SimulateSettings,
  simulateCommand
} from "./settings.js"

const commands: ReadonlyArray<CommandSpec> = [
  relayCommand,
  globalCommand,
  demoCommand,
  simulateCommand,
  benchCommand
]

const usage = `kvrelay <command> [options]

Commands:
${commands.map((c) => `  ${c.name.padEnd(8)} ${c.summary}`).join("\n")}

Run \`kvrelay <command> --help\` for a command's options and \`kvrelay --version\` for the
version. Every option also reads KVRELAY_<OPTION> from the environment (the flag wins) and from a
JSON --config file.
`

const fail = (error: UsageError, command: string): number => {
  // Only the problems: PROTOCOL §1 asks for one line per problem, so no trailing hint line.
  for (const problem of error.problems) process.stderr.write(`kvrelay ${command}: ${problem}\n`)
  return 2
}

const sources = (argv: ReadonlyArray<string>) => ({
  argv,
  env: process.env,
  readFile: (path: string) => readFileSync(path, "utf8")
})

const main = async (argv: ReadonlyArray<string>): Promise<number | "running"> => {
  const [name, ...rest] = argv
  if (name === "--version" || name === "-V") {
    process.stdout.write(`kvrelay ${VERSION}\n`)
    return 0
  }
  if (name === undefined || name === "--help" || name === "-h" || name === "help") {
    process.stdout.write(usage)
    return name === undefined ? 2 : 0
  }
  const spec = commands.find((c) => c.name === name)
  if (spec === undefined) {
    process.stderr.write(`kvrelay: unknown command ${JSON.stringify(name)}\n\n${usage}`)
    return 2
  }
  if (rest.includes("--help") || rest.includes("-h")) {
    process.stdout.write(commandHelp(spec))
    return 0
  }
  switch (spec.name) {
    case "relay": {
      const settings = loadSettings(relayCommand, RelaySettings, sources(rest))
      if (Either.isLeft(settings)) return fail(settings.left, "relay")
      const discovery = relayDiscoveryConfig(settings.right)
      if (Either.isLeft(discovery)) return fail(discovery.left, "relay")
      const { relayProgram } = await import("./relayCommand.js")
      const { runCommand } = await import("./runtime.js")
      runCommand("relay", relayProgram(settings.right, discovery.right))
      return "running"
    }
    case "global": {
      const settings = loadSettings(globalCommand, GlobalSettings, sources(rest))
      if (Either.isLeft(settings)) return fail(settings.left, "global")
      const { globalProgram } = await import("./globalCommand.js")
      const { runCommand } = await import("./runtime.js")
      runCommand("global", globalProgram(settings.right))
      return "running"
    }
    case "simulate": {
      const settings = loadSettings(simulateCommand, SimulateSettings, sources(rest))
      if (Either.isLeft(settings)) return fail(settings.left, "simulate")
      const { simulateProgram } = await import("./simulate.js")
      const { runCommand } = await import("./runtime.js")
      runCommand("simulate", simulateProgram(settings.right))
      return "running"
    }
    case "demo": {
      const settings = loadSettings(demoCommand, DemoSettings, sources(rest))
      if (Either.isLeft(settings)) return fail(settings.left, "demo")
      const { demoProgram } = await import("./demo.js")
      const { runCommand } = await import("./runtime.js")
      runCommand("demo", demoProgram(settings.right))
      return "running"
    }
    default: {
      const settings = loadSettings(benchCommand, BenchSettings, sources(rest))
      if (Either.isLeft(settings)) return fail(settings.left, "bench")
      const { runBenchmarks, suiteNames, unknownSuites } = await import("../../bench/main.js")
      const unknown = unknownSuites(settings.right.only ?? [])
      if (unknown.length > 0) {
        const names = unknown.map((n) => JSON.stringify(n)).join(", ")
        return fail(
          new UsageError([
            `--only: unknown suite${unknown.length > 1 ? "s" : ""} ${names}; the suites are ${suiteNames.join(", ")}`
          ]),
          "bench"
        )
      }
      await runBenchmarks({
        quick: settings.right.quick,
        json: settings.right.json,
        only: settings.right.only ?? [],
        soakMinutes: settings.right.soakMinutes
      })
      return 0
    }
  }
}

main(process.argv.slice(2)).then(
  (code) => {
    if (code !== "running") process.exitCode = code
  },
  (error: unknown) => {
    process.stderr.write(
      `kvrelay: ${error instanceof Error ? (error.stack ?? error.message) : String(error)}\n`
    )
    process.exitCode = 1
  }
)
