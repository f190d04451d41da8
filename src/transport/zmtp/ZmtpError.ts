/**
 * The typed failure of a ZMTP connection. A protocol error never escapes the subscriber: it is
 * counted and logged, the connection is closed, and the subscriber reconnects.
 */

import { Data } from "effect"

/** What was wrong, one value per check the subscriber makes. */
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

/** A fault found by the wire-level code, before it knows which endpoint it reads. */
export interface ZmtpFault {
  readonly reason: ZmtpErrorReason
  readonly message: string
}

export class ZmtpProtocolError extends Data.TaggedError("ZmtpProtocolError")<{
  readonly endpoint: string
  readonly reason: ZmtpErrorReason
  readonly message: string
}> {}
