"""The Backend protocol: launch, poll, stop. No scheduler of our own.

A backend starts one agent per instance (``python -m shipyard.agent``) with its output
going to the instance's log file, reports exit statuses, and stops instances with
SIGTERM, a grace period, then SIGKILL, leaving no process behind.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass
class LaunchSpec:
    job_name: str
    host: str
    config_path: str
    log_path: str
    env: dict[str, str]


@dataclass
class InstanceHandle:
    host: str
    pid: int
    log_path: str
    # The address the instance's processes use, when the backend chose it at launch (Ray:
    # the node's IP); None: the plan's loopback address (control.plan.addresses).
    address: str | None = None


class Backend(Protocol):
    name: str

    def launch(self, specs: list[LaunchSpec]) -> list[InstanceHandle]:
        """Start every instance; all or none (a partial launch is stopped)."""

    def poll(self, handle: InstanceHandle) -> int | None:
        """Exit status of the instance's agent, or None while it runs."""

    def stop(self, handles: list[InstanceHandle], grace: float) -> None:
        """SIGTERM, wait up to ``grace`` seconds, SIGKILL; returns when all are gone."""
