"""CLI latency: whole `shipyard` processes, CPU (user+sys) and wall, beside Python's own.

    python benchmarks/cli_latency.py [--runs 9]

Times `shipyard --help`, `jobs`, `describe JOB`, `logs JOB` and `stop --help` as fresh
processes (``python -m shipyard.cli``, so interpreter start-up and every import count), and
beside them `python -c pass` (the floor) and `python -m pip --version` (a Python CLI users
know), all interleaved in the same run so the machine's load hits them alike. CPU is the
child's user+sys from ``os.wait4``'s rusage (what the process cost, whatever else runs);
wall is what a user waits. Medians of --runs. The goal (issue 40): each command <= 0.30 s
of CPU on a quiet 2-core machine.

The SHIPYARD_HOME is a fresh temporary one holding one finished job, run first through the
CLI itself (`shipyard train`, SHIPYARD_SANDBOX=off), so `jobs`, `describe` and `logs` read
a real record and a real log.
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

JOB = "cli-latency-job"


def timed(cmd: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(CPU user+sys, wall) of one child process run to its end."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    assert proc.stderr is not None
    err = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} exited {proc.returncode}: {err.decode()[-2000:]}")
    return usage.ru_utime + usage.ru_stime, wall


def finished_job(home: str, env: dict[str, str]) -> None:
    """One tiny job run to its end through the CLI, unsandboxed."""
    src = os.path.join(home, "src")
    os.makedirs(src)
    with open(os.path.join(src, "train.py"), "w") as fh:
        fh.write("print('epoch 1 loss=0.5')\nprint('done')\n")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "shipyard.cli",
            "-q",
            "train",
            "train.py",
            "--source-dir",
            src,
            "--job-name",
            JOB,
        ],
        check=True,
        env=env,
        stdout=subprocess.DEVNULL,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=9)
    args = parser.parse_args()
    cli = [sys.executable, "-m", "shipyard.cli"]
    cases = {
        "help": [*cli, "--help"],
        "jobs": [*cli, "jobs"],
        "describe": [*cli, "describe", JOB],
        "logs": [*cli, "logs", JOB],
        "stop_help": [*cli, "stop", "--help"],
        "python": [sys.executable, "-c", "pass"],
        "pip": [sys.executable, "-m", "pip", "--version"],
    }
    with tempfile.TemporaryDirectory(prefix="cli-latency-") as home:
        env = dict(os.environ, SHIPYARD_HOME=home, SHIPYARD_SANDBOX="off", COLUMNS="100")
        finished_job(home, env)
        cpu: dict[str, list[float]] = {k: [] for k in cases}
        wall: dict[str, list[float]] = {k: [] for k in cases}
        for cmd in cases.values():  # one untimed run each: page cache, bytecode
            timed(cmd, env)
        for _ in range(args.runs):
            for name, cmd in cases.items():
                c, w = timed(cmd, env)
                cpu[name].append(c)
                wall[name].append(w)
    load = os.getloadavg()[0]
    print(f"{args.runs} runs each, interleaved; load average at the end {load:.2f}")
    print(f"{'command':<12} {'cpu median':>11} {'cpu min':>9} {'wall median':>12}")
    med = {}
    for name in cases:
        med[name] = statistics.median(cpu[name])
        print(
            f"{name:<12} {med[name]:>10.3f}s {min(cpu[name]):>8.3f}s "
            f"{statistics.median(wall[name]):>11.3f}s"
        )
    result(
        "cli_latency",
        **{f"{name}_s": round(value, 3) for name, value in med.items()},
    )


if __name__ == "__main__":
    main()
