"""Progress lines for channel staging: at most one every few seconds, plus the last."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable


class Progress:
    def __init__(
        self,
        label: str,
        total_objects: int,
        total_bytes: int,
        log: Callable[[str], None],
        every: float = 2.0,
    ) -> None:
        self.label = label
        self.total_objects = total_objects
        self.total_bytes = total_bytes
        self.log = log
        self.every = every
        self.objects = 0
        self.bytes = 0
        self.started = time.monotonic()
        self._last = self.started
        self._lock = threading.Lock()

    def add(self, nbytes: int) -> None:
        with self._lock:
            self.objects += 1
            self.bytes += nbytes
            now = time.monotonic()
            if now - self._last >= self.every and self.objects < self.total_objects:
                self._last = now
                self.log(self.line())

    def line(self) -> str:
        elapsed = max(time.monotonic() - self.started, 1e-6)
        return (
            f"{self.label}: {self.objects}/{self.total_objects} objects, "
            f"{self.bytes / 1e6:.1f}/{self.total_bytes / 1e6:.1f} MB "
            f"({self.bytes / 1e6 / elapsed:.1f} MB/s, {elapsed:.1f}s)"
        )
