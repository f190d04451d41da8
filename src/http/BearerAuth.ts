/**
 * Bearer tokens (PROTOCOL.md §1 ◆): a token file (`--auth-token-file` on the servers,
 * `--relay-token-file` on the global consumer) holds one token per line, blank lines and `#`
 * comments ignored, and is re-read when it changes. With one configured, a server answers every
 * request but `GET /healthz` with 401 `{reason: "UNAUTHORIZED", message}` unless it carries
 * `Authorization: Bearer TOKEN` with a token of the file.
 *
 * The file is watched twice over: `fs.watch` on its directory reacts at once (and sees atomic
 * replacements and Kubernetes' symlink swaps, which a watch on the file itself misses), and a
 * stat poll catches what the watch drops. A read that fails or finds no valid token keeps the
 * last good set in force and logs an error, once per distinct problem: a half-written or
 * vanished file must not lock every client out, nor let anyone in.
 */

import { createHash, timingSafeEqual } from "node:crypto"
import { type FSWatcher, watch } from "node:fs"
import { readFile, stat } from "node:fs/promises"
import { basename, dirname } from "node:path"
import * as HttpServerRequest from "@effect/platform/HttpServerRequest"
import * as HttpServerResponse from "@effect/platform/HttpServerResponse"
import { Duration, Effect, Queue, type Scope, SubscriptionRef } from "effect"
import type { ErrorReason } from "../protocol/RelayApi.js"
import { FlagFileError, fileErrorText } from "./FlagFile.js"

/** A token file that cannot be used at startup. */
class TokenFileError extends FlagFileError("TokenFileError") {}

// RFC 6750 §2.1 b64token: what can follow `Bearer ` in a header.
const TOKEN = /^[A-Za-z0-9\-._~+/]+=*$/

/** The tokens of a file's text, or why it holds none that can be used. */
export const parseTokenFile = (text: string): ReadonlyArray<string> | string => {
  const tokens: Array<string> = []
  for (const [i, raw] of text.split(/\r?\n/).entries()) {
    const line = raw.trim()
    if (line === "" || line.startsWith("#")) continue
    if (!TOKEN.test(line)) {
      return `line ${i + 1} is not a bearer token (letters, digits and -._~+/ with optional trailing =)`
    }
    tokens.push(line)
  }
  return tokens.length === 0 ? "holds no token (only blank lines and # comments)" : tokens
}

const digest = (token: string): Buffer => createHash("sha256").update(token, "utf8").digest()

/** The tokens in force. */
interface TokenSet {
  /** Counts successful reads that changed the set (1 after the startup read). */
  readonly revision: number
  readonly count: number
  /** The first token: what a client presents. */
  readonly first: string
  /** SHA-256 of each token: equal-length inputs for `timingSafeEqual`. */
  readonly digests: ReadonlyArray<Buffer>
}

/** The set of `tokens` (at least one), as read for the `revision`th time. */
export const makeTokenSet = (revision: number, tokens: ReadonlyArray<string>): TokenSet => ({
  revision,
  count: tokens.length,
  first: tokens[0]!,
  digests: tokens.map(digest)
})

/**
 * Whether `presented` is one of the set's tokens, in time independent of where it differs: both
 * sides are hashed to 32 bytes and compared with `timingSafeEqual`, against every token with no
 * early exit, so neither the length nor the matching entry shows in the timing.
 */
export const tokenMatches = (set: TokenSet, presented: string): boolean => {
  const candidate = digest(presented)
  let matched = 0
  for (const known of set.digests) matched |= timingSafeEqual(candidate, known) ? 1 : 0
  return matched === 1
}

/** A watched token file. */
export interface TokenFile {
  readonly flag: string
  readonly path: string
  /** The set in force; `changes` streams it (tests wait on a revision). */
  readonly tokens: SubscriptionRef.SubscriptionRef<TokenSet>
  /** The first token in force, for a client's `Authorization` header. */
  readonly first: Effect.Effect<string>
  /** Re-reads the file now (the watcher does this on its own). */
  readonly reload: Effect.Effect<void>
}

interface TokenFileOptions {
  /** How often the file is stat'ed besides the directory watch (default 2 s). */
  readonly pollInterval?: Duration.DurationInput | undefined
  /** A change waits this long before the read, so that a file being written is read whole (default 50 ms). */
  readonly settle?: Duration.DurationInput | undefined
}

/** The file's tokens, or a problem in words. */
const readTokens = (path: string): Effect.Effect<ReadonlyArray<string> | string> =>
  Effect.promise(() =>
    readFile(path, "utf8").then(
      (text) => {
        const parsed = parseTokenFile(text)
        return typeof parsed === "string" ? `${path} ${parsed}` : parsed
      },
      (cause: unknown) => `cannot read ${path}: ${fileErrorText(cause)}`
    )
  )

/** What a stat poll compares: any change of these means the file was written or replaced. */
const fingerprint = (path: string): Effect.Effect<string> =>
  Effect.promise(() =>
    stat(path).then(
      (s) => `${s.ino}:${s.size}:${s.mtimeMs}:${s.ctimeMs}`,
      (cause: unknown) => `error:${fileErrorText(cause)}`
    )
  )

/**
 * Reads `path` (failing with `TokenFileError` naming `flag` when it cannot be used) and keeps
 * re-reading it on changes until the scope closes.
 */
export const watchTokenFile = (
  flag: string,
  path: string,
  options: TokenFileOptions = {}
): Effect.Effect<TokenFile, TokenFileError, Scope.Scope> =>
  Effect.gen(function* () {
    const initial = yield* readTokens(path)
    if (typeof initial === "string")
      return yield* Effect.fail(new TokenFileError({ flag, path, reason: initial }))
    const tokens = yield* SubscriptionRef.make(makeTokenSet(1, initial))
    const pollInterval = Duration.decode(options.pollInterval ?? Duration.seconds(2))
    const settle = Duration.decode(options.settle ?? Duration.millis(50))
    let lastText = initial.join("\n")
    let lastProblem: string | undefined
    let lastFingerprint = yield* fingerprint(path)

    const reload = Effect.gen(function* () {
      const read = yield* readTokens(path)
      if (typeof read === "string") {
        if (read !== lastProblem) {
          lastProblem = read
          yield* Effect.logError("token file unusable; the last good tokens stay in force").pipe(
            Effect.annotateLogs({ flag, problem: read })
          )
        }
        return
      }
      if (lastProblem !== undefined) {
        lastProblem = undefined
        yield* Effect.logInfo("token file usable again").pipe(Effect.annotateLogs({ flag, path }))
      }
      const text = read.join("\n")
      if (text === lastText) return
      lastText = text
      const next = yield* SubscriptionRef.updateAndGet(tokens, (set) => makeTokenSet(set.revision + 1, read))
      yield* Effect.logInfo("token file re-read").pipe(
        Effect.annotateLogs({ flag, path, tokens: next.count, revision: next.revision })
      )
    }).pipe(Effect.withSpan("BearerAuth.reload", { attributes: { "kvrelay.flag": flag } }))

    const triggers = yield* Queue.sliding<void>(1)
    const name = basename(path)
    yield* Effect.acquireRelease(
      Effect.sync((): FSWatcher | undefined => {
        try {
          const watcher = watch(dirname(path), { persistent: false }, (_event, changed) => {
            // A null name (some platforms) or a swap of the directory's `..data` link may be it.
            if (changed === null || changed === name || changed.startsWith("..")) {
              Queue.unsafeOffer(triggers, undefined)
            }
          })
          // A failed watch (the directory removed, inotify exhausted) leaves the poll.
          watcher.on("error", () => watcher.close())
          return watcher
        } catch {
          return undefined
        }
      }),
      (watcher) => Effect.sync(() => watcher?.close())
    )

    const changed = Effect.gen(function* () {
      const now = yield* fingerprint(path)
      if (now === lastFingerprint) return false
      lastFingerprint = now
      return true
    })
    yield* Effect.gen(function* () {
      for (;;) {
        const woken = yield* Effect.raceFirst(
          Effect.as(Queue.take(triggers), true),
          Effect.as(Effect.sleep(pollInterval), false)
        )
        if (woken) {
          yield* Effect.sleep(settle)
          yield* Queue.takeAll(triggers)
          lastFingerprint = yield* fingerprint(path)
          yield* reload
        } else if (yield* changed) {
          yield* reload
        }
      }
    }).pipe(
      Effect.catchAllCause((cause) => Effect.logError("token file watcher stopped", cause)),
      Effect.annotateLogs({ flag, path }),
      Effect.forkScoped
    )

    return {
      flag,
      path,
      tokens,
      first: Effect.map(SubscriptionRef.get(tokens), (set) => set.first),
      reload
    }
  })

// ---------------------------------------------------------------------------------------------
// The request guard

const UNAUTHORIZED: ErrorReason = "UNAUTHORIZED"

/** Why a request is refused, or undefined when its `Authorization` header carries a known token. */
export const authorizationProblem = (set: TokenSet, header: string | undefined): string | undefined => {
  if (header === undefined || header === "") return "missing Authorization: Bearer header"
  const found = /^Bearer +(\S+) *$/i.exec(header)
  if (found === null) return "the Authorization header is not a Bearer token"
  return tokenMatches(set, found[1]!) ? undefined : "the bearer token is not accepted"
}

const unauthorized = (message: string, invalidToken: boolean): HttpServerResponse.HttpServerResponse =>
  HttpServerResponse.text(JSON.stringify({ reason: UNAUTHORIZED, message }), {
    status: 401,
    contentType: "application/json",
    headers: {
      "www-authenticate": invalidToken
        ? 'Bearer realm="kvrelay", error="invalid_token"'
        : 'Bearer realm="kvrelay"'
    }
  })

/**
 * `app` behind the token check: `GET /healthz` (a liveness probe that reveals nothing) always
 * passes, every other request needs a token of `tokens`. Without a token file the app is returned
 * unchanged.
 */
export const guard =
  (tokens: TokenFile | undefined) =>
  <E, R>(
    app: Effect.Effect<HttpServerResponse.HttpServerResponse, E, R>
  ): Effect.Effect<HttpServerResponse.HttpServerResponse, E, R | HttpServerRequest.HttpServerRequest> => {
    if (tokens === undefined) return app
    return Effect.flatMap(HttpServerRequest.HttpServerRequest, (request) => {
      const queryAt = request.url.indexOf("?")
      const path = queryAt < 0 ? request.url : request.url.slice(0, queryAt)
      if (request.method === "GET" && path === "/healthz") return app
      return Effect.flatMap(SubscriptionRef.get(tokens.tokens), (set) => {
        const problem = authorizationProblem(set, request.headers["authorization"])
        if (problem === undefined) return app
        return Effect.as(
          Effect.logDebug("HTTP request refused: unauthorized").pipe(
            Effect.annotateLogs({ method: request.method, path, problem })
          ),
          unauthorized(problem, problem === "the bearer token is not accepted")
        )
      })
    })
  }
