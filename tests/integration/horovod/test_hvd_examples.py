"""The Horovod examples run unmodified (``import horovod...``) as shipyard jobs on
2 instances and learn scikit-learn's digits (>= 95% test accuracy).

The PyTorch example runs 2 instances x 2 processes (the layout: ranks per host and across
hosts). The Keras 3 example runs 2 instances x 1 process: what it adds is TensorFlow and
Keras under the mpi runner across instances, the shim's ``horovod.tensorflow.keras`` and the
SavedModel export; two TensorFlow ranks on one host are test_hvd_keras' jobs. Each Keras
rank imports TensorFlow and Keras (~8 s of CPU), so 2 ranks where 4 were halve that."""

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
MPI_2x1 = {"mpi": {"enabled": True, "processes_per_host": 1}}
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
        distribution=MPI_2x1,
        # the same 7 epochs (the ranks' steps are deterministic: 0.9944 here, 0.9583 at 5)
        hyperparameters={"epochs": 7},
        metric_definitions=ACC,
        session=session,
    )
    est.fit({"training": digits})
    assert _accuracy(est) >= 0.95
    job_dir = est.latest_training_job.describe()["Shipyard"]["JobDir"]
    with open(os.path.join(job_dir, "logs", "algo-1.log")) as fh:
        assert "[algo-2 rank 1]" in fh.read()  # the second rank ran on the other instance
    with tarfile.open(est.model_data.removeprefix("file://")) as tar:
        assert "1/saved_model.pb" in tar.getnames()
