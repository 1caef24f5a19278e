"""A job that filled the disk under its ``/opt/ml``: the FailureReason names the disk.

A script that runs out of disk dies with ``OSError: [Errno 28] No space left on device``
somewhere in a traceback; the user cannot tell from it which disk, how big it is, or
that on this machine it is not a volume of ``VolumeSizeInGB`` at all. An instance's
``/opt/ml`` is its tree under the job's directory, on the host's filesystem, shared with
the host and every other instance and job, with no size of its own (issue 37, measured
options in docs/decisions.md); describe says so in ``Shipyard.MissingProtections``
(:data:`NO_VOLUME`), and a failure whose text says the disk was full gets a first line
naming that filesystem, its mount point and what is free on it now (:func:`verdict`).
"""

from __future__ import annotations

import os
import re

NO_VOLUME = (
    "no disk of VolumeSizeInGB: /opt/ml is the instance's tree on the host's filesystem, "
    "shared with the host and the other instances, with no size limit of its own"
)
_FULL = re.compile(r"\[Errno (28|122)\]|No space left on device|Disk quota exceeded|ENOSPC")


def verdict(failure_text: str, tree: str) -> str | None:
    """The first line of a FailureReason whose text says a disk was full, naming the
    filesystem under the instance's ``/opt/ml`` (``tree`` on the host); None otherwise."""
    if not _FULL.search(failure_text):
        return None
    try:
        stat = os.statvfs(tree)
        free = _size(stat.f_bavail * stat.f_frsize)
        total = _size(stat.f_blocks * stat.f_frsize)
        where = f"the host's filesystem mounted at {mount_point(tree)} ({free} free of {total} now)"
    except OSError:
        where = "the host's filesystem"
    return (
        f"the disk under the instance's /opt/ml is full: it is {where}, not a volume of "
        "VolumeSizeInGB (this machine gives an instance no disk of its own); free space "
        "there or set SHIPYARD_HOME to a larger disk"
    )


def mount_point(path: str) -> str:
    """The mount point of the filesystem holding ``path`` (where the device changes)."""
    path = os.path.realpath(path)
    device = os.stat(path).st_dev
    while path != os.sep:
        parent = os.path.dirname(path)
        if os.stat(parent).st_dev != device:
            return path
        path = parent
    return path


def _size(nbytes: int) -> str:
    if nbytes >= 1 << 30:
        return f"{nbytes / (1 << 30):.1f} GiB"
    return f"{nbytes / (1 << 20):.1f} MiB"
