/**
 * Bearer tokens (PROTOCOL.md §1 ◆) over real sockets: with a token file, the relay and global
 * servers answer every route but `GET /healthz` with 401 `{reason: "UNAUTHORIZED", message}`
 * unless the request carries a token of the file, and the file is re-read when it changes (a
 * file that becomes empty or vanishes keeps the last good tokens).
 */

import { linkSync, mkdtempSync, renameSync, rmSync, writeFileSync } from "node:fs"
import { join } from "node:path"
import { afterAll, beforeAll, describe, expect, it } from "@effect/vitest"
import {
  Effect,
  Either,
  HashMap,
  Layer,
  Logger,
  LogLevel,
  Option,
  Queue,
  type Scope,
  Stream,
  SubscriptionRef
} from "effect"
import * as GlobalProcess from "../../src/cli/globalProcess.js"
import * as GlobalHttpServer from "../../src/consumer/http/GlobalHttpServer.js"
import {
  authorizationProblem,
  makeTokenSet,
  parseTokenFile,
  type TokenFile,
  tokenMatches,
  watchTokenFile
} from "../../src/http/BearerAuth.js"
import { startDcRelay } from "../consumer/realRelay.js"
import { makeTestPki, type TestPki } from "./tlsFixtures.js"

// The temp dir of the TLS fixtures (certificates unused here) holds the token files.
let pki: TestPki
beforeAll(() => {
  pki = makeTestPki()
})
afterAll(() => pki?.remove())

let files = 0
const tokenFile = (text: string): string => {
  const path = join(pki.dir, `tokens-${++files}.txt`)
  writeFileSync(path, text)
  return path
}

interface LogLine {
  readonly level: string
  readonly message: string
  readonly problem: string | undefined
}

/** A logger feeding `lines` (the watcher logs what it refused), and errors only on the console. */
const capturing = (lines: Queue.Queue<LogLine>) =>
  Logger.replace(
    Logger.defaultLogger,
    Logger.make(({ logLevel, message, annotations }) => {
      const text = Array.isArray(message) ? message.map(String).join(" ") : String(message)
      const problem = Option.getOrUndefined(HashMap.get(annotations, "problem"))
      Queue.unsafeOffer(lines, {
        level: logLevel.label,
        message: text,
        problem: problem === undefined ? undefined : String(problem)
      })
    })
  )

const live = <A, E>(name: string, body: () => Effect.Effect<A, E, Scope.Scope>, timeout = 30_000) =>
  it.scopedLive(name, () => body().pipe(Logger.withMinimumLogLevel(LogLevel.Warning)), timeout)

interface Answer {
  readonly status: number
  readonly headers: Headers
  readonly json: unknown
  readonly text: string
}

const call = (url: string, token?: string, init: RequestInit = {}): Effect.Effect<Answer> =>
  Effect.promise(async () => {
    const headers = new Headers(init.headers)
    if (token !== undefined) headers.set("authorization", token.includes(" ") ? token : `Bearer ${token}`)
    const response = await fetch(url, { ...init, headers, signal: AbortSignal.timeout(10_000) })
    const text = await response.text()
    let json: unknown
    try {
      json = JSON.parse(text)
    } catch {
      json = undefined
    }
    return { status: response.status, headers: response.headers, json, text }
  })

const expectUnauthorized = (answer: Answer, message: RegExp) => {
  expect(answer.status).toBe(401)
  expect(answer.headers.get("content-type")).toMatch(/^application\/json/)
  expect(answer.headers.get("www-authenticate")).toMatch(/^Bearer realm="kvrelay"/)
  const body = answer.json as { reason: string; message: string }
  expect(Object.keys(body).sort()).toEqual(["message", "reason"])
  expect(body.reason).toBe("UNAUTHORIZED")
  expect(body.message).toMatch(message)
}

/** Waits (generously bounded) until the watcher has read a set of revision `revision` or later. */
const revisionReached = (tokens: TokenFile, revision: number) =>
  tokens.tokens.changes.pipe(
    Stream.filter((set) => set.revision >= revision),
    Stream.runHead,
    Effect.timeoutFail({
      duration: "15 seconds",
      onTimeout: () => new Error(`the token file was not re-read (revision ${revision}) within 15 s`)
    }),
    Effect.orDie
  )

/** Waits (generously bounded) for the watcher's error log about `problem`. */
const problemLogged = (lines: Queue.Queue<LogLine>, problem: RegExp) =>
  Effect.gen(function* () {
    for (;;) {
      const line = yield* Queue.take(lines)
      if (line.level === "ERROR" && line.problem !== undefined && problem.test(line.problem)) return line
    }
  }).pipe(
    Effect.timeoutFail({
      duration: "15 seconds",
      onTimeout: () => new Error(`no error logged about ${problem} within 15 s`)
    }),
    Effect.orDie
  )

describe("token files", () => {
  it("one token per line; blank lines and # comments ignored; CRLF accepted", () => {
    expect(parseTokenFile("alpha\n\n# a comment\n  beta-2.x~y+z/w==  \r\n#gamma\r\n")).toEqual([
      "alpha",
      "beta-2.x~y+z/w=="
    ])
    expect(parseTokenFile("")).toBe("holds no token (only blank lines and # comments)")
    expect(parseTokenFile("# only\n\n")).toBe("holds no token (only blank lines and # comments)")
    expect(parseTokenFile("alpha\ntwo words\n")).toMatch(/^line 2 is not a bearer token/)
    expect(parseTokenFile("al\u00e9pha\n")).toMatch(/^line 1 is not a bearer token/)
  })

  it("tokens compare exactly: no prefix, extension or case variant passes", () => {
    const set = makeTokenSet(1, ["s3cret-token", "other"])
    expect(tokenMatches(set, "s3cret-token")).toBe(true)
    expect(tokenMatches(set, "other")).toBe(true)
    for (const wrong of ["s3cret", "s3cret-token2", "S3CRET-TOKEN", "", "othe"]) {
      expect(tokenMatches(set, wrong)).toBe(false)
    }
    expect(authorizationProblem(set, undefined)).toBe("missing Authorization: Bearer header")
    expect(authorizationProblem(set, "Basic czNjcmV0")).toBe("the Authorization header is not a Bearer token")
    expect(authorizationProblem(set, "Bearer")).toBe("the Authorization header is not a Bearer token")
    expect(authorizationProblem(set, "Bearer nope")).toBe("the bearer token is not accepted")
    expect(authorizationProblem(set, "Bearer s3cret-token")).toBeUndefined()
    // RFC 7235: the scheme is case-insensitive.
    expect(authorizationProblem(set, "bearer s3cret-token")).toBeUndefined()
  })

  it.scoped("a file that cannot be used at startup is refused naming the flag", () =>
    Effect.gen(function* () {
      const refusal = (path: string) =>
        Effect.map(Effect.either(watchTokenFile("--auth-token-file", path)), (result) => {
          if (Either.isRight(result)) throw new Error(`expected ${path} to be refused`)
          return result.left
        })
      const missing = yield* refusal(join(pki.dir, "absent.txt"))
      expect(missing.message).toBe(
        `--auth-token-file: cannot read ${join(pki.dir, "absent.txt")}: no such file`
      )
      const empty = tokenFile("# nothing yet\n")
      expect((yield* refusal(empty)).message).toBe(
        `--auth-token-file: ${empty} holds no token (only blank lines and # comments)`
      )
      const bad = tokenFile("fine\nnot fine\n")
      expect((yield* refusal(bad)).message).toMatch(/^--auth-token-file: .* line 2 is not a bearer token/)
      expect((yield* refusal(pki.dir)).message).toMatch(/is a directory/)
    })
  )
})

describe("bearer tokens on the relay HTTP API", () => {
  live("401 without a token or with a wrong one, 200 with the right one; /healthz stays open", () =>
    Effect.gen(function* () {
      const auth = yield* watchTokenFile(
        "--auth-token-file",
        tokenFile("# relay clients\nfirst-token\nsecond-token\n")
      )
      const relay = yield* startDcRelay("east", { auth })

      expectUnauthorized(yield* call(`${relay.url}/v1/relay`), /missing Authorization/)
      expectUnauthorized(yield* call(`${relay.url}/v1/relay`, "wrong-token"), /not accepted/)
      expectUnauthorized(yield* call(`${relay.url}/v1/relay`, "Basic Zmlyc3QtdG9rZW4="), /not a Bearer/)
      expect((yield* call(`${relay.url}/v1/relay`, "wrong-token")).headers.get("www-authenticate")).toContain(
        'error="invalid_token"'
      )
      // Unknown routes and streams are behind the check too: nothing is revealed without a token.
      expectUnauthorized(yield* call(`${relay.url}/v1/nothing-here`), /missing/)
      expectUnauthorized(
        yield* call(`${relay.url}/v1/pools/subscribe`, undefined, {
          method: "POST",
          headers: { "content-type": "application/json" },
          body: "{}"
        }),
        /missing/
      )
      expectUnauthorized(yield* call(`${relay.url}/v1/catalog/watch?subscriber=s`), /missing/)
      expectUnauthorized(yield* call(`${relay.url}/healthz`, undefined, { method: "POST" }), /missing/)

      const first = yield* call(`${relay.url}/v1/relay`, "first-token")
      expect(first.status).toBe(200)
      expect(first.json).toMatchObject({ protocolVersion: 1, dcName: "east" })
      expect((yield* call(`${relay.url}/v1/catalog`, "second-token")).status).toBe(200)
      expect((yield* call(`${relay.url}/v1/relay`, "bearer first-token")).status).toBe(200)
      // A wrong method still gets its 405 once the token is right.
      expect((yield* call(`${relay.url}/v1/relay`, "first-token", { method: "POST" })).status).toBe(405)

      const healthz = yield* call(`${relay.url}/healthz`)
      expect(healthz.status).toBe(200)
      expect(healthz.text).toBe("ok")
      expect((yield* call(`${relay.url}/healthz`, "wrong-token")).status).toBe(200)
    })
  )

  live("a rotated token file takes effect: the old token is refused and the new one accepted", () =>
    Effect.gen(function* () {
      const lines = yield* Queue.unbounded<LogLine>()
      return yield* Effect.gen(function* () {
        const path = tokenFile("old-token\n")
        // No poll within the test: every change below must come through the directory watch.
        const auth = yield* watchTokenFile("--auth-token-file", path, { pollInterval: "1 hour" })
        const relay = yield* startDcRelay("east", { auth })
        expect((yield* call(`${relay.url}/v1/relay`, "old-token")).status).toBe(200)
        expectUnauthorized(yield* call(`${relay.url}/v1/relay`, "new-token"), /not accepted/)

        // Replaced atomically (what editors and secret managers do).
        writeFileSync(`${path}.tmp`, "# rotated\nnew-token\n")
        renameSync(`${path}.tmp`, path)
        yield* revisionReached(auth, 2)
        expectUnauthorized(yield* call(`${relay.url}/v1/relay`, "old-token"), /not accepted/)
        expect((yield* call(`${relay.url}/v1/relay`, "new-token")).status).toBe(200)

        // Rewritten in place, with an extra token.
        writeFileSync(path, "new-token\nthird-token\n")
        yield* revisionReached(auth, 3)
        expect((yield* call(`${relay.url}/v1/relay`, "third-token")).status).toBe(200)
        expect((yield* call(`${relay.url}/v1/relay`, "new-token")).status).toBe(200)

        // Emptied, then removed: the last good tokens stay in force and an error is logged.
        writeFileSync(path, "# emptied\n")
        yield* problemLogged(lines, /holds no token/)
        expect((yield* call(`${relay.url}/v1/relay`, "third-token")).status).toBe(200)
        rmSync(path)
        yield* problemLogged(lines, /cannot read .*: no such file/)
        expect((yield* call(`${relay.url}/v1/relay`, "new-token")).status).toBe(200)
        expect((yield* SubscriptionRef.get(auth.tokens)).revision).toBe(3)

        // Back with a new token: read again.
        writeFileSync(path, "fourth-token\n")
        yield* revisionReached(auth, 4)
        expect((yield* call(`${relay.url}/v1/relay`, "fourth-token")).status).toBe(200)
        expectUnauthorized(yield* call(`${relay.url}/v1/relay`, "third-token"), /not accepted/)
      }).pipe(Effect.provide(capturing(lines)))
    })
  )

  live("the stat poll alone notices a change the directory watch cannot see", () =>
    Effect.gen(function* () {
      // A write through a hard link in another directory changes the file without an event in
      // the watched directory (inotify reports it where the link is): only the poll sees it.
      const path = tokenFile("before\n")
      const elsewhere = mkdtempSync(join(pki.dir, "elsewhere-"))
      linkSync(path, join(elsewhere, "link.txt"))
      const auth = yield* watchTokenFile("--auth-token-file", path, { pollInterval: "100 millis" })
      const relay = yield* startDcRelay("east", { auth })
      expect((yield* call(`${relay.url}/v1/relay`, "before")).status).toBe(200)
      writeFileSync(join(elsewhere, "link.txt"), "after-the-poll\n")
      yield* revisionReached(auth, 2)
      expect((yield* call(`${relay.url}/v1/relay`, "after-the-poll")).status).toBe(200)
      expectUnauthorized(yield* call(`${relay.url}/v1/relay`, "before"), /not accepted/)
    })
  )
})

describe("bearer tokens on the global HTTP API", () => {
  live("401 without the token, 200 with it; /healthz stays open", () =>
    Effect.gen(function* () {
      const auth = yield* watchTokenFile("--auth-token-file", tokenFile("router-token\n"))
      const relay = yield* startDcRelay("east")
      const context = yield* Layer.build(
        GlobalProcess.layer(
          { relays: [{ name: "east", url: relay.url }] },
          { host: "127.0.0.1", port: 0, auth }
        )
      )
      const url = yield* GlobalHttpServer.serverUrl.pipe(Effect.provide(context))
      expectUnauthorized(yield* call(`${url}/v1/domains`), /missing/)
      expectUnauthorized(yield* call(`${url}/v1/domains`, "not-the-token"), /not accepted/)
      expectUnauthorized(
        yield* call(`${url}/v1/overlap`, undefined, {
          method: "POST",
          headers: { "content-type": "application/json" },
          body: "{}"
        }),
        /missing/
      )
      expectUnauthorized(yield* call(`${url}/metrics`), /missing/)
      expect((yield* call(`${url}/v1/domains`, "router-token")).status).toBe(200)
      expect((yield* call(`${url}/healthz`)).status).toBe(200)
    })
  )
})
