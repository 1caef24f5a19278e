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
from shipyard.control.artifacts import PARTIAL_PREFIX

BIG_MODEL = """
import os
# a sparse 64 GiB file: nothing on disk, but gzip must read and compress every zero, which
# takes minutes, so the upload is reliably still going when the test kills the supervisor
with open(os.path.join(os.environ["SM_MODEL_DIR"], "weights.bin"), "wb") as fh:
    fh.truncate(64 << 30)
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
    try:
        record = _wait_for_partial_upload(control, out_dir)
    finally:
        # kill -9 the supervisor mid-upload (and never leave it compressing after a failure)
        pid = control.store.get("upload-cut").supervisor_pid
        if pid and psutil.pid_exists(pid):
            supervisor = psutil.Process(pid)
            supervisor.kill()
            supervisor.wait(timeout=10)
    assert record.secondary_status == "Uploading"
    listed = {r.name: r for r in control.list()}  # what `shipyard jobs` does
    job = listed["upload-cut"]
    assert job.status == "Failed"
    assert "upload of the model artifacts was interrupted" in job.failure_reason
    assert "every instance had completed" in job.failure_reason
    left = os.listdir(out_dir)
    assert all(name in ("model.tar.gz", "output.tar.gz") for name in left), left
    assert not os.path.exists(os.path.join(job.job_dir, "upload-scratch"))


def _wait_for_partial_upload(control, out_dir: str):
    """The job's record once it is Uploading with a partial archive on disk."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        record = control.store.get("upload-cut")
        partial = glob.glob(os.path.join(out_dir, PARTIAL_PREFIX + "*"))
        if record.secondary_status == "Uploading" and partial:
            return record
        if record.terminal:
            pytest.fail(f"the upload finished before it could be interrupted: {record}")
        time.sleep(0.005)
    pytest.fail("the job never reached Uploading with a partial archive on disk")
