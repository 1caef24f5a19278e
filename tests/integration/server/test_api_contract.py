"""A real ``shipyard server`` and hand-signed requests (botocore refuses to send most of
these: it validates types and required members client-side): every malformed SageMaker or
CloudWatch Logs input is a 400 ValidationException naming the member, never a 500;
operations outside the table (a private helper, a real SageMaker operation shipyard does
not implement) are AWS's UnknownOperationException; nothing is created by a refused
request and the server answers its health check after every case. Then, through boto3,
ListTrainingJobs' time filters and InvokeEndpoint's payload limit."""

from __future__ import annotations

import http.client
import json
import os
import time
import urllib.request

import pytest

from tests.integration.server.test_boto3 import s3, staged, training_request  # noqa: F401
from tests.integration.server.test_boto3_hosting import IMAGE, ROLE, wait_status

pytest.importorskip("botocore")


def call(server, service: str, target: str, body: bytes | str) -> tuple[int, dict]:
    """POST ``body`` as ``target``, SigV4-signed with the key the server's env gives."""
    from botocore.auth import SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    data = body.encode() if isinstance(body, str) else body
    req = AWSRequest(
        method="POST",
        url=server.url + "/",
        data=data,
        headers={"X-Amz-Target": target, "Content-Type": "application/x-amz-json-1.1"},
    )
    creds = Credentials(os.environ["AWS_ACCESS_KEY_ID"], os.environ["AWS_SECRET_ACCESS_KEY"])
    SigV4Auth(creds, service, os.environ.get("AWS_DEFAULT_REGION", "us-east-1")).add_auth(req)
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    try:
        conn.request("POST", "/", body=data, headers=dict(req.headers.items()))
        resp = conn.getresponse()
        payload = resp.read()
    finally:
        conn.close()
    return resp.status, json.loads(payload or b"{}")


def healthy(server) -> bool:
    with urllib.request.urlopen(server.url + "/_shipyard/health", timeout=10) as resp:
        return resp.status == 200


BAD_SAGEMAKER = [
    ("DescribeTrainingJob", {"TrainingJobName": {"nested": {"x": [1]}}}, "trainingJobName"),
    ("DescribeTrainingJob", {"TrainingJobName": "jobs/../../etc"}, "trainingJobName"),
    ("ListTrainingJobs", {"MaxResults": "ten"}, "maxResults"),
    ("ListTrainingJobs", {"MaxResults": 1.5}, "maxResults"),
    ("ListTrainingJobs", {"CreationTimeAfter": {"a": 1}}, "creationTimeAfter"),
    ("ListEndpoints", {"NameContains": ["x"]}, "nameContains"),
    ("DescribeEndpoint", {"EndpointName": 7}, "endpointName"),
    ("AddTags", {"ResourceArn": "arn:aws:sagemaker:x", "Tags": [{"Key": "k" * 129}]}, "tags.1"),
]


@pytest.mark.parametrize(("operation", "body", "member"), BAD_SAGEMAKER)
def test_bad_sagemaker_input_is_a_400_naming_the_member(server, operation, body, member):
    status, out = call(server, "sagemaker", f"SageMaker.{operation}", json.dumps(body))
    assert status == 400, out
    assert out["__type"] == "ValidationException", out
    assert f"at '{member}" in out["message"], out
    assert healthy(server)


def create(server, name: str, bucket: str, **over) -> tuple[int, dict]:
    body = training_request(name, bucket)
    body.update(over)
    return call(server, "sagemaker", "SageMaker.CreateTrainingJob", json.dumps(body))


@pytest.mark.parametrize(
    ("over", "member"),
    [
        (
            {"StoppingCondition": {"MaxRuntimeInSeconds": "an hour"}},
            "stoppingCondition.maxRuntimeInSeconds",
        ),
        (
            {
                "ResourceConfig": {
                    "InstanceType": "ml.m5.large",
                    "InstanceCount": "2",
                    "VolumeSizeInGB": 1,
                }
            },
            "resourceConfig.instanceCount",
        ),
        ({"HyperParameters": {"big": "x" * (3 << 20)}}, "hyperParameters.big"),
        ({"HyperParameters": {f"k{i}": "1" for i in range(101)}}, "hyperParameters"),
        ({"Tags": [{"Key": f"k{i}", "Value": "v"} for i in range(51)]}, "tags"),
        ({"TrainingJobName": "a/b"}, "trainingJobName"),
    ],
)
def test_a_refused_training_job_leaves_nothing(server, staged, over, member):  # noqa: F811
    name = over.get("TrainingJobName", "refused-job")
    status, out = create(server, "refused-job", staged, **over)
    assert status == 400 and out["__type"] == "ValidationException", out
    assert f"at '{member}'" in out["message"], out
    assert len(out["message"]) < 4000  # a 3 MB value is not echoed back
    status, out = call(
        server,
        "sagemaker",
        "SageMaker.DescribeTrainingJob",
        json.dumps({"TrainingJobName": "refused-job"}),
    )
    assert status == 400 and out["message"] == "Requested resource not found.", (name, out)
    assert healthy(server)


def test_not_json_and_not_an_object(server):
    for body in (b"{not json", b"[1, 2]", b"\xff\xfe", b"[" * 200_000, b'{"a":' * 100_000):
        status, out = call(server, "sagemaker", "SageMaker.ListTrainingJobs", body)
        assert status == 400 and out["__type"] in ("SerializationException", "ValidationException")
    assert healthy(server)


@pytest.mark.parametrize(
    "target",
    [
        "SageMaker.SpecFromRequest",
        "SageMaker.spec_from_request",
        "SageMaker.CreateCluster",
        "SageMaker.Handle",
    ],
)
def test_only_the_table_is_callable(server, target):
    status, out = call(server, "sagemaker", target, b"{}")
    assert status == 400 and out["__type"] == "UnknownOperationException", out
    assert healthy(server)


def test_logs_inputs_and_unknown_actions(server):
    status, out = call(
        server,
        "logs",
        "Logs_20140328.GetLogEvents",
        json.dumps({"logGroupName": 5, "logStreamName": "x"}),
    )
    assert (
        status == 400
        and out["__type"] == "ValidationException"
        and "'logGroupName'" in out["message"]
    )
    status, out = call(
        server,
        "logs",
        "Logs_20140328.DescribeLogStreams",
        json.dumps({"logGroupName": "/aws/sagemaker/TrainingJobs", "limit": "many"}),
    )
    assert status == 400 and "'limit'" in out["message"], out
    status, out = call(server, "logs", "Logs_20140328.PutLogEvents", b"{}")
    assert status == 400 and out["__type"] == "UnknownOperationException", out
    assert healthy(server)


def test_list_training_jobs_time_filters(server, staged):  # noqa: F811
    import boto3

    sm = boto3.client("sagemaker")
    before = time.time() - 1
    sm.create_training_job(**training_request("time-filter-job", staged))
    after = time.time() + 1

    def names(**filters) -> set[str]:
        out = sm.list_training_jobs(MaxResults=100, **filters)["TrainingJobSummaries"]
        return {s["TrainingJobName"] for s in out}

    assert "time-filter-job" in names(CreationTimeAfter=before)
    assert "time-filter-job" not in names(CreationTimeAfter=after)
    assert "time-filter-job" in names(CreationTimeBefore=after)
    assert "time-filter-job" not in names(CreationTimeBefore=before)
    assert "time-filter-job" in names(LastModifiedTimeAfter=before)
    assert "time-filter-job" not in names(LastModifiedTimeBefore=before)
    listed = sm.list_training_jobs(SortBy="Name", SortOrder="Ascending")["TrainingJobSummaries"]
    assert [s["TrainingJobName"] for s in listed] == sorted(s["TrainingJobName"] for s in listed)
    # a hand-written request may send ISO 8601
    status, out = call(
        server,
        "sagemaker",
        "SageMaker.ListTrainingJobs",
        json.dumps({"CreationTimeAfter": "2999-01-01T00:00:00Z"}),
    )
    assert status == 200 and out["TrainingJobSummaries"] == [], out


COUNTER = """\
import json

def model_fn(model_dir):
    return None

def input_fn(body, content_type):
    return json.loads(body)

def predict_fn(data, model):
    return len(data)

def output_fn(prediction, accept):
    return json.dumps({"rows": prediction})
"""


def counter_tar() -> bytes:
    import io
    import tarfile

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        data = COUNTER.encode()
        info = tarfile.TarInfo("code/inference.py")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def test_invoke_payload_limit_is_sagemakers_and_an_endpoint_raises_it(server, s3):  # noqa: F811
    """6 MB (SageMaker's real-time limit) by default; SAGEMAKER_MAX_PAYLOAD_IN_MB in the
    model's Environment raises it for that endpoint, API server and model server alike
    (the workshop's 16 MB JSON batch of 1,000 CIFAR images)."""
    import boto3
    from botocore.exceptions import ClientError

    sm, runtime = boto3.client("sagemaker"), boto3.client("sagemaker-runtime")
    s3.create_bucket(Bucket="payload-models")
    s3.put_object(Bucket="payload-models", Key="counter/model.tar.gz", Body=counter_tar())
    for name, env in (
        ("payload-default", {}),
        ("payload-raised", {"SAGEMAKER_MAX_PAYLOAD_IN_MB": "20"}),
    ):
        sm.create_model(
            ModelName=name,
            PrimaryContainer={
                "Image": IMAGE,
                "ModelDataUrl": "s3://payload-models/counter/model.tar.gz",
                "Environment": {"SAGEMAKER_PROGRAM": "inference.py", **env},
            },
            ExecutionRoleArn=ROLE,
        )
        sm.create_endpoint_config(
            EndpointConfigName=name,
            ProductionVariants=[
                {
                    "VariantName": "AllTraffic",
                    "ModelName": name,
                    "InitialInstanceCount": 1,
                    "InstanceType": "ml.m5.large",
                }
            ],
        )
        sm.create_endpoint(EndpointName=name, EndpointConfigName=name)
    with pytest.raises(ClientError, match="SAGEMAKER_MAX_PAYLOAD_IN_MB"):
        sm.create_model(
            ModelName="payload-bad",
            PrimaryContainer={
                "Image": IMAGE,
                "Environment": {"SAGEMAKER_MAX_PAYLOAD_IN_MB": "lots"},
            },
            ExecutionRoleArn=ROLE,
        )
    try:
        for name in ("payload-default", "payload-raised"):
            assert wait_status(sm, name)["EndpointStatus"] == "InService"
        row = "[" + ",".join(["0.123456"] * 32) + "]"
        five_mb = ("[" + ",".join([row] * 19_500) + "]").encode()  # ~5.7 MB
        sixteen_mb = ("[" + ",".join([row] * 55_000) + "]").encode()  # ~16 MB
        assert 5 << 20 < len(five_mb) < 6 << 20 and len(sixteen_mb) > 15 << 20
        out = runtime.invoke_endpoint(
            EndpointName="payload-default", Body=five_mb, ContentType="application/json"
        )
        assert json.loads(out["Body"].read()) == {"rows": 19_500}
        with pytest.raises(ClientError) as info:
            runtime.invoke_endpoint(
                EndpointName="payload-default", Body=sixteen_mb, ContentType="application/json"
            )
        assert info.value.response["ResponseMetadata"]["HTTPStatusCode"] == 413
        assert "SAGEMAKER_MAX_PAYLOAD_IN_MB" in str(info.value)
        out = runtime.invoke_endpoint(
            EndpointName="payload-raised", Body=sixteen_mb, ContentType="application/json"
        )
        assert json.loads(out["Body"].read()) == {"rows": 55_000}
        assert healthy(server)
    finally:
        for name in ("payload-default", "payload-raised"):
            sm.delete_endpoint(EndpointName=name)
