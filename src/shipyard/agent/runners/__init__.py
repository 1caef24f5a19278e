"""Runner registry: which distributions this build of shipyard can execute.

Runners are looked up by name (see shipyard.distribution.RUNNER_FOR_KIND). A
distribution whose runner is not listed here is refused at submission with an error
that says so, never run as plain.
"""

from __future__ import annotations

import importlib
from typing import Callable

from shipyard.agent.runners.api import InstanceContext, ProcessSpec

# runner name -> module implementing ``plan(ctx) -> list[ProcessSpec]``
_RUNNERS = {
    "plain": "shipyard.agent.runners.plain",
}
# runner name -> the open issue that brings it (used in the refusal message)
PLANNED = {
    "parameter_server": "TensorFlow / native parameter server (issues #3, #4)",
    "mpi": "MPI + Horovod-compatible API (issue #5)",
    "torch_distributed": "PyTorch DDP (issue #6)",
    "multi_worker_mirrored": "TensorFlow multi_worker_mirrored_strategy (issue #3)",
}


def available() -> list[str]:
    return sorted(_RUNNERS)


def get(name: str) -> Callable[[InstanceContext], list[ProcessSpec]]:
    if name not in _RUNNERS:
        raise KeyError(f"no runner {name!r}; available: {available()}")
    return importlib.import_module(_RUNNERS[name]).plan
