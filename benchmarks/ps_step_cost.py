"""What one shipyard.ps push_pull step costs the machine: CPU, wake-ups, system calls.

Why this exists (issue 17 part 5): on a shared machine wall-clock ratios swing run to
run, but CPU per step, wake-ups and system calls per step barely move with load, and
they say where a large step's CPU goes: how many ``recv_into`` (``recvfrom``),
``epoll_wait`` and ``sendmsg`` calls and how many sleeps (voluntary context switches)
a slice costs, on the client and on the shards, for a given slice size.

The model and the call are ``benchmarks/ps_throughput.py``'s (one worker, two shards,
SGD with lr 0, aes-gmac, ``auto`` placement with ``--chunk-mb``); three warm-up
steps, then ``--steps`` measured ones. CPU: ``time.process_time`` (client) and the
shard processes' user+system time (10 ms ticks: use enough steps). ``--syscalls``
also counts system calls with ``perf stat`` tracepoints over the measured steps
(needs ``perf`` and permission to trace: root, or perf_event_paranoid <= -1).

Run:  python benchmarks/ps_step_cost.py [--mb 100] [--chunk-mb 2] [--steps 15] [--syscalls]
Ends with ``RESULT ps_step_cost cpu_ms=.. client_ms=.. shards_ms=.. ...`` (per step).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _result import result
from ps_throughput import SECRET, model_of, step_client
from shipyard.ps.launch import start_shards, stop_shards

#: system calls counted with --syscalls (the receive, wait and send of the data path)
CALLS = ("recvfrom", "epoll_wait", "sendmsg")


def _perf_stat(pids: list[int], out: str) -> subprocess.Popen:
    events = ",".join(f"syscalls:sys_enter_{c}" for c in CALLS) + ",raw_syscalls:sys_enter"
    cmd = ["perf", "stat", "-x,", "--per-thread", "-e", events, "-p", ",".join(map(str, pids))]
    return subprocess.Popen([*cmd, "-o", out], stdout=subprocess.DEVNULL)


def _read_perf(path: str, client_pid: int) -> dict[str, float]:
    """perf's CSV (``comm-pid,count,,event,...`` per thread) -> side.call totals."""
    totals: dict[str, float] = {}
    for line in Path(path).read_text().splitlines():
        f = line.split(",")
        if len(f) < 4 or not f[1].isdigit():
            continue  # comments, "<not counted>" for threads that never ran
        side = "client" if f[0].endswith(f"-{client_pid}") else "shards"
        call = f[3].split(":")[-1].removeprefix("sys_enter_")
        key = f"{side}_{'syscalls' if call == 'sys_enter' else call}"
        totals[key] = totals.get(key, 0.0) + float(f[1])
    return totals


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=int, default=100, help="model size in MB (5 = the CNN)")
    ap.add_argument("--chunk-mb", type=float, default=2.0, help="placement chunk size, MiB")
    ap.add_argument("--steps", type=int, default=15)
    ap.add_argument("--syscalls", action="store_true", help="count system calls with perf")
    args = ap.parse_args(argv)
    params = model_of(args.mb)
    with tempfile.TemporaryDirectory() as run_dir:
        shards = start_shards(2, SECRET, run_dir=run_dir, checkpoint_interval=0)
        try:
            client, grads, outs = step_client(
                shards, "aes-gmac", params, int(args.chunk_mb * 2**20)
            )
            for _ in range(3):
                client.push_pull(grads, outs=outs)
            procs = [psutil.Process(s.proc.pid) for s in shards]
            me = psutil.Process()
            perf_out = os.path.join(run_dir, "perf.csv")
            perf = (
                _perf_stat([p.pid for p in procs] + [me.pid], perf_out) if args.syscalls else None
            )
            if perf is not None:
                time.sleep(0.5)  # perf attaches before the first measured step
            t0 = [p.cpu_times() for p in procs]
            w0 = sum(p.num_ctx_switches().voluntary for p in procs)
            c0, cw0 = time.process_time(), me.num_ctx_switches().voluntary
            for _ in range(args.steps):
                client.push_pull(grads, outs=outs)
            c1, cw1 = time.process_time(), me.num_ctx_switches().voluntary
            t1 = [p.cpu_times() for p in procs]
            w1 = sum(p.num_ctx_switches().voluntary for p in procs)
            counts: dict[str, float] = {}
            if perf is not None:
                perf.send_signal(signal.SIGINT)
                perf.wait()
                counts = _read_perf(perf_out, me.pid)
            keys = sum(len(kp.chunks) for kp in client.report.chosen.keys)
            client.close()
        finally:
            stop_shards(shards)
    n = args.steps
    shard_user = sum(b.user - a.user for a, b in zip(t0, t1)) / n * 1e3
    shard_sys = sum(b.system - a.system for a, b in zip(t0, t1)) / n * 1e3
    client_ms = (c1 - c0) / n * 1e3
    figures: dict[str, object] = {
        "mb": args.mb,
        "chunk_mb": args.chunk_mb,
        "keys": keys,
        "cpu_ms": round(client_ms + shard_user + shard_sys, 1),
        "client_ms": round(client_ms, 1),
        "shards_ms": round(shard_user + shard_sys, 1),
        "shards_user_ms": round(shard_user, 1),
        "shards_sys_ms": round(shard_sys, 1),
        "client_sleeps": round((cw1 - cw0) / n, 1),
        "shards_sleeps": round((w1 - w0) / n, 1),
    }
    figures.update({k: round(v / n, 1) for k, v in sorted(counts.items())})
    result("ps_step_cost", **figures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
