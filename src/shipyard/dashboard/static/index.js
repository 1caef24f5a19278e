"use strict";
nav();
const picked = new Set();

async function refresh() {
  const jobs = await getJSON("/api/jobs");
  const body = document.querySelector("#jobs tbody");
  setChildren(body, ...jobs.map((j) => {
    const box = el("input", { type: "checkbox", "data-job": j.TrainingJobName });
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
  }));
}

document.getElementById("compare").addEventListener("click", (ev) => {
  ev.preventDefault();
  if (picked.size) location.href = "/jobs/" + [...picked].map(encodeURIComponent).join(",") ;
});
refresh().catch((e) => console.warn(e.message));
setInterval(() => refresh().catch((e) => console.warn(e.message)), 2000);
