/**
 * The Prometheus text exposition (format 0.0.4, what vLLM's and SGLang's `prometheus_client`
 * serve) read with `parse-prometheus-text-format`, bounded in work and never throwing.
 *
 * An engine's page is large (a vLLM page carries dozens of histograms per rank, tens to hundreds
 * of kB; we test 5 MB) and a relay reads every engine's page every second, so parsing all of it
 * would spend the event loop on families nobody reads. Two passes keep that bounded:
 *
 * - the page's head (its first 64 KiB, whole lines) goes through the parser whole and every
 *   family, label and value in it is checked: that is what tells an exposition from an HTML error
 *   page, a JSON document or binary noise, with an error that names what was wrong;
 * - of the rest, only the lines of the wanted families (their samples and their `# HELP` and
 *   `# TYPE` lines) are handed to the parser. Selecting lines by their leading metric name is not
 *   parsing: labels, escapes, values and metadata stay the parser's job.
 */

import parsePrometheusTextFormat, { type ParsedFamily } from "parse-prometheus-text-format"

export type { ParsedFamily }

/**
 * The head of a page that is parsed and checked whole: enough lines to tell an exposition from
 * anything else (the parser reads about 50 kB per millisecond, so the head is kept small).
 */
export const HEAD_CHARS = 8 * 1024

/** What could not be read, in words an operator can act on (never the whole page). */
export class ExpositionError {
  readonly _tag = "ExpositionError"
  constructor(readonly message: string) {}
}

const METRIC_NAME = /^[a-zA-Z_:][a-zA-Z0-9_:]*$/
const LABEL_NAME = /^[a-zA-Z_][a-zA-Z0-9_]*$/
// Go's strconv.ParseFloat forms that Prometheus clients write: decimals, exponents, ±Inf, NaN.
const SAMPLE_VALUE = /^(?:[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?|[+-]?(?:inf|infinity)|nan)$/i

/** A piece of the page for a message: quoted, one line, cut short. */
export const excerpt = (text: string, max = 80): string => {
  // JSON quoting escapes control characters, so binary noise stays one readable line.
  const line = text.replace(/[\r\n]+/g, " ")
  return JSON.stringify(line.length <= max ? line : `${line.slice(0, max - 1)}…`)
}

/** A sample value as a number: NaN for `NaN`, ±Infinity for the infinities, undefined when malformed. */
export const sampleNumber = (text: string): number | undefined => {
  if (!SAMPLE_VALUE.test(text)) return undefined
  const lower = text.toLowerCase()
  if (lower.endsWith("inf") || lower.endsWith("infinity")) return text.startsWith("-") ? -Infinity : Infinity
  if (lower === "nan") return Number.NaN
  return Number(text)
}

const runParser = (text: string): ReadonlyArray<ParsedFamily> | ExpositionError => {
  try {
    // The parser drops the last line when the text does not end with a newline.
    return parsePrometheusTextFormat(text.endsWith("\n") ? text : `${text}\n`)
  } catch (cause) {
    const message = cause instanceof Error ? cause.message : String(cause)
    const line = /^Encountered invalid line: ([\s\S]*)$/.exec(message)
    return new ExpositionError(
      line === null
        ? `the exposition parser refused the page: ${excerpt(message)}`
        : `a line the exposition format does not allow: ${excerpt(line[1]!)}`
    )
  }
}

/** Every name, label and value the parser returned is one the format allows. */
const checkFamilies = (families: ReadonlyArray<ParsedFamily>): ExpositionError | undefined => {
  for (const family of families) {
    if (!METRIC_NAME.test(family.name)) {
      return new ExpositionError(`${excerpt(family.name)} is not a metric name`)
    }
    for (const sample of family.metrics) {
      for (const label in sample.labels ?? {}) {
        if (!LABEL_NAME.test(label)) {
          return new ExpositionError(`${excerpt(label)} is not a label name (in ${family.name})`)
        }
      }
      const values = [sample.value, sample.count, sample.sum, ...Object.values(sample.buckets ?? {})].filter(
        (v): v is string => v !== undefined
      )
      for (const value of values) {
        if (sampleNumber(value) === undefined) {
          return new ExpositionError(`${excerpt(value)} is not a sample value (in ${family.name})`)
        }
      }
    }
  }
  return undefined
}

/** The first line that is neither blank nor a comment, if any. */
const firstSampleLine = (text: string): string | undefined => {
  let at = 0
  while (at < text.length) {
    const end = text.indexOf("\n", at)
    const line = text.slice(at, end === -1 ? text.length : end).trim()
    if (line.length > 0 && !line.startsWith("#")) return line
    if (end === -1) break
    at = end + 1
  }
  return undefined
}

const isBlank = (c: number): boolean => c === 32 || c === 9

/**
 * The start of the line `at` is on when only blanks stand before it on that line (and, when
 * `meta`, `# HELP ` or `# TYPE ` right before it); -1 when `at` is not where such a line names.
 */
const nameLineStart = (text: string, at: number): number => {
  let before = at
  const meta =
    before >= 7 && (text.startsWith("# HELP ", before - 7) || text.startsWith("# TYPE ", before - 7))
  if (meta) before -= 7
  while (before > 0 && isBlank(text.charCodeAt(before - 1))) before--
  return before === 0 || text.charCodeAt(before - 1) === 10 ? before : -1
}

/**
 * The lines from `from` on that name one of `wanted` (samples, `# HELP`, `# TYPE`), in page
 * order. Each name is found with `indexOf`, which is what keeps a 5 MB page cheap; a match counts
 * only at the head of a line and followed by `{`, a blank or the line's end.
 */
const selectLines = (text: string, from: number, wanted: ReadonlySet<string>): ReadonlyArray<string> => {
  const found: Array<readonly [number, string]> = []
  for (const name of wanted) {
    let at = text.indexOf(name, from)
    while (at !== -1) {
      const next = text.charCodeAt(at + name.length)
      const ends = Number.isNaN(next) || next === 123 /* { */ || isBlank(next) || next === 10 || next === 13
      const start = ends ? nameLineStart(text, at) : -1
      const end = text.indexOf("\n", at)
      const lineEnd = end === -1 ? text.length : end
      if (start !== -1) found.push([start, text.slice(start, lineEnd)])
      at = end === -1 ? -1 : text.indexOf(name, lineEnd)
    }
  }
  return found.sort((a, b) => a[0] - b[0]).map(([, line]) => line)
}

/**
 * Reads `text` as an exposition and returns the families named in `wanted` (a family may appear
 * more than once when the page splits it; callers take every entry). The head is checked whole;
 * see the module comment.
 */
export const readFamilies = (
  text: string,
  wanted: ReadonlySet<string>
): ReadonlyArray<ParsedFamily> | ExpositionError => {
  const headEnd = text.length <= HEAD_CHARS ? text.length : text.lastIndexOf("\n", HEAD_CHARS) + 1
  const head = text.slice(0, headEnd > 0 ? headEnd : Math.min(text.length, HEAD_CHARS))
  const headFamilies = runParser(head)
  if (headFamilies instanceof ExpositionError) return headFamilies
  const problem = checkFamilies(headFamilies)
  if (problem !== undefined) return problem
  if (headFamilies.length === 0) {
    // The parser skips what it cannot name (a line starting with `{`, say) without a word.
    const line = firstSampleLine(head)
    if (line !== undefined)
      return new ExpositionError(`no metric could be read from the line ${excerpt(line)}`)
  }
  const found = headFamilies.filter((family) => wanted.has(family.name))
  if (head.length === text.length) return found

  const kept = selectLines(text, head.length, wanted)
  if (kept.length === 0) return found
  const tailFamilies = runParser(kept.join("\n"))
  if (tailFamilies instanceof ExpositionError) return tailFamilies
  const tailProblem = checkFamilies(tailFamilies)
  if (tailProblem !== undefined) return tailProblem
  return [...found, ...tailFamilies.filter((family) => wanted.has(family.name))]
}
