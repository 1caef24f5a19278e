"""Instances as sandboxes (shipyard.sandbox): /opt/ml at its real path, algo-k resolved by
libc, a private network per job; nothing left behind, nothing reachable from the host."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tarfile
import time

import psutil
import pytest

import shipyard
from shipyard.sandbox import network, probe
from tests.conftest import host_listeners, job_processes

pytestmark = pytest.mark.skipif(
    not probe.support().ok, reason=f"no instance sandbox here: {probe.support().reason}"
)

HARD_CODED = r"""
import json, os, glob
rc = json.load(open("/opt/ml/input/config/resourceconfig.json"))
host = rc["current_host"]
data = sorted(open(p).read() for p in glob.glob("/opt/ml/input/data/training/*"))
os.makedirs("/opt/ml/model/1", exist_ok=True)
with open(f"/opt/ml/model/1/{host}.json", "w") as fh:
    json.dump({"hosts": rc["hosts"], "data": data}, fh)
"""


def host_opt_ml() -> list[str] | None:
    return sorted(os.listdir("/opt/ml")) if os.path.isdir("/opt/ml") else None


def test_hard_coded_sagemaker_paths_reach_each_instance(session, write_script, tmp_path):
    before = host_opt_ml()
    src = write_script("train.py", HARD_CODED)
    train = tmp_path / "train"
    train.mkdir()
    (train / "a.csv").write_text("1,2\n")
    est = shipyard.Estimator(
        entry_point="train.py",
        source_dir=src,
        instance_count=2,
        instance_type="local",
        session=session,
    )
    est.fit({"training": str(train)}, job_name="hard-coded")
    model = est.model_data.removeprefix("file://")
    with tarfile.open(model) as tar:
        names = sorted(m.name for m in tar.getmembers() if m.isfile())
        records = {n: json.load(tar.extractfile(n)) for n in names}
    assert names == ["1/algo-1.json", "1/algo-2.json"]
    for record in records.values():
        assert record == {"hosts": ["algo-1", "algo-2"], "data": ["1,2\n"]}
    assert host_opt_ml() == before  # the host's /opt/ml is untouched


NAMES = r"""
import json, os, socket, subprocess, threading, time
host = socket.gethostname()


def answer(server):
    while True:
        conn, _ = server.accept()
        conn.sendall(b"shipyard-job " + host.encode() + b"\n")
        conn.close()


for port in (2222, int(os.environ["PROBE_PORT"])):
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("0.0.0.0", port))       # every instance, the same wildcard port
    s.listen(8)
    threading.Thread(target=answer, args=(s,), daemon=True).start()
getent = subprocess.run(["getent", "hosts", "algo-1", "algo-2"], capture_output=True, text=True)
ready = "/opt/ml/output/data/ready"
with open(ready + ".tmp", "w") as fh:
    json.dump({"hostname": host, "getent": getent.stdout, "addr": socket.gethostbyname(host)}, fh)
os.rename(ready + ".tmp", ready)
# each instance reaches the other's 2222 by name (libc resolves algo-k)
peer = "algo-2" if host == "algo-1" else "algo-1"
deadline = time.time() + 60
while True:
    try:
        with socket.create_connection((peer, 2222), timeout=2) as c:
            assert c.makefile().readline() == f"shipyard-job {peer}\n"
        break
    except OSError:
        if time.time() > deadline:
            raise
        time.sleep(0.1)
while not os.path.exists("/opt/ml/input/go"):
    time.sleep(0.05)
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _reaches_job(address: str, port: int) -> bool:
    """Whether a connection from here to ``address:port`` is answered by the job (its
    listeners greet with ``shipyard-job``; some networks accept any connection)."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    with socket.socket(family) as s:
        s.settimeout(0.5)
        if s.connect_ex((address, port)) != 0:
            return False
        try:
            return s.recv(64).startswith(b"shipyard-job")
        except OSError:
            return False


def _host_addresses() -> list[str]:
    found = ["127.0.0.1", "::1"]
    for addrs in psutil.net_if_addrs().values():
        for a in addrs:
            if a.family in (socket.AF_INET, socket.AF_INET6):
                found.append(a.address.split("%")[0])
    return sorted(set(found))


def _namespaces(pid: int) -> dict[str, str]:
    return {ns: os.readlink(f"/proc/{pid}/ns/{ns}") for ns in ("net", "mnt", "uts", "pid")}


def _processes_in(inodes: set[str]) -> list[int]:
    """Processes (any on this machine) still inside one of the namespaces ``inodes``."""
    found = []
    for pid in psutil.pids():
        try:
            if set(_namespaces(pid).values()) & inodes:
                found.append(pid)
        except OSError:
            continue
    return found


def _wait_ready(job_dir: str, hosts: list[str], timeout: float = 60) -> dict[str, dict]:
    paths = {h: os.path.join(job_dir, "instances", h, "output", "data", "ready") for h in hosts}
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all(os.path.exists(p) for p in paths.values()):
            return {h: json.load(open(p)) for h, p in paths.items()}
        time.sleep(0.1)
    raise AssertionError("instances never got ready:\n" + _logs(job_dir))


def _logs(job_dir: str) -> str:
    logs = os.path.join(job_dir, "logs")
    return "".join(open(os.path.join(logs, n)).read() for n in sorted(os.listdir(logs)))


def test_names_ports_and_isolation_from_the_host(session, write_script, home):
    port = _free_port()
    src = write_script("train.py", NAMES)
    est = shipyard.Estimator(
        entry_point="train.py",
        source_dir=src,
        instance_count=2,
        instance_type="local",
        environment={"PROBE_PORT": str(port)},
        session=session,
    )
    est.fit(job_name="names", wait=False)
    job_dir = os.path.join(str(home), "jobs", "names")
    try:
        ready = _wait_ready(job_dir, ["algo-1", "algo-2"])
        for host in ("algo-1", "algo-2"):
            assert ready[host]["hostname"] == host
            lines = dict(reversed(ln.split()) for ln in ready[host]["getent"].splitlines())
            assert set(lines) == {"algo-1", "algo-2"}
            assert lines[host] == ready[host]["addr"]
        assert ready["algo-1"]["getent"] == ready["algo-2"]["getent"]
        instance_ips = [ready[h]["addr"] for h in ("algo-1", "algo-2")]
        assert len(set(instance_ips)) == 2
        # no socket of the job listens in the host's network namespace, and nothing the
        # job listens on answers from there
        assert host_listeners(job_dir) == []
        for address in _host_addresses() + instance_ips:
            for p in (2222, port):
                assert not _reaches_job(address, p), f"{address}:{p} reachable from the host"
    finally:
        for host in ("algo-1", "algo-2"):
            open(os.path.join(job_dir, "instances", host, "input", "go"), "w").close()
    record = est.latest_training_job.wait(logs=False)
    assert record["TrainingJobStatus"] == "Completed", _logs(job_dir)


def _ended(proc: psutil.Process) -> bool:
    try:
        return proc.status() == psutil.STATUS_ZOMBIE  # exited; its reaper is init's business
    except psutil.NoSuchProcess:
        return True


SLEEPER = "import time\nprint('running', flush=True)\ntime.sleep(120)\n"


def test_killed_supervisor_leaves_no_namespace_mount_or_helper(session, write_script, home):
    """SIGKILL the process supervising a sandboxed job: every instance process, the job
    network's holder and every namespace (with their veths, bridge and mounts) are gone."""
    src = write_script("train.py", SLEEPER)
    code = (
        "import shipyard\n"
        f"e = shipyard.Estimator(entry_point='train.py', source_dir={src!r}, "
        "instance_count=2, instance_type='local')\n"
        "e.fit(job_name='killed')\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code],
        env=dict(os.environ),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    job_dir = os.path.join(str(home), "jobs", "killed")
    deadline = time.monotonic() + 30
    logs = [os.path.join(job_dir, "logs", f"algo-{i}.log") for i in (1, 2)]
    while time.monotonic() < deadline:
        if all(os.path.exists(p) and "running" in open(p).read() for p in logs):
            break
        time.sleep(0.1)
    else:
        proc.kill()
        pytest.fail("instances did not start")
    try:
        helpers = [p for p in psutil.Process(proc.pid).children() if network.HOLDER in p.cmdline()]
        assert len(helpers) == 1
        inodes = set(_namespaces(helpers[0].pid).values()) - set(_namespaces(os.getpid()).values())
        for p in job_processes(job_dir):
            inodes |= set(_namespaces(p.pid).values()) - set(_namespaces(os.getpid()).values())
        # the job's network + each instance's net, mnt, uts, its PID namespace and the
        # mount namespace of its processes (with their /proc: shipyard.sandbox.pidns)
        assert len(inodes) == 1 + 5 * 2
        agents = [p for p in job_processes(job_dir) if "shipyard.agent" in " ".join(p.cmdline())]
        pastas = [
            c
            for a in agents
            for c in a.children(recursive=True)
            if c.name().startswith(("pasta", "passt"))
        ]
        assert len(pastas) == 2  # each instance's outbound network: in the host's namespace
    except BaseException:
        proc.kill()
        raise
    proc.kill()
    proc.wait()
    # a hang guard: the disks' reaper releases them after the supervisor's death, which
    # takes longer on a loaded machine (another pytest-xdist worker's job beside this one)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and (
        job_processes(job_dir)
        or _processes_in(inodes)
        or not all(_ended(p) for p in [helpers[0], *pastas])
        or _mounted_under(str(home))
    ):
        time.sleep(0.1)
    assert job_processes(job_dir) == []
    assert _processes_in(inodes) == []  # so the kernel has freed namespaces, veths, mounts
    assert _ended(helpers[0])
    assert all(_ended(p) for p in pastas)
    assert not _mounted_under(str(home))  # no instance mount leaked into the host's view


def _mounted_under(path: str) -> bool:
    with open("/proc/self/mountinfo") as fh:
        return path in fh.read()


PLAIN_GLOO = r"""
import json, os
import torch, torch.distributed as dist
hosts = json.loads(os.environ["SM_HOSTS"])
rank = hosts.index(os.environ["SM_CURRENT_HOST"])
dist.init_process_group("gloo", rank=rank, world_size=len(hosts))
t = torch.ones(1) * (rank + 1)
dist.all_reduce(t)
with open(os.path.join(os.environ["SM_MODEL_DIR"], f"rank-{rank}.json"), "w") as fh:
    json.dump({"sum": t.item(), "master": os.environ["MASTER_ADDR"] + ":" + os.environ["MASTER_PORT"]}, fh)
dist.destroy_process_group()
"""


@pytest.mark.timeout(180)
def test_plain_two_instance_init_process_group(session, write_script):
    """No distribution: the PyTorch container's MASTER_ADDR=algo-1 / MASTER_PORT=7777, and
    gloo's C++ resolves algo-1 itself."""
    pytest.importorskip("torch")
    src = write_script("train.py", PLAIN_GLOO)
    est = shipyard.PyTorch(
        entry_point="train.py",
        source_dir=src,
        instance_count=2,
        instance_type="local",
        framework_version="2.13",
        py_version="py311",
        session=session,
    )
    est.fit(job_name="plain-gloo")
    with tarfile.open(est.model_data.removeprefix("file://")) as tar:
        records = [json.load(tar.extractfile(m)) for m in tar.getmembers() if m.isfile()]
    assert records == [{"sum": 3.0, "master": "algo-1:7777"}] * 2


def test_shell_entry_point_finds_the_jobs_python(session, write_script):
    src = write_script(
        "train.sh",
        "python -c \"import sys, os; open('/opt/ml/model/py', 'w').write(sys.executable)\"\n",
    )
    est = shipyard.Estimator(
        entry_point="train.sh",
        source_dir=src,
        instance_count=1,
        instance_type="local",
        session=session,
    )
    est.fit(job_name="shell-python")
    with tarfile.open(est.model_data.removeprefix("file://")) as tar:
        used = tar.extractfile("py").read().decode()
    assert os.path.realpath(used) == os.path.realpath(sys.executable)


OUTBOUND = r"""
import json, os, socket, subprocess, urllib.request
url = os.environ["AWS_ENDPOINT_URL"]
try:
    record = {"s3": urllib.request.urlopen(url + "/ping", timeout=10).read().decode()}
except OSError as exc:
    record = {"s3": type(exc).__name__}
routes = subprocess.run(["ip", "route"], capture_output=True, text=True).stdout
record["default_route"] = "default" in routes
try:
    socket.create_connection((os.environ["OUTSIDE"], 443), timeout=5).close()
    record["outside"] = "connected"
except OSError as exc:
    record["outside"] = type(exc).__name__ + str(exc.errno)
with open("/opt/ml/model/net.json", "w") as fh:
    json.dump(record, fh)
"""


@pytest.fixture
def loopback_http():
    """An HTTP server on the host's loopback only (as a local S3 endpoint would be)."""
    import http.server
    import threading

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"pong")

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def _outside_address() -> str | None:
    """An address on the internet this machine reaches, if any (pypi.org, else none)."""
    try:
        with socket.create_connection(("pypi.org", 443), timeout=3) as s:
            return s.getpeername()[0]
    except OSError:
        return None


@pytest.mark.parametrize("isolated", [False, True])
def test_outbound_and_network_isolation(session, write_script, loopback_http, isolated):
    """pasta gives instances the host's outbound network and its loopback S3 endpoint;
    enable_network_isolation=True leaves neither (the agent moves the channels: see
    test_isolation_holds)."""
    outside = _outside_address()
    src = write_script("train.py", OUTBOUND)
    est = shipyard.Estimator(
        entry_point="train.py",
        source_dir=src,
        instance_count=1,
        instance_type="local",
        environment={"AWS_ENDPOINT_URL": loopback_http, "OUTSIDE": outside or "192.0.2.77"},
        enable_network_isolation=isolated,
        session=session,
    )
    est.fit(job_name=f"outbound-{int(isolated)}")
    assert est.latest_training_job.describe()["EnableNetworkIsolation"] is isolated
    with tarfile.open(est.model_data.removeprefix("file://")) as tar:
        record = json.load(tar.extractfile("net.json"))
    assert record["s3"] == ("URLError" if isolated else "pong")
    if isolated:
        assert record["default_route"] is False
        assert record["outside"].startswith("OSError101")  # ENETUNREACH: no route out
    else:
        assert record["default_route"] is True
        if outside is not None:  # this machine itself reaches the internet
            assert record["outside"] == "connected"
