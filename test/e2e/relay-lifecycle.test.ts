/**
 * End to end (issue 6): the parts of a relay process's life that end streams or the process
 * itself, each on its own `kvrelay relay` child: a subscriber that stops reading is cut off
 * without holding back a reader that keeps up, and SIGTERM / SIGINT withdraw the pools, end the
 * streams and exit 0.
 */

import { afterEach, describe, expect, it } from "vitest"
import {
  type CatalogJson,
  cardRecord,
  cleanup,
  DiscoveryFile,
  type DynamoWorker,
  endpointText,
  eventually,
  FRAME_TERMINAL,
  freshHashes,
  PoolStream,
  Relay,
  Workers,
  warmUp,
  yieldToIo
} from "./relayProcessHarness.js"

const SERVING = { namespace: "prod", component: "router", endpoint: "generate" }
const ENDPOINT = endpointText(SERVING)

const workers = new Workers()
afterEach(() => cleanup(workers))

const startWithOneWorker = async (
  expectedUniqueBlocks?: number
): Promise<{ relay: Relay; worker: DynamoWorker }> => {
  const worker = await workers.dynamo("7001")
  const file = new DiscoveryFile()
  file.write({
    version: 1,
    cards: [cardRecord(SERVING, "7001")],
    sources: [await worker.sourceRecord(ENDPOINT)]
  })
  const relay = await Relay.start({ discovery: file, expectedUniqueBlocks })
  return { relay, worker }
}

/** The value of the pool-stream sample of `kv_dc_relay_subscriber_lagged_total`. */
const laggedPoolStreams = async (relay: Relay): Promise<number> => {
  const lines = (await relay.metrics()).split("\n")
  return lines
    .filter((l) => l.startsWith("kv_dc_relay_subscriber_lagged_total"))
    .reduce((sum, l) => sum + Number(l.split(" ").at(-1)), 0)
}

describe("kvrelay relay process lifecycle", () => {
  it("cuts off a subscriber that stops reading without holding back one that keeps up", async () => {
    // 4194304 expected blocks → 2^21 buckets: a 16 MiB snapshot in 4 chunks, more than the
    // socket buffers take, so the paused reader is stuck in its snapshot while deltas queue.
    const { relay, worker } = await startWithOneWorker(4_194_304)
    const pool = await relay.onlyPool()
    expect(pool.producer.format.bucketCount).toBe(2 ** 21)

    const reader = await PoolStream.subscribe(relay.url, "keeps-up", pool.producer)
    await reader.until("the 4-chunk snapshot", (s) => s.words !== undefined, 20_000)
    expect(reader.snapshotChunks).toBe(4)
    const stored = await warmUp(reader, (hashes) => worker.store(hashes))

    const stalled = await PoolStream.subscribe(relay.url, "stops-reading", pool.producer)
    stalled.pause()
    expect(await laggedPoolStreams(relay)).toBe(0)

    // Publish until the relay reports a lagged pool subscriber; every delta goes to both.
    const deadline = Date.now() + 20_000
    let rounds = 0
    while ((await laggedPoolStreams(relay)) === 0) {
      if (Date.now() > deadline) throw new Error(`no subscriber lagged after ${rounds} rounds`)
      for (let i = 0; i < 8; i++) {
        const hashes = freshHashes(16)
        await worker.store(hashes)
        stored.push(...hashes)
        await yieldToIo()
      }
      rounds++
    }
    expect(await laggedPoolStreams(relay)).toBe(1)

    // The reader that kept up is still served and sees everything, including what comes next.
    const marker = freshHashes(2)
    await worker.store(marker)
    stored.push(...marker)
    await reader.contains(stored, [], 15_000)
    expect(reader.terminal).toBeUndefined()
    expect(reader.ended).toBe(false)
    expect(reader.violations).toEqual([])

    // The stalled one, read again, ends with a SUBSCRIBER_LAGGED terminal frame (PROTOCOL §5).
    stalled.resume()
    await stalled.ends(20_000)
    expect(stalled.violations).toEqual([])
    expect(stalled.terminal?.reason).toBe("SUBSCRIBER_LAGGED")
    expect(stalled.frames.at(-1)!.kind).toBe(FRAME_TERMINAL)
    // It never got to apply a delta it could not have kept up with.
    expect(stalled.words === undefined || stalled.sequence! < reader.sequence!).toBe(true)

    // The relay keeps serving: a fresh subscriber gets a complete, current snapshot.
    const fresh = await PoolStream.subscribe(relay.url, "stops-reading", pool.producer)
    await fresh.contains(stored, [], 20_000)
    expect(fresh.violations).toEqual([])
    expect(await laggedPoolStreams(relay)).toBe(1)
  })

  for (const signal of ["SIGTERM", "SIGINT"] as const) {
    it(`${signal}: withdraws the pools, ends the streams with a terminal frame and exits 0 promptly`, async () => {
      const { relay, worker } = await startWithOneWorker()
      const pool = await relay.onlyPool()
      const stream = await PoolStream.subscribe(relay.url, "until-shutdown", pool.producer)
      await stream.until("the snapshot", (s) => s.words !== undefined)
      const stored = await warmUp(stream, (hashes) => worker.store(hashes))
      expect(stored.length).toBeGreaterThan(0)
      const watch = await relay.watchCatalog("until-shutdown")
      await eventually("the first catalog event", () => watch.documents<CatalogJson>("catalog").length > 0)
      expect(watch.documents<CatalogJson>("catalog")[0]!.pools).toHaveLength(1)

      const sentAt = Date.now()
      relay.proc.signal(signal)
      const exit = await relay.proc.waitExit(10_000)
      const tookMs = Date.now() - sentAt
      expect(exit).toEqual({ code: 0, signal: null })
      expect(tookMs).toBeLessThan(5_000)

      await stream.ends()
      expect(stream.terminal?.reason).toBe("PUBLICATION_UNAVAILABLE")
      expect(stream.frames.at(-1)!.kind).toBe(FRAME_TERMINAL)
      expect(stream.violations).toEqual([])

      // The catalog watch saw the pool withdrawn, or was ended with the process.
      await eventually("the catalog watch to end", () => watch.ended)
      const catalogs = watch.documents<CatalogJson>("catalog")
      expect(catalogs.slice(1).every((c) => c.pools.length === 0)).toBe(true)

      // Nothing listens any more.
      await expect(fetch(`${relay.url}/healthz`)).rejects.toThrow()
      expect(relay.proc.stderr).not.toMatch(/level=(ERROR|FATAL)/)
    })
  }

  it("SIGTERM with a replay endpoint that never answers: the sibling is served, health shows the source recovering, exit 0 within 3 s", async () => {
    const silent = await workers.engine("7001", { silentReplay: true })
    const sibling = await workers.dynamo("7002")
    await silent.store(freshHashes(1))
    const file = new DiscoveryFile()
    file.write({
      version: 1,
      cards: [cardRecord(SERVING, "7001"), cardRecord(SERVING, "7002")],
      sources: [await silent.sourceRecord(ENDPOINT), await sibling.sourceRecord(ENDPOINT)]
    })
    const relay = await Relay.start({ discovery: file })
    await relay.onlyPool()
    const blocks = freshHashes(3)
    await sibling.store(blocks)
    await eventually("the sibling's blocks", async () => {
      const stats = await relay.endpointStats(ENDPOINT)
      return stats.aggregation?.members.find((m) => m.workerId === "7002")?.blocks === blocks.length
    })
    // The silent rank's own connection and replay request are not ordered with the sibling's.
    const health = await eventually("the silent rank recovering, its replay asked for", async () => {
      const current = await relay.json<{ healthy: boolean; sourcesRecovering: number }>("/v1/health")
      return current.sourcesRecovering === 1 && (await silent.replays()) >= 1 && current
    })
    expect(health).toMatchObject({ healthy: true, sourcesRecovering: 1 })

    const sentAt = Date.now()
    relay.proc.signal("SIGTERM")
    const exit = await relay.proc.waitExit(10_000)
    expect(exit).toEqual({ code: 0, signal: null })
    expect(Date.now() - sentAt).toBeLessThan(3_000)
  })
})
