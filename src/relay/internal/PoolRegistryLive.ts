/**
 * The pool registry's implementation (seed 001, `kv_dc_relay/registry.rs`): layout generations
 * reserved per pool, CKF allocation under its semaphore, each generation's scope and retirement
 * (withdraw from the catalog before the actor stops), and the catalog's revisions. The contract
 * is `../PoolRegistry.ts`.
 *
 * Length: `make` is one closure over the registry's tables (pools, reservations, endpoints), which
 * every operation changes in one synchronous block; split across modules, those blocks would
 * pass the tables around and the invariants between them would no longer be read in one place.
 */

import {
  Deferred,
  Effect,
  Either,
  ExecutionStrategy,
  Exit,
  Fiber,
  Metric,
  Scope,
  SubscriptionRef
} from "effect"
import { type CkfConfig, ckfConfig } from "../../ckf/config.js"
import type { PoolId, ProducerIdentity } from "../../ckf/identity.js"
import type { DcCkfState } from "../../ckf/state.js"
import { U64_MAX } from "../../ckf/u64.js"
import * as RelayMetrics from "../../observability/RelayMetrics.js"
import type { RuntimeConfig } from "../../protocol/Discovery.js"
import type { WorkerId } from "../../protocol/Events.js"
import {
  type CanonicalModelRegistration,
  type DcPoolDescriptor,
  type EndpointId,
  registrationListsEqual,
  roleListsEqual,
  validatePoolRegistrations,
  validatePoolRoles,
  type WorkerRole
} from "../../protocol/Model.js"
import { drainFaultsWhile } from "../PendingActorFaults.js"
import type { PoolActor } from "../PoolActor.js"
import { DcPoolCatalog } from "../PoolCatalog.js"
import {
  type ActiveLoad,
  type LoadCapacityError,
  loadSnapshotEquals,
  type PoolLoadSnapshot,
  PoolLoadState
} from "../PoolLoad.js"
import {
  DEFAULT_CKF_ALLOCATION_CONCURRENCY,
  defaultCkfBuilder,
  GenerationLifetime,
  type PoolAttachFailure,
  PoolAttachment,
  type PoolAttachRequest,
  type PoolEntry,
  type PoolRegistry,
  type PoolRegistryOptions,
  type PoolReservation,
  type PoolRetirementMode,
  type PoolUpdateFailure
} from "../PoolRegistry.js"
import {
  DEFAULT_MAX_INITIALIZED_POOL_HUBS,
  type HubSubscription,
  makePublicationHubConfig
} from "../PublicationHub.js"
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
} from "../RelayErrors.js"
import { make as makePoolActor } from "./PoolActorLoop.js"
import { type EvictionCandidate, HubCoordinator, type HubStartContext, PoolHubSlot } from "./PoolHubSlot.js"
import { type GenerationSignal, GenerationToken } from "./sync.js"

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
    // What `catalogRef` holds, for readers on their own turn (`catalogNow`).
    let publishedCatalog = state.catalog
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
          const catalog = state.catalog
          yield* SubscriptionRef.set(catalogRef, catalog)
          publishedCatalog = catalog
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
            yield* Metric.increment(RelayMetrics.terminalPublicationFailures)
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
        if (registrationListsEqual(attachment.registrations, registrations)) return
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
        if (roleListsEqual(attachment.roles, roles)) return
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
      catalogNow: () => publishedCatalog,
      catalogChanges: catalogRef.changes,
      publicationHubCounts: () => {
        const counts = { requested: 0, initialized: 0, ready: 0, idle: 0 }
        for (const entry of state.pools.values()) entry.hub.countInto(counts)
        return counts
      },
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
