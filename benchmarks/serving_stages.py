"""CPU per request of each stage of a shipyard serving worker's request path, in process
(issue #19: "report CPU per request by stage").

    .venv/bin/python benchmarks/serving_stages.py [--seconds 2]

The digits SavedModel and request of benchmarks/serving.py, one instance per request.
Each stage runs alone in a tight loop (CPU time of this process over calls), so the
figures are floors: inside a server the same code runs cache-cold between model calls.
The HTTP layer's share is the echo row of benchmarks/serving.py (server CPU per request
of the built-in HTTP layer with no model); what a server spends beyond the sum is the
event loop, wake-ups and cache misses.

Stages: JSON body -> TF Serving request (``invocations_to_tfs``), request -> arrays
(``parse_tfs_request``), the batcher with a model that returns at once (8 concurrent
requests, ``BatchingRunner``), the model call per request at batch 8 and 4
(``TFServable.run``, the call a worker makes), the answer (``format_predictions`` +
``predictions_as``), and the whole handler (``App``: routing, all of the above, the
real model with batching, 8 concurrent requests, no sockets).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.update(OMP_NUM_THREADS="1", TF_NUM_INTRAOP_THREADS="1", TF_NUM_INTEROP_THREADS="1")


def cpu_per_call(fn: Callable[[], Any], seconds: float, per_call: int = 1) -> float:
    """us of this process's CPU per request (``per_call`` requests per call of fn)."""
    for _ in range(50):
        fn()
    calls, start, cpu0 = 0, time.perf_counter(), time.process_time()
    while time.perf_counter() - start < seconds:
        fn()
        calls += 1
    return (time.process_time() - cpu0) / (calls * per_call) * 1e6


def concurrent_cpu(make: Callable[[], Any], seconds: float, concurrency: int = 8) -> float:
    """us of CPU per request with ``concurrency`` coroutines each awaiting ``make()`` in a
    loop on one event loop (uvloop when installed, as a worker runs)."""
    from shipyard.serving.front_end import install_uvloop

    install_uvloop()

    async def main() -> float:
        stop = time.perf_counter() + 0.5
        count = [0]

        async def client() -> None:
            while time.perf_counter() < stop:
                await make()
                count[0] += 1

        await asyncio.gather(*(client() for _ in range(concurrency)))  # warm-up
        count[0], cpu0 = 0, time.process_time()
        stop = time.perf_counter() + seconds
        await asyncio.gather(*(client() for _ in range(concurrency)))
        return (time.process_time() - cpu0) / count[0] * 1e6

    return asyncio.run(main())


def stages(model_dir: str, seconds: float) -> dict[str, float]:
    import numpy as np

    from shipyard.serving import protocol
    from shipyard.serving.app import App, State
    from shipyard.serving.batching import BatchingRunner
    from shipyard.serving.http_types import HttpRequest
    from shipyard.serving.servables import Servable, TFServable
    from shipyard.serving.service import load_service

    x = np.random.default_rng(0).random((1, 8, 8, 1), dtype=np.float32)
    body = json.dumps({"instances": x.tolist()}).encode()
    servable = TFServable("model", 1, os.path.join(model_dir, "model", "1"))
    sig = servable.signature(None)
    request = protocol.invocations_to_tfs(body, "application/json")
    arrays, _ = protocol.parse_tfs_request(request, sig, False)
    out1 = servable.run(sig.name, arrays)
    x8, x4 = np.repeat(x, 8, axis=0), np.repeat(x, 4, axis=0)
    out: dict[str, float] = {}
    out["JSON body -> TFS request"] = cpu_per_call(
        lambda: protocol.invocations_to_tfs(body, "application/json"), seconds
    )
    out["TFS request -> arrays"] = cpu_per_call(
        lambda: protocol.parse_tfs_request(request, sig, False), seconds
    )
    out["outputs -> JSON answer"] = cpu_per_call(
        lambda: protocol.predictions_as(protocol.format_predictions(out1, True), ""), seconds
    )
    out["model call, batch 8, per request"] = cpu_per_call(
        lambda: servable.run(sig.name, {"pixels": x8}), seconds, 8
    )
    out["model call, batch 4, per request"] = cpu_per_call(
        lambda: servable.run(sig.name, {"pixels": x4}), seconds, 4
    )

    class Instant(Servable):
        def run(self, signature: str, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
            return {"output_0": np.zeros((len(inputs["pixels"]), 10), np.float32)}

    instant = Instant("instant", 1, servable.signatures)
    runner = BatchingRunner(8, 0.001)
    out["batcher (instant model), 8 concurrent"] = concurrent_cpu(
        lambda: runner.run(instant, sig.name, arrays), seconds
    )

    state = State(6.0, {})
    app = App(state)
    runner2 = BatchingRunner(8, 0.001)
    runner2.active = lambda: state.active  # type: ignore[method-assign]
    state.service = load_service(model_dir, "auto", runner2)
    headers = {"content-type": "application/json"}
    out["whole handler (App, real model, batching), 8 concurrent"] = concurrent_cpu(
        lambda: app(HttpRequest("POST", "/invocations", "", headers, body)), seconds
    )
    return out


def _child(model_dir: str, seconds: float, q: mp.Queue) -> None:
    q.put(stages(model_dir, seconds))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=2.0)
    args = ap.parse_args()
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from _result import result
    from serving import export_model

    tmp = tempfile.mkdtemp(prefix="serving-stages-")
    model_dir = os.path.join(tmp, "models")
    p = mp.Process(target=export_model, args=(os.path.join(model_dir, "model"),))
    p.start()
    p.join()
    q: mp.Queue = mp.Queue()
    p = mp.Process(target=_child, args=(model_dir, args.seconds, q))
    p.start()
    out = q.get()
    p.join()
    print("\nCPU per request by stage (us, in process, 1 TF thread; floors, see the docstring)")
    for name, us in out.items():
        print(f"  {name:58s} {us:8.1f}")
    parts = [k for k in out if "whole" not in k and "batch 4" not in k]
    print(f"  {'sum of the stages (model at batch 8)':58s} {sum(out[k] for k in parts):8.1f}")
    result(
        "serving_stages",
        parse_us=out["JSON body -> TFS request"],
        arrays_us=out["TFS request -> arrays"],
        answer_us=out["outputs -> JSON answer"],
        batcher_us=out["batcher (instant model), 8 concurrent"],
        model_b8_us=out["model call, batch 8, per request"],
        handler_us=out["whole handler (App, real model, batching), 8 concurrent"],
    )


if __name__ == "__main__":
    main()
