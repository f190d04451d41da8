/**
 * The per-generation state machine around a publication hub (relay-service §3.3): vacant →
 * initializing → ready → evicting / failed / retired; and `HubCoordinator`, the relay-wide bound
 * on initialized hubs, which reclaims idle hubs of other generations under pressure. Every
 * transition is a synchronous block; waits re-check a version, so none is lost.
 */

import { Effect, Either, Exit, Option, type Scope, type Types } from "effect"
import type { ProducerIdentity } from "../../ckf/identity.js"
import type { PoolActor } from "../PoolActor.js"
import {
  countLimitRejection,
  generationRetired,
  type PublicationHub,
  type PublicationHubConfig,
  type PublicationHubCounts,
  publicationLease,
  startPublicationHub
} from "../PublicationHub.js"
import { InitializedHubLimit, type PublicationHubError, PublicationUnavailable } from "../RelayErrors.js"
import {
  type GenerationSignal,
  Notify,
  type OwnedPermit,
  OwnedPermits,
  PermitHandoff,
  unlessCancelled
} from "./sync.js"

// ---------------------------------------------------------------------------------------------
// The per-generation slot

type HubPhaseName = "vacant" | "initializing" | "ready" | "evicting" | "failed" | "retired"

type HubPhase =
  | { readonly _tag: "Vacant" }
  | { readonly _tag: "Initializing" }
  | { readonly _tag: "Ready"; readonly hub: PublicationHub; readonly permit: OwnedPermit }
  | { readonly _tag: "Evicting" }
  | { readonly _tag: "Failed"; readonly reason: string }
  | { readonly _tag: "Retired" }

const VACANT: HubPhase = { _tag: "Vacant" }

const INITIALIZING: HubPhase = { _tag: "Initializing" }

const EVICTING: HubPhase = { _tag: "Evicting" }

const RETIRED: HubPhase = { _tag: "Retired" }

/** Held for the duration of one subscribe call; a pending admission protects a hub from eviction. */
interface HubAdmission {
  readonly release: () => void
}

/** What a hub start needs from its generation. */
export interface HubStartContext {
  readonly coordinator: HubCoordinator
  readonly actor: PoolActor
  readonly generation: GenerationSignal
  /** Fences the generation (catalog withdrawal); called at most once per failure. */
  readonly terminalFailure: (reason: string) => Effect.Effect<void>
  /** The generation's hub scope: initialization and the hub's loop run in it. */
  readonly scope: Scope.Scope
}

interface ClaimedIdleHub {
  readonly hub: PublicationHub
  readonly permit: OwnedPermit
}

export class PoolHubSlot {
  private phase: HubPhase = VACANT
  private pendingAdmissions = 0
  private retirementRequested = false
  private readonly changed = new Notify()

  /** Test hook (`PoolHubSlot::phase` in the seed). */
  get phaseName(): HubPhaseName {
    return this.phase._tag.toLowerCase() as HubPhaseName
  }

  get pending(): number {
    return this.pendingAdmissions
  }

  /** The initialized hub, if any (diagnostics). */
  get hub(): PublicationHub | undefined {
    return this.phase._tag === "Ready" ? this.phase.hub : undefined
  }

  /** Adds this slot to the relay's publication hub gauges. */
  countInto(counts: Types.Mutable<PublicationHubCounts>): void {
    const phase = this.phase
    if (phase._tag === "Vacant" || phase._tag === "Retired") return
    counts.requested++
    if (phase._tag !== "Ready" && phase._tag !== "Evicting") return
    // An evicting hub still holds its mirror and its capacity permit until the eviction ends.
    counts.initialized++
    if (phase._tag !== "Ready" || !phase.hub.isReady) return
    counts.ready++
    if (phase.hub.stats.subscribers === 0) counts.idle++
  }

  beginAdmission(): Either.Either<HubAdmission, PublicationUnavailable> {
    if (this.retirementRequested || this.phase._tag === "Retired") return Either.left(generationRetired())
    this.pendingAdmissions++
    let held = true
    return Either.right({
      release: () => {
        if (!held) return
        held = false
        this.pendingAdmissions--
      }
    })
  }

  /** The ready hub, starting it (once per caller) when the slot is vacant. */
  getOrStart(context: HubStartContext): Effect.Effect<PublicationHub, PublicationHubError> {
    let attempted = false
    const waitThen = (version: number): Effect.Effect<PublicationHub, PublicationHubError> =>
      Effect.interruptible(
        Effect.raceFirst(this.changed.changedSince(version), context.generation.await)
      ).pipe(
        Effect.zipRight(
          Effect.suspend(() => (context.generation.isCancelled ? Effect.fail(generationRetired()) : step))
        )
      )
    const step: Effect.Effect<PublicationHub, PublicationHubError> = Effect.suspend(() => {
      const version = this.changed.current
      const phase = this.phase
      switch (phase._tag) {
        case "Ready":
          return Effect.succeed(phase.hub)
        case "Failed":
          return Effect.fail(new PublicationUnavailable({ reason: phase.reason }))
        case "Retired":
          return Effect.fail(generationRetired())
        case "Initializing":
        case "Evicting":
          return waitThen(version)
        case "Vacant": {
          if (attempted) return Effect.fail(new InitializedHubLimit({ limit: context.coordinator.limit }))
          attempted = true
          // Capacity taken here must reach the initialization fiber, so the transition and the
          // fork are one uninterruptible step (the fiber inherits that and opts into interruption).
          return Effect.uninterruptible(
            Effect.suspend(() => {
              const permit = context.coordinator.capacity.tryAcquire()
              this.phase = INITIALIZING
              return Effect.forkIn(this.initialize(context, permit), context.scope)
            })
          ).pipe(Effect.zipRight(waitThen(version)))
        }
      }
    })
    return step
  }

  /** Runs uninterruptibly except for its waits; always leaves `Initializing`. */
  private initialize(context: HubStartContext, initialPermit: OwnedPermit | undefined): Effect.Effect<void> {
    let permit = initialPermit
    const cancel = context.generation
    const lease = publicationLease(context.actor.identity)
    const retireLease = context.actor.retirePublicationLease.pipe(
      Effect.catchAll((error) =>
        Effect.logDebug("KV DC Relay actor stopped before its cancelled publication lease retired").pipe(
          Effect.annotateLogs("error", error.message)
        )
      )
    )
    const settle = (phase: HubPhase): void => {
      this.phase = phase
      this.changed.notify()
    }
    const body = Effect.gen(this, function* () {
      if (permit === undefined) {
        const reclaimed = yield* Effect.either(context.coordinator.reclaim(this, cancel))
        if (Either.isLeft(reclaimed)) {
          const error = reclaimed.left
          if (error._tag === "InitializedHubLimit") {
            if (this.phase._tag === "Initializing") {
              settle(this.retirementRequested || cancel.isCancelled ? RETIRED : VACANT)
            } else {
              this.changed.notify()
            }
            return
          }
          if (cancel.isCancelled) return settle(RETIRED)
          const reason = `failed to reserve publication hub capacity: ${error.message}`
          this.phase = { _tag: "Failed", reason }
          yield* context.terminalFailure(reason)
          this.changed.notify()
          return
        }
        permit = reclaimed.right
      }
      const started = yield* Effect.interruptible(
        unlessCancelled(
          startPublicationHub({
            actor: context.actor,
            config: context.coordinator.config,
            onTerminalFailure: context.terminalFailure,
            scope: context.scope
          }),
          cancel,
          (hub) => hub.shutdown
        )
      )
      if (Option.isNone(started) || cancel.isCancelled) {
        if (Option.isSome(started) && Either.isRight(started.value)) yield* started.value.right.shutdown
        yield* retireLease
        return settle(RETIRED)
      }
      const result = started.value
      if (Either.isRight(result)) {
        const hub = result.right
        if (this.retirementRequested || cancel.isCancelled) {
          this.phase = RETIRED
          yield* hub.shutdown
          yield* retireLease
        } else {
          this.phase = { _tag: "Ready", hub, permit }
          permit = undefined
        }
        this.changed.notify()
        return
      }
      const reason = `failed to initialize publication hub: ${result.left.message}`
      if (this.retirementRequested || cancel.isCancelled) return settle(RETIRED)
      this.phase = { _tag: "Failed", reason }
      yield* context.terminalFailure(reason)
      this.changed.notify()
    })
    return body.pipe(
      Effect.onExit((exit) =>
        Effect.sync(() => {
          // Capacity that did not move into `Ready` goes back, whatever happened.
          permit?.release()
          permit = undefined
          if (Exit.isFailure(exit) && this.phase._tag === "Initializing") settle(RETIRED)
        })
      ),
      Effect.annotateLogs({
        poolId: context.actor.identity.poolId.toString(),
        layoutGeneration: String(lease.assignmentEpoch)
      })
    )
  }

  /** Retires the slot and shuts its hub down, waiting out an initialization or eviction in flight. */
  shutdown(): Effect.Effect<void> {
    return Effect.suspend(() => {
      const version = this.changed.current
      this.retirementRequested = true
      const phase = this.phase
      switch (phase._tag) {
        case "Ready":
          this.phase = RETIRED
          return phase.hub.shutdown.pipe(
            Effect.ensuring(
              Effect.sync(() => {
                phase.permit.release()
                this.changed.notify()
              })
            )
          )
        case "Initializing":
        case "Evicting":
          return Effect.zipRight(this.changed.changedSince(version), this.shutdown())
        default:
          this.phase = RETIRED
          return Effect.void
      }
    })
  }

  /** Synchronous retirement (fence): a ready hub stops and closes its subscribers but keeps its slot until shutdown. */
  retire(): Effect.Effect<void> {
    return Effect.suspend(() => {
      this.retirementRequested = true
      const phase = this.phase
      if (phase._tag === "Ready") return phase.hub.retire
      if (phase._tag === "Vacant" || phase._tag === "Failed") this.phase = RETIRED
      return Effect.void
    })
  }

  /** @internal Claims a ready, idle, unshared hub for eviction (Ready → Evicting). */
  tryClaimIdle(generation: GenerationSignal): ClaimedIdleHub | undefined {
    if (generation.isCancelled) return undefined
    if (this.retirementRequested || this.pendingAdmissions !== 0) return undefined
    const phase = this.phase
    if (phase._tag !== "Ready") return undefined
    if (!phase.hub.tryBeginIdleEviction()) return undefined
    this.phase = EVICTING
    return { hub: phase.hub, permit: phase.permit }
  }

  /** @internal Evicting → Vacant, or Retired when the generation retired meanwhile. */
  finishEviction(isRetired: boolean): void {
    if (this.phase._tag === "Evicting") {
      this.phase = isRetired || this.retirementRequested ? RETIRED : VACANT
    }
    this.changed.notify()
  }
}

// ---------------------------------------------------------------------------------------------
// Relay-wide capacity of initialized hubs

/** A hub that may be evicted to make room: another active generation's slot. */
export interface EvictionCandidate {
  readonly identity: ProducerIdentity
  readonly generation: GenerationSignal
  readonly slot: PoolHubSlot
}

interface HubCoordinatorOptions {
  /** At most this many hubs hold an initialized mirror (default 64). */
  readonly maxInitializedHubs: number
  readonly config: PublicationHubConfig
  /** Where eviction cleanup runs: it outlives the requesting admission (the registry's scope). */
  readonly scope: Scope.Scope
  /** Active generations other than `target`, in the registry's order. */
  readonly candidates: (target: PoolHubSlot) => ReadonlyArray<EvictionCandidate>
  /** Fences a generation whose idle eviction failed (unless it already retired). */
  readonly fence: (identity: ProducerIdentity, reason: string) => Effect.Effect<void>
  /** Test hook: eviction cleanup waits on this after claiming its victim. */
  readonly evictionGate?: Effect.Effect<void> | undefined
}

export class HubCoordinator {
  readonly capacity: OwnedPermits
  /** Serializes pressure requests: one victim per request. */
  readonly pressure = new OwnedPermits(1)
  readonly config: PublicationHubConfig

  constructor(private readonly options: HubCoordinatorOptions) {
    this.capacity = new OwnedPermits(options.maxInitializedHubs)
    this.config = options.config
  }

  get limit(): number {
    return this.options.maxInitializedHubs
  }

  /**
   * Capacity for `target` under pressure: a permit freed meanwhile, or the permit of one idle hub
   * of another active generation, evicted by a cleanup fiber that outlives this request. Run from
   * an uninterruptible region (the initialization fiber); waits are interruptible.
   */
  reclaim(
    target: PoolHubSlot,
    targetCancel: GenerationSignal
  ): Effect.Effect<OwnedPermit, PublicationHubError> {
    return Effect.gen(this, function* () {
      const pressure = yield* this.pressure.acquireUnless(targetCancel)
      if (pressure === undefined) {
        return yield* Effect.fail(
          new PublicationUnavailable({
            reason: "pool generation retired while waiting for publication hub capacity"
          })
        )
      }
      const freed = this.capacity.tryAcquire()
      if (freed !== undefined) {
        pressure.release()
        return freed
      }
      for (const candidate of this.options.candidates(target)) {
        if (candidate.slot === target) continue
        const victim = candidate.slot.tryClaimIdle(candidate.generation)
        if (victim === undefined) continue
        const handoff = new PermitHandoff()
        // Cleanup outlives the requesting admission so cancellation cannot strand the victim in
        // Evicting or leak its permit.
        yield* Effect.forkIn(this.evict(victim, candidate, pressure, handoff), this.options.scope)
        return yield* this.awaitHandoff(handoff, targetCancel)
      }
      pressure.release()
      countLimitRejection("initialized_hub")
      return yield* Effect.fail(new InitializedHubLimit({ limit: this.limit }))
    })
  }

  private awaitHandoff(
    handoff: PermitHandoff,
    targetCancel: GenerationSignal
  ): Effect.Effect<OwnedPermit, PublicationHubError> {
    const step: Effect.Effect<OwnedPermit, PublicationHubError> = Effect.suspend(() => {
      // Biased: a retired requester gives the reclaimed permit back rather than take it.
      if (targetCancel.isCancelled) {
        handoff.abandon()
        return Effect.fail(
          new PublicationUnavailable({
            reason: "pool generation retired while reclaiming publication hub capacity"
          })
        )
      }
      if (handoff.isDelivered) {
        const permit = handoff.take()
        return permit === undefined
          ? Effect.fail(new InitializedHubLimit({ limit: this.limit }))
          : Effect.succeed(permit)
      }
      const version = handoff.changed.current
      return Effect.interruptible(
        Effect.raceFirst(handoff.changed.changedSince(version), targetCancel.await)
      ).pipe(Effect.zipRight(step))
    })
    return step.pipe(Effect.onInterrupt(() => Effect.sync(() => handoff.abandon())))
  }

  /** The cleanup fiber: holds the pressure permit until the victim's capacity is handed over. */
  private evict(
    victim: ClaimedIdleHub,
    candidate: EvictionCandidate,
    pressure: OwnedPermit,
    handoff: PermitHandoff
  ): Effect.Effect<void> {
    let finished = false
    const fenceIfActive = (reason: string): Effect.Effect<void> =>
      candidate.generation.isCancelled
        ? Effect.void
        : this.options.fence(candidate.identity, `idle publication hub eviction failed: ${reason}`)
    const body = Effect.gen(this, function* () {
      const gate = this.options.evictionGate
      if (gate !== undefined) yield* Effect.interruptible(gate)
      const result = yield* Effect.interruptible(victim.hub.evictIdle)
      if (Either.isLeft(result)) {
        yield* Effect.logDebug("Idle KV DC Relay publication hub eviction failed").pipe(
          Effect.annotateLogs("error", result.left)
        )
        yield* fenceIfActive(result.left)
      }
      candidate.slot.finishEviction(candidate.generation.isCancelled)
      finished = true
      handoff.deliver(victim.permit)
    })
    return body.pipe(
      Effect.onExit(() =>
        finished
          ? Effect.void
          : // Abandoned cleanup: the victim must not stay Evicting nor keep its capacity.
            Effect.zipRight(
              fenceIfActive("cleanup task was abandoned"),
              Effect.sync(() => {
                candidate.slot.finishEviction(true)
                victim.permit.release()
                handoff.deliver(undefined)
              })
            )
      ),
      Effect.ensuring(Effect.sync(() => pressure.release())),
      Effect.withSpan("PublicationHub.evictIdle", {
        attributes: {
          poolId: candidate.identity.poolId.toString(),
          layoutGeneration: String(candidate.identity.layoutGeneration)
        }
      })
    )
  }
}
