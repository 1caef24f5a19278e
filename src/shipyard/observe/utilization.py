"""Per-instance utilization, sampled for a job's whole life: what SageMaker shows per host.

The supervisor calls :meth:`Sampler.maybe_sample` from its monitor loop (no thread: the
loop already wakes every few milliseconds, and a round is a few file reads per instance).
Each sample is one JSON line in the job directory's ``utilization.jsonl``, named as
SageMaker's instance metrics are (``/aws/sagemaker/TrainingJobs``, dimension ``Host``):

* ``CPUUtilization``: percent of one CPU, so up to 100 x the instance's CPUs;
* ``MemoryUtilization``: percent of the instance's memory limit (of the machine for
  ``local``), with ``MemoryBytes`` beside it;
* ``DiskUtilization``: percent used of the file system holding the instance's tree;
* ``NetworkRxBytes`` / ``NetworkTxBytes``: bytes through the instance's own interfaces
  so far (sandboxed instances only: otherwise they would be the host's);
* ``GPUUtilization`` / ``GPUMemoryUtilization``: summed over the instance's GPUs, where it
  has some (``nvidia-smi``).

CPU and memory come from the instance's cgroup when it has one (every process it ever
ran counts), else from its agent's process tree.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from shipyard import settings
from shipyard.runtime import safepath

UTILIZATION_NAME = "utilization.jsonl"
INTERVAL_S = 5.0
FIRST_SAMPLE_S = 1.0  # a short job still gets a sample
METRICS = (
    "CPUUtilization",
    "MemoryUtilization",
    "MemoryBytes",
    "DiskUtilization",
    "NetworkRxBytes",
    "NetworkTxBytes",
    "GPUUtilization",
    "GPUMemoryUtilization",
)


def interval() -> float:
    return settings.number("SHIPYARD_UTILIZATION_INTERVAL")


@dataclass
class Instance:
    """What the sampler knows of one running instance."""

    host: str
    pid: int  # its agent
    tree: str  # its /opt/ml on the host
    cgroup: Any = None  # sandbox.cgroups.InstanceCgroup, or None
    memory_limit: int | None = None  # bytes; None: the machine's
    gpus: tuple[str, ...] = ()


def _tree_usage(pid: int) -> tuple[float, int] | None:
    """CPU seconds and resident bytes of a process and its descendants."""
    import psutil  # here: describe and `shipyard metrics` read samples without it (issue 40)

    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return None
    cpu, rss = 0.0, 0
    for proc in procs:
        try:
            with proc.oneshot():
                times = proc.cpu_times()
                cpu += times.user + times.system
                rss += proc.memory_info().rss
        except psutil.Error:
            continue
    return cpu, rss


def net_bytes(pid: int) -> tuple[int, int] | None:
    """(rx, tx) bytes of the non-loopback interfaces of ``pid``'s network namespace,
    when that namespace is not this process's own."""
    try:
        if os.readlink(f"/proc/{pid}/ns/net") == os.readlink("/proc/self/ns/net"):
            return None
        with open(f"/proc/{pid}/net/dev", encoding="ascii") as fh:
            lines = fh.readlines()[2:]
    except OSError:
        return None
    rx = tx = 0
    for line in lines:
        name, _, rest = line.partition(":")
        if name.strip() == "lo":
            continue
        fields = rest.split()
        rx += int(fields[0])
        tx += int(fields[8])
    return rx, tx


def gpu_table() -> dict[str, tuple[float, float]]:
    """GPU index -> (utilization %, memory used %), from nvidia-smi; {} without one."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return {}
    try:
        out = subprocess.run(
            [
                smi,
                "--query-gpu=index,utilization.gpu,memory.used,memory.total",
                "--format=csv,noheader,nounits",
            ],
            capture_output=True,
            text=True,
            timeout=5,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    return parse_gpu_table(out)


def parse_gpu_table(text: str) -> dict[str, tuple[float, float]]:
    table = {}
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 4:
            continue
        try:
            util, used, total = float(parts[1]), float(parts[2]), float(parts[3])
        except ValueError:
            continue  # "[N/A]" on some boards
        table[parts[0]] = (util, 100.0 * used / total if total else 0.0)
    return table


class Sampler:
    """Samples the running instances of one job every :func:`interval` seconds."""

    def __init__(
        self,
        job_dir: str,
        machine_memory: int,
        gpus: Callable[[], dict[str, tuple[float, float]]] = gpu_table,
    ) -> None:
        self.path = os.path.join(job_dir, UTILIZATION_NAME)
        self.machine_memory = machine_memory
        self.gpus = gpus
        self.interval = interval()
        self.next_at = 0.0
        self.attempt = 1
        self.instances: list[Instance] = []
        self._prev: dict[str, tuple[float, float]] = {}  # host -> (cpu seconds, at)

    def start(self, instances: list[Instance], attempt: int) -> None:
        """A new attempt's instances, just launched (their CPU time counts from now)."""
        now = time.time()
        self.instances = instances
        self.attempt = attempt
        self._prev = {i.host: (0.0, now) for i in instances if i.cgroup is not None}
        self.next_at = time.monotonic() + min(FIRST_SAMPLE_S, self.interval)

    def maybe_sample(self, running: Iterable[str]) -> None:
        now = time.monotonic()
        if not self.instances or now < self.next_at:
            return
        self.next_at = now + self.interval
        self.sample(set(running))

    def sample(self, running: set[str]) -> list[dict[str, Any]]:
        at = time.time()
        table = self.gpus() if any(i.gpus for i in self.instances) else {}
        points = []
        for inst in self.instances:
            if inst.host in running:
                point = self._measure(inst, at, table)
                if point is not None:
                    points.append(point)
        if points:
            # appended as root every few seconds: never through a link at the name
            with safepath.open_record(self.path, "a", encoding="utf-8") as fh:
                fh.writelines(json.dumps(p, sort_keys=True) + "\n" for p in points)
        return points

    def _measure(
        self, inst: Instance, at: float, table: dict[str, tuple[float, float]]
    ) -> dict[str, Any] | None:
        cpu_s = memory = None
        if inst.cgroup is not None:
            cpu_s, memory = inst.cgroup.cpu_seconds(), inst.cgroup.memory_bytes()
        if cpu_s is None or memory is None:
            usage = _tree_usage(inst.pid)
            if usage is None:
                return None
            cpu_s = usage[0] if cpu_s is None else cpu_s
            memory = usage[1] if memory is None else memory
        point: dict[str, Any] = {"Timestamp": at, "Host": inst.host, "Attempt": self.attempt}
        prev = self._prev.get(inst.host)
        if prev is not None and at > prev[1]:
            point["CPUUtilization"] = round(max(0.0, cpu_s - prev[0]) / (at - prev[1]) * 100, 2)
        self._prev[inst.host] = (cpu_s, at)
        limit = inst.memory_limit or self.machine_memory
        point["MemoryBytes"] = memory
        point["MemoryUtilization"] = round(100.0 * memory / limit, 2) if limit else None
        try:
            disk = shutil.disk_usage(inst.tree)
            # four decimals: an instance's own disk of VolumeSizeInGB (issue 37) holds a
            # few MB of a 30 GB disk early on, which two decimals showed as an empty 0.0
            point["DiskUtilization"] = round(100.0 * disk.used / disk.total, 4)
        except OSError:
            pass
        net = net_bytes(inst.pid)
        if net is not None:
            point["NetworkRxBytes"], point["NetworkTxBytes"] = net
        mine = [table[g] for g in inst.gpus if g in table]
        if mine:
            point["GPUUtilization"] = round(sum(u for u, _ in mine), 2)
            point["GPUMemoryUtilization"] = round(sum(m for _, m in mine), 2)
        return point


def read(job_dir: str) -> list[dict[str, Any]]:
    """Every sample of a job, oldest first."""
    out = []
    try:
        with open(os.path.join(job_dir, UTILIZATION_NAME), encoding="utf-8") as fh:
            for line in fh:
                try:
                    out.append(json.loads(line))
                except ValueError:
                    continue  # a line cut by a killed supervisor
    except OSError:
        pass
    return out


def points(samples: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The samples as metric points (``name``, ``value``, ``at``, ``host``), the shape
    ``shipyard metrics`` plots."""
    return [
        {"name": name, "value": s[name], "at": s["Timestamp"], "host": s["Host"]}
        for s in samples
        for name in METRICS
        if s.get(name) is not None
    ]


def by_host(samples: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """describe's ``Shipyard.Utilization``: each host's samples in time order."""
    out: dict[str, list[dict[str, Any]]] = {}
    for s in samples:
        out.setdefault(s["Host"], []).append({k: v for k, v in s.items() if k != "Host"})
    return out
