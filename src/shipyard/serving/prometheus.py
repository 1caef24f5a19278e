"""``GET /metrics`` of a model server in Prometheus' text format (prometheus_client).

* ``shipyard_requests_total{route, status}``: requests answered, by route and status;
* ``shipyard_request_seconds{route}``: latency histogram (request parsed -> answer ready);
* ``shipyard_batch_rows``: rows per model call (1 for unbatched calls), a histogram.

A server has several worker processes on one port, so the numbers are kept in
prometheus_client's multiprocess mode: the master makes a directory
(``PROMETHEUS_MULTIPROC_DIR``) that every worker writes its samples to, and whichever
worker answers ``/metrics`` adds them all up. Without prometheus_client installed the
routes answer as before and ``/metrics`` says what to install.

Routes are labelled by what they are, never by the raw path (an unknown path is
``other``), so a client probing paths cannot grow the label set.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import Any

ENV = "PROMETHEUS_MULTIPROC_DIR"
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


def make_dir() -> str | None:
    """The master's per-server sample directory (None without prometheus_client)."""
    try:
        import prometheus_client  # noqa: F401
    except ImportError:
        return None
    return tempfile.mkdtemp(prefix="shipyard-metrics-")


def remove_dir(path: str | None) -> None:
    if path:
        shutil.rmtree(path, ignore_errors=True)


def worker_exited(path: str | None, pid: int) -> None:
    """Tell prometheus_client a worker is gone (its live gauges are dropped)."""
    if not path:
        return
    try:
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(pid, path)
    except Exception:  # noqa: BLE001 - bookkeeping only
        pass


def route_label(method: str, path: str) -> str:
    if path in ("/ping", "/invocations", "/execution-parameters", "/metrics"):
        return path
    if path.startswith("/v1/models/"):
        tail = path.rsplit(":", 1)
        return f"/v1/models:{tail[1]}" if len(tail) == 2 and "/" not in tail[1] else "/v1/models"
    return "other"


class Metrics:
    """The server's metrics; no-ops when prometheus_client is missing."""

    def __init__(self) -> None:
        self.enabled = False
        try:
            from prometheus_client import Counter, Histogram
        except ImportError:
            return
        self.requests = Counter(
            "shipyard_requests", "Requests answered, by route and status", ["route", "status"]
        )
        self.latency = Histogram(
            "shipyard_request_seconds",
            "Time from a parsed request to its answer",
            ["route"],
            buckets=LATENCY_BUCKETS,
        )
        self.batch_rows = Histogram(
            "shipyard_batch_rows", "Rows per model call", buckets=BATCH_BUCKETS
        )
        self.enabled = True

    def observe(self, method: str, path: str, status: int, seconds: float) -> None:
        if self.enabled:
            route = route_label(method, path)
            self.requests.labels(route, str(status)).inc()
            self.latency.labels(route).observe(seconds)

    def batch(self, rows: int) -> None:
        if self.enabled:
            self.batch_rows.observe(rows)

    def exposition(self) -> tuple[int, bytes, str]:
        """(status, body, content type) of ``GET /metrics``."""
        if not self.enabled:
            return (
                501,
                b'{"error": "metrics need prometheus_client: pip install \'shipyard[serve]\'"}',
                "application/json",
            )
        from prometheus_client import (
            CONTENT_TYPE_LATEST,
            REGISTRY,
            CollectorRegistry,
            generate_latest,
        )

        registry: Any = REGISTRY
        if os.environ.get(ENV):
            from prometheus_client import multiprocess

            registry = CollectorRegistry()
            multiprocess.MultiProcessCollector(registry)
        return 200, generate_latest(registry), CONTENT_TYPE_LATEST


_METRICS: Metrics | None = None


def metrics() -> Metrics:
    global _METRICS
    if _METRICS is None:
        _METRICS = Metrics()
    return _METRICS
