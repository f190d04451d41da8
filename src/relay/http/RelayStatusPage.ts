/**
 * The relay's status page, `GET /` (PROTOCOL §5 ◆): the relay's identity and health, one row
 * per pool (serving endpoint) with its members, blocks and filter fill, another with its ingest
 * and publication rates, every expected source that is not live (connecting, recovering, degraded or rejected,
 * with its reason and history), and the subscribers of each stream kind.
 *
 * Data: `/v1/health`, `/v1/catalog` and `/v1/stats`, plus the `kv_dc_relay_subscribers` gauge of
 * `/metrics` (the JSON APIs do not count subscribers). Rates are differences of the stats'
 * cumulative counters between two refreshes over the time between them, so the first refresh
 * shows none yet; a counter that went down (a new generation) shows none for that round.
 * Filter fill is occupied slots over `bucketCount × slotsPerBucket` of the catalog's format.
 */

import { renderStatusPage, type StatusPage } from "../../http/StatusPage.js"

const BODY = `
<section>
<h2>Relay</h2>
<dl id="identity">
  <dt>DC</dt><dd id="dc-name">—</dd>
  <dt>DC id</dt><dd id="dc-id" class="mono">—</dd>
  <dt>Relay incarnation</dt><dd id="incarnation" class="mono">—</dd>
  <dt>Health</dt><dd id="health">—</dd>
  <dt>Discovery</dt><dd id="discovery">—</dd>
  <dt>Endpoints</dt><dd id="endpoint-counts">—</dd>
  <dt>Sources live / expected</dt><dd id="source-counts">—</dd>
  <dt>Catalog revision</dt><dd id="catalog-revision">—</dd>
</dl>
</section>

<section>
<h2>Pools</h2>
<table id="pools">
<thead><tr><th>Serving endpoint</th><th>State</th><th>Models</th><th>Roles</th><th>Members</th>
<th>Blocks</th><th>Filter fill</th></tr></thead>
<tbody></tbody>
</table>
</section>

<section>
<h2>Pool activity</h2>
<table id="activity">
<thead><tr><th>Serving endpoint</th><th>Ingest events</th><th>Ingest blocks</th><th>Publications</th>
<th>Sequence</th><th>Pending events</th><th>Malformed / gaps</th><th>Unanchored</th><th>Mailbox</th>
<th>Last error</th></tr></thead>
<tbody></tbody>
</table>
</section>

<section>
<h2>Members</h2>
<table id="members">
<thead><tr><th>Serving endpoint</th><th>Worker</th><th>DP rank</th><th>Device blocks</th><th>Host blocks</th><th>Disk blocks</th><th>Source</th><th>History</th></tr></thead>
<tbody></tbody>
</table>
</section>

<section>
<h2>Sources that are not live</h2>
<table id="recovering">
<thead><tr><th>Serving endpoint</th><th>Worker</th><th>DP rank</th><th>Publisher</th><th>Transport</th>
<th>State</th><th>Since</th><th>History</th><th>Reason</th></tr></thead>
<tbody></tbody>
</table>
</section>

<section>
<h2>Subscribers</h2>
<table id="subscribers">
<thead><tr><th>Stream</th><th>Subscribers</th></tr></thead>
<tbody></tbody>
</table>
</section>
`

// The body of the page's function: `renderStatusPage` opens it with the `kv` helpers in scope.
const SCRIPT = String.raw`
  var previous = null;

  function subscribersOf(metricsText) {
    var out = [];
    if (typeof metricsText !== "string") return null;
    var lines = metricsText.split("\n");
    for (var i = 0; i < lines.length; i++) {
      var m = /^kv_dc_relay_subscribers\{([^}]*)\}\s+(\S+)/.exec(lines[i]);
      if (!m) continue;
      var stream = /stream="([^"]*)"/.exec(m[1]);
      out.push({ stream: stream ? stream[1] : m[1], count: Number(m[2]) });
    }
    return out;
  }

  function perSecond(now, before, seconds) {
    if (before === undefined || seconds <= 0 || now < before) return null;
    return (now - before) / seconds;
  }

  kv.start(async function refresh() {
    var got = await Promise.all([
      kv.api("/v1/health", { ok: [200, 503] }),
      kv.api("/v1/catalog"),
      kv.api("/v1/stats"),
      kv.optional(kv.api("/metrics", { asText: true }))
    ]);
    var health = got[0], catalog = got[1], stats = got[2], metricsText = got[3];
    var at = performance.now();

    $("dc-name").textContent = stats.identity.dcName;
    $("dc-id").textContent = stats.identity.dcId;
    $("incarnation").textContent = stats.identity.relayIncarnation;
    $("health").replaceChildren(
      health.shuttingDown ? kv.state("shutting down", false) : kv.state(health.healthy ? "healthy" : "unhealthy", health.healthy));
    var discovery = health.discovery || {};
    $("discovery").replaceChildren(
      kv.state(discovery.state || "—", discovery.state !== "connecting"),
      " since " + (discovery.since ? new Date(discovery.since).toLocaleString() : "—"));
    $("endpoint-counts").textContent = health.endpointCount + " (" + health.activeEndpointCount + " active, " +
      health.fencedEndpointCount + " fenced)";
    var counts = health.sources;
    var allLive = counts.live === counts.expected;
    var notLive = ["connecting", "recovering", "degraded", "rejected"]
      .filter(function (state) { return counts[state] > 0; })
      .map(function (state) { return counts[state] + " " + state; });
    $("source-counts").replaceChildren(
      kv.state(counts.live + " / " + counts.expected, allLive),
      notLive.length > 0 ? " (" + notLive.join(", ") + ")" : "");
    $("catalog-revision").textContent = catalog.revision;

    var pools = {};
    for (var p = 0; p < catalog.pools.length; p++) {
      var pool = catalog.pools[p];
      pools[kv.endpointText(pool.servingEndpoint)] = pool;
    }
    var seconds = previous ? (at - previous.at) / 1000 : 0;
    var counters = {};
    var poolRows = [], activityRows = [], memberRows = [], recoveringRows = [];

    for (var e = 0; e < stats.endpoints.length; e++) {
      var ep = stats.endpoints[e];
      var key = ep.servingEndpoint;
      var poolOf = pools[key];
      var agg = ep.aggregation, pub = ep.publication;
      var now = { events: ep.ingest.events, blocks: ep.ingest.blocks, publications: pub ? pub.publicationCount : undefined };
      counters[key] = now;
      var before = previous ? previous.counters[key] : undefined;
      var rates = {
        events: before ? perSecond(now.events, before.events, seconds) : null,
        blocks: before ? perSecond(now.blocks, before.blocks, seconds) : null,
        publications: before && now.publications !== undefined ? perSecond(now.publications, before.publications, seconds) : null
      };
      var fill = null, fillCell;
      if (poolOf && agg) {
        var format = poolOf.producer.format;
        fill = agg.occupiedSlotCount / (Number(format.bucketCount) * Number(format.slotsPerBucket));
        fillCell = el("td", { class: "num fill" }, [
          el("meter", { min: 0, max: 1, value: Number.isFinite(fill) ? fill : 0, title: agg.occupiedSlotCount + " slots" }),
          " " + kv.pct(fill)
        ]);
      } else {
        fillCell = td("—", "num fill");
      }
      var models = poolOf
        ? poolOf.registrations.map(function (r) { return r.model; }).join(", ")
        : ep.models.join(", ");
      var roles = poolOf ? poolOf.poolRoles.join(", ") : ep.roles.join(", ");
      var recovering = ep.sources.filter(function (s) { return s.state !== "live"; });
      poolRows.push(el("tr", { "data-endpoint": key }, [
        td(key, "mono endpoint"),
        el("td", { class: "lifecycle" }, [kv.state(ep.lifecycle, ep.lifecycle === "active")]),
        td(models || "—"),
        td(roles || "—"),
        num(agg ? agg.members.length : null),
        el("td", { class: "num blocks", text: agg ? kv.int(agg.uniqueBlockCount) : "—" }),
        fillCell
      ]));
      // Rates and publication in a table of their own: one row of both was wider than a laptop.
      activityRows.push(el("tr", { "data-endpoint": key }, [
        td(key, "mono endpoint"),
        el("td", { class: "num events-rate", text: kv.rate(rates.events) }),
        el("td", { class: "num blocks-rate", text: kv.rate(rates.blocks) }),
        el("td", { class: "num publications-rate", text: kv.rate(rates.publications) }),
        el("td", { class: "num sequence", text: pub ? kv.int(pub.sequence) : "—" }),
        num(pub ? kv.int(pub.pendingEvents) : null),
        num(kv.int(ep.ingest.malformed) + " / " + kv.int(ep.ingest.gaps)),
        el("td", { class: "num unanchored", text: kv.int(ep.ingest.unanchored) }),
        num(ep.actor ? ep.actor.mailboxDepth + " / " + ep.actor.mailboxCapacity : null),
        td(ep.actor && ep.actor.lastError ? ep.actor.lastError : "—")
      ]));
      var states = {};
      for (var s = 0; s < ep.sources.length; s++) {
        var source = ep.sources[s];
        states[source.workerId + "/" + source.dpRank] = source;
      }
      var members = agg ? agg.members : [];
      for (var m = 0; m < members.length; m++) {
        var member = members[m];
        var memberSource = states[member.workerId + "/" + member.dpRank];
        var sourceState = memberSource ? memberSource.state : null;
        memberRows.push(el("tr", { "data-endpoint": key, "data-worker": member.workerId, "data-rank": member.dpRank }, [
          td(key, "mono"),
          td(member.workerId, "mono worker"),
          num(member.dpRank),
          el("td", { class: "num blocks", text: kv.int(member.blocks) }),
          el("td", { class: "num host-blocks", text: kv.int(member.hostBlocks) }),
          el("td", { class: "num disk-blocks", text: kv.int(member.diskBlocks) }),
          el("td", { class: "source" }, [sourceState ? kv.state(sourceState, sourceState === "live") : "—"]),
          el("td", { class: "history" }, [
            memberSource ? kv.state(memberSource.history, memberSource.history === "complete") : "—"
          ])
        ]));
      }
      for (var r = 0; r < recovering.length; r++) {
        var rs = recovering[r];
        recoveringRows.push(el("tr", { "data-endpoint": key, "data-worker": rs.workerId, "data-rank": rs.dpRank }, [
          td(key, "mono"), td(rs.workerId, "mono"), num(rs.dpRank), td(rs.publisherId, "mono"),
          td(rs.transportEndpoint, "mono transport"),
          el("td", { class: "state" }, [kv.state(rs.state, false)]),
          td(new Date(rs.since).toLocaleString(), "since"),
          el("td", { class: "history" }, [kv.state(rs.history, rs.history === "complete")]),
          td(rs.reason || "—", "reason")
        ]));
      }
    }
    kv.rows($("pools").tBodies[0], poolRows, "no pools");
    kv.rows($("activity").tBodies[0], activityRows, "no pools");
    kv.rows($("members").tBodies[0], memberRows, "no members");
    // Every source is live only when the live ones are all the expected ones (PROTOCOL §5 ◆3).
    kv.rows($("recovering").tBodies[0], recoveringRows,
      counts.expected === 0
        ? "no sources expected"
        : allLive
          ? "none: every source is live"
          : (counts.expected - counts.live) + " of " + counts.expected + " not live (changing state)");

    var subscribers = subscribersOf(metricsText);
    kv.rows($("subscribers").tBodies[0],
      (subscribers || []).map(function (x) {
        return el("tr", { "data-stream": x.stream }, [td(x.stream), el("td", { class: "num count", text: kv.int(x.count) })]);
      }),
      subscribers === null ? "not available (/metrics did not answer)" : "none");

    previous = { at: at, counters: counters };
  });
`

/** The page, rendered once: it holds no data, the script fetches everything. */
export const RELAY_STATUS_PAGE: StatusPage = renderStatusPage({
  title: "kvrelay relay",
  heading: "kvrelay relay",
  body: BODY,
  script: SCRIPT
})
