"""A shell that cleans up after this process if it dies: the cgroups' and the disks' reaper.

Why a shell: it must outlive this process (a SIGKILL leaves no Python cleanup to run) and
must not depend on it; ``/bin/sh`` with a pipe from this process is the smallest thing
that does. The script reads its stdin: the pipe's end (this process closed it, or died)
is its cue. Its own session, so a signal to the caller's process group spares it.
"""

from __future__ import annotations

import subprocess


def start(script: str, name: str, args: list[str]) -> subprocess.Popen | None:
    """``/bin/sh -c script name args...`` holding a pipe from this process, or None when
    it cannot be started (the caller then cleans up only while it lives)."""
    try:
        return subprocess.Popen(
            ["/bin/sh", "-c", script, name, *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # a signal to the caller's group does not reach it
            close_fds=True,
        )
    except OSError:
        return None
