/**
 * The Prometheus text exposition read back with an independent parser
 * (`parse-prometheus-text-format`, a port of the Python client's parser), and the naming rules
 * every exposition of kvrelay keeps.
 */

import parsePrometheusTextFormat, { type ParsedFamily } from "parse-prometheus-text-format"

export type { ParsedFamily }

export const parseExposition = (text: string): ReadonlyArray<ParsedFamily> => parsePrometheusTextFormat(text)

export const familyOf = (families: ReadonlyArray<ParsedFamily>, name: string): ParsedFamily | undefined =>
  families.find((family) => family.name === name)

/** The value of the series of `name` whose labels include `labels`; undefined when there is none. */
export const sampleValue = (
  families: ReadonlyArray<ParsedFamily>,
  name: string,
  labels: Readonly<Record<string, string>> = {}
): number | undefined => {
  const sample = familyOf(families, name)?.metrics.find((m) =>
    Object.entries(labels).every(([key, value]) => m.labels?.[key] === value)
  )
  return sample?.value === undefined ? undefined : Number(sample.value)
}

/**
 * prom-client's default levels named `_total` (current handles, requests and resources): the
 * names Node dashboards know, kept as they are.
 */
export const PROM_CLIENT_TOTAL_GAUGES: ReadonlySet<string> = new Set([
  "nodejs_active_handles_total",
  "nodejs_active_requests_total",
  "nodejs_active_resources_total"
])

/** Every counter is named `…_total`, and every `…_total` family is a counter. */
export const namingProblems = (families: ReadonlyArray<ParsedFamily>): ReadonlyArray<string> => {
  const problems: Array<string> = []
  for (const family of families) {
    if (family.type === "COUNTER" && !family.name.endsWith("_total"))
      problems.push(`counter ${family.name} does not end in _total`)
    if (
      family.name.endsWith("_total") &&
      family.type !== "COUNTER" &&
      !PROM_CLIENT_TOTAL_GAUGES.has(family.name)
    )
      problems.push(`${family.name} is typed ${family.type}, not counter`)
    if (family.type === "UNTYPED") problems.push(`${family.name} has no type`)
  }
  return problems
}

/** The families every kvrelay server exposes besides its own. */
export const PROCESS_FAMILIES: ReadonlyArray<readonly [string, ParsedFamily["type"]]> = [
  ["process_cpu_seconds_total", "COUNTER"],
  ["process_resident_memory_bytes", "GAUGE"],
  ["nodejs_heap_size_used_bytes", "GAUGE"],
  ["nodejs_eventloop_lag_seconds", "GAUGE"],
  ["kvrelay_build_info", "GAUGE"],
  ["effect_fiber_failures_total", "COUNTER"]
]
