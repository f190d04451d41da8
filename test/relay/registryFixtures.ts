/**
 * Shared fixtures of the registry and publication tests: the seed-001 test module's `pool`,
 * `config`, `registration`, `request` and `stored_event` helpers, plus bounded polling on fiber
 * yields where the Rust tests spin on `yield_now` under a wall-clock deadline.
 */

import { Deferred, Effect, Either, Exit, Scope } from "effect"
import { CacheSemanticsId, DcId, IndexerDomainId, PoolId, RoutingScopeId } from "../../src/ckf/identity.js"
import { DEFAULT_RUNTIME_CONFIG, type RuntimeConfig } from "../../src/protocol/Discovery.js"
import { type RouterEvent, storedEvent } from "../../src/protocol/Events.js"
import {
  baseRegistration,
  type CanonicalModelRegistration,
  canonicalModelId,
  DcRelayIdentity,
  EndpointId,
  KvQuerySemantics,
  modelAlias
} from "../../src/protocol/Model.js"
import { make as makeRegistry } from "../../src/relay/internal/PoolRegistryLive.js"
import {
  type CkfBuilder,
  externalCkfBuilder,
  type PoolActorConfig,
  type PoolAttachRequest,
  type PoolRegistryOptions
} from "../../src/relay/PoolRegistry.js"

const digest = (byte: number) => new Uint8Array(16).fill(byte & 0xff)

/** `pool(seed)`: explicit cache semantics [seed; 16], routing scope [seed + 1; 16], DC 3. */
export const pool = (seed: number): PoolId =>
  new PoolId(
    new IndexerDomainId(
      new CacheSemanticsId(digest(seed), "explicit"),
      new RoutingScopeId(digest(seed + 1), "explicit")
    ),
    new DcId(3n)
  )

export const config = (): PoolActorConfig => ({
  expectedUniqueBlocks: 32,
  publicationThreshold: 1,
  publicationDelay: "1 millis"
})

export const relayIdentity = (incarnation = 7n): DcRelayIdentity =>
  new DcRelayIdentity({ drtInstanceId: 11n, relayIncarnation: incarnation })

export const endpoint = (text: string): EndpointId => Either.getOrThrow(EndpointId.parse(text))

export const registration = (model: string): CanonicalModelRegistration =>
  baseRegistration(canonicalModelId(model), [modelAlias(`${model}-alias`)])

export const querySemantics = (): KvQuerySemantics =>
  new KvQuerySemantics({ kvBlockSize: 64, hashFormat: "dynamo_standard_v1" })

export const request = (poolId: PoolId, endpointText: string, model: string): PoolAttachRequest => ({
  poolId,
  endpoint: endpoint(endpointText),
  registrations: [registration(model)],
  querySemantics: querySemantics(),
  roles: ["aggregated"],
  servingFacts: { runtimeConfigs: new Map() }
})

export const runtimeConfig = (overrides: Partial<RuntimeConfig>): RuntimeConfig => ({
  ...DEFAULT_RUNTIME_CONFIG,
  ...overrides
})

/** `stored_event(event_id)`: worker 1, rank 0, one block whose hash is the event id. */
export const storedEventN = (eventId: number): RouterEvent => storedEvent("1", 0, eventId, [eventId])

export const registry = (overrides: Partial<PoolRegistryOptions> = {}) =>
  makeRegistry({ relayIdentity: relayIdentity(), actorConfig: config(), ...overrides })

/**
 * The seed's `GatedBuilder`: the first build announces `started`, waits for `release`, builds,
 * then announces `finished`; later builds are ungated.
 */
export const gatedBuilder = Effect.gen(function* () {
  const started = yield* Deferred.make<void>()
  const release = yield* Deferred.make<void>()
  const finished = yield* Deferred.make<void>()
  let calls = 0
  const builder: CkfBuilder = (ckf) =>
    calls++ > 0
      ? externalCkfBuilder(ckf)
      : Effect.zipRight(Deferred.succeed(started, undefined), Deferred.await(release)).pipe(
          Effect.zipRight(externalCkfBuilder(ckf)),
          Effect.ensuring(Deferred.succeed(finished, undefined))
        )
  return { builder, started, release, finished }
})

/** Yields until `condition` holds (the seed's `while …{ yield_now() }` under a deadline). */
export const waitUntil = (condition: () => boolean, what: string, maxYields = 10_000): Effect.Effect<void> =>
  Effect.gen(function* () {
    for (let i = 0; i < maxYields; i++) {
      if (condition()) return
      yield* Effect.yieldNow()
    }
    return yield* Effect.dieMessage(`timed out waiting until ${what}`)
  })

/** Closes a scope that stands for one Rust value whose drop releases it (a subscription, a stream). */
export const drop = (scope: Scope.CloseableScope) => Scope.close(scope, Exit.void)
