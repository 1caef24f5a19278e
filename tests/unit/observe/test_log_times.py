"""Per-line times of instance logs (observe.logtimes): the supervisor's tailer notes when
it saw each chunk; readers merge hosts by those times; --since, --tail, --json."""

from __future__ import annotations

import json
import os

import pytest

from shipyard.observe.logs import TIMES_SUFFIX, LogTailer, note_seen
from shipyard.observe.logtimes import (
    TimedLine,
    TimedReader,
    as_json,
    as_text,
    parse_since,
    shown,
    stamp,
)


def test_hosts_merge_by_when_their_lines_were_seen(tmp_path):
    a, b = tmp_path / "algo-1.log", tmp_path / "algo-2.log"
    a.write_text("a early\n")
    note_seen(str(a), a.stat().st_size, 100.0)
    b.write_text("b error\n")
    note_seen(str(b), b.stat().st_size, 101.0)
    with open(a, "a") as fh:
        fh.write("a later\n")
    note_seen(str(a), a.stat().st_size, 102.0)
    lines = TimedReader({"algo-1": str(a), "algo-2": str(b)}).poll(flush=True)
    assert [(ln.label, ln.text, ln.at) for ln in lines] == [
        ("algo-1", "a early", 100.0),
        ("algo-2", "b error", 101.0),
        ("algo-1", "a later", 102.0),
    ]
    assert [ln.text for ln in shown(lines, tail=2)] == ["b error", "a later"]
    assert [ln.text for ln in shown(lines, since=101.0)] == ["b error", "a later"]
    assert [ln.text for ln in shown(lines, host="algo-1")] == ["a early", "a later"]
    assert shown(lines, tail=0) == []


def test_the_supervisors_tailer_writes_the_index_and_readers_do_not(tmp_path):
    log = tmp_path / "algo-1.log"
    log.write_text("one\ntwo\n")
    LogTailer({"algo-1": str(log)}, index=False).poll()
    assert not os.path.exists(str(log) + TIMES_SUFFIX)
    tailer = LogTailer({"algo-1": str(log)})
    tailer.poll()
    tailer.poll()  # nothing new: no entry
    entries = (tmp_path / ("algo-1.log" + TIMES_SUFFIX)).read_text().splitlines()
    assert len(entries) == 1 and entries[0].split()[0] == "8"
    assert log.read_text() == "one\ntwo\n"  # the log itself is untouched


def test_lines_past_the_index_take_the_files_time_in_their_order(tmp_path):
    log = tmp_path / "algo-1.log"
    log.write_text("x\ny\n")
    os.utime(log, (50.0, 50.0))
    lines = TimedReader({"algo-1": str(log)}).poll(flush=True)
    assert [(ln.text, ln.at) for ln in lines] == [("x", 50.0), ("y", 50.0)]


def test_since_text_and_bad_values():
    assert parse_since("10s", now=1000.0) == 990.0
    assert parse_since("5m", now=1000.0) == 700.0
    assert parse_since("1970-01-01T00:16:40Z") == 1000.0
    with pytest.raises(ValueError, match="10s, 5m, 2h, 1d"):
        parse_since("yesterday")


def test_text_and_json_forms():
    line = TimedLine(1.5, "algo-2 rank 3", "loss=0.5")
    assert stamp(1.5) == "1970-01-01T00:00:01.500Z"
    assert as_text(line) == "[algo-2 rank 3] loss=0.5"
    assert as_text(line, timestamps=True) == "1970-01-01T00:00:01.500Z [algo-2 rank 3] loss=0.5"
    assert json.loads(as_json(line)) == {
        "host": "algo-2",
        "rank": 3,
        "time": "1970-01-01T00:00:01.500Z",
        "line": "loss=0.5",
    }
    assert json.loads(as_json(TimedLine(1.5, "algo-1#2", "x")))["attempt"] == 2
