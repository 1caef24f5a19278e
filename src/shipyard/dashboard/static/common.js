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

// A line plot: series = [{name, points: [[x, y], ...]}]; opts.unit names x's unit
// ("s" by default), opts.xFormat / opts.yFormat turn a value into its label ("12.5 %")
function linePlot(series, opts) {
  const W = (opts && opts.width) || 480, H = (opts && opts.height) || 200, P = 36;
  const yLabel = (opts && opts.yFormat) || ((y) => y.toPrecision(4));
  const all = series.flatMap((s) => s.points);
  const root = svg("svg", { viewBox: `0 0 ${W} ${H}`, width: "100%", role: "img", class: "plot" });
  if (!all.length) return root;
  const xs = all.map((p) => p[0]), ys = all.map((p) => p[1]);
  let [x0, x1, y0, y1] = [Math.min(...xs), Math.max(...xs), Math.min(...ys), Math.max(...ys)];
  const oneX = x1 === x0;
  if (oneX) { x0 -= 1; x1 += 1; }  // one time (or step): drawn in the middle
  if (y1 === y0) {  // one value: a band of 10% around it, not crossing zero
    const pad = Math.abs(y0) * 0.1 || 1;
    [y0, y1] = [y0 - pad, y1 + pad];
    if (ys[0] > 0 && y0 < 0) y0 = 0;
  }
  // the left margin fits the longer y label ("1234.5 MiB" is wider than "0.5500")
  const L = Math.max(P, 6.5 * Math.max(yLabel(y0).length, yLabel(y1).length) + 4);
  const X = (x) => L + ((x - x0) / (x1 - x0)) * (W - L - 10);
  const Y = (y) => H - P + 10 - ((y - y0) / (y1 - y0)) * (H - P - 10);
  root.appendChild(svg("line", { x1: L, y1: H - P + 10, x2: W - 10, y2: H - P + 10, stroke: "#9ca3af" }));
  root.appendChild(svg("line", { x1: L, y1: 0, x2: L, y2: H - P + 10, stroke: "#9ca3af" }));
  root.appendChild(svg("text", { x: 2, y: 12, class: "y-label" }, yLabel(y1)));
  root.appendChild(svg("text", { x: 2, y: H - P + 8, class: "y-label" }, yLabel(y0)));
  const unit = (opts && opts.unit) || "s";
  const xLabel = (opts && opts.xFormat) || ((x) => `${x.toFixed(unit === "s" ? 1 : 0)} ${unit}`);
  if (oneX) {
    root.appendChild(svg("text", { x: X(xs[0]) - 14, y: H - 8, class: "x-label" }, xLabel(xs[0])));
  } else {
    root.appendChild(svg("text", { x: L, y: H - 8, class: "x-label" }, xLabel(x0)));
    root.appendChild(svg("text", { x: W - 10, y: H - 8, class: "x-label", "text-anchor": "end" }, xLabel(x1)));
  }
  series.forEach((s, i) => {
    if (!s.points.length) return;  // (its colour stays its own: s.color, else its place)
    const color = COLORS[(s.color ?? i) % COLORS.length];
    const d = s.points.map((p, j) => `${j ? "L" : "M"}${X(p[0]).toFixed(1)},${Y(p[1]).toFixed(1)}`).join(" ");
    const path = svg("path", { d, fill: "none", stroke: color, "stroke-width": 1.8, class: "series" });
    path.appendChild(svg("title", {}, s.name));
    root.appendChild(path);
    if (s.points.length <= 60) {  // few points: each one drawn, so a single value shows
      for (const p of s.points) {
        const dot = svg("circle", { cx: X(p[0]).toFixed(1), cy: Y(p[1]).toFixed(1), r: 2.5, fill: color, class: "point" });
        dot.appendChild(svg("title", {}, `${s.name}: ${(opts && opts.yFormat) ? yLabel(p[1]) : p[1]}`));
        root.appendChild(dot);
      }
    }
  });
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

function heatMap(rows, cols, to, from) {
  const C = 90, R = 26, L = 110, T = 22;
  const W = L + C * cols.length + 10, H = T + R * rows.length + 6;
  const root = svg("svg", { viewBox: `0 0 ${W} ${H}`, width: Math.min(W, 720), class: "heatmap", role: "img" });
  const max = Math.max(1, ...to.flat());
  cols.forEach((c, j) => root.appendChild(svg("text", { x: L + j * C + 6, y: 14 }, c)));
  rows.forEach((r, i) => {
    root.appendChild(svg("text", { x: 2, y: T + i * R + 17 }, r));
    cols.forEach((c, j) => {
      const v = (to[i] || [])[j] || 0, back = ((from[i] || [])[j]) || 0;
      const a = 0.08 + 0.92 * (v / max);
      const cell = svg("rect", { x: L + j * C, y: T + i * R, width: C - 3, height: R - 3, fill: `rgba(37,99,235,${a.toFixed(3)})`, class: "cell" });
      cell.appendChild(svg("title", {}, `${r} -> ${c}: ${human(v)} sent, ${human(back)} received`));
      root.appendChild(cell);
      root.appendChild(svg("text", { x: L + j * C + 5, y: T + i * R + 16, fill: a > 0.55 ? "#fff" : "#111" }, human(v)));
    });
  });
  return root;
}

function nav() {
  const header = el("header", {}, el("a", { class: "brand", href: "/" }, "shipyard"),
    el("a", { href: "/" }, "jobs"), el("a", { href: "/endpoints" }, "endpoints"));
  document.body.prepend(header);
}
