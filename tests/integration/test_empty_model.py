"""Jobs that "succeed" with nothing (issue 16 item 6): an empty model directory is said in the job
log and in describe; a legacy-mode TensorFlow script (functions only, nothing that runs) is
refused at fit() naming legacy mode, before anything starts."""

from __future__ import annotations

import os

import pytest

import shipyard
from shipyard.errors import ValidationError

NOTHING_SAVED = """
import os
print("trained, but saved nothing to", os.environ["SM_MODEL_DIR"])
"""

SAVES = """
import os
with open(os.path.join(os.environ["SM_MODEL_DIR"], "weights.txt"), "w") as fh:
    fh.write("1.0")
"""

# The shape of SageMaker's TF <= 1.11 "legacy mode" examples: the container called these.
LEGACY = '''
"""Legacy-mode CIFAR-10 Keras script."""
import os
import tensorflow as tf

INPUT_TENSOR_NAME = "inputs_input"
tf.logging.set_verbosity(tf.logging.INFO)


def keras_model_fn(hyperparameters):
    model = tf.keras.models.Sequential()
    model.add(tf.keras.layers.Dense(10, input_shape=(32,)))
    model.compile(loss="categorical_crossentropy", optimizer="sgd")
    return model


def serving_input_fn(hyperparameters):
    return None


def train_input_fn(training_dir, hyperparameters):
    return _input(training_dir)


def _input(directory):
    return None
'''


def log_text(desc: dict) -> str:
    out = []
    for inst in desc["Shipyard"]["Instances"]:
        with open(inst["LogPath"], errors="replace") as fh:
            out.append(fh.read())
    return "\n".join(out)


def test_an_empty_model_is_said_in_the_job_log_and_describe(session, write_script, capsys):
    src = write_script("train.py", NOTHING_SAVED)
    est = shipyard.Estimator(
        entry_point="train.py",
        source_dir=src,
        instance_count=2,
        instance_type="local",
        session=session,
        distribution={"mpi": {"enabled": True}},
    )
    est.fit(job_name="empty-model")
    desc = est.latest_training_job.describe()
    assert desc["TrainingJobStatus"] == "Completed"
    warnings = desc["Shipyard"]["Warnings"]
    assert len(warnings) == 1 and "No model artifact was saved" in warnings[0], warnings
    assert "SM_MODEL_DIR" in warnings[0]
    assert "No model artifact was saved" in log_text(desc)
    assert "No model artifact was saved" in capsys.readouterr().out


def test_a_saved_model_gives_no_warning(session, write_script):
    src = write_script("train.py", SAVES)
    est = shipyard.Estimator(
        entry_point="train.py",
        source_dir=src,
        instance_count=1,
        instance_type="local",
        session=session,
    )
    est.fit(job_name="saved-model")
    desc = est.latest_training_job.describe()
    assert desc["Shipyard"]["Warnings"] == []
    assert "No model artifact" not in log_text(desc)


def test_a_legacy_mode_script_is_refused_naming_legacy_mode(session, write_script, home):
    src = write_script("cifar10_keras.py", LEGACY)
    est = shipyard.TensorFlow(
        entry_point="cifar10_keras.py",
        source_dir=src,
        instance_count=2,
        instance_type="local",
        session=session,
        distribution={"mpi": {"enabled": True}},
    )
    with pytest.raises(ValidationError, match="legacy mode") as err:
        est.fit(job_name="legacy")
    assert "keras_model_fn" in str(err.value) and "train_input_fn" in str(err.value)
    assert "__main__" in str(err.value)
    assert session.control.list() == []
    assert not os.path.exists(os.path.join(str(home), "jobs", "legacy"))


@pytest.mark.parametrize(
    "tail",
    [
        "\nif __name__ == '__main__':\n    keras_model_fn({}).fit()\n",
        "\nkeras_model_fn({})\n",
    ],
)
def test_a_script_with_legacy_names_and_entry_code_is_not_legacy(tail):
    from shipyard.control import legacy_mode

    assert legacy_mode.legacy_functions(LEGACY) == [
        "keras_model_fn",
        "train_input_fn",
        "serving_input_fn",
    ]
    assert legacy_mode.legacy_functions(LEGACY + tail) == []
