import { Either, Equal } from "effect"
import { describe, expect, it } from "vitest"
import { DcCkfFormatIdentity, PoolId, ProducerIdentity } from "../../src/ckf/identity.js"
import { resolveIndexerDomain, stableDcId } from "../../src/protocol/Identity.js"
import {
  baseRegistration,
  type CanonicalModelRegistration,
  canonicalModelId,
  compareEndpointIds,
  compareModelTargets,
  compareRegistrations,
  compareWorkerRoles,
  DcRelayIdentity,
  EndpointId,
  hashFormatIdentityVersion,
  InvalidModelName,
  InvalidRegistrations,
  KvQuerySemantics,
  ModelTarget,
  makePoolDescriptor,
  modelAlias,
  poolDescriptorEquals,
  poolIdOf,
  registrationEquals,
  roleFromWorkerType,
  validateCanonicalModelId,
  validateModelAlias,
  validatePoolRegistrations,
  WORKER_ROLES,
  type WorkerRole,
  withTarget
} from "../../src/protocol/Model.js"

const leftOf = <A, E>(either: Either.Either<A, E>): E => {
  if (Either.isRight(either)) throw new Error(`expected a failure, got ${String(either.right)}`)
  return either.left
}

const m = canonicalModelId
const a = modelAlias
const base = (model: string) => ModelTarget.Base({ baseModel: m(model) })
const lora = (model: string, adapter: string) =>
  ModelTarget.Lora({ baseModel: m(model), adapter: m(adapter) })

describe("CanonicalModelId and ModelAlias", () => {
  it("accepts names without surrounding whitespace", () => {
    expect(Either.getOrThrow(validateCanonicalModelId("meta/llama 3"))).toBe("meta/llama 3")
    expect(Either.getOrThrow(validateModelAlias("chat"))).toBe("chat")
  })

  it("rejects empty names and surrounding whitespace, naming field and value", () => {
    const cases: ReadonlyArray<readonly [string, string]> = [
      ["", "Empty"],
      [" llama", "SurroundingWhitespace"],
      ["llama\t", "SurroundingWhitespace"],
      ["\u3000llama", "SurroundingWhitespace"],
      ["llama\u2028", "SurroundingWhitespace"],
      ["lla\udc00ma", "NotUnicode"]
    ]
    for (const [value, reason] of cases) {
      const model = leftOf(validateCanonicalModelId(value))
      expect(model).toBeInstanceOf(InvalidModelName)
      expect(model.reason).toBe(reason)
      expect(model.field).toBe("model")
      expect(model.message).toContain(JSON.stringify(value))
      expect(model.message.startsWith("model ")).toBe(true)
      const alias = leftOf(validateModelAlias(value))
      expect(alias.field).toBe("alias")
      expect(alias.reason).toBe(reason)
    }
    expect(leftOf(validateCanonicalModelId(" x", "baseModel")).message).toBe(
      'baseModel " x" must not have leading or trailing whitespace'
    )
    expect(() => canonicalModelId("")).toThrow(InvalidModelName)
    expect(() => modelAlias(" chat")).toThrow(InvalidModelName)
  })
})

describe("ModelTarget", () => {
  it("is structurally equal and exposes the base in both variants", () => {
    expect(Equal.equals(base("llama"), base("llama"))).toBe(true)
    expect(Equal.equals(base("llama"), lora("llama", "tenant-a"))).toBe(false)
    expect(Equal.equals(lora("llama", "tenant-a"), lora("llama", "tenant-a"))).toBe(true)
    const target = lora("llama", "tenant-a")
    expect(target.baseModel).toBe("llama")
    expect(target._tag === "Lora" && target.adapter).toBe("tenant-a")
  })

  it("orders Base before Lora, then by base model, then by adapter", () => {
    const sorted = [lora("b", "x"), lora("a", "y"), base("b"), lora("a", "x"), base("a")].sort(
      compareModelTargets
    )
    expect(sorted).toEqual([base("a"), base("b"), lora("a", "x"), lora("a", "y"), lora("b", "x")])
  })
})

describe("CanonicalModelRegistration", () => {
  it("withTarget drops aliases equal to the model, sorts byte-wise and dedupes", () => {
    const registration = withTarget(m("llama"), base("llama"), [
      a("zeta"),
      a("llama"),
      a("chat"),
      a("é-chat"),
      a("Chat"),
      a("chat")
    ])
    expect(registration.aliases).toEqual(["Chat", "chat", "zeta", "é-chat"])
    expect(registration.model).toBe("llama")
  })

  it("baseRegistration targets the model itself", () => {
    const registration = baseRegistration(m("llama"), [a("chat")])
    expect(Equal.equals(registration.target, base("llama"))).toBe(true)
    expect(Equal.equals(registration, withTarget(m("llama"), base("llama"), [a("chat"), a("chat")]))).toBe(
      true
    )
    expect(registrationEquals(registration, baseRegistration(m("llama"), [a("chat")]))).toBe(true)
    expect(registrationEquals(registration, baseRegistration(m("llama"), []))).toBe(false)
  })

  it("orders by model, then target, then aliases", () => {
    const r1 = baseRegistration(m("a"), [a("x")])
    const r2 = baseRegistration(m("a"), [a("x"), a("y")])
    const r3 = baseRegistration(m("a"), [a("y")])
    const r4 = withTarget(m("a"), lora("a", "t"), [])
    const r5 = baseRegistration(m("b"))
    expect([r5, r4, r3, r2, r1].sort(compareRegistrations)).toEqual([r1, r2, r3, r4, r5])
  })
})

describe("validatePoolRegistrations", () => {
  const reject = (registrations: ReadonlyArray<CanonicalModelRegistration>) =>
    leftOf(validatePoolRegistrations(registrations))

  it("accepts one base model with aliases and its adapters", () => {
    const registrations = [
      baseRegistration(m("llama"), [a("chat")]),
      withTarget(m("tenant-a"), lora("llama", "tenant-a-v1"), [a("tenant")])
    ]
    expect(Either.getOrThrow(validatePoolRegistrations(registrations))).toBe(registrations)
  })

  it("rejects an empty list", () => {
    const error = reject([])
    expect(error).toBeInstanceOf(InvalidRegistrations)
    expect(error.reason).toBe("Empty")
  })

  it("rejects a duplicate model and a model with conflicting targets", () => {
    const duplicate = reject([baseRegistration(m("llama")), baseRegistration(m("llama"), [a("chat")])])
    expect(duplicate.reason).toBe("DuplicateModel")
    expect(duplicate.message).toBe('duplicate canonical model registration "llama"')
    const conflicting = reject([baseRegistration(m("llama")), withTarget(m("llama"), lora("base", "x"), [])])
    expect(conflicting.reason).toBe("ConflictingTargets")
    expect(conflicting.message).toContain('"llama"')
  })

  it("rejects an alias naming a canonical model of the pool", () => {
    const error = reject([baseRegistration(m("llama"), [a("mistral")]), baseRegistration(m("mistral"))])
    expect(error.reason).toBe("AliasIsModel")
    expect(error.alias).toBe("mistral")
    expect(error.message).toContain('"mistral"')
  })

  it("rejects one alias claimed by two models", () => {
    const error = reject([
      baseRegistration(m("llama"), [a("chat")]),
      baseRegistration(m("mistral"), [a("chat")])
    ])
    expect(error.reason).toBe("AliasClaimedTwice")
    expect(error.firstOwner).toBe("llama")
    expect(error.model).toBe("mistral")
    expect(error.message).toBe('model alias "chat" is claimed by both "llama" and "mistral" in the same pool')
  })

  it("allows a repeated alias of the same model", () => {
    const registration: CanonicalModelRegistration = {
      model: m("llama"),
      target: base("llama"),
      aliases: [a("chat"), a("chat")]
    }
    expect(Either.isRight(validatePoolRegistrations([registration]))).toBe(true)
  })
})

describe("KvQuerySemantics", () => {
  it("carries identity versions 1 and 2", () => {
    const standard = Either.getOrThrow(KvQuerySemantics.make(64, "dynamo_standard_v1"))
    const eagle = Either.getOrThrow(KvQuerySemantics.make(64, "dynamo_eagle_v1"))
    expect(standard.identityVersion).toBe(1)
    expect(eagle.identityVersion).toBe(2)
    expect(hashFormatIdentityVersion("dynamo_eagle_v1")).toBe(2)
    expect(Equal.equals(standard, Either.getOrThrow(KvQuerySemantics.make(64, "dynamo_standard_v1")))).toBe(
      true
    )
    expect(Equal.equals(standard, eagle)).toBe(false)
  })

  it("rejects zero, non-u32 block sizes and unknown formats", () => {
    const zero = leftOf(KvQuerySemantics.make(0, "dynamo_standard_v1"))
    expect(zero._tag).toBe("ZeroBlockSize")
    expect(zero.message).toBe("kvBlockSize must be greater than zero")
    for (const size of [-16, 2.5, 2 ** 32, Number.NaN]) {
      const error = leftOf(KvQuerySemantics.make(size, "dynamo_standard_v1"))
      expect(error._tag).toBe("InvalidQuerySemantics")
      expect(error.message).toContain("kvBlockSize")
    }
    const format = leftOf(KvQuerySemantics.make(16, "dynamo_standard_v2"))
    expect(format._tag).toBe("InvalidQuerySemantics")
    expect(format.message).toContain('"dynamo_standard_v2"')
  })
})

describe("WorkerRole", () => {
  it("orders prefill, decode, encode, aggregated, legacy", () => {
    expect(WORKER_ROLES).toEqual(["prefill", "decode", "encode", "aggregated", "legacy"])
    const roles: Array<WorkerRole> = ["legacy", "aggregated", "prefill", "encode", "decode"]
    expect(roles.sort(compareWorkerRoles)).toEqual([...WORKER_ROLES])
  })

  it("maps worker types 1:1 and an absent type to legacy", () => {
    expect(roleFromWorkerType("prefill")).toBe("prefill")
    expect(roleFromWorkerType("decode")).toBe("decode")
    expect(roleFromWorkerType("encode")).toBe("encode")
    expect(roleFromWorkerType("aggregated")).toBe("aggregated")
    expect(roleFromWorkerType(null)).toBe("legacy")
    expect(roleFromWorkerType(undefined)).toBe("legacy")
  })
})

describe("EndpointId", () => {
  it("parses and displays namespace.component.endpoint", () => {
    const id = Either.getOrThrow(EndpointId.parse("prod.backend.generate"))
    expect([id.namespace, id.component, id.endpoint]).toEqual(["prod", "backend", "generate"])
    expect(id.toString()).toBe("prod.backend.generate")
    expect(`${id}`).toBe("prod.backend.generate")
    expect(
      Equal.equals(id, new EndpointId({ namespace: "prod", component: "backend", endpoint: "generate" }))
    ).toBe(true)
  })

  it("rejects texts that are not three non-empty parts", () => {
    expect(leftOf(EndpointId.parse("prod.backend")).reason).toBe("Format")
    expect(leftOf(EndpointId.parse("a.b.c.d")).reason).toBe("Format")
    expect(leftOf(EndpointId.parse("")).reason).toBe("Format")
    const empty = leftOf(EndpointId.parse("prod..generate"))
    expect(empty.reason).toBe("EmptyPart")
    expect(empty.part).toBe("component")
    expect(empty.message).toBe("endpoint component must not be empty")
    const dotted = leftOf(EndpointId.make("prod.eu", "backend", "generate"))
    expect(dotted.reason).toBe("DotInPart")
    expect(dotted.message).toContain('"prod.eu"')
    expect(leftOf(EndpointId.parse("a.b.c.")).message).toContain('"a.b.c."')
  })

  it("orders by namespace, component, endpoint", () => {
    const ids = ["b.a.a", "a.b.a", "a.a.b", "a.a.a"].map((t) => Either.getOrThrow(EndpointId.parse(t)))
    expect(ids.sort(compareEndpointIds).map(String)).toEqual(["a.a.a", "a.a.b", "a.b.a", "b.a.a"])
  })
})

describe("DcPoolDescriptor", () => {
  const servingEndpoint = Either.getOrThrow(EndpointId.parse("prod.router.generate"))
  const resolved = Either.getOrThrow(
    resolveIndexerDomain(
      { sourcePath: "meta/llama", kvCacheBlockSize: 512, runtimeConfig: { enableEagle: false } },
      servingEndpoint
    )
  )
  const producer = new ProducerIdentity(
    new PoolId(resolved.id, stableDcId("test-dc")),
    7n,
    1n,
    new DcCkfFormatIdentity(0x5deece66d1b54a33n, 1024)
  )
  const fields = {
    producer,
    servingEndpoint,
    registrations: [baseRegistration(m("llama"), [a("chat")])],
    querySemantics: resolved.querySemantics,
    poolRoles: ["prefill", "decode"] as ReadonlyArray<WorkerRole>
  }

  it("builds a valid descriptor whose pool id is the producer's", () => {
    const descriptor = Either.getOrThrow(makePoolDescriptor(fields))
    expect(poolIdOf(descriptor).equals(producer.poolId)).toBe(true)
    expect(poolDescriptorEquals(descriptor, { ...fields })).toBe(true)
    expect(poolDescriptorEquals(descriptor, { ...fields, poolRoles: ["decode", "prefill"] })).toBe(false)
  })

  it("rejects empty and duplicate roles", () => {
    const empty = leftOf(makePoolDescriptor({ ...fields, poolRoles: [] }))
    expect(empty._tag).toBe("InvalidPoolDescriptor")
    expect(empty.message).toBe("poolRoles must not be empty")
    const duplicate = leftOf(makePoolDescriptor({ ...fields, poolRoles: ["decode", "prefill", "decode"] }))
    expect(duplicate._tag).toBe("InvalidPoolDescriptor")
    expect(duplicate.message).toContain('"decode"')
  })

  it("applies the registration rules", () => {
    const error = leftOf(makePoolDescriptor({ ...fields, registrations: [] }))
    expect(error._tag).toBe("InvalidRegistrations")
  })
})

describe("DcRelayIdentity", () => {
  it("is structurally equal", () => {
    const relay = new DcRelayIdentity({ drtInstanceId: 1n, relayIncarnation: 2n })
    expect(Equal.equals(relay, new DcRelayIdentity({ drtInstanceId: 1n, relayIncarnation: 2n }))).toBe(true)
    expect(Equal.equals(relay, new DcRelayIdentity({ drtInstanceId: 1n, relayIncarnation: 3n }))).toBe(false)
  })
})
