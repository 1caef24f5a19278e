"""Failure teardown: from one instance's failure to the whole job being down.

    python benchmarks/failure_teardown.py [--runs 5] [--instances 3]

algo-2 raises 0.5 s after its start while the other instances sleep for a minute; the
job must end Failed with the others stopped. Measured side by side with the same
failing script run as a bare ``python`` process (the anchor: what the failure itself
costs), as wall time of ``fit()``. The functional test (tests/integration/test_failure.py)
checks the statuses; this script measures how fast they are reached.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

SCRIPT = """
import os, time
if os.environ.get("SM_CURRENT_HOST", "algo-2") == "algo-2":
    time.sleep(0.5)
    raise RuntimeError("algo-2 fails on purpose")
time.sleep(60)
"""


def run_job(src: str, home: str, instances: int, name: str) -> float:
    import shipyard
    from shipyard.errors import JobFailedError

    est = shipyard.Estimator(
        entry_point="fail.py",
        source_dir=src,
        instance_count=instances,
        instance_type="local",
        session=shipyard.Session(home=home),
    )
    start = time.perf_counter()
    try:
        est.fit(job_name=name, logs=False)
    except JobFailedError:
        pass
    else:
        raise RuntimeError("the job was expected to fail")
    return time.perf_counter() - start


def run_bare(script: str) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, script], stderr=subprocess.DEVNULL, check=False)
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--instances", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "src")
        os.makedirs(src)
        script = os.path.join(src, "fail.py")
        with open(script, "w") as fh:
            fh.write(SCRIPT)
        jobs, bare = [], []
        for i in range(args.runs):
            jobs.append(run_job(src, os.path.join(tmp, "home"), args.instances, f"fail-{i}"))
            bare.append(run_bare(script))
            print(f"run {i + 1}: job {jobs[-1]:.2f} s, bare process {bare[-1]:.2f} s", flush=True)
    job, alone = statistics.median(jobs), statistics.median(bare)
    print(
        f"median: {args.instances}-instance job down in {job:.2f} s, the bare failing process "
        f"in {alone:.2f} s: teardown costs {job - alone:.2f} s"
    )
    from _result import result

    result("failure_teardown", job_s=job, bare_s=alone, teardown_s=job - alone)


if __name__ == "__main__":
    main()
