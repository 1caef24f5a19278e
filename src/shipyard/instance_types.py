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
_ML_NAME = re.compile(r"^ml\.([a-z][a-z0-9]*)\.([0-9]*x?large|medium)$")


@dataclass(frozen=True)
class InstanceResources:
    """What one instance of a type is granted here (after capping to this machine)."""

    instance_type: str
    num_cpus: int
    num_gpus: int
    nominal_cpus: int
    nominal_gpus: int

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
        capped = (self.num_cpus, self.num_gpus) != (self.nominal_cpus, self.nominal_gpus)
        return (
            f"instance_type {self.instance_type!r} ({self.nominal_cpus} vCPU, "
            f"{self.nominal_gpus} GPU) -> {self.num_cpus} CPUs, {self.num_gpus} GPUs "
            f"per instance" + (" (capped to what this machine has)" if capped else "")
        )


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
    return InstanceResources(
        instance_type=instance_type,
        num_cpus=max(1, min(cpus, machine_cpus())),
        num_gpus=min(gpus, machine_gpus()),
        nominal_cpus=cpus,
        nominal_gpus=gpus,
    )
