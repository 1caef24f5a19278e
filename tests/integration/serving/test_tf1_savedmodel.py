"""TF1-era SavedModels (issue 16 item 3), as SageMaker's TF Serving examples ship them: a v1 graph
built with tf.compat.v1, a ``serving_default`` predict signature and ``tensorflow/serving/regress``
and ``classify`` signatures over serialized tf.Example. ``tf.saved_model.load`` cannot load them
("Shape must be rank 1 but is rank 0 for ParseExample"); TF Serving serves them, and so must we:
predict, classify and regress as TF Serving's REST API defines them."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from tests.integration.serving.serving_helpers import call, server

pytestmark = [pytest.mark.tensorflow, pytest.mark.timeout(300)]

W = np.array([[1.0], [2.0], [3.0]], np.float32)
B = 0.5


def export_tf1_model(export_dir: str) -> None:
    import tensorflow as tf

    v1 = tf.compat.v1
    sig = v1.saved_model.signature_def_utils
    with tf.Graph().as_default() as graph, v1.Session(graph=graph) as sess:
        w = v1.get_variable("w", initializer=tf.constant(W))
        b = v1.get_variable("b", initializer=tf.constant(B))
        x = v1.placeholder(tf.float32, [None, 3], name="x")
        y = tf.matmul(x, w) + b
        serialized = v1.placeholder(tf.string, name="tf_example")  # rank unknown, as estimators do
        parsed = v1.parse_example(serialized, {"x": v1.FixedLenFeature([3], tf.float32)})
        y_ex = tf.matmul(parsed["x"], w) + b
        scores = tf.nn.softmax(tf.concat([-y_ex, y_ex], axis=1))
        classes = tf.tile(tf.constant([["neg", "pos"]]), [tf.shape(y_ex)[0], 1])
        sess.run(v1.global_variables_initializer())
        builder = v1.saved_model.Builder(export_dir)
        builder.add_meta_graph_and_variables(
            sess,
            [v1.saved_model.tag_constants.SERVING],
            signature_def_map={
                "serving_default": sig.predict_signature_def({"x": x}, {"y": y}),
                "regress": sig.regression_signature_def(serialized, y_ex),
                "classify": sig.classification_signature_def(serialized, classes, scores),
            },
        )
        builder.save()


def export_half_plus_three(export_dir: str, declared: bool) -> None:
    """``y = 0.5 * x + 3`` with an input of no declared shape, like the SageMaker SDK's own
    test model ``half_plus_three``: ``declared=False`` writes its TensorInfo without a
    ``tensor_shape`` at all (what early TF1 exporters wrote; the proto then reads as a
    scalar), ``declared=True`` as today's ``build_tensor_info`` does (unknown rank)."""
    import tensorflow as tf
    from tensorflow.core.framework import types_pb2
    from tensorflow.core.protobuf import meta_graph_pb2

    v1 = tf.compat.v1
    with tf.Graph().as_default() as graph, v1.Session(graph=graph) as sess:
        a = v1.get_variable("a", initializer=tf.constant(0.5))
        b = v1.get_variable("b", initializer=tf.constant(3.0))
        x = v1.placeholder(tf.float32, name="x")  # no shape: any rank
        y = tf.add(a * x, b, name="y")
        sess.run(v1.global_variables_initializer())
        if declared:
            x_info, y_info = (
                v1.saved_model.build_tensor_info(x),
                v1.saved_model.build_tensor_info(y),
            )
        else:
            x_info = meta_graph_pb2.TensorInfo(name=x.name, dtype=types_pb2.DT_FLOAT)
            y_info = meta_graph_pb2.TensorInfo(name=y.name, dtype=types_pb2.DT_FLOAT)
        signature = v1.saved_model.signature_def_utils.build_signature_def(
            {"x": x_info}, {"y": y_info}, v1.saved_model.signature_constants.PREDICT_METHOD_NAME
        )
        builder = v1.saved_model.Builder(export_dir)
        builder.add_meta_graph_and_variables(
            sess, [v1.saved_model.tag_constants.SERVING], {"serving_default": signature}
        )
        builder.save()


def export_sdk_half_plus_three(export_dir: str) -> None:
    """The SageMaker SDK's own TF Serving test model, built as TF Serving's
    ``saved_model_half_plus_two.py`` builds it: ``x`` is an identity over parsed
    tf.Examples, so its signature declares ``[-1, 1]``; TF Serving feeds ``[3]`` to it all
    the same (its C++ session checks no declared shape) and answers three scalars."""
    import tensorflow as tf

    v1 = tf.compat.v1
    with tf.Graph().as_default() as graph, v1.Session(graph=graph) as sess:
        a = v1.get_variable("a", initializer=tf.constant(0.5))
        b = v1.get_variable("b", initializer=tf.constant(3.0))
        serialized = v1.placeholder(tf.string, [None], name="tf_example")
        parsed = v1.parse_example(serialized, {"x": v1.FixedLenFeature([1], tf.float32)})
        x = tf.identity(parsed["x"], name="x")
        y = tf.add(tf.multiply(a, x), b, name="y")
        sess.run(v1.global_variables_initializer())
        x_info, y_info = v1.saved_model.build_tensor_info(x), v1.saved_model.build_tensor_info(y)
        assert [d.size for d in x_info.tensor_shape.dim] == [-1, 1]
        signature = v1.saved_model.signature_def_utils.build_signature_def(
            {"x": x_info}, {"y": y_info}, v1.saved_model.signature_constants.PREDICT_METHOD_NAME
        )
        builder = v1.saved_model.Builder(export_dir)
        builder.add_meta_graph_and_variables(
            sess, [v1.saved_model.tag_constants.SERVING], {"serving_default": signature}
        )
        builder.save()


@pytest.fixture(scope="module")
def addr(tmp_path_factory):
    root = tmp_path_factory.mktemp("tf1models")
    export_tf1_model(os.path.join(str(root), "legacy", "1"))
    export_half_plus_three(os.path.join(str(root), "half_plus_three", "123"), declared=False)
    export_half_plus_three(os.path.join(str(root), "any_shape", "1"), declared=True)
    export_sdk_half_plus_three(os.path.join(str(root), "sdk_half_plus_three", "1"))
    with server(str(root), str(tmp_path_factory.mktemp("srv"))) as a:
        yield a


ROWS = [[1.0, 1.0, 1.0], [0.0, 0.0, 1.0]]
WANT = (np.array(ROWS, np.float32) @ W + B).reshape(-1)  # 6.5, 3.5


def test_predict_on_serving_default(addr):
    status, _, body = call(addr, "POST", "/v1/models/legacy:predict", {"instances": ROWS})
    assert status == 200, body
    np.testing.assert_allclose(np.asarray(json.loads(body)["predictions"]).reshape(-1), WANT)
    status, _, body = call(addr, "POST", "/v1/models/legacy/versions/1:predict", {"inputs": ROWS})
    assert status == 200, body
    np.testing.assert_allclose(np.asarray(json.loads(body)["outputs"]).reshape(-1), WANT)


def test_regress_over_tf_example(addr):
    req = {"signature_name": "regress", "examples": [{"x": r} for r in ROWS]}
    status, _, body = call(addr, "POST", "/v1/models/legacy:regress", req)
    assert status == 200, body
    np.testing.assert_allclose(json.loads(body)["result"], WANT)
    # a feature shared by every example goes in "context"
    req = {"signature_name": "regress", "context": {"x": ROWS[1]}, "examples": [{}, {}]}
    status, _, body = call(addr, "POST", "/v1/models/legacy:regress", req)
    assert status == 200, body
    np.testing.assert_allclose(json.loads(body)["result"], [WANT[1], WANT[1]])


def test_classify_over_tf_example(addr):
    req = {"signature_name": "classify", "examples": [{"x": r} for r in ROWS]}
    status, _, body = call(addr, "POST", "/v1/models/legacy:classify", req)
    assert status == 200, body
    result = json.loads(body)["result"]
    assert [[label for label, _ in row] for row in result] == [["neg", "pos"]] * 2
    pos = 1 / (1 + np.exp(-2 * WANT))
    np.testing.assert_allclose([row[1][1] for row in result], pos, rtol=1e-5)


def test_bad_example_is_a_400_not_a_crash(addr):
    req = {"signature_name": "regress", "examples": [{"x": [1.0, 2.0]}]}  # 2 values, 3 wanted
    status, _, body = call(addr, "POST", "/v1/models/legacy:regress", req)
    assert status == 400, body
    assert "error" in json.loads(body)
    status, _, _ = call(addr, "POST", "/v1/models/legacy:predict", {"instances": ROWS})
    assert status == 200


def test_tf1_models_take_the_session_loader_and_so_does_a_tf2_load_failure(tmp_path, monkeypatch):
    import tensorflow as tf

    from shipyard.serving import servables

    path = str(tmp_path / "m" / "1")
    export_tf1_model(path)
    assert servables.is_tf1_saved_model(path)
    model = servables.load_tf("m", 1, path)
    assert isinstance(model, servables.TF1Servable)
    assert model.signatures["regress"].method == servables.REGRESS_METHOD
    out = model.run("regress", {"inputs": servables.tf_examples([{"x": r} for r in ROWS])})
    np.testing.assert_allclose(out["outputs"].reshape(-1), WANT)

    # whatever the TF2 loader cannot load ("Shape must be rank 1 but is rank 0 for
    # ParseExample" on some TF1 exports) goes to the session loader, as TF Serving would
    def fail(*_a, **_k):
        raise ValueError("Shape must be rank 1 but is rank 0 for 'ParseExample'")

    monkeypatch.setattr(servables, "is_tf1_saved_model", lambda _p: False)
    monkeypatch.setattr(tf.saved_model, "load", fail)
    assert isinstance(servables.load_tf("m", 1, path), servables.TF1Servable)


@pytest.mark.parametrize("model", ["half_plus_three", "any_shape"])
def test_an_input_of_no_declared_shape_takes_any_shape(addr, model):
    """Issue 28: served as a scalar, {"instances": [1.0, 2.0, 5.0]} answered "shape [3] does
    not match; expected {x: float32[]}"."""
    status, _, body = call(
        addr, "POST", f"/v1/models/{model}:predict", {"instances": [1.0, 2.0, 5.0]}
    )
    assert status == 200, body
    assert json.loads(body) == {"predictions": [3.5, 4.0, 5.5]}
    status, _, body = call(addr, "POST", f"/v1/models/{model}:predict", {"inputs": [[1.0], [3.0]]})
    assert status == 200, body
    assert json.loads(body) == {"outputs": [[3.5], [4.5]]}
    status, _, body = call(addr, "POST", f"/v1/models/{model}:predict", {"instances": 2.0})
    assert status == 400 and "non-empty list" in json.loads(body)["error"], body


def test_a_declared_shape_is_fed_as_tf_serving_feeds_it(addr):
    """Issue 38: ``x`` declared ``[-1, 1]`` refused ``{"instances": [1.0, 2.0, 5.0]}`` with
    "shape [3] does not match"; TF Serving answers ``[3.5, 4.0, 5.5]``. The declared shape
    itself still takes ``[[1.0], [3.0]]``, and what the graph cannot compute is a 400."""
    model = "/v1/models/sdk_half_plus_three:predict"
    status, _, body = call(addr, "POST", model, {"instances": [1.0, 2.0, 5.0]})
    assert status == 200, body
    assert json.loads(body) == {"predictions": [3.5, 4.0, 5.5]}
    status, _, body = call(addr, "POST", model, {"instances": [[1.0], [3.0]]})
    assert status == 200, body
    assert json.loads(body) == {"predictions": [[3.5], [4.5]]}
    status, _, body = call(addr, "POST", model, {"instances": ["a", "b"]})
    assert status == 400, body
