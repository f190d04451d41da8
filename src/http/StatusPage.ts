/**
 * What the two status pages (`GET /` of the relay and of the global consumer, PROTOCOL §5 and §7
 * ◆) share: the document shell, the stylesheet, a script prelude (bearer token, fetch, DOM and
 * number helpers, the refresh loop) and the response with its headers.
 *
 * A page is one static document: no data is rendered on the server, the script fetches the JSON
 * APIs of the same origin every `REFRESH_MS` and builds the tables with `textContent`, so nothing
 * a relay or a worker names is ever parsed as HTML. The content security policy allows exactly
 * the page's own inline script and stylesheet (by SHA-256 hash), requests to the same origin,
 * and nothing else: a string that slipped into the document as markup still could not run.
 *
 * With a token file configured, `GET /` needs the token like every route but `/healthz`
 * (PROTOCOL §1 ◆), so a page was fetched by something that presented it (a proxy, a header
 * extension); the page's own script cannot read that header. It asks for the token in a small
 * form the first time an API answers 401, keeps it in `sessionStorage` (one tab, gone when the
 * tab closes) and sends it as `Authorization: Bearer …` from then on.
 */

import { createHash } from "node:crypto"
import * as HttpServerResponse from "@effect/platform/HttpServerResponse"

/** How often a page fetches its APIs again, after the previous round ended. */
const REFRESH_MS = 2_000

/** The `sessionStorage` key of the bearer token. */
const TOKEN_STORAGE_KEY = "kvrelay.bearerToken"

const CSS = `
:root { color-scheme: light dark; --fg: #1b1f24; --muted: #5b6470; --line: #d0d7de; --bg: #ffffff;
  --head: #f3f5f7; --ok: #1a7f37; --bad: #cf222e; --warn: #9a6700; }
@media (prefers-color-scheme: dark) { :root { --fg: #e6edf3; --muted: #9aa4ae; --line: #30363d;
  --bg: #0d1117; --head: #161b22; --ok: #3fb950; --bad: #f85149; --warn: #d29922; } }
* { box-sizing: border-box; }
body { margin: 0; padding: 1rem 1.5rem 3rem; font: 14px/1.45 system-ui, sans-serif; color: var(--fg);
  background: var(--bg); }
header { display: flex; flex-wrap: wrap; gap: 0.5rem 1.25rem; align-items: baseline; margin-bottom: 0.5rem; }
h1 { font-size: 1.3rem; margin: 0; }
h2 { font-size: 1.05rem; margin: 1.5rem 0 0.4rem; }
h3 { font-size: 0.95rem; margin: 1rem 0 0.3rem; }
[hidden] { display: none !important; }
.muted, #updated { color: var(--muted); }
.ok { color: var(--ok); font-weight: 600; }
.bad { color: var(--bad); font-weight: 600; }
.warn { color: var(--warn); font-weight: 600; }
#error { color: var(--bad); }
table { border-collapse: collapse; margin: 0.2rem 0 0.6rem; min-width: 30rem; }
th, td { border: 1px solid var(--line); padding: 0.2rem 0.5rem; text-align: left; vertical-align: top; }
th { background: var(--head); font-weight: 600; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
td.empty { color: var(--muted); font-style: italic; }
dl { display: grid; grid-template-columns: max-content auto; gap: 0.1rem 1rem; margin: 0.3rem 0; }
dt { color: var(--muted); }
dd { margin: 0; font-variant-numeric: tabular-nums; }
meter { width: 6rem; vertical-align: middle; }
code, .mono { font-family: ui-monospace, monospace; font-size: 0.92em; }
form { display: flex; flex-wrap: wrap; gap: 0.4rem 0.8rem; align-items: end; margin: 0.4rem 0; }
label { display: flex; flex-direction: column; gap: 0.1rem; color: var(--muted); }
input, textarea, button { font: inherit; color: var(--fg); background: var(--bg); border: 1px solid var(--line);
  border-radius: 4px; padding: 0.25rem 0.4rem; }
textarea { width: min(60rem, 90vw); min-height: 4.5rem; font-family: ui-monospace, monospace; }
button { cursor: pointer; background: var(--head); }
#auth { border: 1px solid var(--warn); border-radius: 6px; padding: 0.5rem 0.8rem; }
`

/**
 * The `kv` helpers every page script uses. Plain ES2020 for any current browser; it is a string,
 * so it is written without template literals (the TypeScript around it would interpolate them).
 */
const PRELUDE = String.raw`
"use strict";
var kv = (function () {
  var TOKEN_KEY = ${JSON.stringify(TOKEN_STORAGE_KEY)};
  var PERIOD = ${REFRESH_MS};
  var B64TOKEN = /^[A-Za-z0-9\-._~+\/]+=*$/;
  var $ = function (id) { return document.getElementById(id); };

  function Unauthorized(message) { this.message = message; }
  function HttpError(path, status, reason, message) {
    this.path = path; this.status = status; this.reason = reason;
    this.message = path + " answered " + status + (reason ? " " + reason : "") + (message ? ": " + message : "");
    this.detail = message || reason || ("HTTP " + status);
  }

  function storedToken() {
    try { return sessionStorage.getItem(TOKEN_KEY); } catch (e) { return null; }
  }

  /**
   * fetch of a path of this origin with the stored token; resolves to the parsed JSON body (or
   * the text with asText) when the status is one of ok (default [200]). A 401 shows the token
   * form and throws Unauthorized; other statuses throw HttpError with the body's message.
   */
  async function api(path, options) {
    options = options || {};
    var headers = { accept: options.asText ? "text/plain" : "application/json" };
    var token = storedToken();
    if (token) headers.authorization = "Bearer " + token;
    var init = { method: options.method || "GET", headers: headers, cache: "no-store", credentials: "same-origin" };
    if (options.body !== undefined) {
      headers["content-type"] = "application/json";
      init.body = JSON.stringify(options.body);
    }
    var response = await fetch(path, init);
    var text = await response.text();
    var body = null;
    if (!options.asText) { try { body = JSON.parse(text); } catch (e) { body = null; } }
    if (response.status === 401) {
      var why = body && typeof body.message === "string" ? body.message : "this server needs a bearer token";
      showAuth(token ? "The token was not accepted (" + why + ")." : "This server needs a bearer token.");
      throw new Unauthorized(why);
    }
    var ok = options.ok || [200];
    if (ok.indexOf(response.status) < 0) {
      var reason = body && typeof body.reason === "string" ? body.reason : "";
      var message = body && typeof body.message === "string" ? body.message : text.slice(0, 300);
      throw new HttpError(path, response.status, reason, message);
    }
    return options.asText ? text : body;
  }

  /** The value of a request that may fail (an API this server does not have): null instead. */
  async function optional(promise) {
    try { return await promise; } catch (e) { if (e instanceof Unauthorized) throw e; return null; }
  }

  function el(tag, attrs, children) {
    var node = document.createElement(tag);
    if (attrs) for (var key in attrs) {
      var value = attrs[key];
      if (value === undefined || value === null || value === false) continue;
      if (key === "class") node.className = value;
      else if (key === "text") node.textContent = String(value);
      else node.setAttribute(key, value === true ? "" : String(value));
    }
    if (children) for (var i = 0; i < children.length; i++) {
      var child = children[i];
      if (child === undefined || child === null) continue;
      node.append(typeof child === "string" || typeof child === "number" ? String(child) : child);
    }
    return node;
  }
  function td(value, cls) {
    if (value instanceof Node) return el("td", { class: cls }, [value]);
    return el("td", { class: cls, text: value === undefined || value === null ? "—" : value });
  }
  function num(value) { return td(value, "num"); }
  /** Replaces a tbody's rows; an empty list shows one row saying so. */
  function rows(tbody, list, emptyText) {
    if (list.length > 0) { tbody.replaceChildren.apply(tbody, list); return; }
    var columns = tbody.parentNode.querySelectorAll("thead th").length || 1;
    tbody.replaceChildren(el("tr", null, [el("td", { class: "empty", colspan: columns, text: emptyText })]));
  }
  function state(text, good) { return el("span", { class: good ? "ok" : "bad", text: text }); }

  function int(value) {
    if (value === undefined || value === null) return "—";
    var n = Number(value);
    return Number.isFinite(n) && Math.abs(n) < 1e15 ? n.toLocaleString("en-US") : String(value);
  }
  function rate(value) {
    if (value === undefined || value === null) return "…";
    return (value >= 100 ? value.toFixed(0) : value.toFixed(1)) + "/s";
  }
  /** A fraction as a percentage; a small one keeps two significant digits rather than reading 0.00. */
  function pct(fraction) {
    if (fraction === null || !Number.isFinite(fraction)) return "—";
    var percent = fraction * 100;
    return (percent > 0 && percent < 1 ? percent.toPrecision(2) : percent.toFixed(2)) + " %";
  }
  function ms(value) { return value === undefined || value === null ? "—" : Number(value).toFixed(2) + " ms"; }
  function short(digest) { return typeof digest === "string" && digest.length > 12 ? digest.slice(0, 12) + "…" : digest; }
  function endpointText(e) {
    return e && typeof e === "object" ? e.namespace + "." + e.component + "." + e.endpoint : String(e);
  }

  // ---- bearer token form

  var started = false, timer = null, refresher = null, running = false, waitingForToken = false;

  function showAuth(message) {
    waitingForToken = true;
    $("updated").textContent = "waiting for a bearer token";
    $("auth-message").textContent = message;
    $("auth").hidden = false;
    $("auth-token").focus();
  }

  function wireAuth() {
    $("auth").addEventListener("submit", function (event) {
      event.preventDefault();
      var value = $("auth-token").value.trim();
      if (!B64TOKEN.test(value)) {
        $("auth-message").textContent = "A bearer token is letters, digits and -._~+/ with optional trailing =.";
        return;
      }
      try { sessionStorage.setItem(TOKEN_KEY, value); } catch (e) {
        $("auth-message").textContent = "sessionStorage is not available: " + e;
        return;
      }
      $("auth-token").value = "";
      $("auth").hidden = true;
      $("forget-token").hidden = false;
      waitingForToken = false;
      refreshNow();
    });
    $("forget-token").hidden = !storedToken();
    $("forget-token").addEventListener("click", function () {
      try { sessionStorage.removeItem(TOKEN_KEY); } catch (e) { /* nothing stored */ }
      $("forget-token").hidden = true;
      refreshNow();
    });
  }

  // ---- refresh loop: one round at a time, the next PERIOD after the last one ended

  async function round() {
    if (running) return;
    clearTimeout(timer);
    // A hidden tab makes no requests; becoming visible starts a round at once.
    if (document.visibilityState === "hidden") return;
    running = true;
    try {
      await refresher();
      $("error").textContent = "";
      $("updated").textContent = "updated " + new Date().toLocaleTimeString();
    } catch (e) {
      if (!(e instanceof Unauthorized)) $("error").textContent = "refresh failed: " + (e && e.message ? e.message : e);
    } finally {
      running = false;
      // Waiting for a token: polling would only collect 401s; the form restarts the loop.
      if (!waitingForToken) timer = setTimeout(round, PERIOD);
    }
  }
  function refreshNow() { clearTimeout(timer); round(); }

  function start(refresh) {
    if (started) return;
    started = true;
    refresher = refresh;
    wireAuth();
    document.addEventListener("visibilitychange", function () {
      if (document.visibilityState === "visible" && !waitingForToken) refreshNow();
    });
    round();
  }

  return { api: api, optional: optional, el: el, td: td, num: num, rows: rows, state: state, int: int,
    rate: rate, pct: pct, ms: ms, short: short, endpointText: endpointText, start: start,
    refreshNow: refreshNow, Unauthorized: Unauthorized, HttpError: HttpError, $: $ };
})();
`

const HEADER_CONTROLS = `
<span id="updated">loading…</span>
<button type="button" id="forget-token" hidden>Forget token</button>
<span id="error" role="alert"></span>
</header>
<form id="auth" hidden autocomplete="off">
  <label>Bearer token <input id="auth-token" type="password" size="40" spellcheck="false"></label>
  <button type="submit">Use token</button>
  <span id="auth-message" class="warn"></span>
</form>
`

const hashSource = (text: string): string =>
  `'sha256-${createHash("sha256").update(text, "utf8").digest("base64")}'`

const escapeHtml = (text: string): string => text.replace(/[&<>"']/g, (c) => `&#${c.charCodeAt(0)};`)

/** A rendered page: the document and the content security policy that lets its script run. */
export interface StatusPage {
  readonly html: string
  readonly contentSecurityPolicy: string
}

/**
 * The document of a page: `heading` (text), the `body` markup after the header, and `script`
 * (run after the prelude; it calls `kv.start(refresh)`).
 */
export const renderStatusPage = (page: {
  readonly title: string
  readonly heading: string
  readonly body: string
  /** The body of the page's function, which runs with `el`, `td`, `num` and `$` of the `kv` helpers in scope. */
  readonly script: string
}): StatusPage => {
  // Each page's script runs in a function of its own, with the helpers it uses most as locals.
  const script = `${PRELUDE}\n(function () {\n  var el = kv.el, td = kv.td, num = kv.num, $ = kv.$;\n${page.script}\n})();\n`
  if (/<\/script/i.test(script)) throw new Error("a status page script must not contain </script")
  const html = `<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>${escapeHtml(page.title)}</title>
<link rel="icon" href="data:,">
<style>${CSS}</style>
</head>
<body>
<header>
<h1>${escapeHtml(page.heading)}</h1>
${HEADER_CONTROLS}
${page.body}
<script>${script}</script>
</body>
</html>
`
  // The hashes cover the elements' exact text, so the policy admits these two and nothing else.
  const contentSecurityPolicy = [
    "default-src 'none'",
    `script-src ${hashSource(script)}`,
    `style-src ${hashSource(CSS)}`,
    "connect-src 'self'",
    "img-src data:",
    "base-uri 'none'",
    "form-action 'none'",
    "frame-ancestors 'none'"
  ].join("; ")
  return { html, contentSecurityPolicy }
}

/** The headers a page is served with (besides its content type). */
const statusPageHeaders = (page: StatusPage): Readonly<Record<string, string>> => ({
  "content-security-policy": page.contentSecurityPolicy,
  "x-content-type-options": "nosniff",
  "referrer-policy": "no-referrer",
  "cache-control": "no-store"
})

const STATUS_PAGE_CONTENT_TYPE = "text/html; charset=utf-8"

/** A 200 response of `page`. */
export const statusPageResponse = (page: StatusPage): HttpServerResponse.HttpServerResponse =>
  HttpServerResponse.text(page.html, {
    contentType: STATUS_PAGE_CONTENT_TYPE,
    headers: statusPageHeaders(page)
  })
