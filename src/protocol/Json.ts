/**
 * The JSON conventions of every document of PROTOCOL.md: `effect/Schema` decoding with unknown
 * fields rejected and errors worded for the reader (`decodeJson`, `formatParseError`), the depth
 * limit, and the scalars (a u64 is canonical decimal text, a JSON number ≤ 2^53 accepted on input
 * only; digests are lowercase hex).
 */

import { Data, Either, ParseResult, Schema, type SchemaAST } from "effect"
import { DcId } from "../ckf/identity.js"
import type { WorkerId } from "./Events.js"

// ---------------------------------------------------------------------------------------------
// Decode / encode helpers

/** A JSON document that could not be decoded; the message names the field at fault. */
export class JsonDecodeError extends Data.TaggedError("JsonDecodeError")<{ readonly message: string }> {}
/** A value that could not be encoded as its JSON document. */
export class JsonEncodeError extends Data.TaggedError("JsonEncodeError")<{ readonly message: string }> {}

const pathText = (path: ReadonlyArray<PropertyKey>): string => {
  let out = ""
  for (const key of path) {
    if (typeof key === "number") out += `[${key}]`
    else out += out.length === 0 ? String(key) : `.${String(key)}`
  }
  return out
}

const OPTIONAL_MISMATCH = /^Expected (undefined|null), actual /

/**
 * How the wording of decode errors reads: `schema` keeps the schema library's own sentences
 * (configuration files, discovery records), `contract` rewrites its `Expected T, actual V` into the
 * protocol's words and never repeats a long value (HTTP request bodies, PROTOCOL §7 ◆3).
 */
export type ErrorWording = "schema" | "contract"

const LITERAL = String.raw`(?:"(?:[^"\\]|\\.)*"|-?\d+(?:\.\d+)?|true|false|null)`
const LITERALS = new RegExp(`^${LITERAL}(?: \\| ${LITERAL})*$`)

/** The contract's words for a schema's type text (`ReadonlyArray<U64>` → "an array"). */
const typeWords = (type: string): string => {
  const t = type.trim()
  if (t.startsWith("{")) return "a JSON object"
  if (/^(?:ReadonlyArray|Array)<|^(?:readonly )?\[/.test(t)) return "an array"
  if (LITERALS.test(t)) {
    const parts = t.split(" | ")
    return parts.length === 1 ? parts[0]! : `one of ${parts.join(", ")}`
  }
  if (t.includes(" | ") && !/[{<[]/.test(t)) return t.split(" | ").map(typeWords).join(" or ")
  switch (t) {
    case "string":
      return "a string"
    case "number":
      return "a number"
    case "boolean":
      return "true or false"
    case "null":
      return "null"
    default:
      return "a valid value"
  }
}

/** A value as the schema library rendered it, described rather than repeated when it is long. */
const actualWords = (actual: string): string => {
  const a = actual.trim()
  if (a.startsWith("[")) return "an array"
  if (a.startsWith("{")) return "an object"
  if (a.startsWith('"')) return a.length <= 42 ? a : "a long string"
  return a.length <= 40 ? a : "another value"
}

/** One issue's message in the contract's words (see `ErrorWording`). */
export const contractIssueMessage = (message: string): string => {
  const found = /^Expected ([\s\S]*?), actual ([\s\S]*)$/.exec(message)
  return found === null ? message : `expected ${typeWords(found[1]!)}, got ${actualWords(found[2]!)}`
}

/** A field path, cut short when a client sent an absurdly long name. */
const shortPath = (path: string): string => (path.length <= 80 ? path : `${path.slice(0, 77)}…`)

/** One line per document: `unknown field "card.foo"`, `missing field "dcId"`, `seed: <why>`. */
export const formatParseError = (error: ParseResult.ParseError, wording: ErrorWording = "schema"): string => {
  let issues: ReadonlyArray<ParseResult.ArrayFormatterIssue>
  try {
    issues = ParseResult.ArrayFormatter.formatErrorSync(error)
  } catch {
    // The formatter renders the offending value recursively; a pathological one cannot be shown.
    return "invalid value"
  }
  const contract = wording === "contract"
  // An optional or nullable field is a union with undefined/null; their mismatches only hide the cause.
  const relevant = issues.filter((issue) => !OPTIONAL_MISMATCH.test(issue.message))
  return (relevant.length > 0 ? relevant : issues)
    .map((issue) => {
      const full = pathText(issue.path)
      const at = contract ? shortPath(full) : full
      if (issue._tag === "Unexpected") return `unknown field ${JSON.stringify(at)}`
      if (issue._tag === "Missing") return `missing field ${JSON.stringify(at)}`
      const message = contract ? contractIssueMessage(issue.message) : issue.message
      return at.length === 0 ? message : `${at}: ${message}`
    })
    .join("; ")
    .replace(/\s*\n\s*/g, " ")
}

/** The deepest nesting a JSON input may have: every record of the protocol is a few levels deep. */
export const MAX_JSON_DEPTH = 64

/** Whether `value` nests arrays or objects deeper than `max` levels (iterative: any depth is safe). */
export const nestedDeeperThan = (value: unknown, max: number): boolean => {
  const stack: Array<unknown> = [value]
  const depths: Array<number> = [0]
  while (stack.length > 0) {
    const item = stack.pop()
    const depth = depths.pop()!
    if (typeof item !== "object" || item === null) continue
    if (depth >= max) return true
    for (const child of Array.isArray(item) ? item : Object.values(item)) {
      if (typeof child !== "object" || child === null) continue
      stack.push(child)
      depths.push(depth + 1)
    }
  }
  return false
}

/**
 * Decodes an already parsed JSON value; unknown fields are errors. A value nested deeper than
 * `MAX_JSON_DEPTH` is rejected before decoding: Effect's decoder and its error rendering recurse,
 * and a 100,000-deep array would otherwise overflow the stack.
 */
export const decodeJson = <A, I>(schema: Schema.Schema<A, I, never>, wording: ErrorWording = "schema") => {
  const decode = Schema.decodeUnknownEither(schema, { onExcessProperty: "error" })
  return (input: unknown): Either.Either<A, JsonDecodeError> => {
    if (nestedDeeperThan(input, MAX_JSON_DEPTH)) {
      return Either.left(
        new JsonDecodeError({ message: `the value is nested deeper than ${MAX_JSON_DEPTH} levels` })
      )
    }
    try {
      return Either.mapLeft(
        decode(input),
        (error) => new JsonDecodeError({ message: formatParseError(error, wording) })
      )
    } catch (cause) {
      // A last line of defence: a decoder must answer, never throw, whatever it is given.
      return Either.left(
        new JsonDecodeError({
          message: `the value could not be decoded: ${cause instanceof Error ? cause.message : String(cause)}`
        })
      )
    }
  }
}

/** Parses JSON text, then decodes it like `decodeJson`. */
export const decodeJsonText = <A, I>(schema: Schema.Schema<A, I, never>) => {
  const decode = decodeJson(schema)
  return (text: string): Either.Either<A, JsonDecodeError> => {
    let parsed: unknown
    try {
      parsed = JSON.parse(text)
    } catch (cause) {
      return Either.left(
        new JsonDecodeError({
          message: `invalid JSON: ${cause instanceof Error ? cause.message : String(cause)}`
        })
      )
    }
    return decode(parsed)
  }
}

/** Encodes a domain value to its JSON value (u64s as decimal strings). */
export const encodeJson = <A, I>(schema: Schema.Schema<A, I, never>) => {
  const encode = Schema.encodeEither(schema)
  return (value: A): Either.Either<I, JsonEncodeError> =>
    Either.mapLeft(encode(value), (error) => new JsonEncodeError({ message: formatParseError(error) }))
}

/** Encodes a domain value to JSON text. */
export const encodeJsonText = <A, I>(schema: Schema.Schema<A, I, never>) => {
  const encode = encodeJson(schema)
  return (value: A): Either.Either<string, JsonEncodeError> =>
    Either.map(encode(value), (json) => JSON.stringify(json))
}

/** A parse failure at `ast` with the given message (for schema transformations). */
export const failType = (ast: SchemaAST.AST, actual: unknown, message: string) =>
  ParseResult.fail(new ParseResult.Type(ast, actual, message))

// ---------------------------------------------------------------------------------------------

// ---------------------------------------------------------------------------------------------
// Scalars

const U64_MAX = 0xffff_ffff_ffff_ffffn
const CANONICAL_DECIMAL = /^(0|[1-9][0-9]{0,19})$/
const MAX_JSON_NUMBER = 2 ** 53

/**
 * A u64 from canonical decimal text (no sign, no leading zeros, ≤ 2^64 − 1) or from a JSON
 * number that is an integer in 0..=2^53; undefined otherwise.
 */
export const parseU64 = (input: string | number): bigint | undefined => {
  if (typeof input === "number") {
    return Number.isInteger(input) && input >= 0 && input <= MAX_JSON_NUMBER ? BigInt(input) : undefined
  }
  if (!CANONICAL_DECIMAL.test(input)) return undefined
  const value = BigInt(input)
  return value <= U64_MAX ? value : undefined
}

const U64Input = Schema.Union(Schema.String, Schema.Number).annotations({
  message: (issue) => ({
    message: `expected a u64 as a decimal string or a JSON number, got ${JSON.stringify(issue.actual)}`,
    override: true
  })
})

const u64Problem = (input: string | number): string =>
  typeof input === "number"
    ? `expected a u64: a JSON number must be an integer in 0..=2^53, got ${input}`
    : `expected a u64 as canonical decimal text (no sign, no leading zeros, at most 18446744073709551615), got ${JSON.stringify(input)}`

/** u64 ↔ `bigint`; always encoded as a decimal string. */
export const U64 = Schema.transformOrFail(U64Input, Schema.BigIntFromSelf, {
  strict: true,
  decode: (input, _, ast) => {
    const value = parseU64(input)
    return value === undefined ? failType(ast, input, u64Problem(input)) : ParseResult.succeed(value)
  },
  encode: (value, _, ast) =>
    value >= 0n && value <= U64_MAX
      ? ParseResult.succeed(value.toString())
      : failType(ast, value, `expected a u64, got ${value}`)
}).annotations({ identifier: "U64" })

/** A u64 worker id ↔ its canonical decimal text (`WorkerId`), never a bigint. */
export const WorkerIdJson: Schema.Schema<WorkerId, string | number> = Schema.transformOrFail(
  U64Input,
  Schema.String,
  {
    strict: true,
    decode: (input, _, ast) => {
      const value = parseU64(input)
      return value === undefined
        ? failType(ast, input, u64Problem(input))
        : ParseResult.succeed(value.toString())
    },
    encode: (value, _, ast) =>
      parseU64(value) === undefined
        ? failType(ast, value, `worker id must be canonical decimal u64 text, got ${JSON.stringify(value)}`)
        : ParseResult.succeed(value)
  }
).annotations({ identifier: "WorkerId" })

/** A JSON number that is a u32. */
export const U32 = Schema.Number.pipe(
  Schema.filter((n) => (Number.isInteger(n) && n >= 0 && n <= 0xffff_ffff) || `expected a u32, got ${n}`)
).annotations({ identifier: "U32" })

/** A string that is not empty. */
export const NonEmptyString = Schema.String.pipe(Schema.filter((s) => s.length > 0 || "must not be empty"))

/** 32 lowercase hex digits (a 16-byte identity digest). */
export const Digest = Schema.String.pipe(
  Schema.filter(
    (s) =>
      /^[0-9a-f]{32}$/.test(s) || `expected a digest of 32 lowercase hex digits, got ${JSON.stringify(s)}`
  )
).annotations({ identifier: "Digest" })

/** 16 lowercase hex digits ↔ `DcId`. */
export const DcIdHex = Schema.transformOrFail(Schema.String, Schema.instanceOf(DcId), {
  strict: true,
  decode: (text, _, ast) =>
    /^[0-9a-f]{16}$/.test(text)
      ? ParseResult.succeed(new DcId(BigInt(`0x${text}`)))
      : failType(ast, text, `expected a dc id of 16 lowercase hex digits, got ${JSON.stringify(text)}`),
  encode: (dcId) => ParseResult.succeed(dcId.hex)
}).annotations({ identifier: "DcId" })

/** The bytes of an even-length hex string (already validated). */
export const hexToBytes = (hex: string): Uint8Array => {
  const out = new Uint8Array(hex.length / 2)
  for (let i = 0; i < out.length; i++) out[i] = Number.parseInt(hex.slice(2 * i, 2 * i + 2), 16)
  return out
}

// ---------------------------------------------------------------------------------------------
