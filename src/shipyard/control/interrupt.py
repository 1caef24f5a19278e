"""SIGTERM handled as Ctrl-C while a job is supervised in the foreground.

A scheduler, a container runtime or ``kill`` ends a process with SIGTERM, whose default
action kills the interpreter at once: the job would stay InProgress until some reader
reconciled it as Failed, and its instances would outlive it. Inside
:func:`terminate_as_interrupt` a SIGTERM raises :class:`Terminated` (a KeyboardInterrupt),
so the supervisor takes the Ctrl-C path: every instance stopped, status Stopped. A
further SIGTERM during that cleanup is ignored (the sender's SIGKILL deadline still
applies); the previous disposition comes back when the block ends.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager

EXIT_TERMINATED = 128 + int(signal.SIGTERM)


class Terminated(KeyboardInterrupt):
    """SIGTERM arrived: stop the job exactly as Ctrl-C does; callers may tell them apart."""

    signum = int(signal.SIGTERM)


@contextmanager
def terminate_as_interrupt() -> Iterator[None]:
    """Turn SIGTERM into :class:`Terminated` for the duration of the block.

    Only in the main thread (the only one that may set handlers), and only where SIGTERM
    still has its default action: a program that installed its own handler keeps it.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGTERM)
    if previous is not signal.SIG_DFL:
        yield
        return
    raised = False

    def on_sigterm(_signum: int, _frame: object) -> None:
        nonlocal raised
        if raised:  # already stopping: let the cleanup finish
            return
        raised = True
        raise Terminated()

    signal.signal(signal.SIGTERM, on_sigterm)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
