/**
 * msgpack for the Dynamo event plane and the worker-query protocol (PROTOCOL.md §3–§4,
 * recovery-events.md §6.1): a cursor reader and a growable writer over `Uint8Array`, the
 * `Vec<RouterEvent>` payload codec, the `EventEnvelope` codec and the worker-query maps.
 *
 * Block hashes are read straight into hash pairs (`[hi, lo]` in a `Uint32Array`): a generic
 * decoder would materialise one BigInt per hash (msgpackr with `int64AsType: "bigint"`), which
 * the benchmark in `bench/zmq.ts` shows to be several times slower than this reader.
 *
 * Decoders throw `MsgpackDecodeError` internally; the exported `decode*` functions never throw
 * anything else and callers convert the failure into a counted, dropped message.
 */

import { Data } from "effect"
import type { StorageTier } from "../ckf/events.js"
import { decimalOf } from "../ckf/u64.js"
import type { KvCacheEventData, RouterEvent, WorkerId } from "../protocol/Events.js"
import type { WorkerKvQueryRequest, WorkerKvQueryResponse } from "../recovery/WorkerQuery.js"

/** Why a msgpack value could not be decoded; the message names the field and what was wrong. */
export class MsgpackDecodeError extends Data.TaggedError("MsgpackDecodeError")<{
  readonly message: string
}> {}

/** Throws a `MsgpackDecodeError`; decoders call it, the exported `decode*` functions catch it. */
export const failDecode = (message: string): never => {
  throw new MsgpackDecodeError({ message })
}
const fail = failDecode

const TWO_32 = 4294967296
/** Largest integer a decoded id may take: larger values would lose precision as a number. */
export const MAX_SAFE_ID = 2 ** 53

const utf8 = new TextDecoder("utf-8", { fatal: false })
const utf8Encoder = new TextEncoder()

const ascii = (text: string): Uint8Array => utf8Encoder.encode(text)

const typeName = (byte: number): string => {
  if (byte <= 0x7f || byte >= 0xe0) return "int"
  if (byte <= 0x8f) return "map"
  if (byte <= 0x9f) return "array"
  if (byte <= 0xbf) return "str"
  switch (byte) {
    case 0xc0:
      return "nil"
    case 0xc2:
    case 0xc3:
      return "bool"
    case 0xc4:
    case 0xc5:
    case 0xc6:
      return "bin"
    case 0xca:
    case 0xcb:
      return "float"
    case 0xcc:
    case 0xcd:
    case 0xce:
    case 0xcf:
    case 0xd0:
    case 0xd1:
    case 0xd2:
    case 0xd3:
      return "int"
    case 0xd9:
    case 0xda:
    case 0xdb:
      return "str"
    case 0xdc:
    case 0xdd:
      return "array"
    case 0xde:
    case 0xdf:
      return "map"
    default:
      return byte === 0xc1 ? "reserved byte 0xc1" : "ext"
  }
}

// ---------------------------------------------------------------------------------------------
// Reader

/** Big-endian integers at `p` of `b` (the reader's bounds checks come first). */
const be16 = (b: Uint8Array, p: number): number => (b[p]! << 8) | b[p + 1]!
const i32 = (b: Uint8Array, p: number): number =>
  (b[p]! << 24) | (b[p + 1]! << 16) | (b[p + 2]! << 8) | b[p + 3]!
const be32 = (b: Uint8Array, p: number): number => i32(b, p) >>> 0
const i8 = (b: Uint8Array, p: number): number => (b[p]! << 24) >> 24
const i16 = (b: Uint8Array, p: number): number => (be16(b, p) << 16) >> 16

/** A cursor over one msgpack buffer range; every read checks the bounds of the range. */
export class MsgpackReader {
  pos: number
  readonly end: number
  readonly buf: Uint8Array
  /** Start and length of the last string read by `key`. */
  keyStart = 0
  keyLength = 0

  // No DataView: a decoder makes two readers per message, and the big-endian reads below are
  // plain byte arithmetic that V8 compiles as tightly.
  constructor(buf: Uint8Array, start = 0, end = buf.length) {
    this.buf = buf
    this.pos = start
    this.end = Math.min(end, buf.length)
  }

  get remaining(): number {
    return this.end - this.pos
  }

  private need(n: number, what: string): void {
    if (this.pos + n > this.end)
      fail(`${what}: truncated (needs ${n} more bytes, ${this.end - this.pos} left)`)
  }

  peek(what: string): number {
    if (this.pos >= this.end) fail(`${what}: unexpected end of input`)
    return this.buf[this.pos]!
  }

  /** Consumes a nil and returns true, or returns false without consuming anything. */
  nil(): boolean {
    if (this.pos < this.end && this.buf[this.pos] === 0xc0) {
      this.pos++
      return true
    }
    return false
  }

  private u8(): number {
    return this.buf[this.pos++]!
  }
  private u16(): number {
    const v = be16(this.buf, this.pos)
    this.pos += 2
    return v
  }
  private u32(): number {
    const v = be32(this.buf, this.pos)
    this.pos += 4
    return v
  }

  /**
   * The length in the header of a sized type, or -1 (nothing consumed) when the next byte is not
   * one of its headers or its length is truncated. The fix form is the byte `fixTag | n` for
   * `n <= fixMask` (`fixMask` 0: the type has none); `op8` is -1 for types without an 8-bit form.
   */
  private tryHeader(fixTag: number, fixMask: number, op8: number, op16: number, op32: number): number {
    if (this.pos >= this.end) return -1
    const b = this.buf[this.pos]!
    if (fixMask !== 0 && (b & ~fixMask) === fixTag) {
      this.pos++
      return b & fixMask
    }
    const width = b === op8 ? 1 : b === op16 ? 2 : b === op32 ? 4 : 0
    if (width === 0 || this.pos + 1 + width > this.end) return -1
    this.pos++
    return width === 1 ? this.u8() : width === 2 ? this.u16() : this.u32()
  }

  /** The element count of an array header, or -1 (nothing consumed) when the next value is not an array. */
  tryArray(): number {
    const n = this.tryHeader(0x90, 0x0f, -1, 0xdc, 0xdd)
    // Every element takes at least one byte: a larger count is garbage, and must not size an allocation.
    if (n > this.end - this.pos) fail(`array of ${n} elements exceeds the ${this.end - this.pos} bytes left`)
    return n
  }

  /** The entry count of a map header, or -1 (nothing consumed) when the next value is not a map. */
  tryMap(): number {
    const n = this.tryHeader(0x80, 0x0f, -1, 0xde, 0xdf)
    if (2 * n > this.end - this.pos) fail(`map of ${n} entries exceeds the ${this.end - this.pos} bytes left`)
    return n
  }

  array(what: string): number {
    const n = this.tryArray()
    if (n < 0) fail(`${what}: expected an array, got ${typeName(this.peek(what))}`)
    return n
  }

  map(what: string): number {
    const n = this.tryMap()
    if (n < 0) fail(`${what}: expected a map, got ${typeName(this.peek(what))}`)
    return n
  }

  /** Length of a str header, or -1 (nothing consumed) when the next value is not a str. */
  tryStrHeader(): number {
    const n = this.tryHeader(0xa0, 0x1f, 0xd9, 0xda, 0xdb)
    if (n > 0) this.need(n, "str")
    return n
  }

  /** Length of a bin header, or -1 (nothing consumed) when the next value is not a bin. */
  tryBinHeader(): number {
    const n = this.tryHeader(0, 0, 0xc4, 0xc5, 0xc6)
    if (n > 0) this.need(n, "bin")
    return n
  }

  string(what: string): string {
    const n = this.tryStrHeader()
    if (n < 0) fail(`${what}: expected a string, got ${typeName(this.peek(what))}`)
    const start = this.pos
    this.pos += n
    return utf8.decode(this.buf.subarray(start, start + n))
  }

  /**
   * Reads a map key (or a tagged variant name) and returns its index in `table`, -1 for a string
   * that is not in the table, -2 (nothing consumed) when the key is not a string.
   */
  key(table: ReadonlyArray<Uint8Array>): number {
    const n = this.tryStrHeader()
    if (n < 0) return -2
    const start = this.pos
    this.pos += n
    this.keyStart = start
    this.keyLength = n
    const buf = this.buf
    for (let t = 0; t < table.length; t++) {
      const k = table[t]!
      if (k.length !== n) continue
      let i = 0
      while (i < n && buf[start + i] === k[i]) i++
      if (i === n) return t
    }
    return -1
  }

  /** The text of the last key read (error messages only). */
  lastKey(): string {
    return utf8.decode(this.buf.subarray(this.keyStart, this.keyStart + this.keyLength))
  }

  /** True when the next value is an integer of any width or sign. */
  isInt(): boolean {
    if (this.pos >= this.end) return false
    const b = this.buf[this.pos]!
    return b <= 0x7f || b >= 0xe0 || (b >= 0xcc && b <= 0xd3)
  }

  /**
   * An unsigned integer that fits a JavaScript number exactly (≤ `max`, default 2^53); a signed
   * encoding of a non-negative value is accepted.
   */
  uint(what: string, max: number = MAX_SAFE_ID): number {
    const b = this.peek(what)
    let v: number
    if (b <= 0x7f) {
      this.pos++
      return b <= max ? b : fail(`${what}: ${b} exceeds ${max}`)
    }
    switch (b) {
      case 0xcc:
        this.need(2, what)
        this.pos++
        v = this.u8()
        break
      case 0xcd:
        this.need(3, what)
        this.pos++
        v = this.u16()
        break
      case 0xce:
        this.need(5, what)
        this.pos++
        v = this.u32()
        break
      case 0xcf: {
        this.need(9, what)
        this.pos++
        const hi = this.u32()
        const lo = this.u32()
        if (hi > 0x20_0000 || (hi === 0x20_0000 && lo !== 0))
          return fail(`${what}: ${decimalOf(hi, lo)} exceeds ${max}`)
        v = hi * TWO_32 + lo
        break
      }
      case 0xd0:
        this.need(2, what)
        this.pos++
        v = i8(this.buf, this.pos++)
        break
      case 0xd1:
        this.need(3, what)
        this.pos++
        v = i16(this.buf, this.pos)
        this.pos += 2
        break
      case 0xd2:
        this.need(5, what)
        this.pos++
        v = i32(this.buf, this.pos)
        this.pos += 4
        break
      case 0xd3: {
        this.need(9, what)
        this.pos++
        const hi = i32(this.buf, this.pos)
        const lo = be32(this.buf, this.pos + 4)
        this.pos += 8
        if (hi < 0) return fail(`${what}: expected an unsigned integer, got a negative value`)
        if (hi > 0x20_0000 || (hi === 0x20_0000 && lo !== 0))
          return fail(`${what}: ${decimalOf(hi, lo)} exceeds ${max}`)
        v = hi * TWO_32 + lo
        break
      }
      default:
        return fail(
          `${what}: expected an unsigned integer, got ${b >= 0xe0 ? "a negative integer" : typeName(b)}`
        )
    }
    if (v < 0) return fail(`${what}: expected an unsigned integer, got ${v}`)
    if (v > max) return fail(`${what}: ${v} exceeds ${max}`)
    return v
  }

  /**
   * A u64 of any integer encoding into `out[at]` (hi) and `out[at + 1]` (lo); signed values are
   * reinterpreted as u64. With `bytes`, a msgpack bin (or str) is folded to its low 8 bytes
   * read big-endian (engine byte-string hashes).
   */
  u64(out: Uint32Array, at: number, what: string, bytes = false): void {
    const buf = this.buf
    const pos = this.pos
    if (pos >= this.end) fail(`${what}: unexpected end of input`)
    const b = buf[pos]!
    if (b <= 0x7f) {
      out[at] = 0
      out[at + 1] = b
      this.pos = pos + 1
      return
    }
    if (b >= 0xe0) {
      out[at] = 0xffff_ffff
      out[at + 1] = (b - 256) >>> 0
      this.pos = pos + 1
      return
    }
    switch (b) {
      case 0xcf:
      case 0xd3:
        if (pos + 9 > this.end) fail(`${what}: truncated 64-bit integer`)
        out[at] = be32(this.buf, pos + 1)
        out[at + 1] = be32(this.buf, pos + 5)
        this.pos = pos + 9
        return
      case 0xcc:
        if (pos + 2 > this.end) fail(`${what}: truncated integer`)
        out[at] = 0
        out[at + 1] = buf[pos + 1]!
        this.pos = pos + 2
        return
      case 0xcd:
        if (pos + 3 > this.end) fail(`${what}: truncated integer`)
        out[at] = 0
        out[at + 1] = be16(this.buf, pos + 1)
        this.pos = pos + 3
        return
      case 0xce:
        if (pos + 5 > this.end) fail(`${what}: truncated integer`)
        out[at] = 0
        out[at + 1] = be32(this.buf, pos + 1)
        this.pos = pos + 5
        return
      case 0xd0:
      case 0xd1:
      case 0xd2: {
        const width = b === 0xd0 ? 1 : b === 0xd1 ? 2 : 4
        if (pos + 1 + width > this.end) fail(`${what}: truncated integer`)
        const v =
          width === 1 ? i8(this.buf, pos + 1) : width === 2 ? i16(this.buf, pos + 1) : i32(this.buf, pos + 1)
        out[at] = v < 0 ? 0xffff_ffff : 0
        out[at + 1] = v >>> 0
        this.pos = pos + 1 + width
        return
      }
    }
    if (bytes) {
      let n = this.tryBinHeader()
      if (n < 0) n = this.tryStrHeader()
      if (n >= 0) {
        const start = this.pos
        this.pos += n
        // Low 8 bytes, big-endian; shorter strings are left-padded with zeros.
        let hi = 0
        let lo = 0
        const from = Math.max(start, start + n - 8)
        for (let i = from; i < start + n; i++) {
          hi = ((hi << 8) | (lo >>> 24)) >>> 0
          lo = ((lo << 8) | buf[i]!) >>> 0
        }
        out[at] = hi
        out[at + 1] = lo
        return
      }
    }
    fail(`${what}: expected a 64-bit integer${bytes ? " or a byte string" : ""}, got ${typeName(b)}`)
  }

  /** A bin value as a view into the buffer (no copy); an array of byte values is accepted too. */
  bin(what: string): Uint8Array {
    const n = this.tryBinHeader()
    if (n >= 0) {
      const start = this.pos
      this.pos += n
      return this.buf.subarray(start, start + n)
    }
    const len = this.tryArray()
    if (len >= 0) {
      const out = new Uint8Array(len)
      for (let i = 0; i < len; i++) out[i] = this.uint(what, 255)
      return out
    }
    return fail(`${what}: expected a byte string, got ${typeName(this.peek(what))}`)
  }

  bool(what: string): boolean {
    const b = this.peek(what)
    if (b === 0xc2 || b === 0xc3) {
      this.pos++
      return b === 0xc3
    }
    return fail(`${what}: expected a bool, got ${typeName(b)}`)
  }

  /** Skips one value of any type, iteratively, so deeply nested garbage cannot overflow the stack. */
  skip(): void {
    let pending = 1
    while (pending > 0) {
      pending--
      const b = this.peek("value")
      this.pos++
      if (b <= 0x7f || b >= 0xe0 || b === 0xc0 || b === 0xc2 || b === 0xc3) continue
      if (b <= 0x8f) {
        pending += 2 * (b & 0x0f)
        continue
      }
      if (b <= 0x9f) {
        pending += b & 0x0f
        continue
      }
      if (b <= 0xbf) {
        this.advance(b & 0x1f)
        continue
      }
      switch (b) {
        case 0xc4:
        case 0xd9:
          this.need(1, "length")
          this.advance(this.u8())
          break
        case 0xc5:
        case 0xda:
          this.need(2, "length")
          this.advance(this.u16())
          break
        case 0xc6:
        case 0xdb:
          this.need(4, "length")
          this.advance(this.u32())
          break
        case 0xc7:
          this.need(1, "ext length")
          this.advance(this.u8() + 1)
          break
        case 0xc8:
          this.need(2, "ext length")
          this.advance(this.u16() + 1)
          break
        case 0xc9:
          this.need(4, "ext length")
          this.advance(this.u32() + 1)
          break
        case 0xca:
          this.advance(4)
          break
        case 0xcb:
          this.advance(8)
          break
        case 0xcc:
        case 0xd0:
          this.advance(1)
          break
        case 0xcd:
        case 0xd1:
          this.advance(2)
          break
        case 0xce:
        case 0xd2:
          this.advance(4)
          break
        case 0xcf:
        case 0xd3:
          this.advance(8)
          break
        case 0xd4:
          this.advance(2)
          break
        case 0xd5:
          this.advance(3)
          break
        case 0xd6:
          this.advance(5)
          break
        case 0xd7:
          this.advance(9)
          break
        case 0xd8:
          this.advance(17)
          break
        case 0xdc:
          this.need(2, "array length")
          pending += this.u16()
          break
        case 0xdd:
          this.need(4, "array length")
          pending += this.u32()
          break
        case 0xde:
          this.need(2, "map length")
          pending += 2 * this.u16()
          break
        case 0xdf:
          this.need(4, "map length")
          pending += 2 * this.u32()
          break
        default:
          fail(`value: ${typeName(b)} is not valid msgpack`)
      }
      if (pending > this.end - this.pos) fail(`value: ${pending} nested elements exceed the bytes left`)
    }
  }

  private advance(n: number): void {
    this.need(n, "value")
    this.pos += n
  }

  /** Saves the cursor, for look-ahead. */
  mark(): number {
    return this.pos
  }
  reset(mark: number): void {
    this.pos = mark
  }
}

// ---------------------------------------------------------------------------------------------
// Writer

/** A growable msgpack writer; integers use the smallest encoding, like rmp-serde and msgspec. */
export class MsgpackWriter {
  private buf: Uint8Array
  private view: DataView
  pos = 0

  constructor(initial = 256) {
    this.buf = new Uint8Array(initial)
    this.view = new DataView(this.buf.buffer)
  }

  private ensure(n: number): void {
    if (this.pos + n <= this.buf.length) return
    let size = this.buf.length * 2
    while (size < this.pos + n) size *= 2
    const next = new Uint8Array(size)
    next.set(this.buf.subarray(0, this.pos))
    this.buf = next
    this.view = new DataView(next.buffer)
  }

  /** A copy of the bytes written so far. */
  finish(): Uint8Array {
    return this.buf.slice(0, this.pos)
  }

  /** Reserves `n` raw bytes and returns their offset (frame headers). */
  reserve(n: number): number {
    this.ensure(n)
    const at = this.pos
    this.pos += n
    return at
  }

  setUint32At(at: number, value: number): void {
    this.view.setUint32(at, value)
  }
  setUint8At(at: number, value: number): void {
    this.buf[at] = value
  }

  nil(): this {
    this.ensure(1)
    this.buf[this.pos++] = 0xc0
    return this
  }

  bool(value: boolean): this {
    this.ensure(1)
    this.buf[this.pos++] = value ? 0xc3 : 0xc2
    return this
  }

  /**
   * The header of a sized type with length `n` in its smallest form: the byte `fixTag | n` for
   * `n <= fixMax` (`fixMax` -1: no fix form), then the 8-bit form (`op8` -1: none), 16-bit, 32-bit.
   */
  private header(n: number, fixTag: number, fixMax: number, op8: number, op16: number, op32: number): void {
    this.ensure(5)
    if (n <= fixMax) this.buf[this.pos++] = fixTag | n
    else if (op8 >= 0 && n < 0x100) {
      this.buf[this.pos++] = op8
      this.buf[this.pos++] = n
    } else if (n < 0x10000) {
      this.buf[this.pos++] = op16
      this.view.setUint16(this.pos, n)
      this.pos += 2
    } else {
      this.buf[this.pos++] = op32
      this.view.setUint32(this.pos, n)
      this.pos += 4
    }
  }

  array(n: number): this {
    this.header(n, 0x90, 15, -1, 0xdc, 0xdd)
    return this
  }

  map(n: number): this {
    this.header(n, 0x80, 15, -1, 0xde, 0xdf)
    return this
  }

  str(text: string): this {
    const bytes = utf8Encoder.encode(text)
    this.header(bytes.length, 0xa0, 31, 0xd9, 0xda, 0xdb)
    return this.raw(bytes)
  }

  /** Pre-encoded str bytes (map keys). */
  raw(bytes: Uint8Array): this {
    this.ensure(bytes.length)
    this.buf.set(bytes, this.pos)
    this.pos += bytes.length
    return this
  }

  bin(bytes: Uint8Array): this {
    this.header(bytes.length, 0, -1, 0xc4, 0xc5, 0xc6)
    return this.raw(bytes)
  }

  float64(value: number): this {
    this.ensure(9)
    this.buf[this.pos++] = 0xcb
    this.view.setFloat64(this.pos, value)
    this.pos += 8
    return this
  }

  /** A non-negative safe integer (or a negative one ≥ -2^31) in its smallest encoding. */
  int(value: number): this {
    if (value >= 0) {
      if (value < TWO_32) return this.u64(0, value)
      return this.u64(Math.floor(value / TWO_32), value % TWO_32)
    }
    this.ensure(5)
    if (value >= -32) this.buf[this.pos++] = value & 0xff
    else if (value >= -128) {
      this.buf[this.pos++] = 0xd0
      this.view.setInt8(this.pos++, value)
    } else if (value >= -32768) {
      this.buf[this.pos++] = 0xd1
      this.view.setInt16(this.pos, value)
      this.pos += 2
    } else {
      this.buf[this.pos++] = 0xd2
      this.view.setInt32(this.pos, value)
      this.pos += 4
    }
    return this
  }

  /** A u64 from halves, smallest unsigned encoding. */
  u64(hi: number, lo: number): this {
    this.ensure(9)
    const buf = this.buf
    if (hi !== 0) {
      buf[this.pos++] = 0xcf
      this.view.setUint32(this.pos, hi)
      this.view.setUint32(this.pos + 4, lo)
      this.pos += 8
    } else if (lo < 0x80) buf[this.pos++] = lo
    else if (lo < 0x100) {
      buf[this.pos++] = 0xcc
      buf[this.pos++] = lo
    } else if (lo < 0x10000) {
      buf[this.pos++] = 0xcd
      this.view.setUint16(this.pos, lo)
      this.pos += 2
    } else {
      buf[this.pos++] = 0xce
      this.view.setUint32(this.pos, lo)
      this.pos += 4
    }
    return this
  }

  /** A u64 from halves reinterpreted as i64, smallest signed encoding (SGLang hashes). */
  i64(hi: number, lo: number): this {
    hi >>>= 0
    lo >>>= 0
    if (hi < 0x8000_0000) return this.u64(hi, lo)
    if (hi === 0xffff_ffff && lo >= 0x8000_0000) return this.int(lo | 0)
    this.ensure(9)
    this.buf[this.pos++] = 0xd3
    this.view.setUint32(this.pos, hi)
    this.view.setUint32(this.pos + 4, lo)
    this.pos += 8
    return this
  }
}

// ---------------------------------------------------------------------------------------------
// RouterEvent payload (Vec<RouterEvent>, rmp-serde named maps)

/** A map key as a complete fixstr (header byte included), written with `MsgpackWriter.raw`. */
export const fixKey = (name: string): Uint8Array => {
  const bytes = ascii(name)
  if (bytes.length > 31) throw new Error(`key ${name} is too long for a fixstr`)
  const out = new Uint8Array(bytes.length + 1)
  out[0] = 0xa0 | bytes.length
  out.set(bytes, 1)
  return out
}

const K = (...names: ReadonlyArray<string>): ReadonlyArray<Uint8Array> => names.map(ascii)

const ROUTER_EVENT_KEYS = K("worker_id", "storage_tier", "event", "residency_domain", "state_source")
const KV_EVENT_KEYS = K("event_id", "data", "dp_rank")
const DATA_VARIANTS = K("stored", "removed", "cleared")
const STORED_KEYS = K("parent_hash", "start_position", "blocks")
const BLOCK_KEYS = K("block_hash", "tokens_hash", "mm_extra_info")
const REMOVED_KEYS = K("block_hashes")
const TIERS: ReadonlyArray<StorageTier> = ["device", "host_pinned", "disk", "external"]
const TIER_KEYS = K(...TIERS)

/** The variant index order of `KvCacheEventData` (older rmp-serde wrote indices, not names). */
const VARIANT_STORED = 0
const VARIANT_REMOVED = 1
const VARIANT_CLEARED = 2

const CLEARED: KvCacheEventData = { _tag: "Cleared" }
const scratch = new Uint32Array(2)

// One batch comes from one worker: remembering the last worker id text avoids a string per event.
let lastWorkerHi = -1
let lastWorkerLo = -1
let lastWorkerText: WorkerId = ""

const workerText = (hi: number, lo: number): WorkerId => {
  if (hi !== lastWorkerHi || lo !== lastWorkerLo) {
    lastWorkerText = decimalOf(hi, lo)
    lastWorkerHi = hi
    lastWorkerLo = lo
  }
  return lastWorkerText
}

const readWorkerId = (r: MsgpackReader): WorkerId => {
  r.u64(scratch, 0, "worker_id")
  return workerText(scratch[0]!, scratch[1]!)
}

/** `storage_tier`: a snake_case name, or (older rmp-serde) a variant index, `{variant: nil}` or `[index, []]`. */
const readTier = (r: MsgpackReader): StorageTier => {
  if (r.isInt()) {
    const index = r.uint("storage_tier", 3)
    return TIERS[index]!
  }
  const k = r.key(TIER_KEYS)
  if (k >= 0) return TIERS[k]!
  if (k === -1) return fail(`storage_tier: unknown tier ${JSON.stringify(r.lastKey())}`)
  const entries = r.tryMap()
  if (entries === 1) {
    const tier = readTier(r)
    r.skip()
    return tier
  }
  const len = entries < 0 ? r.tryArray() : -1
  if (len >= 1) {
    const tier = readTier(r)
    for (let i = 1; i < len; i++) r.skip()
    return tier
  }
  return fail("storage_tier: expected a tier name or variant index")
}

/** A hash list: an array of u64 (signed values reinterpreted). */
const readHashList = (r: MsgpackReader, what: string, bytes = false): Uint32Array => {
  const n = r.array(what)
  const out = new Uint32Array(2 * n)
  for (let i = 0; i < n; i++) r.u64(out, 2 * i, what, bytes)
  return out
}

const readOptionalHash = (r: MsgpackReader, what: string, bytes = false): Uint32Array | undefined => {
  if (r.nil()) return undefined
  const out = new Uint32Array(2)
  r.u64(out, 0, what, bytes)
  return out
}

const readOptionalU32 = (r: MsgpackReader, what: string): number | undefined =>
  r.nil() ? undefined : r.uint(what, 0xffff_ffff)

/** What `readBlocks` read, in module state (no result object per event). */
let blocksBlockHashes: Uint32Array = new Uint32Array(0)
let blocksTokensHashes: Uint32Array = new Uint32Array(0)

/**
 * The fast paths (exact-shape readers tried before the general ones) are on; tests turn them off
 * to check that both paths decode and reject the same inputs alike.
 */
let fastPaths = true
/** Tests only: decode with the general readers alone (`false`) or with the fast paths first (`true`). */
export const setDecoderFastPaths = (enabled: boolean): void => {
  fastPaths = enabled
}
/** Envelopes and events the fast paths have read (tests: the exact shapes do take them). */
export const decoderFastPathHits = { envelopes: 0, events: 0 }

// ---------------------------------------------------------------------------------------------
// Fast paths: the exact bytes rmp-serde `to_vec_named` writes for the common messages
// (PROTOCOL.md §3.1 field order, fixstr keys). Each one either reads its whole value or consumes
// nothing and reports a miss, and the general reader then reads the same bytes: a fast path
// never throws, so every error (and its text) comes from the general reader. The keys are
// compared as big-endian 32-bit words against constants (overlapping at the end of a segment),
// about a third of the cost of the byte loop in `key` over a key table.

/** The value read by `fastUnsigned`. */
let fastHi = 0
let fastLo = 0

/**
 * An unsigned integer of any width at `b[p]` (within `end`) into `fastHi`/`fastLo`: the position
 * after it, or -1 for anything else (a signed encoding included: the general reader decides
 * about those).
 */
const fastUnsigned = (b: Uint8Array, p: number, end: number): number => {
  const x = b[p]!
  if (x <= 0x7f) {
    fastHi = 0
    fastLo = x
    return p + 1
  }
  switch (x) {
    case 0xcc:
      if (p + 2 > end) return -1
      fastHi = 0
      fastLo = b[p + 1]!
      return p + 2
    case 0xcd:
      if (p + 3 > end) return -1
      fastHi = 0
      fastLo = be16(b, p + 1)
      return p + 3
    case 0xce:
      if (p + 5 > end) return -1
      fastHi = 0
      fastLo = be32(b, p + 1)
      return p + 5
    case 0xcf:
      if (p + 9 > end) return -1
      fastHi = be32(b, p + 1)
      fastLo = be32(b, p + 5)
      return p + 9
    default:
      return -1
  }
}

/**
 * One block exactly as rmp-serde writes Dynamo's `KvBlock` with full-width hashes, 57 bytes:
 * `0x83 "block_hash" 0xcf <8> "tokens_hash" 0xcf <8> "mm_extra_info" 0xc0` (fixstr keys). Its
 * 41 fixed bytes are compared as big-endian 32-bit words against constants (a byte loop over a
 * key table costs about three times as much; the key bytes are most of the decoding work).
 */
const FAST_BLOCK_BYTES = 57
const FAST_BLOCK_TEMPLATE = (() => {
  const t = new Uint8Array(FAST_BLOCK_BYTES)
  t.set([0x83, ...fixKey("block_hash"), 0xcf], 0)
  t.set([...fixKey("tokens_hash"), 0xcf], 21)
  t.set([...fixKey("mm_extra_info"), 0xc0], 42)
  return t
})()
/** Fixed word at byte `p` of the template. */
const tw = (p: number): number => i32(FAST_BLOCK_TEMPLATE, p)
// Bytes 0-12 (header, block_hash key, 0xcf), 21-33 (tokens_hash key, 0xcf), 42-56 (mm_extra_info key, nil).
const T0 = tw(0)
const T4 = tw(4)
const T8 = tw(8)
const T12 = FAST_BLOCK_TEMPLATE[12]!
const T21 = tw(21)
const T25 = tw(25)
const T29 = tw(29)
const T33 = FAST_BLOCK_TEMPLATE[33]!
const T42 = tw(42)
const T46 = tw(46)
const T50 = tw(50)
const T53 = tw(53)

/**
 * One block in exactly the shape of `FAST_BLOCK_TEMPLATE`: reads it and returns true, or returns
 * false having consumed nothing (the general reader then reads the same bytes, errors included).
 */
const readBlockFast = (
  r: MsgpackReader,
  blockHashes: Uint32Array,
  tokensHashes: Uint32Array,
  at: number
): boolean => {
  const p = r.pos
  // One bounds check for the whole block.
  if (p + FAST_BLOCK_BYTES > r.end) return false
  const b = r.buf
  // The words are spelled out rather than read with `i32`: sixteen calls exceed what V8 inlines here.
  if (
    ((((b[p]! << 24) | (b[p + 1]! << 16) | (b[p + 2]! << 8) | b[p + 3]!) ^ T0) |
      (((b[p + 4]! << 24) | (b[p + 5]! << 16) | (b[p + 6]! << 8) | b[p + 7]!) ^ T4) |
      (((b[p + 8]! << 24) | (b[p + 9]! << 16) | (b[p + 10]! << 8) | b[p + 11]!) ^ T8) |
      (b[p + 12]! ^ T12) |
      (((b[p + 21]! << 24) | (b[p + 22]! << 16) | (b[p + 23]! << 8) | b[p + 24]!) ^ T21) |
      (((b[p + 25]! << 24) | (b[p + 26]! << 16) | (b[p + 27]! << 8) | b[p + 28]!) ^ T25) |
      (((b[p + 29]! << 24) | (b[p + 30]! << 16) | (b[p + 31]! << 8) | b[p + 32]!) ^ T29) |
      (b[p + 33]! ^ T33) |
      (((b[p + 42]! << 24) | (b[p + 43]! << 16) | (b[p + 44]! << 8) | b[p + 45]!) ^ T42) |
      (((b[p + 46]! << 24) | (b[p + 47]! << 16) | (b[p + 48]! << 8) | b[p + 49]!) ^ T46) |
      (((b[p + 50]! << 24) | (b[p + 51]! << 16) | (b[p + 52]! << 8) | b[p + 53]!) ^ T50) |
      (((b[p + 53]! << 24) | (b[p + 54]! << 16) | (b[p + 55]! << 8) | b[p + 56]!) ^ T53)) !==
    0
  )
    return false
  blockHashes[at] = (b[p + 13]! << 24) | (b[p + 14]! << 16) | (b[p + 15]! << 8) | b[p + 16]!
  blockHashes[at + 1] = (b[p + 17]! << 24) | (b[p + 18]! << 16) | (b[p + 19]! << 8) | b[p + 20]!
  tokensHashes[at] = (b[p + 34]! << 24) | (b[p + 35]! << 16) | (b[p + 36]! << 8) | b[p + 37]!
  tokensHashes[at + 1] = (b[p + 38]! << 24) | (b[p + 39]! << 16) | (b[p + 40]! << 8) | b[p + 41]!
  r.pos = p + FAST_BLOCK_BYTES
  return true
}

/** One block of any accepted shape (a map of any key order, or positional). */
const readBlock = (
  r: MsgpackReader,
  blockHashes: Uint32Array,
  tokensHashes: Uint32Array,
  i: number
): void => {
  const entries = r.tryMap()
  if (entries >= 0) {
    let seen = 0
    for (let e = 0; e < entries; e++) {
      switch (r.key(BLOCK_KEYS)) {
        case 0:
          r.u64(blockHashes, 2 * i, "block_hash")
          seen |= 1
          break
        case 1:
          r.u64(tokensHashes, 2 * i, "tokens_hash")
          seen |= 2
          break
        case -2:
          r.skip()
          r.skip()
          break
        default:
          r.skip()
      }
    }
    if (seen !== 3) fail(`blocks[${i}]: missing ${seen & 1 ? "tokens_hash" : "block_hash"}`)
    return
  }
  const len = r.tryArray()
  if (len < 2) fail(`blocks[${i}]: expected a block map or [block_hash, tokens_hash, …]`)
  r.u64(blockHashes, 2 * i, "block_hash")
  r.u64(tokensHashes, 2 * i, "tokens_hash")
  for (let e = 2; e < len; e++) r.skip()
}

/** Reads `blocks` into `blocksBlockHashes` and `blocksTokensHashes`. */
const readBlocks = (r: MsgpackReader): void => {
  const n = r.array("blocks")
  const blockHashes = new Uint32Array(2 * n)
  const tokensHashes = new Uint32Array(2 * n)
  const fast = fastPaths
  for (let i = 0; i < n; i++) {
    if (!(fast && readBlockFast(r, blockHashes, tokensHashes, 2 * i)))
      readBlock(r, blockHashes, tokensHashes, i)
  }
  blocksBlockHashes = blockHashes
  blocksTokensHashes = tokensHashes
}

const readStored = (r: MsgpackReader): KvCacheEventData => {
  let parentHash: Uint32Array | undefined
  let startPosition: number | undefined
  let sawBlocks = false
  const entries = r.tryMap()
  if (entries >= 0) {
    for (let e = 0; e < entries; e++) {
      switch (r.key(STORED_KEYS)) {
        case 0:
          parentHash = readOptionalHash(r, "parent_hash")
          break
        case 1:
          startPosition = readOptionalU32(r, "start_position")
          break
        case 2:
          readBlocks(r)
          sawBlocks = true
          break
        case -2:
          r.skip()
          r.skip()
          break
        default:
          r.skip()
      }
    }
  } else {
    const len = r.array("stored")
    if (len === 1) return readStored(r) // older rmp-serde wrapped newtype variants: `[struct]`
    if (len < 2) fail("stored: expected [parent_hash, start_position?, blocks, …]")
    parentHash = readOptionalHash(r, "parent_hash")
    if (len >= 3) startPosition = readOptionalU32(r, "start_position")
    readBlocks(r)
    sawBlocks = true
    for (let e = 3; e < len; e++) r.skip()
  }
  if (!sawBlocks) return fail("stored: missing blocks")
  return {
    _tag: "Stored",
    blockHashes: blocksBlockHashes,
    tokensHashes: blocksTokensHashes,
    parentHash,
    startPosition
  }
}

const readRemoved = (r: MsgpackReader): KvCacheEventData => {
  let blockHashes: Uint32Array | undefined
  const entries = r.tryMap()
  if (entries >= 0) {
    for (let e = 0; e < entries; e++) {
      const k = r.key(REMOVED_KEYS)
      if (k === 0) blockHashes = readHashList(r, "block_hashes")
      else {
        if (k === -2) r.skip()
        r.skip()
      }
    }
  } else {
    const len = r.array("removed")
    if (len < 1) fail("removed: expected [block_hashes]")
    // `[[h, …]]` is the positional struct; `[{…}]` or `[[[h, …]]]` is a wrapped newtype variant.
    const mark = r.mark()
    const inner = r.tryMap() >= 0 ? 1 : r.tryArray() > 0 && r.tryArray() >= 0 ? 1 : 0
    r.reset(mark)
    if (len === 1 && inner === 1) return readRemoved(r)
    blockHashes = readHashList(r, "block_hashes")
    for (let e = 1; e < len; e++) r.skip()
  }
  if (blockHashes === undefined) return fail("removed: missing block_hashes")
  return { _tag: "Removed", blockHashes }
}

const readVariantContent = (r: MsgpackReader, variant: number): KvCacheEventData => {
  if (variant === VARIANT_STORED) return readStored(r)
  if (variant === VARIANT_REMOVED) return readRemoved(r)
  r.skip() // the unit variant's content (nil or `[]`)
  return CLEARED
}

const readVariantTag = (r: MsgpackReader): number => {
  if (r.isInt()) return r.uint("data variant index", VARIANT_CLEARED)
  const k = r.key(DATA_VARIANTS)
  if (k >= 0) return k
  return fail(k === -1 ? `data: unknown variant ${JSON.stringify(r.lastKey())}` : "data: bad variant tag")
}

/**
 * `KvCacheEventData`, externally tagged: `"cleared"` | `{stored: …}` | `{removed: …}`, and the
 * older rmp-serde forms `2` | `{0: …}` | `[index, content]` (variant indices, msgpack-rust #310/#319).
 */
const readData = (r: MsgpackReader): KvCacheEventData => {
  const entries = r.tryMap()
  if (entries >= 0) {
    if (entries !== 1) fail(`data: expected a single-entry variant map, got ${entries} entries`)
    return readVariantContent(r, readVariantTag(r))
  }
  const len = r.tryArray()
  if (len >= 0) {
    if (len !== 2) fail(`data: expected [variant, content], got ${len} elements`)
    return readVariantContent(r, readVariantTag(r))
  }
  const variant = readVariantTag(r)
  if (variant !== VARIANT_CLEARED) fail('data: only the unit variant "cleared" may be a bare tag')
  return CLEARED
}

/** The `event` part of one RouterEvent, read into module state (no closure or object per event). */
let kvEventId = -1
let kvDpRank = 0
let kvData: KvCacheEventData | undefined

const readKvEvent = (r: MsgpackReader): void => {
  kvEventId = -1
  kvDpRank = 0
  kvData = undefined
  const entries = r.tryMap()
  if (entries >= 0) {
    for (let e = 0; e < entries; e++) {
      switch (r.key(KV_EVENT_KEYS)) {
        case 0:
          kvEventId = r.uint("event_id")
          break
        case 1:
          kvData = readData(r)
          break
        case 2:
          kvDpRank = r.uint("dp_rank", 0xffff_ffff)
          break
        case -2:
          r.skip()
          r.skip()
          break
        default:
          r.skip()
      }
    }
    return
  }
  const len = r.array("event")
  if (len < 2) fail("event: expected [event_id, data, dp_rank?]")
  kvEventId = r.uint("event_id")
  kvData = readData(r)
  if (len >= 3) kvDpRank = r.nil() ? 0 : r.uint("dp_rank", 0xffff_ffff)
  for (let e = 3; e < len; e++) r.skip()
}

const readRouterEvent = (r: MsgpackReader): RouterEvent => {
  let workerId: WorkerId | undefined
  let storageTier: StorageTier = "device"
  let sawEvent = false
  const entries = r.tryMap()
  if (entries >= 0) {
    for (let e = 0; e < entries; e++) {
      switch (r.key(ROUTER_EVENT_KEYS)) {
        case 0:
          workerId = readWorkerId(r)
          break
        case 1:
          storageTier = readTier(r)
          break
        case 2:
          readKvEvent(r)
          sawEvent = true
          break
        case -2:
          r.skip()
          r.skip()
          break
        default:
          // residency_domain, state_source and later fields: tolerated (legacy relay semantics).
          r.skip()
      }
    }
  } else {
    const len = r.array("router event")
    if (len < 2) fail("router event: expected [worker_id, storage_tier, event, …]")
    workerId = readWorkerId(r)
    if (len >= 3) storageTier = readTier(r)
    readKvEvent(r)
    sawEvent = true
    for (let e = 3; e < len; e++) r.skip()
  }
  if (!sawEvent) return fail("router event: missing event")
  if (workerId === undefined) return fail("router event: missing worker_id")
  if (kvEventId < 0) return fail("event: missing event_id")
  if (kvData === undefined) return fail("event: missing data")
  return { workerId, dpRank: kvDpRank, eventId: kvEventId, storageTier, data: kvData }
}

const EV_WORKER = Uint8Array.of(0x83, ...fixKey("worker_id"))
const EV_WORKER_0 = i32(EV_WORKER, 0)
const EV_WORKER_4 = i32(EV_WORKER, 4)
const EV_WORKER_7 = i32(EV_WORKER, 7)
const atEvWorker = (b: Uint8Array, p: number): boolean =>
  ((i32(b, p) ^ EV_WORKER_0) | (i32(b, p + 4) ^ EV_WORKER_4) | (i32(b, p + 7) ^ EV_WORKER_7)) === 0
const EV_TIER = Uint8Array.of(...fixKey("storage_tier"), ...fixKey("device"))
const EV_TIER_0 = i32(EV_TIER, 0)
const EV_TIER_4 = i32(EV_TIER, 4)
const EV_TIER_8 = i32(EV_TIER, 8)
const EV_TIER_12 = i32(EV_TIER, 12)
const EV_TIER_16 = i32(EV_TIER, 16)
const atEvTier = (b: Uint8Array, p: number): boolean =>
  ((i32(b, p) ^ EV_TIER_0) |
    (i32(b, p + 4) ^ EV_TIER_4) |
    (i32(b, p + 8) ^ EV_TIER_8) |
    (i32(b, p + 12) ^ EV_TIER_12) |
    (i32(b, p + 16) ^ EV_TIER_16)) ===
  0
const EV_EVENT = Uint8Array.of(...fixKey("event"), 0x83, ...fixKey("event_id"))
const EV_EVENT_0 = i32(EV_EVENT, 0)
const EV_EVENT_4 = i32(EV_EVENT, 4)
const EV_EVENT_8 = i32(EV_EVENT, 8)
const EV_EVENT_12 = i32(EV_EVENT, 12)
const atEvEvent = (b: Uint8Array, p: number): boolean =>
  ((i32(b, p) ^ EV_EVENT_0) |
    (i32(b, p + 4) ^ EV_EVENT_4) |
    (i32(b, p + 8) ^ EV_EVENT_8) |
    (i32(b, p + 12) ^ EV_EVENT_12)) ===
  0
const EV_STORED = Uint8Array.of(...fixKey("data"), 0x81, ...fixKey("stored"), 0x83, ...fixKey("parent_hash"))
const EV_STORED_0 = i32(EV_STORED, 0)
const EV_STORED_4 = i32(EV_STORED, 4)
const EV_STORED_8 = i32(EV_STORED, 8)
const EV_STORED_12 = i32(EV_STORED, 12)
const EV_STORED_16 = i32(EV_STORED, 16)
const EV_STORED_20 = i32(EV_STORED, 20)
const EV_STORED_22 = i32(EV_STORED, 22)
const atEvStored = (b: Uint8Array, p: number): boolean =>
  ((i32(b, p) ^ EV_STORED_0) |
    (i32(b, p + 4) ^ EV_STORED_4) |
    (i32(b, p + 8) ^ EV_STORED_8) |
    (i32(b, p + 12) ^ EV_STORED_12) |
    (i32(b, p + 16) ^ EV_STORED_16) |
    (i32(b, p + 20) ^ EV_STORED_20) |
    (i32(b, p + 22) ^ EV_STORED_22)) ===
  0
const EV_START = Uint8Array.of(...fixKey("start_position"))
const EV_START_0 = i32(EV_START, 0)
const EV_START_4 = i32(EV_START, 4)
const EV_START_8 = i32(EV_START, 8)
const EV_START_11 = i32(EV_START, 11)
const atEvStart = (b: Uint8Array, p: number): boolean =>
  ((i32(b, p) ^ EV_START_0) |
    (i32(b, p + 4) ^ EV_START_4) |
    (i32(b, p + 8) ^ EV_START_8) |
    (i32(b, p + 11) ^ EV_START_11)) ===
  0
const EV_BLOCKS = Uint8Array.of(...fixKey("blocks"))
const EV_BLOCKS_0 = i32(EV_BLOCKS, 0)
const EV_BLOCKS_3 = i32(EV_BLOCKS, 3)
const atEvBlocks = (b: Uint8Array, p: number): boolean =>
  ((i32(b, p) ^ EV_BLOCKS_0) | (i32(b, p + 3) ^ EV_BLOCKS_3)) === 0
const EV_DP_RANK = Uint8Array.of(...fixKey("dp_rank"))
const EV_DP_RANK_0 = i32(EV_DP_RANK, 0)
const EV_DP_RANK_4 = i32(EV_DP_RANK, 4)
const atEvDpRank = (b: Uint8Array, p: number): boolean =>
  ((i32(b, p) ^ EV_DP_RANK_0) | (i32(b, p + 4) ^ EV_DP_RANK_4)) === 0
/**
 * A device-tier Stored RouterEvent exactly as Dynamo writes it: `{worker_id, storage_tier:
 * "device", event: {event_id, data: {stored: {parent_hash, start_position, blocks}}, dp_rank}}`
 * with every block in the shape of `FAST_BLOCK_TEMPLATE`. Undefined (nothing consumed) otherwise.
 */
const readStoredEventFast = (r: MsgpackReader): RouterEvent | undefined => {
  const b = r.buf
  const end = r.end
  const start = r.pos
  // Each segment's bounds include the first byte after it (the value that `fastUnsigned` reads).
  if (start + EV_WORKER.length + 1 > end || !atEvWorker(b, start)) return undefined
  let p = fastUnsigned(b, start + EV_WORKER.length, end)
  if (p < 0 || p + EV_TIER.length + EV_EVENT.length + 1 > end || !atEvTier(b, p)) return undefined
  const workerHi = fastHi
  const workerLo = fastLo
  p += EV_TIER.length
  if (!atEvEvent(b, p)) return undefined
  p = fastUnsigned(b, p + EV_EVENT.length, end)
  // event_id ≤ 2^53 (`MAX_SAFE_ID`); a larger one is the general reader's error.
  if (
    p < 0 ||
    fastHi > 0x20_0000 ||
    (fastHi === 0x20_0000 && fastLo !== 0) ||
    p + EV_STORED.length + 1 > end ||
    !atEvStored(b, p)
  )
    return undefined
  const eventId = fastHi * TWO_32 + fastLo
  p += EV_STORED.length
  let parentHash: Uint32Array | undefined
  if (b[p] === 0xc0) p++
  else {
    p = fastUnsigned(b, p, end)
    if (p < 0) return undefined
    parentHash = new Uint32Array(2)
    parentHash[0] = fastHi
    parentHash[1] = fastLo
  }
  if (p + EV_START.length + 1 > end || !atEvStart(b, p)) return undefined
  p += EV_START.length
  let startPosition: number | undefined
  if (b[p] === 0xc0) p++
  else {
    p = fastUnsigned(b, p, end)
    if (p < 0 || fastHi !== 0) return undefined
    startPosition = fastLo
  }
  if (p + EV_BLOCKS.length + 3 > end || !atEvBlocks(b, p)) return undefined
  p += EV_BLOCKS.length
  const header = b[p]!
  let n: number
  if ((header & 0xf0) === 0x90) {
    n = header & 0x0f
    p += 1
  } else if (header === 0xdc) {
    n = be16(b, p + 1)
    p += 3
  } else return undefined
  // The blocks, the dp_rank key and a fixint value, before anything is allocated.
  if (p + n * FAST_BLOCK_BYTES + EV_DP_RANK.length + 1 > end) return undefined
  const blockHashes = new Uint32Array(2 * n)
  const tokensHashes = new Uint32Array(2 * n)
  r.pos = p
  for (let i = 0; i < n; i++) {
    if (!readBlockFast(r, blockHashes, tokensHashes, 2 * i)) {
      r.pos = start
      return undefined
    }
  }
  p = r.pos
  if (atEvDpRank(b, p)) p = fastUnsigned(b, p + EV_DP_RANK.length, end)
  else p = -1
  if (p < 0 || fastHi !== 0) {
    r.pos = start
    return undefined
  }
  r.pos = p
  decoderFastPathHits.events++
  return {
    workerId: workerText(workerHi, workerLo),
    dpRank: fastLo,
    eventId,
    storageTier: "device",
    data: { _tag: "Stored", blockHashes, tokensHashes, parentHash, startPosition }
  }
}

/** Decodes `Vec<RouterEvent>`; a single RouterEvent map (as older sinks sent) is accepted too. Throws `MsgpackDecodeError`. */
export const readRouterEvents = (r: MsgpackReader): Array<RouterEvent> => {
  const b = r.peek("payload")
  if ((b >= 0x80 && b <= 0x8f) || b === 0xde || b === 0xdf) return [readRouterEvent(r)]
  const n = r.array("payload")
  const events = new Array<RouterEvent>(n)
  if (fastPaths) {
    for (let i = 0; i < n; i++) events[i] = readStoredEventFast(r) ?? readRouterEvent(r)
  } else for (let i = 0; i < n; i++) events[i] = readRouterEvent(r)
  return events
}

export type DecodeResult<A> =
  | { readonly ok: true; readonly value: A }
  | { readonly ok: false; readonly message: string }

/** Runs a throwing decoder; any failure (including a bug surfacing as a TypeError) becomes a message. */
export const guardDecode = <A>(run: () => A): DecodeResult<A> => {
  try {
    return { ok: true, value: run() }
  } catch (error) {
    return { ok: false, message: error instanceof Error ? error.message : String(error) }
  }
}

/** Decodes a RouterEvent payload from `bytes[start, end)`; never throws. */
export const decodeRouterEvents = (
  bytes: Uint8Array,
  start = 0,
  end = bytes.length
): DecodeResult<Array<RouterEvent>> =>
  guardDecode(() => readRouterEvents(new MsgpackReader(bytes, start, end)))

const KEY = {
  worker_id: fixKey("worker_id"),
  storage_tier: fixKey("storage_tier"),
  event: fixKey("event"),
  event_id: fixKey("event_id"),
  data: fixKey("data"),
  dp_rank: fixKey("dp_rank"),
  stored: fixKey("stored"),
  removed: fixKey("removed"),
  cleared: fixKey("cleared"),
  parent_hash: fixKey("parent_hash"),
  start_position: fixKey("start_position"),
  blocks: fixKey("blocks"),
  block_hash: fixKey("block_hash"),
  tokens_hash: fixKey("tokens_hash"),
  mm_extra_info: fixKey("mm_extra_info"),
  block_hashes: fixKey("block_hashes"),
  topic: fixKey("topic"),
  publisher_id: fixKey("publisher_id"),
  sequence: fixKey("sequence"),
  published_at: fixKey("published_at"),
  payload: fixKey("payload")
} as const

/** Halves of a canonical decimal u64 (worker ids); BigInt only above 15 digits. */
export const u64HalvesOfDecimal = (text: string): [number, number] => {
  if (text.length <= 15) {
    const n = Number(text)
    return [Math.floor(n / TWO_32), n % TWO_32]
  }
  const v = BigInt.asUintN(64, BigInt(text))
  return [Number(v >> 32n), Number(v & 0xffff_ffffn)]
}

/** Halves of a u64 given as bigint (publisher ids). */
export const u64HalvesOfBigInt = (value: bigint): [number, number] => {
  const v = BigInt.asUintN(64, value)
  return [Number(v >> 32n), Number(v & 0xffff_ffffn)]
}

export type VariantForm = "named" | "index-map" | "index-array"

export interface RouterEventEncodeOptions {
  /**
   * `named` (rmp-serde ≥ 1: `"cleared"`, `{stored: …}`), or the older variant-index forms
   * `index-map` (`{0: …}`, `{2: nil}`) and `index-array` (`[0, [content]]`, `[2, []]`).
   */
  readonly variants?: VariantForm
}

/** Writes one RouterEvent as rmp-serde `to_vec_named` does. */
export const writeRouterEvent = (
  w: MsgpackWriter,
  event: RouterEvent,
  options?: RouterEventEncodeOptions
): void => {
  const [whi, wlo] = u64HalvesOfDecimal(event.workerId)
  const form = options?.variants ?? "named"
  w.map(3).raw(KEY.worker_id).u64(whi, wlo).raw(KEY.storage_tier)
  if (form === "named") w.str(event.storageTier)
  else w.int(TIERS.indexOf(event.storageTier))
  w.raw(KEY.event).map(3).raw(KEY.event_id).int(event.eventId).raw(KEY.data)
  const data = event.data
  if (data._tag === "Cleared") {
    if (form === "named") w.raw(KEY.cleared)
    else if (form === "index-map") w.map(1).int(VARIANT_CLEARED).nil()
    else w.array(2).int(VARIANT_CLEARED).array(0)
  } else {
    const variant = data._tag === "Stored" ? VARIANT_STORED : VARIANT_REMOVED
    if (form === "named") w.map(1).raw(data._tag === "Stored" ? KEY.stored : KEY.removed)
    else if (form === "index-map") w.map(1).int(variant)
    else w.array(2).int(variant).array(1)
    const hashes = data.blockHashes
    const n = hashes.length >>> 1
    if (data._tag === "Stored") {
      w.map(3).raw(KEY.parent_hash)
      if (data.parentHash === undefined) w.nil()
      else w.u64(data.parentHash[0]!, data.parentHash[1]!)
      w.raw(KEY.start_position)
      if (data.startPosition === undefined) w.nil()
      else w.int(data.startPosition)
      const tokens = data.tokensHashes ?? hashes
      w.raw(KEY.blocks).array(n)
      for (let i = 0; i < n; i++) {
        w.map(3)
          .raw(KEY.block_hash)
          .u64(hashes[2 * i]!, hashes[2 * i + 1]!)
          .raw(KEY.tokens_hash)
          .u64(tokens[2 * i]!, tokens[2 * i + 1]!)
          .raw(KEY.mm_extra_info)
          .nil()
      }
    } else {
      w.map(1).raw(KEY.block_hashes).array(n)
      for (let i = 0; i < n; i++) w.u64(hashes[2 * i]!, hashes[2 * i + 1]!)
    }
  }
  w.raw(KEY.dp_rank).int(event.dpRank)
}

/** Encodes `Vec<RouterEvent>` as rmp-serde `to_vec_named` does. */
export const encodeRouterEvents = (
  events: ReadonlyArray<RouterEvent>,
  options?: RouterEventEncodeOptions
): Uint8Array => {
  const w = new MsgpackWriter(64 + events.length * 192)
  w.array(events.length)
  for (const event of events) writeRouterEvent(w, event, options)
  return w.finish()
}

// ---------------------------------------------------------------------------------------------
// EventEnvelope

export interface EventEnvelope {
  readonly topic: string
  readonly publisherId: bigint
  readonly sequence: number
  readonly publishedAtMs: number
  readonly payload: Uint8Array
}

/** A decoded envelope pointing into its buffer: the payload is `payloadBuffer[payloadStart, payloadEnd)`. */
export interface EnvelopeView {
  readonly topicStart: number
  readonly topicLength: number
  readonly publisherHi: number
  readonly publisherLo: number
  readonly payloadBuffer: Uint8Array
  readonly payloadStart: number
  readonly payloadEnd: number
}

const ENVELOPE_KEYS = K("topic", "publisher_id", "sequence", "published_at", "payload")

const ENV_TOPIC = Uint8Array.of(0x85, ...fixKey("topic"))
const ENV_TOPIC_0 = i32(ENV_TOPIC, 0)
const ENV_TOPIC_3 = i32(ENV_TOPIC, 3)
const atEnvTopic = (b: Uint8Array, p: number): boolean =>
  ((i32(b, p) ^ ENV_TOPIC_0) | (i32(b, p + 3) ^ ENV_TOPIC_3)) === 0
const ENV_PUBLISHER = Uint8Array.of(...fixKey("publisher_id"))
const ENV_PUBLISHER_0 = i32(ENV_PUBLISHER, 0)
const ENV_PUBLISHER_4 = i32(ENV_PUBLISHER, 4)
const ENV_PUBLISHER_8 = i32(ENV_PUBLISHER, 8)
const ENV_PUBLISHER_9 = i32(ENV_PUBLISHER, 9)
const atEnvPublisher = (b: Uint8Array, p: number): boolean =>
  ((i32(b, p) ^ ENV_PUBLISHER_0) |
    (i32(b, p + 4) ^ ENV_PUBLISHER_4) |
    (i32(b, p + 8) ^ ENV_PUBLISHER_8) |
    (i32(b, p + 9) ^ ENV_PUBLISHER_9)) ===
  0
const ENV_SEQUENCE = Uint8Array.of(...fixKey("sequence"))
const ENV_SEQUENCE_0 = i32(ENV_SEQUENCE, 0)
const ENV_SEQUENCE_4 = i32(ENV_SEQUENCE, 4)
const ENV_SEQUENCE_5 = i32(ENV_SEQUENCE, 5)
const atEnvSequence = (b: Uint8Array, p: number): boolean =>
  ((i32(b, p) ^ ENV_SEQUENCE_0) | (i32(b, p + 4) ^ ENV_SEQUENCE_4) | (i32(b, p + 5) ^ ENV_SEQUENCE_5)) === 0
const ENV_PUBLISHED = Uint8Array.of(...fixKey("published_at"))
const ENV_PUBLISHED_0 = i32(ENV_PUBLISHED, 0)
const ENV_PUBLISHED_4 = i32(ENV_PUBLISHED, 4)
const ENV_PUBLISHED_8 = i32(ENV_PUBLISHED, 8)
const ENV_PUBLISHED_9 = i32(ENV_PUBLISHED, 9)
const atEnvPublished = (b: Uint8Array, p: number): boolean =>
  ((i32(b, p) ^ ENV_PUBLISHED_0) |
    (i32(b, p + 4) ^ ENV_PUBLISHED_4) |
    (i32(b, p + 8) ^ ENV_PUBLISHED_8) |
    (i32(b, p + 9) ^ ENV_PUBLISHED_9)) ===
  0
const ENV_PAYLOAD = Uint8Array.of(...fixKey("payload"))
const ENV_PAYLOAD_0 = i32(ENV_PAYLOAD, 0)
const ENV_PAYLOAD_4 = i32(ENV_PAYLOAD, 4)
const atEnvPayload = (b: Uint8Array, p: number): boolean =>
  ((i32(b, p) ^ ENV_PAYLOAD_0) | (i32(b, p + 4) ^ ENV_PAYLOAD_4)) === 0

/**
 * An envelope exactly as Dynamo writes it, `{topic, publisher_id, sequence, published_at,
 * payload: bin}` with a fixstr or str8 topic: its view, or undefined (nothing consumed).
 */
const readEnvelopeFast = (r: MsgpackReader): EnvelopeView | undefined => {
  const b = r.buf
  const end = r.end
  let p = r.pos
  if (p + ENV_TOPIC.length + 2 > end || !atEnvTopic(b, p)) return undefined
  p += ENV_TOPIC.length
  const header = b[p]!
  let topicLength: number
  if ((header & 0xe0) === 0xa0) {
    topicLength = header & 0x1f
    p += 1
  } else if (header === 0xd9) {
    topicLength = b[p + 1]!
    p += 2
  } else return undefined
  const topicStart = p
  p += topicLength
  // The keys after the topic, their integers at their widest and a bin32 header.
  if (
    p +
      ENV_PUBLISHER.length +
      9 +
      ENV_SEQUENCE.length +
      9 +
      ENV_PUBLISHED.length +
      9 +
      ENV_PAYLOAD.length +
      5 >
      end ||
    !atEnvPublisher(b, p)
  )
    return undefined
  p = fastUnsigned(b, p + ENV_PUBLISHER.length, end)
  if (p < 0 || !atEnvSequence(b, p)) return undefined
  const publisherHi = fastHi
  const publisherLo = fastLo
  p = fastUnsigned(b, p + ENV_SEQUENCE.length, end)
  if (p < 0 || !atEnvPublished(b, p)) return undefined
  p = fastUnsigned(b, p + ENV_PUBLISHED.length, end)
  if (p < 0 || !atEnvPayload(b, p)) return undefined
  p += ENV_PAYLOAD.length
  const bin = b[p]!
  let length: number
  if (bin === 0xc4) {
    length = b[p + 1]!
    p += 2
  } else if (bin === 0xc5) {
    length = be16(b, p + 1)
    p += 3
  } else if (bin === 0xc6) {
    length = be32(b, p + 1)
    p += 5
  } else return undefined
  if (p + length > end) return undefined
  r.pos = p + length
  decoderFastPathHits.envelopes++
  return {
    topicStart,
    topicLength,
    publisherHi,
    publisherLo,
    payloadBuffer: b,
    payloadStart: p,
    payloadEnd: p + length
  }
}

/** Reads an `EventEnvelope` map (or its positional form); throws `MsgpackDecodeError`. */
export const readEnvelope = (r: MsgpackReader): EnvelopeView => {
  if (fastPaths) {
    const view = readEnvelopeFast(r)
    if (view !== undefined) return view
  }
  return readEnvelopeGeneral(r)
}

const readEnvelopeGeneral = (r: MsgpackReader): EnvelopeView => {
  let topicStart = -1
  let topicLength = 0
  let sawPublisher = false
  let payloadBuffer: Uint8Array | undefined
  let payloadStart = 0
  let payloadEnd = 0
  const readTopic = (): void => {
    const n = r.tryStrHeader()
    if (n < 0) fail(`envelope topic: expected a string, got ${typeName(r.peek("envelope topic"))}`)
    topicStart = r.pos
    topicLength = n
    r.pos += n
  }
  const readPayload = (): void => {
    const n = r.tryBinHeader()
    if (n >= 0) {
      payloadBuffer = r.buf
      payloadStart = r.pos
      payloadEnd = r.pos + n
      r.pos += n
      return
    }
    // A Vec<u8> without serde_bytes is an array of byte values: it has to be copied out.
    payloadBuffer = r.bin("envelope payload")
    payloadStart = 0
    payloadEnd = payloadBuffer.length
  }
  const entries = r.tryMap()
  if (entries >= 0) {
    for (let e = 0; e < entries; e++) {
      switch (r.key(ENVELOPE_KEYS)) {
        case 0:
          readTopic()
          break
        case 1:
          r.u64(scratch, 0, "envelope publisher_id")
          sawPublisher = true
          break
        case 4:
          readPayload()
          break
        case -2:
          r.skip()
          r.skip()
          break
        default:
          r.skip()
      }
    }
  } else {
    const len = r.array("envelope")
    if (len < 5) fail("envelope: expected {topic, publisher_id, sequence, published_at, payload}")
    readTopic()
    r.u64(scratch, 0, "envelope publisher_id")
    sawPublisher = true
    r.skip()
    r.skip()
    readPayload()
    for (let e = 5; e < len; e++) r.skip()
  }
  if (topicStart < 0) fail("envelope: missing topic")
  if (!sawPublisher) fail("envelope: missing publisher_id")
  if (payloadBuffer === undefined) return fail("envelope: missing payload")
  return {
    topicStart,
    topicLength,
    publisherHi: scratch[0]!,
    publisherLo: scratch[1]!,
    payloadBuffer,
    payloadStart,
    payloadEnd
  }
}

/** Writes an `EventEnvelope` as rmp-serde `to_vec_named` does. */
export const writeEnvelope = (w: MsgpackWriter, envelope: EventEnvelope): void => {
  const [hi, lo] = u64HalvesOfBigInt(envelope.publisherId)
  w.map(5)
    .raw(KEY.topic)
    .str(envelope.topic)
    .raw(KEY.publisher_id)
    .u64(hi, lo)
    .raw(KEY.sequence)
    .int(envelope.sequence)
    .raw(KEY.published_at)
    .int(envelope.publishedAtMs)
    .raw(KEY.payload)
    .bin(envelope.payload)
}

export const encodeEnvelope = (envelope: EventEnvelope): Uint8Array => {
  const w = new MsgpackWriter(64 + envelope.payload.length)
  writeEnvelope(w, envelope)
  return w.finish()
}

// ---------------------------------------------------------------------------------------------
// Worker query (PROTOCOL.md §4): snake_case maps, externally tagged responses

const REQUEST_KEYS = K(
  "worker_id",
  "dp_rank",
  "start_event_id",
  "end_event_id",
  "supports_tree_dump_failed",
  "kind"
)

/** A decoded request; `kind` is the v4 query kind when one was sent (`recovery` is the only one served). */
export interface DecodedWorkerQueryRequest extends WorkerKvQueryRequest {
  readonly kind: string | undefined
}

const readOptionalId = (r: MsgpackReader, what: string): number | undefined =>
  r.nil() ? undefined : r.uint(what)

/** Throws `MsgpackDecodeError`. */
export const readWorkerQueryRequest = (r: MsgpackReader): DecodedWorkerQueryRequest => {
  let workerId: WorkerId | undefined
  let dpRank = 0
  let startEventId: number | undefined
  let endEventId: number | undefined
  let supportsTreeDumpFailed = false
  let kind: string | undefined
  const entries = r.map("worker query request")
  for (let e = 0; e < entries; e++) {
    switch (r.key(REQUEST_KEYS)) {
      case 0:
        r.u64(scratch, 0, "worker_id")
        workerId = decimalOf(scratch[0]!, scratch[1]!)
        break
      case 1:
        dpRank = r.uint("dp_rank", 0xffff_ffff)
        break
      case 2:
        startEventId = readOptionalId(r, "start_event_id")
        break
      case 3:
        endEventId = readOptionalId(r, "end_event_id")
        break
      case 4:
        supportsTreeDumpFailed = r.nil() ? false : r.bool("supports_tree_dump_failed")
        break
      case 5: {
        // A unit variant is a string; a struct variant a single-entry map keyed by its name.
        const entries = r.tryMap()
        kind = r.string("kind")
        if (entries === 1) r.skip()
        else if (entries > 1) fail("kind: expected a single-entry variant map")
        break
      }
      case -2:
        r.skip()
        r.skip()
        break
      default:
        r.skip()
    }
  }
  if (workerId === undefined) return fail("worker query request: missing worker_id")
  return { workerId, dpRank, startEventId, endEventId, supportsTreeDumpFailed, kind }
}

export const decodeWorkerQueryRequest = (bytes: Uint8Array): DecodeResult<DecodedWorkerQueryRequest> =>
  guardDecode(() => readWorkerQueryRequest(new MsgpackReader(bytes)))

const REQUEST_KEY = {
  worker_id: fixKey("worker_id"),
  dp_rank: fixKey("dp_rank"),
  start_event_id: fixKey("start_event_id"),
  end_event_id: fixKey("end_event_id"),
  supports_tree_dump_failed: fixKey("supports_tree_dump_failed")
}

const writeOptionalId = (w: MsgpackWriter, id: number | undefined): MsgpackWriter =>
  id === undefined ? w.nil() : w.int(id)

export const encodeWorkerQueryRequest = (request: WorkerKvQueryRequest): Uint8Array => {
  const [hi, lo] = u64HalvesOfDecimal(request.workerId)
  const w = new MsgpackWriter(96)
  w.map(5).raw(REQUEST_KEY.worker_id).u64(hi, lo).raw(REQUEST_KEY.dp_rank).int(request.dpRank)
  writeOptionalId(w.raw(REQUEST_KEY.start_event_id), request.startEventId)
  writeOptionalId(w.raw(REQUEST_KEY.end_event_id), request.endEventId)
  w.raw(REQUEST_KEY.supports_tree_dump_failed).bool(request.supportsTreeDumpFailed)
  return w.finish()
}

const RESPONSE_TAGS = K("Events", "TreeDump", "TreeDumpFailed", "TooNew", "InvalidRange", "Error")
const EVENTS_KEYS = K("events", "last_event_id")
const DUMP_FAILED_KEYS = K("last_event_id", "message")
const TOO_NEW_KEYS = K("requested_start", "requested_end", "newest_available")
const INVALID_RANGE_KEYS = K("start_id", "end_id")

const readEventsBody = (r: MsgpackReader, tag: "Events" | "TreeDump"): WorkerKvQueryResponse => {
  const entries = r.tryMap()
  if (entries < 0) {
    // v1: a bare list. Only `Events` can be used without a watermark (its last id is one).
    if (tag === "TreeDump") fail("TreeDump: a bare list (v1) carries no last_event_id")
    const events = readRouterEvents(r)
    return {
      _tag: "Events",
      events,
      lastEventId: events.length === 0 ? 0 : events[events.length - 1]!.eventId
    }
  }
  let events: Array<RouterEvent> | undefined
  let lastEventId = -1
  for (let e = 0; e < entries; e++) {
    switch (r.key(EVENTS_KEYS)) {
      case 0:
        events = readRouterEvents(r)
        break
      case 1:
        lastEventId = r.uint("last_event_id")
        break
      case -2:
        r.skip()
        r.skip()
        break
      default:
        r.skip()
    }
  }
  if (events === undefined) return fail(`${tag}: missing events`)
  if (lastEventId < 0) return fail(`${tag}: missing last_event_id`)
  return { _tag: tag, events, lastEventId }
}

/** Throws `MsgpackDecodeError`. */
export const readWorkerQueryResponse = (r: MsgpackReader): WorkerKvQueryResponse => {
  const entries = r.map("worker query response")
  if (entries !== 1) fail(`worker query response: expected one variant, got ${entries} entries`)
  const tag = r.key(RESPONSE_TAGS)
  switch (tag) {
    case 0:
      return readEventsBody(r, "Events")
    case 1:
      return readEventsBody(r, "TreeDump")
    case 2: {
      let lastEventId = -1
      let message = ""
      const n = r.map("TreeDumpFailed")
      for (let e = 0; e < n; e++) {
        const k = r.key(DUMP_FAILED_KEYS)
        if (k === 0) lastEventId = r.uint("last_event_id")
        else if (k === 1) message = r.string("message")
        else {
          if (k === -2) r.skip()
          r.skip()
        }
      }
      if (lastEventId < 0) return fail("TreeDumpFailed: missing last_event_id")
      return { _tag: "TreeDumpFailed", lastEventId, message }
    }
    case 3: {
      let requestedStart: number | undefined
      let requestedEnd: number | undefined
      let newestAvailable = -1
      const n = r.map("TooNew")
      for (let e = 0; e < n; e++) {
        const k = r.key(TOO_NEW_KEYS)
        if (k === 0) requestedStart = readOptionalId(r, "requested_start")
        else if (k === 1) requestedEnd = readOptionalId(r, "requested_end")
        else if (k === 2) newestAvailable = r.uint("newest_available")
        else {
          if (k === -2) r.skip()
          r.skip()
        }
      }
      if (newestAvailable < 0) return fail("TooNew: missing newest_available")
      return { _tag: "TooNew", requestedStart, requestedEnd, newestAvailable }
    }
    case 4: {
      let startId = -1
      let endId = -1
      const n = r.map("InvalidRange")
      for (let e = 0; e < n; e++) {
        const k = r.key(INVALID_RANGE_KEYS)
        if (k === 0) startId = r.uint("start_id")
        else if (k === 1) endId = r.uint("end_id")
        else {
          if (k === -2) r.skip()
          r.skip()
        }
      }
      if (startId < 0 || endId < 0) return fail("InvalidRange: missing start_id or end_id")
      return { _tag: "InvalidRange", startId, endId }
    }
    case 5:
      return { _tag: "Error", message: r.string("Error") }
    case -1:
      return fail(`worker query response: unknown variant ${JSON.stringify(r.lastKey())}`)
    default:
      return fail("worker query response: the variant tag is not a string")
  }
}

export const decodeWorkerQueryResponse = (bytes: Uint8Array): DecodeResult<WorkerKvQueryResponse> =>
  guardDecode(() => readWorkerQueryResponse(new MsgpackReader(bytes)))

const RESPONSE_KEY = {
  Events: fixKey("Events"),
  TreeDump: fixKey("TreeDump"),
  TreeDumpFailed: fixKey("TreeDumpFailed"),
  TooNew: fixKey("TooNew"),
  InvalidRange: fixKey("InvalidRange"),
  Error: fixKey("Error"),
  events: fixKey("events"),
  last_event_id: fixKey("last_event_id"),
  message: fixKey("message"),
  requested_start: fixKey("requested_start"),
  requested_end: fixKey("requested_end"),
  newest_available: fixKey("newest_available"),
  start_id: fixKey("start_id"),
  end_id: fixKey("end_id")
}

export const encodeWorkerQueryResponse = (response: WorkerKvQueryResponse): Uint8Array => {
  const w = new MsgpackWriter(128)
  w.map(1)
  switch (response._tag) {
    case "Events":
    case "TreeDump":
      w.raw(RESPONSE_KEY[response._tag]).map(2).raw(RESPONSE_KEY.events).array(response.events.length)
      for (const event of response.events) writeRouterEvent(w, event)
      w.raw(RESPONSE_KEY.last_event_id).int(response.lastEventId)
      break
    case "TreeDumpFailed":
      w.raw(RESPONSE_KEY.TreeDumpFailed)
        .map(2)
        .raw(RESPONSE_KEY.last_event_id)
        .int(response.lastEventId)
        .raw(RESPONSE_KEY.message)
        .str(response.message)
      break
    case "TooNew":
      w.raw(RESPONSE_KEY.TooNew).map(3)
      writeOptionalId(w.raw(RESPONSE_KEY.requested_start), response.requestedStart)
      writeOptionalId(w.raw(RESPONSE_KEY.requested_end), response.requestedEnd)
      w.raw(RESPONSE_KEY.newest_available).int(response.newestAvailable)
      break
    case "InvalidRange":
      w.raw(RESPONSE_KEY.InvalidRange)
        .map(2)
        .raw(RESPONSE_KEY.start_id)
        .int(response.startId)
        .raw(RESPONSE_KEY.end_id)
        .int(response.endId)
      break
    case "Error":
      w.raw(RESPONSE_KEY.Error).str(response.message)
      break
  }
  return w.finish()
}
