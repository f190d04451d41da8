/**
 * A real etcd server for integration tests: started on free loopback ports with a temporary data
 * directory. Without an etcd binary the tests that need it report themselves skipped, except in
 * CI (`CI` set and not `false`), where they fail saying what is missing: a CI run that could not
 * install etcd must not go green.
 */

import { type ChildProcess, spawn } from "node:child_process"
import { accessSync, constants, mkdtempSync, rmSync } from "node:fs"
import { createServer } from "node:net"
import { tmpdir } from "node:os"
import { delimiter, join } from "node:path"
import { Cause, Effect, Exit, Option, Scope } from "effect"

export const findEtcd = (): string | undefined => {
  const candidates = [
    "/usr/bin/etcd",
    ...(process.env.PATH ?? "").split(delimiter).map((dir) => join(dir, "etcd"))
  ]
  for (const candidate of candidates) {
    try {
      accessSync(candidate, constants.X_OK)
      return candidate
    } catch {
      // not this one
    }
  }
  return undefined
}

/** A CI run: every test runs, and one whose tools are missing fails (as the Chromium test does). */
export const IN_CI = process.env.CI !== undefined && process.env.CI !== "" && process.env.CI !== "false"

export const etcdBinary = findEtcd()
/** Whether the etcd tests skip: only outside CI, and only without an etcd binary. */
export const skipEtcd = etcdBinary === undefined && !IN_CI
export const skipped = skipEtcd ? " (skipped: etcd binary not found)" : ""

const MISSING_ETCD =
  "etcd binary not found (/usr/bin/etcd or on PATH): the etcd tests run in CI and need it; .ci/run installs etcd-server with apt-get"

export const freePort = (): Promise<number> =>
  new Promise((resolve, reject) => {
    const server = createServer()
    server.once("error", reject)
    server.listen(0, "127.0.0.1", () => {
      const address = server.address()
      const port = typeof address === "object" && address !== null ? address.port : 0
      server.close(() => resolve(port))
    })
  })

export interface EtcdServer {
  readonly url: string
  readonly stop: Effect.Effect<void>
  readonly start: Effect.Effect<void>
}

/** etcd could not bind a port it was given: another process took it after `freePort` let it go. */
class PortTaken extends Error {}

/**
 * An etcd member on loopback; `stop` kills it (SIGKILL), `start` (re)starts it on the same ports
 * and data dir. `etcdServerNotStarted` picks the ports and data dir without starting it.
 */
const makeEtcdServer = (startNow: boolean): Effect.Effect<EtcdServer, never, Scope.Scope> =>
  Effect.gen(function* () {
    const binary = etcdBinary
    if (binary === undefined) return yield* Effect.die(new Error(MISSING_ETCD))
    const dataDir = mkdtempSync(join(tmpdir(), "kvrelay-etcd-"))
    const clientPort = yield* Effect.promise(freePort)
    const peerPort = yield* Effect.promise(freePort)
    const url = `http://127.0.0.1:${clientPort}`
    const peer = `http://127.0.0.1:${peerPort}`
    const args = [
      "--name=kvrelay-test",
      `--data-dir=${dataDir}`,
      `--listen-client-urls=${url}`,
      `--advertise-client-urls=${url}`,
      `--listen-peer-urls=${peer}`,
      `--initial-advertise-peer-urls=${peer}`,
      `--initial-cluster=kvrelay-test=${peer}`,
      "--log-level=error",
      "--logger=zap"
    ]
    let child: ChildProcess | undefined
    let stderr = ""
    const stop = Effect.promise(
      () =>
        new Promise<void>((resolve) => {
          const running = child
          child = undefined
          if (running === undefined || running.exitCode !== null) return resolve()
          running.once("exit", () => resolve())
          running.kill("SIGKILL")
        })
    )
    const start = Effect.promise(async () => {
      stderr = ""
      const spawned = spawn(binary, args, { stdio: ["ignore", "ignore", "pipe"] })
      spawned.stderr?.on("data", (chunk: Buffer) => {
        stderr += chunk.toString()
      })
      child = spawned
      const deadline = Date.now() + 30_000
      while (Date.now() < deadline) {
        try {
          // Bounded: until etcd binds, whatever else holds the port may never answer.
          const response = await fetch(`${url}/health`, { signal: AbortSignal.timeout(1_000) })
          if (response.ok && (await response.text()).includes("true")) return
        } catch {
          // not listening yet
        }
        if (spawned.exitCode !== null) {
          const message = `etcd exited with ${spawned.exitCode}: ${stderr}`
          throw stderr.includes("address already in use") ? new PortTaken(message) : new Error(message)
        }
        await new Promise((resolve) => setTimeout(resolve, 50))
      }
      throw new Error(`etcd did not become healthy within 30 s: ${stderr}`)
    })
    yield* Effect.addFinalizer(() =>
      stop.pipe(Effect.zipRight(Effect.sync(() => rmSync(dataDir, { recursive: true, force: true }))))
    )
    if (startNow) yield* start
    return { url, stop, start }
  })

/** A running etcd; started again on other ports when another process took one of its ports first. */
export const etcdServer: Effect.Effect<EtcdServer, never, Scope.Scope> = Effect.gen(function* () {
  for (let attempt = 1; ; attempt++) {
    // Each attempt in its own scope, so a failed one's data dir goes at once.
    const scope = yield* Scope.make()
    const exit = yield* Effect.exit(Scope.extend(makeEtcdServer(true), scope))
    if (Exit.isSuccess(exit)) {
      yield* Effect.addFinalizer(() => Scope.close(scope, Exit.void))
      return exit.value
    }
    yield* Scope.close(scope, exit)
    const portTaken = Option.exists(Cause.dieOption(exit.cause), (defect) => defect instanceof PortTaken)
    if (!portTaken || attempt === 5) return yield* Effect.failCause(exit.cause)
  }
})
export const etcdServerNotStarted: Effect.Effect<EtcdServer, never, Scope.Scope> = makeEtcdServer(false)
