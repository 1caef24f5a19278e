// The page of a job URL that names no job (served with HTTP 404): it names what was
// asked for, as text, so a typo is easy to spot.
"use strict";
nav();
const asked = decodeURIComponent(location.pathname.split("/").pop()).split(",").filter(Boolean);
(async () => {
  const listed = await getJSON("/api/jobs");
  const known = new Set(listed.map((j) => j.TrainingJobName));
  const missing = asked.filter((n) => !known.has(n));
  if (!missing.length) return;
  document.getElementById("title").textContent = missing.length > 1 ? "No such training jobs" : "No such training job";
  document.getElementById("what").textContent = missing.length > 1
    ? `There are no training jobs named ${missing.map((n) => `"${n}"`).join(", ")} in this shipyard home.`
    : `There is no training job named "${missing[0]}" in this shipyard home.`;
})().catch((e) => console.warn(e.message));
