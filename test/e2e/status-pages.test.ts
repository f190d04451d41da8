/**
 * The status pages (PROTOCOL §5 and §7 ◆ `GET /`) in a real headless Chromium (Debian's
 * `/usr/bin/chromium`, driven by playwright-core): two `kvrelay relay` processes fed by
 * vLLM-format engines over ZeroMQ and one `kvrelay global`. dc-a serves without a token;
 * dc-b and the global consumer require one (`--auth-token-file`), so their pages must ask for it.
 *
 * A server with a token file wants it for `GET /` too, which a browser cannot send on a
 * navigation; here the test adds it to the document request only (as a proxy in front of the
 * server would), never to the page's own fetches: those must get it from the page's form.
 *
 * Every wait is on a page condition with a generous bound, never a fixed sleep.
 */

import { existsSync, mkdtempSync, rmSync, writeFileSync } from "node:fs"
import * as net from "node:net"
import { tmpdir } from "node:os"
import { join } from "node:path"
import type { Scope } from "effect"
import { type BrowserContext, chromium, type Page } from "playwright-core"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { chainSequenceHash } from "../../src/ckf/global.js"
import {
  closeScope,
  discoveryOf,
  eventually,
  KV_BLOCK_SIZE,
  type KvrelayProcess,
  MODEL,
  makeScope,
  makeTempDir,
  NAMESPACE,
  type SimWorker,
  startKvrelay,
  stopAll,
  type TempDir,
  type TokenEngine,
  tokenEngine,
  writeDiscovery
} from "./globalProcessesHarness.js"

const CHROMIUM = "/usr/bin/chromium"
const CHROMIUM_ARGS = [
  "--headless",
  "--no-sandbox",
  "--disable-gpu",
  "--disable-quic",
  "--no-first-run",
  "--disable-background-networking",
  "--disable-component-update",
  "--disable-sync"
]
const IN_CI = process.env.CI !== undefined && process.env.CI !== "" && process.env.CI !== "false"
const HAVE_CHROMIUM = existsSync(CHROMIUM)
// Locally a machine without Chromium skips, saying so; in CI the launch below fails instead.
const SKIP = !HAVE_CHROMIUM && !IN_CI
if (SKIP) {
  process.stderr.write(
    `status-pages.test.ts: skipped: ${CHROMIUM} is absent (Debian: apt-get install chromium; .ci/run installs it)\n`
  )
}

const TOKEN = "status-page-token-7f3a"
/** A rate cell once two refreshes were made: a number per second. */
const RATE = /^\d+(\.\d)?\/s$/
/** Page waits: the consumer converges asynchronously and the page refreshes every 2 s. */
const WAIT = { timeout: 30_000 }
/** A test: several page waits, each bounded by `WAIT`, so that a wait's own message is what fails. */
const TEST_MS = 150_000
/** A process's start, bounded generously: the test machine may be busy. */
const START_MS = 60_000

let scope: Scope.CloseableScope | undefined
let dir: TempDir | undefined
let userDataDir: string | undefined
let browser: BrowserContext | undefined
let relayA: KvrelayProcess
let relayB: KvrelayProcess
let global: KvrelayProcess
let engineA: TokenEngine
let engineB: TokenEngine

// ---------------------------------------------------------------------------------------------
// HTTP with an optional token (the harness's helpers send none)

const getJson = async (url: string, token?: string): Promise<unknown> => {
  const response = await fetch(url, {
    headers: token === undefined ? {} : { authorization: `Bearer ${token}` },
    signal: AbortSignal.timeout(5_000)
  })
  if (response.status !== 200) throw new Error(`GET ${url} answered ${response.status}`)
  return response.json()
}

const postJson = async (
  url: string,
  body: unknown,
  token?: string
): Promise<{ status: number; body: unknown }> => {
  const response = await fetch(url, {
    method: "POST",
    headers: {
      "content-type": "application/json",
      ...(token === undefined ? {} : { authorization: `Bearer ${token}` })
    },
    body: JSON.stringify(body),
    signal: AbortSignal.timeout(5_000)
  })
  return { status: response.status, body: await response.json() }
}

interface StatsBody {
  readonly endpoints: ReadonlyArray<{
    readonly servingEndpoint: string
    readonly aggregation: {
      readonly uniqueBlockCount: number
      readonly occupiedSlotCount: number
      readonly members: ReadonlyArray<{ readonly workerId: string; readonly blocks: number }>
    } | null
  }>
}

const relayStats = async (relay: KvrelayProcess, token?: string): Promise<StatsBody> =>
  (await getJson(`${relay.url}/v1/stats`, token)) as StatsBody

const blocksOf = async (relay: KvrelayProcess, workerId: string, token?: string): Promise<number> => {
  for (const endpoint of (await relayStats(relay, token)).endpoints)
    for (const member of endpoint.aggregation?.members ?? [])
      if (member.workerId === workerId) return member.blocks
  return 0
}

let warmCounter = 0n

/** Stores fresh blocks until the relay counts one: a ZeroMQ SUB misses what precedes its join. */
const warmUp = async (relay: KvrelayProcess, worker: SimWorker, token?: string): Promise<void> => {
  const before = await blocksOf(relay, worker.workerId, token)
  const deadline = Date.now() + 20_000
  for (;;) {
    warmCounter += 1n
    await worker.store([0x5a5a_0000_0000_0000n + warmCounter])
    try {
      await eventually(
        `relay ${relay.label} hears worker ${worker.workerId}`,
        () => blocksOf(relay, worker.workerId, token),
        (blocks) => blocks > before,
        1_000
      )
      return
    } catch (error) {
      if (Date.now() > deadline) throw error
    }
  }
}

// ---------------------------------------------------------------------------------------------
// The prompt: 4 full blocks stored in dc-a only

const PROMPT_BLOCKS = 4
const PROMPT = Array.from({ length: PROMPT_BLOCKS * KV_BLOCK_SIZE }, (_, i) => 70_000 + i)
const engineHashes = (seed: bigint) =>
  Array.from({ length: PROMPT_BLOCKS }, (_, i) => chainSequenceHash(seed, BigInt(9_000 + i), 0n))

// ---------------------------------------------------------------------------------------------
// Browser

interface OpenedPage {
  readonly page: Page
  /** Console errors and uncaught exceptions of the page so far (CSP violations are console errors). */
  readonly problems: Array<string>
  readonly headers: Record<string, string>
}

const pageProblems = new WeakMap<Page, Array<string>>()

/**
 * Opens `url`/ in a new tab. With `documentToken` the document request alone carries the token;
 * the page's fetches carry what the page itself sends.
 */
const openPage = async (url: string, documentToken?: string): Promise<OpenedPage> => {
  const page = await browser!.newPage()
  const problems: Array<string> = []
  pageProblems.set(page, problems)
  page.on("console", (message) => {
    if (message.type() === "error") problems.push(`console: ${message.text()}`)
  })
  page.on("pageerror", (error) => problems.push(`pageerror: ${error.message}`))
  const documentUrl = `${url}/`
  if (documentToken !== undefined) {
    await page.route(documentUrl, (route) =>
      route.continue({
        headers: { ...route.request().headers(), authorization: `Bearer ${documentToken}` }
      })
    )
  }
  const response = await page.goto(documentUrl, { waitUntil: "load", ...WAIT })
  if (response === null) throw new Error(`no response for ${documentUrl}`)
  expect(response.status()).toBe(200)
  return { page, problems, headers: response.headers() }
}

/** Problems other than the failed requests of `statuses` that the test itself provokes. */
const unexpected = (problems: ReadonlyArray<string>, statuses: ReadonlyArray<number>): Array<string> =>
  problems.filter(
    (p) =>
      !statuses.some((status) =>
        p.startsWith(`console: Failed to load resource: the server responded with a status of ${status} `)
      )
  )

const textOf = async (page: Page, selector: string): Promise<string> =>
  ((await page.locator(selector).first().textContent({ timeout: WAIT.timeout })) ?? "").trim()

/**
 * What the page-side predicates below use of the DOM (the tests compile without the DOM library).
 * Playwright runs them in the page through the DevTools protocol; a string predicate would be
 * `eval`ed there, which the page's content security policy refuses.
 */
interface PageGlobals {
  readonly document: {
    querySelector(selector: string): { readonly textContent: string | null } | null
    readonly documentElement: { readonly scrollWidth: number; readonly clientWidth: number }
  }
}

/**
 * `wait`, or on its timeout an error saying what was awaited, what the element reads, and the
 * page's refresh error if it shows one.
 */
const explained = async (page: Page, selector: string, what: string, wait: Promise<unknown>) => {
  try {
    await wait
  } catch (error) {
    const read = (target: string) =>
      page
        .evaluate(
          (sel) => (globalThis as unknown as PageGlobals).document.querySelector(sel)?.textContent ?? null,
          target
        )
        .catch(() => null)
    const [actual, pageError] = await Promise.all([read(selector), read("#error")])
    const problems = pageProblems.get(page) ?? []
    throw new Error(
      `waited ${WAIT.timeout} ms for ${selector} to ${what}; it reads ${JSON.stringify(actual?.trim() ?? null)}` +
        (pageError ? `; the page says ${JSON.stringify(pageError)}` : "") +
        (problems.length > 0 ? `; the page logged ${JSON.stringify(problems.slice(-3))}` : "") +
        ` (${error instanceof Error ? error.message.split("\n")[0] : String(error)})`
    )
  }
}

/** Waits until the first element matching `selector` has exactly `text` (trimmed), or contains it. */
const waitForText = (page: Page, selector: string, text: string, match: "equal" | "contain" = "equal") =>
  explained(
    page,
    selector,
    `${match === "equal" ? "read" : "contain"} ${JSON.stringify(text)}`,
    page.waitForFunction(
      ({ selector, text, match }) => {
        const read = (
          (globalThis as unknown as PageGlobals).document.querySelector(selector)?.textContent ?? ""
        ).trim()
        return match === "equal" ? read === text : read.includes(text)
      },
      { selector, text, match },
      WAIT
    )
  )

/** Waits until the first element matching `selector` holds a number of at least `min`. */
const waitForAtLeast = (page: Page, selector: string, min: number) =>
  explained(
    page,
    selector,
    `hold a number of at least ${min}`,
    page.waitForFunction(
      ({ selector, min }) =>
        Number((globalThis as unknown as PageGlobals).document.querySelector(selector)?.textContent) >= min,
      { selector, min },
      WAIT
    )
  )

/** Waits until the first element matching `selector` has text matching `pattern`. */
const waitForMatch = (page: Page, selector: string, pattern: RegExp) =>
  explained(
    page,
    selector,
    `match ${pattern}`,
    page.waitForFunction(
      ({ selector, source, flags }) =>
        new RegExp(source, flags).test(
          (globalThis as unknown as PageGlobals).document.querySelector(selector)?.textContent ?? ""
        ),
      { selector, source: pattern.source, flags: pattern.flags },
      WAIT
    )
  )

const expectStatusPageHeaders = (headers: Record<string, string>): void => {
  expect(headers["content-type"]).toBe("text/html; charset=utf-8")
  const csp = headers["content-security-policy"] ?? ""
  expect(csp).toContain("default-src 'none'")
  expect(csp).toMatch(/script-src 'sha256-[A-Za-z0-9+/]+=*'(;|$)/)
  expect(csp).toMatch(/style-src 'sha256-[A-Za-z0-9+/]+=*'(;|$)/)
  expect(csp).toContain("connect-src 'self'")
  // No origin anywhere: only 'self', hashes and data: for the empty icon.
  expect(csp).not.toMatch(/https?:|\*/)
  expect(headers["x-content-type-options"]).toBe("nosniff")
}

// ---------------------------------------------------------------------------------------------
// Setup

beforeAll(async () => {
  if (SKIP) return
  // The browser first: a machine that cannot run it fails at once, before any process starts.
  userDataDir = mkdtempSync(join(tmpdir(), "kvrelay-chromium-"))
  try {
    browser = await chromium.launchPersistentContext(userDataDir, {
      executablePath: CHROMIUM,
      headless: true,
      args: CHROMIUM_ARGS
    })
  } catch (error) {
    throw new Error(
      `Chromium could not start from ${CHROMIUM} (.ci/run installs Debian's chromium; the status-page tests need it): ${
        error instanceof Error ? error.message : String(error)
      }`
    )
  }
  scope = await makeScope()
  dir = makeTempDir()
  const tokenFile = join(dir.path, "tokens.txt")
  writeFileSync(tokenFile, `# status page test\n${TOKEN}\n`)
  engineA = await tokenEngine(scope, "5001")
  engineB = await tokenEngine(scope, "6001")
  const pathA = join(dir.path, "dc-a.json")
  const pathB = join(dir.path, "dc-b.json")
  writeDiscovery(pathA, await discoveryOf([engineA]))
  writeDiscovery(pathB, await discoveryOf([engineB]))
  const relayArgs = (dcId: string, path: string, ...extra: ReadonlyArray<string>) => [
    "relay",
    "--dc-id",
    dcId,
    "--discovery",
    `file:${path}`,
    "--http",
    "127.0.0.1:0",
    "--publication-delay-ms",
    "1",
    "--expected-unique-blocks",
    "65536",
    ...extra
  ]
  ;[relayA, relayB] = await Promise.all([
    startKvrelay("relay dc-a", relayArgs("dc-a", pathA), START_MS),
    startKvrelay("relay dc-b", relayArgs("dc-b", pathB, "--auth-token-file", tokenFile), START_MS)
  ])
  global = await startKvrelay(
    "global",
    [
      "global",
      "--relay",
      `dc-a=${relayA.url}`,
      "--relay",
      `dc-b=${relayB.url}`,
      "--http",
      "127.0.0.1:0",
      "--auth-token-file",
      tokenFile,
      "--relay-token-file",
      tokenFile
    ],
    START_MS
  )
  await Promise.all([warmUp(relayA, engineA), warmUp(relayB, engineB, TOKEN)])
}, 240_000)

afterAll(async () => {
  await browser?.close()
  if (userDataDir !== undefined) rmSync(userDataDir, { recursive: true, force: true })
  await stopAll()
  if (scope !== undefined) await closeScope(scope)
  dir?.remove()
}, 60_000)

// ---------------------------------------------------------------------------------------------

describe.skipIf(SKIP)("status pages in headless Chromium", () => {
  const ENDPOINT = "prod.backend.generate"

  it(
    "the relay page shows the pool, its member and blocks, fill, rates and subscribers",
    async () => {
      const before = await blocksOf(relayA, "5001")
      await engineA.storeTokens(engineHashes(0xaaaan), PROMPT)
      await eventually(
        "the prompt's blocks counted in dc-a",
        () => blocksOf(relayA, "5001"),
        (blocks) => blocks === before + PROMPT_BLOCKS,
        15_000
      )
      const { page, problems, headers } = await openPage(relayA.url)
      expectStatusPageHeaders(headers)

      await waitForText(page, "#dc-name", "dc-a")
      const pool = `#pools tr[data-endpoint="${ENDPOINT}"]`
      const activity = `#activity tr[data-endpoint="${ENDPOINT}"]`
      const member = `#members tr[data-endpoint="${ENDPOINT}"][data-worker="5001"]`
      await waitForText(page, `${member} td.blocks`, String(before + PROMPT_BLOCKS))
      await waitForText(page, `${pool} td.lifecycle`, "active")
      const stats = await relayStats(relayA)
      const unique = stats.endpoints.find((e) => e.servingEndpoint === ENDPOINT)!.aggregation!
        .uniqueBlockCount
      expect(unique).toBe(before + PROMPT_BLOCKS)
      await waitForText(page, `${pool} td.blocks`, String(unique))
      expect(await textOf(page, `${pool} td:nth-child(5)`)).toBe("1")
      expect(await textOf(page, `${pool} td:nth-child(3)`)).toBe(MODEL)
      // Fill: the occupied slots over the catalog format's slots, a few of a 65536-block filter.
      const catalog = (await getJson(`${relayA.url}/v1/catalog`)) as {
        pools: ReadonlyArray<{ producer: { format: { bucketCount: number; slotsPerBucket: number } } }>
      }
      const format = catalog.pools[0]!.producer.format
      const slots = stats.endpoints.find((e) => e.servingEndpoint === ENDPOINT)!.aggregation!
        .occupiedSlotCount
      expect(slots).toBeGreaterThan(0)
      const fill = slots / (format.bucketCount * format.slotsPerBucket)
      expect(Number(await page.locator(`${pool} td.fill meter`).getAttribute("value", WAIT))).toBe(fill)
      expect(await textOf(page, `${pool} td.fill`)).toBe(`${(fill * 100).toPrecision(2)} %`)
      // Rates need two refreshes; then every rate cell shows a number per second.
      await waitForMatch(page, `${activity} td.events-rate`, RATE)
      expect(await textOf(page, `${activity} td.blocks-rate`)).toMatch(RATE)
      expect(await textOf(page, `${activity} td.publications-rate`)).toMatch(RATE)
      // The page fits the browser's default 1280 px: no table pushes it sideways.
      const { scrollWidth, clientWidth } = await page.evaluate(() => {
        const root = (globalThis as unknown as PageGlobals).document.documentElement
        return { scrollWidth: root.scrollWidth, clientWidth: root.clientWidth }
      })
      expect(scrollWidth).toBeLessThanOrEqual(clientWidth)
      // The global consumer holds a pool stream of dc-a.
      await waitForAtLeast(page, '#subscribers tr[data-stream="pool"] td.count', 1)
      expect(await textOf(page, "#recovering tbody")).toBe("none: every source is live")
      expect(await textOf(page, `${member} td.source`)).toBe("live")
      expect(await textOf(page, "#health")).toBe("healthy")

      // The page refreshes itself: blocks stored now appear without a reload.
      await engineA.storeTokens(
        [0x5a5a_1111_0000_0001n],
        PROMPT.slice(0, KV_BLOCK_SIZE).map((t) => t + 1)
      )
      await waitForText(page, `${member} td.blocks`, String(before + PROMPT_BLOCKS + 1))
      expect(await page.locator("#auth").isHidden()).toBe(true)
      expect(problems).toEqual([])
      await page.close()
    },
    TEST_MS
  )

  it(
    "a relay page with a source still connecting does not say every source is live",
    async () => {
      // dc-c follows engine 5001 (live) and worker 5009, whose advertised endpoint is closed.
      const closed = await new Promise<number>((resolve) => {
        const server = net.createServer()
        server.listen(0, "127.0.0.1", () => {
          const { port } = server.address() as net.AddressInfo
          server.close(() => resolve(port))
        })
      })
      const live = await discoveryOf([engineA])
      const path = join(dir!.path, "dc-c.json")
      writeDiscovery(path, {
        cards: [...live.cards, { ...(live.cards[0] as Record<string, unknown>), instanceId: "5009" }],
        sources: [
          ...live.sources,
          {
            ...(live.sources[0] as Record<string, unknown>),
            workerId: "5009",
            publisherId: "5009",
            transport: {
              kind: "engine-zmq",
              endpoint: `tcp://127.0.0.1:${closed}`,
              topic: "",
              replayEndpoint: null
            }
          }
        ]
      })
      const relayC = await startKvrelay(
        "relay dc-c",
        ["relay", "--dc-id", "dc-c", "--discovery", `file:${path}`, "--http", "127.0.0.1:0"],
        START_MS
      )
      const { page, problems } = await openPage(relayC.url)
      await waitForText(page, "#dc-name", "dc-c")
      await waitForText(page, "#source-counts", "1 / 2 (1 connecting)")
      const row = '#recovering tr[data-worker="5009"]'
      await waitForText(page, `${row} td.state`, "connecting")
      expect(await textOf(page, `${row} td.transport`)).toBe(`tcp://127.0.0.1:${closed}`)
      // Until the first connection attempt fails the reason says no connection yet.
      await waitForText(page, `${row} td.reason`, "ECONNREFUSED", "contain")
      expect(await textOf(page, "#recovering tbody")).not.toContain("every source is live")
      expect(await page.locator('#recovering tr[data-worker="5001"]').count()).toBe(0)
      expect(problems).toEqual([])
      await page.close()
    },
    TEST_MS
  )

  it(
    "the page of a relay with a token file asks for the token, sends it, and keeps it for the tab",
    async () => {
      const { page, problems, headers } = await openPage(relayB.url, TOKEN)
      expectStatusPageHeaders(headers)
      await page.locator("#auth").waitFor({ state: "visible", ...WAIT })
      expect(await textOf(page, "#auth-message")).toBe("This server needs a bearer token.")
      expect(await textOf(page, "#dc-name")).toBe("—")

      await page.fill("#auth-token", "not-the-token")
      await page.click('#auth button[type="submit"]')
      await waitForMatch(page, "#auth-message", /not accepted/)
      expect(await page.locator("#auth").isVisible()).toBe(true)

      await page.fill("#auth-token", TOKEN)
      await page.click('#auth button[type="submit"]')
      await waitForText(page, "#dc-name", "dc-b")
      const blocks = await blocksOf(relayB, "6001", TOKEN)
      expect(blocks).toBeGreaterThan(0)
      await waitForText(page, `#members tr[data-worker="6001"] td.blocks`, String(blocks))
      expect(await page.locator("#auth").isHidden()).toBe(true)
      expect(
        await page.evaluate(() =>
          (
            globalThis as unknown as { sessionStorage: { getItem(key: string): string | null } }
          ).sessionStorage.getItem("kvrelay.bearerToken")
        )
      ).toBe(TOKEN)

      // Reloaded, the tab still has the token: no form, data at once.
      await page.reload({ waitUntil: "load" })
      await waitForText(page, "#dc-name", "dc-b")
      expect(await page.locator("#auth").isHidden()).toBe(true)
      expect(unexpected(problems, [401])).toEqual([])
      await page.close()
    },
    TEST_MS
  )

  it(
    "the global page shows relays and ready lanes, and answers a query by tokens per DC",
    async () => {
      // The consumer has dc-a's blocks of the prompt installed before the page asks.
      const query = { namespace: NAMESPACE, model: MODEL, tokens: PROMPT }
      await eventually(
        "the prompt found in dc-a through the consumer",
        () => postJson(`${global.url}/v1/overlap`, query, TOKEN),
        (answer) =>
          answer.status === 200 &&
          (answer.body as { results: Array<{ relay: string; prefixDepth: number }> }).results.some(
            (r) => r.relay === "dc-a" && r.prefixDepth === PROMPT_BLOCKS
          ),
        30_000
      )

      const { page, problems, headers } = await openPage(global.url, TOKEN)
      expectStatusPageHeaders(headers)
      await page.locator("#auth").waitFor({ state: "visible", ...WAIT })
      await page.fill("#auth-token", TOKEN)
      await page.click('#auth button[type="submit"]')

      for (const relay of ["dc-a", "dc-b"]) {
        await waitForText(page, `#relays tr[data-relay="${relay}"] td.connected`, "yes")
        await waitForText(page, `#domains tr[data-relay="${relay}"] td.state`, "ready")
      }
      expect(await page.locator("#domains div.domain").count()).toBe(1)
      expect(await textOf(page, '#relays tr[data-relay="dc-a"] td:nth-child(4)')).toBe("1 / 1")
      expect(await textOf(page, "#health")).toBe("healthy (a lane is ready)")

      // The query box: tokens as a router holds them, comma and space separated.
      await page.fill("#q-namespace", NAMESPACE)
      await page.fill("#q-model", MODEL)
      await page.fill("#q-tokens", PROMPT.join(", "))
      await page.click("#q-submit")
      await waitForText(page, '#q-results tr[data-relay="dc-a"] td.depth', String(PROMPT_BLOCKS))
      expect(await textOf(page, '#q-results tr[data-relay="dc-a"] td.matched')).toBe(
        String(PROMPT_BLOCKS * KV_BLOCK_SIZE)
      )
      expect(await textOf(page, '#q-results tr[data-relay="dc-b"] td.depth')).toBe("0")
      expect(await textOf(page, '#q-results tr[data-relay="dc-b"] td.matched')).toBe("0")
      // The same prompt's routing decision: no engine serves metrics here, so both loads are
      // unknown (eligible, LOAD_UNKNOWN) and the DC holding the prompt wins on its cache.
      await waitForText(page, "#r-decision", "Route: dc-a (lane 0, prod.backend.generate)")
      expect(await textOf(page, '#r-candidates tr[data-relay="dc-a"] td.reason')).toBe("LOAD_UNKNOWN")
      expect(await textOf(page, '#r-candidates tr[data-relay="dc-a"] td.cost')).toBe("0")
      expect(await textOf(page, '#r-candidates tr[data-relay="dc-b"] td.cost')).toBe(
        String(PROMPT_BLOCKS * KV_BLOCK_SIZE)
      )

      // A model no relay serves: the server's message is shown.
      const refused = await postJson(`${global.url}/v1/overlap`, { ...query, model: "no-such-model" }, TOKEN)
      expect(refused.status).toBe(404)
      await page.fill("#q-model", "no-such-model")
      await page.click("#q-submit")
      await waitForText(page, "#q-status", (refused.body as { message: string }).message)
      expect(await page.locator("#q-results").isHidden()).toBe(true)

      // A token id that is not a u32 is refused before anything is sent.
      await page.fill("#q-model", MODEL)
      await page.fill("#q-tokens", "1 2 4294967296")
      await page.click("#q-submit")
      await waitForText(page, "#q-status", 'token 3 ("4294967296") is not an integer in [0, 2^32)')

      // Spaces and a pasted JSON array work as well.
      await page.fill("#q-tokens", `[${PROMPT.slice(0, 2 * KV_BLOCK_SIZE).join(" ")}]`)
      await page.click("#q-submit")
      await waitForText(page, '#q-results tr[data-relay="dc-a"] td.depth', "2")

      // The queries the page ran are counted in the consumer's stats, which the page shows.
      await waitForAtLeast(page, '#queries tr[data-route="/v1/overlap"] td:nth-child(2)', 3)
      // 401 before the token was given, 404 for the unknown model.
      expect(unexpected(problems, [401, 404])).toEqual([])
      await page.close()
    },
    TEST_MS
  )
})
