/**
 * Fixtures of the ZMTP subscriber tests: real zeromq.js publishers (the oracle: libzmq 4.3),
 * plain TCP servers for peers that are not ZeroMQ or that misbehave on purpose, and a collector
 * that drains a subscriber the way the relay's receive loop does.
 */

import * as net from "node:net"
import { Effect, type Scope } from "effect"
import * as zmq from "zeromq"
import { parseTcpEndpoint } from "../../../src/transport/zmtp/Endpoint.js"
import {
  makeZmtpSubscriber,
  type ZmtpSubscriber,
  type ZmtpSubscriberOptions
} from "../../../src/transport/zmtp/ZmtpSubscriber.js"
import { eventually } from "../../integration/zmqHelpers.js"

export { eventually }

/** A zeromq.js socket bound on `endpoint` (then read `lastEndpoint`), closed with the scope. */
export const bound = <S extends zmq.Socket>(
  make: () => S,
  endpoint = "tcp://127.0.0.1:*"
): Effect.Effect<S, never, Scope.Scope> =>
  Effect.acquireRelease(
    Effect.promise(async () => {
      const socket = make()
      socket.linger = 0
      await socket.bind(endpoint)
      return socket
    }),
    (socket) => Effect.sync(() => socket.close())
  )

export const publisher = (endpoint?: string) =>
  bound(() => new zmq.Publisher({ sendHighWaterMark: 1_000_000 }), endpoint)

/** A port nothing listens on (taken from the kernel, then released). */
export const freePort: Effect.Effect<number> = Effect.promise(
  () =>
    new Promise<number>((resolve, reject) => {
      const server = net.createServer()
      server.once("error", reject)
      server.listen(0, "127.0.0.1", () => {
        const port = (server.address() as net.AddressInfo).port
        server.close(() => resolve(port))
      })
    })
)

/** A plain TCP server on 127.0.0.1 calling `onSocket` per connection; closed with the scope. */
export const tcpServer = (
  onSocket: (socket: net.Socket) => void
): Effect.Effect<{ readonly endpoint: string; readonly connections: () => number }, never, Scope.Scope> =>
  Effect.acquireRelease(
    Effect.promise(
      () =>
        new Promise<{ server: net.Server; sockets: Set<net.Socket>; count: { n: number } }>((resolve) => {
          const sockets = new Set<net.Socket>()
          const count = { n: 0 }
          const server = net.createServer((socket) => {
            count.n++
            sockets.add(socket)
            socket.on("close", () => sockets.delete(socket))
            socket.on("error", () => {})
            onSocket(socket)
          })
          server.listen(0, "127.0.0.1", () => resolve({ server, sockets, count }))
        })
    ),
    ({ server, sockets }) =>
      Effect.promise(
        () =>
          new Promise<void>((resolve) => {
            for (const socket of sockets) socket.destroy()
            server.close(() => resolve())
          })
      )
  ).pipe(
    Effect.map(({ server, count }) => ({
      endpoint: `tcp://127.0.0.1:${(server.address() as net.AddressInfo).port}`,
      connections: () => count.n
    }))
  )

export interface Collected {
  readonly subscriber: ZmtpSubscriber
  readonly messages: Array<Array<Buffer>>
  readonly connection: Array<boolean>
}

/**
 * A subscriber on `endpoint` drained by a fiber of the scope into `messages`; with `drain:
 * false` nothing takes its messages (a consumer that is stuck).
 */
export const collect = (
  endpoint: string,
  topic: string,
  options: Partial<ZmtpSubscriberOptions> & { readonly drain?: boolean } = {}
): Effect.Effect<Collected, never, Scope.Scope> =>
  Effect.gen(function* () {
    const connection: Array<boolean> = []
    const subscriber = yield* makeZmtpSubscriber({
      endpoint,
      address: parseTcpEndpoint(endpoint)!,
      topic,
      highWaterMark: 100_000,
      ...options,
      onConnection: (connected) => connection.push(connected)
    })
    const messages: Array<Array<Buffer>> = []
    if (options.drain !== false)
      yield* subscriber.receiveBatch(messages, 32).pipe(Effect.forever, Effect.forkScoped)
    return { subscriber, messages, connection }
  })

export const sendAll = (socket: zmq.Writable, messages: ReadonlyArray<ReadonlyArray<Buffer | string>>) =>
  Effect.promise(async () => {
    for (const message of messages) await socket.send(message as Array<Buffer | string>)
  })

const PROBE = "\u0000probe"

const isProbe = (frames: Array<Buffer>) => frames.length === 1 && frames[0]!.toString().endsWith(PROBE)

/**
 * PUB/SUB drops what is sent before the subscription reaches the publisher: send a one-frame
 * probe under `topic` until a new one arrives. Probes that arrived before the call (from an
 * earlier publisher on the same subscriber) do not count, or a restarted publisher would be
 * taken as subscribed before it is. Later probes may still be in flight: read the messages
 * through `withoutProbes`.
 */
export const prime = (socket: zmq.Writable, collected: Collected, topic: string) =>
  Effect.suspend(() => {
    const before = collected.messages.filter(isProbe).length
    return eventually(
      Effect.gen(function* () {
        yield* sendAll(socket, [[topic + PROBE]])
        return collected.messages.filter(isProbe).length > before
      }),
      "the subscription to reach the publisher"
    )
  })

export const withoutProbes = (messages: ReadonlyArray<Array<Buffer>>): Array<Array<Buffer>> =>
  messages.filter((frames) => !isProbe(frames))
