"""The job page's utilization plots (issue 31) and plan section (issue 29), over real jobs
served by ``shipyard ui``: a measured 2-instance shipyard.ps job, a job that measured
nothing the planner can use, a job sampled once, and a job still running.

* ``/api/jobs/NAME/utilization`` gives every sample once, read a page at a time from a
  byte cursor, live while the job runs;
* ``/api/jobs/NAME/plan`` gives ``shipyard plan``'s rows, or ``plannable: false`` and
  the planner's own message for a job it cannot use, and 400 for an option that does not parse; neither
  shows an ``Environment`` value or answers a foreign ``Host``;
* in headless Chromium, a finished 2-instance job's page draws a plot per metric with a
  line per instance in legible units, the plan table and its plot, and the plan
  controls turn the planner's message into a table once the missing numbers are given.

Screenshots are kept under build/test-artifacts/dashboard/usage-plan/."""

from __future__ import annotations

import json
import os
import time

import pytest

import shipyard
from tests.integration.dashboard.test_dashboard import (
    ARTIFACTS,
    CHROMIUM,
    FLAGS,
    _call,
    serve_ui,
)
from tests.integration.test_plan_cli import SCRIPT as PS_SCRIPT
from tests.lazy import needs

SHOTS = ARTIFACTS / "usage-plan"  # (test_dashboard counts the screenshots beside it)
pytestmark = [pytest.mark.timeout(300), pytest.mark.torch, needs("torch")]
SECRET = "s3cret-of-the-plan-test"
RUNNING = """
import time
hold = bytearray(64 << 20)
for i in range(600):
    print(f"tick {i}", flush=True)
    time.sleep(0.25)
"""


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    """One home for the module: its jobs take a while to run, every test reads them."""
    path = tmp_path_factory.mktemp("usage-plan") / "shipyard-home"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SHIPYARD_HOME", str(path))
        mp.setenv("AWS_REGION", "us-east-1")
        mp.setenv("SHIPYARD_UTILIZATION_INTERVAL", "0.5")
        yield path


@pytest.fixture(scope="module")
def jobs(home, tmp_path_factory):
    session = shipyard.Session(home=str(home))
    src = tmp_path_factory.mktemp("src")

    def run(name: str, script: str, count: int = 2, wait: bool = True, **kw) -> None:
        (src / f"{name}.py").write_text(script)
        est = shipyard.PyTorch(
            entry_point=f"{name}.py",
            source_dir=str(src),
            instance_count=count,
            instance_type="local",
            session=session,
            environment={"API_KEY": SECRET},
            **kw,
        )
        est.fit(job_name=name, wait=wait, logs=False)

    run(
        "ps-job",
        PS_SCRIPT,
        distribution={"parameter_server": {"enabled": True}},
        metric_definitions=[{"Name": "step_time", "Regex": "step_time=([0-9.e-]+)"}],
    )
    run("plain", "print('no distribution, no metric')\n")
    # this machine has no GPU: the samples an instance with GPUs adds (the sampler's own
    # line format, observe.utilization), appended at the file seam
    gpu_lines = [
        {"Timestamp": time.time() + i, "Host": f"algo-{h}", "Attempt": 1,
         "GPUUtilization": 40.0 * h + i, "GPUMemoryUtilization": 10.0 * h}
        for i in range(2) for h in (1, 2)
    ]  # fmt: skip
    with open(os.path.join(session.control.get("plain").job_dir, "utilization.jsonl"), "a") as fh:
        fh.writelines(json.dumps(line) + "\n" for line in gpu_lines)
    # sampled once: the first sample comes 1 s after launch, the next 30 s later
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SHIPYARD_UTILIZATION_INTERVAL", "30")
        run("once", "import time\ntime.sleep(2.5)\n", count=1)
    run("live", RUNNING, wait=False)
    yield session
    session.control.stop("live")


@pytest.fixture(scope="module")
def ui(home):
    with serve_ui() as served:
        yield served


def _samples(base: str, name: str, cursor: int = 0) -> tuple[list[dict], int]:
    """Every sample after ``cursor``, following ``more``; (samples, next cursor)."""
    out: list[dict] = []
    while True:
        status, page = _call(base, f"/api/jobs/{name}/utilization?cursor={cursor}")
        assert status == 200, page
        out += page["samples"]
        cursor = page["cursor"]
        if not page["more"]:
            return out, cursor


def test_utilization_api_gives_each_sample_once_live_and_finished(jobs, ui):
    base, _ = ui
    samples, cursor = _samples(base, "ps-job")
    by_host: dict[str, list[dict]] = {}
    for s in samples:
        by_host.setdefault(s["Host"], []).append(s)
    assert sorted(by_host) == ["algo-1", "algo-2"]
    for host, mine in by_host.items():
        assert len(mine) >= 2, host
        assert all(s["MemoryBytes"] > 0 for s in mine)
        assert any(0 < s.get("DiskUtilization", 0) <= 100 for s in mine), mine
        assert any("CPUUtilization" in s for s in mine), mine
    job_dir = jobs.control.get("ps-job").job_dir
    assert cursor == os.path.getsize(os.path.join(job_dir, "utilization.jsonl"))
    status, again = _call(base, f"/api/jobs/ps-job/utilization?cursor={cursor}")
    assert status == 200 and again["samples"] == [] and again["terminal"]

    # a running job: a later poll from the cursor brings only the samples taken since
    deadline = time.monotonic() + 120  # hang guard
    first, cursor = _samples(base, "live")
    while not first and time.monotonic() < deadline:
        time.sleep(0.5)
        first, cursor = _samples(base, "live")
    newer: list[dict] = []
    while not newer and time.monotonic() < deadline:
        time.sleep(0.5)
        newer, _ = _samples(base, "live", cursor)
    assert first and newer, "the running job was not sampled twice"
    assert min(s["Timestamp"] for s in newer) > max(s["Timestamp"] for s in first)
    assert not _call(base, "/api/jobs/live/utilization")[1]["terminal"]

    status, body = _call(base, "/api/jobs/ps-job/utilization?cursor=algo-1:5")
    assert status == 400 and "not a byte offset" in body["error"]
    status, body = _call(base, "/api/jobs/no-such-job/utilization")
    assert status == 404 and "no-such-job" in body["error"]


def test_plan_api_rows_messages_and_bad_options(jobs, ui):
    base, port = ui
    status, plan = _call(base, "/api/jobs/ps-job/plan")
    assert status == 200 and plan["plannable"], plan
    # a local job has no rated network: two types of one family are compared
    assert plan["instance_type"] == "ml.p3.2xlarge,ml.p3.16xlarge"
    assert plan["instances"] == [1, 2, 4, 8, 16, 32, 64] and len(plan["rows"]) == 14
    measured = plan["measured"]
    assert measured["gradient_bytes"] == 4 * (256 * 512 + 512 + 512 * 8 + 8)
    # the declared metric wins over the step time shipyard measured, and says so
    assert measured["sources"]["step_time"].startswith(
        "the job's step-time metric (wins over shipyard's measured "
    )
    assert measured["distribution"] == "shipyard_ps" and "horovod" in plan["known_distributions"]
    assert SECRET not in json.dumps(plan)

    # the CLI's case, through the page's options: at 10 Mbit/s and 64 instances ps:0,
    # holding the 512 KiB weight, is the bottleneck
    status, slow = _call(
        base, "/api/jobs/ps-job/plan?instance_type=10mbit,ml.p3.16xlarge&instances=64"
    )
    assert status == 200, slow
    rows = {r["instance_type"]: r for r in slow["rows"]}
    assert rows["10mbit"]["bottleneck"] == "hot ps:0" and "'sliced'" in rows["10mbit"]["advice"]
    assert rows["10mbit"]["steps_per_s"] < rows["ml.p3.16xlarge"]["steps_per_s"]
    status, horovod = _call(base, "/api/jobs/ps-job/plan?distribution=horovod&instances=2,4")
    assert status == 200 and {r["distribution"] for r in horovod["rows"]} == {"horovod"}
    status, both = _call(base, "/api/jobs/ps-job/plan?distribution=horovod,horovod,shipyard_ps")
    assert status == 200 and both["distributions"] == ["horovod", "shipyard_ps"]
    assert len(both["rows"]) == 2 * 2 * 7  # (each distribution once) x 2 types x 7 counts

    # what the planner cannot use: its own message, what is missing and how to get it
    status, body = _call(base, "/api/jobs/live/plan")
    assert status == 200 and body["plannable"] is False and "rows" not in body
    assert "is InProgress" in body["error"] and "shipyard logs -f live" in body["error"]
    status, body = _call(base, "/api/jobs/plain/plan")
    assert not body["plannable"] and "--gradient-bytes" in body["error"], body
    status, given = _call(base, "/api/jobs/plain/plan?gradient_bytes=4000000&step_time=0.1")
    assert status == 200 and given["measured"]["sources"]["gradient_bytes"].startswith("given")

    for query, message in [
        ("instance_type=ml.zz.xlarge", "its network bandwidth is not known"),
        ("instance_type=local", "has no rated network"),
        ("instances=2,x", "instances='2,x'"),
        ("distribution=ring", "distribution 'ring' is not known"),
        ("step_time=soon", "step_time='soon'"),
        ("instancez=2", "unknown plan option"),
    ]:
        status, body = _call(base, f"/api/jobs/ps-job/plan?{query}")
        assert status == 400 and message in body["error"], (query, body)
    assert _call(base, "/api/jobs/no-such-job/plan")[0] == 404

    # the guard holds for both new routes: a foreign Host reads nothing, no write route
    for path in ("/api/jobs/ps-job/plan", "/api/jobs/ps-job/utilization"):
        status, body = _call(base, path, headers={"Host": f"attacker.example:{port}"})
        assert status == 421, (path, body)
        assert _call(base, path, "POST", {"Origin": base})[0] == 405
        assert _call(base, path, "POST", {"Origin": "http://attacker.example"})[0] == 403


def until(ready, timeout: float = 60.0) -> None:
    """Poll ``ready()`` (a hang guard, not a timing claim). The page keeps its CSP on:
    Playwright's string predicates would need 'unsafe-eval', and a CSP violation of the
    page's own must show up as a console error here."""
    deadline = time.monotonic() + timeout
    while not ready():
        assert time.monotonic() < deadline, "the page did not get there"
        time.sleep(0.2)


def test_usage_plots_and_plan_in_headless_chromium(jobs, ui):
    if not os.access(CHROMIUM, os.X_OK):
        pytest.skip("Debian's chromium is not installed (the Makefile's set-up installs it)")
    sync_api = pytest.importorskip("playwright.sync_api")
    base, _ = ui
    SHOTS.mkdir(parents=True, exist_ok=True)
    errors: list[str] = []
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 1000})
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: errors.append(str(e)))

            page.goto(base + "/jobs/ps-job")
            page.wait_for_selector(".usage[data-usage=MemoryBytes] svg path.series")
            assert page.locator(".usage[data-usage=GPUUtilization]").count() == 0  # no GPU
            for key in ("CPUUtilization", "MemoryBytes", "MemoryUtilization", "DiskUtilization"):
                card = page.locator(f".usage[data-usage={key}]")
                assert card.locator("path.series").count() == 2, key  # a line per instance
                names = card.locator(".legend span").all_text_contents()
                assert names == ["algo-1", "algo-2"], (key, names)
            labels = page.locator(".usage[data-usage=MemoryBytes] text.y-label").all_text_contents()
            assert len(labels) >= 3 and all(t.endswith(" MiB") for t in labels), labels
            assert labels[0] == "0 MiB", labels  # memory is an amount: zero on the axis
            cpu = page.locator(".usage[data-usage=CPUUtilization] text.y-label").all_text_contents()
            assert all(t.endswith(" %") for t in cpu), cpu
            rx = page.locator(".usage[data-usage=NetworkRxBytes]")
            if rx.count():  # sandboxed instances: their own interfaces' bytes, as a rate
                rates = rx.locator("text.y-label").all_text_contents()
                assert all(t.endswith((" MB/s", " kB/s")) for t in rates), rates
                assert "in all, last attempt: algo-1" in rx.inner_text()  # it has ended
            page.wait_for_selector(".plan-table tr.plan-row")
            assert page.locator(".plan-table tr.plan-row").count() == 14
            assert page.locator(".plan-plot path.series").count() == 2  # a line per type
            x_labels = page.locator(".plan-plot text.x-label").all_text_contents()
            assert x_labels == ["1", "2", "4", "8", "16", "32", "64"], x_labels  # log2 ticks
            assert page.input_value("#plan-form input[name=instance_type]") == (
                "ml.p3.2xlarge,ml.p3.16xlarge"
            )
            page.fill("#plan-form input[name=instance_type]", "10mbit")
            page.fill("#plan-form input[name=instances]", "2,64")
            page.click("#plan-run")
            until(lambda: page.locator(".plan-table tr.plan-row").count() == 2)
            last = page.locator(".plan-table tr.plan-row").nth(1)
            assert last.locator("td.bottleneck").inner_text() == "hot ps:0"
            assert SECRET not in page.content()
            page.screenshot(path=str(SHOTS / "usage-and-plan.png"), full_page=True)

            # nothing usable measured: the planner's message, then the fields it names
            page.goto(base + "/jobs/plain")
            page.wait_for_selector(".plan-message")
            for key in ("GPUUtilization", "GPUMemoryUtilization"):
                card = page.locator(f".usage[data-usage={key}]")
                assert card.locator("path.series").count() == 2, key
                assert all(
                    t.endswith(" %") for t in card.locator("text.y-label").all_text_contents()
                )
            assert "--gradient-bytes" in page.inner_text(".plan-message")
            page.click("#plan-form summary")
            page.fill("#plan-form input[name=gradient_bytes]", "4000000")
            page.fill("#plan-form input[name=step_time]", "0.1")
            page.click("#plan-run")
            page.wait_for_selector(".plan-table tr.plan-row")
            assert page.locator(".plan-message").count() == 0
            page.screenshot(path=str(SHOTS / "plan-given.png"), full_page=True)

            # one sample: each value drawn as a point; a rate waits for a second sample
            page.goto(base + "/jobs/once")
            page.wait_for_selector(".usage[data-usage=MemoryBytes] circle.point")
            assert page.locator(".usage[data-usage=MemoryBytes] circle.point").count() == 1
            rx = page.locator(".usage[data-usage=NetworkRxBytes]")
            if rx.count():
                assert "a rate needs two samples" in rx.inner_text()

            # live: the running job's plots gain points as it is sampled
            page.goto(base + "/jobs/live")
            line = page.locator(".usage[data-usage=MemoryBytes] path.series").first
            line.wait_for()

            def drawn() -> int:  # points on algo-1's line: M x,y L x,y L ...
                return (line.get_attribute("d") or "").count("L") + 1

            shown = drawn()
            until(lambda: drawn() > shown)
            assert "is InProgress" in page.inner_text(".plan-message")
            page.screenshot(path=str(SHOTS / "usage-live.png"), full_page=True)
        finally:
            browser.close()
    assert errors == []
