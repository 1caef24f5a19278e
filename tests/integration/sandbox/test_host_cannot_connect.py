"""Issue 15: while a TF parameter_server job, an mpi job and a DDP job run at the same time
(each in its instance sandboxes), no TCP connection from the host's network namespace to
any port the jobs listen on succeeds: host loopback and every address of the host tried.

The jobs' listening ports are read from inside their namespaces (/proc/<pid>/net/tcp{,6}
of each job process), so the test tries exactly what the jobs expose: the TF servers'
2222/2223 and their relays, prterun's and the ranks' out-of-band and BTL ports, the torch
store's 7777 and gloo's ports. The scripts only listen and wait: no training.
"""

from __future__ import annotations

import os
import socket
import time

import psutil
import pytest

import shipyard
from shipyard.sandbox import probe
from tests.conftest import job_processes
from tests.job_scripts import MPI_PRELUDE, TF_PRELUDE

pytestmark = pytest.mark.skipif(
    not probe.support().ok, reason=f"no instance sandbox here: {probe.support().reason}"
)

WAIT = r"""
import os, socket, time
{prelude}
ready = "/opt/ml/output/data/ready-" + socket.gethostname()
open(ready, "w").close()
while not os.path.exists("/opt/ml/input/go"):
    time.sleep(0.05)
{epilogue}
"""

DDP_PRELUDE = "import torch.distributed as dist\ndist.init_process_group('gloo')\n"
DDP_EPILOGUE = "dist.barrier()\ndist.destroy_process_group()\n"


def _listening_ports(pid: int) -> set[int]:
    """TCP ports listened on in ``pid``'s network namespace (its /proc view of it)."""
    ports = set()
    for name in ("tcp", "tcp6"):
        try:
            with open(f"/proc/{pid}/net/{name}", encoding="ascii") as fh:
                rows = [line.split() for line in fh.readlines()[1:]]
        except OSError:
            continue
        ports |= {int(r[1].rsplit(":", 1)[1], 16) for r in rows if len(r) > 3 and r[3] == "0A"}
    return ports


def _host_addresses() -> list[str]:
    found = {"127.0.0.1", "::1"}
    for addrs in psutil.net_if_addrs().values():
        for a in addrs:
            if a.family in (socket.AF_INET, socket.AF_INET6):
                found.add(a.address.split("%")[0])
    return sorted(found)


def _connects(address: str, port: int) -> bool:
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    with socket.socket(family) as s:
        s.settimeout(0.5)
        return s.connect_ex((address, port)) == 0


def _foreign_host_listeners(ours: set[int]) -> set[int]:
    """Ports that something other than these jobs listens on in the host's namespace (other
    work on a shared machine): a connection there proves nothing about the jobs."""
    found = set()
    for conn in psutil.net_connections(kind="tcp"):
        if conn.status == psutil.CONN_LISTEN and conn.pid not in ours:
            found.add(conn.laddr.port)
    return found


def _wait_ready(job_dir: str, hosts: list[str], timeout: float = 150) -> None:
    deadline = time.monotonic() + timeout
    marks = [os.path.join(job_dir, "instances", h, "output", "data", f"ready-{h}") for h in hosts]
    while time.monotonic() < deadline:
        if all(os.path.exists(m) for m in marks):
            return
        time.sleep(0.1)
    logs = os.path.join(job_dir, "logs")
    text = "".join(open(os.path.join(logs, n)).read()[-3000:] for n in sorted(os.listdir(logs)))
    raise AssertionError(f"{job_dir} never got ready:\n{text}")


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_no_host_connection_reaches_tf_ps_mpi_or_ddp_jobs(session, write_script, home):
    pytest.importorskip("torch")
    pytest.importorskip("tensorflow")
    pytest.importorskip("mpi4py")
    write_script("ps.py", WAIT.format(prelude=TF_PRELUDE, epilogue=""))
    write_script("mpi.py", WAIT.format(prelude=MPI_PRELUDE, epilogue=""))
    src = write_script("ddp.py", WAIT.format(prelude=DDP_PRELUDE, epilogue=DDP_EPILOGUE))
    common = dict(source_dir=src, instance_count=2, instance_type="local", session=session)
    jobs = {
        "tf-ps": shipyard.TensorFlow(
            entry_point="ps.py", distribution={"parameter_server": {"enabled": True}}, **common
        ),
        "mpi": shipyard.Estimator(
            entry_point="mpi.py",
            distribution={"mpi": {"enabled": True, "processes_per_host": 1}},
            **common,
        ),
        "ddp": shipyard.PyTorch(
            entry_point="ddp.py",
            framework_version="2.13",
            py_version="py311",
            distribution={"torch_distributed": {"enabled": True}},
            **common,
        ),
    }
    dirs = {name: os.path.join(str(home), "jobs", name) for name in jobs}
    try:
        for name, est in jobs.items():
            est.fit(job_name=name, wait=False)
        for name, job_dir in dirs.items():  # TF: the script runs on the chief only
            _wait_ready(job_dir, ["algo-1"] if name == "tf-ps" else ["algo-1", "algo-2"])
        mine = os.readlink("/proc/self/ns/net")
        procs = [p for d in dirs.values() for p in job_processes(d)]
        ours = {p.pid for p in procs}
        for p in procs:
            try:
                ours |= {c.pid for c in p.children(recursive=True)}  # pasta included
            except psutil.Error:
                pass
        ports: dict[str, set[int]] = {name: set() for name in dirs}
        for name, job_dir in dirs.items():
            for p in job_processes(job_dir):
                try:
                    if os.readlink(f"/proc/{p.pid}/ns/net") != mine:
                        ports[name] |= _listening_ports(p.pid)
                except OSError:
                    continue
        # what each distribution is known to listen on is among what was found
        assert 2223 in ports["tf-ps"], ports  # the ps servers
        assert 7777 in ports["ddp"], ports  # the torch store on algo-1
        assert ports["mpi"], ports  # prterun / prted / ranks
        every = set().union(*ports.values())
        skipped = _foreign_host_listeners(ours) & every
        tried = every - skipped
        assert {2223, 7777} <= tried, f"ports taken on this host by other work: {skipped}"
        reached = [
            f"{address}:{port}"
            for port in sorted(tried)
            for address in _host_addresses()
            if _connects(address, port)
        ]
        assert reached == [], f"reachable from the host: {reached} (ports by job: {ports})"
    finally:
        for job_dir in dirs.values():
            for i in (1, 2):
                go = os.path.join(job_dir, "instances", f"algo-{i}", "input", "go")
                if os.path.isdir(os.path.dirname(go)):
                    open(go, "w").close()
    for name, est in jobs.items():
        record = est.latest_training_job.wait(logs=False)
        assert record["TrainingJobStatus"] == "Completed", (name, record.get("FailureReason"))
