/**
 * The writing side of the file backend (PROTOCOL.md §2): one process keeps a discovery document
 * `{version: 1, cards, sources}` current for the relays that read it. Each writer of records
 * (a worker) owns a slot; putting a slot replaces what that writer advertised before (a restart
 * with a new publisher id, a changed endpoint), and the whole document is rewritten atomically:
 * a temporary file in the same directory, then a rename over the document, so a relay never reads
 * half a document. When the writer's scope closes the document is rewritten empty, as an etcd
 * lease's revocation withdraws its records: relays withdraw the pools, and a relay that starts
 * later still finds a valid document.
 */

import * as FileSystem from "@effect/platform/FileSystem"
import { Data, Effect, Either, type Scope } from "effect"
import type { KvEventSource } from "../protocol/Discovery.js"
import { KvEventSourceJson, type ModelCardInstance, ModelCardInstanceJson } from "../protocol/Discovery.js"
import { encodeJson } from "../protocol/Json.js"

/** The discovery file could not be written; `path` names it. */
export class DiscoveryFileWriteError extends Data.TaggedError("DiscoveryFileWriteError")<{
  readonly path: string
  readonly reason: string
}> {
  override get message(): string {
    return `cannot write the discovery document ${this.path}: ${this.reason}`
  }
}

/** What one writer advertises: its model cards and its ranks' sources. */
interface AdvertisedRecords {
  readonly cards: ReadonlyArray<ModelCardInstance>
  readonly sources: ReadonlyArray<KvEventSource>
}

/** Writes the discovery file atomically (simulators and tests register through it). */
export interface DiscoveryFileWriter {
  readonly path: string
  /** Sets `slot`'s records, replacing the ones it had; the document is rewritten. */
  readonly put: (slot: string, records: AdvertisedRecords) => Effect.Effect<void, DiscoveryFileWriteError>
  /** Withdraws `slot`'s records; the document is rewritten. */
  readonly remove: (slot: string) => Effect.Effect<void, DiscoveryFileWriteError>
  /**
   * Puts `slot`'s records for as long as the calling scope is open and withdraws them when it
   * closes (a worker's lifetime).
   */
  readonly advertise: (
    slot: string,
    records: AdvertisedRecords
  ) => Effect.Effect<void, DiscoveryFileWriteError, Scope.Scope>
}

const encodeCard = encodeJson(ModelCardInstanceJson)
const encodeSource = encodeJson(KvEventSourceJson)

/**
 * Writes an empty document at once (so a relay started beside this process finds a valid one),
 * keeps it current, and empties it when the scope closes. Any previous content is replaced: the
 * document belongs to this writer.
 */
export const makeDiscoveryFileWriter = (
  path: string
): Effect.Effect<DiscoveryFileWriter, DiscoveryFileWriteError, FileSystem.FileSystem | Scope.Scope> =>
  Effect.gen(function* () {
    const fs = yield* FileSystem.FileSystem
    const slots = new Map<string, AdvertisedRecords>()
    // One write at a time, each of the whole current document: the last rename is the newest.
    const lock = yield* Effect.makeSemaphore(1)
    let writes = 0

    const documentText = (): Either.Either<string, string> => {
      const cards: Array<unknown> = []
      const sources: Array<unknown> = []
      for (const records of slots.values()) {
        for (const card of records.cards) {
          const encoded = encodeCard(card)
          if (Either.isLeft(encoded)) return Either.left(encoded.left.message)
          cards.push(encoded.right)
        }
        for (const source of records.sources) {
          const encoded = encodeSource(source)
          if (Either.isLeft(encoded)) return Either.left(encoded.left.message)
          sources.push(encoded.right)
        }
      }
      return Either.right(`${JSON.stringify({ version: 1, cards, sources }, null, 2)}\n`)
    }

    const write = lock
      .withPermits(1)(
        Effect.gen(function* () {
          const text = documentText()
          if (Either.isLeft(text)) return yield* new DiscoveryFileWriteError({ path, reason: text.left })
          // Beside the document, so the rename is atomic (one file system).
          const temporary = `${path}.${process.pid}.${writes++}.tmp`
          yield* fs.writeFileString(temporary, text.right).pipe(
            Effect.zipRight(fs.rename(temporary, path)),
            Effect.tapError(() => fs.remove(temporary).pipe(Effect.ignore)),
            Effect.mapError((error) => new DiscoveryFileWriteError({ path, reason: error.message }))
          )
          yield* Effect.logDebug("discovery document written").pipe(
            Effect.annotateLogs({ path, workers: slots.size })
          )
        })
      )
      .pipe(Effect.withSpan("discovery.file.write", { attributes: { "discovery.path": path } }))

    const put = (slot: string, records: AdvertisedRecords) =>
      Effect.suspend(() => {
        slots.set(slot, records)
        return write
      })
    const remove = (slot: string) => Effect.suspend(() => (slots.delete(slot) ? write : Effect.void))

    yield* write
    yield* Effect.addFinalizer(() =>
      Effect.suspend(() => {
        slots.clear()
        return write
      }).pipe(
        Effect.catchAll((error) =>
          Effect.logWarning("could not empty the discovery document on exit").pipe(
            Effect.annotateLogs({ path, problem: error.reason })
          )
        )
      )
    )
    return {
      path,
      put,
      remove,
      advertise: (slot, records) =>
        Effect.acquireRelease(put(slot, records), () =>
          remove(slot).pipe(
            Effect.catchAll((error) =>
              Effect.logWarning("could not withdraw a worker from the discovery document").pipe(
                Effect.annotateLogs({ path, worker: slot, problem: error.reason })
              )
            )
          )
        )
    }
  })
