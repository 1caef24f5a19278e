"""TF_CONFIG for every process of a TensorFlow job: pure functions, no TensorFlow.

Layouts (``distribution={'parameter_server': {'enabled': True, 'layout': ...}}``):

* ``"tf2"`` (default): what ``tf.distribute.ParameterServerStrategy`` needs. algo-1
  runs the ``chief`` (the user's script, the coordinator); every instance runs one
  ``worker`` task and one ``ps`` task, both plain ``tf.distribute.Server`` processes
  that only serve. N instances give N workers, as SageMaker's layout does.
* ``"sagemaker"``: the TensorFlow training toolkit's layout for TF1-style scripts
  (``master`` = algo-1, ``worker`` = algo-2..N, ``ps`` = every instance,
  ``"environment": "cloud"``), with the user's script on every instance.

Addresses are IPs, never ``algo-k`` names: TensorFlow resolves names in C++ (gRPC),
past the Python resolver shim. Ports are SageMaker's (master/worker 2222, ps 2223,
multi-worker mirrored 8890; the tf2 layout's workers 2224 since algo-1 holds both a
chief and a worker).

Why a process's *own* entry differs: a TensorFlow server binds ``0.0.0.0:<port>``
whatever IP its address names, so N instances on one machine cannot all bind 2222.
Every process therefore sees its own task at a private port picked free on its
machine, and every other task at its public address ``<instance IP>:<SageMaker
port>``, where shipyard's relay (shipyard.runtime.traffic) listens on that IP only
and forwards to the private port, counting the bytes on the way.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from shipyard.errors import DistributionError

if TYPE_CHECKING:  # aliases are strings: job processes may run in Python 3.7/3.8
    from typing import TypeAlias

LAYOUTS = ("tf2", "sagemaker")
DEFAULT_LAYOUT = "tf2"
DEFAULT_PORTS = {
    "tf2": {"chief": 2222, "ps": 2223, "worker": 2224},
    "sagemaker": {"master": 2222, "ps": 2223, "worker": 2222},
}
MWMS_PORT = 8890
PS_OPTION_KEYS = ("enabled", "implementation", "layout", "ports")
MWMS_OPTION_KEYS = ("enabled", "port")


@dataclass(frozen=True)
class Task:
    """One TensorFlow task: its job (``chief``, ``ps``...), index, instance and port."""

    type: str
    index: int
    host: str
    port: int

    @property
    def name(self) -> str:
        return f"{self.type}:{self.index}"


def layout_of(options: Mapping[str, Any]) -> str:
    return options.get("layout") or DEFAULT_LAYOUT


def ports_of(options: Mapping[str, Any]) -> dict[str, int]:
    layout = layout_of(options)
    return {**DEFAULT_PORTS[layout], **(options.get("ports") or {})}


def _check_port(value: Any, where: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 65535:
        raise DistributionError(f"{where} must be a TCP port (1-65535), got {value!r}")


def check_ps_options(options: Mapping[str, Any]) -> None:
    """Refuse parameter_server options the TensorFlow runner cannot honour."""
    if "processes_per_host" in options:
        raise DistributionError(
            "distribution['parameter_server'] runs one worker per host (as SageMaker does, "
            "whatever the number of GPUs); remove 'processes_per_host', or use "
            "{'mpi': {'enabled': True, 'processes_per_host': N}} for several processes per host"
        )
    unknown = sorted(k for k in options if k not in PS_OPTION_KEYS)
    if unknown:
        raise DistributionError(
            f"unknown distribution['parameter_server'] key(s) {unknown}; known: "
            f"{list(PS_OPTION_KEYS)}"
        )
    layout = layout_of(options)
    if layout not in LAYOUTS:
        raise DistributionError(
            f"distribution['parameter_server']['layout'] must be 'tf2' (chief + worker + ps, "
            f"for tf.distribute.ParameterServerStrategy) or 'sagemaker' (master + worker + ps, "
            f"for TF1-style scripts), got {layout!r}"
        )
    ports = options.get("ports") or {}
    if not isinstance(ports, Mapping):
        raise DistributionError(
            "distribution['parameter_server']['ports'] must be a dict such "
            f"as {DEFAULT_PORTS[layout]}, got {ports!r}"
        )
    for role, port in ports.items():
        if role not in DEFAULT_PORTS[layout]:
            raise DistributionError(
                f"distribution['parameter_server']['ports'] has no role {role!r} in the "
                f"{layout!r} layout; roles: {sorted(DEFAULT_PORTS[layout])}"
            )
        _check_port(port, f"distribution['parameter_server']['ports'][{role!r}]")
    merged = ports_of(options)
    clash = [r for r in merged if r != "ps" and merged[r] == merged["ps"]]
    if clash:
        raise DistributionError(
            f"distribution['parameter_server']['ports']: ps and {clash[0]} both use port "
            f"{merged['ps']} on the same instance; give them different ports"
        )
    if layout == "tf2" and merged["chief"] == merged["worker"]:
        raise DistributionError(
            "distribution['parameter_server']['ports']: in the tf2 layout algo-1 runs both the "
            "chief and a worker, so their ports must differ"
        )


def ps_tasks(layout: str, hosts: list[str], ports: Mapping[str, int]) -> dict[str, list[Task]]:
    """The cluster's tasks by job, in the order TF_CONFIG lists them."""
    if layout == "sagemaker":
        return {
            "master": [Task("master", 0, hosts[0], ports["master"])],
            "ps": [Task("ps", i, h, ports["ps"]) for i, h in enumerate(hosts)],
            "worker": [Task("worker", i, h, ports["worker"]) for i, h in enumerate(hosts[1:])],
        }
    return {
        "chief": [Task("chief", 0, hosts[0], ports["chief"])],
        "ps": [Task("ps", i, h, ports["ps"]) for i, h in enumerate(hosts)],
        "worker": [Task("worker", i, h, ports["worker"]) for i, h in enumerate(hosts)],
    }


def mwms_tasks(hosts: list[str], port: int = MWMS_PORT) -> dict[str, list[Task]]:
    return {"worker": [Task("worker", i, h, port) for i, h in enumerate(hosts)]}


def tf_config(
    tasks: Mapping[str, list[Task]],
    addresses: Mapping[str, str],
    me: Task,
    private_port: int | None = None,
) -> dict[str, Any]:
    """TF_CONFIG of the process running ``me``; its own address uses ``private_port``."""
    cluster = {}
    for job, members in tasks.items():
        cluster[job] = [
            f"{addresses[t.host]}:{private_port if t == me and private_port else t.port}"
            for t in members
        ]
    return {
        "cluster": cluster,
        "environment": "cloud",
        "task": {"index": me.index, "type": me.type},
    }


def encode(config: Mapping[str, Any]) -> str:
    """As the toolkit writes it: ``json.dumps`` with default separators, key order kept."""
    return json.dumps(config)


def tasks_on(tasks: Mapping[str, list[Task]], host: str) -> list[Task]:
    return [t for members in tasks.values() for t in members if t.host == host]


def free_port(address: str = "0.0.0.0") -> int:
    """A port nothing listens on now (TensorFlow binds 0.0.0.0, so ask for that)."""
    with socket.socket() as sock:
        sock.bind((address, 0))
        return sock.getsockname()[1]


PortPicker: TypeAlias = "Callable[[], int]"
