"""A job's disks of VolumeSizeInGB: made before its first attempt, released at its end.

The supervisor owns them (shipyard.sandbox.disk does the mounting) because both ends of a
disk's life are the control plane's: it must be mounted over every instance's tree, in
the host's mount namespace, before any instance's namespaces are made (an instance sees
its peers' trees through the job-wide ``instances/`` bind, copied when it unshares), and
it must stay until the last host-side read (the artifacts' upload) and go before the job
is seen ended (a caller reads ``model/`` right after ``fit()``). Retries reuse the disks:
a retried attempt finds its checkpoints where the failed one left them.

``<job>/disks.json`` (the job's records, out of every instance's reach) says, per host,
the disk's size or why there is none: describe's protections and the disk-full reason
read it (control.job_end, control.disk_full).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

RECORD_NAME = "disks.json"
NOT_LOCAL = (
    "the {backend} backend's instances write their own machine's disk: no disk of "
    "VolumeSizeInGB is made for them"
)


def record_path(job_dir: str) -> str:
    return os.path.join(job_dir, RECORD_NAME)


def read_record(job_dir: str) -> dict[str, dict] | None:
    """Each host's entry (``SizeInGB``, ``Missing``: why none, or None), or None when
    no disk was planned (a job that never launched, or recorded before issue 37)."""
    try:
        with open(record_path(job_dir), encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


class JobDisks:
    """``ensure`` before a launch (once), ``release`` at the job's end (once; again is a
    no-op). ``say`` puts a line in algo-1's log and on the attached console."""

    def __init__(
        self,
        job_dir: str,
        hosts: list[str],
        size_gb: int,
        backend: str,
        say: Callable[[str], None],
    ) -> None:
        self.job_dir = job_dir
        self.hosts = list(hosts)
        self.size_gb = size_gb
        self.backend = backend
        self.say = say
        self.disks: dict = {}
        self.planned = False
        self.reaper: Any = None  # releases the disks if this process is killed

    def ensure(self) -> None:
        if self.planned:
            return
        self.planned = True
        from shipyard.sandbox import disk

        if self.backend == "local":
            made = disk.create_all(self.job_dir, self.hosts, self.size_gb)
        else:
            made = {h: NOT_LOCAL.format(backend=self.backend) for h in self.hosts}
        self.disks = {h: d for h, d in made.items() if isinstance(d, disk.Disk)}
        self.reaper = disk.start_reaper(list(self.disks.values()))
        record = {
            h: {
                "SizeInGB": self.size_gb,
                "Bytes": d.size if isinstance(d, disk.Disk) else None,
                "Missing": None if isinstance(d, disk.Disk) else str(d),
            }
            for h, d in made.items()
        }
        tmp = record_path(self.job_dir) + ".tmp"
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump(record, fh)
        os.replace(tmp, record_path(self.job_dir))
        for line in _log_lines(made, self.size_gb, disk.Disk):
            self.say(line)

    def release(self) -> None:
        from shipyard.sandbox import disk

        disks, self.disks = self.disks, {}
        notes = disk.release_all([disks[h] for h in sorted(disks)], self.job_dir)
        reaper, self.reaper = self.reaper, None
        disk.stop_reaper(reaper)
        for note in notes.values():
            if note:
                self.say(f"[shipyard] WARNING: {note}")


def _log_lines(made: dict, size_gb: int, disk_type: type) -> list[str]:
    """What algo-1's log says of the disks, one line per fact shared by the instances it
    applies to: "each instance" when it is all of them, so algo-1's log names another
    host only where the hosts differ (``shipyard logs --host algo-1`` stays algo-1's)."""
    hosts = sorted(made)

    def who(group: list[str]) -> str:
        return "each instance" if group == hosts and len(hosts) > 1 else ", ".join(group)

    lines = []
    disks: dict[str, Any] = {h: d for h, d in made.items() if isinstance(d, disk_type)}
    if disks:
        lines.append(
            f"[shipyard] /opt/ml of {who(sorted(disks))} is a disk of {size_gb} GB (VolumeSizeInGB)"
        )
    capped: dict[int, list[str]] = {}
    for host in sorted(disks):
        if disks[host].capped:
            capped.setdefault(disks[host].size, []).append(host)
    for size, group in sorted(capped.items()):
        lines.append(
            f"[shipyard] WARNING: the disk of {who(group)} is {size / (1 << 30):.2f} GiB, "
            f"not {size_gb} GB: the host's filesystem has less free than the job's "
            "instances ask for"
        )
    missing: dict[str, list[str]] = {}
    for host in hosts:
        if host not in disks:
            missing.setdefault(str(made[host]), []).append(host)
    for why, group in sorted(missing.items()):
        lines.append(f"[shipyard] {who(group)}: protection missing: {missing_text(why)}")
    return lines


def missing_text(why: str) -> str:
    """The protection a host runs without when it has no disk, with why."""
    return (
        f"no disk of VolumeSizeInGB ({why}): /opt/ml is the instance's tree on the host's "
        "filesystem, shared with the host and the other instances, with no size limit of "
        "its own"
    )
