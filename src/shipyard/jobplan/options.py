"""A distribution's options, typed per runner: one small frozen dataclass each.

``RunnerOptions`` is a union discriminated by ``runner`` (the agent runner that executes
it): the control plane parses the user's ``distribution`` section into one of these once
(``jobplan.runners``), and every later reader (the supervisor's deciding hosts, the
hyperparameters, the agent config) takes the typed fields instead of ``.get``-ing keys
out of a dict. ``raw`` keeps the section as the user wrote it (plus ``kind``): that is
what agent.json's ``runner_options`` holds, byte for byte as before, and what each
runner's ``plan`` reads on the instance.

``smdistributed.dataparallel`` has no runner of its own: under PyTorch it is a
``TorchDistributedOptions``, under TensorFlow an ``MpiOptions``, each with
``kind="smdistributed.dataparallel"`` so refusals name what the user asked for.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from shipyard.ps.options import PSOptions


@dataclass(frozen=True)
class PlainOptions:
    """No distribution: the entry point once per instance."""

    runner: Literal["plain"] = "plain"
    kind: None = None
    raw: Mapping[str, Any] = field(default_factory=lambda: {"kind": None})


@dataclass(frozen=True)
class NativePSOptions:
    """``parameter_server`` on shipyard.ps (every framework but TensorFlow's default)."""

    ps: PSOptions
    raw: Mapping[str, Any]
    runner: Literal["native_ps"] = "native_ps"
    kind: str = "parameter_server"


@dataclass(frozen=True)
class TFParameterServerOptions:
    """``parameter_server`` on TensorFlow's own parameter servers (shipyard.tf.cluster)."""

    layout: str
    """``tf2`` (a coordinator and ParameterServerStrategy) or ``sagemaker`` (TF1's
    master/worker/ps, the script on every instance)."""
    ports: Mapping[str, int]
    """Each role's port (the layout's defaults where the section names none)."""
    raw: Mapping[str, Any]
    runner: Literal["tf_parameter_server"] = "tf_parameter_server"
    kind: str = "parameter_server"


@dataclass(frozen=True)
class MWMSOptions:
    """``multi_worker_mirrored_strategy``: one TF worker per instance."""

    port: int
    raw: Mapping[str, Any]
    runner: Literal["multi_worker_mirrored"] = "multi_worker_mirrored"
    kind: str = "multi_worker_mirrored_strategy"


@dataclass(frozen=True)
class TorchDistributedOptions:
    """``torch_distributed``, ``pytorchddp`` and PyTorch's ``smdistributed.dataparallel``:
    torchrun-like ranks per instance."""

    kind: str
    processes_per_host: int | None
    """None: one per GPU, else one."""
    master_port: int
    rendezvous_timeout: float
    raw: Mapping[str, Any]
    runner: Literal["torch_distributed"] = "torch_distributed"


@dataclass(frozen=True)
class MpiOptions:
    """``mpi`` and TensorFlow's ``smdistributed.dataparallel``: mpirun from algo-1."""

    kind: str
    processes_per_host: int
    """Resolved: the option, else one per GPU, else 1 (the toolkit's rule)."""
    custom_mpi_options: str
    raw: Mapping[str, Any]
    runner: Literal["mpi"] = "mpi"


RunnerOptions = (
    PlainOptions
    | NativePSOptions
    | TFParameterServerOptions
    | MWMSOptions
    | TorchDistributedOptions
    | MpiOptions
)
