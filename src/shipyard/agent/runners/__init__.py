"""The agent's runners: one class per distribution this build of shipyard executes.

Each class is a ``shipyard.jobplan.runner.Runner``: ``validate`` and ``deciding_hosts``
come from its rules in ``shipyard.jobplan.runners`` (what the control plane reads at
submission and while it supervises, without importing the agent), and ``plan(ctx)``
turns (hosts, current host, options) into the instance's processes. Registered here by
name, explicitly; ``RUNNERS`` and ``jobplan.runners.RULES`` hold the same names (a unit
test compares them), so a distribution the control plane accepts always has its runner.
"""

from __future__ import annotations

from shipyard.agent.runners.mpi import MpiRunner
from shipyard.agent.runners.multi_worker_mirrored import MWMSRunner
from shipyard.agent.runners.native_ps import NativePSRunner
from shipyard.agent.runners.plain import PlainRunner
from shipyard.agent.runners.tf_parameter_server import TFParameterServerRunner
from shipyard.agent.runners.torch_distributed import TorchDistributedRunner
from shipyard.jobplan.runner import Runner

RUNNERS: dict[str, type[Runner]] = {
    runner.name: runner
    for runner in (
        PlainRunner,
        TFParameterServerRunner,
        MWMSRunner,
        MpiRunner,
        TorchDistributedRunner,
        NativePSRunner,
    )
}


def get(name: str) -> Runner:
    """The runner of ``name`` (AgentConfig.runner), one instance of its class."""
    if name not in RUNNERS:
        raise KeyError(f"no runner {name!r}; available: {sorted(RUNNERS)}")
    return RUNNERS[name]()
