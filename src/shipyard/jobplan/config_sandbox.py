"""SandboxPlan: how an instance is contained, as the control plane and the backends tell the
agent (``AgentConfig.sandbox``; one JSON object in agent.json).

One frozen dataclass instead of the dict it replaces, which had two shapes (the local
backend's and a Ray node's) read through a dozen ``.get`` calls that each guessed which
shape they held. Who writes which mode:

* the control plane (``jobplan.plan.sandbox_config``): ``job_network`` or ``off`` for the
  local backend; ``per_node`` (or ``off``) for Ray, whose nodes may differ;
* each Ray node (``backends.ray.actor.node_sandbox``) turns ``per_node`` into
  ``node_network`` or ``off`` for its own instances, with its own reason and address.

agent.json is written and read by one shipyard for one job (the supervisor that writes it
starts the agents that read it; a Ray cluster runs one shipyard version), so only this
form is read: the form before it (``{"enabled": ..., "mounts": ...}``) is refused with
an error naming the field, not guessed at. Stdlib only, like the rest of the agent's
start.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any

from shipyard.errors import AgentConfigError

OFF = "off"
JOB_NETWORK = "job_network"
NODE_NETWORK = "node_network"
PER_NODE = "per_node"
MODES = (OFF, JOB_NETWORK, NODE_NETWORK, PER_NODE)


@dataclass(frozen=True)
class SandboxPlan:
    """The instance sandbox of one job's instances (shipyard.sandbox)."""

    mode: str = OFF
    """``off``: plain processes (``reason`` says why); ``job_network``: the local backend's
    full sandbox, every instance in its own namespaces on the job's private network (a
    holder process's bridge); ``node_network``: a Ray node's, the same namespaces, privileges
    and filesystem view but the node's own network, since the peers are other machines;
    ``per_node``: the control plane's plan for a Ray job, which each node replaces with
    ``node_network`` or ``off`` before its agent reads it."""

    reason: str = ""
    """Why the sandbox is off (or what a node could not give); empty when it is on."""

    rootless: bool = False
    """The agent is not root: the namespaces hang off a user namespace of the job's own."""

    isolation: bool = False
    """``enable_network_isolation``: nothing beyond the job's network is reachable."""

    network: dict[str, Any] | None = None
    """The ``shipyard:network`` tag's link (``sandbox.shaping.Shape.to_json``), or None."""

    node_address: str | None = None
    """Ray: the cluster address of the node that decided this plan. Set only by a node, so
    it also says the plan is per node (each instance, not only algo-1, reports what its node
    lacks); every wildcard TCP listener of the instance binds it (sandbox.bindshim)."""

    hidden: tuple[str, ...] = ()
    """Directories the job's processes must not see beyond the view's own (sandbox.fsview):
    on a Ray node, the node's work dir (other jobs' instances and their secrets) and the
    submitter's ``$SHIPYARD_HOME`` when the node shares its machine."""

    @property
    def sandboxed(self) -> bool:
        """The full sandbox: namespaces and the job's private network (local backend)."""
        return self.mode == JOB_NETWORK

    @property
    def contained(self) -> bool:
        """The instance has its own mount, UTS and PID namespaces, its filesystem view and
        no privileges (any sandbox: /opt/ml is its tree, its host name is algo-k)."""
        return self.mode in (JOB_NETWORK, NODE_NETWORK)

    @property
    def decided_on_node(self) -> bool:
        return self.node_address is not None

    def with_network(self, network: dict[str, Any] | None) -> SandboxPlan:
        return replace(self, network=network)

    def to_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["hidden"] = list(self.hidden)
        return out

    @classmethod
    def from_dict(cls, data: Any) -> SandboxPlan:
        """Validated: an unknown or mistyped field is an AgentConfigError naming it."""
        if not isinstance(data, dict):
            raise _bad("", f"must be a JSON object, got {type(data).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise _bad(
                unknown[0],
                f"is not a field of the sandbox plan (fields: {', '.join(sorted(known))})",
            )
        mode = data.get("mode", OFF)
        if mode not in MODES:
            raise _bad("mode", f"is {mode!r}, not one of {', '.join(MODES)}")
        for name in ("rootless", "isolation"):
            if not isinstance(data.get(name, False), bool):
                raise _bad(name, f"must be true or false, got {data[name]!r}")
        for name in ("reason", "node_address"):
            value = data.get(name)
            if value is not None and not isinstance(value, str):
                raise _bad(name, f"must be a string, got {value!r}")
        network = data.get("network")
        if network is not None and not isinstance(network, dict):
            raise _bad("network", f"must be a JSON object or null, got {network!r}")
        hidden = data.get("hidden", [])
        if not isinstance(hidden, list | tuple) or not all(isinstance(p, str) for p in hidden):
            raise _bad("hidden", f"must be a list of paths, got {hidden!r}")
        if mode == NODE_NETWORK and not data.get("node_address"):
            raise _bad("node_address", "is required in mode node_network (the node's address)")
        return cls(
            mode=mode,
            reason=data.get("reason") or "",
            rootless=data.get("rootless", False),
            isolation=data.get("isolation", False),
            network=network,
            node_address=data.get("node_address"),
            hidden=tuple(hidden),
        )


def _bad(name: str, what: str) -> AgentConfigError:
    where = f"sandbox.{name}" if name else "sandbox"
    return AgentConfigError(
        f"agent.json: {where} {what}; agent.json is written for one job by the shipyard "
        "that runs it: resubmit the job with this shipyard (an agent.json from another "
        "version is not read)"
    )
