"""The instance tree: SageMaker's /opt/ml layout, rooted in the job's directory.

Each instance gets its own tree (``<job>/instances/algo-k``) so N instances on one
machine never share a model or output directory, exactly as N containers would not.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

from shipyard.jobplan.config import AgentConfig
from shipyard.runtime import safepath

GROUP_NAME = "homogeneousCluster"


@dataclass(frozen=True)
class InstancePaths:
    """Every path of one instance's tree (the toolkit's module-level constants)."""

    base: str

    def _p(self, *parts: str) -> str:
        return os.path.join(self.base, *parts)

    @property
    def code(self) -> str:
        return self._p("code")

    @property
    def input(self) -> str:
        return self._p("input")

    @property
    def input_config(self) -> str:
        return self._p("input", "config")

    @property
    def input_data(self) -> str:
        return self._p("input", "data")

    @property
    def model(self) -> str:
        return self._p("model")

    @property
    def output(self) -> str:
        return self._p("output")

    @property
    def output_data(self) -> str:
        return self._p("output", "data")

    @property
    def output_intermediate(self) -> str:
        return self._p("output", "intermediate")

    @property
    def checkpoints(self) -> str:
        return self._p("checkpoints")

    @property
    def success_file(self) -> str:
        return self._p("output", "success")

    @property
    def failure_file(self) -> str:
        return self._p("output", "failure")

    @property
    def agent_dir(self) -> str:
        return self._p("agent")

    @property
    def failure_time_file(self) -> str:
        """When this instance's failing process ended (seconds since the epoch): the
        control plane blames the earliest failure of the job."""
        return self._p("agent", "failure-time")

    @property
    def lost_file(self) -> str:
        return self._p("agent", "lost.jsonl")

    @property
    def missing_protections_file(self) -> str:
        """The sandbox protections this instance runs without, each with why (a JSON
        list; shipyard.sandbox): describe shows them."""
        return self._p("agent", "missing-protections.json")

    @property
    def report_file(self) -> str:
        """Where a runner's processes write the job's distribution report (placement and
        traffic, schema shipyard.ps.report/v1); the control plane collects it."""
        return self._p("agent", "distribution-report.json")

    def channel(self, name: str) -> str:
        return os.path.join(self.input_data, name)

    def config_file(self, name: str) -> str:
        return os.path.join(self.input_config, name)


def paths_for(config: AgentConfig, host: str) -> InstancePaths:
    return InstancePaths(os.path.join(config.instances_dir, host))


def resource_config(config: AgentConfig, host: str) -> dict[str, Any]:
    """resourceconfig.json, in the hosted layout (with instance groups)."""
    return {
        "current_host": host,
        "current_instance_type": config.instance_type,
        "current_group_name": GROUP_NAME,
        "hosts": list(config.hosts),
        "instance_groups": [
            {
                "instance_group_name": GROUP_NAME,
                "instance_type": config.instance_type,
                "hosts": list(config.hosts),
            }
        ],
        "network_interface_name": config.network_interface_name,
    }


def checkpoint_dir(config: AgentConfig, paths: InstancePaths) -> str:
    """Where this instance's checkpoints are, as the agent reaches them: the instance's
    own ``checkpoints/``, a ``checkpoint_local_path`` in ``/opt/ml`` mapped into this
    instance's tree (never the host's /opt/ml), or the host directory the SDK's or CLI's
    user named for the instances to share (control.plan.checkpoint_local_path)."""
    path = config.checkpoint_local_path
    if not path:
        return paths.checkpoints
    if path.startswith("/opt/ml/"):
        return os.path.join(paths.base, path[len("/opt/ml/") :])
    return path


def _write_json(paths: InstancePaths, path: str, obj: Any) -> None:
    """A config JSON of the tree, which an earlier attempt's processes could write: no
    link left there is followed (shipyard.runtime.safepath)."""
    safepath.write_text(paths.base, path, json.dumps(obj))


def build_tree(config: AgentConfig, host: str, paths: InstancePaths | None = None) -> InstancePaths:
    """Create the directories and the three config JSONs (at ``paths``: /opt/ml inside an
    instance sandbox, else the tree in the job directory). The channels' data is made
    available by shipyard.agent.channels.prepare() (File, FastFile, Pipe)."""
    paths = paths or paths_for(config, host)
    for directory in (
        paths.code,
        paths.input_config,
        paths.input_data,
        paths.model,
        paths.output_data,
        paths.output_intermediate,
    ):
        os.makedirs(directory, exist_ok=True)
    os.makedirs(checkpoint_dir(config, paths), exist_ok=True)
    for stale in (paths.success_file, paths.failure_file, paths.failure_time_file):
        if os.path.exists(stale):  # a retried attempt starts clean
            os.remove(stale)
    _write_json(paths, paths.config_file("hyperparameters.json"), config.hyperparameters)
    _write_json(paths, paths.config_file("resourceconfig.json"), resource_config(config, host))
    _write_json(paths, paths.config_file("inputdataconfig.json"), config.input_data_config)
    return paths
