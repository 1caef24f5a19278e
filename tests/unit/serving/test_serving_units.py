"""Pure pieces of serving: conversions, request parsing, archive safety, batch helpers,
serializers, and the batcher (with a Servable of our own: the seam the server uses)."""

from __future__ import annotations

import asyncio
import io
import json
import os
import struct
import tarfile

import numpy as np
import pytest

from shipyard.errors import ValidationError
from shipyard.sdk import deserializers as de
from shipyard.sdk import serializers as se
from shipyard.serving import model_data, protocol
from shipyard.serving.batching import BatchingRunner, DirectRunner
from shipyard.serving.errors import BadRequest, ModelLoadError, UnsupportedMediaType
from shipyard.serving.protocol import Signature, TensorSpec
from shipyard.serving.servables import Servable
from shipyard.serving.transform import records as batch

SIG = Signature(
    "serving_default",
    {"x": TensorSpec("x", "float32", (None, 2))},
    {"y": TensorSpec("y", "float32", (None,))},
)


@pytest.mark.parametrize(
    "ctype,body,want",
    [
        ("application/json", '{"instances": [[1, 2]]}', {"instances": [[1, 2]]}),
        ("application/json", '{"inputs": {"x": [[1, 2]]}}', {"inputs": {"x": [[1, 2]]}}),
        ("application/json", "[1, 2]", {"instances": [[1, 2]]}),
        ("application/json", " [[1, 2], [3, 4]]", {"instances": [[1, 2], [3, 4]]}),
        ("application/json", '{"a": 1}', {"instances": [{"a": 1}]}),
        ("application/jsonlines", "[1, 2]\n[3, 4]\n", {"instances": [[1, 2], [3, 4]]}),
        (
            "application/jsons",
            '{"x": [1, 2]}\n{"x": [3, 4]}',
            {"instances": [{"x": [1, 2]}, {"x": [3, 4]}]},
        ),
        ("text/csv", "1,2.5\n3,4\n\n", {"instances": [[1, 2.5], [3, 4]]}),
        ("text/csv; charset=utf-8", 'a,"b"\n', {"instances": [["a", "b"]]}),
    ],
)
def test_invocations_to_tfs_as_the_container(ctype, body, want):
    assert protocol.invocations_to_tfs(body.encode(), ctype) == want


def test_invocations_refusals():
    with pytest.raises(UnsupportedMediaType, match="Unsupported Media Type: image/png"):
        protocol.invocations_to_tfs(b"x", "image/png")
    with pytest.raises(BadRequest, match="malformed JSON"):
        protocol.invocations_to_tfs(b"[1,", "application/json")
    with pytest.raises(BadRequest, match="UTF-8"):
        protocol.invocations_to_tfs(b"\xff", "text/csv")


def test_parse_tfs_request_rows_columns_and_errors():
    arrays, row = protocol.parse_tfs_request({"instances": [[1, 2], [3, 4]]}, SIG)
    assert row and arrays["x"].dtype == np.float32 and arrays["x"].shape == (2, 2)
    arrays, row = protocol.parse_tfs_request({"inputs": {"x": [[1, 2]]}}, SIG)
    assert not row and arrays["x"].tolist() == [[1, 2]]
    arrays, _ = protocol.parse_tfs_request({"instances": [{"x": [1, 2]}]}, SIG)
    assert arrays["x"].shape == (1, 2)
    for bad, msg in [
        ({"instances": [[1, 2, 3]]}, "shape"),
        ({"instances": [[1, [2]]]}, "float32"),
        ({"instances": [["a", "b"]]}, "float32"),
        ({"instances": []}, "non-empty"),
        ({"instances": [{"z": 1}]}, "lacks input 'x'"),
        ([1], "JSON object"),
        ({"instances": [[True, False]]}, "float32"),
        ({"x": 1}, "exactly one"),
    ]:
        with pytest.raises(BadRequest, match=msg):
            protocol.parse_tfs_request(bad, SIG)


def test_b64_strings_and_outputs():
    sig = Signature("s", {"t": TensorSpec("t", "string", (None,))}, {})
    arrays, _ = protocol.parse_tfs_request({"instances": [{"b64": "aGk="}, "yo"]}, sig)
    assert arrays["t"].tolist() == [b"hi", b"yo"]
    with pytest.raises(BadRequest, match="base64"):
        protocol.parse_tfs_request({"instances": [{"b64": "!!"}]}, sig)
    out = {"a_bytes": np.array([b"\x00"], dtype=object), "b": np.array([b"ok"], dtype=object)}
    assert protocol.format_predictions(out, True) == {
        "predictions": [{"a_bytes": {"b64": "AA=="}, "b": "ok"}]
    }
    assert protocol.plain(protocol.format_predictions({"y": np.array([1.5])}, False)) == {
        "outputs": [1.5]
    }


def test_dumps_numeric_answers_as_json_writes_them():
    """The orjson fast path for numeric arrays parses back to the same values, in the
    array's own precision; NaN and Infinity, and anything not a numeric array, go
    through json (which writes NaN and Infinity as TF Serving does)."""
    f32 = np.array([[0.1, 1e-5, 3.4e38, -2.5]], dtype=np.float32)
    body = protocol.dumps(protocol.format_predictions({"p": f32}, True))
    assert np.array_equal(np.asarray(json.loads(body)["predictions"], dtype=np.float32), f32)
    ints = protocol.dumps({"outputs": np.array([[1, -2]], dtype=np.int64)})
    assert json.loads(ints) == {"outputs": [[1, -2]]}
    nan = protocol.dumps(protocol.format_predictions({"p": np.array([np.nan, np.inf])}, True))
    assert nan == b'{"predictions":[NaN,Infinity]}'
    strided = np.arange(6, dtype=np.float64).reshape(2, 3)[:, ::2]  # not contiguous
    assert json.loads(protocol.dumps({"outputs": strided})) == {"outputs": [[0.0, 2.0], [3.0, 5.0]]}
    assert (
        protocol.dumps({"error": "é"}) == json.dumps({"error": "é"}, separators=(",", ":")).encode()
    )


def test_classify_regress_formats():
    scores = {"s": np.array([[0.25, 0.75]])}
    assert protocol.format_classify(scores) == {"result": [[["0", 0.25], ["1", 0.75]]]}
    assert protocol.format_regress({"v": np.array([[2.0], [3.0]])}) == {"result": [2.0, 3.0]}
    with pytest.raises(BadRequest):
        protocol.format_regress(scores)


# -- model archives ---------------------------------------------------------------------------
def _tar(path, members):
    with tarfile.open(path, "w:gz") as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return str(path)


def _file(name, data=b"x"):
    info = tarfile.TarInfo(name)
    info.size = len(data)
    return info, data


def _link(name, target, kind=tarfile.SYMTYPE):
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, target
    return info, None


@pytest.mark.parametrize(
    "member,msg",
    [
        (_file("../evil"), "outside"),
        (_file("/abs/evil"), "outside"),
        (_file("a/../../evil"), "outside"),
        (_link("l", "/etc/passwd"), "links to"),
        (_link("d/l", "../../x"), "links to"),
        (_link("h", "../x", tarfile.LNKTYPE), "links to"),
    ],
)
def test_archive_leaving_the_model_dir_is_refused_and_writes_nothing(tmp_path, member, msg):
    archive = _tar(tmp_path / "m.tar.gz", [_file("1/saved_model.pb"), member])
    dest = tmp_path / "out" / "model"
    with pytest.raises(ModelLoadError, match=msg):
        model_data.extract(archive, str(dest))
    assert not dest.exists() and os.listdir(tmp_path / "out") == []


def test_extract_and_discover_tf_layouts(tmp_path):
    archive = _tar(
        tmp_path / "m.tar.gz",
        [
            _file("1/saved_model.pb"),
            _file("2/saved_model.pb"),
            _link("1/ok", "saved_model.pb"),
            _file("code/inference.py"),
        ],
    )
    model_data.extract(archive, str(tmp_path / "m"))
    found = model_data.find_tf_models(str(tmp_path / "m"))
    assert list(found) == ["model"] and found["model"].latest == 2
    (tmp_path / "multi" / "a" / "3").mkdir(parents=True)
    (tmp_path / "multi" / "a" / "3" / "saved_model.pb").write_bytes(b"")
    (tmp_path / "multi" / "b" / "x").mkdir(parents=True)
    (tmp_path / "multi" / "b" / "x" / "saved_model.pb").write_bytes(b"")  # not a version
    assert {
        k: list(v.versions) for k, v in model_data.find_tf_models(str(tmp_path / "multi")).items()
    } == {"a": [3]}
    (tmp_path / "notar").write_text("hello")
    with pytest.raises(ModelLoadError, match="not a tar"):
        model_data.extract(str(tmp_path / "notar"), str(tmp_path / "x"))


# -- batch transform pieces ---------------------------------------------------------------
def test_split_and_mini_batches():
    assert batch.split_records(b"a\nb\n\nc", "Line") == [b"a", b"b", b"c"]
    assert batch.split_records(b"abc", None) == [b"abc"]
    rec = struct.pack("<II", 0xCED7230A, 3) + b"abc\x00"
    assert batch.split_records(rec * 2, "RecordIO") == [rec, rec]
    tfr = struct.pack("<Q", 2) + b"\0" * 4 + b"hi" + b"\0" * 4
    assert batch.split_records(tfr * 3, "TFRecord") == [tfr] * 3
    with pytest.raises(ValidationError):
        batch.split_records(b"junk", "RecordIO")
    recs = [b"x" * 4] * 5
    assert batch.mini_batches(recs, "MultiRecord", 9, "Line") == [(0, 2), (2, 4), (4, 5)]
    assert batch.mini_batches(recs, "SingleRecord", 100, "Line") == [(i, i + 1) for i in range(5)]
    assert batch.mini_batches([b"x" * 20, b"y"], "MultiRecord", 9, "Line") == [(0, 1), (1, 2)]


def test_jsonpath_filters_and_join():
    assert batch.jsonpath("$[1:]", [1, 2, 3]) == [2, 3]
    assert batch.jsonpath("$[0,2]", [1, 2, 3]) == [1, 3]
    assert batch.jsonpath("$.a.b", {"a": {"b": 5}}) == 5
    assert batch.jsonpath("$['a','c']", {"a": 1, "b": 2, "c": 3}) == {"a": 1, "c": 3}
    with pytest.raises(ValidationError):
        batch.jsonpath("a", [])
    assert batch.filter_input(b"id7,1,2", "$[1:]", "text/csv") == b"1,2"
    assert (
        batch.join_output(b"id7,1,2", b"0.5", "Input", "$[0,-1]", "text/csv", "text/csv")
        == b"id7,0.5"
    )
    assert (
        batch.join_output(
            b'{"id": 1}', b"[0.5]", "Input", None, "application/json", "application/json"
        )
        == b'{"id":1,"SageMakerOutput":[0.5]}'
    )
    assert batch.per_record_outputs(b'{"predictions": [[1], [2]]}', 2) == [b"[1]", b"[2]"]
    assert batch.per_record_outputs(b"1\n2\n", 2) == [b"1", b"2"]
    assert batch.per_record_outputs(b'{"x": 1}', 2) is None


# -- serializers ------------------------------------------------------------------------------
def test_serializers_content_types_and_bytes():
    x = np.array([[1.0, 2.5], [3.0, 4.0]])
    assert se.JSONSerializer().content_type == "application/json"
    assert json.loads(se.JSONSerializer().serialize(x)) == x.tolist()
    assert se.JSONLinesSerializer().serialize([[1], [2]]) == "[1]\n[2]\n"
    assert se.CSVSerializer().serialize(x) == "1.0,2.5\n3.0,4.0"
    assert se.CSVSerializer().content_type == "text/csv"
    npy = se.NumpySerializer().serialize(x)
    assert se.NumpySerializer().content_type == "application/x-npy"
    assert (
        de.NumpyDeserializer().deserialize(io.BytesIO(npy), "application/x-npy").tolist()
        == x.tolist()
    )
    assert se.IdentitySerializer().serialize(b"ab") == b"ab"
    assert se.StringSerializer().serialize(5) == b"5"
    assert de.JSONDeserializer().accept == ("application/json",)
    assert de.JSONLinesDeserializer().deserialize(io.BytesIO(b"[1]\n[2]\n"), "") == [[1], [2]]
    assert de.CSVDeserializer().deserialize(io.BytesIO(b"1,2\n3,4\n"), "") == [
        ["1", "2"],
        ["3", "4"],
    ]
    assert de.StringDeserializer().deserialize(io.BytesIO(b"hi"), "") == "hi"
    assert de.BytesDeserializer().deserialize(io.BytesIO(b"hi"), "") == b"hi"
    assert de.NumpyDeserializer().deserialize(
        io.BytesIO(b"[[1,2]]"), "application/json"
    ).tolist() == [[1, 2]]


# -- dynamic batching ---------------------------------------------------------------------
class Doubler(Servable):
    """Records each call's batch size; a row of -1 makes the whole call fail."""

    def __init__(self):
        super().__init__("m", 1, {"s": SIG})
        self.calls = []

    def run(self, signature, inputs):
        x = inputs["x"]
        self.calls.append(len(x))
        if (x == -1).any():
            raise BadRequest("a -1 row")
        return {"y": x.sum(axis=1) * 2}


def test_batcher_merges_concurrent_requests_and_isolates_errors():
    servable = Doubler()
    runner = BatchingRunner(max_batch_size=8, max_wait=0.05)

    async def main():
        reqs = [np.full((1, 2), i, dtype=np.float32) for i in range(6)]
        reqs[3] = np.full((1, 2), -1, dtype=np.float32)
        return await asyncio.gather(
            *(runner.run(servable, "s", {"x": r}) for r in reqs), return_exceptions=True
        )

    results = asyncio.run(main())
    assert servable.calls[0] == 6  # one merged call first ...
    assert len(servable.calls) == 1 + 6  # ... which failed, so each went alone
    assert isinstance(results[3], BadRequest)
    assert [r["y"].tolist() for i, r in enumerate(results) if i != 3] == [
        [4.0 * i] for i in (0, 1, 2, 4, 5)
    ]
    servable.calls.clear()

    async def many():
        return await asyncio.gather(
            *(runner.run(servable, "s", {"x": np.ones((3, 2), np.float32)}) for _ in range(5))
        )

    results = asyncio.run(many())
    assert sum(servable.calls) == 15 and max(servable.calls) <= 8 and len(servable.calls) < 5
    assert all(r["y"].shape == (3,) for r in results)


def test_batcher_waits_only_while_company_is_coming():
    import time

    servable = Doubler()
    runner = BatchingRunner(max_batch_size=8, max_wait=0.5)
    x = {"x": np.ones((1, 2), np.float32)}

    async def one():
        start = time.monotonic()
        await runner.run(servable, "s", x)
        return time.monotonic() - start

    assert asyncio.run(one()) < 0.25  # alone: no wait for company
    runner.active = lambda: 3  # two more requests are being read
    assert asyncio.run(one()) >= 0.45  # waits (up to max_wait) for them


def test_batcher_expects_as_many_rows_as_its_last_batch_and_learns_when_load_drops():
    """A saturated worker's next requests arrive one by one: the batcher waits (up to
    max_wait) for as many rows as its last batch had; a wait that finds fewer lowers the
    expectation, so after load drops only one request pays the wait."""
    import time

    servable = Doubler()
    runner = BatchingRunner(max_batch_size=8, max_wait=0.3)
    x = {"x": np.ones((1, 2), np.float32)}

    async def together(n):
        return await asyncio.gather(*(runner.run(servable, "s", x) for _ in range(n)))

    async def staggered(n, gap):
        async def later(i):
            await asyncio.sleep(i * gap)
            return await runner.run(servable, "s", x)

        return await asyncio.gather(*(later(i) for i in range(n)))

    async def timed_one():
        start = time.monotonic()
        await runner.run(servable, "s", x)
        return time.monotonic() - start

    async def main():
        await together(4)  # one batch of 4: expect 4 next time
        await staggered(4, 0.02)  # arriving 20 ms apart, still one batch
        waited = await timed_one()  # load dropped: waits for company once ...
        alone = await timed_one()  # ... then no more
        return waited, alone

    waited, alone = asyncio.run(main())
    assert servable.calls == [4, 4, 1, 1]
    assert waited >= 0.25 and alone < 0.15, (waited, alone)


class Timed(Servable):
    """Takes ``seconds`` per call and records the thread each call ran on."""

    def __init__(self, seconds):
        super().__init__("m", 1, {"s": SIG})
        self.seconds = seconds
        self.threads = []

    def run(self, signature, inputs):
        import threading
        import time

        self.threads.append(threading.current_thread().name)
        time.sleep(self.seconds)
        return {"y": inputs["x"].sum(axis=1)}


@pytest.mark.parametrize("make", [DirectRunner, lambda: BatchingRunner(8, 0.001)])
def test_quick_calls_run_inline_and_slow_ones_leave_the_loop_free(make):
    """The first call of a signature, and any after a slow one, go to the model thread;
    after a quick one, calls run inline. While a slow call computes the loop answers
    other work (a /ping) at once."""
    import time

    x = {"x": np.ones((1, 2), np.float32)}
    quick, slow = Timed(0.0), Timed(0.3)
    runner = make()

    async def main():
        for _ in range(3):
            await runner.run(quick, "s", x)
        call = asyncio.ensure_future(runner.run(slow, "s", x))
        start = time.monotonic()
        await asyncio.sleep(0.05)  # a 0.3 s call on the loop would hold this up
        free_after = time.monotonic() - start
        assert not call.done()
        await call
        await runner.run(slow, "s", x)
        return free_after

    free_after = asyncio.run(main())
    assert quick.threads[0].startswith("model") and quick.threads[1:] == ["MainThread"] * 2
    assert all(t.startswith("model") for t in slow.threads) and len(slow.threads) == 2
    assert free_after < 0.2


def test_protocol_without_orjson_gives_the_same_values(monkeypatch):
    """orjson is optional: without it the json module parses and writes, same values."""
    bodies = [
        b'{"instances": [[0.5, 1e-05, 3], [0.1, 2, 1]], "k": "\\u00e9"}',
        b'{"instances": [[NaN, Infinity]]}',
    ]  # orjson refuses these: json parses them
    fast = [protocol.loads(b) for b in bodies]
    out = {"p": np.array([[0.25, -1.5]], dtype=np.float32)}
    fast_out = protocol.dumps(protocol.format_predictions(out, True))
    monkeypatch.setattr(protocol, "_ORJSON", None)
    slow = [protocol.loads(b) for b in bodies]
    assert repr(slow) == repr(fast)
    slow_out = protocol.dumps(protocol.format_predictions(out, True))
    assert json.loads(slow_out) == json.loads(fast_out) == {"predictions": [[0.25, -1.5]]}
    with pytest.raises(ValueError):
        protocol.loads(b"{bad")
