"""A real 3-node Ray cluster on this machine, shared by the Ray backend tests of this
package (one start instead of one per module; the node-death test puts its node back).

As root (CI), each worker node is a machine of its own on a private network: a network
namespace per node (``ray start`` under ``nsenter --net``), whose ``eth0`` (one end of a
veth pair) carries the node's address ``10.a.b.12-14/24``, joined by a bridge (in a
namespace of its own, out of reach of the machine's firewall rules) that the test's own
namespace joins too with ``10.a.b.1``, where the head runs (so the test process is the
driver, as on a laptop next to a cluster). Each
node owns an interface and its port space, as real machines do: Open MPI advertises the
node's own address, and each node has a second interface (``pub0``, ``192.0.2.k``) where
a job's listeners must not answer (tests/integration/ray_backend/test_ray_listeners.py).
``a.b`` come from this
process's pid, so two test runs on one machine do not collide; everything (processes,
namespaces, veths, bridge) goes at the end.

Without root (or with SHIPYARD_TEST_RAY_LOOPBACK=1), the nodes are loopback addresses
(127.0.0.12-14) of one namespace, Ray's documented way to run a multi-node cluster on one
machine: every node counts as a machine of its own by its IP, but they share interfaces
and ports.

Worker nodes have 2 CPUs each (logical; the machine's cores are shared); the head has
none, so no instance lands on it and a test can kill any instance's node without taking
the cluster down. Node work dirs live under one temporary SHIPYARD_RAY_WORKDIR,
inherited by the nodes' processes, so the tests can check that nothing of a job is left
on any node.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator

import psutil
import pytest

NODE_CPUS = 2
# Fast failure detection for the node-death test (Ray's defaults take tens of seconds).
SYSTEM_CONFIG = {
    "health_check_initial_delay_ms": 1000,
    "health_check_period_ms": 1000,
    "health_check_timeout_ms": 1000,
    "health_check_failure_threshold": 3,
}
NAMESPACED = (
    os.environ.get("SHIPYARD_TEST_RAY_LOOPBACK") != "1"  # the non-root layout, as root
    and sys.platform.startswith("linux")
    and os.geteuid() == 0
    and shutil.which("ip") is not None
    and shutil.which("nsenter") is not None
)
_TAG = os.getpid()  # in every name this run makes, so a later run can tell it is stale
PREFIX = f"10.{200 + _TAG % 10000 // 250 % 50}.{_TAG % 250}" if NAMESPACED else "127.0.0"
HEAD_IP = f"{PREFIX}.1" if NAMESPACED else "127.0.0.11"
NODE_IPS = tuple(f"{PREFIX}.{k}" for k in (12, 13, 14))
BRIDGE_NS = f"shyray{_TAG}-br"
# Ray's own daemons on a node: killing them is losing the machine (workers follow).
RAY_DAEMONS = ("raylet", "dashboard/agent.py", "runtime_env/agent/main.py", "log_monitor.py")
START_TIMEOUT_S = 120.0
# No Ray log monitor on any node: it streams Ray workers' stdout to drivers, which shipyard
# does not use (an instance's log comes back through its actor's ticks), and each one
# rescans the node's log files every 0.1 s for the whole package (4 nodes: ~3 s of CPU a
# minute, measured at load 5-8, issue 36).
LOG_MONITOR = False


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


def netns_name(ip: str) -> str:
    return f"shyray{_TAG}-{ip.rsplit('.', 1)[1]}"


def public_address(ip: str) -> str:
    """The node's second address (TEST-NET-1, on its second interface, pub0)."""
    return f"192.0.2.{ip.rsplit('.', 1)[1]}"


def netns_pids(ip: str) -> list[int]:
    """Every process in the node's network namespace."""
    out = subprocess.run(
        ["ip", "netns", "pids", netns_name(ip)], capture_output=True, text=True, check=False
    ).stdout
    return [int(p) for p in out.split()]


class NodeNetwork:
    """The cluster's network (root only): a bridge in a namespace of its own (so the
    machine's bridge firewall, br_netfilter with iptables FORWARD rules such as Docker's
    DROP policy, never filters the nodes' traffic), a veth from this namespace to it
    (``shyrh<tag>`` with HEAD_IP), and one namespace + veth (``eth0``) per node."""

    def __init__(self) -> None:
        self.made: list[str] = []
        try:
            self._make()
        except BaseException:
            self.remove()
            raise

    @staticmethod
    def remove_stale() -> None:
        """Delete the namespaces of earlier runs whose test process is gone (a run that
        was SIGKILLed never reached its teardown), and kill what still runs in them:
        their host-side veth would hold an address this run may reuse."""
        out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        for line in out.splitlines():
            found = re.match(r"(shyray(\d+)-\S+)", line)
            if found and int(found.group(2)) != _TAG and not psutil.pid_exists(int(found.group(2))):
                name = found.group(1)
                pids = subprocess.run(
                    ["ip", "netns", "pids", name], capture_output=True, text=True
                ).stdout.split()
                _kill_and_wait([int(p) for p in pids])  # its orphaned Ray node, if any
                subprocess.run(["ip", "netns", "del", name], capture_output=True)

    def _make(self) -> None:
        self.remove_stale()
        _ip("netns", "add", BRIDGE_NS)
        self.made.append(BRIDGE_NS)
        _ip("-n", BRIDGE_NS, "link", "add", "br0", "type", "bridge")
        _ip("-n", BRIDGE_NS, "link", "set", "br0", "up")
        host_end = f"shyrh{_TAG}"
        self._link(host_end, None, "up0", HEAD_IP)
        for ip in NODE_IPS:
            ns = netns_name(ip)
            _ip("netns", "add", ns)
            self.made.append(ns)
            self._link("eth0", ns, f"n{ip.rsplit('.', 1)[1]}", ip)
            _ip("-n", ns, "link", "set", "lo", "up")
            # a second network interface with an address of its own, as a machine's
            # public network: a listener on the cluster address must not answer there
            # (test_ray_listeners.py). Both ends of a veth pair in the namespace: the
            # kernel has no dummy interfaces everywhere. No default route: an address
            # outside the cluster fails at once instead of timing out.
            _ip("-n", ns, "link", "add", "pub0", "type", "veth", "peer", "name", "pub1")
            _ip("-n", ns, "addr", "add", f"{public_address(ip)}/32", "dev", "pub0")
            _ip("-n", ns, "link", "set", "pub0", "up")
            _ip("-n", ns, "link", "set", "pub1", "up")

    @staticmethod
    def _link(name: str, ns: str | None, bridge_end: str, ip: str) -> None:
        """A veth ``name`` in ``ns`` (None: this namespace) with ``ip/24``, whose other end
        ``bridge_end`` is a port of the bridge."""
        here = ["netns", ns] if ns else []
        peer = ["peer", "name", bridge_end, "netns", BRIDGE_NS]
        _ip("link", "add", "name", name, *here, "type", "veth", *peer)
        _ip("-n", BRIDGE_NS, "link", "set", bridge_end, "master", "br0", "up")
        inside = ["-n", ns] if ns else []
        _ip(*inside, "addr", "add", f"{ip}/24", "dev", name)
        _ip(*inside, "link", "set", name, "up")

    def remove(self) -> None:
        # a namespace takes its interfaces along, and a veth goes with its other end
        for name in reversed(self.made):
            subprocess.run(["ip", "netns", "del", name], capture_output=True, check=False)


def _kill_and_wait(pids: list[int], within: float = 30.0) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    gone_by = time.monotonic() + within
    while any(_alive(p) for p in pids):
        assert time.monotonic() < gone_by, f"processes {pids} outlived SIGKILL"
        time.sleep(0.1)


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


class RayCluster:
    def __init__(self, workdir: str) -> None:
        from ray.cluster_utils import Cluster

        self.workdir = workdir
        self.network = NodeNetwork() if NAMESPACED else None
        try:
            self.cluster = Cluster(
                initialize_head=True,
                head_node_args={
                    "num_cpus": 0,
                    "node_ip_address": HEAD_IP,
                    "include_dashboard": False,
                    "include_log_monitor": LOG_MONITOR,
                    "_system_config": SYSTEM_CONFIG,
                },
            )
            self.address = self.cluster.address
            self.nodes: dict[str, object] = {}
            # one after the other: raylets of one machine pick their socket files in the
            # shared session dir by counting, and two at once picked the same name
            for ip in NODE_IPS:
                self.add(ip)
            if not NAMESPACED:  # it counts only the nodes it started itself
                self.cluster.wait_for_nodes()
            self._wait_for_nodes(len(NODE_IPS) + 1)
        except BaseException:
            self.shutdown()
            raise

    def _start_in_namespace(self, ip: str) -> None:
        ray = os.path.join(os.path.dirname(sys.executable), "ray")
        proc = subprocess.run(
            [
                "nsenter",
                f"--net=/run/netns/{netns_name(ip)}",
                "--",
                ray,
                "start",
                f"--address={self.address}",
                f"--node-ip-address={ip}",
                f"--num-cpus={NODE_CPUS}",
                f"--object-store-memory={150 * 1024 * 1024}",
                "--disable-usage-stats",
                f"--include-log-monitor={LOG_MONITOR}",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=START_TIMEOUT_S,
            check=False,
        )
        assert proc.returncode == 0, f"ray start in {netns_name(ip)} failed:\n{proc.stdout}"
        self.nodes[ip] = ip

    def _wait_for_nodes(self, count: int) -> None:
        import ray

        from shipyard.backends.ray.connect import connect

        connect(self.address)
        deadline = time.monotonic() + START_TIMEOUT_S
        while sum(1 for n in ray.nodes() if n["Alive"]) < count:
            assert time.monotonic() < deadline, ray.nodes()
            time.sleep(0.2)

    def add(self, ip: str):
        if NAMESPACED:
            self._start_in_namespace(ip)
            self._wait_for_nodes(len(self.nodes) + 1)
            return ip
        node = self.cluster.add_node(num_cpus=NODE_CPUS, node_ip_address=ip)
        self.nodes[ip] = node
        return node

    def kill(self, ip: str) -> None:
        """Kill a worker node's Ray daemons (raylet and all), as a lost machine."""
        node = self.nodes.pop(ip)
        if not NAMESPACED:
            self.cluster.remove_node(node, allow_graceful=False)
            return
        daemons = []
        for pid in netns_pids(ip):
            try:
                cmd = " ".join(psutil.Process(pid).cmdline())
            except psutil.Error:
                continue
            if any(name in cmd for name in RAY_DAEMONS):
                daemons.append(pid)
        _kill_and_wait(daemons)

    @contextlib.contextmanager
    def hold_port(self, port: int) -> Iterator[None]:
        """A wildcard listener on ``port`` on every worker node (each node has a port space
        of its own here; without namespaces, the caller's own listener holds it)."""
        if not NAMESPACED:
            yield
            return
        script = (
            "import socket, sys; s = socket.socket(); "
            "s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); "
            f"s.bind(('0.0.0.0', {port})); s.listen(1); print('ready', flush=True); "
            "sys.stdin.read()"
        )
        holders = []
        try:
            for ip in NODE_IPS:
                holder = subprocess.Popen(
                    ["nsenter", f"--net=/run/netns/{netns_name(ip)}", "--"]
                    + [sys.executable, "-c", script],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    text=True,
                )
                holders.append(holder)
                assert holder.stdout is not None and holder.stdout.readline() == "ready\n"
            yield
        finally:
            for holder in holders:
                holder.kill()
                holder.wait()

    def shutdown(self) -> None:
        import ray

        ray.shutdown()
        if self.network is not None:
            for ip in NODE_IPS:
                _kill_and_wait(netns_pids(ip))
        if getattr(self, "cluster", None) is not None:
            self.cluster.shutdown()
        if self.network is not None:
            self.network.remove()


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
