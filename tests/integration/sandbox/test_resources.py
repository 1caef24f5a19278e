"""An instance gets its type's CPUs, memory and a process limit from the kernel's cgroups
(shipyard.sandbox.cgroups): real jobs, real cgroups, real OOM kills."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import pytest

import shipyard
from shipyard import instance_types
from shipyard.errors import JobFailedError
from shipyard.sandbox import cgroups
from tests.conftest import job_processes
from tests.integration.sandbox.test_rootless import _as_user, unprivileged_user  # noqa: F401

pytestmark = pytest.mark.skipif(
    not cgroups.detect().usable, reason=f"no cgroups here: {cgroups.detect().reason}"
)

# what the instance itself sees: its CPUs and the memory limit of its own cgroup
SEES = r"""
import json, os
def limit():
    for line in open("/proc/self/cgroup"):
        _, ctl, path = line.strip().split(":", 2)
        if "memory" in ctl.split(","):
            return open(f"/sys/fs/cgroup/memory{path}/memory.limit_in_bytes").read().strip()
        if ctl == "" and os.path.exists(f"/sys/fs/cgroup{path}/memory.max"):
            return open(f"/sys/fs/cgroup{path}/memory.max").read().strip()
out = {"cpus": len(os.sched_getaffinity(0)), "nproc": os.cpu_count(), "memory": limit()}
with open(os.path.join(os.environ["SM_MODEL_DIR"], os.environ["SM_CURRENT_HOST"]), "w") as fh:
    json.dump(out, fh)
"""


def _model(desc: dict, host: str) -> dict:
    path = os.path.join(desc["Shipyard"]["JobDir"], "instances", host, "model", host)
    with open(path) as fh:
        return json.load(fh)


def test_ml_m5_large_sees_2_cpus_and_8_gib(session, write_script):
    src = write_script("train.py", SEES)
    est = shipyard.Estimator(
        entry_point="train.py",
        source_dir=src,
        instance_count=2,
        instance_type="ml.m5.large",
        session=session,
    )
    est.fit(job_name="m5-large")
    desc = est.latest_training_job.describe()
    want_cpus = min(2, instance_types.machine_cpus())
    want_memory = min(8 << 30, instance_types.machine_memory())
    for host in ("algo-1", "algo-2"):
        seen = _model(desc, host)
        assert seen["cpus"] == want_cpus
        assert int(seen["memory"]) == want_memory
    res = desc["Shipyard"]["Resources"]
    assert res["Cgroups"] in ("v1", "v2") and res["Unlimited"] is None
    assert res["Instances"]["algo-1"]["MemoryBytes"] == want_memory
    assert len(res["Instances"]["algo-2"]["Cpus"]) == want_cpus
    # said once, in algo-1's log
    log = open(os.path.join(desc["Shipyard"]["JobDir"], "logs", "algo-1.log")).read()
    assert "limits per instance (cgroup v" in log
    assert cgroups.job_cgroup_dirs("m5-large") == []  # ended with the job


def test_local_takes_the_whole_machine(session, write_script):
    src = write_script("train.py", SEES)
    est = shipyard.Estimator(
        entry_point="train.py",
        source_dir=src,
        instance_count=1,
        instance_type="local",
        session=session,
    )
    est.fit(job_name="local-whole")
    seen = _model(est.latest_training_job.describe(), "algo-1")
    assert seen["cpus"] == instance_types.machine_cpus()
    assert int(seen["memory"]) >= instance_types.machine_memory()


# twice an ml.t3.medium's 4 GiB, touched as it is allocated
HOG = r"""
import os, time
if os.environ["SM_CURRENT_HOST"] == "algo-2":
    hog = []
    for _ in range(32):
        hog.append(bytearray(256 << 20))
time.sleep(120)
"""


def test_memory_hog_fails_its_job_with_out_of_memory_naming_the_host(session, write_script):
    src = write_script("train.py", HOG)
    est = shipyard.Estimator(
        entry_point="train.py",
        source_dir=src,
        instance_count=2,
        instance_type="ml.t3.medium",
        session=session,
    )
    with pytest.raises(JobFailedError):
        est.fit(job_name="oom-job")
    desc = est.latest_training_job.describe()
    limit = instance_types.gib(min(4 << 30, instance_types.machine_memory()))
    assert desc["FailureReason"].startswith(
        f"[algo-2] OutOfMemoryError: algo-2 exceeded its {limit} memory limit (ml.t3.medium)"
    ), desc["FailureReason"]
    inst = {i["Host"]: i for i in desc["Shipyard"]["Instances"]}
    assert inst["algo-2"]["Status"] == "Failed"
    assert inst["algo-1"]["Status"] == "Stopped"  # stopped by the job, not by the kernel
    assert job_processes(desc["Shipyard"]["JobDir"]) == []
    assert cgroups.job_cgroup_dirs("oom-job") == []


FORKS = r"""
import subprocess
children = []
for _ in range(500):
    children.append(subprocess.Popen(["sleep", "30"]))
"""


def test_too_many_processes_fail_their_own_job(session, write_script, monkeypatch):
    monkeypatch.setenv("SHIPYARD_PIDS_MAX", "64")
    src = write_script("train.py", FORKS)
    est = shipyard.Estimator(
        entry_point="train.py",
        source_dir=src,
        instance_count=1,
        instance_type="local",
        session=session,
    )
    with pytest.raises(JobFailedError):
        est.fit(job_name="fork-job")
    desc = est.latest_training_job.describe()
    assert "algo-1 reached its limit of 64 processes" in desc["FailureReason"]
    assert job_processes(desc["Shipyard"]["JobDir"]) == []
    assert cgroups.job_cgroup_dirs("fork-job") == []


def test_killed_supervisor_leaves_no_cgroup(session, write_script, home):
    src = write_script("train.py", "import time\ntime.sleep(120)\n")
    code = (
        "import shipyard\n"
        f"e = shipyard.Estimator(entry_point='train.py', source_dir={src!r}, "
        "instance_count=2, instance_type='ml.m5.large')\n"
        "e.fit(job_name='cg-orphan')\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code],
        env=dict(os.environ),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    job_dir = os.path.join(str(home), "jobs", "cg-orphan")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        running = [p for p in job_processes(job_dir) if "train.py" in " ".join(p.cmdline())]
        if os.path.isdir(job_dir) and len(running) == 2:
            break
        time.sleep(0.1)
    else:
        proc.kill()
        pytest.fail("instances did not start")
    made = cgroups.job_cgroup_dirs("cg-orphan")
    assert made  # one job cgroup per controller, each with algo-1 and algo-2
    assert all(
        sorted(n for n in os.listdir(d) if n.startswith("algo-")) == ["algo-1", "algo-2"]
        for d in made
    )
    proc.kill()
    proc.wait()
    # Hang guard: the reapers work in about a second. The disk reaper (a shell) may
    # still be deleting the instances' images after the cgroups are gone: it is the
    # job's cleanup, so the test waits for it to end rather than count it as left over.
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and (
        cgroups.job_cgroup_dirs("cg-orphan") or job_processes(job_dir)
    ):
        time.sleep(0.1)
    assert cgroups.job_cgroup_dirs("cg-orphan") == []
    assert job_processes(job_dir) == []


ROOTLESS_SUBMIT = r"""
import json, sys, shipyard
from shipyard.cli.doctor import checks
work = sys.argv[1]
e = shipyard.Estimator(entry_point="train.py", source_dir=work + "/src", instance_count=1,
                       instance_type="ml.m5.large", session=shipyard.Session(home=work + "/home"))
e.fit(job_name="rootless-limits", logs=False)
check = {c.name: c for c in checks()}["instance resources (cgroups)"]
print("RESULT " + json.dumps({"resources": e.latest_training_job.describe()["Shipyard"]["Resources"],
                             "doctor": [check.ok, check.detail, check.fix]}))
"""


@pytest.mark.timeout(180)
@pytest.mark.skipif(os.geteuid() != 0, reason="creating an unprivileged user needs root")
def test_rootless_without_delegation_runs_unlimited_and_says_so(unprivileged_user):  # noqa: F811
    if cgroups.detect().version != 1:
        pytest.skip("cgroup v2 may delegate to the user: this is the v1 (no delegation) case")
    work = tempfile.mkdtemp(prefix="shipyard-rootless-cg-")
    try:
        os.makedirs(f"{work}/src")
        os.makedirs(f"{work}/.interpreter")
        with open(f"{work}/src/train.py", "w") as fh:
            fh.write("print('ran')\n")
        with open(f"{work}/submit.py", "w") as fh:
            fh.write(ROOTLESS_SUBMIT)
        for d, _, files in os.walk(work):
            for p in [d] + [os.path.join(d, f) for f in files]:
                os.chown(p, unprivileged_user.pw_uid, unprivileged_user.pw_gid)
        os.chmod(work, 0o700)
        done = subprocess.run(_as_user(unprivileged_user, work), capture_output=True, text=True)
        out = done.stdout + done.stderr
        assert done.returncode == 0, out
        result = json.loads(out.split("RESULT ", 1)[1].splitlines()[0])
        res = result["resources"]
        assert res["Cgroups"] is None and "may not create cgroups" in res["Unlimited"], res
        assert res["Fix"]
        ok, detail, fix = result["doctor"]
        assert not ok and "without CPU, memory and process limits" in detail and fix
        with open(f"{work}/home/jobs/rootless-limits/logs/algo-1.log") as fh:
            assert "instances run without CPU, memory and process limits" in fh.read()
    finally:
        shutil.rmtree(work, ignore_errors=True)


RETRIED = r"""
import os, time
if os.environ.get("SHIPYARD_ATTEMPT") == "1" and os.environ["SM_CURRENT_HOST"] == "algo-2":
    raise SystemExit("first attempt dies")
time.sleep(1.5)
"""


@pytest.mark.timeout(180)
def test_a_retry_gets_new_cgroups_and_the_old_ones_go(session, write_script):
    """The first attempt's cgroups are removed (their reaper finishing late) while the
    retry's instances run in new ones: a retry is never killed by its predecessor's end."""
    est = shipyard.Estimator(
        entry_point="train.py",
        source_dir=write_script("train.py", RETRIED),
        instance_count=2,
        instance_type="ml.m5.large",
        max_retry_attempts=1,
        session=session,
    )
    est.fit(job_name="cg-retry")
    desc = est.latest_training_job.describe()
    assert desc["TrainingJobStatus"] == "Completed", desc.get("FailureReason")
    assert len(desc["Shipyard"]["Attempts"]) == 2
    assert cgroups.job_cgroup_dirs("cg-retry") == []
