"""A TensorFlow 1.x parameter_server job whose script placed nothing on a ps (the
tf-distribution-options notebook's train_ps.py: a Keras ``fit`` at 1.13, which reads no
TF_CONFIG) is told what TF 1.x offers, not TF 2's ParameterServerStrategy or tf_keras,
which it does not have (issue 38)."""

from __future__ import annotations

from shipyard.tf import report


def _warning(tensorflow):
    placement = {"variables": [{"name": "w:0", "ps_task": None}], "tensorflow": tensorflow}
    built = report.build(placement, ["a:1", "b:1"], ["algo-1", "algo-2"], [None, None], "sagemaker")
    return built["warnings"][0]


def test_tf1_gets_replica_device_setter_and_estimator_advice():
    said = _warning("1.13.2")
    assert "every instance ran the script and trained its own copy" in said
    assert "TensorFlow 1.x's Keras fit reads no TF_CONFIG" in said
    assert "tf.train.replica_device_setter" in said and "train_and_evaluate" in said
    assert "ParameterServerStrategy" not in said and "tf_keras" not in said


def test_tf2_and_an_unknown_release_keep_the_strategy_advice():
    for tensorflow in ("2.13.1", None):
        said = _warning(tensorflow)
        assert "tf.distribute.ParameterServerStrategy" in said
        assert "TensorFlow 1.x's Keras fit" not in said
