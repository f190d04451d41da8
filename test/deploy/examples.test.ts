/**
 * Every file in examples/ is something a user copies: it must work as shipped. Discovery
 * documents decode through the file backend's own decoder and a relay serving them lists the
 * pools they describe; engine configs use the engines' real field names and agree with their
 * source records; config files load through the CLI's settings; the etcd registration scripts
 * run against a real etcd (skipped without one) and a relay sees what they register and sees it
 * go when they stop.
 */

import { type ChildProcess, execFileSync, spawn } from "node:child_process"
import { readdirSync, readFileSync } from "node:fs"
import { join } from "node:path"
import * as NodeFileSystem from "@effect/platform-node/NodeFileSystem"
import { describe, expect, it } from "@effect/vitest"
import { type Context, Effect, Either, Logger, LogLevel } from "effect"
import {
  GlobalSettings,
  globalCommand,
  loadSettings,
  RelaySettings,
  relayCommand,
  relayDiscoveryConfig
} from "../../src/cli/settings.js"
import { Discovery } from "../../src/discovery/Discovery.js"
import { makeEtcdDiscovery } from "../../src/discovery/EtcdDiscovery.js"
import { decodeDiscoveryDocument, makeFileDiscovery } from "../../src/discovery/FileDiscovery.js"
import { KvEventSourceJson, ModelCardInstanceJson } from "../../src/protocol/Discovery.js"
import { decodeJson } from "../../src/protocol/Json.js"
import type { KvDcRelayService } from "../../src/relay/KvDcRelay.js"
import * as RelayHost from "../../src/relay/RelayHost.js"
import { makeZmqEventTransport } from "../../src/transport/ZmqEventTransport.js"
import { etcdServer, IN_CI, skipEtcd, skipped } from "../integration/etcdHelpers.js"
import { awaitCatalog } from "../relay/hostFixtures.js"

const root = join(import.meta.dirname, "..", "..")
const examples = join(root, "examples")
const read = (path: string): string => readFileSync(join(examples, path), "utf8")
const readJson = (path: string): Record<string, unknown> => JSON.parse(read(path)) as Record<string, unknown>

const discoveryDocuments = readdirSync(join(examples, "discovery")).filter((f) => f.endsWith(".json"))
const decodeSource = decodeJson(KvEventSourceJson)
const decodeCard = decodeJson(ModelCardInstanceJson)
const quiet = Logger.minimumLogLevel(LogLevel.Warning)

/** Which tool is on PATH (etcdctl and jq for the shell registration script). */
const onPath = (tool: string): boolean => {
  try {
    execFileSync("sh", ["-c", `command -v ${tool}`], { stdio: "ignore" })
    return true
  } catch {
    return false
  }
}

/** The relay host over a discovery backend, with no workers running: pools come from cards alone. */
const relayOver = (discovery: Context.Tag.Service<typeof Discovery>) =>
  RelayHost.make({
    dcName: "examples",
    drtInstanceId: 5n,
    expectedUniqueBlocks: 4096,
    eventTransport: makeZmqEventTransport()
  }).pipe(Effect.provideService(Discovery, discovery), Effect.orDie)

/** `model` or `model → base (adapter)` per registration of every pool, sorted. */
const registrations = (relay: KvDcRelayService) =>
  Effect.map(relay.catalogRef.get, (catalog) =>
    catalog.pools
      .flatMap((pool) =>
        pool.registrations.map((r) =>
          r.target._tag === "Lora"
            ? `${pool.servingEndpoint} ${r.model} → ${r.target.baseModel} (${r.target.adapter})`
            : `${pool.servingEndpoint} ${r.model}`
        )
      )
      .sort()
  )

describe("examples/discovery", () => {
  it("holds the three documents the docs point to", () => {
    expect(discoveryDocuments.sort()).toEqual(["dynamo.json", "lora.json", "vllm.json"])
  })

  for (const file of discoveryDocuments) {
    it(`${file} decodes through the file backend's decoder`, () => {
      const decoded = decodeDiscoveryDocument(read(join("discovery", file)))
      expect(Either.isRight(decoded), JSON.stringify(Either.isLeft(decoded) ? decoded.left : "")).toBe(true)
      const document = Either.getOrThrow(decoded)
      expect(document.cards.length).toBeGreaterThan(0)
      expect(document.sources.length).toBeGreaterThan(0)
    })
  }

  it("vllm.json: each data-parallel rank on its own ports, as vLLM offsets them (base + rank)", () => {
    const document = Either.getOrThrow(decodeDiscoveryDocument(read("discovery/vllm.json")))
    const ports = document.sources.map((s) => {
      if (s.transport.kind !== "engine-zmq") throw new Error("expected engine-zmq")
      return [
        s.dpRank,
        Number(s.transport.endpoint.split(":").at(-1)),
        Number(s.transport.replayEndpoint?.split(":").at(-1))
      ]
    })
    expect(ports).toEqual([
      [0, 5557, 5600],
      [1, 5558, 5601]
    ])
    expect(document.cards[0]!.card.runtimeConfig.dataParallelSize).toBe(2)
  })

  it.live("a relay serving each document lists its pools and registrations (LoRA included)", () =>
    Effect.gen(function* () {
      const expected: Record<string, ReadonlyArray<string>> = {
        "dynamo.json": ["prod.backend.generate llama-3-8b"],
        "lora.json": [
          "prod.vllm.generate llama-3-8b",
          "prod.vllm.generate llama-3-8b-tenant-a → llama-3-8b (tenant-a)"
        ],
        "vllm.json": ["prod.vllm.generate llama-3-8b"]
      }
      for (const file of discoveryDocuments) {
        const seen = yield* Effect.scoped(
          Effect.gen(function* () {
            const discovery = yield* makeFileDiscovery({ path: join(examples, "discovery", file) }).pipe(
              Effect.provide(NodeFileSystem.layer),
              Effect.orDie
            )
            const relay = yield* relayOver(discovery)
            yield* awaitCatalog(relay.catalogRef, `the pools of ${file}`, (c) => c.pools.length > 0, {
              timeoutMs: 20_000
            })
            return yield* registrations(relay)
          })
        )
        expect(seen, file).toEqual(expected[file])
      }
    }).pipe(Effect.provide(quiet))
  )
})

describe("examples/engines", () => {
  // Field names and defaults as vLLM's KVEventsConfig (vllm/config/kv_events.py) and SGLang's
  // (python/sglang/srt/disaggregation/kv_events.py) define them.
  const VLLM_FIELDS = [
    "enable_kv_cache_events",
    "publisher",
    "endpoint",
    "replay_endpoint",
    "buffer_steps",
    "hwm",
    "max_queue_size",
    "topic"
  ]
  const SGLANG_FIELDS = VLLM_FIELDS.filter((f) => f !== "enable_kv_cache_events")

  for (const [engine, fields] of [
    ["vllm", VLLM_FIELDS],
    ["sglang", SGLANG_FIELDS]
  ] as const) {
    it(`${engine}: the --kv-events-config uses the engine's own fields and matches its source record`, () => {
      const config = readJson(`engines/${engine}-kv-events.json`)
      for (const key of Object.keys(config)) expect(fields, `${engine} field ${key}`).toContain(key)
      expect(config["publisher"]).toBe("zmq")
      if (engine === "vllm") expect(config["enable_kv_cache_events"]).toBe(true)
      // Both engines bind only an endpoint with a wildcard host (SGLang connects otherwise).
      expect(config["endpoint"]).toMatch(/^tcp:\/\/\*:\d+$/)
      expect(config["replay_endpoint"]).toMatch(/^tcp:\/\/\*:\d+$/)

      const source = Either.getOrThrow(decodeSource(readJson(`engines/${engine}-source.json`)))
      expect(source.transport.kind).toBe("engine-zmq")
      if (source.transport.kind !== "engine-zmq") return
      const port = (endpoint: unknown) => String(endpoint).split(":").at(-1)
      expect(port(source.transport.endpoint)).toBe(port(config["endpoint"]))
      expect(port(source.transport.replayEndpoint)).toBe(port(config["replay_endpoint"]))
      expect(source.transport.topic).toBe(config["topic"])
      expect(source.recoveryTarget).toBeNull()
    })

    it(`${engine}: the card is the worker of the source record, with the engine's block size`, () => {
      const card = Either.getOrThrow(decodeCard(readJson(`engines/${engine}-card.json`)))
      const source = Either.getOrThrow(decodeSource(readJson(`engines/${engine}-source.json`)))
      expect(`${card.namespace}.${card.component}.${card.endpoint}`).toBe(source.kvStateEndpoint.toString())
      expect(card.instanceId).toBe(source.workerId)
      // vLLM's --block-size and SGLang's --page-size as the docs start them.
      expect(card.card.kvCacheBlockSize).toBe(16)
      expect(card.card.runtimeConfig.dataParallelSize).toBe(1)
      // Together they are a document the file backend takes.
      const document = {
        version: 1,
        cards: [readJson(`engines/${engine}-card.json`)],
        sources: [readJson(`engines/${engine}-source.json`)]
      }
      expect(Either.isRight(decodeDiscoveryDocument(JSON.stringify(document)))).toBe(true)
    })
  }
})

describe("examples config files", () => {
  it("relay-config.json loads as kvrelay relay --config", () => {
    const settings = loadSettings(relayCommand, RelaySettings, {
      argv: ["--config", "relay-config.json"],
      env: {},
      readFile: read
    })
    expect(Either.isRight(settings), JSON.stringify(settings)).toBe(true)
    const relay = Either.getOrThrow(settings)
    expect(relay.dcId).toBe("us-east")
    expect(Either.getOrThrow(relayDiscoveryConfig(relay)).backend._tag).toBe("Etcd")
  })

  it("global-config.json loads as kvrelay global --config", () => {
    const settings = loadSettings(globalCommand, GlobalSettings, {
      argv: ["--config", "global-config.json"],
      env: {},
      readFile: read
    })
    expect(Either.isRight(settings), JSON.stringify(settings)).toBe(true)
    expect(Either.getOrThrow(settings).relay).toHaveLength(2)
  })
})

/** A child process and a promise of its first stdout line matching `pattern`. */
const start = (command: string, args: ReadonlyArray<string>, env: Record<string, string> = {}) => {
  const child: ChildProcess = spawn(command, args, {
    cwd: root,
    env: { ...process.env, ...env },
    stdio: ["ignore", "pipe", "pipe"]
  })
  let stdout = ""
  let stderr = ""
  child.stdout!.setEncoding("utf8").on("data", (chunk: string) => {
    stdout += chunk
  })
  child.stderr!.setEncoding("utf8").on("data", (chunk: string) => {
    stderr += chunk
  })
  const exited = new Promise<number | null>((resolve) => child.on("close", (code) => resolve(code)))
  const line = (pattern: RegExp, timeoutMs: number) =>
    new Promise<string>((resolve, reject) => {
      const timer = setTimeout(
        () => reject(new Error(`no ${pattern} within ${timeoutMs} ms: ${stdout}${stderr}`)),
        timeoutMs
      )
      const check = () => {
        const found = stdout.split("\n").find((l) => pattern.test(l))
        if (found !== undefined) {
          clearTimeout(timer)
          resolve(found)
        } else if (child.exitCode !== null) {
          clearTimeout(timer)
          reject(new Error(`exited ${child.exitCode} before ${pattern}: ${stdout}${stderr}`))
        } else setTimeout(check, 20)
      }
      check()
    })
  return { child, exited, line, output: () => stdout + stderr }
}

describe("examples/etcd-register.*", () => {
  it("both scripts are valid as they are", () => {
    execFileSync("bash", ["-n", join(examples, "etcd-register.sh")])
    execFileSync(process.execPath, ["--check", join(examples, "etcd-register.mjs")])
  })

  const PREFIX = "/kvrelay-examples/v1"
  const scripts = [
    { name: "etcd-register.mjs", available: true },
    { name: "etcd-register.sh", available: onPath("etcdctl") && onPath("jq") }
  ]
  for (const script of scripts) {
    // In CI the tools are required: a missing one fails the test instead of skipping it.
    const skipTools = !script.available && !IN_CI
    const why = skipEtcd ? skipped : skipTools ? " (skipped: etcdctl or jq not found)" : ""
    it.live.skipIf(skipEtcd || skipTools)(
      `${script.name} registers a worker under a lease; the relay sees it, and sees it go on SIGTERM${why}`,
      () =>
        Effect.gen(function* () {
          if (!script.available)
            return yield* Effect.die(
              new Error(
                "etcdctl or jq not found on PATH: CI runs this test and needs them; .ci/run installs etcd-client and jq with apt-get"
              )
            )
          const server = yield* etcdServer
          const discovery = yield* makeEtcdDiscovery({ endpoints: [server.url], prefix: PREFIX }).pipe(
            Effect.orDie
          )
          const relay = yield* relayOver(discovery)
          // The shell script takes one record per file, as examples/README.md runs it.
          const run =
            script.name === "etcd-register.mjs"
              ? start(process.execPath, [
                  join(examples, script.name),
                  "--etcd",
                  server.url,
                  "--prefix",
                  PREFIX,
                  "--ttl",
                  "60",
                  join(examples, "discovery", "vllm.json")
                ])
              : start(
                  "bash",
                  [
                    join(examples, script.name),
                    join(examples, "engines", "vllm-card.json"),
                    join(examples, "engines", "vllm-source.json")
                  ],
                  { ETCDCTL_ENDPOINTS: server.url, KVRELAY_ETCD_PREFIX: PREFIX, LEASE_TTL: "60" }
                )
          yield* Effect.addFinalizer(() => Effect.sync(() => run.child.kill("SIGKILL")))
          yield* Effect.promise(() => run.line(/registered/, 30_000))
          const catalog = yield* awaitCatalog(
            relay.catalogRef,
            "the registered pool",
            (c) => c.pools.length === 1,
            {
              timeoutMs: 20_000
            }
          )
          expect(catalog.pools[0]!.servingEndpoint.toString()).toBe("prod.vllm.generate")
          expect(yield* registrations(relay)).toEqual(["prod.vllm.generate llama-3-8b"])

          run.child.kill("SIGTERM")
          expect(yield* Effect.promise(() => run.exited), run.output()).toBe(0)
          // The lease was revoked: the records go at once, well before the 60 s TTL.
          yield* awaitCatalog(relay.catalogRef, "the pool withdrawn", (c) => c.pools.length === 0, {
            timeoutMs: 30_000
          })
        }).pipe(Effect.scoped, Effect.provide(quiet)),
      120_000
    )
  }
})
