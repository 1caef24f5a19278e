"""Issue 31: an instance's isolation holds against the job's own code.

A real job, real processes, a real S3 API on loopback (moto's server): the script probes
from inside its instance what an attacker would try, and the test checks both what it
could not do and that the platform's work (channels in, model out) still happened.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import subprocess
import tarfile
import uuid

import pytest

import shipyard
from shipyard.control.disk_full import NO_VOLUME
from shipyard.sandbox import pidns, probe

pytestmark = pytest.mark.skipif(
    not probe.support().ok, reason=f"no instance sandbox here: {probe.support().reason}"
)

PROBE = r"""
import ctypes, errno, hashlib, json, os, socket
libc = ctypes.CDLL(None, use_errno=True)
out = {}
status = dict(l.split(":", 1) for l in open("/proc/self/status") if ":" in l)
out["caps"] = {k: status[k].strip() for k in ("CapEff", "CapPrm", "CapBnd", "CapAmb")}
out["no_new_privs"] = status["NoNewPrivs"].strip()

def setns(path, nstype):
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError as exc:
        return "open:" + errno.errorcode[exc.errno]
    ok = libc.setns(fd, nstype) == 0
    return "entered" if ok else errno.errorcode[ctypes.get_errno()]

out["setns_host_net"] = setns("/proc/1/ns/net", 0x40000000)
# every other process of the instance (a Pipe feeder lives in the agent's data network)
own = os.stat("/proc/self/ns/net").st_ino
others = {}
for pid in (p for p in os.listdir("/proc") if p.isdigit() and int(p) != os.getpid()):
    try:
        same = os.stat(f"/proc/{pid}/ns/net").st_ino == own
    except OSError as exc:
        same = False
    if not same:
        others[pid] = setns(f"/proc/{pid}/ns/net", 0x40000000)
out["setns_others"] = others
out["mount"] = "mounted" if libc.mount(b"none", b"/mnt", b"tmpfs", 0, None) == 0 else \
    errno.errorcode[ctypes.get_errno()]
out["remount_ro_root"] = "remounted" if libc.mount(None, b"/", None, 32 | 1, None) == 0 else \
    errno.errorcode[ctypes.get_errno()]

def reach(address, port):
    try:
        socket.create_connection((address, port), timeout=3).close()
        return "connected"
    except OSError as exc:
        return type(exc).__name__
out["reach"] = {f"{a}:{p}": reach(a, p)
                for a in json.loads(os.environ["PROBE_ADDRESSES"])
                for p in json.loads(os.environ["PROBE_PORTS"])}

def tree(root):
    got = {}
    for d, _, names in os.walk(root):
        for n in names:
            with open(os.path.join(d, n), "rb") as fh:
                got[os.path.relpath(os.path.join(d, n), root)] = hashlib.sha256(fh.read()).hexdigest()
    return got
out["file"] = tree(os.environ["SM_CHANNEL_FILE"])
out["fast"] = tree(os.environ["SM_CHANNEL_FAST"])
with open("/opt/ml/input/data/pipe_0", "rb") as fh:
    out["pipe"] = hashlib.sha256(fh.read()).hexdigest()
with open("/opt/ml/model/probe.json", "w") as fh:
    json.dump(out, fh)
"""


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture(scope="module")
def s3_endpoint():
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture
def bucket(s3_endpoint, monkeypatch, home):
    import boto3

    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", s3_endpoint)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    client = boto3.client(
        "s3",
        endpoint_url=s3_endpoint,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )
    name = "iso-" + uuid.uuid4().hex[:12]
    client.create_bucket(Bucket=name)
    return client, name


def _host_addresses() -> list[str]:
    """This machine's IPv4 addresses (loopback included)."""
    out = subprocess.run(["ip", "-4", "-o", "addr"], capture_output=True, text=True).stdout
    return sorted({line.split()[3].split("/")[0] for line in out.splitlines()})


def _run_probe(session, write_script, bucket, isolated: bool, job_name: str):
    client, name = bucket
    endpoint_port = int(os.environ["AWS_ENDPOINT_URL_S3"].rsplit(":", 1)[1])
    files = {f"file/part-{i}.bin": os.urandom(2000 + i) for i in range(3)}
    fast = {"fast/a.bin": os.urandom(300_000)}
    pipe = os.urandom(500_000)
    for key, data in {**files, **fast, "pipe/all.bin": pipe}.items():
        client.put_object(Bucket=name, Key=key, Body=data)
    # a port of this machine that something listens on (other than the S3 endpoint)
    listener = socket.socket()
    listener.bind(("0.0.0.0", 0))
    listener.listen(8)
    try:
        est = shipyard.Estimator(
            entry_point="probe.py",
            source_dir=write_script("probe.py", PROBE),
            instance_count=1,
            instance_type="local",
            output_path=f"s3://{name}/out",
            environment={
                "PROBE_ADDRESSES": json.dumps(_host_addresses()),
                "PROBE_PORTS": json.dumps([endpoint_port, listener.getsockname()[1]]),
            },
            enable_network_isolation=isolated,
            session=session,
        )
        est.fit(
            {
                "file": f"s3://{name}/file/",
                "fast": shipyard.TrainingInput(f"s3://{name}/fast/", input_mode="FastFile"),
                "pipe": shipyard.TrainingInput(f"s3://{name}/pipe/", input_mode="Pipe"),
            },
            job_name=job_name,
        )
    finally:
        listener.close()
    key = est.model_data.split(f"s3://{name}/", 1)[1]
    body = client.get_object(Bucket=name, Key=key)["Body"].read()
    path = os.path.join(session.home, "model.tar.gz")
    with open(path, "wb") as fh:
        fh.write(body)
    with tarfile.open(path) as tar:
        record = json.load(tar.extractfile("probe.json"))
    expected = {
        "file": {k.removeprefix("file/"): sha(v) for k, v in files.items()},
        "fast": {"a.bin": sha(fast["fast/a.bin"])},
        "pipe": sha(pipe),
    }
    return record, expected


NO_CAPS = {k: "0000000000000000" for k in ("CapEff", "CapPrm", "CapBnd", "CapAmb")}


@pytest.mark.timeout(180)
def test_isolated_job_reaches_nothing_yet_its_channels_and_model_move(
    session, write_script, bucket
):
    """enable_network_isolation=True: the script reaches neither the S3 endpoint (on a
    `shipyard server` that port is the whole control API) nor any address of this machine,
    cannot setns() out or mount, and holds no capability; its File, FastFile and Pipe
    channels hold their data and its model reaches S3 (the agent moves them)."""
    record, expected = _run_probe(session, write_script, bucket, True, "isolated-probe")
    assert {k: record[k] for k in expected} == expected
    assert record["caps"] == NO_CAPS and record["no_new_privs"] == "1"
    assert record["setns_host_net"] in ("EPERM", "open:EACCES", "open:EPERM"), record
    assert record["setns_others"], record  # the feeder at least
    assert set(record["setns_others"].values()) <= {"EPERM", "open:EACCES", "open:EPERM"}
    assert record["mount"] == "EPERM" and record["remount_ro_root"] == "EPERM"
    assert record["reach"] and set(record["reach"].values()) <= {
        "ConnectionRefusedError",
        "OSError",
        "TimeoutError",
    }, record["reach"]


@pytest.mark.timeout(180)
def test_non_isolated_job_holds_no_privilege_either(session, write_script, bucket):
    """Without isolation the script has the network, but still no capability: setns()
    into a host namespace, mounting and remounting fail."""
    record, expected = _run_probe(session, write_script, bucket, False, "open-probe")
    assert {k: record[k] for k in expected} == expected
    assert record["caps"] == NO_CAPS and record["no_new_privs"] == "1"
    assert record["setns_host_net"] in ("EPERM", "open:EACCES", "open:EPERM"), record
    assert record["mount"] == "EPERM"


PROCESSES = r"""
import json, os, signal, subprocess, sys, time
helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
orphan = subprocess.Popen(["/bin/sh", "-c", "sleep 60 & echo $!"], stdout=subprocess.PIPE, text=True)
orphan_pid = int(orphan.stdout.readline())
orphan.wait()  # its child is an orphan now: the instance's init adopts and reaps it
out = {"pids": sorted(int(p) for p in os.listdir("/proc") if p.isdigit()),
       "me": os.getpid(), "helper": helper.pid, "orphan": orphan_pid,
       "init": open("/proc/1/cmdline", "rb").read().split(b"\0")[:3]}
out["init"] = [part.decode() for part in out["init"]]
def kill(pid, sig):
    try:
        os.kill(pid, sig)
        return "signalled"
    except OSError as exc:
        return type(exc).__name__
out["kill_host"] = kill(int(os.environ["HOST_PID"]), 0)
out["kill_init"] = kill(1, signal.SIGKILL)
time.sleep(0.2)
out["init_alive"] = os.path.exists("/proc/1")
os.kill(orphan_pid, signal.SIGKILL)
for _ in range(200):
    if not os.path.exists(f"/proc/{orphan_pid}"):
        break
    time.sleep(0.02)
out["orphan_reaped"] = not os.path.exists(f"/proc/{orphan_pid}")
helper.kill(); helper.wait()
with open("/opt/ml/model/procs.json", "w") as fh:
    json.dump(out, fh)
"""


@pytest.mark.timeout(120)
def test_an_instance_sees_and_signals_only_its_own_processes(session, write_script, home):
    """Each instance has its own PID namespace: /proc lists the instance's processes
    only, a host pid names nothing, the instance's init cannot be killed from inside and
    reaps orphans; from the host every process of the job is still found by its pid."""
    host_sleeper = subprocess.Popen(["sleep", "60"])
    try:
        est = shipyard.Estimator(
            entry_point="procs.py",
            source_dir=write_script("procs.py", PROCESSES),
            instance_count=2,
            instance_type="local",
            environment={"HOST_PID": str(host_sleeper.pid)},
            session=session,
        )
        est.fit(job_name="pid-namespace")
    finally:
        host_sleeper.kill()
        host_sleeper.wait()
    with tarfile.open(est.model_data.removeprefix("file://")) as tar:
        record = json.load(tar.extractfile("procs.json"))
    assert record["init"][1:] == ["-S", pidns.INIT], record
    # init, the script, its helper, the adopted orphan (and nothing of the host)
    assert set(record["pids"]) <= {1, record["me"], record["helper"], record["orphan"]} | set(
        range(record["me"], record["me"] + 8)
    ), record
    assert 1 in record["pids"] and record["me"] in record["pids"] and len(record["pids"]) < 10
    assert record["kill_host"] == "ProcessLookupError", record
    assert record["kill_init"] == "signalled" and record["init_alive"] is True
    assert record["orphan_reaped"] is True


FILESYSTEM = r"""
import json, os, sys
out = {}
def attempt(fn):
    try:
        return fn()
    except OSError as exc:
        return type(exc).__name__ + ":" + str(exc.errno)
def read(path):
    with open(path) as fh:
        return fh.read()
def write(path):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as fh:
        fh.write("probe")
    return "written"
home = os.environ["PROBE_HOME"]
out["other_job"] = attempt(lambda: read(os.path.join(home, "jobs", "other", "agent.json")))
out["home_listing"] = attempt(lambda: sorted(os.listdir(home)))
out["jobs_listing"] = attempt(lambda: sorted(os.listdir(os.path.join(home, "jobs"))))
out["root_canary"] = attempt(lambda: read(os.environ["ROOT_CANARY"]))
out["python_env"] = attempt(lambda: write(os.path.join(sys.prefix, "shipyard-probe.txt")))
out["etc"] = attempt(lambda: write(os.environ["ETC_PROBE"]))
out["home_dir"] = attempt(lambda: write(os.path.expanduser(os.environ["HOME_PROBE"])))
out["hosts"] = read("/etc/hosts")
with open("/opt/ml/model/fs.json", "w") as fh:
    json.dump(out, fh)
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="plants a canary in /root")
@pytest.mark.timeout(120)
def test_the_filesystem_view_hides_the_host_and_throws_writes_away(session, write_script, home):
    """Another job's agent.json, $SHIPYARD_HOME beyond the job, /root: not there; the
    Python environment is read-only; files written to /etc and ~ exist only inside the
    instance and are gone from the host afterwards."""
    other = os.path.join(str(home), "jobs", "other")
    os.makedirs(other)
    with open(os.path.join(other, "agent.json"), "w") as fh:
        fh.write('{"job_secret": "s3cret"}')
    tag = uuid.uuid4().hex[:8]
    canary = f"/root/.shipyard-canary-{tag}"
    etc_probe = f"/etc/shipyard-probe-{tag}"
    home_probe = f"~/.keras/shipyard-probe-{tag}.json"
    with open(canary, "w") as fh:
        fh.write("host secret")
    try:
        est = shipyard.Estimator(
            entry_point="fs.py",
            source_dir=write_script("fs.py", FILESYSTEM),
            instance_count=1,
            instance_type="local",
            environment={
                "PROBE_HOME": str(home),
                "ROOT_CANARY": canary,
                "ETC_PROBE": etc_probe,
                "HOME_PROBE": home_probe,
            },
            session=session,
        )
        est.fit(job_name="fs-view")
    finally:
        os.unlink(canary)
    with tarfile.open(est.model_data.removeprefix("file://")) as tar:
        record = json.load(tar.extractfile("fs.json"))
    assert record["other_job"] == "FileNotFoundError:2", record
    # its own home is sealed: passed through to its trees, never listed (issue 37)
    assert record["home_listing"] == record["jobs_listing"] == "PermissionError:13", record
    assert record["root_canary"] == "FileNotFoundError:2", record
    assert record["python_env"] == "OSError:30", record  # EROFS
    assert record["etc"] == "written" and record["home_dir"] == "written", record
    assert "algo-1" in record["hosts"]  # the job's hosts file is still the one seen
    assert not os.path.exists(etc_probe)
    # every protection held here: describe names none missing but the disk (issue 37)
    missing = est.latest_training_job.describe()["Shipyard"]["MissingProtections"]
    assert [m for m in missing if m["Missing"] != NO_VOLUME] == []
    assert not os.path.exists(os.path.expanduser(home_probe))
