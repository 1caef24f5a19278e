"""The CLI as a user runs it: a real subprocess, exit codes that mean something."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

BIN = [sys.executable, "-m", "shipyard.cli"]


def cli(*args, **kw):
    return subprocess.run(
        [*BIN, *args], capture_output=True, text=True, env=dict(os.environ), timeout=120, **kw
    )


def test_train_describe_logs_jobs(home, write_script, tmp_path):
    src = write_script("train.py", "import sys\nprint('args', sys.argv[1:])\nprint('acc=0.9')\n")
    data = tmp_path / "data"
    data.mkdir()
    res = cli(
        "train",
        "train.py",
        "--source-dir",
        src,
        "-n",
        "2",
        "-H",
        "epochs=2",
        "-H",
        "name=abc",
        "--channel",
        f"training={data}",
        "--metric",
        "acc=acc=([0-9.]+)",
        "--job-name",
        "cli-job",
    )
    assert res.returncode == 0, res.stderr
    assert "[algo-2] args ['--epochs', '2', '--name', 'abc']" in res.stdout
    desc = json.loads(cli("describe", "cli-job", "--json").stdout)
    assert desc["TrainingJobStatus"] == "Completed"
    assert desc["FinalMetricDataList"][0]["Value"] == 0.9
    assert json.loads(desc["HyperParameters"]["epochs"]) == 2
    logs = cli("logs", "cli-job", "--host", "algo-1").stdout
    assert "[algo-1] acc=0.9" in logs and "algo-2" not in logs
    assert "cli-job" in cli("jobs").stdout
    assert cli("describe", "cli-job").returncode == 0


def test_exit_codes(home, write_script):
    src = write_script("fail.py", "raise ValueError('nope')\n")
    failed = cli("train", "fail.py", "--source-dir", src)
    assert failed.returncode == 1 and "ValueError: nope" in failed.stderr
    bad = cli("train", "missing.py", "--source-dir", src)
    assert bad.returncode == 2 and "not found" in bad.stderr
    bad_json = cli("train", "fail.py", "--source-dir", src, "--distribution", "{nope")
    assert bad_json.returncode == 2 and "not valid JSON" in bad_json.stderr
    missing = cli("describe", "no-such-job")
    assert missing.returncode == 3 and "no training job named" in missing.stderr


def test_detach_follow_and_stop(home, write_script):
    src = write_script("train.py", "import time\nprint('started', flush=True)\ntime.sleep(60)\n")
    res = cli("train", "train.py", "--source-dir", src, "--detach", "--job-name", "bg-job")
    assert res.returncode == 0 and res.stdout.strip() == "bg-job"
    follower = subprocess.Popen(
        [*BIN, "logs", "bg-job", "--follow"],
        stdout=subprocess.PIPE,
        text=True,
        env=dict(os.environ),
    )
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        if "started" in cli("logs", "bg-job").stdout:
            break
        time.sleep(0.2)
    stop = cli("stop", "bg-job")
    assert stop.returncode == 0 and "Stopped" in stop.stderr
    out, _ = follower.communicate(timeout=20)
    assert "[algo-1] started" in out
    assert json.loads(cli("describe", "bg-job", "--json").stdout)["TrainingJobStatus"] == "Stopped"


def test_progress_lines_quiet_and_whole_names(home, write_script):
    src = write_script("ok.py", "print('fine')\n")
    name = "a-rather-long-job-name-that-a-narrow-table-would-fold-" + "x" * 8
    res = cli("train", "ok.py", "--source-dir", src, "--job-name", name)
    assert res.returncode == 0, res.stderr
    assert f"shipyard: Staging the code of {name} ..." in res.stderr  # not a terminal: lines
    assert "shipyard: Uploading the model and output to " in res.stderr
    quiet = cli("--quiet", "train", "ok.py", "--source-dir", src, "--job-name", name + "-q")
    assert quiet.returncode == 0 and "shipyard: Staging" not in quiet.stderr
    listed = cli("jobs").stdout
    assert name in listed and name + "-q" in listed  # whole names when piped
