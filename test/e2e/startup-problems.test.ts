/**
 * End to end (issue 30, PROTOCOL §1 ◆3): the built `kvrelay` given several bad settings and
 * several unusable startup resources at once reports every one of them, one stderr line each
 * naming its flag, and exits 2 without starting anything (no readiness line, no file written).
 */

import { existsSync, mkdirSync, writeFileSync } from "node:fs"
import * as net from "node:net"
import { join } from "node:path"
import { afterAll, describe, expect, it } from "vitest"
import { demoPortsWithOneBusy } from "../cli/busyPorts.js"
import { CLI_TEST_TIMEOUT_MS, type CliResult, cleanup, runKvrelay, tempDir } from "./relayProcessHarness.js"

afterAll(() => cleanup())

/** A port held by this process while `use` runs. */
const withBusyPort = async <A>(use: (port: number) => Promise<A>): Promise<A> => {
  const server = net.createServer()
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve))
  try {
    return await use((server.address() as net.AddressInfo).port)
  } finally {
    await new Promise<void>((resolve) => server.close(() => resolve()))
  }
}

/** Exit 2, nothing on stdout, and exactly these stderr lines in this order. */
const expectProblems = (result: CliResult, command: string, expected: ReadonlyArray<string | RegExp>) => {
  expect(result.code, result.stderr).toBe(2)
  expect(result.stdout).toBe("")
  const lines = result.stderr.trim().split("\n")
  expect(lines, result.stderr).toHaveLength(expected.length)
  for (const [i, pattern] of expected.entries()) {
    const full = typeof pattern === "string" ? `kvrelay ${command}: ${pattern}` : pattern
    if (typeof full === "string") expect(lines[i]).toBe(full)
    else expect(lines[i]).toMatch(full)
  }
}

describe.concurrent("every startup problem at once", { timeout: CLI_TEST_TIMEOUT_MS }, () => {
  it("relay: bad flags, bad values, a missing discovery document, TLS and token files, a busy address", async () => {
    const dir = tempDir()
    const config = join(dir, "relay.json")
    writeFileSync(config, JSON.stringify({ publicationThreshold: 0, colour: "blue" }))
    await withBusyPort(async (port) => {
      const result = await runKvrelay(
        [
          "relay",
          "--config",
          config,
          "--dc-id",
          " padded",
          "--no-such-flag",
          "x",
          "--discovery",
          `file:${join(dir, "absent.json")}`,
          "--http",
          `127.0.0.1:${port}`,
          "--tls-cert",
          join(dir, "absent.pem"),
          "--tls-key",
          join(dir, "absent.key"),
          "--auth-token-file",
          join(dir, "absent-tokens.txt"),
          "--log-level",
          "loud"
        ],
        { env: { KVRELAY_PUBLICATION_DELAY_MS: "soon" } }
      )
      expectProblems(result, "relay", [
        "--no-such-flag: unknown flag for kvrelay relay",
        `--config: unknown setting "colour" in ${config}`,
        "--dc-id: must not have leading or trailing whitespace",
        "--publication-threshold: expected a positive integer, got 0",
        '--publication-delay-ms: expected a positive integer, got "soon"',
        /^kvrelay relay: --log-level: expected "trace" \| .* got "loud"$/,
        new RegExp(
          `^kvrelay relay: --discovery: file:${join(dir, "absent.json")}: cannot read the initial document: `
        ),
        `--http: cannot listen on 127.0.0.1:${port}: the address is already in use`,
        `--tls-cert: cannot read ${join(dir, "absent.pem")}: no such file`,
        `--tls-key: cannot read ${join(dir, "absent.key")}: no such file`,
        new RegExp(`^kvrelay relay: --auth-token-file: .*${join(dir, "absent-tokens.txt")}`)
      ])
    })
  })

  it("global: a bad relay target, its TLS and token files, the relays' CA, a busy address", async () => {
    const dir = tempDir()
    writeFileSync(join(dir, "not-pem.txt"), "hello\n")
    await withBusyPort(async (port) => {
      const result = await runKvrelay([
        "global",
        "--relay",
        "no-url",
        "--http",
        `127.0.0.1:${port}`,
        "--tls-cert",
        join(dir, "absent.pem"),
        "--tls-key",
        join(dir, "absent.key"),
        "--relay-ca",
        join(dir, "not-pem.txt"),
        "--relay-token-file",
        join(dir, "absent-tokens.txt"),
        "--relay-cert",
        join(dir, "absent-client.pem")
      ])
      expectProblems(result, "global", [
        /^kvrelay global: --relay: expected NAME=URL/,
        "--relay-key: is required with --relay-cert",
        `--http: cannot listen on 127.0.0.1:${port}: the address is already in use`,
        `--tls-cert: cannot read ${join(dir, "absent.pem")}: no such file`,
        `--tls-key: cannot read ${join(dir, "absent.key")}: no such file`,
        `--relay-ca: ${join(dir, "not-pem.txt")} holds no PEM certificate`,
        `--relay-cert: cannot read ${join(dir, "absent-client.pem")}: no such file`,
        new RegExp(`^kvrelay global: --relay-token-file: .*${join(dir, "absent-tokens.txt")}`)
      ])
    })
  })

  it("simulate: neither --etcd nor --discovery-file, bad numbers, a host not on this machine", async () => {
    expectProblems(
      await runKvrelay(["simulate", "--workers", "0", "--block-size", "many", "--bind-host", "203.0.113.7"]),
      "simulate",
      [
        '--block-size: expected a positive integer, got "many"',
        "--workers: expected a positive integer, got 0",
        "--etcd: is required, or --discovery-file PATH instead",
        "--bind-host: cannot bind 203.0.113.7: the address is not available on this host"
      ]
    )
  })

  it("simulate: both --etcd and --discovery-file, and a discovery file nowhere", async () => {
    const dir = tempDir()
    const target = join(dir, "missing-dir", "discovery.json")
    expectProblems(
      await runKvrelay([
        "simulate",
        "--etcd",
        "http://127.0.0.1:9",
        "--discovery-file",
        target,
        "--requests-per-second",
        "0"
      ]),
      "simulate",
      [
        "--requests-per-second: expected a positive integer, got 0",
        "--discovery-file: cannot be given with --etcd: the workers register in one place",
        `--discovery-file: cannot write ${target}: no directory ${join(dir, "missing-dir")}`
      ]
    )
    const directory = join(dir, "a-directory")
    mkdirSync(directory)
    expectProblems(
      await runKvrelay(["simulate", "--discovery-file", directory, "--duration-s", "-1"]),
      "simulate",
      [
        "--duration-s: expected a positive integer, got -1",
        `--discovery-file: cannot write ${directory}: it is a directory`
      ]
    )
    expect(existsSync(join(dir, "missing-dir"))).toBe(false)
  })

  it("demo: bad values and a busy port among its three", async () => {
    const { base, busyPort, release } = await demoPortsWithOneBusy(2)
    try {
      expectProblems(
        await runKvrelay(["demo", "--workers", "0", "--http-port", String(base), "--log-level", "loud"]),
        "demo",
        [
          "--workers: expected a positive integer, got 0",
          /^kvrelay demo: --log-level: expected "trace" \| .* got "loud"$/,
          `--http-port: cannot listen on 127.0.0.1:${busyPort}: the address is already in use`
        ]
      )
    } finally {
      await release()
    }
  })
})
