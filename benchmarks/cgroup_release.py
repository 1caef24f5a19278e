"""How long a job's cgroups take to go at its end, with a process still in each.

    PYTHONPATH=TREE/src .venv/bin/python benchmarks/cgroup_release.py [--runs 15]

Two instance cgroups (as a 2-instance job has), one ``sleep`` in each (an instance's init or
pasta still exiting when the supervisor releases the job); ``JobCgroups.release`` kills
them and removes the cgroups. Run it with two trees' ``PYTHONPATH`` for an A/B (issue 40:
a flat 10 ms sleep between looks, 10.7 ms a release, against 0.5 ms doubling, 1.2 ms).
Needs root (or a delegated cgroup hierarchy); ends with one RESULT line.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import time

from shipyard.sandbox import cgroups


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=15)
    args = parser.parse_args()
    if not cgroups.detect().usable:
        raise SystemExit("no usable cgroup hierarchy here (`shipyard doctor` says why)")
    times = []
    for i in range(args.runs):
        job = cgroups.create(
            f"bench-release-{os.getpid()}-{i}",
            {"algo-1": cgroups.Limits(), "algo-2": cgroups.Limits()},
        )
        procs = []
        for cg in job.instances.values():
            proc = subprocess.Popen(["sleep", "60"])
            cg.join(proc.pid)
            procs.append(proc)
        start = time.perf_counter()
        left = job.release()
        times.append(time.perf_counter() - start)
        for proc in procs:
            proc.wait()
        if left:
            raise SystemExit(f"cgroups left behind: {left}")
    median = statistics.median(times)
    print(
        f"release of 2 instance cgroups: median {median * 1e3:.2f} ms, max {max(times) * 1e3:.2f}"
    )
    print(f"RESULT cgroup_release runs={args.runs} median_s={median:.5f} max_s={max(times):.5f}")


if __name__ == "__main__":
    main()
