"""The ``distribution`` argument: every form SageMaker v2 accepts, validated and normalized.

A pure module: it turns the user's dict into a :class:`Distribution` (one kind plus
its options) and into the reserved ``sagemaker_*`` hyperparameters the SageMaker SDK
writes for it (estimator.py ``_distribution_configuration``), so scripts and toolkits
that read those keys see exactly what they would on SageMaker.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from shipyard.errors import DistributionError

PARAMETER_SERVER = "parameter_server"
MPI = "mpi"
SMDDP = "smdistributed.dataparallel"
PYTORCHDDP = "pytorchddp"
TORCH_DISTRIBUTED = "torch_distributed"
MWMS = "multi_worker_mirrored_strategy"

KINDS = (PARAMETER_SERVER, MPI, SMDDP, PYTORCHDDP, TORCH_DISTRIBUTED, MWMS)
_TOP_LEVEL_KEYS = (PARAMETER_SERVER, MPI, "smdistributed", PYTORCHDDP, TORCH_DISTRIBUTED, MWMS)

# Which runner executes each kind (agent/runners/<name>.py). parameter_server depends on
# the framework too: see Distribution.runner_for.
RUNNER_FOR_KIND = {
    PARAMETER_SERVER: "native_ps",
    MPI: "mpi",
    SMDDP: "torch_distributed",
    PYTORCHDDP: "torch_distributed",
    TORCH_DISTRIBUTED: "torch_distributed",
    MWMS: "multi_worker_mirrored",
}


# The keys each section may hold (SageMaker's, plus the options shipyard's runners read; the
# runners check the values). A key outside these is refused at parse time with a spelling
# hint: a misspelt 'enabled' used to leave the section off, so the job trained on every
# instance alone and reported Completed.
_TORCH_KEYS = ("enabled", "processes_per_host", "master_port", "rendezvous_timeout")
SECTION_KEYS: dict[str, tuple[str, ...]] = {
    PARAMETER_SERVER: (
        "enabled",
        "implementation",
        # TensorFlow's parameter servers (shipyard.tf.cluster)
        "layout",
        "ports",
        # shipyard.ps (shipyard.ps.options)
        "policy",
        "consistency",
        "max_staleness",
        "num_shards",
        "workers_per_host",
        "processes_per_host",
        "port",
        "heartbeat_timeout",
        "checkpoint_interval",
        "mac",
    ),
    MPI: ("enabled", "processes_per_host", "custom_mpi_options"),
    SMDDP: _TORCH_KEYS + ("custom_mpi_options",),
    "smdistributed.modelparallel": ("enabled", "parameters"),
    PYTORCHDDP: _TORCH_KEYS,
    TORCH_DISTRIBUTED: _TORCH_KEYS,
    MWMS: ("enabled", "port"),
}


# The TensorFlow versions SageMaker's data-parallel library had a client for (the SDK's
# fw_utils.SM_DATAPARALLEL_SUPPORTED_FRAMEWORK_VERSIONS: 2.3 to 2.11; "smdataparallel
# excludes support for tf>=2.12").
SMDDP_TENSORFLOW_RANGE = ((2, 3), (2, 11))


def smddp_tensorflow_refusal(framework_version: str | None) -> str | None:
    """Why ``smdistributed.dataparallel`` cannot run with the TensorFlow estimator at
    ``framework_version``, or None when SageMaker ran it there. No version asked means the
    installed TensorFlow with shipyard's Horovod-based library: accepted."""
    if framework_version is None:
        return None
    low, high = SMDDP_TENSORFLOW_RANGE
    span = f"{low[0]}.{low[1]} to {high[0]}.{high[1]}"
    try:
        major_minor = tuple(int(p) for p in framework_version.strip().split(".")[:2])
    except ValueError:
        major_minor = ()
    if len(major_minor) == 2 and low <= major_minor <= high:
        return None
    return (
        f"distribution smdistributed.dataparallel with the TensorFlow estimator at "
        f"framework_version {framework_version!r}: SageMaker's data-parallel library had a "
        f"TensorFlow client only for TensorFlow {span} (it dropped TensorFlow from 2.12 on; "
        "scripts would fail with \"No module named 'smdistributed.dataparallel.tensorflow'\"). "
        f"Ask for a framework_version from {span}, or for TensorFlow use "
        "{'mpi': {'enabled': True}} with Horovod (import horovod.tensorflow.keras as hvd) "
        "or {'multi_worker_mirrored_strategy': {'enabled': True}}."
    )


def spelling_hint(key: object, known: Iterable[str]) -> str:
    """`` (did you mean 'x'?)`` for a near miss of one of ``known``, else ''."""
    if not isinstance(key, str):
        return ""
    by_lower = {k.lower(): k for k in known}
    close = difflib.get_close_matches(key.lower(), list(by_lower), n=1, cutoff=0.6)
    return f" (did you mean {by_lower[close[0]]!r}?)" if close else ""


def _check_section_keys(section: Mapping[str, Any], where: str) -> None:
    known = SECTION_KEYS[where]
    unknown = [k for k in section if k not in known]
    if not unknown:
        return
    named = ", ".join(f"{k!r}{spelling_hint(k, known)}" for k in unknown)
    raise DistributionError(
        f"distribution[{where!r}] has unknown key(s) {named}; its keys are "
        + ", ".join(repr(k) for k in known)
        + (
            ". Without 'enabled': True the job would run undistributed, each instance alone"
            if "enabled" not in section
            else ""
        )
    )


@dataclass(frozen=True)
class Distribution:
    """One normalized distribution: ``kind`` is None for a plain (undistributed) job."""

    kind: str | None = None
    options: dict[str, Any] = field(default_factory=dict)

    @property
    def runner(self) -> str:
        """Name of the agent runner that executes this distribution (framework-neutral)."""
        return "plain" if self.kind is None else RUNNER_FOR_KIND[self.kind]

    def runner_for(self, framework: str | None) -> str:
        """The runner for this distribution under ``framework``.

        parameter_server means TensorFlow's own parameter servers for the TensorFlow
        estimator (what the SageMaker tutorials run) and shipyard's native parameter
        server (shipyard.ps) for every other framework; ``implementation`` inside the
        parameter_server dict picks one explicitly ('tensorflow' or 'shipyard', e.g. a
        Keras 3 script under the TensorFlow estimator that uses shipyard.ps).
        smdistributed.dataparallel is torchrun-like for PyTorch and MPI for TensorFlow.
        """
        if self.kind == SMDDP and framework == "tensorflow":
            # SMDDP's TensorFlow client was Horovod-like and MPI-launched: the mpi runner
            # with the smdistributed.dataparallel.tensorflow shim (shipyard.ddp)
            return "mpi"
        if self.kind != PARAMETER_SERVER:
            return self.runner
        implementation = self.options.get("implementation") or (
            "tensorflow" if framework == "tensorflow" else "shipyard"
        )
        return "tf_parameter_server" if implementation == "tensorflow" else "native_ps"

    def to_sagemaker(self) -> dict[str, Any] | None:
        """The ``distribution=`` argument that parses back to this (None for plain)."""
        if self.kind is None:
            return None
        if self.kind == SMDDP:
            return {"smdistributed": {"dataparallel": dict(self.options)}}
        return {self.kind: dict(self.options)}

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "options": dict(self.options)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> Distribution:
        if not data:
            return cls()
        return cls(kind=data.get("kind"), options=dict(data.get("options") or {}))


def _enabled(section: Any, where: str) -> bool:
    if not isinstance(section, Mapping):
        raise DistributionError(
            f"distribution[{where!r}] must be a dict such as {{'enabled': True}}, "
            f"got {type(section).__name__}: {section!r}"
        )
    enabled = section.get("enabled", False)
    if not isinstance(enabled, bool):
        raise DistributionError(
            f"distribution[{where!r}]['enabled'] must be True or False, got {enabled!r}"
        )
    return enabled


def _check_processes_per_host(options: Mapping[str, Any], where: str) -> None:
    if "processes_per_host" in options:
        ppn = options["processes_per_host"]
        if isinstance(ppn, bool) or not isinstance(ppn, int) or ppn < 1:
            raise DistributionError(
                f"distribution[{where!r}]['processes_per_host'] must be an integer >= 1, "
                f"got {ppn!r}"
            )


def _check_custom_mpi_options(options: Mapping[str, Any], where: str) -> None:
    value = options.get("custom_mpi_options", "")
    if not isinstance(value, str):
        raise DistributionError(
            f"distribution[{where!r}]['custom_mpi_options'] must be a string of mpirun "
            f"options, got {value!r}"
        )


PS_IMPLEMENTATIONS = ("tensorflow", "shipyard")


def _check_ps_implementation(options: Mapping[str, Any]) -> None:
    value = options.get("implementation")
    if value is not None and value not in PS_IMPLEMENTATIONS:
        raise DistributionError(
            f"distribution['parameter_server']['implementation'] must be one of "
            f"{PS_IMPLEMENTATIONS} (TensorFlow's parameter servers or shipyard.ps), "
            f"got {value!r}"
        )


def parse(distribution: Mapping[str, Any] | None) -> Distribution:
    """Validate a SageMaker ``distribution`` dict and normalize it.

    Raises DistributionError for unknown keys, two distributions at once, forms
    shipyard does not run (model parallel, heterogeneous instance groups) and
    malformed options.
    """
    if distribution is None:
        return Distribution()
    if not isinstance(distribution, Mapping):
        raise DistributionError(
            f"distribution must be a dict such as {{'mpi': {{'enabled': True}}}}, got "
            f"{type(distribution).__name__}: {distribution!r}"
        )
    if "instance_groups" in distribution:
        raise DistributionError(
            "distribution['instance_groups'] (heterogeneous clusters) is not supported: "
            "run one homogeneous group of instances"
        )
    unknown = [k for k in distribution if k not in _TOP_LEVEL_KEYS]
    if unknown:
        raise DistributionError(
            "unknown distribution key(s) "
            + ", ".join(f"{k!r}{spelling_hint(k, _TOP_LEVEL_KEYS)}" for k in unknown)
            + ": use one of "
            + ", ".join(repr(k) for k in _TOP_LEVEL_KEYS)
        )

    found: list[Distribution] = []
    for key, section in distribution.items():
        if key == "smdistributed":
            if not isinstance(section, Mapping):
                raise DistributionError(
                    "distribution['smdistributed'] must be a dict such as "
                    "{'dataparallel': {'enabled': True}}"
                )
            extra = [k for k in section if k not in ("dataparallel", "modelparallel")]
            if extra:
                hints = "".join(spelling_hint(k, ("dataparallel", "modelparallel")) for k in extra)
                raise DistributionError(
                    f"unknown distribution['smdistributed'] key(s) {extra}{hints}: "
                    "use 'dataparallel'"
                )
            for sub in ("dataparallel", "modelparallel"):
                if isinstance(section.get(sub), Mapping):
                    _check_section_keys(section[sub], f"smdistributed.{sub}")
            if "modelparallel" in section and _enabled(
                section["modelparallel"], "smdistributed.modelparallel"
            ):
                raise DistributionError(
                    "smdistributed.modelparallel is not supported by shipyard; use "
                    "'torch_distributed' (DDP/FSDP in your script) instead"
                )
            if "dataparallel" in section and _enabled(section["dataparallel"], SMDDP):
                options = dict(section["dataparallel"])
                _check_custom_mpi_options(options, SMDDP)
                found.append(Distribution(SMDDP, options))
            continue
        if isinstance(section, Mapping):
            _check_section_keys(section, key)
        if _enabled(section, key):
            options = dict(section)
            if key in (MPI, TORCH_DISTRIBUTED, PYTORCHDDP, PARAMETER_SERVER):
                _check_processes_per_host(options, key)
            if key == MPI:
                _check_custom_mpi_options(options, key)
            if key == PARAMETER_SERVER:
                _check_ps_implementation(options)
            found.append(Distribution(key, options))

    if len(found) > 1:
        raise DistributionError(
            "two distributions at once: "
            + " and ".join(d.kind or "" for d in found)
            + "; enable exactly one"
        )
    return found[0] if found else Distribution()


def reserved_hyperparameters(dist: Distribution, instance_type: str) -> dict[str, Any]:
    """The ``sagemaker_*`` hyperparameters the SageMaker SDK v2 writes for ``dist``."""
    opts = dist.options
    if dist.kind is None:
        return {}
    if dist.kind == PARAMETER_SERVER:
        return {"sagemaker_parameter_server_enabled": True}
    if dist.kind == MPI:
        hps: dict[str, Any] = {"sagemaker_mpi_enabled": True}
        if "processes_per_host" in opts:
            hps["sagemaker_mpi_num_of_processes_per_host"] = opts["processes_per_host"]
        hps["sagemaker_mpi_custom_mpi_options"] = opts.get("custom_mpi_options", "")
        return hps
    if dist.kind == SMDDP:
        return {
            "sagemaker_distributed_dataparallel_enabled": True,
            "sagemaker_instance_type": instance_type,
            "sagemaker_distributed_dataparallel_custom_mpi_options": opts.get(
                "custom_mpi_options", ""
            ),
        }
    if dist.kind == PYTORCHDDP:
        return {"sagemaker_pytorch_ddp_enabled": True, "sagemaker_instance_type": instance_type}
    if dist.kind == TORCH_DISTRIBUTED:
        return {
            "sagemaker_torch_distributed_enabled": True,
            "sagemaker_instance_type": instance_type,
        }
    if dist.kind == MWMS:
        return {"sagemaker_multi_worker_mirrored_strategy_enabled": True}
    raise AssertionError(dist.kind)  # parse() admits nothing else
