"""fast_json: the common ``{"instances": [...numbers...]}`` body read straight into an
array gives exactly what the general path (``invocations_to_tfs`` + ``parse_tfs_request``)
gives, and every body that path would read otherwise, or refuse, is left to it."""

from __future__ import annotations

import json

import numpy as np
import pytest

from shipyard.serving import fast_json, protocol
from shipyard.serving.errors import BadRequest
from shipyard.serving.protocol import Signature, TensorSpec


def sig(dtype: str = "float32", shape: tuple = (None, 8, 8, 1)) -> Signature:
    return Signature(
        "serving_default",
        {"pixels": TensorSpec("pixels", dtype, shape)},
        {"out": TensorSpec("out", "float32", (None, 10))},
    )


def general(body: bytes, s: Signature) -> dict[str, np.ndarray]:
    request = protocol.invocations_to_tfs(body, "application/json")
    return protocol.parse_tfs_request(request, s, b'"b64"' in body)[0]


def fast(body: bytes, s: Signature) -> dict[str, np.ndarray] | None:
    fitted = fast_json.fit(s)
    assert fitted is not None
    return fast_json.instances(body, fitted)


def same(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> bool:
    return a.keys() == b.keys() and all(
        a[k].dtype == b[k].dtype and a[k].shape == b[k].shape and np.array_equal(a[k], b[k])
        for k in a
    )


RNG = np.random.default_rng(0)
DIGITS = RNG.random((3, 8, 8, 1), dtype=np.float32)


@pytest.mark.parametrize(
    "body,s",
    [
        (json.dumps({"instances": DIGITS[:1].tolist()}).encode(), sig()),
        (json.dumps({"instances": DIGITS.tolist()}, indent=2).encode(), sig()),
        (b' \n{ "instances" :\t[[1, 2.5e-3, -0.0, 1E+2]] }\n', sig(shape=(None, 4))),
        (b'{"instances": [[1, 2, 3]]}', sig("int32", (None, 3))),  # ints stay int64, then cast
        (b'{"instances": [[1.9, -2.7, 3]]}', sig("int32", (None, 3))),  # truncated as before
        (b'{"instances": [[1e300, 2]]}', sig(shape=(None, 2))),  # inf in float32, as before
        (b'{"instances": [0.5, 1, 2]}', sig(shape=(None,))),  # one number per instance
        (b'{"instances": [[9007199254740993, 1]]}', sig("float64", (None, 2))),
        (b'{"instances": [[1, 2]]}', sig("uint8", (1, 2))),  # a fixed batch dimension
        (b'{"instances": [[18446744073709551616, 2]]}', sig(shape=(None, 2))),  # > 64 bits
        (b'{"instances": [[18446744073709551615, 2]]}', sig(shape=(None, 2))),  # uint64
    ],
)
def test_the_common_body_reads_as_the_general_path_reads_it(body, s):
    got = fast(body, s)
    assert got is not None, "the fast path should have taken this body"
    assert same(got, general(body, s))


@pytest.mark.parametrize(
    "body",
    [
        b'{"instances": [[+1, 2]]}',  # not JSON numbers: the general path refuses them
        b'{"instances": [[.5, 2]]}',
        b'{"instances": [[01, 2]]}',
        b'{"instances": [[1.2.3, 2]]}',
        b'{"instances": [[-, 2]]}',
        b'{"instances": [[1e, 2]]}',
        b'{"instances": [[NaN, 2]]}',  # json reads these; orjson does not
        b'{"instances": [[Infinity, 2]]}',
        b'{"instances": [[true, 2]]}',
        b'{"instances": [[null, 2]]}',
        b'{"instances": [["1", 2]]}',
        b'{"instances": [[{"b64": "AA=="}, 2]]}',
        b'{"instances": [[1, 2, 3]]}',  # wrong row shape
        b'{"instances": [[1], [2, 3]]}',  # ragged
        b'{"instances": [[[1, 2]]]}',  # too deep
        b'{"instances": [1, 2]}',  # too shallow
        b'{"instances": []}',
        b'{"instances": [[]]}',
        b'{"instances": [[1, 2],]}',
        b'{"instances": [[1,, 2]]}',
        b'{"instancs": [[1, 2]]}',  # other keys, or more of them
        b'{"instances5": [[1, 2]]}',
        b'{"instances": [[1, 2]], "signature_name": "x"}',
        b'{"signature_name": "x", "instances": [[1, 2]]}',
        b'{"inputs": [[1, 2]]}',
        b'{"instances": [[1, 2]]}\n{"instances": [[3, 4]]}',  # JSON lines
        b'{"instances": [[1, 2]]} x',
        b'{"instances": [[1, 2]]',
        b"[[1, 2]]",  # the container's bare forms: left to the general path
        '{"instances": [[1, 2]], "k": "é"}'.encode(),
    ],
)
def test_anything_else_is_left_to_the_general_path(body):
    s = sig(shape=(None, 2))
    assert fast(body, s) is None
    try:
        general(body, s)
    except BadRequest:
        pass  # what it answers (400) is unchanged: this path never saw it


def test_signatures_the_fast_path_does_not_take():
    two = Signature(
        "s",
        {"a": TensorSpec("a", "float32", (None, 2)), "b": TensorSpec("b", "float32", (None, 2))},
        {},
    )
    assert fast_json.fit(two) is None
    for dtype, shape in [
        ("string", (None, 2)),
        ("bool", (None, 2)),
        ("float32", None),
        ("float32", ()),
        ("float32", (None, None)),
        ("float32", (None, 0)),
    ]:
        assert fast_json.fit(sig(dtype, shape)) is None, (dtype, shape)
    # a fixed batch dimension that the body does not match: the general path words it
    assert fast(b'{"instances": [[1, 2], [3, 4]]}', sig("float32", (1, 2))) is None


def test_without_orjson_the_general_path_reads_everything(monkeypatch):
    monkeypatch.setattr(protocol, "_ORJSON", None)
    assert fast(b'{"instances": [[1, 2]]}', sig(shape=(None, 2))) is None
