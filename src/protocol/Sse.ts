/**
 * Server-Sent Events framing for the catalog, readiness and load watches.
 */

const encoder = new TextEncoder()

/** One event: `event: NAME` and the JSON payload on a single `data:` line. */
export const sseEvent = (event: string, json: string): Uint8Array =>
  encoder.encode(`event: ${event}\ndata: ${json}\n\n`)

/** A comment line that keeps idle connections (and proxies) alive. */
export const sseHeartbeat: Uint8Array = encoder.encode(": heartbeat\n\n")

/** One server-sent event: its name and its data. */
export interface SseMessage {
  readonly event: string
  readonly data: string
}

/** Incremental SSE parser (client side): comments are dropped, multi-line data is joined with `\n`. */
export class SseParser {
  private pending = ""
  private readonly decoder = new TextDecoder()

  push(chunk: Uint8Array): Array<SseMessage> {
    this.pending += this.decoder.decode(chunk, { stream: true })
    const messages: Array<SseMessage> = []
    for (;;) {
      const end = this.pending.search(/\r?\n\r?\n/)
      if (end < 0) break
      const block = this.pending.slice(0, end)
      const separator = this.pending.slice(end).match(/^\r?\n\r?\n/)![0]
      this.pending = this.pending.slice(end + separator.length)
      let event = "message"
      const data: Array<string> = []
      for (const line of block.split(/\r?\n/)) {
        if (line.startsWith(":")) continue
        const colon = line.indexOf(":")
        const field = colon < 0 ? line : line.slice(0, colon)
        let value = colon < 0 ? "" : line.slice(colon + 1)
        if (value.startsWith(" ")) value = value.slice(1)
        if (field === "event") event = value
        else if (field === "data") data.push(value)
      }
      if (data.length > 0) messages.push({ event, data: data.join("\n") })
    }
    return messages
  }
}
