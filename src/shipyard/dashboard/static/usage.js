// Per-instance utilization on a job's page: a plot per metric, a line per instance.
// Samples (observe.utilization: one per instance every few seconds) are read a page at
// a time after the byte offset the last answer gave (the server's "cursor"), so a poll
// of a long job costs what is new, as the log does. Counters (network bytes) are drawn
// as rates between consecutive samples of one attempt; the totals are written below.
"use strict";

const MIB = 1024 * 1024;
// four significant digits, so close bounds stay apart (12.99 % and 13 %, not 13.0 twice)
const digits = (v) => String(Number(v.toPrecision(4)));
const pct = (v) => `${digits(v)} %`;
// a rate in MB/s, or kB/s below 0.1 MB/s (an idle link reads 1.2 kB/s, not 0.00120 MB/s)
const rate = (v) => (v !== 0 && Math.abs(v) < 0.1 ? `${digits(v * 1e3)} kB/s` : `${digits(v)} MB/s`);
// decimal bytes, as the rates are
function decimal(n) {
  for (const [unit, scale] of [["GB", 1e9], ["MB", 1e6], ["kB", 1e3]]) if (n >= scale) return `${digits(n / scale)} ${unit}`;
  return `${n} B`;
}
const USAGE_PLOTS = [
  { key: "CPUUtilization", title: "CPU (% of one CPU)", format: pct },
  { key: "MemoryBytes", title: "memory (MiB)", scale: 1 / MIB, format: (v) => `${digits(v)} MiB` },
  { key: "MemoryUtilization", title: "memory (% of the instance's limit)", format: pct },
  { key: "DiskUtilization", title: "disk (% of its file system used)", format: pct },
  { key: "NetworkRxBytes", title: "network in (MB/s)", rate: true, format: rate },
  { key: "NetworkTxBytes", title: "network out (MB/s)", rate: true, format: rate },
  { key: "GPUUtilization", title: "GPU (% summed over its GPUs)", format: pct },
  { key: "GPUMemoryUtilization", title: "GPU memory (% used, summed over its GPUs)", format: pct },
];

// algo-2 before algo-10
const hostOrder = (a, b) => a.localeCompare(b, "en", { numeric: true });

class Usage {
  constructor(job) {
    this.job = job;
    this.cursor = 0;
    this.byHost = new Map();  // host -> samples, oldest first
    this.busy = false;
    this.drawnAt = null;  // (samples seen, start) of the last drawing
    this.seen = 0;
    this.terminal = false;  // the job has ended: no sample is coming
  }

  // The pages after the cursor (a few per tick while the server says more are left).
  async poll() {
    if (this.busy) return;  // one poll at a time: two would add the same samples twice
    this.busy = true;
    try {
      for (let pages = 0; pages < 8; pages++) {
        const data = await getJSON(`/api/jobs/${encodeURIComponent(this.job)}/utilization?cursor=${this.cursor}`);
        for (const s of data.samples) {
          if (!this.byHost.has(s.Host)) this.byHost.set(s.Host, []);
          this.byHost.get(s.Host).push(s);
        }
        this.seen += data.samples.length;
        this.terminal = data.terminal;
        this.cursor = data.cursor;
        if (!data.more) return;
      }
    } finally { this.busy = false; }
  }

  hosts() { return [...this.byHost.keys()].sort(hostOrder); }

  // [[seconds since start, value], ...] of one host for one plot
  points(spec, samples, start) {
    const out = [];
    let prev = null;
    for (const s of samples) {
      const v = s[spec.key];
      if (v === null || v === undefined) continue;
      if (!spec.rate) out.push([s.Timestamp - start, v * (spec.scale || 1)]);
      else if (prev && prev.Attempt === s.Attempt && s.Timestamp > prev.Timestamp && v >= prev[spec.key]) {
        out.push([s.Timestamp - start, (v - prev[spec.key]) / (s.Timestamp - prev.Timestamp) / 1e6]);
      }
      prev = s;
    }
    return out;
  }

  card(spec, start) {
    const hosts = this.hosts();
    const measured = hosts.filter((h) => this.byHost.get(h).some((s) => s[spec.key] !== undefined && s[spec.key] !== null));
    if (!measured.length) return null;  // not sampled for this job (no GPU, no own network)
    const series = hosts.map((h, i) => ({ name: h, color: i, points: this.points(spec, this.byHost.get(h), start) }));
    const box = el("div", { class: "card usage", "data-usage": spec.key }, el("strong", {}, spec.title));
    // zero on the axis: these are amounts from nothing (a 0.02 % disk wobble stays flat)
    if (series.some((s) => s.points.length)) box.appendChild(linePlot(series, { yFormat: spec.format, zero: true }));
    else if (this.terminal) box.appendChild(el("p", { class: "muted" }, "no rate: a rate needs two samples of an instance, and this job ended after one"));
    else box.appendChild(el("p", { class: "muted" }, "a rate needs two samples of an instance: the next one comes in a few seconds"));
    box.appendChild(legend(hosts));
    if (spec.rate) {
      const totals = measured.map((h) => {
        const last = this.byHost.get(h).filter((s) => s[spec.key] !== undefined).pop();
        return `${h} ${decimal(last[spec.key])}`;
      });
      const said = this.terminal ? "in all, last attempt" : "so far this attempt";
      box.appendChild(el("p", { class: "muted totals" }, `${said}: ${totals.join(", ")}`));
    }
    return box;
  }

  // Redrawn only when samples arrived (or the start moved): a finished job's plots stay put.
  draw(box, start) {
    const key = `${this.seen}@${start}@${this.terminal}`;
    if (this.drawnAt === key) return;
    this.drawnAt = key;
    if (!this.seen) {
      setChildren(box, el("p", { class: "muted" }, this.terminal
        ? "no utilization was sampled: the job ended before its instances' first sample"
        : "no utilization sampled yet: each instance's CPU, memory, disk, network and GPU are sampled every few seconds while it runs"));
      return;
    }
    setChildren(box, ...USAGE_PLOTS.map((spec) => this.card(spec, start)));
  }
}
