/**
 * Test-suite encoders of the engines' KV events, written from the engines' own struct
 * definitions and msgspec's encoding rules, on msgpackr (not the relay's own msgpack writer):
 *
 * - a struct with `array_like=True` is an array in field order; with `tag=True` the class name
 *   comes first; with `omit_defaults=True` only TRAILING fields equal to their default are
 *   dropped (a default field before a non-default one stays, as msgspec keeps positions);
 * - a tagged struct without `array_like` is a map: `type` first, then the fields in declaration
 *   order; with `omit_defaults=True` every field equal to its default is left out, and a field
 *   without a default is always written (as nil when it is None).
 *
 * Integers are Python ints (`bigint` here): written in the smallest msgpack int form, as msgspec
 * does, except that msgpackr writes a positive value in [2^32, 2^63) as int64 where msgspec
 * writes uint64; both are the same integer to any msgpack reader.
 *
 * Struct definitions (field order, defaults, options) follow:
 * - vLLM `vllm/distributed/kv_events.py`: before v0.24 every event `array_like`; since #42892
 *   events are tagged maps inside the array batch `[ts, events, data_parallel_rank]`; `locality`
 *   (#48281) and `ownership` (#52067) after `kv_cache_spec_sliding_window`, `session_id` last;
 *   replies of the replay ROUTER carry the topic since #45177;
 * - SGLang `python/sglang/srt/disaggregation/kv_events.py`: `array_like` events and batch, batch
 *   `[ts, events, attn_dp_rank]`, `medium` on newer versions (which also drop `omit_defaults`),
 *   `BlockStoredWithMetadata` appending a `{cache_salt}` map at position 7;
 * - Dynamo `lib/runtime/src/transports/event_plane`: the envelope as a named map
 *   `{topic, publisher_id, sequence, published_at, payload}` (`rmp_serde::to_vec_named`).
 */

import { Packr } from "msgpackr"

/** A Python value as msgspec sees it. `undefined` never appears: None is `null`. */
export type PyValue =
  | null
  | boolean
  | bigint
  | number
  | string
  | Uint8Array
  | ReadonlyArray<PyValue>
  | ReadonlyMap<string, PyValue>

export interface FieldSpec {
  readonly name: string
  /** Present when the field has a default (`= None` in every struct here). */
  readonly default?: PyValue
}

export interface StructSpec {
  readonly tag: string | undefined
  readonly fields: ReadonlyArray<FieldSpec>
  readonly arrayLike: boolean
  readonly omitDefaults: boolean
}

const NONE_DEFAULT = { default: null } as const
const f = (name: string): FieldSpec => ({ name })
const d = (name: string): FieldSpec => ({ name, ...NONE_DEFAULT })

const equalsDefault = (value: PyValue, field: FieldSpec): boolean =>
  "default" in field && value === field.default

/** The msgspec encoding of one struct instance as a JS value msgpackr packs (`values` by field name). */
export const structValue = (spec: StructSpec, values: Readonly<Record<string, PyValue>>): unknown => {
  const present = (field: FieldSpec): PyValue => {
    if (field.name in values) return values[field.name]!
    if ("default" in field) return field.default!
    throw new Error(`${spec.tag ?? "struct"}: field ${field.name} has no default and no value`)
  }
  for (const name of Object.keys(values)) {
    if (!spec.fields.some((field) => field.name === name))
      throw new Error(`${spec.tag ?? "struct"} has no field ${name}`)
  }
  if (spec.arrayLike) {
    const out: Array<unknown> = spec.tag === undefined ? [] : [spec.tag]
    let keep = spec.fields.length
    if (spec.omitDefaults) {
      while (keep > 0 && equalsDefault(present(spec.fields[keep - 1]!), spec.fields[keep - 1]!)) keep--
    }
    for (let i = 0; i < keep; i++) out.push(pyToPack(present(spec.fields[i]!)))
    return out
  }
  const out = new Map<string, unknown>()
  if (spec.tag !== undefined) out.set("type", spec.tag)
  for (const field of spec.fields) {
    const value = present(field)
    if (spec.omitDefaults && equalsDefault(value, field)) continue
    out.set(field.name, pyToPack(value))
  }
  return out
}

const INT32_MIN = -(2n ** 31n)
const UINT32_MAX = 2n ** 32n - 1n

/** Python values to what msgpackr packs the way msgspec does (see the module comment). */
const pyToPack = (value: PyValue): unknown => {
  if (typeof value === "bigint") return value >= INT32_MIN && value <= UINT32_MAX ? Number(value) : value
  if (typeof value === "number") {
    if (Number.isInteger(value)) throw new Error(`write Python ints as bigint, not ${value}`)
    return value
  }
  if (value instanceof Map) {
    const out = new Map<string, unknown>()
    for (const [key, item] of value) out.set(key, pyToPack(item))
    return out
  }
  if (Array.isArray(value)) return value.map(pyToPack)
  return value
}

const packr = new Packr({ useRecords: false, mapsAsObjects: false, variableMapSize: true })

export const pack = (value: unknown): Uint8Array => packr.pack(value)

// ---------------------------------------------------------------------------------------------
// vLLM

/** The fields every engine's `BlockStored` starts with (vLLM and SGLang alike). */
const STORED_HEAD: ReadonlyArray<FieldSpec> = [
  f("block_hashes"),
  f("parent_block_hash"),
  f("token_ids"),
  f("block_size"),
  f("lora_id")
]

const VLLM_STORED_FIELDS: ReadonlyArray<FieldSpec> = [
  ...STORED_HEAD,
  f("medium"),
  f("lora_name"),
  d("extra_keys"),
  d("group_idx"),
  d("kv_cache_spec_kind"),
  d("kv_cache_spec_sliding_window"),
  d("locality"),
  d("ownership"),
  d("session_id")
]
const VLLM_REMOVED_FIELDS: ReadonlyArray<FieldSpec> = [
  f("block_hashes"),
  f("medium"),
  d("group_idx"),
  d("locality"),
  d("ownership")
]

/**
 * vLLM before v0.24 (`array_like` events), trailing defaults dropped: the first versions had
 * neither `medium` nor `lora_name`, which gives the same 6-element array.
 */
const VLLM_OLD_STORED: StructSpec = {
  tag: "BlockStored",
  fields: [...STORED_HEAD, d("medium"), d("lora_name")],
  arrayLike: true,
  omitDefaults: true
}
const VLLM_OLD_REMOVED: StructSpec = {
  tag: "BlockRemoved",
  fields: [f("block_hashes"), d("medium")],
  arrayLike: true,
  omitDefaults: true
}

export type VllmEvent =
  | { readonly type: "BlockStored"; readonly fields: Readonly<Record<string, PyValue>> }
  | { readonly type: "BlockRemoved"; readonly fields: Readonly<Record<string, PyValue>> }
  | { readonly type: "AllBlocksCleared" }

const eventSpec = (type: VllmEvent["type"], current: boolean): StructSpec => {
  if (type === "AllBlocksCleared") return { tag: type, fields: [], arrayLike: !current, omitDefaults: true }
  if (!current) return type === "BlockStored" ? VLLM_OLD_STORED : VLLM_OLD_REMOVED
  return {
    tag: type,
    fields: type === "BlockStored" ? VLLM_STORED_FIELDS : VLLM_REMOVED_FIELDS,
    arrayLike: false,
    omitDefaults: true
  }
}

/** A batch `[ts, events, rank?]` (array_like, omit_defaults: a None rank is dropped). */
const batchPayload = (
  rankField: string,
  omitDefaults: boolean,
  events: ReadonlyArray<unknown>,
  rank: bigint | null,
  ts: number
): Uint8Array => {
  const spec: StructSpec = {
    tag: undefined,
    fields: [f("ts"), f("events"), d(rankField)],
    arrayLike: true,
    omitDefaults
  }
  // The events are already encoded: put them in after the batch's own fields are laid out.
  const batch = structValue(spec, { ts, events: [], [rankField]: rank }) as Array<unknown>
  batch[1] = events
  return pack(batch)
}

/** A vLLM `KVEventBatch` payload: `"current"` (v0.24+, map events) or `"old"` (array events). */
export const vllmBatch = (
  events: ReadonlyArray<VllmEvent>,
  options: { readonly version: "current" | "old"; readonly dpRank?: bigint | null; readonly ts?: number }
): Uint8Array => {
  const current = options.version === "current"
  const encoded = events.map((event) =>
    structValue(eventSpec(event.type, current), event.type === "AllBlocksCleared" ? {} : event.fields)
  )
  return batchPayload(
    "data_parallel_rank",
    true,
    encoded,
    options.dpRank ?? null,
    options.ts ?? 1_790_000_000.25
  )
}

/** The fields of a current vLLM GPU `BlockStored` (`block_pool.py`): full blocks, medium GPU. */
export const vllmStored = (
  hashes: ReadonlyArray<bigint>,
  tokens: ReadonlyArray<number>,
  blockSize: number,
  extra: Readonly<Record<string, PyValue>> = {}
): VllmEvent => ({
  type: "BlockStored",
  fields: {
    block_hashes: hashes,
    parent_block_hash: null,
    token_ids: tokens.map(BigInt),
    block_size: BigInt(blockSize),
    lora_id: null,
    medium: "GPU",
    lora_name: null,
    ...extra
  }
})

export const vllmRemoved = (
  hashes: ReadonlyArray<bigint>,
  extra: Readonly<Record<string, PyValue>> = {}
): VllmEvent => ({
  type: "BlockRemoved",
  fields: { block_hashes: hashes, medium: "GPU", ...extra }
})

// ---------------------------------------------------------------------------------------------
// SGLang

const sglangStored = (withMedium: boolean, omitDefaults: boolean, metadata: boolean): StructSpec => ({
  tag: "BlockStored",
  fields: [...STORED_HEAD, ...(withMedium ? [d("medium")] : []), ...(metadata ? [f("metadata")] : [])],
  arrayLike: true,
  omitDefaults
})

/** SGLang versions: before `medium` (omit_defaults), and current (medium, no omit_defaults). */
export type SglangVersion = "0.4" | "current"

/** One SGLang page: SGLang emits one `BlockStored` per page, with signed int64 hashes. */
export interface SglangPage {
  readonly hash: bigint
  readonly parent: bigint | null
  readonly tokens: ReadonlyArray<number>
  readonly medium?: string
  readonly cacheSalt?: string
}

export const sglangBatch = (
  pages: ReadonlyArray<SglangPage | { readonly removed: bigint; readonly medium?: string }>,
  options: { readonly version: SglangVersion; readonly attnDpRank: bigint | null }
): Uint8Array => {
  const current = options.version === "current"
  const events = pages.map((page) => {
    if ("removed" in page) {
      const spec: StructSpec = {
        tag: "BlockRemoved",
        fields: [f("block_hashes"), ...(current ? [d("medium")] : [])],
        arrayLike: true,
        omitDefaults: !current
      }
      return structValue(spec, {
        block_hashes: [page.removed],
        ...(current ? { medium: page.medium ?? "GPU" } : {})
      })
    }
    // BlockStoredWithMetadata exists only in the versions that have `medium`.
    const salted = current && page.cacheSalt !== undefined
    return structValue(sglangStored(current, !current, salted), {
      block_hashes: [page.hash],
      parent_block_hash: page.parent,
      token_ids: page.tokens.map(BigInt),
      block_size: BigInt(page.tokens.length),
      lora_id: null,
      ...(current ? { medium: page.medium ?? "GPU" } : {}),
      ...(salted ? { metadata: new Map([["cache_salt", page.cacheSalt!]]) } : {})
    })
  })
  return batchPayload("attn_dp_rank", !current, events, options.attnDpRank, 1_790_000_000.5)
}

/** SGLang's `hash_str_to_int64`: the first 16 hex digits of a SHA-256 digest as signed int64. */
export const sglangHash = (hex: string): bigint => {
  const value = BigInt(`0x${hex.slice(0, 16)}`)
  return value >= 2n ** 63n ? value - 2n ** 64n : value
}

// ---------------------------------------------------------------------------------------------
// Dynamo event plane

/** The envelope map in `EventEnvelope`'s declaration order, as `rmp_serde::to_vec_named` writes it. */
export const dynamoEnvelope = (envelope: {
  readonly topic: string
  readonly publisherId: bigint
  readonly sequence: bigint
  readonly publishedAt: bigint
  readonly payload: Uint8Array
}): Uint8Array =>
  pack(
    new Map<string, unknown>([
      ["topic", envelope.topic],
      ["publisher_id", pyToPack(envelope.publisherId)],
      ["sequence", pyToPack(envelope.sequence)],
      ["published_at", pyToPack(envelope.publishedAt)],
      ["payload", envelope.payload]
    ])
  )
