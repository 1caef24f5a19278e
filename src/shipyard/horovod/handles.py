"""What callers hold while an op runs: ``Handle`` (an async op's result), ``Waiters``
(who is blocked on one) and ``_Ctx`` (the channel and fusion buffers an op runs with).
"""

from __future__ import annotations

import threading

import numpy as np

from .channel import META_WIDTH

# Row kinds.


class Waiters:
    """How many callers are blocked on an async result: while any is, the communication
    thread stops yielding its core between MPI tests (see MPIChannel ``polite``)."""

    __slots__ = ("_count", "_lock")

    def __init__(self) -> None:
        self._count = 0
        self._lock = threading.Lock()

    def __enter__(self) -> None:
        with self._lock:
            self._count += 1

    def __exit__(self, *exc) -> None:
        with self._lock:
            self._count -= 1

    def __call__(self) -> bool:
        return self._count > 0


class Handle:
    """Result of an async op; ``wait()`` returns it (or raises the op's error)."""

    __slots__ = ("_event", "_exc", "_result", "_waiters", "name")

    def __init__(self, name: str = "", waiters: Waiters | None = None) -> None:
        self._event = threading.Event()
        self._result = None
        self._exc: BaseException | None = None
        self._waiters = waiters
        self.name = name

    def _set(self, result) -> None:
        self._result = result
        self._event.set()

    def _fail(self, exc: BaseException) -> None:
        self._exc = exc
        self._event.set()

    def done(self) -> bool:
        return self._event.is_set()

    def wait(self, timeout: float | None = None):
        if self._waiters is not None and not self._event.is_set():
            with self._waiters:
                done = self._event.wait(timeout)
        else:
            done = self._event.wait(timeout)
        if not done:
            raise TimeoutError(
                f"shipyard.horovod: async op {self.name!r} not done after {timeout} s"
            )
        if self._exc is not None:
            raise self._exc
        return self._result


class _Ctx:
    """What an op runs with: its channel and its timeline thread id."""

    __slots__ = ("ch", "fusion", "inflight", "row", "tid")

    def __init__(self, ch, tid: int) -> None:
        self.ch = ch
        self.tid = tid
        self.row = np.zeros(META_WIDTH, np.int64)
        self.fusion: dict[np.dtype, np.ndarray] = {}
        self.inflight: tuple[str, str | None, float] | None = None

    def fusion_buffer(self, dtype: np.dtype, n: int) -> np.ndarray:
        buf = self.fusion.get(dtype)
        if buf is None or buf.size < n:
            buf = np.empty(max(n, 1024), dtype)
            self.fusion[dtype] = buf
        return buf[:n]
