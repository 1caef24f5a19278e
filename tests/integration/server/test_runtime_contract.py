"""sagemaker-runtime's InvokeEndpoint checked against botocore's model of it, and members
the SageMaker API does not model: a real server, boto3 as the client (botocore itself
checks only types and minimums, so every value below reaches the server).

- A header carrying an InvokeEndpoint member (ContentType, Accept, CustomAttributes,
  TargetModel, TargetVariant, InferenceId) or an endpoint name that breaks the model's
  length or pattern is a 400 ValidationError naming the member, before the endpoint is
  looked up; well-formed ones pass on to the lookup.
- A JSON body's member the operation does not model is ignored, as AWS's JSON services
  ignore it: the call succeeds and the member is neither stored nor echoed back.
"""

from __future__ import annotations

import json

import pytest

from tests.integration.server.test_api_contract import call, healthy
from tests.integration.server.test_boto3_hosting import IMAGE, ROLE

pytest.importorskip("botocore")


@pytest.fixture(scope="module")
def runtime(server):
    import boto3
    from botocore.config import Config

    return boto3.client("sagemaker-runtime", config=Config(retries={"max_attempts": 1}))


BAD_HEADERS = [
    ({"ContentType": "a" * 1025}, "contentType", "length less than or equal to 1024"),
    ({"Accept": "application/jsön"}, "accept", "regular expression pattern"),
    ({"CustomAttributes": "k=" + "v" * 1023}, "customAttributes", "length"),
    ({"TargetModel": "modèle.tar.gz"}, "targetModel", "Value 'modèle.tar.gz' at"),
    ({"TargetVariant": "variant_one"}, "targetVariant", "regular expression pattern"),
    ({"InferenceId": "i" * 65}, "inferenceId", "length less than or equal to 64"),
]


@pytest.mark.parametrize("headers, member, why", BAD_HEADERS, ids=[m for _, m, _ in BAD_HEADERS])
def test_a_bad_invoke_endpoint_header_is_a_validation_error_naming_it(
    server, runtime, headers, member, why
):
    with pytest.raises(runtime.exceptions.ClientError) as info:
        runtime.invoke_endpoint(EndpointName="some-endpoint", Body=b"{}", **headers)
    error = info.value.response["Error"]
    assert info.value.response["ResponseMetadata"]["HTTPStatusCode"] == 400
    assert error["Code"] == "ValidationError", error
    assert f"at '{member}'" in error["Message"] and why in error["Message"], error
    assert healthy(server)


def test_a_bad_endpoint_name_is_a_validation_error_naming_it(runtime):
    with pytest.raises(runtime.exceptions.ClientError) as info:
        runtime.invoke_endpoint(EndpointName="not_a-name", Body=b"{}")
    error = info.value.response["Error"]
    assert error["Code"] == "ValidationError" and "at 'endpointName'" in error["Message"]


def test_well_formed_headers_pass_on_to_the_endpoint_lookup(runtime):
    with pytest.raises(runtime.exceptions.ClientError) as info:
        runtime.invoke_endpoint(
            EndpointName="no-such-endpoint",
            Body=b"{}",
            ContentType="application/json",
            Accept="application/json",
            CustomAttributes="tfs-method=predict",
            TargetVariant="AllTraffic",
            InferenceId="request-42",
        )
    error = info.value.response["Error"]
    assert error["Code"] == "ValidationError" and "not found" in error["Message"], error


def test_a_member_the_operation_does_not_model_is_ignored(server):
    import boto3

    s3 = boto3.client("s3")
    s3.create_bucket(Bucket="unmodeled")
    s3.put_object(Bucket="unmodeled", Key="model.tar.gz", Body=b"not read here")
    body = {
        "ModelName": "with-extras",
        "ExecutionRoleArn": ROLE,
        "PrimaryContainer": {
            "Image": IMAGE,
            "ModelDataUrl": "s3://unmodeled/model.tar.gz",
            "NotAContainerField": "dropped",
        },
        "NotAModelField": {"anything": [1, 2]},
    }
    status, answer = call(server, "sagemaker", "SageMaker.CreateModel", json.dumps(body))
    assert status == 200, answer
    status, described = call(
        server, "sagemaker", "SageMaker.DescribeModel", json.dumps({"ModelName": "with-extras"})
    )
    assert status == 200, described
    assert "NotAModelField" not in described
    assert "NotAContainerField" not in described["PrimaryContainer"]
    assert described["PrimaryContainer"]["ModelDataUrl"] == "s3://unmodeled/model.tar.gz"
