"use strict";
nav();
const previous = new Map();

async function refresh() {
  const eps = await getJSON("/api/endpoints");
  const body = document.querySelector("#endpoints tbody");
  setChildren(body, ...eps.map((e) => {
    const prev = previous.get(e.EndpointName);
    let rate = "-";
    if (prev && e.requests !== undefined && e.At > prev.At) rate = ((e.requests - prev.requests) / (e.At - prev.At)).toFixed(1);
    previous.set(e.EndpointName, e);
    const latency = e.latency_count ? `${(1000 * e.latency_sum / e.latency_count).toFixed(2)} ms` : "-";
    return el("tr", { class: "endpoint" },
      el("td", {}, e.EndpointName), el("td", {}, statusCell(e.EndpointStatus)), el("td", {}, e.Url),
      el("td", {}, e.requests ?? "-"), el("td", {}, e.errors ?? "-"), el("td", {}, rate), el("td", {}, latency),
      el("td", { class: "muted" }, e.FailureReason || e.ScrapeError || e.ModelData));
  }));
}
refresh().catch((e) => console.warn(e.message));
setInterval(() => refresh().catch((e) => console.warn(e.message)), 2000);
