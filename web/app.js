// railguard dashboard: fleet → node → GPU, from the collector's read-only API. No external
// fetches; refreshes every 5 s without reloading the page.
"use strict";
const view = document.getElementById("view");
const crumbs = document.getElementById("crumbs");
const live = document.getElementById("live");
const token = new URLSearchParams(location.search).get("token");

function esc(s) {
  return String(s ?? "").replace(/[&<>"']/g, c => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c]));
}
function badge(s) { return `<span class="badge s-${esc(s || "unknown")}" data-status="${esc(s)}">${esc((s || "unknown").replace("_", " "))}</span>`; }
async function api(path) {
  const r = await fetch(path, { headers: token ? { Authorization: "Bearer " + token } : {} });
  if (!r.ok) throw new Error(`${path}: ${r.status} ${(await r.json().catch(() => ({}))).error || ""}`);
  return r.json();
}
function plural(n, one, many) { return `${n} ${n === 1 ? one : many}`; }
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
  return lag == null ? "" : ` · <span class="replica-lag" data-replica-lag="${Math.round(lag)}">read from a replica ${Math.round(lag)} s behind its primary</span>`;
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

// The fleet view's filters live in the URL (#/?q=&status=&nic=&at=), so a view can be shared.
function fleetQuery() {
  const i = location.hash.indexOf("?");
  return new URLSearchParams(i < 0 ? "" : location.hash.slice(i + 1));
}
function setFleetQuery(q) {
  const s = q.toString();
  location.hash = s ? `#/?${s}` : "#/";
}
const STATUSES = ["corrupting", "at_risk", "unknown", "watch", "ok"];
const FILTERS = [["q", "f-q"], ["status", "f-status"], ["nic", "f-nic"], ["hv", "f-hv"], ["model", "f-model"]];

function filtersBar(q) {
  const sel = (v) => (q.get("status") || "") === v ? " selected" : "";
  const at = q.get("at");
  const local = at && !isNaN(new Date(at)) ? new Date(new Date(at) - new Date().getTimezoneOffset() * 60000).toISOString().slice(0, 16) : "";
  return `<form id="filters" class="filters" autocomplete="off">
    <input id="f-q" name="q" placeholder="node contains…" value="${esc(q.get("q") || "")}">
    <select id="f-status" name="status"><option value="">any status</option>${STATUSES.concat(["unverified"]).map(s => `<option value="${s}"${sel(s)}>${s.replace("_", " ")}</option>`).join("")}</select>
    <input id="f-nic" name="nic" placeholder="workload NIC" value="${esc(q.get("nic") || "")}">
    <input id="f-hv" name="hv" placeholder="hypervisor (none: bare metal)" value="${esc(q.get("hv") || "")}">
    <input id="f-model" name="model" placeholder="GPU model" value="${esc(q.get("model") || "")}">
    <label>as of <input id="f-at" name="at" type="datetime-local" value="${esc(local)}"></label>
    <button type="button" id="f-now">now</button>
  </form>`;
}

function wireFilters() {
  const form = document.getElementById("filters");
  if (!form || form.dataset.wired) return;
  form.dataset.wired = "1";
  const apply = () => {
    const q = new URLSearchParams();
    for (const [k, id] of FILTERS) {
      const v = document.getElementById(id).value.trim();
      if (v) q.set(k, v);
    }
    const at = document.getElementById("f-at").value;
    if (at && !isNaN(new Date(at))) q.set("at", new Date(at).toISOString());
    setFleetQuery(q);
  };
  form.addEventListener("change", apply);
  form.addEventListener("submit", e => { e.preventDefault(); apply(); });
  document.getElementById("f-now").addEventListener("click", () => { document.getElementById("f-at").value = ""; apply(); });
}

function cellMatches(c, q) {
  const st = q.get("status"), nic = q.get("nic");
  if (st === "unverified" ? !(c.verification === "unproven" || c.verification === "unprobed") : st && c.status !== st) return false;
  if (nic && (c.workload_nic || "") !== nic) return false;
  const hv = (q.get("hv") || "").toLowerCase(), model = (q.get("model") || "").toLowerCase();
  if (hv && !(hv === "none" ? c.hypervisor === "" : c.hypervisor.toLowerCase().includes(hv))) return false;
  if (model && !c.gpu_model.toLowerCase().includes(model)) return false;
  return true;
}

// The failing pairs' common factor, read at most once a minute and kept in between: it reads
// every pair's evidence of the last 15 minutes (at 10,000 nodes about a second of the
// collector's work), where the rest of the page refreshes every 5 s.
const PATTERN_EVERY_MS = 60000;
let patternRead = { at: 0, value: null };
let seriesRead = { at: 0, key: null, value: null };

// The engines whose KV transfers arrived wrong with no GPU or NIC carrying them, and the sources
// (the other end) that sent wrong bytes to several GPUs (the last reads).
let enginesRead = { value: null };
let sourcesRead = { value: null };

// Engine findings over the day: never a GPU's (no status, pin or taint rests on them).
function enginesSection(e) {
  if (!e || !e.engines.length) return "";
  const rows = e.engines.map(x => `<tr data-engine="${esc(x.label)}"><td>${esc(x.label)}</td><td>${x.mismatches}</td><td>${x.by_host_copy} / ${x.misplaced}</td><td>${x.gpus}</td><td>${x.nodes}</td><td>${esc(ago(x.last_at))}</td></tr>`).join("");
  return `<h2>Engines <span class="muted">the day to ${esc(new Date(e.until).toISOString())}</span></h2>
    <p class="muted" id="engines-note">KV blocks that arrived with wrong bytes by a host copy, or holding whole source blocks of another time or place: the serving engine moved or mislaid them, no GPU or NIC did, so no GPU is marked, pinned or tainted for them (<a href="https://github.com/railguard/railguard/blob/main/docs/runbook-alerts.md#railguardenginecorruptskv">runbook</a>).</p>
    <table id="engines"><tr><th>engine</th><th>mismatches</th><th>host copy / misplaced</th><th>GPUs</th><th>nodes</th><th>last</th></tr>${rows}</table>`;
}

// Source findings over the day: the other end of the transfers, never the destinations'.
// Where a source runs: the GPU/NIC pair its own node's agent attested, a link to that GPU; else
// "unattested", with what its manifests claimed (the source's own word).
function sourceEnd(x) {
  const end = x.end || {};
  if (end.attestation === "attested") {
    const gpu = `GPU${esc(end.gpu)}${end.gpu_bdf ? " (" + esc(end.gpu_bdf) + ")" : ""}`;
    return `<a href="#/node/${encodeURIComponent(end.node)}/gpu/${encodeURIComponent(end.gpu)}">${esc(end.node)} ${gpu}</a>` +
      ` through ${end.nic ? esc(end.nic) : "an unattributed NIC"} <span class="mark attested">attested</span>`;
  }
  const why = end.attestation === "disputed" ? `unattested: announced by ${esc(end.announced_by)} nodes` : "unattested";
  const claim = x.claim ? [x.claim.node && `node ${esc(x.claim.node)}`, x.claim.gpu_bdf && `GPU ${esc(x.claim.gpu_bdf)}`, x.claim.nic && `through ${esc(x.claim.nic)}`].filter(Boolean).join(" ") : "";
  return `<span class="mark unverified">${why}</span>${claim ? ` its manifests claim ${claim}` : ""}`;
}

function sourcesSection(e) {
  if (!e || !e.sources.length) return "";
  const rows = e.sources.map(x => `<tr data-source="${esc(x.source)}"><td>${esc(x.source)}${x.simulated ? ' <span class="mark sim">simulated</span>' : ""}</td><td class="source-end">${sourceEnd(x)}</td><td>${x.gpus}</td><td>${x.nodes}</td><td>${x.exclusive_gpus}</td><td>${x.mismatches}</td><td>${esc(ago(x.last_at))}</td></tr>`).join("");
  return `<h2>Sources <span class="muted">the day to ${esc(new Date(e.until).toISOString())}</span></h2>
    <p class="muted" id="sources-note">Sources (by the name the failures give them; where one node's agent attested the GPU and NIC that serve it, that pair) whose KV blocks arrived with wrong bytes on several GPUs through those GPUs' own NICs: the source's GPU or NIC is the common end, so the GPUs that got wrong bytes from it alone are not marked, pinned or tainted (<a href="https://github.com/railguard/railguard/blob/main/docs/runbook-alerts.md#railguardsourcecorruptskv">runbook</a>).</p>
    <table id="sources"><tr><th>source</th><th>where (its node's word)</th><th>GPUs</th><th>nodes</th><th>from it alone</th><th>failed transfers</th><th>last</th></tr>${rows}</table>`;
}

async function fleet() {
  crumbs.innerHTML = "";
  const q = fleetQuery();
  const at = q.get("at");
  // The pattern of the 15 minutes the page shows: now, or up to `at`.
  const patternKey = at || "now";
  const readPattern = patternRead.key !== patternKey || Date.now() - patternRead.at >= PATTERN_EVERY_MS;
  const atDate = at ? new Date(at) : null;
  const patternPath = atDate && !isNaN(atDate)
    ? `/api/v1/patterns?since=${encodeURIComponent(new Date(atDate - 900000).toISOString())}&until=${encodeURIComponent(atDate.toISOString())}`
    : "/api/v1/patterns?since=15m";
  // The fleet's corrupting and at-risk GPUs over the day to `at` (or now), read like the pattern.
  const readSeries = seriesRead.key !== patternKey || Date.now() - seriesRead.at >= PATTERN_EVERY_MS;
  const seriesUntil = atDate && !isNaN(atDate) ? atDate : new Date();
  const seriesPath = `/api/v1/fleet/series?since=${encodeURIComponent(new Date(seriesUntil - 86400000).toISOString())}&until=${encodeURIComponent(seriesUntil.toISOString())}`;
  const enginesPath = `/api/v1/engines?since=${encodeURIComponent(new Date(seriesUntil - 86400000).toISOString())}&until=${encodeURIComponent(seriesUntil.toISOString())}`;
  const sourcesPath = enginesPath.replace("/api/v1/engines", "/api/v1/sources");
  const [f, grid, pat, series, engines, sources] = await Promise.all([
    api("/api/v1/fleet"),
    api(`/api/v1/grid${at ? `?at=${encodeURIComponent(at)}` : ""}`),
    readPattern ? api(patternPath).catch(() => null) : Promise.resolve(patternRead.value),
    readSeries ? api(seriesPath).catch(() => null) : Promise.resolve(seriesRead.value),
    readSeries ? api(enginesPath).catch(() => null) : Promise.resolve(enginesRead.value),
    readSeries ? api(sourcesPath).catch(() => null) : Promise.resolve(sourcesRead.value),
  ]);
  if (readSeries && engines) enginesRead = { value: engines };
  if (readSeries && sources) sourcesRead = { value: sources };
  if (readSeries && series) seriesRead = { at: Date.now(), key: patternKey, value: series };
  // A failed read keeps the last one shown (for the same moment) and tries again in 15 s.
  if (readPattern) {
    patternRead = pat ? { at: Date.now(), key: patternKey, value: pat }
      : { at: Date.now() - PATTERN_EVERY_MS + 15000, key: patternKey, value: patternRead.key === patternKey ? patternRead.value : null };
  }
  // The filter bar is made once per visit, so a refresh never takes the text being typed.
  if (!document.getElementById("filters")) view.innerHTML = `<h1>Fleet</h1>${filtersBar(q)}<div id="fleet-body"></div>`;
  wireFilters();
  // Follow the URL (a shared link, "back to now") in every field not being edited.
  for (const [k, id] of FILTERS) {
    const el = document.getElementById(id);
    if (document.activeElement !== el) el.value = q.get(k) || "";
  }
  const atEl = document.getElementById("f-at");
  if (document.activeElement !== atEl && !at) atEl.value = "";
  // The GPUs the filters and `at` leave: the grid, the cards, the node table and the changes
  // all count these.
  const nq = (q.get("q") || "").toLowerCase();
  const rows = new Map();
  for (const c of grid.cells) {
    if (nq && !c.node.toLowerCase().includes(nq)) continue;
    if (!cellMatches(c, q)) continue;
    if (!rows.has(c.node)) rows.set(c.node, []);
    rows.get(c.node).push(c);
  }
  const t = { gpus: 0, unverified: 0 };
  for (const s of STATUSES) t[s] = 0;
  for (const cs of rows.values()) for (const c of cs) {
    t.gpus += 1;
    t[c.status] = (t[c.status] || 0) + 1;
    if (UNVERIFIED.has(c.verification)) t.unverified += 1;
  }
  const withStatus = (s) => { const n = new URLSearchParams(q); if (s) n.set("status", s); else n.delete("status"); const v = n.toString(); return v ? `#/?${v}` : "#/"; };
  const filtering = ["q", "status", "nic", "hv", "model"].some(k => q.get(k));
  let h = `<div class="cards" id="cards" data-scope="${filtering ? "filtered" : "all"}">
    <a class="card" href="${withStatus("")}"><div class="n" id="total-gpus">${t.gpus}</div>GPUs${filtering ? " shown" : ""}</a>
    ${STATUSES.map(s => `<a class="card" href="${withStatus(s)}"><div class="n" id="total-${s}">${t[s]}</div>${badge(s)}</a>`).join("")}
    <a class="card" href="${withStatus("unverified")}"><div class="n" id="total-unverified">${t.unverified}</div><span class="mark unverified">unverified</span></a>
  </div>`;
  const shown = patternRead.key === patternKey ? patternRead.value : null;
  if (shown && shown.factor) {
    const scope = filtering ? " — across the whole fleet: the pattern finder does not take the filters" : "";
    h += `<p id="pattern" class="pattern" data-confidence="${esc(shown.factor.confidence)}"><b>What the failures share</b> (${esc(shown.factor.confidence)} confidence, the 15 min to ${esc(new Date(shown.until).toISOString())}${scope}): ${esc(shown.factor.summary)}</p>`;
  }
  // Time travel, and how old the data is.
  if (grid.historical) {
    h += `<p id="asof" class="warning">The fleet as it was at ${esc(new Date(grid.at).toISOString())} (from the status history; GPUs first assessed later are absent). <a href="#/">Back to now</a></p>`;
  } else if (grid.assessed_at) {
    const age = Math.max(0, Math.round((Date.now() - new Date(grid.assessed_at)) / 1000));
    const lag = grid.replica_lag_seconds;
    const replica = lag == null ? "" : ` · read from a replica ${Math.round(lag)} s behind its primary`;
    h += `<p id="age" class="${age > 30 ? "warning stale" : "muted"}" data-age="${age}"${lag == null ? "" : ` data-replica-lag="${Math.round(lag)}"`}>data is ${age} s old${age > 30 ? " — the collector is falling behind" : ""}${esc(replica)}</p>`;
  }
  h += enginesSection(enginesRead.value);
  h += sourcesSection(sourcesRead.value);
  const fleetSeries = seriesRead.key === patternKey ? seriesRead.value : null;
  if (fleetSeries) {
    h += `<h2>Corrupting and at-risk GPUs, the day to ${esc(new Date(fleetSeries.until).toISOString())}${filtering ? " (the whole fleet: the filters do not apply)" : ""}</h2><div class="chart" id="chart-fleet"></div>`;
  }
  // The grid: one row per node, one cell per GPU, coloured by status.
  let cells = 0;
  const parts = [];
  for (const [name, cs] of rows) {
    cells += cs.length;
    parts.push(`<div class="grow" data-node="${esc(name)}"><a class="gname" href="#/node/${encodeURIComponent(name)}">${esc(name)}</a>${cs.map(c => {
      const unv = UNVERIFIED.has(c.verification) ? " unverified" : "";
      return `<a class="cell s-${esc(c.status)}${unv}" data-status="${esc(c.status)}" data-gpu="${c.gpu}" href="#/node/${encodeURIComponent(name)}/gpu/${c.gpu}${at ? `?at=${encodeURIComponent(at)}` : ""}" title="${esc(`GPU${c.gpu}${c.gpu_model ? ` (${c.gpu_model})` : ""} ${c.status}${c.workload_nic ? ` via ${c.workload_nic}` : ""}: ${c.reason}`)}">${c.gpu}</a>`;
    }).join("")}</div>`);
  }
  h += `<h2>GPUs <span class="muted" id="grid-count">${plural(cells, "GPU", "GPUs")} on ${plural(rows.size, "node", "nodes")}</span></h2><div id="grid" class="grid">${parts.join("") || '<p class="muted">no GPU matches</p>'}</div>`;
  if (!grid.historical) {
    h += `<h2>Nodes</h2><table id="nodes"><tr><th>node</th><th>worst</th><th>GPUs</th><th>corrupting</th><th>at risk</th><th>unknown</th><th>watch</th><th>ok</th><th>unverified</th><th>last seen</th></tr>`;
    for (const n of f.nodes) {
      if (nq && !n.node.toLowerCase().includes(nq)) continue;
      if (filtering && !rows.has(n.node)) continue;
      const c = n.status_counts;
      h += `<tr data-node="${esc(n.node)}"><td><a href="#/node/${encodeURIComponent(n.node)}">${esc(n.node)}</a></td><td>${badge(n.worst)}</td>
        <td>${n.gpus}</td><td>${c.corrupting}</td><td>${c.at_risk}</td><td>${c.unknown}</td><td>${c.watch}</td><td>${c.ok}</td><td>${c.unverified}</td><td>${ago(n.last_seen)}</td></tr>`;
    }
    // The changes of the GPUs shown, worst first (a GPU turning corrupting above an ok↔watch
    // flap), then newest.
    const visible = (c) => rows.has(c.node) && rows.get(c.node).some(x => x.gpu === c.gpu);
    const rank = (c) => Math.max(SEVERITY[c.to] || 0, SEVERITY[c.from] || 0);
    const changes = f.changes_last_hour.filter(visible).sort((a, b) => rank(b) - rank(a) || new Date(b.at) - new Date(a.at));
    h += `</table><h2>Changes in the last hour</h2>`;
    h += changes.length === 0 ? `<p class="muted" id="changes-none">none</p>` :
      `<table id="changes"><tr><th>when</th><th>node</th><th>GPU</th><th>from</th><th>to</th><th>why</th></tr>${changes.slice(0, 50).map(c =>
        `<tr data-node="${esc(c.node)}" data-to="${esc(c.to)}"><td>${ago(c.at)}</td><td><a href="#/node/${encodeURIComponent(c.node)}">${esc(c.node)}</a></td><td>GPU${c.gpu}</td><td>${c.from ? badge(c.from) : "-"}</td><td>${badge(c.to)}</td><td>${esc(c.reasons[0] || "")}</td></tr>`).join("")}</table>`;
  }
  document.getElementById("fleet-body").innerHTML = h;
  if (fleetSeries) Charts.fleet(document.getElementById("chart-fleet"), fleetSeries.points);
}

// A pin's path change (PIX → PHB), the cost of the move, in words a reader can weigh.
function pinCost(p) {
  if (!p || !p.path_class || !p.from_path_class) return "";
  return `<div class="muted pin-cost" data-from="${esc(p.from_path_class)}" data-to="${esc(p.path_class)}">path ${esc(p.from_path_class.toUpperCase())} → ${esc(p.path_class.toUpperCase())}</div>`;
}

async function node(name) {
  crumbs.innerHTML = `/ <a href="#/node/${encodeURIComponent(name)}">${esc(name)}</a>`;
  const [n, nicSeries] = await Promise.all([
    api(`/api/v1/nodes/${encodeURIComponent(name)}`),
    api(`/api/v1/nodes/${encodeURIComponent(name)}/nics/series?since=1d`).catch(() => null),
  ]);
  const topo = n.topology || { gpus: [], nics: [], paths: [], host: {} };
  const status = Object.fromEntries(n.gpus.map(g => [g.gpu, g]));
  const latest = {};
  for (const p of n.pairs) latest[`${p.gpu}/${p.nic}`] = p;
  const cls = {};
  for (const p of topo.paths) cls[`${p.a}/${p.b}`] = p.class.toUpperCase();
  const h = topo.host || {};
  // How the node's workloads choose their NIC now: pinned (UCX_NET_DEVICES set) or UCX's own.
  const pinnedGpus = n.gpus.filter(g => g.workload_pinned === true).map(g => g.gpu);
  const autoGpus = n.gpus.filter(g => g.workload_pinned === false).map(g => g.gpu);
  const gpuList = (gs) => gs.length === n.gpus.length ? "every GPU" : `GPU${gs.length === 1 ? "" : "s"} ${gs.join(", ")}`;
  const selection = [pinnedGpus.length ? `pinned (UCX_NET_DEVICES set) on ${gpuList(pinnedGpus)}` : "", autoGpus.length ? `UCX auto-selection on ${gpuList(autoGpus)}` : ""].filter(Boolean).join("; ") || "not known (no topology yet)";
  let out = `<h1>${esc(name)}</h1>
    <p class="muted">virtualized: ${esc(h.virtualized)} (${esc(h.hypervisor || "-")}) · vIOMMU: ${esc(h.viommu)} · GPUDirect: ${esc(h.gpudirect)} · spool drops: ${n.node.spool_dropped_total} · last seen ${ago(n.node.last_seen)}${replicaLag(n.replica_lag_seconds)}</p>
    <p id="selection">Workload NIC selection now: ${esc(selection)}</p>
    ${(topo.warnings || []).map(w => `<p class="warning">${esc(w)}</p>`).join("")}
    <h2>GPU × NIC: path class and latest verdict</h2>
    <table class="matrix" id="matrix"><tr><th></th>${topo.nics.map(x => `<th>${esc(x.name)}</th>`).join("")}<th>status</th></tr>`;
  const gpuIdx = topo.gpus.length ? topo.gpus.map(g => g.index) : n.gpus.map(g => g.gpu);
  for (const g of gpuIdx) {
    const st = status[g] || {};
    out += `<tr data-gpu="${g}"><th><a href="#/node/${encodeURIComponent(name)}/gpu/${g}">GPU${g}</a></th>`;
    for (const x of topo.nics) {
      const p = latest[`${g}/${x.name}`];
      // Green only for evidence about the pair: an ok moved without its NIC (a host copy, another
      // device's DMA) verifies nothing of it.
      const v = !p ? "v-none" : p.latest !== "ok" ? "v-bad" : p.window.standing === "unproven" ? "v-unproven" : "v-ok";
      const wl = st.workload_nic === x.name ? " workload" : "";
      const title = !p ? "not probed in the last day"
        : v === "v-unproven" ? `${p.latest}, but moved without this pair's NIC (${p.window.unproven_ok} such in the window): proves nothing of the pair`
        : `${p.latest} (${p.window.ok} ok / ${p.window.bad} bad in the window, ${p.window.standing.replace(/_/g, " ")})`;
      out += `<td class="${v}${wl}" title="${esc(title)}">${esc(cls[`GPU${g}/${x.name}`] || "")}${p && p.latest !== "ok" ? " ✗" : ""}</td>`;
    }
    out += `<td>${badge(st.status)}</td></tr>`;
  }
  out += `</table><p class="muted">outlined: the NIC the GPU's workload uses (predicted or pinned) · green: latest probe verified by the pair's own NIC (or the simulated fabric) · grey: latest probe ok but moved without the pair's NIC (proves nothing of it) · red: latest probe failed</p>`;
  out += `<h2>Failed share of each NIC's probes, per hour (every GPU of the node, the last day)</h2>`;
  out += nicSeries && nicSeries.buckets.length ? `<div class="chart" id="chart-nics"></div>` : '<p class="muted" id="chart-nics-none">no probes</p>';
  out += `<h2>Per GPU</h2>`;
  // A reason several GPUs share (the same words, with each its own GPU and NIC: the node's
  // structural risk, say) is shown once, above the table, and each row points to it.
  const word = (w) => new RegExp(`(?<![A-Za-z0-9_])${w.replace(/[.*+?^${}()|[\]\\]/g, "\\$&")}(?![A-Za-z0-9_])`, "g");
  const template = (g, r) => {
    let t = r.replace(word(`GPU${g.gpu}`), "GPU{gpu}");
    if (g.workload_nic) t = t.replace(word(g.workload_nic), "{nic}");
    return t;
  };
  const sharedBy = new Map();
  for (const g of n.gpus) for (const r of g.reasons) {
    const t = template(g, r);
    if (!sharedBy.has(t)) sharedBy.set(t, []);
    sharedBy.get(t).push(g.gpu);
  }
  const shared = [...sharedBy.entries()].filter(([, gs]) => gs.length > 1);
  const sharedIdx = new Map(shared.map(([t], i) => [t, i + 1]));
  if (shared.length) {
    out += `<ol class="shared" id="shared">${shared.map(([t, gs]) =>
      `<li>GPU${gs.length === n.gpus.length ? "s (all)" : `s ${gs.join(", ")}`}, each with its own workload NIC: ${esc(t.split("GPU{gpu}").join("GPU n").split("{nic}").join("its NIC"))}</li>`).join("")}</ol>`;
  }
  out += `<table id="gpus"><tr><th>GPU</th><th>status</th><th>verified by</th><th>uses</th><th>evidence</th><th>recommendation</th></tr>`;
  for (const g of n.gpus) {
    const items = g.reasons.slice(0, 3).map(r => {
      const i = sharedIdx.get(template(g, r));
      return i ? `<li class="shared-ref">shared reason ${i} (above)</li>` : `<li>${esc(r)}</li>`;
    });
    out += `<tr data-gpu="${g.gpu}" data-status="${esc(g.status)}"><td><a href="#/node/${encodeURIComponent(name)}/gpu/${g.gpu}">GPU${g.gpu}</a></td><td>${badge(g.status)}</td>
      <td>${verified(g.verification)}</td><td>${esc(g.workload_nic || "-")}${g.workload_pinned === true ? ' <span class="muted">pinned</span>' : g.workload_pinned === false ? ' <span class="muted">auto</span>' : ""}</td><td><ul class="reasons">${items.join("")}</ul></td>
      <td>${g.recommendation ? `<span class="pin">${esc(g.recommendation)}</span>${pinCost(g.pin)}` : "-"}</td></tr>`;
  }
  view.innerHTML = out + "</table>";
  if (nicSeries && nicSeries.buckets.length) Charts.nicRates(document.getElementById("chart-nics"), nicSeries.buckets);
}

// One probe row in words: a probe, or an agent's summary of ok probes.
function probeTitle(p) {
  const how = PATHS[p.path] ? ` (${PATHS[p.path]})` : "";
  return (p.summary ? `${p.first_at} – ${p.at}: ${p.probes} ok probes (summarised by the agent)` : `${p.at} ${p.verdict} ${p.diagnosis}`) + how;
}
// What carried a probe's bytes, where it is not the pair's own NIC.
const PATHS = { simulated: "simulated fabric", host_copy: "a host copy: no NIC exercised", other_device: "another device's DMA, not this pair's NIC" };
function pathMark(path) {
  return path === "simulated" ? " sim" : path === "other_device" ? " other" : path === "host_copy" ? " unproven" : "";
}
// A failed in-line transfer in words, with what its bad blocks held when the library told them apart.
function inlineFailure(f) {
  const held = f.diagnosis ? Object.entries(f.diagnosis).filter(([, n]) => n > 0).map(([k, n]) => `${n} ${k}`).join(", ") : "";
  return `${f.request}${f.remote ? ` from ${f.remote}` : ""}: ${f.mismatch ? `${f.bad_blocks} of ${f.blocks} blocks differ${held ? ` (${held})` : ""}` : (f.error || "error")}`;
}

// Each finding with the layer its evidence implicates (a past status has reasons only).
function findingItems(s) {
  if (!s.findings || !s.findings.length) return s.reasons.map(r => `<li>${esc(r)}</li>`).join("");
  return s.findings.map(f => `<li data-layer="${esc(f.layer)}"><span class="layer l-${esc(f.layer)}" title="${esc(LAYERS[f.layer] || f.layer)}">${esc(f.layer)}</span> ${esc(f.reason)}</li>`).join("");
}
const LAYERS = {
  fabric: "the GPU↔NIC DMA path", nic: "the NIC", gpu: "the GPU", host: "the host's configuration (not this GPU's status)",
  engine: "the serving engine (not this GPU's status)", remote: "the other end of the transfer (not this GPU's status)",
  undetermined: "undetermined (at most watch)",
};

async function gpu(name, idx, query) {
  // The index comes from the URL: only digits ever reach the page or the API.
  if (!/^[0-9]{1,5}$/.test(idx)) throw new Error(`not a GPU index: ${idx}`);
  crumbs.innerHTML = `/ <a href="#/node/${encodeURIComponent(name)}">${esc(name)}</a> / <a href="#/node/${encodeURIComponent(name)}/gpu/${encodeURIComponent(idx)}">GPU${esc(idx)}</a>`;
  // Time travel: ?at= shows the day before that time, and the status the GPU had then.
  const atRaw = query.get("at");
  const at = atRaw && !isNaN(new Date(atRaw)) ? new Date(atRaw) : null;
  const range = at ? `since=${encodeURIComponent(new Date(at - 86400000).toISOString())}&until=${encodeURIComponent(at.toISOString())}` : "since=1d";
  const base = `/api/v1/nodes/${encodeURIComponent(name)}/gpus/${idx}`;
  // Thirty days by day, across the storage tiers (rollups, then the live evidence).
  const days = at ? `since=${encodeURIComponent(new Date(at - 30 * 86400000).toISOString())}&until=${encodeURIComponent(at.toISOString())}` : "since=30d";
  const [g, hist, last, month] = await Promise.all([
    api(base),
    api(`${base}/history?${range}&limit=300`),
    // The status it had at that time: its newest change before then, however old.
    at ? api(`${base}/history?since=3650d&until=${encodeURIComponent(at.toISOString())}&limit=1`) : null,
    api(`${base}/history?${days}&bucket=day&limit=300`),
  ]);
  let s = g.status;
  let then = "";
  if (at) {
    const c = last.status_changes[0];
    then = `<p id="asof" class="warning">GPU${esc(idx)} as it was at ${esc(at.toISOString())}: ${c ? `${badge(c.to)} since ${esc(c.at)}` : "not assessed yet"} (from the status history; the probes and signals below are the day before). <a href="#/node/${encodeURIComponent(name)}/gpu/${encodeURIComponent(idx)}">Now</a>: ${badge(s.status)}</p>`;
    if (c) s = { ...s, status: c.to, since: c.at, reasons: c.reasons };
  }
  // Verdicts over time per NIC: one row of ticks per pair, with its failure rate.
  const perNic = new Map();
  for (const p of hist.probes.filter(p => p.injected === "none").slice().reverse()) {
    if (!perNic.has(p.nic)) perNic.set(p.nic, []);
    perNic.get(p.nic).push(p);
  }
  const nicRows = [...perNic.entries()].sort((a, b) => a[0].localeCompare(b[0])).map(([nic, ps]) => {
    // A summary row stands for `probes` ok probes (the agent compacts them; failures come in full).
    const n = p => p.probes || 1;
    const bad = ps.filter(p => p.verdict !== "ok").reduce((a, p) => a + n(p), 0);
    const all = ps.reduce((a, p) => a + n(p), 0);
    return `<tr data-nic="${esc(nic)}"><td>${esc(nic)}${nic === s.workload_nic ? " (workload)" : ""}</td><td class="rate">${Math.round(100 * bad / all)} % of ${all}</td><td><div class="timeline small">${ps.map(p =>
      `<div class="tick nt ${p.verdict === "ok" ? "ok" : "bad"}${p.summary ? " summary" : ""}${pathMark(p.path)}" title="${esc(probeTitle(p))}"></div>`).join("")}</div></td></tr>`;
  }).join("");
  // Per NIC, one cell a day: failed probes that day (red), only ok ones (green).
  const byDay = new Map();
  for (const b of month.hourly.slice().reverse()) {
    if (!byDay.has(b.nic)) byDay.set(b.nic, new Map());
    const d = byDay.get(b.nic);
    const k = b.start.slice(0, 10);
    const c = d.get(k) || { ok: 0, bad: 0, tiers: new Set(), sim: false, unproven: false, other: false };
    c.ok += b.ok; c.bad += b.silent_corruption + b.reported_failure + b.timeout; c.tiers.add(b.tier);
    c.sim ||= b.path === "simulated"; c.unproven ||= b.path === "host_copy"; c.other ||= b.path === "other_device";
    d.set(k, c);
  }
  const dayRows = [...byDay.entries()].sort((a, b) => a[0].localeCompare(b[0])).map(([nic, d]) =>
    `<tr data-nic="${esc(nic)}"><td>${esc(nic)}${nic === s.workload_nic ? " (workload)" : ""}</td><td><div class="timeline small">${[...d.entries()].map(([k, c]) =>
      `<div class="tick day ${c.bad ? "bad" : "ok"}${c.sim ? " sim" : c.other ? " other" : c.unproven ? " unproven" : ""}" title="${esc(`${k} ${nic}: ${c.ok} ok, ${c.bad} failed (${[...c.tiers].join(", ")})${c.other ? "; some moved by another device's DMA" : ""}`)}"></div>`).join("")}</div></td></tr>`).join("");
  // The plots: the workload's NIC first, then the others in name order.
  const natural = (a, b) => a.localeCompare(b, undefined, { numeric: true });
  const evidence = hist.probes.filter(p => p.injected === "none");
  const nicOrder = [...new Set([...evidence.map(p => p.nic), ...g.pairs.map(p => p.nic)])].sort(natural);
  if (s.workload_nic && nicOrder.includes(s.workload_nic)) nicOrder.splice(nicOrder.indexOf(s.workload_nic), 1), nicOrder.unshift(s.workload_nic);
  // The workload's NIC over time, from its own pair's probes: where it changes, a pin was
  // applied or lifted.
  const marks = [];
  let prev = null;
  for (const p of evidence.filter(p => p.selection !== "sweep").slice().sort((a, b) => new Date(a.at) - new Date(b.at))) {
    const k = `${p.selection}/${p.nic}`;
    if (prev !== null && k !== prev) marks.push({ at: p.at, label: p.selection === "pinned" ? `pinned to ${p.nic}` : `auto-selected ${p.nic}` });
    prev = k;
  }
  const until = at || new Date();
  const since = new Date(until - 86400000);
  let out = `<h1>${esc(name)} · GPU${esc(idx)} ${badge(s.status)} ${verified(s.verification)}</h1>${then}
    <p>since ${esc(s.since)} · workload NIC: <b>${esc(s.workload_nic || "-")}</b> · structural risk: ${esc(s.structural_risk || "unknown")}</p>
    <p id="freshness">evidence last changed ${esc(ago(s.changed_at))} · node last assessed ${esc(ago(s.assessed_at))}${replicaLag(g.replica_lag_seconds)}</p>
    ${s.recommendation ? `<p>Recommendation: <span class="pin" id="pin">${esc(s.recommendation)}</span>${pinCost(s.pin)}</p>` : ""}
    <h2>Probe verdicts over the day to ${esc(until.toISOString())}: one row per NIC, the workload's (★) on top</h2>
    ${evidence.length ? `<div class="chart" id="chart-verdicts" data-rows="${esc(nicOrder.join(","))}"></div>` : '<p class="muted" id="chart-verdicts-none">no probes</p>'}
    <h2>Status over the same day, the workload NIC's changes (pins) marked</h2>
    <div class="chart" id="chart-status" data-marks="${esc(marks.map(m => m.label).join(";"))}"></div>
    <h2>Evidence</h2><ol class="reasons" id="evidence">${findingItems(s)}</ol>
    <details id="export"><summary>Evidence for a ticket (Markdown, JSON)</summary>
      <button type="button" id="copy-md">copy Markdown</button> <button type="button" id="copy-json">copy JSON</button>
      <textarea id="evidence-md" readonly rows="10">${esc(evidenceMarkdown(name, idx, g))}</textarea>
      <textarea id="evidence-json" readonly rows="6">${esc(JSON.stringify({ node: name, gpu: Number(idx), status: s, pairs: g.pairs, inline: g.inline }, null, 2))}</textarea>
    </details>
    <h2>Thirty days by day, per NIC (from the pair-hour rollups and the live evidence)</h2>${dayRows ? `<table id="by-day"><tr><th>NIC</th><th>days, oldest → newest</th></tr>${dayRows}</table>` : '<p class="muted">no probes</p>'}
    <p class="muted">hatched: simulated fabric · faded: exercised no NIC (unproven) · dashed: moved by another device's DMA, not the pair's NIC (unproven)</p>
    <h2>Failure rate per NIC (the last day's probes)</h2>${nicRows ? `<table id="per-nic"><tr><th>NIC</th><th>failed</th><th>verdicts, oldest → newest</th></tr>${nicRows}</table>` : '<p class="muted">no probes</p>'}
    ${hist.probes.some(p => p.injected !== "none") ? `<h2>Self-test history (injected faults, not evidence)</h2><table id="selftest"><tr><th>when</th><th>NIC</th><th>injected</th><th>verdict</th></tr>${hist.probes.filter(p => p.injected !== "none").slice(0, 50).map(p =>
      `<tr><td>${ago(p.at)}</td><td>${esc(p.nic)}</td><td>${esc(p.injected)}</td><td>${esc(p.verdict)} / ${esc(p.diagnosis)}</td></tr>`).join("")}</table>` : ""}
    <h2>Pairs</h2><table><tr><th>NIC</th><th>latest</th><th>diagnosis</th><th>ok / bad in window</th></tr>${g.pairs.map(p =>
      `<tr><td>${esc(p.nic)}</td><td>${esc(p.latest)}</td><td>${esc(p.latest_diagnosis)}</td><td>${p.window.ok} / ${p.window.bad}</td></tr>`).join("")}</table>
    <h2>In-line verification (the workload's own transfers, in the window)</h2>${g.inline.length ? `<table id="inline"><tr><th>NIC</th><th>verified</th><th>through the NIC / into GPU memory</th><th>wrong bytes</th><th>NIXL errors</th><th>latest failures</th></tr>${g.inline.map(i =>
      `<tr class="${i.mismatch ? "bad" : ""}"><td>${esc(i.nic || "unattributed")}</td><td>${i.ok}</td><td>${i.ok_nic} / ${i.ok_gpu_memory}</td><td>${i.mismatch}</td><td>${i.error}</td><td>${i.failures.slice(0, 5).map(f => esc(inlineFailure(f))).join("<br>")}</td></tr>`).join("")}</table>
      <p class="muted">${esc(g.inline[0].attribution)}</p>` : '<p class="muted">no in-line results (docs/inline-verification.md)</p>'}
    <h2>Signals</h2>${hist.signals.length ? `<table><tr><th>when</th><th>kind</th><th>summary</th></tr>${hist.signals.slice(0, 50).map(e =>
      `<tr><td>${ago(e.at)}</td><td>${esc(e.kind)}</td><td>${esc(e.summary)}</td></tr>`).join("")}</table>` : '<p class="muted">none</p>'}
    <h2>Status changes</h2>${hist.status_changes.length ? `<table><tr><th>when</th><th>from</th><th>to</th></tr>${hist.status_changes.map(c =>
      `<tr><td>${ago(c.at)}</td><td>${c.from ? badge(c.from) : "-"}</td><td>${badge(c.to)}</td></tr>`).join("")}</table>` : '<p class="muted">none</p>'}`;
  view.innerHTML = out;
  Charts.verdicts(document.getElementById("chart-verdicts"), evidence, nicOrder, since, until);
  const history = hist.status_changes.filter(c => new Date(c.at) >= since && new Date(c.at) <= until);
  Charts.status(document.getElementById("chart-status"), history, s.status, marks, since, until);
  for (const [b, t] of [["copy-md", "evidence-md"], ["copy-json", "evidence-json"]]) {
    document.getElementById(b).addEventListener("click", () => {
      const text = document.getElementById(t).value;
      (navigator.clipboard ? navigator.clipboard.writeText(text) : Promise.reject()).catch(() => document.getElementById(t).select());
    });
  }
}

// A GPU's evidence as Markdown, for a ticket (plain text: nothing here is interpreted).
function evidenceMarkdown(name, idx, g) {
  const s = g.status;
  const lines = [`### railguard: ${name} GPU${idx} is ${s.status}`, "",
    `- since: ${s.since}`, `- workload NIC: ${s.workload_nic || "-"}`, `- verified by: ${s.verification}`,
    `- structural risk: ${s.structural_risk || "unknown"}`];
  if (s.recommendation) lines.push(`- recommendation: \`${s.recommendation}\``);
  lines.push("", "Evidence:", ...s.reasons.map((r, i) => `${i + 1}. ${r}`));
  if (g.pairs.length) lines.push("", "| NIC | latest | ok / bad in window |", "|---|---|---|", ...g.pairs.map(p => `| ${p.nic} | ${p.latest} | ${p.window.ok} / ${p.window.bad} |`));
  if (g.inline.length) lines.push("", "In-line (the workload's own transfers): " + g.inline.map(i => `${i.nic || "?"}: ${i.ok} verified, ${i.mismatch} wrong, ${i.error} errors`).join("; "));
  return lines.join("\n");
}

async function render() {
  const [path, qs] = location.hash.replace(/^#\/?/, "").split("?");
  const parts = path.split("/").map(decodeURIComponent);
  Charts.destroyAll();
  try {
    if (parts[0] === "node" && parts[2] === "gpu") await gpu(parts[1], parts[3], new URLSearchParams(qs || ""));
    else if (parts[0] === "node" && parts[1]) await node(parts[1]);
    else await fleet();
    document.body.dataset.view = parts[0] === "node" ? (parts[2] === "gpu" ? "gpu" : "node") : "fleet";
    live.classList.remove("stale");
    document.body.dataset.ready = "1";
  } catch (e) {
    live.classList.add("stale");
    view.innerHTML = `<p class="error">${esc(e.message)}</p>`;
    document.body.dataset.ready = "1";
  }
}
window.addEventListener("hashchange", render);
render();
setInterval(render, 5000);
