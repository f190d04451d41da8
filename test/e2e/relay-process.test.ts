/**
 * End to end (issue 6): `kvrelay relay` as a real OS process, fed by simulated workers over the
 * real ZeroMQ wire formats through a discovery file, and read over HTTP exactly as an outside
 * client would (PROTOCOL.md §2, §3, §5, §6). One relay serves the whole story below, in order:
 * identities, the pool stream with a Dynamo and a vLLM worker, gap recovery, a joining worker,
 * garbage frames, the barrier snapshot, error statuses, metrics, and finally the withdrawal.
 */

import { pack } from "msgpackr"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import {
  addressOf,
  type CatalogJson,
  cardRecord,
  cleanup,
  DiscoveryFile,
  type DynamoWorker,
  diagnosticWords,
  distinguishable,
  type EngineWorker,
  endpointText,
  eventually,
  FRAME_DELTA,
  FRAME_HEARTBEAT,
  FRAME_SNAPSHOT,
  FRAME_TERMINAL,
  freshHashes,
  type PoolDescriptorJson,
  PoolStream,
  Relay,
  Workers,
  warmUp,
  wordsHold
} from "./relayProcessHarness.js"

const SERVING = { namespace: "prod", component: "router", endpoint: "generate" }
const ENDPOINT = endpointText(SERVING)

// PROTOCOL §2 verified vectors.
const CACHE_SEMANTICS = "7d31eb9019357572470605f4a8be687e"
const ROUTING_SCOPE = "18270d3ba03effaec8d167ba02c7752d"
const TEST_DC_ID = "49861458b11c53ec"

const U64_TEXT = /^(0|[1-9][0-9]{0,19})$/

const workers = new Workers()
const file = new DiscoveryFile()
let relay: Relay
let dynamo: DynamoWorker
let engine: EngineWorker
let joiner: DynamoWorker | undefined
let pool: PoolDescriptorJson
/** The stream opened by the pool-stream test and followed by every later test. */
let stream: PoolStream
/** Blocks each worker holds now (the exact model the filter is checked against). */
const held = new Map<string, Set<bigint>>()

const holding = (workerId: string): Set<bigint> => {
  let set = held.get(workerId)
  if (set === undefined) {
    set = new Set()
    held.set(workerId, set)
  }
  return set
}
const allHeld = (): Array<bigint> => [...held.values()].flatMap((set) => [...set])

/** Waits until every held block is in the stream's filter and every `gone` one is not. */
const filterMatches = async (gone: ReadonlyArray<bigint>): Promise<void> => {
  const present = allHeld()
  const absent = gone.filter((h) =>
    distinguishable(pool.producer.format, addressOf(h), present.map(addressOf))
  )
  expect(absent.length).toBeGreaterThanOrEqual(gone.length - 1)
  await stream.contains(present, absent)
}

const store = async (worker: DynamoWorker | EngineWorker, hashes: ReadonlyArray<bigint>) => {
  await worker.store(hashes)
  for (const h of hashes) holding(worker.workerId).add(h)
}

const remove = async (worker: DynamoWorker | EngineWorker, hashes: ReadonlyArray<bigint>) => {
  await worker.remove(hashes)
  for (const h of hashes) holding(worker.workerId).delete(h)
}

const discoveryDocument = async (members: ReadonlyArray<DynamoWorker | EngineWorker>) => ({
  version: 1,
  cards: members.map((w) => cardRecord(SERVING, w.workerId)),
  sources: await Promise.all(members.map((w) => w.sourceRecord(ENDPOINT)))
})

beforeAll(async () => {
  dynamo = await workers.dynamo("7001")
  engine = await workers.engine("7003")
  file.write(await discoveryDocument([dynamo, engine]))
  relay = await Relay.start({ discovery: file, dcId: "test-dc" })
  pool = await relay.onlyPool()
})

afterAll(() => cleanup(workers))

describe("kvrelay relay as a process", () => {
  it("prints its readiness line and serves its identity and catalog (PROTOCOL §2 vectors)", async () => {
    expect(relay.proc.stdout.trim().split("\n")).toEqual([
      JSON.stringify({ event: "listening", url: relay.url })
    ])
    expect(relay.url).toMatch(/^http:\/\/127\.0\.0\.1:[1-9][0-9]*$/)

    const info = await relay.json<Record<string, unknown>>("/v1/relay")
    expect(Object.keys(info).sort()).toEqual(["dcId", "dcName", "protocolVersion", "relay"])
    expect(info).toMatchObject({ protocolVersion: 1, dcName: "test-dc", dcId: TEST_DC_ID })
    const identity = info["relay"] as { drtInstanceId: unknown; relayIncarnation: unknown }
    expect(identity.drtInstanceId).toMatch(U64_TEXT)
    expect(identity.relayIncarnation).toMatch(U64_TEXT)

    const catalog = await relay.json<CatalogJson>("/v1/catalog")
    expect(catalog.protocolVersion).toBe(1)
    expect(catalog.relay).toEqual(identity)
    expect(catalog.revision).toMatch(U64_TEXT)
    expect(catalog.pools).toHaveLength(1)
    const [descriptor] = catalog.pools
    expect(descriptor).toEqual({
      producer: {
        poolId: {
          identityVersion: 1,
          cacheSemantics: { digest: CACHE_SEMANTICS, source: "default_derived" },
          routingScope: { digest: ROUTING_SCOPE, source: "default_derived" },
          dcId: TEST_DC_ID
        },
        producerIncarnation: identity.relayIncarnation,
        layoutGeneration: expect.stringMatching(U64_TEXT),
        format: {
          formatVersion: 1,
          seed: expect.stringMatching(U64_TEXT),
          // --expected-unique-blocks 4096 → ⌈4096·5/16⌉ = 1280 → 2048 buckets
          bucketCount: 2048,
          fingerprintBits: 16,
          slotsPerBucket: 4
        }
      },
      servingEndpoint: SERVING,
      registrations: [{ model: "llama", target: { base: { baseModel: "llama" } }, aliases: ["chat"] }],
      querySemantics: { kvBlockSize: 512, hashFormat: "dynamo_standard_v1", addressing: "canonical_v1" },
      poolRoles: ["aggregated"]
    })
    expect(descriptor!.producer.layoutGeneration).not.toBe("0")

    const healthz = await relay.fetch("/healthz")
    expect(healthz.status).toBe(200)
    expect((await healthz.text()).trim()).toBe("ok")
    // The pool enters the catalog before its sources connect; wait for both to be live.
    const health = await eventually(
      "both sources live",
      async () => {
        const reply = await relay.fetch("/v1/health")
        const body = (await reply.json()) as { sources?: { live?: number } }
        return body.sources?.live === 2 && { status: reply.status, body }
      },
      30_000
    )
    expect(health.status).toBe(200)
    expect(health.body).toEqual({
      healthy: true,
      shuttingDown: false,
      endpointCount: 1,
      activeEndpointCount: 1,
      fencedEndpointCount: 0,
      sourcesRecovering: 0,
      sourcesDegraded: 0,
      sources: { expected: 2, connecting: 0, live: 2, recovering: 0, degraded: 0, rejected: 0 },
      discovery: { state: "live", since: expect.stringMatching(/^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$/) }
    })
  })

  it("streams snapshot chunks then contiguous deltas; Dynamo stores and removals show in the filter", async () => {
    stream = await PoolStream.subscribe(relay.url, "e2e-main", pool.producer)
    expect(stream.response.headers["content-type"]).toBe("application/vnd.kvrelay.pool-stream.v1")
    await stream.until("the snapshot", (s) => s.words !== undefined)
    // 2048 buckets fit one chunk (at most 524288 words per chunk).
    expect(stream.snapshotChunks).toBe(1)
    expect(stream.frames[0]!.kind).toBe(FRAME_SNAPSHOT)

    for (const h of await warmUp(stream, (hashes) => dynamo.store(hashes))) holding("7001").add(h)
    const blocks = freshHashes(6)
    await store(dynamo, blocks)
    await filterMatches([])
    await remove(dynamo, blocks.slice(0, 3))
    await filterMatches(blocks.slice(0, 3))

    // A block stored twice by one worker and removed once is gone (ownership, not a counter).
    // Stored twice alike: the same engine hash under another parent would be another block,
    // which canonical addressing refuses (InvalidBlockSequence).
    const again = freshHashes(1)
    await dynamo.store(again)
    await dynamo.store(again)
    await remove(dynamo, again)
    await filterMatches(again)

    expect(stream.frames.slice(1).every((f) => f.kind === FRAME_DELTA || f.kind === FRAME_HEARTBEAT)).toBe(
      true
    )
    expect(stream.violations).toEqual([])
  })

  it("follows an engine-zmq (vLLM) worker; its AllBlocksCleared clears only its own rank", async () => {
    for (const h of await warmUp(stream, (hashes) => engine.store(hashes))) holding("7003").add(h)
    const own = freshHashes(5)
    await store(engine, own)
    await filterMatches([])
    await remove(engine, own.slice(0, 2))
    await filterMatches(own.slice(0, 2))

    // Both workers hold `shared`: the engine's clear leaves the Dynamo worker's copy.
    const shared = freshHashes(2)
    await store(dynamo, shared)
    await store(engine, shared)
    await filterMatches([])
    const engineBlocks = [...holding("7003")].filter((h) => !shared.includes(h))
    await engine.clear()
    holding("7003").clear()
    await filterMatches(engineBlocks)
    expect(shared.every((h) => stream.holds(h))).toBe(true)

    const stats = await relay.endpointStats(ENDPOINT)
    const members = stats.aggregation!.members
    expect(members.find((m) => m.workerId === "7003")?.blocks ?? 0).toBe(0)
    expect(members.find((m) => m.workerId === "7001")?.blocks).toBe(holding("7001").size)
    expect(stream.violations).toEqual([])
  })

  it("recovers a message the Dynamo worker dropped through its worker query server", async () => {
    const before = await relay.endpointStats(ENDPOINT)
    const queries = await dynamo.queryRequests()
    const dropped = freshHashes(3)
    const next = freshHashes(2)
    await dynamo.dropNext()
    await store(dynamo, dropped)
    await store(dynamo, next)
    await filterMatches([])
    const after = await relay.endpointStats(ENDPOINT)
    expect(after.ingest.gaps).toBeGreaterThan(before.ingest.gaps)
    expect(after.ingest.recoveries).toBeGreaterThan(before.ingest.recoveries)
    expect(await dynamo.queryRequests()).toBeGreaterThan(queries)
    expect(stream.violations).toEqual([])
  })

  it("recovers a batch the engine dropped through its replay endpoint", async () => {
    const before = await relay.endpointStats(ENDPOINT)
    const replays = await engine.replays()
    const dropped = freshHashes(3)
    const next = freshHashes(2)
    await engine.dropNext()
    await store(engine, dropped)
    await store(engine, next)
    await filterMatches([])
    const after = await relay.endpointStats(ENDPOINT)
    expect(after.ingest.gaps).toBeGreaterThan(before.ingest.gaps)
    expect(after.ingest.recoveries).toBeGreaterThan(before.ingest.recoveries)
    expect(await engine.replays()).toBeGreaterThan(replays)
    expect(stream.violations).toEqual([])
  })

  it("picks up a second worker added by rewriting the discovery file", async () => {
    const added = await workers.dynamo("7002")
    joiner = added
    file.write(await discoveryDocument([dynamo, engine, added]))
    await eventually("the relay to follow three ranks", async () => {
      const stats = await relay.endpointStats(ENDPOINT)
      return stats.recovery.rankCount === 3
    })
    for (const h of await warmUp(stream, (hashes) => added.store(hashes))) holding("7002").add(h)
    const blocks = freshHashes(4)
    await store(added, blocks)
    await filterMatches([])

    const stats = await relay.endpointStats(ENDPOINT)
    expect(stats.aggregation!.members).toContainEqual({
      workerId: "7002",
      dpRank: 0,
      blocks: holding("7002").size,
      hostBlocks: 0,
      diskBlocks: 0
    })
    // Same binding, same producer: the open stream carries on.
    expect(await relay.onlyPool()).toEqual(pool)
    expect(stream.terminal).toBeUndefined()
    expect(stream.violations).toEqual([])
  })

  it("drops and counts garbage ZeroMQ frames while good traffic keeps flowing", async () => {
    const { malformed: before, gaps } = (await relay.endpointStats(ENDPOINT)).ingest
    const publisherId = Buffer.alloc(8)
    publisherId.writeBigUInt64BE(await dynamo.publisherId())
    const sequence = Buffer.alloc(8)
    const envelope = pack({
      topic: "kv-events",
      publisher_id: Number(await dynamo.publisherId()),
      sequence: 0,
      published_at: 0,
      payload: Buffer.from([0xc1, 0xc1])
    })
    const frame = Buffer.alloc(5 + envelope.length)
    frame[0] = 0x01
    frame.writeUInt32BE(envelope.length, 1)
    frame.set(envelope, 5)
    // wrong frame count; a 3-byte publisher id; an envelope whose payload is not msgpack
    await dynamo.sendRaw(["kv-events", "only two frames"])
    await dynamo.sendRaw(["kv-events", Buffer.alloc(3), sequence, frame])
    await dynamo.sendRaw(["kv-events", publisherId, sequence, frame])
    // an engine message of two frames instead of three
    await engine.sendRaw(["", "x"])

    const blocks = freshHashes(3)
    await store(dynamo, blocks)
    const more = freshHashes(2)
    await store(engine, more)
    await filterMatches([])
    const stats = await eventually("4 malformed messages counted", async () => {
      const now = await relay.endpointStats(ENDPOINT)
      return now.ingest.malformed >= before + 4 ? now : undefined
    })
    expect(stats.ingest.malformed).toBe(before + 4)
    // Dropped, not taken for a lost message.
    expect(stats.ingest.gaps).toBe(gaps)

    const metrics = await relay.metrics()
    const line = metrics.split("\n").find((l) => l.startsWith("kv_dc_relay_ingest_malformed_total{"))
    expect(line).toBeDefined()
    expect(line).toContain(`endpoint="${ENDPOINT}"`)
    expect(Number(line!.split(" ").at(-1))).toBe(before + 4)
    expect(stream.violations).toEqual([])
  })

  it("after a flush, the streamed filter equals the relay's barrier snapshot", async () => {
    const flush = await relay.fetch("/v1/flush", { method: "POST" })
    expect(flush.status).toBe(204)
    const snapshot = await relay.json<{
      layoutGeneration: string
      sequence: string
      memberCount: number
      uniqueBlockCount: number
      format: unknown
      buckets: string
    }>(`/v1/endpoints/${ENDPOINT}/snapshot`)
    expect(snapshot.layoutGeneration).toBe(pool.producer.layoutGeneration)
    expect(snapshot.format).toEqual(pool.producer.format)
    expect(snapshot.uniqueBlockCount).toBe(new Set(allHeld()).size)
    const words = diagnosticWords(snapshot.buckets)
    expect(words.length).toBe(2 * pool.producer.format.bucketCount)
    for (const h of allHeld()) expect(wordsHold(words, pool.producer.format, addressOf(h))).toBe(true)
    const sequence = BigInt(snapshot.sequence)
    await stream.until(`sequence ${sequence}`, (s) => s.sequence !== undefined && s.sequence >= sequence)
    expect(stream.sequence).toBe(sequence)
    expect(stream.words).toEqual(words)
    expect(stream.violations).toEqual([])
  })

  it("answers request errors with the PROTOCOL §5 statuses", async () => {
    const producer = pool.producer
    const subscribe = (body: unknown) =>
      relay.post("/v1/pools/subscribe", typeof body === "string" ? body : JSON.stringify(body))

    const malformed = await subscribe("{not json")
    expect(malformed.status).toBe(400)
    expect(malformed.json).toMatchObject({ reason: "INVALID_REQUEST" })

    const unknownField = await subscribe({ subscriberId: "e", expectedProducer: producer, colour: "red" })
    expect(unknownField.status).toBe(400)
    expect(unknownField.json).toMatchObject({ reason: "INVALID_REQUEST" })
    expect((unknownField.json as { message: string }).message).toContain("colour")

    const nested = await subscribe({ subscriberId: "e", expectedProducer: { ...producer, flavour: 1 } })
    expect(nested.status).toBe(400)
    expect((nested.json as { message: string }).message).toContain("flavour")

    const control = await subscribe({ subscriberId: "bad\u0007id", expectedProducer: producer })
    expect(control.status).toBe(400)
    expect(control.json).toMatchObject({ reason: "INVALID_REQUEST" })

    const oversized = await subscribe({ subscriberId: "x".repeat(70_000), expectedProducer: producer })
    expect(oversized.status).toBe(413)

    const otherDc = { ...producer, poolId: { ...producer.poolId, dcId: "0000000000000001" } }
    const unknownPool = await subscribe({ subscriberId: "e", expectedProducer: otherDc })
    expect(unknownPool.status).toBe(404)
    expect(unknownPool.json).toMatchObject({ reason: "POOL_NOT_FOUND" })

    const nextGeneration = String(BigInt(producer.layoutGeneration) + 1n)
    const changed = await subscribe({
      subscriberId: "e",
      expectedProducer: { ...producer, layoutGeneration: nextGeneration }
    })
    expect(changed.status).toBe(409)
    expect(changed.json).toMatchObject({ reason: "PRODUCER_CHANGED" })

    const incarnation = String(BigInt(producer.producerIncarnation) ^ 1n)
    const restarted = await subscribe({
      subscriberId: "e",
      expectedProducer: { ...producer, producerIncarnation: incarnation }
    })
    expect(restarted.status).toBe(409)
    expect(restarted.json).toMatchObject({ reason: "PRODUCER_CHANGED" })

    const version2 = { ...producer, format: { ...producer.format, formatVersion: 2 } }
    const unsupported = await subscribe({ subscriberId: "e", expectedProducer: version2 })
    expect(unsupported.status).toBe(422)
    expect(unsupported.json).toMatchObject({ reason: "UNSUPPORTED_FEATURE" })

    const unknownPath = await relay.fetch("/v1/nothing-here")
    expect(unknownPath.status).toBe(404)
    expect(await unknownPath.json()).toMatchObject({
      reason: expect.any(String),
      message: expect.any(String)
    })

    const unknownEndpoint = await relay.fetch("/v1/endpoints/x.y.z/snapshot")
    expect(unknownEndpoint.status).toBe(404)
    expect(await unknownEndpoint.json()).toMatchObject({ reason: "POOL_NOT_FOUND" })

    // None of this disturbed the open stream.
    expect(stream.terminal).toBeUndefined()
    expect(stream.violations).toEqual([])
  })

  it("exposes kv_dc_relay_ metric families and a healthy /v1/health", async () => {
    const metrics = await relay.metrics()
    const families = new Set(
      metrics
        .split("\n")
        .filter((l) => l.startsWith("# TYPE kv_dc_relay_"))
        .map((l) => l.split(" ")[2])
    )
    for (const family of [
      "kv_dc_relay_catalog_pool_count",
      "kv_dc_relay_ingest_events_total",
      "kv_dc_relay_ingest_malformed_total",
      "kv_dc_relay_ingest_dropped_batches_total",
      "kv_dc_relay_publication_sequence",
      "kv_dc_relay_subscribers"
    ]) {
      expect(families).toContain(family)
    }
    const pools = metrics.split("\n").find((l) => l.startsWith("kv_dc_relay_catalog_pool_count"))
    expect(Number(pools!.split(" ").at(-1))).toBe(1)
    // The process's runtime metrics, build and fiber failures (the command installs the counter).
    for (const [family, type] of [
      ["process_cpu_seconds_total", "counter"],
      ["nodejs_heap_size_used_bytes", "gauge"],
      ["nodejs_eventloop_lag_seconds", "gauge"],
      ["effect_fiber_failures_total", "counter"]
    ]) {
      expect(metrics).toMatch(new RegExp(`^# TYPE ${family} ${type}$`, "m"))
    }
    expect(metrics).toMatch(/^kvrelay_build_info\{version="\d+\.\d+\.\d+[^"]*"\} 1$/m)
    const health = await relay.fetch("/v1/health")
    expect(health.status).toBe(200)
    expect(await health.json()).toMatchObject({ healthy: true, shuttingDown: false })
  })

  it("withdraws the pool when the workers' cards leave the file and ends the open stream", async () => {
    const watch = await relay.watchCatalog("e2e-watch")
    expect(watch.status).toBe(200)
    await eventually("the first catalog event", () => watch.documents<CatalogJson>("catalog").length > 0)
    expect(watch.documents<CatalogJson>("catalog")[0]!.pools).toHaveLength(1)

    const members = joiner === undefined ? [dynamo, engine] : [dynamo, engine, joiner]
    const document = await discoveryDocument(members)
    file.write({ ...document, cards: [] })

    await stream.ends()
    expect(stream.terminal?.reason).toBe("PUBLICATION_UNAVAILABLE")
    expect(stream.frames.at(-1)!.kind).toBe(FRAME_TERMINAL)
    expect(stream.violations).toEqual([])
    await eventually("an empty catalog on the watch", () =>
      watch.documents<CatalogJson>("catalog").some((c) => c.pools.length === 0)
    )
    expect((await relay.json<CatalogJson>("/v1/catalog")).pools).toEqual([])

    // The withdrawn producer is no longer subscribable.
    const again = await PoolStream.open(relay.url, "e2e-late", pool.producer)
    expect(again).toMatchObject({ status: 404, json: { reason: "POOL_NOT_FOUND" } })
    watch.close()
  })
})
