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

/** The head of a page that is parsed and checked whole. */
export const HEAD_CHARS = 64 * 1024

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

/** The name a sample line starts with, or the name a `# HELP` / `# TYPE` line is about. */
const lineFamily = (text: string, start: number, end: number): string | undefined => {
  let at = start
  while (at < end && (text.charCodeAt(at) === 32 || text.charCodeAt(at) === 9)) at++
  if (at >= end) return undefined
  if (text.charCodeAt(at) === 35 /* # */) {
    const meta = text.startsWith("# HELP ", at) || text.startsWith("# TYPE ", at)
    if (!meta) return undefined
    at += 7
  }
  let stop = at
  while (stop < end) {
    const c = text.charCodeAt(stop)
    if (c === 123 /* { */ || c === 32 || c === 9 || c === 13) break
    stop++
  }
  return text.slice(at, stop)
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

  const kept: Array<string> = []
  let at = head.length
  while (at < text.length) {
    const newline = text.indexOf("\n", at)
    const end = newline === -1 ? text.length : newline
    const name = lineFamily(text, at, end)
    if (name !== undefined && wanted.has(name)) kept.push(text.slice(at, end))
    at = end + 1
  }
  if (kept.length === 0) return found
  const tailFamilies = runParser(kept.join("\n"))
  if (tailFamilies instanceof ExpositionError) return tailFamilies
  const tailProblem = checkFamilies(tailFamilies)
  if (tailProblem !== undefined) return tailProblem
  return [...found, ...tailFamilies]
}
