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

/** Frame records; each is `[chunk, start, size, last]` (`chunk` indexes `chunks`). */
const RECORD = 4
/**
 * Taken frames below this record are released by compaction (when they are also at least half of
 * the records, so that compacting a deep backlog costs O(1) a frame) rather than on every take.
 */
const COMPACT_AT = 4096

/** Records kept after a backlog drains: 4,096 frames (64 KiB); a larger array is let go then. */
const KEPT_RECORDS = 4096

/**
 * Queued messages are kept as frame records in a `Uint32Array` plus one reference per chunk
 * they lie in, and become `Buffer` views only when taken. A `Buffer` per frame and an array per
 * message (~580 bytes of heap objects for a 4-frame Dynamo message) lived as long as the message
 * waited: through a burst, a backlog of them outlived the young generation and was copied into
 * the old one, and a socket at its mark of 100,000 messages held 58 MB of them for the collector
 * to trace.
 */
export class MessageQueue {
  private records = new Uint32Array(RECORD * 256)
  /** First untaken frame record, and the end of the records. */
  private head = 0
  private tail = 0
  /** Records from `tail - partial` on are the frames of a message whose last has not come. */
  private partial = 0
  /** The buffers the records point into, in arrival order. */
  private chunks: Array<Buffer> = []
  private complete = 0
  private reader: FlowControl | undefined
  private paused = false
  private waiter: (() => void) | undefined
  private readonly lowWaterMark: number

  constructor(readonly highWaterMark: number) {
    this.lowWaterMark = Math.floor(highWaterMark / 2)
  }

  /** Complete messages queued. */
  get size(): number {
    return this.complete
  }

  /** Whether reading is paused at the high-water mark. */
  get isPaused(): boolean {
    return this.paused
  }

  /**
   * Appends a data frame, `buf[start, start + size)`; `last` completes its message. `flush` after
   * a chunk's frames applies the mark and wakes the consumer.
   */
  frame(buf: Buffer, start: number, size: number, last: boolean): void {
    const chunks = this.chunks
    if (chunks.length === 0 || chunks[chunks.length - 1] !== buf) chunks.push(buf)
    if ((this.tail + 1) * RECORD > this.records.length) this.makeRoom()
    const at = this.tail * RECORD
    const records = this.records
    records[at] = chunks.length - 1
    records[at + 1] = start
    records[at + 2] = size
    records[at + 3] = last ? 1 : 0
    this.tail++
    if (last) {
      this.complete++
      this.partial = 0
    } else this.partial++
  }

  /** Forgets the frames of a message whose last never came (its connection ended). */
  dropPartial(): void {
    this.tail -= this.partial
    this.partial = 0
    if (this.head === this.tail) this.reset()
  }

  flush(): void {
    if (!this.paused && this.reader !== undefined && this.complete >= this.highWaterMark) {
      this.paused = true
      this.reader.pause()
    }
    const waiter = this.waiter
    if (waiter !== undefined && this.size > 0) {
      this.waiter = undefined
      waiter()
    }
  }

  /** Moves up to `max` messages to `into`, as the `Buffer`s of their frames; returns how many. */
  take(into: Array<Array<Buffer>>, max: number): number {
    const n = Math.min(this.complete, max)
    const records = this.records
    const chunks = this.chunks
    let at = this.head * RECORD
    for (let i = 0; i < n; i++) {
      const frames: Array<Buffer> = []
      for (;;) {
        const start = records[at + 1]!
        frames.push(chunks[records[at]!]!.subarray(start, start + records[at + 2]!))
        const last = records[at + 3] === 1
        at += RECORD
        if (last) break
      }
      into.push(frames)
    }
    this.head = at / RECORD
    this.complete -= n
    if (this.head === this.tail) this.reset()
    else if (this.head >= COMPACT_AT && this.head >= this.tail - this.head) this.compact()
    if (this.paused && this.complete <= this.lowWaterMark) {
      this.paused = false
      this.reader?.resume()
    }
    return n
  }

  /** Nothing queued: drop every chunk reference and start the records over. */
  private reset(): void {
    this.head = 0
    this.tail = 0
    this.chunks.length = 0
    if (this.records.length > RECORD * KEPT_RECORDS) this.records = new Uint32Array(RECORD * KEPT_RECORDS)
  }

  /** Moves the untaken records to the front and releases the chunks only taken frames lay in. */
  private compact(): void {
    const records = this.records
    const head = this.head
    const dropped = records[head * RECORD]!
    records.copyWithin(0, head * RECORD, this.tail * RECORD)
    this.tail -= head
    this.head = 0
    if (dropped > 0) {
      for (let at = 0; at < this.tail * RECORD; at += RECORD) records[at] -= dropped
      this.chunks.splice(0, dropped)
    }
  }

  /**
   * Room for one more record: compact when at least half the records were taken, else grow.
   * Either way each record is copied a bounded number of times on average.
   */
  private makeRoom(): void {
    if (this.head > 0 && this.head >= this.tail - this.head) {
      this.compact()
      return
    }
    const grown = new Uint32Array(this.records.length * 2)
    grown.set(this.records.subarray(0, this.tail * RECORD))
    this.records = grown
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
    if (this.complete >= this.highWaterMark) {
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
