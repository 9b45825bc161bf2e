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
function ago(t) {
  if (!t) return "-";
  const s = Math.round((Date.now() - new Date(t)) / 1000);
  return s < 60 ? `${s}s ago` : s < 3600 ? `${Math.round(s / 60)}m ago` : `${Math.round(s / 3600)}h ago`;
}

// How a GPU's workload pair was verified; "simulated" and "unverified" are marked, never plain.
const VERIFIED = {
  gpu_memory: "NIC DMA, GPU memory", host_memory: "NIC DMA, host memory only",
  simulated: "simulated fabric", unproven: "unverified: no NIC exercised", unprobed: "unverified: not probed",
};
function verified(v) {
  const cls = v === "simulated" ? "mark sim" : (v === "unproven" || v === "unprobed") ? "mark unverified" : "mark";
  return `<span class="${cls}" data-verification="${esc(v)}">${esc(VERIFIED[v] || v)}</span>`;
}

async function fleet() {
  crumbs.innerHTML = "";
  const f = await api("/api/v1/fleet");
  const t = f.totals;
  let h = `<h1>Fleet</h1><div class="cards">
    <div class="card"><div class="n">${t.gpus}</div>GPUs</div>
    ${["corrupting", "at_risk", "watch", "ok"].map(s => `<div class="card"><div class="n" id="total-${s}">${t[s]}</div>${badge(s)}</div>`).join("")}
    <div class="card"><div class="n" id="total-unverified">${t.unverified}</div><span class="mark unverified">unverified</span></div>
  </div>
  <table id="nodes"><tr><th>node</th><th>worst</th><th>GPUs</th><th>corrupting</th><th>at risk</th><th>watch</th><th>ok</th><th>unverified</th><th>last seen</th></tr>`;
  for (const n of f.nodes) {
    const c = n.status_counts;
    h += `<tr data-node="${esc(n.node)}"><td><a href="#/node/${encodeURIComponent(n.node)}">${esc(n.node)}</a></td><td>${badge(n.worst)}</td>
      <td>${n.gpus}</td><td>${c.corrupting}</td><td>${c.at_risk}</td><td>${c.watch}</td><td>${c.ok}</td><td>${c.unverified}</td><td>${ago(n.last_seen)}</td></tr>`;
  }
  h += `</table><h2>Changes in the last hour</h2>`;
  h += f.changes_last_hour.length === 0 ? `<p class="muted">none</p>` :
    `<table><tr><th>when</th><th>node</th><th>GPU</th><th>from</th><th>to</th><th>why</th></tr>${f.changes_last_hour.slice(0, 50).map(c =>
      `<tr><td>${ago(c.at)}</td><td><a href="#/node/${encodeURIComponent(c.node)}">${esc(c.node)}</a></td><td>GPU${c.gpu}</td><td>${c.from ? badge(c.from) : "-"}</td><td>${badge(c.to)}</td><td>${esc(c.reasons[0] || "")}</td></tr>`).join("")}</table>`;
  view.innerHTML = h;
}

async function node(name) {
  crumbs.innerHTML = `/ <a href="#/node/${encodeURIComponent(name)}">${esc(name)}</a>`;
  const n = await api(`/api/v1/nodes/${encodeURIComponent(name)}`);
  const topo = n.topology || { gpus: [], nics: [], paths: [], host: {} };
  const status = Object.fromEntries(n.gpus.map(g => [g.gpu, g]));
  const latest = {};
  for (const p of n.pairs) latest[`${p.gpu}/${p.nic}`] = p;
  const cls = {};
  for (const p of topo.paths) cls[`${p.a}/${p.b}`] = p.class.toUpperCase();
  const h = topo.host || {};
  let out = `<h1>${esc(name)}</h1>
    <p class="muted">virtualized: ${esc(h.virtualized)} (${esc(h.hypervisor || "-")}) · vIOMMU: ${esc(h.viommu)} · GPUDirect: ${esc(h.gpudirect)} · spool drops: ${n.node.spool_dropped_total} · last seen ${ago(n.node.last_seen)}</p>
    ${(topo.warnings || []).map(w => `<p class="warning">${esc(w)}</p>`).join("")}
    <h2>GPU × NIC: path class and latest verdict</h2>
    <table class="matrix" id="matrix"><tr><th></th>${topo.nics.map(x => `<th>${esc(x.name)}</th>`).join("")}<th>status</th></tr>`;
  const gpuIdx = topo.gpus.length ? topo.gpus.map(g => g.index) : n.gpus.map(g => g.gpu);
  for (const g of gpuIdx) {
    const st = status[g] || {};
    out += `<tr data-gpu="${g}"><th><a href="#/node/${encodeURIComponent(name)}/gpu/${g}">GPU${g}</a></th>`;
    for (const x of topo.nics) {
      const p = latest[`${g}/${x.name}`];
      const v = p ? (p.latest === "ok" ? "v-ok" : "v-bad") : "v-none";
      const wl = st.workload_nic === x.name ? " workload" : "";
      const title = p ? `${p.latest} (${p.window.ok} ok / ${p.window.bad} bad in the window)` : "not probed in the last day";
      out += `<td class="${v}${wl}" title="${esc(title)}">${esc(cls[`GPU${g}/${x.name}`] || "")}${p && p.latest !== "ok" ? " ✗" : ""}</td>`;
    }
    out += `<td>${badge(st.status)}</td></tr>`;
  }
  out += `</table><p class="muted">outlined: the NIC the GPU's workload uses (predicted or pinned) · green: latest probe verified · red: latest probe failed</p><h2>Per GPU</h2>`;
  out += `<table id="gpus"><tr><th>GPU</th><th>status</th><th>verified by</th><th>uses</th><th>evidence</th><th>recommendation</th></tr>`;
  for (const g of n.gpus) {
    out += `<tr data-gpu="${g.gpu}" data-status="${esc(g.status)}"><td><a href="#/node/${encodeURIComponent(name)}/gpu/${g.gpu}">GPU${g.gpu}</a></td><td>${badge(g.status)}</td>
      <td>${verified(g.verification)}</td><td>${esc(g.workload_nic || "-")}</td><td><ul class="reasons">${g.reasons.slice(0, 3).map(r => `<li>${esc(r)}</li>`).join("")}</ul></td>
      <td>${g.recommendation ? `<span class="pin">${esc(g.recommendation)}</span>` : "-"}</td></tr>`;
  }
  view.innerHTML = out + "</table>";
}

async function gpu(name, idx) {
  // The index comes from the URL: only digits ever reach the page or the API.
  if (!/^[0-9]{1,5}$/.test(idx)) throw new Error(`not a GPU index: ${idx}`);
  crumbs.innerHTML = `/ <a href="#/node/${encodeURIComponent(name)}">${esc(name)}</a> / <a href="#/node/${encodeURIComponent(name)}/gpu/${encodeURIComponent(idx)}">GPU${esc(idx)}</a>`;
  const [g, hist] = await Promise.all([
    api(`/api/v1/nodes/${encodeURIComponent(name)}/gpus/${idx}`),
    api(`/api/v1/nodes/${encodeURIComponent(name)}/gpus/${idx}/history?since=1d&limit=300`),
  ]);
  const s = g.status;
  let out = `<h1>${esc(name)} · GPU${esc(idx)} ${badge(s.status)} ${verified(s.verification)}</h1>
    <p>since ${esc(s.since)} · workload NIC: <b>${esc(s.workload_nic || "-")}</b> · structural risk: ${esc(s.structural_risk || "unknown")}</p>
    ${s.recommendation ? `<p>Recommendation: <span class="pin" id="pin">${esc(s.recommendation)}</span></p>` : ""}
    <h2>Evidence</h2><ol class="reasons" id="evidence">${s.reasons.map(r => `<li>${esc(r)}</li>`).join("")}</ol>
    <h2>Probe verdicts (last day, oldest → newest)</h2><div class="timeline" id="timeline">${hist.probes.filter(p => p.injected === "none").reverse().map(p =>
      `<div class="tick ${p.verdict === "ok" ? "ok" : "bad"}${p.path === "simulated" ? " sim" : p.path === "host_copy" ? " unproven" : ""}" title="${esc(`${p.at} ${p.nic} ${p.transport} via ${p.path} (${p.memory} memory${p.lanes.length ? `, lanes ${p.lanes.join(", ")}` : ""}) ${p.verdict} ${p.diagnosis}`)}"></div>`).join("") || '<span class="muted">no probes</span>'}</div>
    <p class="muted">hatched: simulated fabric · faded: exercised no NIC (unproven)</p>
    ${hist.probes.some(p => p.injected !== "none") ? `<h2>Self-test history (injected faults, not evidence)</h2><table id="selftest"><tr><th>when</th><th>NIC</th><th>injected</th><th>verdict</th></tr>${hist.probes.filter(p => p.injected !== "none").slice(0, 50).map(p =>
      `<tr><td>${ago(p.at)}</td><td>${esc(p.nic)}</td><td>${esc(p.injected)}</td><td>${esc(p.verdict)} / ${esc(p.diagnosis)}</td></tr>`).join("")}</table>` : ""}
    <h2>Pairs</h2><table><tr><th>NIC</th><th>latest</th><th>diagnosis</th><th>ok / bad in window</th></tr>${g.pairs.map(p =>
      `<tr><td>${esc(p.nic)}</td><td>${esc(p.latest)}</td><td>${esc(p.latest_diagnosis)}</td><td>${p.window.ok} / ${p.window.bad}</td></tr>`).join("")}</table>
    <h2>In-line verification (the workload's own transfers, in the window)</h2>${g.inline.length ? `<table id="inline"><tr><th>NIC</th><th>verified</th><th>through the NIC / into GPU memory</th><th>wrong bytes</th><th>NIXL errors</th><th>latest failures</th></tr>${g.inline.map(i =>
      `<tr class="${i.mismatch ? "bad" : ""}"><td>${esc(i.nic || "unattributed")}</td><td>${i.ok}</td><td>${i.ok_nic} / ${i.ok_gpu_memory}</td><td>${i.mismatch}</td><td>${i.error}</td><td>${i.failures.slice(0, 5).map(f =>
        esc(`${f.request}${f.remote ? ` from ${f.remote}` : ""}: ${f.mismatch ? `${f.bad_blocks} of ${f.blocks} blocks differ` : (f.error || "error")}`)).join("<br>")}</td></tr>`).join("")}</table>
      <p class="muted">${esc(g.inline[0].attribution)}</p>` : '<p class="muted">no in-line results (docs/inline-verification.md)</p>'}
    <h2>Signals</h2>${hist.signals.length ? `<table><tr><th>when</th><th>kind</th><th>summary</th></tr>${hist.signals.slice(0, 50).map(e =>
      `<tr><td>${ago(e.at)}</td><td>${esc(e.kind)}</td><td>${esc(e.summary)}</td></tr>`).join("")}</table>` : '<p class="muted">none</p>'}
    <h2>Status changes</h2>${hist.status_changes.length ? `<table><tr><th>when</th><th>from</th><th>to</th></tr>${hist.status_changes.map(c =>
      `<tr><td>${ago(c.at)}</td><td>${c.from ? badge(c.from) : "-"}</td><td>${badge(c.to)}</td></tr>`).join("")}</table>` : '<p class="muted">none</p>'}`;
  view.innerHTML = out;
}

async function render() {
  const parts = location.hash.replace(/^#\/?/, "").split("/").map(decodeURIComponent);
  try {
    if (parts[0] === "node" && parts[2] === "gpu") await gpu(parts[1], parts[3]);
    else if (parts[0] === "node" && parts[1]) await node(parts[1]);
    else await fleet();
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
