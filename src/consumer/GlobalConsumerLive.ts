/**
 * The global consumer's implementation (PROTOCOL.md §7, seed 004's consumer side): one connection
 * epoch per relay (catalog watch, then a pool stream per lane), the lanes of each indexer domain
 * fed into their ingestion pool, and the reconnect backoff. The contract is `GlobalConsumer.ts`;
 * the state it keeps per relay, domain and lane is `internal/ConsumerState.ts`.
 *
 * Length: `make` is one closure over the consumer's relays, domains and lanes; a catalog change,
 * a pool stream's frames and a lane fault each update them in synchronous blocks whose
 * invariants (a lane belongs to one relay epoch, a domain's lanes share its format) are read in
 * one place.
 */

import {
  Cause,
  Deferred,
  Duration,
  Effect,
  Equal,
  ExecutionStrategy,
  Exit,
  Fiber,
  Layer,
  Metric,
  Option,
  Queue,
  Random,
  Scope,
  Stream
} from "effect"
import { CKF_LANE_COUNT } from "../ckf/config.js"
import { GlobalCkfBuildError, GlobalCkfIndexer, GlobalCkfManifest } from "../ckf/global.js"
import {
  type DcCkfFormatIdentity,
  type DcId,
  type IndexerDomainId,
  LaneLease,
  PoolId,
  type ProducerIdentity
} from "../ckf/identity.js"
import { hex16 } from "../ckf/u64.js"
import { counterFamily, gaugeFamily } from "../observability/MetricFamilies.js"
import { InjectedLoopFault, LoopFaults, loopStep, supervised } from "../observability/Supervised.js"
import type { CatalogSnapshot, DcPoolDescriptor, KvQuerySemantics, RelayInfo } from "../protocol/Model.js"
import { GlobalConsumerConfigError, type RelayClientError } from "./ConsumerErrors.js"
import type { GlobalCkfIngestionPoolConfig } from "./GlobalCkfIngestionPool.js"
import {
  backoffCeiling,
  DEFAULT_CONSUMER_INGESTION,
  DEFAULT_RECONNECT,
  type DomainStatus,
  definedOnly,
  equalJitter,
  GlobalConsumer,
  type GlobalConsumerConfig,
  type GlobalConsumerService,
  type ReconnectConfig,
  RelayConnector,
  validateConfig
} from "./GlobalConsumer.js"
import {
  type DesiredEntry,
  type DomainState,
  EpochEnded,
  faultText,
  ingestionText,
  LaneFault,
  type LaneState,
  laneAnnotations,
  type RelayState,
  relayAnnotations,
  STREAM_FAULT_PROBE_TIMEOUT,
  STREAM_FAULT_SETTLE,
  sameCatalogContent
} from "./internal/ConsumerState.js"
import { make as makeIngestionPool } from "./internal/IngestionPoolLive.js"
import { KnownModels } from "./KnownModels.js"
import { type PoolStreamEvent, type RelayClient, relayClientErrorText } from "./RelayClient.js"
import * as RelaySignals from "./RelaySignals.js"

// ---------------------------------------------------------------------------------------------
// Metrics

const laneFaultsTotal = counterFamily(
  "kvrelay_global_lane_faults_total",
  "Lane attempts that ended with a fault (the lane retired and subscribes again)"
)

const snapshotsInstalledTotal = counterFamily(
  "kvrelay_global_snapshots_installed_total",
  "Pool snapshots installed into a lane"
)

const deltasTotal = counterFamily("kvrelay_global_deltas_total", "Pool deltas admitted into a lane")

const deltaImagesTotal = counterFamily(
  "kvrelay_global_delta_images_total",
  "Bucket images carried by admitted deltas"
)

const relayEpochsTotal = counterFamily("kvrelay_global_relay_epochs_total", "Relay connection epochs started")

const lanesGauge = gaugeFamily("kvrelay_global_lanes", "Lanes by relay and readiness")

const domainsGauge = gaugeFamily("kvrelay_global_domains", "Indexer domains with a lane")

const relayConnectedGauge = gaugeFamily(
  "kvrelay_global_relay_connected",
  "1 while the relay's catalog watch is established"
)

// ---------------------------------------------------------------------------------------------
// Constructor

/**
 * Starts the consumer in the current scope: one epoch loop per relay, one controller fiber, and
 * per domain an ingestion pool with its lane fibers. Closing the scope stops everything.
 */
export const make = (
  config: GlobalConsumerConfig
): Effect.Effect<GlobalConsumerService, GlobalConsumerConfigError, Scope.Scope | RelayConnector> =>
  Effect.gen(function* () {
    const problems = validateConfig(config)
    if (problems.length > 0) return yield* Effect.fail(new GlobalConsumerConfigError({ problems }))
    const connector = yield* RelayConnector
    const consumerScope = yield* Effect.scope
    const reconnect: ReconnectConfig = { ...DEFAULT_RECONNECT, ...definedOnly(config.reconnect) }
    const resetAfterMs = Duration.toMillis(reconnect.resetAfter)
    const ingestion: Partial<GlobalCkfIngestionPoolConfig> = {
      ...DEFAULT_CONSUMER_INGESTION,
      ...definedOnly(config.ingestion)
    }
    const verificationWindow = config.verificationWindow ?? 2
    const consumerInstance =
      config.consumerInstance ??
      ((BigInt(yield* Random.nextIntBetween(0, 0x1_0000)) << 48n) |
        (BigInt(yield* Random.nextIntBetween(0, 0x1_0000)) << 32n) |
        BigInt(yield* Random.nextIntBetween(0, 0x1_0000_0000))) &
        0xffff_ffff_ffff_ffffn
    const subscriberId = config.subscriberId ?? `kvrelay-global-${hex16(consumerInstance)}`
    const clock = yield* Effect.clock
    const nowMs = (): number => clock.unsafeCurrentTimeMillis()

    const relays: Array<RelayState> = config.relays.map((spec, index) => ({
      spec,
      index,
      client: undefined,
      info: undefined,
      knownDcId: undefined,
      catalog: undefined,
      lastCatalog: undefined,
      connected: false,
      epochs: 0,
      lastError: undefined,
      attempted: false,
      health: "starting",
      failingLanes: new Set(),
      streamCheck: false
    }))
    const known = new KnownModels(config.retainedNames)
    const domains = new Map<string, DomainState>()
    // Queries read the live domain and lane objects: no copy per query. The ordered list is
    // rebuilt only when a domain opens or closes.
    let domainListCache: ReadonlyArray<DomainStatus> | undefined
    /** Lease epochs per (domain, lane): strictly increasing for the consumer's lifetime. */
    const laneEpochs = new Map<string, bigint>()
    let currentProblems = new Map<string, string>()

    const faults = yield* LoopFaults
    const wakeups = yield* Queue.sliding<void>(1)
    const wake = (): void => {
      Queue.unsafeOffer(wakeups, undefined)
    }

    const backoffDelay = (attempt: number) =>
      equalJitter(backoffCeiling(attempt, reconnect.initial, reconnect.max))

    // ---- what the log says about each relay (one line per change of its state)

    const relayLog = (relay: RelayState) => Effect.annotateLogs(relayAnnotations(relay))

    /** The relay's epoch failed; `retryMs` is the wait before the next one. */
    const relayUnreachable = (relay: RelayState, why: string, retryMs: number): Effect.Effect<void> =>
      Effect.suspend(() => {
        relay.failingLanes.clear()
        const annotations = { error: why, retryInMs: Math.round(retryMs) }
        if (relay.health === "unreachable") {
          return Effect.logDebug("relay still unreachable; retrying").pipe(Effect.annotateLogs(annotations))
        }
        relay.health = "unreachable"
        return Effect.logWarning("relay unreachable; retrying").pipe(Effect.annotateLogs(annotations))
      }).pipe(relayLog(relay))

    /** The relay's catalog arrived: it is up (its lanes may still fail on their own). */
    const relayConnected = (
      relay: RelayState,
      info: RelayInfo,
      catalog: CatalogSnapshot
    ): Effect.Effect<void> =>
      Effect.suspend(() => {
        const before = relay.health
        if (before === "up" || before === "streams") return Effect.void
        relay.health = "up"
        return Effect.logInfo(before === "starting" ? "relay connected" : "relay reachable again").pipe(
          Effect.annotateLogs({
            dcName: info.dcName,
            dcId: info.dcId.hex,
            relayIncarnation: String(info.relay.relayIncarnation),
            pools: catalog.pools.length
          })
        )
      }).pipe(relayLog(relay))

    /** A lane is no longer failing (ready again, or gone). */
    const laneRecovered = (lane: LaneState, ready: boolean): Effect.Effect<void> =>
      Effect.suspend(() => {
        const relay = lane.source
        if (!relay.failingLanes.delete(lane) || relay.failingLanes.size > 0 || relay.health !== "streams") {
          return Effect.void
        }
        relay.health = "up"
        return ready
          ? Effect.logInfo("relay pool streams recovered").pipe(relayLog(relay))
          : Effect.logDebug("relay pool streams no longer failing: the failing lanes left").pipe(
              relayLog(relay)
            )
      })

    /**
     * After `STREAM_FAULT_SETTLE`, failing lanes of a relay that still has its catalog and still
     * answers `GET /v1/relay` are failing streams: one WARN, with the newest fault and the wait
     * before that lane subscribes again.
     */
    const checkStreams = (relay: RelayState): Effect.Effect<void> =>
      Effect.gen(function* () {
        yield* Effect.sleep(STREAM_FAULT_SETTLE)
        const pending = () => relay.connected && relay.health === "up" && relay.failingLanes.size > 0
        if (!pending()) return
        const client = relay.client
        if (client !== undefined) {
          const answers = yield* client.relayInfo.pipe(
            Effect.timeout(STREAM_FAULT_PROBE_TIMEOUT),
            Effect.isSuccess
          )
          // A relay that does not answer is likely going away, and its catalog watch will end and
          // say so; one whose watch still stands a while later is reported as failing streams.
          if (!answers) yield* Effect.sleep(STREAM_FAULT_SETTLE)
        }
        if (!pending()) return
        let newest: LaneState | undefined
        for (const lane of relay.failingLanes)
          if (newest === undefined || lane.retryAt > newest.retryAt) newest = lane
        relay.health = "streams"
        yield* Effect.logWarning("relay pool streams failing; retrying").pipe(
          Effect.annotateLogs({
            error: newest?.lastFault ?? "unknown",
            retryInMs: Math.max(0, Math.round((newest?.retryAt ?? nowMs()) - nowMs())),
            failingLanes: relay.failingLanes.size
          }),
          relayLog(relay)
        )
      }).pipe(
        Effect.ensuring(
          Effect.sync(() => {
            relay.streamCheck = false
          })
        )
      )

    const laneFailed = (lane: LaneState): Effect.Effect<void> =>
      Effect.suspend(() => {
        const relay = lane.source
        relay.failingLanes.add(lane)
        if (relay.health !== "up" || relay.streamCheck) return Effect.void
        relay.streamCheck = true
        return Effect.asVoid(Effect.forkIn(checkStreams(relay), consumerScope))
      })

    // ---- lanes

    const nextLease = (domain: DomainState, lane: number): LaneLease => {
      const key = `${domain.key}#${lane}`
      const epoch = (laneEpochs.get(key) ?? 0n) + 1n
      laneEpochs.set(key, epoch)
      return new LaneLease(consumerInstance, lane, epoch)
    }

    /** Readiness withdrawn by the pool itself (watchdog, deactivation) shows in the ready mask. */
    const stillReady = (domain: DomainState, lane: LaneState): boolean =>
      (domain.indexer.readyLanes() & (1 << lane.lane)) !== 0

    const handleEvent = (
      domain: DomainState,
      lane: LaneState,
      producer: ProducerIdentity,
      lease: LaneLease,
      event: PoolStreamEvent
    ): Effect.Effect<void, LaneFault> => {
      switch (event._tag) {
        case "Snapshot":
          return Effect.acquireUseRelease(
            // An install runs to its end, even when the attempt is interrupted: its worker could
            // otherwise publish readiness after the attempt already withdrew it.
            Effect.forkIn(
              Effect.interruptible(
                domain.pool.installSnapshot({
                  identity: producer,
                  lease,
                  sequence: event.sequence,
                  words: event.words
                })
              ),
              domain.scope
            ),
            Fiber.join,
            Fiber.await
          ).pipe(
            Effect.mapError((error) => new LaneFault({ kind: "Ingestion", message: ingestionText(error) })),
            Effect.flatMap((outcome) => {
              if (outcome._tag !== "SnapshotInstalled") {
                const detail = outcome._tag === "LaneDeactivated" ? ` (${outcome.fault._tag})` : ""
                return Effect.fail(
                  new LaneFault({
                    kind: "Install",
                    message: `snapshot install ended ${outcome._tag}${detail}`
                  })
                )
              }
              lane.ready = true
              lane.installedSequence = outcome.sequence
              lane.snapshotsInstalled++
              return Effect.logDebug("global lane ready").pipe(
                Effect.annotateLogs("sequence", String(outcome.sequence)),
                Effect.zipRight(
                  Metric.increment(Metric.tagged(snapshotsInstalledTotal, "relay", lane.relay))
                ),
                Effect.zipRight(laneRecovered(lane, true))
              )
            }),
            Effect.withSpan("GlobalConsumer.lane.installSnapshot", {
              attributes: { lane: lane.lane, relay: lane.relay, sequence: String(event.sequence) }
            })
          )
        case "Delta":
          return Effect.suspend(() => {
            if (!stillReady(domain, lane)) {
              return Effect.fail(
                new LaneFault({ kind: "Ingestion", message: "lane readiness was withdrawn by ingestion" })
              )
            }
            return domain.pool
              .submitDelta({
                identity: producer,
                lease,
                baseSequence: event.baseSequence,
                sequence: event.sequence,
                images: event.images
              })
              .pipe(
                Effect.mapError(
                  (error) => new LaneFault({ kind: "Ingestion", message: ingestionText(error) })
                ),
                Effect.zipRight(
                  Effect.suspend(() => {
                    lane.installedSequence = event.sequence
                    lane.deltasApplied++
                    const relay = lane.relay
                    return Metric.increment(Metric.tagged(deltasTotal, "relay", relay)).pipe(
                      Effect.zipRight(
                        Metric.incrementBy(
                          Metric.tagged(deltaImagesTotal, "relay", relay),
                          event.images.length / 3
                        )
                      )
                    )
                  })
                )
              )
          })
        case "Heartbeat":
          return stillReady(domain, lane)
            ? Effect.void
            : Effect.fail(
                new LaneFault({ kind: "Ingestion", message: "lane readiness was withdrawn by ingestion" })
              )
      }
    }

    /** One lease, one subscription; only ever ends with the fault that retires it. */
    const laneAttempt = (domain: DomainState, lane: LaneState): Effect.Effect<never, LaneFault> =>
      Effect.gen(function* () {
        const relay = lane.source
        const client = relay.client
        if (client === undefined) {
          return yield* Effect.fail(new LaneFault({ kind: "Relay", message: "relay client unavailable" }))
        }
        const producer = lane.descriptor.producer
        const lease = nextLease(domain, lane.lane)
        const signal = yield* Deferred.make<never, LaneFault>()
        lane.lease = lease
        lane.signal = signal
        yield* domain.pool.assign(producer, lease).pipe(
          Effect.mapError((error) => new LaneFault({ kind: "Assign", message: ingestionText(error) })),
          Effect.withSpan("GlobalConsumer.lane.assign", {
            attributes: {
              lane: lane.lane,
              relay: relay.spec.name,
              assignmentEpoch: String(lease.assignmentEpoch)
            }
          })
        )
        const streamId = `${subscriberId}/lane${lane.lane}/${domain.id.cacheSemantics.hex.slice(0, 8)}`
        const consume = client.subscribePool(producer, streamId).pipe(
          Stream.mapError(
            (error: RelayClientError) =>
              new LaneFault({ kind: error._tag, message: relayClientErrorText(error) })
          ),
          Stream.runForEach((event) => handleEvent(domain, lane, producer, lease, event))
        )
        yield* Effect.raceFirst(consume, Deferred.await(signal))
        return yield* Effect.fail(new LaneFault({ kind: "Closed", message: "pool stream ended" }))
      }).pipe(
        Effect.ensuring(
          Effect.sync(() => {
            domain.indexer.retireLaneReadiness(lane.lane)
            lane.ready = false
            lane.installedSequence = undefined
            lane.lease = undefined
            lane.signal = undefined
          })
        ),
        Effect.withSpan("GlobalConsumer.lane.attempt", {
          attributes: {
            lane: lane.lane,
            relay: lane.relay,
            domain: domain.id.toString(),
            producer: lane.descriptor.producer.key
          }
        })
      )

    /** The lane's supervisor: attempts forever, with backoff between faults. */
    const laneLoop = (domain: DomainState, lane: LaneState): Effect.Effect<never> =>
      Effect.gen(function* () {
        let attempt = 0
        for (;;) {
          const started = nowMs()
          if (attempt > 0) lane.resubscribes++
          const exit = yield* Effect.exit(laneAttempt(domain, lane))
          if (nowMs() - started >= resetAfterMs) attempt = 0
          const delay = yield* backoffDelay(attempt)
          if (Exit.isFailure(exit)) {
            const failure = Cause.failureOption(exit.cause)
            const text =
              failure._tag === "Some"
                ? `${failure.value.kind}: ${failure.value.message}`
                : Cause.pretty(exit.cause)
            const kind = failure._tag === "Some" ? failure.value.kind : "Defect"
            lane.faults += 1
            lane.faultsByKind[kind] = (lane.faultsByKind[kind] ?? 0) + 1
            lane.lastFault = text
            lane.retryAt = nowMs() + Duration.toMillis(delay)
            yield* Metric.increment(
              Metric.tagged(Metric.tagged(laneFaultsTotal, "relay", lane.relay), "kind", kind)
            )
            // Per retry and per lane at DEBUG; the relay's own line says it once (checkStreams).
            yield* Effect.logDebug("global lane retired; subscribing again after backoff").pipe(
              Effect.annotateLogs({ fault: text, attempt, retryInMs: Math.round(Duration.toMillis(delay)) }),
              Effect.withSpan("GlobalConsumer.lane.retire", {
                attributes: { lane: lane.lane, relay: lane.relay, fault: kind }
              })
            )
            yield* laneFailed(lane)
          }
          yield* Effect.sleep(delay)
          attempt += 1
        }
      }).pipe(Effect.annotateLogs(laneAnnotations(domain, lane)))

    const startLane = (domain: DomainState, entry: DesiredEntry): Effect.Effect<void> =>
      Effect.gen(function* () {
        const lane: LaneState = {
          lane: entry.relay.index,
          relay: entry.relay.spec.name,
          source: entry.relay,
          descriptor: entry.descriptor,
          ready: false,
          installedSequence: undefined,
          lease: undefined,
          signal: undefined,
          fiber: undefined,
          faults: 0,
          faultsByKind: {},
          lastFault: undefined,
          snapshotsInstalled: 0,
          deltasApplied: 0,
          resubscribes: 0,
          retryAt: 0
        }
        domain.lanes.set(lane.lane, lane)
        lane.fiber = yield* Effect.forkIn(laneLoop(domain, lane), domain.scope)
        yield* Effect.logDebug("global lane started").pipe(Effect.annotateLogs(laneAnnotations(domain, lane)))
      })

    const stopLane = (domain: DomainState, lane: LaneState, why: string): Effect.Effect<void> =>
      Effect.gen(function* () {
        if (domain.lanes.get(lane.lane) === lane) domain.lanes.delete(lane.lane)
        domain.indexer.retireLaneReadiness(lane.lane)
        lane.ready = false
        if (lane.fiber !== undefined) yield* Fiber.interrupt(lane.fiber)
        yield* laneRecovered(lane, false)
        yield* Effect.logDebug("global lane stopped").pipe(
          Effect.annotateLogs({ ...laneAnnotations(domain, lane), why })
        )
      }).pipe(Effect.withSpan("GlobalConsumer.lane.stop", { attributes: { lane: lane.lane, why } }))

    // ---- domains

    /** The manifest lanes: every relay whose dc id is known, first relay wins a repeated dc id. */
    const layoutOf = (): { readonly key: string; readonly dcIds: ReadonlyArray<DcId | undefined> } => {
      const dcIds: Array<DcId | undefined> = new Array(CKF_LANE_COUNT).fill(undefined)
      const seen = new Set<string>()
      const parts: Array<string> = []
      for (const relay of relays) {
        const dcId = relay.knownDcId
        if (dcId === undefined || seen.has(dcId.hex)) continue
        seen.add(dcId.hex)
        dcIds[relay.index] = dcId
        parts.push(`${relay.index}=${dcId.hex}`)
      }
      return { key: parts.join(","), dcIds }
    }

    const dispatchFaults = (domain: DomainState): Effect.Effect<never> =>
      Effect.forever(
        Effect.gen(function* () {
          const fault = yield* Queue.take(domain.pool.faults)
          if (fault._tag === "WorkerFailed") {
            // A failed worker is permanent for its pool: the domain is rebuilt with a new one.
            domain.broken = true
            yield* Effect.logError("global ingestion worker failed; rebuilding the domain").pipe(
              Effect.annotateLogs({ domain: domain.id.toString(), worker: fault.worker })
            )
            wake()
            return
          }
          const lane = domain.lanes.get(fault.lane)
          const signal = lane?.signal
          if (lane === undefined || signal === undefined || !fault.lease?.equals(lane.lease)) return
          yield* Deferred.fail(signal, new LaneFault({ kind: "Ingestion", message: faultText(fault) }))
        })
      )

    const openDomain = (
      id: IndexerDomainId,
      descriptor: DcPoolDescriptor,
      layout: ReturnType<typeof layoutOf>
    ): Effect.Effect<DomainState | undefined> =>
      Effect.gen(function* () {
        const format = descriptor.producer.format
        const lanes = layout.dcIds.map((dcId) => (dcId === undefined ? undefined : new PoolId(id, dcId)))
        const manifest = GlobalCkfManifest.make(consumerInstance, id, format, lanes)
        if (manifest instanceof GlobalCkfBuildError) {
          yield* Effect.logError("global domain manifest rejected").pipe(
            Effect.annotateLogs({ domain: id.toString(), error: manifest.message })
          )
          return undefined
        }
        for (const warning of manifest.warnings) yield* Effect.logWarning(warning)
        const indexer = GlobalCkfIndexer.make(manifest, { verificationWindow })
        if (indexer instanceof GlobalCkfBuildError) {
          yield* Effect.logError("global domain indexer could not be built").pipe(
            Effect.annotateLogs({ domain: id.toString(), error: indexer.message })
          )
          return undefined
        }
        const scope = yield* Scope.fork(consumerScope, ExecutionStrategy.sequential)
        const pool = yield* makeIngestionPool(indexer, ingestion).pipe(Scope.extend(scope), Effect.either)
        if (pool._tag === "Left") {
          yield* Scope.close(scope, Exit.void)
          yield* Effect.logError("global ingestion pool could not be started").pipe(
            Effect.annotateLogs({ domain: id.toString(), error: pool.left.message })
          )
          return undefined
        }
        const domain: DomainState = {
          key: id.key,
          id,
          format,
          querySemantics: descriptor.querySemantics,
          indexer,
          pool: pool.right,
          scope,
          layout: layout.key,
          lanes: new Map(),
          broken: false
        }
        yield* Effect.forkIn(supervised("consumer.domain-faults", dispatchFaults(domain)), scope)
        yield* Effect.logDebug("global domain opened").pipe(
          Effect.annotateLogs({ domain: id.toString(), format: format.key, layout: layout.key })
        )
        return domain
      }).pipe(Effect.withSpan("GlobalConsumer.domain.open", { attributes: { domain: id.toString() } }))

    const closeDomain = (domain: DomainState, why: string): Effect.Effect<void> =>
      Effect.gen(function* () {
        domains.delete(domain.key)
        domainListCache = undefined
        // Queries holding the domain list may still read these lanes until the scope closes.
        for (const lane of domain.lanes.values()) lane.ready = false
        domain.lanes.clear()
        yield* Scope.close(domain.scope, Exit.void)
        yield* Effect.logDebug("global domain closed").pipe(
          Effect.annotateLogs({ domain: domain.id.toString(), why })
        )
      }).pipe(
        Effect.withSpan("GlobalConsumer.domain.close", { attributes: { domain: domain.id.toString(), why } })
      )

    // ---- reconciliation

    const reconcile = Effect.gen(function* () {
      // A domain's lanes are fixed when it opens; waiting for every relay's first answer (each
      // bounded by the request timeout) avoids rebuilding every domain once per relay at startup.
      if (!relays.every((relay) => relay.attempted)) return
      const problems = new Map<string, string>()
      const desired = new Map<
        string,
        { readonly id: IndexerDomainId; readonly entries: Array<DesiredEntry> }
      >()
      for (const relay of relays) {
        const info = relay.info
        const catalog = relay.catalog
        if (info === undefined || catalog === undefined) continue
        for (const descriptor of catalog.pools) {
          const poolId = descriptor.producer.poolId
          if (!poolId.dcId.equals(info.dcId)) {
            problems.set(
              `${relay.spec.name}/${poolId.key}`,
              `relay ${relay.spec.name} lists pool ${poolId} whose dc id differs from the relay's ${info.dcId}`
            )
            continue
          }
          const key = poolId.indexerDomain.key
          let slot = desired.get(key)
          if (slot === undefined) {
            slot = { id: poolId.indexerDomain, entries: [] }
            desired.set(key, slot)
          }
          slot.entries.push({ relay, descriptor })
        }
      }

      for (const domain of [...domains.values()]) {
        if (!desired.has(domain.key)) yield* closeDomain(domain, "no relay serves the domain")
      }

      const layout = layoutOf()
      for (const [key, { id, entries }] of desired) {
        const fits = (
          domain: { format: DcCkfFormatIdentity; querySemantics: KvQuerySemantics },
          e: DesiredEntry
        ) =>
          e.descriptor.producer.format.equals(domain.format) &&
          Equal.equals(e.descriptor.querySemantics, domain.querySemantics)
        let domain = domains.get(key)
        const reason =
          domain === undefined
            ? "new"
            : domain.broken
              ? "broken"
              : domain.layout !== layout.key
                ? "layout"
                : entries.some((e) => fits(domain!, e))
                  ? undefined
                  : "format"
        if (reason !== undefined) {
          const keepFormat = domain !== undefined && entries.some((e) => fits(domain!, e))
          const template = keepFormat ? entries.find((e) => fits(domain!, e))! : entries[0]!
          if (domain !== undefined) yield* closeDomain(domain, `rebuild (${reason})`)
          domain = yield* openDomain(id, template.descriptor, layout)
          if (domain === undefined) continue
          domains.set(key, domain)
          domainListCache = undefined
        }
        const live = domain!
        const wanted = new Set<number>()
        for (const entry of entries) {
          const poolId = entry.descriptor.producer.poolId
          const where = `${entry.relay.spec.name}/${poolId.key}`
          if (!fits(live, entry)) {
            problems.set(
              where,
              `relay ${entry.relay.spec.name} serves domain ${id} with format ${entry.descriptor.producer.format.key} ` +
                `and ${entry.descriptor.querySemantics.kvBlockSize}-token blocks; the domain's lanes use ` +
                `${live.format.key} and ${live.querySemantics.kvBlockSize}; not laned`
            )
            continue
          }
          const owner = live.indexer.manifest.poolId(entry.relay.index)
          if (owner === undefined || !owner.equals(poolId)) {
            problems.set(
              where,
              `relay ${entry.relay.spec.name} repeats the dc id of an earlier relay; not laned`
            )
            continue
          }
          wanted.add(entry.relay.index)
          const lane = live.lanes.get(entry.relay.index)
          if (lane?.descriptor.producer.equals(entry.descriptor.producer)) {
            // Same producer: registrations, roles and endpoint may change without a resubscription.
            lane.descriptor = entry.descriptor
            continue
          }
          if (lane !== undefined) yield* stopLane(live, lane, "producer changed")
          yield* startLane(live, entry)
        }
        for (const lane of [...live.lanes.values()]) {
          if (!wanted.has(lane.lane)) yield* stopLane(live, lane, "pool left the relay's catalog")
        }
      }

      for (const [where, text] of problems) {
        if (currentProblems.get(where) !== text) yield* Effect.logWarning(text)
      }
      currentProblems = problems
    }).pipe(Effect.withSpan("GlobalConsumer.reconcile"))

    // Supervised; a restart reconciles at once, since the step that died may have taken the
    // only wake-up of a change.
    let reconcilerRuns = 0
    yield* Effect.forkIn(
      Effect.suspend(() => {
        if (reconcilerRuns++ > 0) wake()
        return Effect.forever(
          Queue.take(wakeups).pipe(
            Effect.zipRight(loopStep("consumer.reconcile")),
            Effect.zipRight(reconcile)
          )
        )
      }).pipe(
        (loop) => supervised("consumer.reconcile", loop),
        Effect.annotateLogs("component", "GlobalConsumer")
      ),
      consumerScope
    )

    // ---- relays

    const invalidate = (relay: RelayState, why: string): Effect.Effect<void> =>
      Effect.suspend(() => {
        const hadCatalog = relay.catalog !== undefined
        relay.catalog = undefined
        relay.info = undefined
        relay.connected = false
        relay.lastError = why
        wake()
        // The WARN (or the DEBUG of a retry) is `relayUnreachable`'s, with the next delay.
        return Effect.logDebug(
          hadCatalog ? "relay epoch ended; everything learned from it is invalidated" : "relay epoch ended"
        ).pipe(Effect.annotateLogs({ ...relayAnnotations(relay), why }))
      })

    const runEpoch = (
      relay: RelayState,
      client: RelayClient
    ): Effect.Effect<never, RelayClientError | EpochEnded> =>
      Effect.gen(function* () {
        relay.epochs += 1
        yield* Metric.increment(Metric.tagged(relayEpochsTotal, "relay", relay.spec.name))
        const info = yield* client.relayInfo.pipe(
          Effect.ensuring(
            Effect.sync(() => {
              relay.attempted = true
            })
          )
        )
        if (relay.knownDcId !== undefined && !relay.knownDcId.equals(info.dcId)) {
          yield* Effect.logWarning("relay reports a different dc id; its domains are rebuilt").pipe(
            Effect.annotateLogs({ previous: relay.knownDcId.hex, current: info.dcId.hex })
          )
        }
        relay.info = info
        relay.knownDcId = info.dcId
        yield* Effect.logDebug("relay learned").pipe(
          Effect.annotateLogs({
            dcName: info.dcName,
            dcId: info.dcId.hex,
            relayIncarnation: String(info.relay.relayIncarnation)
          })
        )
        wake()
        yield* client.watchCatalog(`${subscriberId}/catalog`).pipe(
          Stream.runForEach((catalog) =>
            Effect.suspend(() => {
              if (faults.take("consumer.relay")) return Effect.die(new InjectedLoopFault("consumer.relay"))
              if (!Equal.equals(catalog.relay, info.relay)) {
                return Effect.fail(
                  new EpochEnded({
                    message: `relay identity changed within the epoch (incarnation ${info.relay.relayIncarnation} -> ${catalog.relay.relayIncarnation})`
                  })
                )
              }
              const previous = relay.catalog
              if (previous !== undefined && catalog.revision < previous.revision) {
                return Effect.fail(
                  new EpochEnded({
                    message: `catalog revision went back from ${previous.revision} to ${catalog.revision}`
                  })
                )
              }
              if (
                previous !== undefined &&
                catalog.revision === previous.revision &&
                !sameCatalogContent(previous, catalog)
              ) {
                return Effect.fail(
                  new EpochEnded({
                    message: `catalog revision ${catalog.revision} was sent with different content`
                  })
                )
              }
              relay.catalog = catalog
              relay.lastCatalog = catalog
              relay.connected = true
              relay.lastError = undefined
              known.remember(relays.flatMap((r) => (r.catalog === undefined ? [] : [r.catalog])))
              wake()
              return previous === undefined ? relayConnected(relay, info, catalog) : Effect.void
            })
          )
        )
        return yield* Effect.fail(new EpochEnded({ message: "catalog watch ended" }))
      }).pipe(Effect.withSpan("GlobalConsumer.relay.epoch", { attributes: { relay: relay.spec.name } }))

    /**
     * Epochs one after another, with backoff. A defect is no ended epoch: the relay's state is
     * invalidated and the defect reaches the loop's supervisor, which logs, counts and restarts.
     */
    const relayLoop = (relay: RelayState): Effect.Effect<never> =>
      Effect.gen(function* () {
        const client = relay.client ?? (yield* connector.connect(relay.spec))
        relay.client = client
        if (!followed.has(relay.index)) {
          followed.add(relay.index)
          yield* Effect.forkIn(
            RelaySignals.follow(signals, {
              relay: relay.spec.name,
              client,
              subscriberId,
              resetAfterMs,
              backoff: backoffDelay,
              relayConnected: () => relay.connected
            }),
            consumerScope
          )
        }
        let attempt = 0
        for (;;) {
          const started = nowMs()
          const exit = yield* Effect.exit(runEpoch(relay, client))
          if (Exit.isFailure(exit) && Option.isNone(Cause.failureOption(exit.cause))) {
            if (Cause.isInterruptedOnly(exit.cause)) return yield* Effect.interrupt
            yield* invalidate(relay, "the relay client failed with a defect")
            // The cause holds no Fail (checked above), only defects: no error value is lost.
            return yield* Effect.failCause(exit.cause as Cause.Cause<never>)
          }
          const why = Exit.isFailure(exit)
            ? Cause.failureOption(exit.cause).pipe((failure) =>
                failure._tag === "Some"
                  ? failure.value._tag === "EpochEnded"
                    ? failure.value.message
                    : relayClientErrorText(failure.value)
                  : Cause.pretty(exit.cause)
              )
            : "epoch ended"
          yield* invalidate(relay, why)
          if (nowMs() - started >= resetAfterMs) attempt = 0
          const delay = yield* backoffDelay(attempt)
          yield* relayUnreachable(relay, why, Duration.toMillis(delay))
          yield* Effect.sleep(delay)
          attempt += 1
        }
      }).pipe(Effect.annotateLogs(relayAnnotations(relay)))

    // Each relay's load and readiness, for routing decisions (PROTOCOL §7.1 ◆3).
    const signals = new RelaySignals.RelaySignals()
    const followed = new Set<number>()

    for (const relay of relays) {
      yield* Effect.forkIn(supervised("consumer.relay", relayLoop(relay)), consumerScope)
    }

    // ---- public surface

    const domainList = (): ReadonlyArray<DomainStatus> => {
      if (domainListCache === undefined) {
        domainListCache = Object.freeze([...domains.values()].sort((a, b) => a.id.compareTo(b.id)))
      }
      return domainListCache
    }

    const refreshGauges = Effect.suspend(() => {
      const updates: Array<Effect.Effect<void>> = [Metric.set(domainsGauge, domains.size)]
      for (const relay of relays) {
        let ready = 0
        let notReady = 0
        for (const domain of domains.values()) {
          const lane = domain.lanes.get(relay.index)
          if (lane === undefined) continue
          if (lane.ready) ready++
          else notReady++
        }
        const tagged = Metric.tagged(lanesGauge, "relay", relay.spec.name)
        updates.push(Metric.set(Metric.tagged(tagged, "state", "ready"), ready))
        updates.push(Metric.set(Metric.tagged(tagged, "state", "not_ready"), notReady))
        updates.push(
          Metric.set(Metric.tagged(relayConnectedGauge, "relay", relay.spec.name), relay.connected ? 1 : 0)
        )
      }
      return Effect.all(updates, { discard: true })
    })

    yield* Effect.logInfo("global consumer started").pipe(
      Effect.annotateLogs({
        consumerInstance: hex16(consumerInstance),
        relays: config.relays.map((r) => `${r.name}=${r.url}`).join(" ")
      })
    )

    const service: GlobalConsumerService = {
      consumerInstance,
      subscriberId,
      relays: () =>
        relays.map((relay) => ({
          name: relay.spec.name,
          url: relay.spec.url,
          lane: relay.index,
          info: relay.info,
          catalog: relay.catalog,
          lastCatalog: relay.lastCatalog,
          connected: relay.connected,
          epochs: relay.epochs,
          lastError: relay.lastError
        })),
      domains: domainList,
      problems: () => [...currentProblems.values()],
      known,
      signals,
      refreshGauges
    }
    return service
  })

/** The consumer as a scoped layer; needs a `RelayConnector` (e.g. `RelayConnector.layerHttp()`). */
export const layer = (
  config: GlobalConsumerConfig
): Layer.Layer<GlobalConsumer, GlobalConsumerConfigError, RelayConnector> =>
  Layer.scoped(GlobalConsumer, make(config))
