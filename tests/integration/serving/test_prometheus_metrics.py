"""``GET /metrics`` in Prometheus' format counts every request by route and status,
across all the workers of a server, with latency and batch-size histograms."""

from __future__ import annotations

import json
import tarfile
import time

import pytest

from tests.integration.serving.serving_helpers import call, server, torchscript_archive

pytestmark = [pytest.mark.torch, pytest.mark.timeout(300)]
parser = pytest.importorskip("prometheus_client.parser")


def samples(text: str) -> dict[tuple[str, tuple], float]:
    out = {}
    for family in parser.text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_metrics_count_requests_after_predictions(tmp_path):
    pytest.importorskip("torch")
    archive, _ = torchscript_archive(str(tmp_path / "m"))
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    with tarfile.open(archive) as tar:
        tar.extractall(model_dir, filter="data")
    with server(str(model_dir), str(tmp_path), "--workers", "2", "--batch-size", "8") as addr:
        body = json.dumps([[1.0, 2.0, 3.0, 4.0], [0.0, 1.0, 0.0, 1.0]])
        for _ in range(12):
            status, _, _ = call(
                addr, "POST", "/invocations", body, {"Content-Type": "application/json"}
            )
            assert status == 200
        assert call(addr, "POST", "/invocations", "x", {"Content-Type": "image/gif"})[0] == 415
        assert call(addr, "GET", "/no/such/<route>")[0] == 404
        # each worker writes its counts at most a second after its last request
        deadline = time.monotonic() + 30
        while True:
            status, ctype, text = call(addr, "GET", "/metrics")
            assert status == 200 and ctype.startswith("text/plain"), (status, ctype, text[:200])
            got = samples(text.decode())
            done = ("shipyard_requests_total", (("route", "/invocations"), ("status", "200")))
            if got.get(done) == 12 or time.monotonic() > deadline:
                break
            time.sleep(0.3)
    key = lambda name, **labels: (name, tuple(sorted(labels.items())))  # noqa: E731
    # 12 answered across both workers, whichever took each connection
    assert got[key("shipyard_requests_total", route="/invocations", status="200")] == 12
    assert got[key("shipyard_requests_total", route="/invocations", status="415")] == 1
    assert got[key("shipyard_requests_total", route="other", status="404")] == 1
    assert got[key("shipyard_request_seconds_count", route="/invocations")] == 13
    assert got[key("shipyard_request_seconds_bucket", route="/invocations", le="+Inf")] == 13
    assert got[key("shipyard_batch_rows_count")] >= 1
    assert got[key("shipyard_batch_rows_sum")] == 24  # 12 requests x 2 rows each
