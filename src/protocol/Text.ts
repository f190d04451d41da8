/**
 * String rules shared by the domain: the reference is Rust, so names are validated with Rust's
 * notion of whitespace and ordered byte-wise over UTF-8, not by JavaScript's UTF-16 comparison.
 */

/**
 * Rust `char::is_whitespace` (Unicode White_Space). JavaScript's `\s` differs: it omits U+0085 and
 * adds U+FEFF, so `String.prototype.trim` would accept or reject names the reference treats otherwise.
 */
const WHITESPACE = "\\t\\n\\v\\f\\r \\u0085\\u00a0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000"
const SURROUNDING_WHITESPACE = new RegExp(`^[${WHITESPACE}]|[${WHITESPACE}]$`, "u")
// With the `u` flag a surrogate pair is one code point, so only lone surrogates match.
const LONE_SURROGATE = /[\ud800-\udfff]/u

/** True when the text starts or ends with white space. */
export const hasSurroundingWhitespace = (value: string): boolean => SURROUNDING_WHITESPACE.test(value)

/** False for strings with lone surrogates: they have no UTF-8 form and a Rust peer rejects them. */
export const isWellFormedUnicode = (value: string): boolean => !LONE_SURROGATE.test(value)

/** Why a name breaks the name rules. */
export type NameProblem = "Empty" | "SurroundingWhitespace" | "NotUnicode"

/** The `CanonicalModelId` / `ModelAlias` / DC name rule: non-empty, `trim(s) == s`. */
export const nameProblem = (value: string): NameProblem | undefined => {
  if (value.length === 0) return "Empty"
  if (hasSurroundingWhitespace(value)) return "SurroundingWhitespace"
  if (!isWellFormedUnicode(value)) return "NotUnicode"
  return undefined
}

/** The problem in words, for messages. */
export const nameProblemText = (problem: NameProblem): string =>
  problem === "Empty"
    ? "must not be empty"
    : problem === "SurroundingWhitespace"
      ? "must not have leading or trailing whitespace"
      : "must be well-formed Unicode (no lone surrogates)"

/** UTF-8 length of a well-formed string without allocating an encoding. */
export const utf8Length = (value: string): number => {
  let bytes = 0
  for (let i = 0; i < value.length; i++) {
    const unit = value.charCodeAt(i)
    if (unit < 0x80) bytes += 1
    else if (unit < 0x800) bytes += 2
    else if (unit >= 0xd800 && unit <= 0xdbff && i + 1 < value.length) {
      const next = value.charCodeAt(i + 1)
      if (next >= 0xdc00 && next <= 0xdfff) {
        bytes += 4
        i++
      } else bytes += 3
    } else bytes += 3
  }
  return bytes
}

/**
 * Total order equal to byte-wise comparison of the UTF-8 encodings (Rust `str`/`BTreeMap` order).
 * UTF-16 order differs only where a surrogate meets a unit in U+E000..U+FFFF; remapping both ranges
 * restores code point order, which UTF-8 preserves.
 */
export const compareUtf8 = (a: string, b: string): number => {
  if (a === b) return 0
  const n = Math.min(a.length, b.length)
  for (let i = 0; i < n; i++) {
    let x = a.charCodeAt(i)
    let y = b.charCodeAt(i)
    if (x === y) continue
    if (x >= 0xd800) x += x <= 0xdfff ? 0x2000 : -0x800
    if (y >= 0xd800) y += y <= 0xdfff ? 0x2000 : -0x800
    return x < y ? -1 : 1
  }
  return a.length - b.length
}

/** Lexicographic order of two sequences under an element order (Rust `Vec` / slice order). */
export const compareArrays = <A>(
  a: ReadonlyArray<A>,
  b: ReadonlyArray<A>,
  compare: (x: A, y: A) => number
): number => {
  const n = Math.min(a.length, b.length)
  for (let i = 0; i < n; i++) {
    const c = compare(a[i]!, b[i]!)
    if (c !== 0) return c
  }
  return a.length - b.length
}
