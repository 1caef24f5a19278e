"""The Horovod examples run unmodified (``import horovod...``) as shipyard jobs on
2 instances x 2 processes and learn scikit-learn's digits (>= 95% test accuracy)."""

from __future__ import annotations

import os
import sys
import tarfile

import pytest

import shipyard

EXAMPLES = os.path.join(os.path.dirname(__file__), "..", "..", "..", "examples")
sys.path.insert(0, os.path.join(EXAMPLES, "data"))
from make_digits import write_digits

ACC = [{"Name": "test:accuracy", "Regex": r"test_accuracy=([0-9.]+)"}]
MPI_2x2 = {"mpi": {"enabled": True, "processes_per_host": 2}}
pytestmark = pytest.mark.usefixtures("mpirun")


@pytest.fixture(scope="module")
def digits(tmp_path_factory):
    out = tmp_path_factory.mktemp("digits")
    write_digits(str(out))
    return str(out)


def _accuracy(estimator) -> float:
    desc = estimator.latest_training_job.describe()
    return {m["MetricName"]: m["Value"] for m in desc["FinalMetricDataList"]}["test:accuracy"]


@pytest.mark.timeout(240)
def test_pytorch_example(session, digits):
    pytest.importorskip("torch")
    est = shipyard.PyTorch(
        entry_point="pytorch_mnist.py",
        source_dir=os.path.join(EXAMPLES, "horovod"),
        instance_count=2,
        instance_type="local",
        distribution=MPI_2x2,
        hyperparameters={"epochs": 15},
        metric_definitions=ACC,
        session=session,
    )
    est.fit({"training": digits})
    assert _accuracy(est) >= 0.95
    with tarfile.open(est.model_data.removeprefix("file://")) as tar:
        assert tar.getnames() == ["model.pth"]


@pytest.mark.timeout(300)
def test_keras3_example(session, digits):
    pytest.importorskip("keras")
    est = shipyard.TensorFlow(
        entry_point="keras3_mnist.py",
        source_dir=os.path.join(EXAMPLES, "horovod"),
        instance_count=2,
        instance_type="local",
        distribution=MPI_2x2,
        hyperparameters={"epochs": 7},
        metric_definitions=ACC,
        session=session,
    )
    est.fit({"training": digits})
    assert _accuracy(est) >= 0.95
    with tarfile.open(est.model_data.removeprefix("file://")) as tar:
        assert "1/saved_model.pb" in tar.getnames()
