"""A job's logs read a page at a time: each poll carries a byte offset per log file.

Why: the dashboard holds no state (it may run beside jobs, the CLI and other
dashboards), so the position in each log travels with the page as a cursor. Reading
from that offset, at most ``CHUNK`` bytes per file, keeps a poll's cost bounded by
what is new, however long the log has grown (a 20 MB log re-read on every poll
stalled every other request). A first poll shows the tail of each file, as
``tail -f`` does; the page says how much came before.

The cursor is plain text, ``algo-1:1234,algo-2:56``: hosts and decimal offsets,
nothing a client can make the server execute.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

from shipyard.errors import ValidationError
from shipyard.observe.logs import attribute
from shipyard.runtime import safepath

CHUNK = 256 * 1024  # bytes read from one file in one poll
TAIL = 128 * 1024  # how far before each file's end a first poll starts
_ENTRY = re.compile(r"^(algo-\d+(?:#\d+)?):(\d{1,18})$")


class CursorError(ValidationError):
    """A cursor this dashboard did not write."""


@dataclass
class Page:
    lines: list[tuple[str, str]] = field(default_factory=list)
    cursor: dict[str, int] = field(default_factory=dict)
    more: bool = False  # a file has unread bytes beyond this page: poll again now
    skipped: int = 0  # bytes before the tail a first poll started at


def parse_cursor(text: str) -> dict[str, int]:
    """``algo-1:1234,algo-2:56`` -> ``{"algo-1": 1234, "algo-2": 56}``."""
    out: dict[str, int] = {}
    for part in filter(None, text.split(",")):
        m = _ENTRY.match(part)
        if m is None:
            raise CursorError(
                f"cursor entry {part[:40]!r} is not HOST:OFFSET (e.g. algo-1:1234): "
                "pass the 'cursor' of the previous answer, or none to start at the tail"
            )
        out[m.group(1)] = int(m.group(2))
    return out


def format_cursor(cursor: dict[str, int]) -> str:
    return ",".join(f"{host}:{offset}" for host, offset in sorted(cursor.items()))


def read_page(files: dict[str, str], cursor: dict[str, int] | None, final: bool) -> Page:
    """The complete lines after ``cursor`` in each file (from each tail when None); a
    trailing line without its newline is only taken once the job is over (``final``)."""
    page = Page()
    for host, path in files.items():
        start = None if cursor is None else cursor.get(host, 0)
        offset, lines, more, skipped = _read_file(host, path, start, final)
        page.cursor[host] = offset
        page.lines.extend(lines)
        page.more = page.more or more
        page.skipped += skipped
    return page


def _read_file(
    host: str, path: str, start: int | None, final: bool
) -> tuple[int, list[tuple[str, str]], bool, int]:
    """(next offset, lines, more left, bytes skipped) for one file."""
    try:
        with safepath.open_record(path, "rb") as fh:  # a link at the name: refused
            size = os.fstat(fh.fileno()).st_size
            tail = start is None
            offset = max(0, size - TAIL) if start is None else start
            if offset > size:  # the file was replaced: read the new one from its start
                offset = 0
            if offset:  # (a pipe cannot seek, and need not at its start)
                fh.seek(offset)
            data = fh.read(CHUNK)
    except OSError:
        return start or 0, [], False, 0
    skipped = offset if tail else 0
    if tail and offset > 0:  # started inside a line: show from the next one
        cut = data.find(b"\n") + 1
        data, offset, skipped = data[cut:], offset + cut, offset + cut
    end = data.rfind(b"\n") + 1
    if end == 0 and (len(data) == CHUNK or final):  # one line longer than a chunk, or the last
        end = len(data)
    elif final and offset + len(data) >= size:
        end = len(data)
    taken = data[:end]
    lines = [
        attribute(host, raw.decode("utf-8", "replace").rstrip("\r"))
        for raw in (taken[:-1] if taken.endswith(b"\n") else taken).split(b"\n")
    ]
    return offset + end, (lines if taken else []), offset + len(data) < size, skipped
