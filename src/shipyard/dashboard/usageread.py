"""A job's utilization samples read a page at a time: each poll carries a byte offset.

Why: the supervisor appends one JSON line per instance every few seconds for the job's
whole life (``observe.utilization``; a day of 4 instances is some 70,000 lines), and the
job page polls every second while the job runs. Re-reading the whole file on every poll
would make a poll cost the job's age; reading from the offset the last answer gave, at
most ``CHUNK`` bytes, keeps it bounded by what is new (as ``logread`` does for logs). The
dashboard stays stateless: the offset travels with the page as the cursor, a plain
decimal number, nothing a client can make the server execute.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from typing import Any

from shipyard.dashboard.logread import CursorError
from shipyard.observe.utilization import METRICS, UTILIZATION_NAME

CHUNK = 256 * 1024  # bytes read in one poll (about 1,000 samples)
KEPT = ("Timestamp", "Host", "Attempt", *METRICS)  # what a sample may carry to a page
_CURSOR = re.compile(r"^\d{1,18}$")


@dataclass
class UsagePage:
    samples: list[dict[str, Any]] = field(default_factory=list)
    cursor: int = 0  # the offset to pass next time
    more: bool = False  # unread bytes are left beyond this page: poll again now


def parse_cursor(text: str) -> int:
    """``1234`` -> 1234; anything else is refused with what to pass instead."""
    if _CURSOR.match(text) is None:
        raise CursorError(
            f"cursor {text[:40]!r} is not a byte offset (e.g. 1234): pass the 'cursor' "
            "of the previous answer, or none to start at the first sample"
        )
    return int(text)


def path(job_dir: str) -> str:
    return os.path.join(job_dir, UTILIZATION_NAME)


def read_page(file: str, offset: int) -> UsagePage:
    """The complete sample lines after ``offset``. A line still being written (no newline
    yet) waits for the next poll; a line that does not parse (cut by a killed supervisor)
    is passed over, as ``utilization.read`` does."""
    try:
        with open(file, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            if offset > size:  # the file was replaced: read the new one from its start
                offset = 0
            fh.seek(offset)
            data = fh.read(CHUNK)
    except OSError:  # no sample yet
        return UsagePage(cursor=offset)
    end = data.rfind(b"\n") + 1
    if end == 0 and len(data) == CHUNK:  # one line longer than a page: not a sample
        end = len(data)
    samples = []
    for raw in data[:end].splitlines():
        try:
            sample = json.loads(raw)
        except ValueError:
            continue
        if isinstance(sample, dict) and "Host" in sample and "Timestamp" in sample:
            samples.append({k: sample[k] for k in KEPT if k in sample})
    return UsagePage(samples, offset + end, offset + len(data) < size)
