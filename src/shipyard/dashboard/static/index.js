// The job list: filtered by part of a name and a status, sorted by a column (a click on
// its heading; again for the other direction). The filter and sort live in the page's
// query (?q=&status=&sort=&dir=), so a reload or a shared link keeps them.
"use strict";
nav();
const picked = new Set();
const params = new URLSearchParams(location.search);
const view = { q: params.get("q") || "", status: params.get("status") || "", sort: params.get("sort") || "created", dir: params.get("dir") || "desc" };
let listed = [];  // the last /api/jobs answer

const KEYS = {
  name: (j) => j.TrainingJobName,
  status: (j) => j.TrainingJobStatus,
  instances: (j) => j.InstanceCount,
  created: (j) => j.CreationTime,
  duration: (j) => j.DurationSeconds,
};

function shown() {
  const q = view.q.toLowerCase();
  const key = KEYS[view.sort] || KEYS.created;
  const sign = view.dir === "asc" ? 1 : -1;
  return listed
    .filter((j) => (!q || j.TrainingJobName.toLowerCase().includes(q)) && (!view.status || j.TrainingJobStatus === view.status))
    .sort((a, b) => {
      const [x, y] = [key(a), key(b)];
      const c = typeof x === "string" ? x.localeCompare(y, "en", { numeric: true }) : x - y;
      return sign * c || a.TrainingJobName.localeCompare(b.TrainingJobName);
    });
}

function row(j) {
  const box = el("input", { type: "checkbox", "data-job": j.TrainingJobName, "aria-label": `pick ${j.TrainingJobName}` });
  box.checked = picked.has(j.TrainingJobName);
  box.addEventListener("change", () => { box.checked ? picked.add(j.TrainingJobName) : picked.delete(j.TrainingJobName); });
  return el("tr", { class: "job" },
    el("td", {}, box),
    el("td", {}, el("a", { href: "/jobs/" + encodeURIComponent(j.TrainingJobName) }, j.TrainingJobName)),
    el("td", {}, statusCell(j.TrainingJobStatus)),
    el("td", {}, j.SecondaryStatus),
    el("td", {}, j.InstanceCount),
    el("td", {}, j.Distribution || "-"),
    el("td", {}, new Date(j.CreationTime * 1000).toLocaleString()),
    el("td", {}, `${j.DurationSeconds} s`));
}

function draw() {
  const rows = shown();
  setChildren(document.querySelector("#jobs tbody"), ...rows.map(row));
  for (const th of document.querySelectorAll("#jobs th.sortable")) {
    if (th.dataset.sort === view.sort) th.setAttribute("aria-sort", view.dir === "asc" ? "ascending" : "descending");
    else th.removeAttribute("aria-sort");
  }
  document.getElementById("shown").textContent = rows.length === listed.length ? `${listed.length} job(s)` : `${rows.length} of ${listed.length} job(s)`;
  const empty = document.getElementById("empty");
  empty.hidden = rows.length > 0;
  empty.textContent = listed.length
    ? "No job matches this name and status: clear the filter to see every job."
    : "No training jobs in this home yet: start one with an estimator's fit() or shipyard train, and it appears here.";
}

function remember() {
  const q = new URLSearchParams();
  if (view.q) q.set("q", view.q);
  if (view.status) q.set("status", view.status);
  if (view.sort !== "created" || view.dir !== "desc") { q.set("sort", view.sort); q.set("dir", view.dir); }
  history.replaceState(null, "", q.toString() ? `/?${q}` : "/");
}

async function refresh() {
  listed = await getJSON("/api/jobs");
  draw();
}

const filter = document.getElementById("filter"), status = document.getElementById("status-filter");
filter.value = view.q;
status.value = view.status;
filter.addEventListener("input", () => { view.q = filter.value.trim(); remember(); draw(); });
status.addEventListener("change", () => { view.status = status.value; remember(); draw(); });
for (const th of document.querySelectorAll("#jobs th.sortable")) {
  th.addEventListener("click", () => {
    const key = th.dataset.sort;
    // a new column starts with its natural direction: names A-Z, numbers and times largest first
    view.dir = view.sort === key ? (view.dir === "asc" ? "desc" : "asc") : (key === "name" || key === "status" ? "asc" : "desc");
    view.sort = key;
    remember();
    draw();
  });
}
document.getElementById("compare").addEventListener("click", (ev) => {
  ev.preventDefault();
  if (picked.size) location.href = "/jobs/" + [...picked].map(encodeURIComponent).join(",");
});
refresh().catch((e) => console.warn(e.message));
setInterval(() => refresh().catch((e) => console.warn(e.message)), 2000);
