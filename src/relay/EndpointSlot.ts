/**
 * One serving endpoint's slot (seed 000, `run_endpoint_slot`): it owns at most one pool generation
 * of the endpoint and moves it through the lifecycle discovered → starting → active → draining /
 * fenced / lightweight.
 *
 * Materialization gate (relay-service §2.8): a generation exists only while the membership is
 * materializable, the KV source view resolves the KV-state endpoint, some expected rank has an
 * active source, and the source view was computed from the membership's runtime configs. The
 * binding is `(domain, kvStateEndpoint)`:
 * - a binding change retires the old generation BEFORE the new one attaches, so a new model never
 *   appears under the old producer;
 * - registration, role and load-capacity changes of the same binding refresh the active
 *   generation in place (registrations and roles publish a new catalog revision);
 * - a failed start retries with backoff 100 ms doubling to 5 s (the delay restarts whenever the
 *   desired binding changes).
 *
 * Actor faults go through `PendingActorFaults`: a resource fault asks the source supervisor to
 * recover its rank (a `Fenced` answer fences the generation), a protocol fault rejects its
 * source, a producer fence (or overflow of pending faults) fences the generation, and a producer
 * fence arriving while a rank's fault is being handled interrupts that handling. A generation
 * whose token is cancelled under it (withdrawn or fenced by the registry, e.g. a terminal
 * publication failure) is fenced here too and a new one attached.
 *
 * Retirement goes through the registry's `retireWith`: withdraw (catalog, load, hub) → drain
 * actor faults while the recovery side and then the actor are torn down → remove.
 *
 * The loop reads its inputs fresh on every turn (membership, source view) and waits on a
 * version counter, so a change between the read and the wait is never missed.
 */

import {
  Deferred,
  Duration,
  Effect,
  Either,
  ExecutionStrategy,
  Exit,
  Scope,
  Stream,
  SubscriptionRef
} from "effect"
import type { CkfMemberRef } from "../ckf/events.js"
import { memberKey } from "../ckf/events.js"
import { type DcId, PoolId } from "../ckf/identity.js"
import type { Discovery } from "../discovery/Discovery.js"
import {
  type CoordinatedSourceView,
  type KvSourceCoordinator,
  makeKvSourceCoordinator,
  matchesBindingInputs,
  resolvedKvStateEndpoint
} from "../discovery/KvSourceCoordinator.js"
import {
  type EndpointMembership,
  hasPoolMaterializationConflict,
  isMaterializable
} from "../discovery/Membership.js"
import { membershipEquals } from "../discovery/MembershipProjection.js"
import { loopStep } from "../observability/Supervised.js"
import type { RuntimeConfig } from "../protocol/Discovery.js"
import { activeSource, isRecoverableSource } from "../protocol/Discovery.js"
import type { WorkerId } from "../protocol/Events.js"
import { type ResolvedIndexerDomain, resolvedIndexerDomainEquals } from "../protocol/Identity.js"
import {
  type CanonicalModelRegistration,
  type EndpointId,
  registrationListsEqual,
  roleListsEqual,
  type WorkerRole
} from "../protocol/Model.js"
import type { KvEventTransport } from "../recovery/EventTransport.js"
import type { TargetFaultDisposition } from "../recovery/SourceSupervisor.js"
import { raceNextFault } from "./internal/FaultWaiter.js"
import { Notify } from "./internal/sync.js"
import type { EndpointIngestStats, SlotLifecycle } from "./KvDcRelay.js"
import {
  collectPendingWhile,
  drainReadyFaults,
  type PendingActorAction,
  PendingActorFaults,
  reportActorFault,
  reportProducerFenceTrigger
} from "./PendingActorFaults.js"
import * as PoolRecoveryTarget from "./PoolRecoveryTarget.js"
import type {
  PoolAttachFailure,
  PoolAttachment,
  PoolRegistry,
  PoolRetirementMode,
  PoolUpdateFailure
} from "./PoolRegistry.js"
import * as SourceSubscriber from "./SourceSubscriber.js"

/**
 * How a source-level target fault retires the pool generation (the seed's
 * `target_fault_retirement_mode`): only a fenced rank fences the generation; a recovering,
 * reset or stale one leaves it serving.
 */
export const targetFaultRetirementMode = (
  disposition: TargetFaultDisposition
): PoolRetirementMode | undefined => (disposition === "Fenced" ? "Fenced" : undefined)

const START_RETRY_INITIAL: Duration.Duration = Duration.millis(100)
/**
 * How long the first ranks' restores wait for the rest of the initial wave before the pool is
 * rebuilt from the ones that arrived. The seed waits a whole recovery attempt (30 s); a replay
 * endpoint that never answers then holds every healthy sibling's blocks back that long
 * (PROTOCOL §3.2). A straggler's restore lands later in a batch of its own.
 */
const INITIAL_RECOVERY_WAVE_DEADLINE: Duration.Duration = Duration.millis(500)
const START_RETRY_MAX: Duration.Duration = Duration.seconds(5)
/** How often each rank's `kvUsedBlocks` is observed from the actor's member block counts. */
const LOAD_OBSERVATION_INTERVAL: Duration.Duration = Duration.seconds(1)

// ---------------------------------------------------------------------------------------------
// Bindings and pure helpers

/** What a generation is bound to; any change needs a new generation. */
export interface ActorBinding {
  readonly domain: ResolvedIndexerDomain
  readonly kvStateEndpoint: EndpointId
}

const bindingEquals = (a: ActorBinding | undefined, b: ActorBinding | undefined): boolean =>
  a === undefined || b === undefined
    ? a === b
    : resolvedIndexerDomainEquals(a.domain, b.domain) &&
      a.kvStateEndpoint.toString() === b.kvStateEndpoint.toString()

/**
 * The lifecycle of a slot without a generation. Only conflicts that fence the pool count: a
 * ServingBinding conflict (an unresolvable alias or adapter) drops a binding but still lets the
 * pool materialize, so it must not make the relay unhealthy.
 */
export const inactiveSlotLifecycle = (membership: EndpointMembership | undefined): SlotLifecycle =>
  membership === undefined
    ? "lightweight"
    : hasPoolMaterializationConflict(membership)
      ? "fenced"
      : "discovered"

/** The materialization gate (§2.8): the binding a generation should have now, if any. */
const desiredBinding = (
  membership: EndpointMembership | undefined,
  sourceView: CoordinatedSourceView | undefined
): ActorBinding | undefined => {
  if (membership === undefined || sourceView === undefined) return undefined
  if (!isMaterializable(membership) || membership.domain === null) return undefined
  const kvStateEndpoint = resolvedKvStateEndpoint(sourceView)
  if (kvStateEndpoint === undefined) return undefined
  for (const rank of sourceView.ranks.values()) {
    if (activeSource(rank.status) !== undefined) return { domain: membership.domain, kvStateEndpoint }
  }
  return undefined
}

const sameMembership = (a: EndpointMembership | undefined, b: EndpointMembership | undefined): boolean =>
  a === b || (a !== undefined && b !== undefined && a.generation === b.generation && membershipEquals(a, b))

type RegistrationRefresh = "Skipped" | "Published"

/**
 * Publishes new registrations for the active generation only while its binding is still the
 * desired one and the source view is current: otherwise the generation is about to be replaced,
 * and publishing would show the new models under the old producer.
 */
export const refreshPoolRegistrations = (
  registry: PoolRegistry,
  attachment: PoolAttachment,
  activeBinding: ActorBinding,
  desired: ActorBinding | undefined,
  sourceBindingPending: boolean,
  registrations: ReadonlyArray<CanonicalModelRegistration>
): Effect.Effect<RegistrationRefresh, PoolUpdateFailure> =>
  sourceBindingPending || !bindingEquals(activeBinding, desired)
    ? Effect.succeed("Skipped")
    : registry.replaceRegistrations(attachment, registrations).pipe(Effect.as("Published" as const))

// ---------------------------------------------------------------------------------------------
// Status

/** What the host reads of a slot (the seed's `EndpointSlotStatus`); written only by the slot. */
export class EndpointSlotStatus {
  lifecycle: SlotLifecycle = "lightweight"
  layoutGeneration = 0n
  membership: EndpointMembership | undefined = undefined
  /** The active generation (the seed's actor handle). */
  attachment: PoolAttachment | undefined = undefined
  subscriber: SourceSubscriber.SourceSubscriber | undefined = undefined
  /** Ingest of the generations already retired, so the endpoint's counters never go backwards. */
  retiredIngest: EndpointIngestStats = SourceSubscriber.emptyIngest

  constructor(readonly endpoint: EndpointId) {}

  get ingest(): Effect.Effect<EndpointIngestStats> {
    const subscriber = this.subscriber
    const retired = this.retiredIngest
    return subscriber === undefined
      ? Effect.succeed(retired)
      : Effect.map(subscriber.ingest, (current) => SourceSubscriber.addIngest(retired, current))
  }
}

// ---------------------------------------------------------------------------------------------
// The slot

interface EndpointSlotOptions {
  readonly endpoint: EndpointId
  readonly dcId: DcId
  readonly registry: PoolRegistry
  /** The endpoint's latest membership; undefined = lightweight (no pool, no source watch). */
  readonly membership: SubscriptionRef.SubscriptionRef<EndpointMembership | undefined>
  /** Completing it drains the slot and ends it (the seed's cancel token and dropped sender). */
  readonly stop: Deferred.Deferred<void>
  readonly status: EndpointSlotStatus
  /** Serializes this endpoint's rank-replacement rebuilds (one permit per slot in the seed). */
  readonly rebuildPermit: Effect.Semaphore
  /** Relay-wide limit of in-flight worker queries. */
  readonly recoverySemaphore: Effect.Semaphore
  readonly recoveryAttemptTimeout: Duration.DurationInput
  readonly eventTransport: KvEventTransport
  readonly loadObservationInterval?: Duration.DurationInput | undefined
}

interface EndpointPoolRuntime {
  readonly attachment: PoolAttachment
  /** Holds the recovery target, the subscriber and the load observer of the generation. */
  readonly recoveryScope: Scope.CloseableScope
  readonly subscriber: SourceSubscriber.SourceSubscriber
  readonly binding: ActorBinding
  registrations: ReadonlyArray<CanonicalModelRegistration>
  roles: ReadonlyArray<WorkerRole>
  loadConfigs: ReadonlyMap<WorkerId, RuntimeConfig>
}

interface SourceWatch {
  readonly coordinator: KvSourceCoordinator
  readonly scope: Scope.CloseableScope
}

type SlotInput =
  | { readonly _tag: "Changed" }
  | { readonly _tag: "Fault"; readonly action: PendingActorAction }
  | { readonly _tag: "PoolUnavailable" }
  | { readonly _tag: "Retry" }
  | { readonly _tag: "Stopped" }

const CHANGED: SlotInput = { _tag: "Changed" }
const POOL_UNAVAILABLE: SlotInput = { _tag: "PoolUnavailable" }
const RETRY: SlotInput = { _tag: "Retry" }
const STOPPED: SlotInput = { _tag: "Stopped" }

/**
 * Runs the slot until `stop` completes (or the fiber is interrupted), then drains its generation
 * gracefully and leaves the status lightweight.
 */
export const run = (options: EndpointSlotOptions): Effect.Effect<void, never, Discovery> => {
  const { registry, status, endpoint } = options
  const loadInterval = Duration.decode(options.loadObservationInterval ?? LOAD_OBSERVATION_INTERVAL)

  return Effect.scoped(
    Effect.gen(function* () {
      const slotScope = yield* Effect.scope
      const wake = new Notify()
      yield* options.membership.changes.pipe(
        Stream.runForEach(() => Effect.sync(() => wake.notify())),
        Effect.forkScoped
      )

      let source: SourceWatch | undefined
      let runtime: EndpointPoolRuntime | undefined
      let layoutGeneration = 0n
      let retryBinding: ActorBinding | undefined
      let retryDelay = START_RETRY_INITIAL
      let startFailures = 0
      let refreshFailures = 0
      const pending = new PendingActorFaults()

      const openSourceWatch = (configs: ReadonlyMap<WorkerId, RuntimeConfig>) =>
        Effect.gen(function* () {
          const scope = yield* Scope.fork(slotScope, ExecutionStrategy.sequential)
          const coordinator = yield* makeKvSourceCoordinator(endpoint, configs).pipe(Scope.extend(scope))
          yield* coordinator.changes.pipe(
            Stream.runForEach(() => Effect.sync(() => wake.notify())),
            Effect.forkIn(scope)
          )
          return { coordinator, scope } satisfies SourceWatch
        })

      const closeSourceWatch = Effect.suspend(() => {
        const watch = source
        source = undefined
        return watch === undefined ? Effect.void : Scope.close(watch.scope, Exit.void)
      })

      const retire = (active: EndpointPoolRuntime, mode: PoolRetirementMode): Effect.Effect<void> => {
        const actor = active.attachment.actor
        const recovery = Effect.zipRight(
          active.subscriber.shutdown,
          Scope.close(active.recoveryScope, Exit.void)
        )
        const teardown =
          mode === "Graceful"
            ? Effect.zipRight(recovery, actor.shutdown)
            : Effect.all([recovery, actor.fence], { concurrency: 2, discard: true })
        return registry.retireWith(active.attachment, mode, teardown).pipe(
          Effect.catchAll((error) =>
            Effect.logWarning("Failed to retire KV DC Relay pool actor").pipe(
              Effect.annotateLogs({ error: error.message, mode })
            )
          ),
          Effect.annotateLogs({
            poolId: active.attachment.poolId.toString(),
            layoutGeneration: String(active.attachment.layoutGeneration),
            kvStateEndpoint: active.binding.kvStateEndpoint.toString()
          }),
          Effect.withSpan("EndpointSlot.retire", {
            attributes: {
              "kvrelay.endpoint": endpoint.toString(),
              "kvrelay.pool": active.attachment.poolId.toString(),
              "kvrelay.layout_generation": String(active.attachment.layoutGeneration),
              mode
            }
          })
        )
      }

      /** Takes the runtime out of the slot and retires it; the status shows `during` meanwhile. */
      const retireRuntime = (mode: PoolRetirementMode, during: SlotLifecycle) =>
        Effect.gen(function* () {
          const active = runtime
          if (active === undefined) return
          runtime = undefined
          status.lifecycle = during
          yield* retire(active, mode)
          // The subscriber's counters froze at its shutdown; move them to the retired total in
          // the same step that unlinks it, so the endpoint's ingest is never counted twice.
          const ingest = yield* active.subscriber.ingest
          status.retiredIngest = SourceSubscriber.addIngest(status.retiredIngest, ingest)
          status.attachment = undefined
          status.subscriber = undefined
          pending.clear()
        })

      const observeLoad = (attachment: PoolAttachment, coordinator: KvSourceCoordinator) =>
        // PROTOCOL defines no load input (no `kv_metrics` subject reaches the relay), so each rank's
        // `kvUsedBlocks` is the actor's exact member block count: the device-tier blocks the rank
        // published. Only ranks with an active source report; an inactive rank's occupancy is
        // unknown, not zero.
        Effect.gen(function* () {
          const members = yield* attachment.actor.memberCounts
          const counts = new Map<string, number>()
          for (const member of members) counts.set(memberKey(member.workerId, member.dpRank), member.count)
          const view = yield* coordinator.current
          for (const rank of view.ranks.values()) {
            if (activeSource(rank.status) === undefined) continue
            yield* registry.observeLoad(attachment.poolId, attachment.layoutGeneration, {
              workerId: rank.workerId,
              dpRank: rank.dpRank,
              kvUsedBlocks: BigInt(counts.get(memberKey(rank.workerId, rank.dpRank)) ?? 0)
            })
          }
        }).pipe(Effect.catchAll(() => Effect.void))

      /** The generation's recovery side: target, subscriber, load observer (all in `recoveryScope`). */
      const buildRecovery = (
        attachment: PoolAttachment,
        recoveryScope: Scope.CloseableScope,
        watch: SourceWatch,
        kvBlockSize: number
      ) =>
        Effect.gen(function* () {
          const view = yield* watch.coordinator.current
          const expected: Array<CkfMemberRef> = []
          for (const rank of view.ranks.values()) {
            const active = activeSource(rank.status)
            if (active !== undefined && isRecoverableSource(active)) {
              expected.push({ workerId: rank.workerId, dpRank: rank.dpRank })
            }
          }
          const target = yield* PoolRecoveryTarget.make(attachment.actor, {
            rebuildPermit: options.rebuildPermit,
            expected,
            initialDeadline: Duration.min(
              Duration.decode(options.recoveryAttemptTimeout),
              INITIAL_RECOVERY_WAVE_DEADLINE
            )
          }).pipe(Scope.extend(recoveryScope))
          const subscriber = yield* SourceSubscriber.make({
            servingEndpoint: endpoint,
            target,
            sources: watch.coordinator,
            recoverySemaphore: options.recoverySemaphore,
            recoveryAttemptTimeout: options.recoveryAttemptTimeout,
            eventTransport: options.eventTransport,
            kvBlockSize
          }).pipe(Scope.extend(recoveryScope))
          // The first observation waits one interval, so a generation whose initial restore is
          // still running does not report an authoritative zero.
          yield* observeLoad(attachment, watch.coordinator).pipe(
            Effect.delay(loadInterval),
            Effect.forever,
            Effect.forkIn(recoveryScope)
          )
          return subscriber
        })

      const startEndpointPool = (
        binding: ActorBinding,
        membership: EndpointMembership,
        watch: SourceWatch
      ): Effect.Effect<EndpointPoolRuntime, PoolAttachFailure> =>
        Effect.uninterruptibleMask((restore) =>
          Effect.gen(function* () {
            const attachment = yield* restore(
              registry.attach({
                poolId: new PoolId(binding.domain.id, options.dcId),
                endpoint,
                registrations: membership.registrations,
                querySemantics: binding.domain.querySemantics,
                roles: membership.roles,
                servingFacts: { runtimeConfigs: membership.runtimeConfigs }
              })
            )
            // From here the generation reaches the slot or is retired. The recovery side is built
            // interruptibly (its fibers must stay interruptible), with the cleanup guaranteed.
            const recoveryScope = yield* Scope.fork(slotScope, ExecutionStrategy.sequential)
            const subscriber = yield* restore(
              buildRecovery(attachment, recoveryScope, watch, binding.domain.querySemantics.kvBlockSize)
            ).pipe(
              Effect.onExit((exit) =>
                Exit.isSuccess(exit)
                  ? Effect.void
                  : registry
                      .retireWith(
                        attachment,
                        "Graceful",
                        Effect.zipRight(Scope.close(recoveryScope, Exit.void), attachment.actor.shutdown)
                      )
                      .pipe(Effect.ignore)
              )
            )
            return {
              attachment,
              recoveryScope,
              subscriber,
              binding,
              registrations: membership.registrations,
              roles: membership.roles,
              loadConfigs: membership.runtimeConfigs
            } satisfies EndpointPoolRuntime
          })
        ).pipe(
          Effect.withSpan("EndpointSlot.start", {
            attributes: {
              "kvrelay.endpoint": endpoint.toString(),
              "kvrelay.kv_state_endpoint": binding.kvStateEndpoint.toString()
            }
          })
        )

      /** Same binding, new metadata: registrations, roles and load capacity in place. */
      const refreshActive = (
        active: EndpointPoolRuntime,
        membership: EndpointMembership,
        desired: ActorBinding | undefined,
        sourceBindingPending: boolean
      ) =>
        Effect.gen(function* () {
          const attachment = active.attachment
          if (!registrationListsEqual(active.registrations, membership.registrations)) {
            const refreshed = yield* Effect.either(
              refreshPoolRegistrations(
                registry,
                attachment,
                active.binding,
                desired,
                sourceBindingPending,
                membership.registrations
              )
            )
            if (Either.isRight(refreshed)) {
              if (refreshed.right === "Published") {
                refreshFailures = 0
                active.registrations = membership.registrations
              }
            } else {
              refreshFailures++
              const log = refreshFailures === 1 ? Effect.logWarning : Effect.logDebug
              yield* log("Failed to refresh KV DC Relay model bindings").pipe(
                Effect.annotateLogs({ error: refreshed.left.message, failures: refreshFailures })
              )
            }
          }
          const current = !sourceBindingPending && bindingEquals(active.binding, desired)
          if (current && !roleListsEqual(active.roles, membership.roles)) {
            const replaced = yield* Effect.either(registry.replaceRoles(attachment, membership.roles))
            if (Either.isRight(replaced)) active.roles = membership.roles
            else {
              yield* Effect.logWarning("Failed to refresh KV DC Relay pool roles").pipe(
                Effect.annotateLogs({ error: replaced.left.message })
              )
            }
          }
          if (current && active.loadConfigs !== membership.runtimeConfigs) {
            active.loadConfigs = membership.runtimeConfigs
            const replaced = yield* Effect.either(
              registry.replaceLoadCapacity(
                attachment.poolId,
                attachment.layoutGeneration,
                membership.runtimeConfigs
              )
            )
            if (Either.isLeft(replaced)) {
              yield* Effect.logWarning("Invalid KV DC Relay pool load capacity; load is degraded").pipe(
                Effect.annotateLogs({ error: replaced.left.message })
              )
            }
          }
        }).pipe(
          Effect.withSpan("EndpointSlot.refresh", {
            attributes: {
              "kvrelay.endpoint": endpoint.toString(),
              "kvrelay.layout_generation": String(active.attachment.layoutGeneration)
            }
          })
        )

      /**
       * Runs a supervisor call while the actor's faults are collected; a producer fence among
       * them is reported and wins over the call's result.
       */
      const fencedOr = <A>(active: { readonly attachment: PoolAttachment }, call: Effect.Effect<A>) =>
        Effect.gen(function* () {
          const collected = yield* collectPendingWhile(active.attachment.faults, pending, call)
          if (collected._tag !== "ProducerFence") return collected
          yield* reportProducerFenceTrigger(collected.trigger)
          return "Fenced" as const
        })

      /** The retirement mode a fault asks for (undefined: the generation stays). */
      const handleFault = (action: PendingActorAction): Effect.Effect<PoolRetirementMode | undefined> =>
        Effect.gen(function* () {
          if (action._tag === "ProducerFence") {
            yield* reportProducerFenceTrigger(action.trigger)
            return "Fenced" as const
          }
          const fault = action.fault
          yield* reportActorFault(fault)
          const active = runtime
          switch (fault.disposition.action) {
            case "ContinueCapacityOmission":
              return undefined
            case "ReportResourceFailure": {
              if (active === undefined) return undefined
              const collected = yield* fencedOr(
                active,
                active.subscriber.supervisor.handleTargetFault(
                  fault.workerId,
                  fault.dpRank,
                  fault.sourceEpoch,
                  false
                )
              )
              return collected === "Fenced" ? collected : targetFaultRetirementMode(collected.value)
            }
            case "RejectSource": {
              if (active === undefined) return undefined
              const collected = yield* fencedOr(
                active,
                active.subscriber.supervisor.rejectSource(
                  fault.workerId,
                  fault.dpRank,
                  fault.sourceEpoch,
                  fault.message
                )
              )
              return collected === "Fenced" ? collected : undefined
            }
            case "FenceAndRebuildProducer":
              return "Fenced" as const
            case "DeactivateAndSnapshot":
            case "RetrySnapshot":
              // Unreachable in the seed (consumer-lane dispositions); fencing is the safe reading.
              return "Fenced" as const
          }
        })

      const nextInput = (seen: number, desired: ActorBinding | undefined): Effect.Effect<SlotInput> =>
        Effect.suspend(() => {
          const queued = pending.popFront()
          if (queued !== undefined) return Effect.succeed<SlotInput>({ _tag: "Fault", action: queued })
          const waits: Array<Effect.Effect<SlotInput>> = [
            Effect.as(Deferred.await(options.stop), STOPPED),
            Effect.as(wake.changedSince(seen), CHANGED)
          ]
          const active = runtime
          if (active !== undefined)
            waits.push(Effect.as(active.attachment.poolCancel.await, POOL_UNAVAILABLE))
          if (active === undefined && desired !== undefined)
            waits.push(Effect.as(Effect.sleep(retryDelay), RETRY))
          const others = Effect.raceAll(waits)
          if (active === undefined) return others
          // Never a `Queue.take` raced against the other inputs: an interrupted taker drops the
          // fault an offer already handed it. The other inputs are level-triggered (re-read on the
          // next turn), so dropping their result when a fault wins loses nothing.
          return Effect.map(
            raceNextFault(active.attachment.faults, others, (fault) => pending.push(fault)),
            (raced): SlotInput => {
              switch (raced._tag) {
                case "Fault":
                  return { _tag: "Fault", action: { _tag: "Fault", fault: raced.fault } }
                case "Done":
                  return raced.value
                case "ShutDown":
                  return POOL_UNAVAILABLE
              }
            }
          )
        })

      const drain = Effect.gen(function* () {
        if (runtime !== undefined) yield* retireRuntime("Graceful", "draining")
        yield* closeSourceWatch
        status.attachment = undefined
        status.subscriber = undefined
        status.lifecycle = "lightweight"
      })

      const loop = Effect.gen(function* () {
        for (;;) {
          if (yield* Deferred.isDone(options.stop)) return
          yield* loopStep("relay.endpoint-slot")
          const seen = wake.current
          const membership = yield* SubscriptionRef.get(options.membership)
          status.membership = membership
          status.layoutGeneration = layoutGeneration
          if (runtime === undefined) status.lifecycle = inactiveSlotLifecycle(membership)

          if (membership !== undefined) {
            if (source !== undefined) yield* source.coordinator.setRuntimeConfigs(membership.runtimeConfigs)
            else source = yield* openSourceWatch(membership.runtimeConfigs)
          }
          const sourceView = source === undefined ? undefined : yield* source.coordinator.current
          const sourceBindingPending =
            membership !== undefined &&
            sourceView !== undefined &&
            !matchesBindingInputs(sourceView, membership.runtimeConfigs)
          const desired = desiredBinding(membership, sourceView)
          if (!bindingEquals(retryBinding, desired)) {
            retryBinding = desired
            retryDelay = START_RETRY_INITIAL
            startFailures = 0
            refreshFailures = 0
          }

          const bindingChanged = runtime !== undefined && !bindingEquals(runtime.binding, desired)
          if (bindingChanged || membership === undefined) {
            if (runtime !== undefined) {
              const lifecycle = inactiveSlotLifecycle(membership)
              yield* Effect.logInfo(
                "KV DC Relay endpoint binding changed; retiring its pool generation"
              ).pipe(Effect.annotateLogs({ next: lifecycle }))
              yield* retireRuntime(
                lifecycle === "fenced" ? "Fenced" : "Graceful",
                lifecycle === "fenced" ? "fenced" : "draining"
              )
              status.lifecycle = lifecycle
            }
            if (membership === undefined) {
              yield* closeSourceWatch
              status.lifecycle = "lightweight"
            }
          }

          if (
            runtime !== undefined &&
            membership !== undefined &&
            isMaterializable(membership) &&
            (!registrationListsEqual(runtime.registrations, membership.registrations) ||
              !roleListsEqual(runtime.roles, membership.roles) ||
              runtime.loadConfigs !== membership.runtimeConfigs)
          ) {
            yield* refreshActive(runtime, membership, desired, sourceBindingPending)
          }

          if (
            runtime === undefined &&
            !sourceBindingPending &&
            desired !== undefined &&
            membership !== undefined &&
            source !== undefined
          ) {
            status.lifecycle = "starting"
            const watch = source
            const started = yield* Effect.either(startEndpointPool(desired, membership, watch))
            if (Either.isRight(started)) {
              const candidate = started.right
              const stillCurrent =
                sameMembership(yield* SubscriptionRef.get(options.membership), membership) &&
                source === watch &&
                resolvedKvStateEndpoint(yield* watch.coordinator.current)?.toString() ===
                  desired.kvStateEndpoint.toString()
              if (stillCurrent) {
                retryDelay = START_RETRY_INITIAL
                startFailures = 0
                refreshFailures = 0
                layoutGeneration = candidate.attachment.layoutGeneration
                runtime = candidate
                status.layoutGeneration = layoutGeneration
                status.attachment = candidate.attachment
                status.subscriber = candidate.subscriber
                status.lifecycle = "active"
                yield* Effect.logInfo("KV DC Relay endpoint pool generation active").pipe(
                  Effect.annotateLogs({
                    poolId: candidate.attachment.poolId.toString(),
                    layoutGeneration: String(layoutGeneration)
                  })
                )
              } else {
                // The inputs moved while the generation started: retire it and decide again.
                runtime = candidate
                yield* retireRuntime("Graceful", "draining")
                status.lifecycle = inactiveSlotLifecycle(membership)
              }
            } else {
              startFailures++
              const log = startFailures === 1 ? Effect.logError : Effect.logDebug
              yield* log(
                startFailures === 1
                  ? "Failed to materialize KV DC Relay endpoint actor"
                  : "KV DC Relay endpoint actor retry failed"
              ).pipe(
                Effect.annotateLogs({
                  error: started.left.message,
                  failures: startFailures,
                  retryMs: Duration.toMillis(retryDelay)
                })
              )
              status.lifecycle = "fenced"
              status.attachment = undefined
              status.subscriber = undefined
            }
          }

          if (runtime !== undefined) yield* drainReadyFaults(runtime.attachment.faults, pending)
          const input = yield* nextInput(seen, desired)
          switch (input._tag) {
            case "Stopped":
              return
            case "Changed":
              break
            case "Retry":
              retryDelay = Duration.min(Duration.times(retryDelay, 2), START_RETRY_MAX)
              break
            case "PoolUnavailable":
              yield* Effect.logWarning(
                "KV DC Relay pool generation became unavailable; restarting pool actor"
              )
              status.lifecycle = "fenced"
              yield* retireRuntime("Fenced", "fenced")
              pending.clear()
              break
            case "Fault": {
              const mode = yield* handleFault(input.action)
              if (mode !== undefined) {
                yield* retireRuntime(mode, "fenced")
                status.lifecycle = "fenced"
                pending.clear()
              }
              break
            }
          }
        }
      })

      yield* loop.pipe(Effect.ensuring(drain))
    })
  ).pipe(Effect.annotateLogs({ component: "endpoint-slot", endpoint: endpoint.toString() }))
}
