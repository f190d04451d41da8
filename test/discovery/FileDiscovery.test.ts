import { mkdtempSync, renameSync, rmSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import * as NodeFileSystem from "@effect/platform-node/NodeFileSystem"
import { describe, expect, it } from "@effect/vitest"
import { Effect, Either, Exit, Logger, Stream, TestClock } from "effect"
import type { DiscoveryShape, DiscoverySnapshot, DiscoveryStateName } from "../../src/discovery/Discovery.js"
import {
  decodeDiscoveryDocument,
  type FileDiscoveryOptions,
  makeFileDiscovery
} from "../../src/discovery/FileDiscovery.js"
import { LoopFaults, makeLoopFaults, supervisedRestarts } from "../../src/observability/Supervised.js"
import { rawCard, rawSource } from "./fixtures.js"

const document = (cards: ReadonlyArray<unknown>, sources: ReadonlyArray<unknown> = [], extra: object = {}) =>
  JSON.stringify({ version: 1, cards, sources, ...extra }, null, 2)

const tempFile = (content?: string) => {
  const dir = mkdtempSync(join(tmpdir(), "kvrelay-discovery-"))
  const path = join(dir, "discovery.json")
  if (content !== undefined) writeFileSync(path, content)
  return { dir, path }
}

/** Replaces the file the way careful writers do (new inode, one rename). */
const replaceFile = (path: string, content: string) => {
  const temp = `${path}.tmp-${Math.random().toString(36).slice(2)}`
  writeFileSync(temp, content)
  renameSync(temp, path)
}

const withTempDir = <A, E, R>(
  use: (file: { dir: string; path: string }) => Effect.Effect<A, E, R>,
  content?: string
) =>
  Effect.acquireUseRelease(
    Effect.sync(() => tempFile(content)),
    use,
    ({ dir }) => Effect.sync(() => rmSync(dir, { recursive: true, force: true }))
  )

const start = (options: FileDiscoveryOptions) =>
  makeFileDiscovery(options).pipe(Effect.provide(NodeFileSystem.layer))

const collectLogs = () => {
  const lines: Array<string> = []
  const logger = Logger.make(({ message }) => {
    lines.push(Array.isArray(message) ? message.join(" ") : String(message))
  })
  return { lines, layer: Logger.replace(Logger.defaultLogger, logger) }
}

/** Real file I/O completes on its own time; the poll and settle sleeps advance with the test clock. */
const driveUntil = (discovery: DiscoveryShape, done: (snapshot: DiscoverySnapshot) => boolean) =>
  Effect.gen(function* () {
    for (let i = 0; i < 200; i++) {
      const snapshot = yield* discovery.current
      if (done(snapshot)) return snapshot
      yield* TestClock.adjust("250 millis")
      yield* Effect.promise(() => new Promise((resolve) => setTimeout(resolve, 5)))
    }
    return yield* Effect.die(new Error("discovery never reached the expected snapshot"))
  })

const driveUntilStatus = (discovery: DiscoveryShape, state: DiscoveryStateName) =>
  Effect.gen(function* () {
    for (let i = 0; i < 200; i++) {
      const status = yield* discovery.status
      if (status.state === state) return status
      yield* TestClock.adjust("250 millis")
      yield* Effect.promise(() => new Promise((resolve) => setTimeout(resolve, 5)))
    }
    return yield* Effect.die(new Error(`discovery never became ${state}`))
  })

/** With the live clock: wait for a snapshot, polling with a bounded real deadline. */
const waitLive = (
  discovery: DiscoveryShape,
  done: (snapshot: DiscoverySnapshot) => boolean,
  deadlineMs = 5000
) =>
  Effect.gen(function* () {
    const until = Date.now() + deadlineMs
    while (Date.now() < until) {
      const snapshot = yield* discovery.current
      if (done(snapshot)) return snapshot
      yield* Effect.sleep("10 millis")
    }
    return yield* Effect.die(
      new Error(`discovery never reached the expected snapshot within ${deadlineMs} ms`)
    )
  })

const startupMessage = (exit: Exit.Exit<unknown, { readonly message: string }>): string => {
  if (Exit.isSuccess(exit)) throw new Error("expected a startup failure")
  const failure = exit.cause._tag === "Fail" ? exit.cause.error : undefined
  if (failure === undefined) throw new Error(`expected a typed failure, got ${String(exit.cause)}`)
  return failure.message
}

describe("decodeDiscoveryDocument", () => {
  it("decodes cards and sources and keeps unchanged records' identity on the next decode", () => {
    const first = Either.getOrThrow(
      decodeDiscoveryDocument(document([rawCard({ worker: 1 }), rawCard({ worker: 2 })], [rawSource()]))
    )
    expect(first.cards.map((c) => c.instanceId)).toEqual(["1", "2"])
    expect(first.sources[0]!.publisherId).toBe(100n)
    const second = Either.getOrThrow(
      decodeDiscoveryDocument(
        document([rawCard({ worker: 1 }), rawCard({ worker: 2, aliases: ["x"] })], [rawSource()]),
        first
      )
    )
    expect(second.cards[0]).toBe(first.cards[0])
    expect(second.cards[1]).not.toBe(first.cards[1])
    expect(second.sources[0]).toBe(first.sources[0])
  })

  it("names every bad record with its index and identity, and unknown fields by path", () => {
    const bad = { ...rawCard({ worker: 7001 }), card: { ...(rawCard().card as object), foo: 1 } }
    const result = decodeDiscoveryDocument(
      document([rawCard({ worker: 1 }), bad], [{ ...rawSource(), dpRank: -1 }], { extra: true })
    )
    expect(Either.isLeft(result) && result.left.message).toBe('unknown field "extra"')
    const records = decodeDiscoveryDocument(
      document([rawCard({ worker: 1 }), bad], [{ ...rawSource(), dpRank: -1 }])
    )
    expect(Either.isLeft(records) && records.left.problems).toEqual([
      'cards[1] (prod/backend/generate/7001): unknown field "card.foo"',
      "sources[0] (prod.backend.generate/1/-1/100): dpRank: expected a u32, got -1"
    ])
  })

  it("rejects repeated card ids and repeated source keys", () => {
    const result = decodeDiscoveryDocument(
      document([rawCard({ worker: 1 }), rawCard({ worker: 1, aliases: ["a"] })], [rawSource(), rawSource()])
    )
    expect(Either.isLeft(result) && result.left.problems).toEqual([
      "cards[1] repeats card prod/backend/generate/1 of cards[0]",
      "sources[1] repeats source prod.backend.generate/1/0/100 of sources[0]"
    ])
  })

  it("rejects other versions and non-JSON", () => {
    const version = decodeDiscoveryDocument(JSON.stringify({ version: 2, cards: [], sources: [] }))
    expect(Either.isLeft(version) && version.left.message).toBe("version: Expected 1, actual 2")
    const text = decodeDiscoveryDocument("{")
    expect(Either.isLeft(text) && text.left.message).toMatch(/^invalid JSON: /)
  })
})

describe("FileDiscovery", () => {
  it.scoped("a missing initial document fails startup with a clear error", () =>
    withTempDir(({ path }) =>
      Effect.gen(function* () {
        const exit = yield* Effect.exit(start({ path }))
        expect(startupMessage(exit)).toMatch(
          new RegExp(
            `^discovery file:${path.replace(/[.*+?^${}()|[\]\\]/g, "\\$&")}: cannot read the initial document: `
          )
        )
      })
    )
  )

  it.scoped("an invalid initial document fails startup naming what was wrong", () =>
    withTempDir(
      ({ path }) =>
        Effect.gen(function* () {
          const exit = yield* Effect.exit(start({ path }))
          expect(startupMessage(exit)).toBe(
            `discovery file:${path}: the initial document is invalid: cards[0] (prod/backend/generate/1): card.kvCacheBlockSize: expected a u32, got -64`
          )
        }),
      document([rawCard({ blockSize: -64 })])
    )
  )

  it.scoped("publishes the initial document as revision 1", () =>
    withTempDir(
      ({ path }) =>
        Effect.gen(function* () {
          const discovery = yield* start({ path })
          const snapshot = yield* discovery.current
          expect(snapshot.revision).toBe(1n)
          expect(snapshot.cards).toHaveLength(1)
          expect(snapshot.sources).toHaveLength(1)
          expect(snapshot.rejectedSources).toEqual([])
          expect(snapshot.sourceStream).toEqual({ epoch: 0, bound: true })
          expect(discovery.backend).toBe(`file:${path}`)
        }),
      document([rawCard()], [rawSource()])
    )
  )

  it.live("detects a change through the directory watch", () =>
    withTempDir(
      ({ path }) =>
        Effect.gen(function* () {
          // An hour-long poll: only the watch can see the change within the deadline.
          const discovery = yield* start({ path, pollInterval: "1 hour" })
          replaceFile(path, document([rawCard({ worker: 1 }), rawCard({ worker: 2 })]))
          const next = yield* waitLive(discovery, (s) => s.revision === 2n)
          expect(next.cards.map((c) => c.instanceId)).toEqual(["1", "2"])
          // An in-place rewrite (same inode) is seen too.
          writeFileSync(path, document([rawCard({ worker: 3 })]))
          const third = yield* waitLive(discovery, (s) => s.revision === 3n)
          expect(third.cards.map((c) => c.instanceId)).toEqual(["3"])
        }).pipe(Effect.scoped),
      document([rawCard({ worker: 1 })])
    )
  )

  it.scoped("detects a change through the 1 s stat poll when there is no watch", () =>
    withTempDir(
      ({ path }) =>
        Effect.gen(function* () {
          const discovery = yield* start({ path, watch: false })
          replaceFile(path, document([rawCard({ worker: 1 }), rawCard({ worker: 2 })]))
          // Without a clock tick nothing can notice the change.
          yield* Effect.promise(() => new Promise((resolve) => setTimeout(resolve, 50)))
          expect((yield* discovery.current).revision).toBe(1n)
          const next = yield* driveUntil(discovery, (s) => s.revision === 2n)
          expect(next.cards).toHaveLength(2)
        }),
      document([rawCard({ worker: 1 })])
    )
  )

  it.scoped(
    "an invalid update is logged naming the problem and the last valid document stays in force",
    () => {
      const logs = collectLogs()
      return withTempDir(
        ({ path }) =>
          Effect.gen(function* () {
            const discovery = yield* start({ path, watch: false })
            const initial = yield* discovery.current
            const bad = { ...rawCard({ worker: 2 }), card: { ...(rawCard().card as object), colour: "red" } }
            replaceFile(path, document([rawCard({ worker: 1 }), bad]))
            yield* driveUntil(discovery, () =>
              logs.lines.some((line) =>
                line.includes('cards[1] (prod/backend/generate/2): unknown field "card.colour"')
              )
            )
            expect(logs.lines.find((line) => line.includes("colour"))).toBe(
              'invalid discovery file update ignored; the last valid document stays in force: cards[1] (prod/backend/generate/2): unknown field "card.colour"'
            )
            expect(yield* discovery.current).toBe(initial)
            // A deleted file keeps the document too.
            rmSync(path)
            yield* driveUntil(discovery, () => logs.lines.some((line) => line.includes("cannot be read")))
            expect(yield* discovery.current).toBe(initial)
            // The next valid document is applied; the unchanged card keeps its identity.
            replaceFile(path, document([rawCard({ worker: 1 }), rawCard({ worker: 3 })]))
            const next = yield* driveUntil(discovery, (s) => s.revision === 2n)
            expect(next.cards.map((c) => c.instanceId)).toEqual(["1", "3"])
            expect(next.cards[0]).toBe(initial.cards[0])
          }).pipe(Effect.provide(logs.layer)),
        document([rawCard({ worker: 1 })])
      )
    }
  )

  it.scoped("a 100,000-deep document is rejected with a short error and the watch keeps going", () => {
    const logs = collectLogs()
    return withTempDir(
      ({ path }) =>
        Effect.gen(function* () {
          const discovery = yield* start({ path, watch: false })
          const initial = yield* discovery.current
          replaceFile(path, `${"[".repeat(100_000)}${"]".repeat(100_000)}`)
          yield* driveUntil(discovery, () => logs.lines.some((line) => line.includes("nested deeper")))
          expect(logs.lines.find((line) => line.includes("nested deeper"))).toBe(
            "invalid discovery file update ignored; the last valid document stays in force: the value is nested deeper than 64 levels"
          )
          expect(yield* discovery.current).toBe(initial)
          replaceFile(path, document([rawCard({ worker: 1 }), rawCard({ worker: 4 })]))
          const next = yield* driveUntil(discovery, (s) => s.revision === 2n)
          expect(next.cards.map((c) => c.instanceId)).toEqual(["1", "4"])
        }).pipe(Effect.provide(logs.layer)),
      document([rawCard({ worker: 1 })])
    )
  })

  it.scoped(
    "state: live after a good read, stale while invalid or unreadable, live again after a good read",
    () =>
      withTempDir(
        ({ path }) =>
          Effect.gen(function* () {
            const discovery = yield* start({ path, watch: false })
            const initial = yield* discovery.current
            // The test clock starts at 0: the first state dates from the start.
            expect(yield* discovery.status).toEqual({ state: "live", since: new Date(0) })
            yield* TestClock.adjust("10 seconds")
            replaceFile(path, "{")
            const stale = yield* driveUntilStatus(discovery, "stale")
            expect(stale.since.getTime()).toBeGreaterThanOrEqual(10_000)
            // Unreadable is stale too, and not a new change of state.
            rmSync(path)
            yield* TestClock.adjust("5 seconds")
            yield* driveUntilStatus(discovery, "stale")
            replaceFile(path, "{ still not json")
            yield* TestClock.adjust("5 seconds")
            expect((yield* driveUntilStatus(discovery, "stale")).since).toEqual(stale.since)
            expect(yield* discovery.current).toBe(initial)
            // The last valid text again: live, and nothing new to publish.
            replaceFile(path, document([rawCard({ worker: 1 })]))
            const live = yield* driveUntilStatus(discovery, "live")
            expect(live.since.getTime()).toBeGreaterThan(stale.since.getTime())
            expect(yield* discovery.current).toBe(initial)
          }),
        document([rawCard({ worker: 1 })])
      )
  )

  it.scoped("a defect in the reload step is logged and counted; the restarted loop reads the change", () => {
    const logs = collectLogs()
    const faults = makeLoopFaults()
    return withTempDir(
      ({ path }) =>
        Effect.gen(function* () {
          const discovery = yield* start({ path, watch: false })
          const restarts = supervisedRestarts("discovery.file")
          faults.arm("discovery.file")
          replaceFile(path, document([rawCard({ worker: 1 }), rawCard({ worker: 5 })]))
          const next = yield* driveUntil(discovery, (s) => s.revision === 2n)
          expect(next.cards.map((c) => c.instanceId)).toEqual(["1", "5"])
          expect(faults.armed("discovery.file")).toBe(0)
          expect(supervisedRestarts("discovery.file")).toBe(restarts + 1)
          expect(logs.lines).toContain("supervised loop discovery.file failed; restarting it")
          expect((yield* discovery.status).state).toBe("live")
        }).pipe(Effect.provide(logs.layer), Effect.provideService(LoopFaults, faults)),
      document([rawCard({ worker: 1 })])
    )
  })

  it.scoped("a rewrite with the same records publishes nothing; close ends the change stream", () =>
    withTempDir(
      ({ path }) =>
        Effect.gen(function* () {
          const discovery = yield* start({ path, watch: false })
          const initial = yield* discovery.current
          replaceFile(path, JSON.stringify({ version: 1, cards: [rawCard()], sources: [] }))
          yield* TestClock.adjust("1 second")
          yield* Effect.promise(() => new Promise((resolve) => setTimeout(resolve, 50)))
          yield* TestClock.adjust("1 second")
          yield* Effect.promise(() => new Promise((resolve) => setTimeout(resolve, 50)))
          expect(yield* discovery.current).toBe(initial)
          yield* discovery.close
          // A closed service's change stream ends instead of waiting forever.
          yield* discovery.changes.pipe(Stream.runDrain)
        }),
      document([rawCard()])
    )
  )
})
