/**
 * OpenTelemetry tracing: spans created with `Effect.withSpan` are exported over OTLP/HTTP (JSON
 * encoding) when an endpoint is configured (`--otlp URL` or `OTEL_EXPORTER_OTLP_ENDPOINT`), and
 * are no-ops otherwise.
 */

import * as OtlpSerialization from "@effect/opentelemetry/OtlpSerialization"
import * as OtlpTracer from "@effect/opentelemetry/OtlpTracer"
import * as FetchHttpClient from "@effect/platform/FetchHttpClient"
import { Layer } from "effect"

interface TracingOptions {
  /** OTLP/HTTP base URL (`http://collector:4318`) or the full traces URL (`…/v1/traces`). */
  readonly endpoint: string | undefined
  readonly serviceName: string
  readonly serviceVersion?: string
  readonly attributes?: Record<string, unknown>
}

/** The traces URL of an OTLP/HTTP endpoint given as a base URL or as the traces URL itself. */
export const tracesUrl = (endpoint: string): string => {
  const trimmed = endpoint.replace(/\/+$/, "")
  return trimmed.endsWith("/v1/traces") ? trimmed : `${trimmed}/v1/traces`
}

/** OTLP tracing to `options.endpoint`, or no tracing without one. */
export const tracingLayer = (options: TracingOptions): Layer.Layer<never> =>
  options.endpoint === undefined || options.endpoint === ""
    ? Layer.empty
    : OtlpTracer.layer({
        url: tracesUrl(options.endpoint),
        resource: {
          serviceName: options.serviceName,
          serviceVersion: options.serviceVersion,
          attributes: options.attributes ?? {}
        },
        exportInterval: "1 second"
      }).pipe(Layer.provide(OtlpSerialization.layerJson), Layer.provide(FetchHttpClient.layer))
