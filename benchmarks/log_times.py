"""The cost of per-line log times (issue 41): a chatty 2-instance job's lines/s, and the
supervisor's tailer with and without its ``.times`` sidecar.

    python benchmarks/log_times.py [--lines 200000] [--runs 3]
    PYTHONPATH=/path/to/older/src python benchmarks/log_times.py   # the same job, before

1. A job whose script prints ``--lines`` lines per instance as fast as it can (2
   instances, SHIPYARD_SANDBOX as set) through the real CLI; the script reports its own
   lines/s (what a chatty job would lose if the log path slowed it). Run it against the
   tree before the change (PYTHONPATH) for the "before" figure. Medians of --runs.
2. The tailer alone: a 50 MB log appended in 64 KiB chunks, ``LogTailer.poll`` after each
   chunk, ``index`` off and on: lines/s the supervisor's reader gets through.
Also the sidecar's size beside the log of job 1.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _result import result  # noqa: E402

SCRIPT = """\
import sys, time
n = int(sys.argv[sys.argv.index("--lines") + 1])
t = time.perf_counter()
for i in range(n):
    print(f"step {i} loss=0.{i % 1000:03d} some words to make a typical line", flush=True)
print(f"RATE {n / (time.perf_counter() - t):.0f}", flush=True)
"""


def job_rate(lines: int, root: str, run: int) -> tuple[float, int, int]:
    src = os.path.join(root, "src")
    os.makedirs(src, exist_ok=True)
    with open(os.path.join(src, "chatty.py"), "w") as fh:
        fh.write(SCRIPT)
    env = dict(os.environ, SHIPYARD_HOME=os.path.join(root, "home"))
    name = f"chatty-{run}"
    out = subprocess.run(
        [sys.executable, "-m", "shipyard.cli", "--quiet", "train", "chatty.py"]
        + ["--source-dir", src, "-n", "2", "-H", f"lines={lines}", "--job-name", name],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    rates = [float(ln.split()[-1]) for ln in out.stdout.splitlines() if " RATE " in ln]
    if out.returncode != 0 or len(rates) != 2:
        raise SystemExit(f"job failed: {out.stderr[-2000:]}")
    logs = os.path.join(root, "home", "jobs", name, "logs")
    log_size = os.path.getsize(os.path.join(logs, "algo-1.log"))
    times = os.path.join(logs, "algo-1.log.times")
    return statistics.mean(rates), log_size, os.path.getsize(times) if os.path.exists(times) else 0


def tailer_rate(root: str, index: bool) -> float:
    import inspect

    from shipyard.observe.logs import LogTailer

    if "index" not in inspect.signature(LogTailer).parameters:
        return float("nan")  # a tree from before the sidecar: only the job's figure
    path = os.path.join(root, f"tail-{index}.log")
    line = b"step 12345 loss=0.123 some words to make a typical line\n"
    chunk = line * (65536 // len(line))
    total = 0
    with open(path, "wb") as fh:
        tailer = LogTailer({"algo-1": path}, index=index)
        spent = 0.0
        for _ in range(50 * 1024 * 1024 // len(chunk)):
            fh.write(chunk)
            fh.flush()
            t = time.perf_counter()
            total += len(tailer.poll())
            spent += time.perf_counter() - t
    return total / spent


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lines", type=int, default=200_000)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as root:
        runs = [job_rate(args.lines, root, i) for i in range(args.runs)]
        rate = statistics.median(r[0] for r in runs)
        log_size, times_size = runs[0][1], runs[0][2]
        off = statistics.median(tailer_rate(root, False) for _ in range(args.runs))
        on = statistics.median(tailer_rate(root, True) for _ in range(args.runs))
    print(f"chatty job: {rate:,.0f} lines/s per instance (median of {args.runs})")
    print(f"algo-1.log {log_size:,} bytes, algo-1.log.times {times_size:,} bytes")
    print(f"tailer: {off:,.0f} lines/s without the sidecar, {on:,.0f} with it")
    result(
        "log_times",
        job_lines_per_s=rate,
        log_bytes=log_size,
        times_bytes=times_size,
        tailer_off=off,
        tailer_on=on,
    )


if __name__ == "__main__":
    main()
