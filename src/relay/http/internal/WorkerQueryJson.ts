/**
 * `/v1/query`'s answer written as UTF-8 bytes straight from the queries' results (PROTOCOL §5.1
 * ◆3). A relay answers worker queries at HTTP rates, and building the answer's objects, sorting
 * them, serializing them and encoding the text cost more than running the query; here the
 * members' openings are encoded once per members array (the actor reuses the array while its
 * members stay the same), the pools' once per descriptor, and the rest is digits and
 * punctuation. The bytes are those of `JSON.stringify` of the objects (`poolWorkersAnswer`), the
 * tests' oracle.
 */

import type { CkfMemberRef } from "../../../ckf/events.js"
import { memberOrder, type WorkerQueryResult } from "../../../ckf/workerQuery.js"

const encoder = new TextEncoder()
const ascii = (text: string): Uint8Array => encoder.encode(text)

const COMMA = 0x2c
const CLOSE_BRACE = 0x7d
const CLOSE_BRACKET = 0x5d
const QUERY_BLOCKS = ascii('"queryBlocks":')
const FREQUENCIES = ascii(',"frequencies":[')
const WORKERS = ascii('],"workers":[')
const HOST = ascii(',"host":')
const DISK = ascii(',"disk":')

/**
 * JSON text as bytes, in one buffer reused from answer to answer (answers are written whole, on
 * one turn). Writers reserve room for a whole piece (`room`) and then put bytes at `length`
 * through the module's `put*` functions, with no call per byte run.
 */
export class JsonBytes {
  buffer: Buffer = Buffer.allocUnsafeSlow(16_384)
  length = 0

  /** Starts a new text. */
  reset(): this {
    this.length = 0
    return this
  }

  /** Makes room for `bytes` more bytes. */
  room(bytes: number): void {
    if (this.length + bytes <= this.buffer.length) return
    const grown = Buffer.allocUnsafeSlow(Math.max(2 * this.buffer.length, this.length + bytes))
    grown.set(this.buffer.subarray(0, this.length))
    this.buffer = grown
  }

  /** Appends encoded text (room included). */
  bytes(piece: Uint8Array): void {
    this.room(piece.length)
    this.length = putBytes(this.buffer, this.length, piece)
  }

  byte(value: number): void {
    this.room(1)
    this.buffer[this.length++] = value
  }

  /**
   * The bytes written since `reset` as a string of one character per byte (latin1): written
   * back with the latin1 encoding, it gives the same bytes, UTF-8 sequences included, and it
   * lives on the heap, where a Buffer of its size would take an allocation outside it.
   */
  latin1(): string {
    return this.buffer.toString("latin1", 0, this.length)
  }
}

/** Puts `piece` at `at`; returns the position after it. */
const putBytes = (buffer: Uint8Array, at: number, piece: Uint8Array): number => {
  // One `set` beats a loop of typed-array stores from a few bytes on.
  buffer.set(piece, at)
  return at + piece.length
}

/** Puts a non-negative integer below 2^53 in decimal, as JSON writes it; returns the position after it. */
const putUint = (buffer: Uint8Array, at: number, value: number): number => {
  if (value < 10) {
    buffer[at] = 0x30 + value
    return at + 1
  }
  let end = at
  for (let v = value; v >= 1; v = Math.floor(v / 10)) end++
  let i = end
  for (let v = value; v >= 1; v = Math.floor(v / 10)) buffer[--i] = 0x30 + (v % 10)
  return end
}

/** Room for one decimal integer below 2^53. */
const UINT_BYTES = 16

/** Per members array: the members in §5.1's tie order (worker id, dp rank), and their openings. */
interface MembersLayout {
  /** rank[j]: member j's place in (worker id, dp rank) order. */
  readonly rank: Int32Array
  /** byRank[r]: the member in place r. */
  readonly byRank: Int32Array
  /** `{"workerId":…,"dpRank":…,"device":` of each member, encoded. */
  readonly openings: ReadonlyArray<Uint8Array>
  /** Each member's whole entry when it matched nothing (most members of a large pool). */
  readonly unmatched: ReadonlyArray<Uint8Array>
  /** The openings' total length. */
  readonly openingBytes: number
}

const layouts = new WeakMap<ReadonlyArray<CkfMemberRef>, MembersLayout>()

const layoutOf = (members: ReadonlyArray<CkfMemberRef>): MembersLayout => {
  let layout = layouts.get(members)
  if (layout === undefined) {
    const byRank = memberOrder(members)
    const rank = new Int32Array(members.length)
    byRank.forEach((j, place) => {
      rank[j] = place
    })
    const openingTexts = members.map(
      (m) => `{"workerId":${JSON.stringify(m.workerId)},"dpRank":${JSON.stringify(m.dpRank)},"device":`
    )
    const openings = openingTexts.map((text) => encoder.encode(text))
    const unmatched = openingTexts.map((text) => encoder.encode(`${text}0,"host":0,"disk":0}`))
    const openingBytes = openings.reduce((sum, o) => sum + o.length, 0)
    layout = { rank, byRank, openings, unmatched, openingBytes }
    layouts.set(members, layout)
  }
  return layout
}

/**
 * The members' positions in §5.1's order of `workers`: device, then host, then disk depth
 * descending, then (worker id, dp rank). Members that matched nothing (most of a large pool's)
 * come last in (worker id, dp rank) order as they are; only the others are sorted.
 */
const workersOrder = (result: WorkerQueryResult, layout: MembersLayout): Array<number> => {
  const { device, host, disk } = result
  const rank = layout.rank
  const matched: Array<number> = []
  for (let j = 0; j < device.length; j++)
    if (device[j] !== 0 || host[j] !== 0 || disk[j] !== 0) matched.push(j)
  matched.sort(
    (a, b) => device[b]! - device[a]! || host[b]! - host[a]! || disk[b]! - disk[a]! || rank[a]! - rank[b]!
  )
  const byRank = layout.byRank
  for (let r = 0; r < byRank.length; r++) {
    const j = byRank[r]!
    if (device[j] === 0 && host[j] === 0 && disk[j] === 0) matched.push(j)
  }
  return matched
}

/**
 * Writes `poolWorkersAnswer(result)`'s members without the braces:
 * `"queryBlocks":…,"frequencies":[…],"workers":[…]`.
 */
export const writePoolWorkers = (out: JsonBytes, result: WorkerQueryResult): void => {
  const layout = layoutOf(result.members)
  const { device, host, disk, frequencies } = result
  const count = device.length
  out.room(
    layout.openingBytes +
      count * (3 * UINT_BYTES + HOST.length + DISK.length + 2) +
      frequencies.length * (UINT_BYTES + 1) +
      QUERY_BLOCKS.length +
      UINT_BYTES +
      FREQUENCIES.length +
      WORKERS.length +
      1
  )
  const buffer = out.buffer
  let at = putBytes(buffer, out.length, QUERY_BLOCKS)
  at = putUint(buffer, at, result.queryBlocks)
  at = putBytes(buffer, at, FREQUENCIES)
  for (let i = 0; i < frequencies.length; i++) {
    if (i > 0) buffer[at++] = COMMA
    at = putUint(buffer, at, frequencies[i]!)
  }
  at = putBytes(buffer, at, WORKERS)
  const order = workersOrder(result, layout)
  const openings = layout.openings
  const unmatched = layout.unmatched
  for (let k = 0; k < order.length; k++) {
    const j = order[k]!
    if (k > 0) buffer[at++] = COMMA
    const d = device[j]!
    if (d === 0 && host[j] === 0 && disk[j] === 0) {
      at = putBytes(buffer, at, unmatched[j]!)
      continue
    }
    at = putBytes(buffer, at, openings[j]!)
    at = putUint(buffer, at, d)
    at = putBytes(buffer, at, HOST)
    at = putUint(buffer, at, host[j]!)
    at = putBytes(buffer, at, DISK)
    at = putUint(buffer, at, disk[j]!)
    buffer[at++] = CLOSE_BRACE
  }
  buffer[at++] = CLOSE_BRACKET
  out.length = at
}
