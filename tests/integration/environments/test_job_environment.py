"""A TF 2.4-era Keras script (``Adam(lr=...)``, ``metric.reset_states()``,
``optimizer.variables()``) asking for ``framework_version='2.4.1'`` completes in a framework
environment (the default, SHIPYARD_FRAMEWORK_ENVS=auto): no TF 2.4.1 wheel exists for this
Python, so it runs on the nearest Keras 2 release the registry has (2.13.1), and the job log
says so. Builds a real TensorFlow environment with uv from the registry, as the job's first
phase: the suite's one real framework build, shared by this module's tests through one
SHIPYARD_ENVIRONMENTS_DIR (and cached by uv after the first run on a machine)."""

from __future__ import annotations

import pytest

import shipyard

pytest.importorskip("uv")
pytestmark = [pytest.mark.tensorflow, pytest.mark.slow, pytest.mark.timeout(900)]


@pytest.fixture(scope="module")
def shared_envs(tmp_path_factory):
    """One environments directory for the module: TensorFlow 2.13.1 is built once."""
    return str(tmp_path_factory.mktemp("framework-envs"))


KERAS2_SCRIPT = r"""
import numpy as np
import tensorflow as tf

print("tensorflow", tf.__version__, flush=True)
model = tf.keras.Sequential([tf.keras.layers.Dense(4, input_shape=(3,)), tf.keras.layers.Dense(1)])
opt = tf.keras.optimizers.Adam(lr=0.01)                 # Keras 3: "Argument(s) not recognized"
model.compile(optimizer=opt, loss="mse")
x = np.random.default_rng(0).normal(size=(64, 3)).astype("float32")
model.fit(x, x.sum(axis=1), epochs=2, verbose=0)
metric = tf.keras.metrics.Mean()
metric.update_state([1.0, 2.0])
metric.reset_states()                                   # Keras 3: no reset_states
print("optimizer variables", len(opt.variables()), flush=True)  # Keras 3: a list, not callable
print("KERAS2 OK", flush=True)
"""


def test_a_keras_2_script_asking_for_2_4_1_runs_on_the_nearest_keras_2_release(
    session, write_script, monkeypatch, capsys, caplog, shared_envs
):
    import logging

    monkeypatch.delenv("SHIPYARD_FRAMEWORK_ENVS", raising=False)  # the default: auto
    monkeypatch.setenv("SHIPYARD_ENVIRONMENTS_DIR", shared_envs)
    est = shipyard.TensorFlow(
        entry_point="train.py",
        source_dir=write_script("train.py", KERAS2_SCRIPT),
        instance_count=1,
        instance_type="local",
        framework_version="2.4.1",
        py_version="py37",
        environment={"TF_CPP_MIN_LOG_LEVEL": "3"},
        session=session,
    )
    with caplog.at_level(logging.INFO, logger="shipyard"):
        est.fit(job_name="keras2-on-2-13")
    desc = est.latest_training_job.describe()
    assert desc["TrainingJobStatus"] == "Completed", desc.get("FailureReason")
    out, _ = capsys.readouterr()
    assert "tensorflow 2.13.1" in out and "KERAS2 OK" in out
    said = "\n".join(r.getMessage() for r in caplog.records)
    env = desc["Shipyard"]["FrameworkEnvironment"]
    assert (env["Asked"], env["Version"], env["Exact"]) == ("2.4.1", "2.13.1", False)
    assert "Keras 2 as tf.keras" in env["Note"] and env["Python"].endswith("/bin/python")
    assert env["Python"].startswith(shared_envs)
    assert "the job's processes run in the framework environment" in out
    assert "framework_version '2.4.1' (tensorflow): its environment is prepared" in said
    assert "no tensorflow-cpu 2.4.1 for Python 3.11" in out
    assert "running TensorFlow 2.13.1, the nearest with the same API generation" in out
    phase = [
        t["StatusMessage"]
        for t in desc["SecondaryStatusTransitions"]
        if t["Status"] == "Downloading" and "tensorflow-cpu==2.13.1" in t["StatusMessage"]
    ]
    assert phase, desc["SecondaryStatusTransitions"]


def test_a_job_failing_on_a_substituted_version_names_the_version_that_ran(
    session, write_script, monkeypatch, shared_envs
):
    """The FailureReason, what most users read, names the version that ran (2.13.1, the
    environment the first test built) beside the one the notebook asked for."""
    from shipyard.errors import JobFailedError

    monkeypatch.delenv("SHIPYARD_FRAMEWORK_ENVS", raising=False)
    monkeypatch.setenv("SHIPYARD_ENVIRONMENTS_DIR", shared_envs)
    est = shipyard.TensorFlow(
        entry_point="train.py",
        source_dir=write_script("train.py", "raise SystemExit('fails on purpose')\n"),
        instance_count=1,
        instance_type="local",
        framework_version="2.4.1",
        py_version="py37",
        session=session,
    )
    with pytest.raises(JobFailedError):
        est.fit(job_name="fails-on-2-13")
    reason = est.latest_training_job.describe()["FailureReason"]
    assert "fails on purpose" in reason
    assert "Framework: tensorflow 2.13.1 ran, not the asked framework_version '2.4.1'" in reason


def test_the_same_script_on_the_installed_keras_3_fails_naming_the_api_difference(
    session, write_script, monkeypatch
):
    from shipyard.errors import JobFailedError

    monkeypatch.delenv("SHIPYARD_FRAMEWORK_ENVS", raising=False)  # nothing asked: installed
    est = shipyard.TensorFlow(
        entry_point="train.py",
        source_dir=write_script("train.py", KERAS2_SCRIPT),
        instance_count=1,
        instance_type="local",
        environment={"TF_CPP_MIN_LOG_LEVEL": "3"},
        session=session,
    )
    with pytest.raises(JobFailedError):
        est.fit(job_name="keras2-on-keras3")
    reason = est.latest_training_job.describe()["FailureReason"]
    assert "Argument(s) not recognized: {'lr': 0.01}" in reason
    assert "Keras 3 (TensorFlow 2.16+) optimizers take learning_rate=, not Keras 2's lr=" in reason


def test_shipyards_in_instance_parts_run_at_the_low_end_of_the_range(
    session, tmp_path, monkeypatch, shared_envs
):
    """TensorFlow 2.13 (Keras 2), the supported range's low end: the mpi runner, the
    horovod engine and the smdistributed.dataparallel.tensorflow shim run there (the high
    end, 2.21, is what every other test runs)."""
    from tests.integration.ddp.test_smddp_tensorflow import (
        _source,
        assert_trained_identically,
        ranks_of,
    )

    pytest.importorskip("mpi4py")
    monkeypatch.delenv("SHIPYARD_FRAMEWORK_ENVS", raising=False)  # the default: auto
    monkeypatch.setenv("SHIPYARD_ENVIRONMENTS_DIR", shared_envs)
    est = shipyard.TensorFlow(
        entry_point="train.py",
        source_dir=_source(tmp_path),
        instance_count=2,
        instance_type="local",
        framework_version="2.4.1",
        distribution={"smdistributed": {"dataparallel": {"enabled": True}}},
        environment={"TF_CPP_MIN_LOG_LEVEL": "3", "OMP_NUM_THREADS": "1", "STEPS": "20"},
        session=session,
    )
    est.fit(job_name="smddp-on-2-13")
    desc = est.latest_training_job.describe()
    assert desc["TrainingJobStatus"] == "Completed", desc.get("FailureReason")
    records, weights = ranks_of(desc["Shipyard"]["JobDir"], ["algo-1", "algo-2"])
    assert sorted(records) == [0, 1]
    assert {(r["tensorflow"], r["keras"]) for r in records.values()} == {
        ("2.13.1", "keras.api._v2.keras")
    }
    assert_trained_identically(records, weights)
