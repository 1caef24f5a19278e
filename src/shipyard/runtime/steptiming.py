"""Each worker's step times, measured by shipyard inside the job: one small JSON file each.

Why: ``shipyard plan`` needs the time of one training step, and a user's script rarely
logs one; the job's wall time includes the framework's start-up and the first steps'
compilation (issue 39 measured 10x too slow a step from it). The libraries that see a
step go by (the Keras ``fit`` callback of ``tf/steptiming.py``, the shipyard.ps client's
push/pull, ...) each hold a :class:`StepRecorder`, which keeps every step's seconds and
its communication seconds where the library can tell them apart, and rewrites its file
at most every :data:`FLUSH_EVERY_S` and at exit, so a job that fails or is stopped still
leaves the steps it ran. The control plane aggregates the files into describe's
``Shipyard.StepTiming`` (``planner/steps.py``).

The file sits beside the distribution report (the instance's agent directory), named
``step-timing-<pid>.json``. Stdlib only and Python 3.7-compatible: it runs inside jobs.
"""

import atexit
import json
import os
import threading
import time

SCHEMA = "shipyard.steps/v1"
PREFIX = "step-timing-"
FLUSH_EVERY_S = 2.0
MAX_STEPS = 20000  # steps kept per worker (a day-long job's file stays small); counts go on


def path_beside(report_path):
    """This process's step-timing file, beside the distribution report the agent names
    (``$SHIPYARD_REPORT_PATH``); None outside a shipyard job."""
    if not report_path:
        return None
    return os.path.join(os.path.dirname(report_path), PREFIX + str(os.getpid()) + ".json")


class StepRecorder:
    """One worker's steps: ``begin()``/``end()`` around a step, or ``mark()`` at each
    step's end (the time since the last mark is the step); ``comm(seconds)`` adds
    communication time to the step in progress."""

    def __init__(self, path, source, host=None):
        self.path = path
        self.source = source
        self.host = host
        self.started = time.time()
        self._lock = threading.Lock()
        self._steps = []  # [seconds, comm seconds or None]
        self._count = 0
        self._total_s = 0.0
        self._first_step_at = None
        self._begin = None
        self._last = None
        self._comm = None
        self._warmup = None  # steps the source knows are warm-up (else the reader decides)
        self._flushed = 0.0
        self._dirty = False
        atexit.register(self.flush)

    def begin(self):
        """A step starts now (its time runs to ``end()``)."""
        self._begin = time.perf_counter()

    def end(self):
        """The step begun by ``begin()`` ends now."""
        if self._begin is not None:
            self._add(time.perf_counter() - self._begin)
            self._begin = None

    def mark(self):
        """A step ends now: its time is the time since the previous mark (the first
        mark only starts the clock: what came before it is start-up)."""
        now = time.perf_counter()
        if self._last is not None:
            self._add(now - self._last)
        else:
            self._comm = None
        self._last = now

    def add_group(self, seconds, count, warmup=False):
        """``count`` steps that took ``seconds`` together (an asynchronous coordinator
        sees only an epoch's end); ``warmup``: they are start-up, kept apart."""
        if count <= 0:
            return
        if warmup:
            self._warmup = (self._warmup or 0) + count
        for _ in range(count):
            self._comm = None
            self._add(seconds / count)

    def comm(self, seconds):
        """Add ``seconds`` of communication to the step in progress."""
        self._comm = (self._comm or 0.0) + seconds

    def _add(self, seconds):
        with self._lock:
            if self._first_step_at is None:
                self._first_step_at = time.time() - seconds
            if len(self._steps) < MAX_STEPS:
                comm = None if self._comm is None else round(self._comm, 6)
                self._steps.append([round(seconds, 6), comm])
            self._count += 1
            self._total_s += seconds
            self._comm = None
            self._dirty = True
        if time.time() - self._flushed >= FLUSH_EVERY_S:
            self.flush()

    def document(self):
        """What the file holds."""
        with self._lock:
            return {
                "schema": SCHEMA,
                "source": self.source,
                "host": self.host,
                "pid": os.getpid(),
                "started": self.started,
                "first_step_at": self._first_step_at,
                "count": self._count,
                "total_s": round(self._total_s, 6),
                "warmup_steps": self._warmup,
                "steps": [list(s) for s in self._steps],
            }

    def flush(self):
        """Rewrite the file (atomically) if a step was added since the last write."""
        if not self._dirty or not self.path:
            return
        self._flushed = time.time()
        self._dirty = False
        tmp = self.path + ".tmp"
        try:
            with open(tmp, "w") as fh:
                json.dump(self.document(), fh)
            os.replace(tmp, self.path)
        except (OSError, ValueError):  # a full or read-only disk must not fail training
            pass
