/**
 * The embedded discovery backend (PROTOCOL.md §2): one JSON document `{version: 1, cards,
 * sources}`, re-read when it changes (a watch on its directory plus a 1 s poll of its stat; the poll
 * and the settle delay go through `Clock`). An invalid update is logged, naming every bad record, and the last valid
 * document stays in force; an unreadable or invalid initial document fails startup.
 *
 * State (`/v1/health` `discovery`): `live` after a good read, `stale` while the file is unreadable
 * or invalid (the last valid document stays in force). Both loops are supervised.
 */

import { watch } from "node:fs"
import { basename, dirname, resolve } from "node:path"
import * as FileSystem from "@effect/platform/FileSystem"
import { Data, Duration, Effect, Either, FiberSet, Layer, Queue, Runtime, Schema, type Scope } from "effect"
import { loopStep, supervised } from "../observability/Supervised.js"
import type { KvEventSource } from "../protocol/Discovery.js"
import { KvEventSourceJson, type ModelCardInstance, ModelCardInstanceJson } from "../protocol/Discovery.js"
import { decodeJson, decodeJsonText } from "../protocol/Json.js"
import {
  Discovery,
  type DiscoveryShape,
  type DiscoverySnapshot,
  DiscoveryStartupError,
  makeSnapshotCell,
  makeStatusCell
} from "./Discovery.js"
import { cardPath, sourceRecordKey } from "./DiscoveryRecords.js"

/** The discovery file's path and how it is watched. */
export interface FileDiscoveryOptions {
  readonly path: string
  /** Stat poll period, the fallback when the watch misses a change (default 1 s). */
  readonly pollInterval?: Duration.DurationInput
  /** Watch the document's directory (default true); without it only the poll detects changes. */
  readonly watch?: boolean
  /** Quiet time after a change signal before reading, so a multi-step write is read once (default 25 ms). */
  readonly settle?: Duration.DurationInput
}

class InvalidDiscoveryDocument extends Data.TaggedError("InvalidDiscoveryDocument")<{
  readonly problems: ReadonlyArray<string>
}> {
  override get message(): string {
    return this.problems.join("; ")
  }
}

/** A decoded document plus, per record, its raw JSON text: the next decode reuses unchanged records. */
interface DecodedDocument {
  readonly cards: ReadonlyArray<ModelCardInstance>
  readonly sources: ReadonlyArray<KvEventSource>
  readonly cardsByRaw: ReadonlyMap<string, ModelCardInstance>
  readonly sourcesByRaw: ReadonlyMap<string, KvEventSource>
}

const DocumentShape = Schema.Struct({
  version: Schema.Literal(1),
  cards: Schema.Array(Schema.Unknown),
  sources: Schema.Array(Schema.Unknown)
})

const decodeShape = decodeJsonText(DocumentShape)
const decodeCard = decodeJson(ModelCardInstanceJson)
const decodeSource = decodeJson(KvEventSourceJson)

/** A short name for a record that failed to decode, from whatever identifying fields it has. */
const rawLabel = (raw: unknown, fields: ReadonlyArray<string>): string => {
  if (typeof raw !== "object" || raw === null) return ""
  const record = raw as Record<string, unknown>
  const parts = fields
    .map((field) => record[field])
    .filter((v) => typeof v === "string" || typeof v === "number")
  return parts.length === 0 ? "" : ` (${parts.join("/")})`
}

/**
 * Decodes the document record by record so each bad record is reported with its index and
 * identity; any problem rejects the whole document. Repeated card ids or source record keys are
 * problems (one key, one record, as in etcd).
 */
export const decodeDiscoveryDocument = (
  text: string,
  previous?: DecodedDocument
): Either.Either<DecodedDocument, InvalidDiscoveryDocument> => {
  const shape = decodeShape(text)
  if (Either.isLeft(shape))
    return Either.left(new InvalidDiscoveryDocument({ problems: [shape.left.message] }))
  const problems: Array<string> = []
  const cards: Array<ModelCardInstance> = []
  const cardsByRaw = new Map<string, ModelCardInstance>()
  const cardIndex = new Map<string, number>()
  shape.right.cards.forEach((raw, i) => {
    const rawText = JSON.stringify(raw)
    let card = previous?.cardsByRaw.get(rawText)
    if (card === undefined) {
      const decoded = decodeCard(raw)
      if (Either.isLeft(decoded)) {
        problems.push(
          `cards[${i}]${rawLabel(raw, ["namespace", "component", "endpoint", "instanceId", "modelSuffix"])}: ${decoded.left.message}`
        )
        return
      }
      card = decoded.right
    }
    const path = cardPath(card)
    const first = cardIndex.get(path)
    if (first !== undefined) {
      problems.push(`cards[${i}] repeats card ${path} of cards[${first}]`)
      return
    }
    cardIndex.set(path, i)
    cardsByRaw.set(rawText, card)
    cards.push(card)
  })
  const sources: Array<KvEventSource> = []
  const sourcesByRaw = new Map<string, KvEventSource>()
  const sourceIndex = new Map<string, number>()
  shape.right.sources.forEach((raw, i) => {
    const rawText = JSON.stringify(raw)
    let source = previous?.sourcesByRaw.get(rawText)
    if (source === undefined) {
      const decoded = decodeSource(raw)
      if (Either.isLeft(decoded)) {
        problems.push(
          `sources[${i}]${rawLabel(raw, ["kvStateEndpoint", "workerId", "dpRank", "publisherId"])}: ${decoded.left.message}`
        )
        return
      }
      source = decoded.right
    }
    const key = sourceRecordKey(source)
    const first = sourceIndex.get(key)
    if (first !== undefined) {
      problems.push(`sources[${i}] repeats source ${key} of sources[${first}]`)
      return
    }
    sourceIndex.set(key, i)
    sourcesByRaw.set(rawText, source)
    sources.push(source)
  })
  if (problems.length > 0) return Either.left(new InvalidDiscoveryDocument({ problems }))
  return Either.right({ cards, sources, cardsByRaw, sourcesByRaw })
}

const sameArray = <A>(a: ReadonlyArray<A>, b: ReadonlyArray<A>): boolean =>
  a.length === b.length && a.every((x, i) => x === b[i])

const toSnapshot = (revision: bigint, document: DecodedDocument): DiscoverySnapshot => ({
  revision,
  cards: document.cards,
  sources: document.sources,
  rejectedSources: [],
  sourceStream: { epoch: 0, bound: true }
})

/** Discovery from a JSON file, read again whenever it changes. */
export const makeFileDiscovery = (
  options: FileDiscoveryOptions
): Effect.Effect<DiscoveryShape, DiscoveryStartupError, FileSystem.FileSystem | Scope.Scope> =>
  Effect.gen(function* () {
    const fs = yield* FileSystem.FileSystem
    const path = resolve(options.path)
    const backend = `file:${path}`
    const pollInterval = Duration.decode(options.pollInterval ?? "1 second")
    const settle = Duration.decode(options.settle ?? "25 millis")

    const signature = fs.stat(path).pipe(
      Effect.map((info) => {
        const mtime = info.mtime._tag === "Some" ? info.mtime.value.getTime() : 0
        const ino = info.ino._tag === "Some" ? info.ino.value : 0
        return `${mtime}:${info.size}:${ino}`
      }),
      Effect.catchAll((error) => Effect.succeed(`unreadable:${error.message}`))
    )

    const signals = yield* Queue.sliding<void>(1)
    if (options.watch ?? true) {
      // Registered before the initial read, so no change after that read can go unseen. The
      // directory, not the file: editors and atomic writers replace the file's inode.
      const name = basename(path)
      const runtime = yield* Effect.runtime<never>()
      yield* Effect.acquireRelease(
        Effect.try(() => {
          const watcher = watch(dirname(path), (_event, file) => {
            if (file === null || basename(String(file)) === name) Queue.unsafeOffer(signals, undefined)
          })
          watcher.on("error", (error) => {
            watcher.close()
            Runtime.runFork(runtime)(
              Effect.logWarning(`discovery file watch failed; relying on the stat poll: ${error.message}`)
            )
          })
          return watcher
        }).pipe(
          Effect.tapError((error) =>
            Effect.logWarning(`discovery file watch unavailable; relying on the stat poll: ${error.message}`)
          ),
          Effect.option
        ),
        (watcher) => Effect.sync(() => (watcher._tag === "Some" ? watcher.value.close() : undefined))
      )
    }
    const initialSignature = yield* signature
    const initialText = yield* fs.readFileString(path).pipe(
      Effect.mapError(
        (error) =>
          new DiscoveryStartupError({
            backend,
            reason: `cannot read the initial document: ${error.message}`
          })
      )
    )
    const initial = decodeDiscoveryDocument(initialText)
    if (Either.isLeft(initial)) {
      return yield* new DiscoveryStartupError({
        backend,
        reason: `the initial document is invalid: ${initial.left.message}`
      })
    }

    let document = initial.right
    let revision = 1n
    let lastText = initialText
    /** Whether `lastText` decoded: an unchanged invalid text stays stale, an unchanged valid one is live. */
    let lastTextValid = true
    let lastSignature = initialSignature
    let lastReadError: string | undefined
    const cell = yield* makeSnapshotCell(toSnapshot(revision, document))
    const status = yield* makeStatusCell("live")
    const setState = (state: "live" | "stale") =>
      status
        .set(state)
        .pipe(
          Effect.flatMap((changed) =>
            changed && state === "live"
              ? Effect.logInfo("discovery file is valid again; following it")
              : Effect.void
          )
        )

    const reload = Effect.gen(function* () {
      yield* loopStep("discovery.file")
      const read = yield* Effect.either(fs.readFileString(path))
      if (Either.isLeft(read)) {
        yield* setState("stale")
        if (lastReadError !== read.left.message) {
          lastReadError = read.left.message
          yield* Effect.logWarning(
            `discovery file cannot be read; the last valid document stays in force: ${read.left.message}`
          )
        }
        return
      }
      lastReadError = undefined
      const text = read.right
      if (text === lastText) return yield* setState(lastTextValid ? "live" : "stale")
      lastText = text
      const decoded = decodeDiscoveryDocument(text, document)
      lastTextValid = Either.isRight(decoded)
      if (Either.isLeft(decoded)) {
        yield* setState("stale")
        yield* Effect.logWarning(
          `invalid discovery file update ignored; the last valid document stays in force: ${decoded.left.message}`
        )
        return
      }
      yield* setState("live")
      // Unchanged record arrays keep their identity, so consumers skip them by reference.
      const cardsSame = sameArray(decoded.right.cards, document.cards)
      const sourcesSame = sameArray(decoded.right.sources, document.sources)
      const next: DecodedDocument = {
        ...decoded.right,
        cards: cardsSame ? document.cards : decoded.right.cards,
        sources: sourcesSame ? document.sources : decoded.right.sources
      }
      document = next
      if (cardsSame && sourcesSame) return
      revision += 1n
      yield* cell.publish(toSnapshot(revision, document))
      yield* Effect.logInfo("discovery file reloaded").pipe(
        Effect.annotateLogs({
          revision: String(revision),
          cards: document.cards.length,
          sources: document.sources.length
        })
      )
    }).pipe(Effect.withSpan("discovery.file.reload", { attributes: { "discovery.path": path } }))

    const fibers = yield* FiberSet.make()
    const run = FiberSet.run(fibers)

    // Signals coalesce in the sliding queue; after the quiet time one read sees the settled file.
    // A restart reads once first: the step that died may have taken the only signal of a change.
    let readerRuns = 0
    yield* run(
      supervised(
        "discovery.file",
        Effect.suspend(() => (readerRuns++ === 0 ? Effect.void : Queue.offer(signals, undefined))).pipe(
          Effect.zipRight(
            Effect.forever(
              Queue.take(signals).pipe(
                Effect.zipRight(Effect.sleep(settle)),
                Effect.zipRight(Queue.takeAll(signals)),
                Effect.zipRight(reload)
              )
            )
          )
        )
      )
    )

    yield* run(
      supervised(
        "discovery.file-poll",
        Effect.forever(
          Effect.sleep(pollInterval).pipe(
            Effect.zipRight(signature),
            Effect.flatMap((current) => {
              if (current === lastSignature) return Effect.void
              lastSignature = current
              return Queue.offer(signals, undefined)
            })
          )
        )
      )
    )

    const close = FiberSet.clear(fibers).pipe(Effect.zipRight(cell.closed.open))
    yield* Effect.addFinalizer(() => cell.closed.open)
    yield* Effect.logInfo("file discovery started").pipe(
      Effect.annotateLogs({ cards: document.cards.length, sources: document.sources.length })
    )
    return { backend, status: status.get, current: cell.current, changes: cell.changes, close }
  }).pipe(Effect.annotateLogs({ component: "discovery", backend: `file:${options.path}` }))

/** `makeFileDiscovery` as the `Discovery` service. */
export const fileDiscoveryLayer = (
  options: FileDiscoveryOptions
): Layer.Layer<Discovery, DiscoveryStartupError, FileSystem.FileSystem> =>
  Layer.scoped(Discovery, makeFileDiscovery(options))
