import fc from "fast-check"
import { describe, expect, it } from "vitest"
import {
  compareUtf8,
  hasSurroundingWhitespace,
  isWellFormedUnicode,
  nameProblem,
  utf8Length
} from "../../src/protocol/Text.js"

const unicode = fc.string({ unit: "binary", maxLength: 12 })

describe("text", () => {
  it("compareUtf8 agrees with byte-wise comparison of the UTF-8 encodings", () => {
    fc.assert(
      fc.property(unicode, unicode, (a, b) => {
        expect(Math.sign(compareUtf8(a, b))).toBe(Math.sign(Buffer.compare(Buffer.from(a), Buffer.from(b))))
      }),
      { numRuns: 2000 }
    )
    // The case UTF-16 order gets wrong: a supplementary character against U+E000..U+FFFF.
    expect(compareUtf8("😀", "\uffff")).toBeGreaterThan(0)
    expect("😀" < "\uffff").toBe(true)
  })

  it("utf8Length equals the encoded length", () => {
    fc.assert(fc.property(unicode, (s) => utf8Length(s) === Buffer.byteLength(s, "utf8")))
  })

  it("uses Rust's whitespace set", () => {
    for (const ws of ["\t", "\n", "\r", " ", "\u0085", "\u00a0", "\u2000", "\u3000"]) {
      expect(hasSurroundingWhitespace(`${ws}x`)).toBe(true)
      expect(hasSurroundingWhitespace(`x${ws}`)).toBe(true)
      expect(hasSurroundingWhitespace(`x${ws}x`)).toBe(false)
    }
    expect(hasSurroundingWhitespace("\ufeffx")).toBe(false)
    expect(nameProblem("")).toBe("Empty")
    expect(nameProblem("ok")).toBeUndefined()
  })

  it("detects lone surrogates only", () => {
    expect(isWellFormedUnicode("😀")).toBe(true)
    expect(isWellFormedUnicode("\ud83d")).toBe(false)
    expect(isWellFormedUnicode("x\ude00")).toBe(false)
  })
})
