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


def _recording_console(monkeypatch):
    from rich.console import Console

    console = Console(record=True, force_terminal=True, width=120, file=io.StringIO())
    monkeypatch.setattr(progress, "stream_console", lambda stream: console)
    return console


def test_a_bar_with_the_total_on_a_terminal(monkeypatch):
    """On a terminal a known size is a bar: bytes done of the total, rate, ETA."""
    console = _recording_console(monkeypatch)
    total = 8_000_000
    with progress.transfer("Uploading s3://b/job/output/model.tar.gz", total, Tty()) as advance:
        for _ in range(8):
            advance(1_000_000)
    text = console.export_text()
    assert "Uploading s3://b/job/output/model.tar.gz" in text
    assert "━" in text  # the bar itself
    assert "8.0/8.0 MB" in text  # rich's DownloadColumn: done/total
    assert "✓" in text and "(8.0 MB," in text


def test_plain_lines_are_bounded_for_a_large_multi_file_transfer(monkeypatch):
    """Five thousand files as a log: a start line, one per ~10 %, an end; not 5000."""
    ticks = iter(range(1_000_000))
    monkeypatch.setattr(progress.time, "monotonic", lambda: next(ticks) * 0.01)  # 50 s in all
    out = io.StringIO()
    files = 5000
    with progress.transfer("Archiving model.tar.gz and output.tar.gz", files * 1000, out) as add:
        for _ in range(files):
            add(1000)
    lines = out.getvalue().splitlines()
    assert 10 <= len(lines) <= 12, lines
    assert "2.5 MB of 5.0 MB (50%)" in "\n".join(lines)
    assert lines[0] == "shipyard: Archiving model.tar.gz and output.tar.gz: 5.0 MB ..."
    assert lines[-1].startswith(
        "shipyard: Archiving model.tar.gz and output.tar.gz: 5.0 MB of 5.0 MB"
    )
    assert "/s, done in " in lines[-1]


def test_plain_meter_says_each_further_tenth_at_most_once_a_second():
    now = [0.0]
    meter = progress.PlainMeter("up", 10_000, clock=lambda: now[0])
    said = []
    for _ in range(1000):  # 10 B each, 0.01 s apart: 10 s in all
        now[0] += 0.01
        said.append(meter.add(10))
    lines = [line for line in said if line]
    assert len(lines) == 9, lines  # 10 %, 20 %, ... 90 %; the end line is the caller's
    assert "5.0 kB of 10.0 kB (50%), 1.0 kB/s, ETA 5 s" in lines[4]


def test_plain_meter_says_something_every_five_seconds_when_slow():
    now = [0.0]
    meter = progress.PlainMeter("up", 1000, clock=lambda: now[0])
    assert meter.add(1) is None  # 0.1 %, no time passed
    now[0] = 6.0
    line = meter.add(1)
    assert line is not None and "2 B of 1.0 kB (0%)" in line and "ETA" in line


def test_quiet_transfer_says_nothing():
    out = io.StringIO()
    progress.set_quiet(True)
    with progress.transfer("x", 10, out) as advance:
        advance(10)
    assert out.getvalue() == ""


def test_a_finished_transfer_ends_at_its_total_and_a_failed_one_where_it_stopped():
    out = io.StringIO()
    with progress.transfer("Uploading s3://b/k", 2, out) as advance:
        advance(1)  # the estimate counted a byte the step rightly skipped
    assert "Uploading s3://b/k: 2 B of 2 B (100%)" in out.getvalue().splitlines()[-1]
    assert out.getvalue().splitlines()[-1].split(", ")[-1].startswith("done in")
    out = io.StringIO()
    with pytest.raises(OSError), progress.transfer("Uploading s3://b/k", 2, out) as advance:
        advance(1)
        raise OSError("reset")
    last = out.getvalue().splitlines()[-1]
    assert "1 B of 2 B (50%)" in last and "failed in" in last


def test_saving_a_file_every_instance_wrote_ends_at_100_percent(tmp_path, monkeypatch, capsys):
    """Two instances write the same 1-byte model file: it is archived once (the first
    wins), and the save said "1 B of 2 B (50%) ... done"."""
    from shipyard.control import artifacts

    monkeypatch.setenv("SHIPYARD_PROGRESS", "plain")
    dirs = []
    for host in ("algo-1", "algo-2"):
        (tmp_path / host).mkdir()
        (tmp_path / host / "m").write_text("x")
        dirs.append((host, str(tmp_path / host)))
    model, _ = artifacts.save(str(tmp_path / "out"), "job", dirs, [])
    assert model.conflicts  # the second copy was not archived
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert "2 B of 2 B (100%)" in last and "done in" in last, last
