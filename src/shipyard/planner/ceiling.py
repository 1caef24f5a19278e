"""This machine's ceiling for emulated runs: what two instances here can move, on how many cores.

Why: an emulated run (the ``shipyard:network`` tag) puts every instance on this machine.
``tc`` can slow a link down but cannot speed this machine up: shaped to 10 Gbit/s, two
instances on two shared cores moved about 8-12 Gbit/s each way (measured here), and
their processes shared the same two cores. A "same machine" prediction that takes the
emulated rate at its word (``make demo``'s "before you pay" table printed 52.25 steps/s
beside a measured 34.80) contradicts what it stands next to. So the data path is
measured once, the way the instances use it, and cached per machine:

- **between instances**: two network namespaces, each with a veth pair on one bridge
  (``shipyard.sandbox.network``/``instance``'s layout), a TCP stream each way at once
  (instances send and receive together; the model's link is one direction of a NIC),
  for :data:`PROBE_SECONDS`; the rate is the mean of the two directions. Where this
  machine has no instance sandbox, instances talk over the host's loopback, so that is
  what is measured;
- **the cores the instances share**: this process's CPU affinity, lowered by a cgroup
  CPU quota (v2 ``cpu.max``, v1 ``cpu.cfs_quota_us``) on its cgroup or any parent.

- **what shipyard.ps' push/pull costs the shared cores**: CPU seconds per payload byte of
  the transport itself, workers and shards together, measured between two instances
  (:mod:`shipyard.planner.transport_probe`). Why: at 10 Gbit/s the demo's CNN spent
  9.3 ms a step in push/pull where the link needs 4.8 ms, and its step (41 ms) was what
  two cores take for both workers' compute plus that CPU, not the link (issue 39).

Cached as ``<SHIPYARD_HOME>/planner/ceiling-<host>-<kernel>-<cpus>cpu.json`` (another
machine, kernel or CPU count is another file); ``shipyard doctor`` shows it (measuring
when missing), ``shipyard doctor --measure`` measures again, and a same-machine prediction
asked where none is cached measures first (a file without the transport's figure, from
before it was measured, is measured again). The probes are child processes
(``python -m shipyard.planner.ceiling_probe``, ``... transport_probe``) whose namespaces,
bridge, veths and shards go with them; together they take a few seconds.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from shipyard.planner import model

PROBE_SECONDS = 0.4  # in all, over the probe's rounds
PROBE_TIMEOUT_S = 20.0
TRANSPORT_SECONDS = 1.0  # the transport probe's timed window (shard start-up not counted)
TRANSPORT_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class Ceiling:
    """What an emulated run on this machine can get: ``gbit_per_s`` each direction between
    two instances (None: not measurable, ``reason`` says why) and the ``cores`` every
    instance's processes share (``cores_source`` says how they were counted)."""

    key: str
    gbit_per_s: float | None
    cores: float
    cores_source: str
    path: str = ""  # which data path was measured
    directions: tuple[float, ...] = ()  # Gbit/s of each direction
    seconds: float = 0.0  # how long the measurement took, start-up included
    measured_at: float = 0.0  # time.time()
    reason: str = ""
    load_average: float = 0.0  # 1-minute, when measured: other work lowers the ceiling
    # shipyard.ps' push/pull between two instances here: CPU seconds per GB of payload
    # (workers and shards together; None: not measurable, ``ps_reason`` says why) and
    # the payload GB/s both workers moved while it was measured
    ps_cpu_s_per_gb: float | None = None
    ps_gbyte_per_s: float | None = None
    ps_reason: str = ""

    @property
    def bytes_per_s(self) -> float | None:
        return None if self.gbit_per_s is None else self.gbit_per_s * 1e9 / 8

    def line(self) -> str:
        """``same-machine ceiling: 9.8 Gbit/s between instances, 2 cores shared; shipyard.ps
        push/pull 0.95 CPU-s per GB``."""
        rate = (
            f"{self.gbit_per_s:.1f} Gbit/s between instances"
            if self.gbit_per_s is not None
            else f"unknown between instances ({self.reason})"
        )
        ps = (
            f"{self.ps_cpu_s_per_gb:.2f} CPU-s per GB"
            if self.ps_cpu_s_per_gb is not None
            else f"unknown ({self.ps_reason})"
        )
        return (
            f"same-machine ceiling: {rate}, {self.cores:g} cores shared; shipyard.ps push/pull {ps}"
        )

    def machine(self) -> model.Machine:
        """What the model needs of it (:func:`shipyard.planner.model.same_machine`)."""
        per_byte = None if self.ps_cpu_s_per_gb is None else self.ps_cpu_s_per_gb / 1e9
        return model.Machine(self.cores, self.bytes_per_s, self.reason, per_byte, self.ps_reason)

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> Ceiling:
        rate = data.get("gbit_per_s")
        ps = data["ps_cpu_s_per_gb"]  # KeyError: a file from before it was measured
        moved = data.get("ps_gbyte_per_s")
        return cls(
            key=str(data["key"]),
            gbit_per_s=None if rate is None else float(rate),
            cores=float(data["cores"]),
            cores_source=str(data.get("cores_source") or ""),
            path=str(data.get("path") or ""),
            directions=tuple(float(x) for x in data.get("directions") or ()),
            seconds=float(data.get("seconds") or 0),
            measured_at=float(data.get("measured_at") or 0),
            reason=str(data.get("reason") or ""),
            load_average=float(data.get("load_average") or 0),
            ps_cpu_s_per_gb=None if ps is None else float(ps),
            ps_gbyte_per_s=None if moved is None else float(moved),
            ps_reason=str(data.get("ps_reason") or ""),
        )


def machine_key() -> str:
    """This machine as a file name: host, kernel release and CPU count (a change of any
    of them can change the ceiling, so it is another cache file)."""
    raw = f"{socket.gethostname()}-{os.uname().release}-{os.cpu_count() or 0}cpu"
    return re.sub(r"[^A-Za-z0-9._-]+", "_", raw)[:200]


def cache_path(home: str | os.PathLike[str]) -> Path:
    return Path(home) / "planner" / f"ceiling-{machine_key()}.json"


def load(home: str | os.PathLike[str]) -> Ceiling | None:
    """The cached ceiling of this machine, None when there is none (or it is unreadable:
    it is measured again rather than trusted)."""
    path = cache_path(home)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        found = Ceiling.from_json(data)
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return found if found.key == machine_key() else None


def get(home: str | os.PathLike[str], refresh: bool = False) -> Ceiling:
    """The cached ceiling, measured (and cached) first when missing or ``refresh``. An
    unmeasurable one is cached too, with its reason, so every call does not retry it.
    One measured while more work than cores ran is measured again once the load has
    fallen (:func:`stale`): other work's share of the cores is not this machine's ceiling."""
    if not refresh:
        found = load(home)
        if found is not None and not stale(found):
            return found
    found = measure()
    save(home, found)
    return found


def stale(found: Ceiling) -> bool:
    """Measured on an overloaded machine (1-minute load above its cores), and the load has
    fallen since: below half of the cores, or below half of what it was then.

    Why the second: a ceiling measured at load 21 on 2 cores (1.0 Gbit/s, where the quiet
    machine moves 11-13) was still trusted at load 2.4 half an hour later, because the
    demo's own jobs kept the 1-minute load above one; ``make demo`` then capped its
    10 Gbit/s prediction at 38 steps/s beside a measured 93 (issue 39). Each time the load
    halves it is measured again, so it follows the machine down to quiet."""
    if found.load_average <= found.cores:
        return False
    now = os.getloadavg()[0]
    return now < found.cores / 2 or now < found.load_average / 2


def save(home: str | os.PathLike[str], found: Ceiling) -> Path:
    """Write the cache atomically (a reader sees the old file or the new one, whole)."""
    path = cache_path(home)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".ceiling-", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(found.to_json(), fh, indent=1)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def measure(
    seconds: float = PROBE_SECONDS, transport_seconds: float = TRANSPORT_SECONDS
) -> Ceiling:
    """Measure now: the probes in child processes (their namespaces die with them), the
    cores here."""
    cores, cores_source = shared_cores()
    load_average = os.getloadavg()[0]
    started = time.monotonic()
    argv = [sys.executable, "-m", "shipyard.planner.ceiling_probe", str(seconds)]
    rate: float | None = None
    directions: tuple[float, ...] = ()
    path, reason = "", ""
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=PROBE_TIMEOUT_S)
        found = json.loads(done.stdout.strip().splitlines()[-1]) if done.stdout.strip() else {}
        if done.returncode == 0 and found.get("directions"):
            directions = tuple(float(x) for x in found["directions"])
            rate = sum(directions) / len(directions)
            path = str(found.get("path") or "")
        else:
            reason = str(found.get("error") or done.stderr.strip()[-300:] or "no result")
    except subprocess.TimeoutExpired:
        reason = f"the probe did not finish in {PROBE_TIMEOUT_S:g} s"
    except (OSError, ValueError) as exc:
        reason = f"the probe could not run: {exc}"
    ps, ps_reason = _transport(transport_seconds)
    return Ceiling(
        key=machine_key(),
        gbit_per_s=rate,
        cores=cores,
        cores_source=cores_source,
        path=path,
        directions=directions,
        seconds=time.monotonic() - started,
        measured_at=time.time(),
        reason=reason,
        load_average=load_average,
        ps_cpu_s_per_gb=None if ps is None else float(ps["cpu_s_per_gb"]),
        ps_gbyte_per_s=None if ps is None else float(ps["gbyte_per_s"]),
        ps_reason=ps_reason,
    )


def _transport(seconds: float) -> tuple[dict | None, str]:
    """The transport probe's result, or None and why not."""
    argv = [sys.executable, "-m", "shipyard.planner.transport_probe", str(seconds)]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=TRANSPORT_TIMEOUT_S)
        lines = done.stdout.strip().splitlines()
        found = json.loads(lines[-1]) if lines else {}
    except subprocess.TimeoutExpired:
        return None, f"the shipyard.ps probe did not finish in {TRANSPORT_TIMEOUT_S:g} s"
    except (OSError, ValueError) as exc:
        return None, f"the shipyard.ps probe could not run: {exc}"
    if done.returncode == 0 and found.get("cpu_s_per_gb"):
        return found, ""
    return None, str(found.get("error") or done.stderr.strip()[-300:] or "no result")


def shared_cores(
    proc: str = "/proc/self/cgroup", root: str = "/sys/fs/cgroup"
) -> tuple[float, str]:
    """The cores this process (and so every local instance it starts) may use: its CPU
    affinity, lowered by the tightest cgroup CPU quota on its cgroup or a parent."""
    try:
        cpus = float(len(os.sched_getaffinity(0)))
        source = f"{cpus:g} CPUs in this process's affinity"
    except AttributeError:  # pragma: no cover - non-Linux
        cpus = float(os.cpu_count() or 1)
        source = f"{cpus:g} CPUs"
    quota = cgroup_quota(proc, root)
    if quota is not None and quota[0] < cpus:
        return quota[0], f"{source}, a cgroup CPU quota of {quota[0]:g} ({quota[1]})"
    return cpus, source


def cgroup_quota(
    proc: str = "/proc/self/cgroup", root: str = "/sys/fs/cgroup"
) -> tuple[float, str] | None:
    """The tightest CPU quota (in cores) over this process's cgroup and its parents, and
    the file that set it; None when there is none (``max``, -1, or no such files)."""
    try:
        lines = Path(proc).read_text(encoding="ascii").splitlines()
    except OSError:
        return None
    best: tuple[float, str] | None = None
    files: tuple[str, ...]
    for line in lines:
        _, controllers, where = line.split(":", 2)
        names = set(controllers.split(","))
        if controllers == "":
            base, files = Path(root), ("cpu.max",)
        elif "cpu" in names:
            base = next(
                (
                    Path(root) / d
                    for d in ("cpu,cpuacct", "cpuacct,cpu", "cpu")
                    if (Path(root) / d).is_dir()
                ),
                Path(root) / "cpu",
            )
            files = ("cpu.cfs_quota_us", "cpu.cfs_period_us")
        else:
            continue
        parts = [p for p in where.split("/") if p]
        for depth in range(len(parts), -1, -1):
            directory = base.joinpath(*parts[:depth])
            cores = _quota_in(directory, files)
            if cores is not None and (best is None or cores < best[0]):
                best = (cores, str(directory / files[0]))
    return best


def _quota_in(directory: Path, files: tuple[str, ...]) -> float | None:
    try:
        if files == ("cpu.max",):
            words = (directory / "cpu.max").read_text(encoding="ascii").split()
            if words[0] == "max":
                return None
            quota, period = int(words[0]), int(words[1])
        else:
            quota = int((directory / files[0]).read_text(encoding="ascii").strip())
            period = int((directory / files[1]).read_text(encoding="ascii").strip())
    except (OSError, ValueError, IndexError):
        return None
    return quota / period if quota > 0 and period > 0 else None
