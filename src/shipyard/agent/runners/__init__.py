"""The agent's runners: one class per distribution this build of shipyard executes.

Each class is a ``shipyard.jobplan.runner.Runner``: ``validate`` and ``deciding_hosts``
come from its rules in ``shipyard.jobplan.runners`` (what the control plane reads at
submission and while it supervises, without importing the agent), and ``plan(ctx)``
turns (hosts, current host, options) into the instance's processes.

Registered here by name, explicitly: each entry is a function that imports its class
(a real import, checked by mypy, no module names in strings), so an agent imports only
its own job's runner: importing all six took 165-290 ms more per agent start on the
loaded 2-core machine (mpi's and TensorFlow's helpers), for classes it never uses.
``RUNNERS`` and ``jobplan.runners.RULES`` hold the same names (a unit test compares them),
so a distribution the control plane accepts always has its runner.
"""

from __future__ import annotations

from collections.abc import Callable

from shipyard.jobplan.runner import Runner


def _plain() -> type[Runner]:
    from shipyard.agent.runners.plain import PlainRunner

    return PlainRunner


def _tf_parameter_server() -> type[Runner]:
    from shipyard.agent.runners.tf_parameter_server import TFParameterServerRunner

    return TFParameterServerRunner


def _multi_worker_mirrored() -> type[Runner]:
    from shipyard.agent.runners.multi_worker_mirrored import MWMSRunner

    return MWMSRunner


def _mpi() -> type[Runner]:
    from shipyard.agent.runners.mpi import MpiRunner

    return MpiRunner


def _torch_distributed() -> type[Runner]:
    from shipyard.agent.runners.torch_distributed import TorchDistributedRunner

    return TorchDistributedRunner


def _native_ps() -> type[Runner]:
    from shipyard.agent.runners.native_ps import NativePSRunner

    return NativePSRunner


#: runner name (AgentConfig.runner) -> its class, imported when asked for
RUNNERS: dict[str, Callable[[], type[Runner]]] = {
    "plain": _plain,
    "tf_parameter_server": _tf_parameter_server,
    "multi_worker_mirrored": _multi_worker_mirrored,
    "mpi": _mpi,
    "torch_distributed": _torch_distributed,
    "native_ps": _native_ps,
}


def runner_class(name: str) -> type[Runner]:
    if name not in RUNNERS:
        raise KeyError(f"no runner {name!r}; available: {sorted(RUNNERS)}")
    return RUNNERS[name]()


def get(name: str) -> Runner:
    """The runner of ``name`` (AgentConfig.runner), one instance of its class."""
    return runner_class(name)()
