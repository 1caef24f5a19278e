"""What a user reads in the terminal (issue 41): ``shipyard logs`` of a 2-instance job in
the order its lines were written, ``--tail``/``--since``/``--timestamps``/``--json``;
``describe``'s configuration block; ``jobs`` filters and empty states. The real CLI in a
subprocess, over one real failing job in a fresh SHIPYARD_HOME."""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import subprocess
import sys
import textwrap

import pytest

BIN = [sys.executable, "-m", "shipyard.cli"]

# algo-2 fails after a second; algo-1 has printed before that and prints again after it
# (its ticks, then its SIGTERM line when the job stops it): by host, algo-1's later lines
# would all come before algo-2's error.
SCRIPT = """\
import os, signal, sys, time
host = os.environ["SM_CURRENT_HOST"]
if host == "algo-2":
    time.sleep(1.5)
    print("algo-2 error: boom", flush=True)
    sys.exit(3)
def bye(*_):
    print("algo-1 got SIGTERM", flush=True)
    sys.exit(0)
signal.signal(signal.SIGTERM, bye)
print("algo-1 early", flush=True)
for i in range(100):
    time.sleep(0.1)
    print(f"algo-1 tick {i}", flush=True)
"""


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli-reading")
    environ = dict(os.environ, SHIPYARD_HOME=str(root / "home"), AWS_REGION="us-east-1")
    return environ, root


def cli(env, *args):
    return subprocess.run([*BIN, *args], capture_output=True, text=True, env=env[0], timeout=120)


@pytest.fixture(scope="module")
def failed_job(env):
    src = env[1] / "src"
    src.mkdir()
    (src / "train.py").write_text(textwrap.dedent(SCRIPT))
    res = cli(
        env,
        "train",
        "train.py",
        "--source-dir",
        str(src),
        "-n",
        "2",
        "-H",
        "epochs=3",
        "--channel",
        f"training={src}",
        "--tag",
        "team=vision",
        "--job-name",
        "two-hosts",
    )
    assert res.returncode == 1, res.stderr
    return "two-hosts"


def test_empty_home_says_what_to_run(env):
    jobs = cli(env, "jobs")
    assert jobs.returncode == 0
    assert "no training jobs yet" in jobs.stdout and "shipyard train" in jobs.stdout
    endpoints = cli(env, "endpoints")
    assert endpoints.returncode == 0 and "shipyard serve" in endpoints.stdout


def test_logs_merge_hosts_in_time_order(env, failed_job):
    out = cli(env, "logs", failed_job).stdout.splitlines()
    error = out.index("[algo-2] algo-2 error: boom")
    assert out.index("[algo-1] algo-1 early") < error
    assert out.index("[algo-1] algo-1 got SIGTERM") > error
    ticks = [i for i, ln in enumerate(out) if ln.startswith("[algo-1] algo-1 tick")]
    assert ticks[0] < error < ticks[-1]


def test_logs_tail_timestamps_json_since(env, failed_job):
    whole = cli(env, "logs", failed_job).stdout.splitlines()
    assert cli(env, "logs", failed_job, "--tail", "5").stdout.splitlines() == whole[-5:]
    stamped = cli(env, "logs", failed_job, "--timestamps").stdout.splitlines()
    assert len(stamped) == len(whole)
    times = []
    for line, plain in zip(stamped, whole):
        when, rest = line.split(" ", 1)
        assert rest == plain and re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", when)
        times.append(when)
    assert times == sorted(times)
    objs = [json.loads(x) for x in cli(env, "logs", failed_job, "--json").stdout.splitlines()]
    assert {
        "host": "algo-2",
        "time": objs[[o["line"] for o in objs].index("algo-2 error: boom")]["time"],
        "line": "algo-2 error: boom",
    } in objs
    assert [o["time"] for o in objs] == times
    # --since: a time between the first and the last line keeps only the later ones
    cut = dt.datetime.fromisoformat(times[len(times) // 2].replace("Z", "+00:00"))
    later = cli(env, "logs", failed_job, "--since", cut.isoformat()).stdout.splitlines()
    assert later and later == whole[len(whole) - len(later) :] and len(later) < len(whole)
    assert cli(env, "logs", failed_job, "--since", "1d").stdout.splitlines() == whole
    assert cli(env, "logs", failed_job, "--since", "0s").stdout == ""
    bad = cli(env, "logs", failed_job, "--since", "yesterday")
    assert bad.returncode == 2 and "10s, 5m" in bad.stderr


def test_describe_leads_with_configuration(env, failed_job):
    out = cli(env, "describe", failed_job).stdout
    head = out[: out.index("FailureReason")]
    for expected in ("instances", "2 x ", "epochs", "3", "training", "File", "team=vision"):
        assert expected in head, (expected, head)
    for word in ("created", "started", "ended", "duration"):
        assert word in head


def test_jobs_filters(env, failed_job):
    assert failed_job in cli(env, "jobs", "--status", "Failed").stdout
    none = cli(env, "jobs", "--status", "completed")
    assert none.returncode == 0 and failed_job not in none.stdout
    assert "no training jobs match" in none.stdout
    assert failed_job in cli(env, "jobs", "--name", "two").stdout
    assert failed_job not in cli(env, "jobs", "--name", "other").stdout
    assert failed_job in cli(env, "jobs", "--since", "1h").stdout
    bad = cli(env, "jobs", "--status", "Sleeping")
    assert bad.returncode == 2 and "InProgress" in bad.stderr


def test_unknown_instance_family_is_refused_unless_allowed(env):
    src = env[1] / "q9"
    src.mkdir()
    (src / "ok.py").write_text("print('ran on q9')\n")
    args = ("train", "ok.py", "--source-dir", str(src), "--instance-type", "ml.q9.xlarge")
    refused = cli(env, *args)
    assert refused.returncode == 2
    assert "no instance family 'q9'" in refused.stderr and "m5" in refused.stderr
    assert "SHIPYARD_CUSTOM_INSTANCE_FAMILIES" in refused.stderr
    allowed_env = (dict(env[0], SHIPYARD_CUSTOM_INSTANCE_FAMILIES="q9"), env[1])
    ran = cli(allowed_env, *args, "--job-name", "custom-q9")
    assert ran.returncode == 0, ran.stderr
    assert "[algo-1] ran on q9" in ran.stdout
