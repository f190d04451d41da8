/**
 * Serving topology and readiness (relay-service §6): the shared readiness evaluator, the
 * projection of memberships and the pool catalog into entries keyed by
 * `(namespace, canonicalModelId)`, and a publisher that keeps the projection current.
 *
 * Availability: our discovery has no separate liveness watch (Dynamo's "routable instances").
 * A worker whose base card is present in discovery is live — the file and etcd backends drop a
 * card when its worker goes away (lease expiry, file edit) — so an endpoint's availability is
 * authoritative as soon as its membership exists. The projection still takes availability as an
 * input (`undefined` = not yet authoritative ⇒ `UNKNOWN`), so a real liveness source can replace
 * `availabilityFromMembership` without touching the rules.
 */

import { Effect, type Scope, Stream, SubscriptionRef } from "effect"
import type { PoolId } from "../ckf/identity.js"
import {
  type DcMembershipView,
  type EndpointMembership,
  hasServingTopologyConflict,
  isMaterializable,
  type WorkerTopology
} from "../discovery/Membership.js"
import { loopStep, supervised } from "../observability/Supervised.js"
import type { WorkerId } from "../protocol/Events.js"
import {
  type CanonicalModelId,
  type CanonicalModelRegistration,
  compareRegistrations,
  compareWorkerRoles,
  type DcPoolDescriptor,
  type EndpointId,
  type KvQuerySemantics,
  type WorkerRole,
  type WorkerType
} from "../protocol/Model.js"
import { compareUtf8 } from "../protocol/Text.js"
import type { DcPoolCatalog } from "./PoolCatalog.js"

// ---------------------------------------------------------------------------------------------
// Evaluator (§6.1)

type ReadinessState = "READY" | "UNAVAILABLE" | "UNKNOWN"

/** Workers of one endpoint that share `(workerType, modelType, needs)`. */
export interface ReadinessUnit {
  /** null = legacy (a card without `workerType`). */
  readonly workerType: WorkerType | null
  readonly liveCount: number
  /** DNF of required peer roles. */
  readonly needs: ReadonlyArray<ReadonlyArray<WorkerType>>
}

interface ReadinessEvaluation {
  readonly ready: boolean
  /** Typed roles with a live worker, sorted. */
  readonly present: ReadonlyArray<WorkerType>
  readonly missing: ReadonlyArray<WorkerType>
  /** Non-aggregated roles with more than one live unit, sorted (every such role, incl. encode). */
  readonly ambiguous: ReadonlyArray<WorkerType>
  readonly hasLegacy: boolean
}

const sortedRoles = (roles: Iterable<WorkerType>): Array<WorkerType> =>
  Array.from(roles).sort(compareWorkerRoles)

/** Whether a model's serving units cover the roles it needs, and which are missing. */
export const evaluateReadiness = (units: ReadonlyArray<ReadinessUnit>): ReadinessEvaluation => {
  const present = new Set<WorkerType>()
  const liveUnits = new Map<WorkerType, number>()
  let hasLiveWorker = false
  let hasLegacy = false
  for (const unit of units) {
    if (unit.liveCount > 0) hasLiveWorker = true
    if (unit.workerType === null) hasLegacy = true
    else if (unit.liveCount > 0) {
      present.add(unit.workerType)
      liveUnits.set(unit.workerType, (liveUnits.get(unit.workerType) ?? 0) + 1)
    }
  }
  // Compatibility branch: any legacy worker makes the group ready as soon as anything is live.
  if (hasLegacy) {
    return { ready: hasLiveWorker, present: sortedRoles(present), missing: [], ambiguous: [], hasLegacy }
  }
  const ambiguous: Array<WorkerType> = []
  for (const [role, count] of liveUnits) if (role !== "aggregated" && count > 1) ambiguous.push(role)
  const missing = new Set<WorkerType>()
  for (const unit of units) {
    if (unit.workerType === null) continue
    if (!present.has(unit.workerType)) missing.add(unit.workerType)
    // Needs of dead units are ignored: a worker that is not serving cannot be missing a peer.
    if (unit.liveCount === 0 || unit.needs.length === 0) continue
    if (unit.needs.some((alternative) => alternative.every((role) => present.has(role)))) continue
    for (const alternative of unit.needs)
      for (const role of alternative) if (!present.has(role)) missing.add(role)
  }
  return {
    ready: hasLiveWorker && missing.size === 0,
    present: sortedRoles(present),
    missing: sortedRoles(missing),
    ambiguous: sortedRoles(ambiguous),
    hasLegacy
  }
}

// ---------------------------------------------------------------------------------------------
// Projection (§6.2)

interface TopologyMember {
  readonly endpoint: EndpointId
  readonly roles: ReadonlyArray<WorkerRole>
  readonly poolId?: PoolId | undefined
}

interface AdapterReadiness {
  /** The request-facing adapter name. */
  readonly canonicalModelId: CanonicalModelId
  readonly state: ReadinessState
  readonly missingRoles: ReadonlyArray<WorkerType>
}

type DuplicateRole = "prefill" | "decode"

interface TopologyEntry {
  readonly namespace: string
  readonly canonicalModelId: CanonicalModelId
  readonly state: ReadinessState
  readonly presentRoles: ReadonlyArray<WorkerType>
  readonly missingRoles: ReadonlyArray<WorkerType>
  /** Sorted by endpoint text. */
  readonly members: ReadonlyArray<TopologyMember>
  readonly duplicateRoleEndpoints: ReadonlyArray<DuplicateRole>
  readonly legacyFallbackActive: boolean
  /** Sorted by adapter name. */
  readonly adapters: ReadonlyArray<AdapterReadiness>
}

/** The relay's readiness entries at one revision. */
export interface TopologySnapshot {
  /** Starts at 1; +1 exactly when the entries change. */
  readonly revision: bigint
  /** Sorted by (namespace, canonicalModelId). */
  readonly entries: ReadonlyArray<TopologyEntry>
}

/** Live workers per endpoint key (`ns.component.endpoint`); `undefined` = not authoritative yet. */
export type EndpointAvailability = ReadonlyMap<string, ReadonlySet<WorkerId> | undefined>

/** Every worker with a base card is live, and every endpoint of the view is authoritative. */
export const availabilityFromMembership = (view: DcMembershipView): EndpointAvailability => {
  const availability = new Map<string, ReadonlySet<WorkerId>>()
  for (const [key, membership] of view.endpoints) {
    availability.set(key, new Set(membership.workerTopology.keys()))
  }
  return availability
}

interface TopologyProjection {
  readonly entries: ReadonlyArray<TopologyEntry>
  /** Pool-link keys (`endpoint base-model`) claimed by more than one catalog descriptor. */
  readonly conflictingLinks: ReadonlyArray<string>
}

interface PoolLink {
  readonly poolId: PoolId
  readonly querySemantics: KvQuerySemantics
  readonly roles: ReadonlyArray<WorkerRole>
  readonly registrations: ReadonlyArray<CanonicalModelRegistration>
}

const linkKey = (endpoint: string, baseModel: string): string => `${endpoint} ${baseModel}`

const uniqueRoles = (roles: ReadonlyArray<WorkerRole>): Array<WorkerRole> =>
  Array.from(new Set(roles)).sort(compareWorkerRoles)

const sortedRegistrations = (
  registrations: ReadonlyArray<CanonicalModelRegistration>
): Array<CanonicalModelRegistration> => {
  const sorted = [...registrations].sort(compareRegistrations)
  return sorted.filter((r, i) => i === 0 || compareRegistrations(r, sorted[i - 1]!) !== 0)
}

const linkOf = (descriptor: DcPoolDescriptor): PoolLink => ({
  poolId: descriptor.producer.poolId,
  querySemantics: descriptor.querySemantics,
  roles: uniqueRoles(descriptor.poolRoles),
  registrations: sortedRegistrations(descriptor.registrations)
})

/** `(serving endpoint, base model)` → the descriptor claiming it; a key claimed twice is dropped. */
const poolLinks = (catalog: DcPoolCatalog): { links: Map<string, PoolLink>; conflicting: Array<string> } => {
  const links = new Map<string, PoolLink | null>()
  for (const descriptor of catalog.pools) {
    const endpoint = descriptor.servingEndpoint.toString()
    const bases = new Set(descriptor.registrations.map((r) => r.target.baseModel as string))
    for (const base of bases) {
      const key = linkKey(endpoint, base)
      links.set(key, links.has(key) ? null : linkOf(descriptor))
    }
  }
  const resolved = new Map<string, PoolLink>()
  const conflicting: Array<string> = []
  for (const [key, link] of links) {
    if (link === null) conflicting.push(key)
    else resolved.set(key, link)
  }
  return { links: resolved, conflicting: conflicting.sort(compareUtf8) }
}

/**
 * The member's pool, only if the link was published for exactly this membership: same domain,
 * semantics, role set and registration set. A membership that changed since its generation was
 * attached must not be paired with that older generation's pool.
 */
const memberPool = (membership: EndpointMembership, link: PoolLink | undefined): PoolId | undefined => {
  const domain = membership.domain
  if (link === undefined || domain === null || !isMaterializable(membership)) return undefined
  if (!link.poolId.indexerDomain.equals(domain.id)) return undefined
  if (
    link.querySemantics.kvBlockSize !== domain.querySemantics.kvBlockSize ||
    link.querySemantics.hashFormat !== domain.querySemantics.hashFormat
  )
    return undefined
  const roles = uniqueRoles(membership.roles)
  if (roles.length !== link.roles.length || roles.some((role, i) => role !== link.roles[i])) return undefined
  const registrations = sortedRegistrations(membership.registrations)
  if (
    registrations.length !== link.registrations.length ||
    registrations.some((r, i) => compareRegistrations(r, link.registrations[i]!) !== 0)
  )
    return undefined
  return link.poolId
}

const unitKey = (topology: WorkerTopology): string =>
  JSON.stringify([topology.workerType, topology.modelType, topology.needs])

/** Units of `workers` grouped by their topology; `live` counts those in the live set. */
const unitsOf = (
  membership: EndpointMembership,
  workers: Iterable<WorkerId>,
  live: ReadonlySet<WorkerId> | undefined
): Array<ReadinessUnit> => {
  const units = new Map<
    string,
    { workerType: WorkerType | null; liveCount: number; needs: WorkerTopology["needs"] }
  >()
  for (const workerId of workers) {
    const topology = membership.workerTopology.get(workerId)
    if (topology === undefined) continue
    const key = unitKey(topology)
    let unit = units.get(key)
    if (unit === undefined) {
      unit = { workerType: topology.workerType, liveCount: 0, needs: topology.needs }
      units.set(key, unit)
    }
    if (live?.has(workerId) === true) unit.liveCount++
  }
  return Array.from(units.values())
}

interface AdapterGroup {
  authoritative: boolean
  readonly units: Array<ReadinessUnit>
}

interface EntryGroup {
  readonly namespace: string
  readonly model: CanonicalModelId
  authoritative: boolean
  readonly members: Array<TopologyMember>
  readonly units: Array<ReadinessUnit>
  readonly adapters: Map<CanonicalModelId, AdapterGroup>
}

const stateOf = (authoritative: boolean, evaluation: ReadinessEvaluation): ReadinessState =>
  !authoritative ? "UNKNOWN" : evaluation.ready ? "READY" : "UNAVAILABLE"

const isDuplicateRole = (role: WorkerType): role is DuplicateRole => role === "prefill" || role === "decode"

/** The readiness entries of a membership view. */
export const projectTopology = (
  view: DcMembershipView,
  catalog: DcPoolCatalog,
  availability: EndpointAvailability
): TopologyProjection => {
  const { links, conflicting } = poolLinks(catalog)
  const groups = new Map<string, EntryGroup>()
  for (const membership of view.endpoints.values()) {
    if (hasServingTopologyConflict(membership)) continue
    const baseModels = new Set<CanonicalModelId>()
    for (const registration of membership.registrations) {
      if (registration.target._tag === "Base") baseModels.add(registration.target.baseModel)
    }
    if (baseModels.size === 0) continue
    const live = availability.get(membership.key)
    const authoritative = live !== undefined
    const units = unitsOf(membership, membership.workerTopology.keys(), live)
    for (const model of baseModels) {
      const key = `${membership.namespace}\u0000${model}`
      let group = groups.get(key)
      if (group === undefined) {
        group = {
          namespace: membership.namespace,
          model,
          authoritative: true,
          members: [],
          units: [],
          adapters: new Map()
        }
        groups.set(key, group)
      }
      if (!authoritative) group.authoritative = false
      group.members.push({
        endpoint: membership.endpoint,
        roles: membership.roles,
        poolId: memberPool(membership, links.get(linkKey(membership.key, model)))
      })
      group.units.push(...units)
      for (const [served, adapter] of membership.adapters) {
        if (adapter.baseModel !== model) continue
        let adapterGroup = group.adapters.get(served)
        if (adapterGroup === undefined) {
          adapterGroup = { authoritative: true, units: [] }
          group.adapters.set(served, adapterGroup)
        }
        if (!authoritative) adapterGroup.authoritative = false
        adapterGroup.units.push(...unitsOf(membership, adapter.workers.keys(), live))
      }
    }
  }

  const entries: Array<TopologyEntry> = []
  for (const group of groups.values()) {
    const evaluation = evaluateReadiness(group.units)
    const state = stateOf(group.authoritative, evaluation)
    const adapters: Array<AdapterReadiness> = []
    for (const served of Array.from(group.adapters.keys()).sort(compareUtf8)) {
      const adapter = group.adapters.get(served)!
      const adapterEvaluation = evaluateReadiness(adapter.units)
      const adapterState = stateOf(adapter.authoritative, adapterEvaluation)
      adapters.push({
        canonicalModelId: served,
        state: adapterState,
        missingRoles: adapterState === "UNKNOWN" ? [] : adapterEvaluation.missing
      })
    }
    entries.push({
      namespace: group.namespace,
      canonicalModelId: group.model,
      state,
      presentRoles: state === "UNKNOWN" ? [] : evaluation.present,
      missingRoles: state === "UNKNOWN" ? [] : evaluation.missing,
      members: group.members.sort((a, b) => compareUtf8(a.endpoint.toString(), b.endpoint.toString())),
      duplicateRoleEndpoints: evaluation.ambiguous.filter(isDuplicateRole),
      legacyFallbackActive: evaluation.hasLegacy,
      adapters
    })
  }
  entries.sort(
    (a, b) => compareUtf8(a.namespace, b.namespace) || compareUtf8(a.canonicalModelId, b.canonicalModelId)
  )
  return { entries, conflictingLinks: conflicting }
}

/** A canonical text of an entry list: equal texts ⇔ equal entries. */
const topologyEntriesKey = (entries: ReadonlyArray<TopologyEntry>): string =>
  JSON.stringify(
    entries.map((entry) => [
      entry.namespace,
      entry.canonicalModelId,
      entry.state,
      entry.presentRoles,
      entry.missingRoles,
      entry.members.map((member) => [member.endpoint.toString(), member.roles, member.poolId?.key ?? null]),
      entry.duplicateRoleEndpoints,
      entry.legacyFallbackActive,
      entry.adapters.map((adapter) => [adapter.canonicalModelId, adapter.state, adapter.missingRoles])
    ])
  )

/** `previous` itself when the entries did not change, else the next revision. */
export const nextTopologySnapshot = (
  previous: TopologySnapshot,
  entries: ReadonlyArray<TopologyEntry>
): TopologySnapshot =>
  topologyEntriesKey(previous.entries) === topologyEntriesKey(entries)
    ? previous
    : { revision: previous.revision + 1n, entries }

// ---------------------------------------------------------------------------------------------
// Publisher

/** The readiness projection: its current snapshot and its changes. */
export interface TopologyPublisher {
  /** The current snapshot and every later revision (watchers may see coalesced revisions). */
  readonly ref: SubscriptionRef.SubscriptionRef<TopologySnapshot>
  readonly current: Effect.Effect<TopologySnapshot>
}

interface TopologyInputs {
  readonly membershipRef: SubscriptionRef.SubscriptionRef<DcMembershipView>
  readonly catalogRef: SubscriptionRef.SubscriptionRef<DcPoolCatalog>
  /** Default `availabilityFromMembership`. */
  readonly availability?: ((view: DcMembershipView) => EndpointAvailability) | undefined
}

/** Follows memberships and the catalog until the current scope closes. */
export const make = (inputs: TopologyInputs): Effect.Effect<TopologyPublisher, never, Scope.Scope> =>
  Effect.gen(function* () {
    const availabilityOf = inputs.availability ?? availabilityFromMembership
    const project = Effect.gen(function* () {
      const view = yield* SubscriptionRef.get(inputs.membershipRef)
      const catalog = yield* SubscriptionRef.get(inputs.catalogRef)
      return projectTopology(view, catalog, availabilityOf(view))
    })
    const initial = yield* project
    const ref = yield* SubscriptionRef.make<TopologySnapshot>({ revision: 1n, entries: initial.entries })
    let reportedConflicts = ""

    const recompute = Effect.gen(function* () {
      const projection = yield* project
      const conflicts = projection.conflictingLinks.join(", ")
      if (conflicts !== reportedConflicts) {
        reportedConflicts = conflicts
        if (conflicts !== "") {
          yield* Effect.logWarning(
            "KV DC Relay topology: endpoint/base-model pool links claimed by more than one catalog pool were dropped"
          ).pipe(Effect.annotateLogs("links", conflicts))
        }
      }
      const previous = yield* SubscriptionRef.get(ref)
      const next = nextTopologySnapshot(previous, projection.entries)
      if (next !== previous) {
        yield* SubscriptionRef.set(ref, next)
        yield* Effect.logDebug("KV DC Relay topology revision published").pipe(
          Effect.annotateLogs({ revision: String(next.revision), entries: next.entries.length })
        )
      }
    })

    // Only this fiber writes `ref`, so a read-compare-set needs no lock. Supervised: after a
    // defect both refs' current values come first, so the projection catches up at once.
    yield* Stream.merge(
      Stream.map(inputs.membershipRef.changes, () => undefined),
      Stream.map(inputs.catalogRef.changes, () => undefined)
    ).pipe(
      Stream.runForEach(() =>
        loopStep("relay.topology").pipe(Effect.zipRight(recompute), Effect.withSpan("Topology.recompute"))
      ),
      (loop) => supervised("relay.topology", loop),
      Effect.forkScoped
    )

    return { ref, current: SubscriptionRef.get(ref) }
  })
