"""Progress of the long steps a user waits on (code staging, requirements install,
artifact upload, endpoint start): a rich spinner with the elapsed time on a terminal,
one plain line per step otherwise (CI logs, pipes), nothing with ``--quiet`` or
``SHIPYARD_PROGRESS=off``. Written to stderr, so a command's own output stays clean.

A step with a known size (:func:`transfer`: bytes archived, bundled, uploaded) is a
bar with bytes, total, rate and ETA on a terminal; otherwise a few plain lines (the
start, then one per ~10 % or 5 s, the end), so a log of a thousand-file upload stays
a handful of lines.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, TextIO

from shipyard import settings

if TYPE_CHECKING:
    from rich.console import Console

_quiet: bool | None = None
_depth = 0  # steps open now: rich shows one live display at a time, so inner steps are quiet


def set_quiet(quiet: bool) -> None:
    """``--quiet``: no progress at all (the CLI's global option)."""
    global _quiet
    _quiet = quiet


def mode(stream: TextIO | None = None) -> str:
    """``off``, ``plain`` or ``rich`` for this process and stream."""
    setting = settings.text("SHIPYARD_PROGRESS").lower()
    if _quiet or setting == "off":
        return "off"
    if setting == "plain":
        return "plain"
    stream = stream or sys.stderr
    try:
        tty = stream.isatty()
    except (AttributeError, ValueError):
        tty = False
    return "rich" if tty and os.environ.get("TERM") != "dumb" else "plain"


@contextmanager
def step(description: str, stream: TextIO | None = None) -> Iterator[None]:
    """Show ``description`` while the block runs, then how long it took (or that it failed)."""
    global _depth
    stream = stream or sys.stderr
    how = mode(stream)
    started = time.monotonic()
    if how == "off" or (how == "rich" and _depth):
        yield
        return
    _depth += 1
    try:
        yield from _shown(how, description, stream, started)
    finally:
        _depth -= 1


def _shown(how: str, description: str, stream: TextIO, started: float) -> Iterator[None]:
    if how == "plain":
        stream.write(f"shipyard: {description} ...\n")
        stream.flush()
        ok = False
        try:
            yield
            ok = True
        finally:
            took = time.monotonic() - started
            stream.write(f"shipyard: {description}: {'done' if ok else 'failed'} in {took:.1f} s\n")
            stream.flush()
        return
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    console = stream_console(stream)
    with Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    ) as bar:
        bar.add_task(description, total=None)
        ok = False
        try:
            yield
            ok = True
        finally:
            bar.stop()
            took = time.monotonic() - started
            mark = "[green]✓[/]" if ok else "[red]✗[/]"
            console.print(f"{mark} {description} ({took:.1f} s)")


PLAIN_EVERY_FRACTION = 0.10  # a plain line at each further ~10 % ...
PLAIN_EVERY_SECONDS = 5.0  # ... or after this long without one
PLAIN_MIN_SECONDS = 1.0  # never closer together (a sub-second step: start and end only)


def human_bytes(n: float) -> str:
    """``1.5 MB``-style sizes (decimal units, as rich's bar shows them)."""
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"  # pragma: no cover


class PlainMeter:
    """Bytes done of a known total as a few log lines: the caller logs each returned
    line (``None``: nothing to say yet). Thread-safe, so parallel transfers share one."""

    def __init__(
        self, description: str, total: int, clock: Callable[[], float] | None = None
    ) -> None:
        self.description = description
        self.total = max(int(total), 0)
        self.done = 0
        self.clock = clock or time.monotonic
        self.started = self.clock()
        self._last_time = self.started
        self._last_fraction = 0.0
        self._lock = threading.Lock()

    def add(self, nbytes: int) -> str | None:
        with self._lock:
            self.done += int(nbytes)
            now = self.clock()
            fraction = self.done / self.total if self.total else 1.0
            if fraction >= 1.0:
                return None  # the end line says it
            since = now - self._last_time
            if since >= PLAIN_EVERY_SECONDS or (
                since >= PLAIN_MIN_SECONDS
                and fraction - self._last_fraction >= PLAIN_EVERY_FRACTION
            ):
                self._last_time, self._last_fraction = now, fraction
                return self.line()
            return None

    def finish(self) -> None:
        """A step that succeeded moved all it had to: the total was an estimate made
        before it (one file written by two instances is archived once, a file grew), so
        the end line says ``2 B of 2 B (100%)``, never ``1 B of 2 B (50%) ... done``."""
        with self._lock:
            self.done = self.total = max(self.done, self.total)

    def line(self, end: str | None = None) -> str:
        elapsed = max(self.clock() - self.started, 1e-6)
        rate = self.done / elapsed
        head = f"{self.description}: {human_bytes(self.done)} of {human_bytes(self.total)}"
        if self.total:
            head += f" ({100 * min(self.done / self.total, 1.0):.0f}%)"
        head += f", {human_bytes(rate)}/s"
        if end is not None:
            return f"{head}, {end} in {elapsed:.1f} s"
        if rate > 0 and self.total > self.done:
            head += f", ETA {(self.total - self.done) / rate:.0f} s"
        return head


@contextmanager
def transfer(
    description: str, total: int, stream: TextIO | None = None
) -> Iterator[Callable[[int], None]]:
    """Run a block that moves ``total`` bytes; it calls the yielded ``advance(nbytes)``
    as bytes go (from any thread: boto3 calls back from its transfer threads)."""
    global _depth
    stream = stream or sys.stderr
    how = mode(stream)
    if how == "off" or (how == "rich" and _depth):
        yield lambda nbytes: None
        return
    _depth += 1
    try:
        if how == "plain":
            yield from _plain_transfer(description, total, stream)
        else:
            yield from _rich_transfer(description, total, stream)
    finally:
        _depth -= 1


def _plain_transfer(
    description: str, total: int, stream: TextIO
) -> Iterator[Callable[[int], None]]:
    meter = PlainMeter(f"shipyard: {description}", total)

    def say(line: str) -> None:
        stream.write(line + "\n")
        stream.flush()

    def advance(nbytes: int) -> None:
        line = meter.add(nbytes)
        if line is not None:
            say(line)

    say(f"shipyard: {description}: {human_bytes(meter.total)} ...")
    ok = False
    try:
        yield advance
        ok = True
    finally:
        if ok:
            meter.finish()
        say(meter.line("done" if ok else "failed"))


def _rich_transfer(description: str, total: int, stream: TextIO) -> Iterator[Callable[[int], None]]:
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
        TransferSpeedColumn,
    )

    console = stream_console(stream)
    started = time.monotonic()
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
        console=console,
        transient=True,
    ) as bar:
        task = bar.add_task(description, total=max(total, 0))
        ok = False
        try:
            yield lambda nbytes: bar.advance(task, nbytes)
            ok = True
        finally:
            bar.refresh()
            bar.stop()
            took = time.monotonic() - started
            mark = "[green]✓[/]" if ok else "[red]✗[/]"
            console.print(f"{mark} {description} ({human_bytes(total)}, {took:.1f} s)")


def stream_console(stream: TextIO) -> Console:
    """The rich console for ``stream``; a test swaps in a recording one."""
    from rich.console import Console

    return Console(file=stream, highlight=False)
