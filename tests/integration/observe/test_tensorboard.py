"""tensorboard_output_config honoured: the script's summaries appear under the output
location while the job runs and after it; ``shipyard tensorboard JOB`` serves them."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

import shipyard
from shipyard.debugger import TensorBoardOutputConfig

pytest.importorskip("tensorboard")

SCRIPT = r"""
import glob, os, sys, time
from tensorboard.compat.proto import event_pb2, summary_pb2
from tensorboard.summary.writer.event_file_writer import EventFileWriter

logdir = os.path.join(os.environ["SM_OUTPUT_DIR"], "tensorboard")  # the same dir (issue 15)
synced = sys.argv[sys.argv.index("--synced") + 1]
writer = EventFileWriter(os.path.join(logdir, "train"))
for step in range(3):
    summary = summary_pb2.Summary(value=[summary_pb2.Summary.Value(tag="loss", simple_value=1.0 / (step + 1))])
    writer.add_event(event_pb2.Event(step=step, wall_time=time.time(), summary=summary))
writer.flush()
deadline = time.time() + 60   # the job waits until its summaries are synced: during the job
while not glob.glob(os.path.join(synced, "train", "*tfevents*")):
    if time.time() > deadline:
        raise SystemExit("not synced while running")
    time.sleep(0.1)
print("seen synced while running", flush=True)
late = EventFileWriter(os.path.join(logdir, "eval"))
late.add_event(event_pb2.Event(step=0, wall_time=time.time(), summary=summary_pb2.Summary(value=[summary_pb2.Summary.Value(tag="acc", simple_value=0.9)])))
late.close()
writer.close()
"""


def cli(*args, **kw):
    return subprocess.run(
        [sys.executable, "-m", "shipyard.cli", *args],
        capture_output=True,
        text=True,
        env=dict(os.environ),
        timeout=60,
        **kw,
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.timeout(180)
def test_summaries_synced_during_and_after_and_served(session, write_script, tmp_path, monkeypatch):
    monkeypatch.setenv("SHIPYARD_TENSORBOARD_SYNC_SECONDS", "0.3")
    out = tmp_path / "tb"
    # the script looks at the host's copy from inside its instance: a path it is handed
    # under /tmp is bound into its private /tmp from the nearest directory that exists
    # (tmp_path holds the shipyard home, which is never bound)
    out.mkdir()
    synced = out / "tb-job" / "tensorboard-output"
    est = shipyard.Estimator(
        entry_point="train.py",
        source_dir=write_script("train.py", SCRIPT),
        instance_count=1,
        instance_type="local",
        session=session,
        hyperparameters={"synced": str(synced)},
        tensorboard_output_config=TensorBoardOutputConfig(s3_output_path=f"file://{out}"),
    )
    est.fit(job_name="tb-job", logs=False)
    assert est.latest_job_tensorboard_artifacts_path() == f"file://{out}/tb-job/tensorboard-output"
    assert [p.name for p in sorted(synced.iterdir())] == ["eval", "train"]  # eval: after the job
    assert list((synced / "eval").glob("*tfevents*"))

    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "shipyard.cli", "tensorboard", "tb-job", "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        runs = []
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and sorted(runs) != ["tb-job/eval", "tb-job/train"]:
            time.sleep(0.5)
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/data/runs", timeout=5) as r:
                    runs = json.load(r)
            except OSError:
                continue
        assert sorted(runs) == ["tb-job/eval", "tb-job/train"]
        busy = cli("tensorboard", "tb-job", "--port", str(port))  # the port is taken now
        assert busy.returncode == 2 and f"port {port}" in busy.stderr
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(timeout=30)
    assert proc.returncode == 0


def test_job_without_tensorboard_output(session, write_script):
    est = shipyard.Estimator(
        entry_point="t.py",
        source_dir=write_script("t.py", "print('no summaries')\n"),
        instance_count=1,
        instance_type="local",
        session=session,
    )
    est.fit(job_name="no-tb", logs=False)
    res = cli("tensorboard", "no-tb")
    assert res.returncode == 2 and "no TensorBoard output" in res.stderr
    res = cli("tensorboard", "nope-job")
    assert res.returncode == 3
