"""Serving throughput and latency of /invocations for the digits model (issue #8).

    .venv/bin/python benchmarks/serving.py [--seconds 3] [--repeats 3] [--quick]

Side by side in one run, on the Keras digits CNN of examples/keras (exported SavedModel):

* in-process: the SavedModel's serving signature called in a loop at batch 1 and 8
  (rows/s), with the same thread settings a server worker gets; and, for reference, the
  call the server itself makes (``TFServable.run``: the signature's function one level
  down, see servables.py), which is faster than the signature call;
* shipyard's server: requests of one instance each at concurrency 1 and 8, without and
  with dynamic batching (--batch-size 8 --batch-wait-ms 1), 1 worker and 2;
* a minimal stdlib ThreadingHTTPServer (TCP_NODELAY) running the same model per request,
  an echo on shipyard's own HTTP layer (no model): the HTTP floor of a worker, and a C
  epoll server answering a canned 200: the load generator's own ceiling.

Load comes from ``serving_loadgen.c`` (built with the system C compiler; wrk-style, a few
us of CPU per request) or, without a compiler, an asyncio Protocol client (~20 us): either
in its own process, speaking keep-alive HTTP/1.1 (pre-built request bytes, one request in
flight per connection). On 2 cores the client shares the CPU with the server, so the
cheaper client leaves the server what clients elsewhere would. Besides req/s and
latency, each row gives the server's CPU time per request (its process tree) and the
client's, which bound what two cores can do. Figures are medians over --repeats runs; the ratio that matters is server
req/s at concurrency 8 with batching over in-process rows/s at batch 8 (what batching
merges). Compare within one run only.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

PY = sys.executable


def export_model(path: str) -> None:
    import keras

    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [
            keras.Input((8, 8, 1), name="pixels"),
            keras.layers.Conv2D(16, 3, padding="same", activation="relu"),
            keras.layers.MaxPooling2D(),
            keras.layers.Flatten(),
            keras.layers.Dense(64, activation="relu"),
            keras.layers.Dense(10, activation="softmax"),
        ]
    )
    model.export(os.path.join(path, "1"), verbose=False)


def _threads() -> int:
    return max(1, os.cpu_count() or 1)


def in_process(
    model_dir: str,
    batch: int,
    seconds: float,
    out: mp.Queue,
    threads: int = 0,
    direct: bool = False,
) -> None:
    """rows/s of the signature called in a loop (a fresh process; all cores' threads unless
    ``threads``: a batching worker keeps one core for its event loop and uses the rest).
    ``direct``: through ``TFServable.run``, the call a shipyard worker makes."""
    n = str(threads or _threads())
    os.environ.update(OMP_NUM_THREADS=n, TF_NUM_INTRAOP_THREADS=n, TF_NUM_INTEROP_THREADS="1")
    import numpy as np
    import tensorflow as tf

    x = np.random.default_rng(0).random((batch, 8, 8, 1), dtype=np.float32)
    if direct:
        from shipyard.serving.servables import TFServable

        servable = TFServable("digits", 1, os.path.join(model_dir, "1"))
        assert servable._direct, "the direct call did not check out on this TensorFlow"

        def call() -> None:
            servable.run("serving_default", {"pixels": x})
    else:
        sig = tf.saved_model.load(os.path.join(model_dir, "1")).signatures["serving_default"]

        def call() -> None:
            sig(pixels=tf.constant(x))["output_0"].numpy()

    for _ in range(50):
        call()
    calls, start, cpu0 = 0, time.perf_counter(), time.process_time()
    while time.perf_counter() - start < seconds:
        call()
        calls += 1
    out.put(
        {
            "rows_s": calls * batch / (time.perf_counter() - start),
            "cpu_us_row": (time.process_time() - cpu0) / (calls * batch) * 1e6,
        }
    )


# -- load generator ----------------------------------------------------------------------
# An asyncio Protocol per connection: pre-built request bytes, one request in flight per
# connection (keep-alive, no pipelining), the response framed by Content-Length. Checked
# against the C canned-response server below on this 2-core machine: this client reached
# 34-37k req/s at c=8, the earlier StreamReader client (readuntil/readexactly) 19-23k, and
# two client processes no more than one (they take the server's core). Every server
# measured here stays far below either ceiling, so the client is not what limits them.
class _Connection(asyncio.Protocol):
    def __init__(self, request: bytes, stop: float, lat: list, done: asyncio.Future) -> None:
        self.request, self.stop, self.lat, self.done = request, stop, lat, done
        self.buf, self.sent, self.count = b"", 0.0, 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        transport.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._send()

    def _send(self) -> None:
        self.sent = time.perf_counter()
        if self.sent > self.stop:
            self.transport.close()
            self.done.set_result(self.count)
        else:
            self.transport.write(self.request)

    def data_received(self, data: bytes) -> None:
        buf = self.buf + data
        end = buf.find(b"\r\n\r\n")
        if end < 0:
            self.buf = buf
            return
        if not buf.startswith(b"HTTP/1.1 200"):
            self.done.set_exception(RuntimeError(buf[:300].decode(errors="replace")))
            self.transport.close()
            return
        head = buf[:end].lower()
        i = head.find(b"content-length:")
        length = int(head[i + 15 : head.find(b"\r\n", i) if head.find(b"\r\n", i) > 0 else end])
        if len(buf) < end + 4 + length:
            self.buf = buf
            return
        self.buf = buf[end + 4 + length :]
        self.lat.append(time.perf_counter() - self.sent)
        self.count += 1
        self._send()

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.done.done():
            self.done.set_exception(exc or RuntimeError("server closed the connection"))


async def _drive(
    host: str, port: int, request: bytes, concurrency: int, stop: float, lat: list
) -> int:
    loop = asyncio.get_running_loop()
    done = [loop.create_future() for _ in range(concurrency)]
    for fut in done:
        await loop.create_connection(
            lambda fut=fut: _Connection(request, stop, lat, fut), host, port
        )
    return sum(await asyncio.gather(*done))


def load(
    host: str, port: int, body: bytes, concurrency: int, seconds: float, out: mp.Queue
) -> None:
    request = (
        f"POST /invocations HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json"
        f"\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode() + body

    async def main() -> tuple[float, list, int]:
        warm = await _drive(host, port, request, concurrency, time.perf_counter() + 0.5, [])
        lat: list = []
        start = time.perf_counter()
        n = await _drive(host, port, request, concurrency, start + seconds, lat)
        return n / (time.perf_counter() - start), lat, warm + n

    cpu0 = time.process_time()
    rate, lat, total = asyncio.run(main())
    lat.sort()
    out.put(
        {
            "req_s": rate,
            "p50_ms": lat[len(lat) // 2] * 1e3,
            "p99_ms": lat[int(len(lat) * 0.99)] * 1e3,
            "total": total,
            "client_us": (time.process_time() - cpu0) / total * 1e6,
        }
    )


def _tree_cpu(pid: int) -> float:
    import psutil

    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
        return sum(sum(p.cpu_times()[:2]) for p in procs)
    except psutil.Error:
        return float("nan")


def load_c(
    exe: str,
    tmp: str,
    port: int,
    body: bytes,
    concurrency: int,
    seconds: float,
    path: str = "/invocations",
) -> dict:
    """One run of the C load generator (0.5 s warm-up, then ``seconds`` measured)."""
    req = os.path.join(tmp, f"request-{len(body)}-{path.strip('/').replace('/', '_')}.http")
    with open(req, "wb") as fh:
        fh.write(
            f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: "
            f"application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
    done = subprocess.run(
        [exe, "127.0.0.1", str(port), str(concurrency), str(seconds), "0.5", req],
        capture_output=True,
        text=True,
        check=True,
        timeout=seconds + 60,
    )
    r = json.loads(done.stdout)
    if r["non200"] or r["errors"] or not r["requests"]:
        raise RuntimeError(f"load generator saw failures: {r}")
    return {
        "req_s": r["requests"] / r["seconds"],
        "p50_ms": r["p50_ms"],
        "p99_ms": r["p99_ms"],
        "client_us": r["client_cpu_s"] / r["requests"] * 1e6,
        "total": r["requests"],
    }


def run_load(
    port: int,
    body: bytes,
    concurrency: int,
    seconds: float,
    server_pid: int,
    loadgen: str | None = None,
    tmp: str = "",
    path: str = "/invocations",
) -> dict:
    """One load run; also the server's CPU time per request (its whole process tree,
    measured over the timed part only when the C generator is used; with the Python
    client it includes the 0.5 s warm-up)."""
    if loadgen:
        cpu0 = _tree_cpu(server_pid)
        result = load_c(loadgen, tmp, port, body, concurrency, seconds, path)
        # the warm-up's share of the server's CPU is removed pro rata to time
        spent = (_tree_cpu(server_pid) - cpu0) * seconds / (seconds + 0.5)
        result["server_us"] = spent / result.pop("total") * 1e6
        return result
    q: mp.Queue = mp.Queue()
    if path != "/invocations":
        raise RuntimeError("peers are measured with the C load generator only (needs cc)")
    p = mp.Process(target=load, args=("127.0.0.1", port, body, concurrency, seconds, q))
    cpu0 = _tree_cpu(server_pid)
    p.start()
    result = q.get(timeout=seconds + 120)
    p.join()
    result["server_us"] = (_tree_cpu(server_pid) - cpu0) / result.pop("total") * 1e6
    return result


# -- servers -------------------------------------------------------------------------------
def start_shipyard(model_dir: str, tmp: str, *args: str) -> tuple[subprocess.Popen, int]:
    state = os.path.join(tmp, f"state-{time.monotonic_ns()}.json")
    proc = subprocess.Popen(
        [PY, "-m", "shipyard.serving", model_dir, "--port", "0", "--state-file", state, *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    while True:
        try:
            with open(state) as fh:
                data = json.load(fh)
            if data["status"] == "InService":
                return proc, data["port"]
            if data["status"] == "Failed":
                stop(proc)
                raise RuntimeError(data["failure_reason"])
        except (OSError, ValueError, KeyError):
            pass
        time.sleep(0.1)


STDLIB_SERVER = r"""
import json, os, socket, sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
n = str(os.cpu_count() or 1)
os.environ.update(OMP_NUM_THREADS=n, TF_NUM_INTRAOP_THREADS=n, TF_NUM_INTEROP_THREADS="1")
mode, model_dir = sys.argv[1], sys.argv[2]
if mode == "model":
    import numpy as np, tensorflow as tf
    sig = tf.saved_model.load(model_dir + "/1").signatures["serving_default"]
class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def log_message(self, *a): pass
    def do_POST(self):
        body = self.rfile.read(int(self.headers["Content-Length"]))
        if mode == "model":
            x = np.asarray(json.loads(body)["instances"], dtype=np.float32)
            body = json.dumps({"predictions": sig(pixels=tf.constant(x))["output_0"].numpy().tolist()}).encode()
        self.send_response(200); self.send_header("Content-Length", str(len(body)))
        self.send_header("Content-Type", "application/json"); self.end_headers(); self.wfile.write(body)
class S(ThreadingHTTPServer):
    daemon_threads = True
    def get_request(self):
        conn, addr = super().get_request()
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return conn, addr
s = S(("127.0.0.1", 0), H)
print(s.server_address[1], flush=True)
s.serve_forever()
"""

# an echo handler behind shipyard's front end (uvicorn + front_end.py's limits), started as a
# model worker starts it
_ECHO = r"""
import asyncio, socket
from {module} import {front_end}
from shipyard.serving.http_types import HttpResponse
from shipyard.serving.front_end import install_uvloop
from shipyard.serving.protocol import error_body
async def echo(request):
    return HttpResponse(200, request.body)
async def main():
    sock = socket.socket(); sock.bind(("127.0.0.1", 0)); sock.listen(1024)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    await {front_end}(echo, 1 << 20, error_body).start(sock)
    print(sock.getsockname()[1], flush=True)
    await asyncio.Event().wait()
install_uvloop()
asyncio.run(main())
"""
SHIPYARD_ECHO = _ECHO.format(module="shipyard.serving.front_end", front_end="FrontEnd")


# -- peers: other model servers serving the same SavedModel ----------------------------------
# Each gets the same framework threads per worker as a shipyard worker with batching (its
# share of the cores less one, at least 1: TF_NUM_INTRAOP_THREADS), the same cores (the
# whole machine), one instance per request as {"instances": [...]}, and its own batching
# (8 rows, 1 ms), with 1 and 2 model workers.
def _peer_threads(workers: int) -> dict[str, str]:
    n = str(max(1, (os.cpu_count() or 1) // workers - 1))
    return {
        "OMP_NUM_THREADS": n,
        "TF_NUM_INTRAOP_THREADS": n,
        "TF_NUM_INTEROP_THREADS": "1",
        "TF_CPP_MIN_LOG_LEVEL": "2",
    }


LITSERVE = r"""
import os, sys
import litserve as ls
import numpy as np
model_dir, port, workers = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
class Digits(ls.LitAPI):
    def setup(self, device):
        import tensorflow as tf
        self.tf = tf
        self.fn = tf.saved_model.load(model_dir + "/1").signatures["serving_default"]
    def decode_request(self, request):
        return np.asarray(request["instances"], dtype=np.float32)
    def batch(self, inputs):
        return np.concatenate(inputs)
    def predict(self, x):
        return self.fn(pixels=self.tf.constant(x))["output_0"].numpy()
    def unbatch(self, output):
        return [row[None] for row in output]
    def encode_response(self, output):
        return {"predictions": output.tolist()}
if __name__ == "__main__":  # LitServe starts its workers by spawning this file again
    api = Digits(max_batch_size=8, batch_timeout=0.001, api_path="/invocations")
    server = ls.LitServer(api, accelerator="cpu", workers_per_device=workers)
    server.run(host="127.0.0.1", port=port, generate_client_file=False, log_level="warning")
"""


def start_litserve(model_dir: str, tmp: str, workers: int) -> tuple[subprocess.Popen, int]:
    """LitServe (FastAPI on uvicorn, model workers in processes of their own, its batching)."""
    _needs("litserve")
    port = free_port()
    script = os.path.join(tmp, "litserve_digits.py")
    with open(script, "w") as fh:
        fh.write(LITSERVE)
    log = open(os.path.join(tmp, f"litserve-{workers}.log"), "wb")  # noqa: SIM115 - kept
    proc = subprocess.Popen(
        [PY, script, model_dir, str(port), str(workers)],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=_bench_env(**_peer_threads(workers)),
        start_new_session=True,
    )
    wait_http(proc, port, "/health")
    return proc, port


TORCHSERVE_HANDLER = r"""
# TorchServe handler for the digits SavedModel: TorchServe's front end batches requests
# (batchSize / maxBatchDelay) and hands the batch to handle() as a list.
import json, os
import numpy as np
_state = {}
def handle(data, context):
    if not _state:
        import tensorflow as tf
        _state["tf"] = tf
        path = os.environ["DIGITS_MODEL_DIR"] + "/1"
        _state["fn"] = tf.saved_model.load(path).signatures["serving_default"]
    if data is None:
        return None
    rows = [row.get("body") or row.get("data") for row in data]  # JSON arrives decoded
    x = np.concatenate([
        np.asarray((json.loads(r) if isinstance(r, (bytes, str)) else r)["instances"],
                   dtype=np.float32)
        for r in rows
    ])
    out = _state["fn"](pixels=_state["tf"].constant(x))["output_0"].numpy()
    return [{"predictions": out[i : i + 1].tolist()} for i in range(len(data))]
"""


TORCHSERVE_LOG4J = """<?xml version="1.0" encoding="UTF-8"?>
<Configuration>
  <Appenders>
    <Console name="STDOUT" target="SYSTEM_OUT"><PatternLayout pattern="%d %p %c - %m%n"/></Console>
  </Appenders>
  <Loggers><Root level="warn"><AppenderRef ref="STDOUT"/></Root></Loggers>
</Configuration>
"""


def start_torchserve(model_dir: str, tmp: str, workers: int) -> tuple[subprocess.Popen, int]:
    """TorchServe: a Java (Netty) front end that batches (8 rows / 1 ms) and Python model
    workers it feeds over Unix sockets; the handler runs the same SavedModel."""
    import http.client

    bindir = os.path.dirname(PY)
    if not shutil.which("java") or not os.path.exists(os.path.join(bindir, "torchserve")):
        raise RuntimeError("needs java 17 and torchserve (make bench-env)")
    home = os.path.join(tmp, f"torchserve-{workers}")
    store = os.path.join(home, "store")
    os.makedirs(store, exist_ok=True)
    handler = os.path.join(home, "digits_handler.py")
    with open(handler, "w") as fh:
        fh.write(TORCHSERVE_HANDLER)
    subprocess.run(
        [
            os.path.join(bindir, "torch-model-archiver"),
            "--model-name",
            "digits",
            "--version",
            "1.0",
            "--handler",
            handler,
            "--export-path",
            store,
            "--force",
        ],  # fmt: skip
        check=True,
        capture_output=True,
    )
    port, mgmt, metrics = free_port(), free_port(), free_port()
    models = {
        "digits": {
            "1.0": {
                "defaultVersion": True,
                "marName": "digits.mar",
                "minWorkers": workers,
                "maxWorkers": workers,
                "batchSize": 8,
                "maxBatchDelay": 1,
                "responseTimeout": 120,
            }
        }
    }
    config = os.path.join(home, "config.properties")
    with open(config, "w") as fh:
        fh.write(
            f"inference_address=http://127.0.0.1:{port}\n"
            f"management_address=http://127.0.0.1:{mgmt}\n"
            f"metrics_address=http://127.0.0.1:{metrics}\n"
            "disable_system_metrics=true\n"
            f"model_store={store}\nload_models=digits.mar\nmodels={json.dumps(models)}\n"
        )
    # warnings only: by default it logs every request and its metrics (CPU it need not spend)
    log_config = os.path.join(home, "log4j2.xml")
    with open(log_config, "w") as fh:
        fh.write(TORCHSERVE_LOG4J)
    log = open(os.path.join(home, "ts.log"), "wb")  # noqa: SIM115 - the server's, kept
    proc = subprocess.Popen(
        [
            os.path.join(bindir, "torchserve"),
            "--start",
            "--foreground",
            "--ncs",
            "--disable-token-auth",
            "--model-store",
            store,
            "--ts-config",
            config,
            "--log-config",
            log_config,
        ],  # fmt: skip
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=home,
        env=_bench_env(
            DIGITS_MODEL_DIR=model_dir,
            LOG_LOCATION=home,
            METRICS_LOCATION=home,
            **_peer_threads(workers),
        ),
        start_new_session=True,
    )
    # /ping answers before the model's workers are up: wait for a prediction
    body = json.dumps({"instances": [[[[0.0]] * 8] * 8]})
    deadline = time.monotonic() + 180
    while True:
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            conn.request("POST", "/predictions/digits", body, {"Content-Type": "application/json"})
            if conn.getresponse().status == 200:
                return proc, port
        except OSError:
            pass
        if time.monotonic() > deadline or proc.poll() is not None:
            stop(proc)
            raise RuntimeError(f"torchserve did not serve the model; see {home}/ts.log")
        time.sleep(0.5)


# Triton through PyTriton: Triton's C++ HTTP front end and dynamic batcher, the model in a
# Python process of its own. Its model stub needs a Python PyTriton supports: it runs in
# .venv-triton (make bench-env, Python 3.12 through pyenv when there is one), with its own
# TensorFlow of the same version. Requests are Triton's (KServe v2) JSON.
PYTRITON = r"""
import os, sys
import numpy as np
import tensorflow as tf
from pytriton.decorators import batch
from pytriton.model_config import DynamicBatcher, ModelConfig, Tensor
from pytriton.triton import Triton, TritonConfig
model_dir, port, workers = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
fn = tf.saved_model.load(model_dir + "/1").signatures["serving_default"]
@batch
def infer(pixels):
    return {"output_0": fn(pixels=tf.constant(pixels))["output_0"].numpy()}
config = TritonConfig(http_address="127.0.0.1", http_port=port, grpc_port=int(sys.argv[4]),
                      metrics_port=int(sys.argv[5]), allow_metrics=False, log_verbose=0)
with Triton(config=config) as triton:
    triton.bind(
        model_name="digits",
        infer_func=[infer] * workers,
        inputs=[Tensor(name="pixels", dtype=np.float32, shape=(8, 8, 1))],
        outputs=[Tensor(name="output_0", dtype=np.float32, shape=(10,))],
        config=ModelConfig(
            max_batch_size=8, batcher=DynamicBatcher(max_queue_delay_microseconds=1000)
        ),
        strict=False,
    )
    triton.serve()
"""
TRITON_PY = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), ".venv-triton", "bin", "python"
)


def triton_body(x: Any) -> bytes:
    return json.dumps(
        {
            "inputs": [
                {
                    "name": "pixels",
                    "shape": list(x.shape),
                    "datatype": "FP32",
                    "data": x.reshape(-1).tolist(),
                }
            ]
        }  # fmt: skip
    ).encode()


def start_pytriton(model_dir: str, tmp: str, workers: int) -> tuple[subprocess.Popen, int]:
    if not os.path.exists(TRITON_PY):
        raise RuntimeError("needs .venv-triton with nvidia-pytriton (make bench-env)")
    port, grpc, metrics = free_port(), free_port(), free_port()
    script = os.path.join(tmp, "pytriton_digits.py")
    with open(script, "w") as fh:
        fh.write(PYTRITON)
    log = open(os.path.join(tmp, f"pytriton-{workers}.log"), "wb")  # noqa: SIM115 - kept
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(_peer_threads(workers))
    # the model stub links libpython; a pyenv Python keeps it beside itself, off the
    # loader's path
    libdir = subprocess.run(
        [TRITON_PY, "-c", "import sysconfig; print(sysconfig.get_config_var('LIBDIR'))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    env["LD_LIBRARY_PATH"] = os.pathsep.join(
        p for p in (libdir, os.environ.get("LD_LIBRARY_PATH", "")) if p
    )
    proc = subprocess.Popen(
        [TRITON_PY, script, model_dir, str(port), str(workers), str(grpc), str(metrics)],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
        start_new_session=True,
    )
    wait_http(proc, port, "/v2/models/digits/ready")
    return proc, port


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(proc: subprocess.Popen, port: int, path: str, timeout: float = 180) -> None:
    """Until ``GET path`` answers 200 (a peer that loads its model first); on failure the
    server is stopped (nothing left running)."""
    import http.client

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            stop(proc)
            raise RuntimeError(f"exited with code {proc.returncode} before serving")
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            conn.request("GET", path)
            if conn.getresponse().status == 200:
                return
        except OSError:
            pass
        time.sleep(0.25)
    stop(proc)
    raise TimeoutError(f"nothing answered 200 on {path} within {timeout:.0f} s")


def _needs(module: str) -> None:
    """A peer or front end that is not installed is a row that says so."""
    import importlib.util

    if importlib.util.find_spec(module) is None:
        raise RuntimeError(f"{module} is not installed here: run `make bench-env` and use "
                           ".venv-bench/bin/python")  # fmt: skip


def _bench_env(**extra: str) -> dict[str, str]:
    here = os.path.dirname(os.path.abspath(__file__))
    src = os.path.join(os.path.dirname(here), "src")
    path = os.pathsep.join(p for p in (src, here, os.environ.get("PYTHONPATH", "")) if p)
    return dict(os.environ, PYTHONPATH=path, **extra)


def start_granian(target: str, workers: int = 1, **env: str) -> tuple[subprocess.Popen, int]:
    """granian (Rust HTTP/1 front end, ASGI) serving ``benchmarks/serving_frontends.py``'s
    ``target``: one runtime thread and uvloop per worker, as a shipyard worker has."""
    _needs("granian")
    port = free_port()
    proc = subprocess.Popen(
        [
            PY,
            "-m",
            "granian",
            "--interface",
            "asgi",
            "--http",
            "1",
            "--no-ws",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--workers",
            str(workers),
            "--runtime-threads",
            "1",
            "--loop",
            "uvloop",
            "--log-level",
            "warning",
            "--no-access-log",
            f"serving_frontends:{target}",
        ],  # fmt: skip
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=_bench_env(**env),
        start_new_session=True,
    )
    wait_http(proc, port, "/ping")
    return proc, port


# The client's ceiling: a C epoll server answering every request with a canned 200
# (no Python, no model). Built with the system C compiler when there is one.
CANNED_C = r"""
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <arpa/inet.h>
#define MAXC 4096
static char buf[MAXC][16384]; static int used[MAXC];
static const char R[] = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}";
int main(void) {
  int ls = socket(AF_INET, SOCK_STREAM, 0), one = 1;
  struct sockaddr_in a = {0}; a.sin_family = AF_INET; a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(ls, (void*)&a, sizeof a); listen(ls, 1024);
  socklen_t l = sizeof a; getsockname(ls, (void*)&a, &l); printf("%d\n", ntohs(a.sin_port)); fflush(stdout);
  int ep = epoll_create1(0); struct epoll_event ev = {.events = EPOLLIN, .data.fd = ls}, evs[64];
  epoll_ctl(ep, EPOLL_CTL_ADD, ls, &ev);
  for (;;) {
    int n = epoll_wait(ep, evs, 64, -1);
    for (int i = 0; i < n; i++) {
      int fd = evs[i].data.fd;
      if (fd == ls) {
        int c = accept(ls, 0, 0); if (c < 0) continue; if (c >= MAXC) { close(c); continue; }
        setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one); used[c] = 0;
        struct epoll_event e = {.events = EPOLLIN, .data.fd = c}; epoll_ctl(ep, EPOLL_CTL_ADD, c, &e);
        continue;
      }
      int r = read(fd, buf[fd] + used[fd], sizeof buf[fd] - 1 - used[fd]);
      if (r <= 0) { close(fd); continue; }
      used[fd] += r; buf[fd][used[fd]] = 0;
      for (;;) {
        char *end = strstr(buf[fd], "\r\n\r\n"); if (!end) break;
        char *cl = strcasestr(buf[fd], "content-length:");
        int total = (end + 4 - buf[fd]) + ((cl && cl < end) ? atoi(cl + 15) : 0);
        if (total > used[fd] || write(fd, R, sizeof R - 1) < 0) break;
        memmove(buf[fd], buf[fd] + total, used[fd] - total + 1); used[fd] -= total;
      }
    }
  }
}
"""


def build_loadgen(tmp: str) -> str | None:
    """serving_loadgen.c built with the system C compiler, or None without one."""
    if not shutil.which("cc"):
        return None
    exe = os.path.join(tmp, "loadgen")
    subprocess.run(
        ["cc", "-O2", "-o", exe, os.path.join(os.path.dirname(__file__), "serving_loadgen.c")],
        check=True,
        capture_output=True,
    )
    return exe


def start_canned(tmp: str) -> tuple[subprocess.Popen, int]:
    src, exe = os.path.join(tmp, "canned.c"), os.path.join(tmp, "canned")
    with open(src, "w") as fh:
        fh.write(CANNED_C)
    subprocess.run(["cc", "-O2", "-o", exe, src], check=True, capture_output=True)
    proc = subprocess.Popen([exe], stdout=subprocess.PIPE, text=True)
    return proc, int(proc.stdout.readline())


def start_script(code: str, *args: str) -> tuple[subprocess.Popen, int]:
    src = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src")
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join(p for p in (src, os.environ.get("PYTHONPATH", "")) if p),
    )
    proc = subprocess.Popen(
        [PY, "-c", code, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
    )
    return proc, int(proc.stdout.readline())


def stop(proc: subprocess.Popen) -> None:
    """SIGTERM (to the process group when the server leads one: peers with workers),
    then SIGKILL after 30 s; no process is left behind."""
    try:
        group = os.getpgid(proc.pid) == proc.pid
    except ProcessLookupError:
        return
    kill = (lambda sig: os.killpg(proc.pid, sig)) if group else proc.send_signal
    kill(signal.SIGTERM)
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        kill(signal.SIGKILL)
        proc.wait()
    if group:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # workers that outlived their master
        except ProcessLookupError:
            pass


def median(rows: list[dict]) -> dict:
    return {k: statistics.median(r[k] for r in rows) for k in rows[0]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument(
        "--peers",
        action="store_true",
        help="only shipyard with batching and the peer servers (TorchServe, LitServe), "
        "c=1 and c=8 (they need `make bench-env`)",
    )
    ap.add_argument(
        "--ab",
        action="store_true",
        help="only the front-end A/B: the same handler behind shipyard's front end "
        "(uvicorn) and granian (echo, and the model with batching at c=8)",
    )
    ap.add_argument(
        "--quick",
        action="store_true",
        help="only shipyard with batching, 1 and 2 workers, at c=8 (A/B runs of a "
        "change); no in-process rows, no ratios",
    )
    args = ap.parse_args()
    import numpy as np

    tmp = tempfile.mkdtemp(prefix="serving-bench-")
    model_dir = os.path.join(tmp, "model")
    p = mp.Process(target=export_model, args=(model_dir,))
    p.start()
    p.join()
    x = np.random.default_rng(0).random((1, 8, 8, 1), dtype=np.float32)
    body = json.dumps({"instances": x.tolist()}).encode()

    results: dict[str, dict] = {}
    one = max(1, _threads() - 1)
    in_process_rows = (
        ()
        if args.quick or args.ab
        else ((1, 0, False), (8, 0, False), (8, one, False), (8, one, True))
    )
    for batch, threads, direct in in_process_rows:
        runs = []
        for _ in range(args.repeats):
            q: mp.Queue = mp.Queue()
            proc = mp.Process(
                target=in_process, args=(model_dir, batch, args.seconds, q, threads, direct)
            )
            proc.start()
            runs.append(q.get())
            proc.join()
        label = f", {threads} thread(s)" if threads else ""
        kind = "server's direct call" if direct else "signature call"
        results[f"in-process {kind}, batch {batch}{label}"] = median(runs)
    loadgen = build_loadgen(tmp)

    servers = {
        "shipyard, no batching": lambda: start_shipyard(model_dir, tmp),
        "shipyard, batching 8/1ms": lambda: start_shipyard(
            model_dir, tmp, "--batch-size", "8", "--batch-wait-ms", "1"
        ),
        "shipyard, 2 workers, batching 8/1ms": lambda: start_shipyard(
            model_dir, tmp, "--workers", "2", "--batch-size", "8", "--batch-wait-ms", "1"
        ),
        "stdlib http.server + model": lambda: start_script(STDLIB_SERVER, "model", model_dir),
        "shipyard HTTP layer echo (no model)": lambda: start_script(SHIPYARD_ECHO),
    }
    if shutil.which("cc"):
        servers["C canned response (client ceiling)"] = lambda: start_canned(tmp)
    # the front-end A/B: the same handler (echo; the whole model server) behind granian;
    # rows whose server is not installed say so. (The hand-written httptools layer that
    # uvicorn replaced was last measured against it at commit add9cf0: BENCHMARKS.md.)
    frontends = {
        "granian echo (same handler, ASGI)": lambda: start_granian("echo"),
        "shipyard on granian, batching 8/1ms": lambda: start_granian(
            "model", SERVING_MODEL_DIR=model_dir
        ),
        "shipyard on granian, 2 workers, batching 8/1ms": lambda: start_granian(
            "model", 2, SERVING_MODEL_DIR=model_dir, SERVING_WORKERS="2"
        ),
    }
    servers.update(frontends)
    # peers: the model servers users would pick instead, same model, threads and cores
    peers = {
        "TorchServe (Java front end), batching 8/1ms": lambda: start_torchserve(model_dir, tmp, 1),
        "TorchServe (Java front end), 2 workers, batching 8/1ms": lambda: start_torchserve(
            model_dir, tmp, 2
        ),
        "Triton via PyTriton (C++ front end), batching 8/1ms": lambda: start_pytriton(
            model_dir, tmp, 1
        ),
        "Triton via PyTriton (C++ front end), 2 workers, batching 8/1ms": lambda: start_pytriton(
            model_dir, tmp, 2
        ),
        "LitServe (Python), batching 8/1ms": lambda: start_litserve(model_dir, tmp, 1),
        "LitServe (Python), 2 workers, batching 8/1ms": lambda: start_litserve(model_dir, tmp, 2),
    }
    servers.update(peers)
    if args.peers:
        servers = {
            k: v
            for k, v in servers.items()
            if k in peers or k.startswith(("shipyard, batching", "shipyard, 2 workers"))
        }
    if args.ab:
        servers = {
            k: v
            for k, v in servers.items()
            if k not in peers and ("echo" in k or "batching 8" in k)
        }
        servers.pop("stdlib http.server + model", None)
    if args.quick:
        servers = {k: v for k, v in servers.items() if "batching 8" in k}
    skipped: dict[str, str] = {}
    for name, start in servers.items():
        try:
            proc, port = start()
        except Exception as exc:  # noqa: BLE001 - a server that cannot start is reported, not fatal
            skipped[name] = f"{type(exc).__name__}: {exc}"
            print(f"{name}: did not start: {skipped[name]}", flush=True)
            continue
        path, req = "/invocations", body
        if name.startswith("TorchServe"):
            path = "/predictions/digits"
        elif name.startswith("Triton"):
            path, req = "/v2/models/digits/infer", triton_body(x)
        try:
            if loadgen:  # one untimed second first, for every server alike (a JIT warms up)
                load_c(loadgen, tmp, port, req, 8, 1.0, path)
            for conc in (8,) if args.quick or (args.ab and "echo" not in name) else (1, 8):
                rows = [
                    run_load(port, req, conc, args.seconds, proc.pid, loadgen, tmp, path)
                    for _ in range(args.repeats)
                ]
                results[f"{name}, c={conc}"] = median(rows)
        finally:
            stop(proc)

    print(
        f"\nserving benchmark: digits CNN, one instance per request, {os.cpu_count()} cores, "
        f"median of {args.repeats} x {args.seconds:.0f} s; CPU in us per request (server "
        "process tree, client process) or per row (in-process)"
    )
    print(
        f"{'configuration':44s} {'req/s':>9s} {'p50 ms':>8s} {'p99 ms':>8s} "
        f"{'srv us':>8s} {'cli us':>8s}"
    )
    for name, r in results.items():
        if "rows_s" in r:
            print(f"{name:44s} {r['rows_s']:9.0f}   rows/s, {r['cpu_us_row']:.0f} us CPU/row")
        else:
            print(
                f"{name:44s} {r['req_s']:9.0f} {r['p50_ms']:8.2f} {r['p99_ms']:8.2f} "
                f"{r['server_us']:8.0f} {r['client_us']:8.0f}"
            )
    for name, why in skipped.items():
        print(f"{name:44s} not measured: {why}")
    print(
        "TF Serving: not measured; its binary (tensorflow_model_server) is not installable "
        "here (no PyPI or Debian package; the docker image and Google's apt repository are "
        "out of reach)"
    )
    if args.quick or args.ab or args.peers:
        ab = [
            (k, r["req_s"])
            for k, r in results.items()
            if "c=8" in k and ("echo" in k or "batching" in k)
        ]
        for k, v in ab:
            print(f"A/B {k}: {v:.0f} req/s")
        result_line(results, None)
        return
    # the server row: the better of 1 and 2 workers with batching (a configuration choice)
    best_name = max(
        ("shipyard, batching 8/1ms, c=8", "shipyard, 2 workers, batching 8/1ms, c=8"),
        key=lambda k: results[k]["req_s"],
    )
    best = results[best_name]
    # the denominator: the faster of the two thread settings of the signature call, the
    # model's in-process predict as a user calls it
    b8 = max(
        (r for k, r in results.items() if k.startswith("in-process signature call, batch 8")),
        key=lambda r: r["rows_s"],
    )
    direct = results["in-process server's direct call, batch 8, " + f"{one} thread(s)"]
    print(f"\nserver row: {best_name}; load generator: {'C' if loadgen else 'Python asyncio'}")
    print(
        "ratio shipyard c=8 with batching / in-process batch 1: "
        f"{best['req_s'] / results['in-process signature call, batch 1']['rows_s']:.2f}"
    )
    print(
        "ratio shipyard c=8 with batching / in-process batch 8: "
        f"{best['req_s'] / b8['rows_s']:.2f} (goal 0.6, stretch 0.8; the faster signature-call row)"
    )
    print(
        "ratio shipyard c=8 with batching / the server's own call in-process, batch 8: "
        f"{best['req_s'] / direct['rows_s']:.2f}"
    )
    print(
        "ratio shipyard c=8 with batching / stdlib server c=8: "
        f"{best['req_s'] / results['stdlib http.server + model, c=8']['req_s']:.2f}"
    )
    # the ceiling on this machine: every request costs the server its CPU time and the
    # client its own, and both share os.cpu_count() cores with nothing else
    per_req = best["server_us"] + best["client_us"]
    print(
        f"CPU per request, server + client: {per_req:.0f} us -> at most "
        f"{os.cpu_count() * 1e6 / per_req:.0f} req/s on {os.cpu_count()} cores; in-process "
        f"batch 8 needs {b8['cpu_us_row']:.0f} us per row (signature call), "
        f"{direct['cpu_us_row']:.0f} (direct call)"
    )
    print(json.dumps(results))
    result_line(results, b8["rows_s"])


def _best(results: dict[str, dict], prefix: str) -> tuple[str, dict] | None:
    """The faster c=8 row among the 1- and 2-worker rows whose name starts with prefix."""
    rows = [(k, r) for k, r in results.items() if k.startswith(prefix) and k.endswith("c=8")]
    return max(rows, key=lambda kr: kr[1]["req_s"]) if rows else None


def result_line(results: dict[str, dict], inprocess_b8: float | None) -> None:
    """Ratios of the same run, then the RESULT line: shipyard's best c=8 batching row,
    over in-process batch 8, and over the best peer (and the best Python-only peer);
    the front-end A/B as granian / shipyard's (uvicorn), for the echo and the model rows."""
    from _result import result

    ours = _best(results, "shipyard, ") or _best(results, "shipyard on ")
    if ours is None:
        return
    ours_name, best = ours
    print(f"shipyard's row: {ours_name}: {best['req_s']:.0f} req/s, p99 {best['p99_ms']:.2f} ms")
    fields: dict[str, object] = {"req_s": best["req_s"]}
    if inprocess_b8:
        fields["inprocess_ratio"] = best["req_s"] / inprocess_b8
    peers = [p for p in (_best(results, k) for k in ("TorchServe", "Triton", "LitServe")) if p]
    if peers:
        name, row = max(peers, key=lambda kr: kr[1]["req_s"])
        fields["best_peer"] = name.split(" (")[0]
        fields["peer_ratio"] = best["req_s"] / row["req_s"]
        python_only = _best(results, "LitServe")
        if python_only:
            fields["python_peer_ratio"] = best["req_s"] / python_only[1]["req_s"]
        for pname, prow in peers:
            print(f"ratio shipyard / {pname}: {best['req_s'] / prow['req_s']:.2f}")
    ours_echo = results.get("shipyard HTTP layer echo (no model), c=8")
    for front in ("granian",):
        echo = results.get(f"{front} echo (same handler, ASGI), c=8")
        model = _best(results, f"shipyard on {front}")
        ours_model = _best(results, "shipyard, ")
        if echo and ours_echo:
            fields[f"{front}_echo_ratio"] = echo["req_s"] / ours_echo["req_s"]
        if model and ours_model:
            fields[f"{front}_ratio"] = model[1]["req_s"] / ours_model[1]["req_s"]
    fields["p99_ms"] = best["p99_ms"]
    result("serving", **fields)


if __name__ == "__main__":
    main()
