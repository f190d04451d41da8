/**
 * A ZMTP 3 SUB over `node:net` for the relay's event sockets: it connects to one libzmq PUB or
 * XPUB (`tcp://` only), subscribes to a prefix, parses every message of a TCP chunk in one
 * synchronous pass, and queues them as places in the chunks; the consumer takes each as the
 * `Array<Buffer>` of frames zeromq.js would give.
 * zeromq.js's `receive()` costs a native call, a promise and one buffer per frame for every
 * message; this costs a view per frame when the message is taken, and none of the rest
 * (`docs/decisions.md`, "ZMTP subscriber").
 *
 * Like a libzmq SUB it connects in the background and reconnects after the peer closes or before
 * it has bound (100 ms, doubling per failed attempt up to 1 s, back to 100 ms after a
 * handshake), holds at most `highWaterMark` messages (reading pauses there), and reports
 * connection state (handshake = connected). A protocol error is a `ZmtpProtocolError`: logged,
 * counted by reason, the connection closed and retried; it never reaches the consumer.
 */

import * as net from "node:net"
import { Duration, Effect, Fiber, type Scope } from "effect"
import * as RelayMetrics from "../../observability/RelayMetrics.js"
import { ZMTP_ERROR_REASONS, type ZmtpErrorReason } from "../../protocol/Events.js"
import type { TcpEndpoint } from "./Endpoint.js"
import { MessageQueue } from "./internal/MessageQueue.js"
import { Session, type SessionEnd } from "./internal/Session.js"
import { ZmtpProtocolError } from "./ZmtpError.js"

/** What a ZMTP subscriber connects to and subscribes for. */
export interface ZmtpSubscriberOptions {
  /** The endpoint as configured (for logs and errors). */
  readonly endpoint: string
  readonly address: TcpEndpoint
  /** Prefix subscription (frame 0). */
  readonly topic: string
  /** Messages held for the consumer before reading pauses (ZMQ_RCVHWM). */
  readonly highWaterMark: number
  /** Largest frame accepted; default `DEFAULT_MAX_FRAME_BYTES`. */
  readonly maxFrameBytes?: number
  /** Default 100 ms (ZMQ_RECONNECT_IVL). */
  readonly reconnectInterval?: Duration.DurationInput
  /** Default 1 s. */
  readonly reconnectIntervalMax?: Duration.DurationInput
  /** Default 30 s (ZMQ_HANDSHAKE_IVL). */
  readonly handshakeTimeout?: Duration.DurationInput
  readonly onConnection?: (connected: boolean) => void
  /** Why each failed attempt failed or each connection ended (a fault, a socket error). */
  readonly onConnectionError?: (error: string) => void
}

/**
 * 256 MiB: far above any KV event batch (a Dynamo batch of 10,000 8-block events is ~2 MB),
 * small enough that a corrupt 8-byte size cannot make the relay hold gigabytes for one frame.
 */
const DEFAULT_MAX_FRAME_BYTES = 256 * 1024 * 1024

interface ZmtpSubscriberStats {
  /** TCP connections tried. */
  readonly attempts: number
  /** Completed handshakes. */
  readonly connects: number
  /** Connections that ended after their handshake. */
  readonly disconnects: number
  readonly protocolErrors: Readonly<Record<ZmtpErrorReason, number>>
  /** Messages queued for the consumer. */
  readonly queued: number
  /** Whether reading is paused at the high-water mark. */
  readonly paused: boolean
  /** Bytes held for a frame not yet complete. */
  readonly bufferedBytes: number
}

/** A SUB connection to one publisher, over ZMTP 3 on a plain TCP socket. */
export interface ZmtpSubscriber {
  /**
   * Waits for a message, then moves up to `max` queued messages to `into` in arrival order. It
   * never fails: connection trouble is handled (and retried) below it.
   */
  readonly receiveBatch: (into: Array<Array<Buffer>>, max: number) => Effect.Effect<void>
  readonly stats: () => ZmtpSubscriberStats
}

/** A subscriber whose connection loop runs in a fiber of the current Scope until it closes. */
export const makeZmtpSubscriber = (
  options: ZmtpSubscriberOptions
): Effect.Effect<ZmtpSubscriber, never, Scope.Scope> =>
  Effect.gen(function* () {
    const { endpoint, address } = options
    const queue = new MessageQueue(options.highWaterMark)
    const topic = Buffer.from(options.topic, "utf8")
    const maxFrameBytes = options.maxFrameBytes ?? DEFAULT_MAX_FRAME_BYTES
    const initialDelay = Duration.toMillis(options.reconnectInterval ?? Duration.millis(100))
    const maxDelay = Math.max(
      initialDelay,
      Duration.toMillis(options.reconnectIntervalMax ?? Duration.seconds(1))
    )
    const handshakeTimeout = Duration.decode(options.handshakeTimeout ?? Duration.seconds(30))
    const onConnection = options.onConnection
    const protocolErrors = Object.fromEntries(ZMTP_ERROR_REASONS.map((reason) => [reason, 0])) as Record<
      ZmtpErrorReason,
      number
    >
    let attempts = 0
    let connects = 0
    let disconnects = 0
    let current: Session | undefined
    // A throwing connection callback must neither close the connection nor end the loop: its
    // defect is kept and logged by the loop once the connection ends.
    let callbackDefect: unknown
    const notify = (connected: boolean): void => {
      if (onConnection === undefined) return
      try {
        onConnection(connected)
      } catch (defect) {
        callbackDefect ??= defect
      }
    }

    /** One connection, from connect to close; interruption closes it. */
    const connectOnce: Effect.Effect<SessionEnd> = Effect.gen(function* () {
      let resumeEnd: ((end: SessionEnd) => void) | undefined
      let ended: SessionEnd | undefined
      attempts++
      const session = new Session(net.connect({ host: address.host, port: address.port }), {
        topic,
        queue,
        maxFrameBytes,
        onReady: () => {
          connects++
          notify(true)
        },
        onEnd: (end) => {
          ended = end
          current = undefined
          resumeEnd?.(end)
        }
      })
      current = session
      const timer = yield* Effect.sleep(handshakeTimeout).pipe(
        Effect.zipRight(
          Effect.sync(() => {
            if (!session.handshaken)
              session.fail({
                reason: "handshake-timeout",
                message: `no handshake within ${Duration.format(handshakeTimeout)}`
              })
          })
        ),
        Effect.fork
      )
      const end = yield* Effect.async<SessionEnd>((resume) => {
        if (ended !== undefined) return resume(Effect.succeed(ended))
        resumeEnd = (end) => resume(Effect.succeed(end))
        return Effect.sync(() => session.close())
      })
      yield* Fiber.interrupt(timer)
      return end
    })

    const firstWarned = new Set<ZmtpErrorReason>()
    const describeEnd = (end: SessionEnd): Effect.Effect<void> => {
      if (end.defect !== undefined)
        return Effect.logError("ZMTP connection closed after a defect in its handler; reconnecting").pipe(
          Effect.annotateLogs({ endpoint, defect: String(end.defect) })
        )
      const fault = end.fault
      if (fault === undefined)
        return end.socketError === undefined
          ? Effect.void
          : Effect.logDebug("ZMTP connection closed").pipe(
              Effect.annotateLogs({ endpoint, error: end.socketError })
            )
      protocolErrors[fault.reason]++
      const error = new ZmtpProtocolError({ endpoint, reason: fault.reason, message: fault.message })
      // The first of each reason is a warning; a peer that keeps failing its handshake would
      // otherwise log one every reconnect.
      const log = firstWarned.has(fault.reason) ? Effect.logDebug : Effect.logWarning
      firstWarned.add(fault.reason)
      return log("closing a ZMTP connection after a protocol error; reconnecting").pipe(
        Effect.annotateLogs({ endpoint, reason: error.reason, error: error.message }),
        Effect.zipRight(RelayMetrics.zmtpProtocolError(fault.reason))
      )
    }
    const report = (end: SessionEnd): Effect.Effect<void> => {
      if (end.handshaken) {
        disconnects++
        notify(false)
      }
      // Every failed attempt says why, so a source that never connects can show the reason.
      const error = end.fault !== undefined ? `${end.fault.reason}: ${end.fault.message}` : end.socketError
      if (error !== undefined && options.onConnectionError !== undefined) {
        try {
          options.onConnectionError(error)
        } catch (defect) {
          callbackDefect ??= defect
        }
      }
      const failed = callbackDefect
      callbackDefect = undefined
      const described = describeEnd(end)
      return failed === undefined
        ? described
        : Effect.zipRight(
            described,
            Effect.logError("a ZMTP connection-state callback failed").pipe(
              Effect.annotateLogs({ endpoint, defect: String(failed) })
            )
          )
    }

    yield* Effect.gen(function* () {
      // Failed attempts in a row: the first retry waits the initial interval, each later one twice
      // the one before, up to the cap. A connection that got through its handshake and ended
      // without a protocol error starts over; one that breaks the protocol after its handshake
      // still backs off, or it would be retried every 100 ms for ever.
      let failures = 0
      for (;;) {
        const end = yield* connectOnce
        yield* report(end)
        failures = end.handshaken && end.fault === undefined ? 0 : failures + 1
        yield* Effect.sleep(
          Duration.millis(Math.min(maxDelay, initialDelay * 2 ** Math.max(0, failures - 1)))
        )
      }
    }).pipe(
      Effect.ensuring(
        Effect.sync(() => {
          current?.close()
          notify(false)
        })
      ),
      Effect.annotateLogs({ endpoint }),
      Effect.forkScoped
    )

    const wait = Effect.async<void>((resume) => {
      queue.wait(() => resume(Effect.void))
      return Effect.sync(() => queue.cancelWait())
    })
    const receiveBatch = (into: Array<Array<Buffer>>, max: number): Effect.Effect<void> =>
      Effect.suspend(() =>
        queue.take(into, max) > 0
          ? Effect.void
          : Effect.zipRight(
              wait,
              Effect.sync(() => queue.take(into, max))
            )
      )

    return {
      receiveBatch,
      stats: () => ({
        attempts,
        connects,
        disconnects,
        protocolErrors: { ...protocolErrors },
        queued: queue.size,
        paused: queue.isPaused,
        bufferedBytes: current?.bufferedBytes ?? 0
      })
    }
  })
