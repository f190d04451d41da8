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
