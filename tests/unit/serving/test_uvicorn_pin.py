"""The model server's front end subclasses uvicorn's protocol: constraints.txt pins the
uvicorn it is tested with, the code names the same one, and a worker started with
another says so (naming both) instead of failing in some request later."""

from __future__ import annotations

import logging
import pathlib
import re

import pytest
import uvicorn

from shipyard.serving import front_end

ROOT = pathlib.Path(__file__).resolve().parents[3]


def test_constraints_pin_the_uvicorn_the_front_end_is_tested_with() -> None:
    pins = re.findall(r"^uvicorn==(\S+)$", (ROOT / "constraints.txt").read_text(), re.M)
    assert pins == [front_end.UVICORN_TESTED]


def test_the_development_environment_runs_the_tested_uvicorn() -> None:
    assert uvicorn.__version__ == front_end.UVICORN_TESTED


def test_another_uvicorn_is_named_with_the_supported_one() -> None:
    assert front_end.uvicorn_note(front_end.UVICORN_TESTED) is None
    note = front_end.uvicorn_note("0.61.0")
    assert note is not None
    assert "0.61.0" in note and f"uvicorn=={front_end.UVICORN_TESTED}" in note


def test_a_front_end_on_another_uvicorn_warns_at_start_up(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(uvicorn, "__version__", "0.61.0")
    with caplog.at_level(logging.WARNING, logger="shipyard.serving"):
        front_end.FrontEnd(lambda request: None, 1024, lambda message: b"{}")
    assert any("uvicorn 0.61.0 is installed" in r.getMessage() for r in caplog.records)
