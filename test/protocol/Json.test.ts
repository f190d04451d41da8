import { Either, Equal, type Schema } from "effect"
import fc from "fast-check"
import { describe, expect, it } from "vitest"
import { DcCkfFormatIdentity, type PoolId, ProducerIdentity } from "../../src/ckf/identity.js"
import {
  DiscoveryDocumentJson,
  KvEventSourceJson,
  ModelCardInstanceJson
} from "../../src/protocol/Discovery.js"
import {
  BucketCount,
  CkfFormatJson,
  IndexerDomainJson,
  PoolIdJson,
  ProducerIdentityJson,
  resolveIndexerDomain
} from "../../src/protocol/Identity.js"
import {
  DcIdHex,
  Digest,
  decodeJson,
  decodeJsonText,
  encodeJson,
  encodeJsonText,
  JsonDecodeError,
  nestedDeeperThan,
  U32,
  U64,
  WorkerIdJson
} from "../../src/protocol/Json.js"
import {
  EndpointId,
  EndpointIdJson,
  ModelTargetJson,
  QuerySemanticsJson,
  RegistrationJson
} from "../../src/protocol/Model.js"
import {
  CatalogSnapshotJson,
  ErrorBodyJson,
  HealthJson,
  PoolDescriptorJson,
  RelayInfoJson,
  SubscribeRequestJson
} from "../../src/protocol/RelayApi.js"

const GOLDEN_POOL_TEXT =
  '{"identityVersion":1,' +
  '"cacheSemantics":{"digest":"7d31eb9019357572470605f4a8be687e","source":"default_derived"},' +
  '"routingScope":{"digest":"18270d3ba03effaec8d167ba02c7752d","source":"default_derived"},' +
  '"dcId":"49861458b11c53ec"}'

const FORMAT = {
  formatVersion: 1,
  seed: "6768574230984739379",
  bucketCount: 524288,
  fingerprintBits: 16,
  slotsPerBucket: 4
}

const poolJson = (routingDigest = "18270d3ba03effaec8d167ba02c7752d") => ({
  identityVersion: 1,
  cacheSemantics: { digest: "7d31eb9019357572470605f4a8be687e", source: "default_derived" },
  routingScope: { digest: routingDigest, source: "explicit" },
  dcId: "49861458b11c53ec"
})

const producerJson = (routingDigest?: string) => ({
  poolId: poolJson(routingDigest),
  producerIncarnation: "18446744073709551615",
  layoutGeneration: "1",
  format: FORMAT
})

const descriptorJson = (routingDigest?: string) => ({
  producer: producerJson(routingDigest),
  servingEndpoint: { namespace: "prod", component: "router", endpoint: "generate" },
  registrations: [
    { model: "llama", target: { base: { baseModel: "llama" } }, aliases: ["chat", "llama-3"] },
    { model: "tenant-a", target: { lora: { baseModel: "llama", adapter: "tenant-a-v1" } }, aliases: [] }
  ],
  querySemantics: { kvBlockSize: 512, hashFormat: "dynamo_standard_v1", addressing: "canonical_v1" },
  poolRoles: ["prefill", "decode"]
})

const catalogJson = () => ({
  protocolVersion: 1,
  relay: { drtInstanceId: "7", relayIncarnation: "9007199254740993" },
  revision: "42",
  pools: [
    descriptorJson("00000000000000000000000000000001"),
    descriptorJson("00000000000000000000000000000002")
  ]
})

/** The PROTOCOL.md §2 examples. */
const cardJson = () => ({
  namespace: "prod",
  component: "backend",
  endpoint: "generate",
  instanceId: "7001",
  modelSuffix: null,
  card: {
    name: "llama",
    sourcePath: "meta/llama",
    kvCacheBlockSize: 64,
    aliases: ["chat"],
    workerType: "aggregated",
    lora: null,
    indexerIdentity: null,
    runtimeConfig: {
      dataParallelStartRank: 0,
      dataParallelSize: 1,
      enableLocalIndexer: true,
      kvStateEndpoint: null,
      enableEagle: false,
      totalKvBlocks: "1000",
      maxNumBatchedTokens: "8192",
      maxNumSeqs: null,
      contextLength: null
    }
  }
})

const adapterCardJson = () => ({
  ...cardJson(),
  modelSuffix: "tenant-a",
  card: {
    ...cardJson().card,
    name: "tenant-a",
    lora: { name: "tenant-a-v1", maxGpuLoraCount: 4 },
    indexerIdentity: { semantics: { model: "llama" }, routingScope: { fleet: "a" } },
    runtimeConfig: { ...cardJson().card.runtimeConfig, kvStateEndpoint: "prod.backend.kv" }
  }
})

const dynamoSourceJson = () => ({
  kvStateEndpoint: "prod.backend.generate",
  workerId: "7001",
  dpRank: 0,
  publisherId: "123456789",
  transport: { kind: "dynamo-zmq", endpoint: "tcp://127.0.0.1:5557", topic: "kv-events" },
  recoveryTarget: { endpoint: "tcp://127.0.0.1:5600" }
})

const engineSourceJson = () => ({
  ...dynamoSourceJson(),
  transport: {
    kind: "engine-zmq",
    endpoint: "tcp://127.0.0.1:5557",
    topic: "",
    replayEndpoint: "tcp://127.0.0.1:5558"
  },
  recoveryTarget: null
})

const decoded = <A, I>(schema: Schema.Schema<A, I, never>, input: unknown): A => {
  const result = decodeJson(schema)(input)
  if (Either.isLeft(result)) throw new Error(`decode failed: ${result.left.message}`)
  return result.right
}

const rejection = <A, I>(schema: Schema.Schema<A, I, never>, input: unknown): string => {
  const result = decodeJson(schema)(input)
  if (Either.isRight(result)) throw new Error(`expected ${JSON.stringify(input)} to be rejected`)
  expect(result.left).toBeInstanceOf(JsonDecodeError)
  expect(result.left.message).not.toContain("\n")
  return result.left.message
}

const encoded = <A, I>(schema: Schema.Schema<A, I, never>, value: A): I =>
  Either.getOrThrowWith(encodeJson(schema)(value), (e) => new Error(e.message))

/** encode ∘ decode is the identity on a valid document. */
const roundTrips = <A, I>(schema: Schema.Schema<A, I, never>, document: unknown): A => {
  const value = decoded(schema, document)
  expect(encoded(schema, value)).toEqual(document)
  return value
}

const withField = (path: ReadonlyArray<string | number>, value: unknown, document: unknown): unknown => {
  const copy = structuredClone(document) as Record<string | number, unknown>
  let at = copy
  for (const key of path.slice(0, -1)) at = at[key] as Record<string | number, unknown>
  at[path[path.length - 1]!] = value
  return copy
}

describe("nesting", () => {
  it("rejects a value nested deeper than 64 levels with a short error, whatever its depth", () => {
    const decode = decodeJsonText(ModelCardInstanceJson)
    for (const depth of [65, 1000, 100_000]) {
      const result = decode(`${"[".repeat(depth)}${"]".repeat(depth)}`)
      expect(Either.isLeft(result) && result.left.message).toBe("the value is nested deeper than 64 levels")
    }
    // Nested inside a field too.
    const inField = decode(`{"namespace": ${"[".repeat(100_000)}${"]".repeat(100_000)}}`)
    expect(Either.isLeft(inField) && inField.left.message).toBe("the value is nested deeper than 64 levels")
  })

  it("measures depth iteratively", () => {
    const nest = (depth: number): unknown => {
      let value: unknown = 1
      for (let i = 0; i < depth; i++) value = i % 2 === 0 ? [value] : { a: value }
      return value
    }
    expect(nestedDeeperThan(nest(64), 64)).toBe(false)
    expect(nestedDeeperThan(nest(65), 64)).toBe(true)
    expect(nestedDeeperThan(nest(200_000), 64)).toBe(true)
    // Three levels of containers: the object, its array, the array's object.
    expect(nestedDeeperThan({ a: [1, { b: "x" }], c: null }, 3)).toBe(false)
    expect(nestedDeeperThan({ a: [1, { b: "x" }], c: null }, 2)).toBe(true)
  })
})

describe("U64", () => {
  it("decodes canonical decimal text and safe JSON numbers", () => {
    expect(decoded(U64, "0")).toBe(0n)
    expect(decoded(U64, "18446744073709551615")).toBe(18446744073709551615n)
    expect(decoded(U64, 42)).toBe(42n)
    expect(decoded(U64, 2 ** 53)).toBe(9007199254740992n)
    expect(encoded(U64, 9007199254740993n)).toBe("9007199254740993")
  })

  it("rejects negative, oversized and non-canonical values, naming the value", () => {
    for (const text of [
      "01",
      "+1",
      "-1",
      "1.0",
      "1e3",
      " 1",
      "1 ",
      "",
      "0x10",
      "18446744073709551616",
      "١"
    ]) {
      expect(rejection(U64, text)).toContain(JSON.stringify(text))
    }
    for (const n of [-1, 1.5, 2 ** 53 + 2, Number.POSITIVE_INFINITY]) {
      expect(rejection(U64, n)).toContain(String(n))
    }
    expect(rejection(U64, true)).toContain("true")
    expect(rejection(U64, null)).toContain("null")
  })

  it("refuses to encode values outside u64", () => {
    expect(Either.isLeft(encodeJson(U64)(-1n))).toBe(true)
    expect(Either.isLeft(encodeJson(U64)(2n ** 64n))).toBe(true)
  })

  it("round-trips every u64", () => {
    fc.assert(
      fc.property(fc.bigInt({ min: 0n, max: 2n ** 64n - 1n }), (value) => {
        const json = encoded(U64, value)
        expect(json).toBe(value.toString())
        expect(decoded(U64, json)).toBe(value)
      })
    )
  })
})

describe("scalars", () => {
  it("decodes worker ids to canonical decimal strings", () => {
    expect(decoded(WorkerIdJson, 7001)).toBe("7001")
    expect(decoded(WorkerIdJson, "18446744073709551615")).toBe("18446744073709551615")
    expect(rejection(WorkerIdJson, "007")).toContain('"007"')
    expect(encoded(WorkerIdJson, "7001")).toBe("7001")
    expect(Either.isLeft(encodeJson(WorkerIdJson)("007"))).toBe(true)
  })

  it("checks u32 numbers", () => {
    expect(decoded(U32, 4294967295)).toBe(4294967295)
    expect(rejection(U32, 4294967296)).toContain("4294967296")
    expect(rejection(U32, -1)).toContain("-1")
  })

  it("checks dc ids and digests for length and lowercase hex", () => {
    expect(decoded(DcIdHex, "49861458b11c53ec").value).toBe(0x49861458b11c53ecn)
    expect(rejection(DcIdHex, "49861458B11C53EC")).toContain('"49861458B11C53EC"')
    expect(rejection(DcIdHex, "49861458b11c53e")).toContain("16 lowercase hex")
    expect(decoded(Digest, "7d31eb9019357572470605f4a8be687e")).toBe("7d31eb9019357572470605f4a8be687e")
    expect(rejection(Digest, "7d31eb9019357572470605f4a8be687")).toContain("32 lowercase hex")
    expect(rejection(Digest, "7d31eb9019357572470605f4a8be687e00")).toContain("32 lowercase hex")
    expect(rejection(Digest, "7D31EB9019357572470605F4A8BE687E")).toContain("7D31EB")
  })

  it("accepts only power-of-two bucket counts in 2..=2^24", () => {
    for (const n of [2, 4, 1024, 2 ** 24]) expect(decoded(BucketCount, n)).toBe(n)
    for (const n of [0, 1, 3, 6, 2 ** 25, 2.5]) expect(rejection(BucketCount, n)).toContain(`got ${n}`)
  })
})

describe("PoolId and ProducerIdentity", () => {
  const golden = Either.getOrThrow(
    resolveIndexerDomain(
      { sourcePath: "meta/llama", kvCacheBlockSize: 512, runtimeConfig: { enableEagle: false } },
      Either.getOrThrow(EndpointId.parse("prod.router.generate"))
    )
  )
  const goldenPool = decoded(PoolIdJson, JSON.parse(GOLDEN_POOL_TEXT))

  it("encodes the golden pool to the exact JSON text", () => {
    expect(goldenPool.indexerDomain.equals(golden.id)).toBe(true)
    expect(goldenPool.dcId.hex).toBe("49861458b11c53ec")
    expect(Either.getOrThrow(encodeJsonText(PoolIdJson)(goldenPool))).toBe(GOLDEN_POOL_TEXT)
  })

  it("encodes a producer identity to the exact JSON text", () => {
    const producer = new ProducerIdentity(
      goldenPool,
      12345678901234567890n,
      3n,
      new DcCkfFormatIdentity(0x5deece66d1b54a33n, 524288)
    )
    expect(Either.getOrThrow(encodeJsonText(ProducerIdentityJson)(producer))).toBe(
      `{"poolId":${GOLDEN_POOL_TEXT},"producerIncarnation":"12345678901234567890","layoutGeneration":"3",` +
        '"format":{"formatVersion":1,"seed":"6768574230984739379","bucketCount":524288,"fingerprintBits":16,"slotsPerBucket":4}}'
    )
    const back = Either.getOrThrow(
      decodeJsonText(ProducerIdentityJson)(Either.getOrThrow(encodeJsonText(ProducerIdentityJson)(producer)))
    )
    expect(back.equals(producer)).toBe(true)
  })

  it("round-trips pool ids, formats and producers", () => {
    const pool: PoolId = roundTrips(PoolIdJson, poolJson())
    expect(pool.indexerDomain.routingScope.source).toBe("explicit")
    roundTrips(CkfFormatJson, FORMAT)
    const producer = roundTrips(ProducerIdentityJson, producerJson())
    expect(producer.producerIncarnation).toBe(2n ** 64n - 1n)
    expect(producer.layoutGeneration).toBe(1n)
    roundTrips(IndexerDomainJson, {
      cacheSemantics: poolJson().cacheSemantics,
      routingScope: poolJson().routingScope
    })
  })

  it("accepts small u64 numbers on input and writes strings", () => {
    const producer = decoded(ProducerIdentityJson, {
      ...producerJson(),
      producerIncarnation: 5,
      layoutGeneration: 2
    })
    const json = encoded(ProducerIdentityJson, producer)
    expect(json.producerIncarnation).toBe("5")
    expect(json.layoutGeneration).toBe("2")
  })

  it("rejects wrong digests, versions, sources and unknown fields", () => {
    expect(rejection(PoolIdJson, withField(["cacheSemantics", "digest"], "7d31", poolJson()))).toContain(
      'cacheSemantics.digest: expected a digest of 32 lowercase hex digits, got "7d31"'
    )
    expect(rejection(PoolIdJson, withField(["identityVersion"], 2, poolJson()))).toContain("identityVersion")
    expect(rejection(PoolIdJson, withField(["routingScope", "source"], "derived", poolJson()))).toContain(
      "routingScope.source"
    )
    expect(rejection(PoolIdJson, withField(["extra"], 1, poolJson()))).toBe('unknown field "extra"')
    expect(rejection(PoolIdJson, withField(["cacheSemantics", "hex"], "x", poolJson()))).toBe(
      'unknown field "cacheSemantics.hex"'
    )
    const { dcId: _, ...missing } = poolJson()
    expect(rejection(PoolIdJson, missing)).toBe('missing field "dcId"')
  })

  it("rejects layoutGeneration 0 and bad formats", () => {
    expect(rejection(ProducerIdentityJson, withField(["layoutGeneration"], "0", producerJson()))).toContain(
      "layoutGeneration must not be 0"
    )
    expect(
      rejection(ProducerIdentityJson, withField(["format", "bucketCount"], 3, producerJson()))
    ).toContain("format.bucketCount: bucketCount must be a power of two in 2..=16777216, got 3")
    expect(
      rejection(ProducerIdentityJson, withField(["format", "fingerprintBits"], 8, producerJson()))
    ).toContain("format.fingerprintBits")
    expect(rejection(ProducerIdentityJson, withField(["format", "seed"], "-1", producerJson()))).toContain(
      '"-1"'
    )
    expect(
      rejection(ProducerIdentityJson, withField(["producerIncarnation"], "01", producerJson()))
    ).toContain("producerIncarnation: expected a u64 as canonical decimal text")
  })

  it("refuses to encode a format that has no JSON form", () => {
    const result = encodeJson(CkfFormatJson)(new DcCkfFormatIdentity(1n, 3))
    expect(Either.isLeft(result) && result.left.message).toContain("no JSON form")
  })
})

describe("descriptors", () => {
  it("round-trips endpoints, targets, registrations and query semantics", () => {
    const endpoint = roundTrips(EndpointIdJson, {
      namespace: "prod",
      component: "router",
      endpoint: "generate"
    })
    expect(endpoint).toBeInstanceOf(EndpointId)
    expect(roundTrips(ModelTargetJson, { base: { baseModel: "llama" } })._tag).toBe("Base")
    expect(roundTrips(ModelTargetJson, { lora: { baseModel: "llama", adapter: "t" } })._tag).toBe("Lora")
    roundTrips(RegistrationJson, descriptorJson().registrations[0])
    expect(
      roundTrips(QuerySemanticsJson, {
        kvBlockSize: 16,
        hashFormat: "dynamo_eagle_v1",
        addressing: "canonical_v1"
      }).identityVersion
    ).toBe(2)
  })

  it("marks query semantics as canonically addressed, and refuses any other addressing", () => {
    // Absent is canonical (PROTOCOL revision 2 has no other addressing); encoding always says so.
    const plain = decoded(QuerySemanticsJson, { kvBlockSize: 16, hashFormat: "dynamo_standard_v1" })
    expect(encoded(QuerySemanticsJson, plain)).toEqual({
      kvBlockSize: 16,
      hashFormat: "dynamo_standard_v1",
      addressing: "canonical_v1"
    })
    expect(
      rejection(QuerySemanticsJson, {
        kvBlockSize: 16,
        hashFormat: "dynamo_standard_v1",
        addressing: "engine"
      })
    ).toMatch(/addressing "engine" is not "canonical_v1".*token queries/)
    expect(
      rejection(
        PoolDescriptorJson,
        withField(["querySemantics", "addressing"], "engine_v1", descriptorJson())
      )
    ).toContain("querySemantics.addressing")
  })

  it("normalizes registration aliases on decode", () => {
    const registration = decoded(RegistrationJson, {
      model: "llama",
      target: { base: { baseModel: "llama" } },
      aliases: ["zeta", "llama", "chat", "zeta"]
    })
    expect(registration.aliases).toEqual(["chat", "zeta"])
  })

  it("rejects malformed endpoints, targets and semantics", () => {
    expect(
      rejection(EndpointIdJson, { namespace: "prod.eu", component: "router", endpoint: "generate" })
    ).toContain('namespace: endpoint namespace "prod.eu" must not contain "."')
    expect(rejection(EndpointIdJson, { namespace: "prod", component: "", endpoint: "generate" })).toContain(
      "component"
    )
    expect(
      rejection(ModelTargetJson, { base: { baseModel: "a" }, lora: { baseModel: "a", adapter: "b" } })
    ).toContain("exactly one")
    expect(rejection(ModelTargetJson, {})).toContain("exactly one")
    expect(rejection(ModelTargetJson, { Base: { base_model: "a" } })).toContain('unknown field "Base"')
    expect(rejection(ModelTargetJson, { lora: { baseModel: "a", adapter: "b", rank: 8 } })).toBe(
      'unknown field "lora.rank"'
    )
    expect(rejection(ModelTargetJson, { base: { baseModel: "llama " } })).toBe(
      'base.baseModel: model "llama " must not have leading or trailing whitespace'
    )
    expect(rejection(RegistrationJson, { ...descriptorJson().registrations[0], aliases: [""] })).toContain(
      'aliases[0]: alias "" must not be empty'
    )
    expect(rejection(QuerySemanticsJson, { kvBlockSize: 0, hashFormat: "dynamo_standard_v1" })).toContain(
      "kvBlockSize must be greater than zero"
    )
    expect(rejection(QuerySemanticsJson, { kvBlockSize: 16, hashFormat: "xxh3" })).toContain("hashFormat")
  })

  it("round-trips a pool descriptor", () => {
    const descriptor = roundTrips(PoolDescriptorJson, descriptorJson())
    expect(descriptor.producer).toBeInstanceOf(ProducerIdentity)
    expect(descriptor.servingEndpoint.toString()).toBe("prod.router.generate")
    expect(descriptor.registrations[1]!.target._tag).toBe("Lora")
    expect(descriptor.poolRoles).toEqual(["prefill", "decode"])
  })

  it("rejects empty or duplicate roles, unknown roles and invalid registrations", () => {
    expect(rejection(PoolDescriptorJson, withField(["poolRoles"], [], descriptorJson()))).toContain(
      "poolRoles must not be empty"
    )
    expect(
      rejection(PoolDescriptorJson, withField(["poolRoles"], ["decode", "decode"], descriptorJson()))
    ).toContain('poolRoles lists "decode" more than once')
    expect(rejection(PoolDescriptorJson, withField(["poolRoles"], ["worker"], descriptorJson()))).toContain(
      "poolRoles[0]"
    )
    const duplicate = withField(["registrations", 1], descriptorJson().registrations[0], descriptorJson())
    expect(rejection(PoolDescriptorJson, duplicate)).toContain(
      'duplicate canonical model registration "llama"'
    )
    const aliasClash = withField(["registrations", 1, "aliases"], ["chat"], descriptorJson())
    expect(rejection(PoolDescriptorJson, aliasClash)).toContain('model alias "chat" is claimed by both')
  })
})

describe("relay documents", () => {
  it("round-trips a catalog snapshot", () => {
    const catalog = roundTrips(CatalogSnapshotJson, catalogJson())
    expect(catalog.revision).toBe(42n)
    expect(catalog.relay.relayIncarnation).toBe(9007199254740993n)
    expect(catalog.pools).toHaveLength(2)
    const empty = roundTrips(CatalogSnapshotJson, { ...catalogJson(), pools: [] })
    expect(empty.pools).toEqual([])
  })

  it("rejects a repeated pool, another protocol version and unknown fields", () => {
    const repeated = { ...catalogJson(), pools: [descriptorJson(), descriptorJson()] }
    expect(rejection(CatalogSnapshotJson, repeated)).toContain("more than once")
    expect(rejection(CatalogSnapshotJson, { ...catalogJson(), protocolVersion: 2 })).toContain(
      "protocolVersion"
    )
    expect(rejection(CatalogSnapshotJson, { ...catalogJson(), watermark: 1 })).toBe(
      'unknown field "watermark"'
    )
    expect(
      rejection(CatalogSnapshotJson, withField(["pools", 1, "producer", "poolId", "dc"], "x", catalogJson()))
    ).toBe('unknown field "pools[1].producer.poolId.dc"')
    expect(rejection(CatalogSnapshotJson, { ...catalogJson(), revision: "042" })).toContain('"042"')
  })

  it("round-trips relay info, error bodies, health and subscribe requests", () => {
    const info = roundTrips(RelayInfoJson, {
      protocolVersion: 1,
      relay: { drtInstanceId: "1", relayIncarnation: "2" },
      dcName: "test-dc",
      dcId: "49861458b11c53ec"
    })
    expect(info.dcId.hex).toBe("49861458b11c53ec")
    roundTrips(ErrorBodyJson, { reason: "PRODUCER_CHANGED", message: "layout generation 2 replaced 1" })
    roundTrips(HealthJson, {
      healthy: true,
      shuttingDown: false,
      endpointCount: 2,
      activeEndpointCount: 1,
      fencedEndpointCount: 0,
      sourcesRecovering: 0,
      sourcesDegraded: 0,
      sources: { expected: 3, connecting: 1, live: 1, recovering: 0, degraded: 0, rejected: 1 },
      discovery: { state: "stale", since: "2026-05-01T12:34:56.789Z" }
    })
    const request = roundTrips(SubscribeRequestJson, {
      subscriberId: "global-1",
      expectedProducer: producerJson()
    })
    expect(request.expectedProducer).toBeInstanceOf(ProducerIdentity)
  })

  it("rejects bad relay names, error reasons and subscriber ids", () => {
    const info = {
      protocolVersion: 1,
      relay: { drtInstanceId: "1", relayIncarnation: "2" },
      dcName: " test-dc",
      dcId: "49861458b11c53ec"
    }
    expect(rejection(RelayInfoJson, info)).toContain('dcName: dc id " test-dc"')
    expect(rejection(ErrorBodyJson, { reason: "TEAPOT", message: "" })).toContain("reason")
    const subscribe = (subscriberId: string) => ({ subscriberId, expectedProducer: producerJson() })
    expect(rejection(SubscribeRequestJson, subscribe(""))).toContain("1..=128 bytes")
    expect(rejection(SubscribeRequestJson, subscribe("é".repeat(65)))).toContain("got 130")
    expect(rejection(SubscribeRequestJson, subscribe("a\u0007b"))).toContain("control characters")
    expect(decoded(SubscribeRequestJson, subscribe("x".repeat(128))).subscriberId).toHaveLength(128)
  })
})

describe("discovery records", () => {
  it("decodes and round-trips the PROTOCOL examples", () => {
    const card = roundTrips(ModelCardInstanceJson, cardJson())
    expect(card.instanceId).toBe("7001")
    expect(card.card.runtimeConfig.totalKvBlocks).toBe(1000n)
    const adapter = roundTrips(ModelCardInstanceJson, adapterCardJson())
    expect(adapter.card.lora?.maxGpuLoraCount).toBe(4)
    expect(adapter.card.runtimeConfig.kvStateEndpoint?.toString()).toBe("prod.backend.kv")
    const dynamo = roundTrips(KvEventSourceJson, dynamoSourceJson())
    expect(dynamo.publisherId).toBe(123456789n)
    expect(dynamo.workerId).toBe("7001")
    expect(
      Equal.equals(dynamo.kvStateEndpoint, Either.getOrThrow(EndpointId.parse("prod.backend.generate")))
    ).toBe(true)
    const engine = roundTrips(KvEventSourceJson, engineSourceJson())
    expect(engine.transport.kind === "engine-zmq" && engine.transport.replayEndpoint).toBe(
      "tcp://127.0.0.1:5558"
    )
    roundTrips(DiscoveryDocumentJson, {
      version: 1,
      cards: [cardJson(), adapterCardJson()],
      sources: [dynamoSourceJson(), engineSourceJson()]
    })
  })

  it("applies the documented defaults to absent fields", () => {
    const minimal = decoded(ModelCardInstanceJson, {
      namespace: "prod",
      component: "router",
      endpoint: "generate",
      instanceId: 7001,
      card: {
        name: "llama",
        sourcePath: "meta/llama",
        kvCacheBlockSize: 512,
        runtimeConfig: { enableEagle: true }
      }
    })
    expect(minimal.instanceId).toBe("7001")
    expect(minimal.modelSuffix).toBeNull()
    expect(minimal.card.aliases).toEqual([])
    expect(minimal.card.workerType).toBeNull()
    expect(minimal.card.lora).toBeNull()
    expect(minimal.card.indexerIdentity).toBeNull()
    expect(minimal.card.runtimeConfig).toEqual({
      dataParallelStartRank: 0,
      dataParallelSize: 1,
      enableLocalIndexer: true,
      kvStateEndpoint: null,
      enableEagle: true,
      totalKvBlocks: null,
      maxNumBatchedTokens: null,
      maxNumSeqs: null,
      contextLength: null
    })
    const noConfig = decoded(ModelCardInstanceJson, {
      ...cardJson(),
      card: { ...cardJson().card, runtimeConfig: undefined }
    })
    expect(noConfig.card.runtimeConfig.dataParallelSize).toBe(1)
    const source = decoded(KvEventSourceJson, {
      ...engineSourceJson(),
      transport: { kind: "engine-zmq", endpoint: "tcp://h:1", topic: "" },
      recoveryTarget: undefined
    })
    expect(source.recoveryTarget).toBeNull()
    expect(source.transport.kind === "engine-zmq" && source.transport.replayEndpoint).toBeNull()
  })

  it("feeds a decoded card into identity resolution", () => {
    const instance = decoded(ModelCardInstanceJson, {
      ...cardJson(),
      component: "router",
      card: { ...cardJson().card, kvCacheBlockSize: 512 }
    })
    const endpoint = Either.getOrThrow(
      EndpointId.make(instance.namespace, instance.component, instance.endpoint)
    )
    const resolved = Either.getOrThrow(resolveIndexerDomain(instance.card, endpoint))
    expect(resolved.id.toString()).toBe("7d31eb9019357572470605f4a8be687e:18270d3ba03effaec8d167ba02c7752d")

    const explicit = decoded(ModelCardInstanceJson, adapterCardJson())
    const explicitDomain = Either.getOrThrow(resolveIndexerDomain(explicit.card, endpoint))
    expect(explicitDomain.id.reliesOnDefaults).toBe(false)

    const zero = decoded(ModelCardInstanceJson, {
      ...cardJson(),
      card: { ...cardJson().card, kvCacheBlockSize: 0 }
    })
    const error = resolveIndexerDomain(zero.card, endpoint)
    expect(Either.isLeft(error) && error.left._tag).toBe("ZeroBlockSize")
  })

  it("rejects unknown fields with their full path", () => {
    expect(
      rejection(ModelCardInstanceJson, withField(["card", "runtimeConfig", "taints"], [], cardJson()))
    ).toBe('unknown field "card.runtimeConfig.taints"')
    expect(rejection(ModelCardInstanceJson, withField(["card", "model_type"], "chat", cardJson()))).toBe(
      'unknown field "card.model_type"'
    )
    const document = {
      version: 1,
      cards: [cardJson()],
      sources: [withField(["transport", "hwm"], 1, dynamoSourceJson())]
    }
    expect(rejection(DiscoveryDocumentJson, document)).toBe('unknown field "sources[0].transport.hwm"')
  })

  it("rejects malformed records", () => {
    expect(
      rejection(ModelCardInstanceJson, withField(["card", "workerType"], "router", cardJson()))
    ).toContain("card.workerType")
    expect(rejection(ModelCardInstanceJson, withField(["instanceId"], "-7", cardJson()))).toContain('"-7"')
    expect(
      rejection(ModelCardInstanceJson, withField(["card", "indexerIdentity"], { semantics: {} }, cardJson()))
    ).toBe("card.indexerIdentity: semantics must have 1..=32 entries, got 0")
    expect(
      rejection(
        ModelCardInstanceJson,
        withField(["card", "runtimeConfig", "kvStateEndpoint"], "prod.kv", cardJson())
      )
    ).toContain(
      'card.runtimeConfig.kvStateEndpoint: endpoint "prod.kv" must be "namespace.component.endpoint"'
    )
    expect(
      rejection(KvEventSourceJson, withField(["transport", "kind"], "nats", dynamoSourceJson()))
    ).toContain("transport.kind")
    expect(rejection(KvEventSourceJson, withField(["dpRank"], -1, dynamoSourceJson()))).toContain("dpRank")
    expect(rejection(KvEventSourceJson, withField(["publisherId"], "1.5", dynamoSourceJson()))).toContain(
      '"1.5"'
    )
    expect(rejection(DiscoveryDocumentJson, { version: 2, cards: [], sources: [] })).toContain("version")
  })

  it("reports invalid JSON text", () => {
    const result = decodeJsonText(DiscoveryDocumentJson)("{ version: 1 }")
    expect(Either.isLeft(result) && result.left.message).toMatch(/^invalid JSON: /)
  })
})
