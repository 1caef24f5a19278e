"""Where a job's instances go on a Ray cluster and which address each one gets (pure).

No Ray import here: the rules are plain functions of the cluster's node list, so they are
unit-tested without a cluster and quoted in the docs.

* Resources per instance come from the instance type: a SageMaker type asks for what
  SageMaker grants it (``ml.m5.xlarge``: 4 CPUs; ``ml.p3.2xlarge``: 8 CPUs + 1 GPU), not
  capped to the submitting machine; ``local`` asks for 1 CPU (``local_gpu``: 1 CPU + 1
  GPU) and the instance reports its node's own CPU/GPU count as SM_NUM_CPUS/GPUS.
* A machine is a node IP. When the cluster spans several machines, every instance gets
  a machine of its own (one bundle per instance, STRICT_SPREAD; when some machine runs
  several raylets the bundles are also pinned to distinct IPs through Ray's
  ``node:<ip>`` resources) and its address is that machine's IP, so SageMaker's fixed
  ports (TF 2222, torchrun 7777, ...) never collide. Fewer machines that fit than
  instances: refused, saying how many are needed and how many fit.
* When every node of the cluster has one and the same IP (a one-machine cluster started
  with ``ray start`` several times), instances may share the machine (STRICT_SPREAD when
  there are enough nodes, SPREAD otherwise) and each gets its own loopback address, the
  job's 127.X.Y.k, exactly as on the local backend.
* To run a multi-node cluster on one machine (tests, demos), give each node its own
  loopback IP (``ray start --node-ip-address 127.0.0.12``, or
  ``Cluster.add_node(node_ip_address=...)``): each node then counts as a machine.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from shipyard import instance_types
from shipyard.errors import ValidationError

# A bundle pinned to a machine asks for a sliver of that node's ``node:<ip>`` resource.
PIN_AMOUNT = 0.001


@dataclass(frozen=True)
class NodeInfo:
    node_id: str
    ip: str
    cpus: float
    gpus: float


@dataclass(frozen=True)
class Demand:
    """What one instance asks of its node."""

    instance_type: str
    cpus: float
    gpus: float
    whole_node: bool  # 'local'/'local_gpu': the instance reports its node's own counts

    def describe(self) -> str:
        return f"{self.cpus:g} CPU(s), {self.gpus:g} GPU(s)"


@dataclass(frozen=True)
class Placement:
    strategy: str  # "STRICT_SPREAD" | "SPREAD"
    bundles: list[dict[str, float]]
    one_machine: bool  # every node shares one IP: loopback addresses


def demand(instance_type: str) -> Demand:
    if instance_type == "local":
        return Demand(instance_type, 1, 0, True)
    if instance_type == "local_gpu":
        return Demand(instance_type, 1, 1, True)
    cpus, gpus = instance_types.nominal(instance_type)
    return Demand(instance_type, cpus, gpus, False)


def fits(node: NodeInfo, want: Demand) -> bool:
    return node.cpus >= want.cpus and node.gpus >= want.gpus


def plan_placement(nodes: list[NodeInfo], count: int, want: Demand, where: str) -> Placement:
    """Bundles and strategy for ``count`` instances, or a ValidationError saying why not."""
    if not nodes:
        raise ValidationError(f"the Ray cluster at {where} has no alive node")
    fitting = [n for n in nodes if fits(n, want)]
    by_ip: dict[str, list[NodeInfo]] = defaultdict(list)
    for node in fitting:
        by_ip[node.ip].append(node)
    one_machine = len({n.ip for n in nodes}) == 1
    bundle = {"CPU": float(want.cpus)}
    if want.gpus:
        bundle["GPU"] = float(want.gpus)
    if one_machine and fitting:
        strategy = "STRICT_SPREAD" if len(fitting) >= count else "SPREAD"
        total_cpus = sum(n.cpus for n in fitting)
        if total_cpus < want.cpus * count or sum(n.gpus for n in fitting) < want.gpus * count:
            raise ValidationError(_shortage(nodes, fitting, count, want, where, one_machine))
        return Placement(strategy, [dict(bundle) for _ in range(count)], True)
    if len(by_ip) < count:
        raise ValidationError(_shortage(nodes, fitting, count, want, where, one_machine))
    if all(len(group) == 1 for group in by_ip.values()):
        return Placement("STRICT_SPREAD", [dict(bundle) for _ in range(count)], False)
    # Some machine runs several raylets: pin each bundle to a different IP.
    ips = sorted(by_ip, key=lambda ip: (-max(n.cpus for n in by_ip[ip]), ip))[:count]
    return Placement(
        "STRICT_SPREAD", [dict(bundle, **{f"node:{ip}": PIN_AMOUNT}) for ip in ips], False
    )


def _shortage(
    nodes: list[NodeInfo],
    fitting: list[NodeInfo],
    count: int,
    want: Demand,
    where: str,
    one_machine: bool,
) -> str:
    largest = max(nodes, key=lambda n: (n.cpus, n.gpus))
    machines = len({n.ip for n in fitting})
    if one_machine:
        have = (
            f"its {len(nodes)} node(s) on one machine offer "
            f"{sum(n.cpus for n in fitting):g} CPU(s) and {sum(n.gpus for n in fitting):g} "
            f"GPU(s) to instances of this size"
        )
    else:
        have = (
            f"it has {len({n.ip for n in nodes})} machine(s) ({len(nodes)} alive node(s)), "
            f"{machines} of which fit one instance"
        )
    return (
        f"the job needs {count} instance(s) of {want.instance_type!r} ({want.describe()} "
        f"each, one machine per instance) but the Ray cluster at {where} is too small: "
        f"{have}; the largest node has {largest.cpus:g} CPU(s) and {largest.gpus:g} "
        f"GPU(s). Add nodes, use a smaller instance_type or fewer instances"
    )


def instance_addresses(
    hosts: list[str], node_ips: list[str], loopback: dict[str, str]
) -> dict[str, str]:
    """algo-k -> the address its processes bind and its peers dial.

    Instances on machines of their own get the machine's IP; when they all share one IP
    (one machine) they keep the job's loopback addresses. A mix would make co-located
    instances collide on fixed ports, so it is refused (placement never produces it).
    """
    if len(set(node_ips)) == len(node_ips):
        return dict(zip(hosts, node_ips))
    if len(set(node_ips)) == 1:
        return {host: loopback[host] for host in hosts}
    raise ValidationError(
        "instances were placed on machines shared with other instances of the job "
        f"({dict(zip(hosts, node_ips))}); their fixed ports would collide"
    )
