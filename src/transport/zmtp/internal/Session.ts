/**
 * One TCP connection of a ZMTP SUB: greeting, NULL handshake (RFC 23 §2.5.1: READY both ways,
 * `Socket-Type: SUB` out, PUB or XPUB in), the subscription, then messages into the queue and
 * PONG for every PING (RFC 37).
 *
 * Everything runs synchronously in the socket's callbacks; nothing here throws out of them. A
 * fault, a socket error or the peer closing ends the session once, through `onEnd`.
 */

import type * as net from "node:net"
import type { ZmtpFault } from "../ZmtpError.js"
import {
  commandName,
  encodePong,
  encodeReady,
  encodeSubscribe,
  errorReason,
  readyProperties
} from "./Commands.js"
import { FrameParser } from "./FrameParser.js"
import { checkGreeting, encodeGreeting, GREETING_BYTES } from "./Greeting.js"
import type { FlowControl, MessageQueue } from "./MessageQueue.js"

export interface SessionEnd {
  /** Whether the handshake completed (the connection was up). */
  readonly handshaken: boolean
  /** The protocol fault that closed the connection. */
  readonly fault: ZmtpFault | undefined
  /** The socket error that closed it (refused, reset, …), when it was not a fault. */
  readonly socketError: string | undefined
  /** What a data handler threw (a bug here or in a connection callback), when that closed it. */
  readonly defect?: unknown
}

interface SessionOptions {
  readonly topic: Buffer
  readonly queue: MessageQueue
  readonly maxFrameBytes: number
  readonly onReady: (peerSocketType: string) => void
  readonly onEnd: (end: SessionEnd) => void
}

const PEER_TYPES = new Set(["PUB", "XPUB"])

type State = "greeting" | "handshake" | "ready" | "ended"

export class Session implements FlowControl {
  private state: State = "greeting"
  private readonly greeting = Buffer.alloc(GREETING_BYTES)
  private greetingBytes = 0
  private readonly parser: FrameParser
  private socketError: string | undefined
  private readonly topic: Buffer
  private readonly queue: MessageQueue
  /** Whether the message whose frames are arriving is filtered out. */
  private skipping = false

  constructor(
    private readonly socket: net.Socket,
    private readonly options: SessionOptions
  ) {
    this.topic = options.topic
    this.queue = options.queue
    this.parser = new FrameParser(
      {
        onFrame: (buf, start, size, first, last) => this.onFrame(buf, start, size, first, last),
        onCommand: (body) => this.onCommand(body)
      },
      options.maxFrameBytes
    )
    socket.setNoDelay(true)
    socket.on("connect", () => {
      if (this.state === "greeting") socket.write(encodeGreeting())
    })
    socket.on("data", (chunk: Buffer) => {
      // Nothing may throw out of a socket callback (it would take the process down): a defect
      // closes this connection, and the subscriber logs it and reconnects.
      try {
        this.onData(chunk)
      } catch (defect) {
        this.end(undefined, defect)
      }
    })
    socket.on("error", (error) => {
      this.socketError ??= error.message
    })
    socket.on("close", () => this.end(undefined))
  }

  get handshaken(): boolean {
    return this.state === "ready"
  }

  /** Bytes the parser holds for a partial frame. */
  get bufferedBytes(): number {
    return this.parser.bufferedBytes
  }

  pause(): void {
    this.socket.pause()
  }

  resume(): void {
    this.socket.resume()
  }

  /** Closes the connection with `fault` (the handshake timer uses it too). */
  fail(fault: ZmtpFault): void {
    this.end(fault)
  }

  /** Closes the connection; no fault (the subscriber is closing). */
  close(): void {
    this.end(undefined)
  }

  private onData(chunk: Buffer): void {
    if (this.state === "ended") return
    if (this.state === "greeting") {
      const n = Math.min(GREETING_BYTES - this.greetingBytes, chunk.length)
      chunk.copy(this.greeting, this.greetingBytes, 0, n)
      this.greetingBytes += n
      const fault = checkGreeting(this.greeting.subarray(0, this.greetingBytes))
      if (fault !== undefined) {
        this.end(fault)
        return
      }
      if (this.greetingBytes < GREETING_BYTES) return
      this.state = "handshake"
      this.socket.write(encodeReady("SUB"))
      if (n === chunk.length) return
      chunk = chunk.subarray(n)
    }
    const fault = this.parser.push(chunk)
    this.queue.flush()
    if (fault !== undefined) this.end(fault)
  }

  private onFrame(
    buf: Buffer,
    start: number,
    size: number,
    first: boolean,
    last: boolean
  ): ZmtpFault | undefined {
    if (this.state !== "ready") return { reason: "handshake", message: "a message before the peer's READY" }
    // A libzmq PUB filters for us; a SUB filters again (as libzmq's does), so a peer that
    // sends everything still delivers only the subscribed prefix.
    if (first) {
      const topic = this.topic
      this.skipping =
        topic.length > 0 &&
        (size < topic.length || buf.compare(topic, 0, topic.length, start, start + topic.length) !== 0)
    }
    if (!this.skipping) this.queue.frame(buf, start, size, last)
    return undefined
  }

  private onCommand(body: Buffer): ZmtpFault | undefined {
    const name = commandName(body)
    if (typeof name !== "string") return name
    if (name === "ERROR")
      return { reason: "peer-error", message: `the peer sent ERROR ${JSON.stringify(errorReason(body))}` }
    if (this.state === "ready") {
      if (name === "PING") this.socket.write(encodePong(body))
      // PONG, SUBSCRIBE, CANCEL and unknown commands mean nothing to a SUB (RFC 37 §2.4).
      return undefined
    }
    if (name !== "READY")
      return { reason: "handshake", message: `command ${JSON.stringify(name)} before the peer's READY` }
    const properties = readyProperties(body)
    if (properties instanceof Map) {
      const socketType = properties.get("socket-type")?.toString("latin1")
      if (socketType === undefined) return { reason: "handshake", message: "READY without a Socket-Type" }
      if (!PEER_TYPES.has(socketType))
        return {
          reason: "socket-type",
          message: `the peer is a ${JSON.stringify(socketType)} socket, a SUB connects to PUB or XPUB`
        }
      this.state = "ready"
      this.socket.write(encodeSubscribe(this.topic))
      this.queue.attach(this)
      this.options.onReady(socketType)
      return undefined
    }
    return properties
  }

  private end(fault: ZmtpFault | undefined, defect?: unknown): void {
    if (this.state === "ended") return
    const handshaken = this.state === "ready"
    this.state = "ended"
    // A message cut off by the end never completes: its frames are not the next connection's.
    this.queue.dropPartial()
    this.queue.detach(this)
    this.socket.destroy()
    const socketError = fault === undefined ? this.socketError : undefined
    this.options.onEnd(
      defect === undefined ? { handshaken, fault, socketError } : { handshaken, fault, socketError, defect }
    )
  }
}
