"""contract.Contract against botocore's real service models: what each kind of member
accepts, the member path named in the message, and operations outside the table."""

from __future__ import annotations

import pytest

from shipyard.server.contract import Contract
from shipyard.server.errors import ApiError

pytest.importorskip("botocore")


@pytest.fixture(scope="module")
def sm() -> Contract:
    return Contract("sagemaker", {"CreateTrainingJob", "ListTrainingJobs", "DescribeTrainingJob"})


@pytest.fixture(scope="module")
def logs() -> Contract:
    return Contract("logs", {"GetLogEvents"})


def request(**over) -> dict:
    base = {
        "TrainingJobName": "job-1",
        "AlgorithmSpecification": {"TrainingImage": "img", "TrainingInputMode": "File"},
        "RoleArn": "arn:aws:iam::000000000000:role/ShipyardExecutionRole",
        "OutputDataConfig": {"S3OutputPath": "s3://b/out"},
        "ResourceConfig": {
            "InstanceType": "ml.m5.xlarge",
            "InstanceCount": 1,
            "VolumeSizeInGB": 30,
        },
        "StoppingCondition": {"MaxRuntimeInSeconds": 3600},
        "HyperParameters": {"epochs": "2"},
        "Tags": [{"Key": "team", "Value": "ml"}],
    }
    base.update(over)
    return base


def refused(contract: Contract, operation: str, params) -> str:
    with pytest.raises(ApiError) as info:
        contract.validate(operation, params)
    assert info.value.code == "ValidationException" and info.value.status == 400
    return info.value.message


def test_a_valid_request_passes(sm):
    sm.validate("CreateTrainingJob", request())
    sm.validate("ListTrainingJobs", {"MaxResults": 10, "CreationTimeAfter": 1.5e9})


@pytest.mark.parametrize(
    ("params", "path", "constraint"),
    [
        ({"TrainingJobName": {"nested": {"x": 1}}}, "trainingJobName", "must be a string"),
        ({"TrainingJobName": "a/b"}, "trainingJobName", "regular expression pattern"),
        ({"TrainingJobName": "x" * 64}, "trainingJobName", "less than or equal to 63"),
        (
            {"StoppingCondition": {"MaxRuntimeInSeconds": "3600"}},
            "stoppingCondition.maxRuntimeInSeconds",
            "must be an integer",
        ),
        (
            {"StoppingCondition": {"MaxRuntimeInSeconds": 0}},
            "stoppingCondition.maxRuntimeInSeconds",
            "greater than or equal to 1",
        ),
        (
            {
                "ResourceConfig": {
                    "InstanceType": "ml.m5.xlarge",
                    "InstanceCount": True,
                    "VolumeSizeInGB": 1,
                }
            },
            "resourceConfig.instanceCount",
            "must be an integer",
        ),
        (
            {
                "ResourceConfig": {
                    "InstanceType": "ml.bogus",
                    "InstanceCount": 1,
                    "VolumeSizeInGB": 1,
                }
            },
            "resourceConfig.instanceType",
            "enum value set",
        ),
        ({"HyperParameters": {"big": "x" * (3 << 20)}}, "hyperParameters.big", "2500"),
        ({"HyperParameters": {"k" * 257: "1"}}, "hyperParameters.key", "256"),
        ({"HyperParameters": {f"k{i}": "1" for i in range(101)}}, "hyperParameters", "100"),
        ({"HyperParameters": {"lr": 0.1}}, "hyperParameters.lr", "must be a string"),
        ({"Tags": [{"Key": "team", "Value": "ml"}] * 51}, "tags", "50"),
        ({"Tags": [{"Key": "k" * 129, "Value": "v"}]}, "tags.1.member.key", "128"),
        ({"Tags": [{"Value": "v"}]}, "tags.1.member.key", "must not be null"),
        ({"Tags": "team=ml"}, "tags", "must be a list"),
    ],
)
def test_each_bad_member_is_named(sm, params, path, constraint):
    message = refused(sm, "CreateTrainingJob", request(**params))
    assert f"at '{path}'" in message and constraint in message, message
    assert len(message) < 2000  # a 3 MB value is quoted cut short


def test_required_members_and_counts(sm):
    message = refused(sm, "CreateTrainingJob", {})
    assert message.split(" ", 1)[0].isdigit() and "validation errors detected" in message
    assert "'roleArn' failed to satisfy constraint: Member must not be null" in message
    assert "'trainingJobName' failed to satisfy constraint: Member must not be null" in message


def test_list_and_logs_inputs(sm, logs):
    assert "'maxResults'" in refused(sm, "ListTrainingJobs", {"MaxResults": "ten"})
    assert "less than or equal to 100" in refused(sm, "ListTrainingJobs", {"MaxResults": 1000})
    assert "'creationTimeAfter'" in refused(sm, "ListTrainingJobs", {"CreationTimeAfter": [1]})
    message = refused(logs, "GetLogEvents", {"logGroupName": 5, "logStreamName": "s"})
    assert "'logGroupName'" in message and "must be a string" in message
    assert "'request'" in refused(logs, "GetLogEvents", ["not", "an", "object"])


def test_a_table_naming_an_operation_botocore_lacks_fails_at_start():
    with pytest.raises(RuntimeError, match="SpecFromRequest"):
        Contract("sagemaker", {"CreateTrainingJob", "SpecFromRequest"})
