/**
 * vLLM / SGLang KV events over ZeroMQ (PROTOCOL.md §3 `engine-zmq`, recovery-events.md §6.3 and
 * Part B): 3 frames `[topic, seq u64 BE, payload]`, the payload a msgspec batch — positional
 * `[ts, events, dp_rank?, …]` or a map `{ts, events, data_parallel_rank | attn_dp_rank}` — whose
 * events are tagged arrays (`["BlockStored", …]`) or tagged maps (`{type: "BlockStored", …}`).
 *
 * The relay gives every event of batch `seq` the id `seq + 1`: a batch is one ordered commit
 * group and gaps are detected on `seq`. A batch whose events are all skipped (unknown media,
 * non-main KV groups, unknown event types) still yields one empty `Removed` event carrying its
 * id, so the rank's id stream stays dense and a skipped batch never looks like a gap.
 *
 * Replay (B.4): a DEALER sends `[empty, start seq u64 BE]` to the engine's ROUTER and receives
 * `[empty, seq, payload]` per buffered batch with `seq ≥ start`, then `[empty, 0xff×8, empty]`.
 */

import { Effect, type Scope } from "effect"
import * as zmq from "zeromq"
import type { DpRank, KvCacheEventData, RouterEvent, StorageTier, WorkerId } from "../domain/events.js"
import { failDecode, fixKey, guardDecode, MAX_SAFE_ID, MsgpackReader, MsgpackWriter } from "./msgpack.js"
import {
  acquireSocket,
  blockCount,
  connectSocket,
  type IngestMessage,
  type MalformedReason,
  receiveFrames,
  sendFrames,
  subscribe,
  u64FrameOf,
  ZmqError
} from "./ZmqSocket.js"

const fail = failDecode

const ascii = (text: string): Uint8Array => new TextEncoder().encode(text)
const K = (...names: ReadonlyArray<string>): ReadonlyArray<Uint8Array> => names.map(ascii)

/** Engine `medium` strings per tier (recovery-events.md §1.4); absent or nil is the device. */
const MEDIA: ReadonlyMap<string, StorageTier> = new Map<string, StorageTier>([
  ["GPU", "device"],
  ["DEVICE", "device"],
  ["CPU", "host_pinned"],
  ["CPU_PINNED", "host_pinned"],
  ["CPU_TIER1", "host_pinned"],
  ["CPU_TIER2", "disk"],
  ["DISK", "disk"],
  ["NVME", "disk"],
  ["STORAGE", "disk"],
  ["EXTERNAL", "external"],
  ["NETWORK", "external"],
  ["REMOTE", "external"],
  ["SHARED", "external"]
])

/** The medium a tier is published as (the reverse mapping; the device tier sends none). */
export const mediumOfTier = (tier: StorageTier): string | null =>
  tier === "device" ? null : tier === "host_pinned" ? "CPU_PINNED" : tier === "disk" ? "DISK" : "EXTERNAL"

/** KV cache spec kinds whose events describe the main attention cache; other groups are skipped. */
const MAIN_SPEC_KINDS = new Set(["full_attention", "mla_attention"])

const END_SEQ = Buffer.alloc(8, 0xff)

// ---------------------------------------------------------------------------------------------
// Decoding

const EVENT_TAGS = K("BlockStored", "BlockRemoved", "AllBlocksCleared")
const TAG_STORED = 0
const TAG_REMOVED = 1
const EVENT_FIELDS = K(
  "type",
  "block_hashes",
  "parent_block_hash",
  "medium",
  "group_idx",
  "kv_cache_spec_kind"
)
const BATCH_KEYS = K("ts", "events", "data_parallel_rank", "attn_dp_rank")

/** What one decoded batch produced. */
export interface EngineBatch {
  readonly dpRank: DpRank
  readonly events: Array<RouterEvent>
  readonly ignored: number
}

interface EventFields {
  tag: number
  blockHashes: Uint32Array | undefined
  parentHash: Uint32Array | undefined
  /** undefined = skip the event (unknown medium). */
  tier: StorageTier | undefined
  skip: boolean
}

const readMedium = (r: MsgpackReader): StorageTier | undefined => {
  if (r.nil()) return "device"
  const n = r.tryStrHeader()
  if (n < 0) {
    r.skip()
    return undefined
  }
  const text = Buffer.from(r.buf.subarray(r.pos, r.pos + n)).toString("latin1")
  r.pos += n
  return MEDIA.get(text) ?? MEDIA.get(text.toUpperCase())
}

const readGroupSkip = (r: MsgpackReader): boolean => {
  if (r.nil()) return false
  if (r.isInt()) return r.uint("group_idx", MAX_SAFE_ID) !== 0
  r.skip()
  return true
}

const readSpecKindSkip = (r: MsgpackReader): boolean => {
  if (r.nil()) return false
  const n = r.tryStrHeader()
  if (n < 0) {
    r.skip()
    return true
  }
  const kind = Buffer.from(r.buf.subarray(r.pos, r.pos + n)).toString("latin1")
  r.pos += n
  return !MAIN_SPEC_KINDS.has(kind)
}

const readHashes = (r: MsgpackReader, what: string): Uint32Array => {
  const n = r.array(what)
  const out = new Uint32Array(2 * n)
  for (let i = 0; i < n; i++) r.u64(out, 2 * i, what, true)
  return out
}

const readParent = (r: MsgpackReader): Uint32Array | undefined => {
  if (r.nil()) return undefined
  const out = new Uint32Array(2)
  r.u64(out, 0, "parent_block_hash", true)
  return out
}

const readEventFields = (r: MsgpackReader, f: EventFields): void => {
  f.tag = -1
  f.blockHashes = undefined
  f.parentHash = undefined
  f.tier = "device"
  f.skip = false
  const entries = r.tryMap()
  if (entries >= 0) {
    let sawType = false
    for (let e = 0; e < entries; e++) {
      switch (r.key(EVENT_FIELDS)) {
        case 0: {
          const tag = r.key(EVENT_TAGS)
          if (tag === -2) fail("event type: expected a string")
          f.tag = tag
          sawType = true
          break
        }
        case 1:
          f.blockHashes = readHashes(r, "block_hashes")
          break
        case 2:
          f.parentHash = readParent(r)
          break
        case 3:
          f.tier = readMedium(r)
          break
        case 4:
          if (readGroupSkip(r)) f.skip = true
          break
        case 5:
          if (readSpecKindSkip(r)) f.skip = true
          break
        case -2:
          r.skip()
          r.skip()
          break
        default:
          r.skip()
      }
    }
    if (!sawType) fail('event: a tagged map without "type"')
    return
  }
  const len = r.array("event")
  if (len < 1) fail("event: an empty tagged array")
  const tag = r.key(EVENT_TAGS)
  if (tag === -2) fail("event: the tag is not a string")
  f.tag = tag
  if (tag === TAG_STORED) {
    // [tag, block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium, lora_name,
    //  extra_keys, group_idx, kv_cache_spec_kind, kv_cache_spec_sliding_window, …]
    if (len < 3) fail("BlockStored: expected at least block_hashes and parent_block_hash")
    f.blockHashes = readHashes(r, "block_hashes")
    f.parentHash = readParent(r)
    for (let i = 3; i < len; i++) {
      if (i === 6) f.tier = readMedium(r)
      else if (i === 9) f.skip = readGroupSkip(r) || f.skip
      else if (i === 10) f.skip = readSpecKindSkip(r) || f.skip
      else r.skip()
    }
  } else if (tag === TAG_REMOVED) {
    // [tag, block_hashes, medium, group_idx, …]
    if (len < 2) fail("BlockRemoved: expected block_hashes")
    f.blockHashes = readHashes(r, "block_hashes")
    for (let i = 2; i < len; i++) {
      if (i === 2) f.tier = readMedium(r)
      else if (i === 3) f.skip = readGroupSkip(r) || f.skip
      else r.skip()
    }
  } else {
    for (let i = 1; i < len; i++) r.skip()
  }
}

const fieldsScratch: EventFields = {
  tag: -1,
  blockHashes: undefined,
  parentHash: undefined,
  tier: "device",
  skip: false
}

const readEvents = (
  r: MsgpackReader,
  workerId: WorkerId,
  dpRank: DpRank,
  eventId: number,
  out: Array<RouterEvent>
): number => {
  const n = r.array("events")
  let ignored = 0
  const f = fieldsScratch
  for (let i = 0; i < n; i++) {
    readEventFields(r, f)
    if (f.tag < 0 || f.skip || f.tier === undefined) {
      ignored++
      continue
    }
    let data: KvCacheEventData
    if (f.tag === TAG_STORED) {
      if (f.blockHashes === undefined) return fail("BlockStored: missing block_hashes")
      data = {
        _tag: "Stored",
        blockHashes: f.blockHashes,
        tokensHashes: undefined,
        parentHash: f.parentHash,
        startPosition: undefined
      }
    } else if (f.tag === TAG_REMOVED) {
      if (f.blockHashes === undefined) return fail("BlockRemoved: missing block_hashes")
      data = { _tag: "Removed", blockHashes: f.blockHashes }
    } else data = { _tag: "Cleared" }
    out.push({ workerId, dpRank, eventId, storageTier: f.tier, data })
  }
  return ignored
}

const readBatchRank = (r: MsgpackReader): number | undefined =>
  r.nil() ? undefined : r.uint("data_parallel_rank", 0xffff_ffff)

/**
 * Decodes one batch payload; every event gets `eventId`. The batch's own rank wins over
 * `defaultDpRank` (the advertised one), so a mismatch is visible to the source supervisor.
 * Throws `MsgpackDecodeError`.
 */
export const readEngineBatch = (
  r: MsgpackReader,
  workerId: WorkerId,
  defaultDpRank: DpRank,
  eventId: number
): EngineBatch => {
  let events: Array<RouterEvent> = []
  let ignored = 0
  let rank: number | undefined
  const entries = r.tryMap()
  if (entries >= 0) {
    let sawEvents = false
    for (let e = 0; e < entries; e++) {
      switch (r.key(BATCH_KEYS)) {
        case 1:
          ignored = readEvents(r, workerId, defaultDpRank, eventId, events)
          sawEvents = true
          break
        case 2:
        case 3:
          rank = readBatchRank(r) ?? rank
          break
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
    ignored = readEvents(r, workerId, defaultDpRank, eventId, events)
    if (len >= 3) rank = readBatchRank(r)
    for (let i = 3; i < len; i++) r.skip()
  }
  const dpRank = rank ?? defaultDpRank
  if (dpRank !== defaultDpRank) events = events.map((event) => ({ ...event, dpRank }))
  if (events.length === 0) {
    events.push({
      workerId,
      dpRank,
      eventId,
      storageTier: "device",
      data: { _tag: "Removed", blockHashes: new Uint32Array(0) }
    })
  }
  return { dpRank, events, ignored }
}

export const decodeEngineBatch = (
  payload: Uint8Array,
  workerId: WorkerId,
  defaultDpRank: DpRank,
  eventId: number
) => guardDecode(() => readEngineBatch(new MsgpackReader(payload), workerId, defaultDpRank, eventId))

export interface EngineSourceIdentity {
  readonly workerId: WorkerId
  readonly dpRank: DpRank
  /** The advertised publisher id the batches are routed under. */
  readonly publisherId: bigint
  readonly topic: string
}

/** Decodes one 3-frame message of an engine source. */
export const makeEngineDecoder = (
  source: EngineSourceIdentity
): ((frames: ReadonlyArray<Uint8Array>) => IngestMessage) => {
  const topicBytes = Buffer.from(source.topic, "utf8")
  const publisherId = source.publisherId
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
    if (hi >= 0x20_0000) return malformed("sequence-range", "sequence above 2^53 - 1")
    const seq = hi * 4294967296 + view.getUint32(4)
    const result = decodeEngineBatch(frames[2]!, source.workerId, source.dpRank, seq + 1)
    if (!result.ok) return malformed("payload", `undecodable batch ${seq}: ${result.message}`)
    const { events, ignored } = result.value
    return { _tag: "Batch", publisherId, sequence: seq, events, blocks: blockCount(events), ignored }
  }
}

export interface EngineSubscriptionOptions {
  readonly endpoint: string
  readonly source: EngineSourceIdentity
  readonly deliver: (message: IngestMessage) => Effect.Effect<void>
  readonly onConnection?: (connected: boolean) => void
}

/** A SUB on one engine rank's PUB endpoint. */
export const subscribeEngine = (
  options: EngineSubscriptionOptions
): Effect.Effect<void, ZmqError, Scope.Scope> =>
  subscribe({
    endpoint: options.endpoint,
    topic: options.source.topic,
    decode: makeEngineDecoder(options.source),
    deliver: options.deliver,
    ...(options.onConnection === undefined ? {} : { onConnection: options.onConnection })
  })

// ---------------------------------------------------------------------------------------------
// Encoding (simulated engines)

export type EngineEvent =
  | {
      readonly type: "BlockStored"
      readonly blockHashes: Uint32Array
      readonly parentBlockHash: Uint32Array | undefined
      readonly tokenIds: ReadonlyArray<number>
      readonly blockSize: number
      readonly loraId?: number | null
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

export const VLLM_FORMAT: EngineFormat = {
  events: "map",
  batch: "array",
  hashes: "unsigned",
  rankField: "data_parallel_rank",
  medium: true
}

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
  const hasMedium = format.medium || event.medium != null
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
    w.nil()
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

// ---------------------------------------------------------------------------------------------
// Replay client

export interface ReplayedBatch {
  readonly seq: number
  /** undefined when the batch could not be decoded (the replay then has a hole there). */
  readonly batch: EngineBatch | undefined
  readonly error: string | undefined
}

export interface ReplayOptions {
  readonly replayEndpoint: string
  readonly startSeq: number
  readonly workerId: WorkerId
  readonly dpRank: DpRank
  /** Refuse replays longer than this many batches (default 1,000,000). */
  readonly maxBatches?: number
}

/**
 * Replays an engine's buffered batches from `startSeq` on a fresh DEALER. The socket lives only
 * as long as this effect: an interrupted replay closes it, so no reply can leak into another.
 */
export const replayEngine = (options: ReplayOptions): Effect.Effect<ReadonlyArray<ReplayedBatch>, ZmqError> =>
  Effect.scoped(
    Effect.gen(function* () {
      const endpoint = options.replayEndpoint
      const socket = yield* acquireSocket(() => new zmq.Dealer({ linger: 0 }))
      yield* connectSocket(socket, endpoint)
      yield* sendFrames(socket, [Buffer.alloc(0), u64FrameOf(options.startSeq)], endpoint)
      const max = options.maxBatches ?? 1_000_000
      const out: Array<ReplayedBatch> = []
      for (;;) {
        const frames = yield* receiveFrames(socket, endpoint)
        if (frames.length !== 3 || frames[0]!.length !== 0 || frames[1]!.length !== 8) {
          return yield* new ZmqError({
            operation: "replay",
            endpoint,
            message: `unexpected replay message of ${frames.length} frames (expected [empty, seq, payload])`
          })
        }
        if (frames[1]!.equals(END_SEQ)) return out
        const view = new DataView(frames[1]!.buffer, frames[1]!.byteOffset, 8)
        const hi = view.getUint32(0)
        if (hi >= 0x20_0000)
          return yield* new ZmqError({
            operation: "replay",
            endpoint,
            message: "replayed sequence above 2^53 - 1"
          })
        const seq = hi * 4294967296 + view.getUint32(4)
        const decoded = decodeEngineBatch(frames[2]!, options.workerId, options.dpRank, seq + 1)
        out.push(
          decoded.ok
            ? { seq, batch: decoded.value, error: undefined }
            : { seq, batch: undefined, error: decoded.message }
        )
        if (out.length > max)
          return yield* new ZmqError({
            operation: "replay",
            endpoint,
            message: `replay exceeds ${max} batches`
          })
      }
    })
  ).pipe(
    Effect.withSpan("EngineZmq.replay", {
      attributes: { endpoint: options.replayEndpoint, startSeq: options.startSeq }
    })
  )

/** The replay end marker's sequence frame (`-1` as a signed 8-byte big-endian value). */
export const REPLAY_END_SEQ: Buffer = END_SEQ
