/**
 * The reasons the relay drops KV event input, shared by the transports that detect them and the
 * diagnostics that count them (`/v1/stats`, `kv_dc_relay_ingest_*_total{reason}`).
 */

/** Why a message was dropped; counted per source (or per subscription when unattributable). */
export type MalformedReason =
  | "frame-count"
  | "publisher-id-width"
  | "sequence-width"
  | "sequence-range"
  | "frame-header"
  | "frame-version"
  | "frame-length"
  | "envelope"
  | "payload"
  | "topic"
  | "sequence-jump"
  | "hash"
  | "block-size"
  | "token-ids"
  | "token-count"
  | "lora"
  | "field-type"

export const MALFORMED_REASONS: ReadonlyArray<MalformedReason> = [
  "frame-count",
  "publisher-id-width",
  "sequence-width",
  "sequence-range",
  "frame-header",
  "frame-version",
  "frame-length",
  "envelope",
  "payload",
  "topic",
  "sequence-jump",
  "hash",
  "block-size",
  "token-ids",
  "token-count",
  "lora",
  "field-type"
]

/** Why an engine event was skipped on purpose (PROTOCOL §3.2): it is not this worker's device cache. */
export type SkipReason = "medium" | "locality" | "ownership" | "group"
export const SKIP_REASONS: ReadonlyArray<SkipReason> = ["medium", "locality", "ownership", "group"]
export type SkipCounts = Readonly<Record<SkipReason, number>>

/**
 * Why a message or batch was dropped whole (`kv_dc_relay_ingest_dropped_batches_total{reason}`):
 * - `stale`: an engine seq below the source's last accepted one (not a restart at 0);
 * - `malformed`: rejected by the decoder (`kv_dc_relay_ingest_malformed_messages_total` says why);
 * - `unknown-publisher`: its publisher id is bound to no active source (a Dynamo envelope from a
 *   publisher discovery does not list, or a source that was just retired);
 * - `foreign-payload`: its events name another worker or rank than the source advertises;
 * - `backwards`: a commit group whose event id is at or below the rank's last admitted one;
 * - `fenced`: it reached a rank that waits for a reset, or a binding that was replaced;
 * - `handler-failed`: the relay failed while handling it (logged with the cause).
 */
export type DropReason =
  | "stale"
  | "malformed"
  | "unknown-publisher"
  | "foreign-payload"
  | "backwards"
  | "fenced"
  | "handler-failed"

export const DROP_REASONS: ReadonlyArray<DropReason> = [
  "stale",
  "malformed",
  "unknown-publisher",
  "foreign-payload",
  "backwards",
  "fenced",
  "handler-failed"
]

/** Why a ZMTP connection to an event publisher was closed (`kv_dc_relay_zmtp_protocol_errors_total{reason}`). */
export type ZmtpErrorReason =
  /** The peer's first 10 bytes are not a ZMTP signature (not a ZeroMQ socket). */
  | "greeting-signature"
  /** A ZMTP major version below 3 (libzmq before 4.0). */
  | "greeting-version"
  /** A security mechanism other than NULL (CURVE, PLAIN, GSSAPI or unknown). */
  | "mechanism"
  /** A READY command that does not parse, or a message or unknown command before it. */
  | "handshake"
  /** The peer's `Socket-Type` is not PUB or XPUB. */
  | "socket-type"
  /** The peer sent an ERROR command. */
  | "peer-error"
  /** No READY within the handshake interval. */
  | "handshake-timeout"
  /** Reserved frame flag bits set, or a command frame with MORE or inside a multipart message. */
  | "frame-flags"
  /** A frame above the subscriber's frame limit. */
  | "frame-size"
  /** A command frame whose body does not hold its own name. */
  | "command"

export const ZMTP_ERROR_REASONS: ReadonlyArray<ZmtpErrorReason> = [
  "greeting-signature",
  "greeting-version",
  "mechanism",
  "handshake",
  "socket-type",
  "peer-error",
  "handshake-timeout",
  "frame-flags",
  "frame-size",
  "command"
]
