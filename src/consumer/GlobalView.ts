/**
 * The query side of the global consumer, for in-process routers and the HTTP API
 * (PROTOCOL.md §7): which ready DC lane holds how long a prefix of a prompt.
 *
 * Relays address their filters by canonical sequence hashes (PROTOCOL §3.3), so a query gives
 * the prompt's `tokens` (cut into blocks of each domain's `kvBlockSize` and hashed by its
 * `hashFormat`, a partial last block not counting) or the `localBlockHashes` a router computed
 * itself; either way the consumer chains them into sequence hashes and probes those. A request
 * names its domains either by model (every domain one of whose lanes' pools registers the
 * model, or an alias of it, in the namespace) or directly by pool domain. The answer has one
 * entry per ready lane of every matching domain, deepest prefix first.
 */

import { Context, Effect, Layer } from "effect"
import type { IndexerDomainId, PoolId, ProducerIdentity } from "../ckf/identity.js"
import {
  blockHashSeed,
  fullBlockCount,
  localHashesInto,
  sequenceHashes,
  sequenceHashesInto
} from "../ckf/tokens.js"
import { hashPairs } from "../ckf/u64.js"
import type { DcPoolDescriptor, EndpointId, KvQuerySemantics } from "../protocol/Model.js"
import {
  AdapterNotFound,
  ModelNotFound,
  NoMatchingDomain,
  NoReadyLane,
  type OverlapError
} from "./ConsumerErrors.js"
import {
  type DomainStatus,
  GlobalConsumer,
  type GlobalConsumerService,
  type LaneStatus
} from "./GlobalConsumer.js"

// ---------------------------------------------------------------------------------------------
// Requests, results, errors

/** Block hashes as u64 values, or already as hash pairs (`[hi, lo]*`) on the hot path. */
type BlockHashes = ReadonlyArray<bigint> | Uint32Array

/** Which domains a query asks: those serving a model in a namespace, or one pool domain. */
type OverlapTarget =
  | { readonly namespace: string; readonly model: string }
  | { readonly poolDomain: IndexerDomainId }

/**
 * What a query probes: the prompt's token ids (u32; with the LoRA adapter's name for adapter
 * traffic), or its local block hashes (already salted by the adapter, one per full block), or,
 * in process only, the canonical sequence hashes themselves (`kvrelay/client` computes them),
 * for a router that hashes a prompt once and probes it many times.
 */
type OverlapKeys =
  | { readonly tokens: ArrayLike<number>; readonly loraName?: string | null | undefined }
  | { readonly localBlockHashes: BlockHashes }
  | { readonly sequenceHashes: BlockHashes }

/**
 * An overlap query: what it is about (model or domain) and what it matches (tokens or local
 * hashes).
 */
export type OverlapRequest = OverlapTarget & OverlapKeys

/** One ready lane's answer to an overlap query. */
export interface OverlapResult {
  /** The relay's name from `--relay NAME=URL`. */
  readonly relay: string
  readonly lane: number
  readonly poolId: PoolId
  readonly servingEndpoint: EndpointId
  readonly prefixDepth: number
  /** `prefixDepth × kvBlockSize`. */
  readonly matchedTokens: number
}

interface DomainLaneView {
  readonly lane: number
  readonly relay: string
  readonly poolId: PoolId
  readonly producer: ProducerIdentity
  readonly servingEndpoint: EndpointId
  readonly ready: boolean
  readonly installedSequence: bigint | undefined
}

/** A base model registered by the domain's pools (PROTOCOL §7 ◆3). */
interface DomainModelView {
  readonly namespace: string
  readonly model: string
  /** Sorted, over every lane's registration of the model. */
  readonly aliases: ReadonlyArray<string>
  /** The `lora.adapter` names of the adapter registrations on the model, sorted. */
  readonly adapters: ReadonlyArray<string>
}

interface DomainView {
  readonly id: IndexerDomainId
  readonly querySemantics: KvQuerySemantics
  /** Ordered by namespace, then model. */
  readonly models: ReadonlyArray<DomainModelView>
  readonly lanes: ReadonlyArray<DomainLaneView>
}

/** Overlap queries over every relay's pools, answered from the consumer's lanes. */
export interface GlobalViewService {
  /** Synchronous form for routers on the hot path. */
  readonly overlapNow: (request: OverlapRequest) => ReadonlyArray<OverlapResult> | OverlapError
  readonly overlap: (request: OverlapRequest) => Effect.Effect<ReadonlyArray<OverlapResult>, OverlapError>
  readonly domainsNow: () => ReadonlyArray<DomainView>
  readonly domains: Effect.Effect<ReadonlyArray<DomainView>>
}

/** The global view service. */
export class GlobalView extends Context.Tag("kvrelay/GlobalView")<GlobalView, GlobalViewService>() {}

// ---------------------------------------------------------------------------------------------
// Matching and querying

/** Whether one of the pool's registrations names `model` (as its model or an alias). */
export const registersModel = (descriptor: DcPoolDescriptor, model: string): boolean => {
  for (const registration of descriptor.registrations) {
    if (registration.model === model) return true
    for (const alias of registration.aliases) if (alias === model) return true
  }
  return false
}

const servesModel = (domain: DomainStatus, namespace: string, model: string): boolean => {
  for (const lane of domain.lanes.values()) {
    const descriptor = lane.descriptor
    if (descriptor.servingEndpoint.namespace === namespace && registersModel(descriptor, model)) return true
  }
  return false
}

const toPairs = (hashes: BlockHashes): Uint32Array =>
  hashes instanceof Uint32Array ? hashes : hashPairs(hashes)

/**
 * Buffers of query addresses, reused across queries: a typed array of more than 64 bytes gets a
 * backing store outside V8's heap, and allocating one cost ~1 µs, twice per 1024-token query.
 * Queries run synchronously one at a time (`overlapOf`), and a query's k-th distinct semantics
 * uses pair `k`: [local hashes, sequence hashes].
 */
const addressBuffers: Array<[Uint32Array, Uint32Array]> = []

const addressBuffer = (k: number, pairs: number): [Uint32Array, Uint32Array] => {
  let buffers = addressBuffers[k]
  if (buffers === undefined || buffers[0].length < 2 * pairs) {
    const size = Math.max(2 * pairs, 256)
    buffers = [new Uint32Array(size), new Uint32Array(size)]
    addressBuffers[k] = buffers
  }
  return buffers
}

/**
 * The canonical sequence hashes a query probes in a domain of `semantics`, memoised per
 * semantics within one query (domains of one model usually share them). The addresses are views
 * of shared buffers: valid until the next query.
 */
class QueryAddresses {
  private readonly bySemantics = new Map<string, Uint32Array>()

  constructor(private readonly keys: OverlapKeys) {}

  for(semantics: KvQuerySemantics): Uint32Array {
    const keys = this.keys
    // Only tokens depend on the domain's semantics; hashes are the same for every domain.
    const key = "tokens" in keys ? `${semantics.kvBlockSize}|${semantics.hashFormat}` : ""
    let addresses = this.bySemantics.get(key)
    if (addresses === undefined) {
      addresses = "sequenceHashes" in keys ? toPairs(keys.sequenceHashes) : this.chain(keys, semantics)
      this.bySemantics.set(key, addresses)
    }
    return addresses
  }

  private chain(
    keys: Exclude<OverlapKeys, { readonly sequenceHashes: BlockHashes }>,
    semantics: KvQuerySemantics
  ): Uint32Array {
    if (!("tokens" in keys)) return sequenceHashes(toPairs(keys.localBlockHashes))
    const tokens = keys.tokens
    const blocks = fullBlockCount(tokens.length, semantics.kvBlockSize, semantics.hashFormat)
    const [local, sequence] = addressBuffer(this.bySemantics.size, blocks)
    const seed = blockHashSeed(keys.loraName)
    localHashesInto(
      tokens,
      0,
      tokens.length,
      semantics.kvBlockSize,
      semantics.hashFormat,
      Number(seed >> 32n),
      Number(seed & 0xffff_ffffn),
      local,
      0
    )
    sequenceHashesInto(local, 0, blocks, undefined, 0, sequence, 0)
    return sequence.subarray(0, 2 * blocks)
  }
}

const keysOf = (keys: OverlapKeys): "tokens" | "localBlockHashes" | "sequenceHashes" =>
  "tokens" in keys ? "tokens" : "localBlockHashes" in keys ? "localBlockHashes" : "sequenceHashes"

const hashesOf = (keys: Exclude<OverlapKeys, { readonly tokens: ArrayLike<number> }>): BlockHashes =>
  "localBlockHashes" in keys ? keys.localBlockHashes : keys.sequenceHashes

/** Blocks in a query given by hashes (`[hi, lo]` pairs or one value per block). */
export const hashCount = (hashes: BlockHashes): number =>
  hashes instanceof Uint32Array ? hashes.length / 2 : hashes.length

/**
 * Deepest first; equal depths keep domain order, then lane order, so answers are stable. An
 * insertion sort in place: `Array.prototype.sort` with a comparator was the largest part of a
 * query's own time (1.4–1.8 µs for 16 results, against 0.5–0.7 µs for this). Exported for tests.
 */
export const sortByDepth = (results: Array<OverlapResult>): Array<OverlapResult> => {
  for (let i = 1; i < results.length; i++) {
    const item = results[i]!
    let j = i - 1
    while (j >= 0 && results[j]!.prefixDepth < item.prefixDepth) {
      results[j + 1] = results[j]!
      j--
    }
    results[j + 1] = item
  }
  return results
}

/** Per-lane depths of the domain being queried (queries run one at a time, synchronously). */
const queryDepths = new Uint32Array(16)

/** The adapter a token query asks for; absent, null and "" are the base model. */
const adapterOf = (request: OverlapRequest): string | undefined =>
  "tokens" in request && typeof request.loraName === "string" && request.loraName.length > 0
    ? request.loraName
    : undefined

/** A name as messages quote it (model ids may be long; messages stay short). */
const q = (text: string): string => JSON.stringify(text.length <= 64 ? text : `${text.slice(0, 63)}…`)

const modelText = (request: { readonly namespace: string; readonly model: string }) =>
  `model ${q(request.model)} in namespace ${q(request.namespace)}`

/** The domain's digests, short: enough to tell domains apart in a message. */
const domainText = (id: IndexerDomainId) =>
  `pool domain ${id.cacheSemantics.hex.slice(0, 12)}…/${id.routingScope.hex.slice(0, 12)}…`

/**
 * Why a query cannot be answered before any domain is probed: a model (or pool domain) no
 * catalog has registered since the consumer started, or an adapter never registered on it.
 * Answered from `known` only when it matters: a model served now is always known, so a query
 * without an adapter looks it up only once no lane answered.
 */
const unknownTarget = (
  consumer: GlobalConsumerService,
  request: OverlapRequest,
  adapter: string | undefined
): ModelNotFound | AdapterNotFound | NoMatchingDomain | undefined => {
  const known = consumer.known
  if ("poolDomain" in request) {
    const key = request.poolDomain.key
    if (!known.hasDomain(key)) {
      return new NoMatchingDomain({
        message: `no relay has listed a pool of ${domainText(request.poolDomain)} since this consumer started`
      })
    }
    if (adapter !== undefined && !known.hasDomainAdapter(key, adapter)) {
      return new AdapterNotFound({
        message: `no relay has registered adapter ${q(adapter)} (loraName) on ${domainText(request.poolDomain)} since this consumer started`
      })
    }
    return undefined
  }
  const bases = known.bases(request.namespace, request.model)
  if (bases === undefined) {
    return new ModelNotFound({
      message: `no relay has registered ${modelText(request)} since this consumer started`
    })
  }
  if (adapter !== undefined) {
    for (const base of bases) if (known.hasAdapter(request.namespace, base, adapter)) return undefined
    return new AdapterNotFound({
      message: `no relay has registered adapter ${q(adapter)} (loraName) on ${modelText(request)} since this consumer started`
    })
  }
  return undefined
}

/** The domains a request names: its `poolDomain`, or every domain serving its model. */
const matchingDomains = (
  consumer: GlobalConsumerService,
  request: OverlapRequest
): ReadonlyArray<DomainStatus> => {
  const all = consumer.domains()
  return "poolDomain" in request
    ? all.filter((domain) => domain.id.equals(request.poolDomain))
    : all.filter((domain) => servesModel(domain, request.namespace, request.model))
}

/** Query the matching domains of `consumer` (no Effect: one synchronous pass). */
const overlapOf = (
  consumer: GlobalConsumerService,
  request: OverlapRequest
): ReadonlyArray<OverlapResult> | OverlapError => {
  const adapter = adapterOf(request)
  if (adapter !== undefined) {
    const unknown = unknownTarget(consumer, request, adapter)
    if (unknown !== undefined) return unknown
  }
  const matching = matchingDomains(consumer, request)
  const addresses = new QueryAddresses(request)
  const results: Array<OverlapResult> = []
  for (const domain of matching) {
    const captured = domain.indexer.prefixDepthsInto(addresses.for(domain.querySemantics), queryDepths)
    if (captured === "Unavailable") continue
    const blockSize = domain.querySemantics.kvBlockSize
    const manifest = domain.indexer.manifest
    for (let m = captured; m !== 0; m &= m - 1) {
      const physicalLane = 31 - Math.clz32(m & -m)
      // The query captured readiness once; a lane retired since (weak read) or never reported
      // ready by its own attempt is not answered for.
      const lane = domain.lanes.get(physicalLane)
      if (lane === undefined || !lane.ready) continue
      const prefixDepth = queryDepths[physicalLane]!
      results.push({
        relay: lane.relay,
        lane: physicalLane,
        poolId: manifest.poolId(physicalLane)!,
        servingEndpoint: lane.descriptor.servingEndpoint,
        prefixDepth,
        matchedTokens: prefixDepth * blockSize
      })
    }
  }
  if (results.length === 0) {
    const unknown = adapter === undefined ? unknownTarget(consumer, request, undefined) : undefined
    if (unknown !== undefined) return unknown
    return new NoReadyLane({
      message: `${"poolDomain" in request ? domainText(request.poolDomain) : modelText(request)} is known, but no lane of it is ready now (its relay is down or its lanes are resubscribing)`
    })
  }
  return sortByDepth(results)
}

/** One lane of a domain a query matched, probed when it was ready (PROTOCOL §7.1 ◆3). */
export interface LaneProbe {
  readonly domain: DomainStatus
  readonly lane: LaneStatus
  /** The lane's prefix depth; undefined when the lane could not be probed (not ready). */
  readonly prefixDepth: number | undefined
  readonly kvBlockSize: number
  /** Full blocks of the query in the domain's semantics. */
  readonly queryBlocks: number
}

/**
 * Every lane of every domain that matches `request`, ready or not, with the depth of each lane
 * the query could probe: the candidates of a routing decision. Fails as `overlapOf` does for a
 * name no relay has registered; a known model with no lane now is an empty list.
 */
export const probeLanesOf = (
  consumer: GlobalConsumerService,
  request: OverlapRequest
): ReadonlyArray<LaneProbe> | OverlapError => {
  const adapter = adapterOf(request)
  const unknown = unknownTarget(consumer, request, adapter)
  if (unknown !== undefined) return unknown
  const matching = matchingDomains(consumer, request)
  const addresses = new QueryAddresses(request)
  const probes: Array<LaneProbe> = []
  for (const domain of matching) {
    const semantics = domain.querySemantics
    const probed = addresses.for(semantics)
    const captured = domain.indexer.prefixDepthsInto(probed, queryDepths)
    const mask = captured === "Unavailable" ? 0 : captured
    for (const lane of domain.lanes.values()) {
      const physical = lane.lane
      const probedHere = lane.ready && (mask & (1 << physical)) !== 0
      probes.push({
        domain,
        lane,
        prefixDepth: probedHere ? queryDepths[physical]! : undefined,
        kvBlockSize: semantics.kvBlockSize,
        queryBlocks: probed.length / 2
      })
    }
  }
  return probes
}

/** The base registrations of a domain's pools, with their aliases and the adapters on them. */
const modelsOf = (domain: DomainStatus): ReadonlyArray<DomainModelView> => {
  const models = new Map<
    string,
    { namespace: string; model: string; aliases: Set<string>; adapters: Set<string> }
  >()
  const entry = (namespace: string, model: string) => {
    const key = `${namespace}\0${model}`
    let found = models.get(key)
    if (found === undefined) {
      found = { namespace, model, aliases: new Set(), adapters: new Set() }
      models.set(key, found)
    }
    return found
  }
  for (const lane of domain.lanes.values()) {
    const { servingEndpoint, registrations } = lane.descriptor
    for (const registration of registrations) {
      if (registration.target._tag !== "Base") continue
      const found = entry(servingEndpoint.namespace, registration.model)
      for (const alias of registration.aliases) found.aliases.add(alias)
    }
    for (const registration of registrations) {
      const target = registration.target
      // An adapter is listed on its base; one whose base this pool does not register is left out.
      if (target._tag !== "Lora") continue
      models.get(`${servingEndpoint.namespace}\0${target.baseModel}`)?.adapters.add(target.adapter)
    }
  }
  const byText = (a: string, b: string) => (a < b ? -1 : a > b ? 1 : 0)
  return [...models.values()]
    .sort((a, b) => byText(a.namespace, b.namespace) || byText(a.model, b.model))
    .map((m) => ({
      namespace: m.namespace,
      model: m.model,
      aliases: [...m.aliases].sort(byText),
      adapters: [...m.adapters].sort(byText)
    }))
}

/** The lanes of every live domain, ordered by domain and lane. */
const domainsOf = (consumer: GlobalConsumerService): ReadonlyArray<DomainView> =>
  consumer.domains().map((domain) => ({
    id: domain.id,
    querySemantics: domain.querySemantics,
    models: modelsOf(domain),
    lanes: [...domain.lanes.values()]
      .sort((a, b) => a.lane - b.lane)
      .map((lane) => ({
        lane: lane.lane,
        relay: lane.relay,
        poolId: lane.descriptor.producer.poolId,
        producer: lane.descriptor.producer,
        servingEndpoint: lane.descriptor.servingEndpoint,
        ready: lane.ready,
        installedSequence: lane.installedSequence
      }))
  }))

/** The view over a running consumer. */
export const make = (consumer: GlobalConsumerService): GlobalViewService => ({
  overlapNow: (request) => overlapOf(consumer, request),
  overlap: (request) =>
    Effect.suspend(() => {
      const answer = overlapOf(consumer, request)
      return Array.isArray(answer) ? Effect.succeed(answer) : Effect.fail(answer as OverlapError)
    }).pipe(
      Effect.withSpan("GlobalView.overlap", {
        attributes: {
          by: "poolDomain" in request ? "poolDomain" : "model",
          keys: keysOf(request),
          length: "tokens" in request ? request.tokens.length : hashCount(hashesOf(request))
        }
      })
    ),
  domainsNow: () => domainsOf(consumer),
  domains: Effect.sync(() => domainsOf(consumer))
})

/** The view over the `GlobalConsumer` in context. */
export const layer: Layer.Layer<GlobalView, never, GlobalConsumer> = Layer.effect(
  GlobalView,
  Effect.map(GlobalConsumer, make)
)
