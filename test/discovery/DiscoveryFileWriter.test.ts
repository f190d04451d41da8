/**
 * The file backend's writing side (what `kvrelay simulate --discovery-file` keeps): on a real
 * file system, read back by the file backend's own reader. A worker's advertisement is put,
 * replaced (a new publisher id), withdrawn with its scope; the writer starts from an empty
 * document whatever was there and empties it when it closes; no temporary file is left behind.
 */

import { mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import * as NodeFileSystem from "@effect/platform-node/NodeFileSystem"
import { describe, expect, it } from "@effect/vitest"
import { Effect, Either, Exit, Logger, LogLevel, Scope } from "effect"
import { makeDiscoveryFileWriter } from "../../src/discovery/DiscoveryFileWriter.js"
import { decodeDiscoveryDocument, makeFileDiscovery } from "../../src/discovery/FileDiscovery.js"

const examples = join(import.meta.dirname, "..", "..", "examples", "discovery")
const vllm = Either.getOrThrow(decodeDiscoveryDocument(readFileSync(join(examples, "vllm.json"), "utf8")))
const dynamo = Either.getOrThrow(decodeDiscoveryDocument(readFileSync(join(examples, "dynamo.json"), "utf8")))

const tempDirectory = Effect.acquireRelease(
  Effect.sync(() => mkdtempSync(join(tmpdir(), "kvrelay-writer-"))),
  (dir) => Effect.sync(() => rmSync(dir, { recursive: true, force: true }))
)

/** The document on disk as the relay's file backend decodes it. */
const onDisk = (path: string) => {
  const document = Either.getOrThrow(decodeDiscoveryDocument(readFileSync(path, "utf8")))
  return {
    workers: document.cards.map((c) => c.instanceId).sort(),
    publishers: document.sources.map((s) => String(s.publisherId)).sort()
  }
}

describe("DiscoveryFileWriter", () => {
  it.scoped("starts empty over whatever was there, puts, replaces and withdraws workers atomically", () =>
    Effect.gen(function* () {
      const dir = yield* tempDirectory
      const path = join(dir, "discovery.json")
      writeFileSync(path, "left over from a crashed run")
      const writerScope = yield* Scope.make()
      const writer = yield* makeDiscoveryFileWriter(path).pipe(
        Effect.provide(NodeFileSystem.layer),
        Scope.extend(writerScope)
      )
      expect(onDisk(path)).toEqual({ workers: [], publishers: [] })

      yield* writer.put("8001", vllm)
      expect(onDisk(path)).toEqual({ workers: ["8001"], publishers: ["80010", "80011"] })

      // A worker's scope: its records last as long as it does.
      const workerScope = yield* Scope.make()
      yield* writer.advertise("dynamo", dynamo).pipe(Scope.extend(workerScope))
      const withDynamo = onDisk(path)
      expect(withDynamo.workers).toEqual(["8001", ...dynamo.cards.map((c) => c.instanceId)].sort())

      // A restart with a new publisher id replaces the worker's records; it is not added twice.
      const restarted = {
        cards: vllm.cards,
        sources: vllm.sources.map((s) => ({ ...s, publisherId: s.publisherId + 100n }))
      }
      yield* writer.put("8001", restarted)
      expect(onDisk(path).publishers).toContain("80110")
      expect(onDisk(path).publishers).not.toContain("80010")
      expect(onDisk(path).workers.filter((w) => w === "8001")).toHaveLength(1)

      yield* Scope.close(workerScope, Exit.void)
      expect(onDisk(path)).toEqual({ workers: ["8001"], publishers: ["80110", "80111"] })

      yield* writer.remove("8001")
      expect(onDisk(path)).toEqual({ workers: [], publishers: [] })
      yield* writer.put("8001", vllm)
      expect(readdirSync(dir)).toEqual(["discovery.json"])

      // Closing the writer empties the document: a relay withdraws the pools, and one that
      // starts later still finds a valid document.
      yield* Scope.close(writerScope, Exit.void)
      expect(onDisk(path)).toEqual({ workers: [], publishers: [] })
      expect(readdirSync(dir)).toEqual(["discovery.json"])
    })
  )

  it.live("a relay's file backend follows what the writer puts", () =>
    Effect.gen(function* () {
      const dir = yield* tempDirectory
      const path = join(dir, "discovery.json")
      const writer = yield* makeDiscoveryFileWriter(path)
      const discovery = yield* makeFileDiscovery({ path, pollInterval: "50 millis" })
      expect((yield* discovery.current).cards).toEqual([])
      yield* writer.put("8001", vllm)
      const deadline = Date.now() + 20_000
      for (;;) {
        const snapshot = yield* discovery.current
        if (snapshot.sources.length === 2) break
        if (Date.now() > deadline) throw new Error("the reader never saw the written document")
        yield* Effect.sleep("20 millis")
      }
      expect((yield* discovery.current).cards.map((c) => c.instanceId)).toEqual(["8001"])
    }).pipe(
      Effect.scoped,
      Effect.provide(NodeFileSystem.layer),
      Effect.provide(Logger.minimumLogLevel(LogLevel.Warning))
    )
  )
})
