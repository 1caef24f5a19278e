"""GPUs divided between instances (sandbox.gpus), on a machine whose GPU list is the
seam's (``SHIPYARD_GPUS``): real jobs, each instance reporting what it was given."""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time

import pytest

import shipyard

SEES = r"""
import json, os
with open(os.path.join(os.environ["SM_MODEL_DIR"], os.environ["SM_CURRENT_HOST"]), "w") as fh:
    json.dump({"cuda": os.environ.get("CUDA_VISIBLE_DEVICES"), "n": os.environ["SM_NUM_GPUS"]}, fh)
"""


@pytest.fixture
def fake_gpus(monkeypatch, tmp_path):
    monkeypatch.setenv("SHIPYARD_GPUS", "0,1,2,3")
    monkeypatch.setenv("SHIPYARD_GPU_LEASES", str(tmp_path / "leases"))
    return str(tmp_path / "leases")


def _fit(session, write_script, name, instance_type, count=2):
    est = shipyard.Estimator(
        entry_point="train.py",
        source_dir=write_script("train.py", SEES),
        instance_count=count,
        instance_type=instance_type,
        session=session,
    )
    est.fit(job_name=name, logs=False)
    job_dir = est.latest_training_job.describe()["Shipyard"]["JobDir"]
    seen = {}
    for host in [f"algo-{i + 1}" for i in range(count)]:
        with open(os.path.join(job_dir, "instances", host, "model", host)) as fh:
            found = json.load(fh)
        seen[host] = found["cuda"]
        # SM_NUM_GPUS is the instance's share, as many as it sees
        assert found["n"] == str(len(found["cuda"].split(",")) if found["cuda"] else 0)
    with open(os.path.join(job_dir, "logs", "algo-1.log")) as fh:
        return seen, fh.read(), est.latest_training_job.describe()


@pytest.mark.timeout(120)
def test_too_few_gpus_an_even_share_said_once(session, write_script, fake_gpus):
    seen, log, desc = _fit(session, write_script, "gpu-share", "ml.p3.8xlarge")
    assert seen == {"algo-1": "0,1", "algo-2": "2,3"}
    assert log.count("this machine has 4: each instance gets 2") == 1
    assert desc["Shipyard"]["Resources"]["Instances"]["algo-2"]["Gpus"] == ["2", "3"]
    assert os.listdir(fake_gpus) == []  # leases given back with the job


@pytest.mark.timeout(120)
def test_cpu_type_sees_no_gpu_on_a_gpu_machine(session, write_script, fake_gpus):
    seen, _, _ = _fit(session, write_script, "gpu-none", "ml.m5.large")
    assert seen == {"algo-1": "", "algo-2": ""}


@pytest.mark.timeout(120)
def test_gpu_types_without_gpus_run_on_cpu(session, write_script, monkeypatch):
    monkeypatch.setenv("SHIPYARD_GPUS", "none")
    seen, log, _ = _fit(session, write_script, "gpu-cpu", "ml.p3.2xlarge", count=1)
    assert seen == {"algo-1": None}
    assert "this machine has none: instances run on CPU" in log


@pytest.mark.timeout(120)
def test_gpus_held_by_another_job_are_waited_for(session, write_script, fake_gpus):
    holder = subprocess.Popen(["sleep", "3"])
    threading.Thread(target=holder.wait, daemon=True).start()  # reaped when it ends
    os.makedirs(fake_gpus)
    for gpu in "0123":
        with open(os.path.join(fake_gpus, gpu), "w") as fh:
            fh.write(f"{holder.pid} other-job\n")
    seen, log, _ = _fit(session, write_script, "gpu-wait", "ml.p3.8xlarge", count=1)
    assert holder.poll() is not None  # it started only once the holder was gone
    assert seen == {"algo-1": "0,1,2,3"}
    assert f"waiting for GPU(s) 0 (held by job other-job (pid {holder.pid}))" in log
    assert log.count("waiting for GPU") == 1


@pytest.mark.timeout(120)
def test_a_job_waiting_for_gpus_can_be_stopped(session, write_script, fake_gpus):
    holder = subprocess.Popen(["sleep", "300"])
    try:
        os.makedirs(fake_gpus)
        for gpu in "0123":
            with open(os.path.join(fake_gpus, gpu), "w") as fh:
                fh.write(f"{holder.pid} other-job\n")
        est = shipyard.Estimator(
            entry_point="train.py",
            source_dir=write_script("train.py", SEES),
            instance_count=1,
            instance_type="ml.p3.8xlarge",
            session=session,
        )
        est.fit(job_name="gpu-stop", wait=False)
        control = est.latest_training_job.control
        log = os.path.join(control.store.get("gpu-stop").job_dir, "logs", "algo-1.log")
        deadline = time.monotonic() + 60  # hang guard
        while not (os.path.exists(log) and "waiting for GPU" in open(log).read()):
            assert time.monotonic() < deadline, "the job never said it waits for GPUs"
            time.sleep(0.1)
        record = control.stop("gpu-stop", timeout=60)
        assert record.status == "Stopped", (record.status, record.failure_reason)
        assert sorted(os.listdir(fake_gpus)) == ["0", "1", "2", "3"]  # still the holder's
    finally:
        holder.kill()
        holder.wait()
