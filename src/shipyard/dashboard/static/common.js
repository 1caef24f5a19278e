// Shared helpers of the dashboard pages. Every string reaches the DOM through
// textContent (el() below), never as HTML: job names, log lines, metric names are shown
// as text whatever they hold.
"use strict";

const SVG_NS = "http://www.w3.org/2000/svg";
const COLORS = ["#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2", "#be185d", "#4d7c0f"];

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") node.className = v;
    else if (k === "href") node.setAttribute("href", safeHref(v));
    else node.setAttribute(k, String(v));
  }
  for (const c of children) {
    if (c === null || c === undefined) continue;
    node.appendChild(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return node;
}

function svg(tag, attrs, text) {
  const node = document.createElementNS(SVG_NS, tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, String(v));
  if (text !== undefined) node.textContent = String(text);
  return node;
}

function safeHref(v) {
  const s = String(v);
  return s.startsWith("/") && !s.startsWith("//") ? s : "#";
}

async function getJSON(url) {
  const resp = await fetch(url, { headers: { Accept: "application/json" } });
  if (!resp.ok) throw new Error(`${url}: HTTP ${resp.status}`);
  return resp.json();
}

function human(n) {
  if (n === null || n === undefined) return "-";
  let v = Number(n);
  for (const unit of ["B", "KiB", "MiB", "GiB"]) {
    if (Math.abs(v) < 1024 || unit === "GiB") return unit === "B" ? `${Math.round(v)} B` : `${v.toFixed(1)} ${unit}`;
    v /= 1024;
  }
  return String(n);
}

function statusCell(status) {
  return el("span", { class: `status status-${String(status).replace(/[^A-Za-z]/g, "")}` }, status);
}

function setChildren(node, ...children) {
  node.replaceChildren(...children.filter((c) => c !== null && c !== undefined));
}

// Axis ticks (issue 41): a "nice" step (1, 2 or 5 times a power of ten) and the range
// widened to whole steps. A range narrower than a tenth of its magnitude is widened to
// that tenth (a 0.02 % wobble of a flat line is not drawn as a spike); opts.zero puts
// zero on the axis (usage: CPU, memory, disk, rates are amounts from nothing); a range
// in [0, 1] (accuracy, a ratio) is never widened past 1 or below 0.
function niceStep(span, count) {
  const raw = span / Math.max(1, count);
  const mag = Math.pow(10, Math.floor(Math.log10(raw)));
  const norm = raw / mag;
  return (norm < 1.5 ? 1 : norm < 3 ? 2 : norm < 7 ? 5 : 10) * mag;
}

function decimalsOf(step) { return Math.max(0, Math.min(12, -Math.floor(Math.log10(step) + 1e-9))); }

function axis(lo, hi, opts) {
  const o = opts || {};
  const dataLo = lo, dataHi = hi;
  if (o.zero) { lo = Math.min(lo, 0); hi = Math.max(hi, 0); }
  const minSpan = 0.1 * Math.max(Math.abs(lo), Math.abs(hi)) || 1;
  if (hi - lo < minSpan) {
    const mid = (lo + hi) / 2;
    [lo, hi] = [mid - minSpan / 2, mid + minSpan / 2];
    if (dataLo >= 0 && lo < 0) [lo, hi] = [0, hi - lo];
    if (dataHi <= 1 && hi > 1 && dataLo >= 0) [lo, hi] = [Math.max(0, lo - (hi - 1)), 1];
  }
  let step = niceStep(hi - lo, o.count || 4);
  if (o.integer) step = Math.max(1, Math.round(step));
  const first = Math.floor(lo / step + 1e-9), last = Math.ceil(hi / step - 1e-9);
  const d = decimalsOf(step);
  const ticks = [];
  for (let k = first; k <= last; k++) ticks.push(Number((k * step).toFixed(d)));
  if (ticks.length < 2) ticks.push(Number(((last + 1) * step).toFixed(d)));
  return { lo: ticks[0], hi: ticks[ticks.length - 1], ticks, decimals: d };
}

// TensorBoard's smoothing: an exponential moving average, debiased so the first points
// are not pulled towards zero; weight 0 leaves the points as they are.
function smoothed(points, weight) {
  if (!weight) return points;
  let last = 0, n = 0;
  return points.map(([x, y]) => {
    last = last * weight + (1 - weight) * y;
    n++;
    return [x, last / (1 - Math.pow(weight, n))];
  });
}

// A line plot: series = [{name, points: [[x, y], ...]}] with ticked axes; opts.unit
// names x's unit ("s" by default), opts.xFormat / opts.yFormat turn a value into its
// label ("12.5 %"), opts.zero puts zero on the y axis, opts.xTicks gives x's ticks,
// opts.smooth (0..0.99) draws each series smoothed over its raw line, faint.
function linePlot(series, opts) {
  const o = opts || {};
  const W = o.width || 480, H = o.height || 200, B = 26;
  if (o.xRange) {  // zoomed in: the points inside the range (and their y range)
    const [a, b] = o.xRange;
    series = series.map((s) => Object.assign({}, s, { points: s.points.filter((p) => p[0] >= a && p[0] <= b) }));
  }
  const all = series.flatMap((s) => s.points);
  const root = svg("svg", { viewBox: `0 0 ${W} ${H}`, width: "100%", role: "img", class: "plot" });
  if (!all.length) return root;
  const xs = all.map((p) => p[0]), ys = all.map((p) => p[1]);
  const unit = o.unit || "s";
  let xa;
  if (o.xTicks) xa = { lo: Math.min(...o.xTicks), hi: Math.max(...o.xTicks), ticks: o.xTicks, decimals: 0 };
  else if (o.xRange) xa = axis(o.xRange[0], o.xRange[1], { count: 5, integer: unit === "#" });
  else {
    let [x0, x1] = [Math.min(...xs), Math.max(...xs)];
    if (x1 === x0) { x0 = Math.max(0, x0 - 1); x1 += 1; }  // one time (or step)
    xa = axis(Math.min(0, x0), x1, { count: 5, integer: unit === "#" });
  }
  const ya = axis(Math.min(...ys), Math.max(...ys), { zero: o.zero, count: 4 });
  const yLabel = o.yFormat || ((y) => y.toFixed(ya.decimals));
  const xLabel = o.xFormat || (unit === "#" ? (x) => `#${x}` : (x) => `${x.toFixed(xa.decimals)} ${unit}`);
  // the left margin fits the longest y label ("1234.5 MiB" is wider than "0.55")
  const L = Math.max(30, 6.5 * Math.max(...ya.ticks.map((t) => yLabel(t).length)) + 8);
  const R = 14, T = 8;
  const X = (x) => L + ((x - xa.lo) / (xa.hi - xa.lo)) * (W - L - R);
  const Y = (y) => H - B - ((y - ya.lo) / (ya.hi - ya.lo)) * (H - B - T);
  // what zoomable() needs to turn a pointer's position back into an x value
  Object.assign(root.dataset, { w: W, l: L, r: R, x0: xa.lo, x1: xa.hi });
  for (const t of ya.ticks) {
    root.appendChild(svg("line", { x1: L, y1: Y(t), x2: W - R, y2: Y(t), stroke: "#e5e7eb", class: "grid" }));
    root.appendChild(svg("text", { x: L - 4, y: Y(t) + 4, "text-anchor": "end", class: "y-label" }, yLabel(t)));
  }
  root.appendChild(svg("line", { x1: L, y1: H - B, x2: W - R, y2: H - B, stroke: "#9ca3af", class: "x-axis" }));
  root.appendChild(svg("line", { x1: L, y1: T, x2: L, y2: H - B, stroke: "#9ca3af", class: "y-axis" }));
  xa.ticks.forEach((t, i) => {
    const anchor = i === 0 && xa.ticks.length > 1 ? "start" : i === xa.ticks.length - 1 && xa.ticks.length > 1 ? "end" : "middle";
    root.appendChild(svg("line", { x1: X(t), y1: H - B, x2: X(t), y2: H - B + 4, stroke: "#9ca3af" }));
    root.appendChild(svg("text", { x: X(t), y: H - 8, "text-anchor": anchor, class: "x-label" }, xLabel(t)));
  });
  series.forEach((s, i) => {
    if (!s.points.length) return;  // (its colour stays its own: s.color, else its place)
    const color = COLORS[(s.color ?? i) % COLORS.length];
    const line = (pts) => pts.map((p, j) => `${j ? "L" : "M"}${X(p[0]).toFixed(1)},${Y(p[1]).toFixed(1)}`).join(" ");
    if (o.smooth) {
      root.appendChild(svg("path", { d: line(s.points), fill: "none", stroke: color, "stroke-width": 1.2, "stroke-opacity": 0.3, class: "raw" }));
      const path = svg("path", { d: line(smoothed(s.points, o.smooth)), fill: "none", stroke: color, "stroke-width": 1.8, class: "series" });
      path.appendChild(svg("title", {}, `${s.name} (smoothed ${o.smooth})`));
      root.appendChild(path);
      return;
    }
    const d = s.points.map((p, j) => `${j ? "L" : "M"}${X(p[0]).toFixed(1)},${Y(p[1]).toFixed(1)}`).join(" ");
    const path = svg("path", { d, fill: "none", stroke: color, "stroke-width": 1.8, class: "series" });
    path.appendChild(svg("title", {}, s.name));
    root.appendChild(path);
    if (s.points.length <= 60) {  // few points: each one drawn, so a single value shows
      for (const p of s.points) {
        const dot = svg("circle", { cx: X(p[0]).toFixed(1), cy: Y(p[1]).toFixed(1), r: 2.5, fill: color, class: "point" });
        dot.appendChild(svg("title", {}, `${s.name}: ${o.yFormat ? yLabel(p[1]) : p[1]}`));
        root.appendChild(dot);
      }
    }
  });
  return root;
}

// Drag across a plot to zoom into that x range (onZoom([lo, hi])); double-click to zoom
// back out (onReset). Pointer positions are turned into x values with the plot's own
// scale, kept on the svg by linePlot.
function zoomable(root, onZoom, onReset) {
  let from = null;
  const valueAt = (clientX) => {
    const box = root.getBoundingClientRect(), d = root.dataset;
    const vx = ((clientX - box.left) * Number(d.w)) / box.width;
    const f = Math.min(1, Math.max(0, (vx - Number(d.l)) / (Number(d.w) - Number(d.l) - Number(d.r))));
    return Number(d.x0) + f * (Number(d.x1) - Number(d.x0));
  };
  root.addEventListener("pointerdown", (ev) => { from = ev.clientX; ev.preventDefault(); });
  root.addEventListener("pointerup", (ev) => {
    if (from === null) return;
    const [a, b] = [from, ev.clientX].sort((p, q) => p - q);
    from = null;
    if (b - a >= 6 && root.dataset.x0 !== undefined) onZoom([valueAt(a), valueAt(b)]);
  });
  root.addEventListener("dblclick", () => onReset());
  root.classList.add("zoomable");
  return root;
}

function legend(names) {
  return el("div", { class: "legend" }, ...names.map((n, i) => {
    const swatch = el("i", {});
    swatch.style.background = COLORS[i % COLORS.length]; // CSSOM: allowed by the page's CSP
    return el("span", {}, swatch, n);
  }));
}

// The placement and traffic report (schema shipyard.ps.report/v1), drawn.
function drawReport(report) {
  const box = el("div", { class: "report" });
  if (!report) {
    box.appendChild(el("p", { class: "muted" }, "No placement and traffic report: this job has no parameter server."));
    return box;
  }
  const title = `${report.implementation || "shipyard"} parameter servers` + (report.layout ? ` (${report.layout} layout)` : "");
  box.appendChild(el("h3", {}, title));
  for (const w of report.warnings || []) box.appendChild(el("div", { class: "warning" }, w));
  const shards = report.shards || [];
  const maxBytes = Math.max(1, ...shards.map((s) => s.bytes || 0));
  const table = el("table", {}, el("tr", {}, ...["ps", "host", "variables", "bytes", "", "wire in", "wire out"].map((h) => el("th", {}, h))));
  for (const s of shards) {
    const bar = svg("svg", { width: 140, height: 12, class: "ps-bar" });
    bar.appendChild(svg("rect", { x: 0, y: 1, height: 10, width: Math.max(1, 140 * (s.bytes || 0) / maxBytes), fill: "#2563eb" }));
    table.appendChild(el("tr", {}, el("td", {}, s.shard), el("td", {}, s.host || ""), el("td", {}, s.keys ?? "-"),
      el("td", {}, human(s.bytes)), el("td", {}, bar), el("td", {}, human(s.bytes_in)), el("td", {}, human(s.bytes_out))));
  }
  box.appendChild(table);
  const imbalance = (report.imbalance || {})[report.policy];
  box.appendChild(el("p", {}, `placement policy: ${report.policy ?? "-"}; imbalance (max/mean bytes per ps): ${imbalance ?? "-"}`));
  const traffic = report.traffic || {};
  const peers = traffic.peers || (traffic.workers || []).map((w) => `worker ${w}`);
  const matrix = traffic.bytes_to_shard || [];
  if (peers.length && matrix.length) {
    box.appendChild(el("h4", {}, "traffic: worker x server (bytes sent to each ps)"));
    box.appendChild(heatMap(peers, (traffic.shards || []).map((s) => `ps ${s}`), matrix, traffic.bytes_from_shard || []));
  }
  return box;
}

// A heat-map cell is HEAT at alpha a over the white card; its label is white or black,
// whichever has the higher contrast (WCAG's relative luminance: the two cross at 0.179,
// where either has 4.58:1, so every label reads at least that)
const HEAT = [30, 64, 175];
function onDark(a) {
  const lin = (v) => { v /= 255; return v <= 0.03928 ? v / 12.92 : Math.pow((v + 0.055) / 1.055, 2.4); };
  const [r, g, b] = HEAT.map((c) => lin(255 - a * (255 - c)));
  return 0.2126 * r + 0.7152 * g + 0.0722 * b < 0.179;
}

function heatMap(rows, cols, to, from) {
  const C = 90, R = 26, L = 110, T = 22;
  const W = L + C * cols.length + 10, H = T + R * rows.length + 6;
  const root = svg("svg", { viewBox: `0 0 ${W} ${H}`, width: "100%", class: "heatmap", role: "img" });
  root.style.maxWidth = `${Math.min(W, 720)}px`;  // CSSOM: allowed by the page's CSP
  const max = Math.max(1, ...to.flat());
  cols.forEach((c, j) => root.appendChild(svg("text", { x: L + j * C + 6, y: 14 }, c)));
  rows.forEach((r, i) => {
    root.appendChild(svg("text", { x: 2, y: T + i * R + 17 }, r));
    cols.forEach((c, j) => {
      const v = (to[i] || [])[j] || 0, back = ((from[i] || [])[j]) || 0;
      const a = 0.08 + 0.92 * (v / max);
      const cell = svg("rect", { x: L + j * C, y: T + i * R, width: C - 3, height: R - 3, fill: `rgba(${HEAT.join(",")},${a.toFixed(3)})`, class: "cell" });
      cell.appendChild(svg("title", {}, `${r} -> ${c}: ${human(v)} sent, ${human(back)} received`));
      root.appendChild(cell);
      // a class, not a fill attribute: the stylesheet's "svg text" fill beats an attribute
      root.appendChild(svg("text", { x: L + j * C + 5, y: T + i * R + 16, class: onDark(a) ? "cell-label on-dark" : "cell-label" }, human(v)));
    });
  });
  return root;
}

function nav() {
  const header = el("header", {}, el("a", { class: "brand", href: "/" }, "shipyard"),
    el("a", { href: "/" }, "jobs"), el("a", { href: "/endpoints" }, "endpoints"));
  document.body.prepend(header);
}
