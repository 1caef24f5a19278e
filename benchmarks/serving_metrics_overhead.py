"""What ``/metrics`` costs a model server per request (issue #21).

    .venv/bin/python benchmarks/serving_metrics_overhead.py [--n 200000] [--repeats 5]

Each answered request does one ``Metrics.observe`` (a counter by route and status, a
latency histogram by route) and each model call one ``Metrics.batch``; this times both,
as microseconds per request, with a snapshot directory (what a server's workers run) and
without, beside the same work done with prometheus_client's own metric objects (in its
multiprocess mode and in-process), which a first version used. Compare with a worker's
CPU per request (BENCHMARKS.md, serving: ~85-170 us on 2 cores).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _result import result  # noqa: E402

CHILD = r"""
import sys, time
n, kind = int(sys.argv[1]), sys.argv[2]
if kind == "shipyard":
    from shipyard.serving.prometheus import metrics
    m = metrics()
    def one():
        m.observe("POST", "/invocations", 200, 0.001)
        m.batch(4)
else:  # prometheus_client's own metric objects, as a first version used them
    from prometheus_client import Counter, Histogram
    from shipyard.serving.prometheus import BATCH_BUCKETS, LATENCY_BUCKETS
    req = Counter("r", "r", ["route", "status"])
    lat = Histogram("l", "l", ["route"], buckets=LATENCY_BUCKETS)
    rows = Histogram("b", "b", buckets=BATCH_BUCKETS)
    def one():
        req.labels("/invocations", "200").inc()
        lat.labels("/invocations").observe(0.001)
        rows.observe(4)
async def timed():  # on an event loop, as in a server worker
    for _ in range(1000):
        one()
    t = time.perf_counter()
    for _ in range(n):
        one()
    return (time.perf_counter() - t) / n * 1e6
import asyncio
print(asyncio.run(timed()))
"""


def run(n: int, multiprocess: bool, kind: str = "shipyard") -> float:
    env = dict(os.environ)
    with tempfile.TemporaryDirectory() as d:
        if multiprocess:
            env["PROMETHEUS_MULTIPROC_DIR"] = d
        else:
            env.pop("PROMETHEUS_MULTIPROC_DIR", None)
        out = subprocess.run(
            [sys.executable, "-c", CHILD, str(n), kind],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
    return float(out.stdout.strip())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=200_000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    rows = {}
    for label, multiprocess, kind in (
        ("shipyard, several workers", True, "shipyard"),
        ("shipyard, one process", False, "shipyard"),
        ("prometheus_client objects, multiprocess mode", True, "client"),
        ("prometheus_client objects, one process", False, "client"),
    ):
        runs = sorted(run(args.n, multiprocess, kind) for _ in range(args.repeats))
        rows[label] = statistics.median(runs)
        print(f"{label:48s} {rows[label]:6.2f} us/request  {[round(r, 2) for r in runs]}")
    result(
        "serving_metrics_overhead",
        shipyard_workers_us=rows["shipyard, several workers"],
        shipyard_single_us=rows["shipyard, one process"],
        client_multiprocess_us=rows["prometheus_client objects, multiprocess mode"],
        client_single_us=rows["prometheus_client objects, one process"],
    )


if __name__ == "__main__":
    main()
