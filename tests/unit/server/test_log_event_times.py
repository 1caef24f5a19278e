"""Issue 41: GetLogEvents (the SDK's ``estimator.logs()``) stamped every line with the moment
the server first read the file, so a server started after a job ended gave the whole log one
time. Each event now carries the time its line was written, from the log's ``.times``
sidecar that ``shipyard logs --timestamps`` reads; lines the sidecar does not hold yet take
the file's modification time, and times never go back within a stream."""

from __future__ import annotations

import os

from shipyard.observe.logs import TIMES_SUFFIX
from shipyard.server.logs import LogsApi

GROUP = "/aws/sagemaker/TrainingJobs"
STREAM = "job/algo-1-1700000000"
T0 = 1_700_000_000.0


def _get(tmp_path, lines, sidecar, mtime):
    log = tmp_path / "algo-1.log"
    log.write_text("".join(line + "\n" for line in lines))
    if sidecar is not None:
        (tmp_path / ("algo-1.log" + TIMES_SUFFIX)).write_text(sidecar)
    os.utime(log, (mtime, mtime))
    api = LogsApi(lambda group, prefix: {STREAM: str(log)} if group == GROUP else {})
    body = {"logGroupName": GROUP, "logStreamName": STREAM, "startFromHead": True}
    return [(e["timestamp"], e["message"]) for e in api.get_log_events(body)["events"]]


def test_each_event_has_the_time_its_line_was_written(tmp_path):
    lines = ["first", "second", "third"]  # ends at bytes 6, 13, 19
    sidecar = f"6 {T0:.3f}\n13 {T0 + 60:.3f}\n"
    got = _get(tmp_path, lines, sidecar, mtime=T0 + 600)
    assert got == [
        (int(T0 * 1000), "first"),
        (int((T0 + 60) * 1000), "second"),
        (int((T0 + 600) * 1000), "third"),  # not in the sidecar yet: the file's mtime
    ]


def test_a_log_without_a_sidecar_keeps_its_files_time_not_the_servers(tmp_path):
    got = _get(tmp_path, ["a", "b"], None, mtime=T0)
    assert [ts for ts, _ in got] == [int(T0 * 1000)] * 2


def test_times_never_go_back_within_a_stream(tmp_path):
    sidecar = f"2 {T0 + 100:.3f}\n"  # "a" noted late; "b" unnoted with an older mtime
    got = _get(tmp_path, ["a", "b"], sidecar, mtime=T0)
    assert [ts for ts, _ in got] == [int((T0 + 100) * 1000)] * 2
