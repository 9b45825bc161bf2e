// railguard dashboard: fleet → node → GPU, from the collector's read-only API. No external
// fetches; refreshes every 5 s without reloading the page.
//
// Each page reads its data, shapes it (plain values, no markup), and hands a list of panels to
// paint(): one render function per panel, and only a panel whose HTML or plotted data changed
// is redrawn, so an open <details>, a selection or a plot survives a refresh that changed
// nothing of it. Everything from outside goes through esc() (or encodeURIComponent in a URL).
"use strict";
const view = document.getElementById("view");
const crumbs = document.getElementById("crumbs");
const live = document.getElementById("live");
// Where the runbooks are: the collector's `serve --runbook-url` (read once from /api/v1/info),
// this repository's docs/ until it is known.
let runbooks = "https://github.com/railguard/railguard/blob/main/docs/";
let infoRead = null;
const runbook = (anchor) => esc(`${runbooks}runbook-alerts.md#${anchor}`);
const runbookPage = (page) => esc(`${runbooks}${page}`);

function esc(s) {
  const map = { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" };
  return String(s ?? "").replace(/[&<>"']/g, c => map[c]);
}
function badge(s) {
  const name = esc((s || "unknown").replace("_", " "));
  return `<span class="badge s-${esc(s || "unknown")}" data-status="${esc(s)}">${name}</span>`;
}
// A read of the API. The session cookie (HttpOnly: never seen here) goes with it; a 401 means
// the collector wants a sign-in (signIn()), never a token in the URL.
class SignInNeeded extends Error {}
// A busy collector turns a read away with 503 and Retry-After: wait as told (5 s at most) and
// ask again, twice, before the page says so.
const BUSY_TRIES = 3;
const pause = (ms) => new Promise((done) => setTimeout(done, ms));
async function api(path, tries = BUSY_TRIES) {
  const r = await fetch(path, { credentials: "same-origin" });
  if (r.status === 401) throw new SignInNeeded("sign in to read this collector");
  if (r.status === 503 && tries > 1) {
    await pause(Math.min(Number(r.headers.get("Retry-After")) || 1, 5) * 1000);
    return api(path, tries - 1);
  }
  if (!r.ok) throw new Error(`${path}: ${r.status} ${(await r.json().catch(() => ({}))).error || ""}`);
  return r.json();
}
function plural(n, one, many) { return `${n} ${n === 1 ? one : many}`; }
const iso = (t) => new Date(t).toISOString();
const q = (t) => encodeURIComponent(iso(t));
const nodeHref = (name) => `#/node/${encodeURIComponent(name)}`;
const gpuHref = (name, gpu) => `${nodeHref(name)}/gpu/${encodeURIComponent(gpu)}`;
const DAY_MS = 86400000;
// Worst first: how a status change ranks in a list of changes.
const SEVERITY = { corrupting: 4, at_risk: 3, unknown: 2, watch: 1, ok: 0 };

function ago(t) {
  if (!t) return "-";
  const s = Math.round((Date.now() - new Date(t)) / 1000);
  return s < 60 ? `${s}s ago` : s < 3600 ? `${Math.round(s / 60)}m ago` : `${Math.round(s / 3600)}h ago`;
}

// Beside a page's data age: how far the replica it was read from lags its primary (nothing when
// the collector reads the primary).
function replicaLag(lag) {
  if (lag == null) return "";
  const s = Math.round(lag);
  return ` · <span class="replica-lag" data-replica-lag="${s}">read from a replica ${s} s behind its primary</span>`;
}

// How a GPU's workload pair was verified; "simulated" and "unverified" are marked, never plain.
const VERIFIED = {
  gpu_memory: "NIC DMA, GPU memory", host_memory: "NIC DMA, host memory only",
  simulated: "simulated fabric", unproven: "unverified: no NIC exercised", unprobed: "unverified: not probed",
  no_rdma: "unverified: no RDMA NIC in use",
};
const UNVERIFIED = new Set(["unproven", "unprobed", "no_rdma"]);
function verified(v) {
  const cls = v === "simulated" ? "mark sim" : UNVERIFIED.has(v) ? "mark unverified" : "mark";
  return `<span class="${cls}" data-verification="${esc(v)}">${esc(VERIFIED[v] || v)}</span>`;
}

// A table: a header row of plain labels, then rows already made.
function table(id, heads, rows, attrs = "") {
  const idAttr = id ? ` id="${id}"` : "";
  return `<table${idAttr}${attrs}><tr>${heads.map(h => `<th>${h}</th>`).join("")}</tr>${rows.join("")}</table>`;
}
const none = (id, text = "none") => `<p class="muted"${id ? ` id="${id}"` : ""}>${text}</p>`;

// Only what changed is redrawn. `panels`: [{ id, html, data?, draw? }] in page order; a panel
// is redrawn (its plots destroyed, its HTML set, draw(el) called) when its HTML or its data
// differ from what it showed last; a panel no longer listed is removed.
const shown = new WeakMap();
function paint(host, panels) {
  const ids = new Set(panels.map(p => p.id));
  for (const el of [...host.children]) {
    if (!ids.has(el.dataset.panel)) {
      Charts.destroyIn(el);
      el.remove();
    }
  }
  let prev = null;
  for (const p of panels) {
    let el = [...host.children].find(c => c.dataset.panel === p.id);
    if (!el) {
      el = document.createElement("div");
      el.dataset.panel = p.id;
    }
    const next = prev ? prev.nextElementSibling : host.firstElementChild;
    if (next !== el) host.insertBefore(el, next);
    const sig = p.html + "\u0000" + (p.data === undefined ? "" : JSON.stringify(p.data));
    if (shown.get(el) !== sig) {
      Charts.destroyIn(el);
      el.innerHTML = p.html;
      shown.set(el, sig);
      if (p.draw) p.draw(el);
    }
    prev = el;
  }
}

// The page the view shows: a new one starts from an empty view.
let page = null;
function enter(key) {
  if (page === key) return;
  page = key;
  Charts.destroyAll();
  view.innerHTML = "";
}

// ---- The fleet ----

// The fleet view's filters live in the URL (#/?q=&status=&nic=&at=), so a view can be shared.
function fleetQuery() {
  const i = location.hash.indexOf("?");
  return new URLSearchParams(i < 0 ? "" : location.hash.slice(i + 1));
}
function setFleetQuery(query) {
  const s = query.toString();
  location.hash = s ? `#/?${s}` : "#/";
}
const STATUSES = ["corrupting", "at_risk", "unknown", "watch", "ok"];
const FILTERS = [["q", "f-q"], ["status", "f-status"], ["nic", "f-nic"], ["hv", "f-hv"], ["model", "f-model"]];

function filtersBar(query) {
  const sel = (v) => (query.get("status") || "") === v ? " selected" : "";
  const at = query.get("at");
  const offset = new Date().getTimezoneOffset() * 60000;
  const local = at && !isNaN(new Date(at)) ? new Date(new Date(at) - offset).toISOString().slice(0, 16) : "";
  const options = STATUSES.concat(["unverified"])
    .map(s => `<option value="${s}"${sel(s)}>${s.replace("_", " ")}</option>`);
  const input = (id, name, hint) =>
    `<input id="${id}" name="${name}" placeholder="${hint}" value="${esc(query.get(name) || "")}">`;
  return `<form id="filters" class="filters" autocomplete="off">
    ${input("f-q", "q", "node contains…")}
    <select id="f-status" name="status"><option value="">any status</option>${options.join("")}</select>
    ${input("f-nic", "nic", "workload NIC")}
    ${input("f-hv", "hv", "hypervisor (none: bare metal)")}
    ${input("f-model", "model", "GPU model")}
    <label>as of <input id="f-at" name="at" type="datetime-local" value="${esc(local)}"></label>
    <button type="button" id="f-now">now</button>
  </form>`;
}

function wireFilters() {
  const form = document.getElementById("filters");
  if (!form || form.dataset.wired) return;
  form.dataset.wired = "1";
  const apply = () => {
    const query = new URLSearchParams();
    for (const [k, id] of FILTERS) {
      const v = document.getElementById(id).value.trim();
      if (v) query.set(k, v);
    }
    const at = document.getElementById("f-at").value;
    if (at && !isNaN(new Date(at))) query.set("at", new Date(at).toISOString());
    setFleetQuery(query);
  };
  form.addEventListener("change", apply);
  form.addEventListener("submit", e => { e.preventDefault(); apply(); });
  document.getElementById("f-now").addEventListener("click", () => {
    document.getElementById("f-at").value = "";
    apply();
  });
}

// Follow the URL (a shared link, "back to now") in every field not being edited.
function syncFilters(query) {
  for (const [k, id] of FILTERS) {
    const el = document.getElementById(id);
    if (document.activeElement !== el) el.value = query.get(k) || "";
  }
  const atEl = document.getElementById("f-at");
  if (document.activeElement !== atEl && !query.get("at")) atEl.value = "";
}

// The failing pairs' common factor, read at most once a minute and kept in between: it reads
// every pair's evidence of the last 15 minutes (at 10,000 nodes about a second of the
// collector's work), where the rest of the page refreshes every 5 s. The day's series, engines
// and sources are read on the same clock.
const PATTERN_EVERY_MS = 60000;
let patternRead = { at: 0, value: null };
let seriesRead = { at: 0, key: null, value: null };
// The engines whose KV transfers arrived wrong with no GPU or NIC carrying them, and the sources
// (the other end) that sent wrong bytes to several GPUs (the last reads).
let enginesRead = { at: 0, key: null, value: null };
let sourcesRead = { value: null };

// Nodes a page of the grid shows: a refresh reads one page (about half a megabyte), never the
// whole fleet, and the collector counts the fleet for the cards.
const GRID_PAGE_NODES = 250;

// The grid's read: the filters, the time and the page, as the collector takes them.
function gridPath(query) {
  const p = new URLSearchParams();
  for (const k of ["at", "q", "status", "nic", "hv", "model", "after"]) {
    if (query.get(k)) p.set(k, query.get(k));
  }
  p.set("limit", String(GRID_PAGE_NODES));
  return `/api/v1/grid?${p}`;
}

// The slower reads in flight, by path: a refresh while one is still reading waits on it rather
// than asking the collector again.
const slowReads = new Map();
function slowRead(path) {
  if (!slowReads.has(path)) {
    slowReads.set(path, api(path).catch(() => null).finally(() => slowReads.delete(path)));
  }
  return slowReads.get(path);
}
// How long a refresh waits for the slower reads after the grid has come: those in by then are
// drawn with it, later ones when they come (another render), so the fleet's first view never
// waits on the pattern finder or the day's reads of a large fleet.
const SLOW_READ_GRACE_MS = 250;

// The fleet's reads: every 5 s a page of the grid; the slower ones on their own clock, drawn
// when they come.
async function readFleet(query) {
  const at = query.get("at");
  const key = at || "now";
  const atDate = at ? new Date(at) : null;
  const until = atDate && !isNaN(atDate) ? atDate : new Date();
  const day = `since=${q(until - DAY_MS)}&until=${q(until)}`;
  const span = plotSpan(query);
  const spanKey = `${key}|${span.key}|${q(span.since)}|${span.key === "custom" ? q(span.until) : ""}`;
  const patternPath = atDate && !isNaN(atDate)
    ? `/api/v1/patterns?since=${q(atDate - 900000)}&until=${q(atDate)}`
    : "/api/v1/patterns?since=15m";
  const slow = [];
  if (patternRead.key !== key || Date.now() - patternRead.at >= PATTERN_EVERY_MS) {
    // A failed read keeps the last one shown (for the same moment) and tries again in 15 s.
    slow.push(slowRead(patternPath).then(pat => {
      const kept = patternRead.key === key ? patternRead.value : null;
      patternRead = pat ? { at: Date.now(), key, value: pat }
        : { at: Date.now() - PATTERN_EVERY_MS + 15000, key, value: kept };
    }));
  }
  if (seriesRead.key !== spanKey || Date.now() - seriesRead.at >= PATTERN_EVERY_MS) {
    slow.push(slowRead(`/api/v1/fleet/series?since=${q(span.since)}&until=${q(span.until)}`).then(series => {
      if (series) seriesRead = { at: Date.now(), key: spanKey, value: series };
    }));
  }
  if (enginesRead.key !== key || Date.now() - enginesRead.at >= PATTERN_EVERY_MS) {
    slow.push(slowRead(`/api/v1/engines?${day}`).then(engines => {
      if (engines) enginesRead = { at: Date.now(), key, value: engines };
    }));
    slow.push(slowRead(`/api/v1/sources?${day}`).then(sources => {
      if (sources) sourcesRead = { value: sources };
    }));
  }
  const grid = await api(gridPath(query));
  if (slow.length) {
    const all = Promise.all(slow);
    const late = await Promise.race([all.then(() => false), pause(SLOW_READ_GRACE_MS).then(() => true)]);
    if (late) all.then(() => render());
  }
  return {
    grid, at,
    pattern: patternRead.key === key ? patternRead.value : null,
    series: seriesRead.key === spanKey ? seriesRead.value : null,
    span,
    engines: enginesRead.value,
    sources: sourcesRead.value,
  };
}

// The page of GPUs the filters and `at` leave, by node (worst first), and the fleet's totals of
// them: the collector filters, counts and pages; the cards, the grid, the node table and the
// changes all show what it left.
function shapeFleet(d, query) {
  const rows = new Map();
  for (const c of d.grid.cells) {
    if (!rows.has(c.node)) rows.set(c.node, []);
    rows.get(c.node).push(c);
  }
  const filtering = ["q", "status", "nic", "hv", "model"].some(k => query.get(k));
  // The changes worst first (a GPU turning corrupting above an ok↔watch flap), then newest.
  const rank = (c) => Math.max(SEVERITY[c.to] || 0, SEVERITY[c.from] || 0);
  const changes = d.grid.changes_last_hour.slice()
    .sort((a, b) => rank(b) - rank(a) || new Date(b.at) - new Date(a.at));
  return { rows, totals: d.grid.totals, filtering, nodes: d.grid.page_nodes, changes, grid: d.grid };
}

function cardsPanel(s, query) {
  const withStatus = (st) => {
    const n = new URLSearchParams(query);
    n.delete("after");
    if (st) n.set("status", st); else n.delete("status");
    const v = n.toString();
    return v ? `#/?${v}` : "#/";
  };
  const t = s.totals;
  const cards = STATUSES.map(st =>
    `<a class="card" href="${withStatus(st)}"><div class="n" id="total-${st}">${t[st]}</div>${badge(st)}</a>`);
  return `<div class="cards" id="cards" data-scope="${s.filtering ? "filtered" : "all"}">
    <a class="card" href="${withStatus("")}"><div class="n" id="total-gpus">${t.gpus}</div>` +
    `GPUs${s.filtering ? " shown" : ""}</a>
    ${cards.join("")}
    <a class="card" href="${withStatus("unverified")}"><div class="n" id="total-unverified">${t.unverified}</div>` +
    `<span class="mark unverified">unverified</span></a>
  </div>`;
}

function patternPanel(pattern, filtering) {
  if (!pattern || !pattern.factor) return "";
  const scope = filtering ? " — across the whole fleet: the pattern finder does not take the filters" : "";
  const c = esc(pattern.factor.confidence);
  return `<p id="pattern" class="pattern" data-confidence="${c}"><b>What the failures share</b> ` +
    `(${c} confidence, the 15 min to ${esc(iso(pattern.until))}${scope}): ${esc(pattern.factor.summary)}</p>`;
}

// Time travel, and how old the data is.
function agePanel(grid) {
  if (grid.historical) {
    return `<p id="asof" class="warning">The fleet as it was at ${esc(iso(grid.at))} (from the status history; ` +
      `GPUs first assessed later are absent). <a href="#/">Back to now</a></p>`;
  }
  if (!grid.assessed_at) return "";
  const age = Math.max(0, Math.round((Date.now() - new Date(grid.assessed_at)) / 1000));
  const lag = grid.replica_lag_seconds;
  const replica = lag == null ? "" : ` · read from a replica ${Math.round(lag)} s behind its primary`;
  const lagAttr = lag == null ? "" : ` data-replica-lag="${Math.round(lag)}"`;
  const behind = age > 30 ? " — the collector is falling behind" : "";
  return `<p id="age" class="${age > 30 ? "warning stale" : "muted"}" data-age="${age}"${lagAttr}>` +
    `data is ${age} s old${behind}${esc(replica)}</p>`;
}

// Engine findings over the day: never a GPU's (no status, pin or taint rests on them).
function enginesPanel(e) {
  if (!e || !e.engines.length) return "";
  const rows = e.engines.map(x => `<tr data-engine="${esc(x.label)}"><td>${esc(x.label)}</td><td>${x.mismatches}</td>` +
    `<td>${x.by_host_copy} / ${x.misplaced} / ${x.changed_at_source}</td><td>${x.gpus}</td><td>${x.nodes}</td>` +
    `<td>${esc(ago(x.last_at))}</td></tr>`);
  return `<h2>Engines <span class="muted">the day to ${esc(iso(e.until))}</span></h2>
    <p class="muted" id="engines-note">KV blocks that arrived with wrong bytes by a host copy, or holding whole source
    blocks of another time or place, or the source's bytes rearranged after arrival, or blocks the source reused
    before the READ was confirmed: the serving engine moved or mislaid them, no GPU or NIC did, so no GPU is marked,
    pinned or tainted for them (<a href="${runbook("railguardenginecorruptskv")}">runbook</a>).</p>
    ${table("engines", ["engine", "mismatches", "host copy / misplaced / changed at source", "GPUs", "nodes", "last"],
      rows)}`;
}

// Source findings over the day: the other end of the transfers, never the destinations'.
// Where a source runs: the GPU/NIC pair its own node's agent attested, a link to that GPU; else
// "unattested", with what its manifests claimed (the source's own word).
function sourceEnd(x) {
  const end = x.end || {};
  if (end.attestation === "attested") {
    const gpu = `GPU${esc(end.gpu)}${end.gpu_bdf ? " (" + esc(end.gpu_bdf) + ")" : ""}`;
    return `<a href="${gpuHref(end.node, end.gpu)}">${esc(end.node)} ${gpu}</a>` +
      ` through ${end.nic ? esc(end.nic) : "an unattributed NIC"} <span class="mark attested">attested</span>`;
  }
  const why = end.attestation === "disputed" ? `unattested: announced by ${esc(end.announced_by)} nodes` : "unattested";
  const c = x.claim;
  const claim = c
    ? [c.node && `node ${esc(c.node)}`, c.gpu_bdf && `GPU ${esc(c.gpu_bdf)}`, c.nic && `through ${esc(c.nic)}`]
      .filter(Boolean).join(" ")
    : "";
  return `<span class="mark unverified">${why}</span>${claim ? ` its manifests claim ${claim}` : ""}`;
}

function sourcesPanel(e) {
  if (!e || !e.sources.length) return "";
  const rows = e.sources.map(x => {
    const sim = x.simulated ? ' <span class="mark sim">simulated</span>' : "";
    return `<tr data-source="${esc(x.source)}"><td>${esc(x.source)}${sim}</td>` +
      `<td class="source-end">${sourceEnd(x)}</td>` +
      `<td>${x.gpus}</td><td>${x.nodes}</td><td>${x.exclusive_gpus}</td><td>${x.mismatches}</td>` +
      `<td>${esc(ago(x.last_at))}</td></tr>`;
  });
  const heads = ["source", "where (its node's word)", "GPUs", "nodes", "from it alone", "failed transfers", "last"];
  return `<h2>Sources <span class="muted">the day to ${esc(iso(e.until))}</span></h2>
    <p class="muted" id="sources-note">Sources (by the name the failures give them; where one node's agent attested the
    GPU and NIC that serve it, that pair) whose KV blocks arrived with wrong bytes on several GPUs through those GPUs'
    own NICs: the source's GPU or NIC is the common end, so the GPUs that got wrong bytes from it alone are not marked,
    pinned or tainted (<a href="${runbook("railguardsourcecorruptskv")}">runbook</a>).</p>
    ${table("sources", heads, rows)}`;
}

function seriesPanel(series, filtering) {
  if (!series) return "";
  const scope = filtering ? " (the whole fleet: the filters do not apply)" : "";
  return `<h2>Corrupting and at-risk GPUs, ${esc(iso(series.since))} to ${esc(iso(series.until))}${scope}</h2>` +
    `<div class="chart" id="chart-fleet"></div>`;
}

// Where the page is among the nodes the filters leave, and the way to the next page and back to
// the first (the cursor is in the URL: a shared link opens the same page).
function gridPager(s, query) {
  const after = query.get("after");
  if (!s.grid.next && !after) return "";
  const to = (cursor) => {
    const n = new URLSearchParams(query);
    if (cursor) n.set("after", cursor); else n.delete("after");
    return `#/?${n}`;
  };
  const links = [
    after ? `<a id="grid-first" href="${esc(to(null))}">first page</a>` : "",
    s.grid.next ? `<a id="grid-next" href="${esc(to(s.grid.next))}">next ${GRID_PAGE_NODES} nodes</a>` : "",
  ].filter(Boolean).join(" · ");
  return `<p id="grid-page" class="muted">${plural(s.rows.size, "node", "nodes")} on this page, worst first` +
    ` · ${links}</p>`;
}

// The grid: one row per node of the page, one cell per GPU, coloured by status.
function gridPanel(s, at, query) {
  const rows = s.rows;
  const parts = [];
  const atQuery = at ? `?at=${encodeURIComponent(at)}` : "";
  for (const [name, cs] of rows) {
    const gpus = cs.map(c => {
      const unv = UNVERIFIED.has(c.verification) ? " unverified" : "";
      const model = c.gpu_model ? ` (${c.gpu_model})` : "";
      const via = c.workload_nic ? ` via ${c.workload_nic}` : "";
      const title = esc(`GPU${c.gpu}${model} ${c.status}${via}: ${c.reason}`);
      return `<a class="cell s-${esc(c.status)}${unv}" data-status="${esc(c.status)}" data-gpu="${c.gpu}" ` +
        `href="${gpuHref(name, c.gpu)}${atQuery}" title="${title}">${c.gpu}</a>`;
    });
    parts.push(`<div class="grow" data-node="${esc(name)}"><a class="gname" href="${nodeHref(name)}">${esc(name)}</a>` +
      `${gpus.join("")}</div>`);
  }
  const count = `${plural(s.totals.gpus, "GPU", "GPUs")} on ${plural(s.grid.nodes, "node", "nodes")}`;
  return `<h2>GPUs <span class="muted" id="grid-count">${count}</span></h2>${gridPager(s, query)}` +
    `<div id="grid" class="grid">${parts.join("") || '<p class="muted">no GPU matches</p>'}</div>`;
}

function nodesPanel(nodes) {
  const rows = nodes.map(n => {
    const c = n.status_counts;
    return `<tr data-node="${esc(n.node)}"><td><a href="${nodeHref(n.node)}">${esc(n.node)}</a></td>` +
      `<td>${badge(n.worst)}</td>
        <td>${n.gpus}</td><td>${c.corrupting}</td><td>${c.at_risk}</td><td>${c.unknown}</td><td>${c.watch}</td>` +
      `<td>${c.ok}</td><td>${c.unverified}</td><td>${ago(n.last_seen)}</td></tr>`;
  });
  const heads = ["node", "worst", "GPUs", "corrupting", "at risk", "unknown", "watch", "ok", "unverified", "last seen"];
  return `<h2>Nodes</h2>${table("nodes", heads, rows)}`;
}

function changesPanel(changes) {
  if (!changes.length) return `<h2>Changes in the last hour</h2>${none("changes-none")}`;
  const rows = changes.slice(0, 50).map(c =>
    `<tr data-node="${esc(c.node)}" data-to="${esc(c.to)}"><td>${ago(c.at)}</td>` +
    `<td><a href="${nodeHref(c.node)}">${esc(c.node)}</a></td><td>GPU${c.gpu}</td>` +
    `<td>${c.from ? badge(c.from) : "-"}</td><td>${badge(c.to)}</td><td>${esc(c.reasons[0] || "")}</td></tr>`);
  return `<h2>Changes in the last hour</h2>${table("changes", ["when", "node", "GPU", "from", "to", "why"], rows)}`;
}

async function fleet() {
  crumbs.innerHTML = "";
  const query = fleetQuery();
  const d = await readFleet(query);
  enter("fleet");
  // The filter bar is made once per visit, so a refresh never takes the text being typed.
  if (!document.getElementById("filters")) {
    view.innerHTML = `<h1>Fleet</h1>${filtersBar(query)}<div id="fleet-body"></div>`;
  }
  wireFilters();
  syncFilters(query);
  const s = shapeFleet(d, query);
  const panels = [
    { id: "cards", html: cardsPanel(s, query) },
    { id: "pattern", html: patternPanel(d.pattern, s.filtering) },
    { id: "age", html: agePanel(d.grid) },
    { id: "engines", html: enginesPanel(d.engines) },
    { id: "sources", html: sourcesPanel(d.sources) },
    {
      id: "range", html: rangePanel("#/", query, { span: d.span.key, since: d.span.since, until: d.span.until }),
      draw: (el) => wireRange(el, "#/", query),
    },
    {
      id: "series", html: seriesPanel(d.series, s.filtering), data: d.series && d.series.points,
      draw: (el) => d.series && Charts.fleet(el.querySelector("#chart-fleet"), d.series.points,
        new Date(d.series.since), new Date(d.series.until), (from, to) => zoomTo("#/", fleetQuery(), from, to)),
    },
    { id: "grid", html: gridPanel(s, d.at, query) },
  ];
  if (!d.grid.historical) {
    panels.push({ id: "nodes", html: nodesPanel(s.nodes) }, { id: "changes", html: changesPanel(s.changes) });
  }
  paint(document.getElementById("fleet-body"), panels);
}

// ---- A node ----

// A pin's path change (PIX → PHB), the cost of the move, in words a reader can weigh.
function pinCost(p) {
  if (!p || !p.path_class || !p.from_path_class) return "";
  const from = esc(p.from_path_class.toUpperCase()), to = esc(p.path_class.toUpperCase());
  return `<div class="muted pin-cost" data-from="${esc(p.from_path_class)}" data-to="${esc(p.path_class)}">` +
    `path ${from} → ${to}</div>`;
}

// A reason several GPUs share (the same words, with each its own GPU and NIC: the node's
// structural risk, say) is shown once, above the table, and each row points to it.
function sharedReasons(gpus) {
  const escape = (w) => w.replace(/[.*+?^${}()|[\]\\]/g, "\\$&");
  const word = (w) => new RegExp(`(?<![A-Za-z0-9_])${escape(w)}(?![A-Za-z0-9_])`, "g");
  const template = (g, r) => {
    let t = r.replace(word(`GPU${g.gpu}`), "GPU{gpu}");
    if (g.workload_nic) t = t.replace(word(g.workload_nic), "{nic}");
    return t;
  };
  const sharedBy = new Map();
  for (const g of gpus) {
    for (const r of g.reasons) {
      const t = template(g, r);
      if (!sharedBy.has(t)) sharedBy.set(t, []);
      sharedBy.get(t).push(g.gpu);
    }
  }
  const shared = [...sharedBy.entries()].filter(([, gs]) => gs.length > 1);
  const index = new Map(shared.map(([t], i) => [t, i + 1]));
  return { shared, refOf: (g, r) => index.get(template(g, r)) };
}

function nodeHeader(name, n, topo) {
  const h = topo.host || {};
  // How the node's workloads choose their NIC now: pinned (UCX_NET_DEVICES set) or UCX's own.
  const pinned = n.gpus.filter(g => g.workload_pinned === true).map(g => g.gpu);
  const auto = n.gpus.filter(g => g.workload_pinned === false).map(g => g.gpu);
  const list = (gs) => gs.length === n.gpus.length ? "every GPU" : `GPU${gs.length === 1 ? "" : "s"} ${gs.join(", ")}`;
  const selection = [
    pinned.length ? `pinned (UCX_NET_DEVICES set) on ${list(pinned)}` : "",
    auto.length ? `UCX auto-selection on ${list(auto)}` : "",
  ].filter(Boolean).join("; ") || "not known (no topology yet)";
  return `<h1>${esc(name)}</h1>
    <p class="muted">virtualized: ${esc(h.virtualized)} (${esc(h.hypervisor || "-")}) · vIOMMU: ${esc(h.viommu)} · ` +
    `GPUDirect: ${esc(h.gpudirect)} · spool drops: ${n.node.spool_dropped_total} · ` +
    `last seen ${ago(n.node.last_seen)}` +
    `${replicaLag(n.replica_lag_seconds)}</p>
    <p id="selection">Workload NIC selection now: ${esc(selection)}</p>
    ${agentLine(n.node)}
    ${(topo.warnings || []).map(w => `<p class="warning">${esc(w)}</p>`).join("")}`;
}

// What the node's agent said it is doing with its latest batch (its heartbeat too).
function agentLine(node) {
  if (!node.agent_activity) return `<p id="agent-state" class="muted">agent: does not say what it is doing</p>`;
  const cls = node.agent_activity === "degraded" ? "warning" : "muted";
  const words = { probing: "probing", nothing_to_probe: "nothing to probe", passive: "passive", degraded: "degraded" };
  return `<p id="agent-state" class="${cls}" data-activity="${esc(node.agent_activity)}">agent: ` +
    `${esc(words[node.agent_activity] || node.agent_activity)} — ${esc(node.agent_detail)} ` +
    `(${esc(ago(node.agent_state_at))})</p>`;
}

function matrixPanel(name, n, topo) {
  const status = Object.fromEntries(n.gpus.map(g => [g.gpu, g]));
  const latest = {};
  for (const p of n.pairs) latest[`${p.gpu}/${p.nic}`] = p;
  const cls = {};
  for (const p of topo.paths) cls[`${p.a}/${p.b}`] = p.class.toUpperCase();
  const gpuIdx = topo.gpus.length ? topo.gpus.map(g => g.index) : n.gpus.map(g => g.gpu);
  const rows = gpuIdx.map(g => {
    const st = status[g] || {};
    const cells = topo.nics.map(x => {
      const p = latest[`${g}/${x.name}`];
      // Green only for evidence about the pair: an ok moved without its NIC (a host copy,
      // another device's DMA) verifies nothing of it.
      const v = !p ? "v-none" : p.latest !== "ok" ? "v-bad" : p.window.standing === "unproven" ? "v-unproven" : "v-ok";
      const wl = st.workload_nic === x.name ? " workload" : "";
      const title = !p ? "not probed in the last day"
        : v === "v-unproven"
          ? `${p.latest}, but moved without this pair's NIC (${p.window.unproven_ok} such in the window): ` +
            "proves nothing of the pair"
          : `${p.latest} (${p.window.ok} ok / ${p.window.bad} bad in the window, ` +
            `${p.window.standing.replace(/_/g, " ")})`;
      const failed = p && p.latest !== "ok" ? " ✗" : "";
      return `<td class="${v}${wl}" title="${esc(title)}">${esc(cls[`GPU${g}/${x.name}`] || "")}${failed}</td>`;
    });
    return `<tr data-gpu="${g}"><th><a href="${gpuHref(name, g)}">GPU${g}</a></th>${cells.join("")}` +
      `<td>${badge(st.status)}</td></tr>`;
  });
  const heads = ["", ...topo.nics.map(x => esc(x.name)), "status"];
  return `<h2>GPU × NIC: path class and latest verdict</h2>${table("matrix", heads, rows, ' class="matrix"')}
    <p class="muted">outlined: the NIC the GPU's workload uses (predicted or pinned) · green: latest probe verified by
    the pair's own NIC (or the simulated fabric) · grey: latest probe ok but moved without the pair's NIC (proves
    nothing of it) · red: latest probe failed</p>`;
}

function nicChartPanel(nicSeries) {
  const has = nicSeries && nicSeries.buckets.length;
  return `<h2>Failed share of each NIC's probes, per hour (every GPU of the node, the last day or since it
    appeared)</h2>` +
    (has ? `<div class="chart" id="chart-nics"></div>` : '<p class="muted" id="chart-nics-none">no probes</p>');
}

function nodeGpusPanel(name, n) {
  const { shared, refOf } = sharedReasons(n.gpus);
  const all = (gs) => gs.length === n.gpus.length ? "s (all)" : `s ${gs.join(", ")}`;
  const list = shared.map(([t, gs]) => {
    const words = t.split("GPU{gpu}").join("GPU n").split("{nic}").join("its NIC");
    return `<li>GPU${all(gs)}, each with its own workload NIC: ${esc(words)}</li>`;
  });
  const rows = n.gpus.map(g => {
    const items = g.reasons.slice(0, 3).map(r => {
      const i = refOf(g, r);
      return i ? `<li class="shared-ref">shared reason ${i} (above)</li>` : `<li>${esc(r)}</li>`;
    });
    const how = g.workload_pinned === true ? ' <span class="muted">pinned</span>'
      : g.workload_pinned === false ? ' <span class="muted">auto</span>' : "";
    const pin = g.recommendation ? `<span class="pin">${esc(g.recommendation)}</span>${pinCost(g.pin)}` : "-";
    return `<tr data-gpu="${g.gpu}" data-status="${esc(g.status)}">` +
      `<td><a href="${gpuHref(name, g.gpu)}">GPU${g.gpu}</a></td>` +
      `<td>${badge(g.status)}</td>
      <td>${verified(g.verification)}</td><td>${esc(g.workload_nic || "-")}${how}</td>` +
      `<td><ul class="reasons">${items.join("")}</ul></td>
      <td>${pin}</td></tr>`;
  });
  const heads = ["GPU", "status", "verified by", "uses", "evidence", "recommendation"];
  return `<h2>Per GPU</h2>${list.length ? `<ol class="shared" id="shared">${list.join("")}</ol>` : ""}` +
    table("gpus", heads, rows);
}

async function node(name) {
  const [n, nicSeries] = await Promise.all([
    api(`/api/v1/nodes/${encodeURIComponent(name)}`),
    api(`/api/v1/nodes/${encodeURIComponent(name)}/nics/series?since=1d`).catch(() => null),
  ]);
  enter(`node/${name}`);
  crumbs.innerHTML = `/ <a href="${nodeHref(name)}">${esc(name)}</a>`;
  const topo = n.topology || { gpus: [], nics: [], paths: [], host: {} };
  const hasNics = nicSeries && nicSeries.buckets.length;
  // The plot spans the last day, or from the node's first minute when it is younger (and from
  // its first bucket's hour, which may start before that minute).
  const until = new Date();
  const born = new Date(Math.floor(new Date(n.node.first_seen) / 60000) * 60000);
  const first = hasNics ? Math.min(...nicSeries.buckets.map(b => new Date(b.start).getTime())) : Infinity;
  const since = new Date(Math.min(first, Math.max(born.getTime(), until - DAY_MS)));
  paint(view, [
    { id: "header", html: nodeHeader(name, n, topo) },
    { id: "matrix", html: matrixPanel(name, n, topo) },
    {
      id: "nics", html: nicChartPanel(nicSeries), data: hasNics ? [nicSeries.buckets, iso(since)] : null,
      draw: (el) => hasNics && Charts.nicRates(el.querySelector("#chart-nics"), nicSeries.buckets, since, until),
    },
    { id: "gpus", html: nodeGpusPanel(name, n) },
  ]);
}

// ---- A GPU ----

// What carried a probe's bytes, where it is not the pair's own NIC.
const PATHS = {
  simulated: "simulated fabric", host_copy: "a host copy: no NIC exercised",
  other_device: "another device's DMA, not this pair's NIC",
};
function pathMark(path) {
  return path === "simulated" ? " sim" : path === "other_device" ? " other" : path === "host_copy" ? " unproven" : "";
}
// One probe row in words: a probe, or an agent's summary of ok probes.
function probeTitle(p) {
  const how = PATHS[p.path] ? ` (${PATHS[p.path]})` : "";
  const what = p.summary ? `${p.first_at} – ${p.at}: ${p.probes} ok probes (summarised by the agent)`
    : `${p.at} ${p.verdict} ${p.diagnosis}`;
  return what + how;
}
// A failed in-line transfer in words, with what its bad blocks held when the library told them
// apart.
function inlineFailure(f) {
  const held = f.diagnosis
    ? Object.entries(f.diagnosis).filter(([, n]) => n > 0).map(([k, n]) => `${n} ${k}`).join(", ")
    : "";
  const what = f.mismatch
    ? `${f.bad_blocks} of ${f.blocks} blocks differ${held ? ` (${held})` : ""}`
    : (f.error || "error");
  return `${f.request}${f.remote ? ` from ${f.remote}` : ""}: ${what}`;
}

const LAYERS = {
  fabric: "the GPU↔NIC DMA path", nic: "the NIC", gpu: "the GPU",
  host: "the host's configuration (not this GPU's status)",
  engine: "the serving engine (not this GPU's status)", remote: "the other end of the transfer (not this GPU's status)",
  undetermined: "undetermined (at most watch)",
};
// Each finding with the layer its evidence implicates (a past status has reasons only).
function findingItems(s) {
  if (!s.findings || !s.findings.length) return s.reasons.map(r => `<li>${esc(r)}</li>`).join("");
  return s.findings.map(f => `<li data-layer="${esc(f.layer)}"><span class="layer l-${esc(f.layer)}" ` +
    `title="${esc(LAYERS[f.layer] || f.layer)}">${esc(f.layer)}</span> ${esc(f.reason)}</li>`).join("");
}

// The plots' span: `range` (15m … 7d, a day by default) ending now or at the time travelled to
// (?at=), or a custom ?from=&to= that a drag across a plot or the form sets. Kept in the URL,
// so a view can be shared.
const RANGES = { "15m": 15 * 60000, "1h": 3600000, "6h": 6 * 3600000, "24h": DAY_MS, "7d": 7 * DAY_MS };
function plotSpan(query) {
  const date = (k) => {
    const v = query.get(k);
    const t = v ? new Date(v) : null;
    return t && !isNaN(t) ? t : null;
  };
  const [from, to] = [date("from"), date("to")];
  if (from && to && from < to) return { since: from, until: to, key: "custom" };
  const key = RANGES[query.get("range")] ? query.get("range") : "24h";
  const until = date("at") || new Date();
  return { since: new Date(until - RANGES[key]), until, key };
}

// The GPU's reads: the probes and status changes of its plots' span, and (time travel, ?at=)
// the status at that time.
async function readGpu(name, idx, query) {
  const atRaw = query.get("at");
  const at = atRaw && !isNaN(new Date(atRaw)) ? new Date(atRaw) : null;
  const span = plotSpan(query);
  const range = `since=${q(span.since)}&until=${q(span.until)}`;
  const base = `/api/v1/nodes/${encodeURIComponent(name)}/gpus/${idx}`;
  // Thirty days by day, across the storage tiers (rollups, then the live evidence).
  const days = at ? `since=${q(at - 30 * DAY_MS)}&until=${q(at)}` : "since=30d";
  const [g, hist, last, month] = await Promise.all([
    api(base),
    api(`${base}/history?${range}&limit=1000`),
    // The status it had at that time: its newest change before then, however old.
    at ? api(`${base}/history?since=3650d&until=${q(at)}&limit=1`) : null,
    api(`${base}/history?${days}&bucket=day&limit=300`),
  ]);
  let s = g.status;
  const then = at ? (last.status_changes[0] || null) : undefined;
  if (then) s = { ...s, status: then.to, since: then.at, reasons: then.reasons };
  return { g, hist, month, s, now: g.status, at, then, until: span.until, since: span.since, span: span.key };
}

// The range picker of the page at `href` (a GPU's, the fleet's): the spans, a custom from–to,
// and how to zoom. Times are the browser's.
function rangePanel(href, query, d) {
  const link = (k) => {
    const p = new URLSearchParams(query);
    p.delete("from");
    p.delete("to");
    p.set("range", k);
    const on = d.span === k ? ' class="on" aria-current="true"' : "";
    return `<a href="${href}?${esc(p.toString())}" data-range="${k}"${on}>${k}</a>`;
  };
  const local = (t) => {
    const z = new Date(t.getTime() - t.getTimezoneOffset() * 60000);
    return z.toISOString().slice(0, 16);
  };
  const zone = Intl.DateTimeFormat().resolvedOptions().timeZone || "local time";
  // A span ending now moves every refresh: its inputs stay empty, so the form is not redrawn
  // under a person typing in it.
  const custom = d.span === "custom";
  const value = (t) => custom ? ` value="${esc(local(t))}"` : "";
  return `<form id="range" class="range">plots: ${Object.keys(RANGES).map(link).join(" ")}
    <label>from <input type="datetime-local" name="from" required${value(d.since)}></label>
    <label>to <input type="datetime-local" name="to" required${value(d.until)}></label>
    <button type="submit"${custom ? ' class="on"' : ""}>show</button>
    <span class="muted">drag across a plot to zoom · times in ${esc(zone)} (UTC on hover)</span></form>`;
}

// The page at `href` with a custom span from `from` to `to` (Dates), for a zoom or the form.
function zoomTo(href, query, from, to) {
  if (!(from < to)) return;
  const p = new URLSearchParams(query);
  p.delete("range");
  p.set("from", from.toISOString());
  p.set("to", to.toISOString());
  location.hash = `${href}?${p.toString()}`;
}

function wireRange(el, href, query) {
  el.querySelector("#range").addEventListener("submit", (e) => {
    e.preventDefault();
    const f = e.target;
    zoomTo(href, query, new Date(f.from.value), new Date(f.to.value));
  });
}

// Verdicts over time per NIC: one row of ticks per pair, with its failure rate.
function perNicPanel(hist, s) {
  const perNic = new Map();
  for (const p of hist.probes.filter(p => p.injected === "none").slice().reverse()) {
    if (!perNic.has(p.nic)) perNic.set(p.nic, []);
    perNic.get(p.nic).push(p);
  }
  const rows = [...perNic.entries()].sort((a, b) => a[0].localeCompare(b[0])).map(([nic, ps]) => {
    // A summary row stands for `probes` ok probes (the agent compacts them; failures come in full).
    const n = p => p.probes || 1;
    const bad = ps.filter(p => p.verdict !== "ok").reduce((a, p) => a + n(p), 0);
    const all = ps.reduce((a, p) => a + n(p), 0);
    const ticks = ps.map(p => `<div class="tick nt ${p.verdict === "ok" ? "ok" : "bad"}${p.summary ? " summary" : ""}` +
      `${pathMark(p.path)}" title="${esc(probeTitle(p))}"></div>`);
    return `<tr data-nic="${esc(nic)}"><td>${esc(nic)}${nic === s.workload_nic ? " (workload)" : ""}</td>` +
      `<td class="rate">${Math.round(100 * bad / all)} % of ${all}</td>` +
      `<td><div class="timeline small">${ticks.join("")}</div></td></tr>`;
  });
  return `<h2>Failure rate per NIC (the plotted span's probes)</h2>` +
    (rows.length ? table("per-nic", ["NIC", "failed", "verdicts, oldest → newest"], rows) : none("", "no probes"));
}

// Per NIC, one cell a day: failed probes that day (red), only ok ones (green).
function byDayPanel(month, s) {
  const byDay = new Map();
  for (const b of month.hourly.slice().reverse()) {
    if (!byDay.has(b.nic)) byDay.set(b.nic, new Map());
    const d = byDay.get(b.nic);
    const k = b.start.slice(0, 10);
    const c = d.get(k) || { ok: 0, bad: 0, tiers: new Set(), sim: false, unproven: false, other: false };
    c.ok += b.ok;
    c.bad += b.silent_corruption + b.reported_failure + b.timeout;
    c.tiers.add(b.tier);
    c.sim ||= b.path === "simulated";
    c.unproven ||= b.path === "host_copy";
    c.other ||= b.path === "other_device";
    d.set(k, c);
  }
  const rows = [...byDay.entries()].sort((a, b) => a[0].localeCompare(b[0])).map(([nic, d]) => {
    const ticks = [...d.entries()].map(([k, c]) => {
      const mark = c.sim ? " sim" : c.other ? " other" : c.unproven ? " unproven" : "";
      const other = c.other ? "; some moved by another device's DMA" : "";
      const title = `${k} ${nic}: ${c.ok} ok, ${c.bad} failed (${[...c.tiers].join(", ")})${other}`;
      return `<div class="tick day ${c.bad ? "bad" : "ok"}${mark}" title="${esc(title)}"></div>`;
    });
    return `<tr data-nic="${esc(nic)}"><td>${esc(nic)}${nic === s.workload_nic ? " (workload)" : ""}</td>` +
      `<td><div class="timeline small">${ticks.join("")}</div></td></tr>`;
  });
  return `<h2>Thirty days by day, per NIC (from the pair-hour rollups and the live evidence)</h2>` +
    (rows.length ? table("by-day", ["NIC", "days, oldest → newest"], rows) : none("", "no probes")) +
    `<p class="muted">hatched: simulated fabric · faded: exercised no NIC (unproven) · dashed: moved by another
    device's DMA, not the pair's NIC (unproven)</p>`;
}

// The plots' rows: the workload's NIC first, then the others in name order; and the workload's
// NIC over time, from its own pair's probes: where it changes, a pin was applied or lifted.
function shapePlots(d) {
  const natural = (a, b) => a.localeCompare(b, undefined, { numeric: true });
  const evidence = d.hist.probes.filter(p => p.injected === "none");
  const nicOrder = [...new Set([...evidence.map(p => p.nic), ...d.g.pairs.map(p => p.nic)])].sort(natural);
  const wl = d.s.workload_nic;
  if (wl && nicOrder.includes(wl)) {
    nicOrder.splice(nicOrder.indexOf(wl), 1);
    nicOrder.unshift(wl);
  }
  const marks = [];
  let prev = null;
  const own = evidence.filter(p => p.selection !== "sweep").slice().sort((a, b) => new Date(a.at) - new Date(b.at));
  for (const p of own) {
    const k = `${p.selection}/${p.nic}`;
    const label = p.selection === "pinned" ? `pinned to ${p.nic}` : `auto-selected ${p.nic}`;
    if (prev !== null && k !== prev) marks.push({ at: p.at, label });
    prev = k;
  }
  const history = d.hist.status_changes.filter(c => new Date(c.at) >= d.since && new Date(c.at) <= d.until);
  return { evidence, nicOrder, marks, history };
}

function gpuHeader(name, idx, d) {
  const s = d.s;
  let then = "";
  if (d.at) {
    const c = d.then;
    const was = c ? `${badge(c.to)} since ${esc(c.at)}` : "not assessed yet";
    then = `<p id="asof" class="warning">GPU${esc(idx)} as it was at ${esc(iso(d.at))}: ${was} ` +
      `(from the status history; the probes and signals below are the day before). ` +
      `<a href="${gpuHref(name, idx)}">Now</a>: ${badge(d.now.status)}</p>`;
  }
  const pin = s.recommendation
    ? `<p>Recommendation: <span class="pin" id="pin">${esc(s.recommendation)}</span>${pinCost(s.pin)}</p>` : "";
  return `<h1>${esc(name)} · GPU${esc(idx)} ${badge(s.status)} ${verified(s.verification)}</h1>${then}
    <p>since ${esc(s.since)} · workload NIC: <b>${esc(s.workload_nic || "-")}</b> · ` +
    `structural risk: ${esc(s.structural_risk || "unknown")}</p>
    <p id="freshness">evidence last changed ${esc(ago(s.changed_at))} · ` +
    `node last assessed ${esc(ago(s.assessed_at))}` +
    `${replicaLag(d.g.replica_lag_seconds)}</p>
    ${pin}`;
}

// What to do first about a GPU its own hardware path implicates: drain, then pin, then
// confirm (the runbook's order). Nothing for a GPU without a finding on its path.
function firstStepsPanel(name, idx, s) {
  const pin = s.recommendation ? `<code>${esc(s.recommendation)}</code>` : "the NIC the runbook's step 3 finds";
  if (s.status === "corrupting") {
    return `<div id="first-steps" class="first-steps corrupting"><h2>What to do first</h2><ol>
      <li><b>Drain</b>: take this GPU's serving process out of rotation; its KV transfers can return wrong bytes
        while requests succeed.</li>
      <li><b>Pin</b>: restart that process with ${pin}.</li>
      <li><b>Confirm</b> on ${esc(name)}: <code>railguard-agent preflight --gpu ${esc(idx)} --memory gpu</code>.</li>
      </ol><p><a href="${runbookPage("runbook-corrupting-gpu.md")}">runbook: a GPU is corrupting</a></p></div>`;
  }
  if (s.status === "at_risk") {
    return `<div id="first-steps" class="first-steps at_risk"><h2>What to do first</h2><ol>
      <li><b>Pin</b> before it corrupts: restart this GPU's serving process with ${pin}.</li>
      <li><b>Confirm</b> on ${esc(name)}: <code>railguard-agent preflight --gpu ${esc(idx)} --memory gpu</code>.</li>
      </ol><p><a href="${runbook("railguardgpuatrisk")}">runbook: a GPU at risk</a></p></div>`;
  }
  return "";
}

function verdictsPanel(d, plots) {
  const chart = plots.evidence.length
    ? `<div class="chart" id="chart-verdicts" data-rows="${esc(plots.nicOrder.join(","))}"></div>`
    : '<p class="muted" id="chart-verdicts-none">no probes</p>';
  const span = `${esc(iso(d.since))} to ${esc(iso(d.until))}`;
  return `<h2>Probe verdicts from ${span}: one row per NIC, the workload's (★) on top</h2>${chart}`;
}

function statusChartPanel(plots) {
  return `<h2>Status over the same span, the workload NIC's changes (pins) marked</h2>
    <div class="chart" id="chart-status" data-marks="${esc(plots.marks.map(m => m.label).join(";"))}"></div>`;
}

function evidencePanel(name, idx, d) {
  const g = d.g;
  const json = JSON.stringify({ node: name, gpu: Number(idx), status: d.s, pairs: g.pairs, inline: g.inline }, null, 2);
  return `<h2>Evidence</h2><ol class="reasons" id="evidence">${findingItems(d.s)}</ol>
    <details id="export"><summary>Evidence for a ticket (Markdown, JSON)</summary>
      <button type="button" id="copy-md">copy Markdown</button> <button type="button" id="copy-json">copy JSON</button>
      <textarea id="evidence-md" readonly rows="10">${esc(evidenceMarkdown(name, idx, g))}</textarea>
      <textarea id="evidence-json" readonly rows="6">${esc(json)}</textarea>
    </details>`;
}

function wireCopy(el) {
  for (const [b, t] of [["copy-md", "evidence-md"], ["copy-json", "evidence-json"]]) {
    el.querySelector(`#${b}`).addEventListener("click", () => {
      const text = document.getElementById(t).value;
      const copied = navigator.clipboard ? navigator.clipboard.writeText(text) : Promise.reject();
      copied.catch(() => document.getElementById(t).select());
    });
  }
}

function selftestPanel(hist) {
  const injected = hist.probes.filter(p => p.injected !== "none");
  if (!injected.length) return "";
  const rows = injected.slice(0, 50).map(p =>
    `<tr><td>${ago(p.at)}</td><td>${esc(p.nic)}</td><td>${esc(p.injected)}</td>` +
    `<td>${esc(p.verdict)} / ${esc(p.diagnosis)}</td></tr>`);
  return `<h2>Self-test history (injected faults, not evidence)</h2>` +
    table("selftest", ["when", "NIC", "injected", "verdict"], rows);
}

function pairsPanel(g) {
  const rows = g.pairs.map(p =>
    `<tr><td>${esc(p.nic)}</td><td>${esc(p.latest)}</td><td>${esc(p.latest_diagnosis)}</td>` +
    `<td>${p.window.ok} / ${p.window.bad}</td></tr>`);
  return `<h2>Pairs</h2>${table("", ["NIC", "latest", "diagnosis", "ok / bad in window"], rows)}`;
}

// A workload's pod as its agent named it: namespace/name and container from the kubelet, the
// pod's UID (and container ID) from a control group.
function podLabel(p) {
  if (p.source === "kubelet") return `${p.namespace}/${p.name} (${p.container})`;
  return `pod uid ${p.uid}${p.container_id ? ` (${p.container_id.slice(0, 12)})` : ""}`;
}

function inlinePanel(g) {
  const title = "<h2>In-line verification (the workload's own transfers, in the window)</h2>";
  if (!g.inline.length) return title + none("", "no in-line results (docs/inline-verification.md)");
  const rows = g.inline.map(i => {
    const failures = i.failures.slice(0, 5).map(f => esc(inlineFailure(f))).join("<br>");
    const pods = (i.pods || []).map(p => `<span class="pod">${esc(podLabel(p))}</span>`).join("<br>");
    return `<tr class="${i.mismatch ? "bad" : ""}"><td>${esc(i.nic || "unattributed")}</td>` +
      `<td>${pods || "-"}</td><td>${i.ok}</td><td>${i.ok_nic} / ${i.ok_gpu_memory}</td><td>${i.mismatch}</td>` +
      `<td>${i.error}</td><td>${failures}</td></tr>`;
  });
  const heads = ["NIC", "pods", "verified", "through the NIC / into GPU memory", "wrong bytes", "NIXL errors",
    "latest failures"];
  return title + table("inline", heads, rows) + `
      <p class="muted">${esc(g.inline[0].attribution)}</p>`;
}

function signalsPanel(hist) {
  if (!hist.signals.length) return `<h2>Signals</h2>${none("")}`;
  const rows = hist.signals.slice(0, 50).map(e =>
    `<tr><td>${ago(e.at)}</td><td>${esc(e.kind)}</td><td>${esc(e.summary)}</td></tr>`);
  return `<h2>Signals</h2>${table("", ["when", "kind", "summary"], rows)}`;
}

function changesOfGpuPanel(hist) {
  if (!hist.status_changes.length) return `<h2>Status changes</h2>${none("")}`;
  const rows = hist.status_changes.map(c =>
    `<tr><td>${ago(c.at)}</td><td>${c.from ? badge(c.from) : "-"}</td><td>${badge(c.to)}</td></tr>`);
  return `<h2>Status changes</h2>${table("", ["when", "from", "to"], rows)}`;
}

async function gpu(name, idx, query) {
  // The index comes from the URL: only digits ever reach the page or the API.
  if (!/^[0-9]{1,5}$/.test(idx)) throw new Error(`not a GPU index: ${idx}`);
  const d = await readGpu(name, idx, query);
  enter(`gpu/${name}/${idx}/${query.get("at") || ""}`);
  crumbs.innerHTML = `/ <a href="${nodeHref(name)}">${esc(name)}</a> / ` +
    `<a href="${gpuHref(name, idx)}">GPU${esc(idx)}</a>`;
  const plots = shapePlots(d);
  const range = [iso(d.since), iso(d.until)];
  const here = gpuHref(name, idx);
  const zoom = (from, to) => zoomTo(here, query, from, to);
  paint(view, [
    { id: "header", html: gpuHeader(name, idx, d) },
    { id: "first-steps", html: d.at ? "" : firstStepsPanel(name, idx, d.s) },
    { id: "range", html: rangePanel(here, query, d), draw: (el) => wireRange(el, here, query) },
    {
      id: "verdicts", html: verdictsPanel(d, plots), data: [plots.evidence, range],
      draw: (el) =>
        Charts.verdicts(el.querySelector("#chart-verdicts"), plots.evidence, plots.nicOrder, d.since, d.until, zoom),
    },
    {
      id: "status", html: statusChartPanel(plots), data: [plots.history, d.s.status, plots.marks, range],
      draw: (el) => Charts.status(el.querySelector("#chart-status"), plots.history, d.s.status, plots.marks,
        d.since, d.until, zoom),
    },
    { id: "evidence", html: evidencePanel(name, idx, d), draw: wireCopy },
    { id: "by-day", html: byDayPanel(d.month, d.s) },
    { id: "per-nic", html: perNicPanel(d.hist, d.s) },
    { id: "selftest", html: selftestPanel(d.hist) },
    { id: "pairs", html: pairsPanel(d.g) },
    { id: "inline", html: inlinePanel(d.g) },
    { id: "signals", html: signalsPanel(d.hist) },
    { id: "changes", html: changesOfGpuPanel(d.hist) },
  ]);
}

// A GPU's evidence as Markdown, for a ticket (plain text: nothing here is interpreted).
function evidenceMarkdown(name, idx, g) {
  const s = g.status;
  const lines = [`### railguard: ${name} GPU${idx} is ${s.status}`, "",
    `- since: ${s.since}`, `- workload NIC: ${s.workload_nic || "-"}`, `- verified by: ${s.verification}`,
    `- structural risk: ${s.structural_risk || "unknown"}`];
  if (s.recommendation) lines.push(`- recommendation: \`${s.recommendation}\``);
  lines.push("", "Evidence:", ...s.reasons.map((r, i) => `${i + 1}. ${r}`));
  if (g.pairs.length) {
    lines.push("", "| NIC | latest | ok / bad in window |", "|---|---|---|",
      ...g.pairs.map(p => `| ${p.nic} | ${p.latest} | ${p.window.ok} / ${p.window.bad} |`));
  }
  if (g.inline.length) {
    const each = g.inline.map(i => `${i.nic || "?"}: ${i.ok} verified, ${i.mismatch} wrong, ${i.error} errors` +
      ((i.pods || []).length ? ` (${i.pods.map(podLabel).join(", ")})` : ""));
    lines.push("", "In-line (the workload's own transfers): " + each.join("; "));
  }
  return lines.join("\n");
}

// One render at a time. One asked for while another reads (a busy collector's waits can outlast
// the 5 s tick; a click can come meanwhile) runs once after it, never beside it: a collector
// that said it is busy is not asked twice as often. rendered(): settles once none is left.
let rendering = null;
let renderAgain = false;
function render() {
  if (rendering) {
    renderAgain = true;
    return rendering;
  }
  rendering = draw().finally(() => {
    rendering = null;
    if (renderAgain) {
      renderAgain = false;
      render();
    }
  });
  return rendering;
}
function rendered() {
  return rendering ? rendering.then(rendered) : Promise.resolve();
}

async function draw() {
  // What this collector says of itself, once (again after a failed read).
  infoRead ||= api("/api/v1/info").then(i => {
    runbooks = i.runbook_url;
    document.getElementById("signout").hidden = !i.signed_in;
  }).catch(() => { infoRead = null; });
  await infoRead;
  const [path, qs] = location.hash.replace(/^#\/?/, "").split("?");
  const parts = path.split("/").map(decodeURIComponent);
  try {
    if (parts[0] === "node" && parts[2] === "gpu") await gpu(parts[1], parts[3], new URLSearchParams(qs || ""));
    else if (parts[0] === "node" && parts[1]) await node(parts[1]);
    else await fleet();
    document.body.dataset.view = parts[0] === "node" ? (parts[2] === "gpu" ? "gpu" : "node") : "fleet";
    live.classList.remove("stale");
    document.body.dataset.ready = "1";
    // The first view drawn with the collector's data: a user-timing mark a browser's tools show.
    if (!performance.getEntriesByName("railguard-drawn").length) performance.mark("railguard-drawn");
  } catch (e) {
    live.classList.add("stale");
    if (e instanceof SignInNeeded) signIn();
    else {
      enter("error");
      view.innerHTML = `<p class="error">${esc(e.message)}</p>`;
    }
    document.body.dataset.ready = "1";
  }
}

// The collector's API token, exchanged once for a session cookie (POST /signin); the browser
// then comes back to the page it was on, hash and all. A form being typed into is left alone.
function signIn() {
  if (page === "signin") return;
  enter("signin");
  const failed = new URLSearchParams(location.search).get("signin") === "failed";
  view.innerHTML = `<form id="signin" method="post" action="/signin">
    <h2>Sign in</h2>
    <p class="muted">This collector asks for its API token (<code>serve --api-token-file</code>).</p>
    ${failed ? '<p class="error" id="signin-failed">That token was not accepted.</p>' : ""}
    <label>API token <input type="password" name="token" autocomplete="current-password" required></label>
    <input type="hidden" name="next" value="${esc("/" + location.hash)}">
    <button type="submit">Sign in</button>
  </form>`;
}
window.addEventListener("hashchange", render);
render();
setInterval(render, 5000);
