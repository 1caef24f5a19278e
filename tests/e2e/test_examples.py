"""The examples train for real on scikit-learn's digits, single and multi instance."""

from __future__ import annotations

import os
import sys
import tarfile

import pytest

import shipyard

EXAMPLES = os.path.join(os.path.dirname(__file__), "..", "..", "examples")
sys.path.insert(0, os.path.join(EXAMPLES, "data"))
from make_digits import write_digits  # noqa: E402

ACC = [{"Name": "test:accuracy", "Regex": r"test_accuracy=([0-9.]+)"}]


@pytest.fixture(scope="module")
def digits(tmp_path_factory):
    out = tmp_path_factory.mktemp("digits")
    write_digits(str(out))
    return str(out)


def accuracy(estimator) -> float:
    metrics = estimator.latest_training_job.describe()["FinalMetricDataList"]
    return {m["MetricName"]: m["Value"] for m in metrics}["test:accuracy"]


@pytest.mark.parametrize("count", [1, 2])
def test_pytorch_digits(session, digits, count):
    pytest.importorskip("torch")
    est = shipyard.PyTorch(
        entry_point="digits_classifier.py",
        source_dir=os.path.join(EXAMPLES, "pytorch"),
        instance_count=count,
        instance_type="local",
        hyperparameters={"epochs": 12},
        metric_definitions=ACC,
        session=session,
    )
    est.fit({"training": digits})
    assert accuracy(est) >= 0.95
    with tarfile.open(est.model_data.removeprefix("file://")) as tar:
        assert tar.getnames() == ["model.pth"]


def test_keras_digits_two_instances(session, digits):
    pytest.importorskip("keras")
    est = shipyard.TensorFlow(
        entry_point="digits_classifier.py",
        source_dir=os.path.join(EXAMPLES, "keras"),
        instance_count=2,
        instance_type="local",
        hyperparameters={"epochs": 12},
        metric_definitions=ACC,
        session=session,
    )
    est.fit({"training": digits})
    assert accuracy(est) >= 0.95
    with tarfile.open(est.model_data.removeprefix("file://")) as tar:
        assert "1/saved_model.pb" in tar.getnames()
