import { describe, expect, it } from "@effect/vitest"
import { Effect, Metric } from "effect"
import { Counter } from "prom-client"
import { FiberFailureCounter } from "../../src/observability/FiberFailures.js"
import * as Prometheus from "../../src/observability/Prometheus.js"
import { VERSION } from "../../src/version.js"
import { familyOf, namingProblems, PROCESS_FAMILIES, parseExposition, sampleValue } from "./exposition.js"

describe("Prometheus exposition (prom-client)", () => {
  it.scoped("exposes Effect metrics of its prefixes with Prometheus types and names", () =>
    Effect.gen(function* () {
      const exposition = yield* Prometheus.make({ effectMetricPrefixes: ["test_prom_"] })
      const events = Metric.counter("test_prom_events_total", {
        description: "events seen",
        incremental: true
      })
      const unsuffixed = Metric.counter("test_prom_frames", { description: "frames seen", incremental: true })
      const level = Metric.counter("test_prom_level", { description: "goes both ways" })
      const depth = Metric.gauge("test_prom_depth", { description: "queue depth" })
      const other = Metric.counter("test_other_events_total", { incremental: true })
      yield* Metric.incrementBy(Metric.tagged(events, "stream", "pool"), 3)
      yield* Metric.incrementBy(unsuffixed, 2)
      yield* Metric.incrementBy(level, -4)
      yield* Metric.set(Metric.tagged(depth, "endpoint", 'a"b'), 5)
      yield* Metric.increment(other)

      const families = parseExposition(yield* exposition.text)
      expect(namingProblems(families)).toEqual([])
      expect(familyOf(families, "test_prom_events_total")).toMatchObject({
        type: "COUNTER",
        help: "events seen"
      })
      expect(sampleValue(families, "test_prom_events_total", { stream: "pool" })).toBe(3)
      // A counter named without `_total` is exposed with it.
      expect(familyOf(families, "test_prom_frames")).toBeUndefined()
      expect(sampleValue(families, "test_prom_frames_total")).toBe(2)
      // A counter that may go down is a gauge.
      expect(familyOf(families, "test_prom_level")?.type).toBe("GAUGE")
      expect(sampleValue(families, "test_prom_level")).toBe(-4)
      expect(sampleValue(families, "test_prom_depth", { endpoint: 'a"b' })).toBe(5)
      expect(familyOf(families, "test_other_events_total")).toBeUndefined()

      // Read at each scrape: later updates and new label keys show.
      yield* Metric.incrementBy(Metric.tagged(events, "stream", "pool"), 4)
      yield* Metric.increment(Metric.tagged(Metric.tagged(events, "stream", "load"), "scope", "total"))
      const later = parseExposition(yield* exposition.text)
      expect(sampleValue(later, "test_prom_events_total", { stream: "pool" })).toBe(7)
      expect(sampleValue(later, "test_prom_events_total", { stream: "load", scope: "total" })).toBe(1)
    })
  )

  it.scoped("has the process and runtime metrics, build info and fiber failures", () =>
    Effect.gen(function* () {
      const failures = new FiberFailureCounter()
      const exposition = yield* Prometheus.make({ effectMetricPrefixes: [], fiberFailures: failures })
      const families = parseExposition(yield* exposition.text)
      for (const [name, type] of PROCESS_FAMILIES) expect(familyOf(families, name)?.type, name).toBe(type)
      expect(familyOf(families, "nodejs_eventloop_lag_p99_seconds")?.type).toBe("GAUGE")
      expect(sampleValue(families, "kvrelay_build_info", { version: VERSION })).toBe(1)
      expect(sampleValue(families, "effect_fiber_failures_total")).toBe(0)
      expect(sampleValue(families, "process_cpu_seconds_total")).toBeGreaterThan(0)
      expect(sampleValue(families, "nodejs_heap_size_used_bytes")).toBeGreaterThan(0)
      expect(namingProblems(families)).toEqual([])
      expect(exposition.contentType).toBe("text/plain; version=0.0.4; charset=utf-8")
    })
  )

  it.scoped("a server's own collect callbacks run at each scrape", () =>
    Effect.gen(function* () {
      const exposition = yield* Prometheus.make({ effectMetricPrefixes: [] })
      let seen = 0
      new Counter({
        name: "test_prom_seen_total",
        help: "read at scrape time",
        registers: [exposition.registry],
        collect(this: Counter<string>) {
          this.reset()
          this.inc(seen)
        }
      })
      seen = 5
      expect(sampleValue(parseExposition(yield* exposition.text), "test_prom_seen_total")).toBe(5)
      seen = 8
      expect(sampleValue(parseExposition(yield* exposition.text), "test_prom_seen_total")).toBe(8)
    })
  )

  it.scoped("a collect callback that throws is a typed error, and the next scrape works", () =>
    Effect.gen(function* () {
      const exposition = yield* Prometheus.make({ effectMetricPrefixes: [] })
      let broken = true
      new Counter({
        name: "test_prom_fragile_total",
        help: "throws while broken",
        registers: [exposition.registry],
        collect() {
          if (broken) throw new Error("state unavailable")
        }
      })
      const failed = yield* Effect.flip(exposition.text)
      expect(failed._tag).toBe("MetricsRenderError")
      expect(failed.message).toContain("state unavailable")
      broken = false
      expect(sampleValue(parseExposition(yield* exposition.text), "test_prom_fragile_total")).toBe(0)
    })
  )
})
