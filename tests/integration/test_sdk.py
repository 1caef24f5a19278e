"""The SageMaker-compatible SDK surface, end to end on real processes."""

from __future__ import annotations

import os
import re
import subprocess
import tarfile
import time
import warnings

import pytest

import shipyard
from shipyard.errors import JobFailedError
from tests.conftest import job_processes

SAVE = r"""
import os, sys
host = os.environ["SM_CURRENT_HOST"]
open(os.path.join(os.environ["SM_MODEL_DIR"], "weights-%s.txt" % host), "w").write(host)
open(os.path.join(os.environ["SM_MODEL_DIR"], "shared.txt"), "w").write(host)
os.makedirs(os.path.join(os.environ["SM_OUTPUT_DATA_DIR"], "eval"), exist_ok=True)
open(os.path.join(os.environ["SM_OUTPUT_DATA_DIR"], "eval", host), "w").write("ok")
for step in range(3):
    print(f"step={step} loss={1.0 / (step + 1):.3f}")
print("argv", sys.argv[1:])
"""


def names(path: str) -> list[str]:
    with tarfile.open(path.removeprefix("file://")) as tar:
        return sorted(tar.getnames())


def test_job_name_artifacts_metrics_and_describe(session, write_script):
    src = write_script("train.py", SAVE)
    est = shipyard.PyTorch(
        entry_point="train.py",
        source_dir=src,
        instance_count=2,
        instance_type="local",
        framework_version="2.13",
        py_version="py311",
        metric_definitions=[{"Name": "train:loss", "Regex": r"loss=([0-9.]+)"}],
        session=session,
    )
    est.fit()
    job = est.latest_training_job.job_name
    assert re.fullmatch(r"pytorch-training-\d{4}(-\d{2}){5}-\d{3}", job)
    assert names(est.model_data) == ["shared.txt", "weights-algo-1.txt", "weights-algo-2.txt"]
    with tarfile.open(est.model_data.removeprefix("file://")) as tar:
        assert tar.extractfile("shared.txt").read() == b"algo-1"  # algo-1 wins conflicts
    desc = est.latest_training_job.describe()
    assert names(desc["Shipyard"]["OutputArtifacts"]) == ["eval/algo-1", "eval/algo-2"]
    assert desc["FinalMetricDataList"][0]["MetricName"] == "train:loss"
    assert desc["FinalMetricDataList"][0]["Value"] == pytest.approx(0.333)
    for key in (
        "TrainingJobName",
        "TrainingJobStatus",
        "SecondaryStatus",
        "HyperParameters",
        "ModelArtifacts",
        "TrainingStartTime",
        "TrainingEndTime",
        "CreationTime",
        "SecondaryStatusTransitions",
        "ResourceConfig",
        "StoppingCondition",
    ):
        assert key in desc
    assert [t["Status"] for t in desc["SecondaryStatusTransitions"]] == [
        "Starting",
        "Downloading",
        "Training",
        "Uploading",
        "Completed",
    ]
    assert desc["HyperParameters"]["sagemaker_program"] == '"train.py"'
    assert desc["TrainingStartTime"] <= desc["TrainingEndTime"]


def test_tensorflow_passes_model_dir_and_v1_names_warn(session, write_script):
    src = write_script("train.py", SAVE)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        est = shipyard.TensorFlow(
            entry_point="train.py",
            source_dir=src,
            train_instance_count=1,
            train_instance_type="local",
            train_max_run=600,
            session=session,
        )
    assert {
        str(w.message).split("'")[1] for w in caught if issubclass(w.category, DeprecationWarning)
    } >= {"train_instance_count", "train_instance_type", "train_max_run"}
    est.fit(job_name="tf-job")
    log = open(os.path.join(session.home, "jobs", "tf-job", "logs", "algo-1.log")).read()
    shared = os.path.join(session.home, "jobs", "tf-job", "shared", "model")
    assert f"argv ['--model_dir', '{shared}']" in log
    assert est.latest_training_job.describe()["StoppingCondition"]["MaxRuntimeInSeconds"] == 600


def test_wait_false_attach_and_logs(session, write_script, capsys):
    src = write_script(
        "train.py",
        "import time\nprint('hello from', __import__('os').environ['SM_CURRENT_HOST'])\ntime.sleep(1)\n",
    )
    est = shipyard.Estimator(
        entry_point="train.py",
        source_dir=src,
        instance_count=2,
        instance_type="local",
        session=session,
    )
    est.fit(wait=False, job_name="detached-job")
    assert session.control.get("detached-job").status == "InProgress"  # fit did not wait
    attached = shipyard.Estimator.attach("detached-job", sagemaker_session=session)
    assert attached.latest_training_job.describe()["TrainingJobStatus"] == "Completed"
    assert attached.model_data.endswith("detached-job/output/model.tar.gz")
    capsys.readouterr()
    attached.logs()
    out = capsys.readouterr().out
    assert "[algo-1] hello from algo-1" in out and "[algo-2] hello from algo-2" in out


def test_stop_a_running_job(session, write_script):
    src = write_script("train.py", "import time\ntime.sleep(120)\n")
    est = shipyard.Estimator(
        entry_point="train.py",
        source_dir=src,
        instance_count=2,
        instance_type="local",
        session=session,
    )
    est.fit(wait=False, job_name="stop-job")
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        if session.control.get("stop-job").secondary_status == "Training":
            break
        time.sleep(0.05)
    record = session.control.stop("stop-job")
    assert record.status == "Stopped"
    deadline = time.monotonic() + 5
    while job_processes(record.job_dir) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert job_processes(record.job_dir) == []


def test_max_run_stops_the_job_and_keeps_artifacts(session, write_script):
    src = write_script(
        "train.py",
        "import os,time\nopen(os.environ['SM_MODEL_DIR']+'/partial','w').write('x')\ntime.sleep(60)\n",
    )
    est = shipyard.Estimator(
        entry_point="train.py",
        source_dir=src,
        instance_count=1,
        instance_type="local",
        max_run=2,
        session=session,
    )
    t0 = time.monotonic()
    est.fit()
    assert time.monotonic() - t0 < 50  # hang guard: the script would sleep 60 s
    desc = est.latest_training_job.describe()
    assert (desc["TrainingJobStatus"], desc["SecondaryStatus"]) == ("Stopped", "MaxRuntimeExceeded")
    assert names(est.model_data) == ["partial"]


def test_retry_restarts_all_instances_and_keeps_each_cause(session, write_script):
    script = (
        "import os\n"
        "if os.environ.get('SHIPYARD_ATTEMPT') == '1' and os.environ['SM_CURRENT_HOST'] == 'algo-2':\n"
        "    raise SystemExit('first attempt dies')\n"
    )
    src = write_script("train.py", script)
    est = shipyard.Estimator(
        entry_point="train.py",
        source_dir=src,
        instance_count=2,
        instance_type="local",
        max_retry_attempts=1,
        session=session,
    )
    est.fit()
    desc = est.latest_training_job.describe()
    assert desc["TrainingJobStatus"] == "Completed"
    attempts = desc["Shipyard"]["Attempts"]
    assert len(attempts) == 2
    assert "first attempt dies" in attempts[0]["failure_reason"]
    assert attempts[1]["failure_reason"] is None


def test_entry_point_types_shell_and_package(session, tmp_path):
    sh = tmp_path / "sh"
    sh.mkdir()
    (sh / "train.sh").write_text('#!/bin/sh\necho "shell args: $@"\n')
    est = shipyard.Estimator(
        entry_point="train.sh",
        source_dir=str(sh),
        instance_count=1,
        instance_type="local",
        hyperparameters={"msg": "a b"},
        session=session,
    )
    est.fit(job_name="sh-job")
    log = open(os.path.join(session.home, "jobs", "sh-job", "logs", "algo-1.log")).read()
    assert "shell args: --msg a b" in log

    pkg = tmp_path / "pkg"
    (pkg / "trainpkg").mkdir(parents=True)
    (pkg / "trainpkg" / "__init__.py").write_text("")
    (pkg / "trainpkg" / "helpers.py").write_text("VALUE = 'from the package'\n")
    (pkg / "entry.py").write_text("from trainpkg.helpers import VALUE\nprint(VALUE)\n")
    (pkg / "setup.py").write_text(
        "from setuptools import setup\nsetup(name='trainpkg', version='0.1', packages=['trainpkg'],"
        " py_modules=['entry'])\n"
    )
    est = shipyard.Estimator(
        entry_point="entry.py",
        source_dir=str(pkg),
        instance_count=1,
        instance_type="local",
        session=session,
    )
    est.fit(job_name="pkg-job")
    log = open(os.path.join(session.home, "jobs", "pkg-job", "logs", "algo-1.log")).read()
    assert "from the package" in log
    assert "-m entry" in log


def test_requirements_are_installed_in_a_cached_environment(session, tmp_path):
    vendored = tmp_path / "vendored"
    (vendored / "shipyard_test_dep").mkdir(parents=True)
    (vendored / "shipyard_test_dep" / "__init__.py").write_text("MAGIC = 42\n")
    (vendored / "setup.py").write_text(
        "from setuptools import setup\nsetup(name='shipyard-test-dep', version='1.0', "
        "packages=['shipyard_test_dep'])\n"
    )
    src = tmp_path / "code"
    src.mkdir()
    (src / "requirements.txt").write_text(f"{vendored}\nnumpy\n")
    (src / "train.py").write_text(
        "import shipyard_test_dep\nprint('magic', shipyard_test_dep.MAGIC)\n"
    )
    est = shipyard.Estimator(
        entry_point="train.py",
        source_dir=str(src),
        instance_count=1,
        instance_type="local",
        session=session,
    )
    est.fit(job_name="req-job")
    log = open(os.path.join(session.home, "jobs", "req-job", "logs", "algo-1.log")).read()
    assert "magic 42" in log
    cache = os.path.join(session.home, "cache", "requirements")
    envs = [d for d in os.listdir(cache) if d.startswith("req-") and not d.endswith(".lock")]
    assert len(envs) == 1
    # numpy was already installed: seen through the parent environment, not reinstalled
    site = os.path.join(cache, envs[0])
    assert not any("numpy" in d for _, dirs, _ in os.walk(site) for d in dirs)
    # the user's own environment did not get the package
    with pytest.raises(ImportError):
        __import__("shipyard_test_dep")


def test_git_config_clones_local_and_file_urls(session, tmp_path):
    repo = tmp_path / "repo"
    (repo / "src").mkdir(parents=True)
    (repo / "src" / "train.py").write_text("print('from git, branch main')\n")

    def run(*a):
        return subprocess.run(["git", "-C", str(repo), *a], check=True, capture_output=True)

    run("init", "-q", "-b", "main")
    run("-c", "user.email=t@t", "-c", "user.name=t", "add", ".")
    run("-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "one")
    first = subprocess.run(
        ["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    (repo / "src" / "train.py").write_text("print('from git, second commit')\n")
    run("-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qam", "two")
    for repo_ref, commit, expected in (
        (str(repo), None, "second commit"),
        ("file://" + str(repo), first, "branch main"),
    ):
        cfg = {"repo": repo_ref, "branch": "main"}
        if commit:
            cfg["commit"] = commit
        est = shipyard.Estimator(
            entry_point="train.py",
            source_dir="src",
            git_config=cfg,
            instance_count=1,
            instance_type="local",
            session=session,
        )
        est.fit()
        log = open(
            os.path.join(
                session.home, "jobs", est.latest_training_job.job_name, "logs", "algo-1.log"
            )
        ).read()
        assert expected in log


def test_failed_job_raises_and_exit_code_is_kept(session, write_script):
    src = write_script("train.py", "import sys\nprint('bad')\nsys.exit(3)\n")
    est = shipyard.Estimator(
        entry_point="train.py",
        source_dir=src,
        instance_count=1,
        instance_type="local",
        session=session,
    )
    with pytest.raises(JobFailedError, match="ExitCode 3"):
        est.fit()
