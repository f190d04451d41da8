/**
 * Fixtures of the relay-host tests: a file-discovery document the test rewrites, JSON encoding of
 * records, and bounded waits on the catalog over the real clock.
 */

import { mkdtempSync, renameSync, rmSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { Effect, Either, type Scope, Stream, type SubscriptionRef } from "effect"
import type { KvEventSource } from "../../src/protocol/Discovery.js"
import {
  KvEventSourceJson,
  type ModelCardInstance,
  ModelCardInstanceJson
} from "../../src/protocol/Discovery.js"
import { encodeJson } from "../../src/protocol/Json.js"
import type { DcPoolCatalog } from "../../src/relay/PoolCatalog.js"

const encodeCard = encodeJson(ModelCardInstanceJson)
const encodeSource = encodeJson(KvEventSourceJson)

export interface DiscoveryFile {
  readonly path: string
  /** Replaces the document atomically (new inode, one rename), as careful writers do. */
  readonly write: (
    cards: ReadonlyArray<ModelCardInstance>,
    sources: ReadonlyArray<KvEventSource>
  ) => Effect.Effect<void>
}

/** A discovery document in a temporary directory, removed with the scope. */
export const discoveryFile = (
  cards: ReadonlyArray<ModelCardInstance> = [],
  sources: ReadonlyArray<KvEventSource> = []
): Effect.Effect<DiscoveryFile, never, Scope.Scope> =>
  Effect.gen(function* () {
    const dir = yield* Effect.acquireRelease(
      Effect.sync(() => mkdtempSync(join(tmpdir(), "kvrelay-host-"))),
      (dir) => Effect.sync(() => rmSync(dir, { recursive: true, force: true }))
    )
    const path = join(dir, "discovery.json")
    let writes = 0
    const write = (cards: ReadonlyArray<ModelCardInstance>, sources: ReadonlyArray<KvEventSource>) =>
      Effect.sync(() => {
        const text = JSON.stringify(
          {
            version: 1,
            cards: cards.map((card) => Either.getOrThrow(encodeCard(card))),
            sources: sources.map((source) => Either.getOrThrow(encodeSource(source)))
          },
          null,
          2
        )
        const temp = `${path}.tmp-${writes++}`
        writeFileSync(temp, text)
        renameSync(temp, path)
      })
    yield* write(cards, sources)
    return { path, write }
  })

/**
 * The first catalog (current or later) that satisfies `done`; `each` sees every catalog observed
 * on the way (watchers may coalesce revisions). Fails after `timeoutMs` of real time.
 */
export const awaitCatalog = (
  catalog: SubscriptionRef.SubscriptionRef<DcPoolCatalog>,
  what: string,
  done: (catalog: DcPoolCatalog) => boolean,
  options: { readonly timeoutMs?: number; readonly each?: (catalog: DcPoolCatalog) => void } = {}
): Effect.Effect<DcPoolCatalog> =>
  catalog.changes.pipe(
    Stream.tap((value) => Effect.sync(() => options.each?.(value))),
    Stream.filter(done),
    Stream.runHead,
    Effect.flatMap((head) =>
      head._tag === "Some" ? Effect.succeed(head.value) : Effect.dieMessage(`catalog ended before ${what}`)
    ),
    Effect.timeoutFail({
      duration: `${options.timeoutMs ?? 5000} millis`,
      onTimeout: () => new Error(`timed out waiting for ${what}`)
    }),
    Effect.orDie
  )
