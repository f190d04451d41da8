/**
 * Prometheus text exposition (format 0.0.4) of every metric registered through Effect's `Metric`
 * module. Instrumentation uses `Metric.counter` / `Metric.gauge` / `Metric.histogram` with tags;
 * tags become labels.
 */

import { Effect, Metric, type MetricPair, MetricState } from "effect"

const escapeLabel = (value: string): string =>
  value.replace(/\\/g, "\\\\").replace(/\n/g, "\\n").replace(/"/g, '\\"')
const escapeHelp = (value: string): string => value.replace(/\\/g, "\\\\").replace(/\n/g, "\\n")

const sanitizeName = (name: string): string => name.replace(/[^a-zA-Z0-9_:]/g, "_")

const formatValue = (value: number | bigint): string => {
  if (typeof value === "bigint") return value.toString()
  if (Number.isNaN(value)) return "NaN"
  if (value === Number.POSITIVE_INFINITY) return "+Inf"
  if (value === Number.NEGATIVE_INFINITY) return "-Inf"
  return String(value)
}

const labels = (
  tags: ReadonlyArray<{ readonly key: string; readonly value: string }>,
  extra?: string
): string => {
  const parts = [...tags]
    .sort((a, b) => (a.key < b.key ? -1 : a.key > b.key ? 1 : 0))
    .map((t) => `${sanitizeName(t.key)}="${escapeLabel(t.value)}"`)
  if (extra !== undefined) parts.push(extra)
  return parts.length === 0 ? "" : `{${parts.join(",")}}`
}

interface Family {
  readonly type: "counter" | "gauge" | "histogram" | "untyped"
  readonly help: string | undefined
  readonly lines: Array<string>
}

/** Renders metric pairs as Prometheus text, one family per metric name, families sorted by name. */
export const renderPrometheus = (pairs: ReadonlyArray<MetricPair.MetricPair.Untyped>): string => {
  const families = new Map<string, Family>()
  const family = (name: string, type: Family["type"], help: string | undefined): Family => {
    let f = families.get(name)
    if (f === undefined) {
      f = { type, help, lines: [] }
      families.set(name, f)
    }
    return f
  }
  for (const pair of pairs) {
    const key = pair.metricKey
    const name = sanitizeName(key.name)
    const help = key.description._tag === "Some" ? key.description.value : undefined
    const state = pair.metricState
    if (MetricState.isCounterState(state)) {
      family(name, "counter", help).lines.push(`${name}${labels(key.tags)} ${formatValue(state.count)}`)
    } else if (MetricState.isGaugeState(state)) {
      family(name, "gauge", help).lines.push(`${name}${labels(key.tags)} ${formatValue(state.value)}`)
    } else if (MetricState.isHistogramState(state)) {
      const f = family(name, "histogram", help)
      for (const [bound, count] of state.buckets) {
        const le = bound === Number.POSITIVE_INFINITY ? "+Inf" : String(bound)
        f.lines.push(`${name}_bucket${labels(key.tags, `le="${le}"`)} ${count}`)
      }
      if (!state.buckets.some(([bound]) => bound === Number.POSITIVE_INFINITY)) {
        f.lines.push(`${name}_bucket${labels(key.tags, `le="+Inf"`)} ${state.count}`)
      }
      f.lines.push(`${name}_sum${labels(key.tags)} ${formatValue(state.sum)}`)
      f.lines.push(`${name}_count${labels(key.tags)} ${state.count}`)
    }
  }
  const out: Array<string> = []
  for (const name of [...families.keys()].sort()) {
    const f = families.get(name)!
    if (f.help !== undefined) out.push(`# HELP ${name} ${escapeHelp(f.help)}`)
    out.push(`# TYPE ${name} ${f.type}`)
    out.push(...f.lines.sort())
  }
  return out.length === 0 ? "" : `${out.join("\n")}\n`
}

/** The current registry as Prometheus text. */
export const prometheusText: Effect.Effect<string> = Effect.map(Metric.snapshot, renderPrometheus)
