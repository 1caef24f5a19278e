"""A job that filled the disk under its ``/opt/ml``: the FailureReason names the disk.

A script that runs out of disk dies with ``OSError: [Errno 28] No space left on device``
somewhere in a traceback; the user cannot tell from it which disk, how big it is, or what
filled it. Where the instance had its disk of ``VolumeSizeInGB`` (control.job_disks,
shipyard.sandbox.disk), a failure whose text says a disk was full gets a first line
naming that disk, its size and what in ``/opt/ml`` filled it (:func:`verdict`). Where it
had none (not root, no loop devices, the Ray backend), ``/opt/ml`` is its tree on the
host's filesystem, shared with the host and every other instance and job; describe says
so in ``Shipyard.MissingProtections`` (:data:`NO_VOLUME`, or the reason recorded), and the
first line names that filesystem, its mount point and what is free on it now.
"""

from __future__ import annotations

import os
import re
import stat

from shipyard.control import job_disks

NO_VOLUME = (
    "no disk of VolumeSizeInGB: /opt/ml is the instance's tree on the host's filesystem, "
    "shared with the host and the other instances, with no size limit of its own"
)
_FULL = re.compile(r"\[Errno (28|122)\]|No space left on device|Disk quota exceeded|ENOSPC")


def verdict(failure_text: str, tree: str) -> str | None:
    """The first line of a FailureReason whose text says a disk was full, naming the
    disk under the instance's ``/opt/ml`` (``tree`` on the host); None otherwise."""
    if not _FULL.search(failure_text):
        return None
    disk = _disk(tree)
    if disk is not None:
        size_gb, size = disk
        if size is not None and size < size_gb << 30:
            which = (
                f"the instance's disk under /opt/ml ({_size(size)}, less than its "
                f"VolumeSizeInGB of {size_gb} GB: the host's filesystem had no more free)"
            )
        else:
            which = f"the instance's disk of VolumeSizeInGB ({size_gb} GB) under /opt/ml"
        return (
            f"{which} is full{_filled_by(tree)}; write less there or ask for a larger "
            "VolumeSizeInGB (volume_size, --volume-size)"
        )
    try:
        fs = os.statvfs(tree)
        free = _size(fs.f_bavail * fs.f_frsize)
        total = _size(fs.f_blocks * fs.f_frsize)
        where = f"the host's filesystem mounted at {mount_point(tree)} ({free} free of {total} now)"
    except OSError:
        where = "the host's filesystem"
    return (
        f"the disk under the instance's /opt/ml is full: it is {where}, not a volume of "
        "VolumeSizeInGB (this machine gives an instance no disk of its own); free space "
        "there or set SHIPYARD_HOME to a larger disk"
    )


def _disk(tree: str) -> tuple[int, int | None] | None:
    """The instance's own disk when it had one: (VolumeSizeInGB, the bytes it got), from
    its record (<job>/disks.json); None when /opt/ml was the host's filesystem."""
    job_dir = os.path.dirname(os.path.dirname(tree))  # <job>/instances/algo-k
    entry = (job_disks.read_record(job_dir) or {}).get(os.path.basename(tree)) or {}
    if not entry or entry.get("Missing") or not isinstance(entry.get("SizeInGB"), int):
        return None
    size = entry.get("Bytes")
    return int(entry["SizeInGB"]), size if isinstance(size, int) else None


WALK_LIMIT = 200_000  # entries counted before the sizes are given as they stand


def _filled_by(tree: str) -> str:
    """``: model/ 1.1 GiB, checkpoints/ 20.0 MiB`` (the largest top-level entries of the
    tree, by blocks used; walked by descriptor, no link followed: the job's other
    instances may still write it), or "" when nothing there is large."""
    try:
        top = os.open(tree, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError:
        return ""
    budget = [WALK_LIMIT]
    try:
        sizes = {
            e.name + ("/" if e.is_dir(follow_symlinks=False) else ""): _used(top, e.name, budget)
            for e in os.scandir(top)
        }
    finally:
        os.close(top)
    largest = sorted(((n, v) for n, v in sizes.items() if v >= 1 << 20), key=lambda x: -x[1])
    if not largest:
        return ""
    return ": " + ", ".join(f"{name} {_size(v)}" for name, v in largest[:3])


def _used(dir_fd: int, name: str, budget: list[int]) -> int:
    """Bytes of blocks used by ``name`` (below ``dir_fd``) and everything in it."""
    budget[0] -= 1
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except OSError:
        return 0
    total = st.st_blocks * 512
    if not stat.S_ISDIR(st.st_mode) or budget[0] <= 0:
        return total
    try:
        fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=dir_fd)
    except OSError:
        return total
    try:
        for entry in os.scandir(fd):
            if budget[0] <= 0:
                break
            total += _used(fd, entry.name, budget)
    finally:
        os.close(fd)
    return total


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
