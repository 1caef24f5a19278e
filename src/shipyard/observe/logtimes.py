"""When each log line was written: ``shipyard logs`` merges the lines of all hosts in time
order and offers ``--timestamps``, ``--since``, ``--tail`` and ``--json``.

Instances write their log files directly (no pipe to break; the raw bytes stay what every
reader reads: the FailureReason's tail, the dashboard, CloudWatch GetLogEvents), so a log
holds no time per line. The job's supervisor already reads every byte as it comes (for
metrics and live logs, every 2-20 ms); as it reads new bytes of ``algo-k.log`` it appends
one line ``<offset> <unix time>`` to the sidecar ``algo-k.log.times``: every byte before
``offset`` had been written by ``time``. A line's time is that of the first entry at or
past its end: when it was written, late by at most one poll of the supervisor. Lines past
the last entry (written after the supervisor's last read) take the file's modification
time, or, while following, the moment they were read; a log with no sidecar (a job run
before it existed) keeps its lines together, at the file's modification time.
"""

from __future__ import annotations

import bisect
import datetime as dt
import json
import os
import re
import time
from collections.abc import Iterable
from typing import NamedTuple

from shipyard.observe.logs import (
    TIMES_SUFFIX,
    LogTailer,
    host_matches,
    is_noise,
    label_host,
)
from shipyard.runtime import safepath

_SINCE = re.compile(r"^(\d+(?:\.\d+)?)([smhd])$")
_UNIT = {"s": 1, "m": 60, "h": 3600, "d": 86400}


class TimeIndex:
    """The ``(offset, time)`` entries of one log's sidecar, read incrementally."""

    def __init__(self, log_path: str) -> None:
        self.path = log_path + TIMES_SUFFIX
        self.read_to = 0
        self.partial = b""
        self.offsets: list[int] = []
        self.times: list[float] = []

    def refresh(self) -> None:
        try:
            with safepath.open_record(self.path, "rb") as fh:
                fh.seek(self.read_to)
                data = fh.read()
        except OSError:
            return
        self.read_to += len(data)
        *complete, self.partial = (self.partial + data).split(b"\n")
        for entry in complete:
            parts = entry.split()
            try:
                offset, at = int(parts[0]), float(parts[1])
            except (IndexError, ValueError):
                continue  # a torn or foreign line: its neighbours still place the rest
            if not self.offsets or offset > self.offsets[-1]:
                self.offsets.append(offset)
                self.times.append(at)

    def time_of(self, end: int) -> float | None:
        """When the line ending at ``end`` had been written, or None if not yet noted."""
        i = bisect.bisect_left(self.offsets, end)
        return self.times[i] if i < len(self.times) else None


class TimedLine(NamedTuple):
    at: float
    label: str
    text: str


class TimedReader:
    """The lines of several logs with their times, merged; ``poll`` again for what came
    since. ``live``: a line not yet in a sidecar is stamped with the moment it was read
    (following a running job) rather than its file's modification time."""

    def __init__(self, files: dict[str, str], live: bool = False) -> None:
        self.tailer = LogTailer({}, index=False)
        self.indexes: dict[str, TimeIndex] = {}
        self.last: dict[str, float] = {}
        self.live = live
        for key, path in files.items():
            self.add(key, path)

    def add(self, key: str, path: str) -> None:
        if self.tailer.files.get(key) != path:
            self.tailer.add(key, path)
            self.indexes[key] = TimeIndex(path)
            self.last[key] = 0.0

    def poll(self, flush: bool = False) -> list[TimedLine]:
        ends = self.tailer.poll_ends(flush)
        now = time.time()
        for key in {k for k, _, _, _ in ends}:
            self.indexes[key].refresh()
        order = {key: i for i, key in enumerate(self.tailer.files)}
        stamped: list[tuple[float, int, int, TimedLine]] = []
        for key, label, text, end in ends:
            at = self.indexes[key].time_of(end)
            if at is None:
                at = now if self.live else _mtime(self.tailer.files[key], now)
            at = self.last[key] = max(at, self.last[key])  # a file's lines keep their order
            stamped.append((at, order[key], len(stamped), TimedLine(at, label, text)))
        stamped.sort(key=lambda s: s[:3])
        return [s[3] for s in stamped]


def _mtime(path: str, default: float) -> float:
    try:
        return os.stat(path).st_mtime
    except OSError:
        return default


def parse_since(text: str, now: float | None = None) -> float:
    """``--since``: a duration back from now (``10s``, ``5m``, ``2h``, ``1d``) or an ISO
    8601 time (``2026-01-02T03:04:05Z``; without a zone, this machine's local time), as a
    unix time. ValueError saying what is accepted otherwise."""
    value = text.strip()
    m = _SINCE.match(value)
    if m:
        return (time.time() if now is None else now) - float(m.group(1)) * _UNIT[m.group(2)]
    try:
        when = dt.datetime.fromisoformat(value.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise ValueError(
            f"--since {text!r} is neither a duration (10s, 5m, 2h, 1d) nor an ISO 8601 "
            "time (2026-01-02T03:04:05Z)"
        ) from None
    return when.timestamp()


def stamp(at: float) -> str:
    """RFC 3339 in UTC to the millisecond, as ``docker logs --timestamps`` prints it."""
    return (
        dt.datetime.fromtimestamp(at, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
    )


def shown(
    lines: Iterable[TimedLine],
    host: str | None = None,
    show_noise: bool = False,
    since: float | None = None,
    tail: int | None = None,
) -> list[TimedLine]:
    """The lines ``shipyard logs`` prints: one host's (and its ranks'), without framework
    noise, from ``since`` on, the last ``tail`` of them (across hosts, in time order)."""
    kept = [
        ln
        for ln in lines
        if (host is None or host_matches(ln.label, host))
        and (show_noise or not is_noise(ln.text))
        and (since is None or ln.at >= since)
    ]
    if tail is not None:
        kept = kept[len(kept) - tail :] if tail else []
    return kept


def as_text(line: TimedLine, timestamps: bool = False) -> str:
    prefix = stamp(line.at) + " " if timestamps else ""
    return f"{prefix}[{line.label}] {line.text}"


def as_json(line: TimedLine) -> str:
    """One object per line: host, rank (an MPI rank's line), attempt (a retry's), time,
    line."""
    base = label_host(line.label)
    host, _, attempt = base.partition("#")
    obj: dict[str, object] = {"host": host}
    if " rank " in line.label:
        obj["rank"] = int(line.label.rsplit(" ", 1)[1])
    if attempt:
        obj["attempt"] = int(attempt)
    obj["time"] = stamp(line.at)
    obj["line"] = line.text
    return json.dumps(obj)
