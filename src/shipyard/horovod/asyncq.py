"""Running ops: synchronously on the caller's thread (main channel, under the engine
lock) or queued FIFO for the communication thread (bg channel), whose results come back
through Handles.

``AsyncQueue`` is a mixin of ``Engine``.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any

from . import errors

# Row kinds.
from .handles import Handle, _Ctx


class AsyncQueue:
    def run(self, fn: Callable[[_Ctx], Any]):
        """Run ``fn(ctx)`` synchronously on the main channel."""
        if self._closed:
            raise errors.NotInitializedError()
        if not self.thread_level_multiple:
            return self.submit(fn).wait()
        with self._lock:
            return fn(self._main)

    def submit(self, fn: Callable[[_Ctx], Any], name: str = "") -> Handle:
        """Queue ``fn(ctx)`` for the communication thread (bg channel); FIFO."""
        if self._closed:
            raise errors.NotInitializedError()
        if self._thread is None:
            self._start_thread()
        h = Handle(name, self._waiters)
        self._queue.put((h, fn))
        return h

    def _start_thread(self) -> None:
        with self._lock:
            if self._thread is not None:
                return
            self._queue = queue.SimpleQueue()
            self._thread = threading.Thread(
                target=self._loop, name="shipyard-hvd-comm", daemon=True
            )
            self._thread.start()

    def _loop(self) -> None:
        ctx = self._bg
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
