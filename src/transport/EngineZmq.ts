/**
 * vLLM / SGLang KV events over ZeroMQ (PROTOCOL.md §3 `engine-zmq`, recovery-events.md §6.3 and
 * Part B): 3 frames `[topic, seq u64 BE, payload]`, the payload a msgspec batch — positional
 * `[ts, events, dp_rank?, …]` or a map `{ts, events, data_parallel_rank | attn_dp_rank}` — whose
 * events are tagged arrays (`["BlockStored", …]`) or tagged maps (`{type: "BlockStored", …}`).
 *
 * The relay gives every event of batch `seq` the id `seq + 1`: a batch is one ordered commit
 * group and gaps are detected on `seq`. A batch whose events are all skipped (another medium,
 * locality or owner, a non-main KV group, an unknown event type) still yields one empty
 * `Removed` event carrying its id, so the rank's id stream stays dense and a skipped batch never
 * looks like a gap.
 *
 * Decoding is strict where the engines' sources are (PROTOCOL §3.2, `docs/engines.md`): a field
 * of the wrong type, a block size other than the card's, or token ids that do not match the
 * hashes make the whole message malformed, with a reason, and nothing of it is applied.
 *
 * Replay (B.4) is `EngineReplay.ts`.
 *
 * Length: the field readers, the per-event scratch record and the batch and frame decoders are
 * one pass over the reader's buffer, kept together so the hot path stays monomorphic.
 */

import type { Effect, Scope } from "effect"
import {
  AMBIGUOUS_CACHE_NAMESPACE,
  CacheNamespaces,
  storedEventCacheNamespace
} from "../ckf/cacheNamespace.js"
import { memberKey, type StorageTier, storageTierOfMedium } from "../ckf/events.js"
import { blockHashSeed, localHashesInto, TOKENS_HASH_SEED } from "../ckf/tokens.js"
import type { DpRank, KvCacheEventData, RouterEvent, WorkerId } from "../protocol/Events.js"
import { failDecode } from "./internal/msgpack/reader.js"
import { MsgpackReader } from "./msgpack.js"
import {
  blockCount,
  type Delivered,
  type IngestMessage,
  type MalformedReason,
  type ReceiveLoop,
  SKIP_REASONS,
  type SkipCounts,
  type SkipReason,
  subscribe,
  type ZmqError
} from "./ZmqSocket.js"

const fail = failDecode

const ascii = (text: string): Uint8Array => new TextEncoder().encode(text)
const K = (...names: ReadonlyArray<string>): ReadonlyArray<Uint8Array> => names.map(ascii)

// ---------------------------------------------------------------------------------------------
// Decoding

/**
 * Why an engine event is not this worker's device cache (PROTOCOL §3.2). Such an event is
 * skipped: it keeps its place in the sequence and is counted by reason, never applied.
 */
type EngineSkipReason = SkipReason
const ENGINE_SKIP_REASONS = SKIP_REASONS
type EngineSkipCounts = SkipCounts
const noSkips = (): Record<EngineSkipReason, number> => ({
  medium: 0,
  locality: 0,
  ownership: 0,
  group: 0,
  namespace: 0
})

/** Why an engine message is malformed beyond its framing; nothing of such a message is applied. */
type EngineMalformedReason = Extract<
  MalformedReason,
  "hash" | "block-size" | "token-ids" | "token-count" | "lora" | "field-type"
>

/** A field of an otherwise well-formed msgpack batch that breaks the contract of §3.2. */
class EngineFieldError extends Error {
  constructor(
    readonly reason: EngineMalformedReason,
    message: string
  ) {
    super(message)
  }
}

const malformedField = (reason: EngineMalformedReason, message: string): never => {
  throw new EngineFieldError(reason, message)
}

/** KV cache spec kinds whose events describe the main attention cache; other groups are skipped. */
const MAIN_SPEC_KINDS = new Set(["full_attention", "mla_attention", "sink_full_attention"])

const EVENT_TAGS = K("BlockStored", "BlockRemoved", "AllBlocksCleared")
const TAG_STORED = 0
const TAG_REMOVED = 1

// Field ids: the index of each field's name in EVENT_FIELDS.
const F_TYPE = 0
const F_HASHES = 1
const F_PARENT = 2
const F_TOKENS = 3
const F_BLOCK_SIZE = 4
const F_LORA_ID = 5
const F_MEDIUM = 6
const F_LORA_NAME = 7
const F_EXTRA_KEYS = 8
const F_GROUP_IDX = 9
const F_SPEC_KIND = 10
const F_SLIDING_WINDOW = 11
const F_LOCALITY = 12
const F_OWNERSHIP = 13
const F_SESSION_ID = 14
const F_EVENT_VERSION = 15
/** SGLang's map-encoded `cache_salt`; no positional form carries it. */
const F_CACHE_SALT = 16
const F_UNKNOWN = -1

const EVENT_FIELDS = K(
  "type",
  "block_hashes",
  "parent_block_hash",
  "token_ids",
  "block_size",
  "lora_id",
  "medium",
  "lora_name",
  "extra_keys",
  "group_idx",
  "kv_cache_spec_kind",
  "kv_cache_spec_sliding_window",
  "locality",
  "ownership",
  "session_id",
  "event_version",
  "cache_salt"
)

/**
 * Positions of the tagged-array forms (vLLM before v0.24, SGLang), in msgspec field order; later
 * positions are fields this relay does not know yet and are skipped. Position 7 of a SGLang
 * `BlockStored` may be its `metadata` map (`BlockStoredWithMetadata`) instead of `lora_name`.
 */
const STORED_POSITIONS: ReadonlyArray<number> = [
  F_TYPE,
  F_HASHES,
  F_PARENT,
  F_TOKENS,
  F_BLOCK_SIZE,
  F_LORA_ID,
  F_MEDIUM,
  F_LORA_NAME,
  F_EXTRA_KEYS,
  F_GROUP_IDX,
  F_SPEC_KIND,
  F_SLIDING_WINDOW,
  F_LOCALITY,
  F_OWNERSHIP,
  F_SESSION_ID
]
const REMOVED_POSITIONS: ReadonlyArray<number> = [
  F_TYPE,
  F_HASHES,
  F_MEDIUM,
  F_GROUP_IDX,
  F_LOCALITY,
  F_OWNERSHIP
]

const BATCH_KEYS = K("ts", "events", "data_parallel_rank", "attn_dp_rank")

/** Largest token id (token ids are u32, PROTOCOL §3.2). */
const MAX_TOKEN_ID = 0xffff_ffff

/** What one decoded batch produced. */
export interface EngineBatch {
  readonly dpRank: DpRank
  readonly events: Array<RouterEvent>
  /** Events skipped on purpose, by reason (not this worker's device cache). */
  readonly skipped: EngineSkipCounts
  /** Every event not turned into a RouterEvent: the skipped ones and unknown event types. */
  readonly ignored: number
}

/** Options of the decoder that depend on the source's pool. */
interface EngineDecodeOptions {
  /** The card's `kvCacheBlockSize`: a `BlockStored` of another `block_size` is malformed. */
  readonly kvBlockSize?: number | undefined
  /**
   * The cache namespaces of the source's salted blocks, which a later batch of the same request
   * inherits from its parent (PROTOCOL §5.1 ◆3, `CacheNamespaces`). One per source, shared by the
   * batches decoded in order; without it a batch's namespace is only the one it names itself.
   */
  readonly namespaces?: CacheNamespaces | undefined
}

interface EventFields {
  tag: number
  blockHashes: Uint32Array | undefined
  parentHash: Uint32Array | undefined
  tokenCount: number
  sawTokens: boolean
  blockSize: number
  sawBlockSize: boolean
  /** The first reason that takes the event out of the device view, or undefined. */
  skip: EngineSkipReason | undefined
  groupIdx: number
  specKind: string | undefined
  loraName: string | undefined
  /** The storage tier of `medium` (PROTOCOL §5.1 ◆3); an unknown medium sets `skip` instead. */
  tier: StorageTier
  /** The map encoding's `cache_salt`: a string, null, or undefined when absent. */
  cacheSalt: string | null | undefined
  /** The string keys of the first block's `extra_keys` entry, where vLLM puts a request's salt. */
  firstExtraKeys: Array<string> | undefined
}

const textOf = (r: MsgpackReader, n: number): string => {
  const text = Buffer.from(r.buf.subarray(r.pos, r.pos + n)).toString("utf8")
  r.pos += n
  return text
}

/** nil → undefined; a string → its text; anything else is malformed. */
const optionalText = (
  r: MsgpackReader,
  field: string,
  reason: EngineMalformedReason = "field-type"
): string | undefined => {
  if (r.nil()) return undefined
  const n = r.tryStrHeader()
  if (n < 0) return malformedField(reason, `${field}: expected a string or nil`)
  return textOf(r, n)
}

/** nil → undefined; an integer (either sign) → its value; anything else is malformed. */
const optionalInt = (r: MsgpackReader, field: string, reason: EngineMalformedReason): number | undefined => {
  if (r.nil()) return undefined
  if (!r.isInt()) return malformedField(reason, `${field}: expected an integer or nil`)
  return readInt(r)
}

/** Any msgpack integer as a number (64-bit values beyond 2^53 lose precision; only compared to 0). */
const readInt = (r: MsgpackReader): number => {
  const b = r.buf[r.pos]!
  if (b >= 0xe0) {
    r.pos++
    return b - 256
  }
  if (b >= 0xd0 && b <= 0xd3) {
    const view = new DataView(r.buf.buffer, r.buf.byteOffset + r.pos + 1)
    const width = 1 << (b - 0xd0)
    if (r.pos + 1 + width > r.end) fail("integer: truncated")
    r.pos += 1 + width
    if (width === 1) return view.getInt8(0)
    if (width === 2) return view.getInt16(0)
    if (width === 4) return view.getInt32(0)
    return view.getInt32(0) * 4294967296 + view.getUint32(4)
  }
  if (b === 0xcf) {
    if (r.pos + 9 > r.end) fail("integer: truncated")
    const view = new DataView(r.buf.buffer, r.buf.byteOffset + r.pos + 1)
    r.pos += 9
    return view.getUint32(0) * 4294967296 + view.getUint32(4)
  }
  return r.uint("integer", Number.MAX_VALUE)
}

/** An engine hash: a msgpack integer of either sign (as u64) or a bin of at least 8 bytes (low 8, big-endian). */
const readHash = (r: MsgpackReader, out: Uint32Array, at: number, field: string): void => {
  if (r.isInt()) {
    r.u64(out, at, field)
    return
  }
  const n = r.tryBinHeader()
  if (n < 0) malformedField("hash", `${field}: expected an integer or a byte string`)
  if (n < 8) malformedField("hash", `${field}: a byte-string hash of ${n} bytes (at least 8 are needed)`)
  const view = new DataView(r.buf.buffer, r.buf.byteOffset + r.pos + n - 8, 8)
  out[at] = view.getUint32(0)
  out[at + 1] = view.getUint32(4)
  r.pos += n
}

const readHashes = (r: MsgpackReader, field: string): Uint32Array => {
  const n = r.tryArray()
  if (n < 0) return malformedField("hash", `${field}: expected an array of hashes`)
  const out = new Uint32Array(2 * n)
  for (let i = 0; i < n; i++) readHash(r, out, 2 * i, field)
  return out
}

/** Token ids of the event being read (reused; the local hashes are computed before the next). */
let tokenScratch = new Uint32Array(4096)

/** Validates every token id (u32) into `tokenScratch` and returns how many there are. */
const readTokens = (r: MsgpackReader): number => {
  const n = r.tryArray()
  if (n < 0) return malformedField("token-ids", "token_ids: expected an array of integers")
  if (tokenScratch.length < n) tokenScratch = new Uint32Array(Math.max(n, 2 * tokenScratch.length))
  const out = tokenScratch
  for (let i = 0; i < n; i++) {
    if (!r.isInt()) malformedField("token-ids", `token_ids[${i}]: expected an integer`)
    const token = readInt(r)
    if (token < 0 || token > MAX_TOKEN_ID)
      malformedField("token-ids", `token_ids[${i}]: ${token} is outside [0, 2^32)`)
    out[i] = token
  }
  return n
}

/** Tokens-hash seeds by LoRA name and cache namespace, as halves (a handful per pool). */
const loraSeeds = new Map<string, readonly [number, number]>()
const BASE_SEED: readonly [number, number] = [0, Number(TOKENS_HASH_SEED)]
const seedOf = (loraName: string | undefined, namespace: string | undefined): readonly [number, number] => {
  const salted = namespace !== undefined && namespace !== ""
  if ((loraName === undefined || loraName === "") && !salted) return BASE_SEED
  // A NUL cannot start a LoRA name read from msgpack text and a salt, so the two keys never meet.
  const key = salted ? `\u0000${loraName ?? ""}\u0000${namespace}` : loraName!
  let seed = loraSeeds.get(key)
  if (seed === undefined) {
    const value = blockHashSeed(loraName, namespace)
    seed = [Number(value >> 32n), Number(value & 0xffff_ffffn)]
    if (loraSeeds.size >= 1024) loraSeeds.clear()
    loraSeeds.set(key, seed)
  }
  return seed
}

/**
 * Local (tokens) hashes of the first `blocks` full blocks of the event just read, as Dynamo's
 * `compute_block_hash_for_seq` computes them (PROTOCOL §3.3), under the block's cache namespace.
 */
const localHashesOf = (f: EventFields, blocks: number, namespace: string | undefined): Uint32Array => {
  const out = new Uint32Array(2 * blocks)
  const [hi, lo] = seedOf(f.loraName, namespace)
  localHashesInto(tokenScratch, 0, blocks * f.blockSize, f.blockSize, "dynamo_standard_v1", hi, lo, out, 0)
  return out
}

const setSkip = (f: EventFields, reason: EngineSkipReason): void => {
  // One reason per event, in the order of §3.2: medium, locality, ownership, group.
  if (f.skip === undefined || ENGINE_SKIP_REASONS.indexOf(reason) < ENGINE_SKIP_REASONS.indexOf(f.skip))
    f.skip = reason
}

const readField = (r: MsgpackReader, f: EventFields, field: number, positional: boolean): void => {
  switch (field) {
    case F_HASHES:
      f.blockHashes = readHashes(r, "block_hashes")
      return
    case F_PARENT:
      if (r.nil()) f.parentHash = undefined
      else {
        f.parentHash = new Uint32Array(2)
        readHash(r, f.parentHash, 0, "parent_block_hash")
      }
      return
    case F_TOKENS:
      f.tokenCount = readTokens(r)
      f.sawTokens = true
      return
    case F_BLOCK_SIZE:
      if (!r.isInt()) malformedField("block-size", "block_size: expected an integer")
      f.blockSize = readInt(r)
      f.sawBlockSize = true
      return
    case F_LORA_ID:
      optionalInt(r, "lora_id", "lora")
      return
    case F_LORA_NAME: {
      // SGLang's BlockStoredWithMetadata puts a `{cache_salt}` map where vLLM has lora_name.
      const entries = positional ? r.tryMap() : -1
      if (entries >= 0) {
        for (let e = 0; e < entries; e++) {
          r.skip()
          r.skip()
        }
        return
      }
      f.loraName = optionalText(r, "lora_name", "lora")
      return
    }
    case F_MEDIUM: {
      // Dynamo's tiers (§5.1 ◆3): host and disk events are kept per member beside the device's.
      const tier = storageTierOfMedium(optionalText(r, "medium"))
      if (tier === undefined) setSkip(f, "medium")
      else f.tier = tier
      return
    }
    case F_EXTRA_KEYS:
      f.firstExtraKeys = readFirstExtraKeys(r)
      return
    case F_LOCALITY: {
      const locality = optionalText(r, "locality")
      if (locality !== undefined && locality !== "LOCAL") setSkip(f, "locality")
      return
    }
    case F_OWNERSHIP:
      if (optionalText(r, "ownership") !== undefined) setSkip(f, "ownership")
      return
    case F_GROUP_IDX: {
      const group = optionalInt(r, "group_idx", "field-type")
      if (group !== undefined) f.groupIdx = group
      return
    }
    case F_SPEC_KIND:
      f.specKind = optionalText(r, "kv_cache_spec_kind")
      return
    case F_SLIDING_WINDOW:
      optionalInt(r, "kv_cache_spec_sliding_window", "field-type")
      return
    case F_EVENT_VERSION:
      optionalInt(r, "event_version", "field-type")
      return
    case F_SESSION_ID:
      optionalText(r, "session_id")
      return
    case F_CACHE_SALT:
      f.cacheSalt = r.nil() ? null : optionalText(r, "cache_salt")
      return
    default:
      // extra_keys and fields newer than this relay: any value.
      r.skip()
  }
}

/**
 * The string keys of `extra_keys[0]` (the first block's), the only place vLLM puts a request's
 * `cache_salt`; other entries and non-string keys are passed over. A value of another shape is
 * skipped as before this field was read: it names no namespace.
 */
const readFirstExtraKeys = (r: MsgpackReader): Array<string> | undefined => {
  const blocks = r.tryArray()
  if (blocks < 0) {
    r.skip()
    return undefined
  }
  let keys: Array<string> | undefined
  for (let b = 0; b < blocks; b++) {
    const items = b === 0 ? r.tryArray() : -1
    if (items < 0) {
      r.skip()
      continue
    }
    for (let k = 0; k < items; k++) {
      const n = r.tryStrHeader()
      if (n < 0) r.skip()
      else {
        keys ??= []
        keys.push(textOf(r, n))
      }
    }
  }
  return keys
}

const resetFields = (f: EventFields): void => {
  f.tag = -1
  f.blockHashes = undefined
  f.parentHash = undefined
  f.tokenCount = 0
  f.sawTokens = false
  f.blockSize = 0
  f.sawBlockSize = false
  f.skip = undefined
  f.groupIdx = 0
  f.specKind = undefined
  f.loraName = undefined
  f.tier = "device"
  f.cacheSalt = undefined
  f.firstExtraKeys = undefined
}

const readEventFields = (r: MsgpackReader, f: EventFields): void => {
  resetFields(f)
  const entries = r.tryMap()
  if (entries >= 0) {
    let sawType = false
    for (let e = 0; e < entries; e++) {
      const field = r.key(EVENT_FIELDS)
      if (field === -2) fail("event: a map key that is not a string")
      if (field === F_TYPE) {
        const tag = r.key(EVENT_TAGS)
        if (tag === -2) fail("event type: expected a string")
        f.tag = tag
        sawType = true
      } else if (field === F_UNKNOWN) r.skip()
      else readField(r, f, field, false)
    }
    if (!sawType) fail('event: a tagged map without "type"')
    return
  }
  const len = r.array("event")
  if (len < 1) fail("event: an empty tagged array")
  const tag = r.key(EVENT_TAGS)
  if (tag === -2) fail("event: the tag is not a string")
  f.tag = tag
  const positions =
    tag === TAG_STORED ? STORED_POSITIONS : tag === TAG_REMOVED ? REMOVED_POSITIONS : undefined
  for (let i = 1; i < len; i++) {
    const field = positions === undefined || i >= positions.length ? F_UNKNOWN : positions[i]!
    if (field === F_UNKNOWN) r.skip()
    else readField(r, f, field, true)
  }
}

/** The skip reason of a non-main KV cache group (hybrid models publish one stream per group). */
const groupSkipped = (f: EventFields): boolean =>
  f.specKind !== undefined ? !MAIN_SPEC_KINDS.has(f.specKind) : f.groupIdx !== 0

/**
 * The hashes of a device-cache `BlockStored` that cover full blocks (§3.2): block `i` covers
 * `token_ids[i·B, (i+1)·B)`; a last hash whose block is not full is not indexed.
 */
const fullBlockHashes = (f: EventFields, options: EngineDecodeOptions): Uint32Array => {
  const hashes = f.blockHashes!
  if (!f.sawBlockSize) return malformedField("block-size", "BlockStored: missing block_size")
  if (!f.sawTokens) return malformedField("token-count", "BlockStored: missing token_ids")
  const size = f.blockSize
  if (!Number.isSafeInteger(size) || size <= 0)
    return malformedField("block-size", `BlockStored: block_size ${size} is not a positive integer`)
  const expected = options.kvBlockSize
  if (expected !== undefined && size !== expected)
    return malformedField(
      "block-size",
      `BlockStored: block_size ${size} differs from the card's kvCacheBlockSize ${expected}`
    )
  const n = hashes.length >>> 1
  const tokens = f.tokenCount
  // Only the last block may be partial: n hashes need more than (n - 1)·B and at most n·B tokens.
  if (tokens > n * size || (n > 0 && tokens <= (n - 1) * size) || (n === 0 && tokens > 0))
    return malformedField(
      "token-count",
      `BlockStored: ${n} hashes of ${size}-token blocks do not match ${tokens} token ids`
    )
  const full = Math.floor(tokens / size)
  return full === n ? hashes : hashes.subarray(0, 2 * full)
}

const fieldsScratch: EventFields = {
  tag: -1,
  blockHashes: undefined,
  parentHash: undefined,
  tokenCount: 0,
  sawTokens: false,
  blockSize: 0,
  sawBlockSize: false,
  skip: undefined,
  groupIdx: 0,
  specKind: undefined,
  loraName: undefined,
  tier: "device",
  cacheSalt: undefined,
  firstExtraKeys: undefined
}

const readEvents = (
  r: MsgpackReader,
  workerId: WorkerId,
  dpRank: DpRank,
  eventId: number,
  options: EngineDecodeOptions,
  out: Array<RouterEvent>,
  skipped: Record<EngineSkipReason, number>
): number => {
  const n = r.array("events")
  let ignored = 0
  const f = fieldsScratch
  // The rank's key in the namespace table, built once per batch rather than per event.
  const member = options.namespaces === undefined ? "" : memberKey(workerId, dpRank)
  for (let i = 0; i < n; i++) {
    readEventFields(r, f)
    if (f.tag < 0) {
      ignored++
      continue
    }
    if (f.tag !== TAG_STORED && f.tag !== TAG_REMOVED) {
      options.namespaces?.cleared(member)
      out.push({ workerId, dpRank, eventId, storageTier: "device", data: { _tag: "Cleared" } })
      continue
    }
    if (f.blockHashes === undefined)
      return malformedField(
        "hash",
        `${f.tag === TAG_STORED ? "BlockStored" : "BlockRemoved"}: missing block_hashes`
      )
    if (f.skip === undefined && groupSkipped(f)) f.skip = "group"
    if (f.skip !== undefined) {
      skipped[f.skip]++
      ignored++
      continue
    }
    let data: KvCacheEventData
    if (
      f.tag === TAG_STORED &&
      f.tier !== "device" &&
      f.sawTokens &&
      f.tokenCount === 0 &&
      f.parentHash === undefined
    ) {
      // vLLM's offloading connector stores host and disk copies with `token_ids: []` and no
      // parent: the blocks are named by external hash alone and resolved through the rank's
      // lineage (§5.1 ◆3). Its block size is the offloaded one, which may be a multiple of the
      // card's, so it is not checked against the card here.
      data = {
        _tag: "Stored",
        blockHashes: f.blockHashes,
        tokensHashes: undefined,
        parentHash: undefined,
        startPosition: undefined,
        skipUnanchored: true,
        resolveThroughLineage: true
      }
    } else if (f.tag === TAG_STORED) {
      const blockHashes = fullBlockHashes(f, options)
      let namespace = storedEventCacheNamespace({
        cacheSalt: f.cacheSalt,
        extraKeys: f.firstExtraKeys === undefined ? undefined : [f.firstExtraKeys],
        loraName: f.loraName
      })
      const namespaces = options.namespaces
      if (namespaces !== undefined) {
        const effective = namespaces.stored(member, blockHashes, f.parentHash, namespace)
        if (effective === AMBIGUOUS_CACHE_NAMESPACE) {
          // Dynamo's normalizer drops such a batch too: its blocks cannot be hashed for certain.
          skipped.namespace++
          ignored++
          continue
        }
        namespace = effective
      }
      data = {
        _tag: "Stored",
        blockHashes,
        tokensHashes: localHashesOf(f, blockHashes.length >>> 1, namespace),
        parentHash: f.parentHash,
        startPosition: undefined,
        // An engine's history reaches only as far back as its replay buffer (PROTOCOL §3.3 ◆3).
        skipUnanchored: true
      }
    } else {
      if (f.tier === "device") options.namespaces?.removed(member, f.blockHashes)
      data = { _tag: "Removed", blockHashes: f.blockHashes }
    }
    out.push({ workerId, dpRank, eventId, storageTier: f.tier, data })
  }
  return ignored
}

const readBatchRank = (r: MsgpackReader): number | undefined =>
  r.nil() ? undefined : r.uint("data_parallel_rank", 0xffff_ffff)

/**
 * Decodes one batch payload; every event gets `eventId`. The batch's own rank wins over
 * `defaultDpRank` (the advertised one), so a mismatch is visible to the source supervisor.
 * Throws `MsgpackDecodeError` for a msgpack shape error and `EngineFieldError` for a field that
 * breaks §3.2.
 */
const readEngineBatch = (
  r: MsgpackReader,
  workerId: WorkerId,
  defaultDpRank: DpRank,
  eventId: number,
  options: EngineDecodeOptions = {}
): EngineBatch => {
  let events: Array<RouterEvent> = []
  const skipped = noSkips()
  let ignored = 0
  let rank: number | undefined
  const entries = r.tryMap()
  if (entries >= 0) {
    let sawEvents = false
    for (let e = 0; e < entries; e++) {
      switch (r.key(BATCH_KEYS)) {
        case 1:
          ignored = readEvents(r, workerId, defaultDpRank, eventId, options, events, skipped)
          sawEvents = true
          break
        case 2:
        case 3:
          rank = readBatchRank(r) ?? rank
          break
        // A key that is not a string: skip it and its value. Each decoder's switch spells this out:
        // the switches stay flat on the decode path (see transport/msgpack.ts).
        case -2:
          r.skip()
          r.skip()
          break
        default:
          r.skip()
      }
    }
    if (!sawEvents) fail("batch: missing events")
  } else {
    const len = r.array("batch")
    if (len < 2) fail(`batch: expected [ts, events, dp_rank?], got ${len} elements`)
    r.skip() // ts
    ignored = readEvents(r, workerId, defaultDpRank, eventId, options, events, skipped)
    if (len >= 3) rank = readBatchRank(r)
    for (let i = 3; i < len; i++) r.skip()
  }
  if (r.pos !== r.end) fail(`batch: ${r.end - r.pos} bytes after the batch`)
  const dpRank = rank ?? defaultDpRank
  if (dpRank !== defaultDpRank) events = events.map((event) => ({ ...event, dpRank }))
  if (events.length === 0) {
    // The batch still holds its place in the rank's sequence: a batch whose events were all
    // skipped must not look like a gap.
    events.push({
      workerId,
      dpRank,
      eventId,
      storageTier: "device",
      data: { _tag: "Removed", blockHashes: new Uint32Array(0) }
    })
  }
  return { dpRank, events, skipped, ignored }
}

type EngineDecodeResult =
  | { readonly ok: true; readonly value: EngineBatch }
  | { readonly ok: false; readonly reason: EngineMalformedReason | "payload"; readonly message: string }

/** Decodes one batch payload; never throws. */
export const decodeEngineBatch = (
  payload: Uint8Array,
  workerId: WorkerId,
  defaultDpRank: DpRank,
  eventId: number,
  options: EngineDecodeOptions = {}
): EngineDecodeResult => {
  try {
    return {
      ok: true,
      value: readEngineBatch(new MsgpackReader(payload), workerId, defaultDpRank, eventId, options)
    }
  } catch (error) {
    if (error instanceof EngineFieldError) return { ok: false, reason: error.reason, message: error.message }
    return { ok: false, reason: "payload", message: error instanceof Error ? error.message : String(error) }
  }
}

interface EngineSourceIdentity {
  readonly workerId: WorkerId
  readonly dpRank: DpRank
  /** The advertised publisher id the batches are routed under. */
  readonly publisherId: bigint
  readonly topic: string
}

/** How far past the last accepted seq a batch may claim to be before it is malformed (§3.2). */
const MAX_SEQ_JUMP = 2 ** 32

/**
 * Decodes the 3-frame messages of one engine source, in arrival order. It keeps the last
 * accepted seq (0 before the first) so that implausible sequences cannot wedge the source
 * (§3.2): a seq more than 2^32 past it is malformed and leaves it unchanged; a lower seq is stale
 * and dropped, except 0, which is the engine counting again after a restart and is passed on
 * (the rank state resets and resynchronises the rank).
 */
export const makeEngineDecoder = (
  source: EngineSourceIdentity,
  options: EngineDecodeOptions = {}
): ((frames: ReadonlyArray<Uint8Array>) => IngestMessage) => {
  const topicBytes = Buffer.from(source.topic, "utf8")
  const publisherId = source.publisherId
  const decodeOptions: EngineDecodeOptions = {
    ...options,
    namespaces: options.namespaces ?? new CacheNamespaces()
  }
  let lastSeq = -1
  const malformed = (reason: MalformedReason, message: string): IngestMessage => ({
    _tag: "Malformed",
    reason,
    message,
    publisherId
  })
  return (frames) => {
    if (frames.length !== 3) return malformed("frame-count", `expected 3 frames, got ${frames.length}`)
    // The SUB subscription is a prefix filter (PROTOCOL §3: the relay "subscribes to" the topic),
    // so a longer topic frame is a message the subscription asked for: an engine publishing
    // "kv@worker-3" to a source advertised with topic "" or "kv" is followed, not dropped.
    const topic = frames[0]!
    if (
      topic.length < topicBytes.length ||
      !Buffer.from(topic.buffer, topic.byteOffset, topicBytes.length).equals(topicBytes)
    )
      return malformed("topic", `topic frame does not start with ${JSON.stringify(source.topic)}`)
    const seqFrame = frames[1]!
    if (seqFrame.length !== 8)
      return malformed("sequence-width", `sequence frame is ${seqFrame.length} bytes, expected 8`)
    const view = new DataView(seqFrame.buffer, seqFrame.byteOffset, 8)
    const hi = view.getUint32(0)
    // seq + 1 becomes the event id, which must stay an exact number.
    if (hi >= 0x20_0000) return malformed("sequence-range", "sequence at or above 2^53")
    const seq = hi * 4294967296 + view.getUint32(4)
    // Before the first live message the cursor is the engine's start, 0: the history before it
    // comes through replay, which does not pass here, and 2^32 batches take an engine years.
    if (seq > Math.max(lastSeq, 0) + MAX_SEQ_JUMP)
      return malformed("sequence-jump", `sequence ${seq} is more than 2^32 past ${Math.max(lastSeq, 0)}`)
    if (lastSeq >= 0 && seq <= lastSeq && (seq !== 0 || lastSeq === 0))
      return { _tag: "Stale", publisherId, sequence: seq }
    // An engine counting from 0 again has restarted: the salted blocks it remembered are gone.
    if (seq === 0 && lastSeq > 0) decodeOptions.namespaces?.cleared(memberKey(source.workerId, source.dpRank))
    const result = decodeEngineBatch(frames[2]!, source.workerId, source.dpRank, seq + 1, decodeOptions)
    if (!result.ok) return malformed(result.reason, `undecodable batch ${seq}: ${result.message}`)
    lastSeq = seq
    const { events, skipped, ignored } = result.value
    return { _tag: "Batch", publisherId, sequence: seq, events, blocks: blockCount(events), ignored, skipped }
  }
}

interface EngineSubscriptionOptions {
  readonly endpoint: string
  readonly source: EngineSourceIdentity
  readonly decode?: EngineDecodeOptions
  readonly deliver: (message: IngestMessage) => Delivered
  readonly onConnection?: (connected: boolean) => void
  readonly onConnectionError?: (error: string) => void
}

/** A SUB on one engine rank's PUB endpoint. */
export const subscribeEngine = (
  options: EngineSubscriptionOptions
): Effect.Effect<ReceiveLoop, ZmqError, Scope.Scope> =>
  subscribe({
    endpoint: options.endpoint,
    topic: options.source.topic,
    decode: makeEngineDecoder(options.source, options.decode),
    deliver: options.deliver,
    ...(options.onConnection === undefined ? {} : { onConnection: options.onConnection }),
    ...(options.onConnectionError === undefined ? {} : { onConnectionError: options.onConnectionError })
  })
