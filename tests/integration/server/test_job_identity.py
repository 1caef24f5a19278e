"""A job created through ``shipyard server`` acts as itself, not as the server (issue 37).

Its environment holds no key of the server's; boto3 in the job finds a credential minted
for that job alone (SageMaker's container credentials), which reaches the job's channels,
its own output, checkpoint prefix and logs, and nothing else: another job's prefix, another
bucket, CreateTrainingJob are refused with the service's own AccessDenied. Once the job
ends the credential is revoked. Requests naming the server's files are refused: a
``file://`` submit directory, a host path as CheckpointConfig.LocalPath. boto3 is the
client throughout, on both sides.
"""

from __future__ import annotations

import io
import json
import os
import tarfile

import pytest

from tests.integration.server.test_boto3 import training_request, wait_for

SERVER_ENV = {"SHIPYARD_FRAMEWORK_ENVS": "off"}
BUCKET = "identity-test"

# What the job tries with the credential it was given, recorded in its model.
PROBE = """\
import json, os, sys
import boto3
from botocore.exceptions import ClientError

job, bucket = os.environ["TRAINING_JOB_NAME"], os.environ["SM_HP_BUCKET"]
out = {"env": {k: v for k, v in os.environ.items()}}
s3, sm, logs = boto3.client("s3"), boto3.client("sagemaker"), boto3.client("logs")

def attempt(name, call):
    try:
        call()
        out[name] = "ok"
    except ClientError as exc:
        out[name] = exc.response["Error"]["Code"] + ": " + exc.response["Error"]["Message"]
    except Exception as exc:
        out[name] = type(exc).__name__ + ": " + str(exc)[:300]

try:  # a directory of the server's machine named in a hyperparameter is not bound
    out["named_host_dir"] = sorted(os.listdir(os.environ["SM_HP_HOSTDIR"]))
except OSError as exc:
    out["named_host_dir"] = type(exc).__name__
attempt("read_channel", lambda: s3.get_object(Bucket=bucket, Key="data/train/rows.csv"))
attempt("write_own_output", lambda: s3.put_object(Bucket=bucket, Key=f"output/{job}/note", Body=b"x"))
attempt("list_own_output", lambda: s3.list_objects_v2(Bucket=bucket, Prefix=f"output/{job}/"))
attempt("read_other_job", lambda: s3.get_object(Bucket=bucket, Key="output/other-job/secret.txt"))
attempt("write_other_job", lambda: s3.put_object(Bucket=bucket, Key="output/other-job/x", Body=b"x"))
attempt("list_whole_bucket", lambda: s3.list_objects_v2(Bucket=bucket))
attempt("other_bucket", lambda: s3.get_object(Bucket="identity-other", Key="secret.txt"))
attempt("list_buckets", lambda: s3.list_buckets())
attempt("own_logs", lambda: logs.describe_log_streams(
    logGroupName="/aws/sagemaker/TrainingJobs", logStreamNamePrefix=job + "/"))
attempt("other_logs", lambda: logs.describe_log_streams(
    logGroupName="/aws/sagemaker/TrainingJobs", logStreamNamePrefix="other-job"))
attempt("list_training_jobs", lambda: sm.list_training_jobs())
attempt("create_training_job", lambda: sm.create_training_job(
    TrainingJobName=job + "-child", RoleArn="arn:aws:iam::000000000000:role/x",
    AlgorithmSpecification={"TrainingImage": "pytorch-training", "TrainingInputMode": "File"},
    HyperParameters={"sagemaker_program": '"train.py"',
                     "sagemaker_submit_directory": f'"s3://{bucket}/code/sourcedir.tar.gz"'},
    OutputDataConfig={"S3OutputPath": f"s3://{bucket}/child"},
    ResourceConfig={"InstanceType": "ml.m5.large", "InstanceCount": 1, "VolumeSizeInGB": 1},
    StoppingCondition={"MaxRuntimeInSeconds": 60}))
creds = boto3.Session().get_credentials().get_frozen_credentials()
out["credential"] = [creds.access_key, creds.secret_key, creds.token]
checkpoints = "/opt/ml/checkpoints/run"
os.makedirs(checkpoints, exist_ok=True)
with open(os.path.join(checkpoints, "step.txt"), "w") as fh:
    fh.write("7")
with open(os.path.join(os.environ["SM_MODEL_DIR"], "identity.json"), "w") as fh:
    json.dump(out, fh)
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
    """The probe's code, a channel, another job's output and another bucket's object."""
    s3.create_bucket(Bucket=BUCKET)
    s3.create_bucket(Bucket="identity-other")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        data = PROBE.encode()
        info = tarfile.TarInfo("train.py")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    s3.put_object(Bucket=BUCKET, Key="code/sourcedir.tar.gz", Body=buf.getvalue())
    s3.put_object(Bucket=BUCKET, Key="data/train/rows.csv", Body=b"1\n2\n3\n")
    s3.put_object(Bucket=BUCKET, Key="output/other-job/secret.txt", Body=b"not yours")
    s3.put_object(Bucket="identity-other", Key="secret.txt", Body=b"not yours either")
    return BUCKET


@pytest.fixture(scope="module")
def probed(server, s3, sm, staged, tmp_path_factory):
    """The probe job, run to completion: what it saw and could do (its identity.json)."""
    req = training_request("identity-probe", staged)
    req["HyperParameters"]["bucket"] = json.dumps(staged)
    host_dir = tmp_path_factory.mktemp("server-side")
    (host_dir / "private.txt").write_text("the server's")
    req["HyperParameters"]["hostdir"] = json.dumps(str(host_dir))
    req["CheckpointConfig"] = {
        "S3Uri": f"s3://{staged}/checkpoints/identity-probe",
        "LocalPath": "/opt/ml/checkpoints",
    }
    sm.create_training_job(**req)
    desc = wait_for(sm, "identity-probe", timeout=180)
    assert desc["TrainingJobStatus"] == "Completed", desc.get("FailureReason")
    key = desc["ModelArtifacts"]["S3ModelArtifacts"].split("/", 3)[3]
    body = s3.get_object(Bucket=staged, Key=key)
    with tarfile.open(fileobj=io.BytesIO(body["Body"].read())) as tar:
        member = tar.extractfile("identity.json")
        assert member is not None
        return json.load(member)


@pytest.mark.timeout(300)
def test_the_job_environment_holds_no_key_of_the_servers(probed):
    env = probed["env"]
    server_secret = os.environ["AWS_SECRET_ACCESS_KEY"]
    assert not [k for k, v in env.items() if server_secret in v], "the server's secret leaked"
    assert "AWS_SECRET_ACCESS_KEY" not in env and "AWS_ACCESS_KEY_ID" not in env
    assert "SHIPYARD_HOME" not in env
    # a request names no directory of the server's machine into the job
    assert probed["named_host_dir"] == "FileNotFoundError", probed["named_host_dir"]
    assert env["AWS_CONTAINER_CREDENTIALS_FULL_URI"].endswith("/_shipyard/credentials")
    # the credential boto3 found is the job's own, not the server's
    access, secret, token = probed["credential"]
    assert access != os.environ["AWS_ACCESS_KEY_ID"] and secret != server_secret and token


@pytest.mark.timeout(300)
def test_the_job_credential_reaches_its_own_prefixes_only(probed, s3, staged):
    assert probed["read_channel"] == "ok", probed["read_channel"]
    assert probed["write_own_output"] == "ok", probed["write_own_output"]
    assert probed["list_own_output"] == "ok", probed["list_own_output"]
    assert probed["own_logs"] == "ok", probed["own_logs"]
    for refused in ("read_other_job", "write_other_job", "list_whole_bucket", "other_bucket"):
        assert probed[refused].startswith("AccessDenied:"), (refused, probed[refused])
        assert "identity-probe" in probed[refused]
    assert probed["list_buckets"].startswith("AccessDenied:"), probed["list_buckets"]
    for refused in ("other_logs", "list_training_jobs", "create_training_job"):
        assert probed[refused].startswith("AccessDeniedException:"), (refused, probed[refused])
    # nothing was written where it was refused, no child job exists
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=staged).get("Contents", [])]
    assert "output/other-job/x" not in keys
    assert "output/identity-probe/note" in keys
    # LocalPath /opt/ml/checkpoints is the instance's own tree, synced to the S3 prefix
    assert "checkpoints/identity-probe/run/step.txt" in keys


@pytest.mark.timeout(300)
def test_the_job_credential_is_revoked_when_the_job_ends(server, probed, sm, staged):
    import boto3
    from botocore.exceptions import ClientError

    access, secret, token = probed["credential"]
    kw = dict(
        endpoint_url=server.url,
        aws_access_key_id=access,
        aws_secret_access_key=secret,
        aws_session_token=token,
        region_name="us-east-1",
    )
    with pytest.raises(ClientError) as info:
        boto3.client("s3", **kw).get_object(Bucket=staged, Key="output/identity-probe/note")
    err = info.value.response["Error"]
    assert err["Code"] == "AccessDenied" and "revoked" in err["Message"], err
    assert "Completed" in err["Message"]
    with pytest.raises(ClientError) as info:
        boto3.client("sagemaker", **kw).list_training_jobs()
    assert info.value.response["Error"]["Code"] == "AccessDeniedException"
    # the key file stays the server's alone, 0600 in a 0700 directory
    keys = os.path.join(server.home, "server", "job-keys")
    assert os.stat(keys).st_mode & 0o777 == 0o700
    assert os.stat(os.path.join(keys, "identity-probe.json")).st_mode & 0o777 == 0o600


def _refused(sm, request: dict, *phrases: str) -> None:
    from botocore.exceptions import ClientError

    with pytest.raises(ClientError) as info:
        sm.create_training_job(**request)
    err = info.value.response["Error"]
    assert err["Code"] == "ValidationException", err
    for phrase in phrases:
        assert phrase in err["Message"], err["Message"]
    with pytest.raises(ClientError, match="Requested resource not found"):
        sm.describe_training_job(TrainingJobName=request["TrainingJobName"])


@pytest.mark.timeout(120)
def test_requests_naming_the_servers_files_are_refused(server, sm, staged, tmp_path):
    hidden = tmp_path / "hidden"
    hidden.mkdir(mode=0o700)
    (hidden / "train.py").write_text("print('never runs')\n")

    req = training_request("file-submit", staged)
    req["HyperParameters"]["sagemaker_submit_directory"] = json.dumps(f"file://{hidden}")
    _refused(sm, req, "sagemaker_submit_directory", "must be an s3:// location")

    req = training_request("bare-submit", staged)
    req["HyperParameters"]["sagemaker_submit_directory"] = json.dumps(str(hidden))
    _refused(sm, req, "must be an s3:// location")

    req = training_request("host-localpath", staged)
    req["CheckpointConfig"] = {"S3Uri": f"s3://{staged}/ck", "LocalPath": server.home}
    _refused(sm, req, "CheckpointConfig.LocalPath", "inside the instance's tree")

    req = training_request("dotdot-localpath", staged)
    req["CheckpointConfig"] = {"S3Uri": f"s3://{staged}/ck", "LocalPath": "/opt/ml/../../tmp"}
    _refused(sm, req, "CheckpointConfig.LocalPath", "normalized")

    req = training_request("file-channel", staged)
    req["InputDataConfig"][0]["DataSource"]["S3DataSource"]["S3Uri"] = f"file://{hidden}"
    _refused(sm, req, "s3Uri", "s3)://")  # the API's own pattern (botocore's service model)

    req = training_request("file-output", staged)
    req["OutputDataConfig"]["S3OutputPath"] = f"file://{hidden}"
    _refused(sm, req, "s3OutputPath")

    req = training_request("host-tensorboard", staged)
    req["TensorBoardOutputConfig"] = {"S3OutputPath": f"s3://{staged}/tb", "LocalPath": "/root"}
    _refused(sm, req, "TensorBoardOutputConfig.LocalPath", "inside the instance's tree")
    # a refused request leaves no credential behind
    keys = os.path.join(server.home, "server", "job-keys")
    left = os.listdir(keys) if os.path.isdir(keys) else []
    assert not [k for k in left if k.split(".")[0] in ("file-submit", "host-localpath")], left
