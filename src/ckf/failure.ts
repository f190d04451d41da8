/**
 * Failure points of the CKF core and their dispositions: recovery follows the domain whose commit
 * became uncertain, not the error's name.
 */

import type { KvCacheEventErrorKind } from "./errors.js"

/** Where a CKF operation can fail. */
export type CkfFailurePoint =
  | "BoundedRelocationFailure"
  | "PrecommitAllocationFailure"
  | "SourceProtocolFailure"
  | "PrewriteInvariantMismatch"
  | "ConsumerGapOrMalformedBeforeWrite"
  | "ConsumerWorkerFailureMidApply"
  | "InactiveSnapshotInstallFailure"

/** Whose failure it is: the producer's core or a consumer lane. */
export type CkfFailureDomain = "ProducerCore" | "ConsumerLane"
/** Whether a failed operation left the state as it was, or maybe half-changed. */
export type CkfCommitState = "KnownUnchanged" | "Uncertain"
/** What the owner of the state must do after a failure. */
export type CkfFailureAction =
  | "ContinueCapacityOmission"
  | "ReportResourceFailure"
  | "RejectSource"
  | "FenceAndRebuildProducer"
  | "DeactivateAndSnapshot"
  | "RetrySnapshot"

/** A failure point with its domain, commit state and the action it calls for. */
export interface CkfFailureDisposition {
  readonly point: CkfFailurePoint
  readonly domain: CkfFailureDomain
  readonly commit: CkfCommitState
  readonly recoveryDomain: CkfFailureDomain | undefined
  readonly action: CkfFailureAction
}

const disposition = (
  point: CkfFailurePoint,
  domain: CkfFailureDomain,
  commit: CkfCommitState,
  recoveryDomain: CkfFailureDomain | undefined,
  action: CkfFailureAction
): CkfFailureDisposition => Object.freeze({ point, domain, commit, recoveryDomain, action })

const DISPOSITIONS: Record<CkfFailurePoint, CkfFailureDisposition> = {
  BoundedRelocationFailure: disposition(
    "BoundedRelocationFailure",
    "ProducerCore",
    "KnownUnchanged",
    undefined,
    "ContinueCapacityOmission"
  ),
  PrecommitAllocationFailure: disposition(
    "PrecommitAllocationFailure",
    "ProducerCore",
    "KnownUnchanged",
    undefined,
    "ReportResourceFailure"
  ),
  SourceProtocolFailure: disposition(
    "SourceProtocolFailure",
    "ProducerCore",
    "KnownUnchanged",
    undefined,
    "RejectSource"
  ),
  PrewriteInvariantMismatch: disposition(
    "PrewriteInvariantMismatch",
    "ProducerCore",
    "KnownUnchanged",
    "ProducerCore",
    "FenceAndRebuildProducer"
  ),
  ConsumerGapOrMalformedBeforeWrite: disposition(
    "ConsumerGapOrMalformedBeforeWrite",
    "ConsumerLane",
    "KnownUnchanged",
    "ConsumerLane",
    "DeactivateAndSnapshot"
  ),
  ConsumerWorkerFailureMidApply: disposition(
    "ConsumerWorkerFailureMidApply",
    "ConsumerLane",
    "Uncertain",
    "ConsumerLane",
    "DeactivateAndSnapshot"
  ),
  InactiveSnapshotInstallFailure: disposition(
    "InactiveSnapshotInstallFailure",
    "ConsumerLane",
    "KnownUnchanged",
    "ConsumerLane",
    "RetrySnapshot"
  )
}

/** What a failure at `point` calls for. */
export const failureDisposition = (point: CkfFailurePoint): CkfFailureDisposition => DISPOSITIONS[point]

/** The failure point of a producer apply error. */
export const eventFailurePoint = (kind: KvCacheEventErrorKind): CkfFailurePoint => {
  switch (kind) {
    case "CapacityExhausted":
      return "BoundedRelocationFailure"
    case "AllocationFailed":
      return "PrecommitAllocationFailure"
    case "IndexerInvariantViolation":
      return "PrewriteInvariantMismatch"
    case "OwnershipDegreeOverflow":
    case "ParentBlockNotFound":
    case "BlockNotFound":
    case "InvalidBlockSequence":
    case "UnsupportedResidencyDomain":
      return "SourceProtocolFailure"
  }
}
