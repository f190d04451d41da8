/**
 * ZeroMQ sockets as scoped Effect resources, and the pieces every subscriber shares: the
 * malformed-message reasons, the decoded-message shape and the SUB receive loop.
 *
 * Every socket is acquired in the current `Scope` and closed with linger 0 on release, so an
 * interrupted query or a closed subscription never leaves a socket (or a queued reply) behind.
 */

import { Data, Effect, Fiber, type Scope } from "effect"
import * as zmq from "zeromq"
import { InjectedLoopFault, LoopFaults } from "../observability/Supervised.js"
import type { MalformedReason, RouterEvent, SkipCounts } from "../protocol/Events.js"
import { parseTcpEndpoint } from "./zmtp/Endpoint.js"
import { makeZmtpSubscriber } from "./zmtp/ZmtpSubscriber.js"

/** A ZeroMQ socket operation that failed; `operation` and `endpoint` say which. */
export class ZmqError extends Data.TaggedError("ZmqError")<{
  readonly operation: string
  readonly endpoint: string
  readonly message: string
}> {}

const describe = (error: unknown): string => (error instanceof Error ? error.message : String(error))

/** Receive/send high-water mark of event sockets (recovery-events.md §6.2). */
export const EVENT_HWM = 100_000

/** Acquires a socket in the current Scope; release closes it with linger 0 (queued messages are dropped). */
export const acquireSocket = <S extends zmq.Socket>(make: () => S): Effect.Effect<S, never, Scope.Scope> =>
  Effect.acquireRelease(
    Effect.sync(() => {
      const socket = make()
      socket.linger = 0
      return socket
    }),
    (socket) =>
      Effect.sync(() => {
        if (!socket.closed) {
          socket.linger = 0
          socket.close()
        }
      })
  )

/** Binds and returns the resolved endpoint (`tcp://127.0.0.1:*` picks a free port). */
export const bindSocket = (socket: zmq.Socket, endpoint: string): Effect.Effect<string, ZmqError> =>
  Effect.tryPromise({
    try: () => socket.bind(endpoint),
    catch: (error) => new ZmqError({ operation: "bind", endpoint, message: describe(error) })
  }).pipe(Effect.map(() => socket.lastEndpoint ?? endpoint))

/** Connects; ZeroMQ connects (and reconnects) in the background, only a bad address fails here. */
export const connectSocket = (socket: zmq.Socket, endpoint: string): Effect.Effect<void, ZmqError> =>
  Effect.try({
    try: () => socket.connect(endpoint),
    catch: (error) => new ZmqError({ operation: "connect", endpoint, message: describe(error) })
  })

/** Sends one multipart message. */
export const sendFrames = (
  socket: zmq.Writable,
  frames: ReadonlyArray<Uint8Array | string>,
  endpoint: string
): Effect.Effect<void, ZmqError> =>
  Effect.tryPromise({
    // zeromq's MessageLike accepts typed arrays and strings; the array itself is not retained.
    try: () => socket.send(frames as Array<Uint8Array | string>),
    catch: (error) => new ZmqError({ operation: "send", endpoint, message: describe(error) })
  })

/** The next multipart message. */
export const receiveFrames = (
  socket: zmq.Readable<Array<Buffer>>,
  endpoint: string
): Effect.Effect<Array<Buffer>, ZmqError> =>
  Effect.tryPromise({
    try: () => socket.receive(),
    catch: (error) => new ZmqError({ operation: "receive", endpoint, message: describe(error) })
  })

/** Messages one receive takes at most: the turn budget is checked between batches only. */
export const RECEIVE_BATCH = 32

/**
 * Waits for a message, then takes what else is queued on the socket (up to `RECEIVE_BATCH`),
 * appending to `into`. A receive on a readable socket settles at once, so the batch costs one
 * fiber suspension and a promise per message instead of an Effect per message.
 */
const receiveBatch = (
  socket: zmq.Readable<Array<Buffer>> & zmq.Socket,
  endpoint: string,
  into: Array<Array<Buffer>>
): Effect.Effect<void, ZmqError> =>
  Effect.async<void, ZmqError>((resume) => {
    // `readable` (ZMQ_POLLIN, nothing received) is an accessor of zeromq.js's native socket, the
    // one its compat layer polls; its typings leave it out.
    const probe = socket as unknown as { readonly readable: boolean }
    const fill = async (): Promise<void> => {
      into.push(await socket.receive())
      while (into.length < RECEIVE_BATCH && !socket.closed && probe.readable)
        into.push(await socket.receive())
    }
    fill().then(
      () => resume(Effect.void),
      // Messages taken before the error are still handled: the caller runs its batch first only
      // on success, so keep the failure for after them.
      (error) =>
        resume(
          into.length === 0
            ? Effect.fail(new ZmqError({ operation: "receive", endpoint, message: describe(error) }))
            : Effect.void
        )
    )
  })

/** 8-byte big-endian u64 from halves. */
export const u64Frame = (hi: number, lo: number): Buffer => {
  const out = Buffer.allocUnsafe(8)
  out.writeUInt32BE(hi >>> 0, 0)
  out.writeUInt32BE(lo >>> 0, 4)
  return out
}

/** 8-byte big-endian u64 from a safe integer. */
export const u64FrameOf = (value: number): Buffer =>
  u64Frame(Math.floor(value / 4294967296), value % 4294967296)

/** A u64 BE frame as a number, or -1 when it is above 2^53 (not representable). */
export const u64FrameValue = (frame: Uint8Array): number => {
  const view = new DataView(frame.buffer, frame.byteOffset, 8)
  const hi = view.getUint32(0)
  const lo = view.getUint32(4)
  return hi < 0x20_0000 ? hi * 4294967296 + lo : -1
}

export {
  MALFORMED_REASONS,
  type MalformedReason,
  SKIP_REASONS,
  type SkipCounts,
  type SkipReason
} from "../protocol/Events.js"

/**
 * How long receive loops may run before the event loop gets a turn. Shared by every loop of the
 * process: it bounds a whole turn, not one socket's share of it.
 */
const EVENT_LOOP_TURN_BUDGET_MS = 1
let turnStartedAt = performance.now()
const eventLoopTurn: Effect.Effect<void> = Effect.async<void>((resume) => {
  const handle = setImmediate(() => {
    turnStartedAt = performance.now()
    resume(Effect.void)
  })
  return Effect.sync(() => clearImmediate(handle))
})
const yieldWhenTurnIsSpent: Effect.Effect<void> = Effect.suspend(() =>
  performance.now() - turnStartedAt >= EVENT_LOOP_TURN_BUDGET_MS ? eventLoopTurn : Effect.void
)

/** One received message after decoding. */
export type IngestMessage =
  | {
      readonly _tag: "Batch"
      readonly publisherId: bigint
      /** Envelope sequence (dynamo) or batch seq (engine); -1 when above 2^53. */
      readonly sequence: number
      readonly events: ReadonlyArray<RouterEvent>
      readonly blocks: number
      /** Engine events not turned into RouterEvents (the skipped ones and unknown types). */
      readonly ignored: number
      /** Engine events skipped by reason; absent for Dynamo batches. */
      readonly skipped?: SkipCounts
    }
  | {
      /** A batch below the source's last accepted seq (not a restart): dropped and counted. */
      readonly _tag: "Stale"
      readonly publisherId: bigint
      readonly sequence: number
    }
  | {
      readonly _tag: "Malformed"
      readonly reason: MalformedReason
      readonly message: string
      /** The publisher the message claims to come from, when that much could be read. */
      readonly publisherId: bigint | undefined
    }

/** The blocks the events store or remove (for batch weights and counters). */
export const blockCount = (events: ReadonlyArray<RouterEvent>): number => {
  let blocks = 0
  for (const event of events) if (event.data._tag !== "Cleared") blocks += event.data.blockHashes.length >>> 1
  return blocks
}

/**
 * What a delivery step returns: `undefined` when it handled the message synchronously (the hot
 * path, which builds no effect), else the effect that completes the handling.
 */
export type Delivered = Effect.Effect<void> | undefined

interface SubscriptionOptions {
  readonly endpoint: string
  /** Prefix subscription (frame 0). */
  readonly topic: string
  readonly decode: (frames: Array<Buffer>) => IngestMessage
  /**
   * Called for every message in arrival order; the next message waits until the returned effect
   * (if any) has completed.
   */
  readonly deliver: (message: IngestMessage) => Delivered
  /** Connection state from the socket monitor (handshake = connected, disconnect = not). */
  readonly onConnection?: (connected: boolean) => void
  /** Why a connection attempt failed or a connection ended, where the transport knows (tcp). */
  readonly onConnectionError?: (error: string) => void
}

/** The receive loop of a subscription. */
export interface ReceiveLoop {
  /**
   * Waits for the loop, which runs until its Scope closes: it ends only by failing (a receive
   * error) or dying, and the owner reopens the subscription then.
   */
  readonly done: Effect.Effect<never, ZmqError>
}

/** The name tests arm in `LoopFaults` to make a receive loop die at its next message. */
export const RECEIVE_LOOP = "transport.zmq-receive"

/** Messages a ZMTP receive takes at most; like `RECEIVE_BATCH`, the turn budget is checked between batches. */
const ZMTP_RECEIVE_BATCH = 32

/**
 * The receive side of a subscription: an effect that appends the next batch of messages to
 * `into`. A `tcp://` endpoint is read by the ZMTP subscriber (`./zmtp/`), which parses every
 * message of a TCP chunk in one pass; any other endpoint (ipc, inproc, a source address) by a
 * zeromq.js SUB with its socket monitor. Both keep RCVHWM messages at most and reconnect on
 * their own, and both give each message as the same `Array<Buffer>` of frames.
 */
const openReceiver = (
  options: SubscriptionOptions,
  into: Array<Array<Buffer>>
): Effect.Effect<Effect.Effect<void, ZmqError>, ZmqError, Scope.Scope> =>
  Effect.gen(function* () {
    const address = parseTcpEndpoint(options.endpoint)
    if (address !== undefined) {
      const subscriber = yield* makeZmtpSubscriber({
        endpoint: options.endpoint,
        address,
        topic: options.topic,
        highWaterMark: EVENT_HWM,
        ...(options.onConnection === undefined ? {} : { onConnection: options.onConnection }),
        ...(options.onConnectionError === undefined ? {} : { onConnectionError: options.onConnectionError })
      })
      return subscriber.receiveBatch(into, ZMTP_RECEIVE_BATCH)
    }
    const socket = yield* acquireSocket(
      () => new zmq.Subscriber({ receiveHighWaterMark: EVENT_HWM, linger: 0 })
    )
    const onConnection = options.onConnection
    if (onConnection !== undefined) {
      const observer = socket.events
      yield* Effect.tryPromise(() => observer.receive()).pipe(
        Effect.tap((event) =>
          Effect.sync(() => {
            if (event.type === "handshake") onConnection(true)
            else if (event.type === "disconnect" || event.type === "close") onConnection(false)
          })
        ),
        Effect.forever,
        // The observer ends with its socket: that is the loop's normal end.
        Effect.catchAll(() => Effect.void),
        Effect.ensuring(Effect.sync(() => onConnection(false))),
        Effect.forkScoped
      )
    }
    yield* connectSocket(socket, options.endpoint)
    socket.subscribe(options.topic)
    return receiveBatch(socket, options.endpoint, into)
  })

/**
 * A SUB (RCVHWM 100000, prefix subscription; ZMTP over `node:net` for `tcp://`, zeromq.js
 * otherwise) whose receive loop runs in a fiber of the current Scope until the Scope closes. A
 * bad endpoint fails the acquisition (zeromq.js); a peer that is not up yet is retried in the
 * background.
 */
export const subscribe = (options: SubscriptionOptions): Effect.Effect<ReceiveLoop, ZmqError, Scope.Scope> =>
  Effect.gen(function* () {
    const faults = yield* LoopFaults
    const { decode, deliver, endpoint } = options
    // One receive effect per batch of queued messages, not per message: an Effect.tryPromise, its
    // fiber suspension and the operators around it cost about as much as decoding the message.
    const batch: Array<Array<Buffer>> = []
    const receive = yield* openReceiver(options, batch)
    // A defect while handling one message must not end the subscription: it drops that message.
    const dropFailed = (defect: unknown): Effect.Effect<void> =>
      Effect.logError("dropping a message whose handling failed").pipe(
        Effect.annotateLogs({ endpoint, defect: String(defect) })
      )
    /**
     * Hands `received[start..]` to `deliver` in order. Messages handled synchronously cost no
     * effect; the first one that returns an effect is run (its defects caught) before the rest.
     */
    const deliverFrom = (received: Array<Array<Buffer>>, start: number): Effect.Effect<void> => {
      for (let i = start; i < received.length; i++) {
        if (faults.take(RECEIVE_LOOP)) return Effect.die(new InjectedLoopFault(RECEIVE_LOOP))
        let rest: Delivered
        try {
          rest = deliver(decode(received[i]!))
        } catch (defect) {
          rest = dropFailed(defect)
        }
        if (rest !== undefined) {
          const next = i + 1
          const handled = Effect.catchAllDefect(rest, dropFailed)
          return next === received.length
            ? handled
            : Effect.zipRight(
                handled,
                Effect.suspend(() => deliverFrom(received, next))
              )
        }
      }
      return Effect.void
    }
    const handleBatch = Effect.suspend(() => deliverFrom(batch.splice(0, batch.length), 0))
    const loop = yield* receive.pipe(
      Effect.zipRight(handleBatch),
      // While messages are queued, `receive` resolves without ever returning to the event loop:
      // a burst would then starve every socket write (pool streams fall behind and are lagged),
      // timer and HTTP request of the process. A pool stream moves one hop per turn, so a long turn
      // delays every delta: give the event loop a turn once the shared budget is spent.
      Effect.zipRight(yieldWhenTurnIsSpent),
      Effect.forever,
      Effect.forkScoped
    )
    return { done: Fiber.join(loop) }
  })
