/**
 * `kvrelay/ckf`: the CKF core's public API. Plain synchronous TypeScript over typed arrays; the
 * bigint signatures (`prepare`, `DcCkfState.store`, …) are conveniences at the edge, the hot paths
 * take hash pairs (`Uint32Array` `[hi, lo]*`).
 */

export {
  ALTERNATE_BUCKET_DOMAIN,
  bucketDelta,
  CkfAddressing,
  DEFAULT_SEED,
  MAX_BUCKET_COUNT,
  type PreparedHash,
  prepare
} from "./addressing.js"
export * from "./cacheNamespace.js"
export * from "./cbi1.js"
export {
  bucketCountFor,
  CKF_LANE_COUNT,
  type CkfConfig,
  ckfConfig,
  DEFAULT_MAX_KICKS,
  DEFAULT_VERIFICATION_WINDOW,
  FINGERPRINT_BITS,
  FORMAT_VERSION,
  MAX_KICKS,
  MAX_VERIFICATION_WINDOW,
  SLOTS_PER_BUCKET,
  validateCkfConfig
} from "./config.js"
export * from "./errors.js"
export * from "./events.js"
export * from "./failure.js"
export * from "./global.js"
export * from "./identity.js"
export * from "./publisher.js"
export * from "./search.js"
export { laneRngSeed, SplitMix64, stickyWorker } from "./splitmix.js"
export * from "./state.js"
export { DISK_TIER, HOST_TIER, type LowerTierIndex, lowerTierOf } from "./tiers.js"
export { TransposedCkfTable } from "./transposed.js"
export * from "./u64.js"
export * from "./workerQuery.js"
export { Xxh3Seeded, xxh3Hash, xxh3Low32 } from "./xxh3.js"
