// The plan section of a job's page: `shipyard plan`'s prediction for this job on other
// instance types and counts (a table with each row's bottleneck and advice, and steps/s
// against instances), from /api/jobs/NAME/plan. A job the planner cannot use yet (still
// running, nothing measured) shows the planner's own message: what is missing and how to
// get it; the fields under "what the job did not measure" are the options it names.
"use strict";

const PLAN_FIELDS = [
  ["compute_time", "--compute-time", "seconds of compute per step on the target type"],
  ["step_time", "--step-time", "the job's seconds per step (if it logged none)"],
  ["steps", "--steps", "steps per worker the job ran"],
  ["gradient_bytes", "--gradient-bytes", "gradient bytes per step (jobs without a ps report)"],
];

// the plot's x axis is log2(instances): 1, 2, 4 ... 64 evenly spaced
// the x axis is log2 of the instance count: a tick at each power of two, labelled with the count
const instancesLabel = (x) => String(Math.round(2 ** x));
function log2Ticks(rows) {
  const ks = rows.map((r) => Math.log2(r.instances));
  const out = [];
  for (let k = Math.floor(Math.min(...ks)); k <= Math.ceil(Math.max(...ks)); k++) out.push(k);
  return out.length > 1 ? out : [out[0], out[0] + 1];
}

// (status, body) of a GET, error answers included: their {"error"} is what the page shows
async function fetchAnswer(url) {
  const resp = await fetch(url, { headers: { Accept: "application/json" } });
  let body = null;
  try { body = await resp.json(); } catch (e) { body = { error: `${url}: HTTP ${resp.status}` }; }
  return [resp.status, body];
}

class Plan {
  constructor(job, box) {
    this.job = job;
    this.box = box;
    this.status = null;
    this.inputs = {};
    this.result = el("div", { class: "plan-result" });
    setChildren(box, this.form(), this.result);
  }

  form() {
    const input = (name, attrs) => (this.inputs[name] = el("input", { name, ...attrs }));
    // its other choices are the planner's own list, filled from the first answer
    const select = el("select", { name: "distribution" }, el("option", { value: "" }, "the job's own"));
    this.inputs.distribution = select;
    const extra = el("details", {}, el("summary", {}, "what the job did not measure"),
      ...PLAN_FIELDS.map(([name, flag, help]) => el("label", { class: "plan-field" }, `${flag} `,
        input(name, { type: "number", min: "0", step: "any", title: help }), el("span", { class: "muted" }, ` ${help}`))));
    const form = el("form", { id: "plan-form" },
      el("label", {}, "instance types or rates ", input("instance_type", { size: 34, placeholder: "ml.p3.2xlarge,ml.p3.16xlarge,100mbit" })),
      el("label", {}, " instances ", input("instances", { size: 16, placeholder: "1,2,4,8,16,32,64" })),
      el("label", {}, " distribution ", select), " ",
      el("button", { type: "submit", id: "plan-run" }, "plan"), extra);
    form.addEventListener("submit", (ev) => { ev.preventDefault(); this.load().catch((e) => console.warn(e.message)); });
    return form;
  }

  // Planned once when the page opens and again when the job's status changes (a job
  // that completes becomes plannable); otherwise only when asked.
  async update(status) {
    if (status === this.status) return;
    await this.load();
    this.status = status;  // (after: a load that failed is tried again on the next tick)
  }

  async load() {
    const q = new URLSearchParams();
    for (const [name, node] of Object.entries(this.inputs)) if (node.value.trim()) q.set(name, node.value.trim());
    const [status, body] = await fetchAnswer(`/api/jobs/${encodeURIComponent(this.job)}/plan?${q}`);
    if (status !== 200 || !body.plannable) {
      setChildren(this.result, el("div", { class: "warning plan-message" }, body.error || `HTTP ${status}`));
      return;
    }
    // the options the planner used (defaults included) fill the empty fields
    if (!this.inputs.instance_type.value) this.inputs.instance_type.value = body.instance_type;
    if (!this.inputs.instances.value) this.inputs.instances.value = body.instances.join(",");
    const select = this.inputs.distribution;
    if (select.options.length === 1) for (const d of body.known_distributions) select.appendChild(el("option", { value: d }, d));
    setChildren(this.result, ...this.draw(body));
  }

  draw(plan) {
    const m = plan.measured;
    const head = el("p", {}, `measured on ${m.instances} x ${m.instance_type} as ${m.distribution}: ` +
      `${m.step_s.toPrecision(4)} s per step, ${human(m.gradient_bytes)} of gradients per step`);
    const sources = el("ul", { class: "muted plan-sources" },
      ...Object.entries(m.sources).map(([what, where]) => el("li", {}, `${what}: ${where}`)));
    const table = el("table", { class: "plan-table" }, el("tr", {},
      ...["type", "n", "distribution", "steps/s", "step", "eff.", "bottleneck", "advice"].map((h) => el("th", {}, h))));
    for (const r of plan.rows) {
      table.appendChild(el("tr", { class: "plan-row" },
        el("td", {}, r.instance_type), el("td", {}, r.instances), el("td", {}, r.distribution),
        el("td", {}, r.steps_per_s === null ? "-" : r.steps_per_s.toFixed(2)),
        el("td", {}, r.step_s === null ? "-" : `${(r.step_s * 1e3).toFixed(1)} ms`),
        el("td", {}, `${Math.round(r.efficiency * 100)}%`),
        el("td", { class: "bottleneck" }, r.bottleneck), el("td", { class: "advice" }, r.advice)));
    }
    // steps/s against instances, a line per (type, distribution); counts on a log2 axis
    const lines = new Map();
    for (const r of plan.rows) {
      if (r.bottleneck === "unsupported" || r.steps_per_s === null) continue;  // no rate to draw
      const name = plan.distributions.length > 1 ? `${r.instance_type} / ${r.distribution}` : r.instance_type;
      if (!lines.has(name)) lines.set(name, []);
      lines.get(name).push([Math.log2(r.instances), r.steps_per_s]);
    }
    const series = [...lines.entries()].map(([name, points]) => ({ name, points }));
    const plot = el("div", { class: "card plan-plot" }, el("strong", {}, "predicted steps/s against instances (log scale)"),
      linePlot(series, { xFormat: instancesLabel, xTicks: log2Ticks(plan.rows), yFormat: (y) => `${Number(y.toPrecision(3))}/s`, zero: true }),
      legend([...lines.keys()]));
    return [head, sources, plot, table];
  }
}
