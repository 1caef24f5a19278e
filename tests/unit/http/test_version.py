"""The HTTP layer subclasses uvicorn's protocol: constraints.txt pins the uvicorn it is
tested with, pyproject's range holds it, the code names the same one, and every server
started with another release says so (naming both) instead of failing in some request
later: the model server's worker and ``shipyard server`` alike (one guard, issue 36)."""

from __future__ import annotations

import logging
import pathlib
import re

import pytest
import uvicorn

from shipyard.http import version
from shipyard.server import asgi
from shipyard.serving import front_end

ROOT = pathlib.Path(__file__).resolve().parents[3]


def _tuple(release: str) -> tuple[int, ...]:
    return tuple(int(part) for part in release.split("."))


def test_constraints_pin_the_uvicorn_the_layer_is_tested_with() -> None:
    pins = re.findall(r"^uvicorn==(\S+)$", (ROOT / "constraints.txt").read_text(), re.M)
    assert pins == [version.UVICORN_TESTED]


def test_pyprojects_range_is_the_layers_and_holds_the_tested_release() -> None:
    pyproject = (ROOT / "pyproject.toml").read_text()
    ranges = re.findall(r'"uvicorn>=([0-9.]+),<([0-9.]+)"', pyproject)
    assert ranges == [version.UVICORN_RANGE]
    low, high = version.UVICORN_RANGE
    assert _tuple(low) <= _tuple(version.UVICORN_TESTED) < _tuple(high)


def test_the_development_environment_runs_the_tested_uvicorn() -> None:
    assert uvicorn.__version__ == version.UVICORN_TESTED


def test_another_uvicorn_is_named_with_the_supported_one() -> None:
    assert version.uvicorn_note(version.UVICORN_TESTED) is None
    note = version.uvicorn_note("0.61.0")
    assert note is not None
    assert "0.61.0" in note and f"uvicorn=={version.UVICORN_TESTED}" in note


class _NoApi:
    def handle(self, req: object) -> object:
        raise AssertionError("never called")

    def error_for(self, req: object, status: int, code: str, message: str) -> object:
        raise AssertionError("never called")


@pytest.mark.parametrize("server", ["model server worker", "shipyard server"])
def test_every_server_on_another_uvicorn_warns_at_start_up(
    server: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(uvicorn, "__version__", "0.61.0")
    with caplog.at_level(logging.WARNING, logger="shipyard.http"):
        if server == "shipyard server":
            built = asgi.Server(_NoApi())  # type: ignore[arg-type]
            built.pool.shutdown()
            built.uploads.shutdown()
        else:
            front_end.FrontEnd(lambda request: None, 1024, lambda message: b"{}")  # type: ignore[arg-type,return-value]
    assert any("uvicorn 0.61.0 is installed" in r.getMessage() for r in caplog.records)
