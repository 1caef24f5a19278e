"""Progress: plain lines when the output is not a terminal, nothing when quiet."""

from __future__ import annotations

import io

import pytest

from shipyard.observe import progress


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture(autouse=True)
def _reset(monkeypatch):
    monkeypatch.delenv("SHIPYARD_PROGRESS", raising=False)
    monkeypatch.setenv("TERM", "xterm")
    progress.set_quiet(False)
    yield
    progress.set_quiet(False)


def test_plain_lines_when_not_a_terminal():
    out = io.StringIO()
    with progress.step("Staging the code of job-1", out):
        pass
    lines = out.getvalue().splitlines()
    assert lines[0] == "shipyard: Staging the code of job-1 ..."
    assert lines[1].startswith("shipyard: Staging the code of job-1: done in ")


def test_failure_is_said_and_raised():
    out = io.StringIO()
    with pytest.raises(RuntimeError), progress.step("Uploading", out):
        raise RuntimeError("disk full")
    assert "Uploading: failed in" in out.getvalue()


def test_quiet_and_off_say_nothing(monkeypatch):
    out = io.StringIO()
    progress.set_quiet(True)
    with progress.step("x", out):
        pass
    progress.set_quiet(False)
    monkeypatch.setenv("SHIPYARD_PROGRESS", "off")
    with progress.step("y", Tty()):
        pass
    assert out.getvalue() == ""


def test_rich_on_a_terminal_nests_quietly():
    out = Tty()
    assert progress.mode(out) == "rich"
    with progress.step("outer", out), progress.step("inner", out):
        pass
    text = out.getvalue()
    assert "outer" in text and "inner" not in text
