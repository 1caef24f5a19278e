"""Byte-level protocol tests against a real server of SavedModels (two models, two
versions), started once: /invocations content types as SageMaker's TF Serving container
converts them, the TF Serving REST API, and bad input that must stay 4xx."""

from __future__ import annotations

import base64
import json
import random

import numpy as np
import pytest

from tests.integration.serving.serving_helpers import (
    call,
    digits_inputs,
    export_tf_models,
    server,
)

pytestmark = [pytest.mark.tensorflow, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def tf_models(tmp_path_factory):
    root = tmp_path_factory.mktemp("tfmodels")
    export_tf_models(str(root))
    return root


@pytest.fixture(scope="module")
def addr(tf_models, tmp_path_factory):
    # two workers sharing the socket, dynamic batching on, a small payload limit for 413
    with server(
        str(tf_models),
        str(tmp_path_factory.mktemp("srv")),
        "--workers",
        "2",
        "--batch-size",
        "16",
        "--batch-wait-ms",
        "1",
        "--max-payload-mb",
        "0.05",
    ) as a:
        yield a


@pytest.fixture(scope="module")
def expected(tf_models):
    """In-process predictions of digits v2 (the latest) and v1."""
    import tensorflow as tf

    x = digits_inputs(3)
    out = {}
    flat = tf.saved_model.load(str(tf_models / "flat" / "1")).signatures["serving_default"]
    out["flat"] = flat(features=tf.constant(x.reshape(3, 64)))["output_0"].numpy()
    for v in (1, 2):
        fn = tf.saved_model.load(str(tf_models / "digits" / str(v))).signatures["serving_default"]
        (name,) = fn.structured_input_signature[1]
        out[v] = next(iter(fn(**{name: tf.constant(x)}).values())).numpy()
    return x, out


def _preds(body: bytes, key: str = "predictions") -> np.ndarray:
    return np.asarray(json.loads(body)[key], dtype=np.float32)


DIGITS = {"X-Amzn-SageMaker-Custom-Attributes": "tfs-model-name=digits"}


def test_ping_and_execution_parameters(addr):
    assert call(addr, "GET", "/ping")[:1] == (200,)
    status, _ctype, body = call(addr, "GET", "/execution-parameters")
    assert status == 200 and json.loads(body) == {
        "MaxConcurrentTransforms": 4,
        "BatchStrategy": "MULTI_RECORD",
        "MaxPayloadInMB": 0,
    }


def test_invocations_json_jsonlines_csv_equal_in_process(addr, expected):
    x, want = expected
    rows = x.tolist()
    bodies = {
        "application/json": json.dumps({"instances": rows}),  # passed through
        "application/json; charset=utf-8": json.dumps(rows),  # [[ -> instances
        "application/jsonlines": "\n".join(json.dumps(r) for r in rows),
    }
    for ctype, body in bodies.items():
        status, rtype, resp = call(
            addr, "POST", "/invocations", body, {"Content-Type": ctype, **DIGITS}
        )
        assert status == 200, resp
        assert rtype.startswith("application/json")
        np.testing.assert_array_equal(_preds(resp), want[2])
    # JSON that does not start with [[ is wrapped as one instance; [[... is the list
    status, _, resp = call(
        addr,
        "POST",
        "/invocations",
        '"abc"',
        {
            "Content-Type": "application/json",
            "X-Amzn-SageMaker-Custom-Attributes": "tfs-model-name=echo",
        },
    )
    assert json.loads(resp) == {"predictions": [{"length": 3, "upper_bytes": {"b64": "QUJD"}}]}
    status, _, resp = call(
        addr,
        "POST",
        "/invocations",
        json.dumps(rows[0]),
        {"Content-Type": "application/json", **DIGITS},
    )
    assert status == 400 and b"shape [8, 8, 1] does not match" in resp


def test_csv_and_jsonlines_accept(addr, expected):
    x, want = expected
    csv = "\n".join(",".join(repr(v) for v in row) for row in x.reshape(3, 64).tolist())
    status, _, resp = call(
        addr,
        "POST",
        "/invocations",
        csv + "\n",
        {"Content-Type": "text/csv", "X-Amzn-SageMaker-Custom-Attributes": "tfs-model-name=flat"},
    )
    assert status == 200, resp
    np.testing.assert_array_equal(_preds(resp), want["flat"])
    status, ctype, resp = call(
        addr,
        "POST",
        "/invocations",
        csv,
        {
            "Content-Type": "text/csv",
            "Accept": "text/csv",
            "X-Amzn-SageMaker-Custom-Attributes": "tfs-model-name=flat",
        },
    )
    assert ctype == "text/csv"
    np.testing.assert_array_equal(
        np.asarray([ln.split(",") for ln in resp.decode().splitlines()], dtype=np.float32),
        want["flat"],
    )
    # the echo model: CSV cells that are not numbers become strings (the container quotes)
    status, _, resp = call(
        addr,
        "POST",
        "/invocations",
        "ab\ncde\n",
        {"Content-Type": "text/csv", "X-Amzn-SageMaker-Custom-Attributes": "tfs-model-name=echo"},
    )
    assert status == 400  # each CSV line is an instance [cell]: rank 2 vs the rank-1 input
    assert b"signature 'serving_default'" in resp
    status, ctype, resp = call(
        addr,
        "POST",
        "/invocations",
        '{"instances": ["ab", "cde"]}',
        {
            "Content-Type": "application/json",
            "Accept": "application/jsonlines",
            "X-Amzn-SageMaker-Custom-Attributes": "tfs-model-name=echo",
        },
    )
    assert status == 200 and ctype == "application/jsonlines"
    assert (
        resp == b'{"length":2,"upper_bytes":{"b64":"QUI="}}\n'
        b'{"length":3,"upper_bytes":{"b64":"Q0RF"}}\n'
    )


def test_custom_attributes_pick_model_version_and_method(addr, expected):
    x, want = expected
    status, _, resp = call(
        addr,
        "POST",
        "/invocations",
        json.dumps(x.tolist()),
        {
            "Content-Type": "application/json",
            "X-Amzn-SageMaker-Custom-Attributes": "tfs-model-name=digits,tfs-model-version=1",
        },
    )
    np.testing.assert_array_equal(_preds(resp), want[1])
    status, _, resp = call(
        addr,
        "POST",
        "/invocations",
        json.dumps({"examples": [{"pixels": r} for r in x.tolist()]}),
        {
            "Content-Type": "application/json",
            "X-Amzn-SageMaker-Custom-Attributes": "tfs-model-name=digits,tfs-method=classify",
        },
    )
    assert status == 200, resp
    result = json.loads(resp)["result"]
    assert [lbl for lbl, _ in result[0]] == [str(i) for i in range(10)]
    np.testing.assert_allclose([[s for _, s in r] for r in result], want[2], rtol=1e-6)
    # several models and no name: a clear 404
    status, _, resp = call(
        addr, "POST", "/invocations", "[1]", {"Content-Type": "application/json"}
    )
    assert status == 404 and b"tfs-model-name" in resp


def test_tfs_rest_api(addr, expected):
    x, want = expected
    status, _, resp = call(addr, "GET", "/v1/models/digits")
    assert json.loads(resp) == {
        "model_version_status": [
            {
                "version": v,
                "state": "AVAILABLE",
                "status": {"error_code": "OK", "error_message": ""},
            }
            for v in ("2", "1")
        ]
    }
    meta = json.loads(call(addr, "GET", "/v1/models/digits/versions/1/metadata")[2])
    assert meta["model_spec"]["version"] == "1"
    sig = meta["metadata"]["signature_def"]["signature_def"]["serving_default"]
    assert sig["inputs"]["pixels"]["dtype"] == "DT_FLOAT"
    assert [d["size"] for d in sig["inputs"]["pixels"]["tensor_shape"]["dim"]] == [
        "-1",
        "8",
        "8",
        "1",
    ]
    status, _, resp = call(
        addr,
        "POST",
        "/v1/models/digits:predict",
        {"signature_name": "serving_default", "instances": x.tolist()},
    )
    np.testing.assert_array_equal(_preds(resp), want[2])
    status, _, resp = call(
        addr, "POST", "/v1/models/digits/versions/1:predict", {"inputs": {"pixels": x.tolist()}}
    )
    np.testing.assert_array_equal(_preds(resp, "outputs"), want[1])
    # b64 in, *_bytes out as b64, other strings as text; columnar with several outputs
    text = base64.b64encode(b"hi\xff").decode()
    status, _, resp = call(
        addr, "POST", "/v1/models/echo:predict", {"inputs": {"text": [{"b64": text}, "ok"]}}
    )
    assert json.loads(resp) == {
        "outputs": {
            "length": [3, 2],
            "upper_bytes": [{"b64": base64.b64encode(b"HI\xff").decode()}, {"b64": "T0s="}],
        }
    }
    status, _, resp = call(
        addr, "POST", "/v1/models/digits:regress", {"examples": [{"pixels": x[0].tolist()}]}
    )
    assert status == 400 and b"one value per example" in resp


BAD = [
    ("POST", "/invocations", "{bad", {"Content-Type": "application/json"}, 400, b"malformed"),
    ("POST", "/invocations", "1,2\n3,,4", {"Content-Type": "text/csv"}, 400, b"malformed CSV"),
    ("POST", "/invocations", "x", {"Content-Type": "text/plain"}, 415, b"Unsupported Media"),
    ("POST", "/invocations", "x", {}, 400, b"malformed"),
    (
        "POST",
        "/v1/models/digits:predict",
        '{"instances": [[1, 2]]}',
        {},
        400,
        b"expected signature 'serving_default' (inputs {pixels: float32[-1,8,8,1]}",
    ),
    (
        "POST",
        "/v1/models/digits:predict",
        '{"instances": [["a"]]}',
        {},
        400,
        b"cannot be read as float32",
    ),
    (
        "POST",
        "/v1/models/digits:predict",
        '{"instances": [1], "inputs": [1]}',
        {},
        400,
        b"exactly one of",
    ),
    (
        "POST",
        "/v1/models/digits:predict",
        '{"instances": [1], "signature_name": "nope"}',
        {},
        400,
        b"'nope' not found",
    ),
    (
        "POST",
        "/v1/models/half:predict",
        '{"instances": [1]}',
        {},
        404,
        b"Servable not found for request: Latest(half)",
    ),
    ("GET", "/v1/models/digits/versions/7", None, {}, 404, b"Specific(digits, 7)"),
    ("POST", "/v1/models/digits:explain", '{"instances": [1]}', {}, 404, b"unknown method"),
    ("GET", "/v1/models/digits:predict", None, {}, 405, b"Method Not Allowed"),
    ("GET", "/nowhere", None, {}, 404, b"Not Found"),
    # hostile JSON: nesting deeper than any parser or walk will follow (20k levels: the
    # payload limit here is 50 KB), and numbers too long to convert
    *(
        (
            "POST",
            path,
            pre + "[" * 20000 + "]" * 20000 + post,
            {"Content-Type": ctype},
            400,
            b"nested too deeply",
        )
        for path, pre, post, ctype in (
            ("/invocations", "", "", "application/json"),
            ("/invocations", "[1]\n", "", "application/jsonlines"),
            ("/invocations", '{"instances": ', "}", "application/json"),
            ("/v1/models/digits:predict", '{"instances": ', "}", "application/json"),
            ("/v1/models/digits:predict", '{"inputs": {"pixels": ', "}}", "application/json"),
            ("/v1/models/digits:classify", '{"examples": ', "}", "application/json"),
        )
    ),
    (
        "POST",
        "/v1/models/digits:predict",
        '{"instances": ' + '{"a":' * 8000 + "1" + "}" * 8000 + "}",
        {},
        400,
        b"nested too deeply",
    ),
    (  # within the parser's depth, past what the b64 walk can recurse
        "POST",
        "/v1/models/echo:predict",
        '{"instances": ' + "[" * 1020 + '{"b64": "aGk="}' + "]" * 1020 + "}",
        {},
        400,
        b"nested too deeply",
    ),
    (
        "POST",
        "/v1/models/digits:predict",
        '{"instances": [' + "9" * 5000 + "]}",
        {},
        400,
        b"Exceeds the limit (4300 digits)",
    ),
    (
        "POST",
        "/invocations",
        "[" + "1," * 40000 + "1]",
        {"Content-Type": "application/json"},
        413,
        b"payload limit",
    ),
]


@pytest.mark.parametrize(
    "method,path,body,headers,status,text",
    BAD,
    ids=[f"{b[4]}-{b[1]}-{i}" for i, b in enumerate(BAD)],
)
def test_bad_input_is_4xx_json_without_trace(addr, method, path, body, headers, status, text):
    got, ctype, resp = call(addr, method, path, body, headers)
    assert got == status, resp
    assert ctype == "application/json"
    assert text in json.loads(resp)["error"].encode()
    assert b"Traceback" not in resp


def _random_json(rng: random.Random, depth: int = 0):
    kind = rng.randrange(8 if depth < 4 else 4)
    if kind == 0:
        return rng.choice([None, True, False, 0, -1, 1e308, float("nan"), "", "x" * 5])
    if kind == 1:
        return rng.uniform(-1e6, 1e6)
    if kind == 2:
        return {"b64": rng.choice(["", "!!", "aGk=", 5])}
    if kind == 3:
        return rng.choice(["instances", "inputs", "pixels", "text"])
    if kind in (4, 5):
        return [_random_json(rng, depth + 1) for _ in range(rng.randrange(4))]
    keys = ["instances", "inputs", "signature_name", "examples", "context", "pixels", "text", "zz"]
    return {rng.choice(keys): _random_json(rng, depth + 1) for _ in range(rng.randrange(4))}


def test_generated_bad_requests_never_5xx(addr):
    """Property: whatever JSON (or bytes) arrives, the answer is 2xx or 4xx and the
    server stays up."""
    rng = random.Random(8)
    paths = [
        "/v1/models/digits:predict",
        "/v1/models/echo:predict",
        "/v1/models/digits:classify",
        "/v1/models/echo/versions/1:regress",
    ]
    for i in range(250):
        if i % 10 == 9:
            body = bytes(rng.randrange(256) for _ in range(rng.randrange(40)))
        else:
            body = json.dumps(_random_json(rng), allow_nan=True)
        path = rng.choice(paths)
        status, _, resp = call(addr, "POST", path, body)
        assert status < 500, (path, body, resp)
        status, _, resp = call(
            addr,
            "POST",
            "/invocations",
            body,
            {
                "Content-Type": rng.choice(
                    ["application/json", "text/csv", "application/jsonlines"]
                ),
                "X-Amzn-SageMaker-Custom-Attributes": "tfs-model-name="
                + rng.choice(["digits", "echo"]),
            },
        )
        assert status < 500, (body, resp)
    assert call(addr, "GET", "/ping")[0] == 200
