/**
 * Identity values shared by the producer and the consumer: digests, the indexer domain, the DC
 * dimension, pools, producer generations, the CKF format and consumer lane leases.
 *
 * They are immutable value classes with structural `equals`, a total `compare` where the
 * reference orders them, and a canonical `key` string for use as a map key. Their derivation
 * (BLAKE3) and JSON codecs live in `src/domain`.
 */

import { FINGERPRINT_BITS, FORMAT_VERSION, SLOTS_PER_BUCKET } from "./config.js"
import { hex16 } from "./u64.js"

/** Where an identity's material came from. */
export type IdentitySource = "default_derived" | "explicit"

const sourceRank = (source: IdentitySource): number => (source === "default_derived" ? 0 : 1)

const toHex = (bytes: Uint8Array): string => {
  let out = ""
  for (let i = 0; i < bytes.length; i++) out += bytes[i]!.toString(16).padStart(2, "0")
  return out
}

/** A 16-byte digest plus how it was derived. Equality and order include the source. */
abstract class DigestIdentity {
  readonly hex: string
  constructor(
    readonly digest: Uint8Array,
    readonly source: IdentitySource
  ) {
    if (digest.length !== 16) throw new RangeError(`identity digest must be 16 bytes, got ${digest.length}`)
    this.hex = toHex(digest)
  }
  get key(): string {
    return `${this.hex}${this.source === "explicit" ? "e" : "d"}`
  }
  toString(): string {
    return this.hex
  }
  compareTo(other: DigestIdentity): number {
    if (this.hex !== other.hex) return this.hex < other.hex ? -1 : 1
    return sourceRank(this.source) - sourceRank(other.source)
  }
  equalsDigest(other: DigestIdentity): boolean {
    return this.hex === other.hex && this.source === other.source
  }
}

/** The identity of what makes KV caches interchangeable (model, weights, format). */
export class CacheSemanticsId extends DigestIdentity {
  readonly _kind = "CacheSemanticsId"
  equals(other: CacheSemanticsId): boolean {
    return this.equalsDigest(other)
  }
}

/** The identity of the scope routers choose workers in. */
export class RoutingScopeId extends DigestIdentity {
  readonly _kind = "RoutingScopeId"
  equals(other: RoutingScopeId): boolean {
    return this.equalsDigest(other)
  }
}

/** The identity of an indexer domain: cache semantics and routing scope together. */
export class IndexerDomainId {
  readonly key: string
  constructor(
    readonly cacheSemantics: CacheSemanticsId,
    readonly routingScope: RoutingScopeId
  ) {
    this.key = `${cacheSemantics.key}:${routingScope.key}`
  }
  /** True when either part was derived from defaults rather than explicit identity material. */
  get reliesOnDefaults(): boolean {
    return this.cacheSemantics.source === "default_derived" || this.routingScope.source === "default_derived"
  }
  equals(other: IndexerDomainId): boolean {
    return this.key === other.key
  }
  compareTo(other: IndexerDomainId): number {
    return (
      this.cacheSemantics.compareTo(other.cacheSemantics) || this.routingScope.compareTo(other.routingScope)
    )
  }
  toString(): string {
    return `${this.cacheSemantics.hex}:${this.routingScope.hex}`
  }
}

/** The DC dimension of a pool: a stable u64. */
export class DcId {
  readonly hex: string
  constructor(readonly value: bigint) {
    this.hex = hex16(BigInt.asUintN(64, value))
  }
  equals(other: DcId): boolean {
    return this.value === other.value
  }
  compareTo(other: DcId): number {
    return this.value < other.value ? -1 : this.value > other.value ? 1 : 0
  }
  toString(): string {
    return this.hex
  }
}

/** The identity of a pool: its indexer domain and DC. */
export class PoolId {
  readonly key: string
  constructor(
    readonly indexerDomain: IndexerDomainId,
    readonly dcId: DcId
  ) {
    this.key = `${indexerDomain.key}/${dcId.hex}`
  }
  equals(other: PoolId): boolean {
    return this.key === other.key
  }
  /** Lexicographic over (cache digest, cache source, routing digest, routing source, dc id). */
  compareTo(other: PoolId): number {
    return this.indexerDomain.compareTo(other.indexerDomain) || this.dcId.compareTo(other.dcId)
  }
  toString(): string {
    return `${this.indexerDomain}/${this.dcId}`
  }
}

/** The packed format of a CKF: all five fields participate in equality. */
export class DcCkfFormatIdentity {
  constructor(
    readonly seed: bigint,
    readonly bucketCount: number,
    readonly formatVersion: number = FORMAT_VERSION,
    readonly fingerprintBits: number = FINGERPRINT_BITS,
    readonly slotsPerBucket: number = SLOTS_PER_BUCKET
  ) {}
  equals(other: DcCkfFormatIdentity): boolean {
    return (
      this.seed === other.seed &&
      this.bucketCount === other.bucketCount &&
      this.formatVersion === other.formatVersion &&
      this.fingerprintBits === other.fingerprintBits &&
      this.slotsPerBucket === other.slotsPerBucket
    )
  }
  get key(): string {
    return `${this.formatVersion}/${this.seed}/${this.bucketCount}/${this.fingerprintBits}/${this.slotsPerBucket}`
  }
}

/** The frozen subscription key of one producer generation. */
export class ProducerIdentity {
  readonly key: string
  constructor(
    readonly poolId: PoolId,
    readonly producerIncarnation: bigint,
    readonly layoutGeneration: bigint,
    readonly format: DcCkfFormatIdentity
  ) {
    this.key = `${poolId.key}#${producerIncarnation}#${layoutGeneration}#${format.key}`
  }
  get indexerDomain(): IndexerDomainId {
    return this.poolId.indexerDomain
  }
  get dcId(): DcId {
    return this.poolId.dcId
  }
  equals(other: ProducerIdentity): boolean {
    return this.key === other.key
  }
}

/** Identifies one consumer process instance (the owner of lane leases). */
export type ConsumerInstanceId = bigint

/** A lease of one consumer lane for one assignment epoch. */
export class LaneLease {
  constructor(
    readonly consumerInstance: ConsumerInstanceId,
    readonly physicalLane: number,
    readonly assignmentEpoch: bigint
  ) {}
  equals(other: LaneLease | undefined): boolean {
    return (
      other !== undefined &&
      this.consumerInstance === other.consumerInstance &&
      this.physicalLane === other.physicalLane &&
      this.assignmentEpoch === other.assignmentEpoch
    )
  }
  toString(): string {
    return `lease(${this.consumerInstance}, lane ${this.physicalLane}, epoch ${this.assignmentEpoch})`
  }
}

/** Expected final sequence of an exact consumer drain. */
export interface ConsumerDrainMarker {
  readonly lease: LaneLease
  readonly expectedSequence: bigint
}
