/**
 * `DcCkfPublisher`: sequences the producer's unsequenced batches into deltas for one lane lease.
 *
 * Sequence numbers count emitted batches, not events; they exist for FIFO continuation and gap
 * detection. A snapshot tagged N is continued by the delta N → N+1.
 */

import type { CkfBuildError } from "./errors.js"
import type { ConsumerDrainMarker, LaneLease, ProducerIdentity } from "./identity.js"
import type { DcCkfPublicationBatch, DcCkfState } from "./state.js"
import { U64_MAX } from "./u64.js"

/** A delta the publisher emits: bucket images between two sequences. */
export interface DcCkfDelta {
  readonly identity: ProducerIdentity
  readonly lease: LaneLease
  readonly baseSequence: bigint
  readonly sequence: bigint
  /** Absolute images `[bucket, wordLo, wordHi]*`. */
  readonly images: Uint32Array
}

/** A snapshot the publisher emits: every bucket word at a sequence. */
export interface DcCkfSnapshot {
  readonly identity: ProducerIdentity
  readonly lease: LaneLease
  readonly sequence: bigint
  /** Every bucket word as `[lo, hi]` pairs. */
  readonly words: Uint32Array
}

/** Why a publisher stopped publishing. */
export type FenceReason = "SequenceExhausted" | "DeliveryUncertain" | "LeaseStalled"

/** Where deltas go; returns an error value when the next owner did not accept the whole delta. */
export interface DcCkfDeltaSink<E> {
  enqueue(delta: DcCkfDelta): E | undefined
}

/** What an emit did: published, nothing to publish, or fenced. */
export type PublisherEmitOutcome =
  | { readonly _tag: "Published"; readonly sequence: bigint; readonly imageCount: number }
  | { readonly _tag: "NoSubscriber"; readonly sequence: bigint }

/** The sink refused a delta; `cause` is its error. */
export class DcCkfPublishError<E> extends Error {
  readonly _tag = "DcCkfPublishError"
  constructor(
    readonly reason:
      | { readonly _tag: "Fenced"; readonly fence: FenceReason }
      | { readonly _tag: "Enqueue"; readonly error: E }
  ) {
    super(
      reason._tag === "Fenced"
        ? `publisher fenced: ${reason.fence}`
        : `delta enqueue failed: ${String(reason.error)}`
    )
    this.name = "DcCkfPublishError"
  }
}

/** The sink refused a snapshot; `cause` is its error. */
export class PublisherSnapshotError<E> extends Error {
  readonly _tag = "PublisherSnapshotError"
  constructor(
    readonly reason:
      | { readonly _tag: "Build"; readonly error: CkfBuildError }
      | { readonly _tag: "Publish"; readonly error: DcCkfPublishError<E> }
      | { readonly _tag: "SequenceExhausted" }
  ) {
    super(
      reason._tag === "Build"
        ? `snapshot build failed: ${reason.error.message}`
        : reason._tag === "Publish"
          ? `old-lease tail publication failed: ${reason.error.message}`
          : "publication sequence exhausted; a new producer generation is required"
    )
    this.name = "PublisherSnapshotError"
  }
}

/** Publishes a pool's CKF changes as deltas and snapshots, in sequence, under a lease. */
export class DcCkfPublisher<E = unknown> {
  private currentLease: LaneLease | undefined = undefined
  private last: bigint
  private fenced: FenceReason | undefined = undefined

  constructor(
    readonly identity: ProducerIdentity,
    initialSequence: bigint,
    readonly sink: DcCkfDeltaSink<E>
  ) {
    this.last = initialSequence
  }

  get lease(): LaneLease | undefined {
    return this.currentLease
  }

  get lastSequence(): bigint {
    return this.last
  }

  get fenceReason(): FenceReason | undefined {
    return this.fenced
  }

  publish(batch: DcCkfPublicationBatch): PublisherEmitOutcome | DcCkfPublishError<E> {
    if (this.fenced !== undefined) return new DcCkfPublishError<E>({ _tag: "Fenced", fence: this.fenced })
    const lease = this.currentLease
    // Without a lease the batch is dropped: the next snapshot covers it.
    if (lease === undefined) return { _tag: "NoSubscriber", sequence: this.last }
    if (this.last === U64_MAX) {
      this.fenced = "SequenceExhausted"
      return new DcCkfPublishError<E>({ _tag: "Fenced", fence: "SequenceExhausted" })
    }
    const next = this.last + 1n
    const error = this.sink.enqueue({
      identity: this.identity,
      lease,
      baseSequence: this.last,
      sequence: next,
      images: batch.images
    })
    if (error !== undefined) {
      // The sequence does not advance: the delivery is uncertain and only a snapshot repairs it.
      this.fenced = "DeliveryUncertain"
      return new DcCkfPublishError<E>({ _tag: "Enqueue", error })
    }
    this.last = next
    return { _tag: "Published", sequence: next, imageCount: batch.imageCount }
  }

  retireLease(): void {
    this.currentLease = undefined
  }

  retireStalledLease(): void {
    this.currentLease = undefined
    this.fenced = "LeaseStalled"
  }

  /**
   * Barrier snapshot for a new lease: the old lease's tail goes out first (unless fenced), then
   * the lease switches and the fence clears. The snapshot is tagged with the last sequence.
   */
  snapshotAfterBarrier(state: DcCkfState, newLease: LaneLease): DcCkfSnapshot | PublisherSnapshotError<E> {
    if (this.last === U64_MAX || this.fenced === "SequenceExhausted") {
      return new PublisherSnapshotError<E>({ _tag: "SequenceExhausted" })
    }
    const barrier = state.barrierSnapshot()
    if (!("words" in barrier)) return new PublisherSnapshotError<E>({ _tag: "Build", error: barrier })
    if (this.fenced === undefined && barrier.tail !== undefined) {
      const outcome = this.publish(barrier.tail)
      if (outcome instanceof DcCkfPublishError) {
        if (outcome.reason._tag === "Fenced" && outcome.reason.fence === "SequenceExhausted") {
          return new PublisherSnapshotError<E>({ _tag: "SequenceExhausted" })
        }
        return new PublisherSnapshotError<E>({ _tag: "Publish", error: outcome })
      }
    }
    this.currentLease = newLease
    this.fenced = undefined
    return { identity: this.identity, lease: newLease, sequence: this.last, words: barrier.words }
  }

  exactDrainMarker(): ConsumerDrainMarker | undefined {
    return this.currentLease === undefined
      ? undefined
      : { lease: this.currentLease, expectedSequence: this.last }
  }
}
