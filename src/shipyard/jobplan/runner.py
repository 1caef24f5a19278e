"""The runner interface: (hosts, current host, spec) -> processes + environment.

A runner is a pure planning step: it returns the processes an instance must run and
their environments; the agent's supervisor runs them. ``main`` processes decide the
instance's result; ``service`` processes (parameter servers, rendezvous daemons) are
stopped once every main process has ended, so nothing outlives the job.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, Protocol

from shipyard.jobplan.config import AgentConfig
from shipyard.jobplan.layout import InstancePaths
from shipyard.jobplan.options import RunnerOptions


@dataclass
class ProcessSpec:
    name: str
    argv: list[str]
    env: dict[str, str]
    cwd: str
    role: Literal["main", "service"] = "main"
    # The main process whose failure text is the instance's (the user's script).
    user_facing: bool = True
    # False: when this process fails the instance goes on without it (a TF or shipyard.ps
    # worker whose loss training tolerates); the loss is logged and recorded in
    # InstancePaths.lost_file, and the control plane reports it in describe.
    critical: bool = True
    # A file the process (or its wrapper, e.g. an mpi rank) may write with its own failure
    # text; when it exists after a failure it is used instead of the log's tail.
    failure_file: str | None = None


@dataclass
class InstanceContext:
    config: AgentConfig
    host: str
    paths: InstancePaths
    env: dict[str, str]
    user_command: list[str]
    notes: list[str] = field(default_factory=list)

    @property
    def host_index(self) -> int:
        return self.config.hosts.index(self.host)

    @property
    def address(self) -> str:
        return self.config.addresses[self.host]


class Runner(Protocol):
    """One runner: the control plane calls ``validate`` (at submission: the user's options
    in, typed options out, or a DistributionError) and ``deciding_hosts``; the agent calls
    ``plan`` on each instance. The control plane's half is ``jobplan.runners.Rules``; the
    agent's classes (``shipyard.agent.runners.RUNNERS``) add ``plan`` to it."""

    name: ClassVar[str]

    def validate(
        self, raw: Mapping[str, Any], instance_count: int, resources: Any
    ) -> RunnerOptions: ...

    def deciding_hosts(self, options: RunnerOptions, hosts: Sequence[str]) -> list[str]: ...

    def plan(self, ctx: InstanceContext) -> list[ProcessSpec]: ...
