import { describe, expect, it } from "vitest"
import { ckfConfig } from "../../src/ckf/config.js"
import {
  CacheSemanticsId,
  DcId,
  IndexerDomainId,
  LaneLease,
  PoolId,
  ProducerIdentity,
  RoutingScopeId
} from "../../src/ckf/identity.js"
import {
  type DcCkfDelta,
  DcCkfPublishError,
  DcCkfPublisher,
  PublisherSnapshotError
} from "../../src/ckf/publisher.js"
import { DcCkfState } from "../../src/ckf/state.js"
import { hashPairs, U64_MAX } from "../../src/ckf/u64.js"

const pool = new PoolId(
  new IndexerDomainId(
    new CacheSemanticsId(new Uint8Array(16).fill(1), "explicit"),
    new RoutingScopeId(new Uint8Array(16).fill(3), "explicit")
  ),
  new DcId(2n)
)

const lease = (epoch: bigint) => new LaneLease(4n, 0, epoch)

class CollectingSink {
  readonly deltas: Array<DcCkfDelta> = []
  failWith: string | undefined
  enqueue(delta: DcCkfDelta): string | undefined {
    if (this.failWith !== undefined) return this.failWith
    this.deltas.push(delta)
    return undefined
  }
}

const setup = (initial: bigint, publishEveryNEvents = 1) => {
  const state = new DcCkfState(ckfConfig(64, { publishEveryNEvents }))
  const identity = new ProducerIdentity(pool, 1n, 1n, state.format)
  const sink = new CollectingSink()
  const publisher = new DcCkfPublisher(identity, initial, sink)
  return { state, identity, sink, publisher }
}

const store = (state: DcCkfState, hashes: Array<number>) =>
  state.applyEvent({
    workerId: "1",
    dpRank: 0,
    storageTier: "device",
    data: { _tag: "Stored", blockHashes: hashPairs(hashes) }
  })

describe("DcCkfPublisher", () => {
  it("continues a snapshot tagged N with the delta N → N+1 and expects N+1 at drain", () => {
    const { state, sink, publisher } = setup(7n)
    const snapshot = publisher.snapshotAfterBarrier(state, lease(1n))
    if (snapshot instanceof PublisherSnapshotError) throw snapshot
    expect(snapshot.sequence).toBe(7n)
    const batch = store(state, [1]).publication!
    expect(publisher.publish(batch)).toEqual({ _tag: "Published", sequence: 8n, imageCount: 1 })
    expect(sink.deltas.map((d) => [d.baseSequence, d.sequence])).toEqual([[7n, 8n]])
    expect(publisher.exactDrainMarker()).toEqual({ lease: lease(1n), expectedSequence: 8n })
  })

  it("drops batches without a lease; the next snapshot covers them", () => {
    const { state, sink, publisher } = setup(0n)
    const batch = store(state, [1]).publication!
    expect(publisher.publish(batch)).toEqual({ _tag: "NoSubscriber", sequence: 0n })
    expect(sink.deltas).toHaveLength(0)
    expect(publisher.exactDrainMarker()).toBeUndefined()
    const snapshot = publisher.snapshotAfterBarrier(state, lease(1n))
    if (snapshot instanceof PublisherSnapshotError) throw snapshot
    expect(snapshot.words).toEqual(state.snapshotWords())
  })

  it("publishes the old lease's tail before the snapshot for the new lease", () => {
    const { state, sink, publisher } = setup(0n, 16)
    publisher.snapshotAfterBarrier(state, lease(1n))
    store(state, [7])
    const snapshot = publisher.snapshotAfterBarrier(state, lease(2n))
    if (snapshot instanceof PublisherSnapshotError) throw snapshot
    expect(sink.deltas).toHaveLength(1)
    expect(sink.deltas[0]!.lease.equals(lease(1n))).toBe(true)
    expect(snapshot.sequence).toBe(sink.deltas[0]!.sequence)
    expect(snapshot.lease.equals(lease(2n))).toBe(true)
  })

  it("fences on an enqueue failure without advancing the sequence, and a snapshot clears it", () => {
    const { state, sink, publisher } = setup(3n, 16)
    publisher.snapshotAfterBarrier(state, lease(1n))
    sink.failWith = "closed"
    const result = publisher.publish(store(state, [1]).publication ?? state.flush()!)
    expect(result).toBeInstanceOf(DcCkfPublishError)
    expect(publisher.fenceReason).toBe("DeliveryUncertain")
    expect(publisher.lastSequence).toBe(3n)
    const fenced = publisher.publish(store(state, [2]).publication ?? state.flush()!)
    expect(fenced instanceof DcCkfPublishError && fenced.reason._tag === "Fenced").toBe(true)
    // The uncertain tail is not sent; the snapshot covers it.
    sink.failWith = undefined
    store(state, [3])
    const snapshot = publisher.snapshotAfterBarrier(state, lease(2n))
    if (snapshot instanceof PublisherSnapshotError) throw snapshot
    expect(sink.deltas).toHaveLength(0)
    expect(publisher.fenceReason).toBeUndefined()
    expect(snapshot.sequence).toBe(3n)
  })

  it("fences with SequenceExhausted at u64::MAX and refuses snapshots", () => {
    const { state, publisher } = setup(U64_MAX - 1n)
    publisher.snapshotAfterBarrier(state, lease(1n))
    expect(publisher.publish(store(state, [1]).publication!)).toMatchObject({
      _tag: "Published",
      sequence: U64_MAX
    })
    const exhausted = publisher.publish(store(state, [2]).publication!)
    expect(exhausted instanceof DcCkfPublishError && exhausted.reason).toEqual({
      _tag: "Fenced",
      fence: "SequenceExhausted"
    })
    const snapshot = publisher.snapshotAfterBarrier(state, lease(2n))
    expect(snapshot instanceof PublisherSnapshotError && snapshot.reason._tag).toBe("SequenceExhausted")
  })

  it("retires a stalled lease with a fence, a plain retirement without one", () => {
    const { state, publisher } = setup(0n)
    publisher.snapshotAfterBarrier(state, lease(1n))
    publisher.retireLease()
    expect(publisher.lease).toBeUndefined()
    expect(publisher.fenceReason).toBeUndefined()
    publisher.snapshotAfterBarrier(state, lease(2n))
    publisher.retireStalledLease()
    expect(publisher.fenceReason).toBe("LeaseStalled")
  })
})
