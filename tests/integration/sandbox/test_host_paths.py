"""Issue 37: host-side code never acts on a path a job can write.

Real sandboxed jobs plant a symlink at every path of their tree that the agent or the
supervisor (root, in the host's filesystem) reads, writes, archives or uploads, each
naming a host file the job cannot see (under the host's /tmp: private in the instance).
The host files stay as they were, their content comes back nowhere, and the job's
records (agent.json, logs, utilization) are not in its view at all. docs/sandbox.md lists
every such path ("What the host touches") and the protection each has.
"""

from __future__ import annotations

import json
import os
import tarfile
import threading
import time
from pathlib import Path

import pytest

import shipyard
from shipyard.errors import JobFailedError
from shipyard.sandbox import probe

pytestmark = pytest.mark.skipif(
    not probe.support().ok, reason=f"no instance sandbox here: {probe.support().reason}"
)

HOST_TEXT = "HOST FILE: the job must neither read nor write this\n"


@pytest.fixture
def victims(tmp_path):
    """Host files the job must not reach, by name."""
    top = tmp_path / "host-private"
    top.mkdir(mode=0o700)
    out = {}
    for name in ("pth", "success", "failure", "time", "secret", "ckpt-secret"):
        path = top / name
        path.write_text(HOST_TEXT)
        out[name] = str(path)
    return out


def _untouched(victims: dict[str, str]) -> None:
    for name, path in victims.items():
        with open(path, encoding="utf-8") as fh:
            assert fh.read() == HOST_TEXT, f"host file {name} was written through a link"


FAILING = """
import os, sys
v = {victims!r}
os.symlink(v["pth"], "/opt/ml/output/failure.tmp")  # the agent's temporary name
os.symlink(v["failure"], "/opt/ml/output/failure")
os.makedirs("/opt/ml/agent", exist_ok=True)
os.symlink(v["time"], "/opt/ml/agent/failure-time")
print("import os; open('marker', 'w').write('job text in a host file')", flush=True)
raise SystemExit("planted links, failing on purpose")
"""


def test_a_failing_job_s_links_at_the_failure_files_write_no_host_file(
    session, write_script, victims
):
    est = shipyard.Estimator(
        entry_point="train.py",
        source_dir=write_script("train.py", FAILING.format(victims=victims)),
        instance_count=1,
        instance_type="local",
        session=session,
    )
    with pytest.raises(JobFailedError):
        est.fit(job_name="links-failure")
    desc = est.latest_training_job.describe()
    _untouched(victims)
    assert "failing on purpose" in desc["FailureReason"]  # the reason still arrives
    assert HOST_TEXT.strip() not in desc["FailureReason"]
    tree = os.path.join(desc["Shipyard"]["JobDir"], "instances", "algo-1")
    assert not os.path.islink(os.path.join(tree, "output", "failure"))  # replaced, not followed


SUCCEEDING = """
import os
v = {victims!r}
os.symlink(v["success"], "/opt/ml/output/success.tmp")
os.symlink(v["success"], "/opt/ml/output/success")
with open("/opt/ml/model/weights.txt", "w") as fh:
    fh.write("trained")
os.symlink(v["secret"], "/opt/ml/model/stolen")
os.symlink("weights.txt", "/opt/ml/model/alias")  # a link inside the tree stays a link
os.makedirs("/opt/ml/output/data", exist_ok=True)
os.symlink(v["secret"], "/opt/ml/output/data/stolen")
with open("/opt/ml/checkpoints/step-1.txt", "w") as fh:
    fh.write("checkpoint")
os.symlink(v["ckpt-secret"], "/opt/ml/checkpoints/stolen")
"""


def test_a_succeeding_job_s_links_are_neither_archived_nor_uploaded(
    session, write_script, victims, tmp_path
):
    ckpt = tmp_path / "ckpt-bucket"
    est = shipyard.Estimator(
        entry_point="train.py",
        source_dir=write_script("train.py", SUCCEEDING.format(victims=victims)),
        instance_count=1,
        instance_type="local",
        checkpoint_s3_uri=f"file://{ckpt}",
        session=session,
    )
    est.fit(job_name="links-success")
    _untouched(victims)
    desc = est.latest_training_job.describe()
    with tarfile.open(desc["ModelArtifacts"]["S3ModelArtifacts"].removeprefix("file://")) as tar:
        members = {m.name: m for m in tar.getmembers()}
        assert set(members) == {"weights.txt", "alias"}
        assert members["alias"].issym()
    output = desc["OutputDataConfig"]["S3OutputPath"].removeprefix("file://")
    with tarfile.open(os.path.join(output, "links-success", "output", "output.tar.gz")) as tar:
        assert tar.getnames() == []
    uploaded = sorted(os.listdir(ckpt))
    assert uploaded == ["step-1.txt"]
    log = open(os.path.join(desc["Shipyard"]["JobDir"], "logs", "algo-1.log")).read()
    assert "not uploading stolen" in log  # said, once
    assert "not archived in model.tar.gz" in log and "not archived in output.tar.gz" in log


REACH = """
import json, os
tree = os.environ["SHIPYARD_INSTANCE_DIR"]
job_dir = os.path.dirname(os.path.dirname(tree))
seen = {"tree": os.path.isdir(tree)}
for name in ("agent.json", "logs/algo-1.log", "utilization.jsonl", "job.json"):
    path = os.path.join(job_dir, name)
    try:
        with open(path) as fh:
            seen[name] = "read " + fh.read(20)
    except OSError as exc:
        seen[name] = type(exc).__name__
    try:  # where the view has a scratch directory, this lands there, not on the host
        with open(path, "a") as fh:
            fh.write("JOBMARK")
    except OSError:
        pass
print("REACH " + json.dumps(seen), flush=True)
"""


def test_the_job_s_records_are_out_of_its_reach(session, write_script):
    """agent.json, the logs and utilization.jsonl beside the instances' trees are not in
    the instance's view (the trees are: a runner hands peers' trees to processes)."""
    est = shipyard.Estimator(
        entry_point="train.py",
        source_dir=write_script("train.py", REACH),
        instance_count=1,
        instance_type="local",
        session=session,
    )
    est.fit(job_name="records-reach")
    job_dir = est.latest_training_job.describe()["Shipyard"]["JobDir"]
    log = open(os.path.join(job_dir, "logs", "algo-1.log")).read()
    seen = json.loads(log.split("REACH ", 1)[1].splitlines()[0])
    assert seen["tree"] is True
    records = ("agent.json", "logs/algo-1.log", "utilization.jsonl", "job.json")
    assert {seen[n] for n in records} <= {"FileNotFoundError", "PermissionError"}, seen
    for name in records:
        path = os.path.join(job_dir, name)
        assert not os.path.exists(path) or "JOBMARK" not in open(path).read(), name


RETRIED = """
import os, sys, time
caps = [l.split()[1] for l in open("/proc/self/status") if l.startswith("CapEff")][0]
print("PROBE", os.environ.get("SHIPYARD_ATTEMPT"), caps, flush=True)
if os.environ.get("SHIPYARD_ATTEMPT") == "1":
    go = os.environ["GO_DIR"]
    open(os.path.join(go, "ready"), "w").close()
    deadline = time.time() + 120
    while not os.path.exists(os.path.join(go, "go")) and time.time() < deadline:
        time.sleep(0.05)
    sys.exit(1)
"""


def test_a_retry_runs_the_plan_that_was_submitted(session, write_script, tmp_path):
    """agent.json rewritten between attempts (sandbox off, as the job once could): the
    supervisor launches attempt 2 from its own copy, so it runs confined again."""
    go = tmp_path / "go"
    go.mkdir()
    est = shipyard.Estimator(
        entry_point="train.py",
        source_dir=write_script("train.py", RETRIED),
        instance_count=1,
        instance_type="local",
        max_retry_attempts=1,
        environment={"GO_DIR": str(go)},
        session=session,
    )
    done: list[BaseException | None] = []

    def fit() -> None:
        try:
            est.fit(job_name="plan-retry")
            done.append(None)
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            done.append(exc)

    runner = threading.Thread(target=fit, daemon=True)
    runner.start()
    deadline = time.monotonic() + 120
    while not (go / "ready").exists() and time.monotonic() < deadline and runner.is_alive():
        time.sleep(0.05)
    assert (go / "ready").exists(), "attempt 1 never started"
    agent_json = Path(session.home) / "jobs" / "plan-retry" / "agent.json"
    plan = json.loads(agent_json.read_text())
    assert plan["sandbox"]["mode"] != "off"
    plan["sandbox"] = {"mode": "off", "reason": "rewritten between attempts"}
    plan["instance_type"] = "local"
    agent_json.write_text(json.dumps(plan))
    (go / "go").touch()
    runner.join(timeout=180)
    assert done == [None], done
    logs = Path(session.home) / "jobs" / "plan-retry" / "logs"
    second = (logs / "algo-1.attempt2.log").read_text()
    probe_line = next(ln for ln in second.splitlines() if ln.startswith("PROBE 2 "))
    assert int(probe_line.split()[2], 16) == 0, probe_line  # no capabilities: confined
    first = (logs / "algo-1.log").read_text()
    assert "agent.json had changed; restored as submitted" in first + second
    assert json.loads(agent_json.read_text())["sandbox"]["mode"] != "off"  # restored
