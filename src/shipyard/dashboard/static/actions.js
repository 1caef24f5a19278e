// A job's actions on its page: stop (with a confirm step) and TensorBoard.
// Both are POSTs to the dashboard's own API: the browser sends the page's Origin, which
// is what guard.py requires of a write (a cross-site page's POST is refused there).
"use strict";

async function postJSON(url) {
  const resp = await fetch(url, { method: "POST", headers: { Accept: "application/json" } });
  let body = {};
  try { body = await resp.json(); } catch (e) { body = {}; }
  if (!resp.ok) throw new Error(body.error || `${url}: HTTP ${resp.status}`);
  return body;
}

// TensorBoard listens on its own port of the host this page was opened as
function tensorBoardURL(port) { return `${location.protocol}//${location.hostname}:${port}/`; }

class Actions {
  constructor(job, box) {
    this.job = job;
    this.box = box;
    this.status = null;
    this.confirming = false;
    this.busy = false;
    this.stopMessage = null;  // what the stop request answered (or why it failed)
    this.board = null;  // {port} once TensorBoard runs, or {error}
  }

  update(status) {
    if (status === this.status) return;
    this.status = status;
    this.confirming = false;
    this.draw();
  }

  api(what) { return `/api/jobs/${encodeURIComponent(this.job)}/${what}`; }

  stopControls() {
    if (this.status !== "InProgress") return [];
    if (!this.confirming) {
      const ask = el("button", { id: "stop", type: "button" }, "stop job…");
      ask.addEventListener("click", () => { this.confirming = true; this.draw(); });
      return [ask];
    }
    const yes = el("button", { id: "stop-confirm", type: "button", class: "danger" }, "stop it");
    const no = el("button", { id: "stop-cancel", type: "button" }, "cancel");
    yes.addEventListener("click", () => this.stop());
    no.addEventListener("click", () => { this.confirming = false; this.draw(); });
    return [el("span", { class: "confirm" }, `Stop ${this.job}? Every instance is ended and the job ends Stopped.`), yes, no];
  }

  async stop() {
    if (this.busy) return;
    this.busy = true;
    this.confirming = false;
    try {
      const answer = await postJSON(this.api("stop"));
      this.stopMessage = `stop requested: the job is ${answer.TrainingJobStatus}`;
    } catch (e) { this.stopMessage = `not stopped: ${e.message}`; }
    this.busy = false;
    this.draw();
  }

  async openBoard() {
    if (this.busy) return;
    this.busy = true;
    this.box.appendChild(el("span", { class: "notice", id: "tensorboard-wait" }, "starting TensorBoard…"));
    try { this.board = await postJSON(this.api("tensorboard")); } catch (e) { this.board = { error: e.message }; }
    this.busy = false;
    this.draw();
  }

  boardControls() {
    if (this.board && this.board.port) {
      const link = el("a", { id: "tensorboard-link", target: "_blank", rel: "noopener" }, `open TensorBoard (port ${this.board.port})`);
      link.setAttribute("href", tensorBoardURL(this.board.port));  // another port: not el()'s same-site href
      return [link];
    }
    const start = el("button", { id: "tensorboard", type: "button" }, "TensorBoard");
    start.addEventListener("click", () => this.openBoard());
    const out = [start];
    if (this.board && this.board.error) out.push(el("span", { class: "notice", id: "tensorboard-error" }, this.board.error));
    return out;
  }

  draw() {
    const bits = [...this.stopControls(), ...this.boardControls()];
    if (this.stopMessage) bits.push(el("span", { class: "notice", id: "stop-message" }, this.stopMessage));
    setChildren(this.box, ...bits);
  }
}
