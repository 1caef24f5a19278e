"""Running ops: synchronously on the caller's thread (main channel, under a lock) or queued
FIFO for the communication thread (bg channel), whose results come back through Handles.

``Runner`` owns the two channel contexts, the lock, the queue and the thread; what an op
does is the callable it is given (the engine's executor and fuser build those).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from . import errors
from .handles import Handle, Waiters, _Ctx

if TYPE_CHECKING:  # aliases are strings: job processes may run in Python 3.7/3.8
    from typing import TypeAlias

_Work: TypeAlias = "tuple[Handle, Callable[[_Ctx], Any]] | None"


class Runner:
    """Where and on which thread an op runs. With ``thread_level_multiple`` False the MPI
    library allows one thread in MPI at a time: then ``main`` is ``bg`` and synchronous ops
    go through the communication thread too."""

    def __init__(self, main: _Ctx, bg: _Ctx, waiters: Waiters, thread_level_multiple: bool) -> None:
        self.main = main
        self.bg = bg
        self.lock = threading.RLock()
        self.thread_level_multiple = thread_level_multiple
        self._waiters = waiters
        self._queue: queue.SimpleQueue[_Work] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self.closed = False

    def run(self, fn: Callable[[_Ctx], Any]) -> Any:
        """Run ``fn(ctx)`` synchronously on the main channel."""
        if self.closed:
            raise errors.NotInitializedError()
        if not self.thread_level_multiple:
            return self.submit(fn).wait()
        with self.lock:
            return fn(self.main)

    def submit(self, fn: Callable[[_Ctx], Any], name: str = "") -> Handle:
        """Queue ``fn(ctx)`` for the communication thread (bg channel); FIFO."""
        if self.closed:
            raise errors.NotInitializedError()
        if self._thread is None:
            self._start_thread()
        h = Handle(name, self._waiters)
        self._queue.put((h, fn))
        return h

    def close(self) -> None:
        """Refuse new ops; let the communication thread finish what is queued (30 s at most:
        a thread stuck in a collective must not block the process's exit)."""
        self.closed = True
        thread, self._thread = self._thread, None
        if thread is not None:
            self._queue.put(None)
            thread.join(timeout=30)

    def _start_thread(self) -> None:
        with self.lock:
            if self._thread is not None:
                return
            thread = threading.Thread(target=self._loop, name="shipyard-hvd-comm", daemon=True)
            self._thread = thread
            thread.start()

    def _loop(self) -> None:
        ctx = self.bg
        q = self._queue
        while True:
            item = q.get()
            if item is None:
                return
            h, fn = item
            try:
                h._set(fn(ctx))
            except BaseException as e:  # noqa: BLE001 - delivered to whoever waits on the handle
                h._fail(e)
