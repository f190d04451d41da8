/**
 * Model cards → one `EndpointMembership` per serving endpoint (relay-service.md §2.3–§2.6).
 *
 * Pure code. Two paths produce the same views: `projectMembership` projects a record set from
 * scratch; `MembershipProjector` keeps each endpoint's intermediate build and the DC-wide name
 * index, and on a new record set rebuilds only endpoints whose cards changed (by reference) plus
 * the endpoints whose names changed ambiguity. Generations are assigned the same way on both
 * paths: a new counter value, in endpoint order, for every endpoint that appeared or whose
 * membership differs in any field but `generation`.
 */

import { Either } from "effect"
import type { ModelCardInstance, RuntimeConfig } from "../protocol/Discovery.js"
import type { WorkerId } from "../protocol/Events.js"
import {
  type ResolvedIndexerDomain,
  resolvedIndexerDomainEquals,
  resolveIndexerDomain
} from "../protocol/Identity.js"
import {
  type CanonicalModelId,
  compareRegistrations,
  compareWorkerRoles,
  EndpointId,
  type ModelAlias,
  ModelTarget,
  roleFromWorkerType,
  validateCanonicalModelId,
  validateModelAlias,
  type WorkerRole,
  withTarget
} from "../protocol/Model.js"
import { compareArrays, compareUtf8 } from "../protocol/Text.js"
import { type DiscoveryScope, scopeMatches } from "./DiscoveryConfig.js"
import { cardInstanceId, cardPath, type ModelCardInstanceId, recordEquals } from "./DiscoveryRecords.js"
import {
  type AdapterMembership,
  type AdapterWorker,
  CONFLICT_REASONS,
  type ConflictSubject,
  type DcMembershipView,
  type EndpointMembership,
  emptyMembershipView,
  type MaterializationConflict,
  makeConflict,
  type ProjectionDiagnostic,
  type WorkerTopology
} from "./Membership.js"

// ---------------------------------------------------------------------------------------------
// Per-endpoint build (§2.5 steps 2–7)

interface Claim {
  readonly model: CanonicalModelId
  readonly target: ModelTarget
  /** `BindingIdentity = (model, target)` as a string. */
  readonly binding: string
  readonly aliases: ReadonlyArray<ModelAlias>
}

interface EndpointBuild {
  readonly endpoint: EndpointId
  readonly key: string
  readonly domain: ResolvedIndexerDomain | null
  readonly claims: ReadonlyArray<Claim>
  readonly runtimeConfigs: ReadonlyMap<WorkerId, RuntimeConfig>
  readonly workerTopology: ReadonlyMap<WorkerId, WorkerTopology>
  readonly adapters: ReadonlyMap<CanonicalModelId, AdapterMembership>
  readonly conflicts: ReadonlyArray<MaterializationConflict>
  readonly diagnostics: ReadonlyArray<ProjectionDiagnostic>
  /** Every model and alias name the claims use: the endpoints to refinish when a name flips. */
  readonly names: ReadonlySet<string>
}

interface ProjectedBase {
  readonly card: ModelCardInstance
  readonly id: ModelCardInstanceId
  readonly domain: ResolvedIndexerDomain | null
  readonly model: CanonicalModelId | null
  readonly aliases: ReadonlyArray<ModelAlias>
}

const bindingKey = (model: string, target: ModelTarget): string =>
  target._tag === "Base"
    ? `${model}\u0000B\u0000${target.baseModel}`
    : `${model}\u0000L\u0000${target.baseModel}\u0000${target.adapter}`

const domainKey = (domain: ResolvedIndexerDomain): string =>
  `${domain.id.key}|${domain.querySemantics.kvBlockSize}|${domain.querySemantics.hashFormat}`

const sortedUnique = <A extends string>(values: Iterable<A>, compare: (a: A, b: A) => number): Array<A> => {
  const sorted = Array.from(values).sort(compare)
  return sorted.filter((value, i) => i === 0 || value !== sorted[i - 1])
}

const compareCards = (a: ModelCardInstance, b: ModelCardInstance): number =>
  compareUtf8(cardPath(cardInstanceId(a)), cardPath(cardInstanceId(b)))

/** Valid aliases of a card that differ from `model`, sorted and unique; invalid ones are soft errors. */
const validAliases = (
  card: ModelCardInstance,
  path: string,
  model: string,
  endpoint: string,
  diagnostics: Array<ProjectionDiagnostic>
): Array<ModelAlias> => {
  const aliases: Array<ModelAlias> = []
  for (const raw of card.card.aliases) {
    const alias = validateModelAlias(raw)
    if (Either.isLeft(alias)) {
      diagnostics.push({
        key: `invalid-alias:${path}:${raw}`,
        endpoint,
        message: `ignoring invalid model alias of card ${path}: ${alias.left.message}`
      })
    } else if (alias.right !== model) aliases.push(alias.right)
  }
  return sortedUnique(aliases, compareUtf8)
}

/** Steps 2–7 for one endpoint; `cards` are that endpoint's cards in any order. */
const buildEndpoint = (endpoint: EndpointId, cards: ReadonlyArray<ModelCardInstance>): EndpointBuild => {
  const key = endpoint.toString()
  const ordered = cards.length > 1 ? [...cards].sort(compareCards) : cards
  const conflicts: Array<MaterializationConflict> = []
  const diagnostics: Array<ProjectionDiagnostic> = []
  const bases: Array<ProjectedBase> = []
  const adapterCards: Array<ModelCardInstance> = []
  const resolvedDomains = new Map<string, ReturnType<typeof resolveIndexerDomain>>()

  for (const card of ordered) {
    const id = cardInstanceId(card)
    const path = cardPath(id)
    const hasSuffix = card.modelSuffix !== null
    const hasLora = card.card.lora !== null
    if (hasSuffix && hasLora) {
      adapterCards.push(card)
      continue
    }
    if (hasSuffix !== hasLora) {
      diagnostics.push({
        key: `lora-mismatch:${path}`,
        endpoint: key,
        message: `ignoring model card ${path}: its LoRA discovery identity (modelSuffix ${JSON.stringify(card.modelSuffix)}) and card metadata (lora ${hasLora ? "present" : "null"}) disagree`
      })
      conflicts.push(
        makeConflict("ServingBinding", { _tag: "Card", card: id }, CONFLICT_REASONS.loraMismatch)
      )
      continue
    }
    // Workers of one endpoint usually carry the same identity inputs; BLAKE3 dominates a build.
    const identityKey = `${card.card.sourcePath}\u0000${card.card.kvCacheBlockSize}\u0000${card.card.runtimeConfig.enableEagle}\u0000${JSON.stringify(card.card.indexerIdentity)}`
    let resolved = resolvedDomains.get(identityKey)
    if (resolved === undefined) {
      resolved = resolveIndexerDomain(card.card, endpoint)
      resolvedDomains.set(identityKey, resolved)
    }
    let domain: ResolvedIndexerDomain | null = null
    if (Either.isLeft(resolved)) {
      diagnostics.push({
        key: `invalid-query-semantics:${path}`,
        endpoint: key,
        message: `model card ${path} has invalid KV query semantics: ${resolved.left.message}`
      })
      conflicts.push(makeConflict("PoolMaterialization", { _tag: "Card", card: id }, resolved.left.message))
    } else domain = resolved.right
    const model = validateCanonicalModelId(card.card.name)
    if (Either.isLeft(model)) {
      diagnostics.push({
        key: `invalid-model:${path}`,
        endpoint: key,
        message: `ignoring model card ${path} with an invalid canonical model identity: ${model.left.message}`
      })
    }
    bases.push({
      card,
      id,
      domain,
      model: Either.isRight(model) ? model.right : null,
      aliases: Either.isRight(model) ? validAliases(card, path, model.right, key, diagnostics) : []
    })
  }

  // Step 4: the endpoint's domain.
  const domains = new Map<string, ResolvedIndexerDomain>()
  let allDomainsKnown = true
  for (const base of bases) {
    if (base.domain === null) allDomainsKnown = false
    else domains.set(domainKey(base.domain), base.domain)
  }
  const domain = allDomainsKnown && domains.size === 1 ? domains.values().next().value! : null
  if (domains.size > 1) {
    conflicts.push(
      makeConflict("PoolMaterialization", { _tag: "Endpoint", endpoint }, CONFLICT_REASONS.multipleDomains)
    )
  }

  // Step 5: one base model per endpoint.
  const baseModels = new Set<string>()
  for (const base of bases) if (base.model !== null) baseModels.add(base.model)
  if (baseModels.size > 1) {
    conflicts.push(
      makeConflict("ServingTopology", { _tag: "Endpoint", endpoint }, CONFLICT_REASONS.multipleBaseModels)
    )
  }

  // Step 6: one base card per worker.
  const basesByWorker = new Map<WorkerId, Array<ProjectedBase>>()
  for (const base of bases) {
    const list = basesByWorker.get(base.card.instanceId)
    if (list === undefined) basesByWorker.set(base.card.instanceId, [base])
    else list.push(base)
  }
  const claims: Array<Claim> = []
  const runtimeConfigs = new Map<WorkerId, RuntimeConfig>()
  const workerTopology = new Map<WorkerId, WorkerTopology>()
  const baseByWorker = new Map<WorkerId, ProjectedBase>()
  for (const [workerId, projections] of basesByWorker) {
    if (projections.length !== 1) {
      conflicts.push(
        makeConflict("ServingTopology", { _tag: "Worker", workerId }, CONFLICT_REASONS.multipleBaseCards)
      )
      continue
    }
    const base = projections[0]!
    baseByWorker.set(workerId, base)
    if (base.model === null) {
      conflicts.push(
        makeConflict("ServingBinding", { _tag: "Card", card: base.id }, CONFLICT_REASONS.invalidModel)
      )
      continue
    }
    runtimeConfigs.set(workerId, base.card.card.runtimeConfig)
    workerTopology.set(workerId, { workerType: base.card.card.workerType, modelType: null, needs: [] })
    const target = ModelTarget.Base({ baseModel: base.model })
    claims.push({ model: base.model, target, binding: bindingKey(base.model, target), aliases: base.aliases })
  }

  // Step 7: adapter cards overlay their worker's base card.
  const adapters = new Map<
    CanonicalModelId,
    { baseModel: CanonicalModelId; adapter: CanonicalModelId; workers: Map<WorkerId, AdapterWorker> }
  >()
  for (const card of adapterCards) {
    const id = cardInstanceId(card)
    const path = cardPath(id)
    const workerId = card.instanceId
    const subject: ConflictSubject = { _tag: "Card", card: id }
    const base = baseByWorker.get(workerId)
    if (base === undefined) {
      diagnostics.push({
        key: `orphan-adapter:${path}`,
        endpoint: key,
        message: `ignoring adapter card ${path} without a backing base model card on worker ${workerId}`
      })
      continue
    }
    if (base.model === null) {
      conflicts.push(makeConflict("ServingBinding", subject, CONFLICT_REASONS.adapterBaseInvalid))
      continue
    }
    const lora = card.card.lora
    if (lora === null) {
      conflicts.push(makeConflict("ServingBinding", subject, CONFLICT_REASONS.adapterNoLora))
      continue
    }
    const served = validateCanonicalModelId(card.card.name)
    if (Either.isLeft(served)) {
      diagnostics.push({
        key: `invalid-model:${path}`,
        endpoint: key,
        message: `ignoring adapter card ${path} with an invalid request-facing model identity: ${served.left.message}`
      })
      conflicts.push(makeConflict("ServingBinding", subject, CONFLICT_REASONS.adapterServedInvalid))
      continue
    }
    const runtime = validateCanonicalModelId(lora.name, "lora.name")
    if (Either.isLeft(runtime)) {
      diagnostics.push({
        key: `invalid-model:${path}`,
        endpoint: key,
        message: `ignoring adapter card ${path} with an invalid runtime LoRA identity: ${runtime.left.message}`
      })
      conflicts.push(makeConflict("ServingBinding", subject, CONFLICT_REASONS.adapterRuntimeInvalid))
      continue
    }
    const target = ModelTarget.Lora({ baseModel: base.model, adapter: runtime.right })
    claims.push({
      model: served.right,
      target,
      binding: bindingKey(served.right, target),
      aliases: validAliases(card, path, served.right, key, diagnostics)
    })
    const facts: AdapterWorker = { maxGpuLoraCount: lora.maxGpuLoraCount ?? null }
    const entry = adapters.get(served.right)
    if (entry === undefined) {
      adapters.set(served.right, {
        baseModel: base.model,
        adapter: runtime.right,
        workers: new Map([[workerId, facts]])
      })
    } else if (entry.baseModel !== base.model || entry.adapter !== runtime.right) {
      conflicts.push(makeConflict("ServingBinding", subject, CONFLICT_REASONS.adapterConflictingTargets))
    } else {
      const previous = entry.workers.get(workerId)
      entry.workers.set(workerId, facts)
      if (previous !== undefined && previous.maxGpuLoraCount !== facts.maxGpuLoraCount) {
        entry.workers.delete(workerId)
        conflicts.push(
          makeConflict("PoolMaterialization", { _tag: "Worker", workerId }, CONFLICT_REASONS.adapterCapacity)
        )
      }
    }
  }

  const names = new Set<string>()
  for (const claim of claims) {
    names.add(claim.model)
    for (const alias of claim.aliases) names.add(alias)
  }
  return {
    endpoint,
    key,
    domain,
    claims,
    runtimeConfigs,
    workerTopology,
    adapters,
    conflicts,
    diagnostics,
    names
  }
}

// ---------------------------------------------------------------------------------------------
// DC-wide names (§2.5 step 8)

/** For every model name and alias, the distinct bindings claiming it, counted across endpoints. */
class NameIndex {
  private readonly owners = new Map<string, Map<string, number>>()
  private readonly endpointsByName = new Map<string, Set<string>>()

  isAmbiguous(name: string): boolean {
    return (this.owners.get(name)?.size ?? 0) > 1
  }

  endpointsUsing(name: string): ReadonlySet<string> | undefined {
    return this.endpointsByName.get(name)
  }

  ambiguousNames(): Array<string> {
    const out: Array<string> = []
    for (const [name, owners] of this.owners) if (owners.size > 1) out.push(name)
    return out
  }

  /** Adds (`delta` 1) or removes (`delta` −1) a build's claims; `touched` records names' prior state. */
  update(build: EndpointBuild, delta: 1 | -1, touched: Map<string, boolean>): void {
    for (const claim of build.claims) {
      this.count(claim.model, claim.binding, delta, touched)
      for (const alias of claim.aliases) this.count(alias, claim.binding, delta, touched)
    }
    for (const name of build.names) {
      let endpoints = this.endpointsByName.get(name)
      if (delta === 1) {
        if (endpoints === undefined) {
          endpoints = new Set()
          this.endpointsByName.set(name, endpoints)
        }
        endpoints.add(build.key)
      } else if (endpoints !== undefined) {
        endpoints.delete(build.key)
        if (endpoints.size === 0) this.endpointsByName.delete(name)
      }
    }
  }

  private count(name: string, binding: string, delta: 1 | -1, touched: Map<string, boolean>): void {
    if (!touched.has(name)) touched.set(name, this.isAmbiguous(name))
    let owners = this.owners.get(name)
    if (owners === undefined) {
      if (delta === -1) return
      owners = new Map()
      this.owners.set(name, owners)
    }
    const next = (owners.get(binding) ?? 0) + delta
    if (next > 0) owners.set(binding, next)
    else owners.delete(binding)
    if (owners.size === 0) this.owners.delete(name)
  }
}

// ---------------------------------------------------------------------------------------------
// Finishing (§2.5 steps 8–10) and generations (§2.6)

const finishEndpoint = (
  build: EndpointBuild,
  isAmbiguous: (name: string) => boolean,
  generation: number
): EndpointMembership => {
  const conflicts = [...build.conflicts]
  const grouped = new Map<
    string,
    { model: CanonicalModelId; target: ModelTarget; aliases: Array<ModelAlias> }
  >()
  for (const claim of build.claims) {
    if (isAmbiguous(claim.model)) {
      conflicts.push(
        makeConflict(
          "ServingBinding",
          { _tag: "Binding", model: claim.model },
          CONFLICT_REASONS.ambiguousName
        )
      )
      continue
    }
    let entry = grouped.get(claim.binding)
    if (entry === undefined) {
      entry = { model: claim.model, target: claim.target, aliases: [] }
      grouped.set(claim.binding, entry)
    }
    for (const alias of claim.aliases) if (!isAmbiguous(alias)) entry.aliases.push(alias)
  }
  const registrations = Array.from(grouped.values(), (g) => withTarget(g.model, g.target, g.aliases)).sort(
    compareRegistrations
  )
  const adapters = new Map<CanonicalModelId, AdapterMembership>()
  for (const [served, adapter] of build.adapters) {
    const kept = registrations.some(
      (r) =>
        r.model === served &&
        r.target._tag === "Lora" &&
        r.target.baseModel === adapter.baseModel &&
        r.target.adapter === adapter.adapter
    )
    if (kept) adapters.set(served, adapter)
  }
  const sortedConflicts = conflicts.sort((a, b) => compareUtf8(a.text, b.text))
  const uniqueConflicts = sortedConflicts.filter((c, i) => i === 0 || c.text !== sortedConflicts[i - 1]!.text)
  const roles = new Set<WorkerRole>()
  for (const topology of build.workerTopology.values()) roles.add(roleFromWorkerType(topology.workerType))
  return {
    endpoint: build.endpoint,
    key: build.key,
    generation,
    domain: build.domain,
    namespace: build.endpoint.namespace,
    registrations,
    models: sortedUnique(
      registrations.map((r) => r.model as string),
      compareUtf8
    ),
    aliases: sortedUnique(
      registrations.flatMap((r) => r.aliases as ReadonlyArray<string>),
      compareUtf8
    ),
    roles: Array.from(roles).sort(compareWorkerRoles),
    runtimeConfigs: build.runtimeConfigs,
    workerTopology: build.workerTopology,
    adapters,
    conflicts: uniqueConflicts
  }
}

const stringArraysEqual = (a: ReadonlyArray<string>, b: ReadonlyArray<string>): boolean =>
  a.length === b.length && a.every((value, i) => value === b[i])

const mapsEqual = <K, V>(
  a: ReadonlyMap<K, V>,
  b: ReadonlyMap<K, V>,
  equals: (x: V, y: V) => boolean
): boolean => {
  if (a === b) return true
  if (a.size !== b.size) return false
  for (const [key, value] of a) {
    const other = b.get(key)
    if (other === undefined || !equals(value, other)) return false
  }
  return true
}

const adapterEquals = (a: AdapterMembership, b: AdapterMembership): boolean =>
  a.baseModel === b.baseModel &&
  a.adapter === b.adapter &&
  mapsEqual(a.workers, b.workers, (x, y) => x.maxGpuLoraCount === y.maxGpuLoraCount)

/** Every field but `generation` (the reference's `same_membership`). */
export const membershipEquals = (a: EndpointMembership, b: EndpointMembership): boolean =>
  a.key === b.key &&
  (a.domain === null
    ? b.domain === null
    : b.domain !== null && resolvedIndexerDomainEquals(a.domain, b.domain)) &&
  compareArrays(a.registrations, b.registrations, compareRegistrations) === 0 &&
  stringArraysEqual(a.models, b.models) &&
  stringArraysEqual(a.aliases, b.aliases) &&
  stringArraysEqual(a.roles, b.roles) &&
  mapsEqual(a.runtimeConfigs, b.runtimeConfigs, recordEquals) &&
  mapsEqual(a.workerTopology, b.workerTopology, recordEquals) &&
  mapsEqual(a.adapters, b.adapters, adapterEquals) &&
  a.conflicts.length === b.conflicts.length &&
  a.conflicts.every((c, i) => c.text === b.conflicts[i]!.text)

const ambiguityDiagnostic = (name: string): ProjectionDiagnostic => ({
  key: `ambiguous-name:${name}`,
  endpoint: "",
  message: `request-facing name ${JSON.stringify(name)} resolves to conflicting targets across this relay's watch scope; omitting it from every endpoint (names must be unique across all watched namespaces)`
})

// ---------------------------------------------------------------------------------------------
// Grouping

const endpointKeyOf = (card: ModelCardInstance): string =>
  `${card.namespace}.${card.component}.${card.endpoint}`

const groupCards = (
  cards: ReadonlyArray<ModelCardInstance>,
  inScope: (card: ModelCardInstance) => string | undefined
): Map<string, Array<ModelCardInstance>> => {
  const groups = new Map<string, Array<ModelCardInstance>>()
  for (const card of cards) {
    const key = inScope(card)
    if (key === undefined) continue
    const group = groups.get(key)
    if (group === undefined) groups.set(key, [card])
    else group.push(card)
  }
  return groups
}

const endpointOf = (card: ModelCardInstance): EndpointId =>
  new EndpointId({ namespace: card.namespace, component: card.component, endpoint: card.endpoint })

// ---------------------------------------------------------------------------------------------
// Full projection

interface MembershipProjection {
  readonly view: DcMembershipView
  readonly nextGeneration: number
  /** Every soft error and ambiguous name of this projection. */
  readonly diagnostics: ReadonlyArray<ProjectionDiagnostic>
}

/**
 * Projects `cards` from scratch. `previous` and `nextGeneration` carry the generation state: an
 * endpoint keeps its previous generation (and its previous object) iff nothing else changed.
 */
export const projectMembership = (
  cards: ReadonlyArray<ModelCardInstance>,
  options: {
    readonly scope: DiscoveryScope
    readonly previous?: DcMembershipView
    readonly nextGeneration?: number
  }
): MembershipProjection => {
  const previous = options.previous ?? emptyMembershipView
  let nextGeneration = options.nextGeneration ?? 1
  const groups = groupCards(cards, (card) => {
    const endpoint = endpointOf(card)
    return scopeMatches(options.scope, endpoint) ? endpoint.toString() : undefined
  })
  const builds: Array<EndpointBuild> = []
  for (const group of groups.values()) builds.push(buildEndpoint(endpointOf(group[0]!), group))
  builds.sort((a, b) => compareUtf8(a.key, b.key))
  const names = new NameIndex()
  const touched = new Map<string, boolean>()
  for (const build of builds) names.update(build, 1, touched)
  const endpoints = new Map<string, EndpointMembership>()
  const diagnostics: Array<ProjectionDiagnostic> = []
  for (const build of builds) {
    diagnostics.push(...build.diagnostics)
    const candidate = finishEndpoint(build, (name) => names.isAmbiguous(name), 0)
    const prior = previous.endpoints.get(build.key)
    if (prior !== undefined && membershipEquals(prior, candidate)) endpoints.set(build.key, prior)
    else endpoints.set(build.key, { ...candidate, generation: nextGeneration++ })
  }
  for (const name of names.ambiguousNames()) diagnostics.push(ambiguityDiagnostic(name))
  return { view: { endpoints }, nextGeneration, diagnostics }
}

// ---------------------------------------------------------------------------------------------
// Incremental projection

/** A new membership view and what changed in it. */
export interface MembershipUpdate {
  readonly view: DcMembershipView
  /** False when the new view is the previous view object (no membership changed). */
  readonly viewChanged: boolean
  /** Endpoints whose membership object is new (added or a new generation), in endpoint order. */
  readonly changed: ReadonlyArray<string>
  /** Endpoints that left the view. */
  readonly removed: ReadonlyArray<string>
  /** Soft errors that appeared with this update (each is reported once while it persists). */
  readonly reported: ReadonlyArray<ProjectionDiagnostic>
}

interface ProjectorEntry {
  /** The endpoint's cards in input order, compared by reference. */
  readonly cards: ReadonlyArray<ModelCardInstance>
  readonly build: EndpointBuild
}

const sameCards = (a: ReadonlyArray<ModelCardInstance>, b: ReadonlyArray<ModelCardInstance>): boolean =>
  a.length === b.length && a.every((card, i) => card === b[i])

/**
 * The watch loop's projection state (§2.6): the latest view, the generation counter and, per
 * endpoint, the build of steps 2–7 over the cards it was built from.
 */
export class MembershipProjector {
  private readonly entries = new Map<string, ProjectorEntry>()
  private readonly names = new NameIndex()
  private readonly endpointKeys = new WeakMap<ModelCardInstance, string | null>()
  private nextGeneration = 1
  private current: DcMembershipView = emptyMembershipView
  private lastCards: ReadonlyArray<ModelCardInstance> | undefined

  constructor(readonly scope: DiscoveryScope) {}

  get view(): DcMembershipView {
    return this.current
  }

  /**
   * Applies the complete current card set. The backends hand over the previous array when no card
   * changed, so a source-only change costs nothing here.
   */
  apply(cards: ReadonlyArray<ModelCardInstance>): MembershipUpdate {
    if (cards === this.lastCards)
      return { view: this.current, viewChanged: false, changed: [], removed: [], reported: [] }
    this.lastCards = cards
    const groups = groupCards(cards, (card) => this.endpointKey(card))
    const rebuilt: Array<ProjectorEntry> = []
    const removedBuilds: Array<EndpointBuild> = []
    const reported: Array<ProjectionDiagnostic> = []
    for (const [key, group] of groups) {
      const entry = this.entries.get(key)
      if (entry !== undefined && sameCards(entry.cards, group)) continue
      rebuilt.push({ cards: group, build: buildEndpoint(endpointOf(group[0]!), group) })
    }
    for (const [key, entry] of this.entries) if (!groups.has(key)) removedBuilds.push(entry.build)
    if (rebuilt.length === 0 && removedBuilds.length === 0) {
      return { view: this.current, viewChanged: false, changed: [], removed: [], reported }
    }

    const touched = new Map<string, boolean>()
    const toFinish = new Set<string>()
    for (const build of removedBuilds) {
      this.names.update(build, -1, touched)
      this.entries.delete(build.key)
    }
    for (const entry of rebuilt) {
      const old = this.entries.get(entry.build.key)
      const oldKeys = new Set(old?.build.diagnostics.map((d) => d.key))
      for (const diagnostic of entry.build.diagnostics)
        if (!oldKeys.has(diagnostic.key)) reported.push(diagnostic)
      if (old !== undefined) this.names.update(old.build, -1, touched)
      this.names.update(entry.build, 1, touched)
      this.entries.set(entry.build.key, entry)
      toFinish.add(entry.build.key)
    }
    for (const [name, wasAmbiguous] of touched) {
      const isAmbiguous = this.names.isAmbiguous(name)
      if (wasAmbiguous === isAmbiguous) continue
      if (isAmbiguous) reported.push(ambiguityDiagnostic(name))
      for (const key of this.names.endpointsUsing(name) ?? []) toFinish.add(key)
    }

    const endpoints = new Map(this.current.endpoints)
    const removed: Array<string> = []
    for (const build of removedBuilds) {
      endpoints.delete(build.key)
      removed.push(build.key)
    }
    const changed: Array<string> = []
    const isAmbiguous = (name: string) => this.names.isAmbiguous(name)
    for (const key of Array.from(toFinish).sort(compareUtf8)) {
      const entry = this.entries.get(key)!
      const candidate = finishEndpoint(entry.build, isAmbiguous, 0)
      const prior = this.current.endpoints.get(key)
      if (prior !== undefined && membershipEquals(prior, candidate)) continue
      endpoints.set(key, { ...candidate, generation: this.nextGeneration++ })
      changed.push(key)
    }
    if (changed.length === 0 && removed.length === 0) {
      return { view: this.current, viewChanged: false, changed, removed, reported }
    }
    this.current = { endpoints }
    return { view: this.current, viewChanged: true, changed, removed: removed.sort(compareUtf8), reported }
  }

  private endpointKey(card: ModelCardInstance): string | undefined {
    let key = this.endpointKeys.get(card)
    if (key === undefined) {
      key = scopeMatches(this.scope, endpointOf(card)) ? endpointKeyOf(card) : null
      this.endpointKeys.set(card, key)
    }
    return key ?? undefined
  }
}
