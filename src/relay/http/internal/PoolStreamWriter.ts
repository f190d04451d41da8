/**
 * The body of an HTTP pool stream (PROTOCOL §5), written straight to Node's `ServerResponse`
 * from the publication feed's wake-ups: no Stream, fiber or Effect per frame.
 *
 * Why: through a Stream each delta passed a forwarder fiber, a hand-off, a step effect, the
 * platform's Stream-to-socket writer and a Readable, which together cost more CPU than moving the
 * delta (docs/decisions.md, "The pool stream without a Stream per delta"). The steady path here is
 * a callback: the hub queues a frame and wakes the feed, a microtask later the writer takes every
 * queued frame and writes them as one buffer.
 *
 * What stays as before:
 * - backpressure: once `write` returns false nothing more is taken from the feed until `drain`;
 *   frames meanwhile wait in the hub's bounded subscriber queue, which lags the subscriber out
 *   when it overflows (the end then goes out as a terminal frame once the socket drained);
 * - the write-stall watchdog: a response that waits for `drain` longer than the stall timeout has
 *   its connection destroyed (a client that stopped reading);
 * - heartbeats once every snapshot chunk went out, after `heartbeat` without a frame;
 * - server shutdown ends the stream with its terminal frame.
 * Timers (heartbeat, watchdog) and the shutdown wait are one fiber each per stream, on the Clock.
 */

import type * as Http from "node:http"
import { Deferred, Duration, Effect } from "effect"
import {
  encodePoolFrame,
  FRAME_DELTA,
  FRAME_HEARTBEAT,
  FRAME_SNAPSHOT_CHUNK,
  FRAME_TERMINAL_ERROR,
  POOL_FRAME_FIXED_BYTES,
  type PoolFrameKind,
  writePoolFrameAt
} from "../../../protocol/PoolStream.js"
import type { ErrorReason } from "../../../protocol/RelayApi.js"
import type { PoolFeed, PublicationFrame } from "../../PublicationSource.js"
import type { PublicationErrorKind } from "../../RelayErrors.js"

/** The terminal frame's reason for each way a feed can end. */
const TERMINAL_REASONS: Record<PublicationErrorKind, ErrorReason> = {
  NotFound: "POOL_NOT_FOUND",
  ProducerMismatch: "PRODUCER_CHANGED",
  Unavailable: "PUBLICATION_UNAVAILABLE",
  ResourceExhausted: "RESOURCE_LIMIT",
  SubscriberLagged: "SUBSCRIBER_LAGGED",
  SnapshotProgressTimeout: "SNAPSHOT_PROGRESS_TIMEOUT",
  InvalidPublication: "INVALID_PUBLICATION",
  Internal: "INTERNAL"
}

/** How a stream ended, for its log line. */
interface PoolStreamEnd {
  readonly reason: ErrorReason
  readonly message: string
  /** A defect the writer caught (the stream then ends as INTERNAL). */
  readonly defect?: unknown
}

const FEED_ENDED_MESSAGE = "relay is shutting down; subscribe again"
const SERVER_SHUTDOWN_MESSAGE = "relay HTTP server is shutting down"

const EMPTY = new Uint8Array(0)
const textEncoder = new TextEncoder()

/** One frame alone (heartbeats and the terminal frame). */
const singleFrame = (
  kind: PoolFrameKind,
  baseSequence: bigint,
  sequence: bigint,
  sendTsUs: bigint,
  payload: Uint8Array
): Uint8Array => encodePoolFrame({ kind, baseSequence, sequence, sendTsUs, payload })

interface PoolStreamWriterOptions {
  /** Snapshot chunks the stream opens with; heartbeats wait until they all went out. */
  readonly snapshotChunks: number
  /** Clock milliseconds (the stall and heartbeat bookkeeping). */
  readonly nowMillis: () => number
  /** Clock microseconds (each frame's `sendTsUs`). */
  readonly nowMicros: () => bigint
  /** When the writer takes from the feed after a wake-up; by default a microtask. */
  readonly schedule?: ((run: () => void) => void) | undefined
  /** The terminal frame's JSON error body. */
  readonly errorBody: (reason: ErrorReason, message: string) => string
  /** Called once, after the terminal frame was written and the socket took it (or was closed). */
  readonly onEnd: (end: PoolStreamEnd) => void
}

/**
 * The synchronous core: feed in, frames out. `start` once the response's head is written; `stop`
 * when the response is abandoned (the client went away). Everything else is driven by the feed's
 * wake-ups, `drain`, and the three hooks a timer calls (`heartbeat`, `stalledFor`, `shutdown`).
 */
class PoolStreamWriter {
  private snapshotChunksLeft: number
  private lastSequence = 0n
  /** `write` returned false: nothing is taken from the feed until `drain`. */
  private draining = false
  /** When the writer began waiting for `drain` (Clock ms). */
  private drainSince: number | undefined = undefined
  /** Since when the writer has had nothing to write, once the snapshot went out (Clock ms). */
  private idleSince: number | undefined = undefined
  private scheduled = false
  private closing = false
  /** The terminal frame was written; the writer only waits for the socket to take it. */
  private ending: PoolStreamEnd | undefined = undefined
  private stopped = false
  private readonly schedule: (run: () => void) => void

  constructor(
    private readonly response: Http.ServerResponse,
    private readonly feed: PoolFeed,
    private readonly options: PoolStreamWriterOptions
  ) {
    this.snapshotChunksLeft = options.snapshotChunks
    this.schedule = options.schedule ?? queueMicrotask
  }

  start(): void {
    this.response.on("drain", this.onDrain)
    this.feed.onReady(this.wake)
    this.flush()
  }

  /** Detaches from the feed and the response; nothing is written afterwards. */
  stop(): void {
    if (this.stopped) return
    this.stopped = true
    this.feed.onReady(undefined)
    this.response.off("drain", this.onDrain)
  }

  /** Ends the stream with the server-shutdown terminal frame (after the socket drained). */
  shutdown(): void {
    this.closing = true
    this.flush()
  }

  /** How long the writer has waited for `drain` by `now`, if it waits. */
  stalledFor(now: number): number | undefined {
    return this.stopped || this.drainSince === undefined ? undefined : now - this.drainSince
  }

  /**
   * Sends a heartbeat when the writer has been idle `ms` by `now`. Returns whether it sent one and
   * how long until the next one could be due.
   */
  heartbeat(now: number, ms: number): { readonly sent: boolean; readonly wait: number } {
    const from = this.idleSince
    if (this.stopped || this.ending !== undefined || this.draining || from === undefined)
      return { sent: false, wait: ms }
    const left = from + ms - now
    if (left > 0) return { sent: false, wait: left }
    this.guarded(() =>
      this.write(
        singleFrame(FRAME_HEARTBEAT, this.lastSequence, this.lastSequence, this.options.nowMicros(), EMPTY)
      )
    )
    return { sent: true, wait: ms }
  }

  private readonly wake = (): void => {
    if (this.scheduled || this.stopped) return
    this.scheduled = true
    this.schedule(this.run)
  }

  private readonly run = (): void => {
    this.scheduled = false
    this.flush()
  }

  private readonly onDrain = (): void => {
    if (!this.draining) return
    this.draining = false
    this.drainSince = undefined
    // The socket took everything: idle from now on, unless the feed has more.
    this.idleSince = this.snapshotChunksLeft > 0 ? undefined : this.options.nowMillis()
    if (this.ending !== undefined) this.finish(this.ending)
    else this.flush()
  }

  /** Everything the feed has, written; stops at a full socket, at the end, or when idle. */
  private flush(): void {
    if (this.stopped || this.draining || this.ending !== undefined) return
    this.guarded(() => {
      if (this.closing) return this.terminal("PUBLICATION_UNAVAILABLE", SERVER_SHUTDOWN_MESSAGE)
      const next = this.feed.poll()
      if (next === "end") return this.terminal("PUBLICATION_UNAVAILABLE", FEED_ENDED_MESSAGE)
      if (!Array.isArray(next)) {
        const error = next as Exclude<typeof next, "end" | ReadonlyArray<PublicationFrame>>
        return this.terminal(TERMINAL_REASONS[error.kind], error.message)
      }
      const frames = next as ReadonlyArray<PublicationFrame>
      if (frames.length > 0) this.write(this.encode(frames))
    })
  }

  /** Every frame in one buffer: one socket write for a whole backlog. */
  private encode(frames: ReadonlyArray<PublicationFrame>): Uint8Array {
    const sendTsUs = this.options.nowMicros()
    let bytes = 0
    for (const frame of frames) bytes += 4 + POOL_FRAME_FIXED_BYTES + frame.payload.length
    const out = new Uint8Array(bytes)
    const view = new DataView(out.buffer)
    let at = 0
    for (const frame of frames) {
      if (frame.kind === "SnapshotChunk") this.snapshotChunksLeft = Math.max(0, this.snapshotChunksLeft - 1)
      else this.snapshotChunksLeft = 0
      this.lastSequence = frame.sequence
      at = writePoolFrameAt(
        out,
        view,
        at,
        frame.kind === "SnapshotChunk" ? FRAME_SNAPSHOT_CHUNK : FRAME_DELTA,
        frame.baseSequence,
        frame.sequence,
        sendTsUs,
        frame.payload
      )
    }
    return out
  }

  private write(bytes: Uint8Array): void {
    const accepted = this.response.write(bytes)
    const now = this.options.nowMillis()
    if (accepted) {
      this.idleSince = this.snapshotChunksLeft > 0 ? undefined : now
      return
    }
    this.draining = true
    this.drainSince = now
    this.idleSince = undefined
  }

  private terminal(reason: ErrorReason, message: string, defect?: unknown): void {
    const end: PoolStreamEnd = defect === undefined ? { reason, message } : { reason, message, defect }
    this.ending = end
    this.feed.onReady(undefined)
    const payload = textEncoder.encode(this.options.errorBody(reason, message))
    this.write(
      singleFrame(
        FRAME_TERMINAL_ERROR,
        this.lastSequence,
        this.lastSequence,
        this.options.nowMicros(),
        payload
      )
    )
    // A terminal frame that filled the socket is ended once it drained, as any other frame.
    if (!this.draining) this.finish(end)
  }

  private finish(end: PoolStreamEnd): void {
    this.stop()
    this.options.onEnd(end)
  }

  /** A defect costs this stream only (it ends as INTERNAL), never the hub loop that woke it. */
  private guarded(body: () => void): void {
    try {
      body()
    } catch (defect) {
      if (this.ending !== undefined) {
        this.finish(this.ending)
        return
      }
      try {
        this.terminal("INTERNAL", "pool stream failed unexpectedly", defect)
      } catch {
        this.finish({ reason: "INTERNAL", message: "pool stream failed unexpectedly", defect })
      }
    }
  }
}

interface PoolStreamBodyOptions {
  readonly response: Http.ServerResponse
  readonly feed: PoolFeed
  readonly snapshotChunks: number
  readonly heartbeat: Duration.Duration
  readonly writeStallTimeout: Duration.Duration
  /** Completed when the server begins to shut down. */
  readonly shutdown: Deferred.Deferred<void>
  /** Runs once per heartbeat sent (the metric). */
  readonly onHeartbeat: Effect.Effect<void>
  readonly errorBody: (reason: ErrorReason, message: string) => string
  readonly schedule?: ((run: () => void) => void) | undefined
}

/**
 * Writes the stream's body until its terminal frame was taken by the socket, and returns how it
 * ended; interrupting it (the client went away) detaches the writer. The response's head must be
 * written already. Its timer fibers live until it returns.
 */
export const writeBody = (options: PoolStreamBodyOptions): Effect.Effect<PoolStreamEnd> =>
  Effect.scoped(
    Effect.gen(function* () {
      const clock = yield* Effect.clock
      const heartbeatMs = Duration.toMillis(options.heartbeat)
      const stallMs = Duration.toMillis(options.writeStallTimeout)
      let resolve: ((end: PoolStreamEnd) => void) | undefined
      const writer = new PoolStreamWriter(options.response, options.feed, {
        snapshotChunks: options.snapshotChunks,
        nowMillis: () => clock.unsafeCurrentTimeMillis(),
        nowMicros: () => clock.unsafeCurrentTimeNanos() / 1000n,
        schedule: options.schedule,
        errorBody: options.errorBody,
        onEnd: (end) => resolve?.(end)
      })
      yield* Effect.addFinalizer(() => Effect.sync(() => writer.stop()))
      // The heartbeat fiber wakes at most once per interval.
      yield* Effect.suspend(() => {
        const beat = writer.heartbeat(clock.unsafeCurrentTimeMillis(), heartbeatMs)
        const sleep = Effect.sleep(Duration.millis(beat.wait))
        return beat.sent ? Effect.zipRight(options.onHeartbeat, sleep) : sleep
      }).pipe(Effect.forever, Effect.interruptible, Effect.forkScoped)
      yield* Effect.gen(function* () {
        const period = Duration.millis(Math.max(5, Math.min(1_000, stallMs / 4)))
        for (;;) {
          yield* Effect.sleep(period)
          const stalled = writer.stalledFor(clock.unsafeCurrentTimeMillis())
          if (stalled !== undefined && stalled >= stallMs) {
            yield* Effect.logWarning("KV DC Relay pool stream client stopped reading; closing its connection")
            options.response.destroy()
            return
          }
        }
      }).pipe(Effect.interruptible, Effect.forkScoped)
      yield* Deferred.await(options.shutdown).pipe(
        Effect.zipRight(Effect.sync(() => writer.shutdown())),
        Effect.interruptible,
        Effect.forkScoped
      )
      return yield* Effect.async<PoolStreamEnd>((resume) => {
        resolve = (end) => resume(Effect.succeed(end))
        writer.start()
      })
    })
  )
