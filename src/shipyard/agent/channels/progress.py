"""Progress lines for channel staging, written into the instance log: bytes done of the
total, the rate and an ETA, at most one line per further ~10 % or every 5 s, plus the
last, so a channel of thousands of files stays a dozen lines."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

EVERY_FRACTION = 0.10
EVERY_SECONDS = 5.0
MIN_SECONDS = 1.0  # lines never closer together: a fast channel logs its start and end


def _mb(n: float) -> str:
    return f"{n / 1e6:.1f}"


class Progress:
    def __init__(
        self,
        label: str,
        total_objects: int,
        total_bytes: int,
        log: Callable[[str], None],
        every: float = EVERY_SECONDS,
        every_fraction: float = EVERY_FRACTION,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.label = label
        self.total_objects = total_objects
        self.total_bytes = total_bytes
        self.log = log
        self.every = every
        self.every_fraction = every_fraction
        self.clock = clock
        self.objects = 0
        self.bytes = 0
        self.started = clock()
        self._last = self.started
        self._last_fraction = 0.0
        self._lock = threading.Lock()

    def _fraction(self) -> float:
        if self.total_bytes:
            return self.bytes / self.total_bytes
        return self.objects / self.total_objects if self.total_objects else 1.0

    def add(self, nbytes: int) -> None:
        with self._lock:
            self.objects += 1
            self.bytes += nbytes
            now = self.clock()
            fraction = self._fraction()
            if self.objects >= self.total_objects:
                return  # the caller logs the last line
            since = now - self._last
            if since >= self.every or (
                since >= MIN_SECONDS and fraction - self._last_fraction >= self.every_fraction
            ):
                self._last, self._last_fraction = now, fraction
                self.log(self.line())

    def line(self) -> str:
        elapsed = max(self.clock() - self.started, 1e-6)
        rate = self.bytes / elapsed
        text = (
            f"{self.label}: {_mb(self.bytes)}/{_mb(self.total_bytes)} MB "
            f"({100 * min(self._fraction(), 1.0):.0f}%), "
            f"{self.objects}/{self.total_objects} objects, {_mb(rate)} MB/s, {elapsed:.1f}s"
        )
        if 0 < rate and self.bytes < self.total_bytes:
            text += f", ETA {(self.total_bytes - self.bytes) / rate:.0f}s"
        return text
