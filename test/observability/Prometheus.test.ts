import { Effect, Metric, MetricBoundaries } from "effect"
import { describe, expect, it } from "vitest"
import { prometheusText } from "../../src/observability/Prometheus.js"

describe("Prometheus exposition", () => {
  it("renders counters, gauges and histograms with labels", async () => {
    const counter = Metric.counter("test_prom_events_total", { description: "events seen" })
    const gauge = Metric.gauge("test_prom_depth")
    const histogram = Metric.histogram("test_prom_latency_seconds", MetricBoundaries.fromIterable([0.1, 1]))
    const text = await Effect.runPromise(
      Effect.gen(function* () {
        yield* Metric.incrementBy(Metric.tagged(counter, "stream", "pool"), 3)
        yield* Metric.set(Metric.tagged(gauge, "endpoint", 'a"b'), 5)
        yield* Metric.update(histogram, 0.5)
        return yield* prometheusText
      })
    )
    expect(text).toContain("# HELP test_prom_events_total events seen")
    expect(text).toContain("# TYPE test_prom_events_total counter")
    expect(text).toContain('test_prom_events_total{stream="pool"} 3')
    expect(text).toContain('test_prom_depth{endpoint="a\\"b"} 5')
    expect(text).toContain("# TYPE test_prom_latency_seconds histogram")
    expect(text).toContain('test_prom_latency_seconds_bucket{le="0.1"} 0')
    expect(text).toContain('test_prom_latency_seconds_bucket{le="1"} 1')
    expect(text).toContain('test_prom_latency_seconds_bucket{le="+Inf"} 1')
    expect(text).toContain("test_prom_latency_seconds_count 1")
  })
})
