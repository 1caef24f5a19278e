"""A real 3-node Ray cluster on this machine, shared by the Ray backend tests of this
package (test_ray_backend and test_ray_mpi: one start, about 10 s, instead of one per
module; the node-death test puts its node back).

Each node gets its own loopback IP (127.0.0.12-14), the documented way to run a
multi-node cluster on one machine: every node then counts as a machine of its own, and
instances bind SageMaker's fixed ports on their node's IP without colliding. Worker nodes
have 2 CPUs each (logical; the machine's cores are shared); the head (127.0.0.11) has
none, so no instance lands on it and a test can kill any instance's node without taking
the cluster down. Node work dirs live under one
temporary SHIPYARD_RAY_WORKDIR, inherited by the nodes' processes, so the tests can check
that nothing of a job is left on any node.
"""

from __future__ import annotations

import os
import shutil
import tempfile

import psutil
import pytest

HEAD_IP = "127.0.0.11"
NODE_IPS = ("127.0.0.12", "127.0.0.13", "127.0.0.14")
NODE_CPUS = 2
# Fast failure detection for the node-death test (Ray's defaults take tens of seconds).
SYSTEM_CONFIG = {
    "health_check_initial_delay_ms": 1000,
    "health_check_period_ms": 1000,
    "health_check_timeout_ms": 1000,
    "health_check_failure_threshold": 3,
}


class RayCluster:
    def __init__(self, workdir: str) -> None:
        from ray.cluster_utils import Cluster

        self.workdir = workdir
        self.cluster = Cluster(
            initialize_head=True,
            head_node_args={
                "num_cpus": 0,
                "node_ip_address": HEAD_IP,
                "include_dashboard": False,
                "_system_config": SYSTEM_CONFIG,
            },
        )
        self.nodes = {}
        for ip in NODE_IPS:
            self.add(ip)
        self.cluster.wait_for_nodes()
        self.address = self.cluster.address

    def add(self, ip: str):
        node = self.cluster.add_node(num_cpus=NODE_CPUS, node_ip_address=ip)
        self.nodes[ip] = node
        return node

    def kill(self, ip: str) -> None:
        """Kill a worker node's processes (raylet and all), as a lost machine."""
        self.cluster.remove_node(self.nodes.pop(ip), allow_graceful=False)

    def shutdown(self) -> None:
        import ray

        ray.shutdown()
        self.cluster.shutdown()


@pytest.fixture(scope="package")
def ray_cluster():
    workdir = tempfile.mkdtemp(prefix="shipyard-ray-nodes-")
    old = os.environ.get("SHIPYARD_RAY_WORKDIR")
    os.environ["SHIPYARD_RAY_WORKDIR"] = workdir
    cluster = RayCluster(workdir)
    try:
        yield cluster
    finally:
        cluster.shutdown()
        if old is None:
            os.environ.pop("SHIPYARD_RAY_WORKDIR", None)
        else:
            os.environ["SHIPYARD_RAY_WORKDIR"] = old
        shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture
def ray_session(home, ray_cluster):
    import shipyard

    return shipyard.Session(backend="ray", address=ray_cluster.address, home=str(home))


def keepers(job_name: str) -> list[psutil.Process]:
    """The job's keeper processes still alive on any node (their cmdline names the job)."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        cmd = proc.info.get("cmdline") or []
        if "shipyard.backends.ray.keeper" in cmd and job_name in cmd:
            found.append(proc)
    return found


def leftovers(workdir: str, job_name: str) -> list[str]:
    """Files of the job still on any node (all nodes share this machine's disk here)."""
    root = os.path.join(workdir, job_name)
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        out.extend(os.path.join(dirpath, n) for n in dirnames + filenames)
    return out + ([root] if os.path.exists(root) else [])
