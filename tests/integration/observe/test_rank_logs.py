"""An mpi job over 2 instances: each rank's lines carry its own host and rank, and
``shipyard logs JOB --host algo-2`` shows the lines of the ranks on algo-2."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

import shipyard

SCRIPT = r"""
import os, sys
rank = int(os.environ["OMPI_COMM_WORLD_RANK"])
print(f"hello from {os.environ['SM_CURRENT_HOST']} as {rank}", flush=True)
print(f"loss={0.5 + rank}", flush=True)
print("2026-11-25 11:50:01.200000: I tensorflow/core/util/port.cc:153] oneDNN custom operations are on. You may see slightly different numerical results", file=sys.stderr, flush=True)
"""


@pytest.mark.timeout(120)
def test_mpi_rank_lines_under_their_host(session, write_script, home):
    pytest.importorskip("mpi4py")
    est = shipyard.Estimator(
        entry_point="train.py",
        source_dir=write_script("train.py", SCRIPT),
        instance_count=2,
        instance_type="local",
        session=session,
        distribution={"mpi": {"enabled": True, "processes_per_host": 2}},
        metric_definitions=[{"Name": "loss", "Regex": r"loss=([0-9.]+)"}],
    )
    est.fit(job_name="mpi-logs", logs=False)
    run = lambda *a: subprocess.run(  # noqa: E731
        [sys.executable, "-m", "shipyard.cli", *a],
        capture_output=True,
        text=True,
        env=dict(os.environ),
        timeout=60,
    )
    algo2 = run("logs", "mpi-logs", "--host", "algo-2")
    assert algo2.returncode == 0, algo2.stderr
    lines = algo2.stdout.splitlines()
    assert "[algo-2 rank 2] hello from algo-2 as 2" in lines
    assert "[algo-2 rank 3] hello from algo-2 as 3" in lines
    assert not [
        ln for ln in lines if ln.startswith(("[algo-1", "[algo-2 rank 0", "[algo-2 rank 1"))
    ]
    assert "oneDNN" not in algo2.stdout  # framework noise hidden by default ...
    assert "oneDNN" in run("logs", "mpi-logs", "--host", "algo-2", "--all").stdout  # ... kept
    algo1 = run("logs", "mpi-logs", "--host", "algo-1").stdout
    assert "[algo-1 rank 0] hello from algo-1 as 0" in algo1 and "rank 2]" not in algo1
    bad = run("logs", "mpi-logs", "--host", "algo-9")
    assert bad.returncode == 2 and "algo-1, algo-2" in bad.stderr
    hosts = {m["host"] for m in session.control.store.metrics("mpi-logs")}
    assert hosts == {f"algo-{r // 2 + 1} rank {r}" for r in range(4)}


@pytest.mark.timeout(120)
def test_follow_one_host_of_a_running_job(home, write_script):
    src = write_script(
        "slow.py",
        "import os, time\nfor i in range(4):\n"
        "    print(f\"{os.environ['SM_CURRENT_HOST']} step {i}\", flush=True)\n"
        "    time.sleep(0.4)\n",
    )

    def run(*a):
        return subprocess.run(
            [sys.executable, "-m", "shipyard.cli", *a],
            capture_output=True,
            text=True,
            env=dict(os.environ),
            timeout=90,
        )

    started = run("train", "slow.py", "--source-dir", src, "-n", "2", "--detach")
    assert started.returncode == 0, started.stderr
    followed = run("logs", started.stdout.strip(), "--follow", "--host", "algo-2")
    assert followed.returncode == 0, followed.stderr
    steps = [ln for ln in followed.stdout.splitlines() if " step " in ln]
    assert steps == [f"[algo-2] algo-2 step {i}" for i in range(4)], followed.stdout
