import { it as effectIt } from "@effect/vitest"
import { Effect, Either } from "effect"
import { blake3 as blake3Oracle } from "hash-wasm"
import { describe, expect, it } from "vitest"
import {
  cacheSemanticsId,
  deriveCacheSemanticsId,
  deriveRoutingScopeId,
  deriveStableDcId,
  type IndexerCard,
  InvalidDcName,
  InvalidIdentityMaterial,
  resolvedIndexerDomainEquals,
  resolveIndexerDomain,
  routingScopeId,
  stableDcId,
  validateExplicitMap
} from "../../src/protocol/Identity.js"
import { EndpointId, ZeroBlockSize } from "../../src/protocol/Model.js"

const GOLDEN_CACHE = "7d31eb9019357572470605f4a8be687e"
const GOLDEN_ROUTING = "18270d3ba03effaec8d167ba02c7752d"

const endpoint = (text: string): EndpointId => Either.getOrThrow(EndpointId.parse(text))

const card = (overrides: Partial<IndexerCard> = {}): IndexerCard => ({
  sourcePath: "meta/llama",
  kvCacheBlockSize: 512,
  indexerIdentity: null,
  runtimeConfig: { enableEagle: false },
  ...overrides
})

const leftOf = <A, E>(either: Either.Either<A, E>): E => {
  if (Either.isRight(either)) throw new Error(`expected a failure, got ${String(either.right)}`)
  return either.left
}

// Independent encoder of the §1.2.2 material, hashed by a second BLAKE3 implementation.
const enc = new TextEncoder()
const u32 = (n: number) => Buffer.from(Uint32Array.of(n).buffer)
const framed = (s: string) => Buffer.concat([u32(enc.encode(s).length), Buffer.from(enc.encode(s))])
const oracle16 = async (parts: ReadonlyArray<Buffer>): Promise<string> =>
  (await blake3Oracle(Buffer.concat(parts))).slice(0, 32)
const byteOrder = (a: readonly [string, string], b: readonly [string, string]) =>
  Buffer.compare(Buffer.from(a[0]), Buffer.from(b[0]))

describe("stableDcId", () => {
  it("reproduces the reference vector", () => {
    const dc = stableDcId("test-dc")
    expect(dc.hex).toBe("49861458b11c53ec")
    expect(dc.value).toBe(0x49861458b11c53ecn)
  })

  it("matches an independent BLAKE3 of tag ‖ framed(name), first 8 bytes little-endian", async () => {
    for (const name of ["dc-east", "数据中心", "a"]) {
      const digest = await blake3Oracle(Buffer.concat([Buffer.from("dynamo/indexer-dc/v1"), framed(name)]))
      expect(stableDcId(name).value).toBe(Buffer.from(digest, "hex").readBigUInt64LE(0))
    }
  })

  it("rejects empty names and surrounding whitespace with a typed error naming the value", () => {
    const cases: ReadonlyArray<readonly [string, string]> = [
      ["", "Empty"],
      [" dc", "SurroundingWhitespace"],
      ["dc\n", "SurroundingWhitespace"],
      ["\u00a0dc", "SurroundingWhitespace"],
      ["dc\u0085", "SurroundingWhitespace"],
      ["dc\ud800", "NotUnicode"]
    ]
    for (const [name, reason] of cases) {
      const error = leftOf(deriveStableDcId(name))
      expect(error).toBeInstanceOf(InvalidDcName)
      expect(error._tag).toBe("InvalidDcName")
      expect(error.reason).toBe(reason)
      expect(error.message).toContain(JSON.stringify(name))
    }
    expect(() => stableDcId(" dc ")).toThrow(InvalidDcName)
  })

  it("follows Rust's whitespace set: U+FEFF is not whitespace, inner blanks are fine", () => {
    expect(Either.isRight(deriveStableDcId("dc\ufeff"))).toBe(true)
    expect(Either.isRight(deriveStableDcId("dc east"))).toBe(true)
  })

  effectIt.effect("fails as an Effect when yielded", () =>
    Effect.gen(function* () {
      const error = yield* Effect.flip(deriveStableDcId(""))
      expect(error._tag).toBe("InvalidDcName")
    })
  )
})

describe("default derivation", () => {
  it("reproduces the golden cache semantics and routing scope", () => {
    const cache = cacheSemanticsId({
      defaults: ["meta/llama"],
      kvBlockSize: 512,
      hashFormat: "dynamo_standard_v1"
    })
    const routing = routingScopeId({ defaults: ["prod", "router", "generate"] })
    expect(cache.hex).toBe(GOLDEN_CACHE)
    expect(cache.source).toBe("default_derived")
    expect(cache.digest.length).toBe(16)
    expect(routing.hex).toBe(GOLDEN_ROUTING)
    expect(routing.source).toBe("default_derived")
  })

  it("resolveIndexerDomain reproduces the golden vector", () => {
    const resolved = Either.getOrThrow(resolveIndexerDomain(card(), endpoint("prod.router.generate")))
    expect(resolved.id.toString()).toBe(`${GOLDEN_CACHE}:${GOLDEN_ROUTING}`)
    expect(resolved.id.reliesOnDefaults).toBe(true)
    expect(resolved.querySemantics.kvBlockSize).toBe(512)
    expect(resolved.querySemantics.hashFormat).toBe("dynamo_standard_v1")
  })

  it("appends block size and hash format version to cache semantics only", async () => {
    const eagle = Either.getOrThrow(
      resolveIndexerDomain(card({ runtimeConfig: { enableEagle: true } }), endpoint("prod.router.generate"))
    )
    expect(eagle.querySemantics.hashFormat).toBe("dynamo_eagle_v1")
    expect(eagle.querySemantics.identityVersion).toBe(2)
    expect(eagle.id.cacheSemantics.hex).not.toBe(GOLDEN_CACHE)
    expect(eagle.id.routingScope.hex).toBe(GOLDEN_ROUTING)
    const expected = await oracle16([
      framed("dynamo/indexer-cache-semantics/default/v1"),
      u32(1),
      framed("meta/llama"),
      u32(512),
      Buffer.from([2, 0])
    ])
    expect(eagle.id.cacheSemantics.hex).toBe(expected)

    const bigger = cacheSemanticsId({
      defaults: ["meta/llama"],
      kvBlockSize: 64,
      hashFormat: "dynamo_standard_v1"
    })
    expect(bigger.hex).not.toBe(GOLDEN_CACHE)
  })

  it("gives different endpoints different routing scopes, framing included", () => {
    const scopes = [
      ["prod", "router", "generate"],
      ["prod", "router", "generate2"],
      ["staging", "router", "generate"],
      ["prod", "routergenerate", ""],
      ["prodr", "outer", "generate"],
      ["prod", "router"]
    ].map((defaults) => routingScopeId({ defaults }).hex)
    expect(new Set(scopes).size).toBe(scopes.length)
  })

  it("rejects ill-formed Unicode in defaults", () => {
    const error = leftOf(deriveRoutingScopeId({ defaults: ["prod", "\udc00", "x"] }))
    expect(error).toBeInstanceOf(InvalidIdentityMaterial)
    expect(error.field).toBe("defaults")
  })
})

describe("explicit derivation", () => {
  const entries: ReadonlyArray<readonly [string, string]> = [
    ["tokenizer", "llama-3"],
    ["Z-upper", "1"],
    ["émoji-😀", "2"],
    ["\uffff-last-bmp", "3"],
    // UTF-16 puts this surrogate pair before U+FFFF; UTF-8 (and Rust's BTreeMap) after it.
    ["😀", "5"],
    ["a", "4"]
  ]

  it("hashes entries in ascending UTF-8 byte order under the explicit tag", async () => {
    const sorted = [...entries].sort(byteOrder)
    const selected = [u32(sorted.length), ...sorted.flatMap(([k, v]) => [framed(k), framed(v)])]
    const expectedRouting = await oracle16([framed("dynamo/indexer-routing-scope/explicit/v1"), ...selected])
    const expectedCache = await oracle16([
      framed("dynamo/indexer-cache-semantics/explicit/v1"),
      ...selected,
      u32(512),
      Buffer.from([1, 0])
    ])
    const routing = routingScopeId({ defaults: [], explicit: new Map(entries) })
    expect(routing.hex).toBe(expectedRouting)
    expect(routing.source).toBe("explicit")
    const cache = cacheSemanticsId({
      defaults: ["ignored"],
      explicit: Object.fromEntries(entries),
      kvBlockSize: 512,
      hashFormat: "dynamo_standard_v1"
    })
    expect(cache.hex).toBe(expectedCache)
    expect(cache.source).toBe("explicit")
  })

  it("does not depend on the input order of the map", () => {
    const forward = routingScopeId({ defaults: [], explicit: new Map(entries) })
    const backward = routingScopeId({ defaults: [], explicit: new Map([...entries].reverse()) })
    const record = routingScopeId({ defaults: [], explicit: Object.fromEntries([...entries].reverse()) })
    expect(backward.equals(forward)).toBe(true)
    expect(record.equals(forward)).toBe(true)
  })

  it("ignores defaults when an explicit map exists", () => {
    const a = routingScopeId({ defaults: ["prod", "a", "generate"], explicit: { scope: "shared" } })
    const b = routingScopeId({ defaults: ["prod", "b", "generate"], explicit: { scope: "shared" } })
    expect(a.equals(b)).toBe(true)
  })

  it("never aliases default material: tags differ even for the same selected bytes", () => {
    // One default "k" and one explicit entry have different selected bytes; compare equal-shaped
    // material instead: the explicit digest differs from the same bytes under the default tag.
    const explicit = routingScopeId({ defaults: [], explicit: { k: "v" } })
    const defaultsLikeEntries = routingScopeId({ defaults: ["k", "v"] })
    expect(explicit.hex).not.toBe(defaultsLikeEntries.hex)
    expect(explicit.compareTo(defaultsLikeEntries)).not.toBe(0)
    const cacheDefault = cacheSemanticsId({
      defaults: ["k"],
      kvBlockSize: 16,
      hashFormat: "dynamo_standard_v1"
    })
    const cacheExplicit = cacheSemanticsId({
      defaults: ["k"],
      explicit: { k: "v" },
      kvBlockSize: 16,
      hashFormat: "dynamo_standard_v1"
    })
    expect(cacheExplicit.hex).not.toBe(cacheDefault.hex)
    expect(cacheExplicit.equals(cacheDefault)).toBe(false)
  })

  it("keeps block size and format in explicit cache semantics", () => {
    const at = (kvBlockSize: number, eagle: boolean) =>
      cacheSemanticsId({
        defaults: [],
        explicit: { model: "llama" },
        kvBlockSize,
        hashFormat: eagle ? "dynamo_eagle_v1" : "dynamo_standard_v1"
      }).hex
    expect(new Set([at(16, false), at(32, false), at(16, true)]).size).toBe(3)
  })

  it("resolves explicit maps carried on the card", () => {
    const resolved = Either.getOrThrow(
      resolveIndexerDomain(
        card({ indexerIdentity: { semantics: { model: "llama" }, routingScope: { fleet: "a" } } }),
        endpoint("prod.router.generate")
      )
    )
    expect(resolved.id.cacheSemantics.source).toBe("explicit")
    expect(resolved.id.routingScope.source).toBe("explicit")
    expect(resolved.id.reliesOnDefaults).toBe(false)

    const semanticsOnly = Either.getOrThrow(
      resolveIndexerDomain(
        card({ indexerIdentity: { semantics: { model: "llama" } } }),
        endpoint("prod.router.generate")
      )
    )
    expect(semanticsOnly.id.cacheSemantics.source).toBe("explicit")
    expect(semanticsOnly.id.routingScope.hex).toBe(GOLDEN_ROUTING)
    expect(semanticsOnly.id.reliesOnDefaults).toBe(true)
    expect(resolvedIndexerDomainEquals(semanticsOnly, resolved)).toBe(false)
    expect(resolvedIndexerDomainEquals(resolved, resolved)).toBe(true)
  })
})

describe("validation", () => {
  const material = (field: string, map: ReadonlyMap<string, string> | Record<string, string>) =>
    leftOf(validateExplicitMap(field, map))

  it("limits explicit maps to 1..=32 entries", () => {
    expect(material("semantics", {}).reason).toBe("NoEntries")
    const many = Object.fromEntries(Array.from({ length: 33 }, (_, i) => [`k${i}`, "v"]))
    const tooMany = material("semantics", many)
    expect(tooMany.reason).toBe("TooManyEntries")
    expect(tooMany.count).toBe(33)
    expect(tooMany.message).toContain("semantics")
    expect(tooMany.message).toContain("33")
    const exactly32 = Object.fromEntries(Array.from({ length: 32 }, (_, i) => [`k${i}`, "v"]))
    expect(Either.isRight(validateExplicitMap("semantics", exactly32))).toBe(true)
  })

  it("limits keys to 1..=128 and values to 1..=1024 bytes of UTF-8", () => {
    expect(material("routingScope", { "": "v" }).reason).toBe("EmptyKey")
    const longKey = "é".repeat(65) // 130 bytes in 65 UTF-16 units
    const keyError = material("routingScope", { [longKey]: "v" })
    expect(keyError.reason).toBe("KeyTooLong")
    expect(keyError.count).toBe(130)
    expect(keyError.message).toContain("routingScope")
    expect(Either.isRight(validateExplicitMap("routingScope", { ["k".repeat(128)]: "v" }))).toBe(true)

    const emptyValue = material("semantics", { model: "" })
    expect(emptyValue.reason).toBe("EmptyValue")
    expect(emptyValue.message).toBe('semantics["model"] must not be empty')
    const valueError = material("semantics", { model: "€".repeat(342) }) // 1026 bytes
    expect(valueError.reason).toBe("ValueTooLong")
    expect(valueError.key).toBe("model")
    expect(Either.isRight(validateExplicitMap("semantics", { model: "v".repeat(1024) }))).toBe(true)

    expect(material("semantics", { model: "\ud800" }).reason).toBe("NotUnicode")
  })

  it("surfaces map errors from every entry point with the field named", () => {
    const routing = leftOf(deriveRoutingScopeId({ defaults: [], explicit: new Map() }))
    expect(routing).toBeInstanceOf(InvalidIdentityMaterial)
    expect(routing.field).toBe("routingScope")
    expect(() => routingScopeId({ defaults: [], explicit: {} })).toThrow(InvalidIdentityMaterial)

    const cache = leftOf(
      deriveCacheSemanticsId({
        defaults: [],
        explicit: {},
        kvBlockSize: 16,
        hashFormat: "dynamo_standard_v1"
      })
    )
    expect(cache._tag).toBe("InvalidIdentityMaterial")
    expect(cache.message).toContain("semantics")

    const fromCard = leftOf(
      resolveIndexerDomain(card({ indexerIdentity: { routingScope: { "": "x" } } }), endpoint("a.b.c"))
    )
    expect(fromCard._tag).toBe("InvalidIdentityMaterial")
  })

  it("reports a zero block size as ZeroBlockSize before any map problem", () => {
    const error = leftOf(
      resolveIndexerDomain(
        card({ kvCacheBlockSize: 0, indexerIdentity: { semantics: {} } }),
        endpoint("a.b.c")
      )
    )
    expect(error).toBeInstanceOf(ZeroBlockSize)
    expect(error.message).toBe("kvCacheBlockSize must be greater than zero")
    expect(() =>
      cacheSemanticsId({ defaults: ["x"], kvBlockSize: 0, hashFormat: "dynamo_standard_v1" })
    ).toThrow(ZeroBlockSize)
  })

  it("rejects block sizes that are not a u32", () => {
    for (const kvBlockSize of [1.5, -1, 2 ** 32]) {
      const error = leftOf(
        deriveCacheSemanticsId({ defaults: ["x"], kvBlockSize, hashFormat: "dynamo_standard_v1" })
      )
      expect(error._tag).toBe("InvalidQuerySemantics")
      expect(error.message).toContain(String(kvBlockSize))
    }
    expect(
      Either.isRight(
        deriveCacheSemanticsId({
          defaults: ["x"],
          kvBlockSize: 2 ** 32 - 1,
          hashFormat: "dynamo_standard_v1"
        })
      )
    ).toBe(true)
  })
})
