/**
 * `kvrelay relay | global | demo | simulate | bench`. Invalid settings and unusable startup
 * resources exit with status 2 and one line per problem on stderr, each naming its flag, all of
 * them in one run; SIGINT/SIGTERM stop the long-running commands
 * cleanly (exit 0).
 */

import { readFileSync } from "node:fs"
import { Effect, Either, type Schema } from "effect"
import { VERSION } from "../version.js"
import { type CommandSpec, commandHelp, settingsFields, UsageError, validSettingValues } from "./args.js"
import {
  BenchSettings,
  benchCommand,
  DemoSettings,
  decodeSettingsInput,
  demoCommand,
  GlobalSettings,
  globalCommand,
  loadSettings,
  RelaySettings,
  readSettingsInput,
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

/**
 * The settings of a long-running command, or every problem with them: each invalid setting, and
 * each startup resource (file, address) of the settings that are valid, checked before anything
 * starts so that one run reports them all (PROTOCOL §1).
 */
const prepare = async <A, I>(
  spec: CommandSpec,
  schema: Schema.Schema<A, I, never>,
  argv: ReadonlyArray<string>,
  resources: (checks: StartupChecks, values: Partial<A>) => Effect.Effect<ReadonlyArray<string>>,
  more: (settings: A) => ReadonlyArray<string> = () => []
): Promise<Either.Either<A, UsageError>> => {
  const input = readSettingsInput(spec, sources(argv))
  const settings = decodeSettingsInput(schema, input)
  const valid = validSettingValues(settingsFields(schema) ?? {}, input.merged)
  // Without the config file a default may stand for what the file says: check only what was given.
  const values = (
    input.configUnusable
      ? Object.fromEntries(Object.entries(valid).filter(([k]) => k in input.merged))
      : valid
  ) as Partial<A>
  const checks = await import("./startupChecks.js")
  const unusable = await Effect.runPromise(resources(checks, values))
  const problems = [...(Either.isLeft(settings) ? settings.left.problems : more(settings.right)), ...unusable]
  return problems.length > 0 ? Either.left(new UsageError(problems)) : settings
}

type StartupChecks = typeof import("./startupChecks.js")

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
      const settings = await prepare(
        relayCommand,
        RelaySettings,
        rest,
        (checks, values) => checks.relayStartupProblems(values),
        (settings) =>
          Either.match(relayDiscoveryConfig(settings), { onLeft: (e) => e.problems, onRight: () => [] })
      )
      if (Either.isLeft(settings)) return fail(settings.left, "relay")
      const discovery = Either.getOrThrow(relayDiscoveryConfig(settings.right))
      const { relayProgram } = await import("./relayCommand.js")
      const { runCommand } = await import("./runtime.js")
      runCommand("relay", relayProgram(settings.right, discovery))
      return "running"
    }
    case "global": {
      const settings = await prepare(globalCommand, GlobalSettings, rest, (checks, values) =>
        checks.globalStartupProblems(values)
      )
      if (Either.isLeft(settings)) return fail(settings.left, "global")
      const { globalProgram } = await import("./globalCommand.js")
      const { runCommand } = await import("./runtime.js")
      runCommand("global", globalProgram(settings.right))
      return "running"
    }
    case "simulate": {
      const settings = await prepare(simulateCommand, SimulateSettings, rest, (checks, values) =>
        checks.simulateStartupProblems(values)
      )
      if (Either.isLeft(settings)) return fail(settings.left, "simulate")
      const { simulateProgram } = await import("./simulate.js")
      const { runCommand } = await import("./runtime.js")
      runCommand("simulate", simulateProgram(settings.right))
      return "running"
    }
    case "demo": {
      const settings = await prepare(demoCommand, DemoSettings, rest, (checks, values) =>
        checks.demoStartupProblems(values)
      )
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
