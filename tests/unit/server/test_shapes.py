"""The checker behind the server suite's shape fixture (tests/integration/server/shapes.py)
catches what it is there to catch: a missing required member, a member of the wrong type,
a string outside its enum, at any depth; and a well-formed answer passes."""

from __future__ import annotations

import json

from tests.integration.server.shapes import ShapeRecorder, mismatches

GOOD = {
    "TrainingJobName": "j",
    "TrainingJobArn": "arn:aws:sagemaker:us-east-1:000000000000:training-job/j",
    "ModelArtifacts": {"S3ModelArtifacts": "s3://b/k/model.tar.gz"},
    "TrainingJobStatus": "Completed",
    "SecondaryStatus": "Completed",
    "AlgorithmSpecification": {"TrainingInputMode": "File", "TrainingImage": "img"},
    "ResourceConfig": {"InstanceCount": 1, "InstanceType": "ml.m5.large", "VolumeSizeInGB": 1},
    "StoppingCondition": {"MaxRuntimeInSeconds": 60},
    "CreationTime": 1700000000.5,
    "HyperParameters": {"epochs": "1"},
}


def test_a_well_formed_answer_passes() -> None:
    assert mismatches("DescribeTrainingJob", GOOD) == []


def test_a_missing_required_member_is_named() -> None:
    answer = {k: v for k, v in GOOD.items() if k != "TrainingJobArn"}
    assert mismatches("DescribeTrainingJob", answer) == [
        "DescribeTrainingJob: required member TrainingJobArn (DescribeTrainingJobResponse) "
        "is missing"
    ]


def test_wrong_types_and_enums_are_found_at_depth() -> None:
    answer = json.loads(json.dumps(GOOD))
    answer["ResourceConfig"]["InstanceCount"] = "1"
    answer["TrainingJobStatus"] = "Running"
    answer["HyperParameters"] = {"epochs": 1}
    answer["CreationTime"] = True
    found = mismatches("DescribeTrainingJob", answer)
    assert len(found) == 4, found
    assert any("ResourceConfig.InstanceCount" in f and "integer" in f for f in found)
    assert any("'Running' is not one of TrainingJobStatus" in f for f in found)
    assert any("HyperParameters['epochs']" in f for f in found)
    assert any("CreationTime" in f and "timestamp" in f for f in found)


def test_the_recorder_checks_sagemaker_answers_only_and_by_operation() -> None:
    recorder = ShapeRecorder()
    bad = json.dumps({"TrainingJobSummaries": [{"TrainingJobName": "j"}]}).encode()
    recorder.emit("API_CALL", {"service": "s3", "operation": "ListBuckets"}, "BOTOCORE")
    recorder.emit("HTTP_RESPONSE", {"status_code": 200, "body": b"<xml/>"}, "BOTOCORE")
    recorder.emit("API_CALL", {"service": "sagemaker", "operation": "ListTrainingJobs"}, "B")
    recorder.emit("HTTP_RESPONSE", {"status_code": 400, "body": b'{"__type": "x"}'}, "B")
    assert recorder.take() == [] and recorder.checked == {}
    recorder.emit("API_CALL", {"service": "sagemaker", "operation": "ListTrainingJobs"}, "B")
    recorder.emit("HTTP_RESPONSE", {"status_code": 200, "body": bad}, "B")
    found = recorder.take()
    assert recorder.checked == {"ListTrainingJobs": 1}
    assert any("TrainingJobSummaries[0]: required member TrainingJobArn" in f for f in found)
    assert recorder.take() == []


def test_a_known_gap_is_excused_only_while_the_job_has_no_model() -> None:
    running = {k: v for k, v in GOOD.items() if k != "ModelArtifacts"}
    running["TrainingJobStatus"] = "InProgress"
    assert mismatches("DescribeTrainingJob", running) == []
    running["TrainingJobStatus"] = "Completed"
    assert any("ModelArtifacts" in f for f in mismatches("DescribeTrainingJob", running))
