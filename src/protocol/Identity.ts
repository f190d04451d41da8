/**
 * Identities (PROTOCOL.md §1–§2, relay-service.md §1.2): BLAKE3 derivation of the identity values of `src/ckf/identity.ts` (relay-service.md §1.2).
 *
 * The material layouts are byte-exact copies of Dynamo's: a different frame, tag or field order
 * would silently split one indexer domain across relays of different implementations.
 */

import { blake3 } from "@noble/hashes/blake3.js"
import { Data, Either, ParseResult, Schema } from "effect"
import {
  CacheSemanticsId,
  DcCkfFormatIdentity,
  DcId,
  type IdentitySource,
  IndexerDomainId,
  PoolId,
  ProducerIdentity,
  RoutingScopeId
} from "../ckf/identity.js"
import { DcIdHex, Digest, failType, hexToBytes, U64 } from "./Json.js"
import {
  type EndpointId,
  type InvalidQuerySemantics,
  type KvQueryHashFormat,
  KvQuerySemantics,
  type ZeroBlockSize
} from "./Model.js"
import { compareUtf8, isWellFormedUnicode, type NameProblem, nameProblem, nameProblemText } from "./Text.js"

const DC_TAG = "dynamo/indexer-dc/v1"
const CACHE_DEFAULT_TAG = "dynamo/indexer-cache-semantics/default/v1"
const CACHE_EXPLICIT_TAG = "dynamo/indexer-cache-semantics/explicit/v1"
const ROUTING_DEFAULT_TAG = "dynamo/indexer-routing-scope/default/v1"
const ROUTING_EXPLICIT_TAG = "dynamo/indexer-routing-scope/explicit/v1"

/** At most this many entries in an explicit identity map. */
export const EXPLICIT_MAX_ENTRIES = 32
/** At most this many UTF-8 bytes in a key of an explicit identity map. */
export const EXPLICIT_MAX_KEY_BYTES = 128
/** At most this many UTF-8 bytes in a value of an explicit identity map. */
export const EXPLICIT_MAX_VALUE_BYTES = 1024

// ---------------------------------------------------------------------------------------------
// Errors

/** A DC name that breaks the name rules; `reason` says which. */
export class InvalidDcName extends Data.TaggedError("InvalidDcName")<{
  readonly value: string
  readonly reason: NameProblem
}> {
  override get message(): string {
    return `dc id ${JSON.stringify(this.value)} ${nameProblemText(this.reason)}`
  }
}

/** Why an explicit identity map was refused. */
export type ExplicitIdentityProblem =
  | "NoEntries"
  | "TooManyEntries"
  | "EmptyKey"
  | "KeyTooLong"
  | "EmptyValue"
  | "ValueTooLong"
  | "NotUnicode"

const materialMessages: Record<
  ExplicitIdentityProblem,
  (field: string, key: string, count: number, hasKey: boolean) => string
> = {
  NoEntries: (field) => `${field} must have 1..=${EXPLICIT_MAX_ENTRIES} entries, got 0`,
  TooManyEntries: (field, _, count) => `${field} must have 1..=${EXPLICIT_MAX_ENTRIES} entries, got ${count}`,
  EmptyKey: (field) => `${field} has an empty key`,
  KeyTooLong: (field, key, count) =>
    `${field} key ${key} is ${count} bytes of UTF-8, more than ${EXPLICIT_MAX_KEY_BYTES}`,
  EmptyValue: (field, key) => `${field}[${key}] must not be empty`,
  ValueTooLong: (field, key, count) =>
    `${field}[${key}] is ${count} bytes of UTF-8, more than ${EXPLICIT_MAX_VALUE_BYTES}`,
  NotUnicode: (field, key, _, hasKey) =>
    !hasKey
      ? `${field} contains a string that is not well-formed Unicode`
      : `${field}[${key}] is not well-formed Unicode`
}

/** An explicit identity map (`indexerIdentity.semantics` / `.routingScope`) or default outside the rules. */
export class InvalidIdentityMaterial extends Data.TaggedError("InvalidIdentityMaterial")<{
  /** `semantics`, `routingScope` or `defaults`. */
  readonly field: string
  readonly reason: ExplicitIdentityProblem
  readonly key?: string
  readonly count?: number
}> {
  override get message(): string {
    return materialMessages[this.reason](
      this.field,
      JSON.stringify(this.key ?? ""),
      this.count ?? 0,
      this.key !== undefined
    )
  }
}

/** Why an indexer domain could not be resolved. */
export type IndexerDomainError = ZeroBlockSize | InvalidQuerySemantics | InvalidIdentityMaterial

// ---------------------------------------------------------------------------------------------
// Material

const encoder = new TextEncoder()

/** Append-only little-endian byte writer for identity material. */
class Material {
  private buffer = new Uint8Array(256)
  private length = 0

  private reserve(extra: number): void {
    if (this.length + extra <= this.buffer.length) return
    const grown = new Uint8Array(Math.max(this.buffer.length * 2, this.length + extra))
    grown.set(this.buffer.subarray(0, this.length))
    this.buffer = grown
  }
  bytes(bytes: Uint8Array): this {
    this.reserve(bytes.length)
    this.buffer.set(bytes, this.length)
    this.length += bytes.length
    return this
  }
  raw(text: string): this {
    return this.bytes(encoder.encode(text))
  }
  u16(value: number): this {
    this.reserve(2)
    this.buffer[this.length++] = value & 0xff
    this.buffer[this.length++] = (value >>> 8) & 0xff
    return this
  }
  u32(value: number): this {
    this.reserve(4)
    for (let shift = 0; shift < 32; shift += 8) this.buffer[this.length++] = (value >>> shift) & 0xff
    return this
  }
  /** `u32LE(len) ‖ bytes`. */
  framed(text: string): this {
    const bytes = encoder.encode(text)
    return this.u32(bytes.length).bytes(bytes)
  }
  digest(): Uint8Array {
    return blake3(this.buffer.subarray(0, this.length))
  }
}

/** An explicit identity map as given on a card (`Record`) or built in code (`Map`). */
export type ExplicitIdentityMap = ReadonlyMap<string, string> | Readonly<Record<string, string>>

/**
 * Checks an explicit map against the reference's limits and returns its entries in ascending
 * byte-wise key order (the `BTreeMap` order the material is hashed in).
 */
export const validateExplicitMap = (
  field: string,
  map: ExplicitIdentityMap
): Either.Either<ReadonlyArray<readonly [string, string]>, InvalidIdentityMaterial> => {
  const entries: Array<readonly [string, string]> =
    map instanceof Map ? Array.from(map.entries()) : Object.entries(map as Readonly<Record<string, string>>)
  if (entries.length === 0) return Either.left(new InvalidIdentityMaterial({ field, reason: "NoEntries" }))
  if (entries.length > EXPLICIT_MAX_ENTRIES) {
    return Either.left(
      new InvalidIdentityMaterial({ field, reason: "TooManyEntries", count: entries.length })
    )
  }
  for (const [key, value] of entries) {
    if (key.length === 0) return Either.left(new InvalidIdentityMaterial({ field, reason: "EmptyKey" }))
    if (!isWellFormedUnicode(key) || !isWellFormedUnicode(value)) {
      return Either.left(new InvalidIdentityMaterial({ field, reason: "NotUnicode", key }))
    }
    const keyBytes = encoder.encode(key).length
    if (keyBytes > EXPLICIT_MAX_KEY_BYTES) {
      return Either.left(new InvalidIdentityMaterial({ field, reason: "KeyTooLong", key, count: keyBytes }))
    }
    if (value.length === 0)
      return Either.left(new InvalidIdentityMaterial({ field, reason: "EmptyValue", key }))
    const valueBytes = encoder.encode(value).length
    if (valueBytes > EXPLICIT_MAX_VALUE_BYTES) {
      return Either.left(
        new InvalidIdentityMaterial({ field, reason: "ValueTooLong", key, count: valueBytes })
      )
    }
  }
  return Either.right(entries.sort((a, b) => compareUtf8(a[0], b[0])))
}

/** `framed(tag) ‖ selected`; the tag and the source follow from whether an explicit map exists. */
const selectedMaterial = (
  field: string,
  defaults: ReadonlyArray<string>,
  explicit: ExplicitIdentityMap | null | undefined,
  tags: { readonly default: string; readonly explicit: string }
): Either.Either<
  { readonly material: Material; readonly source: IdentitySource },
  InvalidIdentityMaterial
> => {
  if (explicit === null || explicit === undefined) {
    if (!defaults.every(isWellFormedUnicode)) {
      return Either.left(new InvalidIdentityMaterial({ field: "defaults", reason: "NotUnicode" }))
    }
    const material = new Material().framed(tags.default).u32(defaults.length)
    for (const value of defaults) material.framed(value)
    return Either.right({ material, source: "default_derived" })
  }
  return Either.map(validateExplicitMap(field, explicit), (entries) => {
    const material = new Material().framed(tags.explicit).u32(entries.length)
    for (const [key, value] of entries) material.framed(key).framed(value)
    return { material, source: "explicit" as const }
  })
}

// ---------------------------------------------------------------------------------------------
// Derivations

/** The name, if it is a valid DC name. */
export const validateDcName = (name: string): Either.Either<string, InvalidDcName> => {
  const problem = nameProblem(name)
  return problem === undefined
    ? Either.right(name)
    : Either.left(new InvalidDcName({ value: name, reason: problem }))
}

/** `stable_dc_id` (§1.2.1): the first 8 bytes of BLAKE3(tag ‖ framed(name)), little-endian. */
export const deriveStableDcId = (name: string): Either.Either<DcId, InvalidDcName> =>
  Either.map(validateDcName(name), (valid) => {
    const digest = new Material().raw(DC_TAG).framed(valid).digest()
    const view = new DataView(digest.buffer, digest.byteOffset, 8)
    return new DcId(view.getBigUint64(0, true))
  })

/** `stable_dc_id`; throws `InvalidDcName` (use `deriveStableDcId` for the error as a value). */
export const stableDcId = (name: string): DcId => Either.getOrThrowWith(deriveStableDcId(name), (e) => e)

/** What a cache-semantics identity is derived from: default material or an explicit map. */
export interface CacheSemanticsInput {
  /** Default material, used only without an explicit map: `[sourcePath]` for cards. */
  readonly defaults: ReadonlyArray<string>
  readonly explicit?: ExplicitIdentityMap | null
  readonly kvBlockSize: number
  readonly hashFormat: KvQueryHashFormat
}

/** What a routing-scope identity is derived from: default material or an explicit map. */
export interface RoutingScopeInput {
  /** Default material, used only without an explicit map: `[namespace, component, endpoint]`. */
  readonly defaults: ReadonlyArray<string>
  readonly explicit?: ExplicitIdentityMap | null
}

/**
 * Cache semantics (§1.2.2): `framed(tag) ‖ selected ‖ u32LE(kvBlockSize) ‖ u16LE(format version)`.
 * Block size and format are appended even with explicit material, which cannot replace them.
 */
export const deriveCacheSemanticsId = (
  input: CacheSemanticsInput
): Either.Either<CacheSemanticsId, IndexerDomainError> =>
  Either.flatMap(KvQuerySemantics.make(input.kvBlockSize, input.hashFormat), (semantics) =>
    Either.map(
      selectedMaterial("semantics", input.defaults, input.explicit, {
        default: CACHE_DEFAULT_TAG,
        explicit: CACHE_EXPLICIT_TAG
      }),
      ({ material, source }) =>
        new CacheSemanticsId(
          material.u32(semantics.kvBlockSize).u16(semantics.identityVersion).digest().slice(0, 16),
          source
        )
    )
  )

/** Throws the `IndexerDomainError`; `deriveCacheSemanticsId` returns it. */
export const cacheSemanticsId = (input: CacheSemanticsInput): CacheSemanticsId =>
  Either.getOrThrowWith(deriveCacheSemanticsId(input), (e) => e)

/** Routing scope (§1.2.2): `framed(tag) ‖ selected`, no suffix. */
export const deriveRoutingScopeId = (
  input: RoutingScopeInput
): Either.Either<RoutingScopeId, InvalidIdentityMaterial> =>
  Either.map(
    selectedMaterial("routingScope", input.defaults, input.explicit, {
      default: ROUTING_DEFAULT_TAG,
      explicit: ROUTING_EXPLICIT_TAG
    }),
    ({ material, source }) => new RoutingScopeId(material.digest().slice(0, 16), source)
  )

/** Throws `InvalidIdentityMaterial`; `deriveRoutingScopeId` returns it. */
export const routingScopeId = (input: RoutingScopeInput): RoutingScopeId =>
  Either.getOrThrowWith(deriveRoutingScopeId(input), (e) => e)

/** `indexer_identity` on a card. */
export interface IndexerIdentitySpec {
  readonly semantics?: ExplicitIdentityMap | null | undefined
  readonly routingScope?: ExplicitIdentityMap | null | undefined
}

/** The card fields identity resolution reads; a decoded `ModelCardInstanceJson` card satisfies it. */
export interface IndexerCard {
  readonly sourcePath: string
  readonly kvCacheBlockSize: number
  readonly indexerIdentity?: IndexerIdentitySpec | null | undefined
  readonly runtimeConfig: { readonly enableEagle: boolean }
}

/** An indexer domain with the query semantics its pools share. */
export interface ResolvedIndexerDomain {
  readonly id: IndexerDomainId
  readonly querySemantics: KvQuerySemantics
}

/** True when two resolved domains are the same domain with the same semantics. */
export const resolvedIndexerDomainEquals = (a: ResolvedIndexerDomain, b: ResolvedIndexerDomain): boolean =>
  a.id.equals(b.id) &&
  a.querySemantics.kvBlockSize === b.querySemantics.kvBlockSize &&
  a.querySemantics.hashFormat === b.querySemantics.hashFormat

/**
 * `resolve_indexer_domain` (§1.2.3): cache defaults `[sourcePath]`, routing defaults the serving
 * endpoint's three parts; a zero block size is `ZeroBlockSize` (a pool-materialization conflict).
 */
export const resolveIndexerDomain = (
  card: IndexerCard,
  servingEndpoint: EndpointId
): Either.Either<ResolvedIndexerDomain, IndexerDomainError> => {
  const hashFormat: KvQueryHashFormat = card.runtimeConfig.enableEagle
    ? "dynamo_eagle_v1"
    : "dynamo_standard_v1"
  return Either.gen(function* () {
    const querySemantics = yield* KvQuerySemantics.make(card.kvCacheBlockSize, hashFormat, "kvCacheBlockSize")
    const cacheSemantics = yield* deriveCacheSemanticsId({
      defaults: [card.sourcePath],
      explicit: card.indexerIdentity?.semantics,
      kvBlockSize: querySemantics.kvBlockSize,
      hashFormat
    })
    const routingScope = yield* deriveRoutingScopeId({
      defaults: [servingEndpoint.namespace, servingEndpoint.component, servingEndpoint.endpoint],
      explicit: card.indexerIdentity?.routingScope
    })
    return { id: new IndexerDomainId(cacheSemantics, routingScope), querySemantics }
  })
}

// ---------------------------------------------------------------------------------------------
// Identities

/** A value as it reads in an error message (cut when long: a message names, it does not dump). */
export const shown = (value: unknown): string => {
  let text: string
  try {
    text = JSON.stringify(value) ?? String(value)
  } catch {
    text = String(value)
  }
  return text.length > 60 ? `${text.slice(0, 57)}…` : text
}

// The message annotations below replace Effect's rendering of the whole expected type
// ("Expected { readonly digest: Digest; … }, actual …") with the shape the user must send.
/** Where an identity came from in JSON: `default_derived` or `explicit`. */
export const IdentitySourceJson = Schema.Literal("default_derived", "explicit").annotations({
  message: (issue) => ({
    message: `expected "default_derived" or "explicit", got ${shown(issue.actual)}`,
    override: true
  })
})

const DigestIdentityFields = Schema.Struct({ digest: Digest, source: IdentitySourceJson }).annotations({
  message: (issue) => `expected {digest, source}, got ${shown(issue.actual)}`
})

/** A cache-semantics identity in JSON (digest and source). */
export const CacheSemanticsJson = Schema.transform(
  DigestIdentityFields,
  Schema.instanceOf(CacheSemanticsId),
  {
    strict: true,
    decode: ({ digest, source }) => new CacheSemanticsId(hexToBytes(digest), source),
    encode: (id) => ({ digest: id.hex, source: id.source })
  }
).annotations({ identifier: "CacheSemanticsId" })

/** A routing-scope identity in JSON (digest and source). */
export const RoutingScopeJson = Schema.transform(DigestIdentityFields, Schema.instanceOf(RoutingScopeId), {
  strict: true,
  decode: ({ digest, source }) => new RoutingScopeId(hexToBytes(digest), source),
  encode: (id) => ({ digest: id.hex, source: id.source })
}).annotations({ identifier: "RoutingScopeId" })

/** `{cacheSemantics, routingScope}` ↔ `IndexerDomainId` (the `poolDomain` of §7). */
export const IndexerDomainJson = Schema.transform(
  Schema.Struct({ cacheSemantics: CacheSemanticsJson, routingScope: RoutingScopeJson }).annotations({
    message: (issue) =>
      `expected {cacheSemantics: {digest, source}, routingScope: {digest, source}}, got ${shown(issue.actual)}`
  }),
  Schema.instanceOf(IndexerDomainId),
  {
    strict: true,
    decode: ({ cacheSemantics, routingScope }) => new IndexerDomainId(cacheSemantics, routingScope),
    encode: (id) => ({ cacheSemantics: id.cacheSemantics, routingScope: id.routingScope })
  }
).annotations({ identifier: "IndexerDomainId" })

/** Wire `POOL_IDENTITY_VERSION`; the native PoolId carries no version. */
export const POOL_IDENTITY_VERSION = 1 as const

/** A pool id in JSON. */
export const PoolIdJson = Schema.transform(
  Schema.Struct({
    identityVersion: Schema.Literal(POOL_IDENTITY_VERSION),
    cacheSemantics: CacheSemanticsJson,
    routingScope: RoutingScopeJson,
    dcId: DcIdHex
  }),
  Schema.instanceOf(PoolId),
  {
    strict: true,
    decode: ({ cacheSemantics, routingScope, dcId }) =>
      new PoolId(new IndexerDomainId(cacheSemantics, routingScope), dcId),
    encode: (poolId) => ({
      identityVersion: POOL_IDENTITY_VERSION,
      cacheSemantics: poolId.indexerDomain.cacheSemantics,
      routingScope: poolId.indexerDomain.routingScope,
      dcId: poolId.dcId
    })
  }
).annotations({ identifier: "PoolId" })

/** The most buckets a CKF format may declare. */
export const MAX_BUCKET_COUNT = 1 << 24

const isBucketCount = (n: number): boolean =>
  Number.isInteger(n) && n >= 2 && n <= MAX_BUCKET_COUNT && (n & (n - 1)) === 0

/** A power of two in 2..=2^24 (CBI1 carries at most 2^24 buckets). */
export const BucketCount = Schema.Number.pipe(
  Schema.filter(
    (n) => isBucketCount(n) || `bucketCount must be a power of two in 2..=${MAX_BUCKET_COUNT}, got ${n}`
  )
).annotations({ identifier: "BucketCount" })

/** A CKF format in JSON, checked for what the CKF core accepts. */
export const CkfFormatJson = Schema.transformOrFail(
  Schema.Struct({
    formatVersion: Schema.Literal(1),
    seed: U64,
    bucketCount: BucketCount,
    fingerprintBits: Schema.Literal(16),
    slotsPerBucket: Schema.Literal(4)
  }),
  Schema.instanceOf(DcCkfFormatIdentity),
  {
    strict: true,
    decode: ({ seed, bucketCount, formatVersion, fingerprintBits, slotsPerBucket }) =>
      ParseResult.succeed(
        new DcCkfFormatIdentity(seed, bucketCount, formatVersion, fingerprintBits, slotsPerBucket)
      ),
    // The native class admits any numbers; only the one published format has a JSON form.
    encode: (format, _, ast) =>
      format.formatVersion === 1 &&
      format.fingerprintBits === 16 &&
      format.slotsPerBucket === 4 &&
      isBucketCount(format.bucketCount)
        ? ParseResult.succeed({
            formatVersion: 1 as const,
            seed: format.seed,
            bucketCount: format.bucketCount,
            fingerprintBits: 16 as const,
            slotsPerBucket: 4 as const
          })
        : failType(
            ast,
            format,
            `CKF format ${format.key} has no JSON form (expected version 1, 16 bits, 4 slots)`
          )
  }
).annotations({ identifier: "CkfFormat" })

/** Layout generations start at 1; 0 is invalid on the wire. */
export const LayoutGeneration = U64.pipe(
  Schema.filter((value) => value !== 0n || "layoutGeneration must not be 0")
).annotations({ identifier: "LayoutGeneration" })

/** A producer identity in JSON. */
export const ProducerIdentityJson = Schema.transform(
  Schema.Struct({
    poolId: PoolIdJson,
    producerIncarnation: U64,
    layoutGeneration: LayoutGeneration,
    format: CkfFormatJson
  }),
  Schema.instanceOf(ProducerIdentity),
  {
    strict: true,
    decode: ({ poolId, producerIncarnation, layoutGeneration, format }) =>
      new ProducerIdentity(poolId, producerIncarnation, layoutGeneration, format),
    encode: (producer) => ({
      poolId: producer.poolId,
      producerIncarnation: producer.producerIncarnation,
      layoutGeneration: producer.layoutGeneration,
      format: producer.format
    })
  }
).annotations({ identifier: "ProducerIdentity" })

// ---------------------------------------------------------------------------------------------
