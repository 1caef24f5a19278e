"""The documentation site builds strictly (a broken link, a page missing from the navigation or
an anchor that no longer exists fails), its generated reference pages are there and say what
users look up (the SDK's methods with their arguments, the CLI's zero defaults), and its pages
render in a real headless Chromium (the settings table's names on one line each). Screenshots
are kept under build/test-artifacts/docs/."""

from __future__ import annotations

import functools
import html as htmllib
import http.server
import os
import pathlib
import re
import shutil
import subprocess
import sys
import threading

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[3]
ARTIFACTS = ROOT / "build" / "test-artifacts" / "docs"
CHROMIUM = "/usr/bin/chromium"
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
]
pytestmark = pytest.mark.timeout(240)


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> pathlib.Path:
    pytest.importorskip("mkdocs", reason="the docs extra is installed by make test")
    out = tmp_path_factory.mktemp("site")
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=dict(os.environ, NO_MKDOCS_2_WARNING="1"),
        timeout=200,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "WARNING" not in done.stderr, done.stderr[-3000:]
    return out


def test_strict_build_has_every_page(site: pathlib.Path) -> None:
    for page in ("index", "getting-started", "troubleshooting", "how-to/parameter-servers"):
        assert (site / f"{page}.html").is_file(), page
    for ref in ("cli", "sdk", "settings", "api"):
        html = (site / "reference" / f"{ref}.html").read_text()
        assert "shipyard" in html
    assert "SHIPYARD_STOP_GRACE" in (site / "reference" / "settings.html").read_text()
    assert "--instance-count" in (site / "reference" / "cli.html").read_text()


def test_a_broken_link_fails_the_build(tmp_path: pathlib.Path) -> None:
    """strict is on: the same build with one page linking nowhere fails (so a real broken link
    in the docs cannot pass unnoticed)."""
    pytest.importorskip("mkdocs")
    copy = tmp_path / "repo"
    shutil.copytree(ROOT / "docs", copy / "docs")
    shutil.copy(ROOT / "mkdocs.yml", copy / "mkdocs.yml")
    page = copy / "docs" / "getting-started.md"
    page.write_text(page.read_text() + "\nSee [nowhere](no-such-page.md).\n")
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "s")],
        cwd=copy,
        capture_output=True,
        text=True,
        env=dict(os.environ, NO_MKDOCS_2_WARNING="1"),
        timeout=200,
    )
    assert done.returncode != 0
    assert "no-such-page.md" in done.stderr


def test_pages_render_in_headless_chromium(site: pathlib.Path) -> None:
    if not os.access(CHROMIUM, os.X_OK):
        pytest.skip("Debian's chromium is not installed (the Makefile's set-up installs it)")
    sync_api = pytest.importorskip("playwright.sync_api")

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:  # noqa: A002
            pass

    handler = functools.partial(Quiet, directory=str(site))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{httpd.server_address[1]}"
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    errors: list[str] = []
    try:
        with sync_api.sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
            try:
                page = browser.new_page(viewport={"width": 1280, "height": 900})
                page.on("pageerror", lambda e: errors.append(str(e)))
                page.goto(f"{base}/index.html")
                assert "shipyard" in page.title()
                assert page.locator("nav").first.is_visible()
                page.screenshot(path=str(ARTIFACTS / "start.png"), full_page=True)
                page.goto(f"{base}/how-to/parameter-servers.html")
                assert page.locator("h1").first.inner_text().startswith("Parameter servers")
                page.screenshot(path=str(ARTIFACTS / "how-to-parameter-servers.png"))
            finally:
                browser.close()
    finally:
        httpd.shutdown()
    assert errors == []
    assert (ARTIFACTS / "start.png").stat().st_size > 10_000


def _section(page: str, anchor: str) -> str:
    """The HTML from the heading with id ``anchor`` to the next heading of its level or
    above (tags stripped, entities decoded), so a check reads what a user reads."""
    found = re.search(rf'<h([1-6]) id="{re.escape(anchor)}"', page)
    assert found, f"no heading #{anchor}"
    level = int(found.group(1))
    rest = page[found.start() :]
    end = re.search(rf"<h[1-{level}][ >]", rest[3:])
    chunk = rest[: end.start() + 3] if end else rest
    return htmllib.unescape(re.sub(r"<[^>]+>", "", chunk))


def test_sdk_page_documents_methods_with_their_arguments(site: pathlib.Path) -> None:
    """Issue 41: the SDK page listed classes only; fit, deploy, attach, predict and
    delete_endpoint are there, each with its arguments' types and defaults."""
    page = (site / "reference" / "sdk.html").read_text()
    wanted = {
        "EstimatorBase-fit": ["inputs", "wait", "job_name"],
        "EstimatorBase-deploy": ["initial_instance_count", "instance_type", "endpoint_name"],
        "EstimatorBase-attach": ["training_job_name", "sagemaker_session"],
        "EstimatorBase-logs": [],
        "EstimatorBase-transformer": ["strategy", "output_path"],
        "Predictor-predict": ["data", "initial_args", "custom_attributes"],
        "Predictor-delete_endpoint": ["delete_endpoint_config"],
    }
    for anchor, arguments in wanted.items():
        text = _section(page, anchor)
        for argument in arguments:
            assert re.search(rf"\b{argument}\b", text), f"{anchor}: {argument}"
    fit = _section(page, "EstimatorBase-fit")
    assert "job_name: str | None = None" in fit  # type and default, as a user reads them
    assert "Ctrl-C" in fit  # and its meaning


def test_sdk_page_shows_tensorflows_own_text_and_arguments(site: pathlib.Path) -> None:
    """shipyard.TensorFlow showed Framework's docstring and hid instance_type in **kwargs."""
    import shipyard

    text = _section((site / "reference" / "sdk.html").read_text(), "TensorFlow")

    def words(doc: str) -> str:  # the docstring as rendered: no backticks, one space
        return " ".join(doc.replace("`", "").split()[:8])

    assert words(shipyard.TensorFlow.__doc__) in " ".join(text.split())
    assert words(shipyard.Framework.__doc__) not in " ".join(text.split())
    assert "instance_type: str | None = None" in text
    assert "instance_count" in text and "A SageMaker type" in text


def test_cli_page_shows_zero_defaults(site: pathlib.Path) -> None:
    page = (site / "reference" / "cli.html").read_text()
    row = re.search(r"<tr>\s*<td><code>--max-retry-attempts</code></td>\s*<td>(.*?)</td>", page)
    assert row, "no --max-retry-attempts row"
    assert row.group(1) == "<code>0</code>"


@pytest.mark.parametrize("width", [1280, 820])
def test_settings_names_are_never_broken_across_lines(site: pathlib.Path, width: int) -> None:
    """Each setting's name (and default) is on one line in a real browser, at a desktop and
    a narrow window (it broke mid-word: SHIPYARD_HOM / E)."""
    if not os.access(CHROMIUM, os.X_OK):
        pytest.skip("Debian's chromium is not installed (the Makefile's set-up installs it)")
    sync_api = pytest.importorskip("playwright.sync_api")

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:  # noqa: A002
            pass

    handler = functools.partial(Quiet, directory=str(site))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    try:
        with sync_api.sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
            try:
                page = browser.new_page(viewport={"width": width, "height": 900})
                page.goto(f"http://127.0.0.1:{httpd.server_address[1]}/reference/settings.html")
                cells = "article table tbody tr td:nth-child(-n+2) code"
                names = page.eval_on_selector_all(cells, "cs => cs.map(c => c.textContent)")
                broken = page.eval_on_selector_all(
                    cells,
                    "cs => cs.filter(c => c.getClientRects().length > 1).map(c => c.textContent)",
                )
                page.screenshot(path=str(ARTIFACTS / f"settings-{width}.png"))
            finally:
                browser.close()
    finally:
        httpd.shutdown()
    assert "SHIPYARD_HOME" in names
    assert broken == []
