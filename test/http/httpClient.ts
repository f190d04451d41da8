/**
 * The test side of the relay HTTP API: plain `fetch`, the pool-frame decoder and an SSE reader.
 * Every wait has a wall-clock deadline (these tests run over real sockets).
 */

import { Effect } from "effect"
import { type PoolFrame, PoolFrameDecoder } from "../../src/protocol/PoolStream.js"
import { type SseMessage, SseParser } from "../../src/protocol/Sse.js"

export interface JsonReply {
  readonly status: number
  readonly headers: Headers
  readonly text: string
  /** Parsed body, or undefined when it is not JSON. */
  readonly json: unknown
}

const reply = async (response: Response): Promise<JsonReply> => {
  const text = await response.text()
  let json: unknown
  try {
    json = JSON.parse(text)
  } catch {
    json = undefined
  }
  return { status: response.status, headers: response.headers, text, json }
}

export const request = (url: string, init?: RequestInit): Effect.Effect<JsonReply> =>
  Effect.promise(() => fetch(url, init).then(reply))

export const get = (base: string, path: string): Effect.Effect<JsonReply> => request(`${base}${path}`)

export const postJson = (base: string, path: string, body: unknown): Effect.Effect<JsonReply> =>
  request(`${base}${path}`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: typeof body === "string" ? body : JSON.stringify(body)
  })

/** A reader that times out instead of hanging the test. */
class BodyReader {
  private readonly reader: ReadableStreamDefaultReader<Uint8Array>
  ended = false
  /** Set when the connection broke instead of ending the body normally. */
  broken: Error | undefined = undefined

  constructor(
    readonly response: Response,
    private readonly controller: AbortController
  ) {
    this.reader = response.body!.getReader()
  }

  /** The next chunk, `undefined` at the end of the body; rejects after `timeoutMs`. */
  async read(timeoutMs: number): Promise<Uint8Array | undefined> {
    let timer: NodeJS.Timeout | undefined
    const timeout = new Promise<never>((_, reject) => {
      timer = setTimeout(() => reject(new Error(`no data within ${timeoutMs} ms`)), timeoutMs)
    })
    const read = this.reader.read().catch((cause: unknown) => {
      this.broken = cause instanceof Error ? cause : new Error(String(cause))
      return { done: true as const, value: undefined }
    })
    try {
      const next = await Promise.race([read, timeout])
      if (next.done) {
        this.ended = true
        return undefined
      }
      return next.value
    } finally {
      clearTimeout(timer)
    }
  }

  abort(): void {
    this.controller.abort()
  }
}

export class PoolStreamClient {
  private readonly decoder = new PoolFrameDecoder()
  private readonly queued: Array<PoolFrame> = []

  constructor(readonly body: BodyReader) {}

  get status(): number {
    return this.body.response.status
  }

  get contentType(): string | null {
    return this.body.response.headers.get("content-type")
  }

  /** The next frame, `undefined` when the stream ended. */
  next(timeoutMs = 5_000): Effect.Effect<PoolFrame | undefined> {
    return Effect.promise(async () => {
      const deadline = Date.now() + timeoutMs
      while (this.queued.length === 0) {
        const chunk = await this.body.read(Math.max(1, deadline - Date.now()))
        if (chunk === undefined) return undefined
        this.queued.push(...this.decoder.push(chunk))
      }
      return this.queued.shift()
    })
  }

  /** Frames until the stream ends. */
  rest(timeoutMs = 5_000): Effect.Effect<Array<PoolFrame>> {
    return Effect.gen(this, function* () {
      const frames: Array<PoolFrame> = []
      for (;;) {
        const frame = yield* this.next(timeoutMs)
        if (frame === undefined) return frames
        frames.push(frame)
      }
    })
  }

  abort(): Effect.Effect<void> {
    return Effect.sync(() => this.body.abort())
  }
}

/** Opens a pool stream; a non-200 answer comes back as a `JsonReply`. */
export const subscribePool = (
  base: string,
  body: unknown
): Effect.Effect<{ readonly stream: PoolStreamClient } | { readonly error: JsonReply }> =>
  Effect.promise(async () => {
    const controller = new AbortController()
    const response = await fetch(`${base}/v1/pools/subscribe`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify(body),
      signal: controller.signal
    })
    if (response.status !== 200) return { error: await reply(response) }
    return { stream: new PoolStreamClient(new BodyReader(response, controller)) }
  })

export class SseClient {
  private readonly parser = new SseParser()
  private readonly decoder = new TextDecoder()
  private readonly queued: Array<SseMessage> = []
  /** Everything received, comments included. */
  raw = ""

  constructor(readonly body: BodyReader) {}

  get status(): number {
    return this.body.response.status
  }

  /** The next event, `undefined` when the stream ended. */
  next(timeoutMs = 5_000): Effect.Effect<SseMessage | undefined> {
    return Effect.promise(async () => {
      const deadline = Date.now() + timeoutMs
      while (this.queued.length === 0) {
        const chunk = await this.body.read(Math.max(1, deadline - Date.now()))
        if (chunk === undefined) return undefined
        this.raw += this.decoder.decode(chunk, { stream: true })
        this.queued.push(...this.parser.push(chunk))
      }
      return this.queued.shift()
    })
  }

  /** Reads until `raw` contains `text`. */
  waitForRaw(text: string, timeoutMs = 5_000): Effect.Effect<void> {
    return Effect.promise(async () => {
      const deadline = Date.now() + timeoutMs
      while (!this.raw.includes(text)) {
        const chunk = await this.body.read(Math.max(1, deadline - Date.now()))
        if (chunk === undefined) throw new Error(`stream ended before ${JSON.stringify(text)}`)
        this.raw += this.decoder.decode(chunk, { stream: true })
        this.queued.push(...this.parser.push(chunk))
      }
    })
  }

  abort(): Effect.Effect<void> {
    return Effect.sync(() => this.body.abort())
  }
}

/** Opens an SSE watch; a non-200 answer comes back as a `JsonReply`. */
export const watch = (
  base: string,
  path: string
): Effect.Effect<{ readonly sse: SseClient } | { readonly error: JsonReply }> =>
  Effect.promise(async () => {
    const controller = new AbortController()
    const response = await fetch(`${base}${path}`, { signal: controller.signal })
    if (response.status !== 200) return { error: await reply(response) }
    return { sse: new SseClient(new BodyReader(response, controller)) }
  })

/** Polls `condition` until it holds (bounded wall-clock deadline). */
export const eventually = <A>(
  what: string,
  probe: Effect.Effect<A>,
  condition: (value: A) => boolean,
  timeoutMs = 5_000
): Effect.Effect<A> =>
  Effect.gen(function* () {
    const deadline = Date.now() + timeoutMs
    for (;;) {
      const value = yield* probe
      if (condition(value)) return value
      if (Date.now() > deadline) return yield* Effect.dieMessage(`timed out waiting until ${what}`)
      yield* Effect.sleep("10 millis")
    }
  })
