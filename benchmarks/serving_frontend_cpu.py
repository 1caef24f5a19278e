"""Server CPU per request of the worker's HTTP front end, the measure a busy machine
disturbs least (issue #19: the front-end decision).

    PYTHONPATH=$PWD/src .venv/bin/python benchmarks/serving_frontend_cpu.py [--seconds 3] [--repeats 3]

An echo handler behind the front end (no model: the HTTP layer alone) and the digits
model server (1 worker, batching 8 / 1 ms), each loaded at concurrency 8 by
``serving_loadgen.c`` for ``--seconds``, in turns (A B A B ...) so that a change in the
machine's load falls on both. Figures are medians of the server's process-tree CPU time
per request (us); req/s is printed too but is only comparable on a quiet machine.

At commit add9cf0 this script also ran the hand-written httptools layer that uvicorn
replaced (``--front-end builtin``); BENCHMARKS.md has both.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from serving import (  # noqa: E402 - benchmarks/ is not a package
    _ECHO,
    build_loadgen,
    export_model,
    run_load,
    start_script,
    start_shipyard,
    stop,
)

ECHO = _ECHO.format(module="shipyard.serving.front_end", front_end="FrontEnd")


def main() -> None:
    from _result import result

    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    import numpy as np

    tmp = tempfile.mkdtemp(prefix="serving-frontend-cpu-")
    model_dir = os.path.join(tmp, "model")
    p = mp.Process(target=export_model, args=(model_dir,))
    p.start()
    p.join()
    loadgen = build_loadgen(tmp)
    if loadgen is None:
        sys.exit("needs a C compiler (cc) for serving_loadgen.c")
    x = np.random.default_rng(0).random((1, 8, 8, 1), dtype=np.float32)
    body = json.dumps({"instances": x.tolist()}).encode()
    runs: dict[str, list[dict]] = {}
    for _ in range(args.repeats):
        proc, port = start_script(ECHO)
        try:
            runs.setdefault("echo", []).append(
                run_load(port, body, 8, args.seconds, proc.pid, loadgen, tmp, "/echo")
            )
        finally:
            stop(proc)
        proc, port = start_shipyard(model_dir, tmp, "--batch-size", "8", "--batch-wait-ms", "1")
        try:
            runs.setdefault("model", []).append(
                run_load(port, body, 8, args.seconds, proc.pid, loadgen, tmp)
            )
        finally:
            stop(proc)
    fields: dict[str, float] = {}
    print(f"{'row (c=8)':<16} {'req/s':>8} {'server us/req':>14} {'p99 ms':>8}")
    for row, rs in runs.items():
        med = {k: statistics.median(r[k] for r in rs) for k in rs[0]}
        print(f"{row:<16} {med['req_s']:>8.0f} {med['server_us']:>14.1f} {med['p99_ms']:>8.2f}")
        fields[row.replace(" ", "_") + "_us"] = med["server_us"]
    result("serving_frontend_cpu", **fields)


if __name__ == "__main__":
    main()
