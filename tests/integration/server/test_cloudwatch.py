"""boto3's CloudWatch client against a real ``shipyard server``: a finished 2-instance
training job's per-host utilization where SageMaker publishes it (namespace
/aws/sagemaker/TrainingJobs, dimension Host = <job>/algo-k), over botocore's own
protocol for CloudWatch (Smithy RPC v2 CBOR)."""

from __future__ import annotations

import datetime as dt
import io
import json
import tarfile

import pytest

from tests.integration.server.test_boto3 import ROLE, wait_for

IMAGE = "763104351884.dkr.ecr.us-east-1.amazonaws.com/pytorch-training:2.3.0-cpu-py311"
# the jobs run on the installed torch: asking for 2.3.0 through the image tag would build a
# framework environment first (tests/integration/environments and test_image_uri_version do)
SERVER_ENV = {"SHIPYARD_FRAMEWORK_ENVS": "off"}
BUSY = """\
import time
hold = bytearray(100 << 20)
end = time.monotonic() + 2.5
while time.monotonic() < end:
    pass
"""
NS = "/aws/sagemaker/TrainingJobs"


@pytest.fixture(scope="module")
def finished_job(server):
    import boto3

    s3 = boto3.client("s3")
    s3.create_bucket(Bucket="cw-test")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        info = tarfile.TarInfo("train.py")
        info.size = len(BUSY)
        tar.addfile(info, io.BytesIO(BUSY.encode()))
    s3.put_object(Bucket="cw-test", Key="code/sourcedir.tar.gz", Body=buf.getvalue())
    sm = boto3.client("sagemaker")
    sm.create_training_job(
        TrainingJobName="cw-job",
        AlgorithmSpecification={"TrainingImage": IMAGE, "TrainingInputMode": "File"},
        RoleArn=ROLE,
        HyperParameters={
            "sagemaker_program": json.dumps("train.py"),
            "sagemaker_submit_directory": json.dumps("s3://cw-test/code/sourcedir.tar.gz"),
        },
        OutputDataConfig={"S3OutputPath": "s3://cw-test/output"},
        ResourceConfig={"InstanceType": "ml.m5.large", "InstanceCount": 2, "VolumeSizeInGB": 10},
        StoppingCondition={"MaxRuntimeInSeconds": 600},
    )
    desc = wait_for(sm, "cw-job")
    assert desc["TrainingJobStatus"] == "Completed", desc.get("FailureReason")
    return desc


@pytest.mark.timeout(180)
def test_instance_metrics_per_host_through_cloudwatch(finished_job):
    import boto3

    cw = boto3.client("cloudwatch")
    start = finished_job["TrainingStartTime"] - dt.timedelta(minutes=1)
    end = dt.datetime.now(dt.timezone.utc) + dt.timedelta(minutes=1)
    for host in ("algo-1", "algo-2"):
        for metric in ("CPUUtilization", "MemoryUtilization"):
            got = cw.get_metric_statistics(
                Namespace=NS,
                MetricName=metric,
                Dimensions=[{"Name": "Host", "Value": f"cw-job/{host}"}],
                StartTime=start,
                EndTime=end,
                Period=60,
                Statistics=["Average", "Maximum", "SampleCount"],
            )
            points = got["Datapoints"]
            assert points, (host, metric, got)
            assert all(p["Maximum"] >= p["Average"] > 0 for p in points), points
            assert isinstance(points[0]["Timestamp"], dt.datetime)
    data = cw.get_metric_data(
        MetricDataQueries=[
            {
                "Id": "cpu1",
                "MetricStat": {
                    "Metric": {
                        "Namespace": NS,
                        "MetricName": "CPUUtilization",
                        "Dimensions": [{"Name": "Host", "Value": "cw-job/algo-1"}],
                    },
                    "Period": 1,
                    "Stat": "Maximum",
                },
            }
        ],
        StartTime=start,
        EndTime=end,
    )["MetricDataResults"]
    assert data[0]["Id"] == "cpu1" and data[0]["StatusCode"] == "Complete"
    assert data[0]["Values"] and len(data[0]["Values"]) == len(data[0]["Timestamps"])
    listed = cw.list_metrics(Namespace=NS, Dimensions=[{"Name": "Host", "Value": "cw-job/algo-2"}])[
        "Metrics"
    ]
    assert {"CPUUtilization", "MemoryUtilization"} <= {m["MetricName"] for m in listed}


def test_bad_metric_requests_are_refused_with_a_reason(server):
    import boto3
    from botocore.exceptions import ClientError

    cw = boto3.client("cloudwatch")
    now = dt.datetime.now(dt.timezone.utc)
    with pytest.raises(ClientError) as err:
        cw.get_metric_statistics(
            Namespace=NS,
            MetricName="CPUUtilization",
            Dimensions=[{"Name": "InstanceId", "Value": "i-1"}],
            StartTime=now - dt.timedelta(hours=1),
            EndTime=now,
            Period=60,
            Statistics=["Average"],
        )
    assert err.value.response["Error"]["Code"] == "InvalidParameterCombination"
    assert "Host" in err.value.response["Error"]["Message"]
    with pytest.raises(ClientError) as err:
        cw.get_metric_statistics(
            Namespace=NS,
            MetricName="CPUUtilization",
            Dimensions=[{"Name": "Host", "Value": "cw-job/algo-1"}],
            StartTime=now,
            EndTime=now - dt.timedelta(hours=1),
            Period=60,
            Statistics=["Average"],
        )
    assert "EndTime must be after StartTime" in err.value.response["Error"]["Message"]
    with pytest.raises(ClientError) as err:
        cw.put_metric_data(Namespace="mine", MetricData=[{"MetricName": "x", "Value": 1.0}])
    assert "not served" in err.value.response["Error"]["Message"]
