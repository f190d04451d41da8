/**
 * Command-line settings: flags, `KVRELAY_*` environment variables and an optional JSON
 * `--config` file, merged (flag > environment > file > default) and decoded with Schema. Every
 * problem is reported by the name of the flag it concerns.
 */

import { Either, Option, ParseResult, Schema, type SchemaAST } from "effect"

/** One flag of a command. */
interface FlagSpec {
  /** Long name without dashes, kebab-case (`dc-id`). */
  readonly name: string
  /** Takes no value (`--quick`). */
  readonly boolean?: boolean
  /** May be given several times (`--relay A=… --relay B=…`); the value is an array. */
  readonly repeatable?: boolean
  readonly help: string
  readonly placeholder?: string
}

/** A command's name, summary and flags: what its help prints and its parser accepts. */
export interface CommandSpec {
  readonly name: string
  readonly summary: string
  readonly flags: ReadonlyArray<FlagSpec>
}

/** Flags or variables that could not be read; every problem is listed. */
export class UsageError extends Error {
  readonly _tag = "UsageError"
  constructor(readonly problems: ReadonlyArray<string>) {
    super(problems.join("\n"))
  }
}

/** camelCase key of a flag (`dc-id` → `dcId`). */
export const keyOf = (flag: string): string => flag.replace(/-([a-z0-9])/g, (_, c: string) => c.toUpperCase())
/** The flag of a camelCase key (`dcId` → `--dc-id`). */
export const flagOf = (key: string): string => `--${key.replace(/[A-Z]/g, (c) => `-${c.toLowerCase()}`)}`
/** The environment variable of a flag (`dc-id` → `KVRELAY_DC_ID`). */
const envOf = (flag: string): string => `KVRELAY_${flag.replace(/-/g, "_").toUpperCase()}`

/** A flag's value as given: text, present/absent, or repeated. */
export type RawValue = string | boolean | ReadonlyArray<string>

/**
 * The flags that parse, and a problem for each one that does not: the settings that did parse
 * are still checked, so one run reports every problem.
 */
export const parseFlagsGathering = (
  spec: CommandSpec,
  argv: ReadonlyArray<string>
): { readonly values: Record<string, RawValue>; readonly problems: ReadonlyArray<string> } => {
  const byName = new Map(spec.flags.map((f) => [f.name, f]))
  const out: Record<string, RawValue> = {}
  const problems: Array<string> = []
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i]!
    if (!arg.startsWith("--")) {
      problems.push(`unexpected argument ${JSON.stringify(arg)} (kvrelay ${spec.name} takes only --flags)`)
      continue
    }
    const eq = arg.indexOf("=")
    const name = arg.slice(2, eq < 0 ? undefined : eq)
    const flag = byName.get(name)
    if (flag === undefined) {
      problems.push(`--${name}: unknown flag for kvrelay ${spec.name}`)
      // Its value, if it has one, is no argument of its own: one line for the unknown flag.
      if (eq < 0 && argv[i + 1] !== undefined && !argv[i + 1]!.startsWith("--")) i++
      continue
    }
    let value: string | boolean
    if (flag.boolean === true) {
      if (eq >= 0) {
        const text = arg.slice(eq + 1)
        if (text !== "true" && text !== "false") {
          problems.push(`--${name}: expected no value, true or false, got ${JSON.stringify(text)}`)
          continue
        }
        value = text === "true"
      } else value = true
    } else if (eq >= 0) value = arg.slice(eq + 1)
    else {
      const next = argv[i + 1]
      if (next === undefined || next.startsWith("--")) {
        problems.push(`--${name}: missing value`)
        continue
      }
      value = next
      i++
    }
    const key = keyOf(name)
    if (flag.repeatable === true) {
      const previous = out[key]
      out[key] = [...(Array.isArray(previous) ? (previous as ReadonlyArray<string>) : []), String(value)]
    } else if (key in out) {
      problems.push(`--${name}: given more than once`)
    } else out[key] = value
  }
  return { values: out, problems }
}

/** Values of `KVRELAY_*` variables for the command's flags (repeatable flags split on commas). */
export const environmentValues = (
  spec: CommandSpec,
  env: Readonly<Record<string, string | undefined>>
): Record<string, RawValue> => {
  const out: Record<string, RawValue> = {}
  for (const flag of spec.flags) {
    if (flag.name === "config") continue
    const value = env[envOf(flag.name)]
    if (value === undefined || value === "") continue
    out[keyOf(flag.name)] = flag.repeatable === true ? value.split(",").map((v) => v.trim()) : value
  }
  return out
}

/**
 * Decodes the merged settings; every issue is reported with the flag it concerns, and unknown
 * keys of a config file are rejected by name.
 */
export const decodeSettings = <A, I>(
  schema: Schema.Schema<A, I, never>,
  merged: Record<string, unknown>
): Either.Either<A, UsageError> =>
  Either.mapLeft(
    Schema.decodeUnknownEither(schema, { errors: "all", onExcessProperty: "error" })(merged),
    (error) => {
      // A defaulted or union-typed setting reports every alternative it failed ("Expected
      // undefined, actual …", one "Expected <member>" per literal): one line per setting keeps
      // the cause, or merges the alternatives.
      const bySetting = new Map<string, Array<ParseResult.ArrayFormatterIssue>>()
      for (const issue of ParseResult.ArrayFormatter.formatErrorSync(error)) {
        const key = issue.path.length > 0 ? String(issue.path[0]) : ""
        bySetting.set(key, [...(bySetting.get(key) ?? []), issue])
      }
      // A check across settings (`--tls-key: is required with --tls-cert`) runs only once every
      // setting decodes: run it here on the valid ones, for the settings with no problem yet.
      for (const issue of crossSettingIssues(schema, merged)) {
        const key = issue.path.length > 0 ? String(issue.path[0]) : ""
        if (!bySetting.has(key)) bySetting.set(key, [issue])
      }
      const problems: Array<string> = []
      for (const [key, issues] of bySetting) {
        const where = key === "" ? "settings" : flagOf(key)
        const relevant = issues.filter((issue) => !OPTIONAL_MISMATCH.test(issue.message))
        const kept = relevant.length > 0 ? relevant : issues
        const causes = kept.filter((issue) => issue._tag !== "Type")
        if (causes.length > 0) {
          for (const issue of causes) problems.push(`${where}: ${issueText(issue)}`)
          continue
        }
        const mismatches = kept.map((issue) => TYPE_MISMATCH.exec(issue.message))
        problems.push(
          mismatches.every((m) => m !== null)
            ? `${where}: expected ${mismatches.map((m) => m![1]).join(" | ")}, got ${mismatches[0]![2]}`
            : `${where}: ${kept[0]!.message}`
        )
      }
      return new UsageError([...new Set(problems)])
    }
  )

/**
 * Each setting of `fields` whose own value decodes (its default when unset), the others left
 * out: what can still be checked when another setting is invalid.
 */
export const validSettingValues = (
  fields: Schema.Struct.Fields,
  merged: Readonly<Record<string, unknown>>
): Record<string, unknown> => {
  const out: Record<string, unknown> = {}
  for (const [key, field] of Object.entries(fields)) {
    // The field alone, with its default: a one-key struct of the same property signature.
    const one = Schema.Struct({ [key]: field }) as unknown as Schema.Schema<Record<string, unknown>>
    const decoded = Schema.decodeUnknownEither(one)(key in merged ? { [key]: merged[key] } : {})
    if (Either.isRight(decoded) && decoded.right[key] !== undefined) out[key] = decoded.right[key]
  }
  return out
}

/** The fields of a settings struct, or of the struct under its checks across settings. */
export const settingsFields = (schema: unknown): Schema.Struct.Fields | undefined => {
  const s = schema as { readonly fields?: Schema.Struct.Fields; readonly from?: unknown }
  if (s.fields !== undefined) return s.fields
  return s.from === undefined ? undefined : settingsFields(s.from)
}

/**
 * The issues of the schema's checks across settings, applied to the settings that decode. A
 * struct piped through several `Schema.filter`s is a chain of refinements: every one is run,
 * innermost first, so that each check's problems are reported, not only the last one's.
 */
const crossSettingIssues = (
  schema: Schema.Schema.AnyNoContext,
  merged: Readonly<Record<string, unknown>>
): ReadonlyArray<ParseResult.ArrayFormatterIssue> => {
  const fields = settingsFields(schema)
  if (fields === undefined) return []
  const valid = validSettingValues(fields, merged)
  const checks: Array<SchemaAST.Refinement> = []
  for (let ast = schema.ast; ast._tag === "Refinement"; ast = ast.from) checks.unshift(ast)
  return checks.flatMap((check) => {
    const issue = check.filter(valid, { errors: "all" }, check)
    return Option.isNone(issue) ? [] : ParseResult.ArrayFormatter.formatIssueSync(issue.value)
  })
}

/**
 * The known name `name` was probably meant as: the same letters in another case or separator
 * style (`dc-id`, `dc_id` → `dcId`), else one at most two edits away. Undefined when none is close.
 */
export const closestName = (name: string, known: Iterable<string>): string | undefined => {
  const squash = (s: string) => s.toLowerCase().replace(/[^a-z0-9]/g, "")
  const wanted = squash(name)
  let best: string | undefined
  let bestDistance = wanted.length <= 4 ? 2 : 3
  for (const candidate of known) {
    const distance = editDistance(wanted, squash(candidate))
    if (distance < bestDistance) {
      best = candidate
      bestDistance = distance
    }
  }
  return best
}

const editDistance = (a: string, b: string): number => {
  let previous = Array.from({ length: b.length + 1 }, (_, j) => j)
  for (let i = 1; i <= a.length; i++) {
    const row = [i]
    for (let j = 1; j <= b.length; j++)
      row.push(
        Math.min(previous[j]! + 1, row[j - 1]! + 1, previous[j - 1]! + (a[i - 1] === b[j - 1] ? 0 : 1))
      )
    previous = row
  }
  return previous[b.length]!
}

const OPTIONAL_MISMATCH = /^Expected (undefined|null), actual /
const TYPE_MISMATCH = /^Expected ([\s\S]+), actual ([\s\S]+)$/

const issueText = (issue: ParseResult.ArrayFormatterIssue): string =>
  issue._tag === "Unexpected" ? "unknown setting" : issue._tag === "Missing" ? "is required" : issue.message

// ---------------------------------------------------------------------------------------------
// Reusable field schemas (inputs are strings from flags/environment or JSON values from a file)

/**
 * An integer in `[min, max]`, from a JSON number or a flag's text. One message per bad value in
 * the user's terms (`expected a positive integer, got "zero"`), never the schema's own wording.
 */
export const intFrom = (what: string, min: number, max = Number.MAX_SAFE_INTEGER) =>
  Schema.transformOrFail(Schema.Unknown, Schema.Number, {
    strict: true,
    decode: (input, _, ast) => {
      const text = typeof input === "string" ? input.trim() : undefined
      const n =
        typeof input === "number"
          ? input
          : text !== undefined && NUMBER.test(text)
            ? Number(text)
            : Number.NaN
      if (Number.isInteger(n) && n >= min && n <= max) return ParseResult.succeed(n)
      // Numbers read as numbers ("got 0", "got 1.5"); anything else is quoted ("got \"zero\"").
      const shown =
        typeof input === "number" || (text !== undefined && NUMBER.test(text))
          ? String(text ?? input)
          : shownValue(input)
      return ParseResult.fail(new ParseResult.Type(ast, input, `expected ${what}, got ${shown}`))
    },
    encode: (n) => ParseResult.succeed(n)
  })

const NUMBER = /^[+-]?(\d+\.?\d*|\.\d+)(e[+-]?\d+)?$/i

/** A setting's value as it reads in a message; long values are cut. */
const shownValue = (value: unknown): string => {
  const text = JSON.stringify(value) ?? String(value)
  return text.length > 60 ? `${text.slice(0, 57)}…` : text
}

/** A setting that is an integer of at least 1. */
export const PositiveInt = intFrom("a positive integer", 1)

/** A setting that is non-empty text without surrounding white space. */
export const NonBlank = Schema.String.pipe(
  Schema.filter((s) => s.length > 0 || "must not be empty"),
  Schema.filter((s) => s.trim() === s || "must not have leading or trailing whitespace")
)

/** A setting that is `host:port`. */
export const HttpAddress = Schema.String.pipe(
  Schema.filter((s) => {
    const m = /^(.+):(\d{1,5})$/.exec(s)
    if (m === null) return `expected HOST:PORT, got ${JSON.stringify(s)}`
    const port = Number(m[2])
    return port <= 65_535 || `port ${port} is out of range`
  })
)

/** A setting that is an absolute URL. */
export const Url = Schema.String.pipe(
  Schema.filter((s) => {
    try {
      const url = new URL(s)
      return (
        url.protocol === "http:" ||
        url.protocol === "https:" ||
        `expected an http(s) URL, got ${JSON.stringify(s)}`
      )
    } catch {
      return `expected a URL, got ${JSON.stringify(s)}`
    }
  })
)

/** The `--log-level` values. */
export const LogLevel = Schema.Literal("trace", "debug", "info", "warning", "error", "fatal", "none")

/** A setting that is a flag or `true`/`false` text. */
export const BooleanFlag = Schema.Union(
  Schema.Boolean,
  Schema.transformOrFail(Schema.String, Schema.Boolean, {
    strict: true,
    decode: (s, _, ast) => {
      const v = s.toLowerCase()
      if (["1", "true", "yes", "on"].includes(v)) return ParseResult.succeed(true)
      if (["0", "false", "no", "off"].includes(v)) return ParseResult.succeed(false)
      return ParseResult.fail(new ParseResult.Type(ast, s, `expected a boolean, got ${JSON.stringify(s)}`))
    },
    encode: (b) => ParseResult.succeed(String(b))
  })
)

/** A repeatable value given as an array, or as one comma-separated string in a config file. */
export const StringList = Schema.Union(
  Schema.Array(Schema.String),
  Schema.transform(Schema.String, Schema.Array(Schema.String), {
    strict: true,
    decode: (s) => s.split(",").map((v) => v.trim()),
    encode: (a) => a.join(",")
  })
)

/** Help text of a command. */
export const commandHelp = (spec: CommandSpec): string => {
  const rows = spec.flags.map((f) => {
    const left = `--${f.name}${f.boolean === true ? "" : ` ${f.placeholder ?? "VALUE"}`}${f.repeatable === true ? " …" : ""}`
    const env = f.name === "config" ? "" : `  [${envOf(f.name)}]`
    return `  ${left.padEnd(40)} ${f.help}${env}`
  })
  return `kvrelay ${spec.name}: ${spec.summary}\n\nOptions:\n${rows.join("\n")}\n  ${"--help".padEnd(40)} show this help\n`
}
