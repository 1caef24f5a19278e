"""Issue 37: a ``shipyard server`` killed while a finished job uploads model.tar.gz to its S3,
then restarted, costs the job nothing.

A real server process runs a job through boto3's CreateTrainingJob; once the job trains the
server is killed (SIGKILL). The job finishes, its supervisor (a process of its own) finds
no S3 endpoint and waits, saying so in algo-1's log and as the StatusMessage; the server is
restarted on the same home and port, and the job ends Completed with its model.tar.gz in
the bucket. Before the fix the upload gave up after botocore's few retries and the job
ended Failed (InternalServerError: StorageError ...) with both models still on disk.
"""

from __future__ import annotations

import io
import tarfile
import time

import pytest

IMAGE = "763104351884.dkr.ecr.us-east-1.amazonaws.com/pytorch-training:2.3.0-cpu-py311"
SERVER_ENV = {"SHIPYARD_FRAMEWORK_ENVS": "off"}
ROLE = "arn:aws:iam::000000000000:role/ShipyardExecutionRole"
SCRIPT = b"""\
import os, time
open(os.path.join(os.environ["SM_MODEL_DIR"], "m.txt"), "w").write("model")
time.sleep(3)
"""
JOB = "restart-upload"
BUCKET = "restart-upload"


def _stage(s3) -> None:
    """The bucket and the code, once per module (each test may run alone)."""
    if BUCKET in [b["Name"] for b in s3.list_buckets().get("Buckets", [])]:
        return
    s3.create_bucket(Bucket=BUCKET)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        info = tarfile.TarInfo("train.py")
        info.size = len(SCRIPT)
        tar.addfile(info, io.BytesIO(SCRIPT))
    s3.put_object(Bucket=BUCKET, Key="code/sourcedir.tar.gz", Body=buf.getvalue())


def _until(what: str, check, seconds: float):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.2)
    pytest.fail(f"{what} did not happen within {seconds:.0f} s")


def _create(sm, name: str) -> None:
    sm.create_training_job(
        TrainingJobName=name,
        RoleArn=ROLE,
        AlgorithmSpecification={"TrainingImage": IMAGE, "TrainingInputMode": "File"},
        HyperParameters={
            "sagemaker_program": '"train.py"',
            "sagemaker_submit_directory": f'"s3://{BUCKET}/code/sourcedir.tar.gz"',
        },
        OutputDataConfig={"S3OutputPath": f"s3://{BUCKET}/out"},
        ResourceConfig={"InstanceType": "ml.m5.large", "InstanceCount": 2, "VolumeSizeInGB": 30},
        StoppingCondition={"MaxRuntimeInSeconds": 600},
    )


def _kill_while_training(server, sm, name: str) -> list[str]:
    """SIGKILL the server once ``name`` trains; the StatusMessages saying the job waits."""
    from shipyard.control.client import ControlPlane

    _until(
        "the job training",
        lambda: sm.describe_training_job(TrainingJobName=name)["SecondaryStatus"] == "Training",
        120,
    )
    server.proc.kill()  # SIGKILL: nothing of the server gets to say goodbye
    server.proc.wait()
    server.proc = None
    store = ControlPlane(home=server.home).store
    return _until(
        "the supervisor waiting for the store",
        lambda: [
            t["message"]
            for t in store.transitions(name)
            if "waiting for the store" in (t["message"] or "")
        ],
        120,
    )


@pytest.mark.timeout(300)
def test_server_restart_during_upload_completes_the_job(server):
    import boto3

    from shipyard.control.client import ControlPlane

    s3, sm = boto3.client("s3"), boto3.client("sagemaker")
    _stage(s3)
    _create(sm, JOB)
    waiting = _kill_while_training(server, sm, JOB)
    assert ControlPlane(home=server.home).store.get(JOB).status == "InProgress"
    assert "S3 endpoint" in waiting[0] and "max_run=600" in waiting[0], waiting

    server.start()  # the same home and port
    desc = _until(
        "the job ending",
        lambda: (
            (d := sm.describe_training_job(TrainingJobName=JOB))["TrainingJobStatus"]
            in ("Completed", "Failed", "Stopped")
            and d
        ),
        180,
    )
    assert desc["TrainingJobStatus"] == "Completed", desc.get("FailureReason")
    key = f"out/{JOB}/output/model.tar.gz"
    body = s3.get_object(Bucket=BUCKET, Key=key)["Body"].read()
    with tarfile.open(fileobj=io.BytesIO(body)) as tar:
        assert tar.extractfile("m.txt").read() == b"model"
    log = open(ControlPlane(home=server.home).log_files(JOB)["algo-1"]).read()
    assert "[shipyard] waiting for the store" in log, log[-2000:]
    assert "the store answered again" in log, log[-2000:]


@pytest.mark.timeout(300)
def test_a_stop_ends_the_wait_for_the_store(server):
    """``shipyard stop`` while the upload waits: Stopped at once, the reason says why."""
    import boto3

    from shipyard.control.client import ControlPlane

    sm = boto3.client("sagemaker")
    _stage(boto3.client("s3"))
    _create(sm, "restart-stop")
    try:
        _kill_while_training(server, sm, "restart-stop")
        record = ControlPlane(home=server.home).stop("restart-stop", timeout=60)
        assert record.status == "Stopped", record
        assert "a stop was requested" in (record.failure_reason or ""), record.failure_reason
        assert "\n" not in record.failure_reason
    finally:
        server.start()
