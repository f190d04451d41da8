/**
 * The global consumer's side of the relay HTTP API (PROTOCOL.md §5): relay info, the catalog
 * watch (Server-Sent Events) and pool streams (binary frames carrying CBI1 payloads).
 *
 * Everything that crosses the wire is validated here, so the consumer only ever sees a complete
 * snapshot followed by contiguous deltas of the producer it asked for; anything else ends the
 * stream with a typed error. The checks that need no I/O live in `PoolStreamReader` and
 * `CatalogWatchReader`, which the tests drive with bytes from the project's own encoders.
 */

import * as HttpClient from "@effect/platform/HttpClient"
import * as HttpClientRequest from "@effect/platform/HttpClientRequest"
import type * as HttpClientResponse from "@effect/platform/HttpClientResponse"
import { Duration, Effect, Either, Schema, Stream } from "effect"
import { Cbi1Error, Cbi1SnapshotAssembler, decodeCbi1 } from "../ckf/cbi1.js"
import type { ProducerIdentity } from "../ckf/identity.js"
import { U64_MAX } from "../ckf/u64.js"
import { causeChainText as causeText } from "../observability/CauseText.js"
import { ProducerIdentityJson } from "../protocol/Identity.js"
import { decodeJson, decodeJsonText, encodeJson } from "../protocol/Json.js"
import type { CatalogSnapshot, RelayInfo } from "../protocol/Model.js"
import {
  FRAME_DELTA,
  FRAME_HEARTBEAT,
  FRAME_SNAPSHOT_CHUNK,
  FRAME_TERMINAL_ERROR,
  POOL_STREAM_CONTENT_TYPE,
  type PoolFrame,
  PoolFrameDecodeError,
  PoolFrameDecoder
} from "../protocol/PoolStream.js"
import {
  CatalogSnapshotJson,
  type LoadWindowDocument,
  LoadWindowJson,
  type ReadinessDocument,
  ReadinessJson,
  RelayInfoJson
} from "../protocol/RelayApi.js"
import { SseParser } from "../protocol/Sse.js"
import {
  CatalogWatchEnded,
  PoolStreamFault,
  type PoolStreamFaultKind,
  PoolStreamTerminated,
  type RelayClientError,
  RelayHttpError,
  RelayProtocolError,
  RelayTransportError,
  SignalWatchEnded
} from "./ConsumerErrors.js"

/** One line for logs and diagnostics. */
export const relayClientErrorText = (error: RelayClientError): string => {
  switch (error._tag) {
    case "RelayHttpError":
      return `HTTP ${error.status}${error.reason === undefined ? "" : ` ${error.reason}`}: ${error.message}`
    case "PoolStreamTerminated":
      return `${error.reason}: ${error.message}`
    case "PoolStreamFault":
      return `${error.kind}: ${error.message}`
    default:
      return error.message
  }
}

// ---------------------------------------------------------------------------------------------
// Pool stream reader (no I/O)

/** What a pool stream brings, decoded: a snapshot, a delta, a heartbeat or the stream's end. */
export type PoolStreamEvent =
  | { readonly _tag: "Snapshot"; readonly sequence: bigint; readonly words: Uint32Array }
  | {
      readonly _tag: "Delta"
      readonly baseSequence: bigint
      readonly sequence: bigint
      /** `[bucket, wordLo, wordHi]` triples. */
      readonly images: Uint32Array
    }
  | { readonly _tag: "Heartbeat"; readonly sequence: bigint }

/** The terminal frame's JSON; lenient on the reason so that unknown reasons still end the stream typed. */
const TerminalBodyJson = Schema.Struct({ reason: Schema.String, message: Schema.String })
const decodeTerminalBody = decodeJsonText(TerminalBodyJson)
const utf8 = new TextDecoder("utf-8", { fatal: true })

const fault = (kind: PoolStreamFaultKind, message: string) => new PoolStreamFault({ kind, message })

/**
 * Validates the frames of one pool stream against the producer it was opened for: every
 * snapshot chunk of one sequence first (`base = sequence`, CBI1 epoch = sequence), then deltas
 * with `base` = the previous sequence and `sequence = base + 1` (CBI1 epochs agreeing), and
 * heartbeats restating the last sequence. CBI1 headers must carry the producer's format and the
 * pool's DC id, so frames of any other producer are rejected.
 */
export class PoolStreamReader {
  private readonly decoder = new PoolFrameDecoder()
  private readonly assembler: Cbi1SnapshotAssembler
  private snapshotSequence: bigint | undefined = undefined
  /** Defined once the snapshot is complete. */
  private last: bigint | undefined = undefined
  private ended = false

  constructor(readonly expected: ProducerIdentity) {
    this.assembler = new Cbi1SnapshotAssembler({
      format: expected.format,
      dcId: expected.poolId.dcId.value
    })
  }

  /** The sequence of the newest complete state (snapshot or delta) seen on the stream. */
  get lastSequence(): bigint | undefined {
    return this.last
  }

  /** Bytes in, events out; a protocol violation or a terminal frame is returned as the error. */
  push(chunk: Uint8Array): Array<PoolStreamEvent> | PoolStreamFault | PoolStreamTerminated {
    if (this.ended) return fault("Order", "bytes after the stream's terminal frame")
    let frames: Array<PoolFrame>
    try {
      frames = this.decoder.push(chunk)
    } catch (error) {
      if (error instanceof PoolFrameDecodeError) return this.end(fault("FrameDecode", error.message))
      throw error
    }
    const events: Array<PoolStreamEvent> = []
    for (const frame of frames) {
      const event = this.frame(frame)
      if (event instanceof PoolStreamFault || event instanceof PoolStreamTerminated) return this.end(event)
      if (event !== undefined) events.push(event)
    }
    return events
  }

  /** The body ended: never a clean end for a pool stream, which only stops with a terminal frame. */
  finish(): PoolStreamFault {
    const partial =
      this.decoder.pending > 0 ? ` with ${this.decoder.pending} bytes of an incomplete frame` : ""
    return this.end(fault("Closed", `pool stream closed by the relay without a terminal frame${partial}`))
  }

  private end<E extends PoolStreamFault | PoolStreamTerminated>(error: E): E {
    this.ended = true
    this.assembler.reset()
    return error
  }

  private frame(frame: PoolFrame): PoolStreamEvent | undefined | PoolStreamFault | PoolStreamTerminated {
    switch (frame.kind) {
      case FRAME_SNAPSHOT_CHUNK:
        return this.snapshotChunk(frame)
      case FRAME_DELTA:
        return this.delta(frame)
      case FRAME_HEARTBEAT:
        return this.heartbeat(frame)
      case FRAME_TERMINAL_ERROR:
        return this.terminal(frame)
    }
  }

  private decode(frame: PoolFrame) {
    const decoded = decodeCbi1(frame.payload, this.assembler.expected)
    return decoded instanceof Cbi1Error ? fault("Cbi1", `${decoded.reason}: ${decoded.message}`) : decoded
  }

  private snapshotChunk(frame: PoolFrame): PoolStreamEvent | undefined | PoolStreamFault {
    if (this.last !== undefined) {
      return fault("Order", `snapshot chunk at sequence ${frame.sequence} after the snapshot completed`)
    }
    if (frame.baseSequence !== frame.sequence) {
      return fault(
        "Sequence",
        `snapshot chunk has base ${frame.baseSequence} and sequence ${frame.sequence}; they must be equal`
      )
    }
    if (this.snapshotSequence !== undefined && frame.sequence !== this.snapshotSequence) {
      return fault(
        "Sequence",
        `snapshot chunk at sequence ${frame.sequence} inside the snapshot of sequence ${this.snapshotSequence}`
      )
    }
    const decoded = this.decode(frame)
    if (decoded instanceof PoolStreamFault) return decoded
    if (decoded._tag !== "SnapshotChunk") return fault("Order", "a snapshot-chunk frame carries a CBI1 delta")
    if (decoded.epoch !== frame.sequence) {
      return fault(
        "Sequence",
        `snapshot chunk CBI1 epoch ${decoded.epoch} differs from the frame sequence ${frame.sequence}`
      )
    }
    this.snapshotSequence = frame.sequence
    const assembled = this.assembler.push(decoded)
    if (assembled instanceof Cbi1Error) return fault("Cbi1", `${assembled.reason}: ${assembled.message}`)
    if (assembled === undefined) return undefined
    this.last = assembled.epoch
    return { _tag: "Snapshot", sequence: assembled.epoch, words: assembled.words }
  }

  private delta(frame: PoolFrame): PoolStreamEvent | PoolStreamFault {
    const last = this.last
    if (last === undefined)
      return fault("Order", `delta at sequence ${frame.sequence} before the snapshot completed`)
    if (frame.baseSequence !== last || last === U64_MAX || frame.sequence !== last + 1n) {
      return fault(
        "Sequence",
        `delta ${frame.baseSequence} -> ${frame.sequence} does not continue sequence ${last}`
      )
    }
    const decoded = this.decode(frame)
    if (decoded instanceof PoolStreamFault) return decoded
    if (decoded._tag !== "Delta") return fault("Order", "a delta frame carries a CBI1 snapshot chunk")
    if (decoded.epoch !== frame.sequence || decoded.baseEpoch !== frame.baseSequence) {
      return fault(
        "Sequence",
        `delta CBI1 epochs ${decoded.baseEpoch} -> ${decoded.epoch} differ from the frame's ${frame.baseSequence} -> ${frame.sequence}`
      )
    }
    this.last = frame.sequence
    return {
      _tag: "Delta",
      baseSequence: frame.baseSequence,
      sequence: frame.sequence,
      images: decoded.images
    }
  }

  private heartbeat(frame: PoolFrame): PoolStreamEvent | PoolStreamFault {
    const last = this.last
    if (last === undefined) return fault("Order", "heartbeat before the snapshot completed")
    if (frame.payload.length !== 0) {
      return fault("Heartbeat", `heartbeat carries ${frame.payload.length} payload bytes; it must be empty`)
    }
    if (frame.baseSequence !== last || frame.sequence !== last) {
      return fault(
        "Heartbeat",
        `heartbeat ${frame.baseSequence} -> ${frame.sequence} does not restate the last sequence ${last}`
      )
    }
    return { _tag: "Heartbeat", sequence: last }
  }

  private terminal(frame: PoolFrame): PoolStreamTerminated | PoolStreamFault {
    let text: string
    try {
      text = utf8.decode(frame.payload)
    } catch {
      return fault("FrameDecode", "terminal error frame payload is not UTF-8")
    }
    return Either.match(decodeTerminalBody(text), {
      onLeft: (error) => fault("FrameDecode", `terminal error frame payload: ${error.message}`),
      onRight: (body) => new PoolStreamTerminated({ reason: body.reason, message: body.message })
    })
  }
}

// ---------------------------------------------------------------------------------------------
// Catalog watch reader (no I/O)

const decodeCatalog = decodeJsonText(CatalogSnapshotJson)

/** SSE bytes in, catalog snapshots out; `event: catalog` only, every payload a valid snapshot. */
export class CatalogWatchReader {
  private readonly parser = new SseParser()

  push(chunk: Uint8Array): Array<CatalogSnapshot> | CatalogWatchEnded {
    const snapshots: Array<CatalogSnapshot> = []
    for (const message of this.parser.push(chunk)) {
      if (message.event !== "catalog") {
        return new CatalogWatchEnded({
          message: `unexpected catalog watch event ${JSON.stringify(message.event)}`
        })
      }
      const decoded = decodeCatalog(message.data)
      if (Either.isLeft(decoded)) {
        return new CatalogWatchEnded({ message: `malformed catalog event: ${decoded.left.message}` })
      }
      snapshots.push(decoded.right)
    }
    return snapshots
  }
}

/**
 * SSE bytes in, documents out, for the relay's load and readiness watches: events named `event`
 * only, each payload decoded by `decode`; anything else ends the watch.
 */
export class SignalWatchReader<A> {
  private readonly parser = new SseParser()

  constructor(
    private readonly watch: "load" | "readiness",
    private readonly decode: (text: string) => Either.Either<A, { readonly message: string }>
  ) {}

  push(chunk: Uint8Array): Array<A> | SignalWatchEnded {
    const out: Array<A> = []
    for (const message of this.parser.push(chunk)) {
      if (message.event !== this.watch) {
        return new SignalWatchEnded({
          watch: this.watch,
          message: `unexpected ${this.watch} watch event ${JSON.stringify(message.event.slice(0, 40))}`
        })
      }
      const decoded = this.decode(message.data)
      if (Either.isLeft(decoded)) {
        return new SignalWatchEnded({
          watch: this.watch,
          message: `malformed ${this.watch} event: ${decoded.left.message}`
        })
      }
      out.push(decoded.right)
    }
    return out
  }
}

const decodeLoadWindow = decodeJsonText(LoadWindowJson)
const decodeReadiness = decodeJsonText(ReadinessJson)

// ---------------------------------------------------------------------------------------------
// The client

/** Time limits, TLS and token of a relay client. */
export interface RelayClientOptions {
  /** Bound on a unary request and on opening a stream (default 10 s). */
  readonly requestTimeout?: Duration.DurationInput | undefined
  /** A stream that delivers no bytes for this long is broken (default 30 s; heartbeats come every 10 s). */
  readonly streamIdleTimeout?: Duration.DurationInput | undefined
  /** Largest JSON answer accepted (default 64 MiB: a catalog of many pools). */
  readonly maxJsonBytes?: number | undefined
  /**
   * The bearer token sent as `Authorization` on every request (`--relay-token-file`). Evaluated
   * per request, so a re-read token file takes effect on the next request or resubscription.
   */
  readonly bearerToken?: Effect.Effect<string> | undefined
}

/** The consumer's client of one relay: its documents, watches and pool streams. */
export interface RelayClient {
  /** The base URL without a trailing slash. */
  readonly baseUrl: string
  /** `GET /v1/relay`. */
  readonly relayInfo: Effect.Effect<RelayInfo, RelayClientError>
  /** `GET /v1/catalog`. */
  readonly catalog: Effect.Effect<CatalogSnapshot, RelayClientError>
  /**
   * `GET /v1/catalog/watch`: the current catalog, then one per revision change. The stream only
   * ends with an error (`CatalogWatchEnded` when the relay closes it).
   */
  readonly watchCatalog: (subscriberId: string) => Stream.Stream<CatalogSnapshot, RelayClientError>
  /**
   * `POST /v1/pools/subscribe`: one complete snapshot, then deltas and heartbeats. The stream only
   * ends with an error: the relay's status, a terminal frame, or a protocol fault.
   */
  readonly subscribePool: (
    expected: ProducerIdentity,
    subscriberId: string
  ) => Stream.Stream<PoolStreamEvent, RelayClientError>
  /** `GET /v1/load/watch` (PROTOCOL §5): one window a second; ends only with an error. */
  readonly watchLoad: (subscriberId: string) => Stream.Stream<LoadWindowDocument, RelayClientError>
  /** `GET /v1/readiness/watch` (PROTOCOL §5): the readiness now and on change; ends only with an error. */
  readonly watchReadiness: (subscriberId: string) => Stream.Stream<ReadinessDocument, RelayClientError>
}

const encodeProducer = encodeJson(ProducerIdentityJson)
const decodeRelayInfo = decodeJson(RelayInfoJson)
const decodeCatalogJson = decodeJson(CatalogSnapshotJson)
const ErrorDocumentJson = Schema.Struct({ reason: Schema.String, message: Schema.String })
const decodeErrorDocument = decodeJsonText(ErrorDocumentJson)

const DEFAULT_REQUEST_TIMEOUT = Duration.seconds(10)
const DEFAULT_STREAM_IDLE_TIMEOUT = Duration.seconds(30)
const DEFAULT_MAX_JSON_BYTES = 64 * 1024 * 1024

/** A client of the relay at `baseUrl` (e.g. `http://127.0.0.1:8080`). */
export const make = (
  baseUrl: string,
  options: RelayClientOptions = {}
): Effect.Effect<RelayClient, never, HttpClient.HttpClient> =>
  Effect.gen(function* () {
    const client = yield* HttpClient.HttpClient
    const base = baseUrl.replace(/\/+$/, "")
    const requestTimeout = Duration.decode(options.requestTimeout ?? DEFAULT_REQUEST_TIMEOUT)
    const idleTimeout = Duration.decode(options.streamIdleTimeout ?? DEFAULT_STREAM_IDLE_TIMEOUT)
    const maxJsonBytes = options.maxJsonBytes ?? DEFAULT_MAX_JSON_BYTES
    const bearerToken = options.bearerToken
    const authorized = (
      request: HttpClientRequest.HttpClientRequest
    ): Effect.Effect<HttpClientRequest.HttpClientRequest> =>
      bearerToken === undefined
        ? Effect.succeed(request)
        : Effect.map(bearerToken, (token) => HttpClientRequest.bearerToken(request, token))

    const transport = (url: string) => (cause: unknown) =>
      new RelayTransportError({ url, message: causeText(cause) })

    /** Executes the request; a non-2xx answer becomes `RelayHttpError` with the relay's reason. */
    const execute = (
      request: HttpClientRequest.HttpClientRequest
    ): Effect.Effect<HttpClientResponse.HttpClientResponse, RelayTransportError | RelayHttpError> =>
      Effect.flatMap(authorized(request), (signed) => client.execute(signed)).pipe(
        Effect.mapError(transport(request.url)),
        Effect.timeoutFail({
          duration: requestTimeout,
          onTimeout: () =>
            new RelayTransportError({
              url: request.url,
              message: `no response within ${Duration.format(requestTimeout)}`
            })
        }),
        Effect.flatMap((response) => {
          if (response.status >= 200 && response.status < 300) return Effect.succeed(response)
          return response.text.pipe(
            Effect.timeout(requestTimeout),
            Effect.orElseSucceed(() => ""),
            Effect.flatMap((text) => {
              const body = decodeErrorDocument(text)
              return Effect.fail(
                new RelayHttpError({
                  url: request.url,
                  status: response.status,
                  reason: Either.isRight(body) ? body.right.reason : undefined,
                  message: Either.isRight(body) ? body.right.message : text.slice(0, 512)
                })
              )
            })
          )
        })
      )

    const getJson = <A>(
      path: string,
      decode: (input: unknown) => Either.Either<A, { readonly message: string }>
    ): Effect.Effect<A, RelayClientError> => {
      const url = `${base}${path}`
      return Effect.gen(function* () {
        const response = yield* execute(HttpClientRequest.get(url).pipe(HttpClientRequest.acceptJson))
        const declared = Number(response.headers["content-length"] ?? "0")
        if (declared > maxJsonBytes) {
          return yield* Effect.fail(
            new RelayProtocolError({ url, message: `answer of ${declared} bytes exceeds ${maxJsonBytes}` })
          )
        }
        const text = yield* response.text.pipe(
          Effect.mapError(transport(url)),
          Effect.timeoutFail({
            duration: requestTimeout,
            onTimeout: () => new RelayTransportError({ url, message: "answer body timed out" })
          })
        )
        let parsed: unknown
        try {
          parsed = JSON.parse(text)
        } catch (cause) {
          return yield* Effect.fail(
            new RelayProtocolError({ url, message: `invalid JSON: ${causeText(cause)}` })
          )
        }
        return yield* Either.match(decode(parsed), {
          onLeft: (error) => Effect.fail(new RelayProtocolError({ url, message: error.message })),
          onRight: (value) => Effect.succeed(value)
        })
      }).pipe(Effect.withSpan(`RelayClient GET ${path}`, { attributes: { "kvrelay.relay_url": base } }))
    }

    const requireContentType = (
      url: string,
      response: HttpClientResponse.HttpClientResponse,
      expected: string
    ): Effect.Effect<void, RelayProtocolError> => {
      const actual = (response.headers["content-type"] ?? "").split(";")[0]!.trim().toLowerCase()
      return actual === expected
        ? Effect.void
        : Effect.fail(
            new RelayProtocolError({
              url,
              message: `expected content type ${expected}, got ${JSON.stringify(actual)}`
            })
          )
    }

    /** The body of a long-lived answer, failing when it stays silent for the idle timeout. */
    const bodyOf = (
      url: string,
      response: HttpClientResponse.HttpClientResponse,
      onIdle: () => RelayClientError
    ) => response.stream.pipe(Stream.mapError(transport(url)), Stream.timeoutFail(onIdle, idleTimeout))

    const watchCatalog = (subscriberId: string): Stream.Stream<CatalogSnapshot, RelayClientError> => {
      const url = `${base}/v1/catalog/watch?subscriber=${encodeURIComponent(subscriberId)}`
      return Stream.unwrapScoped(
        Effect.gen(function* () {
          const response = yield* execute(
            HttpClientRequest.get(url).pipe(HttpClientRequest.setHeader("accept", "text/event-stream"))
          )
          yield* requireContentType(url, response, "text/event-stream")
          const reader = new CatalogWatchReader()
          const idle = () =>
            new CatalogWatchEnded({ message: `catalog watch silent for ${Duration.format(idleTimeout)}` })
          return bodyOf(url, response, idle).pipe(
            Stream.mapConcatEffect((chunk) => {
              const out = reader.push(chunk)
              return out instanceof CatalogWatchEnded ? Effect.fail(out) : Effect.succeed(out)
            }),
            Stream.concat(
              Stream.fail(new CatalogWatchEnded({ message: "catalog watch closed by the relay" }))
            )
          )
        })
      ).pipe(Stream.withSpan("RelayClient.watchCatalog", { attributes: { "kvrelay.relay_url": base } }))
    }

    const subscribePool = (
      expected: ProducerIdentity,
      subscriberId: string
    ): Stream.Stream<PoolStreamEvent, RelayClientError> => {
      const url = `${base}/v1/pools/subscribe`
      return Stream.unwrapScoped(
        Effect.gen(function* () {
          const producer = yield* Either.match(encodeProducer(expected), {
            onLeft: (error) => Effect.fail(new RelayProtocolError({ url, message: error.message })),
            onRight: (json) => Effect.succeed(json)
          })
          const request = HttpClientRequest.post(url).pipe(
            HttpClientRequest.setHeader("accept", POOL_STREAM_CONTENT_TYPE),
            HttpClientRequest.bodyText(
              JSON.stringify({ subscriberId, expectedProducer: producer }),
              "application/json"
            )
          )
          const response = yield* execute(request)
          yield* requireContentType(url, response, POOL_STREAM_CONTENT_TYPE)
          const reader = new PoolStreamReader(expected)
          const idle = () => fault("IdleTimeout", `pool stream silent for ${Duration.format(idleTimeout)}`)
          return bodyOf(url, response, idle).pipe(
            Stream.mapConcatEffect((chunk) => {
              const out = reader.push(chunk)
              return Array.isArray(out) ? Effect.succeed(out) : Effect.fail(out)
            }),
            Stream.concat(Stream.suspend(() => Stream.fail(reader.finish())))
          )
        })
      ).pipe(
        Stream.withSpan("RelayClient.subscribePool", {
          attributes: {
            "kvrelay.relay_url": base,
            "kvrelay.pool": expected.poolId.toString(),
            "kvrelay.layout_generation": String(expected.layoutGeneration),
            "kvrelay.subscriber": subscriberId
          }
        })
      )
    }

    const watchSignal = <A>(
      watch: "load" | "readiness",
      subscriberId: string,
      decode: (text: string) => Either.Either<A, { readonly message: string }>
    ): Stream.Stream<A, RelayClientError> => {
      const url = `${base}/v1/${watch}/watch?subscriber=${encodeURIComponent(subscriberId)}`
      return Stream.unwrapScoped(
        Effect.gen(function* () {
          const response = yield* execute(
            HttpClientRequest.get(url).pipe(HttpClientRequest.setHeader("accept", "text/event-stream"))
          )
          yield* requireContentType(url, response, "text/event-stream")
          const reader = new SignalWatchReader(watch, decode)
          const idle = () =>
            new SignalWatchEnded({
              watch,
              message: `${watch} watch silent for ${Duration.format(idleTimeout)}`
            })
          return bodyOf(url, response, idle).pipe(
            Stream.mapConcatEffect((chunk) => {
              const out = reader.push(chunk)
              return out instanceof SignalWatchEnded ? Effect.fail(out) : Effect.succeed(out)
            }),
            Stream.concat(
              Stream.fail(new SignalWatchEnded({ watch, message: `${watch} watch closed by the relay` }))
            )
          )
        })
      ).pipe(Stream.withSpan(`RelayClient.watch ${watch}`, { attributes: { "kvrelay.relay_url": base } }))
    }

    return {
      baseUrl: base,
      relayInfo: getJson("/v1/relay", decodeRelayInfo),
      catalog: getJson("/v1/catalog", decodeCatalogJson),
      watchCatalog,
      subscribePool,
      watchLoad: (subscriberId) => watchSignal("load", subscriberId, decodeLoadWindow),
      watchReadiness: (subscriberId) => watchSignal("readiness", subscriberId, decodeReadiness)
    }
  })
