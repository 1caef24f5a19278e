"""Following instance log files: each line tagged with its host (and MPI rank), as
SageMaker shows them.

Instances write straight to ``logs/algo-k.log`` (durable, no pipe to break); a tailer
reads whatever is new, splits complete lines and hands ``(label, line)`` pairs on.

The label is the instance's host, except for the lines of an MPI rank: mpirun runs on
algo-1, so every rank's output lands in algo-1's log, and the rank wrapper
(``shipyard.mpi.rank``) tags each of its lines ``[algo-2 rank 3] ``. The tailer moves
that tag into the label, so the line is shown as ``[algo-2 rank 3] ...`` (not under
algo-1) and ``shipyard logs --host algo-2`` finds it.

Framework noise (TensorFlow's C++ INFO lines, ``cuInit`` failures on CPU-only hosts,
NCCL INFO) is hidden when lines are *shown* (``SHIPYARD_LOG_NOISE=show`` or
``shipyard logs --all`` shows it); the log files keep every line, and a line is only
ever hidden when it matches one of the framework patterns below, so the user's own
output is never dropped.
"""

from __future__ import annotations

import os
import re
import sys
import time
from collections.abc import Callable, Iterable
from typing import TextIO

from shipyard import settings
from shipyard.runtime import safepath

RANK_TAG = re.compile(r"^\[(algo-\d+) rank (\d+)\] ?")

# Each pattern names one framework's chatter; anchored so a user's line that merely
# mentions these words is kept.
NOISE_PATTERNS: tuple[re.Pattern[str], ...] = tuple(
    re.compile(p)
    for p in (
        # TF / absl C++ logging: "2026-01-01 12:00:00.123456: I tensorflow/..." and "I0000 00:00:..."
        r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+: [IW] (tensorflow|external/local_xla|xla)/",
        r"^[IW]\d{4} [\d:.]+ +\d+ \S+\.(cc|h):\d+\]",
        r"^WARNING: All log messages before absl::InitializeLog\(\) is called are written to STDERR",
        r"failed call to cuInit",
        r"Could not find cuda drivers on your machine",
        r"Unable to register cu(DNN|FFT|BLAS) factory",
        r"computation placer already registered",
        r"This TensorFlow binary is optimized to use available CPU instructions",
        r"^To enable the following instructions: .* rebuild TensorFlow",
        r"oneDNN custom operations are on\. You may see slightly different numerical results",
        r"TF-TRT Warning: Could not find TensorRT",
        r"^(\S+:)?\d+:\d+ \[\d+\] NCCL INFO ",
        r"^\S* ?NCCL INFO ",
    )
)


def is_noise(line: str) -> bool:
    """True for a line that is framework chatter by one of NOISE_PATTERNS."""
    return any(p.search(line) for p in NOISE_PATTERNS)


def show_noise_default() -> bool:
    return settings.text("SHIPYARD_LOG_NOISE").lower() in ("show", "1", "all", "yes")


def hidden_raw_line(line: str) -> bool:
    """Whether ``shipyard logs`` would hide this line of a host's log file (an MPI rank's
    line is judged without its ``[algo-k rank r]`` tag): for readers of the raw file, such
    as the server's CloudWatch GetLogEvents, which the SDK's ``estimator.logs()`` reads.
    ``SHIPYARD_LOG_NOISE=show`` shows everything, as for ``shipyard logs``."""
    return not show_noise_default() and is_noise(attribute("", line)[1])


def attribute(source: str, line: str) -> tuple[str, str]:
    """(label, text): a rank's tagged line moves to its own host and rank."""
    m = RANK_TAG.match(line)
    if m is None:
        return source, line
    return f"{m.group(1)} rank {m.group(2)}", line[m.end() :]


def label_host(label: str) -> str:
    """The instance a label belongs to: ``algo-2 rank 3`` -> ``algo-2``; ``algo-2#2`` stays."""
    return label.split(" ", 1)[0]


def host_matches(label: str, host: str) -> bool:
    base = label_host(label)
    return base == host or base.split("#", 1)[0] == host


TIMES_SUFFIX = ".times"


def note_seen(path: str, offset: int, at: float | None = None) -> None:
    """Append ``offset time`` to ``path``'s sidecar ``path.times`` (observe.logtimes reads
    it): the log's first ``offset`` bytes had been written by ``at`` (now by default). A
    sidecar that cannot be written costs only the times, never the log: errors dropped."""
    try:
        with safepath.open_record(path + TIMES_SUFFIX, "a") as fh:
            fh.write(f"{offset} {time.time() if at is None else at:.3f}\n")
    except OSError:
        pass


class LogTailer:
    """Incremental reader of several log files; returns only complete lines, attributed.

    ``index``: also note, beside each file, when its new bytes were first seen
    (``note_seen``; ``observe.logtimes`` reads it: the per-line times of ``shipyard logs``).
    On by default because the tailer of the job's supervisor, the one reader that sees
    every byte as it comes, keeps the index; readers that only show a log (``shipyard
    logs``, attach) pass ``index=False``."""

    def __init__(self, files: dict[str, str], from_start: bool = True, index: bool = True) -> None:
        self.index = index
        self.files = dict(files)
        self.offsets = {host: 0 for host in files}
        self.partial = {host: b"" for host in files}
        if not from_start:
            for host, path in files.items():
                try:
                    self.offsets[host] = os.path.getsize(path)
                except OSError:
                    pass

    def add(self, host: str, path: str) -> None:
        if self.files.get(host) != path:
            self.files[host] = path
            self.offsets[host] = 0
            self.partial[host] = b""

    def poll(self, flush: bool = False) -> list[tuple[str, str]]:
        return [(label, line) for _, label, line, _ in self.poll_ends(flush)]

    def poll_ends(self, flush: bool = False) -> list[tuple[str, str, str, int]]:
        """``(file key, label, line, offset just past the line)`` for each new complete
        line, file by file: the offset is what ``observe.logtimes`` finds a line's time by."""
        lines: list[tuple[str, str, str, int]] = []
        for host, path in self.files.items():
            try:
                with safepath.open_record(path, "rb") as fh:  # a link: refused
                    fh.seek(self.offsets[host])
                    data = fh.read()
            except OSError:
                continue
            if not data and not (flush and self.partial[host]):
                continue
            start = self.offsets[host] - len(self.partial[host])
            self.offsets[host] += len(data)
            if self.index and data:
                note_seen(path, self.offsets[host])
            buf = self.partial[host] + data
            *complete, rest = buf.split(b"\n")
            if flush and rest:
                complete.append(rest)
                rest = b""
            self.partial[host] = rest
            for ln in complete:
                start += len(ln) + 1
                label, text = attribute(host, ln.decode("utf-8", "replace").rstrip("\r"))
                lines.append((host, label, text, min(start, self.offsets[host])))
        return lines


def select(lines: Iterable[tuple[str, str]], host: str | None) -> list[tuple[str, str]]:
    """The lines of one instance (its own and those of its MPI ranks), or all of them."""
    return [(lb, ln) for lb, ln in lines if host is None or host_matches(lb, host)]


def print_lines(
    lines: Iterable[tuple[str, str]],
    stream: TextIO | None = None,
    show_agent: bool = True,
    show_noise: bool | None = None,
) -> int:
    """Write ``[label] line`` for each line; returns how many framework-noise lines
    were hidden (0 when ``show_noise``; default from ``SHIPYARD_LOG_NOISE``)."""
    stream = stream or sys.stdout
    if show_noise is None:
        show_noise = show_noise_default()
    out = []
    hidden = 0
    for host, line in lines:
        if not show_agent and line.startswith("[shipyard-agent]"):
            continue
        if not show_noise and is_noise(line):
            hidden += 1
            continue
        out.append(f"[{host}] {line}\n")
    if out:
        stream.write("".join(out))
        stream.flush()
    return hidden


LineSink = Callable[[list[tuple[str, str]]], None]
