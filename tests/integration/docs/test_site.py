"""The documentation site builds strictly (a broken link, a page missing from the navigation or
an anchor that no longer exists fails), its generated reference pages are there, and its start
page and a how-to render in a real headless Chromium. Screenshots are kept under
build/test-artifacts/docs/."""

from __future__ import annotations

import functools
import http.server
import os
import pathlib
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
