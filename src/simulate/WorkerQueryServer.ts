/**
 * The worker side of the worker-query protocol (PROTOCOL.md §4, recovery-events.md §4.3–§4.4):
 * a ROUTER bound on an endpoint answering `[identity, empty, request]` with
 * `[identity, empty, response]`. Per rank it keeps a ring of the last 1024 published events and
 * the rank's device-tier block state (stored minus removed, reset by a clear), from which it
 * builds tree dumps: cached, extended with a short Stored/Removed tail, single-flight.
 *
 * Used by the demo and the tests as a real peer; the test switches make it fail tree dumps,
 * delay them, or stop answering.
 */

import { Deferred, Duration, Effect, FiberSet, type Scope } from "effect"
import * as zmq from "zeromq"
import type { StorageTier } from "../ckf/events.js"
import type { DpRank, RouterEvent, WorkerId } from "../protocol/Events.js"
import type { WorkerKvQueryRequest, WorkerKvQueryResponse } from "../recovery/WorkerQuery.js"
import { decodeWorkerQueryRequest, encodeWorkerQueryResponse } from "../transport/msgpack.js"
import {
  acquireSocket,
  bindSocket,
  receiveFrames,
  sendFrames,
  type ZmqError
} from "../transport/ZmqSocket.js"

/** `WORKER_KV_INDEXER_BUFFER_SIZE`. */
export const WORKER_RING_SIZE = 1024
/** Blocks per synthetic tree-dump event (a chain is split into events of at most this many). */
const TREE_DUMP_BLOCKS_PER_EVENT = 256

// ---------------------------------------------------------------------------------------------
// Block ledger: the stored-minus-removed block set of one rank, in first-stored order

interface LedgerEntry {
  readonly hi: number
  readonly lo: number
  tokHi: number
  tokLo: number
  /** Key of the block this one chains from, or "" at the root. */
  parent: string
}

const keyOf = (hi: number, lo: number): string => `${hi}:${lo}`

/** Lower tiers a ledger keeps beside the device (PROTOCOL §5.1 ◆3), in the order dumps list them. */
const LOWER_TIERS: ReadonlyArray<StorageTier> = ["host_pinned", "disk", "external"]

/**
 * The blocks a rank holds after a sequence of events, per storage tier. `size` and `has` are the
 * device tier's (what the filter holds); the lower tiers are kept so that a tree dump carries
 * them too, as a rank replacement keeps them (PROTOCOL §5.1 ◆3).
 */
export class BlockLedger {
  private readonly blocks = new Map<string, LedgerEntry>()
  private readonly lower = new Map<StorageTier, Map<string, LedgerEntry>>()

  get size(): number {
    return this.blocks.size
  }

  /** Blocks held on a lower tier (tests). */
  lowerSize(tier: StorageTier): number {
    return this.lower.get(tier)?.size ?? 0
  }

  clear(): void {
    this.blocks.clear()
    this.lower.clear()
  }

  private tierMap(tier: StorageTier): Map<string, LedgerEntry> {
    if (tier === "device") return this.blocks
    let map = this.lower.get(tier)
    if (map === undefined) {
      map = new Map()
      this.lower.set(tier, map)
    }
    return map
  }

  apply(event: RouterEvent): void {
    const data = event.data
    if (data._tag === "Cleared") {
      this.clear()
      return
    }
    const blocks = this.tierMap(event.storageTier)
    const hashes = data.blockHashes
    if (data._tag === "Removed") {
      for (let i = 0; i + 1 < hashes.length; i += 2) blocks.delete(keyOf(hashes[i]!, hashes[i + 1]!))
      return
    }
    const tokens = data.tokensHashes ?? hashes
    let parent = data.parentHash === undefined ? "" : keyOf(data.parentHash[0]!, data.parentHash[1]!)
    for (let i = 0; i + 1 < hashes.length; i += 2) {
      const hi = hashes[i]!
      const lo = hashes[i + 1]!
      const key = keyOf(hi, lo)
      const existing = blocks.get(key)
      if (existing === undefined) {
        blocks.set(key, { hi, lo, tokHi: tokens[i]!, tokLo: tokens[i + 1]!, parent })
      } else {
        existing.tokHi = tokens[i]!
        existing.tokLo = tokens[i + 1]!
        existing.parent = parent
      }
      parent = key
    }
  }

  /** Whether the ledger holds a block on the device (tests). */
  has(hi: number, lo: number): boolean {
    return this.blocks.has(keyOf(hi, lo))
  }

  /**
   * Synthetic Stored events with ids from 0: the device tier's first, then each lower tier's.
   * Consecutive blocks that chain form one event (at most 256 blocks), so parents come before
   * their children as they were stored. A lower-tier block whose parent the dump holds nowhere
   * (its chain was evicted from every tier) is left out, with the blocks chained from it: a
   * replacement could not address it.
   */
  dump(workerId: WorkerId, dpRank: DpRank): Array<RouterEvent> {
    const events: Array<RouterEvent> = []
    const present = new Set<string>(this.blocks.keys())
    const emit = (tier: StorageTier, entries: Iterable<[string, LedgerEntry]>, check: boolean) => {
      let run: Array<LedgerEntry> = []
      let previous = ""
      const flush = () => {
        if (run.length === 0) return
        const blockHashes = new Uint32Array(2 * run.length)
        const tokensHashes = new Uint32Array(2 * run.length)
        run.forEach((entry, i) => {
          blockHashes[2 * i] = entry.hi
          blockHashes[2 * i + 1] = entry.lo
          tokensHashes[2 * i] = entry.tokHi
          tokensHashes[2 * i + 1] = entry.tokLo
        })
        const first = run[0]!
        const [phi, plo] = first.parent === "" ? [0, 0] : first.parent.split(":").map(Number)
        events.push({
          workerId,
          dpRank,
          eventId: events.length,
          storageTier: tier,
          data: {
            _tag: "Stored",
            blockHashes,
            tokensHashes,
            parentHash: first.parent === "" ? undefined : Uint32Array.of(phi!, plo!),
            startPosition: undefined
          }
        })
        run = []
      }
      for (const [key, entry] of entries) {
        if (check && entry.parent !== "" && !present.has(entry.parent)) continue
        if (run.length > 0 && (entry.parent !== previous || run.length >= TREE_DUMP_BLOCKS_PER_EVENT)) flush()
        run.push(entry)
        previous = key
        present.add(key)
      }
      flush()
    }
    emit("device", this.blocks, false)
    for (const tier of LOWER_TIERS) {
      const map = this.lower.get(tier)
      if (map !== undefined && map.size > 0) emit(tier, map, true)
    }
    return events
  }
}

// ---------------------------------------------------------------------------------------------
// One rank's local indexer: ring + ledger + dump cache

interface CachedDump {
  readonly generation: number
  events: Array<RouterEvent>
  /** Ring id the dump was built at. */
  readonly baseLastEventId: number
  lastEventId: number
}

class RankIndexer {
  private readonly ring: Array<RouterEvent> = []
  private head = 0
  readonly ledger = new BlockLedger()
  generation = 0
  cache: CachedDump | undefined
  building: Deferred.Deferred<void> | undefined
  gaps = 0
  /** One heavy dump at a time per rank (worker_query_endpoint's processing semaphore). */
  readonly dumpPermit = Effect.unsafeMakeSemaphore(1)

  constructor(
    readonly workerId: WorkerId,
    readonly dpRank: DpRank,
    private readonly capacity: number
  ) {}

  get length(): number {
    return this.ring.length
  }
  at(i: number): RouterEvent {
    return this.ring[(this.head + i) % this.ring.length]!
  }
  get first(): RouterEvent | undefined {
    return this.ring.length === 0 ? undefined : this.at(0)
  }
  get last(): RouterEvent | undefined {
    return this.ring.length === 0 ? undefined : this.at(this.ring.length - 1)
  }

  record(event: RouterEvent): void {
    this.ledger.apply(event)
    const previous = this.last
    if (this.ring.length < this.capacity) this.ring.push(event)
    else {
      this.ring[this.head] = event
      this.head = (this.head + 1) % this.capacity
    }
    const gap = previous !== undefined && event.eventId !== previous.eventId + 1
    if (gap) this.gaps++
    if (event.data._tag === "Cleared" || gap) this.invalidate()
  }

  reset(): void {
    this.ring.length = 0
    this.head = 0
    this.ledger.clear()
    this.invalidate()
  }

  invalidate(): void {
    this.generation++
    this.cache = undefined
  }

  /** Index of the first ring event with id ≥ `id` (the ring is ordered by id). */
  indexOf(id: number): number {
    let lo = 0
    let hi = this.ring.length
    while (lo < hi) {
      const mid = (lo + hi) >>> 1
      if (this.at(mid).eventId < id) lo = mid + 1
      else hi = mid
    }
    return lo
  }

  slice(from: number): Array<RouterEvent> {
    const out: Array<RouterEvent> = []
    for (let i = from; i < this.ring.length; i++) out.push(this.at(i))
    return out
  }
}

// ---------------------------------------------------------------------------------------------
// Server

interface WorkerQueryServerOptions {
  readonly workerId: WorkerId
  /** Ranks served from the start; a rank also becomes served when an event of it is recorded. */
  readonly dpRanks?: ReadonlyArray<DpRank>
  /** Bind address (default `tcp://127.0.0.1:*`, a free port). */
  readonly endpoint?: string
  /** Ring size per rank (default 1024). */
  readonly bufferSize?: number
}

interface WorkerQueryServerStats {
  readonly requests: number
  readonly unanswered: number
  readonly dumpsBuilt: number
  readonly dumpCacheHits: number
  readonly dumpExtensions: number
  readonly responses: Readonly<Record<WorkerKvQueryResponse["_tag"], number>>
}

/** A simulated worker's query endpoint, answering from the events its publishers recorded. */
export interface WorkerQueryServer {
  /** The bound endpoint (`tcp://127.0.0.1:PORT`). */
  readonly endpoint: string
  readonly workerId: WorkerId
  /** Appends a published event to its rank's ring and applies it to the rank's block state. */
  readonly record: (event: RouterEvent) => Effect.Effect<void>
  /** Forgets a rank's history (its publisher restarted). */
  readonly resetRank: (dpRank: DpRank) => Effect.Effect<void>
  /** Test switch: tree dumps fail with this message (undefined = succeed). */
  readonly setTreeDumpFailure: (message: string | undefined) => Effect.Effect<void>
  /** Test switch: requests are received and never answered. */
  readonly setUnresponsive: (unresponsive: boolean) => Effect.Effect<void>
  /** Test switch: every tree dump reply is sent this long after it was computed (one at a time per rank). */
  readonly setDumpDelay: (delay: Duration.DurationInput) => Effect.Effect<void>
  /** Answers a request directly, without the socket (tests and in-process use). */
  readonly answer: (request: WorkerKvQueryRequest) => Effect.Effect<WorkerKvQueryResponse>
  readonly stats: Effect.Effect<WorkerQueryServerStats>
  /** The blocks a rank holds now, as its tree dump would list them (tests). */
  readonly ledger: (dpRank: DpRank) => BlockLedger | undefined
  /** Events a rank's ring keeps now (at most `bufferSize`; tests). */
  readonly ringLength: (dpRank: DpRank) => number
}

const DUMP_EXTENSION_BUDGET_DIVISOR = 2

/** A worker query server bound for the scope's life. */
export const makeWorkerQueryServer = (
  options: WorkerQueryServerOptions
): Effect.Effect<WorkerQueryServer, ZmqError, Scope.Scope> =>
  Effect.gen(function* () {
    const capacity = options.bufferSize ?? 1024
    const ranks = new Map<DpRank, RankIndexer>()
    const rankOf = (dpRank: DpRank): RankIndexer => {
      let rank = ranks.get(dpRank)
      if (rank === undefined) {
        rank = new RankIndexer(options.workerId, dpRank, capacity)
        ranks.set(dpRank, rank)
      }
      return rank
    }
    for (const dpRank of options.dpRanks ?? []) rankOf(dpRank)

    let treeDumpFailure: string | undefined
    let unresponsive = false
    let dumpDelay: Duration.Duration = Duration.zero
    const counters = {
      requests: 0,
      unanswered: 0,
      dumpsBuilt: 0,
      dumpCacheHits: 0,
      dumpExtensions: 0,
      responses: { Events: 0, TreeDump: 0, TreeDumpFailed: 0, TooNew: 0, InvalidRange: 0, Error: 0 }
    }
    /** A tree dump: the cached one when still exact or safely extendable, else a fresh build. */
    const treeDump = (
      rank: RankIndexer
    ): Effect.Effect<{ events: Array<RouterEvent>; lastEventId: number }> =>
      Effect.suspend(() => {
        const tail = rank.last?.eventId ?? 0
        const cache = rank.cache
        if (cache !== undefined && cache.generation === rank.generation) {
          if (tail <= cache.lastEventId) {
            counters.dumpCacheHits++
            return Effect.succeed({ events: cache.events, lastEventId: cache.lastEventId })
          }
          const first = rank.first?.eventId ?? 0
          const appended = tail - cache.baseLastEventId
          if (appended <= capacity / DUMP_EXTENSION_BUDGET_DIVISOR && cache.lastEventId + 1 >= first) {
            const extension = rank.slice(rank.indexOf(cache.lastEventId + 1))
            if (extension.every((event) => event.data._tag !== "Cleared")) {
              cache.events = [...cache.events, ...extension]
              cache.lastEventId = tail
              counters.dumpExtensions++
              return Effect.succeed({ events: cache.events, lastEventId: tail })
            }
          }
          rank.cache = undefined
        }
        const inFlight = rank.building
        if (inFlight !== undefined) return Deferred.await(inFlight).pipe(Effect.zipRight(treeDump(rank)))
        return Effect.gen(function* () {
          const done = yield* Deferred.make<void>()
          rank.building = done
          const generation = rank.generation
          const lastEventId = rank.last?.eventId ?? 0
          const events = rank.ledger.dump(rank.workerId, rank.dpRank)
          counters.dumpsBuilt++
          if (generation === rank.generation) {
            rank.cache = { generation, events, baseLastEventId: lastEventId, lastEventId }
          }
          return { events, lastEventId }
        }).pipe(
          Effect.ensuring(
            Effect.suspend(() => {
              const done = rank.building
              rank.building = undefined
              return done === undefined ? Effect.void : Deferred.succeed(done, undefined)
            })
          )
        )
      })

    const dumpResponse = (
      rank: RankIndexer,
      request: WorkerKvQueryRequest
    ): Effect.Effect<WorkerKvQueryResponse> =>
      Effect.suspend((): Effect.Effect<WorkerKvQueryResponse> => {
        if (treeDumpFailure !== undefined) {
          const lastEventId = rank.last?.eventId ?? 0
          const message = treeDumpFailure
          return Effect.succeed(
            request.supportsTreeDumpFailed
              ? { _tag: "TreeDumpFailed", lastEventId, message }
              : { _tag: "Error", message: `worker tree dump failed: ${message}` }
          )
        }
        return treeDump(rank).pipe(
          Effect.map(
            ({ events, lastEventId }): WorkerKvQueryResponse => ({ _tag: "TreeDump", events, lastEventId })
          ),
          // A slow dump as the client sees it: the answer (and its watermark) is fixed, the reply late.
          Effect.tap(() =>
            Duration.greaterThan(dumpDelay, Duration.zero) ? Effect.sleep(dumpDelay) : Effect.void
          )
        )
      }).pipe(rank.dumpPermit.withPermits(1))

    /** §4.4 query classification. */
    const answer = (request: WorkerKvQueryRequest): Effect.Effect<WorkerKvQueryResponse> =>
      Effect.suspend((): Effect.Effect<WorkerKvQueryResponse> => {
        const rank = request.workerId === options.workerId ? ranks.get(request.dpRank) : undefined
        if (rank === undefined) {
          return Effect.succeed({
            _tag: "Error",
            message: `worker query mismatch: request for worker ${request.workerId} rank ${request.dpRank}, this endpoint serves worker ${options.workerId} ranks [${[...ranks.keys()].join(", ")}]`
          })
        }
        const start = request.startEventId
        const end = request.endEventId
        if (start !== undefined && end !== undefined && end < start)
          return Effect.succeed({ _tag: "InvalidRange", startId: start, endId: end })
        if (start === undefined) return dumpResponse(rank, request)
        const last = rank.last
        if (last === undefined) return dumpResponse(rank, request)
        if (start > last.eventId)
          return Effect.succeed({
            _tag: "TooNew",
            requestedStart: start,
            requestedEnd: end ?? last.eventId,
            newestAvailable: last.eventId
          })
        if (start < rank.first!.eventId) return dumpResponse(rank, request)
        let from = rank.indexOf(start)
        // Everything before the latest clear in the span can be left out.
        for (let i = rank.length - 1; i >= from; i--) {
          if (rank.at(i).data._tag === "Cleared") {
            from = i
            break
          }
        }
        return Effect.succeed({ _tag: "Events", events: rank.slice(from), lastEventId: last.eventId })
      }).pipe(
        Effect.tap((response) => Effect.sync(() => counters.responses[response._tag]++)),
        Effect.withSpan("WorkerQueryServer.answer", {
          attributes: {
            workerId: request.workerId,
            dpRank: request.dpRank,
            startEventId: request.startEventId ?? "dump"
          }
        })
      )

    const socket = yield* acquireSocket(() => new zmq.Router({ linger: 0 }))
    const endpoint = yield* bindSocket(socket, options.endpoint ?? "tcp://127.0.0.1:*")
    const handlers = yield* FiberSet.make()

    const handle = (frames: Array<Buffer>): Effect.Effect<void> =>
      Effect.gen(function* () {
        // [identity, empty, request] from a DEALER; tolerate a peer that skips the delimiter.
        if (frames.length !== 3 && frames.length !== 2) {
          yield* Effect.logWarning("ignoring a worker query of unexpected shape").pipe(
            Effect.annotateLogs({ endpoint, frames: frames.length })
          )
          return
        }
        counters.requests++
        if (unresponsive) {
          counters.unanswered++
          return
        }
        const identity = frames[0]!
        const body = frames[frames.length - 1]!
        const decoded = decodeWorkerQueryRequest(body)
        let response: WorkerKvQueryResponse
        if (!decoded.ok) {
          response = { _tag: "Error", message: `undecodable worker query request: ${decoded.message}` }
          counters.responses.Error++
        } else if (decoded.value.kind !== undefined && decoded.value.kind !== "recovery") {
          response = {
            _tag: "Error",
            message: `unsupported worker query kind ${JSON.stringify(decoded.value.kind)}`
          }
          counters.responses.Error++
        } else response = yield* answer(decoded.value)
        const reply = encodeWorkerQueryResponse(response)
        yield* sendFrames(
          socket,
          frames.length === 3 ? [identity, Buffer.alloc(0), reply] : [identity, reply],
          endpoint
        ).pipe(
          Effect.catchAll((error) =>
            Effect.logWarning("worker query reply not sent").pipe(
              Effect.annotateLogs({ endpoint, error: error.message })
            )
          )
        )
      })

    yield* receiveFrames(socket, endpoint).pipe(
      Effect.flatMap((frames) => FiberSet.run(handlers, handle(frames))),
      Effect.forever,
      Effect.catchAll(() => Effect.void),
      Effect.forkScoped
    )
    yield* Effect.logDebug("worker query server listening").pipe(
      Effect.annotateLogs({ endpoint, workerId: options.workerId })
    )

    return {
      endpoint,
      workerId: options.workerId,
      record: (event) => Effect.sync(() => rankOf(event.dpRank).record(event)),
      resetRank: (dpRank) => Effect.sync(() => rankOf(dpRank).reset()),
      setTreeDumpFailure: (message) =>
        Effect.sync(() => {
          treeDumpFailure = message
        }),
      setUnresponsive: (value) =>
        Effect.sync(() => {
          unresponsive = value
        }),
      setDumpDelay: (delay) =>
        Effect.sync(() => {
          dumpDelay = Duration.decode(delay)
        }),
      answer,
      stats: Effect.sync(() => ({ ...counters, responses: { ...counters.responses } })),
      ledger: (dpRank) => ranks.get(dpRank)?.ledger,
      ringLength: (dpRank) => ranks.get(dpRank)?.length ?? 0
    } satisfies WorkerQueryServer
  })
