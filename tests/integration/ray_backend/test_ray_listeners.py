"""Issue 15 on Ray: no listener of a job binds a wildcard address on its node.

While an mpi job and a TF parameter_server job run (one after the other: each takes two
of the three nodes), every TCP socket the job's processes listen on (read with ``ss`` in
each node's network namespace, kept to the job's own processes: the descendants of its
keepers) is on the node's cluster address or loopback, never ``0.0.0.0``/``[::]``: Open
MPI's prterun/prted out-of-band listeners and TCP BTL and ``tf.distribute.Server`` (the
two that bound wildcards before the bind shim, shipyard.sandbox.bindshim) included. A
connection to those ports at another address of the node (its loopback, and a second
"public" address the fixture gives each node on a dummy interface) is refused.

Needs the namespaced test cluster (root): with loopback nodes, "another address of the
node" does not exist.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time

import psutil
import pytest

import shipyard
from tests.integration.ray_backend.conftest import (
    NAMESPACED,
    NODE_IPS,
    keepers,
    netns_name,
    public_address,
)
from tests.job_scripts import MPI_PRELUDE, TF_PRELUDE

pytestmark = pytest.mark.skipif(
    not NAMESPACED, reason="needs the namespaced Ray test cluster (root, iproute2, nsenter)"
)

WAIT = r"""
import os, socket, time
{prelude}
out = os.environ["SM_OUTPUT_DATA_DIR"]
open(os.path.join(out, "ready"), "w").close()
while not os.path.exists(os.path.join(os.environ["SM_INPUT_DIR"], "go")):
    time.sleep(0.05)
"""
WILDCARDS = ("0.0.0.0", "*", "[::]", "[::ffff:0.0.0.0]")
# one line of `ss -Hltnp`: the local address:port (4th column) and the users' pids
SS_PID = re.compile(r"pid=(\d+)")
# tries each (address, port) from inside a node's namespace; prints what connected
PROBE = r"""
import json, socket, sys
reached = []
for address, port in json.loads(sys.argv[1]):
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    with socket.socket(family) as s:
        s.settimeout(2)
        if s.connect_ex((address, port)) == 0:
            reached.append(f"{address}:{port}")
print(json.dumps(reached))
"""


def _in_node(ip: str, argv: list[str]) -> str:
    return subprocess.run(
        ["nsenter", f"--net=/run/netns/{netns_name(ip)}", "--", *argv],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout


def _job_processes(job: str) -> dict[int, list[str]]:
    """pid -> command line of every process of the job on every node."""
    found = {}
    for keeper in keepers(job):
        try:
            for p in [keeper, *keeper.children(recursive=True)]:
                found[p.pid] = p.cmdline()
        except psutil.Error:
            continue
    return found


def _name(cmdline: list[str]) -> str:
    """prterun, prted, or a Python process's module (shipyard.tf.server, mpi4py, ...)."""
    program = os.path.basename(cmdline[0]) if cmdline else "?"
    if program.startswith("python") and "-m" in cmdline[:-1]:
        return cmdline[cmdline.index("-m") + 1]
    return program


def _listeners(job: str) -> list[tuple[str, str, str, int]]:
    """(node ip, local address:port, process name, pid) of every TCP listener of the job."""
    procs = _job_processes(job)
    out = []
    for ip in NODE_IPS:
        for line in _in_node(ip, ["ss", "-Hltnp"]).splitlines():
            for pid in {int(p) for p in SS_PID.findall(line)} & set(procs):
                out.append((ip, line.split()[3], _name(procs[pid]), pid))
    return out


def _tf_servers_listen(job: str) -> bool:
    """Every ``shipyard.tf.server --serve`` process listens on a port other than the
    relays' public ones: its TensorFlow server is up (the relays answer the chief before
    TensorFlow has started)."""
    procs = _job_processes(job)
    servers = {p for p, cmd in procs.items() if "shipyard.tf.server" in cmd and "--serve" in cmd}
    public = {
        cmd[i + 1].partition(">")[0].rsplit(":", 1)[1]
        for cmd in procs.values()
        for i, arg in enumerate(cmd[:-1])
        if arg == "--relay"
    }
    serving = {pid for _, local, _, pid in _listeners(job) if local.rsplit(":", 1)[1] not in public}
    return bool(servers) and servers <= serving


def _wait_ready(ray_cluster, job: str, hosts: list[str], timeout: float = 180) -> None:
    marks = [
        os.path.join(ray_cluster.workdir, job, "instances", h, "output", "data", "ready")
        for h in hosts
    ]
    deadline = time.monotonic() + timeout
    while not all(os.path.exists(m) for m in marks):
        assert time.monotonic() < deadline, f"{job} never got ready"
        time.sleep(0.1)


def _release(ray_cluster, job: str) -> None:
    for k in (1, 2):
        inp = os.path.join(ray_cluster.workdir, job, "instances", f"algo-{k}", "input")
        if os.path.isdir(inp):
            open(os.path.join(inp, "go"), "w").close()


def _check_listeners(ray_cluster, job: str) -> list[tuple[str, str, str, int]]:
    found = _listeners(job)
    wild = [f for f in found if f[1].rsplit(":", 1)[0] in WILDCARDS]
    assert wild == [], f"wildcard listeners of {job}: {wild} (all: {found})"
    # every other listener is on its node's cluster address (plain or IPv4-mapped) or on
    # loopback (IPv6-only wildcards become ::1: an IPv4 cluster has no IPv6 address). No
    # port answers at the node's other network address, and the cluster-address ones do
    # not answer on IPv4 loopback either (as a wildcard would)
    loopback = {(ip, local.rsplit(":", 1)[1]) for ip, local, *_ in found if "127.0.0.1" in local}
    tries: dict[str, set[tuple[str, int]]] = {}
    for ip, local, *_ in found:
        address, port = local.rsplit(":", 1)
        address = address.strip("[]").removeprefix("::ffff:")
        assert address in (ip, "127.0.0.1", "::1"), (ip, local, found)
        tries.setdefault(ip, set()).add((public_address(ip), int(port)))
        if address == ip and (ip, port) not in loopback:
            tries[ip].add(("127.0.0.1", int(port)))
    for ip, targets in tries.items():
        probe = [sys.executable, "-c", PROBE, json.dumps(sorted(targets))]
        reached = json.loads(_in_node(ip, probe))
        assert reached == [], f"{job} on {ip}: reachable at another address: {reached}"
    return found


def _run(ray_session, ray_cluster, write_script, job: str, script: str, **kwargs) -> list:
    src = write_script(f"{job}.py", script)
    cls = kwargs.pop("cls", shipyard.Estimator)
    ready_hosts = kwargs.pop("ready_hosts", ["algo-1", "algo-2"])
    wait_for = kwargs.pop("wait_for", None)
    est = cls(
        entry_point=f"{job}.py",
        source_dir=src,
        instance_count=2,
        instance_type="local",
        session=ray_session,
        **kwargs,
    )
    try:
        est.fit(job_name=job, wait=False)
        _wait_ready(ray_cluster, job, ready_hosts)
        if wait_for is not None:
            deadline = time.monotonic() + 150
            while not wait_for(job):
                assert time.monotonic() < deadline, f"{job}: {_listeners(job)}"
                time.sleep(0.5)
        found = _check_listeners(ray_cluster, job)
    finally:
        _release(ray_cluster, job)
    record = est.latest_training_job.wait(logs=False)
    assert record["TrainingJobStatus"] == "Completed", record.get("FailureReason")
    return found


@pytest.mark.timeout(300)
def test_mpi_job_listens_only_on_its_nodes_cluster_addresses(
    ray_session, ray_cluster, write_script
):
    pytest.importorskip("mpi4py")
    found = _run(
        ray_session,
        ray_cluster,
        write_script,
        "ray-mpi-listen",
        WAIT.format(prelude=MPI_PRELUDE),
        distribution={"mpi": {"enabled": True, "processes_per_host": 1}},
    )
    by_name: dict[str, set[str]] = {}
    for ip, _, name, _ in found:
        by_name.setdefault(name, set()).add(ip)
    # the listeners that bound wildcards before the shim: prterun's out-of-band ports on
    # algo-1's node, prted's on algo-2's, and both ranks' TCP BTL
    assert len(by_name.get("prterun", ())) == 1 and len(by_name.get("prted", ())) == 1, found
    assert len(by_name.get("mpi4py", ())) == 2, found


@pytest.mark.tensorflow
@pytest.mark.timeout(300)
def test_tf_parameter_server_job_listens_only_on_its_nodes_cluster_addresses(
    ray_session, ray_cluster, write_script
):
    pytest.importorskip("tensorflow")
    found = _run(
        ray_session,
        ray_cluster,
        write_script,
        "ray-tf-listen",
        WAIT.format(prelude=TF_PRELUDE),
        cls=shipyard.TensorFlow,
        distribution={"parameter_server": {"enabled": True}},
        ready_hosts=["algo-1"],  # the script runs on the chief only
        wait_for=_tf_servers_listen,
    )
    # tf.distribute.Server's gRPC listeners (a ps task on each node, algo-2's worker)
    # next to their relays, all in shipyard.tf.server processes on both nodes
    servers = {(ip, pid) for ip, _, name, pid in found if name == "shipyard.tf.server"}
    assert len({ip for ip, _ in servers}) == 2 and len(servers) >= 3, found
