/**
 * What every long-running command shares: structured logs on stderr at the chosen level, OTLP
 * tracing when an endpoint is configured, and the `listening` line on stdout.
 */

import { Cause, Data, Effect, Layer, Logger, LogLevel } from "effect"
import * as FiberFailures from "../observability/FiberFailures.js"
import { tracingLayer } from "../observability/Tracing.js"

type LogLevelName = "trace" | "debug" | "info" | "warning" | "error" | "fatal" | "none"

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
const loggingLayer = (level: LogLevelName): Layer.Layer<never> =>
  Layer.mergeAll(
    Logger.replace(Logger.defaultLogger, Logger.withConsoleError(Logger.logfmtLogger)),
    Logger.minimumLogLevel(levels[level])
  )

const observabilityLayer = (options: {
  readonly logLevel: LogLevelName
  readonly otlp: string | undefined
  readonly env: Readonly<Record<string, string | undefined>>
  readonly defaultServiceName: string
  readonly attributes?: Record<string, unknown>
}): Layer.Layer<never> =>
  Layer.mergeAll(
    loggingLayer(options.logLevel),
    // Every fiber of the command counts towards `effect_fiber_failures_total` on `/metrics`.
    FiberFailures.layer(),
    tracingLayer({
      endpoint: options.otlp ?? options.env["OTEL_EXPORTER_OTLP_ENDPOINT"],
      serviceName: options.env["OTEL_SERVICE_NAME"] ?? options.defaultServiceName,
      serviceVersion: "0.1.0",
      ...(options.attributes === undefined ? {} : { attributes: options.attributes })
    })
  )

/** `observabilityLayer` for a command: its `--log-level` and `--otlp`, the process's environment. */
export const commandObservability = (
  settings: { readonly logLevel: LogLevelName; readonly otlp?: string | undefined },
  defaultServiceName: string,
  attributes?: Record<string, unknown>
): Layer.Layer<never> =>
  observabilityLayer({
    logLevel: settings.logLevel,
    otlp: settings.otlp,
    env: process.env,
    defaultServiceName,
    ...(attributes === undefined ? {} : { attributes })
  })

/** The readiness line of PROTOCOL §1: one JSON line on stdout once the HTTP server listens. */
export const printListening = (url: string): Effect.Effect<void> =>
  Effect.sync(() => {
    process.stdout.write(`${JSON.stringify({ event: "listening", url })}\n`)
  })

/**
 * A startup failure caused by a setting's value: a discovery file that cannot be read or is
 * invalid, an HTTP address that cannot be bound. Reported like an invalid setting (one line
 * naming the flag); `status` 2 for configuration, 1 for an outage (an unreachable etcd).
 */
export class StartupProblem extends Data.TaggedError("StartupProblem")<{
  readonly flag: string
  readonly reason: string
  readonly status: 1 | 2
}> {
  override get message(): string {
    return `${this.flag}: ${this.reason}`
  }
}

/** Why a bind failed, from the Node error under the platform's ServeError. */
export const bindFailure = (cause: unknown): string => {
  const error = cause as { readonly code?: unknown; readonly message?: unknown } | undefined
  if (error?.code === "EADDRINUSE") return "the address is already in use"
  if (error?.code === "EACCES") return "permission denied for this address"
  if (error?.code === "EADDRNOTAVAIL") return "the address is not available on this host"
  return typeof error?.message === "string" ? error.message : String(cause)
}

/**
 * Runs a long-lived command until it ends or SIGINT/SIGTERM interrupts it. A StartupProblem is
 * printed as `kvrelay COMMAND: --flag: reason` and sets its exit status; any other failure is
 * logged and exits 1.
 */
export const runCommand = (command: string, program: Effect.Effect<unknown, unknown>): void => {
  let status: number | undefined
  const reported = program.pipe(
    Effect.catchIf(
      (error): error is StartupProblem => error instanceof StartupProblem,
      (problem) =>
        Effect.sync(() => {
          process.stderr.write(`kvrelay ${command}: ${problem.message}\n`)
          status = problem.status
        })
    )
  )
  // Imported lazily: the bench command never starts a service runtime.
  void import("@effect/platform-node/NodeRuntime").then(({ runMain }) =>
    runMain(reported, {
      disablePrettyLogger: true,
      teardown: (exit, onExit) =>
        onExit(status ?? (exit._tag === "Failure" && !Cause.isInterruptedOnly(exit.cause) ? 1 : 0))
    })
  )
}
