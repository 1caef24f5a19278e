"""Issue 20, defect 6: a supervisor killed while uploading leaves no partial file, and the
job's reason says the upload was interrupted.

Before the fix ``output/tmp*.tmp`` stayed forever and the job was Failed with "supervisor
ended unexpectedly" although every instance had completed.
"""

from __future__ import annotations

import glob
import os
import time

import psutil
import pytest

import shipyard

BIG_MODEL = """
import os
# incompressible, so gzip takes a while: the upload is still going when it is killed
with open(os.path.join(os.environ["SM_MODEL_DIR"], "weights.bin"), "wb") as fh:
    for _ in range(12):
        fh.write(os.urandom(8 << 20))
"""


def test_supervisor_killed_while_uploading_leaves_no_partial_file(session, write_script, home):
    src = write_script("train.py", BIG_MODEL)
    est = shipyard.Estimator(
        entry_point="train.py",
        source_dir=src,
        instance_count=1,
        instance_type="local",
        session=session,
    )
    est.fit(job_name="upload-cut", wait=False)
    control = session.control
    out_dir = os.path.join(str(home), "output", "upload-cut", "output")
    deadline = time.monotonic() + 60
    partial: list[str] = []
    while time.monotonic() < deadline:
        record = control.store.get("upload-cut")
        partial = [p for p in glob.glob(os.path.join(out_dir, "*")) if "tmp" in p]
        if record.secondary_status == "Uploading" and partial:
            break
        if record.terminal:
            pytest.fail(f"the upload finished before it could be interrupted: {record}")
        time.sleep(0.005)
    else:
        pytest.fail("the job never reached Uploading")
    supervisor = psutil.Process(record.supervisor_pid)
    supervisor.kill()
    supervisor.wait(timeout=10)
    listed = {r.name: r for r in control.list()}  # what `shipyard jobs` does
    job = listed["upload-cut"]
    assert job.status == "Failed"
    assert "upload of the model artifacts was interrupted" in job.failure_reason
    assert "every instance had completed" in job.failure_reason
    left = os.listdir(out_dir)
    assert all(name in ("model.tar.gz", "output.tar.gz") for name in left), left
    assert not os.path.exists(os.path.join(job.job_dir, "upload-scratch"))
