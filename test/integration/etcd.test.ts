/**
 * The etcd backend against a real etcd server started by the test on free loopback ports with a
 * temporary data directory. Without an etcd binary the tests report themselves skipped.
 */

import { describe, expect, it } from "@effect/vitest"
import { Effect, Either, Exit, Scope } from "effect"
import { Etcd3 } from "etcd3"
import type { DiscoveryShape, DiscoverySnapshot } from "../../src/discovery/Discovery.js"
import {
  cardKey,
  makeEtcdDiscovery,
  makeEtcdRegistrar,
  sourceKey
} from "../../src/discovery/EtcdDiscovery.js"
import { encodeJsonText, ModelCardInstanceJson } from "../../src/domain/json.js"
import { card, rawSource, source } from "../discovery/fixtures.js"
import { etcdBinary, etcdServer, freePort, skipped } from "./etcdHelpers.js"

const PREFIX = "/kvrelay-test/v1"

/** Real servers keep their own time: poll the snapshot with a bounded real deadline. */
const waitFor = (
  discovery: DiscoveryShape,
  what: string,
  done: (snapshot: DiscoverySnapshot) => boolean,
  deadlineMs = 8000
) =>
  Effect.gen(function* () {
    const until = Date.now() + deadlineMs
    while (Date.now() < until) {
      const snapshot = yield* discovery.current
      if (done(snapshot)) return snapshot
      yield* Effect.sleep("20 millis")
    }
    const last = yield* discovery.current
    return yield* Effect.die(
      new Error(
        `etcd discovery never showed ${what} within ${deadlineMs} ms (last: ${last.cards.length} cards, ${last.sources.length} sources, stream ${JSON.stringify(last.sourceStream)})`
      )
    )
  })

const rawClient = (url: string) =>
  Effect.acquireRelease(
    Effect.sync(() => new Etcd3({ hosts: url })),
    (client) => Effect.sync(() => client.close())
  )

const llama = card({ endpoint: "prod.backend.generate", worker: 7001, aliases: ["chat"] })
const llamaSource = source({
  endpoint: "prod.backend.generate",
  worker: 7001,
  rank: 0,
  publisher: "123456789"
})

describe("etcd discovery (real etcd)", () => {
  it.live.skipIf(etcdBinary === undefined)(
    `registered records appear, and disappear when the lease is revoked${skipped}`,
    () =>
      Effect.gen(function* () {
        const server = yield* etcdServer
        const discovery = yield* makeEtcdDiscovery({ endpoints: [server.url], prefix: PREFIX })
        expect((yield* discovery.current).cards).toEqual([])
        const registrarScope = yield* Scope.make()
        const registrar = yield* makeEtcdRegistrar({
          endpoints: [server.url],
          prefix: PREFIX,
          ttlSeconds: 10
        }).pipe(Scope.extend(registrarScope))
        yield* registrar.registerCard(llama).pipe(Scope.extend(registrarScope))
        yield* registrar.registerSource(llamaSource).pipe(Scope.extend(registrarScope))
        const seen = yield* waitFor(
          discovery,
          "the card and the source",
          (s) => s.cards.length === 1 && s.sources.length === 1
        )
        expect(seen.cards[0]).toEqual(llama)
        expect(seen.sources[0]).toEqual(llamaSource)
        expect(seen.sourceStream).toEqual({ epoch: 0, bound: true })
        yield* Scope.close(registrarScope, Exit.void)
        yield* waitFor(
          discovery,
          "no records after revocation",
          (s) => s.cards.length === 0 && s.sources.length === 0
        )
      }).pipe(Effect.scoped)
  )

  it.live.skipIf(etcdBinary === undefined)(`records of an expired lease disappear${skipped}`, () =>
    Effect.gen(function* () {
      const server = yield* etcdServer
      const discovery = yield* makeEtcdDiscovery({ endpoints: [server.url], prefix: PREFIX })
      const registrar = yield* makeEtcdRegistrar({ endpoints: [server.url], prefix: PREFIX, ttlSeconds: 1 })
      yield* registrar.registerCard(llama)
      yield* waitFor(discovery, "the card", (s) => s.cards.length === 1)
      // No more keep-alives: etcd expires the lease after its (minimum) TTL, about 2 s.
      yield* registrar.releaseLease
      const started = Date.now()
      yield* waitFor(discovery, "the card expiring", (s) => s.cards.length === 0, 6000)
      expect(Date.now() - started).toBeGreaterThan(500)
    }).pipe(Effect.scoped)
  )

  it.live.skipIf(etcdBinary === undefined)(
    `invalid values and keys that disagree with their values are ignored${skipped}`,
    () =>
      Effect.gen(function* () {
        const server = yield* etcdServer
        const client = yield* rawClient(server.url)
        const cardText = Either.getOrThrow(encodeJsonText(ModelCardInstanceJson)(llama))
        yield* Effect.promise(() => client.put(cardKey(PREFIX, llama)).value(cardText).exec())
        // A card stored under another worker's key, a card that is not JSON, a stray key.
        yield* Effect.promise(() =>
          client.put(`${PREFIX}/cards/prod/backend/generate/9`).value(cardText).exec()
        )
        yield* Effect.promise(() => client.put(`${PREFIX}/cards/prod/backend/generate/10`).value("{").exec())
        yield* Effect.promise(() => client.put(`${PREFIX}/other`).value("x").exec())
        const discovery = yield* makeEtcdDiscovery({ endpoints: [server.url], prefix: PREFIX })
        expect((yield* discovery.current).cards).toEqual([llama])
        // A source with an unknown field and a source whose key names another publisher.
        const badSource = JSON.stringify({ ...rawSource({ worker: 7001, publisher: 5 }), extra: 1 })
        yield* Effect.promise(() =>
          client.put(`${PREFIX}/sources/prod.backend.generate/7001/0/5`).value(badSource).exec()
        )
        const misKeyed = JSON.stringify(rawSource({ worker: 7001, publisher: 6 }))
        yield* Effect.promise(() =>
          client.put(`${PREFIX}/sources/prod.backend.generate/7001/0/7`).value(misKeyed).exec()
        )
        const good = JSON.stringify(rawSource({ worker: 7001, publisher: 8 }))
        yield* Effect.promise(() =>
          client.put(`${PREFIX}/sources/prod.backend.generate/7001/0/8`).value(good).exec()
        )
        const snapshot = yield* waitFor(
          discovery,
          "one valid source",
          (s) => s.sources.length === 1 && s.rejectedSources.length === 2
        )
        expect(snapshot.sources.map((s) => s.publisherId)).toEqual([8n])
        expect(snapshot.rejectedSources.map((r) => [r.recordKey, r.publisherId, r.reason])).toEqual([
          ["prod.backend.generate/7001/0/5", 5n, 'unknown field "extra"'],
          [
            "prod.backend.generate/7001/0/7",
            7n,
            `its value belongs at ${PREFIX}/sources/prod.backend.generate/7001/0/6`
          ]
        ])
        expect(snapshot.cards).toEqual([llama])
        expect(sourceKey(PREFIX, snapshot.sources[0]!)).toBe(
          `${PREFIX}/sources/prod.backend.generate/7001/0/8`
        )
      }).pipe(Effect.scoped)
  )

  it.live.skipIf(etcdBinary === undefined)(
    `after an etcd restart the relay rebinds and converges to the new state${skipped}`,
    () =>
      Effect.gen(function* () {
        const server = yield* etcdServer
        const discovery = yield* makeEtcdDiscovery({ endpoints: [server.url], prefix: PREFIX })
        const registrar = yield* makeEtcdRegistrar({
          endpoints: [server.url],
          prefix: PREFIX,
          ttlSeconds: 10
        })
        const cardScope = yield* Scope.make()
        yield* registrar.registerCard(llama).pipe(Scope.extend(cardScope))
        yield* waitFor(discovery, "the card", (s) => s.cards.length === 1)

        yield* server.stop
        const unbound = yield* waitFor(discovery, "the stream failure", (s) => !s.sourceStream.bound)
        expect(unbound.sourceStream.epoch).toBe(1)
        // Cards stay while etcd is away; sources are re-listed after the rebind.
        expect(unbound.cards).toEqual([llama])
        yield* server.start

        // Changes after the restart: a new source, and the card withdrawn.
        yield* registrar.registerSource(llamaSource)
        yield* Scope.close(cardScope, Exit.void)
        const converged = yield* waitFor(
          discovery,
          "the new state after the restart",
          (s) => s.sourceStream.bound && s.cards.length === 0 && s.sources.length === 1,
          10_000
        )
        expect(converged.sources[0]).toEqual(llamaSource)
        expect(converged.sourceStream).toEqual({ epoch: 1, bound: true })
        // The rebound watch delivers later changes too.
        yield* registrar.registerCard(llama)
        yield* waitFor(discovery, "a change after the rebind", (s) => s.cards.length === 1)
      }).pipe(Effect.scoped)
  )

  it.live("an unreachable etcd fails startup naming the endpoint", () =>
    Effect.gen(function* () {
      const port = yield* Effect.promise(freePort)
      const exit = yield* Effect.exit(
        makeEtcdDiscovery({
          endpoints: [`http://127.0.0.1:${port}`],
          prefix: PREFIX,
          callTimeout: "2 seconds"
        })
      )
      expect(Exit.isFailure(exit)).toBe(true)
      if (Exit.isFailure(exit) && exit.cause._tag === "Fail") {
        expect(exit.cause.error.message).toMatch(
          new RegExp(`^discovery etcd:http://127\\.0\\.0\\.1:${port}: cannot list ${PREFIX}/: `)
        )
      } else throw new Error(`expected a startup failure, got ${String(exit)}`)
    }).pipe(Effect.scoped)
  )
})
