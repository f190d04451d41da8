/**
 * Model registrations, query semantics, worker roles, endpoints and the pool descriptor
 * (relay-service.md §1.1, §1.3–§1.9). Identity values themselves are the CKF core's classes in
 * `src/ckf/identity.ts`; this module adds what the catalog says about a pool.
 */

import { type Brand, Data, Either, Equal, ParseResult, Schema } from "effect"
import type { DcId, PoolId, ProducerIdentity } from "../ckf/identity.js"
import { failType } from "./Json.js"
import { compareArrays, compareUtf8, type NameProblem, nameProblem, nameProblemText } from "./Text.js"

// ---------------------------------------------------------------------------------------------
// Errors

/** A model, alias or adapter name that breaks the name rules; `field` says where it was. */
export class InvalidModelName extends Data.TaggedError("InvalidModelName")<{
  /** Which field carried the name (`model`, `alias`, `baseModel`, `adapter`, …). */
  readonly field: string
  readonly value: string
  readonly reason: NameProblem
}> {
  override get message(): string {
    return `${this.field} ${JSON.stringify(this.value)} ${nameProblemText(this.reason)}`
  }
}

/** Why a set of model registrations was refused. */
export type RegistrationProblem =
  | "Empty"
  | "ConflictingTargets"
  | "DuplicateModel"
  | "AliasIsModel"
  | "AliasClaimedTwice"

const quote = (value: string | undefined): string => JSON.stringify(value ?? "")

const registrationMessages: Record<
  RegistrationProblem,
  (e: { readonly model?: string; readonly alias?: string; readonly firstOwner?: string }) => string
> = {
  Empty: () => "registrations must not be empty",
  ConflictingTargets: (e) =>
    `canonical model ${quote(e.model)} resolves to conflicting targets in the same pool`,
  DuplicateModel: (e) => `duplicate canonical model registration ${quote(e.model)}`,
  AliasIsModel: (e) =>
    `model alias ${quote(e.alias)} conflicts with canonical model ${quote(e.alias)} in the same pool`,
  AliasClaimedTwice: (e) =>
    `model alias ${quote(e.alias)} is claimed by both ${quote(e.firstOwner)} and ${quote(e.model)} in the same pool`
}

/** A card's model registrations were refused; `reason` says why. */
export class InvalidRegistrations extends Data.TaggedError("InvalidRegistrations")<{
  readonly reason: RegistrationProblem
  readonly model?: string
  readonly alias?: string
  /** For `AliasClaimedTwice`: the model that claimed the alias first. */
  readonly firstOwner?: string
}> {
  override get message(): string {
    return registrationMessages[this.reason](this)
  }
}

/** A KV block size of zero, which no query can be hashed with. */
export class ZeroBlockSize extends Data.TaggedError("ZeroBlockSize")<{
  readonly field: string
}> {
  override get message(): string {
    return `${this.field} must be greater than zero`
  }
}

/** Query semantics (block size, hash format) the relay cannot answer queries under. */
export class InvalidQuerySemantics extends Data.TaggedError("InvalidQuerySemantics")<{
  readonly field: "kvBlockSize" | "hashFormat" | string
  readonly value: unknown
}> {
  override get message(): string {
    return this.field === "hashFormat"
      ? `hashFormat ${JSON.stringify(this.value)} is not one of ${KV_QUERY_HASH_FORMATS.map((f) => JSON.stringify(f)).join(", ")}`
      : `${this.field} ${String(this.value)} must be an integer in 1..=4294967295`
  }
}

/** Why a serving endpoint's text is not `namespace.component.endpoint`. */
export type EndpointIdProblem = "Format" | "EmptyPart" | "DotInPart"

/** A serving endpoint's text that could not be parsed; `reason` says why. */
export class InvalidEndpointId extends Data.TaggedError("InvalidEndpointId")<{
  readonly value: string
  readonly reason: EndpointIdProblem
  /** Which part was wrong, when the reason is about one part. */
  readonly part?: "namespace" | "component" | "endpoint"
}> {
  override get message(): string {
    if (this.reason === "Format")
      return `endpoint ${quote(this.value)} must be "namespace.component.endpoint"`
    if (this.reason === "EmptyPart") return `endpoint ${this.part} must not be empty`
    return `endpoint ${this.part} ${quote(this.value)} must not contain "."`
  }
}

/** Why a pool's worker roles were refused. */
export type PoolDescriptorProblem = "EmptyRoles" | "DuplicateRole"

/** A pool descriptor whose roles are empty or repeated. */
export class InvalidPoolDescriptor extends Data.TaggedError("InvalidPoolDescriptor")<{
  readonly reason: PoolDescriptorProblem
  readonly role?: WorkerRole
}> {
  override get message(): string {
    return this.reason === "EmptyRoles"
      ? "poolRoles must not be empty"
      : `poolRoles lists ${JSON.stringify(this.role)} more than once`
  }
}

// ---------------------------------------------------------------------------------------------
// CanonicalModelId and ModelAlias (§1.3)

/** A model name that passed the name rules (PROTOCOL §2). */
export type CanonicalModelId = Brand.Branded<string, "CanonicalModelId">
/** An alias of a model that passed the name rules. */
export type ModelAlias = Brand.Branded<string, "ModelAlias">

const checkName = <A extends string>(value: string, field: string): Either.Either<A, InvalidModelName> => {
  const problem = nameProblem(value)
  return problem === undefined
    ? Either.right(value as A)
    : Either.left(new InvalidModelName({ field, value, reason: problem }))
}

/** The name as a `CanonicalModelId`, or why it breaks the name rules. */
export const validateCanonicalModelId = (
  value: string,
  field = "model"
): Either.Either<CanonicalModelId, InvalidModelName> => checkName<CanonicalModelId>(value, field)

/** The name as a `ModelAlias`, or why it breaks the name rules. */
export const validateModelAlias = (
  value: string,
  field = "alias"
): Either.Either<ModelAlias, InvalidModelName> => checkName<ModelAlias>(value, field)

/** For literals in code and tests; throws `InvalidModelName`. */
export const canonicalModelId = (value: string): CanonicalModelId =>
  Either.getOrThrowWith(validateCanonicalModelId(value), (e) => e)

/** For literals in code and tests; throws `InvalidModelName`. */
export const modelAlias = (value: string): ModelAlias =>
  Either.getOrThrowWith(validateModelAlias(value), (e) => e)

// ---------------------------------------------------------------------------------------------
// ModelTarget (§1.4)

/** What a registered model serves: a base model, or a LoRA adapter on one. */
export type ModelTarget = Data.TaggedEnum<{
  Base: { readonly baseModel: CanonicalModelId }
  Lora: { readonly baseModel: CanonicalModelId; readonly adapter: CanonicalModelId }
}>
export const ModelTarget = Data.taggedEnum<ModelTarget>()

/** True for a `ModelTarget` value (a guard for values read from outside). */
export const isModelTarget = (u: unknown): u is ModelTarget => {
  if (typeof u !== "object" || u === null || !("_tag" in u) || !("baseModel" in u)) return false
  if (typeof u.baseModel !== "string") return false
  if (u._tag === "Base") return true
  return u._tag === "Lora" && "adapter" in u && typeof u.adapter === "string"
}

/** Derived Rust order: `Base` before `Lora`, then the fields in declaration order. */
export const compareModelTargets = (a: ModelTarget, b: ModelTarget): number => {
  if (a._tag !== b._tag) return a._tag === "Base" ? -1 : 1
  const byBase = compareUtf8(a.baseModel, b.baseModel)
  if (byBase !== 0 || a._tag === "Base" || b._tag === "Base") return byBase
  return compareUtf8(a.adapter, b.adapter)
}

// ---------------------------------------------------------------------------------------------
// CanonicalModelRegistration (§1.5)

/** One model a pool serves: its name, its target and its aliases. */
export interface CanonicalModelRegistration {
  readonly model: CanonicalModelId
  readonly target: ModelTarget
  /** Sorted byte-wise, unique, never equal to `model`. */
  readonly aliases: ReadonlyArray<ModelAlias>
}

/** `with_target`: drops aliases equal to the model, sorts and dedupes the rest. */
export const withTarget = (
  model: CanonicalModelId,
  target: ModelTarget,
  aliases: Iterable<ModelAlias>
): CanonicalModelRegistration => {
  const sorted = Array.from(aliases)
    .filter((alias) => (alias as string) !== (model as string))
    .sort(compareUtf8)
  const unique = sorted.filter((alias, i) => i === 0 || alias !== sorted[i - 1])
  // Data.struct / Data.array give registrations structural `Equal`, so they work as HashMap keys.
  return Data.struct({ model, target, aliases: Data.array(unique) })
}

/** `CanonicalModelRegistration::new`: a base registration of `model` itself. */
export const baseRegistration = (
  model: CanonicalModelId,
  aliases: Iterable<ModelAlias> = []
): CanonicalModelRegistration => withTarget(model, ModelTarget.Base({ baseModel: model }), aliases)

/** The order registrations are listed in: by model, then target, then aliases (byte-wise). */
export const compareRegistrations = (a: CanonicalModelRegistration, b: CanonicalModelRegistration): number =>
  compareUtf8(a.model, b.model) ||
  compareModelTargets(a.target, b.target) ||
  compareArrays(a.aliases, b.aliases, compareUtf8)

/** True when two registrations say the same thing. */
export const registrationEquals = (a: CanonicalModelRegistration, b: CanonicalModelRegistration): boolean =>
  compareRegistrations(a, b) === 0

/** Two registration lists (each in `compareRegistrations` order) hold the same registrations. */
export const registrationListsEqual = (
  a: ReadonlyArray<CanonicalModelRegistration>,
  b: ReadonlyArray<CanonicalModelRegistration>
): boolean => a === b || compareArrays(a, b, compareRegistrations) === 0

/** Two role lists (each in `compareWorkerRoles` order) hold the same roles. */
export const roleListsEqual = (a: ReadonlyArray<WorkerRole>, b: ReadonlyArray<WorkerRole>): boolean =>
  a.length === b.length && a.every((role, i) => role === b[i])

/**
 * The registry's rules for one pool's registration list, checked in the reference's order: each
 * canonical model once, then no alias naming a model of the pool, then no alias with two owners.
 */
export const validatePoolRegistrations = (
  registrations: ReadonlyArray<CanonicalModelRegistration>
): Either.Either<ReadonlyArray<CanonicalModelRegistration>, InvalidRegistrations> => {
  if (registrations.length === 0) return Either.left(new InvalidRegistrations({ reason: "Empty" }))
  const targets = new Map<string, ModelTarget>()
  for (const registration of registrations) {
    const previous = targets.get(registration.model)
    if (previous !== undefined) {
      return Either.left(
        new InvalidRegistrations({
          reason: Equal.equals(previous, registration.target) ? "DuplicateModel" : "ConflictingTargets",
          model: registration.model
        })
      )
    }
    targets.set(registration.model, registration.target)
  }
  const owners = new Map<string, string>()
  for (const registration of registrations) {
    for (const alias of registration.aliases) {
      if (targets.has(alias)) {
        return Either.left(new InvalidRegistrations({ reason: "AliasIsModel", alias, model: alias }))
      }
      const owner = owners.get(alias)
      if (owner !== undefined && owner !== registration.model) {
        return Either.left(
          new InvalidRegistrations({
            reason: "AliasClaimedTwice",
            alias,
            firstOwner: owner,
            model: registration.model
          })
        )
      }
      owners.set(alias, registration.model)
    }
  }
  return Either.right(registrations)
}

// ---------------------------------------------------------------------------------------------
// KvQuerySemantics (§1.6)

/** The block hash formats a query can be answered under. */
export const KV_QUERY_HASH_FORMATS = ["dynamo_standard_v1", "dynamo_eagle_v1"] as const
/** One of `KV_QUERY_HASH_FORMATS`. */
export type KvQueryHashFormat = (typeof KV_QUERY_HASH_FORMATS)[number]

/** The `u16` fed into cache-semantics material and carried on the wire enum. */
export const hashFormatIdentityVersion = (format: KvQueryHashFormat): 1 | 2 =>
  format === "dynamo_standard_v1" ? 1 : 2

const U32_MAX = 0xffff_ffff

/** What an overlap query needs to hash its tokens as the pool did: block size and hash format. */
export class KvQuerySemantics extends Data.Class<{
  readonly kvBlockSize: number
  readonly hashFormat: KvQueryHashFormat
}> {
  get identityVersion(): 1 | 2 {
    return hashFormatIdentityVersion(this.hashFormat)
  }

  /** `kvBlockSize` must be a u32 above zero; `hashFormat` one of the two known formats. */
  static make(
    kvBlockSize: number,
    hashFormat: string,
    field = "kvBlockSize"
  ): Either.Either<KvQuerySemantics, ZeroBlockSize | InvalidQuerySemantics> {
    if (kvBlockSize === 0) return Either.left(new ZeroBlockSize({ field }))
    if (!Number.isInteger(kvBlockSize) || kvBlockSize < 0 || kvBlockSize > U32_MAX) {
      return Either.left(new InvalidQuerySemantics({ field, value: kvBlockSize }))
    }
    if (!(KV_QUERY_HASH_FORMATS as ReadonlyArray<string>).includes(hashFormat)) {
      return Either.left(new InvalidQuerySemantics({ field: "hashFormat", value: hashFormat }))
    }
    return Either.right(new KvQuerySemantics({ kvBlockSize, hashFormat: hashFormat as KvQueryHashFormat }))
  }
}

// ---------------------------------------------------------------------------------------------
// WorkerRole (§1.7)

/** In the reference's declaration order, which is also the role order. */
export const WORKER_ROLES = ["prefill", "decode", "encode", "aggregated", "legacy"] as const
/** The role a worker plays in a pool (`legacy` for workers that do not say). */
export type WorkerRole = (typeof WORKER_ROLES)[number]
/** A card's `workerType`; an absent one means `legacy`. */
export type WorkerType = Exclude<WorkerRole, "legacy">
/** The worker types a card may declare. */
export const WORKER_TYPES: ReadonlyArray<WorkerType> = ["prefill", "decode", "encode", "aggregated"]

/** The role of a worker with the given declared type (`legacy` when it declares none). */
export const roleFromWorkerType = (workerType: WorkerType | null | undefined): WorkerRole =>
  workerType ?? "legacy"

/** The order roles are listed in. */
export const compareWorkerRoles = (a: WorkerRole, b: WorkerRole): number =>
  WORKER_ROLES.indexOf(a) - WORKER_ROLES.indexOf(b)

// ---------------------------------------------------------------------------------------------
// EndpointId

const ENDPOINT_PARTS = ["namespace", "component", "endpoint"] as const

/** Why one endpoint part cannot round-trip through the `ns.component.endpoint` text form. */
export const endpointPartProblem = (
  value: string,
  part: (typeof ENDPOINT_PARTS)[number]
): InvalidEndpointId | undefined => {
  if (value.length === 0) return new InvalidEndpointId({ value, reason: "EmptyPart", part })
  if (value.includes(".")) return new InvalidEndpointId({ value, reason: "DotInPart", part })
  return undefined
}

/**
 * A Dynamo endpoint `{namespace, component, endpoint}`. `new` does not validate; `make` and
 * `parse` ensure the parts survive the dotted text form used by `kvStateEndpoint`.
 */
export class EndpointId extends Data.Class<{
  readonly namespace: string
  readonly component: string
  readonly endpoint: string
}> {
  static make(
    namespace: string,
    component: string,
    endpoint: string
  ): Either.Either<EndpointId, InvalidEndpointId> {
    const values = [namespace, component, endpoint]
    for (let i = 0; i < 3; i++) {
      const problem = endpointPartProblem(values[i]!, ENDPOINT_PARTS[i]!)
      if (problem !== undefined) return Either.left(problem)
    }
    return Either.right(new EndpointId({ namespace, component, endpoint }))
  }

  /** Parses `"namespace.component.endpoint"` (exactly three non-empty dot-separated parts). */
  static parse(text: string): Either.Either<EndpointId, InvalidEndpointId> {
    const parts = text.split(".")
    if (parts.length !== 3) return Either.left(new InvalidEndpointId({ value: text, reason: "Format" }))
    return EndpointId.make(parts[0]!, parts[1]!, parts[2]!)
  }

  override toString(): string {
    return `${this.namespace}.${this.component}.${this.endpoint}`
  }
}

/** The order serving endpoints are listed in: by namespace, component, endpoint (byte-wise). */
export const compareEndpointIds = (a: EndpointId, b: EndpointId): number =>
  compareUtf8(a.namespace, b.namespace) ||
  compareUtf8(a.component, b.component) ||
  compareUtf8(a.endpoint, b.endpoint)

// ---------------------------------------------------------------------------------------------
// DcRelayIdentity (§1.1) and DcPoolDescriptor (§1.9)

/** Which relay process answers: its Dynamo runtime instance and its incarnation. */
export class DcRelayIdentity extends Data.Class<{
  readonly drtInstanceId: bigint
  readonly relayIncarnation: bigint
}> {}

/** A pool as the catalog describes it: producer, serving endpoint, models and roles. */
export interface DcPoolDescriptor {
  readonly producer: ProducerIdentity
  readonly servingEndpoint: EndpointId
  readonly registrations: ReadonlyArray<CanonicalModelRegistration>
  readonly querySemantics: KvQuerySemantics
  /** Roles of the endpoint's current base cards: non-empty, no duplicates. */
  readonly poolRoles: ReadonlyArray<WorkerRole>
}

/** The pool a descriptor describes. */
export const poolIdOf = (descriptor: DcPoolDescriptor): PoolId => descriptor.producer.poolId

/** The roles, if they are non-empty and distinct. */
export const validatePoolRoles = (
  roles: ReadonlyArray<WorkerRole>
): Either.Either<ReadonlyArray<WorkerRole>, InvalidPoolDescriptor> => {
  if (roles.length === 0) return Either.left(new InvalidPoolDescriptor({ reason: "EmptyRoles" }))
  const seen = new Set<WorkerRole>()
  for (const role of roles) {
    if (seen.has(role)) return Either.left(new InvalidPoolDescriptor({ reason: "DuplicateRole", role }))
    seen.add(role)
  }
  return Either.right(roles)
}

/** Builds a descriptor after the registry's registration rules and the role rules. */
export const makePoolDescriptor = (
  fields: DcPoolDescriptor
): Either.Either<DcPoolDescriptor, InvalidRegistrations | InvalidPoolDescriptor> =>
  Either.flatMap(validatePoolRegistrations(fields.registrations), () =>
    Either.map(validatePoolRoles(fields.poolRoles), () => ({
      producer: fields.producer,
      servingEndpoint: fields.servingEndpoint,
      registrations: fields.registrations,
      querySemantics: fields.querySemantics,
      poolRoles: fields.poolRoles
    }))
  )

/** Descriptors compare by every field; the producer by its full identity (both digest sources, format). */
export const poolDescriptorEquals = (a: DcPoolDescriptor, b: DcPoolDescriptor): boolean =>
  a.producer.equals(b.producer) &&
  Equal.equals(a.servingEndpoint, b.servingEndpoint) &&
  compareArrays(a.registrations, b.registrations, compareRegistrations) === 0 &&
  Equal.equals(a.querySemantics, b.querySemantics) &&
  compareArrays(a.poolRoles, b.poolRoles, compareWorkerRoles) === 0

/** The catalog as `GET /v1/catalog` serves it: pools ordered by PoolId. */
export interface CatalogSnapshot {
  readonly relay: DcRelayIdentity
  readonly revision: bigint
  readonly pools: ReadonlyArray<DcPoolDescriptor>
}

/** `GET /v1/relay`. */
export interface RelayInfo {
  readonly relay: DcRelayIdentity
  readonly dcName: string
  readonly dcId: DcId
}

// ---------------------------------------------------------------------------------------------
// Endpoints, models, semantics, roles

/** The schema of one part of a serving endpoint (`namespace`, `component` or `endpoint`). */
export const endpointPart = (part: "namespace" | "component" | "endpoint") =>
  Schema.String.pipe(Schema.filter((value) => endpointPartProblem(value, part)?.message ?? true))

/** A serving endpoint as a JSON object of its three parts. */
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

/** A model name in JSON, checked against the name rules. */
export const CanonicalModelIdJson = Schema.String.pipe(
  Schema.filter((value) =>
    Either.match(validateCanonicalModelId(value), { onLeft: (e) => e.message, onRight: () => true })
  ),
  Schema.brand("CanonicalModelId")
).annotations({ identifier: "CanonicalModelId" })

/** A model alias in JSON, checked against the name rules. */
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

/** A block hash format in JSON. */
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

/** Query semantics in JSON (`kvBlockSize`, `hashFormat`). */
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

/** A worker role in JSON. */
export const WorkerRoleJson = Schema.Literal(...WORKER_ROLES)

// ---------------------------------------------------------------------------------------------
