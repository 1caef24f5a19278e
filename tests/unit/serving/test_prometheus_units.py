"""/metrics counts: route labels never grow with raw paths; workers' snapshots add up."""

from __future__ import annotations

import os

import pytest

from shipyard.serving.prometheus import Metrics, route_label

parser = pytest.importorskip("prometheus_client.parser")


def test_route_labels_are_bounded():
    assert route_label("POST", "/invocations") == "/invocations"
    assert route_label("POST", "/v1/models/m/versions/2:predict") == "/v1/models:predict"
    assert route_label("GET", "/v1/models/m") == "/v1/models"
    assert route_label("GET", "/<script>/x") == "other"


def test_snapshots_of_workers_add_up(tmp_path):
    a, b = Metrics(str(tmp_path)), Metrics(str(tmp_path))
    for _ in range(3):
        a.observe("POST", "/invocations", 200, 0.002)
    b.observe("POST", "/invocations", 200, 0.2)
    b.observe("GET", "/nope", 404, 0.0001)
    b.batch(8)
    b.flush()
    os.replace(tmp_path / f"{os.getpid()}.json", tmp_path / "other-worker.json")
    status, body, ctype = a.exposition()
    assert status == 200 and ctype.startswith("text/plain")
    got = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in parser.text_string_to_metric_families(body.decode())
        for s in f.samples
    }
    assert got[("shipyard_requests_total", (("route", "/invocations"), ("status", "200")))] == 4
    assert got[("shipyard_requests_total", (("route", "other"), ("status", "404")))] == 1
    lat = "shipyard_request_seconds_bucket"
    assert got[(lat, (("le", "0.0025"), ("route", "/invocations")))] == 3
    assert got[(lat, (("le", "+Inf"), ("route", "/invocations")))] == 4
    assert got[("shipyard_batch_rows_count", ())] == 1
    assert got[("shipyard_batch_rows_sum", ())] == 8
