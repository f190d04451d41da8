/**
 * The global consumer's status page, `GET /` (PROTOCOL §7 ◆): the relays it follows, its
 * indexer domains with their lanes and their state, the query counts, and a form that runs an
 * overlap query by tokens (`POST /v1/overlap` with `{namespace, model, tokens, loraName?}`) and
 * shows each ready lane's `prefixDepth` and `matchedTokens`, or the answer's `message`; the same
 * body's routing decision (`POST /v1/route`, PROTOCOL §7.1) follows, with every candidate's
 * eligibility, reason, cost terms and load.
 *
 * Data: `/v1/domains`, and `/v1/health` and `/v1/stats` when the server has them (without them
 * the relays are the names the lanes give, and the lanes show no counters).
 */

import { renderStatusPage, type StatusPage } from "../../http/StatusPage.js"

const BODY = `
<section>
<h2>Overlap query</h2>
<form id="query" autocomplete="off">
  <label>Namespace <input id="q-namespace" required spellcheck="false"></label>
  <label>Model <input id="q-model" required spellcheck="false"></label>
  <label>LoRA adapter (optional) <input id="q-lora" spellcheck="false"></label>
  <label>Token ids (comma or space separated)
    <textarea id="q-tokens" required spellcheck="false" placeholder="128000, 9906, 1917, …"></textarea></label>
  <button type="submit" id="q-submit">Query</button>
</form>
<p id="q-status" class="muted"></p>
<table id="q-results" hidden>
<thead><tr><th>Relay</th><th>Lane</th><th>Serving endpoint</th><th>Prefix depth</th><th>Matched tokens</th></tr></thead>
<tbody></tbody>
</table>
<p id="r-decision" class="muted" hidden></p>
<table id="r-candidates" hidden>
<thead><tr><th>Relay</th><th>Lane</th><th>Eligible</th><th>Reason</th><th>Cost</th><th>Uncached</th><th>Queue</th>
<th>Penalty</th><th>Running</th><th>Waiting</th><th>KV usage</th><th>Ranks observed</th><th>Load age</th></tr></thead>
<tbody></tbody>
</table>
</section>

<section>
<h2>Consumer</h2>
<dl>
  <dt>Health</dt><dd id="health">—</dd>
  <dt>Consumer instance</dt><dd id="consumer-instance" class="mono">—</dd>
  <dt>Subscriber id</dt><dd id="subscriber-id" class="mono">—</dd>
</dl>
</section>

<section>
<h2>Relays</h2>
<table id="relays">
<thead><tr><th>Relay</th><th>URL</th><th>Connected</th><th>Lanes ready</th><th>DC</th><th>DC id</th>
<th>Catalog revision</th><th>Connections</th><th>Last error</th></tr></thead>
<tbody></tbody>
</table>
</section>

<section>
<h2>Domains and lanes</h2>
<div id="domains"></div>
</section>

<section>
<h2>Queries</h2>
<table id="queries">
<thead><tr><th>Route</th><th>Count</th><th>Outcomes</th><th>Mean</th><th>p50</th><th>p99</th><th>Max</th></tr></thead>
<tbody></tbody>
</table>
</section>
`

// The body of the page's function: `renderStatusPage` opens it with the `kv` helpers in scope.
const SCRIPT = String.raw`
  var U32_MAX = 4294967295;

  /** The token ids of the text box, or a message saying which one is not a u32. */
  function parseTokens(text) {
    var trimmed = text.trim().replace(/^\[/, "").replace(/\]$/, "");
    var parts = trimmed.split(/[\s,]+/).filter(function (x) { return x !== ""; });
    if (parts.length === 0) return "give at least one token id";
    var out = [];
    for (var i = 0; i < parts.length; i++) {
      var n = Number(parts[i]);
      if (!/^\d+$/.test(parts[i]) || n > U32_MAX) {
        return "token " + (i + 1) + " (" + JSON.stringify(parts[i].slice(0, 40)) + ") is not an integer in [0, 2^32)";
      }
      out.push(n);
    }
    return out;
  }

  function showStatus(text, bad) {
    $("q-status").textContent = text;
    $("q-status").className = bad ? "bad" : "muted";
  }

  function opt(value, digits) {
    if (value === undefined || value === null) return "—";
    return digits === undefined ? String(value) : Number(value).toFixed(digits);
  }

  /** The routing decision for the same body (POST /v1/route, PROTOCOL §7.1): decision and every candidate's terms. */
  async function showRoute(body) {
    var decision = $("r-decision");
    try {
      var answer = await kv.api("/v1/route", { method: "POST", body: body, ok: [200, 503] });
      var d = answer.decision;
      decision.textContent = d ? "Route: " + d.relay + " (lane " + d.lane + ", " + kv.endpointText(d.servingEndpoint) + ")"
        : "Route: no eligible candidate (" + (answer.message || answer.reason || "none") + ")";
      decision.className = d ? "" : "bad";
      kv.rows($("r-candidates").tBodies[0], (answer.candidates || []).map(function (c) {
        var terms = c.terms || {};
        var load = c.load || {};
        return el("tr", { "data-relay": c.relay, "data-lane": c.lane }, [
          td(c.relay, "relay"), num(c.lane), td(c.eligible ? "yes" : "no", "eligible"), td(c.reason || "", "reason"),
          el("td", { class: "num cost", text: opt(c.cost) }),
          el("td", { class: "num", text: opt(terms.uncachedTokens) }),
          el("td", { class: "num", text: opt(terms.queueTokens) }),
          el("td", { class: "num", text: opt(terms.penaltyTokens) }),
          el("td", { class: "num", text: opt(load.runningRequests) }),
          el("td", { class: "num", text: opt(load.waitingRequests) }),
          el("td", { class: "num", text: opt(load.kvUsage, 2) }),
          el("td", { class: "num", text: load.observedRanks + "/" + load.expectedRanks }),
          el("td", { class: "num", text: load.ageMs === undefined ? "—" : load.ageMs + " ms" })
        ]);
      }), "no candidate");
      decision.hidden = false;
      $("r-candidates").hidden = false;
    } catch (e) {
      decision.hidden = false;
      $("r-candidates").hidden = true;
      decision.className = "bad";
      decision.textContent = "route: " + (e instanceof kv.HttpError ? e.detail : (e && e.message ? e.message : e));
    }
  }

  $("query").addEventListener("submit", async function (event) {
    event.preventDefault();
    var tokens = parseTokens($("q-tokens").value);
    if (typeof tokens === "string") { showStatus(tokens, true); $("q-results").hidden = true; return; }
    var body = { namespace: $("q-namespace").value.trim(), model: $("q-model").value.trim(), tokens: tokens };
    var lora = $("q-lora").value.trim();
    if (lora !== "") body.loraName = lora;
    $("q-submit").disabled = true;
    showStatus("querying " + tokens.length + " tokens…", false);
    try {
      var answer = await kv.api("/v1/overlap", { method: "POST", body: body });
      var results = answer.results || [];
      kv.rows($("q-results").tBodies[0], results.map(function (r) {
        return el("tr", { "data-relay": r.relay, "data-lane": r.lane }, [
          td(r.relay, "relay"), num(r.lane), td(kv.endpointText(r.servingEndpoint), "mono"),
          el("td", { class: "num depth", text: r.prefixDepth }),
          el("td", { class: "num matched", text: r.matchedTokens })
        ]);
      }), "no ready lane answered");
      $("q-results").hidden = false;
      showStatus(tokens.length + " tokens: " + results.length + " lane" + (results.length === 1 ? "" : "s") + " answered", false);
      await showRoute(body);
    } catch (e) {
      $("q-results").hidden = true;
      if (e instanceof kv.Unauthorized) showStatus("a bearer token is needed: enter it above and query again", true);
      else if (e instanceof kv.HttpError) showStatus(e.detail, true);
      else showStatus("the query failed: " + (e && e.message ? e.message : e), true);
    } finally {
      $("q-submit").disabled = false;
    }
  });

  function domainKey(cacheSemantics, routingScope) { return cacheSemantics.digest + "/" + routingScope.digest; }

  kv.start(async function refresh() {
    var got = await Promise.all([
      kv.api("/v1/domains"),
      kv.optional(kv.api("/v1/health", { ok: [200, 503] })),
      kv.optional(kv.api("/v1/stats"))
    ]);
    var domains = got[0], health = got[1], stats = got[2];

    $("health").replaceChildren(health
      ? kv.state(health.healthy ? "healthy (a lane is ready)" : "unhealthy (no lane is ready)", health.healthy)
      : "not available (no /v1/health)");
    $("consumer-instance").textContent = stats ? stats.consumerInstance : "—";
    $("subscriber-id").textContent = stats ? stats.subscriberId : "—";

    // Relays: health and stats when present, else the names the lanes carry.
    var relayNames = [], byName = {};
    function relay(name) {
      if (!byName[name]) { byName[name] = { name: name }; relayNames.push(name); }
      return byName[name];
    }
    if (health) health.relays.forEach(function (r) { Object.assign(relay(r.name), r); });
    var laneStats = {};
    if (stats) stats.relays.forEach(function (r) {
      var entry = relay(r.name);
      entry.url = r.url; entry.connected = r.connected; entry.lastError = r.lastError;
      entry.dcName = r.dcName; entry.dcId = r.dcId; entry.catalogRevision = r.catalogRevision; entry.epochs = r.epochs;
      r.lanes.forEach(function (lane) {
        laneStats[r.name + " " + domainKey(lane.domain.cacheSemantics, lane.domain.routingScope)] = lane;
      });
    });
    domains.forEach(function (d) { d.lanes.forEach(function (lane) { relay(lane.relay); }); });
    kv.rows($("relays").tBodies[0], relayNames.map(function (name) {
      var r = byName[name];
      return el("tr", { "data-relay": name }, [
        td(name, "relay"),
        td(r.url, "mono"),
        el("td", { class: "connected" }, [r.connected === undefined ? "—" : kv.state(r.connected ? "yes" : "no", r.connected)]),
        num(r.lanes === undefined ? null : r.lanesReady + " / " + r.lanes),
        td(r.dcName), td(r.dcId, "mono"), num(r.catalogRevision), num(r.epochs),
        td(r.lastError || "—")
      ]);
    }), "no relays");

    // Domains with their lanes, in the server's order.
    var namespaces = {};
    var sections = domains.map(function (d) {
      var key = domainKey(d.cacheSemantics, d.routingScope);
      var lanes = d.lanes.map(function (lane) {
        namespaces[lane.servingEndpoint.namespace] = true;
        var ls = laneStats[lane.relay + " " + key];
        return el("tr", { "data-relay": lane.relay, "data-lane": lane.lane }, [
          num(lane.lane), td(lane.relay, "relay"), td(kv.endpointText(lane.servingEndpoint), "mono"),
          el("td", { class: "state" }, [kv.state(lane.ready ? "ready" : "not ready", lane.ready)]),
          num(lane.installedSequence), td(lane.producer.producerIncarnation, "mono"),
          num(ls ? kv.int(ls.snapshotsInstalled) : null), num(ls ? kv.int(ls.deltasApplied) : null),
          num(ls ? kv.int(ls.resubscribes) : null), num(ls ? kv.int(ls.faults.total) : null),
          td(ls && ls.lastFault ? ls.lastFault : "—")
        ]);
      });
      var tbody = el("tbody");
      var table = el("table", { class: "lanes" }, [
        el("thead", null, [el("tr", null, ["Lane", "Relay", "Serving endpoint", "State", "Installed sequence",
          "Producer incarnation", "Snapshots", "Deltas applied", "Resubscribes", "Faults", "Last fault"
        ].map(function (h) { return el("th", { text: h }); }))]),
        tbody
      ]);
      kv.rows(tbody, lanes, "no lanes");
      return el("div", { class: "domain", "data-cache-semantics": d.cacheSemantics.digest, "data-routing-scope": d.routingScope.digest }, [
        el("h3", null, [
          "cache semantics ", el("code", { text: kv.short(d.cacheSemantics.digest), title: d.cacheSemantics.digest }),
          " · routing scope ", el("code", { text: kv.short(d.routingScope.digest), title: d.routingScope.digest }),
          " · blocks of " + d.querySemantics.kvBlockSize + " tokens, " + d.querySemantics.hashFormat
        ]),
        table
      ]);
    });
    if (sections.length > 0) $("domains").replaceChildren.apply($("domains"), sections);
    else $("domains").replaceChildren(el("p", { class: "muted", text: "no domains yet (no relay has published a pool)" }));
    var nsList = Object.keys(namespaces);
    if (nsList.length === 1) $("q-namespace").placeholder = nsList[0];

    kv.rows($("queries").tBodies[0], stats ? stats.queries.map(function (q) {
      var outcomes = Object.keys(q.outcomes).map(function (k) { return k + " " + q.outcomes[k]; }).join(", ");
      return el("tr", { "data-route": q.route }, [
        td(q.route, "mono"), num(kv.int(q.count)), td(outcomes || "—"),
        num(kv.ms(q.latency.meanMs)), num(kv.ms(q.latency.p50Ms)), num(kv.ms(q.latency.p99Ms)), num(kv.ms(q.latency.maxMs))
      ]);
    }) : [], stats ? "no queries yet" : "not available (no /v1/stats)");
  });
`

/** The page, rendered once: it holds no data, the script fetches everything. */
export const GLOBAL_STATUS_PAGE: StatusPage = renderStatusPage({
  title: "kvrelay global",
  heading: "kvrelay global consumer",
  body: BODY,
  script: SCRIPT
})
