"""CPU per request of each stage of a shipyard serving worker's request path, in process
(issue #19: "report CPU per request by stage").

    .venv/bin/python benchmarks/serving_stages.py [--seconds 2]

The digits SavedModel and request of benchmarks/serving.py, one instance per request.
Each stage runs alone in a tight loop (CPU time of this process over calls), so the
figures are floors: inside a server the same code runs cache-cold between model calls.
The HTTP layer's share is measured without sockets (uvicorn + front_end.py's protocol fed
a request's bytes, answering an echo; no syscalls), and with them in the echo row of
benchmarks/serving.py; what a server spends beyond the sum is the event loop, syscalls,
wake-ups and cache misses.

Stages: JSON body -> TF Serving request (``invocations_to_tfs``) and request -> arrays
(``parse_tfs_request``), the general path; JSON body -> arrays for the common
``{"instances": [...]}`` form (``fast_json``, the path a digits request takes; the sum
counts it instead of the general two); the batcher with a model that returns at once
(8 concurrent requests, ``BatchingRunner``), the model call per request at batch 8 and 4
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


class _CountingTransport:
    """What the front end writes to, without a socket: counts bytes, never blocks."""

    def __init__(self) -> None:
        self.written = 0
        self.closing = False

    def write(self, data: bytes) -> None:
        self.written += len(data)

    def close(self) -> None:
        self.closing = True

    def is_closing(self) -> bool:
        return self.closing

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"sockname": ("127.0.0.1", 8080), "peername": ("127.0.0.1", 50000)}.get(
            name, default
        )


def http_cpu(body: bytes, seconds: float) -> float:
    """us of CPU per request of the HTTP front end alone (uvicorn + front_end.py's
    protocol) answering an echo handler: one keep-alive connection's request bytes fed
    to the protocol, its answer written to a transport that only counts bytes. No
    sockets, so no syscalls: the Python the layer runs per request, and its task."""
    from uvicorn.server import ServerState

    from shipyard.serving.front_end import FrontEnd, install_uvloop
    from shipyard.serving.http_types import HttpRequest, HttpResponse
    from shipyard.serving.protocol import error_body

    install_uvloop()
    request = (
        b"POST /invocations HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json"
        b"\r\nContent-Length: %d\r\n\r\n" % len(body)
    ) + body

    async def echo(req: HttpRequest) -> HttpResponse:
        return HttpResponse(200, req.body)

    async def main() -> float:
        config = FrontEnd(echo, 1 << 20, error_body).server.config
        config.load()
        protocol = config.http_protocol_class(  # type: ignore[call-arg]
            config=config, server_state=ServerState(), app_state={}
        )
        transport = _CountingTransport()
        protocol.connection_made(transport)  # type: ignore[arg-type]

        async def run(n: int) -> None:
            for _ in range(n):
                protocol.data_received(request)
                for _ in range(3):  # the handler's task runs and answers
                    await asyncio.sleep(0)

        await run(2000)
        n, start, cpu0 = 0, time.perf_counter(), time.process_time()
        while time.perf_counter() - start < seconds:
            await run(1000)
            n += 1000
        if transport.closing or transport.written < n * len(body):
            raise RuntimeError("the front end did not answer every request")
        return (time.process_time() - cpu0) / n * 1e6

    return asyncio.run(main())


def stages(model_dir: str, seconds: float) -> dict[str, float]:
    import numpy as np

    from shipyard.serving import fast_json, protocol
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
    fitted = fast_json.fit(sig)
    assert fitted is not None and fast_json.instances(body, fitted) is not None
    out["JSON body -> arrays, the common form (fast_json)"] = cpu_per_call(
        lambda: fast_json.instances(body, fitted), seconds
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


def _http_child(seconds: float, q: mp.Queue) -> None:
    """In a process of its own: no framework threads loaded beside it to count."""
    import numpy as np

    x = np.random.default_rng(0).random((1, 8, 8, 1), dtype=np.float32)
    q.put(http_cpu(json.dumps({"instances": x.tolist()}).encode(), seconds))


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
    p = mp.Process(target=_http_child, args=(args.seconds, q))
    p.start()
    out = {"HTTP front end, echo (no sockets)": q.get()}
    p.join()
    p = mp.Process(target=_child, args=(model_dir, args.seconds, q))
    p.start()
    out.update(q.get())
    p.join()
    print("\nCPU per request by stage (us, in process, 1 TF thread; floors, see the docstring)")
    for name, us in out.items():
        print(f"  {name:58s} {us:8.1f}")
    # the sum follows the path a digits request takes: the common form's, not the general
    general = ("JSON body -> TFS request", "TFS request -> arrays")
    parts = [k for k in out if "whole" not in k and "batch 4" not in k and k not in general]
    print(f"  {'sum of the stages (model at batch 8)':58s} {sum(out[k] for k in parts):8.1f}")
    result(
        "serving_stages",
        http_us=out["HTTP front end, echo (no sockets)"],
        parse_us=out["JSON body -> TFS request"],
        arrays_us=out["TFS request -> arrays"],
        fast_arrays_us=out["JSON body -> arrays, the common form (fast_json)"],
        answer_us=out["outputs -> JSON answer"],
        batcher_us=out["batcher (instant model), 8 concurrent"],
        model_b8_us=out["model call, batch 8, per request"],
        handler_us=out["whole handler (App, real model, batching), 8 concurrent"],
    )


if __name__ == "__main__":
    main()
