/**
 * The wording of both servers' error messages (PROTOCOL §7 ◆3): at most 300 characters, long
 * values shortened, JSON syntax errors without V8's excerpt of the body, and the schema
 * library's `Expected T, actual V` rewritten into the contract's words.
 */

import { Either, Schema } from "effect"
import { describe, expect, it } from "vitest"
import {
  BODY_LIMIT_FLAG,
  bodyTooLargeMessage,
  boundedMessage,
  describeValue,
  invalidJsonMessage,
  MAX_ERROR_MESSAGE_CHARS,
  noRouteMessage
} from "../../src/http/ErrorText.js"
import { contractIssueMessage, decodeJson } from "../../src/protocol/Json.js"
import { SubscribeRequestJson } from "../../src/protocol/RelayApi.js"

const parseError = (text: string): unknown => {
  try {
    JSON.parse(text)
  } catch (cause) {
    return cause
  }
  throw new Error(`${text} parsed`)
}

describe("error messages", () => {
  it("are cut to 300 characters and shorten every long quoted value", () => {
    expect(boundedMessage("short")).toBe("short")
    const long = boundedMessage(`x${"y".repeat(1000)}`)
    expect(long).toHaveLength(MAX_ERROR_MESSAGE_CHARS)
    expect(long.endsWith("…")).toBe(true)
    const quoted = boundedMessage(`unknown field ${JSON.stringify("k".repeat(500))}; other`)
    expect(quoted.length).toBeLessThan(100)
    expect(quoted).toMatch(/^unknown field "k{59}…"; other$/)
  })

  it("say where JSON breaks without quoting the body", () => {
    const body = `garbage ${"z".repeat(200)}`
    const message = invalidJsonMessage(parseError(body))
    expect(message).toMatch(/^invalid JSON/)
    expect(message).not.toContain("garbage")
    expect(invalidJsonMessage(parseError('{"a": '))).toBe("invalid JSON: the request body ends too soon")
    expect(invalidJsonMessage(parseError('{"a" 1}'))).toMatch(/at position 5/)
  })

  it("name the limit and the flag in a 413, and a route's own fixed limit apart", () => {
    expect(bodyTooLargeMessage(16_777_216)).toBe(
      `the request body exceeds the limit of 16777216 bytes set by ${BODY_LIMIT_FLAG}`
    )
    expect(bodyTooLargeMessage(65_536, "POST /v1/pools/subscribe")).toMatch(
      /65536 bytes of POST \/v1\/pools\/subscribe \(fixed; --max-request-body-bytes sets the query routes' limit\)/
    )
    expect(noRouteMessage("GET", `/v1/${"p".repeat(500)}?secret=1`).length).toBeLessThan(130)
    expect(noRouteMessage("GET", "/v1/x?secret=1")).toBe("no route GET /v1/x")
  })

  it("describe values instead of repeating them", () => {
    expect(describeValue([1, 2, 3])).toBe("an array")
    expect(describeValue({ a: 1 })).toBe("an object")
    expect(describeValue("short")).toBe('the string "short"')
    expect(describeValue("s".repeat(100))).toBe("a long string")
    expect(describeValue(-1)).toBe("the number -1")
    expect(describeValue(null)).toBe("null")
  })

  it("rewrite the schema library's sentences into the contract's words", () => {
    expect(contractIssueMessage("Expected string, actual 1")).toBe("expected a string, got 1")
    expect(contractIssueMessage("Expected ReadonlyArray<U64>, actual {}")).toBe(
      "expected an array, got an object"
    )
    expect(contractIssueMessage(`Expected { readonly a: string }, actual [${"1,".repeat(500)}1]`)).toBe(
      "expected a JSON object, got an array"
    )
    expect(contractIssueMessage('Expected "prefill" | "decode", actual "x"')).toBe(
      'expected one of "prefill", "decode", got "x"'
    )
    expect(contractIssueMessage("tokens[1] is not a u32 token id: -1")).toBe(
      "tokens[1] is not a u32 token id: -1"
    )
    const decode = decodeJson(SubscribeRequestJson, "contract")
    const array = decode(Array.from({ length: 1000 }, (_, i) => i))
    expect(Either.isLeft(array) && array.left.message).toBe("expected a JSON object, got an array")
    const wrong = decode({ subscriberId: 7, expectedProducer: { poolId: 1 } })
    expect(Either.isLeft(wrong) && wrong.left.message).not.toMatch(/Expected|readonly|actual/)
    // The schema wording stays where it is wanted (configuration files, discovery records).
    const schema = decodeJson(Schema.Struct({ version: Schema.Literal(1) }))({ version: 2 })
    expect(Either.isLeft(schema) && schema.left.message).toBe("version: Expected 1, actual 2")
  })
})
