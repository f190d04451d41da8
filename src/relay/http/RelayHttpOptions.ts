/**
 * The relay HTTP server's settings and their defaults (PROTOCOL.md §5, the `kvrelay relay` flags).
 */

import { Duration } from "effect"
import type * as BearerAuth from "../../http/BearerAuth.js"
import { DEFAULT_MAX_REQUEST_BODY_BYTES } from "../../http/ErrorText.js"
import type { ServerTlsOptions } from "../../http/Tls.js"
import type * as LoadWindows from "../LoadWindows.js"
import type * as Topology from "../Topology.js"

/** How many watchers and bodies the relay's server takes at once. */
export interface RelayHttpLimits {
  /** Catalog watchers at once (default 64). Pool streams are limited by the publication source. */
  readonly maxCatalogWatchers: number
  readonly maxReadinessWatchers: number
  readonly maxLoadWatchers: number
  /**
   * The query routes' body limit (`--max-request-body-bytes`, default 16 MiB, PROTOCOL §7 ◆3):
   * the limit the worker-level query routes of §5.1 read their bodies with (`readBody` without a
   * route). Larger bodies get 413 `BODY_TOO_LARGE` naming the flag.
   */
  readonly maxRequestBodyBytes: number
  /**
   * The fixed limit of the small control bodies (`POST /v1/pools/subscribe`, default 64 KiB):
   * no flag, the same 413 shape.
   */
  readonly maxControlBodyBytes: number
}

/** How often the relay's streams send heartbeats and re-sends. */
export interface RelayHttpIntervals {
  /** Pool-stream heartbeat after this long without a frame, once the snapshot was sent (10 s). */
  readonly poolHeartbeat: Duration.DurationInput
  /** Readiness watch re-sends the current snapshot this often (10 s). */
  readonly readinessResend: Duration.DurationInput
  /** Catalog watch `: heartbeat` comment this often (10 s). */
  readonly watchHeartbeat: Duration.DurationInput
  /** Load windows (1 s). */
  readonly loadWindow: Duration.DurationInput
  /** A streamed element not written for this long ends the connection (60 s). */
  readonly writeStallTimeout: Duration.DurationInput
  /** On shutdown, streams get this long to end before connections are closed (5 s). */
  readonly shutdownGrace: Duration.DurationInput
}

/** The relay's HTTP server settings. */
export interface RelayHttpOptions {
  /** Default `127.0.0.1`. */
  readonly host?: string | undefined
  /** Default 8080; 0 picks a free port (see the bound address). */
  readonly port?: number | undefined
  readonly limits?: Partial<RelayHttpLimits> | undefined
  readonly intervals?: Partial<RelayHttpIntervals> | undefined
  /** Load windows buffered per load watcher (default 16). */
  readonly loadFanoutCapacity?: number | undefined
  /** A topology publisher to serve; by default one is started over the relay's refs. */
  readonly topology?: Topology.TopologyPublisher | undefined
  /** A load window publisher to serve; by default one is started over the relay's `loadRef`. */
  readonly loadWindows?: LoadWindows.LoadWindows | undefined
  /** Serve HTTPS with this material (`Tls.loadServerTls`); mutual TLS when it has a client CA. */
  readonly tls?: ServerTlsOptions | undefined
  /** Require a bearer token of this file on every route but `GET /healthz`. */
  readonly auth?: BearerAuth.TokenFile | undefined
}

/** The address the relay listens on by default. */
export const DEFAULT_RELAY_HTTP_HOST = "127.0.0.1"

/** The port the relay listens on by default. */
export const DEFAULT_RELAY_HTTP_PORT = 8080

/** The limits used when none are given. */
export const DEFAULT_RELAY_HTTP_LIMITS: RelayHttpLimits = {
  maxCatalogWatchers: 64,
  maxReadinessWatchers: 64,
  maxLoadWatchers: 64,
  maxRequestBodyBytes: DEFAULT_MAX_REQUEST_BODY_BYTES,
  maxControlBodyBytes: 64 * 1024
}

/** The intervals used when none are given. */
export const DEFAULT_RELAY_HTTP_INTERVALS: RelayHttpIntervals = {
  poolHeartbeat: Duration.seconds(10),
  readinessResend: Duration.seconds(10),
  watchHeartbeat: Duration.seconds(10),
  loadWindow: Duration.seconds(1),
  writeStallTimeout: Duration.seconds(60),
  shutdownGrace: Duration.seconds(5)
}

/** Where the server listens. */
export interface RelayHttpAddress {
  readonly host: string
  readonly port: number
  /** `http://host:port` (`https://` with TLS), as printed in the CLI's `listening` line. */
  readonly url: string
}
