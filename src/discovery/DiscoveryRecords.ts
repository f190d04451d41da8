/**
 * Identities of discovery records (PROTOCOL.md §2): the card instance id, the source record key,
 * their key paths (shared by the etcd keys and the file backend's duplicate check) and structural
 * equality of decoded records.
 */

import { Equal } from "effect"
import type { KvEventSource, ModelCardInstance } from "../protocol/Discovery.js"
import type { WorkerId } from "../protocol/Events.js"

/** `ModelCardInstanceId`: one card per worker per model; a suffix marks an adapter card. */
export interface ModelCardInstanceId {
  readonly namespace: string
  readonly component: string
  readonly endpoint: string
  readonly instanceId: WorkerId
  readonly modelSuffix: string | null
}

/** The id of a model card instance: its namespace, component, endpoint and instance. */
export const cardInstanceId = (card: ModelCardInstance): ModelCardInstanceId => ({
  namespace: card.namespace,
  component: card.component,
  endpoint: card.endpoint,
  instanceId: card.instanceId,
  modelSuffix: card.modelSuffix
})

/** `{namespace}/{component}/{endpoint}/{instanceId}[/{modelSuffix}]`: the etcd key below `cards/`. */
export const cardPath = (id: ModelCardInstanceId): string =>
  `${id.namespace}/${id.component}/${id.endpoint}/${id.instanceId}${id.modelSuffix === null ? "" : `/${id.modelSuffix}`}`

/** `{kvStateEndpoint}/{workerId}/{dpRank}/{publisherId}`: the etcd key below `sources/`. */
export const sourceRecordKey = (source: KvEventSource): string =>
  `${source.kvStateEndpoint}/${source.workerId}/${source.dpRank}/${source.publisherId}`

/** The logical source (one per worker rank and KV-state endpoint), without the incarnation. */
export const sourceLogicalKey = (source: KvEventSource): string =>
  `${source.kvStateEndpoint}/${source.workerId}/${source.dpRank}`

/**
 * Structural equality of decoded JSON records: plain objects, arrays, primitives (bigint by
 * value) and `Equal` values such as `EndpointId`.
 */
export const recordEquals = (a: unknown, b: unknown): boolean => {
  if (a === b) return true
  if (typeof a !== "object" || typeof b !== "object" || a === null || b === null) return false
  if (Equal.isEqual(a) || Equal.isEqual(b)) return Equal.equals(a, b)
  if (Array.isArray(a)) {
    if (!Array.isArray(b) || a.length !== b.length) return false
    for (let i = 0; i < a.length; i++) if (!recordEquals(a[i], b[i])) return false
    return true
  }
  if (Array.isArray(b)) return false
  const aKeys = Object.keys(a)
  const bKeys = Object.keys(b)
  if (aKeys.length !== bKeys.length) return false
  const bRecord = b as Record<string, unknown>
  const aRecord = a as Record<string, unknown>
  for (const key of aKeys) {
    if (!Object.hasOwn(bRecord, key) || !recordEquals(aRecord[key], bRecord[key])) return false
  }
  return true
}
