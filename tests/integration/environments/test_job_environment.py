"""A TF 2.4-era Keras script (``Adam(lr=...)``, ``metric.reset_states()``,
``optimizer.variables()``) asking for ``framework_version='2.4.1'`` completes in a framework
environment (the default, SHIPYARD_FRAMEWORK_ENVS=auto): no TF 2.4.1 wheel exists for this
Python, so it runs on the nearest Keras 2 release the registry has (2.13.1), and the job log
says so. Builds a real TensorFlow environment with uv from the registry, as the job's first
phase: the suite's one real framework build, shared by this module's tests through one
SHIPYARD_ENVIRONMENTS_DIR (and cached by uv after the first run on a machine)."""

from __future__ import annotations

import os
import sys

import pytest

import shipyard

pytest.importorskip("uv")
pytestmark = [pytest.mark.tensorflow, pytest.mark.slow, pytest.mark.timeout(900)]


@pytest.fixture(scope="module")
def shared_envs(tmp_path_factory):
    """One environments directory for the module: TensorFlow 2.13.1 is built once."""
    return str(tmp_path_factory.mktemp("framework-envs"))


KERAS2_SCRIPT = r"""
import sys

import numpy as np
import tensorflow as tf

print("tensorflow", tf.__version__, "python", sys.version.split()[0], flush=True)
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


@pytest.fixture
def no_other_pythons(monkeypatch, tmp_path):
    """A machine with shipyard's Python only: no pyenv versions, no uv-managed Pythons,
    no ``pythonX.Y`` on PATH but the system's (which has none of 3.6-3.10 here)."""
    empty = tmp_path / "no-pythons"
    empty.mkdir()
    monkeypatch.setenv("PYENV_ROOT", str(empty))
    monkeypatch.setenv("UV_PYTHON_INSTALL_DIR", str(empty))
    monkeypatch.setenv("PATH", f"{os.path.dirname(sys.executable)}:/usr/sbin:/usr/bin:/sbin:/bin")
    from shipyard.environments import interpreters

    assert set(interpreters.available()) - {interpreters.this_python()} <= {"3.11"}


# the workshop's optimizer: `decay` was refused by Keras' optimizers from TensorFlow 2.11 on
# ("decay is deprecated in the new Keras optimizer"), so only 2.4.1 itself runs it
KERAS24_SCRIPT = KERAS2_SCRIPT.replace("Adam(lr=0.01)", "Adam(lr=0.001, decay=1e-6)")


def test_a_keras_2_script_asking_for_2_4_1_runs_on_tensorflow_2_4_1_in_python_3_7(
    session, write_script, monkeypatch, capsys, caplog, shared_envs, python_3_7
):
    """The TF 2.4 workshop's script (``Adam(lr=...)``, py_version='py37') on the very
    version it asks for, in the Python its py_version names (SageMaker's 2.4.1 image is
    py37): TensorFlow 2.4.1 has no wheel for this Python, and pyenv's 3.7 is here."""
    import logging

    monkeypatch.delenv("SHIPYARD_FRAMEWORK_ENVS", raising=False)  # the default: auto
    monkeypatch.setenv("SHIPYARD_ENVIRONMENTS_DIR", shared_envs)
    est = shipyard.TensorFlow(
        entry_point="train.py",
        source_dir=write_script("train.py", KERAS24_SCRIPT),
        instance_count=1,
        instance_type="local",
        framework_version="2.4.1",
        py_version="py37",
        environment={"TF_CPP_MIN_LOG_LEVEL": "3"},
        session=session,
    )
    with caplog.at_level(logging.INFO, logger="shipyard"):
        est.fit(job_name="keras2-on-2-4-1")
    desc = est.latest_training_job.describe()
    assert desc["TrainingJobStatus"] == "Completed", desc.get("FailureReason")
    out, _ = capsys.readouterr()
    assert "tensorflow 2.4.1 python 3.7." in out and "KERAS2 OK" in out
    said = "\n".join(r.getMessage() for r in caplog.records)
    env = desc["Shipyard"]["FrameworkEnvironment"]
    assert (env["Asked"], env["Version"], env["Exact"], env["PythonVersion"]) == (
        "2.4.1",
        "2.4.1",
        True,
        "3.7",
    )
    assert env["Python"].startswith(shared_envs) and env["Python"].endswith("/bin/python")
    assert "framework_version '2.4.1' (tensorflow): its environment is prepared" in said
    assert "tensorflow-cpu 2.4.1 has no wheel for Python 3.11; running it in Python 3.7" in out
    phase = [
        t["StatusMessage"]
        for t in desc["SecondaryStatusTransitions"]
        if t["Status"] == "Downloading" and "tensorflow-cpu==2.4.1" in t["StatusMessage"]
    ]
    assert phase, desc["SecondaryStatusTransitions"]


TF1_SCRIPT = r"""
import sys
import tensorflow as tf

tf.logging.set_verbosity(tf.logging.INFO)                  # TensorFlow 1 only
x = tf.placeholder(tf.float32, [None, 1])
y = tf.matmul(x, tf.Variable([[2.0]]))
with tf.Session() as sess:
    sess.run(tf.global_variables_initializer())
    print("tensorflow", tf.__version__, "python", sys.version.split()[0], sess.run(y, {x: [[3.0]]}))
model = tf.keras.Sequential([tf.keras.layers.Dense(1, input_shape=(1,))])
model.compile(optimizer="sgd", loss="mse")
tf.contrib.saved_model.save_keras_model(model, "/opt/ml/model/export")  # the tutorial's export
print("TF1 OK", flush=True)
"""


def test_a_tensorflow_1_script_runs_on_tensorflow_1_13_in_python_3_7(
    session, write_script, monkeypatch, capsys, shared_envs, python_3_7
):
    """The tf-distribution-options notebook's framework_version='1.13': tf.logging, sessions
    and tf.contrib run on TensorFlow 1.13 (published as ``tensorflow``) in Python 3.7."""
    monkeypatch.delenv("SHIPYARD_FRAMEWORK_ENVS", raising=False)
    monkeypatch.setenv("SHIPYARD_ENVIRONMENTS_DIR", shared_envs)
    est = shipyard.TensorFlow(
        entry_point="train.py",
        source_dir=write_script("train.py", TF1_SCRIPT),
        instance_count=1,
        instance_type="local",
        framework_version="1.13",
        py_version="py3",
        environment={"TF_CPP_MIN_LOG_LEVEL": "3"},
        session=session,
    )
    est.fit(job_name="tf1-13")
    desc = est.latest_training_job.describe()
    assert desc["TrainingJobStatus"] == "Completed", desc.get("FailureReason")
    out, _ = capsys.readouterr()
    assert "tensorflow 1.13." in out and "python 3.7." in out and "TF1 OK" in out
    env = desc["Shipyard"]["FrameworkEnvironment"]
    assert env["Version"].startswith("1.13.") and env["PythonVersion"] == "3.7"


def test_with_no_python_for_2_4_1_the_script_runs_on_the_nearest_keras_2_release(
    session, write_script, monkeypatch, capsys, shared_envs, no_other_pythons
):
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
    est.fit(job_name="keras2-on-2-13")
    desc = est.latest_training_job.describe()
    assert desc["TrainingJobStatus"] == "Completed", desc.get("FailureReason")
    out, _ = capsys.readouterr()
    assert "tensorflow 2.13.1" in out and "KERAS2 OK" in out
    env = desc["Shipyard"]["FrameworkEnvironment"]
    assert (env["Asked"], env["Version"], env["Exact"]) == ("2.4.1", "2.13.1", False)
    assert "Keras 2 as tf.keras" in env["Note"] and env["Python"].endswith("/bin/python")
    assert env["Python"].startswith(shared_envs)
    assert "the job's processes run in the framework environment" in out
    assert "no tensorflow-cpu 2.4.1 for Python 3.11" in out
    assert "running TensorFlow 2.13.1, the nearest with the same API generation" in out


def test_a_job_failing_on_a_substituted_version_names_the_version_that_ran(
    session, write_script, monkeypatch, shared_envs, no_other_pythons
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
    session, tmp_path, monkeypatch, shared_envs, no_other_pythons
):
    """TensorFlow 2.13 (Keras 2), the supported range's low end in shipyard's own Python:
    the mpi runner, the horovod engine and the smdistributed.dataparallel.tensorflow shim
    run there (the high end, 2.21, is what every other test runs). The data-parallel
    library's TensorFlow client takes 2.3-2.11, so the job asks for 2.4.1, which with no
    other Python here runs on 2.13.1."""
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
