"""The workshop's data-parallel notebook cell with the real ``sagemaker`` SDK against
``shipyard server`` (issue 28): the TensorFlow estimator at framework_version 2.4.1 with
``distribution={'smdistributed': {'dataparallel': {'enabled': True}}}`` on 2 instances of a
type the SDK accepts for it. CreateTrainingJob used to refuse it ("SageMaker dropped
TensorFlow support..."); the script's ranks now train with identical weights."""

from __future__ import annotations

import os
import shutil

import pytest

from tests.integration.ddp.test_smddp_tensorflow import HERE, assert_trained_identically, ranks_of

pytestmark = [pytest.mark.tensorflow, pytest.mark.slow]
# the workshop's framework_version='2.4.1' would build TensorFlow 2.13.1 (Keras 2); this module
# tests the smdistributed.dataparallel shim through the server on the installed TensorFlow
# (tests/integration/environments runs it on 2.13.1, the suite's one framework environment)
SERVER_ENV = {"SHIPYARD_FRAMEWORK_ENVS": "off"}


@pytest.mark.timeout(400)
def test_smddp_tensorflow_notebook_cell_trains(server, fast_polls, capsys, tmp_path):
    pytest.importorskip("mpi4py")
    src = tmp_path / "code"
    src.mkdir()
    shutil.copy(os.path.join(HERE, "smddp_tf2_train.py"), src / "train.py")

    # -- the notebook's own lines ---------------------------------------------------------
    import sagemaker
    from sagemaker.tensorflow import TensorFlow

    role = sagemaker.get_execution_role()
    estimator = TensorFlow(
        entry_point="train.py",
        source_dir=str(src),
        role=role,
        framework_version="2.4.1",
        py_version="py37",
        instance_count=2,
        instance_type="ml.p3.16xlarge",  # the SDK accepts only SMDDP's instance types
        distribution={"smdistributed": {"dataparallel": {"enabled": True}}},
        environment={"TF_CPP_MIN_LOG_LEVEL": "3", "OMP_NUM_THREADS": "1", "STEPS": "20"},
    )
    estimator.fit(logs=True)
    # ---------------------------------------------------------------------------------------
    streamed = capsys.readouterr().out
    assert "Completed - Training job completed" in streamed
    job = estimator.latest_training_job.name
    records, weights = ranks_of(os.path.join(server.home, "jobs", job), ["algo-1", "algo-2"])
    # no GPUs here: one rank per instance (SageMaker's rule is one per GPU)
    assert sorted(records) == [0, 1]
    assert [records[r]["host"] for r in (0, 1)] == ["algo-1", "algo-2"]
    assert_trained_identically(records, weights)
