"""The web dashboard, served by ``shipyard ui``: its guard (own ``Host`` only, no cross-site
writes, ``Environment`` values hidden), logs read a page at a time off the event loop, and
the pages in a real headless Chromium (the distribution's package): pages load without
console errors, a running job appears and its live log advances, a metric plot (one of a
single point too) and the traffic heat map render, every string is shown as text.
Screenshots are kept under build/test-artifacts/dashboard/."""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import socket
import subprocess
import sys
import textwrap
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import numpy as np
import pytest

import shipyard

CHROMIUM = "/usr/bin/chromium"
ARTIFACTS = pathlib.Path(__file__).resolve().parents[3] / "build" / "test-artifacts" / "dashboard"
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
]
pytestmark = pytest.mark.timeout(240)

EVIL = "<script>window.__pwned = 1</script><img src=x onerror=window.__pwned=2>"
DONE_SCRIPT = f"""
for i in range(6):
    print(f"epoch {{i}} loss={{1.0 / (i + 1):.3f}}", flush=True)
print({EVIL!r}, flush=True)
"""
SECRET = "s3cret-token-of-the-user"
RUNNING_SCRIPT = """
import time
for i in range(2400):  # 10 minutes: running through every test of the module (stopped after)
    print(f"tick {i}", flush=True)
    time.sleep(0.25)
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _report(no_ps: bool) -> dict:
    from shipyard.tf import report

    def var(name, shape, ps):
        n = 1
        for d in shape:
            n *= d
        return {
            "name": name,
            "shape": shape,
            "dtype": "float32",
            "bytes": n * 4,
            "device": "" if ps is None else f"/job:ps/replica:0/task:{ps}/device:CPU:0",
            "trainable": True,
            "ps_task": ps,
        }

    def stats(relay, peers):
        return {
            "started": 1.0,
            "relays": {
                relay: {
                    p: {"bytes_in": a, "bytes_out": b, "connections": 1}
                    for p, (a, b) in peers.items()
                }
            },
            "timeline": {"interval_s": 1.0, "points": []},
        }

    if no_ps:
        return report.build(
            {"variables": [var("w:0", [3], None)]}, ["a:1"], ["algo-1"], [None], "tf2"
        )
    variables = [var("conv/kernel:0", [3, 3, 3, 32], 0), var("dense/kernel:0", [512, 10], 1)]
    peers = {"chief:0": (4000, 9000), "worker:0": (3000, 7000)}
    return report.build(
        {"variables": variables},
        ["10.0.0.1:2223", "10.0.0.2:2223"],
        ["algo-1", "algo-2"],
        [stats("ps:0", peers), stats("ps:1", {"chief:0": (100, 200), "worker:0": (50, 70)})],
        "tf2",
    )


@pytest.fixture(scope="module")
def jobs(tmp_path_factory):
    """The module's jobs, run once and inspected by every test that takes ``jobs`` (they
    were run again for each of the five, 4 jobs each). The two log tests change a log, so
    each has a job of its own (``log-pages``, ``log-fifo``); the others only read."""
    home = tmp_path_factory.mktemp("dashboard") / "shipyard-home"
    src = tmp_path_factory.mktemp("src")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SHIPYARD_HOME", str(home))
        mp.setenv("AWS_REGION", "us-east-1")
        session = shipyard.Session(home=str(home))

        def run(name, script, wait=True, report=None, count=2):
            (src / "t.py").write_text(textwrap.dedent(script))
            est = shipyard.Estimator(
                entry_point="t.py",
                source_dir=str(src),
                instance_count=count,
                instance_type="local",
                session=session,
                metric_definitions=[{"Name": "<b>loss</b>", "Regex": r"loss=([0-9.]+)"}],
                environment={"API_KEY": SECRET},
            )
            est.fit(job_name=name, wait=wait, logs=False)
            if report is not None:
                job_dir = session.control.get(name).job_dir
                with open(os.path.join(job_dir, "distribution-report.json"), "w") as fh:
                    json.dump(report, fh)

        run("ps-job", DONE_SCRIPT, report=_report(False))
        run("no-strategy", DONE_SCRIPT, report=_report(True))
        run("one-point", 'print("loss=0.500")', count=1)
        run("log-pages", DONE_SCRIPT)
        run("log-fifo", DONE_SCRIPT)
        run("live-job", RUNNING_SCRIPT, wait=False)
        try:
            yield session
        finally:
            session.control.stop("live-job")


@pytest.fixture(scope="module")
def ui(jobs):
    """``shipyard ui`` on the module's jobs (SHIPYARD_HOME is set while ``jobs`` lives)."""
    with serve_ui() as served:
        yield served


@contextlib.contextmanager
def serve_ui() -> Iterator[tuple[str, int]]:
    """``shipyard ui`` on a free port of this test's home: (base URL, port)."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "shipyard.cli", "ui", "--port", str(port)],
        env=dict(os.environ),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            urllib.request.urlopen(base + "/api/jobs", timeout=2).read()
            break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"ui did not start: {proc.communicate()[1]}") from None
            time.sleep(0.2)
    try:
        yield base, port
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def test_api_jobs_and_port_in_use(jobs, ui):
    base, port = ui
    listed = json.load(urllib.request.urlopen(base + "/api/jobs", timeout=10))
    by_name = {j["TrainingJobName"]: j for j in listed}
    assert by_name["ps-job"]["TrainingJobStatus"] == "Completed"
    assert by_name["live-job"]["TrainingJobStatus"] == "InProgress"
    page = urllib.request.urlopen(base + "/jobs/ps-job", timeout=10)
    assert "default-src 'self'" in page.headers["Content-Security-Policy"]
    busy = subprocess.run(
        [sys.executable, "-m", "shipyard.cli", "ui", "--port", str(port)],
        capture_output=True,
        text=True,
        env=dict(os.environ),
        timeout=60,
    )
    assert busy.returncode == 2 and f"port {port}" in busy.stderr and "in use" in busy.stderr


def _call(base: str, path: str, method: str = "GET", headers: dict | None = None):
    """(status, JSON body) of one request, error answers included."""
    req = urllib.request.Request(base + path, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status, json.load(resp)
    except urllib.error.HTTPError as exc:
        body = exc.read()
        return exc.code, json.loads(
            body
        ) if exc.headers.get_content_type() == "application/json" else body


def test_only_its_own_host_and_origin_and_environment_on_request(jobs, ui):
    base, port = ui
    # DNS rebinding: a foreign name that resolves to 127.0.0.1 reads nothing
    for path in ("/api/jobs", "/api/jobs/ps-job", "/", "/static/job.js"):
        status, body = _call(base, path, headers={"Host": f"attacker.example:{port}"})
        assert status == 421 and "attacker.example" in body["error"], (path, body)
        assert f"http://127.0.0.1:{port}/" in body["error"]  # says where to open it
    assert _call(base, "/api/jobs", headers={"Host": f"localhost:{port}"})[0] == 200
    # a cross-site write is refused before any route sees it; its own origin passes the guard
    status, body = _call(
        base,
        "/api/jobs",
        "POST",
        {"Origin": "http://attacker.example", "Content-Type": "text/plain"},
    )
    assert status == 403 and "cross-site" in body["error"]
    assert _call(base, "/api/jobs", "POST", {"Origin": base})[0] == 405  # no write route (yet)
    # Environment: names shown, values only when asked for
    status, described = _call(base, "/api/jobs/ps-job")
    assert status == 200 and described["Environment"] == {"API_KEY": "(hidden)"}
    assert SECRET not in json.dumps(described)
    assert _call(base, "/api/jobs/ps-job?environment=show")[1]["Environment"] == {"API_KEY": SECRET}
    status, body = _call(base, "/api/jobs/ps-job?environment=yes")
    assert status == 400 and "'show' or 'hide'" in body["error"]
    listed = {j["TrainingJobName"]: j for j in _call(base, "/api/jobs")[1]}
    assert listed["ps-job"]["Distribution"] is None  # a plain job (it said "kind" for every job)


def test_logs_are_read_a_page_at_a_time_from_a_cursor(jobs, ui):
    base, _ = ui
    (path,) = [p for h, p in jobs.control.log_files("log-pages").items() if h == "algo-1"]
    with open(path, "a") as fh:
        fh.writelines(f"big {i} {'z' * 80}\n" for i in range(40_000))  # ~3.6 MB more
        fh.write("the very last line\n")
    status, first = _call(base, "/api/jobs/log-pages/logs?host=algo-1")
    assert status == 200 and first["skipped"] > 3_000_000  # the tail, not the whole log
    assert first["lines"][-1] == {"label": "algo-1", "text": "the very last line"}
    assert not first["more"] and first["terminal"]
    # from the start: every line once, in bounded pages
    cursor, texts, pages = "algo-1:0,algo-2:0", [], 0
    while True:
        status, page = _call(base, f"/api/jobs/log-pages/logs?host=algo-1&cursor={cursor}")
        assert status == 200
        texts += [line["text"] for line in page["lines"]]
        cursor, pages = page["cursor"], pages + 1
        if not page["more"]:
            break
    assert pages > 5 and texts[-1] == "the very last line"
    assert [t for t in texts if t.startswith("big ")] == [
        f"big {i} {'z' * 80}" for i in range(40_000)
    ]
    with open(path, "a") as fh:
        fh.write("appended later\n")
    _, later = _call(base, f"/api/jobs/log-pages/logs?cursor={cursor}")
    assert [line["text"] for line in later["lines"]] == ["appended later"]
    status, body = _call(base, "/api/jobs/log-pages/logs?cursor=algo-1:oops")
    assert status == 400 and "HOST:OFFSET" in body["error"]


def test_a_log_read_that_waits_does_not_hold_up_other_requests(jobs, ui):
    """A log file that blocks its reader (a FIFO: open waits for a writer) stands for any
    slow read. Read on the event loop, it froze every other request; off it, only its own."""
    base, _ = ui
    (path,) = [p for h, p in jobs.control.log_files("log-fifo").items() if h == "algo-2"]
    os.unlink(path)
    os.mkfifo(path)
    answers: list = []
    poll = threading.Thread(
        target=lambda: answers.append(_call(base, "/api/jobs/log-fifo/logs?cursor=algo-2:0")),
        daemon=True,
    )
    poll.start()
    try:
        time.sleep(0.5)  # the poll is now waiting in open()
        assert poll.is_alive() and not answers
        status, listed = _call(base, "/api/jobs")  # hang guard: _call's 60 s timeout
        assert status == 200 and any(j["TrainingJobName"] == "log-fifo" for j in listed)
    finally:
        with open(path, "w") as fifo:  # let the waiting read go
            fifo.write("through the pipe\n")
        poll.join(timeout=60)
    assert answers and answers[0][0] == 200
    assert {"label": "algo-2", "text": "through the pipe"} in answers[0][1]["lines"], answers


def test_pages_in_headless_chromium(jobs, ui):
    if not os.access(CHROMIUM, os.X_OK):
        pytest.skip("Debian's chromium is not installed (the Makefile's set-up installs it)")
    sync_api = pytest.importorskip("playwright.sync_api")
    base, _ = ui
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    errors: list[str] = []
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        try:
            # bypass_csp: the escaping must hold on its own (an innerHTML would run the
            # onerror handler then), and the test's own probes need eval
            context = browser.new_context(viewport={"width": 1280, "height": 1000}, bypass_csp=True)
            # each wait a hang guard, not a timing (playwright's default is 30 s: CI once ran
            # past it for the ps job's chart with a unit run loading the 2 cores beside it)
            context.set_default_timeout(90_000)
            page = context.new_page()
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.on("dialog", lambda d: (errors.append("dialog: " + d.message), d.dismiss()))

            page.goto(base + "/")
            page.wait_for_selector("tr.job >> text=live-job")
            row = page.locator("tr.job", has_text="live-job")
            assert "InProgress" in row.inner_text()
            assert row.locator("td").nth(5).inner_text() == "-"  # plain: no distribution
            page.screenshot(path=str(ARTIFACTS / "jobs.png"), full_page=True)

            page.goto(base + "/jobs/live-job")
            page.wait_for_selector("#log .line")
            first = page.locator("#log .line").count()
            page.wait_for_function(
                f"document.querySelectorAll('#log .line').length > {first + 2}", timeout=30000
            )
            page.select_option("#host", "algo-2")
            page.wait_for_selector("#log .line")
            page.wait_for_function(
                "[...document.querySelectorAll('#log .label')].every(l => l.textContent.startsWith('[algo-2'))"
            )
            page.screenshot(path=str(ARTIFACTS / "live-job.png"), full_page=True)

            page.goto(base + "/jobs/ps-job")
            page.wait_for_selector("#log .line >> text=window.__pwned")
            log_text = page.inner_text("#log")
            assert EVIL in log_text  # shown as text ...
            assert page.locator("#log script, #log img").count() == 0  # ... never as HTML
            assert page.evaluate("window.__pwned === undefined")
            page.wait_for_selector(".metric svg path.series")
            assert page.locator(".metric strong").first.inner_text() == "<b>loss</b>"
            assert page.locator(".metric svg path.series").count() == 2  # one per host
            page.wait_for_selector(".heatmap rect.cell")
            assert page.locator(".heatmap rect.cell").count() == 4  # 2 peers x 2 ps
            assert page.locator(".ps-bar").count() == 2
            env = page.locator("#environment")
            assert "API_KEY" in env.inner_text() and SECRET not in page.content()
            page.click("#show-env")
            page.wait_for_selector(f"#environment >> text={SECRET}")
            page.screenshot(path=str(ARTIFACTS / "ps-job.png"), full_page=True)

            # one point: a band around its value and its own time, not -0.5..1.5 over 0..1 #
            page.goto(base + "/jobs/one-point")
            page.wait_for_selector(".metric svg circle.point")
            labels = page.locator(".metric svg text.y-label").all_text_contents()
            ticks = [float(t) for t in labels]  # ticked, a tenth of the value around it
            assert len(ticks) >= 3 and ticks[0] < 0.5 < ticks[-1] and ticks[-1] - ticks[0] <= 0.15
            assert ticks == sorted(ticks) and ticks[0] >= 0.4, labels
            x_labels = page.locator(".metric svg text.x-label").all_text_contents()
            assert len(x_labels) >= 2 and all(t.endswith(" s") for t in x_labels), x_labels
            assert float(x_labels[0][:-2]) >= 0
            page.screenshot(path=str(ARTIFACTS / "one-point.png"), full_page=True)

            page.goto(base + "/jobs/no-strategy,ps-job")
            page.wait_for_selector(".job-column >> nth=1")
            cols = page.locator(".job-column")
            assert cols.count() == 2
            assert "no variable was placed on a parameter server" in cols.nth(0).inner_text()
            assert cols.nth(1).locator(".heatmap rect.cell").count() == 4
            page.screenshot(path=str(ARTIFACTS / "compare.png"), full_page=True)

            page.goto(base + "/endpoints")
            page.wait_for_selector("#endpoints")
            page.wait_for_timeout(300)
            page.screenshot(path=str(ARTIFACTS / "endpoints.png"), full_page=True)
        finally:
            browser.close()
    assert errors == []
    assert sorted(p.name for p in ARTIFACTS.glob("*.png")) == [
        "compare.png",
        "endpoints.png",
        "jobs.png",
        "live-job.png",
        "one-point.png",
        "ps-job.png",
    ]


@pytest.mark.torch
def test_api_endpoints_report_requests_and_latency(home, tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("prometheus_client")
    from shipyard.dashboard import api
    from tests.integration.serving.serving_helpers import torchscript_archive

    archive, _ = torchscript_archive(str(tmp_path / "m"))
    predictor = shipyard.PyTorchModel(archive).deploy(1, "local", endpoint_name="dash-ep")
    try:
        for _ in range(5):
            predictor.predict(np.ones((1, 4), dtype=np.float32))
        (entry,) = api.endpoints(str(home))
        assert entry["EndpointName"] == "dash-ep" and entry["EndpointStatus"] == "InService"
        assert entry["requests"] == 5 and entry["errors"] == 0
        assert entry["latency_count"] == 5 and entry["latency_sum"] > 0
    finally:
        predictor.delete_endpoint()
