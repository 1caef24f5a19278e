"""What an ``instance_type`` means on this machine.

SageMaker names (``ml.m5.xlarge``) are mapped to their vCPU/GPU counts so scripts
written for them size themselves the same way; ``local``/``local_gpu`` take what the
machine has. A local instance can never get more than the machine has: the counts are
capped and the caller logs the mapping so the user sees what they got.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from functools import lru_cache

from shipyard.errors import ValidationError

# vCPUs per size suffix for the general/compute/memory families (m, c, r, t).
_SIZE_VCPUS = {
    "medium": 2,
    "large": 2,
    "xlarge": 4,
    "2xlarge": 8,
    "4xlarge": 16,
    "8xlarge": 32,
    "9xlarge": 36,
    "12xlarge": 48,
    "16xlarge": 64,
    "18xlarge": 72,
    "24xlarge": 96,
    "32xlarge": 128,
    "48xlarge": 192,
}
# Accelerated types: (vCPUs, GPUs), from the SageMaker instance type pages.
_GPU_TYPES = {
    "ml.p2.xlarge": (4, 1),
    "ml.p2.8xlarge": (32, 8),
    "ml.p2.16xlarge": (64, 16),
    "ml.p3.2xlarge": (8, 1),
    "ml.p3.8xlarge": (32, 4),
    "ml.p3.16xlarge": (64, 8),
    "ml.p3dn.24xlarge": (96, 8),
    "ml.p4d.24xlarge": (96, 8),
    "ml.p4de.24xlarge": (96, 8),
    "ml.p5.48xlarge": (192, 8),
    "ml.g4dn.xlarge": (4, 1),
    "ml.g4dn.2xlarge": (8, 1),
    "ml.g4dn.4xlarge": (16, 1),
    "ml.g4dn.8xlarge": (32, 1),
    "ml.g4dn.12xlarge": (48, 4),
    "ml.g4dn.16xlarge": (64, 1),
    "ml.g5.xlarge": (4, 1),
    "ml.g5.2xlarge": (8, 1),
    "ml.g5.4xlarge": (16, 1),
    "ml.g5.8xlarge": (32, 1),
    "ml.g5.12xlarge": (48, 4),
    "ml.g5.16xlarge": (64, 1),
    "ml.g5.24xlarge": (96, 4),
    "ml.g5.48xlarge": (192, 8),
    "ml.g6.xlarge": (4, 1),
    "ml.g6.12xlarge": (48, 4),
    "ml.g6.48xlarge": (192, 8),
}
# Network bandwidth per instance, Gbit/s, each direction: (peak, baseline). From AWS's
# public instance type pages ("Amazon EC2 instance types: network specifications", the
# "Network performance" and "Baseline bandwidth" columns; SageMaker's ml.* types are the
# EC2 types), checked 2026-11-28 against the baselines EC2's DescribeInstanceTypes
# reports (as generated into aws/karpenter-provider-aws, zz_generated.bandwidth.go) and
# the peaks AWS Batch's GPU-jobs page lists (docs/how-to/plan.md cites them). "Up to X"
# types burst to X on a credit bucket (5-60 minutes) and sustain only the baseline: a
# training job that talks all the time gets the baseline, so the planner uses it and
# says so. ``None`` baseline: the peak is sustained. p2 predates the figures: AWS rates
# p2.xlarge "High" (taken as 1.25), p2.8xlarge "10 Gigabit", p2.16xlarge "25 Gigabit".
_NETWORK_GBPS: dict[str, tuple[float, float | None]] = {
    "ml.p2.xlarge": (1.25, None),  # "High"
    "ml.p2.8xlarge": (10.0, None),
    "ml.p2.16xlarge": (25.0, None),
    "ml.p3.2xlarge": (10.0, 2.5),  # "up to 10"
    "ml.p3.8xlarge": (10.0, None),
    "ml.p3.16xlarge": (25.0, None),
    "ml.p3dn.24xlarge": (100.0, None),
    "ml.p4d.24xlarge": (400.0, None),
    "ml.p4de.24xlarge": (400.0, None),
    "ml.p5.48xlarge": (3200.0, None),
    "ml.g4dn.xlarge": (25.0, 5.0),
    "ml.g4dn.2xlarge": (25.0, 10.0),
    "ml.g4dn.4xlarge": (25.0, 20.0),
    "ml.g4dn.8xlarge": (50.0, None),
    "ml.g4dn.12xlarge": (50.0, None),
    "ml.g4dn.16xlarge": (50.0, None),
    "ml.g5.xlarge": (10.0, 2.5),
    "ml.g5.2xlarge": (10.0, 5.0),
    "ml.g5.4xlarge": (25.0, 10.0),
    "ml.g5.8xlarge": (25.0, None),
    "ml.g5.12xlarge": (40.0, None),
    "ml.g5.16xlarge": (25.0, None),
    "ml.g5.24xlarge": (50.0, None),
    "ml.g5.48xlarge": (100.0, None),
    "ml.g6.xlarge": (10.0, 2.5),
    "ml.g6.12xlarge": (40.0, None),
    "ml.g6.48xlarge": (100.0, None),
}
# The m5/c5/r5 families by size: "up to 10" with a baseline below 8xlarge, then fixed
# figures.
_SIZE_NETWORK_GBPS: dict[str, tuple[float, float | None]] = {
    "medium": (10.0, 0.5),
    "large": (10.0, 0.75),
    "xlarge": (10.0, 1.25),
    "2xlarge": (10.0, 2.5),
    "4xlarge": (10.0, 5.0),
    "8xlarge": (10.0, None),
    "9xlarge": (12.0, None),  # c5.9xlarge
    "12xlarge": (12.0, None),
    "16xlarge": (20.0, None),
    "18xlarge": (25.0, None),  # c5.18xlarge
    "24xlarge": (25.0, None),
    "32xlarge": (50.0, None),
    "48xlarge": (50.0, None),
}
# The 6th and 7th generations (m6i/c6i/r6i, m6a/c6a/r6a, m7i/c7i/r7i, m7a/c7a/r7a) by
# size: "up to 12.5" with a baseline below 8xlarge, then fixed figures (not m5's: their
# 8xlarge has 12.5, their 24xlarge 37.5).
_GEN6_NETWORK_GBPS: dict[str, tuple[float, float | None]] = {
    "medium": (12.5, 0.39),  # m7a/c7a/r7a.medium
    "large": (12.5, 0.781),
    "xlarge": (12.5, 1.562),
    "2xlarge": (12.5, 3.125),
    "4xlarge": (12.5, 6.25),
    "8xlarge": (12.5, None),
    "12xlarge": (18.75, None),
    "16xlarge": (25.0, None),
    "24xlarge": (37.5, None),
    "32xlarge": (50.0, None),
    "48xlarge": (50.0, None),
}
_GEN6_FAMILIES = frozenset(f"{k}{g}{v}" for k in "mcr" for g in "67" for v in "ia")
# m4/c4 (before ENA's "up to" ratings): AWS's words, in Gbit/s.
_OLD_FAMILY_NETWORK_GBPS: dict[str, tuple[float, float | None]] = {
    "large": (0.45, None),  # "Moderate"
    "xlarge": (1.25, None),  # "High"
    "2xlarge": (1.25, None),
    "4xlarge": (1.25, None),
    "8xlarge": (10.0, None),
    "10xlarge": (10.0, None),
    "16xlarge": (25.0, None),
}
# Memory (GiB) of the accelerated types, from the same pages.
_GPU_MEMORY_GIB = {
    "ml.p2.xlarge": 61,
    "ml.p2.8xlarge": 488,
    "ml.p2.16xlarge": 732,
    "ml.p3.2xlarge": 61,
    "ml.p3.8xlarge": 244,
    "ml.p3.16xlarge": 488,
    "ml.p3dn.24xlarge": 768,
    "ml.p4d.24xlarge": 1152,
    "ml.p4de.24xlarge": 1152,
    "ml.p5.48xlarge": 2048,
    "ml.g4dn.xlarge": 16,
    "ml.g4dn.2xlarge": 32,
    "ml.g4dn.4xlarge": 64,
    "ml.g4dn.8xlarge": 128,
    "ml.g4dn.12xlarge": 192,
    "ml.g4dn.16xlarge": 256,
    "ml.g5.xlarge": 16,
    "ml.g5.2xlarge": 32,
    "ml.g5.4xlarge": 64,
    "ml.g5.8xlarge": 128,
    "ml.g5.12xlarge": 192,
    "ml.g5.16xlarge": 256,
    "ml.g5.24xlarge": 384,
    "ml.g5.48xlarge": 768,
    "ml.g6.xlarge": 16,
    "ml.g6.12xlarge": 192,
    "ml.g6.48xlarge": 768,
}
# GiB per vCPU of the CPU families (c: compute, r/x: memory, m/t and the rest: general);
# a ``medium`` (2 vCPU) has 4 GiB whatever its family.
_FAMILY_GIB_PER_VCPU = {"c": 2, "r": 8, "x": 16}
GIB = 1 << 30
_ML_NAME = re.compile(r"^ml\.([a-z][a-z0-9]*)\.([0-9]*x?large|medium)$")


@dataclass(frozen=True)
class InstanceResources:
    """What one instance of a type is granted here (after capping to this machine)."""

    instance_type: str
    num_cpus: int
    num_gpus: int
    nominal_cpus: int
    nominal_gpus: int
    # bytes of memory: None for ``local``/``local_gpu`` (the whole machine, no limit)
    memory_bytes: int | None = None
    nominal_memory_bytes: int | None = None

    @property
    def whole_machine(self) -> bool:
        """``local``/``local_gpu``: the instance takes what the machine has (no limits)."""
        return self.instance_type in ("local", "local_gpu")

    def describe(self) -> str:
        """One log line saying what the type maps to locally."""
        if self.instance_type == "local_gpu" and not self.num_gpus:
            return (
                f"instance_type 'local_gpu': this machine has no GPU; instances run on its "
                f"{self.num_cpus} CPUs, as with 'local'"
            )
        if self.instance_type in ("local", "local_gpu"):
            return (
                f"instance_type {self.instance_type!r}: {self.num_cpus} CPUs, "
                f"{self.num_gpus} GPUs per instance (this machine)"
            )
        capped = (self.num_cpus, self.num_gpus, self.memory_bytes) != (
            self.nominal_cpus,
            self.nominal_gpus,
            self.nominal_memory_bytes,
        )
        return (
            f"instance_type {self.instance_type!r} ({self.nominal_cpus} vCPU, "
            f"{gib(self.nominal_memory_bytes)} memory, {self.nominal_gpus} GPU) -> "
            f"{self.num_cpus} CPUs, {gib(self.memory_bytes)} memory, {self.num_gpus} GPUs "
            f"per instance" + (" (capped to what this machine has)" if capped else "")
        )


def gib(nbytes: int | None) -> str:
    """``8 GiB``, ``1.5 GiB``; None reads as the whole machine."""
    if nbytes is None:
        return "all the machine's"
    return f"{nbytes / GIB:.4g} GiB"


def machine_memory() -> int:
    """Bytes of physical memory on this machine."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def nominal_memory(instance_type: str) -> int | None:
    """Bytes of memory SageMaker gives an instance of this type (None: ``local``, the
    whole machine); raises on unknown names, as :func:`nominal` does."""
    cpus, _ = nominal(instance_type)
    if instance_type in ("local", "local_gpu"):
        return None
    if instance_type in _GPU_MEMORY_GIB:
        return _GPU_MEMORY_GIB[instance_type] * GIB
    match = _ML_NAME.match(instance_type)
    assert match is not None  # nominal() refused every other name
    family, size = match.groups()
    if size == "medium":
        return 4 * GIB
    return cpus * _FAMILY_GIB_PER_VCPU.get(family[0], 4) * GIB


@lru_cache(maxsize=1)
def machine_gpus() -> int:
    """GPUs visible here, counted the way the training toolkit does (nvidia-smi -L)."""
    if shutil.which("nvidia-smi") is None:
        return 0
    try:
        out = subprocess.run(
            ["nvidia-smi", "--list-gpus"], capture_output=True, text=True, timeout=10, check=True
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return 0
    return sum(1 for line in out.splitlines() if line.startswith("GPU "))


def machine_cpus() -> int:
    """CPUs this process may use (affinity-aware, unlike os.cpu_count)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - non-Linux
        return os.cpu_count() or 1


# SageMaker's CPU training families (its "Amazon SageMaker pricing" list); the GPU ones are
# the names of _GPU_TYPES. An unknown family is refused at submission as SageMaker refuses it
# (check_family), unless SHIPYARD_CUSTOM_INSTANCE_FAMILIES allows it.
CPU_FAMILIES = frozenset(
    {"m4", "m5", "m5d", "m6id", "c4", "c5", "c5d", "c5n", "c6id", "c6in", "r5", "r5d", "r6id"}
    | {"t2", "t3", "trn1", "trn1n"}
    | _GEN6_FAMILIES
)


def known_families() -> list[str]:
    """Every instance family SageMaker trains on: the CPU ones and the GPU ones."""
    gpu = {n.split(".")[1] for n in _GPU_TYPES}
    return sorted(CPU_FAMILIES | gpu)


def check_family(instance_type: str, custom: frozenset[str] = frozenset()) -> None:
    """Refuse an ``ml.<family>.<size>`` of a family SageMaker does not have (``ml.q9``),
    naming the known ones, rather than run it on a guessed shape. ``custom``: families
    allowed anyway (sized as an ``m`` family: 4 GiB per vCPU)."""
    match = _ML_NAME.match(instance_type)
    if match is None or instance_type in _GPU_TYPES:
        return  # local / local_gpu / a known GPU type; other names: nominal's error
    family = match.group(1)
    if family in CPU_FAMILIES or family in custom or family.startswith(("p", "g")):
        return  # a p/g name that is not a GPU type gets nominal's list of GPU types
    raise ValidationError(
        f"instance_type {instance_type!r}: SageMaker has no instance family {family!r}; "
        f"known families: {', '.join(known_families())}. A custom type: allow its family "
        f"with SHIPYARD_CUSTOM_INSTANCE_FAMILIES={family}"
    )


def nominal(instance_type: str) -> tuple[int, int]:
    """(vCPUs, GPUs) SageMaker gives an instance of this type; raises on unknown names."""
    if instance_type == "local":
        return machine_cpus(), 0
    if instance_type == "local_gpu":
        return machine_cpus(), machine_gpus()
    if instance_type in _GPU_TYPES:
        return _GPU_TYPES[instance_type]
    match = _ML_NAME.match(instance_type)
    if match is None:
        raise ValidationError(
            f"instance_type {instance_type!r} is not known: use 'local', 'local_gpu' or a "
            "SageMaker name such as 'ml.m5.xlarge' or 'ml.p3.2xlarge'"
        )
    family, size = match.groups()
    if family.startswith(("p", "g")):
        raise ValidationError(
            f"instance_type {instance_type!r}: unknown GPU instance type; known GPU types: "
            + ", ".join(sorted(_GPU_TYPES))
        )
    if size not in _SIZE_VCPUS:
        raise ValidationError(f"instance_type {instance_type!r}: unknown size {size!r}")
    return _SIZE_VCPUS[size], 0


def resolve(instance_type: str) -> InstanceResources:
    """Map an instance type to what an instance gets on this machine."""
    cpus, gpus = nominal(instance_type)
    memory = nominal_memory(instance_type)
    return InstanceResources(
        instance_type=instance_type,
        num_cpus=max(1, min(cpus, machine_cpus())),
        num_gpus=min(gpus, machine_gpus()),
        nominal_cpus=cpus,
        nominal_gpus=gpus,
        memory_bytes=None if memory is None else min(memory, machine_memory()),
        nominal_memory_bytes=memory,
    )


@dataclass(frozen=True)
class NetworkBandwidth:
    """An instance type's network, each direction (AWS rates in and out separately)."""

    instance_type: str
    peak_gbps: float
    baseline_gbps: float | None  # set for "up to" types: what a sustained flow gets

    @property
    def sustained_gbps(self) -> float:
        """What a training job, which talks for its whole run, can count on."""
        return self.baseline_gbps if self.baseline_gbps is not None else self.peak_gbps

    @property
    def bytes_per_s(self) -> float:
        return self.sustained_gbps * 1e9 / 8

    def describe(self) -> str:
        if self.baseline_gbps is None:
            return f"{self.peak_gbps:g} Gbit/s"
        return f"up to {self.peak_gbps:g} Gbit/s (baseline {self.baseline_gbps:g})"


def network(instance_type: str) -> NetworkBandwidth:
    """The network bandwidth of a SageMaker instance type, from AWS's instance type pages.

    Raises ValidationError for 'local'/'local_gpu' (this machine has no rated network)
    and for names whose bandwidth is not known, listing what is."""
    nominal(instance_type)  # the same clear error for names that are not instance types
    if instance_type in _NETWORK_GBPS:
        peak, base = _NETWORK_GBPS[instance_type]
        return NetworkBandwidth(instance_type, peak, base)
    match = _ML_NAME.match(instance_type)
    if match is not None:
        family, size = match.groups()
        table = _SIZE_NETWORK_GBPS
        if family in ("m4", "c4"):
            table = _OLD_FAMILY_NETWORK_GBPS
        elif family in _GEN6_FAMILIES:
            table = _GEN6_NETWORK_GBPS
        if family[0] in "mcr" and size in table:
            peak, base = table[size]
            return NetworkBandwidth(instance_type, peak, base)
    raise ValidationError(
        f"instance_type {instance_type!r}: its network bandwidth is not known to shipyard; "
        "use an ml.m/c/r or GPU type (e.g. ml.p3.16xlarge) or give a rate such as 10gbit"
    )
