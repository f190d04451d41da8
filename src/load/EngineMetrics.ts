/**
 * Engine load from the engines' own Prometheus metrics (PROTOCOL §2 `metricsUrl`, §5 "Engine
 * load"): what one page says per data-parallel rank, a bounded HTTP read of a page, and a poller
 * that reads every distinct `metricsUrl` once a second off the caller's path.
 *
 * The names and labels, as the engines define them (docs/engines.md, "Engine load"):
 * - vLLM (`vllm/v1/metrics/loggers.py`, `PrometheusStatLogger`): gauges
 *   `vllm:num_requests_running`, `vllm:num_requests_waiting`, `vllm:kv_cache_usage_perc` (a
 *   fraction, "1 means 100 percent usage"; before 0.10 also `vllm:gpu_cache_usage_perc`), labelled
 *   `model_name` and `engine`; `engine` is the engine core's index, which is its data-parallel
 *   rank (`engine_ranks_managed` counts from the process's `data_parallel_rank`).
 * - SGLang (`sglang/srt/metrics/collector.py`, `SchedulerMetricsCollector`): gauges
 *   `sglang:num_running_reqs`, `sglang:num_queue_reqs`, `sglang:token_usage` (used tokens over
 *   the pool's `max_total_num_tokens`, a fraction), labelled `model_name`, `engine_type`,
 *   `tp_rank`, `pp_rank` (and `moe_ep_rank`, `priority` in later versions), plus `dp_rank` only
 *   when the scheduler has a data-parallel rank. With priority scheduling the request counts are
 *   written twice: the total under `priority=""` and a breakdown under `priority="<n>"`.
 */

import * as HttpClient from "@effect/platform/HttpClient"
import * as HttpClientRequest from "@effect/platform/HttpClientRequest"
import {
  Chunk,
  Clock,
  Data,
  Duration,
  Effect,
  Either,
  Metric,
  Queue,
  type Scope,
  Stream,
  SubscriptionRef
} from "effect"
import { causeChainText as causeText } from "../observability/CauseText.js"
import { supervised } from "../observability/Supervised.js"
import {
  ExpositionError,
  excerpt,
  type ParsedFamily,
  readFamilies,
  sampleNumber
} from "./internal/exposition.js"

/** The engines whose load gauges are read (PROTOCOL §5 ◆3 "Engine load"). */
export type EngineKind = "vllm" | "sglang"

/** One rank's load as its engine reported it; a value the page did not give (or gave as NaN) is absent. */
export interface RankLoad {
  readonly runningRequests?: number
  readonly waitingRequests?: number
  /** Fraction of the rank's KV cache in use, 0–1. */
  readonly kvUsage?: number
}

/** What one metrics page says, per rank. */
export interface EngineMetricsPage {
  /** Whose names the page uses (empty: neither engine's load gauges are on it). */
  readonly engines: ReadonlyArray<EngineKind>
  /** Loads by the engine's own rank label (vLLM `engine`, SGLang `dp_rank`). */
  readonly ranks: ReadonlyMap<number, RankLoad>
  /** The load of series without a rank label (an SGLang server without data parallelism). */
  readonly unlabelled: RankLoad | undefined
  /** Series skipped because their rank label is not a rank number. */
  readonly ignoredSeries: number
}

/** The gauges read, in order of preference per value; the first with a usable sample wins. */
export const LOAD_GAUGES = {
  runningRequests: ["vllm:num_requests_running", "sglang:num_running_reqs"],
  waitingRequests: ["vllm:num_requests_waiting", "sglang:num_queue_reqs"],
  kvUsage: ["vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc", "sglang:token_usage"]
} as const satisfies Record<keyof RankLoad, ReadonlyArray<string>>

/** The label that carries the data-parallel rank, by engine. */
export const RANK_LABEL: Readonly<Record<EngineKind, string>> = { vllm: "engine", sglang: "dp_rank" }

const WANTED: ReadonlySet<string> = new Set(Object.values(LOAD_GAUGES).flat())

const engineOf = (family: string): EngineKind => (family.startsWith("vllm:") ? "vllm" : "sglang")

const RANK_VALUE = /^\d{1,9}$/

/** Replica labels: SGLang with metrics on every scheduler repeats one rank's state per TP/PP rank. */
const replicaOrder = (labels: Readonly<Record<string, string>>): number => {
  const tp = Number(labels["tp_rank"] ?? 0)
  const pp = Number(labels["pp_rank"] ?? 0)
  return (Number.isSafeInteger(tp) ? tp : 0) * 1_000_000 + (Number.isSafeInteger(pp) ? pp : 0)
}

/** A usable value of a field: a finite count ≥ 0, or a usage fraction in [0, 1]. */
const usable = (field: keyof RankLoad, value: number | undefined): number | undefined => {
  if (value === undefined || !Number.isFinite(value) || value < 0) return undefined
  if (field === "kvUsage" && value > 1) return undefined
  return value
}

interface Candidate {
  readonly value: number | undefined
  readonly order: number
  readonly position: number
}

/**
 * Reads one page's exposition text. A page that is not an exposition fails with an
 * `EngineMetricsError` (`parse`) naming what was wrong; a page without the load gauges succeeds
 * with no ranks (their load is unknown, never zero).
 */
export const parseEngineMetrics = (
  text: string,
  url = ""
): Either.Either<EngineMetricsPage, EngineMetricsError> => {
  let families: ReadonlyArray<ParsedFamily> | ExpositionError
  try {
    families = readFamilies(text, WANTED)
  } catch (cause) {
    // The parser must never take a reader down, whatever the page holds.
    families = new ExpositionError(
      `the page could not be read: ${cause instanceof Error ? cause.message : String(cause)}`
    )
  }
  if (families instanceof ExpositionError) {
    return Either.left(new EngineMetricsError({ reason: "parse", url, message: families.message }))
  }
  const engines = new Set<EngineKind>()
  let ignoredSeries = 0
  // Per rank ("" for unlabelled), per field, per gauge name: the series chosen so far.
  const chosen = new Map<string, Map<string, Candidate>>()
  let position = 0
  for (const family of families) {
    const engine = engineOf(family.name)
    engines.add(engine)
    for (const sample of family.metrics) {
      position++
      const labels = sample.labels ?? {}
      // SGLang's per-priority breakdown repeats the total that `priority=""` carries.
      if ((labels["priority"] ?? "") !== "") continue
      const rankText = labels[RANK_LABEL[engine]]
      if (rankText !== undefined && !RANK_VALUE.test(rankText)) {
        ignoredSeries++
        continue
      }
      const rankKey = rankText === undefined ? "" : String(Number(rankText))
      let byName = chosen.get(rankKey)
      if (byName === undefined) {
        byName = new Map()
        chosen.set(rankKey, byName)
      }
      const candidate: Candidate = {
        value: sample.value === undefined ? undefined : sampleNumber(sample.value),
        order: replicaOrder(labels),
        position
      }
      const previous = byName.get(family.name)
      if (
        previous === undefined ||
        candidate.order < previous.order ||
        (candidate.order === previous.order && candidate.position < previous.position)
      ) {
        byName.set(family.name, candidate)
      }
    }
  }
  const loadOf = (byName: ReadonlyMap<string, Candidate>): RankLoad => {
    const load: { -readonly [K in keyof RankLoad]: number } = {}
    for (const field of Object.keys(LOAD_GAUGES) as Array<keyof RankLoad>) {
      for (const name of LOAD_GAUGES[field]) {
        const value = usable(field, byName.get(name)?.value)
        if (value !== undefined) {
          load[field] = value
          break
        }
      }
    }
    return load
  }
  const ranks = new Map<number, RankLoad>()
  let unlabelled: RankLoad | undefined
  for (const [rankKey, byName] of chosen) {
    if (rankKey === "") unlabelled = loadOf(byName)
    else ranks.set(Number(rankKey), loadOf(byName))
  }
  return Either.right({
    engines: Array.from(engines).sort(),
    ranks: new Map(Array.from(ranks).sort(([a], [b]) => a - b)),
    unlabelled,
    ignoredSeries
  })
}

const hasAnyValue = (load: RankLoad): boolean =>
  load.runningRequests !== undefined || load.waitingRequests !== undefined || load.kvUsage !== undefined

/**
 * The load of `dpRank` on a page read from a URL that `sharedBy` sources (ranks) read. A page
 * split by rank labels gives each rank its own series; a page without rank labels describes one
 * rank, so it is that rank's only when the URL is not shared (whatever its `dpRank`: a single-rank
 * SGLang server has no `dp_rank` label). Anything else is unknown, with the reason why.
 */
export const loadForRank = (
  page: EngineMetricsPage,
  dpRank: number,
  sharedBy: number
): Either.Either<RankLoad, string> => {
  const labelled = page.ranks.get(dpRank)
  const load =
    labelled !== undefined ? labelled : page.ranks.size === 0 && sharedBy <= 1 ? page.unlabelled : undefined
  if (load !== undefined && hasAnyValue(load)) return Either.right(load)
  const names = Object.values(LOAD_GAUGES).flat().join(", ")
  if (page.engines.length === 0) return Either.left(`the page has none of ${names}`)
  if (load !== undefined)
    return Either.left(`the page gives no usable value (NaN, infinite or out of range) for rank ${dpRank}`)
  if (page.ranks.size > 0) {
    const present = Array.from(page.ranks.keys()).join(", ")
    return Either.left(`the page has no series for rank ${dpRank} (its ranks: ${present})`)
  }
  return Either.left(
    `the page has no rank label (vLLM engine, SGLang dp_rank) and ${sharedBy} ranks read this URL`
  )
}

// --- Reading one URL -------------------------------------------------------------------------

/** Why a metrics read gave no load, as `/v1/stats` and the reads counter name it. */
export type EngineMetricsErrorReason =
  | "invalid-url"
  | "unreachable"
  | "timeout"
  | "http-status"
  | "too-large"
  | "parse"
  | "no-load"

/** A metrics read that gave no load, and why (the message names the URL's fault, never the page). */
export class EngineMetricsError extends Data.TaggedError("EngineMetricsError")<{
  readonly reason: EngineMetricsErrorReason
  readonly url: string
  readonly message: string
  readonly status?: number
}> {}

/** PROTOCOL §5: each read is bounded to 1 s. */
export const DEFAULT_READ_TIMEOUT: Duration.Duration = Duration.seconds(1)
/** Pages larger than this are refused unread (a vLLM page is tens to hundreds of kB). */
export const DEFAULT_MAX_BODY_BYTES = 8 * 1024 * 1024

/** Bounds of one metrics read: its timeout and the largest page accepted. */
export interface ReadOptions {
  readonly timeout?: Duration.DurationInput | undefined
  readonly maxBodyBytes?: number | undefined
}

const urlProblem = (url: string): string | undefined => {
  let parsed: URL
  try {
    parsed = new URL(url)
  } catch {
    return `${excerpt(url)} is not a URL`
  }
  return parsed.protocol === "http:" || parsed.protocol === "https:"
    ? undefined
    : `${excerpt(url)} is not an http(s) URL`
}

/**
 * Reads the page at `url` once: within the timeout (1 s) from request to last byte, at most
 * `maxBodyBytes` of body, and parses it. The connection is released whatever the outcome.
 */
export const readEngineMetrics = (
  url: string,
  options: ReadOptions = {}
): Effect.Effect<EngineMetricsPage, EngineMetricsError, HttpClient.HttpClient> =>
  Effect.gen(function* () {
    const problem = urlProblem(url)
    if (problem !== undefined) {
      return yield* new EngineMetricsError({ reason: "invalid-url", url, message: problem })
    }
    const timeout = Duration.decode(options.timeout ?? DEFAULT_READ_TIMEOUT)
    const maxBytes = options.maxBodyBytes ?? DEFAULT_MAX_BODY_BYTES
    const client = HttpClient.withScope(yield* HttpClient.HttpClient)
    const tooLarge = () =>
      new EngineMetricsError({ reason: "too-large", url, message: `the page exceeds ${maxBytes} bytes` })
    const body = Effect.gen(function* () {
      const response = yield* client
        .execute(
          HttpClientRequest.get(url).pipe(HttpClientRequest.setHeader("accept", "text/plain;version=0.0.4"))
        )
        .pipe(
          Effect.mapError(
            (cause) => new EngineMetricsError({ reason: "unreachable", url, message: causeText(cause) })
          )
        )
      if (response.status < 200 || response.status >= 300) {
        return yield* new EngineMetricsError({
          reason: "http-status",
          url,
          status: response.status,
          message: `HTTP ${response.status}`
        })
      }
      const declared = Number(response.headers["content-length"] ?? Number.NaN)
      if (Number.isFinite(declared) && declared > maxBytes) return yield* tooLarge()
      if (Number.isFinite(declared)) {
        // A declared length within the limit: the body in one piece (the client stops at that
        // length), without a stream's fibers per read.
        const bytes = yield* response.arrayBuffer.pipe(
          Effect.mapError(
            (cause) => new EngineMetricsError({ reason: "unreachable", url, message: causeText(cause) })
          )
        )
        if (bytes.byteLength > maxBytes) return yield* tooLarge()
        return Buffer.from(bytes).toString("utf8")
      }
      const chunks: Array<Uint8Array> = []
      let size = 0
      yield* response.stream.pipe(
        Stream.mapError(
          (cause) => new EngineMetricsError({ reason: "unreachable", url, message: causeText(cause) })
        ),
        Stream.runForEachChunk((chunk) => {
          for (const bytes of Chunk.toReadonlyArray(chunk)) {
            size += bytes.byteLength
            if (size > maxBytes) return Effect.fail(tooLarge())
            chunks.push(bytes)
          }
          return Effect.void
        })
      )
      return Buffer.concat(chunks, size).toString("utf8")
    }).pipe(Effect.scoped)
    const text = yield* body.pipe(
      Effect.timeoutFail({
        duration: timeout,
        onTimeout: () =>
          new EngineMetricsError({
            reason: "timeout",
            url,
            message: `no whole page within ${Duration.format(timeout)}`
          })
      })
    )
    return yield* parseEngineMetrics(text, url)
  }).pipe(Effect.withSpan("EngineMetrics.read", { attributes: { url } }))

// --- The poller ------------------------------------------------------------------------------

/** One source rank whose engine serves metrics (an advertised source with `metricsUrl`). */
export interface EngineMetricsSource {
  readonly metricsUrl: string
  readonly dpRank: number
}

/** The key a source's state is kept under. */
export const sourceKey = (source: EngineMetricsSource): string => `${source.dpRank}@${source.metricsUrl}`

/** A rank's latest successful read. */
export interface RankRead {
  /** Wall clock (Unix ms) when the page was read. */
  readonly atMs: number
  readonly load: RankLoad
}

/** What the poller knows of one source rank: when its URL was last read, its latest success and error. */
export interface SourceReadState {
  readonly metricsUrl: string
  readonly dpRank: number
  readonly lastSuccess?: RankRead
  /** Wall clock (Unix ms) when the last read of this source's URL ended. */
  readonly lastAttemptMs?: number
  /** Why the latest read gave this rank no load; absent once a read succeeded again. */
  readonly lastError?: {
    readonly atMs: number
    readonly reason: EngineMetricsErrorReason
    readonly message: string
  }
}

/** PROTOCOL §5: a rank is observed while its latest successful read is under 3 s old. */
export const OBSERVED_FOR_MS = 3000

/** Whether `read` still counts at `nowMs` (PROTOCOL §5). */
export const isObserved = (read: RankRead | undefined, nowMs: number): read is RankRead =>
  read !== undefined && nowMs - read.atMs < OBSERVED_FOR_MS

/** The poller's read bounds, interval and concurrency. */
export interface EngineMetricsPollerOptions extends ReadOptions {
  /** Default 1 s (PROTOCOL §5). */
  readonly interval?: Duration.DurationInput | undefined
  /** Reads in flight at once, default 16. */
  readonly concurrency?: number | undefined
}

/** The running poller: every source's latest reads, read without waiting. */
export interface EngineMetricsPoller {
  /** Every current source's state, by `sourceKey`. Never waits on a read. */
  readonly states: Effect.Effect<ReadonlyMap<string, SourceReadState>>
  /** `states` now and after every read that ends. */
  readonly changes: Stream.Stream<ReadonlyMap<string, SourceReadState>>
  /** A source's latest successful read (observed or not: see `isObserved`). */
  readonly latest: (source: EngineMetricsSource) => Effect.Effect<RankRead | undefined>
}

/** PROTOCOL §5: each source's metrics are read every second. */
export const DEFAULT_POLL_INTERVAL: Duration.Duration = Duration.seconds(1)
/** Metrics reads in flight at once, by default. */
export const DEFAULT_READ_CONCURRENCY = 16

const readsTotal = Metric.counter("kv_dc_relay_engine_metrics_reads_total", {
  description: "reads of engines' metrics pages per source rank, by result (ok or the error's reason)",
  incremental: true
})

/**
 * Reads every distinct `metricsUrl` of `sources` (evaluated at each tick: a `SubscriptionRef`'s
 * `get` follows discovery) once per interval, at most `concurrency` at a time, until the scope
 * closes. A URL whose previous read has not ended (or not started) is not queued again in that
 * tick, so a hanging engine holds at most one reader, for at most the timeout. Reads run in
 * `concurrency` reader fibers of their own; the tick never waits on them and the state is read
 * without waiting.
 */
export const make = (
  sources: Effect.Effect<ReadonlyArray<EngineMetricsSource>>,
  options: EngineMetricsPollerOptions = {}
): Effect.Effect<EngineMetricsPoller, never, Scope.Scope | HttpClient.HttpClient> =>
  Effect.gen(function* () {
    const interval = Duration.decode(options.interval ?? DEFAULT_POLL_INTERVAL)
    const concurrency = Math.max(1, Math.floor(options.concurrency ?? DEFAULT_READ_CONCURRENCY))
    const readOptions: ReadOptions = { timeout: options.timeout, maxBodyBytes: options.maxBodyBytes }
    const httpClient = yield* HttpClient.HttpClient
    // URLs due for a read, taken by `concurrency` reader fibers. A semaphore with a waiter per
    // URL woke every waiter at each release: reads cost the square of the sources waiting.
    const due = yield* Queue.unbounded<string>()
    // Each read's outcome is written into `states` in place (a read touches only its URL's
    // ranks); readers get an immutable copy, made at most once per change. Copying the whole map
    // at every read made a tick cost the square of the number of sources.
    const states = new Map<string, SourceReadState>()
    let copy: ReadonlyMap<string, SourceReadState> | undefined
    const snapshot = (): ReadonlyMap<string, SourceReadState> => {
      copy ??= new Map(states)
      return copy
    }
    // Counts changes for `changes`; the copy is dropped at each one.
    const versions = yield* SubscriptionRef.make(0)
    const published = Effect.suspend(() => {
      copy = undefined
      return SubscriptionRef.update(versions, (n) => n + 1)
    })
    const inFlight = new Set<string>()

    /** The sources on each URL, as the latest tick saw them. */
    let onUrls: ReadonlyMap<string, ReadonlyArray<EngineMetricsSource>> = new Map()

    const record = (url: string, outcome: Either.Either<EngineMetricsPage, EngineMetricsError>) =>
      Effect.gen(function* () {
        const atMs = yield* Clock.currentTimeMillis
        const onUrl = onUrls.get(url) ?? []
        const results: Array<string> = []
        // Logged once per change of a source's condition, not once per read.
        const changed: Array<{
          readonly source: EngineMetricsSource
          readonly error?: string
          readonly reason?: string
        }> = []
        for (const source of onUrl) {
          const key = sourceKey(source)
          const previous = states.get(key) ?? { metricsUrl: source.metricsUrl, dpRank: source.dpRank }
          const load = Either.isRight(outcome)
            ? loadForRank(outcome.right, source.dpRank, onUrl.length)
            : Either.left(outcome.left.message)
          if (Either.isRight(load)) {
            states.set(key, {
              metricsUrl: source.metricsUrl,
              dpRank: source.dpRank,
              lastSuccess: { atMs, load: load.right },
              lastAttemptMs: atMs
            })
            results.push("ok")
            if (previous.lastError !== undefined) changed.push({ source })
          } else {
            const reason = Either.isLeft(outcome) ? outcome.left.reason : "no-load"
            states.set(key, {
              ...previous,
              lastAttemptMs: atMs,
              lastError: { atMs, reason, message: load.left }
            })
            results.push(reason)
            if (previous.lastError?.reason !== reason) changed.push({ source, reason, error: load.left })
          }
        }
        if (onUrl.length > 0) yield* published
        for (const result of results) yield* Metric.increment(Metric.tagged(readsTotal, "result", result))
        for (const { source, reason, error } of changed) {
          const annotated = Effect.annotateLogs({ metricsUrl: source.metricsUrl, dpRank: source.dpRank })
          yield* reason === undefined
            ? Effect.logInfo("engine metrics readable again").pipe(annotated)
            : Effect.logWarning(
                "engine metrics unreadable; the rank's load is unknown once its last read is 3 s old"
              ).pipe(Effect.annotateLogs({ reason, error: error ?? "" }), annotated)
        }
      })

    const readUrl = (url: string) =>
      readEngineMetrics(url, readOptions).pipe(
        Effect.either,
        Effect.flatMap((outcome) => record(url, outcome)),
        // A defect in one read is that read's loss, never the poller's.
        Effect.catchAllDefect((defect) =>
          record(
            url,
            Either.left(
              new EngineMetricsError({ reason: "parse", url, message: `read failed: ${causeText(defect)}` })
            )
          )
        ),
        Effect.ensuring(Effect.sync(() => inFlight.delete(url))),
        Effect.provideService(HttpClient.HttpClient, httpClient)
      )

    const tick = Effect.gen(function* () {
      const now = yield* sources
      const byUrl = new Map<string, Array<EngineMetricsSource>>()
      const keys = new Set<string>()
      let sourcesChanged = false
      for (const source of now) {
        const key = sourceKey(source)
        keys.add(key)
        const onUrl = byUrl.get(source.metricsUrl)
        if (onUrl === undefined) byUrl.set(source.metricsUrl, [source])
        else onUrl.push(source)
        if (!states.has(key)) {
          states.set(key, { metricsUrl: source.metricsUrl, dpRank: source.dpRank })
          sourcesChanged = true
        }
      }
      onUrls = byUrl
      if (states.size !== keys.size) {
        for (const key of states.keys()) if (!keys.has(key)) states.delete(key)
        sourcesChanged = true
      }
      if (sourcesChanged) yield* published
      for (const url of byUrl.keys()) {
        if (inFlight.has(url)) continue
        inFlight.add(url)
        yield* Queue.offer(due, url)
      }
    })

    for (let reader = 0; reader < concurrency; reader++) {
      yield* Queue.take(due).pipe(
        Effect.flatMap(readUrl),
        Effect.forever,
        (loop) => supervised("relay.engine-metrics.reader", loop),
        Effect.forkScoped
      )
    }

    yield* tick.pipe(
      Effect.zipRight(Effect.sleep(interval)),
      Effect.forever,
      (loop) => supervised("relay.engine-metrics", loop),
      Effect.withSpan("EngineMetrics.poller"),
      Effect.forkScoped
    )

    return {
      states: Effect.sync(snapshot),
      changes: Stream.map(versions.changes, snapshot),
      latest: (source) => Effect.sync(() => states.get(sourceKey(source))?.lastSuccess)
    }
  })
