/**
 * Issue 7, end to end with real OS processes: faults seen by the global consumer. Two
 * `kvrelay relay` processes (dc-a, dc-b) with their own discovery documents and simulated
 * workers in this process, and one `kvrelay global` following both, queried with plain `fetch`.
 *
 * - A relay restart (SIGTERM, then a new process with the same dc id, discovery file and port):
 *   a new relay incarnation, so a new producer; the consumer's dc-a lane goes away and comes back
 *   with the new producer, with the workers' state recovered and later events applied.
 * - A lagging lane: the global process is stopped (SIGSTOP) while dc-b publishes far more than
 *   a pool subscriber may have queued (16 frames), so dc-b's relay ends that stream with
 *   `SUBSCRIBER_LAGGED`; once resumed, the consumer retires only the dc-b lane and installs a
 *   fresh snapshot, while the dc-a lane stays ready throughout.
 */

import type { Scope } from "effect"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import {
  catalogProducer,
  closeScope,
  type DomainLane,
  depths,
  depthsByLocal,
  discoveryOf,
  dynamoWorker,
  engineWorker,
  eventually,
  type KvrelayProcess,
  lanesByRelay,
  lanesWhen,
  makeScope,
  makeTempDir,
  metrics,
  metricValue,
  promptBlocks,
  request,
  type SimWorker,
  startGlobal,
  startRelay,
  stopAll,
  stopKvrelay,
  type TempDir,
  warmUp,
  writeDiscovery
} from "./globalProcessesHarness.js"

const P1 = promptBlocks(11, 16)
const P2 = promptBlocks(12, 12)
const P3 = promptBlocks(13, 8)

let scope: Scope.CloseableScope | undefined
let dir: TempDir | undefined
let pathA: string
let relayA: KvrelayProcess
let relayB: KvrelayProcess
let global: KvrelayProcess
let a1: SimWorker
let a2: SimWorker
let b1: SimWorker
let b2: SimWorker

type Depths = Record<string, number>

/** The pool streams a relay serves now (one per consumer lane). */
const poolStreams = async (relay: KvrelayProcess) =>
  metricValue(await metrics(relay.url), "kv_dc_relay_subscribers", { stream: "pool" })

/** The `n`-th block of the lag test's burst (unchained: the burst is only load). */
const burstBlock = (n: bigint): bigint => 0x9000_0000_0000_0000n + 0x9e37_79b9n * n

/** Waits until the consumer answers `expected` (depth per relay, deepest first) for `hashes`. */
const converge = (what: string, hashes: ReadonlyArray<bigint>, expected: Depths, timeoutMs = 20_000) =>
  eventually(
    `${what}: ${JSON.stringify(expected)}`,
    () => depths(global.url, hashes),
    (actual) => JSON.stringify(actual) === JSON.stringify(expected),
    timeoutMs
  )

const bothReady = (lanes: Record<string, DomainLane>) =>
  lanes["dc-a"]?.ready === true && lanes["dc-b"]?.ready === true

beforeAll(async () => {
  scope = await makeScope()
  dir = makeTempDir()
  a1 = await dynamoWorker(scope, "1101")
  a2 = await engineWorker(scope, "1102", "vllm")
  b1 = await dynamoWorker(scope, "2101")
  b2 = await engineWorker(scope, "2102", "sglang")
  pathA = `${dir.path}/dc-a.json`
  const pathB = `${dir.path}/dc-b.json`
  writeDiscovery(pathA, await discoveryOf([a1, a2]))
  writeDiscovery(pathB, await discoveryOf([b1, b2]))
  ;[relayA, relayB] = await Promise.all([startRelay("dc-a", pathA), startRelay("dc-b", pathB)])
  global = await startGlobal([
    ["dc-a", relayA.url],
    ["dc-b", relayB.url]
  ])
  await Promise.all([warmUp(relayA.url, [a1, a2]), warmUp(relayB.url, [b1, b2])])
  await lanesWhen(global.url, "both lanes ready", bothReady)
  await a1.store(P1)
  await a2.store(P2.slice(0, 6))
  await b1.store(P1.slice(0, 10))
  await b2.store(P3)
  await converge("P1", P1, { "dc-a": 16, "dc-b": 10 })
  await converge("P2", P2, { "dc-a": 6, "dc-b": 0 })
  await converge("P3", P3, { "dc-b": 8, "dc-a": 0 })
}, 120_000)

afterAll(async () => {
  await stopAll()
  if (scope !== undefined) await closeScope(scope)
  dir?.remove()
})

describe("global consumer faults over relay processes", () => {
  it("converges again after a relay restarts as a new incarnation on the same port", async () => {
    const before = await lanesByRelay(global.url)
    const oldInfo = (await request(`${relayA.url}/v1/relay`)).body as {
      relay: { relayIncarnation: string }
      dcId: string
    }
    expect(before["dc-a"]!.producer.producerIncarnation).toBe(oldInfo.relay.relayIncarnation)
    const dcBBefore = before["dc-b"]!

    const stopped = await stopKvrelay(relayA, "SIGTERM")
    expect(stopped).toMatchObject({ code: 0, signal: null })
    // While dc-a is down only dc-b answers; its lane is untouched.
    await converge("P1 with dc-a down", P1, { "dc-b": 10 })
    const down = await lanesByRelay(global.url)
    expect(down["dc-a"]?.ready ?? false).toBe(false)
    expect(down["dc-b"]).toMatchObject({ ready: true, producer: dcBBefore.producer })

    // Events published while the relay is down: recovered by the new relay (tree dump, replay).
    const P4 = promptBlocks(14, 10)
    const P5 = promptBlocks(15, 6)
    await a1.store(P5)
    await a2.store(P4.slice(0, 7))

    relayA = await startRelay("dc-a", pathA, relayA.port)
    const newInfo = (await request(`${relayA.url}/v1/relay`)).body as {
      relay: { relayIncarnation: string }
      dcId: string
    }
    expect(newInfo.dcId).toBe(oldInfo.dcId)
    expect(newInfo.relay.relayIncarnation).not.toBe(oldInfo.relay.relayIncarnation)
    const newProducer = await eventually(
      "dc-a's new pool in its catalog",
      () => catalogProducer(relayA.url),
      () => true
    )
    expect(newProducer.producerIncarnation).toBe(newInfo.relay.relayIncarnation)

    // The consumer's retries back off up to a few seconds while the relay was away.
    const after = await lanesWhen(
      global.url,
      "dc-a's lane ready with the new producer",
      (lanes) =>
        lanes["dc-a"]?.ready === true &&
        lanes["dc-a"].producer.producerIncarnation === newInfo.relay.relayIncarnation,
      20_000
    )
    expect(after["dc-a"]!.producer).toEqual(newProducer)
    expect(after["dc-a"]!.poolId).toEqual(before["dc-a"]!.poolId)
    expect(after["dc-a"]!.lane).toBe(0)
    expect(after["dc-b"]).toMatchObject({ lane: 1, ready: true, producer: dcBBefore.producer })

    await converge("P1 after the restart", P1, { "dc-a": 16, "dc-b": 10 })
    await converge("P2 after the restart", P2, { "dc-a": 6, "dc-b": 0 })
    await converge("P4 stored by 1102 while dc-a was down", P4, { "dc-a": 7, "dc-b": 0 })
    await converge("P5 stored by 1101 while dc-a was down", P5, { "dc-a": 6, "dc-b": 0 })

    // Events published after the restart.
    await warmUp(relayA.url, [a1, a2])
    await a1.remove(P1.slice(12))
    await a2.store(P2.slice(6), P2[5])
    // A worker continues only prompts it holds (its lineage is its own): 1101 stores all of P4.
    await a1.store(P4)
    await converge("P1 after a removal at dc-a", P1, { "dc-a": 12, "dc-b": 10 })
    await converge("P2 completed at dc-a", P2, { "dc-a": 12, "dc-b": 0 })
    await converge("P4 completed at dc-a", P4, { "dc-a": 10, "dc-b": 0 })
    expect(await poolStreams(relayA)).toBe(1)
    expect(await poolStreams(relayB)).toBe(1)
  }, 60_000)

  it("recovers a lagging lane from a fresh snapshot while the other lane stays ready", async () => {
    const before = await lanesWhen(global.url, "both lanes ready", bothReady)
    const p1Before = await depths(global.url, P1)
    expect(p1Before["dc-b"]).toBe(10)
    const globalMetrics = await metrics(global.url)
    const counter = (text: string, name: string, relay: string) => metricValue(text, name, { relay })
    const faultsB = counter(globalMetrics, "kvrelay_global_lane_faults_total", "dc-b")
    const snapshotsB = counter(globalMetrics, "kvrelay_global_snapshots_installed_total", "dc-b")
    const faultsA = counter(globalMetrics, "kvrelay_global_lane_faults_total", "dc-a")
    const snapshotsA = counter(globalMetrics, "kvrelay_global_snapshots_installed_total", "dc-a")
    const lagged = async () =>
      metricValue(await metrics(relayB.url), "kv_dc_relay_subscriber_lagged_total", { stream: "pool" })
    const laggedBefore = await lagged()

    // Stop the consumer, then have 2101 churn 4096 fresh blocks per round (storing a new chunk,
    // removing the previous one): every publication is a large delta, and once the socket buffers
    // are full the relay's per-subscriber queue overflows.
    let chunk: Array<bigint> = []
    let previous: Array<bigint> = []
    let next = 0n
    let rounds = 0
    global.child.kill("SIGSTOP")
    try {
      while ((await lagged()) === laggedBefore) {
        if (rounds === 400) throw new Error("dc-b's pool stream never lagged")
        for (let i = 0; i < 10; i++, rounds++) {
          chunk = Array.from({ length: 4096 }, () => burstBlock(++next))
          await b1.store(chunk)
          if (previous.length > 0) await b1.remove(previous)
          previous = chunk
        }
      }
    } finally {
      global.child.kill("SIGCONT")
    }

    // The consumer reads what was buffered, meets the SUBSCRIBER_LAGGED frame, retires the dc-b
    // lane only, and subscribes again after its backoff.
    let sawRetired = false
    const dcASamples: Array<DomainLane | undefined> = []
    const retiredSamples: Array<DomainLane | undefined> = []
    const after = await lanesWhen(
      global.url,
      "dc-b retired and ready again",
      (lanes) => {
        dcASamples.push(lanes["dc-a"])
        if (lanes["dc-b"]?.ready !== true) {
          sawRetired = true
          retiredSamples.push(lanes["dc-b"])
        }
        return sawRetired && lanes["dc-b"]?.ready === true
      },
      20_000
    )
    // dc-a's lane never moved: same producer, ready, nothing new installed.
    for (const sample of dcASamples) expect(sample).toEqual(before["dc-a"])
    // While retired, dc-b's lane stays listed (its pool is still in the catalog), not ready,
    // without an installed sequence.
    for (const sample of retiredSamples) {
      expect(sample).toMatchObject({
        lane: 1,
        ready: false,
        installedSequence: null,
        producer: before["dc-b"]!.producer
      })
    }
    expect(after["dc-b"]!.producer).toEqual(before["dc-b"]!.producer)
    expect(BigInt(after["dc-b"]!.installedSequence!)).toBeGreaterThan(
      BigInt(before["dc-b"]!.installedSequence!)
    )

    const text = await metrics(global.url)
    expect(counter(text, "kvrelay_global_lane_faults_total", "dc-b")).toBeGreaterThan(faultsB)
    expect(
      metricValue(text, "kvrelay_global_lane_faults_total", { relay: "dc-b", kind: "PoolStreamTerminated" })
    ).toBeGreaterThan(0)
    expect(counter(text, "kvrelay_global_snapshots_installed_total", "dc-b")).toBeGreaterThan(snapshotsB)
    expect(counter(text, "kvrelay_global_lane_faults_total", "dc-a")).toBe(faultsA)
    expect(counter(text, "kvrelay_global_snapshots_installed_total", "dc-a")).toBe(snapshotsA)

    // The fresh snapshot holds dc-b's state after the burst: the last chunk, none of the earlier
    // ones, and the prompts from before.
    await converge("the last chunk at dc-b", chunk.slice(0, 32), { "dc-b": 32, "dc-a": 0 })
    // All of it: blocks are addressed by their whole prefix, so the chunk is asked as one prompt.
    await eventually(
      "the whole last chunk at dc-b",
      () => depthsByLocal(global.url, chunk),
      (actual) => actual["dc-b"] === chunk.length && actual["dc-a"] === 0
    )
    const first = Array.from({ length: 32 }, (_, i) => burstBlock(BigInt(i + 1)))
    await converge("the first chunk removed at dc-b", first, { "dc-a": 0, "dc-b": 0 })
    await converge("P1 as before the burst", P1, p1Before)
    await converge("P3 as before the burst", P3, { "dc-b": 8, "dc-a": 0 })

    // Deltas flow again on the recovered lane.
    await b1.store(P1.slice(10), P1[9])
    await converge("P1 completed at dc-b", P1, { "dc-b": 16, "dc-a": p1Before["dc-a"]! })
    // The lagged stream is gone at the relay; only the new one is served.
    await eventually(
      "one pool stream at dc-b",
      () => poolStreams(relayB),
      (n) => n === 1
    )
    expect(await poolStreams(relayA)).toBe(1)
  }, 60_000)
})
