/**
 * The received messages a subscriber holds for its consumer, bounded like ZeroMQ's receive
 * high-water mark: at the mark the socket stops reading (TCP pushes back, the publisher's own
 * HWM drops, as between two libzmq sockets) instead of the queue growing without bound. Reading
 * resumes when the consumer has taken the queue down to half the mark, so a consumer that keeps
 * up just under the mark does not flip the socket on every message.
 */

/** The reading side of the current connection. */
export interface FlowControl {
  pause(): void
  resume(): void
}

/** Taken messages below this index are released by compaction rather than on every take. */
const COMPACT_AT = 4096

export class MessageQueue {
  private items: Array<Array<Buffer>> = []
  private head = 0
  private reader: FlowControl | undefined
  private paused = false
  private waiter: (() => void) | undefined
  private readonly lowWaterMark: number

  constructor(readonly highWaterMark: number) {
    this.lowWaterMark = Math.floor(highWaterMark / 2)
  }

  get size(): number {
    return this.items.length - this.head
  }

  /** Whether reading is paused at the high-water mark. */
  get isPaused(): boolean {
    return this.paused
  }

  /** Appends a message; `flush` after a chunk's messages applies the mark and wakes the consumer. */
  push(frames: Array<Buffer>): void {
    this.items.push(frames)
  }

  flush(): void {
    if (!this.paused && this.reader !== undefined && this.size >= this.highWaterMark) {
      this.paused = true
      this.reader.pause()
    }
    const waiter = this.waiter
    if (waiter !== undefined && this.size > 0) {
      this.waiter = undefined
      waiter()
    }
  }

  /** Moves up to `max` messages to `into`; returns how many. */
  take(into: Array<Array<Buffer>>, max: number): number {
    const available = this.size
    const n = Math.min(available, max)
    const items = this.items
    let head = this.head
    for (let i = 0; i < n; i++) into.push(items[head++]!)
    if (head === items.length) {
      items.length = 0
      head = 0
    } else if (head >= COMPACT_AT) {
      items.splice(0, head)
      head = 0
    }
    this.head = head
    if (this.paused && this.size <= this.lowWaterMark) {
      this.paused = false
      this.reader?.resume()
    }
    return n
  }

  /** Calls `wake` once when a message is queued (at once when one already is). */
  wait(wake: () => void): void {
    if (this.size > 0) wake()
    else this.waiter = wake
  }

  cancelWait(): void {
    this.waiter = undefined
  }

  /** The connection now reading; a queue already at the mark pauses it at once. */
  attach(reader: FlowControl): void {
    this.reader = reader
    this.paused = false
    if (this.size >= this.highWaterMark) {
      this.paused = true
      reader.pause()
    }
  }

  detach(reader: FlowControl): void {
    if (this.reader !== reader) return
    this.reader = undefined
    this.paused = false
  }
}
