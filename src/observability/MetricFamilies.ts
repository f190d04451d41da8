/**
 * How every Effect `Metric` family the servers expose is declared: a counter that Prometheus
 * sees as a counter (`incremental`, named `…_total`) or a gauge, each with its help text.
 *
 * Modules that update one series declare it with the same name and description; the options are
 * spelled here once, so every declaration of a family produces the same metric key and all of
 * them feed one series.
 */

import { Metric } from "effect"

/** A monotonic Effect counter, exposed as a Prometheus counter (`Prometheus.make`). */
export const counterFamily = (name: string, description: string): Metric.Metric.Counter<number> =>
  Metric.counter(name, { description, incremental: true })

/** An Effect gauge, exposed as a Prometheus gauge. */
export const gaugeFamily = (name: string, description: string): Metric.Metric.Gauge<number> =>
  Metric.gauge(name, { description })
