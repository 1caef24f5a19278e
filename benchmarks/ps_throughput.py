"""shipyard.ps push+pull throughput against raw loopback TCP, same bytes, same run.

Goal (issue: "shipyard.ps engine"): one worker doing push_pull of a whole model
against two shard processes on loopback reaches >= 0.5 (stretch 0.7) of what
plain Python sockets move in the same pattern.

What is measured, per model size (5 MB: the tutorial CNN's gradient size; 100 MB):

* ps:   ``PSClient.push_pull`` of every tensor (SGD on the shards, MACs on every
        message, placement ``auto``) with two ``python -m shipyard.ps.server``
        processes. Time from first byte out to last value in.
* tcp:  the same bytes per shard over plain sockets to two echo processes.
        ``tcp-saf`` (store and forward): each echo process reads its whole share,
        then sends it back, both connections at once (the pattern of a server
        that must see a whole message before answering). ``tcp-stream``: the
        echo returns each piece as it arrives and the client sends and receives
        at once (full duplex): the best plain sockets can do here.

Throughput = 2 x model bytes / time (bytes cross loopback both ways). PS and TCP
iterations are interleaved so machine noise hits both alike; medians are
reported, and the ratio is ps / best tcp. On a shared 2-core machine expect
+-20% run to run; compare ratios, not absolute numbers.

Two more rows:

* rtt1k: the round trip of a 1 KB push_pull (one 256-float tensor, one shard), median
  of ``--rtt-repeats`` calls, beside a 1 KB ping-pong over a plain socket to an echo
  process, interleaved in blocks.
* scaling: 1, 2 and 4 worker processes against 2 shards, each doing push_pull of the
  ``--scaling-mb`` model; aggregate GB/s = workers x 2 x model bytes x steps / the time
  from the first worker's start to the last one's end (all start at one barrier).

Ends with ``RESULT ps_throughput mb5=<ratio> mb100=<ratio> rtt1k_us=<median>`` (for the
default MAC, or the one given), then the scaling figures as ``w<N>_GBps``.

Run:  python benchmarks/ps_throughput.py [--sizes 5,100] [--repeats 15] [--mac aes-gmac|poly1305|hmac-sha256|blake3|all]
      [--rtt-repeats 2000] [--scaling 1,2,4] [--scaling-mb 5] [--scaling-steps 10]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import socket
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _result import result
from shipyard.ps import wire
from shipyard.ps.client import PSClient
from shipyard.ps.launch import start_shards, stop_shards
from shipyard.ps.placement import DEFAULT_CHUNK_BYTES

SECRET = "benchmark-secret"
PIECE = 1 << 20


def cnn_model() -> dict[str, np.ndarray]:
    """The tutorial Keras CIFAR-10 CNN (conv32 same, conv32, pool, conv64 same, conv64, pool,
    dense512, dense10): 1,250,858 float32 parameters, 5.0 MB."""
    shapes = {
        "conv1.weight": (32, 3, 3, 3),
        "conv1.bias": (32,),
        "conv2.weight": (32, 32, 3, 3),
        "conv2.bias": (32,),
        "conv3.weight": (64, 32, 3, 3),
        "conv3.bias": (64,),
        "conv4.weight": (64, 64, 3, 3),
        "conv4.bias": (64,),
        "dense1.weight": (512, 2304),
        "dense1.bias": (512,),
        "dense2.weight": (10, 512),
        "dense2.bias": (10,),
    }
    rng = np.random.default_rng(0)
    return {k: rng.standard_normal(s).astype(np.float32) for k, s in shapes.items()}


def big_model(total_mb: int) -> dict[str, np.ndarray]:
    """One embedding-like tensor (80%) and ten dense layers (20%)."""
    rng = np.random.default_rng(0)
    total = total_mb * 1_000_000 // 4
    emb = int(total * 0.8)
    layer = (total - emb) // 10
    out = {"embedding.weight": rng.standard_normal(emb).astype(np.float32).reshape(-1, 100)}
    for i in range(10):
        out[f"layer{i}.weight"] = rng.standard_normal(layer).astype(np.float32)
    return out


def model_of(mb: int) -> dict[str, np.ndarray]:
    return cnn_model() if mb <= 5 else big_model(mb)


# ---------------------------------------------------------------------------------- raw TCP
def _recv_exact(conn: socket.socket, view: memoryview) -> None:
    n = 0
    while n < len(view):
        r = conn.recv_into(view[n:])
        if not r:
            raise EOFError
        n += r


def _echo_server(port_q: mp.Queue, mode: str) -> None:
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    port_q.put(srv.getsockname()[1])
    conn, _ = srv.accept()
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    header = bytearray(8)
    buf = bytearray(0)
    while True:
        try:
            _recv_exact(conn, memoryview(header))
        except EOFError:
            return
        n = int.from_bytes(header, "little")
        if len(buf) < n:
            buf = bytearray(n)
        view = memoryview(buf)[:n]
        if mode == "saf":
            _recv_exact(conn, view)
            conn.sendall(view)
        else:
            for off in range(0, n, PIECE):
                piece = view[off : off + PIECE]
                _recv_exact(conn, piece)
                conn.sendall(piece)


class RawTcp:
    """Two echo processes and one client connection to each."""

    def __init__(self, mode: str) -> None:
        ctx = mp.get_context("spawn")
        q = ctx.Queue()
        self.procs = [
            ctx.Process(target=_echo_server, args=(q, mode), daemon=True) for _ in range(2)
        ]
        for p in self.procs:
            p.start()
        self.conns = []
        for _ in self.procs:
            c = socket.create_connection(("127.0.0.1", q.get(timeout=60)))
            c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.conns.append(c)

    def roundtrip(self, shares: list[memoryview], outs: list[memoryview]) -> float:
        def one(conn: socket.socket, data: memoryview, out: memoryview) -> None:
            sender = threading.Thread(
                target=lambda: (conn.sendall(len(data).to_bytes(8, "little")), conn.sendall(data))
            )
            sender.start()
            _recv_exact(conn, out)
            sender.join()

        t0 = time.perf_counter()
        threads = [
            threading.Thread(target=one, args=(c, d, o))
            for c, d, o in zip(self.conns, shares, outs)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return time.perf_counter() - t0

    def close(self) -> None:
        for c in self.conns:
            c.close()
        for p in self.procs:
            p.join(timeout=10)


# ---------------------------------------------------------------------------- round trip
def bench_rtt(mac: str, repeats: int, run_dir: str, block: int = 100) -> dict:
    """Median 1 KB push_pull round trip, beside a 1 KB ping-pong on a plain socket."""
    shards = start_shards(2, SECRET, run_dir=os.path.join(run_dir, f"rtt-{mac}"))
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    echo = ctx.Process(target=_echo_server, args=(q, "saf"), daemon=True)
    echo.start()
    conn = socket.create_connection(("127.0.0.1", q.get(timeout=60)))
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        client = PSClient(
            [s.endpoint for s in shards], worker_id=0, secret=SECRET, mac=mac, timeout=60
        )
        client.register({"x": np.zeros(256, np.float32)}, {"name": "sgd", "lr": 0.0})
        grads = {"x": np.ones(256, np.float32)}
        outs = {"x": np.empty(256, np.float32)}
        ping = (1024).to_bytes(8, "little") + bytes(1024)
        back = memoryview(bytearray(1024))
        ps_t: list[float] = []
        tcp_t: list[float] = []
        shard_procs = [psutil.Process(s.proc.pid) for s in shards]
        cpu = {"client": 0.0, "shards": 0.0}
        for i in range(repeats // block + 1):
            c0, s0 = time.process_time(), _cpu_s(shard_procs)
            for _ in range(block):
                t0 = time.perf_counter()
                client.push_pull(grads, outs=outs)
                ps_t.append(time.perf_counter() - t0)
            if i:  # CPU of the timed push_pull blocks only (not the ping-pong, not warm-up)
                cpu["client"] += time.process_time() - c0
                cpu["shards"] += _cpu_s(shard_procs) - s0
            for _ in range(block):
                t0 = time.perf_counter()
                conn.sendall(ping)
                _recv_exact(conn, back)
                tcp_t.append(time.perf_counter() - t0)
            if i == 0:  # warm-up block
                ps_t.clear()
                tcp_t.clear()
        client.close()
    finally:
        conn.close()
        echo.join(timeout=10)
        stop_shards(shards)
    return {
        "mac": mac,
        "ps_us": round(statistics.median(ps_t) * 1e6, 1),
        "tcp_us": round(statistics.median(tcp_t) * 1e6, 1),
        # CPU per round trip, client and both shards (what the round trip costs whichever
        # way a busy machine shares its cores)
        "cpu_us": {k: round(v / len(ps_t) * 1e6, 1) for k, v in cpu.items()},
    }


def _cpu_s(procs: list[psutil.Process]) -> float:
    """User + system CPU seconds of these processes so far."""
    return sum(t.user + t.system for t in (p.cpu_times() for p in procs))


# ------------------------------------------------------------------------------- scaling
def _scale_worker(
    endpoints: list[str], rank: int, mb: int, steps: int, mac: str, barrier, q
) -> None:
    params = model_of(mb)
    client = PSClient(endpoints, worker_id=rank, secret=SECRET, mac=mac, timeout=300)
    client.register(params, {"name": "sgd", "lr": 0.0})
    grads = {k: np.ones_like(v) for k, v in params.items()}
    outs = {k: np.empty_like(v) for k, v in params.items()}
    for _ in range(2):
        client.push_pull(grads, outs=outs)
    barrier.wait()
    t0, c0 = time.time(), time.process_time()
    for _ in range(steps):
        client.push_pull(grads, outs=outs)
    q.put((t0, time.time(), time.process_time() - c0))
    client.close()


def bench_scaling(mb: int, counts: list[int], steps: int, mac: str, run_dir: str) -> dict:
    """For each n: aggregate GB/s of ``n`` worker processes against two shards, and the
    CPU (workers' timed steps + shards' whole run, warm-up included) per GB moved."""
    nbytes = sum(v.nbytes for v in model_of(mb).values())
    ctx = mp.get_context("spawn")
    out = {}
    for n in counts:
        shards = start_shards(2, SECRET, run_dir=os.path.join(run_dir, f"scale-{n}"))
        try:
            eps = [s.endpoint for s in shards]
            shard_procs = [psutil.Process(s.proc.pid) for s in shards]
            s0 = [p.cpu_times() for p in shard_procs]
            barrier, q = ctx.Barrier(n), ctx.Queue()
            procs = [
                ctx.Process(target=_scale_worker, args=(eps, r, mb, steps, mac, barrier, q))
                for r in range(n)
            ]
            for p in procs:
                p.start()
            spans = [q.get(timeout=600) for _ in procs]
            for p in procs:
                p.join(timeout=60)
            shard_cpu = (
                sum(
                    (b.user + b.system) - (a.user + a.system)
                    for a, b in zip(s0, (p.cpu_times() for p in shard_procs))
                )
                * steps
                / (steps + 2)
            )  # the shards also served each worker's 2 warm-up steps
        finally:
            stop_shards(shards)
        wall = max(e for _, e, _ in spans) - min(s for s, _, _ in spans)
        moved = n * 2 * nbytes * steps / 1e9
        out[n] = {
            "GBps": round(moved / wall, 3),
            "cpu_s_per_GB": round((sum(c for _, _, c in spans) + shard_cpu) / moved, 3),
        }
    return out


# ---------------------------------------------------------------------------------- driver
def step_client(
    shards: list, mac: str, params: dict[str, np.ndarray], chunk_bytes: int = DEFAULT_CHUNK_BYTES
) -> tuple[PSClient, dict[str, np.ndarray], dict[str, np.ndarray]]:
    """One worker registered on ``shards`` (sgd at lr 0: the values stay put), with the
    gradient and output buffers every timed step reuses."""
    client = PSClient(
        [s.endpoint for s in shards],
        worker_id=0,
        secret=SECRET,
        heartbeat_interval=1.0,
        mac=mac,
        timeout=120,
    )
    client.register(params, {"name": "sgd", "lr": 0.0}, chunk_bytes=chunk_bytes)
    grads = {k: np.ones_like(v) for k, v in params.items()}
    outs = {k: np.empty_like(v) for k, v in params.items()}
    return client, grads, outs


def bench_size(
    mb: int, mac: str, repeats: int, run_dir: str, chunk_bytes: int = DEFAULT_CHUNK_BYTES
) -> dict:
    params = model_of(mb)
    nbytes = sum(v.nbytes for v in params.values())
    shards = start_shards(
        2, SECRET, run_dir=os.path.join(run_dir, f"{mb}-{mac}"), checkpoint_interval=0
    )
    tcp = {m: RawTcp(m) for m in ("saf", "stream")}
    try:
        client, grads, outs = step_client(shards, mac, params, chunk_bytes)
        shard_bytes = list(client.report.chosen.shard_bytes)
        blob = np.random.default_rng(1).integers(0, 255, nbytes, dtype=np.uint8)
        shares, offs = [], 0
        for b in shard_bytes:
            shares.append(memoryview(blob[offs : offs + b]))
            offs += b
        sink = [memoryview(bytearray(b)) for b in shard_bytes]
        times: dict[str, list[float]] = {"ps": [], "tcp-saf": [], "tcp-stream": []}
        messages_before = sum(st["messages_in"] for st in client.shard_stats())
        shard_procs = [psutil.Process(s.proc.pid) for s in shards]
        cpu = {"client": 0.0, "shards": 0.0}
        for i in range(repeats + 2):  # two warm-up rounds
            c0, s0 = time.process_time(), [p.cpu_times() for p in shard_procs]
            t0 = time.perf_counter()
            client.push_pull(grads, outs=outs)
            dt = time.perf_counter() - t0
            if i >= 2:  # CPU of this step alone: the raw-TCP rounds run outside it
                cpu["client"] += time.process_time() - c0
                cpu["shards"] += sum(
                    (b.user + b.system) - (a.user + a.system)
                    for a, b in zip(s0, (p.cpu_times() for p in shard_procs))
                )
            d_saf = tcp["saf"].roundtrip(shares, sink)
            d_stream = tcp["stream"].roundtrip(shares, sink)
            if i >= 2:
                times["ps"].append(dt)
                times["tcp-saf"].append(d_saf)
                times["tcp-stream"].append(d_stream)
        for k in params:
            assert np.array_equal(outs[k], params[k]), "lr=0: values must come back unchanged"
        # data messages per step (small tensors share one; a STATS request is one more)
        messages = (sum(st["messages_in"] for st in client.shard_stats()) - messages_before - 2) / (
            repeats + 2
        )
        report = client.stats()
        client.close()
    finally:
        for t in tcp.values():
            t.close()
        stop_shards(shards)
    med = {k: statistics.median(v) for k, v in times.items()}
    gbps = {k: 2 * nbytes / v / 1e9 for k, v in med.items()}
    best_tcp = max(gbps["tcp-saf"], gbps["tcp-stream"])
    return {
        "model_mb": round(nbytes / 1e6, 2),
        "mac": mac,
        "repeats": repeats,
        "policy": report["policy"],
        "imbalance": report["imbalance"][report["policy"]],
        "tensors_per_step": sum(len(kp.chunks) for kp in client.report.chosen.keys),
        "messages_per_step": round(messages, 2),
        "median_s": {k: round(v, 5) for k, v in med.items()},
        "GBps": {k: round(v, 3) for k, v in gbps.items()},
        "ratio_vs_best_tcp": round(gbps["ps"] / best_tcp, 3),
        "ratio_vs_tcp_saf": round(gbps["ps"] / gbps["tcp-saf"], 3),
        # CPU per step (all threads of the client, both shard processes): what the ratio
        # costs, and far less sensitive than wall time to a busy machine
        "cpu_ms_per_step": {k: round(v / repeats * 1e3, 1) for k, v in cpu.items()},
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="5,100", help="model sizes in MB (5 = the tutorial CNN)")
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument(
        "--mac",
        default="all",
        help="aes-gmac | poly1305 | hmac-sha256 | blake3 | all (those installed)",
    )
    ap.add_argument(
        "--chunk-mb",
        type=float,
        default=DEFAULT_CHUNK_BYTES / 2**20,
        help="placement chunk size (sliced policy) in MiB",
    )
    ap.add_argument("--rtt-repeats", type=int, default=2000, help="1 KB round trips (0: skip)")
    ap.add_argument("--scaling", default="1,2,4", help="worker counts ('' skips the row)")
    ap.add_argument("--scaling-mb", type=int, default=5)
    ap.add_argument("--scaling-steps", type=int, default=10)
    ap.add_argument("--json", default=None, help="also write the results here")
    args = ap.parse_args(argv)
    macs = wire.available_macs() if args.mac == "all" else [args.mac]
    headline = wire.default_mac() if args.mac == "all" else args.mac
    results = []
    rtt: dict = {}
    scaling: dict = {}
    with tempfile.TemporaryDirectory(prefix="ps-bench-") as run_dir:
        for mac in macs:
            for mb in (int(x) for x in args.sizes.split(",") if x):
                r = bench_size(mb, mac, args.repeats, run_dir, int(args.chunk_mb * 2**20))
                results.append(r)
                g = r["GBps"]
                print(
                    f"{r['model_mb']:>7.2f} MB  mac={mac:<11} policy={r['policy']:<7} "
                    f"{r['tensors_per_step']} tensors in {r['messages_per_step']:g} messages/step  "
                    f"ps {g['ps']:.2f} GB/s | tcp-saf {g['tcp-saf']:.2f} | tcp-stream {g['tcp-stream']:.2f} "
                    f"| ratio ps/best-tcp {r['ratio_vs_best_tcp']:.2f} (vs saf {r['ratio_vs_tcp_saf']:.2f}) "
                    f"| cpu ms/step client {r['cpu_ms_per_step']['client']:.1f} "
                    f"shards {r['cpu_ms_per_step']['shards']:.1f}",
                    flush=True,
                )
        if args.rtt_repeats:
            rtt = bench_rtt(headline, args.rtt_repeats, run_dir)
            print(
                f"1 KB push_pull round trip (mac={headline}): ps {rtt['ps_us']:.0f} us | "
                f"tcp ping-pong {rtt['tcp_us']:.0f} us | cpu us/round trip client "
                f"{rtt['cpu_us']['client']:.0f} shards {rtt['cpu_us']['shards']:.0f}",
                flush=True,
            )
        if args.scaling:
            counts = [int(x) for x in args.scaling.split(",")]
            scaling = bench_scaling(args.scaling_mb, counts, args.scaling_steps, headline, run_dir)
            print(
                f"scaling, {args.scaling_mb} MB model, 2 shards, aggregate GB/s (CPU s per GB): "
                + ", ".join(
                    f"{n} worker(s) {g['GBps']:.2f} ({g['cpu_s_per_GB']:.2f})"
                    for n, g in scaling.items()
                ),
                flush=True,
            )
    if args.json:
        Path(args.json).write_text(
            json.dumps({"sizes": results, "rtt1k": rtt, "scaling": scaling}, indent=1)
        )
    ratio = {r["model_mb"]: r["ratio_vs_best_tcp"] for r in results if r["mac"] == headline}
    cpu = {
        r["model_mb"]: sum(r["cpu_ms_per_step"].values()) for r in results if r["mac"] == headline
    }
    figures: dict = {}  # the issue's three first, in its order; then the supporting figures
    for mb in (5, 100):
        hit = [v for k, v in ratio.items() if round(k) == mb]
        if hit:
            figures[f"mb{mb}"] = hit[0]
    if rtt:
        figures["rtt1k_us"] = rtt["ps_us"]
        figures["tcp1k_us"] = rtt["tcp_us"]
        figures["cpu1k_us"] = round(sum(rtt["cpu_us"].values()), 1)
    for mb in (5, 100):
        hit = [v for k, v in cpu.items() if round(k) == mb]
        if hit:
            figures[f"cpu{mb}_ms"] = round(hit[0], 1)
    for r in results:
        if r["mac"] == headline and round(r["model_mb"]) in (5, 100):
            figures[f"mb{round(r['model_mb'])}_gbps"] = round(r["GBps"]["ps"], 3)
    figures.update({f"w{n}_GBps": g["GBps"] for n, g in scaling.items()})
    figures.update({f"w{n}_cpu_s_per_GB": g["cpu_s_per_GB"] for n, g in scaling.items()})
    result("ps_throughput", **figures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
