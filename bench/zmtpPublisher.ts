/**
 * A ZeroMQ PUB for the end-to-end bench: ZMTP 3.0 with the NULL mechanism (RFC 23) over
 * `node:net`, as an inference engine's pyzmq PUB speaks it to the relay.
 *
 * The bench's simulated workers used zeromq.js publishers, and at half of the relay's peak they
 * cost the bench process ~65 µs of CPU per event: more than the relay spent on it. On two cores
 * the load generator then took the CPU the relay's latency was being measured on. Here a message
 * is encoded once, written to every subscribed peer with the writes of one tick corked into one
 * syscall, and a send is a function call, not a promise.
 *
 * Only what a PUB needs: it sends the greeting and READY (`Socket-Type: PUB`), keeps each peer's
 * subscriptions (the 3.0 `0x01`/`0x00` + prefix messages and the 3.1 SUBSCRIBE/CANCEL commands)
 * and sends a message to the peers with a matching prefix; a PING gets its PONG. As with a real
 * PUB, a message sent before a peer's subscription arrives is not delivered to it.
 * `test/bench/zmtpPublisher.test.ts` checks it against libzmq's SUB (zeromq.js) and the relay's.
 */

import * as net from "node:net"
import {
  commandName,
  encodeFrame,
  encodePong,
  encodeReady,
  FLAG_MORE,
  readyProperties
} from "../src/transport/zmtp/internal/Commands.js"
import { FrameParser, messageHandler } from "../src/transport/zmtp/internal/FrameParser.js"
import { checkGreeting, encodeGreeting, GREETING_BYTES } from "../src/transport/zmtp/internal/Greeting.js"

/** Above this many bytes queued to a peer, `send` reports back-pressure (see `drained`). */
const HIGH_WATER_BYTES = 4 * 1024 * 1024
const MAX_FRAME_BYTES = 1024 * 1024

/** One message in ZMTP frames (the subscriber's `encodeFrame`): MORE on all but the last. */
export const encodeMessage = (frames: ReadonlyArray<Uint8Array>): Buffer =>
  Buffer.concat(frames.map((f, i) => encodeFrame(i + 1 < frames.length ? FLAG_MORE : 0, f)))

class Peer {
  readonly subscriptions: Array<Buffer> = []
  private greeting: Buffer = Buffer.alloc(0)
  private readonly parser: FrameParser
  ready = false

  constructor(
    readonly socket: net.Socket,
    private readonly onFault: (peer: Peer, message: string) => void
  ) {
    this.parser = new FrameParser(
      messageHandler({
        onMessage: (frames) => {
          // ZMTP 3.0 subscriptions: 0x01 + prefix subscribes, 0x00 + prefix cancels.
          const body = frames[0]!
          if (frames.length === 1 && body.length >= 1 && body[0]! <= 1)
            this.subscription(body[0] === 1, body.subarray(1))
          return undefined
        },
        onCommand: (body) => {
          const name = commandName(body)
          if (typeof name !== "string") return name
          const data = body.subarray(1 + body[0]!)
          if (name === "READY") {
            const properties = readyProperties(body)
            if (!(properties instanceof Map)) return properties
            const type = properties.get("socket-type")?.toString("latin1")
            if (type !== "SUB" && type !== "XSUB")
              return {
                reason: "handshake",
                message: `a PUB serves SUB peers, not ${type ?? "no socket type"}`
              }
            this.ready = true
          } else if (name === "SUBSCRIBE") this.subscription(true, data)
          else if (name === "CANCEL") this.subscription(false, data)
          else if (name === "PING") socket.write(encodePong(body))
          return undefined
        }
      }),
      MAX_FRAME_BYTES
    )
    socket.setNoDelay(true)
    socket.write(encodeGreeting())
    socket.write(encodeReady("PUB"))
    socket.on("data", (chunk: Buffer) => this.receive(chunk))
  }

  private receive(chunk: Buffer): void {
    let rest = chunk
    if (this.greeting.length < GREETING_BYTES) {
      const take = Math.min(GREETING_BYTES - this.greeting.length, rest.length)
      this.greeting = Buffer.concat([this.greeting, rest.subarray(0, take)])
      rest = rest.subarray(take)
      const fault = checkGreeting(this.greeting)
      if (fault !== undefined) {
        this.onFault(this, fault.message)
        return
      }
      if (rest.length === 0) return
    }
    const fault = this.parser.push(rest)
    if (fault !== undefined) this.onFault(this, fault.message)
  }

  private subscription(add: boolean, prefix: Buffer): void {
    const at = this.subscriptions.findIndex((s) => s.equals(prefix))
    if (add && at < 0) this.subscriptions.push(Buffer.from(prefix))
    else if (!add && at >= 0) this.subscriptions.splice(at, 1)
  }

  matches(topic: Uint8Array): boolean {
    if (!this.ready) return false
    for (const s of this.subscriptions) {
      if (s.length > topic.length) continue
      let i = 0
      while (i < s.length && s[i] === topic[i]) i++
      if (i === s.length) return true
    }
    return false
  }
}

export class ZmtpPublisher {
  private readonly peers = new Set<Peer>()
  private corked = false
  /** Protocol faults of peers (each closed); a bench run expects none. */
  readonly faults: Array<string> = []
  /** Messages written to peers, one per peer a message matched. */
  written = 0

  private constructor(
    private readonly server: net.Server,
    readonly endpoint: string
  ) {
    server.on("connection", (socket) => {
      const peer = new Peer(socket, (p, message) => {
        this.faults.push(message)
        p.socket.destroy()
      })
      this.peers.add(peer)
      socket.on("error", () => undefined)
      socket.on("close", () => this.peers.delete(peer))
    })
  }

  /** A publisher listening on an ephemeral port of `host`. */
  static bind(host = "127.0.0.1"): Promise<ZmtpPublisher> {
    return new Promise((resolve, reject) => {
      const server = net.createServer()
      server.once("error", reject)
      server.listen(0, host, () => {
        const { port } = server.address() as net.AddressInfo
        resolve(new ZmtpPublisher(server, `tcp://${host}:${port}`))
      })
    })
  }

  /** Peers that have sent READY and at least one subscription. */
  get subscribers(): number {
    let n = 0
    for (const peer of this.peers) if (peer.ready && peer.subscriptions.length > 0) n++
    return n
  }

  /**
   * Sends one message to every peer subscribed to a prefix of its first frame. False when a
   * peer has more than the high-water mark queued: the caller waits for `drained()`.
   */
  send(frames: ReadonlyArray<Uint8Array>): boolean {
    let message: Buffer | undefined
    let room = true
    for (const peer of this.peers) {
      if (!peer.matches(frames[0]!)) continue
      message ??= encodeMessage(frames)
      if (!this.corked) this.cork()
      peer.socket.write(message)
      this.written++
      if (peer.socket.writableLength > HIGH_WATER_BYTES) room = false
    }
    return room
  }

  /** Resolves once no peer has more than the high-water mark queued. */
  drained(): Promise<void> {
    const full = [...this.peers].filter((p) => p.socket.writableLength > HIGH_WATER_BYTES)
    return Promise.all(
      full.map((p) => new Promise<void>((resolve) => p.socket.once("drain", () => resolve())))
    ).then(() => undefined)
  }

  /** The writes of one tick go out together: one syscall per peer instead of one per message. */
  private cork(): void {
    this.corked = true
    for (const peer of this.peers) peer.socket.cork()
    process.nextTick(() => {
      this.corked = false
      for (const peer of this.peers) peer.socket.uncork()
    })
  }

  close(): Promise<void> {
    for (const peer of this.peers) peer.socket.destroy()
    return new Promise((resolve) => this.server.close(() => resolve()))
  }
}
