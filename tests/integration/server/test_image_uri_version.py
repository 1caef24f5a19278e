"""The image URI's version reaches the job through ``shipyard server`` (issue 28): the real
SDK with ``image_uri=`` (``tensorflow-training:<version>-cpu-py<NN>``) makes a job whose
framework_version / py_version are the tag's, so it runs in an environment of that version,
as SageMaker runs it in that image. CreateTrainingJob answers at once while the environment
is still to be built: the job is InProgress/Downloading with a StatusMessage naming it, and
StopTrainingJob ends it Stopped with nothing half-built (the build waits here on the lock of
"another job" building the same environment, so the test downloads no TensorFlow: the
suite's one real build is tests/integration/environments)."""

from __future__ import annotations

import fcntl
import os
import time

import pytest

from shipyard.control.client import ControlPlane
from shipyard.environments import builder
from shipyard.environments import job as framework_envs

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
SERVER_ENV = {"SHIPYARD_FRAMEWORK_ENVS": "auto"}  # the default, said explicitly
ECR = "763104351884.dkr.ecr.us-east-1.amazonaws.com"
SCRIPT = "import sys\nprint('python', sys.version.split()[0], flush=True)\n"


def _estimator(tmp_path, image: str):
    import sagemaker
    from sagemaker.tensorflow import TensorFlow

    src = tmp_path / "code"
    src.mkdir(exist_ok=True)
    (src / "train.py").write_text(SCRIPT)
    return TensorFlow(
        entry_point="train.py",
        source_dir=str(src),
        role=sagemaker.get_execution_role(),
        image_uri=image,
        instance_count=1,
        instance_type="ml.m5.large",
    )


def test_the_installed_version_in_the_tag_runs_on_the_installed_framework(
    server, fast_polls, tmp_path
):
    installed = framework_envs.installed_version("tensorflow")
    assert installed
    est = _estimator(tmp_path, f"{ECR}/tensorflow-training:{installed}-cpu-py311")
    est.fit(logs=False)
    job = est.latest_training_job.name
    record = ControlPlane(home=server.home).get(job)
    assert record.status == "Completed", record.failure_reason
    assert (record.spec.framework_version, record.spec.py_version) == (installed, "py311")
    env = ControlPlane(home=server.home).describe(job)["Shipyard"]["FrameworkEnvironment"]
    assert (env["Asked"], env["Version"], env["Python"]) == (installed, installed, None)


def test_an_older_version_in_the_tag_is_built_as_the_jobs_first_phase(server, fast_polls, tmp_path):
    import boto3

    found = framework_envs.resolution(framework_envs.Request("tensorflow", "2.4.1"))
    key = builder.env_key(
        framework_envs.requirements_of(found),
        builder.RUNTIME_DEPS + builder.pinned_installed(framework_envs.PINNED),
        found.index_url,
    )
    root = os.path.join(server.home, "environments")
    os.makedirs(root, exist_ok=True)
    with open(os.path.join(root, f".{key}.lock"), "w") as held:  # "another job" builds it
        fcntl.flock(held, fcntl.LOCK_EX)
        est = _estimator(tmp_path, f"{ECR}/tensorflow-training:2.4.1-cpu-py37")
        est.fit(wait=False, logs=False)  # CreateTrainingJob answered: nothing built yet
        job = est.latest_training_job.name
        sm = boto3.client("sagemaker")
        desc = sm.describe_training_job(TrainingJobName=job)
        deadline = time.monotonic() + 120
        while "tensorflow-cpu==" not in str(desc.get("SecondaryStatusTransitions")):
            assert time.monotonic() < deadline, desc
            time.sleep(0.2)
            desc = sm.describe_training_job(TrainingJobName=job)
        assert (desc["TrainingJobStatus"], desc["SecondaryStatus"]) == ("InProgress", "Downloading")
        message = desc["SecondaryStatusTransitions"][-1]["StatusMessage"]
        assert f"{found.requirements[0]}" in message and "'2.4.1'" in message, message
        record = ControlPlane(home=server.home).get(job)
        assert (record.spec.framework_version, record.spec.py_version) == ("2.4.1", "py37")

        sm.stop_training_job(TrainingJobName=job)
        while desc["TrainingJobStatus"] not in ("Stopped", "Failed", "Completed"):
            assert time.monotonic() < deadline + 60, desc
            time.sleep(0.2)
            desc = sm.describe_training_job(TrainingJobName=job)
    assert desc["TrainingJobStatus"] == "Stopped", desc.get("FailureReason")
    assert ControlPlane(home=server.home).describe(job)["Shipyard"]["Instances"] == []
    assert [n for n in os.listdir(root) if not n.startswith(".")] == []
