"""Following instance log files: each line tagged with its host, as SageMaker shows them.

Instances write straight to ``logs/algo-k.log`` (durable, no pipe to break); a tailer
reads whatever is new, splits complete lines and hands ``(host, line)`` pairs on.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterable
from typing import TextIO


class LogTailer:
    """Incremental reader of several log files; returns only complete lines."""

    def __init__(self, files: dict[str, str], from_start: bool = True) -> None:
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
        lines: list[tuple[str, str]] = []
        for host, path in self.files.items():
            try:
                with open(path, "rb") as fh:
                    fh.seek(self.offsets[host])
                    data = fh.read()
            except OSError:
                continue
            if not data and not (flush and self.partial[host]):
                continue
            self.offsets[host] += len(data)
            buf = self.partial[host] + data
            *complete, rest = buf.split(b"\n")
            if flush and rest:
                complete.append(rest)
                rest = b""
            self.partial[host] = rest
            lines.extend((host, ln.decode("utf-8", "replace").rstrip("\r")) for ln in complete)
        return lines


def print_lines(
    lines: Iterable[tuple[str, str]], stream: TextIO | None = None, show_agent: bool = True
) -> None:
    stream = stream or sys.stdout
    out = []
    for host, line in lines:
        if not show_agent and line.startswith("[shipyard-agent]"):
            continue
        out.append(f"[{host}] {line}\n")
    if out:
        stream.write("".join(out))
        stream.flush()


LineSink = Callable[[list[tuple[str, str]]], None]
