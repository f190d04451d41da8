/**
 * Prometheus exposition through prom-client: one `Registry` per server (one per process in
 * production), holding
 *
 * - prom-client's default `process_*` and `nodejs_*` metrics (CPU, memory, heap, handles, GC,
 *   event-loop lag),
 * - `kvrelay_build_info{version}` = 1,
 * - `effect_fiber_failures_total` (`FiberFailures`),
 * - the Effect `Metric` families whose names start with one of the server's prefixes, read from
 *   Effect's registry at scrape time: an incremental Effect counter is a Prometheus counter
 *   (named with `_total`), a gauge or a non-incremental counter a gauge,
 * - whatever the server registers itself (collect callbacks over its own state).
 *
 * Instrumentation stays on Effect's `Metric` (or plain counters in the owning objects): nothing
 * on a hot path touches prom-client. Effect histograms, summaries and frequencies are not
 * exposed; a distribution that should be scraped is a prom-client `Histogram`.
 */

import { Data, Effect, Metric, type MetricPair, MetricState, type Scope } from "effect"
import { Counter, collectDefaultMetrics, Gauge, Registry } from "prom-client"
import { VERSION } from "../version.js"
import { type FiberFailureCounter, processFiberFailures } from "./FiberFailures.js"

const PROMETHEUS_CONTENT_TYPE: string = Registry.PROMETHEUS_CONTENT_TYPE

/** A collect callback threw while the registry rendered. */
class MetricsRenderError extends Data.TaggedError("MetricsRenderError")<{
  readonly message: string
}> {}

interface PrometheusOptions {
  /** Effect `Metric` families, by name prefix, that this exposition includes. */
  readonly effectMetricPrefixes: ReadonlyArray<string>
  /** Default: the process's counter. */
  readonly fiberFailures?: FiberFailureCounter | undefined
}

/** A server's Prometheus registry and its text exposition. */
export interface PrometheusExposition {
  /** Register the server's own metrics here (`registers: [registry]`). */
  readonly registry: Registry
  readonly contentType: string
  /** The text exposition now. */
  readonly text: Effect.Effect<string, MetricsRenderError>
}

const sanitizeName = (name: string): string => name.replace(/[^a-zA-Z0-9_:]/g, "_")
const sanitizeLabel = (name: string): string => {
  const clean = name.replace(/[^a-zA-Z0-9_]/g, "_")
  return /^[a-zA-Z_]/.test(clean) ? clean : `_${clean}`
}

type Kind = "counter" | "gauge"

interface Series {
  readonly labels: Record<string, string>
  readonly value: number
}

interface Family {
  readonly kind: Kind
  readonly labelNames: ReadonlySet<string>
  readonly metric: Counter<string> | Gauge<string>
}

const numberOf = (value: number | bigint): number => (typeof value === "bigint" ? Number(value) : value)

/**
 * Effect's metric registry as prom-client families. `update` re-reads the snapshot and makes a
 * family for each new name (again when its label set grows); each family's collect callback
 * copies the snapshot's series, so a series Effect no longer reports disappears.
 */
class EffectMetricsBridge {
  private series = new Map<string, Array<Series>>()
  private readonly families = new Map<string, Family>()

  constructor(
    private readonly registry: Registry,
    private readonly prefixes: ReadonlyArray<string>
  ) {}

  update(pairs: ReadonlyArray<MetricPair.MetricPair.Untyped>): void {
    const next = new Map<string, Array<Series>>()
    const shapes = new Map<string, { kind: Kind; help: string; labelNames: Set<string> }>()
    for (const pair of pairs) {
      const key = pair.metricKey
      const base = sanitizeName(key.name)
      if (!this.prefixes.some((prefix) => base.startsWith(prefix))) continue
      const state = pair.metricState
      let kind: Kind
      let value: number
      if (MetricState.isCounterState(state)) {
        // Effect's counter key type says whether the counter only goes up.
        const incremental = (key.keyType as { readonly incremental?: boolean }).incremental === true
        kind = incremental ? "counter" : "gauge"
        value = numberOf(state.count)
      } else if (MetricState.isGaugeState(state)) {
        kind = "gauge"
        value = numberOf(state.value)
      } else {
        continue
      }
      const name = kind === "counter" && !base.endsWith("_total") ? `${base}_total` : base
      // prom-client writes labels in the object's order; sorted, a series always reads the same.
      const labels: Record<string, string> = {}
      for (const tag of [...key.tags].sort((a, b) => (a.key < b.key ? -1 : a.key > b.key ? 1 : 0)))
        labels[sanitizeLabel(tag.key)] = tag.value
      let shape = shapes.get(name)
      if (shape === undefined) {
        shape = {
          kind,
          help: key.description._tag === "Some" ? key.description.value : name,
          labelNames: new Set()
        }
        shapes.set(name, shape)
      }
      if (shape.kind !== kind) continue
      for (const label of Object.keys(labels)) shape.labelNames.add(label)
      let list = next.get(name)
      if (list === undefined) {
        list = []
        next.set(name, list)
      }
      // A counter can only be exposed going up from zero; an Effect counter never goes below.
      list.push({ labels, value: kind === "counter" ? Math.max(0, value) : value })
    }
    this.series = next
    for (const [name, shape] of shapes) {
      const family = this.families.get(name)
      if (
        family !== undefined &&
        family.kind === shape.kind &&
        [...shape.labelNames].every((label) => family.labelNames.has(label))
      )
        continue
      if (family !== undefined) this.registry.removeSingleMetric(name)
      // Names the server or prom-client own are theirs.
      else if (this.registry.getSingleMetric(name) !== undefined) continue
      this.families.set(name, this.makeFamily(name, shape.kind, shape.help, shape.labelNames))
    }
  }

  private makeFamily(name: string, kind: Kind, help: string, labelNames: ReadonlySet<string>): Family {
    const bridge = this
    const names = [...labelNames]
    const metric =
      kind === "counter"
        ? new Counter({
            name,
            help,
            labelNames: names,
            registers: [this.registry],
            collect(this: Counter<string>) {
              this.reset()
              for (const s of bridge.series.get(name) ?? []) this.inc(s.labels, s.value)
            }
          })
        : new Gauge({
            name,
            help,
            labelNames: names,
            registers: [this.registry],
            collect(this: Gauge<string>) {
              this.reset()
              for (const s of bridge.series.get(name) ?? []) this.set(s.labels, s.value)
            }
          })
    return { kind, labelNames, metric }
  }
}

/** A registry with the process metrics, build info and fiber failures; cleared with the scope. */
export const make = (options: PrometheusOptions): Effect.Effect<PrometheusExposition, never, Scope.Scope> =>
  Effect.gen(function* () {
    const registry = new Registry()
    collectDefaultMetrics({ register: registry })
    new Gauge({
      name: "kvrelay_build_info",
      help: "kvrelay build: always 1, labelled with the package version",
      labelNames: ["version"],
      registers: [registry]
    }).set({ version: VERSION }, 1)
    const failures = options.fiberFailures ?? processFiberFailures
    new Counter({
      name: "effect_fiber_failures_total",
      help: "Effect fibers that ended with a typed failure or a defect (interruptions are not failures)",
      registers: [registry],
      collect(this: Counter<string>) {
        this.reset()
        this.inc(failures.current())
      }
    })
    const bridge = new EffectMetricsBridge(registry, options.effectMetricPrefixes)
    yield* Effect.addFinalizer(() => Effect.sync(() => registry.clear()))
    const text = Effect.flatMap(Metric.snapshot, (pairs) =>
      Effect.tryPromise({
        try: () => {
          bridge.update(pairs)
          return registry.metrics()
        },
        catch: (cause) =>
          new MetricsRenderError({ message: cause instanceof Error ? cause.message : String(cause) })
      })
    )
    return { registry, contentType: PROMETHEUS_CONTENT_TYPE, text }
  })
