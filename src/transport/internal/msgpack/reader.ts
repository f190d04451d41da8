/**
 * The msgpack cursor reader over a `Uint8Array`, and the decode error every codec throws
 * internally (`MsgpackDecodeError`; the exported `decode*` functions catch it).
 */
import { Data } from "effect"
import { decimalOf } from "../../../ckf/u64.js"

/** Why a msgpack value could not be decoded; the message names the field and what was wrong. */
export class MsgpackDecodeError extends Data.TaggedError("MsgpackDecodeError")<{
  readonly message: string
}> {}

/** Throws a `MsgpackDecodeError`; decoders call it, the exported `decode*` functions catch it. */
export const failDecode = (message: string): never => {
  throw new MsgpackDecodeError({ message })
}
export const fail = failDecode

export const TWO_32 = 4294967296
/** Largest integer a decoded id may take: larger values would lose precision as a number. */
export const MAX_SAFE_ID = 2 ** 53

const utf8 = new TextDecoder("utf-8", { fatal: false })
export const utf8Encoder = new TextEncoder()

export const ascii = (text: string): Uint8Array => utf8Encoder.encode(text)

export const typeName = (byte: number): string => {
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
export const be16 = (b: Uint8Array, p: number): number => (b[p]! << 8) | b[p + 1]!
export const i32 = (b: Uint8Array, p: number): number =>
  (b[p]! << 24) | (b[p + 1]! << 16) | (b[p + 2]! << 8) | b[p + 3]!
export const be32 = (b: Uint8Array, p: number): number => i32(b, p) >>> 0
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
