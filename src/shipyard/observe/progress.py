"""Progress of the long steps a user waits on (code staging, requirements install,
artifact upload, endpoint start): a rich spinner with the elapsed time on a terminal,
one plain line per step otherwise (CI logs, pipes), nothing with ``--quiet`` or
``SHIPYARD_PROGRESS=off``. Written to stderr, so a command's own output stays clean.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TextIO

_quiet: bool | None = None
_depth = 0  # steps open now: rich shows one live display at a time, so inner steps are quiet


def set_quiet(quiet: bool) -> None:
    """``--quiet``: no progress at all (the CLI's global option)."""
    global _quiet
    _quiet = quiet


def mode(stream: TextIO | None = None) -> str:
    """``off``, ``plain`` or ``rich`` for this process and stream."""
    setting = os.environ.get("SHIPYARD_PROGRESS", "auto").lower()
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
    from rich.console import Console
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    console = Console(file=stream, highlight=False)
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
