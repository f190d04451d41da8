/**
 * The wording of both servers' error bodies (PROTOCOL §7 ◆3): `{reason, message}` with a message
 * of at most 300 characters that names the field or value at fault in the contract's words, and
 * never repeats the request body. The helpers here are what every error path of the relay and
 * the global consumer renders its message with, so the bound holds whatever produced the text.
 */

/** PROTOCOL §7 ◆3: an error message is at most this many characters. */
export const MAX_ERROR_MESSAGE_CHARS = 300

/** The flag (and settings key) of the query routes' body limit, named in every 413. */
export const BODY_LIMIT_FLAG = "--max-request-body-bytes"

/**
 * 16 MiB: 256 queries of 2,048 tokens (the largest batch PROTOCOL §7 describes) are about 3.6 MB
 * of JSON, so the default leaves room for longer prompts and wider token ids.
 */
export const DEFAULT_MAX_REQUEST_BODY_BYTES = 16 * 1024 * 1024

/** A name or text value quoted for a message, cut short when a client sent something huge. */
export const quoted = (text: string, max = 64): string =>
  JSON.stringify(text.length <= max ? text : `${text.slice(0, max - 1)}…`)

/** What a JSON value is, in words, without repeating it when it is large. */
export const describeValue = (value: unknown): string => {
  if (value === null) return "null"
  if (Array.isArray(value)) return "an array"
  switch (typeof value) {
    case "string":
      return value.length <= 40 ? `the string ${JSON.stringify(value)}` : "a long string"
    case "number":
      return `the number ${String(value)}`
    case "boolean":
      return String(value)
    case "object":
      return "an object"
    default:
      return "a value that is not JSON"
  }
}

// A quoted string of more than 64 characters inside a message: shortened by `boundedMessage`.
const LONG_QUOTED = /"(?:[^"\\]|\\.){64,}"/g

/**
 * A message as it goes out: every long quoted value shortened, then the whole cut to
 * `MAX_ERROR_MESSAGE_CHARS`. The renderers of both servers apply it to every error body.
 */
export const boundedMessage = (message: string): string => {
  const shortened =
    message.length <= 64 ? message : message.replace(LONG_QUOTED, (q) => `${q.slice(0, 60)}…"`)
  return shortened.length <= MAX_ERROR_MESSAGE_CHARS
    ? shortened
    : `${shortened.slice(0, MAX_ERROR_MESSAGE_CHARS - 1)}…`
}

/**
 * Why `JSON.parse` refused a body, without the excerpt of the body that V8's own message quotes:
 * only the position, when the engine gives one.
 */
export const invalidJsonMessage = (cause: unknown): string => {
  const text = cause instanceof Error ? cause.message : String(cause)
  if (/end of JSON input/i.test(text)) return "invalid JSON: the request body ends too soon"
  const position = /position (\d+)/.exec(text)
  return position === null
    ? "invalid JSON: the request body is not a JSON document"
    : `invalid JSON: unexpected text at position ${position[1]} of the request body`
}

/**
 * The 413 message of a route whose limit is the server's `--max-request-body-bytes`, or of a
 * route with a fixed limit of its own (`route` given).
 */
export const bodyTooLargeMessage = (limit: number, route?: string): string =>
  route === undefined
    ? `the request body exceeds the limit of ${limit} bytes set by ${BODY_LIMIT_FLAG}`
    : `the request body exceeds the limit of ${limit} bytes of ${route} (fixed; ${BODY_LIMIT_FLAG} sets the query routes' limit)`

/** The 404 message of a path no route serves (the path is cut short, never the query string). */
export const noRouteMessage = (method: string, url: string): string => {
  const queryAt = url.indexOf("?")
  const path = queryAt < 0 ? url : url.slice(0, queryAt)
  return `no route ${method.slice(0, 16)} ${path.length <= 100 ? path : `${path.slice(0, 99)}…`}`
}

/** The 405 message of a known route asked with another method. */
export const methodNotAllowedMessage = (method: string, route: string, allowed: string): string =>
  `${method.slice(0, 16)} is not allowed on ${route}; use ${allowed}`
