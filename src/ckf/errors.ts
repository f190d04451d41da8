/**
 * Typed errors of the CKF core. They are plain classes (the core has no Effect dependency) with a
 * `_tag` discriminant, so the Effect layers can catch them by tag.
 */

/** Why a CKF could not be built. */
export type CkfBuildErrorKind =
  | "ExpectedCapacityZero"
  | "InvalidMaxKicks"
  | "InvalidVerificationWindow"
  | "InvalidPublishEveryNEvents"
  | "CapacityOverflow"
  | "AllocationFailed"

/** Construction or allocation failure of CKF storage. */
export class CkfBuildError extends Error {
  readonly _tag = "CkfBuildError"
  constructor(
    readonly kind: CkfBuildErrorKind,
    message: string,
    readonly value?: number
  ) {
    super(message)
    this.name = "CkfBuildError"
  }
}

/** The apply-time error kinds of a producer (`KvCacheEventError`). */
export type KvCacheEventErrorKind =
  | "ParentBlockNotFound"
  | "BlockNotFound"
  | "InvalidBlockSequence"
  | "CapacityExhausted"
  | "AllocationFailed"
  | "OwnershipDegreeOverflow"
  | "IndexerInvariantViolation"
  | "UnsupportedResidencyDomain"

const EVENT_ERROR_TEXT: Record<KvCacheEventErrorKind, string> = {
  ParentBlockNotFound: "parent block not found",
  BlockNotFound: "block not found",
  InvalidBlockSequence: "invalid block sequence",
  CapacityExhausted: "cuckoo filter capacity exhausted (bounded relocation failed)",
  AllocationFailed: "allocation failed before commit",
  OwnershipDegreeOverflow: "ownership degree overflow (u32 refcount saturated)",
  IndexerInvariantViolation: "indexer invariant violation (exact state and filter disagree)",
  UnsupportedResidencyDomain: "unsupported residency domain"
}

/** A producer apply error carried as a value (outcomes and transactional results). */
export class KvCacheEventError extends Error {
  readonly _tag = "KvCacheEventError"
  constructor(readonly kind: KvCacheEventErrorKind) {
    super(EVENT_ERROR_TEXT[kind])
    this.name = "KvCacheEventError"
  }
}

/** The words a refused event's kind is reported in. */
export const eventErrorText = (kind: KvCacheEventErrorKind): string => EVENT_ERROR_TEXT[kind]
