"""Chrome-trace timeline of collective operations (Horovod's ``HOROVOD_TIMELINE``).

Open the file in chrome://tracing or https://ui.perfetto.dev. Format: the Trace Event
"JSON Array Format"; one complete ("ph": "X") event per phase of each op, with

    name  ALLREDUCE | ALLGATHER | BROADCAST | ALLTOALL | BARRIER | JOIN | ...
    cat   "negotiate" (metadata exchange) or "collective" (data movement) or "op" (whole op)
    pid   the rank (process_name metadata says "rank R (host)")
    tid   0 = the calling thread's channel, 1 = the background communication thread
    ts/dur microseconds since rank 0's init (ranks share rank 0's wall-clock origin)
    args  tensor (name or names), bytes, dtype, shape, op, ...

Files: every rank streams its own events to ``<stem>.rank<R><suffix>`` as they happen
(a crash leaves a readable trace: chrome://tracing accepts a missing closing bracket), and
at ``hvd.shutdown()`` rank 0 gathers all events and writes the merged trace to the path
itself. With one rank only the path is written.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

MAX_EVENTS_IN_MEMORY = 1_000_000


def rank_path(path: str | os.PathLike, rank: int) -> Path:
    p = Path(path)
    suffix = p.suffix or ".json"
    stem = p.name[: -len(p.suffix)] if p.suffix else p.name
    return p.with_name(f"{stem}.rank{rank}{suffix}")


def now_us() -> float:
    return time.time() * 1e6


class TimelineSlot:
    """The engine's current timeline (or None), one object shared by the parts that record
    into it: ``hvd.start_timeline`` / ``stop_timeline`` swap what it holds while the
    negotiator, executor and fuser keep the same slot (an attribute read per op, no call)."""

    __slots__ = ("current",)

    def __init__(self) -> None:
        self.current: Timeline | None = None


class Timeline:
    def __init__(
        self, path: str | os.PathLike, rank: int, size: int, hostname: str, origin_us: float
    ):
        self.path = Path(path)
        self.rank = rank
        self.size = size
        self.origin_us = origin_us
        self._lock = threading.Lock()
        self._events: list[dict] = []
        self._dropped = 0
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._stream_path = self.path if size == 1 else rank_path(self.path, rank)
        self._fh = open(self._stream_path, "w", encoding="utf-8")  # noqa: SIM115 - streamed until close_stream()
        self._fh.write("[\n")
        self._closed = False
        self._meta("process_name", {"name": f"rank {rank} ({hostname})"})
        self._meta("process_sort_index", {"sort_index": rank})
        self._meta("thread_name", {"name": "caller"}, tid=0)
        self._meta("thread_name", {"name": "comm thread"}, tid=1)

    def _meta(self, name: str, args: dict, tid: int = 0) -> None:
        self._emit({"name": name, "ph": "M", "pid": self.rank, "tid": tid, "args": args})

    def _emit(self, ev: dict) -> None:
        with self._lock:
            if self._closed:
                return
            if len(self._events) < MAX_EVENTS_IN_MEMORY:
                self._events.append(ev)
            else:
                self._dropped += 1
            self._fh.write(json.dumps(ev, separators=(",", ":")) + ",\n")

    def complete(
        self,
        name: str,
        cat: str,
        start_us: float,
        end_us: float,
        tid: int,
        args: dict | None = None,
    ) -> None:
        ev = {
            "name": name,
            "cat": cat,
            "ph": "X",
            "ts": round(start_us - self.origin_us, 3),
            "dur": round(max(end_us - start_us, 0.0), 3),
            "pid": self.rank,
            "tid": tid,
        }
        if args:
            ev["args"] = args
        self._emit(ev)

    def instant(self, name: str, tid: int = 0, args: dict | None = None) -> None:
        ev = {
            "name": name,
            "ph": "i",
            "s": "t",
            "ts": round(now_us() - self.origin_us, 3),
            "pid": self.rank,
            "tid": tid,
        }
        if args:
            ev["args"] = args
        self._emit(ev)

    def events(self) -> list[dict]:
        with self._lock:
            return list(self._events)

    def close_stream(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            # Valid JSON: a final metadata event without a trailing comma, then the bracket.
            last = {
                "name": "trace_end",
                "ph": "M",
                "pid": self.rank,
                "tid": 0,
                "args": {"dropped_events": self._dropped},
            }
            self._fh.write(json.dumps(last, separators=(",", ":")) + "\n]\n")
            self._fh.close()

    def write_merged(self, per_rank_events: list[list[dict]]) -> None:
        """Rank 0 only: write every rank's events into ``self.path``."""
        tmp = self.path.with_name(self.path.name + ".tmp")
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write("[\n")
            first = True
            for events in per_rank_events:
                for ev in events:
                    if not first:
                        fh.write(",\n")
                    fh.write(json.dumps(ev, separators=(",", ":")))
                    first = False
            fh.write("\n]\n")
        os.replace(tmp, self.path)
