/**
 * The pool registry (seed 001, `kv_dc_relay/pool_registry.rs`; relay-service §3.1, §3.2): which
 * pool generations exist, the catalog the relay publishes, per-pool load, and the lazy
 * publication hub of each generation.
 *
 * Invariants kept from the seed:
 * - one endpoint per pool and one pool per endpoint, counting reservations of attaches still
 *   allocating their CKF; an interrupted or failed attach leaves neither reservation nor entry;
 * - layout generations start at 1 and are never reused within a registry (a relay lifetime);
 * - the catalog revision grows by one on every upsert, every removal of an active entry and
 *   every clear; pools are ordered by PoolId; absence is withdrawal (no tombstones);
 * - a generation leaves the catalog and the load list before its actor is torn down;
 * - a stale generation can neither fence nor initialize its replacement's hub: every command
 *   names the layout generation it means.
 *
 * Each generation owns a `Scope` (a child of the registry's) holding its actor, its hub and its
 * hub's fibers. Closing it retires the generation in the seed's order: withdraw (catalog, load,
 * hub) → drain actor faults while the actor is torn down → remove.
 *
 * The registry's state is plain data mutated only in synchronous blocks (JavaScript runs one
 * fiber at a time); the catalog and load `SubscriptionRef`s are then brought up to date from it.
 */

import {
  Context,
  Deferred,
  Effect,
  Either,
  ExecutionStrategy,
  Exit,
  Fiber,
  FiberId,
  HashMap,
  Layer,
  Metric,
  type Queue,
  Scope,
  type Stream,
  SubscriptionRef
} from "effect"
import { CanonicalCkfState } from "../ckf/canonical.js"
import { type CkfConfig, ckfConfig } from "../ckf/config.js"
import { CkfBuildError } from "../ckf/errors.js"
import type { PoolId, ProducerIdentity } from "../ckf/identity.js"
import { DcCkfState } from "../ckf/state.js"
import { U64_MAX } from "../ckf/u64.js"
import type { RuntimeConfig } from "../protocol/Discovery.js"
import type { WorkerId } from "../protocol/Events.js"
import {
  type CanonicalModelRegistration,
  type CatalogSnapshot,
  compareRegistrations,
  type DcPoolDescriptor,
  type DcRelayIdentity,
  type EndpointId,
  type InvalidPoolDescriptor,
  type InvalidRegistrations,
  type KvQuerySemantics,
  validatePoolRegistrations,
  validatePoolRoles,
  type WorkerRole
} from "../protocol/Model.js"
import { make as makePoolActor } from "./internal/PoolActorLoop.js"
import {
  type EvictionCandidate,
  HubCoordinator,
  type HubStartContext,
  PoolHubSlot
} from "./internal/PoolHubSlot.js"
import { type GenerationSignal, GenerationToken } from "./internal/sync.js"
import { drainFaultsWhile } from "./PendingActorFaults.js"
import type { ActorFault, MakePoolActor, PoolActor, PoolActorOptions } from "./PoolActor.js"
import {
  type ActiveLoad,
  type LoadCapacityError,
  loadSnapshotEquals,
  type PoolLoadSnapshot,
  PoolLoadState
} from "./PoolLoad.js"
import {
  DEFAULT_MAX_INITIALIZED_POOL_HUBS,
  type HubSubscription,
  makePublicationHubConfig,
  type PublicationHubConfig
} from "./PublicationHub.js"
import {
  CkfBuildFailed,
  type KvDcRelayError,
  PoolAttachError,
  type PoolAttachProblem,
  PoolGenerationInactive,
  ProducerMismatch,
  type PublicationHubError,
  PublicationUnavailable,
  UnknownPool
} from "./RelayErrors.js"

export const DEFAULT_CKF_ALLOCATION_CONCURRENCY = 2

// ---------------------------------------------------------------------------------------------
// Requests and configuration

export interface PoolActorConfig {
  /** Sizes each generation's CKF (the launcher default is 1,048,576). */
  readonly expectedUniqueBlocks: number
  /** Normalized events per publication batch. */
  readonly publicationThreshold: number
  readonly publicationDelay: PoolActorOptions["publicationDelay"]
}

/** Runtime facts of a serving pool; a local-only pool has none and publishes no load. */
export interface PoolServingFacts {
  readonly runtimeConfigs: ReadonlyMap<WorkerId, RuntimeConfig>
}

export interface PoolAttachRequest {
  readonly poolId: PoolId
  readonly endpoint: EndpointId
  readonly registrations: ReadonlyArray<CanonicalModelRegistration>
  readonly querySemantics: KvQuerySemantics
  readonly roles: ReadonlyArray<WorkerRole>
  readonly servingFacts?: PoolServingFacts | undefined
}

export type PoolRetirementMode = "Graceful" | "Fenced"

/** Builds CKF storage for a generation (a test hook can gate it; the seed's `attach_with_builder`). */
export type CkfBuilder = (config: CkfConfig) => Effect.Effect<DcCkfState, CkfBuildError>

const ckfBuilderOf =
  (make: (config: CkfConfig) => DcCkfState): CkfBuilder =>
  (config) =>
    Effect.try({
      try: () => make(config),
      catch: (cause) =>
        cause instanceof CkfBuildError
          ? cause
          : new CkfBuildError("AllocationFailed", `CKF allocation failed: ${cause}`)
    })

/**
 * Builds an externally addressed pool: the seed's G3 producer, whose CKF addresses are the
 * engines' own block hashes. The relay no longer serves these (PROTOCOL §3.3); the seed ports
 * use it, since the seed's scenarios are written in external hashes.
 */
export const externalCkfBuilder: CkfBuilder = ckfBuilderOf((config) => new DcCkfState(config))

/** Builds a canonically addressed pool (PROTOCOL §3.3), the relay's default. */
export const canonicalCkfBuilder: CkfBuilder = ckfBuilderOf((config) => new CanonicalCkfState(config))

export const defaultCkfBuilder: CkfBuilder = canonicalCkfBuilder

export interface PoolRegistryOptions {
  readonly relayIdentity: DcRelayIdentity
  readonly actorConfig: PoolActorConfig
  /** Hub configuration shared by every generation (defaults per relay-service §3.3). */
  readonly publication?: Partial<PublicationHubConfig> | undefined
  /** At most this many hubs hold an initialized mirror (default 64). */
  readonly maxInitializedPoolHubs?: number | undefined
  /** CKF allocation (default canonical addressing, PROTOCOL §3.3; `externalCkfBuilder` for the seed's). */
  readonly ckfBuilder?: CkfBuilder | undefined
  /** Test hook: how actors are started (default `PoolActor.make`). */
  readonly makeActor?: MakePoolActor | undefined
  /** Test hook: idle-eviction cleanup waits on this after claiming its victim. */
  readonly evictionGate?: Effect.Effect<void> | undefined
}

export type PoolAttachFailure =
  | PoolAttachError
  | InvalidRegistrations
  | InvalidPoolDescriptor
  | CkfBuildFailed

export type PoolUpdateFailure =
  | PoolAttachError
  | InvalidRegistrations
  | InvalidPoolDescriptor
  | PoolGenerationInactive

// ---------------------------------------------------------------------------------------------
// Catalog

const comparePools = (a: DcPoolDescriptor, b: DcPoolDescriptor): number =>
  a.producer.poolId.compareTo(b.producer.poolId)

/**
 * An immutable catalog revision. The ordered pool list is computed on first access and cached
 * ("materialized"); every mutation yields a new value without that cache.
 */
export class DcPoolCatalog implements CatalogSnapshot {
  private ordered: ReadonlyArray<DcPoolDescriptor> | undefined = undefined

  constructor(
    readonly relay: DcRelayIdentity,
    readonly revision: bigint,
    private readonly entries: HashMap.HashMap<string, DcPoolDescriptor>
  ) {}

  static empty(relay: DcRelayIdentity): DcPoolCatalog {
    return new DcPoolCatalog(relay, 0n, HashMap.empty())
  }

  /** Descriptors ordered by PoolId. */
  get pools(): ReadonlyArray<DcPoolDescriptor> {
    if (this.ordered === undefined) {
      this.ordered = Object.freeze(Array.from(HashMap.values(this.entries)).sort(comparePools))
    }
    return this.ordered
  }

  get isMaterialized(): boolean {
    return this.ordered !== undefined
  }

  get size(): number {
    return HashMap.size(this.entries)
  }

  descriptor(poolId: PoolId): DcPoolDescriptor | undefined {
    const found = HashMap.get(this.entries, poolId.key)
    return found._tag === "Some" ? found.value : undefined
  }

  upsert(revision: bigint, descriptor: DcPoolDescriptor): DcPoolCatalog {
    return new DcPoolCatalog(
      this.relay,
      revision,
      HashMap.set(this.entries, descriptor.producer.poolId.key, descriptor)
    )
  }

  remove(revision: bigint, poolId: PoolId): DcPoolCatalog {
    return new DcPoolCatalog(this.relay, revision, HashMap.remove(this.entries, poolId.key))
  }

  clear(revision: bigint): DcPoolCatalog {
    return new DcPoolCatalog(this.relay, revision, HashMap.empty())
  }
}

// ---------------------------------------------------------------------------------------------
// Generations

type PoolEntryState = "Active" | "Withdrawn" | "Fenced"

interface RetirementRequest {
  readonly mode: PoolRetirementMode
  readonly run: Effect.Effect<void>
}

/** The lifetime of one generation: its scope and how the next close retires it. */
class GenerationLifetime {
  request: RetirementRequest | undefined = undefined
  closing = false
  /** Completed once every finalizer of the generation's scope ran. */
  readonly closed = Deferred.unsafeMake<void>(FiberId.none)

  constructor(
    readonly scope: Scope.CloseableScope,
    readonly hubScope: Scope.CloseableScope
  ) {}
}

interface PoolEntry {
  readonly endpoint: EndpointId
  readonly actor: PoolActor
  readonly identity: ProducerIdentity
  readonly layoutGeneration: bigint
  registrations: ReadonlyArray<CanonicalModelRegistration>
  readonly querySemantics: KvQuerySemantics
  roles: ReadonlyArray<WorkerRole>
  readonly cancel: GenerationToken
  state: PoolEntryState
  readonly serving: { readonly load: PoolLoadState } | undefined
  readonly hub: PoolHubSlot
  readonly lifetime: GenerationLifetime
}

interface PoolReservation {
  readonly endpoint: EndpointId
  readonly layoutGeneration: bigint
}

/** What the owner of a generation holds (the seed's `PoolAttachment`). */
export class PoolAttachment {
  /** @internal */
  constructor(
    readonly poolId: PoolId,
    readonly layoutGeneration: bigint,
    readonly actor: PoolActor,
    /** Cancelled when the generation is withdrawn, fenced, removed or the registry shuts down. */
    readonly poolCancel: GenerationToken,
    private currentRegistrations: ReadonlyArray<CanonicalModelRegistration>,
    private currentRoles: ReadonlyArray<WorkerRole>,
    /** @internal */
    readonly lifetime: GenerationLifetime
  ) {}

  get identity(): ProducerIdentity {
    return this.actor.identity
  }

  get faults(): Queue.Dequeue<ActorFault> {
    return this.actor.faults
  }

  /** Kept current by `replaceRegistrations`. */
  get registrations(): ReadonlyArray<CanonicalModelRegistration> {
    return this.currentRegistrations
  }

  /** Kept current by `replaceRoles`. */
  get roles(): ReadonlyArray<WorkerRole> {
    return this.currentRoles
  }

  /** @internal */
  update(registrations: ReadonlyArray<CanonicalModelRegistration>, roles: ReadonlyArray<WorkerRole>): void {
    this.currentRegistrations = registrations
    this.currentRoles = roles
  }
}

// ---------------------------------------------------------------------------------------------
// The service

export interface PoolRegistry {
  readonly relayIdentity: DcRelayIdentity
  /** Reserves a layout generation, allocates the CKF, starts the actor and publishes the pool. */
  readonly attach: (request: PoolAttachRequest) => Effect.Effect<PoolAttachment, PoolAttachFailure>
  /** Same generation, new registrations (validated); no-op when unchanged. */
  readonly replaceRegistrations: (
    attachment: PoolAttachment,
    registrations: ReadonlyArray<CanonicalModelRegistration>
  ) => Effect.Effect<void, PoolUpdateFailure>
  /** Same generation, new declared roles (non-empty, unique); no-op when unchanged. */
  readonly replaceRoles: (
    attachment: PoolAttachment,
    roles: ReadonlyArray<WorkerRole>
  ) => Effect.Effect<void, PoolUpdateFailure>
  /**
   * True when this active serving generation accepted the runtime configs; an invalid config
   * degrades the published load before the error is returned.
   */
  readonly replaceLoadCapacity: (
    poolId: PoolId,
    layoutGeneration: bigint,
    runtimeConfigs: ReadonlyMap<WorkerId, RuntimeConfig>
  ) => Effect.Effect<boolean, LoadCapacityError>
  /** False for an unknown rank or an inactive generation. */
  readonly observeLoad: (poolId: PoolId, layoutGeneration: bigint, load: ActiveLoad) => Effect.Effect<boolean>
  readonly clearLoadObservations: (poolId: PoolId, layoutGeneration: bigint) => Effect.Effect<boolean>
  /** Leaves the catalog and load list, cancels the generation and shuts its hub down. */
  readonly withdraw: (
    poolId: PoolId,
    layoutGeneration: bigint,
    mode: PoolRetirementMode
  ) => Effect.Effect<boolean>
  /** Terminal publication failure: withdraw as fenced and retire the hub; true if it was active. */
  readonly fenceGeneration: (
    poolId: PoolId,
    layoutGeneration: bigint,
    reason: string
  ) => Effect.Effect<boolean>
  /** Deletes the entry and closes the generation's scope. */
  readonly remove: (poolId: PoolId, layoutGeneration: bigint) => Effect.Effect<boolean>
  /**
   * Closes the generation's scope with `teardown` as the actor teardown: withdraw → drain faults
   * while `teardown` runs → remove. Returns the teardown's outcome.
   */
  readonly retireWith: <A, E>(
    attachment: PoolAttachment,
    mode: PoolRetirementMode,
    teardown: Effect.Effect<A, E>
  ) => Effect.Effect<A, E>
  /** `retireWith` with the actor's graceful shutdown (Graceful) or fence (Fenced). */
  readonly retire: (
    attachment: PoolAttachment,
    mode: PoolRetirementMode
  ) => Effect.Effect<void, KvDcRelayError>
  /** `retire(attachment, "Graceful")`. */
  readonly detach: (attachment: PoolAttachment) => Effect.Effect<void, KvDcRelayError>
  /** The generation's cancellation if `expected` is the active producer of its pool. */
  readonly validateActiveProducer: (
    expected: ProducerIdentity
  ) => Effect.Effect<GenerationSignal, UnknownPool | ProducerMismatch>
  /** A hub subscription (the hub starts lazily); closed with the scope. */
  readonly subscribePool: (
    expected: ProducerIdentity
  ) => Effect.Effect<HubSubscription, PublicationHubError, Scope.Scope>
  /** The latest catalog. */
  readonly catalog: Effect.Effect<DcPoolCatalog>
  readonly catalogRef: SubscriptionRef.SubscriptionRef<DcPoolCatalog>
  /** The current catalog, then every later revision (watchers may see coalesced revisions). */
  readonly catalogChanges: Stream.Stream<DcPoolCatalog>
  /** Load of every active serving generation, ordered by PoolId. */
  readonly loadSnapshots: Effect.Effect<ReadonlyArray<PoolLoadSnapshot>>
  readonly loadRef: SubscriptionRef.SubscriptionRef<ReadonlyArray<PoolLoadSnapshot>>
  /** Stops accepting, clears the catalog and load list, cancels and fences every generation. */
  readonly shutdown: Effect.Effect<void>
  /** Test hook: entries, including withdrawn ones not yet removed. */
  readonly poolCount: Effect.Effect<number>
  /** Test hook: attaches still allocating. */
  readonly reservationCount: Effect.Effect<number>
  /** Test hook: the hub slot of the pool's current entry (`hub_slot` in the seed's tests). */
  readonly hubSlot: (poolId: PoolId) => PoolHubSlot | undefined
  /** Test hook: free initialized-hub capacity (`publication_hub_permits.available_permits()`). */
  readonly availableHubCapacity: () => number
}

export const PoolRegistry = Context.GenericTag<PoolRegistry>("kvrelay/PoolRegistry")

const terminalPublicationFailures = Metric.counter("kv_dc_relay_terminal_publication_failures_total", {
  description: "generations fenced after terminal publication failure",
  incremental: true
})

const registrationsEqual = (
  a: ReadonlyArray<CanonicalModelRegistration>,
  b: ReadonlyArray<CanonicalModelRegistration>
): boolean =>
  a.length === b.length && a.every((registration, i) => compareRegistrations(registration, b[i]!) === 0)

const rolesEqual = (a: ReadonlyArray<WorkerRole>, b: ReadonlyArray<WorkerRole>): boolean =>
  a.length === b.length && a.every((role, i) => role === b[i])

const descriptorOf = (entry: PoolEntry): DcPoolDescriptor => ({
  producer: entry.identity,
  servingEndpoint: entry.endpoint,
  registrations: entry.registrations,
  querySemantics: entry.querySemantics,
  poolRoles: entry.roles
})

const endpointKey = (endpoint: EndpointId): string => endpoint.toString()

/** Builds the registry in the current scope; closing that scope shuts it down. */
export const make = (options: PoolRegistryOptions): Effect.Effect<PoolRegistry, never, Scope.Scope> =>
  Effect.gen(function* () {
    const relayIdentity = options.relayIdentity
    const actorConfig = options.actorConfig
    const builder = options.ckfBuilder ?? defaultCkfBuilder
    const makeActor = options.makeActor ?? makePoolActor
    const maxInitializedHubs = options.maxInitializedPoolHubs ?? DEFAULT_MAX_INITIALIZED_POOL_HUBS
    if (!Number.isSafeInteger(maxInitializedHubs) || maxInitializedHubs <= 0) {
      return yield* Effect.dieMessage(
        `maxInitializedPoolHubs must be a positive integer, got ${maxInitializedHubs}`
      )
    }
    const hubConfig = yield* Either.match(makePublicationHubConfig(options.publication ?? {}), {
      onLeft: (error) => Effect.dieMessage(error.message),
      onRight: Effect.succeed
    })

    // Generations live in `poolsScope`; the shutdown finalizer is added after it, so it runs
    // first: the catalog is cleared and every actor fenced before the generation scopes close.
    const outer = yield* Effect.scope
    const poolsScope = yield* Scope.fork(outer, ExecutionStrategy.sequential)

    const state = {
      pools: new Map<string, PoolEntry>(),
      reservations: new Map<string, PoolReservation>(),
      nextLayoutGeneration: 1n,
      catalogRevision: 0n,
      accepting: true,
      shutDown: false,
      catalog: DcPoolCatalog.empty(relayIdentity),
      loads: [] as ReadonlyArray<PoolLoadSnapshot>
    }
    const catalogRef = yield* SubscriptionRef.make(state.catalog)
    const loadRef = yield* SubscriptionRef.make(state.loads)
    const ckfPermits = yield* Effect.makeSemaphore(DEFAULT_CKF_ALLOCATION_CONCURRENCY)
    // Serializes publication so the refs always end at the latest state, whatever the interleaving.
    const publishLock = yield* Effect.makeSemaphore(1)

    // -------------------------------------------------------------------------------------------
    // Synchronous state transitions

    const advanceRevision = (): bigint => {
      state.catalogRevision = state.catalogRevision === U64_MAX ? U64_MAX : state.catalogRevision + 1n
      return state.catalogRevision
    }
    const catalogUpsert = (descriptor: DcPoolDescriptor): void => {
      state.catalog = state.catalog.upsert(advanceRevision(), descriptor)
    }
    const catalogRemove = (poolId: PoolId): void => {
      state.catalog = state.catalog.remove(advanceRevision(), poolId)
    }

    /** Brings the load list up to date for one pool; a new array only when something changed. */
    const updateLoad = (poolId: PoolId): void => {
      const entry = state.pools.get(poolId.key)
      const snapshot =
        entry !== undefined && entry.state === "Active" && entry.serving !== undefined
          ? entry.serving.load.snapshot(entry.identity)
          : undefined
      const loads = state.loads
      let low = 0
      let high = loads.length
      while (low < high) {
        const mid = (low + high) >>> 1
        if (loads[mid]!.producer.poolId.compareTo(poolId) < 0) low = mid + 1
        else high = mid
      }
      const found = low < loads.length && loads[low]!.producer.poolId.equals(poolId)
      if (found && snapshot !== undefined) {
        if (loadSnapshotEquals(loads[low]!, snapshot)) return
        const next = loads.slice()
        next[low] = snapshot
        state.loads = next
      } else if (found) {
        state.loads = [...loads.slice(0, low), ...loads.slice(low + 1)]
      } else if (snapshot !== undefined) {
        state.loads = [...loads.slice(0, low), snapshot, ...loads.slice(low)]
      }
    }

    const publish: Effect.Effect<void> = publishLock.withPermits(1)(
      Effect.gen(function* () {
        if ((yield* SubscriptionRef.get(catalogRef)) !== state.catalog) {
          yield* SubscriptionRef.set(catalogRef, state.catalog)
        }
        if ((yield* SubscriptionRef.get(loadRef)) !== state.loads) {
          yield* SubscriptionRef.set(loadRef, state.loads)
        }
      })
    )

    const ownerOf = (poolId: PoolId): EndpointId | undefined =>
      state.pools.get(poolId.key)?.endpoint ?? state.reservations.get(poolId.key)?.endpoint

    const poolOfEndpoint = (endpoint: EndpointId): string | undefined => {
      const key = endpointKey(endpoint)
      for (const [poolKey, entry] of state.pools) if (endpointKey(entry.endpoint) === key) return poolKey
      for (const [poolKey, reservation] of state.reservations) {
        if (endpointKey(reservation.endpoint) === key) return poolKey
      }
      return undefined
    }

    const reserve = (request: PoolAttachRequest): Either.Either<bigint, PoolAttachError> => {
      const poolId = request.poolId
      const fail = (reason: PoolAttachProblem, detail: string) =>
        Either.left(new PoolAttachError({ reason, poolId, detail }))
      if (!state.accepting) return fail("ShuttingDown", "KV DC Relay pool registry is shutting down")
      const owner = ownerOf(poolId)
      if (owner !== undefined) {
        return fail(
          "PoolOwned",
          `pool ${poolId} is already owned by endpoint ${owner} and cannot also attach endpoint ${request.endpoint}`
        )
      }
      const assigned = poolOfEndpoint(request.endpoint)
      if (assigned !== undefined) {
        const assignedPool = state.pools.get(assigned)?.identity.poolId.toString() ?? assigned
        return fail(
          "EndpointAssigned",
          `endpoint ${request.endpoint} is already assigned to pool ${assignedPool} and cannot attach pool ${poolId}`
        )
      }
      const layoutGeneration = state.nextLayoutGeneration
      if (layoutGeneration === U64_MAX) {
        return fail("GenerationSpaceExhausted", "KV DC Relay layout generation space exhausted")
      }
      state.nextLayoutGeneration = layoutGeneration + 1n
      state.reservations.set(poolId.key, { endpoint: request.endpoint, layoutGeneration })
      return Either.right(layoutGeneration)
    }

    const rollbackReservation = (poolId: PoolId, layoutGeneration: bigint): void => {
      if (state.reservations.get(poolId.key)?.layoutGeneration === layoutGeneration) {
        state.reservations.delete(poolId.key)
      }
    }

    const activeEntry = (poolId: PoolId): PoolEntry | undefined => {
      const entry = state.pools.get(poolId.key)
      return entry !== undefined && entry.state === "Active" ? entry : undefined
    }

    const generationEntry = (poolId: PoolId, layoutGeneration: bigint): PoolEntry | undefined => {
      const entry = state.pools.get(poolId.key)
      return entry !== undefined && entry.layoutGeneration === layoutGeneration ? entry : undefined
    }

    /** Withdraws catalog and load visibility; the hub is the caller's to stop. */
    const withdrawVisibility = (
      poolId: PoolId,
      layoutGeneration: bigint,
      mode: PoolRetirementMode
    ): { readonly slot: PoolHubSlot; readonly wasActive: boolean } | undefined => {
      const entry = generationEntry(poolId, layoutGeneration)
      if (entry === undefined) return undefined
      const wasActive = entry.state === "Active"
      entry.state = entry.state === "Fenced" || mode === "Fenced" ? "Fenced" : "Withdrawn"
      entry.cancel.cancel()
      if (wasActive) {
        catalogRemove(poolId)
        updateLoad(poolId)
      }
      return { slot: entry.hub, wasActive }
    }

    // -------------------------------------------------------------------------------------------
    // Commands

    const annotate = (poolId: PoolId, layoutGeneration?: bigint) =>
      Effect.annotateLogs(
        layoutGeneration === undefined
          ? { poolId: poolId.toString() }
          : { poolId: poolId.toString(), layoutGeneration: String(layoutGeneration) }
      )
    const spanAttributes = (poolId: PoolId, layoutGeneration?: bigint) =>
      layoutGeneration === undefined
        ? { "kvrelay.pool": poolId.toString() }
        : { "kvrelay.pool": poolId.toString(), "kvrelay.layout_generation": String(layoutGeneration) }

    const withdraw = (
      poolId: PoolId,
      layoutGeneration: bigint,
      mode: PoolRetirementMode
    ): Effect.Effect<boolean> =>
      Effect.suspend(() => {
        const withdrawn = withdrawVisibility(poolId, layoutGeneration, mode)
        if (withdrawn === undefined) return Effect.succeed(false)
        return Effect.zipRight(publish, withdrawn.slot.shutdown()).pipe(Effect.as(true))
      }).pipe(
        annotate(poolId, layoutGeneration),
        Effect.withSpan("PoolRegistry.withdraw", {
          attributes: { ...spanAttributes(poolId, layoutGeneration), mode }
        })
      )

    const fenceGeneration = (
      poolId: PoolId,
      layoutGeneration: bigint,
      reason: string
    ): Effect.Effect<boolean> =>
      Effect.suspend(() => {
        const withdrawn = withdrawVisibility(poolId, layoutGeneration, "Fenced")
        if (withdrawn === undefined) return Effect.succeed(false)
        return Effect.gen(function* () {
          yield* publish
          yield* withdrawn.slot.retire()
          if (withdrawn.wasActive) {
            yield* Metric.increment(terminalPublicationFailures)
            yield* Effect.logError("Fencing KV DC Relay pool after terminal publication failure").pipe(
              Effect.annotateLogs("reason", reason)
            )
          }
          return withdrawn.wasActive
        })
      }).pipe(
        annotate(poolId, layoutGeneration),
        Effect.withSpan("PoolRegistry.fenceGeneration", {
          attributes: spanAttributes(poolId, layoutGeneration)
        })
      )

    const remove = (poolId: PoolId, layoutGeneration: bigint): Effect.Effect<boolean> =>
      Effect.suspend(() => {
        const entry = generationEntry(poolId, layoutGeneration)
        if (entry === undefined) return Effect.succeed(false)
        const wasActive = entry.state === "Active"
        state.pools.delete(poolId.key)
        entry.cancel.cancel()
        if (wasActive) catalogRemove(poolId)
        updateLoad(poolId)
        return Effect.all(
          [
            publish,
            entry.hub.shutdown(),
            // A no-op when the removal runs inside the generation's own retirement.
            Scope.close(entry.lifetime.scope, Exit.void)
          ],
          { discard: true }
        ).pipe(Effect.as(true))
      }).pipe(
        annotate(poolId, layoutGeneration),
        Effect.withSpan("PoolRegistry.remove", { attributes: spanAttributes(poolId, layoutGeneration) })
      )

    /** The generation scope's retirement finalizer: withdraw → drain faults during teardown → remove. */
    const retireGeneration = (
      poolId: PoolId,
      layoutGeneration: bigint,
      actor: PoolActor,
      lifetime: GenerationLifetime
    ): Effect.Effect<void> =>
      Effect.gen(function* () {
        lifetime.closing = true
        const request = lifetime.request
        const withdrawn = yield* withdraw(poolId, layoutGeneration, request?.mode ?? "Graceful")
        if (!withdrawn && request !== undefined) {
          yield* Effect.logWarning("KV DC Relay pool generation was already absent during retirement")
        }
        // Without a request (scope closed by its owner or the registry) the actor is fenced:
        // nobody is left to receive its tail. Finalizers run uninterruptibly, and the drain races
        // internally, so it gets an interruptible fiber of its own (nobody interrupts it).
        const drain = drainFaultsWhile(poolId, actor.faults, request?.run ?? actor.fence)
        yield* Effect.flatMap(Effect.forkDaemon(Effect.interruptible(drain)), Fiber.join)
        yield* remove(poolId, layoutGeneration)
      }).pipe(annotate(poolId, layoutGeneration))

    const retireWith = <A, E>(
      attachment: PoolAttachment,
      mode: PoolRetirementMode,
      teardown: Effect.Effect<A, E>
    ): Effect.Effect<A, E> =>
      Effect.uninterruptible(
        Effect.gen(function* () {
          const lifetime = attachment.lifetime
          let outcome: Exit.Exit<A, E> | undefined
          if (!lifetime.closing && lifetime.request === undefined) {
            lifetime.request = {
              mode,
              run: Effect.flatMap(Effect.exit(teardown), (exit) =>
                Effect.sync(() => {
                  outcome = exit
                })
              )
            }
          }
          yield* Scope.close(lifetime.scope, Exit.void)
          yield* Deferred.await(lifetime.closed)
          // Retired by someone else first (registry shutdown): the actor is already fenced, but
          // the caller's teardown (recovery shutdown in the host) must still run.
          if (outcome === undefined) outcome = yield* Effect.exit(teardown)
          return yield* outcome
        })
      ).pipe(
        Effect.withSpan("PoolRegistry.retire", {
          attributes: { ...spanAttributes(attachment.poolId, attachment.layoutGeneration), mode }
        })
      )

    const retire = (
      attachment: PoolAttachment,
      mode: PoolRetirementMode
    ): Effect.Effect<void, KvDcRelayError> =>
      retireWith(attachment, mode, mode === "Graceful" ? attachment.actor.shutdown : attachment.actor.fence)

    const allocate = (
      poolId: PoolId,
      config: CkfConfig
    ): Effect.Effect<DcCkfState, PoolAttachError | CkfBuildFailed> =>
      Effect.uninterruptibleMask((restore) =>
        Effect.gen(function* () {
          yield* restore(ckfPermits.take(1))
          // Like the seed's blocking task, the build outlives an interrupted attach and holds its
          // permit until it finishes; the reservation is rolled back by the attach at once.
          const build = yield* Effect.forkIn(
            Effect.suspend(
              (): Effect.Effect<DcCkfState, PoolAttachError | CkfBuildFailed> =>
                state.accepting
                  ? Effect.interruptible(builder(config)).pipe(
                      Effect.mapError((cause) => new CkfBuildFailed({ cause }))
                    )
                  : Effect.fail(
                      new PoolAttachError({
                        reason: "ShuttingDown",
                        poolId,
                        detail: "KV DC Relay pool registry is shutting down"
                      })
                    )
            ).pipe(Effect.ensuring(ckfPermits.release(1))),
            poolsScope
          )
          return yield* restore(Fiber.join(build))
        })
      )

    const attach = (request: PoolAttachRequest): Effect.Effect<PoolAttachment, PoolAttachFailure> => {
      const poolId = request.poolId
      return Effect.gen(function* () {
        if (request.registrations.length === 0) {
          return yield* Effect.fail(
            new PoolAttachError({
              reason: "NoRegistrations",
              poolId,
              detail: `pool ${poolId} requires at least one canonical model binding`
            })
          )
        }
        yield* validatePoolRegistrations(request.registrations)
        yield* validatePoolRoles(request.roles)
        let serving: PoolEntry["serving"]
        if (request.servingFacts !== undefined) {
          const load = PoolLoadState.fromRuntimeConfigs(request.servingFacts.runtimeConfigs)
          if (Either.isLeft(load)) {
            // Load telemetry is supplemental to CKF materialization: attach with an explicitly
            // degraded load rather than let malformed capacity metadata block KV publication.
            yield* Effect.logWarning("Ignoring invalid KV DC Relay pool load capacity during attach").pipe(
              Effect.annotateLogs({ endpoint: request.endpoint.toString(), error: load.left.message })
            )
          }
          serving = { load: Either.getOrElse(load, () => PoolLoadState.empty()) }
        }
        const layoutGeneration = yield* reserve(request)
        return yield* attachReserved(request, layoutGeneration, serving).pipe(
          Effect.onExit((exit) =>
            Exit.isSuccess(exit)
              ? Effect.void
              : Effect.sync(() => rollbackReservation(poolId, layoutGeneration))
          ),
          annotate(poolId, layoutGeneration)
        )
      }).pipe(
        annotate(poolId),
        Effect.withSpan("PoolRegistry.attach", {
          attributes: { ...spanAttributes(poolId), "kvrelay.endpoint": request.endpoint.toString() }
        })
      )
    }

    const attachReserved = (
      request: PoolAttachRequest,
      layoutGeneration: bigint,
      serving: PoolEntry["serving"]
    ): Effect.Effect<PoolAttachment, PoolAttachError | CkfBuildFailed> =>
      Effect.gen(function* () {
        const poolId = request.poolId
        const config = ckfConfig(actorConfig.expectedUniqueBlocks, {
          publishEveryNEvents: actorConfig.publicationThreshold
        })
        const ckfState = yield* allocate(poolId, config)
        return yield* Effect.uninterruptible(commit(request, layoutGeneration, serving, ckfState))
      })

    /** Starts the actor in a new generation scope and commits if the reservation is still current. */
    const commit = (
      request: PoolAttachRequest,
      layoutGeneration: bigint,
      serving: PoolEntry["serving"],
      ckfState: DcCkfState
    ): Effect.Effect<PoolAttachment, PoolAttachError> =>
      Effect.gen(function* () {
        const poolId = request.poolId
        // Finalizers run in reverse order: retirement first, then the hub's fibers, then the
        // actor, then the closed signal.
        const scope = yield* Scope.fork(poolsScope, ExecutionStrategy.sequential)
        const actorScope = yield* Scope.fork(scope, ExecutionStrategy.sequential)
        const hubScope = yield* Scope.fork(scope, ExecutionStrategy.sequential)
        const lifetime = new GenerationLifetime(scope, hubScope)
        yield* Scope.addFinalizer(scope, Deferred.succeed(lifetime.closed, undefined))
        const actor = yield* makeActor(
          ckfState,
          { relayIncarnation: relayIdentity.relayIncarnation, layoutGeneration, poolId },
          { publicationDelay: actorConfig.publicationDelay }
        ).pipe(Scope.extend(actorScope))
        yield* Scope.addFinalizer(scope, retireGeneration(poolId, layoutGeneration, actor, lifetime))

        const reservation = state.reservations.get(poolId.key)
        if (!state.accepting || reservation?.layoutGeneration !== layoutGeneration) {
          yield* Scope.close(scope, Exit.void)
          return yield* Effect.fail(
            new PoolAttachError({
              reason: "ReservationRetired",
              poolId,
              detail: `pool ${poolId} generation ${layoutGeneration} reservation was retired before commit`
            })
          )
        }
        const cancel = new GenerationToken()
        const entry: PoolEntry = {
          endpoint: request.endpoint,
          actor,
          identity: actor.identity,
          layoutGeneration,
          registrations: request.registrations,
          querySemantics: request.querySemantics,
          roles: request.roles,
          cancel,
          state: "Active",
          serving,
          hub: new PoolHubSlot(),
          lifetime
        }
        state.reservations.delete(poolId.key)
        state.pools.set(poolId.key, entry)
        catalogUpsert(descriptorOf(entry))
        updateLoad(poolId)
        yield* publish
        yield* Effect.logInfo("Attached KV DC Relay pool generation")
        return new PoolAttachment(
          poolId,
          layoutGeneration,
          actor,
          cancel,
          request.registrations,
          request.roles,
          lifetime
        )
      })

    const activeGeneration = (
      attachment: PoolAttachment
    ): Either.Either<PoolEntry, PoolGenerationInactive> => {
      const entry = state.pools.get(attachment.poolId.key)
      if (entry === undefined) {
        return Either.left(
          new PoolGenerationInactive({
            poolId: attachment.poolId,
            layoutGeneration: attachment.layoutGeneration,
            attached: false
          })
        )
      }
      if (entry.layoutGeneration !== attachment.layoutGeneration || entry.state !== "Active") {
        return Either.left(
          new PoolGenerationInactive({
            poolId: attachment.poolId,
            layoutGeneration: attachment.layoutGeneration,
            attached: true
          })
        )
      }
      return Either.right(entry)
    }

    const replaceRegistrations = (
      attachment: PoolAttachment,
      registrations: ReadonlyArray<CanonicalModelRegistration>
    ): Effect.Effect<void, PoolUpdateFailure> =>
      Effect.gen(function* () {
        if (registrations.length === 0) {
          return yield* Effect.fail(
            new PoolAttachError({
              reason: "NoRegistrations",
              poolId: attachment.poolId,
              detail: `pool ${attachment.poolId} requires at least one canonical model binding`
            })
          )
        }
        if (registrationsEqual(attachment.registrations, registrations)) return
        yield* validatePoolRegistrations(registrations)
        const entry = yield* activeGeneration(attachment)
        entry.registrations = registrations
        attachment.update(registrations, attachment.roles)
        catalogUpsert(descriptorOf(entry))
        yield* publish
      }).pipe(
        annotate(attachment.poolId, attachment.layoutGeneration),
        Effect.withSpan("PoolRegistry.replaceRegistrations", {
          attributes: spanAttributes(attachment.poolId, attachment.layoutGeneration)
        })
      )

    const replaceRoles = (
      attachment: PoolAttachment,
      roles: ReadonlyArray<WorkerRole>
    ): Effect.Effect<void, PoolUpdateFailure> =>
      Effect.gen(function* () {
        yield* validatePoolRoles(roles)
        if (rolesEqual(attachment.roles, roles)) return
        const entry = yield* activeGeneration(attachment)
        entry.roles = roles
        attachment.update(attachment.registrations, roles)
        catalogUpsert(descriptorOf(entry))
        yield* publish
      }).pipe(
        annotate(attachment.poolId, attachment.layoutGeneration),
        Effect.withSpan("PoolRegistry.replaceRoles", {
          attributes: spanAttributes(attachment.poolId, attachment.layoutGeneration)
        })
      )

    const servingGeneration = (poolId: PoolId, layoutGeneration: bigint) => {
      const entry = generationEntry(poolId, layoutGeneration)
      return entry !== undefined && entry.state === "Active" ? entry.serving : undefined
    }

    const replaceLoadCapacity = (
      poolId: PoolId,
      layoutGeneration: bigint,
      runtimeConfigs: ReadonlyMap<WorkerId, RuntimeConfig>
    ): Effect.Effect<boolean, LoadCapacityError> =>
      Effect.suspend(() => {
        const serving = servingGeneration(poolId, layoutGeneration)
        if (serving === undefined) return Effect.succeed(false)
        const replaced = serving.load.replaceCapacity(runtimeConfigs)
        // A failed replacement degraded the state; publish that at once so the previous complete
        // aggregate cannot stay authoritative while the caller retries.
        updateLoad(poolId)
        // True records that this active generation accepted the full runtime config.
        return Effect.zipRight(
          publish,
          Either.isLeft(replaced) ? Effect.fail(replaced.left) : Effect.succeed(true)
        )
      })

    const observeLoad = (
      poolId: PoolId,
      layoutGeneration: bigint,
      load: ActiveLoad
    ): Effect.Effect<boolean> =>
      Effect.suspend(() => {
        const serving = servingGeneration(poolId, layoutGeneration)
        if (serving === undefined) return Effect.succeed(false)
        switch (serving.load.observe(load)) {
          case "UnknownRank":
            return Effect.succeed(false)
          case "IgnoredAdvisory":
            return Effect.succeed(true)
          case "Updated":
            updateLoad(poolId)
            return Effect.as(publish, true)
        }
      })

    const clearLoadObservations = (poolId: PoolId, layoutGeneration: bigint): Effect.Effect<boolean> =>
      Effect.suspend(() => {
        const serving = servingGeneration(poolId, layoutGeneration)
        if (serving === undefined) return Effect.succeed(false)
        if (!serving.load.clearObservations()) return Effect.succeed(true)
        updateLoad(poolId)
        return Effect.as(publish, true)
      })

    const validateActiveProducer = (
      expected: ProducerIdentity
    ): Effect.Effect<GenerationSignal, UnknownPool | ProducerMismatch> =>
      Effect.suspend((): Effect.Effect<GenerationSignal, UnknownPool | ProducerMismatch> => {
        const poolId = expected.poolId
        const entry = activeEntry(poolId)
        if (entry === undefined) return Effect.fail(new UnknownPool({ poolId }))
        if (!entry.identity.equals(expected)) return Effect.fail(new ProducerMismatch({ poolId }))
        // The signal observes retirement without giving admission code authority to retire.
        return Effect.succeed(entry.cancel.signal)
      })

    const coordinator: HubCoordinator = new HubCoordinator({
      maxInitializedHubs,
      config: hubConfig,
      scope: poolsScope,
      evictionGate: options.evictionGate,
      candidates: (target) => {
        const candidates: Array<EvictionCandidate> = []
        for (const entry of state.pools.values()) {
          if (entry.state !== "Active" || entry.hub === target) continue
          candidates.push({ identity: entry.identity, generation: entry.cancel.signal, slot: entry.hub })
        }
        return candidates
      },
      fence: (identity, reason) =>
        fenceGeneration(identity.poolId, identity.layoutGeneration, reason).pipe(Effect.asVoid)
    })

    const hubContext = (entry: PoolEntry): HubStartContext => ({
      coordinator,
      actor: entry.actor,
      generation: entry.cancel.signal,
      terminalFailure: (reason) =>
        fenceGeneration(entry.identity.poolId, entry.layoutGeneration, `publication hub: ${reason}`).pipe(
          Effect.asVoid
        ),
      scope: entry.lifetime.hubScope
    })

    const subscribePool = (
      expected: ProducerIdentity
    ): Effect.Effect<HubSubscription, PublicationHubError, Scope.Scope> => {
      const poolId = expected.poolId
      return Effect.gen(function* () {
        const entry = activeEntry(poolId)
        if (entry === undefined) return yield* Effect.fail(new UnknownPool({ poolId }))
        if (!entry.identity.equals(expected)) return yield* Effect.fail(new ProducerMismatch({ poolId }))
        const slot = entry.hub
        const admission = yield* slot.beginAdmission()
        return yield* Effect.gen(function* () {
          const hub = yield* slot.getOrStart(hubContext(entry))
          // The subscriber must reach the scope's finalizer, so the last step is uninterruptible.
          return yield* Effect.uninterruptible(
            Effect.gen(function* () {
              const current = activeEntry(poolId)
              if (current === undefined) return yield* Effect.fail(new UnknownPool({ poolId }))
              if (!current.identity.equals(expected))
                return yield* Effect.fail(new ProducerMismatch({ poolId }))
              if (current.hub !== slot) {
                return yield* Effect.fail(
                  new PublicationUnavailable({ reason: "pool publication generation changed" })
                )
              }
              const subscription = yield* hub.subscribe()
              yield* Effect.addFinalizer(() => subscription.close)
              return subscription
            })
          )
        }).pipe(Effect.ensuring(Effect.sync(() => admission.release())))
      }).pipe(
        annotate(poolId, expected.layoutGeneration),
        Effect.withSpan("PoolRegistry.subscribePool", {
          attributes: spanAttributes(poolId, expected.layoutGeneration)
        })
      )
    }

    const shutdown: Effect.Effect<void> = Effect.suspend(() => {
      if (state.shutDown) return Effect.void
      state.shutDown = true
      state.accepting = false
      state.reservations.clear()
      const entries = Array.from(state.pools.values())
      state.pools.clear()
      state.catalog = state.catalog.clear(advanceRevision())
      state.loads = []
      return Effect.gen(function* () {
        yield* publish
        for (const entry of entries) {
          entry.cancel.cancel()
          yield* entry.hub.shutdown()
          yield* entry.actor.fence
          yield* Scope.close(entry.lifetime.scope, Exit.void)
        }
        yield* Effect.logInfo("KV DC Relay pool registry shut down").pipe(
          Effect.annotateLogs("generations", entries.length)
        )
      })
    }).pipe(Effect.uninterruptible, Effect.withSpan("PoolRegistry.shutdown"))

    yield* Effect.addFinalizer(() => shutdown)

    const registry: PoolRegistry = {
      relayIdentity,
      attach,
      replaceRegistrations,
      replaceRoles,
      replaceLoadCapacity,
      observeLoad,
      clearLoadObservations,
      withdraw,
      fenceGeneration,
      remove,
      retireWith,
      retire,
      detach: (attachment) => retire(attachment, "Graceful"),
      validateActiveProducer,
      subscribePool,
      catalog: Effect.sync(() => state.catalog),
      catalogRef,
      catalogChanges: catalogRef.changes,
      loadSnapshots: Effect.sync(() => state.loads),
      loadRef,
      shutdown,
      poolCount: Effect.sync(() => state.pools.size),
      reservationCount: Effect.sync(() => state.reservations.size),
      hubSlot: (poolId) => state.pools.get(poolId.key)?.hub,
      availableHubCapacity: () => coordinator.capacity.available
    }
    return registry
  })

export const layer = (options: PoolRegistryOptions): Layer.Layer<PoolRegistry> =>
  Layer.scoped(PoolRegistry, make(options))
