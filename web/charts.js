// railguard dashboard plots, drawn with uPlot (web/vendor/, MIT; shipped with the collector,
// nothing fetched at run time). Every plot has a real time axis. Each chart publishes its plot
// area as data-plot="left,top,width,height" (CSS pixels of the page) so the tests can read the
// pixels a person sees, and its time axis as data-span="from,to" (Unix seconds).
"use strict";
const Charts = (() => {
  const live = [];
  const COLOR = {
    ok: "#2e7d32", silent: "#d32f2f", failed: "#ef6c00", pin: "#1565c0", line: "#424242",
  };
  const PALETTE = ["#1565c0", "#6a1b9a", "#00838f", "#5d4037", "#c2185b", "#283593", "#558b2f", "#4e342e"];
  const SEVERITY = ["ok", "watch", "unknown", "at_risk", "corrupting"];
  const secs = (t) => new Date(t).getTime() / 1000;
  // Times on the axes and in the legend are the browser's; the legend adds UTC.
  const pad = (n) => String(n).padStart(2, "0");
  function whenLabel(u, v) {
    if (v == null) return "-";
    const d = new Date(v * 1000);
    const local = `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ` +
      `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
    return `${local} (UTC ${d.toISOString().slice(11, 19)})`;
  }
  const timeSeries = { label: "time", value: whenLabel };

  function destroyAll() {
    while (live.length) live.pop().destroy();
  }

  // The plots drawn inside `el` (a panel about to be redrawn).
  function destroyIn(el) {
    for (let i = live.length - 1; i >= 0; i--) {
      if (el.contains(live[i].root)) live.splice(i, 1)[0].destroy();
    }
  }

  // `zoom(from, to)` (Dates): called when a person drags across the plot; the plot's own scale
  // is left alone (the page reads the span again and redraws).
  function mount(el, opts, data, zoom) {
    if (!el || typeof uPlot === "undefined") return null;
    const width = Math.max(320, Math.floor(el.clientWidth || 900) - 12);
    // The plot area is laid out when uPlot first draws: published from there.
    const publish = (u) => {
      const r = u.over.getBoundingClientRect();
      el.dataset.plot = [r.left + window.scrollX, r.top + window.scrollY, r.width, r.height].map(Math.round).join(",");
      el.dataset.span = [u.scales.x.min, u.scales.x.max].map(Math.round).join(",");
    };
    const hooks = { ...(opts.hooks || {}), draw: [...((opts.hooks || {}).draw || []), publish] };
    const cursor = { drag: { x: Boolean(zoom), y: false, setScale: false } };
    if (zoom) {
      hooks.setSelect = [(u) => {
        if (u.select.width < 4) return;
        const at = (px) => new Date(u.posToVal(px, "x") * 1000);
        const [from, to] = [at(u.select.left), at(u.select.left + u.select.width)];
        u.setSelect({ left: 0, top: 0, width: 0, height: 0 }, false);
        zoom(from, to);
      }];
    }
    const u = new uPlot({ width, height: 200, cursor, ...opts, hooks }, data, el);
    live.push(u);
    return u;
  }

  // A line that holds its value until the next point (a status, a count).
  const step = (label, color) => ({
    label, stroke: color, width: 2, paths: uPlot.paths.stepped({ align: 1 }), points: { show: false },
  });

  const pointsOnly = (label, color) => ({
    label, stroke: color, fill: color, paths: () => null,
    points: { show: true, size: 9, width: 1, stroke: color, fill: color },
  });

  // Per pair: each probe at its time, one row per NIC (the workload's first, at the top),
  // coloured by verdict. A pair failing every probe reads as a red row.
  function verdicts(el, probes, nics, since, until, zoom) {
    const row = new Map(nics.map((n, i) => [n, nics.length - 1 - i]));
    const ps = probes.filter(p => row.has(p.nic)).slice().sort((a, b) => secs(a.at) - secs(b.at));
    const xs = ps.map(p => secs(p.at));
    const y = (pred) => ps.map(p => (pred(p) ? row.get(p.nic) : null));
    const sim = ps.length && ps.every(p => p.path === "simulated") ? " (simulated fabric)" : "";
    return mount(el, {
      height: Math.max(120, 36 * nics.length + 60),
      scales: {
        x: { time: true, range: () => [secs(since), secs(until)] },
        y: { range: () => [-0.5, nics.length - 0.5] },
      },
      axes: [{}, {
        size: 110, splits: () => nics.map((_, i) => i),
        values: (u, splits) => splits.map(v => {
          const i = nics.length - 1 - v;
          return i === 0 ? `${nics[0]} ★` : (nics[i] || "");
        }),
      }],
      series: [timeSeries, pointsOnly(`ok${sim}`, COLOR.ok), pointsOnly(`silent corruption${sim}`, COLOR.silent),
        pointsOnly(`reported failure or timeout${sim}`, COLOR.failed)],
      legend: { show: true },
    }, [xs, y(p => p.verdict === "ok"), y(p => p.verdict === "silent_corruption"),
      y(p => p.verdict !== "ok" && p.verdict !== "silent_corruption")], zoom);
  }

  // Vertical marks (a pin change) across the plot, labelled at the top.
  function marksHook(marks) {
    return (u) => {
      const { ctx } = u;
      const { top, height } = u.bbox;
      ctx.save();
      ctx.strokeStyle = COLOR.pin;
      ctx.fillStyle = COLOR.pin;
      ctx.lineWidth = 3 * devicePixelRatio;
      ctx.setLineDash([6 * devicePixelRatio, 4 * devicePixelRatio]);
      ctx.font = `${12 * devicePixelRatio}px sans-serif`;
      for (const m of marks) {
        const x = u.valToPos(secs(m.at), "x", true);
        if (!(x >= u.bbox.left && x <= u.bbox.left + u.bbox.width)) continue;
        ctx.beginPath();
        ctx.moveTo(x, top);
        ctx.lineTo(x, top + height);
        ctx.stroke();
        ctx.fillText(m.label, x + 4 * devicePixelRatio, top + 12 * devicePixelRatio);
      }
      ctx.restore();
    };
  }

  // A GPU's status over time (a step per change), with the changes of its workload's NIC (a
  // pin applied or lifted) marked.
  function status(el, changes, current, marks, since, until, zoom) {
    const cs = changes.slice().sort((a, b) => secs(a.at) - secs(b.at));
    const level = (s) => (s == null ? null : SEVERITY.indexOf(s));
    const xs = [secs(since), ...cs.map(c => secs(c.at)), secs(until)];
    const first = cs.length ? level(cs[0].from) : level(current);
    const ys = [first, ...cs.map(c => level(c.to)), cs.length ? level(cs[cs.length - 1].to) : level(current)];
    return mount(el, {
      height: 180,
      scales: {
        x: { time: true, range: () => [secs(since), secs(until)] },
        y: { range: () => [-0.5, SEVERITY.length - 0.5] },
      },
      axes: [{}, {
        size: 110, splits: () => SEVERITY.map((_, i) => i),
        values: (u, splits) => splits.map(v => (SEVERITY[v] || "").replace("_", " ")),
      }],
      series: [timeSeries, step("status", COLOR.line)],
      hooks: { draw: [marksHook(marks)] },
      legend: { show: true },
    }, [xs, ys], zoom);
  }

  // The fleet: GPUs corrupting and at risk over time, from `since` to `until`.
  function fleet(el, points, since, until, zoom) {
    const xs = points.map(p => secs(p.at));
    return mount(el, {
      height: 180,
      scales: {
        x: { time: true, range: () => [secs(since), secs(until)] },
        y: { range: (u, min, max) => [0, Math.max(1, max)] },
      },
      series: [timeSeries,
        step("corrupting GPUs", COLOR.silent), step("at-risk GPUs", COLOR.failed)],
      legend: { show: true },
    }, [xs, points.map(p => p.corrupting), points.map(p => p.at_risk)], zoom);
  }

  // A node's NICs: the share of their probes that failed, per hour (or day).
  function nicRates(el, buckets, since, until) {
    const nics = [...new Set(buckets.map(b => b.nic))].sort((a, b) => a.localeCompare(b, undefined, { numeric: true }));
    const starts = [...new Set(buckets.map(b => secs(b.start)))].sort((a, b) => a - b);
    const at = new Map(buckets.map(b => [`${secs(b.start)}/${b.nic}`, b]));
    const rate = (nic) => starts.map(t => {
      const b = at.get(`${t}/${nic}`);
      return b && b.ok + b.failed ? (100 * b.failed) / (b.ok + b.failed) : null;
    });
    return mount(el, {
      height: 200,
      scales: { x: { time: true, range: () => [secs(since), secs(until)] }, y: { range: () => [0, 100] } },
      axes: [{}, { values: (u, splits) => splits.map(v => `${v} %`) }],
      series: [timeSeries, ...nics.map((n, i) => ({
        label: n, stroke: PALETTE[i % PALETTE.length], width: 2, spanGaps: false, points: { show: true, size: 6 },
      }))],
      legend: { show: true },
    }, [starts, ...nics.map(rate)]);
  }

  return { destroyAll, destroyIn, verdicts, status, fleet, nicRates };
})();
