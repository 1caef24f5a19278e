"""The dashboard for a user's daily questions (issue 41), over real jobs served by
``shipyard ui`` and read in a real headless Chromium at two window widths (1280 and
820 px):

* an unknown job URL answers HTTP 404 with a page that names the job it did not find;
* a finished job's page says nothing a running one would ("the next one comes in a few
  seconds", "so far this attempt") and does not overflow the window; heat-map labels
  have at least 4.5:1 contrast on their cells (WCAG AA);
* chart axes have ticks and honest ranges: zero on a usage axis (a 0.02 % disk wobble
  stays flat), an accuracy axis that stops at 1; the timeline has a time axis;
* the stop button (a confirm step, then a same-origin POST) stops a running job; the
  job list filters by name and status and sorts by a column; one metric of two jobs on
  one chart; the TensorBoard button starts TensorBoard for a job (``shipyard
  tensorboard``'s code path) and the dashboard ends it when it ends.

Screenshots are kept under build/test-artifacts/dashboard/daily/."""

from __future__ import annotations

import json
import os
import pathlib
import re
import time
import urllib.request

import pytest

import shipyard
from tests.integration.dashboard.test_dashboard import (
    ARTIFACTS,
    CHROMIUM,
    FLAGS,
    _call,
    _report,
    serve_ui,
)

SHOTS = ARTIFACTS / "daily"  # (test_dashboard counts the screenshots beside it)
pytestmark = pytest.mark.timeout(300)
WIDTHS = (1280, 820)
ENDED = (
    "comes in a few seconds",
    "so far this attempt",
    "sampled yet",
    "matched (metric_definitions) yet",
)

ACC_SCRIPT = r"""
import os, time
for i in range(6):
    print(f"epoch {i} train_loss={1.0 / (i + 1):.3f} accuracy={0.9 + 0.02 * i:.3f}", flush=True)
try:  # TensorBoard event files where a job's script writes them
    from tensorboard.compat.proto import event_pb2, summary_pb2
    from tensorboard.summary.writer.event_file_writer import EventFileWriter
    writer = EventFileWriter(os.path.join(os.environ["SM_OUTPUT_DIR"], "tensorboard"))
    for step in range(3):
        value = summary_pb2.Summary.Value(tag="loss", simple_value=1.0 / (step + 1))
        writer.add_event(event_pb2.Event(step=step, wall_time=time.time(), summary=summary_pb2.Summary(value=[value])))
    writer.close()
except ImportError:
    print("no tensorboard package in the instance", flush=True)
"""
LOSS_SCRIPT = """
for i in range(5):
    print(f"train_loss={2.0 - 0.3 * i:.3f}", flush=True)
"""
RUNNING = """
import time
for i in range(1200):
    print(f"tick {i}", flush=True)
    time.sleep(0.25)
"""
METRICS = [
    {"Name": "train_loss", "Regex": r"train_loss=([0-9.]+)"},
    {"Name": "accuracy", "Regex": r"accuracy=([0-9.]+)"},
]


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    path = tmp_path_factory.mktemp("daily") / "shipyard-home"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SHIPYARD_HOME", str(path))
        mp.setenv("AWS_REGION", "us-east-1")
        mp.setenv("SHIPYARD_UTILIZATION_INTERVAL", "3600")  # one sample per instance
        yield path


@pytest.fixture(scope="module")
def jobs(home, tmp_path_factory):
    session = shipyard.Session(home=str(home))
    src = tmp_path_factory.mktemp("src")

    def run(name: str, script: str, count: int = 1, wait: bool = True) -> str:
        (src / f"{name}.py").write_text(script)
        est = shipyard.Estimator(
            entry_point=f"{name}.py",
            source_dir=str(src),
            instance_count=count,
            instance_type="local",
            session=session,
            metric_definitions=METRICS,
        )
        est.fit(job_name=name, wait=wait, logs=False)
        return session.control.get(name).job_dir

    acc_dir = run("acc-job", ACC_SCRIPT)
    with open(os.path.join(acc_dir, "distribution-report.json"), "w") as fh:
        json.dump(_report(False), fh)
    # samples at the file seam (the sampler's own line format, observe.utilization): a
    # disk that wobbles by 0.01 points, and a network counter sampled once
    now = time.time()
    lines = [
        {
            "Timestamp": now + i,
            "Host": "algo-9",
            "Attempt": 1,
            "DiskUtilization": 43.21 + 0.01 * (i % 2),
        }
        for i in range(8)
    ] + [
        {
            "Timestamp": now,
            "Host": "algo-8",
            "Attempt": 1,
            "NetworkRxBytes": 123456,
            "NetworkTxBytes": 654321,
        }
    ]
    with open(os.path.join(acc_dir, "utilization.jsonl"), "a") as fh:
        fh.writelines(json.dumps(line) + "\n" for line in lines)
    run("loss-b", LOSS_SCRIPT)
    run("live-job", RUNNING, wait=False)
    run("live-other", RUNNING, wait=False)
    yield session
    for name in ("live-job", "live-other"):
        session.control.stop(name)


@pytest.fixture(scope="module")
def ui(home):
    with serve_ui() as served:
        yield served


def test_stop_api_answers_and_guards(jobs, ui):
    base, _ = ui
    status, body = _call(base, "/api/jobs/acc-job/stop", "POST", {"Origin": base})
    assert status == 409 and "already ended (Completed)" in body["error"], body
    status, body = _call(base, "/api/jobs/no-such-job/stop", "POST", {"Origin": base})
    assert status == 404 and "no-such-job" in body["error"], body
    status, body = _call(
        base, "/api/jobs/live-other/stop", "POST", {"Origin": "http://evil.example"}
    )
    assert status == 403
    assert jobs.control.get("live-other").status == "InProgress"  # refused before any route
    assert _call(base, "/api/jobs/live-other/stop")[0] == 405  # a GET changes nothing
    status, body = _call(base, "/api/jobs/loss-b/tensorboard", "POST", {"Origin": base})
    assert status == 409 and "no TensorBoard output" in body["error"], body


STAMPED = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z \[algo-1\] ")


def test_log_download_as_shipyard_logs_prints_it(jobs, ui):
    base, _ = ui
    url = base + "/api/jobs/acc-job/logs/download?timestamps=1"
    with urllib.request.urlopen(url, timeout=60) as resp:
        assert resp.headers["Content-Disposition"] == 'attachment; filename="acc-job.log"'
        lines = resp.read().decode().splitlines()
    epochs = [ln for ln in lines if "train_loss=" in ln]
    assert len(epochs) == 6 and all(STAMPED.match(ln) for ln in epochs), epochs
    assert epochs[0].endswith("[algo-1] epoch 0 train_loss=1.000 accuracy=0.900")
    with urllib.request.urlopen(url + "&format=json", timeout=60) as resp:
        objects = [json.loads(ln) for ln in resp.read().decode().splitlines()]
    assert {"host": "algo-1"}.items() <= objects[0].items() and "time" in objects[0]
    status, body = _call(base, "/api/jobs/acc-job/logs/download?host=algo-7")
    assert status == 400 and "its hosts are algo-1" in body["error"], body
    status, body = _call(base, "/api/jobs/acc-job/logs/download?format=xml")
    assert status == 400 and "format=text or format=json" in body["error"], body
    assert _call(base, "/api/jobs/nope-job/logs/download")[0] == 404


def _browser(pw):
    return pw.chromium.launch(executable_path=CHROMIUM, args=FLAGS)


def _page(browser, width: int, errors: list[str]):
    page = browser.new_page(viewport={"width": width, "height": 900})
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    return page


def _overflow(page) -> int:
    """How many CSS pixels the page is wider than its window (0: no sideways scroll)."""
    return page.evaluate("document.documentElement.scrollWidth - window.innerWidth")


def _wide(page) -> list[str]:
    """The elements that reach past the window's right edge (what to fix)."""
    return page.evaluate(
        """[...document.querySelectorAll('body *')]
        .filter(e => e.getBoundingClientRect().right > window.innerWidth + 1)
        .slice(0, 8).map(e => e.tagName + '#' + e.id + '.' + e.getAttribute('class')
          + ' ' + Math.round(e.getBoundingClientRect().right))"""
    )


def _rgb(text: str) -> tuple[float, float, float, float]:
    nums = [float(v) for v in re.findall(r"[0-9.]+", text)]
    return (nums[0], nums[1], nums[2], nums[3] if len(nums) > 3 else 1.0)


def _contrast(fg: tuple[float, ...], bg: tuple[float, ...]) -> float:
    def lum(c: tuple[float, ...]) -> float:
        lin = [
            (v / 255) / 12.92 if v / 255 <= 0.03928 else ((v / 255 + 0.055) / 1.055) ** 2.4
            for v in c[:3]
        ]
        return 0.2126 * lin[0] + 0.7152 * lin[1] + 0.0722 * lin[2]

    a, b = sorted((lum(fg), lum(bg)))
    return (b + 0.05) / (a + 0.05)


def _numbers(labels: list[str]) -> list[float]:
    return [float(re.match(r"-?[0-9.]+", t).group(0)) for t in labels]


def until(ready, timeout: float = 60.0) -> None:
    """Poll ``ready()`` (a hang guard, not a timing claim)."""
    deadline = time.monotonic() + timeout
    while not ready():
        assert time.monotonic() < deadline, "the page did not get there"
        time.sleep(0.2)


def _at_width(page, base: str, width: int) -> None:
    """Every page's checks at one window width."""
    # an unknown job: HTTP 404 and a page naming it
    for url, named in (
        ("/jobs/nope-job", "nope-job"),
        ("/jobs/acc-job,nope-job", "nope-job"),
    ):
        resp = page.goto(base + url)
        assert resp is not None and resp.status == 404, url
        page.wait_for_selector(f"#what >> text={named}")
        assert "No such training job" in page.inner_text("h1")
        assert "acc-job" not in page.inner_text("#what")
        assert _overflow(page) <= 0, (width, url, _wide(page))

    resp = page.goto(base + "/jobs/acc-job")
    assert resp is not None and resp.status == 200
    page.wait_for_selector(".metric[data-metric=accuracy] svg path.series", state="attached")
    page.wait_for_selector(".usage[data-usage=DiskUtilization] svg path.series", state="attached")
    page.wait_for_selector(".heatmap rect.cell")
    page.wait_for_selector(".timeline text.t-label")
    page.wait_for_selector(".totals")
    text = page.inner_text("main")
    for said in ENDED:  # a finished job: nothing a running job would say
        assert said not in text, (width, said)
    assert re.search(r"in all, last attempt: (algo-1 [^,]+, )?algo-8 123.5 kB", text), text
    assert "this job ended after one" in text
    # the accuracy axis: ticks, ending at 1 (not 1.021)
    acc = page.locator(".metric[data-metric=accuracy]")
    ys = _numbers(acc.locator("text.y-label").all_text_contents())
    assert len(ys) >= 3 and max(ys) == 1.0 and min(ys) <= 0.9, ys
    xs = acc.locator("text.x-label").all_text_contents()
    assert len(xs) >= 3, xs
    # a 0.01-point disk wobble: zero on the axis, so its line is flat
    disk = page.locator(".usage[data-usage=DiskUtilization]")
    labels = disk.locator("text.y-label").all_text_contents()
    assert labels[0] == "0 %" and len(labels) >= 3, labels
    wobble = disk.locator("path.series", has=page.locator("title", has_text="algo-9"))
    heights = [float(v) for v in re.findall(r",([0-9.]+)", wobble.get_attribute("d"))]
    plot_height = float(disk.locator("svg").get_attribute("viewBox").split()[3])
    assert max(heights) - min(heights) < 0.02 * plot_height, heights
    # the timeline's time axis
    ticks = page.locator(".timeline text.t-label").all_text_contents()
    assert len(ticks) >= 3 and ticks[0] == "0 s" and all(t.endswith(" s") for t in ticks)
    # heat-map labels readable on their cells
    cells = page.locator(".heatmap rect.cell")
    labels = page.locator(".heatmap text.cell-label")
    assert cells.count() == labels.count() == 4
    for i in range(4):
        r, g, b, a = _rgb(cells.nth(i).get_attribute("fill"))
        back = tuple(255 - a * (255 - c) for c in (r, g, b))  # over the white card
        fill = labels.nth(i).evaluate("t => getComputedStyle(t).fill")
        assert _contrast(_rgb(fill), back) >= 4.5, (i, fill, back)
    # zoom: a drag across the plot narrows its x axis to the points inside; a double-click undoes it
    assert acc.locator("circle.point").count() == 6
    acc.locator("svg").scroll_into_view_if_needed()  # the mouse moves inside the window
    box = acc.locator("svg").bounding_box()
    mid = box["y"] + box["height"] / 2
    page.mouse.move(box["x"] + 0.45 * box["width"], mid)
    page.mouse.down()
    page.mouse.move(box["x"] + 0.8 * box["width"], mid, steps=4)
    page.mouse.up()
    acc = page.locator(".metric[data-metric=accuracy][data-zoomed='1']")
    acc.wait_for()
    assert 1 <= acc.locator("circle.point").count() < 6
    assert acc.locator("text.x-label").all_text_contents() != xs
    acc.locator("svg").dblclick()
    acc = page.locator(".metric[data-metric=accuracy][data-zoomed='0']")
    acc.wait_for()
    assert acc.locator("circle.point").count() == 6
    # smoothing, as TensorBoard's: the raw line stays, faint, under the smoothed one
    loss = page.locator(".metric[data-metric=train_loss]")
    assert loss.locator("path.raw").count() == 0
    page.fill("#smoothing", "0.9")
    loss.locator("path.raw").wait_for(state="attached")
    raw, smooth = (
        loss.locator("path.raw").get_attribute("d"),
        loss.locator("path.series").get_attribute("d"),
    )
    assert raw.split(" ")[0] == smooth.split(" ")[0] and raw != smooth  # debiased: same start
    assert page.inner_text("#smoothing-value") == "0.90"
    # a finished job has no stop button; it has a TensorBoard one
    assert page.locator("#stop").count() == 0 and page.locator("#tensorboard").count() == 1
    assert _overflow(page) <= 0, (width, _wide(page))
    page.screenshot(path=str(SHOTS / f"finished-{width}.png"), full_page=True)

    # one metric of two jobs on one chart
    page.goto(base + "/jobs/acc-job,loss-b")
    page.wait_for_selector("#overlay svg path.series", state="attached")
    assert page.input_value("#overlay-metric") == "train_loss"  # the one both have
    assert page.locator("#overlay path.series").count() == 2
    assert page.locator("#overlay .legend span").all_text_contents() == [
        "acc-job",
        "loss-b",
    ]
    page.fill("#overlay-smoothing", "0.6")
    until(lambda: page.locator("#overlay path.raw").count() == 2)
    page.select_option("#overlay-metric", "accuracy")
    until(lambda: page.locator("#overlay path.series").count() == 1)
    assert _overflow(page) <= 0, (width, _wide(page))
    page.screenshot(path=str(SHOTS / f"overlay-{width}.png"), full_page=True)

    # the job list: filter by name and status, sort by a column
    page.goto(base + "/")
    page.wait_for_selector("tr.job >> text=acc-job")
    assert page.locator("tr.job").count() == 4
    page.fill("#filter", "live")
    until(lambda: page.locator("tr.job").count() == 2)
    page.fill("#filter", "")
    page.select_option("#status-filter", "Completed")
    until(lambda: page.locator("tr.job").count() == 2)
    page.click("th[data-sort=name]")
    names = lambda: page.locator("tr.job td:nth-child(2)").all_text_contents()  # noqa: E731
    until(lambda: names() == ["acc-job", "loss-b"])
    page.click("th[data-sort=name]")
    until(lambda: names() == ["loss-b", "acc-job"])
    assert page.get_attribute("th[data-sort=name]", "aria-sort") == "descending"
    page.fill("#filter", "zzz")
    page.wait_for_selector("#empty >> text=No job matches")
    page.reload()  # the filter and sort are kept in the URL
    page.wait_for_selector("#empty >> text=No job matches")
    assert page.input_value("#filter") == "zzz"
    assert _overflow(page) <= 0, (width, _wide(page))
    page.goto(base + "/")
    page.wait_for_selector("tr.job >> text=acc-job")
    assert _overflow(page) <= 0, (width, _wide(page))
    page.screenshot(path=str(SHOTS / f"jobs-{width}.png"), full_page=True)


def test_job_pages_at_two_widths(jobs, ui):
    if not os.access(CHROMIUM, os.X_OK):
        pytest.skip("Debian's chromium is not installed (the Makefile's set-up installs it)")
    sync_api = pytest.importorskip("playwright.sync_api")
    base, _ = ui
    SHOTS.mkdir(parents=True, exist_ok=True)
    errors: list[str] = []
    with sync_api.sync_playwright() as pw:
        browser = _browser(pw)
        try:
            for width in WIDTHS:
                page = _page(browser, width, errors)
                _at_width(page, base, width)
                page.close()
        finally:
            browser.close()
    # the 404 pages' own document load is the one console error a browser logs for them
    assert [e for e in errors if "404" not in e] == []


def test_stop_button_stops_a_running_job(jobs, ui):
    if not os.access(CHROMIUM, os.X_OK):
        pytest.skip("Debian's chromium is not installed (the Makefile's set-up installs it)")
    sync_api = pytest.importorskip("playwright.sync_api")
    base, _ = ui
    SHOTS.mkdir(parents=True, exist_ok=True)
    errors: list[str] = []
    with sync_api.sync_playwright() as pw:
        browser = _browser(pw)
        try:
            page = _page(browser, 820, errors)
            page.goto(base + "/jobs/live-job")
            page.wait_for_selector("#log .line")
            with page.expect_download() as info:  # the log link: a file with times
                page.click("#log-download")
            assert info.value.suggested_filename == "live-job.log"
            first = pathlib.Path(info.value.path()).read_text().splitlines()[0]
            assert STAMPED.match(first), first
            page.click("#stop")
            page.wait_for_selector("#stop-confirm")
            page.click("#stop-cancel")  # the confirm step: cancelled, nothing sent
            page.wait_for_selector("#stop")
            assert jobs.control.get("live-job").status == "InProgress"
            page.click("#stop")
            assert "Stop live-job?" in page.inner_text("#actions")
            page.click("#stop-confirm")
            page.wait_for_selector("#stop-message >> text=stop requested")
            until(lambda: jobs.control.get("live-job").status == "Stopped", timeout=90)
            page.wait_for_selector("#summary .status-Stopped", timeout=30000)
            assert page.locator("#stop").count() == 0
            page.screenshot(path=str(SHOTS / "stopped.png"), full_page=True)
        finally:
            browser.close()
    assert errors == []


def test_tensorboard_button_starts_one_and_the_dashboard_ends_it(jobs, home):
    pytest.importorskip("tensorboard")
    if not os.access(CHROMIUM, os.X_OK):
        pytest.skip("Debian's chromium is not installed (the Makefile's set-up installs it)")
    sync_api = pytest.importorskip("playwright.sync_api")
    errors: list[str] = []
    with serve_ui() as (base, _), sync_api.sync_playwright() as pw:
        browser = _browser(pw)
        try:
            page = _page(browser, 1280, errors)
            page.goto(base + "/jobs/loss-b")
            page.click("#tensorboard")
            page.wait_for_selector("#tensorboard-error >> text=no TensorBoard output")
            page.goto(base + "/jobs/acc-job")
            page.click("#tensorboard")
            link = page.locator("#tensorboard-link")
            link.wait_for(timeout=90000)
            url = link.get_attribute("href")
            port = int(url.rsplit(":", 1)[1].strip("/"))
            assert url == f"http://127.0.0.1:{port}/"
            runs: list = []

            def listed() -> bool:
                with urllib.request.urlopen(url + "data/runs", timeout=10) as resp:
                    runs[:] = json.load(resp)
                return bool(runs)

            until(listed, timeout=90)
            assert all(r.startswith("acc-job") for r in runs), runs
            # asked again: the same TensorBoard, not a second one
            status, body = _call(base, "/api/jobs/acc-job/tensorboard", "POST", {"Origin": base})
            assert status == 200 and body["port"] == port
        finally:
            browser.close()
    # loss-b's answer (409, shown on the page as text) is the one a browser logs
    assert [e for e in errors if "409" not in e] == []
    # the dashboard has ended: so has its TensorBoard
    with pytest.raises(OSError):
        urllib.request.urlopen(url, timeout=5)
