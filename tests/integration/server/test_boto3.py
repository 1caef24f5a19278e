"""boto3 alone against a real ``shipyard server``: S3 on disk (surviving a restart),
CreateTrainingJob shaped like the API reference's example, DescribeTrainingJob until
Completed, StopTrainingJob, and the bad inputs each refused as the real service does."""

from __future__ import annotations

import io
import json
import os
import socket
import tarfile
import time

import pytest

from tests.integration.server.conftest import (
    ServerProcess,
    client_env,
    free_port,
    signed_headers,
)

IMAGE = "763104351884.dkr.ecr.us-east-1.amazonaws.com/pytorch-training:2.3.0-cpu-py311"
# the jobs run on the installed torch: asking for 2.3.0 through the image tag would build a
# framework environment first (tests/integration/environments and test_image_uri_version do)
SERVER_ENV = {"SHIPYARD_FRAMEWORK_ENVS": "off"}
ROLE = "arn:aws:iam::000000000000:role/ShipyardExecutionRole"
SCRIPT = """\
import json, os, sys, time
print("host", os.environ["SM_CURRENT_HOST"], "args", sys.argv[1:], flush=True)
if os.environ.get("SM_HP_SLEEP"):
    time.sleep(float(os.environ["SM_HP_SLEEP"]))
rows = open(os.path.join(os.environ["SM_CHANNEL_TRAINING"], "rows.csv")).read().split()
with open(os.path.join(os.environ["SM_MODEL_DIR"], "model.json"), "w") as fh:
    json.dump({"rows": len(rows)}, fh)
"""


@pytest.fixture(scope="module")
def s3(server):
    import boto3

    return boto3.client("s3")


@pytest.fixture(scope="module")
def sm(server):
    import boto3

    return boto3.client("sagemaker")


@pytest.fixture(scope="module")
def staged(s3):
    """A bucket with the code tarball and a training channel, as the SDK would put them."""
    s3.create_bucket(Bucket="shipyard-test")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        data = SCRIPT.encode()
        info = tarfile.TarInfo("train.py")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    s3.put_object(Bucket="shipyard-test", Key="code/sourcedir.tar.gz", Body=buf.getvalue())
    s3.put_object(Bucket="shipyard-test", Key="data/train/rows.csv", Body=b"1\n2\n3\n")
    return "shipyard-test"


def training_request(name: str, bucket: str, **hps: str) -> dict:
    """The shape of the CreateTrainingJob example in the API reference."""
    return {
        "TrainingJobName": name,
        "AlgorithmSpecification": {"TrainingImage": IMAGE, "TrainingInputMode": "File"},
        "RoleArn": ROLE,
        "HyperParameters": {
            "sagemaker_program": json.dumps("train.py"),
            "sagemaker_submit_directory": json.dumps(f"s3://{bucket}/code/sourcedir.tar.gz"),
            "epochs": "2",
            **hps,
        },
        "InputDataConfig": [
            {
                "ChannelName": "training",
                "DataSource": {
                    "S3DataSource": {
                        "S3DataType": "S3Prefix",
                        "S3Uri": f"s3://{bucket}/data/train",
                        "S3DataDistributionType": "FullyReplicated",
                    }
                },
                "ContentType": "text/csv",
                "CompressionType": "None",
            }
        ],
        "OutputDataConfig": {"S3OutputPath": f"s3://{bucket}/output"},
        "ResourceConfig": {
            "InstanceType": "ml.m5.large",
            "InstanceCount": 1,
            "VolumeSizeInGB": 10,
        },
        "StoppingCondition": {"MaxRuntimeInSeconds": 600},
    }


def wait_for(sm, name: str, statuses=("Completed", "Failed", "Stopped"), timeout=120) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        desc = sm.describe_training_job(TrainingJobName=name)
        if desc["TrainingJobStatus"] in statuses:
            return desc
        assert time.monotonic() < deadline, desc["TrainingJobStatus"]
        time.sleep(0.3)


# -- S3 -----------------------------------------------------------------------------------


def test_s3_objects_live_on_disk_and_survive_a_restart(tmp_path):
    import boto3

    home = str(tmp_path / "home")
    os.makedirs(home)
    port = free_port()
    env = client_env(home, port)
    proc = ServerProcess(home, port).start()
    try:
        s3 = boto3.session.Session().client(
            "s3",
            endpoint_url=env["AWS_ENDPOINT_URL"],
            aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
            region_name="us-east-1",
        )
        s3.create_bucket(Bucket="keep-me")
        s3.put_object(Bucket="keep-me", Key="a/one.txt", Body=b"one")
        s3.put_object(Bucket="keep-me", Key="a", Body=b"a and a/ both exist, as in S3")
        big = os.urandom(12 << 20)  # over the transfer manager's threshold: multipart
        (tmp_path / "big").write_bytes(big)
        s3.upload_file(str(tmp_path / "big"), "keep-me", "a/b/big.bin")
        proc.stop()
        proc.start()
        assert s3.get_object(Bucket="keep-me", Key="a/one.txt")["Body"].read() == b"one"
        assert s3.get_object(Bucket="keep-me", Key="a")["Body"].read().startswith(b"a and")
        head = s3.head_object(Bucket="keep-me", Key="a/b/big.bin")
        assert head["ContentLength"] == len(big) and head["ETag"].endswith('-2"')
        s3.download_file("keep-me", "a/b/big.bin", str(tmp_path / "back"))
        assert (tmp_path / "back").read_bytes() == big
        ranged = s3.get_object(Bucket="keep-me", Key="a/b/big.bin", Range="bytes=10-19")
        assert ranged["Body"].read() == big[10:20]
        listing = s3.list_objects_v2(Bucket="keep-me", Prefix="a/", Delimiter="/")
        assert [o["Key"] for o in listing["Contents"]] == ["a/one.txt"]
        assert [p["Prefix"] for p in listing["CommonPrefixes"]] == ["a/b/"]
        page = s3.list_objects_v2(Bucket="keep-me", MaxKeys=2)
        assert page["IsTruncated"] and [o["Key"] for o in page["Contents"]] == ["a", "a/b/big.bin"]
        rest = s3.list_objects_v2(Bucket="keep-me", ContinuationToken=page["NextContinuationToken"])
        assert [o["Key"] for o in rest["Contents"]] == ["a/one.txt"]
        v1 = s3.list_objects(Bucket="keep-me", Prefix="a/", MaxKeys=1)
        assert [o["Key"] for o in v1["Contents"]] == ["a/b/big.bin"] and v1["IsTruncated"]
        v1 = s3.list_objects(Bucket="keep-me", Prefix="a/", Marker="a/b/big.bin")
        assert [o["Key"] for o in v1["Contents"]] == ["a/one.txt"]
        with pytest.raises(s3.exceptions.NoSuchKey):
            s3.get_object(Bucket="keep-me", Key="nope")
        with pytest.raises(s3.exceptions.NoSuchBucket):
            s3.list_objects_v2(Bucket="no-such-bucket")
        s3.copy_object(Bucket="keep-me", Key="copy.txt", CopySource="keep-me/a/one.txt")
        assert s3.get_object(Bucket="keep-me", Key="copy.txt")["Body"].read() == b"one"
        s3.delete_object(Bucket="keep-me", Key="a")
        assert "Contents" not in s3.list_objects_v2(Bucket="keep-me", Prefix="a", Delimiter="/")
    finally:
        proc.stop()


# -- training -----------------------------------------------------------------------------


def test_create_describe_until_completed_and_the_cli_sees_the_same_job(server, sm, staged):
    sm.create_training_job(**training_request("boto-plain", staged))
    desc = wait_for(sm, "boto-plain")
    assert desc["TrainingJobStatus"] == "Completed", desc.get("FailureReason")
    assert desc["AlgorithmSpecification"]["TrainingImage"] == IMAGE
    assert desc["HyperParameters"]["epochs"] == "2"
    model = desc["ModelArtifacts"]["S3ModelArtifacts"]
    assert model == f"s3://{staged}/output/boto-plain/output/model.tar.gz"
    assert [s["Status"] for s in desc["SecondaryStatusTransitions"]][-1] == "Completed"
    import boto3

    body = boto3.client("s3").get_object(Bucket=staged, Key=model.split("/", 3)[3])["Body"]
    with tarfile.open(fileobj=io.BytesIO(body.read())) as tar:
        assert json.load(tar.extractfile("model.json")) == {"rows": 3}
    time.sleep(3)  # the server first reads the log well after the job ended (see below)
    logs = boto3.client("logs")
    streams = logs.describe_log_streams(
        logGroupName="/aws/sagemaker/TrainingJobs", logStreamNamePrefix="boto-plain/"
    )["logStreams"]
    assert [s["logStreamName"].split("/")[1].rsplit("-", 1)[0] for s in streams] == ["algo-1"]
    events = logs.get_log_events(
        logGroupName="/aws/sagemaker/TrainingJobs",
        logStreamName=streams[0]["logStreamName"],
        startFromHead=True,
    )["events"]
    assert any("host algo-1 args ['--epochs', '2']" in e["message"] for e in events)
    # each event carries when its line was written (the log's times), not when the server
    # first read it, which was after the job had ended (issue 41)
    ended_ms = desc["TrainingEndTime"].timestamp() * 1000
    assert all(e["timestamp"] <= ended_ms + 1000 for e in events), (ended_ms, events)
    # the same record as shipyard's own CLI and SDK show
    from shipyard.control.client import ControlPlane

    assert ControlPlane(home=server.home).get("boto-plain").status == "Completed"
    names = [s["TrainingJobName"] for s in sm.list_training_jobs()["TrainingJobSummaries"]]
    assert "boto-plain" in names


TB_SCRIPT = """\
import os
# /opt/ml/output/tensorboard as the script sees it (SM_OUTPUT_DIR is /opt/ml/output)
logdir = os.path.join(os.environ["SM_OUTPUT_DIR"], "tensorboard", "train")
os.makedirs(logdir, exist_ok=True)
with open(os.path.join(logdir, "events.out.tfevents.1"), "w") as fh:
    fh.write("summaries")
"""


def test_tensorboard_output_config_is_synced_to_its_s3_location_and_echoed(s3, sm, staged):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        info = tarfile.TarInfo("train.py")
        info.size = len(TB_SCRIPT.encode())
        tar.addfile(info, io.BytesIO(TB_SCRIPT.encode()))
    s3.put_object(Bucket=staged, Key="code/tb.tar.gz", Body=buf.getvalue())
    req = training_request("boto-tb", staged)
    req["HyperParameters"]["sagemaker_submit_directory"] = json.dumps(
        f"s3://{staged}/code/tb.tar.gz"
    )
    req["TensorBoardOutputConfig"] = {"S3OutputPath": f"s3://{staged}/tb"}
    sm.create_training_job(**req)
    desc = wait_for(sm, "boto-tb")
    assert desc["TrainingJobStatus"] == "Completed", desc.get("FailureReason")
    assert desc["TensorBoardOutputConfig"] == {
        "S3OutputPath": f"s3://{staged}/tb",
        "LocalPath": "/opt/ml/output/tensorboard",
    }
    key = "tb/boto-tb/tensorboard-output/train/events.out.tfevents.1"
    assert s3.get_object(Bucket=staged, Key=key)["Body"].read() == b"summaries"


def test_stop_training_job(sm, staged):
    sm.create_training_job(**training_request("boto-stop", staged, sleep="300"))
    wait_for(sm, "boto-stop", statuses=("InProgress",))
    time.sleep(1)
    sm.stop_training_job(TrainingJobName="boto-stop")
    desc = wait_for(sm, "boto-stop")
    assert desc["TrainingJobStatus"] == "Stopped"


# -- bad input ----------------------------------------------------------------------------


def refused(sm, request: dict, code: str, *phrases: str) -> None:
    from botocore.exceptions import ClientError

    with pytest.raises(ClientError) as info:
        sm.create_training_job(**request)
    err = info.value.response["Error"]
    assert err["Code"] == code, err
    for phrase in phrases:
        assert phrase in err["Message"], err["Message"]
    name = request["TrainingJobName"]
    if name != "boto-plain":
        with pytest.raises(ClientError, match="Requested resource not found"):
            sm.describe_training_job(TrainingJobName=name)


def test_bad_training_requests_are_refused_and_nothing_is_left(server, sm, staged):
    req = training_request("bad-image", staged)
    req["AlgorithmSpecification"]["TrainingImage"] = "123.dkr.ecr.us-east-1.amazonaws.com/xgboost:1"
    refused(sm, req, "ValidationException", "xgboost:1'", "pytorch-training")

    req = training_request("bad-channel", staged)
    req["InputDataConfig"][0]["DataSource"]["S3DataSource"]["S3Uri"] = f"s3://{staged}/nothing"
    refused(sm, req, "ValidationException", "channel 'training'", "nothing")

    req = training_request("bad-type", staged)
    req["ResourceConfig"]["InstanceType"] = "ml.bogus.huge"
    refused(sm, req, "ValidationException", "ml.bogus.huge", "resourceConfig.instanceType")

    req = training_request(
        "bad-dist",
        staged,
        sagemaker_mpi_enabled="true",
        sagemaker_mpi_num_of_processes_per_host='"two"',
    )
    refused(sm, req, "ValidationException", "processes_per_host")

    refused(sm, training_request("boto-plain", staged), "ResourceInUse", "already exists")

    req = training_request("too-many", staged)
    req["ResourceConfig"]["InstanceCount"] = 40
    refused(sm, req, "ResourceLimitExceeded", "is 32 Instances", "delta of 40")
    from shipyard.control.client import ControlPlane

    names = {r.name for r in ControlPlane(home=server.home).list()}
    assert not names & {"bad-image", "bad-channel", "bad-type", "bad-dist", "too-many"}
    assert not [d for d in os.listdir(os.path.join(server.home, "jobs")) if d.startswith("bad-")]
    assert os.listdir(os.path.join(server.home, "server", "staging")) == []


def test_invoke_missing_endpoint_and_malformed_bodies(server, sm):
    import urllib.request

    import boto3

    runtime = boto3.client("sagemaker-runtime")
    # sagemaker-runtime's modeled error is ValidationError (not SageMaker's
    # ValidationException): botocore raises its own class for it, as against the real service
    with pytest.raises(runtime.exceptions.ValidationError) as missing:
        runtime.invoke_endpoint(EndpointName="nowhere", Body=b"{}", ContentType="application/json")
    assert missing.value.response["Error"] == {
        "Code": "ValidationError",
        "Message": "Endpoint nowhere of account 000000000000 not found.",
    }
    assert missing.value.response["ResponseMetadata"]["HTTPStatusCode"] == 400
    with pytest.raises(sm.exceptions.ClientError, match="Could not find endpoint"):
        sm.describe_endpoint(EndpointName="nowhere")
    target = {"X-Amz-Target": "SageMaker.DescribeTrainingJob"}
    request = urllib.request.Request(
        server.url + "/",
        data=b"{not json",
        headers=signed_headers(server.url + "/", "POST", b"{not json", target, "sagemaker"),
        method="POST",
    )
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(request, timeout=30)
    assert info.value.code == 400 and b"SerializationException" in info.value.read()
    # an oversized body is refused from its headers, without being read
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        signed = signed_headers(
            server.url + "/", "POST", b"{", {"X-Amz-Target": "SageMaker.CreateModel"}, "sagemaker"
        )
        head = "".join(f"{k}: {v}\r\n" for k, v in signed.items() if k != "Content-Length")
        sock.sendall(f"POST / HTTP/1.1\r\n{head}Content-Length: 104857600\r\n\r\n{{".encode())
        # the answer ends with the connection (Connection: close); its head and body may
        # arrive in separate reads (one recv once returned the head alone in CI)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
    assert b"at most" in answer
    # a model that cannot load: the endpoint is Failed and InvokeEndpoint names it
    import boto3 as _boto3

    s3 = _boto3.client("s3")
    s3.create_bucket(Bucket="junk-models")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        info = tarfile.TarInfo("notes.txt")
        info.size = 4
        tar.addfile(info, io.BytesIO(b"junk"))
    s3.put_object(Bucket="junk-models", Key="model.tar.gz", Body=buf.getvalue())
    sm.create_model(
        ModelName="junk",
        PrimaryContainer={
            "Image": "763104351884.dkr.ecr.us-east-1.amazonaws.com/pytorch-inference:2.3.0-cpu-py311",
            "ModelDataUrl": "s3://junk-models/model.tar.gz",
        },
        ExecutionRoleArn=ROLE,
    )
    sm.create_endpoint_config(
        EndpointConfigName="junk",
        ProductionVariants=[
            {
                "VariantName": "AllTraffic",
                "ModelName": "junk",
                "InitialInstanceCount": 1,
                "InstanceType": "ml.c5.xlarge",
            }
        ],
    )
    sm.create_endpoint(EndpointName="junk", EndpointConfigName="junk")
    deadline = time.monotonic() + 120
    while sm.describe_endpoint(EndpointName="junk")["EndpointStatus"] == "Creating":
        assert time.monotonic() < deadline
        time.sleep(0.3)
    desc = sm.describe_endpoint(EndpointName="junk")
    assert desc["EndpointStatus"] == "Failed" and desc["FailureReason"]
    with pytest.raises(runtime.exceptions.ValidationError) as failed:
        runtime.invoke_endpoint(EndpointName="junk", Body=b"[]", ContentType="application/json")
    assert failed.value.response["Error"]["Code"] == "ValidationError"
    assert failed.value.response["Error"]["Message"].startswith(
        "Endpoint junk of account 000000000000 is not InService (it is Failed: "
    )
    sm.delete_endpoint(EndpointName="junk")
    with pytest.raises(sm.exceptions.ClientError, match="Could not find model"):
        sm.create_endpoint_config(
            EndpointConfigName="orphan",
            ProductionVariants=[{"VariantName": "v", "ModelName": "nope"}],
        )
    # the server is still up
    assert sm.list_training_jobs()["TrainingJobSummaries"] is not None
