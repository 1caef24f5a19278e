"""Train -> deploy -> predict, for the Keras SavedModel and the PyTorch digits examples:
answers over JSON, JSON lines, CSV (through an inference.py) and the TF Serving REST API
equal the model's in-process predictions on the same inputs."""

from __future__ import annotations

import json
import os
import sys
import tarfile
import textwrap

import numpy as np
import pytest

import shipyard
from shipyard.sdk.deserializers import CSVDeserializer, JSONDeserializer
from shipyard.sdk.serializers import CSVSerializer, JSONLinesSerializer, JSONSerializer
from tests.integration.serving.serving_helpers import call

EXAMPLES = os.path.join(os.path.dirname(__file__), "..", "..", "..", "examples")
sys.path.insert(0, os.path.join(EXAMPLES, "data"))
from make_digits import write_digits

pytestmark = [pytest.mark.timeout(400), pytest.mark.slow]


@pytest.fixture(scope="module")
def digits(tmp_path_factory):
    out = tmp_path_factory.mktemp("digits")
    write_digits(str(out))
    test = np.load(os.path.join(out, "test.npz"))
    return str(out), test["x"][:7]


def _unpack(model_data: str, dest) -> str:
    with tarfile.open(model_data.removeprefix("file://")) as tar:
        tar.extractall(dest, filter="data")
    return str(dest)


TF_INFERENCE = '''
import json

def input_handler(data, context):
    """CSV rows of 64 pixels -> TF Serving instances of 8x8x1."""
    if context.request_content_type == "text/csv":
        rows = [[float(v) for v in line.split(",")] for line in data.read().decode().splitlines()]
        return json.dumps({"instances": [[[[p] for p in r[i:i + 8]] for i in range(0, 64, 8)]
                                         for r in rows]})
    return data.read()

def output_handler(response, context):
    """Post-processing: the most likely digit per row, as CSV."""
    if response.status_code != 200:
        raise ValueError(response.content.decode())
    scores = json.loads(response.content)["predictions"]
    return "\\n".join(str(max(range(10), key=s.__getitem__)) for s in scores), "text/csv"
'''


@pytest.mark.tensorflow
def test_keras_train_deploy_predict(session, digits, tmp_path):
    import tensorflow as tf

    data, x = digits
    est = shipyard.TensorFlow(
        entry_point="digits_classifier.py",
        source_dir=os.path.join(EXAMPLES, "keras"),
        instance_count=1,
        instance_type="local",
        hyperparameters={"epochs": 2},
        session=session,
    )
    est.fit({"training": data})
    loaded = tf.saved_model.load(os.path.join(_unpack(est.model_data, tmp_path / "m"), "1"))
    want = loaded.serve(tf.constant(x)).numpy()

    predictor = est.deploy(initial_instance_count=1, instance_type="local")
    try:
        assert isinstance(predictor, shipyard.TensorFlowPredictor)
        got = predictor.predict(x.tolist())["predictions"]
        np.testing.assert_array_equal(np.asarray(got, dtype=np.float32), want)
        predictor.serializer = JSONLinesSerializer()
        got = predictor.predict(x.tolist())["predictions"]
        np.testing.assert_array_equal(np.asarray(got, dtype=np.float32), want)
        # classify and the tfs-model-name/-version attributes of TensorFlowPredictor
        named = shipyard.TensorFlowPredictor(
            predictor.endpoint_name, model_name="model", model_version="1"
        )
        np.testing.assert_array_equal(
            np.asarray(named.predict(x.tolist())["predictions"], np.float32), want
        )
        result = named.classify({"examples": [{"image": r} for r in x.tolist()]})["result"]
        assert [max(r, key=lambda p: p[1])[0] for r in result] == [str(i) for i in want.argmax(1)]
        url = predictor.describe()["Shipyard"]["Url"].removeprefix("http://")
        _status, _, body = call(url, "POST", "/v1/models/model:predict", {"instances": x.tolist()})
        np.testing.assert_array_equal(
            np.asarray(json.loads(body)["predictions"], dtype=np.float32), want
        )
    finally:
        predictor.delete_endpoint()

    # an inference.py changing pre- and post-processing is honoured
    code = tmp_path / "code"
    code.mkdir()
    (code / "inference.py").write_text(textwrap.dedent(TF_INFERENCE))
    model = shipyard.TensorFlowModel(
        model_data=est.model_data,
        entry_point="inference.py",
        source_dir=str(code),
        sagemaker_session=session,
    )
    predictor = model.deploy(1, "local", serializer=CSVSerializer(), deserializer=CSVDeserializer())
    try:
        got = predictor.predict(x.reshape(len(x), 64))
        assert [int(r[0]) for r in got] == want.argmax(1).tolist()
    finally:
        predictor.delete_endpoint()


PT_INFERENCE = """
import os
import torch
from torch import nn

def model_fn(model_dir):
    net = nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                        nn.Flatten(), nn.Linear(16 * 4 * 4, 64), nn.ReLU(), nn.Linear(64, 10))
    net.load_state_dict(torch.load(os.path.join(model_dir, "model.pth"), weights_only=True))
    return net
"""


@pytest.mark.torch
def test_pytorch_train_deploy_predict(session, digits, tmp_path):
    import torch

    data, x = digits
    x = np.ascontiguousarray(x.transpose(0, 3, 1, 2))  # NCHW as the script trains
    est = shipyard.PyTorch(
        entry_point="digits_classifier.py",
        source_dir=os.path.join(EXAMPLES, "pytorch"),
        instance_count=1,
        instance_type="local",
        hyperparameters={"epochs": 2},
        session=session,
    )
    est.fit({"training": data})
    code = tmp_path / "code"
    code.mkdir()
    (code / "inference.py").write_text(textwrap.dedent(PT_INFERENCE))
    namespace: dict = {}
    exec(textwrap.dedent(PT_INFERENCE), namespace)  # noqa: S102 - the same model_fn, in process
    net = namespace["model_fn"](_unpack(est.model_data, tmp_path / "m")).eval()
    with torch.no_grad():
        want = net(torch.from_numpy(x)).numpy()

    predictor = est.deploy(
        initial_instance_count=1,
        instance_type="local",
        entry_point="inference.py",
        source_dir=str(code),
    )
    try:
        assert isinstance(predictor, shipyard.PyTorchPredictor)
        got = predictor.predict(x)  # application/x-npy both ways
        assert got.dtype == np.float32
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
        predictor.serializer, predictor.deserializer = JSONSerializer(), JSONDeserializer()
        np.testing.assert_allclose(
            np.asarray(predictor.predict(x), np.float32), want, rtol=1e-5, atol=1e-6
        )
        url = predictor.describe()["Shipyard"]["Url"].removeprefix("http://")
        _status, _, body = call(url, "POST", "/v1/models/model:predict", {"instances": x.tolist()})
        np.testing.assert_allclose(
            np.asarray(json.loads(body)["predictions"], np.float32), want, rtol=1e-5, atol=1e-6
        )
    finally:
        predictor.delete_endpoint()

    # batch transform from the estimator: one JSON record per line, SingleRecord
    data_in = tmp_path / "batch"
    data_in.mkdir()
    (data_in / "images.jsonl").write_text("\n".join(json.dumps([r.tolist()]) for r in x))
    transformer = est.transformer(
        1,
        "local",
        strategy="SingleRecord",
        assemble_with="Line",
        output_path=str(tmp_path / "batch-out"),
        entry_point="inference.py",
        source_dir=str(code),
    )
    transformer.transform(str(data_in), content_type="application/json", split_type="Line")
    lines = (tmp_path / "batch-out" / "images.jsonl.out").read_text().splitlines()
    np.testing.assert_allclose(
        np.asarray([json.loads(ln)[0] for ln in lines], np.float32), want, rtol=1e-5, atol=1e-6
    )
