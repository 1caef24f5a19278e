"""``GET /metrics`` of a model server in Prometheus' text format (prometheus_client).

* ``shipyard_requests_total{route, status}``: requests answered, by route and status;
* ``shipyard_request_seconds{route}``: latency histogram (request parsed -> answer ready);
* ``shipyard_batch_rows``: rows per model call (1 for unbatched calls), a histogram.

The hot path is plain Python: a dict increment and a bisect into bucket counts, about
1-2 us per request. prometheus_client's own metric objects were measured at ~22 us per
request in-process and ~47 us in its multiprocess mode (benchmarks/
serving_metrics_overhead.py), a third of a worker's CPU per request, so they only
*expose* the counts here (a custom collector).

A server has several worker processes on one port. Each worker writes a snapshot of its
counts to ``<PROMETHEUS_MULTIPROC_DIR>/<pid>.json`` (the master makes the directory and
removes it when the server stops) at most once a second while it answers requests, and a
second after its last one; whichever worker answers ``/metrics`` adds every snapshot up
(its own live counts included). So the totals lag by at most about a second, and the
counts of a worker that died stay in the totals (counters never go down).

Routes are labelled by what they are, never by the raw path (an unknown path is
``other``), so a client probing paths cannot grow the label set.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import tempfile
import time
from bisect import bisect_left
from collections.abc import Iterator
from typing import Any

ENV = "PROMETHEUS_MULTIPROC_DIR"
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
FLUSH_SECONDS = 1.0
_ROUTES = frozenset(("/ping", "/invocations", "/execution-parameters", "/metrics"))


def make_dir() -> str:
    """The master's per-server snapshot directory."""
    return tempfile.mkdtemp(prefix="shipyard-metrics-")


def remove_dir(path: str | None) -> None:
    if path:
        shutil.rmtree(path, ignore_errors=True)


def route_label(method: str, path: str) -> str:
    if path in _ROUTES:
        return path
    if path.startswith("/v1/models/"):
        tail = path.rsplit(":", 1)
        return f"/v1/models:{tail[1]}" if len(tail) == 2 and "/" not in tail[1] else "/v1/models"
    return "other"


class Histogram:
    """Counts per bucket (non-cumulative; the last is +Inf) and the sum."""

    __slots__ = ("bounds", "counts", "total")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.total = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.total += value


class Metrics:
    """One worker's counts, snapshots of the others, and the Prometheus exposition."""

    def __init__(self, directory: str | None = None) -> None:
        self.directory = directory if directory is not None else os.environ.get(ENV)
        self.requests: dict[tuple[str, str], int] = {}
        self.latency: dict[str, Histogram] = {}
        self.batch_rows = Histogram(BATCH_BUCKETS)
        self._flushed = 0.0
        self._dirty = False
        self._timer: asyncio.TimerHandle | None = None

    # -- the hot path -----------------------------------------------------------------------
    def observe(self, method: str, path: str, status: int, seconds: float) -> None:
        route = path if path in _ROUTES else route_label(method, path)
        key = (route, str(status))
        self.requests[key] = self.requests.get(key, 0) + 1
        hist = self.latency.get(route)
        if hist is None:
            hist = self.latency[route] = Histogram(LATENCY_BUCKETS)
        hist.observe(seconds)
        self._touched()

    def batch(self, rows: int) -> None:
        self.batch_rows.observe(rows)

    def _touched(self) -> None:
        if self.directory is None:
            return
        self._dirty = True
        now = time.monotonic()
        if now - self._flushed >= FLUSH_SECONDS:
            self.flush(now)
        elif self._timer is None:
            try:  # the last requests of a burst are written a second later
                self._timer = asyncio.get_running_loop().call_later(FLUSH_SECONDS, self._late)
            except RuntimeError:
                pass

    def _late(self) -> None:
        self._timer = None
        if self._dirty:
            self.flush()

    # -- snapshots --------------------------------------------------------------------------
    def snapshot(self) -> dict[str, Any]:
        return {
            "requests": [[r, s, n] for (r, s), n in self.requests.items()],
            "latency": {r: [h.counts, h.total] for r, h in self.latency.items()},
            "batch": [self.batch_rows.counts, self.batch_rows.total],
        }

    def flush(self, now: float | None = None) -> None:
        if self.directory is None:
            return
        self._flushed = time.monotonic() if now is None else now
        self._dirty = False
        path = os.path.join(self.directory, f"{os.getpid()}.json")
        try:
            with open(path + ".tmp", "w", encoding="utf-8") as fh:
                json.dump(self.snapshot(), fh)
            os.replace(path + ".tmp", path)
        except OSError:
            pass  # the server is stopping (its directory removed): nothing to keep

    def _snapshots(self) -> Iterator[dict[str, Any]]:
        yield self.snapshot()
        if self.directory is None:
            return
        own = f"{os.getpid()}.json"
        try:
            names = sorted(os.listdir(self.directory))
        except OSError:
            return
        for name in names:
            if name.endswith(".json") and name != own:
                try:
                    with open(os.path.join(self.directory, name), encoding="utf-8") as fh:
                        yield json.load(fh)
                except (OSError, ValueError):
                    continue

    # -- exposition -------------------------------------------------------------------------
    def exposition(self) -> tuple[int, bytes, str]:
        """(status, body, content type) of ``GET /metrics``."""
        try:
            from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
            from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily
        except ImportError:
            return (
                501,
                b'{"error": "metrics need prometheus_client: pip install \'shipyard[serve]\'"}',
                "application/json",
            )
        requests: dict[tuple[str, str], int] = {}
        latency: dict[str, list[Any]] = {}
        batch: list[Any] = [[0] * (len(BATCH_BUCKETS) + 1), 0.0]
        for snap in self._snapshots():
            for route, status, n in snap["requests"]:
                requests[(route, status)] = requests.get((route, status), 0) + n
            for route, (counts, total) in snap["latency"].items():
                acc = latency.setdefault(route, [[0] * (len(LATENCY_BUCKETS) + 1), 0.0])
                acc[0] = [a + b for a, b in zip(acc[0], counts)]
                acc[1] += total
            batch[0] = [a + b for a, b in zip(batch[0], snap["batch"][0])]
            batch[1] += snap["batch"][1]

        def buckets(bounds: tuple[float, ...], counts: list[int]) -> list[tuple[str, float]]:
            out: list[tuple[str, float]] = []
            running = 0
            for bound, count in zip((*bounds, float("inf")), counts):
                running += count
                out.append(("+Inf" if bound == float("inf") else repr(float(bound)), running))
            return out

        class Collector:
            def collect(self) -> Iterator[Any]:
                req = CounterMetricFamily(
                    "shipyard_requests",
                    "Requests answered, by route and status",
                    labels=["route", "status"],
                )
                for (route, status), n in sorted(requests.items()):
                    req.add_metric([route, status], n)
                yield req
                lat = HistogramMetricFamily(
                    "shipyard_request_seconds",
                    "Time from a parsed request to its answer",
                    labels=["route"],
                )
                for route, (counts, total) in sorted(latency.items()):
                    lat.add_metric([route], buckets(LATENCY_BUCKETS, counts), total)
                yield lat
                rows = HistogramMetricFamily("shipyard_batch_rows", "Rows per model call")
                rows.add_metric([], buckets(BATCH_BUCKETS, batch[0]), batch[1])
                yield rows

        registry = CollectorRegistry(auto_describe=False)
        registry.register(Collector())
        return 200, generate_latest(registry), CONTENT_TYPE_LATEST


_METRICS: Metrics | None = None


def metrics() -> Metrics:
    global _METRICS
    if _METRICS is None:
        _METRICS = Metrics()
    return _METRICS
