"""Dividing this machine's GPUs between instances (``CUDA_VISIBLE_DEVICES``).

Each instance of a job gets its type's GPU count where the machine has enough; where it
has fewer, an even share (at least one each while there are GPUs; instances then share
some, said once); without GPUs, GPU types run on CPU as before. A GPU held by another
running job on this machine is not handed out again unless the user says so:

* the default is to **wait** until the other job lets it go (SageMaker never gives two
  jobs one GPU; waiting is what a scheduler would do, and a job sharing a GPU by surprise
  may run out of GPU memory half-way through its training);
* ``SHIPYARD_GPU_SHARING=share`` hands held GPUs out again (both jobs see them).

Who holds what is a lease file per GPU in a machine-wide directory (``<tmp>/shipyard-gpu-
leases``, or ``$SHIPYARD_GPU_LEASES``), naming the holding launcher's pid and job; a lease
whose pid is gone is free. Where the GPU list comes from is the seam tests use:
``$SHIPYARD_GPUS`` (``0,1,2,3`` or ``none``) replaces ``nvidia-smi``'s list.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import tempfile
from dataclasses import dataclass, field
from functools import lru_cache

from shipyard import settings
from shipyard.runtime.lifeline import pid_alive

WAIT = "wait"
SHARE = "share"


def devices() -> list[str]:
    """This machine's GPUs (their ``nvidia-smi`` indexes), or ``$SHIPYARD_GPUS``."""
    fake = settings.get("SHIPYARD_GPUS")
    if fake is not None:
        fake = fake.strip()
        return [] if fake.lower() in ("", "none") else [g.strip() for g in fake.split(",")]
    return list(_smi_devices())


@lru_cache(maxsize=1)
def _smi_devices() -> tuple[str, ...]:
    """nvidia-smi's list, asked once per process (it takes tens of milliseconds)."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return ()
    try:
        out = subprocess.run(
            [smi, "--query-gpu=index", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return ()
    return tuple(line.strip() for line in out.splitlines() if line.strip())


NVIDIA_MAJOR = 195  # the character devices /dev/nvidia<minor>


def device_rules(gpus: list[str], dev_dir: str = "/dev") -> list[str]:
    """cgroup device rules that deny ``gpus`` (``nvidia-smi`` indexes): each one's
    ``/dev/nvidia<index>``, by the numbers the node has where there is one (major 195,
    minor = index otherwise). ``nvidiactl`` and ``nvidia-uvm`` stay allowed: every CUDA
    process needs them, and they give no access to a GPU of their own."""
    rules = []
    for gpu in gpus:
        if not gpu.isdigit():
            continue  # a UUID or MIG name has no node of its own to deny
        major, minor = NVIDIA_MAJOR, int(gpu)
        try:
            st = os.stat(os.path.join(dev_dir, f"nvidia{gpu}"))
            if stat.S_ISCHR(st.st_mode):
                major, minor = os.major(st.st_rdev), os.minor(st.st_rdev)
        except OSError:
            pass
        rules.append(f"c {major}:{minor} rwm")
    return rules


def sharing_policy() -> str:
    value = settings.text("SHIPYARD_GPU_SHARING")
    if value not in (WAIT, SHARE):
        raise ValueError(
            f"SHIPYARD_GPU_SHARING={value!r}: use 'wait' (the default: a GPU another job "
            "holds is waited for) or 'share' (hand it out to this job too)"
        )
    return value


@dataclass
class Division:
    """Which GPUs each instance gets; ``blocked``: GPUs this job waits for (held by
    other jobs), empty when it can start."""

    gpus: dict[str, list[str]]
    notes: list[str] = field(default_factory=list)
    blocked: dict[str, str] = field(default_factory=dict)  # gpu -> who holds it


def divide(
    hosts: list[str],
    per_instance: int,
    available: list[str],
    held: dict[str, str] | None = None,
    policy: str = WAIT,
    instance_type: str = "",
) -> Division:
    """Pure: the GPUs of each of ``hosts`` (see the module docstring)."""
    held = held or {}
    none: dict[str, list[str]] = {h: [] for h in hosts}
    if per_instance <= 0 or not hosts:
        return Division(none)
    if not available:
        return Division(
            none,
            [
                f"instance_type {instance_type!r} asks for {per_instance} GPU(s) per "
                "instance; this machine has none: instances run on CPU"
            ],
        )
    notes: list[str] = []
    need = per_instance * len(hosts)
    pool = list(available)
    busy = [g for g in available if g in held]
    if busy:
        free = [g for g in available if g not in held]
        if policy == SHARE:
            notes.append(
                "sharing GPU(s) "
                + ", ".join(f"{g} (held by {held[g]})" for g in busy)
                + " (SHIPYARD_GPU_SHARING=share)"
            )
        elif len(free) >= min(need, len(available)):
            pool = free
        else:
            return Division(none, notes, {g: held[g] for g in busy})
    if len(pool) >= need:
        return Division(
            {h: pool[i * per_instance : (i + 1) * per_instance] for i, h in enumerate(hosts)},
            notes,
        )
    share = max(1, len(pool) // len(hosts))
    out = {
        h: [pool[(i * share + j) % len(pool)] for j in range(share)] for i, h in enumerate(hosts)
    }
    shared = " (some instances share a GPU)" if len(pool) < len(hosts) else ""
    notes.append(
        f"instance_type {instance_type!r} asks for {per_instance} GPU(s) per instance, "
        f"{need} for {len(hosts)} instance(s); this machine has {len(pool)}: each instance "
        f"gets {share}{shared}"
    )
    return Division(out, notes)


def leases_dir() -> str:
    return settings.get("SHIPYARD_GPU_LEASES") or os.path.join(
        tempfile.gettempdir(), "shipyard-gpu-leases"
    )


def held(directory: str | None = None) -> dict[str, str]:
    """GPU -> ``job (pid N)`` for every live lease; stale leases are removed."""
    directory = directory or leases_dir()
    out: dict[str, str] = {}
    try:
        names = os.listdir(directory)
    except OSError:
        return out
    for name in names:
        path = os.path.join(directory, name)
        try:
            with open(path, encoding="utf-8") as fh:
                pid_text, _, job = fh.read().strip().partition(" ")
            pid = int(pid_text)
        except (OSError, ValueError):
            continue
        if pid_alive(pid):
            out[name] = f"job {job} (pid {pid})"
        else:
            try:
                os.unlink(path)
            except OSError:
                pass
    return out


def take(gpus: list[str], job: str, directory: str | None = None) -> list[str]:
    """Lease ``gpus`` to this process for ``job``; returns the lease files (give them
    back with :func:`give_back`). A GPU already leased (shared by consent) is skipped."""
    directory = directory or leases_dir()
    os.makedirs(directory, mode=0o1777, exist_ok=True)
    taken = []
    for gpu in dict.fromkeys(gpus):
        path = os.path.join(directory, gpu)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            continue
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(f"{os.getpid()} {job}\n")
        taken.append(path)
    return taken


def give_back(leases: list[str]) -> None:
    for path in leases:
        try:
            os.unlink(path)
        except OSError:
            pass
