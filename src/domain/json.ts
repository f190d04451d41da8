/**
 * `effect/Schema` codecs for the JSON of PROTOCOL.md §2 (discovery records) and §5 (relay HTTP).
 *
 * Conventions enforced here: a u64 is canonical decimal text (a JSON number ≤ 2^53 is accepted on
 * input only), digests are lowercase hex, names are camelCase, and `decodeJson` rejects unknown
 * fields. Decoded values are the CKF core's identity classes and the `model.ts` values.
 */

import { Data, Either, ParseResult, Schema, type SchemaAST } from "effect"
import {
  CacheSemanticsId,
  DcCkfFormatIdentity,
  DcId,
  IndexerDomainId,
  PoolId,
  ProducerIdentity,
  RoutingScopeId
} from "../ckf/identity.js"
import type { WorkerId } from "./events.js"
import { validateDcName, validateExplicitMap } from "./identity.js"
import {
  type CanonicalModelRegistration,
  type CatalogSnapshot,
  type DcPoolDescriptor,
  DcRelayIdentity,
  EndpointId,
  endpointPartProblem,
  isModelTarget,
  KV_QUERY_HASH_FORMATS,
  KvQuerySemantics,
  ModelTarget,
  makePoolDescriptor,
  type RelayInfo,
  validateCanonicalModelId,
  validateModelAlias,
  WORKER_ROLES,
  WORKER_TYPES,
  withTarget
} from "./model.js"
import { utf8Length } from "./text.js"

// ---------------------------------------------------------------------------------------------
// Decode / encode helpers

export class JsonDecodeError extends Data.TaggedError("JsonDecodeError")<{ readonly message: string }> {}
export class JsonEncodeError extends Data.TaggedError("JsonEncodeError")<{ readonly message: string }> {}

const pathText = (path: ReadonlyArray<PropertyKey>): string => {
  let out = ""
  for (const key of path) {
    if (typeof key === "number") out += `[${key}]`
    else out += out.length === 0 ? String(key) : `.${String(key)}`
  }
  return out
}

const OPTIONAL_MISMATCH = /^Expected (undefined|null), actual /

/**
 * How the wording of decode errors reads: `schema` keeps the schema library's own sentences
 * (configuration files, discovery records), `contract` rewrites its `Expected T, actual V` into the
 * protocol's words and never repeats a long value (HTTP request bodies, PROTOCOL §7 ◆3).
 */
export type ErrorWording = "schema" | "contract"

const LITERAL = String.raw`(?:"(?:[^"\\]|\\.)*"|-?\d+(?:\.\d+)?|true|false|null)`
const LITERALS = new RegExp(`^${LITERAL}(?: \\| ${LITERAL})*$`)

/** The contract's words for a schema's type text (`ReadonlyArray<U64>` → "an array"). */
const typeWords = (type: string): string => {
  const t = type.trim()
  if (t.startsWith("{")) return "a JSON object"
  if (/^(?:ReadonlyArray|Array)<|^(?:readonly )?\[/.test(t)) return "an array"
  if (LITERALS.test(t)) {
    const parts = t.split(" | ")
    return parts.length === 1 ? parts[0]! : `one of ${parts.join(", ")}`
  }
  if (t.includes(" | ") && !/[{<[]/.test(t)) return t.split(" | ").map(typeWords).join(" or ")
  switch (t) {
    case "string":
      return "a string"
    case "number":
      return "a number"
    case "boolean":
      return "true or false"
    case "null":
      return "null"
    default:
      return "a valid value"
  }
}

/** A value as the schema library rendered it, described rather than repeated when it is long. */
const actualWords = (actual: string): string => {
  const a = actual.trim()
  if (a.startsWith("[")) return "an array"
  if (a.startsWith("{")) return "an object"
  if (a.startsWith('"')) return a.length <= 42 ? a : "a long string"
  return a.length <= 40 ? a : "another value"
}

/** One issue's message in the contract's words (see `ErrorWording`). */
export const contractIssueMessage = (message: string): string => {
  const found = /^Expected ([\s\S]*?), actual ([\s\S]*)$/.exec(message)
  return found === null ? message : `expected ${typeWords(found[1]!)}, got ${actualWords(found[2]!)}`
}

/** A field path, cut short when a client sent an absurdly long name. */
const shortPath = (path: string): string => (path.length <= 80 ? path : `${path.slice(0, 77)}…`)

/** One line per document: `unknown field "card.foo"`, `missing field "dcId"`, `seed: <why>`. */
export const formatParseError = (error: ParseResult.ParseError, wording: ErrorWording = "schema"): string => {
  let issues: ReadonlyArray<ParseResult.ArrayFormatterIssue>
  try {
    issues = ParseResult.ArrayFormatter.formatErrorSync(error)
  } catch {
    // The formatter renders the offending value recursively; a pathological one cannot be shown.
    return "invalid value"
  }
  const contract = wording === "contract"
  // An optional or nullable field is a union with undefined/null; their mismatches only hide the cause.
  const relevant = issues.filter((issue) => !OPTIONAL_MISMATCH.test(issue.message))
  return (relevant.length > 0 ? relevant : issues)
    .map((issue) => {
      const full = pathText(issue.path)
      const at = contract ? shortPath(full) : full
      if (issue._tag === "Unexpected") return `unknown field ${JSON.stringify(at)}`
      if (issue._tag === "Missing") return `missing field ${JSON.stringify(at)}`
      const message = contract ? contractIssueMessage(issue.message) : issue.message
      return at.length === 0 ? message : `${at}: ${message}`
    })
    .join("; ")
    .replace(/\s*\n\s*/g, " ")
}

/** The deepest nesting a JSON input may have: every record of the protocol is a few levels deep. */
export const MAX_JSON_DEPTH = 64

/** Whether `value` nests arrays or objects deeper than `max` levels (iterative: any depth is safe). */
export const nestedDeeperThan = (value: unknown, max: number): boolean => {
  const stack: Array<unknown> = [value]
  const depths: Array<number> = [0]
  while (stack.length > 0) {
    const item = stack.pop()
    const depth = depths.pop()!
    if (typeof item !== "object" || item === null) continue
    if (depth >= max) return true
    for (const child of Array.isArray(item) ? item : Object.values(item)) {
      if (typeof child !== "object" || child === null) continue
      stack.push(child)
      depths.push(depth + 1)
    }
  }
  return false
}

/**
 * Decodes an already parsed JSON value; unknown fields are errors. A value nested deeper than
 * `MAX_JSON_DEPTH` is rejected before decoding: Effect's decoder and its error rendering recurse,
 * and a 100,000-deep array would otherwise overflow the stack.
 */
export const decodeJson = <A, I>(schema: Schema.Schema<A, I, never>, wording: ErrorWording = "schema") => {
  const decode = Schema.decodeUnknownEither(schema, { onExcessProperty: "error" })
  return (input: unknown): Either.Either<A, JsonDecodeError> => {
    if (nestedDeeperThan(input, MAX_JSON_DEPTH)) {
      return Either.left(
        new JsonDecodeError({ message: `the value is nested deeper than ${MAX_JSON_DEPTH} levels` })
      )
    }
    try {
      return Either.mapLeft(
        decode(input),
        (error) => new JsonDecodeError({ message: formatParseError(error, wording) })
      )
    } catch (cause) {
      // A last line of defence: a decoder must answer, never throw, whatever it is given.
      return Either.left(
        new JsonDecodeError({
          message: `the value could not be decoded: ${cause instanceof Error ? cause.message : String(cause)}`
        })
      )
    }
  }
}

/** Parses JSON text, then decodes it like `decodeJson`. */
export const decodeJsonText = <A, I>(schema: Schema.Schema<A, I, never>) => {
  const decode = decodeJson(schema)
  return (text: string): Either.Either<A, JsonDecodeError> => {
    let parsed: unknown
    try {
      parsed = JSON.parse(text)
    } catch (cause) {
      return Either.left(
        new JsonDecodeError({
          message: `invalid JSON: ${cause instanceof Error ? cause.message : String(cause)}`
        })
      )
    }
    return decode(parsed)
  }
}

/** Encodes a domain value to its JSON value (u64s as decimal strings). */
export const encodeJson = <A, I>(schema: Schema.Schema<A, I, never>) => {
  const encode = Schema.encodeEither(schema)
  return (value: A): Either.Either<I, JsonEncodeError> =>
    Either.mapLeft(encode(value), (error) => new JsonEncodeError({ message: formatParseError(error) }))
}

/** Encodes a domain value to JSON text. */
export const encodeJsonText = <A, I>(schema: Schema.Schema<A, I, never>) => {
  const encode = encodeJson(schema)
  return (value: A): Either.Either<string, JsonEncodeError> =>
    Either.map(encode(value), (json) => JSON.stringify(json))
}

const failType = (ast: SchemaAST.AST, actual: unknown, message: string) =>
  ParseResult.fail(new ParseResult.Type(ast, actual, message))

// ---------------------------------------------------------------------------------------------
// Scalars

const U64_MAX = 0xffff_ffff_ffff_ffffn
const CANONICAL_DECIMAL = /^(0|[1-9][0-9]{0,19})$/
const MAX_JSON_NUMBER = 2 ** 53

/**
 * A u64 from canonical decimal text (no sign, no leading zeros, ≤ 2^64 − 1) or from a JSON
 * number that is an integer in 0..=2^53; undefined otherwise.
 */
export const parseU64 = (input: string | number): bigint | undefined => {
  if (typeof input === "number") {
    return Number.isInteger(input) && input >= 0 && input <= MAX_JSON_NUMBER ? BigInt(input) : undefined
  }
  if (!CANONICAL_DECIMAL.test(input)) return undefined
  const value = BigInt(input)
  return value <= U64_MAX ? value : undefined
}

const U64Input = Schema.Union(Schema.String, Schema.Number).annotations({
  message: (issue) => ({
    message: `expected a u64 as a decimal string or a JSON number, got ${JSON.stringify(issue.actual)}`,
    override: true
  })
})

const u64Problem = (input: string | number): string =>
  typeof input === "number"
    ? `expected a u64: a JSON number must be an integer in 0..=2^53, got ${input}`
    : `expected a u64 as canonical decimal text (no sign, no leading zeros, at most 18446744073709551615), got ${JSON.stringify(input)}`

/** u64 ↔ `bigint`; always encoded as a decimal string. */
export const U64 = Schema.transformOrFail(U64Input, Schema.BigIntFromSelf, {
  strict: true,
  decode: (input, _, ast) => {
    const value = parseU64(input)
    return value === undefined ? failType(ast, input, u64Problem(input)) : ParseResult.succeed(value)
  },
  encode: (value, _, ast) =>
    value >= 0n && value <= U64_MAX
      ? ParseResult.succeed(value.toString())
      : failType(ast, value, `expected a u64, got ${value}`)
}).annotations({ identifier: "U64" })

/** A u64 worker id ↔ its canonical decimal text (`WorkerId`), never a bigint. */
export const WorkerIdJson: Schema.Schema<WorkerId, string | number> = Schema.transformOrFail(
  U64Input,
  Schema.String,
  {
    strict: true,
    decode: (input, _, ast) => {
      const value = parseU64(input)
      return value === undefined
        ? failType(ast, input, u64Problem(input))
        : ParseResult.succeed(value.toString())
    },
    encode: (value, _, ast) =>
      parseU64(value) === undefined
        ? failType(ast, value, `worker id must be canonical decimal u64 text, got ${JSON.stringify(value)}`)
        : ParseResult.succeed(value)
  }
).annotations({ identifier: "WorkerId" })

/** A JSON number that is a u32. */
export const U32 = Schema.Number.pipe(
  Schema.filter((n) => (Number.isInteger(n) && n >= 0 && n <= 0xffff_ffff) || `expected a u32, got ${n}`)
).annotations({ identifier: "U32" })

const NonEmptyString = Schema.String.pipe(Schema.filter((s) => s.length > 0 || "must not be empty"))

/** 32 lowercase hex digits (a 16-byte identity digest). */
export const Digest = Schema.String.pipe(
  Schema.filter(
    (s) =>
      /^[0-9a-f]{32}$/.test(s) || `expected a digest of 32 lowercase hex digits, got ${JSON.stringify(s)}`
  )
).annotations({ identifier: "Digest" })

/** 16 lowercase hex digits ↔ `DcId`. */
export const DcIdHex = Schema.transformOrFail(Schema.String, Schema.instanceOf(DcId), {
  strict: true,
  decode: (text, _, ast) =>
    /^[0-9a-f]{16}$/.test(text)
      ? ParseResult.succeed(new DcId(BigInt(`0x${text}`)))
      : failType(ast, text, `expected a dc id of 16 lowercase hex digits, got ${JSON.stringify(text)}`),
  encode: (dcId) => ParseResult.succeed(dcId.hex)
}).annotations({ identifier: "DcId" })

const hexToBytes = (hex: string): Uint8Array => {
  const out = new Uint8Array(hex.length / 2)
  for (let i = 0; i < out.length; i++) out[i] = Number.parseInt(hex.slice(2 * i, 2 * i + 2), 16)
  return out
}

// ---------------------------------------------------------------------------------------------
// Identities

/** A value as it reads in an error message (cut when long: a message names, it does not dump). */
const shown = (value: unknown): string => {
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
export const IdentitySourceJson = Schema.Literal("default_derived", "explicit").annotations({
  message: (issue) => ({
    message: `expected "default_derived" or "explicit", got ${shown(issue.actual)}`,
    override: true
  })
})

const DigestIdentityFields = Schema.Struct({ digest: Digest, source: IdentitySourceJson }).annotations({
  message: (issue) => `expected {digest, source}, got ${shown(issue.actual)}`
})

export const CacheSemanticsJson = Schema.transform(
  DigestIdentityFields,
  Schema.instanceOf(CacheSemanticsId),
  {
    strict: true,
    decode: ({ digest, source }) => new CacheSemanticsId(hexToBytes(digest), source),
    encode: (id) => ({ digest: id.hex, source: id.source })
  }
).annotations({ identifier: "CacheSemanticsId" })

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

const MAX_BUCKET_COUNT = 1 << 24

const isBucketCount = (n: number): boolean =>
  Number.isInteger(n) && n >= 2 && n <= MAX_BUCKET_COUNT && (n & (n - 1)) === 0

/** A power of two in 2..=2^24 (CBI1 carries at most 2^24 buckets). */
export const BucketCount = Schema.Number.pipe(
  Schema.filter(
    (n) => isBucketCount(n) || `bucketCount must be a power of two in 2..=${MAX_BUCKET_COUNT}, got ${n}`
  )
).annotations({ identifier: "BucketCount" })

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
// Endpoints, models, semantics, roles

const endpointPart = (part: "namespace" | "component" | "endpoint") =>
  Schema.String.pipe(Schema.filter((value) => endpointPartProblem(value, part)?.message ?? true))

export const EndpointIdJson = Schema.transform(
  Schema.Struct({
    namespace: endpointPart("namespace"),
    component: endpointPart("component"),
    endpoint: endpointPart("endpoint")
  }),
  Schema.instanceOf(EndpointId),
  {
    strict: true,
    decode: (fields) => new EndpointId(fields),
    encode: (id) => ({ namespace: id.namespace, component: id.component, endpoint: id.endpoint })
  }
).annotations({ identifier: "EndpointId" })

/** `"namespace.component.endpoint"` ↔ `EndpointId`. */
export const EndpointTextJson = Schema.transformOrFail(Schema.String, Schema.instanceOf(EndpointId), {
  strict: true,
  decode: (text, _, ast) =>
    Either.match(EndpointId.parse(text), {
      onLeft: (error) => failType(ast, text, error.message),
      onRight: ParseResult.succeed
    }),
  encode: (id, _, ast) =>
    Either.match(EndpointId.make(id.namespace, id.component, id.endpoint), {
      onLeft: (error) => failType(ast, id, error.message),
      onRight: (valid) => ParseResult.succeed(valid.toString())
    })
}).annotations({ identifier: "EndpointText" })

export const CanonicalModelIdJson = Schema.String.pipe(
  Schema.filter((value) =>
    Either.match(validateCanonicalModelId(value), { onLeft: (e) => e.message, onRight: () => true })
  ),
  Schema.brand("CanonicalModelId")
).annotations({ identifier: "CanonicalModelId" })

export const ModelAliasJson = Schema.String.pipe(
  Schema.filter((value) =>
    Either.match(validateModelAlias(value), { onLeft: (e) => e.message, onRight: () => true })
  ),
  Schema.brand("ModelAlias")
).annotations({ identifier: "ModelAlias" })

/** Externally tagged: exactly one of `base` / `lora`. */
export const ModelTargetJson = Schema.transform(
  Schema.Struct({
    base: Schema.optional(Schema.Struct({ baseModel: CanonicalModelIdJson })),
    lora: Schema.optional(Schema.Struct({ baseModel: CanonicalModelIdJson, adapter: CanonicalModelIdJson }))
  }).pipe(
    Schema.filter(
      (json) =>
        (json.base === undefined) !== (json.lora === undefined) ||
        "target must have exactly one of the fields base, lora"
    )
  ),
  Schema.declare(isModelTarget, { identifier: "ModelTarget" }),
  {
    strict: true,
    decode: (json) =>
      json.lora !== undefined
        ? ModelTarget.Lora({ baseModel: json.lora.baseModel, adapter: json.lora.adapter })
        : ModelTarget.Base({ baseModel: json.base!.baseModel }),
    encode: (target) =>
      target._tag === "Base"
        ? { base: { baseModel: target.baseModel } }
        : { lora: { baseModel: target.baseModel, adapter: target.adapter } }
  }
)

const isRegistration = (u: unknown): u is CanonicalModelRegistration =>
  typeof u === "object" &&
  u !== null &&
  "model" in u &&
  typeof u.model === "string" &&
  "target" in u &&
  isModelTarget(u.target) &&
  "aliases" in u &&
  Array.isArray(u.aliases)

/** Registrations decode through `withTarget`, so aliases come out sorted, unique and ≠ model. */
export const RegistrationJson = Schema.transform(
  Schema.Struct({
    model: CanonicalModelIdJson,
    target: ModelTargetJson,
    aliases: Schema.Array(ModelAliasJson)
  }),
  Schema.declare(isRegistration, { identifier: "CanonicalModelRegistration" }),
  {
    strict: true,
    decode: ({ model, target, aliases }) => withTarget(model, target, aliases),
    encode: (registration) => ({
      model: registration.model,
      target: registration.target,
      aliases: registration.aliases
    })
  }
)

export const KvQueryHashFormatJson = Schema.Literal(...KV_QUERY_HASH_FORMATS)

/**
 * How a pool's filter is addressed. Every kvrelay pool is addressed by canonical sequence
 * hashes (PROTOCOL §3.3) and says so; a producer that addressed blocks any other way could not
 * be probed with a token query's hashes, so a consumer refuses it rather than answer depth 0.
 * Absent means canonical: PROTOCOL revision 2 defines no other addressing.
 */
export const BLOCK_ADDRESSING = "canonical_v1"

const BlockAddressingJson = Schema.String.pipe(
  Schema.filter(
    (value) =>
      value === BLOCK_ADDRESSING ||
      `addressing ${JSON.stringify(value)} is not ${JSON.stringify(BLOCK_ADDRESSING)}: the pool's filter is not addressed by canonical sequence hashes (PROTOCOL §3.3), so token queries cannot be answered from it`
  )
)

export const QuerySemanticsJson = Schema.transformOrFail(
  Schema.Struct({
    kvBlockSize: Schema.Number,
    hashFormat: KvQueryHashFormatJson,
    addressing: Schema.optional(BlockAddressingJson)
  }),
  Schema.instanceOf(KvQuerySemantics),
  {
    strict: true,
    decode: ({ kvBlockSize, hashFormat }, _, ast, input) =>
      Either.match(KvQuerySemantics.make(kvBlockSize, hashFormat), {
        onLeft: (error) => failType(ast, input, error.message),
        onRight: ParseResult.succeed
      }),
    encode: (semantics) =>
      ParseResult.succeed({
        kvBlockSize: semantics.kvBlockSize,
        hashFormat: semantics.hashFormat,
        addressing: BLOCK_ADDRESSING
      })
  }
).annotations({ identifier: "KvQuerySemantics" })

export const WorkerRoleJson = Schema.Literal(...WORKER_ROLES)

// ---------------------------------------------------------------------------------------------
// Relay documents (§5)

const isPoolDescriptor = (u: unknown): u is DcPoolDescriptor =>
  typeof u === "object" &&
  u !== null &&
  "producer" in u &&
  u.producer instanceof ProducerIdentity &&
  "servingEndpoint" in u &&
  u.servingEndpoint instanceof EndpointId &&
  "querySemantics" in u &&
  u.querySemantics instanceof KvQuerySemantics &&
  "registrations" in u &&
  Array.isArray(u.registrations) &&
  "poolRoles" in u &&
  Array.isArray(u.poolRoles)

export const PoolDescriptorJson = Schema.transformOrFail(
  Schema.Struct({
    producer: ProducerIdentityJson,
    servingEndpoint: EndpointIdJson,
    registrations: Schema.Array(RegistrationJson),
    querySemantics: QuerySemanticsJson,
    poolRoles: Schema.Array(WorkerRoleJson)
  }),
  Schema.declare(isPoolDescriptor, { identifier: "DcPoolDescriptor" }),
  {
    strict: true,
    decode: (fields, _, ast, input) =>
      Either.match(makePoolDescriptor(fields), {
        onLeft: (error) => failType(ast, input, error.message),
        onRight: ParseResult.succeed
      }),
    encode: (descriptor) => ParseResult.succeed(descriptor)
  }
)

export const RelayIdentityJson = Schema.transform(
  Schema.Struct({ drtInstanceId: U64, relayIncarnation: U64 }),
  Schema.instanceOf(DcRelayIdentity),
  {
    strict: true,
    decode: (fields) => new DcRelayIdentity(fields),
    encode: (identity) => ({
      drtInstanceId: identity.drtInstanceId,
      relayIncarnation: identity.relayIncarnation
    })
  }
).annotations({ identifier: "DcRelayIdentity" })

export const PROTOCOL_VERSION = 1 as const

const isCatalogSnapshot = (u: unknown): u is CatalogSnapshot =>
  typeof u === "object" &&
  u !== null &&
  "relay" in u &&
  u.relay instanceof DcRelayIdentity &&
  "revision" in u &&
  typeof u.revision === "bigint" &&
  "pools" in u &&
  Array.isArray(u.pools)

/** `GET /v1/catalog`; the catalog is a map by PoolId, so a repeated pool is an error. */
export const CatalogSnapshotJson = Schema.transformOrFail(
  Schema.Struct({
    protocolVersion: Schema.Literal(PROTOCOL_VERSION),
    relay: RelayIdentityJson,
    revision: U64,
    pools: Schema.Array(PoolDescriptorJson)
  }),
  Schema.declare(isCatalogSnapshot, { identifier: "CatalogSnapshot" }),
  {
    strict: true,
    decode: ({ relay, revision, pools }, _, ast, input) => {
      const seen = new Set<string>()
      for (const pool of pools) {
        const key = pool.producer.poolId.key
        if (seen.has(key))
          return failType(ast, input, `pools lists pool ${pool.producer.poolId} more than once`)
        seen.add(key)
      }
      return ParseResult.succeed({ relay, revision, pools })
    },
    encode: (catalog) =>
      ParseResult.succeed({
        protocolVersion: PROTOCOL_VERSION,
        relay: catalog.relay,
        revision: catalog.revision,
        pools: catalog.pools
      })
  }
)

const DcNameJson = Schema.String.pipe(
  Schema.filter((value) =>
    Either.match(validateDcName(value), { onLeft: (e) => e.message, onRight: () => true })
  )
)

const isRelayInfo = (u: unknown): u is RelayInfo =>
  typeof u === "object" &&
  u !== null &&
  "relay" in u &&
  u.relay instanceof DcRelayIdentity &&
  "dcName" in u &&
  typeof u.dcName === "string" &&
  "dcId" in u &&
  u.dcId instanceof DcId

/** `GET /v1/relay`. */
export const RelayInfoJson = Schema.transform(
  Schema.Struct({
    protocolVersion: Schema.Literal(PROTOCOL_VERSION),
    relay: RelayIdentityJson,
    dcName: DcNameJson,
    dcId: DcIdHex
  }),
  Schema.declare(isRelayInfo, { identifier: "RelayInfo" }),
  {
    strict: true,
    decode: ({ relay, dcName, dcId }) => ({ relay, dcName, dcId }),
    encode: (info) => ({
      protocolVersion: PROTOCOL_VERSION,
      relay: info.relay,
      dcName: info.dcName,
      dcId: info.dcId
    })
  }
)

export const ERROR_REASONS = [
  "INVALID_REQUEST",
  "POOL_NOT_FOUND",
  "PRODUCER_CHANGED",
  "UNSUPPORTED_FEATURE",
  "RESOURCE_LIMIT",
  "PUBLICATION_UNAVAILABLE",
  "INTERNAL",
  "SUBSCRIBER_LAGGED",
  // PROTOCOL §7 ◆3, on both servers: an unknown route, and a body over the server's limit.
  "NOT_FOUND",
  "BODY_TOO_LARGE",
  // Global overlap answers (PROTOCOL §7 ◆3): a typo, an adapter never registered, an outage.
  "MODEL_NOT_FOUND",
  "ADAPTER_NOT_FOUND",
  "NO_READY_LANE",
  // A token file is configured and the request carries no accepted bearer token (PROTOCOL §1 ◆).
  "UNAUTHORIZED",
  // Terminal pool-stream frames only (relay-service §4.1); never an HTTP status body.
  "INVALID_PUBLICATION",
  "SNAPSHOT_PROGRESS_TIMEOUT"
] as const
export type ErrorReason = (typeof ERROR_REASONS)[number]

/** Body of an HTTP error and payload of a terminal stream frame. */
export const ErrorBodyJson = Schema.Struct({
  reason: Schema.Literal(...ERROR_REASONS),
  message: Schema.String
})
export type ErrorBody = typeof ErrorBodyJson.Type

/** `discovery` of `GET /v1/health`: the backend's state and when it last changed (ISO-8601, UTC). */
export const DiscoveryStatusJson = Schema.Struct({
  state: Schema.Literal("live", "stale", "connecting"),
  since: Schema.Date
})

/** `GET /v1/health`. */
export const HealthJson = Schema.Struct({
  healthy: Schema.Boolean,
  shuttingDown: Schema.Boolean,
  endpointCount: U32,
  activeEndpointCount: U32,
  fencedEndpointCount: U32,
  sourcesRecovering: U32,
  sourcesDegraded: U32,
  sources: Schema.Struct({
    expected: U32,
    connecting: U32,
    live: U32,
    recovering: U32,
    degraded: U32,
    rejected: U32
  }),
  discovery: DiscoveryStatusJson
})
export type Health = typeof HealthJson.Type

/** 1..=128 bytes of UTF-8 without control characters. */
export const SubscriberIdJson = Schema.String.pipe(
  Schema.filter((value) => {
    const bytes = utf8Length(value)
    if (bytes === 0 || bytes > 128) return `subscriberId must be 1..=128 bytes of UTF-8, got ${bytes}`
    return (
      !/\p{Cc}/u.test(value) || `subscriberId ${JSON.stringify(value)} must not contain control characters`
    )
  })
).annotations({ identifier: "SubscriberId" })

/** Body of `POST /v1/pools/subscribe`. */
export const SubscribeRequestJson = Schema.Struct({
  subscriberId: SubscriberIdJson,
  expectedProducer: ProducerIdentityJson
})
export type SubscribeRequest = typeof SubscribeRequestJson.Type

// ---------------------------------------------------------------------------------------------
// Discovery records (§2)

export const WorkerTypeJson = Schema.Literal(...WORKER_TYPES)

const ExplicitMapJson = Schema.Record({ key: Schema.String, value: Schema.String })

export const IndexerIdentityJson = Schema.Struct({
  semantics: Schema.optional(ExplicitMapJson),
  routingScope: Schema.optional(ExplicitMapJson)
}).pipe(
  Schema.filter((spec) => {
    for (const field of ["semantics", "routingScope"] as const) {
      const map = spec[field]
      if (map === undefined) continue
      const checked = validateExplicitMap(field, map)
      if (Either.isLeft(checked)) return checked.left.message
    }
    return true
  })
)

export const LoraJson = Schema.Struct({ name: Schema.String, maxGpuLoraCount: Schema.optional(U32) })

const nullDefault = { default: () => null } as const

/** `ModelRuntimeConfig`; every field has the reference's default when absent (relay-service §2.2). */
export const RuntimeConfigJson = Schema.Struct({
  dataParallelStartRank: Schema.optionalWith(U32, { default: () => 0 }),
  dataParallelSize: Schema.optionalWith(U32, { default: () => 1 }),
  enableLocalIndexer: Schema.optionalWith(Schema.Boolean, { default: () => true }),
  /** null = the serving endpoint. */
  kvStateEndpoint: Schema.optionalWith(Schema.NullOr(EndpointTextJson), nullDefault),
  enableEagle: Schema.optionalWith(Schema.Boolean, { default: () => false }),
  totalKvBlocks: Schema.optionalWith(Schema.NullOr(U64), nullDefault),
  maxNumBatchedTokens: Schema.optionalWith(Schema.NullOr(U64), nullDefault),
  maxNumSeqs: Schema.optionalWith(Schema.NullOr(U64), nullDefault),
  contextLength: Schema.optionalWith(Schema.NullOr(U32), nullDefault)
})
export type RuntimeConfig = typeof RuntimeConfigJson.Type

export const DEFAULT_RUNTIME_CONFIG: RuntimeConfig = {
  dataParallelStartRank: 0,
  dataParallelSize: 1,
  enableLocalIndexer: true,
  kvStateEndpoint: null,
  enableEagle: false,
  totalKvBlocks: null,
  maxNumBatchedTokens: null,
  maxNumSeqs: null,
  contextLength: null
}

/**
 * The card fields the relay reads. `name` and `aliases` stay raw strings: an invalid name is a
 * soft error of membership projection (a conflict or a dropped alias), not a malformed card.
 */
export const ModelCardJson = Schema.Struct({
  name: Schema.String,
  sourcePath: Schema.String,
  /** 0 decodes; identity resolution reports it as `ZeroBlockSize`. */
  kvCacheBlockSize: U32,
  aliases: Schema.optionalWith(Schema.Array(Schema.String), { default: () => [] }),
  /** null = legacy. */
  workerType: Schema.optionalWith(Schema.NullOr(WorkerTypeJson), nullDefault),
  lora: Schema.optionalWith(Schema.NullOr(LoraJson), nullDefault),
  indexerIdentity: Schema.optionalWith(Schema.NullOr(IndexerIdentityJson), nullDefault),
  runtimeConfig: Schema.optionalWith(RuntimeConfigJson, { default: () => DEFAULT_RUNTIME_CONFIG })
})
export type ModelCard = typeof ModelCardJson.Type

/** One model card instance: one per worker per model; `modelSuffix` marks a LoRA adapter card. */
export const ModelCardInstanceJson = Schema.Struct({
  namespace: endpointPart("namespace"),
  component: endpointPart("component"),
  endpoint: endpointPart("endpoint"),
  instanceId: WorkerIdJson,
  modelSuffix: Schema.optionalWith(Schema.NullOr(Schema.String), nullDefault),
  card: ModelCardJson
})
export type ModelCardInstance = typeof ModelCardInstanceJson.Type

export const DynamoZmqTransportJson = Schema.Struct({
  kind: Schema.Literal("dynamo-zmq"),
  endpoint: NonEmptyString,
  topic: Schema.String
})

export const EngineZmqTransportJson = Schema.Struct({
  kind: Schema.Literal("engine-zmq"),
  endpoint: NonEmptyString,
  topic: Schema.String,
  replayEndpoint: Schema.optionalWith(Schema.NullOr(NonEmptyString), nullDefault)
})

export const KvEventTransportJson = Schema.Union(DynamoZmqTransportJson, EngineZmqTransportJson)
export type KvEventTransport = typeof KvEventTransportJson.Type

/** One KV event source advertisement: one per worker rank publisher incarnation. */
export const KvEventSourceJson = Schema.Struct({
  kvStateEndpoint: EndpointTextJson,
  workerId: WorkerIdJson,
  dpRank: U32,
  publisherId: U64,
  transport: KvEventTransportJson,
  /** null = live only (no worker-query recovery). */
  recoveryTarget: Schema.optionalWith(Schema.NullOr(Schema.Struct({ endpoint: NonEmptyString })), nullDefault)
})
export type KvEventSource = typeof KvEventSourceJson.Type

/** The file backend's document. */
export const DiscoveryDocumentJson = Schema.Struct({
  version: Schema.Literal(1),
  cards: Schema.Array(ModelCardInstanceJson),
  sources: Schema.Array(KvEventSourceJson)
})
export type DiscoveryDocument = typeof DiscoveryDocumentJson.Type

// ---------------------------------------------------------------------------------------------
// Global consumer documents (§7)

const modelNamespaceJson = Schema.String.pipe(
  Schema.filter((value) => endpointPartProblem(value, "namespace")?.message ?? true)
)

/** Local block hashes as a router computed them (u64 decimal strings, or numbers ≤ 2^53). */
export const BlockHashesJson = Schema.Array(U64)

/** The index of the first element of `values` that is not a u32, or -1. */
const firstNonU32 = (values: ReadonlyArray<unknown>): number => {
  for (let i = 0; i < values.length; i++) {
    const v = values[i]
    if (typeof v !== "number" || !Number.isInteger(v) || v < 0 || v > 0xffff_ffff) return i
  }
  return -1
}

/**
 * A prompt's token ids, u32 each. One pass over the array rather than a schema per element:
 * prompts run to many thousands of tokens and this sits on the query path.
 */
export const TokenIdsJson = Schema.declare(
  (input: unknown): input is ReadonlyArray<number> => Array.isArray(input) && firstNonU32(input) < 0,
  {
    identifier: "TokenIds",
    message: (issue) => {
      const actual = issue.actual
      if (!Array.isArray(actual)) return "tokens must be an array of u32 token ids"
      const at = firstNonU32(actual)
      return `tokens[${at}] is not a u32 token id: ${shown(actual[at])}`
    }
  }
)

/** The adapter whose blocks a token query asks for; absent, null or "" is the base model. */
const LoraNameJson = Schema.optional(Schema.NullOr(Schema.String))

const byModel = { namespace: modelNamespaceJson, model: CanonicalModelIdJson }
const byDomain = { poolDomain: IndexerDomainJson }

/** `POST /v1/overlap` forms (PROTOCOL §7): by model or by pool domain, by tokens or by local hashes. */
export const ModelTokensOverlapJson = Schema.Struct({
  ...byModel,
  tokens: TokenIdsJson,
  loraName: LoraNameJson
})
export const ModelLocalOverlapJson = Schema.Struct({ ...byModel, localBlockHashes: BlockHashesJson })
export const DomainTokensOverlapJson = Schema.Struct({
  ...byDomain,
  tokens: TokenIdsJson,
  loraName: LoraNameJson
})
export const DomainLocalOverlapJson = Schema.Struct({ ...byDomain, localBlockHashes: BlockHashesJson })

/** `POST /v1/overlap/batch`: the queries, 1 to 256, each decoded on its own. */
export const MAX_OVERLAP_BATCH = 256
export const OverlapBatchJson = Schema.Struct({
  queries: Schema.Array(Schema.Unknown).pipe(
    Schema.filter(
      (queries) =>
        (queries.length >= 1 && queries.length <= MAX_OVERLAP_BATCH) ||
        `queries must hold 1 to ${MAX_OVERLAP_BATCH} overlap bodies, got ${queries.length}`
    )
  )
})

export const OverlapResultJson = Schema.Struct({
  relay: Schema.String,
  lane: U32,
  poolId: PoolIdJson,
  servingEndpoint: EndpointIdJson,
  prefixDepth: U32,
  matchedTokens: Schema.Number
})

export const OverlapResponseJson = Schema.Struct({ results: Schema.Array(OverlapResultJson) })
export type OverlapResponse = typeof OverlapResponseJson.Type

export const OverlapBatchResponseJson = Schema.Struct({
  results: Schema.Array(Schema.Array(OverlapResultJson)),
  /** Per query: null, or the error the query would get from `POST /v1/overlap`. */
  errors: Schema.Array(Schema.NullOr(ErrorBodyJson))
})

export const DomainLaneJson = Schema.Struct({
  lane: U32,
  relay: Schema.String,
  poolId: PoolIdJson,
  producer: ProducerIdentityJson,
  servingEndpoint: EndpointIdJson,
  ready: Schema.Boolean,
  /** null while the lane is not ready. */
  installedSequence: Schema.NullOr(U64)
})

/** A base model a domain serves (PROTOCOL §7 ◆3): its aliases and the adapters on it. */
export const DomainModelJson = Schema.Struct({
  namespace: Schema.String,
  model: Schema.String,
  aliases: Schema.Array(Schema.String),
  adapters: Schema.Array(Schema.String)
})

/** One entry of `GET /v1/domains`. */
export const DomainViewJson = Schema.Struct({
  cacheSemantics: CacheSemanticsJson,
  routingScope: RoutingScopeJson,
  querySemantics: QuerySemanticsJson,
  models: Schema.Array(DomainModelJson),
  lanes: Schema.Array(DomainLaneJson)
})

export const DomainsResponseJson = Schema.Array(DomainViewJson)
export type DomainsResponse = typeof DomainsResponseJson.Type

// ---------------------------------------------------------------------------------------------
// Relay HTTP documents (§5): unsupported producer keys, readiness, load, stats, snapshots

const isJsonObject = (u: unknown): u is Readonly<Record<string, unknown>> =>
  typeof u === "object" && u !== null && !Array.isArray(u)

const KNOWN_IDENTITY_SOURCES: ReadonlyArray<unknown> = IdentitySourceJson.literals

/**
 * Why a raw `ProducerIdentity` names a feature this relay does not implement (relay-service
 * §4.6 `is_unsupported`): a non-zero unknown identity or format version, fingerprint width or
 * slot count, an unknown identity source, or a bucket count above the CBI1 maximum. Zero and
 * ill-typed values are malformed, not unsupported; `undefined` when nothing is unsupported.
 */
export const unsupportedProducerFeature = (input: unknown): string | undefined => {
  if (!isJsonObject(input)) return undefined
  const unsupported = (path: string, value: unknown, expected: string) =>
    `${path} ${JSON.stringify(value)} is not supported by this relay (expected ${expected})`
  const poolId = input["poolId"]
  if (isJsonObject(poolId)) {
    const version = poolId["identityVersion"]
    if (typeof version === "number" && version !== 0 && version !== POOL_IDENTITY_VERSION)
      return unsupported("poolId.identityVersion", version, String(POOL_IDENTITY_VERSION))
    for (const field of ["cacheSemantics", "routingScope"] as const) {
      const digest = poolId[field]
      const source = isJsonObject(digest) ? digest["source"] : undefined
      if (typeof source === "string" && source !== "" && !KNOWN_IDENTITY_SOURCES.includes(source))
        return unsupported(`poolId.${field}.source`, source, '"default_derived" or "explicit"')
    }
  }
  const format = input["format"]
  if (isJsonObject(format)) {
    const fixed = [
      ["formatVersion", 1],
      ["fingerprintBits", 16],
      ["slotsPerBucket", 4]
    ] as const
    for (const [field, expected] of fixed) {
      const value = format[field]
      if (typeof value === "number" && value !== 0 && value !== expected)
        return unsupported(`format.${field}`, value, String(expected))
    }
    const buckets = format["bucketCount"]
    if (typeof buckets === "number" && Number.isInteger(buckets) && buckets > MAX_BUCKET_COUNT)
      return unsupported("format.bucketCount", buckets, `at most ${MAX_BUCKET_COUNT}`)
  }
  return undefined
}

/** `UNKNOWN` is a valid state: the relay has no authoritative availability for the group yet. */
export const READINESS_STATES = ["READY", "UNAVAILABLE", "UNKNOWN"] as const
export const ReadinessStateJson = Schema.Literal(...READINESS_STATES)

/** A role a worker card can declare (no `legacy`): the evaluator's present and missing roles. */
export const WorkerTypeRoleJson = Schema.Literal(...WORKER_TYPES)

export const TopologyMemberJson = Schema.Struct({
  endpoint: EndpointIdJson,
  roles: Schema.Array(WorkerRoleJson),
  /** Present only when the endpoint's pool generation matches its current membership. */
  poolId: Schema.optional(PoolIdJson)
})

export const AdapterReadinessJson = Schema.Struct({
  canonicalModelId: CanonicalModelIdJson,
  state: ReadinessStateJson,
  missingRoles: Schema.Array(WorkerTypeRoleJson)
})

export const TopologyEntryJson = Schema.Struct({
  namespace: Schema.String,
  canonicalModelId: CanonicalModelIdJson,
  state: ReadinessStateJson,
  presentRoles: Schema.Array(WorkerTypeRoleJson),
  missingRoles: Schema.Array(WorkerTypeRoleJson),
  members: Schema.Array(TopologyMemberJson),
  /** Only `prefill` / `decode` (relay-service §11: consumers reject any other role here). */
  duplicateRoleEndpoints: Schema.Array(Schema.Literal("prefill", "decode")),
  legacyFallbackActive: Schema.Boolean,
  adapters: Schema.Array(AdapterReadinessJson)
})
export type TopologyEntryDocument = typeof TopologyEntryJson.Type

/** `GET /v1/readiness` and every `event: readiness` of `/v1/readiness/watch`. */
export const ReadinessJson = Schema.Struct({
  revision: U64,
  entries: Schema.Array(TopologyEntryJson)
})
export type ReadinessDocument = typeof ReadinessJson.Type

/** One pool of a load window; unknown sums are sent as 0 (observed < expected marks them). */
export const LoadPoolJson = Schema.Struct({
  producer: ProducerIdentityJson,
  kvUsedBlocks: U64,
  totalKvBlocks: U64,
  kvObservedRanks: U32,
  kvExpectedRanks: U32
})

/** Every `event: load` of `/v1/load/watch`. */
export const LoadWindowJson = Schema.Struct({
  windowSequence: U64,
  observedMs: U64,
  windowMs: U64,
  pools: Schema.Array(LoadPoolJson)
})
export type LoadWindowDocument = typeof LoadWindowJson.Type

/** `undefined` in the domain value, `null` in JSON. */
const nullable = <A, I>(schema: Schema.Schema<A, I, never>) =>
  Schema.transform(Schema.NullOr(schema), Schema.UndefinedOr(Schema.typeSchema(schema)), {
    strict: true,
    decode: (value) => value ?? undefined,
    encode: (value) => value ?? null
  })

const Count = Schema.Number

export const SLOT_LIFECYCLES = [
  "discovered",
  "starting",
  "active",
  "draining",
  "fenced",
  "lightweight"
] as const

export const EndpointStatsJson = Schema.Struct({
  servingEndpoint: EndpointTextJson,
  lifecycle: Schema.Literal(...SLOT_LIFECYCLES),
  layoutGeneration: U64,
  membershipConflicts: Schema.Array(Schema.String),
  models: Schema.Array(Schema.String),
  aliases: Schema.Array(Schema.String),
  roles: Schema.Array(Schema.String),
  aggregation: nullable(
    Schema.Struct({
      members: Schema.Array(Schema.Struct({ workerId: WorkerIdJson, dpRank: U32, blocks: Count })),
      contributionCount: Count,
      uniqueBlockCount: Count,
      unknownRemovals: Count,
      capacityFailures: Count,
      parentNotFound: Count,
      unanchoredRemovals: Count,
      occupiedBucketCount: Count,
      occupiedSlotCount: Count
    })
  ),
  publication: nullable(
    Schema.Struct({
      sequence: U64,
      pendingEvents: Count,
      emittedImages: Count,
      publicationCount: Count,
      unchangedPublicationCount: Count,
      physicalTouches: Count,
      distinctTouchedBuckets: Count,
      netRevertedBuckets: Count
    })
  ),
  memory: nullable(
    Schema.Struct({
      filterBytes: Count,
      dirtyTrackingBytes: Count,
      ownershipBytes: Count,
      lineageEntries: Count,
      lineageBytes: Count,
      memberSetCapacity: Count,
      refcountCapacity: Count,
      insertionScratchCapacity: Count
    })
  ),
  recovery: Schema.Struct({
    degradedResets: Count,
    rebuildCount: Count,
    rebuildTotalMs: Count,
    rebuildMaxMs: Count,
    workerCount: Count,
    rankCount: Count,
    recoveringRankCount: Count,
    pendingLiveEventCount: Count,
    sourcesRecovering: Count,
    sourcesDegraded: Count,
    sources: Schema.Array(
      Schema.Struct({
        workerId: Schema.String,
        dpRank: Count,
        publisherId: U64,
        state: Schema.Literal("live", "recovering", "degraded")
      })
    )
  }),
  actor: nullable(
    Schema.Struct({
      mailboxDepth: Count,
      mailboxCapacity: Count,
      activeCommand: nullable(Schema.String),
      shuttingDown: Schema.Boolean,
      lastError: nullable(Schema.String)
    })
  ),
  ingest: Schema.Struct({
    events: Count,
    blocks: Count,
    malformed: Count,
    gaps: Count,
    recoveries: Count,
    malformedByReason: Schema.Record({ key: Schema.String, value: Count }),
    skipped: Schema.Struct({ medium: Count, locality: Count, ownership: Count, group: Count }),
    stale: Count,
    restarts: Count,
    unanchored: Count
  }),
  sources: Schema.Array(
    Schema.Struct({
      workerId: WorkerIdJson,
      dpRank: U32,
      publisherId: U64,
      transportEndpoint: Schema.String,
      state: Schema.Literal("connecting", "live", "recovering", "degraded", "rejected"),
      since: Schema.Date,
      history: Schema.Literal("complete", "partial"),
      reason: Schema.optional(Schema.String)
    })
  )
})

/** `GET /v1/stats`. */
export const RelayStatsJson = Schema.Struct({
  identity: Schema.Struct({
    dcName: Schema.String,
    dcId: DcIdHex,
    drtInstanceId: U64,
    relayIncarnation: U64
  }),
  endpoints: Schema.Array(EndpointStatsJson)
})

/** `[lo, hi]` u32 pairs ↔ base64 of the little-endian u64 words. */
export const BucketWordsBase64 = Schema.transformOrFail(
  Schema.Uint8ArrayFromBase64,
  Schema.declare((u): u is Uint32Array => u instanceof Uint32Array, { identifier: "Uint32Array" }),
  {
    strict: true,
    decode: (bytes, _, ast) => {
      if (bytes.length % 8 !== 0)
        return failType(ast, bytes, `buckets must be whole u64 words, got ${bytes.length} bytes`)
      const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength)
      const words = new Uint32Array(bytes.length / 4)
      for (let i = 0; i < words.length; i++) words[i] = view.getUint32(4 * i, true)
      return ParseResult.succeed(words)
    },
    encode: (words) => {
      const bytes = new Uint8Array(words.length * 4)
      const view = new DataView(bytes.buffer)
      for (let i = 0; i < words.length; i++) view.setUint32(4 * i, words[i]!, true)
      return ParseResult.succeed(bytes)
    }
  }
).annotations({ identifier: "BucketWords" })

/** `GET /v1/endpoints/{ns.component.endpoint}/snapshot`. */
export const DiagnosticSnapshotJson = Schema.Struct({
  layoutGeneration: U64,
  sequence: U64,
  memberCount: Count,
  uniqueBlockCount: Count,
  format: CkfFormatJson,
  buckets: BucketWordsBase64
})
export type DiagnosticSnapshotDocument = typeof DiagnosticSnapshotJson.Type

// ---------------------------------------------------------------------------------------------
// Global consumer diagnostics (PROTOCOL §7)

/** `GET /v1/health` of `kvrelay global`: 200 when some lane is ready, else 503. */
export const GlobalHealthJson = Schema.Struct({
  healthy: Schema.Boolean,
  relays: Schema.Array(
    Schema.Struct({
      name: Schema.String,
      url: Schema.String,
      connected: Schema.Boolean,
      /** Lanes of this relay's pools across the domains, and how many of them are ready. */
      lanes: U32,
      lanesReady: U32,
      lastError: nullable(Schema.String)
    })
  )
})
export type GlobalHealth = typeof GlobalHealthJson.Type

/** Latency in milliseconds: lifetime mean and max, quantiles over the most recent queries. */
export const QueryLatencyJson = Schema.Struct({
  meanMs: Schema.Number,
  maxMs: Schema.Number,
  p50Ms: Schema.Number,
  p90Ms: Schema.Number,
  p99Ms: Schema.Number,
  recentSamples: Count
})

/** Queries of one route, by outcome (`ok`, `invalid`, `not_found`, `unavailable`, `error`). */
export const QueryRouteStatsJson = Schema.Struct({
  route: Schema.String,
  count: Count,
  outcomes: Schema.Record({ key: Schema.String, value: Count }),
  latency: QueryLatencyJson
})

export const GlobalLaneStatsJson = Schema.Struct({
  lane: U32,
  domain: Schema.Struct({ cacheSemantics: CacheSemanticsJson, routingScope: RoutingScopeJson }),
  poolId: PoolIdJson,
  servingEndpoint: EndpointTextJson,
  producerIncarnation: U64,
  layoutGeneration: U64,
  ready: Schema.Boolean,
  installedSequence: nullable(U64),
  snapshotsInstalled: Count,
  deltasApplied: Count,
  resubscribes: Count,
  faults: Schema.Struct({ total: Count, byReason: Schema.Record({ key: Schema.String, value: Count }) }),
  lastFault: nullable(Schema.String)
})

/** `GET /v1/stats` of `kvrelay global`. */
export const GlobalStatsJson = Schema.Struct({
  consumerInstance: U64,
  subscriberId: Schema.String,
  relays: Schema.Array(
    Schema.Struct({
      name: Schema.String,
      url: Schema.String,
      lane: U32,
      connected: Schema.Boolean,
      epochs: Count,
      lastError: nullable(Schema.String),
      dcName: nullable(Schema.String),
      dcId: nullable(DcIdHex),
      catalogRevision: nullable(U64),
      lanes: Schema.Array(GlobalLaneStatsJson)
    })
  ),
  queries: Schema.Array(QueryRouteStatsJson)
})
export type GlobalStats = typeof GlobalStatsJson.Type
