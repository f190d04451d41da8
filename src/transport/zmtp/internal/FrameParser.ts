/**
 * Incremental ZMTP 3 frame parser (RFC 23 §2.4): flags (MORE, LONG, COMMAND), a 1-byte or
 * 8-byte big-endian size, the body. It takes TCP chunks as they come and hands on every
 * complete frame of a chunk in one synchronous pass.
 *
 * A data frame is handed on as its place in a buffer (the chunk, or the bytes joined for a frame
 * that straddled chunks), not as a view: a queue of received messages then holds numbers and one
 * reference per chunk instead of a `Buffer` object per frame (see `MessageQueue`). A chunk is a
 * fresh allocation per read, never reused by `node:net`, so a place in it stays valid for as long
 * as a consumer holds the chunk. Bytes are copied only when a frame or header straddles chunks,
 * and then once: the parser knows how many bytes the next step needs and concatenates the held
 * chunks only when that many have arrived, so a 10 MB frame over 160 chunks costs one copy, not
 * 160.
 */

import type { ZmtpFault } from "../ZmtpError.js"
import { FLAG_COMMAND, FLAG_LONG, FLAG_MORE } from "./Commands.js"

interface FrameHandler {
  /**
   * A data frame, `buf[start, start + size)`; `first` when it starts its message, `last` when it
   * ends it (MORE clear). A fault stops the parser.
   */
  onFrame(buf: Buffer, start: number, size: number, first: boolean, last: boolean): ZmtpFault | undefined
  /** A command frame's body; a fault stops the parser. */
  onCommand(body: Buffer): ZmtpFault | undefined
}

/**
 * A handler that hands on whole messages as `Buffer` views, for a reader that takes messages as
 * they come rather than queueing them (a publisher reading its peer's subscriptions, tests).
 */
export const messageHandler = (handler: {
  readonly onMessage: (frames: Array<Buffer>) => ZmtpFault | undefined
  readonly onCommand: (body: Buffer) => ZmtpFault | undefined
}): FrameHandler => {
  let frames: Array<Buffer> = []
  return {
    onFrame: (buf, start, size, _first, last) => {
      frames.push(buf.subarray(start, start + size))
      if (!last) return undefined
      const message = frames
      frames = []
      return handler.onMessage(message)
    },
    onCommand: handler.onCommand
  }
}

const RESERVED_FLAGS = ~(FLAG_MORE | FLAG_LONG | FLAG_COMMAND) & 0xff

export class FrameParser {
  /** Bytes received but not yet parsed (a partial header or frame), in arrival order. */
  private held: Array<Buffer> = []
  private heldBytes = 0
  /** Bytes from the first held byte that the next parse step needs. */
  private need = 0
  /** Whether frames of a message have come and its last has not. */
  private inMessage = false
  private failed: ZmtpFault | undefined

  constructor(
    private readonly handler: FrameHandler,
    /** Largest frame body accepted; a larger size is a fault before any of its bytes are held. */
    private readonly maxFrameBytes: number
  ) {}

  /** Bytes held for a partial frame: all the parser keeps. */
  get bufferedBytes(): number {
    return this.heldBytes
  }

  /** Parses a chunk; returns the fault that stopped the parser (then and on every later call). */
  push(chunk: Buffer): ZmtpFault | undefined {
    if (this.failed !== undefined) return this.failed
    let from = 0
    // A frame or header straddling chunks: join the held bytes with only as many of this
    // chunk's as the next step needs, and go on parsing the chunk itself in place after it.
    while (this.heldBytes > 0) {
      const missing = this.need - this.heldBytes
      const rest = chunk.length - from
      if (rest < missing) {
        if (rest > 0) {
          this.held.push(from === 0 ? chunk : chunk.subarray(from))
          this.heldBytes += rest
        }
        return undefined
      }
      this.held.push(chunk.subarray(from, from + missing))
      from += missing
      const joined = Buffer.concat(this.held, this.need)
      this.held = []
      this.heldBytes = 0
      const stopped = this.parse(joined, 0)
      if (stopped < 0) return this.failed
      if (stopped < joined.length) this.hold(joined, stopped)
    }
    const stopped = this.parse(chunk, from)
    if (stopped < 0) return this.failed
    if (stopped < chunk.length) this.hold(chunk, stopped)
    return undefined
  }

  private hold(buf: Buffer, from: number): void {
    this.held.push(from === 0 ? buf : buf.subarray(from))
    this.heldBytes = buf.length - from
  }

  /**
   * Parses whole frames of `buf` from `at`; returns where it stopped (with `need` set to the
   * bytes the next step needs from there), or -1 after a fault.
   */
  private parse(buf: Buffer, at: number): number {
    const end = buf.length
    for (;;) {
      const available = end - at
      if (available < 2) {
        this.need = 2
        return at
      }
      const flags = buf[at]!
      if ((flags & RESERVED_FLAGS) !== 0)
        return this.fail("frame-flags", `reserved flag bits in 0x${flags.toString(16)}`)
      let size: number
      let header: number
      if ((flags & FLAG_LONG) !== 0) {
        if (available < 9) {
          this.need = 9
          return at
        }
        const hi = buf.readUInt32BE(at + 1)
        const lo = buf.readUInt32BE(at + 5)
        if (hi !== 0 || lo > this.maxFrameBytes)
          return this.fail(
            "frame-size",
            `a frame of ${hi * 4294967296 + lo} bytes, the limit is ${this.maxFrameBytes}`
          )
        size = lo
        header = 9
      } else {
        size = buf[at + 1]!
        header = 2
        if (size > this.maxFrameBytes)
          return this.fail("frame-size", `a frame of ${size} bytes, the limit is ${this.maxFrameBytes}`)
      }
      if (available < header + size) {
        this.need = header + size
        return at
      }
      const start = at + header
      at = start + size
      let fault: ZmtpFault | undefined
      if ((flags & FLAG_COMMAND) !== 0) {
        if ((flags & FLAG_MORE) !== 0) return this.fail("frame-flags", "a command frame with MORE set")
        if (this.inMessage) return this.fail("frame-flags", "a command frame inside a multipart message")
        fault = this.handler.onCommand(buf.subarray(start, at))
      } else {
        const first = !this.inMessage
        this.inMessage = (flags & FLAG_MORE) !== 0
        fault = this.handler.onFrame(buf, start, size, first, !this.inMessage)
      }
      if (fault !== undefined) {
        this.stop(fault)
        return -1
      }
    }
  }

  private fail(reason: ZmtpFault["reason"], message: string): -1 {
    this.stop({ reason, message })
    return -1
  }

  private stop(fault: ZmtpFault): ZmtpFault {
    this.failed = fault
    this.held = []
    this.heldBytes = 0
    this.inMessage = false
    return fault
  }
}
