/**
 * The engines' side of PROTOCOL.md §3 `engine-zmq`: a batch encoded as vLLM's and SGLang's
 * msgspec encoders write it, for the simulated engines and for tests that need real wire bytes.
 * The relay only decodes (`transport/EngineZmq.ts`).
 */

import type { StorageTier } from "../ckf/events.js"
import type { DpRank } from "../protocol/Events.js"
import { fixKey, MsgpackWriter } from "../transport/msgpack.js"

/** The medium a tier is published as (simulated engines; the device tier is "GPU" or none). */
export const mediumOfTier = (tier: StorageTier): string | null =>
  tier === "device" ? null : tier === "host_pinned" ? "CPU_PINNED" : tier === "disk" ? "DISK" : "EXTERNAL"

/** One event of a simulated engine's batch, in the engine's own terms. */
export type EngineEvent =
  | {
      readonly type: "BlockStored"
      readonly blockHashes: Uint32Array
      readonly parentBlockHash: Uint32Array | undefined
      readonly tokenIds: ReadonlyArray<number>
      readonly blockSize: number
      readonly loraId?: number | null
      /** vLLM's `lora_name` (the adapter's name salts the blocks' tokens hashes). */
      readonly loraName?: string | null
      readonly medium?: string | null
      readonly groupIdx?: number
      readonly kvCacheSpecKind?: string
    }
  | {
      readonly type: "BlockRemoved"
      readonly blockHashes: Uint32Array
      readonly medium?: string | null
      readonly groupIdx?: number
    }
  | { readonly type: "AllBlocksCleared" }

/** How an engine writes its batches (maps or arrays, signed or unsigned hashes, medium). */
export interface EngineFormat {
  /** Tagged maps (vLLM since #42892) or tagged arrays (SGLang, older vLLM). */
  readonly events: "map" | "array"
  /** Positional `[ts, events, rank]` or the map `{ts, events, <rank field>}`. */
  readonly batch: "array" | "map"
  /** msgpack uint64 (vLLM), int64 (SGLang) or 32-byte strings whose low 8 bytes are the hash. */
  readonly hashes: "unsigned" | "signed" | "bytes"
  readonly rankField: "data_parallel_rank" | "attn_dp_rank"
  /** Write `medium` (and later vLLM fields); older SGLang has none. */
  readonly medium: boolean
}

/** vLLM's batch format. */
export const VLLM_FORMAT: EngineFormat = {
  events: "map",
  batch: "array",
  hashes: "unsigned",
  rankField: "data_parallel_rank",
  medium: true
}

/** SGLang's batch format. */
export const SGLANG_FORMAT: EngineFormat = {
  events: "array",
  batch: "array",
  hashes: "signed",
  rankField: "attn_dp_rank",
  medium: false
}

const F = {
  type: fixKey("type"),
  block_hashes: fixKey("block_hashes"),
  parent_block_hash: fixKey("parent_block_hash"),
  token_ids: fixKey("token_ids"),
  block_size: fixKey("block_size"),
  lora_id: fixKey("lora_id"),
  medium: fixKey("medium"),
  lora_name: fixKey("lora_name"),
  group_idx: fixKey("group_idx"),
  kv_cache_spec_kind: fixKey("kv_cache_spec_kind"),
  ts: fixKey("ts"),
  events: fixKey("events"),
  data_parallel_rank: fixKey("data_parallel_rank"),
  attn_dp_rank: fixKey("attn_dp_rank")
}

const writeHash = (w: MsgpackWriter, hi: number, lo: number, format: EngineFormat): void => {
  if (format.hashes === "unsigned") w.u64(hi, lo)
  else if (format.hashes === "signed") w.i64(hi, lo)
  else {
    // A 32-byte digest whose low 8 bytes (big-endian) are the hash.
    const bytes = new Uint8Array(32)
    bytes.fill(0xab, 0, 24)
    new DataView(bytes.buffer).setUint32(24, hi)
    new DataView(bytes.buffer).setUint32(28, lo)
    w.bin(bytes)
  }
}

const writeHashes = (w: MsgpackWriter, pairs: Uint32Array, format: EngineFormat): void => {
  const n = pairs.length >>> 1
  w.array(n)
  for (let i = 0; i < n; i++) writeHash(w, pairs[2 * i]!, pairs[2 * i + 1]!, format)
}

const writeOptionalText = (w: MsgpackWriter, text: string | null | undefined): void => {
  if (text === null || text === undefined) w.nil()
  else w.str(text)
}

const writeEngineEvent = (w: MsgpackWriter, event: EngineEvent, format: EngineFormat): void => {
  const asMap = format.events === "map"
  if (event.type === "AllBlocksCleared") {
    if (asMap) w.map(1).raw(F.type).str(event.type)
    else w.array(1).str(event.type)
    return
  }
  if (event.type === "BlockRemoved") {
    const extra = event.groupIdx !== undefined
    const fields = 1 + (format.medium || event.medium != null ? 1 : 0) + (extra ? 1 : 0)
    if (asMap)
      w.map(1 + fields)
        .raw(F.type)
        .str(event.type)
        .raw(F.block_hashes)
    else w.array(1 + fields).str(event.type)
    writeHashes(w, event.blockHashes, format)
    if (format.medium || event.medium != null || extra) {
      if (asMap) w.raw(F.medium)
      writeOptionalText(w, event.medium)
    }
    if (extra) {
      if (asMap) w.raw(F.group_idx)
      w.int(event.groupIdx!)
    }
    return
  }
  const hasMedium = format.medium || event.medium != null || event.loraName != null
  const extra = event.groupIdx !== undefined || event.kvCacheSpecKind !== undefined
  // msgspec omit_defaults: fields 1–5 always, medium and lora_name (vLLM), then trailing defaults trimmed.
  const count = 5 + (hasMedium || extra ? 2 : 0) + (extra ? 3 : 0)
  if (asMap)
    w.map(1 + count)
      .raw(F.type)
      .str(event.type)
  else w.array(1 + count).str(event.type)
  if (asMap) w.raw(F.block_hashes)
  writeHashes(w, event.blockHashes, format)
  if (asMap) w.raw(F.parent_block_hash)
  if (event.parentBlockHash === undefined) w.nil()
  else writeHash(w, event.parentBlockHash[0]!, event.parentBlockHash[1]!, format)
  if (asMap) w.raw(F.token_ids)
  w.array(event.tokenIds.length)
  for (const token of event.tokenIds) w.int(token)
  if (asMap) w.raw(F.block_size)
  w.int(event.blockSize)
  if (asMap) w.raw(F.lora_id)
  if (event.loraId === null || event.loraId === undefined) w.nil()
  else w.int(event.loraId)
  if (hasMedium || extra) {
    if (asMap) w.raw(F.medium)
    writeOptionalText(w, event.medium)
    if (asMap) w.raw(F.lora_name)
    writeOptionalText(w, event.loraName)
  }
  if (extra) {
    if (asMap) w.raw(fixKey("extra_keys"))
    w.nil()
    if (asMap) w.raw(F.group_idx)
    if (event.groupIdx === undefined) w.nil()
    else w.int(event.groupIdx)
    if (asMap) w.raw(F.kv_cache_spec_kind)
    writeOptionalText(w, event.kvCacheSpecKind)
  }
}

/** Encodes one batch as msgspec does for the given engine format. */
export const encodeEngineBatch = (
  batch: {
    readonly ts: number
    readonly events: ReadonlyArray<EngineEvent>
    readonly dpRank: DpRank | undefined
  },
  format: EngineFormat
): Uint8Array => {
  const w = new MsgpackWriter(128 + batch.events.length * 128)
  const withRank = batch.dpRank !== undefined
  if (format.batch === "map") {
    w.map(withRank ? 3 : 2)
      .raw(F.ts)
      .float64(batch.ts)
      .raw(F.events)
  } else {
    w.array(withRank ? 3 : 2).float64(batch.ts)
  }
  w.array(batch.events.length)
  for (const event of batch.events) writeEngineEvent(w, event, format)
  if (withRank) {
    if (format.batch === "map")
      w.raw(format.rankField === "attn_dp_rank" ? F.attn_dp_rank : F.data_parallel_rank)
    w.int(batch.dpRank!)
  }
  return w.finish()
}
