/**
 * A simulated Dynamo worker rank publishing on the real event plane wire format (PUB, SNDHWM
 * 100000, 4-frame messages, `Vec<RouterEvent>` payloads). Event ids are dense per rank from 1;
 * the envelope carries a random publisher id and a per-publisher sequence from 0. Every event
 * is also recorded in an optional `WorkerQueryServer`, so recovery queries see what was sent.
 *
 * For gap tests a message can be dropped on purpose (its ids and sequence are consumed and the
 * query server records it, but nothing is sent), and the worker can restart with a new
 * publisher id (ids restart at 1, the query server forgets the rank's history).
 */

import { Clock, Effect, type Scope } from "effect"
import type { StorageTier } from "../ckf/events.js"
import { localBlockHashes } from "../ckf/tokens.js"
import { hashPairs } from "../ckf/u64.js"
import type { KvEventSource } from "../protocol/Discovery.js"
import { clearedEvent, type DpRank, type RouterEvent, type WorkerId } from "../protocol/Events.js"
import type { EndpointId } from "../protocol/Model.js"
import { encodeDynamoMessage, KV_EVENT_TOPIC } from "../transport/DynamoZmq.js"
import type { RouterEventEncodeOptions } from "../transport/msgpack.js"
import type { ZmqError } from "../transport/ZmqSocket.js"
import { AddressBook, defaultTokenIds } from "./SimulatedAddresses.js"
import { advertisement, bindSimulatedPub, logRestart, type SimulatedRank } from "./SimulatedPub.js"
import type { WorkerQueryServer } from "./WorkerQueryServer.js"

/** Publisher ids stay JSON-safe (Dynamo masks them to `MAX_JSON_SAFE_PUBLISHER_ID`). */
const MAX_PUBLISHER_ID = 2 ** 53 - 1

/** A random publisher id in 1..2^53 − 1. */
export const randomPublisherId = (): bigint => {
  const hi = Math.floor(Math.random() * 0x20_0000)
  const lo = Math.floor(Math.random() * 4294967296)
  const id = hi * 4294967296 + lo
  return BigInt(id === 0 ? 1 : Math.min(id, MAX_PUBLISHER_ID))
}

/** Block hashes as hash pairs or as numbers. */
export type HashInput = Uint32Array | ReadonlyArray<bigint | number>

/** The hashes as `[hi, lo]` word pairs. */
export const pairsOf = (hashes: HashInput): Uint32Array =>
  hashes instanceof Uint32Array ? hashes : hashPairs(hashes)

interface DynamoZmqPublisherOptions {
  readonly workerId: WorkerId
  readonly dpRank: DpRank
  /** Default `kv-events`. */
  readonly topic?: string
  /** Bind address (default `tcp://127.0.0.1:*`). */
  readonly endpoint?: string
  /** Records every event (sent or dropped) for recovery queries. */
  readonly queryServer?: WorkerQueryServer
  readonly publisherId?: bigint
  /** Variant encoding of the payload (older rmp-serde forms for compatibility tests). */
  readonly encoding?: RouterEventEncodeOptions
  /** Tokens per block behind the default tokens hashes (default 16, as the engine simulator's). */
  readonly blockSize?: number
}

interface StoreOptions {
  readonly parentHash?: bigint
  /** The blocks' local hashes (default: of tokens derived from each block's hash). */
  readonly tokensHashes?: HashInput
  readonly storageTier?: StorageTier
}

/** A simulated Dynamo worker rank on the event plane. */
export interface DynamoZmqPublisher extends SimulatedRank {
  /** The id the next event will get. */
  readonly nextEventId: Effect.Effect<number>
  /** Publishes one message holding `events` as given (ids are the caller's). */
  readonly publish: (events: ReadonlyArray<RouterEvent>) => Effect.Effect<void, ZmqError>
  /** Publishes one Stored event with the next id. */
  readonly store: (hashes: HashInput, options?: StoreOptions) => Effect.Effect<RouterEvent, ZmqError>
  readonly remove: (hashes: HashInput, storageTier?: StorageTier) => Effect.Effect<RouterEvent, ZmqError>
  readonly clear: Effect.Effect<RouterEvent, ZmqError>
  /** The next `count` messages are recorded but not sent (a gap on the wire). */
  readonly dropNext: (count?: number) => Effect.Effect<void>
  /** A new incarnation: new publisher id, sequence 0, ids from 1, the rank's query history reset. */
  readonly restart: (publisherId?: bigint) => Effect.Effect<bigint>
  /** The discovery advertisement of the current incarnation. */
  readonly source: (
    kvStateEndpoint: EndpointId,
    options?: { readonly recoverable?: boolean }
  ) => Effect.Effect<KvEventSource>
  readonly stats: Effect.Effect<{ readonly sent: number; readonly dropped: number }>
  /**
   * The canonical address of a block this worker holds now (chained from its tokens hashes).
   * Only `store`, `remove`, `clear` and `restart` keep it: `publish` and `sendRaw` go around it.
   */
  readonly addressOf: (blockHash: bigint) => bigint
}

/** A simulated Dynamo worker rank bound for the scope's life. */
export const makeDynamoZmqPublisher = (
  options: DynamoZmqPublisherOptions
): Effect.Effect<DynamoZmqPublisher, ZmqError, Scope.Scope> =>
  Effect.gen(function* () {
    const topic = options.topic ?? KV_EVENT_TOPIC
    const pub = yield* bindSimulatedPub(options.endpoint)
    const endpoint = pub.endpoint
    let publisherId = options.publisherId ?? randomPublisherId()
    let sequence = 0
    let nextEventId = 1
    const server = options.queryServer

    const publish = (events: ReadonlyArray<RouterEvent>): Effect.Effect<void, ZmqError> =>
      Effect.gen(function* () {
        if (server !== undefined) for (const event of events) yield* server.record(event)
        const publishedAtMs = yield* Clock.currentTimeMillis
        const frames = encodeDynamoMessage(
          { topic, publisherId, sequence: sequence++, publishedAtMs, events },
          options.encoding
        )
        yield* pub.send(frames)
      })

    const emit = (build: (eventId: number) => RouterEvent): Effect.Effect<RouterEvent, ZmqError> =>
      Effect.suspend(() => {
        const event = build(nextEventId++)
        return publish([event]).pipe(Effect.as(event))
      })

    const addresses = new AddressBook()
    const blockSize = options.blockSize ?? 16

    return {
      addressOf: (hash) => addresses.addressOf(hash),
      addressCount: () => addresses.size,
      endpoint,
      topic,
      workerId: options.workerId,
      dpRank: options.dpRank,
      publisherId: Effect.sync(() => publisherId),
      nextEventId: Effect.sync(() => nextEventId),
      publish,
      store: (hashes, store = {}) =>
        emit((eventId) => {
          const blockHashes = pairsOf(hashes)
          // Without tokens hashes, the blocks' tokens derive from their hashes as on the
          // simulated engines, so both kinds of worker storing the same hashes store one block.
          const tokensHashes =
            store.tokensHashes === undefined
              ? localBlockHashes(defaultTokenIds(blockHashes, blockSize), blockSize)
              : pairsOf(store.tokensHashes)
          const storageTier = store.storageTier ?? "device"
          addresses.record(blockHashes, tokensHashes, store.parentHash, storageTier)
          return {
            workerId: options.workerId,
            dpRank: options.dpRank,
            eventId,
            storageTier,
            data: {
              _tag: "Stored",
              blockHashes,
              tokensHashes,
              parentHash: store.parentHash === undefined ? undefined : hashPairs([store.parentHash]),
              startPosition: undefined
            }
          }
        }),
      remove: (hashes, storageTier = "device") =>
        emit((eventId) => {
          const blockHashes = pairsOf(hashes)
          addresses.forget(blockHashes, storageTier)
          return {
            workerId: options.workerId,
            dpRank: options.dpRank,
            eventId,
            storageTier,
            data: { _tag: "Removed", blockHashes }
          }
        }),
      clear: emit((eventId) => {
        addresses.clear()
        return clearedEvent(options.workerId, options.dpRank, eventId)
      }),
      dropNext: pub.dropNext,
      sendRaw: pub.sendRaw,
      restart: (next) =>
        Effect.gen(function* () {
          publisherId = next ?? randomPublisherId()
          sequence = 0
          nextEventId = 1
          pub.cancelDrops()
          addresses.clear()
          if (server !== undefined) yield* server.resetRank(options.dpRank)
          yield* logRestart("simulated dynamo publisher restarted", options, publisherId)
          return publisherId
        }),
      source: (kvStateEndpoint, sourceOptions = {}) =>
        Effect.sync(() =>
          advertisement(
            kvStateEndpoint,
            options,
            publisherId,
            { kind: "dynamo-zmq", endpoint, topic },
            server !== undefined && (sourceOptions.recoverable ?? true) ? { endpoint: server.endpoint } : null
          )
        ),
      stats: Effect.sync(pub.counts)
    } satisfies DynamoZmqPublisher
  })
