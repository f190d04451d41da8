/**
 * CKF configuration, its validation and the table sizing rule.
 */

import { DEFAULT_SEED, MAX_BUCKET_COUNT } from "./addressing.js"
import { CkfBuildError } from "./errors.js"

/** The most relocation steps a format may allow. */
export const MAX_KICKS = 4096
/** Relocation steps before an insert rolls back, by default. */
export const DEFAULT_MAX_KICKS = 500
/** The most positions a prefix search may verify below a tentative depth. */
export const MAX_VERIFICATION_WINDOW = 8
/** Positions a prefix search verifies by default. */
export const DEFAULT_VERIFICATION_WINDOW = 2
/** Lanes of the global CKF (one per relay). */
export const CKF_LANE_COUNT = 16
/** The CKF format version. */
export const FORMAT_VERSION = 1
/** Bits of a fingerprint. */
export const FINGERPRINT_BITS = 16
/** Fingerprint slots per bucket. */
export const SLOTS_PER_BUCKET = 4

/** How a pool's CKF is sized and seeded. */
export interface CkfConfig {
  /** Expected logical blocks per pool; sizes the table, which never resizes. */
  readonly expectedBlocksPerDc: number
  /** Shared addressing seed and the source of the producer RNG seed. */
  readonly seed: bigint
  /** Relocation steps before an insert rolls back (1..=4096). */
  readonly maxKicks: number
  /** Linear verification width of prefix search (1..=8). */
  readonly verificationWindow: number
  /** Normalized mutation events accumulated before a publication batch is emitted. */
  readonly publishEveryNEvents: number
}

/** `CkfConfig::new(expected)` with the defaults of the core. */
export const ckfConfig = (expectedBlocksPerDc: number, overrides: Partial<CkfConfig> = {}): CkfConfig => ({
  expectedBlocksPerDc,
  seed: DEFAULT_SEED,
  maxKicks: DEFAULT_MAX_KICKS,
  verificationWindow: DEFAULT_VERIFICATION_WINDOW,
  publishEveryNEvents: 1,
  ...overrides
})

/** Validation in the order of the reference: capacity, kicks, verification window, cadence. */
export const validateCkfConfig = (config: CkfConfig): CkfBuildError | undefined => {
  if (!Number.isSafeInteger(config.expectedBlocksPerDc) || config.expectedBlocksPerDc <= 0) {
    return new CkfBuildError("ExpectedCapacityZero", "expected_blocks_per_dc must be greater than zero")
  }
  if (!Number.isInteger(config.maxKicks) || config.maxKicks < 1 || config.maxKicks > MAX_KICKS) {
    return new CkfBuildError(
      "InvalidMaxKicks",
      `max_kicks ${config.maxKicks} must be in 1..=${MAX_KICKS}`,
      config.maxKicks
    )
  }
  if (
    !Number.isInteger(config.verificationWindow) ||
    config.verificationWindow < 1 ||
    config.verificationWindow > MAX_VERIFICATION_WINDOW
  ) {
    return new CkfBuildError(
      "InvalidVerificationWindow",
      `verification_window ${config.verificationWindow} must be in 1..=${MAX_VERIFICATION_WINDOW}`,
      config.verificationWindow
    )
  }
  if (!Number.isSafeInteger(config.publishEveryNEvents) || config.publishEveryNEvents <= 0) {
    return new CkfBuildError("InvalidPublishEveryNEvents", "publish_every_n_events must be greater than zero")
  }
  return undefined
}

/**
 * Bucket count for an expected block count: `next_power_of_two(max(2, floor((5E + 15) / 16)))`,
 * i.e. at least 1.25 slots per expected block at 4 slots per bucket (load ≤ 0.8).
 *
 * Counts above 2^24 buckets are reported as `CapacityOverflow`: CBI1 cannot carry them.
 */
export const bucketCountFor = (expectedBlocks: number): number => {
  if (!Number.isSafeInteger(expectedBlocks) || expectedBlocks <= 0) {
    throw new CkfBuildError("ExpectedCapacityZero", "expected_blocks_per_dc must be greater than zero")
  }
  const required = Math.max(2, Math.floor((expectedBlocks * 5 + 15) / 16))
  if (required > MAX_BUCKET_COUNT) {
    throw new CkfBuildError(
      "CapacityOverflow",
      `expected ${expectedBlocks} blocks need more than ${MAX_BUCKET_COUNT} buckets (the CBI1 limit)`
    )
  }
  let count = 2
  while (count < required) count *= 2
  return count
}
