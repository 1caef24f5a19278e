"""TFServable's direct call (one eager execute of the signature's function) gives what
the signature call gives, input and output order included, and steps aside when it
cannot be checked or fails."""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.tensorflow


@pytest.fixture(scope="module")
def two_in_two_out(tmp_path_factory):
    import tensorflow as tf

    class M(tf.Module):
        def __init__(self) -> None:
            super().__init__()
            self.scale = tf.Variable([2.0, 3.0])

        @tf.function(
            input_signature=[
                tf.TensorSpec([None, 2], tf.float32, name="zeta"),
                tf.TensorSpec([None, 2], tf.float32, name="alpha"),
                tf.TensorSpec([None], tf.string, name="label"),
            ]
        )
        def serve(self, zeta, alpha, label):
            return {
                "sum": (alpha + zeta) * self.scale,
                "diff": alpha - zeta,
                "label_len": tf.strings.length(label),
            }

        @tf.function(
            input_signature=[
                tf.TensorSpec([None, 2], tf.float32, name="b"),
                tf.TensorSpec([None, 2], tf.float32, name="a"),
            ]
        )
        def numeric(self, b, a):
            return {"z_first": a - b, "a_second": a * 10 + b}

    path = str(tmp_path_factory.mktemp("m") / "1")
    m = M()
    tf.saved_model.save(m, path, signatures={"serving_default": m.serve, "numeric": m.numeric})
    return path


def test_direct_call_matches_the_signature_call(two_in_two_out):
    from shipyard.serving.servables import TFServable

    sv = TFServable("m", 1, two_in_two_out)
    assert "numeric" in sv._direct  # numeric inputs of fixed rank: checked and in use
    assert "serving_default" not in sv._direct  # a string input: the plain call
    a = np.array([[1.0, 2.0], [3.0, 4.0]], np.float32)
    b = np.array([[0.5, 0.25], [1.0, 1.5]], np.float32)
    direct = sv.run("numeric", {"a": a, "b": b})
    plain = sv._call("numeric", {"a": a, "b": b})
    assert set(direct) == {"z_first", "a_second"}
    for k in plain:
        np.testing.assert_array_equal(direct[k], plain[k])
    np.testing.assert_array_equal(direct["z_first"], a - b)
    np.testing.assert_array_equal(direct["a_second"], a * 10 + b)
    out = sv.run(
        "serving_default", {"zeta": b, "alpha": a, "label": np.array([b"x", b"abc"], object)}
    )
    np.testing.assert_array_equal(out["label_len"], [1, 3])


def test_a_failing_direct_call_falls_back_to_the_plain_call_and_its_error(two_in_two_out):
    from shipyard.serving.errors import BadRequest
    from shipyard.serving.servables import TFServable

    sv = TFServable("m", 1, two_in_two_out)
    good = np.ones((1, 2), np.float32)
    with pytest.raises(BadRequest, match="expected signature 'numeric'"):
        sv.run("numeric", {"a": np.ones((1, 3), np.float32), "b": good})  # wrong width
