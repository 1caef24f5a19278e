"""Runner registry: which distributions this build of shipyard can execute.

Runners are looked up by name (see shipyard.distribution.Distribution.runner_for). A
distribution whose runner is not listed here is refused at submission with an error
that says so, never run as plain.

A runner module defines ``plan(ctx) -> list[ProcessSpec]`` and may define:

* ``validate(options, instance_count, resources) -> None``: called at submission (in
  the control plane) to reject bad options before anything starts; raise
  shipyard.errors.DistributionError with a message that says what to change.
* ``deciding_hosts(options, hosts) -> list[str]``: the instances whose success ends the
  job (default: all). Once they have all completed, the control plane stops the others
  (servers that never end on their own: TF worker/ps servers, mpi's non-master hosts).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from types import ModuleType
from typing import Any

from shipyard.jobplan.runner import InstanceContext, ProcessSpec

# runner name -> module implementing ``plan(ctx) -> list[ProcessSpec]``
_RUNNERS = {
    "plain": "shipyard.agent.runners.plain",
    "tf_parameter_server": "shipyard.agent.runners.tf_parameter_server",
    "multi_worker_mirrored": "shipyard.agent.runners.multi_worker_mirrored",
    "mpi": "shipyard.agent.runners.mpi",
    "torch_distributed": "shipyard.agent.runners.torch_distributed",
    "native_ps": "shipyard.agent.runners.native_ps",
}
# runner name -> the release or issue that brings it (used in the refusal message); every
# distribution SageMaker offers has its runner today, so this is empty.
PLANNED: dict[str, str] = {}


def available() -> list[str]:
    return sorted(_RUNNERS)


def module(name: str) -> ModuleType:
    if name not in _RUNNERS:
        raise KeyError(f"no runner {name!r}; available: {available()}")
    return importlib.import_module(_RUNNERS[name])


def get(name: str) -> Callable[[InstanceContext], list[ProcessSpec]]:
    return module(name).plan


def validate(name: str, options: dict[str, Any], instance_count: int, resources: Any) -> None:
    check = getattr(module(name), "validate", None)
    if check is not None:
        check(options, instance_count, resources)


def deciding_hosts(name: str, options: dict[str, Any], hosts: list[str]) -> list[str]:
    decide = getattr(module(name), "deciding_hosts", None)
    return list(hosts) if decide is None else list(decide(options, hosts))
