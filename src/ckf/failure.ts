/**
 * Failure points of the CKF core and their dispositions: recovery follows the domain whose commit
 * became uncertain, not the error's name.
 */

import type { KvCacheEventErrorKind } from "./errors.js"

export type CkfFailurePoint =
  | "BoundedRelocationFailure"
  | "PrecommitAllocationFailure"
  | "SourceProtocolFailure"
  | "PrewriteInvariantMismatch"
  | "ConsumerGapOrMalformedBeforeWrite"
  | "ConsumerWorkerFailureMidApply"
  | "InactiveSnapshotInstallFailure"

export type CkfFailureDomain = "ProducerCore" | "ConsumerLane"
export type CkfCommitState = "KnownUnchanged" | "Uncertain"
export type CkfFailureAction =
  | "ContinueCapacityOmission"
  | "ReportResourceFailure"
  | "RejectSource"
  | "FenceAndRebuildProducer"
  | "DeactivateAndSnapshot"
  | "RetrySnapshot"

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
