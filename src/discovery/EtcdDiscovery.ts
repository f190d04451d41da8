/**
 * The etcd discovery backend (PROTOCOL.md §2) and the worker-side registrar.
 *
 * Keys: `PREFIX/cards/{namespace}/{component}/{endpoint}/{instanceId}[/{modelSuffix}]` and
 * `PREFIX/sources/{kvStateEndpoint}/{workerId}/{dpRank}/{publisherId}`, values the JSON records.
 * The relay lists the prefix, watches from the listed revision, re-lists every 30 s, and after a
 * failure rebinds (re-list, new watch) with backoff 100 ms doubling to 5 s, reset on success.
 * A record whose value is invalid or disagrees with its key is logged once and ignored.
 *
 * Outages (PROTOCOL §2 ◆): while etcd cannot be reached the last listed records stay in force
 * (state `stale`); only a listing or a watch event removes a record. An etcd that cannot be
 * reached at start is not fatal: the backend starts with no records (state `connecting`) and
 * keeps retrying with the same backoff. The loop is supervised: a defect restarts it.
 */

import { Data, Duration, Effect, Either, FiberSet, Layer, Queue, Runtime, Schedule, type Scope } from "effect"
import { Etcd3, type IKeyValue, type IOptions, type IWatchResponse, type Watcher } from "etcd3"
import { loopStep, supervised } from "../observability/Supervised.js"
import type { KvEventSource } from "../protocol/Discovery.js"
import { KvEventSourceJson, type ModelCardInstance, ModelCardInstanceJson } from "../protocol/Discovery.js"
import { decodeJsonText, encodeJsonText } from "../protocol/Json.js"
import {
  Discovery,
  type DiscoveryShape,
  type DiscoverySnapshot,
  makeSnapshotCell,
  makeStatusCell,
  type RejectedSource,
  type SourceStreamState
} from "./Discovery.js"
import { DEFAULT_ETCD_PREFIX } from "./DiscoveryConfig.js"
import { cardPath, sourceRecordKey } from "./DiscoveryRecords.js"

interface EtcdConnectionOptions {
  /** `http://host:port` URLs of the etcd cluster. */
  readonly endpoints: ReadonlyArray<string>
  /** Key prefix (default `/kvrelay/v1`). */
  readonly prefix?: string
  /** Deadline of each unary call (default 5 s). */
  readonly callTimeout?: Duration.DurationInput
}

interface EtcdDiscoveryOptions extends EtcdConnectionOptions {
  /** Periodic full re-list (default 30 s). */
  readonly relistInterval?: Duration.DurationInput
  /** First rebind delay (default 100 ms); doubles per failure. */
  readonly backoffInitial?: Duration.DurationInput
  /** Rebind delay cap (default 5 s). */
  readonly backoffMax?: Duration.DurationInput
}

/** An etcd operation that failed; `operation` says which. */
export class EtcdError extends Data.TaggedError("EtcdError")<{
  readonly operation: string
  readonly endpoints: string
  readonly reason: string
}> {
  override get message(): string {
    return `etcd ${this.operation} at ${this.endpoints} failed: ${this.reason}`
  }
}

// ---------------------------------------------------------------------------------------------
// Keys

/** The etcd key of a model card instance under `prefix`. */
export const cardKey = (prefix: string, card: ModelCardInstance): string =>
  `${prefix}/cards/${cardPath(card)}`

/** The etcd key of a KV event source under `prefix`. */
export const sourceKey = (prefix: string, source: KvEventSource): string =>
  `${prefix}/sources/${sourceRecordKey(source)}`

const causeText = (cause: unknown): string => (cause instanceof Error ? cause.message : String(cause))

type Entry =
  | { readonly kind: "card"; readonly raw: string; readonly card: ModelCardInstance }
  | { readonly kind: "source"; readonly raw: string; readonly source: KvEventSource }
  | { readonly kind: "rejected"; readonly raw: string; readonly rejected: RejectedSource }
  | { readonly kind: "ignored"; readonly raw: string }

const decodeCardText = decodeJsonText(ModelCardInstanceJson)
const decodeSourceText = decodeJsonText(KvEventSourceJson)
const U64_TEXT = /^(0|[1-9][0-9]{0,19})$/

/** Decodes one key/value; the second element is the warning to log when the record is not used. */
const decodeEtcdRecord = (prefix: string, key: string, raw: string): readonly [Entry, string | undefined] => {
  const rest = key.startsWith(`${prefix}/`) ? key.slice(prefix.length + 1) : undefined
  if (rest?.startsWith("cards/")) {
    const decoded = decodeCardText(raw)
    if (Either.isLeft(decoded))
      return [{ kind: "ignored", raw }, `invalid model card at ${key}: ${decoded.left.message}`]
    const expected = cardKey(prefix, decoded.right)
    if (expected !== key) {
      return [
        { kind: "ignored", raw },
        `model card at ${key} disagrees with its key: its value belongs at ${expected}`
      ]
    }
    return [{ kind: "card", raw, card: decoded.right }, undefined]
  }
  if (rest?.startsWith("sources/")) {
    const recordKey = rest.slice("sources/".length)
    const segments = recordKey.split("/")
    if (segments.length < 4) {
      return [
        { kind: "ignored", raw },
        `ignoring ${key}: a source key needs {kvStateEndpoint}/{workerId}/{dpRank}/{publisherId}`
      ]
    }
    const publisherText = segments[segments.length - 1]!
    const kvStateEndpoint = segments.slice(0, -3).join("/")
    const reject = (reason: string): readonly [Entry, string] => [
      {
        kind: "rejected",
        raw,
        rejected: {
          recordKey,
          kvStateEndpoint,
          publisherId: U64_TEXT.test(publisherText) ? BigInt(publisherText) : undefined,
          reason,
          value: raw
        }
      },
      `invalid KV event source at ${key}: ${reason}`
    ]
    const decoded = decodeSourceText(raw)
    if (Either.isLeft(decoded)) return reject(decoded.left.message)
    const expected = sourceKey(prefix, decoded.right)
    if (expected !== key) return reject(`its value belongs at ${expected}`)
    return [{ kind: "source", raw, source: decoded.right }, undefined]
  }
  return [{ kind: "ignored", raw }, `ignoring ${key}: not a cards/ or sources/ key`]
}

/**
 * The watched record set: one entry per key, reused while its raw value is unchanged. The arrays
 * of each record kind are rebuilt only after a change of that kind, so consumers can skip an
 * unchanged kind by reference.
 */
class RecordSet {
  private entries = new Map<string, Entry>()
  private cards: ReadonlyArray<ModelCardInstance> = []
  private sources: ReadonlyArray<KvEventSource> = []
  private rejected: ReadonlyArray<RejectedSource> = []
  private readonly dirty = new Set<Entry["kind"]>(["card", "source", "rejected"])
  appliedRevision = 0n

  constructor(private readonly prefix: string) {}

  /** Returns whether the records changed; warnings of newly seen values are appended. */
  replaceAll(kvs: ReadonlyArray<IKeyValue>, warnings: Array<string>): boolean {
    const next = new Map<string, Entry>()
    for (const kv of kvs) {
      const key = kv.key.toString()
      const raw = kv.value.toString()
      const previous = this.entries.get(key)
      if (previous !== undefined && previous.raw === raw) next.set(key, previous)
      else {
        const entry = this.decode(key, raw, warnings)
        next.set(key, entry)
        this.dirty.add(entry.kind)
        if (previous !== undefined) this.dirty.add(previous.kind)
      }
    }
    for (const [key, entry] of this.entries) if (!next.has(key)) this.dirty.add(entry.kind)
    this.entries = next
    return this.dirty.size > 0
  }

  put(key: string, raw: string, warnings: Array<string>): boolean {
    const previous = this.entries.get(key)
    if (previous !== undefined && previous.raw === raw) return false
    const entry = this.decode(key, raw, warnings)
    this.entries.set(key, entry)
    this.dirty.add(entry.kind)
    if (previous !== undefined) this.dirty.add(previous.kind)
    return true
  }

  delete(key: string): boolean {
    const previous = this.entries.get(key)
    if (previous === undefined) return false
    this.entries.delete(key)
    this.dirty.add(previous.kind)
    return true
  }

  snapshot(revision: bigint, sourceStream: SourceStreamState): DiscoverySnapshot {
    if (this.dirty.has("card") || this.dirty.has("source") || this.dirty.has("rejected")) {
      const cards: Array<ModelCardInstance> = []
      const sources: Array<KvEventSource> = []
      const rejected: Array<RejectedSource> = []
      for (const entry of this.entries.values()) {
        if (entry.kind === "card") cards.push(entry.card)
        else if (entry.kind === "source") sources.push(entry.source)
        else if (entry.kind === "rejected") rejected.push(entry.rejected)
      }
      if (this.dirty.has("card")) this.cards = cards
      if (this.dirty.has("source")) this.sources = sources
      if (this.dirty.has("rejected")) this.rejected = rejected
    }
    this.dirty.clear()
    return {
      revision,
      cards: this.cards,
      sources: this.sources,
      rejectedSources: this.rejected,
      sourceStream
    }
  }

  private decode(key: string, raw: string, warnings: Array<string>): Entry {
    const [entry, warning] = decodeEtcdRecord(this.prefix, key, raw)
    if (warning !== undefined) warnings.push(warning)
    return entry
  }
}

// ---------------------------------------------------------------------------------------------
// Client

/**
 * etcd3 only calls `execute` on its fault-handling policies. Passing calls straight through hands
 * retries and backoff to the relay's own Schedule; etcd3's default circuit breaker would refuse
 * every call for 5 s after three failures and so delay convergence after an etcd restart.
 */
const passThrough = {
  execute: <T>(fn: (context: { signal: AbortSignal }) => PromiseLike<T> | T): Promise<T> =>
    Promise.resolve().then(() => fn({ signal: new AbortController().signal }))
}
type FaultHandling = NonNullable<IOptions["faultHandling"]>
// The cockatiel policy type also declares event emitters etcd3 never touches (see above).
const passThroughPolicy = passThrough as unknown as NonNullable<FaultHandling["global"]>

const makeClient = (options: EtcdConnectionOptions): Etcd3 => {
  const timeoutMs = Duration.toMillis(Duration.decode(options.callTimeout ?? "5 seconds"))
  return new Etcd3({
    hosts: [...options.endpoints],
    dialTimeout: timeoutMs,
    faultHandling: { host: () => passThroughPolicy, global: passThroughPolicy },
    // etcd3 applies deadlines with wall-clock timestamps; streams (watch, keep-alive) get none.
    defaultCallOptions: (context) => (context.isStream ? {} : { deadline: Date.now() + timeoutMs }),
    grpcOptions: {
      // A full listing of a large deployment exceeds gRPC's default 4 MiB message limit.
      "grpc.max_receive_message_length": 256 * 1024 * 1024,
      "grpc.initial_reconnect_backoff_ms": 100,
      "grpc.max_reconnect_backoff_ms": 5000
    }
  })
}

// ---------------------------------------------------------------------------------------------
// Discovery

type WatchSignal =
  | { readonly _tag: "Connected" }
  | { readonly _tag: "Data"; readonly response: IWatchResponse }
  | { readonly _tag: "Failed"; readonly reason: string }
  | { readonly _tag: "Relist" }

interface Listing {
  readonly kvs: ReadonlyArray<IKeyValue>
  readonly revision: bigint
}

/** Discovery from etcd: a watch over the cards and sources under the prefix. */
export const makeEtcdDiscovery = (
  options: EtcdDiscoveryOptions
): Effect.Effect<DiscoveryShape, never, Scope.Scope> =>
  Effect.gen(function* () {
    const prefix = options.prefix ?? DEFAULT_ETCD_PREFIX
    const endpoints = options.endpoints.join(",")
    const backend = `etcd:${endpoints}`
    const relistInterval = Duration.decode(options.relistInterval ?? "30 seconds")
    const backoff = Schedule.exponential(options.backoffInitial ?? "100 millis", 2).pipe(
      Schedule.union(Schedule.spaced(options.backoffMax ?? "5 seconds"))
    )
    const client = yield* Effect.acquireRelease(
      Effect.sync(() => makeClient(options)),
      (c) => Effect.sync(() => c.close())
    )

    const list: Effect.Effect<Listing, EtcdError> = Effect.tryPromise({
      try: () => client.getAll().prefix(`${prefix}/`).exec(),
      catch: (cause) => new EtcdError({ operation: "list", endpoints, reason: causeText(cause) })
    }).pipe(
      Effect.map((response) => ({ kvs: response.kvs, revision: BigInt(response.header.revision) })),
      Effect.withSpan("discovery.etcd.list", { attributes: { "etcd.prefix": prefix } })
    )

    const records = new RecordSet(prefix)
    // Constant since PROTOCOL revision 2: an outage no longer resets source membership.
    const stream: SourceStreamState = { epoch: 0, bound: true }
    const logWarnings = (warnings: ReadonlyArray<string>) =>
      Effect.forEach(warnings, (warning) => Effect.logWarning(warning), { discard: true })

    const status = yield* makeStatusCell("connecting")
    const first = yield* Effect.either(list)
    /** A listing the next session applies instead of listing again (the one made at start). */
    let pendingListing: Listing | undefined
    if (Either.isRight(first)) {
      const initialWarnings: Array<string> = []
      records.replaceAll(first.right.kvs, initialWarnings)
      records.appliedRevision = first.right.revision
      yield* logWarnings(initialWarnings)
      yield* status.set("live")
      pendingListing = first.right
    } else {
      yield* Effect.logWarning(
        `etcd cannot be reached at start; serving an empty membership and retrying: ${first.left.reason}`
      )
    }
    const cell = yield* makeSnapshotCell(records.snapshot(records.appliedRevision, stream))

    /**
     * Replaces the record set with a listing. A periodic re-list yields to a watch that already
     * applied a later revision; a rebind (`authoritative`) always wins, since a restored or
     * recreated etcd may restart its revisions.
     */
    const applyListing = (listing: Listing, authoritative: boolean) =>
      Effect.suspend(() => {
        if (!authoritative && listing.revision < records.appliedRevision) return Effect.void
        const warnings: Array<string> = []
        const changed = records.replaceAll(listing.kvs, warnings)
        records.appliedRevision = listing.revision
        return logWarnings(warnings).pipe(
          Effect.zipRight(changed ? cell.publish(records.snapshot(listing.revision, stream)) : Effect.void)
        )
      })

    const applyWatch = (response: IWatchResponse) =>
      Effect.suspend(() => {
        const warnings: Array<string> = []
        let changed = false
        for (const event of response.events) {
          // A listing may already contain an event still in flight on the watch.
          if (BigInt(event.kv.mod_revision) <= records.appliedRevision) continue
          const key = event.kv.key.toString()
          changed =
            (event.type === "Put"
              ? records.put(key, event.kv.value.toString(), warnings)
              : records.delete(key)) || changed
        }
        const revision = BigInt(response.header.revision)
        if (revision > records.appliedRevision) records.appliedRevision = revision
        return logWarnings(warnings).pipe(
          Effect.zipRight(
            changed ? cell.publish(records.snapshot(records.appliedRevision, stream)) : Effect.void
          )
        )
      })

    const openWatch = (fromRevision: bigint, signals: Queue.Queue<WatchSignal>) =>
      Effect.acquireRelease(
        Effect.sync(() => {
          // `watcher()` attaches synchronously, so no response can arrive before the handlers;
          // `create()` resolves only after 'connected', when data may already have been emitted.
          const watcher: Watcher = client
            .watch()
            .prefix(`${prefix}/`)
            .startRevision(String(fromRevision))
            .watcher()
          watcher
            .on("connected", () => Queue.unsafeOffer(signals, { _tag: "Connected" }))
            .on("data", (response) => Queue.unsafeOffer(signals, { _tag: "Data", response }))
            .on("disconnected", (error) =>
              Queue.unsafeOffer(signals, {
                _tag: "Failed",
                reason: `watch disconnected: ${causeText(error)}`
              })
            )
            .on("error", (error) =>
              Queue.unsafeOffer(signals, { _tag: "Failed", reason: `watch failed: ${causeText(error)}` })
            )
          return watcher
        }),
        (watcher) =>
          Effect.promise(() => watcher.cancel().catch(() => undefined)).pipe(
            Effect.timeout("1 second"),
            Effect.ignore
          )
      ).pipe(
        Effect.withSpan("discovery.etcd.watch", { attributes: { "etcd.revision": String(fromRevision) } })
      )

    /** Rebind failures since the backend was last live, so only the first is logged loudly. */
    let failures = 0
    const becameLive = status.set("live").pipe(
      Effect.tap(() => {
        failures = 0
      }),
      Effect.flatMap((changed) =>
        changed
          ? Effect.logInfo("etcd discovery is live").pipe(
              Effect.annotateLogs({ revision: String(records.appliedRevision) })
            )
          : Effect.void
      )
    )

    /** One bound session: (list,) watch, apply until the watch or a re-list fails. Never succeeds. */
    const session = (driver: Schedule.ScheduleDriver<unknown, unknown>) =>
      Effect.scoped(
        Effect.gen(function* () {
          const listed = pendingListing
          pendingListing = undefined
          const current = listed ?? (yield* list)
          yield* applyListing(current, true)
          yield* becameLive
          yield* driver.reset
          const signals = yield* Queue.unbounded<WatchSignal>()
          yield* openWatch(current.revision + 1n, signals)
          yield* Effect.forever(
            Effect.sleep(relistInterval).pipe(Effect.zipRight(Queue.offer(signals, { _tag: "Relist" })))
          ).pipe(Effect.forkScoped)
          while (true) {
            const signal = yield* Queue.take(signals)
            yield* loopStep("discovery.etcd")
            if (signal._tag === "Failed") {
              return yield* new EtcdError({ operation: "watch", endpoints, reason: signal.reason })
            }
            if (signal._tag === "Connected") yield* driver.reset
            else if (signal._tag === "Data") yield* applyWatch(signal.response)
            else {
              // A re-list that fails means etcd stopped answering even if the watch has not
              // noticed (a silent partition): rebind rather than trust the watch.
              yield* list.pipe(
                Effect.flatMap((listing) => applyListing(listing, false)),
                Effect.withSpan("discovery.etcd.relist")
              )
            }
          }
        })
      )

    const loop = Effect.gen(function* () {
      const driver = yield* Schedule.driver(backoff)
      while (true) {
        const result = yield* Effect.either(session(driver))
        if (Either.isRight(result)) continue
        failures += 1
        const error = result.left
        const { state } = yield* status.get
        if (state === "live") {
          yield* status.set("stale")
          yield* Effect.logError(
            `etcd discovery stream failed; the last membership stays in force while rebinding: ${error.message}`
          )
        } else if (failures === 1) {
          yield* Effect.logWarning(`etcd discovery still cannot reach etcd; retrying: ${error.message}`).pipe(
            Effect.annotateLogs({ state })
          )
        } else {
          yield* Effect.logDebug(`etcd discovery rebind failed again: ${error.message}`).pipe(
            Effect.annotateLogs({ failures, state })
          )
        }
        yield* driver.next(error).pipe(Effect.ignore, Effect.withSpan("discovery.etcd.rebind"))
      }
    })

    const fibers = yield* FiberSet.make()
    // After a defect the supervisor starts a fresh session (list, watch) over the kept records.
    yield* FiberSet.run(fibers, supervised("discovery.etcd", loop))
    const close = FiberSet.clear(fibers).pipe(
      Effect.zipRight(cell.closed.open),
      Effect.zipRight(Effect.sync(() => client.close()))
    )
    yield* Effect.addFinalizer(() => cell.closed.open)
    yield* Effect.logInfo("etcd discovery started").pipe(
      Effect.annotateLogs({
        revision: String(records.appliedRevision),
        keys: Either.isRight(first) ? first.right.kvs.length : 0,
        state: (yield* status.get).state
      })
    )
    return { backend, status: status.get, current: cell.current, changes: cell.changes, close }
  }).pipe(Effect.annotateLogs({ component: "discovery", backend: `etcd:${options.endpoints.join(",")}` }))

/** `makeEtcdDiscovery` as the `Discovery` service. */
export const etcdDiscoveryLayer = (options: EtcdDiscoveryOptions): Layer.Layer<Discovery> =>
  Layer.scoped(Discovery, makeEtcdDiscovery(options))

// ---------------------------------------------------------------------------------------------
// Registrar (workers, tests, the demo)

interface EtcdRegistrarOptions extends EtcdConnectionOptions {
  /** Lease TTL in seconds (default 10; etcd raises TTLs below its minimum, about 2 s by default). */
  readonly ttlSeconds?: number
}

interface EtcdRegistrar {
  /** The lease id (decimal), for logs. */
  readonly leaseId: string
  /** Puts the card under the lease; the key is deleted when the returned scope closes. */
  readonly registerCard: (card: ModelCardInstance) => Effect.Effect<void, EtcdError, Scope.Scope>
  /** Puts the source under the lease; the key is deleted when the returned scope closes. */
  readonly registerSource: (source: KvEventSource) => Effect.Effect<void, EtcdError, Scope.Scope>
  /** Stops keep-alives so the lease expires after its TTL, as if the worker crashed. */
  readonly releaseLease: Effect.Effect<void>
}

const encodeCard = encodeJsonText(ModelCardInstanceJson)
const encodeSource = encodeJsonText(KvEventSourceJson)

/**
 * A worker's registrar: one lease kept alive by etcd3's keep-alive loop and revoked when the
 * registrar's scope closes, so every record it registered disappears with it.
 */
export const makeEtcdRegistrar = (
  options: EtcdRegistrarOptions
): Effect.Effect<EtcdRegistrar, EtcdError, Scope.Scope> =>
  Effect.gen(function* () {
    const prefix = options.prefix ?? DEFAULT_ETCD_PREFIX
    const endpoints = options.endpoints.join(",")
    const client = yield* Effect.acquireRelease(
      Effect.sync(() => makeClient(options)),
      (c) => Effect.sync(() => c.close())
    )
    const runtime = yield* Effect.runtime<never>()
    const lease = client.lease(options.ttlSeconds ?? 10)
    lease.on("lost", (error) => {
      Runtime.runFork(runtime)(Effect.logWarning(`etcd registrar lease lost: ${causeText(error)}`))
    })
    const leaseId = yield* Effect.tryPromise({
      try: () => lease.grant(),
      catch: (cause) => new EtcdError({ operation: "lease grant", endpoints, reason: causeText(cause) })
    })
    yield* Effect.addFinalizer(() =>
      Effect.promise(() => lease.revoke().catch(() => undefined)).pipe(
        Effect.timeout("2 seconds"),
        Effect.ignore
      )
    )

    const register = (key: string, value: Either.Either<string, { readonly message: string }>) =>
      Effect.gen(function* () {
        if (Either.isLeft(value)) {
          return yield* new EtcdError({ operation: `put ${key}`, endpoints, reason: value.left.message })
        }
        yield* Effect.acquireRelease(
          Effect.tryPromise({
            try: () => lease.put(key).value(value.right).exec(),
            catch: (cause) => new EtcdError({ operation: `put ${key}`, endpoints, reason: causeText(cause) })
          }),
          () =>
            Effect.promise(() =>
              client
                .delete()
                .key(key)
                .exec()
                .catch(() => undefined)
            ).pipe(Effect.timeout("2 seconds"), Effect.ignore)
        )
      })

    const registrar: EtcdRegistrar = {
      leaseId,
      registerCard: (card) => register(cardKey(prefix, card), encodeCard(card)),
      registerSource: (source) => register(sourceKey(prefix, source), encodeSource(source)),
      releaseLease: Effect.sync(() => lease.release())
    }
    return registrar
  }).pipe(Effect.annotateLogs({ component: "etcd-registrar" }))
