"""Batch transform over real files: 10,000 lines come back in order and equal to
per-record predictions; a bad record is reported with its position while the rest
are written; filters and join_source shape each output line."""

from __future__ import annotations

import os

import numpy as np
import pytest

import shipyard
from shipyard.sdk.transformer import TransformError
from tests.integration.serving.serving_helpers import (
    server_processes,
    torchscript_archive,
)

pytestmark = [pytest.mark.torch, pytest.mark.timeout(300)]


def test_ten_thousand_lines_in_order(home, tmp_path):
    import torch

    archive, net = torchscript_archive(str(tmp_path / "m"), features=8, outputs=2)
    x = np.random.default_rng(0).random((10_000, 8), dtype=np.float32)
    data = tmp_path / "in"
    data.mkdir()
    (data / "part-a.csv").write_text("\n".join(",".join(repr(v) for v in r) for r in x.tolist()))
    (data / "sub").mkdir()
    (data / "sub" / "part-b.csv").write_text("1,2,3,4,5,6,7,8\n")
    out = tmp_path / "out"
    transformer = shipyard.PyTorchModel(archive).transformer(
        instance_count=1,
        instance_type="local",
        strategy="MultiRecord",
        assemble_with="Line",
        output_path=str(out),
        accept="text/csv",
        max_payload=1,
    )
    transformer.transform(str(data), content_type="text/csv", split_type="Line")
    lines = (out / "part-a.csv.out").read_text().splitlines()
    with torch.no_grad():
        want = net(torch.from_numpy(x)).numpy()
    assert len(lines) == 10_000
    np.testing.assert_array_equal(np.asarray([ln.split(",") for ln in lines], np.float32), want)
    assert (out / "sub" / "part-b.csv.out").read_text().count("\n") == 1
    result = transformer.last_result
    assert result.records == 10_001 and 1 < result.requests < 100  # mini-batches, not lines
    assert os.listdir(os.path.join(str(home), "endpoints")) == []  # its server is gone
    assert server_processes(transformer.latest_transform_job) == []


def test_bad_record_reported_rest_processed_and_join(home, tmp_path):
    archive, net = torchscript_archive(str(tmp_path / "m"), features=2, outputs=1)
    src = tmp_path / "data.csv"
    src.write_text("id1,1,2\nid2,3,4\nid3,oops,5\nid4,7,8\n")
    out = tmp_path / "out"
    transformer = shipyard.PyTorchModel(archive).transformer(
        1,
        "local",
        strategy="MultiRecord",
        assemble_with="Line",
        output_path=str(out),
        accept="text/csv",
    )
    with pytest.raises(TransformError, match=r"data.csv record 3: .*; the other 3 were written"):
        transformer.transform(
            str(src),
            content_type="text/csv",
            split_type="Line",
            input_filter="$[1:]",
            join_source="Input",
            output_filter="$[0,-1]",
        )
    lines = (out / "data.csv.out").read_text().split("\n")
    assert lines[2] == "" and len(lines) == 5  # the failed record keeps its place
    pred = float(net(__import__("torch").tensor([[3.0, 4.0]])).detach()[0, 0])
    assert lines[1].split(",")[0] == "id2" and abs(float(lines[1].split(",")[1]) - pred) < 1e-5
    assert [f["Position"] for f in transformer.last_result.failures] == [3]
    with pytest.raises(ValueError, match="split_type='Line'"):
        transformer.transform(str(src), content_type="text/csv", join_source="Input")
