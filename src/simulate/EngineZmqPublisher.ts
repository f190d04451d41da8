/**
 * A simulated vLLM / SGLang engine rank: a PUB sending 3-frame `[topic, seq, payload]` messages
 * (seq from 0) and a replay ROUTER serving its buffer of recent batches (recovery-events B.3–B.4).
 * vLLM encodes tagged maps with unsigned hashes, SGLang tagged arrays with signed hashes.
 *
 * For gap tests a batch can be dropped on the wire (its seq is consumed and it stays in the
 * replay buffer), the buffer can forget old batches (truncated history), and the engine can
 * restart with a new publisher id (seq from 0, empty buffer).
 */

import { Clock, Effect, type Scope } from "effect"
import * as zmq from "zeromq"
import type { StorageTier } from "../ckf/events.js"
import { localBlockHashes } from "../ckf/tokens.js"
import { hashPairs } from "../ckf/u64.js"
import type { KvEventSource } from "../protocol/Discovery.js"
import type { DpRank, WorkerId } from "../protocol/Events.js"
import type { EndpointId } from "../protocol/Model.js"
import { REPLAY_END_SEQ } from "../transport/EngineReplay.js"
import {
  acquireSocket,
  bindSocket,
  receiveFrames,
  sendFrames,
  u64FrameOf,
  u64FrameValue,
  type ZmqError
} from "../transport/ZmqSocket.js"
import { type HashInput, pairsOf, randomPublisherId } from "./DynamoZmqPublisher.js"
import {
  type EngineEvent,
  type EngineFormat,
  encodeEngineBatch,
  mediumOfTier,
  SGLANG_FORMAT,
  VLLM_FORMAT
} from "./EngineBatchEncoder.js"
import { AddressBook, defaultTokenIds } from "./SimulatedAddresses.js"
import { advertisement, bindSimulatedPub, logRestart, type SimulatedRank } from "./SimulatedPub.js"

interface EngineZmqPublisherOptions {
  readonly workerId: WorkerId
  readonly dpRank: DpRank
  /** `vllm`, `sglang` or an explicit format. */
  readonly format: "vllm" | "sglang" | EngineFormat
  /** Frame-0 topic (engines default to ""). */
  readonly topic?: string
  /** PUB bind address (default `tcp://127.0.0.1:*`). */
  readonly endpoint?: string
  /** Replay ROUTER bind address (default `tcp://127.0.0.1:*`); null = no replay endpoint. */
  readonly replayEndpoint?: string | null
  /** Batches kept for replay (`buffer_steps`, default 10000). */
  readonly bufferSteps?: number
  readonly publisherId?: bigint
  /** Tokens per block in BlockStored events (default 16). */
  readonly blockSize?: number
  /** Write the batch rank (default true; false gives the 2-element `[ts, events]` batch). */
  readonly includeRank?: boolean
  /**
   * Replay reply framing: `"seq"` `[empty, seq, payload]` (SGLang, vLLM before mid-2026, the
   * default) or `"topic"` `[empty, topic, seq, payload]` (current vLLM, also on the end marker).
   */
  readonly replayFraming?: "seq" | "topic"
  /** The replay ROUTER takes requests and never answers (an engine stuck mid-replay). */
  readonly silentReplay?: boolean
}

interface EngineStoreOptions {
  readonly parentHash?: bigint
  /** The blocks' token ids (default: derived from each block's hash, see `defaultTokenIds`). */
  readonly tokenIds?: ReadonlyArray<number>
  /** The LoRA adapter the blocks belong to (vLLM's `lora_name`, with a `lora_id`). */
  readonly loraName?: string
  readonly medium?: string | null
  readonly storageTier?: StorageTier
}

/** A simulated vLLM or SGLang engine rank with its replay endpoint. */
export interface EngineZmqPublisher extends SimulatedRank {
  readonly replayEndpoint: string | null
  readonly format: EngineFormat
  /** The seq the next batch will get. */
  readonly nextSeq: Effect.Effect<number>
  /** Publishes one batch; returns its seq. */
  readonly publish: (events: ReadonlyArray<EngineEvent>) => Effect.Effect<number, ZmqError>
  /** Publishes an already encoded batch payload under the next seq (kept for replay as well). */
  readonly publishPayload: (payload: Uint8Array) => Effect.Effect<number, ZmqError>
  readonly store: (hashes: HashInput, options?: EngineStoreOptions) => Effect.Effect<number, ZmqError>
  readonly remove: (hashes: HashInput, medium?: string | null) => Effect.Effect<number, ZmqError>
  /**
   * Copies blocks this worker holds to a lower tier as vLLM's offloading connector announces it:
   * a `BlockStored` with `medium` (default `"CPU"`), no tokens and no parent, named by the blocks'
   * hashes alone (PROTOCOL §5.1 ◆3). Remove them with `remove(hashes, medium)`.
   */
  readonly offload: (hashes: HashInput, medium?: string) => Effect.Effect<number, ZmqError>
  readonly clear: Effect.Effect<number, ZmqError>
  /** The next `count` batches are buffered for replay but not sent. */
  readonly dropNext: (count?: number) => Effect.Effect<void>
  /** Forgets buffered batches with seq < `seq` (a replay then starts later: truncated history). */
  readonly forgetBefore: (seq: number) => Effect.Effect<void>
  /** A new incarnation: new publisher id, seq from 0, empty replay buffer. */
  readonly restart: (publisherId?: bigint) => Effect.Effect<bigint>
  readonly source: (kvStateEndpoint: EndpointId) => Effect.Effect<KvEventSource>
  readonly stats: Effect.Effect<{ readonly sent: number; readonly dropped: number; readonly replays: number }>
  /**
   * The canonical address of a block this worker holds now (what a router computes from its
   * tokens). Only `store`, `remove`, `clear` and `restart` keep it: `publish`, `publishPayload`
   * and `sendRaw` go around it.
   */
  readonly addressOf: (blockHash: bigint) => bigint
  /** Batches kept for replay (at most `bufferSteps`; tests). */
  readonly bufferedBatches: () => number
}

/** The tier a medium stands for: the device is "GPU" or no medium at all (PROTOCOL §3.2). */
const tierOfMedium = (medium: string | null): string =>
  medium === null || medium === "GPU" ? "device" : medium

const formatOf = (format: EngineZmqPublisherOptions["format"]): EngineFormat =>
  format === "vllm" ? VLLM_FORMAT : format === "sglang" ? SGLANG_FORMAT : format

/** A simulated engine rank bound for the scope's life. */
export const makeEngineZmqPublisher = (
  options: EngineZmqPublisherOptions
): Effect.Effect<EngineZmqPublisher, ZmqError, Scope.Scope> =>
  Effect.gen(function* () {
    const format = formatOf(options.format)
    const topic = options.topic ?? ""
    const bufferSteps = options.bufferSteps ?? 10_000
    const blockSize = options.blockSize ?? 16
    const pub = yield* bindSimulatedPub(options.endpoint)
    const endpoint = pub.endpoint
    let publisherId = options.publisherId ?? randomPublisherId()
    let seq = 0
    let replays = 0
    // (seq, payload) in seq order, at most `bufferSteps` entries.
    let buffer: Array<{ readonly seq: number; readonly payload: Uint8Array }> = []

    let replayEndpoint: string | null = null
    if (options.replayEndpoint !== null) {
      const router = yield* acquireSocket(() => new zmq.Router({ linger: 0 }))
      replayEndpoint = yield* bindSocket(router, options.replayEndpoint ?? "tcp://127.0.0.1:*")
      const boundReplay = replayEndpoint
      const serve = (frames: Array<Buffer>): Effect.Effect<void, ZmqError> =>
        Effect.gen(function* () {
          if (frames.length !== 3 || frames[2]!.length !== 8) {
            yield* Effect.logWarning("ignoring a replay request of unexpected shape").pipe(
              Effect.annotateLogs({ endpoint: boundReplay, frames: frames.length })
            )
            return
          }
          replays++
          if (options.silentReplay === true) return
          const identity = frames[0]!
          const start = u64FrameValue(frames[2]!)
          const empty = Buffer.alloc(0)
          const head: ReadonlyArray<Buffer> =
            options.replayFraming === "topic"
              ? [identity, empty, Buffer.from(topic, "utf8")]
              : [identity, empty]
          // Snapshot first: batches published while the replay is being sent are live traffic.
          const snapshot = buffer.filter((entry) => start >= 0 && entry.seq >= start)
          for (const entry of snapshot) {
            yield* sendFrames(router, [...head, u64FrameOf(entry.seq), entry.payload], boundReplay)
          }
          yield* sendFrames(router, [...head, REPLAY_END_SEQ, empty], boundReplay)
        })
      yield* receiveFrames(router, boundReplay).pipe(
        Effect.flatMap(serve),
        Effect.forever,
        Effect.catchAll(() => Effect.void),
        Effect.forkScoped
      )
    }

    const publishPayload = (payload: Uint8Array): Effect.Effect<number, ZmqError> =>
      Effect.gen(function* () {
        const batchSeq = seq++
        buffer.push({ seq: batchSeq, payload })
        if (buffer.length > bufferSteps) buffer.shift()
        yield* pub.send([Buffer.from(topic, "utf8"), u64FrameOf(batchSeq), payload])
        return batchSeq
      })

    const publish = (events: ReadonlyArray<EngineEvent>): Effect.Effect<number, ZmqError> =>
      Effect.flatMap(Clock.currentTimeMillis, (now) =>
        publishPayload(
          encodeEngineBatch(
            { ts: now / 1000, events, dpRank: options.includeRank === false ? undefined : options.dpRank },
            format
          )
        )
      )

    const addresses = new AddressBook()

    return {
      addressOf: (hash) => addresses.addressOf(hash),
      addressCount: () => addresses.size,
      bufferedBatches: () => buffer.length,
      endpoint,
      replayEndpoint,
      topic,
      workerId: options.workerId,
      dpRank: options.dpRank,
      format,
      publisherId: Effect.sync(() => publisherId),
      nextSeq: Effect.sync(() => seq),
      publish,
      publishPayload,
      store: (hashes, store = {}) => {
        const blockHashes = pairsOf(hashes)
        const tokenIds = store.tokenIds ?? defaultTokenIds(blockHashes, blockSize)
        // vLLM always writes a medium ("GPU" for the device); older SGLang writes none for it.
        const explicit =
          store.medium !== undefined ? store.medium : mediumOfTier(store.storageTier ?? "device")
        const medium = explicit ?? (format.medium ? "GPU" : null)
        addresses.record(
          blockHashes,
          localBlockHashes(tokenIds, blockSize, { loraName: store.loraName }),
          store.parentHash,
          tierOfMedium(medium)
        )
        return publish([
          {
            type: "BlockStored",
            blockHashes,
            parentBlockHash: store.parentHash === undefined ? undefined : hashPairs([store.parentHash]),
            tokenIds,
            blockSize,
            loraId: store.loraName === undefined ? null : 1,
            loraName: store.loraName ?? null,
            medium
          }
        ])
      },
      remove: (hashes, removeMedium) =>
        Effect.suspend(() => {
          const blockHashes = pairsOf(hashes)
          const medium = removeMedium !== undefined ? removeMedium : format.medium ? "GPU" : null
          addresses.forget(blockHashes, tierOfMedium(medium))
          return publish([{ type: "BlockRemoved", blockHashes, medium }])
        }),
      offload: (hashes, medium = "CPU") =>
        publish([
          {
            type: "BlockStored",
            blockHashes: pairsOf(hashes),
            parentBlockHash: undefined,
            tokenIds: [],
            blockSize,
            loraId: null,
            loraName: null,
            medium
          }
        ]),
      clear: Effect.suspend(() => {
        addresses.clear()
        return publish([{ type: "AllBlocksCleared" }])
      }),
      dropNext: pub.dropNext,
      forgetBefore: (from) =>
        Effect.sync(() => {
          buffer = buffer.filter((entry) => entry.seq >= from)
        }),
      sendRaw: pub.sendRaw,
      restart: (next) =>
        Effect.gen(function* () {
          publisherId = next ?? randomPublisherId()
          seq = 0
          pub.cancelDrops()
          buffer = []
          addresses.clear()
          yield* logRestart("simulated engine restarted", options, publisherId)
          return publisherId
        }),
      source: (kvStateEndpoint) =>
        Effect.sync(() =>
          advertisement(
            kvStateEndpoint,
            options,
            publisherId,
            { kind: "engine-zmq", endpoint, topic, replayEndpoint },
            null
          )
        ),
      stats: Effect.sync(() => ({ ...pub.counts(), replays }))
    } satisfies EngineZmqPublisher
  })
