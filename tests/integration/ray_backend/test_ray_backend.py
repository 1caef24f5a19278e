"""The same jobs on a real 3-node Ray cluster on this machine (see conftest.py)."""

from __future__ import annotations

import json
import os
import signal
import tarfile
import time

import pytest

from shipyard.sandbox import probe
from tests.conftest import job_processes
from tests.integration.ray_backend.conftest import (
    NAMESPACED,
    NODE_CPUS,
    NODE_IPS,
    keepers,
    leftovers,
)
from tests.integration.ray_backend.test_ray_bad_input import refused
from tests.integration.test_contract import run_contract_job


@pytest.mark.timeout(240)
def test_contract_on_three_nodes(ray_session, ray_cluster, write_script, tmp_path):
    job = "ray-contract"
    table = run_contract_job(
        ray_session,
        write_script,
        tmp_path,
        job_name=job,
        cpus=str(NODE_CPUS),
        interface="eth0" if NAMESPACED else "lo",  # the interface holding the node's IP
        base_of=lambda host: (
            "/opt/ml"  # each instance in its own mount namespace (docs/sandbox.md)
            if probe.support(network=False).ok
            else os.path.join(ray_cluster.workdir, job, "instances", host)
        ),
    )
    # each instance on a node of its own, named by the node's real address
    assert sorted(table.values()) == sorted(NODE_IPS)
    desc = ray_session.control.describe(job)
    assert {i["Host"]: i["Address"] for i in desc["Shipyard"]["Instances"]} == table
    assert desc["Shipyard"]["Backend"] == f"ray@{ray_cluster.address}"
    assert leftovers(ray_cluster.workdir, job) == []
    assert job_processes(ray_cluster.workdir) == [] and keepers(job) == []


RAY_HARD_CODED = r"""
import glob, json, os, socket, subprocess
rc = json.load(open("/opt/ml/input/config/resourceconfig.json"))
host = rc["current_host"]
data = sorted(open(p).read() for p in glob.glob("/opt/ml/input/data/training/*"))
getent = subprocess.run(["getent", "hosts", *rc["hosts"]], capture_output=True, text=True)
os.makedirs("/opt/ml/model/1", exist_ok=True)
with open(f"/opt/ml/model/1/{host}.json", "w") as fh:
    json.dump({"data": data, "hostname": socket.gethostname(), "getent": getent.stdout,
               "model_dir": os.environ["SM_MODEL_DIR"]}, fh)
"""


@pytest.mark.timeout(240)
def test_hard_coded_opt_ml_hostname_and_getent_on_ray(
    ray_session, ray_cluster, write_script, tmp_path
):
    """Each Ray instance in its own mount + UTS namespace (docs/sandbox.md): a script
    using only /opt/ml paths writes into its own instance's model, hostname is algo-k and
    libc's getent resolves every algo-k to its node's address; the host's /opt/ml is
    untouched."""
    import shipyard
    from shipyard.sandbox import probe

    if not probe.support(network=False).ok:
        pytest.skip(f"no mount/UTS namespaces here: {probe.support(network=False).reason}")
    before = sorted(os.listdir("/opt/ml")) if os.path.isdir("/opt/ml") else None
    train = tmp_path / "train"
    train.mkdir()
    (train / "a.csv").write_text("1,2\n")
    est = shipyard.Estimator(
        entry_point="train.py",
        source_dir=write_script("train.py", RAY_HARD_CODED),
        instance_count=2,
        instance_type="local",
        session=ray_session,
    )
    est.fit({"training": str(train)}, job_name="ray-hard-coded")
    desc = est.latest_training_job.describe()
    address = {i["Host"]: i["Address"] for i in desc["Shipyard"]["Instances"]}
    assert sorted(address.values()) == sorted(set(address.values()))  # two nodes
    with tarfile.open(est.model_data.removeprefix("file://")) as tar:
        names = sorted(m.name for m in tar.getmembers() if m.isfile())
        records = {n: json.load(tar.extractfile(n)) for n in names}
    assert names == ["1/algo-1.json", "1/algo-2.json"]
    resolved = {
        line.split()[1]: line.split()[0] for line in records["1/algo-1.json"]["getent"].splitlines()
    }
    assert resolved == address
    for host in ("algo-1", "algo-2"):
        record = records[f"1/{host}.json"]
        assert record["hostname"] == host
        assert record["data"] == ["1,2\n"]
        assert record["model_dir"] == "/opt/ml/model"
        assert record["getent"] == records["1/algo-1.json"]["getent"]
    assert (sorted(os.listdir("/opt/ml")) if os.path.isdir("/opt/ml") else None) == before
    _assert_on_nodes(ray_session, ray_cluster)


@pytest.mark.timeout(120)
def test_fewer_machines_or_cpus_than_the_job_needs_say_how_many(ray_session, write_script):
    refused(
        ray_session,
        write_script,
        r"needs 4 instance\(s\).*3 of which fit one instance",
        instance_count=4,
    )
    refused(
        ray_session,
        write_script,
        r"'ml.m5.xlarge' \(4 CPU\(s\).*0 of which fit.*largest node has 2 CPU\(s\)",
        instance_type="ml.m5.xlarge",
    )


@pytest.mark.timeout(240)
def test_parameter_server_job_on_ray(ray_session, ray_cluster, write_script):
    """native_ps (PyTorch) on 2 nodes: the local backend's test, byte for byte."""
    from tests.integration.ps.test_ps_jobs import (
        test_sync_mode_equals_single_process_training_on_the_combined_batch as ps_sync_job,
    )

    ps_sync_job(ray_session, write_script)
    _assert_on_nodes(ray_session, ray_cluster)


@pytest.mark.timeout(240)
def test_torch_distributed_job_on_ray(ray_session, ray_cluster, write_script):
    """DDP 2 nodes x 2 ranks over gloo between the nodes' addresses: the local test."""
    from tests.integration.ddp.test_ddp_jobs import two_by_two

    two_by_two(ray_session, write_script, hold_port=ray_cluster.hold_port)
    _assert_on_nodes(ray_session, ray_cluster)


def _assert_on_nodes(session, cluster) -> None:
    """The latest job ran on distinct nodes, by their IPs, and left nothing on them."""
    record = session.control.list(1)[0]
    desc = session.control.describe(record.name)
    addresses = [i["Address"] for i in desc["Shipyard"]["Instances"]]
    assert len(set(addresses)) == len(addresses) and set(addresses) <= set(NODE_IPS)
    assert leftovers(cluster.workdir, record.name) == []
    assert job_processes(cluster.workdir) == [] and keepers(record.name) == []


SLEEP_SCRIPT = r"""
import os, subprocess, sys, time
# a child of the script too: stop must end every process of the job on every node
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
print(os.environ["SM_CURRENT_HOST"], "running", flush=True)
time.sleep(600)
"""


def _start_sleeping_job(session, write_script, name: str) -> None:
    import shipyard

    src = write_script("sleep.py", SLEEP_SCRIPT)
    est = shipyard.Estimator(
        entry_point="sleep.py",
        source_dir=src,
        instance_count=2,
        instance_type="local",
        session=session,
    )
    est.fit(wait=False, job_name=name)
    deadline = time.monotonic() + 120
    while True:
        logs = session.control.log_files(name)
        if len(logs) == 2 and all(
            "running" in _read(p) for p in logs.values() if os.path.exists(p)
        ):
            return
        assert time.monotonic() < deadline, session.control.describe(name)
        time.sleep(0.2)


def _nothing_left(cluster, name: str, within: float) -> None:
    deadline = time.monotonic() + within
    while job_processes(cluster.workdir) or keepers(name) or leftovers(cluster.workdir, name):
        assert time.monotonic() < deadline, (
            job_processes(cluster.workdir),
            keepers(name),
            leftovers(cluster.workdir, name),
        )
        time.sleep(0.25)


@pytest.mark.timeout(180)
def test_stop_ends_every_process_on_every_node(ray_session, ray_cluster, write_script):
    _start_sleeping_job(ray_session, write_script, "ray-stop")
    record = ray_session.control.stop("ray-stop")
    assert record.status == "Stopped"
    _nothing_left(ray_cluster, "ray-stop", within=5)


@pytest.mark.timeout(180)
def test_a_dead_supervisor_leaves_nothing_on_the_nodes(ray_session, ray_cluster, write_script):
    """The detached supervisor (the Ray driver owning the actors) is SIGKILLed: Ray ends
    its actors, their keepers stop the agents and delete the files; the job is Failed."""
    _start_sleeping_job(ray_session, write_script, "ray-orphan")
    os.kill(ray_session.control.store.get("ray-orphan").supervisor_pid, signal.SIGKILL)
    _nothing_left(ray_cluster, "ray-orphan", within=60)
    assert ray_session.control.get("ray-orphan").status == "Failed"


KILL_SCRIPT = r"""
import os, sys, time
attempt = os.environ["SHIPYARD_ATTEMPT"]
print(f"{os.environ['SM_CURRENT_HOST']} attempt {attempt} running", flush=True)
if attempt == "1":
    time.sleep(300)        # killed with its node long before
open(os.path.join(os.environ["SM_MODEL_DIR"], os.environ["SM_CURRENT_HOST"]), "w").write(attempt)
"""


@pytest.mark.timeout(240)
def test_killed_node_fails_the_attempt_naming_it_and_the_retry_completes(
    ray_session, ray_cluster, write_script
):
    """wait=False (detached supervisor reconnecting to the cluster), live logs, attach;
    algo-2's node killed mid-job: attempt 1 fails naming that node, attempt 2 runs on the
    nodes left and completes, and nothing of the job is left on any node."""
    import shipyard

    src = write_script("train.py", KILL_SCRIPT)
    est = shipyard.Estimator(
        entry_point="train.py",
        source_dir=src,
        instance_count=2,
        instance_type="local",
        max_retry_attempts=1,
        session=ray_session,
    )
    est.fit(wait=False, job_name="ray-kill")
    control = ray_session.control
    deadline = time.monotonic() + 120
    victim = None
    while victim is None:
        assert time.monotonic() < deadline, control.describe("ray-kill")
        algo2 = [
            i
            for i in control.describe("ray-kill")["Shipyard"]["Instances"]
            if i["Host"] == "algo-2" and i["Attempt"] == 1
        ]
        log = algo2[0]["LogPath"] if algo2 else None
        if log and os.path.exists(log) and "attempt 1 running" in _read(log):
            victim = algo2[0]["Address"]  # its line came back live, so it is running
        time.sleep(0.2)
    assert victim in NODE_IPS
    ray_cluster.kill(victim)
    try:
        attached = shipyard.Estimator.attach("ray-kill", sagemaker_session=ray_session)
        desc = attached.latest_training_job.describe()
        assert desc["TrainingJobStatus"] == "Completed", desc.get("FailureReason")
        first = desc["Shipyard"]["Attempts"][0]["failure_reason"]
        assert first.startswith("[algo-2]") and victim in first, first
        second = [i for i in desc["Shipyard"]["Instances"] if i["Attempt"] == 2]
        assert {i["Status"] for i in second} == {"Completed"}
        assert victim not in {i["Address"] for i in second}
        with tarfile.open(
            desc["ModelArtifacts"]["S3ModelArtifacts"].removeprefix("file://")
        ) as tar:
            assert sorted(tar.getnames()) == ["algo-1", "algo-2"]
        assert leftovers(ray_cluster.workdir, "ray-kill") == []
        assert job_processes(ray_cluster.workdir) == [] and keepers("ray-kill") == []
    finally:
        ray_cluster.add(victim)  # the other tests of the module expect three nodes


def _read(path: str) -> str:
    with open(path, encoding="utf-8", errors="replace") as fh:
        return fh.read()
