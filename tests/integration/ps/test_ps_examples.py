"""The shipyard.ps examples train the tutorials' CNN on digits as 2-instance async jobs."""

from __future__ import annotations

import os
import sys

import pytest

import shipyard

EXAMPLES = os.path.join(os.path.dirname(__file__), "..", "..", "..", "examples")
ACC = [{"Name": "test:accuracy", "Regex": r"test_accuracy=([0-9.]+)"}]


@pytest.fixture(scope="module")
def digits(tmp_path_factory):
    sys.path.insert(0, os.path.join(EXAMPLES, "data"))
    try:
        from make_digits import write_digits
    finally:
        sys.path.pop(0)
    out = tmp_path_factory.mktemp("digits")
    write_digits(str(out))
    return str(out)


def check(est) -> dict:
    desc = est.latest_training_job.describe()
    assert desc["TrainingJobStatus"] == "Completed", desc.get("FailureReason")
    metrics = {m["MetricName"]: m["Value"] for m in desc["FinalMetricDataList"]}
    assert metrics["test:accuracy"] >= 0.95, metrics
    report = desc["Shipyard"]["DistributionReport"]
    assert report["consistency"]["mode"] == "async" and report["num_shards"] == 2
    assert report["workers_final"] == {"0": {"exit_code": 0}, "1": {"exit_code": 0}}
    assert not report["warnings"] and sum(s["pushes"] for s in report["shards"]) > 0
    return report


@pytest.mark.timeout(180)
def test_pytorch_ps_cnn_async_on_two_instances(session, digits):
    pytest.importorskip("torch")
    est = shipyard.PyTorch(
        entry_point="ps_cnn.py",
        source_dir=os.path.join(EXAMPLES, "pytorch"),
        instance_count=2,
        instance_type="local",
        metric_definitions=ACC,
        distribution={"parameter_server": {"enabled": True}},
        session=session,
    )
    est.fit({"training": digits}, logs=False)
    check(est)


@pytest.mark.timeout(240)
def test_keras3_ps_cnn_model_fit_on_two_instances(session, digits):
    pytest.importorskip("keras")
    est = shipyard.TensorFlow(
        entry_point="ps_cnn.py",
        source_dir=os.path.join(EXAMPLES, "keras"),
        instance_count=2,
        instance_type="local",
        metric_definitions=ACC,
        distribution={"parameter_server": {"enabled": True, "implementation": "shipyard"}},
        session=session,
    )
    est.fit({"training": digits}, logs=False)
    report = check(est)
    assert report["policy"] in ("round_robin", "greedy_bytes", "sliced")
