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
  FiberId,
  type Queue,
  type Scope,
  type Stream,
  type SubscriptionRef
} from "effect"
import { CanonicalCkfState } from "../ckf/canonical.js"
import type { CkfConfig } from "../ckf/config.js"
import { CkfBuildError } from "../ckf/errors.js"
import type { PoolId, ProducerIdentity } from "../ckf/identity.js"
import { DcCkfState } from "../ckf/state.js"
import type { RuntimeConfig } from "../protocol/Discovery.js"
import type { WorkerId } from "../protocol/Events.js"
import type {
  CanonicalModelRegistration,
  DcRelayIdentity,
  EndpointId,
  InvalidPoolDescriptor,
  InvalidRegistrations,
  KvQuerySemantics,
  WorkerRole
} from "../protocol/Model.js"
import type { PoolHubSlot } from "./internal/PoolHubSlot.js"
import type { GenerationSignal, GenerationToken } from "./internal/sync.js"
import type { ActorFault, MakePoolActor, PoolActor, PoolActorOptions } from "./PoolActor.js"
import type { DcPoolCatalog } from "./PoolCatalog.js"
import type { ActiveLoad, LoadCapacityError, PoolLoadSnapshot, PoolLoadState } from "./PoolLoad.js"
import type { HubSubscription, PublicationHubConfig, PublicationHubCounts } from "./PublicationHub.js"
import type {
  CkfBuildFailed,
  KvDcRelayError,
  PoolAttachError,
  PoolGenerationInactive,
  ProducerMismatch,
  PublicationHubError,
  UnknownPool
} from "./RelayErrors.js"

/** CKF tables allocated at once, by default. */
export const DEFAULT_CKF_ALLOCATION_CONCURRENCY = 2

// ---------------------------------------------------------------------------------------------
// Requests and configuration

/** How the registry sizes and runs each pool's actor. */
export interface PoolActorConfig {
  /** Sizes each generation's CKF (the launcher default is 1,048,576). */
  readonly expectedUniqueBlocks: number
  /** Normalized events per publication batch. */
  readonly publicationThreshold: number
  readonly publicationDelay: PoolActorOptions["publicationDelay"]
}

/** Runtime facts of a serving pool; a local-only pool has none and publishes no load. */
interface PoolServingFacts {
  readonly runtimeConfigs: ReadonlyMap<WorkerId, RuntimeConfig>
}

/** What a serving endpoint asks the registry for when it attaches to its pool. */
export interface PoolAttachRequest {
  readonly poolId: PoolId
  readonly endpoint: EndpointId
  readonly registrations: ReadonlyArray<CanonicalModelRegistration>
  readonly querySemantics: KvQuerySemantics
  readonly roles: ReadonlyArray<WorkerRole>
  readonly servingFacts?: PoolServingFacts | undefined
}

/** How a pool generation ends: drained (`Graceful`) or cut off (`Fenced`). */
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

/** Builds a pool's CKF with the canonical core. */
export const defaultCkfBuilder: CkfBuilder = canonicalCkfBuilder

/** The registry's identity, actor settings and limits. */
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

/** What attaching a serving endpoint to its pool fails with. */
export type PoolAttachFailure =
  | PoolAttachError
  | InvalidRegistrations
  | InvalidPoolDescriptor
  | CkfBuildFailed

/** What updating an attached pool's registrations or roles fails with. */
export type PoolUpdateFailure =
  | PoolAttachError
  | InvalidRegistrations
  | InvalidPoolDescriptor
  | PoolGenerationInactive

// ---------------------------------------------------------------------------------------------
// Generations

type PoolEntryState = "Active" | "Withdrawn" | "Fenced"

interface RetirementRequest {
  readonly mode: PoolRetirementMode
  readonly run: Effect.Effect<void>
}

/** The lifetime of one generation: its scope and how the next close retires it. */
export class GenerationLifetime {
  request: RetirementRequest | undefined = undefined
  closing = false
  /** Completed once every finalizer of the generation's scope ran. */
  readonly closed = Deferred.unsafeMake<void>(FiberId.none)

  constructor(
    readonly scope: Scope.CloseableScope,
    readonly hubScope: Scope.CloseableScope
  ) {}
}

/** An attached pool: its endpoint, actor and generation. */
export interface PoolEntry {
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

/** A layout generation reserved for an endpoint before its actor starts. */
export interface PoolReservation {
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

/**
 * The relay's pools by id: attaches endpoints, runs one actor per pool generation, retires them.
 */
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
  /** What `catalogRef` holds, read on the caller's turn (no fiber): the worker queries' fast path. */
  readonly catalogNow: () => DcPoolCatalog
  /** The current catalog, then every later revision (watchers may see coalesced revisions). */
  readonly catalogChanges: Stream.Stream<DcPoolCatalog>
  /** The publication hubs of every entry, counted on the caller's turn. */
  readonly publicationHubCounts: () => PublicationHubCounts
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
