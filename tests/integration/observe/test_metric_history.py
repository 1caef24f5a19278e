"""Metric history: every metric_definitions match with its time and host, in
``shipyard metrics``, ``describe --json`` and ``training_job_analytics.dataframe()``."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import shipyard

SCRIPT = r"""
import os
host = os.environ["SM_CURRENT_HOST"]
for epoch in range(5):
    print(f"epoch {epoch} loss={1.0 / (epoch + 1):.4f} acc={0.5 + epoch / 10:.2f}", flush=True)
print("<script>alert(1)</script> loss=0.1", flush=True) if host == "algo-2" else None
"""


def cli(*args):
    return subprocess.run(
        [sys.executable, "-m", "shipyard.cli", *args],
        capture_output=True,
        text=True,
        env=dict(os.environ),
        timeout=60,
    )


@pytest.fixture
def metrics_job(session, write_script):
    est = shipyard.Estimator(
        entry_point="train.py",
        source_dir=write_script("train.py", SCRIPT),
        instance_count=2,
        instance_type="local",
        session=session,
        metric_definitions=[
            {"Name": "loss", "Regex": r"loss=([0-9.]+)"},
            {"Name": "acc", "Regex": r"acc=([0-9.]+)"},
        ],
    )
    est.fit(job_name="metrics-job", logs=False)
    return est


@pytest.mark.timeout(120)
def test_every_match_is_kept_and_shown(metrics_job):
    pd = pytest.importorskip("pandas")
    df = metrics_job.training_job_analytics.dataframe()
    assert isinstance(df, pd.DataFrame)
    assert list(df.columns) == ["timestamp", "metric_name", "value", "host"]
    loss = df[df.metric_name == "loss"]
    assert len(loss) == 11  # 5 epochs x 2 hosts + the extra line on algo-2
    assert sorted(set(loss.host)) == ["algo-1", "algo-2"]
    assert list(loss[loss.host == "algo-1"].value) == [1.0, 0.5, 0.3333, 0.25, 0.2]
    assert (df.timestamp >= 0).all()
    only = shipyard.TrainingJobAnalytics("metrics-job", ["acc"], metrics_job.session)
    assert set(only.dataframe().metric_name) == {"acc"}

    desc = json.loads(cli("describe", "metrics-job", "--json").stdout)
    hist = desc["Shipyard"]["MetricHistory"]
    assert len(hist) == 21 and {"MetricName", "Value", "Timestamp", "Host"} <= set(hist[0])

    res = cli("metrics", "metrics-job")
    assert res.returncode == 0, res.stderr
    rows = [ln for ln in res.stdout.splitlines() if "loss" in ln or "acc" in ln]
    assert len(rows) == 4, res.stdout  # (loss, acc) x (algo-1, algo-2)
    assert any("█" in ln and "▁" in ln for ln in rows)
    follow = cli("metrics", "metrics-job", "--follow")  # finished job: the table at once
    assert follow.returncode == 0 and "loss" in follow.stdout
    as_json = json.loads(cli("metrics", "metrics-job", "--json").stdout)
    assert len(as_json) == 21


def test_metrics_of_unknown_job(home):
    res = cli("metrics", "no-such-job")
    assert res.returncode == 3 and "no-such-job" in res.stderr


@pytest.mark.timeout(120)
def test_follow_prints_points_as_they_come(home, write_script):
    src = write_script(
        "slow.py",
        "import time\nfor i in range(4):\n    print(f'loss={i}', flush=True)\n    time.sleep(0.4)\n",
    )
    started = cli(
        "train", "slow.py", "--source-dir", src, "--metric", r"loss=loss=([0-9]+)", "--detach"
    )
    assert started.returncode == 0, started.stderr
    name = started.stdout.strip()
    res = cli("metrics", name, "--follow")
    assert res.returncode == 0, res.stderr
    values = [ln.rsplit("=", 1)[1] for ln in res.stdout.splitlines() if "[algo-1] loss=" in ln]
    assert values == ["0", "1", "2", "3"], res.stdout
