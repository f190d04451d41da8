/**
 * An in-process tour of the CKF core: two DC producers track workers' blocks, publish CBI1
 * snapshots and deltas, a 16-lane consumer installs them and answers prefix queries.
 */

import { decodeCbi1, encodeCbi1Delta, encodeCbi1Snapshot } from "../ckf/cbi1.js"
import { ckfConfig } from "../ckf/config.js"
import { GlobalCkfIndexer, GlobalCkfManifest } from "../ckf/global.js"
import { IndexerDomainId, LaneLease, PoolId, ProducerIdentity } from "../ckf/identity.js"
import { type DcCkfDelta, DcCkfPublisher } from "../ckf/publisher.js"
import { DcCkfState } from "../ckf/state.js"
import { hashPairs } from "../ckf/u64.js"
import { storedEvent } from "../protocol/Events.js"
import { cacheSemanticsId, routingScopeId, stableDcId } from "../protocol/Identity.js"

export const runCkfDemo = (write: (line: string) => void): void => {
  const domain = new IndexerDomainId(
    cacheSemanticsId({ defaults: ["meta/llama"], kvBlockSize: 64, hashFormat: "dynamo_standard_v1" }),
    routingScopeId({ defaults: ["prod", "backend", "generate"] })
  )
  const dcs = ["us-east", "eu-west"].map((name) => ({ name, pool: new PoolId(domain, stableDcId(name)) }))
  const config = ckfConfig(65_536, { publishEveryNEvents: 4 })
  const consumer = 0xc0ffeen
  const probe = new DcCkfState(config)
  const indexer = new GlobalCkfIndexer(
    new GlobalCkfManifest(
      consumer,
      domain,
      probe.format,
      dcs.map((dc) => dc.pool)
    )
  )
  // Prompts are chains of block hashes; DC 0 caches 12 blocks of prompt A, DC 1 caches 4.
  const promptA = Array.from({ length: 16 }, (_, i) => 0x1000n + BigInt(i))
  const promptB = Array.from({ length: 16 }, (_, i) => 0x2000n + BigInt(i))
  const cached = [
    [promptA.slice(0, 12), promptB.slice(0, 2)],
    [promptA.slice(0, 4), promptB]
  ]
  dcs.forEach((dc, lane) => {
    const state = new DcCkfState(config)
    const identity = new ProducerIdentity(dc.pool, 1n, 1n, state.format)
    const deltas: Array<DcCkfDelta> = []
    const publisher = new DcCkfPublisher(identity, 0n, { enqueue: (d: DcCkfDelta) => void deltas.push(d) })
    const lease = new LaneLease(consumer, lane, 1n)
    const snapshot = publisher.snapshotAfterBarrier(state, lease)
    if (snapshot instanceof Error) throw snapshot
    const expected = { format: state.format, dcId: dc.pool.dcId.value }
    const chunks = encodeCbi1Snapshot(expected, snapshot.sequence, snapshot.words)
    if (chunks instanceof Error) throw chunks
    const ingestor = indexer.claimLane(lane)
    if (ingestor instanceof Error) throw ingestor
    ingestor.assign(identity, lease)
    ingestor.installSnapshot(snapshot)
    let eventId = 1
    for (const hashes of cached[lane]!) {
      for (let i = 0; i < hashes.length; i += 4) {
        const outcome = state.applyEvent(storedEvent(7 + lane, 0, eventId++, hashes.slice(i, i + 4)))
        if (outcome.publication !== undefined) publisher.publish(outcome.publication)
      }
    }
    const tail = state.flush()
    if (tail !== undefined) publisher.publish(tail)
    let wireBytes = chunks.reduce((n, c) => n + c.length, 0)
    for (const delta of deltas) {
      const frame = encodeCbi1Delta(expected, delta.baseSequence, delta.sequence, delta.images)
      if (frame instanceof Error) throw frame
      wireBytes += frame.length
      const decoded = decodeCbi1(frame, expected)
      if (decoded instanceof Error || decoded._tag !== "Delta") throw new Error("delta did not round-trip")
      ingestor.applyDelta({ ...delta, images: decoded.images })
    }
    const stats = state.stats()
    write(
      `DC ${dc.name.padEnd(8)} pool ${dc.pool.dcId.hex}: ${stats.aggregation.uniqueBlockCount} blocks, ` +
        `${deltas.length} deltas (${stats.publication.emittedImages} bucket images), ${wireBytes} CBI1 bytes, lane ${lane} at sequence ${ingestor.installedSequence}`
    )
  })
  for (const [name, prompt] of [
    ["prompt A", promptA],
    ["prompt B", promptB],
    ["unseen", Array.from({ length: 16 }, (_, i) => 0x9000n + BigInt(i))]
  ] as const) {
    const result = indexer.findPrefixMatches(hashPairs(prompt))
    if (result === "Unavailable") throw new Error("no ready lanes")
    const depths = dcs.map((dc, lane) => `${dc.name} ${result.lanes[lane]?.prefixDepth ?? 0}`).join(", ")
    write(`${name.padEnd(9)} → matched prefix blocks: ${depths}`)
  }
}
