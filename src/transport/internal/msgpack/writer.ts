/**
 * The growable msgpack writer, and `fixKey`: a map key as the writer writes it, which the
 * decoders' fast paths also compare against.
 */

import { ascii, TWO_32, utf8Encoder } from "./reader.js"

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

/** A map key as a complete fixstr (header byte included), written with `MsgpackWriter.raw`. */
export const fixKey = (name: string): Uint8Array => {
  const bytes = ascii(name)
  if (bytes.length > 31) throw new Error(`key ${name} is too long for a fixstr`)
  const out = new Uint8Array(bytes.length + 1)
  out[0] = 0xa0 | bytes.length
  out.set(bytes, 1)
  return out
}

export const K = (...names: ReadonlyArray<string>): ReadonlyArray<Uint8Array> => names.map(ascii)
