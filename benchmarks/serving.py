"""Serving throughput and latency of /invocations for the digits model (issue #8).

    .venv/bin/python benchmarks/serving.py [--seconds 3] [--repeats 3]

Side by side in one run, on the Keras digits CNN of examples/keras (exported SavedModel):

* in-process: the SavedModel's serving signature called in a loop at batch 1 and 8
  (rows/s), with the same thread settings a server worker gets;
* shipyard's server (1 worker): requests of one instance each at concurrency 1 and 8,
  without and with dynamic batching (--batch-size 8 --batch-wait-ms 1);
* a minimal stdlib ThreadingHTTPServer (TCP_NODELAY) running the same model per request,
  and a raw aiohttp echo (no model): the HTTP floor on this machine.

Load comes from an asyncio client in its own process speaking keep-alive HTTP/1.1 over
raw sockets. Figures are medians over --repeats runs; the ratio that matters is server
rows/s at concurrency 8 with batching over in-process rows/s at batch 1 (what each
request carries) and at batch 8 (what batching merges). The machine is shared: compare
within one run only.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
PY = sys.executable


def export_model(path: str) -> None:
    import keras

    keras.utils.set_random_seed(0)
    model = keras.Sequential([
        keras.Input((8, 8, 1), name="pixels"),
        keras.layers.Conv2D(16, 3, padding="same", activation="relu"),
        keras.layers.MaxPooling2D(), keras.layers.Flatten(),
        keras.layers.Dense(64, activation="relu"), keras.layers.Dense(10, activation="softmax")])
    model.export(os.path.join(path, "1"), verbose=False)


def _threads() -> int:
    return max(1, os.cpu_count() or 1)


def in_process(model_dir: str, batch: int, seconds: float, out: mp.Queue) -> None:
    """rows/s of the signature called directly (a fresh process, worker thread settings)."""
    n = str(_threads())
    os.environ.update(OMP_NUM_THREADS=n, TF_NUM_INTRAOP_THREADS=n, TF_NUM_INTEROP_THREADS="1")
    import numpy as np
    import tensorflow as tf

    fn = tf.saved_model.load(os.path.join(model_dir, "1"))
    sig = fn.signatures["serving_default"]
    x = np.random.default_rng(0).random((batch, 8, 8, 1), dtype=np.float32)
    for _ in range(50):
        sig(pixels=tf.constant(x))
    calls, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        sig(pixels=tf.constant(x))["output_0"].numpy()
        calls += 1
    out.put(calls * batch / (time.perf_counter() - start))


# -- load generator ----------------------------------------------------------------------
async def _connection(host: str, port: int, request: bytes, stop: float, lat: list) -> None:
    reader, writer = await asyncio.open_connection(host, port)
    writer.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    while True:
        t0 = time.perf_counter()
        if t0 > stop:
            break
        writer.write(request)
        head = await reader.readuntil(b"\r\n\r\n")
        if not head.startswith(b"HTTP/1.1 200"):
            raise RuntimeError(head.decode(errors="replace"))
        length = 0
        for line in head.split(b"\r\n"):
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":")[1])
        await reader.readexactly(length)
        lat.append(time.perf_counter() - t0)
    writer.close()


def load(host: str, port: int, body: bytes, concurrency: int, seconds: float,
         out: mp.Queue) -> None:
    request = (f"POST /invocations HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json"
               f"\r\nContent-Length: {len(body)}\r\n\r\n").encode() + body

    async def main() -> list:
        warm: list = []
        await asyncio.gather(*(_connection(host, port, request, time.perf_counter() + 0.5, warm)
                               for _ in range(concurrency)))
        lat: list = []
        start = time.perf_counter()
        await asyncio.gather(*(_connection(host, port, request, start + seconds, lat)
                               for _ in range(concurrency)))
        return [len(lat) / (time.perf_counter() - start), lat]

    rate, lat = asyncio.run(main())
    lat.sort()
    out.put({"req_s": rate, "p50_ms": lat[len(lat) // 2] * 1e3,
             "p99_ms": lat[int(len(lat) * 0.99)] * 1e3})


def run_load(port: int, body: bytes, concurrency: int, seconds: float) -> dict:
    q: mp.Queue = mp.Queue()
    p = mp.Process(target=load, args=("127.0.0.1", port, body, concurrency, seconds, q))
    p.start()
    result = q.get(timeout=seconds + 120)
    p.join()
    return result


# -- servers -------------------------------------------------------------------------------
def start_shipyard(model_dir: str, tmp: str, *args: str) -> tuple[subprocess.Popen, int]:
    state = os.path.join(tmp, f"state-{time.monotonic_ns()}.json")
    proc = subprocess.Popen([PY, "-m", "shipyard.serving", model_dir, "--port", "0",
                             "--state-file", state, *args], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    while True:
        try:
            with open(state) as fh:
                data = json.load(fh)
            if data["status"] == "InService":
                return proc, data["port"]
            if data["status"] == "Failed":
                raise RuntimeError(data["failure_reason"])
        except (OSError, ValueError, KeyError):
            pass
        time.sleep(0.1)


STDLIB_SERVER = r'''
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
'''

AIOHTTP_ECHO = r'''
import socket
from aiohttp import web
async def echo(request):
    return web.Response(body=await request.read(), content_type="application/json")
app = web.Application(); app.router.add_post("/invocations", echo)
sock = socket.socket(); sock.bind(("127.0.0.1", 0)); sock.listen(1024)
print(sock.getsockname()[1], flush=True)
web.run_app(app, sock=sock, access_log=None, print=None)
'''


def start_script(code: str, *args: str) -> tuple[subprocess.Popen, int]:
    proc = subprocess.Popen([PY, "-c", code, *args], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)
    return proc, int(proc.stdout.readline())


def stop(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()


def median(rows: list[dict]) -> dict:
    return {k: statistics.median(r[k] for r in rows) for k in rows[0]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--repeats", type=int, default=3)
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
    for batch in (1, 8):
        rates = []
        for _ in range(args.repeats):
            q: mp.Queue = mp.Queue()
            proc = mp.Process(target=in_process, args=(model_dir, batch, args.seconds, q))
            proc.start()
            rates.append(q.get())
            proc.join()
        results[f"in-process batch {batch}"] = {"rows_s": statistics.median(rates)}

    servers = {
        "shipyard, no batching": lambda: start_shipyard(model_dir, tmp),
        "shipyard, batching 8/1ms": lambda: start_shipyard(model_dir, tmp, "--batch-size", "8",
                                                           "--batch-wait-ms", "1"),
        "shipyard, 2 workers, batching 8/1ms": lambda: start_shipyard(
            model_dir, tmp, "--workers", "2", "--batch-size", "8", "--batch-wait-ms", "1"),
        "stdlib http.server + model": lambda: start_script(STDLIB_SERVER, "model", model_dir),
        "aiohttp echo (no model)": lambda: start_script(AIOHTTP_ECHO),
    }
    for name, start in servers.items():
        proc, port = start()
        try:
            for conc in (1, 8):
                rows = [run_load(port, body, conc, args.seconds) for _ in range(args.repeats)]
                results[f"{name}, c={conc}"] = median(rows)
        finally:
            stop(proc)

    print(f"\nserving benchmark: digits CNN, one instance per request, {os.cpu_count()} cores, "
          f"median of {args.repeats} x {args.seconds:.0f} s")
    print(f"{'configuration':44s} {'req/s':>9s} {'p50 ms':>8s} {'p99 ms':>8s}")
    for name, r in results.items():
        if "rows_s" in r:
            print(f"{name:44s} {r['rows_s']:9.0f}   (rows/s)")
        else:
            print(f"{name:44s} {r['req_s']:9.0f} {r['p50_ms']:8.2f} {r['p99_ms']:8.2f}")
    best = results["shipyard, batching 8/1ms, c=8"]["req_s"]
    print("\nratio shipyard c=8 with batching / in-process batch 1: "
          f"{best / results['in-process batch 1']['rows_s']:.2f}")
    print("ratio shipyard c=8 with batching / in-process batch 8: "
          f"{best / results['in-process batch 8']['rows_s']:.2f}")
    print("ratio shipyard c=8 with batching / stdlib server c=8: "
          f"{best / results['stdlib http.server + model, c=8']['req_s']:.2f}")
    print(json.dumps(results))


if __name__ == "__main__":
    main()
