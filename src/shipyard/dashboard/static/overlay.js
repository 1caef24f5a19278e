// One metric of several jobs on one chart (the compare page: /jobs/A,B,...): a line per
// job, from its first host (algo-1 where it reported), against seconds since each job
// started, or against the value's order when a job printed its values faster than the
// log is read (they share a time).
"use strict";

function metricSeries(d, metric) {
  const start = Date.parse(d.TrainingStartTime || d.CreationTime) / 1000;
  const byHost = new Map();
  for (const p of d.Shipyard.MetricHistory || []) {
    if (p.MetricName !== metric) continue;
    if (!byHost.has(p.Host)) byHost.set(p.Host, []);
    const at = typeof p.Timestamp === "number" ? p.Timestamp : Date.parse(p.Timestamp) / 1000;
    byHost.get(p.Host).push([at - start, p.Value]);
  }
  const hosts = [...byHost.keys()].sort((a, b) => a.localeCompare(b, "en", { numeric: true }));
  return hosts.length ? { host: hosts[0], hosts: hosts.length, points: byHost.get(hosts[0]) } : null;
}

function overlayPlot(described, metric) {
  const lines = described.map((d) => ({ job: d.TrainingJobName, s: metricSeries(d, metric) })).filter((l) => l.s);
  const byOrder = lines.some(({ s }) => s.points.length > 1 &&
    Math.max(...s.points.map((p) => p[0])) - Math.min(...s.points.map((p) => p[0])) < 0.5);
  const series = lines.map(({ job, s }) => ({
    name: s.hosts > 1 ? `${job} (${s.host})` : job,
    points: byOrder ? s.points.map((p, i) => [i, p[1]]) : s.points,
  }));
  const plot = zoomable(linePlot(series, { unit: byOrder ? "#" : "s", width: 720, height: 240, smooth: smoothing, xRange: overlayZoom }),
    (range) => { overlayZoom = range; redrawOverlay(); }, () => { overlayZoom = undefined; redrawOverlay(); });
  return [plot, legend(series.map((s) => s.name))];
}

let redrawOverlay = () => {};
let overlayZoom;  // [from, to] on the x axis while zoomed in  // set once the overlay is drawn (the smoothing slider calls it)

function overlay(described) {
  const box = document.getElementById("overlay");
  const counts = new Map();
  for (const d of described) {
    for (const name of new Set((d.Shipyard.MetricHistory || []).map((p) => p.MetricName))) counts.set(name, (counts.get(name) || 0) + 1);
  }
  if (!counts.size) {
    setChildren(box, el("p", { class: "muted" }, "none of these jobs has a metric (metric_definitions) to overlay"));
    return;
  }
  // the metric most of the jobs have first, then by name
  const metrics = [...counts.keys()].sort((a, b) => counts.get(b) - counts.get(a) || a.localeCompare(b));
  const select = el("select", { id: "overlay-metric" }, ...metrics.map((m) => el("option", { value: m }, m)));
  const chart = el("div", { class: "overlay-chart" });
  const draw = () => setChildren(chart, ...overlayPlot(described, select.value));
  select.addEventListener("change", () => { overlayZoom = undefined; });
  redrawOverlay = draw;
  select.addEventListener("change", draw);
  setChildren(box, el("p", {}, "metric ", select, " of each job, on one chart"), chart);
  draw();
}
