"""inference.py contracts on real servers: the PyTorch/generic model_fn, input_fn,
predict_fn, output_fn trio and transform_fn; the TF container's handler(data, context)
calling TF Serving through context.rest_uri."""

from __future__ import annotations

import json
import os
import shutil
import textwrap

import numpy as np
import pytest

from tests.integration.serving.serving_helpers import (
    call,
    export_tf_models,
    server,
    torchscript_archive,
)

pytestmark = pytest.mark.timeout(300)

TRIO = """
import json
import numpy as np

def model_fn(model_dir):
    return {"scale": float(open(model_dir + "/scale.txt").read())}

def input_fn(body, content_type):
    if content_type == "application/x-nested":
        return np.array(json.loads(body))
    if content_type != "text/plain":
        raise ValueError("send text/plain")
    return np.array([float(v) for v in body.decode().split()])

def predict_fn(data, model):
    return data * model["scale"]

def output_fn(prediction, accept):
    return json.dumps({"scaled": prediction.tolist(), "accept": accept}), "application/json"
"""

TRANSFORM = """
def model_fn(model_dir):
    return "model-object"

def transform_fn(model, body, content_type, accept):
    return body.decode()[::-1] + "|" + model + "|" + content_type, "text/plain"
"""


def _model_dir(root, files: dict[str, str]) -> str:
    for name, text in files.items():
        path = os.path.join(root, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as fh:
            fh.write(textwrap.dedent(text))
    return str(root)


def test_python_trio_and_transform_fn(tmp_path):
    trio = _model_dir(tmp_path / "trio", {"scale.txt": "2.5", "code/inference.py": TRIO})
    with server(trio, str(tmp_path), "--framework", "python") as addr:
        status, ctype, body = call(
            addr, "POST", "/invocations", "1 2 4", {"Content-Type": "text/plain", "Accept": "*/*"}
        )
        assert status == 200 and ctype == "application/json"
        assert json.loads(body) == {"scaled": [2.5, 5.0, 10.0], "accept": "application/json"}
        # the user's exception is a 500 with its message only
        status, _, body = call(
            addr, "POST", "/invocations", "1", {"Content-Type": "application/json"}
        )
        assert status == 500 and json.loads(body) == {"error": "ValueError: send text/plain"}
        # input nested past Python's recursion limit in the user's input_fn is the
        # request's fault: 400 with a message, not a 500
        deep = "[" * 100_000 + "]" * 100_000
        status, _, body = call(
            addr, "POST", "/invocations", deep, {"Content-Type": "application/x-nested"}
        )
        error = json.loads(body)["error"]
        assert status == 400 and "RecursionError" in error and "nested too deeply" in error
    other = _model_dir(tmp_path / "tf", {"code/inference.py": TRANSFORM})
    with server(other, str(tmp_path), "--framework", "python") as addr:
        status, ctype, body = call(
            addr, "POST", "/invocations", "abc", {"Content-Type": "application/x-anything"}
        )
        assert (status, ctype, body) == (
            200,
            "text/plain",
            b"cba|model-object|application/x-anything",
        )


@pytest.mark.torch
def test_pytorch_defaults_and_input_fn(tmp_path):
    import torch

    _archive, net = torchscript_archive(
        str(tmp_path / "m"),
        extra={
            "code/inference.py": '''
import torch

def input_fn(body, content_type):
    """Pre-processing: a comma-separated row, doubled."""
    return torch.tensor([[float(v) * 2 for v in body.decode().split(",")]])
'''
        },
    )
    model = tmp_path / "m"  # the directory the archive was made from
    with server(str(model), str(tmp_path)) as addr:
        status, ctype, body = call(
            addr,
            "POST",
            "/invocations",
            "1,2,3,4",
            {"Content-Type": "text/csv", "Accept": "text/csv"},
        )
        want = net(torch.tensor([[2.0, 4, 6, 8]])).detach().numpy()
        assert status == 200 and ctype == "text/csv"
        np.testing.assert_allclose(
            np.asarray(body.decode().strip().split(","), np.float32), want[0], rtol=1e-6
        )
        status, _, body = call(
            addr,
            "POST",
            "/invocations",
            "1,2",
            {"Content-Type": "text/csv", "Accept": "application/xml"},
        )
        assert status == 400 and b"the model refused an input of shape [1, 2]" in body
    os.remove(model / "code" / "inference.py")
    with server(str(model), str(tmp_path)) as addr:
        status, _, body = call(
            addr,
            "POST",
            "/invocations",
            "[[1,2,3,4]]",
            {"Content-Type": "application/json", "Accept": "application/xml"},
        )
        assert status == 415 and b"application/xml" in body
        status, _, body = call(
            addr, "POST", "/invocations", "[[1,2", {"Content-Type": "application/json"}
        )
        assert status == 400 and b"malformed application/json" in body


HANDLER = '''
import json
import requests

def handler(data, context):
    """Pre: CSV of 64 pixels; call TF Serving at context.rest_uri; post: top class."""
    rows = [[float(v) for v in ln.split(",")] for ln in data.read().decode().splitlines()]
    response = requests.post(context.rest_uri, data=json.dumps({"instances": rows}))
    if response.status_code != 200:
        raise ValueError(response.content.decode())
    preds = response.json()["predictions"]
    return json.dumps({"classes": [max(range(10), key=p.__getitem__) for p in preds],
                       "model": context.model_name, "method": context.method}), "application/json"
'''


@pytest.mark.tensorflow
def test_tf_handler_calls_tf_serving_through_rest_uri(tmp_path):
    import tensorflow as tf

    models = tmp_path / "all"
    export_tf_models(str(models))
    model = tmp_path / "flat"
    shutil.copytree(models / "flat" / "1", model / "1")
    _model_dir(model, {"code/inference.py": HANDLER})
    x = np.random.default_rng(3).random((4, 64), dtype=np.float32)
    fn = tf.saved_model.load(str(model / "1")).signatures["serving_default"]
    want = fn(features=tf.constant(x))["output_0"].numpy().argmax(1).tolist()
    with server(str(model), str(tmp_path)) as addr:
        body = "\n".join(",".join(repr(v) for v in r) for r in x.tolist())
        status, _, resp = call(addr, "POST", "/invocations", body, {"Content-Type": "text/csv"})
        assert status == 200, resp
        assert json.loads(resp) == {"classes": want, "model": "model", "method": "predict"}
        status, _, resp = call(addr, "POST", "/invocations", "1,2", {"Content-Type": "text/csv"})
        assert status == 500 and b"expected signature" in resp
