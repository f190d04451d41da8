/**
 * What every long-running command shares: structured logs on stderr at the chosen level, OTLP
 * tracing when an endpoint is configured, and the `listening` line on stdout.
 */

import { Effect, Layer, Logger, LogLevel } from "effect"
import { tracingLayer } from "../observability/Tracing.js"

export type LogLevelName = "trace" | "debug" | "info" | "warning" | "error" | "fatal" | "none"

const levels: Record<LogLevelName, LogLevel.LogLevel> = {
  trace: LogLevel.Trace,
  debug: LogLevel.Debug,
  info: LogLevel.Info,
  warning: LogLevel.Warning,
  error: LogLevel.Error,
  fatal: LogLevel.Fatal,
  none: LogLevel.None
}

/** logfmt lines on stderr (stdout carries only the `listening` line and the demo's summary). */
export const loggingLayer = (level: LogLevelName): Layer.Layer<never> =>
  Layer.mergeAll(
    Logger.replace(Logger.defaultLogger, Logger.withConsoleError(Logger.logfmtLogger)),
    Logger.minimumLogLevel(levels[level])
  )

export const observabilityLayer = (options: {
  readonly logLevel: LogLevelName
  readonly otlp: string | undefined
  readonly env: Readonly<Record<string, string | undefined>>
  readonly defaultServiceName: string
  readonly attributes?: Record<string, unknown>
}): Layer.Layer<never> =>
  Layer.mergeAll(
    loggingLayer(options.logLevel),
    tracingLayer({
      endpoint: options.otlp ?? options.env["OTEL_EXPORTER_OTLP_ENDPOINT"],
      serviceName: options.env["OTEL_SERVICE_NAME"] ?? options.defaultServiceName,
      serviceVersion: "0.1.0",
      ...(options.attributes === undefined ? {} : { attributes: options.attributes })
    })
  )

/** The readiness line of PROTOCOL §1: one JSON line on stdout once the HTTP server listens. */
export const printListening = (url: string): Effect.Effect<void> =>
  Effect.sync(() => {
    process.stdout.write(`${JSON.stringify({ event: "listening", url })}\n`)
  })
