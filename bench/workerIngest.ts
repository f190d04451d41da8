/**
 * Worker-thread ingest layouts (issue "The service as fast as its core", "Past one core").
 *
 * 4 pools, each fed by 2 simulated Dynamo workers: PUB sockets in a forked child process (so the
 * relay side's threads get the two cores' share a relay would), sending pre-encoded 8-block
 * Stored batches in the real Dynamo 4-frame format as fast as they can. The relay side is built
 * from the relay's own parts in every layout: `subscribeDynamo` (ZmqSocket's SUB receive loop and
 * the Dynamo decoder), a `PoolActor` over a `CanonicalCkfState` per pool with one drained
 * subscription, and every delta encoded to CBI1 as the publication hub does. Layouts:
 *
 *   a          one thread: receive + decode + apply + CBI1 for all 4 pools (today's relay)
 *   b-clone    receive + decode on one worker thread; decoded RouterEvents posted to the main
 *              thread by structured clone (one post per 64 messages or event-loop turn); apply there
 *   b-transfer as b-clone, but the worker packs the events into one Uint32Array and transfers it
 *   c          whole pools on 2 workers (2 pools each): receive + decode + apply + CBI1 there;
 *              the main thread only collects the CBI1 delta bytes (transferred), as HTTP would
 *
 * Measured per round: blocks/s end to end (from "go" to the last pool's final flush), relay
 * process CPU per event (`process.cpuUsage`, all threads), each thread's event-loop utilisation,
 * and the publisher child's send time (to show the publishers were not the bottleneck). Rounds
 * alternate the layouts; medians are reported, with ratios against layout a.
 */

import { type ChildProcess, spawn } from "node:child_process"
import { writeFileSync } from "node:fs"
import { createRequire } from "node:module"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { performance } from "node:perf_hooks"
import { isMainThread, parentPort, Worker, workerData } from "node:worker_threads"
import { Effect, Exit, Queue, Scope } from "effect"
import { CanonicalCkfState } from "../src/ckf/canonical.js"
import { Cbi1Error, type Cbi1Expected, encodeCbi1Delta } from "../src/ckf/cbi1.js"
import { ckfConfig } from "../src/ckf/config.js"
import {
  CacheSemanticsId,
  DcId,
  IndexerDomainId,
  LaneLease,
  PoolId,
  RoutingScopeId
} from "../src/ckf/identity.js"
import type { RouterEvent } from "../src/protocol/Events.js"
import { make } from "../src/relay/internal/PoolActorLoop.js"
import type { PoolActor } from "../src/relay/PoolActor.js"
import { DEFAULT_EXPECTED_UNIQUE_BLOCKS, DEFAULT_PUBLICATION_THRESHOLD } from "../src/relay/RelayHost.js"
import { randomPublisherId } from "../src/simulate/DynamoZmqPublisher.js"
import { encodeDynamoMessage, KV_EVENT_TOPIC, subscribeDynamo } from "../src/transport/DynamoZmq.js"
import type { IngestMessage } from "../src/transport/ZmqSocket.js"
import { type BenchContext, HashStream, record, threadCpuSeconds } from "./harness.js"

const ROLE = "kvrelay-bench-worker-ingest"
const POOLS = 4
const PUBLISHERS_PER_POOL = 2
const BLOCKS_PER_MESSAGE = 8
/** Messages a worker batches into one post at most (it also posts once per event-loop turn). */
const POST_BATCH = 64

type Layout = "a" | "b-clone" | "b-transfer" | "c"
const ALL_LAYOUTS: ReadonlyArray<Layout> = ["a", "b-clone", "b-transfer", "c"]
/** `KVRELAY_BENCH_WORKER_LAYOUTS=a,c` runs only those (for profiling one layout); a always runs. */
const LAYOUTS: ReadonlyArray<Layout> = ALL_LAYOUTS.filter(
  (layout) =>
    layout === "a" ||
    process.env.KVRELAY_BENCH_WORKER_LAYOUTS === undefined ||
    process.env.KVRELAY_BENCH_WORKER_LAYOUTS.split(",").includes(layout)
)

// ---------------------------------------------------------------------------------------------
// The relay side's pieces, shared by the main thread and the workers

const lease = new LaneLease(4n, 0, 1n)
const poolIdOf = (pool: number): PoolId =>
  new PoolId(
    new IndexerDomainId(
      new CacheSemanticsId(new Uint8Array(16).fill(1 + pool), "explicit"),
      new RoutingScopeId(new Uint8Array(16).fill(3), "explicit")
    ),
    new DcId(2n)
  )

interface PoolUnit {
  readonly actor: PoolActor
  /** Admits the batch's events in order; the actor's mailbox bounds it. */
  readonly admit: (events: ReadonlyArray<RouterEvent>) => Effect.Effect<void>
  /** Distinct blocks the pool's CKF holds: every layout must end with all of them. */
  readonly uniqueBlocks: () => number
}

/**
 * A pool as the relay runs it: an actor over a canonical CKF, one subscription drained by a fiber
 * that encodes every delta to CBI1 (the hub's work per delta) and hands the bytes to `onDelta`.
 */
const makePoolUnit = (
  pool: number,
  expectedBlocks: number,
  onDelta: (bytes: Uint8Array) => void
): Effect.Effect<PoolUnit, never, Scope.Scope> =>
  Effect.gen(function* () {
    // The relay's defaults: a table sized for its default expected blocks (or the workload when
    // larger), a publication every 16 events.
    const state = new CanonicalCkfState(
      ckfConfig(Math.max(expectedBlocks, DEFAULT_EXPECTED_UNIQUE_BLOCKS), {
        publishEveryNEvents: DEFAULT_PUBLICATION_THRESHOLD
      })
    )
    const actor = yield* make(state, { relayIncarnation: 1n, layoutGeneration: 1n, poolId: poolIdOf(pool) })
    const { deltas } = yield* Effect.orDie(actor.subscribe(lease))
    const expected: Cbi1Expected = { format: actor.identity.format, dcId: actor.identity.poolId.dcId.value }
    yield* Effect.forkScoped(
      Effect.gen(function* () {
        for (;;) {
          const delta = yield* deltas.take
          const bytes = encodeCbi1Delta(expected, delta.baseSequence, delta.sequence, delta.images)
          if (bytes instanceof Cbi1Error) return yield* Effect.die(bytes)
          onDelta(bytes)
        }
      }).pipe(Effect.either)
    )
    const admit = (events: ReadonlyArray<RouterEvent>): Effect.Effect<void> =>
      events.length === 1
        ? Effect.orDie(actor.admitEvent(0, events[0]!))
        : Effect.orDie(Effect.forEach(events, (event) => actor.admitEvent(0, event), { discard: true }))
    return { actor, admit, uniqueBlocks: () => state.stats().aggregation.uniqueBlockCount }
  })

/** SUBs on every endpoint of `pool`, delivering each decoded Batch to `deliver`. */
const subscribePool = (
  endpoints: ReadonlyArray<string>,
  deliver: (message: IngestMessage) => Effect.Effect<void>,
  onHandshake: () => void
): Effect.Effect<void, never, Scope.Scope> =>
  Effect.forEach(
    endpoints,
    (endpoint) =>
      Effect.orDie(
        subscribeDynamo({
          endpoint,
          topic: KV_EVENT_TOPIC,
          deliver,
          onConnection: (connected) => {
            if (connected) onHandshake()
          }
        })
      ),
    { discard: true }
  )

/** Blocks of the Stored/Removed events of a decoded message (0 for anything else). */
const blocksOf = (message: IngestMessage): number => (message._tag === "Batch" ? message.blocks : 0)

// ---------------------------------------------------------------------------------------------
// Packing decoded events into one transferable buffer (b-transfer)

const TAGS = ["Stored", "Removed", "Cleared"] as const

/**
 * Per event: pool, workerId index, dpRank, eventId, tag, pairs, hasTokens, hashes[2n],
 * tokensHashes[2n]?. Worker ids go in a side table (they are strings).
 */
class EventPacker {
  private buf = new Uint32Array(4096)
  private at = 0
  private strings: Array<string> = []
  private index = new Map<string, number>()
  messages = 0
  private room(n: number): void {
    if (this.at + n <= this.buf.length) return
    const next = new Uint32Array(Math.max(this.buf.length * 2, this.at + n))
    next.set(this.buf.subarray(0, this.at))
    this.buf = next
  }
  add(pool: number, events: ReadonlyArray<RouterEvent>): void {
    this.messages++
    for (const event of events) {
      const data = event.data
      if (event.storageTier !== "device") continue
      const hashes = data._tag === "Cleared" ? undefined : data.blockHashes
      const tokens = data._tag === "Stored" ? data.tokensHashes : undefined
      const pairs = hashes === undefined ? 0 : hashes.length >>> 1
      this.room(7 + 4 * pairs)
      let w = this.index.get(event.workerId)
      if (w === undefined) {
        w = this.strings.length
        this.strings.push(event.workerId)
        this.index.set(event.workerId, w)
      }
      const b = this.buf
      let at = this.at
      b[at++] = pool
      b[at++] = w
      b[at++] = event.dpRank
      b[at++] = event.eventId
      b[at++] = TAGS.indexOf(data._tag)
      b[at++] = pairs
      b[at++] = tokens === undefined ? 0 : 1
      if (hashes !== undefined) {
        b.set(hashes, at)
        at += 2 * pairs
      }
      if (tokens !== undefined) {
        b.set(tokens, at)
        at += 2 * pairs
      }
      this.at = at
    }
  }
  take(): { readonly strings: Array<string>; readonly words: Uint32Array } {
    const words = this.buf.slice(0, this.at)
    this.at = 0
    this.messages = 0
    const strings = this.strings
    this.strings = []
    this.index = new Map()
    return { strings, words }
  }
}

/** The RouterEvents of a packed buffer, grouped by pool; hashes are views of `words`. */
const unpackEvents = (
  strings: ReadonlyArray<string>,
  words: Uint32Array,
  pools: number
): Array<Array<RouterEvent>> => {
  const out: Array<Array<RouterEvent>> = Array.from({ length: pools }, () => [])
  let at = 0
  while (at < words.length) {
    const pool = words[at]!
    const workerId = strings[words[at + 1]!]!
    const dpRank = words[at + 2]!
    const eventId = words[at + 3]!
    const tag = TAGS[words[at + 4]!]!
    const pairs = words[at + 5]!
    const hasTokens = words[at + 6]! === 1
    at += 7
    const hashes = words.subarray(at, at + 2 * pairs)
    at += 2 * pairs
    const tokens = hasTokens ? words.subarray(at, at + 2 * pairs) : undefined
    if (hasTokens) at += 2 * pairs
    const data: RouterEvent["data"] =
      tag === "Cleared"
        ? { _tag: "Cleared" }
        : tag === "Removed"
          ? { _tag: "Removed", blockHashes: hashes }
          : {
              _tag: "Stored",
              blockHashes: hashes,
              tokensHashes: tokens,
              parentHash: undefined,
              startPosition: undefined
            }
    out[pool]!.push({ workerId, dpRank, eventId, storageTier: "device", data })
  }
  return out
}

// ---------------------------------------------------------------------------------------------
// Worker threads

interface WorkerInit {
  readonly role: typeof ROLE
  readonly mode: "decode-clone" | "decode-transfer" | "pools"
  /** Global pool indexes this worker serves, with their endpoints. */
  readonly pools: ReadonlyArray<{ readonly pool: number; readonly endpoints: ReadonlyArray<string> }>
  readonly expectedBlocks: number
  readonly blocksPerPool: number
}

/** Worker → main messages. */
type FromWorker =
  | { readonly _tag: "connected" }
  | { readonly _tag: "clone"; readonly batches: ReadonlyArray<readonly [number, ReadonlyArray<RouterEvent>]> }
  | { readonly _tag: "packed"; readonly strings: ReadonlyArray<string>; readonly words: Uint32Array }
  | { readonly _tag: "deltas"; readonly bytes: number; readonly count: number }
  | {
      readonly _tag: "done"
      readonly elu: number
      readonly cpuSeconds: number
      readonly uniqueBlocks: number
    }
  | { readonly _tag: "closed" }

const runWorker = async (init: WorkerInit): Promise<void> => {
  const port = parentPort!
  const scope = Effect.runSync(Scope.make())
  // zeromq aborts the whole process when a worker with open sockets is terminated: the main
  // thread asks for the sockets to be closed first.
  port.on("message", (message: { readonly _tag: string }) => {
    if (message._tag !== "close") return
    void Effect.runPromise(Scope.close(scope, Exit.void)).then(() =>
      // A socket monitor still winding down when the worker ends aborts the process too: give the
      // sockets a moment, then let the worker end on its own (nothing keeps its loop alive).
      setTimeout(() => {
        port.postMessage({ _tag: "closed" } satisfies FromWorker)
        port.close()
      }, 100)
    )
  })
  const eluStart = performance.eventLoopUtilization()
  let handshakes = 0
  const totalEndpoints = init.pools.reduce((n, p) => n + p.endpoints.length, 0)
  let cpuAtConnect = 0
  let eluAtConnect = eluStart
  const onHandshake = () => {
    handshakes++
    if (handshakes !== totalEndpoints) return
    cpuAtConnect = threadCpuSeconds()
    eluAtConnect = performance.eventLoopUtilization()
    port.postMessage({ _tag: "connected" } satisfies FromWorker)
  }
  let uniqueBlocks = 0
  const done = () =>
    port.postMessage({
      uniqueBlocks,
      _tag: "done",
      elu: performance.eventLoopUtilization(eluAtConnect).utilization,
      cpuSeconds: threadCpuSeconds() - cpuAtConnect
    } satisfies FromWorker)

  if (init.mode === "pools") {
    // Deltas are posted once per turn: the HTTP side gets CBI1 bytes, the worker keeps the state.
    let pendingBytes = 0
    let pendingCount = 0
    let flushArmed = false
    const postDeltas = () => {
      flushArmed = false
      port.postMessage({ _tag: "deltas", bytes: pendingBytes, count: pendingCount } satisfies FromWorker)
      pendingBytes = 0
      pendingCount = 0
    }
    const onDelta = (bytes: Uint8Array) => {
      // The bytes themselves would be transferred to the HTTP side; here their size stands in.
      pendingBytes += bytes.length
      pendingCount++
      if (!flushArmed) {
        flushArmed = true
        setImmediate(postDeltas)
      }
    }
    let poolsDone = 0
    await Effect.runPromise(
      Scope.extend(
        Effect.forEach(
          init.pools,
          ({ pool, endpoints }) =>
            Effect.gen(function* () {
              const unit = yield* makePoolUnit(pool, init.expectedBlocks, onDelta)
              let blocks = 0
              yield* subscribePool(
                endpoints,
                (message) => {
                  if (message._tag !== "Batch") return Effect.void
                  blocks += message.blocks
                  const admitted = unit.admit(message.events)
                  if (blocks < init.blocksPerPool) return admitted
                  return admitted.pipe(
                    Effect.zipRight(Effect.orDie(unit.actor.flush)),
                    Effect.tap(() =>
                      Effect.sync(() => {
                        uniqueBlocks += unit.uniqueBlocks()
                        poolsDone++
                        if (poolsDone === init.pools.length) {
                          postDeltas()
                          done()
                        }
                      })
                    ),
                    Effect.forkDaemon,
                    Effect.asVoid
                  )
                },
                onHandshake
              )
            }),
          { discard: true }
        ),
        scope
      )
    )
  } else {
    const transfer = init.mode === "decode-transfer"
    const packer = new EventPacker()
    let clone: Array<readonly [number, ReadonlyArray<RouterEvent>]> = []
    let pending = 0
    let armed = false
    let blocks = 0
    const total = init.blocksPerPool * init.pools.length
    const post = () => {
      armed = false
      if (pending === 0) return
      pending = 0
      if (transfer) {
        const { strings, words } = packer.take()
        port.postMessage({ _tag: "packed", strings, words } satisfies FromWorker, [
          // `take` slices, so the buffer is a plain ArrayBuffer of its own.
          words.buffer as ArrayBuffer
        ])
      } else {
        const batches = clone
        clone = []
        port.postMessage({ _tag: "clone", batches } satisfies FromWorker)
      }
    }
    const deliverFor =
      (pool: number) =>
      (message: IngestMessage): Effect.Effect<void> =>
        Effect.sync(() => {
          if (message._tag !== "Batch") return
          blocks += message.blocks
          if (transfer) packer.add(pool, message.events)
          else clone.push([pool, message.events])
          pending++
          if (pending >= POST_BATCH || blocks >= total) post()
          else if (!armed) {
            armed = true
            setImmediate(post)
          }
          if (blocks >= total) done()
        })
    await Effect.runPromise(
      Scope.extend(
        Effect.forEach(
          init.pools,
          ({ pool, endpoints }) => subscribePool(endpoints, deliverFor(pool), onHandshake),
          {
            discard: true
          }
        ),
        scope
      )
    )
  }
}

const init = workerData as Partial<WorkerInit> | null
if (!isMainThread && init?.role === ROLE) {
  await runWorker(init as WorkerInit)
  // Under a bundle this module shares a file with the bench entry: never let the worker go on to
  // run it. The worker lives on its sockets and port until the main thread terminates it.
  await new Promise<never>(() => {})
}

// ---------------------------------------------------------------------------------------------
// The publisher child process

/** Plain CommonJS for `node -e`: PUB sockets sending the messages of a frames file on command. */
const PUBLISHER_CHILD = `
const { readFileSync } = require("node:fs")
const zmq = require(process.env.KVRELAY_BENCH_ZMQ)
let sockets = []
let messages = []
process.on("message", async (msg) => {
  if (msg.cmd === "bind") {
    for (let i = 0; i < msg.count; i++) {
      const s = new zmq.Publisher({ sendHighWaterMark: 1000000, linger: 0 })
      await s.bind("tcp://127.0.0.1:*")
      sockets.push(s)
    }
    // file: per publisher, per message: u32 frame count, then per frame u32 length + bytes
    const buf = readFileSync(msg.file)
    let at = 0
    const u32 = () => { const v = buf.readUInt32LE(at); at += 4; return v }
    for (let p = 0; p < msg.count; p++) {
      const list = []
      const n = u32()
      for (let i = 0; i < n; i++) {
        const frames = []
        const f = u32()
        for (let k = 0; k < f; k++) { const len = u32(); frames.push(buf.subarray(at, at + len)); at += len }
        list.push(frames)
      }
      messages.push(list)
    }
    process.send({ endpoints: sockets.map((s) => s.lastEndpoint) })
  } else if (msg.cmd === "run") {
    const cpu = process.cpuUsage()
    const start = performance.now()
    const per = messages[0].length
    // Round-robin over the publishers, each send awaited only when zeromq queues it.
    for (let i = 0; i < per; i++) {
      for (let p = 0; p < sockets.length; p++) await sockets[p].send(messages[p][i])
      if ((i & 255) === 255) await new Promise((r) => setImmediate(r))
    }
    const used = process.cpuUsage(cpu)
    process.send({ seconds: (performance.now() - start) / 1000, cpuSeconds: (used.user + used.system) / 1e6 })
  } else if (msg.cmd === "close") {
    for (const s of sockets) s.close()
    process.exit(0)
  }
})
`

const ask = <A>(child: ChildProcess, message: unknown): Promise<A> =>
  new Promise((resolve, reject) => {
    const onExit = (code: number | null) => reject(new Error(`publisher child exited with ${code}`))
    child.once("exit", onExit)
    child.once("message", (reply) => {
      child.off("exit", onExit)
      resolve(reply as A)
    })
    child.send(message as object)
  })

/** The frames file the child loads: every publisher's pre-encoded messages. */
const writeFramesFile = (
  file: string,
  messages: ReadonlyArray<ReadonlyArray<ReadonlyArray<Uint8Array>>>
): void => {
  const parts: Array<Buffer> = []
  const u32 = (v: number) => {
    const b = Buffer.allocUnsafe(4)
    b.writeUInt32LE(v, 0)
    parts.push(b)
  }
  for (const list of messages) {
    u32(list.length)
    for (const frames of list) {
      u32(frames.length)
      for (const frame of frames) {
        u32(frame.length)
        parts.push(Buffer.from(frame.buffer, frame.byteOffset, frame.byteLength))
      }
    }
  }
  writeFileSync(file, Buffer.concat(parts))
}

// ---------------------------------------------------------------------------------------------
// One round of one layout

interface RoundResult {
  readonly blocksPerSecond: number
  readonly blocks: number
  readonly cpuMicrosPerEvent: number
  readonly mainElu: number
  readonly workerElu: ReadonlyArray<number>
  /** Main thread CPU per event, and each worker's (µs). */
  readonly mainCpuMicrosPerEvent: number
  readonly workerCpuMicrosPerEvent: ReadonlyArray<number>
  readonly publisherSeconds: number
  readonly publisherCpuSeconds: number
  readonly seconds: number
  readonly deltas: number
}

const waitUntil = async (
  predicate: () => boolean,
  timeoutMs: number,
  what: string,
  failure: () => unknown = () => undefined
): Promise<void> => {
  const deadline = performance.now() + timeoutMs
  while (!predicate()) {
    const error = failure()
    if (error !== undefined) throw error
    if (performance.now() > deadline) throw new Error(`worker_ingest: timed out waiting for ${what}`)
    await new Promise((resolve) => setTimeout(resolve, 2))
  }
}

const workerUrl = (): URL => new URL(import.meta.url)

const debug = (line: string): void => {
  if (process.env.KVRELAY_BENCH_DEBUG !== undefined) process.stderr.write(`${line}\n`)
}

const runRound = async (
  layout: Layout,
  child: ChildProcess,
  endpointsByPool: ReadonlyArray<ReadonlyArray<string>>,
  blocksPerPool: number
): Promise<RoundResult> => {
  const expectedBlocks = blocksPerPool
  const scope = Effect.runSync(Scope.make())
  const workers: Array<Worker> = []
  const exits: Array<Promise<void>> = []
  let handshakes = 0
  let workersConnected = 0
  let workersDone = 0
  const workerElu: Array<number> = []
  const workerCpu: Array<number> = []
  let poolsDone = 0
  let uniqueBlocks = 0
  let deltas = 0
  let deltaBytes = 0
  let endAt = 0
  let workerError: unknown
  let workersClosed = 0
  const onHandshake = () => {
    handshakes++
  }
  const onDelta = (bytes: Uint8Array) => {
    deltas++
    deltaBytes += bytes.length
  }
  const markPoolDone = (unit: PoolUnit) => {
    uniqueBlocks += unit.uniqueBlocks()
    poolsDone++
    if (poolsDone === POOLS) endAt = performance.now()
  }

  /** The main thread's pools (a and b): an actor per pool, fed in arrival order. */
  const mainUnits = async (): Promise<Array<PoolUnit>> =>
    Effect.runPromise(
      Scope.extend(
        Effect.forEach(endpointsByPool, (_, pool) => makePoolUnit(pool, expectedBlocks, onDelta)),
        scope
      )
    )

  /** Admits and counts; the last batch of a pool flushes it and marks it done. */
  const feeder = (unit: PoolUnit) => {
    let blocks = 0
    return (events: ReadonlyArray<RouterEvent>, messageBlocks: number): Effect.Effect<void> => {
      blocks += messageBlocks
      const admitted = unit.admit(events)
      if (blocks < blocksPerPool) return admitted
      return admitted.pipe(
        Effect.zipRight(Effect.orDie(unit.actor.flush)),
        Effect.tap(() => Effect.sync(() => markPoolDone(unit))),
        Effect.forkDaemon,
        Effect.asVoid
      )
    }
  }

  const spawnWorker = (data: WorkerInit, onMessage: (message: FromWorker) => void): Worker => {
    const worker = new Worker(workerUrl(), { workerData: data })
    worker.on("message", (message: FromWorker) => {
      if (message._tag === "connected") workersConnected++
      else if (message._tag === "closed") workersClosed++
      else if (message._tag === "done") {
        workersDone++
        workerElu.push(message.elu)
        workerCpu.push(message.cpuSeconds)
        if (layout === "c") uniqueBlocks += message.uniqueBlocks
      } else onMessage(message)
    })
    worker.on("error", (error) => {
      workerError = error
    })
    exits.push(new Promise<void>((resolve) => worker.once("exit", () => resolve())))
    workers.push(worker)
    return worker
  }

  let expectConnected: () => boolean
  if (layout === "a") {
    const units = await mainUnits()
    await Effect.runPromise(
      Scope.extend(
        Effect.forEach(
          endpointsByPool,
          (endpoints, pool) => {
            const feed = feeder(units[pool]!)
            return subscribePool(
              endpoints,
              (message) => (message._tag === "Batch" ? feed(message.events, blocksOf(message)) : Effect.void),
              onHandshake
            )
          },
          { discard: true }
        ),
        scope
      )
    )
    const endpoints = endpointsByPool.reduce((n, e) => n + e.length, 0)
    expectConnected = () => handshakes === endpoints
  } else if (layout === "b-clone" || layout === "b-transfer") {
    const units = await mainUnits()
    const feeds = units.map(feeder)
    // One consumer fiber takes the worker's posts in order: separate forks per post could reorder
    // a pool's events when an actor's mailbox pushes back.
    const inbox = Effect.runSync(Queue.unbounded<FromWorker>())
    const apply = (message: FromWorker): Effect.Effect<void> => {
      if (message._tag === "clone")
        return Effect.forEach(
          message.batches,
          ([pool, events]) => feeds[pool]!(events, blockCountOf(events)),
          {
            discard: true
          }
        )
      if (message._tag === "packed")
        return Effect.forEach(
          unpackEvents(message.strings, message.words, POOLS),
          (events, pool) => (events.length === 0 ? Effect.void : feeds[pool]!(events, blockCountOf(events))),
          { discard: true }
        )
      return Effect.void
    }
    await Effect.runPromise(
      Scope.extend(
        Effect.forkScoped(
          Effect.forever(
            Effect.flatMap(Queue.takeAll(inbox), (messages) =>
              Effect.forEach(messages, apply, { discard: true })
            )
          )
        ),
        scope
      )
    )
    spawnWorker(
      {
        role: ROLE,
        mode: layout === "b-clone" ? "decode-clone" : "decode-transfer",
        pools: endpointsByPool.map((endpoints, pool) => ({ pool, endpoints })),
        expectedBlocks,
        blocksPerPool
      },
      (message) => {
        Queue.unsafeOffer(inbox, message)
      }
    )
    expectConnected = () => workersConnected === 1
  } else {
    for (let w = 0; w < POOLS / 2; w++) {
      spawnWorker(
        {
          role: ROLE,
          mode: "pools",
          pools: [2 * w, 2 * w + 1].map((pool) => ({ pool, endpoints: endpointsByPool[pool]! })),
          expectedBlocks,
          blocksPerPool
        },
        (message) => {
          if (message._tag === "deltas") {
            deltas += message.count
            deltaBytes += message.bytes
          }
        }
      )
    }
    expectConnected = () => workersConnected === POOLS / 2
  }

  try {
    await waitUntil(expectConnected, 30_000, "every SUB to connect", () => workerError)
    // Subscriptions travel after the handshake: a message published before one arrives is dropped.
    await new Promise((resolve) => setTimeout(resolve, 300))
    const cpu = process.cpuUsage()
    const mainCpuStart = threadCpuSeconds()
    const elu = performance.eventLoopUtilization()
    const start = performance.now()
    const published = ask<{ seconds: number; cpuSeconds: number }>(child, { cmd: "run" })
    const finished = () => (layout === "c" ? workersDone === POOLS / 2 : poolsDone === POOLS)
    await waitUntil(finished, 120_000, `layout ${layout} to apply every block`, () => workerError)
    if (layout === "c") endAt = performance.now()
    const used = process.cpuUsage(cpu)
    const mainCpu = threadCpuSeconds() - mainCpuStart
    const mainElu = performance.eventLoopUtilization(elu).utilization
    const pub = await published
    if (layout === "b-clone" || layout === "b-transfer")
      await waitUntil(() => workersDone === 1, 10_000, "worker")
    const seconds = (endAt - start) / 1000
    const blocks = blocksPerPool * POOLS
    const events = blocks / BLOCKS_PER_MESSAGE
    if (deltas === 0 || deltaBytes === 0) throw new Error(`layout ${layout} published no deltas`)
    // Every hash of the workload is distinct: a lost, repeated or garbled event shows here.
    if (uniqueBlocks !== blocks)
      throw new Error(
        `layout ${layout} ended with ${uniqueBlocks} distinct blocks in its CKFs, expected ${blocks}`
      )
    return {
      blocksPerSecond: blocks / seconds,
      blocks,
      cpuMicrosPerEvent: (used.user + used.system) / events,
      mainCpuMicrosPerEvent: (mainCpu * 1e6) / events,
      workerCpuMicrosPerEvent: workerCpu.map((seconds) => (seconds * 1e6) / events),
      mainElu,
      workerElu,
      publisherSeconds: pub.seconds,
      publisherCpuSeconds: pub.cpuSeconds,
      seconds,
      deltas
    }
  } finally {
    debug(`round ${layout}: closing`)
    for (const worker of workers) worker.postMessage({ _tag: "close" })
    await waitUntil(() => workersClosed === workers.length, 10_000, "workers to close their sockets")
    debug(`round ${layout}: waiting for the workers to end`)
    const timer = new Promise<"late">((resolve) => setTimeout(() => resolve("late"), 10_000).unref())
    if ((await Promise.race([Promise.all(exits), timer])) === "late") {
      debug(`round ${layout}: workers did not end, terminating them`)
      await Promise.all(workers.map((worker) => worker.terminate()))
    }
    debug(`round ${layout}: terminated`)
    await Effect.runPromise(Scope.close(scope, Exit.void))
  }
}

const blockCountOf = (events: ReadonlyArray<RouterEvent>): number => {
  let blocks = 0
  for (const event of events) if (event.data._tag !== "Cleared") blocks += event.data.blockHashes.length >>> 1
  return blocks
}

const median = (values: ReadonlyArray<number>): number => {
  const sorted = [...values].sort((a, b) => a - b)
  const mid = sorted.length >> 1
  return sorted.length % 2 === 1 ? sorted[mid]! : (sorted[mid - 1]! + sorted[mid]!) / 2
}

// ---------------------------------------------------------------------------------------------
// The suite

export const benchWorkerIngest = async (ctx: BenchContext): Promise<void> => {
  const messagesPerPublisher = Number(
    process.env.KVRELAY_BENCH_WORKER_MESSAGES ?? (ctx.quick ? 6_000 : 16_000)
  )
  const rounds = Number(process.env.KVRELAY_BENCH_WORKER_ROUNDS ?? 3)
  const publishers = POOLS * PUBLISHERS_PER_POOL
  const blocksPerPool = messagesPerPublisher * PUBLISHERS_PER_POOL * BLOCKS_PER_MESSAGE

  // Pre-encoded messages: publisher p serves pool p / 2 as worker 7000+p, one 8-block Stored
  // event (block and local token hashes, no parent) per message.
  const stream = new HashStream(2027)
  const publisherIds = Array.from({ length: publishers }, () => randomPublisherId())
  const messages = publisherIds.map((publisherId, p) =>
    Array.from({ length: messagesPerPublisher }, (_, i) => {
      const blockHashes = new Uint32Array(2 * BLOCKS_PER_MESSAGE)
      const tokensHashes = new Uint32Array(2 * BLOCKS_PER_MESSAGE)
      for (let b = 0; b < BLOCKS_PER_MESSAGE; b++) {
        stream.next(blockHashes, 2 * b)
        stream.next(tokensHashes, 2 * b)
      }
      return encodeDynamoMessage({
        topic: KV_EVENT_TOPIC,
        publisherId,
        sequence: i,
        publishedAtMs: Date.now(),
        events: [
          {
            workerId: String(7000 + p),
            dpRank: 0,
            eventId: i + 1,
            storageTier: "device",
            data: {
              _tag: "Stored",
              blockHashes,
              tokensHashes,
              parentHash: undefined,
              startPosition: undefined
            }
          }
        ]
      })
    })
  )
  const file = join(tmpdir(), `kvrelay-worker-ingest-${process.pid}.bin`)
  writeFramesFile(file, messages)

  const zmqPath = createRequire(import.meta.url).resolve("zeromq")
  const child = spawn(process.execPath, ["-e", PUBLISHER_CHILD], {
    stdio: ["ignore", "inherit", "inherit", "ipc"],
    env: { ...process.env, KVRELAY_BENCH_ZMQ: zmqPath }
  })
  try {
    const { endpoints } = await ask<{ endpoints: Array<string> }>(child, {
      cmd: "bind",
      count: publishers,
      file
    })
    const endpointsByPool = Array.from({ length: POOLS }, (_, pool) =>
      endpoints.slice(pool * PUBLISHERS_PER_POOL, (pool + 1) * PUBLISHERS_PER_POOL)
    )
    const results = new Map<Layout, Array<RoundResult>>(LAYOUTS.map((layout) => [layout, []]))
    // A warm-up round of each layout (JIT, first sockets), then alternating measured rounds.
    for (const layout of LAYOUTS) await runRound(layout, child, endpointsByPool, blocksPerPool)
    for (let r = 0; r < rounds; r++) {
      const order = r % 2 === 0 ? LAYOUTS : [...LAYOUTS].reverse()
      for (const layout of order) {
        const result = await runRound(layout, child, endpointsByPool, blocksPerPool)
        results.get(layout)!.push(result)
        ctx.log(
          `  worker_ingest round ${r + 1} ${layout.padEnd(10)} ${Math.round(result.blocksPerSecond).toLocaleString("en-US").padStart(10)} blocks/s` +
            `  CPU/event ${result.cpuMicrosPerEvent.toFixed(1)} µs (main thread ${result.mainCpuMicrosPerEvent.toFixed(1)}` +
            (result.workerCpuMicrosPerEvent.length === 0
              ? ""
              : `, workers ${result.workerCpuMicrosPerEvent.map((u) => u.toFixed(1)).join("/")}`) +
            `)  main ELU ${result.mainElu.toFixed(2)}` +
            (result.workerElu.length === 0
              ? ""
              : `  worker ELU ${result.workerElu.map((u) => u.toFixed(2)).join("/")}`) +
            `  publishers ${result.publisherSeconds.toFixed(2)} s (${result.publisherCpuSeconds.toFixed(2)} s CPU) of ${result.seconds.toFixed(2)} s` +
            `  ${result.deltas} deltas`
        )
      }
    }
    const medianOf = (layout: Layout, pick: (r: RoundResult) => number) =>
      median(results.get(layout)!.map(pick))
    const baseline = medianOf("a", (r) => r.blocksPerSecond)
    const baselineCpu = medianOf("a", (r) => r.cpuMicrosPerEvent)
    const note = `${POOLS} pools × ${PUBLISHERS_PER_POOL} Dynamo publishers (child process) × ${messagesPerPublisher} 8-block batches, median of ${rounds}`
    record(ctx, "worker_ingest_a_one_thread", "blocks/s", baseline, null, note)
    for (const layout of LAYOUTS) {
      if (layout === "a") continue
      const name = `worker_ingest_${layout.replace("-", "_")}`
      record(
        ctx,
        name,
        "blocks/s",
        medianOf(layout, (r) => r.blocksPerSecond),
        baseline,
        "ratio vs a"
      )
      record(
        ctx,
        `${name}_cpu_per_event`,
        "µs",
        medianOf(layout, (r) => r.cpuMicrosPerEvent),
        baselineCpu,
        `relay process CPU per 8-block event, all threads (a: ${baselineCpu.toFixed(1)} µs); ratio = a/this`,
        true
      )
    }
    await new Promise<void>((resolve) => {
      child.once("exit", () => resolve())
      child.send({ cmd: "close" })
    })
  } finally {
    if (child.exitCode === null) child.kill()
  }
}
