/**
 * The `Vec<RouterEvent>` payload codec (PROTOCOL.md §3.1, rmp-serde named maps): block hashes are
 * read straight into hash pairs (`[hi, lo]` in a `Uint32Array`), with fast paths for the exact
 * bytes rmp-serde writes for the common events.
 */

import type { StorageTier } from "../../../ckf/events.js"
import { decimalOf } from "../../../ckf/u64.js"
import type { KvCacheEventData, RouterEvent, WorkerId } from "../../../protocol/Events.js"
import { fastPaths } from "./fastPaths.js"
import { be16, be32, fail, i32, MsgpackReader, TWO_32 } from "./reader.js"
import { fixKey, K, MsgpackWriter } from "./writer.js"

// ---------------------------------------------------------------------------------------------
// RouterEvent payload (Vec<RouterEvent>, rmp-serde named maps)

const ROUTER_EVENT_KEYS = K("worker_id", "storage_tier", "event", "residency_domain", "state_source")
const KV_EVENT_KEYS = K("event_id", "data", "dp_rank")
const DATA_VARIANTS = K("stored", "removed", "cleared")
const STORED_KEYS = K("parent_hash", "start_position", "blocks")
const BLOCK_KEYS = K("block_hash", "tokens_hash", "mm_extra_info")
const REMOVED_KEYS = K("block_hashes")
const TIERS: ReadonlyArray<StorageTier> = ["device", "host_pinned", "disk", "external"]
const TIER_KEYS = K(...TIERS)

/** The variant index order of `KvCacheEventData` (older rmp-serde wrote indices, not names). */
const VARIANT_STORED = 0
const VARIANT_REMOVED = 1
const VARIANT_CLEARED = 2

const CLEARED: KvCacheEventData = { _tag: "Cleared" }
export const scratch = new Uint32Array(2)

// One batch comes from one worker: remembering the last worker id text avoids a string per event.
let lastWorkerHi = -1
let lastWorkerLo = -1
let lastWorkerText: WorkerId = ""

const workerText = (hi: number, lo: number): WorkerId => {
  if (hi !== lastWorkerHi || lo !== lastWorkerLo) {
    lastWorkerText = decimalOf(hi, lo)
    lastWorkerHi = hi
    lastWorkerLo = lo
  }
  return lastWorkerText
}

const readWorkerId = (r: MsgpackReader): WorkerId => {
  r.u64(scratch, 0, "worker_id")
  return workerText(scratch[0]!, scratch[1]!)
}

/** `storage_tier`: a snake_case name, or (older rmp-serde) a variant index, `{variant: nil}` or `[index, []]`. */
const readTier = (r: MsgpackReader): StorageTier => {
  if (r.isInt()) {
    const index = r.uint("storage_tier", 3)
    return TIERS[index]!
  }
  const k = r.key(TIER_KEYS)
  if (k >= 0) return TIERS[k]!
  if (k === -1) return fail(`storage_tier: unknown tier ${JSON.stringify(r.lastKey())}`)
  const entries = r.tryMap()
  if (entries === 1) {
    const tier = readTier(r)
    r.skip()
    return tier
  }
  const len = entries < 0 ? r.tryArray() : -1
  if (len >= 1) {
    const tier = readTier(r)
    for (let i = 1; i < len; i++) r.skip()
    return tier
  }
  return fail("storage_tier: expected a tier name or variant index")
}

/** A hash list: an array of u64 (signed values reinterpreted). */
const readHashList = (r: MsgpackReader, what: string, bytes = false): Uint32Array => {
  const n = r.array(what)
  const out = new Uint32Array(2 * n)
  for (let i = 0; i < n; i++) r.u64(out, 2 * i, what, bytes)
  return out
}

const readOptionalHash = (r: MsgpackReader, what: string, bytes = false): Uint32Array | undefined => {
  if (r.nil()) return undefined
  const out = new Uint32Array(2)
  r.u64(out, 0, what, bytes)
  return out
}

const readOptionalU32 = (r: MsgpackReader, what: string): number | undefined =>
  r.nil() ? undefined : r.uint(what, 0xffff_ffff)

/** What `readBlocks` read, in module state (no result object per event). */
let blocksBlockHashes: Uint32Array = new Uint32Array(0)
let blocksTokensHashes: Uint32Array = new Uint32Array(0)

// ---------------------------------------------------------------------------------------------
// Fast paths: the exact bytes rmp-serde `to_vec_named` writes for the common messages
// (PROTOCOL.md §3.1 field order, fixstr keys). Each one either reads its whole value or consumes
// nothing and reports a miss, and the general reader then reads the same bytes: a fast path
// never throws, so every error (and its text) comes from the general reader. The keys are
// compared as big-endian 32-bit words against constants (overlapping at the end of a segment),
// about a third of the cost of the byte loop in `key` over a key table.

/** The value read by `fastUnsigned`. */
export let fastHi = 0
export let fastLo = 0

/**
 * An unsigned integer of any width at `b[p]` (within `end`) into `fastHi`/`fastLo`: the position
 * after it, or -1 for anything else (a signed encoding included: the general reader decides
 * about those).
 */
export const fastUnsigned = (b: Uint8Array, p: number, end: number): number => {
  const x = b[p]!
  if (x <= 0x7f) {
    fastHi = 0
    fastLo = x
    return p + 1
  }
  switch (x) {
    case 0xcc:
      if (p + 2 > end) return -1
      fastHi = 0
      fastLo = b[p + 1]!
      return p + 2
    case 0xcd:
      if (p + 3 > end) return -1
      fastHi = 0
      fastLo = be16(b, p + 1)
      return p + 3
    case 0xce:
      if (p + 5 > end) return -1
      fastHi = 0
      fastLo = be32(b, p + 1)
      return p + 5
    case 0xcf:
      if (p + 9 > end) return -1
      fastHi = be32(b, p + 1)
      fastLo = be32(b, p + 5)
      return p + 9
    default:
      return -1
  }
}

/**
 * One block exactly as rmp-serde writes Dynamo's `KvBlock` with full-width hashes, 57 bytes:
 * `0x83 "block_hash" 0xcf <8> "tokens_hash" 0xcf <8> "mm_extra_info" 0xc0` (fixstr keys). Its
 * 41 fixed bytes are compared as big-endian 32-bit words against constants (a byte loop over a
 * key table costs about three times as much; the key bytes are most of the decoding work).
 */
const FAST_BLOCK_BYTES = 57
const FAST_BLOCK_TEMPLATE = (() => {
  const t = new Uint8Array(FAST_BLOCK_BYTES)
  t.set([0x83, ...fixKey("block_hash"), 0xcf], 0)
  t.set([...fixKey("tokens_hash"), 0xcf], 21)
  t.set([...fixKey("mm_extra_info"), 0xc0], 42)
  return t
})()
/** Fixed word at byte `p` of the template. */
const tw = (p: number): number => i32(FAST_BLOCK_TEMPLATE, p)
// Bytes 0-12 (header, block_hash key, 0xcf), 21-33 (tokens_hash key, 0xcf), 42-56 (mm_extra_info key, nil).
const T0 = tw(0)
const T4 = tw(4)
const T8 = tw(8)
const T12 = FAST_BLOCK_TEMPLATE[12]!
const T21 = tw(21)
const T25 = tw(25)
const T29 = tw(29)
const T33 = FAST_BLOCK_TEMPLATE[33]!
const T42 = tw(42)
const T46 = tw(46)
const T50 = tw(50)
const T53 = tw(53)

/**
 * One block in exactly the shape of `FAST_BLOCK_TEMPLATE`: reads it and returns true, or returns
 * false having consumed nothing (the general reader then reads the same bytes, errors included).
 */
const readBlockFast = (
  r: MsgpackReader,
  blockHashes: Uint32Array,
  tokensHashes: Uint32Array,
  at: number
): boolean => {
  const p = r.pos
  // One bounds check for the whole block.
  if (p + FAST_BLOCK_BYTES > r.end) return false
  const b = r.buf
  // The words are spelled out rather than read with `i32`: sixteen calls exceed what V8 inlines here.
  if (
    ((((b[p]! << 24) | (b[p + 1]! << 16) | (b[p + 2]! << 8) | b[p + 3]!) ^ T0) |
      (((b[p + 4]! << 24) | (b[p + 5]! << 16) | (b[p + 6]! << 8) | b[p + 7]!) ^ T4) |
      (((b[p + 8]! << 24) | (b[p + 9]! << 16) | (b[p + 10]! << 8) | b[p + 11]!) ^ T8) |
      (b[p + 12]! ^ T12) |
      (((b[p + 21]! << 24) | (b[p + 22]! << 16) | (b[p + 23]! << 8) | b[p + 24]!) ^ T21) |
      (((b[p + 25]! << 24) | (b[p + 26]! << 16) | (b[p + 27]! << 8) | b[p + 28]!) ^ T25) |
      (((b[p + 29]! << 24) | (b[p + 30]! << 16) | (b[p + 31]! << 8) | b[p + 32]!) ^ T29) |
      (b[p + 33]! ^ T33) |
      (((b[p + 42]! << 24) | (b[p + 43]! << 16) | (b[p + 44]! << 8) | b[p + 45]!) ^ T42) |
      (((b[p + 46]! << 24) | (b[p + 47]! << 16) | (b[p + 48]! << 8) | b[p + 49]!) ^ T46) |
      (((b[p + 50]! << 24) | (b[p + 51]! << 16) | (b[p + 52]! << 8) | b[p + 53]!) ^ T50) |
      (((b[p + 53]! << 24) | (b[p + 54]! << 16) | (b[p + 55]! << 8) | b[p + 56]!) ^ T53)) !==
    0
  )
    return false
  blockHashes[at] = (b[p + 13]! << 24) | (b[p + 14]! << 16) | (b[p + 15]! << 8) | b[p + 16]!
  blockHashes[at + 1] = (b[p + 17]! << 24) | (b[p + 18]! << 16) | (b[p + 19]! << 8) | b[p + 20]!
  tokensHashes[at] = (b[p + 34]! << 24) | (b[p + 35]! << 16) | (b[p + 36]! << 8) | b[p + 37]!
  tokensHashes[at + 1] = (b[p + 38]! << 24) | (b[p + 39]! << 16) | (b[p + 40]! << 8) | b[p + 41]!
  r.pos = p + FAST_BLOCK_BYTES
  return true
}

/** One block of any accepted shape (a map of any key order, or positional). */
const readBlock = (
  r: MsgpackReader,
  blockHashes: Uint32Array,
  tokensHashes: Uint32Array,
  i: number
): void => {
  const entries = r.tryMap()
  if (entries >= 0) {
    let seen = 0
    for (let e = 0; e < entries; e++) {
      switch (r.key(BLOCK_KEYS)) {
        case 0:
          r.u64(blockHashes, 2 * i, "block_hash")
          seen |= 1
          break
        case 1:
          r.u64(tokensHashes, 2 * i, "tokens_hash")
          seen |= 2
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
    if (seen !== 3) fail(`blocks[${i}]: missing ${seen & 1 ? "tokens_hash" : "block_hash"}`)
    return
  }
  const len = r.tryArray()
  if (len < 2) fail(`blocks[${i}]: expected a block map or [block_hash, tokens_hash, …]`)
  r.u64(blockHashes, 2 * i, "block_hash")
  r.u64(tokensHashes, 2 * i, "tokens_hash")
  for (let e = 2; e < len; e++) r.skip()
}

/** Reads `blocks` into `blocksBlockHashes` and `blocksTokensHashes`. */
const readBlocks = (r: MsgpackReader): void => {
  const n = r.array("blocks")
  const blockHashes = new Uint32Array(2 * n)
  const tokensHashes = new Uint32Array(2 * n)
  const fast = fastPaths.enabled
  for (let i = 0; i < n; i++) {
    if (!(fast && readBlockFast(r, blockHashes, tokensHashes, 2 * i)))
      readBlock(r, blockHashes, tokensHashes, i)
  }
  blocksBlockHashes = blockHashes
  blocksTokensHashes = tokensHashes
}

const readStored = (r: MsgpackReader): KvCacheEventData => {
  let parentHash: Uint32Array | undefined
  let startPosition: number | undefined
  let sawBlocks = false
  const entries = r.tryMap()
  if (entries >= 0) {
    for (let e = 0; e < entries; e++) {
      switch (r.key(STORED_KEYS)) {
        case 0:
          parentHash = readOptionalHash(r, "parent_hash")
          break
        case 1:
          startPosition = readOptionalU32(r, "start_position")
          break
        case 2:
          readBlocks(r)
          sawBlocks = true
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
  } else {
    const len = r.array("stored")
    if (len === 1) return readStored(r) // older rmp-serde wrapped newtype variants: `[struct]`
    if (len < 2) fail("stored: expected [parent_hash, start_position?, blocks, …]")
    parentHash = readOptionalHash(r, "parent_hash")
    if (len >= 3) startPosition = readOptionalU32(r, "start_position")
    readBlocks(r)
    sawBlocks = true
    for (let e = 3; e < len; e++) r.skip()
  }
  if (!sawBlocks) return fail("stored: missing blocks")
  return {
    _tag: "Stored",
    blockHashes: blocksBlockHashes,
    tokensHashes: blocksTokensHashes,
    parentHash,
    startPosition
  }
}

const readRemoved = (r: MsgpackReader): KvCacheEventData => {
  let blockHashes: Uint32Array | undefined
  const entries = r.tryMap()
  if (entries >= 0) {
    for (let e = 0; e < entries; e++) {
      const k = r.key(REMOVED_KEYS)
      if (k === 0) blockHashes = readHashList(r, "block_hashes")
      else {
        if (k === -2) r.skip()
        r.skip()
      }
    }
  } else {
    const len = r.array("removed")
    if (len < 1) fail("removed: expected [block_hashes]")
    // `[[h, …]]` is the positional struct; `[{…}]` or `[[[h, …]]]` is a wrapped newtype variant.
    const mark = r.mark()
    const inner = r.tryMap() >= 0 ? 1 : r.tryArray() > 0 && r.tryArray() >= 0 ? 1 : 0
    r.reset(mark)
    if (len === 1 && inner === 1) return readRemoved(r)
    blockHashes = readHashList(r, "block_hashes")
    for (let e = 1; e < len; e++) r.skip()
  }
  if (blockHashes === undefined) return fail("removed: missing block_hashes")
  return { _tag: "Removed", blockHashes }
}

const readVariantContent = (r: MsgpackReader, variant: number): KvCacheEventData => {
  if (variant === VARIANT_STORED) return readStored(r)
  if (variant === VARIANT_REMOVED) return readRemoved(r)
  r.skip() // the unit variant's content (nil or `[]`)
  return CLEARED
}

const readVariantTag = (r: MsgpackReader): number => {
  if (r.isInt()) return r.uint("data variant index", VARIANT_CLEARED)
  const k = r.key(DATA_VARIANTS)
  if (k >= 0) return k
  return fail(k === -1 ? `data: unknown variant ${JSON.stringify(r.lastKey())}` : "data: bad variant tag")
}

/**
 * `KvCacheEventData`, externally tagged: `"cleared"` | `{stored: …}` | `{removed: …}`, and the
 * older rmp-serde forms `2` | `{0: …}` | `[index, content]` (variant indices, msgpack-rust #310/#319).
 */
const readData = (r: MsgpackReader): KvCacheEventData => {
  const entries = r.tryMap()
  if (entries >= 0) {
    if (entries !== 1) fail(`data: expected a single-entry variant map, got ${entries} entries`)
    return readVariantContent(r, readVariantTag(r))
  }
  const len = r.tryArray()
  if (len >= 0) {
    if (len !== 2) fail(`data: expected [variant, content], got ${len} elements`)
    return readVariantContent(r, readVariantTag(r))
  }
  const variant = readVariantTag(r)
  if (variant !== VARIANT_CLEARED) fail('data: only the unit variant "cleared" may be a bare tag')
  return CLEARED
}

/** The `event` part of one RouterEvent, read into module state (no closure or object per event). */
let kvEventId = -1
let kvDpRank = 0
let kvData: KvCacheEventData | undefined

const readKvEvent = (r: MsgpackReader): void => {
  kvEventId = -1
  kvDpRank = 0
  kvData = undefined
  const entries = r.tryMap()
  if (entries >= 0) {
    for (let e = 0; e < entries; e++) {
      switch (r.key(KV_EVENT_KEYS)) {
        case 0:
          kvEventId = r.uint("event_id")
          break
        case 1:
          kvData = readData(r)
          break
        case 2:
          kvDpRank = r.uint("dp_rank", 0xffff_ffff)
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
    return
  }
  const len = r.array("event")
  if (len < 2) fail("event: expected [event_id, data, dp_rank?]")
  kvEventId = r.uint("event_id")
  kvData = readData(r)
  if (len >= 3) kvDpRank = r.nil() ? 0 : r.uint("dp_rank", 0xffff_ffff)
  for (let e = 3; e < len; e++) r.skip()
}

const readRouterEvent = (r: MsgpackReader): RouterEvent => {
  let workerId: WorkerId | undefined
  let storageTier: StorageTier = "device"
  let sawEvent = false
  const entries = r.tryMap()
  if (entries >= 0) {
    for (let e = 0; e < entries; e++) {
      switch (r.key(ROUTER_EVENT_KEYS)) {
        case 0:
          workerId = readWorkerId(r)
          break
        case 1:
          storageTier = readTier(r)
          break
        case 2:
          readKvEvent(r)
          sawEvent = true
          break
        // A key that is not a string: skip it and its value. Each decoder's switch spells this out:
        // the switches stay flat on the decode path (see transport/msgpack.ts).
        case -2:
          r.skip()
          r.skip()
          break
        default:
          // residency_domain, state_source and later fields: tolerated (legacy relay semantics).
          r.skip()
      }
    }
  } else {
    const len = r.array("router event")
    if (len < 2) fail("router event: expected [worker_id, storage_tier, event, …]")
    workerId = readWorkerId(r)
    if (len >= 3) storageTier = readTier(r)
    readKvEvent(r)
    sawEvent = true
    for (let e = 3; e < len; e++) r.skip()
  }
  if (!sawEvent) return fail("router event: missing event")
  if (workerId === undefined) return fail("router event: missing worker_id")
  if (kvEventId < 0) return fail("event: missing event_id")
  if (kvData === undefined) return fail("event: missing data")
  return { workerId, dpRank: kvDpRank, eventId: kvEventId, storageTier, data: kvData }
}

// Fast-path key matchers, one per key and written out on purpose: decode hot path, the same form
// as envelope.ts's (see transport/msgpack.ts).
const EV_WORKER = Uint8Array.of(0x83, ...fixKey("worker_id"))
const EV_WORKER_0 = i32(EV_WORKER, 0)
const EV_WORKER_4 = i32(EV_WORKER, 4)
const EV_WORKER_7 = i32(EV_WORKER, 7)
const atEvWorker = (b: Uint8Array, p: number): boolean =>
  ((i32(b, p) ^ EV_WORKER_0) | (i32(b, p + 4) ^ EV_WORKER_4) | (i32(b, p + 7) ^ EV_WORKER_7)) === 0
const EV_TIER = Uint8Array.of(...fixKey("storage_tier"), ...fixKey("device"))
const EV_TIER_0 = i32(EV_TIER, 0)
const EV_TIER_4 = i32(EV_TIER, 4)
const EV_TIER_8 = i32(EV_TIER, 8)
const EV_TIER_12 = i32(EV_TIER, 12)
const EV_TIER_16 = i32(EV_TIER, 16)
const atEvTier = (b: Uint8Array, p: number): boolean =>
  ((i32(b, p) ^ EV_TIER_0) |
    (i32(b, p + 4) ^ EV_TIER_4) |
    (i32(b, p + 8) ^ EV_TIER_8) |
    (i32(b, p + 12) ^ EV_TIER_12) |
    (i32(b, p + 16) ^ EV_TIER_16)) ===
  0
const EV_EVENT = Uint8Array.of(...fixKey("event"), 0x83, ...fixKey("event_id"))
const EV_EVENT_0 = i32(EV_EVENT, 0)
const EV_EVENT_4 = i32(EV_EVENT, 4)
const EV_EVENT_8 = i32(EV_EVENT, 8)
const EV_EVENT_12 = i32(EV_EVENT, 12)
const atEvEvent = (b: Uint8Array, p: number): boolean =>
  ((i32(b, p) ^ EV_EVENT_0) |
    (i32(b, p + 4) ^ EV_EVENT_4) |
    (i32(b, p + 8) ^ EV_EVENT_8) |
    (i32(b, p + 12) ^ EV_EVENT_12)) ===
  0
const EV_STORED = Uint8Array.of(...fixKey("data"), 0x81, ...fixKey("stored"), 0x83, ...fixKey("parent_hash"))
const EV_STORED_0 = i32(EV_STORED, 0)
const EV_STORED_4 = i32(EV_STORED, 4)
const EV_STORED_8 = i32(EV_STORED, 8)
const EV_STORED_12 = i32(EV_STORED, 12)
const EV_STORED_16 = i32(EV_STORED, 16)
const EV_STORED_20 = i32(EV_STORED, 20)
const EV_STORED_22 = i32(EV_STORED, 22)
const atEvStored = (b: Uint8Array, p: number): boolean =>
  ((i32(b, p) ^ EV_STORED_0) |
    (i32(b, p + 4) ^ EV_STORED_4) |
    (i32(b, p + 8) ^ EV_STORED_8) |
    (i32(b, p + 12) ^ EV_STORED_12) |
    (i32(b, p + 16) ^ EV_STORED_16) |
    (i32(b, p + 20) ^ EV_STORED_20) |
    (i32(b, p + 22) ^ EV_STORED_22)) ===
  0
const EV_START = Uint8Array.of(...fixKey("start_position"))
const EV_START_0 = i32(EV_START, 0)
const EV_START_4 = i32(EV_START, 4)
const EV_START_8 = i32(EV_START, 8)
const EV_START_11 = i32(EV_START, 11)
const atEvStart = (b: Uint8Array, p: number): boolean =>
  ((i32(b, p) ^ EV_START_0) |
    (i32(b, p + 4) ^ EV_START_4) |
    (i32(b, p + 8) ^ EV_START_8) |
    (i32(b, p + 11) ^ EV_START_11)) ===
  0
const EV_BLOCKS = Uint8Array.of(...fixKey("blocks"))
const EV_BLOCKS_0 = i32(EV_BLOCKS, 0)
const EV_BLOCKS_3 = i32(EV_BLOCKS, 3)
const atEvBlocks = (b: Uint8Array, p: number): boolean =>
  ((i32(b, p) ^ EV_BLOCKS_0) | (i32(b, p + 3) ^ EV_BLOCKS_3)) === 0
const EV_DP_RANK = Uint8Array.of(...fixKey("dp_rank"))
const EV_DP_RANK_0 = i32(EV_DP_RANK, 0)
const EV_DP_RANK_4 = i32(EV_DP_RANK, 4)
const atEvDpRank = (b: Uint8Array, p: number): boolean =>
  ((i32(b, p) ^ EV_DP_RANK_0) | (i32(b, p + 4) ^ EV_DP_RANK_4)) === 0
/**
 * A device-tier Stored RouterEvent exactly as Dynamo writes it: `{worker_id, storage_tier:
 * "device", event: {event_id, data: {stored: {parent_hash, start_position, blocks}}, dp_rank}}`
 * with every block in the shape of `FAST_BLOCK_TEMPLATE`. Undefined (nothing consumed) otherwise.
 */
const readStoredEventFast = (r: MsgpackReader): RouterEvent | undefined => {
  const b = r.buf
  const end = r.end
  const start = r.pos
  // Each segment's bounds include the first byte after it (the value that `fastUnsigned` reads).
  if (start + EV_WORKER.length + 1 > end || !atEvWorker(b, start)) return undefined
  let p = fastUnsigned(b, start + EV_WORKER.length, end)
  if (p < 0 || p + EV_TIER.length + EV_EVENT.length + 1 > end || !atEvTier(b, p)) return undefined
  const workerHi = fastHi
  const workerLo = fastLo
  p += EV_TIER.length
  if (!atEvEvent(b, p)) return undefined
  p = fastUnsigned(b, p + EV_EVENT.length, end)
  // event_id ≤ 2^53 (`MAX_SAFE_ID`); a larger one is the general reader's error.
  if (
    p < 0 ||
    fastHi > 0x20_0000 ||
    (fastHi === 0x20_0000 && fastLo !== 0) ||
    p + EV_STORED.length + 1 > end ||
    !atEvStored(b, p)
  )
    return undefined
  const eventId = fastHi * TWO_32 + fastLo
  p += EV_STORED.length
  let parentHash: Uint32Array | undefined
  if (b[p] === 0xc0) p++
  else {
    p = fastUnsigned(b, p, end)
    if (p < 0) return undefined
    parentHash = new Uint32Array(2)
    parentHash[0] = fastHi
    parentHash[1] = fastLo
  }
  if (p + EV_START.length + 1 > end || !atEvStart(b, p)) return undefined
  p += EV_START.length
  let startPosition: number | undefined
  if (b[p] === 0xc0) p++
  else {
    p = fastUnsigned(b, p, end)
    if (p < 0 || fastHi !== 0) return undefined
    startPosition = fastLo
  }
  if (p + EV_BLOCKS.length + 3 > end || !atEvBlocks(b, p)) return undefined
  p += EV_BLOCKS.length
  const header = b[p]!
  let n: number
  if ((header & 0xf0) === 0x90) {
    n = header & 0x0f
    p += 1
  } else if (header === 0xdc) {
    n = be16(b, p + 1)
    p += 3
  } else return undefined
  // The blocks, the dp_rank key and a fixint value, before anything is allocated.
  if (p + n * FAST_BLOCK_BYTES + EV_DP_RANK.length + 1 > end) return undefined
  const blockHashes = new Uint32Array(2 * n)
  const tokensHashes = new Uint32Array(2 * n)
  r.pos = p
  for (let i = 0; i < n; i++) {
    if (!readBlockFast(r, blockHashes, tokensHashes, 2 * i)) {
      r.pos = start
      return undefined
    }
  }
  p = r.pos
  if (atEvDpRank(b, p)) p = fastUnsigned(b, p + EV_DP_RANK.length, end)
  else p = -1
  if (p < 0 || fastHi !== 0) {
    r.pos = start
    return undefined
  }
  r.pos = p
  fastPaths.hits.events++
  return {
    workerId: workerText(workerHi, workerLo),
    dpRank: fastLo,
    eventId,
    storageTier: "device",
    data: { _tag: "Stored", blockHashes, tokensHashes, parentHash, startPosition }
  }
}

/** Decodes `Vec<RouterEvent>`; a single RouterEvent map (as older sinks sent) is accepted too. Throws `MsgpackDecodeError`. */
export const readRouterEvents = (r: MsgpackReader): Array<RouterEvent> => {
  const b = r.peek("payload")
  if ((b >= 0x80 && b <= 0x8f) || b === 0xde || b === 0xdf) return [readRouterEvent(r)]
  const n = r.array("payload")
  const events = new Array<RouterEvent>(n)
  if (fastPaths.enabled) {
    for (let i = 0; i < n; i++) events[i] = readStoredEventFast(r) ?? readRouterEvent(r)
  } else for (let i = 0; i < n; i++) events[i] = readRouterEvent(r)
  return events
}

export type DecodeResult<A> =
  | { readonly ok: true; readonly value: A }
  | { readonly ok: false; readonly message: string }

/** Runs a throwing decoder; any failure (including a bug surfacing as a TypeError) becomes a message. */
export const guardDecode = <A>(run: () => A): DecodeResult<A> => {
  try {
    return { ok: true, value: run() }
  } catch (error) {
    return { ok: false, message: error instanceof Error ? error.message : String(error) }
  }
}

/** Decodes a RouterEvent payload from `bytes[start, end)`; never throws. */
export const decodeRouterEvents = (
  bytes: Uint8Array,
  start = 0,
  end = bytes.length
): DecodeResult<Array<RouterEvent>> =>
  guardDecode(() => readRouterEvents(new MsgpackReader(bytes, start, end)))

export const KEY = {
  worker_id: fixKey("worker_id"),
  storage_tier: fixKey("storage_tier"),
  event: fixKey("event"),
  event_id: fixKey("event_id"),
  data: fixKey("data"),
  dp_rank: fixKey("dp_rank"),
  stored: fixKey("stored"),
  removed: fixKey("removed"),
  cleared: fixKey("cleared"),
  parent_hash: fixKey("parent_hash"),
  start_position: fixKey("start_position"),
  blocks: fixKey("blocks"),
  block_hash: fixKey("block_hash"),
  tokens_hash: fixKey("tokens_hash"),
  mm_extra_info: fixKey("mm_extra_info"),
  block_hashes: fixKey("block_hashes"),
  topic: fixKey("topic"),
  publisher_id: fixKey("publisher_id"),
  sequence: fixKey("sequence"),
  published_at: fixKey("published_at"),
  payload: fixKey("payload")
} as const

/** Halves of a canonical decimal u64 (worker ids); BigInt only above 15 digits. */
export const u64HalvesOfDecimal = (text: string): [number, number] => {
  if (text.length <= 15) {
    const n = Number(text)
    return [Math.floor(n / TWO_32), n % TWO_32]
  }
  const v = BigInt.asUintN(64, BigInt(text))
  return [Number(v >> 32n), Number(v & 0xffff_ffffn)]
}

/** Halves of a u64 given as bigint (publisher ids). */
export const u64HalvesOfBigInt = (value: bigint): [number, number] => {
  const v = BigInt.asUintN(64, value)
  return [Number(v >> 32n), Number(v & 0xffff_ffffn)]
}

export type VariantForm = "named" | "index-map" | "index-array"

export interface RouterEventEncodeOptions {
  /**
   * `named` (rmp-serde ≥ 1: `"cleared"`, `{stored: …}`), or the older variant-index forms
   * `index-map` (`{0: …}`, `{2: nil}`) and `index-array` (`[0, [content]]`, `[2, []]`).
   */
  readonly variants?: VariantForm
}

/** Writes one RouterEvent as rmp-serde `to_vec_named` does. */
export const writeRouterEvent = (
  w: MsgpackWriter,
  event: RouterEvent,
  options?: RouterEventEncodeOptions
): void => {
  const [whi, wlo] = u64HalvesOfDecimal(event.workerId)
  const form = options?.variants ?? "named"
  w.map(3).raw(KEY.worker_id).u64(whi, wlo).raw(KEY.storage_tier)
  if (form === "named") w.str(event.storageTier)
  else w.int(TIERS.indexOf(event.storageTier))
  w.raw(KEY.event).map(3).raw(KEY.event_id).int(event.eventId).raw(KEY.data)
  const data = event.data
  if (data._tag === "Cleared") {
    if (form === "named") w.raw(KEY.cleared)
    else if (form === "index-map") w.map(1).int(VARIANT_CLEARED).nil()
    else w.array(2).int(VARIANT_CLEARED).array(0)
  } else {
    const variant = data._tag === "Stored" ? VARIANT_STORED : VARIANT_REMOVED
    if (form === "named") w.map(1).raw(data._tag === "Stored" ? KEY.stored : KEY.removed)
    else if (form === "index-map") w.map(1).int(variant)
    else w.array(2).int(variant).array(1)
    const hashes = data.blockHashes
    const n = hashes.length >>> 1
    if (data._tag === "Stored") {
      w.map(3).raw(KEY.parent_hash)
      if (data.parentHash === undefined) w.nil()
      else w.u64(data.parentHash[0]!, data.parentHash[1]!)
      w.raw(KEY.start_position)
      if (data.startPosition === undefined) w.nil()
      else w.int(data.startPosition)
      const tokens = data.tokensHashes ?? hashes
      w.raw(KEY.blocks).array(n)
      for (let i = 0; i < n; i++) {
        w.map(3)
          .raw(KEY.block_hash)
          .u64(hashes[2 * i]!, hashes[2 * i + 1]!)
          .raw(KEY.tokens_hash)
          .u64(tokens[2 * i]!, tokens[2 * i + 1]!)
          .raw(KEY.mm_extra_info)
          .nil()
      }
    } else {
      w.map(1).raw(KEY.block_hashes).array(n)
      for (let i = 0; i < n; i++) w.u64(hashes[2 * i]!, hashes[2 * i + 1]!)
    }
  }
  w.raw(KEY.dp_rank).int(event.dpRank)
}

/** Encodes `Vec<RouterEvent>` as rmp-serde `to_vec_named` does. */
export const encodeRouterEvents = (
  events: ReadonlyArray<RouterEvent>,
  options?: RouterEventEncodeOptions
): Uint8Array => {
  const w = new MsgpackWriter(64 + events.length * 192)
  w.array(events.length)
  for (const event of events) writeRouterEvent(w, event, options)
  return w.finish()
}
