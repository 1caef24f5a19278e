"""Per-instance utilization (observe.utilization): a real 2-instance job's CPU and memory,
per host, in ``describe --json`` and ``shipyard metrics``; from the instances' cgroups,
or from their process trees where there are none."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import shipyard

# about 2 s of one busy CPU, holding ~200 MiB (touched) while it spins
BUSY = r"""
import time
hold = bytearray(200 << 20)
end = time.monotonic() + 2.0
n = 0
while time.monotonic() < end:
    n += 1
"""


def cli(*args):
    return subprocess.run(
        [sys.executable, "-m", "shipyard.cli", *args],
        capture_output=True,
        text=True,
        env=dict(os.environ),
        timeout=60,
    )


@pytest.mark.timeout(180)
@pytest.mark.parametrize("cgroups", ["auto", "off"])
def test_finished_two_instance_job_shows_cpu_and_memory_per_instance(
    session, write_script, monkeypatch, cgroups
):
    monkeypatch.setenv("SHIPYARD_UTILIZATION_INTERVAL", "0.5")
    monkeypatch.setenv("SHIPYARD_CGROUPS", cgroups)
    name = f"usage-{cgroups}"
    est = shipyard.Estimator(
        entry_point="train.py",
        source_dir=write_script("train.py", BUSY),
        instance_count=2,
        instance_type="ml.m5.large",
        session=session,
    )
    est.fit(job_name=name, logs=False)

    desc = json.loads(cli("describe", name, "--json").stdout)
    usage = desc["Shipyard"]["Utilization"]
    assert sorted(usage) == ["algo-1", "algo-2"]
    for host, samples in usage.items():
        cpu = [s["CPUUtilization"] for s in samples if "CPUUtilization" in s]
        # one busy CPU is up to 100 (less on a loaded machine; an idle instance ~0)
        assert cpu and max(cpu) > 5, (host, samples)
        assert max(s["MemoryBytes"] for s in samples) > 150 << 20, (host, samples)
        assert all(0 < s["MemoryUtilization"] < 100 for s in samples)
        assert all(0 <= s["DiskUtilization"] <= 100 for s in samples)

    res = cli("metrics", name)  # no metric_definitions: the utilization alone
    assert res.returncode == 0, res.stderr
    for metric in ("CPUUtilization", "MemoryUtilization"):
        rows = [ln.split("│") for ln in res.stdout.splitlines() if metric in ln]
        hosts = {cells[2].strip() for cells in rows}
        assert hosts == {"algo-1", "algo-2"}, res.stdout
    samples = json.loads(cli("metrics", name, "--utilization", "--json").stdout)
    assert {s["Host"] for s in samples} == {"algo-1", "algo-2"}
