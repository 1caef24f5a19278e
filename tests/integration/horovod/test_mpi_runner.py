"""The ``mpi`` runner end to end: real jobs, real mpirun, 2 instances x 2 processes.

Every rank sees its own instance's world; a failing rank is the job's root cause; a rank
that never calls hvd.init() is named; mpirun's own errors surface; nothing is left running.
"""

from __future__ import annotations

import json
import os
import time

import pytest
from tests.conftest import host_listeners, job_processes

import shipyard
from shipyard.errors import JobFailedError
from shipyard.sandbox import probe

pytestmark = pytest.mark.usefixtures("mpirun")

MPI_2x2 = {"mpi": {"enabled": True, "processes_per_host": 2}}

ENV_SCRIPT = r"""
import json, os, socket, sys
import numpy as np
from horovod.common.exceptions import HorovodInternalError   # through the shim
import shipyard.horovod as hvd

hvd.init()
r = hvd.rank()
total = hvd.allreduce(np.array([r + 1.0]), op=hvd.Sum)
record = {
    "rank": r, "size": hvd.size(), "local_rank": hvd.local_rank(), "local_size": hvd.local_size(),
    "cross_rank": hvd.cross_rank(), "cross_size": hvd.cross_size(), "sum": total.tolist(),
    "host": os.environ["SM_CURRENT_HOST"], "cwd": os.getcwd(), "argv": sys.argv[1:],
    "model_dir": os.environ["SM_MODEL_DIR"], "channel": os.listdir(os.environ["SM_CHANNEL_TRAINING"]),
    "resolved": socket.gethostbyname(os.environ["SM_CURRENT_HOST"]),
    "nccl_debug": os.environ.get("NCCL_DEBUG"), "extra": os.environ.get("EXTRA_VAR"),
    "mpi4py_main": "mpi4py" in sys.modules,
}
with open(os.path.join(os.environ["SM_MODEL_DIR"], f"rank{r}.json"), "w") as fh:
    json.dump(record, fh)
"""


def _estimator(session, src, **kwargs):
    kwargs.setdefault("distribution", MPI_2x2)
    return shipyard.Estimator(
        entry_point="train.py",
        source_dir=src,
        instance_count=2,
        instance_type="local",
        session=session,
        **kwargs,
    )


@pytest.mark.timeout(120)
def test_each_rank_sees_its_instance(session, write_script, tmp_path):
    src = write_script("train.py", ENV_SCRIPT)
    data = tmp_path / "train"
    data.mkdir()
    (data / "part-0").write_text("x")
    est = _estimator(
        session,
        src,
        hyperparameters={"epochs": 2},
        distribution={
            "mpi": {
                "enabled": True,
                "processes_per_host": 2,
                "custom_mpi_options": "--NCCL_DEBUG WARN -x EXTRA_VAR=7",
            }
        },
    )
    est.fit({"training": str(data)}, job_name="mpi-env")
    desc = est.latest_training_job.describe()
    assert desc["TrainingJobStatus"] == "Completed"
    job_dir = desc["Shipyard"]["JobDir"]
    records = {}
    sandboxed = probe.support().ok  # then each rank runs inside its instance, at /opt/ml
    for host in ("algo-1", "algo-2"):
        model = os.path.join(job_dir, "instances", host, "model")
        for name in os.listdir(model):
            with open(os.path.join(model, name)) as fh:
                rec = json.load(fh)
            records[rec["rank"]] = rec
            assert rec["host"] == host
            assert rec["model_dir"] == ("/opt/ml/model" if sandboxed else model)
    assert sorted(records) == [0, 1, 2, 3]
    for r, rec in records.items():
        host = f"algo-{r // 2 + 1}"
        assert rec["host"] == host
        base = "/opt/ml" if sandboxed else os.path.join(job_dir, "instances", host)
        assert rec["cwd"] == os.path.join(base, "code")
        assert (rec["size"], rec["local_rank"], rec["local_size"]) == (4, r % 2, 2)
        assert (rec["cross_rank"], rec["cross_size"]) == (r // 2, 2)
        assert rec["sum"] == [10.0]
        assert rec["argv"] == ["--epochs", "2"]
        assert rec["channel"] == ["part-0"]
        assert rec["resolved"].endswith(f".{r // 2 + 1}")
        assert (rec["nccl_debug"], rec["extra"]) == ("WARN", "7")
        assert rec["mpi4py_main"]
    assert job_processes(job_dir) == []


FAIL_SCRIPT = r"""
import time
import numpy as np
import shipyard.horovod as hvd

hvd.init()
hvd.allreduce(np.ones(4))
if hvd.rank() == 3:
    time.sleep(0.3)
    raise ValueError("rank three lost its data")
while True:
    hvd.allreduce(np.ones(4))
"""


@pytest.mark.timeout(120)
def test_failing_rank_is_the_root_cause_and_nothing_is_left(session, write_script):
    est = _estimator(session, write_script("train.py", FAIL_SCRIPT))
    with pytest.raises(JobFailedError):
        est.fit(job_name="mpi-fail")
    desc = est.latest_training_job.describe()
    reason = desc["FailureReason"]
    assert reason.startswith("[algo-1] rank 3 (algo-2): AlgorithmError"), reason
    assert 'ErrorMessage "ValueError: rank three lost its data"' in reason
    assert len(reason) <= 1024
    assert job_processes(desc["Shipyard"]["JobDir"]) == []


NO_INIT_SCRIPT = r"""
import os, time
import shipyard.horovod as hvd
if os.environ["OMPI_COMM_WORLD_RANK"] == "1":
    time.sleep(300)          # forgot hvd.init()
hvd.init()
hvd.barrier()
"""


@pytest.mark.timeout(120)
def test_rank_that_never_calls_init_is_named(session, write_script):
    est = _estimator(
        session,
        write_script("train.py", NO_INIT_SCRIPT),
        environment={"SHIPYARD_HOROVOD_INIT_TIMEOUT": "4"},
    )
    with pytest.raises(JobFailedError):
        est.fit(job_name="mpi-noinit")  # the test's timeout is the hang guard
    desc = est.latest_training_job.describe()
    assert "rank(s) [1] never called hvd.init()" in desc["FailureReason"], desc["FailureReason"]
    assert job_processes(desc["Shipyard"]["JobDir"]) == []


@pytest.mark.timeout(60)
def test_mpirun_rejecting_an_option_surfaces_its_message(session, write_script):
    est = _estimator(
        session,
        write_script("train.py", "print('never')\n"),
        distribution={"mpi": {"enabled": True, "custom_mpi_options": "--bogus-flag 1"}},
    )
    with pytest.raises(JobFailedError):
        est.fit(job_name="mpi-badopt")
    reason = est.latest_training_job.describe()["FailureReason"]
    assert "mpirun failed" in reason and "--bogus-flag" in reason, reason


@pytest.mark.timeout(90)
def test_stopping_an_mpi_job_leaves_nothing(session, write_script, home):
    script = (
        "import time, shipyard.horovod as hvd\nhvd.init()\nprint('up', flush=True)\n"
        "time.sleep(300)\n"
    )
    est = _estimator(session, write_script("train.py", script))
    est.fit(job_name="mpi-stop", wait=False)
    job_dir = os.path.join(str(home), "jobs", "mpi-stop")
    _wait_ranks_ready(job_dir)
    assert any("mpirun" in " ".join(p.cmdline()) for p in job_processes(job_dir))
    if probe.support().ok:  # prterun and the ranks listen, but only inside the instances
        assert host_listeners(job_dir) == []
    record = session.control.stop("mpi-stop")
    assert record.status == "Stopped"
    deadline = time.monotonic() + 10
    while job_processes(job_dir) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert job_processes(job_dir) == []


def _wait_ranks_ready(job_dir: str, count: int = 4) -> None:
    """Every rank's ready file, in its own instance's run dir (ranks run inside their
    instance in sandboxes; all from algo-1 without)."""
    run_dirs = [
        os.path.join(job_dir, "instances", host, "agent", "mpi-run")
        for host in ("algo-1", "algo-2")
    ]
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        ready = [
            n for d in run_dirs if os.path.isdir(d) for n in os.listdir(d) if n.startswith("ready.")
        ]
        if len(ready) == count:
            return
        time.sleep(0.2)
    pytest.fail("ranks did not start")


@pytest.mark.timeout(90)
def test_master_agent_killed_leaves_nothing(session, write_script, home):
    """SIGKILL on algo-1's agent: mpirun, the rank wrappers and the ranks all go (PDEATHSIG
    chain agent -> mpi_launch -> mpirun -> wrapper -> rank) and the job fails."""
    import signal

    script = "import time, shipyard.horovod as hvd\nhvd.init()\ntime.sleep(300)\n"
    est = _estimator(session, write_script("train.py", script))
    est.fit(job_name="mpi-kill", wait=False)
    job_dir = os.path.join(str(home), "jobs", "mpi-kill")
    _wait_ranks_ready(job_dir)
    [agent] = [
        p
        for p in job_processes(job_dir)
        if "shipyard.agent" in " ".join(p.cmdline()) and "algo-1" in p.cmdline()
    ]
    os.kill(agent.pid, signal.SIGKILL)
    deadline = time.monotonic() + 20
    while job_processes(job_dir) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert job_processes(job_dir) == []
    with pytest.raises(JobFailedError):
        est.latest_training_job.wait(logs=False)


@pytest.mark.timeout(240)
def test_two_jobs_at_once_keep_their_ranks_apart(session, write_script, tmp_path):
    """Two 2 x 2 mpi jobs running at the same time. With a PID namespace per instance, both
    jobs' algo-1 ranks have the same pids, and Open MPI names its shared-memory segments
    and session directories after host and pid: in the host's /dev/shm and /tmp the jobs
    wrote into each other's segments (SIGSEGV in the shared-memory transport) or found the
    other's PMIx socket. Each instance has its own /dev/shm and TMPDIR: both complete."""
    src = write_script("train.py", ENV_SCRIPT)
    data = tmp_path / "train"
    data.mkdir()
    (data / "part-0").write_text("x")
    names = ["mpi-twin-a", "mpi-twin-b"]
    for name in names:
        _estimator(session, src).fit({"training": str(data)}, wait=False, job_name=name)
    for name in names:
        record = session.control.wait(name, logs=False)
        assert record.status.value == "Completed", record.failure_reason
