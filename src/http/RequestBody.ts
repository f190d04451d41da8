/**
 * Reading a request body from `node:http` under a byte limit, for both servers' query routes:
 * the relay's router (`readBody`) and the two fast paths that answer from the request event.
 * One reader, so that a body over the limit, a read error and the bytes read end the same way on
 * every path.
 */

import type { IncomingMessage } from "node:http"

/** How a body read ended: its bytes, over the limit, or a read error. */
export type BodyOutcome =
  | { readonly _tag: "Read"; readonly bytes: Buffer }
  | { readonly _tag: "TooLarge" }
  | { readonly _tag: "Failed"; readonly cause: Error }

/**
 * Reads `incoming`'s body and calls `done` once with how it ended. Past `limit` bytes it stops
 * keeping chunks and lets the rest flow with no listener (Node discards it) instead of destroying
 * the socket: the limit bounds memory, not I/O, and the caller answers 413. Returns a function
 * that stops listening without calling `done` (an interrupted reader). A declared length over the
 * limit ends it at once, before any read, with the body left to flow.
 */
export const collectBody = (
  incoming: IncomingMessage,
  limit: number,
  done: (outcome: BodyOutcome) => void
): (() => void) => {
  const declared = incoming.headers["content-length"]
  if (declared !== undefined && Number(declared) > limit) {
    incoming.resume()
    done({ _tag: "TooLarge" })
    return () => {}
  }
  const chunks: Array<Buffer> = []
  let size = 0
  const stop = () => {
    incoming.off("data", onData)
    incoming.off("end", onEnd)
    incoming.off("error", onError)
  }
  const onData = (chunk: Buffer) => {
    size += chunk.length
    if (size <= limit) {
      chunks.push(chunk)
      return
    }
    stop()
    incoming.resume()
    done({ _tag: "TooLarge" })
  }
  const onEnd = () => {
    stop()
    done({ _tag: "Read", bytes: chunks.length === 1 ? chunks[0]! : Buffer.concat(chunks, size) })
  }
  const onError = (cause: Error) => {
    stop()
    done({ _tag: "Failed", cause })
  }
  incoming.on("data", onData)
  incoming.on("end", onEnd)
  incoming.on("error", onError)
  return stop
}

/** The words of a read error, the same on every path. */
export const readFailureMessage = (cause: Error): string => `request body could not be read: ${cause.message}`
