"""Issue 20, defect 1: concurrent submits of one job name.

Before the fix three processes calling ``fit(job_name='same')`` at once gave one
JobExistsError, one raw FileExistsError, and the job that ran ended Failed with its job
directory (logs, config) deleted by a loser's cleanup. The name is now reserved in the
store before anything is staged: losers get JobExistsError and touch nothing of the
winner's. Default names (millisecond timestamps) never collide either.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import shipyard
from shipyard.sdk import naming

RACER = """
import os, sys, time
import shipyard
from shipyard.errors import JobExistsError
go = sys.argv[1]
while not os.path.exists(go):
    time.sleep(0.0005)
e = shipyard.Estimator(entry_point="train.py", source_dir=sys.argv[2], instance_count=1,
                       instance_type="local")
try:
    e.fit(job_name="same", logs=False)
    print("RAN", e.latest_training_job.describe()["TrainingJobStatus"])
except JobExistsError as exc:
    print("EXISTS", exc)
except BaseException as exc:
    print("OTHER", type(exc).__name__, exc)
"""


def test_concurrent_submits_of_one_name_leave_the_winner_intact(home, write_script, tmp_path):
    src = write_script(
        "train.py",
        "import os, time\ntime.sleep(1.5)\n"
        "open(os.path.join(os.environ['SM_MODEL_DIR'], 'm.txt'), 'w').write('ok')\n",
    )
    # a source_dir with some weight makes staging take a moment: the window the race needs
    with open(os.path.join(src, "data.bin"), "wb") as fh:
        fh.write(os.urandom(16 << 20))
    go = tmp_path / "go"
    racers = [
        subprocess.Popen(
            [sys.executable, "-c", RACER, str(go), src],
            env=dict(os.environ),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for _ in range(3)
    ]
    time.sleep(2.0)  # every racer imported shipyard and is spinning on the go file
    go.touch()
    outs = [p.communicate(timeout=120)[0] for p in racers]
    verdicts = sorted(o.strip().splitlines()[-1].split()[0] for o in outs)
    assert verdicts == ["EXISTS", "EXISTS", "RAN"], outs
    assert any("RAN Completed" in o for o in outs), outs
    record = shipyard.Session(home=str(home)).control.get("same")
    assert record.status == "Completed", record.failure_reason
    assert os.path.isfile(os.path.join(record.job_dir, "job.json"))
    assert os.path.isfile(os.path.join(record.job_dir, "logs", "algo-1.log"))


def test_default_names_in_the_same_millisecond_do_not_collide(session, write_script, monkeypatch):
    src = write_script("train.py", "print('hi')\n")
    monkeypatch.setattr(naming, "timestamp", lambda: "2026-11-25-12-00-00-000")
    names = []
    for _ in range(2):
        est = shipyard.Estimator(
            entry_point="train.py",
            source_dir=src,
            instance_count=1,
            instance_type="local",
            session=session,
            base_job_name="tick",
        )
        est.fit(logs=False)
        names.append(est.latest_training_job.job_name)
    assert len(set(names)) == 2, names
    assert all(n.startswith("tick-2026-11-25-12-00-00-000") for n in names), names
