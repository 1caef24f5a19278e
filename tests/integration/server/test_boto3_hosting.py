"""boto3's hosting calls against a real ``shipyard server``: CreateModel ->
CreateEndpointConfig -> CreateEndpoint (Creating, then InService), InvokeEndpoint with the
headers the SDK sends, UpdateEndpoint to a new config, ListEndpoints, the endpoint's
CloudWatch log stream, DeleteEndpoint (the model server is gone), and tags."""

from __future__ import annotations

import io
import json
import tarfile
import time

import pytest

IMAGE = "763104351884.dkr.ecr.us-east-1.amazonaws.com/pytorch-inference:2.3.0-cpu-py311"
ROLE = "arn:aws:iam::000000000000:role/ShipyardExecutionRole"
INFERENCE = """\
import json, os

def model_fn(model_dir):
    with open(os.path.join(model_dir, "scale.json")) as fh:
        return json.load(fh)["scale"] * float(os.environ.get("EXTRA_SCALE", "1"))

def input_fn(body, content_type):
    return json.loads(body)

def predict_fn(data, scale):
    return [x * scale for x in data]

def output_fn(prediction, accept):
    return json.dumps({"scaled": prediction})
"""


def model_tar() -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, text in (("scale.json", '{"scale": 2}'), ("code/inference.py", INFERENCE)):
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def wait_status(sm, name: str, timeout: float = 120) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        desc = sm.describe_endpoint(EndpointName=name)
        if desc["EndpointStatus"] not in ("Creating", "Updating"):
            return desc
        assert time.monotonic() < deadline, desc
        time.sleep(0.3)


def test_model_config_endpoint_invoke_update_delete(server):
    import boto3

    from shipyard.control.endpoints import EndpointNotFoundError, Endpoints

    s3, sm = boto3.client("s3"), boto3.client("sagemaker")
    runtime, logs = boto3.client("sagemaker-runtime"), boto3.client("logs")
    s3.create_bucket(Bucket="models")
    s3.put_object(Bucket="models", Key="scale/model.tar.gz", Body=model_tar())
    for name, extra in (("scale-x1", "1"), ("scale-x10", "10")):
        sm.create_model(
            ModelName=name,
            PrimaryContainer={
                "Image": IMAGE,
                "ModelDataUrl": "s3://models/scale/model.tar.gz",
                "Environment": {"SAGEMAKER_PROGRAM": "inference.py", "EXTRA_SCALE": extra},
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
                    "InstanceType": "ml.c5.large",
                }
            ],
        )
    assert sm.describe_model(ModelName="scale-x1")["PrimaryContainer"]["Image"] == IMAGE
    with pytest.raises(
        sm.exceptions.ClientError, match="Could not find ModelDataUrl at s3://models/none.tar.gz"
    ):
        sm.create_model(
            ModelName="nowhere",
            PrimaryContainer={"Image": IMAGE, "ModelDataUrl": "s3://models/none.tar.gz"},
            ExecutionRoleArn=ROLE,
        )
    arn = sm.create_endpoint(EndpointName="scaler", EndpointConfigName="scale-x1")["EndpointArn"]
    assert sm.describe_endpoint(EndpointName="scaler")["EndpointStatus"] == "Creating"
    desc = wait_status(sm, "scaler")
    assert desc["EndpointStatus"] == "InService", desc.get("FailureReason")
    assert desc["ProductionVariants"][0]["DeployedImages"][0]["SpecifiedImage"] == IMAGE
    answer = runtime.invoke_endpoint(
        EndpointName="scaler",
        Body=b"[1, 2]",
        ContentType="application/json",
        Accept="application/json",
    )
    assert json.loads(answer["Body"].read()) == {"scaled": [2.0, 4.0]}
    assert answer["InvokedProductionVariant"] == "AllTraffic"
    # the record shipyard's CLI lists
    assert Endpoints(server.home).get("scaler").status == "InService"

    sm.update_endpoint(EndpointName="scaler", EndpointConfigName="scale-x10")
    desc = wait_status(sm, "scaler")
    assert desc["EndpointStatus"] == "InService" and desc["EndpointConfigName"] == "scale-x10"
    answer = runtime.invoke_endpoint(
        EndpointName="scaler", Body=b"[1]", ContentType="application/json"
    )
    assert json.loads(answer["Body"].read()) == {"scaled": [20.0]}
    assert [e["EndpointName"] for e in sm.list_endpoints()["Endpoints"]] == ["scaler"]
    streams = logs.describe_log_streams(logGroupName="/aws/sagemaker/Endpoints/scaler")
    assert [s["logStreamName"] for s in streams["logStreams"]] == ["AllTraffic/scaler"]

    sm.add_tags(ResourceArn=arn, Tags=[{"Key": "team", "Value": "ml"}])
    assert sm.list_tags(ResourceArn=arn)["Tags"] == [{"Key": "team", "Value": "ml"}]

    sm.delete_endpoint(EndpointName="scaler")
    with pytest.raises(EndpointNotFoundError):
        Endpoints(server.home).get("scaler")
    with pytest.raises(sm.exceptions.ClientError, match="Could not find endpoint"):
        sm.describe_endpoint(EndpointName="scaler")
    for name in ("scale-x1", "scale-x10"):
        sm.delete_endpoint_config(EndpointConfigName=name)
        sm.delete_model(ModelName=name)
    with pytest.raises(sm.exceptions.ClientError, match="Could not find model"):
        sm.describe_model(ModelName="scale-x1")
