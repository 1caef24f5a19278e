"""Ending processes for sure: a process's descendants from ``/proc``, and waiting for
psutil processes to be gone without waiting on zombies that are not ours.

Used by the agent (its teardown), the local backend (an agent's end) and the control
plane's endpoints (a model server's end): one copy, on the ground floor, so none of them
imports another's internals for it. psutil is imported only when there is something to
stop (its import costs about 20 ms on an agent's start).
"""

from __future__ import annotations

import os
import time
from collections.abc import Collection


def terminate_descendants(grace: float, spare: Collection[int] = ()) -> None:
    """SIGTERM every descendant of this process, then SIGKILL what is left after ``grace``.

    ``spare``: pids left running (the sandbox's pasta, which carries the instance's
    traffic to S3 until the agent's final checkpoint and TensorBoard uploads are done;
    it dies with the agent)."""
    left = [pid for pid in descendants(os.getpid()) if pid not in spare]
    if not left:  # the usual end: nothing to stop, and psutil's import (20 ms) is saved
        return
    import psutil

    procs = []
    for pid in left:
        try:
            procs.append(psutil.Process(pid))
        except psutil.Error:  # ended meanwhile
            pass
    for proc in procs:
        try:
            proc.terminate()
        except psutil.Error:
            pass
    kill_survivors(procs, grace, settle=2)


def descendants(root: int) -> list[int]:
    """Every process below ``root`` (children first), from ``/proc``: what
    ``psutil.Process(root).children(recursive=True)`` finds, without importing psutil."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as fh:
                stat = fh.read()
        except OSError:  # ended while listed
            continue
        # "pid (comm) state ppid ...": comm may hold spaces and parentheses
        fields = stat[stat.rfind(b")") + 2 :].split()
        if len(fields) > 1:
            children.setdefault(int(fields[1]), []).append(int(entry))
    found: list[int] = []
    todo = [root]
    while todo:
        below = children.get(todo.pop(), [])
        found.extend(below)
        todo.extend(below)
    return found


def kill_survivors(procs: list, grace: float, settle: float) -> None:
    """Give already-signalled psutil processes ``grace`` seconds to exit, SIGKILL the
    rest, and wait up to ``settle`` seconds for them to be gone."""
    import psutil

    alive = wait_gone(procs, timeout=grace)
    for proc in alive:
        try:
            proc.kill()
        except psutil.Error:
            pass
    wait_gone(alive, timeout=settle)


def wait_gone(procs: list, timeout: float) -> list:
    """Wait up to ``timeout`` seconds for psutil processes to end; returns those still
    running. This process's own children are reaped here; a zombie that is not ours has
    ended and counts as gone. (``psutil.wait_procs`` waits until such a zombie has been
    reaped, which is up to its new parent: an orphan's is init, and an init that reaps
    every couple of seconds held every stop that long.)"""
    import psutil

    me = os.getpid()
    deadline = time.monotonic() + timeout
    delay = 0.002
    pending = list(procs)
    while True:
        running = []
        for proc in pending:
            try:
                if proc.ppid() == me:
                    proc.wait(0)  # ours: reap it (TimeoutExpired while it runs)
                elif proc.status() != psutil.STATUS_ZOMBIE:
                    running.append(proc)
            except psutil.TimeoutExpired:
                running.append(proc)
            except psutil.Error:  # gone (or reaped by its parent meanwhile)
                pass
        if not running or time.monotonic() >= deadline:
            return running
        pending = running
        time.sleep(min(delay, max(0.0, deadline - time.monotonic())))
        delay = min(delay * 2, 0.05)
