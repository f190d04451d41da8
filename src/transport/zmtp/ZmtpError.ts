/**
 * The typed failure of a ZMTP connection. A protocol error never escapes the subscriber: it is
 * counted and logged, the connection is closed, and the subscriber reconnects.
 */

import { Data } from "effect"
import type { ZmtpErrorReason } from "../../protocol/Events.js"

/** A fault found by the wire-level code, before it knows which endpoint it reads. */
export interface ZmtpFault {
  readonly reason: ZmtpErrorReason
  readonly message: string
}

/** A peer broke the ZMTP protocol; the connection is dropped. */
export class ZmtpProtocolError extends Data.TaggedError("ZmtpProtocolError")<{
  readonly endpoint: string
  readonly reason: ZmtpErrorReason
  readonly message: string
}> {}
