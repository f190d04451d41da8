/**
 * A stored block's cache namespace (PROTOCOL §5.1 ◆3: `cacheSalt`), read from an engine's event
 * the way Dynamo's ZMQ normalizer reads it, so that the relay folds it into the block's local
 * hash exactly as a query with the same `cacheSalt` does (`blockHashSeed` in `tokens.ts`).
 *
 * Where the namespace comes from (Dynamo's `lib/kv-router/src/zmq_wire/deserialize.rs` and
 * `extra_keys.rs`):
 * - a `BlockStored` encoded as a map with a `cache_salt` key (SGLang's field) takes it from there;
 *   a present `cache_salt`, even an empty one, is used as is (and an empty one means none);
 * - otherwise (and always for the array encoding vLLM uses) from vLLM's `extra_keys`: vLLM puts a
 *   request's `cache_salt` in the extra keys of its first block only, and Dynamo's vLLM handler
 *   tags the salt it passes as `dynamo-cache-salt:<namespace>` so it cannot be mistaken for a LoRA
 *   name or a multimodal hash. The first block's string keys are searched for that tag, after
 *   skipping the first key equal to the LoRA name (so a namespace equal to the LoRA name still
 *   works). Untagged strings, byte strings and `[hash, offset]` pairs are never a namespace.
 *
 * Because only a request's first block carries the salt, a later `BlockStored` of the same
 * request (whose parent is the earlier block) carries none: Dynamo's normalizer
 * (`ZmqEventNormalizer::propagate_cache_namespace` in `zmq_wire/mod.rs`) remembers, per (worker,
 * dp rank) and external block hash, the namespace each salted block was stored under, and a
 * batch without one inherits its parent's. `CacheNamespaces` does the same.
 */

import { LineageTable } from "./lineage.js"

/** The tag Dynamo's vLLM handler puts before the cache salt it passes to vLLM. */
export const DYNAMO_CACHE_SALT_PREFIX = "dynamo-cache-salt:"

/** The fields of a stored event that can name its namespace, as the decoder read them. */
export interface StoredNamespaceFields {
  /**
   * The map encoding's `cache_salt` value: a string (possibly empty), `null`, or `undefined` when
   * the key is absent or the event is array-encoded (the array encoding has no such field).
   */
  readonly cacheSalt?: string | null | undefined
  /**
   * vLLM's `extra_keys`: one entry per block, each `null` or a list of keys (strings, byte
   * strings, numbers, or `[identifier, offset]` pairs).
   */
  readonly extraKeys?: ReadonlyArray<ReadonlyArray<unknown> | null | undefined> | null | undefined
  /** The event's `lora_name`. */
  readonly loraName?: string | null | undefined
}

/**
 * The namespace vLLM's `extra_keys` name (Dynamo's `extra_keys_to_cache_namespace`): the first
 * block's first string key tagged `dynamo-cache-salt:` with a non-empty rest, once the first key
 * equal to `loraName` (when there is one) is passed over; `undefined` when there is none.
 */
export const cacheNamespaceOfExtraKeys = (
  extraKeys: StoredNamespaceFields["extraKeys"],
  loraName?: string | null
): string | undefined => {
  const first = extraKeys?.[0]
  if (first === undefined || first === null) return undefined
  let unmatchedLora = loraName === undefined || loraName === null || loraName === "" ? undefined : loraName
  for (const key of first) {
    if (typeof key !== "string") continue
    if (unmatchedLora !== undefined && key === unmatchedLora) {
      unmatchedLora = undefined
      continue
    }
    if (key.startsWith(DYNAMO_CACHE_SALT_PREFIX) && key.length > DYNAMO_CACHE_SALT_PREFIX.length) {
      return key.slice(DYNAMO_CACHE_SALT_PREFIX.length)
    }
  }
  return undefined
}

/**
 * The namespace a stored event names itself (before inheritance from its parent): its
 * `cache_salt` when the key is present and not null (an empty one is none), else what its
 * `extra_keys` name. `undefined` means none.
 */
export const storedEventCacheNamespace = (fields: StoredNamespaceFields): string | undefined => {
  const salt = fields.cacheSalt
  if (salt !== undefined && salt !== null) return salt === "" ? undefined : salt
  return cacheNamespaceOfExtraKeys(fields.extraKeys, fields.loraName)
}

/** `CacheNamespaces.stored`'s answer for a batch whose parent's namespace is ambiguous. */
export const AMBIGUOUS_CACHE_NAMESPACE: unique symbol = Symbol("ambiguous cache namespace")

const AMBIGUOUS_ID = 0xffff_ffff

/**
 * The namespace of each salted block a source stored, by (member, external hash), for batches
 * that inherit their parent's (see the module comment). Unsalted blocks are not remembered, as in
 * Dynamo: a batch whose parent is unknown here is unsalted (a relay that joined mid-chain cannot
 * tell an unseen salted parent from an unsalted one). An external hash stored under two
 * namespaces, or under one and then none, becomes ambiguous, and a child of it is rejected
 * (`AMBIGUOUS_CACHE_NAMESPACE`; Dynamo filters it as `AmbiguousCacheNamespace`). A removal
 * forgets a block unless it is ambiguous; a clear forgets the member's blocks.
 *
 * Typed-array tables keyed by external hash per member; namespaces are interned and counted, so
 * memory follows the salted blocks held. A source that never salts costs one size check per
 * event.
 */
export class CacheNamespaces {
  private readonly table = new LineageTable()
  private readonly ids = new Map<string, number>()
  private readonly names: Array<string | undefined> = []
  private readonly refs: Array<number> = []
  private readonly free: Array<number> = []
  private readonly value = new Uint32Array(2)
  private readonly found = new Uint32Array(2)

  /** Blocks remembered (salted or ambiguous), over every member. */
  get size(): number {
    return this.table.size
  }

  /** Distinct namespaces remembered (interned while a block holds them). */
  get namespaceCount(): number {
    return this.ids.size
  }

  private intern(name: string): number {
    let id = this.ids.get(name)
    if (id === undefined) {
      id = this.free.pop() ?? this.names.length
      this.ids.set(name, id)
      this.names[id] = name
      this.refs[id] = 0
    }
    return id
  }

  private release(id: number): void {
    if (id === AMBIGUOUS_ID) return
    const refs = this.refs[id]! - 1
    this.refs[id] = refs
    if (refs > 0) return
    this.ids.delete(this.names[id]!)
    this.names[id] = undefined
    this.free.push(id)
  }

  /**
   * A stored batch of member `memberKey`: its external hashes (`[hi, lo]` pairs), its parent's
   * (a pair, or `undefined`), and the namespace it names itself (`storedEventCacheNamespace`).
   * Returns the namespace its blocks are hashed under (`undefined` for none), or
   * `AMBIGUOUS_CACHE_NAMESPACE` when the event must be skipped, and remembers the blocks'.
   */
  stored(
    memberKey: string,
    blockHashes: Uint32Array,
    parentHash: Uint32Array | undefined,
    namespace: string | undefined
  ): string | undefined | typeof AMBIGUOUS_CACHE_NAMESPACE {
    const table = this.table
    const own = namespace === "" ? undefined : namespace
    if (own === undefined && table.size === 0) return undefined
    const m = table.memberIndex(memberKey)
    let effective = own
    if (effective === undefined && parentHash !== undefined && table.get(m, parentHash, 0, this.found, 0)) {
      const id = this.found[0]!
      if (id === AMBIGUOUS_ID) return AMBIGUOUS_CACHE_NAMESPACE
      effective = this.names[id]!
    }
    const n = blockHashes.length >>> 1
    if (effective === undefined) {
      // An unsalted store of a block remembered under a namespace makes it ambiguous.
      if (m < 0) return undefined
      for (let i = 0; i < n; i++) {
        if (!table.get(m, blockHashes, 2 * i, this.found, 0)) continue
        const id = this.found[0]!
        if (id === AMBIGUOUS_ID) continue
        this.release(id)
        this.value[0] = AMBIGUOUS_ID
        this.value[1] = 0
        table.insert(m, blockHashes, 2 * i, this.value, 0)
      }
      return undefined
    }
    const id = this.intern(effective)
    const member = m >= 0 ? m : table.ensureMember(memberKey)
    for (let i = 0; i < n; i++) {
      if (table.get(member, blockHashes, 2 * i, this.found, 0)) {
        const was = this.found[0]!
        if (was === id || was === AMBIGUOUS_ID) continue
        this.release(was)
        this.value[0] = AMBIGUOUS_ID
      } else {
        this.refs[id]!++
        this.value[0] = id
      }
      this.value[1] = 0
      table.insert(member, blockHashes, 2 * i, this.value, 0)
    }
    // Interned for this batch, but every block was remembered already (ambiguous or the same).
    if (this.refs[id] === 0) {
      this.refs[id] = 1
      this.release(id)
    }
    return effective
  }

  /** A removed batch of member `memberKey`: its blocks are forgotten, except ambiguous ones. */
  removed(memberKey: string, blockHashes: Uint32Array): void {
    const table = this.table
    if (table.size === 0) return
    const m = table.memberIndex(memberKey)
    if (m < 0) return
    const n = blockHashes.length >>> 1
    for (let i = 0; i < n; i++) {
      if (!table.get(m, blockHashes, 2 * i, this.found, 0)) continue
      const id = this.found[0]!
      if (id === AMBIGUOUS_ID) continue
      table.delete(memberKey, m, blockHashes, 2 * i, this.found, 0)
      this.release(id)
    }
  }

  /** AllBlocksCleared (or a restart) of member `memberKey`: every block of it is forgotten. */
  cleared(memberKey: string): void {
    const table = this.table
    const m = table.memberIndex(memberKey)
    if (m < 0) return
    const entries = table.entries(m)
    for (let k = 0; k < entries.length; k += 4) this.release(entries[k + 2]!)
    table.clearMember(memberKey)
  }
}
