/**
 * End to end (issue 6): the `kvrelay` command line as a user meets it (PROTOCOL.md §1). Help
 * exits 0; invalid settings exit 2 with exactly one stderr line per problem, naming its flag,
 * whether the value came from a flag, a `KVRELAY_*` variable or a `--config` file; a missing or
 * invalid discovery document fails startup with a message naming it.
 */

import { accessSync, constants, readFileSync, writeFileSync } from "node:fs"
import * as net from "node:net"
import { join } from "node:path"
import { afterAll, describe, expect, it } from "vitest"
import {
  BIN,
  CLI_TEST_TIMEOUT_MS,
  type CliResult,
  cleanup,
  DiscoveryFile,
  ROOT,
  runKvrelay,
  tempDir
} from "./relayProcessHarness.js"

afterAll(() => cleanup())

/** The stderr lines of a usage failure: one per problem and nothing else (PROTOCOL §1). */
const problems = (result: CliResult): Array<string> => result.stderr.trim().split("\n")

const expectUsageFailure = (result: CliResult, command: string, expected: ReadonlyArray<RegExp>) => {
  expect(result.code).toBe(2)
  expect(result.stdout).toBe("")
  const lines = problems(result)
  expect(lines, result.stderr).toHaveLength(expected.length)
  for (const [i, pattern] of expected.entries()) expect(lines[i]).toMatch(pattern)
  for (const line of lines) expect(line).toMatch(new RegExp(`^kvrelay ${command}: --[a-z-]+: `))
}

/** A valid, empty discovery document. */
const emptyDiscovery = (): DiscoveryFile => {
  const file = new DiscoveryFile()
  file.write({ version: 1, cards: [], sources: [] })
  return file
}

/**
 * A discovery document and an HTTP address that can be used: a test of one bad setting gets
 * that one line, not also the default document's absence or a busy default port.
 */
const usableResources = (): Array<string> => ["--discovery", emptyDiscovery().spec, "--http", "127.0.0.1:0"]

describe.concurrent("kvrelay command line", { timeout: CLI_TEST_TIMEOUT_MS }, () => {
  for (const command of ["relay", "global", "demo", "bench"]) {
    it(`kvrelay ${command} --help exits 0 and lists the options`, async () => {
      const result = await runKvrelay([command, "--help"])
      expect(result.code).toBe(0)
      expect(result.stderr).toBe("")
      expect(result.stdout).toContain(`kvrelay ${command}`)
      expect(result.stdout).toContain("Options:")
      if (command === "relay") {
        for (const flag of ["--dc-id", "--discovery", "--http", "--publication-threshold"]) {
          expect(result.stdout).toContain(flag)
        }
        expect(result.stdout).toContain("KVRELAY_DC_ID")
      }
      if (command === "global") expect(result.stdout).toContain("--relay")
    })
  }

  it("the package's kvrelay bin (what `npx kvrelay` runs) prints the commands and exits 0", async () => {
    // `npx kvrelay` with a cold npm cache installs this package, whose `prepare` rebuilds dist/
    // under the other tests' feet: the test runs the bin the way npx's link does instead.
    const manifest = JSON.parse(readFileSync(join(ROOT, "package.json"), "utf8")) as {
      bin: Record<string, string>
    }
    expect(manifest.bin).toEqual({ kvrelay: "bin/kvrelay.js" })
    expect(readFileSync(BIN, "utf8").split("\n")[0]).toBe("#!/usr/bin/env node")
    accessSync(BIN, constants.X_OK)
    const result = await runKvrelay(["--help"], { asBin: true })
    expect(result.code).toBe(0)
    const stdout = result.stdout
    expect(stdout).toContain("kvrelay <command>")
    for (const command of ["relay", "global", "demo", "bench"]) expect(stdout).toContain(`  ${command} `)
  })

  it("kvrelay --version prints the package's version and exits 0", async () => {
    const manifest = JSON.parse(readFileSync(new URL("../../package.json", import.meta.url), "utf8")) as {
      version: string
    }
    const result = await runKvrelay(["--version"])
    expect(result.code).toBe(0)
    expect(result.stdout).toBe(`kvrelay ${manifest.version}\n`)
  })

  it("an unknown command exits 2", async () => {
    const result = await runKvrelay(["frobnicate"])
    expect(result.code).toBe(2)
    expect(result.stderr).toContain('unknown command "frobnicate"')
  })

  it("a missing --dc-id is reported by its flag", async () => {
    expectUsageFailure(await runKvrelay(["relay", ...usableResources()]), "relay", [
      /^kvrelay relay: --dc-id: is required$/
    ])
  })

  it("every invalid setting gives one line naming its flag, from flags, KVRELAY_* and --config alike", async () => {
    const config = join(tempDir(), "relay.json")
    writeFileSync(config, JSON.stringify({ dcId: "from-file", colour: "blue" }))
    const result = await runKvrelay(
      [
        "relay",
        "--config",
        config,
        "--dc-id",
        " padded ",
        "--publication-threshold",
        "0",
        "--http",
        "nowhere",
        "--log-level",
        "loud",
        "--expected-unique-blocks",
        "8",
        "--discovery",
        emptyDiscovery().spec
      ],
      // The flag wins over its variable: the bad KVRELAY_EXPECTED_UNIQUE_BLOCKS is not reported.
      { env: { KVRELAY_PUBLICATION_DELAY_MS: "soon", KVRELAY_EXPECTED_UNIQUE_BLOCKS: "0" } }
    )
    expect(result.code).toBe(2)
    expect(result.stdout).toBe("")
    const lines = problems(result)
    const byFlag = (flag: string) => lines.filter((l) => l.startsWith(`kvrelay relay: ${flag}: `))
    expect(byFlag("--dc-id")).toEqual([
      "kvrelay relay: --dc-id: must not have leading or trailing whitespace"
    ])
    expect(byFlag("--publication-threshold")).toEqual([
      "kvrelay relay: --publication-threshold: expected a positive integer, got 0"
    ])
    expect(byFlag("--http")).toEqual(['kvrelay relay: --http: expected HOST:PORT, got "nowhere"'])
    expect(byFlag("--log-level")).toEqual([
      'kvrelay relay: --log-level: expected "trace" | "debug" | "info" | "warning" | "error" | "fatal" | "none", got "loud"'
    ])
    expect(byFlag("--publication-delay-ms")).toHaveLength(1)
    expect(byFlag("--publication-delay-ms")[0]).toContain('"soon"')
    expect(byFlag("--config")).toEqual([`kvrelay relay: --config: unknown setting "colour" in ${config}`])
    expect(lines, result.stderr).toHaveLength(6)
  })

  it("an unknown flag is named", async () => {
    expectUsageFailure(
      await runKvrelay(["relay", "--dc-id", "dc", "--no-such-flag", ...usableResources()]),
      "relay",
      [/^kvrelay relay: --no-such-flag: unknown flag for kvrelay relay$/]
    )
  })

  it("an invalid --discovery backend is named", async () => {
    expectUsageFailure(
      await runKvrelay(["relay", "--dc-id", "dc", "--discovery", "zookeeper:x", "--http", "127.0.0.1:0"]),
      "relay",
      [/^kvrelay relay: --discovery: /]
    )
  })

  it("kvrelay global without --relay exits 2 naming --relay", async () => {
    expectUsageFailure(await runKvrelay(["global", "--http", "127.0.0.1:0"]), "global", [
      /^kvrelay global: --relay: is required$/
    ])
  })

  it("a missing discovery file fails startup, naming it", async () => {
    const missing = join(tempDir(), "absent.json")
    const result = await runKvrelay([
      "relay",
      "--dc-id",
      "dc",
      "--discovery",
      `file:${missing}`,
      "--http",
      "127.0.0.1:0"
    ])
    // A discovery file that cannot be read is invalid configuration: status 2, one line naming
    // the flag and the file.
    expect(result.code).toBe(2)
    expect(result.stdout).not.toContain('"listening"')
    const lines = problems(result)
    expect(lines, result.stderr).toHaveLength(1)
    expect(lines[0]).toMatch(/^kvrelay relay: --discovery: file:.*cannot read/)
    expect(lines[0]).toContain(missing)
  })

  it("an HTTP address that cannot be bound fails startup with status 2, naming --http", async () => {
    const file = new DiscoveryFile()
    file.write({ version: 1, cards: [], sources: [] })
    const blocker = net.createServer()
    await new Promise<void>((resolve) => blocker.listen(0, "127.0.0.1", resolve))
    const { port } = blocker.address() as net.AddressInfo
    try {
      const [relay, global] = await Promise.all([
        // Info logs (startup, shutdown) would share stderr with the problem line.
        runKvrelay([
          "relay",
          "--dc-id",
          "dc",
          "--discovery",
          file.spec,
          "--http",
          `127.0.0.1:${port}`,
          "--log-level",
          "error"
        ]),
        runKvrelay([
          "global",
          "--relay",
          "a=http://127.0.0.1:9",
          "--http",
          `127.0.0.1:${port}`,
          "--log-level",
          "error"
        ])
      ])
      expectUsageFailure(relay!, "relay", [/^kvrelay relay: --http: cannot listen on .*already in use$/])
      expectUsageFailure(global!, "global", [/^kvrelay global: --http: cannot listen on .*already in use$/])
    } finally {
      blocker.close()
    }
  })

  it("problems of different settings are reported together", async () => {
    expectUsageFailure(
      await runKvrelay([
        "relay",
        "--dc-id",
        " dc",
        "--discovery",
        "zookeeper:x",
        "--etcd-prefix",
        "kv",
        "--http",
        "127.0.0.1:0"
      ]),
      "relay",
      [/^kvrelay relay: --dc-id: /, /^kvrelay relay: --discovery: /, /^kvrelay relay: --etcd-prefix: /]
    )
  })

  it("an invalid discovery document fails startup, naming the problem", async () => {
    const invalid = new DiscoveryFile()
    invalid.write({ version: 1, cards: [{ namespace: "prod", bogus: true }], sources: [] })
    const notJson = new DiscoveryFile()
    notJson.write("{ this is not json")
    const [first, second] = await Promise.all(
      [invalid, notJson].map((file) =>
        runKvrelay(["relay", "--dc-id", "dc", "--discovery", file.spec, "--http", "127.0.0.1:0"])
      )
    )
    for (const [result, file] of [
      [first!, invalid],
      [second!, notJson]
    ] as const) {
      expect(result.code).toBe(2)
      expect(result.stdout).not.toContain('"listening"')
      const lines = problems(result)
      expect(lines, result.stderr).toHaveLength(1)
      expect(lines[0]).toMatch(/^kvrelay relay: --discovery: file:.*invalid/)
      expect(lines[0]).toContain(file.path)
    }
    expect(first!.stderr).toContain("bogus")
  })
})
