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

One process, one recorder (:func:`shared`): a step may be seen by two libraries at once
(Keras ``fit`` times the batch while Horovod's optimizer wrapper reduces its gradients;
a TF1 ``Session.run`` runs a Horovod allreduce). The first library that times a step
claims the recorder (:meth:`StepRecorder.claim`); the others only add communication to
the step in progress, so no step is counted twice and the file names both.
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


_shared = {}  # type: dict[str, StepRecorder]
_shared_lock = threading.Lock()


def shared(path, source, host=None):
    """This process's recorder for ``path`` (made on first use with ``source``): every
    library of the process times into the same one."""
    with _shared_lock:
        recorder = _shared.get(path)
        if recorder is None:
            recorder = _shared[path] = StepRecorder(path, source, host)
        return recorder


def path_beside(report_path):
    """This process's step-timing file, beside the distribution report the agent names
    (``$SHIPYARD_REPORT_PATH``); None outside a shipyard job."""
    if not report_path:
        return None
    return os.path.join(os.path.dirname(report_path), PREFIX + str(os.getpid()) + ".json")


class StepRecorder:
    """One worker's steps: ``begin()``/``end()`` around a step, or ``mark()`` at each
    step's end (the time since the last mark is the step); ``comm(seconds)`` adds
    communication time to the step in progress (with the part of it that overlapped
    compute and the bytes sent, where the library sees them: DDP's buckets)."""

    def __init__(self, path, source, host=None):
        self.path = path
        self.source = source
        self.host = host
        self.started = time.time()
        self._lock = threading.Lock()
        self._steps = []  # [seconds, comm s or None(, overlap s or None, bytes or None)]
        self._count = 0
        self._total_s = 0.0
        self._first_step_at = None
        self._begin = None
        self._last = None
        self._comm = None
        self._overlap = None
        self._bytes = None
        self._owner = None  # the library that times the steps (claim())
        self._comm_sources = []  # others that added communication to them
        self._warmup = None  # steps the source knows are warm-up (else the reader decides)
        self._flushed = 0.0
        self._dirty = False
        atexit.register(self.flush)

    def claim(self, source):
        """Whether ``source`` times this process's steps: the first library to ask
        does; any other only adds communication (``comm``) to its steps."""
        with self._lock:
            if self._owner is None:
                self._owner = source
            return self._owner == source

    def begin(self):
        """A step starts now (its time runs to ``end()``)."""
        self._begin = time.perf_counter()
        self._reset_comm()

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
            self._reset_comm()
        self._last = now

    def add_group(self, seconds, count, warmup=False):
        """``count`` steps that took ``seconds`` together (an asynchronous coordinator
        sees only an epoch's end); ``warmup``: they are start-up, kept apart."""
        if count <= 0:
            return
        if warmup:
            self._warmup = (self._warmup or 0) + count
        for _ in range(count):
            self._reset_comm()
            self._add(seconds / count)

    def comm(self, seconds, overlap=None, nbytes=None, source=None):
        """Add ``seconds`` of communication the step waited for to the step in progress;
        ``overlap``: seconds of communication hidden behind compute besides; ``nbytes``:
        bytes exchanged; ``source``: the library, when it is not the one timing steps."""
        with self._lock:
            self._comm = (self._comm or 0.0) + seconds
            if overlap is not None:
                self._overlap = (self._overlap or 0.0) + overlap
            if nbytes is not None:
                self._bytes = (self._bytes or 0) + int(nbytes)
            if source and source != self._owner and source not in self._comm_sources:
                self._comm_sources.append(source)

    def _reset_comm(self):
        self._comm = self._overlap = self._bytes = None

    def _add(self, seconds):
        with self._lock:
            if self._first_step_at is None:
                self._first_step_at = time.time() - seconds
            if len(self._steps) < MAX_STEPS:
                step = [round(seconds, 6), None if self._comm is None else round(self._comm, 6)]
                if self._overlap is not None or self._bytes is not None:
                    step.append(None if self._overlap is None else round(self._overlap, 6))
                    step.append(self._bytes)
                self._steps.append(step)
            self._count += 1
            self._total_s += seconds
            self._reset_comm()
            self._dirty = True
        if time.time() - self._flushed >= FLUSH_EVERY_S:
            self.flush()

    def document(self):
        """What the file holds."""
        with self._lock:
            return {
                "schema": SCHEMA,
                "source": " + ".join([self._owner or self.source] + self._comm_sources),
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
