/**
 * What discovery says about a DC's serving endpoints (relay-service.md §2.3, §2.4): one
 * `EndpointMembership` per endpoint, the conflicts that fence it, and the diagnostics of a
 * projection. `MembershipProjection.ts` computes these views from model cards.
 */

import type { RuntimeConfig } from "../protocol/Discovery.js"
import type { WorkerId } from "../protocol/Events.js"
import type { ResolvedIndexerDomain } from "../protocol/Identity.js"
import type {
  CanonicalModelId,
  CanonicalModelRegistration,
  EndpointId,
  WorkerRole,
  WorkerType
} from "../protocol/Model.js"
import { cardPath, type ModelCardInstanceId } from "./DiscoveryRecords.js"

// ---------------------------------------------------------------------------------------------
// Types (§2.3, §2.4)

/**
 * `PoolMaterialization` fences CKF publication only; `ServingBinding` drops only the binding that
 * cannot be resolved; `ServingTopology` fences both the pool and the endpoint's topology membership.
 */
export type ConflictScope = "PoolMaterialization" | "ServingBinding" | "ServingTopology"

/** What a materialization conflict is about: a serving endpoint or a model card. */
export type ConflictSubject =
  | { readonly _tag: "Endpoint"; readonly endpoint: EndpointId }
  | { readonly _tag: "Card"; readonly card: ModelCardInstanceId }
  | { readonly _tag: "Worker"; readonly workerId: WorkerId }
  | { readonly _tag: "Binding"; readonly model: CanonicalModelId }

/** A reason an endpoint's pool cannot be built or served as discovered. */
export interface MaterializationConflict {
  readonly scope: ConflictScope
  readonly subject: ConflictSubject
  readonly reason: string
  /** Debug text (`Scope Subject(…) "reason"`): the sort and dedupe key, like the reference's `{:?}`. */
  readonly text: string
}

/** Part of the request plane's worker-set identity; readiness groups workers by all three fields. */
export interface WorkerTopology {
  readonly workerType: WorkerType | null
  /** PROTOCOL §2 cards carry no model type; always null, kept for the readiness grouping key. */
  readonly modelType: string | null
  /** DNF of required peer roles; PROTOCOL §2 cards carry none, so always empty. */
  readonly needs: ReadonlyArray<ReadonlyArray<WorkerType>>
}

/** What one worker says about a LoRA adapter it serves. */
export interface AdapterWorker {
  readonly maxGpuLoraCount: number | null
}

/** A LoRA adapter served at an endpoint, with the workers serving it. */
export interface AdapterMembership {
  readonly baseModel: CanonicalModelId
  /** The runtime LoRA name (salts requests and cache hashes), distinct from the request-facing key. */
  readonly adapter: CanonicalModelId
  readonly workers: ReadonlyMap<WorkerId, AdapterWorker>
}

/**
 * Everything discovery says about one serving endpoint: its domain, models, roles, ranks and
 * conflicts.
 */
export interface EndpointMembership {
  readonly endpoint: EndpointId
  /** `endpoint.toString()`: the key of the view's map. */
  readonly key: string
  readonly generation: number
  /** Present only when every base card resolved a domain and there is exactly one distinct domain. */
  readonly domain: ResolvedIndexerDomain | null
  readonly namespace: string
  readonly registrations: ReadonlyArray<CanonicalModelRegistration>
  readonly models: ReadonlyArray<string>
  readonly aliases: ReadonlyArray<string>
  readonly roles: ReadonlyArray<WorkerRole>
  /** The base card's runtime config per worker. */
  readonly runtimeConfigs: ReadonlyMap<WorkerId, RuntimeConfig>
  readonly workerTopology: ReadonlyMap<WorkerId, WorkerTopology>
  /** Keyed by the request-facing adapter name. */
  readonly adapters: ReadonlyMap<CanonicalModelId, AdapterMembership>
  readonly conflicts: ReadonlyArray<MaterializationConflict>
}

/** Keyed by `EndpointId.toString()` (parts cannot contain ".", so the text is unique). */
export interface DcMembershipView {
  readonly endpoints: ReadonlyMap<string, EndpointMembership>
}

/** The membership view with no endpoint. */
export const emptyMembershipView: DcMembershipView = { endpoints: new Map() }

/** True when a conflict keeps the endpoint's pool from being built. */
export const hasPoolMaterializationConflict = (membership: EndpointMembership): boolean =>
  membership.conflicts.some((c) => c.scope === "PoolMaterialization" || c.scope === "ServingTopology")

/** True when a conflict keeps the endpoint out of the serving topology. */
export const hasServingTopologyConflict = (membership: EndpointMembership): boolean =>
  membership.conflicts.some((c) => c.scope === "ServingTopology")

/**
 * True when the endpoint's pool can be built: one domain, registrations and no blocking conflict.
 */
export const isMaterializable = (membership: EndpointMembership): boolean =>
  membership.domain !== null &&
  membership.registrations.length > 0 &&
  !hasPoolMaterializationConflict(membership)

/** A soft discovery error (logged once while it persists), or a conflict's log line. */
export interface ProjectionDiagnostic {
  /** Stable while the cause persists: `kind:card-path[:detail]`. */
  readonly key: string
  readonly endpoint: string
  readonly message: string
}

// ---------------------------------------------------------------------------------------------
// Conflicts

const subjectText = (subject: ConflictSubject): string => {
  switch (subject._tag) {
    case "Endpoint":
      return `Endpoint(${subject.endpoint})`
    case "Card":
      return `Card(${cardPath(subject.card)})`
    case "Worker":
      return `Worker(${subject.workerId})`
    case "Binding":
      return `Binding(${JSON.stringify(subject.model)})`
  }
}

/** A conflict with its debug text (exported for the host's duplicate-pool fencing). */
export const makeConflict = (
  scope: ConflictScope,
  subject: ConflictSubject,
  reason: string
): MaterializationConflict => ({
  scope,
  subject,
  reason,
  text: `${scope} ${subjectText(subject)} ${JSON.stringify(reason)}`
})

/** The words each kind of conflict is reported in. */
export const CONFLICT_REASONS = {
  loraMismatch: "LoRA discovery identity and card metadata disagree",
  multipleDomains: "endpoint resolves to multiple indexer domains",
  multipleBaseModels: "endpoint resolves to multiple canonical base models",
  multipleBaseCards: "worker publishes multiple base model cards",
  invalidModel: "invalid canonical model identity",
  adapterBaseInvalid: "adapter's backing base model identity is invalid",
  adapterNoLora: "adapter card has no runtime LoRA metadata",
  adapterServedInvalid: "invalid adapter request-facing model identity",
  adapterRuntimeInvalid: "invalid runtime LoRA identity",
  adapterConflictingTargets: "adapter request-facing model resolves to conflicting runtime targets",
  adapterCapacity: "worker publishes conflicting adapter capacity",
  ambiguousName: "request-facing model name resolves to conflicting targets"
} as const
