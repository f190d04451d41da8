/**
 * Fixtures of the relay-host integration tests: cards of the two test endpoints, a relay over a
 * file document, and bounded waits on what its filters and stats show.
 */

import * as NodeFileSystem from "@effect/platform-node/NodeFileSystem"
import { Effect, Logger, LogLevel } from "effect"
import { prepare } from "../../src/ckf/addressing.js"
import type { DcCkfFormatIdentity } from "../../src/ckf/identity.js"
import { Discovery } from "../../src/discovery/Discovery.js"
import { makeFileDiscovery } from "../../src/discovery/FileDiscovery.js"
import type { ModelCardInstance } from "../../src/protocol/Discovery.js"
import type { EndpointId } from "../../src/protocol/Model.js"
import type { EndpointStats, KvDcRelayService } from "../../src/relay/KvDcRelay.js"
import * as RelayHost from "../../src/relay/RelayHost.js"
import { makeZmqEventTransport } from "../../src/transport/ZmqEventTransport.js"
import { card, endpoint } from "../discovery/fixtures.js"
import { awaitCatalog, type DiscoveryFile } from "../relay/hostFixtures.js"
import { eventually } from "./zmqHelpers.js"

export const ROUTER = endpoint("prod.router.generate")
export const VLLM = endpoint("prod.vllm.generate")

/** Distinct hashes spread over the u64 range. */
export const hashes = (base: bigint, count: number): Array<bigint> =>
  Array.from({ length: count }, (_, i) => base + BigInt(i) * 0x1_0000_0001n)

export const routerCard = (worker: string): ModelCardInstance =>
  card({
    endpoint: ROUTER.toString(),
    worker,
    name: "llama",
    sourcePath: "meta/llama",
    blockSize: 512,
    aliases: ["chat"],
    runtime: { totalKvBlocks: "1000" }
  })

export const vllmCard = (worker: string): ModelCardInstance =>
  card({
    endpoint: VLLM.toString(),
    worker,
    name: "mistral",
    sourcePath: "mistral/7b",
    blockSize: 16,
    runtime: { dataParallelSize: 2, totalKvBlocks: "500" }
  })

/** The relay over a file document, quiet below warnings. */
export const startRelay = (
  file: DiscoveryFile,
  recoveryAttemptTimeoutMs = 2000,
  registry: RelayHost.RelayHostConfig["registry"] = undefined
) =>
  Effect.gen(function* () {
    const discovery = yield* makeFileDiscovery({ path: file.path }).pipe(Effect.provide(NodeFileSystem.layer))
    return yield* RelayHost.make({
      dcName: "test-dc",
      drtInstanceId: 77n,
      eventTransport: makeZmqEventTransport(),
      expectedUniqueBlocks: 4096,
      recoveryAttemptTimeoutMs,
      registry
    }).pipe(Effect.provideService(Discovery, discovery))
  }).pipe(Effect.orDie)

export const quiet = Logger.minimumLogLevel(LogLevel.Warning)

// ---------------------------------------------------------------------------------------------
// CKF checks over bucket words (`[lo, hi]` per bucket, four 16-bit slots little-endian)

const bucketHas = (words: Uint32Array, bucket: number, fingerprint: number): boolean => {
  const lo = words[2 * bucket]!
  const hi = words[2 * bucket + 1]!
  return (
    (lo & 0xffff) === fingerprint ||
    lo >>> 16 === fingerprint ||
    (hi & 0xffff) === fingerprint ||
    hi >>> 16 === fingerprint
  )
}

/**
 * The canonical addresses of blocks a simulated worker stored: what a filter holding them must
 * contain (PROTOCOL §3.3), computed from the tokens the worker sent, not asked of the relay.
 * A worker keeps the addresses of the blocks it holds only, so each address looked up while its
 * block is held is remembered here: a removed or cleared block's address stays available for
 * checking it is gone. A block never looked up while held throws (the test's mistake).
 */
export const addressesBy = (worker: { readonly addressOf: (hash: bigint) => bigint }) => {
  const taken = new Map<bigint, bigint>()
  return (hashes: ReadonlyArray<bigint>): Array<bigint> =>
    hashes.map((hash) => {
      let address: bigint
      try {
        address = worker.addressOf(hash)
      } catch (error) {
        const remembered = taken.get(hash)
        if (remembered === undefined) throw error
        return remembered
      }
      taken.set(hash, address)
      return address
    })
}

export const contains = (words: Uint32Array, format: DcCkfFormatIdentity, hash: bigint): boolean => {
  const { fingerprint, bucketA, bucketB } = prepare(hash, format.bucketCount, format.seed)
  return bucketHas(words, bucketA, fingerprint) || bucketHas(words, bucketB, fingerprint)
}

/** The endpoint's flushed filter words, once it has a pool generation. */
export const filterWords = (relay: KvDcRelayService, serving: EndpointId) =>
  Effect.gen(function* () {
    yield* relay.flush
    return yield* relay.diagnosticSnapshot(serving)
  }).pipe(
    Effect.option,
    Effect.map((snapshot) => (snapshot._tag === "Some" ? snapshot.value : undefined))
  )

/** Polls until the endpoint's filter holds every `present` hash and none of `absent`. */
export const awaitFilter = (
  relay: KvDcRelayService,
  serving: EndpointId,
  what: string,
  present: ReadonlyArray<bigint>,
  absent: ReadonlyArray<bigint> = []
) =>
  eventually(
    filterWords(relay, serving).pipe(
      Effect.map(
        (snapshot) =>
          snapshot !== undefined &&
          present.every((hash) => contains(snapshot.words, snapshot.producer.format, hash)) &&
          absent.every((hash) => !contains(snapshot.words, snapshot.producer.format, hash)) &&
          snapshot
      )
    ),
    what
  )

export const endpointStats = (relay: KvDcRelayService, serving: EndpointId) =>
  relay.stats.pipe(
    Effect.orDie,
    Effect.map((stats) => stats.endpoints.find((e) => e.servingEndpoint.toString() === serving.toString()))
  )

export const memberBlocks = (
  stats: EndpointStats | undefined,
  workerId: string,
  dpRank = 0
): number | undefined =>
  stats?.aggregation?.members.find((m) => m.workerId === workerId && m.dpRank === dpRank)?.blocks

export const poolOf = (relay: KvDcRelayService, serving: EndpointId, what: string) =>
  awaitCatalog(relay.catalogRef, what, (catalog) =>
    catalog.pools.some((d) => d.servingEndpoint.toString() === serving.toString())
  ).pipe(
    Effect.map((catalog) => catalog.pools.find((d) => d.servingEndpoint.toString() === serving.toString())!)
  )
