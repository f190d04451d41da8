/**
 * Command-line entry of kvrelay (placeholder until the relay service exists): `bench` runs the
 * benchmarks.
 */

const usage = `kvrelay <command> [options]

Commands:
  demo                                     an in-process tour of the CKF core (producers, CBI1, consumer)
  bench [--quick] [--json] [--only NAME]   run the benchmarks (ratios against same-run baselines)

Options:
  --help                                   show this help
`

const main = async (argv: ReadonlyArray<string>): Promise<number> => {
  const [command, ...rest] = argv
  if (command === undefined || command === "--help" || command === "-h" || command === "help") {
    process.stdout.write(usage)
    return command === undefined ? 2 : 0
  }
  if (command === "demo") {
    const { runCkfDemo } = await import("./ckfDemo.js")
    runCkfDemo((line) => process.stdout.write(`${line}\n`))
    return 0
  }
  if (command === "bench") {
    if (rest.includes("--help")) {
      process.stdout.write(usage)
      return 0
    }
    const onlyIndex = rest.indexOf("--only")
    const { runBenchmarks } = await import("../../bench/main.js")
    await runBenchmarks({
      quick: rest.includes("--quick"),
      json: rest.includes("--json"),
      only: onlyIndex >= 0 && rest[onlyIndex + 1] !== undefined ? rest[onlyIndex + 1]!.split(",") : []
    })
    return 0
  }
  process.stderr.write(`kvrelay: unknown command ${JSON.stringify(command)}\n\n${usage}`)
  return 2
}

main(process.argv.slice(2)).then(
  (code) => {
    process.exitCode = code
  },
  (error: unknown) => {
    process.stderr.write(
      `kvrelay: ${error instanceof Error ? (error.stack ?? error.message) : String(error)}\n`
    )
    process.exitCode = 1
  }
)
