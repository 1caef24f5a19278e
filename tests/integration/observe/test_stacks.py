"""Hang debugging: ``shipyard stacks JOB`` shows where every process of every instance
is; a silent job gets the stacks dumped into its log by itself."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

import shipyard
from tests.conftest import job_processes

pytest.importorskip("psutil")

STUCK = r"""
import os, time
print("started", flush=True)
def wait_for_the_other_host_forever():
    while True:
        time.sleep(0.05)
wait_for_the_other_host_forever()
"""


def cli(*args):
    return subprocess.run(
        [sys.executable, "-m", "shipyard.cli", *args],
        capture_output=True,
        text=True,
        env=dict(os.environ),
        timeout=90,
    )


def _wait_started(control, name: str, hosts: int) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        files = control.log_files(name)
        text = "".join(open(p).read() for p in files.values() if os.path.exists(p))
        if len(files) == hosts and text.count("started") >= hosts:
            return
        time.sleep(0.1)
    raise AssertionError("the job's scripts did not start")


@pytest.mark.timeout(180)
def test_stacks_of_a_stuck_two_instance_job(session, write_script):
    est = shipyard.Estimator(
        entry_point="train.py",
        source_dir=write_script("train.py", STUCK),
        instance_count=2,
        instance_type="local",
        session=session,
        environment={"SHIPYARD_STACKS_ON_SILENCE": "2"},
    )
    est.fit(job_name="stuck", wait=False)
    control = session.control
    try:
        _wait_started(control, "stuck", 2)
        res = cli("stacks", "stuck")
        assert res.returncode == 0, res.stderr
        out = res.stdout
        for host in ("algo-1", "algo-2"):
            assert f"=== {host} " in out, out
            section = out.split(f"=== {host} script")[1].split("===")[0]
            assert "wait_for_the_other_host_forever (train.py:" in section, out
        assert "=== algo-1 agent (pid" in out and "=== algo-2 agent (pid" in out
        # silent for 2 s: the supervisor dumps the stacks into each host's log
        deadline = time.monotonic() + 60
        logs = ""
        while time.monotonic() < deadline:
            logs = cli("logs", "stuck", "--host", "algo-2").stdout
            if "wait_for_the_other_host_forever" in logs:
                break
            time.sleep(0.5)
        assert "[algo-2] [shipyard-stacks] no output and no metric for 2 s" in logs, logs
        assert "wait_for_the_other_host_forever" in logs
    finally:
        control.stop("stuck")
    job_dir = control.get("stuck").job_dir
    assert job_processes(job_dir) == []
    ended = cli("stacks", "stuck")
    assert ended.returncode == 2 and "has ended (Stopped)" in ended.stderr
    unknown = cli("stacks", "no-such-job")
    assert unknown.returncode == 3


@pytest.mark.timeout(180)
def test_stacks_of_mpi_ranks_are_labelled_by_their_host_and_rank(session, write_script):
    pytest.importorskip("mpi4py")
    est = shipyard.Estimator(
        entry_point="train.py",
        source_dir=write_script("train.py", STUCK),
        instance_count=2,
        instance_type="local",
        session=session,
        distribution={"mpi": {"enabled": True, "processes_per_host": 2}},
    )
    est.fit(job_name="stuck-mpi", wait=False)
    control = session.control
    try:
        deadline = time.monotonic() + 60
        while True:  # all four ranks printed "started" into algo-1's log
            path = control.log_files("stuck-mpi").get("algo-1")
            text = open(path).read() if path and os.path.exists(path) else ""
            if text.count("started") >= 4 or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        out = cli("stacks", "stuck-mpi").stdout
        for rank in range(4):
            head = f"=== algo-{rank // 2 + 1} rank {rank} mpi rank (pid"
            assert head in out, out
            assert "wait_for_the_other_host_forever" in out.split(head)[1].split("===")[0]
        assert "=== algo-1 prterun (pid" in out and "(not a Python process)" in out
    finally:
        control.stop("stuck-mpi")
    assert job_processes(control.get("stuck-mpi").job_dir) == []
