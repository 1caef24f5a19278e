"use strict";
nav();
const names = decodeURIComponent(location.pathname.split("/").pop()).split(",").filter(Boolean);
// logCursor: the byte offset reached in each log file (the server's "cursor"); null
// until the first answer, which starts at the tail of each log
let logCursor = null, logGen = 0, logHost = "", logNoise = false, hostsShown = false, envShown = false;
// per-instance utilization (usage.js) and the planner's section (plan.js) of a single job
let usage = null, plan = null;

function summary(d) {
  const bits = [el("p", {}, statusCell(d.TrainingJobStatus), ` / ${d.SecondaryStatus}`,
    d.TrainingTimeInSeconds !== undefined ? ` · ${d.TrainingTimeInSeconds} s` : "",
    ` · ${d.ResourceConfig.InstanceCount} instance(s)`)];
  if (d.FailureReason) bits.push(el("div", { class: "failure" }, d.FailureReason));
  if (d.ModelArtifacts) bits.push(el("p", { class: "muted" }, "model: ", d.ModelArtifacts.S3ModelArtifacts));
  return bits;
}

function timeline(d) {
  const steps = d.SecondaryStatusTransitions || [];
  if (!steps.length) return el("p", { class: "muted" }, d.TrainingJobStatus === "InProgress" ? "no transitions yet" : "no transitions were recorded");
  const t0 = Date.parse(steps[0].StartTime);
  const end = Math.max(...steps.map((s) => Date.parse(s.EndTime || s.StartTime)), t0 + 1, Date.now() * (d.TrainingJobStatus === "InProgress" ? 1 : 0));
  const W = 700, R = 22, A = 24, L = 160;
  const H = R * steps.length + 6;
  const root = svg("svg", { viewBox: `0 0 ${W} ${H + A}`, width: "100%", class: "timeline" });
  // the time axis: seconds since the first transition, on whole ticks
  const ax = axis(0, (end - t0) / 1000, { count: 6 });
  const TX = (sec) => L + (W - L - 14) * (sec / ax.hi);
  root.appendChild(svg("line", { x1: L, y1: H, x2: W - 14, y2: H, stroke: "#9ca3af", class: "x-axis" }));
  ax.ticks.forEach((t, i) => {
    root.appendChild(svg("line", { x1: TX(t), y1: 0, x2: TX(t), y2: H + 4, stroke: i ? "#eef0f3" : "#9ca3af" }));
    const anchor = i === 0 ? "start" : i === ax.ticks.length - 1 ? "end" : "middle";
    root.appendChild(svg("text", { x: TX(t), y: H + 18, "text-anchor": anchor, class: "t-label" }, `${t.toFixed(ax.decimals)} s`));
  });
  steps.forEach((s, i) => {
    const a = Date.parse(s.StartTime), b = Date.parse(s.EndTime || new Date().toISOString());
    const x = TX((a - t0) / 1000), w = Math.max(2, TX((b - t0) / 1000) - x);
    root.appendChild(svg("text", { x: 2, y: i * R + 15 }, s.Status));
    const bar = svg("rect", { x, y: i * R + 4, width: w, height: R - 8, fill: COLORS[i % COLORS.length] });
    bar.appendChild(svg("title", {}, `${s.Status}: ${s.StatusMessage} (${((b - a) / 1000).toFixed(2)} s)`));
    root.appendChild(bar);
  });
  return root;
}

// the metric charts' smoothing (the slider above them; the compare page's overlay too)
let smoothing = 0, lastDescribed = null;
const zoomed = new Map();  // metric name -> [from, to] on its x axis, while zoomed in

function redrawMetrics() {
  if (!lastDescribed) return;
  const d = lastDescribed, start = Date.parse(d.TrainingStartTime || d.CreationTime) / 1000;
  setChildren(document.getElementById("metrics"), ...metricPlots(d.Shipyard.MetricHistory || [], start, d.TrainingJobStatus !== "InProgress"));
}

function smoothingControl(id, redraw) {
  const input = document.getElementById(id), shown = document.getElementById(`${id}-value`);
  input.value = String(smoothing);
  input.addEventListener("input", () => {
    smoothing = Number(input.value);
    shown.textContent = smoothing.toFixed(2);
    redraw();
  });
}

function metricPlots(points, start, ended) {
  const byName = new Map();
  for (const p of points) {
    if (!byName.has(p.MetricName)) byName.set(p.MetricName, new Map());
    const hosts = byName.get(p.MetricName);
    if (!hosts.has(p.Host)) hosts.set(p.Host, []);
    const at = typeof p.Timestamp === "number" ? p.Timestamp : Date.parse(p.Timestamp) / 1000;
    hosts.get(p.Host).push([at - start, p.Value]);
  }
  if (!byName.size) {
    return [el("p", { class: "muted" }, ended ? "no metric: no log line matched the job's metric_definitions"
      : "no metric matched (metric_definitions) yet")];
  }
  return [...byName.entries()].map(([name, hosts]) => {
    const xs = [...hosts.values()].flat().map((p) => p[0]);
    // values printed faster than the log is read share a time: plot them by their order
    const byOrder = xs.length > 1 && Math.max(...xs) - Math.min(...xs) < 0.5;
    const series = [...hosts.entries()].map(([h, pts]) => ({
      name: h, points: byOrder ? pts.map((p, i) => [i, p[1]]) : pts }));
    const plot = zoomable(linePlot(series, { unit: byOrder ? "#" : "s", smooth: smoothing, xRange: zoomed.get(name) }),
      (range) => { zoomed.set(name, range); redrawMetrics(); },
      () => { zoomed.delete(name); redrawMetrics(); });
    return el("div", { class: "card metric", "data-metric": name, "data-zoomed": zoomed.has(name) ? "1" : "0" },
      el("strong", {}, name), plot, legend([...hosts.keys()]));
  });
}

const MAX_SHOWN = 5000;  // lines kept in the page; older ones leave it

// One page of the log after logCursor, then the next pages at once while the server
// says more are left (a few per tick, so a long log catches up without a long request).
let logBusy = false;
async function pollLogs() {
  if (logBusy) return;  // one poll at a time: two would append the same lines twice
  logBusy = true;
  try { await pollPages(); } finally { logBusy = false; }
}

async function pollPages() {
  const gen = logGen;
  for (let pages = 0; pages < 8; pages++) {
    const q = new URLSearchParams();
    if (logCursor !== null) q.set("cursor", logCursor);
    if (logHost) q.set("host", logHost);
    if (logNoise) q.set("noise", "1");
    const data = await getJSON(`/api/jobs/${encodeURIComponent(names[0])}/logs?${q}`);
    if (gen !== logGen) return;  // the host or noise filter changed meanwhile
    const box = document.getElementById("log");
    const stick = box.scrollTop + box.clientHeight >= box.scrollHeight - 20;
    if (logCursor === null && data.skipped) {
      box.appendChild(el("div", { class: "line muted skipped" },
        `(${human(data.skipped)} of earlier log not shown: shipyard logs ${names[0]} prints all of it)`));
    }
    for (const line of data.lines) {
      box.appendChild(el("div", { class: "line" }, el("span", { class: "label" }, `[${line.label}]`), line.text));
    }
    while (box.childElementCount > MAX_SHOWN) box.firstElementChild.remove();
    logCursor = data.cursor;
    if (stick) box.scrollTop = box.scrollHeight;
    if (!data.more) return;
  }
}

// the whole log as a file, as shipyard logs --timestamps (or --json) prints it, for the
// host and noise shown
function downloadLinks() {
  const q = new URLSearchParams({ timestamps: "1" });
  if (logHost) q.set("host", logHost);
  if (logNoise) q.set("noise", "1");
  const base = `/api/jobs/${encodeURIComponent(names[0])}/logs/download`;
  document.getElementById("log-download").setAttribute("href", safeHref(`${base}?${q}`));
  q.set("format", "json");
  document.getElementById("log-download-json").setAttribute("href", safeHref(`${base}?${q}`));
}

function resetLogs() {
  logCursor = null;
  downloadLinks();
  logGen++;
  setChildren(document.getElementById("log"));
  pollLogs().catch((e) => console.warn(e.message));
}

// Environment values (where users pass secrets) stay hidden until asked for here.
function environment(d) {
  const env = d.Environment || {};
  const keys = Object.keys(env).sort();
  if (!keys.length) return el("p", { class: "muted" }, "no environment variables");
  const table = el("table", { class: "env" }, ...keys.map((k) => el("tr", {}, el("td", {}, k), el("td", {}, env[k]))));
  if (envShown) return table;
  const button = el("button", { id: "show-env", type: "button" }, "show values");
  button.addEventListener("click", async () => {
    const full = await getJSON(`/api/jobs/${encodeURIComponent(names[0])}?environment=show`);
    envShown = true;
    setChildren(document.getElementById("environment"), environment(full));
  });
  return el("div", {}, table, button);
}

async function refreshSingle() {
  const name = names[0];
  const d = await getJSON(`/api/jobs/${encodeURIComponent(name)}`);
  document.title = `shipyard: ${name}`;
  document.getElementById("title").textContent = name;
  setChildren(document.getElementById("summary"), ...summary(d));
  if (!hostsShown) {
    hostsShown = true;
    const select = document.getElementById("host");
    for (let i = 1; i <= d.ResourceConfig.InstanceCount; i++) select.appendChild(el("option", { value: `algo-${i}` }, `algo-${i}`));
  }
  const start = Date.parse(d.TrainingStartTime || d.CreationTime) / 1000;
  lastDescribed = d;
  setChildren(document.getElementById("metrics"), ...metricPlots(d.Shipyard.MetricHistory || [], start, d.TrainingJobStatus !== "InProgress"));
  actions.update(d.TrainingJobStatus);
  setChildren(document.getElementById("report"), drawReport(d.Shipyard.DistributionReport));
  setChildren(document.getElementById("timeline"), timeline(d));
  if (!envShown) setChildren(document.getElementById("environment"), environment(d));
  usage = usage || new Usage(name);
  await usage.poll();
  usage.draw(document.getElementById("utilization"), start);
  plan = plan || new Plan(name, document.getElementById("plan"));
  await plan.update(d.TrainingJobStatus);
  return d.TrainingJobStatus === "InProgress";
}

async function refreshCompare() {
  document.getElementById("single").remove();
  document.getElementById("overlay-section").hidden = false;
  document.getElementById("title").textContent = `Compare: ${names.join(" vs ")}`;
  const cols = [], described = [];
  for (const name of names) {
    const d = await getJSON(`/api/jobs/${encodeURIComponent(name)}`);
    const start = Date.parse(d.TrainingStartTime || d.CreationTime) / 1000;
    cols.push(el("div", { class: "card job-column", "data-job": name },
      el("h2", {}, el("a", { href: "/jobs/" + encodeURIComponent(name) }, name)),
      ...summary(d), drawReport(d.Shipyard.DistributionReport),
      ...metricPlots(d.Shipyard.MetricHistory || [], start, d.TrainingJobStatus !== "InProgress")));
    described.push(d);
  }
  setChildren(document.getElementById("compare"), ...cols);
  overlay(described);
}

const actions = new Actions(names[0], document.getElementById("actions"));

if (names.length > 1) {
  smoothingControl("overlay-smoothing", () => redrawOverlay());
  refreshCompare().catch((e) => console.warn(e.message));
} else {
  downloadLinks();
  smoothingControl("smoothing", redrawMetrics);
  document.getElementById("host").addEventListener("change", (ev) => { logHost = ev.target.value; resetLogs(); });
  document.getElementById("noise").addEventListener("change", (ev) => { logNoise = ev.target.checked; resetLogs(); });
  const tick = async () => {
    let running = true;
    try {
      running = await refreshSingle();
      await pollLogs();
    } catch (e) { console.warn(e.message); }
    setTimeout(tick, running ? 1000 : 5000);
  };
  tick();
}
