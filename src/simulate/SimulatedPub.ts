/**
 * The PUB socket both simulated workers publish on (the Dynamo worker's and the engine's), with
 * what their gap tests share: the next messages can be dropped on purpose (counted, not sent),
 * and raw frames can go around the encoder. A restart of either worker is logged the same way.
 */

import { Effect, type Scope } from "effect"
import * as zmq from "zeromq"
import type { KvEventSource } from "../protocol/Discovery.js"
import type { DpRank, WorkerId } from "../protocol/Events.js"
import type { EndpointId } from "../protocol/Model.js"
import { acquireSocket, bindSocket, EVENT_HWM, sendFrames, type ZmqError } from "../transport/ZmqSocket.js"

/** What every simulated worker rank says about itself. */
export interface SimulatedRank {
  /** The PUB socket's address. */
  readonly endpoint: string
  /** The topic its messages carry. */
  readonly topic: string
  readonly workerId: WorkerId
  readonly dpRank: DpRank
  /** The current incarnation's publisher id. */
  readonly publisherId: Effect.Effect<bigint>
  /** Sends arbitrary frames on the PUB socket (garbage tests). */
  readonly sendRaw: (frames: ReadonlyArray<Uint8Array | string>) => Effect.Effect<void, ZmqError>
  /** Blocks whose address is kept: those held now (tests). */
  readonly addressCount: () => number
}

/** A bound PUB socket of a simulated worker. */
interface SimulatedPub {
  /** The address it bound (the port resolved). */
  readonly endpoint: string
  /** Sends one message, or drops it when a drop is pending (`dropNext`). */
  readonly send: (frames: ReadonlyArray<Uint8Array | string>) => Effect.Effect<void, ZmqError>
  /** The next `count` messages are dropped (a gap on the wire). */
  readonly dropNext: (count?: number) => Effect.Effect<void>
  /** Sends frames whatever is pending (garbage tests). */
  readonly sendRaw: (frames: ReadonlyArray<Uint8Array | string>) => Effect.Effect<void, ZmqError>
  /** Forgets pending drops (a new incarnation). */
  readonly cancelDrops: () => void
  /** Messages sent and dropped so far. */
  readonly counts: () => { readonly sent: number; readonly dropped: number }
}

/** Binds a PUB socket at `endpoint` (default `tcp://127.0.0.1:*`) for the scope's life. */
export const bindSimulatedPub = (
  endpoint: string | undefined
): Effect.Effect<SimulatedPub, ZmqError, Scope.Scope> =>
  Effect.gen(function* () {
    const socket = yield* acquireSocket(
      () => new zmq.Publisher({ sendHighWaterMark: EVENT_HWM, sendTimeout: 0, linger: 0 })
    )
    const bound = yield* bindSocket(socket, endpoint ?? "tcp://127.0.0.1:*")
    let dropping = 0
    let sent = 0
    let dropped = 0
    return {
      endpoint: bound,
      send: (frames) =>
        Effect.suspend(() => {
          if (dropping > 0) {
            dropping--
            dropped++
            return Effect.void
          }
          sent++
          return sendFrames(socket, frames, bound)
        }),
      dropNext: (count = 1) =>
        Effect.sync(() => {
          dropping += count
        }),
      sendRaw: (frames) => sendFrames(socket, frames, bound),
      cancelDrops: () => {
        dropping = 0
      },
      counts: () => ({ sent, dropped })
    }
  })

/** Logs a simulated worker's new incarnation. */
export const logRestart = (
  message: string,
  rank: { readonly workerId: WorkerId; readonly dpRank: DpRank },
  publisherId: bigint
): Effect.Effect<void> =>
  Effect.logInfo(message).pipe(
    Effect.annotateLogs({ workerId: rank.workerId, dpRank: rank.dpRank, publisherId: String(publisherId) })
  )

/** The discovery advertisement of a simulated rank's current incarnation. */
export const advertisement = (
  kvStateEndpoint: EndpointId,
  rank: { readonly workerId: WorkerId; readonly dpRank: DpRank },
  publisherId: bigint,
  transport: KvEventSource["transport"],
  recoveryTarget: KvEventSource["recoveryTarget"]
): KvEventSource => ({
  kvStateEndpoint,
  workerId: rank.workerId,
  dpRank: rank.dpRank,
  publisherId,
  transport,
  recoveryTarget
})
