/**
 * In-memory relays for the consumer's unit tests: a `RelayClient` whose relay info, catalog watch
 * and pool streams are scripted, with producers backed by real `DcCkfState` filters so that
 * overlap answers can be checked. No I/O, no timers: every wait is on the `TestClock`.
 */

import { Deferred, Effect, Either, FiberId, Layer, Queue, Stream, SubscriptionRef } from "effect"
import { ckfConfig } from "../../src/ckf/config.js"
import {
  CacheSemanticsId,
  DcId,
  IndexerDomainId,
  PoolId,
  ProducerIdentity,
  RoutingScopeId
} from "../../src/ckf/identity.js"
import { DcCkfState } from "../../src/ckf/state.js"
import {
  PoolStreamTerminated,
  type RelayClientError,
  RelayHttpError,
  RelayTransportError
} from "../../src/consumer/ConsumerErrors.js"
import { RelayConnector, type RelaySpec } from "../../src/consumer/GlobalConsumer.js"
import type { PoolStreamEvent, RelayClient } from "../../src/consumer/RelayClient.js"
import {
  baseRegistration,
  type CatalogSnapshot,
  canonicalModelId,
  type DcPoolDescriptor,
  DcRelayIdentity,
  EndpointId,
  KvQuerySemantics,
  ModelTarget,
  modelAlias,
  type RelayInfo,
  withTarget
} from "../../src/protocol/Model.js"

export const domainOf = (seed: number): IndexerDomainId =>
  new IndexerDomainId(
    new CacheSemanticsId(new Uint8Array(16).fill(seed), "explicit"),
    new RoutingScopeId(new Uint8Array(16).fill(seed + 1), "explicit")
  )

/** One producer generation served by a fake relay. */
export class FakePool {
  readonly state: DcCkfState
  sequence = 1n
  readonly subscribers = new Set<Queue.Queue<Either.Either<PoolStreamEvent, RelayClientError>>>()
  subscriptions = 0

  constructor(
    readonly descriptor: DcPoolDescriptor,
    expectedBlocks: number
  ) {
    this.state = new DcCkfState(ckfConfig(expectedBlocks))
  }

  get producer(): ProducerIdentity {
    return this.descriptor.producer
  }

  /** Stores the hashes for worker 1 and publishes one delta to every subscriber. */
  store(hashes: ReadonlyArray<bigint>): Effect.Effect<void> {
    return this.publish(() => {
      for (const hash of hashes) this.state.store("1", 0, hash)
    })
  }

  remove(hashes: ReadonlyArray<bigint>): Effect.Effect<void> {
    return this.publish(() => {
      for (const hash of hashes) this.state.remove("1", 0, hash)
    })
  }

  private publish(mutate: () => void): Effect.Effect<void> {
    return Effect.suspend(() => {
      mutate()
      const batch = this.state.flush()
      if (batch === undefined || batch.imageCount === 0) return Effect.void
      const base = this.sequence
      this.sequence += 1n
      const event: PoolStreamEvent = {
        _tag: "Delta",
        baseSequence: base,
        sequence: this.sequence,
        images: batch.images
      }
      return Effect.forEach(this.subscribers, (queue) => Queue.offer(queue, Either.right(event)), {
        discard: true
      })
    })
  }

  /** Ends every open stream with `error` (e.g. `SUBSCRIBER_LAGGED`). */
  breakStreams(error: RelayClientError): Effect.Effect<void> {
    return Effect.forEach(this.subscribers, (queue) => Queue.offer(queue, Either.left(error)), {
      discard: true
    })
  }

  lag(): Effect.Effect<void> {
    return this.breakStreams(new PoolStreamTerminated({ reason: "SUBSCRIBER_LAGGED", message: "lagged" }))
  }

  stream(): Stream.Stream<PoolStreamEvent, RelayClientError> {
    return Stream.unwrapScoped(
      Effect.gen(this, function* () {
        this.subscriptions += 1
        const queue = yield* Queue.unbounded<Either.Either<PoolStreamEvent, RelayClientError>>()
        this.subscribers.add(queue)
        yield* Effect.addFinalizer(() => Effect.sync(() => this.subscribers.delete(queue)))
        const snapshot: PoolStreamEvent = {
          _tag: "Snapshot",
          sequence: this.sequence,
          words: this.state.snapshotWords()
        }
        return Stream.concat(
          Stream.make(snapshot),
          Stream.fromQueue(queue).pipe(
            Stream.mapEffect((item) =>
              Either.isRight(item) ? Effect.succeed(item.right) : Effect.fail(item.left)
            )
          )
        )
      })
    )
  }
}

export interface FakePoolOptions {
  readonly domain?: IndexerDomainId
  readonly model?: string
  readonly namespace?: string
  readonly expectedBlocks?: number
  readonly kvBlockSize?: number
  readonly layoutGeneration?: bigint
  /** LoRA adapters registered on the model, each as `<model>-<adapter>` with that `lora.adapter`. */
  readonly adapters?: ReadonlyArray<string>
}

/** A scripted relay: identity, catalog and pools can be changed at any time. */
export class FakeRelay {
  info: RelayInfo
  infoFailure: RelayClientError | undefined = undefined
  infoCalls = 0
  watchCalls = 0
  revision = 0n
  readonly pools = new Map<string, FakePool>()
  private watchEnd: Deferred.Deferred<never, RelayClientError>

  constructor(
    readonly dcName: string,
    readonly dcId: DcId,
    incarnation: bigint,
    readonly catalogRef: SubscriptionRef.SubscriptionRef<CatalogSnapshot>
  ) {
    this.info = {
      relay: new DcRelayIdentity({ drtInstanceId: 1n, relayIncarnation: incarnation }),
      dcName,
      dcId
    }
    this.watchEnd = Deferred.unsafeMake<never, RelayClientError>(FiberId.none)
  }

  static make(dcName: string, dc: bigint, incarnation = 100n): Effect.Effect<FakeRelay> {
    return Effect.map(
      SubscriptionRef.make<CatalogSnapshot>({
        relay: new DcRelayIdentity({ drtInstanceId: 1n, relayIncarnation: incarnation }),
        revision: 0n,
        pools: []
      }),
      (ref) => new FakeRelay(dcName, new DcId(dc), incarnation, ref)
    )
  }

  /** Adds (or replaces) the pool of `options.domain` and publishes a new catalog revision. */
  addPool(options: FakePoolOptions = {}): Effect.Effect<FakePool> {
    return Effect.gen(this, function* () {
      const domain = options.domain ?? domainOf(1)
      const state = new DcCkfState(ckfConfig(options.expectedBlocks ?? 256))
      const producer = new ProducerIdentity(
        new PoolId(domain, this.dcId),
        this.info.relay.relayIncarnation,
        options.layoutGeneration ?? 1n,
        state.format
      )
      const descriptor: DcPoolDescriptor = {
        producer,
        servingEndpoint: new EndpointId({
          namespace: options.namespace ?? "prod",
          component: "backend",
          endpoint: "generate"
        }),
        registrations: [
          baseRegistration(canonicalModelId(options.model ?? "llama"), [modelAlias("chat")]),
          ...(options.adapters ?? []).map((adapter) =>
            withTarget(
              canonicalModelId(`${options.model ?? "llama"}-${adapter}`),
              ModelTarget.Lora({
                baseModel: canonicalModelId(options.model ?? "llama"),
                adapter: canonicalModelId(adapter)
              }),
              []
            )
          )
        ],
        querySemantics: new KvQuerySemantics({
          kvBlockSize: options.kvBlockSize ?? 16,
          hashFormat: "dynamo_standard_v1"
        }),
        poolRoles: ["aggregated"]
      }
      for (const [key, pool] of this.pools)
        if (pool.producer.poolId.equals(producer.poolId)) this.pools.delete(key)
      const pool = new FakePool(descriptor, options.expectedBlocks ?? 256)
      this.pools.set(producer.key, pool)
      yield* this.publishCatalog
      return pool
    })
  }

  removePool(pool: FakePool): Effect.Effect<void> {
    return Effect.suspend(() => {
      this.pools.delete(pool.producer.key)
      return this.publishCatalog
    })
  }

  get publishCatalog(): Effect.Effect<void> {
    return Effect.suspend(() => {
      this.revision += 1n
      const pools = [...this.pools.values()]
        .map((pool) => pool.descriptor)
        .sort((a, b) => a.producer.poolId.compareTo(b.producer.poolId))
      return SubscriptionRef.set(this.catalogRef, { relay: this.info.relay, revision: this.revision, pools })
    })
  }

  /** Ends the current catalog watch (the relay's connection epoch). */
  endWatch(
    error: RelayClientError = new RelayTransportError({ url: "fake", message: "reset" })
  ): Effect.Effect<void> {
    return Deferred.fail(this.watchEnd, error).pipe(Effect.asVoid)
  }

  /** A restart: new incarnation, empty catalog, every stream broken, the watch ended. */
  restart(incarnation: bigint): Effect.Effect<void> {
    return Effect.gen(this, function* () {
      for (const pool of this.pools.values()) {
        yield* pool.breakStreams(new RelayTransportError({ url: "fake", message: "connection reset" }))
      }
      this.pools.clear()
      this.info = {
        ...this.info,
        relay: new DcRelayIdentity({ drtInstanceId: 1n, relayIncarnation: incarnation })
      }
      this.revision = 0n
      yield* this.publishCatalog
      yield* this.endWatch()
    })
  }

  readonly client: RelayClient = {
    baseUrl: "fake",
    relayInfo: Effect.suspend(() => {
      this.infoCalls += 1
      return this.infoFailure === undefined ? Effect.succeed(this.info) : Effect.fail(this.infoFailure)
    }),
    catalog: Effect.suspend(() => SubscriptionRef.get(this.catalogRef)),
    // The fake serves no load nor readiness: a route through it sees neither.
    watchLoad: () => Stream.never,
    watchReadiness: () => Stream.never,
    watchCatalog: () =>
      Stream.unwrap(
        Effect.gen(this, function* () {
          this.watchCalls += 1
          this.watchEnd = yield* Deferred.make<never, RelayClientError>()
          return this.catalogRef.changes.pipe(Stream.interruptWhen(Deferred.await(this.watchEnd)))
        })
      ),
    subscribePool: (expected) =>
      Stream.suspend(() => {
        const pool = this.pools.get(expected.key)
        if (pool !== undefined) return pool.stream()
        return Stream.fail(
          new RelayHttpError({
            url: "fake",
            status: 409,
            reason: "PRODUCER_CHANGED",
            message: "no such producer"
          })
        )
      })
  }
}

/** Connects relay specs to fake relays by URL. */
export const fakeConnector = (relays: ReadonlyMap<string, FakeRelay>): Layer.Layer<RelayConnector> =>
  Layer.succeed(RelayConnector, {
    connect: (spec: RelaySpec) =>
      Effect.sync(() => {
        const relay = relays.get(spec.url)
        if (relay === undefined) throw new Error(`no fake relay at ${spec.url}`)
        return relay.client
      })
  })
