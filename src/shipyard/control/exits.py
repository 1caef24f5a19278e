"""The attempt's wait between two looks at its instances, woken the moment one exits.

The attempt's loop (control.attempt) asks the backend how each instance is after every
wait. A fixed wait (it backs off to 20 ms) notices an instance's end up to that late,
and the job's end with it, and wakes 50 times a second for nothing while the job runs.
Where an instance is a process of this one (the local backend starts each agent as a
child), Linux gives a file descriptor that becomes readable when it exits (a pidfd):
the wait is then a ``poll`` on those descriptors, woken by the exit itself, and its
timeout only paces what has no event (the hooks' log pump, a stop request, max_run),
so it can be longer.

Only a child of this process is watched: a handle's pid is a local process's only for
the local backend (Ray's is a remote node's, the in-process test backend's a counter),
and a child's pid cannot be reused before this process reaps it. A descriptor that
wakes the wait while the backend still says the instance runs is dropped (``forget``),
so a wrong guess costs one early look, never a busy loop.
"""

from __future__ import annotations

import os
import select
import time
from collections.abc import Iterable

from shipyard.backends.api import InstanceHandle


def child_pidfd(pid: int) -> int | None:
    """A pidfd of ``pid`` when it is a child of this process, else None (no pidfd on
    this system, no such process, or someone else's)."""
    if pid <= 0 or not hasattr(os, "pidfd_open"):
        return None
    try:
        fd = os.pidfd_open(pid)
    except OSError:
        return None
    # checked after the open: the fd names one process from here on, and a pid that a
    # child of ours held cannot have been reused (this process has not reaped it)
    if _parent(pid) != os.getpid():
        os.close(fd)
        return None
    return fd


def _parent(pid: int) -> int | None:
    """The parent pid of ``pid`` (/proc/<pid>/stat's 4th field), None if unreadable."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read()
        # the command's name (2nd field, in parentheses) may hold spaces and ")"
        return int(stat.rsplit(b")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


class ExitWatch:
    """Per host, a pidfd of its instance's process where there is one; ``wait`` returns
    early when one of them exits. ``close`` (or leaving the ``with``) frees them."""

    def __init__(self, handles: Iterable[InstanceHandle]) -> None:
        self._fds: dict[str, int] = {}
        for handle in handles:
            fd = child_pidfd(handle.pid)
            if fd is not None:
                self._fds[handle.host] = fd

    @property
    def watched(self) -> set[str]:
        """The hosts whose exit wakes ``wait``."""
        return set(self._fds)

    def covers(self, hosts: Iterable[str]) -> bool:
        """Whether every one of ``hosts`` is watched (then only events need a look)."""
        return all(host in self._fds for host in hosts)

    def wait(self, timeout: float, hosts: Iterable[str]) -> set[str]:
        """Up to ``timeout`` seconds, less when one of ``hosts`` (the running ones) exits
        first; returns the hosts whose process has exited (empty on the timeout)."""
        fds = {self._fds[h]: h for h in hosts if h in self._fds}
        if not fds:
            time.sleep(timeout)
            return set()
        poller = select.poll()
        for fd in fds:
            poller.register(fd, select.POLLIN)
        ready = poller.poll(max(0, int(timeout * 1000)))
        return {fds[fd] for fd, _ in ready if fd in fds}

    def forget(self, host: str) -> None:
        """Stop watching ``host`` (it ended, or its fd woke us while it still runs)."""
        fd = self._fds.pop(host, None)
        if fd is not None:
            os.close(fd)

    def close(self) -> None:
        for host in list(self._fds):
            self.forget(host)

    def __enter__(self) -> ExitWatch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
